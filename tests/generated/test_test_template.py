"""The one test template, for a spec with blocks as for one without: a traced model written as its
blocks gets the float64, float32, zero-by-structure and inputs-unchanged tests, and each of them fails
when the module is broken the way it guards against."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace
from tests.helpers import run_generated_tests


class ConvBNReLU(nn.Sequential):
    """A convolution with a bias before training-mode BatchNorm: the bias's gradient is zero by
    structure (torchvision's own blocks drop it; many hand-written ones keep it)."""

    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class SmallNet(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.stem = ConvBNReLU(3, 8)
        self.body = nn.Sequential(ConvBNReLU(8, 8), ConvBNReLU(8, 8))
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        x = self.body(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


BROKEN = '''

import os as _os

_gradients = gradients


def gradients(*positional, **named):
    """The module broken as $BROKEN says, for the test that its generated test file notices."""
    result = _gradients(*positional, **named)
    broken = _os.environ.get("BROKEN") if "x" in named else None  # as the tests call it: by name
    if broken == "input":  # an input overwritten in place
        with torch.no_grad():
            named["x"].mul_(2)
    elif broken == "bias":  # a gradient that is zero by structure made nonzero
        result.params["stem.0.bias"] = result.params["stem.0.bias"] + 1e-3
    elif broken == "float32" and named["x"].dtype == torch.float32:  # rounded as bfloat16 in float32 only
        for key, value in result.params.items():
            result.params[key] = value.bfloat16().float()
    return result
'''


def _run(folder, broken: str, monkeypatch, only: str = ""):
    """The generated test file's outcomes with the module broken as ``BROKEN`` says (read as it runs)."""
    monkeypatch.setenv("BROKEN", broken)
    return run_generated_tests(folder / "test_blocky.py", *(["-k", only] if only else []))


def test_a_block_specs_test_file_has_every_check_and_each_fails_on_a_broken_module(tmp_path, monkeypatch):
    torch.manual_seed(0)
    text = trace(SmallNet().double().train(), {"x": (2, 3, 8, 8)}, name="blocky", loss=LossChoice("cross_entropy"),
                 mode="train", blocks=True)
    built = build_text(text, "blocky.yaml")
    assert "def conv_bn_relu_backward(" in built.rendered.files["blocky.py"]  # written as its block
    test_file = built.rendered.files["test_blocky.py"]
    for name in ("test_float32_at_spec_shapes_rounds_no_more_than_autograd", "test_gradients_zero_by_structure_are_zero",
                 "test_matches_autograd_float64_random_cotangent", "test_gradgradcheck_of_the_explicit_backward"):
        assert f"def {name}(" in test_file
    # the parameters come in `params`, by state_dict key, their inputs' names following from the keys
    assert '"stem.0.weight": ("params wrt", "weight", ' in test_file and "RENAMED = {}" in test_file
    for name, content in built.rendered.files.items():
        (tmp_path / name).write_text(content + (BROKEN if name == "blocky.py" else ""))
    clean = _run(tmp_path, "", monkeypatch)
    assert clean.ok, clean.report
    for broken, failing, message in (
            ("input", "test_matches_autograd_float64_random_cotangent[small]", "gradients modified its input x"),
            ("bias", "test_gradients_zero_by_structure_are_zero", "stem_0_bias is the bias of")):
        result = _run(tmp_path, broken, monkeypatch, failing.split("[")[0])
        assert f"FAILED test_blocky.py::{failing}" in result.report and message in result.report, \
            (broken, result.report)
    float32 = _run(tmp_path, "float32", monkeypatch)  # the float32 test alone fails: the float64 ones still pass
    assert float32.failed == 1, float32.report
    assert "FAILED test_blocky.py::test_float32_at_spec_shapes_rounds_no_more_than_autograd" in float32.report


class DropoutNet(nn.Module):
    """A small classifier with dropout in train mode, as torchvision's heads write it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.drop2d = nn.Dropout2d(0.3)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        x = self.drop2d(F.relu(self.conv(x)))
        return self.fc(self.drop(x.mean((2, 3))))


def test_a_generated_test_file_of_a_model_with_dropout_in_train_mode_passes(tmp_path):
    """Its forward and its gradients are run from one torch seed, so the module and autograd's reference
    draw the same masks (unseeded, they compared different draws: errors of order 1, smp's FPN)."""
    from tests.models.compare import Case, assert_generated_test_file_passes

    case = Case(DropoutNet, {"x": (2, 3, 6, 6)}, {"x": (3, 3, 7, 5)}, ("cross_entropy",))
    assert_generated_test_file_passes("dropout_net", case, tmp_path)


class OneValuePerGroup(nn.Module):
    """GroupNorm over one value per group (a pooled 1x1 map, as smp FPN's deepest map at small shapes)
    with a small eps: the exact gradient of everything upstream of it is 0, autograd's kernel returns
    rounding noise times 1/sqrt(eps) there, and the explicit (differentiable) formula returns 0."""

    def __init__(self, eps):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(8, 8, eps=eps)
        self.b = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        return self.b(torch.relu(self.gn(F.adaptive_avg_pool2d(self.a(x), 1))))


def test_the_summed_loss_bound_is_how_far_autograd_itself_moves_under_rounding(tmp_path):
    """The summed-loss test's bound is 1e-12, or 4 times how far autograd's gradient moves when every input
    moves by one ulp: a well-conditioned gradient keeps 1e-12; on GroupNorm over one value per group the
    explicit gradients differ from autograd's by more than 1e-12 (the fixed bound failed there: smp FPN on
    the EfficientNet encoder, 2.7e-12) and pass; one gradient off by 1e-9 of itself still fails."""
    import importlib.util

    from symgrad.testdata import moved_one_ulp, relative_errors, rounding_tolerances

    def conv_tanh(inputs):  # well-conditioned: a 1-ulp move changes the gradient by ~1e-16
        values = torch.autograd.grad(torch.tanh(F.conv2d(inputs["x"], inputs["w"])).sum(), list(inputs.values()))
        return dict(zip(inputs, values))

    generator = torch.Generator().manual_seed(0)
    inputs = {name: torch.randn(shape, dtype=torch.float64, generator=generator).requires_grad_()
              for name, shape in (("x", (2, 3, 6, 6)), ("w", (4, 3, 3, 3)))}
    moved = [conv_tanh(moved_one_ulp(inputs, seed)) for seed in (1, 2)]
    assert rounding_tolerances(conv_tanh(inputs), moved) == {"x": 1e-12, "w": 1e-12}

    torch.manual_seed(0)
    text = trace(OneValuePerGroup(1e-12).double().train(), {"x": (2, 3, 4, 4)}, name="one_value_per_group",
                 loss=LossChoice("mse_loss"), mode="train")
    for name, content in build_text(text, "one_value_per_group.yaml").rendered.files.items():
        (tmp_path / name).write_text(content)
    spec = importlib.util.spec_from_file_location("test_one_value_per_group", tmp_path / "test_one_value_per_group.py")
    generated = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generated)
    inputs = generated.inputs_for(generated.SMALL_SHAPES[0], torch.float64, seed=3)  # as the test draws them
    expected = generated.summed_loss_gradients(inputs)
    actual = generated.by_name(generated.module.gradients(**generated.arguments(inputs)))
    assert max(relative_errors(actual, expected).values()) > 1e-12  # beyond the fixed bound
    generated.test_default_cotangent_is_the_summed_loss()
    gradients = generated.module.gradients

    def one_gradient_off(**named):  # the last conv's bias gradient, 1e-9 of itself off
        result = gradients(**named)
        result.params["b.bias"] = result.params["b.bias"] * (1 + 1e-9)
        return result

    generated.module.gradients = one_gradient_off
    with pytest.raises(AssertionError, match="b_bias"):
        generated.test_default_cotangent_is_the_summed_loss()

    def loosened_name_off(**named):  # a_bias: autograd's own spread loosens its bound to ~2e-10
        result = gradients(**named)
        result.params["a.bias"] = result.params["a.bias"] + 1e-6 * result.params["b.bias"].abs().max()
        return result

    assert 1e-11 < generated.rounding_tolerances(expected, [generated.summed_loss_gradients(
        generated.moved_one_ulp(inputs, seed)) for seed in (1, 2)])["a_bias"] <= 1e-8
    generated.module.gradients = loosened_name_off
    with pytest.raises(AssertionError, match=r"\{'a_bias': .*bounds loosened .*'a_bias': '"):
        generated.test_default_cotangent_is_the_summed_loss()
    generated.module.gradients = gradients
    # the whole file: the random-cotangent test's bound is rounding-aware too (its 1e-12 failed: 4e-11..5e-10)
    result = run_generated_tests(tmp_path / "test_one_value_per_group.py")
    assert result.ok, result.report


def test_a_gradient_that_is_not_finite_at_moved_inputs_is_a_failure_not_an_infinite_bound():
    """autograd's gradient turning NaN/Inf one ulp away would make the bound infinite (any finite explicit
    gradient would pass): it fails, naming the gradient."""
    from symgrad.testdata import rounding_tolerances

    expected = {"x": torch.ones(3, dtype=torch.float64), "w": torch.ones(2, dtype=torch.float64)}
    for bad in (math.nan, math.inf):
        moved = {"x": torch.ones(3, dtype=torch.float64), "w": torch.tensor([1.0, bad], dtype=torch.float64)}
        with pytest.raises(AssertionError, match="gradient of w is not finite"):
            rounding_tolerances(expected, [moved])
    far = {"x": torch.ones(3, dtype=torch.float64) * 2, "w": torch.ones(2, dtype=torch.float64)}
    assert rounding_tolerances(expected, [far]) == {"x": 1e-8, "w": 1e-12}  # capped


def test_moved_one_ulp_keeps_each_input_on_its_device():
    """The directions are drawn on the CPU (one stream whatever the device) and moved to the input's
    device: a CUDA (here: meta) input used to meet a CPU mask in nextafter."""
    from symgrad.testdata import moved_one_ulp

    moved = moved_one_ulp({"x": torch.ones(3, 4, dtype=torch.float64, device="meta").requires_grad_()}, 1)
    assert moved["x"].device.type == "meta" and moved["x"].requires_grad
