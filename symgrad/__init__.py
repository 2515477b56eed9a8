"""symgrad: explicit, closed-form, differentiable gradient code for PyTorch models.

``trace`` (a model to a spec), ``trace_modes`` (its train- and eval-mode specs), ``generate`` (a spec's
gradient module, test and derivation), ``bind`` (train the model with that module) and ``check`` (are
generated files up to date with their specs) are the API; the command line mirrors it. The public names
are imported on first use, so ``symgrad --help`` and ``import symgrad`` do not pay for torch and sympy
until a command or function needs them.
"""

__version__ = "0.1.0"

__all__ = [
    "BindError",
    "Bound",
    "Generated",
    "SpecError",
    "Staleness",
    "SymgradError",
    "__version__",
    "bind",
    "check",
    "generate",
    "trace",
    "trace_modes",
]

_LAZY = {
    "Generated": "api",
    "generate": "api",
    "SpecError": "errors",
    "SymgradError": "errors",
    "bind": "bound_model",
    "Bound": "binding",
    "BindError": "binding",
    "trace_modes": "trace",
    "Staleness": "stale",
}
_CALLABLE_MODULES = ("trace", "check")
"""Submodules that are their function too (``symgrad.trace(model, shapes)``; ``symgrad/callable_module.py``)."""


def __getattr__(name: str):
    if name in _CALLABLE_MODULES:
        from importlib import import_module

        return import_module(f".{name}", __name__)
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'symgrad' has no attribute {name!r}")
