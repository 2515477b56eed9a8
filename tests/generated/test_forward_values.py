"""The generated test file checks the forward's values, not only the gradients (issue 62): the module's
forward against PyTorch's own functions op by op (``REFERENCE_SUMS``, computed when the file was
generated), and what the forward that keeps values for the explicit backward returns against it. A
constant added to either one leaves every gradient as it was, and fails the file."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace


class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        features = torch.relu(self.conv(x))
        return self.fc(features.mean((2, 3))), features


NUDGED = '''

def _nudged(result):
    return result + 1e-7 if isinstance(result, torch.Tensor) else tuple(value + 1e-7 for value in result)


_unnudged_{function} = {function}


def {function}(*positional, **named):
    """{function}, its values moved by 1e-7 (its gradients are the same)."""
    result = _unnudged_{function}(*positional, **named)
    return {returned}
'''


def _generated_test(folder, text: str, name: str, nudged: str | None):
    """The generated test file of ``text``, imported from ``folder``, its module's ``nudged`` function
    (None: none) returning values moved by 1e-7."""
    folder.mkdir()
    for file, content in build_text(text, f"{name}.yaml").rendered.files.items():
        if file == f"{name}.py" and nudged:
            returned = "_nudged(result)" if nudged == "forward" else "(_nudged(result[0]), *result[1:])"
            content += NUDGED.format(function=nudged, returned=returned)
        (folder / file).write_text(content)
    spec = importlib.util.spec_from_file_location(f"test_{name}_{nudged}", folder / f"test_{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("end", ["outputs", "loss"])
def test_a_forward_moved_by_1e_7_fails_its_generated_test_and_its_gradients_do_not_notice(tmp_path, end):
    torch.manual_seed(0)
    model = TwoOutputs().double()
    name = f"two_outputs_{end}"
    text = (trace(model, {"x": (2, 3, 5, 5)}, "parameters", name, mode="train") if end == "outputs" else
            trace(nn.Sequential(model.conv, nn.ReLU(), nn.Conv2d(4, 2, 1)).double(), {"input": (2, 3, 5, 5)},
                  "parameters", name, loss=LossChoice("mse_loss"), mode="train"))
    assert ("\noutputs: " in text) == (end == "outputs")
    clean = _generated_test(tmp_path / "clean", text, name, None)
    clean.test_forward_values_match_the_reference_computation()
    assert None not in clean.REFERENCE_SUMS and len(clean.REFERENCE_SUMS) == (2 if end == "outputs" else 1)
    for function, message in (("forward", "the forward differs from the reference computation"),
                              ("_forward_saving", "the saving forward differs from the forward")):
        tested = _generated_test(tmp_path / function, text, name, function)
        tested.test_matches_autograd_float64_random_cotangent(tested.SMALL_SHAPES[0])  # the gradients: the same
        with pytest.raises(AssertionError, match=message):
            tested.test_forward_values_match_the_reference_computation()
