"""Tracing PyTorch code into a spec, then generating it, then checking against the original code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner

from symgrad.check import module_from_source, relative_error
from symgrad.cli import main
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, TraceError, load_target, trace

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "seed_pytorch.py"


def generated(text: str):
    built = build_text(text, "traced.yaml")
    return module_from_source(built.rendered.files[f"{built.rendered.name}.py"], built.rendered.name)


def test_seed_loss_round_trip_matches_autograd_on_the_original_function():
    function = load_target(f"{EXAMPLE}:loss")
    text = trace(
        function, {"z": (8, 32, 128, 128), "q1": (32, 32, 3, 3), "q2": (1, 32, 3, 3)}, ["z", "q1", "q2"], "traced_seed3"
    )
    module = generated(text)
    shapes = {"z": (2, 32, 64, 64), "q1": (32, 32, 3, 3), "q2": (1, 32, 3, 3)}  # checked at other sizes
    original = function.__globals__
    generator = torch.Generator().manual_seed(3)
    z, q1, q2 = (
        torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True) for shape in shapes.values()
    )
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
    block = load_target(f"{EXAMPLE}:ResidualBlock")
    text = trace(block, {"x": (2, 4, 8, 8), "target": (2, 4, 8, 8)}, None, "residual_block")
    assert "bias: conv1_bias" in text and "op: add" in text
    module = generated(text)
    block = block.double()
    x = torch.randn(2, 4, 8, 8, dtype=torch.float64, requires_grad=True)
    target = torch.randn(2, 4, 8, 8, dtype=torch.float64)
    parameters = dict(block.named_parameters())
    expected = torch.autograd.grad(block(x, target), [x, *parameters.values()])
    actual = module.gradients(x=x, target=target, params=parameters)  # keyed as state_dict()
    for value, reference in zip([actual.x, *(actual.params[key] for key in parameters)], expected):
        assert relative_error(value, reference) <= 1e-12


def test_unsupported_op_names_the_op_and_the_line():
    function = load_target(f"{EXAMPLE}:uses_cumsum")
    with pytest.raises(TraceError) as error:
        trace(function, {"x": (2, 3), "y": (2, 3)}, None, "bad")
    message = str(error.value)
    line = next(number for number, text in enumerate(EXAMPLE.read_text().splitlines(), 1) if "torch.cumsum" in text)
    assert "'cumsum' is not an op symgrad can differentiate" in message
    assert message.startswith(f"{EXAMPLE}:{line}: error:") and "\n" not in message


def test_trace_command_writes_a_spec_that_generates(tmp_path: Path):
    spec = tmp_path / "traced.yaml"
    result = CliRunner().invoke(
        main,
        [
            "trace",
            f"{EXAMPLE}:loss",
            "--shape",
            "z=8,32,128,128",
            "--shape",
            "q1=32,32,3,3",
            "--shape",
            "q2=1,32,3,3",
            "--wrt",
            "z,q1,q2",
            "-o",
            str(spec),
        ],
    )
    assert result.exit_code == 0, result.output
    generate = CliRunner().invoke(main, ["generate", str(spec), "-o", str(tmp_path / "out"), "--verify"])
    assert generate.exit_code == 0, generate.output
    bad = CliRunner().invoke(main, ["trace", f"{EXAMPLE}:uses_cumsum", "--shape", "x=2,3", "--shape", "y=2,3"])
    assert bad.exit_code == 2 and "cumsum" in bad.output
    wrong = CliRunner().invoke(
        main,
        ["trace", f"{EXAMPLE}:loss", "--shape", "z=8,32,64,64", "--shape", "q1=32,32,3,3", "--shape", "q2=1,32,3,3"],
    )
    assert wrong.exit_code == 2 and "error: running it at z=[8, 32, 64, 64]" in wrong.output
    assert len(wrong.output.strip().splitlines()) == 1


INPUTS = ROOT / "tests" / "trace" / "inputs"


def test_trace_command_with_wrt_parameters_differentiates_by_the_parameters_alone(tmp_path: Path):
    spec = tmp_path / "params.yaml"
    result = CliRunner().invoke(
        main,
        [
            "trace",
            f"{INPUTS / 'resnet_style.py'}:TinyResNet",
            "--shape",
            "x=2,3,16,16",
            "--loss",
            "cross_entropy",
            "--train",
            "--wrt",
            "parameters",
            "-o",
            str(spec),
        ],
    )
    assert result.exit_code == 0, result.output
    wrt = yaml.safe_load(spec.read_text())["wrt"]
    assert "x" not in wrt and "bn1_weight" in wrt and "layers_0_0_conv1_weight" in wrt, wrt


def marked_line(path: Path, marker: str) -> str:
    """``path:line`` of the line holding ``# marker``."""
    number = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if f"# {marker}" in text)
    return f"{path}:{number}"


def run_trace(*arguments: str):
    return CliRunner().invoke(main, ["trace", *arguments])


