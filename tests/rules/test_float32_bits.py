"""Pullbacks that round as autograd's kernels round, so that float32 gradients are autograd's bit for bit: a
mean over several dims divides its gradient once, by the count of entries (autograd's mean_backward:
``sum_backward(grad, ...) / numel``): ``grad / (y.shape[1] * y.shape[2])``, not ``grad / y.shape[1] /
y.shape[2]``, which rounds twice (8 of 16 shapes differed); tanh's is autograd's ``tanh_backward(grad,
out)``, not ``grad * (1 - out ** 2)`` (a token MLP's first layer differed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import trace
from tests.helpers import parameter_gradients


class Pooled(nn.Module):
    """A channels-last pooling (ConvNeXt's head in NHWC, a token mean): the mean over (1, 2) of [N, H, W, C]."""

    def __init__(self, width: int):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.fc = nn.Linear(width, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).permute(0, 2, 3, 1).mean((1, 2)))


@pytest.mark.parametrize("width", [6, 16])
def test_a_mean_over_several_dims_is_autograds_bit_for_bit_in_float32(width):
    torch.manual_seed(0)
    model = Pooled(width)
    text = trace(model, {"x": (2, 3, 6, 6)}, wrt="parameters", name="pooled")
    source = build_text(text, "pooled.yaml", documents=False, tests=False).rendered.files["pooled.py"]
    assert ".shape[1] * " in source, source  # divided once, by the product
    module = module_from_source(source, f"pooled_{width}")
    x = torch.randn(5, 3, 7, 9)
    for key, got, reference in parameter_gradients(model, module, x):
        assert torch.equal(got, reference), (key, (got - reference).abs().max().item())


class TanhMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 32), nn.Linear(32, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def test_tanh_is_autograds_bit_for_bit_in_float32():
    torch.manual_seed(0)
    model = TanhMlp()
    text = trace(model, {"x": (4, 6)}, wrt="parameters", name="tanh_mlp")
    source = build_text(text, "tanh_mlp.yaml", documents=False, tests=False).rendered.files["tanh_mlp.py"]
    assert "torch.ops.aten.tanh_backward(" in source, source
    module = module_from_source(source, "tanh_mlp")
    x = torch.randn(64, 6)
    for key, got, reference in parameter_gradients(model, module, x):
        assert torch.equal(got, reference), (key, (got - reference).abs().max().item())
