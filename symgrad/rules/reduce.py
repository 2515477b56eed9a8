"""Reductions inside a network: ``x.sum(dim, keepdim)`` and ``x.mean(dim, keepdim)`` over any dims, and
the statistics ``x.var(...)`` and ``x.std(...)``.

They are what hand-written normalisations are made of (a channel LayerNorm written as
``u = x.mean(1, keepdim=True); s = (x - u).pow(2).mean(1, keepdim=True)``) and what a
squeeze-and-excitation gate pools with. Both are linear; the adjoint of a sum over dims D copies
each output's gradient back over D (unsqueezed there if the dims were dropped, then expanded to the
input's shape), and a mean's divides it by the number of entries averaged, read from the input's
size at run time so the code stays shape-generic::

    grad_x = grad.unsqueeze(D).expand_as(x) / prod(x.shape[d] for d in D)

The expanded gradient of a sum is materialised (``contiguous``), because later in-place updates of a
view whose entries share memory would be wrong; a mean's is divided, which makes a new tensor, so it is
left a view (``spread(..., copy=False)``), as autograd's ``mean_backward`` divides ``grad.expand(...)``.
"""

from __future__ import annotations

import math

import sympy

from ..algebra import CONSTANT, Size, op, primitive
from .base import Checker, Forward, Operand, Param, Rule, Sample, Spelling, boolean, ints
from .shared import show_dims

# a count of entries as one factor, `x.shape[1] * x.shape[2]` (printed in parentheses): what a mean over several
# dims divides by, once, as autograd's mean_backward divides
primitive(
    "entries",
    code=lambda operands, params, show: operands[0],
    latex=lambda operands, params, show: rf"\left({operands[0]}\right)",
    tangent=CONSTANT,
)


class Reduce(Rule):
    """``x.sum(dim, keepdim)`` / ``x.mean(dim, keepdim)`` over the listed dims."""

    operands = (Operand("input", from_in=True),)
    params = {"dim": Param(None, ints), "keepdim": Param(False, boolean)}
    linear_in = ("input",)

    def __init__(self, how: str):
        self.op = how
        self.traced_elsewhere = (
            f"x.{how}(dims) and torch.{how}: the tracer's reduction handler makes the loss of "
            "a reduction of the whole output, and this layer of any other"
        )
        self.how = how
        self.summary = f"{how} over the dims dim (kept as size 1 with keepdim)"

    def _dims(self, rank: int, params, check: Checker | None = None) -> tuple[int, ...]:
        dims = params["dim"]
        if check is not None:
            check.require(
                all(-rank <= d < rank for d in dims),
                f"dim {list(dims)} is out of range for a {rank}-dim input",
                f"give dims in {-rank}..{rank - 1}",
            )
            check.require(
                len({d % rank for d in dims}) == len(dims), f"dim {list(dims)} names a dim twice", "list each dim once"
            )
        return tuple(sorted(d % rank for d in dims))

    def infer_shape(self, shapes, params, check: Checker):
        shape = list(shapes["input"])
        dims = self._dims(len(shape), params, check)
        if params["keepdim"]:
            return tuple(1 if axis in dims else size for axis, size in enumerate(shape))
        return tuple(size for axis, size in enumerate(shape) if axis not in dims)

    def forward(self, node):
        dims = self._dims(len(node.shapes["input"]), node.params)
        return Forward(
            op("reduce_dims", node.operands["input"], how=self.how, dims=dims, keepdim=node.params["keepdim"])
        )

    def pullback(self, node, grad, wanted):
        x = node.operands["input"]
        dims = self._dims(len(node.shapes["input"]), node.params)
        if self.how == "sum":
            return {"input": op("spread", grad, x, dims=dims, keepdim=node.params["keepdim"])}
        count = math.prod(Size(x, axis) for axis in dims)
        if len(dims) > 1:  # one integer, as autograd's mean_backward divides once (twice rounds otherwise)
            count = op("entries", count)
        spread = op("spread", grad, x, dims=dims, keepdim=node.params["keepdim"], copy=False)  # divided: new
        return {"input": spread * sympy.Integer(1) / count}

    def table_row(self):
        scale = "" if self.how == "sum" else " / (entries averaged)"
        return (
            self.op,
            f"out = input.{self.how}(dim, keepdim)",
            f"grad_input = grad_out (unsqueezed at dim unless keepdim) expanded to the input's shape{scale}",
        )


