"""The call rule: an instance of a spec's block as one node of the top body's graph.

A block is derived once (``symgrad.plan_blocks``): its graph ends in :class:`BlockOutput`, whose
incoming gradient is the backward function's ``grad_output``. At the top level each instance is one
node whose rule is a :class:`BlockRule` (a run of instances, one :class:`ChainRule`), derived by
the same reverse walk as any op, which sums the gradients of a parameter several instances share.
The primitives below print the calls (``x1, saved_x1 = step_forward(x0, y, p, save=True)``,
``grads_x1 = step_backward(saved_x1, grad_x1)``, ``grads_x1.pop("x")``).

A block's forward function, called with ``save=True``, also returns the list of what its backward
reads (its inputs and parameters included, as autograd saves them); its backward takes that list
and the gradient arriving at its output and returns the gradients of its inputs and parameters,
keyed by name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import sympy

from .algebra import Params, TensorOp, primitive, tensor
from .blocks import BlockSpec
from .expand import Expanded
from .graph import Graph, build_graph
from .plan import Plan
from .reverse import Program
from .rules.base import Forward, Operand, Param, Rule
from .spec import Argument, LossSpec, Spec
from .spec_values import has_like

GRAD_OUTPUT = tensor("grad_output")


def _block_parameters(operands, params, show):
    """The mapping an instance passes: ``_scope(params, "layer1.0")`` or ``{"w": w1, ...}``."""
    scope = params.get("scope")
    if scope is not None:
        prefix, offset = scope
        return f'_scope(params, "{prefix}", {offset})' if offset else f'_scope(params, "{prefix}")'
    keys = params["keys"]
    return "{" + ", ".join(f'"{key}": {operand}' for key, operand in zip(keys, operands)) + "}"


def _forward_code(operands, params, show):
    count = params["inputs"]
    arguments = operands[:count] + [_block_parameters(operands[count:], params, show)]
    arguments += [f"{name}={value}" for name, value in params["hyper"]]
    return f"{params['block']}_forward({', '.join(arguments)}{', save=True' if params['saving'] else ''})"


def _backward_code(operands, params, show):
    return f"{params['block']}_backward({operands[0]}, {operands[1]})"


def _text(name: str) -> str:
    """A block's name or a parameter key as LaTeX text."""
    return r"\mathrm{" + name.replace("_", r"\_") + "}"


primitive("block_forward", code=_forward_code, outputs=2, keeps_operands=True,
          latex=lambda operands, params, show: rf"\operatorname{{{_text(params['block'])}}}\left("
                                               rf"{', '.join(operands[:params['inputs']])}\right)")
primitive("block_backward", code=_backward_code,
          latex=lambda operands, params, show: rf"\operatorname{{{_text(params['block'])}}}^{{*}}\left({operands[-1]}\right)")
primitive("chain_forward", outputs=2, keeps_operands=True,
          code=lambda operands, params, show: f"_run_forward({params['table']}, {operands[0]}, params"
                                              f"{', save=True' if params['saving'] else ''})",
          latex=lambda operands, params, show: rf"\operatorname{{{_text(params['table'].lower())}}}\left("
                                               rf"{operands[0]}\right)")
primitive("chain_backward",
          code=lambda operands, params, show: f"_run_backward({params['table']}, {operands[0]}, {operands[1]})",
          latex=lambda operands, params, show: rf"\operatorname{{{_text(params['table'].lower())}}}^{{*}}\left("
                                               rf"{operands[-1]}\right)")
primitive("gradient_of", code=lambda operands, params, show: f'{operands[0]}.pop("{params["key"]}")',
          latex=lambda operands, params, show: rf"{operands[0]}\left[{_text(params['key'])}\right]")


class BlockOutput(Rule):
    """The end of a block's graph: its value is the block's output, and the gradient arriving there
    is the one the caller passes (``grad_output``)."""

    op = "block_output"
    operands = (Operand("input", from_in=True),)
    params = {}

    def infer_shape(self, shapes, params, check):
        return shapes["input"]

    def forward(self, node):
        return Forward(node.operands["input"])

    def pullback(self, node, grad, wanted):
        return {"input": grad}

    def default_cotangent(self, node):
        return GRAD_OUTPUT


