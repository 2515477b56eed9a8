"""Generated code always compiles and imports: Python's own limits (more than 255 names in a
star-unpacking, long argument lists) are never hit, and a module that would not compile is refused
before anything is written, whatever the cause."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import symgrad.pipeline
import symgrad.render
from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace

ROOT = Path(__file__).resolve().parents[2]


def wide_spec(count: int) -> str:
    """A chain that reads ``count`` parameters: more saved tensors than a starred target may name."""
    inputs = ["  x: {shape: [2, 3]}", "  y: {shape: [2, 3]}"] + [f"  b{i}: {{shape: [3]}}" for i in range(count)]
    layers = [f"  - {{op: mul, in: [{'x' if i == 0 else f'h{i - 1}'}, b{i}], out: h{i}}}" for i in range(count)]
    return (
        "\n".join(
            [
                "name: wide",
                "inputs:",
                *inputs,
                "layers:",
                *layers,
                f"loss: {{op: mse_loss, in: h{count - 1}, target: y}}",
                f"wrt: [x, {', '.join(f'b{i}' for i in range(count))}]",
            ]
        )
        + "\n"
    )


def test_a_module_with_300_saved_tensors_imports_and_its_drop_in_backward_is_right():
    built = build_text(wide_spec(300), "wide.yaml")
    module = module_from_source(built.rendered.files["wide.py"], "wide")
    generator = torch.Generator().manual_seed(0)
    inputs = {
        name: (1 + 0.01 * torch.randn(shape, generator=generator, dtype=torch.float64)).requires_grad_()
        for name, shape in [("x", (2, 3)), ("y", (2, 3))] + [(f"b{i}", (3,)) for i in range(300)]
    }
    inputs["y"].requires_grad_(False)
    wrt = [value for name, value in inputs.items() if name != "y"]
    expected = torch.autograd.grad(module.forward(**inputs), wrt)
    actual = torch.autograd.grad(module.loss_with_explicit_backward(**inputs), wrt)
    for ours, theirs in zip(actual, expected):
        assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-14)


ONE_INPUT = """
name: one_input
inputs:
  x: {shape: [2, 3]}
layers:
  - {op: tanh, in: x, out: h}
