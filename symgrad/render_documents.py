"""The derivation documents (``<name>.md``, ``<name>.html``) as a model: one frozen dataclass a section
of ``templates/derivation.{md,html}.jinja`` (:class:`Document`), built with every decision made here:
which formulas the notation defines, the Markdown's LaTeX or the page's MathML, the joined lists, the
numbering, each code line's link. The templates (``templates/derivation_md/``, ``templates/derivation_html/``,
a macro a section) only print them.

A spec without blocks has one :class:`Derivation`, step by step; a spec with blocks an :class:`Overview`,
its :class:`OpKinds` derived once and each block's and the top level's :class:`StepTable`.
"""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import escape

from . import __version__
from .diagram import mermaid, svg
from .mathml import CSS as MATHML_CSS, aligned, mathml
from .printing import to_code, to_latex
from .schedule import Plan


@dataclass(frozen=True)
class Section:
    """One derivation the documents show: a spec's without blocks, a block's, or the top level's of
    a spec with blocks."""

    title: str
    anchor: str
    """The section's HTML id and the prefix of its own ids (empty: the only section)."""
    planned: Plan
    emitted: tuple[str, ...]
    """The backward as the module runs it, one printed statement a line."""
    step_of_line: tuple[int | None, ...] | None = None
    """Each emitted line's derivation step (1-based); None: not known, the lines are not linked."""
    instances: tuple[str, ...] = ()
    """A block's instances (a block's section has at least one)."""
    inputs: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    hyper: tuple[str, ...] = ()
    lines: dict | None = None
    """{forward node: (the generated module's line of its first comment, of its last statement)}, as
    written (:func:`symgrad.overview.node_lines`): a block spec's step tables link to them."""


NOTATION = (
    ("", r"$\overline{v}$ is the gradient of the loss with respect to node $v$ (same shape as $v$)"),
    (r"\odot", r"$\odot$ is the elementwise product"),
    (
        r"\star",
        r"$w \star_{s,p,d,g} x$ is PyTorch's convolution (cross-correlation) with stride, padding, "
        r"dilation and groups, $w^{\top} \star$ its adjoint in the input (a transposed convolution) and "
        r"$x \star^{w} \overline{y}$ its adjoint in the weight",
    ),
    (
        (r"\mathrm{local}_", r"\mathrm{mask}_"),
        r"$\mathrm{local}_{v}$ and $\mathrm{mask}_{v}$ name a local gradient "
        r"of node $v$, computed once and reused",
    ),
    (
        "A_{",
        r"$A_{k}$ is the matrix of a separable resampling or pooling op along spatial axis $k$ (the code "
        r"reads it off at run time by applying the op to the identity), so $A_{k}^{\top}$ carries the "
        r"gradient back along that axis",
    ),
    (r"\operatorname{mean}_{D}", r"$\operatorname{mean}_{D}$ averages over the normalised axes $D$"),
)
"""Each symbol the documents use, with the LaTeX that shows a document uses it: a document defines the
symbols its formulas use, and no others."""


def notation(latex: str) -> str:
    """The notation sentence for a document whose formulas are ``latex``: its symbols' terms only."""
    terms = [
        text
        for triggers, text in NOTATION
        if any(trigger in latex for trigger in ((triggers,) if isinstance(triggers, str) else triggers))
    ]
    return ("; ".join(terms[:-1]) + ", and " + terms[-1] if len(terms) > 1 else terms[0]) + "."


def notation_html(sentence: str) -> str:
    """A :func:`notation` sentence for the HTML page: its math as MathML, the prose escaped."""
    parts = sentence.split("$")
    return "".join(mathml(part) if index % 2 else str(escape(part)) for index, part in enumerate(parts))


@dataclass(frozen=True)
class Header:
    """The title, the notation the formulas use, the checked Functions' sentences (and the page's style)."""

    name: str
    version: str
    spec_label: str
    blocked: bool
    """Written as its blocks: the title says so, the page styles the block sections."""
    notation: str
    """The notation sentence: LaTeX in the Markdown, MathML and escaped prose on the page."""
    checked_functions: tuple[str, ...]
    mathml_css: str


@dataclass(frozen=True)
class InstanceRow:
    instance: str
    block: str
    hyper: str
    """``name=value, ...``; empty: none."""
    shape: str