@dataclass
class DerivedBlock:
    spec: BlockSpec
    graph: Graph
    program: Program
    planned: Plan
    gradients: tuple[str, ...]
    """The block operands it returns gradients of, in order."""
    backward_inputs: tuple[str, ...]
    """The block inputs its backward reads again (its forward keeps them in the saved list)."""


def _hyper_value(value, context) -> int:
    """An instance's hyper value, checked already by the spec (``blocks._hyper_int``)."""
    return value


def _saving(node, call: TensorOp, what: str, reads: str) -> Forward:
    """The forward of an instance (or a chain of them): ``call`` itself, or, in what ``gradients``
    runs, the call that also returns the list the backward reads, its output and that list unpacked."""
    if not node.fused:
        return Forward(call)
    made = node.local("call", call, note=f"{what}: its output, and what {reads}")
    node.local("saved", TensorOp("item", Params.of(index=1), made), note=f"what {reads}")
    return Forward(TensorOp("item", Params.of(index=0), made))


class BlockRule(Rule):
    """One instance of a block as a node of the top-level graph."""

    params = {}
    summary = "a block of the spec, derived once"

    def __init__(self, derived: DerivedBlock):
        self.derived = derived
        block = derived.spec
        self.op = block.name
        self.operands = (tuple(Operand(name, from_in=True) for name in block.inputs)
                         + tuple(Operand(name) for name in block.param_names))
        self.params = {name: Param(default, _hyper_value) for name, default in block.hyper}
        self.index_operands = tuple(name for name in block.operands if derived.graph.nodes[name].dtype == "int64")

    def infer_shape(self, shapes, params, check):
        block = self.derived.spec
        graph = block_graph(block, {name: shapes[name] for name in block.operands}, self.derived.graph.spec,
                             {name: params[name] for name, _ in block.hyper})
        return graph.nodes[block.output].shape

    def index_bound(self, shapes, params) -> int:
        """What the block's int64 operands index stays below (each index op's inside it, the least)."""
        block = self.derived.spec
        graph = block_graph(block, {name: shapes[name] for name in block.operands}, self.derived.graph.spec,
                             {name: params[name] for name, _ in block.hyper})
        return min(graph.class_counts().values())

    def _call_params(self, node) -> dict:
        block = self.derived.spec
        scope = node.params.get("_scope")
        hyper = tuple((name, node.params[name]) for name, default in block.hyper if node.params[name] != default)
        return dict(block=block.name, inputs=len(block.inputs), scope=scope,
                    keys=tuple(key for _, key in block.params), hyper=hyper)

    def forward(self, node):
        block = self.derived.spec
        arguments = [node.operands[name] for name in block.operands]
        call = TensorOp("block_forward", Params.of(**self._call_params(node), saving=node.fused), *arguments)
        return _saving(node, call, f"{block.name}_forward", "the block's backward reads")

    def pullback(self, node, grad, wanted):
        block, derived = self.derived.spec, self.derived
        # the saved list holds what the block's backward reads, its inputs and parameters included
        params = dict(block=block.name)
        grads = node.local("grads", TensorOp("block_backward", Params.of(**params), tensor(f"saved_{node.name}"), grad),
                           note=f"{block.name}_backward: the gradients of its inputs and parameters")
        keys = dict(block.params)
        read = {source for other in derived.graph.nodes.values() for source in other.operands.values()}
        sizes_only = set(wanted) - read  # LeViT's reshape_as(x) reads x's sizes alone: no gradient flows to it
        missing = set(wanted) - set(derived.gradients) - sizes_only
        if missing:
            raise NotImplementedError(f"block {block.name} derives no gradient for {sorted(missing)}")
        return {operand: (sympy.S.Zero if operand in sizes_only
                          else TensorOp("gradient_of", Params.of(key=keys.get(operand, operand)), grads))
                for operand in block.operands if operand in wanted}


@dataclass(frozen=True)
class ChainLink:
    """One instance a chain runs: its block, where its parameters are in ``params``, its hypers."""

    rule: BlockRule
    prefix: str
    offset: int
    hyper: tuple[tuple[str, int], ...]
    """(name, value) of each hyper that differs from the block's default."""
    binding: tuple[tuple[str, str], ...]
    """(the block's parameter, the spec input bound to it)."""


