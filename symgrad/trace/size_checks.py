"""The branches the traced code takes on the input's size, written as ``size_check`` layers.

``math.ceil(H / patch_h) * patch_h != H`` (timm's MobileViT block, mobilevit.py:248) compares sizes the code
read; ``sizes.py`` records each such comparison and the recorder hands it to the next call. Here each becomes a
``size_check`` layer on the node whose sizes it reads, which every later read of that node goes through: the
generated code checks the comparison at run time and stops where it comes out otherwise than when traced (the
spec holds one branch). A comparison that holds at every size (``H >= 1``) needs no check; one of sizes that
do not follow the input's (a channel count) is dropped after the second run (:func:`drop_fixed`), which sees
them unchanged at other input sizes. A comparison of the sizes of two nodes, which no layer reads, is refused.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import sympy

from ..spec_values import check_identifier
from .sizes import Dim, TracedSize, shown, spec_size

if TYPE_CHECKING:
    from .dispatch import Builder
    from .recorder import Call

SYMBOLS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
DECIDE = {"eq": sympy.Eq, "ne": sympy.Ne, "lt": sympy.Lt, "le": sympy.Le, "gt": sympy.Gt, "ge": sympy.Ge}
VALUES = "_values"
"""The layer's private entry: the comparison without node names and the two sides' values when traced, which
:func:`drop_fixed` matches and compares between the runs (and removes before the spec is written)."""


def write_checks(builder: Builder, call: "Call") -> None:
    """The ``size_check`` layers of the comparisons made since the call before ``call``."""
    for relation, left, right, holds, where in call.compared:
        try:
            decided = DECIDE[relation](left, right)
        except TypeError:
            decided = None
        if decided in (sympy.true, sympy.false) or sympy.simplify(left - right).is_number:
            continue  # the same at every size (H >= 1, H == H)
        symbols = {symbol for side in (left, right) for symbol in side.free_symbols}
        tensors = {
            symbol: builder.size_tensors[symbol.index]
            for symbol in symbols
            if isinstance(symbol, Dim) and symbol.index < len(builder.size_tensors)
        }
        names = {builder.node(tensor) for tensor in tensors.values()}
        if len(tensors) != len(symbols) or len(names) != 1 or not isinstance(next(iter(names)), str):
            builder.fail(
                call,
                f"follows a branch on {_text(relation, left, right)} ({holds} when traced, at "
                f"{where}), sizes of {'several tensors' if len(names) > 1 else 'no traced node'}, "
                "which the spec cannot check at run time",
                "compare sizes of one tensor, or take the branch on a Python setting (--arg)",
            )
            continue
        name = next(iter(names))
        tensor = next(iter(tensors.values()))

        def resolve(dim: Dim, name=name):
            return name, dim.dim

        sides = [_side(side, resolve) for side in (left, right)]
        if any(side is None for side in sides):
            builder.fail(
                call,
                f"follows a branch on {_text(relation, left, right)} ({holds} when traced, at {where}),"
                " sizes the spec cannot write",
                "compare sizes read from one tensor's shape",
            )
            continue
        values = [
            int(side.xreplace({symbol: tensors[symbol].shape[symbol.dim] for symbol in symbols}))
            if isinstance(side, sympy.Basic)
            else int(side)
            for side in (left, right)
        ]  # and the sizes it reads: a check of sizes that follow the input is no fixed one (W % 2 == 1 at 5, 15)
        values += [int(tensors[symbol].shape[symbol.dim]) for symbol in sorted(symbols, key=str)]
        layer = {
            "op": "size_check",
            "in": name,
            "left": sides[0],
            "right": sides[1],
            "relation": relation,
            "holds": bool(holds),
            "line": where.rsplit("/", 1)[-1],
            "text": _short(_text(relation, _named(left, ""), _named(right, "")), name),
            VALUES: (_text(relation, _named(left, ""), _named(right, "")), values),
        }
        builder.name(tensor, emitted(builder, call, layer))  # every later read of the node goes through the check


def emitted(builder: Builder, call: "Call", layer: dict) -> str:
    """``layer``, a ``size_check`` made at ``call``, appended to the spec; the name of its output."""
    builder.layers.append(layer)
    builder.layer_calls.append(call)
    layer["out"] = builder.out_name("size_check", call)
    return layer["out"]


def _side(expr: sympy.Expr, resolve) -> Any:
    if not expr.free_symbols:
        return int(expr) if expr.is_Integer else None
    return spec_size(TracedSize(0, expr), resolve)


def _named(expr: sympy.Expr, name: str) -> sympy.Expr:
    """``expr`` with each size written as the node's (``x.shape[2]``; ``shape[2]`` without a name)."""
    return expr.xreplace(
        {
            symbol: sympy.Symbol(f"{name}{'.' if name else ''}shape[{symbol.dim}]")
            for symbol in expr.free_symbols
            if isinstance(symbol, Dim)
        }
    )


