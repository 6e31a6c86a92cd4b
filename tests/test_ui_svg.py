"""Drawing graphs and timelines as SVG (`agenttx._ui._svg`): layout, escaping, Gantt charts."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agenttx import InvalidArgument
from agenttx._ui._svg import (
    LABEL_CHARS,
    TITLE_CHARS,
    Link,
    Node,
    Span,
    draw_gantt,
    draw_graph,
    escape,
    visible,
)

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = [
    "<script>alert(1)</script>",
    "]]><x/>",
    "\"' onload='alert(1)'",
    "\x1b[31mred\x1b[0m and \x9b2J",
    "a\u202eevil",
    "lone \ud800 surrogate",
    "nul\x00 del\x7f",
]


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def _groups(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def _box(group: ET.Element) -> tuple[float, float]:
    rect = group.find(f"{SVG}rect")
    assert rect is not None
    return float(rect.get("x", "nan")), float(rect.get("y", "nan"))


def _view(root: ET.Element) -> tuple[float, float]:
    _, _, w, h = (float(v) for v in root.get("viewBox", "").split())
    return w, h


def test_visible_shows_control_characters_escape_codes_and_overrides_as_text():
    """Control characters, C1 codes (CSI among them), bidi overrides, lone surrogates and
    non-characters are drawn as visible text; printable text is left as it is."""
    assert visible("\x1b[31m", 100) == "␛[31m"
    assert visible("a\nb\tc\x00\x7f", 100) == "a␊b␉c␀␡"
    assert visible("\x9b2J", 100) == "\\x9b2J"
    assert visible("a\u202eb\u2066c", 100) == "a\\u202eb\\u2066c"
    assert visible("x\ud800y\uffff", 100) == "x\ufffdy\ufffd"
    assert visible("plain text, ünïcode ✓", 100) == "plain text, ünïcode ✓"


def test_visible_keeps_newlines_of_titles_and_cuts_before_anything_else():
    """With `lines` newlines and tabs stay (a title's lines); a long text is cut to the limit,
    ending with an ellipsis, so a 10 MB string is cut first."""
    assert visible("a\nb\tc\x1b", 100, lines=True) == "a\nb\tc␛"
    assert visible("x" * 10, 5) == "xxxx…"
    assert len(visible("\x1b" * 10_000_000, TITLE_CHARS)) == TITLE_CHARS


def test_escape_escapes_markup_and_quotes():
    """`<`, `>`, `&` and both quotes are escaped; other text is not touched."""
    assert (
        escape("<a href=\"x\">'&'</a>") == "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
    )
    assert escape("]]>") == "]]&gt;"
    assert escape("plain") == "plain"


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_labels_titles_and_data_are_text_in_well_formed_svg(text):
    """A label, title, data attribute, class or key holding markup, quotes, escape codes or
    bad characters is drawn as text: the SVG parses, holds no raw control character or tag
    from it, and the label reads as the visible form of the text."""
    node = Node(
        key=text,
        label=text,
        note=text,
        title=f"{text}\nsecond line",
        classes=(text, "failed"),
        data=(("id", text),),
    )
    other = Node(key="b", label="b", beside=text)
    svg = draw_graph(
        [node, other], [Link(source=text, target="b", title=text, data=(("x", text),))]
    )
    root = _parse(svg)
    assert "<script" not in svg
    assert "<x/>" not in svg
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", svg)
    group = _groups(root, "node")[0]
    label = group.find(f"{SVG}text")
    assert label is not None
    assert label.text == visible(text, LABEL_CHARS)
    title = group.find(f"{SVG}title")
    assert title is not None
    assert title.text == visible(f"{text}\nsecond line", TITLE_CHARS, lines=True)
    assert group.get("data-id") == visible(text, TITLE_CHARS)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", c) for c in (group.get("class") or "").split())
    assert "failed" in (group.get("class") or "").split()


def test_a_caption_is_the_pictures_escaped_aria_label():
    """`caption` becomes the `<svg>`'s `aria-label`, escaped and made visible, in a graph and in
    a Gantt chart; without one there is none."""
    caption = 'run "<script>"\x1b[2J'
    for svg in (draw_graph([], [], caption=caption), draw_gantt([], caption=caption)):
        assert _parse(svg).get("aria-label") == visible(caption, 200)
        assert "<script" not in svg
    assert _parse(draw_graph([], [])).get("aria-label") is None


def test_a_ten_megabyte_label_and_title_are_cut():
    """A 10 MB label is cut to `LABEL_CHARS`, its title to `TITLE_CHARS`, and the SVG stays
    small."""
    huge = "<" * 10_000_000
    svg = draw_graph([Node(key="k", label=huge, title=huge)], [])
    assert len(svg) < 50_000
    group = _groups(_parse(svg), "node")[0]
    title, label = group.find(f"{SVG}title"), group.find(f"{SVG}text")
    assert title is not None
    assert label is not None
    assert title.text is not None
    assert len(title.text) == TITLE_CHARS
    assert label.text == "<" * (LABEL_CHARS - 1) + "…"


def test_a_bad_data_attribute_name_is_refused():
    """A `data-*` name that is not lower-case letters, digits and hyphens is refused."""
    with pytest.raises(InvalidArgument, match="data attribute"):
        draw_graph([Node(key="k", label="k", data=(('x" onload="y', "v"),))], [])


def test_two_nodes_with_one_key_are_refused():
    """Node keys name nodes: two with the same key are refused with a typed error."""
    with pytest.raises(InvalidArgument, match="share the key"):
        draw_graph([Node(key="k", label="a"), Node(key="k", label="b")], [])


def test_one_node_and_no_nodes_draw_a_sized_svg():
    """One node draws one box inside the viewBox; no nodes draw an empty, valid SVG."""
    root = _parse(draw_graph([Node(key="k", label="only")], []))
    (group,) = _groups(root, "node")
    x, y = _box(group)
    w, h = _view(root)
    assert 0 < x < w
    assert 0 < y < h
    empty = _parse(draw_graph([], []))
    assert _groups(empty, "node") == []
    assert _view(empty)[0] > 0


def test_layers_follow_the_longest_path_from_a_source():
    """A node's layer is the longest path to it: a -> b -> c and a -> c put c two layers to the
    right of a; a node's edges all go to the right."""
    nodes = [Node(key=k, label=k) for k in "abc"]
    links = [
        Link(source="a", target="b"),
        Link(source="b", target="c"),
        Link(source="a", target="c"),
    ]
    root = _parse(draw_graph(nodes, links))
    xs = {g.get("data-node") or g.findtext(f"{SVG}text"): _box(g)[0] for g in _groups(root, "node")}
    assert xs["a"] < xs["b"] < xs["c"]
    assert len(_groups(root, "edge")) == 3


def test_an_edge_crossing_a_layer_runs_between_its_boxes_not_through_them():
    """a -> c beside a -> b -> c crosses b's layer: it runs through a waypoint of that layer
    (a straight stretch across it), above or below b's box, never through it."""
    nodes = [Node(key=k, label=k) for k in "abc"]
    links = [
        Link(source="a", target="b"),
        Link(source="b", target="c"),
        Link(source="a", target="c"),
    ]
    root = _parse(draw_graph(nodes, links))
    (long,) = [
        e for e in _groups(root, "edge") if (e.get("data-from"), e.get("data-to")) == ("a", "c")
    ]
    across = re.search(r"L([\d.]+) ([\d.]+)", long.get("d") or "")
    assert across is not None
    b = next(g for g in _groups(root, "node") if g.findtext(f"{SVG}text") == "b")
    bx, by = _box(b)
    assert float(across.group(1)) == bx + 172
    assert not by <= float(across.group(2)) <= by + 40


def test_disconnected_parts_and_isolated_nodes_all_drawn_inside_the_view():
    """Disconnected parts are drawn side by side in their layers, every box inside the
    viewBox, no two boxes at the same place."""
    nodes = [Node(key=str(i), label=str(i)) for i in range(7)]
    links = [
        Link(source="0", target="1"),
        Link(source="2", target="3"),
        Link(source="3", target="4"),
    ]
    root = _parse(draw_graph(nodes, links))
    w, h = _view(root)
    places = [_box(g) for g in _groups(root, "node")]
    assert len(set(places)) == 7
    assert all(0 <= x <= w and 0 <= y <= h for x, y in places)


@pytest.mark.timeout(30)
def test_a_cycle_is_drawn_without_the_edge_that_closes_it():
    """Malformed input with a cycle does not hang: the graph is drawn without the edge that
    closes the cycle (the one into its first node), and with the others."""
    nodes = [Node(key=k, label=k) for k in "abc"]
    links = [
        Link(source="a", target="b"),
        Link(source="b", target="c"),
        Link(source="c", target="a"),
    ]
    root = _parse(draw_graph(nodes, links))
    drawn = {(p.get("data-from"), p.get("data-to")) for p in _groups(root, "edge")}
    assert drawn == {("a", "b"), ("b", "c")}
    assert len(_groups(root, "node")) == 3


def test_links_to_unknown_nodes_and_self_loops_are_left_out():
    """A link naming a node not drawn, or a node itself, is not drawn."""
    svg = draw_graph(
        [Node(key="a", label="a")], [Link(source="a", target="zz"), Link(source="a", target="a")]
    )
    assert _groups(_parse(svg), "edge") == []


def test_a_node_beside_another_is_drawn_right_below_it_in_its_layer():
    """`beside` puts a node in the layer of the node named, right below it (the latest given
    first), whatever its own links; a link between them is drawn without moving either."""
    nodes = [
        Node(key="old1", label="old1", beside="old2"),
        Node(key="src", label="src"),
        Node(key="old2", label="old2", beside="new"),
        Node(key="new", label="new"),
    ]
    links = [
        Link(source="src", target="new"),
        Link(source="old1", target="old2", layered=False, classes=("replaced",)),
        Link(source="old2", target="new", layered=False, classes=("replaced",)),
    ]
    root = _parse(draw_graph(nodes, links))
    at = {g.findtext(f"{SVG}text"): _box(g) for g in _groups(root, "node")}
    assert at["new"][0] == at["old2"][0] == at["old1"][0] > at["src"][0]
    assert at["new"][1] < at["old2"][1] < at["old1"][1]
    assert len(_groups(root, "replaced")) == 2


def test_a_beside_chain_that_goes_round_is_ignored():
    """`beside` naming an unknown node, or going round, leaves the node in its own place."""
    nodes = [
        Node(key="a", label="a", beside="b"),
        Node(key="b", label="b", beside="a"),
        Node(key="c", label="c", beside="nowhere"),
    ]
    root = _parse(draw_graph(nodes, []))
    assert len({_box(g) for g in _groups(root, "node")}) == 3


def test_implicit_links_are_dashed_and_every_edge_has_an_arrowhead():
    """A dashed link gets a dash array; every edge's path ends with an arrowhead (a second
    sub-path)."""
    nodes = [Node(key=k, label=k) for k in "ab"]
    root = _parse(
        draw_graph(
            nodes,
            [
                Link(source="a", target="b", classes=("implicit",), dashed=True),
                Link(source="a", target="b", classes=("explicit",)),
            ],
        )
    )
    implicit, explicit = _groups(root, "edge")
    assert implicit.get("stroke-dasharray")
    assert explicit.get("stroke-dasharray") is None
    assert all((p.get("d") or "").count("M") == 2 for p in (implicit, explicit))


def test_barycentre_sweeps_untangle_a_crossing():
    """Two chains given crosswise (a->d, b->c, with c listed before d) are drawn without
    their edges crossing: c ends beside a's row order, d beside b's."""
    nodes = [Node(key=k, label=k) for k in "abcd"]
    links = [Link(source="a", target="d"), Link(source="b", target="c")]
    root = _parse(draw_graph(nodes, links))
    at = {g.findtext(f"{SVG}text"): _box(g) for g in _groups(root, "node")}
    assert (at["a"][1] < at["b"][1]) == (at["d"][1] < at["c"][1])


@given(
    st.integers(min_value=1, max_value=12).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n),
        )
    )
)
def test_the_same_input_draws_the_same_svg_and_every_box_fits(case):
    """Any graph (cycles and self-loops included) draws deterministically, every box inside the
    viewBox, no two at the same place, and forward edges only."""
    n, pairs = case
    nodes = [Node(key=str(i), label=f"#{i}") for i in range(n)]
    links = [Link(source=str(a), target=str(b)) for a, b in pairs]
    svg = draw_graph(nodes, links)
    assert svg == draw_graph(nodes, links)
    root = _parse(svg)
    w, h = _view(root)
    places = {g.findtext(f"{SVG}text"): _box(g) for g in _groups(root, "node")}
    assert len(set(places.values())) == n
    assert all(x >= 0 and x + 172 <= w and 0 <= y <= h for x, y in places.values())
    for edge in _groups(root, "edge"):
        source, target = edge.get("data-from"), edge.get("data-to")
        assert places[f"#{source}"][0] < places[f"#{target}"][0]


