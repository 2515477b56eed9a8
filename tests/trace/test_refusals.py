"""What ``symgrad trace`` refuses, and where it says so: Python decisions and numbers taken from tensor
values (never frozen into a spec), sizes below 1 or beyond memory, a forward that returns a number, a trace
past ``--timeout``; and what it accepts that it used to refuse: DenseNet's list given to ``torch.cat`` and
appended to afterwards, a one-tensor ``torch.cat``. Accepted models are generated and checked against
autograd through the original module in float64 at another batch and spatial size."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from symgrad.trace import LossChoice, TraceError, load_target, trace
from tests.models.compare import Case, matches_autograd

ROOT = Path(__file__).resolve().parents[2]
FAULTS = ROOT / "tests" / "trace" / "inputs" / "faults.py"
SYMGRAD = Path(sys.executable).with_name("symgrad")


def marked(marker: str) -> str:
    """``file:line`` of the line of faults.py holding ``# MARKER``."""
    numbers = [n for n, text in enumerate(FAULTS.read_text().splitlines(), 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(numbers) == 1, marker
    return f"{FAULTS}:{numbers[0]}"


def refused(name: str, shape=(2, 1, 6, 6), mode: str = "train", **options) -> list[str]:
    """The error lines of tracing faults.py's ``name`` with --loss mse."""
    with pytest.raises(TraceError) as error:
        trace(load_target(f"{FAULTS}:{name}"), {"x": shape}, loss=LossChoice("mse_loss"), mode=mode, **options)
    return str(error.value).splitlines()


def cli(*arguments: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(SYMGRAD), "trace", *arguments], capture_output=True, text=True, timeout=timeout)


BRANCH = "decides with the value of a tensor"
NUMBER = "takes a number out of a tensor"


@pytest.mark.parametrize(
    "name, marker, what",
    [
        ("SignBranch", "SUM_BRANCH", f"'bool(tensor)' {BRANCH}"),
        ("ItemFactor", "ITEM_FACTOR", f"'.item()' {NUMBER}"),
        ("DropPath", "COIN", f"'.item()' {NUMBER}"),  # random, not an input: still not a constant
        ("PolluteConstant", "POLLUTED", f"'.item()' {NUMBER}"),  # a literal tensor given an input's value
        ("MaskSize", "MASK_SIZE", f"'size of x[mask], nonzero(), masked_select() or unique()' {NUMBER}"),
    ],
)
def test_a_value_taken_from_a_tensor_is_refused_at_its_line(name, marker, what):
    lines = refused(name)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{marked(marker)}: error: {what}"), lines[0]
    assert "(fix: " in lines[0]


def test_a_value_read_is_refused_where_torch_is_imported_through_a_symlink(tmp_path):
    """torch imported from a path with a symlink in it (an environment reached through a linked directory):
    its dispatch frames' ``co_filename`` is then not the real path the tracer knew torch by, and
    ``len(h[h > 0])`` was traced as plain ops (MaskSize's branch held at the random inputs' outcome)."""
    site = Path(torch.__file__).resolve().parents[1]
    (tmp_path / "site").symlink_to(site, target_is_directory=True)
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path / 'site')!r}); sys.path.insert(0, {str(ROOT)!r})\n"
        "import torch\n"
        f"assert torch.__file__.startswith({str(tmp_path)!r}), torch.__file__\n"
        "from symgrad.trace import LossChoice, TraceError, load_target, trace\n"
        "try:\n"
        f"    trace(load_target({str(FAULTS) + ':MaskSize'!r}), {{'x': (2, 1, 6, 6)}}, loss=LossChoice('mse_loss'))\n"
        "except TraceError as error:\n"
        "    print(str(error))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith(f"{marked('MASK_SIZE')}: error: 'size of x[mask]"), run.stdout


