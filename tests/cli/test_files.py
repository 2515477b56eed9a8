"""The command line never surprises: file modes, `check` verdicts, name clashes, hostile sizes, fast help.

Each test here failed before the change that made it pass (issue 14)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from click.testing import CliRunner

from symgrad.cli import main
from tests.helpers import run_symgrad

ROOT = Path(__file__).resolve().parents[2]
SEED1 = ROOT / "examples" / "seed1_strided_conv.yaml"


def _run(*arguments: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The command in a process of its own, forked from this one (``tests.helpers.run_symgrad``)."""
    return run_symgrad(*arguments, cwd=cwd)


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_generated_files_get_the_mode_a_plain_write_gives(tmp_path: Path, umask: int):
    previous = os.umask(umask)
    try:
        assert CliRunner().invoke(main, ["generate", str(SEED1), "-o", str(tmp_path)]).exit_code == 0
    finally:
        os.umask(previous)
    modes = {path.name: path.stat().st_mode & 0o777 for path in tmp_path.iterdir()}
    assert set(modes.values()) == {0o666 & ~umask}, modes


def test_check_without_a_generated_folder_is_one_line_and_exit_2(tmp_path: Path):
    result = _run("check", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert (
        result.stderr.count("\n") == 1
        and "generated does not exist" in result.stderr
        and "Traceback" not in result.stderr
    )


@pytest.mark.parametrize("what", ["spec", "empty folder"])
def test_check_that_checks_nothing_fails(tmp_path: Path, what: str):
    target = SEED1 if what == "spec" else tmp_path
    result = CliRunner().invoke(main, ["check", str(target)])
    assert result.exit_code == 2 and "nothing was checked" in result.output, result.output


def test_check_finds_the_spec_from_another_working_directory(tmp_path: Path):
    out = tmp_path / "gen"
    assert _run("generate", "examples/seed1_strided_conv.yaml", "-o", str(out)).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = _run("check", str(out), cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert "5 generated files are up to date" in result.stdout  # module, test file, 2 documents, _symgrad_testdata.py


def test_check_says_a_hand_edit_is_a_hand_edit(tmp_path: Path):
    assert CliRunner().invoke(main, ["generate", str(SEED1), "-o", str(tmp_path)]).exit_code == 0
    module = tmp_path / "seed1_strided_conv.py"
    module.write_text(module.read_text() + "\n# my tweak\n")
    result = CliRunner().invoke(main, ["check", str(tmp_path)])
    assert result.exit_code == 1
    assert "edited by hand" in result.output and "--force" in result.output, result.output


def _renamed_copy(directory: Path, name: str) -> Path:
    copy = directory / f"{name}.yaml"
    copy.write_text(SEED1.read_text())
    return copy


def test_two_specs_with_one_name_in_one_call_are_refused(tmp_path: Path):
    first, second = _renamed_copy(tmp_path, "first"), _renamed_copy(tmp_path, "second")
    result = CliRunner().invoke(main, ["generate", str(first), str(second), "-o", str(tmp_path / "gen")])
    assert result.exit_code == 2 and "first.yaml" in result.output and "second.yaml" in result.output, result.output
    assert not (tmp_path / "gen").exists()  # nothing half-written


def test_two_specs_with_one_name_across_calls_are_refused(tmp_path: Path):
    first, second = _renamed_copy(tmp_path, "first"), _renamed_copy(tmp_path, "second")
    out = tmp_path / "gen"
    assert CliRunner().invoke(main, ["generate", str(first), "-o", str(out)]).exit_code == 0
    before = (out / "seed1_strided_conv.py").read_bytes()
    result = CliRunner().invoke(main, ["generate", str(second), "-o", str(out)])
    assert result.exit_code == 2 and "first.yaml" in result.output and "second.yaml" in result.output, result.output
    assert (out / "seed1_strided_conv.py").read_bytes() == before
    assert CliRunner().invoke(main, ["generate", str(first), "-o", str(out)]).exit_code == 0  # its own spec again: fine


def test_help_imports_neither_torch_nor_sympy_and_is_fast():
    code = (
        "import sys, time; t = time.perf_counter(); from symgrad.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'sympy', 'numpy') if m in sys.modules), time.perf_counter() - t)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    loaded, seconds = result.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert loaded == "[]" and float(seconds) < 1.0, result.stdout
    assert "NumPy" not in result.stderr


def test_numpy_is_a_declared_dependency():
    """torch warns 'Failed to initialize NumPy' on every command when numpy is missing: declare it."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(dependency.startswith("numpy") for dependency in dependencies)


def test_python_dash_m_symgrad_works_from_the_repo_root():
    result = subprocess.run([sys.executable, "-m", "symgrad", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0 and "Usage: symgrad" in result.stdout, result.stderr


def test_license_file_and_spdx_expression():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_spec_help_prints_the_format_and_hints_point_at_it(tmp_path: Path):
    result = CliRunner().invoke(main, ["spec-help"])
    assert result.exit_code == 0 and result.output.startswith("# The spec format")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    error = CliRunner().invoke(main, ["generate", str(empty), "-o", str(tmp_path)])
    assert "symgrad spec-help" in error.output and "docs/" not in error.output
    from symgrad.cli import STARTER_SPEC

    assert "symgrad spec-help" in STARTER_SPEC and "docs/" not in STARTER_SPEC


def test_deeply_nested_yaml_is_one_line_exit_2(tmp_path: Path):
    spec = tmp_path / "deep.yaml"
    spec.write_text("name: a\ninputs: " + "[" * 5000 + "]" * 5000 + "\n")
    result = _run("generate", str(spec), "-o", str(tmp_path / "gen"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert (
        result.stderr.strip()
        == f"{spec}:2:41: error: spec is nested deeper than 32 levels (fix: flatten the structure; specs need at most 4 levels)"
    )


def test_a_shape_too_large_to_check_is_one_line_exit_2(tmp_path: Path):
    spec = tmp_path / "huge.yaml"
    spec.write_text(
        "name: huge\ninputs:\n  x: {shape: [100000, 100000]}\n  w: {shape: [100000, 100000]}\n"
        "  y: {shape: [100000, 100000]}\nlayers:\n  - {op: linear, weight: w, out: p}\n"
        "loss: {op: half_sq_error, in: p, target: y}\nwrt: [x, w]\n"
    )
    result = _run("verify", str(spec))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "GiB" in result.stderr and "--float32-shapes small" in result.stderr
    unshrinkable = tmp_path / "unshrinkable.yaml"  # a fixed-size reshape keeps the spec's own shapes for float64
    unshrinkable.write_text(
        "name: unshrinkable\ninputs:\n  x: {shape: [60000, 60000]}\n  y: {shape: [60000, 60000]}\n"
        "layers:\n  - {op: reshape, shape: [60000, 60000], out: p}\n"
        "loss: {op: half_sq_error, in: p, target: y}\nwrt: [x]\n"
    )
    generated = _run("generate", str(unshrinkable), "-o", str(tmp_path / "gen"), "--verify")
    assert generated.returncode == 2 and "Traceback" not in generated.stderr, generated.stderr
    assert "float64 test shapes" in generated.stderr and generated.stderr.count("\n") == 1


def test_generated_repr_is_short():
    import symgrad

    generated = symgrad.generate(SEED1)
    assert len(repr(generated)) < 300 and "seed1_strided_conv" in repr(generated)


def test_certify_a_spec_proves_its_linear_layers_with_a_summary():
    result = CliRunner().invoke(main, ["certify", str(ROOT / "examples" / "upsampling_decoder.yaml")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # the 2 reflect pads (alike: one proof), 2 convs, 1 bilinear upsampling
    assert sum(line.startswith("certified  ") for line in lines) == 4
    assert sum("(and 1 more layer alike)" in line for line in lines) == 1, result.output
    assert lines[-1].startswith("4 certified, 0 failed, 0 too large")


def test_certify_a_spec_catches_a_wrong_adjoint(monkeypatch):
    import dataclasses

    from symgrad.algebra import PRIMITIVES

    original = PRIMITIVES["flip"]
    monkeypatch.setitem(
        PRIMITIVES,
        "flip",
        dataclasses.replace(
            original, code=lambda operands, params, show: f"(-{original.code(operands, params, show)})"
        ),
    )
    result = CliRunner().invoke(main, ["certify", str(ROOT / "examples" / "upsampling_decoder.yaml")])
    assert result.exit_code == 1 and "FAILED" in result.output and " 0 failed" not in result.output.splitlines()[-1]
