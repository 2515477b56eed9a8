"""A grouped convolution's weight and bias gradients at the end of the backward (issue 65 item 2).

oneDNN computes a grouped convolution's weight gradient in channels_last (the kernel autograd's
``convolution_backward`` calls on a CPU) into a buffer padded to 16 x 16 channels per group: a depthwise
7 x 7 convolution of 256 channels allocates 256 x 16 x 16 x 49 float32 (12.25 MiB; 18.7 under bfloat16
autocast) for a 50 KiB gradient, whatever the batch and image size, and frees it when the call returns.
Autograd's engine runs that call where its backward begins, beside everything its forward kept: the
ConvNeXt of ``benchmarks.keep_policy`` (ConvNeXt-T depths, width 32, 4 x 112², float32) peaks at 41.9 MiB
in channels_last against 30.6 in the default layout, 11.3 MiB of it that buffer (the allocator's live
bytes, measured with ``torch.profiler``'s memory events, move with the resident set).

:func:`late_grouped_weight_grads` splits each such call in two calls of the same kernel: the input's
gradient where it was (``output_mask`` input alone), the weight's and bias's (``output_mask`` without the
input) at the end of the backward, where what the forward kept is freed; the gradient output and the
input it reads are held until then (at ConvNeXt's last stages 36-100 KiB each), the first layers' calls
first (:func:`_last_made_first`). The same kernel on the same operands: bit for bit autograd's (oneDNN runs
input and weight gradients as separate primitives). Only where what a call would hold is small
(:data:`HELD_SHARE`). Measured on that ConvNeXt traced flat (its last two stages' calls move),
channels_last, peak RSS growth of a step: float32 ``--keep all`` 33.5 -> 22.8 MiB, lean 30.5 -> 20.1
(autograd's default layout 30.8); bfloat16 autocast 25.1 -> 13.0, lean 25.5 -> 13.9 (with ab0d1be); the
default layout as before. In a block's function (``trace(..., blocks=True)``, the CLI's default) the end
is the block function's: a ConvNeXt block's depthwise convolution is its first node, so nothing moves.

At the end that buffer is the peak (bfloat16 autocast: 18.7 MiB beside 13 MiB of growth in all). A late
call of 128 groups or more is :data:`CHUNKED`: its helper runs a depthwise k x k (k >= 5) convolution's
weight gradient in channels_last as calls of 64 channels or a few more (64 x ceil(threads / 64)), on
slices of the input and output gradient copied in channels_last, each with a buffer c/C of the whole's;
oneDNN gives each group of a call with at least as many groups as threads one thread, so each channel's
sum is the one call's, bit for bit (checked at 1-16 threads, float32, bfloat16 and under autocast, 16-768
channels, 3 x 3, 5 x 5 and 7 x 7, stride 1 and 2, batch 1-8, sizes 3-56; fewer groups than threads, 4 at
8 threads, are not). Not a 3 x 3 (oneDNN's depthwise kernel splits its sums by channel blocks and batch
there: chunks of it differ in the last bits) nor the default layout (no such buffer). The same ConvNeXt,
bf16 autocast, channels_last, peak RSS growth (``benchmarks.keep_policy --networks convnext
--precisions AMP --layouts channels_last``, two runs each at 7371b61 and with this): ``--keep all``
13.2-13.8 -> 8.2-8.3 MiB, lean 12.7-13.6 -> 7.8-7.9 (autograd's default layout 14.4-15.2: 0.57x, 0.54x),
0.94-0.95x autograd's channels_last speed (0.94-0.98x before; calls of 32: the same peak at 0.85-0.89x);
float32 and the default layout as before (22.6 / 20.1 MiB).
"""

from __future__ import annotations

import dataclasses
import math

from .algebra import PRIMITIVES, Params, TensorOp, primitive, tensor
from .reverse import Statement

CHUNKED = "grouped_weight_backward"
"""The late call's primitive where it may run in chunks of channels (:data:`CHUNKED_HELPER`)."""

