"""Scheduling one body (the top one or a block's, ``symgrad.plan``): what each of its generated
functions runs, between the derivation and the rendering.

:func:`schedule` takes the body's two derivations (the readable one, whose formulas the docstring and
documents show, and the fused one ``gradients`` runs) and decides, statement by statement: which statements
each function needs (no dead variables), where each value is deleted (at its last use, ``lifetimes.py``), what the
drop-in backward keeps from its forward, and the ``hvp`` and ``per_sample_gradients`` statements.
The layout rule and what the generated tests draw are the program's, computed once from its flat
graph (``symgrad.plan``). :mod:`symgrad.render` then only prints what the :class:`Plan` holds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import sympy

from .algebra import TensorOp, tensor
from .kept import (
    deferred_weight_casts,
    kept_as_layouts,
    kept_as_narrow_indices,
    kept_as_shapes,
    kept_as_signs,
    split_reads,
)
from .kept_casts import autocast_copies, kept_as_autocast_copies
from .late_weights import late_grouped_weight_grads
from .lifetimes import Scheduled, added_in_place, overwriting, with_deletions
from .rematerialize import COMMENT as REBUILT, costly_made_again, rebuilt
from .reverse import GRAD_LOSS, Program, Statement
from .rules.variant_helpers import DECLARATIONS, HelperDeclaration, HelperUse


@dataclass(frozen=True)
class Plan:
    """Everything the generated files hold, as statements and names, nothing printed yet."""

    program: Program
    """The readable derivation: the docstring's formulas, ``hvp``, the per-sample gradients, the
    documents."""
    fast: Program
    """The fused derivation (one ``convolution_backward`` call per conv, and so on), which
    ``gradients`` and the drop-in backward run."""
    forward: list[Statement]
    """``forward``: the statements the loss needs."""
    readable_backward: list[Statement]
    """The readable backward pass, as the docstring and documents list it."""
    saving_forward: list[Scheduled]
    """``_forward_saving``: the loss together with ``saved_names``."""
    saved_names: list[str]
    saved_as_autocast_casts: list[str]
    """Of ``saved_names``, those the backward reads only as a kernel's autocast-cast operand (a
    convolution's input): kept under autocast as that cast copy, as autograd keeps it."""
    loss_name: str
    boundary_dead: list[str]
    """Forward values only the default cotangent reads: deleted once it is made."""
    backward: list[Scheduled]
    """``_backward_from_saved``, the one backward body."""
    step_of_line: list[int | None]
    """For each line of ``backward``, the derivation step (1-based) that produced it."""
    stored: dict[str, str]
    """What each node keeps alive for the backward pass."""
    grad_loss: str = GRAD_LOSS.name
    hvp_forward: list[Statement] = field(default_factory=list)
    hvp_backward: list[Statement] = field(default_factory=list)
    hvp_results: dict[str, sympy.Expr] = field(default_factory=dict)
    """Each ``wrt`` name's Hessian-vector product (0: zero whatever the input)."""
    per_sample_forward: list[Scheduled] = field(default_factory=list)
    per_sample_backward: list[Scheduled] = field(default_factory=list)
    per_sample_dead: list[str] = field(default_factory=list)
    per_sample_names: list[str] = field(default_factory=list)
    per_sample_batched: list[str] = field(default_factory=list)
    rebuilt: list[str] = field(default_factory=list)
    """The values the backward reads that the forward does not keep, made again in the backward
    (``lean``: :mod:`symgrad.rematerialize`)."""


