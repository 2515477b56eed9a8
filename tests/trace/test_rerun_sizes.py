"""Sizes the re-runs used never to try, where a bound model trained silently wrong (reviewer R1's F3-F5). Each
model is traced at one size, generated and bound, then called at another size: the bound step equals autograd
through the original module in float64, or it is refused in one line naming the model's line. Each test fails
before the re-runs tried these sizes.

- F4: traced at the largest length the model takes (nanoGPT at its block size, ``assert t <= block_size``):
  2T and T + 1 both fail the assert, so no run changed T, and ``/ t`` was frozen (0.21 off at T = 6).
- F5: a causal mask made in forward at T = 64: symgrad refuses the 128 x 128 and 65 x 65 constants (above its
  limit), which the dim-1 run took for "the model does not run there": nothing was checked.
- F3: T in dim 1 and in another dim of the inputs (x [N, T, C] with a mask [N, T, T] or [N, 1, T, T], a graph's
  node features [N, V, F] with its adjacency [N, V, V]): the dim-1 run changed dim 1 alone, at which the model
  does not run, so ``/ t`` was frozen (0.29 off at T = 9).
"""

from __future__ import annotations

import copy

import pytest
import torch

import symgrad
from symgrad.generated_module import BindError
from symgrad.trace import trace
from tests.helpers import model_in_folder, write_generated

SOURCE = """
import torch
import torch.nn as nn


class TinyGPT(nn.Module):  # nanoGPT's shape: `assert t <= block_size`, the token mean written as a sum / t
    def __init__(self, block_size=8):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(20, 4)
        self.wpe = nn.Embedding(block_size, 4)
        self.fc = nn.Linear(4, 3)

    def forward(self, ids):
        b, t = ids.size()
        assert t <= self.block_size, f"Cannot forward sequence of length {t}, block size is only {self.block_size}"
        pos = torch.arange(0, t, dtype=torch.long)
        h = self.fc(self.wte(ids) + self.wpe(pos))
        return h.sum(1) / t


class CausalMask(nn.Module):  # a finite causal mask made in forward from T
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(4, 12)
        self.out = nn.Linear(4, 3)

    def forward(self, x):
        t = x.shape[1]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = q @ k.transpose(1, 2) / 2.0 + torch.full((t, t), -1e9, dtype=x.dtype).triu(1)
        return self.out(att.softmax(-1) @ v).mean(1)


class WholeBlocks(CausalMask):  # lengths in whole blocks of 64: the model runs at 128, not at 65, 63 or 32
    def forward(self, x):
        assert x.shape[1] % 64 == 0, "whole blocks of 64"
        return super().forward(x)


class Mask3d(nn.Module):  # x [N, T, C] with an additive mask [N, T, T]: the same T in dims 1 and 2
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(4, 12)
        self.out = nn.Linear(4, 3)

    def forward(self, x, mask):
        t = x.shape[1]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = (q @ k.transpose(1, 2) / 2.0 + mask).softmax(-1)
        return self.out(att @ v).sum(1) / t


class Mask4d(Mask3d):  # the mask [N, 1, T, T]: T in dims 2 and 3 of another input
    def forward(self, x, mask):
        t = x.shape[1]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = (q @ k.transpose(1, 2) / 2.0 + mask[:, 0]).softmax(-1)
        return self.out(att @ v).sum(1) / t


class Graph(nn.Module):  # node features [N, V, F], adjacency [N, V, V]; the mean over neighbours as sum / V
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x, adj):
        v = x.shape[1]
        return self.out(torch.relu(adj @ self.fc(x) / v)).mean(1)

"""

LINES = {
    line.split("class ")[1].split("(")[0]: number
    for number, line in enumerate(SOURCE.splitlines(), 1)
    if line.startswith("class ")
}


def bound_model(folder, name: str, traced: dict, dtypes: dict | None = None, **options):
    """The model ``name`` of SOURCE, traced at ``traced``, generated and bound (``verify=False``: the checks
    below run it at the sizes that matter), with a float64 copy of it as it was."""
    model = model_in_folder(folder, SOURCE, f"{name.lower()}_model", name)
    text = trace(model, traced, "parameters", name.lower(), dtypes=dtypes, **options)
    write_generated(folder, text, name.lower())
    reference = copy.deepcopy(model)
    return symgrad.bind(folder / f"{name.lower()}.py", model, verify=False), model, reference


