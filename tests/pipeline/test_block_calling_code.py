"""The block form's calling code is general (issue 38, item 5): any name for a block's input, any mix
of ``params:`` and ``prefix:`` binding (by ``source`` or by plain name, shared or not), any number of
instances in a row (three or more that each read only the one before run as a table and a loop).
Every generated module is imported, run, and its gradients compared, float64, with the flat form's
and with autograd through the flat form (``test_blocks._agrees_with_flat_and_autograd``).

``SYMGRAD_FUZZ_EXAMPLES`` sets how many specs the sweep draws (as in ``test_hostile``)."""

from __future__ import annotations

import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.pipeline.test_blocks import _agrees_with_flat_and_autograd

EXAMPLES = int(os.environ.get("SYMGRAD_FUZZ_EXAMPLES", "30"))
SWEEP = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize="SYMGRAD_FUZZ_EXAMPLES" not in os.environ,
)

DOWN = """name: {name}
inputs:
  x: {{shape: [2, 3, 8, 8]}}
{inputs}
  t: {{shape: [2, 3, 8, 8]}}
blocks:
  down:
    inputs: [h]
    params: {params}
    layers:
      - {{op: conv2d, weight: w, padding: 1, out: c}}
      - {{op: relu, out: r}}
{more}
layers:
{layers}
loss: {{op: mse_loss, target: t}}
wrt: [{wrt}]
"""


def _down(name: str, inputs: list[str], layers: list[str], wrt: str, params: str = "[w]", more: str = "") -> str:
    return DOWN.format(
        name=name,
        inputs="\n".join(f"  {line}" for line in inputs),
        params=params,
        more=more,
        layers="\n".join(f"  - {line}" for line in layers),
        wrt=wrt,
    )


# docs/spec.md's own `down` block (its input is `h`), three instances bound by prefix: one loop
THREE_IN_A_ROW = _down(
    "chain_h",
    [f"w{i}: {{shape: [3, 3, 3, 3], source: s{i}.w}}" for i in (1, 2, 3)],
    [
        "{block: down, in: x, prefix: s1, out: a}",
        "{block: down, in: a, prefix: s2, out: b}",
        "{block: down, in: b, prefix: s3, out: c3}",
    ],
    "x, w1, w2, w3",
)

CASES = {
    "three_prefix_instances_of_a_block_whose_input_is_h": THREE_IN_A_ROW,
    # only the last instance trains: the loop stops where no instance before has a gradient to take
    "a_loop_whose_first_instances_are_frozen": THREE_IN_A_ROW.replace("wrt: [x, w1, w2, w3]", "wrt: [w3]"),
    "five_instances_in_a_row": _down(
        "chain_5",
        [f"w{i}: {{shape: [3, 3, 3, 3], source: layer.{i}.w}}" for i in range(5)],
        [f"{{block: down, in: {'x' if i == 0 else f'o{i - 1}'}, prefix: layer.{i}, out: o{i}}}" for i in range(5)],
        "x, w0, w1, w2, w3, w4",
    ),
    # params: bound to inputs with a source whose key is not the block's: their gradients read late
    "params_bound_to_sourced_inputs": _down(
        "params_sourced",
        ["w1: {shape: [3, 3, 3, 3], source: enc.conv.weight}", "w2: {shape: [3, 3, 3, 3], source: dec.conv.weight}"],
        ["{block: down, in: x, params: {w: w1}, out: a}", "{block: down, in: a, params: {w: w2}, out: b}"],
        "x, w1, w2",
    ),
    # one param found by its source, the other by its plain name PREFIX_KEY
    "a_prefix_binding_one_param_by_source_and_one_by_name": _down(
        "mixed_prefix",
        [
            "s1_w: {shape: [3, 3, 3, 3], source: s1.w}",
            "s1_v: {shape: [3, 3, 3, 3]}",
            "s2_w: {shape: [3, 3, 3, 3], source: s2.w}",
            "s2_v: {shape: [3, 3, 3, 3]}",
        ],
        ["{block: down, in: x, prefix: s1, out: a}", "{block: down, in: a, prefix: s2, out: b}"],
        "x, s1_w, s1_v, s2_w, s2_v",
        params="[w, v]",
        more="      - {op: conv2d, weight: v, padding: 1, out: c2}",
    ),
}


@pytest.mark.parametrize("label", list(CASES))
def test_each_binding_form_runs_and_matches_autograd(label):
    _agrees_with_flat_and_autograd(CASES[label], f"{label}.yaml")


KINDS = ("prefix_source", "prefix_name", "prefix_mixed", "params_source", "params_name", "params_shared")


def _weight() -> dict:
    return {"shape": [3, 3, 3, 3]}  # a new list each time: PyYAML would write a shared one as an alias


