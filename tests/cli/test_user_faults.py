"""Faults a hostile user or a bad day makes (issue 26): never a silent wrong answer, never a traceback.

Every case runs the real command line in a process of its own (forked from the test's, so torch is
not imported again: ``tests.helpers.run_symgrad``) and asserts what matters: the exit code, one
error line that names the file (with its line where there is one) or the path and a fix, no Python
traceback, no file written or temporary file left behind, the old files byte for byte as they were,
and never a wrong "ok"."""

from __future__ import annotations

import errno
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.helpers import run_generated_tests, run_symgrad

ROOT = Path(__file__).resolve().parents[2]
SEED1 = ROOT / "examples" / "seed1_strided_conv.yaml"
SEED3 = ROOT / "examples" / "seed3_conv_relu_conv.yaml"


def run(
    *arguments: str, cwd: Path = ROOT, user: str | None = None, preexec_fn=None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """The command under test in a process of its own (``tests.helpers.run_symgrad``: forked from this one)."""

    def prepare():
        if preexec_fn is not None:
            preexec_fn()
        if user == "nobody":  # root writes anywhere: run the command as an unprivileged user to meet permissions
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)

    return run_symgrad(
        *arguments,
        cwd=cwd,
        environment={"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"},
        preexec_fn=prepare,
        timeout=timeout,
    )


def prepared(*arguments: str) -> None:
    """A command that sets the scene (generated files to then break or guard), run in this process with
    click's runner: it must succeed; the command under test runs in its own process (:func:`run`)."""
    from click.testing import CliRunner

    from symgrad.cli import main

    result = CliRunner().invoke(main, list(arguments))
    assert result.exit_code == 0, (result.output, result.exception)


