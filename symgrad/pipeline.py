"""Spec file to rendered files: the steps every command shares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .emit import Rendered, render
from .graph import Graph, build_graph
from .printing import to_text
from .reverse import Program, derive
from .shapes import small_shapes
from .spec import read_spec


@dataclass
class Built:
    spec_label: str
    graph: Graph
    program: Program
    rendered: Rendered
    shapes: list[dict[str, tuple[int, ...]]]

    @property
    def forward_text(self) -> list[str]:
        return [f"{s.target} = {to_text(s.math if s.math is not None else s.value)}" for s in self.program.forward]


def build(spec_path: str | Path, spec_label: str | None = None) -> Built:
    spec = read_spec(spec_path)
    graph = build_graph(spec)
    program = derive(graph)
    label = spec_label or Path(spec_path).as_posix()
    return Built(label, graph, program, render(program, label), small_shapes(graph))
