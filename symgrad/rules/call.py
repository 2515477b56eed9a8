"""The call rule: an instance of a spec's block as one node of the top body's graph.

Not an op of the registry (no ``RULES``): the planner makes one per block body it derived. A block
is derived once (``symgrad.plan.derive_block``): its graph ends in :class:`BlockOutput`, whose
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

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import sympy

from ..algebra import Params, TensorOp, primitive, tensor
from .base import Forward, Operand, Param, Rule

GRAD_OUTPUT = tensor("grad_output")


class BlockSignature(Protocol):
    """What the call rule reads of a block (a ``blocks.BlockSpec``; a protocol, so that the rules, which
    ``graph`` imports, import nothing above them, not even for a type checker)."""

    name: str
    inputs: tuple[str, ...]
    output: str
    hyper: tuple[tuple[str, int | float], ...]

    @property
    def param_names(self) -> tuple[str, ...]: ...

    def branch_params(self, values: dict) -> set[str]: ...

    @property
    def operands(self) -> tuple[str, ...]: ...


class BodyGraph(Protocol):
    """What it reads of a block body's graph (a ``graph.Graph``)."""

    spec: Any
    nodes: dict[str, Any]


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


primitive(
    "block_forward",
    code=_forward_code,
    outputs=2,
    keeps_operands=True,
    latex=lambda operands, params, show: (
        rf"\operatorname{{{_text(params['block'])}}}\left("
        rf"{', '.join(operands[: params['inputs']])}\right)"
    ),
)
primitive(
    "block_backward",
    code=_backward_code,
    latex=lambda operands, params, show: rf"\operatorname{{{_text(params['block'])}}}^{{*}}\left({operands[-1]}\right)",
)
primitive(
    "chain_forward",
    outputs=2,
    keeps_operands=True,
    code=lambda operands, params, show: (
        f"_run_forward({params['table']}, {operands[0]}, params{', save=True' if params['saving'] else ''})"
    ),
    latex=lambda operands, params, show: (
        rf"\operatorname{{{_text(params['table'].lower())}}}\left("
        rf"{operands[0]}\right)"
    ),
)
primitive(
    "chain_backward",
    code=lambda operands, params, show: f"_run_backward({params['table']}, {operands[0]}, {operands[1]})",
    latex=lambda operands, params, show: (
        rf"\operatorname{{{_text(params['table'].lower())}}}^{{*}}\left("
        rf"{operands[-1]}\right)"
    ),
)
primitive(
    "gradient_of",
    code=lambda operands, params, show: f'{operands[0]}.pop("{params["key"]}")',
    latex=lambda operands, params, show: rf"{operands[0]}\left[{_text(params['key'])}\right]",
)


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
    """A block's body as the walk fills it in: its graph (``body_graphs.block_variants``: what the top
    body's graph reads of it), then its derivation and its plan (``plan.plan_block``)."""

    spec: BlockSignature
    graph: BodyGraph
    gradients: tuple[str, ...]
    """The block operands it returns gradients of, in order."""
    program: Any = None
    """The readable derivation (the documents', a ``reverse.Program``), once derived."""
    fast: Any = None
    """The fused derivation its functions run (a ``reverse.Program``), once derived."""
    planned: Any = None
    """Its plan (a ``schedule.Plan``), once planned; the call rule reads none of the three."""
    backward_inputs: tuple[str, ...] = ()
    """The block inputs its backward reads again (its forward keeps them in the saved list)."""
    without: Any = None
    """Where the block has an optional branch (``block_branches``): the body of its instances that
    leave the branch out (a ``DerivedBlock``, planned too); this one is the body with the branch."""


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

    def __init__(self, derived: DerivedBlock, graph_of: Callable):
        self.derived = derived
        self.graph_of = graph_of
        """The block's body as a graph at an instance's shapes and hypers (``body_graphs.block_graph``)."""
        block = derived.spec
        self.op = block.name
        # a parameter only an optional branch reads is bound by the instances that run it
        branch = block.branch_params({name: False for name, default in block.hyper if isinstance(default, bool)})
        self.operands = tuple(Operand(name, from_in=True) for name in block.inputs) + tuple(
            Operand(name, optional=name in branch) for name in block.param_names
        )
        self.params = {name: Param(default, _hyper_value) for name, default in block.hyper}
        self.index_operands = tuple(name for name in block.operands if derived.graph.nodes[name].dtype == "int64")

    def infer_shape(self, shapes, params, check):
        block = self.derived.spec
        graph = self.graph_of(
            block,
            {name: shapes[name] for name in block.operands if name in shapes},
            self.derived.graph.spec,
            {name: params[name] for name, _ in block.hyper},
        )
        return graph.nodes[block.output].shape

    def index_bound(self, shapes, params) -> int:
        """What the block's int64 operands index stays below (each index op's inside it, the least)."""
        block = self.derived.spec
        graph = self.graph_of(
            block,
            {name: shapes[name] for name in block.operands if name in shapes},
            self.derived.graph.spec,
            {name: params[name] for name, _ in block.hyper},
        )
        return min(graph.class_counts().values())

    def _call_params(self, node) -> dict:
        block = self.derived.spec
        scope = node.params.get("_scope")
        hyper = tuple((name, node.params[name]) for name, default in block.hyper if node.params[name] != default)
        return dict(
            block=block.name,
            inputs=len(block.inputs),
            scope=scope,
            keys=tuple(key for name, key in block.params if name in node.operands),
            hyper=hyper,
        )

    def forward(self, node):
        block = self.derived.spec
        arguments = [node.operands[name] for name in block.operands if name in node.operands]
        call = TensorOp("block_forward", Params.of(**self._call_params(node), saving=node.fused), *arguments)
        return _saving(node, call, f"{block.name}_forward", "the block's backward reads")

    def pullback(self, node, grad, wanted):
        block, derived = self.derived.spec, self.derived
        # the saved list holds what the block's backward reads, its inputs and parameters included
        params = dict(block=block.name)
        grads = node.local(
            "grads",
            TensorOp("block_backward", Params.of(**params), tensor(f"saved_{node.name}"), grad),
            note=f"{block.name}_backward: the gradients of its inputs and parameters",
        )
        keys = dict(block.params)
        read = {source for other in derived.graph.nodes.values() for source in other.operands.values()}
        sizes_only = set(wanted) - read  # LeViT's reshape_as(x) reads x's sizes alone: no gradient flows to it
        missing = set(wanted) - set(derived.gradients) - sizes_only
        if missing:
            raise NotImplementedError(f"block {block.name} derives no gradient for {sorted(missing)}")
        return {
            operand: (
                sympy.S.Zero
                if operand in sizes_only
                else TensorOp("gradient_of", Params.of(key=keys.get(operand, operand)), grads)
            )
            for operand in block.operands
            if operand in wanted
        }


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
        self.index_operands = tuple(
            dict(link.binding)[name]
            for link in self.links
            for name in link.rule.index_operands
            if name in dict(link.binding)
        )

    def _instances(self, shapes):
        """Each instance's link, its operands' shapes and hypers, in the order they run."""
        shape = shapes[CHAIN_INPUT]
        for link in self.links:
            block, bound = link.rule.derived.spec, dict(link.binding)
            operand_shapes = {
                block.inputs[0]: shape,
                **{name: shapes[bound[name]] for name in block.param_names if name in bound},
            }
            values = {**dict(block.hyper), **dict(link.hyper)}
            yield link, operand_shapes, values
            shape = link.rule.infer_shape(operand_shapes, values, None)

    def infer_shape(self, shapes, params, check):
        shape = shapes[CHAIN_INPUT]
        for link in self.links:
            block, bound = link.rule.derived.spec, dict(link.binding)
            operand_shapes = {
                block.inputs[0]: shape,
                **{name: shapes[bound[name]] for name in block.param_names if name in bound},
            }
            shape = link.rule.infer_shape(operand_shapes, {**dict(block.hyper), **dict(link.hyper)}, check)
        return shape

    def index_bound(self, shapes, params) -> int:
        """What the instances' int64 operands index stays below (the least of their blocks')."""
        return min(
            link.rule.index_bound(operand_shapes, values)
            for link, operand_shapes, values in self._instances(shapes)
            if link.rule.index_operands
        )

    def forward(self, node):
        call = TensorOp("chain_forward", Params.of(table=self.table, saving=node.fused), node.operands[CHAIN_INPUT])
        return _saving(node, call, f"the instances of {self.table}", "the instances' backwards read")

    def pullback(self, node, grad, wanted):
        grads = node.local(
            "grads",
            TensorOp("chain_backward", Params.of(table=self.table), tensor(f"saved_{node.name}"), grad),
            note=f"the instances of {self.table} pulled back in reverse",
        )
        return {
            operand: TensorOp(
                "gradient_of", Params.of(key="x" if operand == CHAIN_INPUT else self.keys[operand]), grads
            )
            for operand in (CHAIN_INPUT, *self.keys)
            if operand in wanted
        }
