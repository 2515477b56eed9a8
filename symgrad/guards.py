"""Guards from the trace: the Python values a traced forward read, checked where ``symgrad.bind`` binds.

As TorchDynamo guards a compiled graph, ``symgrad trace`` records, beside the per-submodule
``fingerprint`` (classes, hyper-parameters, shapes), what else decided the computation:

* ``code``: every Python function of the model's own code that the forward called, found while it ran
  (``sys.setprofile``), transitively, each named by the way it is reached from the model
  (``Net.forward/helper/helpers.act``: a method, then the global ``helper`` it reads, then the module
  attribute ``helpers.act`` that one reads) and hashed from its code object (instructions, constants,
  names, defaults) with every global, module attribute and closure cell it reads: a helper called by a
  helper, a module constant, a closure variable and a class made by ``exec`` are all guarded, and no
  source file is needed;
* ``values``: those reads that are short literals (``Net.forward/SLOPE: 0.1``), so that a refusal names
  the value with its traced and current value;
* ``arguments``: the forward's non-tensor arguments as traced (``scale: 1.0``), and ``None`` for each
  optional tensor it ran without; a bound model refuses a call that differs.

Values that are not literals (a dict, a nested list, a ``functools.partial``, an ``Enum``, a function)
are guarded by :func:`value_text`, a text that is the same in another process (hashed where long).
Their checks at each call of a bound model are :mod:`symgrad.call_guards`.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import math
import os
import re
import sys
import sysconfig
import types
from typing import Any

import torch

from .output_types import output_entry

MAX_TEXT = 200
PATH = re.compile(r"[A-Za-z0-9_.<>:#/@-]{1,300}\Z")
HASH = re.compile(r"[0-9a-f]{16}\Z")
REGION = re.compile(r"[^\n]{1,1000}:[0-9]+\Z")
"""The ``file:line`` of an autocast region or question (``guards: autocast:``, ``autocast_read:``)."""
AUTOCAST_KEYS = ("autocast", "autocast_read")
DEVICE = re.compile(r"[a-z_]{1,20}\Z")
LIBRARY_DIRS = tuple(
    os.path.join(os.path.realpath(path), "")
    for path in (os.path.dirname(torch.__file__), os.path.dirname(__file__), sysconfig.get_paths()["stdlib"])
)
"""Code that is not the model's: PyTorch's, symgrad's, the standard library's (guarded by its version)."""

MISSING = object()
"""An attribute or argument that is not there."""
_LIBRARY_FILES: dict[str, bool] = {}


def is_library(code: types.CodeType) -> bool:
    file = code.co_filename
    if file not in _LIBRARY_FILES:
        _LIBRARY_FILES[file] = not file.startswith("<") and os.path.realpath(file).startswith(LIBRARY_DIRS)
    return _LIBRARY_FILES[file]


def _is_library_object(value) -> bool:
    """Whether a class (or a module) is PyTorch's, the builtins' or a standard helper module's. A module's
    name is read from what it holds: a lazy namespace (``torch.classes``, ``torch.ops``) makes any attribute
    it lacks, ``__module__`` too, and raises on the next read."""
    module = _module_name(value) if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
    return (module if isinstance(module, str) else "").split(".")[0] in (
        "torch",
        "builtins",
        "functools",
        "math",
        "operator",
        "typing",
        "collections",
    )


def _from_library(cls: type) -> bool:
    file = vars(sys.modules[cls.__module__]).get("__file__") if cls.__module__ in sys.modules else None
    return isinstance(file, str) and os.path.realpath(file).startswith(LIBRARY_DIRS)


def _module_name(module: types.ModuleType) -> str:
    """A module's name, read from its ``vars`` (never through getattr, which a lazy namespace answers)."""
    name = vars(module).get("__name__")
    return name if isinstance(name, str) else ""


def short(text: str) -> str:
    """``text`` where it is short and printable, else ``sha256:`` and a 16-digit hash of it."""
    if len(text) <= MAX_TEXT and text.isprintable():
        return text
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]


def code_text(code: types.CodeType) -> str:
    """A code object's instructions, names and constants (nested code objects in turn): the same in
    another process of the same Python, whatever its source file says now."""
    constants = [code_text(item) if inspect.iscode(item) else value_text(item, 3) or "<?>" for item in code.co_consts]
    return f"{code.co_code.hex()}|{code.co_names}|{code.co_varnames}|{'|'.join(constants)}"


