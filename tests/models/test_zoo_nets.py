"""Whole upstream-style networks (``tests/models/zoo_nets.py``) in: each traced in train and eval mode, generated,
and compared in float64 with autograd through the original module at another batch and (mostly
non-square) spatial size, ≤1e-10. Where symgrad refuses a network as its authors write it, the test pins
the refusal as it is today: which lines, once each, and what is said; a second, named variant then shows
the rest of the network through."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, TraceError, trace
from tests.models import zoo_nets
from tests.models.compare import Case, assert_generated_test_file_passes, matches_autograd

CLASSIFIER = ("cross_entropy",)
RESTORATION = ("mse_loss",)
CASES = {
    # a list of features handed to each dense layer and torch.cat-ed; avg-pool transitions; F.adaptive_avg_pool2d
    "densenet": Case(zoo_nets.DenseNet, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 24, 40)}, CLASSIFIER),
    # memory_efficient=True: torchvision's any_requires_grad sends each bottleneck through torch.utils.checkpoint
    # when its inputs need grad, which they do not while tracing (that branch is not what is traced), and do in
    # the check: autograd's reference goes through the checkpoints
    "densenet_memory_efficient": Case(
        zoo_nets.DenseNet, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 24, 40)}, CLASSIFIER, {"memory_efficient": True}
    ),
    # torchvision's Bottleneck: `out += identity`, the downsample Sequential, _make_layer, torch.flatten
    "resnet50": Case(zoo_nets.ResNet, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 24, 40)}, CLASSIFIER),
    # the same with grouped 3x3 convs (groups=4, width_per_group=32)
    "resnext": Case(zoo_nets.resnext, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 24, 40)}, CLASSIFIER),
    # SE gates of 1x1 convs on AdaptiveAvgPool2d(1), traced where the last stage's map is 1x1; x.view(x.size(0), -1)
    "se_resnet_conv_gate": Case(
        zoo_nets.SEResNet, {"x": (2, 3, 4, 4)}, {"x": (3, 3, 12, 20)}, CLASSIFIER, {"se_layer": "conv"}
    ),
    # SENet ports' gate, `b, c, _, _ = x.size()`, `view(b, c)`, nn.Linear, `view(b, c, 1, 1)`, then `x * y`
    "se_resnet_linear_gate": Case(
        zoo_nets.SEResNet, {"x": (2, 3, 4, 4)}, {"x": (3, 3, 12, 20)}, CLASSIFIER, {"se_layer": "linear_broadcast"}
    ),
    # the popular SENet ports' gate: `y.view(b, c)`, nn.Linear, `x * y.expand_as(x)`
    "se_resnet_expand_as_gate": Case(zoo_nets.SEResNet, {"x": (2, 3, 4, 4)}, {"x": (3, 3, 12, 20)}, CLASSIFIER),
    # torchvision's RegNet block names, `block1-0`: a state_dict key with a hyphen
    "regnety": Case(zoo_nets.RegNetY, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 12, 20)}, CLASSIFIER),
    # group conv, `scale * input` SE gate; traced where the last stage's map is 1x1; blocks named b0, b1 (timm)
    "regnety_plain_names": Case(
        zoo_nets.RegNetY, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 12, 20)}, CLASSIFIER, {"block_name": "b{index}"}
    ),
    # inverted residuals, depthwise convs, ReLU6, `return x + self.conv(x)`, _make_divisible
    "mobilenet_v2": Case(zoo_nets.MobileNetV2, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 24, 40)}, CLASSIFIER),
    # MBConv with SiLU and an SE on x.mean((2, 3), keepdim=True), nn.Identity when there is no expansion
    "efficientnet_b0": Case(zoo_nets.EfficientNet, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 24, 40)}, CLASSIFIER),
    # torch.split(out, width, 1), each split added to the previous one's output, torch.cat of a list
    "res2net": Case(zoo_nets.Res2Net, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 12, 20)}, CLASSIFIER),
    # weight standardization with w.mean / w.var(unbiased=False) in forward, then F.conv2d; GroupNorm; x[..., 0, 0]
    # BiT's StdConv2d as Google's code writes it: `v, m = torch.var_mean(w, dim=[1, 2, 3], keepdim=True, ...)`
    "bit": Case(zoo_nets.ResNetV2, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 24, 40)}, CLASSIFIER),
    "bit_mean_var": Case(
        zoo_nets.ResNetV2, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 24, 40)}, CLASSIFIER, {"conv": "mean_var"}
    ),
    # timm's StdConv2d: F.batch_norm(self.weight.reshape(1, out, -1), None, None, training=True).reshape_as(weight)
    "bit_timm_std_conv": Case(
        zoo_nets.ResNetV2, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 24, 40)}, CLASSIFIER, {"conv": "batch_norm"}
    ),
    # ScaledStdConv2d: F.batch_norm over the weight with a gain, reshape_as; `out * alpha + shortcut`
    "nf_resnet": Case(zoo_nets.NFResNet, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 24, 40)}, CLASSIFIER),
    # MeanShift as a frozen 1x1 conv, `.mul(res_scale)` then `res += x`, conv + PixelShuffle upsampler
    "edsr": Case(zoo_nets.EDSR, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 6, 10)}, RESTORATION),
    # residual groups of channel-attention blocks (`x * y`, y of [N, C, 1, 1])
    "rcan": Case(zoo_nets.RCAN, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 6, 10)}, RESTORATION),
    # dense blocks of growing torch.cat tuples, `x5 * 0.2 + x`, nearest F.interpolate(scale_factor=2)
    "rrdbnet": Case(zoo_nets.RRDBNet, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 6, 10)}, RESTORATION),
    # attention gates psi = Sigmoid(BN(conv)) of one channel, `x * psi`, nn.Upsample(scale_factor=2), skip cats
    # Oktay et al.'s grid attention gate as their code writes it: F.interpolate(..., size=theta_x_size[2:]),
    # sigm_psi_f.expand_as(x) * x; and written sigm_psi_f * x
    "grid_attention_unet": Case(
        zoo_nets.GridAttentionUNet, {"inputs": (2, 1, 16, 16)}, {"inputs": (3, 1, 8, 24)}, RESTORATION
    ),
    "grid_attention_unet_broadcast": Case(
        zoo_nets.GridAttentionUNet,
        {"inputs": (2, 1, 16, 16)},
        {"inputs": (3, 1, 8, 24)},
        RESTORATION,
        {"expand": False},
    ),
    "attention_unet": Case(zoo_nets.AttU_Net, {"x": (2, 1, 16, 16)}, {"x": (3, 1, 8, 12)}, RESTORATION),
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("label", list(CASES))
def test_upstream_network_matches_autograd_on_the_original_module(label, mode):
    matches_autograd(label, CASES[label], mode, one_loss_per_mode=True, test_file=label in GENERATED_TEST_CASES)


SOURCE = Path(zoo_nets.__file__)


def line_of(text: str) -> str:
    """The line number in zoo_nets.py of the one line holding ``text``."""
    numbers = [str(number) for number, line in enumerate(SOURCE.read_text().splitlines(), 1) if text in line]
    assert len(numbers) == 1, (text, numbers)
    return numbers[0]


def at(line: str) -> tuple[str, str]:
    """``FILE:LINE: error: WHAT (fix: ...)`` of zoo_nets.py -> (LINE, "error: WHAT")."""
    match = re.match(r"(.*):(\d+): (error: .*?) \(fix: ", line)
    assert match and Path(match.group(1)).resolve() == SOURCE.resolve(), line
    return match.group(2), match.group(3)


def refusal(model: torch.nn.Module, shapes: dict, loss: str = "cross_entropy") -> list[str]:
    with pytest.raises(TraceError) as caught:
        trace(model.double(), shapes, name="refused", loss=LossChoice(loss))
    return str(caught.value).splitlines()


def test_nf_resnet_scalar_skipinit_gain_is_refused_at_the_line_that_reads_it():
    """timm's NF-ResNet with skipinit: ``nn.Parameter(torch.tensor(0.))``, a 0-dim parameter, which a spec
    cannot hold (shapes of 1 to 8 dims): refused once at the line that multiplies by it, with a fix
    (``nf_resnet`` is timm's default, skipinit=False)."""
    lines = refusal(zoo_nets.NFResNet(skipinit=True), {"x": (2, 3, 32, 32)})
    assert len(lines) == 1, lines
    line, what = at(lines[0])
    assert line == line_of("out.mul_(self.skipinit_gain)"), lines
    assert "reads 'stages_0_skipinit_gain', a 0-dim parameter or buffer" in what, lines
    assert "nn.Parameter(torch.zeros(1))" in lines[0], lines


def test_efficientnet_stochastic_depth_trains_with_the_models_own_masks_and_goes_through_in_eval_mode(tmp_path):
    """timm's drop_path, ``x.new_empty((x.shape[0], 1, 1, 1)).bernoulli_(keep).div_(keep)``: in train mode the
    generated forward draws each mask as the model does, so from one seed a bound training step equals
    autograd's (float64, another batch and size); in eval mode the branch is not taken."""
    import copy

    import torch.nn.functional as F

    import symgrad

    torch.manual_seed(0)
    model = zoo_nets.EfficientNet(drop_path_rate=0.2).double().train()
    reference = copy.deepcopy(model)
    built = build_text(
        trace(model, {"x": (2, 3, 32, 32)}, "parameters", "efficientnet_drop_path", mode="train"),
        "efficientnet_drop_path.yaml",
        documents=False,
    )
    path = tmp_path / "efficientnet_drop_path.py"
    path.write_text(built.rendered.files[path.name])
    assert "bernoulli_" in path.read_text()  # the mask is drawn, not frozen
    fast = symgrad.bind(path, model, verify=False)  # compared with autograd below
    x = torch.randn(3, 3, 24, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(3) % 10
    for net in (fast, reference):
        torch.manual_seed(5)
        F.cross_entropy(net(x), labels).backward()
    scale = max(parameter.grad.abs().max().item() for parameter in reference.parameters())  # some are 0 by structure
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
        assert (ours.grad - theirs.grad).abs().max().item() <= 1e-10 * scale, name
    case = Case(
        zoo_nets.EfficientNet, {"x": (2, 3, 32, 32)}, {"x": (3, 3, 24, 40)}, CLASSIFIER, {"drop_path_rate": 0.2}
    )
    matches_autograd("efficientnet_b0_drop_path", case, "eval")


GENERATED_TEST_CASES = ["densenet", "res2net", "attention_unet"]


@pytest.mark.slow
@pytest.mark.parametrize("label", GENERATED_TEST_CASES)
def test_upstream_networks_own_generated_test_file_passes(label, tmp_path):
    """The test file written beside the traced network's module runs and passes in a subprocess."""
    assert_generated_test_file_passes(label, CASES[label], tmp_path)


@pytest.mark.parametrize("label", ["bit", "bit_mean_var"])
def test_bit_traced_as_blocks_matches_autograd(label, monkeypatch):
    """timm's BiT once built a block-form module that raised NameError on a flat parameter name: as ``symgrad
    trace`` writes it by default (each repeated submodule one block), it builds and matches autograd through the
    original module at another batch and size, by the blocks check of ``tests/pipeline/test_blocks.py``."""
    from tests.pipeline import test_blocks  # it reads this file's CASES

    monkeypatch.setitem(test_blocks.TRACED, label, (CASES[label], None, True))
    test_blocks.test_a_traced_model_with_blocks_matches_autograd_on_the_original_module(label, "train")
