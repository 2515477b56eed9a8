"""What the saving forward keeps of a value the backward reads only in part.

Between the derivation and the plan (:mod:`symgrad.schedule`): where every backward read of a forward
value needs less than the value, the forward keeps that less, right after the value is made, and
the value itself is freed at its last forward use:

- its shape (``up_shape = up.shape``), where the backward reads only sizes (a ``cat``'s slices, an
  upsampling's input), as autograd keeps only sizes for those ops;
- where it is not zero, as a byte mask (``relu1_active = relu1.bool().view(torch.uint8)``, a quarter
  of a float32 value's bytes), where the backward reads it only in its own ReLU's pullback
  (``threshold_backward`` of the output) and nothing after the ReLU reads it whole (an upsampling, a
  pool, a sum): the pullback reads the mask as it read the output, the same values (while
  torch.compile traces it, the output itself: Inductor's partitioner decides what its graph keeps);
- its layout, a meta tensor (``relu_layout = relu.to("meta")``: sizes, strides, dtype, no memory),
  where a kernel reads nothing else of it (a max or mean pool's backward, given an unset tensor so
  laid out).
"""

from __future__ import annotations

import dataclasses

import sympy

from .algebra import Params, ShapeOf, Size, TensorOp, op, tensor
from .reverse import Program, Statement


def kept_as_shapes(fast: Program) -> tuple[Program, dict[str, str]]:
    """``fast`` where each forward value that the backward reads only for its shape (a ``cat``'s
    slice lengths, the shape a broadcast sum returns to) is kept as that shape: ``up_shape =
    up.shape`` right after ``up`` is made, read as ``up_shape[1]``, so ``up`` is freed at its last
    forward use, as autograd keeps only sizes for those ops. Also {shape name: tensor name}."""
    made = {statement.target for statement in fast.forward}
    names = {statement.target.name for statement in fast.forward + fast.backward} | set(fast.graph.nodes)
    whole, shaped = set(fast.default_cotangent.free_symbols), set()
    for statement in fast.backward:
        split_reads(statement.value, whole, shaped)
    shapes = {
        symbol: ShapeOf(f"{symbol.name}_shape")
        for symbol in sorted(shaped & made - whole, key=str)
        if f"{symbol.name}_shape" not in names
    }
    if not shapes:
        return fast, {}
    return _keeping(fast, shapes, "shape", lambda value: _on_shapes(value, shapes))


def _keeping(fast: Program, kept: dict, primitive: str, rewritten) -> tuple[Program, dict[str, str]]:
    """``fast`` with ``kept[value] = primitive(value)`` made right after each ``kept`` value is, and
    each backward statement's value ``rewritten`` to read it; also {kept name: tensor name}."""
    forward = []
    for statement in fast.forward:
        forward.append(statement)
        if statement.target in kept:
            forward.append(Statement(kept[statement.target], op(primitive, statement.target), statement.node))
    backward = [dataclasses.replace(statement, value=rewritten(statement.value)) for statement in fast.backward]
    return (
        dataclasses.replace(fast, forward=forward, backward=backward),
        {value.name: symbol.name for symbol, value in kept.items()},
    )


def split_reads(expr, whole: set, shaped: set, laid_out: set | None = None) -> None:
    """Add to ``shaped`` the tensors ``expr`` reads as a shape (``Size``, a primitive's
    ``shape_operands``), to ``laid_out`` those it reads as a layout operand (to ``whole`` where
    ``laid_out`` is None), to ``whole`` those it reads otherwise."""
    if isinstance(expr, Size):
        shaped.add(expr.of)
    elif isinstance(expr, Params):
        for _, value in expr.items():
            for part in value if isinstance(value, tuple) else (value,):
                if isinstance(part, sympy.Basic):
                    split_reads(part, whole, shaped, laid_out)
    elif isinstance(expr, TensorOp):
        for index, operand in enumerate(expr.operands):
            if index in expr.primitive.shape_operands and operand.is_Symbol:
                shaped.add(operand)
            elif index in expr.primitive.layout_operands and operand.is_Symbol and laid_out is not None:
                laid_out.add(operand)
            else:
                split_reads(operand, whole, shaped, laid_out)
        split_reads(expr.params, whole, shaped, laid_out)
    elif expr.is_Symbol:
        whole.add(expr)
    else:
        for argument in expr.args:
            split_reads(argument, whole, shaped, laid_out)


