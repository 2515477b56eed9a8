"""Ops that move entries without changing them: flatten, reshape, permute, unsqueeze, squeeze, narrow, cat.

Each adjoint is one shape-generic PyTorch expression: ``flatten``/``reshape`` reshape the gradient
back to the input's runtime shape; ``permute`` applies the inverse permutation; ``unsqueeze`` and
``squeeze`` are each other's adjoint; ``narrow`` pads the gradient with zeros back to the input's
length; ``cat`` hands each input its own slice.
"""

from __future__ import annotations

import sympy

from ..algebra import LINEAR, Size, keyword_arguments, op, primitive
from ..spec_values import Like, size_expression
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, ints

primitive(
    "reshape_like",
    code=lambda operands, params, show: f"{operands[0]}.reshape({operands[1]}.shape)",
    latex=lambda operands, params, show: operands[0],
    tangent=lambda expr, tangent_of: op("reshape_like", tangent_of(expr.operands[0]), expr.operands[1]),
)
primitive(
    "flatten",
    code=lambda operands, params, show: (
        f"torch.flatten({operands[0]}{keyword_arguments(params, {'start_dim': 0, 'end_dim': -1}, show)})"
    ),
    latex=lambda operands, params, show: rf"\operatorname{{flatten}}\left({operands[0]}\right)",
    tangent=LINEAR,
)
primitive(
    "reshape",
    code=lambda operands, params, show: f"{operands[0]}.reshape({', '.join(map(show, params['shape'])) or '()'})",
    latex=lambda operands, params, show: rf"\operatorname{{reshape}}\left({operands[0]}\right)",
    tangent=LINEAR,
)
primitive(
    "permute",
    code=lambda operands, params, show: f"{operands[0]}.permute({', '.join(map(str, params['dims']))})",
    latex=lambda operands, params, show: rf"{operands[0]}^{{\pi}}",
    tangent=LINEAR,
)


class Flatten(Rule):
    op = "flatten"
    calls = ("flatten",)
    operands = (Operand("input", from_in=True),)
    params = {"start_dim": Param(0, lambda v, c: ints(v, c)[0]), "end_dim": Param(-1, lambda v, c: ints(v, c)[0])}
    summary = "merge dims start_dim..end_dim"
    linear_in = ("input",)

    def infer_shape(self, shapes, params, check: Checker):
        shape = list(shapes["input"])
        start, end = params["start_dim"] % len(shape), params["end_dim"] % len(shape)
        check.require(
            start <= end, f"start_dim {params['start_dim']} comes after end_dim {params['end_dim']}", "swap them"
        )
        merged = 1
        for size in shape[start : end + 1]:
            merged = merged * size
        return tuple(shape[:start] + [merged] + shape[end + 1 :])

    def forward(self, node):
        return Forward(
            op("flatten", node.operands["input"], start_dim=node.params["start_dim"], end_dim=node.params["end_dim"])
        )

    def pullback(self, node, grad, wanted):
        return {"input": op("reshape_like", grad, node.operands["input"])}

    def table_row(self):
        return self.op, "out = input with dims start_dim..end_dim merged", "grad_input = grad_out.reshape(input.shape)"


def target_shape(value, context: ParamContext) -> tuple:
    """``reshape``'s target: ints (one may be -1) and sizes read from nodes at run time, ``{like: x}`` (x's
    size at the same position) or ``{like: x, dims: [2, 3]}`` (``x.shape[2] * x.shape[3]``); ``[]``: 0-dim (a
    whole-value sum or mean the network reads on, as the model's: symgrad/trace/loss_tail.reduction_layers)."""
    if value == []:
        return ()
    if not isinstance(value, list) or not any(isinstance(item, Like) for item in value):
        return ints(value, context)
    shape = []
    for position, item in enumerate(value):
        if not isinstance(item, Like):
            shape.append(ints(item, context)[0])
            continue
        dims = item.dims if item.dims is not None else (position,)
        if item.size is not None:
            read: list[int] = []
            size_expression(item.size, lambda dim: read.append(dim) or sympy.Integer(1))
            dims = tuple(read)
        if any(not -item.rank <= dim < item.rank for dim in dims):
            raise context.fail(
                f"entry {position} is {item}, but '{item.node}' has {item.rank} dims",
                f"read dims of '{item.node}' between {-item.rank} and {item.rank - 1}",
            )
        shape.append(item.size_at(position))
    return tuple(shape)


