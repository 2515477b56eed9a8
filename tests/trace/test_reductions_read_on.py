"""A reduction the network reads on is a layer, not the loss: ``conv(x) * conv.weight.sum()`` (a parameter's
sum), ``h - h.mean()`` (every dim, the batch's too), ``h * h.pow(2).sum(dim=(1, 2, 3)).reshape(...)`` (per
sample) and ``x / w.abs().mean()`` used to be refused as "computes with a loss value". A reduction of every
dim to a 0-dim value is a ``sum``/``mean`` layer kept as size 1 and reshaped to ``()``, 0-dim as the model's
value (tests/bind/test_autocast_regions.py: a [1] promotes under autocast), only where an elementwise
add/sub/mul/div with a result of one dim or more reads it; the layer reduces the value the reduction was taken
of (not one written in place after it). Still refused in one line:
a loss call's value, a scaled reduction (its scales are noted as one: float32 would round otherwise), a 0-dim
value that ``torch.stack`` or ``unsqueeze`` reads or that sums to another 0-dim value (a hand-written loss
plus a penalty)."""

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
        h = self.conv(x) * self.conv.weight.sum()
        h = h - h.mean()
        h = h * h.pow(2).sum(dim=(1, 2, 3)).reshape(-1, 1, 1, 1)
        return self.fc(h.mean(dim=(2, 3)) / self.fc.weight.abs().mean())


class WrittenAfter(nn.Module):  # the reduction is of conv's output, not of the value written in place after it
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        h = self.conv(x)
        s, per_sample = h.mean(), h.sum(dim=(1, 2, 3))
        h += 1.0
        torch.relu_(h)
        return self.fc((h * s * per_sample.reshape(-1, 1, 1, 1)).mean(dim=(2, 3)))


class SumOut(nn.Module):  # every dim of a layer's output, and of the input with keepdim
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x):
        h = torch.tanh(self.conv(x))
        return h / h.sum() + x.sum(dim=None, keepdim=True)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_reductions_read_on_by_the_network_are_layers_with_autograds_gradients(mode):
    matches_autograd(
        "read_on", Case(ReadOn, {"x": (2, 3, 6, 6)}, {"x": (3, 3, 7, 5)}, CLASSIFIER), mode, one_loss_per_mode=True
    )


def test_a_reduction_reads_its_value_as_it_was_before_an_in_place_write():
    matches_autograd("written_after", Case(WrittenAfter, {"x": (2, 3, 6, 6)}, {"x": (3, 3, 7, 5)}, CLASSIFIER), "train")


def test_a_sum_of_every_dim_read_on_keeps_its_shape_and_gradients():
    matches_autograd("sum_out", Case(SumOut, {"x": (2, 2, 5, 5)}, {"x": (3, 2, 4, 6)}, RESTORATION), "train")


def test_the_reductions_read_on_are_written_as_layers():
    text = trace(ReadOn(), {"x": (2, 3, 6, 6)}, wrt="parameters", name="read_on", mode="train")
    assert "{op: sum, in: conv_weight, dim: [0, 1, 2, 3], keepdim: true, out: sum}" in text
    assert "{op: reshape, in: sum, shape: [], out: reshape}" in text  # 0-dim as the model's (not [1]: autocast)
    assert "{op: sum, in: pow, dim: [1, 2, 3], out: sum_2}" in text  # per sample: [N], not reshaped


def _scaled(x, w):
    return x * (w.sum() / 3 / 7)


def _stacked(x, w):
    return x[:, :2] * torch.stack([w.mean(), w.pow(2).mean()])


def _unsqueezed(x, w):
    return torch.cat([x[0], w.sum().unsqueeze(0)])


def _loss_plus_penalty(x, w):
    return (x * w).pow(2).mean() + w.pow(2).sum()


def _loss_call_read_on(x, w):
    return x * F.mse_loss(x, w)


@pytest.mark.parametrize(
    "step, said",
    [
        (_scaled, "reads a sum or mean of a whole value"),
        (_stacked, "reads a sum or mean of a whole value"),
        (_unsqueezed, "reads a sum or mean of a whole value"),
        (_loss_plus_penalty, "computes with a loss value"),
        (_loss_call_read_on, "computes with a loss value"),
    ],
)
def test_what_cannot_be_a_layer_stays_refused_in_one_line(step, said):
    with pytest.raises(TraceError) as error:
        trace(step, {"x": (2, 3), "w": (2, 3)}, wrt=["x", "w"], name="refused")
    message = str(error.value)
    assert said in message and "test_reductions_read_on.py:" in message and "(fix: " in message, message
    assert len(message.splitlines()) == 1, message


def _logged(x, w):
    p = torch.tanh(x * w)
    loss = (p - w).pow(2).mean()
    scaled = p * loss  # noqa: F841  (kept for logging, read by nothing returned)
    return loss


def test_a_loss_the_function_also_reads_on_stays_its_loss():
    text = trace(_logged, {"x": (2, 3), "w": (2, 3)}, wrt=["x"], name="logged")
    assert "\nloss: {op: mse_loss, in: p, target: w, reduction: mean}" in text and "\noutputs:" not in text, text


class ScaledAfter(nn.Module):  # the fix printed for `x * (w.sum() / 3 / 7)`: scale after the product
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        h = self.conv(x)
        return (h * self.conv.weight.sum()) / 21


class KeptDims(nn.Module):  # the fix printed for a stacked 0-dim mean: keepdim=True, then cat
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        h, w = self.conv(x), self.conv.weight
        return h[:, :2] * torch.cat([w.mean(dim=None, keepdim=True), w.pow(2).mean(dim=None, keepdim=True)], 1)


@pytest.mark.parametrize("model", [ScaledAfter, KeptDims])
def test_the_fixes_the_refusal_prints_trace_with_autograds_gradients(model):
    matches_autograd(
        model.__name__.lower(), Case(model, {"x": (2, 3, 6, 6)}, {"x": (3, 3, 7, 5)}, RESTORATION), "train"
    )