@dataclass(frozen=True)
class ContentsEntry:
    """The page's table of contents: a block's or the top level's section, its instance count (0: the top)."""

    anchor: str
    title: str
    count: int


@dataclass(frozen=True)
class Overview:
    """A block spec's overview: the top-level graph (Mermaid or SVG) with each parameter folded into its op,
    and the block instances in forward order."""

    module_file: str
    graph: str
    instances: tuple[InstanceRow, ...]
    contents: tuple[ContentsEntry, ...]


@dataclass(frozen=True)
class Contribution:
    operand: str
    source: str
    formula: str
    """LaTeX in the Markdown, MathML on the page."""
    branch: int = 0
    """How many paths meet ``source`` (0 or 1: one)."""


@dataclass(frozen=True)
class OpKind:
    """One op kind, derived once on its first node."""

    title: str
    anchor: str
    node: str
    forward: str
    where: str
    uses: str
    """``1 node``, ``3 nodes``: of this kind, in the blocks and the top level."""
    incoming: str
    locals: tuple[str, ...]
    contributions: tuple[Contribution, ...]


@dataclass(frozen=True)
class OpKinds:
    kinds: tuple[OpKind, ...]


@dataclass(frozen=True)
class StepRow:
    number: int
    node: str
    forward: str
    kind: str
    """The op kind's or the block's link (Markdown, or the page's HTML)."""
    line: int | None
    """The module's line pulling the node back; None: not found."""


@dataclass(frozen=True)
class BranchRow:
    node: str
    consumers: str
    """The nodes it feeds, joined."""


@dataclass(frozen=True)
class StepTable:
    """A block's or the top level's compact step table."""

    title: str
    anchor: str
    instances: tuple[str, ...]
    """A block's instances; none: the top level."""
    count: int
    inputs: str
    params: str
    """Joined, or ``none``."""
    hyper: str
    """Joined; empty: none."""
    output: str
    loss: str
    """The top level's loss: LaTeX in the Markdown, a MathML block on the page."""
    per_sample: bool
    rows: tuple[StepRow, ...]
    branch_rows: tuple[BranchRow, ...]


@dataclass(frozen=True)
class StepTables:
    module_file: str
    sections: tuple[StepTable, ...]


@dataclass(frozen=True)
class NodeRow:
    name: str
    kind: str
    op: str
    shape: str
    stored: str


@dataclass(frozen=True)
class Step:
    number: int
    node: str
    forward: str
    incoming: str
    locals: tuple[str, ...]
    contributions: tuple[Contribution, ...]
    lines: tuple[int, ...]


@dataclass(frozen=True)
class Readable:
    target: str
    latex: str


@dataclass(frozen=True)
class CodeLine:
    number: int
    href: str
    text: str


@dataclass(frozen=True)
class Derivation:
    """A spec without blocks, derived step by step: graph, node table, steps, branch sums, the gradients as
    emitted."""

    heading: str
    """The Markdown's heading of a part (``##``)."""
    level: int
    """The page's heading level of a part; a step's is one more."""
    step_level: int
    prefix: str
    graph: str
    node_rows: tuple[NodeRow, ...]
    forward: tuple[str, ...]
    loss: str
    per_sample: bool
    steps: tuple[Step, ...]
    linked: bool
    branch_rows: tuple[BranchRow, ...]
    gradients_number: int
    """The last part's number: 4 after the branch sums, else 3."""
    readable: tuple[Readable, ...]
    gradients: str
    """The page's MathML of ``readable``."""
    emitted: tuple[str, ...]
    code_lines: tuple[CodeLine, ...]


@dataclass(frozen=True)
class Document:
    """One derivation document: its header, then a block spec's overview, op kinds and step tables, or a
    flat spec's derivation."""

    header: Header
    overview: Overview | None
    kinds: OpKinds | None
    tables: StepTables | None
    derivation: Derivation | None


