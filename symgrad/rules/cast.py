"""A dtype conversion: ``t.float()``, ``x.to(torch.float32)``, ``h.to(dtype=self.dtype)``.

diffusers' ``UNet2DModel`` takes a per-sample int64 timestep and embeds it in float32 whatever the model's
dtype (``get_timestep_embedding``: ``timesteps[:, None].float() * freqs``, sin and cos), then converts the
embedding to the model's dtype (``t_emb.to(dtype=self.dtype)``). The spec writes both conversions:

- ``dtype: float32``: to that dtype, the one the code names (``.float()``, ``.to(torch.float32)``);
- ``like: NODE``: to NODE's dtype, where the code converts to the dtype the model runs in (its floating
  inputs' and parameters'), so that the spec runs in float32 and in float64 alike.

The input may be an int64 input (an index operand: test inputs draw it below :data:`DRAWN_BELOW`, and it
has no gradient) or a float node, whose gradient is the output's converted back to the input's dtype, as
autograd's ``to`` does: ``grad_input = grad.to(input.dtype)``.
"""

from __future__ import annotations

import sympy

from ..algebra import op, primitive
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling

DTYPES = ("float16", "bfloat16", "float32", "float64")

DRAWN_BELOW = 1000
"""The int64 values a generated test draws for an integer the network converts to float (a diffusion
timestep: 1000 is the usual count of a training schedule)."""


def _cast_code(operands, params, show):
    target = f"{operands[1]}.dtype" if len(operands) > 1 else f"torch.{params['dtype']}"
    return f"{operands[0]}.to({target})"


def _cast_latex(operands, params, show):
    return operands[0]


def _cast_tangent(expr, tangent_of):
    moved = tangent_of(expr.operands[0])  # 0 for an int64 input (and any value no wrt input moves)
    return moved if moved == 0 else op("cast", moved, *expr.operands[1:], **dict(expr.params.items()))


primitive("cast", code=_cast_code, latex=_cast_latex, tangent=_cast_tangent)


def _dtype(value, context: ParamContext):
    if value is None or value in DTYPES:
        return value
    raise context.fail(f"is {value!r}, not a floating dtype", f"write one of {', '.join(DTYPES)}, or like: NODE")


class Cast(Rule):
    op = "cast"
    traced_elsewhere = (
        "x.float(), x.double(), x.to(dtype), x.type_as(y) that change the dtype: the tracer's "
        "conversion handler (symgrad/trace/views.py, pass_through)"
    )
    operands = (Operand("input", from_in=True), Operand("like", optional=True))
    index_operands = ("input",)
    float_index_ok = True
    params = {"dtype": Param(None, _dtype)}
    summary = (
        "input converted to dtype, or to like's dtype; an int64 input (a timestep) has no gradient, a "
        "float one's is converted back"
    )

    def index_bound(self, shapes, params) -> int:
        return DRAWN_BELOW

    def reference(self, arguments, params):
        import torch

        like = arguments.get("like")
        target = like.dtype if like is not None else getattr(torch, params["dtype"])
        return arguments["input"].to(target)

    def reference_params(self, params):
        return {"dtype": params["dtype"]}

    def infer_shape(self, shapes, params, check: Checker):
        check.require(
            (params["dtype"] is None) != ("like" not in shapes),
            "needs exactly one of dtype and like",
            "write `dtype: float32` for a dtype the code names, or `like: NODE` for NODE's dtype",
        )
        return tuple(shapes["input"])

    def forward(self, node):
        like = (node.operands["like"],) if "like" in node.operands else ()
        return Forward(op("cast", node.operands["input"], *like, dtype=node.params["dtype"]))

    def pullback(self, node, grad, wanted):
        pulled = {}
        if "input" in wanted:  # back to the input's dtype (never an int64 input: it depends on no wrt)
            pulled["input"] = op("cast", grad, node.operands["input"], dtype=None)
        if "like" in wanted:
            pulled["like"] = sympy.Integer(0)  # like gives only its dtype
        return pulled

    def table_row(self):
        return (
            self.op,
            "out = input.to(dtype), or input.to(like.dtype)",
            "grad_input = grad.to(input.dtype) (an int64 input: none)",
        )


RULES = [Cast()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "cast": [
        Sample(
            "cast-int64-and-float",
            {"a": [2, 3], "t": {"shape": [2], "dtype": "int64"}, "y": [2, 3]},
            [
                {"op": "cast", "in": "t", "like": "a", "out": "time"},
                {"op": "unsqueeze", "in": "time", "dim": 1, "out": "column"},
                {"op": "mul", "in": ["a", "column"], "out": "scaled"},
                {"op": "cast", "in": "scaled", "like": "y"},
            ],
            ["a"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "cast": [
        # diffusers' float32 timestep embedding in a float64 model: .float() and .to(dtype) are
        # cast layers
        Spelling("HalfPrecisionScale()", {"x": (2, 3)}, module=True),
    ],
}
