"""Models that trace and run forward, and whose generated code once raised a traceback (issue 62): an
output that reads no data input (``return self.w * 2.0``: the template read the first data input for
the device), and a Swin-style table indexed with negative entries (``-1`` counts from the end in the
forward; ``index_add`` in the backward took none)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

import symgrad
from symgrad.pipeline import build_text
from symgrad.trace import trace


def bound(tmp_path: Path, model: nn.Module, shapes: dict, name: str):
    built = build_text(trace(model, shapes, "parameters", name, mode="train"), "traced.yaml")
    for file, content in built.rendered.files.items():
        (tmp_path / file).write_text(content)
    return symgrad.bind(tmp_path / f"{name}.py", model, verify=False)


def trains_as_autograd(fast, model, reference, x) -> None:
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.1) for net in (model, reference)]
    for net, optimizer in zip((fast, reference), optimizers):
        optimizer.zero_grad()
        out = net(x)
        (out * torch.linspace(-1, 2, out.numel(), dtype=out.dtype).reshape(out.shape)).pow(2).sum().backward()
        optimizer.step()
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        assert ours.grad is not None and ours.grad.abs().max() > 0, name
        assert (ours - theirs).abs().max().item() <= 1e-12, name


class Constant(nn.Module):
    """An output computed from a parameter alone (a learned query, a prior): forward(x) does not read x."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return self.w * 2.0


def test_an_output_that_reads_no_data_input_generates_and_trains(tmp_path):
    torch.manual_seed(0)
    model = Constant().double()
    reference = copy.deepcopy(model)
    fast = bound(tmp_path, model, {"x": (2, 4)}, "constant")
    x = torch.randn(5, 4, dtype=torch.float64)
    assert torch.equal(fast(x), reference(x))
    trains_as_autograd(fast, model, reference, x)


class RelativeBias(nn.Module):
    """Swin's relative position bias, its index table built with offsets that count from the end (-1, -2)."""

    def __init__(self):
        super().__init__()
        self.relative_position_bias_table = nn.Parameter(torch.randn(5, 2))
        self.register_buffer("relative_position_index", torch.tensor([[0, 1, -1], [2, -2, 0], [-1, 3, 4]]))
        self.proj = nn.Linear(3, 3)

    def forward(self, x):
        bias = self.relative_position_bias_table[self.relative_position_index.reshape(-1)].reshape(3, 3, -1)
        attn = (x.unsqueeze(1) + bias.permute(2, 0, 1).unsqueeze(0)).softmax(-1)
        return self.proj(attn)


def test_negative_entries_of_an_index_buffer_index_as_in_the_forward(tmp_path):
    torch.manual_seed(1)
    model = RelativeBias().double()
    reference = copy.deepcopy(model)
    fast = bound(tmp_path, model, {"x": (2, 3, 3)}, "relative_bias")
    trains_as_autograd(fast, model, reference, torch.randn(4, 3, 3, dtype=torch.float64))


class Einsums(nn.Module):
    """One-operand einsums as people write them: a transpose, or (``form``) a diagonal or a sum, and the fix
    each refusal prints, written as it says."""

    def __init__(self, form="transpose"):
        super().__init__()
        self.form = form
        self.proj = nn.Linear(3, 3)
        self.register_buffer("eye", torch.eye(3))

    def forward(self, x):
        y = self.proj(x)
        if self.form == "transpose":
            return torch.einsum("bij->bji", y)
        if self.form == "diagonal":
            return torch.einsum("bii->bi", y)
        if self.form == "diagonal fixed":
            return (y * self.eye).sum(-1)
        if self.form == "sum":
            return torch.einsum("bij->bj", y) * 2.0
        return y.sum(1) * 2.0  # "sum fixed"


def test_a_one_operand_einsum_traces_as_a_permute_or_is_refused_with_a_fix_that_traces(tmp_path):
    import pytest

    from symgrad.trace import TraceError

    torch.manual_seed(3)
    model = Einsums().double()
    reference = copy.deepcopy(model)
    trains_as_autograd(
        bound(tmp_path, model, {"x": (2, 3, 3)}, "einsum_transpose"),
        model,
        reference,
        torch.randn(4, 3, 3, dtype=torch.float64),
    )
    for form, message in (
        ("diagonal", r"takes a diagonal .*\(fix: multiply by an identity registered as a buffer"),
        ("sum", r"sums within its one operand .*\(fix: write the sum itself, x.sum\(dims\)"),
    ):
        with pytest.raises(TraceError, match=message) as refused:
            trace(Einsums(form).double(), {"x": (2, 3, 3)}, "parameters", "refused", mode="train")
        assert "'in:'" not in str(refused.value) and len(str(refused.value).splitlines()) == 1
        assert "outputs:" in trace(
            Einsums(f"{form} fixed").double(), {"x": (2, 3, 3)}, "parameters", "fixed", mode="train"
        )