def test_every_problem_on_the_loss_path_is_listed_at_once_with_file_line_and_module_path():
    model = load_target(f"{INPUTS / 'blocks.py'}:Net")
    with pytest.raises(TraceError) as error:
        trace(model, {"x": (2, 1, 6, 6)}, loss=LossChoice("mse_loss"))
    lines = str(error.value).splitlines()
    blocks = INPUTS / "blocks.py"
    assert len(lines) == 2, lines  # x.norm() is logged, never used by the loss: not reported
    assert lines[0].startswith(f"{marked_line(blocks, 'CUMSUM')}: error: 'cumsum' (in block) is not an op")
    assert lines[1].startswith(f"{marked_line(blocks, 'FLIP')}: error: 'flip' (in block)")
    assert all("(fix: " in line for line in lines)


def test_constructor_and_import_failures_are_one_line_with_their_file_line():
    blocks = INPUTS / "blocks.py"
    result = run_trace(f"{blocks}:Net", "--init", "width=0", "--input", "x=2,1,6,6", "--loss", "mse")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert result.output.startswith(
        f"{marked_line(blocks, 'CONSTRUCTOR')}: error: building Net(width=0) failed: width must be positive"
    )
    broken = INPUTS / "broken_import.py"
    result = run_trace(f"{broken}:loss", "--input", "x=2")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert (
        result.output.startswith(f"{marked_line(broken, 'IMPORT')}: error: importing")
        and "not_a_module" in result.output
    )
    result = run_trace(f"{blocks}:Net", "--init", "width=__import__('os')", "--input", "x=2,1,6,6")
    assert result.exit_code == 2 and "is not a number, string or list" not in result.output  # a string: reaches Net
    result = run_trace(f"{blocks}:Net", "--init", "width={a: 1}", "--input", "x=2,1,6,6")
    assert result.exit_code == 2 and "is not a number, string or list" in result.output


def test_module_level_model_imported_from_a_file_beside_with_a_number_argument(tmp_path: Path):
    spec = tmp_path / "wrapper.yaml"
    result = run_trace(f"{INPUTS / 'wrapper.py'}:loss", "--input", "x=2,1,8,8", "--input", "y=2,1,8,8", "-o", str(spec))
    assert result.exit_code == 0, result.output
    text = spec.read_text()
    assert "model_head_weight: {shape: [4, 1, 3, 3]}" in text and "other: 0.5" in text
    assert "loss: {op: mse_loss, in: model_tail, target: y, reduction: mean}" in text
    generate = CliRunner().invoke(main, ["generate", str(spec), "-o", str(tmp_path / "out"), "--verify"])
    assert generate.exit_code == 0, generate.output


def test_forward_returning_the_prediction_ends_in_outputs_or_loss_and_takes_init_and_arg(tmp_path: Path):
    blocks = f"{INPUTS / 'blocks.py'}:Noisy"
    result = run_trace(blocks, "--input", "x=2,1,8,8", "--arg", "sigma=0.1")  # no --loss: the spec ends in outputs
    assert result.exit_code == 0 and "\noutputs: " in result.output and "\nloss:" not in result.output, result.output
    spec = tmp_path / "noisy.yaml"
    result = run_trace(
        blocks,
        "--init",
        "in_nc=1,nc=[3, 6]",
        "--input",
        "x=2,1,8,8",
        "--arg",
        "sigma=0.25",
        "--loss",
        "mse",
        "--target",
        "clean",
        "--reduction",
        "sum",
        "-o",
        str(spec),
    )
    assert result.exit_code == 0, result.output
    text = spec.read_text()
    assert "head_weight: {shape: [3, 1, 3, 3], source: head.weight}" in text and "other: 0.25" in text
    assert "clean: {shape: [2, 1, 8, 8]}" in text and "reduction: sum" in text
    assert build_text(text, "noisy.yaml")


def test_a_pad_to_the_size_of_a_tensor_the_code_read_is_read_at_run_time_not_frozen():
    model = load_target(f"{INPUTS / 'blocks.py'}:Padded")
    for size in (9, 8):  # at 9x9 max-pool floors: the pad is 1 here and 0 at 18x18; even sizes never pad
        text = trace(model, {"x": (2, 1, size, size)}, loss=LossChoice("mse_loss"))
        assert "pad: {like: x}" in text and "op: cat" in text, text
    module = generated(text)
    x = torch.randn(3, 1, 11, 7, dtype=torch.float64, requires_grad=True)  # odd: a pad of 1 on each side
    target = torch.randn(3, 2, 11, 7, dtype=torch.float64)
    (expected,) = torch.autograd.grad(F.mse_loss(model(x), target), x)
    assert relative_error(module.gradients(x=x, target=target).x, expected) <= 1e-12