CHUNKED_HELPER = '''def _grouped_weight_backward(grad_output, input, weight, output_mask, groups=1, bias_sizes=None,
                             **options):
    """``_convolution_backward`` of a depthwise convolution's weight and bias gradients
    (``output_mask`` without the input's) in calls of at least 64 channels and as many as threads:
    oneDNN's channels_last kernel of a k x k one (k >= 5) pads each group to 16 x 16 channels,
    C x 256 x k² floats of scratch (18.7 MiB at C = 256, k = 7, under bfloat16 autocast), a call of
    c channels c/C of it. Each channel's gradient is the same sum in each call while a call has at
    least as many groups as threads (each group one thread's, the batch never split between
    threads): bit for bit one call's. Compiled: one call (a graph would fix the thread count)."""
    copy, dtype = input if isinstance(input, tuple) else (input, None)
    chunk = 0 if torch.compiler.is_compiling() else 64 * -(-torch.get_num_threads() // 64)
    if (not chunk or output_mask[0] or groups < 2 * chunk or options.get("transposed")
            or weight.dim() != 4 or tuple(weight.shape[:2]) != (groups, 1)
            or weight.shape[2] * weight.shape[3] < 25 or copy.device.type != "cpu"
            or copy.dtype == torch.float64 or copy.is_contiguous()
            or not copy.is_contiguous(memory_format=torch.channels_last)):
        return _convolution_backward(grad_output, input, weight, output_mask, groups=groups,
                                     bias_sizes=bias_sizes, **options)
    count = groups // chunk  # calls of equal size or one more, each at least chunk groups
    bounds = [index * groups // count for index in range(count + 1)]
    parts = []
    for start, stop in zip(bounds, bounds[1:]):
        grad, part = (value[:, start:stop].contiguous(memory_format=torch.channels_last)
                      for value in (grad_output, copy))
        sizes = None if bias_sizes is None else [stop - start]
        parts.append(_convolution_backward(
            grad, part if dtype is None else (part, dtype), weight[start:stop], output_mask,
            groups=stop - start, bias_sizes=sizes, **options))
    return (None, *(torch.cat([grads[index] for grads in parts]) if output_mask[index] else None
                    for index in (1, 2)))
'''
"""Emitted into a module with a late call of a grouped convolution of 128 groups or more (it calls
``_convolution_backward``, whose helper the same backward's input-gradient call brings)."""


def _chunked_code(operands, params, show):
    return "_grouped_weight_backward" + PRIMITIVES["conv_backward"].code(operands, params, show).removeprefix(
        "_convolution_backward"
    )


def _chunked_latex(operands, params, show):
    return PRIMITIVES["conv_backward"].latex(operands, params, show)


primitive(
    CHUNKED,
    code=_chunked_code,
    latex=_chunked_latex,
    helper=CHUNKED_HELPER,
    outputs=3,
    autocast_operands=(1,),
    fresh=True,
)

HELD_SHARE = 1 / 6
"""A call moves only where what it then holds to the end (its input and output gradient, at the traced
sizes) is at most this share of the graph's largest value: ConvNeXt-T's last two stages (1/16 and 1/8 of
its largest value, the first stage's expanded fc1 output), whose buffers are the large ones, not its first
two (1/4, 1/2), whose buffers are small (3.1, 1.5 MiB) and operands large; no EfficientNet-B0 stage
(31-75 %): its backward peaks late, at its widest layer, where operands held for the layers after it
(5.9 MiB at 8 x 112²) grew its lean step's peak 29.7 -> 35.1 MiB when every call moved."""


def _elements(node) -> int | None:
    shape = getattr(node, "shape", None)
    if not shape or not all(isinstance(size, int) for size in shape):
        return None
    return math.prod(shape)


def _small_enough(graph, node_name: str) -> bool:
    """Whether the convolution ``node_name``'s input and output (at ``graph``'s traced sizes) are at most
    :data:`HELD_SHARE` of its largest layer output (the batch and image size scale them alike, not the
    weights); True without a graph (a block's body: its end is near). A top body of a program with blocks
    (``body_graphs.top_sizes``) is judged beside the network's largest value, which its calls hide."""
    if graph is None:
        return True
    node = graph.nodes.get(node_name)
    operands = getattr(node, "operands", {})
    held = [_elements(node), _elements(graph.nodes.get(operands.get("input")))]
    layers = (layer for layer in graph.nodes.values() if layer.kind == "layer")  # not a weight: none grows
    largest = getattr(graph, "largest", None) or max(
        (size for size in map(_elements, layers) if size is not None), default=None
    )
    return None in held or largest is None or sum(held) <= HELD_SHARE * largest


