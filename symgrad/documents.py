"""The files that go with a generated module: its test file (``test_<name>.py``) and its derivation
(``<name>.md``, ``<name>.html``), one template each for every spec, with blocks or without.

:func:`render_tests` reads the graph of the spec with every block written out (the inputs, shapes and
``wrt`` the module is called with, whatever its form) and how the module takes each input: in its
``params`` mapping under a ``state_dict()`` key, or by name. :func:`render_documents` shows one
:class:`Section` per derivation: a spec without blocks has one, a spec with blocks one per block and
one for the top level, each with the same parts (node table, graph, steps, branch sums, the gradients
as emitted).

Templates only ever receive strings made here from validated identifiers, ints and printed sympy
expressions: no spec string reaches them raw. They render in Jinja's sandbox with ``StrictUndefined``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from dataclasses import dataclass
from importlib import resources

import jinja2
import jinja2.sandbox
from markupsafe import escape

from . import __version__, testdata
from .diagram import mermaid, svg
from .mathml import CSS as MATHML_CSS, aligned, mathml
from .printing import comment_lines, entry, fit, hanging, literal_lines, prose, to_code, to_latex
from .render_tests import test_file
from .reverse import GRAD_LOSS
from .schedule import Plan
from .write import with_header

TESTDATA_SOURCE = inspect.getsource(testdata).split("\nimport torch\n", 1)[1].strip("\n")
"""symgrad.testdata's functions and constants, verbatim, for the generated tests (one definition, two
users): the module's text after its imports."""
SHARED_NAMES = (
    "make_inputs",
    "first_nonfinite",
    "relative_errors",
    "moved_one_ulp",
    "rounding_tolerances",
    "value_sums",
    "sums_differ",
    "in_layout",
    "float32_acceptable",
    "memory_shortfall",
    "seeded_randn",
    "seeded_positive",
    "seeded",
    "assert_matches",
    "gradcheck_or_exact",
    "gradgradcheck_or_exact",
)
"""The functions of symgrad.testdata a generated test file takes by name, in the order ``SHARED`` lists them."""

SHARED_TESTS = "_symgrad_testdata.py"
"""The file ``symgrad generate`` writes once into the output folder beside the generated tests, which
each import it by path: the checking code they share (:data:`TESTDATA_SOURCE`), not a copy in every
test file. It is the same for every spec; its header names ``symgrad.testdata`` as its source."""

SHARED_LABEL = "symgrad.testdata"


def shared_tests() -> str:
    """The text of :data:`SHARED_TESTS`, without its header."""
    return (
        '"""The checking code every generated test in this folder shares: symgrad.testdata\'s own functions,\n'
        "verbatim (`symgrad verify` draws the same inputs and applies the same error measure, so the\n"
        'verdicts cannot disagree). Imports only torch and the standard library."""\n\n'
        f"import math\n\nimport torch\n\n\n{TESTDATA_SOURCE}\n\n"
        + fit("SHARED = (" + ", ".join(SHARED_NAMES) + ")", 0)
        + "\n"
    )


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


@functools.lru_cache(maxsize=None)
def environment() -> jinja2.Environment:
    """The sandboxed Jinja environment, built once per process: it compiles each template once."""
    loader = jinja2.FunctionLoader(lambda name: resources.files("symgrad.templates").joinpath(name).read_text("utf-8"))
    environment = jinja2.sandbox.SandboxedEnvironment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # the Python templates lay out each statement and sentence within printing.WIDTH columns
    environment.filters.update(
        fit=fit, prose=prose, comment_lines=comment_lines, entry=entry, hanging=hanging, literal_lines=literal_lines
    )
    return environment


def notation_html(sentence: str) -> str:
    """A :func:`notation` sentence for the HTML page: its math as MathML, the prose escaped."""
    parts = sentence.split("$")
    return "".join(mathml(part) if index % 2 else str(escape(part)) for index, part in enumerate(parts))


def _rendered(template: str, context: dict) -> str:
    """A template's text, without the header (the caller heads every file last: :func:`headed`)."""
    return environment().get_template(template).render(**context)


def headed(files: dict[str, str], spec, spec_label: str, extras: tuple[str, ...] = ()) -> dict[str, str]:
    """Each rendered file under the header ``symgrad check`` reads (the spec's hash, the extras added
    on the command line): the last step of rendering, after every file's text is printed."""
    spec_hash = hashlib.sha256(spec.text.encode("utf-8")).hexdigest()
    return {
        name: with_header(
            body, spec_label, spec_hash, comment="python" if name.endswith(".py") else "markup", extras=extras
        )
        if name != SHARED_TESTS
        else with_header(body, SHARED_LABEL, hashlib.sha256(body.encode("utf-8")).hexdigest(), comment="python")
        for name, body in files.items()
    }


# --------------------------------------------------------------------------------------------
# The test file
# --------------------------------------------------------------------------------------------


