"""The derivation documents' notation and layout, checked without a browser (the browser test checks
the same pages as laid out in Chromium).

Each test here failed before the change that made it pass (issue 14)."""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from symgrad.graph import build_graph
from symgrad.mathml import INDICATOR, NAMESPACE, aligned, mathml
from symgrad.spec import parse_spec
from tests.helpers import build_text, spec_text

ROOT = Path(__file__).resolve().parents[2]
M = f"{{{NAMESPACE}}}"


def _parse(text: str) -> ElementTree.Element:
    return ElementTree.fromstring(text)


@pytest.mark.parametrize(
    "latex, name",
    [(r"\overline{\mathrm{conv2}}", "conv2"), (r"\overline{\mathrm{loss}}", "loss"), (r"\overline{x}", "x")],
)
def test_gradient_overline_is_one_name_under_one_mover(latex, name):
    root = _parse(mathml(latex))
    movers = root.findall(f".//{M}mover")
    assert len(movers) == 1 and movers[0].get("class") == "overline"
    base, bar = list(movers[0])
    assert base.tag == f"{M}mi" and base.text == name
    assert bar.tag == f"{M}mo" and bar.get("stretchy") == "true"


def test_operator_names_are_one_upright_name():
    root = _parse(mathml(r"\operatorname{cross\_entropy}\left(a, b\right)"))
    names = [element.text for element in root.iter(f"{M}mi")]
    assert names[0] == "cross_entropy" and not any(element.text == "" for element in root.iter(f"{M}mo"))


def test_indicator_is_its_own_character():
    root = _parse(mathml(r"\mathbb{1}\left[\mathrm{relu1} > 0\right]"))
    assert [element.text for element in root.iter(f"{M}mi")][:2] == [INDICATOR, "relu1"]
    assert not any(element.get("mathvariant") == "double-struck" for element in root.iter())


def test_aligned_rows_are_a_table_with_equals_opening_the_second_column():
    root = _parse(aligned([(r"\overline{p}", r"\mathrm{residual}"), (r"\overline{x}", r"w^{\top} \star \overline{p}")]))
    rows = root.findall(f".//{M}mtr")
    assert len(rows) == 2
    for row in rows:
        left, right = row.findall(f"{M}mtd")
        assert next(right.iter(f"{M}mo")).text == "="
        assert "&" not in ElementTree.tostring(row, encoding="unicode")


def test_products_of_names_are_separated():
    import sympy

    from symgrad.printing import to_latex

    loss, residual, n = sympy.symbols("loss residual n")
    assert r"\cdot" in to_latex(2 * loss * residual / n)


def test_markdown_puts_display_math_in_math_fences():
    """GitHub renders ```math blocks everywhere, also inside list items; `$$...$$` after text on a
    list line is not reliably display math there."""
    for path in sorted((ROOT / "generated").glob("*.md")):
        text = path.read_text()
        assert "$$" not in text, path
        assert "```math" in text
        for line in text.splitlines():
            if line.lstrip().startswith("- to `"):  # a contribution: its formula is in the fence below
                assert "$" not in line, (path, line)


def _normalised_spec() -> str:
    return spec_text(
        {"x": [4, 3, 8, 8], "w": [6, 3, 3, 3], "b": [6], "y": [4, 6, 8, 8]},
        [
            {"op": "conv2d", "weight": "w", "bias": "b", "padding": 1, "out": "h"},
            {"op": "batch_norm", "training": True, "out": "n"},
            {"op": "relu", "out": "r"},
            {"op": "interpolate", "scale_factor": 1, "mode": "bilinear", "out": "p"},
        ],
        {"op": "mse_loss", "in": "p", "target": "y"},
        ["x", "w"],
        name="normalised",
    )


def test_batch_norm_mean_is_not_written_as_a_gradient():
    markdown = build_text(_normalised_spec()).rendered.files["normalised.md"]
    assert r"\operatorname{mean}_{D}" in markdown
    assert not re.search(r"\\overline\{[^{}]*\}\^\{D\}", markdown)


