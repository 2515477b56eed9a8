"""The generated test file (``test_<name>.py``) as a model: one frozen dataclass a section of
``templates/test_module.py.jinja`` (:class:`TestFile`), built from the facts planning decided
(:func:`symgrad.roles.test_facts`) with every decision made here: the input table's rows, the
constants' statements, which helpers take the outputs' form and which tests the file has. The
templates (``templates/test_module/*.jinja``, a macro each) only print them."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass

from jinja2.utils import htmlsafe_json_dumps

from .printing import entry


@dataclass(frozen=True)
class Loading:
    """The file's docstring and how it loads the module beside it."""

    name: str
    """The module's name: ``<name>.py``, loaded by path."""


@dataclass(frozen=True)
class ZeroGradient:
    name: str
    """The input's name as a JSON string."""
    why: str


@dataclass(frozen=True)
class Tables:
    """The constants the tests read: one row per input (merged), the shapes, the memory, the layout,
    the gradients zero by structure, the class counts and the reference values."""

    input_rows: tuple[str, ...]
    """``key: (flags, role, shapes...),``: see :func:`_input_rows`."""
    renamed: str
    """RENAMED's value: a parameter's name where it is not its key with ``_`` for ``.``."""
    small_end: int
    """The end of a row's small shape sets (3 + their count): SMALL_SHAPES' range."""
    spec_entries: int
    channels_last: str
    """The CHANNELS_LAST statement."""
    zero_by_structure: tuple[ZeroGradient, ...]
    classes: str
    """CLASSES' value ({input: [its class count at each small shape set, then at the spec's]}); empty: no
    int64 input holds class indices."""
    reference_sums: str
    """The REFERENCE_SUMS statement."""


@dataclass(frozen=True)
class Helpers:
    """The shared checking code loaded from beside the file, and the helpers the tests call, in the
    loss's form or the outputs' form."""

    shared_tests: str
    """The shared file's name (``_symgrad_testdata.py``)."""
    shared_names: str
    """The target of ``= testdata.SHARED``: its names unpacked, wrapped within 100 columns."""
    classes: bool
    """inputs_for draws class indices below CLASSES' counts."""
    outputs: bool
    """The spec ends in outputs: cotangents of each output, not of the loss."""


@dataclass(frozen=True)
class Checks:
    """The tests every file has, and those that depend on the spec."""

    shortfall: str
    """The float32 test's ``shortfall = memory_shortfall(...)`` statement (as ``symgrad verify`` refuses)."""
    outputs: bool
    """No summed-loss default test and no gradgradcheck (the outputs form)."""
    zero_by_structure: bool
    float32: bool
    """The float32 test at the spec's shapes (not where the forward draws random numbers)."""


@dataclass(frozen=True)
class PerSampleTest:
    parameters: str
    """The ``parameters = [...]`` statement: the parameters ``per_sample_gradients`` returns."""
    batched: str
    """The ``batched = [...]`` statement: the inputs that carry the batch axis."""


@dataclass(frozen=True)
class Extras:
    """The extras' tests: ``hvp`` and ``per_sample_gradients``, where the module has them."""

    hvp: bool
    per_sample: PerSampleTest | None


@dataclass(frozen=True)
class TestFile:
    """The test file, section by section, in the order it reads."""

    __test__ = False  # not a pytest class

    loading: Loading
    tables: Tables
    helpers: Helpers
    checks: Checks
    extras: Extras


def _json(value) -> str:
    """``value`` as Jinja's ``tojson`` writes it (keys sorted, HTML-safe), as the file always showed it."""
    return str(htmlsafe_json_dumps(value, sort_keys=True))


def test_file(
    facts: dict,
    params: dict[str, str],
    shared_tests: str,
    shared_names: tuple[str, ...],
    hvp: bool = False,
    per_sample: tuple[list[str], list[str]] | None = None,
) -> TestFile:
    """The :class:`TestFile` of a module, from the ``facts`` its planning decided; ``params``: the
    inputs the module takes in its ``params`` mapping, each to its key there; ``per_sample``: the
    parameters and the batched inputs of ``per_sample_gradients``."""
    classes: dict[str, list] = {}
    for _, counts in facts["classes"]:  # [small shape sets..., the spec's shapes], as class_table lists them
        for name, count in counts.items():
            classes.setdefault(name, []).append(count)
    renamed = {key: name for name, key in params.items() if key.replace(".", "_") != name}
    tables = Tables(
        input_rows=tuple(_input_rows(facts, params)),
        renamed=json.dumps(renamed),
        small_end=len(facts["small_shapes"]) + 3,
        spec_entries=facts["spec_entries"],
        channels_last="CHANNELS_LAST = " + _json(facts["channels_last_at_spec"]),
        zero_by_structure=tuple(ZeroGradient(_json(name), why) for name, why in facts["zero_by_structure"].items()),
        classes=json.dumps(classes) if facts["classes"] else "",
        reference_sums=f"REFERENCE_SUMS = {facts['reference_sums']}",
    )
    helpers = Helpers(shared_tests, _unpacked(shared_names), bool(facts["classes"]), facts["outputs"])
    shortfall = f'shortfall = memory_shortfall("{facts["name"]}", "the float32 shapes", SPEC_ENTRIES, 8)'
    checks = Checks(shortfall, facts["outputs"], bool(facts["zero_by_structure"]), not facts["random"])
    sample = (
        PerSampleTest("parameters = " + _json(per_sample[0]), "batched = " + _json(per_sample[1]))
        if per_sample is not None
        else None
    )
    return TestFile(Loading(facts["name"]), tables, helpers, checks, Extras(hvp, sample))


def _unpacked(names: tuple[str, ...]) -> str:
    """``(a, b, ...)`` wrapped within 100 columns, the target of the test file's unpacking of ``SHARED``."""
    return "\n".join(
        textwrap.wrap("(" + ", ".join(names) + ")", 100 - len(" = testdata.SHARED"), subsequent_indent=" ")
    )


def _input_rows(facts: dict, params: dict[str, str]) -> list[str]:
    """The test file's table, one row per input, merged: keyed by its ``params`` key (else by its
    name), what the module does with it (``params``: taken in the mapping; ``wrt``: differentiated;
    ``moved``: moved in place by the forward), its role, its shape at the spec and at each small shape
    set. Rows in the spec's order, the differentiated ones in ``wrt``'s (the file reads WRT off the
    table); the tests draw the inputs in the order of their names (make_inputs)."""
    small = facts["small_shapes"]
    rows = []
    order = iter(facts["wrt"])
    for name in [next(order) if name in facts["wrt"] else name for name in facts["spec_shapes"]]:
        flags = " ".join(
            flag
            for flag, present in (
                ("params", name in params),
                ("wrt", name in facts["wrt"]),
                ("moved", name in facts["moved"]),
            )
            if present
        )
        role = facts["roles"].get(name, ["data", 1.0, []])
        # a role alone where its gain is 1 and its fan-in axes are none, or all but the first for a
        # weight; with its fan-in axes where its gain is 1 (ROLES in the file reads them back)
        alone = not role[2] or (role[0] == "weight" and role[2] == list(range(1, len(facts["spec_shapes"][name]))))
        role = json.dumps(role if role[1] != 1.0 else role[0] if alone else [role[0], role[2]])
        shapes = [list(facts["spec_shapes"][name]), *(list(shape_set[name]) for shape_set in small)]
        rows.append(
            entry(
                params.get(name, name),
                "(" + ", ".join([json.dumps(flags), role, *map(json.dumps, shapes)]) + ")",
                indent=4,
            )
        )
    return rows
