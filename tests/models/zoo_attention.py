"""Upstream-style attention blocks, written the way their authors write them: timm's ``Attention`` (one
``qkv`` Linear, ``reshape(B, N, 3, heads, head_dim).permute(2, 0, 3, 1, 4)``, ``unbind(0)``, a fused branch
with ``F.scaled_dot_product_attention`` and the manual one with ``(q * scale) @ k.transpose(-2, -1)``), a
ViT/DeiT-style network (patch embedding conv + ``flatten(2).transpose(1, 2)``, cls token and position
embedding as Parameters, pre-norm blocks with LayerScale and a GELU Mlp), a MobileViT-style block (local
convs, unfold into patches by reshapes and transposes, a transformer over the patches, fold back, fuse),
and Restormer's MDTA channel attention written with einops (``rearrange``, ``F.normalize``, a temperature
Parameter). The code is ours; the architectures' facts are public.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange, reduce, repeat


# ----- timm-style ViT --------------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, attn_drop=0.0, proj_drop=0.0, fused_attn=True):
        super().__init__()
        assert dim % num_heads == 0, "dim should be divisible by num_heads"
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = fused_attn
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        else:
            q = q * self.scale
            attn = q @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1)
            attn = self.attn_drop(attn)
            x = attn @ v
        x = x.transpose(1, 2).reshape(B, N, C)
        x = self.proj(x)
        x = self.proj_drop(x)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim, init_values=1e-5):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU, drop=0.0):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop1(x)
        x = self.fc2(x)
        x = self.drop2(x)
        return x


class Block(nn.Module):
    def __init__(
        self,
        dim,
        num_heads,
        mlp_ratio=4.0,
        qkv_bias=False,
        init_values=None,
        fused_attn=True,
        act_layer=nn.GELU,
        norm_layer=nn.LayerNorm,
    ):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias, fused_attn=fused_attn)
        self.ls1 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer)
        self.ls2 = LayerScale(dim, init_values=init_values) if init_values else nn.Identity()

    def forward(self, x):
        x = x + self.ls1(self.attn(self.norm1(x)))
        x = x + self.ls2(self.mlp(self.norm2(x)))
        return x


class PatchEmbed(nn.Module):
    def __init__(self, img_size=16, patch_size=4, in_chans=3, embed_dim=16):
        super().__init__()
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        x = self.proj(x)
        x = x.flatten(2).transpose(1, 2)  # NCHW -> NLC
        return x


class VisionTransformer(nn.Module):
    """ViT/DeiT: a cls token and a learned position embedding; the position embedding fixes the number of
    patches, so this network takes one image size (another batch size is what changes)."""

    def __init__(
        self,
        img_size=16,
        patch_size=4,
        in_chans=3,
        num_classes=5,
        embed_dim=16,
        depth=2,
        num_heads=2,
        mlp_ratio=2.0,
        qkv_bias=True,
        init_values=0.1,
        fused_attn=True,
    ):
        super().__init__()
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, embed_dim) * 0.02)
        self.blocks = nn.Sequential(
            *[
                Block(
                    embed_dim, num_heads, mlp_ratio, qkv_bias=qkv_bias, init_values=init_values, fused_attn=fused_attn
                )
                for _ in range(depth)
            ]
        )
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.pos_embed
        x = self.blocks(x)
        x = self.norm(x)
        x = x[:, 0]  # class token pooling
        return self.head(x)


# ----- MobileViT-style block ------------------------------------------------------------------------------
class MobileVitBlock(nn.Module):
    """Local 3x3 and 1x1 convs, the map unfolded into 2x2 patches ([B * P, N, C] tokens), transformer
    blocks over the patches, folded back, projected, and fused with the input by a 3x3 conv."""

    def __init__(self, in_chs=8, transformer_dim=16, num_heads=2, transformer_depth=1, patch_size=2, fused_attn=True):
        super().__init__()
        self.conv_kxk = nn.Sequential(
            nn.Conv2d(in_chs, in_chs, 3, padding=1, bias=False), nn.BatchNorm2d(in_chs), nn.SiLU()
        )
        self.conv_1x1 = nn.Conv2d(in_chs, transformer_dim, kernel_size=1, bias=False)
        self.transformer = nn.Sequential(
            *[
                Block(
                    transformer_dim, num_heads, mlp_ratio=2.0, qkv_bias=True, fused_attn=fused_attn, act_layer=nn.SiLU
                )
                for _ in range(transformer_depth)
            ]
        )
        self.norm = nn.LayerNorm(transformer_dim)
        self.conv_proj = nn.Sequential(
            nn.Conv2d(transformer_dim, in_chs, 1, bias=False), nn.BatchNorm2d(in_chs), nn.SiLU()
        )
        self.conv_fusion = nn.Sequential(
            nn.Conv2d(2 * in_chs, in_chs, 3, padding=1, bias=False), nn.BatchNorm2d(in_chs), nn.SiLU()
        )
        self.patch_size = (patch_size, patch_size)
        self.patch_area = patch_size * patch_size

    def forward(self, x):
        shortcut = x
        x = self.conv_kxk(x)
        x = self.conv_1x1(x)
        B, C, H, W = x.shape
        patch_h, patch_w = self.patch_size
        num_patch_h, num_patch_w = math.ceil(H / patch_h), math.ceil(W / patch_w)
        num_patches = num_patch_h * num_patch_w
        # [B, C, H, W] -> [B * C * n_h, p_h, n_w, p_w] -> [B * C * n_h, n_w, p_h, p_w]
        x = x.reshape(B * C * num_patch_h, patch_h, num_patch_w, patch_w).transpose(1, 2)
        # -> [B, C, N, P] -> [B, P, N, C] -> [B * P, N, C]
        x = x.reshape(B, C, num_patches, self.patch_area).transpose(1, 3).reshape(B * self.patch_area, num_patches, -1)
        x = self.transformer(x)
        x = self.norm(x)
        # fold: [B * P, N, C] -> [B, P, N, C] -> [B * C * n_h, n_w, p_h, p_w] -> [B, C, H, W]
        x = x.contiguous().view(B, self.patch_area, num_patches, -1)
        x = x.transpose(1, 3).reshape(B * C * num_patch_h, num_patch_w, patch_h, patch_w)
        x = x.transpose(1, 2).reshape(B, C, num_patch_h * patch_h, num_patch_w * patch_w)
        x = self.conv_proj(x)
        x = self.conv_fusion(torch.cat((shortcut, x), dim=1))
        return x


class MobileVitNet(nn.Module):
    def __init__(self, in_chans=3, chs=8, fused_attn=True):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_chans, chs, 3, padding=1, bias=False), nn.BatchNorm2d(chs), nn.SiLU())
        self.block = MobileVitBlock(chs, fused_attn=fused_attn)
        self.head = nn.Conv2d(chs, in_chans, 1)

    def forward(self, x):
        return self.head(self.block(self.stem(x))) + x


# ----- Restormer MDTA with einops ----------------------------------------------------------------------------
class MDTA(nn.Module):
    """Multi-DConv head transposed attention: attention across channels, q and k L2-normalised along the
    pixels, scaled by a learned temperature per head."""

    def __init__(self, dim, num_heads, bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.qkv = nn.Conv2d(dim, dim * 3, kernel_size=1, bias=bias)
        self.qkv_dwconv = nn.Conv2d(dim * 3, dim * 3, kernel_size=3, stride=1, padding=1, groups=dim * 3, bias=bias)
        self.project_out = nn.Conv2d(dim, dim, kernel_size=1, bias=bias)

    def forward(self, x):
        b, c, h, w = x.shape
        qkv = self.qkv_dwconv(self.qkv(x))
        q, k, v = qkv.chunk(3, dim=1)
        q = rearrange(q, "b (head c) h w -> b head c (h w)", head=self.num_heads)
        k = rearrange(k, "b (head c) h w -> b head c (h w)", head=self.num_heads)
        v = rearrange(v, "b (head c) h w -> b head c (h w)", head=self.num_heads)
        q = F.normalize(q, dim=-1)
        k = F.normalize(k, dim=-1)
        attn = (q @ k.transpose(-2, -1)) * self.temperature
        attn = attn.softmax(dim=-1)
        out = attn @ v
        out = rearrange(out, "b head c (h w) -> b (head c) h w", head=self.num_heads, h=h, w=w)
        return self.project_out(out)


class EinopsLayerNorm(nn.Module):
    """Restormer's LayerNorm over channels, through 'b c h w -> b (h w) c' tokens."""

    def __init__(self, dim):
        super().__init__()
        self.body = nn.LayerNorm(dim)

    def forward(self, x):
        h, w = x.shape[-2:]
        return rearrange(self.body(rearrange(x, "b c h w -> b (h w) c")), "b (h w) c -> b c h w", h=h, w=w)


