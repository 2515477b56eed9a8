"""Whole classification and restoration networks written the way their authors write them, at small
widths: DenseNet's list of features given to ``torch.cat``, torchvision's ResNet-50 / ResNeXt
``Bottleneck`` with its ``downsample`` Sequential and ``_make_layer``, SE-ResNet and RegNetY's
squeeze-excitation gates, MobileNetV2 and EfficientNet-B0's inverted residuals, Res2Net's
``torch.split`` hierarchy, BiT's and NF-ResNet's weight-standardized convolutions, EDSR, RCAN, ESRGAN's
RRDBNet and Attention U-Net. The code is ours; the architectures' facts are public.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from torch import Tensor


# ----- DenseNet-121 (Huang et al. 2017), torchvision's layout ----------------------------------------
class _DenseLayer(nn.Module):
    def __init__(self, num_input_features, growth_rate, bn_size, drop_rate=0.0, memory_efficient=False):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(num_input_features)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(num_input_features, bn_size * growth_rate, kernel_size=1, stride=1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, kernel_size=3, stride=1, padding=1, bias=False)
        self.drop_rate = float(drop_rate)
        self.memory_efficient = memory_efficient

    def bn_function(self, inputs):
        concated_features = torch.cat(inputs, 1)
        bottleneck_output = self.conv1(self.relu1(self.norm1(concated_features)))
        return bottleneck_output

    def any_requires_grad(self, input):
        for tensor in input:
            if tensor.requires_grad:
                return True
        return False

    def call_checkpoint_bottleneck(self, input):
        def closure(*inputs):
            return self.bn_function(inputs)

        return cp.checkpoint(closure, *input, use_reentrant=False)

    def forward(self, input):
        if isinstance(input, Tensor):
            prev_features = [input]
        else:
            prev_features = input
        if self.memory_efficient and self.any_requires_grad(prev_features):
            bottleneck_output = self.call_checkpoint_bottleneck(prev_features)
        else:
            bottleneck_output = self.bn_function(prev_features)
        new_features = self.conv2(self.relu2(self.norm2(bottleneck_output)))
        if self.drop_rate > 0:
            new_features = F.dropout(new_features, p=self.drop_rate, training=self.training)
        return new_features


class _DenseBlock(nn.ModuleDict):
    def __init__(self, num_layers, num_input_features, bn_size, growth_rate, drop_rate=0.0, memory_efficient=False):
        super().__init__()
        for i in range(num_layers):
            layer = _DenseLayer(num_input_features + i * growth_rate, growth_rate, bn_size, drop_rate, memory_efficient)
            self.add_module("denselayer%d" % (i + 1), layer)

    def forward(self, init_features):
        features = [init_features]
        for name, layer in self.items():
            new_features = layer(features)
            features.append(new_features)
        return torch.cat(features, 1)


class _Transition(nn.Sequential):
    def __init__(self, num_input_features, num_output_features):
        super().__init__()
        self.norm = nn.BatchNorm2d(num_input_features)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(num_input_features, num_output_features, kernel_size=1, stride=1, bias=False)
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)


class DenseNet(nn.Module):
    """DenseNet-BC: 7x7 stem, max-pool, dense blocks joined by compressing transitions, final norm."""

    def __init__(
        self,
        growth_rate=8,
        block_config=(2, 2, 2),
        num_init_features=16,
        bn_size=2,
        drop_rate=0.0,
        num_classes=5,
        memory_efficient=False,
    ):
        super().__init__()
        self.features = nn.Sequential(
            OrderedDict(
                [
                    ("conv0", nn.Conv2d(3, num_init_features, kernel_size=7, stride=2, padding=3, bias=False)),
                    ("norm0", nn.BatchNorm2d(num_init_features)),
                    ("relu0", nn.ReLU(inplace=True)),
                    ("pool0", nn.MaxPool2d(kernel_size=3, stride=2, padding=1)),
                ]
            )
        )
        num_features = num_init_features
        for i, num_layers in enumerate(block_config):
            block = _DenseBlock(
                num_layers=num_layers,
                num_input_features=num_features,
                bn_size=bn_size,
                growth_rate=growth_rate,
                drop_rate=drop_rate,
                memory_efficient=memory_efficient,
            )
            self.features.add_module("denseblock%d" % (i + 1), block)
            num_features = num_features + num_layers * growth_rate
            if i != len(block_config) - 1:
                trans = _Transition(num_input_features=num_features, num_output_features=num_features // 2)
                self.features.add_module("transition%d" % (i + 1), trans)
                num_features = num_features // 2
        self.features.add_module("norm5", nn.BatchNorm2d(num_features))
        self.classifier = nn.Linear(num_features, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)
            elif isinstance(m, nn.Linear):
                nn.init.constant_(m.bias, 0)

    def forward(self, x):
        features = self.features(x)
        out = F.relu(features, inplace=True)
        out = F.adaptive_avg_pool2d(out, (1, 1))
        out = torch.flatten(out, 1)
        out = self.classifier(out)
        return out


# ----- ResNet-50 / ResNeXt (torchvision's Bottleneck, groups and width_per_group) ---------------------
def conv3x3(in_planes, out_planes, stride=1, groups=1, dilation=1):
    return nn.Conv2d(
        in_planes,
        out_planes,
        kernel_size=3,
        stride=stride,
        padding=dilation,
        groups=groups,
        bias=False,
        dilation=dilation,
    )


def conv1x1(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(
        self, inplanes, planes, stride=1, downsample=None, groups=1, base_width=64, dilation=1, norm_layer=None
    ):
        super().__init__()
        if norm_layer is None:
            norm_layer = nn.BatchNorm2d
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1 = conv1x1(inplanes, width)
        self.bn1 = norm_layer(width)
        self.conv2 = conv3x3(width, width, stride, groups, dilation)
        self.bn2 = norm_layer(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = norm_layer(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)

        out = self.conv3(out)
        out = self.bn3(out)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        out = self.relu(out)

        return out


class ResNet(nn.Module):
    def __init__(
        self,
        block=Bottleneck,
        layers=(2, 1, 1),
        planes=(4, 8, 8),
        num_classes=5,
        groups=1,
        width_per_group=64,
        zero_init_residual=False,
    ):
        super().__init__()
        self._norm_layer = nn.BatchNorm2d
        self.inplanes = 8
        self.dilation = 1
        self.groups = groups
        self.base_width = width_per_group
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = self._norm_layer(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, planes[0], layers[0])
        self.layer2 = self._make_layer(block, planes[1], layers[1], stride=2)
        self.layer3 = self._make_layer(block, planes[2], layers[2], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(planes[2] * block.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.constant_(m.bn3.weight, 0)

    def _make_layer(self, block, planes, blocks, stride=1):
        norm_layer = self._norm_layer
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                norm_layer(planes * block.expansion),
            )
        layers = []
        layers.append(
            block(self.inplanes, planes, stride, downsample, self.groups, self.base_width, self.dilation, norm_layer)
        )
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(
                block(
                    self.inplanes,
                    planes,
                    groups=self.groups,
                    base_width=self.base_width,
                    dilation=self.dilation,
                    norm_layer=norm_layer,
                )
            )
        return nn.Sequential(*layers)

    def _forward_impl(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)

        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)

        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x

    def forward(self, x):
        return self._forward_impl(x)


def resnext(**kwargs):
    """ResNeXt-50 (32x4d) in miniature: 4 groups, 16 channels per group at the first stage's planes."""
    return ResNet(Bottleneck, groups=4, width_per_group=32, **kwargs)