def test_every_value_read_is_listed_once_even_a_logged_one_the_loss_does_not_read():
    lines = refused("Checks")
    expected = [
        ("ISNAN", "bool(tensor)"),
        ("INT", "int(tensor)"),
        ("FLOAT", "float(tensor)"),
        ("TOLIST", ".tolist()"),
        ("WHILE", "bool(tensor)"),
        ("EQUAL", "torch.equal"),
        ("LOGGED", ".item()"),
    ]
    assert [line.split(": error: ")[0] for line in lines] == [marked(marker) for marker, _ in expected], lines
    for line, (_, shown) in zip(lines, expected):
        assert f": error: '{shown}' " in line and "(fix: " in line, line


def test_a_value_read_that_happens_only_at_the_second_runs_size_is_refused():
    lines = refused("BranchWhenLarge")  # traced at 6x6: the read happens at 12x12 only
    assert len(lines) == 1 and lines[0].startswith(f"{marked('LARGE_ONLY')}: error: 'bool(tensor)' {BRANCH}"), lines


def test_one_line_per_source_line_with_the_modules_that_share_it():
    lines = refused("GatedStack")
    assert (
        lines
        == [
            line
            for line in lines
            if line.startswith(f"{marked('GATE')}: error: 'bool(tensor)' (in 6 modules: body.0, body.1, body.2, ...) ")
        ]
        and len(lines) == 1
    ), lines
    lines = refused("UnsupportedStack")  # four in layer1 and the head: five instances of each line
    assert len(lines) == 2, lines
    assert lines[0].startswith(
        f"{marked('REPEATED_CUMSUM')}: error: 'cumsum' (in 5 modules: layer1.0, layer1.1, layer1.2, ...) is not an op"
    ), lines[0]
    assert lines[1].startswith(f"{marked('REPEATED_FLIP')}: error: 'flip' (in 5 modules: "), lines[1]


def test_an_argument_the_spec_check_refuses_names_its_line_once_with_the_modules_running_it():
    lines = refused("MixStack", shape=(2, 1, 4, 4))
    assert len(lines) == 1 and lines[0].startswith(
        f"{marked('DIAGONAL_EINSUM')}: error: 'einsum' (in 3 modules: body.0, body.1, body.2) takes a diagonal"
    ), lines
    assert "(fix: multiply by an identity registered as a buffer" in lines[0], lines


def test_values_from_literals_and_sizes_are_accepted():
    text = trace(load_target(f"{FAULTS}:ConstantsAndSizes"), {"x": (2, 2, 6, 6)}, loss=LossChoice("mse_loss"))
    assert "op: conv2d" in text and "op: relu" in text and "other: 4.5" in text, text


def test_a_forward_returning_a_number_is_reported_at_its_return_line():
    assert refused("FloatLoss") == [
        f"{marked('RETURNS_FLOAT')}: error: the traced code returns float, not a tensor "
        "(fix: return the loss, or the prediction and pass --loss)"
    ]


def test_a_tensor_no_traced_call_made_is_named_at_the_line_that_reads_it():
    lines = refused("AttributeTensor")  # read through .contiguous(): the reason used to be dropped, the error empty
    assert len(lines) == 1 and lines[0].startswith(
        f"{marked('ATTRIBUTE')}: error: 'contiguous' reads a tensor that is neither an argument"
    ), lines
    lines = refused("ReturnsAttribute")
    assert lines == [
        f"{marked('RETURNS_ATTRIBUTE')}: error: the traced code returns a tensor that no traced call made "
        "and that is no input (fix: return the prediction computed from the inputs)"
    ]


def test_the_timeout_stops_the_trace_and_puts_the_previous_alarm_handler_back():
    def previous(number, frame):
        raise AssertionError("the previous handler ran")

    old = signal.signal(signal.SIGALRM, previous)
    try:
        lines = refused("Slow", shape=(1, 1, 4, 4), timeout=0.3)
        assert signal.getsignal(signal.SIGALRM) is previous
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert len(lines) == 1 and lines[0].startswith(f"{marked('SLOW')}: error: tracing ran past --timeout 0.3 s (fix: ")


