"""A model's train and eval modes, submodule by submodule, as the user set them.

Fine-tuning often freezes part of a model: ``model.train(); model.backbone.eval()``, so that the
backbone's BatchNorm normalises with its running statistics and moves none of them. ``symgrad trace``
without ``--train``/``--eval`` traces the model so (``trace_modes``), and ``--modes backbone=eval`` sets
such a combination from the command line (:func:`apply_modes`). ``symgrad.bind`` compares each
submodule whose code reads ``self.training`` with the mode it was traced in (the fingerprint's
``training``), and :func:`mode_refusal` words the one-line refusal where they differ: the submodules,
and the ``--modes`` that traces the model as it is now (:func:`modes_option`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

SHOWN = 3
"""How many submodules a refusal names before ``and N more``."""
AS_THE_CLASS_SETS = " "
"""The mode options a refusal's command gives to trace a model that returns outputs in both modes: none
(``--train``, ``--eval`` and ``--modes`` dropped from the traced options), the modes as its class sets them."""


def apply_modes(model, text: str, evaluation: bool = False) -> None:
    """Set ``model``'s modes from ``--modes`` ``text`` (``backbone=eval,backbone.layer4=train``): the whole
    model in train mode (eval mode with ``evaluation``: ``--eval``), then each entry in order, as
    ``model.get_submodule(PATH).train()`` or ``.eval()`` sets it with its own submodules."""
    from .trace.errors import TraceError

    if not isinstance(model, torch.nn.Module):
        raise TraceError(
            f"error: --modes sets the modes of an nn.Module's submodules, and {model!r:.60} is not "
            "one (fix: trace an nn.Module class, or drop --modes)"
        )
    entries = []
    for item in (part.strip() for part in text.split(",")):
        path, _, mode = item.rpartition("=")
        if mode not in ("train", "eval") or not path:
            raise TraceError(
                f"error: --modes {item!r} is not PATH=train or PATH=eval (fix: write e.g. --modes backbone=eval)"
            )
        try:
            entries.append((model.get_submodule(path), mode))
        except AttributeError:
            children = ", ".join(name for name, _ in model.named_children()) or "none"
            raise TraceError(
                f"error: --modes names {path}, which is no submodule of {type(model).__name__} (fix: name "
                f"a submodule by its path, as model.get_submodule takes it; its children: {children})"
            ) from None
    model.train(not evaluation)
    for module, mode in entries:
        module.train(mode == "train")


def modes_option(model: torch.nn.Module) -> str:
    """The ``symgrad trace`` options that set ``model``'s modes as they are now: ``--eval`` where its root is
    in eval mode (``--train`` where nothing else is said), and ``--modes`` naming each submodule whose mode
    differs from its parent's, parents first (:func:`apply_modes` sets them in that order)."""
    modules = dict(model.named_modules(remove_duplicate=False))
    entries = [
        f"{path}={'train' if module.training else 'eval'}"
        for path, module in modules.items()
        if path and module.training != modules[path.rpartition(".")[0]].training
    ]
    flag = "" if model.training else " --eval"
    if not entries:
        return flag or " --train"
    return f"{flag} --modes {','.join(entries)}"


def mode_refusal(
    name: str,
    wrong: list[tuple[str, torch.nn.Module, bool]],
    traced: list,
    model: torch.nn.Module,
    retrace: Callable[[str], str],
    both_modes: bool = False,
) -> str:
    """The one-line refusal of a model whose submodules in ``wrong`` (path, module, traced mode) are not in the mode
    they were traced in; ``traced``: every mode-reading submodule as traced; ``retrace(options)``: the
    commands that trace and generate the model with those options; ``both_modes``: the module ends in
    outputs, where a trace without ``--train``/``--eval`` writes both modes. Where the model is wholly in
    the other mode from a module traced in one (``model.eval()`` after a train-mode trace), that is said."""
    modes = {training for _, _, training in traced}
    now = {module.training for module in model.modules()}
    if len(wrong) == len(traced) and len(modes) == 1 and now == {not next(iter(modes))}:
        was, is_now = ("train", "eval") if modes.pop() else ("eval", "train")
        other = (
            f"trace without --train/--eval, which traces both modes, and generate both: {retrace(AS_THE_CLASS_SETS)}"
            if both_modes and is_now == "eval"  # its train spec: as the class sets it
            else f"trace and generate the model as it is now: {retrace(modes_option(model))}"
        )
        return (
            f"{name} was traced in {was} mode{' only' if both_modes else ''}, and the model is now in {is_now} "
            f"mode (fix: call model.{was}(), or {other})"
        )
    parts = []
    for training in (True, False):
        paths = [f"{path or 'the model'} ({type(module).__name__})" for path, module, was in wrong if was == training]
        if paths:
            more = f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else ""
            parts.append(f"{', '.join(paths[:SHOWN])}{more} in {'train' if training else 'eval'} mode")
    one = len(wrong) == 1
    directions = {was for _, _, was in wrong}
    if len(directions) == 1:
        was = "train" if directions.pop() else "eval"
        now_mode = "eval" if was == "train" else "train"
        root = "train" if model.training else "eval"  # where model.train() (or .eval()) put them there
        setback = f"call .{was}() on {'it' if one else 'them'}{f' after model.{root}()' if root != was else ''}"
        state = f"{'it is' if one else 'they are'} now in {now_mode} mode"
    else:
        setback = "put each back in the mode it was traced in"
        state = "each is now in the other mode"
    return (
        f"{name} was traced with {' and '.join(parts)}, and {state} (fix: {setback}, or trace and generate the "
        f"model as it is now: {retrace(modes_option(model))})"
    )
