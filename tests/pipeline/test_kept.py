"""What the saving forward keeps of a value the backward reads only in part (symgrad/kept.py)."""

from __future__ import annotations

import os
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
import yaml
from sympy.utilities.exceptions import SymPyDeprecationWarning

from symgrad.algebra import PRIMITIVES, laid_out
from symgrad.check import module_from_source
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace

DEVICE = os.environ.get("SYMGRAD_TEST_DEVICE", "cpu")
"""Where the pooling kernels' reads are checked: the CPU in CI, ``SYMGRAD_TEST_DEVICE=cuda`` on a GPU."""

MASKED = """name: masked
inputs:
  x: {shape: [2, 3, 5, 5]}
  w1: {shape: [6, 3, 3, 3]}
  w2: {shape: [4, 6, 3, 3]}
  w3: {shape: [4, 4, 1, 1]}
  t: {shape: [2, 4, 10, 10]}
layers:
  - {op: conv2d, in: x, weight: w1, padding: 1, out: c1}
  - {op: relu, in: c1, out: r1}
  - {op: interpolate, in: r1, scale_factor: 2, mode: nearest, out: up}
  - {op: conv2d, in: up, weight: w2, padding: 1, out: c2}
  - {op: relu, in: c2, out: r2}
  - {op: conv2d, in: r2, weight: w3, out: c3}
  - {op: relu, in: c3, out: h}
loss: {op: mse_loss, target: t}
wrt: [x, w1, w2, w3]
"""


def _reference(x, w1, w2, w3, t):
    up = F.interpolate(F.relu(F.conv2d(x, w1, padding=1)), scale_factor=2, mode="nearest")
    h = F.relu(F.conv2d(F.relu(F.conv2d(up, w2, padding=1)), w3))
    return F.mse_loss(h, t)


