"""A custom ``torch.autograd.Function`` met in the traced forward: is its own backward its forward's derivative?

The trace records the ops its forward runs, and the explicit backward differentiates those ops; autograd
through the model runs the Function's own backward instead. The two agree where that backward is the
derivative of the forward as written (NAFNet's ``LayerNormFunction``, a fused or memory-saving rewrite of
ordinary math), and differ where it is not (a straight-through estimator, a gradient reversal or clipping,
a detached term). :func:`check` compares them in float64, with random arguments of the shapes the trace
met and a random cotangent: the forward's ops run under autograd (``Fn.forward(ctx, ...)``, or
``Fn.forward(...)`` where the Function has ``setup_context``) against ``Fn.apply(...)``, each
differentiated by ``torch.autograd.grad``; and once more, one order up (the derivative of each gradient
along a random direction), which is what second derivatives through the generated module and through
the model would each give. The check runs outside the recording (after the traced run) and leaves the
random number generator as it was.
"""

from __future__ import annotations

import inspect
import math
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from ..spec_functions import NOT_DIFFERENTIABLE, TOLERANCE


@dataclass(eq=False)
class Applied:
    """One ``Fn.apply(...)``, met while its forward ran: the Function, its arguments as called, the user's
    ``file:line`` that called it."""

    function: type
    arguments: tuple
    keywords: dict
    where: str
    no_grad_at: str = ""
    """Where its forward turns gradients off itself (``with torch.no_grad():``): the values computed there
    are constants to autograd's derivative of that forward, and not to the trace, which differentiates
    every op it records; so the check would compare the wrong derivative."""

    @property
    def name(self) -> str:
        return self.function.__name__


@dataclass(frozen=True)
class Checked:
    """What :func:`check` found for one set of argument shapes."""

    first: float | None
    """The largest relative difference between the Function's backward and its forward's derivative, over
    its inputs; None where the check could not run (``refusal`` says why)."""
    second: float | None = None
    """The same one order up: the Function's backward differentiated against its forward's second
    derivative; None where its backward is not differentiable (``once_differentiable``)."""
    refusal: str = ""
    """Why the trace may not go through its forward, in words that follow "whose own backward ..."; ""
    where the backward was checked equal."""
    shapes: str = ""
    """The argument shapes checked, as the refusal names them (``x=[2, 8, 16, 16], weight=[8]``)."""


class NotCheckable(Exception):
    """The check cannot run on this Function: its message says why."""


class _Context:
    """A stand-in for ``ctx`` where the forward runs as plain code under autograd: what it saves is kept,
    what it sets is an attribute; marking outputs dirty or non-differentiable changes what autograd
    differentiates, which the traced ops would not, so it stops the check."""

    def __init__(self, needs: tuple[bool, ...]):
        self.needs_input_grad = needs
        self.saved_tensors: tuple = ()

    def save_for_backward(self, *tensors) -> None:
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass

    def mark_dirty(self, *tensors) -> None:
        raise NotCheckable("its forward changes an input in place (ctx.mark_dirty)")

    def mark_non_differentiable(self, *tensors) -> None:
        raise NotCheckable("its forward marks an output non-differentiable")


_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Function class -> {(argument shapes and other values): Checked}: one check per Function and shapes,
across the trace's runs (the second run at other sizes, the float64 run) and traces."""


def check(applied: Applied) -> Checked:
    """Check ``applied``'s Function at its arguments' shapes (cached per Function and shapes)."""
    names = _argument_names(applied.function, len(applied.arguments))
    try:
        key = tuple(_key(value) for value in applied.arguments) + tuple(
            (name, _key(value)) for name, value in sorted(applied.keywords.items())
        )
        hash(key)
    except TypeError:  # an argument that is no plain value: checked each time
        key = None
    shapes = ", ".join(
        f"{name}={list(value.shape)}"
        for name, value in zip(names, applied.arguments)
        if isinstance(value, torch.Tensor)
    )
    if applied.no_grad_at:
        return Checked(
            None,
            refusal=f"cannot be checked against its forward's derivative: its forward turns "
            f"gradients off at {applied.no_grad_at}",
            shapes=shapes,
        )
    cache = _CHECKED.setdefault(applied.function, {})
    if key is not None and key in cache:
        return cache[key]
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            found = _compare(applied, names)
    except NotCheckable as reason:
        found = Checked(None, refusal=f"cannot be checked against its forward's derivative: {reason}")
    except Exception as error:  # noqa: BLE001 - whatever the user's Function raises: not checked, said so
        text = (str(error).strip().splitlines() or [""])[0][:160]
        found = Checked(
            None,
            refusal=f"cannot be checked against its forward's derivative: the check raised "
            f"{type(error).__name__}{': ' + text if text else ''}",
        )
    found = Checked(found.first, found.second, found.refusal, shapes)
    if key is not None:
        cache[key] = found
    return found


