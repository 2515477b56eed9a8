"""The loss tail of a traced function: reductions (``sum``, ``mean``), PyTorch loss calls, their scaling
(``0.5 * loss``), and ``nll_loss(log_softmax(z, dim=1), labels)`` read as ``cross_entropy(z, labels)``.

A reduction inside the network (a hand-written LayerNorm's channel mean) is an ordinary layer; one the
loss depends on is noted as a ``Reduction``, which the end of the trace turns into the spec's loss.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .dataflow import Reduction, flat_arguments, is_number
from .dispatch import handles, op_hook
from .recorder import Call
from .torch_names import LOSSES, SIGNATURES

if TYPE_CHECKING:
    from .dispatch import Builder


LOSS_DEFAULTS = {"size_average": None, "reduce": None, "weight": None, "ignore_index": -100, "label_smoothing": 0.0}


@handles("sum", "mean")
def reduce(builder: Builder, call: Call) -> None:
    source = call.arguments[0]
    dims = call.keywords.get("dim", call.arguments[1] if len(call.arguments) > 1 else None)
    keepdim = call.keywords.get("keepdim", call.arguments[2] if len(call.arguments) > 2 else False)
    rank = source.dim()
    spatial = list(range(2, rank))
    if (
        call.name == "mean"
        and dims is not None
        and 3 <= rank <= 5
        and id(source) not in builder.reductions
        and sorted(d % rank for d in ([dims] if isinstance(dims, int) else dims)) == spatial
    ):
        return global_average(builder, call, source, rank, bool(keepdim))
    if dims is None or (isinstance(dims, (tuple, list)) and len(dims) == 0):
        how = call.name
    else:
        dims = sorted(d % rank for d in ([dims] if isinstance(dims, int) else dims))
        how = "per_sample" if call.name == "sum" and dims == list(range(1, rank)) and not keepdim else None
    if how is None:  # a reduction inside the network (a hand-written LayerNorm's channel mean): a layer
        builder.layer(call.name, {"input": source, "dim": dims, "keepdim": bool(keepdim)}, call)
        return
    inner = builder.reductions.get(id(source))
    if inner is not None:  # F.mse_loss(..., reduction='none').sum()
        if inner.how != "none":
            builder.fail(call, "reduces a loss twice", "reduce once")
            return
        builder.reductions[id(call.result)] = Reduction(how, loss=inner.loss, call=call)
        builder.kept.append(call.result)
        return
    reasons: set[int] = set()
    found = builder.operand(source, call, reasons)
    if reasons:
        builder.taint(call.result, frozenset(reasons))
        return
    builder.reductions[id(call.result)] = Reduction(how, source=found, call=call)
    builder.kept.append(call.result)


ELEMENTWISE = frozenset({"add", "sub", "mul", "div"})
"""The calls (by ``SIGNATURES`` kind) that may read a whole-value reduction made a layer: broadcasting
elementwise, they read its 0-dim value as the model's code does."""


def read_on_problem(builder: Builder, value: torch.Tensor, reader: Call) -> tuple[str, str]:
    """What a refused read of a noted reduction says, and its fix: a sum or mean the network reads
    (``torch.stack``, ``unsqueeze``, a scale, a ``dtype``: :func:`reduction_layers` makes no layers of it), or
    a loss value computed with (a hand-written loss plus a penalty, a loss call's value)."""
    reduction = builder.reductions.get(id(value))
    network = isinstance(reader.result, torch.Tensor) and reader.result.dim() >= 1
    if reduction is not None and reduction.loss is None and network:
        return (
            "reads a sum or mean of a whole value, which only an unscaled elementwise add, sub, mul or div "
            "may read (a spec's tensors have 1 to 8 dims)",
            "scale after the product ((x * w.sum()) / 21), keep its dims where another op reads it "
            "(w.sum(dim=None, keepdim=True)), cast before reducing rather than dtype=",
        )
    return (
        "computes with a loss value; a spec has one loss, reduced once",
        "return one loss (F.mse_loss(...), 0.5 * (p - y).pow(2).sum(), ...)",
    )


def reduction_layers(builder: Builder, value: torch.Tensor, reader: Call) -> str | None:
    """The node of a reduction the network reads on (``conv(h) * conv.weight.sum()``, ``h - h.mean()``,
    ``h * h.sum(dim=(1, 2, 3)).reshape(-1, 1, 1, 1)``), which the tracer noted as maybe the loss: a
    ``sum``/``mean`` layer of the value it reduced when it was taken (not one written in place since), over
    the dims it reduced; a reduction of every dim to a 0-dim value kept as size 1 and reshaped to ``()``, 0-dim
    as the model's value is (not [1]: under autocast a bfloat16 [N, C] plus a float32 [1] is float32, plus a
    0-dim float32 bfloat16), only where ``reader`` is an elementwise add/sub/mul/div whose result has a dim
    (another reader is refused as before). None, refused as a loss value as before: a loss call's
    value, a scaled reduction (``h.sum() / 3 / 7`` is noted as one scale: float32 rounds the two divisions
    otherwise), one with a ``dtype``, a 0-dim one read otherwise (``torch.stack``, ``unsqueeze``, a sum of two)."""
    reduction = builder.reductions.get(id(value))
    if reduction is None or reduction.loss is not None or reduction.call is None or reduction.scale != 1.0:
        return None
    call = reduction.call
    zero_dim = isinstance(call.result, torch.Tensor) and call.result.dim() == 0
    read_elementwise = (
        SIGNATURES.get(reader.name, ("",))[0] in ELEMENTWISE
        and isinstance(reader.result, torch.Tensor)
        and reader.result.dim() >= 1
    )
    if call.keywords.get("dtype") is not None or (zero_dim and not read_elementwise):
        return None
    source = call.arguments[0]
    every = reduction.how in ("sum", "mean")
    dims = list(range(source.dim())) if every else list(range(1, source.dim()))  # "per_sample": all but the batch
    how = "mean" if reduction.how == "mean" else "sum"
    kept = every  # a whole-value reduction's dims kept as size 1 (its keepdim=True result as it is)
    reduced = call.result.reshape([1] * source.dim()) if kept else call.result  # its value then, not source's now
    made = Call(
        how, getattr(torch, how), (source,), {"dim": dims, "keepdim": kept}, reduced, call.where, call.module, call.leaf
    )
    layer = {"op": how, "in": reduction.source, "dim": dims, **({"keepdim": True} if kept else {})}
    name = builder.emit(how, layer, made)  # the node reduced when the reduction was taken
    if zero_dim:
        flat = reduced.reshape(())
        builder.add(Call("reshape", torch.reshape, (reduced, ()), {}, flat, call.where, call.module, call.leaf))
        name = builder.named(flat)
        if name is None:  # refused: the layer's problem is reported with it
            return None
    builder.names[id(value)] = name  # still noted as a reduction: the loss where the function returns it
    return name


