"""Each network traced and built once per test run, and shared by the tests that read the same spec.

A whole network's trace and build take most of a zoo test's time, and several tests read the same one
(the float64 step and the autocast step of ``test_bind_zoo``, say). :func:`once` keeps a text made by a
function under a key, in a folder of this run's that every pytest-xdist worker sees: the first test
to ask makes it, the others read it. Tracing leaves the model, its buffers and the random state as they
were, so a test that reads the text instead of tracing sees what it would have made. The folder is the
run's own: under pytest's temporary folder for the run, which every worker's is inside of (set by
``tests/conftest.py``; pytest keeps the last three runs' and removes older ones)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

from symgrad.check import module_from_source
from symgrad.pipeline import build_text

FOLDER: Path | None = None
"""Where the texts go: set for the run by ``tests/conftest.py``; outside pytest, a new temporary folder."""


def _folder() -> Path:
    global FOLDER
    if FOLDER is None:
        FOLDER = Path(tempfile.mkdtemp(prefix="symgrad-built-once-"))
    FOLDER.mkdir(parents=True, exist_ok=True)
    return FOLDER


def once(key: tuple, make: Callable[[], str]) -> str:
    """The text ``make()`` returns for ``key``, made once per test run (atomically written, so a worker
    never reads half a file; two workers asking at once both make it, and both are the same)."""
    path = _folder() / hashlib.sha256(repr(key).encode()).hexdigest()
    try:
        return path.read_text()
    except FileNotFoundError:
        pass
    text = make()
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(text)
    os.replace(partial, path)
    return text


def module_of(text: str, label: str, name: str):
    """The module generated from spec ``text``, built alone (no test file, no pages: it is imported, not kept)."""
    source = once(
        ("module", label, name, text),
        lambda: build_text(text, label, documents=False, tests=False).rendered.files[f"{name}.py"],
    )
    return module_from_source(source, name)
