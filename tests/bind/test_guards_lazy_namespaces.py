"""The trace guards read a lazy namespace module (``torch.classes``, which makes a namespace of any name
read from it and raises on the next read; a user's module with ``__getattr__``) by what it holds, never
through getattr: a forward whose code reads one traces (Restormer's einops blocks failed with "Tried to
instantiate class '__qualname__.__file__'"), and the user's own code is still guarded."""

from __future__ import annotations

import sys
import types

import torch

from symgrad import guards, value_guard

CLASSES = torch.classes


class LazyNamespace(types.ModuleType):
    """A module that, like torch.classes, answers any attribute it lacks with another namespace."""

    def __getattr__(self, name):
        return LazyNamespace(f"{self.__name__}.{name}")


LAZY = LazyNamespace("user_lazy_namespace")
LAZY.scale = lambda x: x * 2.0


def reads_torch_classes(x):
    return x * 2.0 if CLASSES is not None else x


def reads_a_lazy_module(x):
    return LAZY.scale(x)


class Net(torch.nn.Module):
    def forward(self, x):
        return reads_a_lazy_module(reads_torch_classes(x))


def test_a_forward_reading_lazy_namespaces_is_guarded_without_reading_through_them():
    assert guards.value_text(torch.classes) == ".torch.classes"
    assert guards.value_text(LAZY) == ".user_lazy_namespace"
    model = Net()
    functions = guards.functions_of(model)
    assert {
        "Net.forward",
        "Net.forward/reads_torch_classes",
        "Net.forward/reads_a_lazy_module",
        "Net.forward/reads_a_lazy_module/LAZY.scale",
    } <= set(functions)
    called = {function.__code__ for function in functions.values()}
    codes, _ = guards.code_guards(model, called)
    assert guards.resolved(model, codes) == {path: functions[path] for path in codes}
    assert value_guard.code_difference({"code": codes}, model) is None
    before = LAZY.scale
    LAZY.scale = lambda x: x * 3.0  # the user's code behind the lazy module, edited: still guarded
    try:
        assert "LAZY.scale" in value_guard.code_difference({"code": codes}, model)
    finally:
        LAZY.scale = before
    assert sys.modules.get("user_lazy_namespace") is None
