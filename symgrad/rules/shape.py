"""Linear maps that only move, copy or pad entries, and average pooling.

Each adjoint is one shape-generic PyTorch expression:

- ``flatten``/``reshape``: reshape the gradient back to the input's runtime shape;
- ``permute``: the inverse permutation;
- ``pad`` (constant mode): ``pad(g, -p)``. Padding by ``p`` appends zeros, and its transpose drops
  those positions again, which is padding by ``-p`` (and negative padding, a crop, transposes to
  zero padding). The constant ``value`` only shifts the output, so it has no gradient;
- ``pixel_shuffle``: ``pixel_unshuffle`` with the same factor (a permutation of entries);
- ``avg_pool``: a depthwise convolution whose kernel is the constant 1/|K|, so its adjoint is the
  transposed depthwise convolution with that kernel, with ``output_padding`` from the runtime
  shapes exactly as for conv (see ``conv.py``).
"""

from __future__ import annotations

import sympy

from ..algebra import CONSTANT, LINEAR, Size, keyword_arguments, op, primitive, show_ints
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, choice, int_tuple


def _ints(value, context: ParamContext) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    if not values or any(isinstance(item, bool) or not isinstance(item, int) for item in values):
        raise context.fail(f"must be an int or a list of ints, not {value!r}", f"write e.g. `{context.name}: [0, 2, 1, 3]`")
    return tuple(values)


primitive("reshape_like", code=lambda operands, params, show: f"{operands[0]}.reshape({operands[1]}.shape)",
          latex=lambda operands, params, show: operands[0],
          tangent=lambda expr, tangent_of: op("reshape_like", tangent_of(expr.operands[0]), expr.operands[1]))
primitive("flatten", code=lambda operands, params, show: f"torch.flatten({operands[0]}{keyword_arguments(params, {'start_dim': 0, 'end_dim': -1}, show)})",
          latex=lambda operands, params, show: rf"\operatorname{{flatten}}\left({operands[0]}\right)", tangent=LINEAR)
primitive("reshape", code=lambda operands, params, show: f"{operands[0]}.reshape({', '.join(map(str, params['shape']))})",
          latex=lambda operands, params, show: rf"\operatorname{{reshape}}\left({operands[0]}\right)", tangent=LINEAR)
primitive("permute", code=lambda operands, params, show: f"{operands[0]}.permute({', '.join(map(str, params['dims']))})",
          latex=lambda operands, params, show: rf"{operands[0]}^{{\pi}}", tangent=LINEAR)
def _pad_code(operands, params, show):
    pads = ", ".join(show(p) if isinstance(p, sympy.Basic) else str(p) for p in params["pad"])
    mode = params.get("mode", "constant")
    extra = f", mode={mode!r}" if mode != "constant" else (f", value={params['value']}" if params.get("value", 0) != 0 else "")
    return f"F.pad({operands[0]}, [{pads}]{extra})"


primitive("pad", code=_pad_code,
          latex=lambda operands, params, show: rf"\operatorname{{pad}}\left({operands[0]}\right)",
          # affine: the constant value does not move, the copied (or reflected, wrapped) entries do
          tangent=lambda expr, tangent_of: op("pad", tangent_of(expr.operands[0]), pad=expr.params["pad"],
                                                mode=expr.params.get("mode", "constant")))
primitive("flip", code=lambda operands, params, show: f"{operands[0]}.flip({params['dim']})",
          latex=lambda operands, params, show: rf"\operatorname{{flip}}\left({operands[0]}\right)", tangent=LINEAR)
primitive("pixel_shuffle", code=lambda operands, params, show: f"F.{params['function']}({operands[0]}, {params['factor']})",
          latex=lambda operands, params, show: rf"\operatorname{{{params['function'].replace('_', chr(92) + '_')}}}\left({operands[0]}\right)",
          tangent=LINEAR)


class Flatten(Rule):
    op = "flatten"
    operands = (Operand("input", from_in=True),)
    params = {"start_dim": Param(0, lambda v, c: _ints(v, c)[0]), "end_dim": Param(-1, lambda v, c: _ints(v, c)[0])}
    summary = "merge dims start_dim..end_dim"
    linear_in = ("input",)

    def infer_shape(self, shapes, params, check: Checker):
        shape = list(shapes["input"])
        start, end = params["start_dim"] % len(shape), params["end_dim"] % len(shape)
        check.require(start <= end, f"start_dim {params['start_dim']} comes after end_dim {params['end_dim']}", "swap them")
        merged = 1
        for size in shape[start:end + 1]:
            merged = merged * size
        return tuple(shape[:start] + [merged] + shape[end + 1:])

    def forward(self, node):
        return Forward(op("flatten", node.operands["input"], start_dim=node.params["start_dim"], end_dim=node.params["end_dim"]))

    def pullback(self, node, grad, wanted):
        return {"input": op("reshape_like", grad, node.operands["input"])}

    def table_row(self):
        return self.op, "out = input with dims start_dim..end_dim merged", "grad_input = grad_out.reshape(input.shape)"