def code_hash(code: types.CodeType) -> str:
    return hashlib.sha256(code_text(code).encode("utf-8")).hexdigest()[:16]


def value_text(value: Any, depth: int = 0) -> str | None:
    """A value the forward reads, as a text that is the same in another process and differs where the
    value does; None for a tensor or a module (guarded as the trace's inputs and submodules)."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, str):
        return repr(str.__str__(value))
    if isinstance(value, (torch.Tensor, torch.nn.Module)):
        return None if depth == 0 else f"<{type(value).__name__}>"
    if isinstance(value, (torch.dtype, torch.device, torch.Size, torch.memory_format, torch.layout)):
        return repr(value)
    if depth > 4:
        return f"<{type(value).__qualname__}>"
    inner = functools.partial(_inner, depth=depth + 1)
    if isinstance(value, (list, tuple)):
        text = ", ".join(map(inner, value))
        return f"[{text}]" if isinstance(value, list) else f"({text})"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{inner(key)}: {inner(item)}" for key, item in value.items())) + "}"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(map(inner, value))) + "}"
    if isinstance(value, functools.partial):
        arguments = [*map(inner, value.args), *(f"{key}={inner(item)}" for key, item in value.keywords.items())]
        return f"partial({inner(value.func)}, {', '.join(arguments)})"
    if inspect.ismethod(value):
        return f"{inner(value.__func__)} of <{type(value.__self__).__qualname__}>"
    if inspect.isfunction(value):
        if is_library(value.__code__):
            return f"{value.__module__}.{value.__qualname__}"
        cells = [cell.cell_contents for cell in value.__closure__ or () if _filled(cell)]
        bound = ", ".join(map(inner, [*cells, *(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values()]))
        return f"{value.__qualname__}#{code_hash(value.__code__)}" + (f"({bound})" if bound else "")
    if isinstance(value, types.ModuleType):  # by its vars: torch.classes makes a namespace of any name read
        return f".{_module_name(value)}"
    if inspect.isclass(value) and not _is_library_object(value) and not _from_library(value):
        return f".{value.__qualname__}"  # the user's: `symgrad trace net.py:Net` imports net.py under a name of its own
    if inspect.isbuiltin(value) or inspect.isclass(value):
        return f"{getattr(value, '__module__', None) or ''}.{getattr(value, '__qualname__', value.__name__)}"
    if not _is_library_object(type(value)) and hasattr(value, "__dict__"):
        state = ", ".join(
            f"{key}={inner(item)}" for key, item in sorted(vars(value).items()) if not key.startswith("_")
        )
        return f"{type(value).__qualname__}({state})"
    return f"<{type(value).__qualname__}>"


def shown(value: Any) -> str:
    """``value`` as a refusal shows it: its ``repr`` where that is a literal's or a small tensor's (on one
    line), else :func:`value_text`."""
    if value is None or type(value) in (bool, int, float, str):
        return repr(value)
    if isinstance(value, torch.Tensor) and value.numel() <= 8:
        return f"{' '.join(repr(value.detach()).split()):.120}"
    text = value_text(value)
    return f"{text:.120}" if text is not None else f"<{type(value).__name__}>"


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def _inner(value, depth: int) -> str:
    return value_text(value, depth) or f"<{type(value).__name__}>"


def guardable(value: Any) -> bool:
    """Whether a module attribute is a value the fingerprint guards by :func:`value_text` (not a
    tensor, module, or an object whose text names nothing but its type)."""
    if isinstance(value, (torch.Tensor, torch.nn.Module)):
        return False
    text = value_text(value)
    return text is not None and text != f"<{type(value).__qualname__}>"


def literal_or_text(value: Any) -> Any:
    """A literal the spec holds as it is (None, bool, int, float, short str, flat list), else
    :func:`value_text` (shortened)."""
    if value is None or isinstance(value, bool) or (isinstance(value, int) and not isinstance(value, enum.Enum)):
        return None if value is None else (bool(value) if isinstance(value, bool) else int(value))
    if isinstance(value, float) and not isinstance(value, enum.Enum):
        return float(value) if math.isfinite(value) else str(value)
    if type(value) is str and len(value) <= MAX_TEXT and value.isprintable():
        return value
    if (
        isinstance(value, list)
        and len(value) <= 16
        and all(
            item is None or type(item) in (bool, int, float) or type(item) is str and len(item) < 60 for item in value
        )
    ):
        return [literal_or_text(item) for item in value]
    return short(value_text(value) or f"<{type(value).__qualname__}>")


# --- the functions a forward called -------------------------------------------------------------------------


class CallRecorder:
    """The code objects of every Python function that runs inside the ``with`` block (``sys.setprofile``,
    chained with a profiler already set; it keeps its own working when another one sets and restores it)."""

    def __enter__(self) -> set[types.CodeType]:
        self.codes: set = _Called()
        self.codes.returned = {}
        self._previous = sys.getprofile()
        codes, previous, returned = self.codes, self._previous, self.codes.returned

        def profile(frame, event, argument):
            if event == "call" or event == "return":
                codes.add(frame.f_code)
            if event == "return":  # the forward's own: the container a bound model returns (output_types.py)
                returned[frame.f_code] = type(argument)
            if callable(previous):  # a profiler written in Python; cProfile's is C, and is paused meanwhile
                previous(frame, event, argument)

        sys.setprofile(profile)
        return self.codes

    def __exit__(self, *exc) -> None:
        set_profile_back(self._previous)


class _Called(set):
    """The code objects called; ``returned``: the type each one last returned."""

    returned: dict[types.CodeType, type]


def set_profile_back(previous) -> None:
    """Put back the profiler ``sys.getprofile()`` gave: a Python function as it was, and cProfile's (an object
    ``sys.setprofile`` cannot take, which it returns all the same) by enabling it again."""
    if previous is None or callable(previous):
        sys.setprofile(previous)
    else:
        sys.setprofile(None)
        if hasattr(previous, "enable"):
            previous.enable()


def _unwrap(value):
    value = value.func if isinstance(value, functools.partial) else value
    if isinstance(value, (staticmethod, classmethod)) or inspect.ismethod(value):
        value = value.__func__
    if isinstance(value, property):
        value = value.fget
    return value


def names_read(code: types.CodeType) -> list[str]:
    """Every name ``code`` and the code nested in it (lambdas, comprehensions, inner functions) reads."""
    names = list(code.co_names)
    for item in code.co_consts:
        if inspect.iscode(item):
            names += [name for name in names_read(item) if name not in names]
    return names


def _reads(function) -> list[tuple[str, Any]]:
    """What ``function`` reads besides its arguments: each global (and ``module.attribute`` of a
    global module of the model's own code), each closure cell, its defaults."""
    names, found = names_read(function.__code__), []
    scope = function.__globals__
    for name in names:
        if name not in scope:
            continue
        value = scope[name]
        found.append((name, value))
        if (
            isinstance(value, types.ModuleType)
            and not _is_library_object(value)
            and not str(vars(value).get("__file__") or "").startswith(LIBRARY_DIRS)
        ):
            members = vars(value)  # what the module holds now: a lazy module's attribute is not imported here
            found += [
                (f"{name}.{attribute}", members[attribute])
                for attribute in names
                if attribute != name and attribute in members
            ]
    for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
        try:
            found.append((name, cell.cell_contents))
        except ValueError:  # an empty cell
            continue
    for index, value in enumerate(function.__defaults__ or ()):
        found.append((f"default{index}", value))
    found += [(f"default_{key}", value) for key, value in (function.__kwdefaults__ or {}).items()]
    return found


def functions_of(model: torch.nn.Module, follow: bool = True) -> dict[str, types.FunctionType]:
    """Every function of the model's own code reachable from it, by its path: its submodules' classes'
    methods (``Net.forward``), functions held as attributes (``blocks.0:act``), and, in turn, the
    functions, classes and module attributes those read (``Net.forward/helpers.act``). The same model
    gives the same paths."""
    found: dict[str, types.FunctionType] = {}
    seen: set[int] = set()
    queue: list[tuple[str, types.FunctionType]] = []

    def add(path: str, value) -> None:
        value = _unwrap(value)
        if not inspect.isfunction(value) or id(value) in seen or is_library(value.__code__):
            return
        seen.add(id(value))
        while path in found:
            path += "#"
        found[path] = value
        queue.append((path, value))

    def add_class(path: str, cls: type) -> None:
        for klass in cls.__mro__:  # a base's method (super().forward()) named apart: Helper.forward@Base
            if _is_library_object(klass):
                continue
            for name, member in vars(klass).items():
                base = f"@{klass.__qualname__}" if klass is not cls else ""
                add(f"{path}.{name}{base}" if path else f"{klass.__qualname__}.{name}", member)

    for module_path, module in model.named_modules(remove_duplicate=False):
        add_class("", type(module))
        for key, value in vars(module).items():
            if key.startswith("_"):
                continue
            add(f"{module_path}:{key}", value)
            if (
                not isinstance(value, torch.nn.Module)
                and hasattr(value, "__dict__")
                and not inspect.isroutine(value)
                and not inspect.isclass(value)
                and not _is_library_object(type(value))
            ):
                add_class(f"{module_path}:{key}", type(value))  # a callable object's methods
    while queue and follow:
        path, function = queue.pop(0)
        for name, value in _reads(function):
            if inspect.isclass(value) and not _is_library_object(value) and not issubclass(value, enum.Enum):
                add_class(f"{path}/{name}", value)
            else:
                add(f"{path}/{name}", value)
    return found


def resolved(model: torch.nn.Module, paths) -> dict[str, types.FunctionType | None]:
    """The function at each of ``paths`` (:func:`functions_of`'s), found by following the path itself from
    its root (another process may reach a function first by another way: a lazy module loaded since), or
    None where the path leads nowhere now."""
    roots, found = functions_of(model, follow=False), {}

    def at(path: str):
        if path not in found:
            before, _, step = path.rpartition("/")
            found[path] = roots.get(path) if not before else _step(at(before), step.rstrip("#"))
        return found[path]

    return {path: at(path) for path in paths}


def _step(function, step: str):
    """What ``function`` reads as ``step``: a global, closure cell or default (``helper``), a global module's
    attribute (``helpers.act``, imported where a lazy module had not yet), or a method of a class it reads
    (``Helper.apply``); None where it reads no such function."""
    if function is None:
        return None
    reads = dict(reversed(_reads(function)))  # the first read of a name, as functions_of met it
    value = reads.get(step, MISSING)
    if value is MISSING and "." in step:
        step, _, base = step.partition("@")
        owner, _, member = step.rpartition(".")
        holder = reads.get(owner, reads.get(owner.partition(".")[0]))
        if inspect.isclass(holder):
            value = next(
                (
                    vars(klass)[member]
                    for klass in holder.__mro__
                    if member in vars(klass)  # a base
                    and (klass is not holder and klass.__qualname__ == base if base else klass is holder)
                ),
                MISSING,
            )  # of the class's own name (diffusers' Transformer2DModelOutput) is the base
        elif isinstance(holder, types.ModuleType):
            value = vars(holder).get(member, MISSING)
            if value is MISSING and not _is_library_object(holder):  # a lazy module's submodule: imported now
                try:
                    value = getattr(holder, member)
                except Exception:  # noqa: BLE001 - a module that cannot give it: the path leads nowhere
                    return None
    value = _unwrap(value) if value is not MISSING else None
    return value if inspect.isfunction(value) else None


def _installed(code: types.CodeType) -> bool:
    """Whether ``code`` is an installed library's (site-packages): its module state (a flag set on a first
    call, a cache) may differ between the process that traced and one that binds, so only its code, and
    the functions it reads, are guarded."""
    file = code.co_filename
    return "site-packages" in file or "dist-packages" in file


def function_guard(function) -> tuple[str, dict[str, Any]]:
    """The hash guarding ``function`` (its code and everything it reads), and its short literal reads by name."""
    parts, values = [code_text(function.__code__)], {}
    installed = _installed(function.__code__)
    for name, value in _reads(function):
        if installed and not (callable(value) or isinstance(value, types.ModuleType)):
            continue
        text = value_text(value)
        parts.append(f"{name}={text}")
        if text is not None and not callable(value) and not isinstance(value, types.ModuleType):
            values[name] = literal_or_text(value)
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()[:16], values


def code_guards(model: torch.nn.Module, called: set) -> tuple[dict[str, str], dict[str, Any]]:
    """``code`` and ``values`` of the guards: each function of the model's code the forward called
    (code objects in ``called``), and the literals they read."""
    codes, values = {}, {}
    for path, function in functions_of(model).items():
        if function.__code__ in called:
            codes[path], reads = function_guard(function)
            values.update({f"{path}/{name}": value for name, value in reads.items()})
    return codes, values


def arguments_of(function, shapes: dict, arguments: dict) -> dict[str, Any]:
    """``arguments`` of the guards: each argument of the traced ``function`` that is not a traced
    tensor, as it was given (``--arg``) or defaulted; ``None`` for an optional tensor left out."""
    found = {}
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name in shapes:
            continue
        if parameter.kind is parameter.VAR_POSITIONAL:
            found[parameter.name] = "()"
        elif parameter.kind is parameter.VAR_KEYWORD:
            found[parameter.name] = "{}"
        else:
            value = arguments.get(parameter.name, parameter.default)
            found[parameter.name] = literal_or_text(value)
    return found


def guards_text(
    module: torch.nn.Module,
    function,
    called: set,
    shapes: dict,
    arguments: dict,
    sizes: dict | None = None,
    autocast: dict | None = None,
    autocast_read: dict | None = None,
) -> str:
    """The spec's ``guards:`` section (flow-style YAML of checked literals); ``sizes``: each input's shape where
    it was traced with static sizes (``symgrad.trace.static_sizes``); ``autocast``: the code's own regions that
    turn autocast off, ``file:line`` -> device (``symgrad.trace.autocast_regions.autocast_region``), ``autocast_read``:
    the places it asks whether autocast is on (``autocast_read``), under either of which a bound step refuses
    the caller's autocast (``StepChecks._check_autocast``)."""
    import json

    import yaml

    codes, values = code_guards(module, called)
    guards = {
        "code": codes,
        "values": values,
        "arguments": arguments_of(function, shapes, arguments),
        "output": output_entry(getattr(called, "returned", {}).get(getattr(function, "__code__", None)), module),
    }
    if sizes:
        guards["sizes"] = sizes
    if autocast:
        guards["autocast"] = autocast
    if autocast_read:
        guards["autocast_read"] = autocast_read

    def line(value) -> str:  # one value in flow style (a bare scalar would end its document with "...")
        return yaml.safe_dump([value], default_flow_style=True, width=10_000, sort_keys=False).strip()[1:-1]

    return "guards:\n" + "".join(
        f"  {key}:\n" + "".join(f"    {json.dumps(name)}: {line(item)}\n" for name, item in entries.items())
        if entries
        else f"  {key}: {{}}\n"
        for key, entries in guards.items()
        if entries or key not in ("output", "sizes", *AUTOCAST_KEYS)
    )


def parse_guards(value: Any, location) -> dict:
    """The ``guards:`` section of a spec, checked to hold nothing but what :func:`guards_text` writes."""
    from .errors import SpecError

    def refuse(what: str) -> SpecError:
        return SpecError(
            f"guards {what}", location, "trace the model again (symgrad trace ...); the guards are written by the trace"
        )

    keys = ("code", "values", "arguments", "output", "sizes", *AUTOCAST_KEYS)
    if not isinstance(value, dict) or set(value) - set(keys):
        raise refuse("must be a mapping of code, values and arguments (and output, sizes, autocast, autocast_read)")
    result = {}
    for key in keys:
        entries = value.get(key) or {}
        if not isinstance(entries, dict):
            raise refuse(f"{key} must be a mapping")
        for name, item in entries.items():
            if key in AUTOCAST_KEYS:  # a region's or a question's file:line (any file name) and its device type
                if not (isinstance(name, str) and REGION.match(name)):
                    raise refuse(f"{key} has {name!r:.60}, not a file:line")
                if not (isinstance(item, str) and DEVICE.match(item)):
                    raise refuse(f"{key} {name!r:.60} has {item!r:.60}, not a device type")
                continue
            if not isinstance(name, str) or not PATH.match(name):
                raise refuse(f"{key} has {name!r:.60}, not a path")
            if key == "code" and not (isinstance(item, str) and HASH.match(item)):
                raise refuse(f"code {name!r:.60} has {item!r:.60}, not a 16-digit hash")
            if key != "code" and literal_or_text(item) != item:
                raise refuse(f"{key} {name!r:.60} has {item!r:.60}, not a literal")
            if key == "sizes" and not (isinstance(item, list) and all(type(size) is int and size > 0 for size in item)):
                raise refuse(f"sizes {name!r:.60} has {item!r:.60}, not a shape")
        result[key] = dict(entries)
    return result
