"""Sizes read at run time from another node, ``{like: NODE}``: the spec syntax, its errors, and the
code it becomes (tracing it is tested in test_trace.py and tests/models/test_classic_cnns.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from symgrad.check import module_from_source, relative_error
from symgrad.errors import SpecError
from symgrad.graph import build_graph
from symgrad.pipeline import build_text
from symgrad.spec import parse_spec

SPEC = """\
name: like_sizes
inputs:
  x: {shape: [2, 3, 9, 11]}
  w: {shape: [3, 3, 3, 3]}
  t: {shape: [2, 3, 9, 11]}
layers:
  - {op: max_pool2d, in: x, kernel_size: 2, out: down}
  - {op: conv2d, in: down, weight: w, padding: 1, out: h}
  - {op: interpolate, in: h, size: {like: x}, mode: bilinear, out: up}
  - {op: conv_transpose2d, in: h, weight: w, stride: 2, out: wide}
  - {op: pad, in: wide, pad: {like: x}, out: padded}
  - {op: add, in: [up, padded], out: y}
loss: {op: mse_loss, in: y, target: t}
wrt: [x, w]
"""


def test_sizes_like_a_node_are_read_at_run_time_and_match_autograd_at_odd_and_even_sizes():
    built = build_text(SPEC, "like_sizes.yaml").rendered
    source = built.files["like_sizes.py"]
    assert "F.interpolate(h, size=(x.shape[2], x.shape[3]), mode='bilinear')" in source
    assert "F.pad(wide, [((x.shape[3] - wide.shape[3]) // 2), " in source
    module = module_from_source(source, "like_sizes")
    generator = torch.Generator().manual_seed(5)
    for size in [(9, 11), (12, 8), (7, 14)]:  # pads of 1 split 0 + 1, none, and a crop-free 1
        x = torch.randn(3, 3, *size, generator=generator, dtype=torch.float64, requires_grad=True)
        w = torch.randn(3, 3, 3, 3, generator=generator, dtype=torch.float64, requires_grad=True)
        t = torch.randn(3, 3, *size, generator=generator, dtype=torch.float64)
        h = F.conv2d(F.max_pool2d(x, 2), w, padding=1)
        wide = F.conv_transpose2d(h, w, stride=2)
        dy, dx = size[0] - wide.shape[2], size[1] - wide.shape[3]
        y = F.interpolate(h, size=size, mode="bilinear") + F.pad(wide, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        expected = torch.autograd.grad(F.mse_loss(y, t), (x, w))
        actual = module.gradients(x=x, w=w, t=t)
        for value, reference in zip(actual, expected):
            assert relative_error(value, reference) <= 1e-12, size


def test_a_pad_like_a_larger_node_crops_with_the_same_split():
    text = SPEC.replace(
        "{op: pad, in: wide, pad: {like: x}, out: padded}", "{op: pad, in: wide, pad: {like: up}, out: padded}"
    ).replace("[2, 3, 9, 11]", "[2, 3, 8, 10]")
    spec = text.replace(
        "{op: conv_transpose2d, in: h, weight: w, stride: 2, out: wide}",
        "{op: conv_transpose2d, in: h, weight: w, stride: 3, out: wide}",
    )
    graph = build_graph(parse_spec(spec))
    assert graph.nodes["padded"].shape == (2, 3, 8, 10)  # 12 x 15 cropped by 2 + 2 and 2 + 3
    assert graph.with_input_shapes({"x": (1, 3, 5, 7), "t": (1, 3, 5, 7)}).nodes["padded"].shape == (1, 3, 5, 7)


@pytest.mark.parametrize(
    "edit, line, message",
    [
        (("size: {like: x}", "size: {like: y}"), 9, "'y' is not defined before this point"),
        (("size: {like: x}", "size: {like: padded}"), 9, "'padded' is not defined before this point"),
        (("size: {like: x}", "size: {like: x, dim: 2}"), 9, "unknown key 'dim' at argument 'size'"),
        (("size: {like: x}", "size: {as: x}"), 9, "unknown key 'as' at argument 'size'"),
        (("size: {like: x}", "size: {like: [x]}"), 9, "'like' must be a name, not a list"),
        (
            ("padding: 1, out: h", "padding: {like: x}, out: h"),
            8,
            "conv2d: argument 'padding' must be an int or a list of 2 ints, not {like: x}",
        ),
        (
            ("weight: w, padding: 1", "weight: {like: x}, padding: 1"),
            8,
            "conv2d: 'weight' must be a node name, not {like: x}",
        ),
        (
            ("pad: {like: x}, out: padded", "pad: {like: x}, mode: replicate, out: padded"),
            11,
            "pad 'padded': pad {like: x} pads in constant mode only, not 'replicate'",
        ),
        (
            (("size: {like: x}", "size: {like: s}"), ("  t: {", "  s: {shape: [9, 11]}\n  t: {")),
            10,
            "reads the spatial sizes (dims 2 on) of 's' [9, 11], which do not fit the input [2, 3, 4, 5]",
        ),
    ],
)
def test_a_bad_size_reference_is_one_error_at_its_line(edit, line, message):
    text = SPEC
    for old, new in edit if isinstance(edit[0], tuple) else [edit]:
        text = text.replace(old, new)
    with pytest.raises(SpecError) as error:
        build_graph(parse_spec(text, "like.yaml"))
    assert message in error.value.message, error.value.message
    assert error.value.location.line == line and error.value.fix


FULL = """\
name: noise_level
inputs:
  x: {shape: [2, 1, 9, 11]}
  w: {shape: [4, 2, 3, 3]}
  t: {shape: [2, 4, 9, 11]}
