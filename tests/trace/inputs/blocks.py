"""A model file that others import (``from blocks import ...``), as repositories split them."""

import torch
import torch.nn as nn


class Odd(nn.Module):
    """Two ops no rule covers, in a submodule, plus a log line that never reaches the loss."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x):
        print_norm = x.norm()  # logging: not on the loss's path, so not an error
        del print_norm
        x = torch.cumsum(self.conv(x), dim=1)  # CUMSUM
        return torch.flip(x, dims=[3])  # FLIP


class Net(nn.Module):
    def __init__(self, width: int = 2, scale: float = 1.0):
        super().__init__()
        if width < 1:
            raise ValueError("width must be positive")  # CONSTRUCTOR
        self.stem = nn.Conv2d(1, width, 3, padding=1)
        self.block = Odd() if width == 2 else nn.Identity()
        self.scale = scale

    def forward(self, x):
        return self.block(self.stem(x)) * self.scale


class Noisy(nn.Module):
    """DRUNet-style: a noise level argument as a number."""

    def __init__(self, in_nc: int = 1, nc=(4, 8)):
        super().__init__()
        self.head = nn.Conv2d(in_nc, nc[0], 3, padding=1)
        self.tail = nn.Conv2d(nc[0], in_nc, 3, padding=1)

    def forward(self, x, sigma: float):
        return self.tail(torch.relu(self.head(x)) * sigma)


class Padded(nn.Module):
    """Pads to the size of a skip connection, as U-Nets do: the pad depends on the input's size."""

    def __init__(self):
        super().__init__()
        self.down = nn.MaxPool2d(2)
        self.up = nn.Upsample(scale_factor=2)

    def forward(self, x):
        y = self.up(self.down(x))
        y = nn.functional.pad(y, [0, x.size(3) - y.size(3), 0, x.size(2) - y.size(2)])  # PAD
        return torch.cat([x, y], dim=1)


class Dropping(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.conv(x))  # DROPOUT
