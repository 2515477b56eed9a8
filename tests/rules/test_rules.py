"""Every rule, through the whole pipeline, against torch.autograd: one checker, every rule's samples.

Each case is a sample a rule declares (``SAMPLES`` in its ``symgrad/rules/`` module; tests/rules/samples.py
turns each into a small spec). The checker generates its module and asserts, in float64 with a random
cotangent, that the explicit gradients match autograd on PyTorch's own functions (``verify``), and
that the explicit backward passes gradcheck and gradgradcheck.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.attention

from symgrad import roles
from symgrad.check import random_inputs, relative_error, verify
from symgrad.graph import build_graph
from symgrad.roles import channels_last_inputs
from symgrad.rules import all_rules
from symgrad.spec import parse_spec
from tests.helpers import build_text, generated_module, spec_text
from tests.rules.samples import CASES, OWNERS, TEXTS

ROOT = Path(__file__).resolve().parents[2]

SQ = {"op": "half_sq_error", "target": "y", "reduction": "sum"}


def _seeded(module):
    """The generated module's functions, each run from torch's seed 0."""
    import types

    def seeded(function):
        def run(*arguments, **keywords):
            with torch.random.fork_rng():
                torch.manual_seed(0)
                return function(*arguments, **keywords)

        return run

    names = ("forward", "gradients", "hvp", "loss_with_explicit_backward")
    return types.SimpleNamespace(**{**vars(module), **{name: seeded(getattr(module, name)) for name in names}})


@pytest.mark.parametrize("text", CASES)
def test_rule_matches_autograd_and_is_twice_differentiable(text):
    built = build_text(text, extras=("hvp",))
    module = generated_module(built)
    if any(getattr(node.rule, "random", False) for node in built.graph.nodes.values() if node.rule):
        module = _seeded(module)  # dropout: every call draws the same masks, as two runs of a model from one seed
    report = verify(built.graph, module, built.shapes, seed=11)
    assert report.forward_error <= 1e-12
    for name, error in report.gradient_errors.items():
        assert error <= 1e-10, (name, error)

    inputs = random_inputs(built.shapes[0], built.graph.wrt, seed=12, classes=built.graph.class_counts(built.shapes[0]))
    fixed = {name: value.detach() for name, value in inputs.items() if name not in built.graph.wrt}
    wrt = [inputs[name] for name in built.graph.wrt]

    def loss(*values):
        return module.loss_with_explicit_backward(**fixed, **dict(zip(built.graph.wrt, values)))

    assert torch.autograd.gradcheck(loss, wrt)
    assert torch.autograd.gradgradcheck(loss, wrt)

    # the closed-form Hessian-vector product against forward-over-reverse autograd
    inputs = random_inputs(built.shapes[0], built.graph.wrt, seed=15, classes=built.graph.class_counts(built.shapes[0]))
    names = list(inputs)
    cotangent = torch.randn(
        module.forward(**inputs).shape, dtype=torch.float64, generator=torch.Generator().manual_seed(16)
    )
    primals = tuple(inputs[name].detach() for name in built.graph.wrt)
    directions = tuple(torch.randn_like(p) for p in primals)

    def weighted_loss(*values):
        arguments = {**{name: inputs[name].detach() for name in names}, **dict(zip(built.graph.wrt, values))}
        return (cotangent * module.forward(**arguments)).sum()

    try:  # scaled_dot_product_attention through PyTorch's math kernel, the one with forward AD on a CPU
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            _, expected = torch.func.jvp(
                torch.func.grad(weighted_loss, argnums=tuple(range(len(primals)))), primals, directions
            )
    except NotImplementedError:  # PyTorch cannot differentiate hardsigmoid_backward at all: forward AD through the

        def explicit(
            *values,
        ):  # explicit gradients instead (checked against autograd below, and by gradgradcheck above)
            result = module.gradients(
                **{**{name: inputs[name].detach() for name in names}, **dict(zip(built.graph.wrt, values))},
                grad_loss=cotangent,
            )
            return tuple(getattr(result, name) for name in built.graph.wrt)

        _, expected = torch.func.jvp(explicit, primals, directions)
    actual = module.hvp(
        **{name: inputs[name].detach() for name in names},
        **{f"tangent_{name}": d for name, d in zip(built.graph.wrt, directions)},
        grad_loss=cotangent,
    )
    for name, reference in zip(built.graph.wrt, expected):
        assert relative_error(getattr(actual, name), reference) <= 1e-10, ("hvp", name)

    # gradients with the inputs' own cotangent at every test shape: the same gradients, inputs untouched
    for shapes in built.shapes:
        inputs = random_inputs(shapes, built.graph.wrt, seed=13, classes=built.graph.class_counts(shapes))
        before = {name: value.detach().clone() for name, value in inputs.items()}
        reference = module.forward(**inputs)
        cotangent = torch.randn(reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(14))
        expected = torch.autograd.grad(reference, [inputs[name] for name in built.graph.wrt], cotangent)
        actual = module.gradients(**inputs, grad_loss=cotangent)
        for name, gradient in zip(built.graph.wrt, expected):
            assert relative_error(getattr(actual, name), gradient) <= 1e-10, name
        for name, value in inputs.items():
            assert torch.equal(value, before[name]), name


def _moves_to_channels_last(text: str) -> bool:
    """Whether the case has a 2-d convolution that channels_last is chosen for once size is no object."""
    return bool(channels_last_inputs(build_graph(parse_spec(text, "case.yaml")), min_positions=1))


CHANNELS_LAST_CASES = [case for case in CASES if _moves_to_channels_last(case.values[0])]


def test_no_rule_emits_a_view_which_a_channels_last_tensor_can_refuse():
    """The layout choice relies on every emitted op taking any strides (a shape `.view` raises on some;
    a view as a dtype of the same size, a mask's `.bool().view(torch.uint8)`, takes any strides)."""
    from pathlib import Path

    import symgrad

    sources = [*(Path(symgrad.__file__).parent / "rules").glob("*.py"), Path(symgrad.__file__).parent / "printing.py"]
    code = {path.name: path.read_text().split("\nSAMPLES = {")[0] for path in sources}  # not the samples' spellings
    assert [name for name, text in code.items() if re.search(r"\.view\((?!torch\.uint8\))", text)] == []
    for layout in (torch.contiguous_format, torch.channels_last):
        mask = torch.randn(2, 3, 4, 5).contiguous(memory_format=layout)[:, 1:, ::2].bool()
        assert torch.equal(mask.view(torch.uint8), mask.to(torch.uint8))


def test_enough_cases_reach_the_channels_last_layout():
    assert len(CHANNELS_LAST_CASES) >= 10


@pytest.mark.parametrize("text", CHANNELS_LAST_CASES)
def test_channels_last_internal_layout_keeps_the_gradients_and_the_callers_layout(text, monkeypatch):
    monkeypatch.setattr(roles, "CHANNELS_LAST_MIN_POSITIONS", 1)  # the small test shapes take the path too
    built = build_text(text)
    module = generated_module(built)
    assert "memory_format=torch.channels_last" in built.rendered.files[f"{built.rendered.name}.py"]
    report = verify(built.graph, module, built.shapes, seed=21)
    assert report.problem is None, report.problem
    for name, error in report.gradient_errors.items():
        assert error <= 1e-10, (name, error)

    wrt = built.graph.wrt
    for layout in (torch.contiguous_format, torch.channels_last):
        inputs = random_inputs(built.shapes[0], wrt, seed=22, classes=built.graph.class_counts(built.shapes[0]))
        inputs = {
            name: (
                value.detach().contiguous(memory_format=layout).requires_grad_(value.requires_grad)
                if value.dim() == 4 and value.is_floating_point()
                else value
            )
            for name, value in inputs.items()
        }
        reference = module.forward(**inputs)
        cotangent = torch.randn(reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(23))
        expected = torch.autograd.grad(reference, [inputs[name] for name in wrt], cotangent)
        detached = {name: value.detach() for name, value in inputs.items()}
        results = {"gradients": module.gradients(**detached, grad_loss=cotangent)}
        for recompute in (False, True):
            copies = {
                name: value.detach().clone(memory_format=torch.preserve_format).requires_grad_(name in wrt)
                for name, value in inputs.items()
            }
            module.loss_with_explicit_backward(**copies, recompute=recompute).backward(cotangent)
            results[f"ExplicitGradient, recompute={recompute}"] = {name: copies[name].grad for name in wrt}
        for function, result in results.items():
            for name, gradient in zip(wrt, expected):
                actual = result[name] if isinstance(result, dict) else getattr(result, name)
                assert relative_error(actual, gradient) <= 1e-10, (function, name)
                if inputs[name].dim() == 4:  # returned in the layout the caller's tensor has
                    assert actual.is_contiguous(memory_format=layout), (function, name, layout)

        fixed = {name: value for name, value in detached.items() if name not in wrt}
        leaves = [detached[name].clone(memory_format=torch.preserve_format).requires_grad_() for name in wrt]

        def loss(*values):
            return module.loss_with_explicit_backward(**fixed, **dict(zip(wrt, values)))

        assert torch.autograd.gradcheck(loss, leaves)
        assert torch.autograd.gradgradcheck(loss, leaves)


def test_every_rule_has_a_case():
    """Every rule declares a sample, each of its samples uses it, and no two samples share an id."""
    assert [rule.op for rule in all_rules() if not rule.samples] == []
    assert [case.id for case in CASES if OWNERS[case.id].op not in _ops_of(case.values[0])] == []
    assert len(TEXTS) == len(CASES)


def test_samples_and_spellings_are_plain_values():
    """The declarations build nothing at import (no tensor, module or function): tests build those."""
    import dataclasses

    def impure(value) -> list:
        if isinstance(value, (dict, list, tuple)):
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else list(value)
            return [bad for item in items for bad in impure(item)]
        return [] if value is None or isinstance(value, (str, int, float, bool)) else [value]

    declared = [item for rule in all_rules() for item in (*rule.samples, *rule.spellings)]
    assert len(declared) > 2 * len(all_rules())
    assert [(item, impure(dataclasses.astuple(item))) for item in declared if impure(dataclasses.astuple(item))] == []


def test_a_sample_or_spelling_of_no_op_of_the_module_is_refused():
    import types

    from symgrad.rules import LAYER_RULES, _declare

    module = types.SimpleNamespace(SAMPLES={"sofmax": []})  # a typo: the samples would be silently lost
    with pytest.raises(ValueError, match=r"symgrad/rules/softmax.py: SAMPLES names \['sofmax'\], not ops of its RULES"):
        _declare("softmax", module, [LAYER_RULES["softmax"]])
    assert LAYER_RULES["softmax"].samples  # untouched


def _ops_of(text: str) -> set[str]:
    return {line.split("op: ")[1].split()[0].strip(",}") for line in text.splitlines() if "op: " in line}


def test_relu_mask_is_derived_by_sympy_with_pytorchs_kink_convention():
    import sympy

    from symgrad.rules import LAYER_RULES
    from symgrad.rules.elementwise import INPUT as x

    relu = LAYER_RULES["relu"]
    assert relu.local_derivative(x) == sympy.Heaviside(x, 0)  # sympy's d/dx max(0, x), with H(0) = 0
    # the emitted mask reads the output instead: H(x) == H(relu(x)) everywhere, the kink included
    for value in (-2, -sympy.Rational(1, 3), 0, sympy.Rational(1, 7), 5):
        assert relu.local_derivative(x).subs(x, value) == relu.from_output(sympy.Max(0, value))

    built = build_text(spec_text({"x": [4], "y": [4]}, [{"op": "relu"}], SQ, ["x"]))
    mask = next(s for s in built.program.backward if s.target.name.startswith("mask_"))
    assert mask.value == sympy.Heaviside(sympy.Symbol("relu_1"), 0)
    module = generated_module(built)
    inputs = torch.tensor([-1.0, 0.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    y = torch.zeros(4, dtype=torch.float64)
    (expected,) = torch.autograd.grad(module.forward(inputs, y), inputs)
    assert torch.equal(module.gradients(inputs, y).x, expected)  # relu'(0) = 0, as PyTorch


PER_SAMPLE_CASES = [
    case for case in CASES if case.id.startswith("conv") and "weight-only" not in case.id and "unbatched" not in case.id
]  # one unbatched input is one sample: refused, tested below


@pytest.mark.parametrize("text", PER_SAMPLE_CASES)
def test_per_sample_kernel_gradients_match_vmap_of_grad(text):
    text = text.replace("reduction: sum", "reduction: per_sample")
    built = build_text(text, extras=("per_sample",))
    module = generated_module(built)
    inputs = {name: value.detach() for name, value in random_inputs(built.shapes[1], (), seed=21).items()}
    cotangent = torch.randn(
        module.forward(**inputs).shape, dtype=torch.float64, generator=torch.Generator().manual_seed(22)
    )
    from symgrad.shapes import batch_inputs

    batched = batch_inputs(built.graph)
    assert "x" in batched and "y" in batched and "w" not in batched
    parameters = [name for name in built.graph.wrt if name not in batched]

    def one_sample_loss(parameter_values, sample_values, weight):
        values = {
            **inputs,
            **dict(zip(parameters, parameter_values)),
            **{name: value.unsqueeze(0) for name, value in zip(batched, sample_values)},
        }
        return weight * module.forward(**values)[0]

    expected = torch.func.vmap(torch.func.grad(one_sample_loss), in_dims=(None, 0, 0))(
        tuple(inputs[name] for name in parameters), tuple(inputs[name] for name in batched), cotangent
    )
    actual = module.per_sample_gradients(**inputs, grad_loss=cotangent)
    assert list(actual._fields) == parameters
    for name, reference in zip(parameters, expected):
        assert relative_error(getattr(actual, name), reference) <= 1e-10, name

    def per_sample_of_parameters(*parameter_values):
        return tuple(
            module.per_sample_gradients(**{**inputs, **dict(zip(parameters, parameter_values))}, grad_loss=cotangent)
        )

    wanted = tuple(inputs[name].clone().requires_grad_() for name in parameters)
    assert torch.autograd.gradcheck(per_sample_of_parameters, wanted, fast_mode=True)
    assert torch.autograd.gradgradcheck(per_sample_of_parameters, wanted, fast_mode=True)


def test_per_sample_products_run_as_soon_as_their_gradient_exists_and_free_it():
    """Each per-sample product is scheduled right after the output gradient it reads, which is then
    deleted, instead of every gradient living to the end of the function."""
    import ast

    tree = ast.parse((ROOT / "generated" / "seed3_conv_relu_conv.py").read_text())
    function = next(node for node in tree.body if getattr(node, "name", "") == "per_sample_gradients")
    lines = [
        ast.unparse(statement)
        for statement in function.body[:-1]  # statements, however each is wrapped
        if not isinstance(statement, ast.Expr)
    ]  # (not the docstring)
    product = next(i for i, line in enumerate(lines) if line.startswith("per_sample_grad_w2 ="))
    assert lines[product - 2].startswith("grad_conv2 =")  # made, its forward inputs freed, then read at once
    assert lines[product + 1].startswith("grad_relu1 =") and lines[product + 2] == "del grad_conv2"
    assert lines[-1] == "del grad_conv1"


def test_per_sample_refuses_what_it_cannot_derive():
    from symgrad.errors import SpecError

    scale = spec_text(
        {"x": [2, 3], "s": [1, 3], "y": [2, 3]},
        [{"op": "mul", "in": ["x", "s"]}],
        {**SQ, "reduction": "per_sample"},
        ["x", "s"],
    )
    with pytest.raises(SpecError, match="per-sample gradients of 's' as the other of mul"):
        build_text(scale, extras=("per_sample",))
    with pytest.raises(SpecError, match="reduction: per_sample"):
        build_text(TEXTS["conv2d-odd-size"], extras=("per_sample",))
    unbatched = TEXTS["conv2d-unbatched-groups-bias"]
    with pytest.raises(SpecError, match="per-sample gradients of 'x' as the input of conv2d 'out' are not supported"):
        build_text(unbatched.replace("reduction: sum", "reduction: per_sample"), extras=("per_sample",))


def test_generated_test_file_of_a_classification_spec_passes(tmp_path):
    """The generated test draws class indices below each shape set's class count."""
    from tests.helpers import run_generated_tests

    text = spec_text(
        {"x": [4, 5], "w": [3, 5], "t": {"shape": [4], "dtype": "int64"}},
        [{"op": "linear", "weight": "w", "out": "logits"}],
        {"op": "cross_entropy", "in": "logits", "target": "t"},
        ["x", "w"],
        name="classifier",
    )
    for name, content in build_text(text).rendered.files.items():
        (tmp_path / name).write_text(content)
    result = run_generated_tests(tmp_path / "test_classifier.py")
    assert result.failed == 0 and result.passed > 0, result.report


def _declared_lacks(rule, certified_ops: set[str]) -> list[str]:
    """What a rule still lacks of the op contract (``symgrad/rules/base.py``), in words a contributor
    can act on: every fact the tracer, the checker, the docs and the certificates read from it."""
    from symgrad.rules.base import Rule
    from symgrad.trace.torch_names import torch_signature

    lacks = []
    if not rule.summary:
        lacks.append("summary (its one-line description in `symgrad ops`)")
    try:
        rule.table_row()
    except NotImplementedError:
        lacks.append("table_row (forward and local gradient for `symgrad ops` and docs/ops.md)")
    if not rule.calls and not rule.traced_elsewhere:
        lacks.append("calls (the torch calls `symgrad trace` records as this op), or traced_elsewhere saying why none")
    elif rule.calls and rule.signature is None:
        try:
            torch_signature(rule.op)
        except (LookupError, AttributeError):
            lacks.append("signature (PyTorch's positional argument names: it has none to read)")
    if type(rule).reference is Rule.reference and not (
        hasattr(torch.nn.functional, rule.op) or hasattr(torch, rule.op)
    ):
        lacks.append("reference (how PyTorch computes the op, for `symgrad verify`)")
    if not rule.samples:
        lacks.append("samples (its spec-level cases: SAMPLES[op] in its rule file, base.Sample)")
    if not rule.spellings:
        lacks.append(
            "spellings (how models write it, traced by tests/trace/test_ops.py: SPELLINGS[op] in its rule file, "
            "base.Spelling)"
        )
    if rule.linear_in and rule.op not in certified_ops:
        lacks.append(
            "a certificate case in its rule file's CERTIFICATES (it is linear in " + ", ".join(rule.linear_in) + ")"
        )
    return lacks


def _certified() -> set[str]:
    from symgrad.rules import CERTIFICATE_CASES
    from symgrad.rules.conv import CONV_CERTIFICATES

    return {layer["op"] for _, _, layer, _ in CERTIFICATE_CASES} | {f"conv{case[0]}d" for case in CONV_CERTIFICATES}


def test_every_rule_declares_what_the_pipeline_reads():
    certified = _certified()
    lacking = {rule.op: _declared_lacks(rule, certified) for rule in all_rules()}
    report = [f"rule {op} lacks: " + "; ".join(lacks) for op, lacks in lacking.items() if lacks]
    assert not report, "\n".join(report)


def test_a_new_rule_is_told_exactly_what_it_lacks():
    from symgrad.rules.base import Operand, Rule

    class Softsign(Rule):  # a contributor's first draft: the math is there, nothing else
        op = "softsign"
        operands = (Operand("input", from_in=True),)
        linear_in = ("input",)  # (not true; it makes the certificate check speak)

    lacks = _declared_lacks(Softsign(), _certified())
    assert [item.split(" (")[0] for item in lacks] == [
        "summary",
        "table_row",
        "calls",
        "samples",
        "spellings",
        "a certificate case in its rule file's CERTIFICATES",
    ]


def test_each_torch_call_is_claimed_by_one_rule_and_bound_by_pytorchs_own_names():
    from symgrad.trace.torch_names import SIGNATURES

    assert SIGNATURES["relu_"] == ("relu", ("input", "inplace"))
    assert SIGNATURES["__radd__"][0] == "add" and SIGNATURES["squeeze"][1] == ("input", "dim")
    assert SIGNATURES["conv2d"][1] == ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    assert SIGNATURES["log"][1] == ("input",)  # torch.log's tensor schema, not math's log(a, b)
    claimed = [name for rule in all_rules() for name in rule.calls]
    assert len(claimed) == len(set(claimed))
