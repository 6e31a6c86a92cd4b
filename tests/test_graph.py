"""The dependency graph: explicit and implicit edges, root causes, truncation and export."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import agenttx
from agenttx import Dependency, DependencyGraph, Edge, EdgeKind, resolve_references
from agenttx._json import scalar_leaves
from agenttx.testing import build_graph, check_graph_invariants, step_sequences

EXPLICIT = EdgeKind.EXPLICIT
IMPLICIT = EdgeKind.IMPLICIT


def edge(source, target, source_key, target_key, kind=IMPLICIT):
    return Edge(
        source=source, target=target, source_key=source_key, target_key=target_key, kind=kind
    )


def dep(from_step, source_key, target_key):
    return Dependency(from_step=from_step, source_key=source_key, target_key=target_key)


def chain(*steps):
    """A graph from (step, inputs, output, explicit deps) tuples, outputs recorded."""
    graph = DependencyGraph()
    for step_id, inputs, output, explicit in steps:
        graph.add_step(step_id, f"tool{step_id}", inputs, explicit)
        if output is not None:
            graph.record_output(step_id, output)
    return graph


def seed_graph():
    """The seed example: 2 create_user -> 5 lookup_owner -> 9 insert_order."""
    return chain(
        (2, {"name": "Ada"}, {"id": "u-7"}, ()),
        (5, {"user": "u-7"}, {"owner_id": "u-7"}, (dep(2, "id", "user"),)),
        (9, {"user_id": "u-7"}, None, (dep(5, "owner_id", "user_id"),)),
    )


# ---------------------------------------------------------------- root cause (documented examples)


def test_seed_example_root_cause_is_the_step_that_created_the_user():
    """find_root_cause(9, 'user_id') follows owner_id -> user -> id back to step 2."""
    graph = seed_graph()
    assert graph.find_root_cause(9, "user_id") == 2


def test_renames_example():
    """The documented rename example: case-insensitive key, unknown key and unknown step."""
    graph = chain(
        (1, {}, {"id": 101}, ()),
        (2, {"user": 101}, {"owner_id": 101}, (dep(1, "id", "user"),)),
        (4, {"user_id": 101}, None, (dep(2, "owner_id", "user_id"),)),
    )
    assert graph.find_root_cause(4, "user_id") == 1
    assert graph.find_root_cause(4, "USER_ID") == 1
    assert graph.find_root_cause(4, "other") is None
    assert graph.find_root_cause(99, "user_id") is None


def test_pass_through_chain_example():
    """Step 3 links only to step 2, yet the pass-through leads the walk to step 1."""
    graph = chain(
        (1, {}, {"k": "v"}, ()),
        (2, {"k": "v"}, {"k": "v"}, ()),
        (3, {"k": "v"}, None, ()),
    )
    assert graph.dependencies_of(3) == (edge(2, 3, "k", "k"),)
    assert graph.find_root_cause(3, "k") == 1


def test_numeric_chain_example():
    """Step k takes v=k-1 and outputs v=k; the walk from 4 ends at 1."""
    graph = chain(*((k, {"v": k - 1}, {"v": k}, ()) for k in range(1, 5)))
    assert graph.find_root_cause(4, "v") == 1


def test_root_cause_is_the_earliest_of_several_producers():
    """With two producers carrying the key, the minimum step wins."""
    graph = chain(
        (1, {}, {"sku": "s-1"}, ()),
        (2, {}, {"sku": "s-2"}, ()),
        (3, {"a": "${x}", "b": "${y}"}, None, (dep(1, "sku", "sku"), dep(2, "sku", "sku"))),
    )
    assert graph.find_root_cause(3, "sku") == 1


def test_root_cause_is_none_for_a_key_no_edge_carries():
    """A failed step with no matching incoming edge has no root cause."""
    graph = chain((1, {}, {"id": 1}, ()), (2, {"note": "x"}, None, ()))
    assert graph.find_root_cause(2, "id") is None


# ---------------------------------------------------------------- explicit edges


def test_explicit_edges_come_first_in_the_order_given():
    """add_step returns explicit edges as given (duplicates kept), then implicit ones."""
    graph = chain((1, {}, {"id": "a", "sku": "s"}, ()))
    edges = graph.add_step(
        2,
        "t",
        {"x": "a", "y": "a", "sku": "s"},
        (dep(1, "id", "y"), dep(1, "id", "x"), dep(1, "id", "x")),
    )
    assert edges == (
        edge(1, 2, "id", "y", EXPLICIT),
        edge(1, 2, "id", "x", EXPLICIT),
        edge(1, 2, "id", "x", EXPLICIT),
        edge(1, 2, "sku", "sku"),
    )


def test_explicit_dependencies_on_unknown_or_later_steps_are_dropped():
    """Only dependencies on existing earlier steps become edges."""
    graph = chain((1, {}, {"id": 1}, ()), (3, {}, {"id": 3}, ()))
    edges = graph.add_step(
        2, "t", {"a": 1}, (dep(1, "id", "a"), dep(7, "id", "b"), dep(2, "id", "c"))
    )
    assert edges == (edge(1, 2, "id", "a", EXPLICIT),)


def test_dropped_explicit_dependencies_still_block_implicit_links():
    """An input covered by any explicit dependency, kept or dropped, is not linked implicitly."""
    graph = chain((1, {}, {"user_id": "u"}, ()))
    edges = graph.add_step(2, "t", {"user_id": "u"}, (dep(9, "id", "user_id"),))
    assert edges == ()


# ---------------------------------------------------------------- implicit edges


def test_implicit_link_by_equal_key_ignoring_ascii_case():
    """`User_ID` in an output links to `user_id` in a later input with the same value."""
    graph = chain((1, {}, {"User_ID": "u-1"}, ()))
    assert graph.add_step(2, "t", {"user_id": "u-1"}) == (edge(1, 2, "User_ID", "user_id"),)


def test_implicit_link_by_underscore_suffix_is_one_directional():
    """Input `user_id` links to output `id`; input `id` does not link to output `user_id`."""
    graph = chain((1, {}, {"id": "u-1"}, ()), (2, {}, {"user_id": "u-2"}, ()))
    assert graph.add_step(3, "t", {"user_id": "u-1"}) == (edge(1, 3, "id", "user_id"),)
    assert graph.add_step(4, "t", {"id": "u-2"}) == ()


def test_suffix_needs_an_underscore_boundary():
    """`userid` does not link to `id`, and `a__id` links to `_id` and `id`."""
    graph = chain((1, {}, {"id": 5}, ()))
    assert graph.add_step(2, "t", {"userid": 5}) == ()
    assert graph.add_step(3, "t", {"a__id": 5}) == (edge(1, 3, "id", "a__id"),)


def test_non_ascii_case_is_not_folded():
    """Keys compare ignoring ASCII case only: `ÉTAT` does not link to `état`."""
    graph = chain((1, {}, {"état": "x"}, ()))
    assert graph.add_step(2, "t", {"ÉTAT": "x"}) == ()
    assert graph.add_step(3, "t", {"éTAT": "x"}) == (edge(1, 3, "état", "éTAT"),)


@pytest.mark.parametrize("value", [True, False, None, ""])
def test_unlinkable_values_never_link(value):
    """Booleans, null and the empty string never create implicit edges."""
    graph = chain((1, {}, {"id": value}, ()))
    assert graph.add_step(2, "t", {"id": value}) == ()


@pytest.mark.parametrize("value", ["u-1", 0, 7, -3, 2.5, 10**30])
def test_numbers_and_non_empty_strings_link(value):
    """Any number and any non-empty string can link."""
    graph = chain((1, {}, {"id": value}, ()))
    assert graph.add_step(2, "t", {"id": value}) == (edge(1, 2, "id", "id"),)


@pytest.mark.parametrize(("produced", "consumed"), [(7, 7.0), (7, "7"), (1, True), (7.0, 7)])
def test_equality_is_strict_json_equality(produced, consumed):
    """7, 7.0, '7' and true are different values: no link between them."""
    graph = chain((1, {}, {"id": produced}, ()))
    assert graph.add_step(2, "t", {"id": consumed}) == ()


def test_negative_zero_equals_zero():
    """0.0 and -0.0 are equal JSON numbers."""
    graph = chain((1, {}, {"id": -0.0}, ()))
    assert graph.add_step(2, "t", {"id": 0.0}) == (edge(1, 2, "id", "id"),)


def test_most_recent_producer_wins():
    """Of two earlier producers of the value, the later one is linked, and only it."""
    graph = chain((1, {}, {"id": "x"}, ()), (2, {}, {"id": "x"}, ()), (3, {}, {"other": 1}, ()))
    assert graph.add_step(4, "t", {"id": "x"}) == (edge(2, 4, "id", "id"),)


def test_a_more_recent_producer_with_a_non_linking_key_is_skipped():
    """The most recent producer must also have a linking key; otherwise search further back."""
    graph = chain((1, {}, {"id": "x"}, ()), (2, {}, {"name": "x"}, ()))
    assert graph.add_step(3, "t", {"user_id": "x"}) == (edge(1, 3, "id", "user_id"),)


def test_first_matching_leaf_of_the_producer_is_used():
    """Within the producer, the first leaf in leaf order (sorted keys) that matches wins."""
    graph = chain((1, {}, {"z": {"id": "x"}, "a": {"user_id": "x"}}, ()))
    assert graph.add_step(2, "t", {"user_id": "x"}) == (edge(1, 2, "user_id", "user_id"),)


def test_implicit_edges_are_deduplicated():
    """The same (source, source key, input key) is linked once, however often it recurs."""
    graph = chain((1, {}, {"id": "x"}, ()))
    edges = graph.add_step(2, "t", {"id": ["x", "x"], "nested": {"id": "x"}})
    assert edges == (edge(1, 2, "id", "id"),)


def test_nested_leaves_link_by_their_own_key():
    """Only the leaf key counts: `{"fields": {"user_id": 1}}` links as `user_id`."""
    graph = chain((1, {}, {"result": {"id": 41}}, ()))
    assert graph.add_step(2, "t", {"fields": {"user_id": 41}}) == (edge(1, 2, "id", "user_id"),)


def test_top_level_scalars_never_link():
    """A bare scalar has the key '' and links to nothing, in either direction."""
    graph = chain((1, {}, "u-1", ()), (2, {}, {"id": "u-2"}, ()))
    assert graph.add_step(3, "t", {"id": "u-1"}) == ()
    assert graph.add_step(4, "t", "u-2") == ()


def test_steps_without_output_produce_nothing():
    """A step whose output was never recorded (it failed) is not a producer."""
    graph = chain((1, {}, None, ()))
    graph.add_step(2, "t", {"id": "x"})
    assert graph.add_step(3, "t", {"id": "x"}) == ()


# ---------------------------------------------------------------- changing the graph


def test_adding_an_existing_step_replaces_it_and_everything_after():
    """Re-adding step 2 drops old steps 2 and 3 with their edges."""
    graph = chain(
        (1, {}, {"id": "x"}, ()), (2, {"id": "x"}, {"id": "y"}, ()), (3, {"id": "y"}, None, ())
    )
    graph.add_step(2, "again", {"other": 1})
    assert graph.steps() == (1, 2)
    assert graph.tool_of(2) == "again"
    assert graph.edges() == ()


def test_adding_a_lower_step_drops_the_higher_ones():
    """Steps stay ascending: adding step 2 when 3 exists removes 3."""
    graph = chain((1, {}, {"id": "x"}, ()), (3, {"id": "x"}, None, ()))
    graph.add_step(2, "t", {})
    assert graph.steps() == (1, 2)


def test_record_output_replaces_the_previous_output():
    """A re-recorded output replaces the old leaves in the value index."""
    graph = chain((1, {}, {"id": "old"}, ()))
    graph.record_output(1, {"id": "new"})
    assert graph.add_step(2, "t", {"id": "old"}) == ()
    assert graph.add_step(3, "t", {"id": "new"}) == (edge(1, 3, "id", "id"),)


def test_re_recording_an_earlier_output_keeps_producers_in_step_order():
    """Re-recording step 1's output after step 2 leaves step 2 the most recent producer."""
    graph = chain((1, {}, {"id": "x"}, ()), (2, {}, {"id": "x"}, ()))
    graph.record_output(1, {"id": "x"})
    assert graph.add_step(3, "t", {"id": "x"}) == (edge(2, 3, "id", "id"),)
    graph.truncate_from(2)
    assert graph.add_step(2, "t", {"id": "x"}) == (edge(1, 2, "id", "id"),)