def one_error_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    """The single error line of a refused command (exit ``code``, no traceback), returned for more checks."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "error:" in lines[0] and "(fix: " in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden temporary files included) and its bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def changed_spec(folder: Path) -> Path:
    """Seed 1 with another comment: the same module name, other files (the spec hash differs)."""
    spec = folder / "seed1_strided_conv.yaml"
    spec.write_text(SEED1.read_text() + "# changed\n")
    return spec


# --------------------------------------------------------------------------------------------
# item 2: `check` after a generated module was deleted
# --------------------------------------------------------------------------------------------


def test_check_names_the_missing_module_whose_test_file_remains(tmp_path: Path):
    out = tmp_path / "gen"
    prepared("generate", str(SEED1), str(SEED3), "-o", str(out))
    assert run("check", str(out)).returncode == 0  # the good state says ok
    (out / "seed1_strided_conv.py").unlink()  # seed 3's module still sits in the folder
    result = run("check", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "up to date" not in result.stdout
    assert "test_seed1_strided_conv.py: imports seed1_strided_conv.py, which is missing" in result.stderr, result.stderr
    assert "symgrad generate" in result.stderr and "Traceback" not in result.stderr


def test_check_names_the_missing_module_when_no_module_is_left(tmp_path: Path):
    out = tmp_path / "gen"
    prepared("generate", str(SEED1), "-o", str(out))
    (out / "seed1_strided_conv.py").unlink()
    result = run("check", str(out))
    assert result.returncode == 1 and "seed1_strided_conv.py, which is missing" in result.stderr, result.stderr


def test_check_says_a_module_whose_header_was_removed_was_edited(tmp_path: Path):
    out = tmp_path / "gen"
    prepared("generate", str(SEED1), str(SEED3), "-o", str(out))
    module = out / "seed1_strided_conv.py"
    module.write_text(module.read_text().split("\n", 1)[1])  # the symgrad header line cut off by hand
    result = run("check", str(out))
    assert result.returncode == 1 and f"{module}: edited by hand" in result.stderr, result.stderr


def test_check_names_a_folder_where_a_generated_file_should_be(tmp_path: Path):
    out = tmp_path / "gen"
    prepared("generate", str(SEED1), "-o", str(out))
    (out / "seed1_strided_conv.md").unlink()
    (out / "seed1_strided_conv.md").mkdir()
    result = run("check", str(out))
    assert result.returncode == 1 and "seed1_strided_conv.md" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------------------------
# items 4-6: the file system refuses the write
# --------------------------------------------------------------------------------------------


@pytest.fixture
def shared_folder():
    """A folder an unprivileged user can reach (pytest's tmp_path is private to root), removed after."""
    folder = Path(tempfile.mkdtemp(prefix="symgrad-faults-"))
    folder.chmod(0o755)
    spec = folder / "seed1_strided_conv.yaml"
    spec.write_text(SEED1.read_text())
    spec.chmod(0o644)
    yield folder
    for path in folder.rglob("*"):
        if path.is_dir():
            path.chmod(0o755)
    shutil.rmtree(folder)


def _as_unprivileged(*arguments: str) -> subprocess.CompletedProcess:
    if os.geteuid() != 0:
        return run(*arguments)
    return run(*arguments, user="nobody")


@pytest.mark.parametrize("where", ["read-only folder", "new subfolder of a read-only folder"])
def test_a_read_only_folder_is_one_line_and_keeps_the_old_files(shared_folder: Path, where: str):
    out = shared_folder / "gen"
    spec = shared_folder / "seed1_strided_conv.yaml"
    prepared("generate", str(spec), "-o", str(out))
    spec.write_text(spec.read_text() + "# changed\n")
    out.chmod(0o555)
    before = snapshot(shared_folder)
    target = out if where == "read-only folder" else out / "sub" / "deeper"
    line = one_error_line(_as_unprivileged("generate", str(spec), "-o", str(target), "--force"))
    assert "Permission denied" in line and "writable" in line and "-o" in line, line
    assert line.startswith(str(out)), line  # names the path
    assert snapshot(shared_folder) == before  # no temporary file, no folder, old files byte-identical
    assert not (out / "sub").exists()


def test_a_read_only_file_system_is_one_line(tmp_path: Path):
    """EROFS cannot be made without mounting: the writer's mkstemp fails with it, in process."""
    from click.testing import CliRunner

    from symgrad.cli import main

    out = tmp_path / "gen"
    assert CliRunner().invoke(main, ["generate", str(SEED1), "-o", str(out)]).exit_code == 0
    spec = changed_spec(tmp_path)
    before = snapshot(tmp_path)

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "mkstemp", read_only)
        result = CliRunner().invoke(main, ["generate", str(spec), "-o", str(out), "--force"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "read-only file system" in lines[0] and str(out) in lines[0], result.stderr
    assert snapshot(tmp_path) == before


def _file_size_limit(limit: int):
    def limit_writes():  # a full disk, as the writer sees one: the write fails (SIGXFSZ would kill instead)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_writes


@pytest.mark.parametrize("limit", [0, 5000])
def test_a_full_disk_is_one_line_and_leaves_no_temporary_file(tmp_path: Path, limit: int):
    out = tmp_path / "gen"
    prepared("generate", str(SEED1), "-o", str(out))
    spec = changed_spec(tmp_path)
    before = snapshot(tmp_path)
    result = run("generate", str(spec), "-o", str(out), "--force", preexec_fn=_file_size_limit(limit))
    line = one_error_line(result)
    assert "File too large" in line and str(out) in line and "old files were kept" in line, line
    assert snapshot(tmp_path) == before  # the half-written .NAME.XXXX.tmp is gone, the old files intact


def test_a_full_disk_in_a_new_folder_removes_the_folder(tmp_path: Path):
    result = run("generate", str(SEED1), "-o", str(tmp_path / "new" / "gen"), preexec_fn=_file_size_limit(1000))
    one_error_line(result)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["generate", "docs"])
@pytest.mark.parametrize("where", ["the output", "a parent of the output"])
def test_an_output_path_that_is_a_file_is_one_line(tmp_path: Path, command: str, where: str):
    blocker = tmp_path / "taken"
    blocker.write_text("mine\n")
    target = blocker if where == "the output" else blocker / "sub" / "gen"
    line = one_error_line(run(command, str(SEED1), "-o", str(target)))
    assert f"{blocker} is a file, not a folder" in line, line
    assert snapshot(tmp_path) == {"taken": b"mine\n"}


def test_a_folder_where_a_generated_file_goes_is_one_line(tmp_path: Path):
    out = tmp_path / "gen"
    (out / "seed1_strided_conv.py").mkdir(parents=True)
    line = one_error_line(run("generate", str(SEED1), "-o", str(out)))
    assert "seed1_strided_conv.py" in line, line
    assert snapshot(tmp_path) == {}


def test_init_into_a_parent_that_is_a_file_is_one_line(tmp_path: Path):
    blocker = tmp_path / "taken"
    blocker.write_text("mine\n")
    one_error_line(run("init", str(blocker / "spec.yaml")))
    assert snapshot(tmp_path) == {"taken": b"mine\n"}


# --------------------------------------------------------------------------------------------
# item 11: what the spec path is
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["device", "fifo", "folder given to the API"])
def test_a_spec_path_that_is_not_a_regular_file_is_refused_unread(tmp_path: Path, kind: str):
    if kind == "device":
        path = Path("/dev/zero")
        result = run("generate", str(path), "-o", str(tmp_path / "gen"))
    elif kind == "fifo":
        path = tmp_path / "pipe.yaml"
        os.mkfifo(path)  # nobody writes to it: reading it would block for ever
        result = run("generate", str(path), "-o", str(tmp_path / "gen"), timeout=60)
    else:
        from symgrad.errors import SpecError
        from symgrad.spec import read_spec

        with pytest.raises(SpecError) as error:
            read_spec(tmp_path)
        assert f"{tmp_path} is a folder, not a spec file" in str(error.value) and "\n" not in str(error.value)
        return
    line = one_error_line(result)
    assert str(path) in line and ("a device" in line if kind == "device" else "named pipe" in line), line
    assert not (tmp_path / "gen").exists()


