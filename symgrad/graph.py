"""The forward graph: spec layers bound to rules, arguments checked, shapes inferred.

Nodes are kept in topological order (inputs, layers in spec order, then the loss): a layer may only
read nodes defined above it, so the spec order is already a topological order and cycles cannot be
written.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import sympy

from .algebra import Size, tensor
from .errors import Location, SpecError
from .rules import LAYER_RULES, LOSS_RULES
from .rules.base import Checker, NodeSymbols, ParamContext, Rule
from .rules.call import BlockOutput, BlockRule, ChainLink, ChainRule, DerivedBlock
from .spec import Argument, LossSpec, Spec
from .spec_values import Like, has_like

if TYPE_CHECKING:
    from .blocks import BlockSpec
    from .expand import Expanded


@dataclass
class Node:
    name: str
    kind: str  # "input", "layer" or "loss"
    location: Location
    rule: Rule | None = None
    operands: dict[str, str] = field(default_factory=dict)
    """Tensor operand name -> the node it reads."""
    constants: dict[str, sympy.Expr] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    shape: tuple = ()
    dtype: str = "float"


@dataclass
class Graph:
    spec: Spec
    nodes: dict[str, Node]
    wrt: tuple[str, ...]

    @property
    def loss(self) -> Node:
        return next(node for node in self.nodes.values() if node.kind == "loss")

    @property
    def inputs(self) -> list[Node]:
        return [node for node in self.nodes.values() if node.kind == "input"]

    def consumers(self, name: str) -> list[tuple[Node, str]]:
        """The (node, operand) pairs that read ``name``, in graph order: from an index built once per
        graph (a scan of every node per call made callers quadratic in the number of layers)."""
        index = self.__dict__.get("_consumers")
        if index is None or index[0] is not self.nodes or index[1] != len(self.nodes):
            readers: dict[str, list[tuple[Node, str]]] = {}
            for node in self.nodes.values():
                for operand, source in node.operands.items():
                    readers.setdefault(source, []).append((node, operand))
            index = self.__dict__["_consumers"] = (self.nodes, len(self.nodes), readers)
        return list(index[2].get(name, ()))

    def symbols(self, node: Node) -> NodeSymbols:
        operands = {operand: tensor(source) for operand, source in node.operands.items()}
        operands.update(node.constants)
        return NodeSymbols(node.name, operands, node.params,
                           {operand: self.nodes[source].shape for operand, source in node.operands.items()},
                           node.shape)

    def depends_on_wrt(self) -> set[str]:
        """Nodes whose value depends on some ``wrt`` input: the only ones that need a gradient."""
        reached = set(self.wrt)
        for node in self.nodes.values():
            if any(source in reached for source in node.operands.values()):
                reached.add(node.name)
        return reached

    def class_counts(self, shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, int]:
        """For each int64 input: how many classes its values index (the scored input's dim 1)."""
        graph = self.with_input_shapes(shapes) if shapes else self
        counts = {}
        for node in graph.inputs:
            if node.dtype == "int64":
                scored = [consumer for consumer, operand in graph.consumers(node.name) if operand == "target"]
                bounds = [consumer.rule.index_bound({key: graph.nodes[source].shape for key, source in
                                                     consumer.operands.items()}, consumer.params)
                          for consumer, operand in graph.consumers(node.name) if operand in consumer.rule.index_operands]
                counts[node.name] = min([graph.nodes[consumer.operands["input"]].shape[1] for consumer in scored] + bounds)
        return counts

    def with_input_shapes(self, shapes: dict[str, tuple[int, ...]]) -> "Graph":
        """The same graph at other input shapes (raises SpecError if they are inconsistent)."""
        nodes = {name: Node(**{**node.__dict__}) for name, node in self.nodes.items()}
        for name, shape in shapes.items():
            nodes[name].shape = tuple(shape)
        _infer_shapes(nodes)
        return Graph(self.spec, nodes, self.wrt)


def build_graph(spec: Spec, extra_rules: dict[str, Rule] | None = None) -> Graph:
    """``extra_rules``: rules for ops the spec defines itself (its blocks' instances, ``symgrad.rules.call``)."""
    nodes: dict[str, Node] = {}
    for item in spec.inputs:
        nodes[item.name] = Node(item.name, "input", item.location, shape=item.shape, dtype=item.dtype)
    for layer in spec.layers:
        rule = (extra_rules or {}).get(layer.op) or LAYER_RULES.get(layer.op)
        if rule is None:
            hint = difflib.get_close_matches(layer.op, list(LAYER_RULES) + list(LOSS_RULES), n=1)
            suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
            raise SpecError(f"unknown op '{layer.op}'{suggestion}", layer.op_location,
                            f"use one of: {', '.join(sorted(LAYER_RULES))} (`symgrad ops` lists them)")
        node = Node(layer.out, "layer", layer.location, rule)
        reads = layer.sources if not (layer.implicit_in and not any(o.from_in for o in rule.operands)) else ()
        _bind(node, rule, [source for source, _ in reads], reads,
              {argument.name: (argument.value, argument.location) for argument in layer.arguments}, nodes)
        nodes[node.name] = node

    if spec.outputs is not None:  # a spec that ends in outputs: their cotangents seed the reverse walk
        from .outputs import Outputs

        entries = spec.outputs.entries  # one end node, named ``loss`` as every graph's end is
        nodes["loss"] = Node("loss", "loss", spec.outputs.location, Outputs(len(entries)),
                             operands={f"output_{index}": node for index, (_, node, _) in enumerate(entries)},
                             params={"reduction": "none"})
        _infer_shapes(nodes)
        graph = Graph(spec, nodes, tuple(name for name, _ in spec.wrt))
        _check_reachability(graph)
        return graph
    loss = spec.loss
    rule = LOSS_RULES.get(loss.op)
    if rule is None:
        hint = difflib.get_close_matches(loss.op, list(LOSS_RULES), n=1)
        raise SpecError(f"unknown loss '{loss.op}'" + (f"; did you mean '{hint[0]}'?" if hint else ""), loss.location,
                        f"use one of: {', '.join(sorted(LOSS_RULES))}")
    node = Node("loss", "loss", loss.location, rule)
    _bind(node, rule, [loss.source[0]], (loss.source,),
          {"target": (loss.target[0], loss.target[1]),
           **({"reduction": (loss.reduction, loss.reduction_location)} if loss.reduction is not None else {}),
           **{argument.name: (argument.value, argument.location) for argument in loss.arguments}}, nodes)
    nodes["loss"] = node
    _check_class_targets(nodes)
    _infer_shapes(nodes)

    graph = Graph(spec, nodes, tuple(name for name, _ in spec.wrt))
    _check_reachability(graph)
    return graph


def _bind(node: Node, rule: Rule, sources: list[str], source_locations, arguments: dict[str, tuple[Any, Location]],
          nodes: dict[str, Node]) -> None:
    """Fill the node's operands and params from ``in:`` and the layer's keyword arguments."""
    variadic = next((operand for operand in rule.operands if operand.variadic), None)
    if variadic is not None:
        if len(sources) < 2:
            raise SpecError(f"{rule.op} needs at least two tensors under 'in:'", node.location,
                            "list the tensors to join, e.g. `in: [a, b]`")
        node.operands.update({f"{variadic.name}_{index}": source for index, source in enumerate(sources)})
        sources = []
    from_in = [operand for operand in rule.operands if operand.from_in and not operand.variadic]
    if len(sources) > len(from_in):
        raise SpecError(f"{rule.op} reads {len(from_in)} tensor(s) from 'in:' but {len(sources)} are given",
                        source_locations[len(from_in)][1],
                        f"list at most {len(from_in)} name(s) under 'in:' ({', '.join(o.name for o in from_in)})")
    for operand, source in zip(from_in, sources):
        node.operands[operand.name] = source
    for operand in rule.operands:
        if operand.variadic:
            continue
        if operand.name in arguments:
            value, location = arguments.pop(operand.name)
            if operand.name in node.operands and operand.from_in and len(sources) > from_in.index(operand):
                raise SpecError(f"{rule.op}: '{operand.name}' is given both by 'in:' and by name", location,
                                "give it once")
            if isinstance(value, str):
                if value not in nodes:
                    hint = difflib.get_close_matches(value, list(nodes), n=1)
                    raise SpecError(f"{rule.op}: '{operand.name}' names '{value}', which is not defined before this layer"
                                    + (f"; did you mean '{hint[0]}'?" if hint else ""), location,
                                    "name a declared input or an earlier layer's `out:`")
                node.operands[operand.name] = value
            elif operand.constant_ok and not isinstance(value, (bool, list)) and isinstance(value, (int, float)):
                from .rules.base import number

                node.constants[operand.name] = number(value, ParamContext(rule.op, operand.name, location))
            else:
                kind = "a node name or a number" if operand.constant_ok else "a node name"
                raise SpecError(f"{rule.op}: '{operand.name}' must be {kind}, not {value!r}", location,
                                f"write `{operand.name}: NAME` with a declared tensor")
        if operand.name not in node.operands and operand.name not in node.constants and not operand.optional:
            how = "list it under 'in:'" if operand.from_in else f"add `{operand.name}: NAME`"
            raise SpecError(f"{rule.op} needs '{operand.name}'", node.location, how)
    for name, (value, location) in arguments.items():
        if name not in rule.params:
            known = [operand.name for operand in rule.operands] + list(rule.params)
            hint = difflib.get_close_matches(name, known, n=1) if name not in rule.argument_hints else []
            raise SpecError(f"{rule.op} has no argument '{name}'" + (f"; did you mean '{hint[0]}'?" if hint else ""),
                            location, rule.argument_hints.get(name, f"{rule.op} takes: {', '.join(known)}"))
        if has_like(value):  # resolved once the shapes before it are known (_infer_shapes)
            node.params[name] = value
            continue
        context = ParamContext(rule.op, name, location, rule.spatial_dims())
        node.params[name] = rule.params[name].normalize(value, context)
    for name, param in rule.params.items():
        if name not in node.params:
            context = ParamContext(rule.op, name, node.location, rule.spatial_dims())
            node.params[name] = param.normalize(param.default, context)


def _check_class_targets(nodes: dict[str, Node]) -> None:
    """int64 inputs are class indices or indices: only ever the target of cross_entropy / nll_loss, which
    take nothing else as their target, or an operand a rule declares an index (``index``'s ``index``)."""
    for node in nodes.values():
        for operand, source in node.operands.items():
            classifies = (node.rule.class_targets and operand == "target") or operand in node.rule.index_operands
            if nodes[source].dtype == "int64" and not classifies:
                raise SpecError(f"'{source}' is int64 (class indices), but {node.rule.op} '{node.name}' reads it as its "
                                f"{operand}", node.location, "use int64 inputs only as the target of cross_entropy or nll_loss, or as index's index")
            if classifies and nodes[source].dtype != "int64" and not node.rule.float_index_ok:
                raise SpecError(f"{node.rule.op} needs {'class' if operand == 'target' else 'integer'} indices, but "
                                f"{operand} '{source}' is a float tensor",
                                node.location, f"declare '{source}' with `dtype: int64`")


def _resolve_references(node: Node, nodes: dict[str, Node]) -> None:
    """Turn each ``{like: NODE}`` param into the rule's size expressions (``NODE.shape[2]``), now that
    NODE's rank and the layer's input are known; a param that takes no reference says so (its normaliser)."""
    for name, value in node.params.items():
        if not has_like(value):
            continue
        source = node.operands.get("input")
        own = nodes[source].shape if source else ()
        if isinstance(value, Like) and value.dims is None and value.size is None:  # the spatial sizes, dims 2 on,
            # of a node of the input's rank (a Like with dims or size is one size: narrow's length)
            referenced = nodes[value.node].shape
            if len(referenced) < 3 or len(referenced) != len(own):
                raise SpecError(f"{node.rule.op} '{node.name}': {name} {value} reads the spatial sizes (dims 2 on) "
                                f"of '{value.node}' {list(referenced)}, which do not fit the input {list(own)}",
                                value.location, "name a node of the input's rank, [N, C, ...] with spatial dims")
            mode = node.params.get("mode", "constant") if node.rule.op == "pad" else "constant"
            if mode != "constant":  # the copying modes' checks (pads >= 0, < the size) need numbers
                raise SpecError(f"pad '{node.name}': pad {value} pads in constant mode only, not '{mode}'",
                                value.location, f"give the pads as numbers for mode {mode}, or pad in constant mode")
        resolved = _with_ranks(value, nodes, source, len(own))
        location = value.location if isinstance(value, Like) else next(v for v in value if isinstance(v, Like)).location
        context = ParamContext(node.rule.op, name, location, node.rule.spatial_dims())
        node.params[name] = node.rule.params[name].normalize(resolved, context)


def _with_ranks(value: Any, nodes: dict[str, Node], source: str | None, rank: int) -> Any:
    """Each :class:`Like` in ``value`` told its node's rank and the layer's input."""
    if isinstance(value, list):
        return [_with_ranks(item, nodes, source, rank) for item in value]
    if isinstance(value, Like):
        return dataclasses.replace(value, rank=len(nodes[value.node].shape), input=source, input_rank=rank)
    return value


def size_references(node: Node) -> set[str]:
    """The nodes whose sizes ``node``'s params read at run time (``{like: skip}``)."""
    names = set()
    for value in node.params.values():
        for part in value if isinstance(value, tuple) else (value,):
            if isinstance(part, sympy.Basic):
                names |= {size.of.name for size in part.atoms(Size)}
    return names


def sized(params: dict[str, Any], shape_of: Callable[[str], tuple]) -> dict[str, Any]:
    """``params`` with every size read at run time (``skip.shape[2]``) replaced by its value,
    ``shape_of(name)[axis]``: a number, or a shape symbol when the shapes are symbolic."""

    def value_of(expr):
        if not isinstance(expr, sympy.Basic) or not expr.atoms(Size):
            return expr
        sizes = {size: sympy.sympify(shape_of(size.of.name)[size.axis]) for size in expr.atoms(Size)}
        value = expr.xreplace(sizes)
        return int(value) if value.is_Integer else value

    if not any(_reads_sizes(value) for value in params.values()):
        return params  # the same dict: a rule's infer_shape may write into it ('same' padding's resolved ints)
    return {key: tuple(value_of(part) for part in value) if isinstance(value, tuple) else value_of(value)
            for key, value in params.items()}


def _reads_sizes(value: Any) -> bool:
    return any(isinstance(part, sympy.Basic) and part.atoms(Size)
               for part in (value if isinstance(value, tuple) else (value,)))


def _infer_shapes(nodes: dict[str, Node]) -> None:
    for node in nodes.values():
        if node.kind == "input":
            continue
        _resolve_references(node, nodes)
        shapes = {operand: nodes[source].shape for operand, source in node.operands.items()}
        check = Checker(node.location, f"{node.rule.op} '{node.name}'")
        try:
            params = sized(node.params, lambda name: nodes[name].shape)
            node.shape = tuple(node.rule.infer_shape(shapes, params, check))
        except SpecError as error:
            context = "; ".join(f"{operand} is '{source}' {nodes[source].shape} from line {nodes[source].location.line}"
                                for operand, source in node.operands.items())
            raise SpecError(f"{error.message} [{context}]", error.location, error.fix) from None


def _check_reachability(graph: Graph) -> None:
    """Every layer must feed the loss, and every ``wrt`` input must influence it."""
    feeds_loss, needed = {"loss"}, {"loss"}  # needed: also the nodes whose sizes a needed layer reads
    for node in reversed(list(graph.nodes.values())):
        if node.name in feeds_loss:
            feeds_loss.update(node.operands.values())
        if node.name in needed:
            needed.update(node.operands.values(), size_references(node))
    for node in graph.nodes.values():
        if node.kind == "layer" and node.name not in needed:
            raise SpecError(f"layer '{node.name}' ({node.rule.op}) does not contribute to the loss", node.location,
                            "remove it, or make a later layer read it with `in:`")
    for name, location in graph.spec.wrt:
        if name not in feeds_loss:
            raise SpecError(f"'wrt' names '{name}', which does not influence the loss, so its gradient is zero",
                            location, f"remove '{name}' from wrt, or use it in a layer")


# --------------------------------------------------------------------------------------------
# The graphs of a program's bodies (``expand``): a block's own, and the top body's, whose
# instances are calls (``rules.call``)
# --------------------------------------------------------------------------------------------


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
                value for argument in layer.arguments for value in _names(argument.value)]:
            readers[name] = readers.get(name, 0) + 1
    for name in (top.outputs.nodes if top.outputs is not None else (top.loss.source[0], top.loss.target[0])):
        readers[name] = readers.get(name, 0) + 1
    bound_count: dict[str, int] = {}
    for layer in top.layers:
        for _, bound in (layer.binding if layer.block else ()):
            bound_count[bound] = bound_count.get(bound, 0) + 1

    def linkable(layer) -> bool:
        return (layer.block is not None and len(blocks[layer.block].inputs) == 1
                and expanded.scopes[layer.out] is not None
                and all(bound_count[bound] == 1 and bound in sources for _, bound in layer.binding)
                and not any(has_like(argument.value) for argument in layer.arguments))

    runs, current = [], []
    for layer in top.layers:
        if linkable(layer) and current and layer.sources[0][0] == current[-1].out and readers[current[-1].out] == 1:
            current.append(layer)
            continue
        runs.append(current)
        current = [layer] if linkable(layer) else []
    runs.append(current)
    # a table never takes a name the spec gives a tensor or a block, in either case, nor one the module's own
    taken = {name.lower() for name in [*(item.name for item in spec.inputs), *(layer.out for layer in spec.layers),
                                       *blocks, *MODULE_NAMES]}
    chains, replaced = [], {}
    for run in runs:
        if len(run) < CHAIN_LENGTH:
            continue
        table = _table_name(run, expanded, taken)
        links = tuple(ChainLink(rules[layer.block], *expanded.scopes[layer.out],
                                tuple((name, value) for name, value, _ in layer.hyper
                                      if value != dict(blocks[layer.block].hyper)[name]),
                                layer.binding) for layer in run)
        chain = ChainRule(table, links, sources)
        chains.append(chain)
        arguments = tuple(Argument(bound, bound, layer.location) for layer in run for _, bound in layer.binding)
        replaced[run[0].out] = dataclasses.replace(run[-1], op=chain.op, block=None, sources=run[0].sources,
                                                   arguments=arguments, binding=(), hyper=())
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