def test_truncate_removes_the_step_and_later_and_their_index_entries():
    """After truncate_from(2), values only step 2 produced no longer link."""
    graph = chain((1, {}, {"id": "a"}, ()), (2, {}, {"id": "b"}, ()), (3, {"id": "a"}, None, ()))
    graph.truncate_from(2)
    assert graph.steps() == (1,)
    assert graph.add_step(2, "t", {"id": "b"}) == ()
    assert graph.add_step(3, "t", {"id": "a"}) == (edge(1, 3, "id", "id"),)


def test_truncate_beyond_the_last_step_does_nothing():
    """truncate_from a step above every step leaves the graph as it was."""
    graph = seed_graph()
    before = (graph.steps(), graph.edges())
    graph.truncate_from(10)
    assert (graph.steps(), graph.edges()) == before


def test_clear_empties_the_graph():
    """clear() removes every step, edge and index entry."""
    graph = seed_graph()
    graph.clear()
    assert (len(graph), graph.edges(), graph.nodes()) == (0, (), ())
    graph.add_step(1, "t", {})
    assert graph.add_step(2, "t", {"id": "u-7"}) == ()


def test_repeated_output_leaves_unindex_cleanly():
    """An output repeating a value under the same key is indexed once and removed once."""
    graph = chain((1, {}, {"id": "x"}, ()), (2, {}, {"id": ["x", "x"], "ID": "x"}, ()))
    graph.truncate_from(2)
    assert graph.add_step(2, "t", {"id": "x"}) == (edge(1, 2, "id", "id"),)


