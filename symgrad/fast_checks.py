"""The per-call work of a bound step (``binding.Guard``) done with as little Python as it allows.

A bound step reads the model's tensors, checks the model is as bound and counts the batch at every
call: one read of each parameter, buffer, submodule, hyper-parameter and mode. Each helper here walks
those objects in C (``map`` over ``getattr``, ``dict.__getitem__``, ``attrgetter``, then one tuple
comparison), and where anything differs from what was bound it returns to the caller's plain loop,
which reads or refuses exactly as before (its messages are the guard's own). Measured on ResNet-18 of
width 8 at 2 × 32² on the 2-core CPU, that is no faster than the plain loops: about 50 µs timed in a
loop, and about 300 µs right after an autograd step, as a training loop calls it, where the cost is
the first touch of the ~200 Python objects read, which a C loop pays as well.

Under ``torch.compile`` Dynamo traces the checks and turns what they read into guards. There each submodule is
walked to from the model by its path (:func:`module_paths`, :func:`walk`), never read from symgrad's own lists,
so Dynamo reaches it by one path and guards each check once: a held reference gave Dynamo a second path to the
same module and a Python ``is`` guard per pair (ResNet-18: 639 of them, the guard check 4x
``torch.compile(model)``'s; now 9 Python guards, about 2x, the rest being the hyper-parameters and the
submodules' identities symgrad checks and ``torch.compile(model)`` does not).
"""

from __future__ import annotations

import copy
import operator
from itertools import repeat

import torch
from torch.utils.hooks import RemovableHandle

from .call_guards import same
from .fingerprint import hook_dictionaries, hooks_of
from .guards import MISSING

_CALL = operator.attrgetter.__call__  # map(_CALL, getters, objects): each getter on its object, in C


def module_paths(model: torch.nn.Module) -> dict[int, tuple[str, ...]]:
    """Each submodule of ``model`` (by ``id``) and its path of names from it, for :func:`walk`: under
    ``torch.compile`` the checks reach every submodule from the model by its path alone, so that Dynamo
    reaches each by one path and guards it once. A module held in symgrad's lists as well gave Dynamo a
    second path to it and a Python ``is`` guard for each pair (639 of them on ResNet-18)."""
    paths: dict[int, tuple[str, ...]] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), tuple(path.split(".")) if path else ())
    return paths


def walk(model: torch.nn.Module, path: tuple[str, ...]):
    """The submodule at ``path`` below ``model`` as it is now, or None where one on the way is gone."""
    module = model
    for name in path:
        module = module._modules.get(name)
        if module is None:
            return None
    return module


def read_state(state: dict, data: dict) -> dict:
    """``data`` and then, by argument name, each model tensor ``getattr(owner, attribute)`` gives for
    ``state`` (name -> (owner, attribute)), read from the owner's ``_parameters`` or ``_buffers`` (where
    ``nn.Module.__getattr__`` finds them) without that Python frame; an attribute in neither (a
    parametrized weight, a property) is read by ``getattr`` itself."""
    arguments = dict(data)
    for name, (owner, attribute) in state.items():
        parameters = owner._parameters
        if attribute in parameters:
            arguments[name] = parameters[attribute]
        else:
            buffers = owner._buffers
            arguments[name] = buffers[attribute] if attribute in buffers else getattr(owner, attribute)
    return arguments


class StateReader:
    """:func:`read_state` of one ``state``, in C where every entry was a parameter or a buffer when bound:
    each owner's ``_parameters`` or ``_buffers`` (the one that held it then) read again, then each entry
    looked up in it. An entry no longer there (deleted, parametrized, moved between the two) sends the
    call to :func:`read_state`, which reads what ``getattr`` gives."""

    def __init__(self, state: dict, paths: dict | None = None):
        self._state = state
        self.names = tuple(state)
        self._owners = tuple(owner for owner, _ in state.values())
        self._paths = (  # under torch.compile each owner is reached from the model by its path (module_paths)
            None
            if paths is None or any(id(owner) not in paths for owner in self._owners)
            else tuple(paths[id(owner)] for owner in self._owners)
        )
        self._attributes = tuple(attribute for _, attribute in state.values())
        kinds = tuple(
            "_parameters" if attribute in owner._parameters else "_buffers" if attribute in owner._buffers else None
            for owner, attribute in state.values()
        )
        self._kinds = None if None in kinds else kinds  # a property or parametrization when bound: getattr's

    def values(self) -> tuple | None:
        """The model's tensors, in ``names``' order; None where an entry moved (read them by ``read_state``)."""
        if self._kinds is None or torch.compiler.is_compiling():  # dynamo traces read_state's plain loop
            return None
        try:
            return tuple(map(dict.__getitem__, map(getattr, self._owners, self._kinds), self._attributes))
        except KeyError:
            return None

    def read(self, data: dict, model: torch.nn.Module | None = None) -> tuple[dict, dict]:
        """What ``read_state(state, data)`` gives, and its model tensors alone (name -> tensor); under
        ``torch.compile`` each owner found from ``model`` by its path, where it is the one bound."""
        if model is not None and self._paths is not None and torch.compiler.is_compiling():
            tensors = self._by_paths(model)
            if tensors is not None:
                return {**data, **tensors}, tensors
        values = self.values()
        if values is None:
            arguments = read_state(self._state, data)
            return arguments, {name: arguments[name] for name in self.names}
        tensors = dict(zip(self.names, values))
        return {**data, **tensors}, tensors

    def _by_paths(self, model: torch.nn.Module) -> dict | None:
        """:func:`read_state`'s loop with each owner walked to from ``model`` (the loop Dynamo traces)."""
        tensors = {}
        for name, path, attribute in zip(self.names, self._paths, self._attributes):
            owner = walk(model, path)
            if owner is None:
                return None
            parameters, buffers = owner._parameters, owner._buffers
            tensors[name] = (
                parameters[attribute]
                if attribute in parameters
                else buffers[attribute]
                if attribute in buffers
                else getattr(owner, attribute)
            )
        return tensors


