"""The size-dependence rerun: the traced code runs again at other input sizes, and a layer argument that
differs between the two runs, being computed from the input's size, is refused rather than frozen into
the spec (a size read from a tensor that only happened to match is written as the number)."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import cut
from .dataflow import Problem, report
from .errors import Refusal, TraceError


def size_dependence(run: Callable, shapes: dict[str, tuple[int, ...]], spec: dict, calls: list) -> list[str]:
    """Run again at other sizes (``run(shapes)``: the spec dict and calls there); every layer argument that
    changed was computed from a size."""
    for changed in other_sizes(shapes):
        try:
            other, _ = run(changed)
        except Refusal:  # a value read or the timeout: no other size helps
            raise
        except Exception:  # the model does not run at these sizes: try fewer changes
            continue
        described = shapes_text(changed)
        ours, theirs = _compared_layers(spec, calls, other)
        first = _first_other_op(ours, theirs)
        if first is not None:
            return [
                f"{first}: error: the code runs different ops from here on at {described} than at the given "
                "shapes, so no single spec describes it (fix: trace a model whose ops do not depend on the "
                "input's size)"
            ]
        problems = []
        for layer, call, key, value, again in _changed_arguments(ours, theirs):
            fixed = _fixed_sizes(value, again, call) if key in ("shape", "size") else None
            if fixed is not None:  # a size that only happened to equal one the code read: the number
                layer[key] = fixed
                continue
            problems.append(
                Problem(
                    call.where,
                    call.module,
                    layer["op"],
                    f"argument {key}={_shown(value)} becomes "
                    f"{_shown(again)} at {described}: it is computed from the input's size, "
                    "which a spec cannot express",
                    FIXES.get(layer["op"])
                    or "use sizes that do not depend on the input (a fixed pad, scale_factor "
                    "instead of size, flatten instead of view(N, ...)), or read them from the "
                    "tensor to match: F.interpolate(h, size=skip.shape[-2:]), U-Net's "
                    "F.pad(h, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2]) with dx, dy "
                    "from skip.size() and h.size()",
                )
            )
        problems = report(problems)  # one line per source line, however many modules share it
        if _other_result(spec, other):
            problems.append(
                f"{calls[-1].where if calls else '<traced code>'}: error: the loss changes at {described} "
                "(fix: reduce over every dim but the first, or over all)"
            )
        return problems
    return []


def _compared_layers(spec: dict, calls: list, other: dict) -> tuple[list, list]:
    """The layers of both runs that must match, ours with their calls: the checks of branches on sizes aside
    (`A or B` compares B only where A is false: trace.size_checks)."""
    ours = [(layer, call) for layer, call in zip(spec["layers"], calls) if layer["op"] != "size_check"]
    theirs = [layer for layer in other["layers"] if layer["op"] != "size_check"]
    return ours, theirs


def _first_other_op(ours: list, theirs: list) -> str | None:
    """Where the other run's ops first differ from ours (file:line), None where they are the same."""
    ops, other_ops = [layer["op"] for layer, _ in ours], [layer["op"] for layer in theirs]
    if ops == other_ops:
        return None
    first = next(
        (index for index, pair in enumerate(zip(ops, other_ops)) if pair[0] != pair[1]), min(len(ops), len(other_ops))
    )
    return ours[min(first, len(ours) - 1)][1].where if ours else "<traced code>"


def _changed_arguments(ours: list, theirs: list):
    """``(layer, call, key, ours, theirs)`` for each layer argument the other run gives otherwise."""
    for (layer, call), again in zip(ours, theirs):
        for key, value in layer.items():
            if key in ("in", "out", "op") or key.startswith("_") or again.get(key) == value:
                continue
            yield layer, call, key, value, again.get(key)


def _other_result(spec: dict, other: dict) -> bool:
    return other.get("loss") != spec.get("loss") or other.get("outputs") != spec.get("outputs")