class Reshape(Flatten):
    op = "reshape"
    calls = ()
    traced_elsewhere = "view, reshape, view_as and reshape_as calls: the tracer's reshape handlers"
    params = {"shape": Param(None, target_shape)}
    summary = "the same entries in another shape"

    def reference(self, arguments, params):
        return arguments["input"].reshape(params["shape"])

    def infer_shape(self, shapes, params, check: Checker):
        target = list(params["shape"])
        check.require(
            target.count(-1) <= 1 and all(s == -1 or not isinstance(s, int) or s > 0 for s in target),
            f"shape {target} may hold one -1 and otherwise positive sizes",
            "fix the shape",
        )
        total = 1
        for size in shapes["input"]:
            total = total * size
        known = 1
        for size in target:
            known = known * (size if size != -1 else 1)
        if -1 in target:
            target[target.index(-1)] = total // known
            check.equal(
                total % known,
                0,
                f"shape {list(params['shape'])} does not divide the input's {total} entries",
                "fix the shape",
            )
        else:
            check.equal(known, total, f"shape {target} holds {known} entries, not the input's {total}", "fix the shape")
        return tuple(target)

    def forward(self, node):
        return Forward(op("reshape", node.operands["input"], shape=node.params["shape"]))

    def table_row(self):
        return self.op, "out = input.reshape(shape)", "grad_input = grad_out.reshape(input.shape)"


class Permute(Rule):
    op = "permute"
    traced_elsewhere = (
        "x.permute(...), x.transpose(a, b), swapaxes, x.mT, x.t(): the tracer's permute and transpose handlers"
    )
    operands = (Operand("input", from_in=True),)
    params = {"dims": Param(None, ints)}
    summary = "reorder the dims"
    linear_in = ("input",)

    def reference(self, arguments, params):
        return arguments["input"].permute(params["dims"])

    def infer_shape(self, shapes, params, check: Checker):
        shape = shapes["input"]
        dims = [d % len(shape) for d in params["dims"]]
        check.require(
            sorted(dims) == list(range(len(shape))),
            f"dims {list(params['dims'])} are not a permutation of the input's {len(shape)} dims",
            f"list each of 0..{len(shape) - 1} once",
        )
        return tuple(shape[d] for d in dims)

    def forward(self, node):
        return Forward(op("permute", node.operands["input"], dims=node.params["dims"]))

    def pullback(self, node, grad, wanted):
        dims = [d % len(node.shapes["input"]) for d in node.params["dims"]]
        inverse = tuple(sorted(range(len(dims)), key=dims.__getitem__))
        return {"input": op("permute", grad, dims=inverse)}

    def table_row(self):
        return self.op, "out = input.permute(dims)", "grad_input = grad_out.permute(inverse of dims)"


primitive(
    "unsqueeze",
    code=lambda operands, params, show: f"{operands[0]}.unsqueeze({params['dim']})",
    latex=lambda operands, params, show: operands[0],
    tangent=LINEAR,
)
primitive(
    "squeeze",
    code=lambda operands, params, show: f"{operands[0]}.squeeze({params['dim']})",
    latex=lambda operands, params, show: operands[0],
    tangent=LINEAR,
)


class Unsqueeze(Rule):
    """A new size-1 dim at ``dim`` (``x[:, None]``, ``x.unsqueeze(1)``); the adjoint squeezes it again."""

    op = "unsqueeze"
    calls = ("unsqueeze",)
    operands = (Operand("input", from_in=True),)
    params = {"dim": Param(None, lambda v, c: ints(v, c)[0])}
    summary = "a new size-1 dim at dim"
    linear_in = ("input",)

    def _dim(self, rank: int, params, check: Checker | None = None) -> int:
        dim = params["dim"]
        if check is not None:
            check.require(
                -rank - 1 <= dim <= rank,
                f"dim {dim} is out of range for a {rank}-dim input",
                f"give a dim in {-rank - 1}..{rank}",
            )
        return dim % (rank + 1)

    def infer_shape(self, shapes, params, check: Checker):
        shape = list(shapes["input"])
        dim = self._dim(len(shape), params, check)
        return tuple(shape[:dim] + [1] + shape[dim:])

    def forward(self, node):
        return Forward(op("unsqueeze", node.operands["input"], dim=self._dim(len(node.shapes["input"]), node.params)))

    def pullback(self, node, grad, wanted):
        return {"input": op("squeeze", grad, dim=self._dim(len(node.shapes["input"]), node.params))}

    def table_row(self):
        return self.op, "out = input.unsqueeze(dim)", "grad_input = grad_out.squeeze(dim)"


