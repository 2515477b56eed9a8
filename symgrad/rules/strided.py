"""``x[:, 1::2]``: every ``step``-th entry along ``dim`` from ``start`` to the end (Swin's and SwinUNETR's
patch merging, ``x[:, 0::2, 1::2, :]``, space-to-depth).

The slice picks entries ``start, start + step, ...``: a 0/1 selection matrix S with one 1 per row, so
its adjoint is Sᵀ: the gradient put back at those entries, zeros between them. That is autograd's own
``slice_backward`` (twice differentiable: its derivative is the slice again), given the input's sizes
at run time and the end as the input's length along ``dim``, so the code is shape-generic.
"""

from __future__ import annotations

import sympy

from ..algebra import LINEAR, op, primitive
from .base import Checker, Forward, Operand, Param, Rule, ints


def _index(dim: int, start: int, step: int) -> str:
    return ", ".join([":"] * dim + [f"{start or ''}::{step}"])


primitive("strided_slice", code=lambda operands, params, show: (
    f"{operands[0]}[{_index(params['dim'], params['start'], params['step'])}]"),
    latex=lambda operands, params, show: rf"{operands[0]}\left[{params['start']}::{params['step']}\right]_{{{params['dim']}}}",
    tangent=LINEAR)

primitive("slice_backward", code=lambda operands, params, show: (
    f"torch.ops.aten.slice_backward({operands[0]}, {operands[1]}, {params['dim']}, {params['start']}, "
    f"{operands[1]}[{params['dim']}], {params['step']})"),
    latex=lambda operands, params, show: rf"\left({operands[0]}\right)\left[{params['start']}::{params['step']}\right]^{{\top}}",
    tangent=lambda expr, tangent_of: _slice_backward_tangent(expr, tangent_of), shape_operands=(1,))


def _slice_backward_tangent(expr, tangent_of):
    """Linear in the gradient; the input gives only its shape."""
    moved = tangent_of(expr.operands[0])
    if moved == 0:
        return sympy.Integer(0)
    return op("slice_backward", moved, expr.operands[1], dim=expr.params["dim"], start=expr.params["start"],
              step=expr.params["step"])


class StridedSlice(Rule):
    op = "strided_slice"
    calls = ()
    traced_elsewhere = "x[:, 1::2]: the tracer's slicing (SpecBuilder.slice) writes a step slice to the end as this op"
    operands = (Operand("input", from_in=True),)
    linear_in = ("input",)
    params = {"dim": Param(None, lambda v, c: ints(v, c)[0]), "start": Param(0, lambda v, c: ints(v, c)[0]),
              "step": Param(None, lambda v, c: ints(v, c)[0])}
    summary = "every step-th entry along dim, from start to the end (x[:, 1::2])"

    def infer_shape(self, shapes, params, check: Checker):
        shape = list(shapes["input"])
        check.require(-len(shape) <= params["dim"] < len(shape), f"dim {params['dim']} is not a dim of the "
                      f"{len(shape)}-dim input", f"give a dim in {-len(shape)}..{len(shape) - 1}")
        dim = params["dim"] % len(shape)
        check.require(params["start"] >= 0 and params["step"] >= 1, "start must be >= 0 and step >= 1",
                      "give a non-negative start and a positive step")
        check.positive(shape[dim] - params["start"], f"start {params['start']} is past dim {dim}'s size", "start earlier")
        shape[dim] = sympy.ceiling((shape[dim] - params["start"]) / sympy.Integer(params["step"])) if isinstance(
            shape[dim], sympy.Basic) else -(-(shape[dim] - params["start"]) // params["step"])
        return tuple(shape)

    def _params(self, node):
        return dict(dim=node.params["dim"] % len(node.shapes["input"]), start=node.params["start"], step=node.params["step"])

    def forward(self, node):
        return Forward(op("strided_slice", node.operands["input"], **self._params(node)))

    def pullback(self, node, grad, wanted):
        return {"input": op("slice_backward", grad, node.operands["input"], **self._params(node))}

    def reference(self, arguments: dict, params: dict):
        """PyTorch's own slicing, ``input[:, start::step]``."""
        source = arguments["input"]
        return source[(slice(None),) * (params["dim"] % source.dim()) + (slice(params["start"], None, params["step"]),)]

    def table_row(self):
        return (self.op, "out = input[..., start::step] along dim",
                "grad_input = zeros of the input's size with grad_out at entries start, start + step, ... (slice_backward)")


RULES = [StridedSlice()]

CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    ("strided_slice", {"x": (2, 5, 3)}, {"op": "strided_slice", "dim": 1, "start": 1, "step": 2}, ("x",)),
]