# ---------------------------------------------------------------- queries


def test_dependencies_and_dependents():
    """dependencies_of sorts by (source, target key); dependents_of is sorted and unique."""
    graph = chain(
        (1, {}, {"id": "a", "sku": "s"}, ()),
        (2, {}, {"id": "b"}, ()),
        (3, {"sku": "s", "user_id": "a", "id": "b"}, None, ()),
    )
    assert graph.dependencies_of(3) == (
        edge(1, 3, "sku", "sku"),
        edge(1, 3, "id", "user_id"),
        edge(2, 3, "id", "id"),
    )
    assert graph.dependents_of(1) == (3,)
    assert graph.dependents_of(3) == ()
    assert graph.dependencies_of(42) == ()
    assert graph.dependents_of(42) == ()


def test_nodes_hold_leaves_and_explicit_dependencies():
    """A node records its tool, its leaves and the dependencies it was given."""
    graph = seed_graph()
    node = graph.node(5)
    assert node is not None
    assert node.tool_name == "tool5"
    assert node.input_leaves == (("user", "u-7"),)
    assert node.output_leaves == (("owner_id", "u-7"),)
    assert node.explicit == (dep(2, "id", "user"),)
    assert graph.node(3) is None
    assert graph.tool_of(3) is None
    assert 5 in graph
    assert 3 not in graph


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("step_id", [0, -1, True, "1", 1.0, None])
def test_bad_step_ids_are_refused(step_id):
    """Step ids are integers >= 1; anything else is an InvalidArgument naming it."""
    graph = DependencyGraph()
    with pytest.raises(agenttx.InvalidArgument, match="step id must be an integer"):
        graph.add_step(step_id, "t", {})


