"""The forward graph, with its backward edges, as Mermaid (for Markdown) and as inline SVG (for HTML).

Labels are built only from validated identifiers and op names, so they need no escaping beyond
what is done here for XML.
"""

from __future__ import annotations

from dataclasses import dataclass
from xml.sax.saxutils import escape

from .graph import Graph

BOX_WIDTH, BOX_HEIGHT, COLUMN_GAP, ROW_GAP, MARGIN = 120, 46, 70, 22, 20


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    backward: bool


def edges(graph: Graph) -> list[Edge]:
    """Forward edges (operand -> node), and a backward edge for every one a gradient flows along."""
    needs = graph.depends_on_wrt()
    result = []
    for node in graph.nodes.values():
        for source in dict.fromkeys(node.operands.values()):
            result.append(Edge(source, node.name, False))
    for node in graph.nodes.values():
        for source in dict.fromkeys(node.operands.values()):
            if source in needs and (node.name in needs or node.kind == "loss"):
                result.append(Edge(node.name, source, True))
    return result


def _label(graph: Graph, name: str) -> str:
    node = graph.nodes[name]
    if node.kind == "input":
        return "parameter" if name in graph.wrt else "constant"
    return node.rule.op


def mermaid(graph: Graph) -> str:
    lines = ["flowchart LR"]
    for node in graph.nodes.values():
        text = f"{node.name}<br/>{_label(graph, node.name)}"
        shape = f'(["{text}"])' if node.kind == "input" else (f'[["{text}"]]' if node.kind == "loss" else f'["{text}"]')
        lines.append(f"  {node.name}{shape}")
    for edge in edges(graph):
        arrow = " -. grad .-> " if edge.backward else " --> "
        lines.append(f"  {edge.source}{arrow}{edge.target}")
    return "\n".join(lines)


def _ranks(graph: Graph) -> dict[str, int]:
    rank = {}
    for node in graph.nodes.values():
        rank[node.name] = 1 + max((rank[source] for source in node.operands.values()), default=-1)
    return rank


def svg(graph: Graph) -> str:
    rank = _ranks(graph)
    columns: dict[int, list[str]] = {}
    for name, column in rank.items():
        columns.setdefault(column, []).append(name)
    position = {}
    for column, names in columns.items():
        for row, name in enumerate(names):
            position[name] = (MARGIN + column * (BOX_WIDTH + COLUMN_GAP), MARGIN + row * (BOX_HEIGHT + ROW_GAP))
    width = MARGIN * 2 + (max(columns) + 1) * (BOX_WIDTH + COLUMN_GAP) - COLUMN_GAP
    height = MARGIN * 2 + max(len(names) for names in columns.values()) * (BOX_HEIGHT + ROW_GAP) - ROW_GAP + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="forward graph with backward edges">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
             'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#333"/></marker>'
             '<marker id="arrow-back" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
             'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#c0392b"/></marker></defs>']
    for edge in edges(graph):
        (x1, y1), (x2, y2) = position[edge.source], position[edge.target]
        offset = 6 if edge.backward else -6
        if edge.backward:
            start, end = (x1, y1 + BOX_HEIGHT / 2 + offset), (x2 + BOX_WIDTH, y2 + BOX_HEIGHT / 2 + offset)
            style = 'stroke="#c0392b" stroke-dasharray="5 4" marker-end="url(#arrow-back)"'
        else:
            start, end = (x1 + BOX_WIDTH, y1 + BOX_HEIGHT / 2 + offset), (x2, y2 + BOX_HEIGHT / 2 + offset)
            style = 'stroke="#333" marker-end="url(#arrow)"'
        parts.append(f'<line class="{"backward" if edge.backward else "forward"}-edge" x1="{start[0]:.0f}" '
                     f'y1="{start[1]:.0f}" x2="{end[0]:.0f}" y2="{end[1]:.0f}" stroke-width="1.5" {style}/>')
    fills = {"input": "#eef5ff", "layer": "#f7f7f7", "loss": "#fff4e0"}
    for name, (x, y) in position.items():
        node = graph.nodes[name]
        parts.append(f'<g class="node" id="node-{name}"><rect x="{x}" y="{y}" width="{BOX_WIDTH}" height="{BOX_HEIGHT}" '
                     f'rx="8" fill="{fills[node.kind]}" stroke="#555"/>'
                     f'<text x="{x + BOX_WIDTH / 2:.0f}" y="{y + 19}" text-anchor="middle" font-family="monospace" '
                     f'font-size="13" font-weight="bold">{escape(name)}</text>'
                     f'<text x="{x + BOX_WIDTH / 2:.0f}" y="{y + 36}" text-anchor="middle" font-family="sans-serif" '
                     f'font-size="11" fill="#555">{escape(_label(graph, name))}</text></g>')
    parts.append(f'<text x="{MARGIN}" y="{height - 10}" font-family="sans-serif" font-size="11" fill="#333">'
                 'solid: forward pass; dashed red: gradient flowing back</text>')
    parts.append("</svg>")
    return "\n".join(parts)
