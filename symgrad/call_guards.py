"""Guards checked at each call of a bound model: a hyper-parameter as bound (:func:`kept`,
:func:`first_changed`), and the traced forward's non-tensor arguments (:class:`ArgumentGuard`,
:func:`traced_arguments`), read from the spec's ``guards:`` that :mod:`symgrad.guards` writes."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .guards import MISSING, literal_or_text, shown, value_text


def kept(value: Any) -> Any:
    """``value`` as bound, for comparing at each call: a container deep-copied (an entry set in place
    after bind, ``self.cfg["gain"] = 0.3``, then differs), anything else itself."""
    if isinstance(value, (dict, list, set)) or (isinstance(value, tuple) and not hasattr(value, "_fields")):
        if "<" in (value_text(value) or "<"):  # holds a tensor, a module, an object: compared by its text
            return value
        try:
            import copy

            return copy.deepcopy(value)
        except Exception:  # noqa: BLE001 - a value that cannot be copied is compared by its text
            return value
    return value


def same(now: Any, value: Any) -> bool:
    """Whether a hyper-parameter read now is the one bound: the same object, equal (a value whose
    comparison gives no single truth value, such as a tensor of several elements, is not), or of the
    same :func:`value_text` (an equal ``functools.partial`` made anew)."""
    if now is value:
        return True
    try:
        if bool(now == value):
            return True
    except (RuntimeError, TypeError, ValueError):  # no single truth value (a tensor inside): by text
        pass
    if now is MISSING or isinstance(now, (int, float, str, bool, type(None))):
        return False
    text = value_text(now)
    return text is not None and not text.startswith("<") and text == value_text(value)


def first_changed(hypers: list) -> tuple[tuple | None, bool]:
    """The first of ``hypers`` (``[path, module, key, value]`` entries) whose attribute differs now, as
    (path, module, key, value, now), or None; and whether an entry equal by its text alone was taken
    as it is now (so that a comparison by ``==`` finds it unchanged at the next call)."""
    refreshed = False
    for index, (path, module, key, value) in enumerate(hypers):
        now = getattr(module, key, MISSING)
        if now is value:
            continue
        if not same(now, value):
            return (path, module, key, value, now), refreshed
        if not _equal(now, value):
            hypers[index] = (path, module, key, kept(now))
            refreshed = True
    return None, refreshed


def _equal(now, value) -> bool:
    try:
        return bool(now == value)
    except (RuntimeError, TypeError, ValueError):
        return False


class ArgumentGuard:
    """The traced forward's non-tensor arguments (``GUARDS["arguments"]``), checked at each call of a
    bound model: a value other than traced, a tensor where the trace had ``None``, or ``None`` where
    it had a tensor is refused, as the generated code computes what was traced."""

    def __init__(self, traced: dict, signature: inspect.Signature, data_arguments: tuple):
        parameters = signature.parameters
        self._checked = tuple(
            (
                name,
                value,
                MISSING
                if name not in parameters or parameters[name].default is inspect.Parameter.empty
                else parameters[name].default,
            )
            for name, value in traced.items()
        )
        self._data = data_arguments

    def problem(self, arguments: dict) -> tuple[str, tuple | None] | None:
        """What differs in ``arguments`` (the call's, by name, defaults not applied), in words ending in the
        first fix, with the ``symgrad trace`` option that traces the call as it is ((flag, name, value),
        value None: left out), or None where that cannot be written; None where nothing differs."""
        for name, traced, default in self._checked:
            now = arguments.get(name, default)
            if now is MISSING or _matches(now, traced):
                continue
            if traced is None and isinstance(now, torch.Tensor):
                shape = ",".join(map(str, now.shape))
                return (
                    f"{name} is a tensor, and the trace ran without it ({name}=None), so the generated code "
                    f"never reads it (fix: call it without {name}"
                ), ("--input", name, shape)
            plain = now is None or type(now) in (bool, int, float, str)
            option = (
                (
                    "null"
                    if now is None
                    else now
                    if isinstance(now, str)
                    else str(now).lower()
                    if isinstance(now, bool)
                    else repr(now)
                )
                if plain
                else None
            )  # as --arg reads it (YAML)
            return (
                f"it is called with {name}={shown(now):.80}, and was traced with {name}={traced!r:.80} (fix: "
                f"call it with {name}={traced!r:.60}"
            ), option and ("--arg", name, option)
        for name in self._data:
            if name in arguments and arguments[name] is None:
                return (f"{name} is None, and the trace had a tensor there (fix: pass {name}"), ("--input", name, None)
        return None


def traced_arguments(generated, model: torch.nn.Module) -> dict[str, Any]:
    """The forward's non-tensor arguments a call must give to run as traced: those traced with another
    value than their default (``--arg scale=2.0``), as YAML read them (a literal: passed as it is)."""
    traced = (getattr(generated, "GUARDS", None) or {}).get("arguments", {})
    parameters = inspect.signature(model.forward).parameters
    return {
        name: value
        for name, value in traced.items()
        if name in parameters
        and parameters[name].kind not in (parameters[name].VAR_POSITIONAL, parameters[name].VAR_KEYWORD)
        and not _matches(parameters[name].default, value)
    }


def _matches(now, traced) -> bool:
    if traced is None or now is None:
        return now is traced
    if isinstance(now, torch.Tensor):
        return False
    found = literal_or_text(now)
    return (
        found == traced
        and type(found) is type(traced)
        or (
            isinstance(found, (int, float))
            and isinstance(traced, (int, float))
            and not isinstance(found, bool)
            and not isinstance(traced, bool)
            and found == traced
        )
    )
