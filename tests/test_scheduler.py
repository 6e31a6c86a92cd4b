"""The plan scheduler: ready sets, limits, exactly-once results, failure policies, cancellation."""

from __future__ import annotations

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agenttx import InvalidArgument
from agenttx._plans._scheduler import (
    Delivery,
    Entry,
    NodeState,
    RateLimit,
    Scheduler,
    Start,
    Task,
)

ORDER = [
    Task(id="customer_lookup", tool="lookup_customer"),
    Task(id="stock_check", tool="check_stock"),
    Task(
        id="reserve",
        tool="reserve_stock",
        prerequisites={"customer_lookup", "stock_check"},
        exclusive="order:7",
    ),
    Task(id="confirm", tool="send_confirmation", prerequisites={"reserve"}),
]


def nodes(starts):
    return [s.node for s in starts]


def run_all(sched, now=0.0):
    """Complete every node successfully, in start order; the start order."""
    order = []
    while sched.is_active():
        starts = sched.get_ready(now)
        assert starts, "an active run with nothing to start and nothing running"
        for start in starts:
            order.append(start.node)
            sched.done(start.node, start.attempt)
    return order


def chain(n):
    return [Task(id="n0")] + [Task(id=f"n{i}", prerequisites={f"n{i - 1}"}) for i in range(1, n)]


# -- the ready set ------------------------------------------------------------------------------


def test_order_workflow_runs_lookups_together_then_reserve_then_confirm():
    """Independent nodes start together; a node starts once all its prerequisites succeeded."""
    sched = Scheduler(ORDER, max_concurrency=8)
    assert nodes(sched.get_ready(0)) == ["customer_lookup", "stock_check"]
    assert sched.get_ready(0) == ()
    assert sched.done("customer_lookup", "customer_lookup#1").ready == ()
    assert sched.state("reserve") is NodeState.PENDING
    assert sched.unresolved("reserve") == 1
    assert sched.done("stock_check", "stock_check#1").ready == ("reserve",)
    assert sched.state("reserve") is NodeState.READY
    assert nodes(sched.get_ready(0)) == ["reserve"]
    assert sched.state("reserve") is NodeState.RUNNING
    assert sched.done("reserve", "reserve#1").ready == ("confirm",)
    assert nodes(sched.get_ready(0)) == ["confirm"]
    assert sched.is_active()
    sched.done("confirm", "confirm#1")
    assert not sched.is_active()
    assert {sched.state(n) for n in sched.nodes} == {NodeState.SUCCEEDED}


def test_counts_start_at_the_number_of_distinct_prerequisites():
    """Several edges to one prerequisite count once; nodes without prerequisites start READY."""
    sched = Scheduler(
        [Task(id="a"), Task(id="b"), Task(id="c", prerequisites=["a", "a", "b"])],
        max_concurrency=1,
    )
    assert sched.unresolved("c") == 2
    assert sched.state("a") is NodeState.READY
    assert sched.state("c") is NodeState.PENDING


def test_starts_carry_fresh_attempt_ids_numbered_from_one():
    """Each start has an attempt id unique in the scheduler and the attempt's number."""
    sched = Scheduler([Task(id="a")], max_concurrency=1)
    (start,) = sched.get_ready(0)
    assert start == Start(node="a", attempt="a#1", number=1)
    assert sched.attempts("a") == ("a#1",)


def test_a_resumed_node_numbers_its_attempts_after_those_it_had():
    """`Task(attempts=n)`: the next attempt is n + 1, also after a retry and a cancellation;
    a negative count is refused."""
    sched = Scheduler([Task(id="a", attempts=3)], max_concurrency=1)
    (start,) = sched.get_ready(0)
    assert start == Start(node="a", attempt="a#4", number=4)
    sched.failed("a", "a#4", retry_at=0)
    (retry,) = sched.get_ready(0)
    assert retry.number == 5
    assert sched.done("a", "a#4").delivery is Delivery.DUPLICATE
    assert sched.done("a", "a#2").delivery is Delivery.STALE  # a dead process's attempt
    update = sched.cancel("stop")
    assert update.interrupted == (Start(node="a", attempt="a#5", number=5),)
    with pytest.raises(InvalidArgument, match="attempts must be an integer >= 0"):
        Task(id="a", attempts=-1)


def test_nodes_start_in_the_order_they_became_ready():
    """The ready queue is first in, first out."""
    sched = Scheduler(
        [Task(id="root")] + [Task(id=f"c{i}", prerequisites={"root"}) for i in range(5)],
        max_concurrency=2,
    )
    sched.done("root", sched.get_ready(0)[0].attempt)
    assert nodes(sched.get_ready(0)) == ["c0", "c1"]
    sched.done("c1", "c1#1")
    assert nodes(sched.get_ready(0)) == ["c2"]


# -- limits -------------------------------------------------------------------------------------


