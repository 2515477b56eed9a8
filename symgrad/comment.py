"""A backward statement's comment as its parts, made its text once, where the line is printed.

``symgrad.reverse`` makes one for each gradient it sums or pulls back: the forward node it is about
and the names it reaches (a pullback's quoting that node's forward line as a target and a value).
Planning renames the symbols of that line (``plan.renamed_statements``: ``params["fc.weight"]``), and
``symgrad.emit`` makes the text, with the final names, as it prints the line: a pullback to several
operands under one comment, a fused kernel's call with its formulas. No text is edited after it is made.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .printing import to_code


@dataclass(frozen=True)
class Comment:
    """A backward statement's comment as its parts: the forward node it is about and the names it
    reaches, made its text once, where the line is printed (``str``, in :mod:`symgrad.emit`). A
    renaming reaches the names of the forward line it quotes (``plan.renamed_statements``), never text.

    ``kind``: ``pullback`` (``node``'s forward line, ``quoted``, pulled back to the operands
    ``names``), ``sum`` (``node`` read by ``names``: their gradients add up), ``joined`` (``node`` cut
    into ``names``, their gradients joined in one ``kernel``), ``output`` (``node`` is output
    ``names[0]``) or ``kernel`` (a fused kernel's call, ``names`` the formulas of what it returns)."""

    kind: str
    node: str
    names: tuple[str, ...]
    quoted: tuple[sympy.Symbol, sympy.Expr] | None = None
    """A pullback's forward line: its target and its value, as the emitted Python runs it."""
    kernel: str = ""

    def __str__(self) -> str:
        names = ", ".join(self.names)
        if self.kind == "pullback":
            target, value = self.quoted
            reached = names if len(self.names) == 1 else ", ".join(self.names[:-1]) + " and " + self.names[-1]
            return f"{target.name} = {to_code(value)}: pulled back to its {reached}"
        if self.kind == "sum":
            return f"{self.node} feeds {names}: the gradients from every path add up"
        if self.kind == "joined":
            split = "unbind" if self.kernel == "stack" else "split"
            return (
                f"{self.node} is cut into {names}: their gradients joined in one {self.kernel}, "
                f"as autograd's {split} backward joins them"
            )
        if self.kind == "output":
            return f"{self.node} is output {names}: its gradient is the caller's cotangent"
        assert self.kind == "kernel", self.kind
        return f"{self.node}: {names}"
