"""A bound model returns the container the model returns (issue 62, item 4): a ``list``, a ``namedtuple``
and an ``OrderedDict`` subclass with attributes (as ``transformers.ModelOutput`` is) come back as that type,
so ``fast(x).logits`` works as ``model(x).logits`` does; a plain tuple and dict stay plain. Each model is
written to a file, traced, generated and bound, and trained a step beside autograd (float64, another batch)."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

import symgrad
from symgrad.binding import BindError
from symgrad.pipeline import build_text
from symgrad.trace import load_target, trace_modes

HEAD = """
import collections
from collections import OrderedDict, namedtuple
from typing import NamedTuple

import torch
import torch.nn as nn


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 5)
        self.b = nn.Linear(5, 3)

    def parts(self, x):
        h = torch.tanh(self.a(x))
        return self.b(h), h
"""

MODELS = {
    "list": (
        HEAD
        + """
class Net(Base):
    def forward(self, x):
        logits, h = self.parts(x)
        return [logits, h]
""",
        list,
    ),
    "namedtuple": (
        HEAD
        + """
Output = namedtuple("Output", ["logits", "hidden"])


class Net(Base):
    def forward(self, x):
        return Output(*self.parts(x))
""",
        "Output",
    ),
    "typing.NamedTuple": (
        HEAD
        + """
class Output(NamedTuple):
    logits: torch.Tensor
    hidden: torch.Tensor


class Net(Base):
    def forward(self, x):
        logits, hidden = self.parts(x)
        return Output(logits=logits, hidden=hidden)
""",
        "Output",
    ),
    "a ModelOutput-like OrderedDict with attributes": (
        HEAD
        + '''
class Output(OrderedDict):
    """As transformers.utils.ModelOutput: keys, and each key an attribute."""

    def __init__(self, **entries):
        super().__init__(**entries)
        for key, value in entries.items():
            setattr(self, key, value)


class Net(Base):
    def forward(self, x):
        logits, hidden = self.parts(x)
        return Output(logits=logits, hidden=hidden)
''',
        "Output",
    ),
    "a plain tuple": (
        HEAD
        + """
class Net(Base):
    def forward(self, x):
        return self.parts(x)
""",
        tuple,
    ),
    "a plain dict": (
        HEAD
        + """
class Net(Base):
    def forward(self, x):
        logits, hidden = self.parts(x)
        return {"logits": logits, "hidden": hidden}
""",
        dict,
    ),
}


def bound(tmp_path, source: str, name="typed_model"):
    (tmp_path / f"{name}.py").write_text(source)
    sys.modules.pop(name, None)
    torch.manual_seed(0)
    model = load_target(f"{tmp_path / name}.py:Net").double()
    for text in trace_modes(model, {"x": (2, 4)}, "parameters", "typed"):
        if text is not None:
            for file, content in build_text(text, "typed.yaml", documents=False).rendered.files.items():
                (tmp_path / file).write_text(content)
    return symgrad.bind(tmp_path / "typed.py", model, verify=False), model


def values(output):
    return list(output.values()) if isinstance(output, dict) else list(output)


@pytest.mark.parametrize("case", list(MODELS))
def test_the_bound_model_returns_the_models_container(case, tmp_path):
    source, expected = MODELS[case]
    fast, model = bound(tmp_path, source)
    reference = copy.deepcopy(model)
    x = torch.randn(3, 4, dtype=torch.float64)
    ours, theirs = fast(x), reference(x)
    assert type(theirs).__name__ == (expected if isinstance(expected, str) else expected.__name__)
    assert type(ours) is type(theirs), (type(ours), type(theirs))
    if hasattr(theirs, "logits"):  # fast(x).logits, as model(x).logits
        assert (ours.logits - theirs.logits).abs().max().item() <= 1e-12
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs)
    for a, b in zip(values(ours), values(theirs)):
        assert (a - b).abs().max().item() <= 1e-12
    sum(value.pow(2).sum() for value in values(ours)).backward()
    sum(value.pow(2).sum() for value in values(theirs)).backward()
    for (key, mine), other in zip(model.named_parameters(), reference.parameters()):
        assert (mine.grad - other.grad).abs().max().item() <= 1e-12, key


def test_a_container_class_made_inside_a_function_is_refused_at_bind(tmp_path):
    """A class bind cannot find again by its module and name: refused in one line, not a plain tuple."""
    source = (
        HEAD
        + """
def make():
    Output = namedtuple("Output", ["logits", "hidden"])

    class Net(Base):
        def forward(self, x):
            return Output(*self.parts(x))
    return Net


Net = make()
"""
    )
    with pytest.raises(BindError, match=r"returns a make\.<locals>\.Net.*|returns an? .*Output") as refusal:
        bound(tmp_path, source, name="typed_local")
    assert "\n" not in str(refusal.value) and "fix:" in str(refusal.value)


def test_traced_from_the_file_and_bound_from_an_import_the_class_is_found(tmp_path, monkeypatch):
    """``symgrad trace typed_import.py:Net`` imports the file under a name of its own; the training script's
    ``from typed_import import Net`` under another: the container's class is found in the model's module."""
    _, traced = bound(tmp_path, MODELS["namedtuple"][0], name="typed_import")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("typed_import", None)
    import typed_import

    model = typed_import.Net().double()
    model.load_state_dict(traced.state_dict())
    assert type(model).__module__ != type(traced).__module__
    output = symgrad.bind(tmp_path / "typed.py", model)(torch.randn(3, 4, dtype=torch.float64))
    assert type(output) is typed_import.Output and output.logits.shape == (3, 3)
