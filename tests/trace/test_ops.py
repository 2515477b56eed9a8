"""Every op in the registry is traced, in the forms people write it (functional, torch, tensor method,
in-place, nn.Module), with arguments off their defaults; each traced spec is generated and its
gradients compared in float64 with autograd through the traced code itself. Loss tails likewise."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

from symgrad.check import by_name, module_from_source, relative_error
from symgrad.pipeline import build_text
from symgrad.rules import LAYER_RULES, LOSS_RULES
from symgrad.trace import LossChoice, TraceError, trace

X = {"x": (2, 3, 8, 8)}


def positive(x):
    return x * x + 1


class TokenGather(nn.Module):
    """``x[:, idx]`` with an int64 buffer of any shape, reshaped as it is read."""

    def __init__(self):
        super().__init__()
        self.register_buffer("idx", torch.tensor([[2, 0], [1, 1], [0, 2]]))

    def forward(self, x):
        return x[:, self.idx.view(-1)].mean(1, keepdim=True) * x[:, :, self.idx].sum(3)


class HalfPrecisionScale(nn.Module):
    """A float64 model computing a part in float32 and converting back (``.float()``, ``.to(w.dtype)``); scaled
    by 2 there, exact whatever order autograd and the explicit backward round in."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, dtype=torch.float64))

    def forward(self, x):
        return ((x * self.w).float() * 2).to(self.w.dtype) * x


class Selected(nn.Module):
    """``torch.index_select`` and ``x.index_select`` with an int64 buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("picked", torch.tensor([2, 0, 1, 1]))

    def forward(self, x):
        return torch.index_select(x, 1, self.picked).sum(1, keepdim=True) * x.index_select(-1, self.picked).sum(-1, keepdim=True)


class Gathered(nn.Module):
    """``torch.gather`` with an int64 buffer of the output's shape, and ``x.gather`` with a 1-d buffer viewed
    along the dim and expanded over the others (traced as ``x[:, idx]``)."""

    def __init__(self, shape=(2, 3, 8, 8)):
        super().__init__()
        self.register_buffer("full", torch.randint(0, shape[2], (shape[0], shape[1], 5, shape[3] - 1),
                                                   generator=torch.Generator().manual_seed(2)))
        self.register_buffer("keep", torch.tensor([3, 0, 3]))

    def forward(self, x):
        picked = x.gather(-1, self.keep.view(1, 1, 1, -1).expand(*x.shape[:-1], -1))
        return torch.gather(x, 2, index=self.full).sum(2, keepdim=True) * picked.mean(-1, keepdim=True)


class BiasTable(nn.Module):
    """Swin's relative position bias: ``table[index.view(-1)].view(N, N, -1)``, added to attention scores."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(5, 2))
        self.register_buffer("index", torch.tensor([[2, 1, 0], [3, 2, 1], [4, 3, 2]]), persistent=False)

    def forward(self, x):
        bias = self.table[self.index.view(-1)].view(3, 3, -1).permute(2, 0, 1).contiguous()
        return x + bias.unsqueeze(0)


