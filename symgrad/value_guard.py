"""Module constants, module attributes and closure variables the traced forward read, checked at each call
of a bound model (``GUARDS["values"]``: ``SLOPE`` read by ``Net.forward``, ``helpers.GAIN``, a closure's
``slope``). ``bind`` compares them with the traced values once (``guards.code_difference``); a value set
between calls (``net.SLOPE = 0.3`` in a schedule, a ``nonlocal`` written) is refused at the next call, as
the generated code computes with the traced value. The common case, nothing changed, is one comparison of
a tuple of objects by identity; a value made anew but equal (``net.SLOPE = 0.1`` again) is taken as it
is. Defaults (``def f(x, slope=0.1)``) and the code itself are checked at ``bind`` alone."""

from __future__ import annotations

import types
from typing import Any

from .guards import MISSING, literal_or_text, resolved, shown


class ValueGuard:
    """The literal values the traced forward's functions read, as bound, by where each one lives now."""

    def __init__(self, guards: dict | None, model):
        values = (guards or {}).get("values") or {}
        functions = resolved(model, (guards or {}).get("code") or {}) if values else {}
        self._places: list[tuple[Any, str, str, Any]] = []  # (dict or cell, name, shown as, traced)
        for key, traced in values.items():
            path, _, name = key.rpartition("/")
            place = _place(functions.get(path), name)
            if place is not None:
                self._places.append((*place, f"{name} (read by {functions[path].__qualname__})", traced))
        self._bound = self._now()

    def _now(self) -> tuple:
        return tuple(place.get(name, MISSING) if isinstance(place, dict) else _contents(place)
                     for place, name, _, _ in self._places)

    def problem(self) -> str | None:
        """What differs from the traced values, in words ending in its fix; None where nothing does."""
        if not self._places:
            return None
        now = self._now()
        if all(a is b for a, b in zip(now, self._bound)):
            return None
        for value, (_, name, what, traced) in zip(now, self._places):
            if value is MISSING or literal_or_text(value) != traced or type(literal_or_text(value)) is not type(traced):
                return (f"{what} is {shown(value) if value is not MISSING else 'gone'} now, and the code was traced "
                        f"with {name.split('.')[-1]}={traced!r:.60} (fix: set it back")
        self._bound = now  # equal values made anew: compared by identity from here on
        return None


def _place(function, name: str) -> tuple[Any, str] | None:
    """Where ``function``'s read ``name`` lives: (its globals, name), (a global module's vars, attribute) for
    ``module.attribute``, (the closure cell, name); None for a default or what is not found."""
    if not isinstance(function, types.FunctionType):
        return None
    if name in function.__code__.co_freevars:
        return function.__closure__[function.__code__.co_freevars.index(name)], name
    scope = function.__globals__
    if name in scope:
        return scope, name
    module, _, attribute = name.partition(".")
    if attribute and isinstance(scope.get(module), types.ModuleType):
        return vars(scope[module]), attribute
    return None


def _contents(cell) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # emptied since
        return MISSING
