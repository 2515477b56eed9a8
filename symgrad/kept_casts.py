"""Under autocast, a convolution's or linear map's weight cast once a step, as autograd casts it (``--keep all``).

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
"""

from __future__ import annotations

import dataclasses

import sympy

from .algebra import TensorOp, op, tensor
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


def _reads(expr, found: dict, where: str) -> None:
    """Add to ``found[symbol]`` how ``expr`` reads each symbol: ``"weight"`` as an operand autocast casts
    (``WEIGHT_READS``), ``"dtype"`` for its dtype alone (``cast_like``'s operand 1, the weight a convolution's
    backward is given beside its copy), else ``"other"``."""
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
        if (name, position) in WEIGHT_READS[where] and operand in copies:
            operands[position] = copies[operand]
    if name == "conv_backward" and expr.operands[2] in copies:
        operands.append(expr.operands[2])
    if operands == list(expr.operands):
        return expr
    return TensorOp(expr.args[0], expr.params, *operands)


def kept_as_autocast_weights(fast: Program) -> Program:
    """``fast`` where each input read only as convolutions' weights, in the forward and the backward,
    is read through ``{name}_autocast = _in_autocast_dtype({name})``, made right before its first forward
    read and kept for the backward."""
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
        return fast
    forward, pending = [], dict(copies)
    for statement in fast.forward:
        for symbol in sorted(statement.value.free_symbols & pending.keys(), key=str):
            forward.append(Statement(pending.pop(symbol), op("in_autocast_dtype", symbol), statement.node))
        forward.append(dataclasses.replace(statement, value=_read_through(statement.value, copies, "forward")))
    backward = [
        dataclasses.replace(statement, value=_read_through(statement.value, copies, "backward"))
        for statement in fast.backward
    ]
    return dataclasses.replace(fast, forward=forward, backward=backward)


def read_beyond_dtype(statements) -> set[str]:
    """The names of the symbols ``statements`` (the backward's) read for more than their dtype: a weight
    read through its kept copy alone is read for its dtype only (its layout, its values not)."""
    found: dict = {}
    for statement in statements:
        _reads(statement.value, found, "backward")
    return {symbol.name for symbol, how in found.items() if how - {"dtype"}}