def _key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_key(item) for item in value)
    return (type(value).__name__, value)


def _argument_names(function: type, count: int) -> list[str]:
    """The forward's names for its positional arguments (past ``ctx``), or ``argument 1``, ...."""
    try:
        parameters = [
            parameter.name
            for parameter in inspect.signature(function.forward).parameters.values()
            if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        parameters = []
    if not _has_setup_context(function):
        parameters = parameters[1:]  # ctx
    return [parameters[index] if index < len(parameters) else f"argument {index + 1}" for index in range(count)]


def _has_setup_context(function: type) -> bool:
    return getattr(function, "setup_context", None) is not getattr(torch.autograd.Function, "setup_context", None)


def _compare(applied: Applied, names: list[str]) -> Checked:
    generator = torch.Generator().manual_seed(0)
    positions = []
    for index, value in enumerate(applied.arguments):
        if isinstance(value, torch.Tensor):
            if not value.is_floating_point():
                raise NotCheckable(
                    f"its argument '{names[index]}' is a {str(value.dtype).removeprefix('torch.')} "
                    "tensor, not a float one"
                )
            positions.append(index)
        elif _holds_tensor(value):
            raise NotCheckable(f"its argument '{names[index]}' holds tensors inside a {type(value).__name__}")
    if any(_holds_tensor(value) for value in applied.keywords.values()):
        raise NotCheckable("it takes tensors as keyword arguments")
    if not positions:
        raise NotCheckable("it takes no tensor")
    values = {
        index: torch.randn(applied.arguments[index].shape, generator=generator, dtype=torch.float64).to(
            applied.arguments[index].device
        )
        for index in positions
    }  # on the model's device, which its forward may read

    def leaves() -> list:
        arguments = list(applied.arguments)
        for index in positions:
            arguments[index] = values[index].clone().requires_grad_()
        return arguments

    # the forward as written, differentiated by autograd
    written = leaves()
    torch.default_generator.manual_seed(0)  # a forward drawing random numbers draws the same in both runs
    if _has_setup_context(applied.function):
        outputs = applied.function.forward(*written, **applied.keywords)
    else:
        context = _Context(tuple(index in positions for index in range(len(written))))
        outputs = applied.function.forward(context, *written, **applied.keywords)
    outputs = _tensors_returned(outputs)
    # the Function's own backward
    own = leaves()
    torch.default_generator.manual_seed(0)
    own_outputs = _tensors_returned(applied.function.apply(*own, **applied.keywords))
    if [value.shape for value in own_outputs] != [value.shape for value in outputs]:
        raise NotCheckable("its apply returns other shapes than its forward")
    # a cotangent that requires grad, as it does inside a second derivative (once_differentiable then refuses)
    cotangents = [
        torch.randn(value.shape, generator=generator, dtype=torch.float64).to(value.device).requires_grad_()
        for value in outputs
    ]
    inputs_written = [written[index] for index in positions]
    inputs_own = [own[index] for index in positions]
    expected = _gradients(outputs, inputs_written, cotangents)
    actual = _gradients(own_outputs, inputs_own, cotangents)
    input_names = [names[index] for index in positions]
    first, where = _difference(actual, expected)
    if first is None or not math.isfinite(first):
        raise NotCheckable("its gradients are not finite at random arguments")
    if first > TOLERANCE:
        return Checked(
            first,
            refusal=f"differs from its forward's derivative by {first:.2g} (relative, largest "
            f"entry) in its input '{input_names[where]}'",
        )
    # one order up: the derivative of <gradients, direction> by the inputs
    directions = [
        torch.randn(value.shape, generator=generator, dtype=torch.float64).to(value.device) for value in inputs_written
    ]
    second_expected = _gradients([_inner(expected, directions)], inputs_written, None)
    total = _inner(actual, directions)
    if total.grad_fn is None:  # its backward built no graph: its derivative is zero to autograd
        second_actual = [torch.zeros_like(value) for value in inputs_own]
    else:
        try:  # every path, not only those to the inputs: once_differentiable's error sits on a leaf of its own
            total.backward()
        except RuntimeError:  # once_differentiable: autograd refuses to differentiate it
            return Checked(first, None)
        second_actual = [torch.zeros_like(value) if value.grad is None else value.grad for value in inputs_own]
    second, _ = _difference(second_actual, second_expected)
    return Checked(first, second if second is not None and math.isfinite(second) else math.inf)


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_tensor(item) for item in value.values())
    return False


