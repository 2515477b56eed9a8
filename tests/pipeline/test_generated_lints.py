"""Generated code passes ruff's default rules (pyflakes: no unused or undefined name, no shadowed import; the
E4/E7/E9 checks) as written: every committed module in generated/ (docs/checks.md says so)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_modules_pass_ruffs_default_rules():
    modules = sorted(str(path) for path in (ROOT / "generated").glob("*.py"))
    assert len(modules) >= 5, "generated/ holds the examples' modules"
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--select", "F,E4,E7,E9", *modules],
        capture_output=True,
        text=True,
    )
    assert "No module named ruff" not in result.stderr, "ruff comes with the [test] extra: pip install -e '.[test]'"
    assert result.returncode == 0, result.stdout[-3000:]
