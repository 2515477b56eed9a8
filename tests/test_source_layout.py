"""The source tree's layout, read with ``ast``: no import cycle among symgrad's modules, no module using
another module's ``_private`` name, no source file over 600 lines (issue 36, items 5 and 6); and ruff's lint
and format (pyproject.toml's ``[tool.ruff]``) clean on symgrad/, benchmarks/, tests/ and examples/ (issue 61,
item 4)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "symgrad"
MAX_LINES = 600

PENDING: set[str] = set()
"""Findings known and owned elsewhere; every other finding fails."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def resolved(name: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names, relative to module ``name``."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if is_package(name) else name.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str) -> list[tuple[str, str, int]]:
    """(module imported, name taken from it or "", line) for every import in module ``name``, at module
    level, inside a function or under ``if TYPE_CHECKING:`` (a circle a type checker walks is a circle
    too: issue 64 item 5); ``from . import spec`` imports the module ``symgrad.spec``, and
    a package whose registry walks ``pkgutil.iter_modules(__path__)`` imports each of its modules. An
    import names the module it reads from, not the packages above it (importing ``symgrad.rules.base``
    runs ``symgrad/rules/__init__.py`` first, which every module of a package does)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = resolved(name, node)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.append(
                    (submodule, "", node.lineno) if submodule in MODULES else (source, alias.name, node.lineno)
                )
    for node in ast.walk(tree):  # a registry that imports each module of its package (symgrad.rules)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "iter_modules"
            and any(isinstance(argument, ast.Name) and argument.id == "__path__" for argument in node.args)
        ):
            found += [(child, "", node.lineno) for child in MODULES if child.rpartition(".")[0] == name]
    return [(module, taken, line) for module, taken, line in found if module in MODULES]


def module_aliases(name: str) -> dict[str, str]:
    """Local names bound to symgrad modules (``from . import spec``, ``import symgrad.graph as graph``)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES and alias.asname:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                submodule = f"{resolved(name, node)}.{alias.name}"
                if submodule in MODULES:
                    aliases[alias.asname or alias.name] = submodule
    return aliases


def cycles() -> list[str]:
    """Each import cycle once, as ``a -> b -> a`` with the line of each import."""
    edges: dict[str, dict[str, int]] = {}
    for name in MODULES:
        for module, _, line in imports(name):
            if module != name:
                edges.setdefault(name, {}).setdefault(module, line)
    found, seen = [], set()

    def visit(name: str, path: list[str]) -> None:
        for module in sorted(edges.get(name, {})):
            if module in path:
                cycle = path[path.index(module) :] + [module]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    steps = [f"{a} (line {edges[a][b]})" for a, b in zip(cycle, cycle[1:])]
                    found.append("import cycle: " + " -> ".join(steps + [cycle[-1]]))
            elif module not in done:
                visit(module, path + [module])
        done.add(name)

    done: set[str] = set()
    for name in sorted(MODULES):
        if name not in done:
            visit(name, [name])
    return found


def private_uses() -> list[str]:
    """``from .x import _name`` and ``x._name`` in another module than x's, one finding per name and module."""
    found = set()
    for name, path in MODULES.items():
        for module, taken, line in imports(name):
            if module != name and taken.startswith("_") and not taken.startswith("__"):
                found.add(f"{name} uses {module}.{taken} (line {line})")
        aliases = module_aliases(name)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and aliases[node.value.id] != name
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.add(f"{name} uses {aliases[node.value.id]}.{node.attr} (line {node.lineno})")
    return sorted(found)


def long_files() -> list[str]:
    return [
        f"{name} has {count} lines (at most {MAX_LINES})"
        for name, path in MODULES.items()
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]


def without_lines(finding: str) -> str:
    """A finding without its line numbers and counts, to compare with ``PENDING`` across edits."""
    return re.sub(
        r" has \d+ lines \(at most \d+\)", f" is over {MAX_LINES} lines", re.sub(r" \(line \d+\)", "", finding)
    )


@pytest.mark.parametrize("check", [cycles, private_uses, long_files])
def test_source_layout(check):
    findings = [finding for finding in check() if without_lines(finding) not in PENDING]
    assert not findings, "\n".join(findings)


def test_pending_findings_are_still_found():
    """An entry of ``PENDING`` that is fixed goes from the set, so it cannot hide a later regression."""
    found = {without_lines(finding) for check in (cycles, private_uses, long_files) for finding in check()}
    assert not PENDING - found, sorted(PENDING - found)


