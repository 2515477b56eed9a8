"""``conv1d``, ``conv2d``, ``conv3d``: one N-d rule, bilinear in (input, weight).

(The transposed convolution, ``conv_transpose.py``, shares every primitive of ``conv_primitives.py``: the
input adjoint of one is the other's forward. The derivation below is why it is longer than other rule
files.)

Why the adjoints look the way they do
-------------------------------------
Write the forward, per spatial axis, for stride ``s``, padding ``p``, dilation ``d`` and kernel
size ``K`` (``x_pad`` is ``x`` with ``p`` zeros on each side)::

    out[n, o, i] = bias[o] + sum_{c, a} weight[o, c, a] * x_pad[n, g(o) * C_g + c, i * s + a * d]

It is linear in ``x`` for fixed ``weight`` (like ``A @ x``) and linear in ``weight`` for fixed ``x``
(like ``X @ w``), so, as for matrix multiply, there are two transposes.

Input side (``A.T @ grad``). Each ``x_pad`` position ``j = i * s + a * d`` receives
``weight[o, c, a] * grad[n, o, i]``. That scatter is exactly ``conv_transpose`` with the *same*
stride, padding, dilation and groups, and the *same* weight tensor: conv_transpose inserts ``s - 1``
zeros between gradient entries (undoing the stride), correlates with the flipped, dilated kernel, and
crops ``p`` from each side (undoing the padding). Its output length is
``(H_out - 1) * s - 2p + d * (K - 1) + 1``, which can be shorter than the input length ``H``: when
``(H + 2p - d * (K - 1) - 1)`` is not a multiple of ``s`` the forward dropped the last few input
positions, which got no gradient. ``output_padding`` appends those missing zeros::

    output_padding = (H + 2p - d * (K - 1) - 1) mod s

computed from the input's runtime shape, so the code works for any spatial size.

Weight side (``X.T @ grad``). ``grad_weight[o, c, a] = sum_{n, i} grad[n, o, i] * x_pad[n, ., i * s + a * d]``
is a correlation of the input with the output gradient, in which the *kernel* is the gradient. The
roles of stride and dilation swap: the gradient's taps ``i`` step through the input ``s`` apart (so
it is dilated by the forward stride) and successive outputs ``a`` step ``d`` apart (so it is strided
by the forward dilation). The batch axis is the contraction axis, so it moves to the channel slot:
``x`` becomes ``[C_in/g, g * N, H]`` and ``grad`` becomes ``[C_out, N, H_out]``, and a grouped conv with
the forward's ``groups`` pairs each group's inputs with its own outputs. The result has
``K + floor(r / d)`` taps, ``r = (H + 2p - d * (K - 1) - 1) mod s``; the ones past ``K`` belong to input
positions the forward never reached, so they are cropped when ``s > d`` can make ``r >= d``.
"""

from __future__ import annotations

import sympy

from ..algebra import Size, op
from ..spec_values import Like
from .base import (
    Checker,
    Forward,
    NodeSymbols,
    Operand,
    Param,
    ParamContext,
    Rule,
    Sample,
    Spelling,
    int_tuple,
    positive_int,
)
from .conv_primitives import CONV_DEFAULTS


def _padding(value, context: ParamContext):
    """Ints (one, or one per spatial dim), or PyTorch's 'valid' (no padding) or 'same' (resolved
    against the kernel once shapes are known, in ``infer_shape``)."""
    if value == "valid":
        return (0,) * context.spatial_dims
    if value == "same":
        return "same"
    if isinstance(value, str):
        raise context.fail(
            f"must be an int, a list of ints, 'valid' or 'same', not {value!r}", "write e.g. `padding: 1`"
        )
    return int_tuple(0)(value, context)


def _groups(value, context: ParamContext):
    """A positive int, or ``{like: weight, dims: [0]}``: the weight's out channels, read at run time (a
    depthwise conv's, in a block whose instances differ in width: ``Rule.sizes_read``)."""
    if isinstance(value, Like):
        if value.dims is None or len(value.dims) != 1 or value.size is not None:
            raise context.fail(f"reads one size, not {value}", "write `groups: {like: WEIGHT, dims: [0]}`")
        return value.size_at(0)
    return positive_int(value, context)


SAME_KERNEL, SAME_PAD_END = "same_kernel", "same_pad_end"
"""Node params set when padding='same' is resolved: the kernel size it was resolved for (the padding is
'same' only for that size, so other shapes keep it), and, for an odd dilated kernel extent, one
extra zero at each such axis's end."""


