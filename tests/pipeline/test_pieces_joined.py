"""A value cut into pieces that tile one dim gets its gradient joined in one kernel, as autograd's (symgrad/reverse.py).

``q, k, v = qkv.unbind(0)`` is traced as three ``narrow``s (each with a ``squeeze``); each narrow's gradient is
its piece zero-padded back, and the branch sum added the three pads. Autograd's ``unbind_backward`` is one
``stack`` of the pieces' gradients (``split_backward``, for ``chunk`` and ``split``, one ``cat``): the reverse
walk now writes that where the pieces tile the dim at every size the spec allows (its size fixed by the spec,
as a reshape's literal 3 fixes qkv's). A dim whose size follows the input's keeps the pads: there constant
slices that tile it at the traced size leave entries out at another.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import symgrad
from symgrad.trace import LossChoice, trace
from tests.helpers import build_text, module_from_source
from tests.rules.test_norm_statistics import _Counted


class Heads(nn.Module):
    """timm's attention cut: one linear, reshaped to [B, N, 3, heads, E], permuted, unbound into q, k, v."""

    def __init__(self, dim=4, heads=2):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        batch, tokens, width = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, width))


class Halves(nn.Module):
    """A gate: a linear's output reshaped to [B, N, 2, C] and cut in two along the 2 (a cat joins them back)."""

    def __init__(self, dim=4):
        super().__init__()
        self.fc = nn.Linear(dim, 2 * dim)

    def forward(self, x):
        batch, tokens, width = x.shape
        value, gate = self.fc(x).reshape(batch, tokens, 2, width).chunk(2, dim=2)
        return value * torch.sigmoid(gate)


class Columns(nn.Module):
    """Two constant slices that tile the last dim at the traced length 4 only."""

    def __init__(self, channels=3):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, 1)
        self.fc = nn.Linear(2 * channels, 2)

    def forward(self, x):
        h = self.conv(x)
        return self.fc(torch.flatten(h[:, :, :2] * 2 + h[:, :, 2:4], 1))


def _bound(model, shape, name):
    text = trace(model, {"x": shape}, wrt="parameters", name=name, mode="train", loss=LossChoice("mse_loss", "target"))
    source = build_text(text, f"{name}.yaml").rendered.files[f"{name}.py"]
    backward = source[source.index("def _backward_from_saved") :]
    return source, backward, module_from_source(source, name)


def _matches_autograd(model, generated, x):
    bound_model = copy.deepcopy(model)
    target = torch.randn(model(x).shape, dtype=torch.float64)
    symgrad.bind(generated, bound_model)(x=x, target=target).backward()
    F.mse_loss(model(x), target).backward()
    for (name, ours), theirs in zip(bound_model.named_parameters(), model.parameters()):
        assert (ours.grad - theirs.grad).abs().max() <= 1e-12 * max(1.0, theirs.grad.abs().max()), name


def test_unbind_is_one_stack_and_trains_as_autograd():
    torch.manual_seed(0)
    model = Heads().double()
    _, backward, generated = _bound(model, (2, 3, 4), "heads")
    assert backward.count("torch.stack(") == 1 and "F.pad(" not in backward, backward
    _matches_autograd(model, generated, torch.randn(3, 5, 4, dtype=torch.float64))  # another batch and length


def test_the_stack_is_autograds_bit_for_bit_in_float32():
    torch.manual_seed(0)
    model = Heads()
    _, _, generated = _bound(model.double(), (2, 3, 4), "heads_float")
    model = model.float()
    bound_model = copy.deepcopy(model)
    x = torch.randn(2, 4, 4)
    # the qkv linear's weight gradient reads the stacked gradient alone: equal bits there
    symgrad.bind(generated, bound_model)(x=x, target=torch.zeros(2, 4, 4)).backward()
    F.mse_loss(model(x), torch.zeros(2, 4, 4)).backward()
    assert torch.equal(bound_model.qkv.bias.grad, model.qkv.bias.grad)
    assert torch.equal(bound_model.qkv.weight.grad, model.qkv.weight.grad)


def test_chunk_is_one_cat_and_trains_as_autograd():
    torch.manual_seed(0)
    model = Halves().double()
    _, backward, generated = _bound(model, (2, 3, 4), "halves")
    assert "torch.cat(" in backward and "F.pad(" not in backward, backward
    bound_model = copy.deepcopy(model)
    x, target = torch.randn(3, 2, 4, dtype=torch.float64), torch.randn(3, 2, 1, 4, dtype=torch.float64)
    loss = symgrad.bind(generated, bound_model)(x=x, target=target)
    with _Counted() as counted:
        loss.backward()
    assert counted.calls["aten.constant_pad_nd.default"] == 0, counted.calls
    _matches_autograd(model, generated, x)


def test_slices_of_a_dim_that_follows_the_input_keep_the_pads():
    torch.manual_seed(0)
    model = Columns().double()
    _, backward, generated = _bound(model, (2, 3, 4), "columns")
    assert "torch.cat(" not in backward and backward.count("F.pad(") == 2, backward
    _matches_autograd(model, generated, torch.randn(3, 3, 6, dtype=torch.float64))  # length 6: columns 4, 5 get 0
