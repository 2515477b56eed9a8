"""The generated test files a user keeps in CI: a wrong gradient fails them in seconds (torch's gradcheck,
on a mismatch in its fast mode, recomputed both Jacobians in full only to print them: smp FPN's failing
file ran 750-1470 s), a model with train-mode dropout written as blocks passes them (the re-run forward
of a second backward must draw the first forward's masks), and a one-channel spatial gate leaves them small
shapes (its channel was tied to the map's, so the tests ran at the traced size)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.expand import flatten
from symgrad.graph import build_graph
from symgrad.pipeline import build_text
from symgrad.shapes import small_shapes
from symgrad.spec import parse_spec
from symgrad.trace import LossChoice, trace

SCALED = '''

_explicit_backward = ExplicitGradient.backward


def _scaled_backward(ctx, grad_loss):
    """Every explicit gradient 10% too large: the broken backward the generated tests must catch."""
    return tuple(None if grad is None else 1.1 * grad for grad in _explicit_backward(ctx, grad_loss))


ExplicitGradient.backward = staticmethod(_scaled_backward)
'''


class Stem(nn.Module):
    """A small classifier as torchvision writes one: conv, BatchNorm, ReLU, pooled, a linear head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class DropBlock(nn.Module):
    """smp's decoder block shape: conv, GroupNorm, ReLU, then Dropout2d in place (train mode draws masks)."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm = nn.GroupNorm(2, channels)
        self.drop = nn.Dropout2d(p=0.2, inplace=True)

    def forward(self, x):
        return self.drop(F.relu(self.norm(self.conv(x))))


class BlockDropoutNet(nn.Module):
    """Two instances of one block (so ``symgrad trace`` writes the module as its blocks), a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.blocks = nn.Sequential(DropBlock(4), DropBlock(4))
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(x.mean((2, 3)))


def _generated(model, name, folder, appended=""):
    torch.manual_seed(0)
    text = trace(model.double().train(), {"x": (2, 3, 6, 6)}, name=name, loss=LossChoice("cross_entropy"),
                 mode="train", blocks=True)
    files = build_text(text, f"{name}.yaml").rendered.files
    for file_name, content in files.items():
        if file_name.endswith(".py"):
            (folder / file_name).write_text(content + (appended if file_name == f"{name}.py" else ""))
    return files[f"{name}.py"]


def _run(folder, name, only=""):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                           f"test_{name}.py", *(["-k", only] if only else [])], cwd=folder, capture_output=True,
                          text=True, timeout=600, env=os.environ)


def test_a_wrong_gradient_fails_gradcheck_without_the_full_jacobians(tmp_path):
    """Fast mode's mismatch is reported as it is: the slow-mode Jacobians torch would compute for the message
    (one forward per input entry: minutes for a network) are not computed."""
    _generated(Stem(), "stem", tmp_path, SCALED)
    result = _run(tmp_path, "stem", "gradcheck_of")
    assert "FAILED test_stem.py::test_gradcheck_of_the_explicit_backward" in result.stdout, result.stdout[-3000:]
    assert "Jacobian mismatch" in result.stdout, result.stdout[-3000:]
    assert "in slow mode" not in result.stdout, result.stdout[-3000:]


def test_a_block_models_generated_file_passes_with_train_mode_dropout(tmp_path):
    module = _generated(BlockDropoutNet(), "block_dropout", tmp_path)
    assert "def drop_block_backward(" in module  # written as its block
    result = _run(tmp_path, "block_dropout", "gradcheck_of or drop_in")
    assert result.returncode == 0 and " passed" in result.stdout, result.stdout[-3000:]


class SpatialGate(nn.Module):
    """smp's scSE spatial half: a 1x1 conv to one channel, a sigmoid, multiplied into the C-channel map."""

    def __init__(self, channels):
        super().__init__()
        self.sSE = nn.Sequential(nn.Conv2d(channels, 1, 1), nn.Sigmoid())

    def forward(self, x):
        return x * self.sSE(x)


class GatedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.gate = SpatialGate(8)
        self.head = nn.Conv2d(8, 1, 1)

    def forward(self, x):
        return self.head(self.gate(F.relu(self.conv(x))))


def test_a_one_channel_gate_keeps_small_test_shapes_and_its_file_passes(tmp_path):
    """The gate's product broadcasts its one channel over C: no tie between the two (tied, the sizes read back
    at the spec's gave the gate 8 channels, and the tests fell back to the traced shapes)."""
    from tests.models.compare import Case, assert_generated_test_file_passes, matches_autograd

    torch.manual_seed(0)
    text = trace(GatedNet().double().train(), {"x": (2, 3, 12, 12)}, name="gated", loss=LossChoice("mse_loss"))
    graph = build_graph(flatten(parse_spec(text, "gated.yaml")))
    small, other = small_shapes(graph)
    assert small["x"] != (2, 3, 12, 12) and math.prod(small["x"]) < 2 * 3 * 12 * 12, small
    assert small["gate_sSE_0_weight"][0] == other["gate_sSE_0_weight"][0] == 1, (small, other)
    case = Case(GatedNet, {"x": (2, 3, 12, 12)}, {"x": (3, 3, 10, 14)}, ("mse_loss",))
    matches_autograd("gated", case, "train")
    assert_generated_test_file_passes("gated", case, tmp_path)


def test_a_generated_test_file_fails_loudly_where_torch_renamed_the_step_it_stubs_out():
    """The fail-fast fixture stubs out a private torch function; under a torch without it the gradcheck
    test fails with a one-line reason (it silently ran the slow-mode dump again)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    without = ("import importlib, sys, pytest; gradcheck = importlib.import_module('torch.autograd.gradcheck'); "
               "del gradcheck._run_slow_mode_and_get_error; sys.exit(pytest.main(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", without, "-q", "-p", "no:cacheprovider", "-n", "0", "-k",
                             "test_gradcheck_of", "generated/test_seed1_strided_conv.py"], cwd=root,
                            capture_output=True, text=True, timeout=600)
    failed = "ERROR generated/test_seed1_strided_conv.py::test_gradcheck_of_the_explicit_backward"
    assert result.returncode != 0 and failed in result.stdout, result.stdout[-3000:]
    assert "has no gradcheck._run_slow_mode_and_get_error" in result.stdout, result.stdout[-3000:]