def test_a_relu_output_only_its_own_pullback_reads_is_kept_as_a_byte_mask():
    """``r1`` is read in the backward only by its ReLU's pullback (the upsampling's reads only its
    shape): the saving forward keeps ``r1_active``, a byte mask, not ``r1``.
    ``r2`` is read whole by the next convolution's weight gradient and ``h`` is the loss's input,
    which the caller keeps: both stay as they are. Gradients and their derivative are autograd's."""
    built = build_text(MASKED, "masked.yaml")
    source = built.rendered.files["masked.py"]
    backward = source[source.index("def _backward_from_saved(") : source.index("class ExplicitGradient")]
    unpacked = backward[: backward.index("= saved")]
    assert "r1_active" in unpacked and not re.search(r"\br1\b", unpacked), unpacked
    assert "r2" in unpacked and "r2_active" not in source and "h_active" not in source, unpacked
    assert "    r1_active = r1 if torch.compiler.is_compiling() else r1.bool().view(torch.uint8)\n" in source, source
    assert "grad_c1 = torch.ops.aten.threshold_backward(grad_r1, r1_active, 0)" in backward, backward
    assert "threshold_backward(grad_r2, r2, 0)" in backward and "threshold_backward(grad_h, h, 0)" in backward
    assert "| only where it is not zero, as a byte mask |" in built.rendered.files["masked.md"]

    module = module_from_source(source, "masked")
    generator = torch.Generator().manual_seed(0)
    shapes = {name: entry["shape"] for name, entry in yaml.safe_load(MASKED)["inputs"].items()}
    inputs = {
        name: torch.randn(shape, generator=generator, dtype=torch.float64).requires_grad_(name != "t")
        for name, shape in shapes.items()
    }
    loss, *saved = module._forward_saving(**inputs)
    masks = [value for value in saved if isinstance(value, torch.Tensor) and value.dtype == torch.uint8]
    assert [mask.shape for mask in masks] == [(2, 6, 5, 5)] and masks[0].any() and not masks[0].all()
    assert not any(
        isinstance(value, torch.Tensor) and value.shape == (2, 6, 5, 5) and value.is_floating_point() for value in saved
    )  # r1 itself is not kept
    expected = torch.autograd.grad(
        _reference(**inputs), [inputs[name] for name in ("x", "w1", "w2", "w3")], create_graph=True
    )
    got = module.gradients(**inputs)
    for name, reference in zip(("x", "w1", "w2", "w3"), expected):
        assert torch.allclose(getattr(got, name), reference, rtol=1e-10, atol=1e-12), name
    second = torch.autograd.grad(sum(grad.pow(2).sum() for grad in got), [inputs["x"], inputs["w1"]])
    reference = torch.autograd.grad(sum(grad.pow(2).sum() for grad in expected), [inputs["x"], inputs["w1"]])
    for ours, theirs in zip(second, reference):
        assert torch.allclose(ours, theirs, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_mask_gives_threshold_backward_of_the_output(dtype):
    """The mask's printed code, read by ``threshold_backward`` as the output was, against the output
    itself on every value a ReLU gives: zeros of both signs, NaN (its gradient passes), infinity."""
    out = torch.relu(
        torch.tensor([0.0, -0.0, 1.5, -2.0, float("nan"), float("inf"), -float("inf"), 1e-30], dtype=dtype)
    )
    grad = torch.arange(1.0, 9.0, dtype=dtype)
    mask = eval(PRIMITIVES["active"].code(["out"], None, str), {"out": out, "torch": torch})  # noqa: S307
    assert mask.dtype == torch.uint8 and mask.shape == out.shape
    masked = torch.ops.aten.threshold_backward(grad, mask, 0)
    assert masked.dtype == dtype and torch.equal(masked, torch.ops.aten.threshold_backward(grad, out, 0))


def _saved_of(text: str, name: str) -> str:
    source = build_text(text, f"{name}.yaml").rendered.files[f"{name}.py"]
    backward = source[source.index("def _backward_from_saved(") : source.index("class ExplicitGradient")]
    return backward[: backward.index("= saved")]


def test_no_mask_where_the_value_stays_anyway():
    """Keeping a mask beside what stays anyway would keep more: none where a view of the ReLU output
    is kept (``p = r1.permute(...)``, read by a linear map's weight gradient), nor where the ReLU
    output is what a recomputed activation is computed from (``s = sigmoid(r1)``); where the ReLU's
    input is kept anyway (``c1``, read by another convolution's weight gradient) or is an input
    (``x``), the pullback reads it instead, the same values."""

    def spec(name: str, inputs: str, layers: str, wrt: str) -> str:
        return f"name: {name}\ninputs:\n{inputs}layers:\n{layers}loss: {{op: mse_loss, target: t}}\nwrt: [{wrt}]\n"

    permuted = spec(
        "permuted",
        """  x: {shape: [2, 3, 5, 5]}
  w1: {shape: [6, 3, 3, 3]}
  w3: {shape: [4, 6]}
  t: {shape: [2, 5, 5, 4]}
""",
        """  - {op: conv2d, in: x, weight: w1, padding: 1, out: c1}
  - {op: relu, in: c1, out: r1}
  - {op: permute, in: r1, dims: [0, 2, 3, 1], out: p}
  - {op: linear, in: p, weight: w3, out: o}
""",
        "x, w1, w3",
    )
    assert "r1_active" not in _saved_of(permuted, "permuted")
    squashed = spec(
        "squashed",
        """  x: {shape: [2, 3, 5, 5]}
  w1: {shape: [6, 3, 3, 3]}
  w2: {shape: [4, 6, 3, 3]}
  t: {shape: [2, 4, 5, 5]}
""",
        """  - {op: conv2d, in: x, weight: w1, padding: 1, out: c1}
  - {op: relu, in: c1, out: r1}
  - {op: sigmoid, in: r1, out: s}
  - {op: conv2d, in: s, weight: w2, padding: 1, out: o}
""",
        "x, w1, w2",
    )
    unpacked = _saved_of(squashed, "squashed")
    assert "r1_active" not in unpacked and re.search(r"\br1\b", unpacked) and not re.search(r"\bs\b", unpacked)
    from_input = spec(
        "from_input",
        """  x: {shape: [2, 3, 5, 5]}
  w1: {shape: [6, 3, 3, 3]}
  w2: {shape: [4, 6, 3, 3]}
  w3: {shape: [4, 6, 3, 3]}
  t: {shape: [2, 4, 10, 10]}
""",
        """  - {op: relu, in: x, out: r0}
  - {op: conv2d, in: r0, weight: w1, padding: 1, out: c1}
  - {op: relu, in: c1, out: r1}
  - {op: interpolate, in: r1, scale_factor: 2, mode: nearest, out: up}
  - {op: conv2d, in: up, weight: w2, padding: 1, out: o1}
  - {op: conv2d, in: c1, weight: w3, padding: 1, out: c2}
  - {op: interpolate, in: c2, scale_factor: 2, mode: nearest, out: o2}
  - {op: add, in: [o1, o2], out: o}
""",
        "x, w1, w2, w3",
    )
    built = build_text(from_input, "from_input.yaml")
    source = built.rendered.files["from_input.py"]
    assert "_active = " not in source
    backward = source[source.index("def _backward_from_saved(") : source.index("class ExplicitGradient")]
    assert "threshold_backward(grad_r1, c1, 0)" in backward, backward
    of_input = spec(
        "of_input",
        """  x: {shape: [2, 3, 5, 5]}
  w2: {shape: [4, 3, 3, 3]}
  t: {shape: [2, 4, 10, 10]}
""",
        """  - {op: relu, in: x, out: r0}
  - {op: interpolate, in: r0, scale_factor: 2, mode: nearest, out: up}
  - {op: conv2d, in: up, weight: w2, padding: 1, out: o}
""",
        "x, w2",
    )
    input_source = build_text(of_input, "of_input.yaml").rendered.files["of_input.py"]
    assert "threshold_backward(grad_r0, x, 0)" in input_source and "_active = " not in input_source
    module = module_from_source(source, "from_input")
    generator = torch.Generator().manual_seed(1)
    x, w1, w2, w3, t = (
        torch.randn(shape, generator=generator, dtype=torch.float64).requires_grad_()
        for shape in ((2, 3, 5, 5), (6, 3, 3, 3), (4, 6, 3, 3), (4, 6, 3, 3), (2, 4, 10, 10))
    )
    c1 = F.conv2d(F.relu(x), w1, padding=1)
    up, up1 = (
        F.interpolate(value, scale_factor=2, mode="nearest") for value in (F.relu(c1), F.conv2d(c1, w3, padding=1))
    )
    loss = F.mse_loss(F.conv2d(up, w2, padding=1) + up1, t)
    got = module.gradients(x=x, w1=w1, w2=w2, w3=w3, t=t.detach())
    for got, expected in zip(got, torch.autograd.grad(loss, [x, w1, w2, w3])):
        assert torch.allclose(got, expected, rtol=1e-10, atol=1e-12)
    viewed = spec(
        "viewed",
        """  x: {shape: [2, 3, 5, 5]}
  w1: {shape: [6, 3, 3, 3]}
  w2: {shape: [4, 6, 1, 1]}
  w3: {shape: [4, 6]}
  t: {shape: [2, 5, 5, 4]}
""",
        """  - {op: conv2d, in: x, weight: w1, padding: 1, out: c1}
  - {op: relu, in: c1, out: r1}
  - {op: adaptive_avg_pool2d, in: r1, output_size: 1, out: m}
  - {op: permute, in: c1, dims: [0, 2, 3, 1], out: p}
  - {op: linear, in: p, weight: w3, out: q}
  - {op: conv2d, in: m, weight: w2, out: o1}
  - {op: permute, in: o1, dims: [0, 2, 3, 1], out: o2}
  - {op: add, in: [q, o2], out: o}
""",
        "x, w1, w2, w3",
    )
    unpacked = _saved_of(viewed, "viewed")  # c1 stays, as the view p its linear map's weight gradient reads
    assert "r1_active" not in unpacked and re.search(r"\bc1\b", unpacked) and re.search(r"\bp\b", unpacked), unpacked
    module = module_from_source(build_text(viewed, "viewed.yaml").rendered.files["viewed.py"], "viewed")
    x, w1, w2, w3, t = (
        torch.randn(shape, generator=generator, dtype=torch.float64).requires_grad_()
        for shape in ((2, 3, 5, 5), (6, 3, 3, 3), (4, 6, 1, 1), (4, 6), (2, 5, 5, 4))
    )
    c1 = F.conv2d(x, w1, padding=1)
    o1 = F.conv2d(F.adaptive_avg_pool2d(F.relu(c1), 1), w2)
    loss = F.mse_loss(F.linear(c1.permute(0, 2, 3, 1), w3) + o1.permute(0, 2, 3, 1), t)
    got = module.gradients(x=x, w1=w1, w2=w2, w3=w3, t=t.detach())
    for got, expected in zip(got, torch.autograd.grad(loss, [x, w1, w2, w3])):
        assert torch.allclose(got, expected, rtol=1e-10, atol=1e-12)


POOLED = """name: pooled
inputs:
  x: {shape: [2, 3, 8, 8]}
  w1: {shape: [6, 3, 3, 3]}
  w2: {shape: [5, 6, 3, 3]}
  fc: {shape: [4, 5]}
  labels: {shape: [2], dtype: int64}
layers:
  - {op: conv2d, in: x, weight: w1, padding: 1, out: c1}
  - {op: relu, in: c1, out: r1}
  - {op: max_pool2d, in: r1, kernel_size: 3, stride: 2, padding: 1, out: pooled}
  - {op: conv2d, in: pooled, weight: w2, padding: 1, out: c2}
  - {op: relu, in: c2, out: r2}
  - {op: adaptive_avg_pool2d, in: r2, output_size: 1, out: mean}
  - {op: flatten, in: mean, start_dim: 1, out: features}
  - {op: linear, in: features, weight: fc, out: logits}
loss: {op: cross_entropy, target: labels}
wrt: [x, w1, w2, fc]
"""


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_a_pooled_relu_output_is_kept_as_its_layout_and_a_mask(layout):
    """A ResNet's stem and head: ``r1`` feeds a max pool and ``r2`` an adaptive mean pool, whose
    backward kernels read their input only for its sizes, strides and dtype. The saving forward keeps
    each one's layout (a meta tensor) and bool mask, not the value; the backward passes the kernel an
    unset tensor of that layout. Gradients (in the caller's layout) and their derivative are autograd's."""
    built = build_text(POOLED, "pooled.yaml")
    source = built.rendered.files["pooled.py"]
    backward = source[source.index("def _backward_from_saved(") : source.index("class ExplicitGradient")]
    unpacked = backward[: backward.index("= saved")]
    for name in ("r1", "r2"):
        assert f"{name}_layout" in unpacked and f"{name}_active" in unpacked, unpacked
        assert not re.search(rf"\b{name}\b", unpacked), unpacked
        assert f'    {name}_layout = {name}.to("meta")\n' in source, source
    # the max pool's kernel is given an unset tensor of r1's layout; the global mean pool's gradient reads
    # r2's sizes and dtype off its layout (autograd's mean backward, symgrad/rules/resample.py)
    assert "_stand_in(r1_layout, grad_" in backward and "r2_layout.shape" in backward, backward
    assert "| only its layout and where it is not zero, as a byte mask |" in built.rendered.files["pooled.md"]

    module = module_from_source(source, "pooled")
    generator = torch.Generator().manual_seed(0)
    shapes = {name: entry["shape"] for name, entry in yaml.safe_load(POOLED)["inputs"].items()}
    inputs = {
        name: torch.randn(shape, generator=generator, dtype=torch.float64).requires_grad_()
        for name, shape in shapes.items()
        if name != "labels"
    }
    if layout == "channels_last":
        inputs["x"] = inputs["x"].detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    inputs["labels"] = torch.tensor([1, 3])
    _, *saved = module._forward_saving(**inputs)
    kept = [value for value in saved if isinstance(value, torch.Tensor) and value.shape in ((2, 6, 8, 8), (2, 5, 4, 4))]
    assert sorted(f"{value.dtype} {value.device.type}" for value in kept) == [
        "torch.float64 meta",
        "torch.float64 meta",
        "torch.uint8 cpu",
        "torch.uint8 cpu",
    ], kept
    x, w1, w2, fc = (inputs[name] for name in ("x", "w1", "w2", "fc"))
    r2 = F.relu(F.conv2d(F.max_pool2d(F.relu(F.conv2d(x, w1, padding=1)), 3, 2, 1), w2, padding=1))
    loss = F.cross_entropy(F.linear(torch.flatten(F.adaptive_avg_pool2d(r2, 1), 1), fc), inputs["labels"])
    expected = torch.autograd.grad(loss, [x, w1, w2, fc], create_graph=True)
    got = module.gradients(**inputs)
    for name, reference in zip(("x", "w1", "w2", "fc"), expected):
        assert torch.allclose(getattr(got, name), reference, rtol=1e-10, atol=1e-12), name
    assert got.x.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")
    second = torch.autograd.grad(sum(grad.pow(2).sum() for grad in got), [x, w1])
    reference = torch.autograd.grad(sum(grad.pow(2).sum() for grad in expected), [x, w1])
    for ours, theirs in zip(second, reference):
        assert torch.allclose(ours, theirs, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_pool_backward_kernels_read_only_their_inputs_layout(dims, channels_last, dtype):
    """What ``layout_operands`` declares of the two kernels, checked on torch itself: given a tensor
    made as the generated code makes it from the input's kept layout and filled with NaN instead of
    the input, each returns the same gradient, laid out the same (a torch whose kernel read the
    values would fail here). The CPU's kernels in CI; ``SYMGRAD_TEST_DEVICE=cuda`` checks CUDA's."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((2, 3) + (7,) * dims, generator=generator).to(DEVICE, dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last if dims == 2 else torch.channels_last_3d)
    made = laid_out(["x", "x_layout"], {"stand_in": True})  # the generated code's expression and helper
    names = {"torch": torch, "x": x, "x_layout": x.to("meta")}
    exec(PRIMITIVES["layout"].helper, names)  # noqa: S102
    stand_in = eval(made, names).fill_(float("nan"))  # noqa: S307
    pooled, indices = getattr(F, f"max_pool{dims}d")(x, 3, 2, 1, return_indices=True)
    grad = torch.randn(pooled.shape, generator=generator).to(DEVICE, dtype)
    max_backward = getattr(torch.ops.aten, f"max_pool{dims}d_with_indices_backward")
    mean_backward = getattr(torch.ops.aten, f"_adaptive_avg_pool{dims}d_backward")
    for kernel in (
        lambda value: max_backward(grad, value, [3] * dims, [2] * dims, [1] * dims, [1] * dims, False, indices),
        lambda value: mean_backward(grad, value),
    ):
        ours, theirs = kernel(stand_in), kernel(x)
        assert torch.equal(ours, theirs) and ours.stride() == theirs.stride()


PLANE_POOLED = """name: plane_pooled
inputs:
  x: {shape: [1, 2, 128, 256]}
  t: {shape: [1, 2, 64, 128]}
layers:
  - {op: relu, in: x, out: r}
  - {op: max_pool2d, in: r, kernel_size: 2, out: pooled}
  - {op: mul, in: [pooled, pooled], out: h}
loss: {op: mse_loss, target: t}
wrt: [x]
"""


def test_a_max_pools_indices_are_kept_in_the_narrowest_integer_type_that_holds_them():
    """The argmax indices, which only the pool's pullback reads, are kept as int16 where the pool's
    input planes hold at most 2**15 positions (128 x 256: the last one, 32767, is int16's largest),
    as int32 beyond (130 x 260), as made while torch.compile traces the step; the kernel reads them
    as int64 again. Gradients and their derivative are autograd's, the last position chosen too."""
    built = build_text(PLANE_POOLED, "plane_pooled.yaml")
    source = built.rendered.files["plane_pooled.py"]
    assert "    indices_pooled_narrow = _narrowed_indices(indices_pooled, r.shape[2:].numel())\n" in source
    assert "indices=indices_pooled_narrow.long()" in source
    module = module_from_source(source, "plane_pooled")
    indices = torch.tensor([0, 32767])
    for positions, dtype in (
        (2**15, torch.int16),
        (2**15 + 1, torch.int32),
        (2**31, torch.int32),
        (2**31 + 1, torch.int64),
    ):
        narrowed = module._narrowed_indices(indices, positions)
        assert narrowed.dtype == dtype and torch.equal(narrowed.long(), indices), positions
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.compiler, "is_compiling", lambda: True)
        assert module._narrowed_indices(indices, 4) is indices
    generator = torch.Generator().manual_seed(0)
    for size, dtype in (((1, 2, 128, 256), torch.int16), ((2, 3, 130, 260), torch.int32)):
        x = torch.randn(size, generator=generator, dtype=torch.float64)
        x[..., -1, -1] = 10.0  # each plane's largest: its last position is an argmax
        x.requires_grad_()
        t = torch.randn(*size[:2], size[2] // 2, size[3] // 2, generator=generator, dtype=torch.float64)
        _, *saved = module._forward_saving(x, t)
        kept = [value for value in saved if isinstance(value, torch.Tensor) and not value.is_floating_point()]
        assert [value.dtype for value in kept] == [dtype] and kept[0].max() == size[2] * size[3] - 1
        loss = F.mse_loss(F.max_pool2d(F.relu(x), 2).pow(2), t)
        (expected,) = torch.autograd.grad(loss, x, create_graph=True)
        got = module.gradients(x, t).x
        assert torch.allclose(got, expected, rtol=1e-10, atol=1e-12)
        (second,) = torch.autograd.grad(got.pow(2).sum(), x)
        assert torch.allclose(second, torch.autograd.grad(expected.pow(2).sum(), x)[0], rtol=1e-9, atol=1e-11)


def test_without_recomputation_the_forward_keeps_what_autograd_keeps():
    """``recompute=False`` (``symgrad generate --no-recompute``): the values themselves, as autograd
    keeps them, no mask and no layout; the same gradients. ``symgrad.generate`` takes it too."""
    import symgrad

    source = build_text(POOLED, "pooled.yaml", recompute=False).rendered.files["pooled.py"]
    assert symgrad.generate(text=POOLED, label="pooled.yaml", recompute=False).code == source
    assert "_active = " in symgrad.generate(text=POOLED, label="pooled.yaml").code
    unpacked = source[source.index("def _backward_from_saved(") :]
    unpacked = unpacked[: unpacked.index("= saved")]
    assert re.search(r"\br1\b", unpacked) and re.search(r"\br2\b", unpacked), unpacked
    assert "_active" not in unpacked and "_layout" not in unpacked and '.to("meta")' not in source
    assert "_narrow" not in source and ".long()" not in source


def test_bind_refuses_a_device_whose_pooling_kernels_may_read_the_stand_in():
    """CPU's and CUDA's max and mean pool backward kernels read their input only for its layout
    (checked above); MPS's max pool backward reads its values. A bound module that passes them a
    stand-in refuses any other device in one line, naming the fix; with --no-recompute it has none."""
    import symgrad
    from symgrad.binding import BindError
    from tests.bind.test_bind import fresh_model, generated_for

    model = fresh_model()
    bound = symgrad.bind(generated_for(model), model)
    assert bound._keeps_layouts
    with pytest.raises(
        BindError,
        match=r"CPU's and CUDA's kernels .* meta's may not \(fix: train on cpu or cuda, "
        r"or generate the module with --no-recompute\)$",
    ):
        bound._check_devices({}, {"conv1.weight": torch.empty(1, device="meta")})
    bound._check_devices({}, {"conv1.weight": torch.empty(1)})  # the CPU: nothing to refuse


def test_under_torch_compile_the_relu_output_is_kept_and_the_step_trains_as_autograd(monkeypatch, tmp_path):
    """While torch.compile traces it, the saving forward keeps a ReLU output itself where eagerly it
    keeps the mask (Inductor's partitioner keeps or recomputes what the backward reads, as it does for
    autograd; a mask made the compiled step slower); the compiled step (whole graph) trains as autograd."""
    import copy

    import symgrad
    from tests.bind.test_bind import batches, fresh_model
    from tests.bind.test_model import generated

    out = torch.relu(torch.randn(5))
    code = PRIMITIVES["active"].code(["out"], None, str)
    assert eval(code, {"out": out, "torch": torch}).dtype == torch.uint8  # noqa: S307
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert eval(code, {"out": out, "torch": torch}) is out  # noqa: S307
    monkeypatch.undo()
    model = fresh_model()
    reference = copy.deepcopy(model)
    text = trace(
        model, {"x": (2, 3, 16, 16)}, name="compiled_resnet", loss=LossChoice("cross_entropy", "labels"), mode="train"
    )
    step = symgrad.bind(generated(tmp_path, text), model)  # torch.compile finds a module by its file
    assert step._keeps_layouts
    compiled = torch.compile(lambda x, labels: step(x=x, labels=labels), fullgraph=True, backend="aot_eager")
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.1) for net in (model, reference)]
    for x, labels in batches(2):
        for loss, optimizer in (
            (lambda: compiled(x, labels), optimizers[0]),
            (lambda: F.cross_entropy(reference(x), labels), optimizers[1]),
        ):
            optimizer.zero_grad()
            loss().backward()
            optimizer.step()
    for name, value in reference.state_dict().items():
        assert torch.allclose(model.state_dict()[name].double(), value.double(), rtol=1e-10, atol=1e-12), name


def test_a_frozen_products_input_is_not_kept_for_its_gradients_dtype(tmp_path):
    """A frozen linear head reads its input for nothing but the dtype its input's gradient is cast
    back to under autocast: that cast is left out there (the forward would keep the whole input for
    it, with ``--no-recompute`` too, and autograd keeps nothing of it), so the ReLU output before it is
    kept as a mask alone, or as itself without recomputation, as autograd keeps it. A trained linear
    reads its input for its weight's gradient anyway, and casts. Gradients: autograd's in float64."""
    import copy

    import symgrad

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3)).double()
    model[2].requires_grad_(False)
    text = trace(model, {"input": (2, 5)}, wrt="parameters", name="frozen_head", loss=LossChoice("mse_loss", "target"))
    source = build_text(text, "frozen_head.yaml").rendered.files["frozen_head.py"]
    # the frozen weight read through autocast's copy, kept for the input's gradient as autograd keeps it (and
    # the first linear map's input, a positional one, through its copy for its weight's gradient: kept_casts.py)
    assert ".mm(sequential_2_weight_autocast)\n" in source and ").to(input.dtype)" not in source
    kept = "input_autocast, {}, sequential_2_weight_autocast, linear_2, residual\n"
    assert "    return loss, " + kept.format("relu_1_active") in source, source
    plain = build_text(text, "frozen_head.yaml", recompute=False).rendered.files["frozen_head.py"]
    assert "    return loss, " + kept.format("relu_1") in plain, plain
    trained = trace(
        model.requires_grad_(True),
        {"input": (2, 5)},
        wrt="parameters",
        name="trained_head",
        loss=LossChoice("mse_loss", "target"),
    )
    assert (
        ".mm(sequential_2_weight_autocast).to(relu_1.dtype)"
        in build_text(trained, "trained_head.yaml").rendered.files["trained_head.py"]
    )
    model[2].requires_grad_(False)
    path = tmp_path / "frozen_head.py"
    path.write_text(source)
    reference, net = copy.deepcopy(model), copy.deepcopy(model)
    step = symgrad.bind(path, net)
    data, target = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    F.mse_loss(reference(data), target).backward()
    step(input=data, target=target).backward()
    for (name, theirs), ours in zip(reference.named_parameters(), net.parameters()):
        if theirs.requires_grad:
            assert torch.allclose(ours.grad, theirs.grad, rtol=1e-12, atol=1e-14), name


