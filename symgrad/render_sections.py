"""The generated module as a model (issue 64 item 2): one frozen dataclass per section of
``templates/module.py.jinja`` (:class:`Docstring`, :class:`Tables`, :class:`Blocks`, :class:`Functions`,
:class:`Bind`), built here from a :class:`~symgrad.plan.Structured` plan with every decision made (which
paragraphs, which layout moves, what a block saves and returns, each line printed with its final names);
each section's template reads its one dataclass and only iterates and prints.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .emit import Line, packed, printed_line, printed_sections
from .fingerprint_text import module_constants
from .plan import BlockPlan, LayoutPlan, Structured
from .render_functions import Functions, entries_packed, functions_section, moved_test, unpacked
from .rules.call import ChainRule, DerivedBlock
from .rules.variant_helpers import helper_source


@dataclass(frozen=True)
class Docstring:
    """``module/docstring.jinja``: the module's docstring (its derivation where it has no blocks)."""

    title: str
    """For a module written as its blocks the whole docstring, one paragraph of what it says of them (its
    name, symgrad's version and the spec are in the header's first line); else its title, the derivation
    after it."""
    blocks: bool
    forward: tuple[Line, ...]
    backward: tuple[Line, ...]
    grad_loss_paragraph: bool
    params_paragraph: bool
    lean_paragraph: str
    layout_paragraph: str


@dataclass(frozen=True)
class Tables:
    """``module/tables.jinja``: the rules' helpers, the momenta and the channels_last layout rule."""

    helpers: tuple[str, ...]
    momentum_lines: tuple[str, ...]
    momentum_shared: str | None
    momentum_none: bool
    """A momentum of None (a cumulative average) among them: the comment says what that means."""
    running_empty: bool
    """``RUNNING = set()``: parameters, and no training-mode batch norm that moves its statistics."""
    constant_comment: str
    constant_name: str
    constant_value: str
    moves_params: bool
    """``_channels_last`` and ``_in_layouts``: some weights in ``params`` move to channels_last."""
    moves_some: bool
    """``_channels_last(params, keys)``: the backward moves again only the weights it reads (its ``keys``)."""
    listed_lines: tuple[str, ...]
    """``CHANNELS_LAST``'s entries, where not every 4-d entry of ``params`` moves."""
    others: str
    moved_subject: str
    moved_test: str
    memory_format: bool
    has_constants: bool
    """Some of ``MOMENTA``, ``RUNNING``, the layout rule's constant or ``CHANNELS_LAST``: written together,
    after the functions."""


@dataclass(frozen=True)
class BlockFunctions:
    """One block's forward and backward functions, printed."""

    name: str
    inputs: tuple[str, ...]
    output: str
    hyper: tuple[str, ...]
    hyper_note: str
    forward: tuple[Line, ...]
    saved_names: tuple[str, ...]
    saved_plain: str
    saved_returned: tuple[str, ...]
    backward: tuple[Line, ...]
    returns: tuple[str, ...]
    first_input: str


@dataclass(frozen=True)
class Chain:
    """A table of a chain's instances, a row each: ``(block, prefix, {hypers})``, with the offset of the
    instance's first child after its prefix where an instance is a run of a Sequential's children."""

    table: str
    rows: tuple[str, ...]
    first: str
    last: str
    count: int


@dataclass(frozen=True)
class Blocks:
    """``module/blocks.jinja``: the blocks' functions, the chains' loops and tables, the random state."""

    name: str
    scope: str
    """``_scope`` and ``_prefixed``: "offsets", "plain" (parameters and blocks), or ""."""
    functions: tuple[BlockFunctions, ...]
    registry_line: str
    """``BLOCKS = {...}`` on one line, where it fits; "": an entry a line."""
    chains: tuple[Chain, ...]
    columns: str
    """What a chain table's columns hold, as its comment says it."""
    row_names: str
    """A row's columns as ``_run_forward`` unpacks them; ``row_names_backward``: as ``_run_backward`` does."""
    row_names_backward: str
    offset_argument: str
    prefixed_helper: bool
    """``_prefixed`` with the plain ``_scope``: the top level returns an instance's gradients through it
    (``_run_backward`` prefixes a chain's keys itself)."""
    random: bool
    stops_early: bool
    """Some block's backward returns no gradient for its input (none of its instances' inputs needs one):
    ``_run_backward`` stops at it; where each returns one, no such branch."""