def test_max_concurrency_keeps_the_rest_queued():
    """At most max_concurrency nodes run; the others stay READY and start as slots free up."""
    sched = Scheduler([Task(id=f"t{i}") for i in range(5)], max_concurrency=2)
    assert nodes(sched.get_ready(0)) == ["t0", "t1"]
    assert sched.get_ready(0) == ()
    assert sched.state("t2") is NodeState.READY
    assert sched.running_count == 2
    sched.done("t0", "t0#1")
    assert nodes(sched.get_ready(0)) == ["t2"]


def test_resource_tokens_are_never_over_committed():
    """A node holds its tokens while running; one that needs more than are free waits."""
    sched = Scheduler(
        [
            Task(id="a", resources={"api": 2}),
            Task(id="b", resources={"api": 2}),
            Task(id="c", resources={"api": 1}),
        ],
        max_concurrency=8,
        capacities={"api": 3},
    )
    assert nodes(sched.get_ready(0)) == ["a"]  # c waits behind b: first come, first served
    assert sched.state("b") is NodeState.READY
    sched.done("a", "a#1")
    assert nodes(sched.get_ready(0)) == ["b", "c"]


def test_a_large_request_is_not_starved_by_smaller_ones():
    """Once a node waits on a resource, later arrivals queue behind it instead of overtaking."""
    sched = Scheduler(
        [Task(id="small0", resources={"api": 1}), Task(id="big", resources={"api": 2})]
        + [Task(id=f"small{i}", resources={"api": 1}) for i in range(1, 4)],
        max_concurrency=8,
        capacities={"api": 2},
    )
    assert nodes(sched.get_ready(0)) == ["small0"]
    sched.done("small0", "small0#1")
    assert nodes(sched.get_ready(0)) == ["big"]
    sched.done("big", "big#1")
    assert nodes(sched.get_ready(0)) == ["small1", "small2"]


def test_an_exclusive_key_has_one_holder_at_a_time():
    """Nodes sharing an exclusive key never run together; other keys are independent."""
    sched = Scheduler(
        [
            Task(id="r1", exclusive="order:1"),
            Task(id="r2", exclusive="order:1"),
            Task(id="r3", exclusive="order:2"),
        ],
        max_concurrency=8,
    )
    starts = sched.get_ready(0)
    assert nodes(starts) == ["r1", "r3"]
    sched.done("r1", "r1#1")
    (start,) = sched.get_ready(0)
    assert start.node == "r2"
    assert start.waited == ("exclusive:order:1",)


def test_a_rate_limit_is_a_token_bucket_driven_by_now():
    """A tool starts at most `burst` times at once, then one more per 1/per_second seconds."""
    sched = Scheduler(
        [Task(id=f"c{i}", tool="charge") for i in range(4)] + [Task(id="free", tool="other")],
        max_concurrency=8,
        rate_limits={"charge": RateLimit(per_second=2.0, burst=2)},
    )
    assert nodes(sched.get_ready(10.0)) == ["c0", "c1", "free"]
    assert sched.next_wakeup() == pytest.approx(10.5)
    assert sched.get_ready(10.4) == ()
    (start,) = sched.get_ready(10.5)
    assert start.node == "c2"
    assert start.waited == ("rate:charge",)
    assert sched.next_wakeup() == pytest.approx(11.0)
    assert nodes(sched.get_ready(20.0)) == ["c3"]
    assert sched.next_wakeup() is None


def test_a_node_waiting_on_one_limit_checks_the_others_again():
    """A node released by one limit but held by another waits on that one, not lost."""
    sched = Scheduler(
        [
            Task(id="hold", exclusive="k"),
            Task(id="x", tool="t", exclusive="k"),
            Task(id="y", tool="t"),
        ],
        max_concurrency=8,
        rate_limits={"t": RateLimit(per_second=1.0)},
    )
    assert nodes(sched.get_ready(0)) == ["hold", "y"]  # x waits for k, y takes t's token
    sched.done("hold", "hold#1")
    assert sched.get_ready(0.5) == ()  # k is free now, but t has no token before 1.0
    assert sched.next_wakeup() == pytest.approx(1.0)
    (start,) = sched.get_ready(1.0)
    assert (start.node, start.waited) == ("x", ("exclusive:k", "rate:t"))


def test_a_rate_limited_node_held_by_concurrency_waits_for_a_result_not_for_time():
    """A token in the bucket but no free slot: next_wakeup() is None, so the runner never spins."""
    sched = Scheduler(
        [Task(id="a", tool="t"), Task(id="b", tool="t"), Task(id="c")],
        max_concurrency=2,
        rate_limits={"t": RateLimit(per_second=1.0)},
    )
    assert nodes(sched.get_ready(0)) == ["a", "c"]  # b waits for t's next token
    assert sched.next_wakeup() == pytest.approx(1.0)
    assert sched.get_ready(1.5) == ()  # the token is there, but both slots are taken
    assert sched.next_wakeup() is None
    sched.done("c", "c#1")
    assert nodes(sched.get_ready(1.5)) == ["b"]


