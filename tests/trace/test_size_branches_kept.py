"""A branch the traced code takes on a size is checked at run time whatever reads its tensor afterwards. The
check of ``if t > 1: h = h - h.mean(1, keepdim=True)`` (``t = x.shape[1]``, read after x's last read) was
attached to x, which nothing read after it, and dropped as dead code: bound at T = 6, the module ran at T = 1
without a word, 0.52 off. ``math.floor`` of a size stays a size; ``int()`` and ``len()`` of one, which Python
makes plain ints, are refused where the code compares them; ``W % 2`` is a size, so ``if W % 2 == 1: F.pad``
is a check. Each model is bound at one size and compared with autograd through the original module (float64)
at another where the branch comes out the same, and refused in one line naming its line where not. Each test
fails before (no check: the other size ran silently; ``int()``, ``len()`` traced; ``%`` dropped as fixed)."""

from __future__ import annotations

import copy

import pytest
import torch

import symgrad
from symgrad.trace import LossChoice, trace
from symgrad.trace.errors import TraceError
from tests.helpers import bound_matches, model_in_folder, write_generated

SOURCE = """
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CentreIfMany(nn.Module):  # [N, T, C]: tokens centred where there are several, after x's last read
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 5)
        self.out = nn.Linear(5, 3)

    def forward(self, x):
        n, t, c = x.shape
        h = self.fc(x)
        if t > 1:
            h = h - h.mean(1, keepdim=True)
        return self.out(h).mean(1)


class CentreBatch(nn.Module):  # [N, C]: the batch centred where there are several samples
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 5)
        self.out = nn.Linear(5, 3)

    def forward(self, x):
        n = x.shape[0]
        h = self.fc(x)
        if n > 1:
            h = h - h.mean(0)
        return self.out(h)


class CentreTokens(nn.Module):  # token ids [N, T]
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 5)
        self.out = nn.Linear(5, 3)

    def forward(self, ids):
        n, t = ids.shape
        h = self.emb(ids)
        if t > 1:
            h = h - h.mean(1, keepdim=True)
        return self.out(h).mean(1)


class AssertAfter(nn.Module):  # an assert on T written after x's last read
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x)
        assert x.shape[1] <= 8
        return h.mean(1)


class FloorT(nn.Module):  # math.floor of a size is the size
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        t = math.floor(x.shape[1])
        if t > 1:
            x = x - x.mean(1, keepdim=True)
        return self.fc(x).mean(1)


class IntT(nn.Module):  # int() of a size: a plain int, compared
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        t = int(x.shape[1])
        if t > 1:
            x = x - x.mean(1, keepdim=True)
        return self.fc(x).mean(1)


class IntFixed(nn.Module):  # IntT as its refusal's fix says: the size itself
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        t = x.shape[1]
        if t > 1:
            x = x - x.mean(1, keepdim=True)
        return self.fc(x).mean(1)


class LenRow(nn.Module):  # len() of a tensor: a plain int, compared
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        if len(x[0]) > 1:
            x = x - x.mean(1, keepdim=True)
        return self.fc(x).mean(1)


class IntUncompared(nn.Module):  # int() of a size that is not compared: traced as before
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).sum(1) / int(x.shape[1])


class PadOdd(nn.Module):  # [N, C, H, W]: an odd width padded to an even one
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, x):
        if x.shape[-1] % 2 == 1:
            x = F.pad(x, (0, 1, 0, 0))
        return self.conv(x).mean((2, 3))


class ReadsADeadTensor(nn.Module):  # a branch on the size of a tensor nothing returned reads
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        unused = torch.tanh(x)
        h = self.fc(x)
        if unused.shape[1] > 1:
            h = h - h.mean(1, keepdim=True)
        return h.mean(1)
"""


def line_of(name: str, text: str) -> int:
    """The line of ``SOURCE`` in class ``name`` that holds ``text``: the model's line a refusal names."""
    lines = SOURCE.splitlines()
    start = next(number for number, line in enumerate(lines) if line.startswith(f"class {name}("))
    return next(number for number, line in enumerate(lines[start:], start + 1) if text in line)


def load(folder, name):
    return model_in_folder(folder, SOURCE, "branches_model", name)


def data(shape, generator_seed=1, ids=False):
    generator = torch.Generator().manual_seed(generator_seed)
    if ids:
        return torch.randint(0, 10, shape, generator=generator)
    return torch.randn(*shape, dtype=torch.float64, generator=generator)


def bound_at(tmp_path, name, shape, ids=False, **options):
    """``name`` traced at ``shape`` (``ids``: of token ids), generated; the model file's folder."""
    model = load(tmp_path, name)
    key = "ids" if ids else "x"
    text = trace(model, {key: shape}, "parameters", "branches", dtypes={key: "int64"} if ids else None, **options)
    write_generated(tmp_path, text, "branches")
    return tmp_path


def refused_at_run_time(bound, x, name: str, where: str) -> None:
    with pytest.raises(ValueError) as raised:
        bound(x)
    text = str(raised.value)
    assert "\n" not in text, text
    assert text.startswith(f"branches_model.py:{line_of(name, where)}: "), text
    assert "comes out otherwise at these sizes (fix: " in text and "trace it at these sizes too" in text, text