def test_notation_explains_local_names_and_axis_matrices():
    markdown = build_text(_normalised_spec()).rendered.files["normalised.md"]
    notation = markdown.split("## 1.", 1)[0]
    for term in (r"$\mathrm{local}_{v}$", r"$A_{k}$", r"$\operatorname{mean}_{D}$"):
        assert term in notation
    assert r"\mathrm{local}_{\mathrm{p\_dim2}}" in markdown or r"\mathrm{local}_{\mathrm{p\_dim3}}" in markdown


def unet_spec(levels: int = 5, width: int = 2) -> str:
    """A U-Net: per level two conv+batch_norm+relu, then max-pool down; up by nearest interpolation,
    cat with the skip, two conv+batch_norm+relu. 82 layers at 5 levels."""
    inputs, layers = {"x": [2, 1, 64, 64]}, []
    channels, previous, skips = 1, "x", []

    def conv_relu(name, cin, cout, source):
        inputs[f"w_{name}"] = [cout, cin, 3, 3]
        layers.append({"op": "conv2d", "in": [source], "weight": f"w_{name}", "padding": 1, "out": f"c_{name}"})
        layers.append({"op": "batch_norm", "training": True, "out": f"n_{name}"})
        layers.append({"op": "relu", "out": f"r_{name}"})
        return f"r_{name}"

    for level in range(levels):
        out = width * 2**level
        previous = conv_relu(f"d{level}a", channels, out, previous)
        previous = conv_relu(f"d{level}b", out, out, previous)
        skips.append((previous, out))
        layers.append({"op": "max_pool2d", "kernel_size": 2, "out": f"pool{level}"})
        previous, channels = f"pool{level}", out
    previous = conv_relu("mid_a", channels, channels * 2, previous)
    previous = conv_relu("mid_b", channels * 2, channels * 2, previous)
    channels *= 2
    for level in reversed(range(levels)):
        skip, skip_channels = skips[level]
        layers.append({"op": "interpolate", "in": [previous], "scale_factor": 2, "out": f"up{level}"})
        layers.append({"op": "cat", "in": [f"up{level}", skip], "dim": 1, "out": f"cat{level}"})
        previous = conv_relu(f"u{level}a", channels + skip_channels, skip_channels, f"cat{level}")
        previous = conv_relu(f"u{level}b", skip_channels, skip_channels, previous)
        channels = skip_channels
    inputs["w_out"] = [1, channels, 1, 1]
    layers.append({"op": "conv2d", "in": [previous], "weight": "w_out", "out": "restored"})
    inputs["y"] = [2, 1, 64, 64]
    return spec_text(
        inputs,
        layers,
        {"op": "mse_loss", "in": "restored", "target": "y"},
        ["x", *[name for name in inputs if name.startswith("w_")]],
        name="unet",
    )


def _crosses(segment, box) -> bool:
    """Whether a straight segment passes through the inside of an axis-aligned box (sampled finely)."""
    (x1, y1), (x2, y2) = segment
    left, top, right, bottom = box
    for step in range(1, 200):
        t = step / 200
        x, y = x1 + t * (x2 - x1), y1 + t * (y2 - y1)
        if left + 1 < x < right - 1 and top + 1 < y < bottom - 1:
            return True
    return False


