"""Value-provenance lineage: the agentfootprint algorithm, evidence mode, adapters and exports."""

from __future__ import annotations

import dataclasses
import json
import math

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agenttx import InvalidArgument, StepRecord
from agenttx._lineage._recorder import (
    LineageEdge,
    LineageGraph,
    LineageNode,
    LineageRecorder,
    _js_number_text,
    _utf16_length,
)
from agenttx._lineage._sources import lineage_from_openai, lineage_from_steps


def play(events, recorder=None, **options):
    """Drive a recorder with compact events and return its lineage.

    ("it", n) iteration; ("start", id, args) or ("start", id, args, tool); ("end", id, result);
    ("fail", id, result) an errored end; ("run", run_id); ("clear",).
    """
    recorder = LineageRecorder(**options) if recorder is None else recorder
    for event in events:
        kind = event[0]
        if kind == "it":
            recorder.on_iteration(event[1])
        elif kind == "start":
            tool = event[3] if len(event) > 3 else f"tool_{event[1]}"
            recorder.on_tool_start(event[1], tool, event[2])
        elif kind == "end":
            recorder.on_tool_end(event[1], event[2])
        elif kind == "fail":
            recorder.on_tool_end(event[1], event[2], error=True)
        elif kind == "run":
            recorder.start_run(event[1])
        else:
            recorder.clear()
    return recorder.lineage()


def links(graph):
    """Edges as (producer call id, consumer call id, value) triples, in order."""
    return [(e.source.call_id, e.target.call_id, e.value) for e in graph.edges]


def node_keys(graph):
    """Nodes as comparable tuples (a NaN iteration is not equal to itself, its text is)."""
    return [(n.index, n.call_id, n.tool_name, _js_number_text(n.iteration)) for n in graph.nodes]


def produce_consume(result, args, **options):
    """A produces `result` in iteration 1, B consumes `args` in iteration 2."""
    return play(
        [("it", 1), ("start", "A", None), ("end", "A", result), ("it", 2), ("start", "B", args)],
        **options,
    )


def linked(value_out, value_in, **options):
    """Whether a result value links to an argument value (both at depth 1)."""
    return bool(produce_consume({"out": value_out}, {"in": value_in}, **options).edges)


# ---------------------------------------------------------------- 1.1 options


def test_options_defaults_are_4_false_6_and_default_mode():
    """The defaults are min_value_length=4, match_numbers=False, max_depth=6, evidence off."""
    recorder = LineageRecorder()
    assert (recorder.min_value_length, recorder.match_numbers, recorder.max_depth) == (4, False, 6)
    assert recorder.evidence is False
    assert recorder.iteration == 0
    assert recorder.run_id is None


def test_options_min_value_length_zero_is_honoured():
    """min_value_length=0 lets even the empty string link."""
    assert linked("", "", min_value_length=0)
    assert not linked("", "")


def test_options_max_depth_zero_is_honoured():
    """max_depth=0 links bare scalars only; object-shaped arguments never link."""
    assert links(produce_consume("abcdef", "abcdef", max_depth=0)) == [("A", "B", "abcdef")]
    assert not produce_consume("abcdef", {"k": "abcdef"}, max_depth=0).edges
    assert not produce_consume({"k": "abcdef"}, "abcdef", max_depth=0).edges


def test_options_are_read_only():
    """The options cannot be changed after construction."""
    recorder = LineageRecorder()
    with pytest.raises(attrs.exceptions.FrozenAttributeError):
        recorder.max_depth = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_value_length": -1}, "min_value_length must be >= 0"),
        ({"min_value_length": True}, "min_value_length must be an int"),
        ({"min_value_length": 4.0}, "min_value_length must be an int"),
        ({"min_value_length": None}, "min_value_length must be an int"),
        ({"max_depth": -1}, "max_depth must be >= 0"),
        ({"max_depth": "6"}, "max_depth must be an int"),
        ({"match_numbers": 1}, "match_numbers must be a bool"),
        ({"evidence": "yes"}, "evidence must be a bool"),
    ],
)
def test_constructor_rejects_bad_options(options, message):
    """Bad options raise InvalidArgument naming the option."""
    with pytest.raises(InvalidArgument, match=message):
        LineageRecorder(**options)


def test_constructor_options_are_keyword_only():
    """Options cannot be passed positionally."""
    with pytest.raises(TypeError):
        LineageRecorder(4)  # type: ignore[misc]


def test_adapters_validate_options_and_input():
    """Adapters raise InvalidArgument for bad options and for a non-iterable input."""
    with pytest.raises(InvalidArgument, match="max_depth"):
        lineage_from_openai([], max_depth=-2)
    with pytest.raises(InvalidArgument, match="messages must be an iterable"):
        lineage_from_openai("not messages")
    with pytest.raises(InvalidArgument, match="messages must be an iterable"):
        lineage_from_openai({"role": "assistant"})
    with pytest.raises(InvalidArgument, match="steps must be an iterable"):
        lineage_from_steps(42)  # type: ignore[arg-type]


# ---------------------------------------------------------------- 1.2 run reset


def test_run_reset_on_a_new_run_id_forgets_everything():
    """start_run with a different id resets the iteration, nodes, edges, producers and ids."""
    recorder = LineageRecorder()
    play(
        [("run", "r1"), ("it", 1), ("start", "A", None), ("end", "A", "token-1"), ("it", 2)],
        recorder,
    )
    play([("start", "B", "token-1")], recorder)
    assert len(recorder.lineage().edges) == 1
    recorder.start_run("r2")
    assert recorder.iteration == 0
    assert recorder.lineage() == LineageGraph()
    # Neither the producer nor the call id survived the reset.
    graph = play(
        [("end", "A", "token-2"), ("it", 5), ("start", "C", ["token-1", "token-2"])], recorder
    )
    assert [n.call_id for n in graph.nodes] == ["C"]
    assert graph.edges == ()


def test_run_reset_same_run_id_keeps_state():
    """start_run with the current id is not a new run."""
    recorder = LineageRecorder()
    play(
        [("run", "r"), ("it", 1), ("start", "A", None), ("end", "A", "token"), ("run", "r")],
        recorder,
    )
    assert recorder.iteration == 1
    graph = play([("it", 2), ("start", "B", "token")], recorder)
    assert links(graph) == [("A", "B", "token")]


