"""Under autocast the saving forward casts each convolution weight once and keeps the copy for the
backward, as autograd keeps autocast's (symgrad/kept_casts.py, ``--keep all``): one weight cast per
convolution and step where the backward used to cast each weight again. ``--keep lean`` keeps no copy
(it casts again). ResNet-18 at 4 x 112² under AMP, one thread's CPU time: 0.950x -> 0.979x autograd's step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from symgrad.check import module_from_source
from symgrad.pipeline import build_text

TWO_CONVOLUTIONS = """name: two_convolutions
inputs:
  x: {shape: [2, 3, 8, 8]}
  w1: {shape: [6, 3, 3, 3]}
  w2: {shape: [4, 6, 1, 1]}
  t: {shape: [2, 4, 8, 8]}
layers:
  - {op: conv2d, in: x, weight: w1, padding: 1, out: c1}
  - {op: relu, in: c1, out: r1}
  - {op: conv2d, in: r1, weight: w2, out: c2}
loss: {op: mse_loss, target: t}
wrt: [w1, w2]
"""


class WeightCasts(TorchDispatchMode):
    """Counts the float32 -> lower precision copies of tensors of the weights' shapes."""

    def __init__(self, shapes):
        super().__init__()
        self.shapes, self.count = shapes, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32:
            self.count += tuple(args[0].shape) in self.shapes and kwargs.get("dtype") == torch.bfloat16
        return func(*args, **(kwargs or {}))


def _module(keep: str):
    source = build_text(TWO_CONVOLUTIONS, "two_convolutions.yaml", keep=keep).rendered.files["two_convolutions.py"]
    return module_from_source(source, f"two_convolutions_{keep}")


def _inputs(dtype=torch.float32) -> dict:
    generator = torch.Generator().manual_seed(0)
    shapes = {name: entry["shape"] for name, entry in yaml.safe_load(TWO_CONVOLUTIONS)["inputs"].items()}
    return {name: torch.randn(shape, generator=generator, dtype=dtype) for name, shape in shapes.items()}


@pytest.mark.parametrize("keep, casts", [("all", 2), ("lean", 4)])
def test_each_weight_is_cast_once_a_step_under_autocast_with_keep_all(keep, casts):
    inputs = _inputs()
    reference = _module("lean")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference.gradients(**inputs)
        counter = WeightCasts({(6, 3, 3, 3), (4, 6, 1, 1)})
        with counter:
            got = _module(keep).gradients(**inputs)
    assert counter.count == casts
    for name in ("w1", "w2"):  # in the weight's own dtype (as autograd accumulates it), bit for bit as lean's
        assert getattr(got, name).dtype == inputs[name].dtype == torch.float32, (keep, name)
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


def test_outside_autocast_the_kept_weight_is_the_weight_itself_and_the_gradients_autograds():
    module = _module("all")
    inputs = _inputs(torch.float64)
    _, *saved = module._forward_saving(**inputs)
    assert any(value is inputs["w1"] for value in saved) and any(value is inputs["w2"] for value in saved)
    got = module.gradients(**inputs)
    x, w1, w2, t = (value.clone().requires_grad_(name in ("w1", "w2")) for name, value in inputs.items())
    loss = torch.nn.functional.mse_loss(
        torch.nn.functional.conv2d(torch.relu(torch.nn.functional.conv2d(x, w1, padding=1)), w2), t
    )
    for name, reference in zip(("w1", "w2"), torch.autograd.grad(loss, [w1, w2])):
        assert (getattr(got, name) - reference).abs().max() <= 1e-12 * reference.abs().max(), name


LINEAR_MAPS = """name: linear_maps
inputs:
  x: {shape: [3, 5]}
  w1: {shape: [6, 5]}
  b1: {shape: [6]}
  w2: {shape: [6, 4]}
  b2: {shape: [4]}
  t: {shape: [3, 4]}
layers:
  - {op: linear, in: x, weight: w1, bias: b1, out: l1}
  - {op: relu, in: l1, out: r1}
  - {op: addmm, in: [b2, r1, w2], out: a2}
loss: {op: mse_loss, target: t}
wrt: [x, w1, b1, w2, b2]
"""


