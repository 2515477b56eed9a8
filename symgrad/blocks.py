"""Blocks: a named sub-chain written once and used as a layer, instance by instance.

A spec may define ``blocks:``, each with its own tensor ``inputs``, its ``params`` (a mapping of the
block's name for a parameter to its key: ``conv1_weight: conv1.weight``, or a plain list where the
name is the key), ``layers`` and ``output`` (the last layer's ``out`` unless given)::

    blocks:
      step:
        inputs: [x]
        params: [w]
        layers:
          - {op: conv2d, weight: w, padding: 1, out: response}
          - {op: sub, in: [x, response], out: stepped}
    layers:
      - {block: step, in: x0, params: {w: w1}, out: x1}
      - {block: step, in: x1, prefix: stage2, out: x2}

An instance binds each of the block's params to a spec input: by name (``params: {w: w1}``), or by
``prefix``: the input whose ``source`` is ``PREFIX.KEY`` (how ``symgrad trace`` writes the instances
of a module class), else the input called ``PREFIX_KEY``. The generated module derives each block
once and calls it per instance (``symgrad.plan``); ``symgrad.expand.flatten`` writes the same
network with every instance inlined, which the flat module, the derivation documents' checks and the
extras use.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .block_branches import parse_optional
from .errors import Location, SpecError
from .spec_layer import LayerSpec, parse_layer
from .spec_values import (
    RESERVED_NAMES,
    RESERVED_PREFIXES,
    SOURCE,
    check_name,
    defined,
    did_you_mean,
    identifier_at,
    reject_unknown_keys,
    shifted,
    string_at,
    typed_at,
)
from .spec_yaml import Mapping, Sequence

BLOCK_KEYS = ("inputs", "params", "hyper", "optional", "layers", "output")
INSTANCE_KEYS = ("block", "in", "out", "params", "prefix", "offset", "hyper")


@dataclass(frozen=True, repr=False)
class Hyper:
    """A block layer's argument written as the name of one of the block's ``hyper:`` ints (``stride:
    stride``): each instance gives its own value (``hyper: {stride: 2}``), or takes the default."""

    name: str
    location: Location

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__


class _Hyper:
    """What both hyper kinds share: a number of ``_kind`` to the rules, printed as its name, equal only to
    the same hyper at the same value."""

    name: str
    _kind: type

    def __new__(cls, name: str, value):
        obj = cls._kind.__new__(cls, value)
        obj.name = name
        return obj

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return self.name if not spec else format(self._kind(self), spec)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.name == self.name and self._kind(other) == self._kind(self)

    def __ne__(self, other) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(("hyper", self.name, self._kind(self)))


class HyperInt(_Hyper, int):
    """A block hyperparameter's value while the block is derived once for all its instances: an int
    to the rules (shapes, checks), printed as its name, and equal only to itself, so that a rule
    never takes it for its default (``stride=1`` left out) in one instance and not in another.
    ``symgrad.plan`` derives the block once per distinct set of values its instances give and
    refuses it if the printed code differs: no rule may specialise the code to a value unseen."""

    _kind = int


class HyperFloat(_Hyper, float):
    """A float hyper (a drop probability) while the block is derived, as :class:`HyperInt` is an
    int: a float to the rules, printed as its name, equal only to itself. Only a rule argument
    declared ``Param(..., hyper=True)`` takes one; that rule prints it by name (``bernoulli_(1 - p)``)."""

    _kind = float


HYPER_VALUES = (HyperInt, HyperFloat)


def hyper_value(name: str, value):
    """``value`` as the block derives it: a :class:`HyperFloat` for a float, else a :class:`HyperInt`."""
    return HyperFloat(name, value) if isinstance(value, float) else HyperInt(name, value)


@dataclass(frozen=True)
class BlockSpec:
    name: str
    inputs: tuple[str, ...]
    params: tuple[tuple[str, str], ...]
    """(the block's name for the parameter, its key in the instance's parameter mapping)."""
    layers: tuple  # of spec.LayerSpec
    output: str
    location: Location
    hyper: tuple[tuple[str, int | float], ...] = ()
    """(name, default) of each int or float an instance may set (``hyper: {stride: 1}``,
    ``{drop_path_p: 0.1}``); the layers read it as :class:`Hyper`. A bool switches an optional branch."""
    optional: tuple = ()
    """Its optional branches (``block_branches.Branch``), each switched by a bool hyper."""

    def layers_with(self, values: dict) -> tuple:
        """The block's layers with each :class:`Hyper` argument replaced by ``values[name]`` (an int,
        or a :class:`HyperInt` while the block is derived), the default where ``values`` has none."""
        from .block_branches import without_branches

        chosen = {**dict(self.hyper), **values}
        layers = tuple(
            dataclasses.replace(
                layer,
                arguments=tuple(
                    dataclasses.replace(argument, value=chosen[argument.value.name])
                    if isinstance(argument.value, Hyper)
                    else argument
                    for argument in layer.arguments
                ),
            )
            for layer in self.layers
        )
        return without_branches(layers, self.optional, chosen)

    def operands_with(self, values: dict) -> tuple[str, ...]:
        """:attr:`operands` less the parameters only an optional branch off in ``values`` reads."""
        skipped = self.branch_params(values)
        return tuple(name for name in self.operands if name not in skipped)

    def branch_params(self, values: dict) -> set[str]:
        """The parameters read only by the layers of the optional branches off in ``values``."""
        from .block_branches import read_by

        if not self.optional:
            return set()
        chosen = {**dict(self.hyper), **values}
        off = {node for branch in self.optional if not chosen.get(branch.hyper) for node in branch.nodes}
        read_on = set().union(*(read_by(layer) for layer in self.layers if layer.out not in off))
        read_off = set().union(*(read_by(layer) for layer in self.layers if layer.out in off))
        return {name for name in self.param_names if name in read_off and name not in read_on}

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.params)

    @property
    def operands(self) -> tuple[str, ...]:
        """Everything the block reads from outside: its inputs, then its params."""
        return self.inputs + self.param_names


def parse_blocks(document, reserved: set[str]) -> dict[str, BlockSpec]:
    """The ``blocks:`` section, each block's layers checked in the block's own scope."""
    if "blocks" not in document:
        return {}
    section = typed_at(document, "blocks", Mapping, "a mapping of block names to {inputs, params, layers}")
    blocks: dict[str, BlockSpec] = {}
    for name, body in section.items():
        location = section.key_locations[name]
        check_name(name, location, "block name")
        _check_block_functions(name, location, reserved)
        if name in reserved:
            raise SpecError(
                f"block name '{name}' is already an op or a tensor name",
                location,
                f"rename the block, e.g. '{name}_block'",
            )
        if not isinstance(body, Mapping):
            raise SpecError(
                f"block '{name}' must be a mapping with inputs, params and layers",
                section.value_locations[name],
                "write `NAME: {inputs: [x], params: [w], layers: [...]}`",
            )
        reject_unknown_keys(body, BLOCK_KEYS, f"block '{name}'")
        for key in ("inputs", "layers"):
            if key not in body:
                raise SpecError(f"block '{name}' has no '{key}'", body.location, f"add `{key}:` to the block")
        inputs_seq = typed_at(body, "inputs", Sequence, "a list of tensor names")
        if not inputs_seq:
            raise SpecError(f"block '{name}' has no inputs", body.value_locations["inputs"], "name at least one input")
        inputs = []
        for item, item_location in zip(inputs_seq, inputs_seq.item_locations):
            check_name(item, item_location, "block input")
            _check_block_scope(item, item_location, "block input", name)
            inputs.append(item)
        params = _block_params(body, name)
        hyper = _block_hyper(body, name)
        known = {}
        for item in inputs + [param for param, _ in params] + [item for item, _ in hyper]:
            if item in known:
                raise SpecError(
                    f"block '{name}' names '{item}' twice among its inputs, params and hypers",
                    body.location,
                    "give each input, parameter and hyper its own name",
                )
            known[item] = body.location
        layers_seq = typed_at(body, "layers", Sequence, "a list of layers, each `- {op: ..., ...}`")
        if not layers_seq:
            raise SpecError(f"block '{name}' has no layers", body.value_locations["layers"], "add at least one layer")
        layers, previous = [], inputs[0]
        for index, layer in enumerate(layers_seq):
            item_location = layers_seq.item_locations[index]
            if not isinstance(layer, Mapping):
                raise SpecError(
                    f"layer {index + 1} of block '{name}' must be a mapping like {{op: conv2d, weight: w}}",
                    item_location,
                    "write each layer as `- {op: NAME, ...}`",
                )
            if "block" in layer:
                raise SpecError(
                    f"block '{name}' uses block '{layer['block']}' inside it",
                    item_location,
                    "blocks hold plain layers: inline the inner block's layers here",
                )
            layers.append(_with_hyper(parse_layer(layer, index, previous, known), dict(hyper)))
            _check_block_scope(layers[-1].out, layers[-1].out_location, "output name", name)
            previous = layers[-1].out
            known[previous] = layers[-1].out_location
        used = {
            argument.value.name for layer in layers for argument in layer.arguments if isinstance(argument.value, Hyper)
        }
        optional = parse_optional(body, name, hyper, inputs, layers)
        for item, default in hyper:
            if item not in used and not isinstance(default, bool):
                raise SpecError(
                    f"block '{name}' declares hyper '{item}' but none of its layers reads it",
                    body.value_locations["hyper"],
                    f"write `ARGUMENT: {item}` in a layer, or drop it",
                )
        output = identifier_at(body, "output", kind="block output") if "output" in body else previous
        if output not in {layer.out for layer in layers}:
            raise SpecError(
                f"block '{name}' outputs '{output}', which none of its layers makes",
                body.value_locations.get("output", body.location),
                "name the `out:` of one of its layers",
            )
        blocks[name] = BlockSpec(
            name, tuple(inputs), tuple(params), tuple(layers), output, location, tuple(hyper), optional
        )
    return blocks


def _check_block_scope(name: str, location: Location, kind: str, block: str) -> None:
    """Refuse a name of the block's own (input, parameter, hyper, layer output) that its generated
    functions give a value of their own (``p``, ``save``, ``saved``: read off the template)."""
    from .names import scan_template

    if name in scan_template("module.py.jinja").block:
        raise SpecError(
            f"{kind} '{name}' of block '{block}' is a name the block's generated functions use themselves",
            location,
            f"rename it, e.g. '{name}_in'",
        )


def _check_block_functions(block: str, location: Location, reserved: set[str]) -> None:
    """Refuse a block whose functions (``NAME_forward``, ``NAME_backward``: the template's suffixes)
    would take a name the module or the spec already gives something."""
    from .names import scan_template

    for suffix in scan_template("module.py.jinja").block_functions:
        function = block + suffix
        if function in RESERVED_NAMES or function.startswith(RESERVED_PREFIXES) or function in reserved:
            clash = "a tensor of the spec has that name" if function in reserved else "a name the module uses itself"
            raise SpecError(
                f"block '{block}' would have a function '{function}', {clash}",
                location,
                f"rename the block, e.g. '{block}_block'",
            )


def check_instance_names(blocks: dict[str, BlockSpec], layers, known: dict[str, Location]) -> None:
    """Refuse a spec tensor named as a block's function (``unit_forward``) or as a value the structured
    module names after a block instance (``saved_a``, ``grads_a`` for the instance ``a``)."""
    from .names import instance_prefixes, scan_template

    taken = {
        block + suffix: f"the {suffix[1:]} function of block '{block}'"
        for block in blocks
        for suffix in scan_template("module.py.jinja").block_functions
    }
    taken.update(
        {
            prefix + layer.out: f"a value of block instance '{layer.out}'"
            for layer in layers
            if layer.block
            for prefix in instance_prefixes()
        }
    )
    for name, location in known.items():
        if name in taken:
            raise SpecError(
                f"'{name}' is what the generated module calls {taken[name]}", location, f"rename it, e.g. '{name}_t'"
            )


def _block_hyper(body, block: str) -> list[tuple[str, int]]:
    """``hyper: {stride: 1}``: each name an int argument of the layers may read, with its default."""
    if "hyper" not in body:
        return []
    value, location = body["hyper"], body.value_locations["hyper"]
    if not isinstance(value, Mapping):
        raise SpecError(
            f"hyper of block '{block}' must map names to default ints or floats",
            location,
            "write e.g. `hyper: {stride: 1}`",
        )
    hyper = []
    for name, default in value.items():
        check_name(name, value.key_locations[name], "block hyperparameter")
        _check_block_scope(name, value.key_locations[name], "block hyperparameter", block)
        hyper.append((name, _hyper_number(default, value.value_locations[name], name)))
    return hyper


def _hyper_number(value, location, name: str, declared: int | float | None = None) -> int | float:
    """A hyper's value: an int (``stride``), or a float (a drop probability, which only an argument
    its rule declares ``Param(..., hyper=True)`` reads); an instance's of the kind its block declares."""
    from .rules.base import INT64

    if isinstance(value, bool) and (declared is None or isinstance(declared, bool)):
        return value  # an optional branch's switch (block_branches)
    if isinstance(declared, bool):
        raise SpecError(f"hyper '{name}' must be true or false", location, f"write e.g. `{name}: true`")
    if isinstance(declared, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)  # `p: 0` for a float hyper
    if isinstance(value, float) and not isinstance(declared, int) and math.isfinite(value):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not INT64[0] <= value <= INT64[1]:
        kind = "a float" if isinstance(declared, float) else "an int" if declared is not None else "an int or a float"
        raise SpecError(
            f"hyper '{name}' must be {kind}, not {str(value)[:40]!r}",
            location,
            f"write e.g. `{name}: {0.1 if isinstance(declared, float) else 1}`",
        )
    return value