def _is_item_of(statement: Statement, symbols: set) -> bool:
    value = statement.value
    return isinstance(value, TensorOp) and value.primitive.name == "item" and value.operands[0] in symbols


def _grouped_call(statement: Statement) -> bool:
    """A ``convolution_backward`` call of a grouped convolution wanting its input's and weight's gradients."""
    value = statement.value
    if not isinstance(value, TensorOp) or value.primitive.name != "conv_backward":
        return False
    mask = tuple(value.params["output_mask"])
    return value.params["groups"] != 1 and mask[0] and mask[1]


def _with_mask(value: TensorOp, mask: tuple, kind=None) -> TensorOp:
    params = Params(tuple((key, mask if key == "output_mask" else entry) for key, entry in value.params.items()))
    return TensorOp(kind or value.args[0], params, *value.operands)


def _late_kind(value: TensorOp):
    """The late call's primitive: in chunks of channels (:data:`CHUNKED`) where it may have 128 groups
    or more (a size read at run time: maybe), as it was where it has fewer (its helper's one call)."""
    groups = value.params["groups"]
    return value.args[0] if getattr(groups, "is_number", isinstance(groups, int)) and groups < 128 else CHUNKED


def late_grouped_weight_grads(backward: list[Statement], graph=None) -> list[Statement]:
    """``backward`` with each grouped convolution's ``convolution_backward`` call split: its input's
    gradient in place, its weight's and bias's (and every statement reading them, in their order) moved
    to the end. Not where the backward makes the convolution's input itself (``--keep lean``'s values
    made again, an activation computed again): holding that to the end is what its policy chose not to
    do; nor where it would hold much (:data:`HELD_SHARE`, from ``graph``'s traced sizes: the top body's)."""
    taken = {statement.target.name for statement in backward}
    made = {statement.target for statement in backward}  # a value made again here is not held to the end
    late: list[Statement] = []
    late_symbols: set = set()
    renamed: dict = {}  # a split call's symbol: the late call's
    result = []
    for statement in backward:
        value = statement.value
        if _grouped_call(statement) and value.operands[1] not in made and _small_enough(graph, statement.node):
            mask = tuple(value.params["output_mask"])
            name = f"{statement.target.name}_late"
            while name in taken:
                name += "_"
            taken.add(name)
            renamed[statement.target] = tensor(name)
            result.append(dataclasses.replace(statement, value=_with_mask(value, (True, False, False))))
            late.append(
                dataclasses.replace(
                    statement, target=tensor(name), value=_with_mask(value, (False, *mask[1:]), _late_kind(value))
                )
            )
            late_symbols.add(tensor(name))
            continue
        if _is_item_of(statement, set(renamed)) and value.params["index"] != 0:
            statement = dataclasses.replace(
                statement, value=TensorOp(value.args[0], value.params, renamed[value.operands[0]], *value.operands[1:])
            )
        if statement.value.free_symbols & late_symbols:
            late.append(statement)
            late_symbols.add(statement.target)
            continue
        result.append(statement)
    return result + _last_made_first(late, set(renamed.values()))


def _last_made_first(late: list[Statement], calls: set) -> list[Statement]:
    """``late`` with the calls (each followed by the items that read it alone) in the forward's order,
    the other statements after them: the first layers' calls, whose operands are the largest and whose
    buffers the smallest (fewest channels), free those operands before the last layers' largest buffers
    (ConvNeXt under bf16 autocast: 2.7 MiB of held operands freed before the 18.7 MiB buffer)."""
    units: dict = {}
    rest = []
    for statement in late:
        if statement.target in calls:
            units[statement.target] = [statement]
        elif _is_item_of(statement, calls) and statement.value.free_symbols & calls <= {statement.value.operands[0]}:
            units[statement.value.operands[0]].append(statement)
        else:
            rest.append(statement)
    return [statement for unit in reversed(units.values()) for statement in unit] + rest
