"""Randomness the tracer turns into dropout layers: ``F.dropout`` and its kin, and a mask drawn as timm's
DropPath and torchvision's StochasticDepth draw it (``x.new_empty(shape).bernoulli_(keep)``,
``mask.div_(keep)``, ``x * mask``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .dataflow import flat_arguments
from .dispatch import handles
from .recorder import RANDOM
from .torch_names import DROPOUT, PASS_THROUGH

if TYPE_CHECKING:
    from .dispatch import Builder
    from .recorder import Call


@dataclass
class Draws:
    """What ``random_masks`` keeps for one walk."""

    masks: dict[int, dict] = field(default_factory=dict)
    """id of a random mask being drawn (``x.new_empty(shape)``, then ``.bernoulli_(keep)``, ``.div_(keep)``:
    timm's DropPath, torchvision's StochasticDepth) -> {"keep": keep or None before bernoulli_, "scale": bool}."""
    refused: set[int] = field(default_factory=set)
    """The problems of draws no layer makes (:func:`_other_draw`)."""
    count: int = 0
    """The random draws of the forward so far (:func:`drawn`)."""


def _draws(builder: Builder) -> Draws:
    return builder.own("random_masks", Draws)


def random_mask(builder: Builder, call: Call) -> bool:
    """A random mask drawn as timm's DropPath and torchvision's StochasticDepth draw it, and its uses:
    ``x.new_empty(shape)`` / ``torch.empty(shape)``, ``.bernoulli_(keep)``, ``.div_(keep)``, then
    ``x * mask``. True where the call was one of these steps (or refused).

    The mask is drawn where the model draws it: used once, by ``x * mask``, with nothing random drawn
    between the draw and the use, it is one dropout layer there (which draws the same numbers); used
    twice, or otherwise, or after another draw, it is a node of its own at its draw (:func:`_materialise`),
    read by each use as any tensor is, so one draw used twice stays one draw, in the model's order."""
    if _other_draw(builder, call):
        return True
    receiver, drawing = call.arguments[0] if call.arguments else None, _draws(builder).masks
    if call.name in ("new_empty", "empty", "empty_like") and isinstance(call.result, torch.Tensor):
        builder.kept.append(call.result)
        drawing[id(call.result)] = {
            "keep": None,
            "scale": False,
            "made": call,
            "tensor": call.result,
            "from": receiver if isinstance(receiver, torch.Tensor) else None,
        }
        return True
    mask = drawing.get(id(receiver)) if isinstance(receiver, torch.Tensor) else None
    mask = None if mask is not None and "node" in mask else mask  # a node now: read as any tensor
    value = call.arguments[1] if len(call.arguments) > 1 else call.keywords.get("p", call.keywords.get("other"))
    if mask is not None and call.name == "bernoulli_" and mask["keep"] is None and isinstance(value, float):
        count = drawn(builder)
        mask.update(keep=value, drawn=call, position=len(builder.layers), order=count, after=count + 1)
        return True
    if (
        mask is not None
        and call.name in ("div_", "__itruediv__")
        and mask["keep"] is not None
        and not mask["scale"]
        and value == mask["keep"]
        and "used" not in mask
    ):
        mask["scale"] = True
        return True
    if call.name in ("mul", "__mul__", "__rmul__") and len(call.arguments) == 2 and _fused(builder, call):
        return True
    masks = [
        drawing[id(value)]
        for value in flat_arguments(call.arguments, call.keywords)
        if isinstance(value, torch.Tensor) and "node" not in drawing.get(id(value), {"node": None})
    ]
    if not masks:
        return False
    if any(found["keep"] is None for found in masks):
        builder.fail(
            call,
            "uses a random mask otherwise than x * mask after .bernoulli_(keep) and .div_(keep)",
            "draw the mask as timm's drop_path does: x.new_empty(shape).bernoulli_(keep), mask.div_(keep), x * mask",
        )
        return True
    for found in masks:
        if not _materialise(builder, found, call):
            return True
    result = call.result
    if (
        call.name in PASS_THROUGH
        and isinstance(result, torch.Tensor)
        and len(masks) == 1
        and result.dtype == masks[0]["dtype"]
    ):  # noise.to(x.dtype): the node is made in x's dtype
        builder.alias(call, receiver)
        return True
    return False  # read by the call as any node


