"""``python -m benchmarks.architectures``'s machinery (not its numbers): rows written as they come and added to a
results file, the labels run in the order asked, an unknown label refused in one line, a generated test file
stopped at ``--timeout``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import architectures  # noqa: E402


def _row(label):
    return {
        "label": label,
        "traced": "x=[2, 3]",
        "layers": 1,
        "blocks": 0,
        "module lines": 10,
        "widest": 50,
        "trace": 0.1,
        "generate": 0.2,
        "test": 0.3,
        "result": "8 passed",
    }


def test_rows_are_added_to_the_results_file_as_they_come_in_the_order_asked(tmp_path, monkeypatch):
    output = tmp_path / "results.md"
    output.write_text("# a header kept\n\n| architecture | traced at |\n|---|---|\n| earlier | x |\n")
    ran = []

    def fake_run(label, case, folder, blocks=False, timeout=None):
        ran.append(label)
        if label == "c":
            assert output.read_text().endswith("| b | x=[2, 3] | 1 | 0 | 10 | 50 | 0.1 | 0.2 | 0.3 | 8 passed |\n")
            raise KeyboardInterrupt  # a run stopped midway
        return _row(label)

    monkeypatch.setattr(architectures, "cases", lambda: {"a": None, "b": None, "c": None})
    monkeypatch.setattr(architectures, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["architectures", "--only", "b", "c", "--output", str(output), "--append"])
    with pytest.raises(KeyboardInterrupt):
        architectures.main()
    assert ran == ["b", "c"]
    text = output.read_text()
    assert text.startswith("# a header kept\n") and text.count("| architecture |") == 1, text
    assert text.splitlines()[-2:] == [
        "| earlier | x |",
        "| b | x=[2, 3] | 1 | 0 | 10 | 50 | 0.1 | 0.2 | 0.3 | 8 passed |",
    ]


def test_an_unknown_label_is_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(architectures, "cases", lambda: {"a": None})
    monkeypatch.setattr(sys, "argv", ["architectures", "--only", "a", "nope"])
    with pytest.raises(SystemExit) as stopped:
        architectures.main()
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: no such label: nope (labels: a)")


def test_a_generated_test_file_past_its_timeout_is_stopped_and_its_row_says_so(tmp_path):
    from tests.models.test_classic_cnns import CASES

    row = architectures.run("srcnn", CASES["srcnn"], tmp_path, timeout=0.01)
    assert row["result"] == "STOPPED: still running after 0 s" and row["test"] < 5, row
    assert (tmp_path / "test_srcnn.py").exists()
