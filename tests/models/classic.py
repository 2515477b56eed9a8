"""Classic CNNs written as people write them in PyTorch (nn.Module layers, in-place ReLUs, ``+=``
shortcuts, ``view(x.size(0), -1)``, ``F.pad`` to a skip's size, ``torch.cat``), from their papers,
for ``symgrad trace``. Widths are small so the tests can compare in float64.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    """He et al. 2016: conv-bn-relu-conv-bn, plus the input (a 1x1 conv-bn when the shape changes)."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """CIFAR stem, four stages of two BasicBlocks, global average pool, a linear classifier."""

    def __init__(self, width: int = 4, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        planes, layers = width, []
        for stage, out_planes in enumerate([width, 2 * width, 4 * width, 8 * width]):
            stride = 1 if stage == 0 else 2
            layers.append(nn.Sequential(BasicBlock(planes, out_planes, stride), BasicBlock(out_planes, out_planes)))
            planes = out_planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(planes, classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


class DoubleConv(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        return self.double_conv(x)


class Up(nn.Module):
    """Upsample (bilinear, or a 2x2 transposed conv), pad to the skip's size, concatenate, DoubleConv."""

    def __init__(self, in_channels: int, out_channels: int, bilinear: bool = True):
        super().__init__()
        if bilinear:
            self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
            self.conv = DoubleConv(in_channels + in_channels // 2, out_channels)
        else:
            self.up = nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2)
            self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x1, x2):
        x1 = self.up(x1)
        diff_y = x2.size()[2] - x1.size()[2]
        diff_x = x2.size()[3] - x1.size()[3]
        x1 = F.pad(x1, [diff_x // 2, diff_x - diff_x // 2, diff_y // 2, diff_y - diff_y // 2])
        return self.conv(torch.cat([x2, x1], dim=1))


class UNet(nn.Module):
    """Ronneberger et al. 2015 with BatchNorm: max-pool down, bilinear (or ConvTranspose2d) up."""

    def __init__(self, in_channels: int = 1, width: int = 4, bilinear: bool = True):
        super().__init__()
        self.inc = DoubleConv(in_channels, width)
        self.down1 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(width, 2 * width))
        self.down2 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(2 * width, 4 * width))
        self.up1 = Up(4 * width, 2 * width, bilinear)
        self.up2 = Up(2 * width, width, bilinear)
        self.outc = nn.Conv2d(width, in_channels, kernel_size=1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        return self.outc(self.up2(self.up1(x3, x2), x1))


class DnCNN(nn.Module):
    """Zhang et al. 2017: conv-relu, (depth-2) x conv-bn-relu, conv; residual learning (x - noise)."""

    def __init__(self, channels: int = 1, depth: int = 7, features: int = 8):
        super().__init__()
        layers = [nn.Conv2d(channels, features, 3, padding=1), nn.ReLU(inplace=True)]
        for _ in range(depth - 2):
            layers += [
                nn.Conv2d(features, features, 3, padding=1, bias=False),
                nn.BatchNorm2d(features),
                nn.ReLU(inplace=True),
            ]
        layers.append(nn.Conv2d(features, channels, 3, padding=1, bias=False))
        self.dncnn = nn.Sequential(*layers)

    def forward(self, x):
        return x - self.dncnn(x)


class ResBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.res = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
        )

    def forward(self, x):
        return x + self.res(x)


class DRUNet(nn.Module):
    """Zhang et al. 2021: the noise level as a second input channel, residual blocks per scale,
    strided 2x2 convs down, 2x2 transposed convs up, the encoder's features added back."""

    def __init__(self, in_nc: int = 1, nc=(4, 8, 16), blocks: int = 1):
        super().__init__()
        self.m_head = nn.Conv2d(in_nc + 1, nc[0], 3, padding=1, bias=False)
        self.m_down = nn.ModuleList(
            nn.Sequential(
                *[ResBlock(nc[i]) for _ in range(blocks)], nn.Conv2d(nc[i], nc[i + 1], 2, stride=2, bias=False)
            )
            for i in range(len(nc) - 1)
        )
        self.m_body = nn.Sequential(*[ResBlock(nc[-1]) for _ in range(blocks)])
        self.m_up = nn.ModuleList(
            nn.Sequential(
                nn.ConvTranspose2d(nc[i + 1], nc[i], 2, stride=2, bias=False), *[ResBlock(nc[i]) for _ in range(blocks)]
            )
            for i in reversed(range(len(nc) - 1))
        )
        self.m_tail = nn.Conv2d(nc[0], in_nc, 3, padding=1, bias=False)

    def forward(self, x, noise_map):
        x = torch.cat((x, noise_map), dim=1)
        skips = [self.m_head(x)]
        for down in self.m_down:
            skips.append(down(skips[-1]))
        x = self.m_body(skips[-1])
        for up in self.m_up:
            x = up(x + skips.pop())
        return self.m_tail(x + skips.pop())