def _with_hyper(layer, hyper: dict):
    """``layer`` with each non-tensor argument that names one of the block's hypers read as :class:`Hyper`."""
    from .rules import LAYER_RULES

    rule = LAYER_RULES.get(layer.op)
    # a tensor's argument names a node, but a number an op declares a hyper (mul's `other`) a hyper
    operands = {operand.name for operand in rule.operands if not operand.hyper} if rule else set()
    return dataclasses.replace(
        layer,
        arguments=tuple(
            dataclasses.replace(argument, value=Hyper(argument.value, argument.location))
            if isinstance(argument.value, str) and argument.value in hyper and argument.name not in operands
            else argument
            for argument in layer.arguments
        ),
    )


def _block_params(body, block: str) -> list[tuple[str, str]]:
    if "params" not in body:
        return []
    value, location = body["params"], body.value_locations["params"]
    if isinstance(value, Sequence):
        pairs = list(zip(value, value.item_locations))
        keyed = [(name, name, item_location) for name, item_location in pairs]
    elif isinstance(value, Mapping):
        keyed = [(name, key, value.key_locations[name]) for name, key in value.items()]
    else:
        raise SpecError(
            f"params of block '{block}' must be a list of names or a mapping of names to keys",
            location,
            "write `params: [w, b]` or `params: {conv1_weight: conv1.weight}`",
        )
    params = []
    for name, key, item_location in keyed:
        check_name(name, item_location, "block parameter")
        _check_block_scope(name, item_location, "block parameter", block)
        if not (isinstance(key, str) and SOURCE.match(key)):
            raise SpecError(
                f"block '{block}': the key of parameter '{name}' must be a dotted name, not {key!r}",
                item_location,
                "write e.g. `conv1_weight: conv1.weight`",
            )
        params.append((name, key))
    return params


