"""Every rule's samples (``SAMPLES`` in its ``symgrad/rules/`` module, ``rule.samples``) as spec texts:
the one case list that the rule tests, the emitted-lines golden files and the fused-kernel tests iterate,
so that a new rule's samples are tested without an edit here."""

from __future__ import annotations

import pytest

from symgrad.rules import all_rules
from symgrad.rules.base import Sample
from tests.helpers import spec_text

SQ = {"op": "half_sq_error", "target": "y", "reduction": "sum"}
"""A sample's loss when it names none."""


def sample_text(sample: Sample) -> str:
    """The sample as a spec (YAML), as a user writes one."""
    return spec_text(sample.inputs, sample.layers, sample.loss or SQ, sample.wrt)


OWNERS = {sample.id: rule for rule in all_rules() for sample in rule.samples}
"""Each sample's id: the rule that declares it."""
CASES = [pytest.param(sample_text(sample), id=sample.id) for rule in all_rules() for sample in rule.samples]
"""Every rule's samples, in the registry's order."""
TEXTS = {case.id: case.values[0] for case in CASES}
