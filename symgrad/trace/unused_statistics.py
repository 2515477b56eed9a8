"""Running statistics moved by a call whose output reaches no output: refused at trace time.

A BatchNorm (or an InstanceNorm that tracks its statistics) in training mode moves its running
statistics whenever it runs, used or not. The generated step computes only what reaches the loss
or the outputs, so a normalization whose output is dropped (smp's ``tu-`` encoders at a small
encoder_depth run timm's last blocks and discard their features) would keep its statistics where
autograd's step moves them: the bound model silently stops being the model. Dead branches that
write no buffer (a Dropout, a conv) change nothing the step keeps and are left alone.
"""

from __future__ import annotations

import keyword

import torch

from .errors import Refusal
from .recorder import Call

CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)


def moves_statistics(layer: dict) -> bool:
    """Whether the layer updates running statistics when it runs (the rule's own test, norm.py)."""
    if "running_mean" not in layer:
        return False
    if layer["op"] == "batch_norm":
        return bool(layer.get("training"))
    if layer["op"] == "instance_norm":
        return bool(layer.get("use_input_stats", True))
    return False


def refuse_unused_statistics(
    layers: list[dict], live: list[dict], calls: list[Call], modules: dict[str, torch.nn.Module]
) -> None:
    """Refuse, in one line, the first call that moves running statistics and reaches no output."""
    kept = {id(layer) for layer in live}
    dead = [(call, layer) for call, layer in zip(calls, layers) if id(layer) not in kept and moves_statistics(layer)]
    if not dead:
        return
    used = set()  # every module a live layer ran inside, with its ancestors
    for call, layer in zip(calls, layers):
        if id(layer) in kept:
            parts = call.module.split(".") if call.module else []
            used.update(".".join(parts[:count]) for count in range(len(parts) + 1))
    tops: list[str] = []  # outermost modules running nothing live: eval() there moves no live value
    for call, _ in dead:
        top = _outermost_unused(call.module, used, modules)
        if top is None:
            tops = []
            break
        if top not in tops:
            tops.append(top)
    call, layer = dead[0]
    kind = type(modules[call.module]).__name__ if call.module in modules else layer["op"]
    named = f"{call.module} ({kind})" if call.module else f"a {layer['op']}"
    more = "" if len(dead) == 1 else f", and {len(dead) - 1} more" + (f" under {', '.join(tops)}" if tops else "")
    example = "; ".join(f"{_expression(top)}.eval()" for top in tops) if tops else ""
    option = ",".join(f"{top}=eval" for top in tops)
    fix = (
        (
            f"put it in eval mode before tracing and training, e.g. {example} (symgrad "
            f"trace: --modes {option}), so that autograd does not move its statistics either, or "
            "remove the modules whose output is unused"
        )
        if example
        else (
            "remove the call whose output is unused, or put the module in eval mode before tracing "
            "and training where all its calls are unused"
        )
    )
    raise Refusal(
        f"{call.where}: error: {named} runs in training mode and its output reaches no "
        "output or loss, so autograd's step moves its running statistics and the bound "
        f"step, which computes only what reaches them, would not{more} (fix: {fix})"
    )


def _outermost_unused(path: str, used: set[str], modules: dict[str, torch.nn.Module]) -> str | None:
    """The outermost module holding ``path`` that ran no live layer, or None where ``path`` itself
    did; a ModuleList or ModuleDict, which has no forward of its own, is not climbed past
    (``blocks[5]``, not ``blocks``)."""
    if not path or path in used:
        return None
    parts = path.split(".")
    while (
        len(parts) > 1
        and ".".join(parts[:-1]) not in used
        and not isinstance(modules.get(".".join(parts[:-1])), CONTAINERS)
    ):
        parts.pop()
    return ".".join(parts)


def _expression(path: str) -> str:
    """``model.encoder.blocks[5]`` for ``encoder.blocks.5``; get_submodule where a part is not a
    name."""
    text = "model"
    for part in path.split("."):
        if part.isdigit():
            text += f"[{part}]"
        elif part.isidentifier() and not keyword.iskeyword(part):
            text += f".{part}"
        else:
            return f'model.get_submodule("{path}")'
    return text
