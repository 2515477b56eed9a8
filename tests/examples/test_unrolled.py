"""The unrolled example: explicit inner gradients train exactly like nested autograd, also under DDP."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import unrolled_deblur  # noqa: E402


def test_explicit_inner_gradient_is_the_autograd_one_to_second_order():
    x0, k, y, _ = unrolled_deblur.synthetic_data(2)
    x = x0[:, :, :64, :64].clone().requires_grad_()
    k, y = k[:8], y[:, :8, :2, :2]
    explicit = unrolled_deblur.data_gradient_explicit(x, k, y)
    nested = unrolled_deblur.data_gradient_autograd(x, k, y)
    assert torch.allclose(explicit, nested, rtol=1e-12, atol=1e-12)
    v = torch.randn_like(x)
    (hvp_explicit,) = torch.autograd.grad((explicit * v).sum(), x)
    (hvp_nested,) = torch.autograd.grad((nested * v).sum(), x)
    assert torch.allclose(hvp_explicit, hvp_nested, rtol=1e-10, atol=1e-12)


def test_short_training_ends_with_identical_parameters(tmp_path: Path):
    explicit_losses, explicit = unrolled_deblur.train("explicit", iterations=3, batch=2)
    autograd_losses, nested = unrolled_deblur.train("autograd", iterations=3, batch=2)
    assert ((explicit - nested).norm() / nested.norm()).item() <= 1e-10
    assert explicit_losses == pytest.approx(autograd_losses, rel=1e-12)
    assert explicit_losses[-1] < explicit_losses[0]


def test_script_prints_curves_and_saves_plot(tmp_path: Path):
    plot = tmp_path / "loss.png"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "unrolled_deblur.py"),
            "--iterations",
            "2",
            "--batch",
            "2",
            "--plot",
            str(plot),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "relative difference explicit vs nested autograd" in result.stdout
    assert plot.stat().st_size > 10_000


WITHOUT_MATPLOTLIB = (
    "import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = [sys.argv[1], *sys.argv[2:]]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def test_script_after_command_a_writes_nothing_and_needs_no_matplotlib(tmp_path: Path):
    """Command (a) installs no matplotlib: the example runs without it and writes no file unless asked."""
    committed = ROOT / "docs" / "images" / "unrolled_deblur_loss.png"
    before = committed.stat().st_mtime_ns
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT_MATPLOTLIB,
            str(ROOT / "examples" / "unrolled_deblur.py"),
            "--iterations",
            "2",
            "--batch",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "relative difference explicit vs nested autograd" in result.stdout
    assert committed.stat().st_mtime_ns == before and list(tmp_path.iterdir()) == []
    asked = subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, str(ROOT / "examples" / "unrolled_deblur.py"), "--plot", "loss.png"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert asked.returncode == 2 and "symgrad[plot]" in asked.stderr and "Traceback" not in asked.stderr


@pytest.mark.slow
def test_distributed_data_parallel_matches_single_process(tmp_path: Path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    assert torchrun, "torchrun is installed with torch"
    result_file = tmp_path / "ddp.json"
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc_per_node=2",
            str(ROOT / "examples" / "unrolled_deblur.py"),
            "--distributed",
            "--iterations",
            "3",
            "--batch",
            "2",
            "--result",
            str(result_file),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    distributed = json.loads(result_file.read_text())
    losses, parameters = unrolled_deblur.train("explicit", iterations=3, batch=2)
    difference = (torch.tensor(distributed["parameters"], dtype=torch.float64) - parameters).norm() / parameters.norm()
    assert difference.item() <= 1e-10
    assert distributed["losses"] == pytest.approx(losses, rel=1e-10)