def test_capacity_waits_resume_when_concurrency_frees_up():
    """A limit released while every slot is busy is drained on a later call, not forgotten."""
    sched = Scheduler(
        [Task(id="a", exclusive="k"), Task(id="b", exclusive="k"), Task(id="c"), Task(id="d")],
        max_concurrency=2,
    )
    assert nodes(sched.get_ready(0)) == ["a", "c"]
    sched.done("a", "a#1")
    # b's lock is free, and one slot: b (waiting longest) goes before d.
    assert nodes(sched.get_ready(0)) == ["b"]
    sched.done("c", "c#1")
    assert nodes(sched.get_ready(0)) == ["d"]


# -- exactly-once results -----------------------------------------------------------------------


def test_a_duplicate_success_changes_nothing():
    """The second delivery of one attempt's success is DUPLICATE and counts drop only once."""
    sched = Scheduler(
        [Task(id="a"), Task(id="b"), Task(id="c", prerequisites={"a", "b"})], max_concurrency=4
    )
    sched.get_ready(0)
    assert sched.done("a", "a#1").delivery is Delivery.APPLIED
    assert sched.unresolved("c") == 1
    again = sched.done("a", "a#1")
    assert again.delivery is Delivery.DUPLICATE
    assert again.ready == ()
    assert sched.unresolved("c") == 1
    assert sched.failed("a", "a#1").delivery is Delivery.DUPLICATE
    assert sched.state("a") is NodeState.SUCCEEDED


def test_a_result_of_an_attempt_never_issued_is_stale():
    """An attempt id the node was never given is refused as STALE."""
    sched = Scheduler([Task(id="a")], max_concurrency=1)
    sched.get_ready(0)
    assert sched.done("a", "a#2").delivery is Delivery.STALE
    assert sched.done("a", "b#1").delivery is Delivery.STALE
    assert sched.state("a") is NodeState.RUNNING


def test_only_the_exact_ids_issued_are_recognised():
    """Ids that only look like an issued one (padded, signed, another node's, not text) are STALE;
    earlier attempts of a retried node are DUPLICATE once applied, and ids are listed in order."""
    sched = Scheduler([Task(id="a#b", attempts=2)], max_concurrency=1)
    (start,) = sched.get_ready(0)
    assert start.attempt == "a#b#3"
    for wrong in ("a#b#03", "a#b#+3", "a#b# 3", "a#b#", "a#3", "b#3", "a#b#4", "a#b#2", 3, None):
        assert sched.done("a#b", wrong).delivery is Delivery.STALE  # type: ignore[arg-type]
    assert sched.failed("a#b", "a#b#3", retry_at=1.0).delivery is Delivery.APPLIED
    (again,) = sched.get_ready(1.0)
    assert again.attempt == "a#b#4"
    assert sched.done("a#b", "a#b#3").delivery is Delivery.DUPLICATE
    assert sched.attempts("a#b") == ("a#b#3", "a#b#4")
    assert sched.done("a#b", "a#b#4").delivery is Delivery.APPLIED
    assert sched.done("a#b", "a#b#4").delivery is Delivery.DUPLICATE


def test_a_result_for_an_unknown_node_is_misuse():
    """done() for a node the scheduler does not know raises InvalidArgument."""
    sched = Scheduler([Task(id="a")], max_concurrency=1)
    with pytest.raises(InvalidArgument, match="unknown node 'zz'"):
        sched.done("zz", "zz#1")
    with pytest.raises(InvalidArgument, match="unknown node"):
        sched.state("zz")


def test_a_result_before_the_start_is_stale():
    """A READY node has no running attempt: any result for it is refused."""
    sched = Scheduler([Task(id="a")], max_concurrency=1)
    assert sched.done("a", "a#1").delivery is Delivery.STALE
    assert sched.state("a") is NodeState.READY


# -- retries ------------------------------------------------------------------------------------


def test_a_retried_node_waits_for_retry_at_and_gets_a_new_attempt():
    """failed(retry_at=t): READY again, started at t with attempt 2; attempt 1 is done with."""
    sched = Scheduler([Task(id="a"), Task(id="b", prerequisites={"a"})], max_concurrency=1)
    sched.get_ready(0)
    update = sched.failed("a", "a#1", retry_at=5.0)
    assert update.delivery is Delivery.APPLIED
    assert update.skipped == ()
    assert sched.state("a") is NodeState.READY
    assert sched.running_count == 0
    assert sched.next_wakeup() == 5.0
    assert sched.get_ready(4.9) == ()
    (start,) = sched.get_ready(5.0)
    assert (start.attempt, start.number) == ("a#2", 2)
    assert sched.done("a", "a#1").delivery is Delivery.DUPLICATE  # attempt 1's result is in
    assert sched.state("a") is NodeState.RUNNING
    assert sched.done("a", "a#2").ready == ("b",)


