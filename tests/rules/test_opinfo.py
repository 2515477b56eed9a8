"""Every OpInfo sample PyTorch's own test-suite has for the conv family, through symgrad.

Samples that fit symgrad's arguments are generated as one-layer specs and checked against
``torch.autograd.grad`` in float64 with a random cotangent, on the sample's own tensors. The rest
are counted as skipped, each with its reason, in the report printed at the end of the run; a skip
for a reason not listed here fails the test, so coverage cannot shrink silently.
"""

from __future__ import annotations

import os

import pytest
import torch
import yaml

from symgrad.check import module_from_source, relative_error
from symgrad.errors import SpecError
from symgrad.pipeline import build_text
from symgrad.rules import LAYER_RULES
from symgrad.trace.torch_names import torch_signature
from tests.conftest import OPINFO_REPORT

op_db = pytest.importorskip("torch.testing._internal.common_methods_invocations").op_db

ALLOWED_SKIPS = ("conv_transpose",)


def _samples(name):
    info = next(info for info in op_db if info.name == f"nn.functional.{name}")
    return list(info.sample_inputs("cpu", torch.float64, requires_grad=True))


def _spec_for(name, sample):
    weight = sample.args[0]
    bias = sample.args[1] if len(sample.args) > 1 else sample.kwargs.get("bias")
    keywords = {k: v for k, v in sample.kwargs.items() if k != "bias"}
    if (
        name.startswith("conv_transpose") and len(sample.args) > 2
    ):  # (weight, bias, stride, padding, output_padding, groups, dilation)
        keywords.update(zip(("stride", "padding", "output_padding", "groups", "dilation"), sample.args[2:]))
    out = getattr(torch.nn.functional, name)(sample.input, weight, bias, **keywords)
    layer = {"op": name, "weight": "w", **{k: list(v) if isinstance(v, tuple) else v for k, v in keywords.items()}}
    inputs = {"x": {"shape": list(sample.input.shape)}, "w": {"shape": list(weight.shape)}}
    wrt = ["x", "w"]
    if bias is not None:
        inputs["b"] = {"shape": list(bias.shape)}
        layer["bias"] = "b"
        wrt.append("b")
    inputs["y"] = {"shape": list(out.shape)}
    text = yaml.safe_dump(
        {
            "name": "opinfo_case",
            "inputs": inputs,
            "layers": [layer],
            "loss": {"op": "half_sq_error", "target": "y"},
            "wrt": wrt,
        },
        sort_keys=False,
    )
    values = {"x": sample.input, "w": weight, **({"b": bias} if bias is not None else {})}
    return text, values, out


@pytest.mark.parametrize(
    "name", ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"]
)
def test_opinfo_samples_match_autograd(name):
    report = OPINFO_REPORT.setdefault(name, {"run": 0, "skipped": []})
    for index, sample in enumerate(_samples(name)):
        text, values, out = _spec_for(name, sample)
        try:
            built = build_text(text, f"opinfo-{name}-{index}.yaml")
        except SpecError as error:
            reason = error.message.split(": ", 1)[-1]
            assert any(allowed in reason for allowed in ALLOWED_SKIPS), f"unexpected refusal: {error}"
            report["skipped"].append(reason.split(" needs ")[0])
            continue
        module = module_from_source(built.rendered.files["opinfo_case.py"], "opinfo_case")
        cotangent = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(index))
        wrt = list(values)
        expected = torch.autograd.grad(out, [values[k] for k in wrt], cotangent)
        target = (out - cotangent).detach()  # residual = out - y = cotangent: the module's adjoint of it
        actual = module.gradients(**{k: v.detach() for k, v in values.items()}, y=target)
        for key, reference in zip(wrt, expected):
            assert relative_error(getattr(actual, key), reference) <= 1e-10, (name, index, key, sample.kwargs)
        report["run"] += 1
    assert report["run"] > 0


