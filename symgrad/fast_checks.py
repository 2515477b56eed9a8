"""The per-call work of a bound step (``binding.Guard``) done with as little Python as it allows.

A bound step reads the model's tensors, checks the model is as bound and counts the batch at every
call. At the sizes where the kernels cost little (ResNet-18 of width 8 at 2 × 32²) that work was
about 120 µs of a 5 ms step (84 µs the checks, 36 µs the counting): ``nn.Module.__getattr__`` once per parameter and buffer, one comparison
per submodule and hyper-parameter, one ``add_`` per BatchNorm. Each helper here does the same work
with fewer Python frames, and where anything differs from what was bound it returns to the caller's
plain loop, which reads or refuses exactly as before (its messages are the guard's own).
"""

from __future__ import annotations

import operator

import torch


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


class Snapshot:
    """The submodules and hyper-parameters a bound model was bound with, compared in a few C calls per
    module: ``unchanged()`` is True where every child is the same object and every hyper-parameter
    equal (``is`` or ``==``, as the guard compares them); False sends the caller to its own checks,
    which name what changed."""

    def __init__(self, children, hypers):
        self._children = children  # (parent, name, child): cheap to compare one by one
        modules: dict[int, tuple] = {}
        for _, module, key, value in hypers:
            modules.setdefault(id(module), (module, [], []))
            modules[id(module)][1].append(key)
            modules[id(module)][2].append(value)
        self._hypers = tuple((module, operator.attrgetter(*keys), tuple(values) if len(keys) > 1 else values[0])
                             for module, keys, values in modules.values())

    def unchanged(self) -> bool:
        for parent, name, child in self._children:
            if parent._modules.get(name) is not child:
                return False
        try:
            for module, read, values in self._hypers:  # attrgetter of several keys: a tuple, in one C call
                now = read(module)
                if now is not values and now != values:
                    return False
        except AttributeError:  # a hyper-parameter deleted: the guard's loop says which
            return False
        return True


def count_batches(statistics) -> None:
    """``num_batches_tracked`` of each training-mode ``nn.BatchNorm`` in ``statistics``, moved by how often
    the traced forward runs it, as the module's forward moves it: one ``torch._foreach_add_`` per count."""
    counters: dict[int, list] = {}
    for entry in statistics:
        counter = entry.module._buffers.get("num_batches_tracked")
        if counter is not None and isinstance(entry.module, torch.nn.modules.batchnorm._BatchNorm):
            counters.setdefault(entry.calls, []).append(counter)  # nn.InstanceNorm keeps it but never moves it
    with torch.no_grad():
        for calls, tensors in counters.items():
            torch._foreach_add_(tensors, calls)
