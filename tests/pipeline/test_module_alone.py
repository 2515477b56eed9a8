"""``build_text(..., tests=False)``, the module alone (what the zoo tests import): the same module, byte for
byte, as the full build writes, without the test file, whose small shapes and reference values are most of
a network's build."""

from __future__ import annotations

from pathlib import Path

import pytest

from symgrad.pipeline import build_text

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spec", sorted(path.name for path in (ROOT / "examples").glob("*.yaml")))
def test_the_module_alone_is_the_full_builds_module(spec):
    text = (ROOT / "examples" / spec).read_text()
    full, alone = build_text(text, spec), build_text(text, spec, documents=False, tests=False)
    name = full.rendered.name
    assert alone.rendered.files == {f"{name}.py": full.rendered.files[f"{name}.py"]}
    assert f"test_{name}.py" in full.rendered.files and alone.shapes == []
