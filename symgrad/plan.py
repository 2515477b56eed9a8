"""Planning a program (``expand``): every body, graphed and derived already, scheduled the same way.

The walk (``pipeline.planned_program``) graphs every body first: each block's once per distinct
set of hyper values and size-1 axes among its instances (``body_graphs.block_variants``), the top body,
in which each instance is one :class:`~symgrad.rules.call.BlockRule` node (a run of them one
:class:`~symgrad.rules.call.ChainRule`: ``body_graphs.top_graph``); then derives them all; then plans
here: each block body once (:func:`plan_block`: variants whose statements print the same serve
them all), then the top body (:func:`plan_program`). A program without blocks is its top body
alone, whose graph is the flat graph. ``symgrad.render`` prints the :class:`Structured` result.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import sympy

from .algebra import AUTOCAST_SAVING, TensorOp, tensor
from .blocks import HYPER_VALUES
from .body_graphs import Variant, top_sizes
from .comment import Comment
from .errors import SpecError
from .expand import Expanded
from .graph import Graph
from .kept_casts import read_beyond_dtype
from .plan_branches import merged_plan, split_by_branches
from .printing import to_code
from .reverse import GRAD_LOSS, Program
from .roles import channels_last_constant, channels_last_rule, running_statistics, test_facts
from .rules.call import GRAD_OUTPUT, BlockRule, ChainRule, DerivedBlock
from .schedule import Plan, helpers_of, schedule
from .spec import Spec


@dataclass(frozen=True)
class LayoutPlan:
    """Where and when the module runs its 2-d convolutions in channels_last (the flat graph's rule,
    :func:`symgrad.roles.channels_last_rule`), decided once for the module: nothing moves without a
    rule."""

    keys: tuple[str, ...] = ()
    """The ``params`` keys of the 2-d convolution weights moved to channels_last."""
    named: tuple[str, ...] = ()
    """The weights moved that the caller passes by name."""
    others: tuple[str, ...] = ()
    """The other 4-d ``params`` entries (not moved): where there are some, the module lists ``keys``."""
    test: str | None = None
    """The test on the call's shapes (``rule.test()``)."""
    constant: dict | None = None
    backward_keys: tuple[str, ...] = ()
    """The moved keys the top level's own backward reads again."""
    backward_named: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    """The positional inputs whose gradients go back in their caller's layout."""


def layout_plan(spec: Spec, flat_graph: Graph, graph: Graph, planned: Plan) -> LayoutPlan:
    """The :class:`LayoutPlan` of a program: its top body's ``spec``, ``graph`` and ``planned``."""
    rule = channels_last_rule(flat_graph)
    if rule is None:
        return LayoutPlan()
    sources = {item.name: item.source for item in spec.inputs if item.source}
    positional = [item.name for item in spec.inputs if not item.source]
    flat_sources = {item.name: item.source for item in flat_graph.spec.inputs if item.source}
    keys = [flat_sources[name] for name in rule.weights if name in flat_sources]
    named = [name for name in rule.weights if name not in flat_sources]  # weights the caller passes by name
    read_in_backward = read_beyond_dtype([item.statement for item in planned.backward])
    shapes = {node.name: node.shape for node in flat_graph.inputs}
    return LayoutPlan(
        keys=tuple(keys),
        named=tuple(named),
        others=tuple(source for name, source in flat_sources.items() if len(shapes[name]) == 4 and source not in keys),
        test=rule.test(),
        constant=channels_last_constant(flat_graph),
        backward_keys=tuple(sources[name] for name in sources if name in read_in_backward and sources[name] in keys),
        backward_named=tuple(name for name in named if name in read_in_backward),
        kept=tuple(name for name in positional if name in graph.wrt and len(shapes[name]) == 4)
        if keys or named
        else (),
    )  # nothing moves: every gradient is in its input's layout already


@dataclass(frozen=True)
class TopPlan:
    """The top level's statements as the module prints them: each parameter read where it is used,
    as its ``params`` entry (``params["fc.weight"]``); a pullback's comment quoting its forward line
    with those names."""

    entries: dict
    """{input symbol: its ``params["key"]`` entry}."""
    backward: tuple
    saving_forward: tuple
    per_sample_forward: tuple = ()
    per_sample_backward: tuple = ()


