"""The structured module of a spec with blocks: each block derived once, then called per instance.

Steps, in order, as in ``pipeline``: the flat graph (every instance inlined, ``blocks.flatten``)
checks the spec and gives each instance's shapes; each block becomes a graph of its own whose
"loss" is its output (:class:`BlockOutput`: the gradient arriving there is the backward function's
``grad_output``), derived and planned as a flat spec is; the top level becomes a graph in which each
instance is one node (:class:`BlockRule`), derived by the same reverse walk, which sums the
gradients of a parameter several instances share. ``render_structured`` prints it all.

A block's forward function, called with ``save=True``, also returns the list of what its backward
reads (``x1, saved_x1 = step_forward(x0, y, p, save=True)``, its inputs and parameters included, as
autograd saves them); its backward takes that list and the gradient arriving at its output and
returns the gradients of its inputs and parameters, keyed by name (``grads_x1.pop("x")``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import sympy

from .algebra import primitive, tensor, TensorOp, Params
from .blocks import BlockSpec, HyperInt, flatten
from .errors import SpecError
from .fingerprint import module_constants
from .graph import Graph, build_graph
from .plan import Plan, plan
from .reverse import GRAD_LOSS, Program, derive
from .roles import channels_last_constant, channels_last_inputs, channels_last_rule
from .rules.base import Forward, Operand, Param, Rule
from .spec import Argument, LossSpec, Spec

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


primitive("block_forward", code=_forward_code, outputs=2,
          latex=lambda operands, params, show: rf"\operatorname{{{_text(params['block'])}}}\left("
                                               rf"{', '.join(operands[:params['inputs']])}\right)")
primitive("block_backward", code=_backward_code,
          latex=lambda operands, params, show: rf"\operatorname{{{_text(params['block'])}}}^{{*}}\left({operands[-1]}\right)")
primitive("chain_forward", outputs=2,
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

    def infer_shape(self, shapes, params, check):
        block = self.derived.spec
        graph = _block_graph(block, {name: shapes[name] for name in block.operands}, self.derived.graph.spec,
                             {name: params[name] for name, _ in block.hyper})
        return graph.nodes[block.output].shape

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
        missing = set(wanted) - set(derived.gradients)
        if missing:
            raise NotImplementedError(f"block {block.name} derives no gradient for {sorted(missing)}")
        return {operand: TensorOp("gradient_of", Params.of(key=keys.get(operand, operand)), grads)
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

    def infer_shape(self, shapes, params, check):
        shape = shapes[CHAIN_INPUT]
        for link in self.links:
            block, bound = link.rule.derived.spec, dict(link.binding)
            operand_shapes = {block.inputs[0]: shape, **{name: shapes[bound[name]] for name in block.param_names}}
            shape = link.rule.infer_shape(operand_shapes, {**dict(block.hyper), **dict(link.hyper)}, check)
        return shape

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


@dataclass
class Structured:
    spec: Spec
    flat_graph: Graph
    blocks: dict[str, DerivedBlock]
    graph: Graph
    program: Program
    planned: Plan
    chains: tuple = ()
    """The :class:`ChainRule` of each run of instances the code loops over."""


def build_structured(spec: Spec) -> Structured:
    flat = flatten(spec)
    flat_graph = build_graph(flat)
    needs_gradient = flat_graph.depends_on_wrt()
    instances: dict[str, list] = {}
    for layer in spec.layers:
        if layer.block:
            instances.setdefault(layer.block, []).append(layer)
    derived = {name: _derive_block(spec.blocks[name], layers, flat_graph, needs_gradient)
               for name, layers in instances.items()}
    rules = {name: BlockRule(block) for name, block in derived.items()}
    top, chains = _chained(_top_spec(spec), spec, rules)
    graph = build_graph(top, extra_rules={**rules, **{chain.op: chain for chain in chains}})
    for layer in top.layers:
        if layer.block:
            graph.nodes[layer.out].params["_scope"] = _scope_of(layer, spec)
    program = derive(graph)
    fast = derive(graph, fused=True)
    planned = plan(program, fast, [], extras=())
    return Structured(spec, flat_graph, derived, graph, program, planned, tuple(chains))


CHAIN_LENGTH = 3
"""The fewest instances a chain runs: two calls read better written out than as a table and a loop."""


def _chained(top: Spec, spec: Spec, rules: dict[str, BlockRule]) -> tuple[Spec, list[ChainRule]]:
    """``top`` with each run of at least :data:`CHAIN_LENGTH` instances that feed only the next (one
    input each, parameters bound by ``prefix:`` and to no other layer) as one :class:`ChainRule` layer,
    named as its last instance's output, so that nothing downstream changes."""
    from .graph import _references

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
        return (layer.block is not None and len(spec.blocks[layer.block].inputs) == 1
                and _scope_of(layer, spec) is not None
                and all(bound_count[bound] == 1 and bound in sources for _, bound in layer.binding)
                and not any(_references(argument.value) for argument in layer.arguments))

    runs, current = [], []
    for layer in top.layers:
        if linkable(layer) and current and layer.sources[0][0] == current[-1].out and readers[current[-1].out] == 1:
            current.append(layer)
            continue
        runs.append(current)
        current = [layer] if linkable(layer) else []
    runs.append(current)
    # a table never takes a name the spec gives a tensor or a block, in either case
    taken = {name.lower() for name in [*(item.name for item in spec.inputs), *(layer.out for layer in spec.layers),
                                       *spec.blocks]}
    chains, replaced = [], {}
    for run in runs:
        if len(run) < CHAIN_LENGTH:
            continue
        table = _table_name(run, spec, taken)
        links = tuple(ChainLink(rules[layer.block], *_scope_of(layer, spec),
                                tuple((name, value) for name, value, _ in layer.hyper
                                      if value != dict(spec.blocks[layer.block].hyper)[name]),
                                layer.binding) for layer in run)
        chain = ChainRule(table, links, sources)
        chains.append(chain)
        arguments = tuple(Argument(bound, bound, layer.location) for layer in run for _, bound in layer.binding)
        replaced[run[0].out] = dataclasses.replace(run[-1], op=chain.op, block=None, sources=run[0].sources,
                                                   arguments=arguments, binding=(), hyper=())
        for layer in run[1:]:
            replaced[layer.out] = None
    layers = tuple(replaced.get(layer.out, layer) for layer in top.layers if replaced.get(layer.out, layer) is not None)
    return dataclasses.replace(top, layers=layers), chains


