"""What a traced model computes, written down so that ``symgrad.bind`` binds only that model.

``symgrad trace`` records, per submodule path, its class, the hyper-parameters that change the math
(every public scalar attribute: a convolution's ``kernel_size``, ``stride``, ``padding``,
``dilation``, ``groups``, ``padding_mode``; a BatchNorm's ``eps``, ``momentum``, ``affine``,
``track_running_stats``; a dropout's ``p``; an activation's ``negative_slope`` or ``approximate``; a
pooling's ``ceil_mode``; an upsampling's ``mode`` and ``scale_factor``; a model's own ``self.scale``),
its own parameters' and buffers' shapes, the mode it ran in where its code reads ``self.training``,
how often a BatchNorm ran, and a hash of the source of its class (every class of its MRO outside
PyTorch, with the module-level functions their methods call) and of its forward hooks, whose math the
trace folds into the module. The spec carries it as a
``fingerprint:`` section; the parser lets through only the literals below, and the generated module
holds it as ``FINGERPRINT``. :func:`difference` compares a model against it and names the first
submodule that differs.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import json
import math
import re
from typing import Any

import torch

from .errors import Location, SpecError
from .guards import code_text, guardable, names_read, short, value_text

ENTRY_KEYS = ("class", "code", "training", "calls", "hyper", "state")
"""What a submodule's entry may hold."""
IGNORED = frozenset({"training", "inplace"})
"""Attributes that do not change what the module computes (``training`` is recorded apart, where read)."""
WIDTHS = frozenset(
    {
        "in_channels",
        "out_channels",
        "num_features",
        "in_features",
        "out_features",
        "num_channels",
        "normalized_shape",
        "embed_dim",
    }
)
"""Hyper-parameters that are a width: a module written as blocks runs at any width, so they are not compared there."""
WIDTH_WORDS = ("channels", "planes", "features", "width", "dim", "hidden", "filters")
"""A model's own attribute named with one of these (``self.inplanes``) is taken for a width too."""


def is_width(key: str) -> bool:
    return key in WIDTHS or any(word in key for word in WIDTH_WORDS)


PATH = re.compile(r"\Z|[A-Za-z0-9_][A-Za-z0-9_-]{0,63}(\.[A-Za-z0-9_][A-Za-z0-9_-]{0,63}){0,31}\Z")
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
CODE = re.compile(r"[0-9a-f]{16}\Z")
MAX_TEXT = 200
MAX_ITEMS = 16


def literal(value: Any) -> Any:
    """``value`` as a fingerprint literal, or ``...`` where it is none (a tensor, a module, a function); an
    ``Enum`` as its text, ``Format.NCHW`` (YAML writes no Enum, and its text is the same in another process)."""
    if isinstance(value, enum.Enum):
        return value_text(value)
    if value is None or isinstance(value, bool):
        return None if value is None else bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else str(value)
    if isinstance(value, str):
        value = str.__str__(value)
        if len(value) <= MAX_TEXT and value.isprintable():
            return value
        return "sha256:" + hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()[:16]
    if isinstance(value, (tuple, list)) and len(value) <= MAX_ITEMS:
        items = [literal(item) for item in value]
        if all(item is not ... and not isinstance(item, list) for item in items):
            return items
    return ...


_CODE_CACHE: dict[type, str | None] = {}


def _code_hash(cls: type) -> str | None:
    """A hash of the code of ``cls`` and of its bases outside PyTorch (every method's code object, and
    the class's literal attributes), with the module-level functions their methods call; None for a
    PyTorch class (its math is its class and hyper-parameters). Code objects, not source text: a class
    made by ``exec``, or whose file was moved since, is guarded as well (``symgrad.guards``)."""
    if cls in _CODE_CACHE:
        return _CODE_CACHE[cls]
    parts = []
    for klass in cls.__mro__:
        if (klass.__module__ or "").split(".")[0] in ("torch", "builtins"):
            continue
        parts.append(klass.__qualname__)
        for key, member in vars(klass).items():
            method = getattr(member, "__func__", getattr(member, "fget", member))
            code, names = getattr(method, "__code__", None), getattr(method, "__globals__", {})
            if code is None:
                text = value_text(member) if not key.startswith("__") else None
                parts += [f"{key}={text}"] if text is not None and not text.startswith("<") else []
                continue
            parts.append(f"{key}:{code_text(code)}")
            for name in code.co_names:
                called = names.get(name)
                if inspect.isfunction(called) and not (called.__module__ or "").startswith("torch"):
                    parts.append(code_text(called.__code__))
    result = hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()[:16] if parts else None
    _CODE_CACHE[cls] = result
    return result


