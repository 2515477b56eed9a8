"""Resampling: pixel_shuffle and pixel_unshuffle (permutations of entries, each the other's adjoint), interpolate
in every mode (its rule: ``interpolate.py``) and adaptive average pooling (separable linear maps, one small
matrix per axis).
"""

from __future__ import annotations

import sympy

from ..algebra import CONSTANT, LINEAR, keyword_arguments, laid_out, op, primitive, show_ints
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, ints

primitive(
    "pixel_shuffle",
    code=lambda operands, params, show: f"F.{params['function']}({operands[0]}, {params['factor']})",
    latex=lambda operands, params, show: (
        rf"\operatorname{{{params['function'].replace('_', chr(92) + '_')}}}\left({operands[0]}\right)"
    ),
    tangent=LINEAR,
)


class PixelShuffle(Rule):
    """``pixel_shuffle`` moves r² channels into an r×r block of pixels; ``pixel_unshuffle`` (the
    downsampling of Restormer and FFDNet) moves them back. Each is a permutation of entries, so each
    is the other's adjoint."""

    operands = (Operand("input", from_in=True),)
    linear_in = ("input",)

    def __init__(self, op_name: str, factor: str, inverse: str, summary: str):
        self.op, self.factor, self.inverse, self.summary = op_name, factor, inverse, summary
        self.calls = (op_name,)
        self.params = {factor: Param(None, lambda v, c: ints(v, c)[0])}

    def infer_shape(self, shapes, params, check: Checker):
        n, c, h, w = shapes["input"] if len(shapes["input"]) == 4 else (None,) * 4
        check.require(n is not None, f"{self.op} needs a 4-d input [N, C, H, W]", "reshape the input")
        r = params[self.factor]
        check.require(r >= 1, f"{self.factor} must be positive", "use e.g. 2")
        if self.op == "pixel_shuffle":
            check.equal(
                c % (r * r), 0, f"{c} channels are not divisible by upscale_factor² = {r * r}", "fix the channels"
            )
            return (n, c // (r * r), h * r, w * r)
        check.equal(h % r, 0, f"height {h} is not divisible by downscale_factor {r}", "pad or crop the input")
        check.equal(w % r, 0, f"width {w} is not divisible by downscale_factor {r}", "pad or crop the input")
        return (n, c * r * r, h // r, w // r)

    def forward(self, node):
        return Forward(op("pixel_shuffle", node.operands["input"], function=self.op, factor=node.params[self.factor]))

    def pullback(self, node, grad, wanted):
        return {"input": op("pixel_shuffle", grad, function=self.inverse, factor=node.params[self.factor])}

    def table_row(self):
        return self.op, f"out = F.{self.op}(input, r)", f"grad_input = F.{self.inverse}(grad_out, r)"


primitive(
    "interpolate_nearest",
    code=lambda operands, params, show: (
        f"F.interpolate({operands[0]}, scale_factor={show_ints(params['scale'])}, mode='nearest')"
    ),
    latex=lambda operands, params, show: rf"\operatorname{{upsample}}\left({operands[0]}\right)",
    tangent=LINEAR,
)
primitive(
    "block_sum",
    code=lambda operands, params, show: (
        f"F.avg_pool{params['dims']}d({operands[0]}, {show_ints(params['scale'])}) * {_product(params['scale'])}"
    ),
    latex=lambda operands, params, show: rf"\operatorname{{blocksum}}\left({operands[0]}\right)",
    tangent=LINEAR,
)


def _product(values) -> int:
    total = 1
    for value in values:
        total *= value
    return total


# --------------------------------------------------------------------------------------------
# Separable resampling: interpolate in every mode, adaptive average pooling
# --------------------------------------------------------------------------------------------
#
# Each of these acts on one spatial axis at a time with the same small matrix for every other index:
# out[n, c, i, j] = sum_{p, q} A_H[i, p] A_W[j, q] x[n, c, p, q]. (Bilinear is linear interpolation
# along H, then along W; an adaptive average over a rectangle is an average over its rows, then its
# columns.) The adjoint is the same contraction with each matrix transposed,
#
#     grad_x[n, c, p, q] = sum_{i, j} A_H[i, p] A_W[j, q] grad[n, c, i, j],
#
# one einsum. Each A_k depends only on the sizes along its axis, so the emitted code builds it at run
# time, exactly as PyTorch's own kernel weighs the entries: it applies the op itself, along that axis
# only, to the identity matrix. Row p of eye(n) is the unit vector e_p, so the result's row p is
# column p of A_k, that is A_k^T, with every convention (align_corners, cubic coefficient, antialias
# support, adaptive window bounds) PyTorch's, and shape-generic.


def separable_adjoint(node, grad, first: int, what: str, per_axis: list[dict]):
    """``grad`` contracted with each spatial axis's matrix, transposed; ``per_axis[k]`` holds the
    ``resampling_matrix`` params of spatial axis ``k``, which is dim ``first + k`` of the input."""
    x = node.operands["input"]
    matrices = [
        node.local(
            "local",
            op("resampling_matrix", x, dim=first + axis, axis=axis, dims=len(per_axis), **params),
            suffix=f"dim{first + axis}",
            note=f"{node.name}'s {what} matrix along dim {first + axis}, transposed: "
            f"the identity {'interpolated' if params['function'] == 'interpolate' else 'pooled'} along that dim",
        )
        for axis, params in enumerate(per_axis)
    ]
    return op("axis_contraction", grad, *matrices, axes=tuple(range(first, first + len(per_axis))))


def _interpolate_options(params) -> list[str]:
    """mode, align_corners, recompute_scale_factor and antialias as PyTorch keywords, when set."""
    keywords = [f"mode={params['mode']!r}"]
    for key in ("align_corners", "recompute_scale_factor"):
        if params[key] is not None:
            keywords.append(f"{key}={params[key]}")
    if params["antialias"]:
        keywords.append("antialias=True")
    return keywords


def _resampling_matrix_code(operands, params, show):
    (x,) = operands
    dims, axis = params["dims"], params["axis"]
    eye = f"torch.eye({x}.shape[{params['dim']}], dtype={x}.dtype, device={x}.device)"
    if params["function"] == "avg_pool":
        divisor = params.get("divisor_override")
        options = keyword_arguments(
            {**dict(params.items()), "stride": (params["stride"], 1), "padding": (params["padding"], 0)}
            if divisor
            else params,
            {"stride": None, "padding": 0, "ceil_mode": False, **({} if divisor else {"count_include_pad": True})},
            show,
        )
        if divisor:  # the window sums; the one divisor is applied after the contraction
            return f"F.avg_pool2d({eye}[None, :, :, None], ({params['kernel_size']}, 1){options}, divisor_override=1)[0].flatten(1)"
        return f"F.avg_pool1d({eye}[None], {params['kernel_size']}{options})[0]"
    if params["function"] == "adaptive_avg_pool":
        size = params["size"] if params["size"] is not None else f"{x}.shape[{params['dim']}]"  # None keeps the size
        return f"F.adaptive_avg_pool1d({eye}[None], {size})[0]"
    index = ", ".join([":" if k == axis else "None" for k in range(dims)])
    # the other axes have size 1 (antialias: 2, as PyTorch's antialiased kernel resamples a probe one
    # entry wide wrongly), and are left as they are: size 1 -> 1, or 2 -> 2 by scale 1
    width = 2 if params["antialias"] else 1
    probe = f"{eye}[None, :, {index}]" + (
        f".repeat(1, 1, {', '.join('1' if k == axis else '2' for k in range(dims))})" if width == 2 else ""
    )
    keywords = []
    if params["size"] is not None:
        keywords.append(
            "size=("
            + ", ".join(str(params["size"]) if k == axis else str(width) for k in range(dims))
            + ("," if dims == 1 else "")
            + ")"
        )
    else:
        keywords.append(
            "scale_factor=("
            + ", ".join(repr(params["scale"]) if k == axis else "1.0" for k in range(dims))
            + ("," if dims == 1 else "")
            + ")"
        )
    keywords += _interpolate_options(params)
    if width == 2:
        column = ", ".join(":" if k == axis else "0" for k in range(dims))
        return f"F.interpolate({probe}, {', '.join(keywords)})[0, :, {column}]"
    return f"F.interpolate({probe}, {', '.join(keywords)})[0].flatten(1)"


primitive(
    "resampling_matrix",
    code=_resampling_matrix_code,
    latex=lambda operands, params, show: rf"A_{{{params['dim']}}}^{{\top}}",
    tangent=CONSTANT,
)  # built from sizes only


def _contraction_code(operands, params, show):
    grad, *matrices = operands
    outer, inner = "ijk"[: len(matrices)], "pqr"[: len(matrices)]
    subscripts = f"...{outer}," + ",".join(f"{p}{i}" for p, i in zip(inner, outer)) + f"->...{inner}"
    return f"torch.einsum('{subscripts}', {grad}, {', '.join(matrices)})"


primitive(
    "axis_contraction",
    code=_contraction_code,
    latex=lambda operands, params, show: (
        operands[0] + "".join(rf" \times_{{{axis}}} {matrix}" for axis, matrix in zip(params["axes"], operands[1:]))
    ),
    tangent=LINEAR,
)


def _interpolate_keywords(params, show) -> str:
    """``F.interpolate``'s keywords: size or scale_factor, then :func:`_interpolate_options`."""
    size = params["size"]
    if isinstance(size, tuple):  # sizes computed from another node's (PAN's h // 2) print as Python
        size = tuple(
            show(entry) if isinstance(entry, sympy.Basic) and not entry.is_Integer else entry for entry in size
        )
    keywords = [
        f"size={show_ints(size)}"
        if params["size"] is not None
        else f"scale_factor={_show_scale(params['scale_factor'])}",
        *_interpolate_options(params),
    ]
    return ", ".join(keywords)


def _interpolate_code(operands, params, show):
    return f"F.interpolate({operands[0]}, {_interpolate_keywords(params, show)})"


def _show_scale(scale: tuple) -> str:
    if len(set(scale)) == 1:
        return repr(scale[0])
    return "(" + ", ".join(map(repr, scale)) + ")"


primitive(
    "interpolate",
    code=_interpolate_code,
    latex=lambda operands, params, show: (
        rf"\operatorname{{{params['mode'].replace('-', '')}}}\left({operands[0]}\right)"
    ),
    tangent=LINEAR,
)


INTERPOLATION_RANK = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}


UPSAMPLE_BACKWARD = '''def _upsample_backward(kernel, grad_output, input_shape, options, **interpolate):
    """The adjoint of ``F.interpolate(input, **interpolate)`` at ``grad_output``: autograd's own
    ``kernel`` (an ``upsample_*_backward``; ``options``: its align_corners and scales), one pass and
    twice differentiable. Under ``torch.compile`` these kernels have no fake implementation for
    symbolic sizes (torch 2.13: a batch or image size that changed), so there the adjoint of this
    linear map is traced through ``F.interpolate``'s own decomposition, as compiled autograd
    traces it.
    """
    if not torch.compiler.is_compiling():
        return kernel(grad_output, grad_output.shape[2:], input_shape, *options)
    zeros = grad_output.new_zeros(input_shape)
    _, pullback = torch.func.vjp(lambda value: F.interpolate(value, **interpolate), zeros)
    return pullback(grad_output)[0]
'''
"""Emitted once into each module that calls it (``Primitive.helper``)."""


def _upsample_backward_code(operands, params, show):
    grad, input_shape = operands
    options = [str(bool(params["align_corners"]))] if params["mode"] in INTERPOLATION_RANK else []
    if params["scales"] is not None:
        options += [repr(scale) for scale in params["scales"]]
    kernel = f"torch.ops.aten.{params['kernel']}_backward"
    return (
        f"_upsample_backward({kernel}, {grad}, {input_shape}, [{', '.join(options)}], "
        f"{_interpolate_keywords(params, show)})"
    )


# each input entry receives the interpolation weights it was given, summed: autograd's own kernel, one pass
# where the readable form builds each axis's matrix, twice differentiable (its derivative in the gradient is
# the interpolation itself); the input gives only its shape. Under torch.compile the kernel cannot be traced
# at symbolic sizes, and the same adjoint is traced from F.interpolate (UPSAMPLE_BACKWARD)
primitive(
    "upsample_backward",
    code=_upsample_backward_code,
    shape_operands=(1,),
    helper=UPSAMPLE_BACKWARD,
    latex=lambda operands, params, show: rf"\operatorname{{interpolate}}^{{\top}}\left({operands[0]}\right)",
)


class AdaptiveAveragePool(Rule):
    """``adaptive_avg_poolNd``: output entry ``i`` averages input entries
    ``floor(i n / m) .. ceil((i + 1) n / m) - 1`` along each axis, separably (see the note above
    ``Interpolate``), so the adjoint is the einsum with each axis's averaging matrix transposed."""

    operands = (Operand("input", from_in=True),)
    linear_in = ("input",)

    def __init__(self, dims: int):
        self.dims = dims
        self.op = f"adaptive_avg_pool{dims}d"
        self.calls = (self.op,)
        self.summary = f"{dims}-d adaptive average pooling to output_size"
        self.params = {"output_size": Param(None, self._output_size)}

    def spatial_dims(self) -> int:
        return self.dims

    def _output_size(self, value, context: ParamContext):
        values = value if isinstance(value, list) else [value] * self.dims
        if len(values) != self.dims or any(
            v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1) for v in values
        ):
            raise context.fail(
                f"must be a positive int or a list of {self.dims} (positive ints or null), not {value!r}",
                "write e.g. `output_size: 7`",
            )
        return tuple(values)

    def infer_shape(self, shapes, params, check: Checker):
        x = shapes["input"]
        check.require(
            len(x) in (self.dims + 1, self.dims + 2),
            f"input has {len(x)} dimensions but {self.op} needs "
            f"{self.dims + 2} ([N, C, ...]) or {self.dims + 1} (unbatched)",
            "reshape the input",
        )
        lead = len(x) - self.dims
        return (*x[:lead], *(n if m is None else m for n, m in zip(x[lead:], params["output_size"])))

    def forward(self, node):
        return Forward(
            op("adaptive_avg_pool", node.operands["input"], dims=self.dims, output_size=node.params["output_size"])
        )

    def pullback(self, node, grad, wanted):
        if node.fused and all(size == 1 for size in node.params["output_size"]):  # a global average pool:
            # PyTorch runs it as a mean over the spatial axes, whose backward autograd calls
            return {"input": op("global_avg_pool_backward", grad, node.operands["input"], dims=self.dims)}
        if node.fused and self.dims > 1:  # 1-d pooling runs as 2-d in PyTorch, with no kernel of its own
            return {"input": op("adaptive_avg_pool_backward", grad, node.operands["input"], dims=self.dims)}
        return {
            "input": separable_adjoint(
                node,
                grad,
                len(node.shapes["input"]) - self.dims,
                "averaging",
                [dict(function="adaptive_avg_pool", size=size) for size in node.params["output_size"]],
            )
        }

    def table_row(self):
        return (
            self.op,
            "out = mean over each adaptive window [floor(i n/m), ceil((i+1) n/m)), per axis",
            "grad_input = grad_out contracted with each axis's averaging matrix transposed (from adaptive_avg_pool1d of the identity)",
        )


