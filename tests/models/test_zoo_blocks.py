"""Upstream-style blocks (``tests/models/zoo.py``) in: traced in train and eval mode, generated, and compared in
float64 with autograd through the original module at another batch and spatial size (Restormer's reshapes
take their sizes from ``x.shape``: they read them at run time); a reshape whose sizes fit only at the
traced sizes is refused, never frozen."""

from __future__ import annotations

import re

import pytest
import torch

from symgrad.trace import LossChoice, TraceError, trace
from tests.models import zoo
from tests.models.compare import Case, assert_generated_test_file_passes, matches_autograd
from tests.models.test_classic_cnns import CASES as MODEL_CASES, TEST_FILES as MODEL_TEST_FILES

CASES = {
    # branches stacked on a new dim, a softmax over it, squeeze() of the pooled features, SK attention
    "sknet": Case(zoo.SKNet, {"x": (2, 3, 16, 16)}, {"x": (3, 3, 12, 20)}, ("cross_entropy",)),
    # pixel_unshuffle front end, a noise-level map concatenated, pixel_shuffle back
    # x.shape read into b, c, h, w and reused by reshapes (heads split and merged, b (h w) c views for a
    # hand-written LayerNorm with x.var), F.normalize, attn.softmax(dim=-1), pixel_(un)shuffle, chunk
    "restormer": Case(zoo.Restormer, {"inp_img": (2, 3, 8, 8)}, {"inp_img": (3, 3, 12, 20)}, ("mse_loss",)),
    # ConvNeXt-T's layout: blocks permuted to channels_last for nn.Linear and F.layer_norm, layer scale
    # gamma * x, a channels_first LayerNorm class by hand, downsampling layers, x.mean([-2, -1]), nn.LayerNorm
    "convnext_t": Case(zoo.ConvNeXt, {"x": (2, 3, 64, 64)}, {"x": (3, 3, 64, 96)}, ("cross_entropy",)),
    "ffdnet": Case(
        zoo.FFDNet,
        {"x": (2, 1, 8, 8), "sigma_map": (2, 1, 4, 4)},
        {"x": (3, 1, 12, 8), "sigma_map": (3, 1, 6, 4)},
        ("mse_loss",),
    ),
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("label", list(CASES))
def test_upstream_block_matches_autograd_on_the_original_module(label, mode):
    matches_autograd(
        label, CASES[label], mode, one_loss_per_mode=True, test_file=(label, CASES[label]) in GENERATED_TEST_CASES
    )


class SwappedToFourD(torch.nn.Module):
    """A reshape that reads the height and width the wrong way round: right at square sizes only."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x):
        b, c, h, w = x.shape
        return self.conv(x).flatten(2).reshape(b, c, w, h)


def test_a_size_read_the_wrong_way_round_is_written_as_read_not_frozen():
    """Traced square, h and w are the same number; each size carries the dim it was read from, so the spec
    reshapes to (w, h) as the code does, and matches autograd through the module at oblong sizes."""
    text = trace(SwappedToFourD().double(), {"x": (2, 2, 6, 6)}, name="swapped", loss=LossChoice("mse_loss"))
    assert "{like: x, dims: [3]}, {like: x, dims: [2]}]" in text, text
    matches_autograd("swapped", Case(SwappedToFourD, {"x": (2, 2, 6, 6)}, {"x": (3, 2, 4, 10)}, ("mse_loss",)), "eval")


class SizesOfTwoTensors(torch.nn.Module):
    """A reshape entry computed from the sizes of two tensors, which no single node's expression holds, beside
    a -1 already: kept as the traced number, and the second run refuses it since it follows the input."""

    def __init__(self):
        super().__init__()
        self.down = torch.nn.Conv2d(2, 2, 3, stride=2, padding=1)

    def forward(self, x):
        y = self.down(x)
        return y.reshape(x.shape[0], -1, x.shape[3] * y.shape[2])


def test_a_size_no_expression_holds_is_refused_not_frozen():
    with pytest.raises(TraceError) as caught:
        trace(SizesOfTwoTensors().double(), {"x": (2, 2, 6, 6)}, name="two", loss=LossChoice("mse_loss"))
    (line,) = str(caught.value).splitlines()
    assert re.match(r".*test_zoo_blocks\.py:\d+: error: 'reshape'", line) and "becomes" in line, line


GENERATED_TEST_CASES = [(label, CASES[label]) for label in ("sknet", "ffdnet", "restormer")] + [
    (label, MODEL_CASES[label]) for label in MODEL_TEST_FILES
]


@pytest.mark.slow
@pytest.mark.parametrize("label,case", GENERATED_TEST_CASES, ids=[label for label, _ in GENERATED_TEST_CASES])
def test_traced_models_own_generated_test_file_passes(label, case, tmp_path):
    """The test file written beside each traced model's module runs and passes (its shapes for the
    float64 and float32 checks are solved for the whole graph, residual adds and cats included)."""
    assert_generated_test_file_passes(label, case, tmp_path)
