"""``torch.addmm(input, mat1, mat2)``: ``input + mat1 @ mat2`` for 2-d ``mat1`` [N, K] and ``mat2`` [K, M], ``input``
broadcast against [N, M] (a bias [M]): GPT-2's ``Conv1D`` (transformers' ``pytorch_utils.Conv1D``), a linear layer
whose weight is stored [in, out]. The forward is the same one call (one BLAS product that adds into the bias),
so its values are the model's bit for bit; the adjoints are matmul's, and the bias's is the gradient summed to
its shape::

    grad_input = grad summed to input's shape,   grad_mat1 = grad @ mat2^T,   grad_mat2 = mat1^T @ grad

``beta`` and ``alpha`` other than 1 are refused.
"""

from __future__ import annotations

from ..algebra import op, primitive
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling
from .shared import in_operands_dtype

primitive(
    "addmm",
    code=lambda operands, params, show: f"torch.addmm({', '.join(operands)})",
    latex=lambda operands, params, show: f"{operands[0]} + {operands[1]} \\cdot {operands[2]}",
    tangent=lambda expr, tangent_of: (
        tangent_of(expr.operands[0])
        + op("matmul", tangent_of(expr.operands[1]), expr.operands[2])
        + op("matmul", expr.operands[1], tangent_of(expr.operands[2]))
    ),
    fresh=True,
)


def _one(value, context: ParamContext) -> int:
    if value != 1 or isinstance(value, bool):
        raise context.fail(
            f"is {value!r}: only 1 is supported", f"leave {context.name} at 1 (scale the operands instead)"
        )
    return 1


class AddMM(Rule):
    op = "addmm"
    calls = ("addmm",)
    signature = ("input", "mat1", "mat2", "beta", "alpha")
    operands = (Operand("input", from_in=True), Operand("mat1", from_in=True), Operand("mat2", from_in=True))
    params = {"beta": Param(1, _one), "alpha": Param(1, _one)}
    operand_roles = {"input": "shift", "mat2": "weight"}
    linear_in = ("input", "mat1", "mat2")
    summary = "input + mat1 @ mat2 (torch.addmm, GPT-2's Conv1D), input broadcast against the product"

    def fan_in_axes(self, rank: int) -> list[int]:
        return [0]  # mat2 is [in, out]

    def infer_shape(self, shapes, params, check: Checker):
        bias, a, b = shapes["input"], shapes["mat1"], shapes["mat2"]
        check.require(
            len(a) == 2 and len(b) == 2,
            f"mat1 and mat2 have {len(a)} and {len(b)} dims, not 2",
            "give addmm 2-d matrices (flatten the leading dims first, as Conv1D does)",
        )
        check.equal(a[1], b[0], lambda: f"inner sizes {a[1]} and {b[0]} differ", "make mat1's dim 1 equal mat2's dim 0")
        check.require(len(bias) <= 2, f"input has {len(bias)} dims", "give input [M] or [N, M]")
        for size, target in zip(bias[::-1], (a[0], b[1])[::-1]):
            if check.symbolic:
                check.equal(size, target, "", "")
            else:
                check.require(
                    size in (target, 1),
                    f"input of shape {tuple(bias)} does not broadcast to [{a[0]}, {b[1]}]",
                    "give input [M] or [N, M]",
                )
        return (a[0], b[1])

    def forward(self, node):
        return Forward(op("addmm", *(node.operands[name] for name in ("input", "mat1", "mat2"))))

    def pullback(self, node, grad, wanted):
        mat1, mat2 = node.operands["mat1"], node.operands["mat2"]
        grads = {}
        if "input" in wanted:
            grads["input"] = (
                op("sum_to_size", grad, node.operands["input"])
                if tuple(node.shapes["input"]) != tuple(node.out_shape)
                else grad
            )
        if "mat1" in wanted:
            grads["mat1"] = in_operands_dtype(
                op("matmul_transposed", grad, mat2, which="right"), mat1, "mat2" in wanted
            )
        if "mat2" in wanted:
            grads["mat2"] = in_operands_dtype(op("matmul_transposed", mat1, grad, which="left"), mat2, "mat1" in wanted)
        return grads

    def table_row(self):
        return (
            self.op,
            "out = input + mat1 @ mat2",
            "grad_input = grad_out summed to input's shape; grad_mat1 = grad_out @ mat2^T; grad_mat2 = mat1^T @ grad_out",
        )


RULES = [AddMM()]

CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    (
        "addmm (bias broadcast)",
        {"b": (2,), "x": (3, 2), "w": (2, 2)},
        {"op": "addmm", "in": ["b", "x", "w"]},
        ("x", "w"),
    ),
    ("addmm (in the bias)", {"b": (3, 2), "x": (3, 2), "w": (2, 2)}, {"op": "addmm", "in": ["b", "x", "w"]}, ("b",)),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "addmm": [
        Sample(
            "addmm-bias-broadcast",
            {"b": [4], "x": [3, 5], "w": [5, 4], "y": [3, 4]},
            [{"op": "addmm", "in": ["b", "x", "w"], "out": "out"}],
            ["b", "x", "w"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "addmm": [
        # GPT-2's Conv1D
        Spelling("torch.addmm(b, x.view(-1, x.size(-1)), w).view(2, 3, 4)", {"b": (4,), "x": (2, 3, 5), "w": (5, 4)}),
    ],
}
