"""MONAI's SwinUNETR in 3D, written the way MONAI writes it: a Swin transformer encoder (patch embedding by
a strided conv, 3D window attention with a relative position bias table indexed by an int64 buffer,
``torch.roll``-shifted windows with the mask ``compute_mask`` builds in ``forward``, patch merging by
strided slices ``x[:, 0::2, 0::2, 0::2, :]`` and ``torch.cat``, the hidden states layer-normed by
einops' ``rearrange``) and instance-norm UNETR decoder blocks. The code is ours; the facts are public.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from tests.models.zoo_monai import UnetOutBlock, UnetResBlock, UnetUpBlock


def window_partition(x, window_size):
    b, d, h, w, c = x.size()
    x = x.view(
        b,
        d // window_size[0],
        window_size[0],
        h // window_size[1],
        window_size[1],
        w // window_size[2],
        window_size[2],
        c,
    )
    return x.permute(0, 1, 3, 5, 2, 4, 6, 7).contiguous().view(-1, window_size[0] * window_size[1] * window_size[2], c)


def window_reverse(windows, window_size, dims):
    b, d, h, w = dims
    x = windows.view(
        b,
        d // window_size[0],
        h // window_size[1],
        w // window_size[2],
        window_size[0],
        window_size[1],
        window_size[2],
        -1,
    )
    return x.permute(0, 1, 4, 2, 5, 3, 6, 7).contiguous().view(b, d, h, w, -1)


def get_window_size(x_size, window_size, shift_size=None):
    use_window_size = list(window_size)
    use_shift_size = list(shift_size) if shift_size is not None else None
    for i in range(len(x_size)):
        if x_size[i] <= window_size[i]:
            use_window_size[i] = x_size[i]
            if shift_size is not None:
                use_shift_size[i] = 0
    if shift_size is None:
        return tuple(use_window_size)
    return tuple(use_window_size), tuple(use_shift_size)


class WindowAttention(nn.Module):
    def __init__(self, dim, num_heads, window_size, qkv_bias=False):
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        head_dim = dim // num_heads
        self.scale = head_dim**-0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size[0] - 1) * (2 * window_size[1] - 1) * (2 * window_size[2] - 1), num_heads)
        )
        coords_d = torch.arange(self.window_size[0])
        coords_h = torch.arange(self.window_size[1])
        coords_w = torch.arange(self.window_size[2])
        coords = torch.stack(torch.meshgrid(coords_d, coords_h, coords_w, indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)
        relative_coords = coords_flatten[:, :, None] - coords_flatten[:, None, :]
        relative_coords = relative_coords.permute(1, 2, 0).contiguous()
        relative_coords[:, :, 0] += self.window_size[0] - 1
        relative_coords[:, :, 1] += self.window_size[1] - 1
        relative_coords[:, :, 2] += self.window_size[2] - 1
        relative_coords[:, :, 0] *= (2 * self.window_size[1] - 1) * (2 * self.window_size[2] - 1)
        relative_coords[:, :, 1] *= 2 * self.window_size[2] - 1
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


class MLPBlock(nn.Module):
    def __init__(self, hidden_size, mlp_dim):
        super().__init__()
        self.linear1 = nn.Linear(hidden_size, mlp_dim)
        self.linear2 = nn.Linear(mlp_dim, hidden_size)
        self.fn = nn.GELU()
        self.drop1 = nn.Dropout(0.0)
        self.drop2 = nn.Dropout(0.0)

    def forward(self, x):
        x = self.fn(self.linear1(x))
        x = self.drop1(x)
        x = self.linear2(x)
        return self.drop2(x)


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
        b, d, h, w, c = x.shape
        window_size, shift_size = get_window_size((d, h, w), self.window_size, self.shift_size)
        pad_l = pad_t = pad_d0 = 0
        pad_d1 = (window_size[0] - d % window_size[0]) % window_size[0]
        pad_b = (window_size[1] - h % window_size[1]) % window_size[1]
        pad_r = (window_size[2] - w % window_size[2]) % window_size[2]
        x = F.pad(x, (0, 0, pad_l, pad_r, pad_t, pad_b, pad_d0, pad_d1))
        _, dp, hp, wp, _ = x.shape
        dims = [b, dp, hp, wp]
        if any(i > 0 for i in shift_size):
            shifted_x = torch.roll(x, shifts=(-shift_size[0], -shift_size[1], -shift_size[2]), dims=(1, 2, 3))
            attn_mask = mask_matrix
        else:
            shifted_x = x
            attn_mask = None
        x_windows = window_partition(shifted_x, window_size)
        attn_windows = self.attn(x_windows, mask=attn_mask)
        attn_windows = attn_windows.view(-1, *(window_size + (c,)))
        shifted_x = window_reverse(attn_windows, window_size, dims)
        if any(i > 0 for i in shift_size):
            x = torch.roll(shifted_x, shifts=(shift_size[0], shift_size[1], shift_size[2]), dims=(1, 2, 3))
        else:
            x = shifted_x
        if pad_d1 > 0 or pad_r > 0 or pad_b > 0:
            x = x[:, :d, :h, :w, :].contiguous()
        return x

    def forward_part2(self, x):
        return self.drop_path(self.mlp(self.norm2(x)))

    def forward(self, x, mask_matrix):
        shortcut = x
        x = self.forward_part1(x, mask_matrix)
        x = shortcut + self.drop_path(x)
        return x + self.forward_part2(x)


class PatchMerging(nn.Module):
    """MONAI's ``merging`` (v1) down-sampling: eight strided slices concatenated, LayerNorm, Linear."""

    def __init__(self, dim, norm_layer=nn.LayerNorm, spatial_dims=3):
        super().__init__()
        self.dim = dim
        self.reduction = nn.Linear(8 * dim, 2 * dim, bias=False)
        self.norm = norm_layer(8 * dim)

    def forward(self, x):
        b, d, h, w, c = x.size()
        pad_input = (h % 2 == 1) or (w % 2 == 1) or (d % 2 == 1)
        if pad_input:
            x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2, 0, d % 2))
        x0 = x[:, 0::2, 0::2, 0::2, :]
        x1 = x[:, 1::2, 0::2, 0::2, :]
        x2 = x[:, 0::2, 1::2, 0::2, :]
        x3 = x[:, 0::2, 0::2, 1::2, :]
        x4 = x[:, 1::2, 0::2, 1::2, :]
        x5 = x[:, 0::2, 1::2, 0::2, :]
        x6 = x[:, 0::2, 0::2, 1::2, :]
        x7 = x[:, 1::2, 1::2, 1::2, :]
        x = torch.cat([x0, x1, x2, x3, x4, x5, x6, x7], -1)
        x = self.norm(x)
        return self.reduction(x)


