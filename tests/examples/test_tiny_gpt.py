"""examples/train_tiny_gpt.py: a character-level nanoGPT-style model on the docstrings of standard-library
modules, trained with symgrad.bind and with autograd; in float64 the two loss curves and parameters agree."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("train_tiny_gpt", ROOT / "examples" / "train_tiny_gpt.py")
train_tiny_gpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_tiny_gpt)

TINY = ["--steps", "2", "--layers", "1", "--embd", "8", "--block", "6", "--batch", "2", "--sample", "4"]


def test_the_bound_and_autograd_loss_curves_are_equal(capsys):
    assert train_tiny_gpt.main(TINY) == 0
    lines = capsys.readouterr().out.splitlines()
    steps = [line.split() for line in lines if line.startswith("step ")]
    assert len(steps) == 2 and all(words[4] == words[6] for words in steps), lines  # printed to 12 digits
    written = [line.split(" writes: ")[1] for line in lines if " writes: " in line]
    assert len(written) == 2 and written[0] == written[1] and len(eval(written[0])) == 4
    assert lines[-1].endswith("[ok]"), lines


def test_a_difference_above_the_tolerance_fails(monkeypatch, capsys):
    """The verdict reads the parameters: the bound model's first one nudged by 1e-6 after training is reported."""
    original = train_tiny_gpt.sample
    calls = []

    def nudged(model, *arguments):
        if not calls:  # the bound model's, sampled first
            with torch.no_grad():
                next(model.parameters()).add_(1e-6)
        calls.append(model)
        return original(model, *arguments)

    monkeypatch.setattr(train_tiny_gpt, "sample", nudged)
    assert train_tiny_gpt.main(TINY) == 1
    assert "[above 1e-10]" in capsys.readouterr().out
