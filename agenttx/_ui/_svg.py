"""Drawing graphs and timelines as SVG text: pure, small value objects in, one `<svg>` out.

`draw_graph` lays out a directed graph in layers from left to right (a node's layer is the
longest path to it from a source; within a layer nodes keep the order given, then a few
barycentre sweeps reduce crossings) and draws each edge as a curve with an arrowhead. A node
may be drawn `beside` another (in its layer, right below it), as a rewound attempt beside the
attempt that replaced it. `draw_gantt` draws spans on an axis in seconds.

Every text is shown, never interpreted: XML-escaped, control characters and terminal escape
codes turned into visible characters (`\\x1b` is drawn `␛`), labels cut to `LABEL_CHARS`
and titles (the tooltips holding the full text) to `TITLE_CHARS`, before anything else is done
with them, so that a 10 MB string costs no more than a short one. Colours are presentation
attributes (`fill`, `stroke`), which a page's style sheet overrides through the classes each
element carries. The same input always gives the same text.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
from typing import TYPE_CHECKING, Final

import attrs

from .._errors import InvalidArgument
from .._render import STATUS_COLOURS

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "LABEL_CHARS",
    "TITLE_CHARS",
    "Link",
    "Node",
    "Span",
    "draw_gantt",
    "draw_graph",
    "escape",
    "visible",
]

#: The longest label drawn in a box (longer ones end with "…"; the title has the rest).
LABEL_CHARS: Final = 24
#: The longest title (tooltip) kept, in characters.
TITLE_CHARS: Final = 4096

_SVG_NS: Final = "http://www.w3.org/2000/svg"
_FONT: Final = 'font-family="sans-serif" font-size="12"'

# Boxes of a graph, and the gaps between them, in pixels.
_BOX_W: Final = 172
_BOX_H: Final = 40
_GAP_X: Final = 64  # between layers
_GAP_Y: Final = 22  # between blocks of a layer
_GAP_BESIDE: Final = 10  # between a node and those drawn beside it
_MARGIN: Final = 12
_SWEEPS: Final = 4  # barycentre sweeps (down and up, each)
_WAYPOINT_H: Final = 14  # the room a long edge takes in a layer it crosses
_WAYPOINTS_PER_NODE: Final = 4

# A Gantt chart.
_LABEL_W: Final = 190
_CHART_W: Final = 720
_ROW_H: Final = 22
_BAR_H: Final = 14
_AXIS_H: Final = 34

#: Fill colours of the states drawn (a page's style sheet overrides them by class).
_FILLS: Final = {
    **STATUS_COLOURS,
    "live": "#ffffff",
    "waiting_approval": "#fff3cd",
    "needs_review": "#fff3cd",
    "orphaned": "#e2e3e5",
}

_CLASS_TOKEN: Final = re.compile(r"[^A-Za-z0-9_-]+")
_DATA_NAME: Final = re.compile(r"[a-z][a-z0-9-]{0,40}")
_DATA_NAMES: Final = {"id", "node", "attempt"}  # names checked already


def _visible_table(*, keep_tabs: bool) -> dict[int, str]:
    table: dict[int, str] = {code: chr(0x2400 + code) for code in range(32)}
    table[0x7F] = "\u2421"  # ␡
    table.update({code: f"\\x{code:02x}" for code in range(0x80, 0xA0)})  # C1, CSI among them
    # Bidirectional overrides and isolates, which could reorder what is shown.
    table.update(
        {code: f"\\u{code:04x}" for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
    )
    table.update(dict.fromkeys(range(0xD800, 0xE000), "\ufffd"))  # lone surrogates
    table[0xFFFE] = table[0xFFFF] = "\ufffd"  # not characters in XML
    if keep_tabs:
        del table[0x09]
    return table


_VISIBLE: Final = _visible_table(keep_tabs=False)
_VISIBLE_TABS: Final = _visible_table(keep_tabs=True)
_MARKUP: Final = re.compile("[&<>\"']")
_XML: Final = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})


def visible(text: str, limit: int, *, lines: bool = False) -> str:
    """`text` cut to `limit` characters (ending with "…" if it was longer) with every control
    character, terminal escape and bidirectional override turned into visible text; newlines
    and tabs kept if `lines`. Not escaped for XML (see `escape`)."""
    cut = text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"
    if cut.isprintable():  # the common case, and quick: nothing to show otherwise
        return cut
    if lines:
        return "\n".join(_visible_line(line) for line in cut.split("\n"))
    return cut.translate(_VISIBLE)


def _visible_line(line: str) -> str:
    return line if line.isprintable() else line.translate(_VISIBLE_TABS)


def escape(text: str) -> str:
    """`text` escaped for XML text and for attribute values in double or single quotes."""
    if _MARKUP.search(text) is None:
        return text
    return text.translate(_XML)


def _label(text: str) -> str:
    return escape(visible(text, LABEL_CHARS))


def _title(text: str) -> str:
    return f"<title>{escape(visible(text, TITLE_CHARS, lines=True))}</title>" if text else ""


def _classes(*groups: Iterable[str]) -> str:
    """The class attribute's value: tokens with anything but letters, digits, `_` and `-`
    removed, empty ones dropped, each once, in order."""
    seen: dict[str, None] = {}
    for group in groups:
        for token in group:
            clean = _CLASS_TOKEN.sub("", token[:64])
            if clean:
                seen[clean] = None
    return " ".join(seen)


def _data(pairs: Iterable[tuple[str, str]]) -> str:
    parts = []
    for name, value in pairs:
        if name not in _DATA_NAMES:
            if not _DATA_NAME.fullmatch(name):
                raise InvalidArgument(f"not a data attribute name: {name[:60]!r}")
            _DATA_NAMES.add(name)
        parts.append(f' data-{name}="{escape(visible(value, TITLE_CHARS))}"')
    return "".join(parts)


def _tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class Node:
    """A node to draw: `key` names it among the graph's nodes; `label` is drawn in its box,
    `note` (its state, say) in small print below; `classes` go on its `<g>` after
    `node` (the first one is its state, which also picks its fill); `data` are its `data-*`
    attributes (name without `data-`, value); `beside`: the key of the node it is drawn
    beside, right below it in that node's layer (the latest given first)."""

    key: str
    label: str
    note: str = ""
    title: str = ""
    classes: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    data: tuple[tuple[str, str], ...] = ()
    beside: str | None = None


