"""Every network of the bind zoo (``tests/models/test_bind_zoo.py``: models, zoo, zoo_nets, zoo_modern and
zoo_attention) traced *without a loss* (its spec ends in the model's outputs), written as blocks, bound,
and trained one step at another batch and spatial size in float64 with its loss written after the bound
model in plain PyTorch, against ``loss.backward()`` through a copy of the original module: every
parameter's ``.grad`` and every BatchNorm buffer; and under CPU bfloat16 autocast, as accurate as
autograd (issue 37)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import symgrad
from symgrad.trace import trace
from tests.models.built_once import module_of, once
from tests.models.compare import randomize
from tests.models.test_bind_zoo import AUTOCAST_CASES, CASES, assert_as_accurate_as_autograd, assert_trained_as_autograd


def traced_outputs(label):
    """The case's network (float64, random weights, train mode), its module traced without a loss as blocks,
    the loss it is trained with, inputs at the case's other size and a target for them; traced and built
    once a run (``tests/models/built_once.py``)."""
    case = CASES[label]
    kind = next(kind for kind in case.losses if hasattr(F, kind))
    generator = torch.Generator().manual_seed(11)
    torch.manual_seed(0)
    model = case.model(**case.init).double()
    randomize(model, generator)
    model.train()
    text = once(
        ("bind_zoo outputs", label),
        lambda: trace(model, case.traced, wrt="parameters", name="outputs_step", mode="train", blocks=True),
    )
    assert "\noutputs: " in text and "\nloss:" not in text
    generated = module_of(text, "outputs_step.yaml", "outputs_step")
    inputs = {
        name: torch.randn(shape, generator=generator, dtype=torch.float64) for name, shape in case.checked.items()
    }
    with torch.no_grad():
        torch.manual_seed(7)
        prediction = copy.deepcopy(model)(*inputs.values())
    target = (
        torch.randint(prediction.shape[1], (prediction.shape[0],), generator=generator)
        if kind in ("cross_entropy", "nll_loss")
        else torch.randn(prediction.shape, generator=generator, dtype=torch.float64)
    )
    return model, generated, kind, inputs, target


@pytest.mark.slow
@pytest.mark.parametrize("label", list(CASES))
def test_a_network_traced_without_a_loss_trains_as_autograd(label):
    model, generated, kind, inputs, target = traced_outputs(label)
    reference, once = copy.deepcopy(model), copy.deepcopy(model)
    with torch.no_grad():
        torch.manual_seed(7)
        once(*inputs.values())  # one forward, no graph: the statistics one training step moves
    fast = symgrad.bind(generated, model, verify=False)  # compared with autograd below
    for net in (fast, reference):
        torch.manual_seed(7)  # the same dropout masks in both
        getattr(F, kind)(net(*inputs.values()), target).backward()

    assert_trained_as_autograd(model, reference, once)


@pytest.mark.slow
@pytest.mark.parametrize("label", AUTOCAST_CASES)
def test_a_network_traced_without_a_loss_is_as_accurate_as_autograd_under_bfloat16_autocast(label):
    """The same step under CPU bfloat16 autocast, the model in float32: the bound model's gradients as close
    to the float64 ones as autograd's under the same autocast."""
    exact, generated, kind, inputs, target = traced_outputs(label)
    model = copy.deepcopy(exact).float()
    reference = copy.deepcopy(model)
    fast = symgrad.bind(generated, model, verify=False)  # compared with autograd below
    inputs32 = [value.float() for value in inputs.values()]
    target32 = target if not target.is_floating_point() else target.float()
    torch.manual_seed(7)
    getattr(F, kind)(exact(*inputs.values()), target).backward()
    for net in (fast, reference):
        torch.manual_seed(7)  # the same dropout masks in both
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = getattr(F, kind)(net(*inputs32), target32)
        loss.backward()
    assert_as_accurate_as_autograd(exact, model, reference)
