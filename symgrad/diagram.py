"""The forward graph, with its backward edges, as Mermaid (for Markdown) and as inline SVG (for HTML).

Labels are built only from validated identifiers and op names, so they need no escaping beyond
what is done here for XML.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from xml.sax.saxutils import escape

from .graph import Graph

BOX_WIDTH, BOX_HEIGHT, COLUMN_GAP, ROW_GAP, MARGIN = 120, 46, 70, 22, 20
LAYER_GAP = ROW_GAP + 24
"""The empty band between two layers, where edges run sideways."""
LAYOUT_LIMIT = 500
"""Graphs of more nodes than this are laid out by ``_simple_layout`` (linear time) instead of grandalf,
whose graph construction and ordering grow with the square of the nodes: 2 s at 1,800 nodes, minutes
at 30,000."""


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    backward: bool


@dataclass(frozen=True)
class Folded:
    """A graph drawn with its parameter and buffer leaves folded into the ops that read them: a
    network's overview shows its data flow, not one leaf per weight. Its backward edges are the
    whole graph's (``needs``)."""

    nodes: dict
    wrt: tuple[str, ...]
    needs: frozenset[str]

    def depends_on_wrt(self) -> set[str]:
        return set(self.needs)


def folded(graph: Graph, leaves: set[str]) -> Folded:
    """``graph`` without the input nodes ``leaves`` (parameters, buffers) and the edges from them."""
    nodes = {
        name: dataclasses.replace(
            node, operands={role: source for role, source in node.operands.items() if source not in leaves}
        )
        for name, node in graph.nodes.items()
        if name not in leaves
    }
    return Folded(nodes, graph.wrt, frozenset(graph.depends_on_wrt()) | frozenset(graph.wrt))


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


def _node_width(graph: Graph, name: str) -> int:
    """Wide enough for the bold name (about 8 px a character at 13 px monospace) and its op."""
    return max(BOX_WIDTH, 8 * max(len(name), len(_label(graph, name))) + 24)


def layout(graph: Graph) -> tuple[dict[str, tuple[float, float]], dict[tuple[str, str], list[tuple[float, float]]]]:
    """A layered (Sugiyama) layout by grandalf, top to bottom: each node's centre, and each forward
    edge's route through the dummy points grandalf places where an edge spans several layers, so no
    edge runs through a node. Leaves sit one layer above their first consumer (``optimize``). Above
    ``LAYOUT_LIMIT`` nodes, ``_simple_layout`` instead."""
    if len(graph.nodes) > LAYOUT_LIMIT:
        return _simple_layout(graph)
    from grandalf.graphs import Edge as LayoutEdge, Vertex, graph_core
    from grandalf.layouts import SugiyamaLayout

    class Box:
        def __init__(self, width: int):
            self.w, self.h = width, BOX_HEIGHT

    class Route:
        points: list = []

        def setpath(self, points):
            self.points = [tuple(point) for point in points]

    vertices = {name: Vertex(name) for name in graph.nodes}
    for name, vertex in vertices.items():
        vertex.view = Box(_node_width(graph, name))
    pairs = list(dict.fromkeys((edge.source, edge.target) for edge in edges(graph) if not edge.backward))
    layout_edges = {pair: LayoutEdge(vertices[pair[0]], vertices[pair[1]]) for pair in pairs}
    for edge in layout_edges.values():
        edge.view = Route()
    centres: dict[str, tuple[float, float]] = {}
    offset = 0.0
    for names, component_pairs in _components(list(vertices), pairs):  # side by side, in the graph's order
        component = graph_core([vertices[name] for name in names], [layout_edges[pair] for pair in component_pairs])
        sugiyama = SugiyamaLayout(component)
        sugiyama.xspace, sugiyama.yspace = COLUMN_GAP // 2, LAYER_GAP
        sugiyama.init_all(optimize=True)
        sugiyama.draw()
        placed = {vertex.data: vertex.view.xy for vertex in component.sV}
        left = min(x - vertices[name].view.w / 2 for name, (x, _) in placed.items())
        shift = offset - left
        for name, (x, y) in placed.items():
            centres[name] = (x + shift, y)
        offset = max(x + vertices[name].view.w / 2 for name, (x, _) in centres.items()) + COLUMN_GAP
        for edge in component.sE:
            edge.view.points = [(x + shift, y) for x, y in edge.view.points]
    widths = {name: vertex.view.w for name, vertex in vertices.items()}
    return centres, _orthogonal_routes(
        pairs, {pair: edge.view.points for pair, edge in layout_edges.items()}, centres, widths, LAYER_GAP
    )


