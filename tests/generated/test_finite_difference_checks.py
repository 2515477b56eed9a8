"""The generated file's finite-difference checks tell the code's faults from the point's: the test
shapes give every train-mode BatchNorm at least ``MIN_STATISTIC`` values (a network traced at batch 2
down to 1x1 maps normalises two: a step function, where timm's RegNet and LeViT failed gradcheck for
autograd's own derivatives alike), and where finite differences still disagree (a ReLU's kink within
the step) the explicit derivatives are compared with autograd's exactly, which a broken backward
fails."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from symgrad.graph import build_graph
from symgrad.pipeline import build_text
from symgrad.shapes import MIN_STATISTIC, small_shapes
from symgrad.spec import parse_spec
from symgrad.trace import LossChoice, trace


class DownToOnePixel(nn.Module):
    """Strided conv, BatchNorm, ReLU down to 1x1 maps, then a 1x1 conv and BatchNorm on them: at batch
    2 that BatchNorm normalises two values a channel (RegNet's last stage traced at 32x32)."""

    def __init__(self, width=4):
        super().__init__()
        layers, channels = [], 3
        for _ in range(3):
            layers += [nn.Conv2d(channels, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width),
                       nn.ReLU()]
            channels = width
        self.body = nn.Sequential(*layers, nn.Conv2d(width, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.fc = nn.Linear(width, 3)

    def forward(self, x):
        return self.fc(torch.flatten(self.body(x), 1))


def _statistics(graph, shapes) -> list[int]:
    resized = graph.with_input_shapes(shapes)
    sizes = [node.rule.elements_per_statistic({operand: resized.nodes[source].shape
                                                for operand, source in node.operands.items()}, node.params)
             for node in resized.nodes.values() if node.rule is not None]
    return [size for size in sizes if size is not None]  # the BatchNorms'


def test_a_batch_norm_over_two_values_at_the_spec_sees_eight_at_the_test_shapes():
    torch.manual_seed(0)
    text = trace(DownToOnePixel().double().train(), {"x": (2, 3, 8, 8)}, name="down",
                 loss=LossChoice("cross_entropy"), mode="train")
    graph = build_graph(parse_spec(text, "down.yaml"))
    assert min(_statistics(graph, {node.name: node.shape for node in graph.inputs})) == 2  # 8x8 -> 1x1, batch 2
    for shapes in small_shapes(graph):
        assert min(_statistics(graph, shapes)) >= MIN_STATISTIC, shapes


class Stem(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


SCALED = '''

_explicit_backward = ExplicitGradient.backward


def _scaled_backward(ctx, grad_loss):
    """Every explicit gradient 10% too large: the broken backward the generated tests must catch."""
    return tuple(None if grad is None else 1.1 * grad for grad in _explicit_backward(ctx, grad_loss))


ExplicitGradient.backward = staticmethod(_scaled_backward)
'''

def _coarse(monkeypatch) -> list[str]:
    """gradcheck and gradgradcheck with a step of 0.5, where finite differences of a nonlinear forward
    measure nothing (as across a kink); the list receives each one's name when it disagrees."""
    disagreed = []
    for name in ("gradcheck", "gradgradcheck"):
        def coarse(*arguments, _check=getattr(torch.autograd, name), _name=name, **options):
            try:
                return _check(*arguments, **{**options, "eps": 0.5})
            except Exception:
                disagreed.append(_name)
                raise
        monkeypatch.setattr(torch.autograd, name, coarse)
    return disagreed


def test_where_finite_differences_measure_nothing_the_exact_comparison_still_fails_a_broken_backward(
        tmp_path, monkeypatch):
    """With finite differences made meaningless, both checks fall back to autograd's derivatives at the
    same point: they pass the module as generated and fail it with its backward 10% off (as both runs of
    the drop-in test do, the second reading autograd's side from the first)."""
    from tests.helpers import run_generated_tests

    torch.manual_seed(0)
    text = trace(Stem().double().train(), {"x": (2, 3, 6, 6)}, name="stem", loss=LossChoice("cross_entropy"),
                 mode="train")
    files = build_text(text, "stem.yaml", documents=False).rendered.files
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    disagreed = _coarse(monkeypatch)
    clean = run_generated_tests(tmp_path / "test_stem.py")
    assert clean.ok, clean.report
    assert sorted(disagreed) == ["gradcheck", "gradgradcheck"], disagreed  # both took the exact comparison
    (tmp_path / "stem.py").write_text(files["stem.py"] + SCALED)
    broken = run_generated_tests(tmp_path / "test_stem.py")
    failures = "\n".join(broken.lines)
    for test, message in (
            ("test_gradcheck_of_the_explicit_backward",
             "finite differences disagree here; the explicit backward's gradients differ from autograd"),
            ("test_gradgradcheck_of_the_explicit_backward",
             "finite differences disagree here; the explicit second derivatives differ from autograd's")):
        assert f"{test} (call)" in failures and message in failures, failures
    for recompute in ("False", "True"):  # the second run compares with the first's autograd reference
        assert f"test_drop_in_backward_gives_autograds_grad[{recompute}] (call)" in failures, failures


def test_past_a_few_inputs_the_second_derivatives_are_compared_exactly_and_fail_a_broken_backward(tmp_path):
    """A network's gradgradcheck (over FINITE_DIFFERENCES_UP_TO differentiated inputs) compares the explicit
    second derivatives with autograd's directly: the file passes the module as generated and fails it with its
    backward 10% off (Stem's file, the threshold in the shared checking code beside it set to 0)."""
    from tests.helpers import run_generated_tests

    torch.manual_seed(0)
    text = trace(Stem().double().train(), {"x": (2, 3, 6, 6)}, name="stem", loss=LossChoice("cross_entropy"),
                 mode="train")
    files = build_text(text, "stem.yaml", documents=False).rendered.files
    assert "FINITE_DIFFERENCES_UP_TO = 12\n" in files["_symgrad_testdata.py"]  # the shared checking code's
    for name, content in files.items():
        (tmp_path / name).write_text(content.replace("FINITE_DIFFERENCES_UP_TO = 12\n", "FINITE_DIFFERENCES_UP_TO = 0\n"))
    clean = run_generated_tests(tmp_path / "test_stem.py")
    assert clean.ok, clean.report
    (tmp_path / "stem.py").write_text(files["stem.py"] + SCALED)
    failures = "\n".join(run_generated_tests(tmp_path / "test_stem.py").lines)
    assert "test_gradgradcheck_of_the_explicit_backward (call)" in failures, failures
    assert "AssertionError: the explicit second derivatives differ from autograd's" in failures, failures
