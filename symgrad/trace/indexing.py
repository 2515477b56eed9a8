"""Indexing with a constant integer tensor: ``table[self.relative_position_index.view(-1)]`` (Swin's
relative position bias), ``x[:, idx]``.

The index must be an int64 tensor the spec holds as an input (a buffer of the model, or an argument),
possibly reshaped (``.view(-1)``, ``.flatten()``, ``.reshape(...)``, ``.contiguous()``): those reshapes of
integers are not layers, they are remembered here as views of that input. ``x[:, :, v]`` with ``v`` such a
view is then the ``index`` layer with the input itself as index (its own shape), followed by a reshape
to the shape the view gives, so the spec's values are the code's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .dispatch import Builder
    from .recorder import Call

RESHAPES = {"view", "reshape", "flatten", "contiguous", "view_as", "reshape_as", "clone", "unsqueeze"}
EXPANDS = {"expand", "expand_as", "broadcast_to"}
"""``idx.view(1, -1, 1).expand(B, -1, C)``: only ``gather`` reads it (as ``x[:, idx]``, op_hooks.gather)."""


def integer_root(builder: Builder, value: Any) -> torch.Tensor | None:
    """The int64 input ``value`` is (or is a reshape of), else None."""
    if (
        not isinstance(value, torch.Tensor)
        or value.dtype != torch.int64
        or ("expanded", id(value)) in builder.index_views
    ):
        return None
    value = builder.index_views.get(id(value), value)
    return value if builder.is_input(value) else None


def _corner(builder: Builder, value: Any) -> tuple[int, ...] | None:
    """The sizes of the leading corner of its int64 input that ``value`` holds (``index[:n, :n]``), None for all."""
    return builder.index_views.get(("corner", id(value)))


def corner_length(builder: Builder, view: torch.Tensor, dim: int, rank: int) -> int | dict:
    """The length of the corner ``view`` along ``dim`` in the spec: the slice's stop where it carries the dims
    it was read from (``self.position_ids[:, :seq_length]``, ``seq_length`` from ``x.shape[:2]``), else the
    size the code read last that fits (``size_reads.size_read``), else the number."""
    from . import size_reads, sizes

    stops, stop = builder.index_views.get(("stops", id(view)), ()), view.shape[dim]
    if dim < len(stops) and sizes.has_dims(stops[dim]) and int(stops[dim]) == stop:

        def resolve(found: sizes.Dim):
            tensors = builder.size_tensors
            node = builder.node(tensors[found.index]) if found.index < len(tensors) else None
            return (node, found.dim) if isinstance(node, str) else None

        spoken = sizes.spec_size(stops[dim], resolve)
        if spoken is not None:
            return spoken
    length = size_reads.size_read(builder, stop, dim, rank)
    return {**length, "dims": [dim]} if isinstance(length, dict) and "dims" not in length else length


def _is_corner(index: Any) -> bool:
    """``[:n, :m]``: slices from 0 with step 1."""
    return all(
        isinstance(item, slice) and item.start in (None, 0) and item.step in (None, 1)
        for item in (index if isinstance(index, tuple) else (index,))
    )


def _new_dims(index: Any) -> bool:
    """``[:, None]``, ``[None]``, ``[..., None]``: full slices and new dims, at least one of these."""
    items = index if isinstance(index, tuple) else (index,)
    return any(item is None for item in items) and all(
        item is None or item is Ellipsis or (isinstance(item, slice) and item == slice(None)) for item in items
    )


def index_view(builder: Builder, call: "Call") -> bool:
    """Remember a reshape of an int64 input (``index.view(-1)``), or of its leading corner (``index.clone()[:n,
    :n]``: SwinUNETR where a map is smaller than the window), as a view of it; an int64 input gathered at
    another's corner (:func:`gathered_ids`); False for any other call."""
    if call.name == "gather" or (call.arguments and ("gathered", id(call.arguments[0])) in builder.index_views):
        return gathered_ids(builder, call)
    if (call.name not in RESHAPES | EXPANDS and call.name != "__getitem__") or not call.arguments:
        return False
    source = call.arguments[0]
    root = integer_root(builder, source)
    if root is None or not isinstance(call.result, torch.Tensor):
        return False
    corner = _corner(builder, source)
    if call.name in EXPANDS:
        if corner is not None:
            return False
        builder.index_views[id(call.result)] = root
        builder.index_views[("expanded", id(call.result))] = root
        builder.kept.append(call.result)
        return True
    if call.name == "__getitem__":
        if corner is None and _new_dims(call.arguments[1]):  # timesteps[:, None]: the same values
            builder.index_views[id(call.result)] = root
            builder.kept.append(call.result)
            return True
        if corner is not None or source.shape != root.shape or not _is_corner(call.arguments[1]):
            return False
        corner = tuple(call.result.shape) if call.result.shape != root.shape else None
        items = call.arguments[1] if isinstance(call.arguments[1], tuple) else (call.arguments[1],)
        builder.index_views[("stops", id(call.result))] = tuple(item.stop for item in items)
    if call.result.numel() != (math.prod(corner) if corner is not None else root.numel()):
        return False
    builder.index_views[id(call.result)] = root
    if corner is not None:
        builder.index_views[("corner", id(call.result))] = corner
    builder.kept.append(call.result)
    return True


