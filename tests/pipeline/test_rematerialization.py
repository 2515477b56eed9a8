"""``symgrad generate --keep lean`` (issue 65): a batch norm's activation output that a convolution's
weight gradient reads is not kept by the forward but made again in the backward from the batch
norm's input and statistics, and a layer norm's output that a linear map's weight gradient reads
from the layer norm's input (a ViT block, a ConvNeXt block), bit for bit the forward's value, so the
gradients are unchanged."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.rules.norm_helpers import BATCH_NORM_AGAIN
from symgrad.trace import trace


class Chain(nn.Module):
    """conv -> BN -> ReLU -> conv -> BN -> SiLU -> conv: each BN's activation is the next conv's input."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(2, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3)
        self.conv2, self.bn2 = nn.Conv2d(3, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3)
        self.conv3 = nn.Conv2d(3, 2, 1)

    def forward(self, x):
        return self.conv3(F.silu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))))


class Residual(nn.Module):
    """A stem, a block with a downsampling shortcut (ReLU of a sum of two BNs) and one with an identity
    shortcut (ReLU of a BN plus the block's input), a pool and a linear head."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(2, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3)
        self.a1, self.abn1 = nn.Conv2d(3, 4, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(4)
        self.a2, self.abn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.down, self.dbn = nn.Conv2d(3, 4, 1, stride=2, bias=False), nn.BatchNorm2d(4)
        self.b1, self.bbn1 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.b2, self.bbn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        x = torch.relu(self.bn0(self.stem(x)))
        a = torch.relu(self.abn2(self.a2(torch.relu(self.abn1(self.a1(x))))) + self.dbn(self.down(x)))
        b = torch.relu(self.bbn2(self.b2(torch.relu(self.bbn1(self.b1(a))))) + a)
        return self.fc(b.mean(dim=(2, 3)))


class Mixer(nn.Module):
    """ConvMixer's pattern: GELU before each BN (its backward computes the GELU again from the kept
    convolution output), a residual sum of a BN's output and the block's input."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(2, 4, 2, stride=2), nn.BatchNorm2d(4)
        self.depthwise, self.bn1 = nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.BatchNorm2d(4)
        self.pointwise, self.bn2 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        x = self.bn0(F.gelu(self.stem(x)))
        x = self.bn1(F.gelu(self.depthwise(x))) + x
        x = self.bn2(F.gelu(self.pointwise(x)))
        return self.fc(x.mean(dim=(2, 3)))


class VitBlock(nn.Module):
    """A pre-norm ViT block as timm writes it (LayerNorm, qkv, scaled_dot_product_attention, proj; LayerNorm,
    fc1, GELU, fc2; each a residual) and a head: each LayerNorm's output is a linear map's input."""

    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.norm1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm2, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 3)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attention = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attention.transpose(1, 2).reshape(b, n, c))
        x = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
        return self.head(self.norm(x)[:, 0])


class ConvNeXtBlock(nn.Module):
    """A stem and one ConvNeXt block as its authors write it: depthwise conv, permute, LayerNorm, fc1, GELU,
    fc2, layer scale, permute back, residual; a head."""

    def __init__(self, dim=4):
        super().__init__()
        self.stem = nn.Conv2d(2, dim, 2, stride=2)
        self.dwconv, self.norm = nn.Conv2d(dim, dim, 3, padding=1, groups=dim), nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))
        self.head = nn.Linear(dim, 3)

    def forward(self, x):
        x = self.stem(x)
        y = self.norm(self.dwconv(x).permute(0, 2, 3, 1))
        x = x + (self.gamma * self.pwconv2(F.gelu(self.pwconv1(y)))).permute(0, 3, 1, 2)
        return self.head(x.mean(dim=(2, 3)))


