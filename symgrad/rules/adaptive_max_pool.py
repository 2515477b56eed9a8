"""Adaptive max pooling, ``F.adaptive_max_pool{1,2,3}d(input, output_size)`` and ``nn.AdaptiveMaxPool2d``
(timm's ``SelectAdaptivePool2d`` with ``pool_type='max'``, ``'avgmax'`` and ``'catavgmax'`` heads; CBAM-style
global max descriptors): output entry ``i`` is the largest of the input entries
``floor(i n / m) .. ceil((i + 1) n / m) - 1`` along each axis.

Each output is one input entry, the argmax PyTorch's own kernel picks (its choice on ties), so the
adjoint adds each output's gradient into that entry, at the indices the same call returns (windows of
adjacent outputs may overlap: ``scatter_add`` sums them, as max pooling's adjoint does)::

    grad_input = zeros_like(input).flatten(-dims).scatter_add(-1, indices.flatten(-dims), grad.flatten(-dims))
"""

from __future__ import annotations

from ..algebra import op, primitive
from .base import Checker, Forward, Param, Rule, Sample, Spelling
from .resample import AdaptiveAveragePool, show_output_size


def _call(operands, params, indices: bool) -> str:
    call = f"F.adaptive_max_pool{params['dims']}d({operands[0]}, {show_output_size(params['output_size'])}"
    return call + (", return_indices=True)[1]" if indices else ")")


primitive(
    "adaptive_max_pool",
    code=lambda operands, params, show: _call(operands, params, False),
    latex=lambda operands, params, show: rf"\operatorname{{adaptivemaxpool}}\left({operands[0]}\right)",
    # piecewise linear: along dx it moves by dx at each window's argmax
    tangent=lambda expr, tangent_of: op(
        "gather_at",
        tangent_of(expr.operands[0]),
        op("adaptive_max_pool_indices", expr.operands[0], **dict(expr.params.items())),
        start=expr.params["start"],
    ),
)
primitive(
    "adaptive_max_pool_indices",
    code=lambda operands, params, show: _call(operands, params, True),
    latex=lambda operands, params, show: rf"\operatorname{{argmax}}\left({operands[0]}\right)",
    tangent="constant",
)


def _refuse_indices(value, context):
    if value is not False:  # PyTorch then returns (values, indices): not one layer's tensor
        raise context.fail(
            "= true is not supported", "leave return_indices false; the gradient uses the indices itself"
        )
    return False


class AdaptiveMaxPool(Rule):
    operands = AdaptiveAveragePool.operands

    def __init__(self, dims: int):
        self.dims = dims
        self.op = f"adaptive_max_pool{dims}d"
        self.calls = (self.op,)
        self.signature = ("input", "output_size", "return_indices")
        self.summary = f"{dims}-d adaptive max pooling to output_size; the gradient scattered to each window's argmax"
        self.params = {
            "output_size": AdaptiveAveragePool(dims).params["output_size"],
            "return_indices": Param(False, _refuse_indices),
        }

    def spatial_dims(self) -> int:
        return self.dims

    def reference(self, arguments, params):
        import torch.nn.functional as F

        return getattr(F, self.op)(arguments["input"], params["output_size"])

    def infer_shape(self, shapes, params, check: Checker):
        return AdaptiveAveragePool.infer_shape(self, shapes, params, check)

    def _pool_params(self, node) -> dict:
        return dict(dims=self.dims, output_size=node.params["output_size"], start=len(node.shapes["input"]) - self.dims)

    def forward(self, node):
        return Forward(op("adaptive_max_pool", node.operands["input"], **self._pool_params(node)))

    def pullback(self, node, grad, wanted):
        x = node.operands["input"]
        params = self._pool_params(node)
        indices = node.local(
            "indices", op("adaptive_max_pool_indices", x, **params), note=f"the argmax of each window of {node.name}"
        )
        return {"input": op("scatter_to", grad, indices, x, start=params["start"])}

    def table_row(self):
        return (
            self.op,
            "out = max over each adaptive window [floor(i n/m), ceil((i+1) n/m)), per axis",
            "grad_input = grad_out scatter-added at the argmax indices",
        )


RULES = [AdaptiveMaxPool(1), AdaptiveMaxPool(2), AdaptiveMaxPool(3)]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "adaptive_max_pool1d": [
        Sample(
            "adaptive_max_pool1d-global",
            {"x": [2, 3, 9], "y": [2, 3, 1]},
            [{"op": "adaptive_max_pool1d", "output_size": 1, "out": "out"}],
            ["x"],
        ),
    ],
    "adaptive_max_pool2d": [
        Sample(
            "adaptive_max_pool2d-overlapping-windows",
            {"x": [2, 3, 7, 5], "y": [2, 3, 3, 2]},
            [{"op": "adaptive_max_pool2d", "output_size": [3, 2], "out": "out"}],
            ["x"],
        ),
    ],
    "adaptive_max_pool3d": [
        Sample(
            "adaptive_max_pool3d",
            {"x": [1, 2, 4, 3, 5], "y": [1, 2, 2, 2, 3]},
            [{"op": "adaptive_max_pool3d", "output_size": [2, 2, 3], "out": "out"}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "adaptive_max_pool1d": [
        Spelling("nn.AdaptiveMaxPool1d(2)", {"x": (2, 3, 5)}, module=True),
    ],
    "adaptive_max_pool2d": [
        Spelling("F.adaptive_max_pool2d(x, 1) * x"),  # a global max pool
        Spelling("torch.cat([F.adaptive_avg_pool2d(x, (3, 2)), nn.AdaptiveMaxPool2d((3, 2))(x)], 1)"),
    ],
    "adaptive_max_pool3d": [
        Spelling("nn.AdaptiveMaxPool3d((2, 1, 2))", {"x": (2, 2, 3, 4, 3)}, module=True),
    ],
}