# ---------------------------------------------------------------- Gantt


def _spans(root: ET.Element) -> dict[str, ET.Element]:
    return {r.get("data-id", ""): r for r in _groups(root, "span")}


def test_gantt_places_spans_in_proportion_on_an_axis_in_seconds():
    """Each span's bar starts and ends in proportion to its times from the origin; the axis
    ticks are round seconds and say so."""
    spans = [
        Span(label="a", start=100.0, end=102.0, classes=("succeeded",), data=(("id", "a"),)),
        Span(
            label="b", start=102.0, end=110.0, classes=("running", "critical"), data=(("id", "b"),)
        ),
    ]
    root = _parse(draw_gantt(spans, origin=100.0))
    bars = _spans(root)
    ax, aw = float(bars["a"].get("x", "")), float(bars["a"].get("width", ""))
    bx, bw = float(bars["b"].get("x", "")), float(bars["b"].get("width", ""))
    assert ax + aw == pytest.approx(bx, abs=0.2)
    assert bw == pytest.approx(4 * aw, rel=0.01)
    assert "critical" in (bars["b"].get("class") or "").split()
    axis = _groups(root, "axis")[0]
    ticks = [t.text for t in _groups(axis, "tick")]
    assert ticks[:3] == ["0", "1", "2"]
    assert "seconds" in "".join(axis.itertext())


def test_gantt_of_nothing_and_of_zero_length_spans_is_valid():
    """No spans draw an axis and no bars; a span of no length (or ending before it starts)
    is a sliver at its start, not a negative width."""
    assert _spans(_parse(draw_gantt([]))) == {}
    root = _parse(
        draw_gantt([Span(label="x", start=5.0, end=3.0, data=(("id", "x"),))], now_line=6.0)
    )
    assert float(_spans(root)["x"].get("width", "")) >= 1.0
    assert _groups(root, "now")


def test_gantt_refuses_times_that_are_not_finite():
    """A NaN or infinite time is refused with a typed error, not drawn off the chart."""
    with pytest.raises(InvalidArgument, match="finite"):
        draw_gantt([Span(label="x", start=0.0, end=float("inf"))])
    with pytest.raises(InvalidArgument, match="finite"):
        draw_gantt([], now_line=float("nan"))


def test_gantt_escapes_hostile_labels_and_titles():
    """A span's label and title are text, escaped and made visible."""
    svg = draw_gantt([Span(label=HOSTILE[0], start=0.0, end=1.0, title=HOSTILE[3])])
    assert "<script" not in svg
    assert "\x1b" not in svg
    _parse(svg)