def parse_instance(
    layer, index: int, previous: str, known: dict[str, Location], blocks: dict[str, BlockSpec], inputs
) -> "object":
    """A layer ``{block: NAME, in: ..., params: {...} | prefix: P, out: ...}`` as a LayerSpec whose
    ``block`` names the block and whose ``binding`` maps each block param to a spec input."""
    reject_unknown_keys(layer, INSTANCE_KEYS, f"layer {index + 1} (a block instance)")
    name = string_at(layer, "block")
    where = layer.value_locations["block"]
    if name not in blocks:
        raise SpecError(
            f"unknown block '{name}'" + did_you_mean(name, blocks),
            where,
            "define it under `blocks:` or use one of: " + (", ".join(blocks) or "(none defined)"),
        )
    block = blocks[name]
    if "in" in layer:
        value = layer["in"]
        if isinstance(value, Sequence):
            sources = tuple(
                (defined(item, item_location, known), item_location)
                for item, item_location in zip(value, value.item_locations)
            )
        else:
            sources = (
                (defined(string_at(layer, "in"), layer.value_locations["in"], known), layer.value_locations["in"]),
            )
    else:
        sources = ((previous, layer.location),)
    if len(sources) != len(block.inputs):
        raise SpecError(
            f"block '{name}' takes {len(block.inputs)} input(s) ({', '.join(block.inputs)}) but "
            f"{len(sources)} are given",
            layer.value_locations.get("in", layer.location),
            f"list {len(block.inputs)} name(s) under 'in:'",
        )
    hyper = _instance_hyper(layer, block)
    binding = _binding(layer, block, known, inputs, block.branch_params({key: value for key, value, _ in hyper}))
    out = identifier_at(layer, "out", kind="output name") if "out" in layer else f"{name}_{index + 1}"
    out_location = layer.value_locations.get("out", layer.location)
    if out in known:
        raise SpecError(
            f"layer output name '{out}' is already used (line {known[out].line})",
            out_location,
            "give this instance a unique `out:` name",
        )
    return LayerSpec(
        index=index,
        op=name,
        sources=sources,
        arguments=(),
        out=out,
        location=layer.location,
        op_location=where,
        out_location=out_location,
        implicit_in="in" not in layer,
        block=name,
        binding=binding,
        hyper=hyper,
        offset=_offset(layer, string_at(layer, "prefix") if "prefix" in layer else None),
    )