def schedule(
    program: Program,
    fast: Program,
    extras: dict | None = None,
    recompute: bool = True,
    lean: bool = False,
    parameters: frozenset[str] | None = None,
    block_sizes=None,
) -> Plan:
    """The :class:`Plan` for the derivations of one body's graph; ``extras``: the derived statements of
    the optional functions wanted (``tangent.derive_extras``: ``hvp``, ``per_sample``; the inlined
    program's, ``expand``);
    ``recompute=False`` keeps every value the backward reads, as autograd does: no activation computed
    again (:func:`_recomputed`), no mask or layout kept in its place (:mod:`symgrad.kept`); ``lean``
    (``--keep lean``) keeps less still: a batch norm's activation output, made again in the backward
    from the batch norm's input and statistics (:mod:`symgrad.rematerialize`). ``parameters``: the inputs
    that are entries of ``params`` (a block body's parameters); None: the spec's inputs with a ``source``.
    ``block_sizes``: a block body's sizes at its largest instance (``body_graphs.instance_sizes``), or a top
    body's beside the network's largest value (``body_graphs.top_sizes``): what lean's SiLU choice reads."""
    graph = program.graph
    gradient_symbols = set(program.gradients.values())
    # the default cotangent (`p.new_ones(...)`) reads the prediction even when no gradient does
    readable_live = _live(program.forward + program.backward, gradient_symbols | program.default_cotangent.free_symbols)
    # `gradients` runs the fused derivation: one convolution_backward call per conv that needs two or
    # more gradients, or its weight's alone (twice differentiable, as autograd's own); the documents'
    # math is the readable one
    # the loss's inputs and the outputs, which the caller keeps, are kept whole
    kept_by_caller = {
        fast.forward[-1].target,
        *fast.forward[-1].value.free_symbols,
        *fast.default_cotangent.free_symbols,
    }
    mask_owners, layout_owners = {}, {}
    if recompute:  # keep less than autograd keeps: masks, layouts (kept.py), recomputed activations
        fast, mask_owners = kept_as_signs(fast, kept_by_caller)
        fast, layout_owners = kept_as_layouts(fast)
        fast, _ = kept_as_narrow_indices(fast, kept_by_caller)
    if not lean:  # under autocast a convolution's weight (and image) cast once a step, kept as autograd keeps it
        positional = {spec.name for spec in graph.spec.inputs if spec.source is None} if parameters is None else ()
        fast = kept_as_autocast_copies(fast, frozenset(positional))
    fast, shape_owners = kept_as_shapes(fast)
    fast_live = _live(fast.forward + fast.backward, gradient_symbols | fast.default_cotangent.free_symbols)
    live, split = _hoist_item_reads(fast_live, _count_among(fast_live, fast.forward))
    # a parameter's gradient as soon as what it reads exists (a linear map's weight's, which the walk
    # writes after the input's), so that its operands die there, as autograd's node frees them
    backward = _without_aliases(live[split:], gradient_symbols)
    returned = [statement for statement in backward if statement.target in gradient_symbols]
    live = _scheduled_early(live[:split] + backward, split, returned)
    live = live[:split] + _named_entries(live[split:], live)
    # the top body's traced sizes choose which SiLU outputs lean makes again (a block's body: its largest
    # instance's, beside the network's largest value) and which grouped convolutions' weight gradients move
    # last (a block's body: every one, its end is near)
    sizes = graph if parameters is None else None
    if recompute:
        live = live[:split] + _recomputed(live[:split], live[split:], kept_by_caller, lean, block_sizes or sizes)
    rebuilt_names: list[str] = []
    if recompute and lean:
        again, rebuilt_names = rebuilt(live[:split], live[split:], kept_by_caller)
        live = live[:split] + again
    # each grouped convolution's weight gradient last, where less is held beside its kernel's buffer (late_weights.py)
    # a top body beside the network's largest value (its instances' calls hide the values inside them)
    live = live[:split] + late_grouped_weight_grads(
        live[split:], block_sizes if sizes is not None and block_sizes else sizes
    )
    if recompute:  # under autocast a parameter's whole weight gradient stays in its dtype until the caller casts it
        sourced = (  # params[...] (a block's p[...]: an instance's slice of it): cast by gradients()
            {spec.name for spec in graph.spec.inputs if spec.source is not None} if parameters is None else parameters
        )
        params = {symbol for name, symbol in program.gradients.items() if name in sourced}
        live = live[:split] + deferred_weight_casts(live[split:], params)
    _, backward, boundary_dead = with_deletions(live, split, fast.default_cotangent.free_symbols, gradient_symbols)
    backward = added_in_place(overwriting(backward, only=REBUILT))
    saved_names, saving_forward, loss_name = _saved_for_backward(fast, live, split)
    # what the last forward statement makes or reads (the loss's inputs; the outputs, which the caller
    # keeps) stays as it is: a cast copy there would be kept beside it
    # the default cotangent (`pred.new_ones(...)`) reads the loss's input as a tensor too
    returned = {
        fast.forward[-1].target.name,
        *(symbol.name for symbol in fast.forward[-1].value.free_symbols),
        *(symbol.name for symbol in fast.default_cotangent.free_symbols),
    }
    copies = autocast_copies(fast)  # cast already, before the convolution that reads it
    narrowed = [name for name in _autocast_saved(saved_names, live[split:]) if name not in returned | copies]
    saving_forward = overwriting(added_in_place(_narrowed_at_last_use(saving_forward, narrowed), every_sum=True))
    optional: dict = {}
    hvp_live, per_sample_live = [], []
    extras = extras or {}
    if "hvp" in extras:
        tangents, results = extras["hvp"]
        returned = {value for value in results.values() if value != 0}
        hvp_live = _live(
            program.forward + program.backward + tangents, returned | program.default_cotangent.free_symbols
        )
        boundary = _count_among(hvp_live, program.forward)
        optional.update(
            hvp_forward=hvp_live[:boundary],
            hvp_backward=hvp_live[boundary:],
            hvp_results={name: results[name] for name in graph.wrt},
        )
    if "per_sample" in extras:
        extra, results, batched = extras["per_sample"]
        per_sample_live = _live(
            program.forward + program.backward + extra, set(results.values()) | program.default_cotangent.free_symbols
        )
        boundary = _count_among(per_sample_live, program.forward)
        # each per-sample product as soon as its output gradient exists, so both die there
        scheduled = _scheduled_early(per_sample_live, boundary, extra)
        forward, backward_part, dead = with_deletions(
            scheduled, boundary, program.default_cotangent.free_symbols, set(results.values())
        )
        optional.update(
            per_sample_forward=forward,
            per_sample_backward=backward_part,
            per_sample_dead=dead,
            per_sample_names=list(results),
            per_sample_batched=batched,
        )
    return Plan(
        program=program,
        fast=fast,
        forward=_live(program.forward, {program.loss_symbol}),
        readable_backward=readable_live[_count_among(readable_live, program.forward) :],
        saving_forward=saving_forward,
        saved_names=saved_names,
        saved_as_autocast_casts=narrowed,
        loss_name=loss_name,
        boundary_dead=boundary_dead,
        backward=backward,
        step_of_line=_step_numbers(fast, live[split:]),
        stored=_stored(fast, live[split:], {**shape_owners, **layout_owners, **mask_owners}),
        rebuilt=rebuilt_names,
        **optional,
    )


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


