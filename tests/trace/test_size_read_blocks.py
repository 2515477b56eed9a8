"""Blocks whose instances differ only in an argument that equals one of their own sizes are one block
(issue 64 item 4): a depthwise conv's ``groups`` (its weight's out channels) and a layer_norm's
``normalized_shape`` (its input's trailing sizes), declared by their rules (``Rule.sizes_read``), are
written ``{like: ..., dims: [...]}`` in the block and read at run time where they differ between
instances, so the stages of a ConvNeXt of several widths are one block function; a plain ``Sequential``
of leaf modules (its downsample layers, a norm then a conv) is a block too. A grouped conv whose groups
is no size of its own (groups=2 of 4 channels) keeps a number: a hyper where instances differ. Checked:
the spec, the block functions, and a bound step's gradients against autograd through the original model
(float64, train mode, another batch and size, three SGD steps). Each model test costs 3-4 s of CPU, most of it
the trace and the build of the smallest model with two stages of two blocks and two downsample layers."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.errors import SpecError
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace
from tests.models.compare import bound_steps_match_autograd


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc(self.norm(self.dwconv(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)


class Widths(nn.Module):
    """Two stages of widths 4 and 8, each of two blocks, after a downsample layer each (from 3 and 4)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 3, 1)
        self.downs = nn.ModuleList(
            nn.Sequential(LayerNorm2d(a, eps=1e-6), nn.Conv2d(a, b, 2, stride=2)) for a, b in ((3, 4), (4, 8))
        )
        self.stages = nn.ModuleList(nn.Sequential(Block(dim), Block(dim)) for dim in (4, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        x = self.stem(x)
        for down, stage in zip(self.downs, self.stages):
            x = stage(down(x))
        return self.head(x.mean((-2, -1)))


class GroupedBlock(nn.Module):
    def __init__(self, dim: int, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, 3, padding=1, groups=groups)

    def forward(self, x):
        return x + torch.tanh(self.conv(x))


class Grouped(nn.Module):
    """Grouped convs of 2 groups of 4 channels, then 4 groups of 8: groups is no size of the block's."""

    def __init__(self):
        super().__init__()
        self.first = nn.Sequential(GroupedBlock(4, 2), GroupedBlock(4, 2))
        self.widen = nn.Conv2d(4, 8, 1)
        self.second = nn.Sequential(GroupedBlock(8, 4), GroupedBlock(8, 4))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.second(self.widen(self.first(x))).mean((-2, -1)))


def _generated(model, channels: int, tmp_path):
    text = trace(
        model, {"x": (2, channels, 8, 8)}, name="sized", loss=LossChoice("mse_loss"), mode="train", blocks=True
    )
    source = build_text(text, "sized.yaml").rendered.files["sized.py"]
    (tmp_path / "sized.py").write_text(source)
    return text, source


def _steps_match_autograd(model, path, channels: int):
    """Three SGD steps of the bound module and of autograd, at another batch and size than traced."""

    def batch(generator):
        x = torch.randn(3, channels, 12, 12, generator=generator, dtype=torch.float64)
        return {"x": x}, torch.randn(3, 3, generator=generator, dtype=torch.float64)

    bound_steps_match_autograd(model, path, batch, F.mse_loss, lr=0.5)


def test_stages_of_two_widths_are_one_block_reading_groups_and_normalized_shape_off_sizes(tmp_path):
    torch.manual_seed(0)
    model = Widths().double().train()
    text, source = _generated(model, 3, tmp_path)
    spec = text.partition("fingerprint:")[0]
    assert spec.count("{block: block,") == 4 and spec.count("{block: layer_norm2d_conv2d,") == 2, spec
    assert "groups: {like: dwconv_weight, dims: [0]}" in spec, spec
    assert "normalized_shape: [{like: permute, dims: [-1]}]" in spec, spec  # the block's layer_norm
    assert "normalized_shape: [{like: m0, dims: [-1]}]" in spec, spec  # the downsample layer's
    assert "hyper" not in spec, spec  # sizes, read at run time: no hyper
    assert source.count("def block_forward(") == 1 and "def block_2_forward" not in source, source
    assert 'groups=p["dwconv.weight"].shape[0]' in source, source
    _steps_match_autograd(model, tmp_path / "sized.py", 3)


def test_a_grouped_conv_whose_groups_is_no_size_keeps_a_number(tmp_path):
    torch.manual_seed(0)
    model = Grouped().double().train()
    text, source = _generated(model, 4, tmp_path)
    spec = text.partition("fingerprint:")[0]
    assert "like" not in spec, spec
    assert "hyper: {groups: 2}" in spec and "hyper: {groups: 4}" in spec, spec  # differs: a hyper int
    assert source.count("def grouped_block_forward(") == 1, source
    _steps_match_autograd(model, tmp_path / "sized.py", 4)


@pytest.mark.parametrize(
    "argument, message",
    [
        ("groups: {like: w}", "'groups' reads one size, not {like: w}"),
        ("groups: {like: w, dims: [0, 1]}", "'groups' reads one size"),
    ],
)
def test_a_size_read_that_is_not_one_size_is_refused_in_one_line(argument, message):
    text = (
        "name: refused\ninputs:\n  x: {shape: [2, 4, 5, 5]}\n  w: {shape: [4, 1, 3, 3]}\n  y: {shape: [2, 4, 3, 3]}\n"
        f"layers:\n  - {{op: conv2d, weight: w, {argument}, out: c}}\nloss: {{op: mse_loss, in: c, target: y}}\nwrt: [w]\n"
    )
    with pytest.raises(SpecError, match=re.escape(message)) as error:
        build_text(text, "refused.yaml")
    assert "\n" not in str(error.value) and "dims: [0]" in str(error.value)


def test_a_normalized_shape_entry_without_its_dim_is_refused_in_one_line():
    text = (
        "name: refused\ninputs:\n  x: {shape: [2, 3, 4]}\n  y: {shape: [2, 3, 4]}\n"
        "layers:\n  - {op: layer_norm, normalized_shape: [{like: x}], out: n}\n"
        "loss: {op: mse_loss, in: n, target: y}\nwrt: [x]\n"
    )
    with pytest.raises(SpecError, match=re.escape("reads one size per entry, not {like: x}")) as error:
        build_text(text, "refused.yaml")
    assert "\n" not in str(error.value) and "dims: [-1]" in str(error.value)
