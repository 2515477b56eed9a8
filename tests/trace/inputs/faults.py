"""Models written the way people write them, each with one fault symgrad trace must refuse, or none.

A line the tests look for carries a ``# MARKER`` comment; the tests find its number by that marker."""

import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_bn_relu(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class SignBranch(nn.Module):
    """A branch on a sum: one side ReLU, the other a negation."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(conv_bn_relu(1, 4), nn.Conv2d(4, 4, 3, padding=1))

    def forward(self, x):
        h = self.features(x)
        if h.sum() > 0:  # SUM_BRANCH
            return F.relu(h)
        else:
            return -h


class ItemFactor(nn.Module):
    """A factor chosen in Python from a mean read with .item()."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)

    def forward(self, x):
        h = self.conv(x)
        scale = 2.0 if h.mean().item() > 0 else 3.0  # ITEM_FACTOR
        return h * scale


class Gate(nn.Module):
    """A residual unit that skips itself when its input is 'small': repeated in a Sequential."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        if x.abs().mean() < 1e-3:  # GATE
            return x
        return x + self.conv(x)


class GatedStack(nn.Module):
    def __init__(self, depth: int = 6):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.body = nn.Sequential(*[Gate(4) for _ in range(depth)])

    def forward(self, x):
        return self.body(self.stem(x))


class Checks(nn.Module):
    """Every way of taking a value out of a tensor, each on its own line, in one forward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)

    def forward(self, x):
        h = self.conv(x)
        if torch.isnan(h).any():  # ISNAN
            raise ValueError("nan")
        steps = int(h.abs().max()) % 2  # INT
        factor = float(h.std())  # FLOAT
        values = h.flatten()[:2].tolist()  # TOLIST
        while (h > 1e6).any():  # WHILE
            h = h * 0.5
        if torch.equal(h, h):  # EQUAL
            h = h + 0
        self.last_norm = h.norm().item()  # LOGGED
        return h * (factor + steps + len(values))


class MaskSize(nn.Module):
    """A decision on how many entries are positive: the size of a masked tensor is a value."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)

    def forward(self, x):
        h = self.conv(x)
        positive = h[h > 0]
        if len(positive) > h.numel() // 2:  # MASK_SIZE
            h = F.relu(h)
        return h


class DropPath(nn.Module):
    """Stochastic depth as timm writes it in places: a coin flip in Python."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)

    def forward(self, x):
        if self.training and torch.rand(1).item() < 0.5:  # COIN
            return x
        return x + self.conv(x)


class BranchWhenLarge(nn.Module):
    """A value read only on large inputs: at the traced size it never happens, at the second run's it does."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)

    def forward(self, x):
        h = self.conv(x)
        if x.shape[-1] > 8 and h.max() > 0:  # LARGE_ONLY
            h = F.relu(h)
        return h


class ConstantsAndSizes(nn.Module):
    """Values read only from literals and from sizes: nothing the inputs decide."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.register_buffer("unused_scale", torch.tensor(3.0))

    def forward(self, x):
        scale = torch.tensor(0.5).item() + float(torch.ones(2).sum())  # 2.5, from literals
        signs = torch.tensor([1.0, -1.0, 2.0])
        scale += len(signs[signs > 0])  # 4.5: a masked size, of literals
        if x.shape[1] == 2 and x.dim() == 4 and x.size(0) > 0:
            x = self.conv(x)
        threshold = torch.full((1,), 4.0)
        threshold += 1
        if threshold.item() > 3:  # from literals, changed in place by a literal
            x = F.relu(x)
        return x * scale


class PolluteConstant(nn.Module):
    """A literal tensor that gets a value of the input written into it: no longer a constant."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)

    def forward(self, x):
        h = self.conv(x)
        limit = torch.zeros(1)
        limit[0] = h.max()
        if limit.item() > 0:  # POLLUTED
            h = F.relu(h)
        return h


class FloatLoss(nn.Module):
    """A forward that returns a Python number, after computing tensors."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)
        self.weight_decay = 1e-4

    def forward(self, x):
        h = self.conv(x)
        del h
        return math.sqrt(self.weight_decay)  # RETURNS_FLOAT


class AttributeTensor(nn.Module):
    """A plain tensor attribute (neither parameter nor buffer) made contiguous, then used: reported at that line."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)
        self.scale = torch.full((1, 1, 1, 1), 2.0)

    def forward(self, x):
        scale = self.scale.contiguous()  # ATTRIBUTE
        return self.conv(x) * scale


class ReturnsAttribute(nn.Module):
    def __init__(self):
        super().__init__()
        self.template = torch.zeros(2, 1, 6, 6)

    def forward(self, x):
        return self.template  # RETURNS_ATTRIBUTE


class Slow(nn.Module):
    """A forward that takes seconds: the trace must stop at --timeout."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)

    def forward(self, x):
        for _ in range(200):
            time.sleep(0.05)  # SLOW
        return self.conv(x)


