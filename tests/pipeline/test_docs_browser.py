"""The HTML derivations render right in a real browser: MathML laid out as math, every gradient
overline over its whole name, the final formulas aligned on their `=` signs, the graph fitting the
window.

Runs Debian's Chromium headless through Playwright (which drives, never downloads, the browser).
Without Chromium the tests are skipped, unless SYMGRAD_REQUIRE_BROWSER=1 (set by .ci/run), where a
missing browser is a failure. SYMGRAD_UPDATE_SCREENSHOT=1 also refreshes docs/derivations.md's screenshot
of the whole seed-3 page.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

if CHROMIUM is None:
    if os.environ.get("SYMGRAD_REQUIRE_BROWSER") == "1":
        raise RuntimeError("SYMGRAD_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install chromium)")
    pytest.skip("no chromium on PATH", allow_module_level=True)

playwright = pytest.importorskip("playwright.sync_api")

LAYOUT = """() => {
  const rect = (e) => e.getBoundingClientRect();
  const maths = [...document.querySelectorAll('math')];
  const overlines = [...document.querySelectorAll('mover')].filter((m) => m.lastElementChild.textContent === '\\u00af');
  const rows = [...document.querySelectorAll('math.aligned mtr')];
  const graph = document.querySelector('svg.graph');
  return {
    math: maths.length,
    mathSized: maths.filter((m) => rect(m).width > 4 && rect(m).height > 4).length,
    mathDisplay: maths.length ? getComputedStyle(maths[0]).display : '',
    fraction: [...document.querySelectorAll('mfrac')].map((f) => {
      const [num, den] = [...f.children].map(rect); return den.top >= num.bottom - 1; }),
    overlines: overlines.map((m) => {
      const base = m.firstElementChild, name = rect(base), style = getComputedStyle(base);
      return {name: base.textContent, oneName: ['mi', 'msub'].includes(base.tagName) && m.children.length === 2,
              border: parseFloat(style.borderTopWidth), solid: style.borderTopStyle === 'solid',
              box: [name.left, name.top + window.scrollY, name.width]};
    }),
    equalsX: rows.map((row) => { const eq = [...row.children[1].querySelectorAll('mo')].find((o) => o.textContent === '=');
                                 return eq ? rect(eq).left : null; }),
    rows: rows.length,
    indicator: [...document.querySelectorAll('mi')].filter((m) => m.textContent === '\\u{1D7D9}').length,
    nodes: document.querySelectorAll('svg.graph g.node rect').length,
    nodesSized: [...document.querySelectorAll('svg.graph g.node rect')].filter((n) => rect(n).width > 50).length,
    backward: document.querySelectorAll('svg.graph .backward-edge').length,
    graphRight: rect(graph).right, viewport: document.documentElement.clientWidth,
    codeLines: document.querySelectorAll('pre.code a.line').length,
    firstFormula: (() => { const r = rect(document.querySelector('#gradients ~ math'));
                           return [r.x, r.y + window.scrollY, r.width, r.height]; })(),
  };
}"""

PAGES = {  # page: (graph nodes, backward edges, derived formulas, emitted backward lines, masks shown with 𝟙)
    "seed3_conv_relu_conv": (10, 7, 8, 5, 2),  # one fused call per conv's two gradients, one per ReLU
    "upsampling_decoder": (12, 10, 15, 9, 2),  # the upsampling's backward one aten kernel call
}


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as driver:
        launched = driver.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield launched
        launched.close()


def _open(browser, name: str, width: int = 1400):
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:") else route.continue_())
    page.goto((ROOT / "generated" / f"{name}.html").as_uri())
    return page


def _bar_pixels(page, box) -> tuple[bool, bool]:
    """Whether the two-pixel band at the top of a name has ink in its first and in its last quarter."""
    from PIL import Image

    left, top, width = box
    band = Image.open(
        io.BytesIO(page.screenshot(clip={"x": left, "y": top, "width": width, "height": 3}, full_page=True))
    ).convert("L")
    columns = [min(band.getpixel((x, y)) for y in range(band.height)) for x in range(band.width)]
    quarter = max(1, len(columns) // 4)
    return min(columns[:quarter]) < 128, min(columns[-quarter:]) < 128


@pytest.mark.parametrize("name", sorted(PAGES))
def test_derivation_page_lays_out_right(browser, name: str, tmp_path: Path):
    nodes, backward, formulas, code_lines, indicators = PAGES[name]
    page = _open(browser, name)
    layout = page.evaluate(LAYOUT)
    x, y, width, height = layout["firstFormula"]
    formula = page.screenshot(clip={"x": x, "y": y, "width": width, "height": height}, full_page=True)
    bars = [_bar_pixels(page, overline["box"]) for overline in layout["overlines"] if len(overline["name"]) > 2][:6]
    whole = page.screenshot(full_page=True)
    page.close()

    assert layout["math"] >= 10 and layout["mathSized"] == layout["math"], layout
    assert layout["mathDisplay"] in ("inline math", "block math", "math"), layout  # laid out by MathML, not as text
    assert layout["fraction"] and all(layout["fraction"]), layout  # the ½ of the loss: numerator above denominator
    # every gradient's overline is one bar over one <mi> holding the whole name (not co̅nv2)
    assert layout["overlines"], layout
    for overline in layout["overlines"]:
        assert overline["oneName"] and overline["solid"] and overline["border"] > 0, overline
    assert any(len(overline["name"]) > 1 for overline in layout["overlines"])
    # the final formulas: one aligned table, all `=` at one x coordinate
    assert layout["rows"] == formulas and None not in layout["equalsX"], layout
    assert max(layout["equalsX"]) - min(layout["equalsX"]) < 0.5, layout["equalsX"]
    for first_quarter, last_quarter in bars:  # what a reader sees: ink above both ends of the name
        assert first_quarter and last_quarter, bars
    assert layout["indicator"] == indicators, layout  # 𝟙[relu > 0], not a plain 1
    assert layout["nodes"] == nodes and layout["nodesSized"] == nodes, layout
    assert layout["backward"] == backward, layout
    assert layout["graphRight"] <= layout["viewport"], layout  # the graph fits a 1400 px window
    assert layout["codeLines"] == code_lines, layout

    from PIL import Image

    assert sum(Image.open(io.BytesIO(formula)).convert("L").histogram()[:128]) > 50, "the formula region is blank"
    shot = Image.open(io.BytesIO(whole))
    assert shot.height > 2000  # the whole page, not its first screen
    if name == "seed3_conv_relu_conv" and os.environ.get("SYMGRAD_UPDATE_SCREENSHOT") == "1":
        shot.save(ROOT / "docs" / "images" / "seed3_derivation.png", optimize=True)


def test_graph_scales_down_in_a_narrow_window(browser):
    page = _open(browser, "upsampling_decoder", width=500)
    layout = page.evaluate(LAYOUT)
    page.close()
    assert layout["graphRight"] <= layout["viewport"], layout
