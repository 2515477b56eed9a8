"""``python -m benchmarks.gradcheck_trust FOLDER NAME`` (the upstream check's helper, run by hand: it broke
silently once, 3b5d9e8, when generated test files stopped importing what it read from them): on the smallest
committed generated module, both checks pass for the explicit backward and for autograd, and a backward made
wrong is called wrong (autograd passes where it fails). A few seconds of CPU: the helper's two checks
(gradgradcheck's is most of it) run twice, on the right backward and on the wrong one, the least that shows both
verdicts."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import torch

from benchmarks import gradcheck_trust

GENERATED = Path(__file__).resolve().parents[2] / "generated"
NAME = "seed3_conv_relu_conv"


class _Doubled(torch.autograd.Function):
    """The identity whose backward doubles the cotangent: the loss as before, its gradient wrong."""

    @staticmethod
    def forward(ctx, loss):
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


def test_gradcheck_trust_passes_a_generated_module_and_calls_a_wrong_backward_wrong(tmp_path, monkeypatch, capsys):
    for file in (f"{NAME}.py", f"test_{NAME}.py", "_symgrad_testdata.py"):
        shutil.copy(GENERATED / file, tmp_path / file)
    monkeypatch.setattr(sys, "path", list(sys.path))  # main puts the folder first
    monkeypatch.setattr(sys, "argv", ["gradcheck_trust", str(tmp_path), NAME])
    gradcheck = importlib.import_module("torch.autograd.gradcheck")  # the module, not the function
    slow = gradcheck._run_slow_mode_and_get_error
    monkeypatch.setattr(gradcheck, "_run_slow_mode_and_get_error", slow)  # main replaces it: put back after
    try:
        assert gradcheck_trust.main() == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines == [
            "gradcheck explicit: passes; autograd: passes; passes",
            "gradgradcheck explicit: passes; autograd: passes; passes",
        ], lines
        tests = sys.modules[f"test_{NAME}"]
        right = tests.explicit_backward
        monkeypatch.setattr(tests, "explicit_backward", lambda inputs: _Doubled.apply(right(inputs)))
        assert gradcheck_trust.main() == 0
        lines = capsys.readouterr().out.splitlines()
    finally:
        sys.modules.pop(f"test_{NAME}", None)
    assert len(lines) == 2 and all(
        line.startswith(("gradcheck explicit: numerical", "gradgradcheck")) for line in lines
    )
    assert lines[0].endswith("; autograd: passes; WRONG: autograd passes where the explicit backward fails"), lines
