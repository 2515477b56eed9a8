"""``symgrad.bind(..., cuda_graph=True)``: a bound step captured once per shape set and replayed as CUDA
graphs trains as autograd does, over several steps, BatchNorm statistics and counters included.

The CUDA tests run with ``SYMGRAD_TEST_DEVICE=cuda`` on a GPU (skipped otherwise); on the CPU the
same binding runs eagerly, which the last tests check here."""

from __future__ import annotations

import copy
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import symgrad
from symgrad.cuda_graph import GraphedStep
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_resnet import ResNet18, UNet  # noqa: E402 - torchvision-style models, as users write them

DEVICE = os.environ.get("SYMGRAD_TEST_DEVICE", "cpu")
on_cuda = pytest.mark.skipif(
    DEVICE != "cuda" or not torch.cuda.is_available(), reason="CUDA graphs: run with SYMGRAD_TEST_DEVICE=cuda on a GPU"
)


def generated_path(model, folder: Path, name: str, shapes: dict, loss: LossChoice | None) -> Path:
    """The module traced from ``model`` (train mode, the parameters), generated into ``folder``; its
    eval-mode sibling beside it where the trace writes one."""
    text = trace(model, shapes, wrt="parameters", name=name, loss=loss, mode="train")
    path = folder / f"{name}.py"
    path.write_text(build_text(text, f"{name}.yaml").rendered.files[f"{name}.py"])
    return path


def largest_difference(model, reference) -> float:
    """The largest difference of the parameters, their gradients and the buffers of two models."""
    pairs = [(a, b) for a, b in zip(model.parameters(), reference.parameters())]
    pairs += [(a.grad, b.grad) for a, b in zip(model.parameters(), reference.parameters())]
    pairs += list(zip(model.buffers(), reference.buffers()))
    return max((a.double() - b.double()).abs().max().item() for a, b in pairs)


def train_both(model, reference, batches, ours, theirs):
    """SGD with momentum on each batch, ``ours(batch)`` (the bound, graphed step's loss) and ``theirs(batch)``
    (autograd's) side by side; both losses as floats (a replay's output is overwritten by the next)."""
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9) for net in (model, reference)]
    losses = []
    for batch in batches:
        pair = []
        for loss_of, optimizer in zip((ours, theirs), optimizers):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(batch)
            loss.backward()
            optimizer.step()
            pair.append(loss.item())
        losses.append(pair)
    return losses


@on_cuda
def test_the_loss_form_replayed_trains_as_autograd_over_steps_and_shapes(tmp_path):
    torch.manual_seed(0)
    model = ResNet18(4).double().train()
    path = generated_path(
        model, tmp_path, "graphed_resnet", {"x": (2, 3, 32, 32)}, LossChoice("cross_entropy", "labels")
    )
    model = model.to("cuda")
    reference = copy.deepcopy(model)
    fast = symgrad.bind(path, model, cuda_graph=True)
    assert isinstance(fast, GraphedStep)
    generator = torch.Generator().manual_seed(1)
    sizes = [(4, 32), (4, 32), (4, 32), (2, 48), (4, 32), (2, 48)]  # two shape sets, each captured once
    batches = [
        {
            "x": torch.randn(batch, 3, size, size, generator=generator, dtype=torch.float64).cuda(),
            "labels": torch.randint(0, 10, (batch,), generator=generator).cuda(),
        }
        for batch, size in sizes
    ]
    losses = train_both(
        model,
        reference,
        batches,
        lambda batch: fast(**batch),
        lambda batch: F.cross_entropy(reference(batch["x"]), batch["labels"]),
    )
    assert len(fast._graphs) == 2 and not fast._refused
    assert all(abs(ours - theirs) <= 1e-10 for ours, theirs in losses), losses
    assert largest_difference(model, reference) <= 1e-10
    assert all(
        int(a) == int(b) == len(sizes) for a, b in zip(model.buffers(), reference.buffers()) if a.dtype == torch.int64
    )  # num_batches_tracked: once per call, the warm-ups undone


