"""``torch.gather(input, dim, index)`` and ``x.gather(dim, index)`` with a constant integer ``index`` (a buffer
of the model or an int64 argument, never a value computed from the data): entry ``i`` of the output along
``dim`` is ``input``'s entry ``index[i]`` there, every other position the same::

    out[n, i, c] = input[n, index[n, i, c], c]          # dim = 1

The output has ``index``'s shape. Each output entry copies one input entry, so the adjoint adds every
gradient entry back onto the entry it was copied from (entries read several times add up), autograd's own
formula::

    grad_input = zeros(input.shape).scatter_add(dim, index, grad)

A gather whose index is a 1-d buffer viewed along ``dim`` and expanded over the other dims
(``x.gather(1, idx.reshape(1, -1, 1).expand(B, -1, C))``) is ``x[:, idx]``: the tracer writes it as ``index``.
"""

from __future__ import annotations

from ..algebra import op, primitive
from .base import Checker, Forward, Operand, Param, Rule, Sample, Spelling, one_dim

primitive(
    "gather",
    code=lambda operands, params, show: f"{operands[0]}.gather({params['dim']}, {operands[1]})",
    latex=lambda operands, params, show: (
        rf"\operatorname{{gather}}_{{{params['dim']}}}\left({operands[0]}, "
        rf"{operands[1]}\right)"
    ),
    tangent=lambda expr, tangent_of: op(
        "gather", tangent_of(expr.operands[0]), expr.operands[1], **dict(expr.params.items())
    ),
)
primitive(
    "scatter_add_back",
    shape_operands=(1,),
    code=lambda operands, params, show: (
        f"{operands[0]}.new_zeros({operands[1]}).scatter_add({params['dim']}, {operands[2]}, {operands[0]})"
    ),
    latex=lambda operands, params, show: (
        rf"\operatorname{{scatter\_add}}_{{{params['dim']}}}\left({operands[0]}, "
        rf"{operands[2]}\right)"
    ),
    tangent=lambda expr, tangent_of: op(
        "scatter_add_back", tangent_of(expr.operands[0]), *expr.operands[1:], **dict(expr.params.items())
    ),
)


class Gather(Rule):
    op = "gather"
    calls = ("gather",)
    signature = ("input", "dim", "index")
    operands = (Operand("input", from_in=True), Operand("index"))
    index_operands = ("index",)
    params = {"dim": Param(None, one_dim)}
    summary = "input's entries at a constant int64 index along dim (torch.gather); the gradient scatter-added back"
    linear_in = ("input",)

    def index_bound(self, shapes, params) -> int:
        return shapes["input"][params["dim"] % len(shapes["input"])]

    def reference(self, arguments, params):
        import torch

        return torch.gather(arguments["input"], params["dim"], arguments["index"])

    def infer_shape(self, shapes, params, check: Checker):
        x, index = shapes["input"], shapes["index"]
        check.require(
            -len(x) <= params["dim"] < len(x),
            f"dim {params['dim']} is out of range for a {len(x)}-dim input",
            f"give a dim in {-len(x)}..{len(x) - 1}",
        )
        check.require(
            len(index) == len(x),
            f"index has {len(index)} dims, input {len(x)}: gather takes an index of the input's rank",
            "give the index as many dims as the input (unsqueeze it in the buffer)",
        )
        dim = params["dim"] % len(x)
        for d in range(len(x)):
            if d != dim:
                check.positive(
                    x[d] - index[d] + 1,
                    lambda: f"index {tuple(index)} is larger than input {tuple(x)} outside dim {dim}",
                    "give the index at most the input's size in every other dim",
                )
        return tuple(index)

    def forward(self, node):
        dim = node.params["dim"] % len(node.shapes["input"])
        return Forward(op("gather", node.operands["input"], node.operands["index"], dim=dim))

    def pullback(self, node, grad, wanted):
        unsupported = wanted - {"input"}
        if unsupported:
            raise NotImplementedError(f"gather's {sorted(unsupported)} holds integers: it has no gradient")
        dim = node.params["dim"] % len(node.shapes["input"])
        return {"input": op("scatter_add_back", grad, node.operands["input"], node.operands["index"], dim=dim)}

    def table_row(self):
        return (
            self.op,
            "out = input.gather(dim, index) (index a constant int64 tensor)",
            "grad_input = zeros(input.shape).scatter_add(dim, index, grad_out)",
        )


RULES = [Gather()]

CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    (
        "gather (an entry read twice, one never)",
        {"x": (2, 4), "i": {"int64": [[3, 0, 0], [1, 2, 1]]}},
        {"op": "gather", "in": "x", "index": "i", "dim": 1},
        ("x",),
    ),
    (
        "gather along dim 0",
        {"x": (3, 2, 2), "i": {"int64": [[[2, 0]], [[2, 2]]]}},
        {"op": "gather", "in": "x", "index": "i", "dim": 0},
        ("x",),
    ),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "gather": [
        Sample(
            "gather-dim1",
            {"x": [2, 5, 3], "i": {"shape": [2, 4, 3], "dtype": "int64"}, "y": [2, 4, 3]},
            [{"op": "gather", "in": "x", "index": "i", "dim": 1}],
            ["x"],
        ),
        Sample(
            "gather-last-dim-index-smaller-and-longer",
            {"x": [3, 4, 5], "i": {"shape": [2, 4, 7], "dtype": "int64"}, "y": [2, 4, 7]},
            [{"op": "gather", "in": "x", "index": "i", "dim": -1}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "gather": [
        Spelling("Gathered()", module=True),
    ],
}