@dataclasses.dataclass(frozen=True)
class Gathered:
    """``ids.gather(dim, index)``, ``ids`` and ``index`` int64 inputs (``index`` possibly a leading corner of
    one) of size 1 along every other dim, then perhaps expanded (``expand``: that call): BERT's
    ``token_type_ids`` made from its buffer when the caller passes none (modeling_bert.py:91-93). Only an
    embedding reads it, as the table's rows at ``ids``, picked at ``index`` (``embedding._of_gathered``)."""

    ids: torch.Tensor
    dim: int
    index: torch.Tensor
    corner: tuple[int, ...] | None
    view: torch.Tensor
    """The index as the code passed it (its corner's stops: ``corner_length``)."""
    expand: "Call | None" = None


def gathered_ids(builder: Builder, call: "Call") -> bool:
    """Remember ``ids.gather(dim, index)`` of int64 inputs as :class:`Gathered` (and its ``expand``, its
    reshapes to the same shape); False where the ids or the index are not such inputs (refused by
    ``op_hooks.gather``, or as an unknown tensor where something reads it)."""
    source, result = call.arguments[0], call.result
    found = builder.index_views.get(("gathered", id(source))) if isinstance(source, torch.Tensor) else None
    if found is not None:  # .expand(batch, length) of the gathered ids, or a reshape that keeps the shape
        if (
            call.name in EXPANDS
            and call.name != "expand_as"
            and found.expand is None
            and isinstance(result, torch.Tensor)
            and result.dim() == source.dim()
        ):
            found = dataclasses.replace(found, expand=call)
        elif not (call.name in RESHAPES and isinstance(result, torch.Tensor) and result.shape == source.shape):
            return False
        builder.index_views[("gathered", id(result))] = found
        builder.kept.append(result)
        return True
    bound = dict(zip(("input", "dim", "index"), call.arguments)) | call.keywords
    source, dim, index = bound.get("input"), bound.get("dim"), bound.get("index")
    if (
        not isinstance(source, torch.Tensor)
        or not isinstance(index, torch.Tensor)
        or not isinstance(dim, int)
        or source.dtype != torch.int64
    ):
        return False
    ids = builder.index_views.get(id(source), source)
    if not builder.is_input(ids) or ids.shape != source.shape or _corner(builder, source) is not None:
        return False  # ids.expand(1, -1) of a [1, L] buffer: the buffer itself
    root = integer_root(builder, index)
    dim %= source.dim()
    if (
        root is None
        or root.dim() != source.dim()
        or any(size != 1 for tensor in (source, root) for d, size in enumerate(tensor.shape) if d != dim)
    ):
        return False
    builder.index_views[("gathered", id(result))] = Gathered(ids, dim, root, _corner(builder, index), index)
    builder.kept.append(result)
    return True


