"""Constant maps made inside a network: ``torch.full(size, fill_value)`` with sizes read from other
nodes at run time.

FFDNet concatenates a noise-level map to its input, ``torch.full((n, 1, h, w), sigma)`` with ``n, h, w``
read from ``x.shape``: in the spec, ``size: [{like: x}, 1, {like: x}, {like: x}]``, each ``{like: x}``
being x's size at that dim, so the map follows the input's size and is never frozen. The op reads no
tensor's values, so it has no operand and no gradient: the reverse walk never reaches it. It is made
in the dtype and on the device of the first node it reads a size from (``x.new_full(...)``).
"""

from __future__ import annotations

import sympy
import torch

from ..algebra import CONSTANT, Size, op, primitive
from ..spec_values import Like
from .base import Checker, Forward, Operand, Param, ParamContext, Rule, Sample, Spelling, finite_float, ints


def _reads(size) -> bool:
    """Whether a size is read from a node at run time (``x.shape[2]``, ``x.shape[2] * x.shape[3]``)."""
    return isinstance(size, sympy.Basic) and bool(size.atoms(Size))


def _full_code(operands, params, show):
    sizes = params["size"]
    like = next(min(size.atoms(Size), key=str).of.name for size in sizes if _reads(size))
    shown = ", ".join(show(size) if _reads(size) else str(size) for size in sizes)
    return f"{like}.new_full(({shown}{',' if len(sizes) == 1 else ''}), {params['fill_value']!r})"


primitive(
    "full",
    code=_full_code,
    latex=lambda operands, params, show: rf"{params['fill_value']!r} \cdot \mathbf{{1}}",
    tangent=CONSTANT,
)


def _sizes(value, context: ParamContext) -> tuple:
    """A list of positive ints and ``{like: NODE}`` (NODE's size at that dim), at least one of those."""
    if not isinstance(value, list) or not value:
        raise context.fail(
            f"must be a list of sizes, not {value!r}", "write e.g. `size: [{like: x}, 1, {like: x}, {like: x}]`"
        )
    sizes = []
    for dim, item in enumerate(value):
        if isinstance(item, Like):
            if item.dims is None and item.rank != len(value):
                raise context.fail(
                    f"entry {dim} is {item}, a size of '{item.node}', which has {item.rank} dims, not {len(value)}",
                    "read each size from a node of the map's rank",
                )
            sizes.append(item.size_at(dim))
        elif isinstance(item, int) and not isinstance(item, bool) and item >= 1:
            sizes.append(item)
        else:
            raise context.fail(
                f"entry {dim} is {item!r}, neither a positive int nor {{like: NODE}}",
                "write a size, or {like: NODE} for NODE's size at this dim",
            )
    if not any(_reads(size) for size in sizes):
        raise context.fail(
            "reads no size from a node: a constant of fixed size is data, not a layer",
            "declare it under inputs, or read the sizes that follow the input with {like: NODE}",
        )
    return tuple(sizes)


class Full(Rule):
    """``torch.full(size, fill_value)``, some sizes read from other nodes at run time."""

    op = "full"
    traced_elsewhere = (
        "torch.full, torch.ones_like, torch.tensor, x.new_full ...: the tracer's constant handling "
        "makes a full layer of a one-value map read as a tensor"
    )
    operands = ()
    params = {"size": Param(None, _sizes), "fill_value": Param(None, finite_float)}
    summary = "a tensor filled with one value, its sizes read from other nodes at run time; no gradient"

    def infer_shape(self, shapes, params, check: Checker):
        check.require(params["fill_value"] is not None, "needs fill_value", "write e.g. `fill_value: 0.1`")
        return tuple(params["size"])

    def forward(self, node):
        return Forward(op("full", size=node.params["size"], fill_value=node.params["fill_value"]))

    def pullback(self, node, grad, wanted):
        return {}  # no operands: nothing is ever wanted

    def reference_params(self, params):  # in float64, at least as precise as the inputs
        return {"size": params["size"], "fill_value": params["fill_value"], "dtype": torch.float64}

    def table_row(self):
        return (
            self.op,
            "out = torch.full(size, fill_value), sizes read from other nodes ({like: x}) at run time",
            "none: its value depends on no input",
        )


MAX_CONSTANT = 4096
"""The most entries a constant layer holds written out in the spec; a larger one is a buffer's job."""


def _constant_code(operands, params, show):
    values = ", ".join(repr(float(value)) for value in params["values"])
    shape = ", ".join(map(str, params["shape"]))
    return f"{operands[0]}.new_tensor([{values}]).reshape({shape}{',' if len(params['shape']) == 1 else ''})"


primitive("constant", code=_constant_code, tangent=CONSTANT, latex=lambda operands, params, show: r"\mathbf{c}")