def test_a_huge_spec_is_refused_after_reading_one_byte_past_the_limit(tmp_path: Path, monkeypatch):
    from symgrad import spec as spec_module
    from symgrad.errors import SpecError

    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (8 * spec_module.MAX_SPEC_BYTES))
    read = []
    real_read = os.read

    def counting_read(descriptor, size):
        chunk = real_read(descriptor, size)
        read.append(len(chunk))
        return chunk

    monkeypatch.setattr(spec_module.os, "read", counting_read)
    with pytest.raises(SpecError) as error:
        spec_module.read_spec(big)
    assert "larger than the 1048576 byte limit" in str(error.value) and str(big) in str(error.value)
    assert sum(read) == spec_module.MAX_SPEC_BYTES + 1


def test_dev_zero_is_refused_at_once():
    result = run("generate", "/dev/zero", "-o", "/nonexistent/x", timeout=60)
    assert "/dev/zero" in one_error_line(result)


def test_a_spec_read_in_chunks_keeps_its_newlines_as_before(tmp_path: Path):
    from symgrad.spec import read_spec

    text = SEED1.read_text()
    crlf = tmp_path / "crlf.yaml"
    crlf.write_bytes(text.replace("\n", "\r\n").encode())
    assert read_spec(crlf).text == read_spec(SEED1).text == text


# --------------------------------------------------------------------------------------------
# item 15: a folder with no spec
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["generate", "docs", "certify"])
def test_a_folder_without_specs_is_an_error_not_a_silent_success(tmp_path: Path, command: str):
    empty = tmp_path / "specs"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a spec\n")
    (empty / "folder.yaml").mkdir()  # a folder named like a spec is not one
    arguments = [command, str(empty)] + (["-o", str(tmp_path / "gen")] if command != "certify" else [])
    line = one_error_line(run(*arguments))
    assert line.startswith(f"{empty}: error: the folder holds no *.yaml or *.yml spec"), line
    assert not (tmp_path / "gen").exists()