def _recomputed(
    forward: list[Statement], backward: list[Statement], kept_by_caller: set, lean: bool = False, sizes=None
) -> list[Statement]:
    """``backward`` with each cheap elementwise value it reads (``Primitive.recomputable``: an
    activation's output, read by the next layer's backward) computed again right before its first
    read, from operands the backward reads anyway: the saving forward then keeps the operand alone,
    as torch.compile's partitioner does (``kept_by_caller``: the loss's inputs, which stay); one
    ``costly_to_recompute`` (SiLU's) only where ``lean``, and there only the largest
    (``rematerialize.costly_made_again``, from the traced ``sizes``: a graph; None: every one)."""
    read = set().union(*(statement.value.free_symbols for statement in backward))
    made = {statement.target for statement in forward}
    costly_again = costly_made_again(forward, backward, sizes) if lean else set()
    again = {
        statement.target: statement
        for statement in forward
        if statement.target in read
        and statement.target not in kept_by_caller
        and isinstance(statement.value, TensorOp)
        and statement.value.primitive.recomputable
        and (not statement.value.primitive.costly_to_recompute or statement.target in costly_again)
        and all(symbol in read or symbol not in made for symbol in statement.value.free_symbols)
    }
    again = {
        target: statement
        for target, statement in again.items()  # from kept operands, not a chain
        if not statement.value.free_symbols & again.keys()
    }
    result = []
    for statement in backward:
        for symbol in sorted(statement.value.free_symbols & again.keys(), key=str):
            result.append(dataclasses.replace(again.pop(symbol), comment="recomputed: not kept by the forward"))
        result.append(statement)
    return result


