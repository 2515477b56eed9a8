"""The README's quickstart and Python API excerpts run as written: its net.py, its two commands, its
train.py (which binds, trains, evaluates and saves), then its Python API block over the same model.
The excerpts are read from README.md, so an edit there that breaks them fails here; and `.ci/run` runs
the README's test command."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import torch
from click.testing import CliRunner

from symgrad.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def quickstart_commands() -> list[list[str]]:
    """The quickstart's `symgrad ...` lines, comments dropped, as argument lists."""
    commands = next(block for block in blocks("bash") if block.startswith("symgrad trace net.py:Net"))
    return [shlex.split(line.split("#")[0])[1:] for line in commands.splitlines() if line.strip()]


def test_the_readme_quickstart_and_python_api_run_as_written(tmp_path, monkeypatch):
    python = blocks("python")
    net = next(block for block in python if block.startswith("# net.py"))
    train = next(block for block in python if block.startswith("# train.py"))
    api = next(block for block in python if "symgrad.trace_modes(" in block)
    (tmp_path / "net.py").write_text(net)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "net", raising=False)
    runner = CliRunner()
    for arguments in quickstart_commands():
        result = runner.invoke(main, arguments)
        assert result.exit_code == 0, (arguments, result.output)
    assert (tmp_path / "gen" / "net_gradients_eval.py").is_file()  # the eval module, generated too
    torch.manual_seed(0)
    exec(compile(train, "train.py", "exec"), {"__name__": "__main__"})
    saved = torch.load(tmp_path / "net.pt")
    assert "conv.weight" in saved and int(saved["bn.num_batches_tracked"]) == 20  # the model's own keys
    namespace = {"__name__": "__main__"}
    exec(compile(api, "api.py", "exec"), namespace)
    assert callable(namespace["fast"]) and namespace["eval_text"] is not None


def test_the_readme_test_command_is_what_ci_runs():
    """`.ci/run` runs the README's command (b): each step of it, flags like `-q` aside."""
    command = next(block for block in blocks("bash") if "'.[test]'" in block).strip()
    ci = (README.parent / ".ci" / "run").read_text().replace(" -q", "")
    for step in command.split(" && "):
        assert step in ci, f"README's test command step not in .ci/run: {step}"
