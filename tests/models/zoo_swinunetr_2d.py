"""SwinUNETR's first stage in 2D, written the way MONAI writes its 2D branches (``len(x_shape) == 4``): window
partition and merge by view/permute, a 2D relative position index, ``torch.roll`` over two dims, the
shifted-window mask a buffer made in ``__init__`` (README's Limits), patch merging by four strided slices
``x[:, 0::2, 1::2, :]`` and ``torch.cat``, the hidden state layer-normed through einops and the instance-norm
UNETR block that reads it. The 3D stage is ``tests/models/zoo_swinunetr.py``'s. The code is ours; the facts are public.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from tests.models.zoo_monai import UnetResBlock
from tests.models.zoo_swinunetr import MLPBlock, get_window_size


def window_partition(x, window_size):
    b, h, w, c = x.shape
    x = x.view(b, h // window_size[0], window_size[0], w // window_size[1], window_size[1], c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size[0] * window_size[1], c)


def window_reverse(windows, window_size, dims):
    b, h, w = dims
    x = windows.view(b, h // window_size[0], w // window_size[1], window_size[0], window_size[1], -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h, w, -1)


class WindowAttention(nn.Module):
    def __init__(self, dim, num_heads, window_size, qkv_bias=False):
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        head_dim = dim // num_heads
        self.scale = head_dim**-0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * self.window_size[0] - 1) * (2 * self.window_size[1] - 1), num_heads)
        )
        coords_h = torch.arange(self.window_size[0])
        coords_w = torch.arange(self.window_size[1])
        coords = torch.stack(torch.meshgrid(coords_h, coords_w, indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)
        relative_coords = coords_flatten[:, :, None] - coords_flatten[:, None, :]
        relative_coords = relative_coords.permute(1, 2, 0).contiguous()
        relative_coords[:, :, 0] += self.window_size[0] - 1
        relative_coords[:, :, 1] += self.window_size[1] - 1
        relative_coords[:, :, 0] *= 2 * self.window_size[1] - 1
        relative_position_index = relative_coords.sum(-1)
        self.register_buffer("relative_position_index", relative_position_index)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        relative_position_bias = self.relative_position_bias_table[
            self.relative_position_index.clone()[:n, :n].reshape(-1)
        ].reshape(n, n, -1)
        relative_position_bias = relative_position_bias.permute(2, 0, 1).contiguous()
        attn = attn + relative_position_bias.unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(b // nw, nw, self.num_heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, n, n)
            attn = self.softmax(attn)
        else:
            attn = self.softmax(attn)
        attn = self.attn_drop(attn).to(v.dtype)
        x = (attn @ v).transpose(1, 2).reshape(b, n, c)
        x = self.proj(x)
        return self.proj_drop(x)


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim, num_heads, window_size, shift_size, mlp_ratio=4.0, qkv_bias=True):
        super().__init__()
        self.dim, self.num_heads, self.window_size, self.shift_size = dim, num_heads, window_size, shift_size
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window_size=self.window_size, num_heads=num_heads, qkv_bias=qkv_bias)
        self.drop_path = nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLPBlock(hidden_size=dim, mlp_dim=int(dim * mlp_ratio))

    def forward_part1(self, x, mask_matrix):
        x = self.norm1(x)
        b, h, w, c = x.shape
        window_size, shift_size = get_window_size((h, w), self.window_size, self.shift_size)
        pad_l = pad_t = 0
        pad_b = (window_size[0] - h % window_size[0]) % window_size[0]
        pad_r = (window_size[1] - w % window_size[1]) % window_size[1]
        x = F.pad(x, (0, 0, pad_l, pad_r, pad_t, pad_b))
        _, hp, wp, _ = x.shape
        dims = [b, hp, wp]
        if any(i > 0 for i in shift_size):
            shifted_x = torch.roll(x, shifts=(-shift_size[0], -shift_size[1]), dims=(1, 2))
            attn_mask = mask_matrix
        else:
            shifted_x = x
            attn_mask = None
        x_windows = window_partition(shifted_x, window_size)
        attn_windows = self.attn(x_windows, mask=attn_mask)
        attn_windows = attn_windows.view(-1, *(window_size + (c,)))
        shifted_x = window_reverse(attn_windows, window_size, dims)
        if any(i > 0 for i in shift_size):
            x = torch.roll(shifted_x, shifts=(shift_size[0], shift_size[1]), dims=(1, 2))
        else:
            x = shifted_x
        if pad_r > 0 or pad_b > 0:
            x = x[:, :h, :w, :].contiguous()
        return x

    def forward_part2(self, x):
        return self.drop_path(self.mlp(self.norm2(x)))

    def forward(self, x, mask_matrix):
        shortcut = x
        x = self.forward_part1(x, mask_matrix)
        x = shortcut + self.drop_path(x)
        return x + self.forward_part2(x)


class PatchMerging(nn.Module):
    """MONAI's 2D patch merging: four strided slices concatenated, LayerNorm, Linear."""

    def __init__(self, dim, norm_layer=nn.LayerNorm, spatial_dims=2):
        super().__init__()
        self.dim = dim
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = norm_layer(4 * dim)

    def forward(self, x):
        b, h, w, c = x.shape
        pad_input = (h % 2 == 1) or (w % 2 == 1)
        if pad_input:
            x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        x0 = x[:, 0::2, 0::2, :]
        x1 = x[:, 1::2, 0::2, :]
        x2 = x[:, 0::2, 1::2, :]
        x3 = x[:, 1::2, 1::2, :]
        x = torch.cat([x0, x1, x2, x3], -1)
        x = self.norm(x)
        return self.reduction(x)