layers:
  - {op: full, size: [{like: x}, 1, {like: x}, {like: x}], fill_value: 0.098, out: level}
  - {op: cat, in: [x, level], dim: 1, out: joined}
  - {op: conv2d, in: joined, weight: w, padding: 1, out: h}
loss: {op: mse_loss, in: h, target: t}
wrt: [x, w]
"""


def test_a_full_map_follows_its_node_at_run_time_and_has_no_gradient():
    source = build_text(FULL, "noise_level.yaml").rendered.files["noise_level.py"]
    assert "level = x.new_full((x.shape[0], 1, x.shape[2], x.shape[3]), 0.098)" in source
    assert "grad_level" not in source  # it reads no tensor's values: the reverse walk never reaches it
    module = module_from_source(source, "noise_level")
    x = torch.randn(3, 1, 6, 13, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    t = torch.randn(3, 4, 6, 13, dtype=torch.float64)
    h = F.conv2d(torch.cat([x, torch.full((3, 1, 6, 13), 0.098, dtype=torch.float64)], 1), w, padding=1)
    expected = torch.autograd.grad(F.mse_loss(h, t), (x, w))
    for value, reference in zip(module.gradients(x=x, w=w, t=t), expected):
        assert relative_error(value, reference) <= 1e-12


@pytest.mark.parametrize(
    "edit, message",
    [
        (("size: [{like: x}, 1, {like: x}, {like: x}]", "size: [2, 1, 9, 11]"), "reads no size from a node"),
        (
            ("size: [{like: x}, 1, {like: x}, {like: x}]", "size: [{like: x}, 1, {like: x}]"),
            "entry 0 is {like: x}, a size of 'x', which has 4 dims, not 3",
        ),
        (
            ("size: [{like: x}, 1, {like: x}, {like: x}]", "size: {like: x}"),
            "reads the spatial sizes (dims 2 on) of 'x'",
        ),
        (
            ("size: [{like: x}, 1, {like: x}, {like: x}]", "size: [{like: x}, 0, {like: x}, {like: x}]"),
            "entry 1 is 0, neither a positive int nor {like: NODE}",
        ),
        (("{op: full, size", "{op: full, in: x, size"), "full reads 0 tensor(s) from 'in:' but 1 are given"),
    ],
)
def test_a_bad_full_is_one_error_at_its_line(edit, message):
    with pytest.raises(SpecError) as error:
        build_graph(parse_spec(FULL.replace(*edit), "full.yaml"))
    assert message in error.value.message, error.value.message
    assert error.value.location.line == 7 and error.value.fix