def _short(text: str, name: str) -> str:
    """The check's message: the comparison and the node, within a generated line's width."""
    return f"{text} of {name}" if len(text) + len(name) < 60 else text


def _text(relation: str, left: sympy.Expr, right: sympy.Expr) -> str:
    return f"{shown(left)} {SYMBOLS[relation]} {shown(right)}"


def drop_fixed(spec: dict, other: dict | None, *more: dict) -> list[int]:
    """Remove the checks whose sides came out the same at the second run's sizes (``other``'s layers) and at
    ``more`` runs' (the run at another dim 1, ``rerun.dim_one_pins``): a comparison of sizes that do not
    follow the input's (a channel count, a fixed window) needs none; every later read of a removed check's
    output reads its input again. Without a second run every check stays."""
    layers = spec["layers"]
    runs: list[dict[tuple, list]] = []  # each other run's checks by line and comparison, in order
    for run in (other, *more) if other else ():
        again: dict[tuple, list] = {}
        for layer in run["layers"]:
            if layer["op"] == "size_check":
                key, values = layer.get(VALUES, ("", None))
                again.setdefault((layer["line"], key), []).append(values)
        runs.append(again)
    renamed: dict[str, str] = {}
    kept, indices = [], []
    for index, layer in enumerate(layers):
        layer = renamed_nodes(layer, renamed)
        if layer["op"] == "size_check":
            key, values = layer.pop(VALUES, ("", None))
            same = [
                bool(twins) and twins.pop(0) == values for twins in (again.get((layer["line"], key)) for again in runs)
            ]
            if same and all(same):
                renamed[layer["out"]] = layer["in"]
                continue
        kept.append(layer)
        indices.append(index)
    spec["layers"] = kept
    for key in ("loss", "outputs"):
        if spec.get(key) is not None:
            spec[key] = renamed_nodes(spec[key], renamed)
    return indices


def renamed_nodes(value: Any, renamed: dict[str, str]) -> Any:
    if not renamed:
        return value
    if isinstance(value, str):
        return renamed.get(value, value)
    if isinstance(value, list):
        return [renamed_nodes(item, renamed) for item in value]
    if isinstance(value, dict):
        return {key: (item if key in ("op", "out") else renamed_nodes(item, renamed)) for key, item in value.items()}
    return value


def checked_first(spec: dict, calls: list, checks: list[tuple[str, int, int, str, str, str]]) -> None:
    """Put a ``size_check`` of ``INPUT.shape[dim] == size`` for each ``(input, dim, size, line, why, where)``
    first in ``spec``'s layers, in that order (and a call for each in ``calls``, at ``where``, in no module);
    every later read of the input reads it through its checks."""
    taken = {layer.get("out") for layer in spec["layers"]} | set(spec["inputs"])
    layers, made, renamed = [], [], {}
    for key, dim, size, line, why, where in checks:
        current = renamed.get(key, key)
        out = _free(_check_name(key, dim), taken)
        layers.append(
            {
                "op": "size_check",
                "in": current,
                "left": {"like": current, "dims": [dim]},
                "right": int(size),
                "relation": "eq",
                "holds": True,
                "line": line,
                "text": f"{key}.shape[{dim}] == {size}",
                "why": why,
                "out": out,
            }
        )
        made.append(where)
        renamed[key] = out
    spec["layers"] = layers + [renamed_nodes(layer, renamed) for layer in spec["layers"]]
    for key in ("loss", "outputs"):
        if spec.get(key) is not None:
            spec[key] = renamed_nodes(spec[key], renamed)
    if calls:
        first = calls[0]
        calls[:0] = [
            dataclasses.replace(first, name="size_check", module="", leaf=False, where=where) for where in made
        ]