class VGG11BN(nn.Module):
    """Simonyan & Zisserman 2015, configuration A with BatchNorm, CIFAR-sized (one linear classifier)."""

    def __init__(self, width: int = 4, classes: int = 10):
        super().__init__()
        layers, channels = [], 3
        for item in [1, "M", 2, "M", 4, 4, "M", 8, 8, "M", 8, 8, "M"]:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [
                    nn.Conv2d(channels, item * width, 3, padding=1),
                    nn.BatchNorm2d(item * width),
                    nn.ReLU(inplace=True),
                ]
                channels = item * width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, classes)

    def forward(self, x):
        out = self.features(x)
        out = out.view(out.size(0), -1)
        return self.classifier(out)


class LeNet5(nn.Module):
    """LeCun et al. 1998 for CIFAR: two conv-relu-maxpool stages and three linear layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        out = F.max_pool2d(F.relu(self.conv1(x)), 2)
        out = F.max_pool2d(F.relu(self.conv2(out)), 2)
        out = out.view(out.size(0), -1)
        out = F.relu(self.fc1(out))
        out = F.relu(self.fc2(out))
        return self.fc3(out)


class ESPCN(nn.Module):
    """Shi et al. 2016: tanh feature maps, then a sub-pixel convolution (pixel_shuffle)."""

    def __init__(self, scale: int = 2, channels: int = 1):
        super().__init__()
        self.feature_maps = nn.Sequential(
            nn.Conv2d(channels, 16, 5, padding=2), nn.Tanh(), nn.Conv2d(16, 8, 3, padding=1), nn.Tanh()
        )
        self.sub_pixel = nn.Sequential(nn.Conv2d(8, channels * scale**2, 3, padding=1), nn.PixelShuffle(scale))

    def forward(self, x):
        return self.sub_pixel(self.feature_maps(x))


class SRCNN(nn.Module):
    """Dong et al. 2014: 9-1-5 convolutions (patch extraction, non-linear mapping, reconstruction)."""

    def __init__(self, channels: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 16, 9, padding=4)
        self.conv2 = nn.Conv2d(16, 8, 1)
        self.conv3 = nn.Conv2d(8, channels, 5, padding=2)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.conv3(self.relu(self.conv2(self.relu(self.conv1(x)))))


class Bottleneck(nn.Module):
    """He et al. 2016: 1x1 reduce, 3x3 (strided), 1x1 expand by 4, each with BatchNorm; the shortcut."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_planes != planes * 4:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes * 4, 1, stride=stride, bias=False), nn.BatchNorm2d(planes * 4)
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


class ResNet50(nn.Module):
    """ImageNet ResNet-50: 7x7 stride-2 stem, max-pool, [3, 4, 6, 3] Bottlenecks, average pool, linear."""

    def __init__(self, width: int = 64, classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_planes, stages = width, []
        for index, (blocks, planes) in enumerate(zip([3, 4, 6, 3], [width, 2 * width, 4 * width, 8 * width])):
            layers = []
            for block in range(blocks):
                layers.append(Bottleneck(in_planes, planes, 2 if index > 0 and block == 0 else 1))
                in_planes = planes * 4
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class VGG(nn.Module):
    """Simonyan & Zisserman 2015 for ImageNet: a configuration's conv stack and the 3-layer classifier."""

    CONFIGURATIONS = {
        "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
        "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
        "vgg19": [
            64,
            64,
            "M",
            128,
            128,
            "M",
            256,
            256,
            256,
            256,
            "M",
            512,
            512,
            512,
            512,
            "M",
            512,
            512,
            512,
            512,
            "M",
        ],
    }

    def __init__(
        self,
        configuration: str = "vgg19",
        batch_norm: bool = False,
        classes: int = 1000,
        width: int = 64,
        hidden: int = 4096,
        dropout: float = 0.5,
    ):
        super().__init__()
        layers, channels = [], 3
        for item in self.CONFIGURATIONS[configuration]:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
                continue
            item = item * width // 64
            layers.append(nn.Conv2d(channels, item, 3, padding=1))
            layers += [nn.BatchNorm2d(item)] if batch_norm else []
            layers.append(nn.ReLU(inplace=True))
            channels = item
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(channels * 7 * 7, hidden),
            nn.ReLU(True),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(True),
            nn.Dropout(dropout),
            nn.Linear(hidden, classes),
        )

    def forward(self, x):
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