# --------------------------------------------------------------------------------------------
# One-input ops: pooling, resampling, padding, pixel_shuffle
# --------------------------------------------------------------------------------------------

ONE_INPUT_OPS = (
    "pad",
    "interpolate",
    *(f"adaptive_avg_pool{d}d" for d in (1, 2, 3)),
    *(f"avg_pool{d}d" for d in (1, 2, 3)),
    *(f"max_pool{d}d" for d in (1, 2, 3)),
    "pixel_shuffle",
)


def _positional(name: str) -> tuple[str, ...]:
    """PyTorch's positional argument names after ``input``, for reading each sample's args: the rule's
    own (what ``symgrad trace`` binds a recorded call by)."""
    rule = LAYER_RULES[name]
    return tuple((rule.signature or torch_signature(name))[1:])


# what symgrad refuses, each a clear error; any other refusal fails the test
ONE_INPUT_ALLOWED_SKIPS = (
    "empty tensor",
    "argument 'return_indices' = true is not supported yet",  # a tuple: a layer has one tensor output
    "with a negative pad is not supported",
)
# max_pool's samples run to thousands, mostly ceil_mode/return_indices combinations: CI runs every
# 7th, SYMGRAD_FULL_SWEEP=1 all of them
EVERY = 1 if os.environ.get("SYMGRAD_FULL_SWEEP") else 7


def _plain(value):
    if isinstance(value, (tuple, list, torch.Size)):
        return [_plain(v) for v in value]
    return value


def _variants(name):
    return [info for info in op_db if info.name == f"nn.functional.{name}"]


@pytest.mark.parametrize("name", ONE_INPUT_OPS)
def test_opinfo_one_input_samples_match_autograd(name):
    for info in _variants(name):
        label = name + (f" ({info.variant_test_name})" if info.variant_test_name else "")
        report = OPINFO_REPORT.setdefault(label, {"run": 0, "skipped": []})
        samples = list(info.sample_inputs("cpu", torch.float64, requires_grad=True))
        step = EVERY if name.startswith("max_pool") else 1
        for index, sample in enumerate(samples[::step]):
            arguments = dict(zip(_positional(name), sample.args))
            arguments.update(sample.kwargs)
            arguments = {key: _plain(value) for key, value in arguments.items() if value is not None}
            out = getattr(torch.nn.functional, name)(sample.input, **arguments)
            out = out[0] if isinstance(out, tuple) else out  # return_indices=True (refused below)
            if sample.input.numel() == 0 or out.numel() == 0:
                report["skipped"].append("empty tensor (a size of 0; spec sizes are positive)")
                continue
            text = yaml.safe_dump(
                {
                    "name": "opinfo_case",
                    "inputs": {"x": {"shape": list(sample.input.shape)}, "y": {"shape": list(out.shape)}},
                    "layers": [{"op": name, **arguments}],
                    "loss": {"op": "half_sq_error", "target": "y"},
                    "wrt": ["x"],
                },
                sort_keys=False,
            )
            try:
                built = build_text(text, f"opinfo-{name}-{index}.yaml")
            except SpecError as error:
                reason = error.message.split(": ", 1)[-1].split(" [")[0]  # without the "[input is ...]" context
                assert any(allowed in reason for allowed in ONE_INPUT_ALLOWED_SKIPS), f"unexpected refusal: {error}"
                report["skipped"].append(reason)
                continue
            module = module_from_source(built.rendered.files["opinfo_case.py"], "opinfo_case")
            cotangent = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(index))
            (expected,) = torch.autograd.grad(out, sample.input, cotangent)
            actual = module.gradients(x=sample.input.detach(), y=(out - cotangent).detach()).x
            assert relative_error(actual, expected) <= 1e-10, (label, index, arguments)
            report["run"] += 1
    assert any(OPINFO_REPORT[key]["run"] for key in OPINFO_REPORT if key.split(" ")[0] == name), f"no {name} sample ran"