def compute_mask(dims, window_size, shift_size, device):
    cnt = 0
    d, h, w = dims
    img_mask = torch.zeros((1, d, h, w, 1), device=device)
    for d in slice(-window_size[0]), slice(-window_size[0], -shift_size[0]), slice(-shift_size[0], None):
        for h in slice(-window_size[1]), slice(-window_size[1], -shift_size[1]), slice(-shift_size[1], None):
            for w in slice(-window_size[2]), slice(-window_size[2], -shift_size[2]), slice(-shift_size[2], None):
                img_mask[:, d, h, w, :] = cnt
                cnt += 1
    mask_windows = window_partition(img_mask, window_size)
    mask_windows = mask_windows.squeeze(-1)
    attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
    return attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))


class BasicLayer(nn.Module):
    def __init__(self, dim, depth, num_heads, window_size, mlp_ratio=4.0, qkv_bias=False, downsample=None):
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

    def forward(self, x):
        b, c, d, h, w = x.size()
        window_size, shift_size = get_window_size((d, h, w), self.window_size, self.shift_size)
        x = rearrange(x, "b c d h w -> b d h w c")
        dp = int(np.ceil(d / window_size[0])) * window_size[0]
        hp = int(np.ceil(h / window_size[1])) * window_size[1]
        wp = int(np.ceil(w / window_size[2])) * window_size[2]
        attn_mask = compute_mask([dp, hp, wp], window_size, shift_size, x.device)
        for blk in self.blocks:
            x = blk(x, attn_mask)
        x = x.view(b, d, h, w, -1)
        x = self.downsample(x)
        return rearrange(x, "b d h w c -> b c d h w")


