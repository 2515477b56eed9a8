"""Rendering a derived :class:`~symgrad.reverse.Program` into files (``symgrad.write`` writes them).

Templates live in ``templates/`` (shipped in the wheel as ``symgrad/templates``). They only ever
receive strings made here from validated identifiers, ints and printed sympy expressions: no spec
string reaches them raw. They render in Jinja's sandbox with ``StrictUndefined``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import math
from dataclasses import dataclass
from importlib import resources

import jinja2
import jinja2.sandbox
import sympy
from markupsafe import escape

from . import __version__
from .diagram import mermaid, svg
from .mathml import CSS as MATHML_CSS, aligned, mathml
from .printing import comment_lines, fit, prose, to_code, to_latex
from .algebra import TensorOp, tensor
from .reverse import GRAD_LOSS, Program, Statement
from .roles import channels_last_inputs, input_roles, zero_by_structure
from . import testdata
from .write import (HEADER, edited_by_hand, read_header, with_header as _with_header,  # noqa: F401
                    write_files, write_text)  # re-exported: the writing lives in symgrad.write

TESTDATA_SOURCE = "\n\n".join(inspect.getsource(function) for function in (
    testdata.make_inputs, testdata.first_nonfinite, testdata.relative_errors, testdata.checked_subset,
    testdata.in_layout, testdata.float32_acceptable, testdata.available_memory, testdata.memory_shortfall))
"""symgrad.testdata's functions, verbatim, for the generated tests (one definition, two users)."""


def _environment() -> jinja2.Environment:
    loader = jinja2.FunctionLoader(lambda name: resources.files("symgrad.templates").joinpath(name).read_text("utf-8"))
    environment = jinja2.sandbox.SandboxedEnvironment(
        loader=loader, undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True)
    # the Python templates lay out each statement and sentence within printing.WIDTH columns
    environment.filters.update(fit=fit, prose=prose, comment_lines=comment_lines)
    return environment


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


def _line(statement: Statement) -> Line:
    math = statement.math if statement.math is not None else statement.value
    code = to_code(statement.value, boolean=_is_mask(statement))
    return Line(statement.target.name, code, statement.comment, f"{statement.target.name} = {code}",
                to_latex(statement.target), to_latex(math))


def _hoist_item_reads(statements: list[Statement], boundary: int) -> tuple[list[Statement], int]:
    """Move each ``t = fused[i]`` right after ``fused`` is computed, so the tuple dies at once."""
    reads: dict[sympy.Symbol, list[Statement]] = {}
    for statement in statements:
        value = statement.value
        if isinstance(value, TensorOp) and value.primitive.name == "item" and value.operands[0].is_Symbol:
            reads.setdefault(value.operands[0], []).append(statement)
    moved = {id(statement) for group in reads.values() for statement in group}
    result = []
    for statement in statements:
        if id(statement) in moved:
            continue
        result.append(statement)
        result.extend(reads.get(statement.target, []))
    return result, boundary


def _last_uses(statements: list[Statement], boundary: int, boundary_uses: set[sympy.Symbol]):
    """Each symbol's last reading statement (``boundary - 0.5``: the default cotangent, read between
    the forward and the backward part), and the symbols these statements make."""
    last_use: dict[sympy.Symbol, float] = {}
    for index, statement in enumerate(statements):
        for symbol in statement.value.free_symbols:
            last_use[symbol] = index
    for symbol in boundary_uses:
        last_use[symbol] = max(last_use.get(symbol, -1), boundary - 0.5)
    return last_use, {statement.target for statement in statements}


def _dying(statement: Statement, index: int, last_use, owned, keep) -> list[sympy.Symbol]:
    """What ``statement`` reads for the last time, of what this function made and does not return."""
    return sorted((symbol for symbol in statement.value.free_symbols
                   if symbol in owned and symbol not in keep and last_use.get(symbol) == index), key=str)


def _dying_at_boundary(boundary: int, last_use, owned, keep) -> list[str]:
    return sorted(symbol.name for symbol, index in last_use.items()
                  if index == boundary - 0.5 and symbol in owned and symbol not in keep)


