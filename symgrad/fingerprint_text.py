"""The fingerprint as the generated module writes it (:func:`module_constants`): ``FINGERPRINT``, the
table itself, or where submodules share rows its compact form (each distinct row once, a block's
submodules once for all its instances), which :func:`symgrad.fingerprint.unfolded` unfolds for bind;
``MOMENTA`` read off the table where it can be; ``FROZEN`` and ``GUARDS``. The fingerprint itself, and
bind's comparison, are :mod:`symgrad.fingerprint`'s.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .fingerprint import ROW_DEFAULTS, summary, unfolded


def _split_key(key: Any, inner: str, width: int) -> str:
    """A dict key as written after ``inner``: a string too long for ``width`` columns as parenthesised pieces
    that Python joins (split after a ``/`` where it has one), any other key as it is."""
    text = json.dumps(key) if isinstance(key, str) else repr(key)
    if not isinstance(key, str) or len(inner) + len(text) + 1 <= width:
        return inner + text
    room = width - len(inner) - 4
    pieces, piece = [], ""
    for part in re.split(r"(?<=/)", key):
        while len(json.dumps(piece + part)) > room and (piece or len(json.dumps(part)) > room):
            if piece:
                pieces.append(piece)
                piece = ""
            else:
                cut = max(1, room - 2)
                pieces.append(part[:cut])
                part = part[cut:]
        piece += part
    pieces.append(piece)
    return f"{inner}(" + f"\n{inner} ".join(json.dumps(each) for each in pieces) + ")"


def python_literal(value: Any, indent: int = 0, lead: int = 0, width: int = 100, packed: bool = False) -> str:
    """``value`` (checked literals) as Python source: on one line where it fits in ``width`` columns
    after ``lead`` of them, else one entry per line, indented by ``indent`` + 4 (``packed``: a list's
    entries as many to a line as fit, as a table's)."""

    def flat(item) -> str:
        if isinstance(item, dict):
            return "{" + ", ".join(f"{flat(key)}: {flat(entry)}" for key, entry in item.items()) + "}"
        if isinstance(item, list):
            return "[" + ", ".join(flat(entry) for entry in item) + "]"
        if isinstance(item, str):
            return json.dumps(item)
        return repr(item)

    one_line = flat(value)
    if not isinstance(value, (dict, list)) or not value or lead + len(one_line) + 1 <= width:
        return one_line
    inner = " " * (indent + 4)
    if isinstance(value, list) and packed:
        lines = []
        for entry in (f"{flat(entry)}," for entry in value):
            if lines and len(lines[-1]) + 1 + len(entry) <= width:
                lines[-1] += " " + entry
            else:
                lines.append(inner + entry)
        return "[\n" + "\n".join(lines) + "\n" + " " * indent + "]"
    if isinstance(value, list):
        lines = [f"{inner}{python_literal(entry, indent + 4, indent + 4, width)}," for entry in value]
        return "[\n" + "\n".join(lines) + "\n" + " " * indent + "]"
    lines = []
    for key, entry in value.items():
        line = f"{inner}{flat(key)}: {python_literal(entry, indent + 4, indent + 6 + len(flat(key)), width)},"
        if len(line) > width and "\n" not in line:  # a long key (a guarded function's path): its value below it
            line = (
                f"{_split_key(key, inner, width)}:\n{inner}    {python_literal(entry, indent + 8, indent + 8, width)},"
            )
        lines.append(line)
    return "{\n" + "\n".join(lines) + "\n" + " " * indent + "}"


def module_constants(
    spec, any_width: bool = False, running: frozenset = frozenset(), instances: dict | None = None, momenta=None
) -> tuple[str, bool]:
    """``FINGERPRINT``, ``FROZEN`` and ``GUARDS`` for the generated module of a traced ``spec`` (Python
    source from its checked literals), or "" for a spec without a fingerprint; ``running``: the inputs
    that are running statistics, which the module lists in ``RUNNING`` instead; ``instances``: block
    name by instance path, naming the groups of rows; ``momenta``: (module paths, the one momentum
    as written) of the training-mode batch norms, written here as read off the fingerprint where it
    is the table itself and they are its BatchNorms run in training mode (True is then returned
    with the text)."""
    if spec.fingerprint is None:
        return "", False
    wrt = {name for name, _ in spec.wrt}
    frozen = sorted({item.source for item in spec.inputs if item.source and item.name not in wrt | running})
    summaries = {path: list(summary(entry, any_width)) for path, entry in spec.fingerprint.items()}
    rows, numbers = _distinct_rows(summaries)
    read = (
        momenta is not None
        and len(rows) == len(summaries)  # the table itself, not its compact form
        and list(momenta[0]) == [path for path, row in summaries.items() if row[4] and row[5]]
    )
    frozen_text = (  # none: no line (bind reads a module without FROZEN as freezing nothing)
        "\n# the state_dict() keys read without a gradient, RUNNING aside: other buffers, and the\n"
        "# parameters frozen when traced (symgrad.bind refuses them unfrozen)\n"
        f"FROZEN = {python_literal(frozen, lead=9, packed=True)}"
        if frozen
        else ""
    )
    text = (
        _fingerprint_literal(summaries, instances or {}, rows, numbers)
        + (
            "\n# a BatchNorm run in training mode (row[4], row[5]) moves its running statistics by its momentum\n"
            f"MOMENTA = dict.fromkeys([path for path, row in FINGERPRINT.items() if row[4] and row[5]], {momenta[1]})\n"
            'RUNNING = {f"{module}.{name}" for module in MOMENTA for name in ("running_mean", "running_var")}'
            if read
            else ""
        )
        + frozen_text
        + (
            "\n# what else the traced forward read (symgrad.guards): its code, literals and non-tensor arguments\n"
            f"GUARDS = {python_literal(_guards(spec.guards), lead=9)}"
            if spec.guards
            else ""
        )
    )
    return text, read


HEADING = "# what symgrad.bind checks: per submodule class, hashes of code, hypers, shapes; mode, BN runs"
COMPACT = "# what symgrad.bind checks: rows (class; code, hypers, shapes hashed; mode, BN runs), paths, groups"
"""The compact form's one heading: each distinct row once, each path's row number (or its group's name), a
block's submodules once in its group; :func:`symgrad.fingerprint.unfolded` unfolds it for bind."""


def _groups(numbers: dict[str, int], instances: dict[str, str], classes: dict[str, str]) -> tuple[dict, dict]:
    """``numbers`` (path -> row) as paths and groups: the submodules of a block's instances (``instances``:
    block by instance path, where the block has several) by path under the instance, once, each
    instance with its rows' numbers where they differ from the first's (a drop-path rate); elsewhere a
    subtree met more than once with the same rows (no instance in it), named by its class."""
    paths = list(numbers)
    counted: dict[str, int] = {}
    for block in instances.values():
        counted[block] = counted.get(block, 0) + 1

    def subtree(index: int) -> tuple[tuple, tuple]:
        path, inside = paths[index], [("", numbers[paths[index]])]
        for other in paths[index + 1 :]:
            if path and not other.startswith(path + "."):
                break
            inside.append((other[len(path) + 1 :] if path else other, numbers[other]))
        return tuple(relative for relative, _ in inside), tuple(number for _, number in inside)

    shapes = [subtree(index) if index else ((), ()) for index in range(len(paths))]  # the root is never a group
    holds = {path for path in paths for instance in instances if instance == path or instance.startswith(path + ".")}
    counts: dict[tuple, int] = {}
    for path, shape in zip(paths, shapes):
        counts[shape] = counts.get(shape, 0) + (len(shape[0]) > 1 and path not in holds)
    top: dict[str, int | str | tuple] = {}
    groups: dict[str, dict] = {}
    named: dict[tuple, str] = {}
    skip = ""
    for index, path in enumerate(paths):
        if skip and path.startswith(skip):
            continue
        relatives, rows = shapes[index]
        block = instances.get(path) if counted.get(instances.get(path), 0) > 1 and len(relatives) > 1 else None
        if block is None and counts.get(shapes[index], 0) < 2:
            top[path] = numbers[path]
            continue
        key = (block, relatives) if block else shapes[index]
        if key not in named:
            base = name = block or classes[path]
            count = 1
            while name in groups:  # another subtree of the same block or class
                count += 1
                name = f"{base}_{count}"
            named[key] = name
            groups[name] = dict(zip(relatives, rows))
        name = named[key]
        top[path] = name if tuple(groups[name].values()) == rows else (name, list(rows))
        skip = path + "."
    return top, groups


def _distinct_rows(summaries: dict[str, list]) -> tuple[list[str], dict[str, int]]:
    """Each distinct row as written (its tail of defaults left out, :func:`_shortened`), and each path's
    row by number."""
    rows: list[str] = []
    numbers = {}
    for path, row in summaries.items():
        text = python_literal(_shortened(row), indent=4, lead=4)
        numbers[path] = rows.index(text) if text in rows else rows.append(text) or len(rows) - 1
    return rows, numbers


def _fingerprint_literal(summaries: dict[str, list], instances: dict[str, str], rows=None, numbers=None) -> str:
    """``FINGERPRINT = ...``: the table itself, or where submodules share their row (every ReLU, each
    block's convolutions alike) its compact form ``(rows, paths, groups)``: each distinct row written
    once, numbered, and each submodule's number in the model's order (the order bind compares them
    in), a block's submodules once for all its instances (:func:`_groups`); a few lines instead of one
    per submodule, which :func:`symgrad.fingerprint.unfolded` unfolds to the same table."""
    if rows is None:
        rows, numbers = _distinct_rows(summaries)
    if len(rows) == len(summaries):
        return f"{HEADING}\n" + f"FINGERPRINT = {python_literal(summaries, lead=14)}"
    top, groups = _groups(numbers, instances, {path: row[0] for path, row in summaries.items()})
    distinct = {number: _shortened(summaries[path]) for path, number in reversed(numbers.items())}
    if unfolded((distinct, top, groups)) != summaries:  # bind's unfolding gives the table back
        raise AssertionError("the fingerprint's rows and groups do not give its table back")
    table = _packed_rows(rows)
    grouped = "".join(_group_text(name, group) for name, group in groups.items())
    return f"{COMPACT}\nFINGERPRINT = ([\n{table}], {{\n{_packed(top, 4)}\n}}, {{\n{grouped}}})"


def _group_text(name: str, group: dict) -> str:
    """A group's entry, ``"name": {"path": row, ...},``: its pairs as many to a line as fit 100 columns,
    a longer group's next lines under its first pair."""
    head = f"    {json.dumps(name)}: {{"
    lines = [head]
    for pair in (f"{json.dumps(path)}: {_number_text(number)}" for path, number in group.items()):
        if lines[-1] != head and len(lines[-1]) + len(pair) + 4 > 100:  # ", " before it, "}," (the last) after
            lines[-1] += ","
            lines.append(" " * len(head) + pair)
        else:
            lines[-1] += ("" if lines[-1] == head else ", ") + pair
    return "\n".join(lines) + "},\n"


def _shortened(row: list) -> list:
    """``row`` without the tail :func:`symgrad.fingerprint.unfolded` puts back (no code of its own, no
    hypers, no tensors, no mode read, no BatchNorm run)."""
    while len(row) > 1 and row[-1] == ROW_DEFAULTS[len(row) - 1]:
        row = row[:-1]
    return row


def _packed_rows(rows: list[str]) -> str:
    """The rows as many to a line as fit 100 columns, each line ending with its rows' numbers."""
    lines: list[tuple[int, str]] = []  # (first number, text)
    for number, row in enumerate(rows):
        if lines:
            first, text = lines[-1]
            joined = f"{text} {row},"
            if len(f"    {joined}  # {first}-{number}") <= 100:
                lines[-1] = (first, joined)
                continue
        lines.append((number, f"{row},"))
    ends = [first for first, _ in lines[1:]] + [len(rows)]
    return "".join(
        f"    {text}  # {first}\n" if end - first == 1 else f"    {text}  # {first}-{end - 1}\n"
        for (first, text), end in zip(lines, ends)
    )


def _packed(numbers: dict, indent: int) -> str:
    """``"path": row,`` pairs as many to a line as fit 100 columns, indented by ``indent``."""
    lines = [""]
    for path, number in numbers.items():
        pair = f"{json.dumps(path)}: {_number_text(number)},"
        if indent + len(pair) > 100 and isinstance(number, tuple):  # an instance's own numbers, wrapped
            lines += [" " * indent + f"{json.dumps(path)}: ({json.dumps(number[0])}, [", " " * (indent + 4)]
            for entry in (f"{each}," for each in number[1]):
                if len(lines[-1]) + 1 + len(entry) > 100:
                    lines.append(" " * (indent + 4))
                lines[-1] += ("" if lines[-1].isspace() else " ") + entry
            lines += [" " * indent + "]),", ""]
            continue
        if lines[-1] and len(lines[-1]) + 1 + len(pair) > 100:
            lines.append("")
        lines[-1] += (" " if lines[-1] else " " * indent) + pair
    return "\n".join(line for line in lines if line)


def _number_text(number) -> str:
    """A path's entry: its row's number, its group's name, or ``("group", [numbers])``."""
    return f"({json.dumps(number[0])}, {json.dumps(number[1])})" if isinstance(number, tuple) else json.dumps(number)


def _guards(guards: dict) -> dict:
    """``GUARDS`` as written: its ``values`` and ``arguments`` only where there are some (read with
    ``.get``), so a model's code is the table's one entry where the forward read nothing else."""
    return {key: value for key, value in guards.items() if value or key == "code"}
