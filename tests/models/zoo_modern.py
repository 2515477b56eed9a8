"""Upstream-style blocks of the networks people train now, written the way their authors write them:
a Swin-style window attention with its relative position bias table and roll-shifted windows (and
SwinV2's clamped logit scale), a ConvNeXtV2 block with global response normalisation, a diffusers-style
``Timesteps`` + ``TimestepEmbedding`` + ``ResnetBlock2D``, MONAI-style ``UnetBasicBlock`` / ``UnetResBlock``
in 3D with instance norm and LeakyReLU, and a small 3D U-Net with instance norm and trilinear
upsampling. The code is ours; the architectures' facts are public.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----- Swin: windows, relative position bias, shifted windows -----------------------------------------
def window_partition(x, window_size: int):
    B, H, W, C = x.shape
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C)


def window_reverse(windows, window_size: int, H: int, W: int):
    C = windows.shape[-1]
    x = windows.view(-1, H // window_size, W // window_size, window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, H, W, C)


class WindowAttention(nn.Module):
    """Window self-attention with a learned relative position bias, indexed by a constant int64 buffer;
    ``cosine``: SwinV2's scaled cosine attention with a clamped logit scale."""

    def __init__(self, dim, window_size, num_heads, cosine=False):
        super().__init__()
        self.dim, self.window_size, self.num_heads, self.cosine = dim, window_size, num_heads, cosine
        head_dim = dim // num_heads
        self.scale = head_dim**-0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window_size), torch.arange(window_size), indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)
        relative_coords = (coords_flatten[:, :, None] - coords_flatten[:, None, :]).permute(1, 2, 0).contiguous()
        relative_coords[:, :, 0] += window_size - 1
        relative_coords[:, :, 1] += window_size - 1
        relative_coords[:, :, 0] *= 2 * window_size - 1
        self.register_buffer("relative_position_index", relative_coords.sum(-1), persistent=False)
        if cosine:
            self.logit_scale = nn.Parameter(torch.log(10 * torch.ones((num_heads, 1, 1))))
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.cosine:
            attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
            logit_scale = torch.clamp(self.logit_scale, max=math.log(1.0 / 0.01)).exp()
            attn = attn * logit_scale
        else:
            q = q * self.scale
            attn = q @ k.transpose(-2, -1)
        relative_position_bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(
            self.window_size * self.window_size, self.window_size * self.window_size, -1
        )
        relative_position_bias = relative_position_bias.permute(2, 0, 1).contiguous()
        attn = attn + relative_position_bias.unsqueeze(0)
        if mask is not None:
            num_win = mask.shape[0]
            attn = attn.view(-1, num_win, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B_, N, -1)
        return self.proj(x)


class SwinBlock(nn.Module):
    """A Swin block at a fixed resolution (as Swin builds its attention masks for its input size), its
    windows shifted by ``shift_size`` with ``torch.roll`` and masked where they wrap around."""

    def __init__(self, dim=8, input_resolution=(8, 8), num_heads=2, window_size=4, shift_size=2, cosine=False):
        super().__init__()
        self.input_resolution, self.window_size, self.shift_size = input_resolution, window_size, shift_size
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window_size, num_heads, cosine=cosine)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        if shift_size > 0:
            H, W = input_resolution
            img_mask = torch.zeros((1, H, W, 1))
            cnt = 0
            for h in (slice(0, -window_size), slice(-window_size, -shift_size), slice(-shift_size, None)):
                for w in (slice(0, -window_size), slice(-window_size, -shift_size), slice(-shift_size, None)):
                    img_mask[:, h, w, :] = cnt
                    cnt += 1
            mask_windows = window_partition(img_mask, window_size).view(-1, window_size * window_size)
            attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))
        else:
            attn_mask = None
        self.register_buffer("attn_mask", attn_mask, persistent=False)

    def forward(self, x):
        H, W = self.input_resolution
        B, L, C = x.shape
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if self.shift_size > 0:
            x = torch.roll(x, shifts=(-self.shift_size, -self.shift_size), dims=(1, 2))
        x_windows = window_partition(x, self.window_size).view(-1, self.window_size * self.window_size, C)
        attn_windows = self.attn(x_windows, mask=self.attn_mask)
        attn_windows = attn_windows.view(-1, self.window_size, self.window_size, C)
        x = window_reverse(attn_windows, self.window_size, H, W)
        if self.shift_size > 0:
            x = torch.roll(x, shifts=(self.shift_size, self.shift_size), dims=(1, 2))
        x = shortcut + x.view(B, H * W, C)
        return x + self.mlp(self.norm2(x))


class SwinStage(nn.Module):
    """Patch embedding, a regular and a shifted block, a pooled head."""

    def __init__(self, cosine=False, num_classes=5):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, 8, kernel_size=2, stride=2)
        self.blocks = nn.Sequential(SwinBlock(shift_size=0, cosine=cosine), SwinBlock(shift_size=2, cosine=cosine))
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))