def test_the_checks_find_what_they_look_for(tmp_path, monkeypatch):
    """Each check fails on a tree that has its fault: a cycle, a private name read, a long file."""
    package = tmp_path / "symgrad"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n\ndef f():\n    return b._hidden\n")
    (package / "b.py").write_text("def g():\n    from .a import f\n    return f\n\n_hidden = 1\n")
    (package / "c.py").write_text("from .b import _hidden\n" + "x = 1\n" * MAX_LINES)
    # an import only type checkers read is an edge too; a registry walking its package imports every module
    (package / "e.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .f import F\n")
    (package / "f.py").write_text("from . import e\n")
    (package / "g.py").write_text("from .rules import RULES\n")
    (package / "rules").mkdir()
    (package / "rules" / "__init__.py").write_text(
        "import importlib, pkgutil\n\nRULES = [importlib.import_module("
        "f'{__name__}.{info.name}') for info in pkgutil.iter_modules(__path__)]\n"
    )
    (package / "rules" / "r1.py").write_text("from .. import g\n")
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "ROOT", package)
    monkeypatch.setattr(this, "MODULES", {module_name(path): path for path in sorted(package.rglob("*.py"))})
    assert cycles() == [
        "import cycle: symgrad.a (line 1) -> symgrad.b (line 2) -> symgrad.a",
        "import cycle: symgrad.e (line 4) -> symgrad.f (line 1) -> symgrad.e",
        "import cycle: symgrad.g (line 1) -> symgrad.rules (line 3) -> symgrad.rules.r1 (line 1) -> symgrad.g",
    ]
    assert private_uses() == ["symgrad.a uses symgrad.b._hidden (line 4)", "symgrad.c uses symgrad.b._hidden (line 1)"]
    assert long_files() == [f"symgrad.c has {MAX_LINES + 1} lines (at most {MAX_LINES})"]


def test_benchmarks_have_no_import_cycle(monkeypatch):
    """benchmarks/ read by the same cycle check: the report helpers every benchmark shares live in
    benchmarks/report.py, not in the command (``python -m benchmarks``'s ``__main__``) they imported back."""
    package = ROOT.parent / "benchmarks"
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "ROOT", package)
    monkeypatch.setattr(this, "MODULES", {module_name(path): path for path in sorted(package.rglob("*.py"))})
    assert "benchmarks.__main__" in MODULES and "benchmarks.training" in MODULES
    assert cycles() == []


def test_a_trace_hook_keyed_by_no_rule_fails_at_import():
    """A per-op trace hook is keyed by its rule's op: renaming the op without its hook fails loudly."""
    from symgrad.rules import LAYER_RULES
    from symgrad.trace.dispatch import OP_HOOKS, op_hook

    assert set(OP_HOOKS) <= set(LAYER_RULES) and "batch_norm" in OP_HOOKS
    with pytest.raises(ImportError, match="no rule declares: maxpool2d "):
        op_hook("max_pool1d", "maxpool2d")


def test_a_call_registered_twice_fails_at_import(monkeypatch):
    """One table from a call to its handler: a second handler for a name, a second hook for an op, or a
    registered name a rule's ``calls`` also claim, fails (it would have been silently shadowed)."""
    from symgrad.trace import dispatch
    from symgrad.trace.layers import SpecBuilder
    from symgrad.trace.views import reshape

    with pytest.raises(ImportError, match="two trace handlers for reshape: symgrad.trace.views.reshape and "):
        dispatch.handles("reshape")(lambda builder, call: None)
    with pytest.raises(ImportError, match="two trace hooks for cat: symgrad.trace.op_hooks.cat and "):
        dispatch.op_hook("cat")(lambda builder, op, bound, call: None)
    monkeypatch.setitem(dispatch.HANDLERS, "conv2d", reshape)  # conv2d is the conv2d rule's call
    with pytest.raises(ImportError, match="two trace handlers for conv2d: "):
        dispatch.table(SpecBuilder.rule_call, SpecBuilder.unknown)
    assert dispatch.HANDLERS["reshape"] is reshape and dispatch.route("view") == ("call", None, reshape)


def test_a_trace_hook_written_as_a_method_of_the_walk_fails_at_import():
    """The walk used to find ``SpecBuilder._<op>`` by name; a hook still written that way is refused."""
    from symgrad.trace.layers import SpecBuilder, refuse_method_hooks

    refuse_method_hooks(SpecBuilder)
    stale = type("Stale", (SpecBuilder,), {"_hardswish": lambda self, op, bound, call: None})
    with pytest.raises(ImportError, match="nothing calls: _hardswish "):
        refuse_method_hooks(stale)


def test_ruff_finds_nothing():
    """``ruff check`` with the project's configuration (unused or undefined names, star imports, syntax,
    import order) finds nothing; ``ruff check --fix`` mends most of what it finds."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "symgrad", "benchmarks", "tests", "examples"],
        cwd=ROOT.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "No module named ruff" not in result.stderr, "ruff comes with the [test] extra: pip install -e '.[test]'"
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_format_finds_nothing():
    """``ruff format --check`` with the project's configuration (``[tool.ruff.format]``: 120 columns,
    double quotes) finds every file of symgrad/, benchmarks/, tests/ and examples/ laid out as it would
    write it; ``ruff format symgrad benchmarks tests examples`` mends what it finds."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "symgrad", "benchmarks", "tests", "examples"],
        cwd=ROOT.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "No module named ruff" not in result.stderr, "ruff comes with the [test] extra: pip install -e '.[test]'"
    unformatted = [line for line in result.stdout.splitlines() if line.startswith("Would reformat")]
    assert result.returncode == 0, (
        f"{len(unformatted)} files not as ruff format writes them (fix: ruff format "
        "symgrad benchmarks tests examples):\n" + "\n".join(unformatted[:40]) + result.stderr[-2000:]
    )


def test_no_template_over_600_lines():
    """Templates are held to the same limit (issue 64 item 5): module.py.jinja is its sections in templates/module/."""
    templates = Path(__file__).resolve().parents[1] / "templates"
    found = {path.name: len(path.read_text(encoding="utf-8").splitlines()) for path in templates.rglob("*.jinja")}
    assert len(found) > 5 and not {name: count for name, count in found.items() if count > MAX_LINES}
