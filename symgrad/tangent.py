"""Forward mode over the derived statements: closed-form Hessian-vector products.

``hvp(..., tangent_x, ...)`` is the derivative of the gradient along the direction ``tangent``:
``H v = d/de gradients(inputs + e v)``. It is derived here from the same statements ``gradients``
is made of, by pushing a tangent through each one:

- sympy's own algebra for sums, products and powers (the product rule), and ``fdiff`` for
  elementwise functions; a Heaviside mask, a size or a count has zero tangent;
- a :class:`~symgrad.algebra.TensorOp` asks its primitive: linear in each operand (a convolution's
  adjoints, a sum, a reshape: the product rule over operands), or a rule of its own.

A primitive that declares no forward-mode rule is an error, never a silently missing term.
"""

from __future__ import annotations

import sympy

from .algebra import CONSTANT, LINEAR, Params, Size, TensorOp, tensor
from .reverse import Statement, per_sample_statements


class NoTangentRule(NotImplementedError):
    pass


def tangent_of(expr: sympy.Expr, tangents: dict[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
    """The directional derivative of ``expr`` given the tangents of its free tensors."""

    def walk(node: sympy.Expr) -> sympy.Expr:
        if node.is_Symbol:
            moved = tangents.get(node, sympy.Integer(0))
            if isinstance(moved, NoTangentRule):  # its own statement had no rule: needed after all
                raise moved
            return moved
        if node.is_number or isinstance(node, (Size, Params)):
            return sympy.Integer(0)
        if isinstance(node, (sympy.Heaviside, sympy.sign)):  # piecewise constant: zero almost everywhere
            return sympy.Integer(0)
        if isinstance(node, TensorOp):
            rule = node.primitive.tangent
            if rule == CONSTANT:
                return sympy.Integer(0)
            if rule == LINEAR:
                terms = []
                for index, operand in enumerate(node.operands):
                    moved = walk(operand)
                    if moved != 0:
                        operands = list(node.operands)
                        operands[index] = moved
                        terms.append(TensorOp(node.args[0], node.params, *operands))
                return sympy.Add(*terms)
            if callable(rule):
                return rule(node, walk)
            raise NoTangentRule(f"primitive {node.primitive.name!r} has no forward-mode rule")
        if node.is_Add:
            return sympy.Add(*(walk(term) for term in node.args))
        if node.is_Mul:
            terms = []
            for index, factor in enumerate(node.args):
                moved = walk(factor)
                if moved != 0:
                    terms.append(sympy.Mul(*node.args[:index], moved, *node.args[index + 1 :]))
            return sympy.Add(*terms)
        if node.is_Pow and node.exp.is_number:
            moved = walk(node.base)
            return node.exp * node.base ** (node.exp - 1) * moved if moved != 0 else sympy.Integer(0)
        if isinstance(node, sympy.Function) and len(node.args) == 1:
            moved = walk(node.args[0])
            if moved == 0:
                return sympy.Integer(0)
            derivative = node.fdiff(1)
            if derivative.has(sympy.Derivative):
                raise NoTangentRule(f"sympy has no closed-form derivative of {type(node).__name__}")
            return derivative * moved
        raise NoTangentRule(f"no forward-mode rule for {type(node).__name__}")

    return walk(expr)


def tangent_statements(
    statements: list[Statement], wrt: tuple[str, ...]
) -> tuple[list[Statement], dict[str, sympy.Expr]]:
    """Tangent statements for ``statements`` (in order), seeded with ``tangent_<x>`` for each wrt
    input, and the tangent of each ``grad_<x>`` (a symbol, or 0 where the Hessian block vanishes)."""
    tangents: dict[sympy.Symbol, sympy.Expr] = {tensor(name): tensor(f"tangent_{name}") for name in wrt}
    result = []
    for statement in statements:
        try:
            moved = tangent_of(statement.value, tangents)
        except NoTangentRule as missing:  # only an error if a later tangent reads this value
            tangents[statement.target] = missing
            continue
        if moved == 0:
            continue
        symbol = tensor(f"tangent_{statement.target.name}")
        result.append(Statement(symbol, moved, statement.node, f"d/de of {statement.target.name}"))
        tangents[statement.target] = symbol
    results = {}
    for name in wrt:
        moved = tangents.get(tensor(f"grad_{name}"), sympy.Integer(0))
        if isinstance(moved, NoTangentRule):
            raise moved
        results[name] = moved
    return result, results


def derive_extras(program, extras: tuple[str, ...]) -> dict:
    """The statements of the optional functions ``extras`` names, derived from ``program`` (an
    inlined program's top body, ``expand``): ``hvp``'s tangents and each gradient's tangent
    (:func:`tangent_statements`), ``per_sample``'s products (``reverse.per_sample_statements``);
    what ``schedule.schedule`` plans."""
    derived = {}
    if "hvp" in extras:
        derived["hvp"] = tangent_statements(program.forward + program.backward, program.graph.wrt)
    if "per_sample" in extras:
        derived["per_sample"] = per_sample_statements(program)
    return derived
