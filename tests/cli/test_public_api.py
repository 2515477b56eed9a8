"""The Python API the README documents: ``symgrad.trace``, ``trace_modes``, ``generate``, ``bind`` and
``check`` are named in ``symgrad.__all__``, import, and work, whatever was imported before them.

``symgrad.trace`` and ``symgrad.check`` are submodules too: they are callable modules
(``symgrad/callable_module.py``), since a function stored in the package attribute would be replaced
by the first import of its submodule."""

from __future__ import annotations

import sys
from pathlib import Path

import torch.nn.functional as F

import symgrad

ROOT = Path(__file__).resolve().parents[2]

API = ("trace", "trace_modes", "generate", "bind", "check")


def conv(x, w):
    return F.conv2d(x, w)


def test_the_api_is_exported_and_imports():
    assert set(API) <= set(symgrad.__all__)
    from symgrad import bind, check, generate, trace, trace_modes  # noqa: F401

    for name in symgrad.__all__:
        assert getattr(symgrad, name) is not None, name
    assert all(callable(getattr(symgrad, name)) for name in API)
    assert symgrad.trace_modes is symgrad.trace.trace_modes


def test_trace_and_check_stay_callable_once_their_submodules_are_imported():
    """Importing a submodule sets the package's attribute to it (as the library's own imports do): the
    attribute is then the callable module itself, so the name never turns into a plain module."""
    import symgrad.check
    import symgrad.trace

    for name in ("trace", "check"):
        assert getattr(symgrad, name) is sys.modules[f"symgrad.{name}"] and callable(getattr(symgrad, name))
    from symgrad import check, trace

    assert trace is symgrad.trace and check is symgrad.check


def test_trace_generate_and_check_as_the_readme_calls_them(tmp_path):
    text = symgrad.trace(conv, {"x": (2, 1, 5, 5), "w": (1, 1, 3, 3)}, name="tiny")
    assert "op: conv2d" in text and "outputs: conv2d" in text
    (tmp_path / "tiny.yaml").write_text(text)
    symgrad.generate(tmp_path / "tiny.yaml", label="tiny.yaml").write(tmp_path)
    found = symgrad.check(tmp_path)
    assert isinstance(found, symgrad.Staleness) and found.stale == [] and found.checked >= 2  # module, test, ...
    module = tmp_path / "tiny.py"
    module.write_text(module.read_text().replace("def gradients(", "def gradients_(", 1))
    stale = symgrad.check([tmp_path]).stale
    assert len(stale) == 1 and "tiny.py: edited by hand" in stale[0], stale


def test_a_spec_generated_from_python_is_written_beside_its_module_and_checked(tmp_path):
    """``symgrad.generate(text=...).write(folder)`` writes the spec too (``<name>.yaml``, or its label where
    that is a file name), so that ``symgrad check`` rebuilds the module from it and flags an edited spec."""
    from click.testing import CliRunner

    from symgrad.cli import main

    text = (ROOT / "examples" / "seed1_strided_conv.yaml").read_text()
    written = symgrad.generate(text=text).write(tmp_path / "gen")
    assert tmp_path / "gen" / "seed1_strided_conv.yaml" in written
    assert (tmp_path / "gen" / "seed1_strided_conv.yaml").read_text() == text
    assert CliRunner().invoke(main, ["check", str(tmp_path / "gen")]).exit_code == 0
    (tmp_path / "gen" / "seed1_strided_conv.yaml").write_text(text.replace("stride: 32", "stride: 16"))
    assert CliRunner().invoke(main, ["check", str(tmp_path / "gen")]).exit_code == 1
    labelled = symgrad.generate(text=text, label="mine.yaml").write(tmp_path / "other")
    assert tmp_path / "other" / "mine.yaml" in labelled
    elsewhere = symgrad.generate(text=text, label="../specs/mine.yaml").write(tmp_path / "third")
    assert not any(path.suffix == ".yaml" for path in elsewhere)  # a label with a folder: nothing written there
