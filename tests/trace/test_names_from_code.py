"""Layer names from the model's own code (``symgrad/trace/names_from_code.py``, issue 64): ``q, k, v =
qkv.unbind(0)`` names the pieces ``attn_q``, ``attn_k``, ``attn_v`` (they were ``attn_squeeze``,
``attn_squeeze_2``, ``attn_squeeze_3``), ``q, k, v = out[0], out[1], out[2]`` (a narrow and a squeeze each)
too, ``attn = q @ k.transpose(-2, -1)`` names the matmul; a name the statement rebinds (``x = x * 2``, an
argument of the function) and code without a source file keep the op's name. The generated gradients are
autograd's through the original module at another batch size."""

from __future__ import annotations

import linecache

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from symgrad.check import module_from_source, relative_error
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace
from symgrad.trace.names_from_code import POSITIONS
from tests.helpers import load_yaml

pytestmark = pytest.mark.skipif(not POSITIONS, reason="Python 3.10 has no co_positions: the op's names there")


class Attention(nn.Module):
    """timm's ``Attention``: one qkv Linear, reshape and permute, ``unbind(0)``, then the manual branch."""

    def __init__(self, dim=4, heads=2):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q = q * 0.5
        attn = q @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()

    def forward(self, x):
        return self.attn(x) * 2


class Pieces(nn.Module):
    """MONAI's ``SABlock``: ``q, k, v = output[0], output[1], output[2]``; a chunk into two names; an einops
    ``rearrange`` (several torch calls from one expression) in a loop, its result named on each pass."""

    def forward(self, x):
        output = x.reshape(x.shape[0], 3, 2, 4).permute(1, 0, 2, 3)
        q, k, v = output[0], output[1], output[2]
        left, right = torch.chunk(q * k + v, 2, dim=-1)
        total = left * right
        for _ in range(2):
            tokens = rearrange(total, "b n d -> b d n")
            total = total + tokens.sum(-1, keepdim=True)
        return total


def _outs(text: str) -> list[str]:
    return [layer["out"] for layer in load_yaml(text)["layers"] if "out" in layer]


def _matches_autograd(model: nn.Module, text: str, shape: tuple[int, ...]) -> None:
    built = build_text(text, "named.yaml", documents=False, tests=False).rendered
    module = module_from_source(built.files[f"{built.name}.py"], built.name)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)
    target = torch.randn_like(model(x))
    (expected,) = torch.autograd.grad(F.mse_loss(model(x), target), x)
    params = {key: value.detach() for key, value in model.state_dict().items()}
    got = module.gradients(x=x, params=params, target=target) if params else module.gradients(x=x, target=target)
    assert relative_error(got.x, expected) <= 1e-12


def test_the_pieces_of_a_timm_attention_are_named_q_k_v_as_its_code_names_them():
    torch.manual_seed(0)
    model = Model().double()
    text = trace(model, {"x": (2, 3, 4)}, loss=LossChoice("mse_loss"))
    outs = _outs(text)
    assert {"attn_q", "attn_k", "attn_v", "attn_attn"} <= set(outs), outs
    assert not [name for name in outs if "squeeze" in name], outs
    assert "attn_mul" in outs and "attn_softmax" in outs, outs  # q = q * 0.5 and attn = attn.softmax(): rebound
    assert "attn_qkv" in outs  # the Linear keeps its attribute's name
    _matches_autograd(model, text, (3, 5, 4))


def test_a_tuple_of_items_a_chunk_and_an_einops_call_in_a_loop_take_the_codes_names():
    model = Pieces()
    text = trace(model, {"x": (2, 24)}, loss=LossChoice("mse_loss"))
    outs = _outs(text)
    assert {"q", "k", "v", "left", "right", "total", "tokens", "tokens_2"} <= set(outs), outs
    assert not [name for name in outs if name.startswith("squeeze")], outs  # each output[i]'s squeeze is q, k, v
    _matches_autograd(model, text, (3, 24))


def test_code_without_a_source_file_and_a_rebound_name_keep_the_ops_names():
    namespace: dict = {"torch": torch}
    exec("def forward(x):\n    y = torch.relu(x)\n    x = y * 2\n    return x\n", namespace)
    text = trace(namespace["forward"], {"x": (2, 3)})
    assert {"relu", "mul"} <= set(_outs(text)), text
    assert not linecache.getlines("<string>")


def test_a_name_the_spec_refuses_falls_back_to_the_ops_name():
    def forward(x):
        grad_x = torch.relu(x)  # grad_ is the generated code's prefix: never a spec name
        return grad_x * 3

    text = trace(forward, {"x": (2, 3)})
    assert "relu" in _outs(text) and "grad_x" not in _outs(text), text


class SelfSupervised(nn.Module):
    """MAE's ``target = self.patchify(imgs)``: a value the model's code names ``target``, the name the loss
    gives its target input (the trace refused it as a duplicate output name, with a fix a tracer cannot follow)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        target = torch.tanh(self.fc(x))
        return target * 2


def test_a_value_named_as_the_losss_target_is_numbered_not_refused():
    torch.manual_seed(0)
    model = SelfSupervised().double()
    text = trace(model, {"x": (2, 4)}, loss=LossChoice("mse_loss"))
    assert "target_2" in _outs(text) and "target" not in _outs(text), text
    _matches_autograd(model, text, (3, 4))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        p = torch.tanh(self.fc(x))  # p: a block function's own argument name
        return x + self.fc2(p)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks, self.head = nn.Sequential(Residual(), Residual()), nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.blocks(x))


def test_a_blocks_values_named_as_its_functions_arguments_keep_it_a_block():
    """They were refused as the block's names, so the blocks were written out flat (no line lost)."""
    torch.manual_seed(0)
    model = Stack().double()
    text = trace(model, {"x": (2, 4)}, name="blocks", loss=LossChoice("mse_loss"), blocks=True)
    source = build_text(text, "blocks.yaml", documents=False, tests=False).rendered.files["blocks.py"]
    assert "def block_residual_forward(x, p, save=False):" in source and "    v_p = torch.tanh(" in source
    module = module_from_source(source, "blocks")
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    target = torch.randn(5, 3, dtype=torch.float64)
    (expected,) = torch.autograd.grad(F.mse_loss(model(x), target), x)
    params = {key: value.detach() for key, value in model.state_dict().items()}
    assert relative_error(module.gradients(x=x, params=params, target=target).x, expected) <= 1e-12
