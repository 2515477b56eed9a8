"""Pooling: average (a depthwise convolution with the constant kernel 1/|K|, so its adjoint is the
transposed depthwise convolution, ``output_padding`` from the runtime shapes exactly as for conv)
and max (the gradient goes to the entry each window chose: its rule is ``pool_max.py``, its primitives
are here).
"""

from __future__ import annotations

import sympy

from ..algebra import LINEAR, Size, keyword_arguments, laid_out, op, primitive, show_ints
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, boolean, int64, int_tuple
from .resample import separable_adjoint


def _pool_adjoint_code(operands, params, show):
    grad, x = operands
    dims = params["dims"]
    kernel = params["kernel_size"]
    size = 1
    for k in kernel:
        size *= k
    weight = f"{grad}.new_full(({x}.shape[1], 1, {', '.join(map(str, kernel))}), 1 / {size})"
    output_padding = "(" + ", ".join(show(v) for v in params["output_padding"]) + ("," if dims == 1 else "") + ")"
    keywords = keyword_arguments(
        {"stride": params["stride"], "padding": params["padding"]}, {"stride": 1, "padding": 0}, show
    )
    return f"F.conv_transpose{dims}d({grad}, {weight}{keywords}, output_padding={output_padding}, groups={x}.shape[1])"


primitive(
    "avg_pool_adjoint",
    code=_pool_adjoint_code,
    latex=lambda operands, params, show: rf"\operatorname{{avgpool}}^{{\top}}\left({operands[0]}\right)",
    tangent=lambda expr, tangent_of: op(
        "avg_pool_adjoint", tangent_of(expr.operands[0]), expr.operands[1], **dict(expr.params.items())
    ),
)
AVG_POOL_DEFAULTS = {"padding": 0, "ceil_mode": False, "count_include_pad": True, "divisor_override": None}
primitive(
    "avg_pool",
    code=lambda operands, params, show: (
        f"F.avg_pool{params['dims']}d({operands[0]}, {show_ints(params['kernel_size'])}"
        + keyword_arguments(
            {
                "stride": params["stride"],
                **{key: params.get(key, default) for key, default in AVG_POOL_DEFAULTS.items()},
            },
            {"stride": params["kernel_size"], **AVG_POOL_DEFAULTS},
            show,
        )
        + ")"
    ),
    latex=lambda operands, params, show: rf"\operatorname{{avgpool}}\left({operands[0]}\right)",
    tangent=LINEAR,
)


def pool_stride(value, context: ParamContext):
    """Unset, or an empty list (PyTorch's ``stride=()``), means the kernel size."""
    return None if value is None or value == [] else int_tuple(1)(value, context)


def _pool_length(n, span: int, stride: int, padding: int, ceil: bool):
    """PyTorch's pooled length for input length ``n`` and window span ``span`` (dilated kernel): in
    ceil mode it rounds up, but the last window must start inside the input or its left padding."""
    size = n + 2 * padding - span
    if not ceil:
        return size // stride + 1
    length = (size + stride - 1) // stride + 1
    starts_past = (length - 1) * stride >= n + padding
    if isinstance(starts_past, sympy.Basic):  # symbolic sizes, while solving for small test shapes
        return sympy.Piecewise((length - 1, starts_past), (length, True))
    return length - int(starts_past)