class Reshape(Flatten):
    op = "reshape"
    params = {"shape": Param(None, _ints)}
    summary = "the same entries in another shape"

    def infer_shape(self, shapes, params, check: Checker):
        target = list(params["shape"])
        check.require(target.count(-1) <= 1 and all(s == -1 or s > 0 for s in target),
                      f"shape {target} may hold one -1 and otherwise positive sizes", "fix the shape")
        total = 1
        for size in shapes["input"]:
            total = total * size
        known = 1
        for size in target:
            known = known * (size if size != -1 else 1)
        if -1 in target:
            target[target.index(-1)] = total // known
            check.equal(total % known, 0, f"shape {list(params['shape'])} does not divide the input's {total} entries",
                        "fix the shape")
        else:
            check.equal(known, total, f"shape {target} holds {known} entries, not the input's {total}", "fix the shape")
        return tuple(target)

    def forward(self, node):
        return Forward(op("reshape", node.operands["input"], shape=node.params["shape"]))

    def table_row(self):
        return self.op, "out = input.reshape(shape)", "grad_input = grad_out.reshape(input.shape)"


class Permute(Rule):
    op = "permute"
    operands = (Operand("input", from_in=True),)
    params = {"dims": Param(None, _ints)}
    summary = "reorder the dims"
    linear_in = ("input",)

    def infer_shape(self, shapes, params, check: Checker):
        shape = shapes["input"]
        dims = [d % len(shape) for d in params["dims"]]
        check.require(sorted(dims) == list(range(len(shape))), f"dims {list(params['dims'])} are not a permutation of the "
                      f"input's {len(shape)} dims", f"list each of 0..{len(shape) - 1} once")
        return tuple(shape[d] for d in dims)

    def forward(self, node):
        return Forward(op("permute", node.operands["input"], dims=node.params["dims"]))

    def pullback(self, node, grad, wanted):
        dims = [d % len(node.shapes["input"]) for d in node.params["dims"]]
        inverse = tuple(sorted(range(len(dims)), key=dims.__getitem__))
        return {"input": op("permute", grad, dims=inverse)}

    def table_row(self):
        return self.op, "out = input.permute(dims)", "grad_input = grad_out.permute(inverse of dims)"


