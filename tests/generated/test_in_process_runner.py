"""``tests.helpers.run_generated_tests``, which runs generated test files in the test's own process: it
sees a failure, a skip and an import a fresh interpreter would not have, and leaves nothing behind."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.helpers import run_generated_tests

PASSING = "import torch\n\ndef test_one():\n    assert torch.ones(2).sum() == 2\n"


def test_a_passing_file_passes_and_leaves_no_module_behind(tmp_path):
    (tmp_path / "test_passing.py").write_text(PASSING + "torch.set_default_dtype(torch.float64)\n")
    before = set(sys.modules)
    outcomes = run_generated_tests(tmp_path / "test_passing.py")
    assert outcomes.ok and outcomes.passed == 1, outcomes.report
    assert set(sys.modules) <= before and torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize("body, seen", [("    assert False, 'broken module'\n", "broken module"),
                                         ("    pytest.skip('no room')\n", "no room")])
def test_a_failure_or_a_skip_is_not_ok(tmp_path, body, seen):
    (tmp_path / "test_bad.py").write_text(PASSING + "\nimport pytest\n\ndef test_two():\n" + body)
    outcomes = run_generated_tests(tmp_path / "test_bad.py")
    assert not outcomes.ok and outcomes.passed == 1 and seen in outcomes.report, outcomes.report


def test_a_file_that_imports_beyond_torch_and_the_standard_library_is_refused(tmp_path):
    (tmp_path / "test_imports.py").write_text("import symgrad\n" + PASSING)
    with pytest.raises(AssertionError, match="imports symgrad"):
        run_generated_tests(tmp_path / "test_imports.py")
