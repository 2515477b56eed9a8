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

And a convolution's or linear map's input that may be float32 under autocast (:func:`narrow_under_autocast`
says which surely is not): a positional input (an image, ``x``), a layer norm's output (a ViT's, whose
residual stream a float32 position embedding's add promotes), an add of a float32 layer scale's output (a
ConvNeXt block's residual stream, which the next block's depthwise convolution reads), a reflect padding.
Autocast casts it where the convolution or ``F.linear`` reads it and autograd's node keeps that copy; the
bound step cast it again in the backward (``_convolution_backward``'s ``value.to(dtype)``, the weight
gradient's ``mm``) or at its last forward use (``schedule._narrowed_at_last_use``'s
``_saved_as_autocast_casts``): twice a step where autograd casts once (ConvNeXt of ``python -m
benchmarks.casts``: its residual stream and downsampling layer norms' outputs, 20 casts a step, ``_to_copy``
320 -> 300 against autograd's 299, the one left nll_loss's count of targets; a ViT's ``qkv`` and ``fc1``
inputs, 2 a block). Here the saving forward casts it once, right before the first such op (``norm2_autocast =
_in_autocast_dtype(norm2)``), those ops read the copy, and so does the backward: a convolution's backward as
``(copy, dtype)`` (its input gradient in the value's dtype, kept as ``norm2_dtype = norm2.dtype``), a linear
map's weight gradient, the input gradient's layout and shape, a shape the backward reads; a cast to the
value's dtype reads the kept dtype. Only where the backward reads the value for nothing else: there autograd
keeps the copy alone (the float32 value is freed at its last forward use), and so does the bound step; where
the backward reads the value itself too (autograd keeps both) it keeps the value and casts it again, memory
first. Not a value a block keeps itself, nor one the caller keeps (the loss's inputs, the outputs).
"""

from __future__ import annotations

import dataclasses

import sympy

from .algebra import CONSTANT, Size, TensorOp, op, primitive, tensor
from .kept import VIEWS, held_by_blocks
from .reverse import Program, Statement

# where each op reads a weight that autocast casts to its lower precision (every operand of these ops is
# cast so): the forward's convolution (transposed too), linear map and addmm; the backward's convolution
# backward and the linear maps' input-gradient products (linear's ``grad @ W``, addmm's ``grad @ mat2.T``)
WEIGHT_READS = {
    "forward": {("conv", 1), ("conv_transpose", 1), ("linear", 1), ("addmm", 2)},
    "backward": {
        ("conv_backward", 2),
        ("linear_input_grad", 1),
        ("linear_frozen_input_grad", 1),
        ("matmul", 1),
        ("matmul_transposed", 1),
    },
}


def _reads(expr, found: dict, where: str) -> None:
    """Add to ``found[symbol]`` how ``expr`` reads each symbol: ``"weight"`` as an operand autocast casts
    (``WEIGHT_READS``), ``"dtype"`` for its dtype alone (``cast_like``'s operand 1, the weight a
    convolution's backward is given beside its copy), else ``"other"``."""
    if isinstance(expr, TensorOp):
        name = expr.primitive.name
        for position, operand in enumerate(expr.operands):
            if (name, position) in WEIGHT_READS[where] and operand.is_Symbol:
                found.setdefault(operand, set()).add("weight")
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
    """``expr`` reading each weight of ``copies`` through its copy (the backward's conv_backward also
    given the weight itself, for its gradient's dtype)."""
    if not isinstance(expr, TensorOp):
        if not expr.args or isinstance(expr, sympy.Symbol):
            return expr
        arguments = [_read_through(argument, copies, where) for argument in expr.args]
        return expr if arguments == list(expr.args) else expr.func(*arguments)
    operands = [_read_through(operand, copies, where) for operand in expr.operands]
    name = expr.primitive.name
    for position, operand in enumerate(expr.operands):
        if operand in copies and (name, position) in WEIGHT_READS[where]:
            operands[position] = copies[operand]
    if name == "conv_backward" and expr.operands[2] in copies:
        operands.append(expr.operands[2])
    if operands == list(expr.operands):
        return expr
    return TensorOp(expr.args[0], expr.params, *operands)


def kept_as_autocast_copies(fast: Program, positional: frozenset[str] = frozenset()) -> Program:
    """``fast`` where each input read only as convolutions' or products' weights, in the forward and the
    backward, is read through ``{name}_autocast = _in_autocast_dtype({name})``, made right before its
    first forward read and kept for the backward; so is a convolution's or linear map's input that may
    be float32 under autocast, made in the forward or one of the ``positional`` inputs (the top body's,
    not parameters), where the backward reads nothing else of it (:func:`_kept_as_autocast_inputs`)."""
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
        and forward_reads[symbol] == {"weight"}
        and backward_reads.get(symbol, set()) <= {"weight", "dtype"}
        and f"{symbol.name}_autocast" not in names
    }
    if not copies:
        return _kept_as_autocast_inputs(fast, positional)
    forward, pending = [], dict(copies)
    for statement in fast.forward:
        for symbol in sorted(statement.value.free_symbols & pending.keys(), key=str):
            forward.append(Statement(pending.pop(symbol), op("in_autocast_dtype", symbol), statement.node))
        forward.append(dataclasses.replace(statement, value=_read_through(statement.value, copies, "forward")))
    backward = [
        dataclasses.replace(statement, value=_read_through(statement.value, copies, "backward"))
        for statement in fast.backward
    ]
    return _kept_as_autocast_inputs(dataclasses.replace(fast, forward=forward, backward=backward), positional)


# autocast's lower-precision ops (on every device): their output is in autocast's dtype
NARROWING = {
    "conv",
    "conv_transpose",
    "linear",
    "addmm",
    "matmul",
    "matmul_transposed",
    "scaled_dot_product_attention",
    "attention_with_logsumexp",
}
# the ops whose output takes their first operand's dtype under every device's autocast (none is on a
# float32 list: a batch norm's float32 weight and statistics with a bfloat16 input give bfloat16; a
# layer or group norm, a softmax, ``exp``, a power are float32 on CUDA, a CPU's reflect and replicate
# padding and 3-d pools too)
FOLLOWING = VIEWS | {
    "item",
    "relu",
    "relu6",
    "leaky_relu",
    "hardtanh",
    "clamp",
    "clamp_min",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "hardswish",
    "hardsigmoid",
    "batch_norm",
    "native_batch_norm",
    "flip",
    "roll",
}
POOLS = {"max_pool", "max_pool_with_indices", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool"}
"""Pools that take their operand's dtype in 1 or 2 dims (a CPU's autocast runs 3-d ones in float32)."""


def narrow_under_autocast(fast: Program) -> set:
    """The forward values surely in autocast's lower precision under autocast (the others may be float32):
    a :data:`NARROWING` op's output, a :data:`FOLLOWING` op's of such a value (a 1-d or 2-d pool's, a
    constant or circular padding's), a concatenation and a sum or product of such values alone (a parameter, an input or a
    size among its operands: maybe float32). Where it errs, a value is judged maybe float32: its copy is
    the value itself at run time (``_in_autocast_dtype``)."""
    narrow: set = set()
    for statement in fast.forward:
        value = statement.value
        if isinstance(value, TensorOp):
            name, operand = value.primitive.name, value.operands[0] if value.operands else None
            follows = (
                name in FOLLOWING
                or name in POOLS
                and value.params.get("dims") in (1, 2)
                or name == "pad"
                and value.params.get("mode", "constant") in ("constant", "circular")
            )
            joined = name in ("cat", "stack") and set(value.operands) <= narrow  # promoted to the widest
            if name in NARROWING or follows and operand in narrow or joined:
                narrow.add(statement.target)
        elif isinstance(value, (sympy.Add, sympy.Mul)) and value.free_symbols and value.free_symbols <= narrow:
            narrow.add(statement.target)
    return narrow


# the forward's ops whose input (operand 0) autocast casts to its lower precision
CAST_INPUTS = {"conv", "conv_transpose", "linear"}
# a linear map's input as its backward reads it (rules/linear.py): by the weight's gradient (folded to
# [N, in] by ``flatten`` where it has more dims), else for its shape and layout alone
LINEAR_INPUT_READS = {
    ("linear_weight_grad", 1),
    ("linear_input_grad", 2),
    ("linear_input_grad", 3),
    ("linear_bias_grad", 2),
}

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


def _copy_and_dtype_tangent(expr, tangent_of):
    moved = tangent_of(expr.operands[0])
    return moved if moved == 0 else TensorOp("copy_and_dtype", expr.params, moved, expr.operands[1])


primitive(  # a convolution's input as its backward's helper takes a kept copy: ``(copy, dtype)``
    "copy_and_dtype",
    code=lambda operands, params, show: f"({operands[0]}, {operands[1]})",
    latex=lambda operands, params, show: operands[0],
    tangent=_copy_and_dtype_tangent,
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


def _input_reads(expr, found: dict) -> None:
    """Add to ``found[symbol]`` how ``expr`` (the backward's) reads each symbol: ``"conv"`` as a
    convolution backward's input (and ``"dtype"`` where it computes the input's gradient, which takes
    its dtype), ``"linear"`` as a linear map's input (``LINEAR_INPUT_READS``, itself or folded),
    ``"dtype"`` for its dtype alone (``cast_like``'s operand 1), ``"shape"`` for its shape, else
    ``"other"``."""
    if isinstance(expr, Size):
        found.setdefault(expr.of, set()).add("shape")
    elif isinstance(expr, TensorOp):
        name = expr.primitive.name
        for position, operand in enumerate(expr.operands):
            folded = _folded(operand)
            if (name, position) == ("conv_backward", 1) and operand.is_Symbol:
                found.setdefault(operand, set()).update(
                    {"conv", "dtype"} if expr.params["output_mask"][0] else {"conv"}
                )
            elif (name, position) in LINEAR_INPUT_READS and folded is not None:
                found.setdefault(folded, set()).add("linear")
            elif (name, position) == ("cast_like", 1) and operand.is_Symbol:
                found.setdefault(operand, set()).add("dtype")
            elif position in expr.primitive.shape_operands and operand.is_Symbol:
                found.setdefault(operand, set()).add("shape")
            else:
                _input_reads(operand, found)
        for _, value in expr.params.items():
            for part in value if isinstance(value, tuple) else (value,):
                if isinstance(part, sympy.Basic):
                    _input_reads(part, found)
    elif isinstance(expr, sympy.Symbol):
        found.setdefault(expr, set()).add("other")
    else:
        for argument in expr.args:
            _input_reads(argument, found)


def _through_copies(expr, copies: dict):
    """``expr`` (the backward's) with each cast to a value of ``copies``' dtype made to its kept dtype,
    and each convolution backward computing such a value's gradient given ``(copy, dtype)``."""
    if not isinstance(expr, TensorOp):
        if not expr.args or isinstance(expr, sympy.Symbol):
            return expr
        arguments = [_through_copies(argument, copies) for argument in expr.args]
        return expr if arguments == list(expr.args) else expr.func(*arguments)
    operands = [_through_copies(operand, copies) for operand in expr.operands]
    name = expr.primitive.name
    if name == "cast_like" and expr.operands[1] in copies:
        return TensorOp("cast_to", expr.params, operands[0], copies[expr.operands[1]][1])
    if name == "conv_backward" and expr.operands[1] in copies and expr.params["output_mask"][0]:
        operands[1] = op("copy_and_dtype", *copies[expr.operands[1]])
    if operands == list(expr.operands):
        return expr
    return TensorOp(expr.args[0], expr.params, *operands)


def _kept_as_autocast_inputs(fast: Program, positional: frozenset[str]) -> Program:
    """``fast`` where each convolution's or linear map's input that may be float32 under autocast (not
    :func:`narrow_under_autocast`'s), made in the forward or one of the ``positional`` inputs, which the
    backward reads only as such an op's input, for its dtype and its shape, is read through
    ``{name}_autocast = _in_autocast_dtype({name})`` (the forward's convolutions and linear maps, the
    backward) and, where the backward reads its dtype, ``{name}_dtype = {name}.dtype``, both made right
    before the first op that reads the copy."""
    made = {statement.target for statement in fast.forward}
    names = {statement.target.name for statement in fast.forward + fast.backward} | set(fast.graph.nodes)
    kept_anyway = {fast.forward[-1].target, *fast.forward[-1].value.free_symbols}
    kept_anyway |= fast.default_cotangent.free_symbols | held_by_blocks(fast)
    cast_inputs = {
        statement.value.operands[0]
        for statement in fast.forward
        if isinstance(statement.value, TensorOp)
        and statement.value.primitive.name in CAST_INPUTS
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
            _input_reads(statement.value, reads)
    _input_reads(fast.default_cotangent, reads)
    for fold, symbol in folds.items():
        reads.setdefault(symbol, set()).update({"linear"} if reads.get(fold, {"linear"}) == {"linear"} else {"other"})
    narrow = narrow_under_autocast(fast)
    copies = {
        symbol: (tensor(f"{symbol.name}_autocast"), tensor(f"{symbol.name}_dtype"))
        for symbol in sorted(cast_inputs - kept_anyway - narrow, key=str)
        if (symbol in made or symbol.name in positional)
        and reads.get(symbol, set()) & {"conv", "linear"}
        and reads[symbol] <= {"conv", "linear", "dtype", "shape"}
        and not {f"{symbol.name}_autocast", f"{symbol.name}_dtype"} & names
    }
    if not copies:
        return fast
    forward, pending = [], dict(copies)
    for statement in fast.forward:
        value = statement.value
        if isinstance(value, TensorOp) and value.primitive.name in CAST_INPUTS and value.operands[0] in copies:
            symbol = value.operands[0]
            if symbol in pending:
                copy, dtype = pending.pop(symbol)
                forward.append(Statement(copy, op("in_autocast_dtype", symbol), statement.node))
                if "dtype" in reads[symbol]:
                    forward.append(Statement(dtype, op("dtype_of", symbol), statement.node))
            value = TensorOp(value.args[0], value.params, copies[symbol][0], *value.operands[1:])
        forward.append(dataclasses.replace(statement, value=value))
    through = {symbol: copy for symbol, (copy, _) in copies.items()}
    backward = [
        dataclasses.replace(statement, value=_through_copies(statement.value, copies).xreplace(through))
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