def render_tests(
    facts: dict, params: dict[str, str], hvp: bool = False, per_sample: tuple[list[str], list[str]] | None = None
) -> dict[str, str]:
    """``test_<name>.py`` for a module, from the ``facts`` its planning decided
    (:func:`symgrad.roles.test_facts`: inputs, shapes, ``wrt``, roles, test shapes, ...), as its model
    (:class:`symgrad.render_tests.TestFile`) prints, and the shared checking code beside it.

    ``params``: the inputs the module takes in its ``params`` mapping, each to its key there (its
    ``state_dict()`` key); it takes every other input by name. ``hvp`` and ``per_sample`` (the
    parameters and the batched inputs of ``per_sample_gradients``) add the extras' tests."""
    test = test_file(facts, params, SHARED_TESTS, SHARED_NAMES, hvp=hvp, per_sample=per_sample)
    text = environment().get_template("test_module.py.jinja").render(test=test)
    return {f"test_{facts['name']}.py": text, SHARED_TESTS: shared_tests()}


# --------------------------------------------------------------------------------------------
# The derivation documents
# --------------------------------------------------------------------------------------------


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
    named_parameters: dict | None = None
    """{node: its operands whose gradients its block's backward returns as they are}: said, not derived."""


def render_documents(
    spec, spec_label: str, sections: list[Section], module: str = "", flat_graph=None
) -> dict[str, str]:
    """``<name>.md`` and ``<name>.html`` for ``spec``. Without blocks: its one section's derivation,
    step by step. With blocks (``sections``: each block's, then the top level's): the network's
    overview, each op kind derived once, and each section's step table linked to the lines of
    ``module`` (the generated module as written, header included); ``flat_graph``: the spec with every
    block written out (the instances' shapes)."""
    blocked = len(sections) > 1 or bool(sections[0].instances)
    files = {}
    for suffix, html in (("md", False), ("html", True)):
        if blocked:
            view = _blocked_view(spec, sections, module, flat_graph, html)
        else:
            view = dict(sections=[_section_view(section, False, html) for section in sections])
        sentence = notation(_latex_of(view))
        context = dict(
            name=spec.name,
            version=__version__,
            spec_label=spec_label,
            notation=sentence,
            checked_functions=[
                _functions_view(function.sentence(), html) for function in getattr(spec, "checked_functions", ())
            ],
            notation_html=notation_html(sentence),
            mathml_css=MATHML_CSS,
            blocked=blocked,
            **view,
        )
        file_name = f"{spec.name}.{suffix}"
        files[file_name] = _rendered(f"derivation.{suffix}.jinja", context)
    return files


def _latex_of(view: dict) -> str:
    """Every formula a document's view shows, as one text (what :func:`notation` reads)."""
    parts = []
    for item in [*view.get("sections", ()), *view.get("kinds", ())]:
        parts += [item.get("incoming", ""), item.get("loss_latex", ""), *item.get("locals", ())]
        parts += [contribution["latex"] for contribution in item.get("contributions", ())]
        parts += [latex for _, latex in item.get("readable", ())]
        for step in item.get("steps", ()):
            parts += [step.get("incoming", ""), *step.get("locals", ())]
            parts += [contribution["latex"] for contribution in step.get("contributions", ())]
    return "\n".join(parts)


