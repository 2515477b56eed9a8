"""The seed's third problem as the asker wrote it in PyTorch, for `symgrad trace`.

    symgrad trace examples/seed_pytorch.py:loss --shape z=8,32,128,128 --shape q1=32,32,3,3 \\
        --shape q2=1,32,3,3 --wrt z,q1,q2 -o traced.yaml
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

generator = torch.Generator().manual_seed(0)
k = torch.randn(512, 1, 32, 32, generator=generator)
y = torch.randn(8, 512, 4, 4, generator=generator)


def loss(z, q1, q2):
    z_forward = F.conv2d(z, q1, padding=1)  # z = w1 * x
    z_forward = F.relu(z_forward, inplace=True)  # z = ReLU(w1 * x)
    z_forward = F.conv2d(z_forward, q2, padding=1)  # z = w2 * ReLU(w1 * x)
    return 0.5 * (F.conv2d(z_forward, k, stride=32) - y).pow(2).sum(dim=[1, 2, 3])


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(x))), scored against a target: a small residual block."""

    def __init__(self, channels: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)

    def forward(self, x, target):
        h = F.conv2d(x, self.conv1.weight, self.conv1.bias, padding=1)
        r = F.conv2d(torch.relu(h), self.conv2.weight, padding=1)
        return 0.5 * ((x + r) - target).pow(2).sum()


def uses_cumsum(x, y):
    """A running sum is no op symgrad has a rule for: trace names it, with this file's line."""
    return 0.5 * (torch.cumsum(x, dim=1) - y).pow(2).sum()