# --------------------------------------------------------------------------------------------
# item 3: spec names that the generated code uses itself
# --------------------------------------------------------------------------------------------


def _clash_spec(name: str, where: str) -> str:
    """A conv at shapes where the generated code runs channels_last (so x_layout and w_layout exist),
    with ``name`` as an extra input (the conv's bias) or as the conv's output."""
    from tests.helpers import spec_text

    inputs = {"x": [16, 3, 32, 32], "w": [4, 3, 3, 3], "y": [16, 4, 30, 30]}
    layer = {"op": "conv2d", "weight": "w", "out": "h"}
    wrt = ["x", "w"]
    if where == "input":
        inputs[name] = [4]
        layer["bias"] = name
        wrt.append(name)
    else:
        layer["out"] = name
    return spec_text(inputs, [layer, {"op": "relu"}], {"op": "half_sq_error", "target": "y"}, wrt)


def _names_the_code_may_use() -> list[str]:
    from symgrad.names import generated_names, template_names

    prefixes, whole = generated_names()
    names, suffixes = template_names()
    return sorted(
        {
            *names,
            *whole,
            *(prefix + "h" for prefix in prefixes),
            *("x" + suffix for suffix in suffixes),
            *("w" + suffix for suffix in suffixes),
            "RuntimeError",
            "backward",
            "tensor",
            "max",
            "float",
            "contiguous",
            "memory_format",
            "channels_last",
            "h_layout",
            "shared_0",
            "local_h_weight",
        }
    )


@pytest.mark.parametrize("where", ["input", "out"])
@pytest.mark.parametrize("name", _names_the_code_may_use())
def test_a_name_the_generated_code_uses_is_refused_at_its_line_or_works(name: str, where: str):
    """Each name is either refused at the spec's line of that name, or the module it makes is right:
    never a module that crashes (x_layout beside x was an UnboundLocalError) or reads the wrong value."""
    import torch

    from symgrad.errors import SpecError
    from symgrad.roles import channels_last_inputs
    from tests.helpers import build_text, generated_module

    text = _clash_spec(name, where)
    line = next(
        number
        for number, content in enumerate(text.splitlines(), 1)
        if content.strip().startswith((f"{name}:", f"out: {name}"))
    )
    try:
        built = build_text(text)
    except SpecError as error:
        message = str(error)
        assert message.startswith(f"case.yaml:{line}:") and f"'{name}'" in message and "(fix: " in message, message
        assert "\n" not in message
        return
    assert channels_last_inputs(built.graph) == ["w"]  # the layout code is in the module that works
    module = generated_module(built)
    generator = torch.Generator().manual_seed(0)
    values = {
        node.name: torch.randn(node.shape, dtype=torch.float64, generator=generator, requires_grad=True)
        for node in built.graph.inputs
    }
    expected = torch.autograd.grad(module.forward(**values), [values[n] for n in built.graph.wrt])
    result = module.gradients(**values)
    for wrt, reference in zip(built.graph.wrt, expected):
        torch.testing.assert_close(getattr(result, wrt), reference, rtol=1e-10, atol=1e-12)


def test_the_reserved_prefixes_are_read_off_the_rules():
    """A rule's new kind of local reserves its prefix without a list to edit: every kind the rules
    pass to NodeSymbols.local today is among the computed prefixes."""
    from symgrad.names import generated_names
    from symgrad.spec import RESERVED_PREFIXES, check_identifier

    prefixes, whole = generated_names()
    assert {
        "grad_",
        "mask_",
        "local_",
        "shared_",
        "tangent_",
        "rstd_",
        "xhat_",
        "ghat_",
        "centered_",
        "indices_",
        "per_sample_grad_",
    } <= prefixes and "residual" in whole
    assert set(prefixes) <= set(RESERVED_PREFIXES)
    assert check_identifier("x_layout") is None  # only beside an input x (checked in the spec)


class _Name:
    def __init__(self, name: str, line: int):
        from symgrad.errors import Location

        self.name = self.out = name
        self.location = self.out_location = Location("clash.yaml", line, 3)