class SqueezeExcite(nn.Module):
    """timm's squeeze-and-excitation gate: a channel mean kept as [N, C, 1, 1], two 1x1 convs, x * s."""

    def __init__(self, channels: int, reduction: int = 2):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, channels // reduction, 1)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Conv2d(channels // reduction, channels, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        s = self.fc2(self.act(self.fc1(s)))
        return x * s.sigmoid()


class SEStage(nn.Module):
    """Conv, BatchNorm, ReLU and an SE gate, twice, the second after a stride-2 conv: traced at 2x2,
    the second gate's feature map is 1x1, the size of the gate itself."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            SqueezeExcite(width),
        )
        self.down = nn.Sequential(
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True),
            SqueezeExcite(2 * width),
        )
        self.head = nn.Conv2d(2 * width, 3, 1)

    def forward(self, x):
        return self.head(self.down(self.stem(x)))


class LayerNorm2d(nn.LayerNorm):
    """timm's LayerNorm2d: LayerNorm over the channels of an NCHW tensor (NAFNet's own computes the same
    with a custom autograd.Function)."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        x = x.permute(0, 3, 1, 2)
        return x


class SimpleGate(nn.Module):
    def forward(self, x):
        x1, x2 = x.chunk(2, dim=1)
        return x1 * x2


class NAFBlock(nn.Module):
    """Chen et al. 2022 (megvii-research/NAFNet): depthwise conv, SimpleGate, simplified channel attention
    and the learned residual scales beta and gamma ([1, C, 1, 1], zeros upstream; ``layer_scale`` here, so
    that the gradients through the block are not zero in the tests)."""

    def __init__(self, c, DW_Expand=2, FFN_Expand=2, drop_out_rate=0.0, layer_scale=0.0):
        super().__init__()
        dw_channel = c * DW_Expand
        self.conv1 = nn.Conv2d(
            in_channels=c, out_channels=dw_channel, kernel_size=1, padding=0, stride=1, groups=1, bias=True
        )
        self.conv2 = nn.Conv2d(
            in_channels=dw_channel,
            out_channels=dw_channel,
            kernel_size=3,
            padding=1,
            stride=1,
            groups=dw_channel,
            bias=True,
        )
        self.conv3 = nn.Conv2d(
            in_channels=dw_channel // 2, out_channels=c, kernel_size=1, padding=0, stride=1, groups=1, bias=True
        )

        # Simplified Channel Attention
        self.sca = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(
                in_channels=dw_channel // 2,
                out_channels=dw_channel // 2,
                kernel_size=1,
                padding=0,
                stride=1,
                groups=1,
                bias=True,
            ),
        )

        # SimpleGate
        self.sg = SimpleGate()

        ffn_channel = FFN_Expand * c
        self.conv4 = nn.Conv2d(
            in_channels=c, out_channels=ffn_channel, kernel_size=1, padding=0, stride=1, groups=1, bias=True
        )
        self.conv5 = nn.Conv2d(
            in_channels=ffn_channel // 2, out_channels=c, kernel_size=1, padding=0, stride=1, groups=1, bias=True
        )

        self.norm1 = LayerNorm2d(c)
        self.norm2 = LayerNorm2d(c)

        self.dropout1 = nn.Dropout(drop_out_rate) if drop_out_rate > 0.0 else nn.Identity()
        self.dropout2 = nn.Dropout(drop_out_rate) if drop_out_rate > 0.0 else nn.Identity()

        self.beta = nn.Parameter(torch.full((1, c, 1, 1), layer_scale), requires_grad=True)
        self.gamma = nn.Parameter(torch.full((1, c, 1, 1), layer_scale), requires_grad=True)

    def forward(self, inp):
        x = inp

        x = self.norm1(x)

        x = self.conv1(x)
        x = self.conv2(x)
        x = self.sg(x)
        x = x * self.sca(x)
        x = self.conv3(x)

        x = self.dropout1(x)

        y = inp + x * self.beta

        x = self.conv4(self.norm2(y))
        x = self.sg(x)
        x = self.conv5(x)

        x = self.dropout2(x)

        return y + x * self.gamma


