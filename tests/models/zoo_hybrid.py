"""timm's remaining transformers and attention hybrids, written the way their authors write them, at tiny
sizes: CoAtNet / MaxViT (MBConv, relative position bias tables indexed by an int64 buffer, block and grid
partitions), EfficientFormerV2 / LeViT (``attention_biases[:, attention_bias_idxs]``, BatchNorm1d on
``x.flatten(0, 1)``, hardswish, talking heads, LeViT's subsampling attention by a strided slice), DeiT
(class and distillation tokens, two heads averaged). Their convolutional cousins are in
``tests/models/zoo_hybrid_conv.py``. The code is ours; the architectures' facts are public.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def ndgrid(*tensors):
    return torch.meshgrid(*tensors, indexing="ij")


# ----- CoAtNet / MaxViT ----------------------------------------------------------------------------------
class SqueezeExcite(nn.Module):
    def __init__(self, channels, rd_channels, act_layer=nn.SiLU):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, rd_channels, 1, bias=True)
        self.act = act_layer()
        self.fc2 = nn.Conv2d(rd_channels, channels, 1, bias=True)

    def forward(self, x):
        x_se = x.mean((2, 3), keepdim=True)
        x_se = self.fc2(self.act(self.fc1(x_se)))
        return x * x_se.sigmoid()


class MbConvBlock(nn.Module):
    """Pre-norm MBConv: BatchNorm, 1x1 expansion, depthwise kxk (the stride), squeeze-excite, 1x1 projection."""

    def __init__(self, in_chs, out_chs, stride=1, expand_ratio=2.0):
        super().__init__()
        mid_chs = int(out_chs * expand_ratio)
        if stride == 2 or in_chs != out_chs:
            self.shortcut = nn.Sequential(
                nn.AvgPool2d(stride) if stride > 1 else nn.Identity(), nn.Conv2d(in_chs, out_chs, 1)
            )
        else:
            self.shortcut = nn.Identity()
        self.pre_norm = nn.BatchNorm2d(in_chs)
        self.conv1_1x1 = nn.Conv2d(in_chs, mid_chs, 1, bias=False)
        self.norm1 = nn.Sequential(nn.BatchNorm2d(mid_chs), nn.GELU())
        self.conv2_kxk = nn.Conv2d(mid_chs, mid_chs, 3, stride=stride, padding=1, groups=mid_chs, bias=False)
        self.norm2 = nn.Sequential(nn.BatchNorm2d(mid_chs), nn.GELU())
        self.se = SqueezeExcite(mid_chs, max(1, mid_chs // 4))
        self.conv3_1x1 = nn.Conv2d(mid_chs, out_chs, 1, bias=True)

    def forward(self, x):
        shortcut = self.shortcut(x)
        x = self.pre_norm(x)
        x = self.conv1_1x1(x)
        x = self.norm1(x)
        x = self.conv2_kxk(x)
        x = self.norm2(x)
        x = self.se(x)
        x = self.conv3_1x1(x)
        return x + shortcut


def gen_relative_position_index(window_size):
    coords = torch.stack(ndgrid(torch.arange(window_size[0]), torch.arange(window_size[1]))).flatten(1)
    relative_coords = coords[:, :, None] - coords[:, None, :]
    relative_coords = relative_coords.permute(1, 2, 0).contiguous()
    relative_coords[:, :, 0] += window_size[0] - 1
    relative_coords[:, :, 1] += window_size[1] - 1
    relative_coords[:, :, 0] *= 2 * window_size[1] - 1
    return relative_coords.sum(-1)


class RelPosBias(nn.Module):
    def __init__(self, window_size, num_heads):
        super().__init__()
        self.window_size = window_size
        self.window_area = window_size[0] * window_size[1]
        self.bias_shape = (self.window_area,) * 2 + (num_heads,)
        num_relative_distance = (2 * window_size[0] - 1) * (2 * window_size[1] - 1)
        self.relative_position_bias_table = nn.Parameter(torch.zeros(num_relative_distance, num_heads))
        self.register_buffer("relative_position_index", gen_relative_position_index(window_size), persistent=False)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def get_bias(self) -> torch.Tensor:
        relative_position_bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        relative_position_bias = relative_position_bias.view(self.bias_shape).permute(2, 0, 1)
        return relative_position_bias.unsqueeze(0).contiguous()

    def forward(self, attn):
        return attn + self.get_bias()


class Attention2d(nn.Module):
    """CoAtNet's attention on NCHW maps: a 1x1 conv for q, k, v, heads split by ``view(B, heads, 3 d, -1)``."""

    def __init__(self, dim, feat_size, dim_head=4):
        super().__init__()
        self.num_heads = dim // dim_head
        self.dim_head = dim_head
        self.scale = dim_head**-0.5
        self.qkv = nn.Conv2d(dim, dim * 3, 1)
        self.rel_pos = RelPosBias(feat_size, self.num_heads)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x):
        B, C, H, W = x.shape
        q, k, v = self.qkv(x).view(B, self.num_heads, self.dim_head * 3, -1).chunk(3, dim=2)
        attn = (q.transpose(-2, -1) @ k) * self.scale
        attn = self.rel_pos(attn)
        attn = attn.softmax(dim=-1)
        x = (v @ attn.transpose(-2, -1)).view(B, -1, H, W)
        return self.proj(x)


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class TransformerBlock2d(nn.Module):
    def __init__(self, dim, feat_size):
        super().__init__()
        self.norm1 = LayerNorm2d(dim)
        self.attn = Attention2d(dim, feat_size)
        self.norm2 = LayerNorm2d(dim)
        self.mlp = nn.Sequential(nn.Conv2d(dim, 2 * dim, 1), nn.GELU(), nn.Conv2d(2 * dim, dim, 1))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CoAtNet(nn.Module):
    """Conv stem, an MBConv stage, a transformer stage at a fixed feature size (its bias table), a pooled head."""

    def __init__(self, img_size=16, dims=(8, 8), num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 3, stride=2, padding=1), nn.BatchNorm2d(dims[0]), nn.GELU())
        self.stage1 = MbConvBlock(dims[0], dims[1], stride=2)
        self.stage2 = TransformerBlock2d(dims[1], (img_size // 4, img_size // 4))
        self.head = nn.Linear(dims[1], num_classes)

    def forward(self, x):
        x = self.stage2(self.stage1(self.stem(x)))
        return self.head(x.mean((2, 3)))


def window_partition(x, window_size):
    B, H, W, C = x.shape
    x = x.view(B, H // window_size[0], window_size[0], W // window_size[1], window_size[1], C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size[0], window_size[1], C)


def window_reverse(windows, window_size, img_size):
    H, W = img_size
    C = windows.shape[-1]
    x = windows.view(-1, H // window_size[0], W // window_size[1], window_size[0], window_size[1], C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, H, W, C)


def grid_partition(x, grid_size):
    B, H, W, C = x.shape
    x = x.view(B, grid_size[0], H // grid_size[0], grid_size[1], W // grid_size[1], C)
    return x.permute(0, 2, 4, 1, 3, 5).contiguous().view(-1, grid_size[0], grid_size[1], C)


def grid_reverse(windows, grid_size, img_size):
    H, W = img_size
    C = windows.shape[-1]
    x = windows.view(-1, H // grid_size[0], W // grid_size[1], grid_size[0], grid_size[1], C)
    return x.permute(0, 3, 1, 4, 2, 5).contiguous().view(-1, H, W, C)


class AttentionCl(nn.Module):
    """MaxViT's channels-last attention: ``view(B, -1, heads, 3 d).transpose(1, 2).chunk(3, dim=3)``."""

    def __init__(self, dim, partition_size, dim_head=4):
        super().__init__()
        self.num_heads = dim // dim_head
        self.dim_head = dim_head
        self.scale = dim_head**-0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.rel_pos = RelPosBias(partition_size, self.num_heads)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B = x.shape[0]
        restore_shape = x.shape[:-1]
        q, k, v = self.qkv(x).view(B, -1, self.num_heads, self.dim_head * 3).transpose(1, 2).chunk(3, dim=3)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = self.rel_pos(attn)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(restore_shape + (-1,))
        return self.proj(x)


class LayerScale(nn.Module):
    def __init__(self, dim, init_values=1e-5):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class PartitionAttentionCl(nn.Module):
    def __init__(self, dim, partition_type="block", partition_size=(2, 2)):
        super().__init__()
        self.partition_block = partition_type == "block"
        self.partition_size = partition_size
        self.norm1 = nn.LayerNorm(dim)
        self.attn = AttentionCl(dim, partition_size)
        self.ls1 = LayerScale(dim, init_values=0.5)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.ls2 = LayerScale(dim, init_values=0.5)

    def _partition_attn(self, x):
        img_size = x.shape[1:3]
        if self.partition_block:
            partitioned = window_partition(x, self.partition_size)
        else:
            partitioned = grid_partition(x, self.partition_size)
        partitioned = self.attn(partitioned)
        if self.partition_block:
            return window_reverse(partitioned, self.partition_size, img_size)
        return grid_reverse(partitioned, self.partition_size, img_size)

    def forward(self, x):
        x = x + self.ls1(self._partition_attn(self.norm1(x)))
        return x + self.ls2(self.mlp(self.norm2(x)))


class MaxxVitBlock(nn.Module):
    def __init__(self, dim, partition_size=(2, 2)):
        super().__init__()
        self.conv = MbConvBlock(dim, dim)
        self.attn_block = PartitionAttentionCl(dim, "block", partition_size)
        self.attn_grid = PartitionAttentionCl(dim, "grid", partition_size)

    def forward(self, x):
        x = self.conv(x)
        x = x.permute(0, 2, 3, 1)
        x = self.attn_grid(self.attn_block(x))
        return x.permute(0, 3, 1, 2)


class MaxViT(nn.Module):
    """A stride-2 stem and one MaxViT block: MBConv, block attention, grid attention (any multiple of 4)."""

    def __init__(self, dim=8, num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dim, 3, stride=2, padding=1), nn.BatchNorm2d(dim), nn.GELU())
        self.stages = nn.Sequential(MaxxVitBlock(dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.head(self.norm(x.mean((2, 3))))


# ----- EfficientFormerV2 / LeViT: attention biases indexed by an int64 buffer -------------------------------
def attention_bias_idxs(resolution):
    pos = torch.stack(ndgrid(torch.arange(resolution[0]), torch.arange(resolution[1]))).flatten(1)
    rel_pos = (pos[..., :, None] - pos[..., None, :]).abs()
    return (rel_pos[0] * resolution[1]) + rel_pos[1]


class ConvNorm(nn.Sequential):
    def __init__(self, in_chs, out_chs, kernel_size=1, stride=1, padding=0, groups=1):
        super().__init__()
        self.add_module("c", nn.Conv2d(in_chs, out_chs, kernel_size, stride, padding, groups=groups, bias=False))
        self.add_module("bn", nn.BatchNorm2d(out_chs))


class EfficientFormerV2Attention2d(nn.Module):
    """q, k, v as conv + BN, a depthwise local value branch, biases ``attention_biases[:, idxs]``, talking heads
    (1x1 convs over the heads before and after the softmax)."""

    def __init__(self, dim=8, key_dim=4, num_heads=2, attn_ratio=2, resolution=4):
        super().__init__()
        self.num_heads = num_heads
        self.scale = key_dim**-0.5
        self.key_dim = key_dim
        self.resolution = (resolution, resolution)
        self.N = resolution * resolution
        self.val_dim = int(attn_ratio * key_dim)
        self.val_attn_dim = self.val_dim * num_heads
        self.key_attn_dim = key_dim * num_heads
        self.q = ConvNorm(dim, self.key_attn_dim)
        self.k = ConvNorm(dim, self.key_attn_dim)
        self.v = ConvNorm(dim, self.val_attn_dim)
        self.v_local = ConvNorm(
            self.val_attn_dim, self.val_attn_dim, kernel_size=3, padding=1, groups=self.val_attn_dim
        )
        self.talking_head1 = nn.Conv2d(num_heads, num_heads, kernel_size=1)
        self.talking_head2 = nn.Conv2d(num_heads, num_heads, kernel_size=1)
        self.act = nn.GELU()
        self.proj = ConvNorm(self.val_attn_dim, dim)
        self.attention_biases = nn.Parameter(torch.zeros(num_heads, self.N))
        self.register_buffer("attention_bias_idxs", attention_bias_idxs(self.resolution), persistent=False)

    def forward(self, x):
        B, C, H, W = x.shape
        q = self.q(x).reshape(B, self.num_heads, -1, self.N).permute(0, 1, 3, 2)
        k = self.k(x).reshape(B, self.num_heads, -1, self.N).permute(0, 1, 2, 3)
        v = self.v(x)
        v_local = self.v_local(v)
        v = v.reshape(B, self.num_heads, -1, self.N).permute(0, 1, 3, 2)
        attn = (q @ k) * self.scale
        attn = attn + self.attention_biases[:, self.attention_bias_idxs]
        attn = self.talking_head1(attn)
        attn = attn.softmax(dim=-1)
        attn = self.talking_head2(attn)
        x = (attn @ v).transpose(2, 3)
        x = x.reshape(B, self.val_attn_dim, self.resolution[0], self.resolution[1]) + v_local
        x = self.act(x)
        return self.proj(x)


class EfficientFormerV2(nn.Module):
    def __init__(self, dim=8, num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(ConvNorm(3, dim, 3, 2, 1), nn.GELU())
        self.token_mixer = EfficientFormerV2Attention2d(dim)
        self.layer_scale = nn.Parameter(1e-1 * torch.ones(dim).unsqueeze(-1).unsqueeze(-1))
        self.mlp = nn.Sequential(ConvNorm(dim, 2 * dim), nn.GELU(), ConvNorm(2 * dim, dim))
        self.norm = nn.BatchNorm2d(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.layer_scale * self.token_mixer(x)
        x = x + self.mlp(x)
        return self.head(self.norm(x).mean((2, 3)))


class LinearNorm(nn.Module):
    """LeViT's Linear + BatchNorm1d on the tokens of all samples: ``bn(x.flatten(0, 1)).reshape_as(x)``."""

    def __init__(self, in_features, out_features, bn_weight_init=1):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=False)
        self.bn = nn.BatchNorm1d(out_features)
        nn.init.constant_(self.bn.weight, bn_weight_init)

    def forward(self, x):
        x = self.linear(x)
        return self.bn(x.flatten(0, 1)).reshape_as(x)


class LevitAttention(nn.Module):
    def __init__(self, dim=8, key_dim=4, num_heads=2, attn_ratio=2.0, resolution=4, act_layer=nn.Hardswish):
        super().__init__()
        self.num_heads = num_heads
        self.scale = key_dim**-0.5
        self.key_dim = key_dim
        self.key_attn_dim = key_dim * num_heads
        self.val_dim = int(attn_ratio * key_dim)
        self.val_attn_dim = int(attn_ratio * key_dim) * num_heads
        self.qkv = LinearNorm(dim, self.val_attn_dim + self.key_attn_dim * 2)
        self.proj = nn.Sequential(act_layer(), LinearNorm(self.val_attn_dim, dim, bn_weight_init=0.5))
        resolution = (resolution, resolution)
        self.attention_biases = nn.Parameter(torch.zeros(num_heads, resolution[0] * resolution[1]))
        self.register_buffer("attention_bias_idxs", attention_bias_idxs(resolution), persistent=False)

    def get_attention_biases(self, device: torch.device) -> torch.Tensor:
        return self.attention_biases[:, self.attention_bias_idxs]

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).view(B, N, self.num_heads, -1).split([self.key_dim, self.key_dim, self.val_dim], dim=3)
        q = q.permute(0, 2, 1, 3)
        k = k.permute(0, 2, 3, 1)
        v = v.permute(0, 2, 1, 3)
        attn = q @ k * self.scale + self.get_attention_biases(x.device)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, self.val_attn_dim)
        return self.proj(x)


class LevitMlp(nn.Module):
    def __init__(self, in_features, hidden_features, act_layer=nn.Hardswish):
        super().__init__()
        self.ln1 = LinearNorm(in_features, hidden_features)
        self.act = act_layer()
        self.ln2 = LinearNorm(hidden_features, in_features, bn_weight_init=0.5)

    def forward(self, x):
        return self.ln2(self.act(self.ln1(x)))


class Subsample(nn.Module):
    def __init__(self, stride, resolution):
        super().__init__()
        self.stride = stride
        self.resolution = (resolution, resolution)

    def forward(self, x):
        B, N, C = x.shape
        x = x.view(B, self.resolution[0], self.resolution[1], C)[:, :: self.stride, :: self.stride]
        return x.reshape(B, -1, C)


class AttentionSubsample(nn.Module):
    """LeViT's downsampling attention: queries from every ``stride``-th token (a strided slice), keys and values
    from all, biases indexed by the query-to-key offsets."""

    def __init__(
        self, in_dim, out_dim, key_dim=4, num_heads=2, attn_ratio=2, stride=2, resolution=4, act_layer=nn.Hardswish
    ):
        super().__init__()
        self.stride = stride
        self.resolution = (resolution, resolution)
        self.num_heads = num_heads
        self.scale = key_dim**-0.5
        self.key_dim = key_dim
        self.key_attn_dim = key_dim * num_heads
        self.val_dim = int(attn_ratio * key_dim)
        self.val_attn_dim = self.val_dim * self.num_heads
        self.kv = LinearNorm(in_dim, self.val_attn_dim + self.key_attn_dim)
        self.q = nn.Sequential(Subsample(stride, resolution), LinearNorm(in_dim, self.key_attn_dim))
        self.proj = nn.Sequential(act_layer(), LinearNorm(self.val_attn_dim, out_dim))
        self.attention_biases = nn.Parameter(torch.zeros(num_heads, self.resolution[0] * self.resolution[1]))
        q_pos = torch.stack(
            ndgrid(torch.arange(0, self.resolution[0], step=stride), torch.arange(0, self.resolution[1], step=stride))
        ).flatten(1)
        k_pos = torch.stack(ndgrid(torch.arange(self.resolution[0]), torch.arange(self.resolution[1]))).flatten(1)
        rel_pos = (q_pos[..., :, None] - k_pos[..., None, :]).abs()
        rel_pos = (rel_pos[0] * self.resolution[1]) + rel_pos[1]
        self.register_buffer("attention_bias_idxs", rel_pos, persistent=False)

    def forward(self, x):
        B, N, C = x.shape
        k, v = self.kv(x).view(B, N, self.num_heads, -1).split([self.key_dim, self.val_dim], dim=3)
        k = k.permute(0, 2, 3, 1)
        v = v.permute(0, 2, 1, 3)
        q = self.q(x).view(B, -1, self.num_heads, self.key_dim).permute(0, 2, 1, 3)
        attn = q @ k * self.scale + self.attention_biases[:, self.attention_bias_idxs]
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, -1, self.val_attn_dim)
        return self.proj(x)


class NormLinear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.bn = nn.BatchNorm1d(in_features)
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.linear(self.bn(x))


class LeViTDistilled(nn.Module):
    """ConvNorm + hardswish stem, ``flatten(2).transpose(1, 2)`` tokens, residual attention and MLP, a
    subsampling attention to half the resolution and twice the width, a head and a distillation head averaged
    (timm's inference form)."""

    def __init__(self, dim=8, num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(ConvNorm(3, dim // 2, 3, 2, 1), nn.Hardswish(), ConvNorm(dim // 2, dim, 3, 2, 1))
        self.attn = LevitAttention(dim)
        self.mlp = LevitMlp(dim, 2 * dim)
        self.attn_downsample = AttentionSubsample(dim, 2 * dim)
        self.mlp_downsample = LevitMlp(2 * dim, 4 * dim)
        self.head = NormLinear(2 * dim, num_classes)
        self.head_dist = NormLinear(2 * dim, num_classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = x + self.attn(x)
        x = x + self.mlp(x)
        x = self.attn_downsample(x)
        x = x + self.mlp_downsample(x)
        x = x.mean(1)
        x, x_dist = self.head(x), self.head_dist(x)
        return (x + x_dist) / 2


# ----- DeiT: class and distillation tokens, two heads averaged ---------------------------------------------
class DeiTBlock(nn.Module):
    def __init__(self, dim, num_heads=2):
        super().__init__()
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def attn(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class DeiTDistilled(nn.Module):
    def __init__(self, img_size=8, patch_size=4, embed_dim=8, num_classes=5):
        super().__init__()
        self.num_prefix_tokens = 2
        self.patch_embed = nn.Conv2d(3, embed_dim, patch_size, stride=patch_size)
        num_patches = (img_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + self.num_prefix_tokens, embed_dim))
        self.blocks = nn.Sequential(DeiTBlock(embed_dim), DeiTBlock(embed_dim))
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)
        self.head_dist = nn.Linear(embed_dim, num_classes)
        for parameter in (self.cls_token, self.dist_token, self.pos_embed):
            nn.init.trunc_normal_(parameter, std=0.02)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), self.dist_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.pos_embed
        x = self.norm(self.blocks(x))
        x, x_dist = self.head(x[:, 0]), self.head_dist(x[:, 1])
        return (x + x_dist) / 2