class Squeeze(Rule):
    """The size-1 dim ``dim`` removed (``x.squeeze(-1)``); the adjoint puts it back."""

    op = "squeeze"
    calls = ("squeeze",)
    operands = (Operand("input", from_in=True),)
    params = {"dim": Param(None, lambda v, c: ints(v, c)[0])}
    summary = "the size-1 dim dim removed"
    linear_in = ("input",)

    def _dim(self, rank: int, params, check: Checker | None = None) -> int:
        dim = params["dim"]
        if check is not None:
            check.require(
                rank >= 1 and -rank <= dim < rank,
                f"dim {dim} is out of range for a {rank}-dim input",
                f"give a dim in {-rank}..{rank - 1}",
            )
        return dim % rank

    def infer_shape(self, shapes, params, check: Checker):
        shape = list(shapes["input"])
        dim = self._dim(len(shape), params, check)
        check.equal(shape[dim], 1, lambda: f"dim {dim} has size {shape[dim]}, not 1", "squeeze a dim of size 1")
        return tuple(shape[:dim] + shape[dim + 1 :])

    def forward(self, node):
        return Forward(op("squeeze", node.operands["input"], dim=self._dim(len(node.shapes["input"]), node.params)))

    def pullback(self, node, grad, wanted):
        return {"input": op("unsqueeze", grad, dim=self._dim(len(node.shapes["input"]), node.params))}

    def table_row(self):
        return self.op, "out = input.squeeze(dim)", "grad_input = grad_out.unsqueeze(dim)"


primitive(
    "narrow",
    code=lambda operands, params, show: (
        f"{operands[0]}.narrow({params['dim']}, {show(params['start'])}, {show(params['length'])})"
    ),
    latex=lambda operands, params, show: (
        rf"{operands[0]}\left[{show(params['start'])}:{show(params['start'] + params['length'])}\right]"
    ),
    tangent=LINEAR,
)


def _length(value, context: ParamContext):
    """narrow's start or length: an int, or one size read at run time (``{like: idx, dims: [1]}``:
    ``idx.shape[1]``, the positions ``torch.arange(idx.shape[1])`` reads from a position embedding's table;
    ``{like: h, size: 'shape[1] - 1'}``: the last token of ``h[:, -1]``, the start of ``h[:, -3:]``)."""
    if isinstance(value, Like):
        if value.dims is None and value.size is None:
            raise context.fail(
                f"is {value}, which names no dim", f"write `{context.name}: {{like: {value.node}, dims: [1]}}`"
            )
        return value.size_at(0)
    return ints(value, context)[0]


class Narrow(Rule):
    """Slicing, as ``torch.narrow``: the adjoint puts the gradient back in place and zero-pads the
    rest, ``F.pad`` with ``start`` before and ``size - start - length`` after, from the runtime size."""

    op = "narrow"
    calls = ("narrow",)
    operands = (Operand("input", from_in=True),)
    linear_in = ("input",)
    params = {
        "dim": Param(None, lambda v, c: ints(v, c)[0]),
        "start": Param(None, _length),
        "length": Param(None, _length),
    }
    summary = "the entries start..start+length-1 along dim"

    def infer_shape(self, shapes, params, check: Checker):
        shape = list(shapes["input"])
        dim = params["dim"] % len(shape)
        if isinstance(params["start"], int):
            check.require(params["start"] >= 0, "start must be >= 0", "give a non-negative start")
        else:  # read at run time: a size, checked as one
            check.positive(params["start"] + 1, "start must be >= 0", "give a non-negative start")
        check.positive(params["length"], "length must be >= 1", "give a positive length")
        check.positive(
            shape[dim] - params["start"] - params["length"] + 1,
            f"start {params['start']} + length {params['length']} runs past dim {dim}",
            "shorten the slice",
        )
        shape[dim] = params["length"]
        return tuple(shape)

    def forward(self, node):
        dim = node.params["dim"] % len(node.shapes["input"])
        return Forward(
            op("narrow", node.operands["input"], dim=dim, start=node.params["start"], length=node.params["length"])
        )

    def pullback(self, node, grad, wanted):
        rank = len(node.shapes["input"])
        dim, start, length = node.params["dim"] % rank, node.params["start"], node.params["length"]
        after = Size(node.operands["input"], dim) - start - length
        return {"input": op("pad", grad, pad=(0, 0) * (rank - 1 - dim) + (start, after))}

    def table_row(self):
        return (
            self.op,
            "out = input.narrow(dim, start, length)",
            "grad_input = grad_out zero-padded back to the input's size",
        )


