"""The module template reads a model, not a dict (issue 64 item 2): each section of ``module.py.jinja`` is a
macro of the one frozen dataclass ``symgrad.render_sections`` builds for it, reads only its fields, and makes
no decision of its own; the renderer never edits the printed text with a regex."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import jinja2
import pytest
from jinja2 import meta, nodes

from symgrad import render_documents, render_functions, render_sections, render_tests
from symgrad.documents import environment
from symgrad.emit import Line
from symgrad.render_documents import (
    BranchRow,
    CodeLine,
    ContentsEntry,
    Contribution,
    Derivation,
    Document,
    Header,
    InstanceRow,
    NodeRow,
    OpKind,
    OpKinds,
    Overview,
    Readable,
    Step,
    StepRow,
    StepTable,
    StepTables,
)
from symgrad.render_functions import Autograd, Functions, Hvp, Outputs, PerSample, Saving
from symgrad.render_sections import Bind, BlockFunctions, Blocks, Chain, Docstring, Module, Tables
from symgrad.render_tests import Checks, Extras, Helpers, Loading, PerSampleTest, TestFile, ZeroGradient

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "templates"

# each section file: the one name it reads, and the dataclass of every name it reads fields of
SECTIONS = {
    "module/docstring.jinja": ("docstring", {"docstring": Docstring, "line": Line}),
    "module/tables.jinja": ("tables", {"tables": Tables}),
    "module/blocks.jinja": ("blocks", {"blocks": Blocks, "block": BlockFunctions, "chain": Chain}),
    "module/loss.jinja": (
        "functions",
        {"functions": Functions, "per_sample": PerSample, "hvp": Hvp, "line": Line},
    ),
    "module/outputs.jinja": ("functions", {"functions": Functions, "outputs": Outputs, "line": Line}),
    "module/bind.jinja": ("bind", {"bind": Bind}),
    # the generated test file's sections (symgrad.render_tests)
    "test_module/loading.jinja": ("loading", {"loading": Loading}),
    "test_module/tables.jinja": ("tables", {"tables": render_tests.Tables, "zero": ZeroGradient}),
    "test_module/helpers.jinja": ("helpers", {"helpers": Helpers}),
    "test_module/checks.jinja": ("checks", {"checks": Checks}),
    "test_module/extras.jinja": ("extras", {"extras": Extras, "per_sample": PerSampleTest}),
}
# the derivation documents' sections (symgrad.render_documents), the same in Markdown and HTML
for form in ("md", "html"):
    SECTIONS.update(
        {
            f"derivation_{form}/header.jinja": ("header", {"header": Header}),
            f"derivation_{form}/overview.jinja": (
                "overview",
                {"overview": Overview, "row": InstanceRow, **({"entry": ContentsEntry} if form == "html" else {})},
            ),
            f"derivation_{form}/kinds.jinja": ("kinds", {"kinds": OpKinds, "kind": OpKind, "item": Contribution}),
            f"derivation_{form}/tables.jinja": (
                "tables",
                {"tables": StepTables, "section": StepTable, "row": StepRow, "branch": BranchRow},
            ),
            f"derivation_{form}/derivation.jinja": (
                "derivation",
                {
                    "derivation": Derivation,
                    "row": NodeRow,
                    "branch": BranchRow,
                    "step": Step,
                    "item": Contribution,
                    **({"line": CodeLine} if form == "html" else {"result": Readable}),
                },
            ),
        }
    )
# each top template: the one name it reads, its dataclass, the folder of its sections
TOP = {
    "module.py.jinja": ("module", Module, "module"),
    "test_module.py.jinja": ("test", TestFile, "test_module"),
    "derivation.md.jinja": ("document", Document, "derivation_md"),
    "derivation.html.jinja": ("document", Document, "derivation_html"),
}
MACROS = {"autograd": Autograd, "saving": Saving, "line": Line}  # module/macros.jinja: its macros' arguments


def parsed(name: str) -> nodes.Template:
    return environment().parse((TEMPLATES / name).read_text(encoding="utf-8"))


def dataclass_of(node, typed: dict):
    """The dataclass a name or a chain of attributes (``functions.saving``) stands for, else None."""
    if isinstance(node, nodes.Name):
        return typed.get(node.name)
    if isinstance(node, nodes.Getattr) and (owner := dataclass_of(node.node, typed)) is not None:
        hint = typing.get_type_hints(owner).get(node.attr)
        found = [kind for kind in typing.get_args(hint) or (hint,) if dataclasses.is_dataclass(kind)]
        return found[0] if found else None
    return None


def fields_read(tree: nodes.Template, typed: dict) -> dict[type, set[str]]:
    """The attributes read off each dataclass of ``typed`` (``functions.saving.backward``: Functions'
    ``saving``, Saving's ``backward``), through its names and the fields that hold another."""
    read: dict[type, set[str]] = {kind: set() for kind in typed.values()}
    for node in tree.find_all(nodes.Getattr):
        if (owner := dataclass_of(node.node, typed)) is not None:
            read.setdefault(owner, set()).add(node.attr)
    return read


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_each_section_is_a_macro_of_its_one_dataclass_and_reads_only_its_fields(name):
    """A section is ``{% macro section(NAME) %}``: it sees its argument alone (Jinja gives an imported
    macro no context), reads nothing from outside, and every attribute it reads is a field."""
    section, typed = SECTIONS[name]
    tree = parsed(name)
    assert meta.find_undeclared_variables(tree) == set()
    macros = list(tree.find_all(nodes.Macro))
    assert [(macro.name, [argument.name for argument in macro.args]) for macro in macros] == [("section", [section])]
    assert not [node for node in tree.body if not isinstance(node, (nodes.Macro, nodes.FromImport, nodes.Output))]
    for kind, read in fields_read(tree, typed).items():
        fields = {field.name for field in dataclasses.fields(kind)}
        assert read, f"{name} reads nothing off a {kind.__name__}: the table above is stale"
        assert read <= fields, f"{name} reads {sorted(read - fields)}, not fields of {kind.__name__}"


@pytest.mark.parametrize("name", sorted(TOP))
def test_a_top_template_passes_each_section_its_dataclass(name):
    """``module.py.jinja`` reads ``module`` and passes each section its field, ``test_module.py.jinja``
    ``test`` alike; no section is imported ``with context``."""
    argument, kind, folder = TOP[name]
    tree = parsed(name)
    assert meta.find_undeclared_variables(tree) == {argument}
    sections = {field.name for field in dataclasses.fields(kind)}
    assert fields_read(tree, {argument: kind}) == {kind: sections}
    for path in (TEMPLATES / folder).glob("*.jinja"):
        assert "with context" not in path.read_text(encoding="utf-8"), path.name


def test_the_module_macros_read_only_their_arguments():
    tree = parsed("module/macros.jinja")
    assert meta.find_undeclared_variables(tree) == set()
    for kind, read in fields_read(tree, MACROS).items():
        assert read and read <= {field.name for field in dataclasses.fields(kind)}, (kind, read)


@pytest.mark.parametrize("name", sorted([*SECTIONS, "module/macros.jinja"]))
def test_a_section_prints_and_decides_nothing(name):
    """No value computed in a template: no indexing or slicing, no length, map or JSON of a field, and an
    inline ``x if c else y`` only on a macro's own argument (``cotangent``: which of its two forms)."""
    tree = parsed(name)
    assert not list(tree.find_all((nodes.Getitem, nodes.Slice)))
    assert not [node.name for node in tree.find_all(nodes.Filter) if node.name in {"length", "map", "tojson", "sort"}]
    for node in tree.find_all(nodes.CondExpr):
        assert {found.name for found in node.test.find_all(nodes.Name)} <= {"cotangent", "kind"}, name


def test_every_section_dataclass_is_frozen_and_a_missing_field_fails_loudly():
    for module in (render_sections, render_functions, render_tests, render_documents):
        classes = [
            value
            for value in vars(module).values()
            if dataclasses.is_dataclass(value) and value.__module__ == module.__name__
        ]
        assert classes and all(value.__dataclass_params__.frozen for value in classes)
    assert issubclass(environment().undefined, jinja2.StrictUndefined)
    with pytest.raises(jinja2.UndefinedError):
        environment().get_template("module/bind.jinja").module.section(object())


def test_the_renderer_has_no_regex():
    """Names are final before printing (planning renames; a comment is made text once): nothing in the
    render step rewrites printed code or comments with ``re`` (``printing`` reads a name's letter and digits
    with one, to write it in LaTeX; it lays code out with Python's tokenizer)."""
    for name in (
        "render.py",
        "render_sections.py",
        "render_functions.py",
        "emit.py",
        "render_tests.py",
        "render_documents.py",
    ):
        tree = ast.parse((ROOT / "symgrad" / name).read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "re" not in imported, name


def test_a_comment_is_made_text_once_in_emit_and_the_render_step_only_prints_it():
    """The backward's comments on their own line lose a closing remark that does not fit, the forward's
    trailing ones go where they do not fit: both in ``emit`` as the lines are printed; no render module
    builds a line or a statement with another comment (``replace(..., comment=...)``)."""
    from symgrad.algebra import tensor
    from symgrad.emit import printed_forward, printed_lines, printed_sections
    from symgrad.lifetimes import Scheduled
    from symgrad.reverse import Statement

    quoted = "y = " + "f" * 80 + ": pulled back to its x"
    long = Scheduled(Statement(tensor("grad_x"), 2 * tensor("grad_y"), "y", quoted + " (autograd's own kernel)"))
    short = Scheduled(Statement(tensor("grad_w"), 3 * tensor("grad_y"), "y", "w's gradient (twice differentiable)"))
    assert [line.comment for line in printed_lines([long, short], own_line=4)] == [quoted, short.statement.comment]
    assert printed_lines([long])[0].comment == long.statement.comment  # printed as it is where no column is given
    assert [line.comment for line in printed_sections([long], own_line=4)] == [quoted]
    forward = Statement(tensor("y"), 2 * tensor("x"), "y", "spec line 12")
    assert printed_forward([forward])[0].comment == "spec line 12"
    assert printed_forward([forward], indent=84)[0].comment == ""  # 84 + len("y = 2 * x") + 4 + 12 > 100
    for name in ("render.py", "render_sections.py", "render_functions.py", "render_tests.py", "render_documents.py"):
        tree = ast.parse((ROOT / "symgrad" / name).read_text(encoding="utf-8"))
        keywords = {keyword.arg for node in ast.walk(tree) if isinstance(node, ast.Call) for keyword in node.keywords}
        assert "comment" not in keywords, name