def _on_shapes(expr, shapes: dict):
    """``expr`` reading each tensor of ``shapes`` through its kept shape instead."""
    if isinstance(expr, Size):
        return Size(shapes[expr.of], expr.axis) if expr.of in shapes else expr
    if isinstance(expr, TensorOp):
        operands = [
            shapes.get(operand, operand) if index in expr.primitive.shape_operands else _on_shapes(operand, shapes)
            for index, operand in enumerate(expr.operands)
        ]
        params = Params(tuple((key, _on_shapes_value(value, shapes)) for key, value in expr.params.items()))
        if operands == list(expr.operands) and params == expr.params:
            return expr
        return TensorOp(expr.args[0], params, *operands)
    if not expr.args:
        return expr
    arguments = [_on_shapes(argument, shapes) for argument in expr.args]
    return expr if arguments == list(expr.args) else expr.func(*arguments)


def _on_shapes_value(value, shapes: dict):
    if isinstance(value, tuple):
        return tuple(_on_shapes_value(part, shapes) for part in value)
    return _on_shapes(value, shapes) if isinstance(value, sympy.Basic) else value


def kept_as_signs(fast: Program, kept_by_caller: set) -> tuple[Program, dict[str, str]]:
    """``fast`` where each forward value ``r = relu(c)`` that the backward reads only in its ReLU's
    pullback, ``threshold_backward(grad, r, 0)``, and otherwise at most for its shape or layout, is
    pulled back from what is kept anyway or from less: from ``c`` where ``c`` stays anyway (the
    backward reads it or a view of it, or the caller keeps it; or it is an input), the same
    values (``r <= 0`` exactly where ``c <= 0``); else from the mask
    ``r_active = r.bool().view(torch.uint8)`` made right after ``r`` (a quarter of a float32 value's
    bytes; a ReLU's output is never negative, and NaN stays active), which ``threshold_backward``
    reads as it reads ``r``. Not for ``kept_by_caller`` (the loss's inputs), a value a block keeps
    itself (:func:`held_by_blocks`), one a view of which the backward keeps (:func:`_aliased`), nor one a
    recomputed activation reads (``plan._recomputed``). Also {mask name: tensor name}."""
    made = {statement.target: statement for statement in fast.forward}
    names = {statement.target.name for statement in fast.forward + fast.backward} | set(fast.graph.nodes)
    pullbacks = {
        expression
        for statement in fast.backward
        for expression in statement.value.atoms(TensorOp)
        if expression.primitive.name == "threshold_backward" and expression.operands[1] in made
    }
    whole, shaped, laid_out = set(fast.default_cotangent.free_symbols), set(), set()
    for statement in fast.backward:  # every read but those pullbacks' of the ReLU output
        split_reads(
            statement.value.xreplace({pullback: pullback.operands[0] for pullback in pullbacks}),
            whole,
            shaped,
            laid_out,
        )
    whole |= laid_out - _laid_out_kept(fast, names)  # a layout is kept only where kept_as_layouts keeps it
    recomputed_from = {
        symbol
        for statement in fast.forward
        if statement.target in whole
        and isinstance(statement.value, TensorOp)
        and statement.value.primitive.recomputable
        for symbol in statement.value.free_symbols
    }
    kept_anyway = whole | kept_by_caller | _aliased(fast, whole | kept_by_caller)
    replaced = {}
    for symbol in sorted(
        {pullback.operands[1] for pullback in pullbacks} - kept_anyway - held_by_blocks(fast) - recomputed_from, key=str
    ):
        value = made[symbol].value
        operand = value.operands[0] if isinstance(value, TensorOp) and value.primitive.name == "relu" else None
        if operand is not None and operand.is_Symbol and (operand not in made or operand in kept_anyway):
            replaced[symbol] = operand  # kept anyway: the pullback reads it instead
        elif f"{symbol.name}_active" not in names:
            replaced[symbol] = tensor(f"{symbol.name}_active")
    if not replaced:
        return fast, {}
    masks = {symbol: mask for symbol, mask in replaced.items() if mask.name == f"{symbol.name}_active"}
    rewritten = {
        pullback: TensorOp(pullback.args[0], pullback.params, pullback.operands[0], replaced[pullback.operands[1]])
        for pullback in pullbacks
        if pullback.operands[1] in replaced
    }
    return _keeping(fast, masks, "active", lambda value: value.xreplace(rewritten))


_READS = sympy.Function("reads")
"""A stand-in that reads its arguments: an expression (a ``Tuple`` in an ``Add`` is deprecated in sympy)."""