def _cat_tangent(expr, tangent_of):
    moved = [tangent_of(operand) for operand in expr.operands]
    if all(m == 0 for m in moved):
        return sympy.Integer(0)
    return op(
        "cat", *(m if m != 0 else op("zeros_like", o) for m, o in zip(moved, expr.operands)), dim=expr.params["dim"]
    )


primitive(
    "cat",
    code=lambda operands, params, show: f"torch.cat([{', '.join(operands)}], dim={params['dim']})",
    latex=lambda operands, params, show: r"\left[" + ", ".join(operands) + r"\right]",
    tangent=_cat_tangent,
)


class Cat(Rule):
    """``torch.cat``: the adjoint hands each input its own slice of the gradient, ``narrow`` at the
    offset summed from the runtime sizes of the inputs before it."""

    op = "cat"
    calls = ("cat", "concat", "concatenate")
    operands = (Operand("tensors", from_in=True, variadic=True),)
    linear_in = ("tensors",)
    params = {"dim": Param(0, lambda v, c: ints(v, c)[0])}
    summary = "join tensors along dim"

    def reference(self, arguments, params):
        import torch

        return torch.cat([arguments[f"tensors_{i}"] for i in range(len(arguments))], dim=params["dim"])

    def infer_shape(self, shapes, params, check: Checker):
        ordered = [shapes[key] for key in sorted(shapes, key=lambda k: int(k.rsplit("_", 1)[1]))]
        rank = len(ordered[0])
        check.require(
            all(len(shape) == rank for shape in ordered), "cat needs tensors of one rank", "give them equal ranks"
        )
        dim = params["dim"] % rank
        out = list(ordered[0])
        for shape in ordered[1:]:
            for axis in range(rank):
                if axis != dim:
                    check.equal(
                        shape[axis],
                        out[axis],
                        f"shapes {[tuple(s) for s in ordered]} differ outside dim {dim}",
                        "make every other dim equal",
                    )
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
        return (
            self.op,
            "out = torch.cat([a, b, ...], dim)",
            "grad of each input = grad_out.narrow(dim, its offset, its size)",
        )


RULES = [Flatten(), Reshape(), Permute(), Unsqueeze(), Squeeze(), Narrow(), Cat()]


