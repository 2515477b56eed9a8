"""examples/train_resnet.py: a torchvision-style ResNet-18 and a U-Net, traced from the example's own
file, trained with symgrad.bind and with autograd; in float64 the two end within 1e-10, alone and
under DistributedDataParallel (2 processes, gloo)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("train_resnet", ROOT / "examples" / "train_resnet.py")
train_resnet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_resnet)


def test_both_models_train_the_same_with_bind_and_with_autograd(capsys):
    assert train_resnet.main(["--steps", "3", "--size", "24"]) == 0
    lines = capsys.readouterr().out.splitlines()
    verdicts = [line for line in lines if "largest relative difference" in line]
    assert len(verdicts) == 2 and all(line.endswith("[ok]") for line in verdicts), lines
    for kind in ("resnet18", "unet"):
        explicit = next(line for line in lines if line.startswith(f"{kind}: loss with symgrad.bind"))
        assert len(explicit.split()[4:]) == 3


def test_a_difference_above_the_tolerance_fails(monkeypatch, capsys):
    train = train_resnet.train

    def off(*arguments):
        explicit, autograd, _ = train(*arguments)
        return explicit, autograd, 1e-9

    monkeypatch.setattr(train_resnet, "train", off)
    assert train_resnet.main(["--steps", "1", "--size", "16", "--model", "unet"]) == 1
    assert "[above 1e-10]" in capsys.readouterr().out


@pytest.mark.slow
def test_distributed_bound_training_equals_distributed_autograd_training():
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    assert torchrun, "torchrun is installed with torch"
    run = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc_per_node=2",
            str(ROOT / "examples" / "train_resnet.py"),
            "--distributed",
            "--steps",
            "3",
            "--size",
            "24",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # each verdict as it ends, whatever the other rank wrote beside it
    verdicts = re.findall(
        r"largest relative difference of parameters and buffers after \d+ steps: \S+ \[([^\]]*)\]", run.stdout
    )
    assert verdicts == ["ok"] * 4, run.stdout  # 2 ranks x 2 models
