"""What each input tensor is, read off the graph: the op that consumes it and as which operand.

The roles decide how test inputs are drawn (``symgrad.testdata.make_inputs``), and the same graph
walk finds the gradients that are zero by structure, so the generated test can check that they are
zero instead of dividing rounding noise by rounding noise.
"""

from __future__ import annotations

from .graph import Graph

RELU_LIKE = frozenset({"relu", "leaky_relu", "relu6", "elu", "gelu", "silu", "hardtanh"})
"""Activations after which He's gain sqrt(2) keeps the activations' scale (half the inputs are cut)."""

NORMALISATIONS = frozenset({"batch_norm", "layer_norm", "group_norm"})


def _fan_in_axes(op: str, rank: int) -> list[int]:
    """Axes of the weight whose product is the number of terms each output sums (nn.init's fan_in)."""
    if op.startswith("conv_transpose"):
        return [0, *range(2, rank)]  # [C_in, C_out/groups, kernel...]: every input channel reaches each output
    return [1, *range(2, rank)]  # conv [C_out, C_in/groups, kernel...], linear [out, in]


def input_roles(graph: Graph) -> dict[str, list]:
    """{input name: [role, gain, fan_in_axes]} for the inputs whose role is not plain data."""
    roles: dict[str, list] = {}
    for node in graph.nodes.values():
        if node.kind == "input" or node.rule is None:
            continue
        op = node.rule.op
        for operand, source in node.operands.items():
            if source in roles or graph.nodes[source].kind != "input" or graph.nodes[source].dtype == "int64":
                continue
            role = None
            if operand == "weight" and op in NORMALISATIONS:
                role = ["scale", 1.0, []]
            elif operand == "weight" and (op.startswith("conv") or op == "linear"):
                activated = any(consumer.rule.op in RELU_LIKE for consumer, _ in graph.consumers(node.name)
                                if consumer.rule is not None)
                role = ["weight", 2 ** 0.5 if activated else 1.0, _fan_in_axes(op, len(graph.nodes[source].shape))]
            elif operand in ("bias", "running_mean"):
                role = ["shift", 1.0, []]
            elif operand == "running_var":
                role = ["variance", 1.0, []]
            if role is not None:
                roles[source] = role
    return roles


def zero_by_structure(graph: Graph) -> dict[str, str]:
    """{input: why} for differentiated inputs whose gradient is exactly zero whatever the data: a
    layer's bias when the layer feeds only training-mode batch_norm, which subtracts each channel's
    batch mean, so a per-channel constant cancels."""
    zero = {}
    for node in graph.nodes.values():
        bias = node.operands.get("bias")
        if node.kind != "layer" or bias is None or bias not in graph.wrt or graph.nodes[bias].kind != "input":
            continue
        if not (node.rule.op.startswith("conv") or node.rule.op == "linear"):
            continue
        consumers = graph.consumers(node.name)
        if consumers and all(consumer.rule.op == "batch_norm" and consumer.params.get("training") and operand == "input"
                             for consumer, operand in consumers):
            if sum(1 for other in graph.nodes.values() if bias in other.operands.values()) > 1:
                continue  # the bias is used elsewhere too
            norms = ", ".join(consumer.name for consumer, _ in consumers)
            zero[bias] = (f"{bias} is the bias of {node.name}, which feeds only training-mode batch_norm ({norms}); "
                          "that subtracts each channel's batch mean, so the bias cancels and its gradient is zero "
                          "(fix: drop the bias, as nn.Conv2d(..., bias=False) before BatchNorm2d does)")
    return zero