def documents(spec, spec_label: str, sections: list[Section], flat_graph=None) -> dict[str, Document]:
    """The :class:`Document` of ``<name>.md`` and of ``<name>.html``, keyed by suffix. Without blocks: its one
    section's derivation. With blocks (``sections``: each block's, then the top level's): the overview,
    each op kind derived once, each section's step table linked to its lines of the generated module
    (``Section.lines``); ``flat_graph``: the spec with every block written out."""
    blocked = len(sections) > 1 or bool(sections[0].instances)
    built = {}
    for suffix, html in (("md", False), ("html", True)):
        if blocked:
            overview, kinds, tables = _blocked(spec, sections, flat_graph, html)
            built[suffix] = (overview, kinds, tables, None)
        else:
            built[suffix] = (None, None, None, _derivation(sections[0], html))
    sentence = notation(_latex_of(*built["md"]))
    checked = getattr(spec, "checked_functions", ())
    return {
        suffix: Document(
            Header(
                spec.name,
                __version__,
                spec_label,
                blocked,
                notation_html(sentence) if suffix == "html" else sentence,
                tuple(_functions_view(function.sentence(), suffix == "html") for function in checked),
                MATHML_CSS,
            ),
            *parts,
        )
        for suffix, parts in built.items()
    }


def _latex_of(overview, kinds: OpKinds | None, tables: StepTables | None, derivation: Derivation | None) -> str:
    """Every formula the Markdown document shows, as one text (what :func:`notation` reads)."""
    parts = []
    for kind in kinds.kinds if kinds else ():
        parts += [kind.incoming, *kind.locals, *(item.formula for item in kind.contributions)]
    for table in tables.sections if tables else ():
        parts.append(table.loss)
    if derivation is not None:
        parts += [derivation.loss, *(item.latex for item in derivation.readable)]
        for step in derivation.steps:
            parts += [step.incoming, *step.locals, *(item.formula for item in step.contributions)]
    return "\n".join(parts)


def _blocked(spec, sections: list[Section], flat_graph, html: bool):
    """The parts of a block spec's documents (:mod:`symgrad.overview`): the overview graph with the
    parameters folded into their ops, the block table, each op kind's derivation once, and each
    block's and the top level's step table."""
    from .diagram import folded
    from .overview import instance_rows, step_rows

    page = mathml if html else (lambda latex: "")
    *blocks, top = sections
    names = {section.anchor.removeprefix("block-"): section for section in blocks}
    kinds: dict[str, dict] = {}
    tables = []
    for section in [*blocks, top]:
        rows = step_rows(section, kinds, {name: name for name in names}, page)
        program = section.planned.program
        loss = program.forward[-1].value
        tables.append(
            StepTable(
                title=section.title,
                anchor=section.anchor,
                instances=tuple(section.instances),
                count=len(section.instances),
                inputs=", ".join(section.inputs),
                params=", ".join(section.params) or "none",
                hyper=", ".join(section.hyper),
                output=str(loss) if section.instances else "",
                loss=""
                if section.instances
                else mathml(r"\ell = " + to_latex(loss), block=True)
                if html
                else to_latex(loss),
                per_sample=program.graph.loss.params.get("reduction", "none") == "per_sample",
                rows=tuple(
                    StepRow(
                        row["number"], row["node"], row["forward"], row["kind_html" if html else "kind"], row["line"]
                    )
                    for row in rows
                ),
                branch_rows=_branch_rows(program),
            )
        )
    graph = top.planned.program.graph
    # parameters: the module's `params` entries, and differentiated inputs only ever read after an op's first operand
    firsts = {next(iter(node.operands.values()), None) for node in graph.nodes.values()}
    leaves = {
        item.name
        for item in spec.inputs
        if getattr(item, "source", None) or (item.name in graph.wrt and item.name not in firsts)
    }
    drawn = folded(graph, leaves)
    module_file = f"{spec.name}.py"
    instances = instance_rows(spec, flat_graph if flat_graph is not None else graph)
    overview = Overview(
        module_file,
        svg(drawn) if html else mermaid(drawn),
        tuple(InstanceRow(row["instance"], row["block"], row["hyper"], str(row["shape"])) for row in instances),
        tuple(ContentsEntry(table.anchor, table.title, table.count) for table in tables),
    )
    op_kinds = OpKinds(
        tuple(
            OpKind(
                title=kind["title"].replace("`", "") if html else kind["title"],
                anchor=kind["anchor"],
                node=kind["node"],
                forward=kind["forward"],
                where=kind["where"],
                uses=f"{kind['uses']} {'node' if kind['uses'] == 1 else 'nodes'}",
                incoming=kind["incoming_mathml" if html else "incoming"],
                locals=tuple(kind["locals_mathml" if html else "locals"]),
                contributions=tuple(
                    Contribution(item["operand"], item["source"], item["mathml" if html else "latex"])
                    for item in kind["contributions"]
                ),
            )
            for kind in kinds.values()
        )
    )
    return overview, op_kinds, StepTables(module_file, tuple(tables))


