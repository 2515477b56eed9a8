"""What each input tensor is, read off the graph: the op that consumes it and as which operand.

The roles decide how test inputs are drawn (``symgrad.testdata.make_inputs``), and the same graph
walk finds the gradients that are zero by structure, so the generated test can check that they are
zero instead of dividing rounding noise by rounding noise.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch

from .graph import Graph
from .reference import reference_values, seeded
from .testdata import make_inputs, memory_shortfall, moved_one_ulp, value_sums


def input_roles(graph: Graph) -> dict[str, list]:
    """{input name: [role, gain, fan_in_axes]} for the inputs whose role is not plain data, as the rule
    of the op that first reads each declares it (``Rule.operand_roles``)."""
    roles: dict[str, list] = {}
    for node in graph.nodes.values():
        if node.kind == "input" or node.rule is None:
            continue
        for operand, source in node.operands.items():
            role = node.rule.operand_roles.get(operand)
            if (
                role is None
                or source in roles
                or graph.nodes[source].kind != "input"
                or graph.nodes[source].dtype == "int64"
            ):
                continue
            if role == "weight":
                gain = max(
                    (
                        consumer.rule.activation_gain
                        for consumer, _ in graph.consumers(node.name)
                        if consumer.rule is not None
                    ),
                    default=1.0,
                )
                roles[source] = [role, gain, node.rule.fan_in_axes(len(graph.nodes[source].shape))]
            else:
                roles[source] = [role, 1.0, []]
    return roles


def graph_inputs(graph: Graph, shapes: dict[str, tuple[int, ...]], dtype=torch.float64, seed: int = 0):
    """The inputs ``verify`` and the generated test use: drawn by the roles the graph gives them."""
    return make_inputs(shapes, input_roles(graph), graph.wrt, dtype, seed, graph.class_counts(shapes))


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
        if consumers and all(
            consumer.rule.op == "batch_norm" and consumer.params.get("training") and operand == "input"
            for consumer, operand in consumers
        ):
            if len({other.name for other, _ in graph.consumers(bias)}) > 1:
                continue  # the bias is used elsewhere too
            norms = ", ".join(consumer.name for consumer, _ in consumers)
            zero[bias] = (
                f"{bias} is the bias of {node.name}, which feeds only training-mode batch_norm ({norms}); "
                "that subtracts each channel's batch mean, so the bias cancels and its gradient is zero "
                "(fix: drop the bias, as nn.Conv2d(..., bias=False) before BatchNorm2d does)"
            )
    return zero


def running_statistics(graph) -> list[tuple[str, str, str]]:
    """(running_mean, running_var, momentum as Python source) of each layer whose forward moves
    running statistics in place."""
    found = []
    for node in graph.nodes.values():
        declared = node.rule.running_statistics(graph.symbols(node)) if node.kind == "layer" else None
        if declared:
            mean, var, momentum = declared
            found.append(
                (node.operands[mean], node.operands[var], "None" if momentum is None else repr(float(momentum)))
            )
    return found


def class_table(graph, shapes) -> list[tuple[dict[str, list[int]], dict[str, int]]]:
    """(shape set, class counts of the int64 inputs) for every shape set the generated test uses;
    empty when the spec has no int64 input."""
    if not any(node.dtype == "int64" for node in graph.inputs):
        return []
    shape_sets = list(shapes) + [{node.name: tuple(node.shape) for node in graph.inputs}]
    return [
        ({name: list(shape) for name, shape in sorted(shape_set.items())}, graph.class_counts(shape_set))
        for shape_set in shape_sets
    ]


CHANNELS_LAST_MIN_POSITIONS = 16384
"""Batch x height x width the 2-d convolutions' inputs need (averaged by weight size) before the
generated code runs them in channels_last. Measured (BENCHMARKS.md): at the seeds' 8 x 128 x 128
`gradients` runs at 1.00-1.12x autograd with 0.81x its memory in that layout; ResNet-18 at
8 x 112² (average 511) runs slower in it, the weights' moves costing more than the layout
gains (benchmarks/gradients.py). Below the threshold the default layout is kept, so small nets run
the kernels autograd runs on default-layout inputs and agree with it at ReLU kinks to the last bit
(the two layouts' kernels sum in different orders, and a pre-activation that cancels to exactly
zero in one may not in the other). ``sys.maxsize`` turns the layout off:
the generated code then has no layout code at all."""


THRESHOLD_NAME = "CHANNELS_LAST_FROM"
"""The generated module's constant holding :attr:`ChannelsLastRule.threshold`, named once."""