def test_a_retry_gives_back_its_tokens_while_it_waits():
    """A failed attempt releases its resources and exclusive key before the retry."""
    sched = Scheduler([Task(id="a", exclusive="k"), Task(id="b", exclusive="k")], max_concurrency=2)
    assert nodes(sched.get_ready(0)) == ["a"]
    sched.failed("a", "a#1", retry_at=1.0)
    assert nodes(sched.get_ready(0.5)) == ["b"]
    assert sched.get_ready(1.0) == ()  # a is due, but b holds k now
    sched.done("b", "b#1")
    assert nodes(sched.get_ready(1.0)) == ["a"]


def test_a_postponed_start_is_queued_again_with_the_same_attempt_and_its_wait_named():
    """postpone: READY again, its slot and key given back, restarted at retry_at as the same
    attempt, whose Start names the outside limit once; a stale start changes nothing."""
    sched = Scheduler([Task(id="a", exclusive="k"), Task(id="b", exclusive="k")], max_concurrency=1)
    (start,) = sched.get_ready(0)
    assert sched.postpone(start, 1.0, "hold:k")
    assert sched.state("a") is NodeState.READY
    assert sched.running_count == 0
    assert sched.next_wakeup() == 1.0
    (other,) = sched.get_ready(0.5)  # b takes the slot and the key meanwhile
    assert other.node == "b"
    sched.done("b", "b#1")
    (again,) = sched.get_ready(1.0)
    assert (again.attempt, again.number, again.waited) == ("a#1", 1, ("hold:k",))
    assert sched.postpone(again, 2.0, "hold:k")
    (third,) = sched.get_ready(2.0)
    assert third.waited == ("hold:k",)
    assert sched.done("a", "a#1").delivery is Delivery.APPLIED
    assert not sched.postpone(third, 4.0, "hold:k")  # no longer running: nothing changes
    assert sched.state("a") is NodeState.SUCCEEDED


def test_retry_at_must_be_a_finite_time():
    """A NaN, infinite or non-number retry_at is refused before anything changes."""
    sched = Scheduler([Task(id="a")], max_concurrency=1)
    sched.get_ready(0)
    for bad in (math.nan, math.inf, "soon", True):
        with pytest.raises(InvalidArgument, match="retry_at"):
            sched.failed("a", "a#1", retry_at=bad)
    assert sched.state("a") is NodeState.RUNNING


# -- failure policies ---------------------------------------------------------------------------


def diamond(on_failure="skip_dependants"):
    return Scheduler(
        [
            Task(id="a"),
            Task(id="b", prerequisites={"a"}),
            Task(id="c", prerequisites={"b"}),
            Task(id="d", prerequisites={"c", "x"}),
            Task(id="x"),
            Task(id="y", prerequisites={"x"}),
        ],
        max_concurrency=1,
        on_failure=on_failure,
    )


def test_a_failure_skips_its_dependants_transitively_and_independent_work_goes_on():
    """skip_dependants: every descendant is SKIPPED; nodes that do not depend on it still run."""
    sched = diamond()
    assert nodes(sched.get_ready(0)) == ["a"]
    update = sched.failed("a", "a#1")
    assert update.skipped == ("b", "c", "d")
    assert sched.state("a") is NodeState.FAILED
    assert [sched.state(n) for n in "bcd"] == [NodeState.SKIPPED] * 3
    assert run_all(sched) == ["x", "y"]
    assert sched.state("y") is NodeState.SUCCEEDED
    assert sched.unresolved("d") == 1  # x resolved; c never will


def test_a_timeout_ends_the_node_timed_out():
    """failed(timed_out=True) without a retry ends the node TIMED_OUT; dependants are skipped."""
    sched = Scheduler([Task(id="a"), Task(id="b", prerequisites={"a"})], max_concurrency=1)
    sched.get_ready(0)
    assert sched.failed("a", "a#1", timed_out=True).skipped == ("b",)
    assert sched.state("a") is NodeState.TIMED_OUT


def test_an_optional_prerequisite_that_fails_still_releases_the_dependant():
    """A node listing a failed (or skipped) prerequisite in optional becomes READY."""
    sched = Scheduler(
        [
            Task(id="a"),
            Task(id="b", prerequisites={"a"}),
            Task(id="fallback", prerequisites={"a"}, optional={"a"}),
            Task(id="late", prerequisites={"b", "fallback"}, optional={"b"}),
        ],
        max_concurrency=4,
    )
    sched.get_ready(0)
    update = sched.failed("a", "a#1")
    assert update.skipped == ("b",)
    assert update.ready == ("fallback",)
    assert sched.unresolved("late") == 1
    assert nodes(sched.get_ready(0)) == ["fallback"]
    assert sched.done("fallback", "fallback#1").ready == ("late",)


