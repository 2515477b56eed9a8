"""The graphs of a program's bodies (``expand``): a block's own (:func:`block_graph`, once per distinct set of
hyper values and size-1 axes among its instances: :func:`block_variants`), and the top body's, whose
instances are calls (``rules.call``) and whose runs of instances are chains (:func:`top_graph`). Each is
built by ``graph.build_graph``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .graph import Graph, build_graph
from .rules.call import BlockOutput, BlockRule, ChainLink, ChainRule, DerivedBlock
from .spec import Argument, LossSpec, Spec
from .spec_values import has_like

if TYPE_CHECKING:
    from .blocks import BlockSpec
    from .expand import Expanded


def top_graph(expanded: Expanded, derived: dict[str, DerivedBlock], flat_graph: Graph) -> tuple[Graph, list]:
    """The top body's graph: each instance one :class:`BlockRule` node calling its block's
    ``derived`` body (a run of them one :class:`ChainRule`: returned too); an inlined program's top
    body is its flat spec, whose graph (``flat_graph``) is built once."""
    rules = {name: BlockRule(block, block_graph) for name, block in derived.items()}
    top, chains = _chained(expanded, rules)
    if top is expanded.flat:
        return flat_graph, chains
    graph = build_graph(top, extra_rules={**rules, **{chain.op: chain for chain in chains}})
    for layer in top.layers:
        if layer.block:
            graph.nodes[layer.out].params["_scope"] = expanded.scopes[layer.out]
    return graph, chains


CHAIN_LENGTH = 3
"""The fewest instances a chain runs: two calls read better written out than as a table and a loop."""


def _chained(expanded: Expanded, rules: dict[str, BlockRule]) -> tuple[Spec, list[ChainRule]]:
    """The top body with each run of at least :data:`CHAIN_LENGTH` instances that feed only the next (one
    input each, parameters bound by ``prefix:`` and to no other layer) as one :class:`ChainRule` layer,
    named as its last instance's output, so that nothing downstream changes."""
    top, spec, blocks = expanded.top, expanded.spec, expanded.blocks
    sources = {item.name: item.source for item in spec.inputs if item.source}
    readers: dict[str, int] = {}
    for layer in top.layers:
        for name in [source for source, _ in layer.sources] + [
            value for argument in layer.arguments for value in _names(argument.value)
        ]:
            readers[name] = readers.get(name, 0) + 1
    for name in top.outputs.nodes if top.outputs is not None else (top.loss.source[0], top.loss.target[0]):
        readers[name] = readers.get(name, 0) + 1
    bound_count: dict[str, int] = {}
    for layer in top.layers:
        for _, bound in layer.binding if layer.block else ():
            bound_count[bound] = bound_count.get(bound, 0) + 1

    def linkable(layer) -> bool:
        return (
            layer.block is not None
            and len(blocks[layer.block].inputs) == 1
            and expanded.scopes[layer.out] is not None
            and all(bound_count[bound] == 1 and bound in sources for _, bound in layer.binding)
            and not any(has_like(argument.value) for argument in layer.arguments)
        )

    runs, current = [], []
    for layer in top.layers:
        if linkable(layer) and current and layer.sources[0][0] == current[-1].out and readers[current[-1].out] == 1:
            current.append(layer)
            continue
        runs.append(current)
        current = [layer] if linkable(layer) else []
    runs.append(current)
    # a table never takes a name the spec gives a tensor or a block, in either case, nor one the module's own
    taken = {
        name.lower()
        for name in [
            *(item.name for item in spec.inputs),
            *(layer.out for layer in spec.layers),
            *blocks,
            *MODULE_NAMES,
        ]
    }
    chains, replaced = [], {}
    for run in runs:
        if len(run) < CHAIN_LENGTH:
            continue
        table = _table_name(run, expanded, taken)
        links = tuple(
            ChainLink(
                rules[layer.block],
                *expanded.scopes[layer.out],
                tuple(
                    (name, value) for name, value, _ in layer.hyper if value != dict(blocks[layer.block].hyper)[name]
                ),
                layer.binding,
            )
            for layer in run
        )
        chain = ChainRule(table, links, sources)
        chains.append(chain)
        arguments = tuple(Argument(bound, bound, layer.location) for layer in run for _, bound in layer.binding)
        replaced[run[0].out] = dataclasses.replace(
            run[-1], op=chain.op, block=None, sources=run[0].sources, arguments=arguments, binding=(), hyper=()
        )
        for layer in run[1:]:
            replaced[layer.out] = None
    if not replaced:
        return top, chains
    layers = tuple(replaced.get(layer.out, layer) for layer in top.layers if replaced.get(layer.out, layer) is not None)
    return dataclasses.replace(top, layers=layers), chains


