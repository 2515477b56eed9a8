"""Classic architectures as specs, written from their papers: what real networks look like to symgrad.

Each builder returns spec text. ``train`` picks training-mode batch_norm (batch statistics) or eval
mode (running statistics as named inputs). Sizes are the papers' layer structure at small widths,
so a test can run them in float64.
"""

from __future__ import annotations

import yaml

from symgrad.graph import build_graph
from symgrad.spec import parse_spec


class Net:
    """A spec under construction: each call adds a layer reading ``source`` (default: the last one)."""

    def __init__(self, name: str, x_shape: list[int], train: bool = True):
        self.name, self.train = name, train
        self.inputs: dict[str, dict] = {"x": {"shape": list(x_shape)}}
        self.layers: list[dict] = []
        self.wrt: list[str] = ["x"]
        self.last = "x"
        self.count = 0

    def _name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def parameter(self, name: str, shape: list[int], wrt: bool = True) -> str:
        self.inputs[name] = {"shape": list(shape)}
        if wrt:
            self.wrt.append(name)
        return name

    def layer(self, op: str, source=None, out: str | None = None, **arguments) -> str:
        out = out or self._name(op.split("_")[0].replace("2d", ""))
        sources = source if isinstance(source, list) else [source or self.last]
        self.layers.append({"op": op, "in": sources, **arguments, "out": out})
        self.last = out
        return out

    def conv(
        self,
        c_in: int,
        c_out: int,
        kernel: int,
        stride: int = 1,
        padding: int | None = None,
        bias: bool = True,
        source=None,
        transposed: bool = False,
    ) -> str:
        out = self._name("conv")
        weight = self.parameter(
            f"{out}_w", [c_in, c_out, kernel, kernel] if transposed else [c_out, c_in, kernel, kernel]
        )
        arguments = {"weight": weight, "stride": stride, "padding": kernel // 2 if padding is None else padding}
        if bias:
            arguments["bias"] = self.parameter(f"{out}_b", [c_out])
        return self.layer("conv_transpose2d" if transposed else "conv2d", source, out, **arguments)

    def bn(self, channels: int, source=None) -> str:
        out = self._name("bn")
        arguments = {
            "training": self.train,
            "weight": self.parameter(f"{out}_weight", [channels]),
            "bias": self.parameter(f"{out}_bias", [channels]),
        }
        if not self.train:
            arguments["running_mean"] = self.parameter(f"{out}_running_mean", [channels], wrt=False)
            arguments["running_var"] = self.parameter(f"{out}_running_var", [channels], wrt=False)
        return self.layer("batch_norm", source, out, **arguments)

    def linear(self, n_in: int, n_out: int, source=None) -> str:
        out = self._name("fc")
        return self.layer(
            "linear",
            source,
            out,
            weight=self.parameter(f"{out}_w", [n_out, n_in]),
            bias=self.parameter(f"{out}_b", [n_out]),
        )

    def relu(self, source=None) -> str:
        return self.layer("relu", source)

    def spec(self, loss: str = "mse_loss", classes: int | None = None) -> str:
        """The spec text, with the target's shape read off the graph (``classes``: cross_entropy)."""
        draft = {
            "name": self.name,
            "inputs": dict(self.inputs),
            "layers": self.layers,
            "loss": {"op": "half_sq_error", "in": self.last, "target": self.last},
            "wrt": self.wrt,
        }
        shape = build_graph(parse_spec(yaml.safe_dump(draft, sort_keys=False), "draft.yaml")).nodes[self.last].shape
        if classes:
            target = {"shape": [shape[0]], "dtype": "int64"}
            loss_entry = {"op": "cross_entropy", "in": self.last, "target": "target"}
        else:
            target = {"shape": list(shape)}
            loss_entry = {"op": loss, "in": self.last, "target": "target"}
        document = {
            "name": self.name,
            "inputs": {**self.inputs, "target": target},
            "layers": self.layers,
            "loss": loss_entry,
            "wrt": self.wrt,
        }
        return yaml.safe_dump(document, sort_keys=False)


def resnet18(train: bool = True, width: int = 4) -> str:
    """He et al. 2016, CIFAR stem: conv-bn-relu, four stages of two BasicBlocks (the first block of
    stages 2-4 downsamples with stride 2 and a 1x1 conv-bn shortcut), global average pool, linear."""
    net = Net(f"resnet18_{'train' if train else 'eval'}", [2, 3, 16, 16], train)
    net.conv(3, width, 3, bias=False)
    net.bn(width)
    net.relu()
    channels = width
    for stage, out_channels in enumerate([width, 2 * width, 4 * width, 8 * width]):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            identity = net.last
            net.conv(channels, out_channels, 3, stride=stride, bias=False)
            net.bn(out_channels)
            net.relu()
            net.conv(out_channels, out_channels, 3, bias=False)
            residual = net.bn(out_channels)
            if stride != 1 or channels != out_channels:
                net.conv(channels, out_channels, 1, stride=stride, padding=0, bias=False, source=identity)
                identity = net.bn(out_channels)
            net.layer("add", [residual, identity])
            net.relu()
            channels = out_channels
    net.layer("adaptive_avg_pool2d", output_size=1)
    net.layer("flatten", start_dim=1)
    net.linear(channels, 10)
    return net.spec(classes=10)


def unet(train: bool = True, width: int = 4, levels: int = 3) -> str:
    """Ronneberger et al. 2015 with BatchNorm: (conv-bn-relu) x2 per level, max-pool down, bilinear
    upsampling up (ConvTranspose2d in the deepest step), an F.pad to the skip's size, cat, (conv-bn-relu) x2."""
    size = 20
    net = Net(f"unet_{'train' if train else 'eval'}", [2, 1, size, size], train)
    channels, skips, sizes = 1, [], []
    for level in range(levels):
        out_channels = width * 2**level
        for _ in range(2):
            net.conv(channels, out_channels, 3, bias=False)
            net.bn(out_channels)
            net.relu()
            channels = out_channels
        skips.append((net.last, channels))
        sizes.append(size)
        net.layer("max_pool2d", kernel_size=2)
        size //= 2
    for _ in range(2):
        net.conv(channels, 2 * channels, 3, bias=False)
        net.bn(2 * channels)
        net.relu()
        channels *= 2
    for level in reversed(range(levels)):
        skip, skip_channels = skips[level]
        if level == levels - 1:
            net.conv(channels, channels // 2, 2, stride=2, padding=0, transposed=True)
            channels //= 2
        else:
            net.layer("interpolate", scale_factor=2, mode="bilinear", align_corners=False)
        missing = sizes[level] - 2 * size  # max-pool floored an odd size: F.pad up to the skip's size
        net.layer("pad", pad=[0, missing, 0, missing])
        size = sizes[level]
        net.layer("cat", [net.last, skip], dim=1)
        channels += skip_channels
        for _ in range(2):
            net.conv(channels, skip_channels, 3, bias=False)
            net.bn(skip_channels)
            net.relu()
            channels = skip_channels
    net.conv(channels, 1, 1, padding=0)
    return net.spec("mse_loss")


def dncnn(train: bool = True, depth: int = 17, width: int = 8) -> str:
    """Zhang et al. 2017: conv-relu, (depth - 2) x (conv-bn-relu), conv; the net predicts the noise and
    the clean estimate is the input minus it."""
    net = Net(f"dncnn_{'train' if train else 'eval'}", [2, 1, 12, 12], train)
    net.conv(1, width, 3)
    net.relu()
    for _ in range(depth - 2):
        net.conv(width, width, 3, bias=False)
        net.bn(width)
        net.relu()
    noise = net.conv(width, 1, 3, bias=False)
    net.layer("sub", ["x", noise])
    return net.spec("mse_loss")


def drunet(width: int = 4, blocks: int = 2) -> str:
    """Zhang et al. 2021 (DRUNet-style): the noise level map as a second input channel, a head conv,
    per scale residual blocks (conv-relu-conv plus skip) and a 2x2 stride-2 conv down; up by 2x2
    ConvTranspose2d, the encoder's features added back; tail conv. No normalisation, no biases."""
    net = Net("drunet", [2, 2, 16, 16])
    channels = width
    net.conv(2, width, 3, bias=False)
    skips = []

    def residual_blocks():
        for _ in range(blocks):
            start = net.last
            net.conv(channels, channels, 3, bias=False)
            net.relu()
            net.conv(channels, channels, 3, bias=False)
            net.layer("add", [net.last, start])

    for scale in range(3):
        residual_blocks()
        skips.append(net.last)
        net.conv(channels, 2 * channels, 2, stride=2, padding=0, bias=False)
        channels *= 2
    for scale in reversed(range(3)):
        net.conv(channels, channels // 2, 2, stride=2, padding=0, bias=False, transposed=True)
        channels //= 2
        net.layer("add", [net.last, skips[scale]])
        residual_blocks()
    net.conv(channels, 1, 3, bias=False)
    return net.spec("l1_loss")


def vgg11_bn(train: bool = True, width: int = 4) -> str:
    """Simonyan and Zisserman 2015, configuration A with BatchNorm: conv-bn-relu blocks with max-pools
    after 1, 2, 4, 6 and 8 convs (PyTorch's default Conv2d keeps its bias before the BatchNorm);
    a classifier of three linear layers."""
    net = Net(f"vgg11_bn_{'train' if train else 'eval'}", [2, 3, 32, 32], train)
    channels = 3
    for item in [1, "M", 2, "M", 4, 4, "M", 8, 8, "M", 8, 8, "M"]:
        if item == "M":
            net.layer("max_pool2d", kernel_size=2, stride=2)
            continue
        net.conv(channels, width * item, 3)  # bias=True, then bn: PyTorch's default, and a zero gradient
        net.bn(width * item)
        net.relu()
        channels = width * item
    net.layer("flatten", start_dim=1)
    net.linear(channels, 16)
    net.relu()
    net.linear(16, 16)
    net.relu()
    net.linear(16, 10)
    return net.spec(classes=10)


def lenet5() -> str:
    """LeCun et al. 1998 (the CIFAR variant): conv5-tanh-avgpool twice, then 120-84-10 linear layers."""
    net = Net("lenet5", [2, 3, 32, 32])
    net.conv(3, 6, 5, padding=0)
    net.layer("tanh")
    net.layer("avg_pool2d", kernel_size=2)
    net.conv(6, 16, 5, padding=0)
    net.layer("tanh")
    net.layer("avg_pool2d", kernel_size=2)
    net.layer("flatten", start_dim=1)
    net.linear(16 * 5 * 5, 120)
    net.layer("tanh")
    net.linear(120, 84)
    net.layer("tanh")
    net.linear(84, 10)
    return net.spec(classes=10)


def espcn(upscale: int = 3) -> str:
    """Shi et al. 2016: conv5-tanh, conv3-tanh, conv3 to r^2 channels, pixel_shuffle."""
    net = Net("espcn", [2, 1, 10, 10])
    net.conv(1, 16, 5)
    net.layer("tanh")
    net.conv(16, 8, 3)
    net.layer("tanh")
    net.conv(8, upscale**2, 3)
    net.layer("pixel_shuffle", upscale_factor=upscale)
    return net.spec("mse_loss")


def srcnn() -> str:
    """Dong et al. 2014: 9-1-5 convolutions with ReLU (patch extraction, mapping, reconstruction)."""
    net = Net("srcnn", [2, 1, 16, 16])
    net.conv(1, 16, 9)
    net.relu()
    net.conv(16, 8, 1, padding=0)
    net.relu()
    net.conv(8, 1, 5)
    return net.spec("mse_loss")


def plain_chain(depth: int, channels: int) -> str:
    """``depth`` conv3x3 + ReLU layers of ``channels`` channels: the deep plain net of the issue."""
    net = Net(f"chain{depth}_{channels}", [2, channels, 8, 8])
    for _ in range(depth):
        net.conv(channels, channels, 3, bias=False)
        net.relu()
    return net.spec("mse_loss")


ARCHITECTURES = {
    "resnet18-train": lambda: resnet18(True),
    "resnet18-eval": lambda: resnet18(False),
    "unet-train": lambda: unet(True),
    "unet-eval": lambda: unet(False),
    "dncnn-train": lambda: dncnn(True),
    "dncnn-eval": lambda: dncnn(False),
    "drunet": drunet,
    "vgg11_bn-train": lambda: vgg11_bn(True),
    "vgg11_bn-eval": lambda: vgg11_bn(False),
    "lenet5": lenet5,
    "espcn": espcn,
    "srcnn": srcnn,
}