# ----- SE-ResNet (Hu et al. 2018) as the popular re-implementations write it -------------------------
class SELayer(nn.Module):
    def __init__(self, channel, reduction=4):
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Sequential(
            nn.Linear(channel, channel // reduction, bias=False),
            nn.ReLU(inplace=True),
            nn.Linear(channel // reduction, channel, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x):
        b, c, _, _ = x.size()
        y = self.avg_pool(x).view(b, c)
        y = self.fc(y).view(b, c, 1, 1)
        return x * y.expand_as(x)


class SELayerBroadcast(SELayer):
    """The same gate ending in ``x * y``, broadcasting y of [b, c, 1, 1] (as other ports write it)."""

    def forward(self, x):
        b, c, _, _ = x.size()
        y = self.avg_pool(x).view(b, c)
        y = self.fc(y).view(b, c, 1, 1)
        return x * y


class SEConvLayer(nn.Module):
    """The same gate with 1x1 convs on the pooled [N, C, 1, 1] map (timm's SEModule): no view."""

    def __init__(self, channel, reduction=4):
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Sequential(
            nn.Conv2d(channel, channel // reduction, kernel_size=1, bias=False),
            nn.ReLU(inplace=True),
            nn.Conv2d(channel // reduction, channel, kernel_size=1, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x):
        return x * self.fc(self.avg_pool(x))


class SEBasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, reduction=4, se_layer=SELayer):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes, 1)
        self.bn2 = nn.BatchNorm2d(planes)
        self.se = se_layer(planes, reduction)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        residual = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)
        out = self.se(out)

        if self.downsample is not None:
            residual = self.downsample(x)

        out += residual
        out = self.relu(out)

        return out


class SEResNet(nn.Module):
    """CIFAR-style SE-ResNet: 3x3 stem, three stages of SE basic blocks (strides 1, 2, 2)."""

    def __init__(self, widths=(8, 16, 32), blocks=(1, 1, 1), num_classes=5, reduction=4, se_layer="linear"):
        super().__init__()
        self.se_layer = {"linear": SELayer, "linear_broadcast": SELayerBroadcast, "conv": SEConvLayer}[se_layer]
        self.inplane = widths[0]
        self.conv1 = nn.Conv2d(3, self.inplane, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplane)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(widths[0], blocks[0], stride=1, reduction=reduction)
        self.layer2 = self._make_layer(widths[1], blocks[1], stride=2, reduction=reduction)
        self.layer3 = self._make_layer(widths[2], blocks[2], stride=2, reduction=reduction)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(widths[2], num_classes)

    def _make_layer(self, planes, blocks, stride, reduction):
        downsample = None
        if stride != 1 or self.inplane != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplane, planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )
        layers = [SEBasicBlock(self.inplane, planes, stride, downsample, reduction, self.se_layer)]
        self.inplane = planes
        for _ in range(1, blocks):
            layers.append(SEBasicBlock(self.inplane, planes, 1, None, reduction, self.se_layer))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)

        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)

        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        x = self.fc(x)
        return x


# ----- RegNetY (Radosavovic et al. 2020), torchvision's layout: group conv and an SE gate -------------
class SimpleStemIN(nn.Sequential):
    def __init__(self, width_in, width_out):
        super().__init__(
            nn.Conv2d(width_in, width_out, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(width_out),
            nn.ReLU(inplace=True),
        )


class SqueezeExcitation(nn.Module):
    def __init__(self, input_channels, squeeze_channels):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Sigmoid()

    def _scale(self, input):
        scale = self.avgpool(input)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        return self.scale_activation(scale)

    def forward(self, input):
        scale = self._scale(input)
        return scale * input


class BottleneckTransform(nn.Sequential):
    def __init__(self, width_in, width_out, stride, group_width, bottleneck_multiplier, se_ratio):
        layers = OrderedDict()
        w_b = int(round(width_out * bottleneck_multiplier))
        g = w_b // group_width
        layers["a"] = nn.Sequential(nn.Conv2d(width_in, w_b, 1, bias=False), nn.BatchNorm2d(w_b), nn.ReLU(inplace=True))
        layers["b"] = nn.Sequential(
            nn.Conv2d(w_b, w_b, 3, stride=stride, padding=1, groups=g, bias=False),
            nn.BatchNorm2d(w_b),
            nn.ReLU(inplace=True),
        )
        if se_ratio:
            width_se_out = int(round(se_ratio * width_in))
            layers["se"] = SqueezeExcitation(input_channels=w_b, squeeze_channels=width_se_out)
        layers["c"] = nn.Sequential(nn.Conv2d(w_b, width_out, 1, bias=False), nn.BatchNorm2d(width_out))
        super().__init__(layers)


class ResBottleneckBlock(nn.Module):
    def __init__(self, width_in, width_out, stride, group_width=1, bottleneck_multiplier=1.0, se_ratio=None):
        super().__init__()
        self.proj = None
        should_proj = (width_in != width_out) or (stride != 1)
        if should_proj:
            self.proj = nn.Sequential(
                nn.Conv2d(width_in, width_out, 1, stride=stride, bias=False), nn.BatchNorm2d(width_out)
            )
        self.f = BottleneckTransform(width_in, width_out, stride, group_width, bottleneck_multiplier, se_ratio)
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x):
        if self.proj is not None:
            x = self.proj(x) + self.f(x)
        else:
            x = x + self.f(x)
        return self.activation(x)