@pytest.mark.parametrize(
    "name, traced, same, other, where, options",
    [
        ("CentreIfMany", (2, 6, 4), (3, 5, 4), (3, 1, 4), "if t > 1:", {}),
        ("CentreIfMany", (2, 6, 4), (3, 5, 4), (3, 1, 4), "if t > 1:", {"blocks": True}),
        ("CentreBatch", (2, 4), (3, 4), (1, 4), "if n > 1:", {}),
        ("FloorT", (2, 6, 4), (3, 5, 4), (3, 1, 4), "if t > 1:", {}),
        ("PadOdd", (2, 3, 4, 5), (3, 3, 6, 7), (3, 3, 6, 6), "if x.shape[-1] % 2 == 1:", {}),
    ],
    ids=["centre-tokens", "centre-tokens-blocks", "centre-batch", "math-floor", "odd-width-pad"],
)
def test_a_branch_read_after_the_last_read_is_checked(tmp_path, name, traced, same, other, where, options):
    folder = bound_at(tmp_path, name, traced, **options)
    bound = bound_matches(load(folder, name), folder / "branches.py", data(same))
    refused_at_run_time(bound, data(other), name, where)


def test_token_ids_are_checked(tmp_path):
    folder = bound_at(tmp_path, "CentreTokens", (2, 6), ids=True)
    bound = bound_matches(load(folder, "CentreTokens"), folder / "branches.py", data((3, 5), ids=True))
    refused_at_run_time(bound, data((3, 1), ids=True), "CentreTokens", "if t > 1:")


def test_the_loss_step_runs_the_check(tmp_path):
    """``--loss mse``: ``symgrad.bind`` gives the training step, which checks the branch too."""
    model = load(tmp_path, "CentreIfMany")
    write_generated(
        tmp_path, trace(model, {"x": (2, 6, 4)}, "parameters", "branches", loss=LossChoice("mse_loss")), "branches"
    )
    model = load(tmp_path, "CentreIfMany")
    reference = copy.deepcopy(model)
    step = symgrad.bind(tmp_path / "branches.py", model)
    x, target = data((3, 5, 4)), data((3, 3), 2)
    loss = step(x=x, target=target)
    loss.backward()
    expected = torch.nn.functional.mse_loss(reference(x), target)
    expected.backward()
    assert abs(float(loss.detach() - expected.detach())) <= 1e-12
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        assert (mine.grad - theirs.grad).abs().max() <= 1e-12 * theirs.grad.abs().max()
    with pytest.raises(ValueError) as raised:
        step(x=data((3, 1, 4)), target=data((3, 3), 2))
    assert str(raised.value).startswith(f"branches_model.py:{line_of('CentreIfMany', 'if t > 1:')}: "), str(
        raised.value
    )


def test_an_assert_after_the_last_read_is_checked(tmp_path):
    folder = bound_at(tmp_path, "AssertAfter", (2, 6, 4))
    bound = bound_matches(load(folder, "AssertAfter"), folder / "branches.py", data((3, 5, 4)))
    refused_at_run_time(bound, data((3, 9, 4)), "AssertAfter", "assert x.shape[1] <= 8")


@pytest.mark.parametrize(
    "name, where, said",
    [("IntT", "t = int(x.shape[1])", "int()"), ("LenRow", "if len(x[0]) > 1:", "len()")],
    ids=["int", "len"],
)
def test_a_plain_int_of_a_size_compared_is_refused(tmp_path, name, where, said):
    with pytest.raises(TraceError) as raised:
        trace(load(tmp_path, name), {"x": (2, 6, 4)}, "parameters", "branches")
    text = str(raised.value)
    assert "\n" not in text, text
    assert text.startswith(f"{tmp_path / 'branches_model.py'}:{line_of(name, where)}: error: "), text
    assert f"compares {said} of a tensor's size" in text and "(fix: compare the size itself, e.g. x.shape[1]" in text


def test_the_int_refusals_fix_works(tmp_path):
    folder = bound_at(tmp_path, "IntFixed", (2, 6, 4))
    bound = bound_matches(load(folder, "IntFixed"), folder / "branches.py", data((3, 5, 4)))
    refused_at_run_time(bound, data((3, 1, 4)), "IntFixed", "if t > 1:")


def test_an_int_of_a_size_not_compared_traces(tmp_path):
    folder = bound_at(tmp_path, "IntUncompared", (2, 6, 4))
    bound_matches(load(folder, "IntUncompared"), folder / "branches.py", data((3, 6, 4)))


def test_a_branch_on_a_tensor_nothing_reads_is_refused(tmp_path):
    with pytest.raises(TraceError) as raised:
        trace(load(tmp_path, "ReadsADeadTensor"), {"x": (2, 6, 4)}, "parameters", "branches")
    text = str(raised.value)
    assert "\n" not in text, text
    assert text.startswith(f"branches_model.py:{line_of('ReadsADeadTensor', 'if unused.shape[1] > 1:')}: error: "), text
    assert "(fix: read that size from a tensor the function goes on to use" in text, text
