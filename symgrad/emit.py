"""Printing planned statements into the lines the templates write (``render`` fills the
templates with them; ``symgrad.write`` writes the files): printing only, nothing decided here.

Templates live in ``templates/`` (shipped in the wheel as ``symgrad/templates``). They only ever
receive strings made from validated identifiers, ints and printed sympy expressions: no spec
string reaches them raw. They render in Jinja's sandbox with ``StrictUndefined``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .comment import Comment
from .printing import to_code, to_latex
from .schedule import Scheduled
from .write import (  # noqa: F401
    HEADER,
    edited_by_hand,
    read_header,
    with_header as _with_header,
    write_files,  # re-exported: the writing lives in symgrad.write
    write_text,
)


@dataclass(frozen=True)
class Line:
    """One emitted statement, already printed."""

    target: str
    code: str
    comment: str
    text: str
    latex_target: str
    latex: str
    dead: tuple[str, ...] = ()
    """Names ``gradients`` deletes right after this line: their last use."""
    narrowed: tuple[str, ...] = ()
    """Saved names kept from this line on as autocast's cast copy (``Scheduled.narrowed``)."""
    indent: int = 0
    """Spaces beyond the function body's: 4 inside an optional branch's ``if`` (``printed_sections``)."""
    control: bool = False
    """The line is ``code`` alone (``if downsample:``, ``else:``): no target, nothing deleted."""
    node: str = ""
    """The forward node its statement belongs to (``Statement.node``; a block's call: the instance)."""
    reference: str = ""
    """The forward node its comment is about (:func:`_about`); empty: none."""


def printed_line(statement, dead: tuple[str, ...] = (), in_place: bool = False, narrowed: tuple[str, ...] = ()) -> Line:
    """``statement`` (a :class:`~symgrad.reverse.Statement`) printed, its comment made its text; with
    ``in_place``, as its op's in-place form, overwriting its first operand (``torch.relu_(norm)``)."""
    return _printed(statement, str(statement.comment), dead, in_place, narrowed)


def _printed(statement, comment: str, dead: tuple[str, ...], in_place: bool, narrowed: tuple[str, ...]) -> Line:
    math = statement.math if statement.math is not None else statement.value
    value = statement.value
    code = (
        value.primitive.inplace([to_code(operand) for operand in value.operands], value.params, to_code)
        if in_place
        else to_code(value, boolean=_is_mask(statement))
    )
    return Line(
        statement.target.name,
        code,
        comment,
        f"{statement.target.name} = {code}",
        to_latex(statement.target),
        to_latex(math),
        dead,
        narrowed,
        node=statement.node,
    )


def printed_lines(scheduled: list[Scheduled], steps: list | None = None, own_line: int | None = None) -> list[Line]:
    """The scheduled statements printed, a fused kernel's tuple unpacked where it is made
    (``grad_x, grad_w, _ = _convolution_backward(...)``) instead of read entry by entry, each the
    planner marked ``in_place`` as its op's in-place form; with ``steps`` (each statement's
    derivation step), each line's step is ``steps`` entry, in place. Each comment is made its final
    text here, once (:func:`_commented_once`, then ``str``); ``own_line``: the column of comments
    printed on a line of their own above their statement (the backward's), where a note too long for
    it loses its closing remark (:func:`_one_line`); the render step prints them as they are."""
    made, index = [], 0
    kept = []
    while index < len(scheduled):
        line, comment, used = _unpacked(scheduled, index)
        made.append((line, comment, scheduled[index].statement))
        kept.append(index)
        index += used
    if steps is not None:
        steps[:] = [steps[position] for position in kept]
    comments = _commented_once([comment for _, comment, _ in made])
    return [
        dataclasses.replace(line, comment=_text(comment, own_line), reference=_about(comment, statement))
        for (line, _, statement), comment in zip(made, comments)
    ]


def _about(comment, statement) -> str:
    """The forward node a line's comment is about: a :class:`~symgrad.comment.Comment`'s node; a note on a
    rule's local value (``node.local``), the node the local belongs to; none for any other note."""
    if isinstance(comment, Comment):
        return comment.node
    return statement.node if comment and statement.local_kind else ""


def printed_forward(statements, indent: int = 4, width: int = 100) -> list[Line]:
    """A forward's statements printed one a line, each with its comment (``spec line 12``) where it
    fits after the code at column ``indent``, and none where it does not: a line of its own for it
    would be noise. The comment's final text, made once."""
    lines = [printed_line(statement) for statement in statements]
    return [
        line if indent + len(line.text) + 4 + len(line.comment) <= width else dataclasses.replace(line, comment="")
        for line in lines
    ]


def _text(comment, own_line: int | None, width: int = 100) -> str:
    """``comment`` made its final text: a :class:`~symgrad.comment.Comment` as it says itself (it ends in
    a name, never a remark), a note at column ``own_line`` as :func:`_one_line` fits it."""
    if isinstance(comment, Comment) or own_line is None:
        return str(comment)
    return _one_line(comment, own_line, width)


