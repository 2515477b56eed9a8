"""Module constants, a helper module's constant and a closure variable the traced forward read, set between
calls of a bound model (a schedule written as ``net_model.SLOPE = ...``, a ``nonlocal`` written): refused
at the next call in one line naming the value, its traced and current value and the fix; set back, or made
anew equal, the bound model runs on with the model's numbers (``symgrad.value_guard``)."""

from __future__ import annotations

import sys

import pytest
import torch

import symgrad
from symgrad.binding import BindError
from symgrad.pipeline import build_text
from symgrad.trace import load_target, trace

SOURCE = """
import torch.nn as nn
import torch.nn.functional as F

import values_helpers as helpers

SLOPE = 0.1


def make_gain():
    gain = 2.0

    def scaled(x):
        return x * gain

    def set_gain(value):
        nonlocal gain
        gain = value
    return scaled, set_gain


scaled, set_gain = make_gain()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return scaled(F.leaky_relu(self.lin(x), SLOPE)) + helpers.OFFSET
"""


@pytest.fixture
def bound(tmp_path, monkeypatch):
    (tmp_path / "values_helpers.py").write_text("OFFSET = 0.5\n")
    (tmp_path / "values_model.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("values_helpers", None)
    torch.manual_seed(0)
    model = load_target(f"{tmp_path / 'values_model.py'}:Net").double()
    text = trace(model, {"x": (2, 4)}, "parameters", "values_net")
    path = tmp_path / "values_net.py"
    path.write_text(build_text(text, "values_net.yaml", documents=False).rendered.files["values_net.py"])
    module = sys.modules[type(model).__module__]
    return symgrad.bind(path, model, verify=False), model, module


def refused(fast, x, pattern):
    with pytest.raises(BindError, match=pattern) as error:
        fast(x)
    assert "\n" not in str(error.value) and "symgrad trace" in str(error.value)


@pytest.mark.parametrize("change", ["module constant", "helper module's constant", "closure variable"])
def test_a_value_set_between_calls_is_refused_and_set_back_runs_on(bound, change):
    fast, model, module = bound
    x = torch.randn(3, 4, dtype=torch.float64)
    assert (fast(x) - model(x)).abs().max().item() <= 1e-12
    if change == "module constant":
        before = model(x).detach()
        module.SLOPE = 0.3
        assert (model(x) - before).abs().max().item() > 1e-6  # the model computes otherwise now...
        refused(fast, x, r"SLOPE \(read by Net\.forward\) is 0\.3 now, and the code was traced with SLOPE=0\.1")
        module.SLOPE = 0.1
    elif change == "helper module's constant":
        module.helpers.OFFSET = 0.7
        refused(fast, x, r"helpers\.OFFSET \(read by Net\.forward\) is 0\.7 now, .* traced with OFFSET=0\.5")
        module.helpers.OFFSET = 0.5
    else:
        module.set_gain(3.0)
        refused(fast, x, r"gain \(read by make_gain\.<locals>\.scaled\) is 3\.0 now, .* traced with gain=2\.0")
        module.set_gain(float("2.0"))  # equal, another object: runs on
    assert (fast(x) - model(x)).abs().max().item() <= 1e-12


def test_the_loss_form_checks_them_at_each_call_too(bound, tmp_path):
    """A spec traced with a loss (``symgrad.bind`` returns the loss): a module constant set between steps."""
    from symgrad.trace import LossChoice

    _, model, module = bound
    text = trace(model, {"x": (2, 4)}, "parameters", "values_loss", loss=LossChoice("mse_loss"))
    path = tmp_path / "values_loss.py"
    path.write_text(build_text(text, "values_loss.yaml", documents=False).rendered.files["values_loss.py"])
    step = symgrad.bind(path, model)
    x, target = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64)
    step(x=x, target=target).backward()
    module.SLOPE = 0.3
    with pytest.raises(BindError, match=r"SLOPE \(read by Net\.forward\) is 0\.3 now") as error:
        step(x=x, target=target)
    assert "\n" not in str(error.value)
