"""symgrad.schedule decides what each generated function runs; symgrad.emit only prints and renders."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
import yaml

from symgrad.pipeline import build
from symgrad.reverse import derive
from symgrad.schedule import schedule
from symgrad.tangent import derive_extras

ROOT = Path(__file__).resolve().parents[2]


def test_emit_imports_no_planning_module():
    tree = ast.parse((ROOT / "symgrad" / "emit.py").read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not imported & {"reverse", "tangent", "shapes", "roles"}, imported


def test_a_deleted_value_is_never_read_again_and_every_returned_gradient_is_kept():
    graph = build(ROOT / "examples" / "seed3_conv_relu_conv.yaml").graph
    program, fast = derive(graph), derive(graph, fused=True)
    planned = schedule(program, fast, extras=derive_extras(program, ("hvp", "per_sample")))
    for scheduled in (
        planned.saving_forward,
        planned.backward,
        planned.per_sample_forward + planned.per_sample_backward,
    ):
        deleted: set[str] = set()
        for item in scheduled:
            read = {symbol.name for symbol in item.statement.value.free_symbols}
            assert not read & deleted, (item.statement, read & deleted)
            deleted |= set(item.dead)
        returned = {f"grad_{name}" for name in graph.wrt} | {f"per_sample_grad_{name}" for name in graph.wrt}
        assert not deleted & returned, deleted & returned
    assert planned.saved_names and planned.loss_name == "loss"
    assert set(planned.hvp_results) == set(graph.wrt) and planned.per_sample_names == ["w1", "w2"]


IN_PLACE = """name: overwriting
inputs:
  x: {shape: [2, 3, 6, 6]}
  w1: {shape: [3, 3, 3, 3]}
  w2: {shape: [3, 3, 3, 3]}
  t: {shape: [2, 3, 6, 6]}
layers:
  - {op: relu, in: x, out: r0}
  - {op: conv2d, in: r0, weight: w1, padding: 1, out: c1}
  - {op: relu, in: c1, out: r1}
  - {op: exp, in: r1, out: e}
  - {op: relu, in: e, out: r2}
  - {op: conv2d, in: r2, weight: w2, padding: 1, out: c2}
  - {op: relu, in: c2, out: r3}
  - {op: add, in: [r3, c2], out: s}
  - {op: add, in: [s, r1], out: s2}
  - {op: relu, in: s2, out: r4}
