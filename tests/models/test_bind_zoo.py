"""Every network of ``tests/models/classic.py``, ``tests/models/zoo.py``, ``tests/models/zoo_nets.py``, ``tests/models/zoo_modern.py``,
``tests/models/zoo_attention.py`` and ``tests/models/zoo_hybrid.py``
as a training step: traced for its parameters alone (``wrt="parameters"``, what ``symgrad.bind`` needs),
written as blocks (the CLI's default), bound to the model and run once at another batch and spatial size in float64, against
``loss.backward()`` through a copy of the original module: every parameter's ``.grad`` and every
BatchNorm buffer.

Tracing for the parameters alone changes what is derived: the input's gradient is not computed, so
the first convolution's weight gradient is emitted alone (one ``convolution_backward`` call asking for it alone),
and in a weight-standardised network (BiT) that weight is itself computed; these paths are not taken
when the input is differentiated too, as the other model tests do."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F

import symgrad
from symgrad.trace import LossChoice, trace
from tests.helpers import CudaNormKernels
from tests.models import (
    test_classic_cnns as test_trace_models,
    test_zoo_attention as test_trace_attention,
    test_zoo_blocks as test_trace_zoo,
    test_zoo_hybrid as test_trace_zoo_hybrid,
    test_zoo_modern as test_trace_zoo_modern,
    test_zoo_nets as test_trace_zoo_nets,
)
from tests.models.built_once import module_of, once
from tests.models.compare import randomize

CASES = {
    **{f"models:{label}": case for label, case in test_trace_models.CASES.items()},
    **{f"zoo:{label}": case for label, case in test_trace_zoo.CASES.items()},
    **{f"zoo_nets:{label}": case for label, case in test_trace_zoo_nets.CASES.items()},
    **{f"zoo_modern:{label}": case for label, case in test_trace_zoo_modern.CASES.items()},
    **{f"zoo_attention:{label}": case for label, case in test_trace_attention.CASES.items()},
    **{f"zoo_hybrid:{label}": case for label, case in test_trace_zoo_hybrid.CASES.items()},
}
TOLERANCE = 1e-10
AUTOCAST_CASES = [label for label in CASES if label != "zoo_attention:unetr_encoder"]
"""The networks the autocast tests judge: the UNETR-style encoder's own autograd step under bfloat16 gave
NaN gradients in one test order (the reference itself overflowed), so there was nothing to compare it with;
its bound step in float64 is checked like every other network's."""
DEVICE = os.environ.get("SYMGRAD_TEST_DEVICE", "cpu")
"""Where the bound steps run: the CPU in CI; ``SYMGRAD_TEST_DEVICE=cuda`` runs this file on a GPU
(traced and generated on the CPU, as users do, then bound to the model on the device)."""
AUTOCAST = {"cpu": [torch.bfloat16], "cuda": [torch.bfloat16, torch.float16]}
"""The autocast dtypes each device's checks run (PyTorch's CPU autocast takes bfloat16 alone)."""


def test_every_network_has_a_torch_nn_functional_loss():
    assert all(any(hasattr(F, kind) for kind in case.losses) for case in CASES.values())


def traced_step(label: str):
    """The network of ``label`` in train mode (float64, running statistics randomised), the module
    generated from its trace for the parameters alone as blocks, its loss, and data at the checked
    sizes: ``(model, generated, kind, inputs, target name, target)``; traced and built once a run
    (``tests/models/built_once.py``: the float64 and the autocast test read the same)."""
    case = CASES[label]
    kind = next(kind for kind in case.losses if hasattr(F, kind))
    generator = torch.Generator().manual_seed(11)
    torch.manual_seed(0)
    model = case.model(**case.init).double()
    randomize(model, generator)
    model.train()
    target_name = "labels" if kind in ("cross_entropy", "nll_loss") else "target"
    text = once(
        ("bind_zoo step", label),
        lambda: trace(
            model,
            case.traced,
            wrt="parameters",
            name="step",
            loss=LossChoice(kind, target_name),
            mode="train",
            blocks=True,
        ),
    )
    generated = module_of(text, "step.yaml", "step")
    inputs = {
        name: torch.randn(shape, generator=generator, dtype=torch.float64) for name, shape in case.checked.items()
    }
    with torch.no_grad():
        prediction = copy.deepcopy(model)(*inputs.values())
    target = (
        torch.randint(prediction.shape[1], (prediction.shape[0],), generator=generator)
        if target_name == "labels"
        else torch.randn(prediction.shape, generator=generator, dtype=torch.float64)
    )
    return model, generated, kind, inputs, target_name, target