def test_run_reset_first_start_run_never_resets():
    """Events before the first start_run belong to that run: the first start_run keeps them."""
    recorder = LineageRecorder()
    play([("it", 1), ("start", "A", None), ("end", "A", "token")], recorder)
    recorder.start_run("r1")
    assert recorder.run_id == "r1"
    assert links(play([("it", 2), ("start", "B", "token")], recorder)) == [("A", "B", "token")]


def test_run_reset_switching_a_b_a_resets_twice():
    """A -> B -> A resets twice; the first A's calls are not restored."""
    recorder = LineageRecorder()
    play([("run", "A"), ("it", 1), ("start", "x", None), ("end", "x", "token")], recorder)
    recorder.start_run("B")
    play([("it", 3), ("start", "y", None)], recorder)
    recorder.start_run("A")
    assert recorder.lineage().nodes == ()
    assert recorder.iteration == 0


def test_run_reset_start_run_requires_a_string():
    """start_run with a non-string id raises InvalidArgument and changes nothing."""
    recorder = LineageRecorder()
    recorder.start_run("r")
    with pytest.raises(InvalidArgument, match="run_id must be a string"):
        recorder.start_run(None)  # type: ignore[arg-type]
    assert recorder.run_id == "r"


def test_clear_resets_and_unsets_the_run_id():
    """clear() forgets everything and the run id, so the next start_run does not reset."""
    recorder = LineageRecorder()
    play([("run", "r1"), ("it", 3), ("start", "A", None)], recorder)
    recorder.clear()
    assert recorder.run_id is None
    assert recorder.iteration == 0
    assert recorder.lineage().nodes == ()
    play([("it", 1), ("start", "B", None)], recorder)
    recorder.start_run("r2")  # a different id, but no reset after clear()
    assert [n.call_id for n in recorder.lineage().nodes] == ["B"]


# ---------------------------------------------------------------- 1.2 iteration_start


def test_iteration_start_sets_the_current_iteration_from_any_number():
    """on_iteration takes ints and floats."""
    recorder = LineageRecorder()
    recorder.on_iteration(3)
    assert recorder.iteration == 3
    recorder.on_iteration(2.5)
    assert recorder.iteration == 2.5


@pytest.mark.parametrize("bad", [None, "2", True, False, [1], {"iterIndex": 2}])
def test_iteration_start_ignores_non_numbers(bad):
    """A non-number iteration (None, "2", a bool, a container) leaves the iteration unchanged."""
    recorder = LineageRecorder()
    recorder.on_iteration(4)
    recorder.on_iteration(bad)
    assert recorder.iteration == 4


def test_iteration_start_has_no_monotonicity_check():
    """The iteration can go backwards; a call then links to a producer of a higher-numbered one."""
    graph = play(
        [
            ("it", 5),
            ("start", "A", None),
            ("it", 1),
            ("start", "B", None),
            ("end", "B", "token"),
            ("it", 3),
            ("start", "C", "token"),
            ("it", 2),
            ("start", "D", "token"),
        ]
    )
    assert [n.iteration for n in graph.nodes] == [5, 1, 3, 2]
    assert links(graph) == [("B", "C", "token"), ("B", "D", "token")]


def test_iteration_start_nan_is_accepted_and_never_links():
    """A NaN iteration is taken, and NaN calls neither consume nor produce links."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("end", "A", "token"),
            ("it", math.nan),
            ("start", "B", "token"),
            ("end", "B", "other"),
            ("it", 9),
            ("start", "C", "other"),
        ]
    )
    assert math.isnan(graph.nodes[1].iteration)
    assert graph.edges == ()


def test_iteration_start_infinity_is_accepted():
    """An infinite iteration is later than every finite one."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("end", "A", "token"),
            ("it", math.inf),
            ("start", "B", "token"),
        ]
    )
    assert links(graph) == [("A", "B", "token")]


# ---------------------------------------------------------------- 1.2 tool_start


@pytest.mark.parametrize("bad", ["", None, 0, 7, b"id"])
def test_tool_start_ignores_a_falsy_or_non_string_call_id(bad):
    """A tool start without a non-empty string call id creates no node."""
    recorder = LineageRecorder()
    recorder.on_tool_start(bad, "tool", "token")
    assert recorder.lineage().nodes == ()


def test_tool_start_missing_tool_name_is_unknown():
    """A None (or non-string) tool name becomes "(unknown)"; an empty name stays empty."""
    recorder = LineageRecorder()
    recorder.on_tool_start("a", None, None)
    recorder.on_tool_start("b", 42, None)  # type: ignore[arg-type]
    recorder.on_tool_start("c", "", None)
    assert [n.tool_name for n in recorder.lineage().nodes] == ["(unknown)", "(unknown)", ""]


def test_tool_start_node_records_call_tool_and_current_iteration():
    """The node holds the call id, the tool name and the iteration at its start."""
    graph = play([("it", 2), ("start", "call-1", None, "flogi")])
    assert graph.nodes == (LineageNode(index=0, call_id="call-1", tool_name="flogi", iteration=2),)


def test_tool_start_repeated_id_adds_a_node_that_takes_over_the_id():
    """A repeated call id adds another node; the later node owns the id for tool_end."""
    graph = play(
        [
            ("it", 1),
            ("start", "X", None, "first"),
            ("start", "X", None, "second"),
            ("end", "X", "token"),
            ("it", 2),
            ("start", "Y", "token"),
        ]
    )
    assert [(n.index, n.call_id, n.tool_name) for n in graph.nodes] == [
        (0, "X", "first"),
        (1, "X", "second"),
        (2, "Y", "tool_Y"),
    ]
    assert graph.edges[0].source is graph.nodes[1]


def test_tool_start_links_only_to_strictly_earlier_iterations():
    """An edge needs producer.iteration < consumer.iteration."""
    assert links(produce_consume("token", "token")) == [("A", "B", "token")]
    graph = play([("it", 1), ("start", "A", None), ("end", "A", "token"), ("start", "B", "token")])
    assert graph.edges == ()


# ---------------------------------------------------------------- 1.2 tool_end


def test_tool_end_for_an_unknown_or_empty_call_id_is_ignored():
    """tool_end for an unknown, empty or non-string call id registers nothing."""
    recorder = LineageRecorder()
    recorder.on_iteration(1)
    recorder.on_tool_end("ghost", "token")
    recorder.on_tool_end("", "token")
    recorder.on_tool_end(None, "token")  # type: ignore[arg-type]
    recorder.on_iteration(2)
    recorder.on_tool_start("B", "t", "token")
    assert recorder.lineage().edges == ()