def pin_dim_one(spec: dict, calls: list, pins: dict[str, tuple[int, str, str]]) -> None:
    """Check dim 1 of each input of ``pins`` (``rerun.dim_one_pins``: ``{input: (traced size, file:line, what
    follows it)}``) at its traced size: a number the spec holds follows it, which no form of the spec writes, so
    the generated code and ``symgrad.bind`` refuse another size of that dim in one line, not compute otherwise
    than the model. Then every check of an int64 input moves to where it is read (:func:`int_checks_where_read`)."""
    checks = []
    for key, (size, where, what) in pins.items():
        line = where.rsplit("/", 1)[-1]
        checks.append((key, 1, size, line, f"{what} there follows it", where))
    checked_first(spec, calls, checks)
    int_checks_where_read(spec, calls)


def int_checks_where_read(spec: dict, calls: list) -> None:
    """Each ``size_check`` of an int64 input (token ids: its dim-1 pin, ``assert t <= self.block_size``) on the
    output of the first layer that reads the input instead, every later read of that output going through it
    (``emb_checked = _size_check(emb, ids.shape[1] == 6, ...)``): the rules read an int64 input through index
    operands alone. Where no layer reads it (a loss's target), on the loss's input."""
    integers = {key for key, item in spec["inputs"].items() if item.get("dtype") == "int64"}
    moved: dict[str, list] = {}  # input -> its checks, in order, each with its call (or None)
    layers, made = [], []
    renamed: dict[str, str] = {}
    for index, layer in enumerate(spec["layers"]):
        layer = renamed_nodes(layer, renamed)
        if layer["op"] == "size_check" and layer["in"] in integers:
            renamed[layer["out"]] = layer["in"]  # every later read of the check reads the input again
            moved.setdefault(layer["in"], []).append((layer, calls[index] if calls else None))
            continue
        layers.append(layer)
        made.append(calls[index] if calls else None)
    if not moved:
        return
    spec["layers"] = layers
    for part in ("loss", "outputs"):
        if spec.get(part) is not None:
            spec[part] = renamed_nodes(spec[part], renamed)
    for key, checks in moved.items():
        layers = spec["layers"]
        reader = next((index for index, layer in enumerate(layers) if _reads(layer, key)), None)
        if reader is None:  # a loss's target: the loss's input has its value
            node = (spec.get("loss") or {}).get("in")
            node = node if isinstance(node, str) else next(name for name in spec["inputs"] if name not in integers)
            reader = next((index for index, layer in enumerate(layers) if layer["out"] == node), -1)
        node, at = layers[reader]["out"] if reader >= 0 else node, reader + 1
        taken = {layer.get("out") for layer in layers} | set(spec["inputs"])
        current, inserted = node, []
        for layer, call in checks:
            out = _free(f"{node}_checked", taken)
            inserted.append({**layer, "in": current, "out": out})
            made.insert(at + len(inserted) - 1, call)
            current = out
        renamed = {node: current}
        spec["layers"] = [*layers[:at], *inserted, *(renamed_nodes(layer, renamed) for layer in layers[at:])]
        for part in ("loss", "outputs"):
            if spec.get(part) is not None:
                spec[part] = renamed_nodes(spec[part], renamed)
    if calls:
        calls[:] = made


def _reads(layer: dict, key: str) -> bool:
    """Whether ``layer`` reads the node ``key`` as an operand (not a size reference, ``{like: key}``)."""
    return any(
        value == key or (isinstance(value, list) and key in value)
        for name, value in layer.items()
        if name not in ("op", "out")
    )


def _check_name(key: str, dim: int) -> str:
    """The name of the check of ``key``'s size ``dim``: ``x_size0``, or ``size0_of_mask`` where the first is
    not allowed in generated code (an input ``mask`` or ``grad_x``: ``mask_`` and ``grad_`` are reserved)."""
    return next(
        (name for name in (f"{key}_size{dim}", f"size{dim}_of_{key}") if check_identifier(name) is None),
        f"size{dim}_checked",
    )


def _free(name: str, taken: set) -> str:
    found, number = name, 2
    while found in taken:
        found, number = f"{name}_{number}", number + 1
    taken.add(found)
    return found
