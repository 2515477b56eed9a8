"""Under autocast, a convolution's or linear map's weight and input cast once a step, as autograd casts them
(``--keep all``).

Autocast casts each float32 weight to its lower precision where a convolution (or ``F.linear``, ``addmm``)
reads it, and autograd's node keeps that copy for the backward. The bound step's backward
(``_convolution_backward``, the input gradient's ``mm``) cast each weight again: one copy more per
convolution or linear map and step, the weight's size (ResNet-18: 11 M values; ConvNeXt: its 36
``pwconv`` weights). Here the saving forward makes the copy itself, right before the first op that reads
the weight (``conv1_weight_autocast = _in_autocast_dtype(params["conv1.weight"])``: the weight itself
outside autocast, no copy), those ops read it (autocast casts nothing more), and the backward reads the
same copy (a convolution's backward told the weight's own dtype for its gradient; a ``cast_like`` still
reads the weight itself for its dtype). Only a weight that nothing else reads (an elementwise op would
read it in float32). ``--keep lean`` keeps no copy: memory first, it casts again.

The same for a positional input read only as convolutions' input (an image, ``x``), where the backward
reads it only for a weight's gradient (no gradient of its own: its dtype is not read): autograd keeps
autocast's copy of it, and the backward's ``_convolution_backward`` cast ``x`` again (ResNet-18's, a
ViT's patch embedding's, a U-Net's first convolution: one cast of the input a step, ``python -m
benchmarks.casts``). Not a block's operand: its caller keeps the value itself for the block.

And a linear map's input that is a layer norm's output (float32 under autocast where its input is: a
ViT's residual stream, which a float32 position embedding's add promotes) or a view of one (a ViT's class
token), or a positional input: autocast casts it where ``F.linear`` reads it and autograd keeps that copy,
where the backward kept the float32 value (twice the bytes) and cast it again for the weight's gradient
(a ViT: its ``qkv`` and ``fc1`` inputs, 2 casts a block). Here the saving forward casts it once (``norm2_autocast =
_in_autocast_dtype(norm2)``), the linear maps read the copy, and so does the backward: the weight's
gradient, and the input's gradient for its layout and shape; the input's gradient is cast to the value's
dtype, kept as ``norm2_dtype = norm2.dtype``. Only where the backward reads the value for nothing else.
"""

from __future__ import annotations

import dataclasses

import sympy

from .algebra import CONSTANT, TensorOp, op, primitive, tensor
from .kept import VIEWS, held_by_blocks
from .reverse import Program, Statement

# where each op reads a weight that autocast casts to its lower precision (every operand of these ops is
# cast so): the forward's convolution, linear map and addmm; the backward's convolution backward and the
# linear maps' input-gradient products (linear's ``grad @ W``, addmm's ``grad @ mat2.T``)
WEIGHT_READS = {
    "forward": {("conv", 1), ("linear", 1), ("addmm", 2)},
    "backward": {
        ("conv_backward", 2),
        ("linear_input_grad", 1),
        ("linear_frozen_input_grad", 1),
        ("matmul", 1),
        ("matmul_transposed", 1),
    },
}
# where each op reads a convolution's input that autocast casts: the forward's convolution, and the
# backward's convolution backward where it computes no input gradient (``output_mask[0]``: the input's
# dtype, which the gradient would take, is not read)
INPUT_READS = {"forward": {("conv", 0)}, "backward": {("conv_backward", 1)}}


def _input_read(expr: TensorOp, position: int, where: str) -> bool:
    return (expr.primitive.name, position) in INPUT_READS[where] and (
        where == "forward" or not expr.params["output_mask"][0]
    )


