"""``pipeline.build`` reads top to bottom: parse, expand, graph, derive, plan, render, write.

A spec is followed call by call (``sys.setprofile``) from ``pipeline.build``, and each call of a
module-level function of a staged module from another module is one move; a move into a module of an
earlier stage than the module it comes from is a climb. Methods (a ``Graph``'s ``symbols``, a
``Statement``'s ``__init__``, a rule's ``pullback``) are the data each stage hands on, not a stage, and
the shared libraries (``algebra``, ``printing``, ``errors``, ``rules`` and the call rule,
``rules.call``) serve every stage: neither is counted.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from symgrad.pipeline import build

ROOT = Path(__file__).resolve().parents[2]

STAGES = {
    "parse": ("spec", "names", "blocks"),
    "expand": ("expand",),
    "graph": ("graph", "shapes"),
    "derive": ("reverse", "tangent"),
    "plan": ("plan", "schedule", "roles", "testdata"),
    "render": ("emit", "render", "diagram", "mathml", "fingerprint"),
    "write": ("write",),
}
"""Each stage's modules (under ``symgrad.``), in the order a spec goes through them."""
SHARED = {("symgrad.graph", "sized")}
"""Module-level helpers every stage calls, as the shared libraries are: ``graph.sized`` reads a layer's
run-time sizes for whoever infers or computes it (the rules' shapes, the tests' reference values)."""

ORDER = {f"symgrad.{module}": index for index, modules in enumerate(STAGES.values()) for module in modules}


def stage_moves(spec: Path) -> list[tuple[str, str]]:
    """(module, function) of each move of ``build(spec)`` from one staged module's function to another's."""
    build(spec)  # every module imported and every cache warm: only the build itself is followed
    calls: list[tuple[str, str]] = []

    def follow(frame, event, argument):
        if event != "call":
            return
        module, name = frame.f_globals.get("__name__", ""), frame.f_code.co_qualname
        if module in ORDER and "." not in name and "<" not in name and (module, name) not in SHARED:
            caller = frame.f_back.f_globals.get("__name__") if frame.f_back is not None else None
            if caller != module:
                calls.append((module, name))

    sys.setprofile(follow)
    try:
        build(spec)
    finally:
        sys.setprofile(None)
    return [next(group) for _, group in itertools.groupby(calls, key=lambda call: call[0])]


def climbs(moves: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The moves into an earlier stage's module than the one before them."""
    return [
        (f"{before[0]}.{before[1]}", f"{after[0]}.{after[1]}")
        for before, after in zip(moves, moves[1:])
        if ORDER[after[0]] < ORDER[before[0]]
    ]


@pytest.mark.parametrize(
    "spec, most",
    [
        # with blocks: 17 before structure.py was split by stage (issue 36: at most 5); 5 since the derivation's
        # overview is drawn as the header is written (write -> diagram); 3 since issue 64's one walk graphs every
        # body, then derives every body, then plans every body (the layout rule's roles -> graph went with
        # Plan's dead fields); left: the derived names checked against the spec's, and the header's two
        ("unrolled_blocks.yaml", 3),
        ("seed3_conv_relu_conv.yaml", 4),  # without blocks, with the extras the spec asks for (derived, then planned)
        ("upsampling_decoder.yaml", 3),  # without blocks or extras
    ],
)
def test_a_build_climbs_back_to_an_earlier_stage_at_most_so_often(spec, most, monkeypatch):
    monkeypatch.chdir(ROOT)
    found = climbs(stage_moves(Path("examples") / spec))
    assert len(found) <= most, "\n".join(f"{before} -> {after}" for before, after in found)


def test_the_climb_count_sees_a_climb():
    moves = [
        ("symgrad.spec", "parse_spec"),
        ("symgrad.plan", "plan"),
        ("symgrad.graph", "build_graph"),
        ("symgrad.emit", "render"),
    ]
    assert climbs(moves) == [("symgrad.plan.plan", "symgrad.graph.build_graph")]