@st.composite
def block_specs(draw) -> str:
    """A small spec with one block (input named anything, one or two params, a list or keyed as a
    module's), used by one to five instances, each bound its own way, some layers between them."""
    block_input = draw(st.sampled_from(["h", "x", "feat", "inp", "z1"]))
    top_input = draw(st.sampled_from(["x", "img", "h"]))
    keys = draw(st.sampled_from([("w",), ("w", "v"), ("conv.weight",), ("conv1.weight", "conv2.weight")]))
    names = ("w", "v")[: len(keys)]
    skip = draw(st.booleans())  # a second block input, added at the end: the instances never form a loop
    residual = draw(st.booleans())
    count = draw(st.sampled_from([3, 1, 2, 4, 5]))  # hypothesis starts from the first: a loop
    kinds = (
        [draw(st.sampled_from(KINDS))] * count
        if draw(st.booleans())
        else draw(st.lists(st.sampled_from(KINDS), min_size=count, max_size=count))
    )
    inputs: dict[str, dict] = {top_input: {"shape": [2, 3, 6, 6]}}
    layers, previous = [], top_input
    for index, kind in enumerate(kinds):
        instance = {"block": "unit", "in": [previous, "y"] if skip else previous}
        if kind.startswith("prefix"):
            prefix = f"stage.{index}" if kind == "prefix_source" else f"p{index}"
            for number, key in enumerate(keys):
                by_source = kind == "prefix_source" or (kind == "prefix_mixed" and number == 0)
                name = f"s{index}_{number}" if by_source else f"{prefix}_{key.replace('.', '_')}"
                inputs[name] = dict(_weight(), source=f"{prefix}.{key}") if by_source else _weight()
            instance["prefix"] = prefix
        else:
            bound = {}
            for number, param in enumerate(names):
                if kind == "params_shared":
                    name = f"k_{param}"
                    inputs.setdefault(name, dict(_weight(), source=f"shared.{param}") if number else _weight())
                else:
                    name = f"q{index}_{param}"
                    inputs[name] = (
                        dict(_weight(), source=f"other{index}.{param}.weight") if kind == "params_source" else _weight()
                    )
                bound[param] = name
            instance["params"] = bound
        instance["out"] = previous = f"o{index}"
        layers.append(instance)
        if index + 1 < count and draw(st.integers(0, 4)) == 0:  # a layer between two instances
            layers.append({"op": "relu", "in": previous, "out": f"between{index}"})
            previous = f"between{index}"
    if skip:
        inputs["y"] = {"shape": [2, 3, 6, 6]}
    inputs["t"] = {"shape": [2, 3, 6, 6]}
    block_layers = [
        {"op": "conv2d", "in": block_input, "weight": "w", "padding": 1, "out": "c"},
        {"op": "relu", "out": "r"},
    ]
    if len(keys) == 2:
        block_layers.append({"op": "conv2d", "weight": "v", "padding": 1, "out": "c2"})
    if residual:
        block_layers.append({"op": "add", "in": [block_layers[-1]["out"], block_input], "out": "summed"})
    if skip:
        block_layers.append({"op": "add", "in": [block_layers[-1]["out"], "skip"], "out": "joined"})
    candidates = [name for name in inputs if name not in ("t", "y")]
    if draw(st.booleans()):
        wrt = candidates
    else:
        chosen = draw(st.lists(st.booleans(), min_size=len(candidates), max_size=len(candidates)))
        wrt = [name for name, take in zip(candidates, chosen) if take] or [candidates[-1]]
    params = list(keys) if keys == ("w",) or keys == ("w", "v") else dict(zip(names, keys))
    document = {
        "name": "swept",
        "inputs": inputs,
        "blocks": {
            "unit": {"inputs": [block_input] + (["skip"] if skip else []), "params": params, "layers": block_layers}
        },
        "layers": layers,
        "loss": {"op": "mse_loss", "target": "t"},
        "wrt": wrt,
    }
    return yaml.safe_dump(document, sort_keys=False)


@SWEEP
@given(block_specs())
def test_any_block_spec_generates_a_module_that_matches_autograd(text):
    _agrees_with_flat_and_autograd(text, "swept.yaml")


# --------------------------------------------------------------------------------------------
# Names (issue 38, item 4): every name the structured module uses itself is refused at the spec line
# that clashes; the names it does not use are accepted and the module runs
# --------------------------------------------------------------------------------------------

NAMED = """name: blocky
inputs:
  x: {shape: [2, 3, 8, 8]}
  w1: {shape: [3, 3, 3, 3], source: s1.w}
  w2: {shape: [3, 3, 3, 3], source: s2.w}
  w3: {shape: [3, 3, 3, 3], source: s3.w}
  t: {shape: [2, 3, 8, 8]}
blocks:
  unit:
    inputs: [h]
    params: [w]
    layers:
      - {op: conv2d, weight: w, padding: 1, out: c}
      - {op: relu, out: r}
layers:
  - {block: unit, in: x, prefix: s1, out: a}
  - {block: unit, in: a, prefix: s2, out: b}
  - {op: relu, out: g}
  - {block: unit, in: g, prefix: s3, out: d}
loss: {op: mse_loss, target: t}
wrt: [x, w1, w2, w3]
"""