def _blocked_view(spec, sections: list[Section], module: str, flat_graph, html: bool) -> dict:
    """The parts of a block spec's documents (:mod:`symgrad.overview`): the overview graph with the
    parameters folded into their ops, the block table, each op kind's derivation once, and each
    block's and the top level's step table."""
    from .diagram import folded
    from .overview import instance_rows, step_rows

    page = mathml if html else (lambda latex: "")
    *blocks, top = sections
    names = {section.anchor.removeprefix("block-"): section for section in blocks}
    kinds: dict[str, dict] = {}
    views = []
    for section in [*blocks, top]:
        block = section.anchor.removeprefix("block-")
        function = f"{block}_backward" if section.instances else "_backward_from_saved"
        rows = step_rows(section, kinds, module, function, {name: name for name in names}, page)
        program = section.planned.program
        views.append(
            dict(
                title=section.title,
                anchor=section.anchor,
                instances=list(section.instances),
                inputs=list(section.inputs),
                params=list(section.params),
                hyper=list(section.hyper),
                output=str(program.forward[-1].value) if section.instances else "",
                rows=rows,
                loss_latex="" if section.instances else to_latex(program.forward[-1].value),
                loss_mathml_block=""
                if section.instances or not html
                else mathml(r"\ell = " + to_latex(program.forward[-1].value), block=True),
                reduction=program.graph.loss.params.get("reduction", "none"),
                branch_rows=[
                    dict(node=node, consumers=list(consumers)) for node, consumers in program.branch_sums.items()
                ],
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
    overview = folded(graph, leaves)
    return dict(
        sections=views,
        kinds=list(kinds.values()),
        module_file=f"{spec.name}.py",
        instances=instance_rows(spec, flat_graph if flat_graph is not None else graph),
        mermaid="" if html else mermaid(overview),
        svg=svg(overview) if html else "",
    )


def _functions_view(sentence: str, html: bool) -> str:
    """A checked Function's sentence (``spec_functions``: an identifier, numbers and fixed words), its
    backticks as code on the page."""
    if not html:
        return sentence
    parts = str(escape(sentence)).split("`")
    return "".join(f"<code>{part}</code>" if index % 2 else part for index, part in enumerate(parts))


def _section_view(section: Section, blocked: bool, html: bool) -> dict:
    """What the templates show of one section; ``html``: the page's parts (SVG, MathML), else the
    Markdown's (Mermaid, LaTeX)."""
    planned = section.planned
    program = planned.program
    graph = program.graph
    block = bool(section.instances)
    output = program.forward[-1].value if block else None  # a block's end: the output the caller's gradient meets
    descriptions = {
        statement.target.name: to_code(statement.value)
        for statement in program.forward
        if statement.target.name in graph.nodes
    }
    kinds = {"input": "leaf", "layer": "intermediate", "loss": "output"}
    node_rows = [
        dict(
            name=node.name,
            op=descriptions.get(node.name, "input"),
            shape=list(node.shape),
            stored=planned.stored[node.name],
            kind=("leaf (parameter, differentiated)" if node.name in graph.wrt else "leaf (constant)")
            if node.kind == "input"
            else kinds[node.kind],
        )
        for node in graph.nodes.values()
        if not (block and node.kind == "loss")
    ]
    lines_of_step: dict[int, list[int]] = {}
    for index, line_step in enumerate(section.step_of_line or (), 1):
        lines_of_step.setdefault(line_step, []).append(index)
    named = section.named_parameters or {}
    page = mathml if html else (lambda latex: "")  # MathML is the page's alone; the Markdown shows the LaTeX
    steps = []
    for step in program.steps:
        if block and step.node == "loss":  # the block's end: its output's gradient comes from the caller
            continue
        # an instance's parameters take their gradients straight from its block's backward: named, not derived
        parameters = [
            source
            for operand, source, _ in step.contributions
            if operand in named.get(step.node, ()) and not program.branch_sums.get(source)
        ]
        locals_ = [f"{to_latex(symbol)} = {to_latex(value)}" for symbol, value in step.locals]
        incoming = to_latex(step.incoming)
        steps.append(
            dict(
                number=len(steps) + 1,
                node=step.node,
                forward=step.forward,
                incoming=incoming,
                incoming_mathml=page(incoming),
                locals=locals_,
                locals_mathml=[page(local) for local in locals_],
                parameters=parameters,
                contributions=[
                    dict(
                        operand=operand,
                        source=source,
                        latex=latex,
                        mathml=page(latex),
                        branch=len(program.branch_sums.get(source, [])),
                    )
                    for operand, source, value in step.contributions
                    if source not in parameters
                    for latex in (to_latex(value),)
                ],
                lines=lines_of_step.get(len(steps) + 1, []),
            )
        )
    # a block's output takes the gradient the caller passes (`grad_output`), not the loss's: no alias line for it
    readable = [
        (to_latex(statement.target), to_latex(statement.math if statement.math is not None else statement.value))
        for statement in planned.readable_backward
        if not (block and statement.value == GRAD_LOSS)
    ]
    loss = program.forward[-1].value
    prefix = f"{section.anchor}-" if section.anchor else ""
    return dict(
        title=section.title,
        anchor=section.anchor,
        prefix=prefix,
        heading="###" if blocked else "##",
        level=3 if blocked else 2,
        block=block,
        instances=list(section.instances),
        inputs=list(section.inputs),
        params=list(section.params),
        hyper=list(section.hyper),
        output=str(output) if block else "",
        output_gradient=rf"\overline{{{to_latex(output)}}}" if block else "",
        reduction=graph.loss.params.get("reduction", "none"),
        mermaid="" if html else mermaid(graph),
        svg=svg(graph) if html else "",
        node_rows=node_rows,
        forward=[
            f"{statement.target.name} = {to_code(statement.value)}"
            for statement in planned.forward
            if not (block and statement.target.name == "loss")
        ],
        loss_latex="" if block else to_latex(loss),
        loss_mathml_block="" if block or not html else mathml(r"\ell = " + to_latex(loss), block=True),
        steps=steps,
        linked=section.step_of_line is not None,
        branch_rows=[dict(node=node, consumers=list(consumers)) for node, consumers in program.branch_sums.items()],
        readable=readable,
        gradients_mathml=aligned(readable) if html else "",
        emitted=list(section.emitted),
        code_lines=[
            dict(number=index, step=step, text=str(escape(text)))
            for index, (text, step) in enumerate(
                zip(section.emitted, section.step_of_line or [None] * len(section.emitted)), 1
            )
        ],
    )
