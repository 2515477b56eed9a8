"""``symgrad.bind`` checks the binding on the user's own model (issue 62): a float64 copy at the module's
small sizes, run through the bound module and through autograd from one seed, must give the same outputs,
gradients, buffers and random state, or bind refuses naming what differed (``verify=True``; off by default)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.pipeline import build_text
from symgrad.trace import trace_modes


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        features = F.relu(self.bn(self.conv(x)))
        return self.fc(self.drop(features.mean((2, 3)))), features


EDITS = {
    "backward": '''

_unedited_backward = _backward_from_saved


def _backward_from_saved(*positional, **named):
    grads = _unedited_backward(*positional, **named)
    grads.params["fc.weight"] = 1.01 * grads.params["fc.weight"]  # a hand edit: one gradient 1% off
    return grads
''',
    "forward": '''

_unedited_saving = _forward_saving


def _forward_saving(*positional, **named):
    (logits, features), *saved = _unedited_saving(*positional, **named)
    return (logits + 1e-3, features), *saved  # a hand edit: the logits moved
''',
}


def generated(tmp_path, model, edit=None):
    """The model's module, traced in both modes, written into ``tmp_path`` (with ``edit`` appended)."""
    tmp_path.mkdir()
    for text in filter(None, trace_modes(model, {"x": (2, 3, 6, 6)}, "parameters", "verified")):
        for name, content in build_text(text, "verified.yaml").rendered.files.items():
            (tmp_path / name).write_text(content + (EDITS[edit] if edit and name == "verified.py" else ""))
    return tmp_path / "verified.py"


def test_a_binding_that_computes_otherwise_is_refused_naming_what_differs_and_verify_false_binds_it(tmp_path):
    torch.manual_seed(0)
    model = Net().double()
    before = copy.deepcopy(model.state_dict())
    path = generated(tmp_path / "as_written", model)
    state = torch.get_rng_state()
    symgrad.bind(path, model, verify=True)  # checked, and passes
    assert torch.equal(torch.get_rng_state(), state)  # the check draws from the random state it puts back
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())  # on a copy
    assert all(parameter.grad is None for parameter in model.parameters())
    for edit, said in (("backward", r"the gradient of fc\.weight differs by \S+ \(relative\)"),
                       ("forward", r"output\[0\] differs by")):
        path = generated(tmp_path / edit, model, edit)
        with pytest.raises(symgrad.BindError, match=r"does not compute what Net computes: on a float64 copy at "
                           rf"x \[2, 3, \d+, \d+\] \(seed 0\), {said}.*verify=False"):
            symgrad.bind(path, model, allow_edited=True, verify=True)
        symgrad.bind(path, model, allow_edited=True)  # unchecked: verify is off by default

