"""Plan metrics are pure functions of synthetic timings: no tool runs, no clock is read."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agenttx
from agenttx._plans._metrics import (
    AttemptTiming,
    CostBreakdown,
    NodeTiming,
    critical_path,
    percentile,
    plan_metrics,
)


def _attempt(eligible, start, end, *costs):
    return AttemptTiming(eligible_at=eligible, started_at=start, finished_at=end, costs=costs)


def _order_timings():
    """The order DAG: lookup and stock run together, reserve after both, confirm after it."""
    return [
        NodeTiming(node_id="customer_lookup", tool="lookup", attempts=(_attempt(0, 0, 2),)),
        NodeTiming(node_id="stock_check", tool="stock", attempts=(_attempt(0, 0, 3),)),
        NodeTiming(
            node_id="reserve",
            tool="reserve",
            prerequisites=frozenset({"customer_lookup", "stock_check"}),
            attempts=(_attempt(3, 4, 5),),  # waited 1 s for capacity
        ),
        NodeTiming(
            node_id="confirm",
            tool="confirm",
            prerequisites=frozenset({"reserve"}),
            attempts=(_attempt(5, 5, 6),),
        ),
    ]


def test_makespan_and_critical_path_follow_the_longest_chain():
    """The critical path takes the longer of two parallel branches and weighs durations."""
    metrics = plan_metrics(_order_timings(), started_at=0, finished_at=6)
    assert metrics.makespan_s == 6
    assert metrics.critical_path == ("stock_check", "reserve", "confirm")
    assert metrics.critical_path_s == 3 + 1 + 1
    assert metrics.critical_path_ratio == pytest.approx(6 / 5)


def test_parallelism_is_busy_time_over_makespan():
    """Parallelism is the sum of running times divided by the makespan (mean concurrency)."""
    metrics = plan_metrics(_order_timings(), started_at=0, finished_at=6)
    assert metrics.parallelism == pytest.approx((2 + 3 + 1 + 1) / 6)


def test_per_node_figures_are_read_only_and_add_up_to_the_run_figures():
    """`metrics.nodes` is a read-only mapping in plan order; each node's figures, built when
    read, are the same object on a second read and sum to the run's waits and retries."""
    metrics = plan_metrics(_order_timings(), started_at=0, finished_at=6)
    nodes = metrics.nodes
    assert list(nodes) == ["customer_lookup", "stock_check", "reserve", "confirm"]
    assert len(nodes) == 4
    assert nodes["reserve"] is nodes["reserve"]
    assert sum(node.prerequisite_wait_s for node in nodes.values()) == metrics.prerequisite_wait_s
    assert sum(node.capacity_wait_s for node in nodes.values()) == metrics.capacity_wait_s
    assert sum(node.retries for node in nodes.values()) == metrics.retries
    assert "missing" not in nodes
    with pytest.raises(TypeError):
        nodes["reserve"] = nodes["confirm"]  # type: ignore[index]


def test_queue_waits_split_into_prerequisite_and_capacity_waits():
    """Prerequisite wait ends when a node becomes eligible; capacity wait ends when it starts."""
    metrics = plan_metrics(_order_timings(), started_at=0, finished_at=6)
    reserve = metrics.nodes["reserve"]
    assert reserve.prerequisite_wait_s == 3
    assert reserve.capacity_wait_s == 1
    assert metrics.nodes["customer_lookup"].prerequisite_wait_s == 0
    assert metrics.prerequisite_wait_s == 0 + 0 + 3 + 5
    assert metrics.capacity_wait_s == 1
    assert metrics.queue_wait_s == metrics.prerequisite_wait_s + metrics.capacity_wait_s


def test_retries_count_attempts_after_the_first_and_their_costs_are_retry_overhead():
    """A node's earlier attempts count as retries, and what they reported counts as `retry`."""
    timings = [
        NodeTiming(
            node_id="charge",
            tool="pay",
            attempts=(
                _attempt(0, 0, 1, ("model", Decimal("0.50"))),
                _attempt(1.5, 1.5, 2, ("tool", Decimal("0.25")), ("model", Decimal("0.01"))),
            ),
        )
    ]
    metrics = plan_metrics(timings, started_at=0, finished_at=2)
    assert metrics.retries == 1
    assert metrics.nodes["charge"].retries == 1
    assert metrics.tools["pay"].calls == 2
    assert metrics.cost == CostBreakdown(
        model=Decimal("0.01"), tool=Decimal("0.25"), retry=Decimal("0.50")
    )
    assert metrics.cost.total == Decimal("0.76")
    assert metrics.cost.currency == "GBP"
    # The backoff gap (1 .. 1.5) is not running time, but it is part of the node's duration.
    assert metrics.nodes["charge"].duration_s == 2
    assert metrics.parallelism == pytest.approx(1.5 / 2)


def test_latency_percentiles_per_node_and_per_tool_are_nearest_rank():
    """p50 and p95 per tool are nearest-rank over attempts; the run's over node durations."""
    timings = [
        NodeTiming(node_id=f"n{i}", tool="t", attempts=(_attempt(0, 0, float(i)),))
        for i in range(1, 21)
    ]
    metrics = plan_metrics(timings, started_at=0, finished_at=20)
    assert metrics.tools["t"].latency_p50_s == 10
    assert metrics.tools["t"].latency_p95_s == 19
    assert metrics.latency_p50_s == 10
    assert metrics.latency_p95_s == 19
    assert metrics.nodes["n7"].latency_p50_s == metrics.nodes["n7"].latency_p95_s == 7


def test_percentile_edges():
    """No values give 0.0; one value is every percentile; p outside (0, 100] is refused."""
    assert percentile([], 50) == 0.0
    assert percentile([4.0], 1) == percentile([4.0], 100) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    with pytest.raises(agenttx.InvalidArgument):
        percentile([1.0], 0)


