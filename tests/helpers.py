"""Shared test helpers: build a spec from Python values, and import its generated module from memory."""

from __future__ import annotations

import yaml

from symgrad.check import by_name, module_from_source
from symgrad.pipeline import Built, build_text as _build_text


def spec_text(inputs: dict, layers: list, loss: dict, wrt: list, name: str = "rule_case") -> str:
    document = {"name": name, "inputs": {key: (dict(shape) if isinstance(shape, dict) else {"shape": list(shape)})
                                         for key, shape in inputs.items()},
                "layers": layers, "loss": loss, "wrt": wrt}
    return yaml.safe_dump(document, sort_keys=False)


def build_text(text: str, label: str = "case.yaml", extras: tuple[str, ...] = ()) -> Built:
    return _build_text(text, label, extras)


def generated_module(built: Built):
    """The generated module, called with every input by its spec name (``check.by_name``: the
    inputs with a ``source:`` go in its ``params`` mapping)."""
    module = module_from_source(built.rendered.files[f"{built.rendered.name}.py"], built.rendered.name)
    return by_name(module, built.graph)
