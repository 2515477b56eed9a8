"""``torch.max(x, dim)`` / ``torch.min(x, dim)`` returning (values, indices), where only the values flow on:
traced as the ``max`` / ``min`` ops (``symgrad/rules/max_dim.py``), with autograd's convention on ties; the
indices refused at the line that computes with them; CBAM as its reference ports write it, end to end."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.trace import LossChoice, TraceError, trace
from tests.helpers import build_text, generated_module, spec_text
from tests.models import zoo_cbam
from tests.models.compare import Case, assert_generated_test_file_passes, matches_autograd

CBAM = Case(zoo_cbam.CBAMNet, {"x": (2, 3, 8, 8)}, {"x": (3, 3, 12, 6)}, ("cross_entropy",))


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_cbam_matches_autograd_on_the_original_module(mode):
    """torch.max(x, 1)[0] in the spatial gate; F.avg_pool2d / F.max_pool2d over (x.size(2), x.size(3)) in the
    channel gate: one window at every size, so traced at 8x8 and checked at 12x6 and another batch."""
    matches_autograd("cbam", CBAM, mode)


def test_cbam_generated_test_file_passes(tmp_path):
    assert_generated_test_file_passes("cbam", CBAM, tmp_path)


@pytest.mark.parametrize(
    "how, dim, keepdim", [("max", 1, True), ("max", -1, False), ("min", 2, False), ("min", 0, True)]
)
def test_ties_send_the_whole_gradient_to_the_index_torch_returns(how, dim, keepdim):
    """On ties autograd's max(dim) puts all of the gradient on the returned index (amax would share it): the
    generated gradient equals autograd's exactly on inputs full of ties."""
    shape = [3, 4, 5]
    function = getattr(torch, how)
    out = list(function(torch.zeros(shape), dim, keepdim=keepdim).values.shape)
    text = spec_text(
        {"x": shape, "y": out},
        [{"op": how, "dim": dim, "keepdim": keepdim, "out": "out"}],
        {"op": "half_sq_error", "target": "y", "reduction": "sum"},
        ["x"],
    )
    module = generated_module(build_text(text))
    generator = torch.Generator().manual_seed(3)
    x = torch.randint(0, 2, shape, generator=generator).double().requires_grad_()  # every slice ties
    y = torch.randn(out, generator=generator, dtype=torch.float64)
    loss = 0.5 * (function(x, dim, keepdim=keepdim).values - y).pow(2).sum()
    (expected,) = torch.autograd.grad(loss, [x])
    actual = module.gradients(x=x, y=y).x
    assert torch.equal(actual, expected)
    assert (expected != 0).sum(dim).le(1).all()  # one entry per slice: not shared among the ties


def _line(marker: str) -> int:
    return next(n for n, text in enumerate(open(__file__).read().splitlines(), 1) if text.endswith(marker))


def test_indices_that_reach_the_loss_are_refused_in_one_line():
    def uses_indices(x):
        values, indices = torch.max(x, dim=1, keepdim=True)  # INDICES
        return values * indices  # int64 promoted to the values' dtype

    with pytest.raises(TraceError) as error:
        trace(uses_indices, {"x": (2, 3, 4, 4)}, name="traced", loss=LossChoice("half_sq_error"))
    (line,) = str(error.value).splitlines()
    assert line.startswith(f"{__file__}:{_line('# INDICES')}: error: 'max' returns indices"), line
    assert "use only the values" in line


def test_unused_indices_are_not_refused():
    def drops_indices(x):
        values, indices = x.min(dim=-1)
        return values.relu()

    assert "op: min" in trace(drops_indices, {"x": (2, 3, 4, 4)}, name="traced", loss=LossChoice("half_sq_error"))


def test_max_of_two_tensors_is_refused_with_a_workaround():
    def elementwise(x):
        return torch.max(x, x.sigmoid())  # TWO_TENSORS

    with pytest.raises(TraceError) as error:
        trace(elementwise, {"x": (2, 3, 4, 4)}, name="traced", loss=LossChoice("half_sq_error"))
    line = str(error.value).splitlines()[0]
    assert line.startswith(f"{__file__}:{_line('# TWO_TENSORS')}: error: 'max' takes the elementwise maximum"), line
    assert "F.relu(a - b) + b" in line


def test_a_fixed_window_the_size_of_the_traced_input_stays_a_window():
    """nn.AvgPool2d(8) traced at 8x8 is not a global pool at 16x16: only a window read from the input's own
    size becomes the adaptive pool."""
    text = trace(
        nn.Sequential(nn.Conv2d(3, 2, 1), nn.AvgPool2d(8)),
        {"input": (2, 3, 8, 8)},
        name="traced",
        loss=LossChoice("half_sq_error"),
    )
    assert "op: avg_pool2d" in text and "adaptive" not in text, text
    text = trace(
        lambda x: F.max_pool2d(x, x.shape[2:]) * x, {"x": (2, 3, 8, 8)}, name="traced", loss=LossChoice("half_sq_error")
    )
    assert "{op: adaptive_max_pool2d, in: x, output_size: 1" in text, text