def test_bad_input_leaves_the_graph_exactly_as_it_was():
    """A refused add_step neither truncates later steps nor adds anything."""
    graph = seed_graph()
    before = (graph.nodes(), graph.edges())
    with pytest.raises(agenttx.JSONValueError, match=r"inputs of step 5"):
        graph.add_step(5, "t", {"bad": {1, 2}})
    with pytest.raises(agenttx.InvalidArgument, match="Dependency objects"):
        graph.add_step(5, "t", {}, [("2", "id", "user")])  # type: ignore[list-item]
    with pytest.raises(agenttx.InvalidArgument, match="tool name"):
        graph.add_step(5, 7, {})  # type: ignore[arg-type]
    assert (graph.nodes(), graph.edges()) == before
    assert graph.find_root_cause(9, "user_id") == 2


def test_bad_output_is_refused_and_the_old_output_kept():
    """record_output refuses a non-JSON output and an unknown step, changing nothing."""
    graph = seed_graph()
    with pytest.raises(agenttx.JSONValueError, match="output of step 2"):
        graph.record_output(2, {"id": float("nan")})
    with pytest.raises(agenttx.InvalidArgument, match="step 3"):
        graph.record_output(3, {})
    assert graph.node(2).output_leaves == (("id", "u-7"),)  # type: ignore[union-attr]


