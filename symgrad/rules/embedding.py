"""``F.embedding(input, weight)`` and ``nn.Embedding``: row ``input[...]`` of the table ``weight`` for every
index, ``input`` an int64 input (token ids passed in, or a buffer), never differentiated::

    out[n, t, :] = weight[input[n, t], :]

The output has ``input``'s shape and then the embedding size. Each output row copies one row of the
table, so the adjoint adds every gradient row back onto the row it was copied from, rows read several
times adding up::

    grad_weight = zeros(weight.shape).index_add(0, input.flatten(), grad.flatten(0, -2))

which is autograd's own formula, ``embedding_backward`` (on the CPU ``embedding_dense_backward`` adds the
gradient rows in the indices' order, as ``index_add`` does: the two are equal bit for bit). The row
``padding_idx`` gets no gradient (PyTorch's ``padding_idx``): that row of the sum is filled with 0. That is autograd's gradient, not
the derivative (the forward reads the row): finite differences, and a certificate of the transpose, see the row.

A table read elsewhere as well (GPT's output layer tied to its token embedding, ``lm_head.weight =
wte.weight``) is one input read twice: the reverse walk adds the two gradients.
"""

from __future__ import annotations

from ..algebra import op, primitive
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, int64


def _embedding_code(operands, params, show):
    padding = params.get("padding_idx")
    return f"F.embedding({operands[0]}, {operands[1]}" + (f", padding_idx={padding})" if padding is not None else ")")


def _embedding_back_code(operands, params, show):
    grad, shape, index = operands
    added = f"torch.index_add({grad}.new_zeros({shape}), 0, {index}.flatten(), {grad}.flatten(0, -2))"
    padding = params.get("padding_idx")
    return added if padding is None else f"{added}.index_fill(0, {index}.new_tensor([{padding}]), 0)"


primitive(
    "embedding",
    code=_embedding_code,
    latex=lambda operands, params, show: rf"{operands[1]}\left[{operands[0]}\right]",
    tangent=lambda expr, tangent_of: op(
        "embedding", expr.operands[0], tangent_of(expr.operands[1]), **dict(expr.params.items())
    ),
)
primitive(
    "embedding_back",
    code=_embedding_back_code,
    shape_operands=(1,),
    latex=lambda operands, params, show: (
        rf"\operatorname{{index\_add}}_{{0}}\left({operands[0]}, "
        rf"{operands[2]}\right)"
    ),
    tangent=lambda expr, tangent_of: op(
        "embedding_back", tangent_of(expr.operands[0]), *expr.operands[1:], **dict(expr.params.items())
    ),
)


def _padding_idx(value, context: ParamContext) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise context.fail(f"must be an int (a row of the table) or null, not {value!r}", "write e.g. `padding_idx: 0`")
    return int64(value, context)


class Embedding(Rule):
    op = "embedding"
    calls = ("embedding",)
    signature = ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse")
    operands = (Operand("input", from_in=True), Operand("weight"))
    index_operands = ("input",)
    params = {"padding_idx": Param(None, _padding_idx)}
    operand_roles = {"weight": "shift"}
    linear_in = ("weight",)
    summary = "the rows of a table weight at int64 indices (nn.Embedding); the gradient added back by index_add"

    def index_bound(self, shapes, params) -> int:
        return shapes["weight"][0]

    def reference(self, arguments, params):
        import torch

        return torch.nn.functional.embedding(
            arguments["input"], arguments["weight"], padding_idx=params.get("padding_idx")
        )

    def _padding(self, node) -> int | None:
        return node.params["padding_idx"]  # as written: a negative one counts from the end at run time too

    def infer_shape(self, shapes, params, check: Checker):
        index, weight = shapes["input"], shapes["weight"]
        check.require(
            len(weight) == 2,
            f"weight has {len(weight)} dims: an embedding table is [num_embeddings, embedding_dim]",
            "give a 2-d weight, as nn.Embedding's",
        )
        check.require(len(index) >= 1, "input is 0-dim", "give the indices at least one dim (unsqueeze them)")
        padding = params["padding_idx"]
        if padding is not None:  # a row of the table: rows > padding_idx >= -rows
            check.positive(
                weight[0] - padding if padding >= 0 else weight[0] + padding + 1,
                lambda: f"padding_idx {padding} is not a row of a table of {weight[0]} rows",
                "give a padding_idx within the table's rows",
            )
        return (*index, weight[1])

    def forward(self, node):
        return Forward(
            op("embedding", node.operands["input"], node.operands["weight"], padding_idx=self._padding(node))
        )

    def pullback(self, node, grad, wanted):
        unsupported = wanted - {"weight"}
        if unsupported:
            raise NotImplementedError(f"embedding's {sorted(unsupported)} holds integers: it has no gradient")
        return {
            "weight": op(
                "embedding_back", grad, node.operands["weight"], node.operands["input"], padding_idx=self._padding(node)
            )
        }

    def table_row(self):
        return (
            self.op,
            "out = weight[input] (input int64 indices; F.embedding)",
            "grad_weight = zeros(weight.shape).index_add(0, input.flatten(), grad_out rows); row padding_idx 0",
        )


RULES = [Embedding()]

CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    (
        "embedding (a row read twice, one never)",
        {"w": (5, 2), "i": {"int64": [[3, 0, 0], [1, 2, 1]]}},
        {"op": "embedding", "in": "i", "weight": "w"},
        ("w",),
    ),
]  # padding_idx is left out: PyTorch's gradient of that row is 0 by definition, not the forward's transpose


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "embedding": [
        Sample(
            "embedding",
            {"w": [5, 3], "i": {"shape": [2, 4], "dtype": "int64"}, "y": [2, 4, 3]},
            [{"op": "embedding", "in": "i", "weight": "w"}],
            ["w"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "embedding": [
        Spelling("Tokens()", {"x": (2, 3, 4)}, module=True),
    ],
}
