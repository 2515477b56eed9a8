"""The HTML derivation renders in a real browser: MathML laid out as math, the SVG graph drawn.

Runs Debian's Chromium headless through Playwright (which drives, never downloads, the browser).
Without Chromium the test is skipped, unless SYMGRAD_REQUIRE_BROWSER=1 (set by .ci/run), where a
missing browser is a failure. SYMGRAD_UPDATE_SCREENSHOT=1 also refreshes the README's screenshot.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "generated" / "seed3_conv_relu_conv.html"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

if CHROMIUM is None:
    if os.environ.get("SYMGRAD_REQUIRE_BROWSER") == "1":
        raise RuntimeError("SYMGRAD_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install chromium)")
    pytest.skip("no chromium on PATH", allow_module_level=True)

playwright = pytest.importorskip("playwright.sync_api")

LAYOUT = """() => {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
  const maths = [...document.querySelectorAll('math')];
  const fractions = [...document.querySelectorAll('mfrac')];
  const nodes = [...document.querySelectorAll('svg.graph g.node rect')];
  const backward = [...document.querySelectorAll('svg.graph line.backward-edge')];
  return {
    math: maths.length,
    mathSized: maths.filter((m) => { const [w, h] = box(m); return w > 4 && h > 4; }).length,
    mathDisplay: maths.length ? getComputedStyle(maths[0]).display : '',
    fraction: fractions.map((f) => { const [num, den] = [...f.children].map((c) => c.getBoundingClientRect());
                                     return den.top >= num.bottom - 1; }),
    nodes: nodes.length,
    nodesSized: nodes.filter((n) => { const [w, h] = box(n); return w > 50 && h > 20; }).length,
    backward: backward.length,
    codeLines: document.querySelectorAll('pre.code a.line').length,
    firstFormula: (() => { const r = document.querySelector('#gradients ~ math').getBoundingClientRect();
                           return [r.x, r.y, r.width, r.height]; })(),
  };
}"""


def test_seed3_derivation_renders_mathml_and_svg(tmp_path: Path):
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:") else route.continue_())
        page.goto(PAGE.as_uri())
        layout = page.evaluate(LAYOUT)
        x, y, width, height = layout["firstFormula"]
        page.evaluate(f"window.scrollTo(0, {max(0, y - 100)})")
        formula = page.screenshot(clip={"x": x, "y": 100, "width": width, "height": height})
        shot = tmp_path / "seed3_derivation.png"
        page.goto(PAGE.as_uri())
        page.screenshot(path=str(shot), full_page=False)
        browser.close()

    assert layout["math"] >= 20 and layout["mathSized"] == layout["math"], layout
    assert layout["mathDisplay"] in ("inline math", "block math", "math"), layout  # laid out by MathML, not as text
    assert layout["fraction"] and all(layout["fraction"]), layout  # the ½ of the loss: numerator above denominator
    assert layout["nodes"] == 10 and layout["nodesSized"] == 10, layout  # x, w1, w2, k, y, conv1, relu1, conv2, p, loss
    assert layout["backward"] == 7, layout
    assert layout["codeLines"] == 8, layout

    from PIL import Image
    import io

    pixels = Image.open(io.BytesIO(formula)).convert("L")
    dark = sum(pixels.histogram()[:128])
    assert dark > 50, "the formula region is blank"
    if os.environ.get("SYMGRAD_UPDATE_SCREENSHOT") == "1":
        shutil.copy(shot, ROOT / "docs" / "images" / "seed3_derivation.png")