def test_tool_end_overwrites_the_producer_last_producer_wins():
    """A (iteration 1) and B (iteration 2) both return V; C (iteration 3) links to B only."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("end", "A", "value"),
            ("it", 2),
            ("start", "B", None),
            ("end", "B", "value"),
            ("it", 3),
            ("start", "C", "value"),
        ]
    )
    assert links(graph) == [("B", "C", "value")]


# ---------------------------------------------------------------- 1.2 getLineage


def test_lineage_returns_fresh_tuples_sharing_node_objects():
    """lineage() is a snapshot; edge endpoints are the very node objects in nodes."""
    recorder = LineageRecorder()
    play([("it", 1), ("start", "A", None), ("end", "A", "token")], recorder)
    graph = play([("it", 2), ("start", "B", "token")], recorder)
    edge = graph.edges[0]
    assert edge.source is graph.nodes[0]
    assert edge.target is graph.nodes[1]
    play([("start", "C", "token")], recorder)
    assert len(graph.nodes) == 2  # the earlier snapshot did not change
    assert len(recorder.lineage().nodes) == 3


# ---------------------------------------------------------------- 1.3 flattening


def test_flattening_null_values_are_skipped():
    """None arguments, results and elements add nothing."""
    assert not produce_consume(None, None).edges
    assert links(produce_consume([None, "token"], {"a": None, "b": "token"})) == [
        ("A", "B", "token")
    ]


def test_flattening_depth_rule_six_levels_kept_seven_dropped():
    """With max_depth 6, a string six objects deep links and one seven deep does not."""
    six = {"l1": {"l2": {"l3": {"l4": {"l5": {"l6": "X-VALUE"}}}}}}
    seven = {"l0": six}
    assert links(produce_consume(six, "X-VALUE")) == [("A", "B", "X-VALUE")]
    assert links(produce_consume("X-VALUE", six)) == [("A", "B", "X-VALUE")]
    assert not produce_consume(seven, "X-VALUE").edges
    assert not produce_consume("X-VALUE", seven).edges


def test_flattening_depth_counts_arrays_too():
    """Each nested array adds one level: depth 2 passes max_depth 2, depth 3 does not."""
    assert linked(["deep"], "deep", max_depth=2)
    assert not linked([["deep"]], "deep", max_depth=2)


def test_flattening_string_length_counts_utf16_code_units():
    """ "𝄞𝄞" is 2 Python characters but 4 UTF-16 units, so it meets the default threshold."""
    assert len("𝄞𝄞") == 2
    assert _utf16_length("𝄞𝄞") == 4
    assert linked("𝄞𝄞", "𝄞𝄞")
    assert not linked("ééé", "ééé")  # 3 units: BMP characters count one each
    assert _utf16_length("\ud800") == 1  # a lone surrogate is one unit, as in JS


def test_flattening_strings_are_compared_exactly():
    """No trimming, case folding, Unicode normalisation or JSON parsing of strings."""
    assert not linked("token", "token ")
    assert not linked("Token", "token")
    assert not linked("caf\u00e9", "cafe\u0301")
    assert not linked('{"id": "abcd"}', "abcd")
    assert linked('{"id": "abcd"}', '{"id": "abcd"}')


def test_flattening_numbers_only_with_match_numbers():
    """Numbers never link by default; with match_numbers they do."""
    assert not linked(778899, 778899)
    assert linked(778899, 778899, match_numbers=True)


def test_flattening_min_value_length_does_not_apply_to_numbers():
    """With match_numbers, 7 and 0 link although their text is one character long."""
    assert linked(7, 7, match_numbers=True)
    assert linked(0, 0, match_numbers=True)


def test_flattening_non_finite_numbers_never_match():
    """NaN, infinities and ints too large for a double never match."""
    for value in (math.nan, math.inf, -math.inf, 10**400):
        assert not linked(value, value, match_numbers=True)


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (12345.0, "12345"),
        (-0.0, "0"),
        (0, "0"),
        (-7, "-7"),
        (0.1 + 0.2, "0.30000000000000004"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (1e-6, "0.000001"),
        (123e-20, "1.23e-18"),
        (2**53 + 1, "9007199254740992"),
        (12345678901234567890, "12345678901234567000"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (5e-324, "5e-324"),
        (math.nan, "NaN"),
        (-math.inf, "-Infinity"),
        (10**400, "Infinity"),
        (-(10**400), "-Infinity"),
    ],
)
def test_flattening_numbers_compare_as_javascript_number_text(number, text):
    """Numbers are matched as JS String(n): no ".0", no "-0", JS exponent form."""
    assert _js_number_text(number) == text


def test_flattening_number_value_is_the_js_text():
    """The edge value of a number is its JS text: 12345.0 links to 12345 as "12345"."""
    graph = produce_consume({"n": 12345.0}, {"n": 12345}, match_numbers=True)
    assert links(graph) == [("A", "B", "12345")]


def test_flattening_keys_are_never_values():
    """An object key equal to a produced value does not link."""
    assert not produce_consume("abcdef", {"abcdef": 1}).edges
    assert not produce_consume({"abcdef": 1}, "abcdef").edges


def test_flattening_integer_like_keys_come_first_ascending():
    """Edges follow JS Object.values order: canonical array-index keys ascending, then the rest."""
    result = ["val-b", "val-10", "val-2", "val-01", "val-0"]
    args = {"b": "val-b", "10": "val-10", "2": "val-2", "01": "val-01", "0": "val-0"}
    graph = produce_consume(result, args)
    assert [e.value for e in graph.edges] == ["val-0", "val-2", "val-10", "val-b", "val-01"]
    # Python int keys stand for their JS text; negative ones and bools are ordinary keys.
    args = {True: "val-b", -1: "val-01", 10: "val-10", "2": "val-2", 0: "val-0"}
    graph = produce_consume(result, args)
    assert [e.value for e in graph.edges] == ["val-0", "val-2", "val-10", "val-b", "val-01"]


def test_flattening_booleans_never_match():
    """Booleans are never values, not even as 1 and 0 with match_numbers."""
    assert not linked(True, True, match_numbers=True)
    assert not linked(1, True, match_numbers=True)
    assert not linked(True, 1, match_numbers=True)


def test_flattening_deduplicates_in_first_appearance_order():
    """A value repeated in the args counts once, at its first pre-order appearance."""
    graph = produce_consume(
        ["first", "second"], {"x": ["second", {"y": "first"}], "z": "second", "w": "first"}
    )
    assert [e.value for e in graph.edges] == ["second", "first"]


def test_flattening_walks_tuples_dataclasses_and_attrs_instances():
    """Tuples are arrays; dataclass and attrs instances are objects; sets are never walked."""

    @dataclasses.dataclass
    class Port:
        wwpn: str

    @attrs.define
    class Host:
        name: str

    result = (Port(wwpn="50:01"), Host(name="lva1-mds01"), {"in-a-set"})
    graph = produce_consume(result, ["50:01", "lva1-mds01", "in-a-set"])
    assert [e.value for e in graph.edges] == ["50:01", "lva1-mds01"]


def test_flattening_self_referencing_containers_terminate():
    """A container holding itself is walked once per path, and its values still link."""
    loop: list[object] = ["loop-value"]
    loop.append(loop)
    deep = {"a": loop}
    assert links(produce_consume(loop, deep, max_depth=10_000)) == [("A", "B", "loop-value")]


# ---------------------------------------------------------------- 1.4 distinctive values


def test_distinctive_number_links_to_numeric_string():
    """With match_numbers, a number result 778899 links to the string argument "778899"."""
    assert linked(778899, "778899", match_numbers=True)
    assert linked("778899", 778899, match_numbers=True)


def test_distinctive_string_side_still_needs_the_length_threshold():
    """The number 5 does not link to the string "5", but does link to the number 5."""
    assert not linked(5, "5", match_numbers=True)
    assert not linked("5", 5, match_numbers=True)
    assert linked(5, 5, match_numbers=True)


def test_distinctive_substrings_never_match():
    """A value inside a longer string is not a match."""
    assert not linked("host=lva1-mds01", "lva1-mds01")
    assert not linked("lva1-mds01", "host=lva1-mds01")


# ---------------------------------------------------------------- 1.5 several producers


def test_producers_same_iteration_shadowing_hides_the_earlier_edge():
    """A (it 1) returns V; B (it 2) returns V and ends before C (it 2) starts: no edge at all."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("end", "A", "value"),
            ("it", 2),
            ("start", "B", None),
            ("end", "B", "value"),
            ("start", "C", "value"),
        ]
    )
    assert graph.edges == ()


