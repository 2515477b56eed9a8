"""Where a scheduled function frees and reuses memory (``symgrad.schedule``): each statement with the names
deleted right after it, at their last use (:func:`with_deletions`); an op run in place on a dying fresh
buffer (:func:`overwriting`); a branch sum added into its fresh term (:func:`added_in_place`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import sympy

from .algebra import OrderedAdd, TensorOp, op
from .reverse import Statement


@dataclass(frozen=True)
class Scheduled:
    """A statement and the names deleted right after it (their last use: a value is freed there,
    not when the function returns)."""

    statement: Statement
    dead: tuple[str, ...] = ()
    narrowed: tuple[str, ...] = ()
    """Saved names kept from here on as autocast's cast copy (``schedule._autocast_saved``): their last
    forward use, so the wider value is freed where autograd frees it."""
    in_place: bool = False
    """Run as its op's in-place form, overwriting its first operand (``torch.relu_(norm)``):
    :func:`overwriting`."""


def _last_uses(statements: list[Statement], boundary: int, boundary_uses: set[sympy.Symbol]):
    """Each symbol's last reading statement (``boundary - 0.5``: the default cotangent, read between
    the forward and the backward part), and the symbols these statements make."""
    last_use: dict[sympy.Symbol, float] = {}
    for index, statement in enumerate(statements):
        for symbol in statement.value.free_symbols:
            last_use[symbol] = index
    for symbol in boundary_uses:
        last_use[symbol] = max(last_use.get(symbol, -1), boundary - 0.5)
    return last_use, {statement.target for statement in statements}


def _dying(statement: Statement, index: int, last_use, owned, keep) -> list[sympy.Symbol]:
    """What ``statement`` reads for the last time, of what this function made and does not return."""
    return sorted(
        (
            symbol
            for symbol in statement.value.free_symbols
            if symbol in owned and symbol not in keep and last_use.get(symbol) == index
        ),
        key=str,
    )


def _dying_at_boundary(boundary: int, last_use, owned, keep) -> list[str]:
    return sorted(
        symbol.name
        for symbol, index in last_use.items()
        if index == boundary - 0.5 and symbol in owned and symbol not in keep
    )


def with_deletions(
    statements: list[Statement], boundary: int, boundary_uses: set[sympy.Symbol], keep: set[sympy.Symbol]
) -> tuple[list[Scheduled], list[Scheduled], list[str]]:
    """The statements, each with the names to delete right after it (so a value is freed at its
    last use, not when the function returns; autograd keeps what it saved), split at the boundary,
    and the names to delete once the default cotangent is made."""
    last_use, owned = _last_uses(statements, boundary, boundary_uses)
    scheduled = [
        Scheduled(statement, tuple(symbol.name for symbol in _dying(statement, index, last_use, owned, keep)))
        for index, statement in enumerate(statements)
    ]
    return scheduled[:boundary], scheduled[boundary:], _dying_at_boundary(boundary, last_use, owned, keep)


def _is_fresh(value, made: dict) -> bool:
    """Whether ``value`` makes a new tensor, no view of another, that its own autograd backward does
    not read: an op whose output is fresh (``Primitive.fresh``: a convolution, a norm, a kernel's
    gradients), an entry of such an op's tuple (``made``: each symbol's value), a sum of names."""
    if isinstance(value, TensorOp) and value.primitive.name == "item":  # an entry of a fresh tuple
        value = made.get(value.operands[0])
    return (isinstance(value, TensorOp) and value.primitive.fresh) or (
        isinstance(value, sympy.Add) and all(term.is_Symbol for term in value.args)
    )


def _made_and_readers(scheduled: list[Scheduled]) -> tuple[dict, dict[sympy.Symbol, int]]:
    """Each symbol's value in ``scheduled``, and how many of its statements read each symbol."""
    made = {item.statement.target: item.statement.value for item in scheduled}
    readers: dict[sympy.Symbol, int] = {}
    for item in scheduled:
        for symbol in item.statement.value.free_symbols:
            readers[symbol] = readers.get(symbol, 0) + 1
    return made, readers


