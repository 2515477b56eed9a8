"""A trace at fixed sizes (``symgrad.trace(..., static_sizes=True)``, ``symgrad trace --static-sizes``): for a
model whose code follows its input's size in ways a spec cannot say, and whose library one cannot edit (timm's
PVT-v2 pads to the window at pvt_v2.py:295, EdgeNeXt builds a Fourier position encoding from the map's size at
edgenext.py:81, MONAI's SwinUNETR chooses its window size and padding from the size at swin_unetr.py:596).

The second run at other sizes (``rerun.size_dependence``) is skipped: sizes, branches and constants made from
numbers alone are taken as the code computed them at the traced sizes, and the spec says so. They are never
frozen silently: every floating input's every size is GUARDED by a ``size_check`` layer on the input, so the
generated module stops in one line at any other size, naming the traced sizes and how to trace again, and
``symgrad.bind`` refuses such a call before it runs (its guards' ``sizes`` entry). An int64 input's sizes
(token ids) are guarded at bind alone: the generated module itself does not check them.

Without the option, each size-dependence refusal names it as one fix (:func:`with_static_fix`), after the
refusal's own fix (which may need editing the model's code)."""

from __future__ import annotations

from .errors import Refusal, TraceError
from .size_checks import checked_first

OPTION = "static_sizes=True"
CLI_OPTION = "--static-sizes"
STATIC_FIX = (
    f"or, where the code cannot change, trace at these sizes alone: {CLI_OPTION} (symgrad.trace(..., "
    f"{OPTION})), whose generated code and bound model refuse any other input size"
)
"""The fix added to each refusal of code that follows the input's size."""


class RefusedElsewhere(Exception):
    """symgrad's refusal of the code at the second run's sizes, where the model itself ran."""


def second_runs(run, refused: list):
    """``run`` for ``rerun.size_dependence``, which tries the next sizes where a run fails: a refusal of the code
    at those sizes (a constant too large there) is noted in ``refused`` as it goes on."""

    def wrapped(changed):
        try:
            return run(changed)
        except Refusal:
            raise
        except TraceError as error:
            refused.append((changed, error))
            raise RefusedElsewhere(str(error)) from None

    return wrapped


def refused_elsewhere(refused: list) -> list[str]:
    """Where a second run was refused by symgrad (not by the model, which ran there), that refusal, even where
    a run at fewer changes went through: the code at the given sizes goes in and at others not, so what it
    computes follows the size (EdgeNeXt's position encoding: within the constant's limit at the traced size
    alone, and the same at batch + 1); else nothing."""
    if not refused:
        return []
    changed, error = refused[0]
    line = str(error).splitlines()[0]
    where, marker, rest = line.partition("error: ")
    sizes = shapes_words({key: tuple(shape) for key, shape in changed.items()})
    return [
        f"{where}{marker}at {sizes} (the second run, which finds what follows the input's size), {rest}"
        if marker
        else line
    ]


def with_static_fix(problems: list[str]) -> list[str]:
    """Each refusal line with the static-sizes fix added inside its ``(fix: ...)``: ``(fix: A; or ...)``."""
    fixed = []
    for line in problems:
        if line.endswith(")") and "(fix: " in line and CLI_OPTION not in line:
            line = f"{line[:-1]}; {STATIC_FIX})"
        fixed.append(line)
    return fixed


def static_branches(spec: dict, dtypes: dict[str, str], tensor_names: list[str]) -> dict | None:
    """The spec as a second run at the same sizes would give it (its branch checks unchanged, so
    ``size_checks.drop_fixed`` drops them: the guards imply them), where every tensor argument is floating
    and so guarded; else None (every check stays)."""
    import copy

    if any(dtypes.get(key) == "int64" for key in tensor_names):
        return None
    return copy.deepcopy(spec)


def shapes_words(shapes: dict[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{key}=[{', '.join(map(str, shape))}]" for key, shape in shapes.items())


def guard_sizes(
    spec: dict, calls: list, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str], where: str
) -> dict[str, list[int]]:
    """Put a ``size_check`` of each size of each floating input first in ``spec``'s layers (and a call for each
    in ``calls``, at ``where``, in no module); every later read of the input reads it through its checks. The
    guarded sizes, by input, for the guards (:func:`symgrad.bound_model`'s check at each call): an int64
    input's (token ids) too, which no layer reads as a tensor to check, guarded at bind alone."""
    guarded = {key: list(shape) for key, shape in shapes.items() if key in spec["inputs"]}
    checked_first(
        spec,
        calls,
        [
            (
                key,
                dim,
                size,
                where,
                OPTION,
                where,
            )
            for key, shape in guarded.items()
            if dtypes.get(key) != "int64"
            for dim, size in enumerate(shape)
        ],
    )
    return guarded
