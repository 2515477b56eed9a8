"""A target of another dtype than the prediction: the loss runs in the promoted dtype, as PyTorch's does,
and the prediction's gradient goes back in the prediction's dtype, as autograd's engine casts it.

A float64 target after a float32 model made the bound step raise in the first backward kernel that
mixes the two (``expected m1 and m2 to have the same dtype`` in the linear layer's backward)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import symgrad
from symgrad.trace import LossChoice, trace
from tests.helpers import build_text, module_from_source


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm, self.head = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.Linear(4, 5)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))).mean(dim=(2, 3)))


@pytest.mark.parametrize("loss", ["mse_loss", "l1_loss", "smooth_l1_loss"])
def test_a_float64_target_after_a_float32_model_trains_as_autograd_does(loss):
    torch.manual_seed(0)
    model = Regressor()
    text = trace(
        model, {"x": (2, 3, 8, 8)}, wrt="parameters", name="regressor", loss=LossChoice(loss, "target"), mode="train"
    )
    generated = module_from_source(build_text(text, "regressor.yaml").rendered.files["regressor.py"], "regressor")
    bound_model = copy.deepcopy(model)
    bound = symgrad.bind(generated, bound_model)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, 10, 10, generator=generator)
    target = torch.randn(3, 5, generator=generator, dtype=torch.float64)
    ours = bound(x=x, target=target)
    theirs = getattr(F, loss)(model(x), target)
    assert ours.dtype == theirs.dtype == torch.float64
    assert torch.equal(ours.detach(), theirs.detach())
    ours.backward()
    theirs.backward()
    for (name, mine), reference in zip(bound_model.named_parameters(), model.parameters()):
        assert mine.grad.dtype == torch.float32, name
        assert (mine.grad - reference.grad).norm() <= 1e-6 * reference.grad.norm(), name
