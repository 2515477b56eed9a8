"""The primitives of the convolutions (``conv.py``, ``conv_transpose.py``): how ``conv``, ``conv_transpose``
(conv's input adjoint), the weight gradient (summed, and per sample), ``crop_to`` and autograd's own
``convolution_backward`` are written as code and as math. Why the adjoints take these forms is derived in
``conv.py``'s docstring."""

from __future__ import annotations

import sympy

from ..algebra import LINEAR, Size, TensorOp, keyword_arguments, primitive, shape_text, show_ints
from .conv_helpers import CONVOLUTION_BACKWARD
from .shared import affine_tangent

CONV_DEFAULTS = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}
TRANSPOSE_DEFAULTS = {"stride": 1, "padding": 0, "output_padding": 0, "groups": 1, "dilation": 1}


def _shown(value, show) -> str:
    """An int as itself; a size read at run time (a depthwise conv's ``groups``) as its code."""
    return show(value) if isinstance(value, sympy.Basic) else str(value)


def _math_args(params, show) -> str:
    """``_{s=32, p=1}``: the subscript that says how a convolution is strided, padded, dilated, grouped."""
    shown = [
        f"{key[0]}={show(params[key]) if isinstance(params[key], sympy.Basic) else show_ints(params[key])}"
        for key in ("stride", "padding", "dilation", "groups")
        if params[key] != (CONV_DEFAULTS[key],) * len(params["stride"]) and params[key] != CONV_DEFAULTS[key]
    ]
    return r"_{" + r",\,".join(shown) + "}" if shown else ""


def _conv_code(operands, params, show):
    bias = f", {operands[2]}" if len(operands) == 3 else ""
    return (
        f"F.conv{params['dims']}d({operands[0]}, {operands[1]}{bias}{keyword_arguments(params, CONV_DEFAULTS, show)})"
    )


def _conv_latex(operands, params, show):
    bias = f" + {operands[2]}" if len(operands) == 3 else ""
    return rf"{operands[1]} \star{_math_args(params, show)} {operands[0]}{bias}"


primitive("conv", code=_conv_code, latex=_conv_latex, tangent=affine_tangent("conv"), fresh=True)


def _transpose_code(operands, params, show):
    source, weight, *bias = operands
    bias = f", {bias[0]}" if bias else ""
    return f"F.conv_transpose{params['dims']}d({source}, {weight}{bias}{keyword_arguments(params, TRANSPOSE_DEFAULTS, show)})"


def _transpose_latex(operands, params, show):
    source, weight, *bias = operands
    return rf"{weight}^{{\top}} \star{_math_args(params, show)} {source}" + (f" + {bias[0]}" if bias else "")


# the input adjoint of conv, and the forward of conv_transpose: one definition
primitive("conv_transpose", code=_transpose_code, latex=_transpose_latex, tangent=affine_tangent("conv_transpose"))


def _weight_grad_code(operands, params, show):
    """``torch.nn.grad.convNd_weight``: PyTorch's own weight-gradient kernel (one
    ``aten.convolution_backward`` call, which is twice differentiable), given the weight's shape, so
    no extra taps need cropping. Where the correlation's lengths do not match a forward conv (a
    transposed conv's ``output_padding >= stride``), the correlation written out: ``F.convNd`` of
    x as [C_in/g, g*N, ...] with grad as [C_out, N, ...], stride=dilation, dilation=stride."""
    x, grad = operands
    dims, groups = params["dims"], params["groups"]
    if params.get("unbatched"):  # [C, ...] is one sample: give it its batch axis back
        x, grad = f"{x}.unsqueeze(0)", f"{grad}.unsqueeze(0)"
    weight_size = params.get("weight_size")
    if weight_size is not None:
        shown = {key: params[key] for key in CONV_DEFAULTS}
        size = _shape_of(weight_size, show)
        # x in grad's dtype: under autocast grad arrives in the precision the forward ran in, where
        # the caller's x may be float32 (the kernel takes one dtype; autograd saved x cast alike)
        return (
            f"torch.nn.grad.conv{dims}d_weight({x}.to({grad}.dtype), {size}, {grad}"
            f"{keyword_arguments(shown, CONV_DEFAULTS, show)})"
        )
    if groups == 1:
        x_t = f"{x}.transpose(0, 1)"
    else:
        order = ", ".join(["2", "1", "0"] + [str(axis) for axis in range(3, dims + 3)])
        x_t = f"{x}.unflatten(1, ({_shown(groups, show)}, -1)).permute({order}).flatten(1, 2)"
    swapped = dict(params.items())
    swapped["stride"], swapped["dilation"] = params["dilation"], params["stride"]
    call = f"F.conv{dims}d({x_t}, {grad}.transpose(0, 1){keyword_arguments(swapped, CONV_DEFAULTS, show)})"
    call += ".transpose(0, 1)"
    crop = params["crop_to"]
    if any(size is not None for size in crop):
        call += "[:, :, " + ", ".join(f":{show(size)}" if size is not None else ":" for size in crop) + "]"
    return call


