"""The generated checks and `symgrad verify` tell the truth: they pass on correct modules of real
architectures and deep plain nets, and they fail when a rule is wrong or the forward is NaN.

Both verdicts come from one definition (``symgrad.testdata``): the inputs by role, the error measure,
the float32 rule and the gradcheck subset. The generated test embeds those functions verbatim.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import sympy
from click.testing import CliRunner

from symgrad import testdata
from symgrad.check import accuracy_table
from symgrad.cli import main
from symgrad.emit import write_files
from symgrad.pipeline import build_text
from tests.helpers import generated_module, run_generated_tests, spec_text
from tests.models.architectures import ARCHITECTURES, plain_chain

TOLERANCE = 1e-12


def _run_generated_test(built, directory: Path):
    """The generated test file's outcomes, run in this process (``tests.helpers.run_generated_tests``)."""
    write_files(built.rendered, directory)
    return run_generated_tests(directory / f"test_{built.rendered.name}.py")


def _verify(built):
    spec_shapes = {node.name: node.shape for node in built.graph.inputs}
    return accuracy_table(built.graph, generated_module(built), built.shapes, spec_shapes, tolerance=TOLERANCE)


CORRECT = {**{name: builder for name, builder in ARCHITECTURES.items()},
           **{f"chain{depth}x{channels}": (lambda depth=depth, channels=channels: plain_chain(depth, channels))
              for depth in (20, 50, 100) for channels in (4, 64)}}
"""Deep plain chains up to 100 layers (200 took 71-88 s each of CI's 30 minutes; `tests/pipeline/test_scaling.py` checks
that generation grows linearly with depth)."""


# Each generated test file runs (in this process): by default one representative per section of the
# test template (the rest, every plain chain among them, are marked slow; CI runs them all).
REPRESENTATIVES = {
    "vgg11_bn-train": "the classes table, the zero-by-structure check (biases before training batch_norm), "
                      "and gradcheck's first/middle/last subset of many weights",
    "srcnn": "neither optional section: the template's base checks alone",
}
assert set(REPRESENTATIVES) <= set(CORRECT), "a representative that is no case would leave its section unrun"


@pytest.mark.parametrize("name", [name if name in REPRESENTATIVES else pytest.param(name, marks=pytest.mark.slow)
                                  for name in sorted(CORRECT)])
def test_verify_and_the_generated_test_pass_on_correct_modules(name: str, tmp_path: Path):
    built = build_text(CORRECT[name](), f"{name}.yaml", documents=False)
    table = _verify(built)
    assert table.problems == [], table.problems
    result = _run_generated_test(built, tmp_path)
    assert result.failed == 0 and result.passed > 0, result.report


def test_a_bias_before_training_batch_norm_is_reported_and_checked_zero(tmp_path: Path):
    from symgrad.roles import zero_by_structure

    built = build_text(ARCHITECTURES["vgg11_bn-train"](), "vgg.yaml")
    zero = zero_by_structure(built.graph)
    conv_biases = sorted(node.name for node in built.graph.inputs if node.name.startswith("conv") and node.name.endswith("_b"))
    assert len(conv_biases) == 8 and sorted(zero) == conv_biases  # VGG-11: 8 convs, each biased, each before a BatchNorm
    assert all("training-mode batch_norm" in why for why in zero.values())
    assert "def test_gradients_zero_by_structure_are_zero" in built.rendered.files["test_vgg11_bn_train.py"]
    eval_mode = build_text(ARCHITECTURES["vgg11_bn-eval"](), "vgg.yaml")
    assert zero_by_structure(eval_mode.graph) == {}  # running statistics do not cancel the bias
    spec = tmp_path / "vgg.yaml"
    spec.write_text(ARCHITECTURES["vgg11_bn-train"]())
    result = CliRunner().invoke(main, ["generate", str(spec), "-o", str(tmp_path / "gen")])
    assert result.exit_code == 0 and "warning:" in result.output and "conv1_b" in result.output


def test_normalisations_see_enough_entries_at_the_test_shapes():
    built = build_text(ARCHITECTURES["resnet18-train"](), "resnet.yaml")
    for shapes in built.shapes:
        resized = built.graph.with_input_shapes(shapes)
        for node in resized.nodes.values():
            if node.rule is not None and node.rule.op == "batch_norm":
                x = resized.nodes[node.operands["input"]].shape
                assert x[0] * x[2] * x[3] >= 8, (node.name, x)


# Each rule is emitted: conv1 needs only its weight adjoint (x is not differentiated), conv2 both
# (the fused kernel), conv3 only its input adjoint (k is a constant); relu its mask.
MUTATION_SPEC = spec_text(
    {"x": [2, 3, 9, 9], "w1": [4, 3, 3, 3], "w2": [3, 4, 3, 3], "k": [3, 3, 3, 3], "y": [2, 3, 5, 5]},
    [{"op": "conv2d", "weight": "w1", "stride": 2, "padding": 1, "out": "h"}, {"op": "relu", "out": "a"},
     {"op": "conv2d", "weight": "w2", "dilation": 2, "padding": 2, "out": "c"},
     {"op": "conv2d", "weight": "k", "padding": 1, "out": "p"}],
    {"op": "mse_loss", "in": "p", "target": "y"}, ["w1", "w2"], name="mutated")


def _flip_a_sign(monkeypatch):
    from symgrad.algebra import PRIMITIVES

    original = PRIMITIVES["conv_transpose"]
    monkeypatch.setitem(PRIMITIVES, "conv_transpose", dataclasses.replace(
        original, code=lambda operands, params, show: f"(-{original.code(operands, params, show)})"))


