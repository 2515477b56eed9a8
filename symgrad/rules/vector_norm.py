"""``torch.linalg.vector_norm(x, ord=2, dim, keepdim)`` (and ``torch.norm(x, p=2, dim)``, ``x.norm(dim=...)``):
the Euclidean length over dims, as ConvNeXtV2's global response normalisation takes it over space.

With ``n = ||x||`` over the dims, ``dn = sum(x * dx) / n``, so the pullback of ``g`` is ``x * g / n``
(``g`` put back on the reduced dims); where ``n`` is 0 PyTorch's gradient is 0, and so is this one
(``1 / n`` taken as 0 there).
"""

from __future__ import annotations

import sympy

from ..algebra import op, primitive
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, boolean, ints
from .shared import show_dims


def _norm_tangent(expr, tangent_of):
    moved = tangent_of(expr.operands[0])
    if moved == 0:
        return sympy.Integer(0)
    summed = op(
        "reduce_dims", expr.operands[0] * moved, how="sum", dims=expr.params["dim"], keepdim=expr.params["keepdim"]
    )
    return summed * op("reciprocal_or_zero", expr)


primitive(
    "norm_over",
    code=lambda operands, params, show: (
        f"torch.linalg.vector_norm({operands[0]}, dim={show_dims(params['dim'])}"
        + (", keepdim=True)" if params["keepdim"] else ")")
    ),
    latex=lambda operands, params, show: rf"\lVert {operands[0]} \rVert_{{{','.join(map(str, params['dim']))}}}",
    tangent=_norm_tangent,
)
primitive(
    "reciprocal_or_zero",
    code=lambda operands, params, show: f"{operands[0]}.reciprocal().masked_fill({operands[0]} == 0, 0)",
    latex=lambda operands, params, show: rf"\frac{{1}}{{{operands[0]}}}",
    tangent=lambda expr, tangent_of: -(expr**2) * tangent_of(expr.operands[0]),
)


def _two(value, context: ParamContext):
    if value not in (2, 2.0, "fro"):
        raise context.fail(
            f"is {value!r}; symgrad derives the Euclidean length (ord=2) only",
            "use ord=2, or write the norm out (x.abs().pow(p).sum(dim, keepdim=True).pow(1 / p))",
        )
    return 2


def _dims(value, context: ParamContext):
    if value is None:
        raise context.fail(
            "is missing: the norm of the whole tensor is a loss, not a layer", "give the dims, e.g. `dim: [1, 2]`"
        )
    return ints(value, context)


class VectorNorm(Rule):
    op = "vector_norm"
    calls = ("vector_norm", "linalg_vector_norm")
    signature = ("x", "ord", "dim", "keepdim")
    operands = (Operand("x", from_in=True),)
    params = {"ord": Param(2, _two), "dim": Param(None, _dims), "keepdim": Param(False, boolean)}
    summary = "the Euclidean length over dims"

    def reference(self, arguments, params):
        import torch

        return torch.linalg.vector_norm(arguments["x"], ord=2, dim=params["dim"], keepdim=params["keepdim"])

    def _dims(self, node_or_rank, params=None) -> tuple[int, ...]:
        rank = node_or_rank if isinstance(node_or_rank, int) else len(node_or_rank.shapes["x"])
        params = params if params is not None else node_or_rank.params
        return tuple(sorted(dim % rank for dim in params["dim"]))

    def infer_shape(self, shapes, params, check: Checker):
        shape, rank = list(shapes["x"]), len(shapes["x"])
        check.require(
            all(-rank <= dim < rank for dim in params["dim"])
            and len({dim % rank for dim in params["dim"]}) == len(params["dim"]),
            f"dims {list(params['dim'])} must be distinct dims of the {rank}-dim input",
            f"give dims in {-rank}..{rank - 1}",
        )
        dims = self._dims(rank, params)
        if params["keepdim"]:
            return tuple(1 if axis in dims else size for axis, size in enumerate(shape))
        return tuple(size for axis, size in enumerate(shape) if axis not in dims)

    def forward(self, node):
        return Forward(op("norm_over", node.operands["x"], dim=self._dims(node), keepdim=node.params["keepdim"]))

    def pullback(self, node, grad, wanted):
        x, dims = node.operands["x"], self._dims(node)
        scaled = grad * op("reciprocal_or_zero", node.out)
        if not node.params["keepdim"]:
            scaled = op("spread", scaled, x, dims=dims, keepdim=False)
        return {"x": scaled * x}

    def table_row(self):
        return self.op, "out = sqrt(sum over dim of x ** 2)", "grad_x = x * grad / out (0 where out is 0)"


RULES = [VectorNorm()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "vector_norm": [
        Sample(
            "vector_norm-keepdim",
            {"x": [2, 3, 4, 5], "y": [2, 1, 1, 5]},
            [{"op": "vector_norm", "dim": [1, 2], "keepdim": True, "out": "out"}],
            ["x"],
        ),
        Sample(
            "vector_norm-last", {"x": [2, 3, 4], "y": [2, 3]}, [{"op": "vector_norm", "dim": [-1], "out": "out"}], ["x"]
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "vector_norm": [
        Spelling("x / torch.norm(x, p=2, dim=(2, 3), keepdim=True)"),  # ConvNeXtV2's GRN
        Spelling("x.norm(dim=1)"),
        Spelling("torch.linalg.vector_norm(x, dim=-1, keepdim=True) * x"),
    ],
}
