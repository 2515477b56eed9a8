"""Constants of several values made inside the traced code (diffusers' timestep frequencies,
``exp(-log(10000) * arange(half) / half)``; a fixed mask): a ``constant`` layer that writes the values
out as the code computed them, made at run time in the dtype and on the device of a node the same call
reads (so a float32 run computes in float32, a float64 run in float64, from the same exact decimals).

A constant whose values or size follow the input's size differs at the second run's sizes, which
refuses it (``symgrad.trace``'s size check); one of a single value stays a number or a ``full`` map
(:class:`OneValueConstants`, the walk's methods for those).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..rules.fill import MAX_CONSTANT
from .dataflow import storage_of
from .recorder import Call
from .size_reads import expand_layer, size_read

if TYPE_CHECKING:
    from .dispatch import Builder


class OneValueConstants:
    """The walk's (``layers.SpecBuilder``'s) handling of a constant of one value: a number where it only
    broadcasts, or a ``full`` map."""

    def fold_constants(self, op: str, bound: dict, call: Call) -> bool:
        """A constant operand of one value, ``torch.full_like(x, 2.0) * x`` or ``x + torch.tensor(0.5)``, is
        that number when it only broadcasts against the other operand (the result has the other's shape and
        dtype). ``c - x`` becomes ``(-x) + c`` and ``c / x`` becomes ``x ** -1 * c``: True when those layers
        are made here; otherwise the numbers are put in ``bound``."""
        for key, other_key in (("input", "other"), ("other", "input")):
            value, other = bound.get(key), bound.get(other_key)
            if not (
                isinstance(value, torch.Tensor) and id(value) in self.constants and isinstance(other, torch.Tensor)
            ):
                continue
            fill = self.fill(value)
            if (
                fill is not None
                and call.result.dtype == other.dtype
                and torch.broadcast_shapes(value.shape, other.shape) == other.shape
            ):
                bound[key] = fill if value.is_floating_point() or not float(fill).is_integer() else int(fill)
        number, tensor = bound.get("input"), bound.get("other")
        if op not in ("sub", "div") or isinstance(number, torch.Tensor) or not isinstance(tensor, torch.Tensor):
            return False
        if bound.get("alpha", 1) != 1 or bound.get("rounding_mode") is not None:
            return False  # the layer refuses these arguments
        if op == "sub":
            made = Call("neg", torch.neg, (tensor,), {}, torch.neg(tensor), call.where, call.module, call.leaf)
        else:
            made = Call("pow", torch.pow, (tensor, -1), {}, torch.pow(tensor, -1), call.where, call.module, call.leaf)
        self.add(made)
        self.layer("add" if op == "sub" else "mul", {"input": made.result, "other": number}, call)
        return True

    def fill(self, value: torch.Tensor) -> float | None:
        """The one value of a constant, when its every entry held it as made and nothing wrote a value that
        is not a constant into its storage since (``c[:, :1].copy_(h)`` through a view)."""
        made, when = self.constants[id(value)]
        if made.fill is None or self.writes.get(storage_of(value), 0) > when:
            return None
        return made.fill

    def constant_map(self, value: torch.Tensor) -> str | None:
        """A ``full`` layer for a constant of one value read as a tensor (FFDNet's noise-level map, concatenated
        to the input), each size ``{like: NODE}`` where the code read a tensor of that size at that dim, the
        others numbers (the second run refuses them if they follow the input); None when it holds several
        values, is no float or reads no size."""
        made = self.constants[id(value)][0]
        if self.fill(value) is None or value.dim() == 0 or not value.is_floating_point():
            return None
        size: list[Any] = []
        for dim, length in enumerate(value.shape):
            source = next(
                (
                    name
                    for other in reversed(self.sizes_read)
                    if other.dim() == value.dim()
                    and other.shape[dim] == length
                    and isinstance(name := self.node(other), str)
                ),
                None,
            )
            size.append({"like": source} if source is not None else int(length))
        if all(isinstance(item, int) for item in size):
            return None
        return self.emit("full", {"op": "full", "size": size, "fill_value": float(made.fill)}, made)


def constant_layer(builder: Builder, value: torch.Tensor, call: "Call") -> str | None:
    """The name of a new ``constant`` layer holding ``value``, read by ``call``; None when it cannot be
    one (not floating point, 0-dim, too large, written into since it was made, or no node of the call to
    take a dtype from)."""
    if not value.is_floating_point() or value.dim() == 0 or value.numel() > MAX_CONSTANT * value.shape[0]:
        return None
    made, when = builder.constants[id(value)]
    if builder.writes.get(value.untyped_storage().data_ptr(), 0) > when:
        return None  # c[:, :1].copy_(h) through a view since: it holds a node's values now, no constant's
    like = next(
        (
            found
            for other in _tensors(call)
            if other is not value
            and id(other) not in builder.constants
            and isinstance(found := builder.node(other), str)
        ),
        None,
    )
    if like is None:
        return None
    if (
        value.dim() >= 2
        and value.shape[0] > 1
        and torch.equal(value, value[:1].expand_as(value))
        and isinstance(size_read(builder, value.shape[0], 0, value.dim()), dict)
    ):
        return _batch_of_one(builder, value, made, like)  # the same for every sample: EdgeNeXt's position encoding
    if value.numel() > MAX_CONSTANT:
        return None
    values = [float(entry) for entry in value.detach().to(torch.float64).reshape(-1).tolist()]
    layer = {"op": "constant", "in": like, "values": values, "shape": list(value.shape)}
    return builder.emit("constant", layer, made)


def _batch_of_one(builder: Builder, value: torch.Tensor, made: "Call", like: str) -> str | None:
    """A constant whose every sample is the first, its first size one the code read (``torch.zeros(B, H, W)``
    with ``B, H, W`` from ``x.shape``): that sample as a ``constant`` layer, expanded to the size read at run
    time, so it holds a batch's fraction of the values and takes any batch."""
    first = value[:1].clone()
    values = [float(entry) for entry in first.detach().to(torch.float64).reshape(-1).tolist()]
    if len(values) > MAX_CONSTANT:
        return None
    import dataclasses

    builder.emit(
        "constant",
        {"op": "constant", "in": like, "values": values, "shape": list(first.shape)},
        dataclasses.replace(made, result=first),
    )
    values = (value.shape[0], *[-1] * (value.dim() - 1))
    expand_layer(
        builder,
        first,
        values,
        Call("expand", torch.Tensor.expand, (first, *values), {}, value, made.where, made.module, made.leaf),
    )
    found = builder.node(value)
    return found if isinstance(found, str) else None


def _tensors(call: "Call"):
    for item in [*call.arguments, *call.keywords.values()]:
        for entry in item if isinstance(item, (list, tuple)) else [item]:
            if isinstance(entry, torch.Tensor):
                yield entry


def at_full_precision(spec: dict, module, function, run) -> None:
    """The ``constant`` layers' values as a float64 run computes them, where the trace ran in another
    dtype (a float32 model's ``torch.ones(..., dtype=x.dtype) / 9`` is 1/9 rounded to float32; the spec
    holds the float64 value, and the generated code makes it in the dtype it runs in). ``run(function,
    module)`` runs the trace again (``run_once``) with a float64 copy of the model and float64 inputs; a
    constant the code makes in a fixed dtype (diffusers' ``dtype=torch.float32``, or PyTorch's default
    dtype) is the same in that run, as it is when the model runs in float64. Values stay as traced where
    that run fails or makes other constants."""
    import copy

    layers = [layer for layer in spec["layers"] if layer["op"] == "constant"]
    parameters = list(module.parameters()) + list(module.buffers()) if module is not None else []
    if not layers or (
        parameters and all(value.dtype == torch.float64 for value in parameters if value.is_floating_point())
    ):
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
