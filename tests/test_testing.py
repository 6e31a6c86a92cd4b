"""agenttx.testing: the strategies produce what they promise, and the checker catches breakage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

import agenttx
from agenttx import Dependency, Edge, EdgeKind
from agenttx._graph import _Link
from agenttx._json import check_json
from agenttx.testing import (
    StepSpec,
    build_graph,
    check_graph_invariants,
    json_values,
    step_sequences,
)


@given(json_values())
def test_json_values_are_json(value):
    """Every generated value passes agenttx's own JSON check."""
    assert check_json(value) is value


@given(step_sequences(min_steps=3, max_steps=5))
def test_step_sequences_are_numbered_from_one(steps):
    """Steps are numbered 1..n with the requested length."""
    assert 3 <= len(steps) <= 5
    assert [step.step_id for step in steps] == list(range(1, len(steps) + 1))
    assert all(isinstance(step, StepSpec) for step in steps)


def test_step_sequences_exercise_every_kind_of_edge():
    """Across examples, sequences produce explicit edges, implicit edges and failed references."""
    seen: set[str] = set()

    @settings(max_examples=200, database=None)
    @given(step_sequences())
    def collect(steps):
        graph = build_graph(steps)
        seen.update(edge.kind.value for edge in graph.edges())
        if any(not graph.node(s.step_id).output_leaves for s in steps):  # type: ignore[union-attr]
            seen.add("failed")

    collect()
    assert seen >= {"explicit", "implicit", "failed"}


@given(step_sequences(keys=["k"], values=["v"], tools=["only"]))
def test_step_sequences_take_custom_pools(steps):
    """Custom keys, values and tools are the only ones used."""
    for step in steps:
        assert step.tool_name == "only"
        assert set(step.output) <= {"k"}  # type: ignore[arg-type]


def test_build_graph_follows_the_transaction_pipeline():
    """Resolved steps get outputs; a step whose reference fails keeps its partial dependencies."""
    steps = [
        StepSpec(step_id=1, tool_name="a", arguments={}, output={"id": "x"}),
        StepSpec(step_id=2, tool_name="b", arguments={"u": "${steps.1.id}"}, output={"v": 1}),
        StepSpec(
            step_id=3,
            tool_name="c",
            arguments={"a": "${steps.2.v}", "b": "${steps.2.missing}"},
            output={"w": 2},
        ),
    ]
    graph = build_graph(steps)
    assert graph.node(2).output_leaves == (("v", 1),)  # type: ignore[union-attr]
    assert graph.node(3).output_leaves == ()  # type: ignore[union-attr]
    assert [(e.source, e.source_key, e.target_key) for e in graph.dependencies_of(3)] == [
        (2, "v", "a"),
        (2, "missing", "missing"),
    ]


def _seed():
    return build_graph(
        [
            StepSpec(step_id=1, tool_name="a", arguments={}, output={"id": "x"}),
            StepSpec(step_id=2, tool_name="b", arguments={"id": "x"}, output={"id": "y"}),
        ]
    )


def _inject(graph, edge):
    """Corrupt the graph behind its API, as a bug in agenttx would."""
    link = _Link(edge, edge.source_key.lower(), edge.target_key.lower())
    graph._graph.add_edge(graph._nodes[edge.source].index, graph._nodes[edge.target].index, link)


def test_checker_accepts_a_sound_graph():
    """A graph built through the API passes."""
    check_graph_invariants(_seed())


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            Edge(source=2, target=1, source_key="id", target_key="id", kind=EdgeKind.EXPLICIT),
            "earlier to a later",
        ),
        (
            Edge(source=1, target=2, source_key="id", target_key="id", kind=EdgeKind.IMPLICIT),
            "recorded twice",
        ),
        (
            Edge(source=1, target=2, source_key="id", target_key="zz", kind=EdgeKind.IMPLICIT),
            "differs from one rebuilt",
        ),
    ],
)
def test_checker_catches_corruption(bad, message):
    """Backwards, duplicated and unexplained edges are each reported."""
    graph = _seed()
    _inject(graph, bad)
    with pytest.raises(AssertionError, match=message):
        check_graph_invariants(graph)


def test_checker_catches_implicit_edges_on_explicit_inputs():
    """An implicit edge into an input an explicit dependency covers is reported."""
    graph = agenttx.DependencyGraph()
    graph.add_step(1, "a", {})
    graph.record_output(1, {"id": "x"})
    graph.add_step(2, "b", {"id": "x"}, [Dependency(from_step=1, source_key="id", target_key="id")])
    _inject(
        graph, Edge(source=1, target=2, source_key="id", target_key="id", kind=EdgeKind.IMPLICIT)
    )
    with pytest.raises(AssertionError, match="duplicates an explicit"):
        check_graph_invariants(graph)


def test_checker_catches_dangling_edges():
    """An edge whose end is not a step of the graph is reported."""
    graph = _seed()
    graph._nodes.pop(2)  # the rustworkx node stays: its edge now dangles
    with pytest.raises(AssertionError, match="not a step"):
        check_graph_invariants(graph)


def test_checker_catches_a_stale_index():
    """A graph whose value index kept a truncated producer fails the rebuild comparison."""
    graph = _seed()
    stale = {key: list(producers) for key, producers in graph._index.items()}
    graph.truncate_from(2)
    graph._index = stale  # still says step 2 output {"id": "y"}
    graph.add_step(2, "b", {})
    graph.add_step(3, "c", {"id": "y"})
    with pytest.raises(AssertionError, match="differs"):
        check_graph_invariants(graph)
