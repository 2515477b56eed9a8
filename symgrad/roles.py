"""What each input tensor is, read off the graph: the op that consumes it and as which operand.

The roles decide how test inputs are drawn (``symgrad.testdata.make_inputs``), and the same graph
walk finds the gradients that are zero by structure, so the generated test can check that they are
zero instead of dividing rounding noise by rounding noise.
"""

from __future__ import annotations

from .graph import Graph


def input_roles(graph: Graph) -> dict[str, list]:
    """{input name: [role, gain, fan_in_axes]} for the inputs whose role is not plain data, as the rule
    of the op that first reads each declares it (``Rule.operand_roles``)."""
    roles: dict[str, list] = {}
    for node in graph.nodes.values():
        if node.kind == "input" or node.rule is None:
            continue
        for operand, source in node.operands.items():
            role = node.rule.operand_roles.get(operand)
            if role is None or source in roles or graph.nodes[source].kind != "input" \
                    or graph.nodes[source].dtype == "int64":
                continue
            if role == "weight":
                gain = max((consumer.rule.activation_gain for consumer, _ in graph.consumers(node.name)
                            if consumer.rule is not None), default=1.0)
                roles[source] = [role, gain, node.rule.fan_in_axes(len(graph.nodes[source].shape))]
            else:
                roles[source] = [role, 1.0, []]
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
        if node.rule.operand_roles.get("weight") != "weight":
            continue  # not a convolution or linear layer
        consumers = graph.consumers(node.name)
        if consumers and all(consumer.rule.op == "batch_norm" and consumer.params.get("training") and operand == "input"
                             for consumer, operand in consumers):
            if len({other.name for other, _ in graph.consumers(bias)}) > 1:
                continue  # the bias is used elsewhere too
            norms = ", ".join(consumer.name for consumer, _ in consumers)
            zero[bias] = (f"{bias} is the bias of {node.name}, which feeds only training-mode batch_norm ({norms}); "
                          "that subtracts each channel's batch mean, so the bias cancels and its gradient is zero "
                          "(fix: drop the bias, as nn.Conv2d(..., bias=False) before BatchNorm2d does)")
    return zero


CHANNELS_LAST_MIN_POSITIONS = 16384
"""Batch x height x width a 2-d convolution's input needs (in the spec's shapes) before the generated
code runs it in channels_last. Measured (BENCHMARKS.md): at the seeds' 8 x 128 x 128 `gradients` runs
at 1.00-1.12x autograd with 0.81x its memory in that layout. Below the threshold
the default layout is kept, so small nets run the kernels autograd runs on default-layout inputs and
agree with it at ReLU kinks to the last bit (the two layouts' kernels sum in different orders, and a
pre-activation that cancels to exactly zero in one may not in the other)."""


def channels_last_inputs(graph, min_positions: int | None = None) -> list[str]:
    """The convolution weights the generated gradient functions move to channels_last.

    oneDNN (CPU) and cuDNN run 2-d convolutions with several input channels faster in channels_last,
    and PyTorch runs a convolution in that layout when its input *or its weight* is in it: so moving
    the (small) weights is enough. Every activation after the first convolution is then channels_last,
    the caller's input is read as it is (no copy of it is held), and each gradient goes back to its
    caller's layout on return. Every torch op the rules emit is layout-agnostic in value (none is a
    ``.view``), so the layout changes speed, memory and rounding only. Chosen when the chain has such
    a convolution on at least ``min_positions`` (default :data:`CHANNELS_LAST_MIN_POSITIONS`) positions.
    """
    if min_positions is None:
        min_positions = CHANNELS_LAST_MIN_POSITIONS

    def two_d_convolution(node) -> bool:
        return node.kind == "layer" and node.rule.op in ("conv2d", "conv_transpose2d") and \
            len(graph.nodes[node.operands["input"]].shape) == 4  # an unbatched input has no channels_last layout

    def pays(node) -> bool:  # with one input channel both layouts are the same
        batch, channels, height, width = (int(size) for size in graph.nodes[node.operands["input"]].shape)
        return channels > 1 and batch * height * width >= min_positions

    convolutions = [node for node in graph.nodes.values() if two_d_convolution(node)]
    if not any(pays(node) for node in convolutions):
        return []
    weights = {node.operands["weight"] for node in convolutions}
    return [node.name for node in graph.inputs if node.name in weights]