def kept_as_narrow_indices(fast: Program, kept_by_caller: set) -> tuple[Program, dict[str, str]]:
    """``fast`` where a max pool's argmax indices, which the backward reads only as its pullback's
    (``max_pool_backward``'s) indices, are kept in the narrowest integer dtype that holds a position
    within the pool input's planes: ``indices_pool_narrow = _narrowed_indices(indices_pool,
    x.shape[2:].numel())`` right after they are made (int16 up to 2**15 positions, a quarter of
    int64's bytes, int32 up to 2**31), which the pullback passes its kernel as int64 again
    (``.long()``): the same positions. Autograd keeps them int64. Also {kept name: indices name}."""
    made = {statement.target: statement.value for statement in fast.forward}
    names = {statement.target.name for statement in fast.forward + fast.backward} | set(fast.graph.nodes)
    pullbacks = {
        expression
        for statement in fast.backward
        for expression in statement.value.atoms(TensorOp)
        if expression.primitive.name == "max_pool_backward"
    }
    whole, shaped = set(fast.default_cotangent.free_symbols) | kept_by_caller, set()
    for statement in fast.backward:  # every read but those pullbacks' of their indices
        split_reads(
            statement.value.xreplace({pullback: _READS(*pullback.operands[:2]) for pullback in pullbacks}),
            whole,
            shaped,
        )
    narrowed = {}
    for indices in sorted(
        {pullback.operands[2] for pullback in pullbacks} - whole - shaped - held_by_blocks(fast), key=str
    ):
        entry = made.get(indices)  # pooled_pool[1], an entry of F.max_pool2d(x, ..., return_indices=True)
        pooled = made.get(entry.operands[0]) if isinstance(entry, TensorOp) and entry.primitive.name == "item" else None
        if (
            isinstance(pooled, TensorOp)
            and pooled.primitive.name == "max_pool_with_indices"
            and pooled.operands[0].is_Symbol
            and f"{indices.name}_narrow" not in names
        ):
            narrowed[indices] = (tensor(f"{indices.name}_narrow"), pooled.operands[0], pooled.params["start"])
    if not narrowed:
        return fast, {}
    # after the pool's entries, which the code unpacks together: `pooled, indices_pooled = F.max_pool2d(...)`
    last_entry = {made[indices].operands[0]: indices for indices in narrowed}
    for statement in fast.forward:
        value = statement.value
        if isinstance(value, TensorOp) and value.primitive.name == "item" and value.operands[0] in last_entry:
            last_entry[value.operands[0]] = statement.target
    after = {last_entry[made[indices].operands[0]]: indices for indices in narrowed}
    forward = []
    for statement in fast.forward:
        forward.append(statement)
        if statement.target in after:
            indices = after[statement.target]
            kept, pool_input, start = narrowed[indices]
            forward.append(Statement(kept, op("narrowed_indices", indices, pool_input, start=start), statement.node))
    rewritten = {
        pullback: TensorOp(
            pullback.args[0],
            Params(pullback.params.items() + (("narrowed", True),)),
            *pullback.operands[:2],
            narrowed[pullback.operands[2]][0],
        )
        for pullback in pullbacks
        if pullback.operands[2] in narrowed
    }
    backward = [
        dataclasses.replace(statement, value=statement.value.xreplace(rewritten)) for statement in fast.backward
    ]
    return (
        dataclasses.replace(fast, forward=forward, backward=backward),
        {kept.name: indices.name for indices, (kept, _, _) in narrowed.items()},
    )


VIEWS = frozenset(
    {
        "reshape",
        "reshape_like",
        "flatten",
        "permute",
        "unsqueeze",
        "squeeze",
        "squeeze_dims",
        "narrow",
        "expand",
        "select",
        "slice",
        "channel_view",
        "group_view",
        "group_unview",
    }
)
"""The primitives whose output may share its operand's memory (a view): keeping less of a value is
worth nothing while a view of it stays."""


def _aliased(fast: Program, kept: set) -> set:
    """The forward values a view of which (or a view of a view) is in ``kept``."""
    views: dict = {}
    for statement in fast.forward:
        value = statement.value
        if isinstance(value, TensorOp) and value.primitive.name in VIEWS and value.operands[0].is_Symbol:
            views.setdefault(value.operands[0], set()).add(statement.target)
    aliased: set = set()
    for statement in reversed(fast.forward):  # a view is made after its operand: its own views first
        if views.get(statement.target, set()) & (kept | aliased):
            aliased.add(statement.target)
    return aliased


def _laid_out_kept(fast: Program, names: set) -> set:
    """The forward values :func:`kept_as_layouts` may keep as their layout (where nothing else needs
    more): not a value a block keeps itself, nor one whose kernel's gradient is not a name."""
    unnamed = {
        operand
        for statement in fast.backward
        for call in statement.value.atoms(TensorOp)
        if call.primitive.layout_operands and not _named(call.operands[0])
        for operand in call.operands
    }
    return (
        {statement.target for statement in fast.forward if f"{statement.target.name}_layout" not in names}
        - unnamed
        - held_by_blocks(fast)
    )


