"""Dtype conversions (``t.float()``, ``x.to(torch.float32)``, ``h.to(dtype=self.dtype)``, ``x.type_as(y)``)
as ``cast`` layers, and integer arithmetic that leaves an int64 input's values as they are.

diffusers' ``UNet2DModel`` broadcasts a per-sample int64 timestep to the batch (``timesteps *
torch.ones(n, dtype=timesteps.dtype)``: the same values, remembered as a view of the input, as
``indexing.py`` remembers reshapes), embeds it in float32 whatever the model's dtype
(``timesteps[:, None].float() * freqs``: a ``cast`` of the int64 input to float32, reshaped as the view
shapes it), and converts the embedding to the model's dtype (``t_emb.to(dtype=self.dtype)``: a ``cast``
``like`` a floating argument of the traced function of that dtype, so the spec runs in float32 and in
float64 alike). A conversion to a dtype no argument has is written by name (``dtype: float32``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from .indexing import integer_root

if TYPE_CHECKING:
    from .dispatch import Builder
    from .recorder import Call

IDENTITIES = {"mul": 1, "div": 1, "add": 0, "sub": 0}


def integer_identity(builder: Builder, op: str, bound: dict, call: "Call") -> bool:
    """``timesteps * 1`` (a broadcast ``torch.ones``, folded to its number) on an int64 input or a view of
    it, giving a result of its shape: remembered as a view of the input; False for any other call."""
    source, number = bound.get("input"), bound.get("other")
    root = integer_root(builder, source)
    if (
        root is None
        or isinstance(number, torch.Tensor)
        or number != IDENTITIES.get(op)
        or not isinstance(call.result, torch.Tensor)
        or call.result.dtype != torch.int64
        or call.result.shape != source.shape
        or bound.get("alpha", 1) != 1
        or bound.get("rounding_mode") is not None
    ):
        return False
    builder.index_views[id(call.result)] = root
    corner = builder.index_views.get(("corner", id(source)))
    if corner is not None:
        builder.index_views[("corner", id(call.result))] = corner
    builder.kept.append(call.result)
    return True


def convert(builder: Builder, call: "Call") -> bool:
    """A conversion of an int64 input (or a view of it) or of a float tensor to a floating dtype on the same
    device: a ``cast`` layer; False where it is none of those (the caller refuses it)."""
    source, result = call.arguments[0], call.result
    if (
        not isinstance(result, torch.Tensor)
        or not result.is_floating_point()
        or result.device != source.device
        or ("corner", id(source)) in builder.index_views
    ):
        return False
    if source.dtype == torch.int64:
        root = integer_root(builder, source)
        if root is None:
            return False
    elif source.is_floating_point():
        root = source
    else:
        return False
    like = _like(builder, call, result.dtype)
    target = {"like": like} if like is not None else {"dtype": str(result.dtype).removeprefix("torch.")}
    converted = root.to(result.dtype)
    same = converted.shape == result.shape
    builder.layer("cast", {"input": root, **target}, call if same else dataclasses.replace(call, result=converted))
    if not same:  # timesteps[:, None].float(): the cast of the input, reshaped as the view shapes it
        builder.part(call, "reshape", converted, tuple(result.shape), result=result)
    return True


def _like(builder: Builder, call: "Call", dtype: torch.dtype) -> torch.Tensor | None:
    """The tensor whose dtype the conversion takes: ``type_as``'s other; else a floating argument of the
    traced function in that dtype (the model's own precision); None where none is (the dtype by name)."""
    if call.name == "type_as":
        other = call.keywords.get("other", call.arguments[1] if len(call.arguments) > 1 else None)
        if isinstance(other, torch.Tensor) and isinstance(builder.node(other), str):
            return other
    return next(
        (
            value
            for value in builder.arguments.values()
            if value.dtype == dtype and isinstance(builder.node(value), str)
        ),
        None,
    )