def test_producers_shadowing_does_not_happen_if_the_consumer_starts_first():
    """If C starts before B ends, the edge A -> C appears."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("end", "A", "value"),
            ("it", 2),
            ("start", "B", None),
            ("start", "C", "value"),
            ("end", "B", "value"),
        ]
    )
    assert links(graph) == [("A", "C", "value")]


def test_producers_echo_reattributes_to_the_echoing_call():
    """B receives V and returns it again: later consumers link to B, not A."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("end", "A", "value"),
            ("it", 2),
            ("start", "B", {"v": "value"}),
            ("end", "B", {"echo": "value"}),
            ("it", 3),
            ("start", "C", "value"),
        ]
    )
    assert links(graph) == [("A", "B", "value"), ("B", "C", "value")]


def test_producers_arguments_are_never_producers():
    """A value only seen in arguments does not link a later call to the one that received it."""
    graph = play([("it", 1), ("start", "A", "value"), ("it", 2), ("start", "B", "value")])
    assert graph.edges == ()


def test_producers_nothing_is_retroactive():
    """A result registered after the consumer started never links to it."""
    graph = play(
        [("it", 1), ("start", "A", None), ("it", 2), ("start", "B", "value"), ("end", "A", "value")]
    )
    assert graph.edges == ()


def test_producers_a_second_tool_end_adds_its_values():
    """Ending a call twice registers both results."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("end", "A", "first"),
            ("end", "A", "second"),
            ("it", 2),
            ("start", "B", ["first", "second"]),
        ]
    )
    assert links(graph) == [("A", "B", "first"), ("A", "B", "second")]


# ---------------------------------------------------------------- 1.6 duplicates


def test_duplicates_one_edge_per_value_between_two_calls_in_argument_order():
    """Several linking values give several edges between the same calls, in argument order."""
    graph = produce_consume({"a": "alpha", "b": "bravo"}, {"y": "bravo", "x": "alpha"})
    assert links(graph) == [("A", "B", "bravo"), ("A", "B", "alpha")]


def test_duplicates_repeated_argument_value_gives_one_edge():
    """The same value repeated inside the args links once."""
    graph = produce_consume("alpha", ["alpha", {"again": "alpha"}, "alpha"])
    assert links(graph) == [("A", "B", "alpha")]


def test_duplicates_one_producer_value_used_by_several_consumers():
    """One produced value gives one edge per consuming call."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("end", "A", "alpha"),
            ("it", 2),
            ("start", "B", "alpha"),
            ("start", "C", {"v": "alpha"}),
        ]
    )
    assert links(graph) == [("A", "B", "alpha"), ("A", "C", "alpha")]


# ---------------------------------------------------------------- 1.7 iterations


def test_iterations_a_call_takes_the_iteration_at_its_start_zero_before_any():
    """Before any on_iteration a call is in iteration 0; its later end does not change that."""
    recorder = LineageRecorder()
    recorder.on_tool_start("A", "t", None)
    recorder.on_iteration(4)
    recorder.on_tool_end("A", "value")
    recorder.on_tool_start("B", "t", "value")
    graph = recorder.lineage()
    assert [n.iteration for n in graph.nodes] == [0, 4]
    assert links(graph) == [("A", "B", "value")]


def test_iterations_parallel_same_iteration_calls_never_link():
    """Calls of one iteration never link, whatever their order."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("end", "A", "value"),
            ("start", "B", "value"),
            ("end", "B", "other"),
            ("start", "C", ["value", "other"]),
        ]
    )
    assert graph.edges == ()


def test_iterations_multi_turn_counter_restart_links_only_to_later_iterations():
    """After the counter restarts at 1, an earlier turn's iteration-1 values link only from 2 on."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("end", "A", "value"),
            ("it", 1),
            ("start", "B", "value"),
            ("it", 2),
            ("start", "C", "value"),
        ]
    )
    assert links(graph) == [("A", "C", "value")]


# ---------------------------------------------------------------- 1.8 shapes and ordering