def _optional_dims(value, context):
    return None if value is None else ints(value, context)  # None: every dim


def _correction(value, context) -> int | None:
    if value is None:
        return None  # from unbiased
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise context.fail(f"must be a non-negative int, not {value!r}", f"write e.g. `{context.name}: 0`")
    return value


class Variance(Rule):
    """``x.var(dim, keepdim, unbiased / correction)`` and ``x.std(...)``: what hand-written LayerNorms
    (``x.var(-1, keepdim=True, unbiased=False)``) normalise with. Over the ``n`` entries of each group,
    with ``c`` the correction, ``var = sum((x - mean)^2) / (n - c)``, so::

        grad_x = spread(grad) * 2 (x - mean) / (n - c)            # var
        grad_x = spread(grad / std) * (x - mean) / (n - c)        # std = sqrt(var)
    """

    operands = (Operand("input", from_in=True),)
    params = {
        "dim": Param(None, _optional_dims),
        "unbiased": Param(True, boolean),
        "keepdim": Param(False, boolean),
        "correction": Param(None, _correction),
    }

    def __init__(self, how: str):
        self.op = how
        self.calls = (how,)
        self.summary = {"var": "variance", "std": "standard deviation"}[
            how
        ] + " over the dims dim (Bessel's correction unless unbiased: false or correction: 0)"

    def _dims(self, rank: int, params, check: Checker | None = None) -> tuple[int, ...]:
        if params["dim"] is None:
            return tuple(range(rank))
        return Reduce._dims(self, rank, params, check)

    def _correction(self, params) -> int:
        return params["correction"] if params["correction"] is not None else int(params["unbiased"])

    def reference_params(self, params: dict) -> dict:
        return {"dim": params["dim"], "keepdim": params["keepdim"], "correction": self._correction(params)}

    def infer_shape(self, shapes, params, check: Checker):
        return Reduce.infer_shape(self, shapes, params, check)

    def forward(self, node):
        dims = self._dims(len(node.shapes["input"]), node.params)
        return Forward(
            op(
                "statistic",
                node.operands["input"],
                how=self.op,
                dims=dims,
                keepdim=node.params["keepdim"],
                correction=self._correction(node.params),
            )
        )

    def pullback(self, node, grad, wanted):
        x = node.operands["input"]
        dims = self._dims(len(node.shapes["input"]), node.params)
        keepdim = node.params["keepdim"]
        centred = node.local(
            "centred",
            x - op("reduce_dims", x, how="mean", dims=dims, keepdim=True),
            note=f"input of {node.name} minus its mean over {list(dims)}",
        )
        count = math.prod(Size(x, axis) for axis in dims) - self._correction(node.params)
        # multiplied: a new tensor, the spread left a view (as for a mean)
        if self.op == "var":
            return {"input": op("spread", grad, x, dims=dims, keepdim=keepdim, copy=False) * 2 * centred / count}
        return {"input": op("spread", grad / node.out, x, dims=dims, keepdim=keepdim, copy=False) * centred / count}

    def table_row(self):
        if self.op == "var":
            return (
                self.op,
                "out = sum_dim((input - mean)^2) / (n - correction)",
                "grad_input = grad_out (spread over dim) * 2 (input - mean) / (n - correction)",
            )
        return (
            self.op,
            "out = sqrt(var(input, dim))",
            "grad_input = grad_out / out (spread over dim) * (input - mean) / (n - correction)",
        )


def _statistic(operands, params, show) -> str:
    return f"{operands[0]}.{params['how']}(dim={show_dims(params['dims'])}, correction={params['correction']}" + (
        ", keepdim=True)" if params["keepdim"] else ")"
    )


