"""``batch_norm``: per-channel normalisation over the batch and space in training mode (moving the
running statistics in place, as nn.BatchNorm does), or by the running statistics in eval mode, where it is
affine in x; the shared formula and helpers are ``norm.py``'s."""

from __future__ import annotations

import math

import sympy

from ..algebra import op, tensor
from .base import Checker, Forward, Operand, Param, Sample, Spelling, positive_number
from .norm import NATIVE_ORDER, Norm, check_per_channel, flag, momentum_param, normalized_pullback


class BatchNorm(Norm):
    op = "batch_norm"
    calls = ("batch_norm",)
    operand_roles = {"weight": "scale", "bias": "shift", "running_mean": "shift", "running_var": "variance"}
    operands = (
        Operand("input", from_in=True),
        Operand("running_mean", optional=True),
        Operand("running_var", optional=True),
        Operand("weight", optional=True),
        Operand("bias", optional=True),
    )
    params = {
        "training": Param(False, flag),
        "momentum": Param(0.1, momentum_param),
        "eps": Param(1e-5, positive_number),
    }
    summary = "per-channel normalisation over batch and space (training), or by running statistics (eval)"

    def elements_per_statistic(self, shapes, params):
        x = shapes["input"]  # training: each channel over the batch and space; eval uses stored statistics
        return math.prod([x[0], *x[2:]]) if params["training"] else None

    def infer_shape(self, shapes, params, check: Checker):
        x = shapes["input"]
        check.require(len(x) >= 2, "batch_norm needs [N, C, ...]", "pass a batched input")
        stats = "running_mean" in shapes and "running_var" in shapes
        check.require(
            stats or (params["training"] and "running_mean" not in shapes and "running_var" not in shapes),
            "batch_norm needs both running_mean and running_var in eval mode, and both or neither in "
            "training mode (where they are updated in place, as nn.BatchNorm does)",
            "give both running statistics, or (training: true) neither",
        )
        check_per_channel(shapes, x, check)
        return tuple(x)

    def running_statistics(self, node):
        if node.params["training"] and "running_mean" in node.operands:
            return "running_mean", "running_var", node.params["momentum"]
        return None

    def forward(self, node):
        updates = node.params["training"] and "running_mean" in node.operands
        names, params = self._forward_params(node, ("training", "momentum", "eps") if updates else ("training", "eps"))
        if updates:  # F.batch_norm moves the running statistics in place, as nn.BatchNorm's forward does
            params["momentum"] = 1 if node.params["momentum"] is None else node.params["momentum"]
        value = op("batch_norm", *(node.operands[name] for name in names), **params)
        if not (node.fused and node.params["training"]):
            return Forward(value)
        # the fused pullback reads the batch mean and 1 / std this kernel computes anyway (as autograd saves them)
        momentum = params.get("momentum", 0)
        present = tuple(name for name in NATIVE_ORDER if name in node.operands)
        native = node.local(
            "native",
            op(
                "native_batch_norm",
                *(node.operands[name] for name in present),
                operand_names=present,
                momentum=momentum,
                eps=node.params["eps"],
            ),
            note=f"{node.name} with the batch statistics its gradient reads",
        )
        node.local("batch_mean", op("item", native, index=1), note=f"{node.name}'s batch mean")
        node.local("batch_invstd", op("item", native, index=2), note=f"{node.name}'s batch 1 / std")
        return Forward(op("item", native, index=0), math=value)

    def pullback(self, node, grad, wanted):
        unsupported = wanted & {"running_mean", "running_var"}
        if unsupported:
            raise NotImplementedError(f"gradients of batch_norm's {sorted(unsupported)} are not derived")
        rank = len(node.shapes["input"])
        view = lambda value: op("channel_view", value, trailing=rank - 2)  # noqa: E731 - [C] -> [C, 1, ...]
        weight = view(node.operands["weight"]) if "weight" in node.operands else None
        sum_dims = (0,) + tuple(range(2, rank))
        if node.params["training"] and node.fused:
            return self._fused_pullback(node, grad, wanted)
        if node.params["training"]:
            grad_x, xhat = normalized_pullback(node, node.operands["input"], grad, sum_dims, weight)
        else:
            rstd = node.local(
                "rstd", (view(node.operands["running_var"]) + node.params["eps"]) ** sympy.Rational(-1, 2)
            )
            xhat = node.local("xhat", (node.operands["input"] - view(node.operands["running_mean"])) * rstd)
            grad_x = grad * weight * rstd if weight is not None else grad * rstd
        grads = self._affine_grads(node, grad, xhat, wanted, sum_dims)
        if "input" in wanted:
            grads["input"] = grad_x
        return grads

    def _fused_pullback(self, node, grad, wanted):
        """Training mode: every wanted gradient from one ``native_batch_norm_backward`` call (autograd's
        own kernel), the readable formula above in fewer passes over memory."""
        names = ("input", "weight", "bias")
        mask = tuple(name in wanted for name in names)
        weighted = "weight" in node.operands  # the batch statistics are named by forward() above
        operands = [
            grad,
            node.operands["input"],
            *([node.operands["weight"]] if weighted else []),
            tensor(f"batch_mean_{node.name}"),
            tensor(f"batch_invstd_{node.name}"),
        ]
        together = " and ".join(name for name in names if name in wanted)
        fused = node.local(
            "local",
            op("batch_norm_backward", *operands, eps=node.params["eps"], output_mask=mask, weighted=weighted),
            note=f"{node.name}'s {together} gradients in one native_batch_norm_backward call "
            "(autograd's own kernel, twice differentiable)",
        )
        return {name: op("item", fused, index=index) for index, name in enumerate(names) if name in wanted}

    def table_row(self):
        return (
            self.op,
            "training: per-channel (x - mean) / sqrt(var + eps) * weight + bias over N and space; "
            "eval: the same with running statistics",
            "training: grad_x = rstd (ĝ - mean ĝ - x̂ mean(ĝ x̂)); eval: grad_x = grad * weight * rstd",
        )


RULES = [BatchNorm()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "batch_norm": [
        Sample(
            "batch_norm-training",
            {"x": [4, 3, 2, 3], "w": [3], "b": [3], "y": [4, 3, 2, 3]},
            [{"op": "batch_norm", "weight": "w", "bias": "b", "training": True}],
            ["x", "w", "b"],
        ),
        # the running variance through softplus: a variance is positive
        Sample(
            "batch_norm-eval",
            {"x": [4, 3, 5], "m": [3], "v": [3], "w": [3], "y": [4, 3, 5]},
            [
                {"op": "softplus", "in": "v", "out": "positive_var"},
                {"op": "batch_norm", "in": "x", "running_mean": "m", "running_var": "positive_var", "weight": "w"},
            ],
            ["x", "w"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "batch_norm": [
        Spelling("nn.BatchNorm2d(3)", module=True),
        Spelling("nn.BatchNorm2d(3).eval()", module=True),
        Spelling("nn.BatchNorm1d(3)", {"x": (4, 3)}, module=True),
    ],
}
