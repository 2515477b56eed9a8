"""Bad specs: one line naming file:line:column, the problem and the fix; exit 2; no files written."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from symgrad.cli import main

GOOD = """\
name: good
inputs:
  x: {shape: [2, 3, 8, 8]}
  w: {shape: [4, 3, 3, 3]}
  y: {shape: [2, 4, 6, 6]}
layers:
  - {op: conv2d, weight: w, out: h}
  - {op: relu, out: a}
loss: {op: half_sq_error, target: y, reduction: sum}
wrt: [x, w]
"""


def variant(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


# (id, spec text, line, expected fragment of the message)
BAD = [
    ("malformed-yaml", variant("wrt: [x, w]", "wrt: [x, w"), 11, "malformed YAML"),
    ("duplicate-key", variant("wrt: [x, w]", "wrt: [x, w]\nwrt: [x]"), 11, "duplicate key 'wrt'"),
    ("unknown-top-key", variant("wrt: [x, w]", "wrt: [x, w]\nwrtt: [x]"), 11, "did you mean 'wrt'"),
    ("missing-wrt", variant("wrt: [x, w]\n", ""), 1, "missing required key 'wrt'"),
    ("empty", "", 1, "the spec is empty"),
    ("not-a-mapping", "- 1\n- 2\n", 1, "must be a YAML mapping"),
    (
        "alias",
        variant("x: {shape: [2, 3, 8, 8]}", "x: {shape: &s [2, 3, 8, 8]}\n  z: {shape: *s}"),
        3,
        "anchors and aliases",
    ),
    ("bad-name", variant("name: good", "name: 1bad"), 1, "must be an ASCII identifier"),
    (
        "slice-step-0",
        variant("  - {op: relu, out: a}", "  - {op: relu, out: a}\n  - {op: slice, dim: 2, step: 0}"),
        9,
        "'step' must be a positive int",
    ),
    (
        "slice-end-past-the-dim",
        variant("  - {op: relu, out: a}", "  - {op: relu, out: a}\n  - {op: slice, dim: 2, end: 9, step: 2}"),
        9,
        "ends past dim 2 (size 6)",
    ),
    (
        "amax-dim-out-of-range",
        variant("  - {op: relu, out: a}", "  - {op: relu, out: a}\n  - {op: amax, dim: [4]}"),
        9,
        "dim [4] is out of range for a 4-dim input",
    ),
    (
        "reshape-like-dims-out-of-range",
        variant(
            "  - {op: relu, out: a}",
            "  - {op: relu, out: a}\n  - {op: reshape, shape: [{like: a, dims: [2, 4]}, -1], out: r}",
        ).replace("y: {shape: [2, 4, 6, 6]}", "y: {shape: [36, 8]}"),
        9,
        "entry 0 is {like: a, dims: [2, 4]}, but 'a' has 4 dims",
    ),
    (
        "reshape-like-dims-not-ints",
        variant(
            "  - {op: relu, out: a}",
            "  - {op: relu, out: a}\n  - {op: reshape, shape: [{like: a, dims: 2}, -1], out: r}",
        ),
        9,
        "dims of {like: a} must be a list of ints",
    ),
    ("keyword-name", variant("name: good", "name: lambda"), 1, "Python keyword"),
    ("shadowing-module-name", variant("name: good", "name: os"), 1, "would shadow"),
    ("injection-name", variant("name: good", 'name: "x\\nimport os"'), 1, "must be an ASCII identifier"),
    (
        "reserved-tensor-name",
        variant("  x: {shape: [2, 3, 8, 8]}", "  F: {shape: [2, 3, 8, 8]}"),
        3,
        "generated module uses itself",
    ),
    ("reserved-prefix", variant("out: h}", "out: grad_h}"), 7, "prefix the generated code reserves"),
    ("shape-not-list", variant("x: {shape: [2, 3, 8, 8]}", "x: {shape: 5}"), 3, "must be a list of positive integers"),
    ("zero-size", variant("x: {shape: [2, 3, 8, 8]}", "x: {shape: [2, 0, 8, 8]}"), 3, "sizes must be between 1"),
    ("float-size", variant("x: {shape: [2, 3, 8, 8]}", "x: {shape: [2, 3.5, 8, 8]}"), 3, "non-integer size"),
    ("unknown-op", variant("op: relu", "op: rellu"), 8, "did you mean 'relu'"),
    ("unknown-argument", variant("out: h}", "strides: 2, out: h}"), 7, "did you mean 'stride'"),
    ("negative-stride", variant("out: h}", "stride: -1, out: h}"), 7, "below the smallest allowed value 1"),
    ("stride-wrong-length", variant("out: h}", "stride: [1, 2, 3], out: h}"), 7, "has 3 entries"),
    ("bool-as-int", variant("out: h}", "stride: true, out: h}"), 7, "must be an int"),
    (
        "unsupported-padding-string",
        variant("out: h}", "padding: full, out: h}"),
        7,
        "must be an int, a list of ints, 'valid' or 'same'",
    ),
    (
        "same-padding-with-stride",
        variant("out: h}", "padding: same, stride: 2, out: h}"),
        7,
        "padding='same' needs stride 1",
    ),
    (
        "channel-mismatch",
        variant("w: {shape: [4, 3, 3, 3]}", "w: {shape: [4, 5, 3, 3]}"),
        7,
        "input has 3 channels but weight expects 5",
    ),
    ("kernel-too-large", variant("w: {shape: [4, 3, 3, 3]}", "w: {shape: [4, 3, 9, 9]}"), 7, "does not fit"),
    (
        "ceil-pool-no-window",
        variant("out: h}", "out: h}\n  - {op: max_pool2d, kernel_size: 9, stride: 2, ceil_mode: true}"),
        8,
        "no window starts inside the input",
    ),
    ("target-shape-mismatch", variant("y: {shape: [2, 4, 6, 6]}", "y: {shape: [2, 4, 5, 6]}"), 9, "target has shape"),
    ("dangling-in", variant("op: relu, out: a", "op: relu, in: hh, out: a"), 8, "did you mean 'h'"),
    (
        "forward-reference",
        variant("op: conv2d, weight: w, out: h", "op: conv2d, in: a, weight: w, out: h"),
        7,
        "not defined before this point",
    ),
    ("duplicate-out", variant("out: a}", "out: h}"), 8, "already used"),
    ("wrt-unknown", variant("wrt: [x, w]", "wrt: [x, ww]"), 10, "did you mean 'w'"),
    (
        "wrt-not-influencing",
        variant("  y: {shape: [2, 4, 6, 6]}", "  y: {shape: [2, 4, 6, 6]}\n  u: {shape: [3]}").replace(
            "wrt: [x, w]", "wrt: [x, u]"
        ),
        11,
        "does not influence the loss",
    ),
    (
        "dead-layer",
        variant("out: a}", "out: a}\n  - {op: relu, in: h, out: b}\n  - {op: relu, in: a, out: c}"),
        9,
        "does not contribute to the loss",
    ),
    ("unknown-loss", variant("op: half_sq_error", "op: half_square_error"), 9, "unknown loss"),
    ("bad-reduction", variant("reduction: sum", "reduction: total"), 9, "must be one of sum, mean, per_sample"),
    ("missing-weight", variant("op: conv2d, weight: w, out: h", "op: conv2d, out: h"), 7, "needs 'weight'"),
    ("too-many-in", variant("op: relu, out: a", "op: relu, in: [h, x], out: a"), 8, "reads 1 tensor(s)"),
    ("weight-not-a-name", variant("weight: w,", "weight: 3,"), 7, "must be a node name"),
    ("nested-value", variant("out: h}", "padding: [[1]], out: h}"), 7, "unsupported value"),
    ("tab-indentation", variant("  x: {shape: [2, 3, 8, 8]}", "\tx: {shape: [2, 3, 8, 8]}"), 3, "malformed YAML"),
    ("unclosed-brace", variant("x: {shape: [2, 3, 8, 8]}", "x: {shape: [2, 3, 8, 8]"), 4, "malformed YAML"),
    ("name-too-long", variant("name: good", "name: " + "a" * 65), 1, "at most 64 characters"),
    ("unicode-name", variant("name: good", "name: gradé"), 1, "must be an ASCII identifier"),
    (
        "dunder-name",
        variant("  x: {shape: [2, 3, 8, 8]}", "  __import__: {shape: [2, 3, 8, 8]}"),
        3,
        "must be an ASCII identifier",
    ),
    ("jinja-expression-name", variant("name: good", 'name: "{{ 7 * 7 }}"'), 1, "must be an ASCII identifier"),
    ("jinja-statement-out", variant("out: h}", 'out: "{% import os %}"}'), 7, "must be an ASCII identifier"),
    ("quote-in-op", variant("op: relu", "op: 'relu\"'"), 8, "unknown op"),
    ("keyword-out", variant("out: a}", "out: class}"), 8, "Python keyword"),
    ("bool-out", variant("out: a}", "out: true}"), 8, "must be a name"),
    (
        "tensor-named-loss",
        variant("  y: {shape: [2, 4, 6, 6]}", "  loss: {shape: [2, 4, 6, 6]}").replace("target: y", "target: loss"),
        5,
        "generated module uses itself",
    ),
    (
        "inputs-empty",
        variant(
            "inputs:\n  x: {shape: [2, 3, 8, 8]}\n  w: {shape: [4, 3, 3, 3]}\n  y: {shape: [2, 4, 6, 6]}", "inputs: {}"
        ),
        2,
        "'inputs' is empty",
    ),
    ("input-not-mapping", variant("x: {shape: [2, 3, 8, 8]}", "x: [2, 3, 8, 8]"), 3, "must be a mapping like"),
    ("input-missing-shape", variant("x: {shape: [2, 3, 8, 8]}", "x: {}"), 3, "has no shape"),
    ("input-unknown-key", variant("x: {shape: [2, 3, 8, 8]}", "x: {shap: [2, 3, 8, 8]}"), 3, "did you mean 'shape'"),
    (
        "rank-too-high",
        variant("x: {shape: [2, 3, 8, 8]}", "x: {shape: [1, 1, 1, 1, 1, 1, 1, 1, 1]}"),
        3,
        "has 9 dimensions",
    ),
    ("negative-size", variant("x: {shape: [2, 3, 8, 8]}", "x: {shape: [2, -3, 8, 8]}"), 3, "sizes must be between 1"),
    (
        "huge-size",
        variant("x: {shape: [2, 3, 8, 8]}", "x: {shape: [2, 3, 8, 4294967296]}"),
        3,
        "sizes must be between 1",
    ),
    (
        "duplicate-input",
        variant("  w: {shape: [4, 3, 3, 3]}", "  w: {shape: [4, 3, 3, 3]}\n  w: {shape: [4, 3, 3, 3]}"),
        5,
        "duplicate key 'w'",
    ),
    (
        "non-string-key",
        variant("  w: {shape: [4, 3, 3, 3]}", "  w: {shape: [4, 3, 3, 3]}\n  [1]: {shape: [4]}"),
        5,
        "is not a string",
    ),
    (
        "number-key",
        variant("  w: {shape: [4, 3, 3, 3]}", "  w: {shape: [4, 3, 3, 3]}\n  1: {shape: [4]}"),
        5,
        "must be an ASCII identifier",
    ),
    ("loss-missing-target", variant("target: y, ", ""), 9, "loss has no 'target'"),
    (
        "loss-not-mapping",
        variant("loss: {op: half_sq_error, target: y, reduction: sum}", "loss: half_sq_error"),
        9,
        "'loss' must be",
    ),
    (
        "loss-unknown-key",
        variant("reduction: sum", "reduction: sum, weight: 2"),
        9,
        "half_sq_error has no argument 'weight'",
    ),
    ("wrt-empty", variant("wrt: [x, w]", "wrt: []"), 10, "'wrt' is empty"),
    ("wrt-duplicate", variant("wrt: [x, w]", "wrt: [x, x]"), 10, "names 'x' twice"),
    ("wrt-number", variant("wrt: [x, w]", "wrt: 3"), 10, "'wrt' must be a list"),
    ("wrt-item-not-name", variant("wrt: [x, w]", "wrt: [x, [w]]"), 10, "is not a name"),
    ("layer-not-mapping", variant("  - {op: relu, out: a}", "  - relu"), 8, "must be a mapping"),
    ("layer-missing-op", variant("{op: relu, out: a}", "{out: a}"), 8, "has no 'op'"),
    ("op-not-string", variant("op: relu", "op: 7"), 8, "'op' must be a name"),
    ("in-empty-list", variant("op: relu, out: a", "op: relu, in: [], out: a"), 8, "empty list"),
    ("in-entry-not-name", variant("op: relu, out: a", "op: relu, in: [1], out: a"), 8, "is not a node name"),
    (
        "constant-nan",
        variant("  - {op: relu, out: a}", "  - {op: relu, out: a}\n  - {op: mul, other: .nan, out: m}").replace(
            "target: y", "in: m, target: y"
        ),
        9,
        "must be finite",
    ),
    ("groups-not-dividing", variant("out: h}", "groups: 2, out: h}"), 7, "weight expects 3 x groups=2 = 6"),
    ("groups-zero", variant("out: h}", "groups: 0, out: h}"), 7, "must be a positive int"),
    ("conv-rank-mismatch", variant("op: conv2d", "op: conv1d"), 7, "input has 4 dimensions but conv1d needs 3"),
    (
        "pad-reflect-value",
        variant("out: h}", "out: h}\n  - {op: pad, pad: [1, 1, 1, 1], mode: reflect, value: 1.5}"),
        8,
        "mode 'reflect' takes no value",
    ),
    (
        "pad-mode-unknown",
        variant("out: h}", "out: h}\n  - {op: pad, pad: [1, 1, 1, 1], mode: wrap}"),
        8,
        "must be one of constant, reflect, replicate, circular",
    ),
    (
        "pad-reflect-negative",
        variant("out: h}", "out: h}\n  - {op: pad, pad: [-1, 1, 0, 0], mode: reflect}"),
        8,
        "mode 'reflect' with a negative pad is not supported",
    ),
    (
        "pad-reflect-too-wide",
        variant("out: h}", "out: h}\n  - {op: pad, pad: [6, 0, 0, 0], mode: reflect}"),
        8,
        "reflect padding 6 must be smaller than dim 3",
    ),
    (
        "pad-circular-wraps-twice",
        variant("out: h}", "out: h}\n  - {op: pad, pad: [0, 7, 0, 0], mode: circular}"),
        8,
        "circular padding 7 wraps around dim 3 more than once",
    ),
    (
        "pad-replicate-too-many-dims",
        variant("out: h}", "out: h}\n  - {op: pad, pad: [1, 1, 1, 1, 1, 1, 1, 1], mode: replicate}"),
        8,
        "4 padded dims of a 4-d input is not that",
    ),
    (
        "conv-padding-mode",
        variant("out: h}", "padding_mode: reflect, out: h}"),
        7,
        "conv2d has no argument 'padding_mode' (fix: torch.nn.functional's convolutions take no padding_mode; pad first",
    ),
    (
        "interpolate-mode-rank",
        variant("out: h}", "out: h}\n  - {op: interpolate, scale_factor: 2, mode: trilinear}"),
        8,
        "mode 'trilinear' needs a 5-d input, not 4-d",
    ),
    (
        "interpolate-size-and-scale",
        variant("out: h}", "out: h}\n  - {op: interpolate, size: 4, scale_factor: 2}"),
        8,
        "needs exactly one of size and scale_factor",
    ),
    (
        "interpolate-align-corners-nearest",
        variant("out: h}", "out: h}\n  - {op: interpolate, size: 4, align_corners: true}"),
        8,
        "align_corners only applies to linear, bilinear, bicubic and trilinear, not 'nearest'",
    ),
    (
        "interpolate-antialias-area",
        variant("out: h}", "out: h}\n  - {op: interpolate, size: 4, mode: area, antialias: true}"),
        8,
        "antialias only applies to bilinear and bicubic",
    ),
    (
        "interpolate-unknown-mode",
        variant("out: h}", "out: h}\n  - {op: interpolate, size: 4, mode: lanczos}"),
        8,
        "must be one of nearest, linear, bilinear, bicubic, trilinear, area, nearest-exact",
    ),
    (
        "interpolate-negative-scale",
        variant("out: h}", "out: h}\n  - {op: interpolate, scale_factor: -2}"),
        8,
        "must be a positive number or a list of them",
    ),
    (
        "adaptive-pool-output-size",
        variant("out: h}", "out: h}\n  - {op: adaptive_avg_pool2d, output_size: [2, 2, 2]}"),
        8,
        "must be a positive int or a list of 2",
    ),
    (
        "pad-reflect-one-dim-of-4d",
        variant("out: h}", "out: h}\n  - {op: pad, pad: [1, 1], mode: reflect}"),
        8,
        "1 padded dims of a 4-d input is not that",
    ),
    (
        "bias-wrong-shape",
        variant("  y: {shape: [2, 4, 6, 6]}", "  y: {shape: [2, 4, 6, 6]}\n  b: {shape: [5]}").replace(
            "weight: w,", "weight: w, bias: b,"
        ),
        8,
        "bias has 5 entries",
    ),
    (
        "broadcast-mismatch",
        variant("  - {op: relu, out: a}", "  - {op: relu, out: a}\n  - {op: add, in: [a, x], out: s}").replace(
            "target: y", "in: s, target: y"
        ),
        9,
        "do not broadcast",
    ),
    ("oversized-file", "# " + "x" * (1 << 20) + "\n" + GOOD, 1, "larger than the"),
    ("too-deep", "name: " + "[" * 40 + "]" * 40 + "\n", 1, "nested deeper than"),
    (
        "int64-in-wrt",
        variant("  y: {shape: [2, 4, 6, 6]}", "  y: {shape: [2, 4, 6, 6]}\n  t: {shape: [2], dtype: int64}").replace(
            "wrt: [x, w]", "wrt: [x, t]"
        ),
        11,
        "an int64 tensor of class indices",
    ),
    (
        "unknown-dtype",
        variant("x: {shape: [2, 3, 8, 8]}", "x: {shape: [2, 3, 8, 8], dtype: float16}"),
        3,
        "has dtype 'float16'",
    ),
    (
        "float-target-for-cross-entropy",
        variant("op: half_sq_error, target: y, reduction: sum", "op: cross_entropy, target: y, reduction: sum"),
        9,
        "needs class indices",
    ),
    (
        "layers-not-list",
        variant("layers:\n  - {op: conv2d, weight: w, out: h}\n  - {op: relu, out: a}", "layers: {op: relu}"),
        6,
        "must be a list of layers",
    ),
]


@pytest.mark.parametrize("text,line,fragment", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_spec_gives_one_clear_line_and_writes_nothing(tmp_path: Path, text, line, fragment):
    spec = tmp_path / "bad.yaml"
    spec.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["generate", str(spec), "-o", str(out)])
    assert result.exit_code == 2, result.output
    message = result.stderr.strip() if hasattr(result, "stderr") else result.output.strip()
    assert "\n" not in message and "Traceback" not in message, message
    assert message.startswith(f"{spec}:{line}:"), message
    assert fragment in message, message
    assert "(fix: " in message
    assert not out.exists() or not any(out.iterdir())


def test_good_spec_generates(tmp_path: Path):
    spec = tmp_path / "good.yaml"
    spec.write_text(GOOD, encoding="utf-8")
    result = CliRunner().invoke(main, ["generate", str(spec), "-o", str(tmp_path / "out"), "--verify"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "_symgrad_testdata.py",
        "good.html",
        "good.md",
        "good.py",
        "test_good.py",
    ]


def test_one_bad_spec_among_several_writes_nothing(tmp_path: Path):
    (tmp_path / "a_good.yaml").write_text(GOOD, encoding="utf-8")
    (tmp_path / "b_bad.yaml").write_text(variant("op: relu", "op: rellu"), encoding="utf-8")
    result = CliRunner().invoke(main, ["generate", str(tmp_path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert not (tmp_path / "out").exists()