def top_plan(spec: Spec, planned: Plan, backward: list) -> TopPlan:
    """The :class:`TopPlan` of the top body (``backward``: as the module runs it, :func:`_top_backward`)."""
    entries = {tensor(item.name): tensor(f'params["{item.source}"]') for item in spec.inputs if item.source}
    return TopPlan(
        entries,
        tuple(renamed_statements(backward, entries)),
        tuple(renamed_statements(planned.saving_forward, entries)),
        tuple(renamed_statements(planned.per_sample_forward, entries)),
        tuple(renamed_statements(planned.per_sample_backward, entries)),
    )


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
    helpers: list = dataclasses.field(default_factory=list)
    """The module-level functions the blocks' and the top level's statements call."""
    running_statistics: list = dataclasses.field(default_factory=list)
    """(running_mean, running_var, momentum) of each training-mode batch_norm (``roles``)."""
    test_data: dict = dataclasses.field(default_factory=dict)
    """What the generated tests draw: the small shapes, the inputs' roles, the class counts, ..."""
    backward: list = dataclasses.field(default_factory=list)
    """The top level's backward as the module runs it (:func:`_top_backward`)."""
    merged_returns: list = dataclasses.field(default_factory=list)
    """``_prefixed("layer1.0", grads_a)``: the instances whose parameters' gradients return at once."""
    param_returns: list = dataclasses.field(default_factory=list)
    """(``params`` key, gradient) of each other parameter."""
    docstring: tuple = ((), ())
    """The readable forward and backward the module's docstring lists: the top body's, where it is
    the whole network (an inlined program); with calls, the documents derive each body."""
    top_names: frozenset = frozenset()
    """The names the top body's derived statements assign and no block body's do."""
    block_plans: dict = dataclasses.field(default_factory=dict)
    """Each block's :class:`BlockPlan`, by name: its functions' statements as printed."""
    layout_plan: LayoutPlan = None
    """Which weights the module moves to channels_last, and when (:func:`layout_plan`)."""
    top_plan: TopPlan = None
    """The top level's statements with the names the code uses (:func:`top_plan`)."""


def plan_program(
    expanded: Expanded,
    flat_graph: Graph,
    shapes: list | None,
    derived: dict[str, DerivedBlock],
    graph: Graph,
    chains: list,
    top: tuple[Program, Program],
    extras: dict | None = None,
    recompute: bool = True,
    lean: bool = False,
) -> Structured:
    """The top body planned as each block body was (``derived``: theirs, :func:`plan_block`), from
    its ``graph`` and its two derivations (``top``: the readable one and the one ``gradients`` runs),
    and what the module and its tests read besides, each computed once from the flat graph: the
    helpers, the running statistics, the layout rule, the test data (``shapes``: the tests' small
    shapes; None: no test file). ``extras`` (``hvp``, ``per_sample``) come with an inlined program
    (``expand``'s precondition); ``recompute``, ``lean``: see :func:`symgrad.schedule.schedule`."""
    spec = expanded.spec
    program, fast = top
    sizes = None if expanded.inlined else top_sizes(graph, flat_graph)  # the stem's SiLU judged as when flat
    planned = schedule(program, fast, extras=extras, recompute=recompute, lean=lean, block_sizes=sizes)
    bodies = [body for block in derived.values() for body in (block, block.without) if body is not None]
    statements = [  # a body without its block's optional branch calls its own (x + branch: _add_into_second)
        item.statement for body in bodies for item in body.planned.saving_forward + body.planned.backward
    ] + [item.statement for item in planned.saving_forward + planned.backward]
    statements += [
        getattr(item, "statement", item)
        for item in (
            planned.hvp_forward + planned.hvp_backward + planned.per_sample_forward + planned.per_sample_backward
        )
    ]
    test_data = test_facts(flat_graph, shapes) if shapes is not None else {}
    narrowing = planned.saved_as_autocast_casts or any(body.planned.saved_as_autocast_casts for body in bodies)
    helpers = helpers_of(statements, kept_casts=bool(narrowing)) + ([AUTOCAST_SAVING] if narrowing else [])
    # the names the top body's own statements assign (none of them a block body's): what the check
    # of the module's names may read as stand-ins
    inner = {
        item.statement.target.name for body in bodies for item in body.planned.saving_forward + body.planned.backward
    }
    top_names = {
        statement.target.name
        for part in (program.forward, program.backward, fast.forward, fast.backward)
        for statement in part
    } - inner
    top_backward = _top_backward(graph, spec, planned)
    return Structured(
        spec,
        flat_graph,
        derived,
        graph,
        program,
        planned,
        tuple(chains),
        helpers=helpers,
        running_statistics=running_statistics(flat_graph),
        test_data=test_data,
        docstring=(planned.forward, planned.readable_backward) if expanded.inlined else ((), ()),
        top_names=frozenset(top_names),
        block_plans={name: block_plan(block) for name, block in derived.items()},
        layout_plan=layout_plan(spec, flat_graph, graph, planned),
        top_plan=top_plan(spec, planned, top_backward[0]),
        **dict(zip(("backward", "merged_returns", "param_returns"), top_backward)),
    )


