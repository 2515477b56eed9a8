"""``F.normalize(x, p=2, dim, eps)``: each vector along ``dim`` divided by its length, at least ``eps``
(the queries and keys of Restormer's transposed attention, cosine-similarity heads).

With ``n = ||x||`` along dim, ``d = max(n, eps)`` and ``out = x / d``, the pullback of ``g`` is::

    grad_x = (g - [n >= eps] * out * sum_dim(g * out)) / d

(where the length is clamped, ``d`` is a constant and only ``g / eps`` is left; PyTorch's ``clamp_min``
passes the gradient at ``n == eps``, and so does the mask here).
"""

from __future__ import annotations

import sympy

from ..algebra import CONSTANT, op, primitive
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, one_dim, positive_number
from .shared import sum_over


def _normalize_tangent(expr, tangent_of):
    """The Jacobian is symmetric: the tangent has the pullback's form."""
    moved = tangent_of(expr.operands[0])
    if moved == 0:
        return sympy.Integer(0)
    axis, eps = expr.params["dim"], expr.params["eps"]
    length = op("vector_norm", expr.operands[0], dim=axis)
    return (moved - op("at_least", length, bound=eps) * expr * sum_over(moved * expr, axis)) / op(
        "clamp_min", length, bound=eps
    )


def _length_tangent(expr, tangent_of):
    moved = tangent_of(expr.operands[0])
    if moved == 0:
        return sympy.Integer(0)
    return sum_over(expr.operands[0] * moved, expr.params["dim"]) / expr


primitive(
    "at_least",
    code=lambda operands, params, show: f"({operands[0]} >= {show(params['bound'])}).to({operands[0]}.dtype)",
    latex=lambda operands, params, show: rf"\left[{operands[0]} \geq {show(params['bound'])}\right]",
    tangent=CONSTANT,
)
primitive(
    "clamp_min",
    code=lambda operands, params, show: f"{operands[0]}.clamp_min({show(params['bound'])})",
    latex=lambda operands, params, show: rf"\max\left({operands[0]}, {show(params['bound'])}\right)",
    # PyTorch's clamp_min passes the gradient where the input is at least the bound
    tangent=lambda expr, tangent_of: (
        op("at_least", expr.operands[0], **dict(expr.params.items())) * tangent_of(expr.operands[0])
    ),
)
primitive(
    "normalize",
    code=lambda operands, params, show: f"F.normalize({operands[0]}, dim={params['dim']}, eps={show(params['eps'])})",
    latex=lambda operands, params, show: (
        rf"\frac{{{operands[0]}}}{{\max\left(\lVert {operands[0]} \rVert_{{{params['dim']}}}, "
        rf"\epsilon\right)}}"
    ),
    tangent=_normalize_tangent,
)
primitive(
    "vector_norm",
    code=lambda operands, params, show: f"torch.linalg.vector_norm({operands[0]}, dim={params['dim']}, keepdim=True)",
    latex=lambda operands, params, show: rf"\lVert {operands[0]} \rVert_{{{params['dim']}}}",
    tangent=_length_tangent,
)


def _two(value, context: ParamContext):
    if value != 2:
        raise context.fail(
            f"is {value!r}; symgrad derives the Euclidean length (p=2) only",
            "use p=2, or write the norm out (x.abs().pow(p).sum(dim, keepdim=True).pow(1 / p))",
        )
    return 2


class Normalize(Rule):
    op = "normalize"
    calls = ("normalize",)
    operands = (Operand("input", from_in=True),)
    params = {"p": Param(2, _two), "dim": Param(1, one_dim), "eps": Param(1e-12, positive_number)}
    summary = "each vector along dim divided by its Euclidean length (at least eps)"

    def reference_params(self, params: dict) -> dict:
        return {"p": 2.0, "dim": params["dim"], "eps": params["eps"]}

    def infer_shape(self, shapes, params, check: Checker):
        rank = len(shapes["input"])
        check.require(
            -rank <= params["dim"] < rank,
            f"dim {params['dim']} is out of range for a {rank}-dim input",
            f"give a dim in {-rank}..{rank - 1}",
        )
        return tuple(shapes["input"])

    def _axis(self, node) -> int:
        return node.params["dim"] % len(node.shapes["input"])

    def forward(self, node):
        return Forward(op("normalize", node.operands["input"], dim=self._axis(node), eps=node.params["eps"]))

    def pullback(self, node, grad, wanted):
        axis, eps, out = self._axis(node), node.params["eps"], node.out
        length = node.local(
            "length",
            op("vector_norm", node.operands["input"], dim=axis),
            note=f"length of {node.name}'s input vectors along dim {axis}",
        )
        unclamped = op("at_least", length, bound=eps)
        return {"input": (grad - unclamped * out * sum_over(grad * out, axis)) / op("clamp_min", length, bound=eps)}

    def table_row(self):
        return (
            self.op,
            "out = input / max(||input||_dim, eps)",
            "grad_input = (grad - [||input|| >= eps] out sum_dim(grad * out)) / max(||input||, eps)",
        )


RULES = [Normalize()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "normalize": [
        Sample(
            "normalize-last",
            {"x": [2, 3, 4, 5], "y": [2, 3, 4, 5]},
            [{"op": "normalize", "dim": -1, "out": "out"}],
            ["x"],
        ),
        Sample(
            "normalize-some-clamped",
            {"x": [2, 3, 4], "y": [2, 3, 4]},
            [{"op": "normalize", "dim": 1, "eps": 0.5, "out": "out"}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "normalize": [
        Spelling("F.normalize(x.flatten(2), dim=-1)"),  # Restormer's queries and keys
        Spelling("torch.nn.functional.normalize(x)"),
    ],
}