def dim_one_pins(run: Callable, shapes: dict[str, tuple[int, ...]], spec: dict, calls: list) -> dict[str, tuple]:
    """The inputs whose dim 1 the spec must hold at its traced size: :func:`other_sizes` never changes dim 1
    (a channel count there refuses many valid models), so a number computed from it (a sequence's length in
    [N, T, C] or [N, T]: ``torch.arange(x.shape[1])``, ``h.view(n, t * c)`` with numbers, a branch on it) would be
    frozen without a word. One more run changes dim 1 of each input of 2 or more dims (x2, and + 1 where x2
    shows nothing: a pad to a multiple of 4 is 0 at 8 and 16); where the model runs there and the spec differs
    (an argument, the ops, the result), ``{input: (dim 1's traced size, file:line of the first call that
    differs, what differs)}`` (``size_checks.pin_dim_one`` checks it at run time); else nothing (a channel
    count, an MLP's features: the model does not run there). Where the inputs are of several dim-1 sizes, the
    inputs of one size change together, a size at a time (ids and token types share T; an image's channels, a
    target's classes or a feature vector beside them do not run changed), each alone where its size's run
    does not run, and only those whose change differs are checked."""
    grown = [key for key, shape in shapes.items() if len(shape) >= 2]
    if not grown:
        return {}
    joint = _dim_one_changed(run, shapes, spec, calls, grown)
    sizes: dict[int, list] = {}
    for key in grown:
        sizes.setdefault(shapes[key][1], []).append(key)
    if joint == {} or len(sizes) == 1 and (joint is not None or len(grown) == 1):
        return joint or {}
    pins: dict[str, tuple] = {}
    for group in sizes.values():
        found = joint if group == grown else _dim_one_changed(run, shapes, spec, calls, group)
        for key in group if found is None and len(group) > 1 else []:
            pins.update(_dim_one_changed(run, shapes, spec, calls, [key]) or {})
        pins.update(found or {})
    return pins or joint or {}


def _dim_one_changed(run: Callable, shapes: dict, spec: dict, calls: list, grown: list) -> dict | None:
    """:func:`dim_one_pins` with dim 1 of the inputs ``grown`` changed: its pins, {} where the model runs at
    the changed sizes alike, or None where it runs at no such size. Each of dim 1's traced sizes becomes 2T,
    then T + 1 where 2T shows nothing (a pad to a multiple of 4 is 0 at 8 and 16), then, where the model
    runs at neither, T - 1 and T // 2 (nanoGPT traced at its block size: ``assert t <= self.block_size``).
    Every dim of these sizes changes with it, in each input (x [N, T, C] with a mask [N, T, T] or
    [N, 1, T, T], a graph's adjacency [N, V, V]), or dim 1 alone where the model runs at no such change (a
    channel count that happens to equal T). Where symgrad refuses the code at every such size (a constant
    too large there) and the model ran at none, the refusal is what follows dim 1, and dim 1 is pinned."""
    ran, refused = False, None
    for changes in _dim_one_changes(shapes, grown):
        if ran and changes.smaller:  # smaller sizes only where the model runs at no larger one
            break
        for change in changes:
            try:
                other, _ = run(change)
                break
            except Refusal:  # a value read or the timeout: no other size helps
                raise
            except TraceError as error:  # symgrad refuses the code there: noted, the next size may say more
                refused = refused or (change, error)
            except Exception:  # the model does not run there (a channel count), or at 2x alone
                pass
        else:
            continue
        ran = True
        ours, theirs = _compared_layers(spec, calls, other)
        where, what = _first_other_op(ours, theirs), "the choice of ops"
        if where is None:
            found = next(_changed_arguments(ours, theirs), None)
            if found is not None:
                layer, call, key, _, _ = found
                where, what = call.where, f"the argument {key} of {layer['op']}"
            elif _other_result(spec, other):
                where, what = calls[-1].where if calls else "<traced code>", "the result"
        if where is not None:
            return {key: (shapes[key][1], where, what) for key in grown if key in spec["inputs"]}
    if not ran and refused is not None:
        change, error = refused
        where, marker, _ = str(error).splitlines()[0].partition(": error: ")
        what = f"the code symgrad refuses at {shapes_text({key: change[key] for key in grown})}"
        return {
            key: (shapes[key][1], where if marker else "<traced code>", what) for key in grown if key in spec["inputs"]
        }
    return {} if ran else None


class _Changes(list):
    """The sizes of one change of dim 1, each tried where the model runs at none before it; ``smaller``: a
    change to a smaller size, tried only where the model runs at no larger one."""

    smaller = False


