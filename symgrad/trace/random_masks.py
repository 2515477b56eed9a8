"""Randomness the tracer turns into dropout layers: ``F.dropout`` and its kin, and a mask drawn as timm's
DropPath and torchvision's StochasticDepth draw it (``x.new_empty(shape).bernoulli_(keep)``,
``mask.div_(keep)``, ``x * mask``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .dataflow import flat_arguments

if TYPE_CHECKING:
    from .layers import SpecBuilder
    from .recorder import Call


def random_mask(builder: SpecBuilder, call: Call) -> bool:
    """A random mask drawn as timm's DropPath and torchvision's StochasticDepth draw it, and its use:
    ``x.new_empty(shape)`` / ``torch.empty(shape)``, ``.bernoulli_(keep)``, ``.div_(keep)``, then
    ``x * mask``, which is one dropout layer. True where the call was one of these steps."""
    receiver = call.arguments[0] if call.arguments else None
    if call.name in ("new_empty", "empty", "empty_like") and isinstance(call.result, torch.Tensor):
        builder.kept.append(call.result)
        builder.masks[id(call.result)] = {"keep": None, "scale": False}
        return True
    mask = builder.masks.get(id(receiver)) if isinstance(receiver, torch.Tensor) else None
    value = call.arguments[1] if len(call.arguments) > 1 else call.keywords.get("p", call.keywords.get("other"))
    if mask is not None and call.name == "bernoulli_" and mask["keep"] is None and isinstance(value, float):
        mask["keep"] = value
        return True
    if mask is not None and call.name in ("div_", "__itruediv__") and mask["keep"] is not None and not mask["scale"] \
            and value == mask["keep"]:
        mask["scale"] = True
        return True
    if call.name in ("mul", "__mul__", "__rmul__") and len(call.arguments) == 2:
        first, second = call.arguments
        for source, other in ((first, second), (second, first)):
            drawn = builder.masks.get(id(other)) if isinstance(other, torch.Tensor) else None
            if drawn is None or drawn["keep"] is None or not isinstance(source, torch.Tensor):
                continue
            noise = _noise_kind(tuple(source.shape), tuple(other.shape))
            if noise is None or not 0 < drawn["keep"] <= 1 or other.dim() != source.dim():
                builder.fail(call, f"multiplies by a random mask of shape {list(other.shape)}, which is no dropout "
                             f"mask of an input {list(source.shape)}", "draw the mask per element, per sample and "
                             "channel, per sample or per batch, as nn.Dropout, timm's DropPath and torchvision's "
                             "StochasticDepth do")
                return True
            if drawn["keep"] == 1:
                builder.alias(call, source)
                return True
            builder.layer("dropout", {"input": source, "p": _drop_probability(drawn["keep"]), "noise": noise,
                                      "scale": drawn["scale"]}, call)
            return True
    if mask is not None or any(id(value) in builder.masks for value in flat_arguments(call.arguments, call.keywords)
                               if isinstance(value, torch.Tensor)):
        builder.fail(call, "uses a random mask otherwise than x * mask after .bernoulli_(keep) and .div_(keep)",
                     "draw the mask as timm's drop_path does: x.new_empty(shape).bernoulli_(keep), "
                     "mask.div_(keep), x * mask")
        return True
    return False


def dropout(builder: SpecBuilder, call: Call) -> None:
    keywords = dict(zip(("input", "p", "training", "inplace"), call.arguments)) | call.keywords
    if not keywords.get("training", True) or keywords.get("p", 0.5) == 0:
        return builder.alias(call, keywords["input"])
    source, p = keywords["input"], keywords.get("p", 0.5)
    rank = {"dropout1d": 3, "dropout2d": 4, "dropout3d": 5}.get(call.name)
    if call.name in ("dropout", *(() if rank is None else (call.name,))) and isinstance(p, float) and 0 < p < 1:
        if rank is not None and source.dim() != rank:
            return builder.fail(call, f"of an input of rank {source.dim()}, not {rank} (batched)",
                                f"pass a batched input of rank {rank}, as nn.{call.name.capitalize()} expects")
        arguments = {"input": source, "p": p, **({"noise": "channel"} if rank is not None else {})}
        return builder.layer("dropout", arguments, call)
    builder.fail(call, "is random in training mode, so its gradient is not a function of the inputs",
                 "trace the model in eval mode (--eval) or with p=0")


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
