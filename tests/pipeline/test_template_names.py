"""The module template's own names are declared once (``symgrad.module_names``), not read off the templates
at run time: this test reads them off the templates' text (the scan ``symgrad.names`` ran until issue 64 item
2) and checks the declaration holds every name they write, by scope. A template that writes a new name of its
own fails here until it is declared, so a spec name still never collides with one."""

from __future__ import annotations

import keyword
import re
from importlib import resources

from symgrad.module_names import MODULE, SUFFIXES, WRITTEN, TemplateNames


def scanned_names() -> tuple[frozenset[str], frozenset[str]]:
    """(names, suffixes) the module template writes itself, read off the template: what it imports,
    the functions and classes it defines, the arguments of each function that also takes the spec's
    tensors, the names it assigns (``grads``, ``saved``), and the suffixes it puts after a spec name
    (``{{ name }}_layout`` makes ``x_layout``)."""
    text = template_text("module.py.jinja")  # as render loads it, its sections in place
    text = re.sub(r"\{#.*?#\}", "", text, flags=re.S)
    names, suffixes = set(), set()
    verbatim, inside = scan_template("module.py.jinja").verbatim, ""  # functions that never see a spec name
    for raw in text.splitlines():
        if match := re.match(r"(?:def|class) (\w+)", raw):
            inside = match.group(1)
        elif raw and not raw[0].isspace() and not raw.startswith("{"):
            inside = ""
        if inside in verbatim and not raw.startswith(("def ", "class ")):
            continue  # `x = forward(x, ...)` in `_run_forward` is its own local, never a spec name's clash
        suffixes.update(re.findall(r"\{\{ *\w+ *\}\}(_\w+) = ", raw))
        suffixes.update(re.findall(r"\w+ ~ \"(_\w+) = ", raw))  # {{ (name ~ "_layout = ...") | fit(4) }}
        line = re.sub(r"\{\{.*?\}\}", "", raw).strip()  # what the template fills in is checked after rendering
        if match := re.match(r"(?:from \S+ )?import (.+)", line):
            names.update(part.split(" as ")[-1].strip().split(".")[0] for part in match.group(1).split(","))
        elif match := re.match(r"(?:def|class) (\w+)", raw):  # at module level (a method's name is no clash)
            names.add(match.group(1))
        elif match := re.match(r"[\w, *]+(?= = )", line):
            names.update(part.strip("* ") for part in match.group(0).split(","))
    for match in re.finditer(r"def \w+\(([^)]*\{\{ signature \}\}[^)]*)\)", text):
        arguments = re.sub(r"\{\{.*?\}\}|\{%.*?%\}", "", match.group(1))
        names.update(part.split("=")[0].strip() for part in arguments.split(","))
    return frozenset(name for name in names if name.isidentifier() and not name.startswith("_")), frozenset(suffixes)


SPEC_FACING = re.compile(r"signature|positional|statements\(|block\.|saved_names|\bname ~|line\.target|function_")
"""What a template function's lines say when it takes or names the spec's tensors; the other
functions (``_scope``, ``_run_forward``) are written out verbatim and never see a spec name."""


def _literal_names(expression: str) -> set[str]:
    """The names in the string literals of a Jinja expression that writes code: ``"grads = gradients("``
    assigns ``grads``; ``["p"]``, ``["save=False"]`` and ``", saved, grad_loss):"`` are arguments."""
    names = set()
    for literal in re.findall(r'"([^"]*)"', expression):
        for part in re.split(r"[,()\[\]:]", literal):
            part = part.strip().lstrip("*").split("=")[0].strip()
            if part.isidentifier():
                names.add(part)
    return names


def template_text(template: str) -> str:
    """``template``'s text as one: each section it includes (``{% include "module/loss.jinja" %}``) in
    its place, and the macro files they import (``{% from ... import ... %}``) once, first, as the
    macros stood before the module's template was split into sections (templates/module/)."""
    imported: dict[str, None] = {}

    def expand(name: str) -> str:
        text = resources.files("symgrad.templates").joinpath(name).read_text("utf-8")
        for found in re.findall(r'^\{% from "([^"]+)" import', text, flags=re.M):
            imported[found] = None
        text = re.sub(r'^\{% from "[^"]+" import [^\n]*%\}\n', "", text, flags=re.M)
        return re.sub(r'^\{% include "([^"]+)" %\}\n', lambda match: expand(match.group(1)), text, flags=re.M)

    body = expand(template)
    macros = [resources.files("symgrad.templates").joinpath(name).read_text("utf-8") for name in imported]
    return "".join(macros) + body