class _Spec:
    def __init__(self, inputs: list[str], outs: list[str]):
        self.inputs = [_Name(name, number) for number, name in enumerate(inputs, 1)]
        self.layers = [_Name(name, number) for number, name in enumerate(outs, len(inputs) + 1)]
        self.blocks = {}  # a spec without blocks (the check reads a block's own names too)


@pytest.mark.parametrize(
    "source, clash",
    [
        ("def gradients(x, x_layout):\n    x_layout = _memory_format(x)\n    return x_layout\n", "x_layout"),
        ("def gradients(x, h):\n    h = x * 2\n    return h\n", "h"),
        ("def forward(x):\n    h = x + 1\n    h = h.exp() * x\n    h = x\n    return h\n", "h"),
        ("class ExplicitGradient:\n    def forward(ctx, recompute, x, ctx):\n        return x\n", "ctx"),
        ("def gradients(x, helper):\n    return helper(x)\n", "helper"),
        ("def helper(x):\n    return x\n\ndef gradients(x):\n    return helper(x)\n", "helper"),
        ("def gradients(x):\n    return torch.exp(x)\n", "torch"),
    ],
)
def test_the_rendered_module_is_checked_for_clashes_the_lists_missed(source: str, clash: str):
    """The last net: whatever the template or a rule adds later, a spec name that the module uses for
    something else is refused at that name's line."""
    from symgrad.errors import SpecError
    from symgrad.names import check_module_source

    spec = _Spec(["x", *([clash] if clash != "h" else [])], ["h"] if clash == "h" else [])
    with pytest.raises(SpecError) as error:
        check_module_source(spec, source)
    names = {item.name: item.location for item in [*spec.inputs, *spec.layers]}
    assert str(error.value).startswith(f"{names[clash]}: error: '{clash}'"), str(error.value)


def test_a_module_that_only_moves_an_input_to_another_layout_passes_the_check():
    from symgrad.names import check_module_source

    source = (
        "def gradients(x, w, m, v):\n    w = w.contiguous(memory_format=torch.channels_last)\n"
        "    m, v = m.clone(), v.clone()\n    h = x * w\n    return h\n"
    )
    check_module_source(_Spec(["x", "w", "m", "v"], ["h"]), source)


def test_no_derived_statement_may_assign_a_spec_name():
    from types import SimpleNamespace

    import sympy

    from symgrad.errors import SpecError
    from symgrad.names import check_statement_targets

    spec = _Spec(["x"], ["h"])
    ok = SimpleNamespace(target=sympy.Symbol("h"), node="h", comment="")
    check_statement_targets(spec, [ok])
    for target, node in (("x", "h"), ("h", "other")):
        wrong = SimpleNamespace(target=sympy.Symbol(target), node=node, comment="local gradient of h")
        with pytest.raises(SpecError) as error:
            check_statement_targets(spec, [ok, wrong])
        assert f"'{target}'" in str(error.value) and str(error.value).startswith("clash.yaml:")


def test_generate_refuses_x_layout_beside_x_in_one_line(tmp_path: Path):
    spec = tmp_path / "clash.yaml"
    spec.write_text(_clash_spec("x_layout", "input").replace("name: rule_case", "name: clash_case"))
    line = one_error_line(run("generate", str(spec), "-o", str(tmp_path / "gen")))
    assert line.startswith(f"{spec}:") and "x_layout" in line, line
    assert not (tmp_path / "gen").exists()


# --------------------------------------------------------------------------------------------
# items 7-9: numeric arguments outside their domain, refused at their line
# --------------------------------------------------------------------------------------------

IMAGE = {"x": [2, 3, 4, 4], "y": [2, 3, 4, 4]}


def _one_layer(layer: dict, loss: dict | None = None, inputs: dict | None = None) -> str:
    """A spec with one layer (or none) and a loss, lists written inline so each argument has one line."""
    document = {
        "name": "rule_case",
        "inputs": {name: {"shape": shape} for name, shape in (inputs or IMAGE).items()},
        "layers": [layer] if layer else [],
        "loss": loss or {"op": "half_sq_error", "target": "y"},
        "wrt": ["x"],
    }
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=1 << 20)