def _statistic_tangent(expr, tangent_of):
    """d var = sum_dim(2 (x - mean) dx) / (n - c); d std = d var / (2 std)."""
    x, moved = expr.operands[0], tangent_of(expr.operands[0])
    if moved == 0:
        return sympy.Integer(0)
    dims, correction = expr.params["dims"], expr.params["correction"]
    centred = x - op("reduce_dims", x, how="mean", dims=dims, keepdim=True)
    count = math.prod(Size(x, axis) for axis in dims) - correction
    change = op("reduce_dims", 2 * centred * moved, how="sum", dims=dims, keepdim=expr.params["keepdim"]) / count
    return change if expr.params["how"] == "var" else change / (2 * expr)


primitive(
    "statistic",
    code=_statistic,
    latex=lambda operands, params, show: (
        rf"\operatorname{{{params['how']}}}_{{{','.join(map(str, params['dims']))}}}"
        rf"\left({operands[0]}\right)"
    ),
    tangent=_statistic_tangent,
)

RULES = [Reduce("sum"), Reduce("mean"), Variance("var"), Variance("std")]


CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    ("sum", {"x": (2, 3, 2)}, {"op": "sum", "dim": [1], "keepdim": True}, ("x",)),
    ("mean", {"x": (2, 3, 2)}, {"op": "mean", "dim": [0, 2]}, ("x",)),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "sum": [
        Sample(
            "sum-spatial-keepdim",
            {"x": [2, 3, 4, 5], "y": [2, 3, 1, 1]},
            [{"op": "sum", "dim": [2, 3], "keepdim": True, "out": "out"}],
            ["x"],
        ),
        Sample("sum-batch-and-last", {"x": [3, 4, 5], "y": [4]}, [{"op": "sum", "dim": [0, 2], "out": "out"}], ["x"]),
    ],
    "mean": [
        Sample(
            "mean-channels-keepdim",
            {"x": [2, 3, 4, 5], "y": [2, 1, 4, 5]},
            [{"op": "mean", "dim": [1], "keepdim": True, "out": "out"}],
            ["x"],
        ),
        Sample("mean-spatial", {"x": [2, 3, 4, 5], "y": [2, 3]}, [{"op": "mean", "dim": [-1, 2], "out": "out"}], ["x"]),
    ],
    "var": [
        Sample(
            "var-channels-keepdim-biased",
            {"x": [2, 3, 4, 5], "y": [2, 1, 4, 5]},
            [{"op": "var", "dim": [1], "keepdim": True, "unbiased": False, "out": "out"}],
            ["x"],
        ),
        Sample("var-unbiased", {"x": [3, 4, 5], "y": [4]}, [{"op": "var", "dim": [0, 2], "out": "out"}], ["x"]),
    ],
    "std": [
        Sample(
            "std-last-keepdim-correction0",
            {"x": [2, 3, 4, 5], "y": [2, 3, 4, 1]},
            [{"op": "std", "dim": [-1], "keepdim": True, "correction": 0, "out": "out"}],
            ["x"],
        ),
        Sample("std-spatial", {"x": [2, 3, 4], "y": [2]}, [{"op": "std", "dim": [1, 2], "out": "out"}], ["x"]),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "sum": [
        Spelling("x * x.sum(dim=-1, keepdim=True)"),
        Spelling("torch.sum(x, (0, 2))"),
    ],
    "mean": [
        Spelling("x - x.mean(1, keepdim=True)"),  # a hand-written LayerNorm's channel mean
        Spelling("torch.mean(x * x, dim=(1, 3))"),
    ],
    "var": [
        Spelling("(x - x.mean(1, keepdim=True)) / (x.var(1, keepdim=True, unbiased=False) + 1e-5).sqrt()"),
        Spelling("torch.var(x, dim=(2, 3))"),
        Spelling("(lambda v, m: (x - m) / (v + 1e-5).sqrt())(*torch.var_mean(x, dim=1, keepdim=True))"),
    ],
    "std": [
        Spelling("x / x.std(-1, keepdim=True)"),
        Spelling("(lambda s, m: (x - m) / s)(*torch.std_mean(x, dim=(2, 3), keepdim=True, correction=0))"),
    ],
}