class AnyStage(nn.Sequential):
    def __init__(
        self,
        width_in,
        width_out,
        stride,
        depth,
        group_width,
        bottleneck_multiplier,
        se_ratio,
        stage_index,
        block_name="block{stage}-{index}",
    ):
        super().__init__()
        for i in range(depth):
            block = ResBottleneckBlock(
                width_in if i == 0 else width_out,
                width_out,
                stride if i == 0 else 1,
                group_width,
                bottleneck_multiplier,
                se_ratio,
            )
            self.add_module(block_name.format(stage=stage_index, index=i), block)


class RegNetY(nn.Module):
    def __init__(
        self,
        stem_width=8,
        widths=(16, 32),
        depths=(2, 1),
        group_width=8,
        se_ratio=0.25,
        num_classes=5,
        block_name="block{stage}-{index}",
    ):
        super().__init__()
        self.stem = SimpleStemIN(3, stem_width)
        current_width = stem_width
        blocks = []
        for i, (width_out, depth) in enumerate(zip(widths, depths)):
            blocks.append(
                (
                    f"block{i + 1}",
                    AnyStage(current_width, width_out, 2, depth, group_width, 1.0, se_ratio, i + 1, block_name),
                )
            )
            current_width = width_out
        self.trunk_output = nn.Sequential(OrderedDict(blocks))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(in_features=current_width, out_features=num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, mean=0.0, std=math.sqrt(2.0 / fan_out))

    def forward(self, x):
        x = self.stem(x)
        x = self.trunk_output(x)
        x = self.avgpool(x)
        x = x.flatten(start_dim=1)
        x = self.fc(x)
        return x


