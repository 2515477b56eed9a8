"""The derivation documents link each step to the module's line that holds it (issue 64 items 2 and 4), and
those lines are known from where each printed line landed as the module was printed
(``symgrad.documents.placed_lines``), not by reading the module back: checked here against the text."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

import symgrad.overview
import symgrad.render
from symgrad.pipeline import build_text
from symgrad.render import render_structured
from symgrad.trace import LossChoice, trace

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| \d+ \| `(\w+)` \| .* \| (?:\[L(\d+)\]\(\w+\.py#L\d+\))? \|$")


def _resnet18_text() -> str:
    spec = importlib.util.spec_from_file_location("train_resnet_example", ROOT / "examples" / "train_resnet.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return trace(
        module.ResNet18(width=4),
        {"x": (2, 3, 32, 32)},
        wrt="parameters",
        name="resnet18",
        loss=LossChoice("cross_entropy"),
        mode="train",
        blocks=True,
    )


@pytest.fixture(scope="module")
def resnet18():
    return build_text(_resnet18_text(), "resnet18.yaml").rendered.files


def _tables(markdown: str) -> dict[str, list[tuple[str, int | None]]]:
    """Each step table of the Markdown (under its ``## Block NAME`` or ``## Top level`` heading): its rows'
    (node, linked line or None)."""
    tables, heading = {}, None
    for text in markdown.splitlines():
        if text.startswith("## "):
            heading = text[3:]
        row = ROW.match(text)
        if row and heading:
            tables.setdefault(heading, []).append((row.group(1), int(row.group(2)) if row.group(2) else None))
    return tables


def _function_of(module: list[str], line: int) -> str:
    """The name of the top-level function holding the module's 1-based ``line``."""
    for text in reversed(module[:line]):
        if text.startswith("def "):
            return text[4:].split("(", 1)[0]
    return ""


def test_the_resnet18_step_tables_link_each_step_to_its_line_of_the_module(resnet18):
    module = resnet18["resnet18.py"].splitlines()
    tables = _tables(resnet18["resnet18.md"])
    assert "Top level" in tables and any(heading.startswith("Block ") for heading in tables), list(tables)
    linked = 0
    for heading, rows in tables.items():
        function = "_backward_from_saved" if heading == "Top level" else heading.split()[-1] + "_backward"
        for node, line in rows:
            if line is None:
                continue
            linked += 1
            text = module[line - 1].strip()
            assert _function_of(module, line) == function, (heading, node, line)
            # the comment about the node (its pullback, its kernel's formula, the sum of its paths), or a
            # block's call
            about = (f"# {node} = ", f"# {node}: ", f"# {node} feeds ", f"grads_{node} = ")
            assert text.startswith(about), (heading, node, line, text)
    assert linked >= 20, linked  # every op of the block and of the stem and head
    lines = [str(line) for rows in tables.values() for _, line in rows if line is not None]
    assert re.findall(r'<a href="resnet18\.py">line (\d+)</a>', resnet18["resnet18.html"]) == lines


@pytest.mark.parametrize("name", ["seed3_conv_relu_conv", "unrolled_blocks"])
def test_each_printed_backward_line_is_placed_where_the_module_prints_it(name, monkeypatch):
    """``placed_lines``: each backward line's comment and statement at the line the module text holds
    them, for a flat spec and a block spec (each block's backward and the top level's)."""
    rendered = []

    def recorded(structured, spec_label):
        rendered.append(render_structured(structured, spec_label))
        return rendered[-1]

    monkeypatch.setattr(symgrad.render, "render_structured", recorded)
    build_text((ROOT / "examples" / f"{name}.yaml").read_text(), f"{name}.yaml")
    ((text, model, where),) = rendered
    module = text.splitlines()
    printed = [*model.functions.saving.backward, *(line for block in model.blocks.functions for line in block.backward)]
    commented = 0
    for line in printed:
        if line.control:
            continue
        at = where[id(line)]
        assert module[at["statement"] - 1].strip().startswith(f"{line.target} = "), (line.text, at)
        if line.comment:
            first = module[at["comment"] - 1].strip()
            assert first == "# " + line.comment or line.comment.startswith(first[2:]), (line.comment, first)
            assert at["comment"] < at["statement"]
            commented += 1
    assert commented >= 4, commented


def test_the_documents_code_reads_no_generated_text_with_a_regex():
    """The step tables' lines come from ``placed_lines``: nothing in the documents' code imports ``re``."""
    for name in ("overview.py", "documents.py", "render_documents.py", "render.py"):
        tree = ast.parse((ROOT / "symgrad" / name).read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "re" not in imported, name
    assert not hasattr(symgrad.overview, "module_lines")
