"""The heavy sweep: every combination of stride, padding, dilation, groups and bias, for conv2d and
conv_transpose2d, against autograd (float64, random cotangent), readable and fast gradients.

CI runs every 8th combination; the full sweep (144 combinations) is

    SYMGRAD_FULL_SWEEP=1 .venv/bin/python -m pytest -m slow tests/rules/test_sweep.py
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from symgrad.check import random_inputs, relative_error, verify
from tests.helpers import build_text, generated_module, spec_text

COMBINATIONS = list(itertools.product((1, 2, 3), (0, 1, 2), (1, 2), (1, 2), (False, True), (False, True)))
SELECTED = COMBINATIONS if os.environ.get("SYMGRAD_FULL_SWEEP") == "1" else COMBINATIONS[::8]


@pytest.mark.slow
@pytest.mark.parametrize(
    "stride, padding, dilation, groups, bias, transposed",
    SELECTED,
    ids=[
        f"s{s}-p{p}-d{d}-g{g}-{'bias' if b else 'nobias'}-{'transpose' if t else 'conv'}"
        for s, p, d, g, b, t in SELECTED
    ],
)
def test_conv_sweep(stride, padding, dilation, groups, bias, transposed):
    name = "conv_transpose2d" if transposed else "conv2d"
    x_shape, channels = [2, 4, 7, 6], 4  # 4 in and 4 out, so conv's [out, in/g] and conv_transpose's [in, out/g] agree
    w_shape = [channels, channels // groups, 3, 2]
    arguments = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    if transposed:
        arguments["output_padding"] = min(stride, dilation) - 1  # the largest PyTorch allows, to exercise it
    inputs = {"x": x_shape, "w": w_shape}
    layer = {"op": name, "weight": "w", **arguments, "out": "out"}
    if bias:
        inputs["b"] = [channels]
        layer["bias"] = "b"
    probe = getattr(torch.nn.functional, name)(torch.zeros(x_shape), torch.zeros(w_shape), **arguments)
    wrt = ["x", "w"] + (["b"] if bias else [])
    text = spec_text({**inputs, "y": list(probe.shape)}, [layer], {"op": "half_sq_error", "target": "y"}, wrt)
    built = build_text(text)
    module = generated_module(built)
    report = verify(built.graph, module, built.shapes, seed=stride * 100 + padding)
    assert report.worst() <= 1e-10, report
    values = random_inputs(built.shapes[0], built.graph.wrt, seed=7)
    loss = module.forward(**values)
    expected = torch.autograd.grad(loss, [values[k] for k in wrt], torch.ones_like(loss))
    actual = module.gradients(**values)  # the default cotangent
    for key, reference in zip(wrt, expected):
        assert relative_error(getattr(actual, key), reference) <= 1e-10, key
