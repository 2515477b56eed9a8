"""What the walk records about values: tensors no op made (``Source``), refusals (``Problem``, one line
each), loss values (``Reduction``), node names, and the literal form of arguments.

Shared by ``layers.py`` (the walk) and the files that turn families of calls into layers.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from ..spec_values import RESERVED_PREFIXES
from ..spec_yaml import MAX_NAME
from .recorder import Call


@dataclass
class Problem:
    where: str
    module: str
    op: str
    what: str
    fix: str

    def __str__(self) -> str:
        inside = f" (in {self.module})" if self.module else ""
        return f"{self.where}: error: '{self.op}'{inside} {self.what} (fix: {self.fix})"


def report(problems: list[Problem]) -> list[str]:
    """One line per source line, in the order first met, naming the module instances that share it
    (``(in 6 modules: layer1.0, layer1.1, layer1.2, ...)``); where one line holds several refused calls
    (``x.new_empty(...).bernoulli_(p)``), the others follow on the same line. Every source line is kept."""
    groups: dict[str, dict[str, list[Problem]]] = {}
    for problem in problems:
        groups.setdefault(problem.where, {}).setdefault(problem.op, []).append(problem)
    lines = []
    for by_op in groups.values():
        texts = []
        for group in by_op.values():
            modules = list(dict.fromkeys(problem.module for problem in group if problem.module))
            first = group[0]
            if len(modules) > 1:
                shown = ", ".join(modules[:3]) + (", ..." if len(modules) > 3 else "")
                first = Problem(first.where, f"{len(modules)} modules: {shown}", first.op, first.what, first.fix)
            texts.append(str(first))
        lines.append(texts[0] + "".join("; on the same line, " + text.split(": error: ", 1)[1] for text in texts[1:]))
    return lines


@dataclass
class Reduction:
    """A loss value: ``scale * reduce(...)`` of an elementwise node, or of a PyTorch loss call."""

    how: str
    """``sum``, ``mean``, ``per_sample``, or ``none`` (a loss call's elementwise values)."""
    source: str | None = None
    loss: dict | None = None
    scale: float = 1.0
    call: Call | None = None


@dataclass
class Source:
    """A tensor the traced code reads that no traced op made: an argument, parameter, buffer or global."""

    name: str
    trainable: bool
    state_key: str | None = None
    """Its key in the traced model's ``state_dict()``, for a parameter or buffer of that model."""


PER_DIMENSION = {"stride", "padding", "dilation", "output_padding", "kernel_size"}
"""Arguments with one int per spatial dim: one repeated value is written once (``padding: 1``)."""


def literal(value: Any, key: str = "") -> Any:
    """A YAML-safe copy of an argument: tuples become lists."""
    if isinstance(value, torch.Size):
        value = tuple(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and type(value) not in (int, float):
        return (int if isinstance(value, int) else float)(value)  # a size that carries its dims (sizes.TracedSize)
    if isinstance(value, (tuple, list)):
        items = [literal(item) for item in value]
        if key in PER_DIMENSION and items and len(set(items)) == 1 and all(type(item) is int for item in items):
            return items[0]
        return items
    return value


def call_sizes(call: Call, *keywords: str) -> tuple:
    """The ints after the tensor of ``x.view(2, -1)``, ``x.view((2, -1))`` or ``x.permute(dims=(0, 2, 1))``."""
    for keyword in keywords:
        if keyword in call.keywords:
            return tuple(call.keywords[keyword])
    sizes = call.arguments[1:]
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list, torch.Size)):
        return tuple(sizes[0])
    return tuple(sizes)


def plain_name(text: str) -> str:
    return re.sub(r"\W", "_", text).strip("_")


def fitted(name: str, room: int = MAX_NAME) -> str:
    """``name`` within ``room`` characters (a spec's names have at most 64): a longer one keeps its start
    and its end, with a digest of the whole between them, so that two long names stay two (RepViT's
    79-character parameter paths, FastViT's 63-character attribute called twice)."""
    if len(name) <= room:
        return name
    digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:6]
    tail = min(20, (room - len(digest) - 2) // 2)
    head = room - len(digest) - 2 - tail
    return f"{name[:head]}_{digest}_{name[len(name) - tail :]}"


def numbered(base: str, number: int) -> str:
    """``base_<number>`` (the number-th node of that name), ``base`` shortened where that would not fit;
    ``base<number>`` where ``base_`` is a prefix the generated code reserves (a second top-level ``mean``:
    ``mean2``, never ``mean_2``, which no number makes a name the spec takes)."""
    for suffix in (f"_{number}", str(number)):
        name = fitted(base, MAX_NAME - len(suffix)) + suffix
        if not name.startswith(RESERVED_PREFIXES):
            return name
    return name


def storage_of(tensor: torch.Tensor) -> int:
    """Where a tensor's entries live, shared by its views (every recorded tensor stays alive, so no other
    takes its place)."""
    return tensor.untyped_storage().data_ptr()


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def flat_arguments(arguments, keywords):
    for value in [*arguments, *keywords.values()]:
        if isinstance(value, (tuple, list)):
            yield from value
        else:
            yield value