# ---------------------------------------------------------------- export


def test_to_dot_snapshot():
    """DOT export is deterministic; implicit edges are dashed; labels are quoted."""
    graph = chain(
        (1, {}, {"id": "u"}, ()), (2, {"user_id": "u", "x": "y"}, None, (dep(1, "id", "x"),))
    )
    graph.add_step(3, 'say "hi"', {})
    assert graph.to_dot() == (
        "digraph agenttx {\n"
        "  rankdir=LR;\n"
        "  node [shape=box];\n"
        '  s1 [label="1: tool1"];\n'
        '  s2 [label="2: tool2"];\n'
        '  s3 [label="3: say \\"hi\\""];\n'
        '  s1 -> s2 [label="id -> x"];\n'
        '  s1 -> s2 [label="id -> user_id", style=dashed];\n'
        "}\n"
    )


def test_to_mermaid_snapshot():
    """Mermaid export is deterministic; implicit edges are dotted; quotes are escaped."""
    graph = chain((1, {}, {"id": "u"}, ()), (2, {"id": "u"}, None, ()))
    graph.add_step(3, 'a "b"', {})
    assert graph.to_mermaid() == (
        "flowchart LR\n"
        '  s1["1: tool1"]\n'
        '  s2["2: tool2"]\n'
        '  s3["3: a #quot;b#quot;"]\n'
        '  s1 -.->|"id"| s2\n'
    )


def test_to_json_snapshot():
    """JSON export lists nodes and edges with their keys and kinds."""
    assert json.loads(seed_graph().to_json()) == {
        "nodes": [
            {"step": 2, "tool": "tool2"},
            {"step": 5, "tool": "tool5"},
            {"step": 9, "tool": "tool9"},
        ],
        "edges": [
            {
                "source": 2,
                "target": 5,
                "source_key": "id",
                "target_key": "user",
                "kind": "explicit",
            },
            {
                "source": 5,
                "target": 9,
                "source_key": "owner_id",
                "target_key": "user_id",
                "kind": "explicit",
            },
        ],
    }


# ---------------------------------------------------------------- properties


@given(step_sequences())
def test_built_graphs_keep_their_invariants(steps):
    """Any step sequence builds a graph that passes check_graph_invariants."""
    check_graph_invariants(build_graph(steps))


def _resolve_all(steps):
    """Each step with its references resolved against the outputs of the steps before it."""
    outputs, calls = {}, []
    for step in steps:
        resolution = resolve_references(step.arguments, outputs, current_step=step.step_id)
        calls.append((step, resolution))
        if resolution.ok:
            outputs[step.step_id] = step.output
    return calls


def _run(graph, calls):
    for step, resolution in calls:
        graph.add_step(step.step_id, step.tool_name, resolution.value, resolution.dependencies)
        if resolution.ok:
            graph.record_output(step.step_id, step.output)
    return graph