def _reads(expr, found: dict, where: str) -> None:
    """Add to ``found[symbol]`` how ``expr`` reads each symbol: ``"weight"`` as an operand autocast casts
    (``WEIGHT_READS``), ``"input"`` as a convolution's input autocast casts (``INPUT_READS``), ``"dtype"``
    for its dtype alone (``cast_like``'s operand 1, the weight a convolution's backward is given beside its
    copy), else ``"other"``."""
    if isinstance(expr, TensorOp):
        name = expr.primitive.name
        for position, operand in enumerate(expr.operands):
            if (name, position) in WEIGHT_READS[where] and operand.is_Symbol:
                found.setdefault(operand, set()).add("weight")
            elif _input_read(expr, position, where) and operand.is_Symbol:
                found.setdefault(operand, set()).add("input")
            elif (name, position) in {("cast_like", 1), ("conv_backward", 3)} and operand.is_Symbol:
                found.setdefault(operand, set()).add("dtype")
            else:
                _reads(operand, found, where)
        for _, value in expr.params.items():
            for part in value if isinstance(value, tuple) else (value,):
                if isinstance(part, sympy.Basic):
                    _reads(part, found, where)
    elif isinstance(expr, sympy.Symbol):
        found.setdefault(expr, set()).add("other")
    else:
        for argument in expr.args:
            _reads(argument, found, where)


def _read_through(expr, copies: dict, where: str):
    """``expr`` reading each weight and input of ``copies`` through its copy (the backward's conv_backward
    also given the weight itself, for its gradient's dtype)."""
    if not isinstance(expr, TensorOp):
        if not expr.args or isinstance(expr, sympy.Symbol):
            return expr
        arguments = [_read_through(argument, copies, where) for argument in expr.args]
        return expr if arguments == list(expr.args) else expr.func(*arguments)
    operands = [_read_through(operand, copies, where) for operand in expr.operands]
    name = expr.primitive.name
    for position, operand in enumerate(expr.operands):
        if operand in copies and ((name, position) in WEIGHT_READS[where] or _input_read(expr, position, where)):
            operands[position] = copies[operand]
    if name == "conv_backward" and expr.operands[2] in copies:
        operands.append(expr.operands[2])
    if operands == list(expr.operands):
        return expr
    return TensorOp(expr.args[0], expr.params, *operands)


def kept_as_autocast_copies(fast: Program, positional: frozenset[str] = frozenset()) -> Program:
    """``fast`` where each input read only as convolutions' or products' weights, in the forward and the
    backward, and each of the ``positional`` inputs (the top body's, not parameters) read only as
    convolutions' input (the backward computing no gradient of it), is read through ``{name}_autocast =
    _in_autocast_dtype({name})``, made right before its first forward read and kept for the backward; so
    is a linear map's input that a layer norm made, or a positional one
    (:func:`_kept_as_autocast_linear_inputs`)."""
    made = {statement.target for statement in fast.forward}
    names = {statement.target.name for statement in fast.forward + fast.backward} | set(fast.graph.nodes)
    forward_reads: dict = {}
    backward_reads: dict = {}
    for statement in fast.forward:
        _reads(statement.value, forward_reads, "forward")
    for statement in fast.backward:
        _reads(statement.value, backward_reads, "backward")
    _reads(fast.default_cotangent, backward_reads, "backward")
    copies = {
        symbol: tensor(f"{symbol.name}_autocast")
        for symbol in sorted(forward_reads, key=str)
        if symbol not in made
        and (
            forward_reads[symbol] == {"weight"}
            and backward_reads.get(symbol, set()) <= {"weight", "dtype"}
            or symbol.name in positional
            and forward_reads[symbol] == backward_reads.get(symbol) == {"input"}
        )
        and f"{symbol.name}_autocast" not in names
    }
    if not copies:
        return _kept_as_autocast_linear_inputs(fast, positional)
    forward, pending = [], dict(copies)
    for statement in fast.forward:
        for symbol in sorted(statement.value.free_symbols & pending.keys(), key=str):
            forward.append(Statement(pending.pop(symbol), op("in_autocast_dtype", symbol), statement.node))
        forward.append(dataclasses.replace(statement, value=_read_through(statement.value, copies, "forward")))
    backward = [
        dataclasses.replace(statement, value=_read_through(statement.value, copies, "backward"))
        for statement in fast.backward
    ]
    return _kept_as_autocast_linear_inputs(dataclasses.replace(fast, forward=forward, backward=backward), positional)