class Convolution(Rule):
    operands = (Operand("input", from_in=True), Operand("weight"), Operand("bias", optional=True))
    params = {
        "stride": Param(1, int_tuple(1)),
        "padding": Param(0, _padding),
        "dilation": Param(1, int_tuple(1)),
        "groups": Param(1, _groups),
    }
    sizes_read = {"groups": ("weight", 0)}
    linear_in = ("input", "weight")
    argument_hints = {
        "padding_mode": "torch.nn.functional's convolutions take no padding_mode; pad first, as nn.Conv2d "
        "does: `{op: pad, pad: [1, 1, 1, 1], mode: reflect}` then the conv with padding 0"
    }

    def __init__(self, dims: int):
        self.dims = dims
        self.op = f"conv{dims}d"
        self.calls = (self.op,)
        self.operand_roles = {"weight": "weight", "bias": "shift"}
        self.summary = f"{dims}-d convolution (cross-correlation) of input with weight, plus bias"

    def spatial_dims(self) -> int:
        return self.dims

    WEIGHT_LAYOUT = "C_out, C_in/groups"

    def _check_ranks(self, x, w, check: Checker) -> None:
        rank = self.dims + 2
        check.require(
            len(x) in (rank, rank - 1),
            f"input has {len(x)} dimensions but {self.op} needs {rank} "
            f"([N, C_in, {self._spatial()}]) or {rank - 1} (unbatched)",
            f"reshape the input or use the {self.op[:-2]} of matching dimension",
        )
        check.require(
            len(w) == rank,
            f"weight has {len(w)} dimensions but {self.op} needs {rank} ([{self.WEIGHT_LAYOUT}, {self._kernel()}])",
            "give the weight a shape of matching rank",
        )

    def infer_shape(self, shapes, params, check: Checker):
        x, w = shapes["input"], shapes["weight"]
        self._check_ranks(x, w, check)
        groups = params["groups"]
        if params["padding"] == "same":
            self._resolve_same(w, params, check)
        for axis, size in enumerate(params.get(SAME_KERNEL, ())):
            check.equal(
                w[axis + 2],
                size,
                f"padding='same' was resolved for kernel size {list(params[SAME_KERNEL])}, not {list(w[2:])}",
                "keep the weight's kernel size, or give explicit padding",
            )
        lead = len(x) - self.dims - 1  # 1 with a batch axis, 0 without
        check.equal(
            x[lead],
            w[1] * groups,
            lambda: f"input has {x[lead]} channels but weight expects {w[1]} x groups={groups} = {w[1] * groups}",
            "make the weight's dim 1 equal the input channels divided by groups",
        )
        check.equal(
            w[0] % groups,
            0,
            lambda: f"weight has {w[0]} output channels, not divisible by groups={groups}",
            "use a number of output channels divisible by groups",
        )
        if "bias" in shapes:
            b = shapes["bias"]
            check.require(len(b) == 1, f"bias must be 1-d ([C_out]), not {len(b)}-d", "give bias the shape [C_out]")
            check.equal(
                b[0],
                w[0],
                lambda: f"bias has {b[0]} entries but the weight has {w[0]} output channels",
                "give bias the shape [C_out]",
            )
        out = [*x[:lead], w[0]]
        for axis in range(self.dims):
            size = (
                x[axis + lead + 1]
                + 2 * params["padding"][axis]
                + params.get(SAME_PAD_END, (0,) * self.dims)[axis]
                - params["dilation"][axis] * (w[axis + 2] - 1)
                - 1
            )
            length = (size if params["stride"][axis] == 1 else size // params["stride"][axis]) + 1
            check.positive(
                size + 1,
                lambda axis=axis: (
                    f"kernel (dilated) does not fit the padded input along spatial "
                    f"axis {axis}: input {x[axis + lead + 1]} + 2 x padding {params['padding'][axis]} < "
                    f"dilation {params['dilation'][axis]} x (kernel {w[axis + 2]} - 1) + 1"
                ),
                "use more padding, a smaller kernel or a larger input",
            )
            out.append(length)
        return tuple(out)

    def _resolve_same(self, w, params, check: Checker) -> None:
        """padding='same' as the explicit padding PyTorch uses, from the spec's kernel size.

        The emitted code then writes those ints, so forward and backward agree for any input;
        'same' with stride > 1 is rejected, as PyTorch rejects it. An odd dilated kernel extent
        ``e = d (K - 1)`` cannot be split evenly: PyTorch pads ``e // 2`` before and ``e // 2 + 1``
        after, by padding the input's end with one zero (``F.pad``) and then convolving with the
        symmetric ``e // 2``. The rule does the same, so the input seen by the conv is
        ``F.pad(x, (0, 1))`` along each odd axis; its adjoint is the conv's adjoint of that padded
        input, cropped back by the negative pad (the zero that ``F.pad`` added gets no gradient), and
        the weight correlates with the padded input. Since the stride is 1, ``output_padding`` is 0."""
        check.require(
            all(s == 1 for s in params["stride"]),
            "padding='same' needs stride 1 (PyTorch rejects it otherwise)",
            "give explicit padding, or use stride 1",
        )
        extents = [d * (k - 1) for d, k in zip(params["dilation"], w[2:])]
        params["padding"] = tuple(extent // 2 for extent in extents)
        params[SAME_KERNEL] = tuple(w[2:])
        if any(extent % 2 for extent in extents):
            params[SAME_PAD_END] = tuple(extent % 2 for extent in extents)

    def _spatial(self) -> str:
        return ", ".join(["D", "H", "W"][-self.dims :])

    def _kernel(self) -> str:
        return ", ".join(["kD", "kH", "kW"][-self.dims :])

    def _lead(self, node: NodeSymbols) -> int:
        """Axes before the channel axis: 1 for [N, C, ...], 0 for an unbatched [C, ...] input."""
        return len(node.shapes["input"]) - self.dims - 1

    def _bias_sum_dims(self, node: NodeSymbols) -> tuple[int, ...]:
        lead = self._lead(node)
        return tuple(range(lead)) + tuple(range(lead + 1, lead + 1 + self.dims))

    def _params(self, node: NodeSymbols, **extra):
        return dict(dims=self.dims, **{key: node.params[key] for key in CONV_DEFAULTS}, **extra)

    def reference_params(self, params: dict) -> dict:
        resolved = {key: value for key, value in params.items() if key not in (SAME_KERNEL, SAME_PAD_END)}
        if SAME_PAD_END in params:  # PyTorch's own asymmetric 'same', the reference for the pad-then-conv form
            resolved["padding"] = "same"
        return resolved

    def _end_pad(self, node: NodeSymbols) -> list[int] | None:
        """F.pad's argument (last axis first) that adds asymmetric 'same' padding's extra end zeros."""
        ends = node.params.get(SAME_PAD_END)
        return None if ends is None else [value for end in reversed(ends) for value in (0, end)]

    def _conv_input(self, node: NodeSymbols):
        """The input as the conv sees it: padded at the end for asymmetric 'same' padding."""
        pad = self._end_pad(node)
        x = node.operands["input"]
        return x if pad is None else op("pad", x, pad=pad, mode="constant")

    def _uncrop(self, node: NodeSymbols, grad_input):
        """The gradient of the padded input, cropped back to the input (F.pad with the negated pads)."""
        pad = self._end_pad(node)
        return grad_input if pad is None else op("pad", grad_input, pad=[-value for value in pad], mode="constant")

    def forward(self, node: NodeSymbols) -> Forward:
        operands = [self._conv_input(node), node.operands["weight"]]
        if "bias" in node.operands:
            operands.append(node.operands["bias"])
        return Forward(op("conv", *operands, **self._params(node)))

    def pullback(self, node: NodeSymbols, grad, wanted):
        if self._fuses(node, wanted):
            return self._fused_pullback(node, grad, wanted)
        lead = self._lead(node)
        x, w = node.operands["input"], node.operands["weight"]
        stride, padding, dilation = node.params["stride"], node.params["padding"], node.params["dilation"]
        end = node.params.get(SAME_PAD_END, (0,) * self.dims)
        grads = {}
        if "input" in wanted:
            # output_padding = (H + 2p - d (K - 1) - 1) mod s, from the runtime shapes (see module docstring)
            output_padding = tuple(
                sympy.Mod(
                    Size(x, axis + lead + 1)
                    + end[axis]
                    + 2 * padding[axis]
                    - dilation[axis] * (Size(w, axis + 2) - 1)
                    - 1,
                    stride[axis],
                )
                for axis in range(self.dims)
            )
            grads["input"] = self._uncrop(
                node, op("conv_transpose", grad, w, **self._params(node, output_padding=output_padding))
            )
        if "weight" in wanted:
            # taps past the kernel size exist only when stride > dilation (see module docstring)
            grads["weight"] = op("conv_weight_grad", self._conv_input(node), grad, **self._weight_params(node))
        if "bias" in wanted:
            grads["bias"] = op("sum", grad, dim=self._bias_sum_dims(node))
        return grads

    def _weight_params(self, node: NodeSymbols) -> dict:
        extra = {"unbatched": True} if not self._lead(node) else {}
        if self._lengths_match(node):
            w = node.operands["weight"]
            extra["weight_size"] = tuple(Size(w, axis) for axis in range(self.dims + 2))
        return self._params(node, crop_to=self._weight_crop(node), **extra)

    def _lengths_match(self, node: NodeSymbols) -> bool:
        """Whether the correlation is a forward conv's weight gradient as it stands (always, for conv)."""
        return True

    def _fuses(self, node: NodeSymbols, wanted) -> bool:
        """Whether the fused derivation makes one ``convolution_backward`` call: where several gradients
        share it, or the weight's is wanted alone (a network's first conv: autograd's own call, with the
        weight itself; under autocast an input the forward made is kept as it cast it). The input's
        gradient alone is ``conv_transpose``, as fast or faster (BENCHMARKS.md, seed1-small: 1.10 ms vs
        1.27 ms), and the bias's alone a sum."""
        return node.fused and bool(self._lead(node)) and (len(wanted) > 1 or "weight" in wanted)

    def _fused_pullback(self, node: NodeSymbols, grad, wanted):
        """One ``aten.convolution_backward`` call for every wanted gradient (PyTorch's own kernel,
        the one autograd calls): same maths as the readable adjoints above, fewer passes over memory."""
        names = ("input", "weight", "bias")
        mask = tuple(name in wanted for name in names)
        together = " and ".join(name for name in names if name in wanted)
        fused = node.local(
            "local",
            op(
                "conv_backward",
                grad,
                self._conv_input(node),
                node.operands["weight"],
                **self._params(node, output_mask=mask, **self._fused_extras(node)),
            ),
            note=f"{node.name}'s {together} gradient{'s' if len(wanted) > 1 else ''} in one "
            "convolution_backward call (autograd's own kernel, twice differentiable)",
        )
        grads = {name: op("item", fused, index=index) for index, name in enumerate(names) if name in wanted}
        if "input" in grads:
            grads["input"] = self._uncrop(node, grads["input"])
        return grads

    def _fused_extras(self, node: NodeSymbols) -> dict:
        return {}

    def _correlated(self, x, grad):
        """The (input, output gradient) pair whose correlation is the weight gradient."""
        return x, grad

    def _weight_crop(self, node: NodeSymbols):
        """Kernel taps to keep: the correlation has extra ones only where stride > dilation."""
        w, stride, dilation = node.operands["weight"], node.params["stride"], node.params["dilation"]
        return tuple(Size(w, axis + 2) if stride[axis] > dilation[axis] else None for axis in range(self.dims))

    def per_sample_pullback(self, node: NodeSymbols, grad, operand: str):
        """Each sample's own gradient of a shared weight or bias: [N, *weight.shape]."""
        if not self._lead(node):
            return None  # an unbatched input is one sample: there is nothing per sample
        if operand == "weight":
            source, kernel = self._correlated(self._conv_input(node), grad)
            return op("conv_weight_grad_per_sample", source, kernel, **self._weight_params(node))
        if operand == "bias":
            return op("sum", grad, dim=tuple(range(2, self.dims + 2)))
        return None

    def table_row(self):
        return (
            self.op,
            "out = weight ⋆ input + bias  (stride s, padding p, dilation d, groups g)",
            "grad_input = conv_transpose(grad_out, weight; s, p, d, g, output_padding=(H+2p-d(K-1)-1) mod s); "
            "grad_weight = input ⋆ grad_out with stride d and dilation s; grad_bias = grad_out summed over N and space",
        )


RULES = [Convolution(1), Convolution(2), Convolution(3)]


CONV_CERTIFICATES = [  # symgrad.certify.ConvCase's fields: dims, batch, in_channels, size, out_channels,
    # kernel, stride, padding, dilation[, groups]; `symgrad certify` proves both adjoints of each against
    # the coefficients of the convolution's definition. Small: stride, padding, dilation, groups, odd
    # sizes and every dimension.
    (2, 1, 2, (4, 5), 2, (2, 3), (1, 1), (0, 1), (1, 1)),
    (2, 1, 2, (5, 5), 2, (2, 2), (2, 3), (1, 0), (1, 1)),
    (2, 1, 1, (6, 5), 2, (2, 2), (2, 1), (0, 0), (2, 2)),
    (2, 1, 4, (4, 4), 2, (2, 1), (1, 2), (1, 1), (1, 1), 2),
    (2, 2, 2, (5, 4), 2, (3, 2), (3, 2), (1, 1), (1, 1)),
    (1, 1, 2, (7,), 3, (3,), (2,), (1,), (2,)),
    (1, 1, 3, (6,), 3, (2,), (3,), (2,), (1,), 3),
    (3, 1, 1, (3, 4, 3), 2, (2, 2, 1), (1, 2, 1), (1, 0, 0), (1, 1, 2)),
]
CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    (
        "conv_transpose2d",
        {"x": (1, 2, 3, 3), "w": (2, 2, 2, 2)},
        {"op": "conv_transpose2d", "weight": "w", "stride": 2, "padding": 1, "output_padding": 1},
        ("x", "w"),
    ),
    (
        "conv_transpose1d",
        {"x": (1, 2, 3), "w": (2, 1, 2)},
        {"op": "conv_transpose1d", "weight": "w", "stride": 2, "dilation": 3, "output_padding": 2, "groups": 2},
        ("x", "w"),
    ),
    (
        "conv_transpose3d",
        {"x": (1, 1, 2, 2, 2), "w": (1, 2, 2, 1, 2)},
        {"op": "conv_transpose3d", "weight": "w", "stride": [2, 1, 2], "padding": [1, 0, 0]},
        ("x", "w"),
    ),
    (
        "conv2d padding='same', even kernel (asymmetric)",
        {"x": (1, 2, 3, 4), "w": (2, 2, 2, 3)},
        {"op": "conv2d", "weight": "w", "padding": "same", "dilation": [1, 2]},
        ("x", "w"),
    ),
    (
        "conv2d (unbatched)",
        {"x": (2, 4, 3), "w": (2, 1, 2, 2)},
        {"op": "conv2d", "weight": "w", "stride": [2, 1], "padding": 1, "groups": 2},
        ("x", "w"),
    ),
    (
        "conv_transpose1d (unbatched)",
        {"x": (2, 3), "w": (2, 2, 2)},
        {"op": "conv_transpose1d", "weight": "w", "stride": 2, "output_padding": 1},
        ("x", "w"),
    ),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "conv1d": [
        Sample(
            "conv1d-all-args",
            {"x": [2, 3, 13], "w": [2, 3, 4], "b": [2], "y": [2, 2, 4]},
            [{"op": "conv1d", "weight": "w", "stride": 3, "padding": 2, "dilation": 2, "out": "out", "bias": "b"}],
            ["x", "w", "b"],
        ),
        Sample(
            "conv1d-unbatched-stride-gt-dilation-crop",
            {"x": [2, 12], "w": [3, 2, 2], "y": [3, 3]},
            [{"op": "conv1d", "weight": "w", "stride": 4, "out": "out"}],
            ["x", "w"],
        ),
        Sample(
            "conv1d-same-odd-dilated-extent",
            {"x": [2, 2, 9], "w": [3, 2, 2], "y": [2, 3, 9]},
            [{"op": "conv1d", "weight": "w", "padding": "same", "dilation": 3, "out": "out"}],
            ["x", "w"],
        ),
    ],
    "conv2d": [
        Sample(
            "conv2d-odd-size",
            {"x": [2, 3, 7, 7], "w": [4, 3, 3, 3], "y": [2, 4, 5, 5]},
            [{"op": "conv2d", "weight": "w", "out": "out"}],
            ["x", "w"],
        ),
        Sample(
            "conv2d-stride2-output_padding",
            {"x": [2, 3, 9, 9], "w": [4, 3, 3, 3], "y": [2, 4, 4, 4]},
            [{"op": "conv2d", "weight": "w", "stride": 2, "out": "out"}],
            ["x", "w"],
        ),
        Sample(
            "conv2d-stride3-padding",
            {"x": [1, 2, 11, 11], "w": [3, 2, 2, 2], "y": [1, 3, 4, 4]},
            [{"op": "conv2d", "weight": "w", "stride": 3, "padding": 1, "out": "out"}],
            ["x", "w"],
        ),
        Sample(
            "conv2d-dilation",
            {"x": [2, 2, 10, 10], "w": [2, 2, 3, 3], "y": [2, 2, 10, 10]},
            [{"op": "conv2d", "weight": "w", "dilation": 2, "padding": 2, "out": "out"}],
            ["x", "w"],
        ),
        Sample(
            "conv2d-groups-bias",
            {"x": [2, 4, 9, 9], "w": [6, 2, 3, 3], "b": [6], "y": [2, 6, 4, 4]},
            [{"op": "conv2d", "weight": "w", "groups": 2, "stride": 2, "out": "out", "bias": "b"}],
            ["x", "w", "b"],
        ),
        Sample(
            "conv2d-per-axis-args",
            {"x": [2, 6, 9, 8], "w": [3, 2, 3, 2], "y": [2, 3, 5, 2]},
            [
                {
                    "op": "conv2d",
                    "weight": "w",
                    "groups": 3,
                    "stride": [2, 3],
                    "padding": [1, 0],
                    "dilation": [1, 2],
                    "out": "out",
                }
            ],
            ["x", "w"],
        ),
        Sample(
            "conv2d-stride-gt-dilation-crop",
            {"x": [2, 2, 12, 12], "w": [2, 2, 2, 2], "y": [2, 2, 3, 3]},
            [{"op": "conv2d", "weight": "w", "stride": 4, "dilation": 1, "out": "out"}],
            ["x", "w"],
        ),
        Sample(
            "conv2d-unbatched-groups-bias",
            {"x": [4, 7, 6], "w": [6, 2, 3, 3], "b": [6], "y": [6, 4, 3]},
            [{"op": "conv2d", "weight": "w", "stride": 2, "padding": 1, "groups": 2, "out": "out", "bias": "b"}],
            ["x", "w", "b"],
        ),
        Sample(
            "conv2d-same-even-kernel-asymmetric",
            {"x": [2, 3, 7, 6], "w": [4, 3, 2, 4], "b": [4], "y": [2, 4, 7, 6]},
            [{"op": "conv2d", "weight": "w", "padding": "same", "out": "out", "bias": "b"}],
            ["x", "w", "b"],
        ),
        Sample(
            "conv2d-weight-only",
            {"x": [2, 3, 7, 7], "w": [4, 3, 3, 3], "y": [2, 4, 5, 5]},
            [{"op": "conv2d", "weight": "w", "out": "out"}],
            ["w"],
        ),
        Sample(
            "tied-weight-used-twice",
            {"x": [2, 2, 6, 6], "w": [2, 2, 3, 3], "y": [2, 2, 6, 6]},
            [
                {"op": "conv2d", "weight": "w", "padding": 1, "out": "h"},
                {"op": "conv2d", "in": "h", "weight": "w", "padding": 1, "out": "g"},
            ],
            ["x", "w"],
        ),
    ],
    "conv3d": [
        Sample(
            "conv3d-stride-padding-bias",
            {"x": [1, 2, 6, 6, 6], "w": [2, 2, 2, 2, 2], "b": [2], "y": [1, 2, 4, 4, 4]},
            [{"op": "conv3d", "weight": "w", "stride": 2, "padding": 1, "out": "out", "bias": "b"}],
            ["x", "w", "b"],
        ),
        Sample(
            "conv3d-unbatched-dilation-bias",
            {"x": [2, 5, 5, 5], "w": [2, 2, 2, 2, 2], "b": [2], "y": [2, 3, 3, 3]},
            [{"op": "conv3d", "weight": "w", "dilation": 2, "out": "out", "bias": "b"}],
            ["x", "w", "b"],
        ),
        Sample(
            "conv3d-unbatched-same-asymmetric-groups",
            {"x": [2, 5, 5, 5], "w": [2, 1, 2, 3, 2], "y": [2, 5, 5, 5]},
            [{"op": "conv3d", "weight": "w", "padding": "same", "groups": 2, "out": "out"}],
            ["x", "w"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "conv1d": [
        Spelling("F.conv1d(x, w, b, 2, 1, 2)", {"x": (2, 3, 11), "w": (4, 3, 3), "b": (4,)}),
    ],
    "conv2d": [
        Spelling("F.conv2d(x, w, None, (2, 1), 1, 2, 3)", {"x": (2, 3, 9, 9), "w": (6, 1, 3, 3)}),
        Spelling('nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")', module=True),
    ],
    "conv3d": [
        Spelling(
            'nn.Conv3d(2, 2, 3, padding=1, padding_mode="circular", bias=False)', {"x": (2, 2, 5, 5, 5)}, module=True
        ),
    ],
}