def test_ordering_nodes_in_arrival_order_edges_in_consumer_then_walk_order():
    """Nodes are in start order (edgeless calls too); edges by consumer, then argument order."""
    graph = play(
        [
            ("it", 1),
            ("start", "P", None),
            ("end", "P", ["v-one", "v-two"]),
            ("start", "idle", None),
            ("it", 2),
            ("start", "C1", ["v-two", "v-one"]),
            ("start", "C2", {"k": "v-one"}),
        ]
    )
    assert [n.call_id for n in graph.nodes] == ["P", "idle", "C1", "C2"]
    assert links(graph) == [("P", "C1", "v-two"), ("P", "C1", "v-one"), ("P", "C2", "v-one")]


def test_shapes_default_edges_carry_no_evidence():
    """Default-mode edges have no paths, confidence, reasons or failure mark."""
    edge = produce_consume("value", "value").edges[0]
    assert (edge.source_path, edge.target_path, edge.confidence) == (None, None, None)
    assert edge.reasons == ()
    assert edge.source_failed is None


# ---------------------------------------------------------------- 1.9 error tolerance


def test_error_tolerance_tool_end_without_result_adds_nothing():
    """on_tool_end with no result registers no value."""
    recorder = LineageRecorder()
    recorder.on_iteration(1)
    recorder.on_tool_start("A", "t", None)
    recorder.on_tool_end("A")
    recorder.on_iteration(2)
    recorder.on_tool_start("B", "t", None)
    assert recorder.lineage().edges == ()


def test_error_tolerance_tool_errors_count_as_producers_by_default():
    """In the default mode, error=True is ignored: the error message is a value."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("fail", "A", "permission denied"),
            ("it", 2),
            ("start", "B", {"reason": "permission denied"}),
        ]
    )
    assert links(graph) == [("A", "B", "permission denied")]
    assert graph.edges[0].source_failed is None


def test_error_tolerance_a_call_that_never_ends_still_consumes():
    """A started call without tool_end gets a node and consumes, but never produces."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("end", "A", "value"),
            ("it", 2),
            ("start", "paused", "value"),
            ("it", 3),
            ("start", "C", "value"),
        ]
    )
    assert links(graph) == [("A", "paused", "value"), ("A", "C", "value")]


# ---------------------------------------------------------------- evidence mode


def test_evidence_edges_carry_paths_confidence_and_reasons():
    """Evidence edges locate the value in the result and the args and explain their confidence."""
    graph = produce_consume(
        {"login": {"fcid": "0x650300"}},
        {"zone": {"members": ["0x650300"]}, "initiator_fcid": "0x650300"},
        evidence=True,
    )
    assert graph.evidence is True
    (edge,) = graph.edges
    assert (edge.source_path, edge.target_path) == ("$.login.fcid", "$.zone.members[0]")
    assert edge.reasons == ("exact_string", "key_clash")
    assert edge.confidence == 0.6
    assert edge.source_failed is False


@pytest.mark.parametrize(
    ("out_key", "in_key", "reasons", "confidence"),
    [
        ("fcid", "fcid", ("exact_string", "same_key"), 0.9),
        ("userId", "user_id", ("exact_string", "same_key"), 0.9),
        ("fcid", "initiator_fcid", ("exact_string", "key_suffix"), 0.85),
        ("id", "user_id", ("exact_string", "key_suffix"), 0.85),
        ("port_wwpn_list", "wwpn_port", ("exact_string", "key_overlap"), 0.8),
        ("user_id", "order_id", ("exact_string", "key_clash"), 0.6),
        ("value", "data", ("exact_string",), 0.7),
        ("_", "data", ("exact_string",), 0.7),
    ],
)
def test_evidence_key_name_affinity(out_key, in_key, reasons, confidence):
    """Agreeing key names raise the confidence and clashing ones lower it."""
    graph = produce_consume({out_key: "AB-1234"}, {in_key: "AB-1234"}, evidence=True)
    assert graph.edges[0].reasons == reasons
    assert graph.edges[0].confidence == confidence


def test_evidence_bare_values_have_no_key():
    """A top-level value has path $ and no key, so no affinity reason."""
    edge = produce_consume("AB-1234", ["AB-1234"], evidence=True).edges[0]
    assert (edge.source_path, edge.target_path) == ("$", "$[0]")
    assert edge.reasons == ("exact_string",)


def test_evidence_paths_quote_keys_that_are_not_identifiers():
    """Keys that are not identifiers are written as JSON strings in brackets."""
    edge = produce_consume({"a key": "AB-1234"}, {"0": "AB-1234"}, evidence=True).edges[0]
    assert (edge.source_path, edge.target_path) == ('$["a key"]', '$["0"]')


def test_evidence_number_kinds_and_common_values():
    """Numbers score lower than strings, number-as-text lower still; common values are weak."""
    number = produce_consume({"n": 778899}, {"m": 778899}, evidence=True, match_numbers=True)
    assert number.edges[0].reasons == ("exact_number", "key_clash")
    assert number.edges[0].confidence == 0.3
    as_text = produce_consume({"n": 778899}, {"n": "778899"}, evidence=True, match_numbers=True)
    assert as_text.edges[0].reasons == ("number_as_text", "same_key")
    assert as_text.edges[0].confidence == 0.5
    common = produce_consume({"status": "Success"}, {"x": "Success"}, evidence=True)
    assert common.edges[0].reasons == ("exact_string", "key_clash", "common_value")
    assert common.edges[0].confidence == 0.3


def test_evidence_confidence_is_clamped():
    """A common value from a failed call with clashing keys bottoms out at 0.05."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("fail", "A", {"status": "failed"}),
            ("it", 2),
            ("start", "B", {"outcome": "failed"}),
        ],
        evidence=True,
        min_value_length=1,
    )
    edge = graph.edges[0]
    assert edge.reasons == ("exact_string", "key_clash", "common_value", "failed_source")
    assert edge.confidence == 0.05


def test_evidence_failed_results_are_marked():
    """A result ended with error=True still produces, but its edges say source_failed."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("fail", "A", "permission denied for vsan 7"),
            ("it", 2),
            ("start", "B", "permission denied for vsan 7"),
        ],
        evidence=True,
    )
    edge = graph.edges[0]
    assert edge.source_failed is True
    assert edge.reasons == ("exact_string", "failed_source")
    assert edge.confidence == 0.4


def test_evidence_history_keeps_the_edge_a_same_iteration_reproducer_hides():
    """Shadowing: evidence mode links A -> C although B re-produced V in C's iteration."""
    events = [
        ("it", 1),
        ("start", "A", None),
        ("end", "A", "value"),
        ("it", 2),
        ("start", "B", None),
        ("end", "B", "value"),
        ("start", "C", "value"),
    ]
    assert play(events).edges == ()
    graph = play(events, evidence=True)
    assert links(graph) == [("A", "C", "value")]
    assert graph.edges[0].reasons == ("exact_string", "earlier_producer")