# a linear map's input as its backward reads it (rules/linear.py): by the weight's gradient (folded to
# [N, in] by ``flatten`` where it has more dims), else for its shape and layout alone
LINEAR_INPUT_READS = {
    ("linear_weight_grad", 1),
    ("linear_input_grad", 2),
    ("linear_input_grad", 3),
    ("linear_bias_grad", 2),
}
NORMALISED = {"native_layer_norm"}
"""The makers whose output a linear map's input is (or a view of it) for :func:`_kept_as_autocast_linear_inputs`."""

primitive(
    "dtype_of",
    code=lambda operands, params, show: f"{operands[0]}.dtype",
    latex=lambda operands, params, show: rf"\operatorname{{dtype}}({operands[0]})",
    tangent=CONSTANT,
)


def _cast_to_tangent(expr, tangent_of):
    moved = tangent_of(expr.operands[0])
    return moved if moved == 0 else TensorOp("cast_to", expr.params, moved, expr.operands[1])


primitive(  # as cast_like, given the dtype itself (dtype_of's), not a tensor to read it from
    "cast_to",
    code=lambda operands, params, show: f"{operands[0]}.to({operands[1]})",
    latex=lambda operands, params, show: operands[0],
    tangent=_cast_to_tangent,
)


def _folded(expr):
    """The symbol ``expr`` is, or folds to [N, in] (``flatten(x, end_dim=-2)``); else None."""
    if isinstance(expr, sympy.Symbol):
        return expr
    if (
        isinstance(expr, TensorOp)
        and expr.primitive.name == "flatten"
        and expr.params.get("end_dim") == -2
        and expr.operands[0].is_Symbol
    ):
        return expr.operands[0]
    return None


def _linear_input_reads(expr, found: dict) -> None:
    """Add to ``found[symbol]`` how ``expr`` reads each symbol: ``"linear"`` as a linear map's input in its
    backward (``LINEAR_INPUT_READS``, itself or folded), ``"dtype"`` for its dtype alone (``cast_like``'s
    operand 1), else ``"other"``."""
    if isinstance(expr, TensorOp):
        name = expr.primitive.name
        for position, operand in enumerate(expr.operands):
            folded = _folded(operand)
            if (name, position) in LINEAR_INPUT_READS and folded is not None:
                found.setdefault(folded, set()).add("linear")
            elif (name, position) == ("cast_like", 1) and operand.is_Symbol:
                found.setdefault(operand, set()).add("dtype")
            else:
                _linear_input_reads(operand, found)
        for _, value in expr.params.items():
            for part in value if isinstance(value, tuple) else (value,):
                if isinstance(part, sympy.Basic):
                    _linear_input_reads(part, found)
    elif isinstance(expr, sympy.Symbol):
        found.setdefault(expr, set()).add("other")
    else:
        for argument in expr.args:
            _linear_input_reads(argument, found)


def _normalised(symbol, made: dict) -> bool:
    """Whether ``symbol`` is a :data:`NORMALISED` maker's output or a view of one."""
    value = made.get(symbol)
    while isinstance(value, TensorOp) and value.primitive.name in VIEWS | {"item"} and value.operands[0].is_Symbol:
        value = made.get(value.operands[0])
    return isinstance(value, TensorOp) and value.primitive.name in NORMALISED