@attrs.frozen(kw_only=True)
class Link:
    """An edge from node `source` to node `target`; `classes` go on its `<path>` after `edge`;
    `dashed` draws it dashed, `dotted` dotted and faint; `layered`: it places `target` in a
    layer after `source` (an edge that does not, such as one to the node a node is drawn
    beside, is only drawn)."""

    source: str
    target: str
    classes: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    title: str = ""
    data: tuple[tuple[str, str], ...] = ()
    dashed: bool = False
    dotted: bool = False
    layered: bool = True


@attrs.frozen(kw_only=True)
class Span:
    """A bar of a Gantt chart from `start` to `end` (seconds on the chart's clock); `classes` go
    on its `<rect>` after `span` (the first is its state, which also picks its fill);
    `attempts`, each `(start, end)`, are drawn inside it as thinner `<rect class="attempt">`
    bars (when the node ran, as against waited)."""

    label: str
    start: float
    end: float
    title: str = ""
    classes: tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    data: tuple[tuple[str, str], ...] = ()
    attempts: tuple[tuple[float, float], ...] = ()


@attrs.frozen(kw_only=True)
class _Layout:
    """Where each node is (its box's top left corner), which layered links were dropped to
    break a cycle, the waypoints (left end, middle height) of the links that cross layers,
    and the size of the drawing."""

    places: dict[str, tuple[float, float, int]]  # key -> (x, y, layer)
    dropped: frozenset[tuple[str, str]]
    routes: dict[tuple[str, str], tuple[tuple[float, float], ...]]  # waypoints of long edges
    width: float
    height: float


