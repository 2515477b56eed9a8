"""``max_pool1d/2d/3d``: the gradient goes to the entry each window chose, scatter-added at PyTorch's
own argmax indices; the window arithmetic and the primitives are ``pool.py``'s."""

from __future__ import annotations

from ..algebra import op, tensor
from .base import Checker, Forward, Param, Sample, Spelling, boolean, int_tuple
from .pool import AveragePool, pool_stride


class MaxPool(AveragePool):
    """Max pooling: each output is one input entry, the argmax of its window (PyTorch's choice on
    ties). The adjoint adds each output's gradient into the input entry it came from: a
    ``scatter_add`` at the indices PyTorch's own max_pool returns, which also sums correctly where
    windows overlap (``max_unpool`` would overwrite)."""

    linear_in = ()

    def __init__(self, dims: int):
        super().__init__(dims)
        self.op = f"max_pool{dims}d"
        self.calls = (self.op, f"{self.op}_with_indices")
        # F.max_pool2d is a dispatch wrapper whose own signature is (*args, **kwargs)
        self.signature = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
        self.summary = f"{dims}-d max pooling (floor or ceil mode)"
        self.params = {
            "kernel_size": Param(None, int_tuple(1)),
            "stride": Param(None, pool_stride),
            "padding": Param(0, int_tuple(0)),
            "dilation": Param(1, int_tuple(1)),
            "ceil_mode": Param(False, boolean),
            "return_indices": Param(False, self._refuse_indices),
        }

    @staticmethod
    def _refuse_indices(value, context):
        if value is not False:  # PyTorch then returns (values, indices): not one layer's tensor
            raise context.fail(
                "= true is not supported yet", "leave return_indices false; the gradient uses the indices itself"
            )
        return False

    def infer_shape(self, shapes, params, check: Checker):
        x = shapes["input"]
        return self._pooled_shape(x, params, check, dilation=params["dilation"])

    def _pool_params(self, node):
        kernel, stride, padding = self._settings(node.params)
        ceil = {"ceil_mode": True} if node.params["ceil_mode"] else {}
        start = len(node.shapes["input"]) - self.dims  # the first spatial dim: PyTorch's indices count within it
        return dict(
            dims=self.dims,
            kernel_size=kernel,
            stride=stride,
            padding=padding,
            dilation=node.params["dilation"],
            start=start,
            **ceil,
        )

    def forward(self, node):
        value = op("max_pool", node.operands["input"], **self._pool_params(node))
        if not node.fused:
            return Forward(value)
        # the fused derivation keeps the argmax the forward finds, instead of pooling again in the backward
        pooled = node.local(
            "pooled",
            op("max_pool_with_indices", node.operands["input"], **self._pool_params(node)),
            note=f"{node.name} with the argmax indices its gradient reads",
        )
        node.local("indices", op("item", pooled, index=1), note=f"{node.name}'s argmax indices")
        return Forward(op("item", pooled, index=0), math=value)

    def pullback(self, node, grad, wanted):
        x = node.operands["input"]
        if node.fused and self.dims in (2, 3):  # autograd's own kernel, at the argmax forward() above found
            return {
                "input": op("max_pool_backward", grad, x, tensor(f"indices_{node.name}"), **self._pool_params(node))
            }
        if node.fused:  # named by forward() above
            indices = tensor(f"indices_{node.name}")
        else:
            indices = node.local("indices", op("max_pool_indices", x, **self._pool_params(node)))
        return {"input": op("scatter_to", grad, indices, x, start=self._pool_params(node)["start"])}

    def table_row(self):
        return (
            self.op,
            "out = max of each kernel window",
            "grad_input = grad_out scatter-added at the argmax indices (overlapping windows add up)",
        )


RULES = [MaxPool(1), MaxPool(2), MaxPool(3)]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "max_pool1d": [
        Sample(
            "max_pool1d",
            {"x": [2, 2, 9], "y": [2, 2, 4]},
            [{"op": "max_pool1d", "kernel_size": 2, "out": "out"}],
            ["x"],
        ),
        Sample(
            "max_pool1d-ceil_mode-ragged-last-window",
            {"x": [2, 2, 10], "y": [2, 2, 4]},
            [{"op": "max_pool1d", "kernel_size": 2, "stride": 3, "ceil_mode": True, "out": "out"}],
            ["x"],
        ),
    ],
    "max_pool2d": [
        # a window past the input's end (VoVNet's 3x3 stride-2 ceil-mode pool of a 2x2 map): PyTorch
        # takes it
        Sample(
            "max_pool2d-ceil_mode-kernel-beyond-input",
            {"x": [2, 3, 2, 2], "y": [2, 3, 1, 1]},
            [{"op": "max_pool2d", "kernel_size": 3, "stride": 2, "ceil_mode": True, "out": "out"}],
            ["x"],
        ),
        Sample(
            "max_pool2d-overlapping-windows",
            {"x": [2, 3, 7, 7], "y": [2, 3, 4, 4]},
            [{"op": "max_pool2d", "kernel_size": 3, "stride": 2, "padding": 1, "out": "out"}],
            ["x"],
        ),
        Sample(
            "max_pool2d-unbatched",
            {"x": [3, 7, 6], "y": [3, 4, 7]},
            [{"op": "max_pool2d", "kernel_size": 2, "stride": [2, 1], "padding": 1, "out": "out"}],
            ["x"],
        ),
        Sample(
            "max_pool2d-ceil_mode",
            {"x": [2, 2, 8, 7], "y": [2, 2, 5, 4]},
            [{"op": "max_pool2d", "kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "out": "out"}],
            ["x"],
        ),
        Sample(
            "max_pool2d-ceil_mode-kernel-overhangs-small-input",
            {"x": [2, 2, 2, 3], "y": [2, 2, 1, 1]},
            [{"op": "max_pool2d", "kernel_size": 3, "stride": 2, "ceil_mode": True, "out": "out"}],
            ["x"],
        ),
    ],
    "max_pool3d": [
        Sample(
            "max_pool3d-dilation",
            {"x": [1, 2, 4, 5, 4], "y": [1, 2, 2, 2, 2]},
            [{"op": "max_pool3d", "kernel_size": 2, "dilation": [1, 2, 1], "out": "out"}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "max_pool1d": [
        Spelling("nn.MaxPool1d(2)", {"x": (2, 3, 8)}, module=True),
    ],
    "max_pool2d": [
        Spelling("nn.MaxPool2d(3, 2, 1, ceil_mode=True)", module=True),
    ],
    "max_pool3d": [
        Spelling("F.max_pool3d(x, 2)", {"x": (2, 2, 4, 4, 4)}),
    ],
}