def _kept_as_autocast_linear_inputs(fast: Program, positional: frozenset[str]) -> Program:
    """``fast`` where each linear map's input that is a layer norm's output or a view of one, or one of the
    ``positional`` inputs, which the backward reads only as linear maps' inputs and for its dtype, is read
    through ``{name}_autocast = _in_autocast_dtype({name})`` (the forward's linear maps and the backward)
    and ``{name}_dtype = {name}.dtype`` (the input gradient's cast), both made right before its first
    linear map."""
    made = {statement.target: statement.value for statement in fast.forward}
    names = {statement.target.name for statement in fast.forward + fast.backward} | set(fast.graph.nodes)
    kept_anyway = {fast.forward[-1].target, *fast.forward[-1].value.free_symbols}
    kept_anyway |= fast.default_cotangent.free_symbols | held_by_blocks(fast)
    linear_inputs = {
        statement.value.operands[0]
        for statement in fast.forward
        if isinstance(statement.value, TensorOp)
        and statement.value.primitive.name == "linear"
        and statement.value.operands[0].is_Symbol
    }
    folds = {  # `shared = torch.flatten(x, end_dim=-2)`: judged by what reads it
        statement.target: _folded(statement.value)
        for statement in fast.backward
        if isinstance(statement.value, TensorOp) and _folded(statement.value) is not None
    }
    reads: dict = {}
    for statement in fast.backward:
        if statement.target not in folds:
            _linear_input_reads(statement.value, reads)
    _linear_input_reads(fast.default_cotangent, reads)
    for fold, symbol in folds.items():
        reads.setdefault(symbol, set()).update({"linear"} if reads.get(fold, {"linear"}) == {"linear"} else {"other"})
    copies = {
        symbol: (tensor(f"{symbol.name}_autocast"), tensor(f"{symbol.name}_dtype"))
        for symbol in sorted(linear_inputs - kept_anyway, key=str)
        if (symbol in made and _normalised(symbol, made) or symbol.name in positional)
        and "linear" in reads.get(symbol, set())
        and reads[symbol] <= {"linear", "dtype"}
        and not {f"{symbol.name}_autocast", f"{symbol.name}_dtype"} & names
    }
    if not copies:
        return fast
    forward, pending = [], dict(copies)
    for statement in fast.forward:
        value = statement.value
        if isinstance(value, TensorOp) and value.primitive.name == "linear" and value.operands[0] in copies:
            symbol = value.operands[0]
            if symbol in pending:
                copy, dtype = pending.pop(symbol)
                forward.append(Statement(copy, op("in_autocast_dtype", symbol), statement.node))
                forward.append(Statement(dtype, op("dtype_of", symbol), statement.node))
            value = TensorOp(value.args[0], value.params, copies[symbol][0], *value.operands[1:])
        forward.append(dataclasses.replace(statement, value=value))
    casts = {
        expression: TensorOp("cast_to", expression.params, expression.operands[0], copies[expression.operands[1]][1])
        for statement in fast.backward
        for expression in statement.value.atoms(TensorOp)
        if expression.primitive.name == "cast_like" and expression.operands[1] in copies
    }
    through = {symbol: copy for symbol, (copy, _) in copies.items()}
    backward = [
        dataclasses.replace(statement, value=statement.value.xreplace(casts).xreplace(through))
        for statement in fast.backward
    ]
    return dataclasses.replace(fast, forward=forward, backward=backward)


def autocast_copies(fast: Program) -> set[str]:
    """The names of the copies :func:`kept_as_autocast_copies` makes (each in autocast's dtype already)."""
    return {
        statement.target.name
        for statement in fast.forward
        if isinstance(statement.value, TensorOp) and statement.value.primitive.name == "in_autocast_dtype"
    }


def read_beyond_dtype(statements) -> set[str]:
    """The names of the symbols ``statements`` (the backward's) read for more than their dtype: a weight
    read through its kept copy alone is read for its dtype only (its layout, its values not)."""
    found: dict = {}
    for statement in statements:
        _reads(statement.value, found, "backward")
    return {symbol.name for symbol, how in found.items() if how - {"dtype"}}