def overwriting(scheduled: list[Scheduled], only: str | None = None) -> list[Scheduled]:
    """``scheduled`` (a forward) with each statement that may run in place marked so: an op with an
    in-place form (ReLU's ``torch.relu_``, ReLU6's ``inplace=True``) whose operand this statement alone
    reads, dies there and was made here by an op whose output is fresh (:func:`_is_fresh`), so nothing
    else holds or reads that buffer, autograd included: an earlier reader's autograd node may have
    saved it (a convolution saves its input), which ``gradients`` differentiated again would read. One
    buffer fewer per ReLU, as the model's own ``ReLU(inplace=True)``; its backward reads its output,
    which is what stays. ``only``: the statements with that comment alone (a backward's values made
    again, :mod:`symgrad.rematerialize`)."""
    made, readers = _made_and_readers(scheduled)
    result = []
    for item in scheduled:
        value = item.statement.value
        if only is not None and item.statement.comment != only:
            result.append(item)
            continue
        if (
            isinstance(value, TensorOp)
            and value.primitive.inplace is not None
            and value.operands
            and value.operands[0].is_Symbol
            and value.operands[0].name in item.dead
            and readers.get(value.operands[0]) == 1
            and _is_fresh(made.get(value.operands[0]), made)
        ):
            item = dataclasses.replace(item, in_place=True)
        result.append(item)
    return result


def added_in_place(scheduled: list[Scheduled], every_sum: bool = False) -> list[Scheduled]:
    """``scheduled`` with each branch sum (``every_sum``: each sum, in a forward) that has a fresh term
    (``grad_x = local_conv1_0 + grad_add``: a kernel's new output that this sum alone reads and no
    other term reads, or a product computed right there) written as ``_add_into(local_conv1_0,
    grad_add)``, which adds the other terms into that one where no graph is recorded: no new tensor
    per sum, as autograd's engine adds a node's incoming gradients into its buffer, and as a model's
    ``out += identity`` adds. A sum with a negated term stays as it is (``a - b`` is one kernel;
    ``_add_into(a, -b)`` two). A forward's ``a + b`` (:class:`OrderedAdd`) is laid out as ``a`` is: added
    into ``a``, or into ``b`` by ``_add_into_second(a, b)`` where ``b`` has ``a``'s strides at run time."""
    made, readers = _made_and_readers(scheduled)

    def owned_here(term, item, terms) -> bool:
        if any(term in other.free_symbols for other in terms if other is not term):
            return False  # `t + t.permute(1, 0)`: an in-place add would read a view of what it writes
        if term.is_Symbol:  # made here, fresh, read by this sum alone, and not kept
            return term.name in item.dead and readers.get(term) == 1 and term in made and _is_fresh(made[term], made)
        # computed as the call's argument, where nothing else holds it: a product is a new tensor
        return isinstance(term, sympy.Mul) or _is_fresh(term, made)

    result = []
    for item in scheduled:
        value = item.statement.value
        if isinstance(value, OrderedAdd) and every_sum:  # the model's a + b: laid out as a
            owned = [owned_here(term, item, value.args) for term in value.args]
            if any(owned):
                value = op("add_into" if owned[0] else "add_into_second", *value.args)
                item = dataclasses.replace(item, statement=dataclasses.replace(item.statement, value=value))
        elif isinstance(value, sympy.Add) and (every_sum or item.statement.gradient_of is not None):
            terms = value.as_ordered_terms()
            first = next((term for term in terms if owned_here(term, item, terms)), None)
            if first is not None and not any(term.is_number or term.could_extract_minus_sign() for term in terms):
                value = op("add_into", first, *(term for term in terms if term is not first))
                item = dataclasses.replace(item, statement=dataclasses.replace(item.statement, value=value))
        result.append(item)
    return result