class Pad(Rule):
    """``F.pad`` in every mode. Constant padding appends values, so its adjoint drops those
    positions again: ``pad(g, -p)``. The other modes copy input entries into the border, so the
    adjoint adds each border entry's gradient back onto the entry it was copied from. Padding is
    separable, one axis after another, so the adjoint folds one axis at a time; along an axis of
    size ``n`` with ``l`` entries before and ``r`` after, ``g[l : l + n]`` lands in place and

    - ``circular``: ``g[:l]`` copies ``x[n - l:]`` and ``g[l + n:]`` copies ``x[:r]``;
    - ``replicate``: all of ``g[:l]`` copies ``x[0]`` and all of ``g[l + n:]`` copies ``x[n - 1]``;
    - ``reflect``: ``g[i]`` copies ``x[l - i]``, so ``flip(g[:l])`` lands on ``x[1 : l + 1]``, and
      ``flip(g[l + n:])`` on ``x[n - 1 - r : n - 1]``.

    Each of these is a ``narrow`` of the gradient (flipped or summed) zero-padded into place."""

    op = "pad"
    operands = (Operand("input", from_in=True),)
    params = {"pad": Param(None, _ints), "mode": Param("constant", choice("constant", "reflect", "replicate", "circular")),
              "value": Param(0, lambda v, c: v)}
    summary = "padding: constant (negative pads crop), reflect, replicate or circular"
    linear_in = ("input",)  # for value 0; otherwise affine

    def infer_shape(self, shapes, params, check: Checker):
        shape = list(shapes["input"])
        pad, mode = params["pad"], params["mode"]
        check.require(len(pad) % 2 == 0 and len(pad) // 2 <= len(shape), f"pad {list(pad)} needs pairs for at most "
                      f"{len(shape)} dims", "give (left, right) pairs, last dim first")
        check.require(isinstance(params["value"], (int, float)) and not isinstance(params["value"], bool),
                      "value must be a number", "write e.g. `value: 0`")
        if mode != "constant":
            padded = len(pad) // 2
            check.require(padded in (1, 2, 3) and len(shape) in (padded + 1, padded + 2),
                          f"mode '{mode}' pads the last 1 to 3 dims of a tensor with one or two more dims; "
                          f"{padded} padded dims of a {len(shape)}-d input is not that",
                          "pad the last 1, 2 or 3 dims of a [C, ...] or [N, C, ...] input")
            check.require(params["value"] == 0, f"mode '{mode}' takes no value (PyTorch rejects it)", "drop `value`")
            check.require(all(p >= 0 for p in pad), f"mode '{mode}' with a negative pad is not supported",
                          "crop with `narrow` first, then pad by non-negative amounts")
        for pair in range(len(pad) // 2):
            axis = len(shape) - 1 - pair
            before, after = pad[2 * pair], pad[2 * pair + 1]
            if mode == "reflect":
                check.positive(shape[axis] - max(before, after), f"reflect padding {max(before, after)} must be smaller "
                               f"than dim {axis} of the input", "pad less, or use mode replicate")
            if mode == "circular":
                check.positive(shape[axis] - max(before, after) + 1, f"circular padding {max(before, after)} wraps "
                               f"around dim {axis} more than once", "pad at most the dim's size")
            shape[axis] = shape[axis] + before + after
            check.positive(shape[axis], f"padding leaves dim {axis} empty", "pad less negatively")
        return tuple(shape)

    def forward(self, node):
        return Forward(op("pad", node.operands["input"], pad=node.params["pad"], mode=node.params["mode"], value=node.params["value"]))

    def pullback(self, node, grad, wanted):
        pad, mode = node.params["pad"], node.params["mode"]
        if mode == "constant":
            return {"input": op("pad", grad, pad=tuple(-p for p in pad))}
        x, rank = node.operands["input"], len(node.shapes["input"])
        folded = grad
        for pair in range(len(pad) // 2):
            axis = rank - 1 - pair
            before, after = pad[2 * pair], pad[2 * pair + 1]
            if before or after:
                folded = self._fold(folded, Size(x, axis), axis, rank, before, after, mode)
                if pair < len(pad) // 2 - 1:  # name each axis's fold, so the next one reads it once
                    folded = node.local("local", folded, suffix=f"dim{axis}",
                                        note=f"{node.name}'s gradient with the {mode} border of dim {axis} folded back in")
        return {"input": folded}

    @staticmethod
    def _fold(grad, n, axis: int, rank: int, before: int, after: int, mode: str):
        """The adjoint along one axis: the gradient of every copy added onto its source entry."""

        def place(part, left, right):  # zero-pad ``part`` along ``axis`` only
            return op("pad", part, pad=(0, 0) * (rank - 1 - axis) + (left, right))

        terms = [op("narrow", grad, dim=axis, start=before, length=n)]
        if before:
            edge = op("narrow", grad, dim=axis, start=0, length=before)
            terms.append({"circular": lambda: place(edge, n - before, 0),
                          "replicate": lambda: place(op("sum", edge, dim=(axis,), keepdim=True), 0, n - 1),
                          "reflect": lambda: place(op("flip", edge, dim=axis), 1, n - 1 - before)}[mode]())
        if after:
            edge = op("narrow", grad, dim=axis, start=before + n, length=after)
            terms.append({"circular": lambda: place(edge, 0, n - after),
                          "replicate": lambda: place(op("sum", edge, dim=(axis,), keepdim=True), n - 1, 0),
                          "reflect": lambda: place(op("flip", edge, dim=axis), n - 1 - after, 1)}[mode]())
        return sympy.Add(*terms)

    def table_row(self):
        return (self.op, "out = F.pad(input, pad, mode, value)",
                "constant: grad_input = F.pad(grad_out, -pad); reflect/replicate/circular: the centre of grad_out plus "
                "each border's gradient added onto the entries it copies (flipped for reflect, summed for replicate)")


class PixelShuffle(Rule):
    op = "pixel_shuffle"
    operands = (Operand("input", from_in=True),)
    params = {"upscale_factor": Param(None, lambda v, c: _ints(v, c)[0])}
    summary = "[N, C r², H, W] -> [N, C, H r, W r]"
    linear_in = ("input",)

    def infer_shape(self, shapes, params, check: Checker):
        n, c, h, w = shapes["input"] if len(shapes["input"]) == 4 else (None,) * 4
        check.require(n is not None, "pixel_shuffle needs a 4-d input [N, C r², H, W]", "reshape the input")
        r = params["upscale_factor"]
        check.require(r >= 1, "upscale_factor must be positive", "use e.g. 2")
        check.equal(c % (r * r), 0, f"{c} channels are not divisible by upscale_factor² = {r * r}", "fix the channels")
        return (n, c // (r * r), h * r, w * r)

    def forward(self, node):
        return Forward(op("pixel_shuffle", node.operands["input"], function="pixel_shuffle", factor=node.params["upscale_factor"]))

    def pullback(self, node, grad, wanted):
        return {"input": op("pixel_shuffle", grad, function="pixel_unshuffle", factor=node.params["upscale_factor"])}

    def table_row(self):
        return self.op, "out = F.pixel_shuffle(input, r)", "grad_input = F.pixel_unshuffle(grad_out, r)"


def _pool_adjoint_code(operands, params, show):
    grad, x = operands
    dims = params["dims"]
    kernel = params["kernel_size"]
    size = 1
    for k in kernel:
        size *= k
    weight = f"{grad}.new_full(({x}.shape[1], 1, {', '.join(map(str, kernel))}), 1 / {size})"
    output_padding = "(" + ", ".join(show(v) for v in params["output_padding"]) + ("," if dims == 1 else "") + ")"
    keywords = keyword_arguments({"stride": params["stride"], "padding": params["padding"]}, {"stride": 1, "padding": 0}, show)
    return (f"F.conv_transpose{dims}d({grad}, {weight}{keywords}, output_padding={output_padding}, groups={x}.shape[1])")


primitive("avg_pool_adjoint", code=_pool_adjoint_code,
          latex=lambda operands, params, show: rf"\operatorname{{avgpool}}^{{\top}}\left({operands[0]}\right)",
          tangent=lambda expr, tangent_of: op("avg_pool_adjoint", tangent_of(expr.operands[0]), expr.operands[1],
                                                **dict(expr.params.items())))
AVG_POOL_DEFAULTS = {"padding": 0, "ceil_mode": False, "count_include_pad": True, "divisor_override": None}
primitive("avg_pool", code=lambda operands, params, show: f"F.avg_pool{params['dims']}d({operands[0]}, {show_ints(params['kernel_size'])}"
          + keyword_arguments({"stride": params["stride"], **{key: params.get(key, default) for key, default in AVG_POOL_DEFAULTS.items()}},
                              {"stride": params["kernel_size"], **AVG_POOL_DEFAULTS}, show) + ")",
          latex=lambda operands, params, show: rf"\operatorname{{avgpool}}\left({operands[0]}\right)", tangent=LINEAR)


def _pool_stride(value, context: ParamContext):
    """Unset, or an empty list (PyTorch's ``stride=()``), means the kernel size."""
    return None if value is None or value == [] else int_tuple(1)(value, context)


def _boolean(value, context: ParamContext) -> bool:
    if not isinstance(value, bool):
        raise context.fail(f"must be true or false, not {value!r}", f"write `{context.name}: true`")
    return value


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
        self.summary = f"{dims}-d average pooling"
        self.params = {"kernel_size": Param(None, int_tuple(1)), "stride": Param(None, _pool_stride),
                       "padding": Param(0, int_tuple(0)), "ceil_mode": Param(False, _boolean),
                       "count_include_pad": Param(True, _boolean), "divisor_override": Param(None, self._divisor)}

    @staticmethod
    def _divisor(value, context):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value == 0):
            raise context.fail(f"must be a non-zero int or unset, not {value!r}", "write e.g. `divisor_override: 4`")
        return value

    def spatial_dims(self) -> int:
        return self.dims

    def _settings(self, params):
        stride = params["stride"] if params["stride"] is not None else params["kernel_size"]
        return params["kernel_size"], stride, params["padding"]

    def infer_shape(self, shapes, params, check: Checker):
        x = shapes["input"]
        return self._pooled_shape(x, params, check, dilation=(1,) * self.dims)

    def _pooled_shape(self, x, params, check: Checker, dilation):
        check.require(len(x) in (self.dims + 1, self.dims + 2), f"input has {len(x)} dimensions but {self.op} needs "
                      f"{self.dims + 2} ([N, C, ...]) or {self.dims + 1} (unbatched)", "reshape the input")
        kernel, stride, padding = self._settings(params)
        check.require(all(2 * p <= k for p, k in zip(padding, kernel)), "padding must be at most half the kernel size",
                      "reduce padding")
        lead = len(x) - self.dims
        out = list(x[:lead])
        for axis in range(self.dims):
            span = dilation[axis] * (kernel[axis] - 1) + 1
            check.positive(x[lead + axis] + 2 * padding[axis] - span + 1, f"kernel does not fit the padded input along axis {axis}",
                           "use a smaller kernel")
            out.append(_pool_length(x[lead + axis], span, stride[axis], padding[axis], params["ceil_mode"]))
        return tuple(out)

    def _uniform(self, params) -> bool:
        """Every window divided by |K|: a depthwise conv with the constant kernel 1/|K|."""
        return (not params["ceil_mode"] and params["divisor_override"] is None
                and (params["count_include_pad"] or not any(params["padding"])))

    def _options(self, params) -> dict:
        return {key: params[key] for key in ("ceil_mode", "count_include_pad", "divisor_override")
                if params[key] != AVG_POOL_DEFAULTS[key]}

    def forward(self, node):
        kernel, stride, padding = self._settings(node.params)
        return Forward(op("avg_pool", node.operands["input"], dims=self.dims, kernel_size=kernel, stride=stride, padding=padding,
                          **self._options(node.params)))

    def pullback(self, node, grad, wanted):
        kernel, stride, padding = self._settings(node.params)
        x = node.operands["input"]
        if not self._uniform(node.params) or len(node.shapes["input"]) == self.dims + 1:
            # ragged windows (ceil mode, padding not counted) or a fixed divisor: still separable, the
            # divisor being the product of each axis's window length (see the note above Interpolate)
            divisor = node.params["divisor_override"]
            contraction = separable_adjoint(node, grad, len(node.shapes["input"]) - self.dims, "window-sum" if divisor else "averaging",
                                            [dict(function="avg_pool", kernel_size=kernel[axis], stride=stride[axis],
                                                  padding=padding[axis], **self._options(node.params)) for axis in range(self.dims)])
            return {"input": contraction / divisor if divisor else contraction}
        output_padding = tuple(sympy.Mod(Size(x, axis + 2) + 2 * padding[axis] - kernel[axis], stride[axis])
                               for axis in range(self.dims))
        return {"input": op("avg_pool_adjoint", grad, x, dims=self.dims, kernel_size=kernel, stride=stride, padding=padding,
                            output_padding=output_padding)}

    def table_row(self):
        return (self.op, "out = mean of each kernel window (a depthwise conv with the constant kernel 1/|K|)",
                "grad_input = conv_transpose(grad_out, 1/|K|, stride, padding, groups=C, output_padding from shapes); with ceil_mode, "
                "count_include_pad=False or divisor_override, grad_out contracted with each axis's pooling matrix transposed")


def _max_pool_call(operands, params, show, indices: bool) -> str:
    keywords = keyword_arguments({"stride": params["stride"], "padding": params["padding"], "dilation": params["dilation"],
                                  "ceil_mode": params.get("ceil_mode", False)},
                                 {"stride": params["kernel_size"], "padding": 0, "dilation": 1, "ceil_mode": False}, show)
    call = f"F.max_pool{params['dims']}d({operands[0]}, {show_ints(params['kernel_size'])}{keywords}"
    return call + (", return_indices=True)[1]" if indices else ")")


primitive("gather_at", code=lambda operands, params, show: (
    f"{operands[0]}.flatten({params['start']}).gather({params['start']}, {operands[1]}.flatten({params['start']})).view_as({operands[1]})"),
    latex=lambda operands, params, show: rf"{operands[0]}\left[{operands[1]}\right]",
    tangent=lambda expr, tangent_of: op("gather_at", tangent_of(expr.operands[0]), expr.operands[1], start=expr.params["start"]))
primitive("max_pool", code=lambda operands, params, show: _max_pool_call(operands, params, show, False),
          latex=lambda operands, params, show: rf"\operatorname{{maxpool}}\left({operands[0]}\right)",
          # piecewise linear: along dx it moves by dx at each window's argmax
          tangent=lambda expr, tangent_of: op("gather_at", tangent_of(expr.operands[0]),
                                                op("max_pool_indices", expr.operands[0], **dict(expr.params.items())),
                                                start=expr.params["start"]))
primitive("max_pool_indices", code=lambda operands, params, show: _max_pool_call(operands, params, show, True),
          latex=lambda operands, params, show: rf"\operatorname{{argmax}}\left({operands[0]}\right)", tangent="constant")
primitive("scatter_to", code=lambda operands, params, show: (
    f"torch.zeros_like({operands[2]}).flatten({params['start']}).scatter_add({params['start']}, {operands[1]}.flatten({params['start']}), "
    f"{operands[0]}.flatten({params['start']}))"
    f".view_as({operands[2]})"),
    latex=lambda operands, params, show: rf"\operatorname{{scatter}}_{{{operands[1]}}}\left({operands[0]}\right)",
    tangent=lambda expr, tangent_of: op("scatter_to", tangent_of(expr.operands[0]), *expr.operands[1:], start=expr.params["start"]))


class MaxPool(AveragePool):
    """Max pooling: each output is one input entry, the argmax of its window (PyTorch's choice on
    ties). The adjoint adds each output's gradient into the input entry it came from: a
    ``scatter_add`` at the indices PyTorch's own max_pool returns, which also sums correctly where
    windows overlap (``max_unpool`` would overwrite)."""

    linear_in = ()

    def __init__(self, dims: int):
        super().__init__(dims)
        self.op = f"max_pool{dims}d"
        self.summary = f"{dims}-d max pooling (floor or ceil mode)"
        self.params = {"kernel_size": Param(None, int_tuple(1)),
                       "stride": Param(None, _pool_stride),
                       "padding": Param(0, int_tuple(0)), "dilation": Param(1, int_tuple(1)),
                       "ceil_mode": Param(False, _boolean), "return_indices": Param(False, self._refuse_indices)}

    @staticmethod
    def _refuse_indices(value, context):
        if value is not False:  # PyTorch then returns (values, indices): not one layer's tensor
            raise context.fail("= true is not supported yet", "leave return_indices false; the gradient uses the indices itself")
        return False

    def infer_shape(self, shapes, params, check: Checker):
        x = shapes["input"]
        return self._pooled_shape(x, params, check, dilation=params["dilation"])

    def _pool_params(self, node):
        kernel, stride, padding = self._settings(node.params)
        ceil = {"ceil_mode": True} if node.params["ceil_mode"] else {}
        start = len(node.shapes["input"]) - self.dims  # the first spatial dim: PyTorch's indices count within it
        return dict(dims=self.dims, kernel_size=kernel, stride=stride, padding=padding, dilation=node.params["dilation"],
                    start=start, **ceil)

    def forward(self, node):
        return Forward(op("max_pool", node.operands["input"], **self._pool_params(node)))

    def pullback(self, node, grad, wanted):
        x = node.operands["input"]
        indices = node.local("indices", op("max_pool_indices", x, **self._pool_params(node)))
        return {"input": op("scatter_to", grad, indices, x, start=self._pool_params(node)["start"])}

    def table_row(self):
        return (self.op, "out = max of each kernel window",
                "grad_input = grad_out scatter-added at the argmax indices (overlapping windows add up)")


primitive("narrow", code=lambda operands, params, show: (
    f"{operands[0]}.narrow({params['dim']}, {show(params['start'])}, {show(params['length'])})"),
          latex=lambda operands, params, show: rf"{operands[0]}\left[{show(params['start'])}:{show(params['start'] + params['length'])}\right]",
          tangent=LINEAR)


class Narrow(Rule):
    """Slicing, as ``torch.narrow``: the adjoint puts the gradient back in place and zero-pads the
    rest, ``F.pad`` with ``start`` before and ``size - start - length`` after, from the runtime size."""

    op = "narrow"
    operands = (Operand("input", from_in=True),)
    linear_in = ("input",)
    params = {"dim": Param(None, lambda v, c: _ints(v, c)[0]), "start": Param(None, lambda v, c: _ints(v, c)[0]),
              "length": Param(None, lambda v, c: _ints(v, c)[0])}
    summary = "the entries start..start+length-1 along dim"

    def infer_shape(self, shapes, params, check: Checker):
        shape = list(shapes["input"])
        dim = params["dim"] % len(shape)
        check.require(params["start"] >= 0 and params["length"] >= 1, "start must be >= 0 and length >= 1",
                      "give a non-negative start and a positive length")
        check.positive(shape[dim] - params["start"] - params["length"] + 1,
                       f"start {params['start']} + length {params['length']} runs past dim {dim}", "shorten the slice")
        shape[dim] = params["length"]
        return tuple(shape)

    def forward(self, node):
        dim = node.params["dim"] % len(node.shapes["input"])
        return Forward(op("narrow", node.operands["input"], dim=dim, start=node.params["start"], length=node.params["length"]))

    def pullback(self, node, grad, wanted):
        rank = len(node.shapes["input"])
        dim, start, length = node.params["dim"] % rank, node.params["start"], node.params["length"]
        after = Size(node.operands["input"], dim) - start - length
        return {"input": op("pad", grad, pad=(0, 0) * (rank - 1 - dim) + (start, after))}

    def table_row(self):
        return self.op, "out = input.narrow(dim, start, length)", "grad_input = grad_out zero-padded back to the input's size"


primitive("interpolate_nearest", code=lambda operands, params, show: (
    f"F.interpolate({operands[0]}, scale_factor={show_ints(params['scale'])}, mode='nearest')"),
    latex=lambda operands, params, show: rf"\operatorname{{upsample}}\left({operands[0]}\right)", tangent=LINEAR)
primitive("block_sum", code=lambda operands, params, show: (
    f"F.avg_pool{params['dims']}d({operands[0]}, {show_ints(params['scale'])}) * {_product(params['scale'])}"),
    latex=lambda operands, params, show: rf"\operatorname{{blocksum}}\left({operands[0]}\right)", tangent=LINEAR)


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
    matrices = [node.local("local", op("resampling_matrix", x, dim=first + axis, axis=axis, dims=len(per_axis), **params),
                           suffix=f"dim{first + axis}", note=f"{node.name}'s {what} matrix along dim {first + axis}, transposed: "
                                                             f"the identity {'interpolated' if params['function'] == 'interpolate' else 'pooled'} along that dim")
                for axis, params in enumerate(per_axis)]
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
    x, = operands
    dims, axis = params["dims"], params["axis"]
    eye = f"torch.eye({x}.shape[{params['dim']}], dtype={x}.dtype, device={x}.device)"
    if params["function"] == "avg_pool":
        divisor = params.get("divisor_override")
        options = keyword_arguments({**dict(params.items()), "stride": (params["stride"], 1), "padding": (params["padding"], 0)}
                                    if divisor else params, {"stride": None, "padding": 0, "ceil_mode": False,
                                                             **({} if divisor else {"count_include_pad": True})}, show)
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
    probe = f"{eye}[None, :, {index}]" + (f".repeat(1, 1, {', '.join('1' if k == axis else '2' for k in range(dims))})" if width == 2 else "")
    keywords = []
    if params["size"] is not None:
        keywords.append("size=(" + ", ".join(str(params["size"]) if k == axis else str(width) for k in range(dims))
                        + ("," if dims == 1 else "") + ")")
    else:
        keywords.append("scale_factor=(" + ", ".join(repr(params["scale"]) if k == axis else "1.0" for k in range(dims))
                        + ("," if dims == 1 else "") + ")")
    keywords += _interpolate_options(params)
    if width == 2:
        column = ", ".join(":" if k == axis else "0" for k in range(dims))
        return f"F.interpolate({probe}, {', '.join(keywords)})[0, :, {column}]"
    return f"F.interpolate({probe}, {', '.join(keywords)})[0].flatten(1)"


primitive("resampling_matrix", code=_resampling_matrix_code,
          latex=lambda operands, params, show: rf"A_{{{params['dim']}}}^{{\top}}",
          tangent=CONSTANT)  # built from sizes only

def _contraction_code(operands, params, show):
    grad, *matrices = operands
    outer, inner = "ijk"[:len(matrices)], "pqr"[:len(matrices)]
    subscripts = f"...{outer}," + ",".join(f"{p}{i}" for p, i in zip(inner, outer)) + f"->...{inner}"
    return f"torch.einsum('{subscripts}', {grad}, {', '.join(matrices)})"


primitive("axis_contraction", code=_contraction_code,
          latex=lambda operands, params, show: operands[0] + "".join(
              rf" \times_{{{axis}}} {matrix}" for axis, matrix in zip(params["axes"], operands[1:])),
          tangent=LINEAR)


def _interpolate_code(operands, params, show):
    keywords = [f"size={show_ints(params['size'])}" if params["size"] is not None
                else f"scale_factor={_show_scale(params['scale_factor'])}", *_interpolate_options(params)]
    return f"F.interpolate({operands[0]}, {', '.join(keywords)})"


def _show_scale(scale: tuple) -> str:
    if len(set(scale)) == 1:
        return repr(scale[0])
    return "(" + ", ".join(map(repr, scale)) + ")"


primitive("interpolate", code=_interpolate_code,
          latex=lambda operands, params, show: rf"\operatorname{{{params['mode'].replace('-', '')}}}\left({operands[0]}\right)",
          tangent=LINEAR)


def _optional_bool(value, context: ParamContext):
    if value is not None and not isinstance(value, bool):
        raise context.fail(f"must be true, false or unset, not {value!r}", f"write `{context.name}: true`")
    return value


def _positive_sizes(value, context: ParamContext):
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise context.fail(f"must be a positive int or a list of them, not {value!r}", f"write e.g. `{context.name}: 8`")
    return tuple(values) if isinstance(value, list) else value  # one value stays one, as PyTorch takes it


def _scales(value, context: ParamContext):
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e6 for v in values):
        raise context.fail(f"must be a positive number or a list of them, not {value!r}", "write e.g. `scale_factor: 2`")
    values = tuple(int(v) if float(v).is_integer() else float(v) for v in values)
    return values if isinstance(value, list) else values[0]  # one value stays one, as PyTorch takes it


INTERPOLATION_RANK = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}


