"""How a traced function ends: in a loss (``--loss``, a PyTorch loss call, or a reduction that spells one,
``0.5 * (p - y).pow(2).sum()``), or in the model's outputs (a tensor, a tuple or a dict of tensors); and the
layers that ending depends on."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ..spec_values import check_identifier
from .dataflow import Reduction, report
from .errors import TraceError
from .layers import SpecBuilder
from .size_checks import renamed_nodes

LOSS_NAMES = {
    "mse": "mse_loss",
    "half_sq_error": "half_sq_error",
    "l1": "l1_loss",
    "smooth_l1": "smooth_l1_loss",
    "huber": "huber_loss",
    "cross_entropy": "cross_entropy",
    "nll": "nll_loss",
}
"""``--loss`` values: short names and the spec's loss ops."""


@dataclass(frozen=True)
class LossChoice:
    """A loss put after a model whose forward returns its prediction (``--loss mse --target y``)."""

    op: str
    target: str = "target"
    reduction: str | None = None

    @property
    def classes(self) -> bool:
        return self.op in ("cross_entropy", "nll_loss")


def ends_in_outputs(builder: SpecBuilder, output: Any) -> bool:
    """Whether the traced code returns the model's outputs (a tensor that is no loss, a tuple or a dict
    of tensors), which a spec then ends in, rather than a loss."""
    if isinstance(output, (tuple, list, dict)) or _is_dataclass(output):
        return True
    return isinstance(output, torch.Tensor) and id(output) not in builder.reductions


def _is_dataclass(output: Any) -> bool:
    """A ``@dataclass`` instance of outputs (``Result(logits=..., aux=...)``): its fields, as keys."""
    return dataclasses.is_dataclass(output) and not isinstance(output, type)


def outputs_of(builder: SpecBuilder, output: Any, returned_at: str | None) -> str | list | dict:
    """The spec's ``outputs:`` for what the traced code returns: a node, a list or a mapping of them."""
    where = returned_at or (builder.layer_calls[-1].where if builder.layer_calls else "<traced code>")
    if _is_dataclass(output):  # its fields by name; the bound model makes the class again of them
        output = {field.name: getattr(output, field.name) for field in dataclasses.fields(output)}
    items = (
        output.items()
        if isinstance(output, dict)
        else enumerate(output)
        if isinstance(output, (tuple, list))
        else [(None, output)]
    )
    names, problems = {}, set()
    for key, value in items:
        shown = "the output" if key is None else f"output {key!r}"
        if not isinstance(value, torch.Tensor):
            raise TraceError(
                f"{where}: error: {shown} is {type(value).__name__}, not a tensor (fix: return "
                "tensors, a tuple or a dict of tensors)"
            )
        if isinstance(key, str) and check_identifier(key) is not None and not key.isidentifier():
            raise TraceError(
                f"{where}: error: output key {key!r} is not an identifier (fix: name the outputs "
                "with letters, digits and '_')"
            )
        node = builder.node(value)
        if isinstance(node, frozenset):
            problems |= node
            continue
        if node not in {layer["out"] for layer in builder.layers}:
            raise TraceError(
                f"{where}: error: {shown} is the input or parameter '{node}' itself, which no layer "
                "computes (fix: return what the model computes from its inputs)"
            )
        names[key] = node
    if problems:
        found = [builder.problems[index] for index in sorted(problems) if index >= 0]
        raise TraceError(
            "\n".join(report(found))
            if found
            else f"{where}: error: an output is a tensor that no "
            "traced call made and that is no input (fix: return what the model computes from its inputs)"
        )
    if isinstance(output, dict):
        return dict(names)
    if isinstance(output, (tuple, list)):
        return list(names.values())
    return names[None]


