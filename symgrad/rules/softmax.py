"""``softmax`` and ``log_softmax`` over any dim, as layers (attention weights, selective-kernel gates).

With ``s = softmax(x, dim)``, the Jacobian is ``diag(s) - s s^T`` along ``dim``, so the pullback of
a gradient ``g`` never builds it::

    grad_x = s * (g - sum_dim(s * g))

and with ``l = log_softmax(x, dim)`` (``exp(l) = s``)::

    grad_x = g - exp(l) * sum_dim(g)

Both read only the op's output, so the input can be freed after the forward. The sums keep the dim
(``keepdim=True``) and broadcast back. ``cross_entropy`` uses the same ``softmax`` over the class dim.
"""

from __future__ import annotations

import sympy

from ..algebra import op, primitive
from .base import Checker, Forward, Operand, Param, Rule, Sample, Spelling, one_dim
from .shared import sum_over


def _softmax_tangent(expr, tangent_of):
    """d softmax(x) = s * (dx - sum_dim(s * dx))."""
    moved = tangent_of(expr.operands[0])
    if moved == 0:
        return sympy.Integer(0)
    return expr * (moved - sum_over(expr * moved, expr.params["dim"]))


def _log_softmax_tangent(expr, tangent_of):
    """d log_softmax(x) = dx - sum_dim(softmax(x) * dx)."""
    moved = tangent_of(expr.operands[0])
    if moved == 0:
        return sympy.Integer(0)
    return moved - sum_over(sympy.exp(expr) * moved, expr.params["dim"])


primitive(
    "softmax",
    code=lambda operands, params, show: f"torch.softmax({operands[0]}, {params['dim']})",
    latex=lambda operands, params, show: rf"\operatorname{{softmax}}_{{{params['dim']}}}\left({operands[0]}\right)",
    tangent=_softmax_tangent,
)
primitive(
    "log_softmax",
    code=lambda operands, params, show: f"torch.log_softmax({operands[0]}, {params['dim']})",
    latex=lambda operands, params, show: (
        rf"\operatorname{{log\,softmax}}_{{{params['dim']}}}"
        rf"\left({operands[0]}\right)"
    ),
    tangent=_log_softmax_tangent,
)


class Softmax(Rule):
    operands = (Operand("input", from_in=True),)
    params = {"dim": Param(None, one_dim)}

    def __init__(self, op_name: str, summary: str):
        self.op = op_name
        self.calls = (op_name,)
        self.summary = summary

    def infer_shape(self, shapes, params, check: Checker):
        rank = len(shapes["input"])
        check.require(
            -rank <= params["dim"] < rank if rank else params["dim"] in (0, -1),
            f"dim {params['dim']} is out of range for a {rank}-dim input",
            f"give a dim in {-rank}..{rank - 1}",
        )
        return tuple(shapes["input"])

    def _axis(self, node) -> int:
        return node.params["dim"] % max(len(node.shapes["input"]), 1)

    def forward(self, node):
        return Forward(op(self.op, node.operands["input"], dim=self._axis(node)))

    def pullback(self, node, grad, wanted):
        axis, out = self._axis(node), node.out
        if self.op == "softmax":
            return {"input": out * (grad - sum_over(out * grad, axis))}
        probabilities = node.local("softmax", sympy.exp(out), note=f"softmax of {node.name}'s input, from its output")
        return {"input": grad - probabilities * sum_over(grad, axis)}

    def table_row(self):
        if self.op == "softmax":
            return self.op, "out = exp(input) / sum_dim(exp(input))", "grad_input = out * (grad - sum_dim(out * grad))"
        return (self.op, "out = input - log(sum_dim(exp(input)))", "grad_input = grad - exp(out) * sum_dim(grad)")


RULES = [
    Softmax("softmax", "softmax over dim: exp(x) normalised to sum 1 along dim"),
    Softmax("log_softmax", "log of softmax over dim, computed stably"),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "softmax": [
        Sample(
            "softmax-channels",
            {"x": [2, 3, 4, 5], "y": [2, 3, 4, 5]},
            [{"op": "softmax", "dim": 1, "out": "out"}],
            ["x"],
        ),
        Sample("softmax-last", {"x": [2, 6, 5], "y": [2, 6, 5]}, [{"op": "softmax", "dim": -1, "out": "out"}], ["x"]),
    ],
    "log_softmax": [
        Sample(
            "log_softmax-first",
            {"x": [3, 4, 5], "y": [3, 4, 5]},
            [{"op": "log_softmax", "dim": 0, "out": "out"}],
            ["x"],
        ),
        Sample(
            "log_softmax-middle",
            {"x": [2, 3, 4], "y": [2, 3, 4]},
            [{"op": "log_softmax", "dim": -2, "out": "out"}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "softmax": [
        Spelling("F.softmax(x, dim=-1)"),
        Spelling("nn.Softmax(dim=1)", module=True),
        Spelling("x.flatten(2).softmax(-1)"),  # attention weights over positions
    ],
    "log_softmax": [
        Spelling("torch.log_softmax(x, 2)"),
        Spelling("nn.LogSoftmax(dim=1)", module=True),  # a layer when no nll_loss follows
    ],
}
