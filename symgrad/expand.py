"""Expand: a parsed spec into the program the rest of the pipeline walks, a top body and a body per block.

A spec's blocks are bodies of their own, as a nested jaxpr is (JAX) or a ``CALL``'s body (tinygrad):
each is graphed, derived, planned and rendered by the same code as the top body, in which each
instance is one call (``symgrad.rules.call.BlockRule``). A spec without blocks is a program of one body.
:func:`flatten` is the one inlining pass (``--flat``): every instance written out as its layers.

The one precondition, decided here and nowhere else: the extras (``hvp``, ``per_sample``) and
``fused=False`` (the readable derivation run as ``gradients``) need the inlined program, whose top
body is the whole network: :func:`expand` inlines every block for them, as for ``--flat``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .block_branches import without_branches
from .blocks import BlockSpec, Hyper
from .errors import SpecError
from .spec import Argument, Spec
from .spec_values import Like, has_like, shifted


@dataclass(frozen=True)
class Expanded:
    """A spec as a program of bodies."""

    spec: Spec
    """The spec the bodies come from (every instance written out where the program is inlined)."""
    flat: Spec
    """Every instance written out: the network the checks, the tests' shapes and ``verify`` read."""
    top: Spec
    """The top body: the spec's own layers, each instance one layer whose arguments bind its block's
    parameters and hypers (the flat spec itself, the same object, where there are no instances)."""
    blocks: dict[str, BlockSpec]
    """Each body besides the top one, by block name (empty: the program is inlined)."""
    calls: dict[str, tuple]
    """Each block's instances (the spec's layers that call it), in order."""
    scopes: dict = dataclasses.field(default_factory=dict)
    """Each instance's parameter mapping as a slice of the ``params`` argument, by its ``out``:
    (prefix, offset), or None: a literal mapping (:func:`_scope_of`)."""
    written_out: bool = False
    """Whether :func:`expand` inlined the spec's instances (``--flat`` or the precondition)."""

    @property
    def inlined(self) -> bool:
        """The program is its top body alone: its derivation is the whole network's, which the
        module's docstring lists and the documents derive step by step."""
        return not self.blocks


def expand(spec: Spec, flat: bool = False, extras: tuple[str, ...] = (), fused: bool = True) -> Expanded:
    """``spec`` as a program of bodies; ``flat``: inlined (one body); ``extras`` or ``fused=False``:
    inlined too (the module's one precondition: they are derived on the whole network)."""
    written_out = bool(spec.blocks) and (flat or bool(extras) or not fused)
    if written_out:
        spec = flatten(spec)
    calls: dict[str, list] = {}
    for layer in spec.layers:
        if layer.block:
            calls.setdefault(layer.block, []).append(layer)
    flat_spec = flatten(spec)
    top = flat_spec if not calls else _top_spec(spec)
    blocks = {name: spec.blocks[name] for name in calls}
    scopes = {layer.out: _scope_of(layer, spec, blocks[layer.block]) for layers in calls.values() for layer in layers}
    return Expanded(
        spec, flat_spec, top, blocks, {name: tuple(layers) for name, layers in calls.items()}, scopes, written_out
    )


def _scope_of(layer, spec: Spec, block: BlockSpec) -> tuple[str, int] | None:
    """The instance's parameter mapping as a slice of the ``params`` argument (``layer1.0``; with an
    offset, children numbered from it), where every parameter it binds is an input traced from
    ``PREFIX.KEY``; None: a literal mapping."""
    sources = {item.name: item.source for item in spec.inputs}
    keys = dict(block.params)
    prefixes = set()
    for param, bound in layer.binding:
        source, key = sources.get(bound), shifted(keys[param], layer.offset)
        if source is None or key is None or not source.endswith("." + key):
            return None
        prefixes.add(source[: -len(key) - 1])
    return (prefixes.pop(), layer.offset) if len(prefixes) == 1 else None


def _top_spec(spec: Spec) -> Spec:
    """The spec's own layers, each instance one layer whose arguments bind the block's parameters."""
    layers = []
    for layer in spec.layers:
        if layer.block:
            arguments = tuple(Argument(param, bound, layer.location) for param, bound in layer.binding)
            arguments += tuple(Argument(name, value, location) for name, value, location in layer.hyper)
            layer = dataclasses.replace(layer, arguments=arguments, implicit_in=False)
        layers.append(layer)
    return dataclasses.replace(spec, layers=tuple(layers), blocks={})


def flatten(spec):
    """The same spec with every block instance written out as its layers: an inner node ``o`` of the
    instance whose ``out`` is ``I`` becomes ``I_o`` (its output ``I`` itself)."""
    from .rules import LAYER_RULES

    if not spec.blocks:
        return spec
    layers = []
    taken = {item.name for item in spec.inputs} | {layer.out for layer in spec.layers}
    for layer in spec.layers:
        if layer.block is None:
            layers.append(dataclasses.replace(layer, index=len(layers)))
            continue
        block = spec.blocks[layer.block]
        renamed = dict(zip(block.inputs, (source for source, _ in layer.sources)))
        renamed.update(layer.binding)
        given = {name: (value, location) for name, value, location in layer.hyper}
        values = {**dict(block.hyper), **{name: value for name, (value, _) in given.items()}}
        for inner in without_branches(block.layers, block.optional, values):  # an optional branch left out
            new = layer.out if inner.out == block.output else f"{layer.out}_{inner.out}"
            if inner.out != block.output and new in taken:
                raise SpecError(
                    f"block instance '{layer.out}' would name its inner node '{inner.out}' '{new}', which "
                    "the spec already uses",
                    layer.out_location,
                    "rename the instance's `out:`",
                )
            taken.add(new)
            rule = LAYER_RULES.get(inner.op)
            operand_keys = {operand.name for operand in rule.operands} if rule else set()
            arguments = tuple(
                _hyper_value(argument, block, given)
                if isinstance(argument.value, Hyper)
                else dataclasses.replace(argument, value=_renamed(argument.value, renamed))
                if argument.name in operand_keys or has_like(argument.value)
                else argument
                for argument in inner.arguments
            )
            sources = tuple((renamed.get(source, source), location) for source, location in inner.sources)
            layers.append(dataclasses.replace(inner, index=len(layers), sources=sources, arguments=arguments, out=new))
            renamed[inner.out] = new
    return dataclasses.replace(spec, layers=tuple(layers), blocks={})


def _hyper_value(argument, block: BlockSpec, given: dict):
    """A :class:`Hyper` argument as the instance's int (located where the instance gives it, so that a
    value the op refuses is reported there), or as the block's default."""
    name = argument.value.name
    if name in given:
        value, location = given[name]
        return dataclasses.replace(argument, value=value, location=location)
    return dataclasses.replace(argument, value=dict(block.hyper)[name])


def _renamed(value, renamed: dict[str, str]):
    if isinstance(value, str):
        return renamed.get(value, value)
    if isinstance(value, Like):
        return dataclasses.replace(value, node=renamed.get(value.node, value.node))
    if isinstance(value, list):
        return [_renamed(item, renamed) for item in value]
    return value
