"""Per-op trace hooks: the ops whose calls need more than binding PyTorch's arguments to the rule's.

Each hook, ``hook(builder, op, bound, call)``, is registered for its rule's ops with ``dispatch.op_hook``
(as are ``embedding``'s, ``loss_tail.log_softmax`` and ``attention``'s) and called with the call's
arguments bound by PyTorch's names; an op without a hook becomes ``builder.layer(op, bound, call)``.
An op that names no rule (a renamed or removed op), or one hooked twice, fails at import.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from . import sizes
from .dataflow import Problem, is_int, is_number, literal
from .dispatch import op_hook

if TYPE_CHECKING:
    from .dispatch import Builder
    from .recorder import Call


@op_hook("batch_norm")
def batch_norm(builder: Builder, op: str, bound: dict, call: Call) -> None:
    training = bool(bound.get("training"))
    # nn.BatchNorm's momentum=None passes 1 / num_batches_tracked, a count that grows: the spec says null
    cumulative = training and getattr(builder.module(call.module), "momentum", 0.1) is None
    if not training or cumulative or bound.get("running_mean") is None:
        bound.pop("momentum", None)
    if not training and bound.get("running_mean") is None:
        builder.fail(call, "has no running statistics in eval mode", "track running statistics or trace in train mode")
        return
    count = len(builder.layers)
    builder.layer(op, bound, call)  # in training the kernel moves the running statistics, as the module does
    if cumulative and len(builder.layers) > count:
        builder.layers[-1]["momentum"] = None


@op_hook("prelu")
def prelu(builder: Builder, op: str, bound: dict, call: Call) -> None:
    """nn.PReLU()'s one slope for every channel is ``shared: true`` (a [C] weight: one per channel)."""
    weight, source = bound.get("weight"), bound.get("input")
    if (
        isinstance(weight, torch.Tensor)
        and isinstance(source, torch.Tensor)
        and weight.numel() == 1
        and (source.dim() < 2 or source.shape[1] != 1)
    ):
        bound["shared"] = True
    builder.layer(op, bound, call)


@op_hook("div")
def div(builder: Builder, op: str, bound: dict, call: Call) -> None:
    if bound.pop("rounding_mode", None) is not None:
        builder.fail(call, "rounds (rounding_mode is set), which has no gradient", "divide without rounding_mode")
        return
    builder.layer(op, bound, call)


@op_hook("pow")
def power(builder: Builder, op: str, bound: dict, call: Call) -> None:
    if not is_number(bound.get("exponent")):
        builder.fail(call, "has a tensor exponent", "raise to a number")
        return
    if bound["exponent"] == 1:
        return builder.alias(call, bound["input"])
    builder.layer(op, bound, call)


@op_hook("hardtanh")
def hardtanh(builder: Builder, op: str, bound: dict, call: Call) -> None:
    if bound.get("min_val", -1.0) == 0 and bound.get("max_val", 1.0) == 6:  # nn.ReLU6
        bound.pop("min_val"), bound.pop("max_val")
        op = "relu6"
    builder.layer(op, bound, call)


@op_hook("squeeze")
def squeeze(builder: Builder, op: str, bound: dict, call: Call) -> None:
    """``x.squeeze(1)``, ``x.squeeze((2, 3))``, ``x.squeeze()``: one layer per size-1 dim; a dim that is not
    size 1 is left (as PyTorch does; at other sizes the second run compares)."""
    source, dims = bound.get("input"), bound.get("dim")
    if not isinstance(source, torch.Tensor) or source.dim() == 0:
        return builder.unknown(call)
    rank = source.dim()
    dims = range(rank) if dims is None else [dims] if is_int(dims) else dims
    dims = sorted({dim % rank for dim in dims if source.shape[dim] == 1})
    if not dims:
        return builder.alias(call, source)
    current = source
    for dim in reversed(dims[1:]):
        current = builder.part(call, "squeeze", current, dim)
    builder.layer(op, {"input": current, "dim": dims[0]}, call)