def test_evidence_uses_the_most_recent_earlier_producer():
    """With several earlier producers, evidence mode picks the latest, as the default mode does."""
    events = [
        ("it", 1),
        ("start", "A", None),
        ("end", "A", "value"),
        ("it", 2),
        ("start", "B", None),
        ("end", "B", "value"),
        ("it", 3),
        ("start", "C", "value"),
    ]
    assert links(play(events, evidence=True)) == links(play(events)) == [("B", "C", "value")]


def test_evidence_no_earlier_producer_no_edge():
    """Evidence mode still never links calls of one iteration."""
    graph = play(
        [("it", 1), ("start", "A", None), ("end", "A", "value"), ("start", "B", "value")],
        evidence=True,
    )
    assert graph.edges == ()


# ---------------------------------------------------------------- properties

_POOL = ["abcd", "ab", "𝄞𝄞", "𝄞", "ééé", "wxyz-1", "7", 7, 7.0, 0, 12345, True, None, "Success"]
_values = st.recursive(
    st.sampled_from(_POOL),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["k", "id", "0", "2", "user_id"]), inner, max_size=3)
    ),
    max_leaves=6,
)
_call_ids = st.sampled_from(["a", "b", "c", ""])
_events = st.lists(
    st.one_of(
        st.tuples(st.just("it"), st.integers(-1, 4) | st.sampled_from([math.nan, 2.5, None])),
        st.tuples(st.just("start"), _call_ids, _values),
        st.tuples(st.just("end"), _call_ids, _values),
        st.tuples(st.just("fail"), _call_ids, _values),
        st.tuples(st.just("run"), st.sampled_from(["r1", "r2"])),
    ),
    max_size=25,
)
_options = st.fixed_dictionaries(
    {
        "min_value_length": st.integers(0, 5),
        "match_numbers": st.booleans(),
        "max_depth": st.integers(0, 3),
    }
)


@given(_events, _options, st.booleans())
def test_property_edges_go_from_earlier_to_later_iterations(events, options, evidence):
    """Every edge's producer started in a strictly earlier iteration than its consumer."""
    graph = play(events, evidence=evidence, **options)
    for edge in graph.edges:
        assert edge.source.iteration < edge.target.iteration
        assert edge.source.index < edge.target.index


@given(_events, st.integers(0, 5))
def test_property_default_never_links_values_shorter_than_min_value_length(events, min_length):
    """Without match_numbers, every linked value has at least min_value_length UTF-16 units."""
    graph = play(events, min_value_length=min_length)
    assert all(_utf16_length(edge.value) >= min_length for edge in graph.edges)


@given(_events, _options)
def test_property_evidence_edges_are_a_superset_of_default_edges(events, options):
    """Evidence mode keeps every default edge, in the same relative order, and the same nodes."""
    default = play(events, **options)
    evidence = play(events, evidence=True, **options)
    assert node_keys(default) == node_keys(evidence)
    wanted = [(e.source.index, e.target.index, e.value) for e in default.edges]
    found = iter((e.source.index, e.target.index, e.value) for e in evidence.edges)
    assert all(edge in found for edge in wanted)  # a subsequence: consumes `found` in order
    extra = [e for e in evidence.edges if (e.source.index, e.target.index, e.value) not in wanted]
    assert all("earlier_producer" in e.reasons for e in extra)


@given(_events, _options, st.booleans())
def test_property_exports_are_deterministic_and_json_is_strict(events, options, evidence):
    """The same events give the same exports; to_json is strict JSON naming every node."""
    first = play(events, evidence=evidence, **options)
    second = play(events, evidence=evidence, **options)
    assert node_keys(first) == node_keys(second)
    assert links(first) == links(second)
    assert first.to_dot() == second.to_dot()
    assert first.to_mermaid() == second.to_mermaid()
    document = json.loads(
        first.to_json(), parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}")
    )
    assert len(document["nodes"]) == len(first.nodes)
    assert len(document["edges"]) == len(first.edges)


# ---------------------------------------------------------------- adapters: OpenAI


def _assistant(*calls):
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def _call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool(call_id, content):
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def test_openai_transcript_each_assistant_message_is_an_iteration():
    """Calls of one assistant message share an iteration; JSON args and contents are parsed."""
    messages = [
        {"role": "system", "content": "You are a SAN agent."},
        {"role": "user", "content": "Zone host lva1-mds01."},
        _assistant(_call("c1", "flogi", '{"switch": "lva1-mds01"}'), _call("c2", "noop", "{}")),
        _tool("c1", '{"fcid": "0x650300", "wwpn": "50:01:43:80"}'),
        _tool("c2", '"lva1-mds01"'),
        _assistant(_call("c3", "fcns", '{"fcid": "0x650300"}')),
        _tool("c3", "io profile: gold"),
        _assistant(_call("c4", "io_profile", '{"profile": "io profile: gold"}')),
        {"role": "assistant", "content": "Done."},
    ]
    graph = lineage_from_openai(messages)
    assert [(n.call_id, n.tool_name, n.iteration) for n in graph.nodes] == [
        ("c1", "flogi", 1),
        ("c2", "noop", 1),
        ("c3", "fcns", 2),
        ("c4", "io_profile", 3),
    ]
    assert links(graph) == [("c1", "c3", "0x650300"), ("c3", "c4", "io profile: gold")]


def test_openai_non_json_arguments_and_content_are_kept_as_strings():
    """Arguments or content that are not JSON are one string value each."""
    messages = [
        _assistant(_call("c1", "search", "not json {")),
        _tool("c1", "plain text result"),
        _assistant(_call("c2", "use", "plain text result")),
    ]
    graph = lineage_from_openai(messages)
    assert links(graph) == [("c1", "c2", "plain text result")]


def test_openai_mapping_arguments_and_content_parts():
    """Arguments given as a mapping are used as is; content parts are joined from text parts."""
    messages = [
        _assistant(_call("c1", "lookup", {"q": "x"})),
        _tool(
            "c1",
            [
                {"type": "text", "text": '{"ticket": '},
                {"type": "image_url", "image_url": {"url": "ignored"}},
                {"type": "text", "text": '"TCK-42"}'},
                "stray",
            ],
        ),
        _assistant(_call("c2", "close", {"ticket": "TCK-42"})),
    ]
    assert links(lineage_from_openai(messages)) == [("c1", "c2", "TCK-42")]