@dataclass(frozen=True)
class Bind:
    """``module/bind.jinja``: what ``symgrad.bind`` checks a model against."""

    fingerprint: str
    small_inputs: str
    """``SMALL_INPUTS``'s literal; "" where the module has none."""


@dataclass(frozen=True)
class Module:
    """The generated module, a section each (``templates/module.py.jinja`` includes them in this order)."""

    docstring: Docstring
    tables: Tables
    blocks: Blocks
    functions: Functions
    bind: Bind


def module_sections(structured: Structured, spec_label: str) -> Module:
    """The module of ``structured``, every section decided and printed (``spec_label``: its spec as named)."""
    from . import __version__

    spec, planned = structured.spec, structured.planned
    sources = {item.name: item.source for item in spec.inputs if item.source}
    positional = [item.name for item in spec.inputs if not item.source]
    entries = structured.top_plan.entries  # each parameter read where it is used (`params["fc.weight"]`)
    block_functions = tuple(
        _block_functions(block, structured.block_plans[name]) for name, block in structured.blocks.items()
    )
    layout = structured.layout_plan
    random = any(
        getattr(node.rule, "random", False) for node in structured.flat_graph.nodes.values() if node.rule is not None
    )
    # an inlined program: the docstring lists its derivation, as its documents do (``Structured.docstring``)
    readable = [
        tuple(printed_line(dataclasses.replace(item, value=item.value.xreplace(entries))) for item in part)
        for part in structured.docstring
    ]
    rebuilt = list(
        dict.fromkeys(
            planned.rebuilt + [name for block in structured.blocks.values() for name in block.planned.rebuilt]
        )
    )
    docstring = Docstring(
        title='"""Explicit gradients: '
        + _blocks_paragraph(spec.name, [block.name for block in block_functions], bool(sources))
        + '"""'
        if block_functions
        else f'"""Explicit gradients for ``{spec.name}``, derived by symgrad {__version__} from {spec_label}.',
        blocks=bool(block_functions),
        forward=readable[0],
        backward=readable[1],
        grad_loss_paragraph=spec.outputs is None,
        params_paragraph=bool(sources),
        lean_paragraph=(
            "Kept lean (``symgrad generate --keep lean``): the forward does not keep "
            + ", ".join(rebuilt)
            + "; the backward makes each again right before the first line that reads it, from what it keeps "
            "anyway (a batch norm's input and batch statistics, a kept input of a sum), bit for bit the "
            "forward's value (``_batch_norm_again``), and frees it after its last read."
        )
        if rebuilt
        else "",
        layout_paragraph=_layout_paragraph(layout),
    )
    fingerprint, read = _constants(structured, sources)  # read: MOMENTA is read off FINGERPRINT
    offsets = _offsets(spec)
    registry = (
        "BLOCKS = {"
        + ", ".join(
            f'"{block.name}": ({block.name}_forward, {block.name}_backward, "{block.first_input}")'
            for block in block_functions
        )
        + "}"
    )
    return Module(
        docstring=docstring,
        tables=_tables(structured, sources, layout, read),
        blocks=Blocks(
            name=spec.name,
            scope=("offsets" if offsets else "plain") if sources and block_functions else "",
            functions=block_functions,
            registry_line=registry if len(registry) <= 100 else "",
            chains=tuple(_chain(chain, offsets) for chain in structured.chains),
            columns="block, prefix in params, " + ("offset of its first child, " if offsets else "") + "hypers",
            row_names="block, prefix, offset, hyper" if offsets else "block, prefix, hyper",
            row_names_backward="block, prefix, offset, _" if offsets else "block, prefix, _",
            offset_argument=", offset" if offsets else "",
            # a merged return is a chain's gradients by name, or an instance's `_prefixed("prefix", grads)`
            prefixed_helper=any(not text.isidentifier() for text in structured.merged_returns),
            random=random,
            stops_early=any(
                block.spec.inputs[0] not in dict(structured.block_plans[name].returns)
                for name, block in structured.blocks.items()
            ),
        ),
        functions=functions_section(structured, sources, positional, random),
        bind=Bind(
            fingerprint=fingerprint,
            small_inputs=_small_inputs(structured.flat_graph, positional)
            if spec.fingerprint and spec.outputs is not None
            else "",
        ),
    )


