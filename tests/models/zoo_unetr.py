"""MONAI's whole ``UNETR``, written the way MONAI writes it: a ViT (``PatchEmbeddingBlock`` with a strided conv,
``x.flatten(2).transpose(-1, -2)`` plus a learned position embedding, transformer blocks whose hidden states
are kept), ``proj_feat`` viewing tokens back as a feature map (``x.view([x.size(0)] + self.proj_view_shape)``,
permuted), the ``UnetrBasicBlock`` / ``UnetrPrUpBlock`` / ``UnetrUpBlock`` decoder of transposed convs and
instance-norm residual blocks, concatenated skips; 2D and 3D. The encoder's pieces are those of
``tests/models/zoo_attention.py`` (einops attention), the decoder's those of ``tests/models/zoo_monai.py``. The code is ours;
the architecture's facts are public.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from tests.models.zoo_attention import TransformerBlock
from tests.models.zoo_monai import CONV, UnetBasicBlock, UnetOutBlock, UnetResBlock, UnetUpBlock, get_conv_layer


class PatchEmbeddingBlock(nn.Module):
    def __init__(self, in_channels, img_size, patch_size, hidden_size, spatial_dims=3, dropout_rate=0.0):
        super().__init__()
        self.n_patches = 1
        for m, p in zip(img_size, patch_size):
            self.n_patches *= m // p
        self.patch_embeddings = CONV[spatial_dims](in_channels, hidden_size, kernel_size=patch_size, stride=patch_size)
        self.position_embeddings = nn.Parameter(torch.zeros(1, self.n_patches, hidden_size))
        self.dropout = nn.Dropout(dropout_rate)
        nn.init.trunc_normal_(self.position_embeddings, mean=0.0, std=0.02, a=-2.0, b=2.0)

    def forward(self, x):
        x = self.patch_embeddings(x)
        x = x.flatten(2).transpose(-1, -2)
        embeddings = x + self.position_embeddings
        embeddings = self.dropout(embeddings)
        return embeddings


class ViT(nn.Module):
    def __init__(
        self, in_channels, img_size, patch_size, hidden_size=16, mlp_dim=32, num_layers=12, num_heads=2, spatial_dims=3
    ):
        super().__init__()
        self.patch_embedding = PatchEmbeddingBlock(in_channels, img_size, patch_size, hidden_size, spatial_dims)
        self.blocks = nn.ModuleList([TransformerBlock(hidden_size, mlp_dim, num_heads) for i in range(num_layers)])
        self.norm = nn.LayerNorm(hidden_size)

    def forward(self, x):
        x = self.patch_embedding(x)
        hidden_states_out = []
        for blk in self.blocks:
            x = blk(x)
            hidden_states_out.append(x)
        x = self.norm(x)
        return x, hidden_states_out


class UnetrBasicBlock(nn.Module):
    def __init__(self, spatial_dims, in_channels, out_channels, kernel_size, stride, norm_name, res_block=False):
        super().__init__()
        block = UnetResBlock if res_block else UnetBasicBlock
        self.layer = block(spatial_dims, in_channels, out_channels, kernel_size, stride, norm_name)

    def forward(self, inp):
        return self.layer(inp)


class UnetrPrUpBlock(nn.Module):
    def __init__(
        self,
        spatial_dims,
        in_channels,
        out_channels,
        num_layer,
        kernel_size,
        stride,
        upsample_kernel_size,
        norm_name,
        conv_block=False,
        res_block=False,
    ):
        super().__init__()
        upsample_stride = upsample_kernel_size
        self.transp_conv_init = get_conv_layer(
            spatial_dims, in_channels, out_channels, upsample_kernel_size, upsample_stride, is_transposed=True
        )
        if conv_block:
            block = UnetResBlock if res_block else UnetBasicBlock
            self.blocks = nn.ModuleList(
                [
                    nn.Sequential(
                        get_conv_layer(
                            spatial_dims,
                            out_channels,
                            out_channels,
                            upsample_kernel_size,
                            upsample_stride,
                            is_transposed=True,
                        ),
                        block(spatial_dims, out_channels, out_channels, kernel_size, stride, norm_name),
                    )
                    for i in range(num_layer)
                ]
            )
        else:
            self.blocks = nn.ModuleList(
                [
                    get_conv_layer(
                        spatial_dims,
                        out_channels,
                        out_channels,
                        upsample_kernel_size,
                        upsample_stride,
                        is_transposed=True,
                    )
                    for i in range(num_layer)
                ]
            )

    def forward(self, x):
        x = self.transp_conv_init(x)
        for blk in self.blocks:
            x = blk(x)
        return x


class UNETR(nn.Module):
    def __init__(
        self,
        in_channels=1,
        out_channels=2,
        img_size=(32, 32, 32),
        feature_size=2,
        hidden_size=16,
        mlp_dim=32,
        num_heads=2,
        norm_name="instance",
        res_block=True,
        spatial_dims=3,
    ):
        super().__init__()
        self.num_layers = 12
        img_size = tuple(img_size)[:spatial_dims]
        self.patch_size = (16,) * spatial_dims
        self.feat_size = tuple(img_d // p_d for img_d, p_d in zip(img_size, self.patch_size))
        self.hidden_size = hidden_size
        self.vit = ViT(
            in_channels, img_size, self.patch_size, hidden_size, mlp_dim, self.num_layers, num_heads, spatial_dims
        )
        self.encoder1 = UnetrBasicBlock(spatial_dims, in_channels, feature_size, 3, 1, norm_name, res_block)
        self.encoder2 = UnetrPrUpBlock(
            spatial_dims, hidden_size, feature_size * 2, 2, 3, 1, 2, norm_name, conv_block=True, res_block=res_block
        )
        self.encoder3 = UnetrPrUpBlock(
            spatial_dims, hidden_size, feature_size * 4, 1, 3, 1, 2, norm_name, conv_block=True, res_block=res_block
        )
        self.encoder4 = UnetrPrUpBlock(
            spatial_dims, hidden_size, feature_size * 8, 0, 3, 1, 2, norm_name, conv_block=True, res_block=res_block
        )
        self.decoder5 = UnetUpBlock(spatial_dims, hidden_size, feature_size * 8, 3, 2, norm_name, res_block)
        self.decoder4 = UnetUpBlock(spatial_dims, feature_size * 8, feature_size * 4, 3, 2, norm_name, res_block)
        self.decoder3 = UnetUpBlock(spatial_dims, feature_size * 4, feature_size * 2, 3, 2, norm_name, res_block)
        self.decoder2 = UnetUpBlock(spatial_dims, feature_size * 2, feature_size, 3, 2, norm_name, res_block)
        self.out = UnetOutBlock(spatial_dims, feature_size, out_channels)
        self.proj_axes = (0, spatial_dims + 1) + tuple(d + 1 for d in range(spatial_dims))
        self.proj_view_shape = list(self.feat_size) + [self.hidden_size]

    def proj_feat(self, x):
        new_view = [x.size(0)] + self.proj_view_shape
        x = x.view(new_view)
        x = x.permute(self.proj_axes).contiguous()
        return x

    def forward(self, x_in):
        x, hidden_states_out = self.vit(x_in)
        enc1 = self.encoder1(x_in)
        x2 = hidden_states_out[3]
        enc2 = self.encoder2(self.proj_feat(x2))
        x3 = hidden_states_out[6]
        enc3 = self.encoder3(self.proj_feat(x3))
        x4 = hidden_states_out[9]
        enc4 = self.encoder4(self.proj_feat(x4))
        dec4 = self.proj_feat(x)
        dec3 = self.decoder5(dec4, enc4)
        dec2 = self.decoder4(dec3, enc3)
        dec1 = self.decoder3(dec2, enc2)
        out = self.decoder2(dec1, enc1)
        return self.out(out)
