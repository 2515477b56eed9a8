"""The checking code the generated tests share is one file written beside them (issue 64):
``_symgrad_testdata.py``, symgrad.testdata's functions verbatim, the same for every spec. ``symgrad
check`` compares it as it compares every other generated file: edited or missing, it is reported;
it is never taken for a module whose spec must build."""

from __future__ import annotations

import shutil
from pathlib import Path

import symgrad

ROOT = Path(__file__).resolve().parents[2]
SHARED = "_symgrad_testdata.py"


def _copied(tmp_path: Path) -> Path:
    """generated/'s seed-1 files and the shared file in a folder beside a copy of the seed-1 spec,
    as their headers name it (``../examples/``)."""
    folder = tmp_path / "generated"
    folder.mkdir()
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "seed1_strided_conv.yaml", tmp_path / "examples")
    for name in ("seed1_strided_conv.py", "test_seed1_strided_conv.py", "seed1_strided_conv.md",
                 "seed1_strided_conv.html", SHARED):
        shutil.copy(ROOT / "generated" / name, folder)
    return folder


def test_the_shared_file_is_checked_and_an_edit_or_its_absence_is_reported(tmp_path):
    folder = _copied(tmp_path)
    assert symgrad.check(folder).stale == []
    shared = folder / SHARED
    shared.write_text(shared.read_text().replace("def make_inputs(", "def make_inputs_edited("))
    stale = symgrad.check(folder).stale
    assert len(stale) == 1 and SHARED in stale[0] and "edited by hand" in stale[0], stale
    shared.unlink()
    stale = symgrad.check(folder).stale
    assert len(stale) == 1 and SHARED in stale[0] and "out of date" in stale[0], stale


def test_each_test_file_imports_the_shared_file_and_copies_none_of_it():
    shared = (ROOT / "generated" / SHARED).read_text()
    assert "def make_inputs(" in shared and "def sums_differ(" in shared
    for path in sorted((ROOT / "generated").glob("test_*.py")):
        text = path.read_text()
        assert f'_location.with_name("{SHARED}")' in text and "def make_inputs(" not in text, path.name