SKIP_POOLED = """name: skip_pooled
inputs:
  x: {shape: [1, 2, 8, 8]}
  t: {shape: [1, 2, 8, 8]}
layers:
  - {op: relu, in: x, out: r}
  - {op: max_pool2d, in: r, kernel_size: 2, out: pooled}
  - {op: interpolate, in: pooled, scale_factor: 2, mode: nearest, out: up}
  - {op: add, in: [up, r], out: h}
loss: {op: mse_loss, target: t}
wrt: [x]
"""


def test_a_pooled_value_read_by_a_skip_too_builds_without_sympys_deprecated_tuple_in_an_add():
    """A U-Net's encoder output, pooled and read by the skip: its gradient adds the pool's pullback to
    the skip's, and the reads of that sum were found by putting a ``Tuple`` in the ``Add`` (deprecated
    since sympy 1.7: it warned on every U-Net build). The gradients are autograd's."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", SymPyDeprecationWarning)
        built = build_text(SKIP_POOLED, "skip_pooled.yaml")
    module = module_from_source(built.rendered.files["skip_pooled.py"], "skip_pooled")
    x = torch.randn(2, 2, 6, 10, dtype=torch.float64, requires_grad=True)
    t = torch.randn(2, 2, 6, 10, dtype=torch.float64)
    relu = torch.relu(x)
    up = F.interpolate(F.max_pool2d(relu, 2), scale_factor=2, mode="nearest")
    (expected,) = torch.autograd.grad(F.mse_loss(up + relu, t), x)
    assert torch.allclose(module.gradients(x=x.detach(), t=t).x, expected, rtol=1e-12, atol=1e-15)
