"""A bound model used as people use a model (issue 62, the third hostile round's root causes): a mask
drawn in the full shape of what it masks and used twice, a ``@dataclass`` of outputs, a forward under
``torch.inference_mode``, ``copy.deepcopy`` of the bound model (an EMA copy), and a forward default edited
in the model's file. Each trains as autograd through the model does (float64, one seed) or is refused in
one line that says what changed."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

import symgrad
from symgrad.binding import BindError
from symgrad.pipeline import build_text
from symgrad.trace import load_target, trace

SOURCE = """
import dataclasses

import torch
import torch.nn as nn


@dataclasses.dataclass
class Result:
    logits: torch.Tensor
    features: torch.Tensor


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 5)
        self.bn = nn.BatchNorm1d(5)
        self.head = nn.Linear(5, 3)

    def forward(self, x, scale=1.0):
        h = torch.tanh(self.bn(self.lin(x))) * scale
        m1 = torch.empty_like(h).bernoulli_(0.8)  # two masks of h's shape, each used twice
        m2 = torch.empty_like(h).bernoulli_(0.6)
        h = h * m2 + h * m1 * 0.5 + m1
        return Result(self.head(h), h)
"""


def load(folder):
    for name in [name for name in sys.modules if "as_used_model" in name]:
        sys.modules.pop(name)
    torch.manual_seed(0)
    return load_target(f"{folder / 'as_used_model.py'}:Net").double().train()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The model file and its train-mode module (traced at a batch of 3, used at 6)."""
    found = tmp_path_factory.mktemp("as_used")
    (found / "as_used_model.py").write_text(SOURCE)
    text = trace(load(found), {"x": (3, 4)}, "parameters", "as_used", mode="train")
    for name, content in build_text(text, "as_used.yaml", documents=False).rendered.files.items():
        (found / name).write_text(content)
    return found


def step(net, model, x, seed=5):
    """The outputs and every parameter's .grad of one backward, from ``seed``."""
    for parameter in model.parameters():
        parameter.grad = None
    torch.manual_seed(seed)
    result = net(x)
    (result.logits.pow(2).sum() + result.features.sin().sum()).backward()
    return (
        [result.logits.detach(), result.features.detach()]
        + [p.grad for p in model.parameters()]
        + list(model.buffers())
    )


def same(ours, theirs):
    return all((a - b).abs().max().item() <= 1e-12 for a, b in zip(ours, theirs, strict=True))


X = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def test_masks_of_the_full_shape_used_twice_and_a_dataclass_output_train_as_the_model(folder):
    """Before: the trace refused the model ("YAML anchors and aliases are not allowed", one dict of
    sizes shared by every dimension of the mask), and a dataclass output was refused as "not a loss"."""
    model = load(folder)
    reference = copy.deepcopy(model)
    fast = symgrad.bind(folder / "as_used.py", model)  # verified at bind, by default
    result = fast(X)
    assert type(result).__name__ == "Result" and type(result) is type(reference(X))
    assert same(step(fast, model, X), step(reference, reference, X))


def test_inference_mode_and_a_deepcopy_of_the_bound_model(folder):
    """Before: under torch.inference_mode the bound model raised "Inference tensors do not track version
    counter"; copy.deepcopy(fast) raised "cannot pickle 'module' object" (the guard held the model file's
    globals). The copy trains a copy of the model and leaves the model alone."""
    model = load(folder)
    reference = copy.deepcopy(model)
    fast = symgrad.bind(folder / "as_used.py", model, verify=False)  # compared with autograd here
    for net in (fast, reference):
        torch.manual_seed(2)
        with torch.inference_mode():
            result = net(X)
        assert not result.logits.requires_grad
        net.ours = result.logits.clone()
    assert same([fast.ours, *model.buffers()], [reference.ours, *reference.buffers()])
    ema, model_before = copy.deepcopy(fast), copy.deepcopy(model)
    assert ema.model is not model
    assert same(step(ema, ema.model, X), step(reference, reference, X))
    assert all(parameter.grad is None for parameter in model.parameters())
    assert same(list(model.state_dict().values()), list(model_before.state_dict().values()))


def test_a_forward_default_edited_in_the_file_is_named_by_its_parameter(folder, tmp_path):
    (tmp_path / "as_used_model.py").write_text(SOURCE.replace("scale=1.0", "scale=2.0"))
    edited = load(tmp_path)
    with pytest.raises(BindError) as raised:
        symgrad.bind(folder / "as_used.py", edited)
    text = str(raised.value)
    assert "\n" not in text and "the default of scale (read by Net.forward) is 2.0, traced with 1.0" in text, text