def _one_line(comment: str, indent: int, width: int = 100) -> str:
    """A note with its comment on one line at column ``indent``: one too long for it loses its closing
    remark in parentheses (``(autograd's own kernel, twice differentiable)``, which the helper it calls
    says)."""
    head, found, remark = comment.removesuffix(")").rpartition(" (")
    if indent + 2 + len(comment) > width and comment.endswith(")") and found and not {"(", ")"} & set(remark):
        return head
    return comment


def printed_sections(items, own_line: int | None = None, indent: int = 0) -> list[Line]:
    """A block plan's statements (``plan.BlockPlan.forward`` or ``backward``) printed as
    :func:`printed_lines` prints a run of them (``own_line``: its comments' column, there), each
    ``plan_branches.Switch`` among them as its ``if HYPER:`` (``else:``) and its sections' lines
    ``indent`` + 4 deeper."""
    lines: list[Line] = []
    run: list = []

    def flush() -> None:
        lines.extend(dataclasses.replace(line, indent=indent) for line in printed_lines(run, own_line=own_line))
        run.clear()

    def control(code: str) -> Line:
        return Line("", code, "", code, "", "", indent=indent, control=True)

    for item in items:
        if hasattr(item, "names"):  # what one side of a switch deletes after a statement both run
            flush()
            lines.append(control("del " + ", ".join(item.names)))
            continue
        if not hasattr(item, "statement"):  # a Switch: what runs with the branch, and without it
            flush()
            lines.append(control(f"if {item.hyper}:" if item.taken else f"if not {item.hyper}:"))
            lines += printed_sections(item.taken or item.otherwise, own_line, indent + 4)
            if item.taken and item.otherwise:
                lines.append(control("else:"))
                lines += printed_sections(item.otherwise, own_line, indent + 4)
            continue
        run.append(item)
    flush()
    return lines


def _commented_once(comments: list) -> list:
    """One node's pullbacks to several operands, line after line (a linear's to its bias, weight and
    input), under one comment, the first line's, naming them all: its forward line quoted once."""
    result: list = []
    first = None
    for comment in comments:
        pullback = isinstance(comment, Comment) and comment.kind == "pullback"
        if (
            pullback
            and first is not None
            and (result[first].node, result[first].quoted) == (comment.node, comment.quoted)
        ):
            result[first] = dataclasses.replace(result[first], names=result[first].names + comment.names)
            comment = ""
        elif pullback:
            first = len(result)
        else:
            first = None
        result.append(comment)
    return result


def _unpacked(scheduled: list[Scheduled], index: int) -> tuple[Line, object, int]:
    """The line for ``scheduled[index]`` (its comment not yet text), its comment, and how many statements
    it stands for: one, or a tuple made there together with the ``t[i]`` reads right after it, when they
    are its only uses."""
    from .algebra import TensorOp

    item = scheduled[index]
    value, target = item.statement.value, item.statement.target
    outputs = value.primitive.outputs if isinstance(value, TensorOp) else None
    reads, position = {}, index + 1
    while position < len(scheduled):
        read = scheduled[position].statement.value
        if not (isinstance(read, TensorOp) and read.primitive.name == "item" and read.operands[0] == target):
            break
        reads[read.params["index"]] = scheduled[position]
        position += 1
    dead = [name for other in reads.values() for name in other.dead]
    if not outputs or not reads or target.name not in dead or max(reads) >= outputs:
        comment = item.statement.comment
        formulas = kernel_formulas(value, item.statement.gradient_of)  # a one-gradient kernel's: its formula
        if formulas and isinstance(comment, Comment) and comment.kind == "pullback":
            comment = Comment("kernel", comment.node, formulas)
        return _printed(item.statement, "", item.dead, item.in_place, item.narrowed), comment, 1
    targets = [reads[entry].statement.target.name if entry in reads else "_" for entry in range(outputs)]
    names = ", ".join(targets)
    code = to_code(value)
    dying = tuple(dict.fromkeys(name for name in (*item.dead, *dead) if name != target.name))
    narrowed = tuple(dict.fromkeys((*item.narrowed, *(name for other in reads.values() for name in other.narrowed))))
    formulas = kernel_formulas(value)  # after the node's name, where the derivation's step table links
    comment = Comment("kernel", item.statement.node, formulas) if formulas else item.statement.comment
    return (
        Line(
            names,
            code,
            "",
            f"{names} = {code}",
            to_latex(target),
            to_latex(value),
            dying,
            narrowed,
            node=item.statement.node,
        ),
        comment,
        position - index,
    )


