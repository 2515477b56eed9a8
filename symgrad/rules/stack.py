"""``torch.stack``: tensors of one shape joined along a new dim (selective-kernel branches, stacked
attention heads). It is linear in each tensor; the adjoint hands tensor ``i`` the gradient's slice
``i`` along the new dim::

    grad_i = grad.select(dim, i)
"""

from __future__ import annotations

import sympy

from ..algebra import LINEAR, op, primitive
from .base import Checker, Forward, Operand, Param, Rule, Sample, Spelling, ints


def _stack_tangent(expr, tangent_of):
    moved = [tangent_of(operand) for operand in expr.operands]
    if all(m == 0 for m in moved):
        return sympy.Integer(0)
    return op(
        "stack", *(m if m != 0 else op("zeros_like", o) for m, o in zip(moved, expr.operands)), dim=expr.params["dim"]
    )


primitive(
    "stack",
    code=lambda operands, params, show: f"torch.stack([{', '.join(operands)}], dim={params['dim']})",
    latex=lambda operands, params, show: r"\operatorname{stack}\left(" + ", ".join(operands) + r"\right)",
    tangent=_stack_tangent,
)
primitive(
    "select",
    code=lambda operands, params, show: f"{operands[0]}.select({params['dim']}, {params['index']})",
    latex=lambda operands, params, show: rf"{{{operands[0]}}}_{{[{params['index']}]}}",
    tangent=LINEAR,
)


class Stack(Rule):
    op = "stack"
    calls = ("stack",)
    operands = (Operand("tensors", from_in=True, variadic=True),)
    linear_in = ("tensors",)
    params = {"dim": Param(0, lambda v, c: ints(v, c)[0])}
    summary = "tensors of one shape joined along a new dim"

    def reference(self, arguments, params):
        import torch

        return torch.stack([arguments[f"tensors_{i}"] for i in range(len(arguments))], dim=params["dim"])

    def infer_shape(self, shapes, params, check: Checker):
        ordered = [shapes[key] for key in sorted(shapes, key=lambda k: int(k.rsplit("_", 1)[1]))]
        rank = len(ordered[0]) + 1
        check.require(
            -rank <= params["dim"] < rank,
            f"dim {params['dim']} is out of range for stacking {rank - 1}-dim tensors",
            f"give a dim in {-rank}..{rank - 1}",
        )
        check.require(
            all(len(shape) == rank - 1 for shape in ordered),
            "stack needs tensors of one rank",
            "give them equal shapes",
        )
        for shape in ordered[1:]:
            for axis in range(rank - 1):
                check.equal(
                    shape[axis],
                    ordered[0][axis],
                    f"shapes {[tuple(s) for s in ordered]} differ",
                    "give every tensor the same shape",
                )
        dim = params["dim"] % rank
        return (*ordered[0][:dim], len(ordered), *ordered[0][dim:])

    def _ordered(self, node):
        return [node.operands[f"tensors_{index}"] for index in range(len(node.operands))]

    def forward(self, node):
        return Forward(op("stack", *self._ordered(node), dim=node.params["dim"] % len(node.out_shape)))

    def pullback(self, node, grad, wanted):
        dim = node.params["dim"] % len(node.out_shape)
        return {
            f"tensors_{index}": op("select", grad, dim=dim, index=index)
            for index in range(len(node.operands))
            if f"tensors_{index}" in wanted
        }

    def table_row(self):
        return self.op, "out = torch.stack([a, b, ...], dim)", "grad of input i = grad_out.select(dim, i)"


RULES = [Stack()]


CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    ("stack (second input)", {"x": (2, 3), "v": (2, 3)}, {"op": "stack", "in": ["x", "v"], "dim": 1}, ("v",)),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "stack": [
        Sample(
            "stack-last",
            {"a": [2, 3], "b": [2, 3], "c": [2, 3], "y": [2, 3, 3]},
            [{"op": "stack", "in": ["a", "b", "c"], "dim": -1}],
            ["a", "c"],
        ),
        Sample(
            "stack-one-tensor-twice",
            {"a": [2, 4, 3], "y": [2, 2, 4, 3]},
            [{"op": "stack", "in": ["a", "a"], "dim": 1}],
            ["a"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "stack": [
        # SK-style
        Spelling("torch.stack([x, y.relu()], dim=1).sum(1)", {"x": (2, 3, 8, 8), "y": (2, 3, 8, 8)}),
        Spelling("torch.stack((x, y), -1)", {"x": (2, 3, 8, 8), "y": (2, 3, 8, 8)}),
    ],
}