def draw_graph(
    nodes: Sequence[Node], links: Sequence[Link], *, kind: str = "graph", caption: str = ""
) -> str:
    """One `<svg class="picture KIND">` (`caption` its `aria-label`): a `<g class="node ...">`
    per node (a box, its label and a title) and a `<path class="edge ...">` per link, curved,
    with an arrowhead, drawn under the nodes. Links naming an unknown node are left out, and
    so is a layered link that would close a cycle (the graph is drawn without it).
    `InvalidArgument` if two nodes share a key."""
    layout = _layout(nodes, links)
    places = layout.places
    out = [_open_svg(kind, layout.width, layout.height, caption), '<g class="edges">']
    for link in links:
        source, target = places.get(link.source), places.get(link.target)
        if source is None or target is None or link.source == link.target:
            continue
        if link.layered and (link.source, link.target) in layout.dropped:
            continue
        if link.dotted:
            dash = ' stroke="#999" stroke-dasharray="2 3"'
        else:
            dash = ' stroke="#555" stroke-dasharray="5 4"' if link.dashed else ' stroke="#555"'
        out.append(
            f'<path class="{_classes(("edge",), link.classes)}"'
            f' data-from="{escape(visible(link.source, TITLE_CHARS))}"'
            f' data-to="{escape(visible(link.target, TITLE_CHARS))}"{_data(link.data)}'
            f' d="{_edge_path(source, target, layout.routes.get((link.source, link.target)))}"'
            f' fill="none" stroke-width="1.3"{dash}>{_title(link.title)}</path>'
        )
    out.append('</g><g class="nodes">')
    for node in nodes:
        x, y, _layer = places[node.key]
        state = node.classes[0] if node.classes else ""
        fill = _FILLS.get(state, "#ffffff")
        marked = "root-cause" in node.classes
        stroke = ' stroke="#c62828" stroke-width="3"' if marked else ' stroke="#444"'
        out.append(
            f'<g class="{_classes(("node",), node.classes)}"{_data(node.data)}>'
            f"{_title(node.title)}"
            f'<rect class="box" x="{x:g}" y="{y:g}" width="{_BOX_W}" height="{_BOX_H}"'
            f' rx="5" fill="{fill}"{stroke}/>'
            f'<text class="label" x="{x + 8:g}" y="{y + 17:g}">{_label(node.label)}</text>'
            f'<text class="state" x="{x + 8:g}" y="{y + 32:g}" font-size="10" fill="#555">'
            f"{_label(node.note)}</text></g>"
        )
    out.append("</g></svg>")
    return "".join(out)


def _open_svg(kind: str, width: float, height: float, caption: str) -> str:
    w, h = math.ceil(width), math.ceil(height)
    label = f' aria-label="{escape(visible(caption, 200))}"' if caption else ""
    return (
        f'<svg xmlns="{_SVG_NS}" class="{_classes(("picture", kind))}" viewBox="0 0 {w} {h}"'
        f' width="{w}" height="{h}" role="img"{label} {_FONT}>'
    )


def _edge_path(
    source: tuple[float, float, int],
    target: tuple[float, float, int],
    waypoints: tuple[tuple[float, float], ...] | None = None,
) -> str:
    """A curve between two boxes, with a chevron arrowhead at the target: from the right side
    to the left side between layers (the reverse for a link going back), through the
    `waypoints` of the layers it crosses, if any; from the top or bottom side within a layer."""
    sx, sy, s_layer = source
    tx, ty, t_layer = target
    if s_layer == t_layer:
        x = sx + _BOX_W / 2
        x2 = tx + _BOX_W / 2
        if ty < sy:  # upwards
            y1, y2, sign = sy, ty + _BOX_H, -1.0
        else:
            y1, y2, sign = sy + _BOX_H, ty, 1.0
        bend = max(abs(y2 - y1) / 2, 8.0)
        head = f"M{x2 - 4:g} {y2 - 6 * sign:g}L{x2:g} {y2:g}L{x2 + 4:g} {y2 - 6 * sign:g}"
        return (
            f"M{x:g} {y1:g}C{x:g} {y1 + bend * sign:g} {x2:g} {y2 - bend * sign:g}"
            f" {x2:g} {y2:g}{head}"
        )
    forward = t_layer > s_layer
    x1 = sx + _BOX_W if forward else sx
    x2 = tx if forward else tx + _BOX_W
    y1, y2 = sy + _BOX_H / 2, ty + _BOX_H / 2
    sign = 1.0 if forward else -1.0
    path = [f"M{x1:g} {y1:g}"]
    if forward and waypoints:
        for wx, wy in waypoints:
            path.append(_curve(x1, y1, wx, wy))
            path.append(f"L{wx + _BOX_W:g} {wy:g}")
            x1, y1 = wx + _BOX_W, wy
    path.append(_curve(x1, y1, x2, y2))
    path.append(f"M{x2 - 7 * sign:g} {y2 - 4:g}L{x2:g} {y2:g}L{x2 - 7 * sign:g} {y2 + 4:g}")
    return "".join(path)


