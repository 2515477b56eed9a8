"""A module that is also its main function: ``symgrad.trace(...)`` and ``symgrad.check(...)``.

``symgrad.trace`` and ``symgrad.check`` name both a submodule and the public function the API exports
under that name. A package attribute cannot hold both: importing the submodule sets the attribute to the
module (whatever it held), so a function stored there would be replaced by the first import of its
submodule. Instead the submodule itself is made callable, calling the function: ``symgrad.trace(model,
{"x": (8, 3, 32, 32)})`` and ``symgrad.trace.trace_modes(...)`` both work, in any import order (the
``__class__`` assignment Python's data model documents for customising a module)."""

from __future__ import annotations

import sys
import types
from typing import Callable


def make_callable(module_name: str, function: Callable) -> None:
    """Calling the module ``module_name`` (already in ``sys.modules``) calls ``function``."""

    class CallableModule(types.ModuleType):
        def __call__(self, *arguments, **keywords):
            return function(*arguments, **keywords)

    sys.modules[module_name].__class__ = CallableModule