def loss_of(builder: SpecBuilder, output: Any, loss: LossChoice | None, shapes, returned_at: str | None = None) -> dict:
    """The spec's loss entry, or a TraceError listing every problem the loss depends on; ``returned_at``:
    the ``file:line`` of the traced function's ``return``."""
    where = getattr(builder.layer_calls[-1], "where", "<traced code>") if builder.layer_calls else "<traced code>"
    if isinstance(output, (tuple, list)):
        raise TraceError(
            f"{returned_at or where}: error: the traced code returns {len(output)} values, not one loss "
            "(fix: return only the loss, or only the prediction and pass --loss)"
        )
    if not isinstance(output, torch.Tensor):
        raise TraceError(
            f"{returned_at or where}: error: the traced code returns {type(output).__name__}, not a tensor "
            "(fix: return the loss, or the prediction and pass --loss)"
        )
    reasons = builder.poison.get(id(output))
    if reasons:
        raise TraceError("\n".join(report([builder.problems[index] for index in sorted(reasons) if index >= 0])))
    reduction = builder.reductions.get(id(output))
    if loss is not None:
        if reduction is not None:
            raise TraceError(
                f"{reduction.call.where}: error: the traced code already ends in a loss "
                "(fix: drop --loss, or return the prediction)"
            )
        prediction = builder.node(output)
        if isinstance(prediction, frozenset):  # a tensor of the model's own, not computed from the inputs
            raise TraceError(
                f"{returned_at or where}: error: the traced code returns a tensor that no traced call "
                "made and that is no input (fix: return the prediction computed from the inputs)"
            )
        entry = {"op": loss.op, "in": prediction, "target": loss.target}
        if loss.reduction:
            entry["reduction"] = loss.reduction
        return entry
    if reduction is None:
        shape = list(output.shape)
        raise TraceError(
            f"{where}: error: the traced code returns a tensor of shape {shape}, not a loss "
            "(fix: pass --loss mse --target y, or end the code in a loss such as F.mse_loss(p, y))"
        )
    return _reduction_loss(builder, reduction, list(shapes))


def _reduction_loss(builder: SpecBuilder, reduction: Reduction, arguments: list[str]) -> dict:
    """The loss a reduction spells; ``arguments`` (the traced arguments in order) decides which side of
    ``p - y`` is the prediction when both are arguments: the one the function takes first."""
    call = reduction.call
    how = reduction.how
    forms = (
        "F.mse_loss(p, y), F.l1_loss(p, y), F.cross_entropy(p, labels), 0.5 * (p - y).pow(2).sum() "
        "or .sum(dim=[1, 2, 3]) per sample"
    )

    def refuse(what: str) -> TraceError:
        return TraceError(f"{call.where}: error: {what} (fix: end in one of {forms})")

    if how == "none":
        raise refuse("the traced code returns elementwise loss values, not a loss")
    if reduction.loss is not None:
        entry = dict(reduction.loss)
        if reduction.scale == 0.5 and entry["op"] == "mse_loss":
            entry["op"] = "half_sq_error"
        elif reduction.scale != 1:
            raise refuse(f"the loss is scaled by {reduction.scale}, which no spec loss is")
        entry["reduction"] = how
        return entry
    producers = {layer["out"]: layer for layer in builder.layers}
    inner = producers.get(reduction.source)
    if inner is None:
        raise refuse(f"the code reduces '{reduction.source}' directly, with no target to compare it with")
    if inner["op"] == "pow" and inner.get("exponent", 2) == 2:
        kind = {0.5: "half_sq_error", 1: "mse_loss"}.get(reduction.scale)
    elif inner["op"] == "abs":
        kind = {1: "l1_loss"}.get(reduction.scale)
    else:
        raise refuse(f"the code reduces the result of '{inner['op']}', which is no loss symgrad knows")
    difference = producers.get(inner["in"]) if isinstance(inner["in"], str) else None
    if kind is None or difference is None or difference["op"] != "sub" or not isinstance(difference["in"], list):
        raise refuse(
            f"the reduced {inner['op']} is not of a difference prediction - target scaled to a known loss "
            f"(scale {reduction.scale})"
        )
    for layer in (inner, difference):
        readers = [other for other in builder.layers if layer["out"] in _reads(other)]
        if readers == ([inner] if layer is difference else []):
            builder.layers.remove(layer)
    left, right = difference["in"]
    computed = [left in producers, right in producers]
    if computed == [False, True] or (
        computed == [False, False]
        and left in arguments
        and right in arguments
        and arguments.index(right) < arguments.index(left)
    ):
        left, right = right, left  # y - p: the prediction is the computed one, or the first argument
    return {"op": kind, "in": left, "target": right, "reduction": how}