def test_cancel_all_cancels_every_unfinished_node_on_a_failure():
    """cancel_all: one final failure cancels the rest, running nodes included."""
    sched = Scheduler(
        [Task(id="a"), Task(id="b"), Task(id="c", prerequisites={"a"}), Task(id="d")],
        max_concurrency=2,
        on_failure="cancel_all",
    )
    sched.get_ready(0)
    update = sched.failed("a", "a#1")
    assert update.cancelled == ("b", "c", "d")
    assert update.interrupted == (Start(node="b", attempt="b#1", number=1),)
    assert sched.cancel_reason == "node 'a' failed"
    assert sched.state("a") is NodeState.FAILED
    assert not sched.is_active()
    assert sched.done("b", "b#1").delivery is Delivery.STALE
    assert sched.get_ready(0) == ()


def test_a_retried_failure_does_not_trigger_the_policy():
    """Under cancel_all, a failure with retry_at cancels nothing."""
    sched = Scheduler([Task(id="a"), Task(id="b")], max_concurrency=2, on_failure="cancel_all")
    sched.get_ready(0)
    assert sched.failed("a", "a#1", retry_at=0.0).cancelled == ()
    assert nodes(sched.get_ready(0)) == ["a"]


# -- cancellation -------------------------------------------------------------------------------


def test_cancel_ends_every_unfinished_node_and_reports_the_running_attempts():
    """cancel(): no more starts; PENDING, READY and RUNNING nodes CANCELLED; finished ones kept."""
    sched = Scheduler(
        [Task(id="a"), Task(id="b"), Task(id="c"), Task(id="d", prerequisites={"a"})],
        max_concurrency=2,
    )
    sched.get_ready(0)
    sched.done("a", "a#1")
    sched.get_ready(0)  # c starts
    update = sched.cancel("user asked")
    assert update.delivery is Delivery.APPLIED
    assert update.cancelled == ("b", "c", "d")
    assert {s.node for s in update.interrupted} == {"b", "c"}
    assert sched.state("a") is NodeState.SUCCEEDED
    assert sched.cancel_reason == "user asked"
    assert sched.running_count == 0
    assert not sched.is_active()
    assert sched.get_ready(100) == ()
    assert sched.next_wakeup() is None


def test_late_results_of_cancelled_attempts_are_refused():
    """A result that arrives after cancel() is STALE and changes nothing."""
    sched = Scheduler([Task(id="a"), Task(id="b", prerequisites={"a"})], max_concurrency=1)
    sched.get_ready(0)
    sched.cancel("stop")
    assert sched.done("a", "a#1").delivery is Delivery.STALE
    assert sched.failed("a", "a#1").delivery is Delivery.STALE
    assert sched.state("a") is NodeState.CANCELLED
    assert sched.state("b") is NodeState.CANCELLED


def test_a_second_cancel_is_a_duplicate():
    """cancel() twice: the second call changes nothing and keeps the first reason."""
    sched = Scheduler([Task(id="a")], max_concurrency=1)
    sched.cancel("first")
    assert sched.cancel("second").delivery is Delivery.DUPLICATE
    assert sched.cancel_reason == "first"


