"""Tensor methods and calls rewritten as the spec's ops: views and reshapes, slices, pieces, transposes,
expansions and repeats, one-sided clamps, norms, ``c - x``, and ``var_mean``: calls that have no rule of
their own, or reach one under another form (``x.view(n, -1)`` is ``flatten``, ``x[:, 0]`` a ``narrow``
and a ``squeeze``)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import sympy
import torch

from . import casts, op_hooks, size_checks, sizes
from .dataflow import call_sizes, is_int, is_number
from .dispatch import handles
from .indexing import index_select, index_with_tensor, strided_slice
from .recorder import Call
from .size_reads import size_read
from .torch_names import FIXES, PASS_THROUGH, PIECES, TRANSPOSES

if TYPE_CHECKING:
    from .dispatch import Builder


@handles("permute")
def permute(builder: Builder, call: Call) -> None:
    builder.layer("permute", {"input": call.arguments[0], "dims": list(call_sizes(call, "dims"))}, call)


@handles("square")
def square(builder: Builder, call: Call) -> None:
    builder.layer("pow", {"input": call.arguments[0], "exponent": 2}, call)


@handles("__getitem__")
def getitem(builder: Builder, call: Call) -> None:
    """``x[:, idx]`` with an int64 input (``indexing.py``), else ``x[:, 1:3, None]`` (``basic_index``)."""
    if not index_with_tensor(builder, call):
        basic_index(builder, call)


@handles("select")
def select(builder: Builder, call: Call) -> None:
    """``x.select(1, -1)``, ``torch.select(x, 1, i)``: ``x[:, -1]``."""
    bound = dict(zip(("input", "dim", "index"), call.arguments)) | call.keywords
    source, dim, index = bound.get("input"), bound.get("dim"), bound.get("index")
    if not isinstance(source, torch.Tensor) or not is_int(dim) or not is_int(index) or source.dim() == 0:
        return builder.unknown(call)
    items = (slice(None),) * (dim % source.dim()) + (index,)
    basic_index(builder, dataclasses.replace(call, arguments=(source, items), keywords={}))


@handles("index_select")
def selected(builder: Builder, call: Call) -> None:
    """``torch.index_select(x, dim, idx)`` with an int64 input (``indexing.py``)."""
    if not index_select(builder, call):
        builder.unknown(call)


@handles(*PASS_THROUGH)
def pass_through(builder: Builder, call: Call) -> None:
    source, result = call.arguments[0], call.result
    if not isinstance(result, torch.Tensor) or not isinstance(source, torch.Tensor):
        return builder.unknown(call)
    if result.dtype != source.dtype or result.device != source.device:
        if casts.convert(builder, call):
            return
        builder.fail(
            call,
            f"converts {source.dtype} on {source.device} to {result.dtype} on {result.device}",
            "trace at the dtype and device the model runs in, without conversions",
        )
        return
    builder.alias(call, source)


@handles("view", "reshape")
def reshape(builder: Builder, call: Call) -> None:
    source, result = call.arguments[0], call.result
    shape = call_sizes(call, "shape", "size")
    kept = result.dim() - 1  # (N, -1) is flatten(start_dim=1), whatever N is
    if (
        0 <= kept < source.dim()
        and tuple(source.shape[:kept]) == tuple(result.shape[:kept])
        and math.prod(source.shape[kept:]) == result.shape[kept]
    ):
        return builder.layer("flatten", {"input": source, "start_dim": kept}, call)
    if tuple(result.shape) == tuple(source.shape):
        return builder.alias(call, source)
    traced = sizes.spec_sizes(
        shape, builder.node, builder.size_tensors
    )  # sizes that carry the dims they were read from
    if traced is not None:
        return builder.layer("reshape", {"input": source, "shape": traced}, call)
    shape = [int(size) for size in shape]
    if shape and -1 not in shape and shape[0] == source.shape[0] and source.dim() > 0:
        shape[0] = -1  # the batch, read from the input: (N, C, 4, 16) stays shape-generic
    shape = [
        size if size == -1 else size_read(builder, size, position, len(shape)) for position, size in enumerate(shape)
    ]
    builder.layer("reshape", {"input": source, "shape": shape}, call)


@handles("view_as", "reshape_as")
def reshape_as(builder: Builder, call: Call) -> None:
    """``x.view_as(y)``, ``x.reshape_as(y)``: ``x.reshape(y.shape)``, the batch kept generic as for ``view``."""
    other = call.keywords.get("other", call.arguments[1] if len(call.arguments) > 1 else None)
    if not isinstance(other, torch.Tensor):
        return builder.unknown(call)
    reshape(builder, dataclasses.replace(call, arguments=(call.arguments[0], tuple(other.shape)), keywords={}))


@handles("expand", "expand_as", "broadcast_to")
def expand(builder: Builder, call: Call) -> None:
    """``x.expand(b, c, h, w)``, ``x.expand_as(y)``, ``torch.broadcast_to(x, shape)``: the sizes are read at
    run time where the code read them (``expand_as(y)``: every entry ``{like: y}``); -1 keeps a size."""
    source = call.arguments[0]
    if call.name == "expand_as":
        other = call.keywords.get("other", call.arguments[1] if len(call.arguments) > 1 else None)
        if not isinstance(other, torch.Tensor) or not isinstance(builder.node(other), str):
            return builder.unknown(call)
        shape: list[Any] = [{"like": builder.node(other)} for _ in range(other.dim())]  # fresh dicts: no YAML aliases
    else:
        shape = sizes.spec_sizes(
            call_sizes(call, "size", "shape"), builder.node, builder.size_tensors, spare=False
        ) or [
            size if size == -1 else size_read(builder, size, position, len(call_sizes(call, "size", "shape")))
            for position, size in enumerate(int(size) for size in call_sizes(call, "size", "shape"))
        ]
    if not isinstance(source, torch.Tensor):
        return builder.unknown(call)
    builder.layer("expand", {"input": source, "shape": shape}, call)


@handles("repeat", "tile")
def repeat(builder: Builder, call: Call) -> None:
    """``x.repeat(1, 1, 2, 2)``, ``torch.tile(x, (2, 2))`` (tile pads the counts with leading 1s)."""
    source, counts = call.arguments[0], [int(count) for count in call_sizes(call, "repeats", "dims")]
    if not isinstance(source, torch.Tensor):
        return builder.unknown(call)
    if call.name == "tile" and len(counts) < source.dim():
        counts = [1] * (source.dim() - len(counts)) + counts
    builder.layer("repeat", {"input": source, "counts": counts}, call)


def basic_index(builder: Builder, call: Call) -> None:
    """``x[:, 1:3]`` is narrow, ``x[:, 0]`` narrow and squeeze, ``x[:, None]`` and ``g[..., None, None]``
    unsqueeze: the narrows first, then the squeezes, then the new dims, each a layer."""
    source, index = call.arguments[0], call.arguments[1]
    index = index if isinstance(index, tuple) else (index,)
    taken = sum(1 for item in index if item is not None and item is not Ellipsis)  # dims the index reads
    if sum(1 for item in index if item is Ellipsis) == 1:
        position = index.index(Ellipsis)
        index = index[:position] + (slice(None),) * max(source.dim() - taken, 0) + index[position + 1 :]
    if not all(item is None or isinstance(item, slice) or is_int(item) for item in index) or taken > source.dim():
        builder.fail(
            call, "indexes with something other than start:stop slices, ints, None and ...", FIXES["__getitem__"]
        )
        return
    current, dim, out, squeezed, new = source, 0, 0, [], []
    for item in index:
        if item is None:
            new.append(out)
            out += 1
            continue
        size = source.shape[dim]
        if is_int(item):
            start, stop, step = item % size, item % size + 1, 1  # in range: PyTorch indexed with it
            squeezed.append(dim)
        else:
            start, stop, step = item.indices(size)
            out += 1
        if step != 1:
            current = strided_slice(builder, call, current, dim, start, stop, step)
        elif (start, stop) == (0, size) and not is_int(item):
            pass  # the whole dim
        elif stop > start and (read := _read_at_run_time(builder, current, dim, item)) is not None:
            checked = _checked_from_the_end(builder, call, current, dim, item if is_int(item) else item.start)
            current = _narrowed_at_run_time(builder, call, current, checked, dim, read, start, stop - start)
        else:
            current = builder.part(call, "narrow", current, dim, start, max(stop - start, 0))
        dim += 1
    for dim in reversed(squeezed):
        current = builder.part(call, "squeeze", current, dim)
    for dim in new:
        current = builder.part(call, "unsqueeze", current, dim)
    builder.alias(call, current)


def _read_at_run_time(builder: Builder, current: torch.Tensor, dim: int, item: Any) -> tuple[Any, Any] | None:
    """The spec's start and length of ``current[..., item]`` along ``dim`` where either depends on a size: a
    negative index or bound counts from the dim's end (``h[:, -1]`` starts at ``{like: h, size: 'shape[1] -
    1'}``, ``h[:, -3:]`` too with length 3, ``h[:, :-1]`` and ``h[:, 1:]`` have length ``shape[1] - 1``), an
    index computed from a size (``h[:, h.shape[1] // 2]``) reads it again: the same at any size, in any dim,
    where a number would hold the traced size along a dim the second run may not change (a sequence's length,
    dim 1 of [N, T, C]). None where both are numbers, or where no form holds them (a bound that Python clamped
    to the dim, sizes of several nodes): the numbers then, which the second runs compare."""
    name = builder.node(current)
    if not isinstance(name, str):
        return None
    if is_int(item):
        start, length = _position(builder, current, name, dim, item), (None, sympy.Integer(1))
    else:
        start = _position(builder, current, name, dim, item.start)
        stop = _position(builder, current, name, dim, item.stop, end=True)
        nodes = {start[0], stop[0]} - {None} if start is not None and stop is not None else {"", None}
        length = (next(iter(nodes), None), stop[1] - start[1]) if len(nodes) <= 1 else None
    if start is None or length is None or (start[1].is_Integer and length[1].is_Integer):
        return None
    written = (_written(*start), _written(*length))
    return None if None in written else written


OWN = -1
"""The :class:`sizes.Dim` index of a position's node: ``Dim(OWN, 1)`` is that node's ``shape[1]``."""


def _position(
    builder: Builder, current: torch.Tensor, name: str, dim: int, value: Any, end: bool = False
) -> tuple[str | None, sympy.Expr] | None:
    """An index or slice bound along ``dim`` of node ``name`` (``current``; None: the dim's start, or its end
    with ``end``) as (the node whose sizes it reads, None for a number; its value in that node's sizes,
    ``Dim(OWN, dim)``); None where the traced value lies outside the dim (Python clamped it: the number stays)
    or reads the sizes of several nodes."""
    size = current.shape[dim]
    if value is None:
        return (name, sizes.Dim(OWN, dim)) if end else (None, sympy.Integer(0))
    if not -size <= value <= size:
        return None
    node, expr = None, sympy.Integer(int(value))
    if sizes.has_dims(value):  # h.shape[1] // 2, read from h or from another node
        read = {
            symbol: builder.node(builder.size_tensors[symbol.index])
            if symbol.index < len(builder.size_tensors)
            else None
            for symbol in value.expr.free_symbols
        }
        if len(set(read.values())) != 1 or not isinstance(next(iter(read.values())), str):
            return None
        node = next(iter(read.values()))
        expr = value.expr.xreplace({symbol: sizes.Dim(OWN, symbol.dim) for symbol in read})
    if value < 0:  # counted from the dim's end
        if node not in (None, name):
            return None
        node, expr = name, sizes.Dim(OWN, dim) + expr
    return node, expr


def _written(node: str | None, expr: sympy.Expr) -> Any:
    """``expr`` as the spec writes it: an int, or ``{like: node, size: 'shape[1] - 3'}`` (the constant last);
    None where the spec's size language cannot hold it."""
    if expr.is_Integer:
        return int(expr)
    constant, rest = expr.as_coeff_Add()
    text = sizes.shape_text(rest)
    if text is None or node is None:
        return None
    text += f" - {-constant}" if constant < 0 else f" + {constant}" if constant > 0 else ""
    try:  # written only where the spec reads it back to the same value
        from ..spec_values import size_expression

        if sympy.simplify(size_expression(text, lambda at: sizes.Dim(OWN, at)) - expr) != 0:
            return None
    except ValueError:
        return None
    return {"like": node, "size": text}


def _checked_from_the_end(builder: Builder, call: Call, current: torch.Tensor, dim: int, first: Any) -> str:
    """``h[:, -3:]`` or ``h[:, -3]`` along a dim shorter than 3: Python clamps the slice's start to 0 (the index
    raises), where ``narrow`` would count the negative start from the end once more and take other entries
    without a word (``h[:, -5:-4]`` at 4 tokens: the last one, not none). A ``size_check`` of ``shape[dim] >= 3``
    the narrow reads refuses such a size in one line (dropped where the runs saw the dim fixed, as a branch's).
    The name the narrow reads: the check's, else the node's."""
    name = builder.node(current)
    if first is None or sizes.has_dims(first) or first >= -1:
        return name  # a start of 0 or shape - 1, or one computed from a size (``-(T // 2)``): in range at any size
    needed = -int(first)
    layer = {
        "op": "size_check",
        "in": name,
        "left": {"like": name, "dims": [dim]},
        "right": needed,
        "relation": "ge",
        "holds": True,
        "line": call.where.rsplit("/", 1)[-1],
        "text": f"{name}.shape[{dim}] >= {needed} (counted from its end)",
        size_checks.VALUES: (f"shape[{dim}] >= {needed}", [int(current.shape[dim]), needed]),
    }
    return size_checks.emitted(builder, call, layer)


def _narrowed_at_run_time(
    builder: Builder,
    call: Call,
    current: torch.Tensor,
    name: str,
    dim: int,
    written: tuple[Any, Any],
    start: int,
    length: int,
) -> torch.Tensor:
    """One ``narrow`` layer of ``current`` (read as ``name``) whose start or length (``written``) is read at run
    time, traced as ``start``, ``length``."""
    narrowed = current.narrow(dim, start, length)
    made = Call("narrow", torch.narrow, (current, dim, start, length), {}, narrowed, call.where, call.module, call.leaf)
    layer = {"op": "narrow", "in": name, "dim": dim, "start": written[0], "length": written[1]}
    builder.emit("narrow", layer, made)
    return narrowed


@handles(*PIECES)
def pieces(builder: Builder, call: Call) -> None:
    """``x.chunk(2, dim=1)``, ``torch.split(x, [16, 48], 1)``, ``x.unbind(1)``: one narrow per piece, at the
    offsets of the pieces the call returned (a size that depends on the input's is refused by the second run)."""
    source, result = call.arguments[0] if call.arguments else call.keywords.get("input"), call.result
    if not isinstance(source, torch.Tensor) or not isinstance(result, (tuple, list)) or source.dim() == 0:
        return builder.unknown(call)
    position = 1 if call.name == "unbind" else 2
    dim = call.keywords.get("dim", call.arguments[position] if len(call.arguments) > position else 0)
    dim = dim % source.dim()
    start = 0
    for piece in result:
        length = 1 if call.name == "unbind" else piece.shape[dim]
        if length == 0:
            start += length
            continue  # an empty piece: nothing to differentiate; reading it is reported as an unknown tensor
        if call.name == "unbind":
            builder.part(call, "squeeze", builder.part(call, "narrow", source, dim, start, length), dim, result=piece)
        else:
            builder.part(call, "narrow", source, dim, start, length, result=piece)
        start += length


@handles(*TRANSPOSES, "mT", "T", "t")
def transpose(builder: Builder, call: Call) -> None:
    """``x.transpose(1, 2)``, ``torch.swapaxes``, ``x.mT``, ``x.t()``, ``x.T``: a permute."""
    source = call.arguments[0] if call.arguments else call.keywords.get("input")
    if not isinstance(source, torch.Tensor):
        return builder.unknown(call)
    rank = source.dim()
    if call.name in TRANSPOSES:
        bound = dict(zip(("input", *TRANSPOSES[call.name]), call.arguments)) | call.keywords
        first, second = (bound.get(key) for key in TRANSPOSES[call.name])
    elif call.name == "mT":
        first, second = -2, -1
    elif call.name == "T":
        first, second = None, None
    else:  # t(): a 2-d transpose, nothing for fewer dims
        first, second = (0, 1) if rank == 2 else (0, 0)
    if first is None:
        dims = list(range(rank))[::-1]
    else:
        dims = list(range(rank))
        dims[first % rank], dims[second % rank] = dims[second % rank], dims[first % rank]
    if dims == list(range(rank)):
        return builder.alias(call, source)
    builder.layer("permute", {"input": source, "dims": dims}, call)


@handles("clamp_min", "clamp_min_", "clamp_max", "clamp_max_")
def clamp_one_side(builder: Builder, call: Call) -> None:
    """``x.clamp_min(a)``, ``torch.clamp_max(x, b)``: ``clamp`` with one bound."""
    side = "min" if call.name.startswith("clamp_min") else "max"
    bound = dict(zip(("input", side), call.arguments)) | call.keywords
    op_hooks.clamp(builder, "clamp", bound, call)


@handles("norm")
def norm(builder: Builder, call: Call) -> None:
    """``torch.norm(x, p=2, dim=(1, 2), keepdim=True)``, ``x.norm(dim=-1)``: vector_norm over the dims."""
    bound = dict(zip(("input", "p", "dim", "keepdim"), call.arguments)) | call.keywords
    if bound.get("dtype") is not None:
        return builder.fail(call, "converts the dtype", "leave dtype out")
    dims = bound.get("dim")
    p = bound.get("p", 2)
    builder.layer(
        "vector_norm",
        {
            "x": bound["input"],
            "ord": 2 if p in ("fro", 2.0) else p,
            "dim": None if dims is None else [dims] if isinstance(dims, int) else list(dims),
            "keepdim": bool(bound.get("keepdim", False)),
        },
        call,
    )


@handles("__rsub__")
def reflected_sub(builder: Builder, call: Call) -> None:
    """``c - x`` is ``(-x) + c``: two layers."""
    tensor, number = call.arguments[0], call.arguments[1]
    if not is_number(number):
        return builder.unknown(call)
    negated = Call("neg", torch.neg, (tensor,), {}, torch.neg(tensor), call.where, call.module, call.leaf)
    builder.add(negated)
    builder.layer("add", {"input": negated.result, "other": number}, call)


@handles("var_mean", "std_mean")
def statistic_and_mean(builder: Builder, call: Call) -> None:
    """``torch.var_mean(w, dim, unbiased / correction, keepdim)`` (BiT's weight standardization) and
    ``std_mean``: a var (or std) layer for the first result and a mean layer for the second."""
    bound = dict(zip(("input", "dim", "unbiased", "keepdim"), call.arguments)) | call.keywords
    source, results = bound.pop("input", None), call.result
    if not isinstance(source, torch.Tensor) or not isinstance(results, tuple) or len(results) != 2:
        return builder.unknown(call)
    dims = bound.get("dim")
    dims = None if dims is None else [dims] if isinstance(dims, int) else list(dims)
    keepdim = bool(bound.get("keepdim", False))
    statistic = {"input": source, "dim": dims, "keepdim": keepdim}
    for key in ("unbiased", "correction"):
        if bound.get(key) is not None:
            statistic[key] = bound[key] if key == "unbiased" else int(bound[key])
    builder.layer(call.name.split("_")[0], statistic, dataclasses.replace(call, result=results[0]))
    mean = {"input": source, "dim": dims if dims is not None else list(range(source.dim())), "keepdim": keepdim}
    builder.layer("mean", mean, dataclasses.replace(call, result=results[1]))