MODULE_NAMES = frozenset({
    "BLOCKS", "CHANNELS_LAST", "CHANNELS_LAST_FROM", "CLASSES", "DROP_IN_REFERENCE", "EVAL_MODULE", "F",
    "FINGERPRINT", "FINITE_DIFFERENCES_FAIL", "FINITE_DIFFERENCES_UP_TO", "FROZEN", "GUARDS", "INPUTS", "MOMENTA",
    "MOVED", "NAMES", "OUTPUTS", "OUTPUTS_KIND", "PARAMS", "REACHED_BY", "REFERENCE_SUMS", "RENAMED", "ROLES", "ROWS",
    "RUNNING", "SHARED", "SMALL_INPUTS", "SMALL_SHAPES", "SPEC_ENTRIES", "SPEC_SHAPES", "WRT", "ZERO_BY_STRUCTURE"})
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
    common = common[:common.rfind(".")] if "." in common else ""
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
    value), its hypers as :class:`~symgrad.blocks.HyperInt`, its ``wrt`` the operands some instance
    needs the gradient of and that reach its output; the first variant's body is the one every
    instance calls, where the others print the same code (``plan.plan_block`` checks it)."""
    from .blocks import HyperInt

    needs_gradient = flat_graph.depends_on_wrt()
    found = {}
    for name, layers in expanded.calls.items():
        block = expanded.blocks[name]
        wanted, variants = set(), {}
        for layer in layers:
            bound = _bound(block, layer)
            wanted |= {operand for operand, node in bound.items() if node in needs_gradient}
            values = tuple(sorted({**dict(block.hyper), **{key: value for key, value, _ in layer.hyper}}.items()))
            names = [bound[operand] for operand in block.operands] + [
                layer.out if inner.out == block.output else f"{layer.out}_{inner.out}" for inner in block.layers]
            signature = tuple((len(shape), tuple(axis for axis, size in enumerate(shape) if size == 1))
                              for shape in (flat_graph.nodes[node].shape for node in names))
            variants.setdefault((values, signature), layer)
        found[name] = []
        for (values, signature), layer in variants.items():
            bound = _bound(block, layer)
            graph = block_graph(block, {operand: flat_graph.nodes[node].shape for operand, node in bound.items()},
                                flat_graph.spec, {key: HyperInt(key, value) for key, value in values},
                                {operand: flat_graph.nodes[node].dtype for operand, node in bound.items()})
            feeds_output = {"loss"}
            for node in reversed(list(graph.nodes.values())):
                if node.name in feeds_output:
                    feeds_output.update(node.operands.values())
            graph.wrt = tuple(operand for operand in block.operands if operand in wanted and operand in feeds_output)
            found[name].append(Variant(layer, signature, DerivedBlock(block, graph, graph.wrt)))
    return found


def _bound(block: BlockSpec, layer) -> dict[str, str]:
    """Each of the block's operands as the instance binds it: its inputs' sources, its parameters."""
    return {**dict(zip(block.inputs, (source for source, _ in layer.sources))), **dict(layer.binding)}


def block_graph(block: BlockSpec, shapes: dict, spec: Spec, values: dict | None = None,
                dtypes: dict | None = None) -> Graph:
    """The block as a graph of its own, its operands as inputs, ending in :class:`BlockOutput`;
    ``values``: its hypers' (the defaults where none); ``dtypes``: its operands' (an int64 buffer, a relative
    position index, stays int64 inside the block)."""
    from .spec import InputSpec

    location = block.location
    if dtypes is None:  # the block's own graph: its operands as it declares them
        dtypes = {entry.name: entry.dtype for entry in spec.inputs} if spec.name == block.name else {}
    inputs = tuple(InputSpec(name, tuple(shapes[name]), location, dtypes.get(name, "float")) for name in block.operands)
    loss = LossSpec("half_sq_error", (block.output, location), (block.output, location), None, location, location)
    sub = Spec(name=block.name, inputs=inputs, layers=block.layers_with(values or {}), loss=loss, wrt=(),
               file=spec.file, text=spec.text)
    graph = build_graph(sub)
    output = graph.nodes["loss"]
    graph.nodes["loss"] = dataclasses.replace(output, rule=BlockOutput(), operands={"input": block.output},
                                              params={"reduction": "none"}, shape=graph.nodes[block.output].shape)
    return graph