class NAFNet(nn.Module):
    """The NAFNet U-shape at a small width: intro conv, encoders with stride-2 2x2 downs, middle blocks,
    1x1 conv + PixelShuffle ups added to the skips, ending conv plus the input; the input padded to a
    multiple of the depth's stride (``check_image_size``) and cropped back."""

    def __init__(self, img_channel=3, width=8, middle_blk_num=1, enc_blk_nums=(1,), dec_blk_nums=(1,), layer_scale=0.5):
        super().__init__()

        self.intro = nn.Conv2d(
            in_channels=img_channel, out_channels=width, kernel_size=3, padding=1, stride=1, groups=1, bias=True
        )
        self.ending = nn.Conv2d(
            in_channels=width, out_channels=img_channel, kernel_size=3, padding=1, stride=1, groups=1, bias=True
        )

        self.encoders = nn.ModuleList()
        self.decoders = nn.ModuleList()
        self.middle_blks = nn.ModuleList()
        self.ups = nn.ModuleList()
        self.downs = nn.ModuleList()

        chan = width
        for num in enc_blk_nums:
            self.encoders.append(nn.Sequential(*[NAFBlock(chan, layer_scale=layer_scale) for _ in range(num)]))
            self.downs.append(nn.Conv2d(chan, 2 * chan, 2, 2))
            chan = chan * 2

        self.middle_blks = nn.Sequential(*[NAFBlock(chan, layer_scale=layer_scale) for _ in range(middle_blk_num)])

        for num in dec_blk_nums:
            self.ups.append(nn.Sequential(nn.Conv2d(chan, chan * 2, 1, bias=False), nn.PixelShuffle(2)))
            chan = chan // 2
            self.decoders.append(nn.Sequential(*[NAFBlock(chan, layer_scale=layer_scale) for _ in range(num)]))

        self.padder_size = 2 ** len(self.encoders)

    def forward(self, x):  # upstream's argument is inp; the tests pass x
        inp = x
        B, C, H, W = inp.shape
        inp = self.check_image_size(inp)

        x = self.intro(inp)

        encs = []

        for encoder, down in zip(self.encoders, self.downs):
            x = encoder(x)
            encs.append(x)
            x = down(x)

        x = self.middle_blks(x)

        for decoder, up, enc_skip in zip(self.decoders, self.ups, encs[::-1]):
            x = up(x)
            x = x + enc_skip
            x = decoder(x)

        x = self.ending(x)
        x = x + inp

        return x[:, :, :H, :W]

    def check_image_size(self, x):
        _, _, h, w = x.size()
        mod_pad_h = (self.padder_size - h % self.padder_size) % self.padder_size
        mod_pad_w = (self.padder_size - w % self.padder_size) % self.padder_size
        x = F.pad(x, (0, mod_pad_w, 0, mod_pad_h))
        return x