loss: {op: mse_loss, target: t}
wrt: [x, w1, w2]
"""


def test_a_relu_overwrites_its_operand_only_where_no_one_else_can_see_it():
    """``torch.relu_`` in the saving forward where its operand dies there and was made fresh here (a
    convolution's or a sum's output); never on an input (the caller's), on exp's output (exp's own
    backward reads it) or on a value read again. The gradients stay autograd's, and differentiable."""
    import torch

    from symgrad.check import module_from_source
    from symgrad.pipeline import build_text

    source = build_text(IN_PLACE, "overwriting.yaml").rendered.files["overwriting.py"]
    saving = source[source.index("def _forward_saving(") : source.index("def _backward_from_saved(")]
    assert "r0 = F.relu(x)" in saving and "r1 = torch.relu_(c1)" in saving  # the caller's x; a dead conv output
    assert "r2 = F.relu(e)" in saving and "r3 = F.relu(c2)" in saving  # exp reads its output; c2 read again
    assert "r4 = torch.relu_(s2)" in saving  # a dead sum
    module = module_from_source(source, "overwriting")
    generator = torch.Generator().manual_seed(0)
    # small values: exp stays moderate, and gradgradcheck's finite differences cross no ReLU kink
    inputs = {
        name: (0.3 * torch.randn(shape, generator=generator, dtype=torch.float64)).requires_grad_(name != "t")
        for name, shape in (("x", (2, 3, 6, 6)), ("w1", (3, 3, 3, 3)), ("w2", (3, 3, 3, 3)), ("t", (2, 3, 6, 6)))
    }
    x, w1, w2, t = inputs.values()
    r1 = torch.relu(torch.nn.functional.conv2d(torch.relu(x), w1, padding=1))
    c2 = torch.nn.functional.conv2d(torch.relu(r1.exp()), w2, padding=1)
    loss = torch.nn.functional.mse_loss(torch.relu(torch.relu(c2) + c2 + r1), t)
    expected = torch.autograd.grad(loss, [x, w1, w2])
    got = module.gradients(**inputs)
    for name, reference in zip(("x", "w1", "w2"), expected):
        assert torch.allclose(getattr(got, name), reference, rtol=1e-10, atol=1e-12), name
    inputs_before = {name: value.detach().clone() for name, value in inputs.items()}
    assert torch.autograd.gradgradcheck(lambda *values: tuple(module.gradients(*values, t)), (x, w1, w2))
    assert all(torch.equal(inputs[name], inputs_before[name]) for name in inputs)  # no input overwritten


RELU6_IN_PLACE = """name: relu6_overwriting
inputs:
  x: {shape: [2, 3, 6, 6]}
  w1: {shape: [4, 3, 3, 3]}
  w2: {shape: [4, 4, 3, 3]}
  t: {shape: [2, 4, 6, 6]}
layers:
  - {op: relu6, in: x, out: r0}
  - {op: conv2d, in: r0, weight: w1, padding: 1, out: c1}
  - {op: batch_norm, in: c1, training: true, out: b1}
  - {op: relu6, in: b1, out: r1}
  - {op: conv2d, in: r1, weight: w2, padding: 1, out: c2}
  - {op: relu6, in: c2, out: r2}
  - {op: add, in: [r2, c2], out: s}
loss: {op: mse_loss, target: t}
wrt: [x, w1, w2]
"""


def test_a_relu6_overwrites_its_operand_as_relu_does():
    """``F.relu6(b1, inplace=True)`` in the saving forward, as MobileNetV2's ``ReLU6(inplace=True)``: its
    fused backward reads the output (``hardtanh_backward`` of it), so a batch norm's dead output may be
    overwritten; never the caller's input, never a value read again. The gradients are autograd's, and
    differentiable, and the caller's input is left as it was."""
    import torch
    import torch.nn.functional as F

    from symgrad.check import module_from_source
    from symgrad.pipeline import build_text

    source = build_text(RELU6_IN_PLACE, "relu6_overwriting.yaml").rendered.files["relu6_overwriting.py"]
    saving = source[source.index("def _forward_saving(") : source.index("def _backward_from_saved(")]
    assert "r0 = F.relu6(x)" in saving and "r2 = F.relu6(c2)" in saving, saving  # the caller's x; c2 read again
    assert "r1 = F.relu6(b1, inplace=True)" in saving, saving  # a dead batch norm output
    module = module_from_source(source, "relu6_overwriting")
    generator = torch.Generator().manual_seed(0)
    # values across both kinks: some inputs below 0 and above 6
    inputs = {
        name: (4 * torch.randn(shape, generator=generator, dtype=torch.float64)).requires_grad_(name != "t")
        for name, shape in (("x", (2, 3, 6, 6)), ("w1", (4, 3, 3, 3)), ("w2", (4, 4, 3, 3)), ("t", (2, 4, 6, 6)))
    }
    x, w1, w2, t = inputs.values()

    def autograd_gradients():
        b1 = F.batch_norm(F.conv2d(F.relu6(x), w1, padding=1), None, None, training=True)
        c2 = F.conv2d(F.relu6(b1), w2, padding=1)
        return torch.autograd.grad(F.mse_loss(F.relu6(c2) + c2, t), [x, w1, w2], create_graph=True)

    before = {name: value.detach().clone() for name, value in inputs.items()}
    got = module.gradients(**inputs)
    expected = autograd_gradients()
    for name, reference in zip(("x", "w1", "w2"), expected):
        assert torch.allclose(getattr(got, name), reference, rtol=1e-10, atol=1e-12), name
    assert all(torch.equal(inputs[name], before[name]) for name in inputs)  # no input overwritten
    # differentiated again through the in-place forward (a gradient penalty), against autograd's own
    # second derivative (finite differences would straddle the batch-normalised values' kinks at 0)
    second = torch.autograd.grad(sum(grad.pow(2).sum() for grad in got), [x, w1, w2])
    reference = torch.autograd.grad(sum(grad.pow(2).sum() for grad in expected), [x, w1, w2])
    for name, ours, theirs in zip(("x", "w1", "w2"), second, reference):
        assert torch.allclose(ours, theirs, rtol=1e-9, atol=1e-11), name


READ_BEFORE = """name: read_before
inputs:
  x: {shape: [2, 3, 6, 6]}
  w1: {shape: [4, 3, 3, 3]}
  w2: {shape: [4, 4, 3, 3]}
  t: {shape: [2, 4, 6, 6]}
layers:
  - {op: conv2d, in: x, weight: w1, padding: 1, out: c1}
  - {op: batch_norm, in: c1, training: true, out: b1}
  - {op: conv2d, in: b1, weight: w2, padding: 1, out: c2}
  - {op: relu6, in: b1, out: r1}
  - {op: add, in: [c2, r1], out: s}
loss: {op: mse_loss, in: s, target: t}
wrt: [w1]
"""

ATTENTION_THEN_RELU = """name: attention_relu
inputs:
  q: {shape: [2, 2, 4, 8]}
  k: {shape: [2, 2, 5, 8]}
  v: {shape: [2, 2, 5, 8]}
  t: {shape: [2, 2, 4, 8]}
layers:
  - {op: scaled_dot_product_attention, in: [q, k, v], out: a}
  - {op: relu, in: a, out: r}
loss: {op: mse_loss, target: t}
wrt: [q, k, v]
"""


@pytest.mark.parametrize(
    "spec, names, dtype",
    [(READ_BEFORE, ("w1",), torch.float64), (ATTENTION_THEN_RELU, ("q", "k", "v"), torch.float32)],
    ids=["read by a convolution first", "attention's output"],
)
def test_no_operand_an_autograd_node_saved_is_overwritten(spec, names, dtype):
    """A second reader's two cases: ``b1`` read by a convolution (whose autograd node saves its input,
    though w2 wants no gradient) before the ReLU6; an attention's output, which the flash kernels'
    backward reads (float32 on the CPU). Overwritten, ``gradients`` differentiated again failed on the
    version check; now each runs out of place, and the second derivatives are autograd's."""
    import torch.nn.functional as F

    from symgrad.check import module_from_source
    from symgrad.pipeline import build_text

    parsed = yaml.safe_load(spec)
    name = parsed["name"]
    source = build_text(spec, f"{name}.yaml").rendered.files[f"{name}.py"]
    saving = source[source.index("def _forward_saving(") : source.index("def _backward_from_saved(")]
    assert "inplace=True" not in saving and "relu_(" not in saving, saving
    module = module_from_source(source, name)
    generator = torch.Generator().manual_seed(0)
    inputs = {
        key: (3 * torch.randn(entry["shape"], generator=generator, dtype=dtype)).requires_grad_(key in names)
        for key, entry in parsed["inputs"].items()
    }

    def reference():
        if "q" in inputs:  # the math kernel: the flash kernel's backward is not differentiable
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.MATH):
                out = F.relu(F.scaled_dot_product_attention(inputs["q"], inputs["k"], inputs["v"]))
        else:
            b1 = F.batch_norm(F.conv2d(inputs["x"], inputs["w1"], padding=1), None, None, training=True)
            out = F.conv2d(b1, inputs["w2"], padding=1) + F.relu6(b1)
        return torch.autograd.grad(F.mse_loss(out, inputs["t"]), [inputs[key] for key in names], create_graph=True)

    got = [getattr(module.gradients(**inputs), key) for key in names]
    expected = reference()
    tolerance = dict(rtol=1e-9, atol=1e-11) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    for ours, theirs in zip(got, expected):
        assert torch.allclose(ours, theirs, **tolerance)
    second = torch.autograd.grad(sum(grad.pow(2).sum() for grad in got), [inputs[key] for key in names])
    reference_second = torch.autograd.grad(sum(grad.pow(2).sum() for grad in expected), [inputs[key] for key in names])
    for ours, theirs in zip(second, reference_second):
        assert torch.allclose(ours, theirs, **tolerance)


