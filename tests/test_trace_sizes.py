"""Sizes read at run time from another node, ``{like: NODE}``: the spec syntax, its errors, and the
code it becomes (tracing it is tested in test_trace.py and test_trace_models.py)."""

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
    text = SPEC.replace("{op: pad, in: wide, pad: {like: x}, out: padded}",
                        "{op: pad, in: wide, pad: {like: up}, out: padded}").replace("[2, 3, 9, 11]", "[2, 3, 8, 10]")
    spec = text.replace("{op: conv_transpose2d, in: h, weight: w, stride: 2, out: wide}",
                        "{op: conv_transpose2d, in: h, weight: w, stride: 3, out: wide}")
    graph = build_graph(parse_spec(spec))
    assert graph.nodes["padded"].shape == (2, 3, 8, 10)  # 12 x 15 cropped by 2 + 2 and 2 + 3
    assert graph.with_input_shapes({"x": (1, 3, 5, 7), "t": (1, 3, 5, 7)}).nodes["padded"].shape == (1, 3, 5, 7)


@pytest.mark.parametrize("edit, line, message", [
    (("size: {like: x}", "size: {like: y}"), 9, "'y' is not defined before this point"),
    (("size: {like: x}", "size: {like: padded}"), 9, "'padded' is not defined before this point"),
    (("size: {like: x}", "size: {like: x, dims: 2}"), 9, "unknown key 'dims' at argument 'size'"),
    (("size: {like: x}", "size: {as: x}"), 9, "unknown key 'as' at argument 'size'"),
    (("size: {like: x}", "size: {like: [x]}"), 9, "'like' must be a name, not a list"),
    (("padding: 1, out: h", "padding: {like: x}, out: h"), 8, "conv2d: argument 'padding' takes values, not a size"),
    (("weight: w, padding: 1", "weight: {like: x}, padding: 1"), 8, "conv2d: 'weight' must be a node name, not {like: x}"),
    ((("size: {like: x}", "size: {like: s}"), ("  t: {", "  s: {shape: [9, 11]}\n  t: {")), 10,
     "reads the spatial sizes (dims 2 on) of 's' [9, 11], which do not fit the input [2, 3, 4, 5]"),
])
def test_a_bad_size_reference_is_one_error_at_its_line(edit, line, message):
    text = SPEC
    for old, new in edit if isinstance(edit[0], tuple) else [edit]:
        text = text.replace(old, new)
    with pytest.raises(SpecError) as error:
        build_graph(parse_spec(text, "like.yaml"))
    assert message in error.value.message, error.value.message
    assert error.value.location.line == line and error.value.fix