def _whole_shape_of(sizes):
    """The tensor whose shape the sizes are, axis by axis in order; None if they are not one's."""
    if (
        all(isinstance(size, Size) for size in sizes)
        and len({size.of for size in sizes}) == 1
        and [size.axis for size in sizes] == list(range(len(sizes)))
    ):
        return sizes[0].of
    return None


def _shape_of(sizes, show) -> str:
    """``w.shape`` when the sizes are all of one tensor's axes in order, else the tuple written out."""
    whole = _whole_shape_of(sizes)
    if whole is None:
        return "(" + ", ".join(show(size) for size in sizes) + ")"
    return shape_text(show(whole), whole)


def _per_sample_weight_grad_code(operands, params, show):
    """Every sample's weight gradient in one call, the batch folded into the groups (N * g of them).

    Where the correlation is a forward conv's weight gradient (``weight_size`` given), it is
    ``torch.nn.grad.convNd_weight`` of x as [1, N*C_in, ...] and grad as [1, N*C_out, ...] for a
    weight [N*C_out, C_in/g, K...]: PyTorch's own weight-gradient kernel, reached through views
    alone, and laid out as [N, C_out, C_in/g, K...] by splitting the first axis. (``python -m
    benchmarks.trials``, results in benchmarks/results: 7-26x faster than the grouped forward conv
    below on an H100; on a 2-core CPU 2-2.6x faster at 32 -> 32 channels, and at 32 -> 1 as fast at
    batch 8 but up to 1.6x slower at batches 32-64. Unfold + bmm, ExpandedWeights' choice from batch
    32, was slower than it on both at batches 8 to 64 and several times larger, so it is not offered.)

    Otherwise (a transposed conv with ``output_padding >= stride``) the correlation is written out as
    one grouped forward conv: x [N, C_in, ...] becomes [C_in/g, N*g, ...]; grad [N, C_out, ...] becomes
    the kernel [N*C_out, 1, ...]; stride and dilation swap as for the summed weight gradient; the
    result [C_in/g, N*C_out, K...] is laid out as [N, C_out, C_in/g, K...] and cropped."""
    x, grad = operands
    dims, groups = params["dims"], params["groups"]
    total_groups = f"{x}.shape[0]" if groups == 1 else f"{x}.shape[0] * {_shown(groups, show)}"
    weight_size = params.get("weight_size")
    if weight_size is not None:
        shown = {**{key: params[key] for key in CONV_DEFAULTS}, "groups": 1}  # groups written below: it counts samples
        weight = _whole_shape_of(weight_size)
        size = (
            f"({x}.shape[0] * {show(weight)}.shape[0], *{show(weight)}.shape[1:])"
            if weight is not None
            else "(" + ", ".join([f"{x}.shape[0] * {show(weight_size[0])}"] + [show(s) for s in weight_size[1:]]) + ")"
        )
        return (
            f"torch.nn.grad.conv{dims}d_weight({x}.flatten(0, 1).unsqueeze(0), {size}, "
            f"{grad}.flatten(0, 1).unsqueeze(0){keyword_arguments(shown, CONV_DEFAULTS, show)}, "
            f"groups={total_groups}).unflatten(0, ({x}.shape[0], -1))"
        )
    spatial = [str(axis) for axis in range(3, dims + 3)]
    if groups == 1:
        x_t = f"{x}.transpose(0, 1)"
    else:
        x_t = f"{x}.unflatten(1, ({_shown(groups, show)}, -1)).permute({', '.join(['2', '0', '1'] + spatial)}).flatten(1, 2)"
    swapped = dict(params.items())
    swapped["stride"], swapped["dilation"] = params["dilation"], params["stride"]
    swapped["groups"] = 1  # left out here: the real count depends on the batch size, written below
    call = (
        f"F.conv{dims}d({x_t}, {grad}.flatten(0, 1).unsqueeze(1){keyword_arguments(swapped, CONV_DEFAULTS, show)}, "
        f"groups={total_groups})"
    )
    call += f".unflatten(1, ({x}.shape[0], -1)).permute({', '.join(['1', '2', '0'] + spatial)})"
    crop = params["crop_to"]
    if any(size is not None for size in crop):
        call += "[:, :, :, " + ", ".join(f":{show(size)}" if size is not None else ":" for size in crop) + "]"
    return call


