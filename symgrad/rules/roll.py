"""``torch.roll(input, shifts, dims)``: entries moved cyclically along dims (Swin's shifted windows).

A cyclic shift is a permutation of the entries, so its adjoint is its inverse: the gradient rolled
back by the negated shifts, ``torch.roll(grad, [-s for s in shifts], dims)``. The shifts are taken
modulo each dim's length at run time by PyTorch itself, so the code is shape-generic.
"""

from __future__ import annotations

from ..algebra import LINEAR, op, primitive
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, ints

primitive(
    "roll",
    code=lambda operands, params, show: (
        f"torch.roll({operands[0]}, shifts={_show(params['shifts'])}, dims={_show(params['dims'])})"
    ),
    latex=lambda operands, params, show: (
        rf"\operatorname{{roll}}_{{{','.join(map(str, params['shifts']))}}}"
        rf"\left({operands[0]}\right)"
    ),
    tangent=LINEAR,
)


def _show(values: tuple[int, ...]) -> str:
    return str(values[0]) if len(values) == 1 else "(" + ", ".join(map(str, values)) + ")"


def _dims(value, context: ParamContext) -> tuple[int, ...]:
    if value is None:
        raise context.fail(
            "is missing: a roll of the flattened tensor is not supported",
            "give the dims to roll along, e.g. `dims: [1, 2]`",
        )
    return ints(value, context)


class Roll(Rule):
    op = "roll"
    calls = ("roll",)
    operands = (Operand("input", from_in=True),)
    params = {"shifts": Param(None, ints), "dims": Param(None, _dims)}
    summary = "entries shifted cyclically by shifts along dims"
    linear_in = ("input",)

    def infer_shape(self, shapes, params, check: Checker):
        rank = len(shapes["input"])
        shifts, dims = params["shifts"], params["dims"]
        check.require(
            len(shifts) == len(dims),
            f"shifts {list(shifts)} and dims {list(dims)} differ in length",
            "give one shift per dim",
        )
        check.require(
            all(-rank <= dim < rank for dim in dims) and len({dim % rank for dim in dims}) == len(dims),
            f"dims {list(dims)} must be distinct dims of the {rank}-dim input",
            f"give dims in {-rank}..{rank - 1}",
        )
        return tuple(shapes["input"])

    def _dims(self, node) -> tuple[int, ...]:
        return tuple(dim % len(node.shapes["input"]) for dim in node.params["dims"])

    def forward(self, node):
        return Forward(op("roll", node.operands["input"], shifts=tuple(node.params["shifts"]), dims=self._dims(node)))

    def pullback(self, node, grad, wanted):
        return {
            "input": op("roll", grad, shifts=tuple(-shift for shift in node.params["shifts"]), dims=self._dims(node))
        }

    def table_row(self):
        return self.op, "out = torch.roll(input, shifts, dims)", "grad_input = torch.roll(grad_out, -shifts, dims)"


RULES = [Roll()]

CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    ("roll", {"x": (2, 4, 3)}, {"op": "roll", "shifts": [-1, 2], "dims": [1, 2]}, ("x",)),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "roll": [
        Sample(
            "roll-two-dims",
            {"x": [2, 5, 4, 3], "y": [2, 5, 4, 3]},
            [{"op": "roll", "shifts": [-2, 3], "dims": [1, 2], "out": "out"}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "roll": [
        Spelling("torch.roll(x, shifts=(-1, 2), dims=(2, 3))"),  # Swin's shifted windows
        Spelling("x.roll(3, -1)"),
    ],
}
