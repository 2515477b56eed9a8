"""Elementwise ops, each defined by one scalar sympy formula.

The formula gives everything: the forward (printed, or a named torch call), the local derivative
(``sympy.diff``), the math in the docs and the row of the ops table. PyTorch takes one-sided
derivatives at kinks with strict inequalities (``relu'(0) = 0``), so every Heaviside step that
sympy produces is taken with ``H(0) = 0``.

Broadcasting is allowed between the two operands of a binary op; the reverse walk sums each
contribution back to its operand's shape (rules never un-broadcast).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import sympy

from ..algebra import op, primitive
from ..printing import to_text
from .base import Checker, Forward, NodeSymbols, Operand, Rule

INPUT, OTHER = sympy.symbols("input other")


def _call_primitive(name: str, call: str, math: Callable[[sympy.Expr], sympy.Expr], inplace: str | None,
                    derivative: Callable[[sympy.Expr], sympy.Expr]):
    def code(operands, params, show):
        return f"{call}({', '.join(operands)})"

    def inplace_code(operands, params, show):
        return f"{inplace}({', '.join(operands)})"

    def latex(operands, params, show):
        from ..printing import to_latex  # the scalar formula, shown with the operand in place

        return to_latex(math(sympy.Symbol("□"))).replace("□", operands[0])

    def tangent(expr, tangent_of):  # f(x) elementwise: d f(x) = f'(x) * dx, with f' from sympy.diff
        (operand,) = expr.operands
        return derivative(operand) * tangent_of(operand)

    primitive(name, code=code, latex=latex, inplace=inplace_code if inplace else None, tangent=tangent)


@dataclass
class Elementwise(Rule):
    op: str
    formula: Callable[..., sympy.Expr]
    """The scalar forward, as a function of ``input`` (and ``other``)."""
    call: str | None = None
    """The torch call that computes the forward, when not the printed formula (``F.relu``)."""
    local_kind: str = "local"
    """The name given to a non-trivial local derivative: ``mask_relu1``, ``local_t1``."""
    from_output: Callable[[sympy.Symbol], sympy.Expr] | None = None
    """The local derivative written with the op's output instead of its input, when that is exact
    (``H(x) = H(relu(x))``): the input can then be freed after the forward. Tests check the identity."""
    inplace: str | None = None
    """An in-place torch call for the forward (``torch.relu_``), used by the fast function."""
    summary: str = ""
    operands: tuple[Operand, ...] = field(default=(Operand("input", from_in=True),))
    broadcasts = True

    def __post_init__(self):
        if self.call is not None:
            _call_primitive(self.op, self.call, lambda x: self.formula(x), self.inplace,
                            lambda operand: self.local_derivative(INPUT).xreplace({INPUT: operand}))

    @property
    def scalars(self) -> tuple[sympy.Symbol, ...]:
        return (INPUT, OTHER)[: len(self.operands)]

    def scalar_forward(self) -> sympy.Expr:
        return self.formula(*self.scalars)

    def infer_shape(self, shapes, params, check: Checker):
        if len(shapes) == 1:
            return next(iter(shapes.values()))
        left, right = shapes["input"], shapes["other"]
        rank = max(len(left), len(right))
        left, right = (1,) * (rank - len(left)) + tuple(left), (1,) * (rank - len(right)) + tuple(right)
        out = []
        for axis, (a, b) in enumerate(zip(left, right)):
            if check.symbolic:
                check.equal(a, b, "", "")  # the solver keeps operands the same shape
                out.append(a)
                continue
            check.require(a == b or a == 1 or b == 1,
                          f"operands of shapes {shapes['input']} and {shapes['other']} do not broadcast (axis {axis}: {a} vs {b})",
                          "make the sizes equal, or 1 on one side")
            out.append(max(a, b))
        return tuple(out)

    def _substitute(self, expr: sympy.Expr, node: NodeSymbols) -> sympy.Expr:
        return expr.xreplace({scalar: node.operands[operand.name] for scalar, operand in zip(self.scalars, self.operands)})

    def forward(self, node: NodeSymbols) -> Forward:
        math = self._substitute(self.scalar_forward(), node)
        if self.call is None:
            # unevaluated, so sub(x, x) prints as `x - x` (a tensor), never as the number 0
            with sympy.evaluate(False):
                value = self.formula(*(node.operands[operand.name] for operand in self.operands))
            return Forward(value, math)
        return Forward(op(self.op, *(node.operands[operand.name] for operand in self.operands)), math)

    def local_derivative(self, scalar: sympy.Symbol) -> sympy.Expr:
        """``d forward / d scalar`` by ``sympy.diff``, with every Heaviside step taken as H(0) = 0."""
        cache = self.__dict__.setdefault("_derivatives", {})
        if scalar not in cache:
            derivative = sympy.diff(self.scalar_forward(), scalar)
            cache[scalar] = derivative.replace(sympy.Heaviside, lambda argument, *_: sympy.Heaviside(argument, 0))
        return cache[scalar]

    def pullback(self, node: NodeSymbols, grad, wanted):
        grads = {}
        for scalar, operand in zip(self.scalars, self.operands):
            if operand.name not in wanted:
                continue
            if self.from_output is not None:
                local = self.from_output(node.out)
            else:
                local = self._substitute(self.local_derivative(scalar), node)
            if not (local.is_number or local.is_Symbol):
                local = node.local(self.local_kind, local)
            grads[operand.name] = local * grad
        return grads

    def table_row(self):
        derivatives = "; ".join(f"d/d{scalar} = {to_text(self.local_derivative(scalar))}" for scalar in self.scalars)
        return self.op, f"out = {to_text(self.scalar_forward())}", derivatives


def _binary(name: str, formula, summary: str) -> Elementwise:
    return Elementwise(name, formula, summary=summary,
                       operands=(Operand("input", from_in=True), Operand("other", from_in=True, constant_ok=True)))


RULES = [
    Elementwise("relu", lambda x: sympy.Max(0, x), call="F.relu", local_kind="mask",
                from_output=lambda out: sympy.Heaviside(out, 0), inplace="torch.relu_",
                summary="rectified linear unit; its derivative is the Heaviside mask of the input"),
    _binary("add", lambda a, b: a + b, "elementwise sum, broadcasting"),
    _binary("sub", lambda a, b: a - b, "elementwise difference, broadcasting"),
    _binary("mul", lambda a, b: a * b, "elementwise product (or scaling by a constant), broadcasting"),
]