def test_cancel_drops_pending_retries():
    """A node waiting for its retry is cancelled and never started again."""
    sched = Scheduler([Task(id="a")], max_concurrency=1)
    sched.get_ready(0)
    sched.failed("a", "a#1", retry_at=1.0)
    assert sched.cancel("stop").cancelled == ("a",)
    assert sched.get_ready(2.0) == ()


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        ([Task(id="a"), Task(id="a")], "duplicate node id 'a'"),
        ([Task(id="a", prerequisites={"b"})], "waits for 'b', which is not a node"),
        ([Task(id="a", prerequisites={"a"})], "'a' lists itself as a prerequisite"),
        (
            [
                Task(id="a", prerequisites={"c"}),
                Task(id="b", prerequisites={"a"}),
                Task(id="c", prerequisites={"b"}),
                Task(id="d"),
            ],
            "cycle: a -> b -> c -> a",
        ),
        (
            [
                Task(id="a", prerequisites={"z"}),
                Task(id="y", prerequisites={"z"}),
                Task(id="z", prerequisites={"y"}),
            ],
            r"cycle: z -> y -> z$",
        ),
        ([Task(id="a", resources={"db": 1})], "resource 'db', which has no capacity"),
        ([Task(id="a", resources={"api": 3})], "holds 3 of resource 'api', beyond its capacity 2"),
        (["a"], "must be Task records"),
    ],
)
def test_bad_plans_are_refused_before_anything_starts(tasks, message):
    """Duplicates, unknown prerequisites, self-dependencies, cycles, unknown or too-small
    resources raise InvalidArgument naming the offender."""
    with pytest.raises(InvalidArgument, match=message):
        Scheduler(tasks, max_concurrency=1, capacities={"api": 2})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_concurrency": 0}, "max_concurrency must be an integer > 0"),
        ({"max_concurrency": True}, "max_concurrency"),
        ({"max_concurrency": 1.5}, "max_concurrency"),
        ({"max_concurrency": 1, "capacities": {"api": -1}}, "capacity of resource 'api'"),
        ({"max_concurrency": 1, "capacities": {"": 1}}, "resource names"),
        ({"max_concurrency": 1, "on_failure": "ignore"}, "on_failure"),
        ({"max_concurrency": 1, "rate_limits": {"t": 3.0}}, "must be a RateLimit"),
    ],
)
def test_bad_limits_are_refused(options, message):
    """A max_concurrency under 1, a negative capacity, an unknown policy raise InvalidArgument."""
    with pytest.raises(InvalidArgument, match=message):
        Scheduler([Task(id="a")], **options)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"id": ""}, "id must be a non-empty string"),
        ({"id": "a", "prerequisites": "b"}, "got the string 'b'"),
        ({"id": "a", "prerequisites": {""}}, "prerequisites must hold non-empty node ids"),
        ({"id": "a", "prerequisites": {"b"}, "optional": {"c"}}, "not among its prerequisites"),
        ({"id": "a", "resources": {"api": 0}}, "integer > 0 of tokens"),
        ({"id": "a", "resources": {"api": True}}, "integer > 0 of tokens"),
        ({"id": "a", "exclusive": ""}, "exclusive must be None or a non-empty key"),
        ({"id": "a", "tool": None}, "tool must be a string"),
    ],
)
def test_bad_tasks_are_refused(fields, message):
    """Task validates its fields on construction, naming the task."""
    with pytest.raises(InvalidArgument, match=message):
        Task(**fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"per_second": 0}, "per_second must be a finite number > 0"),
        ({"per_second": math.inf}, "per_second"),
        ({"per_second": 1, "burst": 0}, "burst must be an integer > 0"),
    ],
)
def test_bad_rate_limits_are_refused(fields, message):
    """RateLimit needs a finite positive rate and a positive integer burst."""
    with pytest.raises(InvalidArgument, match=message):
        RateLimit(**fields)


def test_a_long_chain_and_a_wide_fan_out_run_to_the_end():
    """10,000 nodes in a chain, and 10,000 children of one root, all succeed in order."""
    assert run_all(Scheduler(chain(10_000), max_concurrency=4)) == [f"n{i}" for i in range(10_000)]
    wide = Scheduler(
        [Task(id="root")] + [Task(id=f"c{i}", prerequisites={"root"}) for i in range(10_000)],
        max_concurrency=64,
    )
    assert len(run_all(wide)) == 10_001


def test_an_empty_plan_is_not_active():
    """A scheduler over no tasks has nothing to do."""
    sched = Scheduler([], max_concurrency=1)
    assert not sched.is_active()
    assert sched.get_ready(0) == ()
    assert sched.nodes == ()


# -- property tests -----------------------------------------------------------------------------

RESOURCES = ("r1", "r2")
KEYS = (None, "k1", "k2")
TOOLS = ("", "t1", "t2")
RELEASING = {NodeState.FAILED, NodeState.TIMED_OUT, NodeState.SKIPPED}


@st.composite
def plans(draw):
    """A random DAG (node i waits only on nodes < i) with random limits."""
    capacities = {name: draw(st.integers(1, 3)) for name in RESOURCES}
    count = draw(st.integers(1, 10))
    tasks = []
    for i in range(count):
        earlier = [f"n{j}" for j in range(i)]
        prerequisites = draw(st.sets(st.sampled_from(earlier), max_size=3)) if earlier else set()
        optional = draw(st.sets(st.sampled_from(sorted(prerequisites)))) if prerequisites else set()
        resources = draw(
            st.dictionaries(
                st.sampled_from(RESOURCES),
                st.integers(1, 3),
                max_size=2,
            )
        )
        resources = {k: min(v, capacities[k]) for k, v in resources.items()}
        tasks.append(
            Task(
                id=f"n{i}",
                prerequisites=prerequisites,
                optional=optional,
                resources=resources,
                exclusive=draw(st.sampled_from(KEYS)),
                tool=draw(st.sampled_from(TOOLS)),
            )
        )
    rate_limits = {
        "t1": RateLimit(
            per_second=draw(st.sampled_from([0.5, 1.0, 4.0])), burst=draw(st.integers(1, 2))
        )
    }
    return {
        "tasks": tasks,
        "max_concurrency": draw(st.integers(1, 4)),
        "capacities": capacities,
        "rate_limits": rate_limits,
        "on_failure": draw(st.sampled_from(["skip_dependants", "cancel_all"])),
    }