def test_graph_layout_of_a_70_layer_unet_routes_edges_around_nodes():
    from symgrad.diagram import BOX_HEIGHT, _node_width, layout

    graph = build_graph(parse_spec(unet_spec(), "unet.yaml"))
    assert len(graph.spec.layers) >= 70
    started = time.perf_counter()
    centres, routes = layout(graph)
    assert time.perf_counter() - started < 10
    boxes = {
        name: (
            x - _node_width(graph, name) / 2,
            y - BOX_HEIGHT / 2,
            x + _node_width(graph, name) / 2,
            y + BOX_HEIGHT / 2,
        )
        for name, (x, y) in centres.items()
    }
    for (source, target), points in routes.items():
        for segment in zip(points, points[1:]):
            for name, box in boxes.items():
                if name not in (source, target):
                    assert not _crosses(segment, box), f"edge {source} -> {target} runs through {name}"
    for name, box in boxes.items():  # nodes do not overlap
        for other, other_box in boxes.items():
            if name < other:
                assert (
                    box[2] <= other_box[0] or other_box[2] <= box[0] or box[3] <= other_box[1] or other_box[3] <= box[1]
                ), (name, other)


def test_graph_svg_scales_to_the_page():
    from symgrad.diagram import svg

    picture = svg(build_graph(parse_spec(unet_spec(), "unet.yaml")))
    opening = picture.split(">", 1)[0]
    assert "viewBox=" in opening and 'height="' not in opening  # height follows the width the page gives it
    template = (ROOT / "templates" / "derivation_html" / "header.jinja").read_text()  # the page's style
    assert "svg.graph { display: block; max-width: 100%; height: auto; }" in template


def test_a_block_specs_documents_show_an_overview_each_op_kind_once_and_step_tables_linked_to_the_module():
    """Issue 64: a spec with blocks gets the network's overview (its top-level graph with each parameter
    folded into its op, the block instances' table), each op kind derived once however many nodes
    have it, and per block and for the top level a step table whose links name the module's lines
    pulling each node back; no copy of the code."""
    markdown = (ROOT / "generated" / "unrolled_blocks.md").read_text()
    html = (ROOT / "generated" / "unrolled_blocks.html").read_text()
    module = (ROOT / "generated" / "unrolled_blocks.py").read_text().splitlines()
    assert markdown.count("```mermaid") == 1 and "```python" not in markdown
    graph = markdown.split("```mermaid", 1)[1].split("```", 1)[0]
    assert "x1[" in graph and "step1_w1" not in graph and "k(" not in graph  # parameters folded into their ops
    assert markdown.count("](#block-gradient_step) |") == 4 + 4  # the block table's instances, the top level's steps
    # the three conv2d nodes of the block (to input and weight) are derived once, and each links there
    assert markdown.count('<a id="op-conv2d-input-weight"></a>') == 1
    assert markdown.count("](#op-conv2d-input-weight) |") == 3
    links = re.findall(r"^\| \d+ \| `(\w+)` \|.*\[L(\d+)\]\(unrolled_blocks\.py#L\d+\) \|$", markdown, re.M)
    assert len(links) >= 10, links  # 6 of the block's 7 steps, the top level's 5
    for node, line in links:
        assert re.search(rf"\b(?:grads_)?{node}\b", module[int(line) - 1]), (node, module[int(line) - 1])
    assert "- `k` feeds x4, x3, x2, x1, so" in markdown  # the top level sums the four instances' gradients of k
    for part in (
        "overview",
        "blocks",
        "op-kinds",
        "block-gradient_step",
        "block-gradient_step-steps",
        "block-gradient_step-branches",
        "top-level-steps",
        "top-level-branches",
        "top-level-step-1",
    ):
        assert html.count(f'id="{part}"') == 1, part
    assert html.count("<svg") == 1 and "<script" not in html and not re.search(r'(?:src|href)="https?:', html)


def test_the_notation_defines_the_symbols_a_document_uses_and_no_others():
    seed3 = (ROOT / "generated" / "seed3_conv_relu_conv.md").read_text().split("\n\n", 2)[1]
    decoder = (ROOT / "generated" / "upsampling_decoder.md").read_text().split("\n\n", 2)[1]
    assert r"\star" in seed3 and r"\mathrm{mask}_{v}" in seed3
    assert r"A_{k}" not in seed3 and r"\operatorname{mean}_{D}" not in seed3  # no resampling, no normalisation
    assert r"A_{k}" in decoder  # its upsampling's axis matrices


