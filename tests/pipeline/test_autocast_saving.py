"""Under autocast a value that only a convolution's backward reads is kept as the convolution ran on it:
autocast's cast copy, as autograd keeps it (issue 39's "save in the dtype the consumer ran in").

CPU autocast runs reflection padding and 3-d average pooling in float32 (CUDA's runs bilinear upsampling in
float32, and a concatenation promotes to its widest input): the convolution after them reads a float32
tensor and runs on its bfloat16 copy. Autograd's convolution node saves that copy; the generated forward
kept the float32 tensor and cast it again in its backward, twice the bytes; then it kept a copy cast again
at the value's last forward use (``_saved_as_autocast_casts``), two casts where autograd makes one; now it
casts the value once before the convolution, which reads the copy, and keeps the copy and the value's dtype
(``conv1_autocast``, ``conv1_dtype``: symgrad/kept_casts.py). These models are written as restoration and
3-d segmentation networks are: ``padding_mode="reflect"``, ``nn.AvgPool3d``."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symgrad
from symgrad.check import load_module
from symgrad.pipeline import build_text
from symgrad.trace import LossChoice, trace


class ReflectDenoiser(nn.Module):
    """A DnCNN-style residual denoiser whose convolutions pad by reflection, as restoration code writes it."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.head = nn.Conv2d(1, width, 3, padding=1, padding_mode="reflect")
        self.body = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1, padding_mode="reflect", bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        self.tail = nn.Conv2d(width, 1, 3, padding=1, padding_mode="reflect")

    def forward(self, noisy):
        return noisy - self.tail(self.body(F.relu(self.head(noisy))))


class Pooled3d(nn.Module):
    """A 3-d encoder stage: convolution, average pooling, convolution (a 3-d U-Net's down path)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv3d(1, 4, 3, padding=1)
        self.pool = nn.AvgPool3d(2)
        self.conv2 = nn.Conv3d(4, 4, 3, padding=1)

    def forward(self, volume):
        return self.conv2(self.pool(torch.relu(self.conv1(volume))))


CASES = {
    "reflect": (ReflectDenoiser, {"noisy": (2, 1, 12, 12)}, (3, 1, 16, 20)),
    "pool3d": (Pooled3d, {"volume": (2, 1, 8, 8, 8)}, (2, 1, 8, 12, 8)),
}


def generated_module(label: str, tmp_path: Path):
    make, shapes, _ = CASES[label]
    torch.manual_seed(0)
    model = make().train()
    text = trace(
        model, shapes, wrt="parameters", name=f"autocast_{label}", loss=LossChoice("mse_loss", "target"), mode="train"
    )
    built = build_text(text, f"autocast_{label}.yaml")
    for name, content in built.rendered.files.items():
        (tmp_path / name).write_text(content)
    return model, tmp_path / f"autocast_{label}.py"


def saved_bytes(values) -> int:
    """Bytes of the distinct storages among ``values`` (tensors, or ``(copy, dtype)`` pairs)."""
    storages = {}
    for value in values:
        value = value[0] if type(value) is tuple else value
        if isinstance(value, torch.Tensor):
            storages[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
    return sum(storages.values())


def autograd_saved_bytes(model, data: torch.Tensor, target: torch.Tensor) -> int:
    """Bytes of the distinct non-parameter storages autograd's nodes keep for one step's backward."""
    parameters = {tensor.untyped_storage().data_ptr() for tensor in (*model.parameters(), *model.buffers())}
    kept = {}

    def pack(tensor):
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in parameters:
            kept[pointer] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            F.mse_loss(model(data), target)
    return sum(kept.values())


@pytest.mark.parametrize("label", CASES)
def test_a_value_only_a_convolution_reads_is_kept_in_autocasts_dtype_no_wider_than_autograds(label, tmp_path):
    model, path = generated_module(label, tmp_path)
    module = load_module(path)
    torch.manual_seed(1)
    data = torch.randn(*CASES[label][2])
    target = torch.randn_like(model(data))
    arguments = {
        **{name: value.detach() for name, value in model.named_parameters()},
        **{name: value.clone() for name, value in model.named_buffers()},
    }
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, *saved = module._forward_saving(data, **_parameters(module, arguments), target=target)
    copies = [value for value in saved if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16]
    dtypes = [value for value in saved if isinstance(value, torch.dtype)]  # each copy's value's, for its gradient
    assert copies and dtypes and all(dtype == torch.float32 for dtype in dtypes), saved
    assert saved_bytes(saved) <= autograd_saved_bytes(copy.deepcopy(model), data, target)
    with torch.no_grad():  # outside autocast nothing is cast: the saved values are the forward's own
        _, *plain = module._forward_saving(data, **_parameters(module, arguments), target=target)
    assert not any(isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 for value in plain)


def _parameters(module, arguments: dict) -> dict:
    """``arguments`` keyed as the generated ``_forward_saving`` names its parameters (``head_weight`` for
    ``head.weight``), or under ``params`` where it takes them in one mapping."""
    import inspect

    names = inspect.signature(module._forward_saving).parameters
    if "params" in names:
        return {"params": arguments}
    return {name: arguments[key] for key in arguments for name in names if name == key.replace(".", "_")}


@pytest.mark.parametrize("label", CASES)
def test_the_bound_step_under_autocast_computes_autograds_gradients(label, tmp_path):
    """The convolution reads the kept copy, as autocast's own cast of the value: the gradients are
    autograd's bit for bit (as when the value was kept wide), each in its parameter's dtype."""
    model, path = generated_module(label, tmp_path)
    torch.manual_seed(2)
    data = torch.randn(*CASES[label][2])
    target = torch.randn_like(model(data))
    net, reference = copy.deepcopy(model), copy.deepcopy(model)
    step = symgrad.bind(path, net)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = step(**{next(iter(CASES[label][1])): data, "target": target})
        expected = F.mse_loss(reference(data), target)
    loss.backward()
    expected.backward()
    for (name, ours), theirs in zip(net.named_parameters(), reference.parameters()):
        assert ours.grad.dtype == torch.float32 and torch.equal(ours.grad, theirs.grad), name


LOSS_READS_A_CONVOLUTIONS_INPUT = """
name: loss_input_convolved
inputs:
  features: {shape: [2, 3, 8, 8]}
  w2: {shape: [3, 3, 3, 3]}