def inputs(shapes: dict, integers: tuple = ()) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [
        torch.randint(0, 20, shape, generator=generator)
        if key in integers
        else torch.randn(*shape, dtype=torch.float64, generator=generator)
        for key, shape in shapes.items()
    ]


def matches_or_refuses(bound, model, reference, shapes: dict, integers: tuple = ()) -> str | None:
    """The bound model at ``shapes`` against autograd through ``reference`` (the output within 1e-12, each
    parameter's gradient after a random cotangent within 1e-12 relative): None; or its refusal, one line."""
    values = inputs(shapes, integers)
    expected = reference(*values)
    try:
        out = bound(*values)
    except (ValueError, BindError) as error:  # the generated code's size check, or the bound step's
        assert "\n" not in str(error), str(error)
        return str(error)
    assert out.shape == expected.shape and float((out - expected).abs().max()) <= 1e-12, float(
        (out - expected).abs().max()
    )
    grad = torch.randn(expected.shape, dtype=expected.dtype, generator=torch.Generator().manual_seed(2))
    out.backward(grad)
    wanted = torch.autograd.grad(expected, list(reference.parameters()), grad)
    for (key, parameter), theirs in zip(model.named_parameters(), wanted):
        assert (parameter.grad - theirs).abs().max() <= 1e-12 * theirs.abs().max(), key
        parameter.grad = None
    return None


def refused_at(refusal: str | None, name: str, offset: int) -> None:
    """``refusal`` is one line at SOURCE's line ``offset`` lines below ``class name``, with a fix."""
    assert refusal is not None, "computed at a size it does not hold"
    line = f"{name.lower()}_model.py:{LINES[name] + offset}:"
    assert line in refusal and "(fix: " in refusal, (line, refusal)


def test_traced_at_the_largest_length_it_takes_holds_that_length(tmp_path):
    bound, model, reference = bound_model(tmp_path, "TinyGPT", {"ids": (2, 8)}, {"ids": "int64"})
    assert matches_or_refuses(bound, model, reference, {"ids": (3, 8)}, ("ids",)) is None
    refused_at(matches_or_refuses(bound, model, reference, {"ids": (3, 6)}, ("ids",)), "TinyGPT", 13)


def test_a_constant_too_large_at_other_lengths_holds_the_traced_length(tmp_path):
    bound, model, reference = bound_model(tmp_path, "CausalMask", {"x": (2, 64, 4)})
    assert matches_or_refuses(bound, model, reference, {"x": (3, 64, 4)}) is None
    refused_at(matches_or_refuses(bound, model, reference, {"x": (3, 32, 4)}), "CausalMask", 9)


def test_a_length_symgrad_refuses_and_no_other_it_runs_at_holds_the_traced_length(tmp_path):
    """At 128 symgrad refuses the 128 x 128 mask; 65, 63 and 32 fail the model's assert: that refusal pins T."""
    bound, model, reference = bound_model(tmp_path, "WholeBlocks", {"x": (2, 64, 4)})
    assert matches_or_refuses(bound, model, reference, {"x": (3, 64, 4)}) is None
    refusal = matches_or_refuses(bound, model, reference, {"x": (3, 128, 4)})
    refused_at(refusal.replace("wholeblocks_model", "causalmask_model"), "CausalMask", 9)
    assert "(the code symgrad refuses at x=[2, 128, 4] there follows it)" in refusal, refusal


@pytest.mark.parametrize(
    "name, traced, other",
    [
        ("Mask3d", {"x": (2, 6, 4), "mask": (2, 6, 6)}, {"x": (3, 9, 4), "mask": (3, 9, 9)}),
        ("Mask4d", {"x": (2, 6, 4), "mask": (2, 1, 6, 6)}, {"x": (3, 9, 4), "mask": (3, 1, 9, 9)}),
        ("Graph", {"x": (2, 6, 4), "adj": (2, 6, 6)}, {"x": (3, 9, 4), "adj": (3, 9, 9)}),
    ],
)
def test_a_length_in_two_dims_changes_in_both(tmp_path, name, traced, other):
    bound, model, reference = bound_model(tmp_path, name, traced)
    assert matches_or_refuses(bound, model, reference, {key: (3, *shape[1:]) for key, shape in traced.items()}) is None
    refusal = matches_or_refuses(bound, model, reference, other)
    refused_at(refusal, name, {"Mask3d": 10, "Mask4d": 5, "Graph": 8}[name])
