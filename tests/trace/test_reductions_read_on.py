"""A reduction the network reads on is a layer, not the loss: ``conv(h) * conv.weight.sum()`` (a parameter's
sum, scaled), ``h - h.mean()`` (every dim, the batch's too), ``h * h.pow(2).sum(dim=(1, 2, 3))`` (per sample)
and ``x / w.abs().mean()`` used to be refused as "computes with a loss value". A reduction of every dim is a
``sum``/``mean`` layer kept as size 1 and flattened to [1] (a spec's tensors have 1 to 8 dims; [1]
broadcasts as the 0-dim value does). A loss call's value read on stays refused, in one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.trace import TraceError, trace
from tests.models.compare import CLASSIFIER, RESTORATION, Case, matches_autograd


class ReadOn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        h = self.conv(x) * (0.5 * self.conv.weight.sum())
        h = h - h.mean()
        h = h * h.pow(2).sum(dim=(1, 2, 3)).reshape(-1, 1, 1, 1)
        return self.fc(h.mean(dim=(2, 3)) / self.fc.weight.abs().mean())


class SumOut(nn.Module):  # a sum over every dim of a layer's output, read by the output layer
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x):
        h = torch.tanh(self.conv(x))
        return h / h.sum() + x.mean()


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_reductions_read_on_by_the_network_are_layers_with_autograds_gradients(mode):
    matches_autograd(
        "read_on", Case(ReadOn, {"x": (2, 3, 6, 6)}, {"x": (3, 3, 7, 5)}, CLASSIFIER), mode, one_loss_per_mode=True
    )


def test_a_sum_of_every_dim_read_on_keeps_its_shape_and_gradients():
    matches_autograd("sum_out", Case(SumOut, {"x": (2, 2, 5, 5)}, {"x": (3, 2, 4, 6)}, RESTORATION), "train")


def test_the_reductions_read_on_are_written_as_layers():
    text = trace(ReadOn(), {"x": (2, 3, 6, 6)}, wrt="parameters", name="read_on", mode="train")
    assert "{op: sum, in: conv_weight, dim: [0, 1, 2, 3], keepdim: true, out: sum}" in text
    assert "{op: mul, in: flatten, other: 0.5, out: mul}" in text  # the scale of 0.5 * w.sum()
    assert "{op: sum, in: pow, dim: [1, 2, 3], out: sum_2}" in text  # per sample: [N], not flattened


def test_a_loss_calls_value_read_on_stays_refused_in_one_line():
    def step(x, y):
        return x * F.mse_loss(x, y)

    with pytest.raises(TraceError) as error:
        trace(step, {"x": (2, 3), "y": (2, 3)}, wrt=["x"], name="read_loss")
    message = str(error.value)
    assert "computes with a loss value" in message and "test_reductions_read_on.py:" in message
    assert len(message.splitlines()) == 1, message