class PatchEmbed(nn.Module):
    def __init__(self, patch_size=2, in_chans=1, embed_dim=12, spatial_dims=3):
        super().__init__()
        self.patch_size = (patch_size,) * spatial_dims
        self.proj = nn.Conv3d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)

    def forward(self, x):
        _, _, d, h, w = x.size()
        if w % self.patch_size[2] != 0:
            x = F.pad(x, (0, self.patch_size[2] - w % self.patch_size[2]))
        if h % self.patch_size[1] != 0:
            x = F.pad(x, (0, 0, 0, self.patch_size[1] - h % self.patch_size[1]))
        if d % self.patch_size[0] != 0:
            x = F.pad(x, (0, 0, 0, 0, 0, self.patch_size[0] - d % self.patch_size[0]))
        return self.proj(x)


class SwinTransformer(nn.Module):
    def __init__(self, in_chans, embed_dim, window_size, patch_size, depths, num_heads, mlp_ratio=4.0, qkv_bias=True):
        super().__init__()
        self.num_layers = len(depths)
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        self.pos_drop = nn.Dropout(p=0.0)
        for i_layer in range(self.num_layers):
            layer = BasicLayer(
                int(embed_dim * 2**i_layer),
                depths[i_layer],
                num_heads[i_layer],
                window_size,
                mlp_ratio,
                qkv_bias,
                downsample=PatchMerging,
            )
            setattr(self, f"layers{i_layer + 1}", nn.ModuleList([layer]))

    def proj_out(self, x, normalize=False):
        if normalize:
            n, ch, d, h, w = x.size()
            x = rearrange(x, "n c d h w -> n d h w c")
            x = F.layer_norm(x, [ch])
            x = rearrange(x, "n d h w c -> n c d h w")
        return x

    def forward(self, x, normalize=True):
        x0 = self.patch_embed(x)
        x0 = self.pos_drop(x0)
        x0_out = self.proj_out(x0, normalize)
        x1 = self.layers1[0](x0.contiguous())
        x1_out = self.proj_out(x1, normalize)
        x2 = self.layers2[0](x1.contiguous())
        x2_out = self.proj_out(x2, normalize)
        x3 = self.layers3[0](x2.contiguous())
        x3_out = self.proj_out(x3, normalize)
        x4 = self.layers4[0](x3.contiguous())
        x4_out = self.proj_out(x4, normalize)
        return [x0_out, x1_out, x2_out, x3_out, x4_out]


class SwinUNETR(nn.Module):
    """``window_size``: MONAI fixes 7; the tests use 4 to keep the volumes small."""

    def __init__(
        self,
        in_channels=1,
        out_channels=2,
        depths=(2, 2, 2, 2),
        num_heads=(3, 6, 12, 24),
        feature_size=12,
        norm_name="instance",
        normalize=True,
        window_size=4,
    ):
        super().__init__()
        self.normalize = normalize
        self.swinViT = SwinTransformer(in_channels, feature_size, (window_size,) * 3, 2, depths, num_heads)
        self.encoder1 = UnetResBlock(3, in_channels, feature_size, 3, 1, norm_name)
        self.encoder2 = UnetResBlock(3, feature_size, feature_size, 3, 1, norm_name)
        self.encoder3 = UnetResBlock(3, 2 * feature_size, 2 * feature_size, 3, 1, norm_name)
        self.encoder4 = UnetResBlock(3, 4 * feature_size, 4 * feature_size, 3, 1, norm_name)
        self.encoder10 = UnetResBlock(3, 16 * feature_size, 16 * feature_size, 3, 1, norm_name)
        self.decoder5 = UnetUpBlock(3, 16 * feature_size, 8 * feature_size, 3, 2, norm_name, res_block=True)
        self.decoder4 = UnetUpBlock(3, feature_size * 8, feature_size * 4, 3, 2, norm_name, res_block=True)
        self.decoder3 = UnetUpBlock(3, feature_size * 4, feature_size * 2, 3, 2, norm_name, res_block=True)
        self.decoder2 = UnetUpBlock(3, feature_size * 2, feature_size, 3, 2, norm_name, res_block=True)
        self.decoder1 = UnetUpBlock(3, feature_size, feature_size, 3, 2, norm_name, res_block=True)
        self.out = UnetOutBlock(3, feature_size, out_channels)

    def forward(self, x_in):
        hidden_states_out = self.swinViT(x_in, self.normalize)
        enc0 = self.encoder1(x_in)
        enc1 = self.encoder2(hidden_states_out[0])
        enc2 = self.encoder3(hidden_states_out[1])
        enc3 = self.encoder4(hidden_states_out[2])
        dec4 = self.encoder10(hidden_states_out[4])
        dec3 = self.decoder5(dec4, hidden_states_out[3])
        dec2 = self.decoder4(dec3, enc3)
        dec1 = self.decoder3(dec2, enc2)
        dec0 = self.decoder2(dec1, enc1)
        out = self.decoder1(dec0, enc0)
        return self.out(out)


