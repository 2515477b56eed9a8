"""Specs that end in outputs (``outputs:``): the format's errors, the generated module and its test,
and ``symgrad verify`` of it, which fails when a formula is broken."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from symgrad.check import module_from_source, verify
from symgrad.cli import main
from tests.helpers import build_text, run_generated_tests

SPEC = """\
name: two_heads
inputs:
  x: {shape: [2, 3, 8, 8]}
  w1: {shape: [4, 3, 3, 3]}
  w2: {shape: [5, 4, 3, 3]}
layers:
  - {op: conv2d, weight: w1, padding: 1, out: h}
  - {op: relu, out: r}
  - {op: dropout, p: 0.3, noise: channel, out: d}
  - {op: conv2d, weight: w2, padding: 1, out: o}
outputs: {out: o, features: r}
wrt: [x, w1, w2]
"""


def variant(old: str, new: str) -> str:
    assert old in SPEC, old
    return SPEC.replace(old, new, 1)


BAD = [
    (
        "loss-and-outputs",
        variant("wrt:", "loss: {op: half_sq_error, in: o, target: x}\nwrt:"),
        1,
        "both 'loss' and 'outputs'",
    ),
    ("neither", variant("outputs: {out: o, features: r}\n", ""), 1, "either 'loss' or 'outputs'"),
    ("unknown-node", variant("features: r}", "features: rr}"), 11, "'rr' is not defined"),
    ("not-a-name", variant("outputs: {out: o, features: r}", "outputs: [o, 3]"), 11, "is not a node name"),
    (
        "eval-with-loss",
        variant("outputs: {out: o, features: r}", "loss: {op: half_sq_error, in: o, target: o}\neval: other"),
        12,
        "'eval' is for a spec that ends in outputs",
    ),
    ("extras", variant("wrt: [x, w1, w2]", "wrt: [x, w1, w2]\nextras: [hvp]"), 11, "extras (hvp)"),
]


@pytest.mark.parametrize("text, line, fragment", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_a_bad_outputs_spec_gives_one_line(tmp_path: Path, text, line, fragment):
    spec = tmp_path / "bad.yaml"
    spec.write_text(text)
    result = CliRunner().invoke(main, ["generate", str(spec), "-o", str(tmp_path / "out")])
    message = result.output.strip()
    assert result.exit_code == 2 and "\n" not in message and message.startswith(f"{spec}:{line}:"), message
    assert fragment in message and "(fix: " in message, message


def test_the_generated_module_returns_the_outputs_and_its_own_test_passes(tmp_path: Path):
    built = build_text(SPEC, "two_heads.yaml")
    for name, content in built.rendered.files.items():
        (tmp_path / name).write_text(content)
    module = module_from_source(built.rendered.files["two_heads.py"], "two_heads")
    assert module.OUTPUTS == ("out", "features") and module.OUTPUTS_KIND == "dict"
    out, features = module.forward(torch.randn(2, 3, 6, 5), torch.randn(4, 3, 3, 3), torch.randn(5, 4, 3, 3))
    assert out.shape == (2, 5, 6, 5) and features.shape == (2, 4, 6, 5)
    outcomes = run_generated_tests(tmp_path / "test_two_heads.py")
    assert outcomes.ok, outcomes.report


def test_verify_checks_the_outputs_backward_and_catches_a_broken_one():
    built = build_text(SPEC, "two_heads.yaml")
    source = built.rendered.files["two_heads.py"]
    report = verify(built.graph, module_from_source(source, "two_heads"), built.shapes)
    assert report.problem is None and max(report.gradient_errors.values()) <= 1e-12
    assert "grad_outputs[1]" in source  # the features' cotangent reaches r: dropped, the check must fail
    broken = module_from_source(source.replace("grad_outputs[1]", "0 * grad_outputs[1]"), "two_heads_broken")
    report = verify(built.graph, broken, built.shapes)
    assert max(report.gradient_errors.values()) > 1e-3


MODEL = """\
import torch
from torch import nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)
        self.aux = nn.Linear(8, 5)

    def forward(self, x):
        features = F.relu(self.bn(self.conv(x))).mean((2, 3))
        if self.training:
            return self.fc(features), self.aux(features)
        return self.fc(features)
"""


def test_trace_without_a_loss_writes_both_modes_beside_each_other(tmp_path: Path):
    import symgrad
    from symgrad.trace import load_target

    (tmp_path / "net.py").write_text(MODEL)
    runner = CliRunner()
    result = runner.invoke(main, ["trace", f"{tmp_path / 'net.py'}:Net", "--input", "x=2,3,8,8"])
    assert result.exit_code == 2 and "pass -o FILE.yaml" in result.output and "\n" not in result.output.strip()
    spec = tmp_path / "net.yaml"
    result = runner.invoke(
        main, ["trace", f"{tmp_path / 'net.py'}:Net", "--input", "x=2,3,8,8", "--wrt", "parameters", "-o", str(spec)]
    )
    assert result.exit_code == 0, result.output
    text = spec.read_text()  # the outputs, wrt, then the model's fingerprint, and the eval module last
    assert (
        "outputs: [fc, aux]\nwrt: [conv_weight, bn_weight, bn_bias, fc_weight, fc_bias, aux_weight, aux_bias]\n" in text
    )
    assert "\nfingerprint:" in text and text.endswith("\neval: net_gradients_eval\n")
    assert "outputs: fc\n" in (tmp_path / "net_eval.yaml").read_text()
    result = runner.invoke(main, ["generate", str(spec), str(tmp_path / "net_eval.yaml"), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    model = load_target(f"{tmp_path / 'net.py'}:Net")
    fast = symgrad.bind(tmp_path / "out" / "net_gradients.py", model)
    logits, aux = fast(torch.randn(3, 3, 5, 7))
    model.eval()
    assert fast(torch.randn(3, 3, 5, 7)).shape == (3, 5)
