"""The exact adjoint certificates pass for the emitted code, fail for a wrong adjoint, and cover
every rule that declares itself linear or bilinear."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from symgrad.algebra import PRIMITIVES
from symgrad.certify import CASES, LINEAR_CASES, certify, certify_linear
from symgrad.cli import main
from symgrad.rules import all_rules


def test_symgrad_certify_proves_every_case():
    result = CliRunner().invoke(main, ["certify"])
    assert result.exit_code == 0, result.output
    assert result.output.count("certified  ") == len(CASES) + len(LINEAR_CASES) and "FAILED" not in result.output


def test_every_linear_rule_has_a_certificate():
    covered = {f"conv{case.dims}d" for case in CASES} | {layer["op"] for _, _, layer, _ in LINEAR_CASES}
    linear_rules = {rule.op for rule in all_rules() if rule.linear_in}
    assert linear_rules <= covered, f"no certificate case for {sorted(linear_rules - covered)}"


def _negated(monkeypatch, name):
    original = PRIMITIVES[name]
    wrong = dataclasses.replace(
        original, code=lambda operands, params, show: f"(-{original.code(operands, params, show)})"
    )
    monkeypatch.setitem(PRIMITIVES, name, wrong)


@pytest.mark.parametrize("primitive", ["conv_transpose", "conv_weight_grad"])
def test_a_wrong_conv_adjoint_is_caught(monkeypatch, primitive):
    """The readable forms (what the documents, ``hvp`` and an unbatched input run): conv_transpose for
    the input's gradient alone, and the weight's correlation, which ``gradients`` replaces by one
    ``convolution_backward`` call for a batched input and ``certify`` proves apart."""
    _negated(monkeypatch, primitive)
    with pytest.raises(AssertionError, match=r"adjoint \(alone\) is not"):
        certify(CASES[1])


def test_a_wrong_unbatched_weight_correlation_is_caught(monkeypatch):
    """``conv_weight_grad`` of an unbatched input (its ``.unsqueeze(0)`` form), which ``gradients``
    runs: the unbatched certificate case proves it."""
    _negated(monkeypatch, "conv_weight_grad")
    label, inputs, layer, linear = next(item for item in LINEAR_CASES if item[0] == "conv2d (unbatched)")
    with pytest.raises(AssertionError, match="is not the transpose"):
        certify_linear(label, inputs, layer, linear)


@pytest.mark.parametrize(
    "primitive, case",
    [
        ("avg_pool_adjoint", "avg_pool2d"),
        ("linear_weight_grad", "linear"),
        ("flip", "pad reflect"),
        ("upsample_backward", "interpolate bicubic"),
        ("axis_contraction", "adaptive_avg_pool1d (unbatched)"),
        ("resampling_matrix", "adaptive_avg_pool1d (unbatched)"),
        ("pad", "conv2d padding='same', even kernel (asymmetric)"),
    ],
)  # one matrix: negating two would cancel
def test_a_wrong_linear_adjoint_is_caught(monkeypatch, primitive, case):
    _negated(monkeypatch, primitive)
    label, inputs, layer, linear = next(item for item in LINEAR_CASES if item[0] == case)
    with pytest.raises(AssertionError, match="is not the transpose"):
        certify_linear(label, inputs, layer, linear)


@pytest.mark.parametrize(
    "mask, form",
    [((True, True, False), "fused"), ((False, True, False), "fused, weight alone")],
    ids=["both gradients", "weight alone"],
)
def test_a_wrong_fused_conv_adjoint_is_caught(monkeypatch, mask, form):
    """Each fused form (one convolution_backward call for both gradients, and for the weight's alone)
    is certified on its own: the call with that mask alone reads the cotangent reversed along the last
    axis, which keeps every shape and every entry an integer, so only the comparison with the
    definition's coefficients can catch it, and the message names the form."""
    from symgrad.algebra import PRIMITIVES

    original = PRIMITIVES["conv_backward"]

    def flipped(operands, params, show):
        if tuple(params["output_mask"]) == mask:
            operands = [f"{operands[0]}.flip(-1)", *operands[1:]]
        return original.code(operands, params, show)

    monkeypatch.setitem(PRIMITIVES, "conv_backward", dataclasses.replace(original, code=flipped))
    with pytest.raises(AssertionError, match=rf"\({form}\) is not"):
        certify(CASES[0])
