"""Tracing PyTorch code into a spec, then generating it, then checking against the original code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from symgrad.check import module_from_source, relative_error
from symgrad.cli import main
from symgrad.pipeline import build_text
from symgrad.trace import TraceError, load_target, trace

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "seed_pytorch.py"


def generated(text: str):
    built = build_text(text, "traced.yaml")
    return module_from_source(built.rendered.files[f"{built.rendered.name}.py"], built.rendered.name)


def test_seed_loss_round_trip_matches_autograd_on_the_original_function():
    function, files = load_target(f"{EXAMPLE}:loss")
    text = trace(function, {"z": (8, 32, 128, 128), "q1": (32, 32, 3, 3), "q2": (1, 32, 3, 3)}, ["z", "q1", "q2"],
                 "traced_seed3", files)
    module = generated(text)
    shapes = {"z": (2, 32, 64, 64), "q1": (32, 32, 3, 3), "q2": (1, 32, 3, 3)}  # checked at other sizes
    original = function.__globals__
    generator = torch.Generator().manual_seed(3)
    z, q1, q2 = (torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True) for shape in shapes.values())
    k, y = original["k"].double(), original["y"].double()[:2, :, :2, :2]
    original["k"], original["y"] = k, y  # the original function reads its globals; give them float64 and this size
    try:
        expected = torch.autograd.grad(function(z, q1, q2).sum(), (z, q1, q2))
    finally:
        original["k"], original["y"] = k.float(), original["y"].float()
    actual = module.gradients(z=z, q1=q1, q2=q2, k=k, y=y)
    for name, reference in zip(("z", "q1", "q2"), expected):
        assert relative_error(getattr(actual, name), reference) <= 1e-12, name


def test_residual_block_module_round_trip():
    block, files = load_target(f"{EXAMPLE}:ResidualBlock")
    text = trace(block, {"x": (2, 4, 8, 8), "target": (2, 4, 8, 8)}, None, "residual_block", files)
    assert "bias: conv1_bias" in text and "op: add" in text
    module = generated(text)
    block = block.double()
    x = torch.randn(2, 4, 8, 8, dtype=torch.float64, requires_grad=True)
    target = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    parameters = dict(block.named_parameters())
    expected = torch.autograd.grad(block(x, target), [x, *parameters.values()])
    actual = module.gradients(x=x, target=target, conv1_weight=parameters["conv1.weight"],
                              conv1_bias=parameters["conv1.bias"], conv2_weight=parameters["conv2.weight"])
    for value, reference in zip(actual, expected):
        assert relative_error(value, reference) <= 1e-12


def test_unsupported_op_names_the_op_and_the_line():
    function, files = load_target(f"{EXAMPLE}:uses_cumsum")
    with pytest.raises(TraceError) as error:
        trace(function, {"x": (2, 3), "y": (2, 3)}, None, "bad", files)
    message = str(error.value)
    line = next(number for number, text in enumerate(EXAMPLE.read_text().splitlines(), 1) if "torch.cumsum" in text)
    assert "'cumsum' is not an op symgrad can differentiate" in message
    assert message.startswith(f"{EXAMPLE}:{line}: error:") and "\n" not in message


def test_trace_command_writes_a_spec_that_generates(tmp_path: Path):
    spec = tmp_path / "traced.yaml"
    result = CliRunner().invoke(main, ["trace", f"{EXAMPLE}:loss", "--shape", "z=8,32,128,128", "--shape", "q1=32,32,3,3",
                                       "--shape", "q2=1,32,3,3", "--wrt", "z,q1,q2", "-o", str(spec)])
    assert result.exit_code == 0, result.output
    generate = CliRunner().invoke(main, ["generate", str(spec), "-o", str(tmp_path / "out"), "--verify"])
    assert generate.exit_code == 0, generate.output
    bad = CliRunner().invoke(main, ["trace", f"{EXAMPLE}:uses_cumsum", "--shape", "x=2,3", "--shape", "y=2,3"])
    assert bad.exit_code == 2 and "cumsum" in bad.output
    wrong = CliRunner().invoke(main, ["trace", f"{EXAMPLE}:loss", "--shape", "z=8,32,64,64", "--shape", "q1=32,32,3,3",
                                      "--shape", "q2=1,32,3,3"])
    assert wrong.exit_code == 2 and "error: running it at z=[8, 32, 64, 64]" in wrong.output
    assert len(wrong.output.strip().splitlines()) == 1
