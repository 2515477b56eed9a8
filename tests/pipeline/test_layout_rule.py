"""The channels_last rule (symgrad/roles.py) leaves a model in the default layout where PyTorch 2.13's CPU
backward of a strided 1x1 convolution in channels_last aborts the process (fewer than 16 input channels):
a toy ResNet's downsample; with 16 input channels the same model moves."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from symgrad.pipeline import build_text
from symgrad.roles import FEWEST_CHANNELS_STRIDED_1X1
from symgrad.trace import trace


class Down(nn.Module):
    """A stem convolution, then a ResNet downsample's 1x1 stride-2 convolution beside a 3x3 one."""

    def __init__(self, width: int):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.down = nn.Conv2d(width, 2 * width, 1, stride=2, bias=False)
        self.conv = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        return self.down(h) + self.conv(h)


@pytest.mark.parametrize("width, moves", [(4, False), (FEWEST_CHANNELS_STRIDED_1X1 - 1, False), (16, True)])
def test_a_strided_1x1_convolution_with_few_input_channels_keeps_the_default_layout(width, moves):
    torch.manual_seed(0)
    text = trace(Down(width).double(), {"x": (2, 3, 16, 16)}, name="down", mode="train")
    module = build_text(text, "down.yaml").rendered.files["down.py"]
    assert ("CHANNELS_LAST_FROM" in module) == moves
    assert ("channels_last" in module) == moves
