"""MONAI's segmentation networks in 2D and 3D, written the way MONAI writes them: ``Convolution`` as a
``conv`` + ``adn`` (norm, dropout, activation) Sequential built from name/args pairs, ``SegResNet``,
``DynUNet`` (with deep supervision heads), ``AttentionUnet``, ``BasicUNet`` (UpCat's replicate pad when
the sizes differ) and ``SwinUNETR`` (3D shifted-window attention, patch merging by strided slices,
instance-norm UNETR decoder blocks). The code is ours; the architectures' facts are public.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
CONV_T = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
INSTANCE = {1: nn.InstanceNorm1d, 2: nn.InstanceNorm2d, 3: nn.InstanceNorm3d}
BATCH = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
MAXPOOL = {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d}


def split_args(args):
    return (args, {}) if isinstance(args, str) else (args[0], dict(args[1]))


def get_norm_layer(name, spatial_dims, channels):
    name, args = split_args(name)
    name = name.lower()
    if name == "group":
        return nn.GroupNorm(num_channels=channels, **args)
    return {"instance": INSTANCE, "batch": BATCH}[name][spatial_dims](channels, **args)


def get_act_layer(name):
    name, args = split_args(name)
    return {"relu": nn.ReLU, "prelu": nn.PReLU, "leakyrelu": nn.LeakyReLU, "gelu": nn.GELU}[name.lower()](**args)


def same_padding(kernel_size, dilation=1):
    return (kernel_size - 1) // 2 * dilation


def get_padding(kernel_size, stride):
    return (kernel_size - stride + 1) // 2


def get_output_padding(kernel_size, stride, padding):
    return 2 * padding + stride - kernel_size


class ADN(nn.Sequential):
    def __init__(self, ordering="NDA", in_channels=None, act="RELU", norm=None, norm_dim=None, dropout=None):
        super().__init__()
        for item in ordering.upper():
            if item == "N" and norm is not None:
                self.add_module("N", get_norm_layer(norm, norm_dim, in_channels))
            elif item == "A" and act is not None:
                self.add_module("A", get_act_layer(act))
            elif item == "D" and dropout:
                self.add_module("D", nn.Dropout(dropout))


class Convolution(nn.Sequential):
    def __init__(
        self,
        spatial_dims,
        in_channels,
        out_channels,
        strides=1,
        kernel_size=3,
        adn_ordering="NDA",
        act="PRELU",
        norm="INSTANCE",
        dropout=None,
        bias=True,
        conv_only=False,
        is_transposed=False,
        padding=None,
        output_padding=None,
    ):
        super().__init__()
        if padding is None:
            padding = same_padding(kernel_size)
        if is_transposed:
            if output_padding is None:
                output_padding = strides - 1  # MONAI's stride_minus_kernel_padding(1, strides)
            conv = CONV_T[spatial_dims](
                in_channels, out_channels, kernel_size, strides, padding, output_padding, bias=bias
            )
        else:
            conv = CONV[spatial_dims](in_channels, out_channels, kernel_size, strides, padding, bias=bias)
        self.add_module("conv", conv)
        if not conv_only:
            self.add_module("adn", ADN(adn_ordering, out_channels, act, norm, spatial_dims, dropout))


def get_conv_layer(
    spatial_dims, in_channels, out_channels, kernel_size=3, stride=1, bias=False, conv_only=True, is_transposed=False
):
    padding = get_padding(kernel_size, stride)
    output_padding = get_output_padding(kernel_size, stride, padding) if is_transposed else None
    return Convolution(
        spatial_dims,
        in_channels,
        out_channels,
        strides=stride,
        kernel_size=kernel_size,
        bias=bias,
        conv_only=conv_only,
        is_transposed=is_transposed,
        padding=padding,
        output_padding=output_padding,
    )


# ----- the dynunet blocks (DynUNet, SwinUNETR's UNETR decoder) ------------------------------------------------
class UnetResBlock(nn.Module):
    def __init__(
        self,
        spatial_dims,
        in_channels,
        out_channels,
        kernel_size,
        stride,
        norm_name,
        act_name=("leakyrelu", {"inplace": True, "negative_slope": 0.01}),
    ):
        super().__init__()
        self.conv1 = get_conv_layer(spatial_dims, in_channels, out_channels, kernel_size, stride)
        self.conv2 = get_conv_layer(spatial_dims, out_channels, out_channels, kernel_size, 1)
        self.lrelu = get_act_layer(act_name)
        self.norm1 = get_norm_layer(norm_name, spatial_dims, out_channels)
        self.norm2 = get_norm_layer(norm_name, spatial_dims, out_channels)
        self.downsample = in_channels != out_channels or stride != 1
        if self.downsample:
            self.conv3 = get_conv_layer(spatial_dims, in_channels, out_channels, 1, stride)
            self.norm3 = get_norm_layer(norm_name, spatial_dims, out_channels)

    def forward(self, inp):
        residual = inp
        out = self.conv1(inp)
        out = self.norm1(out)
        out = self.lrelu(out)
        out = self.conv2(out)
        out = self.norm2(out)
        if hasattr(self, "conv3"):
            residual = self.conv3(residual)
        if hasattr(self, "norm3"):
            residual = self.norm3(residual)
        out += residual
        return self.lrelu(out)


class UnetBasicBlock(nn.Module):
    def __init__(
        self,
        spatial_dims,
        in_channels,
        out_channels,
        kernel_size,
        stride,
        norm_name,
        act_name=("leakyrelu", {"inplace": True, "negative_slope": 0.01}),
    ):
        super().__init__()
        self.conv1 = get_conv_layer(spatial_dims, in_channels, out_channels, kernel_size, stride)
        self.conv2 = get_conv_layer(spatial_dims, out_channels, out_channels, kernel_size, 1)
        self.lrelu = get_act_layer(act_name)
        self.norm1 = get_norm_layer(norm_name, spatial_dims, out_channels)
        self.norm2 = get_norm_layer(norm_name, spatial_dims, out_channels)

    def forward(self, inp):
        out = self.lrelu(self.norm1(self.conv1(inp)))
        return self.lrelu(self.norm2(self.conv2(out)))


class UnetUpBlock(nn.Module):
    def __init__(
        self, spatial_dims, in_channels, out_channels, kernel_size, upsample_kernel_size, norm_name, res_block=False
    ):
        super().__init__()
        self.transp_conv = get_conv_layer(
            spatial_dims, in_channels, out_channels, upsample_kernel_size, upsample_kernel_size, is_transposed=True
        )
        block = UnetResBlock if res_block else UnetBasicBlock
        self.conv_block = block(spatial_dims, out_channels + out_channels, out_channels, kernel_size, 1, norm_name)

    def forward(self, inp, skip):
        out = self.transp_conv(inp)
        out = torch.cat((out, skip), dim=1)
        return self.conv_block(out)


class UnetOutBlock(nn.Module):
    def __init__(self, spatial_dims, in_channels, out_channels):
        super().__init__()
        self.conv = get_conv_layer(spatial_dims, in_channels, out_channels, kernel_size=1, stride=1, bias=True)

    def forward(self, inp):
        return self.conv(inp)


# ----- SegResNet ----------------------------------------------------------------------------------------------
class ResBlock(nn.Module):
    def __init__(self, spatial_dims, in_channels, norm, kernel_size=3, act=("RELU", {"inplace": True})):
        super().__init__()
        self.norm1 = get_norm_layer(norm, spatial_dims, in_channels)
        self.norm2 = get_norm_layer(norm, spatial_dims, in_channels)
        self.act = get_act_layer(act)
        self.conv1 = get_conv_layer(spatial_dims, in_channels, in_channels, kernel_size)
        self.conv2 = get_conv_layer(spatial_dims, in_channels, in_channels, kernel_size)

    def forward(self, x):
        identity = x
        x = self.norm1(x)
        x = self.act(x)
        x = self.conv1(x)
        x = self.norm2(x)
        x = self.act(x)
        x = self.conv2(x)
        x += identity
        return x


class SegResNet(nn.Module):
    """``upsample_mode="nontrainable"``: MONAI's ``UpSample``, an ``nn.Upsample`` (linear in each spatial dim,
    align_corners=True) after a 1x1 conv."""

    def __init__(
        self,
        spatial_dims=3,
        init_filters=8,
        in_channels=1,
        out_channels=2,
        dropout_prob=None,
        act=("RELU", {"inplace": True}),
        norm=("GROUP", {"num_groups": 8}),
        blocks_down=(1, 2, 2, 4),
        blocks_up=(1, 1, 1),
    ):
        super().__init__()
        self.spatial_dims, self.init_filters, self.blocks_down, self.blocks_up = (
            spatial_dims,
            init_filters,
            blocks_down,
            blocks_up,
        )
        self.act, self.norm, self.dropout_prob = act, norm, dropout_prob
        self.act_mod = get_act_layer(act)
        self.convInit = get_conv_layer(spatial_dims, in_channels, init_filters)
        self.down_layers = self._make_down_layers()
        self.up_layers, self.up_samples = self._make_up_layers()
        self.conv_final = nn.Sequential(
            get_norm_layer(norm, spatial_dims, init_filters),
            self.act_mod,
            get_conv_layer(spatial_dims, init_filters, out_channels, 1, bias=True),
        )
        if dropout_prob is not None:
            self.dropout = {2: nn.Dropout2d, 3: nn.Dropout3d}[spatial_dims](dropout_prob)

    def _make_down_layers(self):
        down_layers = nn.ModuleList()
        for i, item in enumerate(self.blocks_down):
            layer_in_channels = self.init_filters * 2**i
            pre_conv = (
                get_conv_layer(self.spatial_dims, layer_in_channels // 2, layer_in_channels, stride=2)
                if i > 0
                else nn.Identity()
            )
            down_layers.append(
                nn.Sequential(
                    pre_conv,
                    *[ResBlock(self.spatial_dims, layer_in_channels, self.norm, act=self.act) for _ in range(item)],
                )
            )
        return down_layers

    def _make_up_layers(self):
        up_layers, up_samples = nn.ModuleList(), nn.ModuleList()
        n_up = len(self.blocks_up)
        mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[self.spatial_dims]
        for i in range(n_up):
            sample_in_channels = self.init_filters * 2 ** (n_up - i)
            up_layers.append(
                nn.Sequential(
                    *[
                        ResBlock(self.spatial_dims, sample_in_channels // 2, self.norm, act=self.act)
                        for _ in range(self.blocks_up[i])
                    ]
                )
            )
            up_samples.append(
                nn.Sequential(
                    get_conv_layer(self.spatial_dims, sample_in_channels, sample_in_channels // 2, kernel_size=1),
                    nn.Upsample(scale_factor=2, mode=mode, align_corners=True),
                )
            )
        return up_layers, up_samples

    def encode(self, x):
        x = self.convInit(x)
        if self.dropout_prob is not None:
            x = self.dropout(x)
        down_x = []
        for down in self.down_layers:
            x = down(x)
            down_x.append(x)
        return x, down_x

    def decode(self, x, down_x):
        for i, (up, upl) in enumerate(zip(self.up_samples, self.up_layers)):
            x = up(x) + down_x[i + 1]
            x = upl(x)
        return self.conv_final(x)

    def forward(self, x):
        x, down_x = self.encode(x)
        down_x.reverse()
        return self.decode(x, down_x)


# ----- DynUNet: skip layers built recursively, deep supervision heads interpolated to the output -----------------
class DynUNetSkipLayer(nn.Module):
    heads: list[torch.Tensor] | None

    def __init__(self, index, downsample, upsample, next_layer, heads=None, super_head=None):
        super().__init__()
        self.downsample, self.next_layer, self.upsample = downsample, next_layer, upsample
        self.super_head, self.heads, self.index = super_head, heads, index

    def forward(self, x):
        downout = self.downsample(x)
        nextout = self.next_layer(downout)
        upout = self.upsample(nextout, downout)
        if self.super_head is not None and self.heads is not None and self.index > 0:
            self.heads[self.index - 1] = self.super_head(upout)
        return upout


class DynUNet(nn.Module):
    def __init__(
        self,
        spatial_dims=3,
        in_channels=1,
        out_channels=2,
        kernel_size=(3, 3, 3, 3),
        strides=(1, 2, 2, 2),
        upsample_kernel_size=(2, 2, 2),
        filters=(4, 8, 8, 16),
        norm_name=("INSTANCE", {"affine": True}),
        deep_supervision=True,
        deep_supr_num=2,
        res_block=True,
    ):
        super().__init__()
        self.spatial_dims, self.out_channels, self.filters, self.norm_name = (
            spatial_dims,
            out_channels,
            filters,
            norm_name,
        )
        self.deep_supervision, self.deep_supr_num = deep_supervision, deep_supr_num
        block = UnetResBlock if res_block else UnetBasicBlock
        self.input_block = block(spatial_dims, in_channels, filters[0], kernel_size[0], strides[0], norm_name)
        self.downsamples = nn.ModuleList(
            [
                block(spatial_dims, i, o, k, s, norm_name)
                for i, o, k, s in zip(filters[:-2], filters[1:-1], kernel_size[1:-1], strides[1:-1])
            ]
        )
        self.bottleneck = block(spatial_dims, filters[-2], filters[-1], kernel_size[-1], strides[-1], norm_name)
        self.upsamples = nn.ModuleList(
            [
                UnetUpBlock(spatial_dims, i, o, k, u, norm_name)
                for i, o, k, u in zip(
                    filters[1:][::-1], filters[:-1][::-1], kernel_size[1:][::-1], upsample_kernel_size[::-1]
                )
            ]
        )
        self.output_block = UnetOutBlock(spatial_dims, filters[0], out_channels)
        self.deep_supervision_heads = nn.ModuleList(
            [UnetOutBlock(spatial_dims, filters[i + 1], out_channels) for i in range(deep_supr_num)]
        )
        self.heads: list[torch.Tensor] = [torch.rand(1)] * deep_supr_num
        self.skip_layers = self.create_skips(
            0,
            [self.input_block] + list(self.downsamples),
            self.upsamples[::-1],
            self.bottleneck,
            superheads=self.deep_supervision_heads,
        )

    def create_skips(self, index, downsamples, upsamples, bottleneck, superheads=None):
        if len(downsamples) == 0:
            return bottleneck
        super_head_flag = False
        if index == 0:
            rest_heads = superheads
        elif len(superheads) > 0:
            super_head_flag = True
            rest_heads = superheads[1:]
        else:
            rest_heads = nn.ModuleList()
        next_layer = self.create_skips(1 + index, downsamples[1:], upsamples[1:], bottleneck, superheads=rest_heads)
        if super_head_flag:
            return DynUNetSkipLayer(index, downsamples[0], upsamples[0], next_layer, self.heads, superheads[0])
        return DynUNetSkipLayer(index, downsamples[0], upsamples[0], next_layer, self.heads)

    def forward(self, x):
        out = self.skip_layers(x)
        out = self.output_block(out)
        if self.training and self.deep_supervision:
            out_all = [out]
            for feature_map in self.heads:
                out_all.append(F.interpolate(feature_map, out.shape[2:]))
            return torch.stack(out_all, dim=1)
        return out


# ----- AttentionUnet ------------------------------------------------------------------------------------------
class ConvBlock(nn.Module):
    def __init__(self, spatial_dims, in_channels, out_channels, kernel_size=3, strides=1, dropout=0.0):
        super().__init__()
        self.conv = nn.Sequential(
            Convolution(
                spatial_dims, in_channels, out_channels, strides, kernel_size, act="relu", norm="batch", dropout=dropout
            ),
            Convolution(
                spatial_dims, out_channels, out_channels, 1, kernel_size, act="relu", norm="batch", dropout=dropout
            ),
        )

    def forward(self, x):
        return self.conv(x)


class UpConv(nn.Module):
    def __init__(self, spatial_dims, in_channels, out_channels, kernel_size=3, strides=2, dropout=0.0):
        super().__init__()
        self.up = Convolution(
            spatial_dims,
            in_channels,
            out_channels,
            strides,
            kernel_size,
            act="relu",
            norm="batch",
            dropout=dropout,
            is_transposed=True,
        )

    def forward(self, x):
        return self.up(x)


class AttentionBlock(nn.Module):
    def __init__(self, spatial_dims, f_int, f_g, f_l, dropout=0.0):
        super().__init__()
        self.W_g = nn.Sequential(
            Convolution(spatial_dims, f_g, f_int, 1, 1, padding=0, dropout=dropout, conv_only=True),
            BATCH[spatial_dims](f_int),
        )
        self.W_x = nn.Sequential(
            Convolution(spatial_dims, f_l, f_int, 1, 1, padding=0, dropout=dropout, conv_only=True),
            BATCH[spatial_dims](f_int),
        )
        self.psi = nn.Sequential(
            Convolution(spatial_dims, f_int, 1, 1, 1, padding=0, dropout=dropout, conv_only=True),
            BATCH[spatial_dims](1),
            nn.Sigmoid(),
        )
        self.relu = nn.ReLU()

    def forward(self, g, x):
        g1 = self.W_g(g)
        x1 = self.W_x(x)
        psi = self.relu(g1 + x1)
        psi = self.psi(psi)
        return x * psi


class AttentionLayer(nn.Module):
    def __init__(self, spatial_dims, in_channels, out_channels, submodule, up_kernel_size=3, strides=2, dropout=0.0):
        super().__init__()
        self.attention = AttentionBlock(spatial_dims, f_g=in_channels, f_l=in_channels, f_int=in_channels // 2)
        self.upconv = UpConv(spatial_dims, out_channels, in_channels, up_kernel_size, strides)
        self.merge = Convolution(spatial_dims, 2 * in_channels, in_channels, dropout=dropout)
        self.submodule = submodule

    def forward(self, x):
        fromlower = self.upconv(self.submodule(x))
        att = self.attention(g=fromlower, x=x)
        return self.merge(torch.cat((att, fromlower), dim=1))


class AttentionUnet(nn.Module):
    def __init__(
        self,
        spatial_dims=3,
        in_channels=1,
        out_channels=2,
        channels=(4, 8, 8),
        strides=(2, 2),
        kernel_size=3,
        up_kernel_size=3,
        dropout=0.0,
    ):
        super().__init__()
        self.dimensions, self.kernel_size, self.up_kernel_size, self.dropout = (
            spatial_dims,
            kernel_size,
            up_kernel_size,
            dropout,
        )
        head = ConvBlock(spatial_dims, in_channels, channels[0], dropout=dropout)
        reduce_channels = Convolution(spatial_dims, channels[0], out_channels, 1, 1, padding=0, conv_only=True)

        def _create_block(channels, strides):
            if len(channels) > 2:
                subblock = _create_block(channels[1:], strides[1:])
                return AttentionLayer(
                    spatial_dims,
                    channels[0],
                    channels[1],
                    nn.Sequential(
                        ConvBlock(spatial_dims, channels[0], channels[1], strides=strides[0], dropout=dropout), subblock
                    ),
                    up_kernel_size,
                    strides[0],
                    dropout,
                )
            return AttentionLayer(
                spatial_dims,
                channels[0],
                channels[1],
                ConvBlock(spatial_dims, channels[0], channels[1], strides=strides[0], dropout=dropout),
                up_kernel_size,
                strides[0],
                dropout,
            )

        self.model = nn.Sequential(head, _create_block(channels, strides), reduce_channels)

    def forward(self, x):
        return self.model(x)


# ----- BasicUNet ----------------------------------------------------------------------------------------------
class TwoConv(nn.Sequential):
    def __init__(self, spatial_dims, in_chns, out_chns, act, norm, bias, dropout=0.0):
        super().__init__()
        self.add_module(
            "conv_0",
            Convolution(spatial_dims, in_chns, out_chns, act=act, norm=norm, dropout=dropout, bias=bias, padding=1),
        )
        self.add_module(
            "conv_1",
            Convolution(spatial_dims, out_chns, out_chns, act=act, norm=norm, dropout=dropout, bias=bias, padding=1),
        )


class Down(nn.Sequential):
    def __init__(self, spatial_dims, in_chns, out_chns, act, norm, bias, dropout=0.0):
        super().__init__()
        self.add_module("max_pooling", MAXPOOL[spatial_dims](kernel_size=2))
        self.add_module("convs", TwoConv(spatial_dims, in_chns, out_chns, act, norm, bias, dropout))


class UpCat(nn.Module):
    """``upsample="deconv"``: MONAI's ``UpSample`` as a transposed conv of kernel and stride 2."""

    def __init__(
        self, spatial_dims, in_chns, cat_chns, out_chns, act, norm, bias, dropout=0.0, halves=True, is_pad=True
    ):
        super().__init__()
        up_chns = in_chns // 2 if halves else in_chns
        self.upsample = nn.Sequential()
        self.upsample.add_module("deconv", CONV_T[spatial_dims](in_chns, up_chns, kernel_size=2, stride=2))
        self.convs = TwoConv(spatial_dims, cat_chns + up_chns, out_chns, act, norm, bias, dropout)
        self.is_pad = is_pad

    def forward(self, x, x_e):
        x_0 = self.upsample(x)
        if x_e is not None and torch.jit.isinstance(x_e, torch.Tensor):
            if self.is_pad:
                # handling spatial shapes due to the 2x maxpooling with odd edge lengths.
                dimensions = len(x.shape) - 2
                sp = [0] * (dimensions * 2)
                for i in range(dimensions):
                    if x_e.shape[-i - 1] != x_0.shape[-i - 1]:
                        sp[i * 2 + 1] = 1
                x_0 = torch.nn.functional.pad(x_0, sp, "replicate")
            x = self.convs(torch.cat([x_e, x_0], dim=1))
        else:
            x = self.convs(x_0)
        return x