@given(step_sequences(min_steps=2), st.data())
def test_rewind_and_replay_equals_a_fresh_build(steps, data):
    """Truncating at t leaves the prefix's graph; replaying the rest restores the full graph."""
    calls = _resolve_all(steps)
    cut = data.draw(st.integers(min_value=1, max_value=len(steps)))
    full = _run(DependencyGraph(), calls)
    graph = _run(DependencyGraph(), calls)
    graph.truncate_from(cut)
    check_graph_invariants(graph)
    assert graph.edges() == _run(DependencyGraph(), calls[: cut - 1]).edges()
    _run(graph, calls[cut - 1 :])
    assert graph.edges() == full.edges()
    for node in full.nodes():
        for key, _ in node.input_leaves:
            assert graph.find_root_cause(node.step_id, key) == full.find_root_cause(
                node.step_id, key
            )


@given(step_sequences())
def test_root_causes_are_earlier_steps(steps):
    """A root cause is always a step of the graph below the failed step."""
    graph = build_graph(steps)
    for step_id in graph.steps():
        for key, _ in graph.node(step_id).input_leaves:  # type: ignore[union-attr]
            root = graph.find_root_cause(step_id, key)
            assert root is None or (root in graph and root < step_id)


# ---------------------------------------------------------------- model-based


def _links(in_key: str, out_key: str) -> bool:
    """The documented key-linking rule, transcribed literally (ASCII case only)."""
    lower_in = in_key.encode().lower().decode()
    lower_out = out_key.encode().lower().decode()
    return bool(in_key and out_key) and (
        lower_in == lower_out or lower_in.endswith("_" + lower_out)
    )


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def _linkable(value) -> bool:
    return (isinstance(value, str) and value != "") or (
        isinstance(value, (int, float)) and not isinstance(value, bool)
    )


class NaiveGraph:
    """The documented algorithm with a linear scan of earlier steps: the model for the index."""

    def __init__(self):
        self.nodes: dict[int, tuple[list, list, tuple]] = {}
        self.edges: list[Edge] = []

    def add_step(self, step_id, inputs, explicit):
        self.truncate_from(step_id)
        in_leaves = scalar_leaves(inputs)
        self.nodes[step_id] = (in_leaves, [], tuple(explicit))
        new = [
            edge(d.from_step, step_id, d.source_key, d.target_key, EXPLICIT)
            for d in explicit
            if d.from_step in self.nodes and d.from_step < step_id
        ]
        covered = {d.target_key for d in explicit}
        seen = set()
        for in_key, value in in_leaves:
            if in_key in covered or not _linkable(value):
                continue
            for producer in sorted((s for s in self.nodes if s < step_id), reverse=True):
                match = next(
                    (
                        k
                        for k, v in self.nodes[producer][1]
                        if _same(v, value) and _links(in_key, k)
                    ),
                    None,
                )
                if match is not None:
                    if (producer, match, in_key) not in seen:
                        seen.add((producer, match, in_key))
                        new.append(edge(producer, step_id, match, in_key))
                    break
        self.edges.extend(new)

    def record_output(self, step_id, output):
        self.nodes[step_id][1][:] = scalar_leaves(output)

    def truncate_from(self, step_id):
        for step in [s for s in self.nodes if s >= step_id]:
            del self.nodes[step]
        self.edges = [e for e in self.edges if e.target < step_id]

    def sorted_edges(self):
        return tuple(
            sorted(
                self.edges,
                key=lambda e: (e.target, e.source, e.kind.value, e.source_key, e.target_key),
            )
        )


KEYS = st.sampled_from(["id", "user_id", "ID", "owner_id", "a_user_id", "sku", ""])
VALUES = st.sampled_from(["x", "y", "", 1, 1.0, "1", True, None, 0])
LEAVES = st.dictionaries(KEYS, st.one_of(VALUES, st.lists(VALUES, max_size=2)), max_size=3)


