"""Slicing with a step along one dim: ``x[:, ::2]``, ``x[:, 1::2, ::2]`` (LeViT's subsampled queries,
``x.reshape(B, H, W, C)[:, ::stride, ::stride]``; a space-to-depth written by slices), as PyTorch's
``aten.slice(input, dim, start, end, step)``; a step of 1 is ``narrow``.

The output keeps every ``step``-th entry from ``start`` up to ``end`` (the end of the dim where None, so
the spec stays shape-generic). Each output entry copies one input entry, and no two copy the same, so
the adjoint writes the gradient back into those entries of a zero tensor of the input's shape and
leaves the others zero::

    grad_input = zeros(input.shape).slice_scatter(grad, dim, start, end, step)
"""

from __future__ import annotations

from ..algebra import LINEAR, op, primitive
from .base import Checker, Forward, Operand, Param, Rule, Sample, Spelling, one_dim, positive_int


def _bounds(params) -> str:
    start = "" if params["start"] == 0 else str(params["start"])
    end = "" if params["end"] is None else str(params["end"])
    return f"{start}:{end}:{params['step']}"


def _slice_code(operands, params, show):
    return f"{operands[0]}[{':, ' * params['dim']}{_bounds(params)}]"


def _slice_scatter_code(operands, params, show):
    grad, shape = operands
    return (
        f"{grad}.new_zeros({shape}).slice_scatter({grad}, {params['dim']}, {params['start']}, "
        f"{params['end']}, {params['step']})"
    )


primitive(
    "slice", code=_slice_code, tangent=LINEAR, latex=lambda operands, params, show: f"{operands[0]}[{_bounds(params)}]"
)
primitive(
    "slice_scatter_back",
    code=_slice_scatter_code,
    shape_operands=(1,),
    latex=lambda operands, params, show: rf"\operatorname{{slice\_scatter}}\left({operands[0]}\right)",
    tangent=lambda expr, tangent_of: op(
        "slice_scatter_back", tangent_of(expr.operands[0]), *expr.operands[1:], **dict(expr.params.items())
    ),
)


def _start(value, context) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise context.fail(f"must be a non-negative int, not {value!r}", f"write e.g. `{context.name}: 1` (from 0)")
    return value


def _end(value, context) -> int | None:
    return None if value is None else positive_int(value, context)


class Slice(Rule):
    op = "slice"
    traced_elsewhere = "x[:, ::2], x[..., 1::2]: the tracer's slicing handler (a step of 1 is narrow)"
    operands = (Operand("input", from_in=True),)
    linear_in = ("input",)
    params = {
        "dim": Param(None, one_dim),
        "start": Param(0, _start),
        "end": Param(None, _end),
        "step": Param(1, positive_int),
    }
    summary = "every step-th entry from start to end (null: the dim's end) along dim; the gradient scattered back"

    def reference(self, arguments, params):
        x = arguments["input"]
        dim = params["dim"] % x.dim()
        return x[(slice(None),) * dim + (slice(params.get("start", 0), params.get("end"), params.get("step", 1)),)]

    def infer_shape(self, shapes, params, check: Checker):
        shape = list(shapes["input"])
        check.require(
            -len(shape) <= params["dim"] < len(shape),
            f"dim {params['dim']} is out of range for a {len(shape)}-dim input",
            f"give a dim in {-len(shape)}..{len(shape) - 1}",
        )
        dim = params["dim"] % len(shape)
        end = shape[dim] if params["end"] is None else params["end"]
        check.positive(
            shape[dim] - end + 1,
            f"the slice {_bounds(params)} ends past dim {dim} (size {shape[dim]})",
            "end at the dim's size or before, or leave end out (null)",
        )
        check.positive(
            end - params["start"],
            f"the slice {_bounds(params)} of dim {dim} (size {shape[dim]}) is empty",
            "start inside the dim, before end",
        )
        shape[dim] = (end - params["start"] + params["step"] - 1) // params["step"]
        return tuple(shape)

    def forward(self, node):
        dim = node.params["dim"] % len(node.shapes["input"])
        return Forward(
            op(
                "slice",
                node.operands["input"],
                dim=dim,
                start=node.params["start"],
                end=node.params["end"],
                step=node.params["step"],
            )
        )

    def pullback(self, node, grad, wanted):
        dim = node.params["dim"] % len(node.shapes["input"])
        return {
            "input": op(
                "slice_scatter_back",
                grad,
                node.operands["input"],
                dim=dim,
                start=node.params["start"],
                end=node.params["end"],
                step=node.params["step"],
            )
        }

    def table_row(self):
        return (
            self.op,
            "out = input[:, ..., start:end:step] (along dim)",
            "grad_input = zeros(input.shape).slice_scatter(grad_out, dim, start, end, step)",
        )


RULES = [Slice()]

CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    ("slice (every 2nd row)", {"x": (2, 3, 7, 5)}, {"op": "slice", "dim": 2, "step": 2}, ("x",)),
    (
        "slice (1:8:3 of the last dim)",
        {"x": (2, 3, 4, 9)},
        {"op": "slice", "dim": -1, "start": 1, "end": 8, "step": 3},
        ("x",),
    ),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "slice": [
        Sample(
            "slice-every-2nd-odd-size",
            {"x": [2, 3, 7, 5], "y": [2, 3, 4, 5]},
            [{"op": "slice", "dim": 2, "step": 2}],
            ["x"],
        ),
        Sample(
            "slice-start-end-step3",
            {"x": [2, 3, 4, 9], "y": [2, 3, 4, 3]},
            [{"op": "slice", "dim": -1, "start": 1, "end": 8, "step": 3}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "slice": [
        # LeViT's subsampled queries: x.view(B, H, W, C)[:, ::s, ::s]
        Spelling("x[:, :, ::2, 1::2]"),
        Spelling("x[..., 1:7:3] * x[:, 1::2, :, ::4]"),  # a fixed end; channels 1::2 broadcast
        Spelling("x[:, :, 1::2]"),  # SwinUNETR's patch merging, space-to-depth
        Spelling("torch.cat([x[..., 0::2, 0::2], x[..., 1::2, 0::2]], 1)"),
    ],
}