@on_cuda
def test_the_outputs_form_replayed_trains_as_autograd_and_evaluates_eagerly(tmp_path):
    torch.manual_seed(0)
    model = UNet(1, 4).double().train()
    path = generated_path(model, tmp_path, "graphed_unet", {"x": (2, 1, 16, 16)}, None)
    model = model.to("cuda")
    reference = copy.deepcopy(model)
    fast = symgrad.bind(path, model, cuda_graph=True)
    generator = torch.Generator().manual_seed(2)
    batches = [
        {
            "x": torch.randn(2, 1, 32, 32, generator=generator, dtype=torch.float64).cuda(),
            "target": torch.randn(2, 1, 32, 32, generator=generator, dtype=torch.float64).cuda(),
        }
        for _ in range(4)
    ]
    losses = train_both(
        model,
        reference,
        batches,
        lambda batch: F.mse_loss(fast(batch["x"]), batch["target"]),
        lambda batch: F.mse_loss(reference(batch["x"]), batch["target"]),
    )
    assert len(fast._graphs) == 1
    assert all(abs(ours - theirs) <= 1e-10 for ours, theirs in losses), losses
    assert largest_difference(model, reference) <= 1e-10
    with torch.no_grad():  # no gradient wanted: the eager bound step, nothing captured
        assert (fast(batches[0]["x"]) - reference(batches[0]["x"])).abs().max().item() <= 1e-10
    assert len(fast._graphs) == 1


@on_cuda
def test_a_step_that_reads_back_to_the_host_warns_once_and_runs_eagerly(tmp_path):
    """A momentum=None BatchNorm's step reads its batch count back to the host, which a capture forbids."""
    torch.manual_seed(0)
    model = (
        nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1, bias=False),
            nn.BatchNorm2d(4, momentum=None),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4, 10),
        )
        .double()
        .train()
    )
    # nn.Sequential's forward names its argument ``input``
    path = generated_path(model, tmp_path, "cumulative", {"input": (2, 3, 8, 8)}, LossChoice("cross_entropy", "labels"))
    model = model.to("cuda")
    reference = copy.deepcopy(model)
    fast = symgrad.bind(path, model, cuda_graph=True)
    generator = torch.Generator().manual_seed(3)
    batches = [
        {
            "input": torch.randn(3, 3, 8, 8, generator=generator, dtype=torch.float64).cuda(),
            "labels": torch.randint(0, 10, (3,), generator=generator).cuda(),
        }
        for _ in range(3)
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = train_both(
            model,
            reference,
            batches,
            lambda batch: fast(**batch),
            lambda batch: F.cross_entropy(reference(batch["input"]), batch["labels"]),
        )
    said = [str(warning.message) for warning in caught if "CUDA graph" in str(warning.message)]
    assert len(said) == 1 and "\n" not in said[0] and "runs eagerly" in said[0], said
    assert all(abs(ours - theirs) <= 1e-10 for ours, theirs in losses), losses
    assert largest_difference(model, reference) <= 1e-10


@on_cuda
def test_a_submodule_swapped_after_capture_is_refused_before_a_replay(tmp_path):
    torch.manual_seed(0)
    model = ResNet18(4).double().train()
    path = generated_path(model, tmp_path, "swapped", {"x": (2, 3, 32, 32)}, LossChoice("cross_entropy", "labels"))
    model = model.to("cuda")
    fast = symgrad.bind(path, model, cuda_graph=True)
    batch = {"x": torch.randn(2, 3, 32, 32, dtype=torch.float64).cuda(), "labels": torch.randint(0, 10, (2,)).cuda()}
    fast(**batch).backward()
    assert len(fast._graphs) == 1
    model.layer1[0].bn1 = nn.Identity()
    with pytest.raises(symgrad.BindError, match="replaced"):
        fast(**batch)


def test_on_the_cpu_the_graphed_binding_runs_the_eager_step_as_without(tmp_path):
    """The same bound step, bit for bit (the CPU's own rounding: the last stage's BatchNorm normalises
    two values per channel, where autograd's kernels and the explicit formulas round apart by 3e-10 on
    some CPUs; the bound step against autograd is checked in tests/bind/test_bind.py)."""
    torch.manual_seed(0)
    model = ResNet18(4).double().train()
    path = generated_path(model, tmp_path, "cpu_step", {"x": (2, 3, 32, 32)}, LossChoice("cross_entropy", "labels"))
    reference = copy.deepcopy(model)
    fast = symgrad.bind(path, model, cuda_graph=True)
    plain = symgrad.bind(path, reference)
    generator = torch.Generator().manual_seed(4)
    batches = [
        {
            "x": torch.randn(2, 3, 32, 32, generator=generator, dtype=torch.float64),
            "labels": torch.randint(0, 10, (2,), generator=generator),
        }
        for _ in range(2)
    ]
    losses = train_both(model, reference, batches, lambda batch: fast(**batch), lambda batch: plain(**batch))
    assert not fast._graphs and not fast._refused
    assert all(ours == theirs for ours, theirs in losses), losses
    assert largest_difference(model, reference) == 0
    with pytest.raises(symgrad.BindError, match="takes the data arguments"):  # the bound step's own refusal
        fast(batches[0]["x"])
    assert copy.deepcopy(fast)(**batches[0]).item() > 0  # copied without its graphs
