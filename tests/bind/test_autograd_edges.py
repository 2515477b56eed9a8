"""A bound model keeps autograd's semantics at the edges (issue 62): a parameter the loss never reaches
keeps ``.grad`` None, and an output the backward reads, changed in place before the backward, raises
autograd's version-counter error instead of being read changed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.pipeline import build_text
from symgrad.trace import trace


class TwoHeads(nn.Module):
    """A trunk and two heads, returned as a tuple; a loss may read one of them."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)
        self.aux = nn.Linear(6, 2)

    def forward(self, x):
        features = torch.tanh(self.trunk(x))
        return self.head(features), torch.relu(self.aux(features))


def bound(tmp_path: Path, model: nn.Module, shapes: dict, name: str):
    """``symgrad.bind`` of ``model`` traced at ``shapes`` in train mode, generated into ``tmp_path``."""
    built = build_text(trace(model, shapes, "parameters", name, mode="train"), "traced.yaml")
    for file, content in built.rendered.files.items():
        (tmp_path / file).write_text(content)
    return symgrad.bind(tmp_path / f"{name}.py", model, verify=False)


def test_a_head_the_loss_does_not_read_keeps_grad_none_and_weight_decay_leaves_it(tmp_path):
    torch.manual_seed(0)
    model = TwoHeads().double()
    reference = copy.deepcopy(model)
    fast = bound(tmp_path, model, {"x": (2, 4)}, "two_heads")
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.1, weight_decay=0.1) for net in (model, reference)]
    x = torch.randn(5, 4, dtype=torch.float64)  # another batch than traced
    for net, optimizer in zip((fast, reference), optimizers):
        optimizer.zero_grad()
        logits, _ = net(x)  # a loss over the first head alone
        logits.pow(2).mean().backward()
        optimizer.step()
    assert model.aux.weight.grad is None and model.aux.bias.grad is None
    assert model.head.weight.grad is not None and model.trunk.weight.grad is not None
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        assert (ours - theirs).abs().max().item() <= 1e-12, name  # aux did not decay
    model.zero_grad()
    _, aux = fast(x)  # the other head alone: the first head's gradients stay None
    aux.sum().backward()
    assert model.head.weight.grad is None and model.aux.weight.grad is not None
    model.zero_grad()
    logits, aux = fast(x)
    (logits.sum() + 0 * aux.sum()).backward()  # read with a zero weight: zeros, as autograd gives
    assert model.aux.weight.grad is not None and model.aux.weight.grad.abs().max().item() == 0


def test_an_output_the_backward_reads_changed_in_place_raises_as_autograd_does(tmp_path):
    torch.manual_seed(1)
    model = TwoHeads().double()
    reference = copy.deepcopy(model)
    fast = bound(tmp_path, model, {"x": (2, 4)}, "two_heads_versions")
    x = torch.randn(3, 4, dtype=torch.float64)
    for net in (reference, fast):  # relu's backward reads its output: both raise
        logits, aux = net(x)
        aux.mul_(0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            (logits.sum() + aux.sum()).backward()
    model.zero_grad()
    reference.zero_grad()
    for net in (reference, fast):  # the linear head's output is read by no backward: both go through
        logits, aux = net(x)
        logits.mul_(2)
        (logits.sum() + aux.sum()).backward()
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        assert (ours.grad - theirs.grad).abs().max().item() <= 1e-12, name


class MaskedAttention(nn.Module):
    """Self-attention whose mask hides every key from one query (a padded position), with dropout inside
    attention where ``dropout_p`` is given (the CPU math kernel's path)."""

    def __init__(self, dropout_p=0.0):
        super().__init__()
        self.dropout_p = dropout_p
        self.qkv = nn.Linear(4, 12)
        self.proj = nn.Linear(4, 4)
        mask = torch.zeros(3, 3)
        mask[1] = float("-inf")  # query 1 sees no key
        mask[2, 0] = float("-inf")
        self.register_buffer("mask", mask)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=self.mask, dropout_p=self.dropout_p if self.training else 0.0
        )
        return self.proj(attended)


@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_a_query_that_sees_no_key_gets_autograds_finite_gradients(tmp_path, dropout_p):
    torch.manual_seed(2)
    model = MaskedAttention(dropout_p).double()
    reference = copy.deepcopy(model)
    fast = bound(tmp_path, model, {"x": (2, 3, 4)}, f"masked_attention_{int(dropout_p * 100)}")
    x = torch.randn(3, 3, 4, dtype=torch.float64)
    for net in (fast, reference):
        torch.manual_seed(5)  # the same dropout draws in both
        out = net(x)
        assert bool(out.isfinite().all())
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        assert bool(theirs.grad.isfinite().all()), name
        assert (ours.grad - theirs.grad).abs().max().item() <= 1e-12, name