class Snapshot:
    """The submodules, hyper-parameters and modes a bound model was bound with, compared in a few C
    calls: ``unchanged()`` is True where every child is the same object, every hyper-parameter equal
    (``is`` or ``==``, as the guard compares them) and every mode-reading module in its traced mode;
    False sends the caller to its own checks, which name what changed."""

    def __init__(self, children, hypers, modes=(), paths: dict | None = None, owned=()):
        self._by_path = paths is not None and all(
            id(module) in paths
            for module in (
                *(module for _, module, _ in owned),
                *(parent for parent, _, _ in children),
                *(module for _, module, _, _ in hypers),
                *(module for _, module, _ in modes),
            )
        )
        """Whether every module compared has a path from the model (``module_paths``): then under ``torch.compile``
        the comparisons walk to each from the model (:meth:`unchanged_from`), guarded once each."""
        if self._by_path:
            self._path_children = tuple((paths[id(parent)], name, id(child)) for parent, name, child in children)
            self._path_hypers = tuple((paths[id(module)], key, value) for _, module, key, value in hypers)
            self._path_modes = tuple((paths[id(module)], training) for _, module, training in modes)
            self._path_counts = tuple((paths[id(module)], len(names)) for _, module, names in owned)
        # how many children each module has (``owned``: every module, with its children's names as bound): with
        # every bound child in its place, a count that grew is a child added since
        self._owners = tuple(module for _, module, _ in owned)
        self._counts = tuple(len(names) for _, _, names in owned)
        self._parents = tuple(parent for parent, _, _ in children)
        self._child_names = tuple(name for _, name, _ in children)
        self._children = tuple(child for _, _, child in children)
        modules: dict[int, tuple] = {}
        for _, module, key, value in hypers:
            modules.setdefault(id(module), (module, [], []))
            modules[id(module)][1].append(key)
            modules[id(module)][2].append(value)
        self._hyper_owners = tuple(module for module, _, _ in modules.values())
        self._hyper_readers = tuple(operator.attrgetter(*keys) for _, keys, _ in modules.values())
        # attrgetter of several keys gives a tuple: compared whole, element by element
        self._hyper_values = tuple(tuple(values) if len(values) > 1 else values[0] for _, _, values in modules.values())
        self._mode_owners = tuple(module for _, module, _ in modes)
        self._modes = tuple(training for _, _, training in modes)

    def __deepcopy__(self, memo):
        """A copy comparing the copied modules (a bound model's ``copy.deepcopy``): the children's ids its own."""
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        if copied._by_path:
            copied._path_children = tuple(
                (path, name, id(child)) for (path, name, _), child in zip(copied._path_children, copied._children)
            )
        return copied

    @property
    def watches_modes(self) -> bool:
        """Whether any module's mode is compared (a module whose code reads ``self.training``, as traced)."""
        return bool(self._mode_owners)

    def modes_unchanged(self, model: torch.nn.Module | None = None) -> bool:
        """Whether every mode-reading module is in the mode it was traced in (under ``torch.compile``, each
        walked to from ``model``, where given)."""
        if model is not None and self._by_path and torch.compiler.is_compiling():
            for path, training in self._path_modes:
                module = walk(model, path)
                if module is None or module.training != training:
                    return False
            return True
        return tuple(map(operator.attrgetter("training"), self._mode_owners)) == self._modes

    def unchanged_from(self, model: torch.nn.Module) -> bool | None:
        """:meth:`unchanged` for ``torch.compile``: every submodule walked to from ``model`` by its path (each
        child the bound object: Dynamo guards its ``id`` once), every hyper-parameter compared as
        :func:`symgrad.call_guards.same` compares it, every mode as traced; None where a module has no path."""
        if not self._by_path:
            return None
        for path, name, child in self._path_children:  # parents first: every later walk meets bound modules
            parent = walk(model, path)
            found = None if parent is None else parent._modules.get(name)
            if found is None or id(found) != child:
                return False
        for path, count in self._path_counts:
            module = walk(model, path)
            if module is None or len(module._modules) != count:
                return False
        if not self.modes_unchanged(model):
            return False
        for path, key, value in self._path_hypers:
            if not same(getattr(walk(model, path), key, MISSING), value):
                return False
        return True

    def unchanged(self) -> bool:
        now = map(dict.get, map(getattr, self._parents, repeat("_modules")), self._child_names)
        if not all(map(operator.is_, now, self._children)):
            return False
        if tuple(map(len, map(getattr, self._owners, repeat("_modules")))) != self._counts:
            return False
        if not self.modes_unchanged():
            return False
        try:  # tuple equality compares each element by `is`, then `==`: the guard's own comparison
            return tuple(map(_CALL, self._hyper_readers, self._hyper_owners)) == self._hyper_values
        except (AttributeError, RuntimeError, TypeError, ValueError):  # deleted, or no single truth value
            return False  # (a tensor of several elements): the guard's loop says which


