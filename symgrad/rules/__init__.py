"""The rule registry: every op symgrad can differentiate, by its ``torch.nn.functional`` name."""

from __future__ import annotations

from . import conv, elementwise, fill, layout, linear, loss, norm, pad, pool, reduce, resample
from .base import Rule

LAYER_RULES: dict[str, Rule] = {rule.op: rule for rule in [*conv.RULES, *elementwise.RULES, *linear.RULES, *layout.RULES, *pad.RULES, *resample.RULES, *pool.RULES, *norm.RULES, *reduce.RULES, *fill.RULES]}
LOSS_RULES: dict[str, Rule] = {rule.op: rule for rule in loss.RULES}


def all_rules() -> list[Rule]:
    return [*LAYER_RULES.values(), *LOSS_RULES.values()]