def _reads(layer: dict) -> list[str]:
    names = []
    for key, value in layer.items():
        if key in ("op", "out"):
            continue
        items = value if isinstance(value, list) else [value]  # size: {like: skip}, skip's sizes read at run time
        items = [item.get("like") if isinstance(item, dict) else item for item in items]
        names += [item for item in items if isinstance(item, str)]
    return names


def live_layers(builder: SpecBuilder, loss: dict, outputs=None) -> tuple[list[dict], set[str]]:
    """The layers the loss (or the outputs) depend on, and every name they and the loss read.

    A ``size_check`` is never dead code: a branch on a size the code took after its tensor's last read
    (``h = self.fc(x)``, then ``if t > 1:`` with ``t = x.shape[1]``) first moves to that tensor's first read
    (:func:`_checked_where_read`), so that the check runs whatever reads the branch's result; one whose tensor
    nothing live reads is refused."""
    roots = {loss["in"], loss["target"]} - {None}
    if outputs is not None:
        roots |= set(
            outputs.values() if isinstance(outputs, dict) else [outputs] if isinstance(outputs, str) else outputs
        )
    kept, needed = _live(builder.layers, roots)
    unread = [layer for layer in builder.layers if layer["op"] == "size_check" and layer["out"] not in needed]
    if not unread:
        return kept, needed
    for check in unread:
        _checked_where_read(builder, check)
    kept, needed = _live(builder.layers, roots)
    for check in unread:
        if check["out"] not in needed:
            raise TraceError(
                f"{check['line']}: error: the traced code branches on {check['text']} ({check['holds']} when "
                f"traced), sizes of {check['in']}, which nothing the function returns reads, so the spec cannot "
                "check it at run time (fix: read that size from a tensor the function goes on to use, e.g. its "
                "input)"
            )
    return kept, needed


def _live(layers: list[dict], roots: set[str]) -> tuple[list[dict], set[str]]:
    needed, kept = set(roots), []
    for layer in reversed(layers):
        if layer["out"] in needed:
            kept.append(layer)
            needed.update(_reads(layer))
    return kept[::-1], needed


def _checked_where_read(builder: SpecBuilder, check: dict) -> None:
    """Move ``check`` (a ``size_check`` nothing reads) to just before the first read of its tensor after the
    tensor is made, every read from there on reading the check's output: a check reads no more than its
    tensor's sizes, which are the same there."""
    layers, calls = builder.layers, builder.layer_calls
    at = next(index for index, layer in enumerate(layers) if layer is check)
    node = check["in"]
    made = next((index for index in range(at - 1, -1, -1) if layers[index]["out"] == node), -1)
    readers = [index for index in range(made + 1, at) if node in _reads(layers[index])]
    if not readers:
        return
    layers.insert(readers[0], layers.pop(at))
    calls.insert(readers[0], calls.pop(at))
    for index in readers:
        reader = layers[index + 1]
        reader.update(renamed_nodes(reader, {node: check["out"]}))


def target_input(builder: SpecBuilder, output: torch.Tensor, loss: LossChoice) -> dict:
    if check_identifier(loss.target) is not None or loss.target in builder.used_sources:
        raise TraceError(f"error: --target {loss.target!r} is not a free identifier (fix: choose another name, e.g. y)")
    if loss.classes:
        if output.dim() < 2:
            raise TraceError(
                f"error: {loss.op} needs a prediction [N, C, ...], and the model returns "
                f"{list(output.shape)} (fix: choose another --loss)"
            )
        return {"shape": [output.shape[0], *output.shape[2:]], "dtype": "int64"}
    return {"shape": list(output.shape)}