class BatchCounter:
    """``num_batches_tracked`` of each training-mode ``nn.BatchNorm`` in ``statistics``, moved by how often the
    traced forward runs it, as the module's forward moves it: the entries grouped by count once, each call
    reading every counter again (``.to()`` replaces buffers) and adding to each group in one
    ``_foreach_add_``; a module whose class changed since (``__class__`` assigned) is sorted again."""

    def __init__(self, statistics, paths: dict | None = None):
        self._statistics = tuple(statistics)
        self._modules = tuple(entry.module for entry in self._statistics)
        self._classes = tuple(map(type, self._modules))
        groups: dict[int, list] = {}
        for entry in self._statistics:  # nn.InstanceNorm keeps num_batches_tracked but never moves it
            if isinstance(entry.module, torch.nn.modules.batchnorm._BatchNorm):
                groups.setdefault(entry.calls, []).append(entry.module)
        self._groups = tuple((calls, tuple(modules)) for calls, modules in groups.items())
        self._paths = paths
        # under torch.compile each module is walked to from the model by its path (module_paths), guarded once
        self._by_path = (
            None
            if paths is None or any(id(module) not in paths for module in self._modules)
            else (
                tuple(paths[id(module)] for module in self._modules),
                tuple((calls, tuple(paths[id(module)] for module in modules)) for calls, modules in self._groups),
            )
        )

    def __call__(self, model: torch.nn.Module | None = None) -> None:
        if model is not None and self._by_path is not None and torch.compiler.is_compiling():
            return self._count_from(model)
        if tuple(map(type, self._modules)) != self._classes:
            self.__init__(self._statistics, self._paths)
        for calls, modules in self._groups:  # integer counters: no graph to keep out (no no_grad())
            counters = (
                [module._buffers.get("num_batches_tracked") for module in modules]
                if torch.compiler.is_compiling()
                # the loop dynamo traces
                else map(dict.get, map(getattr, modules, repeat("_buffers")), repeat("num_batches_tracked"))
            )
            counters = [counter for counter in counters if counter is not None]
            if counters:
                torch._foreach_add_(counters, calls)

    def _count_from(self, model: torch.nn.Module) -> None:
        """:meth:`__call__`'s loop as Dynamo traces it, each module walked to from ``model``."""
        paths, groups = self._by_path
        if tuple(type(walk(model, path)) for path in paths) != self._classes:  # a class assigned since: sorted again
            self.__init__(self._statistics, self._paths)
            return self()
        for calls, group in groups:
            counters = [walk(model, path)._buffers.get("num_batches_tracked") for path in group]
            counters = [counter for counter in counters if counter is not None]
            if counters:
                torch._foreach_add_(counters, calls)


class HookWatch:
    """A model's hooks as bound (:func:`symgrad.fingerprint.hooks_of`), and what shows at each call, in a
    few C calls, whether any was registered or removed since: ``RemovableHandle``'s counter (every
    registration moves it), every hook dictionary's keys (the handles' ids, which a registration or a
    removal changes), and at every call those of the dictionaries that hold a hook (a removal moves no
    counter)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.hooks = hooks_of(model)
        self._watch()

    def _watch(self) -> None:
        self._epoch = RemovableHandle.next_id
        self._dictionaries = hook_dictionaries(self.model)
        self._keys = tuple(map(tuple, self._dictionaries))
        self._hooked = tuple(dictionary for dictionary in self._dictionaries if dictionary)
        self._hooked_keys = tuple(map(tuple, self._hooked))

    def moved(self) -> bool:
        """Whether a hook may have been registered or removed since (then :meth:`changes` says)."""
        return RemovableHandle.next_id != self._epoch or tuple(map(tuple, self._hooked)) != self._hooked_keys

    def changes(self) -> dict[str, str | None]:
        """The model's hooks now (``hooks_of``) where they differ from those bound, else {} (and the
        watch taken again: a tensor hook moved the counter, or nothing moved)."""
        if tuple(map(tuple, self._dictionaries)) == self._keys:
            self._epoch = RemovableHandle.next_id
            return {}
        now = hooks_of(self.model)
        if now == self.hooks:
            self._watch()
            return {}
        return now
