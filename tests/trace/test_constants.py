"""Constants made inside the traced code (issue 22, item 1): one value broadcast against a tensor is a
number, a map of one value read as a tensor is a ``full`` layer whose sizes follow the input, and any
other constant is refused at its line with a fix. Checked against autograd through the original module
at other batch and spatial sizes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from symgrad.check import module_from_source, relative_error
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, TraceError, load_target, trace
from symgrad.trace.names_from_code import POSITIONS
from tests.helpers import load_yaml

INPUTS = Path(__file__).resolve().parent / "inputs"
SIZES = INPUTS / "sizes.py"


def marked_line(path: Path, marker: str) -> str:
    number = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if f"# {marker}" in text)
    return f"{path}:{number}"


def test_a_map_of_one_value_in_any_spelling_follows_the_input_and_matches_autograd():
    model = load_target(f"{SIZES}:NoiseLevel")
    text = trace(model, {"x": (2, 3, 6, 5)}, loss=LossChoice("mse_loss"))
    layers = load_yaml(text)["layers"]
    fulls = [layer for layer in layers if layer["op"] == "full"]
    assert [layer["fill_value"] for layer in fulls] == [0.75, -1.0], text  # ones_like * 0.25 += 0.5, new_full
    assert all(layer["size"][0] == {"like": "x"} and layer["size"][2:] == [{"like": "x"}] * 2 for layer in fulls)
    shifted = "shifted" if POSITIONS else "sub"  # the model's name for it (Python 3.11 on: names_from_code)
    assert {"op": "sub", "in": "x", "other": 0.125, "out": shifted} in layers, text
    built = build_text(text, "noise_level.yaml").rendered
    module = module_from_source(built.files[f"{built.name}.py"], built.name)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(3, 3, 9, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    target = torch.randn(3, 6, 9, 4, generator=generator, dtype=torch.float64)
    (expected,) = torch.autograd.grad(F.mse_loss(model(x), target), x)
    assert relative_error(module.gradients(x=x, target=target).x, expected) <= 1e-12


# Blurred traced at batch 4: at batch 2 the second run's batch, 3, is the kernel's first size, which
# makes that run's kernel a `full` map with its size read from x (a coincidence the second run refuses)
@pytest.mark.parametrize("model, values, batch", [("ChannelRamp", [0.0, 1.0, 2.0], 2), ("Blurred", [1 / 9] * 27, 4)])
def test_a_constant_of_several_values_is_a_constant_layer_and_matches_autograd(model, values, batch):
    """``torch.arange(C)`` and a box-blur kernel made in forward, of sizes that follow the channels alone
    (the model's, not the input's size): a ``constant`` layer holding the values as computed."""
    module = load_target(f"{SIZES}:{model}")
    text = trace(module, {"x": (batch, 3, 4, 5)}, loss=LossChoice("mse_loss"))
    (layer,) = [layer for layer in load_yaml(text)["layers"] if layer["op"] == "constant"]
    # the model takes any channel count, so the constant follows x's dim 1: checked at its traced 3 (x_size1)
    assert layer["values"] == values and layer["in"] == "x_size1", text
    built = build_text(text, "constant.yaml").rendered
    generated = module_from_source(built.files[f"{built.name}.py"], built.name)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(3, 3, 7, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    target = torch.randn(3, 3, 7, 4, generator=generator, dtype=torch.float64)
    (expected,) = torch.autograd.grad(F.mse_loss(module(x), target), x)
    assert relative_error(generated.gradients(x=x, target=target).x, expected) <= 1e-12


@pytest.mark.parametrize(
    "model, marker, message",
    [
        ("WidthRamp", "SINE_POSITIONS", "'constant' argument values=[0.0, 0.84"),
        ("WidthScaled", "WIDTH", "'mul' argument other=5.0 becomes 15.0"),
    ],
)
def test_a_constant_no_spec_can_hold_is_refused_at_its_line_with_a_fix(model, marker, message):
    with pytest.raises(TraceError) as error:
        trace(load_target(f"{SIZES}:{model}"), {"x": (2, 3, 4, 5)}, loss=LossChoice("mse_loss"))
    text = str(error.value)
    assert text.startswith(f"{marked_line(SIZES, marker)}: error: {message}"), text
    assert len(text.splitlines()) == 1 and "(fix: " in text and len(text) < 1200, text


@pytest.mark.parametrize("through_view", [False, True])
def test_a_constant_written_into_after_it_is_made_is_refused_not_frozen(through_view):
    model = load_target(f"{SIZES}:Overwritten", {"through_view": through_view})
    with pytest.raises(TraceError) as error:
        trace(model, {"x": (2, 3, 4, 5)}, loss=LossChoice("mse_loss"))
    message = str(error.value)
    if through_view:  # seen where it is read: it no longer holds one value
        assert message.startswith(f"{marked_line(SIZES, 'OVERWRITTEN')}: error: 'cat' reads a tensor made inside"), (
            message
        )
    else:  # seen where it is written
        assert message.startswith(f"{marked_line(SIZES, 'SETITEM')}: error: '__setitem__' "), message


class Frequencies(torch.nn.Module):
    """diffusers' timestep frequencies, in float32 as diffusers makes them (``fixed``) or in the input's dtype."""

    def __init__(self, fixed: bool):
        super().__init__()
        self.fixed = fixed

    def forward(self, t):
        positions = torch.arange(4, dtype=torch.float32) if self.fixed else torch.arange(4, dtype=t.dtype)
        frequencies = torch.exp(-math.log(10000) * positions / 4).to(t.dtype)
        return torch.sin(t[:, None] * frequencies[None, :])


@pytest.mark.parametrize("fixed", [False, True])
def test_a_constant_traced_in_float32_holds_the_values_float64_code_computes(fixed):
    """Traced as a float32 model, the frequencies are those a float64 run makes: exact where the code
    computes them in the input's dtype, float32's where it fixes float32 itself."""
    model = Frequencies(fixed)
    text = trace(model, {"t": (3,)}, loss=LossChoice("mse_loss"))
    (layer,) = [layer for layer in load_yaml(text)["layers"] if layer["op"] == "constant"]
    expected = torch.exp(-math.log(10000) * torch.arange(4, dtype=torch.float32 if fixed else torch.float64) / 4)
    assert layer["values"] == expected.double().tolist(), text
    built = build_text(text, "frequencies.yaml").rendered
    generated = module_from_source(built.files[f"{built.name}.py"], built.name)
    t = torch.randn(5, dtype=torch.float64, requires_grad=True)
    target = torch.randn(5, 4, dtype=torch.float64)
    (reference,) = torch.autograd.grad(F.mse_loss(model(t), target), t)
    assert relative_error(generated.gradients(t=t, target=target).t, reference) <= 1e-12