FORWARD_HOOKS = ("_forward_pre_hooks", "_forward_hooks")
"""A submodule's hooks that the trace runs with its forward (it calls each submodule), and so folds into
the generated code. The model's own are not run (the trace calls its ``forward``): the trace refuses
them. Global module hooks (``register_module_forward_hook``) are not part of the model: the trace
refuses them, and a bound step, which calls no submodule, never runs them."""
BACKWARD_HOOKS = ("_backward_pre_hooks", "_backward_hooks")
"""A module's hooks on its gradients, which the explicit backward never runs (``bind`` refuses them)."""


def forward_hooks(module: torch.nn.Module) -> list[tuple[str, Any]]:
    """The forward (pre-)hooks of ``module``, each with the dictionary it sits in."""
    return [(name, hook) for name in FORWARD_HOOKS for hook in getattr(module, name, {}).values()]


def hook_dictionaries(model: torch.nn.Module) -> tuple[dict, ...]:
    """Every forward and backward hook dictionary of ``model``'s modules, in a fixed order."""
    return tuple(
        getattr(module, name)
        for _, module in model.named_modules(remove_duplicate=False)
        for name in (*FORWARD_HOOKS, *BACKWARD_HOOKS)
        if isinstance(getattr(module, name, None), dict)
    )


def _value_text(value: Any) -> str:
    """A value a hook holds, as text that is the same in another process: a literal's repr, else its type."""
    found = literal(value)
    return repr(found) if found is not ... else f"<{type(value).__qualname__}>"


def _state_text(state: dict) -> list[str]:
    """An object's attributes (or keyword arguments), each as ``name=`` :func:`_value_text`, by name."""
    return [f"{key}={_value_text(value)}" for key, value in sorted(state.items(), key=lambda item: str(item[0]))]


def _code_text(code) -> str:
    """A code object's instructions and constants (nested code objects in turn): two lambdas on one
    source line, or one closing over another number, differ here."""
    constants = [_code_text(item) if inspect.iscode(item) else _value_text(item) for item in code.co_consts]
    return f"{code.co_code.hex()}|{code.co_names}|{'|'.join(constants)}"


def hook_function(hook):
    """The function behind a hook: a ``functools.partial``'s, a bound method's; else ``hook`` itself."""
    hook = hook.func if isinstance(hook, functools.partial) else hook
    return hook.__func__ if inspect.ismethod(hook) else hook


def _hook_text(kind: str, hook) -> str:
    """What identifies a hook across processes: the dictionary it sits in; a function's source, code
    and the literals it closes over (a ``functools.partial``'s arguments, a bound method's object's
    state); a callable object's class source and state (a PyTorch class by its name: old-style
    ``weight_norm``'s ``WeightNorm``)."""
    parts, function = [kind], hook_function(hook)
    if isinstance(hook, functools.partial):
        parts += [*map(_value_text, hook.args), *_state_text(hook.keywords)]
        hook = hook.func
    if inspect.ismethod(hook) and not isinstance(hook.__self__, torch.nn.Module):  # a module's state: its entry's
        parts += _state_text(getattr(hook.__self__, "__dict__", {}))
    if inspect.isfunction(function):
        parts += [
            _source(function),
            _code_text(function.__code__),
            *(_value_text(cell.cell_contents) for cell in function.__closure__ or ()),
        ]
    else:
        kind_of = type(function)
        parts.append(_code_hash(kind_of) or f"<{kind_of.__module__}.{kind_of.__qualname__}>")
        if not (kind_of.__module__ or "").startswith("torch"):
            parts += _state_text(getattr(function, "__dict__", {}))
    return "\n".join(parts)


def hooks_hash(module: torch.nn.Module) -> str | None:
    """A hash of ``module``'s forward hooks (:func:`_hook_text`), or None where it has none."""
    hooks = forward_hooks(module)
    if not hooks:
        return None
    return hashlib.sha256("\n".join(_hook_text(kind, hook) for kind, hook in hooks).encode("utf-8")).hexdigest()[:16]


def _code_of(module: torch.nn.Module) -> str | None:
    """The fingerprint's ``code`` of ``module``: its class's hash (:func:`_code_hash`), taken again with
    its forward hooks' (:func:`hooks_hash`) where it has any."""
    code, hooks = _code_hash(type(module)), hooks_hash(module)
    if hooks is None:
        return code
    return hashlib.sha256(f"{code or ''}\n{hooks}".encode("utf-8")).hexdigest()[:16]


def hooks_of(model: torch.nn.Module) -> dict[str, str | None]:
    """Per submodule path, :func:`hooks_hash`, or ``"backward"`` where it has a backward hook: what a
    bound step compares once a hook was registered or removed."""
    return {
        path: "backward" if any(getattr(module, name, None) for name in BACKWARD_HOOKS) else hooks_hash(module)
        for path, module in model.named_modules(remove_duplicate=False)
    }


