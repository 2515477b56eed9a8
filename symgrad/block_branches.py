"""A block's optional branch: layers some instances run and others do not (``blocks.BlockSpec.optional``).

A model class may hold a submodule that is None in some of its instances, its forward then using another
value instead (torchvision's ``BasicBlock``: ``if self.downsample is not None: identity =
self.downsample(x)``, else ``identity = x``). Its instances are one block whose ``hyper:`` has a bool
(``downsample: false``) and whose ``optional:`` names the branch's layers and the value read instead of
its last one where an instance sets the bool false::

    hyper: {stride: 1, downsample: false}
    optional: {downsample: {nodes: [downsample_0, downsample_1], absent: x}}

An instance without the branch binds none of the parameters only the branch reads. The block is
derived once per value of the bool (``plan.plan_block``) and written as one pair of functions, the
branch under ``if downsample:`` in both (``block_sections``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import SpecError
from .spec_values import Like
from .spec_yaml import Mapping, Sequence


@dataclass(frozen=True)
class Branch:
    """The layers a bool hyper switches on: their outputs in order, and what reads as the last one where
    the hyper is false (a block input or an earlier node)."""

    hyper: str
    nodes: tuple[str, ...]
    absent: str


def renamed(value, names: dict[str, str]):
    """A layer's argument value with each node in ``names`` read as its new name."""
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, Like):
        return dataclasses.replace(value, node=names.get(value.node, value.node))
    if isinstance(value, list):
        return [renamed(item, names) for item in value]
    return value


def without_branches(layers: tuple, branches: tuple[Branch, ...], values: dict) -> tuple:
    """``layers`` with the layers of each branch whose hyper is false in ``values`` left out, and what
    read its last node reading its ``absent`` value instead."""
    off = [branch for branch in branches if not values.get(branch.hyper)]
    if not off:
        return layers
    dropped = {node for branch in off for node in branch.nodes}
    names = {branch.nodes[-1]: branch.absent for branch in off}
    return tuple(
        dataclasses.replace(
            layer,
            sources=tuple((names.get(source, source), location) for source, location in layer.sources),
            arguments=tuple(
                dataclasses.replace(argument, value=renamed(argument.value, names)) for argument in layer.arguments
            ),
        )
        for layer in layers
        if layer.out not in dropped
    )


def read_by(layer) -> set[str]:
    """The names a layer reads: its sources and its arguments' names."""
    names = {source for source, _ in layer.sources}
    for argument in layer.arguments:
        values = argument.value if isinstance(argument.value, list) else [argument.value]
        for value in values:
            if isinstance(value, str):
                names.add(value)
            elif isinstance(value, Like):
                names.add(value.node)
    return names


def parse_optional(body, block: str, hyper: list, inputs: list, layers: list) -> tuple[Branch, ...]:
    """``optional: {HYPER: {nodes: [...], absent: NAME}}``, each checked: HYPER a bool of ``hyper:``, the
    nodes layers of the block that only the branch's last one leaves, ``absent`` made before them."""
    if "optional" not in body:
        if any(isinstance(default, bool) for _, default in hyper):
            raise SpecError(
                f"block '{block}' has a bool hyper but no `optional:` branch it switches",
                body.value_locations["hyper"],
                "write `optional: {HYPER: {nodes: [...], absent: NAME}}`, or make the hyper an int",
            )
        return ()
    section, location = body["optional"], body.value_locations["optional"]
    if not isinstance(section, Mapping):
        raise SpecError(
            f"optional of block '{block}' must map bool hypers to their branches",
            location,
            "write e.g. `optional: {downsample: {nodes: [downsample_0, downsample_1], absent: x}}`",
        )
    bools = {name for name, default in hyper if isinstance(default, bool)}
    order = {layer.out: index for index, layer in enumerate(layers)}
    branches, taken = [], set()
    for name, entry in section.items():
        where = section.value_locations[name]
        if name not in bools:
            raise SpecError(
                f"block '{block}': optional branch '{name}' is not a bool of its hyper",
                where,
                f"add `{name}: false` to `hyper:`",
            )
        nodes = entry.get("nodes") if isinstance(entry, Mapping) else None
        absent = entry.get("absent") if isinstance(entry, Mapping) else None
        if not isinstance(nodes, Sequence) or not nodes or not isinstance(absent, str):
            raise SpecError(
                f"block '{block}': optional branch '{name}' must give its nodes and what is read where absent",
                where,
                "write `{nodes: [NODE, ...], absent: NAME}`",
            )
        nodes = tuple(nodes)
        unknown = [node for node in nodes if node not in order or node in taken]
        first = min((order[node] for node in nodes if node in order), default=0)
        if unknown or (absent not in inputs and order.get(absent, len(layers)) >= first) or absent in nodes:
            raise SpecError(
                f"block '{block}': optional branch '{name}' names {', '.join(unknown) or absent!r} "
                "(its nodes must be the block's own layers, once; absent an input or a node made before them)",
                where,
                "name the branch's layer outputs and a value made before them",
            )
        inner = set(nodes[:-1])
        for layer in layers:
            if layer.out not in nodes and read_by(layer) & inner:
                raise SpecError(
                    f"block '{block}': layer '{layer.out}' reads inside optional branch '{name}'",
                    where,
                    f"only the branch's last node, '{nodes[-1]}', may be read after it",
                )
        taken |= set(nodes)
        branches.append(Branch(name, nodes, absent))
    for name in bools - {branch.hyper for branch in branches}:
        raise SpecError(
            f"block '{block}' has the bool hyper '{name}' but no optional branch for it",
            body.value_locations["hyper"],
            f"add `{name}: {{nodes: [...], absent: NAME}}` under `optional:`",
        )
    return tuple(branches)
