"""LaTeX (the one notation the rules define) as MathML that browsers lay out right, offline.

latex2mathml does the conversion; this module mends what its output gets wrong in a browser's
MathML Core layout:

* ``\\mathrm{conv2}`` becomes one ``<mi>`` per letter, so an overline set over it as an accent
  covers only the middle letters (``co̅nv2``). A run of upright letters and digits is one name, so it
  becomes one ``<mi>conv2</mi>``, and single-child ``<mrow>`` wrappers are dropped, leaving one
  ``<mi>`` directly under the ``<mover>``.
* The overline is a non-stretchy U+2015; it becomes a stretchy U+00AF (macron) in a
  ``<mover class="overline">``. Chromium (156) does not stretch operators along the line in
  ``<mover>`` with any font (MathML Core requires only vertical stretching), so the page's
  :data:`CSS` draws the bar as the name's top border and hides the glyph: it spans the whole name in
  every browser.
* ``mathvariant="double-struck"`` is ignored by MathML Core, so ``\\mathbb{1}`` showed a plain 1;
  the indicator is written with its own character, U+1D7D9 (𝟙).
* ``\\operatorname{cross\\_entropy}`` came out as an empty operator and italic letters; operator
  names are read as ``\\mathrm`` and so become one upright name too.
* ``aligned`` is not understood (``&`` came out as text); :func:`aligned` builds a two-column
  ``<mtable>`` instead, right-aligned left-hand sides and left-aligned ``= right-hand side``, so
  the ``=`` signs share one x coordinate.
"""

from __future__ import annotations

import functools
import re
import xml.etree.ElementTree as ElementTree

import latex2mathml.converter

NAMESPACE = "http://www.w3.org/1998/Math/MathML"
_TAG = f"{{{NAMESPACE}}}"
ElementTree.register_namespace("", NAMESPACE)

OVERLINE = "\u00af"
CSS = (
    "mover.overline > mo { color: transparent; }\n"
    "mover.overline > :first-child { border-top: 0.07em solid currentColor; padding-top: 0.1em; }"
)
"""Rules the HTML page needs for the overline (see the module docstring)."""
INDICATOR = "\U0001d7d9"


def _is_upright_piece(element: ElementTree.Element) -> bool:
    """A letter, digit or underscore that ``\\mathrm{...}`` split into its own element."""
    if element.tag == f"{_TAG}mi":
        return element.get("mathvariant") == "normal" and len(element) == 0
    return element.tag == f"{_TAG}mn" and element.get("mathvariant") is None and len(element) == 0


def _merge_names(parent: ElementTree.Element) -> None:
    children = list(parent)
    merged: list[ElementTree.Element] = []
    run: list[ElementTree.Element] = []

    def flush():
        if len(run) > 1 and run[0].tag == f"{_TAG}mi":
            name = ElementTree.Element(f"{_TAG}mi")
            name.text = "".join(piece.text or "" for piece in run)
            name.tail = run[-1].tail
            merged.append(name)
        else:
            merged.extend(run)
        run.clear()

    for child in children:
        if _is_upright_piece(child):
            run.append(child)
        else:
            flush()
            merged.append(child)
    flush()
    if merged != children:
        for child in children:
            parent.remove(child)
        parent.extend(merged)


def _unwrap(parent: ElementTree.Element) -> None:
    """Replace every one-child ``<mrow>`` by its child (the layout is the same, the tree simpler)."""
    for index, child in enumerate(list(parent)):
        while child.tag == f"{_TAG}mrow" and len(child) == 1:
            inner = child[0]
            inner.tail = child.tail
            parent.remove(child)
            parent.insert(index, inner)
            child = inner


def _mend(element: ElementTree.Element) -> None:
    for child in element:
        _mend(child)
    _merge_names(element)
    _unwrap(element)
    if (
        element.tag == f"{_TAG}mover"
        and len(element) == 2
        and element[1].tag == f"{_TAG}mo"
        and element[1].text in ("\u2015", "\u00af", "\u203e")
    ):
        element.set("accent", "true")
        element.set("class", "overline")
        element[1].text = OVERLINE
        element[1].set("stretchy", "true")
        element[1].attrib.pop("accent", None)
    if element.tag == f"{_TAG}mn" and element.get("mathvariant") == "double-struck" and element.text == "1":
        element.tag = f"{_TAG}mi"
        element.attrib.clear()
        element.text = INDICATOR


def _tree(latex: str, display: str) -> ElementTree.Element:
    root = ElementTree.fromstring(_converted(latex, display))
    _mend(root)
    return root


@functools.lru_cache(maxsize=4096)
def _converted(latex: str, display: str) -> str:
    """latex2mathml's text of ``latex``, kept: the slow part of a page, whose formulas repeat within it
    (342 of 2732 on smp's PAN-EfficientNet) and across the pages one process builds."""
    # latex2mathml drops \operatorname's name into italic letters after an empty <mo>; \mathrm is
    # read right, and _merge_names makes it one upright <mi>
    latex = re.sub(r"\\operatorname\{([^{}]*)\}", r"\\mathrm{\1}", latex)
    return latex2mathml.converter.convert(latex, display=display)


def _text(root: ElementTree.Element) -> str:
    return ElementTree.tostring(root, encoding="unicode", short_empty_elements=True)


def mathml(latex: str, block: bool = False) -> str:
    """One formula as a ``<math>`` element."""
    return _text(_tree(latex, "block" if block else "inline"))


def aligned(rows: list[tuple[str, str]], css_class: str = "aligned") -> str:
    """``lhs = rhs`` rows as one display ``<math>`` whose ``=`` signs line up: a two-column table,
    the left column right-aligned, the right column (starting with ``=``) left-aligned."""
    root = ElementTree.Element(f"{_TAG}math", {"display": "block", "class": css_class})
    table = ElementTree.SubElement(root, f"{_TAG}mtable", {"columnalign": "right left", "displaystyle": "true"})
    for left, right in rows:
        row = ElementTree.SubElement(table, f"{_TAG}mtr")
        for latex, align in ((left, "right"), ("=" + right, "left")):
            # MathML Core lays tables out with CSS and ignores columnalign; keep both for other renderers
            cell = ElementTree.SubElement(row, f"{_TAG}mtd", {"columnalign": align, "style": f"text-align: {align}"})
            cell.extend(list(_tree(latex, "inline")))
    return _text(root)
