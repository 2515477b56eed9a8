"""``instance_norm``: each sample's channel normalised over its own space (group_norm with one channel
per group), or by running statistics; the shared formula and helpers are ``norm.py``'s."""

from __future__ import annotations

import math

import sympy

from ..algebra import Size, op
from .base import Checker, Forward, Param, Sample, Spelling, positive_number
from .norm import (
    Norm,
    check_per_channel,
    flag,
    fused_norm_pullback,
    momentum_param,
    normalized_pullback,
)
from .norm_batch import BatchNorm


class InstanceNorm(Norm):
    """``F.instance_norm``: each sample's channel normalised over its own space (group_norm with one
    channel per group, so the same formula over dims 2..), then per-channel weight and bias. With
    ``use_input_stats: false`` (nn.InstanceNorm in eval mode with track_running_stats) it normalises by
    the running statistics, affine in x as eval-mode batch_norm is. Given running statistics in
    training, ``F.instance_norm`` moves them in place (the batch average of each sample's statistics),
    as the module's forward does."""

    op = "instance_norm"
    calls = ("instance_norm",)
    operand_roles = BatchNorm.operand_roles
    operands = BatchNorm.operands
    params = {
        "use_input_stats": Param(True, flag),
        "momentum": Param(0.1, momentum_param),
        "eps": Param(1e-5, positive_number),
    }
    summary = "normalise each sample's channel over its space (or by running statistics), then scale and shift"

    def elements_per_statistic(self, shapes, params):
        return math.prod(shapes["input"][2:]) if params["use_input_stats"] else None

    def infer_shape(self, shapes, params, check: Checker):
        x = shapes["input"]
        check.require(len(x) >= 3, "instance_norm needs [N, C, ...]", "pass a batched input with spatial dims")
        stats = "running_mean" in shapes and "running_var" in shapes
        check.require(
            stats or (params["use_input_stats"] and "running_mean" not in shapes and "running_var" not in shapes),
            "instance_norm needs both running_mean and running_var with use_input_stats: false, and both "
            "or neither otherwise",
            "give both running statistics, or (use_input_stats: true) neither",
        )
        check_per_channel(shapes, x, check)
        return tuple(x)

    def running_statistics(self, node):
        if node.params["use_input_stats"] and "running_mean" in node.operands:
            momentum = node.params["momentum"]
            return "running_mean", "running_var", 0 if momentum is None else momentum
        return None

    def forward(self, node):
        updates = node.params["use_input_stats"] and "running_mean" in node.operands
        shown = (
            ("momentum", "eps")
            if updates
            else ("eps",)
            if node.params["use_input_stats"]
            else ("use_input_stats", "eps")
        )
        names, params = self._forward_params(node, shown)
        if updates:
            params["momentum"] = 0 if node.params["momentum"] is None else node.params["momentum"]
        value = op("instance_norm", *(node.operands[name] for name in names), **params)
        if self._keeps_statistics(node):
            return self._native_forward(node, value, "native_instance_norm")
        return Forward(value)

    @staticmethod
    def _keeps_statistics(node) -> bool:
        """Normalised by its own statistics, with no running ones to move: the forward keeps the mean and
        1 / std its kernel computed, as autograd keeps them (with running statistics F.instance_norm moves
        them in place, and the backward computes its own again)."""
        return node.params["use_input_stats"] and "running_mean" not in node.operands

    def pullback(self, node, grad, wanted):
        unsupported = wanted & {"running_mean", "running_var"}
        if unsupported:
            raise NotImplementedError(f"gradients of instance_norm's {sorted(unsupported)} are not derived")
        if node.fused and self._keeps_statistics(node):  # autograd's batch_norm kernel on N x C channels
            return fused_norm_pullback(node, grad, wanted, "instance_norm", statistics=("mean", "rstd"))
        if node.fused and node.params["use_input_stats"]:  # group_norm with one channel per group: its kernel
            return fused_norm_pullback(node, grad, wanted, "group_norm", num_groups=Size(node.operands["input"], 1))
        rank = len(node.shapes["input"])
        view = lambda value: op("channel_view", value, trailing=rank - 2)  # noqa: E731 - [C] -> [C, 1, ...]
        weight = view(node.operands["weight"]) if "weight" in node.operands else None
        if node.params["use_input_stats"]:
            grad_x, xhat = normalized_pullback(node, node.operands["input"], grad, tuple(range(2, rank)), weight)
        else:
            rstd = node.local(
                "rstd", (view(node.operands["running_var"]) + node.params["eps"]) ** sympy.Rational(-1, 2)
            )
            xhat = node.local("xhat", (node.operands["input"] - view(node.operands["running_mean"])) * rstd)
            grad_x = grad * weight * rstd if weight is not None else grad * rstd
        grads = self._affine_grads(node, grad, xhat, wanted, (0,) + tuple(range(2, rank)))
        if "input" in wanted:
            grads["input"] = grad_x
        return grads

    def table_row(self):
        return (
            self.op,
            "out = per-sample, per-channel (x - mean) / sqrt(var + eps) * weight + bias over space "
            "(use_input_stats: false: by running statistics)",
            "grad_x = rstd (ĝ - mean ĝ - x̂ mean(ĝ x̂)) over each sample's channel; running statistics: "
            "grad_x = grad * weight * rstd",
        )


RULES = [InstanceNorm()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "instance_norm": [
        Sample(
            "instance_norm-affine",
            {"x": [2, 3, 4, 3], "w": [3], "b": [3], "y": [2, 3, 4, 3]},
            [{"op": "instance_norm", "weight": "w", "bias": "b"}],
            ["x", "w", "b"],
        ),
        Sample(
            "instance_norm-3d",
            {"x": [2, 3, 2, 3, 2], "y": [2, 3, 2, 3, 2]},
            [{"op": "instance_norm", "eps": 0.001}],
            ["x"],
        ),
        Sample(
            "instance_norm-running-stats",
            {"x": [2, 3, 5], "m": [3], "v": [3], "w": [3], "y": [2, 3, 5]},
            [
                {"op": "softplus", "in": "v", "out": "positive_var"},
                {
                    "op": "instance_norm",
                    "in": "x",
                    "running_mean": "m",
                    "running_var": "positive_var",
                    "weight": "w",
                    "use_input_stats": False,
                },
            ],
            ["x", "w"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "instance_norm": [
        Spelling("nn.InstanceNorm2d(3, affine=True)", module=True),
        Spelling("F.instance_norm(x, eps=1e-3)"),
        Spelling("nn.InstanceNorm3d(2, track_running_stats=True)", {"x": (2, 2, 3, 4, 3)}, module=True),
        Spelling(
            "nn.InstanceNorm3d(2, affine=True, track_running_stats=True).eval()", {"x": (2, 2, 3, 4, 3)}, module=True
        ),
    ],
}
