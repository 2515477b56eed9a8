"""Rendering a :class:`~symgrad.plan.Structured` plan into the module, its test file and
its documents: the module's sections decided and printed first (:func:`symgrad.render_sections.module_sections`,
one frozen dataclass a section), then ``templates/module.py.jinja`` reads each section's dataclass and prints it.
"""

from __future__ import annotations

from .plan import Structured
from .render_sections import BlockFunctions, Module, module_sections
from .rules.call import BlockRule, ChainRule


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
    body, model, top_lines, steps = render_structured(structured, spec_label)
    files = {f"{spec.name}.py": body}
    sources = {item.name: item.source for item in spec.inputs if item.source}  # the parameters in `params`
    planned = structured.planned
    per_sample = (planned.per_sample_names, planned.per_sample_batched) if planned.per_sample_forward else None
    if structured.test_data:  # planned without tests (pipeline's tests=False): the module alone
        files.update(render_tests(structured.test_data, sources, hvp=bool(planned.hvp_results), per_sample=per_sample))
    if documents:  # the documents link to the module's lines as written, its header included
        module = headed({f"{spec.name}.py": body}, spec, spec_label, recorded_extras)[f"{spec.name}.py"]
        files.update(_documents(structured, spec_label, model.blocks.functions, top_lines, steps, module))
    readable = [printed_line(statement) for statement in structured.docstring[1]]
    latex = (
        "\\begin{aligned}\n"
        + " \\\\\n".join(f"{line.latex_target} &= {line.latex}" for line in readable)
        + "\n\\end{aligned}"
    )
    return Rendered(
        spec.name, headed(files, spec, spec_label, recorded_extras), [line.text for line in top_lines], latex
    )


def render_structured(structured: Structured, spec_label: str) -> tuple[str, Module, list, list]:
    """The module's text (without its header), its model (:class:`~symgrad.render_sections.Module`),
    the top body's backward lines as printed (the documents show them) and each line's derivation step."""
    from .documents import environment

    module = module_sections(structured, spec_label)
    body = environment().get_template("module.py.jinja").render(module=module)
    return body, module, list(module.functions.saving.backward), list(module.functions.saving.backward_steps)


def _documents(
    structured: Structured,
    spec_label: str,
    blocks: tuple[BlockFunctions, ...],
    top_lines: list,
    steps: list,
    module: str = "",
) -> dict[str, str]:
    """``<name>.md`` and ``<name>.html``: each block body's derivation once (``blocks``: their functions,
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
            tuple(line.text for line in view.backward),
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
