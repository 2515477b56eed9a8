"""Rendering a :class:`~symgrad.plan.Structured` plan into the module, its test file and
its documents: the module's sections decided and printed first (:func:`symgrad.render_sections.module_sections`,
one frozen dataclass a section), then ``templates/module.py.jinja`` reads each section's dataclass and prints it.
"""

from __future__ import annotations

from .plan import Structured
from .render_sections import Module, module_sections


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
    body, model, where = render_structured(structured, spec_label)
    files = {f"{spec.name}.py": body}
    sources = {item.name: item.source for item in spec.inputs if item.source}  # the parameters in `params`
    planned = structured.planned
    per_sample = (planned.per_sample_names, planned.per_sample_batched) if planned.per_sample_forward else None
    if structured.test_data:  # planned without tests (pipeline's tests=False): the module alone
        files.update(render_tests(structured.test_data, sources, hvp=bool(planned.hvp_results), per_sample=per_sample))
    if documents:  # the documents link to the module's lines as written, below its header
        module = headed({f"{spec.name}.py": body}, spec, spec_label, recorded_extras)[f"{spec.name}.py"]
        header = module.count("\n") - body.count("\n")
        lines = {key: {role: line + header for role, line in at.items()} for key, at in where.items()}
        files.update(_documents(structured, spec_label, model, lines))
    readable = [printed_line(statement) for statement in structured.docstring[1]]
    latex = (
        "\\begin{aligned}\n"
        + " \\\\\n".join(f"{line.latex_target} &= {line.latex}" for line in readable)
        + "\n\\end{aligned}"
    )
    top_lines = model.functions.saving.backward
    return Rendered(
        spec.name, headed(files, spec, spec_label, recorded_extras), [line.text for line in top_lines], latex
    )


def render_structured(structured: Structured, spec_label: str) -> tuple[str, Module, dict]:
    """The module's text (without its header), its model (:class:`~symgrad.render_sections.Module`),
    and the line of the text where each of its printed lines landed, counted as the text was printed
    (:func:`symgrad.documents.placed_lines`: {id of the :class:`~symgrad.emit.Line`: {``"comment"`` or
    ``"statement"``: its first line, 1-based}})."""
    from .documents import placed_lines

    module = module_sections(structured, spec_label)
    body, where = placed_lines("module.py.jinja", module=module)
    return body, module, where


def _documents(structured: Structured, spec_label: str, model: Module, lines: dict) -> dict[str, str]:
    """``<name>.md`` and ``<name>.html``: each block body's derivation once (``model.blocks.functions``:
    their functions, in order), then the top body's (``model.functions.saving``: its backward as printed,
    each line's derivation step), the only section of an inlined program; each section's nodes linked to
    ``lines``, where each printed line landed in the module as written (:func:`render_structured`)."""
    from .documents import Section, render_documents
    from .overview import node_lines

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
            lines=node_lines(view.backward, lines),
        )
        for (name, block), view in zip(structured.blocks.items(), model.blocks.functions)
    ]
    saving = model.functions.saving
    title, anchor = ("Top level", "top-level") if sections else (spec.name, "")  # the only section: the network's
    sections.append(
        Section(
            title,
            anchor,
            structured.planned,
            tuple(line.text for line in saving.backward),
            tuple(saving.backward_steps),
            lines=node_lines(saving.backward, lines),
        )
    )
    return render_documents(spec, spec_label, sections, structured.flat_graph)
