"""A number computed from dim 1 that no form of the spec writes is never frozen silently. The second run never
changes dim 1 (a channel count there refuses many valid models), so the mean of ``torch.arange(h.shape[1])``
over [N, T, C] was the traced T's number, and a branch on T was dropped as fixed: at T = 9 the generated module
computed something else without a word. Now one more run changes dim 1 alone: where the model runs there and
the spec differs, the input's dim 1 is checked at its traced size (the generated code and ``symgrad.bind``
refuse another in one line naming the dim, the size, the call's file:line and the fix), and a branch on it is
kept. Where the model does not run at another dim 1 (a convolution's channels) nothing is checked. Each test
fails before (the last refused its ``[:, :, -1]``, a number that follows the height)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import trace
from tests.helpers import bound_matches, generated_matches, model_in_folder, write_generated

SOURCE = """
import torch
import torch.nn as nn


class Positions(nn.Module):  # [N, T, C]: the token mean scaled by the mean position, made in forward from T
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return h.mean(1) * torch.arange(h.shape[1], dtype=h.dtype).mean()
"""


def load(folder):
    return model_in_folder(folder, SOURCE, "positions_model", "Positions")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The model's file, and its spec (traced at [2, 6, 4]) and generated module."""
    found = tmp_path_factory.mktemp("positions")
    write_generated(found, trace(load(found), {"x": (2, 6, 4)}, "parameters", "positions"), "positions")
    return found


def data(tokens: int) -> torch.Tensor:
    return torch.randn(3, tokens, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def refusal_of(call) -> str:
    with pytest.raises(ValueError) as raised:
        call()
    text = str(raised.value)
    assert "\n" not in text, text
    said_in_order = (
        "positions_model.py:13: x.shape[1] == 6 as traced (the argument other of mul there follows it)",
        "comes out otherwise at these sizes (fix: ",
        "trace it at these sizes too",
    )
    for said in said_in_order:
        assert said in text, (said, text)
    return text


def test_the_generated_module_runs_at_the_traced_length_and_refuses_another(folder):
    model = load(folder)
    module = module_from_source((folder / "positions.py").read_text(), "positions_generated")
    generated_matches(model, module, data(6))  # another batch, the traced length
    params = {key: value.detach().clone() for key, value in model.state_dict().items()}
    refusal_of(lambda: module.forward(data(9), params))


def test_the_bound_model_runs_at_the_traced_length_and_refuses_another(folder):
    bound = bound_matches(load(folder), folder / "positions.py", data(6))
    refusal_of(lambda: bound(data(9)))


class Branch(nn.Module):  # a branch on T, the same at 2T: the second run alone saw it as fixed
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return h * 2 if h.shape[1] > 4 else h * 3


def test_a_branch_on_dim_one_is_checked_at_run_time():
    torch.manual_seed(0)
    model = Branch().double()
    text = trace(model, {"x": (2, 6, 4)}, "parameters", "branch")
    module = module_from_source(build_text(text, "branch.yaml").rendered.files["branch.py"], "branch")
    generated_matches(model, module, data(9))  # the branch holds: any length above 4
    params = {key: value.detach().clone() for key, value in model.state_dict().items()}
    with pytest.raises(ValueError, match="shape\\[1\\] > 4") as raised:
        module.forward(data(3), params)
    assert "\n" not in str(raised.value)


class Channels(nn.Module):  # dim 1 is a channel count: the model does not run at another, nothing is checked
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x)[:, :, -1] * 2


def test_a_channel_count_in_dim_one_is_not_checked():
    torch.manual_seed(0)
    model = Channels().double()
    text = trace(model, {"x": (2, 3, 8, 8)}, "parameters", "channels")
    assert "size_check" not in text, text
    module = module_from_source(build_text(text, "channels.yaml").rendered.files["channels.py"], "channels")
    x = torch.randn(3, 3, 9, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    generated_matches(model, module, x)  # the last row counted from the end at another height
