"""``symgrad.bind`` checks the binding on the user's own model (issue 62): a float64 copy at the module's
small sizes, run through the bound module and through autograd from one seed, must give the same outputs,
gradients, buffers and random state, or bind refuses naming what differed (``verify=True``, the default;
``verify=False`` binds unchecked)."""

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
    "backward": """

_unedited_backward = _backward_from_saved


def _backward_from_saved(*positional, **named):
    grads = _unedited_backward(*positional, **named)
    grads.params["fc.weight"] = 1.01 * grads.params["fc.weight"]  # a hand edit: one gradient 1% off
    return grads
""",
    "forward": """

_unedited_saving = _forward_saving


def _forward_saving(*positional, **named):
    (logits, features), *saved = _unedited_saving(*positional, **named)
    return (logits + 1e-3, features), *saved  # a hand edit: the logits moved
""",
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
    symgrad.bind(path, model)  # checked by default, and passes
    assert torch.equal(torch.get_rng_state(), state)  # the check draws from the random state it puts back
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())  # on a copy
    assert all(parameter.grad is None for parameter in model.parameters())
    for edit, said in (
        ("backward", r"the gradient of fc\.weight differs by \S+ \(relative\)"),
        ("forward", r"output\[0\] differs by"),
    ):
        path = generated(tmp_path / edit, model, edit)
        with pytest.raises(
            symgrad.BindError,
            match=r"does not compute what Net computes: on a float64 copy at "
            rf"x \[2, 3, \d+, \d+\] \(seed 0\), {said}.*verify=False",
        ):
            symgrad.bind(path, model, allow_edited=True)  # verify is on by default
        symgrad.bind(path, model, allow_edited=True, verify=False)  # unchecked, as documented


class Checkpointed(nn.Module):
    """A BatchNorm under non-reentrant checkpoint: autograd's recomputation moves its statistics again."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        block = lambda value: F.relu(self.bn(self.conv(value)))  # noqa: E731 - the checkpointed block
        return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False).mean((2, 3))


def test_a_checkpointed_batchnorm_binds_by_default_and_a_mask_of_minus_inf_is_compared_as_equal(tmp_path):
    """The check compares buffers as the forward leaves them (autograd's recomputation moves a
    checkpointed BatchNorm's statistics a second time; the bound step, as the forward, once), and a
    buffer or output holding -inf (an attention mask) is the same number in both."""
    torch.manual_seed(0)
    model = Checkpointed().double()
    model.register_buffer("floor", torch.tensor([0.0, float("-inf")], dtype=torch.float64))
    path = generated(tmp_path / "checkpointed", model)
    fast = symgrad.bind(path, model)  # verified: not refused
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    assert torch.allclose(fast(x), Checkpointed.forward(copy.deepcopy(model), x), rtol=0, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_model_with_dropout_is_checked_on_a_cpu_copy_and_binds(tmp_path):
    """CUDA's F.dropout draws with a fused kernel of its own, which the generated code does not: the
    check runs on a CPU copy, where the draws are the model's, and leaves the CUDA model as it was."""
    torch.manual_seed(0)
    model = Net().double()
    path = generated(tmp_path / "on_cuda", model)
    model = model.cuda()
    before = copy.deepcopy(model.state_dict())
    fast = symgrad.bind(path, model)  # checked by default, on the CPU: not refused
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())
    logits, _ = fast(torch.randn(3, 3, 6, 6, dtype=torch.float64, device="cuda"))
    assert logits.device.type == "cuda"