def _with_deletions(statements: list[Statement], boundary: int, boundary_uses: set[sympy.Symbol],
                    keep: set[sympy.Symbol]) -> tuple[list["Line"], list["Line"], list[str]]:
    """The lines of ``gradients``, each with the names to delete right after it (so a value is freed
    at its last use, not when the function returns; autograd keeps what it saved), split at the
    boundary, and the names to delete once the default cotangent is made."""
    last_use, owned = _last_uses(statements, boundary, boundary_uses)
    lines = [dataclasses.replace(_line(statement), dead=tuple(symbol.name for symbol in
                                                                _dying(statement, index, last_use, owned, keep)))
             for index, statement in enumerate(statements)]
    return lines[:boundary], lines[boundary:], _dying_at_boundary(boundary, last_use, owned, keep)


def _scheduled_early(statements: list[Statement], boundary: int, movable: list[Statement]) -> list[Statement]:
    """The statements with each of ``movable`` moved up to just after the last statement whose value
    it reads (never into the forward part): what it reads can then be freed before the next step."""
    moving = {id(statement) for statement in movable}
    kept = [statement for statement in statements if id(statement) not in moving]
    anchor_of = {statement.target: index for index, statement in enumerate(kept)}
    """Each value's statement among ``kept``, or, for a moved one, the kept statement it follows."""
    following: dict[int, list[Statement]] = {}
    for statement in statements:
        if id(statement) not in moving:
            continue
        anchor = max([boundary - 1] + [anchor_of[symbol] for symbol in statement.value.free_symbols if symbol in anchor_of])
        following.setdefault(anchor, []).append(statement)  # after those moved there before it, in their order
        anchor_of[statement.target] = anchor
    result = list(following.get(-1, []))
    for index, statement in enumerate(kept):  # one pass: a scan of the list per moved statement was quadratic
        result.append(statement)
        result.extend(following.get(index, []))
    return result


def _saved_for_backward(fast: Program, statements: list[Statement], boundary: int) -> tuple[list[str], list["Line"], str]:
    """For ``ExplicitGradient``, which saves instead of recomputing: the values the backward part of
    ``gradients`` reads from its forward part (in forward order), and the lines that compute the
    loss together with them, every other intermediate deleted at its last use."""
    read = set().union(*(statement.value.free_symbols for statement in statements[boundary:]))
    read |= fast.default_cotangent.free_symbols
    kept = [statement.target for statement in statements[:boundary] if statement.target in read]
    loss = fast.forward[-1].target
    live = _live(fast.forward, {*kept, loss})
    lines, _, _ = _with_deletions(live, len(live), set(), {*kept, loss})
    return [symbol.name for symbol in kept], lines, loss.name


def _running_statistics(graph) -> list[tuple[str, str, str]]:
    """(running_mean, running_var, momentum as Python source) of each layer whose forward moves
    running statistics in place."""
    found = []
    for node in graph.nodes.values():
        declared = node.rule.running_statistics(graph.symbols(node)) if node.kind == "layer" else None
        if declared:
            mean, var, momentum = declared
            found.append((node.operands[mean], node.operands[var], "None" if momentum is None else repr(float(momentum))))
    return found


def _helpers(statements: list[Statement]) -> list[str]:
    """The module-level functions the statements' primitives call, each once, in a fixed order."""
    found = {expression.primitive.name: expression.primitive.helper
             for statement in statements for expression in statement.value.atoms(TensorOp)
             if expression.primitive.helper}
    return [found[name] for name in sorted(found)]


def _is_mask(statement: Statement) -> bool:
    """A saved ReLU-style mask (``mask_<node>``): kept as bool, a quarter of a float's memory."""
    return statement.target.name.startswith("mask_")


def _count_among(statements: list[Statement], among: list[Statement]) -> int:
    """How many of ``statements`` are (the very objects) in ``among``: a set of ids, not a list scan
    per statement, which made rendering quadratic in the number of layers."""
    ids = {id(statement) for statement in among}
    return sum(id(statement) in ids for statement in statements)


def _live(statements: list[Statement], results: set[sympy.Symbol]) -> list[Statement]:
    """Drop statements whose value nothing returned depends on (no dead variables)."""
    needed = set(results)
    kept = []
    for statement in reversed(statements):
        if statement.target in needed:
            kept.append(statement)
            needed |= statement.value.free_symbols
    return kept[::-1]


@dataclass
class Rendered:
    """The three generated files, as text, keyed by file name."""

    name: str
    files: dict[str, str]
    summary: list[str]
    latex: str = ""
    """The emitted gradients as one LaTeX ``aligned`` block."""


