"""symgrad: explicit, closed-form, differentiable gradient code for convolutional networks.

The public names are imported on first use, so ``symgrad --help`` and ``import symgrad`` do not pay
for torch and sympy until a command or function needs them.
"""

__version__ = "0.1.0"

__all__ = ["BindError", "Bound", "Generated", "SpecError", "SymgradError", "__version__", "bind", "generate"]

_LAZY = {"Generated": "api", "generate": "api", "SpecError": "errors", "SymgradError": "errors", "bind": "bound_model",
         "Bound": "binding", "BindError": "binding"}


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'symgrad' has no attribute {name!r}")