def test_nodes_that_never_ran_weigh_nothing_and_cost_nothing():
    """A skipped node has no attempts: duration 0, no latency, no cost; the run still measures."""
    timings = [
        NodeTiming(node_id="a", tool="t", attempts=(_attempt(0, 0, 1),)),
        NodeTiming(node_id="b", tool="t", prerequisites=frozenset({"a"})),
    ]
    metrics = plan_metrics(timings, started_at=0, finished_at=1)
    assert metrics.critical_path == ("a",)  # a tie: a path gains nothing from b
    assert metrics.critical_path_s == 1
    assert metrics.nodes["b"].attempts == 0
    assert metrics.nodes["b"].prerequisite_wait_s == 0
    assert metrics.cost.total == 0


def test_an_empty_or_instant_run_has_no_ratio_and_no_parallelism():
    """With nothing timed, the ratio is None and parallelism 0: never a division by zero."""
    metrics = plan_metrics([], started_at=5, finished_at=5)
    assert metrics.critical_path_ratio is None
    assert metrics.parallelism == 0
    assert metrics.critical_path == ()


def test_a_long_chain_is_measured_without_recursion():
    """A 10,000-node chain: the critical path is the whole chain (no recursion limit)."""
    timings = [
        NodeTiming(
            node_id=f"n{i}",
            tool="t",
            prerequisites=frozenset({f"n{i - 1}"}) if i else frozenset(),
            attempts=(_attempt(i, i, i + 1),),
        )
        for i in range(10_000)
    ]
    metrics = plan_metrics(timings, started_at=0, finished_at=10_000)
    assert len(metrics.critical_path) == 10_000
    assert metrics.critical_path_ratio == pytest.approx(1.0)


def test_cycles_and_disordered_times_are_refused():
    """Timings whose prerequisites cycle, or whose times go backwards, raise InvalidArgument."""
    looped = {
        "a": NodeTiming(node_id="a", tool="t", prerequisites=frozenset({"b"})),
        "b": NodeTiming(node_id="b", tool="t", prerequisites=frozenset({"a"})),
    }
    with pytest.raises(agenttx.InvalidArgument, match="cycle"):
        critical_path(looped)
    with pytest.raises(agenttx.InvalidArgument, match="in that order"):
        plan_metrics(
            [NodeTiming(node_id="a", tool="t", attempts=(_attempt(2, 1, 3),))],
            started_at=0,
            finished_at=3,
        )
    with pytest.raises(agenttx.InvalidArgument, match="end after"):
        plan_metrics([], started_at=2, finished_at=1)


def test_cost_breakdowns_add_and_refuse_bad_amounts():
    """Breakdowns add field by field; a float, negative or NaN amount is refused."""
    one = CostBreakdown(model=Decimal("0.1"))
    two = CostBreakdown(model=Decimal("0.2"), infrastructure=Decimal(1))
    assert (one + two).total == Decimal("1.3")
    assert (one + two).model == Decimal("0.3")
    for bad in (0.1, Decimal("-0.01"), Decimal("NaN")):
        with pytest.raises(agenttx.InvalidArgument, match="model"):
            CostBreakdown(model=bad)
    with pytest.raises(agenttx.InvalidArgument, match="category"):
        CostBreakdown.of([("tokens", Decimal(1))])


def _reference_critical_path(nodes):
    """Kahn's algorithm with a list of dependants a node: the model `critical_path` follows."""
    dependants = {node_id: [] for node_id in nodes}
    waiting = {}
    for node_id, timing in nodes.items():
        known = [p for p in timing.prerequisites if p in nodes]
        waiting[node_id] = len(known)
        for prerequisite in known:
            dependants[prerequisite].append(node_id)
    ready = [node_id for node_id, count in waiting.items() if count == 0]
    best = {node_id: nodes[node_id].duration_s for node_id in ready}
    came_from = dict.fromkeys(ready)
    while ready:
        node_id = ready.pop()
        for dependant in dependants[node_id]:
            candidate = best[node_id] + nodes[dependant].duration_s
            if dependant not in best or candidate > best[dependant]:
                best[dependant] = candidate
                came_from[dependant] = node_id
            waiting[dependant] -= 1
            if waiting[dependant] == 0:
                ready.append(dependant)
    if not best:
        return 0.0, ()
    end = max(best, key=lambda node_id: best[node_id])
    path = []
    cursor = end
    while cursor is not None:
        path.append(cursor)
        cursor = came_from[cursor]
    return best[end], tuple(reversed(path))


@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 1.0, 2.0]), st.sets(st.integers(0, 30), max_size=3)),
        max_size=12,
    )
)
def test_critical_path_agrees_with_kahn_over_lists_ties_included(shape):
    """The critical path (flat lists of positions) is the reference algorithm's, ties and
    prerequisites outside the timings included; so is the one `plan_metrics` reports."""
    nodes = {
        f"n{i}": NodeTiming(
            node_id=f"n{i}",
            tool="t",
            prerequisites=frozenset(f"n{p}" for p in before if p < i or p > 20),
            attempts=(_attempt(0, 0, seconds),) if seconds else (),
        )
        for i, (seconds, before) in enumerate(shape)
    }
    expected = _reference_critical_path(nodes)
    assert critical_path(nodes) == expected
    metrics = plan_metrics(list(nodes.values()), started_at=0, finished_at=10)
    assert (metrics.critical_path_s, metrics.critical_path) == expected
    rebuilt = plan_metrics(
        list(nodes.values()), started_at=0, finished_at=10, timing_of=nodes.__getitem__
    )
    assert rebuilt == metrics
