"""timm's remaining convolutional families and conv-attention hybrids, written the way their authors write
them, at tiny sizes: EdgeNeXt (Fourier position encoding made in ``forward``, cross-covariance attention,
``torch.split`` with a list), PoolFormer, ConvMixer, a FastViT/RepViT-style reparameterizable block with long
attribute names, TResNet (space-to-depth from ``x.size()``, a blur-filter buffer, leaky ReLU), ECA-ResNet
(and CBAM's ``amax`` descriptors) and BoTNet (relative logits by the pad/reshape trick). The code is ours; the
architectures' facts are public.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.models.zoo_hybrid import LayerNorm2d, SqueezeExcite


# ----- EdgeNeXt: Fourier position encoding, split-transpose block, cross-covariance attention ---------------
class PositionalEncodingFourier(nn.Module):
    def __init__(self, hidden_dim=8, dim=8, temperature=10000):
        super().__init__()
        self.token_projection = nn.Conv2d(hidden_dim * 2, dim, kernel_size=1)
        self.scale = 2 * math.pi
        self.temperature = temperature
        self.hidden_dim = hidden_dim

    def fourier_features(self, shape):
        device = self.token_projection.weight.device
        inv_mask = ~torch.zeros(shape).to(device=device, dtype=torch.bool)
        y_embed = inv_mask.cumsum(1, dtype=torch.float32)
        x_embed = inv_mask.cumsum(2, dtype=torch.float32)
        eps = 1e-6
        y_embed = y_embed / (y_embed[:, -1:, :] + eps) * self.scale
        x_embed = x_embed / (x_embed[:, :, -1:] + eps) * self.scale
        dim_t = torch.arange(self.hidden_dim, dtype=torch.int64, device=device).to(torch.float32)
        dim_t = self.temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / self.hidden_dim)
        pos_x = x_embed[:, :, :, None] / dim_t
        pos_y = y_embed[:, :, :, None] / dim_t
        pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).flatten(3)
        pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).flatten(3)
        return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)

    def forward(self, shape):
        pos = self.fourier_features(shape)
        return self.token_projection(pos.to(self.token_projection.weight.dtype))


class CrossCovarianceAttn(nn.Module):
    def __init__(self, dim, num_heads=2):
        super().__init__()
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 4, 1)
        q, k, v = qkv.unbind(0)
        attn = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)) * self.temperature
        attn = attn.softmax(dim=-1)
        x = (attn @ v).permute(0, 3, 1, 2).reshape(B, N, C)
        return self.proj(x)


class SplitTransposeBlock(nn.Module):
    def __init__(self, dim=10, num_scales=2, num_heads=2, use_pos_emb=True):
        super().__init__()
        width = max(int(math.ceil(dim / num_scales)), int(math.floor(dim // num_scales)))
        self.width = width
        self.splits = [width] * (num_scales - 1) + [dim - width * (num_scales - 1)]
        self.convs = nn.ModuleList([nn.Conv2d(width, width, 3, padding=1, groups=width) for _ in range(num_scales - 1)])
        self.pos_embd = PositionalEncodingFourier(dim=dim) if use_pos_emb else None
        self.norm_xca = nn.LayerNorm(dim)
        self.gamma_xca = nn.Parameter(0.5 * torch.ones(dim))
        self.xca = CrossCovarianceAttn(dim, num_heads=num_heads)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.gamma = nn.Parameter(0.5 * torch.ones(dim))

    def forward(self, x):
        shortcut = x
        spx = torch.split(x, self.splits, dim=1)
        spo = []
        sp = spx[0]
        for i, conv in enumerate(self.convs):
            if i > 0:
                sp = sp + spx[i]
            sp = conv(sp)
            spo.append(sp)
        spo.append(spx[-1])
        x = torch.cat(spo, 1)
        B, C, H, W = x.shape
        x = x.reshape(B, C, H * W).permute(0, 2, 1)
        if self.pos_embd is not None:
            pos_encoding = self.pos_embd((B, H, W)).reshape(B, -1, x.shape[1]).permute(0, 2, 1)
            x = x + pos_encoding
        x = x + self.gamma_xca * self.xca(self.norm_xca(x))
        x = x.reshape(B, H, W, C)
        x = self.mlp(self.norm(x))
        x = self.gamma * x
        x = x.permute(0, 3, 1, 2)
        return shortcut + x


class EdgeNeXt(nn.Module):
    def __init__(self, dim=10, num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dim, kernel_size=2, stride=2), LayerNorm2d(dim, eps=1e-6))
        self.stages = nn.Sequential(SplitTransposeBlock(dim, num_scales=3))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.head(self.norm(x.mean((2, 3))))


# ----- PoolFormer: GroupNorm(1, C), pool(x) - x, layer scales ----------------------------------------------
class Pooling(nn.Module):
    def __init__(self, pool_size=3):
        super().__init__()
        self.pool = nn.AvgPool2d(pool_size, stride=1, padding=pool_size // 2, count_include_pad=False)

    def forward(self, x):
        return self.pool(x) - x


class PoolFormerBlock(nn.Module):
    def __init__(self, dim, layer_scale_init_value=1e-1):
        super().__init__()
        self.norm1 = nn.GroupNorm(1, dim)
        self.token_mixer = Pooling()
        self.norm2 = nn.GroupNorm(1, dim)
        self.mlp = nn.Sequential(nn.Conv2d(dim, 2 * dim, 1), nn.GELU(), nn.Conv2d(2 * dim, dim, 1))
        self.layer_scale_1 = nn.Parameter(layer_scale_init_value * torch.ones(dim), requires_grad=True)
        self.layer_scale_2 = nn.Parameter(layer_scale_init_value * torch.ones(dim), requires_grad=True)

    def forward(self, x):
        x = x + self.layer_scale_1.unsqueeze(-1).unsqueeze(-1) * self.token_mixer(self.norm1(x))
        return x + self.layer_scale_2.unsqueeze(-1).unsqueeze(-1) * self.mlp(self.norm2(x))


class PoolFormer(nn.Module):
    def __init__(self, dim=8, num_classes=5):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, kernel_size=3, stride=2, padding=1)
        self.network = nn.Sequential(PoolFormerBlock(dim), PoolFormerBlock(dim))
        self.norm = nn.GroupNorm(1, dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.norm(self.network(self.patch_embed(x)))
        return self.head(x.mean([-2, -1]))


# ----- ConvMixer ----------------------------------------------------------------------------------------
class Residual(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x) + x


def ConvMixer(dim=8, depth=2, kernel_size=3, patch_size=2, n_classes=5):
    return nn.Sequential(
        nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size),
        nn.GELU(),
        nn.BatchNorm2d(dim),
        *[
            nn.Sequential(
                Residual(
                    nn.Sequential(
                        nn.Conv2d(dim, dim, kernel_size, groups=dim, padding="same"), nn.GELU(), nn.BatchNorm2d(dim)
                    )
                ),
                nn.Conv2d(dim, dim, kernel_size=1),
                nn.GELU(),
                nn.BatchNorm2d(dim),
            )
            for _ in range(depth)
        ],
        nn.AdaptiveAvgPool2d((1, 1)),
        nn.Flatten(),
        nn.Linear(dim, n_classes),
    )


# ----- FastViT / RepViT: reparameterizable branches, long attribute names ------------------------------------
class ConvBatchNormBranch(nn.Sequential):
    def __init__(self, in_chs, out_chs, kernel_size, groups):
        super().__init__()
        self.add_module(
            "conv", nn.Conv2d(in_chs, out_chs, kernel_size, padding=kernel_size // 2, groups=groups, bias=False)
        )
        self.add_module("bn", nn.BatchNorm2d(out_chs))


class MobileOneBlock(nn.Module):
    """Training-time form: an identity BatchNorm, ``num_conv_branches`` kxk conv + BN branches and a 1x1 scale
    branch, summed, then GELU (what ``reparameterize()`` folds into one conv for inference)."""

    def __init__(self, dim, kernel_size=3, num_conv_branches=2):
        super().__init__()
        self.reparameterizable_identity_batch_norm_skip_branch = nn.BatchNorm2d(dim)
        self.reparameterizable_convolution_branches = nn.ModuleList(
            [ConvBatchNormBranch(dim, dim, kernel_size, dim) for _ in range(num_conv_branches)]
        )
        self.reparameterizable_scale_branch_depthwise_one_by_one_convolution = ConvBatchNormBranch(dim, dim, 1, dim)
        self.act = nn.GELU()

    def forward(self, x):
        out = self.reparameterizable_identity_batch_norm_skip_branch(x)
        out = out + self.reparameterizable_scale_branch_depthwise_one_by_one_convolution(x)
        for branch in self.reparameterizable_convolution_branches:
            out = out + branch(x)
        return self.act(out)


class RepMixerSqueezeExciteTokenMixerWithLayerScaleAndChannelMlpBlock(nn.Module):
    """RepViT-style: a token mixer (a MobileOne block), an SE, a 1x1 channel MLP with a layer scale; a 63-character
    attribute for a conv called twice (the shared-weight refinement some RepViT variants run)."""

    def __init__(self, dim):
        super().__init__()
        self.token_mixer_reparameterizable_mobile_one_block = MobileOneBlock(dim)
        self.squeeze_excite = SqueezeExcite(dim, max(1, dim // 4), act_layer=nn.ReLU)
        self.depthwise_refinement_convolution_with_shared_weights_runs_twice = nn.Conv2d(
            dim, dim, 3, padding=1, groups=dim
        )
        self.channel_mixer = nn.Sequential(nn.Conv2d(dim, 2 * dim, 1), nn.GELU(), nn.Conv2d(2 * dim, dim, 1))
        self.layer_scale_for_the_channel_mixer_branch = nn.Parameter(1e-1 * torch.ones(dim, 1, 1))

    def forward(self, x):
        x = self.squeeze_excite(self.token_mixer_reparameterizable_mobile_one_block(x))
        refine = self.depthwise_refinement_convolution_with_shared_weights_runs_twice
        x = refine(F.gelu(refine(x)))
        return x + self.layer_scale_for_the_channel_mixer_branch * self.channel_mixer(x)


class FastRepNet(nn.Module):
    def __init__(self, dim=8, num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dim, 3, stride=2, padding=1), nn.BatchNorm2d(dim), nn.GELU())
        self.stages = nn.Sequential(
            nn.Sequential(
                RepMixerSqueezeExciteTokenMixerWithLayerScaleAndChannelMlpBlock(dim),
                RepMixerSqueezeExciteTokenMixerWithLayerScaleAndChannelMlpBlock(dim),
            )
        )
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


# ----- TResNet: space-to-depth, anti-aliased downsampling with a fixed blur filter, leaky ReLU ---------------
class SpaceToDepth(nn.Module):
    def __init__(self, block_size=4):
        super().__init__()
        self.bs = block_size

    def forward(self, x):
        N, C, H, W = x.size()
        x = x.view(N, C, H // self.bs, self.bs, W // self.bs, self.bs)
        x = x.permute(0, 3, 5, 1, 2, 4).contiguous()
        return x.view(N, C * self.bs * self.bs, H // self.bs, W // self.bs)


class AntiAliasDownsampleLayer(nn.Module):
    def __init__(self, channels, filt_size=3, stride=2):
        super().__init__()
        self.stride = stride
        a = torch.tensor([1.0, 2.0, 1.0])
        filt = a[:, None] * a[None, :]
        filt = filt / torch.sum(filt)
        self.register_buffer("filt", filt[None, None, :, :].repeat((channels, 1, 1, 1)), persistent=False)

    def forward(self, x):
        input_pad = F.pad(x, (1, 1, 1, 1), "reflect")
        return F.conv2d(input_pad, self.filt, stride=self.stride, padding=0, groups=x.shape[1])


def conv2d_iabn(ni, nf, stride, kernel_size=3, groups=1):
    return nn.Sequential(
        nn.Conv2d(ni, nf, kernel_size=kernel_size, stride=stride, padding=kernel_size // 2, groups=groups, bias=False),
        nn.BatchNorm2d(nf),
        nn.LeakyReLU(negative_slope=1e-3, inplace=True),
    )


class TResNetBasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        if stride == 1:
            self.conv1 = conv2d_iabn(inplanes, planes, stride=1)
        else:
            self.conv1 = nn.Sequential(conv2d_iabn(inplanes, planes, stride=1), AntiAliasDownsampleLayer(planes))
        self.conv2 = nn.Sequential(nn.Conv2d(planes, planes, 3, padding=1, bias=False), nn.BatchNorm2d(planes))
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.se = SqueezeExcite(planes, max(planes // 4, 4), act_layer=nn.ReLU)

    def forward(self, x):
        shortcut = self.downsample(x) if self.downsample is not None else x
        out = self.conv1(x)
        out = self.conv2(out)
        out = self.se(out)
        out += shortcut
        return self.relu(out)


class TResNet(nn.Module):
    def __init__(self, width=8, num_classes=5):
        super().__init__()
        self.body = nn.Sequential(
            SpaceToDepth(block_size=2),
            conv2d_iabn(3 * 4, width, stride=1, kernel_size=3),
            TResNetBasicBlock(width, width),
            TResNetBasicBlock(
                width,
                2 * width,
                stride=2,
                downsample=nn.Sequential(
                    nn.AvgPool2d(kernel_size=2, stride=2, ceil_mode=True, count_include_pad=False),
                    nn.Conv2d(width, 2 * width, 1, bias=False),
                    nn.BatchNorm2d(2 * width),
                ),
            ),
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        return self.head(self.body(x).mean((2, 3)))


# ----- ECA-ResNet: efficient channel attention through a Conv1d over channels ------------------------------------
class EcaModule(nn.Module):
    def __init__(self, channels, gamma=2, beta=1):
        super().__init__()
        t = int(abs(math.log(channels, 2) + beta) / gamma)
        kernel_size = max(t if t % 2 else t + 1, 3)
        self.conv = nn.Conv1d(1, 1, kernel_size=kernel_size, padding=(kernel_size - 1) // 2, bias=False)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        y = x.mean((2, 3)).view(x.shape[0], 1, -1)
        y = self.conv(y)
        y = self.gate(y).view(x.shape[0], -1, 1, 1)
        return x * y.expand_as(x)


class ChannelAttn(nn.Module):
    """CBAM's channel attention: one MLP of 1x1 convs over the average- and the max-pooled descriptors."""

    def __init__(self, channels, rd_ratio=1.0 / 4, act_layer=nn.ReLU, mlp_bias=False):
        super().__init__()
        rd_channels = max(1, int(channels * rd_ratio))
        self.fc1 = nn.Conv2d(channels, rd_channels, 1, bias=mlp_bias)
        self.act = act_layer(inplace=True)
        self.fc2 = nn.Conv2d(rd_channels, channels, 1, bias=mlp_bias)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        x_avg = self.fc2(self.act(self.fc1(x.mean((2, 3), keepdim=True))))
        x_max = self.fc2(self.act(self.fc1(x.amax((2, 3), keepdim=True))))
        return x * self.gate(x_avg + x_max)