class Unsupported(nn.Module):
    """Two ops no rule covers, in a block repeated four times: one error line for each source line."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x):
        h = torch.cumsum(self.conv(x), dim=1)  # REPEATED_CUMSUM
        return torch.flip(h, dims=[3]) + x  # REPEATED_FLIP


class UnsupportedStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 2, 3, padding=1)
        self.layer1 = nn.Sequential(*[Unsupported() for _ in range(4)])
        self.head = Unsupported()

    def forward(self, x):
        return self.head(self.layer1(self.stem(x)))


class Mix(nn.Module):
    """An einsum over a diagonal, which PyTorch computes and the einsum rule does not: refused at its line."""

    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width))

    def forward(self, x):
        return torch.einsum("bcii,ij->bcij", x, self.weight)  # DIAGONAL_EINSUM


class MixStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(Mix(4), Mix(4), Mix(4))

    def forward(self, x):
        return self.body(x)


# ----- accepted: DenseNet as torchvision writes it, at a small width ---------------------------------------------

class _DenseLayer(nn.Module):
    def __init__(self, num_input_features, growth_rate, bn_size):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(num_input_features)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(num_input_features, bn_size * growth_rate, kernel_size=1, stride=1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, kernel_size=3, stride=1, padding=1, bias=False)

    def bn_function(self, inputs):
        concated_features = torch.cat(inputs, 1)
        return self.conv1(self.relu1(self.norm1(concated_features)))

    def any_requires_grad(self, input):
        for tensor in input:
            if tensor.requires_grad:
                return True
        return False

    def forward(self, input):
        if isinstance(input, torch.Tensor):
            prev_features = [input]
        else:
            prev_features = input
        bottleneck_output = self.bn_function(prev_features)
        return self.conv2(self.relu2(self.norm2(bottleneck_output)))


class _DenseBlock(nn.ModuleDict):
    def __init__(self, num_layers, num_input_features, bn_size, growth_rate):
        super().__init__()
        for i in range(num_layers):
            layer = _DenseLayer(num_input_features + i * growth_rate, growth_rate=growth_rate, bn_size=bn_size)
            self.add_module("denselayer%d" % (i + 1), layer)

    def forward(self, init_features):
        features = [init_features]
        for name, layer in self.items():
            new_features = layer(features)
            features.append(new_features)  # after torch.cat(features) was called with the list
        return torch.cat(features, 1)


class _Transition(nn.Sequential):
    def __init__(self, num_input_features, num_output_features):
        super().__init__()
        self.norm = nn.BatchNorm2d(num_input_features)
        self.relu = nn.ReLU(inplace=True)
        self.conv = nn.Conv2d(num_input_features, num_output_features, kernel_size=1, stride=1, bias=False)
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)


class DenseNet(nn.Module):
    def __init__(self, growth_rate=4, block_config=(3, 2), num_init_features=6, bn_size=2, num_classes=5):
        super().__init__()
        self.features = nn.Sequential()
        self.features.add_module("conv0", nn.Conv2d(3, num_init_features, kernel_size=3, padding=1, bias=False))
        self.features.add_module("norm0", nn.BatchNorm2d(num_init_features))
        self.features.add_module("relu0", nn.ReLU(inplace=True))
        num_features = num_init_features
        for i, num_layers in enumerate(block_config):
            block = _DenseBlock(num_layers, num_features, bn_size, growth_rate)
            self.features.add_module("denseblock%d" % (i + 1), block)
            num_features = num_features + num_layers * growth_rate
            if i != len(block_config) - 1:
                trans = _Transition(num_features, num_features // 2)
                self.features.add_module("transition%d" % (i + 1), trans)
                num_features = num_features // 2
        self.features.add_module("norm5", nn.BatchNorm2d(num_features))
        self.classifier = nn.Linear(num_features, num_classes)

    def forward(self, x):
        features = self.features(x)
        out = F.relu(features, inplace=True)
        out = F.adaptive_avg_pool2d(out, (1, 1))
        out = torch.flatten(out, 1)
        return self.classifier(out)


class OptionalSkips(nn.Module):
    """A decoder that concatenates whatever skips it has: here none, so torch.cat gets one tensor."""

    def __init__(self, use_skip: bool = False):
        super().__init__()
        self.use_skip = use_skip
        self.encode = conv_bn_relu(2, 4)
        self.decode = nn.Conv2d(4, 2, 3, padding=1)

    def forward(self, x):
        h = self.encode(x)
        parts = [h]
        if self.use_skip:
            parts.append(x)
        return self.decode(torch.cat(parts, dim=1)) + torch.cat([x], 1)
