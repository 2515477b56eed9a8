"""The container a model's forward returns, kept so that a bound model returns the same: a ``list``, a
``namedtuple`` (``collections.namedtuple``, ``typing.NamedTuple``) or a ``dict`` subclass (``OrderedDict``,
``transformers.utils.ModelOutput``, whose keys are attributes too: ``fast(x).logits``). A plain tuple,
dict or tensor needs no entry. The trace records the type the forward's frame returned
(``guards.CallRecorder``) as the guards' ``output`` entry, ``{type: list}`` or ``{type: namedtuple,
class: MODULE:QUALNAME}`` / ``{type: mapping, class: ...}``; ``symgrad.bind`` finds the class again by its
module and name, or refuses in one line (a class made inside a function has no name to find it by)."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable
from typing import Any


def output_entry(returned: type | None, model: object) -> dict[str, str]:
    """The guards' ``output`` entry for a forward that returned an object of type ``returned``; a class of
    the model's own module is written ``:QUALNAME`` (found again in the module the bound model's class is
    in, whatever name that module was imported under: ``symgrad trace net.py:Net`` or ``from net import Net``)."""
    if returned is None or returned in (tuple, dict):
        return {}
    if returned is list:
        return {"type": "list"}
    module = "" if returned.__module__ == type(model).__module__ else returned.__module__
    name = f"{module}:{returned.__qualname__}"
    if issubclass(returned, tuple) and hasattr(returned, "_fields"):
        return {"type": "namedtuple", "class": name}
    if issubclass(returned, dict) or dataclasses.is_dataclass(returned):  # made again of its keys
        return {"type": "mapping", "class": name}
    return {}


def rebuilder(entry: dict | None, model: object, where: str) -> Callable[[str, list, tuple], Any] | None:
    """``make(kind, outputs, keys)``: the model's container of the outputs, for the guards' ``output``
    entry (None: the plain tuple, dict or tensor); ``LookupError`` saying why where its class cannot be
    found (``symgrad.bind`` refuses with it)."""
    if not entry:
        return None
    if entry.get("type") == "list":
        return lambda kind, outputs, keys: list(outputs)
    module_name, _, qualname = str(entry.get("class", "")).partition(":")
    module_name = module_name or type(model).__module__
    found: Any = sys.modules.get(module_name)
    try:
        found = found if found is not None else importlib.import_module(module_name)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError):
        found = None
    if not isinstance(found, type):
        plain = "tuple" if entry.get("type") == "namedtuple" else "dict"
        raise LookupError(  # noqa: TRY004 - not found by its name: bind refuses it as a BindError
            f"{where}: the model returns an instance of {qualname}, a class bind cannot find again by its module "
            f"and name ({module_name}), so it would return a plain {plain} (fix: define {qualname.split('.')[-1]} "
            "at the top level of its module, trace and generate again)"
        )
    if entry.get("type") == "namedtuple":
        return lambda kind, outputs, keys: found(*outputs)
    return lambda kind, outputs, keys: found(**dict(zip(keys, outputs)))
