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


class ChannelRamp(nn.Module):
    """A constant of several values made inside forward: it needs to be a buffer."""

    def forward(self, x):
        ramp = torch.arange(x.shape[1], dtype=x.dtype).view(1, -1, 1, 1)
        return x * ramp  # RAMP


class Blurred(nn.Module):
    """A fixed 3x3 box-blur kernel made inside forward, as a conv weight: it needs to be a buffer."""

    def forward(self, x):
        kernel = torch.ones(x.shape[1], 1, 3, 3, dtype=x.dtype) / 9
        return F.conv2d(x, kernel, padding=1, groups=x.shape[1])  # BLUR


class WidthRamp(nn.Module):
    """A constant of several values whose size follows the input's width: no spec can hold it."""

    def forward(self, x):
        return x + torch.sin(torch.arange(x.shape[-1], dtype=x.dtype))  # SINE_POSITIONS


class WidthScaled(nn.Module):
    """A constant whose value is computed from the input's size."""

    def forward(self, x):
        return x * torch.tensor(float(x.shape[-1]))  # WIDTH


class NoiseLevel(nn.Module):
    """FFDNet's map in other spellings: ones_like on a slice times a number, new_full, in place."""

    def forward(self, x):
        level = torch.ones_like(x[:, :1]) * 0.25  # ONES LIKE
        level += 0.5
        shifted = x - torch.full_like(x, 0.125)
        return torch.cat([shifted, level, x.new_full((x.shape[0], 2, *x.shape[2:]), -1.0)], dim=1)


class Overwritten(nn.Module):
    """A constant map written into after it is made, directly and through a view: no longer one value."""

    def __init__(self, through_view: bool = False):
        super().__init__()
        self.through_view = through_view

    def forward(self, x):
        level = torch.zeros_like(x)
        if self.through_view:
            level[:, :1].copy_(x[:, :1])
        else:
            level[:, :1] = x[:, :1]  # SETITEM
        return torch.cat([x, level], dim=1)  # OVERWRITTEN
