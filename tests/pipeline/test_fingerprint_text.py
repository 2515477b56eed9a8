"""FINGERPRINT as the generated module writes it (symgrad/fingerprint_text.py): each distinct row once, a
block's submodules once for all its instances (with the numbers of an instance whose rows differ: a
drop-path rate), a repeated subtree without instances once; bind's symgrad.fingerprint.unfolded gives back
the same table, in the model's order, a list of its own per path."""

from __future__ import annotations

import pytest

from symgrad.fingerprint import unfolded
from symgrad.fingerprint_text import _fingerprint_literal


def _row(kind: str, hyper: str = "44136fa3") -> list:
    return [kind, None, hyper, "44136fa3", None, 0]


def test_a_blocks_rows_are_written_once_and_give_back_the_table_in_order():
    table = {"": ["Net", "0123456789abcdef", "44136fa3", "44136fa3", None, 0], "stage": _row("Sequential")}
    for index, rate in enumerate(["00000000", "11111111", "22222222"]):  # a rate per instance
        table |= {f"stage.{index}": _row("Block"), f"stage.{index}.conv": _row("Conv2d", "c0c0c0c0")}
        table |= {f"stage.{index}.drop": _row("DropPath", "00000000" if index < 2 else rate)}
    for index in range(2):  # a repeated subtree that is no block's instance
        table |= {f"downs.{index}": _row("Sequential"), f"downs.{index}.0": _row("LayerNorm", "abababab")}
    table["head"] = _row("Linear")
    text = _fingerprint_literal(table, {f"stage.{index}": "block" for index in range(3)})
    assert '"stage.0": "block", "stage.1": "block"' in text and '"stage.2": ("block", [' in text
    assert '"downs.0": "Sequential"' in text and '"stage.1.conv"' not in text and '"downs.1.0"' not in text
    assert text.count('["Conv2d"') == 1 and max(map(len, text.splitlines())) <= 100
    namespace: dict = {}
    exec(compile(text, "fingerprint", "exec"), namespace)
    table_again = unfolded(namespace["FINGERPRINT"])
    assert table_again == table and list(table_again) == list(table)
    assert table_again["stage.0.conv"] is not table_again["stage.1.conv"]  # bind may change one without the other


def test_an_instances_own_numbers_wrap_within_100_columns_and_give_back_the_table():
    """A long path whose instance has numbers of its own (smp's EfficientNet encoders wrote 102-107
    columns there) is wrapped: the path and its block on one line, its numbers on the next."""
    table = {"": _row("Net"), "encoder.inverted_residual_blocks": _row("Sequential")}
    for index, rate in enumerate(["00000000", "00000000", "22222222"]):
        prefix = f"encoder.inverted_residual_blocks.{index}"
        table[prefix] = _row("Block")
        for child in range(16):
            table[f"{prefix}.layer{child}"] = _row(f"Kind{child}", rate if child == 15 else "c0c0c0c0")
    instances = {f"encoder.inverted_residual_blocks.{index}": "inverted_residual" for index in range(3)}
    text = _fingerprint_literal(table, instances)
    assert '"encoder.inverted_residual_blocks.2": ("inverted_residual", [\n' in text
    assert max(map(len, text.splitlines())) <= 100
    namespace: dict = {}
    exec(compile(text, "fingerprint", "exec"), namespace)
    assert unfolded(namespace["FINGERPRINT"]) == table and list(unfolded(namespace["FINGERPRINT"])) == list(table)


def test_a_rows_tail_of_defaults_is_left_out_and_rows_share_lines():
    """A row written without what unfolded puts back (no code, no hypers, no tensors, no mode, no BatchNorm
    run), several rows to a line with their numbers; a BatchNorm's row, whose tail is not the default, whole."""
    table = {"": ["Net", "0123456789abcdef", "44136fa3", "44136fa3", None, 0], "relu": _row("ReLU")}
    table |= {f"conv{index}": _row("Conv2d", f"{index:08d}") for index in range(6)}
    table["bn"] = ["BatchNorm2d", None, "d0c7b5ed", "7f95d0d9", True, 1]
    text = _fingerprint_literal(table | {"relu2": _row("ReLU")}, {})
    rows = text.split("FINGERPRINT = ([\n", 1)[1].split("\n], {", 1)[0].splitlines()
    assert '["ReLU"],' in text and '["Net", "0123456789abcdef"],' in text
    assert '["BatchNorm2d", None, "d0c7b5ed", "7f95d0d9", True, 1]' in text
    assert len(rows) < len(table) / 2 and rows[0].endswith("# 0-2") and max(map(len, text.splitlines())) <= 100
    namespace: dict = {}
    exec(compile(text, "fingerprint", "exec"), namespace)
    assert unfolded(namespace["FINGERPRINT"]) == table | {"relu2": _row("ReLU")}


def test_the_tail_left_out_is_the_tail_the_module_puts_back(monkeypatch):
    """The writer's defaults and bind's unfolded's must agree: text made with other defaults is refused
    where it is written, not unfolded wrong by bind."""
    import symgrad.fingerprint_text as fingerprint_text

    table = {"": ["Net", "0123456789abcdef", "44136fa3", "44136fa3", None, 0], "a": _row("ReLU"), "b": _row("ReLU")}
    assert _fingerprint_literal(table, {})
    monkeypatch.setattr(fingerprint_text, "ROW_DEFAULTS", (None, None, "44136fa3", "44136fa3", None, 1))
    table = {key: row[:5] + [1] for key, row in table.items()}  # every row ends with the other default
    with pytest.raises(AssertionError, match="do not give its table back"):
        _fingerprint_literal(table, {})


def test_a_long_groups_lines_stay_within_100_columns_where_its_last_pair_ends_at_the_edge():
    """A group written over several lines ends in ``},``: its last pair was let onto a line three columns short of
    the edge, so a line of 101 columns came out (the blocks form of smp's Linknet with an EfficientNet encoder,
    ``"conv_pwl": 7, "bn3": 3},``). Every width of the last path, each line <= 100."""
    from symgrad.fingerprint_text import _group_text

    for width in range(1, 76):  # a pair that fits a line alone
        group = {f"conv_{index}.weight": index for index in range(5)} | {"b" * width: 3}
        lines = _group_text("block", group).splitlines()
        assert len(lines) > 1 and max(map(len, lines)) <= 100, (width, lines)
