"""The trace's errors: one line each, never a traceback."""

from __future__ import annotations

from ..errors import SymgradError


class TraceError(SymgradError):
    """The traced code does something symgrad cannot turn into a spec."""


class Refusal(TraceError):
    """A refusal that no other input size can mend (a value read, the timeout): raised through the second run."""
