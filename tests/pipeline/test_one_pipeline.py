"""One pipeline (issue 36): every spec, with blocks or without, ``--flat`` or not, with the extras or
not, goes parse -> expand -> graph -> derive -> plan -> render through one module template, and every
module takes an input with a ``source:`` in ``params`` (keyed as ``state_dict()``), the others by name.
Each example and a traced torchvision-style ResNet give the same gradients with blocks and ``--flat``
(<=1e-12), and those of autograd through the original (<=1e-10), at another batch and spatial size."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from symgrad.pipeline import build, build_text
from symgrad.testdata import relative_errors
from symgrad.trace import LossChoice, load_target, trace
from tests.helpers import generated_module
from tests.pipeline.test_blocks import _agrees_with_flat_and_autograd

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
TEMPLATES = ROOT / "templates"


@pytest.mark.parametrize("spec", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_every_example_gives_the_same_gradients_with_blocks_and_flat(spec: Path):
    _agrees_with_flat_and_autograd(spec.read_text(encoding="utf-8"), str(spec))


def test_one_module_template_and_one_calling_convention():
    assert sorted(path.name for path in TEMPLATES.glob("*.jinja")) == [
        "derivation.html.jinja",
        "derivation.md.jinja",
        "module.py.jinja",
        "test_module.py.jinja",
    ]
    for path in (ROOT / "symgrad").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "STRUCTURED" not in text and "FlatView" not in text, path
    # the seeds (no `source:` input) keep their signature; a traced spec's parameters come in `params`
    seed = build(ROOT / "examples" / "seed3_conv_relu_conv.yaml")
    module = generated_module(seed)
    assert list(inspect.signature(module.forward).parameters) == ["x", "w1", "w2", "k", "y"]
    assert list(inspect.signature(module.hvp).parameters)[:5] == ["x", "w1", "w2", "k", "y"]


@pytest.mark.parametrize("blocks", [False, True], ids=["traced flat", "traced with blocks"])
def test_a_traced_resnet_gives_autograds_gradients_with_blocks_and_flat_through_params(blocks):
    torch.manual_seed(0)
    model = (
        load_target(
            f"{ROOT / 'tests' / 'trace' / 'inputs' / 'resnet_style.py'}:TinyResNet",
            {"layers": (2, 2), "freeze_stem": False},
        )
        .double()
        .eval()
    )
    text = trace(
        model,
        {"x": (2, 3, 16, 16)},
        name="tiny",
        loss=LossChoice("cross_entropy", "labels"),
        mode="eval",
        blocks=blocks,
    )
    assert ("\nblocks:\n" in text) == blocks
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(3, 3, 20, 12, generator=generator, dtype=torch.float64)  # another batch and size
    labels = torch.randint(0, 5, (3,), generator=generator)
    parameters = dict(model.named_parameters())
    expected = dict(
        zip(
            parameters,
            torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), labels), list(parameters.values())),
        )
    )
    state = {key: value.detach() for key, value in model.state_dict().items()}
    results = []
    for flat in (False, True):
        built = build_text(text, "tiny.yaml", flat=flat)
        module = generated_module(built).module  # called as a user calls it: data by name, the rest in `params`
        assert list(inspect.signature(module.forward).parameters) == ["x", "labels", "params"]
        results.append(module.gradients(x=x, labels=labels, params=state).params)
    for key, reference in expected.items():
        assert relative_errors({key: results[0][key]}, {key: reference})[key] <= 1e-10, key
        assert relative_errors({key: results[0][key]}, {key: results[1][key]})[key] <= 1e-12, key


def test_a_loss_with_dropout_recomputed_in_the_backward_draws_the_same_masks():
    """``loss_with_explicit_backward(..., recompute=True)`` re-runs the forward in the backward: from
    the random state the forward started from, as the outputs form does, so the masks are the same."""
    from tests.helpers import spec_text

    squared = {"op": "mse_loss", "target": "y", "reduction": "sum"}
    built = build_text(spec_text({"x": [4, 3, 5, 6], "y": [4, 3, 5, 6]}, [{"op": "dropout", "p": 0.3}], squared, ["x"]))
    module = generated_module(built)
    x = torch.randn(4, 3, 5, 6, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, 3, 5, 6, dtype=torch.float64)
    torch.manual_seed(1)
    (expected,) = torch.autograd.grad(module.forward(x=x, y=y), x)
    for recompute in (False, True):
        torch.manual_seed(1)
        (actual,) = torch.autograd.grad(module.loss_with_explicit_backward(x=x, y=y, recompute=recompute), x)
        assert torch.equal(actual, expected), recompute