class TinyUNet(nn.Module):
    """A U-Net's skip: conv-BN-ReLU, max pool, conv-BN-ReLU, bilinear upsampling, concatenation with the
    skip, the decoder's conv-BN-ReLU, a head: the concatenation is made again from both ReLUs made again."""

    def __init__(self):
        super().__init__()
        self.inc, self.bn0 = nn.Conv2d(2, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3)
        self.down, self.bn1 = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.up, self.bn2 = nn.Conv2d(7, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3)
        self.out = nn.Conv2d(3, 2, 1)

    def forward(self, x):
        skip = torch.relu(self.bn0(self.inc(x)))
        low = torch.relu(self.bn1(self.down(F.max_pool2d(skip, 2))))
        up = F.interpolate(low, scale_factor=2, mode="bilinear", align_corners=False)
        return self.out(torch.relu(self.bn2(self.up(torch.cat([skip, up], dim=1)))))


MODELS = {
    "chain": Chain,
    "resblock": Residual,
    "mixer": Mixer,
    "vit": VitBlock,
    "convnext": ConvNeXtBlock,
    "unet": TinyUNet,
}
TRACED = {"vit": (2, 5, 8)}
"""The size each model is traced at (default 2 x 2 x 6 x 6); :data:`RUN` the other one its gradients are
compared at."""
RUN = {"vit": (3, 7, 8)}
SAVED = {"chain": 0.6, "resblock": 0.8, "vit": 0.85, "convnext": 0.9, "unet": 0.6}
"""How much of ``--keep all``'s bytes each model's lean forward keeps at most (chain: both BNs' activations;
residual: the stem's, each block's inner ReLU and the first block's output; ViT: both LayerNorms' outputs
before a linear map; ConvNeXt: the LayerNorm's, 1 of 9 channel widths kept: fc1's 4 for GELU's pullback,
fc2's 1 for the layer scale's, the depthwise output's for the LayerNorm's, the stem's for the depthwise's;
U-Net: the three ReLUs' outputs, the upsampled one and the concatenation)."""
_MODULES: dict = {}
_SOURCES: dict = {}


def generated(name: str, keep: str):
    """The module ``keep`` generates for MODELS[name], traced in train mode at TRACED's size."""
    if (name, keep) not in _MODULES:
        torch.manual_seed(0)
        size = TRACED.get(name, (2, 2, 6, 6))
        text = trace(MODELS[name]().train(), {"x": size}, wrt="parameters", name=name, mode="train")
        source = build_text(text, f"{name}.yaml", documents=False, tests=False, keep=keep).rendered.files[f"{name}.py"]
        _MODULES[name, keep], _SOURCES[name, keep] = module_from_source(source, name), source
    return _MODULES[name, keep]


def _params(model):
    """The model's floating state, keyed as ``state_dict()`` (copies: a forward moves the running
    statistics in place)."""
    return {key: value.clone() for key, value in model.state_dict().items() if value.is_floating_point()}


def _saved_bytes(saved) -> int:
    """The bytes of the distinct storages in what ``_forward_saving`` returns for the backward."""
    storages = {}
    for value in saved:
        if isinstance(value, torch.Tensor):
            storages[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
        elif isinstance(value, (list, tuple)):
            storages[id(value)] = _saved_bytes(value)
    return sum(storages.values())


def _bits(value: torch.Tensor) -> torch.Tensor:
    """``value``'s bits as integers: torch.equal holds -0.0 equal to 0.0, a batch norm's output may be either."""
    return value.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[value.element_size()])


def _same_bits(again: torch.Tensor, out: torch.Tensor) -> bool:
    return again.dtype == out.dtype and again.stride() == out.stride() and torch.equal(_bits(again), _bits(out))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("channels_last", [False, True])
