"""Constants of several values made inside the traced code (diffusers' timestep frequencies,
``exp(-log(10000) * arange(half) / half)``; a fixed mask): a ``constant`` layer that writes the values
out as the code computed them, made at run time in the dtype and on the device of a node the same call
reads (so a float32 run computes in float32, a float64 run in float64, from the same exact decimals).

A constant whose values or size follow the input's size differs at the second run's sizes, which
refuses it (``symgrad.trace``'s size check); one of a single value stays a number or a ``full`` map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..rules.fill import MAX_CONSTANT

if TYPE_CHECKING:
    from .layers import SpecBuilder
    from .recorder import Call


def constant_layer(builder: "SpecBuilder", value: torch.Tensor, call: "Call") -> str | None:
    """The name of a new ``constant`` layer holding ``value``, read by ``call``; None when it cannot be
    one (not floating point, 0-dim, too large, or no node of the call to take a dtype from)."""
    if not value.is_floating_point() or value.dim() == 0 or value.numel() > MAX_CONSTANT:
        return None
    like = next((found for other in _tensors(call) if other is not value and id(other) not in builder.constants
                 and isinstance(found := builder.node(other), str)), None)
    if like is None:
        return None
    made = builder.constants[id(value)][0]
    values = [float(entry) for entry in value.detach().to(torch.float64).reshape(-1).tolist()]
    layer = {"op": "constant", "in": like, "values": values, "shape": list(value.shape)}
    return builder.emit("constant", layer, made)


def _tensors(call: "Call"):
    for item in [*call.arguments, *call.keywords.values()]:
        for entry in (item if isinstance(item, (list, tuple)) else [item]):
            if isinstance(entry, torch.Tensor):
                yield entry
