"""Rendering a :class:`~symgrad.plan.Structured` plan into the module, its test file and
its documents: each block's forward and backward function once, then the top level, printed from
the plan (``statements`` renamed to the names the code uses: ``p["conv1.weight"]``).
"""

from __future__ import annotations

import dataclasses

from .algebra import tensor
from .emit import packed
from .fingerprint_text import module_constants
from .plan import BlockPlan, LayoutPlan, Structured, TopPlan
from .rules.call import BlockRule, ChainRule, DerivedBlock


def _guard_view(positional: list[str], wrt: list[str], keyed: bool) -> dict:
    """The named inputs the spec does not differentiate by, and their positions among the autograd
    Function's arguments (after ``recompute``, and ``keys`` where there are parameters): its backward
    refuses a call that asks for their gradients."""
    guarded = [(index, name) for index, name in enumerate(positional, start=2 if keyed else 1) if name not in wrt]
    return dict(
        guarded=guarded,
        guarded_names=", ".join(name for _, name in guarded),
        guarded_indices=", ".join(str(index) for index, _ in guarded) + ("," if len(guarded) == 1 else ""),
    )


def _trailing_comments(lines: list, indent: int = 4, width: int = 100) -> list:
    """The forward's lines, each with its comment (``spec line 12``) where it fits after the code on
    one line, and none where it does not: a line of its own for it would be noise."""
    return [
        line if indent + len(line.text) + 4 + len(line.comment) <= width else dataclasses.replace(line, comment="")
        for line in lines
    ]


def _one_line(scheduled, indent: int = 4, width: int = 100) -> list:
    """``scheduled`` with each comment on one line: one too long for it loses its closing remark in
    parentheses (``(autograd's own kernel, twice differentiable)``, which the helper it calls says)."""
    result = []
    for item in scheduled:
        comment = item.statement.comment
        head, found, remark = comment.removesuffix(")").rpartition(" (")
        if indent + 2 + len(comment) > width and comment.endswith(")") and found and not {"(", ")"} & set(remark):
            comment = head
        result.append(
            item
            if comment == item.statement.comment
            else dataclasses.replace(item, statement=dataclasses.replace(item.statement, comment=comment))
        )
    return result


def _block_view(derived: DerivedBlock, decided: BlockPlan) -> dict:
    """A block's two functions, printed from what planning decided (:class:`~symgrad.plan.BlockPlan`)."""
    from .emit import printed_lines

    block, planned = derived.spec, derived.planned
    return dict(
        name=block.name,
        inputs=list(block.inputs),
        output=block.output,
        hyper=[f"{name}={default}" for name, default in block.hyper],
        forward=printed_lines(decided.forward),
        saved_names=list(decided.saved_names),
        saved_returned=[
            f"_saved_as_autocast_casts({name})" if name in planned.saved_as_autocast_casts else name
            for name in decided.saved_names
        ],
        backward=printed_lines(_one_line(decided.backward)),
        returns=_entries(list(decided.returns), 8),
    )


def _entries(pairs: list, indent: int, merged: tuple = ()) -> list[str]:
    """A returned mapping's entries (``"conv1.weight": grad_conv1_weight,``, then ``**grads,``) as
    many to a line as fit at column ``indent``; one a line (its value below a long key) where one
    alone does not fit."""
    from .printing import entry

    entries = [f'"{key}": {value},' for key, value in pairs] + [f"**{text}," for text in merged]
    if all(indent + len(text) <= 100 for text in entries):
        return packed(entries, indent)
    return [entry(key, value, indent) for key, value in pairs] + [f"**{text}," for text in merged]


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


def _constants_view(structured: Structured, sources: dict) -> dict:
    """What bind reads off the module (:func:`~symgrad.fingerprint_text.module_constants`), and ``MOMENTA``:
    read off ``FINGERPRINT`` where its BatchNorms run in training mode are the ones the forward moves,
    all with one momentum, else listed (``momentum_lines``)."""
    statistics = structured.running_statistics
    shared = _shared_momentum(statistics, sources)
    modules = list(dict.fromkeys(sources[mean].rsplit(".", 1)[0] for mean, _, _ in statistics if mean in sources))
    instances = {
        link.prefix: link.rule.derived.spec.name
        for chain in structured.chains
        for link in chain.links
        if not link.offset
    }
    text, read = module_constants(
        structured.spec,
        any_width=True,
        running=frozenset(name for item in statistics for name in item[:2]),
        instances=instances,
        momenta=(modules, shared) if shared is not None else None,
    )
    return dict(
        fingerprint=text,
        momentum_lines=[] if read else packed(_momenta(statistics, sources)),
        momentum_shared=shared,
        momenta_read=read,
    )