def _renamed(where: str, name: str) -> tuple[str, int]:
    """NAMED with ``name`` put ``where``, and the line the clash is to be reported at."""
    import re

    edits = {
        "block input": ([(r"inputs: \[h\]", f"inputs: [{name}]")], 10),
        "block param": ([(r"params: \[w\]", f"params: {{{name}: w}}"), (r"weight: w,", f"weight: {name},")], 11),
        "block output": ([(r"out: c\}", f"out: {name}}}")], 13),
        "block name": ([(r"  unit:", f"  {name}:"), (r"block: unit", f"block: {name}")], 9),
        "layer output": ([(r"out: g\}", f"out: {name}}}"), (r"in: g,", f"in: {name},")], 18),
        "input": ([(r"  x: \{", f"  {name}: {{"), (r"in: x,", f"in: {name},"), (r"wrt: \[x,", f"wrt: [{name},")], 3),
    }[where]
    text = NAMED
    for old, new in edits[0]:
        assert re.search(old, text), old
        text = re.sub(old, new, text)
    return text, edits[1]


REFUSED = [
    # the block's own functions' arguments and locals: `def unit_forward(h, p, save=False)`, `(saved, grad_output)`
    *[(where, name) for name in ("p", "save", "saved") for where in ("block input", "block param", "block output")],
    # the top level's: ExplicitGradient's `keys`, `kept`, `*values`; `params`, `layouts`; the module's tables
    *[
        (where, name)
        for name in (
            "keys",
            "kept",
            "values",
            "params",
            "layouts",
            "parameter_grads",
            "BLOCKS",
            "MOMENTA",
            "RUNNING",
            "CHANNELS_LAST",
        )
        for where in ("input", "layer output")
    ],
    # what the module names after a block or an instance: `unit_forward`, `saved_a`, `grads_a`, `call_a`
    *[
        (where, name)
        for name in ("unit_forward", "unit_backward", "saved_a", "grads_a", "call_a")
        for where in ("input", "layer output")
    ],
    # a block whose functions would take a name the module uses: `loss_with_explicit_backward`
    ("block name", "loss_with_explicit"),
    ("block name", "per_sample"),
]


@pytest.mark.parametrize("where, name", REFUSED, ids=[f"{where}-{name}" for where, name in REFUSED])
def test_a_name_the_structured_module_uses_itself_is_refused_at_its_line(where, name):
    from symgrad.errors import SpecError
    from symgrad.pipeline import build_text

    text, line = _renamed(where, name)
    with pytest.raises(SpecError) as raised:
        build_text(text, "blocky.yaml")
    message = str(raised.value)
    expected_line = 9 if where == "input" and name.startswith("unit_") else line  # the block takes the name
    assert f"blocky.yaml:{expected_line}:" in message and f"'{name}" in message and "\n" not in message, message
    assert "bug in symgrad" not in message


ACCEPTED = [
    ("layer output", "p"),
    ("input", "p"),
    ("layer output", "save"),
    ("input", "x_layout"),
    ("layer output", "instance_grads"),
    ("block name", "S1"),
]


@pytest.mark.parametrize("where, name", ACCEPTED, ids=[f"{where}-{name}" for where, name in ACCEPTED])
def test_a_name_the_structured_module_does_not_use_is_accepted_and_the_module_runs(where, name):
    text, _ = _renamed(where, name)
    _agrees_with_flat_and_autograd(text, "blocky.yaml")
    _explicit_backward_agrees(text)


def test_a_loop_table_never_takes_an_inputs_name():
    # three instances in a row: the loop's table would be S1_TO_S3, the input's name
    text = (
        NAMED.replace("  - {op: relu, out: g}\n", "")
        .replace("in: g,", "in: b,")
        .replace("  x: {", "  S1_TO_S3: {")
        .replace("in: x,", "in: S1_TO_S3,")
        .replace("wrt: [x,", "wrt: [S1_TO_S3,")
    )
    source = _agrees_with_flat_and_autograd(text, "blocky.yaml")
    assert "S1_TO_S3_2 = (" in source
    _explicit_backward_agrees(text)


def _explicit_backward_agrees(text: str) -> None:
    """``loss_with_explicit_backward(...).backward()`` of the structured module gives autograd's
    gradients through its flat form (float64)."""
    import torch

    from symgrad.check import by_name, graph_inputs, module_from_source
    from symgrad.pipeline import build_text
    from symgrad.testdata import relative_errors

    structured, flat = build_text(text, "blocky.yaml"), build_text(text, "blocky.yaml", flat=True)
    name = flat.graph.spec.name
    ours = by_name(module_from_source(structured.rendered.files[f"{name}.py"], name), flat.graph)
    theirs = by_name(module_from_source(flat.rendered.files[f"{name}.py"], f"{name}_flat"), flat.graph)
    inputs = graph_inputs(flat.graph, flat.shapes[0], seed=3)
    wanted = [inputs[key] for key in flat.graph.wrt]
    expected = torch.autograd.grad(theirs.forward(**inputs), wanted)
    actual = torch.autograd.grad(ours.loss_with_explicit_backward(**inputs), wanted)
    errors = relative_errors(dict(zip(flat.graph.wrt, actual)), dict(zip(flat.graph.wrt, expected)))
    assert max(errors.values()) <= 1e-10, errors