def kernel_formulas(value, gradient_of: str | None = None) -> tuple[str, ...]:
    """What a fused kernel's call computes, each gradient it returns as a formula of the call's
    arguments (``grad_x = conv_transpose2d(grad, w, stride=2, padding=1, output_padding=...), grad_w
    = x ⋆ grad``; x̂ = (x - mean)/σ, batch norm's normalised input): the math a reviewer checks, beside the kernel
    that computes it fast; none for any other call."""
    name = getattr(getattr(value, "primitive", None), "name", None)
    if name == "cross_entropy_backward" and gradient_of:  # the gradient of the scores ``gradient_of``
        grad, target = to_code(value.operands[0]), to_code(value.operands[2])
        scale = {"mean": " / N", "sum": "", "per_sample": ""}[value.params["how"]]
        grad = f"{grad}[n]" if value.params["how"] == "per_sample" else grad
        return (
            f"grad_{gradient_of} = {grad} * (softmax({gradient_of}) - one_hot({target})){scale} over counted {target}",
        )
    if name not in ("conv_backward", "grouped_weight_backward", "batch_norm_backward"):  # late_weights.py
        return ()
    params = value.params
    if name == "batch_norm_backward":
        scale = "1/σ" if len(value.operands) < 5 or value.operands[2] is None else "w/σ"
        formulas = (f"grad_x = {scale}·(grad - avg(grad) - x̂·avg(grad·x̂))", "grad_w = Σ grad·x̂", "grad_b = Σ grad")
    else:
        dims, transposed = params["dims"], params.get("transposed")
        options = [
            f"{key}={params[key][0] if len(set(params[key])) == 1 else tuple(params[key])}"
            for key, default in (("stride", 1), ("padding", 0), ("dilation", 1))
            if any(entry != default for entry in params[key])
        ]
        options += [f"groups={params['groups']}"] * (params["groups"] != 1)
        if any(entry != 1 for entry in params["stride"]) and not transposed:
            options.append("output_padding=...")  # the input's size that the stride rounded away
        shown = "".join(", " + option for option in options)
        formulas = (
            f"grad_x = conv{dims}d(grad, w{shown})"
            if transposed
            else f"grad_x = conv_transpose{dims}d(grad, w{shown})",
            "grad_w = grad ⋆ x" if transposed else "grad_w = x ⋆ grad",
            "grad_b = Σ grad",
        )
    return tuple(formula for formula, wanted in zip(formulas, params["output_mask"]) if wanted)


def _is_mask(statement) -> bool:
    """A saved ReLU-style mask (``mask_<node>``): kept as bool, a quarter of a float's memory."""
    return statement.local_kind == "mask"


def packed(entries: list[str], indent: int = 4, width: int = 100) -> list[str]:
    """``entries`` (each ending in a comma) joined into as few lines of at most ``width`` columns
    as they fill in order: a table's rows, not a statement, so several to a line."""
    lines: list[str] = []
    for entry in entries:
        if lines and indent + len(lines[-1]) + 1 + len(entry) <= width:
            lines[-1] += " " + entry
        else:
            lines.append(entry)
    return lines


@dataclass
class Rendered:
    """The generated files, as text, keyed by file name."""

    name: str
    files: dict[str, str]
    summary: list[str]
    latex: str = ""
    """The emitted gradients as one LaTeX ``aligned`` block."""


def outputs_context(spec, graph) -> dict:
    """What the templates' outputs-form sections read (``outputs: False`` for a loss-ending spec)."""
    outputs = spec.outputs
    random = any(getattr(node.rule, "random", False) for node in graph.nodes.values() if node.rule is not None)
    if outputs is None:
        return dict(outputs=False, random=random)
    keys = [key for key, _, _ in outputs.entries]
    described = {
        "tensor": "one tensor",
        "tuple": f"a tuple of {len(keys)}",
        "dict": "a dict with the keys " + ", ".join(keys),
    }[outputs.kind]
    return dict(
        outputs=True,
        outputs_kind=outputs.kind,
        random=random,
        outputs_names=list(outputs.nodes),
        outputs_described=described,
        outputs_keys="(" + ", ".join(f'"{key}"' for key in keys) + ("," if len(keys) == 1 else "") + ")",
        eval_module=spec.eval,
        reached_by=_reached_by(spec, graph),
    )


def _reached_by(spec, graph) -> list[str]:
    """The rows of ``REACHED_BY``: each differentiated input (a parameter by its ``state_dict`` key)
    that some outputs read and others do not, with the outputs that read it. A backward whose loss
    reads none of those leaves its gradient None, as autograd leaves a parameter its loss never reaches."""
    sources = {item.name: item.source or item.name for item in spec.inputs}
    end = graph.loss
    reached: dict[str, list[int]] = {}
    for index, node in enumerate(end.operands[f"output_{position}"] for position in range(len(end.operands))):
        ancestors, stack = set(), [node]
        while stack:
            name = stack.pop()
            if name not in ancestors:
                ancestors.add(name)
                stack.extend(graph.nodes[name].operands.values())
        for name in graph.wrt:
            if name in ancestors:
                reached.setdefault(name, []).append(index)
    count = len(end.operands)
    return packed(
        [f'"{sources.get(name, name)}": {tuple(indices)},' for name, indices in reached.items() if len(indices) < count]
    )


DOCUMENTS = ("{name}.md", "{name}.html")
