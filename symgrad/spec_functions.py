"""The ``checked_functions:`` section of a traced spec: each custom ``torch.autograd.Function`` whose
forward's ops the spec holds, traced through because its own backward was checked equal to that forward's
derivative (``symgrad.trace.custom_functions``), with the largest differences the check found:

    checked_functions:
      LayerNormFunction: {first_order: 2.2e-16, second_order: 0.87}

``second_order`` is the same check one order up (the Function's backward differentiated against its
forward's second derivative), or ``not differentiable`` where autograd cannot differentiate that backward.
Only an identifier and two numbers (or that phrase) reach the documents, and a spec that names a Function
whose first order was not equal is refused: nothing traces it so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from .errors import Location, SpecError

TOLERANCE = 1e-10
"""The largest relative difference the check takes as equal (``custom_functions.TOLERANCE``)."""
NOT_DIFFERENTIABLE = "not differentiable"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}\Z")
KEYS = ("first_order", "second_order")


@dataclass(frozen=True)
class CheckedFunction:
    name: str
    first_order: float
    second_order: float | None
    """None: its backward is not differentiable."""
    location: Location

    @property
    def second_equal(self) -> bool:
        return self.second_order is not None and self.second_order <= TOLERANCE

    def sentence(self) -> str:
        """What the derivation documents say of it (plain text and backticks: valid in both)."""
        said = (
            f"`{self.name}`'s backward was checked equal to its forward's derivative (largest relative "
            f"difference {self.first_order:.1e}, float64, random arguments and cotangent at its traced shapes "
            "and at other sizes), so its forward's ops are derived here"
        )
        if self.second_equal:
            return (
                said + f"; its own derivative was checked equal to its forward's second derivative too "
                f"({self.second_order:.1e})."
            )
        if self.second_order is None:
            return (
                said + ". To second order it was not: autograd cannot differentiate its backward, so second "
                "derivatives through this module (`create_graph=True`) are its forward's, where autograd "
                "through the model raises."
            )
        return (
            said + f". To second order it was not: its backward's own derivative differs from its forward's "
            f"second derivative by {self.second_order:.2g}, so second derivatives through this module "
            "(`create_graph=True`) are its forward's, where autograd through the model gives its backward's."
        )


def parse_checked_functions(value: Any, location: Location) -> tuple[CheckedFunction, ...]:
    def refuse(what: str, where: Location | None = None) -> SpecError:
        return SpecError(
            f"checked_functions {what}",
            where or location,
            "trace the model again (symgrad trace ...); this section is written by the trace",
        )

    if not isinstance(value, dict):
        raise refuse("must be a mapping of Function names to {first_order, second_order}")
    places = getattr(value, "value_locations", {})
    found = []
    for name, entry in value.items():
        where = places.get(name, location)
        if not isinstance(name, str) or not NAME.match(name):
            raise refuse(f"has {name!r:.60}, not a Function's class name", where)
        if not isinstance(entry, dict) or set(entry) != set(KEYS):
            raise refuse(f"entry {name!r} must be a mapping of {' and '.join(KEYS)}", where)
        first, second = entry["first_order"], entry["second_order"]
        if not _number(first) or not 0 <= first <= TOLERANCE:
            raise refuse(
                f"entry {name!r} has first_order {first!r:.60}: only a Function whose backward was checked "
                f"equal to its forward's derivative (<= {TOLERANCE:g}) is traced through",
                where,
            )
        if second != NOT_DIFFERENTIABLE and not (_number(second) and second >= 0):
            raise refuse(
                f"entry {name!r} has second_order {second!r:.60}, not a difference or '{NOT_DIFFERENTIABLE}'", where
            )
        found.append(
            CheckedFunction(name, float(first), None if second == NOT_DIFFERENTIABLE else float(second), where)
        )
    return tuple(found)


def refuse_second_order(checked: tuple[CheckedFunction, ...], extras: tuple[str, ...]) -> None:
    """Refuse ``hvp`` where a checked Function's backward is not its forward's derivative to second order:
    the hvp would be the forward's, and autograd through the model would give another (or none)."""
    if "hvp" not in extras:
        return
    for function in checked:
        if not function.second_equal:
            why = (
                "autograd cannot differentiate its backward"
                if function.second_order is None
                else f"its backward's own derivative differs from its forward's second derivative by "
                f"{function.second_order:.2g}"
            )
            raise SpecError(
                f"the spec asks for hvp, and the torch.autograd.Function {function.name} was checked "
                f"equal to its forward's derivative to first order only ({why}): the hvp would be its "
                "forward's, which autograd through the model does not give",
                function.location,
                "drop hvp (the gradients are unaffected), or make the Function's backward differentiable "
                "from its inputs (save the inputs, not values its forward computed without a graph) "
                "and trace again",
            )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