CERTIFICATES = [  # (label, input shapes, layer, linear operands): `symgrad certify` proves each adjoint exact
    ("flatten", {"x": (2, 3, 2)}, {"op": "flatten", "start_dim": 1}, ("x",)),
    ("reshape", {"x": (2, 3, 2)}, {"op": "reshape", "shape": [3, -1]}, ("x",)),
    ("permute", {"x": (2, 3, 2)}, {"op": "permute", "dims": [1, 2, 0]}, ("x",)),
    ("unsqueeze", {"x": (2, 3)}, {"op": "unsqueeze", "dim": 1}, ("x",)),
    ("squeeze", {"x": (2, 1, 3)}, {"op": "squeeze", "dim": -2}, ("x",)),
    ("narrow", {"x": (2, 5, 3)}, {"op": "narrow", "dim": 1, "start": 1, "length": 3}, ("x",)),
    ("cat (first input)", {"x": (2, 2, 3), "v": (2, 1, 3)}, {"op": "cat", "in": ["x", "v"], "dim": 1}, ("x",)),
    ("cat (second input)", {"x": (2, 2, 3), "v": (2, 1, 3)}, {"op": "cat", "in": ["x", "v"], "dim": 1}, ("v",)),
]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "flatten": [
        Sample("flatten", {"x": [2, 3, 4, 5], "y": [2, 60]}, [{"op": "flatten", "start_dim": 1, "out": "out"}], ["x"]),
    ],
    "reshape": [
        Sample(
            "reshape-minus-one",
            {"x": [2, 3, 4], "y": [2, 12]},
            [{"op": "reshape", "shape": [2, -1], "out": "out"}],
            ["x"],
        ),
        Sample("reshape", {"x": [2, 3, 4], "y": [6, 4]}, [{"op": "reshape", "shape": [6, 4], "out": "out"}], ["x"]),
        Sample(
            "reshape-sizes-read-at-run-time",
            {"x": [2, 3, 4, 5], "y": [2, 3, 20]},
            [{"op": "reshape", "shape": [{"like": "x"}, {"like": "x"}, {"like": "x", "dims": [2, 3]}], "out": "out"}],
            ["x"],
        ),
    ],
    "permute": [
        Sample(
            "permute", {"x": [2, 3, 4], "y": [4, 2, 3]}, [{"op": "permute", "dims": [2, 0, 1], "out": "out"}], ["x"]
        ),
    ],
    "unsqueeze": [
        Sample("unsqueeze", {"x": [2, 3, 4], "y": [2, 1, 3, 4]}, [{"op": "unsqueeze", "dim": 1, "out": "out"}], ["x"]),
        Sample("unsqueeze-last", {"x": [2, 3], "y": [2, 3, 1]}, [{"op": "unsqueeze", "dim": -1, "out": "out"}], ["x"]),
    ],
    "squeeze": [
        Sample("squeeze", {"x": [2, 1, 4], "y": [2, 4]}, [{"op": "squeeze", "dim": 1, "out": "out"}], ["x"]),
        Sample("squeeze-last", {"x": [2, 3, 1], "y": [2, 3]}, [{"op": "squeeze", "dim": -1, "out": "out"}], ["x"]),
    ],
    "narrow": [
        Sample(
            "narrow",
            {"x": [2, 5, 3], "y": [2, 3, 3]},
            [{"op": "narrow", "dim": 1, "start": 1, "length": 3, "out": "out"}],
            ["x"],
        ),
        Sample(
            "narrow-last-dim",
            {"x": [2, 5, 4], "y": [2, 5, 2]},
            [{"op": "narrow", "dim": -1, "start": 0, "length": 2, "out": "out"}],
            ["x"],
        ),
    ],
    "cat": [
        Sample(
            "cat-three",
            {"a": [2, 3, 4], "b": [2, 1, 4], "c": [2, 2, 4], "y": [2, 6, 4]},
            [{"op": "cat", "in": ["a", "b", "c"], "dim": 1}],
            ["a", "b", "c"],
        ),
        Sample(
            "cat-same-tensor-twice", {"a": [2, 3], "y": [2, 6]}, [{"op": "cat", "in": ["a", "a"], "dim": -1}], ["a"]
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "flatten": [
        Spelling("nn.Flatten()", module=True),
        Spelling("x.view(x.size(0), -1)"),
        Spelling("x.view_as(x.flatten(2))"),
    ],
    "reshape": [
        Spelling("x.reshape(x.shape[0], 3, 4, 16)"),
        Spelling("x.view((x.shape[0], 3, 16, 4))"),
        Spelling("x.reshape_as(w) * w", {"x": (2, 12), "w": (2, 3, 4)}),
    ],
    "permute": [
        Spelling("x.permute(0, 2, 3, 1)"),
        Spelling("torch.permute(x, (0, 3, 1, 2))"),
        Spelling("x.transpose(1, 2)"),
        Spelling("torch.transpose(x, -1, 1)"),
        Spelling("x.swapaxes(0, 3) * 2"),
        Spelling("torch.swapdims(x, 2, 3)"),
        Spelling("x.mT"),
        Spelling("x.T @ y", {"x": (4, 3), "y": (4, 5)}),
    ],
    "unsqueeze": [
        Spelling("x[:, None] * x.unsqueeze(2)", {"x": (2, 3, 8)}),
        Spelling("x * gamma[..., None, None]", {"x": (2, 3, 8, 8), "gamma": (3,)}),
        Spelling("x * x.mean((2, 3))[:, :, None, None]"),
        Spelling("x[:, -1, None, 2:5] * torch.unsqueeze(x, -1)[:, :1, 2:5, ..., 0]"),
    ],
    "squeeze": [
        Spelling("x.unbind(1)[2] * torch.unbind(x, dim=-1)[0]", {"x": (2, 3, 3, 3)}),
        Spelling("x[:, 0] * x[:, -1]"),
        Spelling("F.adaptive_avg_pool2d(x, 1).squeeze()"),
        Spelling("x[:, :1].squeeze(1)"),
        Spelling("x.mean((2, 3), keepdim=True).squeeze(-1).squeeze(-1)"),
    ],
    "narrow": [
        Spelling("x[:, 1:3]"),
        Spelling("x.narrow(1, 0, 2)"),
        # NAFNet's SimpleGate
        Spelling("(lambda x1, x2: x1 * x2)(*x.chunk(2, dim=1))", {"x": (2, 4, 8, 8)}),
        Spelling("(lambda a, b: a * b)(*torch.chunk(x, 2, 1))", {"x": (2, 4, 8, 8)}),
        Spelling("torch.cat([p.exp() for p in torch.split(x, [1, 2], 1)][::-1], 1)"),
        Spelling("torch.cat(x.split(2, dim=1), dim=1) * x"),  # pieces 2 and 1
    ],
    "cat": [
        Spelling("torch.cat([x, y], dim=1)", {"x": (2, 3, 8, 8), "y": (2, 3, 8, 8)}),
    ],
}