def _values(value, context: ParamContext) -> tuple:
    if not isinstance(value, list) or not value or len(value) > MAX_CONSTANT:
        raise context.fail(
            f"must be a list of 1 to {MAX_CONSTANT} numbers",
            "write e.g. `values: [1.0, 0.5]`, or make a larger constant a buffer (an input)",
        )
    return tuple(float(finite_float(item, context)) for item in value)


class Constant(Rule):
    """A tensor of several values made inside the network from numbers alone (diffusers' timestep
    frequencies ``exp(-log(10000) * arange(half) / half)``, a fixed mask): its values written out at the
    precision they were computed in (each float's shortest exact decimal), made at run time in the
    dtype and on the device of ``like``, a node the layer reads for nothing else; no gradient."""

    op = "constant"
    traced_elsewhere = (
        "torch.arange, torch.linspace, torch.tensor, ... and what is computed from them alone: the "
        "tracer's constant handling makes a constant layer of one read by a layer"
    )
    operands = (Operand("like", from_in=True),)
    params = {"values": Param(None, _values), "shape": Param(None, ints)}
    summary = "a tensor of given values made in the network, in like's dtype and device; no gradient"

    def reference(self, arguments, params):
        return torch.tensor(params["values"], dtype=arguments["like"].dtype).reshape(params["shape"])

    def infer_shape(self, shapes, params, check: Checker):
        check.require(
            params["values"] is not None and params["shape"] is not None,
            "needs values and shape",
            "write e.g. `values: [1.0, 0.5], shape: [2]`",
        )
        size = 1
        for length in params["shape"]:
            size *= length
        check.require(
            all(length >= 1 for length in params["shape"]) and size == len(params["values"]),
            f"shape {list(params['shape'])} does not hold the {len(params['values'])} values",
            "give a shape whose sizes multiply to the number of values",
        )
        return tuple(params["shape"])

    def forward(self, node):
        return Forward(op("constant", node.operands["like"], values=node.params["values"], shape=node.params["shape"]))

    def pullback(self, node, grad, wanted):
        return {"like": sympy.Integer(0)}  # like gives only its dtype and device

    def table_row(self):
        return (self.op, "out = like.new_tensor(values).reshape(shape)", "none: its value depends on no input's value")


RULES = [Full(), Constant()]


SAMPLES = {  # each op's spec-level cases (base.Sample): tests/rules/ generate and check every one
    "full": [
        Sample(
            "full-map-sized-like-x-concatenated",
            {"x": [2, 3, 5, 4], "w": [2, 4, 3, 3], "y": [2, 2, 3, 2]},
            [
                {
                    "op": "full",
                    "size": [{"like": "x"}, 1, {"like": "x"}, {"like": "x"}],
                    "fill_value": 0.25,
                    "out": "level",
                },
                {"op": "cat", "in": ["x", "level"], "dim": 1, "out": "joined"},
                {"op": "conv2d", "in": "joined", "weight": "w", "out": "out"},
            ],
            ["x", "w"],
        ),
    ],
    "constant": [
        Sample(
            "constant-timestep-frequencies",
            {"t": [3], "y": [3, 4]},
            [
                {"op": "unsqueeze", "in": "t", "dim": 1, "out": "column"},
                {"op": "constant", "in": "t", "values": [1.0, 0.1, 0.01, 0.001], "shape": [1, 4], "out": "freqs"},
                {"op": "mul", "in": ["column", "freqs"], "out": "args"},
                {"op": "sin", "in": "args"},
            ],
            ["t"],
        ),
        Sample(
            "constant-read-for-dtype-only",
            {"t": [3], "y": [2, 2]},
            [
                {"op": "constant", "in": "t", "values": [1.0, 0.5, -2.0, 0.25], "shape": [2, 2], "out": "c"},
                {"op": "sum", "in": "t", "dim": [0], "keepdim": True, "out": "s"},
                {"op": "mul", "in": ["c", "s"]},
            ],
            ["t"],
        ),
    ],
}
SPELLINGS = {  # how models write each op (base.Spelling): tests/trace/test_ops.py traces each
    "full": [
        # a map of one value made inside forward, read as a tensor, is a full layer with its sizes
        # read from x at run time (one value broadcast against a tensor is a number: see mul)
        Spelling("torch.cat([x, torch.full((x.shape[0], 1, x.shape[2], x.shape[3]), 0.25, dtype=x.dtype)], 1)"),
        Spelling("x[:, :1] * x.new_ones(x.shape[0], 4, *x.shape[2:])"),
    ],
    "constant": [
        # diffusers' sinusoidal timestep embedding: the frequencies, made from numbers alone, a
        # constant layer
        Spelling(
            "torch.cat([torch.sin(t[:, None] * torch.exp(-math.log(10000) * torch.arange(4) "
            "/ 4)[None]), torch.cos(t[:, None] * torch.exp(-math.log(10000) * "
            "torch.arange(4) / 4)[None])], dim=-1)",
            {"t": (3,)},
        ),
    ],
}
