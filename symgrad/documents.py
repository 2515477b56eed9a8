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


def render_documents(
    spec, spec_label: str, sections: list[Section], module: str = "", flat_graph=None
) -> dict[str, str]:
    """``<name>.md`` and ``<name>.html`` for ``spec``, as their models
    (:func:`symgrad.render_documents.documents`) print. Without blocks: its one section's derivation,
    step by step. With blocks (``sections``: each block's, then the top level's): the network's
    overview, each op kind derived once, and each section's step table linked to the lines of
    ``module`` (the generated module as written, header included); ``flat_graph``: the spec with every
    block written out (the instances' shapes)."""
    return {
        f"{spec.name}.{suffix}": _rendered(f"derivation.{suffix}.jinja", {"document": document})
        for suffix, document in documents(spec, spec_label, sections, module, flat_graph).items()
    }