def test_an_interpolation_size_computed_from_the_input_is_an_expression_of_its_sizes():
    """``size=(2 * x.shape[2], 2 * x.shape[3])`` (refused before issue 40's PAN change) is written as x's sizes
    and matches autograd at another size."""
    model = load_target(f"{INPUTS / 'sizes.py'}:Doubled")
    text = trace(model, {"x": (2, 1, 11, 11)}, loss=LossChoice("mse_loss"))
    assert "size: [{like: x, size: '2 * shape[2]'}, {like: x, size: '2 * shape[3]'}]" in text, text
    module = generated(text)
    x = torch.randn(3, 1, 9, 6, dtype=torch.float64, requires_grad=True)
    target = torch.randn(3, 1, 18, 12, dtype=torch.float64)
    (expected,) = torch.autograd.grad(F.mse_loss(model(x), target), x)
    assert relative_error(module.gradients(x=x, target=target).x, expected) <= 1e-12


@pytest.mark.parametrize(
    "model, marker, argument",
    [
        # 11 -> 3 -> 9 pads [0, 2], not U-Net's [1, 1]; at 22 -> 7 -> 21 the pad [0, 1] is U-Net's: no one spec
        ("PaddedAfter", "PADDED AFTER", "'pad' argument pad=[0, 2, 0, 2] becomes {like: x}")
    ],
)
def test_sizes_computed_from_the_input_that_no_tensor_has_are_refused_not_frozen(model, marker, argument):
    path = INPUTS / "sizes.py"
    with pytest.raises(TraceError) as error:
        trace(load_target(f"{path}:{model}"), {"x": (2, 1, 11, 11)}, loss=LossChoice("mse_loss"))
    message = str(error.value)
    assert message.startswith(f"{marked_line(path, marker)}: error: {argument}"), message
    assert "computed from the input's size" in message and "size=skip.shape[-2:]" in message


def test_dropout_is_a_random_mask_in_training_and_the_identity_in_eval(tmp_path: Path):
    blocks = f"{INPUTS / 'blocks.py'}:Dropping"
    spec = tmp_path / "dropping.yaml"
    result = run_trace(blocks, "--input", "x=2,1,6,6", "--loss", "l1", "--train", "-o", str(spec))
    assert result.exit_code == 0, result.output
    assert "{op: dropout, in: conv, out: drop}" in spec.read_text()  # p: 0.5, the default
    generate = CliRunner().invoke(main, ["generate", str(spec), "-o", str(tmp_path / "out"), "--verify"])
    assert generate.exit_code == 0, generate.output
    result = run_trace(blocks, "--input", "x=2,1,6,6", "--loss", "l1", "--eval")
    assert result.exit_code == 0 and "dropout" not in result.output and "op: conv2d" in result.output


def test_classifier_with_cross_entropy_gets_int64_labels():
    result = run_trace(
        f"{ROOT / 'tests' / 'models' / 'classic.py'}:LeNet5",
        "--input",
        "x=2,3,32,32",
        "--loss",
        "cross_entropy",
        "--target",
        "labels",
    )
    assert result.exit_code == 0, result.output
    assert "labels: {shape: [2], dtype: int64}" in result.output and "op: flatten" in result.output


def test_an_argument_a_rule_refuses_is_reported_at_the_models_line():
    def diagonal(x, y, target):
        return 0.5 * (torch.einsum("bii,bij->bj", x, y) - target).pow(2).sum()  # DIAGONAL

    with pytest.raises(TraceError) as error:
        trace(diagonal, {"x": (2, 3, 3), "y": (2, 3, 4), "target": (2, 4)})
    assert str(error.value).startswith(f"{marked_line(Path(__file__), 'DIAGONAL')}: error: 'einsum' takes a diagonal")
    assert "a diagonal" in str(error.value) and "\n" not in str(error.value)

    def pooled(x, target):
        return 0.5 * (F.max_pool2d(x, 2, return_indices=True)[0] - target).pow(2).sum()  # INDICES

    with pytest.raises(TraceError) as error:
        trace(pooled, {"x": (1, 1, 4, 4), "target": (1, 1, 2, 2)})
    assert str(error.value).startswith(
        f"{marked_line(Path(__file__), 'INDICES')}: error: 'max_pool2d_with_indices' returns indices"
    )


def test_torch_batch_norm_binds_by_its_own_argument_order():
    def normalised(x, gamma, beta, mean, var, y):
        out = torch.batch_norm(x, gamma, beta, mean, var, False, 0.1, 1e-5, False)
        return 0.5 * (out - y).pow(2).sum()

    text = trace(normalised, {"x": (4, 3), "gamma": (3,), "beta": (3,), "mean": (3,), "var": (3,), "y": (4, 3)})
    assert "running_mean: mean, running_var: var, weight: gamma, bias: beta" in text, text


def test_tracing_leaves_the_models_running_statistics_and_mode_as_they_were():
    model = load_target(f"{ROOT / 'tests' / 'models' / 'classic.py'}:ResNet18")
    before = {key: value.clone() for key, value in model.state_dict().items()}
    trace(model, {"x": (2, 3, 16, 16)}, loss=LossChoice("cross_entropy"), mode="train")
    trace(model, {"x": (2, 3, 16, 16)}, loss=LossChoice("cross_entropy"), mode="eval")
    assert model.training and all(module.training for module in model.modules())
    after = model.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before)
