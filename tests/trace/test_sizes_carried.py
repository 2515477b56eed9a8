"""Sizes read from tensors carry their dims through the code's arithmetic (``symgrad/trace/sizes.py``), and
the spec's ``{like: NODE, size: '...'}`` reads them back: the two agree, and a malformed size is refused."""

from __future__ import annotations

import math

import pytest
import sympy

from symgrad.errors import SpecError
from symgrad.pipeline import build_text
from symgrad.spec import size_expression
from symgrad.trace.sizes import Dim, TracedSize, spec_size

H, W, B = (TracedSize(value, Dim(0, dim)) for dim, value in ((2, 10), (3, 6), (0, 3)))


def _resolve(dim):
    return ("x", dim.dim)


@pytest.mark.parametrize(
    "value, expected",
    [
        (B, {"like": "x", "dims": [0]}),
        (H * W, {"like": "x", "dims": [2, 3]}),
        (H // 2, {"like": "x", "size": "shape[2] // 2"}),
        (math.ceil(W / 4), {"like": "x", "size": "ceil(shape[3] / 4)"}),
        (B * 4, {"like": "x", "size": "4 * shape[0]"}),
        (math.ceil(H / 2) * 2 // 2 * (W // 2), {"like": "x", "size": "ceil(shape[2] / 2) * (shape[3] // 2)"}),
        (H + W - 1, {"like": "x", "size": "-1 + shape[2] + shape[3]"}),
    ],
)
def test_a_traced_size_is_written_as_the_expression_it_was_computed_by(value, expected):
    assert isinstance(value, TracedSize)
    written = spec_size(value, _resolve)
    assert written == expected
    if "size" in written:  # the spec reads it back to the traced value, and to the expression
        sizes = {0: 3, 2: 10, 3: 6}
        assert size_expression(written["size"], lambda dim: sympy.Integer(sizes[dim])) == int(value)


def test_sizes_of_two_tensors_or_of_none_are_not_one_node_expression():
    other = TracedSize(4, Dim(1, 2))
    assert spec_size(H * other, lambda dim: ("x" if dim.index == 0 else "y", dim.dim)) is None
    assert spec_size(7, _resolve) is None
    assert spec_size(H, lambda dim: None) is None  # its tensor is no node


def test_a_traced_size_stays_an_int_that_hashes_as_one():
    assert H * W == 60 and isinstance(H * W, int) and hash(H) == hash(10) and {H: 1}[10] == 1


SPEC = """name: sized
inputs:
  x: {shape: [2, 4, 6, 8]}
  y: {shape: [2, 4, 3, 2, 4, 2]}
layers:
  - {op: reshape, in: x, shape: [{like: x, dims: [0]}, 4, SIZE, 2, {like: x, size: 'shape[3] // 2'}, 2]}
loss: {op: half_sq_error, target: y}
wrt: [x]
"""


def test_a_size_expression_generates_and_is_read_at_run_time():
    built = build_text(SPEC.replace("SIZE", "{like: x, size: 'ceil(shape[2] / 2)'}"), "sized.yaml")
    code = built.rendered.files["sized.py"]
    assert "(-(-x.shape[2] // 2))" in code and "(x.shape[3] // 2)" in code, code


@pytest.mark.parametrize(
    "size, problem",
    [
        ("'shape[2] / 2'", "is not an int"),
        ("'x.shape[2]'", "is not an int"),
        ("'shape[2] // 0'", "positive int"),
        ("'__import__(1)'", "is not an int"),
    ],
)
def test_a_malformed_size_is_refused_in_one_line(size, problem):
    with pytest.raises(SpecError) as caught:
        build_text(SPEC.replace("SIZE", f"{{like: x, size: {size}}}"), "sized.yaml")
    (line,) = str(caught.value).splitlines()
    assert "sized.yaml:" in line and problem in line and "fix" in line, line
