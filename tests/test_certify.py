"""The exact adjoint certificates pass for the emitted code, and fail for a wrong adjoint."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from symgrad.algebra import PRIMITIVES
from symgrad.certify import CASES, certify
from symgrad.cli import main


def test_symgrad_certify_proves_every_case():
    result = CliRunner().invoke(main, ["certify"])
    assert result.exit_code == 0, result.output
    assert result.output.count("certified  ") == len(CASES) and "residual 0" in result.output


@pytest.mark.parametrize("primitive", ["conv_transpose", "conv_weight_grad"])
def test_a_wrong_adjoint_is_caught(monkeypatch, primitive):
    original = PRIMITIVES[primitive]
    wrong = dataclasses.replace(original, code=lambda operands, params, show: f"(-{original.code(operands, params, show)})")
    monkeypatch.setitem(PRIMITIVES, primitive, wrong)
    with pytest.raises(AssertionError, match="is not"):
        certify(CASES[1])
