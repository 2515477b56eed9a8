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
from importlib import resources

import jinja2
import jinja2.sandbox

from . import testdata
from .printing import comment_lines, entry, fit, hanging, literal_lines, prose
from .render_documents import Section, documents
from .render_tests import test_file
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


@functools.lru_cache(maxsize=None)
def environment() -> jinja2.Environment:
    """The sandboxed Jinja environment, built once per process: it compiles each template once."""
    return _configured(jinja2.sandbox.SandboxedEnvironment)


def _configured(kind) -> jinja2.Environment:
    loader = jinja2.FunctionLoader(lambda name: resources.files("symgrad.templates").joinpath(name).read_text("utf-8"))
    environment = kind(
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


class Placed(str):
    """Text a template printed, and where the lines of the module it printed landed: ``marks``, each
    (its line in this text, counted from 0; ``"comment"`` or ``"statement"``; the :class:`~symgrad.emit.Line`)."""

    marks: tuple = ()

    def __str__(self) -> str:  # Jinja writes each value with str(): the marks travel with the text
        return self


def _placed(text: str, marks) -> Placed:
    placed = Placed(text)
    placed.marks = tuple(marks)
    return placed


class _Locating(jinja2.sandbox.SandboxedEnvironment):
    """:func:`environment`'s templates, printing where each emitted line lands as it prints it: a
    line's ``comment`` is printed by the next ``comment_lines``, its statement (``target = code``) by
    the next ``fit``, each made a :class:`Placed` at line 0 and joined (Jinja's ``concat``: a macro's
    output, a template's) with every part's marks moved down by the lines printed before it. Nothing
    reads the text back: the lines are counted as the text is assembled."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.concat = _joined
        self.reading: dict[str, object] = {}

    def marking(self) -> _Locating:
        """Its ``comment_lines`` and ``fit`` filters mark what they print (after :func:`_configured`)."""
        self.filters.update(
            comment_lines=self._marking("comment", self.filters["comment_lines"]),
            fit=self._marking("statement", self.filters["fit"]),
        )
        return self

    def getattr(self, obj, attribute):
        from .emit import Line

        if isinstance(obj, Line) and attribute in ("comment", "target"):
            self.reading["comment" if attribute == "comment" else "statement"] = obj
        return super().getattr(obj, attribute)

    def _marking(self, role: str, printed):
        def marked(text, *args, **options):
            out = printed(text, *args, **options)
            line = self.reading.pop(role, None)  # the Line whose comment (statement) this prints
            return _placed(out, [(0, role, line)]) if line is not None else out

        return marked


def _joined(parts) -> Placed:
    """The parts joined, each one's marks moved down by the lines before it."""
    parts = list(parts)
    marks, before = [], 0
    for part in parts:
        marks += [(before + line, role, owner) for line, role, owner in getattr(part, "marks", ())]
        before += part.count("\n")
    return _placed("".join(parts), marks)


@functools.lru_cache(maxsize=None)
def _locating() -> _Locating:
    return _configured(_Locating).marking()


def placed_lines(template: str, **context) -> tuple[str, dict[int, dict[str, int]]]:
    """``template`` rendered with ``context``, and where each :class:`~symgrad.emit.Line` it printed
    landed: {id(line): {"comment" or "statement": its first line, 1-based}}."""
    locating = _locating()
    locating.reading.clear()
    text = locating.get_template(template).render(**context)
    where: dict[int, dict[str, int]] = {}
    for line, role, owner in getattr(text, "marks", ()):
        where.setdefault(id(owner), {}).setdefault(role, line + 1)
    return str.__str__(text), where


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


def render_documents(spec, spec_label: str, sections: list[Section], flat_graph=None) -> dict[str, str]:
    """``<name>.md`` and ``<name>.html`` for ``spec``, as their models
    (:func:`symgrad.render_documents.documents`) print. Without blocks: its one section's derivation,
    step by step. With blocks (``sections``: each block's, then the top level's): the network's
    overview, each op kind derived once, and each section's step table linked to its lines of the
    generated module (``Section.lines``); ``flat_graph``: the spec with every block written out (the
    instances' shapes)."""
    return {
        f"{spec.name}.{suffix}": _rendered(f"derivation.{suffix}.jinja", {"document": document})
        for suffix, document in documents(spec, spec_label, sections, flat_graph).items()
    }