def compute_mask(dims, window_size, shift_size, device):
    cnt = 0
    h, w = dims
    img_mask = torch.zeros((1, h, w, 1), device=device)
    for h in slice(-window_size[0]), slice(-window_size[0], -shift_size[0]), slice(-shift_size[0], None):
        for w in slice(-window_size[1]), slice(-window_size[1], -shift_size[1]), slice(-shift_size[1], None):
            img_mask[:, h, w, :] = cnt
            cnt += 1
    mask_windows = window_partition(img_mask, window_size)
    mask_windows = mask_windows.squeeze(-1)
    attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
    return attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))


class BasicLayerFixedMask(nn.Module):
    """MONAI's ``BasicLayer`` in 2D, its shifted-window mask a buffer made in ``__init__`` for
    ``input_resolution`` (a mask made in ``forward`` is refused: README's Limits)."""

    def __init__(
        self, dim, depth, num_heads, window_size, input_resolution, mlp_ratio=4.0, qkv_bias=False, downsample=None
    ):
        super().__init__()
        self.window_size = window_size
        self.shift_size = tuple(i // 2 for i in window_size)
        self.no_shift = tuple(0 for i in window_size)
        self.depth = depth
        self.blocks = nn.ModuleList(
            [
                SwinTransformerBlock(
                    dim, num_heads, window_size, self.no_shift if i % 2 == 0 else self.shift_size, mlp_ratio, qkv_bias
                )
                for i in range(depth)
            ]
        )
        self.downsample = downsample(dim=dim, norm_layer=nn.LayerNorm, spatial_dims=len(self.window_size))
        window_size, shift_size = get_window_size(input_resolution, self.window_size, self.shift_size)
        dims = [int(np.ceil(n / w)) * w for n, w in zip(input_resolution, window_size)]
        self.register_buffer("attn_mask", compute_mask(dims, window_size, shift_size, None), persistent=False)

    def forward(self, x):
        b, c, h, w = x.size()
        x = rearrange(x, "b c h w -> b h w c")
        for blk in self.blocks:
            x = blk(x, self.attn_mask)
        x = x.view(b, h, w, -1)
        x = self.downsample(x)
        return rearrange(x, "b h w c -> b c h w")


class PatchEmbed(nn.Module):
    def __init__(self, patch_size=2, in_chans=1, embed_dim=12, spatial_dims=2):
        super().__init__()
        self.patch_size = (patch_size,) * spatial_dims
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)

    def forward(self, x):
        _, _, h, w = x.size()
        if w % self.patch_size[1] != 0:
            x = F.pad(x, (0, self.patch_size[1] - w % self.patch_size[1]))
        if h % self.patch_size[0] != 0:
            x = F.pad(x, (0, 0, 0, self.patch_size[0] - h % self.patch_size[0]))
        return self.proj(x)


class SwinUNETRStage2D(nn.Module):
    """The patch embedding, a plain and a shifted 2D window block, patch merging, the hidden state layer-normed
    through einops, and the UNETR encoder block (instance norm) that reads it."""

    def __init__(self, in_channels=1, feature_size=12, num_heads=3, window_size=4, img_size=(16, 16)):
        super().__init__()
        self.patch_embed = PatchEmbed(2, in_channels, feature_size)
        self.layers1 = nn.ModuleList(
            [
                BasicLayerFixedMask(
                    feature_size,
                    2,
                    num_heads,
                    (window_size,) * 2,
                    input_resolution=tuple(s // 2 for s in img_size),
                    qkv_bias=True,
                    downsample=PatchMerging,
                )
            ]
        )
        self.encoder3 = UnetResBlock(2, 2 * feature_size, 2 * feature_size, 3, 1, "instance")

    def forward(self, x_in):
        x0 = self.patch_embed(x_in)
        x1 = self.layers1[0](x0.contiguous())
        n, ch, h, w = x1.size()
        x1_out = rearrange(F.layer_norm(rearrange(x1, "n c h w -> n h w c"), [ch]), "n h w c -> n c h w")
        return self.encoder3(x1_out)
