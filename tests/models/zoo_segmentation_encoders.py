"""The encoders of the segmentation-models-pytorch-style networks (``tests/models/zoo_segmentation.py``), written the
way smp cuts them: each returns the list of its features, the input and one map per stride 2, 4, 8, 16, 32. A
small torchvision-style ResNet (its stages as smp's ``get_stages``, the last one dilated for
``output_stride=16``) and an EfficientNet-style one (MBConv with SiLU and squeeze-excitation). Our code; the
architectures' facts are public.
"""

from __future__ import annotations

import torch.nn as nn


# ----- encoders: features = [x, stride 2, 4, 8, 16, 32] ----------------------------------------------------
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, dilation=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, padding=dilation, dilation=dilation, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=dilation, dilation=dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNetEncoder(nn.Module):
    """torchvision's ResNet without its classifier, its stages cut as smp's ``ResNetEncoder.get_stages``;
    ``output_stride=16`` dilates the last stage (smp's ``make_dilated``: stride 1, dilation 2)."""

    def __init__(self, widths=(8, 8, 16, 16, 16), layers=(1, 1, 1, 1), depth=5, output_stride=32):
        super().__init__()
        self._depth = depth
        self.out_channels = (3, widths[0], *widths[1:])
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(widths[1], layers[0])
        self.layer2 = self._make_layer(widths[2], layers[1], stride=2)
        self.layer3 = self._make_layer(widths[3], layers[2], stride=2)
        dilated = output_stride == 16
        self.layer4 = self._make_layer(widths[4], layers[3], stride=1 if dilated else 2, dilation=2 if dilated else 1)

    def _make_layer(self, planes, blocks, stride=1, dilation=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample, dilation)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes, dilation=dilation) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def get_stages(self):
        return [
            nn.Identity(),
            nn.Sequential(self.conv1, self.bn1, self.relu),
            nn.Sequential(self.maxpool, self.layer1),
            self.layer2,
            self.layer3,
            self.layer4,
        ]

    def forward(self, x):
        stages = self.get_stages()
        features = []
        for i in range(self._depth + 1):
            x = stages[i](x)
            features.append(x)
        return features


class SqueezeExcite(nn.Module):
    def __init__(self, in_chs, rd_channels):
        super().__init__()
        self.conv_reduce = nn.Conv2d(in_chs, rd_channels, 1, bias=True)
        self.act1 = nn.SiLU(inplace=True)
        self.conv_expand = nn.Conv2d(rd_channels, in_chs, 1, bias=True)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        x_se = x.mean((2, 3), keepdim=True)
        x_se = self.act1(self.conv_reduce(x_se))
        return x * self.gate(self.conv_expand(x_se))


class InvertedResidual(nn.Module):
    """timm's MBConv: 1x1 expansion, depthwise kxk, squeeze-excitation, 1x1 projection, the skip when shapes
    allow."""

    def __init__(self, in_chs, out_chs, dw_kernel_size=3, stride=1, exp_ratio=4.0, se_ratio=0.25):
        super().__init__()
        mid_chs = int(in_chs * exp_ratio)
        self.has_skip = in_chs == out_chs and stride == 1
        self.conv_pw = nn.Conv2d(in_chs, mid_chs, 1, bias=False)
        self.bn1 = nn.Sequential(nn.BatchNorm2d(mid_chs), nn.SiLU(inplace=True))
        self.conv_dw = nn.Conv2d(
            mid_chs, mid_chs, dw_kernel_size, stride, padding=dw_kernel_size // 2, groups=mid_chs, bias=False
        )
        self.bn2 = nn.Sequential(nn.BatchNorm2d(mid_chs), nn.SiLU(inplace=True))
        self.se = SqueezeExcite(mid_chs, max(1, int(in_chs * se_ratio)))
        self.conv_pwl = nn.Conv2d(mid_chs, out_chs, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_chs)

    def forward(self, x):
        shortcut = x
        x = self.bn1(self.conv_pw(x))
        x = self.bn2(self.conv_dw(x))
        x = self.se(x)
        x = self.bn3(self.conv_pwl(x))
        if self.has_skip:
            x = x + shortcut
        return x


def replace_strides_with_dilation(module, dilation_rate):
    """Patch Conv2d modules replacing strides with dilation (smp's ``make_dilated``)"""
    for mod in module.modules():
        if isinstance(mod, nn.Conv2d):
            mod.stride = (1, 1)
            mod.dilation = (dilation_rate, dilation_rate)
            kh, kw = mod.kernel_size
            mod.padding = ((kh // 2) * dilation_rate, (kw // 2) * dilation_rate)


class EfficientNetEncoder(nn.Module):
    """An EfficientNet-style encoder as smp's timm-efficientnet encoders cut it: the stem, then the blocks,
    a feature after the stages where the stride doubles (``_stage_idxs``); ``output_stride=16`` dilates the
    last stage, as smp's ``make_dilated`` does."""

    def __init__(
        self,
        stem=8,
        stages=((8, 3, 1), (8, 3, 2), (16, 5, 2), (16, 3, 2), (16, 5, 1), (16, 3, 2)),
        depth=5,
        output_stride=32,
    ):
        super().__init__()
        self._depth = depth
        self.conv_stem = nn.Conv2d(3, stem, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        self.act1 = nn.SiLU(inplace=True)
        blocks, in_chs = [], stem
        for out_chs, kernel, stride in stages:
            blocks.append(
                nn.Sequential(
                    InvertedResidual(in_chs, out_chs, kernel, stride, exp_ratio=1.0 if stride == 1 else 4.0),
                    InvertedResidual(out_chs, out_chs, kernel),
                )
            )
            in_chs = out_chs
        self.blocks = nn.Sequential(*blocks)
        self._stage_idxs = (1, 2, 3, 5)
        self.out_channels = (3, *(stages[i - 1][0] for i in self._stage_idxs), stages[-1][0])
        if output_stride == 16:
            replace_strides_with_dilation(self.blocks[self._stage_idxs[3] :], dilation_rate=2)

    def get_stages(self):
        return [
            nn.Identity(),
            nn.Sequential(self.conv_stem, self.bn1, self.act1, self.blocks[: self._stage_idxs[0]]),
            self.blocks[self._stage_idxs[0] : self._stage_idxs[1]],
            self.blocks[self._stage_idxs[1] : self._stage_idxs[2]],
            self.blocks[self._stage_idxs[2] : self._stage_idxs[3]],
            self.blocks[self._stage_idxs[3] :],
        ]

    def forward(self, x):
        stages = self.get_stages()
        features = []
        for i in range(self._depth + 1):
            x = stages[i](x)
            features.append(x)
        return features


ENCODERS = {"resnet": ResNetEncoder, "efficientnet": EfficientNetEncoder}