# ----- the workaround for the mask made in forward: built in __init__ for the resolution trained at ------------
class BasicLayerFixedMask(BasicLayer):
    """``BasicLayer`` whose shifted-window mask is a buffer made in ``__init__`` for ``input_resolution``
    (README's Limits: a constant made in ``forward`` that follows the input is refused; a buffer is an input)."""

    def __init__(self, *args, input_resolution, **kwargs):
        super().__init__(*args, **kwargs)
        window_size, shift_size = get_window_size(input_resolution, self.window_size, self.shift_size)
        dims = [int(np.ceil(n / w)) * w for n, w in zip(input_resolution, window_size)]
        self.register_buffer("attn_mask", compute_mask(dims, window_size, shift_size, None), persistent=False)

    def forward(self, x):
        b, c, d, h, w = x.size()
        x = rearrange(x, "b c d h w -> b d h w c")
        for blk in self.blocks:
            x = blk(x, self.attn_mask)
        x = x.view(b, d, h, w, -1)
        x = self.downsample(x)
        return rearrange(x, "b d h w c -> b c d h w")


class SwinUNETRStage(nn.Module):
    """SwinUNETR's first stage at one resolution: the patch embedding, a plain and a shifted 3D window block
    (relative position bias, ``torch.roll`` over three dims), patch merging by strided slices, the hidden state
    layer-normed through einops, and the UNETR encoder block (instance norm) that reads it."""

    def __init__(self, in_channels=1, feature_size=12, num_heads=3, window_size=4, img_size=(16, 16, 16)):
        super().__init__()
        self.patch_embed = PatchEmbed(2, in_channels, feature_size)
        self.layers1 = nn.ModuleList(
            [
                BasicLayerFixedMask(
                    feature_size,
                    2,
                    num_heads,
                    (window_size,) * 3,
                    qkv_bias=True,
                    downsample=PatchMerging,
                    input_resolution=tuple(s // 2 for s in img_size),
                )
            ]
        )
        self.encoder3 = UnetResBlock(3, 2 * feature_size, 2 * feature_size, 3, 1, "instance")

    def forward(self, x_in):
        x0 = self.patch_embed(x_in)
        x1 = self.layers1[0](x0.contiguous())
        n, ch, d, h, w = x1.size()
        x1_out = rearrange(F.layer_norm(rearrange(x1, "n c d h w -> n d h w c"), [ch]), "n d h w c -> n c d h w")
        return self.encoder3(x1_out)


class SwinUNETRFixedMasks(SwinUNETR):
    """The whole SwinUNETR with the workaround: each stage's mask a buffer made in ``__init__`` for ``img_size``."""

    def __init__(self, img_size=(32, 32, 64), **kwargs):
        super().__init__(**kwargs)
        for i_layer in range(4):
            layer = getattr(self.swinViT, f"layers{i_layer + 1}")[0]
            fixed = BasicLayerFixedMask(
                layer.blocks[0].dim,
                layer.depth,
                layer.blocks[0].num_heads,
                layer.window_size,
                qkv_bias=True,
                downsample=PatchMerging,
                input_resolution=tuple(s // 2 ** (i_layer + 1) for s in img_size),
            )
            fixed.load_state_dict(layer.state_dict(), strict=False)
            getattr(self.swinViT, f"layers{i_layer + 1}")[0] = fixed