def _linear_module(keep: str):
    source = build_text(LINEAR_MAPS, "linear_maps.yaml", keep=keep).rendered.files["linear_maps.py"]
    return module_from_source(source, f"linear_maps_{keep}")


def _linear_inputs(dtype=torch.float32) -> dict:
    generator = torch.Generator().manual_seed(0)
    shapes = {name: entry["shape"] for name, entry in yaml.safe_load(LINEAR_MAPS)["inputs"].items()}
    return {name: torch.randn(shape, generator=generator, dtype=dtype) for name, shape in shapes.items()}


@pytest.mark.parametrize("keep, casts", [("all", 2), ("lean", 4)])
def test_a_linear_maps_weight_is_cast_once_a_step_under_autocast_with_keep_all(keep, casts):
    """F.linear's weight and addmm's mat2: the forward's copy is the one the input's gradient reads."""
    inputs = _linear_inputs()
    reference = _linear_module("lean")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference.gradients(**inputs)
        counter = WeightCasts({(6, 5), (6, 4), (4, 6)})  # (4, 6): addmm's backward reads mat2.T
        with counter:
            got = _linear_module(keep).gradients(**inputs)
    assert counter.count == casts
    for name in ("x", "w1", "b1", "w2", "b2"):  # each in its input's dtype, as autograd's; bit for bit as lean's
        assert getattr(got, name).dtype == inputs[name].dtype == torch.float32, (keep, name)
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


def test_outside_autocast_a_linear_maps_kept_weight_is_the_weight_and_the_gradients_autograds():
    module = _linear_module("all")
    inputs = _linear_inputs(torch.float64)
    _, *saved = module._forward_saving(**inputs)
    assert any(value is inputs["w1"] for value in saved) and any(value is inputs["w2"] for value in saved)
    got = module.gradients(**inputs)
    x, w1, b1, w2, b2, t = (value.clone().requires_grad_(name != "t") for name, value in inputs.items())
    loss = torch.nn.functional.mse_loss(torch.addmm(b2, torch.relu(torch.nn.functional.linear(x, w1, b1)), w2), t)
    for name, reference in zip(("x", "w1", "b1", "w2", "b2"), torch.autograd.grad(loss, [x, w1, b1, w2, b2])):
        assert (getattr(got, name) - reference).abs().max() <= 1e-12 * reference.abs().max(), name


def test_under_autocast_each_gradient_comes_in_its_inputs_dtype_with_autograds_values():
    """A weight's and a bias's gradient leave the products in bfloat16; ``gradients`` casts each to its
    input's dtype, as autograd's engine does for ``.grad`` (a loss spec and an outputs spec)."""
    outputs_spec = (
        LINEAR_MAPS.replace("name: linear_maps", "name: linear_outputs")
        .replace("loss: {op: mse_loss, target: t}", "outputs: a2")
        .replace("  t: {shape: [3, 4]}\n", "")
    )
    inputs = _linear_inputs()
    leaves = {name: value.clone().requires_grad_(name != "t") for name, value in inputs.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a2 = torch.addmm(leaves["b2"], torch.relu(F.linear(leaves["x"], leaves["w1"], leaves["b1"])), leaves["w2"])
        cotangent = torch.randn(a2.shape, generator=torch.Generator().manual_seed(1)).to(a2.dtype)
        names = ("x", "w1", "b1", "w2", "b2")
        expected = dict(zip(names, torch.autograd.grad(a2, [leaves[name] for name in names], cotangent)))
        source = build_text(outputs_spec, "linear_outputs.yaml").rendered.files["linear_outputs.py"]
        got = module_from_source(source, "linear_outputs").gradients(
            **{name: value for name, value in inputs.items() if name != "t"}, grad_outputs=(cotangent,)
        )
    for name in names:
        assert getattr(got, name).dtype == expected[name].dtype == torch.float32, name
        assert torch.equal(getattr(got, name), expected[name]), name
