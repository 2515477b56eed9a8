"""``F.embedding`` and ``nn.Embedding`` calls: the ``embedding`` layer, or, for positions made inside the
forward from ``torch.arange`` (nanoGPT's ``wpe(torch.arange(t))``, GPT-2's ``torch.arange(T) + past`` then
``unsqueeze(0)``), a ``narrow`` of the table: rows ``start .. start + t - 1`` are ``weight[start:start + t]``,
whose length ``t`` is read at run time from the tensor the code took it from (``{like: idx, dims: [1]}``),
never frozen. Its gradient puts the gradient rows back in place, zero elsewhere, which is what
``embedding_backward`` adds into a table of zeros (each row is read once): equal bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import size_reads, sizes
from .dataflow import call_sizes
from .dispatch import op_hook
from .indexing import Gathered, corner_length
from .recorder import Call

if TYPE_CHECKING:
    from .dispatch import Builder

_VIEWS = {
    "unsqueeze",
    "add",
    "__add__",
    "__radd__",
    "view",
    "reshape",
    "__getitem__",
    "to",
    "long",
    "int",
    "contiguous",
    "clone",
}
"""Calls an arange's positions may pass through on their way to the table (their values are checked)."""


@op_hook("embedding")
def embedding(builder: Builder, op: str, bound: dict, call: Call) -> None:
    """``F.embedding(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)``."""
    if bound.pop("max_norm", None) is not None:
        return builder.fail(
            call,
            "renormalises the rows it reads in place (max_norm is set), a write into the "
            "weight that the explicit step would not make",
            "leave max_norm at None",
            op,
        )
    if bound.pop("scale_grad_by_freq", False):
        return builder.fail(
            call,
            "scales each row's gradient by its count in the batch (scale_grad_by_freq)",
            "leave scale_grad_by_freq off",
            op,
        )
    if bound.pop("sparse", False):
        return builder.fail(
            call,
            "asks for a sparse gradient (sparse=True); the explicit backward gives a dense one",
            "leave sparse off (torch.optim.SparseAdam needs it; use Adam or SGD)",
            op,
        )
    bound.pop("norm_type", None)
    index, weight = bound.get("input"), bound.get("weight")
    if isinstance(index, torch.Tensor) and ("gathered", id(index)) in builder.index_views:
        return _of_gathered(builder, op, bound, call, builder.index_views[("gathered", id(index))])
    if isinstance(index, torch.Tensor) and id(index) in builder.index_views:
        return _of_view(builder, op, bound, call, builder.index_views[id(index)])
    positions = _positions(builder, index) if isinstance(index, torch.Tensor) else None
    if positions is None or not isinstance(weight, torch.Tensor) or bound.get("padding_idx") is not None:
        return builder.layer(op, bound, call)
    start, length = positions
    name = builder.node(weight)
    if not isinstance(name, str):
        return builder.layer(op, bound, call)  # reports what the weight carries
    rows = weight.narrow(0, start, int(length))
    resolve = _resolver(builder)
    spoken = sizes.spec_size(length, resolve) if sizes.has_dims(length) else None
    made = Call("narrow", torch.narrow, (weight, 0, start, int(length)), {}, rows, call.where, call.module, call.leaf)
    builder.emit(
        "narrow",
        {"op": "narrow", "in": name, "dim": 0, "start": start, "length": spoken if spoken is not None else int(length)},
        made,
    )
    current = rows
    while current.dim() < call.result.dim():
        current = builder.part(call, "unsqueeze", current, 0)
    builder.alias(call, current)


def _of_view(builder: Builder, op: str, bound: dict, call: Call, root: torch.Tensor) -> None:
    """The rows at a view of an int64 input: ``input_ids.view(-1, T)`` of an input of that shape is the input;
    a leading corner of a buffer (BERT's ``self.position_ids[:, :seq_length]``) is the rows at the whole buffer,
    narrowed to the corner, each length read at run time from the tensor of that size the code read last (the
    second run, at other sizes, refuses a guess that does not follow)."""
    index = bound["input"]
    corner = builder.index_views.get(("corner", id(index)))
    if ("expanded", id(index)) in builder.index_views or (corner is None and root.shape != index.shape):
        return builder.layer(op, bound, call)  # refused, as any reader of a reshaped int64 input
    if corner is None:
        bound["input"] = root
        return builder.layer(op, bound, call)
    rows = torch.nn.functional.embedding(root, bound["weight"])
    builder.layer(
        op, {**bound, "input": root}, Call(call.name, call.function, (), {}, rows, call.where, call.module, call.leaf)
    )
    current = rows
    current = _narrowed(builder, call, current, root, corner, index)
    builder.alias(call, current)