def test_the_batch_norm_made_again_is_the_kernels_output_bit_for_bit(dtype, channels_last):
    namespace = {"torch": torch}
    exec(BATCH_NORM_AGAIN, namespace)
    again = namespace["_batch_norm_again"]
    torch.manual_seed(0)
    for shape in [(2, 3, 5, 5), (4, 16, 7, 7), (3, 8, 1, 1), (2, 5, 3, 7), (5, 9), (2, 3, 2, 3, 4)]:
        if channels_last and len(shape) != 4:
            continue
        for scale in (1.0, 1e3, 1e-3, 1e-30):
            x = (torch.randn(shape, dtype=dtype) * 3 + 1) * scale
            x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
            weight, bias = torch.randn(shape[1], dtype=dtype), torch.randn(shape[1], dtype=dtype)
            weight[0], bias[1] = 0.0, -0.0  # a channel of zeros (their sign from bias - mean * 0), a -0.0 bias
            out, mean, invstd = torch.native_batch_norm(
                x, weight, bias, torch.zeros(shape[1], dtype=dtype), torch.ones(shape[1], dtype=dtype), True, 0.1, 1e-5
            )
            assert _same_bits(again(x, weight, bias, mean, invstd), out), (shape, scale)
            recorded = again(x.requires_grad_(), weight, bias, mean, invstd)  # the forward's kernel again
            assert recorded.grad_fn is not None and _same_bits(recorded.detach(), out)
            x = x.detach()
            half = x.to(torch.bfloat16)  # autocast's: a bfloat16 input, float32 parameters
            weight, bias = weight.float(), bias.float()
            out, mean, invstd = torch.native_batch_norm(half, weight, bias, None, None, True, 0.1, 1e-5)
            assert _same_bits(again(half, weight, bias, mean, invstd), out), (shape, scale)
            # affine=False (no weight, no bias), with the running statistics as BatchNorm2d(affine=False)
            # runs and without (track_running_stats=False): the bfloat16 kernel takes another path without
            for value, kind in ((x, dtype), (half, torch.float32)):
                for running in ((torch.zeros(shape[1], dtype=kind), torch.ones(shape[1], dtype=kind)), (None, None)):
                    out, mean, invstd = torch.native_batch_norm(value, None, None, *running, True, 0.1, 1e-5)
                    assert _same_bits(again(value, None, None, mean, invstd), out), (shape, scale, value.dtype)


@pytest.mark.parametrize("name", list(MODELS))
def test_lean_gradients_equal_autograds_in_float64(name):
    lean = generated(name, "lean")  # the mixer's: each value made once in a backward (the GELUs)
    # it makes a batch norm's or layer norm's output again
    assert "made again (--keep lean)" in _SOURCES[name, "lean"] or name == "mixer"
    torch.manual_seed(1)
    model = MODELS[name]().train().double()
    params = _params(model)
    x = torch.randn(RUN.get(name, (3, 2, 8, 8)), dtype=torch.float64)  # another batch and size than traced
    out = model(x)
    grad = torch.randn_like(out)
    expected = dict(zip(dict(model.named_parameters()), torch.autograd.grad(out, list(model.parameters()), grad)))
    got = lean.gradients(x, params, (grad,)).params
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert (got[key] - value).abs().max() <= 1e-12 * max(1.0, value.abs().max().item()), key


@pytest.mark.parametrize(
    "name, channels_last",
    [
        ("chain", False),
        ("chain", True),
        ("resblock", False),
        ("resblock", True),
        ("vit", False),
        ("convnext", True),
        ("unet", False),
        ("unet", True),
    ],
)
def test_lean_float32_gradients_are_keep_alls_bit_for_bit_from_fewer_bytes(name, channels_last):
    if channels_last and torch.backends.cpu.get_cpu_capability() != "AVX512":  # torch 2.13's channels_last
        pytest.skip("convolution backward corrupts the heap on an AVX2 CPU at one thread (autograd's too)")
    lean, full = generated(name, "lean"), generated(name, "all")
    torch.manual_seed(2)
    model = MODELS[name]().train()
    x = torch.randn((4, 9, 8) if name == "vit" else (4, 2, 10, 10))
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    grad = torch.randn_like(full.forward(x, _params(model))[0])
    got, expected = (module.gradients(x, _params(model), (grad,)).params for module in (lean, full))
    assert all(torch.equal(got[key], expected[key]) for key in expected)
    kept, kept_all = (_saved_bytes(module._forward_saving(x, _params(model))[1:]) for module in (lean, full))
    assert kept <= kept_all * SAVED[name], (kept, kept_all)