# ----- ConvNeXtV2: global response normalisation --------------------------------------------------------
class GRN(nn.Module):
    """Global response normalisation over channels-last maps."""

    def __init__(self, dim):
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, 1, dim))

    def forward(self, x):
        Gx = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
        Nx = Gx / (Gx.mean(dim=-1, keepdim=True) + 1e-6)
        return self.gamma * (x * Nx) + self.beta + x


class ConvNeXtV2Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.grn = GRN(4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        shortcut = x
        x = self.dwconv(x)
        x = x.permute(0, 2, 3, 1)
        x = self.norm(x)
        x = self.pwconv1(x)
        x = self.act(x)
        x = self.grn(x)
        x = self.pwconv2(x)
        x = x.permute(0, 3, 1, 2)
        return shortcut + x


class ConvNeXtV2(nn.Module):
    def __init__(self, dim=8, num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dim, kernel_size=4, stride=4))
        self.stages = nn.Sequential(ConvNeXtV2Block(dim), ConvNeXtV2Block(dim))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.head(self.norm(x.mean([-2, -1])))


# ----- diffusers: sinusoidal timesteps, their MLP, a ResNet block the embedding is added to ---------------
def get_timestep_embedding(
    timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=1.0, scale=1.0, max_period=10000
):
    half_dim = embedding_dim // 2
    exponent = -math.log(max_period) * torch.arange(start=0, end=half_dim, dtype=torch.float32, device=timesteps.device)
    exponent = exponent / (half_dim - downscale_freq_shift)
    emb = torch.exp(exponent).to(timesteps.dtype)
    emb = timesteps[:, None] * emb[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half_dim:], emb[:, :half_dim]], dim=-1)
    if embedding_dim % 2 == 1:
        emb = F.pad(emb, (0, 1, 0, 0))
    return emb


class Timesteps(nn.Module):
    def __init__(self, num_channels, flip_sin_to_cos, downscale_freq_shift):
        super().__init__()
        self.num_channels, self.flip_sin_to_cos, self.downscale_freq_shift = (
            num_channels,
            flip_sin_to_cos,
            downscale_freq_shift,
        )

    def forward(self, timesteps):
        return get_timestep_embedding(
            timesteps,
            self.num_channels,
            flip_sin_to_cos=self.flip_sin_to_cos,
            downscale_freq_shift=self.downscale_freq_shift,
        )


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels, time_embed_dim):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, sample):
        return self.linear_2(self.act(self.linear_1(sample)))


class ResnetBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, temb_channels, groups=4, eps=1e-6, output_scale_factor=1.0):
        super().__init__()
        self.norm1 = nn.GroupNorm(num_groups=groups, num_channels=in_channels, eps=eps, affine=True)
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.time_emb_proj = nn.Linear(temb_channels, out_channels)
        self.norm2 = nn.GroupNorm(num_groups=groups, num_channels=out_channels, eps=eps, affine=True)
        self.dropout = nn.Dropout(0.0)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.nonlinearity = nn.SiLU()
        self.output_scale_factor = output_scale_factor
        self.conv_shortcut = (
            nn.Conv2d(in_channels, out_channels, kernel_size=1) if in_channels != out_channels else None
        )

    def forward(self, input_tensor, temb):
        hidden_states = input_tensor
        hidden_states = self.norm1(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = self.conv1(hidden_states)
        temb = self.nonlinearity(temb)
        temb = self.time_emb_proj(temb)[:, :, None, None]
        hidden_states = hidden_states + temb
        hidden_states = self.norm2(hidden_states)
        hidden_states = self.nonlinearity(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.conv2(hidden_states)
        if self.conv_shortcut is not None:
            input_tensor = self.conv_shortcut(input_tensor)
        return (input_tensor + hidden_states) / self.output_scale_factor


class TinyDiffusionUNet(nn.Module):
    """Timestep embedding into two ResNet blocks around a downsampling, GroupNorm(1, C) at the output."""

    def __init__(self, channels=8):
        super().__init__()
        self.time_proj = Timesteps(channels, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.time_embedding = TimestepEmbedding(channels, 4 * channels)
        self.conv_in = nn.Conv2d(3, channels, kernel_size=3, padding=1)
        self.down = ResnetBlock2D(channels, 2 * channels, 4 * channels)
        self.downsample = nn.Conv2d(2 * channels, 2 * channels, 3, stride=2, padding=1)
        self.up = ResnetBlock2D(2 * channels, channels, 4 * channels)
        self.conv_norm_out = nn.GroupNorm(1, channels)
        self.conv_act = nn.SiLU()
        self.conv_out = nn.Conv2d(channels, 3, kernel_size=3, padding=1)
        self.identity = nn.Identity()

    def forward(self, sample, timestep):
        emb = self.time_embedding(self.time_proj(timestep))
        sample = self.conv_in(sample)
        sample = self.downsample(self.down(sample, emb))
        sample = F.interpolate(sample, scale_factor=2.0, mode="nearest")
        sample = self.identity(self.up(sample, emb))
        return self.conv_out(self.conv_act(self.conv_norm_out(sample)))


# ----- MONAI: UnetBasicBlock, UnetResBlock, a small 3D U-Net ------------------------------------------------
def get_conv_layer(in_channels, out_channels, kernel_size=3, stride=1, spatial_dims=3, transposed=False):
    padding = kernel_size // 2
    conv = {(3, False): nn.Conv3d, (3, True): nn.ConvTranspose3d, (2, False): nn.Conv2d, (2, True): nn.ConvTranspose2d}
    if transposed:
        return conv[spatial_dims, True](
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=padding,
            output_padding=stride - 1,
            bias=False,
        )
    return conv[spatial_dims, False](in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False)


class UnetBasicBlock(nn.Module):
    def __init__(self, spatial_dims, in_channels, out_channels, kernel_size, stride, norm_name="instance"):
        super().__init__()
        norm = nn.InstanceNorm3d if spatial_dims == 3 else nn.InstanceNorm2d
        self.conv1 = get_conv_layer(in_channels, out_channels, kernel_size, stride, spatial_dims)
        self.conv2 = get_conv_layer(out_channels, out_channels, kernel_size, 1, spatial_dims)
        self.lrelu = nn.LeakyReLU(negative_slope=0.01, inplace=True)
        self.norm1 = norm(out_channels, affine=True)
        self.norm2 = norm(out_channels, affine=True)

    def forward(self, inp):
        out = self.lrelu(self.norm1(self.conv1(inp)))
        return self.lrelu(self.norm2(self.conv2(out)))


class UnetResBlock(nn.Module):
    def __init__(self, spatial_dims, in_channels, out_channels, kernel_size, stride, track_running_stats=False):
        super().__init__()
        norm = nn.InstanceNorm3d if spatial_dims == 3 else nn.InstanceNorm2d
        self.conv1 = get_conv_layer(in_channels, out_channels, kernel_size, stride, spatial_dims)
        self.conv2 = get_conv_layer(out_channels, out_channels, kernel_size, 1, spatial_dims)
        self.lrelu = nn.LeakyReLU(negative_slope=0.01, inplace=True)
        self.norm1 = norm(out_channels, track_running_stats=track_running_stats)
        self.norm2 = norm(out_channels, track_running_stats=track_running_stats)
        self.downsample = in_channels != out_channels or stride != 1
        if self.downsample:
            self.conv3 = get_conv_layer(in_channels, out_channels, 1, stride, spatial_dims)
            self.norm3 = norm(out_channels, track_running_stats=track_running_stats)

    def forward(self, inp):
        residual = inp
        out = self.lrelu(self.norm1(self.conv1(inp)))
        out = self.norm2(self.conv2(out))
        if self.downsample:
            residual = self.norm3(self.conv3(residual))
        out += residual
        return self.lrelu(out)


class MonaiBlocks3D(nn.Module):
    """A UnetBasicBlock then a strided UnetResBlock (instance norm with running statistics), in 3D."""

    def __init__(self):
        super().__init__()
        self.basic = UnetBasicBlock(3, 1, 4, kernel_size=3, stride=1)
        self.res = UnetResBlock(3, 4, 8, kernel_size=3, stride=2, track_running_stats=True)
        self.out = nn.Conv3d(8, 2, kernel_size=1)

    def forward(self, x):
        return self.out(self.res(self.basic(x)))


class UNet3D(nn.Module):
    """Two levels: instance-normed double convs, 3D max pooling, trilinear upsampling, skip cat, a
    transposed-conv path, BatchNorm3d, PReLU and GroupNorm in 3D, a 3D average pool on the input."""

    def __init__(self, in_channels=1, out_channels=2, features=4):
        super().__init__()
        f = features
        self.enc1 = UnetBasicBlock(3, in_channels, f, 3, 1)
        self.pool = nn.MaxPool3d(2)
        self.enc2 = nn.Sequential(
            nn.Conv3d(f, 2 * f, 3, padding=1),
            nn.BatchNorm3d(2 * f),
            nn.PReLU(),
            nn.Conv3d(2 * f, 2 * f, 3, padding=1),
            nn.GroupNorm(2, 2 * f),
            nn.ReLU(),
        )
        self.up_transposed = get_conv_layer(2 * f, f, 3, 2, 3, transposed=True)
        self.dec1 = UnetBasicBlock(3, 4 * f, f, 3, 1)
        self.head = nn.Conv3d(f, out_channels, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        up = F.interpolate(e2, scale_factor=2, mode="trilinear", align_corners=False)
        d1 = self.dec1(torch.cat([e1, up, self.up_transposed(e2)], dim=1))
        return self.head(d1) + F.avg_pool3d(x, 3, stride=1, padding=1)
