"""Rendering a :class:`~symgrad.plan_blocks.Structured` plan into the module, its test file and
its documents: each block's forward and backward function once, then the top level, printed from
the plan (``statements`` renamed to the names the code uses: ``p["conv1.weight"]``).
"""

from __future__ import annotations

import dataclasses

import sympy

from .blocks import HyperInt
from .fingerprint import module_constants
from .plan_blocks import Structured
from .reverse import GRAD_LOSS
from .structure import GRAD_OUTPUT, BlockRule, ChainRule, DerivedBlock
from .algebra import TensorOp, tensor


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
    from .emit import printed_lines

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
        forward=printed_lines(_renamed_statements(forward, entries), overwrite=True),
        saved_names=saved_names,
        backward=printed_lines(_one_line(_renamed_statements(backward, entries))),
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


def render_files(structured: Structured, spec_label: str) -> dict[str, str]:
    """Every file generated for a spec with blocks, keyed by file name: the module, its test file and its
    documents (:mod:`symgrad.documents`) printed, then each under the header ``symgrad check`` reads."""
    from .documents import headed, render_tests

    spec = structured.spec
    body, blocks, top_lines = render_structured(structured, spec_label)
    files = {f"{spec.name}.py": body}
    sources = {item.name: item.source for item in spec.inputs if item.source}  # the parameters in `params`
    files.update(render_tests(structured.test_data, sources))
    files.update(_documents(structured, spec_label, blocks, top_lines))
    return headed(files, spec, spec_label)


def render_structured(structured: Structured, spec_label: str) -> tuple[str, list[dict], list]:
    """The structured module's text (without its header), each block's view and the top level's
    backward lines as printed (the documents show them)."""
    from . import __version__
    from .documents import environment
    from .emit import printed_line, printed_lines
    from .printing import to_code

    spec, graph, planned = structured.spec, structured.graph, structured.planned
    sources = {item.name: item.source for item in spec.inputs if item.source}
    positional = [item.name for item in spec.inputs if not item.source]
    signature = ", ".join(positional + (["params"] if sources else []))
    backward, merged, param_returns = structured.backward, structured.merged_returns, structured.param_returns
    offsets = any(layer.block and layer.offset for layer in spec.layers)

    # each parameter read where it is used, as the mapping's entry (`params["fc.weight"]`)
    entries = {tensor(name): tensor(f'params["{source}"]') for name, source in sources.items()}
    blocks = [_block_view(block) for block in structured.blocks.values()]
    helpers = structured.helpers
    from .emit import outputs_context

    context = dict(
        **outputs_context(spec, structured.flat_graph),
        name=spec.name, version=__version__, spec_label=spec_label, helpers=helpers,
        fingerprint=module_constants(spec, any_width=True),
        has_params=bool(sources), block_names=[block["name"] for block in blocks], blocks=blocks,
        forward=[printed_line(dataclasses.replace(statement, value=statement.value.xreplace(entries)))
                 for statement in planned.forward],
        saving_forward=printed_lines(_renamed_statements(planned.saving_forward, entries), overwrite=True),
        saved_names=planned.saved_names, loss_name=planned.loss_name,
        backward=printed_lines(_one_line(_renamed_statements(backward, entries))), boundary_dead=planned.boundary_dead,
        default_cotangent=to_code(planned.program.default_cotangent),
        signature=signature, reduction=graph.loss.params["reduction"],
        positional_wrt=[name for name in graph.wrt if name not in sources],
        positional_returns=[(name, f"grad_{name}") for name in graph.wrt if name not in sources],
        param_returns=param_returns, merged_returns=merged, offsets=offsets,
        chains=[_chain_view(chain) for chain in structured.chains],
        positional=positional,
        momentum_lines=_packed(_momenta(structured.running_statistics, sources)),
        function_grads=", ".join(f"grads.{name}" if name in graph.wrt else "None" for name in positional),
        **_layout_view(structured, sources, positional),
    )
    body = environment().get_template("structured.py.jinja").render(**context)
    return body, blocks, context["backward"]


def _layout_view(structured: Structured, sources: dict[str, str], positional: list[str]) -> dict:
    """The per-call layout rule of the flat module (:func:`symgrad.roles.channels_last_rule`), for
    the structured one: the ``params`` keys of the 2-d convolution weights it moves to channels_last,
    the test on the call's shapes, the keys the top level's own backward reads again, and the
    positional inputs whose gradients go back to their caller's layout."""
    rule = structured.layout
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
        channels_last_test=rule.test(), channels_last_constant=structured.layout_constant,
        backward_channels_last=[sources[name] for name in sources if name in read_in_backward and sources[name] in keys],
        layout_kept=[name for name in positional if name in structured.graph.wrt and len(shapes[name]) == 4] if keys else [],
    )


def _documents(structured: Structured, spec_label: str, blocks: list[dict], top_lines: list) -> dict[str, str]:
    """``<name>.md`` and ``<name>.html``: each block's derivation once (``blocks``: their views, in
    order), then the top level's (``top_lines``: its backward as printed)."""
    from .documents import Section, render_documents

    spec = structured.spec
    instances: dict[str, list[str]] = {}
    for layer in spec.layers:
        if layer.block:
            instances.setdefault(layer.block, []).append(layer.out)
    sections = [Section(f"Block {name}", f"block-{name}", block.planned, tuple(line.text for line in view["backward"]),
                        instances=tuple(instances[name]), inputs=tuple(block.spec.inputs),
                        params=tuple(key for _, key in block.spec.params),
                        hyper=tuple(f"{hyper} (default {default})" for hyper, default in block.spec.hyper))
                for (name, block), view in zip(structured.blocks.items(), blocks)]
    # an instance's parameters take their gradients straight from its block's backward: named, not derived
    named = {node.name: (node.rule.derived.spec.param_names if isinstance(node.rule, BlockRule)
                         else tuple(node.rule.keys))
             for node in structured.graph.nodes.values() if isinstance(node.rule, (BlockRule, ChainRule))}
    # no SVG of the top level: grandalf lays out its graph differently from run to run (the files must not change)
    sections.append(Section("Top level", "top-level", structured.planned, tuple(line.text for line in top_lines),
                            named_parameters=named, svg=False))
    return render_documents(spec, spec_label, sections)
