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
    one (not floating point, 0-dim, too large, written into since it was made, or no node of the call to
    take a dtype from)."""
    if not value.is_floating_point() or value.dim() == 0 or value.numel() > MAX_CONSTANT:
        return None
    made, when = builder.constants[id(value)]
    if builder.writes.get(value.untyped_storage().data_ptr(), 0) > when:
        return None  # c[:, :1].copy_(h) through a view since: it holds a node's values now, no constant's
    like = next((found for other in _tensors(call) if other is not value and id(other) not in builder.constants
                 and isinstance(found := builder.node(other), str)), None)
    if like is None:
        return None
    values = [float(entry) for entry in value.detach().to(torch.float64).reshape(-1).tolist()]
    layer = {"op": "constant", "in": like, "values": values, "shape": list(value.shape)}
    return builder.emit("constant", layer, made)


def _tensors(call: "Call"):
    for item in [*call.arguments, *call.keywords.values()]:
        for entry in (item if isinstance(item, (list, tuple)) else [item]):
            if isinstance(entry, torch.Tensor):
                yield entry


def at_full_precision(spec: dict, module, function, run) -> None:
    """The ``constant`` layers' values as a float64 run computes them, where the trace ran in another
    dtype (a float32 model's ``torch.ones(..., dtype=x.dtype) / 9`` is 1/9 rounded to float32; the spec
    holds the float64 value, and the generated code makes it in the dtype it runs in). ``run(function,
    module)`` runs the trace again (``_run``) with a float64 copy of the model and float64 inputs; a
    constant the code makes in a fixed dtype (diffusers' ``dtype=torch.float32``, or PyTorch's default
    dtype) is the same in that run, as it is when the model runs in float64. Values stay as traced where
    that run fails or makes other constants."""
    import copy

    layers = [layer for layer in spec["layers"] if layer["op"] == "constant"]
    parameters = list(module.parameters()) + list(module.buffers()) if module is not None else []
    if not layers or (parameters and all(value.dtype == torch.float64 for value in parameters
                                         if value.is_floating_point())):
        return
    try:
        if module is not None:
            module = copy.deepcopy(module).double()
            function = module.forward
        precise, _ = run(function, module)
    except Exception:  # noqa: BLE001 - the model does not run in float64: keep the traced values
        return
    again = [layer for layer in precise["layers"] if layer["op"] == "constant"]
    if len(again) == len(layers) and all(a["shape"] == b["shape"] for a, b in zip(layers, again)):
        for layer, other in zip(layers, again):
            layer["values"] = other["values"]
