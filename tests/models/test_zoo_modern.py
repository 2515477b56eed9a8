"""The networks people train now (``tests/models/zoo_modern.py``): traced in train and eval mode, generated, and
compared in float64 with autograd through the original module at another batch (and spatial size, where
the network allows: Swin builds its shifted-window masks for one resolution, so it is checked at another
batch only), each ≤1e-10; and their generated test files pass."""

from __future__ import annotations

import pytest

from tests.models import zoo_modern as zoo
from tests.models.compare import Case, assert_generated_test_file_passes, matches_autograd

CASES = {
    # window partition/merge as view/permute chains, the relative position bias table indexed by a constant
    # int64 buffer, torch.roll-shifted windows with their -100 mask (a buffer), q @ k^T, softmax, LayerNorm
    "swin": Case(zoo.SwinStage, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 16, 16)}, ("cross_entropy",)),
    # SwinV2's cosine attention: F.normalize, torch.clamp(logit_scale, max=log(100)).exp()
    "swinv2": Case(zoo.SwinStage, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 16, 16)}, ("cross_entropy",), {"cosine": True}),
    # GRN: torch.norm(x, p=2, dim=(1, 2), keepdim=True), channels-last nn.Linear and LayerNorm
    "convnextv2": Case(zoo.ConvNeXtV2, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 24, 16)}, ("cross_entropy",)),
    # sinusoidal timesteps (arange, exp, sin, cos, cat: a constant of the spec), the MLP, GroupNorm and SiLU
    # ResNet blocks the embedding is added to, GroupNorm(1, C), nn.Identity, nearest upsampling
    "diffusion_unet": Case(
        zoo.TinyDiffusionUNet,
        {"sample": (2, 3, 8, 8), "timestep": (2,)},
        {"sample": (3, 3, 12, 8), "timestep": (3,)},
        ("mse_loss",),
    ),
    # UnetBasicBlock and a strided UnetResBlock in 3D: Conv3d, InstanceNorm3d (affine; running statistics),
    # LeakyReLU in place, the residual added in place
    "monai_blocks_3d": Case(zoo.MonaiBlocks3D, {"x": (2, 1, 6, 6, 6)}, {"x": (3, 1, 4, 6, 8)}, ("mse_loss",)),
    # 3D U-Net: instance norm, MaxPool3d, BatchNorm3d, PReLU, GroupNorm, trilinear upsampling, ConvTranspose3d,
    # a skip cat and a 3D average pool
    "unet3d": Case(zoo.UNet3D, {"x": (2, 1, 8, 8, 8)}, {"x": (3, 1, 4, 8, 6)}, ("mse_loss",)),
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("label", list(CASES))
def test_modern_network_matches_autograd_on_the_original_module(label, mode):
    matches_autograd(label, CASES[label], mode, one_loss_per_mode=True, test_file=True)  # every file runs below


@pytest.mark.slow
@pytest.mark.parametrize("label", list(CASES))
def test_modern_networks_own_generated_test_file_passes(label, tmp_path):
    assert_generated_test_file_passes(label, CASES[label], tmp_path)