def _curve(x1: float, y1: float, x2: float, y2: float) -> str:
    """A cubic curve from (x1, y1) to (x2, y2), leaving and arriving horizontally."""
    bend = max(abs(x2 - x1) / 2, 16.0) * (1.0 if x2 >= x1 else -1.0)
    return f"C{x1 + bend:g} {y1:g} {x2 - bend:g} {y2:g} {x2:g} {y2:g}"


def _anchors(nodes: Sequence[Node], index: dict[str, int]) -> list[int]:
    """For each node, the index of the node it is drawn with: itself, or the end of its chain
    of `beside` (itself if the chain names an unknown node or goes round)."""
    anchor = list(range(len(nodes)))
    for i in range(len(nodes)):
        seen = {i}
        at = i
        while (beside := nodes[at].beside) is not None:
            nxt = index.get(beside)
            if nxt is None or nxt in seen:
                at = i
                break
            seen.add(nxt)
            at = nxt
        anchor[i] = at
    return anchor


def _layout(nodes: Sequence[Node], links: Sequence[Link]) -> _Layout:
    index: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if node.key in index:
            raise InvalidArgument(f"two nodes to draw share the key {node.key[:60]!r}")
        index[node.key] = i
    anchor = _anchors(nodes, index)
    succ: dict[int, list[int]] = {}
    pred: dict[int, list[int]] = {}
    pairs: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for link in links:
        if not link.layered:
            continue
        si, ti = index.get(link.source), index.get(link.target)
        if si is None or ti is None:
            continue
        a, b = anchor[si], anchor[ti]
        if a == b:
            continue
        if (a, b) not in pairs:
            succ.setdefault(a, []).append(b)
            pred.setdefault(b, []).append(a)
            pairs[(a, b)] = []
        pairs[(a, b)].append((link.source, link.target))
    layer, back = _layers([i for i in range(len(nodes)) if anchor[i] == i], succ, pred)
    dropped = frozenset(pair for edge in back for pair in pairs[edge])
    kept = [edge for edge in pairs if edge not in back]
    chains = _waypoints(kept, layer, len(nodes))
    order_pred: dict[int, list[int]] = {}
    order_succ: dict[int, list[int]] = {}
    for a, b in kept:
        route = [a, *chains.get((a, b), ()), b]
        for u, v in itertools.pairwise(route):
            order_succ.setdefault(u, []).append(v)
            order_pred.setdefault(v, []).append(u)
    columns: list[list[int]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for i in sorted(layer):
        columns[layer[i]].append(i)
    _sweep(columns, order_pred, order_succ)
    followers: dict[int, list[int]] = {}
    for i in range(len(nodes) - 1, -1, -1):
        if anchor[i] != i:
            followers.setdefault(anchor[i], []).append(i)
    places, points, tallest = _place(nodes, columns, followers)
    routes = {
        (nodes[a].key, nodes[b].key): tuple(points[w] for w in chain)
        for (a, b), chain in chains.items()
    }
    width = 2 * _MARGIN + len(columns) * _BOX_W + max(len(columns) - 1, 0) * _GAP_X
    height = 2 * _MARGIN + tallest
    return _Layout(places=places, dropped=dropped, routes=routes, width=width, height=height)


def _place(
    nodes: Sequence[Node], columns: list[list[int]], followers: dict[int, list[int]]
) -> tuple[dict[str, tuple[float, float, int]], dict[int, tuple[float, float]], float]:
    """Each node's box (top left corner, layer) and each waypoint's place, the columns
    centred on the tallest, whose height is returned too."""
    real = len(nodes)
    heights = []
    for column in columns:
        blocks = sum(a < real for a in column)
        members = sum(len(followers.get(a, ())) for a in column)
        heights.append(
            (blocks + members) * _BOX_H
            + max(blocks - 1, 0) * _GAP_Y
            + members * _GAP_BESIDE
            + (len(column) - blocks) * _WAYPOINT_H
        )
    tallest = max(heights, default=_BOX_H)
    places: dict[str, tuple[float, float, int]] = {}
    points: dict[int, tuple[float, float]] = {}
    for number, column in enumerate(columns):
        x = _MARGIN + number * (_BOX_W + _GAP_X)
        y = _MARGIN + (tallest - heights[number]) / 2
        for a in column:
            if a >= real:  # a waypoint of a long edge
                points[a] = (x, y + _WAYPOINT_H / 2)
                y += _WAYPOINT_H
                continue
            places[nodes[a].key] = (x, y, number)
            y += _BOX_H
            for f in followers.get(a, ()):
                y += _GAP_BESIDE
                places[nodes[f].key] = (x, y, number)
                y += _BOX_H
            y += _GAP_Y
    return places, points, tallest


def _waypoints(
    edges: list[tuple[int, int]], layer: dict[int, int], first: int
) -> dict[tuple[int, int], list[int]]:
    """For each edge spanning more than one layer, a waypoint in each layer it crosses (new
    ids from `first`, added to `layer`), which the ordering places like nodes so that the edge
    runs between boxes, not through them; none at all if they would be more than
    `_WAYPOINTS_PER_NODE` times the nodes (a graph of many long edges is drawn direct)."""
    long = [(a, b) for a, b in edges if layer[b] - layer[a] > 1]
    if sum(layer[b] - layer[a] - 1 for a, b in long) > _WAYPOINTS_PER_NODE * max(first, 1):
        return {}
    chains: dict[tuple[int, int], list[int]] = {}
    fresh = first
    for a, b in long:
        chain = []
        for number in range(layer[a] + 1, layer[b]):
            layer[fresh] = number
            chain.append(fresh)
            fresh += 1
        chains[(a, b)] = chain
    return chains


def _layers(
    roots: list[int], succ: dict[int, list[int]], pred: dict[int, list[int]]
) -> tuple[dict[int, int], set[tuple[int, int]]]:
    """Each node's layer (the longest path to it from a source), in a topological order that
    takes the first ready node first; a cycle is broken at its first node by dropping the
    edges into it from nodes not placed yet (returned)."""
    waiting = {i: len(pred.get(i, ())) for i in roots}
    ready = [i for i in roots if waiting[i] == 0]
    heapq.heapify(ready)
    layer: dict[int, int] = {}
    depth = dict.fromkeys(roots, 0)
    back: set[tuple[int, int]] = set()
    order = iter(roots)
    while len(layer) < len(roots):
        if ready:
            i = heapq.heappop(ready)
        else:  # a cycle: take the first node not placed yet, and drop the edges into it
            i = next(j for j in order if j not in layer)
            back.update((p, i) for p in pred.get(i, ()) if p not in layer)
        if i in layer:
            continue
        layer[i] = depth[i]
        for j in succ.get(i, ()):
            if j in layer:
                back.add((i, j))
                continue
            depth[j] = max(depth[j], depth[i] + 1)
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    return layer, back


def _sweep(
    columns: list[list[int]], pred: dict[int, list[int]], succ: dict[int, list[int]]
) -> None:
    """Reorder each column by the mean position of its neighbours in the column before (going
    down) or after (going up), a few times; nodes without such neighbours keep their place."""
    position = {i: p for column in columns for p, i in enumerate(column)}

    def reorder(column: list[int], neighbours: dict[int, list[int]]) -> None:
        keyed = []
        for i in column:
            around = neighbours.get(i)
            mean = sum(position[n] for n in around) / len(around) if around else float(position[i])
            keyed.append((mean, position[i], i))
        keyed.sort()
        column[:] = [i for _, _, i in keyed]
        position.update({i: p for p, i in enumerate(column)})

    for _ in range(_SWEEPS):
        for column in columns[1:]:
            reorder(column, pred)
        for column in reversed(columns[:-1]):
            reorder(column, succ)
    for column in columns[1:]:
        reorder(column, pred)


def draw_gantt(
    spans: Sequence[Span],
    *,
    origin: float | None = None,
    now_line: float | None = None,
    caption: str = "",
) -> str:
    """One `<svg class="picture gantt">` (`caption` its `aria-label`): a row per span in the
    order given, its label on the left and a `<rect class="span ...">` from its start to its
    end, on an axis in seconds from `origin` (`<g class="axis">`; the earliest start if it is
    later or not given); `now_line`, if given, is drawn as a line at that time. A span ending
    before it starts is drawn as a sliver at its start. Times must be finite, and their span
    too (`InvalidArgument`)."""
    times = [t for s in spans for t in (s.start, s.end)]
    times.extend(t for s in spans for pair in s.attempts for t in pair)
    times.extend(t for t in (origin, now_line) if t is not None)
    if not all(math.isfinite(t) for t in times):
        raise InvalidArgument("a time of the Gantt chart is not a finite number")
    first = min((s.start for s in spans), default=0.0 if origin is None else origin)
    origin = first if origin is None else min(origin, first)
    end = max((max(s.end, s.start) for s in spans), default=origin)
    if now_line is not None:
        end = max(end, now_line)
    total = end - origin if end - origin > 0 else 1.0
    if not math.isfinite(total):
        raise InvalidArgument("the times of the Gantt chart span more than a float holds")
    scale = _CHART_W / total
    width = _MARGIN + _LABEL_W + _CHART_W + 3 * _MARGIN
    height = _MARGIN + _AXIS_H + max(len(spans), 1) * _ROW_H + _MARGIN
    bottom = height - _MARGIN
    left = _MARGIN + _LABEL_W
    out = [_open_svg("gantt", width, height, caption), '<g class="axis">']
    step = _tick_step(total)
    count = int(total / step + 1e-9)
    for n in range(count + 1):
        seconds = n * step
        x = left + seconds * scale
        out.append(
            f'<line class="grid" x1="{x:.1f}" y1="{_MARGIN + _AXIS_H - 6}" x2="{x:.1f}"'
            f' y2="{bottom}" stroke="#ddd"/>'
            f'<text class="tick" x="{x:.1f}" y="{_MARGIN + _AXIS_H - 10}"'
            f' text-anchor="middle">{_seconds(seconds)}</text>'
        )
    out.append(f'<text class="axis-label" x="{left}" y="{_MARGIN + 8}">seconds</text></g>')
    if now_line is not None:
        x = left + (now_line - origin) * scale
        out.append(
            f'<line class="now" x1="{x:.1f}" y1="{_MARGIN + _AXIS_H - 6}" x2="{x:.1f}"'
            f' y2="{bottom}" stroke="#1565c0" stroke-dasharray="3 3"/>'
        )
    out.append('<g class="spans">')
    for row, span in enumerate(spans):
        y = _MARGIN + _AXIS_H + row * _ROW_H
        x = left + (span.start - origin) * scale
        w = max((span.end - span.start) * scale, 1.0)
        state = span.classes[0] if span.classes else ""
        stroke = (
            ' stroke="#c62828" stroke-width="2"'
            if "critical" in span.classes
            else (' stroke="#444"')
        )
        out.append(
            f'<text class="label" x="{left - 8}" y="{y + _ROW_H / 2 + 4:g}"'
            f' text-anchor="end">{_label(span.label)}</text>'
            f'<rect class="{_classes(("span",), span.classes)}"{_data(span.data)}'
            f' x="{x:.1f}" y="{y + (_ROW_H - _BAR_H) / 2:g}" width="{w:.1f}" height="{_BAR_H}"'
            f' fill="{_FILLS.get(state, "#ffffff")}"{stroke}>{_title(span.title)}</rect>'
        )
        for began, ended in span.attempts:
            out.append(
                f'<rect class="attempt" x="{left + (began - origin) * scale:.1f}"'
                f' y="{y + _ROW_H / 2 - 2:g}" width="{max((ended - began) * scale, 1.0):.1f}"'
                ' height="4" fill="#37474f" fill-opacity="0.5" pointer-events="none"/>'
            )
    out.append("</g></svg>")
    return "".join(out)


def _tick_step(total: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving at most 10 ticks over `total`."""
    raw = total / 10
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 5.0, 10.0):
        if factor * power >= raw:
            return factor * power
    return 10 * power  # pragma: no cover - the loop ends at 10, which is always enough


def _seconds(value: float) -> str:
    return f"{value:.6g}"
