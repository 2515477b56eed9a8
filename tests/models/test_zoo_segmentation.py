"""Segmentation and medical networks (``tests/models/zoo_segmentation.py``: segmentation-models-pytorch decoders on
ResNet- and EfficientNet-style encoders; ``tests/models/zoo_monai.py``: MONAI's networks in 2D and 3D): each traced
in train and eval mode, generated, and compared in float64 with autograd through the original module at
another batch and spatial size, ≤1e-10; and their generated test files pass."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, TraceError, trace
from tests.models import (
    zoo_monai as monai,
    zoo_monai_unet as monai_unet,
    zoo_segmentation as smp,
    zoo_swinunetr as swin,
    zoo_swinunetr_2d as swin2d,
    zoo_unetr as unetr,
)
from tests.models.compare import Case, assert_generated_test_file_passes, matches_autograd
from tests.pipeline import test_blocks

SEGMENTATION = ("mse_loss",)
CASES = {
    # F.interpolate(x, scale_factor=2, mode="nearest"), torch.cat([x, skip], dim=1), features as a list
    "smp_unet_resnet": Case(smp.Unet, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 64, 32)}, SEGMENTATION),
    # the same on MBConv blocks (SiLU, squeeze-excitation, depthwise), with scSE attention in the decoder
    "smp_unet_efficientnet_scse": Case(
        smp.Unet,
        {"x": (2, 3, 32, 32)},
        {"x": (3, 3, 32, 64)},
        SEGMENTATION,
        {"encoder_name": "efficientnet", "decoder_attention_type": "scse"},
    ),
    # lateral 1x1 + nearest upsample-add, GroupNorm(32, C) blocks with bilinear align_corners upsampling,
    # sum() of the four, Dropout2d in place, the head's UpsamplingBilinear2d(scale_factor=4)
    "smp_fpn_resnet": Case(smp.FPN, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 64, 32)}, SEGMENTATION),
    "smp_fpn_efficientnet": Case(
        smp.FPN, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 32, 64)}, SEGMENTATION, {"encoder_name": "efficientnet"}
    ),
    # ASPP on a dilated stride-16 stage: atrous separable convs, the pooling branch interpolated to
    # x.shape[-2:], Dropout(0.5); fused with the stride-4 feature
    "smp_deeplabv3plus": Case(smp.DeepLabV3Plus, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 48, 32)}, SEGMENTATION),
    # on the EfficientNet encoder, its last stage dilated by smp's make_dilated (stride 1, dilation 2)
    "smp_deeplabv3plus_efficientnet": Case(
        smp.DeepLabV3Plus, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 32, 48)}, SEGMENTATION, {"encoder_name": "efficientnet"}
    ),
    # 1x1, ConvTranspose2d(4, stride 2, padding 1), 1x1, `x + skip`
    "smp_linknet_resnet": Case(smp.Linknet, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 64, 32)}, SEGMENTATION),
    "smp_linknet_efficientnet": Case(
        smp.Linknet, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 32, 64)}, SEGMENTATION, {"encoder_name": "efficientnet"}
    ),
    # FPA's interpolations to (h // 4, w // 4) and (h // 2, w // 2) of x.size(): traced where the stride-16 map
    # is 8x8 and checked where it is 10x8 (a ratio frozen at the traced size would give 2x2 -> 5x4 wrong)
    "smp_pan": Case(smp.PAN, {"x": (2, 3, 128, 128)}, {"x": (3, 3, 160, 128)}, SEGMENTATION),
    "smp_pan_efficientnet": Case(
        smp.PAN, {"x": (2, 3, 128, 128)}, {"x": (3, 3, 128, 160)}, SEGMENTATION, {"encoder_name": "efficientnet"}
    ),
    # the nested dense skips in a dict, torch.cat of a growing list
    "smp_unetplusplus_resnet": Case(smp.UnetPlusPlus, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 64, 32)}, SEGMENTATION),
    "smp_unetplusplus_efficientnet": Case(
        smp.UnetPlusPlus, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 32, 64)}, SEGMENTATION, {"encoder_name": "efficientnet"}
    ),
    # GroupNorm(8, C), ReLU in place, `x += identity`, a strided conv down, a 1x1 conv and nn.Upsample(bilinear /
    # trilinear, align_corners=True) up, `up(x) + down_x[i + 1]`
    "monai_segresnet_2d": Case(
        monai.SegResNet, {"x": (2, 1, 16, 16)}, {"x": (3, 1, 24, 16)}, SEGMENTATION, {"spatial_dims": 2}
    ),
    "monai_segresnet_3d": Case(monai.SegResNet, {"x": (2, 1, 8, 8, 8)}, {"x": (3, 1, 8, 16, 8)}, SEGMENTATION),
    # UnetResBlocks with InstanceNorm(affine) and LeakyReLU, transposed-conv up blocks, skip layers built
    # recursively; in train mode the deep supervision heads, written into a list by the skip layers,
    # F.interpolate(feature_map, out.shape[2:]) (nearest) and torch.stack-ed with the output
    "monai_dynunet_2d": Case(
        monai.DynUNet,
        {"x": (2, 1, 16, 16)},
        {"x": (3, 1, 24, 16)},
        SEGMENTATION,
        {"spatial_dims": 2, "kernel_size": (3, 3, 3, 3)},
    ),
    "monai_dynunet_3d": Case(monai.DynUNet, {"x": (2, 1, 16, 8, 8)}, {"x": (3, 1, 8, 16, 16)}, SEGMENTATION),
    # MONAI's attention gate (1x1 convs + BatchNorm, ReLU, sigmoid psi, `x * psi`), transposed-conv up
    # (output_padding = stride - 1), Convolution's conv + ADN (InstanceNorm, PReLU) merge
    "monai_attentionunet_2d": Case(
        monai.AttentionUnet, {"x": (2, 1, 16, 16)}, {"x": (3, 1, 8, 24)}, SEGMENTATION, {"spatial_dims": 2}
    ),
    "monai_attentionunet_3d": Case(monai.AttentionUnet, {"x": (2, 1, 8, 8, 8)}, {"x": (3, 1, 8, 4, 12)}, SEGMENTATION),
    # MONAI's UNet: Sequential(down, SkipConnection(subblock), up) built recursively, strided ResidualUnits of
    # Convolution + InstanceNorm + PReLU (one shared slope), transposed-conv up paths, torch.cat skips
    "monai_unet_2d": Case(monai_unet.UNet, {"x": (2, 1, 16, 16)}, {"x": (3, 1, 24, 16)}, SEGMENTATION),
    "monai_unet_3d": Case(
        monai_unet.UNet, {"x": (2, 1, 8, 8, 8)}, {"x": (3, 1, 8, 16, 12)}, SEGMENTATION, {"spatial_dims": 3}
    ),
    # TwoConv (InstanceNorm affine, LeakyReLU 0.1), Down by MaxPool, UpCat's deconv, the skip cat; at sizes
    # divisible by 16 UpCat's replicate pad is [0, 0, 0, 0] (at odd pooled sizes: refused, test below)
    "monai_basicunet_2d": Case(
        monai.BasicUNet, {"x": (2, 1, 16, 32)}, {"x": (3, 1, 32, 16)}, SEGMENTATION, {"spatial_dims": 2}
    ),
    "monai_basicunet_3d": Case(monai.BasicUNet, {"x": (2, 1, 16, 16, 32)}, {"x": (3, 1, 16, 32, 16)}, SEGMENTATION),
    # MONAI's whole UNETR: a ViT (conv patch embedding, flatten(2).transpose(-1, -2), position embedding, 12
    # einops-attention blocks whose hidden states 3, 6, 9 feed the skips), proj_feat's view/permute, transposed
    # conv + instance-norm residual decoder blocks; the position embedding fixes the size: another batch only
    "monai_unetr_2d": Case(
        unetr.UNETR, {"x_in": (2, 1, 32, 32)}, {"x_in": (3, 1, 32, 32)}, SEGMENTATION, {"spatial_dims": 2}
    ),
    "monai_unetr_3d": Case(unetr.UNETR, {"x_in": (2, 1, 32, 32, 32)}, {"x_in": (3, 1, 32, 32, 32)}, SEGMENTATION),
    # SwinUNETR's first stage in 3D: patch embedding, a plain and a shifted window block (the relative position
    # bias table indexed by `relative_position_index.clone()[:n, :n].reshape(-1)`, torch.roll over three dims,
    # the mask a buffer made in __init__), patch merging by `x[:, 0::2, 1::2, 0::2, :]` and torch.cat, the
    # hidden state layer-normed through einops, the instance-norm UNETR block; at another batch (the mask is
    # built for one resolution)
    "monai_swinunetr_stage_3d": Case(
        swin.SwinUNETRStage, {"x_in": (2, 1, 16, 16, 16)}, {"x_in": (3, 1, 16, 16, 16)}, SEGMENTATION
    ),
    # the same stage in 2D, MONAI's len(x_shape) == 4 branches: 2D windows and relative index, roll over two dims
    "monai_swinunetr_stage_2d": Case(
        swin2d.SwinUNETRStage2D, {"x_in": (2, 1, 16, 16)}, {"x_in": (3, 1, 16, 16)}, SEGMENTATION
    ),
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("label", list(CASES))
def test_segmentation_network_matches_autograd_on_the_original_module(label, mode):
    matches_autograd(label, CASES[label], mode, one_loss_per_mode=True, test_file=label in GENERATED_TESTS)


DROPOUT = {"smp_fpn_resnet", "smp_fpn_efficientnet", "smp_deeplabv3plus", "smp_deeplabv3plus_efficientnet"}
"""Train-mode dropout: the blocks check draws the model's and the module's masks from different seeds."""


@pytest.mark.parametrize("label", list(CASES))
def test_segmentation_network_traced_as_blocks_matches_autograd(label, monkeypatch):
    """The same, each repeated submodule one block (``symgrad trace``'s default form), by the blocks check of
    ``tests/pipeline/test_blocks.py``: in train mode (eval where the network has dropout)."""
    monkeypatch.setitem(test_blocks.TRACED, label, (CASES[label], None, True))
    test_blocks.test_a_traced_model_with_blocks_matches_autograd_on_the_original_module(
        label, "eval" if label in DROPOUT else "train"
    )


def test_basicunet_pad_decided_from_sizes_is_refused_at_its_line_at_odd_sizes():
    """MONAI's UpCat pads its upsampled map by one (replicate) where the skip is one larger, a decision taken in
    Python from the two sizes: at 18x36, where it pads, the trace's second run at other sizes pads elsewhere,
    and the pad is refused at its line, once, naming the three up-steps (sizes divisible by 16 go in, above)."""
    with pytest.raises(TraceError) as caught:
        trace(
            monai.BasicUNet(spatial_dims=2).double(), {"x": (2, 1, 18, 36)}, name="refused", loss=LossChoice("mse_loss")
        )
    lines = str(caught.value).splitlines()
    assert len(lines) == 1, lines
    line = next(
        number
        for number, text in enumerate(Path(monai.__file__).read_text().splitlines(), 1)
        if 'x_0 = torch.nn.functional.pad(x_0, sp, "replicate")' in text
    )
    assert lines[0].startswith(f"{monai.__file__}:{line}: error: 'pad' (in 3 modules: upcat_4, upcat_3, upcat_2)"), (
        lines
    )
    assert "computed from the input's size" in lines[0] and "(fix: " in lines[0], lines


def test_swinunetr_is_refused_at_the_line_that_adds_its_forward_made_mask():
    """The whole SwinUNETR (its input at least 32 and once 64 per dim): ``compute_mask`` builds the shifted
    windows' mask in ``forward`` from numbers, 2^19 values at the first stage: refused once, where it is added,
    with the fix (a buffer made in ``__init__``: ``SwinUNETRFixedMasks``). Its last stage, where the 2x2x4 map is
    smaller than the window, indexes the bias table with ``relative_position_index.clone()[:n, :n]``, a corner
    of the index buffer: that goes in (the table indexed by the buffer, then narrowed)."""
    with pytest.raises(TraceError) as caught:
        trace(swin.SwinUNETR().double(), {"x_in": (2, 1, 32, 32, 64)}, name="refused", loss=LossChoice("mse_loss"))
    lines = str(caught.value).splitlines()
    line = next(
        number
        for number, text in enumerate(Path(swin.__file__).read_text().splitlines(), 1)
        if "attn = attn.view(b // nw, nw, self.num_heads, n, n) + mask" in text
    )
    assert len(lines) == 1 and lines[0].startswith(f"{swin.__file__}:{line}: error: 'add' (in 3 modules: "), lines
    assert "made inside the traced code from numbers" in lines[0] and "register_buffer" in lines[0], lines


GENERATED_TESTS = [
    "smp_unet_resnet",
    "smp_fpn_resnet",
    "smp_pan",
    "monai_dynunet_3d",
    "monai_basicunet_2d",
    "monai_unet_3d",
    "monai_unetr_2d",
    "monai_swinunetr_stage_3d",
    "monai_swinunetr_stage_2d",
]
"""The networks whose generated test files run here (each a minute or more on 2 cores; FPN's 8 s at its small
shapes, train-mode Dropout2d drawn by the seeded tests). Left out, for CI's time: the EfficientNet-encoder U-Net
(451 s on the loaded 2-core machine; its flat module's file passed) and FPN on it (7 passed, 60 s in the block
form, 28 s flat: its summed-loss test's bound follows autograd's own rounding, 1e-12..6.6e-12 there, where
GroupNorm(32, 32) on the 1x1 map makes autograd's gradient rounding noise)."""


@pytest.mark.slow
@pytest.mark.parametrize("label", GENERATED_TESTS)
def test_segmentation_networks_own_generated_test_file_passes(label, tmp_path):
    assert_generated_test_file_passes(label, CASES[label], tmp_path)


class CornerBias(torch.nn.Module):
    """A relative position bias read through a corner of its index buffer, as SwinUNETR's window attention reads
    it where the map is smaller than the window: ``table[index.clone()[:n, :n].reshape(-1)]``."""

    def __init__(self, window=4, heads=3, n=8):
        super().__init__()
        self.n = n  # the tokens of a window shrunk to the map: fixed for the resolution the model is built for
        self.relative_position_bias_table = torch.nn.Parameter(torch.randn(2 * window * window, heads))
        self.register_buffer("relative_position_index", torch.randint(0, 2 * window * window, (window**2, window**2)))

    def forward(self, attn):
        n = self.n
        bias = self.relative_position_bias_table[self.relative_position_index.clone()[:n, :n].reshape(-1)].reshape(
            n, n, -1
        )
        return attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)


def test_a_corner_of_an_index_buffer_is_the_table_indexed_by_the_buffer_then_narrowed():
    """Traced where n = 8 of the buffer's 16: index, narrow, narrow, reshape; the gradients match autograd through
    the module at another batch (the corner's size is the traced one: the bias is for one window size)."""
    torch.manual_seed(0)
    model = CornerBias().double()
    text = trace(model, {"attn": (2, 3, 8, 8)}, name="corner", loss=LossChoice("mse_loss"))
    assert [line.split(",")[0] for line in text.splitlines() if "{op:" in line][:4] == [
        "  - {op: index",
        "  - {op: narrow",
        "  - {op: narrow",
        "  - {op: reshape",
    ], text
    rendered = build_text(text, "corner.yaml").rendered
    module = type(sys)("corner")
    exec(compile(rendered.files["corner.py"], "corner.py", "exec"), module.__dict__)
    attn = torch.randn(5, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    target = torch.randn(5, 3, 8, 8, dtype=torch.float64)
    expected = torch.autograd.grad(
        torch.nn.functional.mse_loss(model(attn), target), [attn, model.relative_position_bias_table]
    )
    actual = module.gradients(attn=attn, target=target, params=dict(model.state_dict()))  # keyed as state_dict()
    assert (actual.attn - expected[0]).abs().max() <= 1e-12
    assert (actual.params["relative_position_bias_table"] - expected[1]).abs().max() <= 1e-12


@pytest.mark.slow
def test_the_whole_swinunetr_with_its_masks_as_buffers_matches_autograd():
    """SwinUNETR (four stages, the last one's window shrunk to its 2x2x4 map and its bias read through a corner of
    the index buffer, the UNETR decoder at full resolution) with the workaround for its forward-made mask: train
    mode, another batch (the masks are built for one resolution): traced at batch 1, checked at batch 2 (was 2 and 3:
    38 s of CI's slowest test for the same ops)."""
    matches_autograd(
        "swinunetr",
        Case(swin.SwinUNETRFixedMasks, {"x_in": (1, 1, 32, 32, 64)}, {"x_in": (2, 1, 32, 32, 64)}, SEGMENTATION),
        "train",
    )