def render_files(
    structured: Structured, spec_label: str, recorded_extras: tuple[str, ...] = (), documents: bool = True
):
    """Every file generated for a spec (a :class:`~symgrad.emit.Rendered`), keyed by file name: the
    module, its test file and (``documents``) its documents (:mod:`symgrad.documents`) printed, then
    each under the header ``symgrad check`` reads; with the backward as printed, and its readable
    form in LaTeX."""
    from .documents import headed, render_tests
    from .emit import Rendered, printed_line

    spec = structured.spec
    body, blocks, top_lines, steps = render_structured(structured, spec_label)
    files = {f"{spec.name}.py": body}
    sources = {item.name: item.source for item in spec.inputs if item.source}  # the parameters in `params`
    planned = structured.planned
    per_sample = (planned.per_sample_names, planned.per_sample_batched) if planned.per_sample_forward else None
    if structured.test_data:  # planned without tests (pipeline's tests=False): the module alone
        files.update(render_tests(structured.test_data, sources, hvp=bool(planned.hvp_results), per_sample=per_sample))
    if documents:  # the documents link to the module's lines as written, its header included
        module = headed({f"{spec.name}.py": body}, spec, spec_label, recorded_extras)[f"{spec.name}.py"]
        files.update(_documents(structured, spec_label, blocks, top_lines, steps, module))
    readable = [printed_line(statement) for statement in structured.docstring[1]]
    latex = (
        "\\begin{aligned}\n"
        + " \\\\\n".join(f"{line.latex_target} &= {line.latex}" for line in readable)
        + "\n\\end{aligned}"
    )
    return Rendered(
        spec.name, headed(files, spec, spec_label, recorded_extras), [line.text for line in top_lines], latex
    )


def render_structured(structured: Structured, spec_label: str) -> tuple[str, list[dict], list, list]:
    """The module's text (without its header), each block's view, the top body's backward lines
    as printed (the documents show them) and each line's derivation step."""
    from . import __version__
    from .documents import environment
    from .emit import printed_line, printed_lines
    from .printing import to_code

    spec, graph, planned = structured.spec, structured.graph, structured.planned
    sources = {item.name: item.source for item in spec.inputs if item.source}
    positional = [item.name for item in spec.inputs if not item.source]
    signature = ", ".join(positional + (["params"] if sources else []))
    merged, param_returns = structured.merged_returns, structured.param_returns
    offsets = any(layer.block and layer.offset for layer in spec.layers)

    # each parameter read where it is used, as the mapping's entry (`params["fc.weight"]`)
    entries = structured.top_plan.entries
    blocks = [_block_view(block, structured.block_plans[name]) for name, block in structured.blocks.items()]
    helpers = [helper.strip("\n") for helper in structured.helpers]  # the template puts one blank line before each
    from .emit import outputs_context

    # an inlined program: the docstring lists its derivation, as its documents do (``Structured.docstring``)
    readable = [
        [printed_line(dataclasses.replace(statement, value=statement.value.xreplace(entries))) for statement in part]
        for part in structured.docstring
    ]
    steps = list(planned.step_of_line)
    printed_backward = printed_lines(_one_line(list(structured.top_plan.backward)), steps)
    layout = _layout_view(structured.layout_plan)
    context = dict(
        **outputs_context(spec, structured.flat_graph),
        readable_forward=readable[0],
        readable_backward=readable[1],
        wrt=list(graph.wrt),
        **_guard_view(positional, list(graph.wrt), bool(sources)),
        **_function_view(positional, sources, structured.running_statistics),
        **_extras_view(planned, entries, sources, positional, structured.top_plan),
        name=spec.name,
        version=__version__,
        spec_label=spec_label,
        helpers=helpers,
        **_constants_view(structured, sources),
        has_params=bool(sources),
        block_names=[block["name"] for block in blocks],
        blocks=blocks,
        forward=_trailing_comments(
            [
                printed_line(dataclasses.replace(statement, value=statement.value.xreplace(entries)))
                for statement in planned.forward
            ]
        ),
        saving_forward=printed_lines(list(structured.top_plan.saving_forward)),
        saved_names=planned.saved_names,
        loss_name=planned.loss_name,
        backward=printed_backward,
        boundary_dead=planned.boundary_dead,
        default_cotangent=to_code(planned.program.default_cotangent),
        signature=signature,
        reduction=graph.loss.params["reduction"],
        positional_wrt=[name for name in graph.wrt if name not in sources],
        positional_returns=[
            (
                name,
                f"grad_{name}.contiguous(memory_format={name}_layout)"
                if name in layout["layout_kept"]
                else f"grad_{name}",
            )
            for name in graph.wrt
            if name not in sources
        ],
        param_returns=_entries(list(param_returns), 12, tuple(merged)),
        offsets=offsets,
        chains=[_chain_view(chain) for chain in structured.chains],
        positional=positional,
        function_grads=", ".join(f"grads.{name}" if name in graph.wrt else "None" for name in positional),
        device_of=positional[0] if positional else "values[0]",  # an output that reads no data input
        rebuilt=list(
            dict.fromkeys(
                planned.rebuilt + [name for block in structured.blocks.values() for name in block.planned.rebuilt]
            )
        ),
        small_inputs=_small_inputs(structured.flat_graph, positional)  # bind's verify: the outputs form alone
        if structured.spec.fingerprint and structured.spec.outputs is not None
        else "{}",
        **layout,
    )
    # one blank line between top-level definitions: each optional section carries its own
    body = environment().get_template("module.py.jinja").render(**context)
    return body, blocks, context["backward"], steps