outputs: [h]
wrt: [x]
"""


def test_a_one_input_outputs_module_compiles_whole_and_its_backward_is_right(monkeypatch):
    """One input and no parameters: the Function saves ``(x,)``, and under torch.compile
    ``(x, *tensors)`` (it wrote ``x,, *tensors``, which Python refuses, before the two Functions shared
    that code)."""
    module = module_from_source(build_text(ONE_INPUT, "one_input.yaml").rendered.files["one_input.py"], "one_input")
    monkeypatch.setitem(sys.modules, "one_input", module)  # dynamo reads a traced function's module
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    cotangent = torch.randn(2, 3, dtype=torch.float64)
    compiled = torch.compile(lambda x: module.outputs_with_explicit_backward(x)[0], fullgraph=True, backend="eager")
    expected = torch.autograd.grad(torch.tanh(x), x, cotangent)[0]
    for run in (compiled, lambda x: module.outputs_with_explicit_backward(x)[0]):
        assert torch.allclose(torch.autograd.grad(run(x), x, cotangent)[0], expected, rtol=1e-12, atol=1e-14)


def test_a_module_python_cannot_compile_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    spec = tmp_path / "s.yaml"
    spec.write_text((ROOT / "examples" / "seed1_strided_conv.yaml").read_text())
    render = symgrad.render.render_files

    def broken(*arguments, **keywords):
        rendered = render(*arguments, **keywords)
        rendered.files = {
            name: text + ("\ndef broken(:\n" if name.endswith(".py") else "") for name, text in rendered.files.items()
        }
        return rendered

    monkeypatch.setattr(symgrad.render, "render_files", broken)
    from click.testing import CliRunner

    from symgrad.cli import main

    result = CliRunner().invoke(main, ["generate", str(spec), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "cannot compile" in result.output and "bug in symgrad" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _too_wide(text: str) -> list[str]:
    from symgrad.printing import WIDTH

    return [
        f"line {number} ({len(line)} columns): {line[:60]}..."
        for number, line in enumerate(text.split("\n"), 1)
        if len(line) > WIDTH
    ]


@pytest.mark.parametrize("path", sorted((ROOT / "generated").glob("*.py")), ids=lambda path: path.name)
def test_every_committed_generated_python_file_fits_in_100_columns_and_compiles(path: Path):
    text = path.read_text(encoding="utf-8")
    assert not _too_wide(text), (path.name, _too_wide(text))
    compile(text, path.name, "exec")


def test_a_traced_resnet_module_and_its_tests_fit_in_100_columns_and_compile(monkeypatch):
    """A ResNet-style model traced as ``symgrad trace`` does (long parameter names, batch norm's
    running statistics, a downsampling shortcut, the internal channels_last layout that larger
    inputs get): its module and test file, every line."""
    import symgrad.roles
    from symgrad.trace import LossChoice, load_target, trace

    monkeypatch.setattr(symgrad.roles, "CHANNELS_LAST_MIN_POSITIONS", 1)
    torch.manual_seed(0)
    tiny = load_target(f"{ROOT / 'tests' / 'trace' / 'inputs' / 'resnet_style.py'}:TinyResNet")
    model = type(tiny)(width=16)  # 16 input channels: its 1x1 stride-2 shortcut may run channels_last (roles.py)
    text = trace(
        model, {"x": (2, 3, 16, 16)}, name="tiny_resnet", loss=LossChoice("cross_entropy", "labels"), mode="train"
    )
    built = build_text(text, "tiny_resnet.yaml")
    symgrad.pipeline._check_compiles(built.rendered)
    for name in ("tiny_resnet.py", "test_tiny_resnet.py"):
        assert not _too_wide(built.rendered.files[name]), (name, _too_wide(built.rendered.files[name]))
    module = built.rendered.files["tiny_resnet.py"]
    assert any(line.startswith('        params["layers.') for line in module.split("\n"))  # laid out, not left alone
    assert "        params = _channels_last(params)\n" in module  # the weights, moved where the call's size pays


def test_every_helper_a_rule_emits_fits_in_100_columns():
    """Helpers are copied into modules verbatim, so a rule's helper is as narrow as the module."""
    from symgrad.algebra import PRIMITIVES

    for name, primitive in PRIMITIVES.items():
        # a declared helper with every part (each choice of parts: tests/pipeline/test_helper_variants.py)
        helper = primitive.helper if isinstance(primitive.helper, str) else primitive.helper.whole
        assert not _too_wide(helper), (name, _too_wide(helper))


def test_recompute_of_a_forward_that_draws_masks_is_refused_under_torch_compile(monkeypatch):
    """``recompute=True`` re-runs the forward in the backward with the random state it read; under
    torch.compile that state cannot be read, so the masks would be drawn anew: refused in one line
    (eager, it runs: the state is put back)."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2)).double()
    text = trace(model, {"input": (3, 4)}, "parameters", "drop", loss=LossChoice("mse_loss"), mode="train")
    module = module_from_source(build_text(text, "drop.yaml").rendered.files["drop.py"], "drop")
    monkeypatch.setitem(sys.modules, "drop", module)  # dynamo reads a traced function's module
    params = {key: value.detach().clone().requires_grad_() for key, value in model.state_dict().items()}
    x, t = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    module.loss_with_explicit_backward(x, t, params, recompute=True).backward()  # eager: runs
    step = torch.compile(lambda x, t: module.loss_with_explicit_backward(x, t, params, recompute=True), backend="eager")
    with pytest.raises(RuntimeError) as refused:
        step(x, t)
    assert str(refused.value) == (
        "recompute=True would draw this forward's random masks anew in the backward under torch.compile "
        "(fix: recompute=False)"
    )
