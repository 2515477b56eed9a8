"""``expand`` (``x.expand(...)``, ``x.expand_as(y)``) and ``repeat`` (``x.repeat(...)``, ``torch.tile``):
copies of each entry, so the adjoints sum the copies back::

    expand:  grad_x = grad.sum_to_size(x.shape)
    repeat:  grad_x = grad.reshape(r0, n0, r1, n1, ...).sum(dim=(0, 2, ...))     # n_i = x.shape[i]

Both are linear. ``expand``'s sizes may be read at run time (``{like: y}`` per entry, as ``reshape``
takes them); -1 keeps the input's size. ``repeat``'s counts are numbers.
"""

from __future__ import annotations

from ..algebra import LINEAR, op, primitive
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, ints
from .layout import target_shape
from .shared import show_dims

primitive(
    "expand",
    code=lambda operands, params, show: f"{operands[0]}.expand({', '.join(map(show, params['shape']))})",
    latex=lambda operands, params, show: rf"\operatorname{{expand}}\left({operands[0]}\right)",
    tangent=LINEAR,
)


def _unrepeat_code(operands, params, show) -> str:
    grad, source = operands
    counts, lead = params["counts"], len(params["counts"]) - params["rank"]
    split = ", ".join(
        f"{count}, {source}.shape[{axis - lead}]" if axis >= lead else f"{count}" for axis, count in enumerate(counts)
    )
    dims, position = [], 0  # where each count lands in the split shape: summed away
    for axis, _ in enumerate(counts):
        dims.append(position)
        position += 2 if axis >= lead else 1
    return f"{grad}.reshape({split}).sum(dim={show_dims(tuple(dims))})"


primitive(
    "repeat",
    code=lambda operands, params, show: f"{operands[0]}.repeat({', '.join(map(str, params['counts']))})",
    latex=lambda operands, params, show: rf"\operatorname{{repeat}}\left({operands[0]}\right)",
    tangent=LINEAR,
)
primitive(
    "unrepeat",
    code=_unrepeat_code,
    latex=lambda operands, params, show: rf"\operatorname{{unrepeat}}\left({operands[0]}\right)",
    # linear in the gradient; the second operand gives only its shape
    tangent=lambda expr, tangent_of: op(
        "unrepeat", tangent_of(expr.operands[0]), expr.operands[1], **dict(expr.params.items())
    ),
)


class Expand(Rule):
    op = "expand"
    traced_elsewhere = "x.expand(...) and x.expand_as(y): the tracer's expand handler (sizes read at run time)"
    operands = (Operand("input", from_in=True),)
    params = {"shape": Param(None, target_shape)}
    summary = "broadcast size-1 dims (and new leading dims) to shape, without copying"
    linear_in = ("input",)

    def reference(self, arguments, params):
        return arguments["input"].expand(*params["shape"])

    def infer_shape(self, shapes, params, check: Checker):
        source, target = list(shapes["input"]), list(params["shape"])
        lead = len(target) - len(source)
        check.require(lead >= 0, f"shape {target} has fewer dims than the input {source}", "give every dim")
        out = []
        for axis, size in enumerate(target):
            own = source[axis - lead] if axis >= lead else None
            if isinstance(size, int) and size == -1:
                check.require(own is not None, f"shape {target} keeps (-1) a new leading dim", "give its size")
                out.append(own)
                continue
            if own is not None and not (isinstance(own, int) and own == 1):
                check.equal(
                    own,
                    size,
                    f"the input's size {own} at dim {axis} is not 1 and not {size}",
                    "expand only dims of size 1, or keep the size (-1)",
                )
            out.append(size)
        return tuple(out)

    def forward(self, node):
        return Forward(op("expand", node.operands["input"], shape=node.params["shape"]))

    def pullback(self, node, grad, wanted):
        return {"input": op("sum_to_size", grad, node.operands["input"])}

    def table_row(self):
        return self.op, "out = input.expand(shape)", "grad_input = grad_out.sum_to_size(input.shape)"


def _counts(value, context: ParamContext) -> tuple[int, ...]:
    counts = ints(value, context)
    if any(count < 1 for count in counts):
        raise context.fail(f"must be positive counts, not {list(counts)}", f"write e.g. `{context.name}: [1, 1, 2, 2]`")
    return counts


class Repeat(Rule):
    op = "repeat"
    traced_elsewhere = "x.repeat(...) and torch.tile(x, ...): the tracer's repeat handler"
    operands = (Operand("input", from_in=True),)
    params = {"counts": Param(None, _counts)}
    summary = "tile the input counts[i] times along dim i (new leading dims for extra counts)"
    linear_in = ("input",)

    def reference(self, arguments, params):
        return arguments["input"].repeat(*params["counts"])

    def infer_shape(self, shapes, params, check: Checker):
        source, counts = list(shapes["input"]), list(params["counts"])
        check.require(
            len(counts) >= len(source),
            f"counts {counts} are fewer than the input's {len(source)} dims",
            "give one count per dim",
        )
        lead = len(counts) - len(source)
        return tuple(count * (source[axis - lead] if axis >= lead else 1) for axis, count in enumerate(counts))

    def forward(self, node):
        return Forward(op("repeat", node.operands["input"], counts=node.params["counts"]))

    def pullback(self, node, grad, wanted):
        rank = len(node.shapes["input"])
        return {"input": op("unrepeat", grad, node.operands["input"], counts=node.params["counts"], rank=rank)}

    def table_row(self):
        return (
            self.op,
            "out = input.repeat(counts)",
            "grad_input = grad_out.reshape(r0, n0, r1, n1, ...).sum over the r axes",
        )


RULES = [Expand(), Repeat()]


CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    ("expand", {"x": (2, 1, 3)}, {"op": "expand", "shape": [2, 2, 2, -1]}, ("x",)),
    ("repeat", {"x": (2, 3)}, {"op": "repeat", "counts": [2, 1, 2]}, ("x",)),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "expand": [
        Sample(
            "expand-new-and-size-one-dims",
            {"x": [2, 1, 4, 1], "y": [3, 2, 5, 4, 6]},
            [{"op": "expand", "shape": [3, -1, 5, -1, 6], "out": "out"}],
            ["x"],
        ),
        Sample(
            "expand-like-another-node",
            {"x": [2, 3, 1, 1], "s": [2, 3, 4, 5], "y": [2, 3, 4, 5]},
            [
                {
                    "op": "expand",
                    "in": "x",
                    "shape": [{"like": "s"}, {"like": "s"}, {"like": "s"}, {"like": "s"}],
                    "out": "e",
                },
                {"op": "mul", "in": ["e", "s"], "out": "out"},
            ],
            ["x", "s"],
        ),
    ],
    "repeat": [
        Sample(
            "repeat", {"x": [2, 3, 4], "y": [2, 6, 12]}, [{"op": "repeat", "counts": [1, 2, 3], "out": "out"}], ["x"]
        ),
        Sample(
            "repeat-new-leading-dim",
            {"x": [3, 2], "y": [2, 3, 4]},
            [{"op": "repeat", "counts": [2, 1, 2], "out": "out"}],
            ["x"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "expand": [
        Spelling("x * x.mean((2, 3), keepdim=True).expand_as(x)"),  # SENet ports' gate
        Spelling("x.sum(1, keepdim=True).expand(-1, 3, -1, -1) * x"),
    ],
    "repeat": [
        Spelling("x.repeat(1, 2, 1, 1).sum(1, keepdim=True) * x"),
        Spelling("torch.tile(x, (2, 1)).relu()"),
    ],
}