def _drop_a_mask(monkeypatch):
    from symgrad.rules import LAYER_RULES

    monkeypatch.setattr(LAYER_RULES["relu"], "from_output", lambda out: sympy.Integer(1))
    monkeypatch.setattr(LAYER_RULES["relu"], "fused_pullback", lambda grad, node: grad)  # and in the fused form


def _swap_stride_and_dilation_in_the_weight_adjoint(monkeypatch):
    """In the weight's gradient alone (w1's: the spec differentiates no input), which ``gradients``
    computes with one ``convolution_backward`` call asking for it alone."""
    from symgrad.algebra import PRIMITIVES

    original = PRIMITIVES["conv_backward"]

    def swapped(operands, params, show):
        if tuple(params["output_mask"]) != (False, True, False):
            return original.code(operands, params, show)
        return original.code(operands, {**dict(params._items), "stride": params["dilation"],
                                        "dilation": params["stride"]}, show)

    monkeypatch.setitem(PRIMITIVES, "conv_backward", dataclasses.replace(original, code=swapped))


@pytest.mark.parametrize("mutate", [pytest.param(_flip_a_sign, marks=pytest.mark.slow),  # one spec: one test-file run
                                    pytest.param(_drop_a_mask, marks=pytest.mark.slow),  # representative is enough
                                    _swap_stride_and_dilation_in_the_weight_adjoint],   # by default; CI runs all three
                         ids=["flip-a-sign", "drop-a-mask", "swap-stride-and-dilation"])
def test_a_wrong_rule_fails_both_verify_and_the_generated_test(mutate, monkeypatch, tmp_path: Path):
    correct = build_text(MUTATION_SPEC, "mutated.yaml")
    mutate(monkeypatch)
    built = build_text(MUTATION_SPEC, "mutated.yaml")
    assert built.rendered.files["mutated.py"] != correct.rendered.files["mutated.py"]  # the mutation took effect
    assert _verify(built).problems
    spec = tmp_path / "mutated.yaml"
    spec.write_text(MUTATION_SPEC)
    assert CliRunner().invoke(main, ["verify", str(spec), "--float32-shapes", "small"]).exit_code == 1
    result = _run_generated_test(built, tmp_path / "gen")
    assert result.failed > 0, result.report


NAN_SPEC = spec_text({"x": [2, 3, 4, 4], "w": [3, 3, 3, 3], "y": [2, 3, 4, 4]},
                     [{"op": "conv2d", "weight": "w", "padding": 1, "out": "h"}, {"op": "log", "out": "p"}],
                     {"op": "mse_loss", "in": "p", "target": "y"}, ["x", "w"], name="nan_forward")


def test_a_nan_forward_fails_everywhere(tmp_path: Path):
    """log of a conv output is NaN for half the entries: no check may call that a pass."""
    spec = tmp_path / "nan.yaml"
    spec.write_text(NAN_SPEC)
    verified = CliRunner().invoke(main, ["verify", str(spec), "--float32-shapes", "small"])
    assert verified.exit_code == 1 and "NaN" in verified.output, verified.output
    generated = CliRunner().invoke(main, ["generate", str(spec), "-o", str(tmp_path / "gen"), "--verify"])
    assert generated.exit_code == 1 and "FAILED" in generated.output and "NaN" in generated.output, generated.output
    result = _run_generated_test(build_text(NAN_SPEC, "nan.yaml"), tmp_path / "gen2")
    assert result.failed > 0 and "NaN" in result.report, result.report


def test_the_generated_test_embeds_the_shared_definitions_verbatim():
    """symgrad.testdata's functions, verbatim, in the one file every generated test beside it imports
    (issue 64: not a copy in every test file)."""
    built = build_text(ARCHITECTURES["espcn"](), "espcn.yaml")
    test_source, shared = built.rendered.files["test_espcn.py"], built.rendered.files["_symgrad_testdata.py"]
    for function in (testdata.make_inputs, testdata.first_nonfinite, testdata.relative_errors,
                     testdata.checked_subset, testdata.float32_acceptable):
        assert inspect.getsource(function) in shared, function.__name__
        assert f"def {function.__name__}(" not in test_source, function.__name__
    assert '_location.with_name("_symgrad_testdata.py")' in test_source


def test_error_measure():
    import torch

    expected = {"w": torch.tensor([1.0, -2.0]), "b": torch.tensor([0.0, 1e-17])}  # b: zero by structure
    actual = {"w": torch.tensor([1.0, -2.0 + 2e-16]), "b": torch.tensor([3e-17, 0.0])}
    errors = testdata.relative_errors(actual, expected)
    assert errors["w"] == pytest.approx(1e-16) and errors["b"] < 1e-16  # b measured against the typical scale
    actual["w"] = torch.tensor([float("nan"), 0.0])
    assert testdata.relative_errors(actual, expected)["w"] == float("inf")
    assert testdata.first_nonfinite({"the forward": torch.tensor([1.0, float("inf")])}) == "the forward holds Inf"
    assert testdata.checked_subset([f"w{i}" for i in range(200)]) == ["w0", "w100", "w199"]
    roles = {"w": ["weight", 2 ** 0.5, [1, 2, 3]], "v": ["variance", 1.0, []]}
    drawn = testdata.make_inputs({"w": (64, 32, 3, 3), "v": (1000,)}, roles, ["w"], torch.float64, 0)
    assert abs(drawn["w"].std().item() - (2 / (32 * 9)) ** 0.5) < 0.01 and drawn["v"].min() > 0