BRANCHING = """\
name: branching
inputs:
  x: {shape: [2, 3, 8, 8]}
  conv_weight: {shape: [4, 3, 3, 3]}
  conv_bias: {shape: [4]}
  bn_running_mean: {shape: [4]}
  bn_running_var: {shape: [4]}
  bn_weight: {shape: [4]}
  bn_bias: {shape: [4]}
  fc_weight: {shape: [5, 4]}
  fc_bias: {shape: [5]}
layers:
  - {op: conv2d, in: x, weight: conv_weight, bias: conv_bias, padding: 1, out: conv}
  - {op: batch_norm, in: conv, running_mean: bn_running_mean, running_var: bn_running_var, weight: bn_weight, bias: bn_bias, out: bn}
  - {op: relu, in: bn, out: relu}
  - {op: adaptive_avg_pool2d, in: relu, output_size: 1, out: pooled}
  - {op: flatten, in: pooled, start_dim: 1, out: flatten}
  - {op: linear, in: flatten, weight: fc_weight, bias: fc_bias, out: fc}
  - {op: mean, in: relu, dim: [1], out: mean}
outputs: {logits: fc, feat: relu, m: mean}
wrt: [x, conv_weight, conv_bias, bn_weight, bn_bias, fc_weight, fc_bias]
"""


def test_the_graph_drawing_is_the_same_in_every_process():
    """grandalf's ``Graph`` gathers a component's edges in a set of objects, whose order follows the
    process (here: its hash seed): the layout moved with it, and ``symgrad check`` found a file just
    generated out of date. Components are now made in the graph's order (``diagram._components``), and a
    block spec's page draws its overview, the top level's graph (left out while the drawing moved)."""
    import json
    import os
    import subprocess
    import sys

    script = (
        "import json, sys; from symgrad.pipeline import build_text; json.dump([build_text(text, 's.yaml')"
        ".rendered.files[name + '.html'] for text, name in json.load(sys.stdin)], sys.stdout)"
    )
    blocks = (ROOT / "examples" / "unrolled_blocks.yaml").read_text()  # the top level's graph is drawn too
    specs = [(BRANCHING, "branching"), (blocks, "unrolled_blocks")]
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", script],
                input=json.dumps(specs),
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "PYTHONHASHSEED": str(seed)},
            ).stdout
        )
        for seed in range(1, 4)
    ]  # one process per hash seed draws both pages
    for index, (_, name) in enumerate(specs):
        pages = {run[index] for run in runs}
        assert len(pages) == 1 and next(iter(pages)).count("<svg") == 1, name


@pytest.mark.parametrize("spec", ["seed3_conv_relu_conv.yaml", "unrolled_blocks.yaml"])
def test_a_build_without_documents_has_the_same_module_and_test_file_and_no_pages(spec):
    """``documents=False`` (what a test or a bound model that imports the module asks for) leaves the pages
    out, and nothing else: the module and its test file are the full build's, byte for byte."""
    from symgrad.pipeline import build

    full, bare = build(ROOT / "examples" / spec), build(ROOT / "examples" / spec, documents=False)
    pages = {name for name in full.rendered.files if name.endswith((".md", ".html"))}
    assert len(pages) == 2 and set(bare.rendered.files) == set(full.rendered.files) - pages
    assert all(bare.rendered.files[name] == full.rendered.files[name] for name in bare.rendered.files)


def test_a_formula_converted_once_is_the_same_page_text_each_time():
    """The MathML of a formula is latex2mathml's text kept (``mathml._converted``), mended anew each time:
    a second conversion is the first's, and mending one tree leaves the kept text alone."""
    from symgrad import mathml as module

    latex = r"\overline{\mathrm{conv2}} = \operatorname{relu}\left(x\right)"
    first = mathml(latex)
    assert module._converted.cache_info().currsize >= 1
    module._tree(latex, "inline").clear()  # a caller's edit of its tree
    assert mathml(latex) == first and "mover" in first
