"""Hostile input: injection attempts are refused; what is accepted imports safely; fuzzing never crashes.

``SYMGRAD_FUZZ_EXAMPLES`` sets how many examples each hypothesis test draws (CI uses the default;
``SYMGRAD_FUZZ_EXAMPLES=2000 python -m pytest tests/cli/test_hostile_specs.py`` is the long fuzz).
"""

from __future__ import annotations

import os

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from symgrad.check import random_inputs, relative_error, verify
from symgrad.errors import SpecError
from symgrad.graph import build_graph
from symgrad.spec import parse_spec
from tests.cli.test_spec_errors import GOOD
from tests.helpers import build_text, generated_module, spec_text

EXAMPLES = int(os.environ.get("SYMGRAD_FUZZ_EXAMPLES", "25"))
# the bounded run (CI) draws the same examples every time, so it is reproducible; a long fuzz explores
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize="SYMGRAD_FUZZ_EXAMPLES" not in os.environ,
)

INJECTIONS = [
    'x"; import os; os.system("echo pwned")  #',
    "x\nimport os",
    "__import__('os')",
    "{{ 7 * 7 }}",
    "{% for c in [].__class__.__base__.__subclasses__() %}{% endfor %}",
    "x' + '",
    "os.system",
    "x y",
    "x-1",
    "ｘ",
    "x\u200b",
    "",
    " x",
    "x\\",
    "__class__",
    "_private",
]


@pytest.mark.parametrize("text", INJECTIONS)
@pytest.mark.parametrize("where", ["name", "input", "out", "wrt", "reference"])
def test_injection_in_any_name_is_refused(text, where):
    document = yaml.safe_load(GOOD)
    if where == "name":
        document["name"] = text
    elif where == "input":
        document["inputs"] = {text: document["inputs"].pop("x"), **document["inputs"]}
        document["wrt"] = [text, "w"]
    elif where == "out":
        document["layers"][1]["out"] = text
    elif where == "wrt":
        document["wrt"] = [text]
    else:
        document["layers"][1]["in"] = text
    with pytest.raises(SpecError) as error:
        build_graph(parse_spec(yaml.safe_dump(document), "hostile.yaml"))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("value", ["__import__('os').system('x')", "1; import os", "{{ 7 * 7 }}", [1, "2"], "1e3"])
@pytest.mark.parametrize("argument", ["stride", "padding", "dilation", "groups"])
def test_injection_in_argument_values_is_refused(argument, value):
    document = yaml.safe_load(GOOD)
    document["layers"][0][argument] = value
    with pytest.raises(SpecError):
        build_graph(parse_spec(yaml.safe_dump(document), "hostile.yaml"))


def test_accepted_odd_names_emit_a_module_that_imports_safely():
    """Names that shadow builtins (exec, eval, open, input) are legal identifiers: the module must still be sound."""
    text = spec_text(
        {"exec": [2, 3], "eval": [2, 3], "open": [2, 3]},
        [{"op": "mul", "in": ["exec", "eval"], "out": "input"}, {"op": "mul", "other": 1e-300, "out": "print"}],
        {"op": "half_sq_error", "target": "open", "reduction": "mean"},
        ["exec", "eval"],
        name="builtins_shadow",
    )
    built = build_text(text)
    source = built.rendered.files["builtins_shadow.py"]
    assert "import os" not in source and "__import__" not in source
    module = generated_module(built)
    report = verify(built.graph, module, built.shapes)
    assert report.worst() <= 1e-10


# ---------------------------------------------------------------------------------------------
# Fuzzing: random valid chains match autograd; random corruptions never crash.
# ---------------------------------------------------------------------------------------------