def _instance_hyper(layer, block: BlockSpec) -> tuple[tuple[str, int, "Location"], ...]:
    """``hyper: {stride: 2}``: the instance's value of each hyper it sets, and where it says so."""
    if "hyper" not in layer:
        return ()
    value = layer["hyper"]
    if not isinstance(value, Mapping):
        raise SpecError(
            "an instance's hyper must map the block's hyper names to ints",
            layer.value_locations["hyper"],
            "write e.g. `hyper: {stride: 2}`",
        )
    declared = dict(block.hyper)
    hyper = []
    for name, given in value.items():
        if name not in declared:
            raise SpecError(
                f"block '{block.name}' has no hyper '{name}'",
                value.key_locations[name],
                f"its hypers are: {', '.join(declared) or '(none)'}",
            )
        hyper.append(
            (name, _hyper_number(given, value.value_locations[name], name, declared[name]), value.value_locations[name])
        )
    return tuple(hyper)


def _binding(layer, block: BlockSpec, known, inputs, skipped: set = frozenset()) -> tuple[tuple[str, str], ...]:
    explicit = {}
    if "params" in layer:
        value = layer["params"]
        if not isinstance(value, Mapping):
            raise SpecError(
                "an instance's params must map the block's parameter names to inputs",
                layer.value_locations["params"],
                "write e.g. `params: {w: w1}`",
            )
        for param, bound in value.items():
            if param not in block.param_names:
                raise SpecError(
                    f"block '{block.name}' has no parameter '{param}'",
                    value.key_locations[param],
                    f"its parameters are: {', '.join(block.param_names) or '(none)'}",
                )
            explicit[param] = defined(string_at(value, param), value.value_locations[param], known)
    prefix = string_at(layer, "prefix") if "prefix" in layer else None
    offset = _offset(layer, prefix)
    by_source = {item.source: item.name for item in inputs if item.source}
    names = {item.name for item in inputs}
    binding = []
    for param, key in block.params:
        if param in skipped and param not in explicit:  # read only by a branch this instance leaves out
            continue
        if param in explicit:
            binding.append((param, explicit[param]))
            continue
        if prefix is not None:
            key = shifted(key, offset)
            if key is None:
                raise SpecError(
                    f"block '{block.name}': with an offset, the key of parameter '{param}' must start with "
                    "a child's index",
                    layer.value_locations["offset"],
                    "drop `offset:`, or key the block's parameters by the children's indices from 0 (`0.weight`)",
                )
            found = by_source.get(f"{prefix}.{key}")
            plain = f"{prefix}_{key.replace('.', '_')}"
            found = found or (plain if plain in names else None)
            if found:
                binding.append((param, found))
                continue
        raise SpecError(
            f"instance of block '{block.name}' does not bind its parameter '{param}'",
            layer.location,
            f"add `params: {{{param}: INPUT}}`"
            + (f" or declare an input with `source: {prefix}.{key}`" if prefix is not None else " or a `prefix:`"),
        )
    return tuple(binding)


def _offset(layer, prefix) -> int:
    """``offset: N``: the instance is a run of the children of ``prefix`` from index N (a Sequential's
    ``features.3`` to ``features.5``), the block's keys numbered from 0."""
    if "offset" not in layer:
        return 0
    value, location = layer["offset"], layer.value_locations["offset"]
    if prefix is None:
        raise SpecError(
            "`offset:` numbers the children of a `prefix:`, and this instance has none",
            location,
            "add `prefix: CONTAINER` or drop `offset:`",
        )
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
        raise SpecError(
            f"offset must be a child's index, an int from 0, not {str(value)[:40]!r}",
            location,
            "write e.g. `offset: 3`",
        )
    return value