class EinopsRestormerBlock(nn.Module):
    """A Restormer transformer block with einops layouts, a pixel-shuffle style einops downsampling and an
    einops ``reduce`` / ``repeat`` gate (squeeze-and-excitation over the channels)."""

    def __init__(self, dim=8, num_heads=2):
        super().__init__()
        self.norm1 = EinopsLayerNorm(dim)
        self.attn = MDTA(dim, num_heads)
        self.norm2 = EinopsLayerNorm(dim)
        self.ffn = nn.Sequential(nn.Conv2d(dim, dim * 2, 1), nn.GELU(), nn.Conv2d(dim * 2, dim, 1))
        self.gate = nn.Linear(dim, dim)
        self.down = nn.Conv2d(dim * 4, dim, 1)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.ffn(self.norm2(x))
        pooled = reduce(x, "b c h w -> b c", "mean")
        gate = torch.sigmoid(self.gate(pooled))
        x = x * repeat(gate, "b c -> b c h w", h=x.shape[2], w=x.shape[3])
        x = rearrange(x, "b c (h p1) (w p2) -> b (c p1 p2) h w", p1=2, p2=2)
        return self.down(x)


# ----- UNETR-style 3D ViT encoder (MONAI's layout: einops Rearrange layers, einsum attention) ----------------
from einops.layers.torch import Rearrange  # noqa: E402  (beside the models that use it, as MONAI imports it)


