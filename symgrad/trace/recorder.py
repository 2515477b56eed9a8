"""Running user code once while recording every torch call it makes.

A ``TorchFunctionMode`` sees each call into torch (``F.conv2d``, ``Tensor.view``, ``torch.cat``,
``x += y``): the recorder runs it, keeps the call with its arguments and result, the user's own
``file:line`` that made it and the path of the ``nn.Module`` it ran in (``layer2.0.bn1``), read
from module forward hooks. Calls made inside a recorded call (``F.interpolate``'s own kernels) are
not seen: the mode is off while its handler runs. Queries of size, type and layout are not kept.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.modules import module as module_hooks
from torch.overrides import TorchFunctionMode

SHAPE_QUERIES = frozenset({
    "size", "dim", "ndimension", "numel", "nelement", "stride", "element_size", "is_contiguous", "is_floating_point",
    "is_complex", "get_device", "data_ptr", "item", "tolist", "__float__", "__int__", "__index__", "__bool__",
    "__len__", "__format__", "__repr__", "__hash__", "_set_grad_enabled", "requires_grad_", "__get__"})
"""Calls that only read sizes, types or values: they leave no trace in the spec (``__get__`` is a
property such as ``.shape``; one that returns a tensor, such as ``.T``, is recorded by its name)."""

BOOLEAN_DISPATCH = {F.max_pool1d: "max_pool1d", F.max_pool2d: "max_pool2d", F.max_pool3d: "max_pool3d",
                    F.adaptive_max_pool1d: "adaptive_max_pool1d", F.adaptive_max_pool2d: "adaptive_max_pool2d",
                    F.adaptive_max_pool3d: "adaptive_max_pool3d"}
"""``torch.nn.functional`` functions whose Python name is a dispatcher's (``fn``), by identity."""

LIBRARY_DIRS = tuple(os.path.join(os.path.realpath(path), "") for path in (
    os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)), sysconfig.get_paths()["stdlib"]))


def _is_users(filename: str) -> bool:
    """Whether code in ``filename`` is the user's: not torch, symgrad or the standard library."""
    return not filename.startswith("<") and not os.path.realpath(filename).startswith(LIBRARY_DIRS)


def user_line(frame=None) -> str:
    """``file:line`` of the innermost frame in the user's own code."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        if _is_users(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<traced code>"


def user_line_of_traceback(traceback) -> str:
    """``file:line`` of the innermost user frame of an exception's traceback."""
    found = "<traced code>"
    while traceback is not None:
        if _is_users(traceback.tb_frame.f_code.co_filename):
            found = f"{traceback.tb_frame.f_code.co_filename}:{traceback.tb_lineno}"
        traceback = traceback.tb_next
    return found


@dataclass
class Call:
    """One recorded torch call."""

    name: str
    """The function's name: ``conv2d``, ``view``, ``add_``, ``__getitem__``, ``max_pool2d``."""
    function: Callable
    arguments: tuple
    keywords: dict[str, Any]
    result: Any
    where: str
    module: str
    """Path of the innermost ``nn.Module`` running (``layer2.0.bn1``); empty outside any module."""
    leaf: bool
    """Whether that module has no submodules (so the call is the module's own op)."""


def function_name(function: Callable) -> str:
    if function in BOOLEAN_DISPATCH:
        return BOOLEAN_DISPATCH[function]
    return getattr(function, "__name__", None) or repr(function)


class Recorder(TorchFunctionMode):
    """Records the torch calls of the code run inside it; ``module_paths`` maps id(module) to its path."""

    def __init__(self, module_paths: dict[int, str]):
        super().__init__()
        self.calls: list[Call] = []
        self.module_paths = module_paths
        self.running: list[torch.nn.Module] = []
        self._hooks: list = []

    def __enter__(self):
        self._hooks = [module_hooks.register_module_forward_pre_hook(self._entered),
                       module_hooks.register_module_forward_hook(self._left, always_call=True)]
        return super().__enter__()

    def _entered(self, module, arguments) -> None:  # a hook returning a value would replace the input
        self.running.append(module)

    def _left(self, module, arguments, output) -> None:  # ... or the output
        self.running.pop()

    def __exit__(self, *exception):
        for hook in self._hooks:
            hook.remove()
        self.running.clear()
        return super().__exit__(*exception)

    def __torch_function__(self, function, types, arguments=(), keywords=None):
        keywords = keywords or {}
        result = function(*arguments, **keywords)
        name = function_name(function)
        if name == "__get__":
            if not isinstance(result, torch.Tensor):
                return result
            name = getattr(getattr(function, "__self__", None), "__name__", name)  # .T, .mT, .data
        elif name in SHAPE_QUERIES:
            return result
        module = self.running[-1] if self.running else None
        path = self.module_paths.get(id(module), type(module).__name__) if module is not None else ""
        leaf = module is not None and next(iter(module.children()), None) is None
        self.calls.append(Call(name, function, tuple(arguments), dict(keywords), result, user_line(sys._getframe(1)), path, leaf))
        return result