class SchedulerMachine(RuleBasedStateMachine):
    """The scheduler against a model: limits, prerequisites, exactly-once, terminal states."""

    @initialize(plan=plans())
    def build(self, plan):
        self.plan = plan
        self.tasks = {t.id: t for t in plan["tasks"]}
        self.dependants = {t.id: [] for t in plan["tasks"]}
        for task in plan["tasks"]:
            for p in task.prerequisites:
                self.dependants[p].append(task.id)
        self.sched = Scheduler(
            plan["tasks"],
            max_concurrency=plan["max_concurrency"],
            capacities=plan["capacities"],
            rate_limits=plan["rate_limits"],
            on_failure=plan["on_failure"],
        )
        self.now = 0.0
        self.running = {}  # node -> its running attempt
        self.delivered = []  # (node, attempt) of every result handed in
        self.issued = []  # (node, attempt) of every start
        self.terminal = {}  # node -> the terminal state it reached
        self.rate_starts = []  # times of t1's starts
        self.retry_at = {}  # node -> the retry_at of its last failure

    def snapshot(self):
        return (
            {n: (self.sched.state(n), self.sched.unresolved(n)) for n in self.sched.nodes},
            self.sched.running_count,
            self.sched.next_wakeup(),
            self.sched.cancel_reason,
        )

    def resolved(self, node):
        """Prerequisites of `node` that released it, by the model's rules."""
        task = self.tasks[node]
        return {
            p
            for p in task.prerequisites
            if self.sched.state(p) is NodeState.SUCCEEDED
            or (p in task.optional and self.sched.state(p) in RELEASING)
        }

    @rule(step=st.sampled_from([0.0, 0.1, 0.5, 1.0, 3.0]))
    def advance(self, step):
        self.now += step

    @rule()
    def get_ready(self):
        before = {n: self.sched.state(n) for n in self.sched.nodes}
        starts = self.sched.get_ready(self.now)
        for start in starts:
            assert before[start.node] is NodeState.READY
            assert start.node not in self.running
            # every prerequisite's result was applied (and released it) before the start
            assert self.resolved(start.node) == set(self.tasks[start.node].prerequisites)
            assert start.attempt not in {a for _, a in self.issued}
            assert start.number == len(self.sched.attempts(start.node))
            assert self.now >= self.retry_at.get(start.node, -math.inf)  # no retry too early
            self.running[start.node] = start.attempt
            self.issued.append((start.node, start.attempt))
            if self.tasks[start.node].tool == "t1":
                self.rate_starts.append(self.now)
        if self.sched.cancel_reason is not None:
            assert starts == ()
        # Liveness: an active run always has something running or a time to wake up at.
        wake = self.sched.next_wakeup()
        if self.sched.is_active():
            assert self.running or wake is not None
        assert wake is None or wake > self.now  # a loop that sleeps until then never spins

    def refused(self, update, before):
        assert update.delivery in {Delivery.DUPLICATE, Delivery.STALE}
        assert (update.ready, update.skipped, update.cancelled, update.interrupted) == (
            (),
            (),
            (),
            (),
        )
        assert self.snapshot() == before

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def succeed(self, data):
        node = data.draw(st.sampled_from(sorted(self.running)))
        attempt = self.running.pop(node)
        counts = {d: self.sched.unresolved(d) for d in self.dependants[node]}
        update = self.sched.done(node, attempt)
        self.delivered.append((node, attempt))
        assert update.delivery is Delivery.APPLIED
        assert self.sched.state(node) is NodeState.SUCCEEDED
        for d in self.dependants[node]:  # each count drops exactly once
            assert self.sched.unresolved(d) == counts[d] - 1
        assert set(update.ready) == {d for d in self.dependants[node] if counts[d] == 1}

    @precondition(lambda self: self.running)
    @rule(data=st.data(), retry=st.sampled_from([None, 0.0, 0.5, 2.0]), timed_out=st.booleans())
    def fail(self, data, retry, timed_out):
        node = data.draw(st.sampled_from(sorted(self.running)))
        attempt = self.running.pop(node)
        retry_at = None if retry is None else self.now + retry
        update = self.sched.failed(node, attempt, retry_at=retry_at, timed_out=timed_out)
        self.delivered.append((node, attempt))
        assert update.delivery is Delivery.APPLIED
        state = self.sched.state(node)
        if retry_at is not None:
            assert state is NodeState.READY
            self.retry_at[node] = retry_at
            return
        assert state is (NodeState.TIMED_OUT if timed_out else NodeState.FAILED)
        if self.plan["on_failure"] == "cancel_all":
            assert not self.sched.is_active()
            assert {s.node: s.attempt for s in update.interrupted} == self.running
            self.running.clear()
            return
        # a failed node never releases a dependant that does not list it as optional
        for d in self.dependants[node]:
            if node not in self.tasks[d].optional:
                assert self.sched.state(d) in {NodeState.SKIPPED, NodeState.CANCELLED}
        for skipped in update.skipped:
            assert self.sched.state(skipped) is NodeState.SKIPPED

    @precondition(lambda self: self.delivered)
    @rule(data=st.data(), success=st.booleans())
    def redeliver(self, data, success):
        node, attempt = data.draw(st.sampled_from(self.delivered))
        before = self.snapshot()
        deliver = self.sched.done if success else self.sched.failed
        self.refused(deliver(node, attempt), before)

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def stray(self, data):
        node, _ = data.draw(st.sampled_from(self.issued))
        before = self.snapshot()
        self.refused(self.sched.done(node, f"{node}#999"), before)

    @rule(roll=st.integers(0, 4))
    def cancel(self, roll):
        if roll:  # one time in five: a cancelled run has little left to test
            return
        was_cancelled = self.sched.cancel_reason is not None
        unfinished = {n for n in self.sched.nodes if not self.sched.state(n).is_terminal}
        update = self.sched.cancel("test")
        if was_cancelled:
            assert update.delivery is Delivery.DUPLICATE
            return
        assert set(update.cancelled) == unfinished
        assert {s.node: s.attempt for s in update.interrupted} == self.running
        for node, attempt in self.running.items():
            self.delivered.append((node, attempt))  # a late result of it must be refused
        self.running.clear()
        assert not self.sched.is_active()

    @invariant()
    def limits_hold(self):
        if not hasattr(self, "sched"):
            return
        running = [self.tasks[n] for n in self.running]
        assert self.sched.running_count == len(running) <= self.plan["max_concurrency"]
        for name, capacity in self.plan["capacities"].items():
            assert sum(t.resources.get(name, 0) for t in running) <= capacity
        keys = [t.exclusive for t in running if t.exclusive is not None]
        assert len(keys) == len(set(keys))
        limit = self.plan["rate_limits"]["t1"]
        for i, first in enumerate(self.rate_starts):
            window = len(self.rate_starts) - i
            assert window <= limit.burst + limit.per_second * (self.rate_starts[-1] - first) + 1e-6

    @invariant()
    def states_agree_with_counts(self):
        if not hasattr(self, "sched"):
            return
        for node in self.sched.nodes:
            state = self.sched.state(node)
            unresolved = len(self.tasks[node].prerequisites) - len(self.resolved(node))
            if self.sched.cancel_reason is None:  # cancelling stops the counting
                assert self.sched.unresolved(node) == unresolved
            if state in {NodeState.PENDING, NodeState.READY, NodeState.RUNNING}:
                assert self.sched.unresolved(node) == unresolved
                assert (state is NodeState.PENDING) == (unresolved > 0)
            assert (state is NodeState.RUNNING) == (node in self.running)
            if node in self.terminal:  # a terminal state is final
                assert state is self.terminal[node]
            elif state.is_terminal:
                self.terminal[node] = state
        assert self.sched.is_active() == (len(self.terminal) < len(self.tasks))

    def teardown(self):
        if not hasattr(self, "sched"):
            return
        # Drive the rest to the end: every node ends in exactly one terminal state.
        for _ in range(10 * len(self.tasks) + 10):
            if not self.sched.is_active():
                break
            self.get_ready()
            for node, attempt in sorted(self.running.items()):
                self.sched.done(node, attempt)
            self.running.clear()
            wake = self.sched.next_wakeup()
            if wake is not None:
                self.now = max(self.now, wake)
        assert not self.sched.is_active()
        assert all(self.sched.state(n).is_terminal for n in self.sched.nodes)


SchedulerMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40)
test_scheduler_machine = SchedulerMachine.TestCase


def test_entries_given_directly_are_scheduled_as_tasks_are():
    """The runner's entries (checked fields, `acyclic=True`) run as the same `Task`s do;
    duplicates and unknown prerequisites are still refused, and cycles without `acyclic`."""

    def entry(node: str, *prerequisites: str) -> Entry:
        return Entry(node, frozenset(prerequisites), frozenset(), {}, None, "", 0)

    sched = Scheduler(
        [entry("a"), entry("b", "a"), entry("c", "a", "b")], max_concurrency=4, acyclic=True
    )
    order = []
    while sched.is_active():
        for start in sched.get_ready(0.0):
            order.append(start.node)
            assert sched.done(start.node, start.attempt).delivery is Delivery.APPLIED
    assert order == ["a", "b", "c"]
    with pytest.raises(InvalidArgument, match="duplicate node id"):
        Scheduler([entry("a"), entry("a")], max_concurrency=1)
    with pytest.raises(InvalidArgument, match="which is not a node"):
        Scheduler([entry("a", "zz")], max_concurrency=1, acyclic=True)
    with pytest.raises(InvalidArgument, match="cycle"):
        Scheduler([entry("a", "b"), entry("b", "a")], max_concurrency=1)