def _other_draw(builder: Builder, call: Call) -> bool:
    """A random draw no layer makes (``torch.rand``, ``randn_like``, ``normal_``), refused once at its line;
    what is computed from it carries that refusal alone (timm's old ``keep + torch.rand(shape)``, then
    ``floor_()``: one line, at the draw). True where the call was refused or carries that refusal."""
    refused = _draws(builder).refused
    if call.name in RANDOM and call.name not in _MASK_STEPS:
        refused.add(
            builder.fail(
                call,
                "draws random numbers, which no layer of a spec draws but dropout's mask "
                "(x.new_empty(shape).bernoulli_(keep))",
                "draw a drop-path mask as timm's drop_path does, "
                "x.new_empty((x.shape[0], 1, 1, 1)).bernoulli_(keep), then x * mask / keep; or trace the "
                "model in eval mode (--eval), or with the randomness off (drop_path_rate=0)",
            )
        )
        return True
    reasons = [
        found
        for value in flat_arguments(call.arguments, call.keywords)
        if (found := builder.carried(value)) is not None
    ]
    if refused and reasons and all(found <= refused for found in reasons):
        builder.taint(call.result, frozenset().union(*reasons))
        return True
    return False


_MASK_STEPS = frozenset({"new_empty", "empty", "empty_like", "bernoulli_"})
"""The random calls of a mask drawn as timm's drop_path draws it (:func:`random_mask`)."""


def drawn(builder: Builder) -> int:
    """Count one more random draw of the forward (a mask's ``bernoulli_``, a dropout layer); the count before."""
    draws = _draws(builder)
    draws.count += 1
    return draws.count - 1


def _fused(builder: Builder, call: Call) -> bool:
    """``x * mask``, the mask's first use with nothing random drawn since its draw: one dropout layer."""
    first, second = call.arguments
    for source, other in ((first, second), (second, first)):
        drawn_mask = _draws(builder).masks.get(id(other)) if isinstance(other, torch.Tensor) else None
        if (
            drawn_mask is None
            or drawn_mask["keep"] is None
            or not isinstance(source, torch.Tensor)
            or "node" in drawn_mask
            or "used" in drawn_mask
            or _draws(builder).count != drawn_mask["after"]
        ):
            continue
        noise = _noise_kind(tuple(source.shape), tuple(other.shape))
        if (
            noise is None
            or not 0 < drawn_mask["keep"] < 1
            or other.dim() != source.dim()
            or (drawn_mask["scale"] and other.dtype != source.dtype)
            or call.result.dtype != source.dtype
        ):
            continue  # a mask of its own, read by a mul
        count = len(builder.layers)
        builder.layer(
            "dropout",
            {"input": source, "p": _drop_probability(drawn_mask["keep"]), "noise": noise, "scale": drawn_mask["scale"]},
            call,
        )
        if len(builder.layers) > count:
            drawn_mask["used"] = count
        return True
    return False


def _materialise(builder: Builder, mask: dict, call: Call) -> bool:
    """The mask as a node at its draw: ``full`` ones of its shape (each size read from a node), then
    ``dropout`` of them (which draws ``bernoulli_(keep)`` over as many entries, in the same order),
    inserted where the model drew it; a dropout layer made at its first use becomes ``x * mask``.
    False where it was refused (sizes read from no node; scaled in a dtype other than the node's)."""
    tensor, drawn_call = mask["tensor"], mask["drawn"]
    size, like = _sizes(builder, tensor, mask["from"])
    if like is None:
        builder.fail(
            call,
            f"reads a random mask of shape {list(tensor.shape)} whose sizes follow no tensor of the model",
            "draw it per sample, x.new_empty((x.shape[0], 1, 1, 1)), or use it once, x * mask",
        )
        return False
    if mask["scale"] and tensor.dtype != like.dtype:
        builder.fail(
            call,
            f"reads a random mask drawn and scaled in {tensor.dtype} in a {like.dtype} computation, "
            "which the explicit forward draws in the computation's dtype",
            "draw it in x's dtype, x.new_empty(shape).bernoulli_(keep), or divide by keep after .to(x.dtype)",
        )
        return False
    ones, name = builder.out_name("mask_ones", drawn_call, named=False), builder.out_name("mask", drawn_call)
    layers = [
        {"op": "full", "size": size, "fill_value": 1.0, "out": ones},
        {
            "op": "dropout",
            "in": ones,
            "p": _drop_probability(mask["keep"]),
            **({} if mask["scale"] else {"scale": False}),
            "out": name,
        },
    ]
    position = mask["position"]
    for other in _draws(builder).masks.values():  # what was emitted after this draw moves down by two
        if (
            other is not mask
            and "position" in other
            and (other["position"] > position or (other["position"] == position and other["order"] > mask["order"]))
        ):
            other["position"] += 2
        if other.get("used", -1) >= position:
            other["used"] += 2
    builder.layers[position:position] = layers
    builder.layer_calls[position:position] = [drawn_call, drawn_call]
    if "used" in mask:  # drawn at its first use so far: that use reads the node now
        used = builder.layers[mask["used"]]
        builder.layers[mask["used"]] = {"op": "mul", "in": [used["in"], name], "out": used["out"]}
    mask.update(node=name, dtype=like.dtype)
    builder.name(tensor, name)
    return True


