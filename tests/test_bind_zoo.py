"""Every network of ``tests/models.py``, ``tests/zoo.py`` and ``tests/zoo_nets.py`` as a training step: traced for its
parameters alone (``wrt="parameters"``, what ``symgrad.bind`` needs), written as blocks (the CLI's
default), bound to the model and run once at another batch and spatial size in float64, against
``loss.backward()`` through a copy of the original module: every parameter's ``.grad`` and every
BatchNorm buffer.

Tracing for the parameters alone changes what is derived: the input's gradient is not computed, so
the first convolution's weight gradient is emitted alone (``conv2d_weight`` given the weight's shape),
and in a weight-standardised network (BiT) that weight is itself computed; these paths are not taken
when the input is differentiated too, as the other model tests do."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import symgrad
from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace

from . import test_trace_models, test_trace_zoo, test_trace_zoo_nets
from .test_trace_models import randomize

CASES = {**{f"models:{label}": case for label, case in test_trace_models.CASES.items()},
         **{f"zoo:{label}": case for label, case in test_trace_zoo.CASES.items()},
         **{f"zoo_nets:{label}": case for label, case in test_trace_zoo_nets.CASES.items()}}
TOLERANCE = 1e-10


def test_every_network_has_a_torch_nn_functional_loss():
    assert all(any(hasattr(F, kind) for kind in case.losses) for case in CASES.values())


@pytest.mark.parametrize("label", list(CASES))
def test_a_network_traced_for_its_parameters_trains_as_autograd(label):
    case = CASES[label]
    kind = next(kind for kind in case.losses if hasattr(F, kind))
    generator = torch.Generator().manual_seed(11)
    torch.manual_seed(0)
    model = case.model(**case.init).double()
    randomize(model, generator)
    model.train()
    target_name = "labels" if kind in ("cross_entropy", "nll_loss") else "target"
    text = trace(model, case.traced, wrt="parameters", name="step", loss=LossChoice(kind, target_name),
                 mode="train", blocks=True)
    generated = module_from_source(build_text(text, "step.yaml").rendered.files["step.py"], "step")
    reference, once = copy.deepcopy(model), copy.deepcopy(model)
    step = symgrad.bind(generated, model)

    inputs = {name: torch.randn(shape, generator=generator, dtype=torch.float64) for name, shape in case.checked.items()}
    with torch.no_grad():
        torch.manual_seed(7)  # the same dropout masks in every run below
        prediction = once(*inputs.values())  # one forward, no graph: the statistics one training step moves
    target = (torch.randint(prediction.shape[1], (prediction.shape[0],), generator=generator)
              if target_name == "labels" else torch.randn(prediction.shape, generator=generator, dtype=torch.float64))
    torch.manual_seed(7)
    step(**inputs, **{target_name: target}).backward()
    torch.manual_seed(7)
    getattr(F, kind)(reference(*inputs.values()), target).backward()

    expected = dict(reference.named_parameters())
    scale = max(value.grad.abs().max().item() for value in expected.values() if value.grad is not None)
    for key, value in model.named_parameters():
        if expected[key].grad is None:  # frozen
            assert value.grad is None, key
            continue
        # against the largest gradient: a bias before a train-mode BatchNorm has gradient 0 (both give 1e-16)
        assert (value.grad - expected[key].grad).abs().max().item() <= TOLERANCE * scale, key
    # torchvision's memory-efficient DenseNet recomputes its BatchNorms in autograd's backward (checkpoint),
    # moving their statistics twice; a step moves them once, as one forward does
    moved = dict(once.named_buffers())
    for key, value in model.named_buffers():
        if value.is_floating_point():
            assert (value - moved[key]).abs().max().item() <= TOLERANCE * max(moved[key].abs().max().item(), 1.0), key
        else:
            assert torch.equal(value, moved[key]), key