def on_device(model, generated, kind, inputs, target_name, target):
    """:func:`traced_step`'s model and data moved to :data:`DEVICE`."""
    return (
        model.to(DEVICE),
        generated,
        kind,
        {name: value.to(DEVICE) for name, value in inputs.items()},
        target_name,
        target.to(DEVICE),
    )


@pytest.mark.parametrize("label", list(CASES))
def test_a_network_traced_for_its_parameters_trains_as_autograd(label):
    model, generated, kind, inputs, target_name, target = on_device(*traced_step(label))
    reference, once = copy.deepcopy(model), copy.deepcopy(model)
    step = symgrad.bind(generated, model)
    with torch.no_grad():
        torch.manual_seed(7)  # the same dropout masks in every run below
        once(*inputs.values())  # one forward, no graph: the statistics one training step moves
    torch.manual_seed(7)
    step(**inputs, **{target_name: target}).backward()
    torch.manual_seed(7)
    getattr(F, kind)(reference(*inputs.values()), target).backward()

    assert_trained_as_autograd(model, reference, once)


def assert_trained_as_autograd(model, reference, once) -> None:
    """``model``'s gradients equal ``reference``'s (autograd's) and its buffers ``once``'s (one forward's)."""
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


@pytest.mark.parametrize("dtype", AUTOCAST[DEVICE], ids=str)
@pytest.mark.parametrize("label", AUTOCAST_CASES)
def test_a_network_bound_under_autocast_is_as_accurate_as_autograd(label, dtype, monkeypatch):
    """The same step under ``torch.autocast(DEVICE, dtype=dtype)``, the model in float32: its
    gradients as close to the float64 ones as autograd's under the same autocast (a max-pool after an
    op autocast runs in float32, BiT's GroupNorm, gets its gradient in its input's dtype). Its backward
    runs within :class:`CudaNormKernels`: a bfloat16 instance or layer norm input with a float32
    weight, which the CPU's kernels take and CUDA's refuse, failed four networks on an H100."""
    exact, generated, kind, inputs, target_name, target = on_device(*traced_step(label))
    model = copy.deepcopy(exact).float()
    reference = copy.deepcopy(model)
    step = symgrad.bind(generated, model)
    target32 = target if target_name == "labels" else target.float()
    inputs32 = {name: value.float() for name, value in inputs.items()}
    torch.manual_seed(7)
    getattr(F, kind)(exact(*inputs.values()), target).backward()
    torch.manual_seed(7)
    with torch.autocast(DEVICE, dtype=dtype):
        ours = step(**inputs32, **{target_name: target32})
    # on the CPU too, the norm kernels refuse what CUDA's refuse (a mixed weight), and the layer norm's
    # helper does not call them with the mix, as on a GPU (tests/rules/test_layer_norm_backward_call.py: on a CPU it does)
    monkeypatch.setattr(generated, "LAYER_NORM_MIXED_DEVICES", (), raising=False)
    with CudaNormKernels():
        ours.backward()
    torch.manual_seed(7)
    with torch.autocast(DEVICE, dtype=dtype):
        theirs = getattr(F, kind)(reference(*inputs32.values()), target32)
    theirs.backward()
    assert_as_accurate_as_autograd(exact, model, reference)


def assert_as_accurate_as_autograd(exact, model, reference) -> None:
    """``model``'s gradients (the bound step's, under autocast) as close to ``exact``'s float64 ones as
    ``reference``'s (autograd's under the same autocast): within 4x its error, or 1e-3."""
    truth = [value.grad for value in exact.parameters() if value.grad is not None]
    mine = [value.grad for value in model.parameters() if value.grad is not None]
    autograds = [value.grad for value in reference.parameters() if value.grad is not None]
    assert len(truth) == len(mine) == len(autograds) and all(grad.dtype == torch.float32 for grad in mine)
    norm = torch.cat([grad.flatten() for grad in truth]).norm().item()

    def error(grads):
        return (
            torch.cat([(grad.double() - exact_grad).flatten() for grad, exact_grad in zip(grads, truth)]).norm().item()
            / norm
        )

    assert error(autograds) > 1e-5, "autocast did not lower the precision: the comparison would prove nothing"
    assert error(mine) <= 4 * error(autograds) + 1e-3, (error(mine), error(autograds))
