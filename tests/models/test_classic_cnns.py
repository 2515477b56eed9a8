"""Real models in: classic CNNs written as nn.Modules (``tests/models/classic.py``), each traced in train
mode with its first loss and in eval mode with its second (``compare.matches_autograd(...,
one_loss_per_mode=True)``), generated, and compared in float64 with autograd through the original module, at
a batch size and spatial size other than the traced ones, with a random cotangent."""

from __future__ import annotations

import pytest
import torch

from symgrad.pipeline import build_text
from tests.models import classic as models
from tests.models.compare import (
    CLASSIFIER,
    RESTORATION,
    Case,
    matches_autograd,
    traced_spec,
)

CASES = {
    "resnet18": Case(models.ResNet18, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 24, 24)}, CLASSIFIER),
    "unet_bilinear": Case(models.UNet, {"x": (2, 1, 16, 16)}, {"x": (3, 1, 24, 24)}, RESTORATION),
    "unet_transposed": Case(
        models.UNet, {"x": (2, 1, 16, 16)}, {"x": (3, 1, 8, 16)}, ("l1_loss", "mse_loss"), {"bilinear": False}
    ),
    "dncnn": Case(models.DnCNN, {"x": (2, 1, 12, 12)}, {"x": (3, 1, 10, 14)}, RESTORATION),
    "drunet": Case(
        models.DRUNet,
        {"x": (2, 1, 16, 16), "noise_map": (2, 1, 16, 16)},
        {"x": (3, 1, 8, 12), "noise_map": (3, 1, 8, 12)},
        ("l1_loss", "half_sq_error_function"),
    ),
    "vgg11_bn": Case(models.VGG11BN, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 32, 32)}, CLASSIFIER),
    "lenet5": Case(models.LeNet5, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 32, 32)}, ("nll_loss", "mse_loss")),
    "espcn": Case(models.ESPCN, {"x": (2, 1, 8, 8)}, {"x": (3, 1, 6, 10)}, RESTORATION),
    # traced where the last gate's feature map is 1x1: its broadcast must be summed back at every other size
    "se_gate": Case(models.SEStage, {"x": (2, 3, 2, 2)}, {"x": (3, 3, 10, 6)}, RESTORATION),
    # SimpleGate's chunk, channel attention x * sca(x), beta/gamma [1, C, 1, 1], a channel LayerNorm by permutes
    "nafnet": Case(models.NAFNet, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 12, 20)}, RESTORATION),
    "mobilenet_v3": Case(models.MobileNetV3, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 24, 40)}, CLASSIFIER),
    "convnext": Case(models.ConvNeXtBlock, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 12, 20)}, RESTORATION),
    "srcnn": Case(
        models.SRCNN, {"x": (2, 1, 12, 12)}, {"x": (3, 1, 9, 7)}, ("smooth_l1_loss", "half_sq_error_function")
    ),
    # sizes read from another tensor: the ASPP pooling branch's and the logits' interpolate to x.shape[-2:]
    # (size: {like: ...}), at odd sizes where no scale_factor would do
    "deeplabv3": Case(models.DeepLabV3, {"x": (2, 3, 9, 11)}, {"x": (3, 3, 13, 10)}, RESTORATION),
    # a U-Net up-step to the skip's size: F.pad by diffX // 2, diffX - diffX // 2 (pad: {like: ...}), or an
    # interpolate to x2.shape[-2:]; traced where the pad is 1 and checked where it is 0 and 1
    "unet_pad_to_skip": Case(models.OddUNet, {"x": (2, 1, 9, 11)}, {"x": (3, 1, 12, 7)}, RESTORATION),
    "unet_interpolate_to_skip": Case(
        models.OddUNet, {"x": (2, 1, 9, 11)}, {"x": (3, 1, 12, 7)}, RESTORATION, {"how": "interpolate"}
    ),
    # a constant made inside forward: torch.full((n, 1, h, w), sigma) from x.shape, concatenated to x
    "ffdnet": Case(models.FFDNet, {"x": (2, 1, 8, 8)}, {"x": (3, 1, 11, 6)}, RESTORATION),
}
TEST_FILES = ("resnet18", "mobilenet_v3", "nafnet")
"""The networks whose generated test files run (in ``tests/models/test_zoo_blocks.py``): their train-mode
check here reads the spec and module that test reads (``compare.train_files``)."""


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("label", list(CASES))
def test_traced_model_matches_autograd_on_the_original_module(label, mode):
    matches_autograd(label, CASES[label], mode, one_loss_per_mode=True, test_file=label in TEST_FILES)


SIZES_READ = ("deeplabv3", "unet_pad_to_skip", "unet_interpolate_to_skip", "ffdnet")
"""The models whose sizes are read from another tensor at run time (``size: {like: ...}``)."""


@pytest.mark.parametrize("label", SIZES_READ)
def test_generated_test_file_of_a_model_reading_sizes_passes(label, tmp_path):
    """The spec says where each size is read (``{like: ...}``), the generated module prints it as
    ``skip.shape[2]``, and the generated test file passes at its own shapes, with nothing skipped."""
    from tests.helpers import run_generated_tests

    case = CASES[label]
    torch.manual_seed(0)
    model = case.model(**case.init).double().eval()
    text = traced_spec(case, "eval", "mse_loss", model)
    assert "{like: " in text and "shape[2]" not in text, text
    generated = build_text(text, f"{label}.yaml", documents=False).rendered
    assert ".shape[2]" in generated.files[f"{generated.name}.py"]
    for name, content in generated.files.items():
        (tmp_path / name).write_text(content)
    outcomes = run_generated_tests(tmp_path / f"test_{generated.name}.py")
    assert outcomes.ok, outcomes.report
