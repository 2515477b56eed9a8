"""How a recorded call finds its handler: one table, filled by decorators in the handler modules.

The walk (``layers.SpecBuilder.dispatch``) runs the named pre-checks in order (``layers.PRE_CHECKS``:
a random mask being drawn, a constant, a no_grad value, a custom Function's forward, a loss's scale,
an int64 index view); a call none of them takes is looked up by its recorded name (the torch function,
tensor method or dunder the recorder saw: ``conv2d``, ``add_``, ``__getitem__``) in one table:

* a rule's ``calls`` (``torch_names.SIGNATURES``): the call's arguments bound by PyTorch's names, then
  the op's hook where one is registered with :func:`op_hook`, else the rule's general layer;
* a loss rule's ``calls`` (``torch_names.LOSSES``): the loss tail;
* names registered with :func:`handles` (views, pieces, pass-throughs, reductions, dropout, einsum).

A name claimed twice, or a hook for an op no rule declares, fails at import. Handlers see the walk
through :class:`Builder`, the few methods they call, and keep state of their own in :meth:`Builder.own`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..rules import LAYER_RULES

if TYPE_CHECKING:
    import torch

    from .recorder import Call


class Builder(Protocol):
    """What a handler may ask of the walk (``layers.SpecBuilder``)."""

    layers: list[dict]
    """The layers so far (read, and the last one amended: ``batch_norm``'s cumulative momentum)."""
    layer_calls: list[Call]
    size_tensors: list[torch.Tensor]
    """The tensors whose sizes the code read, by the index the sizes carry (``sizes.Dim``)."""
    sizes_read: list[torch.Tensor]
    index_views: dict[int, torch.Tensor]
    """id of a reshape of an int64 input -> that input (``indexing.py``)."""
    constants: dict[int, tuple[Call, int]]
    """id of a constant tensor the code made -> the call that made it, and when (``constants.py``)."""
    writes: dict[int, int]
    """Storage of a tensor written in place with a value that is not a constant -> when, last."""
    reductions: dict[int, Any]
    """id of a reduced loss value -> its ``dataflow.Reduction`` (``loss_tail.py``, read by ``losses.py``)."""
    arguments: dict[str, torch.Tensor]
    """The traced function's floating tensor arguments by name."""
    kept: list[Any]
    """Tensors held alive for the walk (an id stays theirs)."""

    def layer(self, op: str, bound: dict, call: Call) -> None:
        """The rule's layer: tensor operands by the rule's names, other arguments if not defaults."""

    def emit(self, op: str, layer: dict, call: Call) -> str:
        """Append ``layer`` as made, named for the call; its name."""

    def fail(self, call: Call, what: str, fix: str, op: str | None = None) -> int:
        """Refuse the call: its result carries the problem (its index) to whatever reads it."""

    def refuse(self, tensor: Any, problem: Any) -> None:
        """``tensor`` carries ``problem`` (a ``dataflow.Problem``) to whatever reads it."""

    def carried(self, tensor: Any) -> frozenset[int] | None:
        """The problems ``tensor`` carries, or None."""

    def taint(self, result: Any, reasons: frozenset[int]) -> None:
        """``result`` carries the problems ``reasons`` (indices of problems found)."""

    def node(self, tensor: torch.Tensor) -> str | frozenset[int]:
        """The node name of ``tensor``, or the problems it carries."""

    def name(self, tensor: torch.Tensor, node: str) -> None:
        """``tensor`` is the value of ``node`` from here on."""

    def named(self, tensor: torch.Tensor) -> str | None:
        """The node ``tensor`` was named, or None."""

    def is_input(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is an argument, a parameter or buffer, or a global the function reads."""

    def operand(self, value: Any, call: Call, reasons: set[int]) -> Any:
        """``value`` as a layer reads it (a node name, a number), or None with its problems in ``reasons``."""

    def alias(self, call: Call, source: torch.Tensor) -> None:
        """The call's result is ``source``'s value."""

    def part(self, call: Call, name: str, tensor: torch.Tensor, *arguments: int, result: Any = None) -> Any:
        """One layer of a call that becomes several: ``torch.<name>(tensor, *arguments)`` walked."""

    def add(self, call: Call) -> None:
        """Walk ``call`` as if recorded."""

    def unknown(self, call: Call) -> None:
        """Refuse the call as no op symgrad differentiates."""

    def out_name(self, op: str, call: Call, named: bool = True) -> str:
        """A fresh node name for the call's layer: the name the model's code gives its result where it has one
        (``named``: the layer computes that result), else from ``op``."""

    def size_of(self, source: torch.Tensor, fits: Callable) -> dict | None:
        """``{like: NODE}`` for the tensor whose sizes the code read most recently and that ``fits``."""

    def module(self, path: str | None) -> Any:
        """The traced model's module at ``path`` (``layer2.0.bn1``), or None."""

    def own(self, owner: str, make: Callable[[], Any]) -> Any:
        """The state ``owner`` (a handler module) keeps for this walk, made by ``make`` on first use."""


HANDLERS: dict[str, Callable] = {}
"""Recorded name -> ``handler(builder, call)``, for calls that are no rule's nor a loss's."""

OP_HOOKS: dict[str, Callable] = {}
"""A rule's op -> ``hook(builder, op, bound, call)``: the ops whose calls need more than binding."""


def _register(table: dict[str, Callable], keys: tuple[str, ...], function: Callable, what: str) -> None:
    for key in keys:
        if key in table:
            raise ImportError(
                f"two trace {what}s for {key}: {_where(table[key])} and {_where(function)} (fix: keep one)"
            )
        table[key] = function


def _where(function: Callable) -> str:
    return f"{function.__module__}.{getattr(function, '__qualname__', function)}"


def handles(*names: str) -> Callable:
    """Register ``handler(builder, call)`` for the recorded calls ``names``."""

    def register(function: Callable) -> Callable:
        _register(HANDLERS, names, function, "handler")
        return function

    return register


def op_hook(*ops: str) -> Callable:
    """Register ``hook(builder, op, bound, call)`` for the rule ops ``ops``."""
    unknown = sorted(set(ops) - set(LAYER_RULES))
    if unknown:
        raise ImportError(
            f"trace hooks for ops that no rule declares: {', '.join(unknown)} (fix: key each hook by its rule's op)"
        )

    def register(function: Callable) -> Callable:
        _register(OP_HOOKS, ops, function, "hook")
        return function

    return register


def table(rule_call: Callable, loss_call: Callable) -> dict[str, Callable]:
    """The one table: each rule's and loss's ``calls``, then the registered handlers; a name claimed by
    two of them fails."""
    from .torch_names import LOSSES, SIGNATURES

    found: dict[str, Callable] = {}
    _register(found, tuple(SIGNATURES), rule_call, "handler")
    _register(found, tuple(LOSSES), loss_call, "handler")
    for name, handler in HANDLERS.items():
        _register(found, (name,), handler, "handler")
    return found


def route(name: str) -> tuple[str, str | None, Callable | None]:
    """How a call named ``name`` is handled after the pre-checks: (kind, rule op, handler or hook), kind
    one of ``rule``, ``loss``, ``call``, ``unknown``."""
    from .torch_names import LOSSES, SIGNATURES

    if name in SIGNATURES:
        op = SIGNATURES[name][0]
        return "rule", op, OP_HOOKS.get(op)
    if name in LOSSES:
        return "loss", None, None
    if name in HANDLERS:
        return "call", None, HANDLERS[name]
    return "unknown", None, None
