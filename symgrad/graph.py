"""The forward graph: spec layers bound to rules, arguments checked, shapes inferred.

Nodes are kept in topological order (inputs, layers in spec order, then the loss): a layer may only
read nodes defined above it, so the spec order is already a topological order and cycles cannot be
written.

A program's body graphs (a block's own, the top body's with its chains) are ``body_graphs.py``'s.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, Callable

import sympy

from .algebra import Size, tensor
from .errors import Location, SpecError
from .rules import LAYER_RULES, LOSS_RULES
from .rules.base import Checker, NodeSymbols, ParamContext, Rule
from .spec import Spec
from .spec_values import Like, has_like


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
        return NodeSymbols(
            node.name,
            operands,
            node.params,
            {operand: self.nodes[source].shape for operand, source in node.operands.items()},
            node.shape,
        )

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
                bounds = [
                    consumer.rule.index_bound(
                        {key: graph.nodes[source].shape for key, source in consumer.operands.items()}, consumer.params
                    )
                    for consumer, operand in graph.consumers(node.name)
                    if operand in consumer.rule.index_operands
                ]
                counts[node.name] = min(
                    [graph.nodes[consumer.operands["input"]].shape[1] for consumer in scored] + bounds
                )
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
            raise SpecError(
                f"unknown op '{layer.op}'{suggestion}",
                layer.op_location,
                f"use one of: {', '.join(sorted(LAYER_RULES))} (`symgrad ops` lists them)",
            )
        node = Node(layer.out, "layer", layer.location, rule)
        reads = layer.sources if not (layer.implicit_in and not any(o.from_in for o in rule.operands)) else ()
        _bind(
            node,
            rule,
            [source for source, _ in reads],
            reads,
            {argument.name: (argument.value, argument.location) for argument in layer.arguments},
            nodes,
        )
        nodes[node.name] = node

    if spec.outputs is not None:  # a spec that ends in outputs: their cotangents seed the reverse walk
        from .outputs import Outputs

        entries = spec.outputs.entries  # one end node, named ``loss`` as every graph's end is
        nodes["loss"] = Node(
            "loss",
            "loss",
            spec.outputs.location,
            Outputs(len(entries)),
            operands={f"output_{index}": node for index, (_, node, _) in enumerate(entries)},
            params={"reduction": "none"},
        )
        _infer_shapes(nodes)
        graph = Graph(spec, nodes, tuple(name for name, _ in spec.wrt))
        _check_reachability(graph)
        return graph
    loss = spec.loss
    rule = LOSS_RULES.get(loss.op)
    if rule is None:
        hint = difflib.get_close_matches(loss.op, list(LOSS_RULES), n=1)
        raise SpecError(
            f"unknown loss '{loss.op}'" + (f"; did you mean '{hint[0]}'?" if hint else ""),
            loss.location,
            f"use one of: {', '.join(sorted(LOSS_RULES))}",
        )
    node = Node("loss", "loss", loss.location, rule)
    _bind(
        node,
        rule,
        [loss.source[0]],
        (loss.source,),
        {
            "target": (loss.target[0], loss.target[1]),
            **({"reduction": (loss.reduction, loss.reduction_location)} if loss.reduction is not None else {}),
            **{argument.name: (argument.value, argument.location) for argument in loss.arguments},
        },
        nodes,
    )
    nodes["loss"] = node
    _check_class_targets(nodes)
    _infer_shapes(nodes)

    graph = Graph(spec, nodes, tuple(name for name, _ in spec.wrt))
    _check_reachability(graph)
    return graph


def _bind(
    node: Node,
    rule: Rule,
    sources: list[str],
    source_locations,
    arguments: dict[str, tuple[Any, Location]],
    nodes: dict[str, Node],
) -> None:
    """Fill the node's operands and params from ``in:`` and the layer's keyword arguments."""
    variadic = next((operand for operand in rule.operands if operand.variadic), None)
    if variadic is not None:
        if len(sources) < 2:
            raise SpecError(
                f"{rule.op} needs at least two tensors under 'in:'",
                node.location,
                "list the tensors to join, e.g. `in: [a, b]`",
            )
        node.operands.update({f"{variadic.name}_{index}": source for index, source in enumerate(sources)})
        sources = []
    from_in = [operand for operand in rule.operands if operand.from_in and not operand.variadic]
    if len(sources) > len(from_in):
        raise SpecError(
            f"{rule.op} reads {len(from_in)} tensor(s) from 'in:' but {len(sources)} are given",
            source_locations[len(from_in)][1],
            f"list at most {len(from_in)} name(s) under 'in:' ({', '.join(o.name for o in from_in)})",
        )
    for operand, source in zip(from_in, sources):
        node.operands[operand.name] = source
    for operand in rule.operands:
        if operand.variadic:
            continue
        if operand.name in arguments:
            value, location = arguments.pop(operand.name)
            if operand.name in node.operands and operand.from_in and len(sources) > from_in.index(operand):
                raise SpecError(
                    f"{rule.op}: '{operand.name}' is given both by 'in:' and by name", location, "give it once"
                )
            if isinstance(value, str):
                if value not in nodes:
                    hint = difflib.get_close_matches(value, list(nodes), n=1)
                    raise SpecError(
                        f"{rule.op}: '{operand.name}' names '{value}', which is not defined before this layer"
                        + (f"; did you mean '{hint[0]}'?" if hint else ""),
                        location,
                        "name a declared input or an earlier layer's `out:`",
                    )
                node.operands[operand.name] = value
            elif operand.hyper and isinstance(value, (int, float)) and hasattr(value, "name"):
                node.constants[operand.name] = tensor(value.name)  # a block's hyper: a symbol, printed by name
            elif operand.constant_ok and not isinstance(value, (bool, list)) and isinstance(value, (int, float)):
                from .rules.base import number

                node.constants[operand.name] = number(value, ParamContext(rule.op, operand.name, location))
            else:
                kind = "a node name or a number" if operand.constant_ok else "a node name"
                raise SpecError(
                    f"{rule.op}: '{operand.name}' must be {kind}, not {value!r}",
                    location,
                    f"write `{operand.name}: NAME` with a declared tensor",
                )
        if operand.name not in node.operands and operand.name not in node.constants and not operand.optional:
            how = "list it under 'in:'" if operand.from_in else f"add `{operand.name}: NAME`"
            raise SpecError(f"{rule.op} needs '{operand.name}'", node.location, how)
    for name, (value, location) in arguments.items():
        if name not in rule.params:
            known = [operand.name for operand in rule.operands] + list(rule.params)
            hint = difflib.get_close_matches(name, known, n=1) if name not in rule.argument_hints else []
            raise SpecError(
                f"{rule.op} has no argument '{name}'" + (f"; did you mean '{hint[0]}'?" if hint else ""),
                location,
                rule.argument_hints.get(name, f"{rule.op} takes: {', '.join(known)}"),
            )
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
                raise SpecError(
                    f"'{source}' is int64 (class indices), but {node.rule.op} '{node.name}' reads it as its {operand}",
                    node.location,
                    "use int64 inputs only as the target of cross_entropy or nll_loss, or as index's index",
                )
            if classifies and nodes[source].dtype != "int64" and not node.rule.float_index_ok:
                raise SpecError(
                    f"{node.rule.op} needs {'class' if operand == 'target' else 'integer'} indices, but "
                    f"{operand} '{source}' is a float tensor",
                    node.location,
                    f"declare '{source}' with `dtype: int64`",
                )


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
                raise SpecError(
                    f"{node.rule.op} '{node.name}': {name} {value} reads the spatial sizes (dims 2 on) "
                    f"of '{value.node}' {list(referenced)}, which do not fit the input {list(own)}",
                    value.location,
                    "name a node of the input's rank, [N, C, ...] with spatial dims",
                )
            mode = node.params.get("mode", "constant") if node.rule.op == "pad" else "constant"
            if mode != "constant":  # the copying modes' checks (pads >= 0, < the size) need numbers
                raise SpecError(
                    f"pad '{node.name}': pad {value} pads in constant mode only, not '{mode}'",
                    value.location,
                    f"give the pads as numbers for mode {mode}, or pad in constant mode",
                )
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
    return {
        key: tuple(value_of(part) for part in value) if isinstance(value, tuple) else value_of(value)
        for key, value in params.items()
    }


def _reads_sizes(value: Any) -> bool:
    return any(
        isinstance(part, sympy.Basic) and part.atoms(Size) for part in (value if isinstance(value, tuple) else (value,))
    )


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
            context = "; ".join(
                f"{operand} is '{source}' {nodes[source].shape} from line {nodes[source].location.line}"
                for operand, source in node.operands.items()
            )
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
            raise SpecError(
                f"layer '{node.name}' ({node.rule.op}) does not contribute to the loss",
                node.location,
                "remove it, or make a later layer read it with `in:`",
            )
    for name, location in graph.spec.wrt:
        if name not in feeds_loss:
            raise SpecError(
                f"'wrt' names '{name}', which does not influence the loss, so its gradient is zero",
                location,
                f"remove '{name}' from wrt, or use it in a layer",
            )
