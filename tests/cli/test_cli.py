"""The command line and the Python API that mirrors it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import symgrad
from symgrad.cli import STARTER_SPEC, main

ROOT = Path(__file__).resolve().parents[2]
SEED1 = ROOT / "examples" / "seed1_strided_conv.yaml"


@pytest.mark.parametrize("command", ["generate", "check", "verify", "docs", "ops", "init", "trace"])
def test_every_command_has_help(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output


def test_docs_writes_only_the_documents(tmp_path: Path):
    result = CliRunner().invoke(main, ["docs", str(SEED1), "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed1_strided_conv.html", "seed1_strided_conv.md"]
    html = (tmp_path / "seed1_strided_conv.html").read_text()
    assert (
        "<math" in html
        and "<svg" in html
        and "<script" not in html
        and "http://" not in html.replace("http://www.w3.org", "")
    )  # offline: no scripts, no remote resources


def test_verify_prints_a_table_and_exits_zero():
    result = CliRunner().invoke(
        main, ["verify", str(ROOT / "examples" / "seed2_conv_strided.yaml"), "--float32-shapes", "small"]
    )
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert "gradcheck of" in result.stderr and "float64 against autograd" in result.stderr  # progress, on stderr
    assert header.split()[:2] == ["gradient", "float64"]
    table = {row.split()[0]: row.split() for row in rows[:2]}
    assert set(table) == {"x", "w1"}
    for cells in table.values():
        assert float(cells[1]) <= 1e-12 and cells[4:6] == ["pass", "pass"]


def test_verify_exits_one_when_a_gradient_is_wrong(monkeypatch):
    """A deliberately broken rule (the ReLU mask inverted) must be caught, with exit code 1, gradcheck's
    mismatch included, in seconds: its full-Jacobian message (100 s here) is not computed, and torch's
    private step is put back after."""
    import importlib

    import sympy

    from symgrad.rules import LAYER_RULES

    gradcheck = importlib.import_module("torch.autograd.gradcheck")
    slow_mode = getattr(gradcheck, "_run_slow_mode_and_get_error", None)

    relu = LAYER_RULES["relu"]
    monkeypatch.setattr(relu, "from_output", lambda out: sympy.Heaviside(-out, 0))
    monkeypatch.setattr(relu, "fused_pullback", lambda grad, node: sympy.Heaviside(-node.out, 0) * grad)
    result = CliRunner().invoke(
        main, ["verify", str(ROOT / "examples" / "seed3_conv_relu_conv.yaml"), "--float32-shapes", "small"]
    )
    assert result.exit_code == 1, result.output
    assert "FAILED: gradcheck: FAIL (Jacobian mismatch" in result.output, result.output
    assert getattr(gradcheck, "_run_slow_mode_and_get_error", None) is slow_mode


def test_init_writes_a_spec_that_generates_and_verifies(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(main, ["init"]).exit_code == 0
    assert Path("spec.yaml").read_text() == STARTER_SPEC
    result = CliRunner().invoke(main, ["generate", "spec.yaml", "-o", "out", "--verify"])
    assert result.exit_code == 0, result.output
    again = CliRunner().invoke(main, ["init"])
    assert again.exit_code == 2 and "already exists" in again.output


def test_python_api_mirrors_the_cli(tmp_path: Path):
    generated = symgrad.generate(SEED1)
    assert generated.name == "seed1_strided_conv"
    assert "def gradients(x, k, y, grad_loss=None):" in generated.code
    assert generated.latex.startswith("\\begin{aligned}") and "\\overline{x}" in generated.latex
    assert generated._repr_latex_().startswith("$$") and generated._repr_markdown_().startswith("# Derivation")
    assert sorted(generated.files) == sorted(p.name for p in generated.write(tmp_path))
    from_text = symgrad.generate(text=SEED1.read_text(), label="seed1.yaml")
    body = "from typing import NamedTuple"
    assert "from seed1.yaml" in from_text.code
    assert from_text.code.split(body)[1] == generated.code.split(body)[1]  # same code whatever the source
    with pytest.raises(symgrad.SpecError):
        symgrad.generate(text="name: 1")


def test_pre_commit_hook_runs_symgrad_check():
    import yaml

    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hooks[0]["entry"] == "symgrad check" and hooks[0]["pass_filenames"] is False


def test_ops_table_in_docs_is_generated_from_the_registry():
    from symgrad.rules import all_rules

    result = CliRunner().invoke(main, ["ops", "--markdown"])
    assert result.exit_code == 0
    assert (ROOT / "docs" / "ops.md").read_text() == result.output, "run `symgrad ops --markdown > docs/ops.md`"
    assert len(all_rules()) >= 40 and result.output.count("\n| `") == len(all_rules())