def _argument_line(text: str, argument: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if re.search(rf"\b{argument}:", line))


BAD_NUMBERS = [
    ({"op": "leaky_relu", "negative_slope": 10**400}, None, "negative_slope", "beyond the numbers"),
    ({"op": "leaky_relu", "negative_slope": float("nan")}, None, "negative_slope", "finite"),
    ({"op": "elu", "alpha": float("inf")}, None, "alpha", "finite"),
    ({"op": "mul", "other": 10**30}, None, "other", "beyond the numbers"),
    ({"op": "softplus", "beta": 0}, None, "beta", "must not be 0"),
    ({"op": "pad", "pad": [1, 1], "value": float("-inf")}, None, "value", "finite"),
    ({"op": "pad", "pad": [1, 1], "value": 10**400}, None, "value", "beyond the numbers"),
    ({"op": "pad", "pad": [1, 2**63]}, None, "pad", "64-bit"),
    ({"op": "batch_norm", "training": True, "eps": -10.0}, None, "eps", "must be positive"),
    ({"op": "batch_norm", "training": True, "eps": 0.0}, None, "eps", "must be positive"),
    ({"op": "layer_norm", "normalized_shape": [4, 4], "eps": 0}, None, "eps", "must be positive"),
    ({"op": "group_norm", "num_groups": 3, "eps": -1.0e-5}, None, "eps", "must be positive"),
    ({"op": "group_norm", "num_groups": 3, "eps": 1.0e-320}, None, "eps", "smallest normal float"),
    (None, {"op": "smooth_l1_loss", "target": "y", "beta": -1}, "beta", "zero or positive"),
    (None, {"op": "smooth_l1_loss", "target": "y", "beta": float("nan")}, "beta", "finite"),
    (None, {"op": "huber_loss", "target": "y", "delta": 0}, "delta", "must be positive"),
    (None, {"op": "huber_loss", "target": "y", "delta": -2.5}, "delta", "must be positive"),
    ({"op": "avg_pool2d", "kernel_size": 2, "divisor_override": 2**64}, None, "divisor_override", "64-bit"),
]


@pytest.mark.parametrize(
    "layer, loss, argument, why",
    BAD_NUMBERS,
    ids=[f"{(layer or loss)['op']}-{argument}-{index}" for index, (layer, loss, argument, _) in enumerate(BAD_NUMBERS)],
)
def test_a_number_outside_its_domain_is_refused_at_its_line(layer, loss, argument: str, why: str):
    from symgrad.errors import SpecError
    from tests.helpers import build_text

    text = _one_layer(layer, loss)
    with pytest.raises(SpecError) as error:
        build_text(text)
    message = str(error.value)
    assert message.startswith(f"case.yaml:{_argument_line(text, argument)}:"), message
    assert f"'{argument}'" in message and why in message and "(fix: " in message and len(message) < 300, message


def test_generate_refuses_a_huge_slope_in_one_line(tmp_path: Path):
    spec = tmp_path / "slope.yaml"
    spec.write_text(_one_layer({"op": "leaky_relu", "negative_slope": 10**400}).replace("rule_case", "slope_case"))
    line = one_error_line(run("generate", str(spec), "-o", str(tmp_path / "gen")))
    assert line.startswith(f"{spec}:") and "negative_slope" in line and "0" * 30 + "..." in line, line
    assert len(line) < 250 + len(str(spec)), line
    assert not (tmp_path / "gen").exists()