@dataclass(frozen=True)
class ChannelsLastRule:
    """When the generated gradient functions run the 2-d convolutions in channels_last.

    Decided per call, from the call's own shapes: a net traced at 32 x 32 and trained at 224 x 224
    gets the layout that pays at 224 x 224. The test is on one 4-d data input, ``reference``: its
    batch x height x width at least ``threshold``, the value at which the convolutions' positions,
    averaged by their weights' sizes (:func:`_weighted_positions`), reach
    :data:`CHANNELS_LAST_MIN_POSITIONS` when every size scales with the input's
    (as they do through convolutions, pooling and resampling). Without such an input (``reference``
    None) the choice is the spec's shapes', fixed (``threshold`` 0: always, else never emitted).

    On a GPU the layout pays only where a convolution it moves reads a value computed inside
    (``on_gpu``): where each one reads a caller's tensor, cuDNN copies that tensor to channels_last
    inside each convolution that reads it and nothing after it is paid back (seed 2 on an H100:
    0.60 ms and 50.6 MiB in channels_last, 0.51 ms and 34.6 MiB, autograd's own peak, in the default
    layout; seed 3, whose second convolution reads the ReLU's output, the other way: 0.87 ms and
    50.6 MiB against 0.91 ms and 71.9 MiB; benchmarks/results/trials-cuda.md). Where it does not pay
    on a GPU the test asks for a CPU tensor first."""

    weights: tuple[str, ...]
    reference: str | None
    threshold: int
    on_gpu: bool = True
    min_positions: int = CHANNELS_LAST_MIN_POSITIONS

    def test(self) -> str | None:
        """The condition the generated code evaluates, or None where the layout is fixed; it reads
        ``threshold`` as the module's constant :data:`THRESHOLD_NAME`."""
        if self.reference is None:
            return None
        x = self.reference
        size = f"{x}.shape[0] * {x}.shape[2:].numel() >= {THRESHOLD_NAME}"
        return size if self.on_gpu else f"{x}.is_cpu and {size}"

    def holds(self, shapes: dict) -> bool:
        """Whether the generated code runs channels_last for inputs of these shapes, on a CPU."""
        if self.reference is None:
            return True
        batch, _, height, width = (int(size) for size in shapes[self.reference])
        return batch * height * width >= self.threshold


def _positions(shape) -> int:
    batch, _, height, width = (int(size) for size in shape)
    return batch * height * width


def _weighted_positions(graph, convolutions) -> float:
    """The convolutions' input positions (batch x height x width), averaged with their weights'
    sizes as weights: what moving the weights costs (each is transposed on the way in and its
    gradient on the way out) grows with its size, and what channels_last gains on it with its
    positions too, so the layout pays where this average is large. ResNet-18 at 8 x 112²: the stem
    has 100352 positions but 9408 weights; layer4 128 positions and 8.4M weights; the average 511."""
    total = sum(_size(graph.nodes[node.operands["weight"]].shape) for node in convolutions)
    return (
        sum(
            _size(graph.nodes[node.operands["weight"]].shape) * _positions(graph.nodes[node.operands["input"]].shape)
            for node in convolutions
        )
        / total
    )


def _size(shape) -> int:
    size = 1
    for length in shape:
        size *= int(length)
    return size


FEWEST_CHANNELS_STRIDED_1X1 = 16
"""The input channels a strided 1x1 convolution needs before the layout is chosen: PyTorch 2.13's CPU
backward of a 1x1 stride-2 convolution in channels_last aborts the process with fewer (float32;
8 x 4 x 64² with 4 -> 6, 8 -> 16 or 12 -> 12 channels dies, 16 -> 8 does not; autograd on a
channels_last model dies alike), so a toy ResNet's downsample keeps the default layout."""


