"""Which frames are the user's: torch's, symgrad's and the standard library's files are not, and torch's
Tensor methods and dispatch stand between a call the user's code makes and the recorder.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig

import torch

TORCH_DIR = os.path.join(os.path.realpath(os.path.dirname(torch.__file__)), "")
DISPATCH_FILES = tuple(
    os.path.join(directory, name)
    for directory in {TORCH_DIR, os.path.join(os.path.dirname(torch.__file__), "")}
    for name in ("overrides.py", "_tensor.py")
)
"""torch's Tensor methods and its ``__torch_function__`` dispatch, by the path torch was imported from (a frame's
``co_filename``) and by its real path: where a symlink leads to the environment the two differ, and a frame of
these files taken for the caller's would hide a value the code reads (``len(h[h > 0])``) from the tracer."""

LIBRARY_DIRS = tuple(
    os.path.join(os.path.realpath(path), "")
    for path in (
        os.path.dirname(torch.__file__),
        os.path.dirname(os.path.dirname(__file__)),
        sysconfig.get_paths()["stdlib"],
    )
)


@functools.lru_cache(maxsize=4096)  # asked for every frame of every call: realpath is a syscall per part
def is_users(filename: str) -> bool:
    """Whether code in ``filename`` is the user's: not torch, symgrad or the standard library."""
    return not filename.startswith("<") and not os.path.realpath(filename).startswith(LIBRARY_DIRS)


def user_line(frame=None) -> str:
    """``file:line`` of the innermost frame in the user's own code."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        if is_users(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<traced code>"


def user_line_of_traceback(traceback) -> str:
    """``file:line`` of the innermost user frame of an exception's traceback."""
    found = "<traced code>"
    while traceback is not None:
        if is_users(traceback.tb_frame.f_code.co_filename):
            found = f"{traceback.tb_frame.f_code.co_filename}:{traceback.tb_lineno}"
        traceback = traceback.tb_next
    return found


def by_user(frame) -> bool:
    """Whether the user's own code made the call whose dispatch runs in ``frame`` (not torch's, such as
    BatchNorm's check of the batch size)."""
    while frame is not None and frame.f_code.co_filename.startswith(DISPATCH_FILES):
        frame = frame.f_back
    return frame is not None and is_users(frame.f_code.co_filename)
