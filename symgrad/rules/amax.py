"""The largest entry over dims: ``x.amax(dim, keepdim)`` and ``torch.amax`` (CBAM's max-pooled descriptors,
``x.amax((2, 3), keepdim=True)`` over space and ``x.amax(dim=1, keepdim=True)`` over channels; a global
max pool).

The output is one of the entries it reduces, so its gradient goes to the entries that hold the maximum;
where several tie, PyTorch's amax backward shares it evenly among them, and so does this rule::

    mask = (input == spread(out)).to(input.dtype)
    grad_input = mask * spread(grad) / mask.sum(dims, keepdim=True)

The mask is piecewise constant in ``input``, so the gradient is itself differentiable (its derivative
through the mask is zero almost everywhere, as autograd's).
"""

from __future__ import annotations

from ..algebra import CONSTANT, op, primitive
from .base import Checker, Forward, Operand, Param, Rule, Sample, Spelling, boolean, ints
from .reduce import Reduce
from .shared import show_dims


def _amax_tangent(expr, tangent_of):
    """d amax = the change of the maximal entries, shared as the backward shares the gradient."""
    x, moved = expr.operands[0], tangent_of(expr.operands[0])
    dims, keepdim = expr.params["dims"], expr.params["keepdim"]
    mask = op("equal_mask", x, op("spread", expr, x, dims=dims, keepdim=keepdim))
    shared = op("reduce_dims", mask * moved, how="sum", dims=dims, keepdim=True) / op(
        "reduce_dims", mask, how="sum", dims=dims, keepdim=True
    )
    return shared if keepdim else op("squeeze_dims", shared, dims=dims)


primitive(
    "amax",
    code=lambda operands, params, show: (
        f"{operands[0]}.amax(dim={show_dims(params['dims'])}" + (", keepdim=True)" if params["keepdim"] else ")")
    ),
    latex=lambda operands, params, show: rf"\max_{{{','.join(map(str, params['dims']))}}}\left({operands[0]}\right)",
    tangent=_amax_tangent,
)
primitive(
    "equal_mask",
    code=lambda operands, params, show: f"({operands[0]} == {operands[1]}).to({operands[0]}.dtype)",
    latex=lambda operands, params, show: rf"\left[{operands[0]} = {operands[1]}\right]",
    tangent=CONSTANT,
)
primitive(
    "squeeze_dims",
    code=lambda operands, params, show: operands[0] + "".join(f".squeeze({d})" for d in reversed(params["dims"])),
    latex=lambda operands, params, show: operands[0],
    tangent=lambda expr, tangent_of: op("squeeze_dims", tangent_of(expr.operands[0]), **dict(expr.params.items())),
)


class Amax(Rule):
    op = "amax"
    calls = ("amax",)
    operands = (Operand("input", from_in=True),)
    params = {"dim": Param(None, ints), "keepdim": Param(False, boolean)}
    summary = "the largest entry over the dims dim (kept as size 1 with keepdim); ties share the gradient"

    def reference(self, arguments, params):
        import torch

        return torch.amax(arguments["input"], dim=params["dim"], keepdim=params.get("keepdim", False))

    def infer_shape(self, shapes, params, check: Checker):
        return Reduce.infer_shape(self, shapes, params, check)

    def _dims(self, rank: int, params, check: Checker | None = None) -> tuple[int, ...]:
        return Reduce._dims(self, rank, params, check)

    def forward(self, node):
        dims = self._dims(len(node.shapes["input"]), node.params)
        return Forward(op("amax", node.operands["input"], dims=dims, keepdim=node.params["keepdim"]))

    def pullback(self, node, grad, wanted):
        x = node.operands["input"]
        dims, keepdim = self._dims(len(node.shapes["input"]), node.params), node.params["keepdim"]
        mask = node.local(
            "mask",
            op("equal_mask", x, op("spread", node.out, x, dims=dims, keepdim=keepdim)),
            note=f"where the input of {node.name} holds its maximum over {list(dims)}",
        )
        count = op("reduce_dims", mask, how="sum", dims=dims, keepdim=True)
        return {"input": mask * op("spread", grad, x, dims=dims, keepdim=keepdim) / count}

    def table_row(self):
        return (
            self.op,
            "out = input.amax(dim, keepdim)",
            "grad_input = mask * grad_out (spread over dim) / mask.sum(dim), mask = (input == out)",
        )


RULES = [Amax()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "amax": [
        Sample(
            "amax-space-keepdim",
            {"x": [2, 3, 4, 5], "y": [2, 3, 1, 1]},
            [{"op": "amax", "dim": [2, 3], "keepdim": True, "out": "out"}],
            ["x"],
        ),
        Sample("amax-channels", {"x": [2, 3, 4, 5], "y": [2, 4, 5]}, [{"op": "amax", "dim": [1], "out": "out"}], ["x"]),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "amax": [
        Spelling("x * x.amax((2, 3), keepdim=True)"),  # CBAM's channel descriptor
        Spelling("torch.cat([x.mean(dim=1, keepdim=True), torch.amax(x, dim=1, keepdim=True)], dim=1)"),
        Spelling("x.amax(dim=-1).exp()"),
        # over every entry: autograd shares ties' gradient, as amax does
        Spelling("torch.max(x) * x"),
    ],
}
