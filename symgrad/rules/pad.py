"""Padding in every mode.

``pad`` (constant mode) transposes to ``pad(g, -p)``: padding by ``p`` appends zeros, and its
transpose drops those positions again, which is padding by ``-p`` (and negative padding, a crop,
transposes to zero padding). The constant ``value`` only shifts the output, so it has no gradient.
The reflect, replicate and circular modes copy entries: their adjoints add each copy's gradient
back onto the entry it was copied from.
"""

from __future__ import annotations

import sympy

from ..algebra import LINEAR, Size, op, primitive
from ..spec_values import Like
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, choice, finite_float, ints


def _pads(value, context: ParamContext):
    """Ints, last dim first, or ``{like: NODE}``: the pads that take the input's spatial dims to NODE's,
    read when the code runs, ``diff // 2`` before and the rest after."""
    if isinstance(value, Like):
        return value.pads()
    return ints(value, context)


def _pad_code(operands, params, show):
    pads = ", ".join(show(p) if isinstance(p, sympy.Basic) else str(p) for p in params["pad"])
    mode = params.get("mode", "constant")
    extra = (
        f", mode={mode!r}"
        if mode != "constant"
        else (f", value={params['value']}" if params.get("value", 0) != 0 else "")
    )
    return f"F.pad({operands[0]}, [{pads}]{extra})"