def plan_block(
    variants: list[Variant],
    recompute: bool = True,
    lean: bool = False,
    parameters: frozenset[str] = frozenset(),
    sizes=None,
) -> DerivedBlock:
    """A block's body planned once for all its instances, from its variants (``body_graphs.block_variants``:
    one per distinct set of hyper values and size-1 axes, each derived already), each scheduled as
    any body is; every variant must print the same code as the first, whose body every instance
    calls, else one derivation cannot serve them all (a 1 x 1 and a 3 x 3 convolution do). ``parameters``:
    the block's parameters that are entries of ``params`` in every instance (``pipeline._params_entries``);
    ``sizes``: its nodes' at its largest instance, one choice for all (``body_graphs.instance_sizes``)."""
    for variant in variants:
        body = variant.body
        body.planned = schedule(
            body.program, body.fast, recompute=recompute, lean=lean, parameters=parameters, block_sizes=sizes
        )
        read = (
            set().union(*(item.statement.value.free_symbols for item in body.planned.backward))
            if body.planned.backward
            else set()
        )
        body.backward_inputs = tuple(name for name in body.spec.inputs if tensor(name) in read)
    groups = split_by_branches(variants)
    first = _one_body(groups[0])
    if len(groups) > 1:  # the instances that leave the optional branch out: their body too
        first.without = _one_body(groups[1])
    return first


def _one_body(variants: list[Variant]) -> DerivedBlock:
    """The body of ``variants`` (planned already), where each prints the same code as the first."""
    first, block = variants[0], variants[0].body.spec
    for other in variants[1:]:
        if _printed(other.body) == _printed(first.body):
            continue
        layer = other.layer
        if other.signature != first.signature:  # a rule derives otherwise where a size is 1 (a broadcast, an expand)
            raise SpecError(
                f"instance '{layer.out}' of block '{block.name}' has tensors of other ranks or other "
                f"size-1 axes than instance '{first.layer.out}', and its derivation differs",
                layer.location,
                "define a second block for it, or inline its layers",
            )
        raise SpecError(
            f"instance '{layer.out}' of block '{block.name}' sets its hypers to values for which the "
            f"derivation differs from that of instance '{first.layer.out}' (not only in the values)",
            layer.location,
            "define a second block for it, or inline its layers",
        )
    return first.body


def _printed(derived: DerivedBlock) -> tuple:
    """A block variant as the statements its two functions run, printed (a hyper by its name), with
    what it saves and returns: two variants that agree here serve each other's instances."""
    planned = derived.planned

    def lines(scheduled) -> tuple:
        return tuple((item.statement.target.name, to_code(item.statement.value), item.dead) for item in scheduled)

    return (
        lines(planned.saving_forward),
        lines(planned.backward),
        tuple(planned.saved_names),
        tuple(derived.gradients),
        tuple(derived.backward_inputs),
    )


