"""Reductions inside a network: ``x.sum(dim, keepdim)`` and ``x.mean(dim, keepdim)`` over any dims.

They are what hand-written normalisations are made of (a channel LayerNorm written as
``u = x.mean(1, keepdim=True); s = (x - u).pow(2).mean(1, keepdim=True)``) and what a
squeeze-and-excitation gate pools with. Both are linear; the adjoint of a sum over dims D copies
each output's gradient back over D (unsqueezed there if the dims were dropped, then expanded to the
input's shape), and a mean's divides it by the number of entries averaged, read from the input's
size at run time so the code stays shape-generic::

    grad_x = grad.unsqueeze(D).expand_as(x) / prod(x.shape[d] for d in D)

The expanded gradient is materialised (``contiguous``), because later in-place updates of a view
whose entries share memory would be wrong.
"""

from __future__ import annotations

import math

import sympy

from ..algebra import LINEAR, Size, op, primitive
from .base import Checker, Forward, Operand, Param, Rule, boolean, ints


def _dims(dims: tuple[int, ...]) -> str:
    return str(dims[0]) if len(dims) == 1 else "(" + ", ".join(map(str, dims)) + ")"


primitive("reduce_dims", code=lambda operands, params, show: (
    f"{operands[0]}.{params['how']}(dim={_dims(params['dims'])}" + (", keepdim=True)" if params["keepdim"] else ")")),
    latex=lambda operands, params, show: (rf"\operatorname{{{params['how']}}}_{{{','.join(map(str, params['dims']))}}}"
                                          rf"\left({operands[0]}\right)"), tangent=LINEAR)
primitive("spread", code=lambda operands, params, show: (
    operands[0] + "".join(f".unsqueeze({d})" for d in ([] if params["keepdim"] else params["dims"]))
    + f".expand_as({operands[1]}).contiguous()"),
    latex=lambda operands, params, show: rf"\operatorname{{spread}}_{{{','.join(map(str, params['dims']))}}}\left({operands[0]}\right)",
    # linear in the gradient; the second operand gives only its shape
    tangent=lambda expr, tangent_of: op("spread", tangent_of(expr.operands[0]), expr.operands[1], **dict(expr.params.items())))


class Reduce(Rule):
    """``x.sum(dim, keepdim)`` / ``x.mean(dim, keepdim)`` over the listed dims."""

    operands = (Operand("input", from_in=True),)
    params = {"dim": Param(None, ints), "keepdim": Param(False, boolean)}
    linear_in = ("input",)

    def __init__(self, how: str):
        self.op = how
        self.how = how
        self.summary = f"{how} over the dims dim (kept as size 1 with keepdim)"

    def _dims(self, rank: int, params, check: Checker | None = None) -> tuple[int, ...]:
        dims = params["dim"]
        if check is not None:
            check.require(all(-rank <= d < rank for d in dims), f"dim {list(dims)} is out of range for a {rank}-dim input",
                          f"give dims in {-rank}..{rank - 1}")
            check.require(len({d % rank for d in dims}) == len(dims), f"dim {list(dims)} names a dim twice",
                          "list each dim once")
        return tuple(sorted(d % rank for d in dims))

    def infer_shape(self, shapes, params, check: Checker):
        shape = list(shapes["input"])
        dims = self._dims(len(shape), params, check)
        if params["keepdim"]:
            return tuple(1 if axis in dims else size for axis, size in enumerate(shape))
        return tuple(size for axis, size in enumerate(shape) if axis not in dims)

    def forward(self, node):
        dims = self._dims(len(node.shapes["input"]), node.params)
        return Forward(op("reduce_dims", node.operands["input"], how=self.how, dims=dims, keepdim=node.params["keepdim"]))

    def pullback(self, node, grad, wanted):
        x = node.operands["input"]
        dims = self._dims(len(node.shapes["input"]), node.params)
        spread = op("spread", grad, x, dims=dims, keepdim=node.params["keepdim"])
        if self.how == "sum":
            return {"input": spread}
        count = math.prod(Size(x, axis) for axis in dims)
        return {"input": spread * sympy.Integer(1) / count}

    def table_row(self):
        scale = "" if self.how == "sum" else " / (entries averaged)"
        return (self.op, f"out = input.{self.how}(dim, keepdim)",
                f"grad_input = grad_out (unsqueezed at dim unless keepdim) expanded to the input's shape{scale}")


RULES = [Reduce("sum"), Reduce("mean")]