primitive(
    "pad",
    code=_pad_code,
    latex=lambda operands, params, show: rf"\operatorname{{pad}}\left({operands[0]}\right)",
    # affine: the constant value does not move, the copied (or reflected, wrapped) entries do
    tangent=lambda expr, tangent_of: op(
        "pad", tangent_of(expr.operands[0]), pad=expr.params["pad"], mode=expr.params.get("mode", "constant")
    ),
)
primitive(
    "flip",
    code=lambda operands, params, show: f"{operands[0]}.flip({params['dim']})",
    latex=lambda operands, params, show: rf"\operatorname{{flip}}\left({operands[0]}\right)",
    tangent=LINEAR,
)


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
    calls = ("pad",)
    operands = (Operand("input", from_in=True),)
    params = {
        "pad": Param(None, _pads),
        "mode": Param("constant", choice("constant", "reflect", "replicate", "circular")),
        "value": Param(0, finite_float),
    }
    summary = "padding: constant (negative pads crop), reflect, replicate or circular"
    linear_in = ("input",)  # for value 0; otherwise affine

    def infer_shape(self, shapes, params, check: Checker):
        shape = list(shapes["input"])
        pad, mode = params["pad"], params["mode"]
        check.require(
            len(pad) % 2 == 0 and len(pad) // 2 <= len(shape),
            f"pad {list(pad)} needs pairs for at most {len(shape)} dims",
            "give (left, right) pairs, last dim first",
        )
        check.require(
            isinstance(params["value"], (int, float)) and not isinstance(params["value"], bool),
            "value must be a number",
            "write e.g. `value: 0`",
        )
        if mode != "constant":
            padded = len(pad) // 2
            check.require(
                padded in (1, 2, 3) and len(shape) in (padded + 1, padded + 2),
                f"mode '{mode}' pads the last 1 to 3 dims of a tensor with one or two more dims; "
                f"{padded} padded dims of a {len(shape)}-d input is not that",
                "pad the last 1, 2 or 3 dims of a [C, ...] or [N, C, ...] input",
            )
            check.require(params["value"] == 0, f"mode '{mode}' takes no value (PyTorch rejects it)", "drop `value`")
            check.require(
                all(p >= 0 for p in pad),
                f"mode '{mode}' with a negative pad is not supported",
                "crop with `narrow` first, then pad by non-negative amounts",
            )
        for pair in range(len(pad) // 2):
            axis = len(shape) - 1 - pair
            before, after = pad[2 * pair], pad[2 * pair + 1]
            if mode == "reflect":
                check.positive(
                    shape[axis] - max(before, after),
                    f"reflect padding {max(before, after)} must be smaller than dim {axis} of the input",
                    "pad less, or use mode replicate",
                )
            if mode == "circular":
                check.positive(
                    shape[axis] - max(before, after) + 1,
                    f"circular padding {max(before, after)} wraps around dim {axis} more than once",
                    "pad at most the dim's size",
                )
            shape[axis] = shape[axis] + before + after
            check.positive(shape[axis], f"padding leaves dim {axis} empty", "pad less negatively")
        return tuple(shape)

    def forward(self, node):
        return Forward(
            op(
                "pad",
                node.operands["input"],
                pad=node.params["pad"],
                mode=node.params["mode"],
                value=node.params["value"],
            )
        )

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
                    folded = node.local(
                        "local",
                        folded,
                        suffix=f"dim{axis}",
                        note=f"{node.name}'s gradient with the {mode} border of dim {axis} folded back in",
                    )
        return {"input": folded}

    @staticmethod
    def _fold(grad, n, axis: int, rank: int, before: int, after: int, mode: str):
        """The adjoint along one axis: the gradient of every copy added onto its source entry."""

        def place(part, left, right):  # zero-pad ``part`` along ``axis`` only
            return op("pad", part, pad=(0, 0) * (rank - 1 - axis) + (left, right))

        terms = [op("narrow", grad, dim=axis, start=before, length=n)]
        if before:
            edge = op("narrow", grad, dim=axis, start=0, length=before)
            terms.append(
                {
                    "circular": lambda: place(edge, n - before, 0),
                    "replicate": lambda: place(op("sum", edge, dim=(axis,), keepdim=True), 0, n - 1),
                    "reflect": lambda: place(op("flip", edge, dim=axis), 1, n - 1 - before),
                }[mode]()
            )
        if after:
            edge = op("narrow", grad, dim=axis, start=before + n, length=after)
            terms.append(
                {
                    "circular": lambda: place(edge, 0, n - after),
                    "replicate": lambda: place(op("sum", edge, dim=(axis,), keepdim=True), n - 1, 0),
                    "reflect": lambda: place(op("flip", edge, dim=axis), n - 1 - after, 1),
                }[mode]()
            )
        return sympy.Add(*terms)

    def table_row(self):
        return (
            self.op,
            "out = F.pad(input, pad, mode, value)",
            "constant: grad_input = F.pad(grad_out, -pad); reflect/replicate/circular: the centre of grad_out plus "
            "each border's gradient added onto the entries it copies (flipped for reflect, summed for replicate)",
        )


RULES = [Pad()]


CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    ("pad", {"x": (1, 2, 3)}, {"op": "pad", "pad": [1, 2]}, ("x",)),
    ("pad (crop)", {"x": (1, 2, 4)}, {"op": "pad", "pad": [-1, 1, 1, 0]}, ("x",)),
    ("pad reflect", {"x": (1, 2, 4, 3)}, {"op": "pad", "pad": [2, 1, 1, 3], "mode": "reflect"}, ("x",)),
    ("pad replicate", {"x": (1, 2, 3, 3)}, {"op": "pad", "pad": [0, 2, 3, 1], "mode": "replicate"}, ("x",)),
    ("pad circular", {"x": (2, 3, 2)}, {"op": "pad", "pad": [2, 1, 1, 3], "mode": "circular"}, ("x",)),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "pad": [
        Sample("pad", {"x": [2, 3, 5], "y": [2, 3, 8]}, [{"op": "pad", "pad": [1, 2], "out": "out"}], ["x"]),
        Sample(
            "pad-crop-value",
            {"x": [2, 3, 5], "y": [2, 5, 5]},
            [{"op": "pad", "pad": [-1, 1, 2, 0], "value": 0.5, "out": "out"}],
            ["x"],
        ),
        Sample(
            "pad-reflect-1d",
            {"x": [2, 3, 6], "y": [2, 3, 11]},
            [{"op": "pad", "pad": [2, 3], "mode": "reflect", "out": "out"}],
            ["x"],
        ),
        Sample(
            "pad-reflect-2d",
            {"x": [2, 3, 5, 4], "y": [2, 3, 10, 5]},
            [{"op": "pad", "pad": [1, 0, 2, 3], "mode": "reflect", "out": "out"}],
            ["x"],
        ),
        Sample(
            "pad-reflect-3d",
            {"x": [1, 2, 4, 3, 5], "y": [1, 2, 8, 4, 8]},
            [{"op": "pad", "pad": [1, 2, 0, 1, 2, 2], "mode": "reflect", "out": "out"}],
            ["x"],
        ),
        Sample(
            "pad-replicate-1d",
            {"x": [2, 3, 6], "y": [2, 3, 11]},
            [{"op": "pad", "pad": [2, 3], "mode": "replicate", "out": "out"}],
            ["x"],
        ),
        Sample(
            "pad-replicate-2d",
            {"x": [2, 3, 5, 4], "y": [2, 3, 10, 5]},
            [{"op": "pad", "pad": [1, 0, 2, 3], "mode": "replicate", "out": "out"}],
            ["x"],
        ),
        Sample(
            "pad-replicate-3d",
            {"x": [1, 2, 4, 3, 5], "y": [1, 2, 8, 4, 8]},
            [{"op": "pad", "pad": [1, 2, 0, 1, 2, 2], "mode": "replicate", "out": "out"}],
            ["x"],
        ),
        Sample(
            "pad-circular-1d",
            {"x": [2, 3, 6], "y": [2, 3, 11]},
            [{"op": "pad", "pad": [2, 3], "mode": "circular", "out": "out"}],
            ["x"],
        ),
        Sample(
            "pad-circular-2d",
            {"x": [2, 3, 5, 4], "y": [2, 3, 10, 5]},
            [{"op": "pad", "pad": [1, 0, 2, 3], "mode": "circular", "out": "out"}],
            ["x"],
        ),
        Sample(
            "pad-circular-3d",
            {"x": [1, 2, 4, 3, 5], "y": [1, 2, 8, 4, 8]},
            [{"op": "pad", "pad": [1, 2, 0, 1, 2, 2], "mode": "circular", "out": "out"}],
            ["x"],
        ),
        Sample(
            "pad-circular-unbatched-full-wrap",
            {"x": [3, 5, 4], "y": [3, 9, 10]},
            [{"op": "pad", "pad": [3, 3, 0, 4], "mode": "circular", "out": "out"}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "pad": [
        Spelling('F.pad(x, (1, 2, 0, 1), mode="reflect")'),
        Spelling("nn.ZeroPad2d((2, 0, 1, 1))", module=True),
        # MONAI's 3D layers beside the 2D ones above
        Spelling('F.pad(x, (1, 1, 1, 0, 0, 2), mode="replicate")', {"x": (2, 2, 4, 5, 3)}),
    ],
}
