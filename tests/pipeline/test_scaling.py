"""Generation is linear in depth (issue 26): counted work, not wall time, so a loaded machine cannot
make it flaky. The timings themselves are ``python -m benchmarks.generation --depth`` (BENCHMARKS.md)."""

from __future__ import annotations

import cProfile
import math
import pstats

import pytest
import sympy

from benchmarks.generation import chain_spec
from symgrad import diagram, shapes
from symgrad.graph import build_graph
from symgrad.pipeline import build_text
from symgrad.spec import parse_spec

from .test_documents import _crosses, unet_spec


def _calls(pairs: int) -> int:
    """Python function calls made generating a chain of ``pairs`` conv -> ReLU pairs (2 channels)."""
    text = chain_spec(pairs, channels=2, batch=2, size=8)
    sympy.core.cache.clear_cache()  # the same cache state for every size
    profile = cProfile.Profile()
    profile.enable()
    build_text(text)
    profile.disable()
    return pstats.Stats(profile).total_calls


@pytest.mark.slow  # builds 50-, 100- and 200-pair chains; CI runs it
def test_generation_work_grows_linearly_with_depth():
    """The work added by going from 200 to 400 layers is at most about twice that from 100 to 200 (a
    quadratic step makes it four times: before the fix the ratio was 3.1). It may be less: the test-shape
    solver's rounds do not grow with the chain (1.4 measured when sizes read at run time came in)."""
    small, medium, large = (_calls(pairs) for pairs in (50, 100, 200))
    ratio = (large - medium) / (medium - small)
    assert 1.0 < ratio < 2.5, (small, medium, large, ratio)


def _residual_chain(pairs: int) -> str:
    """A chain whose end is added to its input: the equality ties the input's size to the whole chain's."""
    text = chain_spec(pairs, channels=2, batch=2, size=8).replace(
        "loss:", "- op: add\n  in: [r%d, x]\n  out: skip\nloss:" % (pairs - 1), 1
    )
    return text


@pytest.mark.parametrize(
    "text",
    [unet_spec(), _residual_chain(30), chain_spec(30, channels=2, batch=2, size=8)],
    ids=["unet", "residual-chain", "chain"],
)
def test_abbreviated_sizes_give_the_same_test_shapes(text, monkeypatch):
    """Sizes named by fresh symbols and written out where an equality reads them solve to the same
    test shapes as sizes built out in full."""
    graph = build_graph(parse_spec(text, "spec.yaml"))
    found = {}
    for limit in (10**9, 40, 3):
        monkeypatch.setattr(shapes, "ABBREVIATE", limit)
        found[limit] = shapes.small_shapes(graph)
    assert found[40] == found[10**9] and found[3] == found[10**9]


def test_a_plain_chain_shrinks_every_kernel_alike():
    """Every 3x3 kernel of a conv -> ReLU chain shrinks to 2x2 (the image then grows a pixel a layer)
    and grows back to 3x3 in the second set: mixed 2x2 and 3x3 kernels on a 2x2 image made the deep
    chain's gradgradcheck cross ReLU kinks. A chain whose image would outgrow ``LARGEST_TEST_NODE``
    keeps its test tensors within it."""
    first, second = shapes.small_shapes(build_graph(parse_spec(chain_spec(50, channels=2, batch=2, size=8), "c.yaml")))
    assert first.pop("y") == (2, 2, 52, 52) and set(first.values()) == {(2, 2, 2, 2)}
    assert set(second.values()) == {(3, 3, 3, 3)}
    graph = build_graph(parse_spec(chain_spec(300, channels=2, batch=2, size=8), "c.yaml"))
    for small in shapes.small_shapes(graph):
        resized = graph.with_input_shapes(small)
        assert max(math.prod(node.shape) for node in resized.nodes.values()) <= shapes.LARGEST_TEST_NODE


def test_simple_layout_routes_edges_around_nodes(monkeypatch):
    """The linear-time layout used above ``LAYOUT_LIMIT`` nodes, forced on the 70-layer U-Net (skip
    connections span many layers): no edge runs through a node, no two nodes overlap."""
    monkeypatch.setattr(diagram, "LAYOUT_LIMIT", 0)
    graph = build_graph(parse_spec(unet_spec(), "unet.yaml"))
    centres, routes = diagram.layout(graph)
    assert set(centres) == set(graph.nodes)
    boxes = {
        name: (
            x - diagram._node_width(graph, name) / 2,
            y - diagram.BOX_HEIGHT / 2,
            x + diagram._node_width(graph, name) / 2,
            y + diagram.BOX_HEIGHT / 2,
        )
        for name, (x, y) in centres.items()
    }
    for (source, target), points in routes.items():
        assert points[0][1] < points[-1][1]  # every edge runs down
        for segment in zip(points, points[1:]):
            assert segment[0][0] == segment[1][0] or segment[0][1] == segment[1][1]  # vertical or horizontal
            for name, box in boxes.items():
                if name not in (source, target):
                    assert not _crosses(segment, box), f"edge {source} -> {target} runs through {name}"
    ordered = sorted(boxes.values())
    for index, box in enumerate(ordered):
        for other in ordered[index + 1 :]:
            assert box[2] <= other[0] or other[2] <= box[0] or box[3] <= other[1] or other[3] <= box[1], (box, other)
    assert "<svg" in diagram.svg(graph)