def _top_backward(graph: Graph, spec: Spec, planned: Plan) -> tuple[list, list, list]:
    """The top level's backward as the module runs it, and what it returns: each parameter's
    gradient taken from its instance's mapping in the return itself (``grads_a.pop("w")``, or all of
    an instance's at once, ``**_prefixed("layer1.0", grads_a)``), the names the return reads kept
    alive until then, and no comment on a block call, whose code says it."""
    sources = {item.name: item.source for item in spec.inputs if item.source}
    inlined: dict[str, str] = {}
    inlined_from: dict[str, TensorOp] = {}
    backward = []
    for item in planned.backward:
        statement = item.statement
        value = statement.value
        if (
            statement.gradient_of in sources
            and statement.gradient_of in graph.wrt
            and isinstance(value, TensorOp)
            and value.primitive.name == "gradient_of"
        ):
            inlined[statement.gradient_of] = to_code(value)
            inlined_from[statement.gradient_of] = value
            continue
        if isinstance(value, TensorOp) and value.primitive.name in ("gradient_of", "block_backward"):
            # `grads_b = block_backward(...)`, `grads_b.pop("x")`: the code says it
            item = dataclasses.replace(item, statement=dataclasses.replace(statement, comment=""))
        backward.append(item)

    merged, param_returns = _returned_parameters(graph, sources, inlined, inlined_from, backward)
    # read again by the return statement (`**_prefixed(...)`, `grads_a.pop("w")`): never deleted before it
    returned = {grads for _, grads in merged} | {value.operands[0].name for value in inlined_from.values()}
    backward = [
        dataclasses.replace(item, dead=tuple(name for name in item.dead if name not in returned)) for item in backward
    ]
    return backward, [text for text, _ in merged], param_returns


def _returned_parameters(graph: Graph, sources: dict, inlined: dict, inlined_from: dict, backward: list):
    """The ``params`` gradients ``_backward_from_saved`` returns: ``**_prefixed("layer1.0", grads)``
    for an instance whose block's gradient mapping holds exactly its own parameters' gradients (its
    inputs' taken out already, none shared with another instance), one entry each for the rest."""
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
            if (
                bound
                and all(
                    value in graph.wrt and value in inlined_from and inlined_from[value].operands[0].name == grads
                    for value in bound
                )
                and "x" in popped.get(grads, set())
            ):
                merged.append((grads, grads))
                covered |= bound
            continue
        if not isinstance(node.rule, BlockRule) or not node.params.get("_scope"):
            continue
        derived = node.rule.derived
        grads = f"grads_{node.name}"
        keys = dict(derived.spec.params)
        params = [name for name in derived.gradients if name in keys and name in node.operands]  # not a branch left out
        bound = {name: node.operands[name] for name in params}
        inputs_taken = {name for name in derived.gradients if name not in keys} <= popped.get(grads, set())
        own = all(
            value in graph.wrt and value in inlined_from and inlined_from[value].operands[0].name == grads
            for value in bound.values()
        )
        if params and own and inputs_taken:
            prefix, offset = node.params["_scope"]
            merged.append(
                (f'_prefixed("{prefix}", {grads}, {offset})' if offset else f'_prefixed("{prefix}", {grads})', grads)
            )
            covered |= set(bound.values())
    returns = [
        (sources[name], inlined.get(name, f"grad_{name}"))
        for name in graph.wrt
        if name in sources and name not in covered
    ]
    return merged, returns


@dataclass(frozen=True)
class BlockPlan:
    """What a block's two functions are printed from, every choice made: the statements with the
    names the code uses (each parameter as its entry ``p["conv1.weight"]``, the gradient arriving at
    the output as the argument ``grad_output``), what the backward reads from the forward, and what
    it returns."""

    forward: tuple
    """The forward that saves, without the loss line (it also runs unsaved: nothing narrowed)."""
    backward: tuple
    saved_names: tuple[str, ...]
    """What the forward returns for the backward: the inputs it reads, ``p``, the hypers its ops
    take, then the block's own saved values."""
    returns: tuple[tuple[str, str], ...]
    """(key of each gradient the backward returns: a parameter's ``params`` key, else its name, the
    name of its value)."""
    saved_returned: tuple[str, ...] = ()
    """The saved list as the forward returns it: each of ``saved_names`` as it is kept (autocast's cast
    copy, ``_saved_as_autocast_casts(x)``; ``x if downsample else None`` where only the branch saves it)."""
    switch: str = ""
    """The bool hyper of an optional branch some instances leave out (``plan_branches``): ``forward``
    and ``backward`` then hold :class:`~symgrad.plan_branches.Switch` sections."""
    returns_when: tuple[tuple[str, str], ...] = ()
    """The gradients only the instances with the branch return, as ``returns``."""