class SpatialAttn(nn.Module):
    def __init__(self, kernel_size=7):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(2, 1, kernel_size, padding=kernel_size // 2, bias=False), nn.BatchNorm2d(1))
        self.gate = nn.Sigmoid()

    def forward(self, x):
        x_attn = torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1)
        x_attn = self.conv(x_attn)
        return x * self.gate(x_attn)


class CbamModule(nn.Module):
    def __init__(self, channels, spatial_kernel_size=7):
        super().__init__()
        self.channel = ChannelAttn(channels)
        self.spatial = SpatialAttn(spatial_kernel_size)

    def forward(self, x):
        x = self.channel(x)
        return self.spatial(x)


class EcaBottleneck(nn.Module):
    expansion = 2

    def __init__(self, inplanes, planes, stride=1, downsample=None, attn_layer=EcaModule):
        super().__init__()
        width = planes
        outplanes = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, width, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(width, width, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.act2 = nn.ReLU(inplace=True)
        self.conv3 = nn.Conv2d(width, outplanes, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(outplanes)
        self.se = attn_layer(outplanes)
        self.act3 = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        shortcut = x
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.act2(self.bn2(self.conv2(x)))
        x = self.bn3(self.conv3(x))
        x = self.se(x)
        if self.downsample is not None:
            shortcut = self.downsample(shortcut)
        x += shortcut
        return self.act3(x)


def adaptive_catavgmax_pool2d(x, output_size=1):
    x_avg = F.adaptive_avg_pool2d(x, output_size)
    x_max = F.adaptive_max_pool2d(x, output_size)
    return torch.cat((x_avg, x_max), 1)


class SelectAdaptivePool2d(nn.Module):
    """timm's head pooling: ``avg``, or ``catavgmax`` (average and max pooled features side by side)."""

    def __init__(self, pool_type="avg", flatten=True):
        super().__init__()
        self.pool_type = pool_type
        self.pool = nn.AdaptiveAvgPool2d(1) if pool_type == "avg" else None
        self.flatten = nn.Flatten(1) if flatten else nn.Identity()

    def forward(self, x):
        x = self.pool(x) if self.pool is not None else adaptive_catavgmax_pool2d(x, 1)
        return self.flatten(x)

    def feat_mult(self):
        return 2 if self.pool_type == "catavgmax" else 1


class EcaResNet(nn.Module):
    """ECA bottlenecks (``attn_layer="cbam"``: CBAM's, as timm's ``cbam_resnet``-style models), timm's head
    pooling (``global_pool="catavgmax"``: average and max)."""

    def __init__(self, width=8, num_classes=5, attn_layer="eca", global_pool="avg"):
        super().__init__()
        attn_layer = {"eca": EcaModule, "cbam": CbamModule}[attn_layer]
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.act1 = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = nn.Sequential(
            EcaBottleneck(
                width,
                width,
                downsample=nn.Sequential(nn.Conv2d(width, 2 * width, 1, bias=False), nn.BatchNorm2d(2 * width)),
                attn_layer=attn_layer,
            ),
            EcaBottleneck(2 * width, width, attn_layer=attn_layer),
        )
        self.global_pool = SelectAdaptivePool2d(global_pool)
        self.fc = nn.Linear(2 * width * self.global_pool.feat_mult(), num_classes)

    def forward(self, x):
        x = self.maxpool(self.act1(self.bn1(self.conv1(x))))
        return self.fc(self.global_pool(self.layer1(x)))


# ----- BoTNet: bottleneck attention with relative position logits (the pad/reshape trick) -------------------------
def rel_logits_1d(q, rel_k, permute_mask: list[int]):
    B, H, W, dim = q.shape
    x = q @ rel_k.transpose(-1, -2)
    x = x.reshape(-1, W, 2 * W - 1)
    # pad to shift from relative to absolute indexing
    x_pad = F.pad(x, [0, 1]).flatten(1)
    x_pad = F.pad(x_pad, [0, W - 1])
    # reshape and slice out the padded elements
    x_pad = x_pad.reshape(-1, W + 1, 2 * W - 1)
    x = x_pad[:, :W, W - 1 :]
    # reshape and tile
    x = x.reshape(B, H, 1, W, W).expand(-1, -1, H, -1, -1)
    return x.permute(permute_mask)


class PosEmbedRel(nn.Module):
    def __init__(self, feat_size, dim_head, scale):
        super().__init__()
        self.height, self.width = feat_size
        self.dim_head = dim_head
        self.height_rel = nn.Parameter(torch.randn(self.height * 2 - 1, dim_head) * scale)
        self.width_rel = nn.Parameter(torch.randn(self.width * 2 - 1, dim_head) * scale)

    def forward(self, q):
        B, HW, _ = q.shape
        q = q.reshape(B, self.height, self.width, -1)
        rel_logits_w = rel_logits_1d(q, self.width_rel, permute_mask=(0, 1, 3, 2, 4))
        q = q.transpose(1, 2)
        rel_logits_h = rel_logits_1d(q, self.height_rel, permute_mask=(0, 3, 1, 4, 2))
        rel_logits = rel_logits_h + rel_logits_w
        return rel_logits.reshape(B, HW, HW)


class BottleneckAttn(nn.Module):
    def __init__(self, dim, feat_size, num_heads=2, dim_head=4, stride=1):
        super().__init__()
        self.num_heads = num_heads
        self.dim_head_qk = dim_head
        self.dim_head_v = dim // num_heads
        self.dim_out_qk = num_heads * self.dim_head_qk
        self.dim_out_v = num_heads * self.dim_head_v
        self.scale = self.dim_head_qk**-0.5
        self.qkv = nn.Conv2d(dim, self.dim_out_qk * 2 + self.dim_out_v, 1, bias=False)
        self.pos_embed = PosEmbedRel(feat_size, dim_head=self.dim_head_qk, scale=self.scale)
        self.pool = nn.AvgPool2d(2, 2) if stride == 2 else nn.Identity()

    def forward(self, x):
        B, C, H, W = x.shape
        x = self.qkv(x)
        q, k, v = torch.split(x, [self.dim_out_qk, self.dim_out_qk, self.dim_out_v], dim=1)
        q = q.reshape(B * self.num_heads, self.dim_head_qk, -1).transpose(-1, -2)
        k = k.reshape(B * self.num_heads, self.dim_head_qk, -1)
        v = v.reshape(B * self.num_heads, self.dim_head_v, -1).transpose(-1, -2)
        attn = (q @ k) * self.scale + self.pos_embed(q)
        attn = attn.softmax(dim=-1)
        out = (attn @ v).transpose(-1, -2).reshape(B, self.dim_out_v, H, W)
        return self.pool(out)


class BoTBottleneck(nn.Module):
    def __init__(self, dim, feat_size):
        super().__init__()
        self.conv1_1x1 = nn.Sequential(nn.Conv2d(dim, dim, 1, bias=False), nn.BatchNorm2d(dim), nn.ReLU())
        self.conv2_kxk = BottleneckAttn(dim, feat_size)
        self.post_attn = nn.Sequential(nn.BatchNorm2d(dim), nn.ReLU())
        self.conv3_1x1 = nn.Sequential(nn.Conv2d(dim, dim, 1, bias=False), nn.BatchNorm2d(dim))
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        shortcut = x
        x = self.conv3_1x1(self.post_attn(self.conv2_kxk(self.conv1_1x1(x))))
        return self.act(x + shortcut)


class BoTNet(nn.Module):
    """A stride-4 conv stem and a bottleneck whose 3x3 conv is relative-position self-attention at a fixed
    feature size (its relative embeddings' length)."""

    def __init__(self, img_size=16, dim=8, num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, dim, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(dim),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        self.stages = nn.Sequential(BoTBottleneck(dim, (img_size // 4, img_size // 4)))
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)).mean((2, 3)))