def _dim_one_changes(shapes: dict, grown: list):
    """The changes :func:`_dim_one_changed` runs, in order (see there): each with every dim of the traced dim-1
    sizes of ``grown`` changed, then with dim 1 of ``grown`` alone where that differs."""
    traced = {shapes[key][1] for key in grown}
    for factor, added in ((2, 0), (1, 1), (1, -1), (0.5, 0)):
        sizes = {size: int(size * factor) + added for size in traced}
        if any(size < 1 for size in sizes.values()) or (factor == 0.5 and traced & {2, 3}):
            continue  # no size below 1; T // 2 only where it is not T - 1
        every = {
            key: (shape[0], *(sizes.get(size, size) for size in shape[1:])) if len(shape) >= 2 else shape
            for key, shape in shapes.items()
        }
        alone = {
            key: (shape[0], sizes[shape[1]], *shape[2:]) if key in grown else shape for key, shape in shapes.items()
        }
        changes = _Changes([every] if every == alone else [every, alone])
        changes.smaller = added < 0 or factor < 1
        yield changes


CONSTANT_FIX = (
    "make it once, for one input size, in __init__ and register_buffer it (EdgeNeXt's position "
    "encoding: the model then runs at that size, any batch; expand it to the batch in forward), or pass "
    "it in as an input"
)
"""The fix for a tensor made in ``forward`` whose values or size follow the input's size."""

FIXES = {
    "constant": CONSTANT_FIX,
    "narrow": "count from the end, which reads the size at run time: h[..., 1:-1, :] for h.narrow(2, 1, "
    "h.shape[2] - 2), h[:, -3:]; or crop fixed margins with a negative pad, which takes any size: "
    "F.pad(h, [0, 0, -1, -1]) (left, right, top, bottom)",
}
"""The fix for an argument that follows the input's size, by op, where the general one does not work."""


def _fixed_sizes(value: Any, again: Any, call) -> list | None:
    """A list of sizes where each entry that differs between the runs was read from a tensor at the given
    shapes (``{like: x}``) but is the same number at the other shapes, the size this call's result has at
    the given shapes too (Swin's ``view(N, N, -1)`` of its bias table, N happening to equal the tokens per
    window the code read): those entries as that number; None when any other entry differs."""
    traced = getattr(call.result, "shape", None)
    if not (
        isinstance(value, list)
        and isinstance(again, list)
        and len(value) == len(again)
        and traced is not None
        and len(traced) == len(value)
    ):
        return None
    fixed = []
    for position, (first, second) in enumerate(zip(value, again)):
        if first == second:
            fixed.append(first)
        elif isinstance(first, dict) and isinstance(second, int) and second == traced[position]:
            fixed.append(second)
        else:
            return None
    return fixed


def _shown(value: Any) -> str:
    """An argument as the spec writes it: ``{like: x}``, ``[0, 1]``."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {item}" for key, item in value.items()) + "}"
    return cut(repr(value), 120)  # a constant's values: the start says enough


def other_sizes(shapes: dict[str, tuple[int, ...]]):
    """Other input sizes to run at: batch + 1 and the spatial sizes grown unequally (x2, x3, x2, ...: a
    square input becomes oblong, so a size read from the height is never mistaken for the width's), then
    the spatial sizes doubled with the batch, then each change alone (for models that need square or
    power-of-two inputs)."""
    batch = {key: (shape[0] + 1, *shape[1:]) if shape else shape for key, shape in shapes.items()}
    spatial = {key: (*shape[:2], *(2 * size for size in shape[2:])) for key, shape in shapes.items()}
    oblong = {
        key: (*shape[:2], *((2 + axis % 2) * size for axis, size in enumerate(shape[2:])))
        for key, shape in shapes.items()
    }
    tried = []
    for candidate in (
        {key: (batch[key][:1] + oblong[key][1:]) if shape else shape for key, shape in shapes.items()},
        {key: (batch[key][:1] + spatial[key][1:]) if shape else shape for key, shape in shapes.items()},
        batch,
        spatial,
    ):
        if candidate != shapes and candidate not in tried:
            tried.append(candidate)
            yield candidate


def shapes_text(shapes) -> str:
    return ", ".join(f"{key}={list(shape)}" for key, shape in shapes.items())