def index_with_tensor(builder: Builder, call: "Call") -> bool:
    """``x[:, idx]``: full slices, then one int64 input (or a view of it), then full slices; False for any
    other index (which the slicing handler takes or refuses)."""
    source, index = call.arguments[0], call.arguments[1]
    index = index if isinstance(index, tuple) else (index,)
    tensors = [position for position, item in enumerate(index) if isinstance(item, torch.Tensor)]
    if len(tensors) != 1 or not isinstance(source, torch.Tensor):
        return False
    dim = tensors[0]
    rest = index[:dim] + index[dim + 1 :]
    root = integer_root(builder, index[dim])
    if root is None or root.dim() == 0 or any(item != slice(None) for item in rest):
        return False
    picked = source[(slice(None),) * dim + (root,)]
    corner = _corner(builder, index[dim])
    if corner is not None:  # table[index[:n, :n].reshape(-1)]: table[index], its corner, reshaped as the view
        builder.layer("index", {"input": source, "index": root, "dim": dim}, _replaced(call, picked))
        for position, stop in enumerate(corner):
            if stop != root.shape[position]:
                picked = builder.part(call, "narrow", picked, dim + position, 0, stop)
        shape = list(call.result.shape)
        if index[dim].dim() == 1:  # .reshape(-1): its length is the corner's, no other node's size
            shape[dim] = -1
        builder.part(call, "reshape", picked, tuple(shape), result=call.result)
        return True
    layer_call = call if picked.shape == call.result.shape else _replaced(call, picked)
    builder.layer("index", {"input": source, "index": root, "dim": dim}, layer_call)
    if layer_call is not call:  # idx.view(-1): the index layer's output reshaped as the view shapes it
        builder.part(call, "reshape", picked, tuple(call.result.shape), result=call.result)
    return True


def _replaced(call: "Call", result: torch.Tensor) -> "Call":
    return dataclasses.replace(call, result=result)


def index_select(builder: Builder, call: "Call") -> bool:
    """``torch.index_select(x, dim, idx)``, ``x.index_select(dim, idx)`` with idx a 1-d int64 input (or a
    view of one): the ``index`` layer; False otherwise."""
    bound = dict(zip(("input", "dim", "index"), call.arguments)) | call.keywords
    source, dim, index = bound.get("input"), bound.get("dim"), bound.get("index")
    root = integer_root(builder, index)
    if not isinstance(source, torch.Tensor) or not isinstance(dim, int) or root is None or index.dim() != 1:
        return False
    dim %= source.dim()
    picked = source[(slice(None),) * dim + (root,)]
    layer_call = call if picked.shape == call.result.shape else _replaced(call, picked)
    builder.layer("index", {"input": source, "index": root, "dim": dim}, layer_call)
    if layer_call is not call:
        builder.part(call, "reshape", picked, tuple(call.result.shape), result=call.result)
    return True


def strided_slice(
    builder: Builder, call: "Call", source: torch.Tensor, dim: int, start: int, stop: int, step: int
) -> torch.Tensor:
    """``source[:, ..., start:stop:step]`` along ``dim`` with a step of 2 or more: the ``slice`` layer (its end
    left open where the slice runs to the end of the dim, so the spec stays shape-generic)."""
    result = source[(slice(None),) * dim + (slice(start, stop, step),)]
    end = None if stop >= source.shape[dim] else stop
    part = dataclasses.replace(call, name="slice", arguments=(source,), keywords={}, result=result)
    builder.layer("slice", {"input": source, "dim": dim, "start": start, "end": end, "step": step}, part)
    return result