RECOMPUTED = """name: recomputed
inputs:
  x: {shape: [2, 3, 6, 6]}
  w1: {shape: [8, 3, 3, 3]}
  w2: {shape: [4, 8, 1, 1]}
  w3: {shape: [4, 4, 3, 3]}
  t: {shape: [2, 4, 6, 6]}
layers:
  - {op: conv2d, in: x, weight: w1, padding: 1, out: c1}
  - {op: gelu, in: c1, out: g1}
  - {op: conv2d, in: g1, weight: w2, out: c2}
  - {op: silu, in: c2, out: s2}
  - {op: relu, in: s2, out: r2}
  - {op: conv2d, in: r2, weight: w3, padding: 1, out: c3}
  - {op: tanh, in: c3, out: h}
loss: {op: mse_loss, target: t}
wrt: [x, w1, w2, w3]
"""


def test_a_cheap_activation_is_recomputed_from_the_operand_the_backward_keeps():
    """GELU's backward reads ``c1`` and the next convolution's weight gradient reads ``g1 = gelu(c1)``:
    the saving forward keeps ``c1`` alone and the backward computes ``g1`` again right before that read
    (autograd keeps both). Not where the operand would be kept only for it (``r2 = relu(s2)``: ReLU's
    backward reads its output, so ``s2`` is not kept), nor the loss's input (``h``, which the caller
    keeps). The gradients are autograd's, and so is their derivative."""
    import torch.nn.functional as F

    from symgrad.check import module_from_source
    from symgrad.pipeline import build_text

    built = build_text(RECOMPUTED, "recomputed.yaml")
    source = built.rendered.files["recomputed.py"]
    backward = source[source.index("def _backward_from_saved(") : source.index("class ExplicitGradient")]
    assert "# recomputed: not kept by the forward\n    g1 = F.gelu(c1)" in backward, backward
    assert backward.index("g1 = F.gelu(c1)") < re.search(r"_convolution_backward\(\s*grad_c2, g1", backward).start()
    unpacked = backward[: backward.index("= saved")]
    assert "c1" in unpacked and "g1" not in unpacked and "r2" in unpacked and "s2" not in unpacked, unpacked
    assert "\n    r2 = " not in backward and "\n    h = " not in backward, backward
    module = module_from_source(source, "recomputed")
    generator = torch.Generator().manual_seed(0)
    shapes = {name: entry["shape"] for name, entry in yaml.safe_load(RECOMPUTED)["inputs"].items()}
    inputs = {
        name: torch.randn(shape, generator=generator, dtype=torch.float64).requires_grad_(name != "t")
        for name, shape in shapes.items()
    }
    x, w1, w2, w3, t = inputs.values()
    h = torch.tanh(F.conv2d(F.relu(F.silu(F.conv2d(F.gelu(F.conv2d(x, w1, padding=1)), w2))), w3, padding=1))
    expected = torch.autograd.grad(F.mse_loss(h, t), [x, w1, w2, w3], create_graph=True)
    got = module.gradients(**inputs)
    for name, reference in zip(("x", "w1", "w2", "w3"), expected):
        assert torch.allclose(getattr(got, name), reference, rtol=1e-10, atol=1e-12), name
    second = torch.autograd.grad(sum(grad.pow(2).sum() for grad in got), [x, w1, w2, w3])
    reference = torch.autograd.grad(sum(grad.pow(2).sum() for grad in expected), [x, w1, w2, w3])
    for name, ours, theirs in zip(("x", "w1", "w2", "w3"), second, reference):
        assert torch.allclose(ours, theirs, rtol=1e-9, atol=1e-11), name