def test_the_bound_lean_model_trains_as_autograd():
    module = generated("resblock", "lean")
    torch.manual_seed(3)
    model = Residual().train().double()
    twin = copy.deepcopy(model)
    bound = symgrad.bind(module, twin)
    optimizers = [torch.optim.SGD(each.parameters(), lr=0.1, momentum=0.9) for each in (model, twin)]
    for _ in range(3):
        x, target = torch.randn(4, 2, 8, 8, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
        for forward, optimizer in zip((model, bound), optimizers):
            optimizer.zero_grad()
            F.mse_loss(forward(x), target).backward()
            optimizer.step()
    for (key, value), other in zip(model.state_dict().items(), twin.state_dict().values()):
        assert (value - other).abs().max() <= 1e-12, key


@pytest.mark.parametrize("name", ["resblock", "vit", "convnext", "unet"])
def test_under_autocast_the_bound_lean_step_gives_keep_alls_gradients_bit_for_bit(name):
    """The backward re-enters the forward's autocast: each value made again is the bfloat16 forward's."""
    torch.manual_seed(2)
    model = MODELS[name]().train()
    x = torch.randn((4, 9, 8) if name == "vit" else (4, 2, 10, 10))
    grads = []
    for keep in ("lean", "all"):
        net = copy.deepcopy(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = symgrad.bind(generated(name, keep), net)(x)
        out.float().square().sum().backward()
        grads.append({key: value.grad for key, value in net.named_parameters()})
    assert all(torch.equal(grads[0][key], grads[1][key]) for key in grads[1])


CONVS = ("stem", "a1", "a2", "down", "b1", "b2")
"""Residual's convolutions, each weight read once."""


def test_under_autocast_a_whole_weight_gradient_is_cast_after_the_backward_bit_for_bit():
    """Each convolution's weight gradient that is its parameter's whole gradient stays in autocast's dtype
    through the backward (half the bytes held at its peak) and is cast to the parameter's dtype after it:
    by autograd's engine for the bound step, by ``gradients`` for a direct call; the same cast, later."""
    source = generated("resblock", "lean") and _SOURCES["resblock", "lean"]
    assert source.count("defer_weight_cast=True") == 6  # every convolution's: none is used twice
    eager = module_from_source(re.sub(r",\s*defer_weight_cast=True", "", source), "resblock_cast_at_once")
    torch.manual_seed(2)
    model = Residual().train()
    x = torch.randn(4, 2, 10, 10)
    grads = []
    for module in (generated("resblock", "lean"), eager):
        net = copy.deepcopy(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = symgrad.bind(module, net)(x)
        out.float().square().sum().backward()
        grads.append({key: value.grad for key, value in net.named_parameters()})
        with torch.autocast("cpu", dtype=torch.bfloat16):
            direct = module.gradients(x, _params(model), (torch.ones(4, 3),)).params
            _, *saved = module._forward_saving(x, _params(model))
            held = module._backward_from_saved(x, _params(model), saved, (torch.ones(4, 3),)).params
        assert all(direct[key].dtype == torch.float32 for key in direct)
        held_low = {key for key, value in held.items() if value.dtype == torch.bfloat16 and key[:-7] in CONVS}
        assert held_low == (set() if module is eager else {f"{name}.weight" for name in CONVS})
    assert all(grads[0][key].dtype == torch.float32 for key in grads[0])
    assert all(torch.equal(grads[0][key], grads[1][key]) for key in grads[1])
