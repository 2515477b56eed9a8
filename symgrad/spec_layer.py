"""One entry of a spec's ``layers:`` (or of a block's): the op, the nodes it reads (``in:``), its output name
(``out:``) and its arguments, still unchecked against the op's rule (``graph.py`` checks them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import Location, SpecError
from .spec_values import IDENTIFIER, check_value, defined, identifier_at, parse_likes, reference_at, string_at
from .spec_yaml import Mapping, Sequence

LAYER_STRUCTURE_KEYS = ("op", "in", "out")


@dataclass(frozen=True)
class Argument:
    """One op argument as written in the spec, still unchecked against the op's rule."""

    name: str
    value: Any
    location: Location


@dataclass(frozen=True)
class LayerSpec:
    index: int
    op: str
    sources: tuple[tuple[str, Location], ...]
    """The nodes named by ``in:`` (or the previous node), in order."""
    arguments: tuple[Argument, ...]
    out: str
    location: Location
    op_location: Location
    out_location: Location
    implicit_in: bool = False
    """No ``in:``: ``sources`` is the previous node, which an op that reads no tensor (``full``) ignores."""
    block: str | None = None
    """For a block instance (``{block: NAME, ...}``): the block it uses; ``op`` is its name too."""
    binding: tuple[tuple[str, str], ...] = ()
    """For a block instance: (the block's parameter, the spec input bound to it)."""
    hyper: tuple = ()
    """For a block instance: (hyper name, its int value, where the spec gives it) for each it sets."""
    offset: int = 0
    """For a block instance with ``prefix:``: the index of its first child there (``blocks._offset``)."""


def parse_layer(layer: Mapping, index: int, previous: str, known: dict[str, Location]) -> LayerSpec:
    if "op" not in layer:
        raise SpecError(
            f"layer {index + 1} has no 'op'",
            layer.location,
            "add `op: NAME` with a torch.nn.functional name, e.g. conv2d; `symgrad ops` lists them",
        )
    op = string_at(layer, "op")
    if "in" in layer:
        value = layer["in"]
        if isinstance(value, Sequence):
            if not value:
                raise SpecError("'in' is an empty list", layer.value_locations["in"], "name the input node(s)")
            sources = []
            for item, location in zip(value, value.item_locations):
                if not isinstance(item, str):
                    raise SpecError(
                        f"'in' entry {item!r} is not a node name", location, "name a declared tensor or layer output"
                    )
                sources.append((defined(item, location, known), location))
            sources = tuple(sources)
        else:
            sources = (reference_at(layer, "in", known),)
    else:
        sources = ((previous, layer.location),)
    if "out" in layer:
        out = identifier_at(layer, "out", kind="output name")
        out_location = layer.value_locations["out"]
    else:
        out, out_location = (
            f"{op}_{index + 1}" if IDENTIFIER.match(f"{op}_{index + 1}") else f"layer_{index + 1}",
            layer.location,
        )
    if out in known:
        raise SpecError(
            f"layer output name '{out}' is already used (line {known[out].line})",
            out_location,
            "give this layer a unique `out:` name",
        )
    arguments = tuple(
        Argument(key, parse_likes(value, layer.value_locations[key], key, known), layer.value_locations[key])
        for key, value in layer.items()
        if key not in LAYER_STRUCTURE_KEYS
    )
    for argument in arguments:
        check_value(argument.value, argument.location, f"argument '{argument.name}'")
    return LayerSpec(
        index=index,
        op=op,
        sources=sources,
        arguments=arguments,
        out=out,
        location=layer.location,
        op_location=layer.value_locations["op"],
        out_location=out_location,
        implicit_in="in" not in layer,
    )