def _crashes_in_channels_last(graph, node) -> bool:
    """``node`` (a 2-d convolution) is a strided 1x1 one with fewer than
    :data:`FEWEST_CHANNELS_STRIDED_1X1` input channels: its CPU backward may abort in channels_last."""
    weight = graph.nodes[node.operands["weight"]].shape
    return (
        node.rule.op == "conv2d"
        and tuple(int(length) for length in weight[2:]) == (1, 1)
        and any(int(step) > 1 for step in node.params["stride"])
        and int(graph.nodes[node.operands["input"]].shape[1]) < FEWEST_CHANNELS_STRIDED_1X1
    )


def channels_last_rule(graph, min_positions: int | None = None) -> ChannelsLastRule | None:
    """The convolution weights the generated gradient functions move to channels_last, and when.

    oneDNN (CPU) and cuDNN run 2-d convolutions with several input channels faster in channels_last
    on large enough inputs, and PyTorch runs a convolution in that layout when its input *or its
    weight* is in it: so moving the (small) weights is enough. Every activation after the first
    convolution is then channels_last, the caller's input is read as it is (no copy of it is held),
    and each gradient goes back to its caller's layout on return. Every torch op the rules emit is
    layout-agnostic in value (none is a ``.view``), so the layout changes speed, memory and rounding
    only. None where no 2-d convolution has several input channels, or the threshold is
    ``sys.maxsize``; see :class:`ChannelsLastRule` for when it applies.
    """
    if min_positions is None:
        min_positions = CHANNELS_LAST_MIN_POSITIONS
    if min_positions >= sys.maxsize:
        return None

    def two_d_convolution(node) -> bool:
        return (
            node.kind == "layer"
            and node.rule.op in ("conv2d", "conv_transpose2d")
            and len(graph.nodes[node.operands["input"]].shape) == 4
        )  # an unbatched input has no channels_last layout

    convolutions = [node for node in graph.nodes.values() if two_d_convolution(node)]
    if any(_crashes_in_channels_last(graph, node) for node in convolutions):
        return None
    # with one input channel both layouts are the same
    candidates = [node for node in convolutions if int(graph.nodes[node.operands["input"]].shape[1]) > 1]
    if not candidates:
        return None
    weights = {node.operands["weight"] for node in convolutions}
    moved = tuple(node.name for node in graph.inputs if node.name in weights)
    most = _weighted_positions(graph, convolutions)
    # the data: not a model's parameter or buffer (BiT's standardised 3x3 weights reach their convolutions
    # through a reshape, and may have more positions than a small image)
    sourced = {entry.name for entry in graph.spec.inputs if entry.source}
    data = [
        node
        for node in graph.inputs
        if len(node.shape) == 4
        and node.dtype != "int64"
        and node.name not in weights
        and node.name not in sourced
        and _positions(node.shape) > 0
    ]
    if not data:  # fixed by the spec's shapes
        return ChannelsLastRule(moved, None, 0) if most >= min_positions else None
    reference = max(data, key=lambda node: _positions(node.shape))  # the first of the largest
    threshold = math.ceil(min_positions * _positions(reference.shape) / most)
    inputs = {node.name for node in graph.inputs}
    on_gpu = any(node.operands["input"] not in inputs for node in candidates)
    return ChannelsLastRule(moved, reference.name, max(threshold, 1), on_gpu, min_positions)


def channels_last_inputs(graph, min_positions: int | None = None, shapes: dict | None = None) -> list[str]:
    """The weights the generated gradient functions move to channels_last for inputs of ``shapes``
    (default: the spec's), by :func:`channels_last_rule`."""
    rule = channels_last_rule(graph, min_positions)
    if rule is None:
        return []
    if shapes is None:
        shapes = {node.name: node.shape for node in graph.inputs}
    return list(rule.weights) if rule.holds(shapes) else []