def _offsets(spec) -> bool:
    """Whether an instance is a run of a Sequential's children (``offset:``): ``_scope`` then renumbers them."""
    return any(layer.block and layer.offset for layer in spec.layers)


def _blocks_paragraph(name: str, block_names: list[str], params: bool) -> str:
    """What the docstring of a module written as its blocks says of them: what a reader needs to find
    the math (each block's two functions, its derivation's document), nothing the code says again."""
    return (
        f"each block ({', '.join(block_names)}) derived once ({name}.md), run per instance"
        + (" on its slice of ``params`` (keyed as ``state_dict()``)" if params else "")
        + "; every line differentiable."
    )


def _layout_paragraph(layout: LayoutPlan) -> str:
    """Where the module runs its convolutions in channels_last, and what it moves there ("": nowhere)."""
    if not (layout.named or layout.keys):
        return ""
    test = layout.test
    where = (
        f"Where ``{test}`` (the call's "
        + ("device and " if ".is_cpu" in test else "")
        + "batch x height x width) the 2-d convolutions run faster in channels_last"
        if test
        else "At the spec's shapes the 2-d convolutions run faster in channels_last"
    )
    moved = "the weights " + ", ".join(layout.named) if layout.named and not layout.keys else "their weights"
    return (
        where
        + ", so ``gradients`` moves "
        + moved
        + " to that layout (PyTorch then runs each convolution, and everything after it, in that layout); each "
        "gradient is returned in its input's own layout."
    )


def _tables(structured: Structured, sources: dict, layout: LayoutPlan, read: bool) -> Tables:
    """The helpers, ``MOMENTA`` (read off ``FINGERPRINT`` where the BatchNorms it moves all have one
    momentum), and the layout rule's constant and functions."""
    statistics = structured.running_statistics
    momentum_lines = () if read else tuple(packed(_momenta(statistics, sources)))
    listed = bool(layout.others)  # where the weights are all the 4-d entries of `params`, no table
    constant = layout.constant or {}
    running_empty = not momentum_lines and bool(sources) and not read
    return Tables(
        # the template puts a blank line first
        helpers=tuple(helper_source(helper).strip("\n") for helper in structured.helpers),
        momentum_lines=momentum_lines,
        momentum_shared=_shared_momentum(statistics, sources),
        momentum_none=any(momentum == "None" for mean, _, momentum in statistics if mean in sources),
        running_empty=running_empty,
        constant_comment=(
            f"batch x height x width of {constant['reference']} from which 2-d convolutions run in channels_last "
            "(symgrad/roles.py)"
        )
        if constant
        else "",
        constant_name=str(constant.get("name", "")),
        constant_value=str(constant.get("value", "")),
        moves_params=bool(layout.keys),
        moves_some=bool(layout.backward_keys),
        listed_lines=tuple(packed([f'"{key}",' for key in layout.keys])) if listed else (),
        others=", ".join(layout.others),
        moved_subject="CHANNELS_LAST" if listed else "its 4-d entries",
        moved_test=moved_test(layout),
        memory_format=bool(layout.keys or layout.named),
        has_constants=bool(momentum_lines or running_empty or constant or (layout.keys and listed)),
    )


def _momenta(statistics, sources: dict) -> list[str]:
    """``"layer1.0.bn1": 0.1,`` for each training-mode batch_norm, from its running mean's key; where
    there are several, all with one momentum, ``"layer1.0.bn1",`` alone (``dict.fromkeys``: written once)."""
    moved = [
        (sources[mean].rsplit(".", 1)[0], momentum) for mean, _, momentum in statistics if mean in sources
    ]  # one passed by name moves where it is
    if _shared_momentum(statistics, sources) is not None:
        return [f'"{module}",' for module in dict.fromkeys(module for module, _ in moved)]
    return [f'"{module}": {momentum},' for module, momentum in moved]