@pytest.mark.parametrize(
    "layer, loss",
    [
        ({"op": "leaky_relu", "negative_slope": 1.5e100}, None),  # a float beyond int64 is printed as a float
        ({"op": "leaky_relu", "negative_slope": 10**18}, None),
        ({"op": "mul", "other": 3.0e30}, None),
        (None, {"op": "smooth_l1_loss", "target": "y", "beta": 0}),  # PyTorch takes 0: l1_loss
        (None, {"op": "smooth_l1_loss", "target": "y", "beta": 1.0e-300}),
        (None, {"op": "huber_loss", "target": "y", "delta": 1.0e300}),
        ({"op": "batch_norm", "training": True, "eps": 1.0e-300}, None),
    ],
)
def test_numbers_at_the_edge_of_their_domain_make_right_gradients(layer, loss):
    """Accepted means right: no OverflowError, and the float64 gradients match autograd."""
    from symgrad.check import verify
    from tests.helpers import build_text, generated_module

    built = build_text(_one_layer(layer, loss))
    report = verify(built.graph, generated_module(built), built.shapes)
    assert report.problem is None and report.worst() <= 1e-12, (report.problem, report.gradient_errors)


@pytest.mark.parametrize("loss, argument", [("smooth_l1_loss", "beta"), ("huber_loss", "delta")])
@pytest.mark.parametrize("value", [-1.0, -1.0e-300, 0.0, 1.0e-300, 0.5, 1.0e300])
def test_loss_arguments_are_refused_exactly_where_pytorch_refuses_them(loss: str, argument: str, value: float):
    import torch
    import torch.nn.functional as F

    from symgrad.errors import SpecError
    from tests.helpers import build_text

    try:
        getattr(F, loss)(torch.zeros(2), torch.ones(2), **{argument: value})
        torch_takes = True
    except RuntimeError:
        torch_takes = False
    try:
        build_text(_one_layer(None, {"op": loss, "target": "y", argument: value}))
        we_take = True
    except SpecError:
        we_take = False
    assert we_take == torch_takes, (loss, argument, value)


def test_hardtanh_with_min_above_max_is_refused_as_pytorch_does():
    from symgrad.errors import SpecError
    from tests.helpers import build_text

    with pytest.raises(SpecError) as error:
        build_text(_one_layer({"op": "hardtanh", "min_val": 1.0, "max_val": -1.0}))
    assert "min_val 1 is greater than max_val -1 (PyTorch refuses it)" in str(error.value)


# --------------------------------------------------------------------------------------------
# item 14: long names are cut in messages
# --------------------------------------------------------------------------------------------

LONG = "q" * 10_000


@pytest.mark.parametrize(
    "where",
    [
        "op",
        "loss op",
        "layer key",
        "loss key",
        "top-level key",
        "input key",
        "reference",
        "wrt",
        "dtype",
        "out",
        "spaced op",
        "spaced layer key",
    ],
)
def test_a_ten_thousand_character_name_is_cut_in_the_message(where: str):
    from symgrad.errors import SpecError
    from tests.helpers import build_text

    long = ("q " * 5_000).strip() if where.startswith("spaced") else LONG
    document = yaml.safe_load(_one_layer({"op": "relu", "out": "h"}))
    if where in ("op", "spaced op"):
        document["layers"][0]["op"] = long
    elif where == "loss op":
        document["loss"]["op"] = long
    elif where in ("layer key", "spaced layer key"):
        document["layers"][0][long] = 1
    elif where == "loss key":
        document["loss"][long] = 1
    elif where == "top-level key":
        document[long] = 1
    elif where == "input key":
        document["inputs"]["x"][long] = 1
    elif where == "reference":
        document["loss"]["in"] = long
    elif where == "wrt":
        document["wrt"] = [long]
    elif where == "dtype":
        document["inputs"]["x"]["dtype"] = long
    else:
        document["layers"][0]["out"] = long
    with pytest.raises(SpecError) as error:
        build_text(yaml.safe_dump(document, sort_keys=False, width=1 << 20))
    message = str(error.value)
    assert len(message) < 700 and 15 <= message.count("q") <= 60, message
    assert message.startswith("case.yaml:") and "\n" not in message


