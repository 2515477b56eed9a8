"""symgrad.plan decides what each generated function runs; symgrad.emit only prints and renders."""

from __future__ import annotations

import ast
from pathlib import Path

from symgrad.pipeline import build
from symgrad.plan import plan
from symgrad.reverse import derive
from symgrad.shapes import small_shapes

ROOT = Path(__file__).resolve().parent.parent


def test_emit_imports_no_planning_module():
    tree = ast.parse((ROOT / "symgrad" / "emit.py").read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not imported & {"reverse", "tangent", "shapes", "roles"}, imported


def test_a_deleted_value_is_never_read_again_and_every_returned_gradient_is_kept():
    graph = build(ROOT / "examples" / "seed3_conv_relu_conv.yaml").graph
    program, fast = derive(graph), derive(graph, fused=True)
    planned = plan(program, fast, small_shapes(graph), extras=("hvp", "per_sample"))
    for scheduled in (planned.saving_forward, planned.backward,
                      planned.per_sample_forward + planned.per_sample_backward):
        deleted: set[str] = set()
        for item in scheduled:
            read = {symbol.name for symbol in item.statement.value.free_symbols}
            assert not read & deleted, (item.statement, read & deleted)
            deleted |= set(item.dead)
        returned = {f"grad_{name}" for name in graph.wrt} | {f"per_sample_grad_{name}" for name in graph.wrt}
        assert not deleted & returned, deleted & returned
    assert planned.saved_names and planned.loss_name == "loss"
    assert set(planned.hvp_results) == set(graph.wrt) and planned.per_sample_names == ["w1", "w2"]