def _tensors_returned(outputs: Any) -> list[torch.Tensor]:
    returned = list(outputs) if isinstance(outputs, tuple) else [outputs]
    for value in returned:
        if not isinstance(value, torch.Tensor):
            raise NotCheckable(f"its forward returns {type(value).__name__}, not only tensors")
        if not value.is_floating_point():
            raise NotCheckable(f"its forward returns a {str(value.dtype).removeprefix('torch.')} tensor")
    return returned


def _gradients(outputs: list, inputs: list, cotangents: list | None) -> list[torch.Tensor]:
    """``torch.autograd.grad``, with a graph of its own (for the order above), zeros for an input the
    outputs do not reach."""
    reached = [
        (output, cotangent)
        for output, cotangent in zip(outputs, cotangents or [None] * len(outputs))
        if output.requires_grad
    ]
    if not reached:
        return [torch.zeros_like(value) for value in inputs]
    found = torch.autograd.grad(
        [output for output, _ in reached],
        inputs,
        [cotangent for _, cotangent in reached] if cotangents is not None else None,
        allow_unused=True,
        create_graph=True,
    )
    return [torch.zeros_like(value) if gradient is None else gradient for gradient, value in zip(found, inputs)]


def _inner(values: list, directions: list) -> torch.Tensor:
    return sum((value * direction).sum() for value, direction in zip(values, directions))


def _difference(actual: list, expected: list) -> tuple[float | None, int]:
    """The largest relative difference over the inputs, each by its own largest entry, and the input where
    it is; as the tests measure against autograd, a difference within 1e-14 of the largest entry of them
    all is rounding (a gradient near zero by cancellation: LayerNorm's over two channels), by that entry."""
    scales = [max(a.abs().max().item(), e.abs().max().item()) if a.numel() else 0.0 for a, e in zip(actual, expected)]
    overall = max(scales, default=0.0)
    worst, where = 0.0, 0
    for index, (a, e, scale) in enumerate(zip(actual, expected, scales)):
        if a.numel() == 0:
            continue
        difference = (a - e).abs().max().item()
        if not math.isfinite(difference):
            return None, index
        if difference == 0.0:
            continue
        relative = difference / (overall if difference <= 1e-14 * overall else scale)
        if relative > worst:
            worst, where = relative, index
    return worst, where


def checked_functions(checks: dict[str, list[Checked]], calls: list) -> dict:
    """The spec's ``checked_functions`` section (``{}`` where none): each Function whose forward's ops the
    spec's layers hold, with the largest differences its checks found, first and second order."""
    used = {call.undifferentiated.name for call in calls if isinstance(call.undifferentiated, Applied)}
    entries = {}
    for name, found in checks.items():
        if name in used:
            seconds = [each.second for each in found]
            entries[name] = {
                "first_order": _rounded(max(each.first for each in found)),
                "second_order": NOT_DIFFERENTIABLE if None in seconds else _rounded(max(seconds)),
            }
    return {"checked_functions": entries} if entries else {}


def merge_checks(spec: dict, others: list[dict]) -> None:
    """The largest differences of each Function's checks in the traced run and in ``others`` (the second
    run's, at other sizes), into ``spec``'s ``checked_functions``."""
    entries = spec.get("checked_functions", {})
    for other in others:
        for name, entry in other.get("checked_functions", {}).items():
            if name not in entries:
                continue
            mine = entries[name]
            mine["first_order"] = max(mine["first_order"], entry["first_order"])
            if NOT_DIFFERENTIABLE in (mine["second_order"], entry["second_order"]):
                mine["second_order"] = NOT_DIFFERENTIABLE
            else:
                mine["second_order"] = max(mine["second_order"], entry["second_order"])


def _rounded(value: float) -> float:
    """Two significant digits: what the document says, and a short YAML float."""
    return float(f"{value:.2g}") if math.isfinite(value) else value
