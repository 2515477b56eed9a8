"""A gradient summed from three or more paths adds them as autograd's engine does (symgrad/reverse.py
``_branch_sum``): into one buffer as the consumers' backwards run, the latest created first,
((t0 + t1) + t2), where sympy's sum ordered the terms its own way. The case: ConvNeXt's channels_first
layer norm written by hand, whose input feeds its mean and two differences; the bound step's float32
gradients before it were one ulp from autograd's (the convolution before the norm: 1.3e-7 relative)."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace


class _ChannelsFirstNorm(nn.Module):
    """ConvNeXt's LayerNorm over channels of NCHW data, by hand (the official code's channels_first path)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 1)
        self.weight = nn.Parameter(torch.randn(channels))
        self.bias = nn.Parameter(torch.randn(channels))
        self.head = nn.Linear(channels * 4, 10)

    def forward(self, x):
        x = self.conv(x)
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + 1e-6)
        x = self.weight[:, None, None] * x + self.bias[:, None, None]
        return self.head(x.flatten(1))


def _source(model) -> str:
    text = trace(model, {"x": (2, 8, 2, 2)}, wrt="parameters", name="net", loss=LossChoice("cross_entropy", "labels"))
    return build_text(text, "net.yaml", documents=False, tests=False).rendered.files["net.py"]


def _step(model, data, dtype):
    """(autograd's parameter gradients, the bound step's) on copies of ``model`` in ``dtype``."""
    reference, ours = copy.deepcopy(model).to(dtype), copy.deepcopy(model).to(dtype)
    x = data["x"].to(dtype)
    F.cross_entropy(reference(x), data["labels"]).backward()
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "net.py").write_text(_source(model))
        symgrad.bind(Path(folder) / "net.py", ours)(x=x, labels=data["labels"]).backward()
    return [p.grad for p in reference.parameters()], [p.grad for p in ours.parameters()]


def test_a_by_hand_layer_norm_trains_bit_for_bit_as_autograd():
    torch.manual_seed(0)
    model = _ChannelsFirstNorm(8).train()
    generator = torch.Generator().manual_seed(1)
    data = {
        "x": torch.randn(3, 8, 2, 2, generator=generator),
        "labels": torch.randint(0, 10, (3,), generator=generator),
    }
    expected, got = _step(model, data, torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    data = {
        "x": torch.randn(5, 8, 2, 2, generator=generator),
        "labels": torch.randint(0, 10, (5,), generator=generator),
    }
    expected, got = _step(model, data, torch.float64)
    assert all((a - b).abs().max() <= 1e-12 * a.abs().max() for a, b in zip(expected, got))


def test_the_first_two_terms_add_in_autograds_order():
    """The engine's buffer is the first contribution to arrive (the later difference's, sub_2), the next
    added into it: its layout is the sum's (ConvNeXt's layer scale gradients in channels_last were one ulp
    from autograd's with the pair the other way round)."""
    torch.manual_seed(0)
    assert "grad_conv = _add_into((grad_sub_2 + grad_sub), " in _source(_ChannelsFirstNorm(8))
