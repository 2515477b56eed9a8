"""The Python API the README documents: ``symgrad.trace``, ``trace_modes``, ``generate``, ``bind`` and
``check`` are named in ``symgrad.__all__``, import, and work, whatever was imported before them.

``symgrad.trace`` and ``symgrad.check`` are submodules too: they are callable modules
(``symgrad/callable_module.py``), since a function stored in the package attribute would be replaced
by the first import of its submodule."""

from __future__ import annotations

import sys

import torch.nn.functional as F

import symgrad

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