NOTATION = (r"$\overline{v}$ is the gradient of the loss with respect to node $v$ (same shape as $v$), $\odot$ is "
            r"the elementwise product, $w \star_{s,p,d,g} x$ is PyTorch's convolution (cross-correlation) with "
            r"stride, padding, dilation and groups, $w^{\top} \star$ its adjoint in the input (a transposed "
            r"convolution) and $x \star^{w} \overline{y}$ its adjoint in the weight. $\mathrm{local}_{v}$ and "
            r"$\mathrm{mask}_{v}$ name a local gradient of node $v$, computed once and reused; $A_{k}$ is the matrix "
            r"of a separable resampling or pooling op along spatial axis $k$ (the code reads it off at run time by "
            r"applying the op to the identity), so $A_{k}^{\top}$ carries the gradient back along that axis; "
            r"$\operatorname{mean}_{D}$ averages over the normalised axes $D$.")


def _notation_html() -> str:
    parts = NOTATION.split("$")
    return "".join(mathml(part) if index % 2 else str(escape(part)) for index, part in enumerate(parts))


def _stored(program: Program, backward: list[Statement]) -> dict[str, str]:
    """What each node keeps alive for the backward pass: its value, only its shape, or nothing."""
    from .algebra import Params, Size

    values, shapes = set(), set()
    for statement in backward:
        shapes |= {size.of.name for size in statement.value.atoms(Size)}
        for params in statement.value.atoms(Params):
            shapes |= {symbol.name for symbol in params.free_symbols}
        without_shapes = statement.value.replace(lambda e: isinstance(e, (Size, Params)), lambda e: sympy.Integer(1))
        values |= {symbol.name for symbol in without_shapes.free_symbols}
    stored = {}
    for node in program.graph.nodes.values():
        if node.kind == "loss":
            stored[node.name] = "output: its gradient is 1 (or grad_loss)"
        elif node.name in values:
            stored[node.name] = "value, read by the backward pass"
        elif node.name in shapes:
            stored[node.name] = "only its shape"
        else:
            stored[node.name] = "nothing: freed after use" if node.kind == "layer" else "nothing"
    return stored


def _step_numbers(program: Program, lines: list[Statement]) -> list[int | None]:
    """For each backward line, the derivation step (1-based) that produced it."""
    by_node = {step.node: number for number, step in enumerate(program.steps, 1)}
    by_source = {}
    for number, step in enumerate(program.steps, 1):
        for _, source, _ in step.contributions:
            by_source.setdefault(source, number)
    numbers = []
    for statement in lines:
        name = statement.target.name
        if name.startswith("grad_") and name[5:] in by_source:
            numbers.append(by_source[name[5:]])
        else:
            numbers.append(by_node.get(statement.node))
    return numbers


