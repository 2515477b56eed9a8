"""Sizes a layer writes as sizes the code read (``{like: x}``, ``{like: x, dims: [2, 3]}``), where a
handler has only numbers: the walk's sizes read so far (``Builder.sizes_read``) against them. Apart
from ``sizes.py``, which the recorder imports, so that the recorder does not reach the walk's protocol."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from .sizes import spec_sizes

if TYPE_CHECKING:
    from .dispatch import Builder


def size_read(builder: Builder, size: int, position: int, rank: int) -> int | dict:
    """Entry ``position`` of a ``rank``-long list of sizes as a size the code read, when one fits:
    ``{like: x}`` for x's size at the same position (x of that rank: ``reshape(b, c, h, w)`` with
    ``b, c, h, w = x.shape``), ``{like: x, dims: [2, 3]}`` for a product of two or more of x's dims aligned
    with the entry's place from the end or the start (``h * w`` last), most recent reads first; else the number,
    which the second run, at other and unequal sizes, refuses if it follows the input."""
    if size == 1:  # a literal 1 (view(b, c, 1, 1)), even where a map happens to be 1x1 when traced
        return size
    named = [(other, found) for other in reversed(builder.sizes_read) if isinstance(found := builder.node(other), str)]
    for other, found in named:
        if other.dim() == rank and other.shape[position] == size:
            return {"like": found}
    from_end = rank - 1 - position
    for aligned_end in (True, False):
        for other, found in named:
            for length in range(2, other.dim() + 1):  # one dim elsewhere than its place: a coincidence
                start = other.dim() - from_end - length if aligned_end else position
                dims = list(range(start, start + length))
                if start < 0 or dims[-1] >= other.dim() or (start == 0 and position != 0):
                    continue  # the batch merged into a later entry: a coincidence (b * c == features)
                if math.prod(other.shape[dim] for dim in dims) == size:
                    return {"like": found, "dims": dims}
    return size


def expand_layer(builder: Builder, source: torch.Tensor, values: tuple, call) -> None:
    """An ``expand`` layer of ``source`` to ``values`` (the code's sizes, -1 keeping one) whose result is
    ``call.result``: each size read at run time where it carries its dims or the code read a tensor of it."""
    shape = spec_sizes(values, builder.node, builder.size_tensors, spare=False) or [
        size if size == -1 else size_read(builder, int(size), position, len(values))
        for position, size in enumerate(values)
    ]
    builder.layer("expand", {"input": source, "shape": shape}, call)