@st.composite
def valid_specs(draw):
    """A random chain of conv2d / relu / add / sub / mul layers with consistent shapes.

    Each layer reads the previous node; binary ops take a second operand from any earlier node of
    the same shape, which makes branches (skip connections, a node used twice)."""
    batch = draw(st.integers(1, 3))
    channels = draw(st.integers(1, 4))
    size = draw(st.integers(5, 9))
    inputs = {"x": [batch, channels, size, size]}
    nodes = {"x": (channels, size)}
    layers, wrt = [], ["x"]
    source = "x"
    for index in range(draw(st.integers(1, 4))):
        c, s = nodes[source]
        kind = draw(st.sampled_from(["conv2d", "conv2d", "relu", "add", "mul", "sub", "scale", "unary", "unary"]))
        out = f"n{index}"
        if kind == "conv2d":
            groups = draw(st.sampled_from([g for g in (1, 2) if c % g == 0]))
            c_out = groups * draw(st.integers(1, 2))
            kernel = draw(st.integers(1, 3))
            stride, dilation = draw(st.integers(1, 3)), draw(st.integers(1, 2))
            padding = draw(st.integers(0, 2))
            span = dilation * (kernel - 1) + 1
            if s + 2 * padding < span:
                continue
            weight = f"w{index}"
            inputs[weight] = [c_out, c // groups, kernel, kernel]
            layer = {
                "op": "conv2d",
                "in": source,
                "weight": weight,
                "stride": stride,
                "padding": padding,
                "dilation": dilation,
                "groups": groups,
                "out": out,
            }
            if draw(st.booleans()):
                inputs[f"b{index}"] = [c_out]
                layer["bias"] = f"b{index}"
            if draw(st.booleans()):
                wrt.append(weight)
            nodes[out] = (c_out, (s + 2 * padding - span) // stride + 1)
        elif kind in ("add", "mul", "sub"):
            partners = sorted(name for name, shape in nodes.items() if shape == (c, s))
            layer = {"op": kind, "in": [source, draw(st.sampled_from(partners))], "out": out}
            nodes[out] = (c, s)
        elif kind == "scale":
            layer = {
                "op": draw(st.sampled_from(["mul", "div"])),
                "in": source,
                "other": draw(st.sampled_from([0.5, -2, 3, 0.125])),
                "out": out,
            }
            nodes[out] = (c, s)
        elif kind == "unary":
            op, args = draw(
                st.sampled_from(
                    [
                        ("sigmoid", {}),
                        ("tanh", {}),
                        ("silu", {}),
                        ("gelu", {}),
                        ("gelu", {"approximate": "tanh"}),
                        ("elu", {"alpha": 0.5}),
                        ("leaky_relu", {"negative_slope": 0.1}),
                        ("hardtanh", {}),
                        ("relu6", {}),
                        ("softplus", {}),
                        ("abs", {}),
                        ("neg", {}),
                        ("pow", {"exponent": 2}),
                    ]
                )
            )
            layer = {"op": op, "in": source, **args, "out": out}
            nodes[out] = (c, s)
        else:
            layer = {"op": "relu", "in": source, "out": out}
            nodes[out] = (c, s)
        layers.append(layer)
        source = out
    if not layers:
        layers.append({"op": "relu", "in": "x", "out": "n_last"})
        nodes["n_last"] = nodes["x"]
    final = layers[-1]["out"]
    c, s = nodes[final]
    inputs["y"] = [batch, c, s, s]
    reduction = draw(st.sampled_from(["sum", "mean", "per_sample"]))
    return inputs, layers, {"op": "half_sq_error", "in": final, "target": "y", "reduction": reduction}, wrt


@FUZZ
@given(valid_specs())
def test_random_valid_specs_match_autograd(case):
    inputs, layers, loss, wrt = case
    text = spec_text(inputs, layers, loss, wrt, name="fuzz_case")
    built = build_text(text)
    module = generated_module(built)
    report = verify(built.graph, module, built.shapes, seed=3)
    assert report.forward_error <= 1e-12
    for name, error in report.gradient_errors.items():
        assert error <= 1e-10, (name, error, text)
    inputs = random_inputs(built.shapes[0], built.graph.wrt, seed=4)
    before = {name: value.detach().clone() for name, value in inputs.items()}
    loss = module.forward(**inputs)
    expected = torch.autograd.grad(loss, [inputs[name] for name in built.graph.wrt], torch.ones_like(loss))
    actual = module.gradients(**inputs)  # with the default cotangent, so that path runs too
    for name, gradient in zip(built.graph.wrt, expected):
        assert relative_error(getattr(actual, name), gradient) <= 1e-10, (name, text)
    assert all(torch.equal(value, before[name]) for name, value in inputs.items()), text


@FUZZ
@given(st.data())
def test_corrupted_specs_never_crash(data):
    text = GOOD
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["delete", "insert", "replace", "swap-lines", "duplicate-line"]))
        position = data.draw(st.integers(0, len(text)))
        if kind == "delete":
            text = text[:position] + text[position + data.draw(st.integers(1, 10)) :]
        elif kind == "insert":
            text = text[:position] + data.draw(st.text(min_size=1, max_size=8)) + text[position:]
        elif kind == "replace":
            text = (
                text[:position]
                + data.draw(
                    st.sampled_from(
                        [
                            "-",
                            ":",
                            "[",
                            "]",
                            "{",
                            "}",
                            "0",
                            "-1",
                            "x",
                            "\t",
                            "&a",
                            "*a",
                            "!!python/object:os.system",
                            "'",
                            ".nan",
                            "-.inf",
                            "1.0e+400",
                            "9" * 30,
                            "1.0e-320",
                        ]
                    )
                )
                + text[position + 1 :]
            )
        else:
            lines = text.split("\n")
            i, j = data.draw(st.integers(0, len(lines) - 1)), data.draw(st.integers(0, len(lines) - 1))
            if kind == "swap-lines":
                lines[i], lines[j] = lines[j], lines[i]
            else:
                lines.insert(i, lines[j])
            text = "\n".join(lines)
    try:
        graph = build_graph(parse_spec(text, "fuzz.yaml"))
    except SpecError as error:
        assert "\n" not in str(error) and str(error).startswith("fuzz.yaml") or error.location is None
        return
    from symgrad.reverse import derive

    derive(graph)  # an accepted corruption must still derive
