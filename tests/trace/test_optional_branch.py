"""Instances of one class with and without an optional submodule are one block (issue 64 item 5): a
torchvision-style ``BasicBlock`` whose ``downsample`` is None in some instances (its forward then adds
``x``) and whose first convolution's stride differs is one block with the hypers ``stride`` and
``downsample`` (``trace.optional_branch``), written as one pair of functions with the branch under ``if
downsample:``. Checked: the spec, the functions, bind's per-instance guard on the submodule, and bound SGD
steps against autograd through the original model (float64, train mode, another batch and size); a class
whose instances differ otherwise stays two blocks."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import symgrad
from symgrad.generated_module import BindError
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace
from tests.models.compare import bound_steps_match_autograd


class Block(nn.Module):
    def __init__(self, inputs: int, width: int, stride: int = 1, other: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.downsample = None
        if stride != 1 or inputs != width:
            self.downsample = nn.Sequential(
                nn.Conv2d(inputs, width, 1, stride=stride, bias=False), nn.BatchNorm2d(width)
            )
        self.other = other

    def forward(self, x):
        out = self.conv2(torch.relu(self.bn1(self.conv1(x))))
        identity = x if self.downsample is None else self.downsample(x)
        if self.other:  # instances that differ besides the branch: never one block with the others
            out = torch.tanh(out)
        return torch.relu(out + identity)


class Product(Block):
    """Without a downsample the block multiplies by its first batch norm's output, made before the
    branch (``absent: bn1``): the body without the branch saves ``bn1``, which the body with it does not."""

    def forward(self, x):
        bn1 = self.bn1(self.conv1(x))
        out = self.conv2(torch.relu(bn1))
        return torch.relu(out * (bn1 if self.downsample is None else self.downsample(x)))


class Net(nn.Module):
    def __init__(self, other: bool = False, block=Block):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        widths = [(4, 4, 1), (4, 4, 1), (4, 6, 2), (6, 6, 1)] + [(6, 6, 2)] * other  # two downsampling twins
        self.blocks = nn.Sequential(*(block(i, o, s, other and s == 2) for i, o, s in widths))
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))


def _generated(model, tmp_path):
    text = trace(
        model, {"x": (2, 3, 8, 8)}, name="branched", loss=LossChoice("cross_entropy"), mode="train", blocks=True
    )
    source = build_text(text, "branched.yaml").rendered.files["branched.py"]
    (tmp_path / "branched.py").write_text(source)
    return text, source


def _steps_equal_autograds(model, tmp_path):
    """Three bound SGD steps of ``model`` (float64, another batch and size than traced) against autograd."""

    def batch(generator):
        x = torch.randn(3, 3, 10, 10, generator=generator, dtype=torch.float64)
        return {"x": x}, torch.randint(0, 3, (3,), generator=generator)

    return bound_steps_match_autograd(model, tmp_path / "branched.py", batch, F.cross_entropy)


def test_instances_with_and_without_a_downsample_are_one_block_equal_to_autograd(tmp_path):
    torch.manual_seed(0)
    model = Net().double().train()
    text, source = _generated(model, tmp_path)
    assert "optional: {downsample: {nodes: [downsample_0, downsample_1], absent: x}}" in text, text
    assert "hyper: {stride: 1, downsample: false}" in text and text.count("{block: block,") == 4, text
    assert "hyper: {stride: 2, downsample: true}" in text, text
    assert "def block_forward(x, p, stride=1, downsample=False, save=False):" in source, source
    # the forward once; the backward: the branch's pullback, deleting what only one side deletes there, the sum at x
    lines = source.splitlines()
    assert lines.count("    if downsample:") == 4 and lines.count("    else:") == 2, source
    step = _steps_equal_autograds(model, tmp_path)
    x = torch.randn(3, 3, 10, 10, dtype=torch.float64)
    labels = torch.randint(0, 3, (3,))
    # bind's guards per instance: one that gained the branch is refused at bind, one that lost it (or
    # gained it) after bind is refused at the call
    changed = copy.deepcopy(model)
    changed.blocks[1].downsample = nn.Sequential(nn.Conv2d(4, 4, 1, bias=False), nn.BatchNorm2d(4)).double()
    with pytest.raises(BindError, match="downsample"):
        symgrad.bind(tmp_path / "branched.py", changed)
    model.blocks[2].downsample = None
    with pytest.raises(BindError, match="downsample"):
        step(x=x, target=labels)


def test_instances_that_differ_besides_the_branch_stay_two_blocks(tmp_path):
    torch.manual_seed(0)
    text, _ = _generated(Net(other=True).double().train(), tmp_path)
    assert "optional:" not in text.partition("fingerprint:")[0] and "{block: block_downsample," in text, text


def test_a_value_saved_only_without_the_branch_is_saved_unless_it_is_taken(tmp_path):
    torch.manual_seed(0)
    model = Net(block=Product).double().train()
    text, source = _generated(model, tmp_path)
    assert "optional: {downsample: {nodes: [downsample_0, downsample_1], absent: bn1}}" in text, text
    assert "bn1 if not downsample else None" in source, source
    _steps_equal_autograds(model, tmp_path)