class SABlock(nn.Module):
    def __init__(self, hidden_size, num_heads, qkv_bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.out_proj = nn.Linear(hidden_size, hidden_size)
        self.qkv = nn.Linear(hidden_size, hidden_size * 3, bias=qkv_bias)
        self.input_rearrange = Rearrange("b h (qkv l d) -> qkv b l h d", qkv=3, l=num_heads)
        self.out_rearrange = Rearrange("b h l d -> b l (h d)")
        self.drop_output = nn.Dropout(0.0)
        self.drop_weights = nn.Dropout(0.0)
        self.head_dim = hidden_size // num_heads
        self.scale = self.head_dim**-0.5

    def forward(self, x):
        output = self.input_rearrange(self.qkv(x))
        q, k, v = output[0], output[1], output[2]
        att_mat = (torch.einsum("blxd,blyd->blxy", q, k) * self.scale).softmax(dim=-1)
        att_mat = self.drop_weights(att_mat)
        x = torch.einsum("bhxy,bhyd->bhxd", att_mat, v)
        x = self.out_rearrange(x)
        x = self.out_proj(x)
        x = self.drop_output(x)
        return x


class TransformerBlock(nn.Module):
    def __init__(self, hidden_size, mlp_dim, num_heads):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(hidden_size, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, hidden_size))
        self.norm1 = nn.LayerNorm(hidden_size)
        self.attn = SABlock(hidden_size, num_heads)
        self.norm2 = nn.LayerNorm(hidden_size)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class UNETREncoder(nn.Module):
    """A 3D image cut into patches by an einops Rearrange layer, a Linear embedding plus a learned position
    embedding (fixing the patch count), transformer blocks, the tokens viewed back as a 3D feature map and a
    conv3d head (UNETR's proj_feat)."""

    def __init__(self, in_channels=1, img_size=8, patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, depth=2):
        super().__init__()
        self.feat_size = [img_size // patch_size] * 3
        n_patches = (img_size // patch_size) ** 3
        patch_dim = in_channels * patch_size**3
        self.patch_embeddings = nn.Sequential(
            Rearrange(
                "b c (h p1) (w p2) (d p3) -> b (h w d) (p1 p2 p3 c)", p1=patch_size, p2=patch_size, p3=patch_size
            ),
            nn.Linear(patch_dim, hidden_size),
        )
        self.position_embeddings = nn.Parameter(torch.randn(1, n_patches, hidden_size) * 0.02)
        self.blocks = nn.ModuleList([TransformerBlock(hidden_size, mlp_dim, num_heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(hidden_size)
        self.hidden_size = hidden_size
        self.head = nn.Conv3d(hidden_size, in_channels, kernel_size=3, padding=1)

    def proj_feat(self, x):
        new_view = [x.size(0)] + self.feat_size + [self.hidden_size]
        x = x.view(new_view)
        x = x.permute(0, 4, 1, 2, 3).contiguous()
        return x

    def forward(self, x_in):
        x = self.patch_embeddings(x_in) + self.position_embeddings
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        return self.head(self.proj_feat(x))
