"""``tests.helpers.run_symgrad``, the forked process the CLI tests run a command in: it shows what a fresh
``python -m symgrad`` would (exit status, both streams, a traceback, Python's default warnings), however
much the test's own process has imported, captured or filtered."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

from tests.helpers import run_symgrad

ROOT = Path(__file__).resolve().parents[2]


def test_a_refused_command_exits_2_with_its_one_line_on_stderr(tmp_path):
    result = run_symgrad("generate", str(tmp_path / "missing.yaml"), "-o", str(tmp_path / "gen"), cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result
    assert "missing.yaml" in result.stderr and not (tmp_path / "gen").exists()


def test_output_and_a_clean_exit(tmp_path):
    result = run_symgrad("generate", str(ROOT / "examples" / "seed1_strided_conv.yaml"), "-o", "gen", cwd=tmp_path)
    assert result.returncode == 0 and "wrote:" in result.stdout, result
    assert (tmp_path / "gen" / "seed1_strided_conv.py").exists()  # in its own working directory


def test_an_escaping_exception_is_a_traceback_and_status_1(tmp_path, monkeypatch):
    import symgrad.cli

    def broken(*arguments, **keywords):
        raise KeyError("boom")

    monkeypatch.setattr(symgrad.cli, "main", broken)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # forked even under `-n 0` (nothing computes)
    result = run_symgrad("ops", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" in result.stderr and "KeyError: 'boom'" in result.stderr, result


def test_a_warning_is_printed_as_a_fresh_interpreter_prints_it(tmp_path, monkeypatch):
    import symgrad.cli

    def warns(*arguments, **keywords):
        warnings.warn("a user warning", UserWarning)
        warnings.warn("hidden by default", DeprecationWarning)

    monkeypatch.setattr(symgrad.cli, "main", warns)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the test's own filters are not the command's
        result = run_symgrad("ops", cwd=tmp_path)
    assert result.returncode == 0 and "UserWarning: a user warning" in result.stderr, result
    assert "hidden by default" not in result.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="os.fork and resource limits: the CI machine's Linux")
def test_a_file_size_limit_leaves_its_output_streams_alone(tmp_path):
    import resource
    import signal

    def no_writes():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    result = run_symgrad(
        "generate", str(ROOT / "examples" / "seed1_strided_conv.yaml"), "-o", "gen", cwd=tmp_path, preexec_fn=no_writes
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "error:" in result.stderr, result
