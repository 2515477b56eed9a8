"""Losses: the scalar-per-element density is a sympy formula; the reduction is ``sum``, ``mean``
or ``per_sample`` (a vector over dim 0, the seed's ``.sum(dim=[1, 2, 3])``).

The gradient the generated code returns is that of the sum of the loss entries, weighted by the
cotangent ``grad_loss`` (ones unless the caller passes one): ``d(sum_n c_n loss_n)/d input``.
"""

from __future__ import annotations

import sympy

from ..algebra import CONSTANT, LINEAR, op, primitive, tensor
from ..printing import to_text
from .base import Checker, Forward, NodeSymbols, Operand, Param, Rule, choice

PREDICTION, TARGET, RESIDUAL = sympy.symbols("input target residual")


def _reduce_code(operands, params, show):
    (value,) = operands
    how, rank = params["how"], params["rank"]
    if how == "mean":
        return f"{value}.mean()"
    if how == "sum":
        return f"{value}.sum()"
    if rank == 1:
        return value
    return f"{value}.sum(dim=({', '.join(str(axis) for axis in range(1, rank))}))"


def _reduce_latex(operands, params, show):
    how = params["how"]
    if how == "per_sample":
        return rf"\left[\sum_{{i}} {operands[0]}_{{n,i}}\right]_{{n}}"
    return (r"\operatorname{mean}" if how == "mean" else r"\sum") + f" {operands[0]}"


primitive("reduce", code=_reduce_code, latex=_reduce_latex, tangent=LINEAR)
primitive("per_sample_view",
          code=lambda operands, params, show: f"{operands[0]}.reshape(-1{', 1' * (params['rank'] - 1)})",
          latex=lambda operands, params, show: operands[0], tangent=LINEAR)
primitive("numel", code=lambda operands, params, show: f"{operands[0]}.numel()",
          latex=lambda operands, params, show: rf"\lvert {operands[0]} \rvert", tangent=CONSTANT)
primitive("ones_cotangent",
          code=lambda operands, params, show: f"{operands[0]}.new_ones({operands[0]}.shape[0])" if params["per_sample"]
          else f"{operands[0]}.new_ones(())",
          latex=lambda operands, params, show: r"\mathbf{1}", tangent=CONSTANT)


class Loss(Rule):
    operands = (Operand("input", from_in=True), Operand("target"))
    params = {"reduction": Param("sum", choice("sum", "mean", "per_sample"))}
    density: sympy.Expr

    def __init__(self, op_name: str, density: sympy.Expr, summary: str):
        self.op = op_name
        self.density = density
        self.summary = summary

    def infer_shape(self, shapes, params, check: Checker):
        prediction, target = shapes["input"], shapes["target"]
        check.require(len(prediction) == len(target),
                      f"prediction has shape {tuple(prediction)} but target has {len(target)} dimensions",
                      "give the target the prediction's shape")
        for axis, (a, b) in enumerate(zip(prediction, target)):
            check.equal(a, b, f"prediction has shape {tuple(prediction)} but target has shape {tuple(target)}",
                        "give the target the prediction's shape")
        return (prediction[0],) if params["reduction"] == "per_sample" else ()

    def forward(self, node: NodeSymbols) -> Forward:
        prediction, target = node.operands["input"], node.operands["target"]
        residual = node.local("residual", prediction - target, plain=True)
        per_element = self.density.subs(PREDICTION - TARGET, RESIDUAL).subs(RESIDUAL, residual)
        coefficient, rest = per_element.as_coeff_Mul()
        rank = len(node.shapes["input"])
        reduced = coefficient * op("reduce", rest, how=node.params["reduction"], rank=rank)
        return Forward(reduced)

    def cotangent(self, node: NodeSymbols, grad) -> sympy.Expr:
        """The cotangent of the loss, broadcast against one element of the prediction."""
        prediction = node.operands["input"]
        reduction = node.params["reduction"]
        if reduction == "per_sample":
            return op("per_sample_view", grad, rank=len(node.shapes["input"]))
        if reduction == "mean":
            return grad / op("numel", prediction)
        return grad

    def default_cotangent(self, node: NodeSymbols) -> sympy.Expr:
        return op("ones_cotangent", node.operands["input"], per_sample=node.params["reduction"] == "per_sample")

    def pullback(self, node: NodeSymbols, grad, wanted):
        weight = self.cotangent(node, grad)
        residual = tensor("residual")
        grads = {}
        for scalar, operand in ((PREDICTION, "input"), (TARGET, "target")):
            if operand in wanted:
                local = sympy.diff(self.density, scalar).subs(PREDICTION - TARGET, residual)
                grads[operand] = sympy.expand(local) * weight
        return grads

    def table_row(self):
        derivative = to_text(sympy.diff(self.density, PREDICTION))
        return self.op, f"loss = reduce({to_text(self.density)})", f"d/dinput = {derivative} (times the reduction's weight)"


RULES = [Loss("half_sq_error", sympy.Rational(1, 2) * (PREDICTION - TARGET) ** 2,
              "half the squared error, ½‖input − target‖², reduced by sum, mean or per sample")]