class AveragePool(Rule):
    operands = (Operand("input", from_in=True),)
    linear_in = ("input",)

    def __init__(self, dims: int):
        self.dims = dims
        self.op = f"avg_pool{dims}d"
        self.calls = (self.op,)
        self.summary = f"{dims}-d average pooling"
        self.params = {
            "kernel_size": Param(None, int_tuple(1)),
            "stride": Param(None, pool_stride),
            "padding": Param(0, int_tuple(0)),
            "ceil_mode": Param(False, boolean),
            "count_include_pad": Param(True, boolean),
            "divisor_override": Param(None, self._divisor),
        }

    @staticmethod
    def _divisor(value, context):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value == 0):
            raise context.fail(f"must be a non-zero int or unset, not {value!r}", "write e.g. `divisor_override: 4`")
        return value if value is None else int64(value, context)

    def spatial_dims(self) -> int:
        return self.dims

    def _settings(self, params):
        stride = params["stride"] if params["stride"] is not None else params["kernel_size"]
        return params["kernel_size"], stride, params["padding"]

    def infer_shape(self, shapes, params, check: Checker):
        x = shapes["input"]
        if self.dims == 3:  # avg_pool3d alone (not 1d/2d, not max) refuses an input smaller than its kernel
            for axis, k in enumerate(params["kernel_size"]):
                check.positive(
                    x[len(x) - 3 + axis] - k + 1,
                    f"the input is smaller than the kernel ({k}) along axis {axis}, which avg_pool3d refuses",
                    "use a smaller kernel or a larger input",
                )
        return self._pooled_shape(x, params, check, dilation=(1,) * self.dims)

    def _pooled_shape(self, x, params, check: Checker, dilation):
        check.require(
            len(x) in (self.dims + 1, self.dims + 2),
            f"input has {len(x)} dimensions but {self.op} needs "
            f"{self.dims + 2} ([N, C, ...]) or {self.dims + 1} (unbatched)",
            "reshape the input",
        )
        kernel, stride, padding = self._settings(params)
        check.require(
            all(2 * p <= k for p, k in zip(padding, kernel)),
            "padding must be at most half the kernel size",
            "reduce padding",
        )
        lead = len(x) - self.dims
        out = list(x[:lead])
        for axis in range(self.dims):
            span = dilation[axis] * (kernel[axis] - 1) + 1
            length = _pool_length(x[lead + axis], span, stride[axis], padding[axis], params["ceil_mode"])
            # in ceil mode PyTorch takes a window that runs past the input's end (VoVNet's 3x3 stride-2
            # pool of a 2x2 map): only an empty output is refused
            if params["ceil_mode"]:
                check.positive(
                    length,
                    f"the pooled length along axis {axis} is {length}: no window starts inside the "
                    "input or its left padding",
                    "use a smaller kernel or stride, or a larger input",
                )
            else:
                check.positive(
                    x[lead + axis] + 2 * padding[axis] - span + 1,
                    f"kernel does not fit the padded input along axis {axis}",
                    "use a smaller kernel",
                )
            out.append(length)
        return tuple(out)

    def _uniform(self, params) -> bool:
        """Every window divided by |K|: a depthwise conv with the constant kernel 1/|K|."""
        return (
            not params["ceil_mode"]
            and params["divisor_override"] is None
            and (params["count_include_pad"] or not any(params["padding"]))
        )

    def _options(self, params) -> dict:
        return {
            key: params[key]
            for key in ("ceil_mode", "count_include_pad", "divisor_override")
            if params[key] != AVG_POOL_DEFAULTS[key]
        }

    def forward(self, node):
        kernel, stride, padding = self._settings(node.params)
        return Forward(
            op(
                "avg_pool",
                node.operands["input"],
                dims=self.dims,
                kernel_size=kernel,
                stride=stride,
                padding=padding,
                **self._options(node.params),
            )
        )

    def pullback(self, node, grad, wanted):
        kernel, stride, padding = self._settings(node.params)
        x = node.operands["input"]
        if not self._uniform(node.params) or len(node.shapes["input"]) == self.dims + 1:
            # ragged windows (ceil mode, padding not counted) or a fixed divisor: still separable, the
            # divisor being the product of each axis's window length (see the note above Interpolate)
            divisor = node.params["divisor_override"]
            contraction = separable_adjoint(
                node,
                grad,
                len(node.shapes["input"]) - self.dims,
                "window-sum" if divisor else "averaging",
                [
                    dict(
                        function="avg_pool",
                        kernel_size=kernel[axis],
                        stride=stride[axis],
                        padding=padding[axis],
                        **self._options(node.params),
                    )
                    for axis in range(self.dims)
                ],
            )
            return {"input": contraction / divisor if divisor else contraction}
        output_padding = tuple(
            sympy.Mod(Size(x, axis + 2) + 2 * padding[axis] - kernel[axis], stride[axis]) for axis in range(self.dims)
        )
        return {
            "input": op(
                "avg_pool_adjoint",
                grad,
                x,
                dims=self.dims,
                kernel_size=kernel,
                stride=stride,
                padding=padding,
                output_padding=output_padding,
            )
        }

    def table_row(self):
        return (
            self.op,
            "out = mean of each kernel window (a depthwise conv with the constant kernel 1/|K|)",
            "grad_input = conv_transpose(grad_out, 1/|K|, stride, padding, groups=C, output_padding from shapes); with ceil_mode, "
            "count_include_pad=False or divisor_override, grad_out contracted with each axis's pooling matrix transposed",
        )


def _max_pool_call(operands, params, show, indices: bool | str) -> str:
    """The max_pool call; ``indices``: only its argmax indices, or ``"both"``: (values, indices)."""
    keywords = keyword_arguments(
        {
            "stride": params["stride"],
            "padding": params["padding"],
            "dilation": params["dilation"],
            "ceil_mode": params.get("ceil_mode", False),
        },
        {"stride": params["kernel_size"], "padding": 0, "dilation": 1, "ceil_mode": False},
        show,
    )
    call = f"F.max_pool{params['dims']}d({operands[0]}, {show_ints(params['kernel_size'])}{keywords}"
    return call + {"both": ", return_indices=True)", True: ", return_indices=True)[1]", False: ")"}[indices]


