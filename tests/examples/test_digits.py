"""examples/train_digits.py: a residual CNN with BatchNorm and dropout, traced without a loss in both
modes, bound with symgrad.bind and trained on scikit-learn's digits beside the same network trained with
autograd from the same seed; in float64 the two runs agree to 1e-10, and the bound model reaches 95 %
test accuracy in eval mode without a second trace."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

if importlib.util.find_spec("sklearn") is None:  # looked for, not imported: 0.8 s of CPU at every worker's collection
    pytest.skip("the example reads scikit-learn's bundled digits (the test extra installs it)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("train_digits", ROOT / "examples" / "train_digits.py")
train_digits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_digits)


def _differences(output: str) -> tuple[float, float]:
    found = re.search(r"parameters and buffers (\S+), loss curve (\S+)", output)
    assert found, output
    return float(found.group(1)), float(found.group(2))


def test_a_few_steps_with_bind_equal_autograd_in_float64(capsys):
    assert train_digits.main(["--epochs", "1", "--steps", "4"]) == 0
    output = capsys.readouterr().out
    assert max(_differences(output)) <= 1e-10, output


def test_a_difference_in_the_bound_step_fails_the_example(monkeypatch, capsys):
    """The verdict can fail: a bound model whose logits are off by a little is caught."""
    bound_copy = train_digits.bound_copy

    def off(model, folder):
        fast = bound_copy(model, folder)
        forward = fast.forward
        fast.forward = lambda x: forward(x) * (1 + 1e-6)
        return fast

    monkeypatch.setattr(train_digits, "bound_copy", off)
    assert train_digits.main(["--epochs", "1", "--steps", "2"]) == 1
    assert "differ by more than 1e-10" in capsys.readouterr().err


@pytest.mark.slow
def test_the_full_example_reaches_95_percent_and_its_curves_agree(capsys):
    assert train_digits.main([]) == 0
    output = capsys.readouterr().out
    assert max(_differences(output)) <= 1e-10, output
    accuracy = float(re.search(r"test accuracy: symgrad (\S+),", output).group(1))
    assert accuracy >= 0.95, output