class Interpolate(Rule):
    """``F.interpolate`` in every mode. In ``nearest`` mode by whole scale factors each entry is
    copied into an s×s block, so the adjoint sums each block, ``avg_pool(grad, s) * prod(s)``.
    Every other case (fractional factors, ``size``, linear, bilinear, bicubic, trilinear, area,
    nearest-exact, align_corners, antialias) is separable: see the note above this class."""

    op = "interpolate"
    operands = (Operand("input", from_in=True),)
    linear_in = ("input",)
    params = {"size": Param(None, _positive_sizes), "scale_factor": Param(None, _scales),
              "mode": Param("nearest", choice("nearest", "linear", "bilinear", "bicubic", "trilinear", "area", "nearest-exact")),
              "align_corners": Param(None, _optional_bool), "recompute_scale_factor": Param(None, _optional_bool),
              "antialias": Param(False, _boolean)}
    summary = "resampling: nearest, nearest-exact, (bi/tri)linear, bicubic, area; by size or scale_factor"

    def _per_axis(self, value, spatial: int):
        return None if value is None else (value if isinstance(value, tuple) else (value,) * spatial)

    def infer_shape(self, shapes, params, check: Checker):
        x = shapes["input"]
        spatial = len(x) - 2
        mode = params["mode"]
        check.require(1 <= spatial <= 3, "interpolate needs [N, C, ...] with 1 to 3 spatial dims", "pass a batched input")
        check.require(INTERPOLATION_RANK.get(mode, spatial) == spatial,
                      f"mode '{mode}' needs a {INTERPOLATION_RANK.get(mode, 0) + 2}-d input, not {len(x)}-d",
                      "use linear for 3-d, bilinear or bicubic for 4-d, trilinear for 5-d inputs")
        size, scale = params["size"], params["scale_factor"]
        check.require((size is None) != (scale is None), "needs exactly one of size and scale_factor", "give one of them")
        for name, value in (("size", size), ("scale_factor", scale)):
            check.require(not isinstance(value, tuple) or len(value) == spatial, f"{name} needs {spatial} entries, "
                          f"one per spatial dim", f"give one value or a list of {spatial}")
        check.require(params["align_corners"] is None or mode in INTERPOLATION_RANK,
                      f"align_corners only applies to linear, bilinear, bicubic and trilinear, not '{mode}'",
                      "drop align_corners")
        check.require(not params["antialias"] or mode in ("bilinear", "bicubic"),
                      "antialias only applies to bilinear and bicubic (PyTorch rejects it otherwise)", "drop antialias")
        check.require(params["recompute_scale_factor"] is None or scale is not None,
                      "recompute_scale_factor only applies with scale_factor", "drop recompute_scale_factor")
        if size is not None:
            return (x[0], x[1], *self._per_axis(size, spatial))
        # PyTorch: floor(float(n) * s) in double; exact rationals for symbolic sizes
        return (x[0], x[1], *(sympy.floor(n * sympy.nsimplify(s, rational=True)) if isinstance(n, sympy.Basic)
                              else int(float(n) * s // 1) for n, s in zip(x[2:], self._per_axis(scale, spatial))))

    def _whole_nearest(self, params) -> bool:
        scale = params["scale_factor"]
        return params["mode"] == "nearest" and scale is not None and all(isinstance(s, int) for s in self._per_axis(scale, 1))

    def _settings(self, node):
        spatial = len(node.shapes["input"]) - 2
        return dict(size=self._per_axis(node.params["size"], spatial), scale_factor=self._per_axis(node.params["scale_factor"], spatial),
                    mode=node.params["mode"], align_corners=node.params["align_corners"],
                    recompute_scale_factor=node.params["recompute_scale_factor"], antialias=node.params["antialias"])

    def forward(self, node):
        settings = self._settings(node)
        if self._whole_nearest(node.params):
            return Forward(op("interpolate_nearest", node.operands["input"], scale=settings["scale_factor"]))
        return Forward(op("interpolate", node.operands["input"], **settings))

    def pullback(self, node, grad, wanted):
        settings = self._settings(node)
        if self._whole_nearest(node.params):
            scale = settings["scale_factor"]
            return {"input": op("block_sum", grad, dims=len(scale), scale=scale)}
        per_axis = [dict(function="interpolate", size=settings["size"][axis] if settings["size"] else None,
                         scale=settings["scale_factor"][axis] if settings["scale_factor"] else None,
                         mode=settings["mode"], align_corners=settings["align_corners"],
                         recompute_scale_factor=settings["recompute_scale_factor"], antialias=settings["antialias"])
                    for axis in range(len(node.shapes["input"]) - 2)]
        return {"input": separable_adjoint(node, grad, 2, "interpolation", per_axis)}

    def table_row(self):
        return (self.op, "out = interpolate(input): nearest by whole s copies each entry into an s×s block; every other "
                "mode is separable, out = A_H · input · A_Wᵀ per channel",
                "nearest by whole s: grad_input = avg_pool(grad_out, s) * prod(s); otherwise grad_input = A_Hᵀ · grad_out · A_W, "
                "each A read off by interpolating the identity along its axis")


class AdaptiveAveragePool(Rule):
    """``adaptive_avg_poolNd``: output entry ``i`` averages input entries
    ``floor(i n / m) .. ceil((i + 1) n / m) - 1`` along each axis, separably (see the note above
    ``Interpolate``), so the adjoint is the einsum with each axis's averaging matrix transposed."""

    operands = (Operand("input", from_in=True),)
    linear_in = ("input",)

    def __init__(self, dims: int):
        self.dims = dims
        self.op = f"adaptive_avg_pool{dims}d"
        self.summary = f"{dims}-d adaptive average pooling to output_size"
        self.params = {"output_size": Param(None, self._output_size)}

    def spatial_dims(self) -> int:
        return self.dims

    def _output_size(self, value, context: ParamContext):
        values = value if isinstance(value, list) else [value] * self.dims
        if len(values) != self.dims or any(v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1)
                                           for v in values):
            raise context.fail(f"must be a positive int or a list of {self.dims} (positive ints or null), not {value!r}",
                               "write e.g. `output_size: 7`")
        return tuple(values)

    def infer_shape(self, shapes, params, check: Checker):
        x = shapes["input"]
        check.require(len(x) in (self.dims + 1, self.dims + 2), f"input has {len(x)} dimensions but {self.op} needs "
                      f"{self.dims + 2} ([N, C, ...]) or {self.dims + 1} (unbatched)", "reshape the input")
        lead = len(x) - self.dims
        return (*x[:lead], *(n if m is None else m for n, m in zip(x[lead:], params["output_size"])))

    def forward(self, node):
        return Forward(op("adaptive_avg_pool", node.operands["input"], dims=self.dims, output_size=node.params["output_size"]))

    def pullback(self, node, grad, wanted):
        return {"input": separable_adjoint(node, grad, len(node.shapes["input"]) - self.dims, "averaging",
                                           [dict(function="adaptive_avg_pool", size=size) for size in node.params["output_size"]])}

    def table_row(self):
        return (self.op, "out = mean over each adaptive window [floor(i n/m), ceil((i+1) n/m)), per axis",
                "grad_input = grad_out contracted with each axis's averaging matrix transposed (from adaptive_avg_pool1d of the identity)")


primitive("adaptive_avg_pool", code=lambda operands, params, show: (
    f"F.adaptive_avg_pool{params['dims']}d({operands[0]}, {_show_output_size(params['output_size'])})"),
    latex=lambda operands, params, show: rf"\operatorname{{adaptiveavgpool}}\left({operands[0]}\right)", tangent=LINEAR)


def _show_output_size(sizes: tuple) -> str:
    if len(set(sizes)) == 1 and sizes[0] is not None:
        return str(sizes[0])
    return "(" + ", ".join(map(str, sizes)) + ("," if len(sizes) == 1 else "") + ")"


def _cat_tangent(expr, tangent_of):
    moved = [tangent_of(operand) for operand in expr.operands]
    if all(m == 0 for m in moved):
        return sympy.Integer(0)
    return op("cat", *(m if m != 0 else op("zeros_like", o) for m, o in zip(moved, expr.operands)), dim=expr.params["dim"])


primitive("cat", code=lambda operands, params, show: f"torch.cat([{', '.join(operands)}], dim={params['dim']})",
          latex=lambda operands, params, show: r"\left[" + ", ".join(operands) + r"\right]", tangent=_cat_tangent)


class Cat(Rule):
    """``torch.cat``: the adjoint hands each input its own slice of the gradient, ``narrow`` at the
    offset summed from the runtime sizes of the inputs before it."""

    op = "cat"
    operands = (Operand("tensors", from_in=True, variadic=True),)
    linear_in = ("tensors",)
    params = {"dim": Param(0, lambda v, c: _ints(v, c)[0])}
    summary = "join tensors along dim"

    def infer_shape(self, shapes, params, check: Checker):
        ordered = [shapes[key] for key in sorted(shapes, key=lambda k: int(k.rsplit("_", 1)[1]))]
        rank = len(ordered[0])
        check.require(all(len(shape) == rank for shape in ordered), "cat needs tensors of one rank", "give them equal ranks")
        dim = params["dim"] % rank
        out = list(ordered[0])
        for shape in ordered[1:]:
            for axis in range(rank):
                if axis != dim:
                    check.equal(shape[axis], out[axis], f"shapes {[tuple(s) for s in ordered]} differ outside dim {dim}",
                                "make every other dim equal")
            out[dim] = out[dim] + shape[dim]
        return tuple(out)

    def _ordered(self, node):
        return [node.operands[f"tensors_{index}"] for index in range(len(node.operands))]

    def forward(self, node):
        dim = node.params["dim"] % len(node.out_shape)
        return Forward(op("cat", *self._ordered(node), dim=dim))

    def pullback(self, node, grad, wanted):
        dim = node.params["dim"] % len(node.out_shape)
        grads, offset = {}, sympy.Integer(0)
        for index, tensor in enumerate(self._ordered(node)):
            name = f"tensors_{index}"
            if name in wanted:
                grads[name] = op("narrow", grad, dim=dim, start=offset, length=Size(tensor, dim))
            offset = offset + Size(tensor, dim)
        return grads

    def table_row(self):
        return self.op, "out = torch.cat([a, b, ...], dim)", "grad of each input = grad_out.narrow(dim, its offset, its size)"


RULES = [Flatten(), Reshape(), Permute(), Pad(), PixelShuffle(), AveragePool(1), AveragePool(2), AveragePool(3),
         MaxPool(1), MaxPool(2), MaxPool(3), Narrow(), Interpolate(), AdaptiveAveragePool(1), AdaptiveAveragePool(2),
         AdaptiveAveragePool(3), Cat()]