primitive(
    "gather_at",
    code=lambda operands, params, show: (
        f"{operands[0]}.flatten({params['start']}).gather({params['start']}, {operands[1]}.flatten({params['start']})).view_as({operands[1]})"
    ),
    latex=lambda operands, params, show: rf"{operands[0]}\left[{operands[1]}\right]",
    tangent=lambda expr, tangent_of: op(
        "gather_at", tangent_of(expr.operands[0]), expr.operands[1], start=expr.params["start"]
    ),
)
primitive(
    "max_pool",
    code=lambda operands, params, show: _max_pool_call(operands, params, show, False),
    latex=lambda operands, params, show: rf"\operatorname{{maxpool}}\left({operands[0]}\right)",
    # piecewise linear: along dx it moves by dx at each window's argmax
    tangent=lambda expr, tangent_of: op(
        "gather_at",
        tangent_of(expr.operands[0]),
        op("max_pool_indices", expr.operands[0], **dict(expr.params.items())),
        start=expr.params["start"],
    ),
)
primitive(
    "max_pool_indices",
    code=lambda operands, params, show: _max_pool_call(operands, params, show, True),
    latex=lambda operands, params, show: rf"\operatorname{{argmax}}\left({operands[0]}\right)",
    tangent="constant",
)
primitive(
    "max_pool_with_indices",
    outputs=2,
    code=lambda operands, params, show: _max_pool_call(operands, params, show, "both"),
    latex=lambda operands, params, show: rf"\operatorname{{maxpool}}\left({operands[0]}\right)",
)
# the kernel takes the gradient in x's dtype only: under autocast it may arrive in float32 from an op
# autocast runs in float32 (group_norm, layer_norm) where x is bfloat16; autograd's is x's dtype too
primitive(
    "max_pool_backward",
    fresh=True,
    layout_operands=(1,),
    code=lambda operands, params, show: (
        f"torch.ops.aten.max_pool{params['dims']}d_with_indices_backward({operands[0]}.to({operands[1]}.dtype), "
        f"{laid_out(operands, params)}, "  # six more arguments: by their schema's names
        + ", ".join(
            f"{key}={show_ints(tuple(params[key]))}" for key in ("kernel_size", "stride", "padding", "dilation")
        )
        + f", ceil_mode={params.get('ceil_mode', False)}, indices={operands[2]}{'.long()' if params.get('narrowed') else ''})"
    ),
    latex=lambda operands, params, show: rf"\operatorname{{scatter}}_{{{operands[2]}}}\left({operands[0]}\right)",
)
NARROWED_INDICES = '''def _narrowed_indices(indices, positions):
    """Max-pool ``indices`` in planes of ``positions`` as int16 or int32 (int64 while compiling)."""
    narrow = torch.int16 if positions <= 2**15 else torch.int32 if positions <= 2**31 else None
    return indices if narrow is None or torch.compiler.is_compiling() else indices.to(narrow)
'''
"""Emitted once into each module that keeps a max pool's indices so (:func:`symgrad.kept.kept_as_narrow_indices`)."""

primitive(
    "narrowed_indices",
    helper=NARROWED_INDICES,
    shape_operands=(1,),
    code=lambda operands, params, show: f"_narrowed_indices({operands[0]}, {operands[1]}[{params['start']}:].numel())",
    latex=lambda operands, params, show: operands[0],
    tangent="constant",
)
primitive(
    "scatter_to",
    code=lambda operands, params, show: (
        f"torch.zeros_like({operands[2]}).flatten({params['start']}).scatter_add({params['start']}, {operands[1]}.flatten({params['start']}), "
        f"{operands[0]}.to({operands[2]}.dtype).flatten({params['start']}))"
        f".view_as({operands[2]})"
    ),
    latex=lambda operands, params, show: rf"\operatorname{{scatter}}_{{{operands[1]}}}\left({operands[0]}\right)",
    tangent=lambda expr, tangent_of: op(
        "scatter_to", tangent_of(expr.operands[0]), *expr.operands[1:], start=expr.params["start"]
    ),
)


RULES = [AveragePool(1), AveragePool(2), AveragePool(3)]
"""max pooling (``pool_max.py``) is an AveragePool with its own gradient."""


CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    ("avg_pool2d", {"x": (1, 2, 5, 5)}, {"op": "avg_pool2d", "kernel_size": 3, "stride": 2, "padding": 1}, ("x",)),
    ("avg_pool1d", {"x": (1, 1, 7)}, {"op": "avg_pool1d", "kernel_size": 2}, ("x",)),
    ("avg_pool3d", {"x": (1, 1, 3, 4, 3)}, {"op": "avg_pool3d", "kernel_size": [2, 2, 1], "stride": [1, 2, 1]}, ("x",)),
    (
        "avg_pool2d (ceil_mode, padding not counted)",
        {"x": (1, 1, 5, 7)},  # ragged last window along W
        {
            "op": "avg_pool2d",
            "kernel_size": 2,
            "stride": [2, 3],
            "padding": [1, 0],
            "ceil_mode": True,
            "count_include_pad": False,
        },
        ("x",),
    ),
    (
        "avg_pool1d (ceil_mode)",
        {"x": (1, 2, 8)},  # 4 windows, the last one ragged (floor mode: 3)
        {"op": "avg_pool1d", "kernel_size": 3, "stride": 2, "ceil_mode": True},
        ("x",),
    ),
    (
        "avg_pool3d (divisor_override)",
        {"x": (1, 1, 3, 3, 4)},
        {
            "op": "avg_pool3d",
            "kernel_size": 2,
            "stride": [1, 2, 2],
            "padding": [0, 1, 1],
            "ceil_mode": True,
            "divisor_override": 3,
        },
        ("x",),
    ),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "avg_pool1d": [
        Sample(
            "avg_pool1d-default-stride",
            {"x": [2, 3, 9], "y": [2, 3, 4]},
            [{"op": "avg_pool1d", "kernel_size": 2, "out": "out"}],
            ["x"],
        ),
        Sample(
            "avg_pool1d-ceil_mode-ragged-not-counted",
            {"x": [2, 2, 10], "y": [2, 2, 4]},
            [
                {
                    "op": "avg_pool1d",
                    "kernel_size": 2,
                    "stride": 3,
                    "ceil_mode": True,
                    "count_include_pad": False,
                    "out": "out",
                }
            ],
            ["x"],
        ),
    ],
    "avg_pool2d": [
        Sample(
            "avg_pool2d-stride-padding",
            {"x": [2, 3, 7, 7], "y": [2, 3, 4, 4]},
            [{"op": "avg_pool2d", "kernel_size": 3, "stride": 2, "padding": 1, "out": "out"}],
            ["x"],
        ),
        Sample(
            "avg_pool2d-ceil_mode",
            {"x": [2, 2, 8, 7], "y": [2, 2, 5, 4]},
            [{"op": "avg_pool2d", "kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "out": "out"}],
            ["x"],
        ),
        Sample(
            "avg_pool2d-ceil_mode-kernel-beyond-input",
            {"x": [2, 3, 2, 3], "y": [2, 3, 1, 1]},
            [{"op": "avg_pool2d", "kernel_size": 3, "stride": 2, "ceil_mode": True, "out": "out"}],
            ["x"],
        ),
        Sample(
            "avg_pool2d-padding-not-counted",
            {"x": [2, 2, 7, 6], "y": [2, 2, 4, 4]},
            [
                {
                    "op": "avg_pool2d",
                    "kernel_size": [3, 2],
                    "stride": 2,
                    "padding": 1,
                    "count_include_pad": False,
                    "out": "out",
                }
            ],
            ["x"],
        ),
        Sample(
            "avg_pool2d-unbatched",
            {"x": [3, 7, 6], "y": [3, 4, 3]},
            [{"op": "avg_pool2d", "kernel_size": 3, "stride": 2, "padding": 1, "out": "out"}],
            ["x"],
        ),
        Sample(
            "avg_pool2d-ceil_mode-kernel-overhangs-small-input",
            {"x": [2, 2, 2, 3], "y": [2, 2, 1, 1]},
            [{"op": "avg_pool2d", "kernel_size": 3, "stride": 2, "ceil_mode": True, "out": "out"}],
            ["x"],
        ),
    ],
    "avg_pool3d": [
        Sample(
            "avg_pool3d-ceil_mode-divisor_override",
            {"x": [1, 2, 5, 4, 5], "y": [1, 2, 3, 5, 3]},
            [
                {
                    "op": "avg_pool3d",
                    "kernel_size": 2,
                    "stride": [2, 1, 2],
                    "padding": 1,
                    "ceil_mode": True,
                    "divisor_override": 3,
                    "out": "out",
                }
            ],
            ["x"],
        ),
        Sample(
            "avg_pool3d",
            {"x": [1, 2, 5, 4, 6], "y": [1, 2, 2, 3, 2]},
            [{"op": "avg_pool3d", "kernel_size": [2, 2, 3], "stride": [2, 1, 2], "out": "out"}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "avg_pool1d": [
        Spelling("nn.AvgPool1d(3, 2, 1)", {"x": (2, 3, 9)}, module=True),
    ],
    "avg_pool2d": [
        Spelling("nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)", module=True),
    ],
    "avg_pool3d": [
        Spelling("nn.AvgPool3d(2)", {"x": (2, 2, 4, 4, 4)}, module=True),
        Spelling("nn.AvgPool3d(3, 2, 1, count_include_pad=False)", {"x": (2, 2, 4, 5, 3)}, module=True),
    ],
}
