"""A helper written into a module with only the parts its calls use (issue 64 item 5, torchgen's way: the
planner records the facts, one declaration renders what they need).

A :class:`HelperDeclaration` is the helper's source once, as a Jinja template with ``{% if part %}`` around
each optional part (a reduction's branch, a keyword few calls pass), and for each primitive that calls it,
which parts one call needs. :func:`symgrad.schedule.helpers_of` takes the union over a module's calls
(:class:`HelperUse`); the renderer writes :meth:`HelperUse.source`. A ResNet's ``_cross_entropy_backward``
(a mean over [N, C] scores) then has no branch for a per-sample loss over an image's pixels; a module with
both keeps both. Every part on is the general helper, whatever the calls."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable

import jinja2


@dataclasses.dataclass(frozen=True, eq=False)
class HelperDeclaration:
    """One helper function, its optional parts named (``Primitive.helper`` of the primitives that call it)."""

    template: str
    """The helper's source, ``{% if part %}`` around each optional part (the template's only names)."""
    parts: tuple[str, ...]
    callers: dict[str, Callable[..., Iterable[str]]]
    """Primitive name -> the parts one call of it needs (from its :class:`~symgrad.algebra.TensorOp`): the
    primitive whose ``helper`` this is, and any whose own helper calls this one (all parts, say)."""
    kept_casts: frozenset[str] = frozenset()
    """The parts a module needs where it keeps a value as ``(copy, dtype)`` (``_saved_as_autocast_casts``)."""

    def __post_init__(self):
        for name in self.callers:
            DECLARATIONS.setdefault(name, []).append(self)

    @property
    def whole(self) -> str:
        """The helper with every part: what any call may pass."""
        return self.source(frozenset(self.parts))

    def source(self, parts: frozenset[str]) -> str:
        """The helper with ``parts`` (a subset of :attr:`parts`) and nothing else."""
        unknown = set(parts) - set(self.parts)
        if unknown:
            raise ValueError(f"no part {sorted(unknown)} in the helper (its parts: {list(self.parts)})")
        return _compiled(self.template).render({part: part in parts for part in self.parts})


DECLARATIONS: dict[str, list[HelperDeclaration]] = {}
"""Primitive name -> the declared helpers its calls need (:attr:`HelperDeclaration.callers`)."""


@dataclasses.dataclass(frozen=True)
class HelperUse:
    """A declared helper as one module calls it: the parts its calls need (the planner's fact)."""

    declaration: HelperDeclaration
    parts: frozenset[str]

    @property
    def source(self) -> str:
        return self.declaration.source(self.parts)


def helper_source(helper: str | HelperUse) -> str:
    """The source of a module's helper: a plain helper's text, or a declared one's for its parts."""
    return helper if isinstance(helper, str) else helper.source


@functools.cache
def _compiled(template: str) -> jinja2.Template:
    environment = jinja2.Environment(
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    return environment.from_string(template)