def _small_inputs(graph, positional: list[str]) -> str:
    """``SMALL_INPUTS``: each data input at small sizes with every parameter at its own
    (:func:`symgrad.shapes.data_shapes`), with the class count of an int64 input (None for a float one),
    as a literal; what ``symgrad.bind`` checks a binding at (:mod:`symgrad.verify`)."""
    from .shapes import data_shapes

    if not any(item.source for item in graph.spec.inputs):
        return "{}"
    shapes = data_shapes(graph)
    classes = graph.class_counts({**{node.name: node.shape for node in graph.inputs}, **shapes})
    return (
        "{"
        + ", ".join(f'"{name}": ({list(shapes[name])}, {classes.get(name)})' for name in positional if name in shapes)
        + "}"
    )


def _extras_view(planned, entries: dict, sources: dict, positional: list[str], top: TopPlan) -> dict:
    """``hvp`` and ``per_sample_gradients`` (a spec without blocks; ``Plan``'s extras), printed with
    the names the code uses: a parameter's tangent is its entry of ``tangent_params``, keyed as
    ``params`` is, and its gradients come back keyed so too."""
    from .emit import printed_line, printed_lines
    from .printing import to_code

    wrt = list(planned.program.graph.wrt)
    tangents = {
        tensor(f"tangent_{name}"): tensor(f'tangent_params["{sources[name]}"]') for name in wrt if name in sources
    }
    names = {**entries, **tangents}

    def returned(values: dict, params: bool) -> str:
        named = [f"{name}={value}" for name, value in values.items() if name not in sources]
        keyed = [f'"{sources[name]}": {value}' for name, value in values.items() if name in sources]
        return ", ".join(named + (["params={" + ", ".join(keyed) + "}"] if params else []))

    hvp = {
        name: (
            to_code(value.xreplace(names))
            if value != 0
            else f"torch.zeros_like({to_code(tensor(name).xreplace(entries))})"
        )
        for name, value in planned.hvp_results.items()
    }
    per_sample = planned.per_sample_names
    return dict(
        hvp=bool(hvp),
        hvp_lines=(
            [printed_line(dataclasses.replace(s, value=s.value.xreplace(names))) for s in planned.hvp_forward],
            [printed_line(dataclasses.replace(s, value=s.value.xreplace(names))) for s in planned.hvp_backward],
        ),
        hvp_return=returned(hvp, bool(sources)),
        tangent_signature=", ".join(
            [f"tangent_{name}" for name in positional if name in wrt]
            + (["tangent_params"] if any(name in sources for name in wrt) else [])
        ),
        per_sample=bool(planned.per_sample_forward),
        per_sample_forward=printed_lines(list(top.per_sample_forward)),
        per_sample_backward=printed_lines(list(top.per_sample_backward)),
        per_sample_dead=planned.per_sample_dead,
        per_sample_fields=[name for name in per_sample if name not in sources],
        per_sample_params=any(name in sources for name in per_sample),
        per_sample_return=returned(
            {name: f"per_sample_grad_{name}" for name in per_sample}, any(name in sources for name in per_sample)
        ),
        per_sample_described=", ".join(
            name if name not in sources else f'``params["{sources[name]}"]``' for name in per_sample
        ),
    )