primitive(
    "adaptive_avg_pool",
    code=lambda operands, params, show: (
        f"F.adaptive_avg_pool{params['dims']}d({operands[0]}, {show_output_size(params['output_size'])})"
    ),
    latex=lambda operands, params, show: rf"\operatorname{{adaptiveavgpool}}\left({operands[0]}\right)",
    tangent=LINEAR,
)


# each input entry receives the gradient of every window holding it, over that window's size: autograd's
# own kernel, one pass where the readable form builds each axis's matrix, and twice differentiable (its
# derivative in the gradient is the pooling itself); the input gives only its layout
primitive(
    "adaptive_avg_pool_backward",
    fresh=True,
    layout_operands=(1,),
    code=lambda operands, params, show: (  # the kernel takes the gradient in the input's dtype only, as autograd
        # gives it (under autocast it may arrive in float32 from an op autocast runs in float32)
        f"torch.ops.aten._adaptive_avg_pool{params['dims']}d_backward({operands[0]}.to({operands[1]}.dtype), "
        f"{laid_out(operands, params)})"
    ),
    latex=lambda operands, params, show: rf"\operatorname{{adaptiveavgpool}}^{{\top}}\left({operands[0]}\right)",
)


# adaptive_avg_poolNd to 1 runs as x.mean(spatial axes, keepdim=True) in PyTorch (any N, either layout),
# whose backward is grad.expand(x.shape) / n: the same quotients, divided on the pooled gradient before it
# is spread (one small division and a copy, 2-5x faster on a CPU than dividing the spread gradient and
# 3-25x than the pooling kernel, which also rounds otherwise where n is no power of 2), contiguous as
# autograd's; the input gives only its sizes and dtype (under autocast the gradient may arrive in float32)
primitive(
    "global_avg_pool_backward",
    fresh=True,
    layout_operands=(1,),
    code=lambda operands, params, show: (
        f"({operands[0]}.to({operands[1]}.dtype) / {operands[1]}.shape[-{params['dims']}:].numel())"
        f".expand({operands[1]}.shape).contiguous()"
    ),
    latex=lambda operands, params, show: rf"\operatorname{{adaptiveavgpool}}^{{\top}}\left({operands[0]}\right)",
)


