"""A train-mode BatchNorm whose output reaches no output: refused at its line (smp's ``tu-`` encoders at a
small encoder_depth run timm's last blocks and drop their features; autograd moves those blocks' running
statistics, the bound step, which computes only what reaches the loss, would not). The printed fix (that
submodule in eval mode) trains as autograd, buffers included; a dead branch that writes no buffer traces."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import symgrad
from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, TraceError, trace


class DroppedFeatures(nn.Module):
    """conv -> bn -> relu twice; the second branch's features are computed and discarded."""

    def __init__(self, norm: bool = True):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        norm_layer = nn.BatchNorm2d(4) if norm else nn.Identity()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), norm_layer, nn.ReLU())])
        self.head = nn.Linear(4, 5)

    def forward(self, x):
        features = self.stem(x)
        self.blocks[0](features)  # run and dropped, as an encoder with fewer stages than its backbone
        return self.head(features.mean((2, 3)))


LOSS = LossChoice("cross_entropy", "labels")


def test_a_train_mode_batchnorm_whose_output_is_unused_is_refused_at_its_line():
    with pytest.raises(TraceError) as error:
        trace(DroppedFeatures(), {"x": (2, 3, 6, 6)}, loss=LOSS, mode="train")
    source, first = inspect.getsourcelines(DroppedFeatures.forward)
    number = first + next(index for index, text in enumerate(source) if "self.blocks[0](features)" in text)
    message = str(error.value)
    assert f"test_unused_branch_statistics.py:{number}: error: blocks.0.1 (BatchNorm2d)" in message, message
    assert "\n" not in message and "e.g. model.blocks[0].eval() (symgrad trace: --modes blocks.0=eval)" in message, (
        message
    )


def test_the_fix_eval_of_the_unused_branch_trains_as_autograd_with_its_buffers():
    torch.manual_seed(0)
    model = DroppedFeatures().double()
    model.train()
    model.blocks[0].eval()  # the printed fix; the tracer takes each submodule's mode as set (no mode="train")
    text = trace(model, {"x": (2, 3, 6, 6)}, name="dropped", loss=LOSS)
    generated = module_from_source(build_text(text, "dropped.yaml").rendered.files["dropped.py"], "dropped")
    reference = copy.deepcopy(model)
    step = symgrad.bind(generated, model)
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.1) for net in (model, reference)]
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):  # another batch and size than traced
        x = torch.randn(3, 3, 5, 7, generator=generator, dtype=torch.float64)
        labels = torch.randint(0, 5, (3,), generator=generator)
        for optimizer in optimizers:
            optimizer.zero_grad()
        step(x=x, labels=labels).backward()
        F.cross_entropy(reference(x), labels).backward()
        for optimizer in optimizers:
            optimizer.step()
    assert int(model.stem[1].num_batches_tracked) == 2 and int(model.blocks[0][1].num_batches_tracked) == 0
    assert model.stem[1].running_mean.abs().sum() > 0
    for key, value in reference.state_dict().items():
        assert torch.allclose(model.state_dict()[key], value, rtol=1e-10, atol=1e-12), key


def test_an_unused_branch_that_writes_no_buffer_traces_as_before():
    text = trace(DroppedFeatures(norm=False), {"x": (2, 3, 6, 6)}, loss=LOSS, mode="train")
    assert "blocks_0_0_weight" not in text.split("fingerprint:")[0] and "stem_1_running_mean" in text