def _without_aliases(backward: list[Statement], keep: set[sympy.Symbol]) -> list[Statement]:
    """``backward`` without its aliases (``grad_bn2 = grad_add``, a gradient passed on unchanged):
    each later read of one reads what it names (the gradients returned, ``keep``, stay, and so does
    a name for the incoming ``grad_loss``, which a block's backward renames to its argument)."""
    renames: dict[sympy.Symbol, sympy.Symbol] = {}
    result = []
    for statement in backward:
        value = statement.value.xreplace(renames) if renames else statement.value
        if value.is_Symbol and value != GRAD_LOSS and statement.target not in keep:
            renames[statement.target] = value
            continue
        result.append(statement if value is statement.value else dataclasses.replace(statement, value=value))
    return result


def _named_entries(backward: list[Statement], every: list[Statement]) -> list[Statement]:
    """``backward`` with each entry of a fused kernel's tuple that a longer expression reads
    (``grad_x = grad_add + local_conv1[0]``) named right after the tuple is made (``local_conv1_0``),
    so that the tuple is unpacked where it is made and dies there (``every``: all statements, whose
    names a new one must not take)."""
    tuples = {
        statement.target
        for statement in backward
        if isinstance(statement.value, TensorOp) and (statement.value.primitive.outputs or 0) > 1
    }
    whole = {statement.value for statement in backward}
    inline = {}
    for statement in backward:
        for expression in statement.value.atoms(TensorOp):
            if expression.primitive.name == "item" and expression.operands[0] in tuples and expression not in whole:
                inline.setdefault(expression.operands[0], {})[expression.params["index"]] = expression
    if not inline:
        return backward
    taken = {statement.target.name for statement in every}
    names: dict[TensorOp, sympy.Symbol] = {}
    result = []
    for statement in backward:
        value = statement.value.xreplace(names) if names else statement.value
        result.append(statement if value is statement.value else dataclasses.replace(statement, value=value))
        for index, expression in sorted(inline.get(statement.target, {}).items()):
            name = f"{statement.target.name}_{index}"
            if name in taken:
                continue
            taken.add(name)
            names[expression] = tensor(name)
            result.append(Statement(tensor(name), expression, statement.node, gradient_of=None))
    return result


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
        anchor = max(
            [boundary - 1] + [anchor_of[symbol] for symbol in statement.value.free_symbols if symbol in anchor_of]
        )
        following.setdefault(anchor, []).append(statement)  # after those moved there before it, in their order
        anchor_of[statement.target] = anchor
    result = list(following.get(-1, []))
    for index, statement in enumerate(kept):  # one pass: a scan of the list per moved statement was quadratic
        result.append(statement)
        result.extend(following.get(index, []))
    return result


def _saved_for_backward(
    fast: Program, statements: list[Statement], boundary: int
) -> tuple[list[str], list[Scheduled], str]:
    """For ``_forward_saving``, which saves instead of recomputing: the values the backward part
    reads from the forward part (in forward order), and the statements that compute the loss
    together with them, every other intermediate deleted at its last use."""
    read = set().union(*(statement.value.free_symbols for statement in statements[boundary:]))
    read -= {statement.target for statement in statements[boundary:]}  # a value recomputed there
    read |= fast.default_cotangent.free_symbols
    inputs = {tensor(node.name) for node in fast.graph.inputs}  # passed to the backward itself
    read -= inputs  # a checked input keeps its name (`x = _size_check(x, ...)`): still the input
    kept = [statement.target for statement in statements[:boundary] if statement.target in read]
    loss = fast.forward[-1].target
    live = _live(fast.forward, {*kept, loss})
    scheduled, _, _ = with_deletions(live, len(live), set(), {*kept, loss})
    return [symbol.name for symbol in kept], scheduled, loss.name


def _autocast_saved(saved_names: list[str], backward: list[Statement]) -> list[str]:
    """The saved names every backward statement reads only as an operand its kernel reads cast to
    autocast's dtype (``Primitive.autocast_operands``: a convolution's input, in its backward)."""
    as_operand, elsewhere = set(), set()

    def visit(expression) -> None:
        if isinstance(expression, TensorOp):
            params = expression.params
            elsewhere.update(params.free_symbols if isinstance(params, sympy.Basic) else ())
            for index, operand in enumerate(expression.operands):
                if index in expression.primitive.autocast_operands and operand.is_Symbol:
                    as_operand.add(operand.name)
                else:
                    visit(operand)
        elif isinstance(expression, sympy.Symbol):
            elsewhere.add(expression.name)
        elif isinstance(expression, sympy.Basic):
            for argument in expression.args:
                visit(argument)

    for statement in backward:
        visit(statement.value)
    return [name for name in saved_names if name in as_operand and name not in elsewhere]