def show_output_size(sizes: tuple) -> str:
    if len(set(sizes)) == 1 and sizes[0] is not None:
        return str(sizes[0])
    return "(" + ", ".join(map(str, sizes)) + ("," if len(sizes) == 1 else "") + ")"


RULES = [
    PixelShuffle("pixel_shuffle", "upscale_factor", "pixel_unshuffle", "[N, C r², H, W] -> [N, C, H r, W r]"),
    PixelShuffle("pixel_unshuffle", "downscale_factor", "pixel_shuffle", "[N, C, H r, W r] -> [N, C r², H, W]"),
    AdaptiveAveragePool(1),
    AdaptiveAveragePool(2),
    AdaptiveAveragePool(3),
]
"""interpolate's rule is ``interpolate.py``; its primitives are here."""


CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    ("pixel_shuffle", {"x": (1, 4, 2, 3)}, {"op": "pixel_shuffle", "upscale_factor": 2}, ("x",)),
    ("pixel_unshuffle", {"x": (1, 1, 4, 2)}, {"op": "pixel_unshuffle", "downscale_factor": 2}, ("x",)),
    ("adaptive_avg_pool1d (unbatched)", {"x": (2, 7)}, {"op": "adaptive_avg_pool1d", "output_size": 3}, ("x",)),
    ("adaptive_avg_pool2d", {"x": (1, 2, 5, 4)}, {"op": "adaptive_avg_pool2d", "output_size": [3, 3]}, ("x",)),
    ("adaptive_avg_pool3d", {"x": (1, 1, 3, 4, 2)}, {"op": "adaptive_avg_pool3d", "output_size": [2, 3, None]}, ("x",)),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "pixel_shuffle": [
        Sample(
            "pixel_shuffle",
            {"x": [2, 8, 3, 3], "y": [2, 2, 6, 6]},
            [{"op": "pixel_shuffle", "upscale_factor": 2, "out": "out"}],
            ["x"],
        ),
    ],
    "pixel_unshuffle": [
        Sample(
            "pixel_unshuffle",
            {"x": [2, 3, 4, 6], "y": [2, 12, 2, 3]},
            [{"op": "pixel_unshuffle", "downscale_factor": 2, "out": "out"}],
            ["x"],
        ),
    ],
    "adaptive_avg_pool1d": [
        Sample(
            "adaptive_avg_pool1d",
            {"x": [2, 3, 7], "y": [2, 3, 3]},
            [{"op": "adaptive_avg_pool1d", "output_size": 3, "out": "out"}],
            ["x"],
        ),
    ],
    "adaptive_avg_pool2d": [
        Sample(
            "adaptive_avg_pool2d-keep-one-dim",
            {"x": [2, 3, 7, 5], "y": [2, 3, 3, 5]},
            [{"op": "adaptive_avg_pool2d", "output_size": [3, None], "out": "out"}],
            ["x"],
        ),
        Sample(  # global average pooling: autograd's mean backward, bitwise (7 x 5 positions, no power of 2)
            "adaptive_avg_pool2d-global",
            {"x": [2, 3, 7, 5], "y": [2, 3, 1, 1]},
            [{"op": "adaptive_avg_pool2d", "output_size": 1, "out": "out"}],
            ["x"],
        ),
        Sample(
            "adaptive_avg_pool2d-unbatched",
            {"x": [3, 9, 6], "y": [3, 4, 4]},
            [{"op": "adaptive_avg_pool2d", "output_size": 4, "out": "out"}],
            ["x"],
        ),
    ],
    "adaptive_avg_pool3d": [
        Sample(
            "adaptive_avg_pool3d",
            {"x": [1, 2, 5, 4, 3], "y": [1, 2, 2, 3, 1]},
            [{"op": "adaptive_avg_pool3d", "output_size": [2, 3, 1], "out": "out"}],
            ["x"],
        ),
        Sample(
            "adaptive_avg_pool3d-global",
            {"x": [2, 2, 3, 5, 3], "y": [2, 2, 1, 1, 1]},
            [{"op": "adaptive_avg_pool3d", "output_size": 1, "out": "out"}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "pixel_shuffle": [
        Spelling("nn.PixelShuffle(2)", {"x": (2, 8, 3, 3)}, module=True),
    ],
    "pixel_unshuffle": [
        Spelling("nn.PixelUnshuffle(2)", module=True),
        Spelling("F.pixel_unshuffle(x, 4)"),
    ],
    "adaptive_avg_pool1d": [
        Spelling("nn.AdaptiveAvgPool1d(2)", {"x": (2, 3, 8)}, module=True),
    ],
    "adaptive_avg_pool2d": [
        Spelling("nn.AdaptiveAvgPool2d((1, 1))", module=True),
        Spelling("x.mean(dim=(2, 3))"),
        Spelling("x.mean([-1, -2], keepdim=True)"),
    ],
    "adaptive_avg_pool3d": [
        Spelling("nn.AdaptiveAvgPool3d(1)", {"x": (2, 2, 4, 4, 4)}, module=True),
    ],
}
