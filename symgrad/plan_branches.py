"""One pair of block functions for the instances with and without an optional branch (``block_branches``).

A block with an optional branch is derived twice, with the branch and without it (``plan.plan_block``);
its functions run the statements both derivations share once and each derivation's others under the
branch's switch: ``if downsample:`` the branch's statements, ``else:`` what the instances without it
run instead (:class:`Switch`). Each instance runs exactly its own derivation's statements, in its order:
the two lists are aligned by their printed statements (``difflib``), never reordered. A name one
derivation deletes after a shared statement and the other does not is deleted there under the switch
(``if downsample: del grad_add``): each frees what it frees, where it does. What the forward saves and the backward returns only with the branch is
marked so, the saved entry ``None`` without it; what it saves only without the branch, ``None`` with it.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass

from .algebra import TensorOp
from .errors import SpecError
from .printing import to_code


@dataclass(frozen=True)
class Deleted:
    """Names one side of a :class:`Switch` deletes after a statement both sides run (``del grad_add``)."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class Switch:
    """Statements run only where the block's bool hyper ``hyper`` is true (``taken``) or false
    (``otherwise``, maybe none)."""

    hyper: str
    taken: tuple
    otherwise: tuple


def branch_values(block, layer) -> tuple:
    """The values of ``block``'s branch switches an instance (``layer``) runs with."""
    chosen = {**dict(block.hyper), **{name: value for name, value, _ in layer.hyper}}
    return tuple(bool(chosen[branch.hyper]) for branch in block.optional)


def split_by_branches(variants: list) -> list[list]:
    """``variants`` grouped by their branch switches' values, the group of the first (the body with the
    branch) first; a block with more than one switch in use is refused (one ``if`` per block)."""
    block = variants[0].body.spec
    groups: dict[tuple, list] = {}
    for variant in variants:
        groups.setdefault(branch_values(block, variant.layer), []).append(variant)
    if len(groups) > 2 or (len(groups) == 2 and len(block.optional) != 1):
        layer = variants[-1].layer
        raise SpecError(
            f"block '{block.name}' has instances with {len(groups)} combinations of its optional branches "
            "(one pair of functions writes one branch on or off)",
            layer.location,
            "define a second block for them, or inline their layers",
        )
    return list(groups.values())


def _key(item) -> tuple:
    statement = item.statement
    return (statement.target.name, to_code(statement.value), item.in_place, item.narrowed)


def _reads_entry(item, before) -> bool:
    """Whether ``item`` reads an entry of the tuple ``before`` makes (``t[1]``): printed with it as one
    line (``emit._unpacked``), nothing between them."""
    value = item.statement.value
    return (
        isinstance(value, TensorOp)
        and value.primitive.name == "item"
        and before is not None
        and value.operands[0] == before.statement.target
    )


def merged(hyper: str, taken: list, otherwise: list) -> tuple:
    """``taken`` (the statements with the branch) and ``otherwise`` (without it) as one list: the
    statements both run, in both orders, once, and :class:`Switch` sections for the rest."""
    matcher = difflib.SequenceMatcher(None, [_key(item) for item in otherwise], [_key(item) for item in taken], False)
    result: list = []
    for tag, start, end, taken_start, taken_end in matcher.get_opcodes():
        if tag == "equal":
            anchor, on, off = None, (), ()  # deletions on one side, put after the reads of a tuple made there
            for item, other in zip(taken[taken_start:taken_end], otherwise[start:end]):
                if (on or off) and not _reads_entry(item, anchor):
                    result.append(Switch(hyper, (Deleted(on),) if on else (), (Deleted(off),) if off else ()))
                    on, off = (), ()
                both = tuple(name for name in item.dead if name in other.dead)
                result.append(dataclasses.replace(item, dead=both))
                anchor = item if not _reads_entry(item, anchor) else anchor
                on += tuple(name for name in item.dead if name not in both)
                off += tuple(name for name in other.dead if name not in both)
            if on or off:
                result.append(Switch(hyper, (Deleted(on),) if on else (), (Deleted(off),) if off else ()))
        else:
            result.append(Switch(hyper, tuple(taken[taken_start:taken_end]), tuple(otherwise[start:end])))
    return tuple(result)


def merged_plan(plan_class, with_branch, without, hyper: str):
    """The ``plan.BlockPlan`` of the block's one pair of functions from those of its two bodies. What
    only the body with the branch saves is saved as ``v if downsample else None``; what only the body
    without it saves (a value made before the branch that the instances without it read in its place,
    ``absent: bn1`` multiplied in) as ``v if not downsample else None``, after the others."""
    saved = list(with_branch.saved_names)
    at = saved.index("p") + 1 if "p" in saved else 0
    saved.insert(at, hyper)  # the backward reads the switch
    only = tuple(name for name in saved if name != hyper and name not in without.saved_names)
    unless = tuple(name for name in without.saved_names if name not in saved)
    saved += unless
    kept = {
        **dict(zip(without.saved_names, without.saved_returned)),
        **dict(zip(with_branch.saved_names, with_branch.saved_returned)),
        hyper: hyper,
    }
    returned = dict(without.returns)
    if any(returned.get(key, value) != value for key, value in with_branch.returns):
        raise AssertionError("the two bodies return a gradient under different names")
    return plan_class(
        forward=merged(hyper, list(with_branch.forward), list(without.forward)),
        backward=merged(hyper, list(with_branch.backward), list(without.backward)),
        saved_names=tuple(saved),
        saved_returned=tuple(
            f"{kept[name]} if {hyper} else None"
            if name in only
            else f"{kept[name]} if not {hyper} else None"
            if name in unless
            else kept[name]
            for name in saved
        ),
        returns=tuple(pair for pair in with_branch.returns if pair[0] in returned),
        switch=hyper,
        returns_when=tuple(pair for pair in with_branch.returns if pair[0] not in returned),
    )