# ----- MobileNetV2 (Sandler et al. 2018) -----------------------------------------------------------------
def _make_divisible(v, divisor, min_value=None):
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNReLU(nn.Sequential):
    def __init__(self, in_planes, out_planes, kernel_size=3, stride=1, groups=1):
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(in_planes, out_planes, kernel_size, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_planes),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        self.stride = stride
        hidden_dim = int(round(inp * expand_ratio))
        self.use_res_connect = self.stride == 1 and inp == oup
        layers = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU(inp, hidden_dim, kernel_size=1))
        layers.extend(
            [
                ConvBNReLU(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim),
                nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),
                nn.BatchNorm2d(oup),
            ]
        )
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        else:
            return self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(
        self,
        num_classes=5,
        width_mult=0.25,
        round_nearest=8,
        dropout=0.0,
        inverted_residual_setting=None,
        last_channel=128,
    ):
        super().__init__()
        input_channel = 32
        if inverted_residual_setting is None:
            inverted_residual_setting = [
                # t, c, n, s
                [1, 16, 1, 1],
                [6, 24, 2, 2],
                [6, 32, 2, 2],
            ]
        input_channel = _make_divisible(input_channel * width_mult, round_nearest)
        self.last_channel = _make_divisible(last_channel * max(1.0, width_mult), round_nearest)
        features = [ConvBNReLU(3, input_channel, stride=2)]
        for t, c, n, s in inverted_residual_setting:
            output_channel = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                stride = s if i == 0 else 1
                features.append(InvertedResidual(input_channel, output_channel, stride, expand_ratio=t))
                input_channel = output_channel
        features.append(ConvBNReLU(input_channel, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.last_channel, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        x = self.classifier(x)
        return x


# ----- EfficientNet-B0 (Tan & Le 2019), timm-style MBConv with SiLU and an SE on x.mean((2, 3)) ---------
class SqueezeExcite(nn.Module):
    def __init__(self, in_chs, rd_ratio=0.25, rd_channels=None):
        super().__init__()
        if rd_channels is None:
            rd_channels = max(1, round(in_chs * rd_ratio))
        self.conv_reduce = nn.Conv2d(in_chs, rd_channels, 1, bias=True)
        self.act1 = nn.SiLU(inplace=True)
        self.conv_expand = nn.Conv2d(rd_channels, in_chs, 1, bias=True)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        x_se = x.mean((2, 3), keepdim=True)
        x_se = self.conv_reduce(x_se)
        x_se = self.act1(x_se)
        x_se = self.conv_expand(x_se)
        return x * self.gate(x_se)


class MBConv(nn.Module):
    def __init__(self, in_chs, out_chs, dw_kernel_size=3, stride=1, exp_ratio=6.0, se_ratio=0.25, drop_path_rate=0.0):
        super().__init__()
        mid_chs = _make_divisible(in_chs * exp_ratio, 4)
        self.has_skip = stride == 1 and in_chs == out_chs
        self.drop_path_rate = drop_path_rate
        if exp_ratio != 1:
            self.conv_pw = nn.Conv2d(in_chs, mid_chs, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(mid_chs)
            self.act1 = nn.SiLU(inplace=True)
        else:
            mid_chs = in_chs
            self.conv_pw = self.bn1 = self.act1 = nn.Identity()
        self.conv_dw = nn.Conv2d(
            mid_chs, mid_chs, dw_kernel_size, stride, padding=dw_kernel_size // 2, groups=mid_chs, bias=False
        )
        self.bn2 = nn.BatchNorm2d(mid_chs)
        self.act2 = nn.SiLU(inplace=True)
        self.se = SqueezeExcite(mid_chs, rd_channels=max(1, int(in_chs * se_ratio)))
        self.conv_pwl = nn.Conv2d(mid_chs, out_chs, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_chs)

    def forward(self, x):
        shortcut = x
        x = self.conv_pw(x)
        x = self.bn1(x)
        x = self.act1(x)
        x = self.conv_dw(x)
        x = self.bn2(x)
        x = self.act2(x)
        x = self.se(x)
        x = self.conv_pwl(x)
        x = self.bn3(x)
        if self.has_skip:
            if self.drop_path_rate > 0.0 and self.training:
                keep = 1 - self.drop_path_rate
                x = x * x.new_empty((x.shape[0], 1, 1, 1)).bernoulli_(keep).div_(keep)
            x = x + shortcut
        return x


class EfficientNet(nn.Module):
    def __init__(self, num_classes=5, stem_chs=8, num_features=32, drop_path_rate=0.0):
        super().__init__()
        # (kernel, stride, exp_ratio, out_chs, repeats): B0's first three stages, narrowed
        arch = [(3, 1, 1, 8, 1), (3, 2, 6, 12, 2), (5, 2, 6, 16, 1)]
        self.conv_stem = nn.Conv2d(3, stem_chs, 3, 2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(stem_chs)
        self.act1 = nn.SiLU(inplace=True)
        blocks, in_chs = [], stem_chs
        total, index = sum(repeats for *_, repeats in arch), 0
        for kernel, stride, exp_ratio, out_chs, repeats in arch:
            stage = []
            for i in range(repeats):
                stage.append(
                    MBConv(
                        in_chs,
                        out_chs,
                        kernel,
                        stride if i == 0 else 1,
                        exp_ratio,
                        drop_path_rate=drop_path_rate * index / total,
                    )
                )
                in_chs = out_chs
                index += 1
            blocks.append(nn.Sequential(*stage))
        self.blocks = nn.Sequential(*blocks)
        self.conv_head = nn.Conv2d(in_chs, num_features, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(num_features)
        self.act2 = nn.SiLU(inplace=True)
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(num_features, num_classes)

    def forward_features(self, x):
        x = self.act1(self.bn1(self.conv_stem(x)))
        x = self.blocks(x)
        return self.act2(self.bn2(self.conv_head(x)))

    def forward(self, x):
        x = self.forward_features(x)
        x = self.global_pool(x).flatten(1)
        return self.classifier(x)


# ----- Res2Net (Gao et al. 2019): Bottle2neck's split hierarchy ----------------------------------------
class Bottle2neck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, baseWidth=26, scale=4, stype="normal"):
        super().__init__()
        width = int(math.floor(planes * (baseWidth / 64.0)))
        self.conv1 = nn.Conv2d(inplanes, width * scale, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width * scale)
        if scale == 1:
            self.nums = 1
        else:
            self.nums = scale - 1
        if stype == "stage":
            self.pool = nn.AvgPool2d(kernel_size=3, stride=stride, padding=1)
        convs = []
        bns = []
        for i in range(self.nums):
            convs.append(nn.Conv2d(width, width, kernel_size=3, stride=stride, padding=1, bias=False))
            bns.append(nn.BatchNorm2d(width))
        self.convs = nn.ModuleList(convs)
        self.bns = nn.ModuleList(bns)
        self.conv3 = nn.Conv2d(width * scale, planes * self.expansion, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stype = stype
        self.scale = scale
        self.width = width

    def forward(self, x):
        residual = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        spx = torch.split(out, self.width, 1)
        outs = []
        for i in range(self.nums):
            if i == 0 or self.stype == "stage":
                sp = spx[i]
            else:
                sp = sp + spx[i]
            sp = self.convs[i](sp)
            sp = self.relu(self.bns[i](sp))
            outs.append(sp)
        if self.scale != 1 and self.stype == "normal":
            outs.append(spx[self.nums])
        elif self.scale != 1 and self.stype == "stage":
            outs.append(self.pool(spx[self.nums]))
        out = torch.cat(outs, 1)

        out = self.conv3(out)
        out = self.bn3(out)

        if self.downsample is not None:
            residual = self.downsample(x)

        out += residual
        out = self.relu(out)

        return out


class Res2Net(nn.Module):
    def __init__(self, layers=(1, 2), planes=(4, 8), baseWidth=64, scale=4, num_classes=5):
        super().__init__()
        self.inplanes = 8
        self.baseWidth = baseWidth
        self.scale = scale
        self.conv1 = nn.Conv2d(3, 8, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(Bottle2neck, planes[0], layers[0])
        self.layer2 = self._make_layer(Bottle2neck, planes[1], layers[1], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(planes[1] * Bottle2neck.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = []
        layers.append(
            block(
                self.inplanes,
                planes,
                stride,
                downsample=downsample,
                stype="stage",
                baseWidth=self.baseWidth,
                scale=self.scale,
            )
        )
        self.inplanes = planes * block.expansion
        for i in range(1, blocks):
            layers.append(block(self.inplanes, planes, baseWidth=self.baseWidth, scale=self.scale))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        x = self.fc(x)
        return x


# ----- BiT (Kolesnikov et al. 2020): pre-activation ResNetV2 with StdConv2d and GroupNorm --------------
class StdConv2d(nn.Conv2d):
    def forward(self, x):
        w = self.weight
        v, m = torch.var_mean(w, dim=[1, 2, 3], keepdim=True, unbiased=False)
        w = (w - m) / torch.sqrt(v + 1e-10)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class StdConv2dBatchNorm(nn.Conv2d):
    """timm's StdConv2d: the standardization as a batch_norm over the weight's [1, out, in * k * k] view."""

    def __init__(self, *args, eps=1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, x):
        weight = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1), None, None, training=True, momentum=0.0, eps=self.eps
        ).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class StdConv2dMeanVar(nn.Conv2d):
    """The same standardization with mean and var as separate calls (as in many ports of BiT)."""

    def __init__(self, *args, eps=1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, x):
        w = self.weight
        w = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / torch.sqrt(
            w.var(dim=(1, 2, 3), keepdim=True, unbiased=False) + self.eps
        )
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class PreActBottleneck(nn.Module):
    def __init__(self, cin, cout=None, cmid=None, stride=1, conv=StdConv2d, groups=4):
        super().__init__()
        cout = cout or cin
        cmid = cmid or cout // 4
        self.gn1 = nn.GroupNorm(groups, cin)
        self.conv1 = conv(cin, cmid, kernel_size=1, bias=False)
        self.gn2 = nn.GroupNorm(groups, cmid)
        self.conv2 = conv(cmid, cmid, kernel_size=3, stride=stride, padding=1, bias=False)
        self.gn3 = nn.GroupNorm(groups, cmid)
        self.conv3 = conv(cmid, cout, kernel_size=1, bias=False)
        self.relu = nn.ReLU(inplace=True)
        if stride != 1 or cin != cout:
            self.downsample = conv(cin, cout, kernel_size=1, stride=stride, bias=False)

    def forward(self, x):
        out = self.relu(self.gn1(x))
        residual = x
        if hasattr(self, "downsample"):
            residual = self.downsample(out)
        out = self.conv1(out)
        out = self.conv2(self.relu(self.gn2(out)))
        out = self.conv3(self.relu(self.gn3(out)))
        return out + residual


class ResNetV2(nn.Module):
    def __init__(self, block_units=(1, 1), wf=1, num_classes=5, conv="var_mean"):
        super().__init__()
        conv = {"var_mean": StdConv2d, "mean_var": StdConv2dMeanVar, "batch_norm": StdConv2dBatchNorm}[conv]
        self.root = nn.Sequential(
            OrderedDict(
                [
                    ("conv", conv(3, 8 * wf, kernel_size=7, stride=2, padding=3, bias=False)),
                    ("pad", nn.ConstantPad2d(1, 0)),
                    ("pool", nn.MaxPool2d(kernel_size=3, stride=2, padding=0)),
                ]
            )
        )
        self.body = nn.Sequential(
            OrderedDict(
                [
                    (
                        "block1",
                        nn.Sequential(
                            OrderedDict(
                                [("unit01", PreActBottleneck(cin=8 * wf, cout=16 * wf, cmid=4 * wf, conv=conv))]
                                + [
                                    (
                                        f"unit{i:02d}",
                                        PreActBottleneck(cin=16 * wf, cout=16 * wf, cmid=4 * wf, conv=conv),
                                    )
                                    for i in range(2, block_units[0] + 1)
                                ]
                            )
                        ),
                    ),
                    (
                        "block2",
                        nn.Sequential(
                            OrderedDict(
                                [
                                    (
                                        "unit01",
                                        PreActBottleneck(cin=16 * wf, cout=32 * wf, cmid=8 * wf, stride=2, conv=conv),
                                    )
                                ]
                                + [
                                    (
                                        f"unit{i:02d}",
                                        PreActBottleneck(cin=32 * wf, cout=32 * wf, cmid=8 * wf, conv=conv),
                                    )
                                    for i in range(2, block_units[1] + 1)
                                ]
                            )
                        ),
                    ),
                ]
            )
        )
        self.head = nn.Sequential(
            OrderedDict(
                [
                    ("gn", nn.GroupNorm(4, 32 * wf)),
                    ("relu", nn.ReLU(inplace=True)),
                    ("avg", nn.AdaptiveAvgPool2d(output_size=1)),
                    ("conv", nn.Conv2d(32 * wf, num_classes, kernel_size=1, bias=True)),
                ]
            )
        )

    def forward(self, x):
        x = self.head(self.body(self.root(x)))
        assert x.shape[-2:] == (1, 1)
        return x[..., 0, 0]


# ----- NF-ResNet (Brock et al. 2021), timm's ScaledStdConv2d through F.batch_norm --------------------
class ScaledStdConv2d(nn.Conv2d):
    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=None,
        dilation=1,
        groups=1,
        bias=True,
        gamma=1.0,
        eps=1e-6,
        gain_init=1.0,
    ):
        if padding is None:
            padding = ((stride - 1) + dilation * (kernel_size - 1)) // 2
        super().__init__(
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            bias=bias,
        )
        self.gain = nn.Parameter(torch.full((self.out_channels, 1, 1, 1), gain_init))
        self.scale = gamma * self.weight[0].numel() ** -0.5
        self.eps = eps

    def forward(self, x):
        weight = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1),
            None,
            None,
            weight=(self.gain * self.scale).view(-1),
            training=True,
            momentum=0.0,
            eps=self.eps,
        ).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


_nonlin_gamma = dict(relu=1.7139588594436646, silu=1.7881293296813965)


class NormFreeBlock(nn.Module):
    def __init__(self, in_chs, out_chs, stride=1, alpha=0.2, beta=1.0, bottle_ratio=0.25, gamma=1.0, skipinit=False):
        super().__init__()
        mid_chs = _make_divisible(out_chs * bottle_ratio, 4)
        self.alpha = alpha
        self.beta = beta
        if in_chs != out_chs or stride != 1:
            self.downsample = ScaledStdConv2d(in_chs, out_chs, 1, stride=stride, gamma=gamma)
        else:
            self.downsample = None
        self.act1 = nn.ReLU()
        self.conv1 = ScaledStdConv2d(in_chs, mid_chs, 1, gamma=gamma)
        self.act2 = nn.ReLU(inplace=True)
        self.conv2 = ScaledStdConv2d(mid_chs, mid_chs, 3, stride=stride, gamma=gamma)
        self.act3 = nn.ReLU()
        self.conv3 = ScaledStdConv2d(mid_chs, out_chs, 1, gamma=gamma)
        self.skipinit_gain = nn.Parameter(torch.tensor(0.5)) if skipinit else None  # timm inits it at 0.

    def forward(self, x):
        out = self.act1(x) * self.beta
        shortcut = x
        if self.downsample is not None:
            shortcut = self.downsample(out)
        out = self.conv1(out)
        out = self.conv2(self.act2(out))
        out = self.conv3(self.act3(out))
        if self.skipinit_gain is not None:
            out.mul_(self.skipinit_gain)
        out = out * self.alpha + shortcut
        return out


class NFResNet(nn.Module):
    def __init__(self, num_classes=5, widths=(16, 32), stem_chs=8, skipinit=False):
        super().__init__()
        gamma = _nonlin_gamma["relu"]
        self.stem = nn.Sequential(
            OrderedDict(
                [
                    ("conv", ScaledStdConv2d(3, stem_chs, 3, stride=2, gamma=gamma)),
                    ("pool", nn.MaxPool2d(3, stride=2, padding=1)),
                ]
            )
        )
        stages, prev = [], stem_chs
        expected_var = 1.0
        for i, width in enumerate(widths):
            beta = 1.0 / expected_var**0.5
            stages.append(
                NormFreeBlock(
                    prev, width, stride=1 if i == 0 else 2, alpha=0.2, beta=beta, gamma=gamma, skipinit=skipinit
                )
            )
            expected_var += 0.2**2
            prev = width
        self.stages = nn.Sequential(*stages)
        self.final_act = nn.ReLU(inplace=True)
        self.head = nn.Linear(prev, num_classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.stages(x)
        x = self.final_act(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


# ----- EDSR (Lim et al. 2017) ----------------------------------------------------------------------------
def default_conv(in_channels, out_channels, kernel_size, bias=True):
    return nn.Conv2d(in_channels, out_channels, kernel_size, padding=(kernel_size // 2), bias=bias)


class MeanShift(nn.Conv2d):
    def __init__(self, rgb_range, rgb_mean=(0.4488, 0.4371, 0.4040), rgb_std=(1.0, 1.0, 1.0), sign=-1):
        super().__init__(3, 3, kernel_size=1)
        std = torch.Tensor(rgb_std)
        self.weight.data = torch.eye(3).view(3, 3, 1, 1) / std.view(3, 1, 1, 1)
        self.bias.data = sign * rgb_range * torch.Tensor(rgb_mean) / std
        for p in self.parameters():
            p.requires_grad = False


class ResBlock(nn.Module):
    def __init__(self, conv, n_feats, kernel_size, bias=True, bn=False, act=nn.ReLU(True), res_scale=1):
        super().__init__()
        m = []
        for i in range(2):
            m.append(conv(n_feats, n_feats, kernel_size, bias=bias))
            if bn:
                m.append(nn.BatchNorm2d(n_feats))
            if i == 0:
                m.append(act)
        self.body = nn.Sequential(*m)
        self.res_scale = res_scale

    def forward(self, x):
        res = self.body(x).mul(self.res_scale)
        res += x
        return res


class Upsampler(nn.Sequential):
    def __init__(self, conv, scale, n_feats, bn=False, act=False, bias=True):
        m = []
        if (scale & (scale - 1)) == 0:  # scale = 2^n
            for _ in range(int(math.log(scale, 2))):
                m.append(conv(n_feats, 4 * n_feats, 3, bias))
                m.append(nn.PixelShuffle(2))
                if bn:
                    m.append(nn.BatchNorm2d(n_feats))
                if act == "relu":
                    m.append(nn.ReLU(True))
        elif scale == 3:
            m.append(conv(n_feats, 9 * n_feats, 3, bias))
            m.append(nn.PixelShuffle(3))
        else:
            raise NotImplementedError
        super().__init__(*m)


class EDSR(nn.Module):
    def __init__(self, n_resblocks=2, n_feats=16, scale=2, res_scale=0.1, rgb_range=255, n_colors=3, conv=default_conv):
        super().__init__()
        kernel_size = 3
        act = nn.ReLU(True)
        self.sub_mean = MeanShift(rgb_range)
        self.add_mean = MeanShift(rgb_range, sign=1)
        m_head = [conv(n_colors, n_feats, kernel_size)]
        m_body = [ResBlock(conv, n_feats, kernel_size, act=act, res_scale=res_scale) for _ in range(n_resblocks)]
        m_body.append(conv(n_feats, n_feats, kernel_size))
        m_tail = [Upsampler(conv, scale, n_feats, act=False), conv(n_feats, n_colors, kernel_size)]
        self.head = nn.Sequential(*m_head)
        self.body = nn.Sequential(*m_body)
        self.tail = nn.Sequential(*m_tail)

    def forward(self, x):
        x = self.sub_mean(x)
        x = self.head(x)

        res = self.body(x)
        res += x

        x = self.tail(res)
        x = self.add_mean(x)

        return x


# ----- RCAN (Zhang et al. 2018): residual groups of channel-attention blocks -----------------------------
class CALayer(nn.Module):
    def __init__(self, channel, reduction=4):
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.conv_du = nn.Sequential(
            nn.Conv2d(channel, channel // reduction, 1, padding=0, bias=True),
            nn.ReLU(inplace=True),
            nn.Conv2d(channel // reduction, channel, 1, padding=0, bias=True),
            nn.Sigmoid(),
        )

    def forward(self, x):
        y = self.avg_pool(x)
        y = self.conv_du(y)
        return x * y


class RCAB(nn.Module):
    def __init__(self, conv, n_feat, kernel_size, reduction, bias=True, bn=False, act=nn.ReLU(True), res_scale=1):
        super().__init__()
        modules_body = []
        for i in range(2):
            modules_body.append(conv(n_feat, n_feat, kernel_size, bias=bias))
            if bn:
                modules_body.append(nn.BatchNorm2d(n_feat))
            if i == 0:
                modules_body.append(act)
        modules_body.append(CALayer(n_feat, reduction))
        self.body = nn.Sequential(*modules_body)
        self.res_scale = res_scale

    def forward(self, x):
        res = self.body(x)
        res += x
        return res


class ResidualGroup(nn.Module):
    def __init__(self, conv, n_feat, kernel_size, reduction, act, res_scale, n_resblocks):
        super().__init__()
        modules_body = [
            RCAB(conv, n_feat, kernel_size, reduction, bias=True, bn=False, act=nn.ReLU(True), res_scale=1)
            for _ in range(n_resblocks)
        ]
        modules_body.append(conv(n_feat, n_feat, kernel_size))
        self.body = nn.Sequential(*modules_body)

    def forward(self, x):
        res = self.body(x)
        res += x
        return res


class RCAN(nn.Module):
    def __init__(
        self,
        n_resgroups=2,
        n_resblocks=2,
        n_feats=16,
        reduction=4,
        scale=2,
        rgb_range=255,
        n_colors=3,
        res_scale=1,
        conv=default_conv,
    ):
        super().__init__()
        kernel_size = 3
        act = nn.ReLU(True)
        self.sub_mean = MeanShift(rgb_range)
        modules_head = [conv(n_colors, n_feats, kernel_size)]
        modules_body = [
            ResidualGroup(conv, n_feats, kernel_size, reduction, act=act, res_scale=res_scale, n_resblocks=n_resblocks)
            for _ in range(n_resgroups)
        ]
        modules_body.append(conv(n_feats, n_feats, kernel_size))
        modules_tail = [Upsampler(conv, scale, n_feats, act=False), conv(n_feats, n_colors, kernel_size)]
        self.add_mean = MeanShift(rgb_range, sign=1)
        self.head = nn.Sequential(*modules_head)
        self.body = nn.Sequential(*modules_body)
        self.tail = nn.Sequential(*modules_tail)

    def forward(self, x):
        x = self.sub_mean(x)
        x = self.head(x)

        res = self.body(x)
        res += x

        x = self.tail(res)
        x = self.add_mean(x)

        return x


# ----- RRDBNet (ESRGAN, Wang et al. 2018) ---------------------------------------------------------------
class ResidualDenseBlock_5C(nn.Module):
    def __init__(self, nf=16, gc=8, bias=True):
        super().__init__()
        self.conv1 = nn.Conv2d(nf, gc, 3, 1, 1, bias=bias)
        self.conv2 = nn.Conv2d(nf + gc, gc, 3, 1, 1, bias=bias)
        self.conv3 = nn.Conv2d(nf + 2 * gc, gc, 3, 1, 1, bias=bias)
        self.conv4 = nn.Conv2d(nf + 3 * gc, gc, 3, 1, 1, bias=bias)
        self.conv5 = nn.Conv2d(nf + 4 * gc, nf, 3, 1, 1, bias=bias)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)

    def forward(self, x):
        x1 = self.lrelu(self.conv1(x))
        x2 = self.lrelu(self.conv2(torch.cat((x, x1), 1)))
        x3 = self.lrelu(self.conv3(torch.cat((x, x1, x2), 1)))
        x4 = self.lrelu(self.conv4(torch.cat((x, x1, x2, x3), 1)))
        x5 = self.conv5(torch.cat((x, x1, x2, x3, x4), 1))
        return x5 * 0.2 + x


class RRDB(nn.Module):
    def __init__(self, nf, gc=8):
        super().__init__()
        self.RDB1 = ResidualDenseBlock_5C(nf, gc)
        self.RDB2 = ResidualDenseBlock_5C(nf, gc)
        self.RDB3 = ResidualDenseBlock_5C(nf, gc)

    def forward(self, x):
        out = self.RDB1(x)
        out = self.RDB2(out)
        out = self.RDB3(out)
        return out * 0.2 + x


class RRDBNet(nn.Module):
    def __init__(self, in_nc=3, out_nc=3, nf=16, nb=1, gc=8):
        super().__init__()
        self.conv_first = nn.Conv2d(in_nc, nf, 3, 1, 1, bias=True)
        self.RRDB_trunk = nn.Sequential(*[RRDB(nf=nf, gc=gc) for _ in range(nb)])
        self.trunk_conv = nn.Conv2d(nf, nf, 3, 1, 1, bias=True)
        self.upconv1 = nn.Conv2d(nf, nf, 3, 1, 1, bias=True)
        self.upconv2 = nn.Conv2d(nf, nf, 3, 1, 1, bias=True)
        self.HRconv = nn.Conv2d(nf, nf, 3, 1, 1, bias=True)
        self.conv_last = nn.Conv2d(nf, out_nc, 3, 1, 1, bias=True)
        self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)

    def forward(self, x):
        fea = self.conv_first(x)
        trunk = self.trunk_conv(self.RRDB_trunk(fea))
        fea = fea + trunk

        fea = self.lrelu(self.upconv1(F.interpolate(fea, scale_factor=2, mode="nearest")))
        fea = self.lrelu(self.upconv2(F.interpolate(fea, scale_factor=2, mode="nearest")))
        out = self.conv_last(self.lrelu(self.HRconv(fea)))

        return out


# ----- Attention U-Net (Oktay et al. 2018) ------------------------------------------------------------
class conv_block(nn.Module):
    def __init__(self, ch_in, ch_out):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(ch_in, ch_out, kernel_size=3, stride=1, padding=1, bias=True),
            nn.BatchNorm2d(ch_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(ch_out, ch_out, kernel_size=3, stride=1, padding=1, bias=True),
            nn.BatchNorm2d(ch_out),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        x = self.conv(x)
        return x


class up_conv(nn.Module):
    def __init__(self, ch_in, ch_out):
        super().__init__()
        self.up = nn.Sequential(
            nn.Upsample(scale_factor=2),
            nn.Conv2d(ch_in, ch_out, kernel_size=3, stride=1, padding=1, bias=True),
            nn.BatchNorm2d(ch_out),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        x = self.up(x)
        return x


class Attention_block(nn.Module):
    def __init__(self, F_g, F_l, F_int):
        super().__init__()
        self.W_g = nn.Sequential(
            nn.Conv2d(F_g, F_int, kernel_size=1, stride=1, padding=0, bias=True), nn.BatchNorm2d(F_int)
        )
        self.W_x = nn.Sequential(
            nn.Conv2d(F_l, F_int, kernel_size=1, stride=1, padding=0, bias=True), nn.BatchNorm2d(F_int)
        )
        self.psi = nn.Sequential(
            nn.Conv2d(F_int, 1, kernel_size=1, stride=1, padding=0, bias=True), nn.BatchNorm2d(1), nn.Sigmoid()
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, g, x):
        g1 = self.W_g(g)
        x1 = self.W_x(x)
        psi = self.relu(g1 + x1)
        psi = self.psi(psi)
        return x * psi


class AttU_Net(nn.Module):
    def __init__(self, img_ch=1, output_ch=1, widths=(8, 16, 32)):
        super().__init__()
        w1, w2, w3 = widths
        self.Maxpool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.Conv1 = conv_block(ch_in=img_ch, ch_out=w1)
        self.Conv2 = conv_block(ch_in=w1, ch_out=w2)
        self.Conv3 = conv_block(ch_in=w2, ch_out=w3)
        self.Up3 = up_conv(ch_in=w3, ch_out=w2)
        self.Att3 = Attention_block(F_g=w2, F_l=w2, F_int=w1)
        self.Up_conv3 = conv_block(ch_in=w3, ch_out=w2)
        self.Up2 = up_conv(ch_in=w2, ch_out=w1)
        self.Att2 = Attention_block(F_g=w1, F_l=w1, F_int=w1 // 2)
        self.Up_conv2 = conv_block(ch_in=w2, ch_out=w1)
        self.Conv_1x1 = nn.Conv2d(w1, output_ch, kernel_size=1, stride=1, padding=0)

    def forward(self, x):
        # encoding path
        x1 = self.Conv1(x)

        x2 = self.Maxpool(x1)
        x2 = self.Conv2(x2)

        x3 = self.Maxpool(x2)
        x3 = self.Conv3(x3)

        # decoding + concat path
        d3 = self.Up3(x3)
        x2 = self.Att3(g=d3, x=x2)
        d3 = torch.cat((x2, d3), dim=1)
        d3 = self.Up_conv3(d3)

        d2 = self.Up2(d3)
        x1 = self.Att2(g=d2, x=x1)
        d2 = torch.cat((x1, d2), dim=1)
        d2 = self.Up_conv2(d2)

        d1 = self.Conv_1x1(d2)

        return d1


# ----- Attention U-Net's grid attention gate as Oktay et al.'s own code writes it ------------------------
class GridAttentionBlock2D(nn.Module):
    """theta(x) strided by the sub-sample factor, phi(g) resized to it by ``size=theta_x.size()[2:]``, the
    one-channel psi resized back to ``size=input_size[2:]``, ``sigm_psi_f.expand_as(x) * x``, then W."""

    def __init__(
        self, in_channels, gating_channels, inter_channels=None, sub_sample_factor=(2, 2), mode="bilinear", expand=True
    ):
        super().__init__()
        self.upsample_mode = mode
        self.expand = expand
        if inter_channels is None:
            inter_channels = in_channels // 2
            if inter_channels == 0:
                inter_channels = 1
        self.W = nn.Sequential(
            nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0), nn.BatchNorm2d(in_channels)
        )
        self.theta = nn.Conv2d(
            in_channels, inter_channels, kernel_size=sub_sample_factor, stride=sub_sample_factor, padding=0, bias=False
        )
        self.phi = nn.Conv2d(gating_channels, inter_channels, kernel_size=1, stride=1, padding=0, bias=True)
        self.psi = nn.Conv2d(inter_channels, 1, kernel_size=1, stride=1, padding=0, bias=True)

    def forward(self, x, g):
        input_size = x.size()
        batch_size = input_size[0]
        assert batch_size == g.size(0)
        theta_x = self.theta(x)
        theta_x_size = theta_x.size()
        phi_g = F.interpolate(self.phi(g), size=theta_x_size[2:], mode=self.upsample_mode)
        f = F.relu(theta_x + phi_g, inplace=True)
        sigm_psi_f = torch.sigmoid(self.psi(f))
        sigm_psi_f = F.interpolate(sigm_psi_f, size=input_size[2:], mode=self.upsample_mode)
        if self.expand:
            y = sigm_psi_f.expand_as(x) * x
        else:
            y = sigm_psi_f * x
        W_y = self.W(y)
        return W_y, sigm_psi_f


class GridAttentionUNet(nn.Module):
    """Two levels of conv_block, gates on the skips gated by the coarser level, up by nn.Upsample."""

    def __init__(self, img_ch=1, output_ch=1, widths=(8, 16, 32), expand=True):
        super().__init__()
        w1, w2, w3 = widths
        self.maxpool = nn.MaxPool2d(kernel_size=2)
        self.conv1 = conv_block(img_ch, w1)
        self.conv2 = conv_block(w1, w2)
        self.center = conv_block(w2, w3)
        self.attentionblock2 = GridAttentionBlock2D(
            in_channels=w2, gating_channels=w3, inter_channels=w2, expand=expand
        )
        self.attentionblock1 = GridAttentionBlock2D(
            in_channels=w1, gating_channels=w2, inter_channels=w1, expand=expand
        )
        self.up = nn.Upsample(scale_factor=2, mode="bilinear")
        self.up_concat2 = conv_block(w3 + w2, w2)
        self.up_concat1 = conv_block(w2 + w1, w1)
        self.final = nn.Conv2d(w1, output_ch, 1)

    def forward(self, inputs):
        conv1 = self.conv1(inputs)
        conv2 = self.conv2(self.maxpool(conv1))
        center = self.center(self.maxpool(conv2))
        g_conv2, att2 = self.attentionblock2(conv2, center)
        up2 = self.up_concat2(torch.cat([g_conv2, self.up(center)], 1))
        g_conv1, att1 = self.attentionblock1(conv1, up2)
        up1 = self.up_concat1(torch.cat([g_conv1, self.up(up2)], 1))
        return self.final(up1)
