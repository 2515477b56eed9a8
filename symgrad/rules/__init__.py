"""The rule registry: every op symgrad can differentiate, by its ``torch.nn.functional`` name.

Each module of this package declares its ops in a list ``RULES``, each op's test cases in the dicts
``SAMPLES`` (spec-level cases, ``base.Sample``) and ``SPELLINGS`` (how models write it,
``base.Spelling``), keyed by op, and, for its linear ops, the cases ``symgrad certify`` proves in a
list ``CERTIFICATES``; the registry collects every module's lists and sets each rule's ``samples``
and ``spellings``, so adding an op is adding a rule with its samples and spellings to a module (or a
new module) here and nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Rule


def _collect() -> tuple[dict[str, Rule], dict[str, Rule], list[tuple]]:
    layers: dict[str, Rule] = {}
    losses: dict[str, Rule] = {}
    certificates: list[tuple] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        certificates += getattr(module, "CERTIFICATES", [])
        rules = getattr(module, "RULES", ())
        for rule in rules:
            table = losses if rule.is_loss else layers
            if rule.op in layers or rule.op in losses:
                raise ValueError(f"two rules declare the op {rule.op!r} (one in symgrad/rules/{info.name}.py)")
            table[rule.op] = rule
        _declare(info.name, module, rules)
    return layers, losses, certificates


def _declare(name: str, module, rules) -> None:
    """Set each rule's ``samples`` and ``spellings`` from its module's ``SAMPLES`` and ``SPELLINGS``;
    a key that names no op of the module's ``RULES`` (a typo) is refused."""
    for kind in ("SAMPLES", "SPELLINGS"):
        declared = getattr(module, kind, {})
        stray = set(declared) - {rule.op for rule in rules}
        if stray:
            raise ValueError(f"symgrad/rules/{name}.py: {kind} names {sorted(stray)}, not ops of its RULES")
        for rule in rules:
            setattr(rule, kind.lower(), tuple(declared.get(rule.op, ())))


LAYER_RULES, LOSS_RULES, CERTIFICATE_CASES = _collect()
"""The ops by name, and each linear op's certificate cases (``symgrad certify``), as each rules module
declares them in ``RULES`` and ``CERTIFICATES``."""


def all_rules() -> list[Rule]:
    return [*LAYER_RULES.values(), *LOSS_RULES.values()]
