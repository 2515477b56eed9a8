"""What the traced forward read that a program can change between calls of a bound model, checked at
each call (``bind`` checks the same once, by the guards' hashes: :func:`code_difference`):

* module constants, a helper module's attributes and closure variables (``GUARDS["values"]``: ``SLOPE``
  read by ``Net.forward``, ``helpers.GAIN``, a closure's ``slope``), a dict or list among them by its
  entries (``CFG["slope"] = 0.3`` in place);
* the functions it called by name (``GUARDS["code"]``'s paths): a helper replaced at module level
  (``net.inner = other``, ``helpers.act = torch.sigmoid``);
* class attributes of the model's submodules that its code reads (``self.BIAS``), set on the class or
  shadowed on an instance;
* a ``forward`` set on the model or a submodule instance (``model.forward = ...``).

A change is refused at the next call in one line, as the generated code computes with what was traced.
The common case, nothing changed, is a comparison of one tuple of objects by identity and one of the
containers' texts; a value made anew but equal (``net.SLOPE = 0.1`` again) is taken as it is. Defaults
(``def f(x, slope=0.1)``) and code edited in a file are checked at ``bind`` alone."""

from __future__ import annotations

import copy
import types
from typing import Any

import torch

from .guards import MISSING, function_guard, literal_or_text, resolved, shown, value_text

_LITERALS = (bool, int, float, str, type(None))


class ValueGuard:
    """The values and functions the traced forward read, as bound, by where each one lives now."""

    def __init__(self, guards: dict | None, model):
        guards = guards or {}
        values, codes = guards.get("values") or {}, guards.get("code") or {}
        functions = resolved(model, codes) if codes else {}
        self._places: list[tuple[Any, str, str, Any]] = []  # (dict, cell or module, name, shown as, traced)
        for key, traced in values.items():
            path, _, name = key.rpartition("/")
            place = _place(functions.get(path), name)
            if place is not None:
                self._places.append((*place, f"{name} (read by {functions[path].__qualname__})", traced))
        for path, function in functions.items():  # a function called by its name: the same object
            before, _, step = path.rpartition("/")
            place = _place(functions.get(before), step) if before and function is not None else None
            if place is not None and _get(*place) is function:
                self._places.append((*place, f"{step} (called by {functions[before].__qualname__})", function))
        self._class_attributes(model, functions)
        self._containers = [
            index
            for index, (_, _, _, traced) in enumerate(self._places)
            if isinstance(_get(*self._places[index][:2]), (dict, list, set))
        ]
        self._texts = tuple(value_text(_get(*self._places[index][:2])) for index in self._containers)
        self._bound = self._now()
        self._instances = tuple(vars(module) for module in model.modules())
        self._patched = tuple("forward" in found for found in self._instances)

    def __deepcopy__(self, memo):
        """A copy for a copy of the bound model (``copy.deepcopy(fast)``, an EMA of it): the copied
        model's submodules and their ``vars``, and the same module globals and closure cells, as a
        copied function shares its globals (a module's namespace cannot be copied)."""
        copied = copy.copy(self)
        copied._places = [
            (copy.deepcopy(place, memo) if hasattr(place, "_modules") else place, *rest)
            for place, *rest in self._places
        ]
        copied._instances = tuple(copy.deepcopy(found, memo) for found in self._instances)
        return copied

    def _class_attributes(self, model, functions: dict) -> None:
        """``self.NAME`` the code reads where NAME is a literal class attribute of a submodule's class."""
        read = set().union(*(function.__code__.co_names for function in functions.values() if function is not None))
        for path, module in model.named_modules():
            for klass in type(module).__mro__:
                if klass.__module__.split(".")[0] in ("torch", "builtins"):
                    break
                for name, value in vars(klass).items():
                    if (
                        name in read
                        and not name.startswith("__")
                        and isinstance(value, _LITERALS)
                        and name not in vars(module)
                    ):
                        self._places.append(
                            (
                                module,
                                name,
                                f"{type(module).__name__}.{name} ({path or 'the model'})",
                                literal_or_text(value),
                            )
                        )

    def _now(self) -> tuple:
        return tuple(_get(place, name) for place, name, _, _ in self._places)

    def problem(self) -> str | None:
        """What differs from what was traced, in words ending in its fix; None where nothing does."""
        now = self._now()
        if (
            not all(a is b for a, b in zip(now, self._bound))
            or tuple(value_text(now[index]) for index in self._containers) != self._texts
        ):
            found = self._changed(now)
            if found:
                return found
            self._bound = now  # equal values made anew: compared by identity from here on
            self._texts = tuple(value_text(now[index]) for index in self._containers)
        if tuple("forward" in found for found in self._instances) != self._patched:
            return (
                "a forward was set on the model or a submodule since bind, which the generated code does not "
                "run (fix: remove it"
            )
        return None

    def _changed(self, now: tuple) -> str | None:
        for value, (_, name, what, traced) in zip(now, self._places):
            if callable(traced) and not isinstance(traced, type):
                if value is not traced:
                    return f"{what} was replaced since bind (fix: set it back"
            elif value is MISSING or (text := literal_or_text(value)) != traced or type(text) is not type(traced):
                was = traced if isinstance(traced, str) and not isinstance(value, str) else repr(traced)
                return (
                    f"{what} is {shown(value) if value is not MISSING else 'gone'} now, and the code was traced "
                    f"with {name.split('.')[-1]}={was:.60} (fix: set it back"
                )
        return None


def code_difference(guards: dict, model: torch.nn.Module) -> str | None:
    """The first function of the model's code, or value it reads, that differs from what the trace
    called and read (``guards``: :func:`parse_guards`'s), in words; None where none does."""
    if not guards or not guards.get("code"):
        return None
    found, traced_values = resolved(model, guards["code"]), guards.get("values", {})
    # the deepest first: a caller's hash holds its callees' code, so the function edited is the deepest that differs
    for path, traced in sorted(guards["code"].items(), key=lambda item: -item[0].count("/")):
        function = found.get(path)
        if function is None:
            return (
                f"{path}, which the forward called when traced, is no longer reached from the model (its code changed)"
            )
        now, values = function_guard(function)
        if now == traced:
            continue
        for name, value in values.items():
            before = traced_values.get(f"{path}/{name}", ...)
            if before is not ... and before != value:
                shown_as = _parameter(function, name)
                return f"{shown_as} (read by {function.__qualname__}) is {value!r}, traced with " + (
                    f"{before!r}" if shown_as != name else f"{name}={before!r}"
                )
        where = "" if path == function.__qualname__ else f" ({path})"
        return f"the code of {function.__qualname__}{where}, which the forward calls, changed since it was traced"
    return None


def _parameter(function, name: str) -> str:
    """``default0``, ``default_key`` (:func:`guards._reads`'s names) as the parameter whose default
    it is; another name as it is."""
    code, defaults = function.__code__, function.__defaults__ or ()
    positional = code.co_varnames[: code.co_argcount]
    if name.startswith("default") and name[7:].isdigit() and int(name[7:]) < len(defaults):
        return f"the default of {positional[len(positional) - len(defaults) + int(name[7:])]}"
    if name.startswith("default_") and name[8:] in (function.__kwdefaults__ or {}):
        return f"the default of {name[8:]}"
    return name


def _get(place, name: str) -> Any:
    if isinstance(place, dict):
        return place.get(name, MISSING)
    if isinstance(place, types.CellType):
        try:
            return place.cell_contents
        except ValueError:  # emptied since
            return MISSING
    return getattr(place, name, MISSING)


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