LINEAR_CHAIN = """name: linear_chain
inputs:
  x: {shape: [4, 6]}
  w1: {shape: [8, 6]}
  b1: {shape: [8]}
  w2: {shape: [3, 8]}
  t: {shape: [4, 3]}
layers:
  - {op: linear, in: x, weight: w1, bias: b1, out: l1}
  - {op: gelu, in: l1, out: g}
  - {op: linear, in: g, weight: w2, out: l2}
loss: {op: mse_loss, target: t}
wrt: [w1, b1, w2]
"""


@pytest.mark.parametrize("recompute", [True, False], ids=["recomputed", "kept"])
def test_a_weight_gradient_is_computed_where_its_node_is_and_frees_what_it_reads(recompute):
    """The walk writes a linear map's input gradient before its weight's; the weight's was then
    computed after the whole walk, holding every linear's input and output gradient until the end (a
    ConvNeXt's MLPs). It now comes as soon as what it reads exists, as autograd's node runs it, and
    ``g`` and ``grad_l2`` die there, before ``l1``'s gradient is made. The gradients are autograd's."""
    import torch.nn.functional as F

    from symgrad.check import module_from_source
    from symgrad.pipeline import build_text

    source = build_text(LINEAR_CHAIN, "linear_chain.yaml", recompute=recompute).rendered.files["linear_chain.py"]
    backward = source[source.index("def _backward_from_saved(") : source.index("class ExplicitGradient")]
    lines = [line.strip() for line in backward.splitlines() if not line.strip().startswith("#")]
    weight = next(index for index, line in enumerate(lines) if line.startswith("grad_w2 = "))
    freed = next(index for index, line in enumerate(lines) if line.startswith("del ") and "grad_l2" in line)
    made = next(index for index, line in enumerate(lines) if line.startswith("grad_l1 = "))
    assert weight < freed < made, "\n".join(lines)
    assert ("\n    g = F.gelu(l1)" in backward) == recompute, backward
    module = module_from_source(source, "linear_chain")
    generator = torch.Generator().manual_seed(0)
    shapes = {name: entry["shape"] for name, entry in yaml.safe_load(LINEAR_CHAIN)["inputs"].items()}
    inputs = {
        name: torch.randn(shape, generator=generator, dtype=torch.float64).requires_grad_(name != "t")
        for name, shape in shapes.items()
    }
    x, w1, b1, w2, t = inputs.values()
    expected = torch.autograd.grad(F.mse_loss(F.linear(F.gelu(F.linear(x, w1, b1)), w2), t), [w1, b1, w2])
    got = module.gradients(**inputs)
    for name, reference in zip(("w1", "b1", "w2"), expected):
        assert torch.allclose(getattr(got, name), reference, rtol=1e-10, atol=1e-12), name


