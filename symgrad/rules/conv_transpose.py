"""``conv_transpose1d``, ``conv_transpose2d``, ``conv_transpose3d``: the input adjoint of a conv, so its
own adjoints are conv's, swapped (every helper, and the derivation, in ``conv.py``)."""

from __future__ import annotations

from ..algebra import op
from .base import Checker, Forward, NodeSymbols, Param, Sample, Spelling, int_tuple
from .conv import Convolution


class TransposedConvolution(Convolution):
    """``conv_transposeNd``: the input adjoint of a conv, so its own adjoints are conv's, swapped.

    ``<conv_transpose(x, w), g> = <x, conv(g, w)>``: the input adjoint is ``conv(g, w)`` with the
    same stride, padding, dilation and groups. Its length is ``H_x + floor(output_padding / s)``:
    when ``output_padding < stride`` conv's floor drops exactly the extra positions, but PyTorch also
    allows ``stride <= output_padding < dilation``, and then the tail is cropped back to ``x``'s
    length. Read as a function of ``w``, the weight adjoint is conv's weight correlation with ``g``
    as the input and ``x`` as the output gradient (``K + floor(output_padding / d)`` taps, cropped to
    ``K`` when ``stride > dilation`` makes the extra taps possible)."""

    params = {**Convolution.params, "output_padding": Param(0, int_tuple(0))}

    def __init__(self, dims: int):
        super().__init__(dims)
        self.op = f"conv_transpose{dims}d"
        self.calls = (self.op,)
        self.summary = f"{dims}-d transposed convolution (the adjoint of conv{dims}d in its input), plus bias"

    WEIGHT_LAYOUT = "C_in, C_out/groups"

    def fan_in_axes(self, rank: int) -> list[int]:
        return [0, *range(2, rank)]  # [C_in, C_out/groups, kernel...]: every input channel reaches each output

    def infer_shape(self, shapes, params, check: Checker):
        x, w = shapes["input"], shapes["weight"]
        self._check_ranks(x, w, check)
        check.require(
            params["padding"] != "same",
            "padding='same' is not defined for transposed convolutions",
            "give explicit padding",
        )
        groups = params["groups"]
        lead = len(x) - self.dims - 1  # 1 with a batch axis, 0 without
        check.equal(
            x[lead],
            w[0],
            f"input has {x[lead]} channels but weight expects {w[0]}",
            "make the weight's dim 0 equal the input channels",
        )
        check.equal(
            w[0] % groups,
            0,
            f"weight has {w[0]} input channels, not divisible by groups={groups}",
            "use a number of input channels divisible by groups",
        )
        for axis, (o, s, d) in enumerate(zip(params["output_padding"], params["stride"], params["dilation"])):
            check.require(
                o < s or o < d,
                f"output_padding {o} must be smaller than stride {s} or dilation {d} (axis {axis})",
                "reduce output_padding",
            )
        if "bias" in shapes:
            b = shapes["bias"]
            check.require(len(b) == 1, f"bias must be 1-d ([C_out]), not {len(b)}-d", "give bias the shape [C_out]")
            check.equal(
                b[0],
                w[1] * groups,
                f"bias has {b[0]} entries but the output has {w[1] * groups} channels",
                "give bias the shape [C_out]",
            )
        out = [*x[:lead], w[1] * groups]
        for axis in range(self.dims):
            p, d, s, o = (params[key][axis] for key in ("padding", "dilation", "stride", "output_padding"))
            size = (x[axis + lead + 1] - 1) * s - 2 * p + d * (w[axis + 2] - 1) + o + 1
            check.positive(size, f"output length along spatial axis {axis} is not positive", "use less padding")
            out.append(size)
        return tuple(out)

    def forward(self, node: NodeSymbols) -> Forward:
        operands = [node.operands["input"], node.operands["weight"]]
        if "bias" in node.operands:
            operands.append(node.operands["bias"])
        return Forward(
            op("conv_transpose", *operands, **self._params(node, output_padding=node.params["output_padding"]))
        )

    def _fused_extras(self, node: NodeSymbols) -> dict:
        return {"transposed": True, "output_padding": node.params["output_padding"]}

    def _correlated(self, x, grad):
        return grad, x  # <conv_transpose(x, w), g> = <x, conv(g, w)>: g is the input, x the gradient

    def _lengths_match(self, node: NodeSymbols) -> bool:
        # conv(g) has len(x) + floor(output_padding / s) entries: len(x) exactly when output_padding < s
        return all(pad < stride for pad, stride in zip(node.params["output_padding"], node.params["stride"]))

    def pullback(self, node: NodeSymbols, grad, wanted):
        if self._fuses(node, wanted):
            return self._fused_pullback(node, grad, wanted)
        lead = self._lead(node)
        x, w = node.operands["input"], node.operands["weight"]
        stride, dilation = node.params["stride"], node.params["dilation"]
        grads = {}
        if "input" in wanted:
            grads["input"] = op("conv", grad, w, **self._params(node))
            crop = tuple(
                dilation[axis] > stride[axis] for axis in range(self.dims)
            )  # output_padding >= stride possible
            if any(crop):
                grads["input"] = op(
                    "crop_to", grads["input"], x, axes=crop, start=lead + 1
                )  # from the first spatial dim
        if "weight" in wanted:
            source, kernel = self._correlated(x, grad)
            grads["weight"] = op("conv_weight_grad", source, kernel, **self._weight_params(node))
        if "bias" in wanted:
            grads["bias"] = op("sum", grad, dim=self._bias_sum_dims(node))
        return grads

    def table_row(self):
        return (
            self.op,
            "out = weightᵀ ⋆ input + bias  (the input adjoint of conv: stride s, padding p, output_padding, dilation d, groups g)",
            "grad_input = conv(grad_out, weight; s, p, d, g); grad_weight = grad_out ⋆ input with stride d and dilation s; "
            "grad_bias = grad_out summed over N and space",
        )