def test_a_long_number_is_cut_in_the_message():
    from symgrad.errors import SpecError
    from tests.helpers import build_text

    for digits in (400, 5000):  # beyond 4,300 digits Python refuses to convert the string
        text = _one_layer({"op": "avg_pool2d", "kernel_size": 7}).replace(
            "kernel_size: 7", f"kernel_size: {'9' * digits}"
        )
        with pytest.raises(SpecError) as error:
            build_text(text)
        message = str(error.value)
        assert message.startswith(f"case.yaml:{_argument_line(text, 'kernel_size')}:"), message
        assert len(message) < 300 and "9" * 30 + "..." in message and "9" * 41 not in message, message


# --------------------------------------------------------------------------------------------
# item 12: the generated test at shapes that do not fit in memory
# --------------------------------------------------------------------------------------------

HUGE = """\
name: huge_case
inputs:
  x: {shape: [1024, 16, 1024, 1024]}
  w: {shape: [16, 16, 3, 3]}
  y: {shape: [1024, 16, 1022, 1022]}
layers:
  - {op: conv2d, weight: w, out: h}
loss: {op: half_sq_error, target: y}
wrt: [x, w]
"""


def test_the_generated_test_skips_shapes_that_do_not_fit_with_verifys_reason(tmp_path: Path):
    spec = tmp_path / "huge.yaml"
    spec.write_text(HUGE)
    out = tmp_path / "gen"
    prepared("generate", str(spec), "-o", str(out))
    refused = one_error_line(run("verify", str(spec)))
    needs = re.search(r"checking huge_case at the float32 shapes needs about [0-9.]+ GiB", refused)
    assert needs, refused
    result = run_generated_tests(out / "test_huge_case.py")
    assert result.failed == 0 and result.skipped == 1 and result.passed > 0, result.report
    skipped = [line for line in result.lines if line.startswith("SKIPPED")]
    assert len(skipped) == 1 and needs.group(0) in skipped[0] and "GiB is available" in skipped[0], result.report
    assert "test_float32_at_spec_shapes" in skipped[0], skipped[0]


def test_the_generated_test_runs_the_spec_shape_check_where_it_fits(tmp_path: Path):
    out = tmp_path / "gen"
    prepared("generate", str(SEED1), "-o", str(out))
    result = run_generated_tests(out / "test_seed1_strided_conv.py", "-k", "float32")
    assert result.passed == 1 and result.failed == 0 and result.skipped == 0, result.report


def test_verify_and_the_generated_test_share_one_memory_estimate():
    from symgrad.check import require_memory
    from symgrad.documents import TESTDATA_SOURCE
    from symgrad.testdata import available_memory, memory_shortfall

    assert "def memory_shortfall(" in TESTDATA_SOURCE and "def available_memory(" in TESTDATA_SOURCE
    assert memory_shortfall("m", "here", 1, 8) is None
    too_many = available_memory() // 8  # 4 copies of these entries, 8 bytes each: four times what is free
    assert memory_shortfall("m", "here", too_many, 8).startswith("checking m at here needs about ")
    assert "memory_shortfall" in require_memory.__code__.co_names


@pytest.mark.parametrize(
    "spec", sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml")), ids=lambda path: path.stem
)
def test_the_name_check_reads_each_example_module_with_its_wrapped_statements_stood_in_whole(spec, monkeypatch):
    """``check_module_source`` stands each derived statement in as ``target = None``; a statement
    wrapped over several lines (``grad_x = _upsample_backward(`` ...) is stood in whole, so the
    stand-in parses and the check runs (it raised SyntaxError on four of the five examples, which the
    pipeline took for its own bug, skipping the check)."""
    import ast

    import symgrad.names as names
    import symgrad.pipeline as pipeline

    checked, stood_in = names.check_module_source, []

    def probe(parsed_spec, source, derived=frozenset()):
        stood_in.append(names._ASSIGNMENT.sub(names._stand_in(derived), source) if derived else source)
        return checked(parsed_spec, source, derived)

    monkeypatch.setattr(pipeline, "check_module_source", probe)
    pipeline.build_text(spec.read_text(), spec.name)
    assert len(stood_in) == 1
    ast.parse(stood_in[0])  # raises SyntaxError where a wrapped statement's tail was left behind