layers:
  - {op: pad, pad: [1, 1, 1, 1], mode: reflect, out: pred}
  - {op: conv2d, in: pred, weight: w2, padding: 1, out: aux}
loss: {op: mse_loss, in: pred, target: aux, reduction: sum}
wrt: [features, w2]
"""


def test_a_value_the_default_cotangent_reads_is_kept_as_it_is(tmp_path):
    """``pred`` is the loss's input, which the default cotangent (``pred.new_ones(...)``) reads as a
    tensor, and a convolution's input: it is not cast, and ``gradients`` runs under autocast."""
    from symgrad.check import module_from_source

    built = build_text(LOSS_READS_A_CONVOLUTIONS_INPUT, "loss_input_convolved.yaml")
    source = built.rendered.files["loss_input_convolved.py"]
    assert "pred = _saved_as_autocast_casts(pred)" not in source and "pred_autocast" not in source
    module = module_from_source(source, "loss_input_convolved")
    features, w2 = torch.randn(2, 3, 8, 8), torch.randn(3, 3, 3, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        grads = module.gradients(features, w2)
    assert [grad.dtype for grad in grads] == [torch.float32, torch.float32]


class ReflectStage(nn.Module):
    """A residual stage of two reflection-padded convolutions."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, padding_mode="reflect")
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, padding_mode="reflect")

    def forward(self, x):
        return x + self.conv2(torch.relu(self.conv1(x)))


class RepeatedReflect(nn.Module):
    """Two instances of one reflection-padded stage, traced as a block (``blocks=True``)."""

    def __init__(self):
        super().__init__()
        self.stages = nn.Sequential(ReflectStage(), ReflectStage())

    def forward(self, x):
        return self.stages(x)


def test_a_block_keeps_autocasts_copy_in_what_it_saves_with_autograds_gradients(tmp_path):
    torch.manual_seed(0)
    model = RepeatedReflect()
    text = trace(
        model,
        {"x": (2, 4, 8, 8)},
        wrt="parameters",
        name="repeated_reflect",
        loss=LossChoice("mse_loss", "target"),
        mode="train",
        blocks=True,
    )
    built = build_text(text, "repeated_reflect.yaml")
    for name, content in built.rendered.files.items():
        (tmp_path / name).write_text(content)
    path = tmp_path / "repeated_reflect.py"
    source = path.read_text()
    assert re.search(r"return \w+, \[[^\]]*conv1_autocast, conv1_dtype", source), source  # in the block's return
    data, target = torch.randn(3, 4, 10, 6), torch.randn(3, 4, 10, 6)
    net, reference = copy.deepcopy(model), copy.deepcopy(model)
    step = symgrad.bind(path, net)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = step(x=data, target=target)
        expected = F.mse_loss(reference(data), target)
    loss.backward()
    expected.backward()
    for ours, theirs in zip(net.parameters(), reference.parameters()):
        assert ours.grad.dtype == torch.float32 and torch.equal(ours.grad, theirs.grad)


FLOAT64_CONV = """name: float64_conv
inputs:
  x: {shape: [2, 3, 9, 9]}
  w: {shape: [4, 3, 3, 3]}
  y: {shape: [2, 4, 5, 5]}
layers:
  - {op: conv2d, in: x, weight: w, stride: 2, padding: 1, out: c}
loss: {op: mse_loss, in: c, target: y}
wrt: WRT
"""


@pytest.mark.parametrize("wrt", [["w"], ["x", "w"]], ids=["weight alone", "input and weight"])
def test_a_float64_convolution_under_autocast_keeps_float64_as_autocast_does(wrt, tmp_path):
    """Autocast casts no float64 tensor, so a float64 convolution runs in float64 under it, and so does
    its ``convolution_backward`` call (the weight's gradient alone, or with the input's): the gradients
    are autograd's in the same autocast context, not bfloat16-rounded (2e-3 off before)."""
    text = FLOAT64_CONV.replace("WRT", "[" + ", ".join(wrt) + "]")
    from symgrad.check import module_from_source

    module = module_from_source(build_text(text, "float64_conv.yaml").rendered.files["float64_conv.py"], "float64_conv")
    generator = torch.Generator().manual_seed(0)
    x, w, y = (
        torch.randn(shape, generator=generator, dtype=torch.float64)
        for shape in ((2, 3, 9, 9), (4, 3, 3, 3), (2, 4, 5, 5))
    )
    x.requires_grad_("x" in wrt)
    w.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = module.gradients(x=x, w=w, y=y)
        expected = torch.autograd.grad(
            F.mse_loss(F.conv2d(x, w, stride=2, padding=1), y), [{"x": x, "w": w}[name] for name in wrt]
        )
    for name, reference in zip(wrt, expected):
        value = getattr(got, name)
        assert value.dtype == torch.float64, name
        assert (value - reference).abs().max() <= 1e-12 * reference.abs().max(), name


class BiasedHead(nn.Module):
    """A learned offset added before a linear map and a product (a position embedding before a
    ViT's projection, ``x + pos`` then ``fc``): the offset's gradient sums the product's input gradient."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.offset = nn.Parameter(torch.randn(width))
        self.fc = nn.Linear(width, 4)
        self.mix = nn.Parameter(torch.randn(width, width))

    def forward(self, x):
        x = x + self.offset
        return self.fc(x) + self.fc(x @ self.mix)


def test_a_products_input_gradient_comes_back_in_the_inputs_dtype_as_autograds(tmp_path):
    """Under autocast a linear map and a matrix product run in bfloat16 on float32 inputs; autograd
    casts each input's gradient back to float32 before it is summed, and so does the explicit pullback
    (``.to(x.dtype)``): the offset's gradient, a sum of them, is autograd's bit for bit (it was summed in
    bfloat16: -0.11572 against -0.11584 on a model of this kind). Outside autocast the cast is no op."""
    torch.manual_seed(0)
    model = BiasedHead()
    text = trace(model, {"x": (2, 8)}, wrt="parameters", name="biased_head", loss=LossChoice("mse_loss", "target"))
    source = build_text(text, "biased_head.yaml").rendered.files["biased_head.py"]
    assert '.mm(params["fc.weight"]).to(' in source
    path = tmp_path / "biased_head.py"
    path.write_text(source)
    torch.manual_seed(1)
    data, target = torch.randn(16, 8), torch.randn(16, 4)
    reference, net = copy.deepcopy(model), copy.deepcopy(model)
    step = symgrad.bind(path, net)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        F.mse_loss(reference(data), target).backward()
        step(x=data, target=target).backward()
    for (name, theirs), ours in zip(reference.named_parameters(), net.parameters()):
        assert ours.grad.dtype == torch.float32 and torch.equal(ours.grad, theirs.grad), name