def test_openai_malformed_entries_are_skipped():
    """Malformed messages, calls and tool results are skipped without raising."""
    messages = [
        "not a message",
        None,
        {"role": "assistant", "tool_calls": "not a list"},
        {
            "role": "assistant",
            "tool_calls": [
                "not a call",
                {"id": "", "function": {"name": "x", "arguments": "{}"}},
                {"id": 5, "function": {"name": "x", "arguments": "{}"}},
                {"id": "no-function"},
                {"id": "bad-function", "function": "x"},
                {"id": "ok", "function": {"arguments": '{"deep": ' * 5000}},
                {"id": "named", "function": {"name": 3, "arguments": None}},
            ],
        },
        {"role": "tool", "content": '"orphan-value"'},
        {"role": "tool", "tool_call_id": "unknown", "content": '"orphan-value"'},
        {"role": "tool", "tool_call_id": 7, "content": '"orphan-value"'},
        {"role": "tool", "tool_call_id": "ok", "content": None},
        {"role": "tool", "tool_call_id": "named", "content": {"already": "parsed-value"}},
        {
            "role": "assistant",
            "tool_calls": [_call("last", "use", '["orphan-value", "parsed-value"]')],
        },
    ]
    graph = lineage_from_openai(messages)
    assert [(n.call_id, n.tool_name, n.iteration) for n in graph.nodes] == [
        ("ok", "(unknown)", 2),
        ("named", "(unknown)", 2),
        ("last", "use", 3),
    ]
    assert links(graph) == [("named", "last", "parsed-value")]


def test_openai_passes_recorder_options():
    """Options reach the recorder: numbers link with match_numbers, evidence adds paths."""
    messages = [
        _assistant(_call("c1", "create", "{}")),
        _tool("c1", '{"ticket_id": 4242}'),
        _assistant(_call("c2", "close", '{"ticket_id": 4242}')),
    ]
    assert lineage_from_openai(messages).edges == ()
    graph = lineage_from_openai(messages, match_numbers=True, evidence=True)
    assert links(graph) == [("c1", "c2", "4242")]
    assert graph.edges[0].reasons == ("exact_number", "same_key")


# ---------------------------------------------------------------- adapters: steps


def test_steps_each_step_is_its_own_iteration():
    """Step N is iteration N with call id "N"; outputs link to later steps' arguments."""
    steps = [
        StepRecord(
            step_id=1, tool_name="create_user", arguments={"name": "Ada"}, output={"id": "u-777"}
        ),
        StepRecord(
            step_id=2, tool_name="open_account", arguments={"user": "u-777"}, output="acct-9"
        ),
        StepRecord(
            step_id=3,
            tool_name="deposit",
            arguments={"user_id": "u-777", "acct": "acct-9"},
            output=None,
        ),
    ]
    graph = lineage_from_steps(steps)
    assert [(n.call_id, n.tool_name, n.iteration) for n in graph.nodes] == [
        ("1", "create_user", 1),
        ("2", "open_account", 2),
        ("3", "deposit", 3),
    ]
    assert links(graph) == [("1", "2", "u-777"), ("1", "3", "u-777"), ("2", "3", "acct-9")]


def test_steps_malformed_entries_are_skipped():
    """Entries without an int step_id are skipped; a missing tool name is "(unknown)"."""

    @dataclasses.dataclass
    class Loose:
        step_id: object
        arguments: object = None
        output: object = None

    steps = [Loose(step_id="1"), Loose(step_id=True), object(), Loose(step_id=4, output="value")]
    steps.append(Loose(step_id=5, arguments={"v": "value"}))
    graph = lineage_from_steps(steps, evidence=True)
    assert [(n.call_id, n.tool_name) for n in graph.nodes] == [
        ("4", "(unknown)"),
        ("5", "(unknown)"),
    ]
    assert graph.edges[0].target_path == "$.v"


# ---------------------------------------------------------------- value objects


def test_value_objects_validate_on_construction():
    """Nodes, edges and graphs refuse bad fields with InvalidArgument."""
    node = LineageNode(index=0, call_id="a", tool_name="t", iteration=1)
    other = LineageNode(index=1, call_id="b", tool_name="t", iteration=2)
    with pytest.raises(InvalidArgument, match="call_id"):
        LineageNode(index=0, call_id="", tool_name="t", iteration=1)
    with pytest.raises(InvalidArgument, match="iteration"):
        LineageNode(index=0, call_id="a", tool_name="t", iteration=True)
    with pytest.raises(InvalidArgument, match="tool_name"):
        LineageNode(index=0, call_id="a", tool_name=None, iteration=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="source must be a LineageNode"):
        LineageEdge(source="a", target=node, value="v")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="confidence"):
        LineageEdge(source=node, target=other, value="v", confidence=1.5)
    with pytest.raises(InvalidArgument, match="confidence"):
        LineageEdge(source=node, target=other, value="v", confidence=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="reasons"):
        LineageEdge(source=node, target=other, value="v", reasons=["x"])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="source_path"):
        LineageEdge(source=node, target=other, value="v", source_path=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="source_failed"):
        LineageEdge(source=node, target=other, value="v", source_failed=0)  # type: ignore[arg-type]
    edge = LineageEdge(source=node, target=other, value="v")
    with pytest.raises(InvalidArgument, match="nodes must be a tuple"):
        LineageGraph(nodes=[node, other])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"nodes\[0\] must be a LineageNode with index 0"):
        LineageGraph(nodes=(other,))
    with pytest.raises(InvalidArgument, match="edges must be a tuple"):
        LineageGraph(nodes=(node, other), edges=[edge])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"edges\[0\] must be a LineageEdge"):
        LineageGraph(nodes=(node, other), edges=("edge",))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="refers to a node not in nodes"):
        LineageGraph(nodes=(node,), edges=(edge,))
    with pytest.raises(InvalidArgument, match="evidence must be a bool"):
        LineageGraph(evidence=None)  # type: ignore[arg-type]
    stranger = LineageNode(index=1, call_id="z", tool_name="t", iteration=2)
    with pytest.raises(InvalidArgument, match="refers to a node not in nodes"):
        LineageGraph(nodes=(node, stranger), edges=(edge,))
    twin = LineageNode(index=1, call_id="b", tool_name="t", iteration=2)
    assert LineageGraph(nodes=(node, twin), edges=(edge,)).edges == (edge,)


