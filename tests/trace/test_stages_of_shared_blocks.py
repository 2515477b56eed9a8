"""A stage class repeated twice whose layers are blocks the model also runs outside it is written as those
blocks, not as a stage function (timm's ConvNeXt: stages 1 and 3 are a downsample then three blocks, stage 0
has no downsample and stage 2 nine blocks; its module was 1,280 lines with a stage function writing three
blocks out beside the block function, 761 with one block function for all 18 (traced at 2 x 3 x 64², cross entropy, blocks)). A repeated class whose
insides also run elsewhere but are only a small part of it (an inverted residual's SiLU and squeeze-excite,
which the stem runs too) stays one block. Checked: the spec's blocks, and a bound step's gradients against
autograd through the original model (float64, train mode, another batch and image size, three SGD steps)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace
from tests.models.compare import bound_steps_match_autograd


class Block(nn.Module):
    """ConvNeXt's: a depthwise convolution, channels last, a layer norm, an MLP, a layer scale, the residual."""

    def __init__(self, width: int):
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1, groups=width)
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)
        self.gamma = nn.Parameter(torch.full((width,), 0.5))

    def forward(self, x):
        h = self.fc2(F.gelu(self.fc1(self.norm(self.conv(x).permute(0, 2, 3, 1)))))
        return x + (h * self.gamma).permute(0, 3, 1, 2)


class Stage(nn.Module):
    """timm's ConvNeXtStage: an optional downsample (a Sequential of leaf modules), then its blocks."""

    def __init__(self, width_in: int, width: int, depth: int):
        super().__init__()
        self.downsample = (
            nn.Sequential(nn.BatchNorm2d(width_in), nn.Conv2d(width_in, width, 2, stride=2))
            if width_in != width
            else nn.Identity()
        )
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])

    def forward(self, x):
        return self.blocks(self.downsample(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 2, stride=2)
        self.stages = nn.Sequential(Stage(4, 4, 2), Stage(4, 6, 3), Stage(6, 8, 4), Stage(8, 10, 3))
        self.head = nn.Linear(10, 3)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)).mean(dim=(2, 3)))


def test_a_stage_made_of_blocks_run_elsewhere_is_written_as_those_blocks(tmp_path):
    torch.manual_seed(0)
    model = Net().double().train()
    text = trace(
        model, {"x": (2, 3, 32, 32)}, name="staged", loss=LossChoice("cross_entropy"), mode="train", blocks=True
    )
    assert set(yaml.safe_load(text)["blocks"]) == {"block", "batch_norm2d_conv2d"}, text  # no stage block
    assert text.count("{block: block,") == 12 and text.count("{block: batch_norm2d_conv2d,") == 3, text
    source = build_text(text, "staged.yaml").rendered.files["staged.py"]
    assert "def stage_forward" not in source and "def block_forward(" in source
    (tmp_path / "staged.py").write_text(source)

    def batch(generator):
        x = torch.randn(3, 3, 48, 40, generator=generator, dtype=torch.float64)
        return {"x": x}, torch.randint(3, (3,), generator=generator)

    bound_steps_match_autograd(model, tmp_path / "staged.py", batch, F.cross_entropy)


class InvertedResidual(nn.Module):
    """Most of it its own layers; a BatchNorm-SiLU pair inside, which the stem runs too."""

    def __init__(self, width: int):
        super().__init__()
        self.expand = nn.Conv2d(width, 2 * width, 1)
        self.act = nn.Sequential(nn.BatchNorm2d(2 * width), nn.SiLU())
        self.depthwise = nn.Conv2d(2 * width, 2 * width, 3, padding=1, groups=2 * width)
        self.norm = nn.BatchNorm2d(2 * width)
        self.project = nn.Conv2d(2 * width, width, 1)

    def forward(self, x):
        return x + self.project(F.relu(self.norm(self.depthwise(self.act(self.expand(x))))))


class Efficient(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.stem_act = nn.Sequential(nn.BatchNorm2d(4), nn.SiLU())
        self.blocks = nn.Sequential(*[InvertedResidual(4) for _ in range(3)])
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.blocks(self.stem_act(self.stem(x))).mean(dim=(2, 3)))


def test_a_block_with_a_small_shared_part_stays_one_block():
    torch.manual_seed(0)
    text = trace(
        Efficient(), {"x": (2, 3, 8, 8)}, name="efficient", loss=LossChoice("cross_entropy"), mode="train", blocks=True
    )
    assert set(yaml.safe_load(text)["blocks"]) == {"inverted_residual"}, text
    assert text.count("{block: inverted_residual,") == 3, text