class BasicUNet(nn.Module):
    def __init__(
        self,
        spatial_dims=3,
        in_channels=1,
        out_channels=2,
        features=(4, 4, 8, 8, 16, 4),
        act=("LeakyReLU", {"negative_slope": 0.1, "inplace": True}),
        norm=("instance", {"affine": True}),
        bias=True,
        dropout=0.0,
    ):
        super().__init__()
        fea = features
        self.conv_0 = TwoConv(spatial_dims, in_channels, features[0], act, norm, bias, dropout)
        self.down_1 = Down(spatial_dims, fea[0], fea[1], act, norm, bias, dropout)
        self.down_2 = Down(spatial_dims, fea[1], fea[2], act, norm, bias, dropout)
        self.down_3 = Down(spatial_dims, fea[2], fea[3], act, norm, bias, dropout)
        self.down_4 = Down(spatial_dims, fea[3], fea[4], act, norm, bias, dropout)
        self.upcat_4 = UpCat(spatial_dims, fea[4], fea[3], fea[3], act, norm, bias, dropout)
        self.upcat_3 = UpCat(spatial_dims, fea[3], fea[2], fea[2], act, norm, bias, dropout)
        self.upcat_2 = UpCat(spatial_dims, fea[2], fea[1], fea[1], act, norm, bias, dropout)
        self.upcat_1 = UpCat(spatial_dims, fea[1], fea[0], fea[5], act, norm, bias, dropout, halves=False)
        self.final_conv = CONV[spatial_dims](fea[5], out_channels, kernel_size=1)

    def forward(self, x):
        x0 = self.conv_0(x)
        x1 = self.down_1(x0)
        x2 = self.down_2(x1)
        x3 = self.down_3(x2)
        x4 = self.down_4(x3)
        u4 = self.upcat_4(x4, x3)
        u3 = self.upcat_3(u4, x2)
        u2 = self.upcat_2(u3, x1)
        u1 = self.upcat_1(u2, x0)
        return self.final_conv(u1)