def render(program: Program, spec_label: str, shapes: list[dict[str, tuple[int, ...]]], fast: Program,
           extras: tuple[str, ...] = (), recorded_extras: tuple[str, ...] = ()) -> Rendered:
    """All generated files for ``program``; ``shapes`` are the small test shapes (``shapes.small_shapes``)
    and ``fast`` the same derivation with fused kernels, the one ``gradients`` runs."""
    graph = program.graph
    spec = graph.spec
    names = [node.name for node in graph.inputs]
    gradient_symbols = set(program.gradients.values())
    forward = [_line(s) for s in _live(program.forward, {program.loss_symbol})]
    # the default cotangent (`p.new_ones(...)`) reads the prediction even when no gradient does
    readable_live = _live(program.forward + program.backward, gradient_symbols | program.default_cotangent.free_symbols)
    readable_backward = [_line(s) for s in readable_live[_count_among(readable_live, program.forward):]]
    # `gradients` runs the fused derivation: one convolution_backward call per conv that needs two or
    # more gradients (twice differentiable, as autograd's own); the documents' math is the readable one
    fast_live = _live(fast.forward + fast.backward, gradient_symbols | fast.default_cotangent.free_symbols)
    fast_split = _count_among(fast_live, fast.forward)
    backward_live, split = _hoist_item_reads(fast_live, fast_split)
    _, gradients_backward, boundary_dead = _with_deletions(
        backward_live, split, fast.default_cotangent.free_symbols, gradient_symbols)
    saved_names, saving_forward, loss_name = _saved_for_backward(fast, backward_live, split)
    loss_node = graph.loss
    hvp_lines, hvp_results, hvp_live, per_sample_live = [], {}, [], []
    if "hvp" in extras:
        from .tangent import tangent_statements

        tangents, results = tangent_statements(program.forward + program.backward, graph.wrt)
        returned = {value for value in results.values() if value != 0}
        hvp_live = _live(program.forward + program.backward + tangents, returned | program.default_cotangent.free_symbols)
        hvp_lines = [_line(statement) for statement in hvp_live]
        boundary = _count_among(hvp_live, program.forward)
        hvp_lines = (hvp_lines[:boundary], hvp_lines[boundary:])
        hvp_results = {name: (to_code(value) if value != 0 else f"torch.zeros_like({name})") for name, value in results.items()}
    per_sample_forward, per_sample_backward, per_sample_dead, per_sample_names, per_sample_batched = [], [], [], [], []
    if "per_sample" in extras:
        from .reverse import per_sample_statements

        extra, results, per_sample_batched = per_sample_statements(program)
        live = per_sample_live = _live(program.forward + program.backward + extra,
                                       set(results.values()) | program.default_cotangent.free_symbols)
        boundary = _count_among(live, program.forward)
        # each per-sample product as soon as its output gradient exists, so both die there
        live = _scheduled_early(live, boundary, extra)
        per_sample_forward, per_sample_backward, per_sample_dead = _with_deletions(
            live, boundary, program.default_cotangent.free_symbols, set(results.values()))
        per_sample_names = list(results)
    stored = _stored(fast, backward_live[split:])
    descriptions = _node_description(program)
    kinds = {"input": "leaf", "layer": "intermediate", "loss": "output"}
    node_rows = [dict(name=node.name, op=descriptions.get(node.name, "input"), shape=list(node.shape), stored=stored[node.name],
                      kind=("leaf (parameter, differentiated)" if node.name in graph.wrt else "leaf (constant)")
                      if node.kind == "input" else kinds[node.kind]) for node in graph.nodes.values()]
    step_of_line = _step_numbers(fast, backward_live[split:])
    lines_of_step: dict[int, list[int]] = {}
    for index, line_step in enumerate(step_of_line, 1):
        lines_of_step.setdefault(line_step, []).append(index)
    step_views = []
    for number, step in enumerate(program.steps, 1):
        step_views.append(dict(
            number=number, node=step.node, forward=step.forward, incoming=mathml(to_latex(step.incoming)),
            locals=[mathml(f"{to_latex(symbol)} = {to_latex(value)}") for symbol, value in step.locals],
            contributions=[dict(source=source, operand=operand, mathml=mathml(to_latex(value)),
                                branch=len(program.branch_sums.get(source, [])))
                           for operand, source, value in step.contributions],
            lines=lines_of_step.get(number, [])))
    moved = channels_last_inputs(graph)
    # every 4-d gradient goes back to its caller's layout, whatever layout the convolutions left it in
    layout_kept = [node.name for node in graph.inputs if moved and node.name in graph.wrt and len(node.shape) == 4]
    read_in_backward = set().union(*(statement.value.free_symbols for statement in backward_live[split:]))
    context = dict(
        sources={item.name: (item.source, item.shape) for item in spec.inputs if item.source},
        running_statistics=(running := _running_statistics(graph)),
        helpers=_helpers(program.forward + fast_live + hvp_live + per_sample_live),
        channels_last=moved,
        channels_last_in_backward=[name for name in moved if tensor(name) in read_in_backward],
        layout_kept=layout_kept,
        gradients_return=", ".join(
            f"{name}=grad_{name}.contiguous(memory_format={name}_layout)" if name in layout_kept
            else f"{name}=grad_{name}" for name in graph.wrt),
        function_grads=", ".join(f"grads.{name}" if name in graph.wrt else "None" for name in names),
        name=spec.name,
        version=__version__,
        spec_label=spec_label,
        inputs=names,
        signature=", ".join(names),
        # the running statistics move in place after the Function saved them: it keeps copies
        saved_signature=", ".join(f"{name}.clone()" if any(name in entry[:2] for entry in running)
                                  else name for name in names),  # found once: per name, it was quadratic
        wrt=list(graph.wrt),
        non_wrt=[name for name in names if name not in graph.wrt],
        forward=forward,
        gradients_backward=gradients_backward,
        readable_backward=readable_backward,
        boundary_dead=boundary_dead,
        saved_names=saved_names,
        saving_forward=saving_forward,
        loss_name=loss_name,
        hvp=bool(hvp_lines),
        per_sample=bool(per_sample_forward),
        per_sample_forward=per_sample_forward,
        per_sample_backward=per_sample_backward,
        per_sample_dead=per_sample_dead,
        per_sample_names=per_sample_names,
        per_sample_return=", ".join(f"{name}=per_sample_grad_{name}" for name in per_sample_names),
        per_sample_batched=per_sample_batched,
        hvp_lines=hvp_lines,
        hvp_return=", ".join(f"{name}={hvp_results[name]}" for name in graph.wrt if hvp_results),
        tangent_signature=", ".join(f"tangent_{name}" for name in graph.wrt),
        default_cotangent=to_code(program.default_cotangent),
        grad_loss=GRAD_LOSS.name,
        reduction=loss_node.params["reduction"],
        spec_shapes={node.name: tuple(node.shape) for node in graph.inputs},
        spec_entries=sum(math.prod(node.shape) for node in graph.nodes.values()),  # as check.require_memory counts
        small_shapes=shapes,
        classes=_class_table(graph, shapes),
        roles=input_roles(graph),
        zero_by_structure=zero_by_structure(graph),
        testdata_source=TESTDATA_SOURCE,
        node_rows=node_rows,
        steps=program.steps,
        branch_sums=program.branch_sums,
        to_latex=to_latex,
        notation=NOTATION,
        loss_latex=to_latex(program.forward[-1].value),
        mermaid=mermaid(graph),
        # HTML views: every string below is built from validated names and printed sympy, then escaped
        svg=svg(graph),
        notation_html=_notation_html(),
        loss_mathml_block=mathml(r"\ell = " + to_latex(program.forward[-1].value), block=True),
        step_views=step_views,
        branch_rows=[dict(node=node, consumers=", ".join(consumers)) for node, consumers in program.branch_sums.items()],
        mathml_css=MATHML_CSS,
        gradients_mathml=aligned([(line.latex_target, line.latex) for line in readable_backward]),
        code_lines=[dict(number=index, step=step, text=str(escape(f"{line.target} = {line.code}")))
                    for index, (line, step) in enumerate(zip(gradients_backward, step_of_line), 1)],
    )
    environment = _environment()
    spec_hash = hashlib.sha256(spec.text.encode("utf-8")).hexdigest()
    files = {}
    for template, file_name in TEMPLATES:
        file_name = file_name.format(name=spec.name)
        body = environment.get_template(template).render(**context)
        files[file_name] = _with_header(body, spec_label, spec_hash, comment=_COMMENT_STYLE[file_name.rsplit(".", 1)[1]],
                                        extras=recorded_extras)
    summary = [line.text for line in gradients_backward]
    latex = "\\begin{aligned}\n" + " \\\\\n".join(f"{line.latex_target} &= {line.latex}" for line in readable_backward) + "\n\\end{aligned}"
    return Rendered(spec.name, files, summary, latex)


TEMPLATES = (("module.py.jinja", "{name}.py"), ("test_module.py.jinja", "test_{name}.py"),
             ("derivation.md.jinja", "{name}.md"), ("derivation.html.jinja", "{name}.html"))
DOCUMENTS = ("{name}.md", "{name}.html")
_COMMENT_STYLE = {"py": "python", "md": "markup", "html": "markup"}


def _class_table(graph, shapes) -> list[tuple[dict[str, list[int]], dict[str, int]]]:
    """(shape set, class counts of the int64 inputs) for every shape set the generated test uses;
    empty when the spec has no int64 input."""
    if not any(node.dtype == "int64" for node in graph.inputs):
        return []
    shape_sets = list(shapes) + [{node.name: tuple(node.shape) for node in graph.inputs}]
    return [({name: list(shape) for name, shape in sorted(shape_set.items())}, graph.class_counts(shape_set))
            for shape_set in shape_sets]


def _node_description(program: Program) -> dict[str, str]:
    graph = program.graph
    descriptions = {}
    for statement in program.forward:
        if statement.target.name in graph.nodes:
            descriptions[statement.target.name] = to_code(statement.value)
    return descriptions
