"""``symgrad trace --explain NAME``: how a call becomes a layer, read from the walk's own tables."""

from pathlib import Path

from click.testing import CliRunner

from symgrad.cli_trace import trace_command
from symgrad.trace.layers import PRE_CHECKS

ROOT = Path(__file__).resolve().parents[2]


def explained(name: str) -> str:
    result = CliRunner().invoke(trace_command, ["--explain", name])
    assert result.exit_code == 0, result.output
    return result.output


def test_explain_prints_the_pre_checks_the_handler_the_op_and_the_rule_file_without_a_target():
    text = explained("F.conv2d")
    assert text.startswith("F.conv2d: recorded as 'conv2d'\n")
    labels = [line.split(". ", 1)[1].split(":")[0] for line in text.splitlines() if line.startswith("  ")]
    assert labels == [label for label, _ in PRE_CHECKS]
    assert "arguments bound as (input, weight, bias, stride, padding, dilation, groups)" in text
    assert "hook: none; the general layer" in text
    assert text.rstrip().endswith("layer: op 'conv2d', rule Convolution in symgrad/rules/conv.py")
    for where in [word.strip("():,") for word in text.split() if ".py:" in word]:  # each place names a definition
        path, line = where.rsplit(":", 1)
        assert (ROOT / path).read_text().splitlines()[int(line) - 1].lstrip().startswith(("def ", "@")), where


def test_explain_names_the_hook_the_handler_the_loss_or_the_refusal():
    assert "hook: symgrad.trace.op_hooks.avg_pool (symgrad/trace/op_hooks.py:" in explained("F.avg_pool2d")
    assert "table: symgrad.trace.views.reshape (symgrad/trace/views.py:" in explained("x.view")
    assert "layer: the spec's loss, op 'cross_entropy'" in explained("F.cross_entropy")
    assert "layer: op 'add'" in explained("x.add_")
    refused = explained("x.detach")
    assert "table: no entry; refused as unknown" in refused and "(fix: a stop-gradient is not expressed" in refused