def _make_divisible(v: float, divisor: int, min_value=None) -> int:
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class Conv2dNormActivation(nn.Sequential):
    """torchvision.ops.misc.Conv2dNormActivation: conv, BatchNorm, an activation made with inplace=True."""

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size=3,
        stride=1,
        groups=1,
        norm_layer=nn.BatchNorm2d,
        activation_layer=nn.ReLU,
    ):
        padding = (kernel_size - 1) // 2
        layers = [
            nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, groups=groups, bias=False),
            norm_layer(out_channels),
        ]
        if activation_layer is not None:
            layers.append(activation_layer(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    """torchvision.ops.misc.SqueezeExcitation as MobileNetV3 builds it: ReLU inside, Hardsigmoid gate."""

    def __init__(self, input_channels, squeeze_channels, activation=nn.ReLU, scale_activation=nn.Hardsigmoid):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def _scale(self, input):
        scale = self.avgpool(input)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        return self.scale_activation(scale)

    def forward(self, input):
        scale = self._scale(input)
        return scale * input


class InvertedResidual(nn.Module):
    """torchvision's MobileNetV3 block: 1x1 expand, depthwise conv, SE, 1x1 project, ``result += input``."""

    def __init__(self, input_channels, kernel, expanded_channels, out_channels, use_se, use_hs, stride):
        super().__init__()
        self.use_res_connect = stride == 1 and input_channels == out_channels
        layers = []
        activation_layer = nn.Hardswish if use_hs else nn.ReLU
        if expanded_channels != input_channels:  # expand
            layers.append(
                Conv2dNormActivation(
                    input_channels, expanded_channels, kernel_size=1, activation_layer=activation_layer
                )
            )
        layers.append(
            Conv2dNormActivation(
                expanded_channels,
                expanded_channels,
                kernel_size=kernel,
                stride=stride,
                groups=expanded_channels,
                activation_layer=activation_layer,
            )
        )  # depthwise
        if use_se:
            squeeze_channels = _make_divisible(expanded_channels // 4, 8)
            layers.append(SqueezeExcitation(expanded_channels, squeeze_channels))
        layers.append(
            Conv2dNormActivation(expanded_channels, out_channels, kernel_size=1, activation_layer=None)
        )  # project
        self.block = nn.Sequential(*layers)

    def forward(self, input):
        result = self.block(input)
        if self.use_res_connect:
            result += input
        return result


class MobileNetV3(nn.Module):
    """A small MobileNetV3: hardswish stem, inverted residuals with SE gates (a residual one, a strided
    one), the last conv, global average pool and the Linear-Hardswish-Dropout-Linear classifier."""

    def __init__(self, classes: int = 5, dropout: float = 0.0):
        super().__init__()
        settings = [(8, 3, 16, 8, True, True, 1), (8, 5, 24, 12, True, True, 2), (12, 3, 24, 12, False, False, 1)]
        layers = [Conv2dNormActivation(3, 8, kernel_size=3, stride=2, activation_layer=nn.Hardswish)]
        layers += [InvertedResidual(*setting) for setting in settings]
        layers.append(Conv2dNormActivation(12, 32, kernel_size=1, activation_layer=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(32, 16), nn.Hardswish(inplace=True), nn.Dropout(p=dropout, inplace=True), nn.Linear(16, classes)
        )

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.classifier(x)
        return x


class ChannelsFirstLayerNorm(nn.Module):
    """ConvNeXt's channels-first LayerNorm as its authors write it: the mean and variance over the
    channel dim by hand, the affine parameters indexed up to [C, 1, 1]."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class ConvNeXtBlock(nn.Module):
    """A ConvNeXt stage: stem with a channels-first LayerNorm, then blocks of depthwise 7x7, that LayerNorm, 1x1 expand,
    GELU, 1x1 project, layer scale gamma[:, None, None] and the residual."""

    def __init__(self, width: int = 4, depth: int = 2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 2, stride=2), ChannelsFirstLayerNorm(width))
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(
                nn.ModuleDict(
                    {
                        "dwconv": nn.Conv2d(width, width, 7, padding=3, groups=width),
                        "norm": ChannelsFirstLayerNorm(width),
                        "pwconv1": nn.Conv2d(width, 4 * width, 1),
                        "act": nn.GELU(),
                        "pwconv2": nn.Conv2d(4 * width, width, 1),
                    }
                )
            )
        self.gamma = nn.Parameter(torch.full((depth, width), 0.5))
        self.head = nn.Conv2d(width, 3, 1)

    def forward(self, x):
        x = self.stem(x)
        for index, block in enumerate(self.blocks):
            y = block["pwconv2"](block["act"](block["pwconv1"](block["norm"](block["dwconv"](x)))))
            x = x + self.gamma[index][:, None, None] * y
        return self.head(x)


class ASPPConv(nn.Sequential):
    def __init__(self, in_channels: int, out_channels: int, dilation: int):
        super().__init__(
            nn.Conv2d(in_channels, out_channels, 3, padding=dilation, dilation=dilation, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
        )


class ASPPPooling(nn.Sequential):
    """The image-pooling branch: pooled to 1x1, then interpolated back to the input's size, read from it."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(in_channels, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
        )

    def forward(self, x):
        size = x.shape[-2:]
        for mod in self:
            x = mod(x)
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class ASPP(nn.Module):
    def __init__(self, in_channels: int, atrous_rates: tuple[int, ...], out_channels: int):
        super().__init__()
        modules = [
            nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU())
        ]
        for rate in atrous_rates:
            modules.append(ASPPConv(in_channels, out_channels, rate))
        modules.append(ASPPPooling(in_channels, out_channels))
        self.convs = nn.ModuleList(modules)
        self.project = nn.Sequential(
            nn.Conv2d(len(self.convs) * out_channels, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
        )

    def forward(self, x):
        res = []
        for conv in self.convs:
            res.append(conv(x))
        res = torch.cat(res, dim=1)
        return self.project(res)


class DeepLabV3(nn.Module):
    """torchvision's DeepLabV3 in small: a stride-2 backbone, the ASPP head (1x1, three dilated 3x3, image
    pooling), a classifier, and the logits interpolated back to the input's size (odd sizes too).
    torchvision's ASPP projection ends in Dropout(0.5), left out: it is random in training mode."""

    def __init__(self, in_channels: int = 3, width: int = 4, classes: int = 3):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Sequential(
            ASPP(width, (1, 2, 3), width),
            nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, classes, 1),
        )

    def forward(self, x):
        input_shape = x.shape[-2:]
        features = self.backbone(x)
        x = self.classifier(features)
        return F.interpolate(x, size=input_shape, mode="bilinear", align_corners=False)


class FFDNet(nn.Module):
    """Zhang et al. 2018, in small: a noise-level map of one value, shaped like the input's batch and
    spatial sizes and made inside forward with torch.full, concatenated to the image; the body predicts
    the noise, which is subtracted."""

    def __init__(self, in_channels: int = 1, width: int = 8, depth: int = 3, sigma: float = 25 / 255):
        super().__init__()
        self.sigma = sigma
        layers = [nn.Conv2d(in_channels + 1, width, 3, padding=1), nn.ReLU(inplace=True)]
        for _ in range(depth - 2):
            layers += [nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
        layers.append(nn.Conv2d(width, in_channels, 3, padding=1))
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        n, _, h, w = x.shape
        noise_map = torch.full((n, 1, h, w), self.sigma, dtype=x.dtype, device=x.device)
        return x - self.body(torch.cat([x, noise_map], dim=1))


class UpToSkip(nn.Module):
    """A U-Net up-step as written for any input size: upsample by 2, then pad (or crop) to the skip's size
    with F.pad, or interpolate straight to it."""

    def __init__(self, channels: int, how: str = "pad"):
        super().__init__()
        self.how = how
        self.up = nn.ConvTranspose2d(channels, channels, kernel_size=2, stride=2)
        self.conv = nn.Sequential(nn.Conv2d(2 * channels, channels, 3, padding=1), nn.ReLU(inplace=True))

    def forward(self, x1, x2):
        if self.how == "pad":
            x1 = self.up(x1)
            diffY = x2.size()[2] - x1.size()[2]
            diffX = x2.size()[3] - x1.size()[3]
            x1 = F.pad(x1, [diffX // 2, diffX - diffX // 2, diffY // 2, diffY - diffY // 2])
        else:
            x1 = F.interpolate(x1, size=x2.shape[-2:], mode="bilinear", align_corners=True)
        return self.conv(torch.cat([x2, x1], dim=1))


class OddUNet(nn.Module):
    """Down by a max-pool that floors odd sizes, and back up to the skip's size (pad or interpolate)."""

    def __init__(self, in_channels: int = 1, width: int = 4, how: str = "pad"):
        super().__init__()
        self.inc = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(inplace=True))
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(width, width, 3, padding=1), nn.ReLU(inplace=True))
        self.up = UpToSkip(width, how)
        self.outc = nn.Conv2d(width, in_channels, kernel_size=1)

    def forward(self, x):
        x1 = self.inc(x)
        return self.outc(self.up(self.down(x1), x1))