@op_hook("log_softmax")
def log_softmax(builder: Builder, op: str, bound: dict, call: Call) -> None:
    """A layer; noted too, because ``nll_loss(log_softmax(z, dim=1), labels)`` is
    ``cross_entropy(z, labels)``, which ``loss_call`` makes of it."""
    source, dim = bound.get("input"), bound.get("dim")
    builder.layer(op, bound, call)
    if isinstance(source, torch.Tensor) and isinstance(dim, int) and dim % source.dim() == 1:
        _log_probabilities(builder)[id(call.result)] = source


def global_average(builder: Builder, call: Call, source: torch.Tensor, rank: int, keepdim: bool) -> None:
    """``x.mean(dim=(2, 3))``, global average pooling, is adaptive_avg_pool2d to 1 (then flatten)."""
    pooled = torch.flatten(source, 2).mean(dim=2).reshape(*source.shape[:2], *([1] * (rank - 2)))
    pool = Call(
        f"adaptive_avg_pool{rank - 2}d",
        call.function,
        (source, 1),
        {},
        pooled if not keepdim else call.result,
        call.where,
        call.module,
        call.leaf,
    )
    builder.add(pool)
    if not keepdim:
        builder.layer("flatten", {"input": pool.result, "start_dim": 1}, call)


def loss_call(builder: Builder, op: str, call: Call) -> None:
    bound = dict(zip(LOSSES[op], call.arguments)) | call.keywords
    reasons: set[int] = set()
    if op == "nll_loss" and id(bound["input"]) in _log_probabilities(builder):
        drop_unread(builder, builder.named(bound["input"]))  # the log_softmax layer, now inside the loss
        op, bound["input"] = "cross_entropy", _log_probabilities(builder)[id(bound["input"])]
    prediction = builder.operand(bound.pop("input"), call, reasons)
    target = builder.operand(bound.pop("target"), call, reasons)
    if reasons:
        builder.taint(call.result, frozenset(reasons))
        return
    how = bound.pop("reduction", "mean")
    for key, default in LOSS_DEFAULTS.items():
        value = bound.pop(key, default)
        if value is not None and value != default:
            builder.fail(call, f"argument {key}={value!r} is not supported", "leave it at its default")
            return
    loss = {"op": op, "in": prediction, "target": target, **{k: float(v) for k, v in bound.items() if v != 1.0}}
    builder.reductions[id(call.result)] = Reduction(how, loss=loss, call=call)
    builder.kept.append(call.result)


def drop_unread(builder: Builder, name: str | None) -> None:
    """Remove the layer that makes ``name`` if no later layer reads it."""
    index = next((i for i, layer in enumerate(builder.layers) if layer["out"] == name), None)
    if index is None or any(name in flat_arguments(list(layer.values()), {}) for layer in builder.layers[index + 1 :]):
        return
    del builder.layers[index], builder.layer_calls[index]


def scale_reduction(builder: Builder, call: Call) -> bool:
    """``0.5 * loss``, ``loss / 2``: scale a reduction; False when the call is not that."""
    kind = SIGNATURES.get(call.name, ("",))[0]
    if kind not in ("mul", "div") or len(call.arguments) != 2 or call.keywords:
        return False
    tensor, number = call.arguments
    if kind == "mul" and not isinstance(tensor, torch.Tensor):
        tensor, number = number, tensor  # torch.mul(0.5, loss)
    if not (isinstance(tensor, torch.Tensor) and id(tensor) in builder.reductions and is_number(number)):
        return False  # a reflected call (2 * loss) also arrives as (loss, 2)
    inner = builder.reductions[id(tensor)]
    scale = inner.scale * number if kind == "mul" else inner.scale / number
    builder.reductions[id(call.result)] = Reduction(inner.how, inner.source, inner.loss, scale, inner.call)
    builder.kept.append(call.result)
    return True


def _log_probabilities(builder: Builder) -> dict[int, torch.Tensor]:
    """This walk's ``log_softmax(z, dim=1)`` results by id -> z (an ``nll_loss`` of one is ``cross_entropy``)."""
    return builder.own("loss_tail", dict)