class Tokens(nn.Module):
    """Token embeddings: ``F.embedding`` of an int64 buffer of ids, and of the same table with ``padding_idx``
    (its row gets no gradient from that read), as a language model reads its tokens (``nn.Embedding``:
    tests/trace/test_text_transformers.py)."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(5, 4))
        self.register_buffer("ids", torch.tensor([[1, 0, 2], [2, 2, 1]]))

    def forward(self, x):
        return x * F.embedding(self.ids, self.table) + F.embedding(self.ids, self.table, padding_idx=1).tanh()


OP_CASES = [  # (op the spec must hold, traced function or module, argument shapes)
    ("conv1d", lambda x, w, b: F.conv1d(x, w, b, 2, 1, 2), {"x": (2, 3, 11), "w": (4, 3, 3), "b": (4,)}),
    ("conv2d", lambda x, w: F.conv2d(x, w, None, (2, 1), 1, 2, 3), {"x": (2, 3, 9, 9), "w": (6, 1, 3, 3)}),
    ("conv2d", nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), X),
    ("conv3d", nn.Conv3d(2, 2, 3, padding=1, padding_mode="circular", bias=False), {"x": (2, 2, 5, 5, 5)}),
    ("conv_transpose1d", lambda x, w: F.conv_transpose1d(x, w, None, 3, 1, 2, 1, 2), {"x": (2, 3, 5), "w": (3, 2, 3)}),
    ("conv_transpose2d", nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1, groups=1, dilation=2), X),
    ("conv_transpose3d", nn.ConvTranspose3d(2, 2, 2, stride=2, groups=2), {"x": (2, 2, 3, 3, 3)}),
    ("dropout", nn.Dropout(0.3), X),  # in training mode: a mask drawn as the module draws it
    ("dropout", lambda x: F.dropout2d(x, 0.2, training=True), X),
    ("dropout", lambda x: x * x.new_empty((x.shape[0], 1, 1, 1)).bernoulli_(0.7).div_(0.7), X),  # timm's drop_path
    ("dropout", lambda x: x * torch.empty([1, 1, 1, 1], dtype=x.dtype).bernoulli_(0.9), X),  # stochastic depth, batch
    ("relu", nn.ReLU(inplace=True), X),
    ("relu", lambda x: x.relu_(), X),
    ("clamp", lambda x: x.clamp(min=0), X),  # not relu: autograd's clamp passes the gradient at 0
    ("clamp", lambda x: torch.clamp(x, -0.5, 0.25), X),
    ("clamp", lambda x: x.clamp(0, 6), X),
    ("add", lambda x, y: x + y, {"x": (2, 3, 4), "y": (2, 3, 4)}),
    ("add", lambda x, y: x.add_(y), {"x": (2, 3, 4), "y": (2, 3, 4)}),
    ("sub", lambda x, y: torch.sub(x, y), {"x": (2, 3, 4), "y": (3, 4)}),
    ("neg", lambda x: 1 - x, {"x": (2, 3)}),  # (-x) + 1
    ("mul", lambda x, y: 2 * x * y, {"x": (2, 3, 4), "y": (2, 3, 4)}),
    ("div", lambda x, y: x / positive(y), {"x": (2, 3, 4), "y": (2, 3, 4)}),
    ("neg", lambda x: -x, X),
    # constants made inside forward: one value broadcast against a tensor is a number ...
    ("mul", lambda x: torch.full_like(x, 2.0) * x, X),
    ("mul", lambda x: x * torch.ones(1, 3, 1, 1) * torch.tensor(0.5), X),
    ("add", lambda x: torch.zeros_like(x).add_(x) + x.new_full((1,), 1.5), X),
    ("neg", lambda x: torch.ones_like(x) - x, X),  # (-x) + 1.0
    ("pow", lambda x: torch.full_like(x, 3.0) / positive(x), X),  # positive(x) ** -1 * 3.0
    # ... and a map of one value, read as a tensor, is a full layer with its sizes read from x at run time
    ("full", lambda x: torch.cat([x, torch.full((x.shape[0], 1, x.shape[2], x.shape[3]), 0.25, dtype=x.dtype)], 1), X),
    ("full", lambda x: x[:, :1] * x.new_ones(x.shape[0], 4, *x.shape[2:]), X),
    ("pow", lambda x: x ** 3, X),
    ("pow", lambda x: x.square(), X),
    ("exp", lambda x: torch.exp(x), X),
    ("log", lambda x: torch.log(positive(x)), X),
    ("sqrt", lambda x: positive(x).sqrt(), X),
    ("abs", lambda x: abs(x), X),
    ("sigmoid", nn.Sigmoid(), X),
    ("tanh", nn.Tanh(), X),
    ("silu", nn.SiLU(), X),
    ("gelu", nn.GELU(approximate="tanh"), X),
    ("softplus", nn.Softplus(beta=2, threshold=10), X),
    ("elu", nn.ELU(alpha=0.5), X),
    ("leaky_relu", nn.LeakyReLU(0.2, inplace=True), X),
    ("hardtanh", nn.Hardtanh(-0.5, 0.5), X),
    ("relu6", nn.ReLU6(), X),
    ("hardsigmoid", nn.Hardsigmoid(inplace=True), {"x": (2, 3, 8, 8)}),
    ("hardsigmoid", lambda x: F.hardsigmoid(4 * x), X),  # past the kinks at -3 and 3
    ("hardswish", nn.Hardswish(), X),
    ("hardswish", lambda x: F.hardswish(4 * x, inplace=True), X),
    ("linear", nn.Linear(8, 5), {"x": (2, 3, 8)}),
    ("matmul", lambda x, y: x @ y, {"x": (3, 4), "y": (4, 5)}),
    ("matmul", lambda x, y: torch.bmm(x, y), {"x": (2, 3, 4), "y": (2, 4, 5)}),
    ("matmul", lambda x, y: x @ y.transpose(-2, -1), {"x": (2, 2, 3, 4), "y": (5, 4)}),  # batch dims broadcast
    ("scaled_dot_product_attention", lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
     {"q": (2, 2, 4, 3), "k": (2, 2, 5, 3), "v": (2, 2, 5, 3)}),
    ("scaled_dot_product_attention", lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m, scale=0.5),
     {"q": (2, 2, 4, 3), "k": (2, 2, 5, 3), "v": (2, 2, 5, 3), "m": (4, 5)}),  # an additive float mask (a bias)
    ("scaled_dot_product_attention", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     {"q": (2, 2, 4, 3), "k": (2, 2, 4, 3), "v": (2, 2, 4, 3)}),
    ("einsum", lambda q, k: torch.einsum("bhid,bhjd->bhij", q, k), {"q": (2, 2, 4, 3), "k": (2, 2, 5, 3)}),
    ("einsum", lambda q, k: torch.einsum("...id,...jd->...ij", [q, k]), {"q": (2, 2, 4, 3), "k": (2, 2, 5, 3)}),
    ("einsum", lambda x, w: torch.einsum("bchw,oc", x, w), {"x": (2, 3, 4, 5), "w": (6, 3)}),  # implicit output
    ("flatten", nn.Flatten(), X),
    ("flatten", lambda x: x.view(x.size(0), -1), X),
    ("reshape", lambda x: x.reshape(x.shape[0], 3, 4, 16), X),
    ("permute", lambda x: x.permute(0, 2, 3, 1), X),
    ("permute", lambda x: torch.permute(x, (0, 3, 1, 2)), X),
    ("reshape", lambda x: x.view((x.shape[0], 3, 16, 4)), X),
    ("mul", lambda x: torch.mul(0.5, x), X),
    ("pad", lambda x: F.pad(x, (1, 2, 0, 1), mode="reflect"), X),
    ("pad", nn.ZeroPad2d((2, 0, 1, 1)), X),
    ("pixel_shuffle", nn.PixelShuffle(2), {"x": (2, 8, 3, 3)}),
    ("pixel_unshuffle", nn.PixelUnshuffle(2), X),
    ("pixel_unshuffle", lambda x: F.pixel_unshuffle(x, 4), X),
    ("avg_pool1d", nn.AvgPool1d(3, 2, 1), {"x": (2, 3, 9)}),
    ("avg_pool2d", nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), X),
    ("avg_pool3d", nn.AvgPool3d(2), {"x": (2, 2, 4, 4, 4)}),
    ("max_pool1d", nn.MaxPool1d(2), {"x": (2, 3, 8)}),
    ("max_pool2d", nn.MaxPool2d(3, 2, 1, ceil_mode=True), X),
    ("max_pool3d", lambda x: F.max_pool3d(x, 2), {"x": (2, 2, 4, 4, 4)}),
    ("narrow", lambda x: x[:, 1:3], X),
    ("narrow", lambda x: x.narrow(1, 0, 2), X),
    ("narrow", lambda x: (lambda x1, x2: x1 * x2)(*x.chunk(2, dim=1)), {"x": (2, 4, 8, 8)}),  # NAFNet's SimpleGate
    ("narrow", lambda x: (lambda a, b: a * b)(*torch.chunk(x, 2, 1)), {"x": (2, 4, 8, 8)}),
    ("narrow", lambda x: torch.cat([p.exp() for p in torch.split(x, [1, 2], 1)][::-1], 1), X),
    ("narrow", lambda x: torch.cat(x.split(2, dim=1), dim=1) * x, X),  # pieces 2 and 1
    ("squeeze", lambda x: x.unbind(1)[2] * torch.unbind(x, dim=-1)[0], {"x": (2, 3, 3, 3)}),
    ("squeeze", lambda x: x[:, 0] * x[:, -1], X),
    ("squeeze", lambda x: F.adaptive_avg_pool2d(x, 1).squeeze(), X),
    ("squeeze", lambda x: x[:, :1].squeeze(1), X),
    ("squeeze", lambda x: x.mean((2, 3), keepdim=True).squeeze(-1).squeeze(-1), X),
    ("mean", lambda x: x - x.mean(1, keepdim=True), X),  # a hand-written LayerNorm's channel mean
    ("mean", lambda x: torch.mean(x * x, dim=(1, 3)), X),
    ("sum", lambda x: x * x.sum(dim=-1, keepdim=True), X),
    ("sum", lambda x: torch.sum(x, (0, 2)), X),
    ("var", lambda x: (x - x.mean(1, keepdim=True)) / (x.var(1, keepdim=True, unbiased=False) + 1e-5).sqrt(), X),
    ("var", lambda x: torch.var(x, dim=(2, 3)), X),
    ("std", lambda x: x / x.std(-1, keepdim=True), X),
    ("var", lambda x: (lambda v, m: (x - m) / (v + 1e-5).sqrt())(*torch.var_mean(x, dim=1, keepdim=True)), X),
    ("std", lambda x: (lambda s, m: (x - m) / s)(*torch.std_mean(x, dim=(2, 3), keepdim=True, correction=0)), X),
    ("normalize", lambda x: F.normalize(x.flatten(2), dim=-1), X),  # Restormer's queries and keys
    ("normalize", lambda x: torch.nn.functional.normalize(x), X),
    ("softmax", lambda x: F.softmax(x, dim=-1), X),
    ("softmax", nn.Softmax(dim=1), X),
    ("softmax", lambda x: x.flatten(2).softmax(-1), X),  # attention weights over positions
    ("log_softmax", lambda x: torch.log_softmax(x, 2), X),
    ("log_softmax", nn.LogSoftmax(dim=1), X),  # a layer when no nll_loss follows
    ("unsqueeze", lambda x: x[:, None] * x.unsqueeze(2), {"x": (2, 3, 8)}),
    ("unsqueeze", lambda x, gamma: x * gamma[..., None, None], {"x": X["x"], "gamma": (3,)}),
    ("unsqueeze", lambda x: x * x.mean((2, 3))[:, :, None, None], X),
    ("unsqueeze", lambda x: x[:, -1, None, 2:5] * torch.unsqueeze(x, -1)[:, :1, 2:5, ..., 0], X),
    ("permute", lambda x: x.transpose(1, 2), X),
    ("permute", lambda x: torch.transpose(x, -1, 1), X),
    ("permute", lambda x: x.swapaxes(0, 3) * 2, X),
    ("permute", lambda x: torch.swapdims(x, 2, 3), X),
    ("permute", lambda x: x.mT, X),
    ("permute", lambda x, y: x.T @ y, {"x": (4, 3), "y": (4, 5)}),
    ("reshape", lambda x, w: x.reshape_as(w) * w, {"x": (2, 12), "w": (2, 3, 4)}),
    ("flatten", lambda x: x.view_as(x.flatten(2)), X),
    ("interpolate", nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False), X),
    ("interpolate", lambda x: F.interpolate(x, scale_factor=2), X),
    ("adaptive_avg_pool1d", nn.AdaptiveAvgPool1d(2), {"x": (2, 3, 8)}),
    ("adaptive_avg_pool2d", nn.AdaptiveAvgPool2d((1, 1)), X),
    ("adaptive_avg_pool2d", lambda x: x.mean(dim=(2, 3)), X),
    ("adaptive_avg_pool2d", lambda x: x.mean([-1, -2], keepdim=True), X),
    ("adaptive_avg_pool3d", nn.AdaptiveAvgPool3d(1), {"x": (2, 2, 4, 4, 4)}),
    ("cat", lambda x, y: torch.cat([x, y], dim=1), {"x": X["x"], "y": X["x"]}),
    ("stack", lambda x, y: torch.stack([x, y.relu()], dim=1).sum(1), {"x": X["x"], "y": X["x"]}),  # SK-style
    ("stack", lambda x, y: torch.stack((x, y), -1), {"x": X["x"], "y": X["x"]}),
    ("expand", lambda x: x * x.mean((2, 3), keepdim=True).expand_as(x), X),  # SENet ports' gate
    ("expand", lambda x: x.sum(1, keepdim=True).expand(-1, 3, -1, -1) * x, X),
    ("repeat", lambda x: x.repeat(1, 2, 1, 1).sum(1, keepdim=True) * x, X),
    ("repeat", lambda x: torch.tile(x, (2, 1)).relu(), X),
    ("layer_norm", nn.LayerNorm([8, 8]), X),
    ("batch_norm", nn.BatchNorm2d(3), X),
    ("batch_norm", nn.BatchNorm2d(3).eval(), X),
    ("batch_norm", nn.BatchNorm1d(3), {"x": (4, 3)}),
    ("group_norm", nn.GroupNorm(3, 3), X),
    ("group_norm", nn.GroupNorm(1, 3), X),
    ("instance_norm", nn.InstanceNorm2d(3, affine=True), X),
    ("instance_norm", lambda x: F.instance_norm(x, eps=1e-3), X),
    ("instance_norm", nn.InstanceNorm3d(2, track_running_stats=True), {"x": (2, 2, 3, 4, 3)}),
    ("instance_norm", nn.InstanceNorm3d(2, affine=True, track_running_stats=True).eval(), {"x": (2, 2, 3, 4, 3)}),
    ("roll", lambda x: torch.roll(x, shifts=(-1, 2), dims=(2, 3)), X),  # Swin's shifted windows
    ("roll", lambda x: x.roll(3, -1), X),
    ("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, 1) * x, X),  # a global max pool
    ("adaptive_max_pool1d", nn.AdaptiveMaxPool1d(2), {"x": (2, 3, 5)}),
    ("adaptive_max_pool3d", nn.AdaptiveMaxPool3d((2, 1, 2)), {"x": (2, 2, 3, 4, 3)}),
    ("adaptive_max_pool2d", lambda x: torch.cat([F.adaptive_avg_pool2d(x, (3, 2)), nn.AdaptiveMaxPool2d((3, 2))(x)], 1), X),
    ("amax", lambda x: x * x.amax((2, 3), keepdim=True), X),  # CBAM's channel descriptor
    ("amax", lambda x: torch.cat([x.mean(dim=1, keepdim=True), torch.amax(x, dim=1, keepdim=True)], dim=1), X),
    ("amax", lambda x: x.amax(dim=-1).exp(), X),
    # CBAM's spatial attention: torch.max(x, 1, keepdim=True)[0]; MaxViT-style .values; torch.min
    ("max", lambda x: torch.cat([torch.mean(x, 1, keepdim=True), torch.max(x, 1, keepdim=True)[0]], dim=1), X),
    ("max", lambda x: x.max(dim=-1).values.exp(), X),
    ("max", lambda x: x.max(1)[0].unsqueeze(1) * x.max(dim=2, keepdim=True).values, X),
    ("min", lambda x: torch.min(x, dim=2, keepdim=True)[0] * x, X),
    ("min", lambda x: x.min(-1).values.sigmoid(), X),
    ("amax", lambda x: torch.max(x) * x, X),  # over every entry: autograd shares ties' gradient, as amax does
    ("slice", lambda x: x[:, :, ::2, 1::2], X),  # LeViT's subsampled queries: x.view(B, H, W, C)[:, ::s, ::s]
    ("slice", lambda x: x[..., 1:7:3] * x[:, 1::2, :, ::4], X),  # a fixed end; channels 1::2 broadcast
    ("slice", lambda x: x[:, :, 1::2], X),  # SwinUNETR's patch merging, space-to-depth
    ("slice", lambda x: torch.cat([x[..., 0::2, 0::2], x[..., 1::2, 0::2]], 1), X),
    ("clamp", lambda x: torch.clamp(x, max=0.5), X),  # SwinV2's logit scale, one-sided
    ("clamp", lambda x: x.clamp_min(-0.2) * torch.clamp_max(x, 0.3), X),
    ("clamp", lambda x: x.clip(min=0.1), X),
    ("sin", lambda x: torch.sin(x), X),
    ("cos", lambda x: x.cos(), X),
    ("prelu", nn.PReLU(3), X),
    ("prelu", nn.PReLU(), X),  # one slope for every channel
    ("prelu", lambda x, w: F.prelu(x, w), {"x": X["x"], "w": (3,)}),
    ("addcmul", lambda x, y: torch.addcmul(x, x, y, value=0.5), {"x": X["x"], "y": (3, 1, 1)}),
    ("addcmul", lambda x, y: x.addcmul(y, y), {"x": X["x"], "y": X["x"]}),
    ("vector_norm", lambda x: x / torch.norm(x, p=2, dim=(2, 3), keepdim=True), X),  # ConvNeXtV2's GRN
    ("vector_norm", lambda x: x.norm(dim=1), X),
    ("vector_norm", lambda x: torch.linalg.vector_norm(x, dim=-1, keepdim=True) * x, X),
    # diffusers' sinusoidal timestep embedding: the frequencies, made from numbers alone, a constant layer
    ("constant", lambda t: torch.cat([torch.sin(t[:, None] * torch.exp(-math.log(10000) * torch.arange(4) / 4)[None]),
                                      torch.cos(t[:, None] * torch.exp(-math.log(10000) * torch.arange(4) / 4)[None])],
                                     dim=-1), {"t": (3,)}),
    # diffusers' float32 timestep embedding in a float64 model: .float() and .to(dtype) are cast layers
    ("cast", HalfPrecisionScale(), {"x": (2, 3)}),
    # a branch on the input's size (timm's MobileViT: math.ceil(H / p) * p != H), checked at run time
    ("size_check", lambda x: x * 2 if x.shape[2] > 3 else x, X),
    # MONAI's 3D layers beside the 2D ones above
    ("pad", lambda x: F.pad(x, (1, 1, 1, 0, 0, 2), mode="replicate"), {"x": (2, 2, 4, 5, 3)}),
    ("avg_pool3d", nn.AvgPool3d(3, 2, 1, count_include_pad=False), {"x": (2, 2, 4, 5, 3)}),
    ("interpolate", nn.Upsample(scale_factor=2, mode="trilinear", align_corners=True), {"x": (2, 2, 2, 3, 2)}),
    ("group_norm", nn.GroupNorm(1, 2), {"x": (2, 2, 4, 5, 3)}),
    ("index", TokenGather(), {"x": (2, 3, 3, 3)}),
    ("index", BiasTable(), {"x": (2, 2, 3, 3)}),
    ("index", Selected(), {"x": (2, 3, 3, 3)}),
    ("gather", Gathered(), X),
    ("embedding", Tokens(), {"x": (2, 3, 4)}),
    ("attention_probabilities", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True),
     {"q": (2, 2, 4, 3), "k": (2, 2, 4, 3), "v": (2, 2, 4, 3)}),  # dropout inside attention (training mode)
    ("addmm", lambda b, x, w: torch.addmm(b, x.view(-1, x.size(-1)), w).view(2, 3, 4), {"b": (4,), "x": (2, 3, 5),
                                                                                     "w": (5, 4)}),  # GPT-2's Conv1D
]


def compare(function, shapes: dict, text: str, appended: bool = False) -> dict:
    """Generate ``text`` and compare its gradients with autograd through ``function`` itself (float64);
    ``appended``: the function returns a prediction, and ``--loss half_sq_error`` was put after it."""
    spec = yaml.safe_load(text)
    built = build_text(text, "traced.yaml")
    generated = built.rendered
    module = by_name(module_from_source(generated.files[f"{generated.name}.py"], generated.name),
                     built.graph)  # the parameters go in `params`: called here by their spec names
    generator = torch.Generator().manual_seed(5)
    if isinstance(function, nn.Module):
        function = function.double()
    parameters = dict(function.named_parameters()) | dict(function.named_buffers()) if isinstance(function, nn.Module) else {}
    values = {}
    for key, entry in spec["inputs"].items():
        if key in parameters:
            values[key] = parameters[key].detach().clone().requires_grad_(key in spec["wrt"])
        elif entry.get("dtype") == "int64":
            values[key] = torch.randint(0, 3, entry["shape"], generator=generator)
        else:
            values[key] = torch.randn(entry["shape"], generator=generator, dtype=torch.float64, requires_grad=True)
    seeded = torch.random.fork_rng()  # dropout: the same masks in the function and the generated code
    if isinstance(function, nn.Module):  # run the module on the same parameter values
        with torch.no_grad():
            for key, value in values.items():
                if key in parameters:
                    parameters[key].copy_(value)
        with seeded:
            torch.manual_seed(0)
            reference = torch.func.functional_call(function, {key: values[key] for key in parameters if key in values},
                                                   tuple(values[key].clone() for key in shapes))
    else:  # clones: the traced code may work in place (relu_, add_)
        with seeded:
            torch.manual_seed(0)
            reference = function(*(values[key].clone() for key in shapes))
    total = 0.5 * (reference - values[spec["loss"]["target"]]).pow(2).sum() if appended else reference
    weight = torch.randn(total.shape, generator=generator, dtype=torch.float64)  # a random cotangent
    expected = torch.autograd.grad(total, [values[key] for key in spec["wrt"]], grad_outputs=weight)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        actual = module.gradients(**values, grad_loss=weight)
    for key, reference_gradient in zip(spec["wrt"], expected):
        assert relative_error(getattr(actual, key), reference_gradient) <= 1e-10, key
    return spec


@pytest.mark.parametrize("op, function, shapes", OP_CASES, ids=[f"{case[0]}-{index}" for index, case in enumerate(OP_CASES)])
def test_op_is_traced_and_its_gradient_matches_autograd(op, function, shapes):
    if isinstance(function, nn.Module):  # its forward's own argument names (``input``)
        shapes = dict(zip(inspect.signature(function.forward).parameters, shapes.values()))
    text = trace(function, shapes, name="traced", loss=LossChoice("half_sq_error"))
    spec = compare(function, shapes, text, appended=True)
    assert op in [layer["op"] for layer in spec["layers"]], text


@pytest.mark.parametrize("function", [lambda x: x.clamp(min=0), lambda x: x.clamp(0, 6),
                                      lambda x: torch.clamp(x, -0.5, 0.25)], ids=["clamp(min=0)", "clamp(0, 6)", "clamp(a, b)"])
def test_a_traced_clamp_passes_the_gradient_at_its_bounds_as_autograd_does(function):
    """``x.clamp(min=0)`` at 0 (a ReLU's zeros sit there), ``clamp(0, 6)`` at 0 and 6: autograd's
    clamp passes the gradient there, where relu's and relu6's backward give 0, so the traced spec keeps the
    clamp op (it was relu and relu6, and the gradients at the bounds were 0)."""
    text = trace(function, {"x": (2, 6)}, name="clamped", loss=LossChoice("half_sq_error"))
    assert [layer["op"] for layer in yaml.safe_load(text)["layers"]][-1] == "clamp", text
    built = build_text(text, "clamped.yaml")
    module = module_from_source(built.rendered.files["clamped.py"], "clamped")
    x = torch.tensor([[0.0, 6.0, -0.5, 0.25, 3.0, -1.0], [7.0, 0.0, 0.1, 6.0, -0.5, 0.25]], dtype=torch.float64,
                     requires_grad=True)
    target = torch.zeros(2, 6, dtype=torch.float64)
    expected, = torch.autograd.grad(0.5 * (function(x.clone()) - target).pow(2).sum() + function(x.clone()).sum(), [x])
    names = [name for name in yaml.safe_load(text)["inputs"] if name != "x"]
    got = module.gradients(x=x, **{names[0]: target - 1})  # (out - (target - 1)) = (out - target) + 1
    assert torch.equal(got.x, expected), (got.x, expected)


def test_every_registry_op_has_a_trace_case():
    assert set(LAYER_RULES) <= {case[0] for case in OP_CASES}


def half_sq(p, y):
    return 0.5 * (p - y).pow(2).sum()


LOSS_CASES = [  # (loss op and reduction the spec must hold, the traced loss function)
    ("half_sq_error", "sum", half_sq),
    ("half_sq_error", "sum", lambda p, y: ((y - p) ** 2).sum() / 2),
    ("half_sq_error", "sum", lambda p, y: 0.5 * torch.sum(torch.square(p - y))),
    ("half_sq_error", "sum", lambda p, y: F.mse_loss(p, y, reduction="sum") * 0.5),
    ("half_sq_error", "mean", lambda p, y: 0.5 * ((p - y) ** 2).mean()),
    ("half_sq_error", "per_sample", lambda p, y: 0.5 * (p - y).pow(2).sum(dim=[1, 2, 3])),
    ("mse_loss", "mean", lambda p, y: F.mse_loss(p, y)),
    ("mse_loss", "mean", lambda p, y: nn.MSELoss()(p, y)),
    ("mse_loss", "sum", lambda p, y: ((p - y) ** 2).sum()),
    ("mse_loss", "per_sample", lambda p, y: F.mse_loss(p, y, reduction="none").sum(dim=(1, 2, 3))),
    ("l1_loss", "mean", lambda p, y: (y - p).abs().mean()),
    ("l1_loss", "sum", lambda p, y: F.l1_loss(p, y, reduction="sum")),
    ("smooth_l1_loss", "mean", lambda p, y: F.smooth_l1_loss(p, y, beta=0.5)),
    ("huber_loss", "sum", lambda p, y: nn.HuberLoss(reduction="sum", delta=0.7)(p, y)),
]


@pytest.mark.parametrize("op, reduction, function", LOSS_CASES, ids=[f"{case[0]}-{index}" for index, case in enumerate(LOSS_CASES)])
def test_loss_tail_is_recognised_and_matches_autograd(op, reduction, function):
    shapes = {"p": (2, 3, 4, 4), "y": (2, 3, 4, 4)}
    text = trace(function, shapes, name="traced")
    spec = yaml.safe_load(text)
    assert spec["loss"]["op"] == op and spec["loss"]["reduction"] == reduction and spec["layers"] == [], text
    assert spec["wrt"] == ["p"] or set(spec["wrt"]) == {"p", "y"}
    compare(function, shapes, text)


CLASS_CASES = [  # (loss op the spec must hold, the traced loss function)
    ("cross_entropy", lambda z, labels: F.cross_entropy(z, labels)),
    ("cross_entropy", lambda z, labels: F.nll_loss(F.log_softmax(z, dim=1), labels, reduction="sum")),
    ("nll_loss", lambda z, labels: F.nll_loss(z, labels)),  # z read as log-probabilities
]


@pytest.mark.parametrize("op, function", CLASS_CASES, ids=[f"{case[0]}-{index}" for index, case in enumerate(CLASS_CASES)])
def test_class_losses_take_int64_labels(op, function):
    shapes = {"z": (4, 5), "labels": (4,)}
    text = trace(function, shapes, name="traced", dtypes={"labels": "int64"})
    spec = yaml.safe_load(text)
    assert spec["loss"]["op"] == op and spec["inputs"]["labels"]["dtype"] == "int64"
    assert spec["wrt"] == ["z"]
    compare(function, shapes, text)


def test_every_registry_loss_is_traced_by_some_case():
    assert set(LOSS_RULES) <= {case[0] for case in [*LOSS_CASES, *CLASS_CASES]}


@pytest.mark.parametrize("function", [lambda x: (lambda a, b: a * b)(*x.chunk(2, dim=2)),
                                      lambda x: x.split(4, dim=-1)[-1],
                                      lambda x: x[:, :, -1],
                                      lambda x: x.reshape_as(x.permute(0, 2, 3, 1))],
                         ids=["chunk-spatial", "split-spatial", "index-from-the-end", "reshape_as-spatial"])
def test_pieces_whose_sizes_follow_the_input_are_refused(function):
    """Along a spatial dim the pieces' offsets and sizes are the input's: the second run finds them changed."""
    with pytest.raises(TraceError, match="computed from the input's size"):
        trace(function, X, name="traced", loss=LossChoice("half_sq_error"))


def test_a_reshape_of_int64_labels_is_refused_at_its_line():
    """int64 inputs reshaped are kept as views for indexing alone; a loss reading one says so, at its line."""
    def flat_loss(x, labels):
        return F.cross_entropy(x.permute(0, 2, 3, 1).reshape(-1, 3), labels.view(-1))  # FLAT_LABELS

    with pytest.raises(TraceError) as error:
        trace(flat_loss, {"x": (2, 3, 4, 4), "labels": (2, 4, 4)}, dtypes={"labels": "int64"})
    (line,) = str(error.value).splitlines()
    number = next(n for n, text in enumerate(open(__file__).read().splitlines(), 1) if text.endswith("# FLAT_LABELS"))
    assert line.startswith(f"{__file__}:{number}: error: 'cross_entropy' reads a reshape of an int64 input"), line
