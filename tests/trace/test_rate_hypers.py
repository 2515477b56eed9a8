"""Blocks that differ only in a rate or a scale are one block with a hyper (issue 64 item 4): ``symgrad
trace`` groups instances whose layers differ only in a float their rule declares a hyper (dropout's ``p``,
``Param(..., hyper=True)``; mul's constant ``other``, ``Operand(..., hyper=True)``), and the generated
block function reads it as an argument. A rate at which the model skips the op (timm's ``drop_path`` and
``F.dropout`` at 0, drawing nothing) is the block at rate 0 (``trace.rate_zero``), whose mask is then ones,
drawn from nothing, so the masks after it are the model's. Checked: the spec, the block function's
signature, and a bound step's gradients against autograd through the original model (float64, train
mode, another batch and length, three SGD steps, each from one seed)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace
from tests.models.compare import bound_steps_match_autograd


def drop_path(x, rate: float, training: bool):
    """timm's: one Bernoulli(1 - rate) draw per sample, scaled by 1 / (1 - rate); nothing at rate 0."""
    if rate == 0.0 or not training:
        return x
    keep = 1 - rate
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask.div_(keep)


class RateBlock(nn.Module):
    def __init__(self, width: int, rate: float):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.rate = rate

    def forward(self, x):
        return x + drop_path(torch.tanh(self.fc(x)), self.rate, self.training)


class ScaleBlock(nn.Module):
    """A scalar layer scale (CaiT's, ConvNeXt's when it is a float) after element dropout."""

    def __init__(self, width: int, rate: float, scale: float):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.rate, self.scale = rate, scale

    def forward(self, x):
        return x + F.dropout(torch.tanh(self.fc(x)), self.rate, self.training) * self.scale


class Net(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.blocks(x))


def _rates():
    return Net([RateBlock(4, rate) for rate in (0.0, 0.1, 0.2)])


def _scales():
    return Net([ScaleBlock(4, rate, scale) for rate, scale in ((0.1, 0.5), (0.2, 0.25), (0.3, 1e-6))])


def _generated(make, tmp_path):
    torch.manual_seed(0)
    model = make().double().train()
    text = trace(model, {"x": (2, 3, 4)}, name="rated", loss=LossChoice("mse_loss"), mode="train", blocks=True)
    source = build_text(text, "rated.yaml").rendered.files["rated.py"]
    (tmp_path / "rated.py").write_text(source)
    return model, text, source


def _steps_match_autograd(model, path):
    """Three SGD steps of the bound module and of autograd, each drawing its masks from one seed, at another
    batch and length than traced."""

    def batch(generator):
        x = torch.randn(5, 6, 4, generator=generator, dtype=torch.float64)
        return {"x": x}, torch.randn(5, 6, 3, generator=generator, dtype=torch.float64)

    bound_steps_match_autograd(model, path, batch, F.mse_loss, lr=0.5, seeded=True)


def test_drop_path_rates_are_one_block_with_a_hyper_rate_zero_included(tmp_path):
    model, text, source = _generated(_rates, tmp_path)
    assert "hyper: {dropout_p: 0.0}" in text  # the block, its default the first instance's rate: 0
    assert "hyper: {dropout_p: 0.1}" in text and "hyper: {dropout_p: 0.2}" in text  # the others'
    assert text.count("op: dropout") == 1 and text.count("{block: rate_block") == 3, text
    assert "def rate_block_forward(x, p, dropout_p=0.0, save=False):" in source, source
    assert ".bernoulli_(1 - dropout_p).div_(" in source and source.count("1 - dropout_p") == 2, source
    assert "if dropout_p" in source and ".fill_(1)" in source, source  # at 0: ones, nothing drawn
    _steps_match_autograd(model, tmp_path / "rated.py")


def test_dropout_rates_and_scalar_layer_scales_are_one_block_with_hypers(tmp_path):
    model, text, source = _generated(_scales, tmp_path)
    assert "hyper: {dropout_p: 0.1, mul_other: 0.5}" in text, text
    assert text.count("op: dropout") == 1 and text.count("{block: scale_block") == 3, text
    assert "def scale_block_forward(x, p, dropout_p=0.1, mul_other=0.5, save=False):" in source, source
    _steps_match_autograd(model, tmp_path / "rated.py")


@pytest.mark.parametrize("values", [{"rate": 0.1}, {"scale": 0.5}], ids=["rate", "scale"])
def test_instances_that_agree_in_their_rates_and_scales_take_no_hyper(values, tmp_path):
    """Equal floats are no hyper: the spec of a model without rate-differing blocks is as before."""

    def make():
        return Net([ScaleBlock(4, values.get("rate", 0.1), values.get("scale", 0.5)) for _ in range(3)])

    _, text, _ = _generated(make, tmp_path)
    assert "hyper" not in text.partition("fingerprint:")[0], text