def _narrowed(
    builder: Builder, call: Call, current: torch.Tensor, root: torch.Tensor, corner: tuple, view: torch.Tensor
) -> torch.Tensor:
    """``current`` (rows at the whole int64 ``root``) narrowed to the ``corner`` the code's ``view`` holds."""
    for dim, stop in enumerate(corner):
        if stop != root.shape[dim]:
            length = corner_length(builder, view, dim, len(corner))
            narrowed = current.narrow(dim, 0, stop)
            made = Call(
                "narrow", torch.narrow, (current, dim, 0, stop), {}, narrowed, call.where, call.module, call.leaf
            )
            builder.emit(
                "narrow", {"op": "narrow", "in": builder.node(current), "dim": dim, "start": 0, "length": length}, made
            )
            current = narrowed
    return current


def _of_gathered(builder: Builder, op: str, bound: dict, call: Call, found: Gathered) -> None:
    """The rows at ids gathered from an int64 buffer (BERT's ``token_type_ids`` from its buffer, gathered at
    the corner of ``position_ids``, expanded to the batch: modeling_bert.py:91-93): the rows at the whole buffer,
    picked along the gather's dim at the index's root (the ``index`` layer), narrowed to its corner and
    expanded as the code expanded the ids, each size read at run time as the code read it."""
    rows = torch.nn.functional.embedding(found.ids, bound["weight"])
    builder.layer(
        op,
        {**bound, "input": found.ids},
        Call(call.name, call.function, (), {}, rows, call.where, call.module, call.leaf),
    )
    picked = rows[(slice(None),) * found.dim + (found.index,)]
    builder.layer(
        "index",
        {"input": rows, "index": found.index, "dim": found.dim},
        Call("index", torch.index_select, (), {}, picked, call.where, call.module, call.leaf),
    )
    shape = [*found.index.shape, rows.shape[-1]]  # the index's sizes (1 off the gather's dim), the table's
    shape[found.dim] = -1  # the index's length at run time: passed position_ids [1, T] are T long
    current = picked.reshape(shape)
    builder.layer(
        "reshape",
        {"input": picked, "shape": shape},
        Call("reshape", torch.reshape, (), {}, current, call.where, call.module, call.leaf),
    )
    current = _narrowed(builder, call, current, found.index, found.corner or (), found.view)
    if found.expand is None:
        return builder.alias(call, current)
    values = (*call_sizes(found.expand, "size", "shape"), -1)
    size_reads.expand_layer(
        builder,
        current,
        values,
        Call("expand", torch.Tensor.expand, (current, *values), {}, call.result, call.where, call.module, call.leaf),
    )


def _resolver(builder: Builder):
    def resolve(dim: sizes.Dim):
        tensors = builder.size_tensors
        found = builder.node(tensors[dim.index]) if dim.index < len(tensors) else None
        return (found, dim.dim) if isinstance(found, str) else None

    return resolve


def _positions(builder: Builder, index: torch.Tensor) -> tuple[int, int] | None:
    """``(start, length)`` where ``index`` holds ``start, start + 1, ..., start + length - 1`` along its last
    dim (its other dims of size 1) and was made in the traced code from ``torch.arange``; ``length`` the
    arange's own (a size that carries the dims it was read from). None for any other index."""
    if id(index) not in builder.constants or index.dtype not in (torch.int64, torch.int32) or index.dim() == 0:
        return None
    if any(size != 1 for size in index.shape[:-1]) or index.numel() == 0:
        return None
    values = index.reshape(-1)
    start = int(values[0])
    if start < 0 or not torch.equal(values, torch.arange(start, start + values.numel(), dtype=values.dtype)):
        return None
    made = builder.constants[id(index)][0]
    while made.name != "arange":
        if (
            made.name not in _VIEWS
            or not made.arguments
            or not isinstance(made.arguments[0], torch.Tensor)
            or id(made.arguments[0]) not in builder.constants
        ):
            return None
        made = builder.constants[id(made.arguments[0])][0]
    arguments = dict(zip(("start", "end", "step"), made.arguments)) | made.keywords
    if "end" not in arguments:
        arguments = {"start": 0, "end": arguments["start"], **{k: v for k, v in arguments.items() if k == "step"}}
    first, end, step = arguments["start"], arguments["end"], arguments.get("step", 1)
    if step != 1 or not isinstance(end, int) or not isinstance(first, int) or sizes.has_dims(first):
        return None  # an offset that follows the input's size stays a constant (refused by the second run)
    length = end - first
    if int(length) != values.numel():
        return None
    return start, length