# ---------------------------------------------------------------- export snapshots


def _small_graph(*, evidence):
    return play(
        [
            ("it", 1),
            ("start", "call_1", {"switch": "lva1-mds01"}, "flogi"),
            ("start", "call_2", None, "noop"),
            ("end", "call_1", {"fcid": "0x650300", "note": 'say "hi"\n' + "x" * 40}),
            ("it", 2),
            (
                "start",
                "call_3",
                {"initiator_fcid": "0x650300", "n": 'say "hi"\n' + "x" * 40},
                "fcns",
            ),
        ],
        evidence=evidence,
    )


def test_export_dot_default_snapshot():
    """to_dot: boxes by call, same-iteration calls ranked together, edges labelled by value."""
    assert _small_graph(evidence=False).to_dot() == (
        "digraph lineage {\n"
        "  rankdir=LR;\n"
        "  node [shape=box];\n"
        '  n0 [label="call_1: flogi (iteration 1)"];\n'
        '  n1 [label="call_2: noop (iteration 1)"];\n'
        '  n2 [label="call_3: fcns (iteration 2)"];\n'
        "  { rank=same; n0; n1; }\n"
        '  n0 -> n2 [label="0x650300"];\n'
        '  n0 -> n2 [label="say \\"hi\\"\\nxxxxxxxxxxxxxxxxxxxxxx…"];\n'
        "}\n"
    )


def test_export_mermaid_default_snapshot():
    """to_mermaid: a left-to-right flowchart with quoted, truncated labels."""
    assert _small_graph(evidence=False).to_mermaid() == (
        "flowchart LR\n"
        '  n0["call_1: flogi (iteration 1)"]\n'
        '  n1["call_2: noop (iteration 1)"]\n'
        '  n2["call_3: fcns (iteration 2)"]\n'
        '  n0 -->|"0x650300"| n2\n'
        '  n0 -->|"say #quot;hi#quot; xxxxxxxxxxxxxxxxxxxxxx…"| n2\n'
    )


def test_export_json_default_snapshot():
    """to_json: sorted keys, full values, edges by node index, no evidence fields."""
    long_value = 'say "hi"\n' + "x" * 40
    document = json.loads(_small_graph(evidence=False).to_json())
    assert document == {
        "evidence": False,
        "nodes": [
            {"index": 0, "call_id": "call_1", "tool_name": "flogi", "iteration": 1},
            {"index": 1, "call_id": "call_2", "tool_name": "noop", "iteration": 1},
            {"index": 2, "call_id": "call_3", "tool_name": "fcns", "iteration": 2},
        ],
        "edges": [
            {"source": 0, "target": 2, "value": "0x650300"},
            {"source": 0, "target": 2, "value": long_value},
        ],
    }
    text = LineageGraph(
        nodes=(LineageNode(index=0, call_id="a", tool_name="t", iteration=1),)
    ).to_json()
    assert text == (
        "{\n"
        '  "edges": [],\n'
        '  "evidence": false,\n'
        '  "nodes": [\n'
        "    {\n"
        '      "call_id": "a",\n'
        '      "index": 0,\n'
        '      "iteration": 1,\n'
        '      "tool_name": "t"\n'
        "    }\n"
        "  ]\n"
        "}\n"
    )


LONG_DOT = 'say \\"hi\\"\\n' + "x" * 22 + "…"


def test_export_evidence_snapshots():
    """Evidence labels add the paths and the confidence; JSON adds every evidence field."""
    graph = _small_graph(evidence=True)
    dot = graph.to_dot().splitlines()
    assert dot[-3:-1] == [
        '  n0 -> n2 [label="0x650300\\n$.fcid -> $.initiator_fcid\\nconfidence 0.85"];',
        f'  n0 -> n2 [label="{LONG_DOT}\\n$.note -> $.n\\nconfidence 0.60"];',
    ]
    mermaid = graph.to_mermaid().splitlines()
    assert mermaid[-2] == '  n0 -->|"0x650300, $.fcid -> $.initiator_fcid, confidence 0.85"| n2'
    edges = json.loads(graph.to_json())["edges"]
    assert edges[0] == {
        "source": 0,
        "target": 2,
        "value": "0x650300",
        "source_path": "$.fcid",
        "target_path": "$.initiator_fcid",
        "confidence": 0.85,
        "reasons": ["exact_string", "key_suffix"],
        "source_failed": False,
    }


def test_export_failed_sources_are_dashed_and_odd_iterations_are_js_text():
    """Edges from failed calls are dashed (DOT) or dotted (Mermaid); NaN iterations print as NaN."""
    graph = play(
        [
            ("it", 1),
            ("start", "A", None),
            ("fail", "A", "timeout-9"),
            ("it", 2.5),
            ("start", "B", "timeout-9"),
            ("it", math.nan),
            ("start", "C", None),
        ],
        evidence=True,
    )
    assert '  n0 -> n1 [label="timeout-9\\n$ -> $\\nconfidence 0.40", style=dashed];' in (
        graph.to_dot().splitlines()
    )
    mermaid = graph.to_mermaid()
    assert '  n0 -.->|"timeout-9, $ -> $, confidence 0.40"| n1\n' in mermaid
    assert '  n2["C: tool_C (iteration NaN)"]\n' in mermaid
    nodes = json.loads(graph.to_json())["nodes"]
    assert [n["iteration"] for n in nodes] == [1, 2.5, "NaN"]


def test_a_transaction_gives_the_lineage_of_its_live_steps():
    """`Transaction.lineage()` links a step to the earlier step whose output it consumed."""
    import agenttx  # noqa: PLC0415

    @agenttx.tool(inline=True)
    def create(name: str) -> dict:
        return {"user_id": f"user-{name}"}

    @agenttx.tool(inline=True)
    def greet(user: str) -> dict:
        return {"greeted": user}

    tx = agenttx.Transaction(tools=[create, greet])
    tx.execute_step(1, "create", {"name": "ada"})
    tx.execute_step(2, "greet", {"user": "user-ada"})  # the value, copied: no reference
    graph = tx.lineage()
    assert [(n.call_id, n.tool_name) for n in graph.nodes] == [("1", "create"), ("2", "greet")]
    assert [(e.source.call_id, e.target.call_id, e.value) for e in graph.edges] == [
        ("1", "2", "user-ada")
    ]
    assert tx.lineage(evidence=True).edges[0].target_path is not None