CHAIN_INPUT = "chain_input"
"""The operand a chain reads from the layer before it (its parameters are the others)."""


class ChainRule(Rule):
    """Block instances that run one after another, each reading only the one before (a ResNet's
    stages, a MobileNet's inverted residuals), as one node: the generated code runs them in a loop
    over a table of the instances, ``_run_forward(TABLE, x, params)``, and pulls back through them
    in reverse, ``_run_backward(TABLE, saved, grad_output)``, as a person writes a ``Sequential``."""

    params = {}
    summary = "block instances run one after another, derived once per block"

    def __init__(self, table: str, links: tuple[ChainLink, ...], sources: dict[str, str]):
        self.op = table.lower()
        self.table = table
        self.links = links
        self.keys = {bound: sources[bound] for link in links for _, bound in link.binding}
        self.operands = (Operand(CHAIN_INPUT, from_in=True),) + tuple(Operand(bound) for bound in self.keys)
        # an instance's int64 buffer (a relative position index) is an index its block reads
        self.index_operands = tuple(dict(link.binding)[name] for link in self.links
                                    for name in link.rule.index_operands if name in dict(link.binding))

    def _instances(self, shapes):
        """Each instance's link, its operands' shapes and hypers, in the order they run."""
        shape = shapes[CHAIN_INPUT]
        for link in self.links:
            block, bound = link.rule.derived.spec, dict(link.binding)
            operand_shapes = {block.inputs[0]: shape, **{name: shapes[bound[name]] for name in block.param_names}}
            values = {**dict(block.hyper), **dict(link.hyper)}
            yield link, operand_shapes, values
            shape = link.rule.infer_shape(operand_shapes, values, None)

    def infer_shape(self, shapes, params, check):
        shape = shapes[CHAIN_INPUT]
        for link in self.links:
            block, bound = link.rule.derived.spec, dict(link.binding)
            operand_shapes = {block.inputs[0]: shape, **{name: shapes[bound[name]] for name in block.param_names}}
            shape = link.rule.infer_shape(operand_shapes, {**dict(block.hyper), **dict(link.hyper)}, check)
        return shape

    def index_bound(self, shapes, params) -> int:
        """What the instances' int64 operands index stays below (the least of their blocks')."""
        return min(link.rule.index_bound(operand_shapes, values) for link, operand_shapes, values
                   in self._instances(shapes) if link.rule.index_operands)

    def forward(self, node):
        call = TensorOp("chain_forward", Params.of(table=self.table, saving=node.fused), node.operands[CHAIN_INPUT])
        return _saving(node, call, f"the instances of {self.table}", "the instances' backwards read")

    def pullback(self, node, grad, wanted):
        grads = node.local("grads", TensorOp("chain_backward", Params.of(table=self.table),
                                             tensor(f"saved_{node.name}"), grad),
                           note=f"the instances of {self.table} pulled back in reverse")
        return {operand: TensorOp("gradient_of", Params.of(key="x" if operand == CHAIN_INPUT else self.keys[operand]),
                                  grads)
                for operand in (CHAIN_INPUT, *self.keys) if operand in wanted}


def top_graph(expanded: Expanded, derived: dict[str, DerivedBlock], flat_graph: Graph) -> tuple[Graph, list]:
    """The top body's graph: each instance one :class:`BlockRule` node calling its block's
    ``derived`` body (a run of them one :class:`ChainRule`: returned too); an inlined program's top
    body is its flat spec, whose graph (``flat_graph``) is built once."""
    rules = {name: BlockRule(block) for name, block in derived.items()}
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
    "BLOCKS", "CHANNELS_LAST", "CHANNELS_LAST_FROM", "CLASSES", "EVAL_MODULE", "F", "FINGERPRINT", "FROZEN", "GUARDS",
    "INPUTS", "MOMENTA", "MOVED", "NAMES", "OUTPUTS", "OUTPUTS_KIND", "PARAMS", "REACHED_BY", "REFERENCE_SUMS",
    "RENAMED", "ROLES", "ROWS", "RUNNING", "SHARED", "SMALL_INPUTS", "SMALL_SHAPES", "SPEC_ENTRIES", "SPEC_SHAPES",
    "WRT", "ZERO_BY_STRUCTURE"})
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