def channels_last_constant(graph) -> dict | None:
    """What the generated module's :data:`THRESHOLD_NAME` constant says: its value, the input
    whose sizes the test reads and the positions it stands for (None: no test)."""
    rule = channels_last_rule(graph)
    if rule is None or rule.reference is None:
        return None
    return dict(name=THRESHOLD_NAME, value=rule.threshold, reference=rule.reference, positions=rule.min_positions)


def test_facts(graph, small_shapes: list[dict[str, tuple[int, ...]]]) -> dict:
    """What a module's generated tests are written from, decided while planning (the test file's
    renderer only prints them): ``graph``'s spec with every block written out, ``small_shapes`` its
    test shapes."""
    import math

    return dict(
        name=graph.spec.name,
        wrt=list(graph.wrt),
        spec_shapes={node.name: tuple(node.shape) for node in graph.inputs},
        spec_entries=sum(math.prod(node.shape) for node in graph.nodes.values()),  # as check.require_memory counts
        channels_last_at_spec=channels_last_inputs(graph),
        small_shapes=small_shapes,
        roles=input_roles(graph),
        moved=sorted({name for mean, var, _ in running_statistics(graph) for name in (mean, var)}),
        zero_by_structure=zero_by_structure(graph),
        classes=class_table(graph, small_shapes),
        outputs=graph.spec.outputs is not None,
        reference_sums=reference_sums(graph, small_shapes[0]) if small_shapes else None,
        random=any(getattr(node.rule, "random", False) for node in graph.nodes.values() if node.rule is not None),
    )


def reference_sums(graph, shapes: dict[str, tuple[int, ...]]) -> str:
    """``REFERENCE_SUMS`` of the generated test: :func:`symgrad.testdata.value_sums` of the spec's results
    (its loss, or each output) at ``shapes``, from the test's inputs (``inputs_for(..., seed=1)``, torch's
    seed 0), computed op by op by PyTorch's own functions (``reference.reference_values``: not the generated
    code); each number to 10 digits, which the last bits of another machine's float64 do not reach. A
    result whose sums move further than that when the inputs move by one ulp (rounding noise amplified),
    every result of a spec with random masks (the reference draws them in graph order, the module
    where its blocks run), and every result at shapes too large for this machine's memory (the estimate
    of ``check.require_memory``), is None: checked against the module's own values alone."""

    nodes = graph.spec.outputs.nodes if graph.spec.outputs is not None else ("loss",)
    if any(getattr(node.rule, "random", False) for node in graph.nodes.values() if node.rule is not None):
        return "[" + ", ".join("None" for _ in nodes) + "]"  # the reference draws its masks in graph order
    at_shapes = graph.with_input_shapes(shapes)
    entries = sum(math.prod(node.shape) for node in at_shapes.nodes.values())  # as check.require_memory counts
    if memory_shortfall(graph.spec.name, "the float64 test shapes", entries, 8):  # the test skips there too
        return "[" + ", ".join("None" for _ in nodes) + "]"  # and --verify refuses in one line
    inputs = graph_inputs(graph, dict(sorted(shapes.items())), seed=1)  # drawn in the test's order (tojson sorts)

    def results(values):
        with torch.no_grad():
            return [reference_values(at_shapes, values)[node] for node in nodes]

    runs = [value_sums(seeded(results, each)) for each in (inputs, moved_one_ulp(inputs, 1), moved_one_ulp(inputs, 2))]
    rows = []
    for index, row in enumerate(runs[0]):
        finite = all(math.isfinite(value) for value in row)
        spread = (
            max(
                abs(run[index][position] - value) / (max(abs(value), 1e-300) if position % 2 == 0 else 1.0)
                for run in runs[1:]
                for position, value in enumerate(row)
            )
            if finite
            else math.inf
        )
        rows.append(
            "["
            + ", ".join(
                f"{value:.10g}" if position % 2 == 0 else f"{round(value, 10) + 0.0:.10f}"
                for position, value in enumerate(row)
            )
            + "]"
            if spread <= 1e-13
            else "None"
        )
    return "[" + ", ".join(rows) + "]"