def _source(item) -> str:
    try:
        return inspect.getsource(item)
    except (OSError, TypeError):  # made by exec: its name stands for it
        return f"<no source: {getattr(item, '__qualname__', item)}>"


_READS_TRAINING: dict[type, bool] = {}


def _reads_training(cls: type) -> bool:
    """Whether ``cls``'s forward may compute otherwise in train and eval mode (its code reads ``training``)."""
    if cls not in _READS_TRAINING:
        code = getattr(getattr(cls, "forward", None), "__code__", None)
        _READS_TRAINING[cls] = code is None or "training" in names_read(code)
    return _READS_TRAINING[cls]


def fingerprint_of(model: torch.nn.Module, calls: dict[str, int] | None = None) -> dict[str, dict]:
    """The fingerprint of ``model`` as it is now: path -> entry; ``calls``: how often each BatchNorm ran."""
    result = {}
    for path, module in model.named_modules(remove_duplicate=False):
        hyper = {}
        for key, value in vars(module).items():
            if key.startswith("_") or key in IGNORED or not KEY.match(key):
                continue
            found = literal(value)
            if found is ... and guardable(value):  # a dict, a nested list, a partial, a function: its text
                found = short(value_text(value))
            if found is not ...:
                hyper[key] = found
        state = {
            key: list(value.shape)
            for key, value in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
            if value is not None
        }
        entry = {"class": type(module).__name__, "code": _code_of(module)}
        if _reads_training(type(module)):
            entry["training"] = bool(module.training)
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            entry["calls"] = (calls or {}).get(path, 0)
        entry.update(hyper=hyper, state=state)
        result[path] = entry
    return result


def parse_fingerprint(value: Any, location: Location) -> dict[str, dict]:
    """The ``fingerprint:`` section of a spec, checked to hold nothing but the literals
    :func:`fingerprint_of` writes (only those reach the generated module)."""

    def refuse(what: str, where: Location | None = None) -> SpecError:
        return SpecError(
            f"fingerprint {what}",
            where or location,
            "trace the model again (symgrad trace ...); the fingerprint is written by the trace",
        )

    if not isinstance(value, dict):
        raise refuse("must be a mapping of submodule paths to entries")
    places = getattr(value, "value_locations", {})
    result = {}
    for path, entry in value.items():
        where = places.get(path, location)
        if not isinstance(path, str) or not PATH.match(path):
            raise refuse(f"has {path!r:.60}, not a submodule path", where)
        if not isinstance(entry, dict) or set(entry) - set(ENTRY_KEYS) or "class" not in entry:
            raise refuse(f"entry {path!r} must be a mapping of {', '.join(ENTRY_KEYS)} with a class", where)
        if not isinstance(entry["class"], str) or not KEY.match(entry["class"]):
            raise refuse(f"entry {path!r} has class {entry['class']!r:.60}, not a class name", where)
        code = entry.get("code")
        if code is not None and not (isinstance(code, str) and CODE.match(code)):
            raise refuse(f"entry {path!r} has code {code!r:.60}, not a 16-digit hash", where)
        if not isinstance(entry.get("training", False), bool):
            raise refuse(f"entry {path!r} has training {entry['training']!r:.60}, not true or false", where)
        calls = entry.get("calls", 0)
        if isinstance(calls, bool) or not isinstance(calls, int) or not 0 <= calls < 2**31:
            raise refuse(f"entry {path!r} has calls {calls!r:.60}, not a count", where)
        hyper, state = entry.get("hyper", {}), entry.get("state", {})
        if not isinstance(hyper, dict) or not isinstance(state, dict):
            raise refuse(f"entry {path!r}: hyper and state must be mappings", where)
        for key, item in hyper.items():
            if not isinstance(key, str) or not KEY.match(key) or literal(item) != item or literal(item) is ...:
                raise refuse(f"entry {path!r} has hyper {key!r:.60}: {item!r:.60}, not a literal", where)
        for key, shape in state.items():
            if (
                not isinstance(key, str)
                or not KEY.match(key)
                or not isinstance(shape, list)
                or len(shape) > 8
                or any(isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 2**40 for size in shape)
            ):
                raise refuse(f"entry {path!r} has state {key!r:.60}: {shape!r:.60}, not a shape", where)
        result[path] = {
            "class": entry["class"],
            "code": code,
            **({"training": entry["training"]} if "training" in entry else {}),
            **({"calls": calls} if "calls" in entry else {}),
            "hyper": {key: literal(item) for key, item in hyper.items()},
            "state": {key: [int(size) for size in shape] for key, shape in state.items()},
        }
    return result