@op_hook("pad")
def pad(builder: Builder, op: str, bound: dict, call: Call) -> None:
    bound["pad"] = pads = [int(p) for p in bound["pad"]]
    source = bound.get("input")
    if (
        isinstance(source, torch.Tensor)
        and source.dim() >= 3
        and len(pads) == 2 * (source.dim() - 2)
        and bound.get("mode") in (None, "constant")
        and not bound.get("value")
    ):

        def centred_to(other: torch.Tensor) -> bool:  # U-Net's [diffX // 2, diffX - diffX // 2, ...]
            differences = [other.shape[dim] - source.shape[dim] for dim in reversed(range(2, source.dim()))]
            return pads == [part for d in differences for part in (d // 2, d - d // 2)]

        bound["pad"] = builder.size_of(source, centred_to) or pads
    if bound.get("mode") is None:
        bound.pop("mode", None)
    if bound.get("value") is None:
        bound.pop("value", None)
    builder.layer(op, bound, call)  # a zero pad too: at other sizes the same call may pad


@op_hook("max_pool1d", "max_pool2d", "max_pool3d")
def max_pool(builder: Builder, op: str, bound: dict, call: Call) -> None:
    if bound.get("return_indices") or call.name.endswith("_with_indices"):
        builder.fail(call, "returns indices", "call it with return_indices=False")
        return
    bound.pop("return_indices", None)
    avg_pool(builder, op, bound, call)


@op_hook("avg_pool1d", "avg_pool2d", "avg_pool3d")
def avg_pool(builder: Builder, op: str, bound: dict, call: Call) -> None:
    """A window the input's own size, read from it (CBAM's ``F.avg_pool2d(x, (x.size(2), x.size(3)), stride=(
    x.size(2), x.size(3)))``), is one window at every size: the adaptive pool to 1. A window of fixed numbers
    stays a window, even where the traced input is its size (``nn.AvgPool2d(7)``)."""
    source, kernel, dims = bound.get("input"), bound.get("kernel_size"), int(op[-2])

    def read_from_source(size, axis: int) -> bool:  # source.shape[-dims + axis], as the code read it
        return (
            isinstance(size, sizes.TracedSize)
            and isinstance(size.expr, sizes.Dim)
            and size.expr.dim == source.dim() - dims + axis
            and builder.node(builder.size_tensors[size.expr.index]) == builder.node(source)
        )

    def all_are(key: str, value: int) -> bool:  # padding 0 and dilation 1: any stride or ceil_mode gives one window
        given = literal(bound.get(key, value))
        return all(item == value for item in (given if isinstance(given, list) else [given]))

    if (
        isinstance(source, torch.Tensor)
        and isinstance(kernel, (tuple, list))
        and len(kernel) == dims
        and all(read_from_source(size, axis) for axis, size in enumerate(kernel))
        and all_are("padding", 0)
        and all_are("dilation", 1)
        and bound.get("divisor_override") is None
    ):
        return builder.layer(f"adaptive_{op[:3]}_pool{dims}d", {"input": source, "output_size": 1}, call)
    builder.layer(op, bound, call)


@op_hook("interpolate")
def interpolate(builder: Builder, op: str, bound: dict, call: Call) -> None:
    if bound.get("scale_factor") is not None:
        factors = literal(bound["scale_factor"])
        bound["scale_factor"] = [float(f) for f in factors] if isinstance(factors, list) else float(factors)
    source, size = bound.get("input"), literal(bound.get("size"))
    if isinstance(source, torch.Tensor) and isinstance(size, list) and len(size) == source.dim() - 2:
        traced = sizes.spec_sizes(list(bound["size"]), builder.node, builder.size_tensors, spare=False)  # h // 2
        nodes = {entry["like"] for entry in traced or () if isinstance(entry, dict)}
        if traced and traced == [{"like": next(iter(nodes)), "dims": [dim]} for dim in range(2, source.dim())]:
            traced = {"like": next(iter(nodes))}  # size=skip.shape[-2:]
        bound["size"] = traced or builder.size_of(source, lambda other: list(other.shape[2:]) == size) or size
    builder.layer(op, bound, call)


@op_hook("clamp")
def clamp(builder: Builder, op: str, bound: dict, call: Call) -> None:
    """``x.clamp(...)``, ``torch.clamp``, ``clip``, ``clamp_min``, ``clamp_max``: the clamp op, whatever the
    bounds. Not relu for ``clamp(min=0)`` nor relu6 for ``clamp(0, 6)``: autograd's clamp passes the
    gradient at a bound (an input exactly 0, as a ReLU's zeros are), relu's and hardtanh's do not."""
    low, high = bound.get("min"), bound.get("max")
    if (low is not None and not is_number(low)) or (high is not None and not is_number(high)):
        builder.fail(call, "clamps to tensor bounds", "clamp to numbers")
    else:
        builder.layer("clamp", {"input": bound["input"], "min": low, "max": high}, call)


@op_hook("max", "min")
def max_dim(builder: Builder, op: str, bound: dict, call: Call) -> None:
    """``torch.max(x, 1, keepdim=True)`` returns (values, indices): the values are the ``max`` layer, the
    indices integers whose every use is refused here; ``torch.max(x)`` is ``amax`` over every dim (autograd
    shares its gradient among ties too); ``torch.max(a, b)`` is refused."""
    source, dim = bound.get("input"), bound.get("dim")
    if isinstance(dim, torch.Tensor) or "other" in bound:
        return builder.fail(
            call,
            f"takes the elementwise {op}imum of two tensors, which has no rule",
            f"write it as F.relu(a - b) + b{'' if op == 'max' else ' negated: -(F.relu(b - a) - b)'}",
        )
    if dim is None and isinstance(source, torch.Tensor) and op == "max":
        return builder.layer("amax", {"input": source, "dim": list(range(source.dim()))}, call)
    if dim is None:
        return builder.fail(call, "over every entry has no rule", "write -(-x).amax(), or give the dim")
    if not isinstance(call.result, tuple) or len(call.result) != 2:
        return builder.unknown(call)
    values, indices = call.result
    builder.layer(op, bound, dataclasses.replace(call, result=values))
    builder.refuse(
        indices,
        Problem(
            call.where,
            call.module,
            op,
            f"returns indices (torch.{op}(x, dim)[1]), integers picked by the data, and the loss reads them",
            f"use only the values, torch.{op}("
            "x, dim)[0] or .values; an index must be a buffer or argument of the model",
        ),
    )


@op_hook("gather")
def gather(builder: Builder, op: str, bound: dict, call: Call) -> None:
    """``x.gather(dim, index)`` with an int64 buffer or argument: the ``gather`` layer. An index that is a 1-d
    buffer viewed along dim and expanded over the others (``idx.view(1, -1, 1).expand(B, -1, C)``: a token
    pick) is ``x[:, idx]``, the ``index`` layer, so that the spec stays shape-generic."""
    source, dim, index, views = bound.get("input"), bound.get("dim"), bound.get("index"), builder.index_views
    if bound.pop("sparse_grad", False):
        return builder.fail(call, "asks for a sparse gradient", "leave sparse_grad False")
    if isinstance(source, torch.Tensor) and not source.is_floating_point():  # BERT's token_type_ids from its buffer
        return builder.fail(
            call,
            f"gathers integers ({source.dtype}), ids a spec cannot compute: its int64 tensors "
            "are inputs, read as indices",
            "pass the ids to the traced function as an argument (for "
            "transformers' BERT: token_type_ids=torch.zeros_like(input_ids) for one segment)",
        )
    if isinstance(source, torch.Tensor) and is_int(dim) and isinstance(index, torch.Tensor) and id(index) in views:
        root, dim = views[id(index)], dim % source.dim()
        along = [-1 if d == dim else 1 for d in range(source.dim())]
        if (
            ("corner", id(index)) not in views
            and root.dim() == 1
            and index.dim() == source.dim()
            and all(index.shape[d] == source.shape[d] for d in range(source.dim()) if d != dim)
            and torch.equal(index, root.reshape(along).expand(index.shape))
        ):
            return builder.layer("index", {"input": source, "index": root, "dim": dim}, call)
        return builder.fail(
            call,
            "reads its index through a reshape or expand of an int64 input",
            "give gather the int64 buffer or argument itself, of the output's shape (made so outside "
            "the traced code), or a 1-d index viewed along dim and expanded over the other dims",
        )
    builder.layer(op, bound, call)


@op_hook("cat")
def cat(builder: Builder, op: str, bound: dict, call: Call) -> None:
    """``torch.cat([x], 1)``, one tensor (DenseNet's first dense layer), is ``x``. A 1-d empty tensor among them is
    left out, as PyTorch's cat leaves it out (transformers' DynamicLayer starts its cache as ``torch.tensor([])``
    and concatenates each step's keys to it: the first step's cache is the keys)."""
    tensors = bound.get("tensors", ())
    if len(tensors) > 1 and all(isinstance(tensor, torch.Tensor) for tensor in tensors):
        bound["tensors"] = [tensor for tensor in tensors if not (tensor.dim() == 1 and tensor.numel() == 0)] or tensors
    if len(bound.get("tensors", ())) == 1 and isinstance(bound["tensors"][0], torch.Tensor):
        return builder.alias(call, bound["tensors"][0])
    builder.layer(op, bound, call)