def _branch_rows(program) -> tuple[BranchRow, ...]:
    return tuple(BranchRow(node, ", ".join(consumers)) for node, consumers in program.branch_sums.items())


def _functions_view(sentence: str, html: bool) -> str:
    """A checked Function's sentence (``spec_functions``: an identifier, numbers and fixed words), its
    backticks as code on the page."""
    if not html:
        return sentence
    parts = str(escape(sentence)).split("`")
    return "".join(f"<code>{part}</code>" if index % 2 else part for index, part in enumerate(parts))


def _derivation(section: Section, html: bool) -> Derivation:
    """A spec without blocks, derived step by step; ``html``: the page's parts (SVG, MathML), else the
    Markdown's (Mermaid, LaTeX)."""
    planned = section.planned
    program = planned.program
    graph = program.graph
    descriptions = {
        statement.target.name: to_code(statement.value)
        for statement in program.forward
        if statement.target.name in graph.nodes
    }
    kinds = {"input": "leaf", "layer": "intermediate", "loss": "output"}
    node_rows = tuple(
        NodeRow(
            name=node.name,
            kind=("leaf (parameter, differentiated)" if node.name in graph.wrt else "leaf (constant)")
            if node.kind == "input"
            else kinds[node.kind],
            op=descriptions.get(node.name, "input"),
            shape=str(list(node.shape)),
            stored=str(planned.stored[node.name]),
        )
        for node in graph.nodes.values()
    )
    lines_of_step: dict[int, list[int]] = {}
    for index, line_step in enumerate(section.step_of_line or (), 1):
        lines_of_step.setdefault(line_step, []).append(index)
    shown = mathml if html else to_latex_text  # the page shows MathML, the Markdown the LaTeX
    steps = []
    for step in program.steps:
        locals_ = [f"{to_latex(symbol)} = {to_latex(value)}" for symbol, value in step.locals]
        steps.append(
            Step(
                number=len(steps) + 1,
                node=step.node,
                forward=step.forward,
                incoming=shown(to_latex(step.incoming)),
                locals=tuple(shown(local) for local in locals_),
                contributions=tuple(
                    Contribution(operand, source, shown(to_latex(value)), len(program.branch_sums.get(source, [])))
                    for operand, source, value in step.contributions
                ),
                lines=tuple(lines_of_step.get(len(steps) + 1, [])),
            )
        )
    readable = tuple(
        Readable(
            to_latex(statement.target), to_latex(statement.math if statement.math is not None else statement.value)
        )
        for statement in planned.readable_backward
    )
    loss = to_latex(program.forward[-1].value)
    prefix = f"{section.anchor}-" if section.anchor else ""
    branch_rows = _branch_rows(program)
    return Derivation(
        heading="##",
        level=2,
        step_level=3,
        prefix=prefix,
        graph=svg(graph) if html else mermaid(graph),
        node_rows=node_rows,
        forward=tuple(f"{statement.target.name} = {to_code(statement.value)}" for statement in planned.forward),
        loss=mathml(r"\ell = " + loss, block=True) if html else loss,
        per_sample=graph.loss.params.get("reduction", "none") == "per_sample",
        steps=tuple(steps),
        linked=section.step_of_line is not None,
        branch_rows=branch_rows,
        gradients_number=4 if branch_rows else 3,
        readable=readable,
        gradients=aligned([(item.target, item.latex) for item in readable]) if html else "",
        emitted=tuple(section.emitted),
        code_lines=tuple(
            CodeLine(index, f"#{prefix}step-{step}" if step else f"#{prefix}backward", str(escape(text)))
            for index, (text, step) in enumerate(
                zip(section.emitted, section.step_of_line or [None] * len(section.emitted)), 1
            )
        ),
    )


def to_latex_text(latex: str) -> str:
    """The Markdown's form of a formula: its LaTeX as it is."""
    return latex