def digests(entry: dict, any_width: bool) -> tuple[str, str]:
    """Short hashes of an entry's hyper-parameters and of its parameters' and buffers' shapes; with
    ``any_width``, without the widths (a module written as blocks runs at any width)."""
    hyper = {key: value for key, value in entry["hyper"].items() if not (any_width and is_width(key))}
    state = {key: [len(shape), *shape[2:]] if any_width else shape for key, shape in entry["state"].items()}
    return tuple(hashlib.sha256(json.dumps(part, sort_keys=True).encode()).hexdigest()[:8] for part in (hyper, state))


def summary(entry: dict, any_width: bool) -> tuple:
    """What the generated module keeps of an entry: (class, code hash, hyper digest, state digest,
    traced mode or None, BatchNorm calls)."""
    return (entry["class"], entry.get("code"), *digests(entry, any_width), entry.get("training"), entry.get("calls", 0))


EMPTY = hashlib.sha256(b"{}").hexdigest()[:8]
"""The hash of no hypers and of no tensors (:func:`digests` of ``{}``)."""

ROW_DEFAULTS = (None, None, EMPTY, EMPTY, None, 0)
"""A row's tail that the module leaves out and :func:`unfolded` puts back: no code of its own, no hypers,
no tensors, no mode read, no BatchNorm run."""


def unfolded(fingerprint: Any) -> Any:
    """A generated module's ``FINGERPRINT`` as the table :func:`difference` compares, path -> row: the
    table itself, or its compact form ``(rows, paths, groups)`` (symgrad.fingerprint_text writes it where
    submodules share rows) unfolded: each path's row by number, its tail of :data:`ROW_DEFAULTS` put
    back, or the rows of its group (a block's submodules, by path under the instance), or the group's
    paths with the instance's own numbers (``(group, [numbers])``); anything else as it is."""
    if not isinstance(fingerprint, tuple):
        return fingerprint
    rows, paths, groups = fingerprint
    table = {}
    for path, entry in paths.items():
        if isinstance(entry, int):
            entry = ("", [entry])
        name, numbers = entry if isinstance(entry, tuple) else (entry, None)
        inner = groups[name] if name else {"": None}
        for relative, number in zip(inner, numbers or inner.values()):
            row, key = rows[number], ".".join(part for part in (path, relative) if part)
            table[key] = [*row, *ROW_DEFAULTS[len(row) :]]
    return table


def difference(traced: dict[str, tuple], model: torch.nn.Module, any_width: bool = False) -> str | None:
    """The first way ``model`` differs from ``traced`` (path -> :func:`summary`), in words, or None;
    ``any_width``: the module is written as blocks, and runs at any width. The submodules and their
    classes first, then hyper-parameters and parameters, then code."""
    now = fingerprint_of(model)
    for path, (kind, *_) in traced.items():
        entry = now.get(path)
        if entry is None:
            return f"{path or 'the model'} ({kind}) is no submodule of the model any more"
        if entry["class"] != kind:
            return f"{path or 'the model'} is a {entry['class']}, traced as a {kind}"
    for path in now:
        if path not in traced:
            return f"{path} ({now[path]['class']}) is a submodule the trace did not see"
    for path, (kind, code, hyper, state, _, _) in traced.items():
        shown, entry = path or "the model", now[path]
        now_hyper, now_state = digests(entry, any_width)
        if now_hyper != hyper:
            values = (
                ", ".join(
                    f"{key}={value!r}" for key, value in entry["hyper"].items() if not (any_width and is_width(key))
                )
                or "none"
            )
            return f"{shown} ({kind}) has other hyper-parameters than traced (now {values})"
        if now_state != state:
            shapes = ", ".join(f"{key} {shape}" for key, shape in entry["state"].items()) or "none"
            return f"{shown} ({kind}) has other parameters or shapes than traced (now {shapes})"
    for path, (kind, code, *_) in traced.items():
        if now[path]["code"] != code:
            module = model.get_submodule(path)
            hooked, class_code, shown = (
                bool(forward_hooks(module)),
                _code_hash(type(module)),
                f"{path or 'the model'} ({kind})",
            )
            if hooked and class_code == code:
                return f"{shown} has a forward hook the trace did not see"
            if class_code is None:  # PyTorch's own class: only hooks made its code differ
                return (
                    f"{shown} ran a forward hook when traced that it no longer has"
                    if not hooked
                    else f"{shown} has other forward hooks than traced"
                )
            return f"the code of {path or 'the model'}'s class {kind} changed since it was traced (or its forward hooks did)"
    return None