def kept_as_layouts(fast: Program) -> tuple[Program, dict[str, str]]:
    """``fast`` where each forward value that the backward reads only as a kernel's layout operand
    (``Primitive.layout_operands``: a max or adaptive mean pool's input, in its backward) or for its
    shape is kept as its layout: ``relu_layout = relu.to("meta")`` right after ``relu`` is made (its
    sizes, strides and dtype, no memory); the kernel is passed ``_stand_in(relu_layout,
    grad.device)`` (``torch.empty_strided`` of those), whose values are never set
    (``algebra.laid_out``). Not a value a block keeps itself (:func:`held_by_blocks`), nor where the gradient
    is not a name (it is printed twice). Also {layout name: tensor name}."""
    made = {statement.target for statement in fast.forward}
    names = {statement.target.name for statement in fast.forward + fast.backward} | set(fast.graph.nodes)
    whole, shaped, laid_out = set(fast.default_cotangent.free_symbols), set(), set()
    for statement in fast.backward:
        split_reads(statement.value, whole, shaped, laid_out)
    whole |= _aliased(fast, whole)  # a view of it stays: so does it
    layouts = {
        symbol: tensor(f"{symbol.name}_layout")
        for symbol in sorted(laid_out & made & _laid_out_kept(fast, names) - whole, key=str)
    }
    if not layouts:
        return fast, {}
    return _keeping(fast, layouts, "layout", lambda value: _on_layouts(value, layouts))


def _named(expr) -> bool:
    """A name, or an entry of a named tuple: printed twice, it computes nothing twice."""
    return expr.is_Symbol or (
        isinstance(expr, TensorOp) and expr.primitive.name == "item" and expr.operands[0].is_Symbol
    )


def held_by_blocks(fast: Program) -> set:
    """The values a block call keeps itself (``Primitive.keeps_operands``): those passed to it and
    the output it returns, which its backward may read."""
    held, calls = set(), set()
    for statement in fast.forward:
        for call in statement.value.atoms(TensorOp):
            if call.primitive.keeps_operands:
                held |= set(call.operands) | {statement.target}
                calls.add(statement.target)
        if statement.value.free_symbols & calls:  # its output, an entry of the call's (output, saved)
            held.add(statement.target)
    return held


def _on_layouts(expr, layouts: dict):
    """``expr`` passing each layout operand of ``layouts`` as a stand-in of its kept layout."""
    if not isinstance(expr, sympy.Basic) or not expr.args:
        return expr
    if isinstance(expr, TensorOp):
        operands = [
            layouts.get(operand, operand) if index in expr.primitive.layout_operands else _on_layouts(operand, layouts)
            for index, operand in enumerate(expr.operands)
        ]
        if operands == list(expr.operands):
            return expr
        laid_out = any(expr.operands[index] in layouts for index in expr.primitive.layout_operands)
        params = Params(expr.params.items() + (("stand_in", True),)) if laid_out else expr.params
        return TensorOp(expr.args[0], params, *operands)
    arguments = [_on_layouts(argument, layouts) for argument in expr.args]
    return expr if arguments == list(expr.args) else expr.func(*arguments)


CONV_BACKWARDS = ("conv_backward", "grouped_weight_backward")
"""autograd's ``convolution_backward`` call, and a grouped convolution's late one in chunks (late_weights.py)."""


def deferred_weight_casts(backward: list[Statement], gradient_symbols: set) -> list[Statement]:
    """``backward`` where each convolution backward whose weight gradient is a parameter's whole
    gradient (its ``t[1]`` is returned as it is, not a term summed with another use's) leaves that
    gradient in autocast's dtype (``defer_weight_cast=True``): its caller casts it to the
    parameter's dtype after the backward (``gradients``; the bound step's autograd engine, one at a
    time), as Inductor casts them at the end, so that the backward's peak holds half the bytes of
    weight gradients. The same cast, later: bit for bit."""
    whole = {
        statement.value.operands[0]
        for statement in backward
        if statement.target in gradient_symbols
        and isinstance(statement.value, TensorOp)
        and statement.value.primitive.name == "item"
        and statement.value.params["index"] == 1
    }
    result = []
    for statement in backward:
        value = statement.value
        if statement.target in whole and isinstance(value, TensorOp) and value.primitive.name in CONV_BACKWARDS:
            params = Params(value.params.items() + (("defer_weight_cast", True),))
            statement = dataclasses.replace(statement, value=TensorOp(value.args[0], params, *value.operands))
        result.append(statement)
    return result