def test_a_timeout_that_is_no_number_of_seconds_is_refused_and_an_endless_one_is_none():
    assert refused("SignBranch", timeout=float("nan")) == [
        "error: the timeout is nan s (fix: give a positive number of seconds)"
    ]
    text = trace(
        load_target(f"{FAULTS}:ConstantsAndSizes"),
        {"x": (2, 2, 6, 6)},
        loss=LossChoice("mse_loss"),
        timeout=float("inf"),
    )
    assert "op: conv2d" in text and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.parametrize(
    "arguments, start",
    [
        (["SignBranch", "x=2,1,6,6"], f"{marked('SUM_BRANCH')}: error: 'bool(tensor)' {BRANCH}"),
        (
            ["GatedStack", "x=2,1,6,6"],
            f"{marked('GATE')}: error: 'bool(tensor)' (in 6 modules: body.0, body.1, body.2, ...)",
        ),
        (["FloatLoss", "x=2,1,6,6"], f"{marked('RETURNS_FLOAT')}: error: the traced code returns float"),
        (["SignBranch", "x=-2,1,6,6"], "error: --input x=-2,1,6,6 has a size below 1 (fix: "),
        (["SignBranch", "x=2,0,6,6"], "error: --input x=2,0,6,6 has a size below 1 (fix: "),
        (["SignBranch", "x=100000,100000,100,100"], "error: the inputs x=[100000, 100000, 100, 100] alone need about "),
        (["Slow", "x=1,1,4,4", "--timeout", "1"], f"{marked('SLOW')}: error: tracing ran past --timeout 1 s (fix: "),
    ],
)
def test_the_command_refuses_with_one_line_and_exit_2(arguments, start):
    name, shape, *rest = arguments
    result = cli(f"{FAULTS}:{name}", "--input", shape, "--loss", "mse", *rest)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), result.stderr


def test_the_command_traces_densenet_whose_list_grows_after_each_cat(tmp_path: Path):
    spec = tmp_path / "densenet.yaml"
    result = cli(
        f"{FAULTS}:DenseNet",
        "--input",
        "x=2,3,8,8",
        "--loss",
        "cross_entropy",
        "--timeout",
        "60",
        "--flat",
        "-o",
        str(spec),
    )  # every layer inline: the cats as the list grew
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    text = spec.read_text()
    assert text.count("op: cat") == 5, text  # 2 + 1 dense layers reading two tensors or more, and each block's end
    assert "{op: batch_norm, in: features_relu0, " in text, text  # the first dense layer's cat of one tensor
    first = next(line for line in text.splitlines() if "op: cat" in line)  # as called, not as the list grew after
    assert "in: [features_relu0, features_denseblock1_denselayer1_conv2], " in first, first


ACCEPTED = {
    "densenet": Case(
        lambda **init: load_target(f"{FAULTS}:DenseNet", init),
        {"x": (2, 3, 8, 8)},
        {"x": (3, 3, 12, 12)},
        ("cross_entropy", "half_sq_error_function"),
    ),
    "one_tensor_cat": Case(
        lambda **init: load_target(f"{FAULTS}:OptionalSkips", init),
        {"x": (2, 2, 6, 6)},
        {"x": (3, 2, 5, 9)},
        ("mse_loss", "half_sq_error_function"),
    ),
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("label", list(ACCEPTED))
def test_accepted_models_match_autograd_on_the_original_module(label, mode):
    matches_autograd(label, ACCEPTED[label], mode)


def test_one_tensor_cat_is_the_tensor_itself():
    def loss(x, y):
        return torch.nn.functional.mse_loss(torch.cat([x], 1) * 2, y)

    text = trace(loss, {"x": (2, 3, 4, 4), "y": (2, 3, 4, 4)})
    assert "op: cat" not in text and "{op: mul, in: x, other: 2, out: mul}" in text, text
