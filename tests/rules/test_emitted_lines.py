"""Expect-tests of the lines each rule emits: one small readable file per rule.

For every rule in the registry (so a new rule is covered without an edit here), a sample that uses it
(of every rule's ``SAMPLES``, the one with the fewest other ops, its own first) is built through the pipeline,
and the statements of the readable derivation and of the fused one (what ``gradients`` runs) are
printed with ``symgrad.printing.to_code`` and compared to ``tests/rules/expected/emitted/<op>.txt``.

A mismatch fails with a unified diff naming the op. When the change is intended, rewrite the files and
review the diff in git::

    SYMGRAD_UPDATE_EXPECTED=1 .venv/bin/python -m pytest -q tests/rules/test_emitted_lines.py
"""

from __future__ import annotations

import difflib
import functools
import os
from pathlib import Path

import pytest
import yaml

from symgrad.printing import to_code
from symgrad.reverse import Statement, derive
from symgrad.rules import all_rules
from tests.helpers import build_text
from tests.rules.samples import CASES, OWNERS

EXPECTED = Path(__file__).resolve().parent / "expected" / "emitted"
UPDATE = os.environ.get("SYMGRAD_UPDATE_EXPECTED") == "1"
OPS = [rule.op for rule in all_rules()]


@functools.lru_cache(maxsize=None)  # each case is read once, not once per rule
def _ops_of(text: str) -> tuple[str, ...]:
    document = yaml.safe_load(text)
    return (*(layer["op"] for layer in document["layers"]), document["loss"]["op"])


def case_for(op: str):
    """The sample that uses ``op`` with the fewest other ops (the op's own first, then the first in the
    registry's order), or None."""
    using = [
        (len(set(_ops_of(case.values[0]))), OWNERS[case.id].op != op, index, case)
        for index, case in enumerate(CASES)
        if op in _ops_of(case.values[0])
    ]
    return min(using, key=lambda item: item[:3])[3] if using else None


def _lines(statements: list[Statement]) -> list[str]:
    return [f"{statement.target} = {to_code(statement.value)}    # [{statement.node}]" for statement in statements]


def emitted(op: str) -> str:
    case = case_for(op)
    if case is None:
        pytest.fail(f"rule {op} has no sample: declare one in SAMPLES in its rule file (docs/adding-an-op.md, step 2)")
    text = case.values[0]
    built = build_text(text)
    fused = derive(built.graph, fused=True)  # what the generated `gradients` runs
    document = yaml.safe_load(text)
    spec = (
        yaml.safe_dump(
            {key: document[key] for key in ("layers", "loss")}, sort_keys=False, default_flow_style=None, width=120
        )
        .rstrip()
        .splitlines()
    )
    module = type(OWNERS[case.id]).__module__.replace(".", "/")
    out = [
        f"# {op}: emitted lines of sample {case.id!r} ({module}.py SAMPLES); '# [node]' names the forward node",
        "# rewrite: SYMGRAD_UPDATE_EXPECTED=1 .venv/bin/python -m pytest -q tests/rules/test_emitted_lines.py",
        "",
        "## spec",
        *spec,
        "",
        "## forward",
        *_lines(built.program.forward),
    ]
    fused_forward = _lines(fused.forward)
    if fused_forward != _lines(built.program.forward):
        out += ["", "## forward (fused)", *fused_forward]
    out += [
        "",
        "## backward (readable)",
        *_lines(built.program.backward),
        "",
        "## backward (fused)",
        *_lines(fused.backward),
    ]
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("op", OPS)
def test_emitted_lines_match_the_expectation(op):
    actual = emitted(op)
    path = EXPECTED / f"{op}.txt"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != actual:
            path.write_text(actual)
        return
    if not path.exists():
        pytest.fail(
            f"rule {op}: no expectation file {path.relative_to(EXPECTED.parents[3])}; write it with "
            "SYMGRAD_UPDATE_EXPECTED=1 .venv/bin/python -m pytest tests/rules/test_emitted_lines.py and review it"
        )
    expected = path.read_text()
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                f"tests/rules/expected/emitted/{op}.txt (expected)",
                f"{op} (emitted now)",
            )
        )
        pytest.fail(
            f"rule {op}: its emitted lines changed (if intended: SYMGRAD_UPDATE_EXPECTED=1 "
            f".venv/bin/python -m pytest tests/rules/test_emitted_lines.py, then review the diff)\n{diff}",
            pytrace=False,
        )


def test_no_expectation_file_is_left_over_from_a_removed_rule():
    stale = sorted(path.name for path in EXPECTED.glob("*.txt") if path.stem not in OPS)
    if UPDATE:
        for name in stale:
            (EXPECTED / name).unlink()
        return
    assert not stale, f"expectation files of no rule (delete them, or run with SYMGRAD_UPDATE_EXPECTED=1): {stale}"


def test_a_rule_without_a_case_is_named():
    assert case_for("softsign") is None  # a rule with no sample: its test fails with the line below
    with pytest.raises(
        pytest.fail.Exception, match="rule softsign has no sample: declare one in SAMPLES in its rule file"
    ):
        emitted("softsign")