def block_plan(derived: DerivedBlock) -> BlockPlan:
    """The :class:`BlockPlan` of a block body planned by :func:`plan_block` (with an optional branch that
    some instances leave out, one plan for both bodies: ``plan_branches.merged_plan``)."""
    if derived.without is not None:
        with_branch = block_plan(dataclasses.replace(derived, without=None))
        return merged_plan(BlockPlan, with_branch, block_plan(derived.without), derived.spec.optional[0].hyper)
    block, planned = derived.spec, derived.planned
    # a block's forward also runs unsaved (save=False): what its backward reads as a convolution's input
    # is kept as autocast's cast copy in its return (saved_returned), not cast at its last use
    forward = [
        dataclasses.replace(item, narrowed=())
        for item in planned.saving_forward
        if item.statement.target.name != "loss"
    ]
    # the gradient arriving at the output is the argument grad_output: `grad_out = grad_loss` goes
    renames = {GRAD_LOSS: GRAD_OUTPUT}
    for item in planned.backward:
        if item.statement.value == GRAD_LOSS:
            renames[item.statement.target] = GRAD_OUTPUT
    backward = renamed_statements(planned.backward, renames)
    keys = dict(block.params)
    read_backward = _read(item.statement for item in backward)
    gradient = {name: renames.get(symbol, symbol).name for name, symbol in planned.program.gradients.items()}
    hyper_backward = _hypers(item.statement for item in backward)
    # each parameter read where it is used, as the mapping's entry (`p["conv1.weight"]`): no names to unpack
    entries = {tensor(name): tensor(f'p["{key}"]') for name, key in block.params}
    saved_names = (
        list(derived.backward_inputs)
        + (["p"] if any(name in read_backward for name in keys) else [])
        + [name for name, _ in block.hyper if name in hyper_backward]
        + planned.saved_names
    )
    return BlockPlan(
        forward=tuple(renamed_statements(forward, entries)),  # no pullback comments
        backward=tuple(renamed_statements(backward, entries)),
        saved_names=tuple(saved_names),
        saved_returned=tuple(
            f"_saved_as_autocast_casts({name})" if name in planned.saved_as_autocast_casts else name
            for name in saved_names
        ),
        returns=tuple((keys.get(name, name), gradient[name]) for name in derived.gradients),
    )


def renamed_statements(scheduled, renames: dict) -> list:
    """``scheduled`` with each symbol in ``renames`` replaced: in values, deletions and the forward line
    a pullback's comment quotes (``# fc = F.linear(flatten, params["fc.weight"], ...)``, a
    :class:`~symgrad.comment.Comment` made text only as it is printed, with these names)."""
    result = []
    for item in scheduled:
        statement = item.statement
        value = statement.value.xreplace(renames)
        if value in renames.values() and statement.target in renames:
            continue  # the alias itself
        dead = tuple(dict.fromkeys(renames.get(tensor(name), tensor(name)).name for name in item.dead))
        narrowed = tuple(renames.get(tensor(name), tensor(name)).name for name in item.narrowed)
        comment = statement.comment
        if isinstance(comment, Comment) and comment.quoted is not None:
            comment = dataclasses.replace(comment, quoted=tuple(part.xreplace(renames) for part in comment.quoted))
        result.append(
            dataclasses.replace(
                item,
                statement=dataclasses.replace(statement, value=value, comment=comment),
                dead=dead,
                narrowed=narrowed,
            )
        )
    return result


def _read(statements) -> set[str]:
    """The names the printed statements read: a block call that passes ``_scope(params, ...)``
    does not read its parameters' names."""
    names: set[str] = set()
    for statement in statements:
        names |= _direct_names(statement.value)
    return names


def _hypers(statements) -> set[str]:
    """The block hypers the statements' ops take as arguments (and the names they read: the caller
    keeps those of its hypers)."""
    names: set[str] = set()
    for statement in statements:
        names |= {symbol.name for symbol in statement.value.free_symbols}  # a scale's (mul by a hyper)
        for expression in statement.value.atoms(TensorOp):
            for _, value in expression.params.items():
                names |= {
                    part.name
                    for part in (value if isinstance(value, tuple) else (value,))
                    if isinstance(part, HYPER_VALUES)
                }
    return names


def _direct_names(expression) -> set[str]:
    if isinstance(expression, sympy.Symbol):
        return {expression.name}
    operands, names = expression.args, set()
    if isinstance(expression, TensorOp):
        operands = expression.operands
        if expression.primitive.name == "block_forward" and expression.params["scope"]:
            operands = operands[: expression.params["inputs"]]
        if expression.primitive.name == "chain_forward":  # the instances' parameters: from `params`
            operands = operands[:1]
        names = {symbol.name for symbol in expression.params.free_symbols}
    for operand in operands:
        names |= _direct_names(operand)
    return names