def _names(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [name for item in value for name in _names(item)]
    node = getattr(value, "node", None)  # {like: NODE}
    return [node] if isinstance(node, str) else []


MODULE_NAMES = frozenset(
    {
        "BLOCKS",
        "CHANNELS_LAST",
        "CHANNELS_LAST_FROM",
        "CLASSES",
        "DROP_IN_REFERENCE",
        "EVAL_MODULE",
        "F",
        "FINGERPRINT",
        "FINITE_DIFFERENCES_FAIL",
        "FINITE_DIFFERENCES_UP_TO",
        "FROZEN",
        "GUARDS",
        "INPUTS",
        "MOMENTA",
        "MOVED",
        "NAMES",
        "OUTPUTS",
        "OUTPUTS_KIND",
        "PARAMS",
        "REACHED_BY",
        "REFERENCE_SUMS",
        "RENAMED",
        "ROLES",
        "ROWS",
        "RUNNING",
        "SHARED",
        "SMALL_INPUTS",
        "SMALL_SHAPES",
        "SPEC_ENTRIES",
        "SPEC_SHAPES",
        "WRT",
        "ZERO_BY_STRUCTURE",
    }
)
"""The upper-case names a generated module or its test file defines or imports for itself (``F``:
``torch.nn.functional``): a chain's table, named after a submodule (``self.blocks``: BLOCKS; ``self.f``:
F), takes another (BLOCKS_2)."""


def _table_name(run, expanded: Expanded, taken: set[str]) -> str:
    """The chain's table, after what its instances' prefixes share (``features.2`` to ``features.17``:
    FEATURES), else after its first and last (LAYER1_0_TO_LAYER4_2)."""
    import os
    import re

    prefixes = [expanded.scopes[layer.out][0] for layer in run]
    common = os.path.commonprefix([prefix + "." for prefix in prefixes])
    common = common[: common.rfind(".")] if "." in common else ""
    if common and all(prefix.startswith(common + ".") for prefix in prefixes):
        base = re.sub(r"[^A-Za-z0-9]", "_", common).upper()
    else:
        base = "_TO_".join(re.sub(r"[^A-Za-z0-9]", "_", prefix).upper() for prefix in (prefixes[0], prefixes[-1]))
    name, number = base, 2
    while name.lower() in taken:
        name, number = f"{base}_{number}", number + 1
    taken.add(name.lower())
    return name


@dataclass(frozen=True)
class Variant:
    """One distinct set of hyper values and size-1 axes among a block's instances, and its body."""

    layer: Any
    """Its first instance."""
    signature: tuple
    """What its derivation may depend on besides sizes: each tensor's rank and size-1 axes."""
    body: DerivedBlock


def block_variants(expanded: Expanded, flat_graph: Graph) -> dict[str, list[Variant]]:
    """Each block's body graphed once per distinct set of hyper values and size-1 axes among its
    instances (a rule may derive otherwise where a size is 1, a broadcast, an expand, or for another
    value), its hypers as :class:`~symgrad.blocks.HyperInt` (or ``HyperFloat``), its ``wrt`` the operands some instance
    needs the gradient of and that reach its output; the first variant's body is the one every
    instance calls, where the others print the same code (``plan.plan_block`` checks it)."""
    from .blocks import hyper_value

    needs_gradient = flat_graph.depends_on_wrt()
    found = {}
    for name, layers in expanded.calls.items():
        block = expanded.blocks[name]
        wanted, variants = set(), {}
        for layer in layers:
            bound = _bound(block, layer)
            wanted |= {operand for operand, node in bound.items() if node in needs_gradient}
            chosen = {**dict(block.hyper), **{key: value for key, value, _ in layer.hyper}}
            values = tuple(sorted(chosen.items()))
            names = [bound[operand] for operand in block.operands_with(chosen)] + [
                layer.out if inner.out == block.output else f"{layer.out}_{inner.out}"
                for inner in block.layers_with(chosen)
            ]
            signature = tuple(
                (len(shape), tuple(axis for axis, size in enumerate(shape) if size == 1))
                for shape in (flat_graph.nodes[node].shape for node in names)
            )
            variants.setdefault((values, signature), layer)
        found[name] = []
        for (values, signature), layer in variants.items():
            bound = _bound(block, layer)
            graph = block_graph(
                block,
                {operand: flat_graph.nodes[node].shape for operand, node in bound.items()},
                flat_graph.spec,
                {key: value if isinstance(value, bool) else hyper_value(key, value) for key, value in values},
                {operand: flat_graph.nodes[node].dtype for operand, node in bound.items()},
            )
            feeds_output = {"loss"}
            for node in reversed(list(graph.nodes.values())):
                if node.name in feeds_output:
                    feeds_output.update(node.operands.values())
            graph.wrt = tuple(operand for operand in block.operands if operand in wanted and operand in feeds_output)
            found[name].append(Variant(layer, signature, DerivedBlock(block, graph, graph.wrt)))
        # the body with the most optional branches in it first: the one the top body's instances call
        if block.optional:
            found[name].sort(key=lambda variant: -len(variant.body.graph.nodes))
    return found


def _bound(block: BlockSpec, layer) -> dict[str, str]:
    """Each of the block's operands as the instance binds it: its inputs' sources, its parameters."""
    return {**dict(zip(block.inputs, (source for source, _ in layer.sources))), **dict(layer.binding)}


def block_graph(
    block: BlockSpec, shapes: dict, spec: Spec, values: dict | None = None, dtypes: dict | None = None
) -> Graph:
    """The block as a graph of its own, its operands as inputs, ending in :class:`BlockOutput`;
    ``values``: its hypers' (the defaults where none); ``dtypes``: its operands' (an int64 buffer, a relative
    position index, stays int64 inside the block)."""
    from .spec import InputSpec

    location = block.location
    if dtypes is None:  # the block's own graph: its operands as it declares them
        dtypes = {entry.name: entry.dtype for entry in spec.inputs} if spec.name == block.name else {}
    inputs = tuple(
        InputSpec(name, tuple(shapes[name]), location, dtypes.get(name, "float"))
        for name in block.operands_with(values or {})
    )
    loss = LossSpec("half_sq_error", (block.output, location), (block.output, location), None, location, location)
    sub = Spec(
        name=block.name,
        inputs=inputs,
        layers=block.layers_with(values or {}),
        loss=loss,
        wrt=(),
        file=spec.file,
        text=spec.text,
    )
    graph = build_graph(sub)
    output = graph.nodes["loss"]
    graph.nodes["loss"] = dataclasses.replace(
        output,
        rule=BlockOutput(),
        operands={"input": block.output},
        params={"reduction": "none"},
        shape=graph.nodes[block.output].shape,
    )
    return graph


@dataclass(frozen=True)
class InstanceSizes:
    """A block body's node shapes at its largest instance, for the choices that read traced sizes
    (``rematerialize.costly_made_again``): one choice for every instance (each prints the same body)."""

    nodes: dict[str, Any]
    """Each inner node by name, with ``shape``: its largest shape among the instances that have it."""
    largest: int | None
    """The elements of the network's largest layer output (the flat graph's), which a step's peak sits beside."""


def _elements(shape) -> int | None:
    return math.prod(shape) if shape and all(isinstance(size, int) for size in shape) else None


def top_sizes(graph: Graph, flat_graph: Graph) -> InstanceSizes:
    """The top body's nodes of a program with blocks beside the network's largest layer output, which its
    instances' calls hide (the stem's SiLU output is then judged as the flat module judges it)."""
    return InstanceSizes(dict(graph.nodes), _largest_layer(flat_graph))


def _largest_layer(flat_graph: Graph) -> int | None:
    layers = (_elements(node.shape) for node in flat_graph.nodes.values() if node.kind == "layer")
    return max((size for size in layers if size is not None), default=None)


def instance_sizes(expanded: Expanded, flat_graph: Graph, block: str) -> InstanceSizes:
    """The :class:`InstanceSizes` of ``block`` from the flat graph (an instance ``I``'s inner node ``o`` is
    its node ``I_o``, its output ``I``: ``expand.flatten``); a size not a number (unknown) is left out."""
    elements = _elements
    output = expanded.blocks[block].output
    nodes: dict[str, Any] = {}
    for layer in expanded.calls[block]:
        for inner in expanded.blocks[block].layers:
            node = flat_graph.nodes.get(layer.out if inner.out == output else f"{layer.out}_{inner.out}")
            size = elements(getattr(node, "shape", None))
            if size is not None and size > (elements(getattr(nodes.get(inner.out), "shape", None)) or 0):
                nodes[inner.out] = node
    return InstanceSizes(nodes, _largest_layer(flat_graph))