def _names(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [name for item in value for name in _names(item)]
    node = getattr(value, "node", None)  # {like: NODE}
    return [node] if isinstance(node, str) else []


def _table_name(run, spec: Spec, taken: set[str]) -> str:
    """The chain's table, after what its instances' prefixes share (``features.2`` to ``features.17``:
    FEATURES), else after its first and last (LAYER1_0_TO_LAYER4_2)."""
    import os
    import re

    prefixes = [_scope_of(layer, spec)[0] for layer in run]
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


def _scope_of(layer, spec: Spec) -> tuple[str, int] | None:
    """The instance's parameter mapping as a slice of the ``params`` argument (``layer1.0``; with an
    offset, children numbered from it), where every parameter it binds is an input traced from
    ``PREFIX.KEY``; None: a literal mapping."""
    from .blocks import shifted

    sources = {item.name: item.source for item in spec.inputs}
    block = spec.blocks[layer.block]
    keys = dict(block.params)
    prefixes = set()
    for param, bound in layer.binding:
        source, key = sources.get(bound), shifted(keys[param], layer.offset)
        if source is None or key is None or not source.endswith("." + key):
            return None
        prefixes.add(source[: -len(key) - 1])
    return (prefixes.pop(), layer.offset) if len(prefixes) == 1 else None


def _signature(shapes) -> tuple:
    """What a block's derivation may depend on besides sizes: each operand's rank and its size-1 axes."""
    return tuple((len(shape), tuple(axis for axis, size in enumerate(shape) if size == 1)) for shape in shapes)


def _derive_block(block: BlockSpec, layers, flat_graph: Graph, needs_gradient: set[str]) -> DerivedBlock:
    """The block derived once for all ``layers`` (its instances), its hypers as :class:`HyperInt`.

    What a derivation may depend on besides sizes is each tensor's rank and size-1 axes (a rule may
    derive otherwise where a size is 1: a broadcast, an expand) and the hypers' values: the block is
    derived once per distinct set of them among its instances, and every one must print the same
    code, else one derivation cannot serve them all (a 1 x 1 and a 3 x 3 convolution do)."""
    first = layers[0]
    wanted = set()
    variants: dict[tuple, object] = {}
    for layer in layers:
        wanted |= {name for name, node in _bound(block, layer).items() if node in needs_gradient}
        values = tuple(sorted(_hyper_values(block, layer).items()))
        variants.setdefault((values, _instance_signature(block, layer, flat_graph)), layer)
    derived = [_derive_variant(block, {name: flat_graph.nodes[bound].shape for name, bound in _bound(block, layer).items()},
                               flat_graph.spec, wanted, dict(values))
               for (values, _), layer in variants.items()]
    signature = next(iter(variants))[1]
    for (_, other_signature), layer, other in zip(list(variants)[1:], list(variants.values())[1:], derived[1:]):
        if _block_view(other) == _block_view(derived[0]):
            continue
        if other_signature != signature:  # a rule derives otherwise where a size is 1 (a broadcast, an expand)
            raise SpecError(f"instance '{layer.out}' of block '{block.name}' has tensors of other ranks or other "
                            f"size-1 axes than instance '{first.out}', and its derivation differs",
                            layer.location, "define a second block for it, or inline its layers")
        raise SpecError(f"instance '{layer.out}' of block '{block.name}' sets its hypers to values for which the "
                        f"derivation differs from that of instance '{first.out}' (not only in the values)",
                        layer.location, "define a second block for it, or inline its layers")
    return derived[0]


def _hyper_values(block: BlockSpec, layer) -> dict[str, int]:
    """The instance's value of each of the block's hypers, the default where it sets none."""
    return {**dict(block.hyper), **{name: value for name, value, _ in layer.hyper}}


def _derive_variant(block: BlockSpec, shapes: dict, spec: Spec, wanted: set[str], values: dict) -> DerivedBlock:
    graph = _block_graph(block, shapes, spec, {name: HyperInt(name, value) for name, value in values.items()})
    feeds_output = {"loss"}
    for node in reversed(list(graph.nodes.values())):
        if node.name in feeds_output:
            feeds_output.update(node.operands.values())
    graph.wrt = tuple(name for name in block.operands if name in wanted and name in feeds_output)
    program = derive(graph)
    fast = derive(graph, fused=True)
    planned = plan(program, fast, [], extras=())
    read = set().union(*(item.statement.value.free_symbols for item in planned.backward)) if planned.backward else set()
    backward_inputs = tuple(name for name in block.inputs if tensor(name) in read)
    return DerivedBlock(block, graph, program, planned, graph.wrt, backward_inputs)


def _instance_signature(block: BlockSpec, layer, flat_graph: Graph) -> tuple:
    """What a block's derivation may depend on besides sizes, for one instance: every tensor's rank
    and size-1 axes, read from the flat graph (where the instance's node ``o`` is ``OUT_o``)."""
    bound = _bound(block, layer)
    names = [bound[name] for name in block.operands] + [
        layer.out if inner.out == block.output else f"{layer.out}_{inner.out}" for inner in block.layers]
    return _signature(flat_graph.nodes[name].shape for name in names)


def _bound(block: BlockSpec, layer) -> dict[str, str]:
    return {**dict(zip(block.inputs, (source for source, _ in layer.sources))), **dict(layer.binding)}


def _block_graph(block: BlockSpec, shapes: dict, spec: Spec, values: dict | None = None) -> Graph:
    """The block as a graph of its own, its operands as inputs, ending in :class:`BlockOutput`;
    ``values``: its hypers' (the defaults where none)."""
    from .spec import InputSpec

    location = block.location
    inputs = tuple(InputSpec(name, tuple(shapes[name]), location) for name in block.operands)
    loss = LossSpec("half_sq_error", (block.output, location), (block.output, location), None, location, location)
    sub = Spec(name=block.name, inputs=inputs, layers=block.layers_with(values or {}), loss=loss, wrt=(),
               file=spec.file, text=spec.text)
    graph = build_graph(sub)
    output = graph.nodes["loss"]
    graph.nodes["loss"] = dataclasses.replace(output, rule=BlockOutput(), operands={"input": block.output},
                                              params={"reduction": "none"}, shape=graph.nodes[block.output].shape)
    return graph


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


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def _renamed_statements(scheduled, renames: dict) -> list:
    """``scheduled`` with each symbol in ``renames`` replaced (values, deletions and the comments'
    code alike: ``# fc = F.linear(flatten, params["fc.weight"], ...)``)."""
    import re

    from .plan import Scheduled

    names = {old.name: new.name for old, new in renames.items()}
    spelled = re.compile(r"\b(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")\b") if names else None
    result = []
    for item in scheduled:
        statement = item.statement
        value = statement.value.xreplace(renames)
        if value in renames.values() and statement.target in renames:
            continue  # the alias itself
        dead = tuple(dict.fromkeys(renames.get(tensor(name), tensor(name)).name for name in item.dead))
        comment = statement.comment
        code = re.match(r"\w+ = .*?\)(?=: )", comment) if spelled else None  # `fc = F.linear(...): pulled back`
        if code:  # the forward line it quotes, never the prose (a parameter may be called `weight`)
            comment = spelled.sub(lambda match: names[match.group(1)], code.group(0)) + comment[code.end():]
        result.append(Scheduled(dataclasses.replace(statement, value=value, comment=comment), dead))
    return result


def _one_line(scheduled, indent: int = 4, width: int = 100) -> list:
    """``scheduled`` with each comment on one line: one too long for it loses its closing remark in
    parentheses (``(autograd's own kernel, twice differentiable)``, which the helper it calls says)."""
    import re

    result = []
    for item in scheduled:
        comment = item.statement.comment
        if indent + 2 + len(comment) > width:
            comment = re.sub(r" \([^()]*\)$", "", comment)
        result.append(item if comment == item.statement.comment else
                      dataclasses.replace(item, statement=dataclasses.replace(item.statement, comment=comment)))
    return result


def _block_view(derived: DerivedBlock) -> dict:
    from .emit import _lines

    block, planned = derived.spec, derived.planned
    forward = [item for item in planned.saving_forward if item.statement.target.name != "loss"]
    output = tensor(block.output)
    # the gradient arriving at the output is the argument grad_output: `grad_out = grad_loss` goes
    renames = {GRAD_LOSS: GRAD_OUTPUT}
    for item in planned.backward:
        if item.statement.value == GRAD_LOSS:
            renames[item.statement.target] = GRAD_OUTPUT
    backward = _renamed_statements(planned.backward, renames)
    keys = dict(block.params)
    read_backward = _read(item.statement for item in backward)
    gradient = {name: renames.get(symbol, symbol).name for name, symbol in planned.program.gradients.items()}
    hyper_backward = _hypers(item.statement for item in backward)
    # each parameter read where it is used, as the mapping's entry (`p["conv1.weight"]`): no names to unpack
    entries = {tensor(name): tensor(f'p["{key}"]') for name, key in block.params}
    saved_names = (list(derived.backward_inputs) + (["p"] if any(name in read_backward for name in keys) else [])
                   + [name for name, _ in block.hyper if name in hyper_backward] + planned.saved_names)
    return dict(
        name=block.name, inputs=list(block.inputs), output=output.name,
        hyper=[f"{name}={default}" for name, default in block.hyper],
        forward=_lines(_renamed_statements(forward, entries), overwrite=True),
        saved_names=saved_names,
        backward=_lines(_one_line(_renamed_statements(backward, entries))),
        returns=[(keys.get(name, name), gradient[name]) for name in derived.gradients])


def _read(statements) -> set[str]:
    """The names the printed statements read: a block call that passes ``_scope(params, ...)``
    does not read its parameters' names."""
    names: set[str] = set()
    for statement in statements:
        names |= _direct_names(statement.value)
    return names


def _hypers(statements) -> set[str]:
    """The block hypers the statements' ops take as arguments."""
    names: set[str] = set()
    for statement in statements:
        for expression in statement.value.atoms(TensorOp):
            for _, value in expression.params.items():
                names |= {part.name for part in (value if isinstance(value, tuple) else (value,))
                          if isinstance(part, HyperInt)}
    return names


def _direct_names(expression) -> set[str]:
    if isinstance(expression, sympy.Symbol):
        return {expression.name}
    operands, names = expression.args, set()
    if isinstance(expression, TensorOp):
        operands = expression.operands
        if expression.primitive.name == "block_forward" and expression.params["scope"]:
            operands = operands[:expression.params["inputs"]]
        if expression.primitive.name == "chain_forward":  # the instances' parameters: from `params`
            operands = operands[:1]
        names = {symbol.name for symbol in expression.params.free_symbols}
    for operand in operands:
        names |= _direct_names(operand)
    return names


def _returned_parameters(structured: Structured, sources: dict, inlined: dict, inlined_from: dict, backward: list):
    """The ``params`` gradients ``_backward_from_saved`` returns: ``**_prefixed("layer1.0", grads)``
    for an instance whose block's gradient mapping holds exactly its own parameters' gradients (its
    inputs' taken out already, none shared with another instance), one entry each for the rest."""
    graph = structured.graph
    popped: dict[str, set[str]] = {}
    for item in backward:
        for expression in item.statement.value.atoms(TensorOp):
            if expression.primitive.name == "gradient_of":
                popped.setdefault(expression.operands[0].name, set()).add(expression.params["key"])
    merged, covered = [], set()
    for node in graph.nodes.values():
        if isinstance(node.rule, ChainRule):  # its backward returns every instance's gradients keyed already
            grads = f"grads_{node.name}"
            bound = {value for value in node.rule.keys if value in graph.wrt}
            if (bound and all(value in graph.wrt and value in inlined_from and inlined_from[value].operands[0].name == grads
                    for value in bound) and "x" in popped.get(grads, set())):
                merged.append((grads, grads))
                covered |= bound
            continue
        if not isinstance(node.rule, BlockRule) or not node.params.get("_scope"):
            continue
        derived = node.rule.derived
        grads = f"grads_{node.name}"
        keys = dict(derived.spec.params)
        params = [name for name in derived.gradients if name in keys]
        bound = {name: node.operands[name] for name in params}
        inputs_taken = {name for name in derived.gradients if name not in keys} <= popped.get(grads, set())
        own = all(value in graph.wrt and value in inlined_from and inlined_from[value].operands[0].name == grads
                  for value in bound.values())
        if params and own and inputs_taken:
            prefix, offset = node.params["_scope"]
            merged.append((f'_prefixed("{prefix}", {grads}, {offset})' if offset else f'_prefixed("{prefix}", {grads})',
                           grads))
            covered |= set(bound.values())
    returns = [(sources[name], inlined.get(name, f"grad_{name}")) for name in graph.wrt
               if name in sources and name not in covered]
    return merged, returns


def _chain_view(chain: ChainRule) -> dict:
    """A chain's table: a row per instance, ``(block, prefix, offset, {hypers})``."""
    rows = []
    for link in chain.links:
        name = link.rule.derived.spec.name
        hyper = "{" + ", ".join(f'"{key}": {value}' for key, value in link.hyper) + "}"
        rows.append(f'("{name}", "{link.prefix}", {link.offset}, {hyper})')
    first, last = chain.links[0].prefix, chain.links[-1].prefix
    return dict(table=chain.table, rows=rows, first=first, last=last, count=len(chain.links))


def _momenta(statistics, sources: dict) -> list[str]:
    """``"layer1.0.bn1": 0.1,`` for each training-mode batch_norm, from its running mean's key."""
    return [f'"{sources[mean].rsplit(".", 1)[0]}": {momentum},' for mean, _, momentum in statistics]


def _packed(entries: list[str], indent: int = 4, width: int = 100) -> list[str]:
    """``entries`` (each ending in a comma) joined into as few lines of at most ``width`` columns
    as they fill in order: a table's rows, not a statement, so several to a line."""
    lines: list[str] = []
    for entry in entries:
        if lines and indent + len(lines[-1]) + 1 + len(entry) <= width:
            lines[-1] += " " + entry
        else:
            lines.append(entry)
    return lines


def render_structured(structured: Structured, spec_label: str, test_context: dict) -> dict[str, str]:
    """The structured module and its test file, as text keyed by file name."""
    import hashlib

    from . import __version__
    from .emit import _environment, _line, _lines
    from .plan import _helpers, _running_statistics
    from .printing import to_code
    from .write import with_header

    spec, graph, planned = structured.spec, structured.graph, structured.planned
    sources = {item.name: item.source for item in spec.inputs if item.source}
    positional = [item.name for item in spec.inputs if not item.source]
    signature = ", ".join(positional + (["params"] if sources else []))
    inlined: dict[str, str] = {}
    inlined_from: dict[str, TensorOp] = {}
    backward = []
    for item in planned.backward:
        statement = item.statement
        value = statement.value
        if (statement.gradient_of in sources and statement.gradient_of in graph.wrt and isinstance(value, TensorOp)
                and value.primitive.name == "gradient_of"):
            inlined[statement.gradient_of] = to_code(value)
            inlined_from[statement.gradient_of] = value
            continue
        if isinstance(value, TensorOp) and value.primitive.name in ("gradient_of", "block_backward"):
            # `grads_b = block_backward(...)`, `grads_b.pop("x")`: the code says it
            item = dataclasses.replace(item, statement=dataclasses.replace(statement, comment=""))
        backward.append(item)

    merged, param_returns = _returned_parameters(structured, sources, inlined, inlined_from, backward)
    # read again by the return statement (`**_prefixed(...)`, `grads_a.pop("w")`): never deleted before it
    returned = {grads for _, grads in merged} | {value.operands[0].name for value in inlined_from.values()}
    offsets = any(layer.block and layer.offset for layer in spec.layers)
    backward = [dataclasses.replace(item, dead=tuple(name for name in item.dead if name not in returned))
                for item in backward]

    # each parameter read where it is used, as the mapping's entry (`params["fc.weight"]`)
    entries = {tensor(name): tensor(f'params["{source}"]') for name, source in sources.items()}
    statements_of = lambda scheduled: [item.statement for item in scheduled]  # noqa: E731
    blocks = [_block_view(block) for block in structured.blocks.values()]
    helpers = _helpers([item.statement for block in structured.blocks.values()
                        for item in block.planned.saving_forward + block.planned.backward]
                       + statements_of(planned.saving_forward) + statements_of(planned.backward))
    from .emit import _outputs_context

    context = dict(
        **_outputs_context(spec, structured.flat_graph),
        name=spec.name, version=__version__, spec_label=spec_label, helpers=helpers,
        fingerprint=module_constants(spec, any_width=True),
        has_params=bool(sources), block_names=[block["name"] for block in blocks], blocks=blocks,
        forward=[_line(dataclasses.replace(statement, value=statement.value.xreplace(entries)))
                 for statement in planned.forward],
        saving_forward=_lines(_renamed_statements(planned.saving_forward, entries), overwrite=True),
        saved_names=planned.saved_names, loss_name=planned.loss_name,
        backward=_lines(_one_line(_renamed_statements(backward, entries))), boundary_dead=planned.boundary_dead,
        default_cotangent=to_code(planned.program.default_cotangent),
        signature=signature, reduction=graph.loss.params["reduction"],
        positional_wrt=[name for name in graph.wrt if name not in sources],
        positional_returns=[(name, f"grad_{name}") for name in graph.wrt if name not in sources],
        param_returns=param_returns, merged_returns=[text for text, _ in merged], offsets=offsets,
        chains=[_chain_view(chain) for chain in structured.chains],
        positional=positional,
        momentum_lines=_packed(_momenta(_running_statistics(structured.flat_graph), sources)),
        function_grads=", ".join(f"grads.{name}" if name in graph.wrt else "None" for name in positional),
        **_layout_view(structured, sources, positional),
    )
    environment = _environment()
    spec_hash = hashlib.sha256(spec.text.encode("utf-8")).hexdigest()
    files = {}
    test_context = dict(test_context, outputs=spec.outputs is not None, name=spec.name, sources=sources, positional=positional,
                        channels_last_at_spec=channels_last_inputs(structured.flat_graph))
    for template, file_name, values in (("structured.py.jinja", f"{spec.name}.py", context),
                                        ("test_structured.py.jinja", f"test_{spec.name}.py", test_context)):
        body = environment.get_template(template).render(**values)
        files[file_name] = with_header(body, spec_label, spec_hash, comment="python")
    return files


def _layout_view(structured: Structured, sources: dict[str, str], positional: list[str]) -> dict:
    """The per-call layout rule of the flat module (:func:`symgrad.roles.channels_last_rule`), for
    the structured one: the ``params`` keys of the 2-d convolution weights it moves to channels_last,
    the test on the call's shapes, the keys the top level's own backward reads again, and the
    positional inputs whose gradients go back to their caller's layout."""
    rule = channels_last_rule(structured.flat_graph)
    if rule is None:
        return dict(channels_last_keys=[], channels_last_test=None, channels_last_constant=None,
                    backward_channels_last=[], layout_kept=[])
    flat_sources = {item.name: item.source for item in structured.flat_graph.spec.inputs if item.source}
    keys = [flat_sources[name] for name in rule.weights if name in flat_sources]
    read_in_backward = {symbol.name for item in structured.planned.backward for symbol in item.statement.value.free_symbols}
    shapes = {node.name: node.shape for node in structured.flat_graph.inputs}
    # where the weights are all the 4-d entries of `params` (as in most CNNs), the code says so, not a table
    others = [source for name, source in flat_sources.items() if len(shapes[name]) == 4 and source not in keys]
    listed = bool(others)
    return dict(
        channels_last_keys=keys, channels_last_lines=_packed([f'"{key}",' for key in keys]) if listed else [],
        channels_last_others=", ".join(others), moved_test="key in CHANNELS_LAST" if listed else "value.dim() == 4",
        channels_last_test=rule.test(), channels_last_constant=channels_last_constant(structured.flat_graph),
        backward_channels_last=[sources[name] for name in sources if name in read_in_backward and sources[name] in keys],
        layout_kept=[name for name in positional if name in structured.graph.wrt and len(shapes[name]) == 4] if keys else [],
    )


class FlatView:
    """A structured module seen with the flat module's calling convention (every input by its spec
    name, each gradient an attribute), for the checks ``symgrad verify`` and ``generate --verify``
    run on either."""

    def __init__(self, module, graph: Graph):
        self.module = module
        self.sources = {item.name: item.source for item in graph.spec.inputs if item.source}

    def _arguments(self, inputs: dict) -> dict:
        named = {name: value for name, value in inputs.items() if name not in self.sources}
        if self.sources:
            named["params"] = {self.sources[name]: inputs[name] for name in self.sources}
        return named

    def forward(self, **inputs):
        return self.module.forward(**self._arguments(inputs))

    def gradients(self, grad_loss=None, grad_outputs=None, **inputs):
        import types

        cotangent = dict(grad_loss=grad_loss) if grad_outputs is None else dict(grad_outputs=grad_outputs)
        result = self.module.gradients(**self._arguments(inputs), **cotangent)._asdict()
        params = result.pop("params", {})
        result.update({name: params[key] for name, key in self.sources.items() if key in params})
        return types.SimpleNamespace(**result)

    def loss_with_explicit_backward(self, recompute=False, **inputs):
        return self.module.loss_with_explicit_backward(**self._arguments(inputs), recompute=recompute)

    def outputs_with_explicit_backward(self, recompute=False, **inputs):
        return self.module.outputs_with_explicit_backward(**self._arguments(inputs), recompute=recompute)


def flat_view(module, graph: Graph):
    """``module`` itself, or a :class:`FlatView` of it when it was written as blocks (``graph``: the
    flat graph of its spec, whose inputs say which come in ``params``)."""
    return FlatView(module, graph) if getattr(module, "STRUCTURED", False) else module


def _section(title: str, anchor: str, program: Program, graph: Graph, instances=(), inputs=(), params=(),
             hyper=(), diagram: bool = False) -> dict:
    """One block's (or the top level's) derivation, for the documents."""
    from markupsafe import escape

    from .diagram import svg
    from .mathml import mathml
    from .printing import to_code, to_latex

    steps = []
    for step in program.steps:
        if instances and step.node == "loss":  # a block's end: its output's gradient comes from the caller
            continue
        node = graph.nodes[step.node]
        own = (node.rule.derived.spec.param_names if isinstance(node.rule, BlockRule)
               else tuple(node.rule.keys) if isinstance(node.rule, ChainRule) else ())
        # an instance's parameters take their gradients straight from its block's backward: named, not derived
        parameters = [source for operand, source, _ in step.contributions
                      if operand in own and not program.branch_sums.get(source)]
        contributions = [dict(operand=operand, source=source, latex=to_latex(value), mathml=mathml(to_latex(value)),
                              branch=len(program.branch_sums.get(source, [])))
                         for operand, source, value in step.contributions if source not in parameters]
        locals_ = [f"{to_latex(symbol)} = {to_latex(value)}" for symbol, value in step.locals]
        steps.append(dict(node=step.node, incoming=to_latex(step.incoming), incoming_mathml=mathml(to_latex(step.incoming)),
                          locals=locals_, locals_mathml=[mathml(local) for local in locals_],
                          contributions=contributions, parameters=parameters))
    forward = [f"{statement.target.name} = {to_code(statement.value)}" for statement in program.forward
               if statement.target.name != "loss" or not instances]
    return dict(title=title, anchor=anchor, instances=list(instances), inputs=list(inputs), params=list(params),
                hyper=list(hyper),
                forward=[str(escape(line)) for line in forward] if diagram else forward, steps=steps,
                svg=svg(graph) if diagram else "")


def render_documents(structured: Structured, spec_label: str) -> dict[str, str]:
    """``<name>.md`` and ``<name>.html``: each block's derivation once, then the top level."""
    import hashlib

    from . import __version__
    from .emit import NOTATION, _environment, _notation_html
    from .mathml import CSS
    from .write import with_header

    spec = structured.spec
    instances: dict[str, list[str]] = {}
    for layer in spec.layers:
        if layer.block:
            instances.setdefault(layer.block, []).append(layer.out)
    environment = _environment()
    spec_hash = hashlib.sha256(spec.text.encode("utf-8")).hexdigest()
    files = {}
    for template, suffix, html in (("structured.md.jinja", "md", False), ("structured.html.jinja", "html", True)):
        sections = [_section(f"Block {name}", f"block-{name}", block.program, block.graph, instances[name],
                             block.spec.inputs, [key for _, key in block.spec.params],
                             [f"{name} (default {default})" for name, default in block.spec.hyper], diagram=html)
                    for name, block in structured.blocks.items()]
        sections.append(_section("Top level", "top-level", structured.program, structured.graph, diagram=False))
        body = environment.get_template(template).render(
            name=spec.name, version=__version__, spec_label=spec_label, notation=NOTATION,
            notation_html=_notation_html(), mathml_css=CSS, sections=sections)
        files[f"{spec.name}.{suffix}"] = with_header(body, spec_label, spec_hash, comment="markup")
    return files
