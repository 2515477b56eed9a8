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
from ..spec import Like
from .base import Checker, Forward, Param, ParamContext, Rule, finite_float


def _reads(size) -> bool:
    """Whether a size is read from a node at run time (``x.shape[2]``, ``x.shape[2] * x.shape[3]``)."""
    return isinstance(size, sympy.Basic) and bool(size.atoms(Size))


def _full_code(operands, params, show):
    sizes = params["size"]
    like = next(min(size.atoms(Size), key=str).of.name for size in sizes if _reads(size))
    shown = ", ".join(show(size) if _reads(size) else str(size) for size in sizes)
    return f"{like}.new_full(({shown}{',' if len(sizes) == 1 else ''}), {params['fill_value']!r})"


primitive("full", code=_full_code,
          latex=lambda operands, params, show: rf"{params['fill_value']!r} \cdot \mathbf{{1}}", tangent=CONSTANT)


def _sizes(value, context: ParamContext) -> tuple:
    """A list of positive ints and ``{like: NODE}`` (NODE's size at that dim), at least one of those."""
    if not isinstance(value, list) or not value:
        raise context.fail(f"must be a list of sizes, not {value!r}",
                           "write e.g. `size: [{like: x}, 1, {like: x}, {like: x}]`")
    sizes = []
    for dim, item in enumerate(value):
        if isinstance(item, Like):
            if item.dims is None and item.rank != len(value):
                raise context.fail(f"entry {dim} is {item}, a size of '{item.node}', which has {item.rank} dims, "
                                   f"not {len(value)}", "read each size from a node of the map's rank")
            sizes.append(item.size_at(dim))
        elif isinstance(item, int) and not isinstance(item, bool) and item >= 1:
            sizes.append(item)
        else:
            raise context.fail(f"entry {dim} is {item!r}, neither a positive int nor {{like: NODE}}",
                               "write a size, or {like: NODE} for NODE's size at this dim")
    if not any(_reads(size) for size in sizes):
        raise context.fail("reads no size from a node: a constant of fixed size is data, not a layer",
                           "declare it under inputs, or read the sizes that follow the input with {like: NODE}")
    return tuple(sizes)


class Full(Rule):
    """``torch.full(size, fill_value)``, some sizes read from other nodes at run time."""

    op = "full"
    traced_elsewhere = ("torch.full, torch.ones_like, torch.tensor, x.new_full ...: the tracer's constant handling "
                        "makes a full layer of a one-value map read as a tensor")
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
        return (self.op, "out = torch.full(size, fill_value), sizes read from other nodes ({like: x}) at run time",
                "none: its value depends on no input")


RULES = [Full()]
