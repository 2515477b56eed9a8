"""Errors that point at the spec: one line naming ``file:line:column``, the problem and the fix."""

from __future__ import annotations

from dataclasses import dataclass


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


class SpecError(SymgradError):
    """A spec that cannot be turned into correct gradient code.

    ``str(error)`` is a single line: ``FILE:LINE:COL: error: WHAT (fix: HOW)``.
    """

    def __init__(self, message: str, location: Location | None = None, fix: str | None = None):
        self.message = " ".join(message.split())
        self.location = location
        self.fix = " ".join(fix.split()) if fix else None
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
