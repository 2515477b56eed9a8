"""``group_norm``: each group of channels normalised over its channels and space, then per-channel
weight and bias; the shared formula and helpers are ``norm.py``'s."""

from __future__ import annotations

import math

from ..algebra import op
from .base import Checker, Operand, Param, ParamContext, Sample, Spelling, positive_number
from .norm import Norm, fused_norm_pullback, normalized_pullback


def positive_groups(value, context: ParamContext):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise context.fail(f"must be a positive int, not {value!r}", "write e.g. `num_groups: 2`")
    return value


class GroupNorm(Norm):
    op = "group_norm"
    calls = ("group_norm",)
    operand_roles = {"weight": "scale", "bias": "shift"}
    operands = (Operand("input", from_in=True), Operand("weight", optional=True), Operand("bias", optional=True))
    params = {"num_groups": Param(None, positive_groups), "eps": Param(1e-5, positive_number)}
    summary = "normalise each group of channels over its channels and space"

    def elements_per_statistic(self, shapes, params):
        x = shapes["input"]
        return (x[1] // params["num_groups"]) * math.prod(x[2:])

    def infer_shape(self, shapes, params, check: Checker):
        x = shapes["input"]
        check.require(len(x) >= 3, "group_norm needs [N, C, ...]", "pass a batched input with spatial dims")
        check.equal(
            x[1] % params["num_groups"],
            0,
            f"{x[1]} channels are not divisible by num_groups={params['num_groups']}",
            "use a num_groups that divides the channels",
        )
        for name in ("weight", "bias"):
            if name in shapes:
                check.require(len(shapes[name]) == 1, f"{name} must be 1-d [C]", "give it the shape [C]")
                check.equal(shapes[name][0], x[1], f"{name} must have one entry per channel", "give it the shape [C]")
        return tuple(x)

    def forward(self, node):
        names, params = self._forward_params(node, ("num_groups", "eps"))
        value = op("group_norm", *(node.operands[name] for name in names), **params)
        return self._native_forward(node, value, "native_group_norm", num_groups=node.params["num_groups"])

    def pullback(self, node, grad, wanted):
        if node.fused:
            return fused_norm_pullback(
                node, grad, wanted, "group_norm", statistics=("mean", "rstd"), num_groups=node.params["num_groups"]
            )
        rank, groups = len(node.shapes["input"]), node.params["num_groups"]
        weight = op("channel_view", node.operands["weight"], trailing=rank - 2) if "weight" in node.operands else None
        ghat_full = grad * weight if weight is not None else grad
        dims = tuple(range(2, rank + 1))  # in the grouped view [N, G, C/G, ...]
        x_view = op("group_view", node.operands["input"], groups=groups)
        grad_view = op("group_view", ghat_full, groups=groups)
        grad_x, xhat = normalized_pullback(node, x_view, grad_view, dims, None)
        sum_dims = (0,) + tuple(range(2, rank))
        grads = self._affine_grads(node, grad, xhat, wanted, sum_dims, unview=lambda e: op("group_unview", e))
        if "input" in wanted:
            grads["input"] = op("group_unview", grad_x)
        return grads

    def table_row(self):
        return (
            self.op,
            "out = per-group (x - mean) / sqrt(var + eps), then per-channel weight and bias",
            "grad_x = rstd (ĝ - mean ĝ - x̂ mean(ĝ x̂)) in each group, ĝ = grad * weight",
        )


RULES = [GroupNorm()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "group_norm": [
        Sample(
            "group_norm",
            {"x": [2, 4, 3, 3], "w": [4], "b": [4], "y": [2, 4, 3, 3]},
            [{"op": "group_norm", "num_groups": 2, "weight": "w", "bias": "b"}],
            ["x", "w", "b"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "group_norm": [
        Spelling("nn.GroupNorm(3, 3)", module=True),
        Spelling("nn.GroupNorm(1, 3)", module=True),
        Spelling("nn.GroupNorm(1, 2)", {"x": (2, 2, 4, 5, 3)}, module=True),
    ],
}