def _shared_momentum(statistics, sources: dict) -> str | None:
    """The momentum every training-mode batch_norm of several has, as written (``None`` too), else None."""
    momenta = {f"{momentum}" for mean, _, momentum in statistics if mean in sources}
    modules = {sources[mean] for mean, _, _ in statistics if mean in sources}
    return momenta.pop() if len(momenta) == 1 and len(modules) > 1 else None


def _constants(structured: Structured, sources: dict) -> tuple[str, bool]:
    """What bind reads off the module (:func:`~symgrad.fingerprint_text.module_constants`), and whether
    ``MOMENTA`` is read off ``FINGERPRINT`` (its BatchNorms in training mode are the ones the forward
    moves, all with one momentum)."""
    statistics = structured.running_statistics
    shared = _shared_momentum(statistics, sources)
    modules = list(dict.fromkeys(sources[mean].rsplit(".", 1)[0] for mean, _, _ in statistics if mean in sources))
    instances = {
        link.prefix: link.rule.derived.spec.name
        for chain in structured.chains
        for link in chain.links
        if not link.offset
    }
    return module_constants(
        structured.spec,
        any_width=True,
        running=frozenset(name for item in statistics for name in item[:2]),
        instances=instances,
        momenta=(modules, shared) if shared is not None else None,
    )


def _block_functions(derived: DerivedBlock, decided: BlockPlan) -> BlockFunctions:
    """A block's two functions, printed from what planning decided (:class:`~symgrad.plan.BlockPlan`); an
    optional branch's lines under its ``if`` (``emit.printed_sections``), its gradients returned only with it."""
    block = derived.spec
    returns = entries_packed(list(decided.returns), 8)
    if decided.returns_when:
        returns += ["**({", *("    " + line for line in entries_packed(list(decided.returns_when), 12))]
        returns.append(f"}} if {decided.switch} else {{}}),")
    return BlockFunctions(
        name=block.name,
        inputs=tuple(block.inputs),
        output=block.output,
        hyper=tuple(f"{name}={default}" for name, default in block.hyper),
        hyper_note=" and hypers" if block.hyper else "",
        forward=tuple(printed_sections(decided.forward)),
        saved_names=tuple(decided.saved_names),
        saved_plain=unpacked(decided.saved_names),
        saved_returned=tuple(decided.saved_returned),
        backward=tuple(printed_sections(decided.backward, own_line=4)),
        returns=tuple(returns),
        first_input=block.inputs[0],
    )


def _chain(chain: ChainRule, offsets: bool) -> Chain:
    """A chain's table: a row per instance, ``(block, prefix, {hypers})`` (``offsets``: the offset of its
    first child after its prefix, where some instance of the spec is a run of a Sequential's children)."""
    rows = []
    for link in chain.links:
        name = link.rule.derived.spec.name
        hyper = "{" + ", ".join(f'"{key}": {value}' for key, value in link.hyper) + "}"
        offset = f" {link.offset}," if offsets else ""
        rows.append(f'("{name}", "{link.prefix}",{offset} {hyper})')
    return Chain(chain.table, tuple(rows), chain.links[0].prefix, chain.links[-1].prefix, len(chain.links))


def _small_inputs(graph, positional: list[str]) -> str:
    """``SMALL_INPUTS``: each data input at small sizes with every parameter at its own
    (:func:`symgrad.shapes.data_shapes`), with the class count of an int64 input (None for a float one),
    as a literal; what ``symgrad.bind`` checks a binding at (:mod:`symgrad.verify`). "": no parameters."""
    from .shapes import data_shapes

    if not any(item.source for item in graph.spec.inputs):
        return ""
    shapes = data_shapes(graph)
    classes = graph.class_counts({**{node.name: node.shape for node in graph.inputs}, **shapes})
    listed = ", ".join(
        f'"{name}": ({list(shapes[name])}, {classes.get(name)})' for name in positional if name in shapes
    )
    return "{" + listed + "}" if listed else ""
