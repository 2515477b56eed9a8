"""Sizes read from other tensors, and constants made inside forward, as model code writes them."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Doubled(nn.Module):
    """An interpolate to twice the input's size, computed from it: no tensor has that size."""

    def forward(self, x):
        return F.interpolate(x, size=(2 * x.shape[2], 2 * x.shape[3]), mode="nearest")  # DOUBLED


class PaddedAfter(nn.Module):
    """Pads all of the difference after, to the size of a skip three times smaller: not U-Net's split."""

    def __init__(self):
        super().__init__()
        self.down = nn.MaxPool2d(3)
        self.up = nn.Upsample(scale_factor=3)

    def forward(self, x):
        y = self.up(self.down(x))
        y = F.pad(y, [0, x.size(3) - y.size(3), 0, x.size(2) - y.size(2)])  # PADDED AFTER
        return torch.cat([x, y], dim=1)