SHAPE_ONLY = """name: shape_only
inputs:
  x: {shape: [2, 3, 4, 4]}
  skip: {shape: [2, 2, 8, 8]}
  w: {shape: [3, 5, 3, 3]}
  t: {shape: [2, 3, 8, 8]}
layers:
  - {op: relu, in: x, out: r}
  - {op: interpolate, in: r, scale_factor: 2, mode: bilinear, out: up}
  - {op: cat, in: [skip, up], dim: 1, out: joined}
  - {op: conv2d, in: joined, weight: w, padding: 1, out: c}
loss: {op: mse_loss, target: t}
wrt: [x, w]
"""


def test_a_value_read_only_for_its_shape_is_kept_as_its_shape():
    """``cat``'s backward reads ``up`` for its channel count alone: the saving forward keeps
    ``up.shape`` and frees ``up`` right after the cat (autograd's cat keeps sizes, not tensors);
    interpolation's backward runs as autograd's kernel. The gradients stay autograd's, at another
    size, and differentiable."""
    import torch

    from symgrad.check import module_from_source
    from symgrad.pipeline import build_text

    source = build_text(SHAPE_ONLY, "shape_only.yaml").rendered.files["shape_only.py"]
    saving = source[source.index("def _forward_saving(") : source.index("def _backward_from_saved(")]
    returned = saving[saving.rindex("return ") :].split("\n")[0]
    assert "up_shape = up.shape" in saving and "del up\n" in saving
    assert "up_shape" in returned and " up," not in returned
    assert "_upsample_backward(" in source and "torch.ops.aten.upsample_bilinear2d_backward," in source
    module = module_from_source(source, "shape_only")
    generator = torch.Generator().manual_seed(0)
    shapes = {"x": (3, 3, 5, 7), "skip": (3, 2, 10, 14), "w": (3, 5, 3, 3), "t": (3, 3, 10, 14)}
    inputs = {
        name: torch.randn(shape, generator=generator, dtype=torch.float64).requires_grad_(name in ("x", "w"))
        for name, shape in shapes.items()
    }
    x, skip, w, t = inputs.values()
    up = torch.nn.functional.interpolate(torch.relu(x), scale_factor=2, mode="bilinear")
    loss = torch.nn.functional.mse_loss(torch.nn.functional.conv2d(torch.cat([skip, up], 1), w, padding=1), t)
    expected = torch.autograd.grad(loss, [x, w])
    got = module.gradients(**inputs)
    for name, reference in zip(("x", "w"), expected):
        assert torch.allclose(getattr(got, name), reference, rtol=1e-10, atol=1e-12), name
    assert torch.autograd.gradgradcheck(lambda x, w: tuple(module.gradients(x, skip, w, t)), (x, w))