class GraphMachine(RuleBasedStateMachine):
    """DependencyGraph behaves like the naive transcription of the protocol, step for step."""

    @initialize()
    def start(self):
        self.graph = DependencyGraph()
        self.model = NaiveGraph()
        self.next_step = 1

    @rule(inputs=LEAVES, data=st.data())
    def add_step(self, inputs, data):
        explicit = data.draw(
            st.lists(st.builds(dep, st.integers(0, self.next_step + 1), KEYS, KEYS), max_size=2)
        )
        edges = self.graph.add_step(self.next_step, "t", inputs, explicit)
        self.model.add_step(self.next_step, inputs, explicit)
        assert set(edges) == {e for e in self.model.edges if e.target == self.next_step}
        self.next_step += 1

    @precondition(lambda self: self.model.nodes)
    @rule(output=LEAVES)
    def record_output(self, output):
        # As in a transaction: a step's output is recorded before any later step is added.
        step_id = max(self.model.nodes)
        self.graph.record_output(step_id, output)
        self.model.record_output(step_id, output)

    @precondition(lambda self: self.next_step > 1)
    @rule(data=st.data())
    def truncate(self, data):
        cut = data.draw(st.integers(1, self.next_step))
        self.graph.truncate_from(cut)
        self.model.truncate_from(cut)
        self.next_step = cut

    @invariant()
    def same_edges(self):
        assert self.graph.edges() == self.model.sorted_edges()
        assert self.graph.steps() == tuple(sorted(self.model.nodes))

    @invariant()
    def invariants_hold(self):
        check_graph_invariants(self.graph)


GraphMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30)
test_graph_machine = GraphMachine.TestCase


# ---------------------------------------------------------------- literal inputs


def test_an_input_no_step_produced_is_a_literal():
    """A key the step wrote itself (no edge, no explicit dependency) is literal; one that came
    by an implicit link or a reference is not; neither is a key the step has no input for."""
    graph = DependencyGraph()
    graph.add_step(1, "lookup", {"email": "a@x"})
    graph.record_output(1, {"id": "c-1"})
    graph.add_step(2, "reserve", {"customer_id": "c-1", "quantity": "two", "o": {"Sku": "s"}})
    assert graph.is_literal(2, "quantity")
    assert graph.is_literal(2, "QUANTITY")  # ASCII case is ignored, as everywhere in the graph
    assert graph.is_literal(2, "sku")  # a nested leaf counts under its own key
    assert not graph.is_literal(2, "customer_id")  # implicitly linked to step 1's `id`
    assert not graph.is_literal(2, "missing")
    assert not graph.is_literal(3, "quantity")  # no such step
    graph.add_step(2, "reserve", {"customer_id": "c-9"}, [dep(1, "id", "customer_id")])
    assert not graph.is_literal(2, "customer_id")  # a reference, even to another value
    graph.add_step(2, "reserve", {"customer_id": "c-9"}, [dep(7, "id", "customer_id")])
    assert graph.edges() == ()
    assert not graph.is_literal(2, "customer_id")  # a dropped reference is still not literal


def test_a_value_copied_from_an_earlier_output_is_not_a_literal():
    """An input equal to an earlier output under another key (a string of 3 characters or
    more, a number of at least 1000) was copied from that step: `copied_from` names the most
    recent one and `is_literal` is false; short strings and small numbers are equal by chance."""
    graph = DependencyGraph()
    graph.add_step(1, "find", {"email": "a@x"})
    graph.record_output(1, {"customer": "c-old", "n": 7, "big": 12345, "ok": "no"})
    graph.add_step(2, "find", {})
    graph.record_output(2, {"other": {"deep": "c-old"}})
    graph.add_step(3, "reserve", {"customer_id": "c-old", "q": 7, "amount": 12345, "x": "no"})
    assert graph.edges() == ()
    assert graph.copied_from(3, "CUSTOMER_ID") == 2  # the most recent, nested leaves too
    assert not graph.is_literal(3, "customer_id")
    assert graph.copied_from(3, "amount") == 1
    assert not graph.is_literal(3, "amount")
    for key in ("q", "x"):
        assert graph.copied_from(3, key) is None
        assert graph.is_literal(3, key)
    assert graph.copied_from(1, "email") is None  # nothing earlier
    assert graph.copied_from(9, "email") is None  # no such step