def scan_template(template: str) -> TemplateNames:
    """:class:`TemplateNames` of ``template``, read off its text: each function's arguments and
    assigned names (written out or in a ``{{ ... }}`` expression), sorted by the function they are
    in, and what it defines at module level."""
    text = template_text(template)
    text = re.sub(r"\{#.*?#\}", "", text, flags=re.S)
    lines = text.splitlines()
    top, block, suffixes, verbatim = set(), set(), set(), set()
    classes, facing, owner = set(), set(), ""  # a class is verbatim when none of its parts faces the spec
    function: list[str] | None = None  # the lines of the function being read
    kind = ""

    def close():
        if function is None:
            return
        if not SPEC_FACING.search("\n".join(function)):
            if match := re.match(r"(?:def|class) (\w+)", function[0]):
                verbatim.add(match.group(1))
            return
        facing.add(owner)
        names = set()
        for line in function:
            expressions = re.findall(r"\{\{(.*?)\}\}", line)
            if re.match(r"\s*\{\{ *\(*\"def ", line) or re.match(r"\s*def ", line):  # the arguments
                head = re.sub(r"\{\{.*?\}\}", "", line)
                if match := re.match(r"\s*def \w+\(([^)]*)\)", head):
                    names.update(part.strip().lstrip("*").split("=")[0].strip() for part in match.group(1).split(","))
                for expression in expressions:
                    names.update(_literal_names(expression.split("(", 1)[1] if "def " in expression else expression))
                continue
            for expression in expressions:  # `("grads = gradients(" ~ ...)`, `(... ~ " = saved")`
                for literal in re.findall(r'"([\w, *]+) = ', expression):
                    names.update(part.strip("* ") for part in literal.split(","))
            raw = re.sub(r"\{\{.*?\}\}", "", line).strip()
            if match := re.match(r"[\w, *]+(?= = )", raw):
                names.update(part.strip("* ") for part in match.group(0).split(","))
        (block if kind == "block" else top).update(name for name in names if name.isidentifier())

    for line in lines:
        indent = len(line) - len(line.lstrip())
        stripped = line.strip()
        if not stripped or stripped.startswith("{%") or stripped.startswith("@"):
            continue
        defines = re.match(r'(?:\{\{ *\(*"|)(?:def|class) ', stripped)
        if indent == 0 or (defines and indent == 4 and stripped.startswith(("{{", "def "))):
            close()
            function, kind = None, ""
            if indent == 0:
                owner = match.group(1) if (match := re.match(r"class (\w+)", stripped)) else ""
                classes.update([owner] if owner else [])
            if defines and stripped.startswith(("def ", "class ", "{{")) or stripped.startswith('{{ ("def '):
                function = [line]
                if match := re.search(r'block\.name ~ "(_\w+)\(', stripped):
                    kind = "block"
                    suffixes.add(match.group(1))
            if indent == 0:
                head = re.sub(r"\{\{.*?\}\}", "", stripped)
                if match := re.match(r"(?:from \S+ )?import (.+)", head):
                    top.update(part.split(" as ")[-1].strip().split(".")[0] for part in match.group(1).split(","))
                elif match := re.match(r"(?:def|class) (\w+)", head):
                    top.add(match.group(1))
                elif match := re.match(r"(\w+) = ", head):
                    top.add(match.group(1))
                elif match := re.match(r'\{\{ *\(*"(?:def|class) (\w+)\(', stripped):
                    top.add(match.group(1))
            continue
        if function is not None:
            function.append(line)
    close()
    keep = lambda names: frozenset(
        name
        for name in names
        if name.isidentifier()  # noqa: E731
        and not keyword.iskeyword(name)
        and not name.startswith("_")
    )
    verbatim = (verbatim - classes) | (classes - facing)
    return TemplateNames(keep(top), keep(block), tuple(sorted(suffixes)), frozenset(verbatim))


def test_the_declared_names_are_those_the_module_templates_write():
    scanned = scan_template("module.py.jinja")
    for scope in ("top", "block", "verbatim"):
        missing = getattr(scanned, scope) - getattr(MODULE, scope)
        assert not missing, f"templates/module write {sorted(missing)} ({scope}): add them to symgrad/module_names.py"
        extra = getattr(MODULE, scope) - getattr(scanned, scope)
        assert not extra, f"symgrad/module_names.py declares {sorted(extra)} ({scope}), which no template writes"
    assert scanned.block_functions == MODULE.block_functions
    assert scanned_names() == (WRITTEN, SUFFIXES)
