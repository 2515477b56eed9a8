"""A grouped convolution's weight and bias gradients run at the end of the backward
(``symgrad/late_weights.py``): its ``convolution_backward`` call split into the input's gradient in place
and the weight's and bias's after everything else, the same kernel on the same operands, so the gradients
are the unsplit call's bit for bit (oneDNN's channels_last kernel pads each group of a depthwise weight
gradient to 16 x 16 channels: that buffer now comes where the forward's kept values are freed)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symgrad.schedule
from symgrad.check import module_from_source
from symgrad.late_weights import CHUNKED_HELPER
from symgrad.pipeline import build_text
from symgrad.rules.conv_helpers import CONVOLUTION_BACKWARD
from symgrad.trace import trace


class Grouped(nn.Module):
    """A wide stem with a depthwise convolution at its size, a 4x downsampling, two ConvNeXt blocks
    (depthwise 7 x 7, permute, LayerNorm, fc1, GELU, fc2, layer scale, residual), a grouped (not
    depthwise) convolution without bias and a head: the last three grouped convolutions read values an
    eighth of the stem's output or less, the first one the stem's output itself."""

    def __init__(self, dim=4):
        super().__init__()
        self.stem = nn.Conv2d(2, 8, 1)
        self.dw0 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.down = nn.Conv2d(8, dim, 4, stride=4)
        self.dw1, self.dw2 = (nn.Conv2d(dim, dim, 7, padding=3, groups=dim) for _ in range(2))
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.fc3, self.fc4 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))
        self.grouped = nn.Conv2d(dim, 2 * dim, 3, padding=1, groups=2, bias=False)
        self.head = nn.Linear(2 * dim, 3)

    def forward(self, x):
        x = self.down(F.gelu(self.dw0(self.stem(x))))
        y = self.norm1(self.dw1(x).permute(0, 2, 3, 1))
        x = x + (self.gamma * self.fc2(F.gelu(self.fc1(y)))).permute(0, 3, 1, 2)
        y = self.norm2(self.dw2(x).permute(0, 2, 3, 1))
        x = x + self.fc4(F.gelu(self.fc3(y))).permute(0, 3, 1, 2)
        return self.head(self.grouped(x).mean(dim=(2, 3)))


def _source(keep: str, split: bool = True) -> str:
    torch.manual_seed(0)
    text = trace(Grouped().train(), {"x": (2, 2, 16, 16)}, wrt="parameters", name="grouped", mode="train")
    if split:
        return build_text(text, "grouped.yaml", documents=False, tests=False, keep=keep).rendered.files["grouped.py"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(symgrad.schedule, "late_grouped_weight_grads", lambda backward, graph: backward)
        return build_text(text, "grouped.yaml", documents=False, tests=False, keep=keep).rendered.files["grouped.py"]


_SOURCES: dict = {}


def source(keep: str, split: bool = True) -> str:
    if (keep, split) not in _SOURCES:
        _SOURCES[keep, split] = _source(keep, split)
    return _SOURCES[keep, split]


def _params(model):
    return {key: value.clone() for key, value in model.state_dict().items() if value.is_floating_point()}


@pytest.mark.parametrize("keep", ["all", "lean"])
def test_each_grouped_weight_gradient_comes_after_every_input_gradient(keep):
    backward = source(keep).split("def _backward_from_saved", 1)[1].split("\ndef ", 1)[0]
    calls = [
        re.search(r"\[\w+, \w+, \w+\]", match.group(1)).group(0)
        for match in re.finditer(r"_convolution_backward\((.*?)\)\n", backward, re.S)
        if "groups=" in match.group(1)
    ]
    # three grouped convolutions each split in two: the input calls in the backward's order (grouped, dw2,
    # dw1), the late ones in the forward's (dw1, dw2, grouped); dw0, on the stem's output, in one call
    assert calls[:3] == ["[True, False, False]"] * 3, calls
    assert calls[3:] == ["[True, True, True]", "[False, True, True]", "[False, True, True]", "[False, True, False]"]


def test_gradients_equal_autograds_in_float64():
    module = module_from_source(source("all"), "grouped")
    torch.manual_seed(1)
    model = Grouped().train().double()
    x = torch.randn(3, 2, 20, 20, dtype=torch.float64)  # another batch and size than traced
    out = model(x)
    grad = torch.randn_like(out)
    expected = dict(zip(dict(model.named_parameters()), torch.autograd.grad(out, list(model.parameters()), grad)))
    got = module.gradients(x, _params(model), (grad,)).params
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert (got[key] - value).abs().max() <= 1e-12 * max(1.0, value.abs().max().item()), key


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("autocast", [False, True])
def test_float32_gradients_are_the_unsplit_calls_bit_for_bit(channels_last, autocast):
    split = module_from_source(source("all"), "grouped")
    whole = module_from_source(source("all", split=False), "grouped_whole")
    assert source("all", split=False) != source("all")  # the split is there to compare with
    torch.manual_seed(2)
    model = Grouped().train()
    x = torch.randn(3, 2, 16, 16)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    grad = torch.randn(3, 3)
    got = {}
    for name, module in (("split", split), ("whole", whole)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            got[name] = module.gradients(x, _params(model), (grad,)).params
    for key, value in got["whole"].items():
        assert got["split"][key].dtype == value.dtype and torch.equal(got["split"][key], value), key


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_the_kernel_gives_each_gradient_alike_asked_alone_or_together(dtype, channels_last):
    """What the split relies on: ``convolution_backward`` asked for the input's gradient alone, or the
    weight's and bias's alone, returns what one call asking for all three returns, bit for bit (a
    depthwise 7 x 7, a depthwise 3 x 3 of stride 2, four groups of 16 channels)."""
    layout = torch.channels_last if channels_last else torch.contiguous_format
    torch.manual_seed(3)
    for batch, channels, size, kernel, groups, stride in (
        (3, 32, 5, 7, 32, 1),
        (2, 48, 9, 3, 48, 2),
        (2, 64, 6, 3, 4, 1),
    ):
        x = torch.randn(batch, channels, size, size, dtype=dtype).contiguous(memory_format=layout)
        w = torch.randn(channels, channels // groups, kernel, kernel, dtype=dtype).contiguous(memory_format=layout)
        grad = torch.randn_like(F.conv2d(x, w, None, stride, kernel // 2, 1, groups))
        others = [channels], [stride] * 2, [kernel // 2] * 2, [1, 1], False, [0, 0], groups
        together = torch.ops.aten.convolution_backward(grad, x, w, *others, [True, True, True])
        alone = torch.ops.aten.convolution_backward(grad, x, w, *others, [True, False, False])[0]
        _, weight, bias = torch.ops.aten.convolution_backward(grad, x, w, *others, [False, True, True])
        for got, expected in zip((alone, weight, bias), together):
            assert got.stride() == expected.stride() and torch.equal(got, expected), (batch, channels, groups)


class Wide(nn.Module):
    """A wide stem, a 4x downsampling and a depthwise 7 x 7 convolution of 128 channels on its output
    (an eighth of the stem's output, kept, not computed again: its call moves last), whose late call
    runs as two of 64 channels."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(2, 128, 1)
        self.down = nn.Conv2d(128, 128, 4, stride=4)
        self.dw = nn.Conv2d(128, 128, 7, padding=3, groups=128)
        self.head = nn.Linear(128, 3)

    def forward(self, x):
        return self.head(F.gelu(self.dw(self.down(F.gelu(self.stem(x))))).mean(dim=(2, 3)))


def _wide_source(split: bool) -> str:
    torch.manual_seed(0)
    text = trace(Wide().train(), {"x": (2, 2, 16, 16)}, wrt="parameters", name="wide", mode="train")
    with pytest.MonkeyPatch.context() as patch:
        if not split:
            patch.setattr(symgrad.schedule, "late_grouped_weight_grads", lambda backward, graph: backward)
        return build_text(text, "wide.yaml", documents=False, tests=False, keep="all").rendered.files["wide.py"]


def test_a_wide_depthwise_late_call_runs_in_chunks_bit_for_bit():
    """The late call of 128 channels is ``_grouped_weight_backward`` (two calls of 64 in channels_last
    float32 and under bfloat16 autocast): its gradients are the one call's bit for bit (the unsplit
    module's), and in float64 (one call) equal autograd's through the module at another batch and size."""
    text = _wide_source(split=True)
    assert text.count("_grouped_weight_backward(") == 2, text  # its def and its call
    split, whole = module_from_source(text, "wide"), module_from_source(_wide_source(split=False), "wide_whole")
    torch.manual_seed(4)
    model = Wide().train()
    x = torch.randn(3, 2, 20, 20)
    model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    grad = torch.randn(3, 3)
    for autocast in (False, True):
        got = {}
        for name, module in (("split", split), ("whole", whole)):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                got[name] = module.gradients(x, _params(model), (grad,)).params
        for key, value in got["whole"].items():
            assert got["split"][key].dtype == value.dtype and torch.equal(got["split"][key], value), (key, autocast)
    model, x = model.double(), torch.randn(2, 2, 24, 24, dtype=torch.float64)
    out = model(x)
    grad = torch.randn_like(out)
    expected = dict(zip(dict(model.named_parameters()), torch.autograd.grad(out, list(model.parameters()), grad)))
    got = split.gradients(x, _params(model), (grad,)).params
    for key, value in expected.items():
        assert (got[key] - value).abs().max() <= 1e-12 * max(1.0, value.abs().max().item()), key


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_late_helper_in_chunks_is_one_calls_result_bit_for_bit(dtype, threads):
    """``_grouped_weight_backward`` (late_weights.CHUNKED_HELPER) against one ``convolution_backward``
    call in channels_last: depthwise 7 x 7 and 5 x 5 of 128, 200 and 256 channels (2, 3, 4 calls), bit for
    bit with equal strides; a 3 x 3 and the default layout in one call (oneDNN's depthwise kernel there
    splits its sums by channel blocks: chunks of it would not be bit for bit)."""
    namespace = {"torch": torch}
    exec(CONVOLUTION_BACKWARD.whole + CHUNKED_HELPER, namespace)
    whole, calls = namespace["_convolution_backward"], []
    namespace["_convolution_backward"] = lambda *args, **options: calls.append(1) or whole(*args, **options)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(5)
        for batch, channels, size, kernel, stride, layout, wanted in (
            (2, 128, 5, 7, 1, torch.channels_last, 2),
            (3, 200, 9, 5, 2, torch.channels_last, 3),
            (1, 256, 3, 7, 1, torch.channels_last, 4),
            (2, 128, 6, 3, 1, torch.channels_last, 1),
            (2, 128, 5, 7, 1, torch.contiguous_format, 1),
        ):
            x = torch.randn(batch, channels, size, size, dtype=dtype).contiguous(memory_format=layout)
            w = torch.randn(channels, 1, kernel, kernel, dtype=dtype).contiguous(memory_format=layout)
            grad = torch.randn_like(F.conv2d(x, w, None, stride, kernel // 2, 1, channels))
            others = [channels], [stride] * 2, [kernel // 2] * 2, [1, 1], False, [0, 0], channels
            expected = torch.ops.aten.convolution_backward(grad, x, w, *others, [False, True, True])
            calls.clear()
            got = namespace["_grouped_weight_backward"](
                grad,
                x,
                w,
                [False, True, True],
                stride=stride,
                padding=kernel // 2,
                groups=channels,
                bias_sizes=[channels],
            )
            assert len(calls) == wanted, (channels, kernel, layout)
            assert got[0] is None
            for value, reference in zip(got[1:], expected[1:]):
                assert value.stride() == reference.stride() and torch.equal(value, reference), (channels, kernel)
    finally:
        torch.set_num_threads(before)


def test_the_late_helper_compiles_with_fullgraph():
    """The helper compiles with ``fullgraph=True`` (no graph break: a bound model's step still compiles
    whole; while compiling it is one call, as a graph would fix the thread count), its gradients the
    eager helper's."""
    namespace = {"torch": torch}
    exec(CONVOLUTION_BACKWARD.whole + CHUNKED_HELPER, namespace)
    helper = namespace["_grouped_weight_backward"]

    def late(grad, x, w):
        return helper(grad, x, w, [False, True, True], padding=3, groups=128, bias_sizes=[128])

    torch.manual_seed(6)
    x, grad = (torch.randn(2, 128, 5, 5).contiguous(memory_format=torch.channels_last) for _ in range(2))
    w = torch.randn(128, 1, 7, 7)
    torch._dynamo.reset()
    got = torch.compile(late, backend="eager", fullgraph=True)(grad, x, w)
    for value, expected in zip(got[1:], late(grad, x, w)[1:]):
        assert torch.equal(value, expected)


class _Expanding(nn.Module):
    def __init__(self, channels: int = 4):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(channels, 16 * channels, 1), nn.Conv2d(16 * channels, channels, 1)

    def forward(self, x):
        return x + self.conv2(F.relu(self.conv1(x)))


class _DepthwiseThenExpanding(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.dw = nn.Conv2d(2, 4, 1), nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.blocks = nn.Sequential(_Expanding(), _Expanding(), _Expanding())
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.blocks(self.dw(self.stem(x))).mean(dim=(2, 3)))


def test_the_blocks_forms_top_body_moves_a_call_as_the_flat_module_does():
    """A depthwise convolution before blocks that expand 16x inside: small beside the network's largest
    value, so its weight gradient moves last in the flat module, and in the blocks form's top body too (its
    instances' calls hid the expansions: the top body is judged beside the network's largest, ``top_sizes``)."""
    for blocks in (False, True):
        torch.manual_seed(0)
        text = trace(
            _DepthwiseThenExpanding().train(), {"x": (2, 2, 8, 8)}, wrt="parameters", name="net", blocks=blocks
        )
        source = build_text(text, "net.yaml", documents=False, tests=False).rendered.files["net.py"]
        assert "grad_dw, stem, dw_weight_autocast, [False, True, True]" in source, (blocks, source)