def _function_view(positional: list[str], sources: dict, statistics) -> dict:
    """The autograd Function's argument lists: with parameters, a tuple of their keys and their
    values after the named inputs; a running statistic passed by name is saved as None (a train-mode
    forward does not read it, and one re-run in the backward must not move it again)."""
    running = {name for mean, var, _ in statistics for name in (mean, var)}
    saved = [("None" if name in running else name) for name in positional]
    if sources:
        return dict(
            function_inputs=", ".join(["keys", *positional, "*values"]),
            saved_inputs=", ".join([*saved, "*kept"]),
        )
    comma = "," if len(positional) == 1 else ""
    return dict(
        function_inputs=", ".join(positional),
        saved_inputs=", ".join(saved) + comma,
    )


def _layout_view(decided: LayoutPlan) -> dict:
    """The template's view of the layout rule planning decided (:class:`~symgrad.plan.LayoutPlan`)."""
    listed = bool(decided.others)  # where the weights are all the 4-d entries of `params`, no table
    return dict(
        channels_last_keys=list(decided.keys),
        channels_last_lines=packed([f'"{key}",' for key in decided.keys]) if listed else [],
        channels_last_others=", ".join(decided.others),
        moved_test="key in CHANNELS_LAST" if listed else "value.dim() == 4",
        channels_last_test=decided.test,
        channels_last_constant=decided.constant,
        backward_channels_last=list(decided.backward_keys),
        layout_kept=list(decided.kept),
        channels_last_named=list(decided.named),
        backward_channels_last_named=list(decided.backward_named),
    )


def _documents(
    structured: Structured, spec_label: str, blocks: list[dict], top_lines: list, steps: list, module: str = ""
) -> dict[str, str]:
    """``<name>.md`` and ``<name>.html``: each block body's derivation once (``blocks``: their views,
    in order), then the top body's (``top_lines``: its backward as printed, each line's derivation
    step in ``steps``), the only section of an inlined program."""
    from .documents import Section, render_documents

    spec = structured.spec
    instances: dict[str, list[str]] = {}
    for layer in spec.layers:
        if layer.block:
            instances.setdefault(layer.block, []).append(layer.out)
    sections = [
        Section(
            f"Block {name}",
            f"block-{name}",
            block.planned,
            tuple(line.text for line in view["backward"]),
            instances=tuple(instances[name]),
            inputs=tuple(block.spec.inputs),
            params=tuple(key for _, key in block.spec.params),
            hyper=tuple(f"{hyper} (default {default})" for hyper, default in block.spec.hyper),
        )
        for (name, block), view in zip(structured.blocks.items(), blocks)
    ]
    # an instance's parameters take their gradients straight from its block's backward: named, not derived
    named = {
        node.name: (node.rule.derived.spec.param_names if isinstance(node.rule, BlockRule) else tuple(node.rule.keys))
        for node in structured.graph.nodes.values()
        if isinstance(node.rule, (BlockRule, ChainRule))
    }
    title, anchor = ("Top level", "top-level") if sections else (spec.name, "")  # the only section: the network's
    sections.append(
        Section(
            title,
            anchor,
            structured.planned,
            tuple(line.text for line in top_lines),
            tuple(steps),
            named_parameters=named or None,
        )
    )
    return render_documents(spec, spec_label, sections, module, structured.flat_graph)
