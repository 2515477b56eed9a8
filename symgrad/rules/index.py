"""Indexing along one dim with a constant integer tensor: ``input[:, index]`` (PyTorch's advanced
indexing with one index tensor), as Swin's relative position bias reads its table,
``table[relative_position_index.reshape(-1)]``; ``index`` is an int64 input (a buffer), never differentiated.

The output holds ``input``'s dims before ``dim``, then ``index``'s dims, then ``input``'s dims after it.
Each output entry copies one input entry, so the adjoint adds every gradient entry back onto the entry
it was copied from (entries read several times add up)::

    grad_input = zeros(input.shape).index_add(dim, index.flatten() % input.shape[dim], grad.flatten(dim, dim + index.dim() - 1))

``% input.shape[dim]``: an index may count from the end (``-1``, as indexing takes it, a Swin-style table
built with negative offsets); ``index_add`` takes none, and the remainder (Python's sign, torch's too)
names the same entry.
"""

from __future__ import annotations

from ..algebra import op, primitive
from .base import Checker, Forward, Operand, Param, Rule, Sample, Spelling, one_dim


def _index_code(operands, params, show):
    return f"{operands[0]}[{':, ' * params['dim']}{operands[1]}]"


def _index_add_code(operands, params, show):
    grad, shape, index = operands
    dim, rank = params["dim"], params["index_rank"]
    flat = grad if rank == 1 else f"{grad}.flatten({dim}, {dim + rank - 1})"
    return f"torch.index_add({grad}.new_zeros({shape}), {dim}, {index}.flatten() % {shape}[{dim}], {flat})"


primitive(
    "index",
    code=_index_code,
    latex=lambda operands, params, show: f"{operands[0]}[{operands[1]}]",
    tangent=lambda expr, tangent_of: op(
        "index", tangent_of(expr.operands[0]), expr.operands[1], **dict(expr.params.items())
    ),
)
primitive(
    "index_add_back",
    code=_index_add_code,
    shape_operands=(1,),
    latex=lambda operands, params, show: rf"\operatorname{{index\_add}}\left({operands[0]}\right)",
    tangent=lambda expr, tangent_of: op(
        "index_add_back", tangent_of(expr.operands[0]), *expr.operands[1:], **dict(expr.params.items())
    ),
)


class Index(Rule):
    op = "index"
    traced_elsewhere = (
        "x[:, idx], table[idx.reshape(-1)] with an int64 buffer or input idx: the tracer's indexing "
        "handler (symgrad/trace/indexing.py)"
    )
    operands = (Operand("input", from_in=True), Operand("index"))
    index_operands = ("index",)
    params = {"dim": Param(0, one_dim)}
    summary = "input[:, ..., index] along dim, index a constant int64 tensor; the gradient added back by index_add"

    def index_bound(self, shapes, params) -> int:
        return shapes["input"][params["dim"] % len(shapes["input"])]

    def reference(self, arguments, params):
        return arguments["input"][(slice(None),) * (params["dim"] % arguments["input"].dim()) + (arguments["index"],)]

    def infer_shape(self, shapes, params, check: Checker):
        x, index = shapes["input"], shapes["index"]
        check.require(
            -len(x) <= params["dim"] < len(x),
            f"dim {params['dim']} is out of range for a {len(x)}-dim input",
            f"give a dim in {-len(x)}..{len(x) - 1}",
        )
        check.require(len(index) >= 1, "index must have at least one dim", "give a 1-d or larger int64 index")
        dim = params["dim"] % len(x)
        return tuple(x[:dim]) + tuple(index) + tuple(x[dim + 1 :])

    def forward(self, node):
        dim = node.params["dim"] % len(node.shapes["input"])
        return Forward(op("index", node.operands["input"], node.operands["index"], dim=dim))

    def pullback(self, node, grad, wanted):
        unsupported = wanted - {"input"}
        if unsupported:
            raise NotImplementedError(f"index's {sorted(unsupported)} holds integers: it has no gradient")
        dim = node.params["dim"] % len(node.shapes["input"])
        return {
            "input": op(
                "index_add_back",
                grad,
                node.operands["input"],
                node.operands["index"],
                dim=dim,
                index_rank=len(node.shapes["index"]),
            )
        }

    def table_row(self):
        return (
            self.op,
            "out = input[:, ..., index] (index along dim)",
            "grad_input = zeros(input.shape).index_add(dim, index.flatten() % input.shape[dim], grad with index's "
            "dims flattened)",
        )


RULES = [Index()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "index": [
        Sample(
            "index-table-2d-index",
            {"table": [9, 2], "i": {"shape": [4, 4], "dtype": "int64"}, "y": [4, 4, 2]},
            [{"op": "index", "in": "table", "index": "i"}],
            ["table"],
        ),
        Sample(
            "index-dim1",
            {"x": [2, 5, 3], "i": {"shape": [4], "dtype": "int64"}, "y": [2, 4, 3]},
            [{"op": "index", "in": "x", "index": "i", "dim": 1}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "index": [
        Spelling("TokenGather()", {"x": (2, 3, 3, 3)}, module=True),
        Spelling("BiasTable()", {"x": (2, 2, 3, 3)}, module=True),
        Spelling("Selected()", {"x": (2, 3, 3, 3)}, module=True),
    ],
}
