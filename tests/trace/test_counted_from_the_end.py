"""A negative index or slice bound counts from the end of its dim at any size: ``h[:, -1]`` (the last token)
starts at ``{like: h, size: 'shape[1] - 1'}``, ``h[:, -3:]`` too with length 3, ``h[:, :-1]`` has length
``shape[1] - 1``, an index computed from a size (``h[:, h.shape[1] // 2]``) is read again, and ``h.select(1, -2)``
is ``h[:, -2]``. The second run never changes dim 1 (a sequence's length in [N, T, C]), so before, each was the
traced number: traced at T = 6, the generated module took token 5 at T = 9, silently. Here: traced at T = 6,
bound (``symgrad.bind``) and generated, run at T = 9 and another batch, the outputs equal the model's and the
float64 gradients autograd's through the original module (each test fails before)."""

from __future__ import annotations

import copy

import pytest
import torch

import symgrad
from symgrad.check import module_from_source
from symgrad.trace import trace
from tests.helpers import bound_matches, generated_matches, model_in_folder, write_generated

SOURCE = """
import torch
import torch.nn as nn


class Ends(nn.Module):  # [N, T, C]: the last token, the last three, all but the last, the middle one
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        last, tail, head = h[:, -1], h[:, -3:], h[:, :-1]
        middle = h[:, h.shape[1] // 2]
        return last * 2 + tail.sum(1) + head.mean(1) * middle + h[:, -4:-2, 1:].sum((1, 2))[:, None] + h.select(1, -2)
"""


def load(folder):
    return model_in_folder(folder, SOURCE, "ends_model", "Ends")


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The model's folder, its spec (traced at [2, 6, 4]) and generated module written there."""
    folder = tmp_path_factory.mktemp("ends")
    text = trace(load(folder), {"x": (2, 6, 4)}, "parameters", "ends")
    write_generated(folder, text, "ends")
    return folder, text


X = torch.randn(3, 9, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))  # another batch and T


def test_the_spec_counts_from_the_end(traced):
    _, text = traced
    for written in (
        "start: {like: fc, size: 'shape[1] - 1'}, length: 1",
        "start: {like: fc, size: 'shape[1] - 3'}, length: 3",
        "start: 0, length: {like: fc, size: 'shape[1] - 1'}",
        "start: {like: fc, size: 'shape[1] // 2'}, length: 1",
        "start: {like: fc, size: 'shape[1] - 4'}, length: 2",
        "start: {like: fc, size: 'shape[1] - 2'}, length: 1",
    ):
        assert written in text, (written, text)


def test_the_generated_module_follows_the_length_at_run_time(traced):
    folder, _ = traced
    generated_matches(load(folder), module_from_source((folder / "ends.py").read_text(), "ends_generated"), X)


def test_the_bound_model_follows_the_length_at_run_time(traced):
    folder, _ = traced
    bound_matches(load(folder), folder / "ends.py", X)


CLAMPED = """
import torch
import torch.nn as nn


class Window(nn.Module):  # [N, T, C]: the fifth token from the end (none below 5 tokens), the last three
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return h[:, -5:-4].sum(1) + h[:, -3:].sum(1)
"""


def test_a_dim_shorter_than_the_count_from_its_end_is_refused(tmp_path):
    """Below 5 tokens Python clamps ``h[:, -5:-4]`` to no token, where ``narrow`` would count the negative start
    from the end once more: at T = 4 the generated module and the bound model took the last token, silently (the
    output off by 1.4). Now both refuse T < 5 in one line naming the model's line; at T = 9 they still equal
    the model (fails before: no refusal)."""
    model = model_in_folder(tmp_path, CLAMPED, "window_model", "Window")
    write_generated(tmp_path, trace(model, {"x": (2, 6, 4)}, "parameters", "window"), "window")
    module = module_from_source((tmp_path / "window.py").read_text(), "window_generated")
    params = {key: value.detach().clone() for key, value in model.state_dict().items()}
    bound = symgrad.bind(tmp_path / "window.py", copy.deepcopy(model))
    (out,) = module.forward(X, params)
    assert torch.equal(out, model(X)) and torch.equal(bound(X), model(X))
    short = torch.randn(3, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    for call in (lambda: module.forward(short, params), lambda: bound(short)):
        with pytest.raises(ValueError) as raised:
            call()
        text = str(raised.value)
        assert "\n" not in text and "window_model.py:13:" in text and "fc.shape[1] >= 5" in text, text
