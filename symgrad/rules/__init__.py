"""The rule registry: every op symgrad can differentiate, by its ``torch.nn.functional`` name.

Each module of this package declares its ops in a list ``RULES``; the registry collects every
module's list, so adding an op is adding a rule to a module (or a new module) here and nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Rule


def _collect() -> tuple[dict[str, Rule], dict[str, Rule]]:
    layers: dict[str, Rule] = {}
    losses: dict[str, Rule] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for rule in getattr(module, "RULES", ()):
            table = losses if rule.is_loss else layers
            if rule.op in layers or rule.op in losses:
                raise ValueError(f"two rules declare the op {rule.op!r} (one in symgrad/rules/{info.name}.py)")
            table[rule.op] = rule
    return layers, losses


LAYER_RULES, LOSS_RULES = _collect()


def all_rules() -> list[Rule]:
    return [*LAYER_RULES.values(), *LOSS_RULES.values()]