RULES = [TransposedConvolution(1), TransposedConvolution(2), TransposedConvolution(3)]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "conv_transpose1d": [
        Sample(
            "conv_transpose1d-unbatched-output_padding-beyond-stride",
            {"x": [2, 5], "w": [2, 3, 3], "y": [3, 17]},
            [{"op": "conv_transpose1d", "weight": "w", "stride": 2, "output_padding": 2, "dilation": 3, "out": "out"}],
            ["x", "w"],
        ),
        Sample(
            "conv_transpose1d-output_padding-beyond-stride",
            {"x": [2, 2, 5], "w": [2, 3, 3], "y": [2, 3, 17]},
            [{"op": "conv_transpose1d", "weight": "w", "stride": 2, "output_padding": 2, "dilation": 3, "out": "out"}],
            ["x", "w"],
        ),
    ],
    "conv_transpose2d": [
        Sample(
            "conv_transpose2d-unbatched-groups-bias",
            {"x": [2, 3, 4], "w": [2, 2, 3, 3], "b": [4], "y": [4, 8, 10]},
            [
                {
                    "op": "conv_transpose2d",
                    "weight": "w",
                    "stride": 2,
                    "output_padding": 1,
                    "groups": 2,
                    "out": "out",
                    "bias": "b",
                }
            ],
            ["x", "w", "b"],
        ),
        Sample(
            "conv_transpose2d-stride-output_padding-bias",
            {"x": [2, 3, 4, 4], "w": [3, 2, 3, 3], "b": [2], "y": [2, 2, 8, 8]},
            [
                {
                    "op": "conv_transpose2d",
                    "weight": "w",
                    "stride": 2,
                    "padding": 1,
                    "output_padding": 1,
                    "out": "out",
                    "bias": "b",
                }
            ],
            ["x", "w", "b"],
        ),
        Sample(
            "conv_transpose2d-groups-per-axis",
            {"x": [1, 4, 3, 4], "w": [4, 3, 2, 3], "y": [1, 6, 8, 8]},
            [
                {
                    "op": "conv_transpose2d",
                    "weight": "w",
                    "stride": [3, 1],
                    "padding": [1, 0],
                    "output_padding": [2, 0],
                    "dilation": [1, 2],
                    "groups": 2,
                    "out": "out",
                }
            ],
            ["x", "w"],
        ),
    ],
    "conv_transpose3d": [
        Sample(
            "conv_transpose3d-stride-padding-bias",
            {"x": [1, 2, 3, 3, 3], "w": [2, 2, 2, 2, 2], "b": [2], "y": [1, 2, 4, 4, 4]},
            [{"op": "conv_transpose3d", "weight": "w", "stride": 2, "padding": 1, "out": "out", "bias": "b"}],
            ["x", "w", "b"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "conv_transpose1d": [
        Spelling("F.conv_transpose1d(x, w, None, 3, 1, 2, 1, 2)", {"x": (2, 3, 5), "w": (3, 2, 3)}),
    ],
    "conv_transpose2d": [
        Spelling(
            "nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1, groups=1, dilation=2)", module=True
        ),
    ],
    "conv_transpose3d": [
        Spelling("nn.ConvTranspose3d(2, 2, 2, stride=2, groups=2)", {"x": (2, 2, 3, 3, 3)}, module=True),
    ],
}
