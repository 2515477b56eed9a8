"""Pointwise ops that the one-formula ``Elementwise`` rules do not cover: ``prelu`` (a learned slope per
channel, along dim 1) and ``addcmul`` (three operands).

``prelu(x, w) = max(0, x) + w * min(0, x)`` with ``w`` of shape [C] (or [1]) seen as [C, 1, ...]::

    grad_x = grad * (H(x) + w * (1 - H(x)))          (H(0) = 0: slope w at 0, as PyTorch takes it)
    grad_w = sum over every dim but 1 of grad * min(0, x)   (all dims for a single shared w)

``addcmul(input, tensor1, tensor2, value) = input + value * tensor1 * tensor2`` broadcasts its three
operands; the reverse walk sums each gradient back to its operand's shape.
"""

from __future__ import annotations

import sympy

from ..algebra import op, primitive
from .base import Checker, Forward, Operand, Param, Rule, Sample, Spelling, boolean, number


def _prelu_tangent(expr, tangent_of):
    x, weight = expr.operands
    slope = op("channel_view", weight, trailing=expr.params["trailing"])
    moved_x, moved_w = tangent_of(x), tangent_of(weight)
    mask = sympy.Heaviside(x, 0)
    return moved_x * (mask + slope * (1 - mask)) + (
        op("channel_view", moved_w, trailing=expr.params["trailing"]) * x * (1 - sympy.Heaviside(x, 0))
        if moved_w != 0
        else 0
    )


primitive(
    "prelu",
    code=lambda operands, params, show: f"F.prelu({operands[0]}, {operands[1]})",
    latex=lambda operands, params, show: rf"\operatorname{{prelu}}\left({operands[0]}, {operands[1]}\right)",
    tangent=_prelu_tangent,
)


class PReLU(Rule):
    op = "prelu"
    calls = ("prelu",)
    operands = (Operand("input", from_in=True), Operand("weight"))
    operand_roles = {"weight": "shift"}
    params = {"shared": Param(False, boolean)}
    """``shared: true``: one slope for every channel (nn.PReLU()'s default), weight [1]; the tracer sets it
    (PyTorch tells the two apart by the weight's size, which a spec's test shapes may change)."""
    summary = "max(0, x) + weight * min(0, x), one slope per channel (dim 1) or one for all (shared)"
    activation_gain = 2**0.5

    def reference(self, arguments, params):
        import torch

        return torch.nn.functional.prelu(arguments["input"], arguments["weight"])

    def infer_shape(self, shapes, params, check: Checker):
        x, weight = shapes["input"], shapes["weight"]
        check.require(len(weight) == 1, "weight must be 1-d: [C] or [1]", "give the weight the shape [C] or [1]")
        if params["shared"] or len(x) < 2:
            check.equal(
                weight[0],
                1,
                f"weight has {weight[0]} entries, but a shared slope is one",
                "give the weight the shape [1], or drop `shared: true` for one slope per channel",
            )
        else:
            check.equal(
                weight[0],
                x[1],
                f"weight has {weight[0]} entries but the input has {x[1]} channels",
                "give the weight the shape [C], or [1] with `shared: true`",
            )
        return tuple(x)

    def _slope(self, node):
        rank = len(node.shapes["input"])
        return (
            op("channel_view", node.operands["weight"], trailing=max(rank - 2, 0))
            if rank >= 2
            else node.operands["weight"]
        )

    def forward(self, node):
        x = node.operands["input"]
        math = sympy.Max(0, x) + self._slope(node) * x * (1 - sympy.Heaviside(x, 0))
        return Forward(op("prelu", x, node.operands["weight"], trailing=max(len(node.shapes["input"]) - 2, 0)), math)

    def pullback(self, node, grad, wanted):
        x, grads = node.operands["input"], {}
        if "input" in wanted:
            mask = node.local("mask", sympy.Heaviside(x, 0), note=f"where {node.name}'s input is positive")
            grads["input"] = grad * (mask + self._slope(node) * (1 - mask))
        if "weight" in wanted:
            rank = len(node.shapes["input"])
            shared = node.params["shared"] or rank < 2
            dims = tuple(range(rank)) if shared or rank < 2 else (0,) + tuple(range(2, rank))
            summed = op("sum", grad * x * (1 - sympy.Heaviside(x, 0)), dim=dims)
            grads["weight"] = op("reshape_like", summed, node.operands["weight"]) if shared else summed
        return grads

    def table_row(self):
        return (
            self.op,
            "out = max(0, input) + weight * min(0, input), weight per channel",
            "grad_input = grad * (input > 0 ? 1 : weight); grad_weight = Σ grad * min(0, input) over all but dim 1",
        )