primitive(
    "crop_to",
    code=lambda operands, params, show: (
        f"{operands[0]}[{':, ' * params['start']}"
        + ", ".join(
            f":{operands[1]}.shape[{params['start'] + axis}]" if keep else ":"
            for axis, keep in enumerate(params["axes"])
        )
        + "]"
    ),
    latex=lambda operands, params, show: operands[0],
    tangent=lambda expr, tangent_of: TensorOp("crop_to", expr.params, tangent_of(expr.operands[0]), expr.operands[1]),
)


primitive(
    "conv_weight_grad_per_sample",
    code=_per_sample_weight_grad_code,
    latex=lambda operands, params, show: (
        rf"\left[{{{operands[0]}}}_{{n}} \star^{{w}}{_math_args(params, show)} {{{operands[1]}}}_{{n}}\right]_{{n}}"
    ),
    tangent=LINEAR,
)


def _weight_grad_latex(operands, params, show):
    x, grad = operands
    return rf"{x} \star^{{w}}{_math_args(params, show)} {grad}"


primitive("conv_weight_grad", code=_weight_grad_code, latex=_weight_grad_latex, tangent=LINEAR)


def _backward_code(operands, params, show):
    """``_convolution_backward(grad, x, w, [mask], stride=2, padding=1)``: the arguments that differ
    from a plain convolution's, as ``F.conv2d`` is written (the helper fills in the rest)."""
    grad, x, w, *owner = operands  # owner: the weight itself, where w is its autocast copy (kept_casts.py)
    dims = params["dims"]
    mask = "[" + ", ".join(map(str, params["output_mask"])) + "]"
    parts = []
    for key, default in (("stride", 1), ("padding", 0), ("dilation", 1)):
        if any(value != default for value in params[key]):
            parts.append(f"{key}={show_ints(tuple(params[key]))}")
    if params.get("transposed"):
        parts.append("transposed=True")
    output_padding = tuple(params.get("output_padding", (0,) * dims))
    if any(value != 0 for value in output_padding):
        parts.append(f"output_padding={show_ints(output_padding)}")
    if params["groups"] != 1:
        parts.append(f"groups={_shown(params['groups'], show)}")
    if params["output_mask"][2]:
        parts.append(
            f"bias_sizes=[{w}.shape[1] * {_shown(params['groups'], show)}]"
            if params.get("transposed")
            else f"bias_sizes=[{w}.shape[0]]"
        )
    if owner:
        parts.append(f"weight_dtype={owner[0]}.dtype")
    if params.get("defer_weight_cast"):  # its caller casts it (kept.deferred_weight_casts)
        parts.append("defer_weight_cast=True")
    return f"_convolution_backward({grad}, {x}, {w}, {mask}" + "".join(", " + part for part in parts) + ")"


def _backward_latex(operands, params, show):
    return rf"\operatorname{{conv\_backward}}\left({', '.join(operands)}\right)"


primitive(
    "conv_backward",
    code=_backward_code,
    latex=_backward_latex,
    helper=CONVOLUTION_BACKWARD,
    outputs=3,
    autocast_operands=(1,),
    fresh=True,
)
