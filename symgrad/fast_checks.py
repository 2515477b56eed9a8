"""The per-call work of a bound step (``binding.Guard``) done with as little Python as it allows.

A bound step reads the model's tensors, checks the model is as bound and counts the batch at every
call: one read of each parameter, buffer, submodule, hyper-parameter and mode. Each helper here walks
those objects in C (``map`` over ``getattr``, ``dict.__getitem__``, ``attrgetter``, then one tuple
comparison), and where anything differs from what was bound it returns to the caller's plain loop,
which reads or refuses exactly as before (its messages are the guard's own). Measured on ResNet-18 of
width 8 at 2 × 32² on the 2-core CPU, that is no faster than the plain loops: about 50 µs timed in a
loop, and about 300 µs right after an autograd step, as a training loop calls it, where the cost is
the first touch of the ~200 Python objects read, which a C loop pays as well.
"""

from __future__ import annotations

import operator
from itertools import repeat

import torch
from torch.utils.hooks import RemovableHandle

from .fingerprint import hook_dictionaries, hooks_of

_CALL = operator.attrgetter.__call__  # map(_CALL, getters, objects): each getter on its object, in C


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

    def __init__(self, state: dict):
        self._state = state
        self.names = tuple(state)
        self._owners = tuple(owner for owner, _ in state.values())
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

    def read(self, data: dict) -> tuple[dict, dict]:
        """What ``read_state(state, data)`` gives, and its model tensors alone (name -> tensor)."""
        values = self.values()
        if values is None:
            arguments = read_state(self._state, data)
            return arguments, {name: arguments[name] for name in self.names}
        tensors = dict(zip(self.names, values))
        return {**data, **tensors}, tensors


class Snapshot:
    """The submodules, hyper-parameters and modes a bound model was bound with, compared in a few C
    calls: ``unchanged()`` is True where every child is the same object, every hyper-parameter equal
    (``is`` or ``==``, as the guard compares them) and every mode-reading module in its traced mode;
    False sends the caller to its own checks, which name what changed."""

    def __init__(self, children, hypers, modes=()):
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

    @property
    def watches_modes(self) -> bool:
        """Whether any module's mode is compared (a module whose code reads ``self.training``, as traced)."""
        return bool(self._mode_owners)

    def modes_unchanged(self) -> bool:
        """Whether every mode-reading module is in the mode it was traced in."""
        return tuple(map(operator.attrgetter("training"), self._mode_owners)) == self._modes

    def unchanged(self) -> bool:
        now = map(dict.get, map(getattr, self._parents, repeat("_modules")), self._child_names)
        if not all(map(operator.is_, now, self._children)):
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

    def __init__(self, statistics):
        self._statistics = tuple(statistics)
        self._modules = tuple(entry.module for entry in self._statistics)
        self._classes = tuple(map(type, self._modules))
        groups: dict[int, list] = {}
        for entry in self._statistics:  # nn.InstanceNorm keeps num_batches_tracked but never moves it
            if isinstance(entry.module, torch.nn.modules.batchnorm._BatchNorm):
                groups.setdefault(entry.calls, []).append(entry.module)
        self._groups = tuple((calls, tuple(modules)) for calls, modules in groups.items())

    def __call__(self) -> None:
        if tuple(map(type, self._modules)) != self._classes:
            self.__init__(self._statistics)
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