class AddCMul(Rule):
    op = "addcmul"
    calls = ("addcmul", "addcmul_")
    operands = (Operand("input", from_in=True), Operand("tensor1", from_in=True), Operand("tensor2", from_in=True))
    params = {"value": Param(1, number)}
    broadcasts = True
    summary = "input + value * tensor1 * tensor2, broadcasting"

    def infer_shape(self, shapes, params, check: Checker):
        ranks = [shapes[name] for name in ("input", "tensor1", "tensor2")]
        rank = max(len(shape) for shape in ranks)
        padded = [(1,) * (rank - len(shape)) + tuple(shape) for shape in ranks]
        out = []
        for axis, sizes in enumerate(zip(*padded)):
            if check.symbolic:
                for size in sizes[1:]:
                    check.equal(size, sizes[0], "", "")
                out.append(sizes[0])
                continue
            wide = [size for size in sizes if size != 1]
            check.require(
                len(set(wide)) <= 1,
                f"operands of shapes {[tuple(s) for s in ranks]} do not broadcast (axis {axis})",
                "make the sizes equal, or 1",
            )
            out.append(wide[0] if wide else 1)
        return tuple(out)

    def forward(self, node):
        named = node.operands
        with sympy.evaluate(False):
            return Forward(named["input"] + node.params["value"] * named["tensor1"] * named["tensor2"])

    def pullback(self, node, grad, wanted):
        named, value = node.operands, node.params["value"]
        grads = {"input": grad, "tensor1": value * grad * named["tensor2"], "tensor2": value * grad * named["tensor1"]}
        return {key: grads[key] for key in wanted}

    def table_row(self):
        return (
            self.op,
            "out = input + value * tensor1 * tensor2",
            "d/dinput = 1; d/dtensor1 = value * tensor2; d/dtensor2 = value * tensor1",
        )


RULES = [PReLU(), AddCMul()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "prelu": [
        Sample(
            "prelu-per-channel",
            {"x": [2, 3, 4, 5], "w": [3], "y": [2, 3, 4, 5]},
            [{"op": "prelu", "weight": "w", "in": ["x"], "out": "out"}],
            ["x", "w"],
        ),
        Sample(
            "prelu-shared",
            {"x": [2, 3, 4], "w": [1], "y": [2, 3, 4]},
            [{"op": "prelu", "weight": "w", "shared": True, "in": ["x"], "out": "out"}],
            ["x", "w"],
        ),
    ],
    "addcmul": [
        Sample(
            "addcmul-broadcast",
            {"a": [2, 3, 4, 5], "b": [2, 3, 1, 1], "c": [3, 4, 5], "y": [2, 3, 4, 5]},
            [{"op": "addcmul", "in": ["a", "b", "c"], "value": 0.5, "out": "out"}],
            ["a", "b", "c"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "prelu": [
        Spelling("nn.PReLU(3)", module=True),
        Spelling("nn.PReLU()", module=True),  # one slope for every channel
        Spelling("F.prelu(x, w)", {"x": (2, 3, 8, 8), "w": (3,)}),
    ],
    "addcmul": [
        Spelling("torch.addcmul(x, x, y, value=0.5)", {"x": (2, 3, 8, 8), "y": (3, 1, 1)}),
        Spelling("x.addcmul(y, y)", {"x": (2, 3, 8, 8), "y": (2, 3, 8, 8)}),
    ],
}
