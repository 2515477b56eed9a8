"""Upstream-style blocks of current restoration and classification CNNs, written the way their authors
write them (sizes read from ``x.shape``, ``chunk``, ``@``, ``F.normalize``, ``.softmax(dim=-1)``, a
LayerNorm by hand with ``x.var(-1, keepdim=True, unbiased=False)`` on a ``b (h w) c`` view, branches
``torch.stack``-ed and weighed by a softmax over them). The code is ours; the architectures' facts are
public (Restormer, SKNet, FFDNet's pixel_unshuffle front end).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----- Restormer: MDTA attention across channels, GDFN gated feed-forward, bias-free LayerNorm ---------
def to_3d(x):
    return x.flatten(2).transpose(1, 2)  # b c h w -> b (h w) c


def to_4d(x, h, w):
    b, hw, c = x.shape
    return x.transpose(1, 2).reshape(b, c, h, w)


class BiasFreeLayerNorm(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))

    def forward(self, x):
        sigma = x.var(-1, keepdim=True, unbiased=False)
        return x / torch.sqrt(sigma + 1e-5) * self.weight


class WithBiasLayerNorm(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        sigma = x.var(-1, keepdim=True, unbiased=False)
        return (x - mu) / torch.sqrt(sigma + 1e-5) * self.weight + self.bias


class LayerNorm(nn.Module):
    def __init__(self, dim, kind):
        super().__init__()
        self.body = BiasFreeLayerNorm(dim) if kind == "BiasFree" else WithBiasLayerNorm(dim)

    def forward(self, x):
        h, w = x.shape[-2:]
        return to_4d(self.body(to_3d(x)), h, w)


class FeedForward(nn.Module):
    def __init__(self, dim, expansion, bias):
        super().__init__()
        hidden = int(dim * expansion)
        self.project_in = nn.Conv2d(dim, hidden * 2, kernel_size=1, bias=bias)
        self.dwconv = nn.Conv2d(
            hidden * 2, hidden * 2, kernel_size=3, stride=1, padding=1, groups=hidden * 2, bias=bias
        )
        self.project_out = nn.Conv2d(hidden, dim, kernel_size=1, bias=bias)

    def forward(self, x):
        x = self.project_in(x)
        x1, x2 = self.dwconv(x).chunk(2, dim=1)
        x = F.gelu(x1) * x2
        return self.project_out(x)


class Attention(nn.Module):
    def __init__(self, dim, num_heads, bias):
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
        q = q.reshape(b, self.num_heads, -1, h * w)  # b (head c) h w -> b head c (h w)
        k = k.reshape(b, self.num_heads, -1, h * w)
        v = v.reshape(b, self.num_heads, -1, h * w)
        q = torch.nn.functional.normalize(q, dim=-1)
        k = torch.nn.functional.normalize(k, dim=-1)
        attn = (q @ k.transpose(-2, -1)) * self.temperature
        attn = attn.softmax(dim=-1)
        out = attn @ v
        out = out.reshape(b, -1, h, w)  # b head c (h w) -> b (head c) h w
        return self.project_out(out)


class TransformerBlock(nn.Module):
    def __init__(self, dim, num_heads, expansion, bias, norm_kind):
        super().__init__()
        self.norm1 = LayerNorm(dim, norm_kind)
        self.attn = Attention(dim, num_heads, bias)
        self.norm2 = LayerNorm(dim, norm_kind)
        self.ffn = FeedForward(dim, expansion, bias)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.ffn(self.norm2(x))
        return x


class Restormer(nn.Module):
    """Two levels: patch embedding, a block, pixel_unshuffle down, a block, pixel_shuffle up, concat
    with the skip, a 1x1 reduction, a refinement block, and the global residual."""

    def __init__(self, channels=3, dim=8, heads=(1, 2), expansion=2.66, bias=False, norm_kind="WithBias"):
        super().__init__()
        self.patch_embed = nn.Conv2d(channels, dim, kernel_size=3, stride=1, padding=1, bias=bias)
        self.encoder_level1 = nn.Sequential(*[TransformerBlock(dim, heads[0], expansion, bias, norm_kind)])
        self.down1_2 = nn.Sequential(
            nn.Conv2d(dim, dim // 2, kernel_size=3, stride=1, padding=1, bias=False), nn.PixelUnshuffle(2)
        )
        self.latent = nn.Sequential(
            *[TransformerBlock(dim * 2, heads[1], expansion, bias, "BiasFree") for _ in range(2)]
        )
        self.up2_1 = nn.Sequential(
            nn.Conv2d(dim * 2, dim * 4, kernel_size=3, stride=1, padding=1, bias=False), nn.PixelShuffle(2)
        )
        self.reduce_chan_level1 = nn.Conv2d(dim * 2, dim, kernel_size=1, bias=bias)
        self.refinement = nn.Sequential(TransformerBlock(dim, heads[0], expansion, bias, norm_kind))
        self.output = nn.Conv2d(dim, channels, kernel_size=3, stride=1, padding=1, bias=bias)

    def forward(self, inp_img):
        inp_enc_level1 = self.patch_embed(inp_img)
        out_enc_level1 = self.encoder_level1(inp_enc_level1)
        latent = self.latent(self.down1_2(out_enc_level1))
        inp_dec_level1 = self.up2_1(latent)
        inp_dec_level1 = torch.cat([inp_dec_level1, out_enc_level1], 1)
        inp_dec_level1 = self.reduce_chan_level1(inp_dec_level1)
        out_dec_level1 = self.refinement(inp_dec_level1)
        return self.output(out_dec_level1) + inp_img


# ----- SKNet: selective kernel convolution (branches stacked, softmax attention over them) --------------
class SKConv(nn.Module):
    def __init__(self, features, branches=2, groups=2, reduction=2, stride=1, minimum=4):
        super().__init__()
        d = max(int(features / reduction), minimum)
        self.branches = branches
        self.features = features
        self.convs = nn.ModuleList([])
        for i in range(branches):
            self.convs.append(
                nn.Sequential(
                    nn.Conv2d(
                        features,
                        features,
                        kernel_size=3,
                        stride=stride,
                        padding=1 + i,
                        dilation=1 + i,
                        groups=groups,
                        bias=False,
                    ),
                    nn.BatchNorm2d(features),
                    nn.ReLU(inplace=True),
                )
            )
        self.gap = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Sequential(
            nn.Conv2d(features, d, kernel_size=1, stride=1, bias=False), nn.BatchNorm2d(d), nn.ReLU(inplace=True)
        )
        self.fcs = nn.ModuleList([])
        for i in range(branches):
            self.fcs.append(nn.Conv2d(d, features, kernel_size=1, stride=1))
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x):
        batch_size = x.shape[0]
        feats = [conv(x) for conv in self.convs]
        feats = torch.stack(feats, dim=1)  # b branches c h w
        feats_U = torch.sum(feats, dim=1)
        feats_S = self.gap(feats_U)
        feats_Z = self.fc(feats_S)
        attention_vectors = [fc(feats_Z) for fc in self.fcs]
        attention_vectors = torch.cat(attention_vectors, dim=1)
        attention_vectors = attention_vectors.view(batch_size, self.branches, self.features, 1, 1)
        attention_vectors = self.softmax(attention_vectors)
        feats_V = torch.sum(feats * attention_vectors, dim=1)
        return feats_V


class SKUnit(nn.Module):
    def __init__(self, in_features, mid_features, out_features, stride=1):
        super().__init__()
        self.conv1 = nn.Sequential(
            nn.Conv2d(in_features, mid_features, 1, stride=1, bias=False),
            nn.BatchNorm2d(mid_features),
            nn.ReLU(inplace=True),
        )
        self.conv2_sk = SKConv(mid_features, stride=stride)
        self.conv3 = nn.Sequential(
            nn.Conv2d(mid_features, out_features, 1, stride=1, bias=False), nn.BatchNorm2d(out_features)
        )
        if stride == 1 and in_features == out_features:
            self.shortcut = nn.Sequential()
        else:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_features, out_features, 1, stride=stride, bias=False), nn.BatchNorm2d(out_features)
            )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        residual = x
        out = self.conv1(x)
        out = self.conv2_sk(out)
        out = self.conv3(out)
        return self.relu(out + self.shortcut(residual))


class SKNet(nn.Module):
    def __init__(self, classes=5, widths=(8, 16)):
        super().__init__()
        self.basic_conv = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 2, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True)
        )
        self.stage_1 = nn.Sequential(
            SKUnit(widths[0], widths[0], widths[1], stride=1), SKUnit(widths[1], widths[0], widths[1])
        )
        self.stage_2 = nn.Sequential(SKUnit(widths[1], widths[1], widths[1] * 2, stride=2))
        self.gap = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Linear(widths[1] * 2, classes)

    def forward(self, x):
        fea = self.basic_conv(x)
        fea = self.stage_1(fea)
        fea = self.stage_2(fea)
        fea = self.gap(fea)
        fea = torch.squeeze(fea)
        return self.classifier(fea)


# ----- FFDNet: pixel_unshuffle front end with a noise-level map, pixel_shuffle back -------------------
class FFDNet(nn.Module):
    def __init__(self, channels=1, features=16, depth=4):
        super().__init__()
        layers = [nn.Conv2d(channels * 4 + 1, features, 3, padding=1), nn.ReLU(inplace=True)]
        for _ in range(depth - 2):
            layers += [
                nn.Conv2d(features, features, 3, padding=1, bias=False),
                nn.BatchNorm2d(features),
                nn.ReLU(inplace=True),
            ]
        layers += [nn.Conv2d(features, channels * 4, 3, padding=1)]
        self.body = nn.Sequential(*layers)

    def forward(self, x, sigma_map):
        x = F.pixel_unshuffle(x, 2)
        x = torch.cat((x, sigma_map), 1)
        return F.pixel_shuffle(self.body(x), 2)


# ----- ConvNeXt: channels_last blocks by permute, nn.LayerNorm / a channels_first LayerNorm class ---------
class ConvNeXtLayerNorm(nn.Module):
    """LayerNorm over channels for channels_last (F.layer_norm) or channels_first (by hand) data."""

    def __init__(self, normalized_shape, eps=1e-6, data_format="channels_last"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = eps
        self.data_format = data_format
        self.normalized_shape = (normalized_shape,)

    def forward(self, x):
        if self.data_format == "channels_last":
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class ConvNeXtStageBlock(nn.Module):
    def __init__(self, dim, layer_scale_init_value=1e-6):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = ConvNeXtLayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(layer_scale_init_value * torch.ones((dim,))) if layer_scale_init_value > 0 else None
        self.drop_path = nn.Identity()

    def forward(self, x):
        input = x
        x = self.dwconv(x)
        x = x.permute(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
        x = self.norm(x)
        x = self.pwconv1(x)
        x = self.act(x)
        x = self.pwconv2(x)
        if self.gamma is not None:
            x = self.gamma * x
        x = x.permute(0, 3, 1, 2)  # (N, H, W, C) -> (N, C, H, W)
        return input + self.drop_path(x)


class ConvNeXt(nn.Module):
    """ConvNeXt-T's layout at small widths: a 4x4 stride-4 stem, four stages with downsampling layers
    between them, global average pooling, a final LayerNorm and the head."""

    def __init__(
        self, in_chans=3, num_classes=5, depths=(1, 1, 2, 1), dims=(8, 16, 24, 32), layer_scale_init_value=0.5
    ):
        super().__init__()
        self.downsample_layers = nn.ModuleList()
        stem = nn.Sequential(
            nn.Conv2d(in_chans, dims[0], kernel_size=4, stride=4),
            ConvNeXtLayerNorm(dims[0], eps=1e-6, data_format="channels_first"),
        )
        self.downsample_layers.append(stem)
        for i in range(3):
            downsample_layer = nn.Sequential(
                ConvNeXtLayerNorm(dims[i], eps=1e-6, data_format="channels_first"),
                nn.Conv2d(dims[i], dims[i + 1], kernel_size=2, stride=2),
            )
            self.downsample_layers.append(downsample_layer)
        self.stages = nn.ModuleList()
        for i in range(4):
            stage = nn.Sequential(
                *[
                    ConvNeXtStageBlock(dim=dims[i], layer_scale_init_value=layer_scale_init_value)
                    for _ in range(depths[i])
                ]
            )
            self.stages.append(stage)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)

    def forward_features(self, x):
        for i in range(4):
            x = self.downsample_layers[i](x)
            x = self.stages[i](x)
        return self.norm(x.mean([-2, -1]))  # global average pooling, (N, C, H, W) -> (N, C)

    def forward(self, x):
        return self.head(self.forward_features(x))