def _narrowed_at_last_use(scheduled: list[Scheduled], narrowed: list[str]) -> list[Scheduled]:
    """``scheduled`` (a saving forward) with each ``narrowed`` name cast right after its last reading
    statement there (or the one making it, where none reads it)."""
    last = {}
    for index, item in enumerate(scheduled):
        for name in narrowed:
            if item.statement.target.name == name or tensor(name) in item.statement.value.free_symbols:
                last[name] = index
    return [
        dataclasses.replace(item, narrowed=tuple(name for name in narrowed if last.get(name) == index))
        for index, item in enumerate(scheduled)
    ]


def helpers_of(statements: list[Statement], kept_casts: bool = False) -> list[str | HelperUse]:
    """The module-level functions the statements' primitives call, each once, in a fixed order (a
    helper may hold several, one of them shared with another primitive's helper: written once). A
    declared helper (:class:`~symgrad.rules.variant_helpers.HelperDeclaration`) comes with the parts its
    calls need, the union over the module's calls (``kept_casts``: the module keeps a value as
    ``(copy, dtype)``), before the helper of a primitive whose own helper calls it."""
    found: dict[str, str | HelperDeclaration] = {}
    parts: dict[HelperDeclaration, set[str]] = {}
    for statement in statements:
        for expression in statement.value.atoms(TensorOp):
            primitive = expression.primitive
            if primitive.helper or primitive.name in DECLARATIONS:
                found[primitive.name] = primitive.helper
            for declaration in DECLARATIONS.get(primitive.name, ()):
                needed = parts.setdefault(declaration, set(declaration.kept_casts if kept_casts else ()))
                needed.update(declaration.callers[primitive.name](expression))
    functions: dict[str | HelperUse, None] = {}
    for name in sorted(found):
        functions.update(dict.fromkeys(HelperUse(item, frozenset(parts[item])) for item in DECLARATIONS.get(name, ())))
        if isinstance(found[name], str):
            functions.update(dict.fromkeys(part.strip("\n") + "\n" for part in found[name].split("\n\n\n") if part))
    return list(functions)


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


def _stored(program: Program, backward: list[Statement], owners: dict[str, str]) -> dict[str, str]:
    """What each node keeps alive for the backward pass: its value, only what the backward reads of
    it (its shape, its layout, where it is zero), or nothing (``owners``: each value kept instead of
    a tensor, by that tensor's name: :mod:`symgrad.kept`)."""
    whole, shaped = set(), set()
    for statement in backward:
        split_reads(statement.value, whole, shaped)
    recomputed = {statement.target.name for statement in backward}  # a forward value made again there
    rebuilt = {statement.target.name for statement in backward if statement.comment == REBUILT}
    values = {symbol.name for symbol in whole} - recomputed
    shapes = {symbol.name for symbol in shaped}
    kept: dict[str, list[str]] = {}
    for name in sorted(values | shapes):
        if name in owners:  # up_shape, relu_layout, relu_active: what it says
            kept.setdefault(owners[name], []).append(name.rsplit("_", 1)[1])
    parts = {"shape": "its shape", "layout": "its layout", "active": "where it is not zero, as a byte mask"}
    stored = {}
    for node in program.graph.nodes.values():
        if node.kind == "loss":
            stored[node.name] = "output: its gradient is 1 (or grad_loss)"
        elif node.name in values:
            stored[node.name] = "value, read by the backward pass"
        elif node.name in rebuilt:
            stored[node.name] = (
                "nothing (--keep lean): the backward pass makes it again from what it keeps, bit for bit"
            )
        elif node.name in recomputed:
            stored[node.name] = "nothing: the backward pass computes it again from its input"
        elif node.name in kept or node.name in shapes:
            stored[node.name] = "only " + " and ".join(
                text for part, text in parts.items() if part in kept.get(node.name, ["shape"])
            )
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
        if statement.gradient_of in by_source:
            numbers.append(by_source[statement.gradient_of])
        else:
            numbers.append(by_node.get(statement.node))
    return numbers