def _components(names: list[str], pairs: list[tuple[str, str]]) -> list[tuple[list[str], list[tuple[str, str]]]]:
    """The connected components of the graph of ``names`` and edges ``pairs``, each its names and pairs in the
    order given, ordered by their first name. (grandalf's ``Graph`` gathers a component's edges in a set of
    objects, whose order changes from one process to the next, and the layout with it: ``symgrad check``
    then found a file just generated out of date.)"""
    root = {name: name for name in names}

    def find(name: str) -> str:
        while root[name] != name:
            root[name] = root[root[name]]
            name = root[name]
        return name

    for source, target in pairs:
        root[find(source)] = find(target)
    components: dict[str, tuple[list[str], list[tuple[str, str]]]] = {}
    for name in names:
        components.setdefault(find(name), ([], []))[0].append(name)
    for pair in pairs:
        components[find(pair[0])][1].append(pair)
    return list(components.values())


def _simple_layout(
    graph: Graph,
) -> tuple[dict[str, tuple[float, float]], dict[tuple[str, str], list[tuple[float, float]]]]:
    """A layered layout in linear time, for graphs too large for grandalf: each node one layer below
    the lowest of its operands, each input one layer above its highest consumer, the nodes of a layer
    side by side in spec order and centred. An edge spanning several layers runs down a lane to the
    right of every box (lanes are reused where their spans do not overlap), so no edge runs through a
    node; the drawing is plainer than grandalf's (no crossing reduction)."""
    import heapq

    nodes = graph.nodes
    layer: dict[str, int] = {}
    for name, node in nodes.items():
        layer[name] = 1 + max((layer[source] for source in node.operands.values()), default=-1)
    consumers_layer: dict[str, int] = {}
    for name, node in nodes.items():
        for source in node.operands.values():
            consumers_layer[source] = min(consumers_layer.get(source, layer[name]), layer[name])
    for name, node in nodes.items():
        if node.kind == "input" and name in consumers_layer:
            layer[name] = consumers_layer[name] - 1
    low = min(layer.values())
    rows: dict[int, list[str]] = {}
    for name in nodes:
        rows.setdefault(layer[name] - low, []).append(name)
    widths = {name: _node_width(graph, name) for name in nodes}
    step = BOX_HEIGHT + LAYER_GAP
    centres: dict[str, tuple[float, float]] = {}
    right = 0.0
    for row, names in rows.items():
        total = sum(widths[name] for name in names) + COLUMN_GAP // 2 * (len(names) - 1)
        x = -total / 2
        for name in names:
            centres[name] = (x + widths[name] / 2, row * step)
            x += widths[name] + COLUMN_GAP // 2
        right = max(right, x - COLUMN_GAP // 2)
    pairs = list(dict.fromkeys((edge.source, edge.target) for edge in edges(graph) if not edge.backward))
    raw: dict[tuple[str, str], list[tuple[float, float]]] = {}
    free_lanes: list[int] = []
    busy: list[tuple[int, int]] = []  # (last row, lane) of lanes in use
    lanes = 0
    spans = sorted((layer[source] - low, layer[target] - low, index) for index, (source, target) in enumerate(pairs))
    lane_of: dict[int, int] = {}
    for first, last, index in spans:
        if last - first < 2:
            continue
        while busy and busy[0][0] < first:
            heapq.heappush(free_lanes, heapq.heappop(busy)[1])
        lane = heapq.heappop(free_lanes) if free_lanes else lanes
        lanes = max(lanes, lane + 1)
        heapq.heappush(busy, (last, lane))
        lane_of[index] = lane
    for index, (source, target) in enumerate(pairs):
        route = [centres[source]]
        if index in lane_of:
            x = right + COLUMN_GAP / 2 + 14 * lane_of[index]
            route += [(x, (layer[source] - low + 1) * step), (x, (layer[target] - low - 1) * step)]
        raw[(source, target)] = route + [centres[target]]
    return centres, _orthogonal_routes(pairs, raw, centres, widths, LAYER_GAP)


def _spread(centre: float, width: float, index: int, count: int) -> float:
    """The x where the index-th of count edges leaves or enters a box: spread 14 px apart, inside it."""
    return centre + max(-width / 2 + 8, min(width / 2 - 8, (index - (count - 1) / 2) * 14))


def _orthogonal_routes(pairs, raw, centres, widths, gap) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Each edge as vertical and horizontal segments: straight down out of the source's bottom, sideways
    only in the empty band between two layers, straight down through each dummy slot grandalf kept
    free for it, and into the target's top. So an edge never runs through a node."""
    outgoing: dict[str, list] = {}
    incoming: dict[str, list] = {}
    for pair in pairs:  # order each node's edges by where they go, so they do not cross at the box
        outgoing.setdefault(pair[0], []).append(pair)
        incoming.setdefault(pair[1], []).append(pair)
    for name, edges_out in outgoing.items():
        edges_out.sort(key=lambda pair: raw[pair][1][0] if len(raw[pair]) > 1 else centres[pair[1]][0])
    for name, edges_in in incoming.items():
        edges_in.sort(key=lambda pair: raw[pair][-2][0] if len(raw[pair]) > 1 else centres[pair[0]][0])
    out_index = {pair: index for edges_out in outgoing.values() for index, pair in enumerate(edges_out)}
    in_index = {pair: index for edges_in in incoming.values() for index, pair in enumerate(edges_in)}
    routes = {}
    for pair in pairs:
        source, target = pair
        (source_x, source_y), (target_x, target_y) = centres[source], centres[target]
        start = (_spread(source_x, widths[source], out_index[pair], len(outgoing[source])), source_y + BOX_HEIGHT / 2)
        end = (_spread(target_x, widths[target], in_index[pair], len(incoming[target])), target_y - BOX_HEIGHT / 2)
        waypoints = [point for point in raw[pair][1:-1]] + [end]
        route = [start]
        for index, (x, y) in enumerate(waypoints):
            last = index == len(waypoints) - 1
            layer_top = y if last else y - BOX_HEIGHT / 2
            band = layer_top - gap / 2  # the middle of the empty band above this layer
            here = route[-1]
            if abs(here[0] - x) > 0.5:
                route += [(here[0], band), (x, band)]
            route.append((x, y if last else y + BOX_HEIGHT / 2))
        routes[pair] = route
    return routes


def _path(points: list[tuple[float, float]]) -> str:
    return "M " + " L ".join(f"{x:.0f} {y:.0f}" for x, y in points)


def svg(graph: Graph) -> str:
    """The graph as inline SVG: a ``viewBox`` and no fixed width, so it scales down to fit the page."""
    centres, routes = layout(graph)
    widths = {name: _node_width(graph, name) for name in graph.nodes}
    left = min(x - widths[name] / 2 for name, (x, _) in centres.items())
    top = min(y for _, y in centres.values()) - BOX_HEIGHT / 2

    def moved(point):
        return point[0] - left + MARGIN, point[1] - top + MARGIN

    centres = {name: moved(point) for name, point in centres.items()}
    routes = {pair: [moved(point) for point in points] for pair, points in routes.items()}
    width = max(x + widths[name] / 2 for name, (x, _) in centres.items()) + MARGIN
    height = max(y for _, y in centres.values()) + BOX_HEIGHT / 2 + MARGIN + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" role="img" aria-label="forward graph with backward edges">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#333"/></marker>'
        '<marker id="arrow-back" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#c0392b"/></marker></defs>',
    ]
    for edge in edges(graph):
        pair = (edge.target, edge.source) if edge.backward else (edge.source, edge.target)
        points = routes[pair]
        if edge.backward:  # beside the forward route: 5 px right, and 5 px lower in the bands between layers
            points = [(x + 5, y if index in (0, len(points) - 1) else y + 5) for index, (x, y) in enumerate(points)][
                ::-1
            ]
            style = 'stroke="#c0392b" stroke-dasharray="5 4" marker-end="url(#arrow-back)"'
        else:
            style = 'stroke="#333" marker-end="url(#arrow)"'
        parts.append(
            f'<path class="{"backward" if edge.backward else "forward"}-edge" d="{_path(points)}" fill="none" '
            f'stroke-width="1.5" {style}/>'
        )
    fills = {"input": "#eef5ff", "layer": "#f7f7f7", "loss": "#fff4e0"}
    for name, (centre_x, centre_y) in centres.items():
        node = graph.nodes[name]
        x, y = centre_x - widths[name] / 2, centre_y - BOX_HEIGHT / 2
        parts.append(
            f'<g class="node" id="node-{name}"><rect x="{x:.0f}" y="{y:.0f}" width="{widths[name]}" '
            f'height="{BOX_HEIGHT}" rx="8" fill="{fills[node.kind]}" stroke="#555"/>'
            f'<text x="{centre_x:.0f}" y="{y + 19:.0f}" text-anchor="middle" font-family="monospace" '
            f'font-size="13" font-weight="bold">{escape(name)}</text>'
            f'<text x="{centre_x:.0f}" y="{y + 36:.0f}" text-anchor="middle" font-family="sans-serif" '
            f'font-size="11" fill="#555">{escape(_label(graph, name))}</text></g>'
        )
    parts.append(
        f'<text x="{MARGIN}" y="{height - 10:.0f}" font-family="sans-serif" font-size="11" fill="#333">'
        "solid: forward pass; dashed red: gradient flowing back</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts)
