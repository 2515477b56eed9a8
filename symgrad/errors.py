"""Errors that point at the spec: one line naming ``file:line:column``, the problem and the fix."""

from __future__ import annotations

import re
from dataclasses import dataclass

CUT = 40
"""The longest name or number a message repeats in full; a longer one is cut (a 10,000-character
op name is not echoed)."""


def cut(text: object, limit: int = CUT) -> str:
    """``text`` as it is, or its first ``limit - 3`` characters and '...' when longer."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cut_long_names(text: str) -> str:
    """Every quoted name (``'...'``) and every run of digits in ``text`` longer than :data:`CUT`, cut."""
    text = re.sub(r"'([^'\s]{%d,})'" % (CUT + 1), lambda match: f"'{cut(match.group(1))}'", text)
    return re.sub(r"\d{%d,}" % (CUT + 1), lambda match: f"{match.group(0)[:20]}...({len(match.group(0))} digits)", text)


@dataclass(frozen=True)
class Location:
    """A place in a spec file; ``line`` and ``column`` count from 1."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class SymgradError(Exception):
    """Base class of every error symgrad reports to a user."""


class GeneratorError(SymgradError):
    """symgrad rendered code that is wrong whatever the spec: a bug in symgrad, never the spec's fault."""


class SpecError(SymgradError):
    """A spec that cannot be turned into correct gradient code.

    ``str(error)`` is a single line: ``FILE:LINE:COL: error: WHAT (fix: HOW)``.
    """

    def __init__(self, message: str, location: Location | None = None, fix: str | None = None):
        self.message = _cut_long_names(" ".join(message.split()))
        self.location = location
        self.fix = _cut_long_names(" ".join(fix.split())) if fix else None
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        how = f" (fix: {self.fix})" if self.fix else ""
        return f"{where}error: {self.message}{how}"


class StaleFileError(SymgradError):
    """A generated file was edited by hand, so regenerating would destroy work."""


class WriteError(SymgradError, OSError):
    """A file that could not be written or read (read-only folder, full disk, a parent that is a
    file): one line naming the path and the fix. The old files are left as they were.

    It is an :class:`OSError` too, so code that caught the file system's own error still does."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "error: cannot write"
