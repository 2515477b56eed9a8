"""A hand-written block with an optional branch (``optional:``, docs/spec.md; issue 64 item 5): instances
with and without it, bound by literal mappings (an instance without the branch binds none of its
parameters), one pair of functions with the branch under ``if down:``, gradients equal to the flat
module's and autograd's; and the spec's refusals, one line at the line that is wrong."""

from __future__ import annotations

import pytest

from symgrad.errors import SpecError
from symgrad.pipeline import build_text
from tests.pipeline.test_blocks import _agrees_with_flat_and_autograd

BRANCHED = """name: branched
inputs:
  x: {shape: [2, 3, 8, 8]}
  w1: {shape: [3, 3, 3, 3]}
  w2: {shape: [4, 3, 3, 3]}
  d2: {shape: [4, 3, 1, 1]}
  w3: {shape: [4, 4, 3, 3]}
  t: {shape: [2, 4, 4, 4]}
blocks:
  basic:
    inputs: [h]
    params: [w, dw]
    hyper: {stride: 1, down: false}
    optional: {down: {nodes: [d], absent: h}}
    layers:
      - {op: conv2d, in: h, weight: w, stride: stride, padding: 1, out: c}
      - {op: conv2d, in: h, weight: dw, stride: stride, out: d}
      - {op: add, in: [c, d], out: s}
      - {op: relu, out: r}
layers:
  - {block: basic, in: x, params: {w: w1}, out: a}
  - {block: basic, in: a, params: {w: w2, dw: d2}, hyper: {stride: 2, down: true}, out: b}
  - {block: basic, in: b, params: {w: w3}, out: e}
loss: {op: mse_loss, target: t}
wrt: [x, w1, w2, d2, w3]
"""


def test_a_block_with_an_optional_branch_is_one_pair_of_functions_equal_to_autograd():
    source = _agrees_with_flat_and_autograd(BRANCHED, "branched.yaml")
    assert "def basic_forward(h, p, stride=1, down=False, save=False):" in source, source
    assert (
        'basic_forward(x, {"w": w1})' in source
        and 'basic_forward(a, {"w": w2, "dw": d2}, stride=2, down=True)' in source
    )
    forward = source.split("def basic_forward(", 1)[1].split("\ndef ", 1)[0]
    assert "    if down:\n" in forward and "    else:\n" in forward, forward
    assert source.count("def basic_backward(") == 1


def test_a_value_only_the_instances_without_the_branch_save_is_none_in_the_others():
    # without the branch the product reads c (made before it) where the others read d: only they save c
    layers = (
        "      - {op: conv2d, in: h, weight: dw, stride: stride, out: d}\n"
        "      - {op: add, in: [c, d], out: s}\n      - {op: relu, out: r}\n"
    )
    product = (
        "      - {op: relu, in: c, out: rc}\n      - {op: conv2d, in: h, weight: dw, stride: stride, out: d}\n"
        "      - {op: mul, in: [rc, d], out: s}\n"
    )
    assert layers in BRANCHED
    text = BRANCHED.replace(layers, product).replace("absent: h}", "absent: c}")
    source = _agrees_with_flat_and_autograd(text, "product.yaml")
    assert "c if not down else None" in source, source


@pytest.mark.parametrize(
    "old, new, message, line",
    [
        ("    optional: {down: {nodes: [d], absent: h}}\n", "", "has a bool hyper but no `optional:` branch", 13),
        ("absent: h}", "absent: s}", "optional branch 'down' names 's'", 14),
        ("hyper: {stride: 2, down: true}", "hyper: {stride: 2, down: 1}", "hyper 'down' must be true or false", 22),
    ],
    ids=["no-branch", "absent-after", "not-a-bool"],
)
def test_an_optional_branch_the_spec_cannot_hold_is_refused_at_its_line(old, new, message, line):
    assert old in BRANCHED
    with pytest.raises(SpecError, match=message) as refused:
        build_text(BRANCHED.replace(old, new), "branched.yaml")
    assert refused.value.location.line == line and "\n" not in str(refused.value)
