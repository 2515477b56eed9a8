"""Shared test helpers: build a spec from Python values, and generate its module in memory."""

from __future__ import annotations

import yaml

from symgrad.check import module_from_source
from symgrad.pipeline import Built
from symgrad.emit import render
from symgrad.graph import build_graph
from symgrad.reverse import derive
from symgrad.shapes import small_shapes
from symgrad.spec import parse_spec


def spec_text(inputs: dict, layers: list, loss: dict, wrt: list, name: str = "rule_case") -> str:
    document = {"name": name, "inputs": {key: {"shape": list(shape)} for key, shape in inputs.items()},
                "layers": layers, "loss": loss, "wrt": wrt}
    return yaml.safe_dump(document, sort_keys=False)


def build_text(text: str, label: str = "case.yaml") -> Built:
    spec = parse_spec(text, label)
    graph = build_graph(spec)
    program = derive(graph)
    return Built(label, graph, program, render(program, label), small_shapes(graph))


def generated_module(built: Built):
    return module_from_source(built.rendered.files[f"{built.rendered.name}.py"], built.rendered.name)