def _sizes(builder: Builder, tensor: torch.Tensor, source) -> tuple[list, torch.Tensor | None]:
    """The mask's sizes for ``full``: each ``{like: NODE}`` (or ``{like: NODE, dims: [k]}``) where a node
    the code made it from (``source``) or read the sizes of has that size, 1 where it is 1; and the node
    whose dtype and device it is made in (None where no size follows a node)."""
    known = [source] if isinstance(source, torch.Tensor) else []
    known = [other for other in known + list(reversed(builder.sizes_read)) if isinstance(builder.node(other), str)]
    if known and isinstance(source, torch.Tensor) and known[0] is source and source.shape == tensor.shape:
        # a dict per size: one dict written n times is a YAML alias, which a spec refuses
        return [{"like": builder.node(source)} for _ in range(tensor.dim())], source
    size: list = []
    like = None
    for dim, length in enumerate(tensor.shape):
        same = next((other for other in known if other.dim() == tensor.dim() and other.shape[dim] == length), None)
        anywhere = next(((other, k) for other in known for k in range(other.dim()) if other.shape[k] == length), None)
        if length == 1 and not (same is not None and same is source):
            size.append(1)
        elif same is not None:
            size.append({"like": builder.node(same)})
        elif anywhere is not None:
            size.append({"like": builder.node(anywhere[0]), "dims": [anywhere[1]]})
        else:
            size.append(int(length))
        if isinstance(size[-1], dict) and like is None:
            like = same if same is not None else anywhere[0]
    return size, like


@handles(*DROPOUT)
def dropout(builder: Builder, call: Call) -> None:
    keywords = dict(zip(("input", "p", "training", "inplace"), call.arguments)) | call.keywords
    if not keywords.get("training", True) or keywords.get("p", 0.5) == 0:
        return builder.alias(call, keywords["input"])
    source, p = keywords["input"], keywords.get("p", 0.5)
    rank = {"dropout1d": 3, "dropout2d": 4, "dropout3d": 5}.get(call.name)
    if call.name in ("dropout", *(() if rank is None else (call.name,))) and isinstance(p, float) and 0 < p < 1:
        if rank is not None and source.dim() != rank:
            return builder.fail(
                call,
                f"of an input of rank {source.dim()}, not {rank} (batched)",
                f"pass a batched input of rank {rank}, as nn.{call.name.capitalize()} expects",
            )
        arguments = {"input": source, "p": p, **({"noise": "channel"} if rank is not None else {})}
        drawn(builder)
        return builder.layer("dropout", arguments, call)
    builder.fail(
        call,
        "is random in training mode, so its gradient is not a function of the inputs",
        "trace the model in eval mode (--eval) or with p=0",
    )


def _noise_kind(shape: tuple, mask: tuple) -> str | None:
    """Which dropout mask ``mask`` is for an input of ``shape``: one entry per element, per sample and
    channel, per sample, or one for the batch; None if it is none of these."""
    rank = len(shape)
    if mask == shape:
        return "element"
    if rank >= 2 and mask == (*shape[:2], *[1] * (rank - 2)):
        return "channel"
    if rank >= 1 and mask == (shape[0], *[1] * (rank - 1)):
        return "row"
    if mask == (1,) * rank:
        return "batch"
    return None


def _drop_probability(keep: float) -> float:
    """The p whose ``1 - p`` is ``keep`` exactly (the generated code draws with ``1 - p``), written as
    briefly as it can be (0.3, not the 0.30000000000000004 that 1 - 0.7 gives)."""
    for digits in range(1, 18):
        p = round(1 - keep, digits)
        if 1 - p == keep:
            return p
    return 1 - keep
