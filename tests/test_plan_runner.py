"""The plan runner: concurrency, limits, retries, failure policies, cancellation, state."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from decimal import Decimal
from typing import NewType, TypedDict

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agenttx
from agenttx import NodeState, PlanStatus
from agenttx._saga import Backoff
from agenttx._tools import derive_key
from agenttx.stores import MemoryStore

NO_WAIT = Backoff(base=0, max_wait=0)

CustomerId = NewType("CustomerId", str)
WarehouseId = NewType("WarehouseId", str)


class Customer(TypedDict):
    customer_id: CustomerId
    account_status: str


class Stock(TypedDict):
    warehouse_id: WarehouseId
    available: int


class Reservation(TypedDict):
    reservation_id: str


class Confirmation(TypedDict):
    message_id: str


class Intervals:
    """Who is running now, and the most that ever ran at once (per group)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.most: dict[str, int] = {}

    def enter(self, group: str = "all") -> None:
        with self._lock:
            self.now[group] = self.now.get(group, 0) + 1
            self.most[group] = max(self.most.get(group, 0), self.now[group])

    def leave(self, group: str = "all") -> None:
        with self._lock:
            self.now[group] -= 1


def _order_shop(*, lookup_barrier: threading.Barrier | None = None):
    """The order workflow's tools; lookup and stock meet at a barrier when one is given."""
    released: list[str] = []
    calls: list[str] = []

    @agenttx.compensation
    def release_reservation(payload):
        released.append(payload["output"]["reservation_id"])

    @agenttx.tool
    def lookup_customer(ctx: agenttx.ToolContext, email: str) -> Customer:
        calls.append("lookup")
        if lookup_barrier is not None:
            lookup_barrier.wait(timeout=10)  # both must be running at once to pass
        ctx.add_cost("0.002", category="model")
        return {"customer_id": CustomerId("c-1"), "account_status": "active"}

    @agenttx.tool
    def check_stock(sku: str, quantity: int) -> Stock:
        calls.append("stock")
        if lookup_barrier is not None:
            lookup_barrier.wait(timeout=10)
        return {"warehouse_id": WarehouseId("w-1"), "available": 10}

    @agenttx.tool(compensate=release_reservation)
    def reserve_stock(
        ctx: agenttx.ToolContext,
        customer_id: CustomerId,
        warehouse_id: WarehouseId,
        quantity: int,
    ) -> Reservation:
        calls.append("reserve")
        ctx.state.put("reservations/r-1", {"customer": customer_id, "quantity": quantity})
        ctx.add_cost(Decimal("0.10"))
        return {"reservation_id": "r-1"}

    @agenttx.tool
    def send_confirmation(
        ctx: agenttx.ToolContext, reservation_id: str, email: str
    ) -> Confirmation:
        calls.append("confirm")
        ctx.stage_effect("email", {"to": email, "reservation": reservation_id})
        return {"message_id": "m-1"}

    tools = [lookup_customer, check_stock, reserve_stock, send_confirmation, release_reservation]
    return tools, calls, released


ORDER_PLAN = agenttx.Plan(
    nodes=[
        agenttx.Node(
            "customer_lookup", tool="lookup_customer", inputs={"email": "${initial.customer_email}"}
        ),
        agenttx.Node(
            "stock_check",
            tool="check_stock",
            inputs={"sku": "${initial.sku}", "quantity": "${initial.quantity}"},
        ),
        agenttx.Node(
            "reserve",
            tool="reserve_stock",
            inputs={
                "customer_id": "${customer_lookup.customer_id}",
                "warehouse_id": "${stock_check.warehouse_id}",
                "quantity": "${initial.quantity}",
            },
            exclusive_resource="order:${initial.order_id}",
        ),
        agenttx.Node(
            "confirm",
            tool="send_confirmation",
            inputs={
                "reservation_id": "${reserve.reservation_id}",
                "email": "${initial.customer_email}",
            },
            after=["reserve"],
        ),
    ],
    initial=["customer_email", "sku", "quantity", "order_id", "currency"],
)
ORDER_INITIAL = {
    "customer_email": "ada@example.com",
    "sku": "SKU-1",
    "quantity": 2,
    "order_id": 7,
    "currency": "GBP",
}


def test_order_workflow_runs_lookup_and_stock_together_and_commits():
    """customer_lookup and stock_check overlap (they meet at a barrier); reserve waits for both."""
    tools, calls, released = _order_shop(lookup_barrier=threading.Barrier(2))
    store = MemoryStore()
    sent: list[agenttx.StagedEffect] = []
    result = agenttx.run_plan(
        ORDER_PLAN,
        tools=tools,
        initial=ORDER_INITIAL,
        store=store,
        dispatcher=sent.append,
        run_id="order-1",
    )
    assert result.status is PlanStatus.SUCCEEDED
    assert {node: r.state for node, r in result.nodes.items()} == dict.fromkeys(
        ("customer_lookup", "stock_check", "reserve", "confirm"), NodeState.SUCCEEDED
    )
    assert calls[2:] == ["reserve", "confirm"]
    assert result.nodes["reserve"].output == {"reservation_id": "r-1"}
    assert json.loads(store.read_committed("reservations/r-1")) == {
        "customer": "c-1",
        "quantity": 2,
    }
    assert [effect.payload for effect in sent] == [{"to": "ada@example.com", "reservation": "r-1"}]
    assert result.effects_dispatched == 1
    assert released == []
    assert result.metrics.critical_path[-2:] == ("reserve", "confirm")
    assert result.metrics.cost.total == Decimal("0.102")
    assert result.metrics.cost.model == Decimal("0.002")
    assert result.nodes["reserve"].cost.tool == Decimal("0.10")


def test_a_kept_result_keeps_neither_its_plan_nor_its_tools_alive():
    """A result reads the run's records only: its plan and its tools (which the plan keeps
    with its validation) can go while the result, its nodes and its metrics stay readable."""
    import gc  # noqa: PLC0415
    import weakref  # noqa: PLC0415

    def run() -> tuple[agenttx.PlanResult, weakref.ref[object], weakref.ref[object]]:
        def work(x: int) -> dict[str, int]:
            return {"x": x}

        plan = agenttx.Plan(nodes=[agenttx.Node("a", tool="work", inputs={"x": 1})])
        result = agenttx.run_plan(plan, tools=[agenttx.tool(work)], initial={})
        return result, weakref.ref(plan), weakref.ref(work)

    result, plan, function = run()
    gc.collect()
    assert plan() is None
    assert function() is None
    assert result.nodes["a"].output == {"x": 1}
    assert result.metrics.critical_path == ("a",)


def test_metrics_are_computed_when_first_read_and_then_kept():
    """`result.metrics` is computed on first read (not by the run), the same object at every
    read, equal to a fresh computation, and results compare equal by their computed metrics."""
    tools, _, _ = _order_shop()
    result = agenttx.run_plan(ORDER_PLAN, tools=tools, initial=ORDER_INITIAL, run_id="lazy-1")
    pending = result._metrics  # what the run handed over: a function
    assert callable(pending)
    assert not isinstance(pending, agenttx.PlanMetrics)
    first = result.metrics
    assert isinstance(first, agenttx.PlanMetrics)
    assert result.metrics is first
    assert pending() == first  # read again, the records give equal figures
    assert first.critical_path[-2:] == ("reserve", "confirm")
    assert first.makespan_s >= first.critical_path_s > 0
    twin = attrs.evolve(result, metrics=pending)
    assert twin == result


def test_node_results_are_a_read_only_mapping_in_plan_order_built_once():
    """`result.nodes` lists every node in plan order, refuses writes and unknown ids, and
    gives the same `NodeResult` on every read."""
    tools, _, _ = _order_shop()
    result = agenttx.run_plan(ORDER_PLAN, tools=tools, initial=ORDER_INITIAL)
    assert list(result.nodes) == [node.id for node in ORDER_PLAN.nodes]
    assert len(result.nodes) == len(ORDER_PLAN.nodes)
    assert result.nodes["confirm"] is result.nodes["confirm"]
    assert dict(result.nodes)["confirm"].state is NodeState.SUCCEEDED
    with pytest.raises(KeyError):
        result.nodes["nowhere"]
    with pytest.raises(TypeError):
        result.nodes["confirm"] = result.nodes["reserve"]  # type: ignore[index]
    assert "nodes=4" in repr(result)


def test_audit_records_dispatch_checks_in_order_and_exports_json_lines():
    """The audit is ordered; reserve's dispatch lists its prerequisites and follows both ends."""
    tools, _, _ = _order_shop()
    result = agenttx.run_plan(ORDER_PLAN, tools=tools, initial=ORDER_INITIAL)
    lines = [json.loads(line) for line in result.audit_jsonl().splitlines()]
    assert [line["seq"] for line in lines] == list(range(len(lines)))
    assert lines[0]["kind"] == "validated"
    assert lines[0]["data"]["plan_version"] == ORDER_PLAN.version
    assert {line["scope"] for line in lines} == {"plan"}
    assert {line["scope_id"] for line in lines} == {result.run_id}
    assert lines[-1]["kind"] == "finished"
    assert lines[-1]["data"] == {"status": "SUCCEEDED"}
    kinds = [(line["kind"], line.get("node")) for line in lines]
    reserve = kinds.index(("dispatched", "reserve"))
    assert kinds.index(("completed", "customer_lookup")) < reserve
    assert kinds.index(("completed", "stock_check")) < reserve
    checks = lines[reserve]["data"]["checks"]
    assert checks["prerequisites"] == ["customer_lookup", "stock_check"]
    assert checks["inputs"] == "valid"
    assert checks["cancelled"] is False
    assert lines[0]["zone"] == "UTC"
    assert kinds.index(("committed", None)) < kinds.index(("effects_dispatched", None))
    assert repr(result) == (
        f"<agenttx.PlanResult {result.run_id!r} SUCCEEDED nodes=4 events={len(lines)}>"
    )


def test_audit_is_built_when_read_and_then_kept():
    """A result's audit is built on first read: the same tuple at every read, equal to the run's."""
    tools, _, _ = _order_shop()
    result = agenttx.run_plan(ORDER_PLAN, tools=tools, initial=ORDER_INITIAL)
    count = int(repr(result).rsplit("events=", 1)[1].rstrip(">"))  # counted, not built
    first = result.audit
    assert isinstance(first, tuple)
    assert len(first) == count
    assert result.audit is first
    assert [event.seq for event in first] == list(range(count))
    assert first[-1].kind is agenttx.EventKind.FINISHED
    same = attrs.evolve(result, audit=first)
    assert same == result
    assert attrs.evolve(result, audit=first[:-1]) != result


def test_async_tools_run_concurrently_in_the_loop():
    """Two async tools that each wait for the other to start both finish: they overlapped."""
    started: dict[str, asyncio.Event] = {}

    async def meet(me: str, other: str) -> dict[str, str]:
        started.setdefault(me, asyncio.Event()).set()
        await started.setdefault(other, asyncio.Event()).wait()
        return {"who": me}

    @agenttx.tool
    async def left() -> dict[str, str]:
        return await meet("left", "right")

    @agenttx.tool
    async def right() -> dict[str, str]:
        return await meet("right", "left")

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("a", tool="left", timeout=10),
            agenttx.Node("b", tool="right", timeout=10),
        ]
    )
    result = agenttx.run_plan(plan, tools=[left, right], initial={})
    assert result.status is PlanStatus.SUCCEEDED
    assert result.outputs() == {"a": {"who": "left"}, "b": {"who": "right"}}


def _counting_tool(intervals: Intervals, group: str, release: threading.Event | None = None):
    @agenttx.tool(name=f"work_{group}")
    def work(n: int) -> dict[str, int]:
        intervals.enter(group)
        intervals.enter()
        try:
            if release is not None:
                release.wait(timeout=0.02)  # give another node the chance to overlap
            return {"n": n}
        finally:
            intervals.leave()
            intervals.leave(group)

    return work


def test_exclusive_resource_is_held_by_one_node_at_a_time():
    """Nodes sharing `order:${initial.order_id}` never overlap; the audit names the wait."""
    intervals = Intervals()
    work = _counting_tool(intervals, "x", threading.Event())
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node(
                f"n{i}",
                tool="work_x",
                inputs={"n": i},
                exclusive_resource="order:${initial.order_id}",
            )
            for i in range(4)
        ],
        initial=["order_id"],
    )
    result = agenttx.run_plan(plan, tools=[work], initial={"order_id": 7})
    assert result.status is PlanStatus.SUCCEEDED
    assert intervals.most["x"] == 1
    waited = [
        event.data["checks"]["waited_for"]
        for event in result.audit
        if event.kind is agenttx.EventKind.DISPATCHED
    ]
    assert ["exclusive:order:7"] in waited


def test_max_concurrency_and_resource_capacities_bound_running_nodes():
    """max_concurrency=2 and a resource of capacity 1 are never exceeded."""
    intervals = Intervals()
    free = _counting_tool(intervals, "free", threading.Event())
    api = _counting_tool(intervals, "api", threading.Event())
    nodes = [agenttx.Node(f"f{i}", tool="work_free", inputs={"n": i}) for i in range(4)]
    nodes += [
        agenttx.Node(f"a{i}", tool="work_api", inputs={"n": i}, resources={"api": 1})
        for i in range(3)
    ]
    result = agenttx.run_plan(
        agenttx.Plan(nodes=nodes),
        tools=[free, api],
        initial={},
        max_concurrency=2,
        resources={"api": 1},
    )
    assert result.status is PlanStatus.SUCCEEDED
    assert intervals.most["all"] <= 2
    assert intervals.most["api"] == 1


def test_transient_failures_retry_with_one_idempotency_key():
    """A transient failure is retried up to `retries`; every attempt shares the idempotency key."""
    keys: list[str] = []

    @agenttx.tool
    def flaky(ctx: agenttx.ToolContext) -> dict[str, int]:
        keys.append(ctx.idempotency_key)
        ctx.add_cost("0.01")
        if len(keys) < 3:
            raise ConnectionError("connection refused")
        return {"attempt": len(keys)}

    plan = agenttx.Plan(nodes=[agenttx.Node("charge", tool="flaky", retries=2)])
    result = agenttx.run_plan(plan, tools=[flaky], initial={}, run_id="r1", backoff=NO_WAIT)
    node = result.nodes["charge"]
    assert node.state is NodeState.SUCCEEDED
    assert node.attempts == 3
    assert len(set(node.attempt_ids)) == 3
    assert keys == [node.idempotency_key] * 3
    assert node.idempotency_key == derive_key("r1", plan.version, "charge", "flaky")
    dispatched = [e for e in result.audit if e.kind is agenttx.EventKind.DISPATCHED]
    assert [e.data["idempotency_key"] for e in dispatched] == [node.idempotency_key] * 3
    assert result.metrics.retries == 2
    assert result.metrics.cost.retry == Decimal("0.02")
    assert result.metrics.cost.tool == Decimal("0.01")
    retried = [e for e in result.audit if e.kind is agenttx.EventKind.RETRIED]
    assert len(retried) == 2


def test_retries_are_bounded_and_permanent_failures_are_not_retried():
    """A transient failure stops after `retries`; a non-transient one fails at once."""
    counts = {"transient": 0, "permanent": 0}

    @agenttx.tool
    def always_down() -> dict[str, int]:
        counts["transient"] += 1
        raise ConnectionError("connection refused")

    @agenttx.tool
    def broken() -> dict[str, int]:
        counts["permanent"] += 1
        raise ValueError("bad card")

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("down", tool="always_down", retries=1),
            agenttx.Node("bad", tool="broken", retries=5),
        ]
    )
    result = agenttx.run_plan(plan, tools=[always_down, broken], initial={}, backoff=NO_WAIT)
    assert result.status is PlanStatus.FAILED
    assert counts == {"transient": 2, "permanent": 1}
    assert result.nodes["down"].state is NodeState.FAILED
    assert result.nodes["bad"].attempts == 1
    assert result.nodes["bad"].error is not None
    assert result.nodes["bad"].error.text.startswith("Hint: ")


def test_inputs_that_do_not_fit_the_tool_never_retry():
    """An input that fails the tool's spec at dispatch fails the node once, naming the field."""
    ran: list[int] = []

    @agenttx.tool
    def produce() -> dict:  # untyped: validation cannot see the value's type
        return {"amount": "ten"}

    @agenttx.tool
    def charge(amount: int) -> dict[str, int]:
        ran.append(amount)
        return {"charged": amount}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("produce", tool="produce"),
            agenttx.Node(
                "charge", tool="charge", inputs={"amount": "${produce.amount}"}, retries=3
            ),
        ]
    )
    result = agenttx.run_plan(plan, tools=[produce, charge], initial={}, backoff=NO_WAIT)
    node = result.nodes["charge"]
    assert node.state is NodeState.FAILED
    assert node.attempts == 1
    assert ran == []
    assert "amount" in node.error.text


def test_output_not_matching_the_return_type_fails_naming_the_field():
    """A TypedDict return missing a field fails the node with a hint keyed to that field."""

    @agenttx.tool
    def lookup_customer(email: str) -> Customer:
        return {"account_status": "active"}  # type: ignore[typeddict-item]

    @agenttx.tool
    def reserve(customer_id: CustomerId) -> Reservation:
        return {"reservation_id": "r"}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("lookup", tool="lookup_customer", inputs={"email": "a@b.c"}, retries=2),
            agenttx.Node(
                "reserve", tool="reserve", inputs={"customer_id": "${lookup.customer_id}"}
            ),
        ]
    )
    result = agenttx.run_plan(plan, tools=[lookup_customer, reserve], initial={})
    lookup = result.nodes["lookup"]
    assert lookup.state is NodeState.FAILED
    assert lookup.attempts == 1
    assert lookup.error.key == "customer_id"
    assert "customer_id" in lookup.error.text
    assert result.nodes["reserve"].state is NodeState.SKIPPED


def _policy_plan(release: threading.Event):
    @agenttx.tool
    def fail() -> dict[str, int]:
        raise ValueError("no")

    @agenttx.tool
    def after_fail(x: int) -> dict[str, int]:
        return {"x": x}

    @agenttx.tool
    async def independent() -> dict[str, int]:
        if not release.is_set():
            await asyncio.Event().wait()  # runs until cancelled
        return {"ok": 1}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("bad", tool="fail"),
            agenttx.Node("child", tool="after_fail", inputs={"x": "${bad.x}"}),
            agenttx.Node("grandchild", tool="after_fail", inputs={"x": "${child.x}"}),
            agenttx.Node("other", tool="independent", timeout=20),
        ]
    )
    return plan, [fail, after_fail, independent]


def test_skip_dependants_finishes_independent_work():
    """By default a failure skips its dependants (transitively) and independent nodes finish."""
    release = threading.Event()
    release.set()
    plan, tools = _policy_plan(release)
    result = agenttx.run_plan(plan, tools=tools, initial={})
    states = {node: r.state for node, r in result.nodes.items()}
    assert states == {
        "bad": NodeState.FAILED,
        "child": NodeState.SKIPPED,
        "grandchild": NodeState.SKIPPED,
        "other": NodeState.SUCCEEDED,
    }
    assert result.status is PlanStatus.FAILED


def test_cancel_all_cancels_running_and_pending_nodes():
    """on_failure='cancel_all' cancels what is still running or waiting."""
    release = threading.Event()
    plan, tools = _policy_plan(release)
    try:
        result = agenttx.run_plan(plan, tools=tools, initial={}, on_failure="cancel_all")
    finally:
        release.set()
    states = {node: r.state for node, r in result.nodes.items()}
    assert states["bad"] is NodeState.FAILED
    assert states["other"] is NodeState.CANCELLED
    assert states["child"] is NodeState.CANCELLED
    assert result.status is PlanStatus.FAILED


def test_optional_input_with_a_fallback_runs_and_the_plan_succeeds():
    """A fallback releases the dependant of a failed producer; its failure is absorbed."""

    @agenttx.tool
    def discount() -> dict[str, int]:
        raise ValueError("pricing service says no")

    @agenttx.tool
    def price(base: int, off: int) -> dict[str, int]:
        return {"total": base - off}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("discount", tool="discount"),
            agenttx.Node(
                "price",
                tool="price",
                inputs={"base": 100, "off": "${discount.amount}"},
                fallback={"off": 0},
            ),
        ]
    )
    result = agenttx.run_plan(plan, tools=[discount, price], initial={})
    assert result.nodes["discount"].state is NodeState.FAILED
    assert result.nodes["price"].output == {"total": 100}
    assert result.status is PlanStatus.SUCCEEDED


def test_a_fallback_releases_a_dependant_that_also_reads_the_initial_values():
    """References to the initial values do not count as prerequisites: the node with a
    fallback for its one producer's output still runs when that producer fails."""

    @agenttx.tool
    def discount() -> dict[str, int]:
        raise ValueError("pricing service says no")

    @agenttx.tool
    def price(base: int, off: int) -> dict[str, int]:
        return {"total": base - off}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("discount", tool="discount"),
            agenttx.Node(
                "price",
                tool="price",
                inputs={"base": "${initial.base}", "off": "${discount.amount}"},
                fallback={"off": 5},
            ),
        ],
        initial=["base"],
    )
    result = agenttx.run_plan(plan, tools=[discount, price], initial={"base": 70})
    assert result.nodes["price"].output == {"total": 65}
    assert result.status is PlanStatus.SUCCEEDED


def test_cancel_while_running_fences_sync_tools_and_cancels_descendants():
    """cancel() is recorded first; the running sync tool's late writes are refused."""
    entered = threading.Event()
    release = threading.Event()
    late: list[str] = []
    tried = threading.Event()

    @agenttx.tool
    def slow(ctx: agenttx.ToolContext) -> dict[str, int]:
        entered.set()
        release.wait(10)
        try:
            ctx.state.put("late", 1)
        except agenttx.InvalidArgument as exc:
            late.append(str(exc))
        tried.set()
        return {"v": 1}

    @agenttx.tool
    def after(v: int) -> dict[str, int]:
        return {"v": v}

    store = MemoryStore()
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("slow", tool="slow", timeout=20),
            agenttx.Node("after", tool="after", inputs={"v": "${slow.v}"}),
        ]
    )

    def on_cancelled(event: agenttx.Event) -> None:
        if event.kind is agenttx.EventKind.CANCELLED and event.node == "slow":
            release.set()  # the worker finishes while the run's end waits for it

    run = agenttx.start_plan(
        plan, tools=[slow, after], initial={}, store=store, hooks=[on_cancelled]
    )
    assert entered.wait(10)
    assert run.status is PlanStatus.RUNNING
    run.cancel("customer withdrew")
    result = run.wait(10)
    release.set()
    assert result.status is PlanStatus.CANCELLED
    assert run.status is PlanStatus.CANCELLED
    assert result.cancel_reason == "customer withdrew"
    assert result.nodes["slow"].state is NodeState.CANCELLED
    assert result.nodes["after"].state is NodeState.CANCELLED
    kinds = [event.kind for event in result.audit]
    assert kinds.index(agenttx.EventKind.CANCEL_REQUESTED) < kinds.index(
        agenttx.EventKind.CANCELLED
    )
    with pytest.raises(agenttx.FailedPrecondition, match="has ended"):
        run.cancel("again")
    # The worker finished after its node ended: its write is refused by the closed context.
    assert tried.wait(10)
    assert len(late) == 1
    assert "has ended" in late[0]
    assert store.read_committed("late") is None


def test_cancel_cancels_running_async_tools():
    """A running async tool receives the cancellation."""
    entered = threading.Event()
    seen: list[str] = []

    @agenttx.tool
    async def waits_forever() -> dict[str, int]:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return {"never": 1}

    run = agenttx.start_plan(
        agenttx.Plan(nodes=[agenttx.Node("w", tool="waits_forever", timeout=60)]),
        tools=[waits_forever],
        initial={},
    )
    assert entered.wait(10)
    run.cancel("stop")
    result = run.wait(10)
    assert seen == ["cancelled"]
    assert result.nodes["w"].state is NodeState.CANCELLED


def _chain_with_compensations(fail_compensation: str | None = None):
    undone: list[str] = []

    @agenttx.compensation
    def undo(payload):
        name = payload["output"]["name"]
        if name == fail_compensation:
            raise RuntimeError(f"cannot undo {name}")
        undone.append(name)

    @agenttx.tool(compensate=undo)
    def step(name: str, prior: str = "") -> dict[str, str]:
        return {"name": name}

    @agenttx.tool
    def explode(prior: str) -> dict[str, str]:
        raise ValueError("the last step failed")

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("a", tool="step", inputs={"name": "a"}),
            agenttx.Node("b", tool="step", inputs={"name": "b", "prior": "${a.name}"}),
            agenttx.Node("c", tool="step", inputs={"name": "c", "prior": "${b.name}"}),
            agenttx.Node("d", tool="explode", inputs={"prior": "${c.name}"}),
        ]
    )
    return plan, [undo, step, explode], undone


def test_a_failed_plan_compensates_completed_nodes_newest_first():
    """Completed nodes are compensated newest completion first, each reported COMPLETED."""
    plan, tools, undone = _chain_with_compensations()
    result = agenttx.run_plan(plan, tools=tools, initial={})
    assert result.status is PlanStatus.FAILED
    assert undone == ["c", "b", "a"]
    assert [(c.node_id, c.status) for c in result.compensations] == [
        ("c", agenttx.CompensationStatus.COMPLETED),
        ("b", agenttx.CompensationStatus.COMPLETED),
        ("a", agenttx.CompensationStatus.COMPLETED),
    ]


def test_a_failing_compensation_is_kept_and_the_others_still_run():
    """A compensation that keeps failing is reported FAILED with its error; the rest run."""
    plan, tools, undone = _chain_with_compensations(fail_compensation="b")
    result = agenttx.run_plan(plan, tools=tools, initial={})
    assert undone == ["c", "a"]
    statuses = {c.node_id: c for c in result.compensations}
    assert statuses["b"].status is agenttx.CompensationStatus.FAILED
    assert "cannot undo b" in (statuses["b"].error or "")


def test_compensate_on_never_only_reports_what_would_be_undone():
    """compensate_on='never' runs no compensation and reports each one as REQUESTED."""
    plan, tools, undone = _chain_with_compensations()
    result = agenttx.run_plan(plan, tools=tools, initial={}, compensate_on="never")
    assert undone == []
    assert {c.status for c in result.compensations} == {agenttx.CompensationStatus.REQUESTED}


def test_state_and_effects_of_a_failed_plan_are_never_published():
    """A failed plan discards its writes and staged effects: nothing committed or sent."""
    sent: list[object] = []

    @agenttx.tool
    def write(ctx: agenttx.ToolContext) -> dict[str, int]:
        ctx.state.put("k", 1)
        ctx.stage_effect("email", {"to": "x"})
        return {"ok": 1}

    @agenttx.tool
    def fail(ok: int) -> dict[str, int]:
        raise ValueError("no")

    store = MemoryStore()
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("write", tool="write"),
            agenttx.Node("fail", tool="fail", inputs={"ok": "${write.ok}"}),
        ]
    )
    result = agenttx.run_plan(
        plan, tools=[write, fail], initial={}, store=store, dispatcher=sent.append
    )
    assert result.status is PlanStatus.FAILED
    assert store.read_committed("k") is None
    assert sent == []
    assert result.effects_dispatched == 0


def test_nodes_of_one_plan_see_each_others_writes_and_commit_once():
    """State written by one node is read by a later one; the commit publishes both."""

    @agenttx.tool
    def put(ctx: agenttx.ToolContext) -> dict[str, int]:
        ctx.state.put("count", 1)
        return {"ok": 1}

    @agenttx.tool
    def bump(ctx: agenttx.ToolContext, ok: int) -> dict[str, int]:
        value = ctx.state.get("count") + 1
        ctx.state.put("count", value)
        return {"count": value}

    store = MemoryStore()
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("put", tool="put"),
            agenttx.Node("bump", tool="bump", inputs={"ok": "${put.ok}"}),
        ]
    )
    result = agenttx.run_plan(plan, tools=[put, bump], initial={}, store=store)
    assert result.nodes["bump"].output == {"count": 2}
    assert store.read_committed("count") == "2"
    assert result.committed_keys == 1


def test_a_write_conflict_at_commit_fails_the_plan_and_compensates():
    """Another commit of a key the run read makes the run FAILED, compensated, nothing kept."""
    store = MemoryStore()
    undone: list[str] = []

    @agenttx.compensation
    def undo(payload):
        undone.append("undone")

    @agenttx.tool(compensate=undo)
    def read_modify_write(ctx: agenttx.ToolContext) -> dict[str, int]:
        value = ctx.state.get("balance", 0)
        store.begin("rival")  # another transaction commits the key meanwhile
        store.put("rival", "balance", "50")
        store.commit("rival")
        ctx.state.put("balance", value + 10)
        return {"balance": value + 10}

    plan = agenttx.Plan(nodes=[agenttx.Node("rmw", tool="read_modify_write")])
    result = agenttx.run_plan(plan, tools=[read_modify_write, undo], initial={}, store=store)
    assert result.status is PlanStatus.FAILED
    assert "balance" in (result.error or "")
    assert store.read_committed("balance") == "50"
    assert undone == ["undone"]


def test_a_timed_out_node_ends_timed_out():
    """A node that outlives its timeout ends TIMED_OUT (no retries declared)."""
    release = threading.Event()

    @agenttx.tool
    def hangs() -> dict[str, int]:
        release.wait(10)
        return {"late": 1}

    plan = agenttx.Plan(nodes=[agenttx.Node("h", tool="hangs", timeout=0.05)])
    try:
        result = agenttx.run_plan(plan, tools=[hangs], initial={})
    finally:
        release.set()
    assert result.nodes["h"].state is NodeState.TIMED_OUT
    assert result.nodes["h"].error.category is agenttx.HintCategory.TIMEOUT


def test_cancelling_the_awaiting_task_cancels_the_run_and_compensates():
    """Cancelling the task that awaits arun_plan compensates completed nodes, then propagates."""
    undone: list[str] = []
    entered = asyncio.Event()

    @agenttx.compensation
    def undo(payload):
        undone.append(payload["output"]["name"])

    @agenttx.tool(compensate=undo)
    def first() -> dict[str, str]:
        return {"name": "first"}

    @agenttx.tool
    async def second(name: str) -> dict[str, str]:
        entered.set()
        await asyncio.Event().wait()
        return {"name": "never"}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("first", tool="first"),
            agenttx.Node("second", tool="second", inputs={"name": "${first.name}"}, timeout=60),
        ]
    )

    async def main() -> None:
        task = asyncio.ensure_future(
            agenttx.arun_plan(plan, tools=[first, second, undo], initial={})
        )
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert undone == ["first"]


def test_costs_over_many_runs_give_cost_per_completed_workflow():
    """Total spend of all runs, failed ones included, divided by the completed ones."""

    @agenttx.tool(inline=True)
    def paid(ctx: agenttx.ToolContext, fail: bool) -> dict[str, int]:
        ctx.add_cost("0.30", category="model")
        if fail:
            raise ValueError("no")
        return {"ok": 1}

    plan = agenttx.Plan(
        nodes=[agenttx.Node("p", tool="paid", inputs={"fail": "${initial.fail}"})],
        initial=["fail"],
    )
    results = [
        agenttx.run_plan(plan, tools=[paid], initial={"fail": fail})
        for fail in (False, True, False)
    ]
    assert [r.status for r in results] == [
        PlanStatus.SUCCEEDED,
        PlanStatus.FAILED,
        PlanStatus.SUCCEEDED,
    ]
    assert agenttx.cost_per_completed_workflow(results) == Decimal("0.45")
    with pytest.raises(agenttx.InvalidArgument, match="no completed run"):
        agenttx.cost_per_completed_workflow(results[1:2])


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"initial": {**ORDER_INITIAL, "coupon": "X"}}, "does not declare: coupon"),
        ({"initial": {"sku": "SKU-1"}}, "lack declared key"),
        ({"initial": {**ORDER_INITIAL, "sku": {1, 2}}}, "initial"),
        ({"initial": ["sku"]}, "mapping"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_concurrency": True}, "max_concurrency"),
        ({"resources": {"api": -1}}, "capacity"),
        ({"rate_limits": {"check_stock": -2}}, "rate limit"),
        ({"rate_limits": {"check_stock": float("nan")}}, "rate limit"),
        ({"rate_limits": [("check_stock", 2)]}, "rate_limits must be a mapping"),
        ({"resources": [("api", 1)]}, "resources must be a mapping"),
        ({"on_failure": "ignore"}, "on_failure"),
        ({"compensate_on": "sometimes"}, "compensate_on"),
        ({"run_id": "has space"}, "run_id"),
        ({"backoff": 1.0}, "backoff"),
    ],
)
def test_bad_arguments_are_refused_before_any_tool_runs(changes, match):
    """Unknown, missing or non-JSON initial values and bad limits raise before anything runs."""
    tools, calls, _ = _order_shop()
    arguments = {"tools": tools, "initial": ORDER_INITIAL, **changes}
    with pytest.raises(agenttx.InvalidArgument, match=match):
        agenttx.run_plan(ORDER_PLAN, **arguments)
    with pytest.raises(agenttx.InvalidArgument, match=match):
        agenttx.start_plan(ORDER_PLAN, **arguments)
    assert calls == []


def test_an_invalid_plan_is_refused_with_its_problems():
    """A plan naming an unknown tool raises PlanValidationError with .problems; nothing runs."""
    tools, calls, _ = _order_shop()
    plan = agenttx.Plan(nodes=[agenttx.Node("x", tool="no_such_tool")])
    with pytest.raises(agenttx.PlanValidationError) as caught:
        agenttx.run_plan(plan, tools=tools, initial={})
    assert [p.code for p in caught.value.problems] == [agenttx.PlanProblemCode.UNKNOWN_TOOL]
    assert calls == []


def test_run_plan_refuses_to_run_inside_a_running_loop():
    """run_plan inside a coroutine raises FailedPrecondition pointing to arun_plan."""
    tools, _, _ = _order_shop()

    async def main() -> None:
        with pytest.raises(agenttx.FailedPrecondition, match="arun_plan"):
            agenttx.run_plan(ORDER_PLAN, tools=tools, initial=ORDER_INITIAL)

    asyncio.run(main())


def test_plan_run_wait_times_out_and_validates_its_argument():
    """wait(timeout) raises TimeoutError while the run goes on; a bad timeout is refused."""
    release = threading.Event()

    @agenttx.tool
    def blocks() -> dict[str, int]:
        release.wait(10)
        return {"ok": 1}

    run = agenttx.start_plan(
        agenttx.Plan(nodes=[agenttx.Node("b", tool="blocks", timeout=20)]),
        tools=[blocks],
        initial={},
    )
    with pytest.raises(TimeoutError):
        run.wait(0)
    with pytest.raises(agenttx.InvalidArgument):
        run.wait(-1)
    release.set()
    assert run.wait(10).status is PlanStatus.SUCCEEDED
    assert run.id in repr(run)


def test_a_node_failing_at_dispatch_releases_a_fallback_dependant():
    """An input that cannot resolve fails its node at dispatch; a fallback dependant still runs."""

    @agenttx.tool
    def produce() -> dict:
        return {}

    @agenttx.tool
    def needs(x: int) -> dict[str, int]:
        return {"x": x}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("p", tool="produce"),
            agenttx.Node("a", tool="needs", inputs={"x": "${p.x}"}, retries=2),
            agenttx.Node("b", tool="needs", inputs={"x": "${a.x}"}, fallback={"x": -1}),
        ]
    )
    result = agenttx.run_plan(plan, tools=[produce, needs], initial={}, backoff=NO_WAIT)
    assert result.nodes["a"].state is NodeState.FAILED
    assert result.nodes["a"].attempts == 1
    assert result.nodes["a"].error.key == "x"
    assert result.nodes["b"].output == {"x": -1}


def test_undos_of_interrupted_calls_run_only_once_the_call_is_over(monkeypatch):
    """On cancel, an unwound async tool's undo runs; a sync tool still running when the run's
    end stops waiting for it keeps its undo, reported."""
    monkeypatch.setattr("agenttx._plans._late.LATE_GRACE", 0.0)
    entered = threading.Barrier(3)
    release = threading.Event()
    undone: list[str] = []

    @agenttx.compensation
    def undo(payload):
        undone.append(payload)

    @agenttx.tool
    async def async_side(ctx: agenttx.ToolContext) -> dict[str, int]:
        ctx.register_undo("undo", "async")
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
        await asyncio.Event().wait()
        return {"never": 1}

    @agenttx.tool
    def sync_side(ctx: agenttx.ToolContext) -> dict[str, int]:
        ctx.register_undo("undo", "sync")
        entered.wait(10)
        release.wait(10)
        return {"late": 1}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("a", tool="async_side", timeout=60),
            agenttx.Node("s", tool="sync_side", timeout=60),
        ]
    )
    run = agenttx.start_plan(plan, tools=[async_side, sync_side, undo], initial={})
    entered.wait(10)
    run.cancel("stop")
    try:
        result = run.wait(10)
    finally:
        release.set()
    assert undone == ["async"]
    outcomes = {c.node_id: c for c in result.compensations}
    assert outcomes["a"].status is agenttx.CompensationStatus.COMPLETED
    assert outcomes["s"].status is agenttx.CompensationStatus.FAILED
    assert "still running" in (outcomes["s"].error or "")


def test_rate_limits_queue_starts_and_retries_wait_for_their_backoff():
    """A tool's rate limit holds starts back (the audit says so); retries wait, then succeed."""
    failures = {"left": 1}

    @agenttx.tool
    def limited(n: int) -> dict[str, int]:
        return {"n": n}

    @agenttx.tool
    def flaky_once() -> dict[str, int]:
        if failures["left"]:
            failures["left"] -= 1
            raise TimeoutError("upstream timed out")
        return {"ok": 1}

    nodes = [agenttx.Node(f"n{i}", tool="limited", inputs={"n": i}) for i in range(3)]
    nodes.append(agenttx.Node("flaky", tool="flaky_once", retries=1))
    result = agenttx.run_plan(
        agenttx.Plan(nodes=nodes),
        tools=[limited, flaky_once],
        initial={},
        rate_limits={"limited": agenttx.RateLimit(per_second=1000.0, burst=1)},
        backoff=Backoff(base=0.001, max_wait=0.001),
    )
    assert result.status is PlanStatus.SUCCEEDED
    waited = [
        event.data["checks"]["waited_for"]
        for event in result.audit
        if event.kind is agenttx.EventKind.DISPATCHED
    ]
    assert ["rate:limited"] in waited
    assert result.nodes["flaky"].attempts == 2


@st.composite
def _random_dags(draw):
    """Up to 8 nodes, each after a random subset of earlier ones, some failing."""
    size = draw(st.integers(min_value=1, max_value=8))
    nodes = []
    for index in range(size):
        after = draw(st.sets(st.integers(min_value=0, max_value=index - 1))) if index else set()
        nodes.append((sorted(after), draw(st.booleans())))
    limit = draw(st.integers(min_value=1, max_value=4))
    return nodes, limit


@given(_random_dags())
@settings(max_examples=40)
def test_random_dags_respect_prerequisites_limits_and_skips(drawn):
    """Every node ends once; none starts before its prerequisites ended well; limits hold."""
    shape, limit = drawn
    events: list[tuple[str, str]] = []
    intervals = Intervals()

    @agenttx.tool
    async def work(name: str, fail: bool) -> dict[str, str]:
        intervals.enter()
        events.append(("start", name))
        await asyncio.sleep(0)
        events.append(("end", name))
        intervals.leave()
        if fail:
            raise ValueError(f"{name} failed")
        return {"name": name}

    @agenttx.tool(inline=True)
    def work_inline(name: str, fail: bool) -> dict[str, str]:
        events.append(("start", name))
        events.append(("end", name))
        if fail:
            raise ValueError(f"{name} failed")
        return {"name": name}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node(
                f"n{i}",
                tool="work" if i % 2 else "work_inline",
                inputs={"name": f"n{i}", "fail": fail},
                after=[f"n{j}" for j in after],
            )
            for i, (after, fail) in enumerate(shape)
        ]
    )
    result = agenttx.run_plan(plan, tools=[work, work_inline], initial={}, max_concurrency=limit)
    assert intervals.most.get("all", 0) <= limit
    position = {event: i for i, event in enumerate(events)}
    expected: dict[str, NodeState] = {}
    for i, (after, fail) in enumerate(shape):
        name = f"n{i}"
        state = result.nodes[name].state
        if any(expected[f"n{j}"] is not NodeState.SUCCEEDED for j in after):
            expected[name] = NodeState.SKIPPED
            assert ("start", name) not in position
        else:
            expected[name] = NodeState.FAILED if fail else NodeState.SUCCEEDED
            for j in after:
                assert position[("end", f"n{j}")] < position[("start", name)]
        assert state is expected[name]
    all_ok = all(state is NodeState.SUCCEEDED for state in expected.values())
    assert result.succeeded is all_ok


def test_a_nodes_compensation_replaces_its_tools_and_gets_arguments_and_output():
    """Node(compensate=...) runs instead of the tool's, with the node's arguments and output."""
    calls: list[tuple[str, object]] = []

    @agenttx.compensation
    def tool_undo(payload):
        calls.append(("tool", payload))

    @agenttx.compensation
    def node_undo(payload):
        calls.append(("node", payload))

    @agenttx.tool(compensate=tool_undo)
    def reserve(sku: str) -> dict[str, str]:
        return {"reservation_id": f"r-{sku}"}

    @agenttx.tool
    def fail(reservation_id: str) -> dict[str, str]:
        raise ValueError("declined")

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("reserve", tool="reserve", inputs={"sku": "A"}, compensate="node_undo"),
            agenttx.Node(
                "pay", tool="fail", inputs={"reservation_id": "${reserve.reservation_id}"}
            ),
        ]
    )
    result = agenttx.run_plan(plan, tools=[reserve, fail, tool_undo, node_undo], initial={})
    assert calls == [("node", {"arguments": {"sku": "A"}, "output": {"reservation_id": "r-A"}})]
    assert [c.kind for c in result.compensations] == ["node_undo"]


def test_a_run_id_open_in_the_store_is_refused_and_left_alone():
    """A run id that is another transaction's open id is refused; that transaction is kept."""
    store = MemoryStore()
    store.begin("busy")
    store.put("busy", "k", "1")
    tools, calls, _ = _order_shop()
    with pytest.raises(agenttx.InvalidArgument, match="already open"):
        agenttx.run_plan(ORDER_PLAN, tools=tools, initial=ORDER_INITIAL, store=store, run_id="busy")
    with pytest.raises(agenttx.InvalidArgument, match="must be a Store"):
        agenttx.run_plan(ORDER_PLAN, tools=tools, initial=ORDER_INITIAL, store=object())
    assert calls == []
    assert store.is_open("busy")
    assert store.get("busy", "k") == "1"


def test_a_failing_commit_fails_the_plan_and_compensates():
    """A store error at commit makes the run FAILED with the error; completed work is undone."""

    class BrokenCommit(MemoryStore):
        def commit(self, tx_id: str) -> int:
            raise agenttx.StorageError("disk full")

    tools, _, released = _order_shop()
    store = BrokenCommit()
    result = agenttx.run_plan(ORDER_PLAN, tools=tools, initial=ORDER_INITIAL, store=store)
    assert result.status is PlanStatus.FAILED
    assert "disk full" in (result.error or "")
    assert released == ["r-1"]
    assert not store.is_open(result.run_id)


def test_a_started_run_interrupted_by_a_tool_compensates_then_wait_raises_it():
    """KeyboardInterrupt in a tool of a started run: the completed node is compensated, the
    run ends CANCELLED and `wait` re-raises the interrupt; `done` and `audit` tell the same."""
    undone: list[str] = []

    @agenttx.compensation(name="undo_first")
    def undo_first(payload: dict) -> None:
        undone.append(payload["output"]["n"])

    @agenttx.tool(compensate=undo_first)
    def first() -> dict[str, str]:
        return {"n": "first"}

    @agenttx.tool
    def interrupted(n: str) -> dict[str, str]:
        raise KeyboardInterrupt

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("a", tool="first"),
            agenttx.Node("b", tool="interrupted", inputs={"n": "${a.n}"}),
        ]
    )
    run = agenttx.start_plan(plan, tools=[first, interrupted, undo_first], initial={})
    with pytest.raises(KeyboardInterrupt):
        run.wait(10)
    assert run.done
    assert run.status is PlanStatus.CANCELLED
    assert undone == ["first"]
    kinds = [event.kind for event in run.audit()]
    assert agenttx.EventKind.COMPENSATED in kinds
    with pytest.raises(KeyboardInterrupt):  # every wait says so
        run.wait(0)


def test_a_rate_limit_given_as_a_number_is_a_bucket_of_one():
    """rate_limits={tool: 2.0}: two starts per second, one at a time, so that the second
    of two nodes waits about half a second for its token."""
    started: list[float] = []

    @agenttx.tool
    def paced(n: int) -> dict[str, int]:
        started.append(time.monotonic())
        return {"n": n}

    plan = agenttx.Plan(
        nodes=[agenttx.Node(f"p{i}", tool="paced", inputs={"n": i}) for i in (1, 2)]
    )
    result = agenttx.run_plan(plan, tools=[paced], initial={}, rate_limits={"paced": 2})
    assert result.status is PlanStatus.SUCCEEDED
    assert len(started) == 2
    assert max(started) - min(started) >= 0.4


class Receipt(TypedDict, total=False):
    receipt_id: str
    pages: int


@pytest.mark.parametrize(
    ("output", "state", "key"),
    [
        ({}, NodeState.SUCCEEDED, None),  # every field is optional
        ({"receipt_id": "r-1", "pages": 2}, NodeState.SUCCEEDED, None),
        ({"pages": "two"}, NodeState.FAILED, "pages"),
        (["r-1"], NodeState.FAILED, None),
    ],
)
def test_an_output_is_checked_against_its_typed_dict_field_by_field(output, state, key):
    """Optional fields may be missing; a field of the wrong type, or an output that is not an
    object, fails the node naming what is wrong."""

    @agenttx.tool
    def receipt() -> Receipt:
        return output  # type: ignore[return-value]

    result = agenttx.run_plan(
        agenttx.Plan(nodes=[agenttx.Node("r", tool="receipt")]), tools=[receipt], initial={}
    )
    node = result.nodes["r"]
    assert node.state is state
    if state is NodeState.FAILED:
        assert node.error.key == key
        assert node.attempts == 1
        assert node.error.rule == "output_mismatch"  # the tool's fault, not its arguments'
        assert node.error.text.startswith(
            "Hint: Output of tool 'receipt' does not match its return type Receipt: "
        )
        if key is None:
            assert ": expected an object, got list. " in node.error.text
        else:
            assert ": field 'pages': invalid type: string, expected an integer. " in node.error.text
        assert "argument type" not in node.error.text


def test_an_interrupt_in_an_async_tool_ends_the_run_and_wait_raises_it():
    """KeyboardInterrupt from an async tool ends a started run CANCELLED; wait re-raises it."""

    @agenttx.tool
    async def interrupted() -> dict[str, int]:
        raise KeyboardInterrupt

    run = agenttx.start_plan(
        agenttx.Plan(nodes=[agenttx.Node("i", tool="interrupted")]), tools=[interrupted], initial={}
    )
    with pytest.raises(KeyboardInterrupt):
        run.wait(10)
    assert run.status is PlanStatus.CANCELLED


# ---------------------------------------------------------------------- abandoned sync calls


class _Bank:
    """A card charge that lands only once `go` is set (after its node was abandoned), and its
    refund, with what each did."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.charging = threading.Event()
        self.charges: list[str] = []
        self.refunds: list[str] = []
        self.keys: list[str] = []

    def tools(self) -> list[object]:
        @agenttx.compensation
        def refund(payload):
            self.refunds.append(payload["output"]["charge_id"])

        @agenttx.tool(compensate=refund)
        def charge(ctx: agenttx.ToolContext, amount: int) -> dict:
            self.keys.append(ctx.idempotency_key)
            self.charging.set()
            self.go.wait(30)
            charge_id = f"ch-{len(self.charges) + 1}"
            self.charges.append(charge_id)
            return {"charge_id": charge_id}

        @agenttx.tool
        def doomed() -> dict:
            self.charging.wait(30)
            raise agenttx.ToolError("the card was declined", transient=False)

        return [charge, refund, doomed]

    def on(self, kind: agenttx.EventKind) -> list[object]:
        """A hook that lets the charge land once node `charge` has a `kind` event."""

        def hook(event: agenttx.Event) -> None:
            if event.kind is kind and event.node == "charge":
                self.go.set()

        return [hook]


def _charge_node(**options: object) -> agenttx.Node:
    return agenttx.Node("charge", tool="charge", inputs={"amount": 5}, **options)


def _refunded_once(result: agenttx.PlanResult, bank: _Bank, charge_id: str = "ch-1") -> None:
    assert bank.refunds == [charge_id]
    late = [e for e in result.audit if e.kind is agenttx.EventKind.LATE_RESULT_REFUSED and e.node]
    assert [(e.node, e.data["late"]) for e in late] == [("charge", "output")]
    compensated = [
        e for e in result.audit if e.kind is agenttx.EventKind.COMPENSATED and e.node == "charge"
    ]
    assert len(compensated) == 1
    outcomes = [c for c in result.compensations if c.node_id == "charge"]
    assert [c.status for c in outcomes] == [agenttx.CompensationStatus.COMPLETED]


@pytest.mark.timeout(60)
def test_a_sync_call_abandoned_when_a_sibling_fails_is_refunded_once_it_lands():
    """cancel_all: the charge lands after its node was cancelled; once it returned its
    compensate= undo runs, once, and the audit shows the late result and the refund."""
    bank = _Bank()
    plan = agenttx.Plan(nodes=[_charge_node(timeout=30), agenttx.Node("doomed", tool="doomed")])
    result = agenttx.run_plan(
        plan,
        tools=bank.tools(),
        initial={},
        on_failure="cancel_all",
        hooks=bank.on(agenttx.EventKind.CANCELLED),
    )
    assert result.status is PlanStatus.FAILED
    assert result.nodes["charge"].state is NodeState.CANCELLED
    assert bank.charges == ["ch-1"]
    _refunded_once(result, bank)


@pytest.mark.timeout(60)
def test_a_sync_call_abandoned_at_its_node_timeout_is_refunded_once_it_lands():
    """The charge times out (no retry) and lands later: the run's end waits for it and
    refunds it."""
    bank = _Bank()
    plan = agenttx.Plan(nodes=[_charge_node(timeout=0.2)])
    result = agenttx.run_plan(
        plan, tools=bank.tools(), initial={}, hooks=bank.on(agenttx.EventKind.FAILED)
    )
    assert result.status is PlanStatus.FAILED
    assert result.nodes["charge"].state is NodeState.TIMED_OUT
    assert bank.charges == ["ch-1"]
    _refunded_once(result, bank)


@pytest.mark.timeout(60)
def test_a_sync_call_abandoned_by_a_cancel_is_refunded_once_it_lands():
    """run.cancel() while the charge runs: it lands, and is refunded once."""
    bank = _Bank()
    plan = agenttx.Plan(nodes=[_charge_node(timeout=30)])
    run = agenttx.start_plan(
        plan, tools=bank.tools(), initial={}, hooks=bank.on(agenttx.EventKind.CANCELLED)
    )
    assert bank.charging.wait(30)
    run.cancel("the customer left")
    result = run.wait(30)
    assert result.status is PlanStatus.CANCELLED
    assert bank.charges == ["ch-1"]
    _refunded_once(result, bank)


@pytest.mark.timeout(60)
def test_a_retry_waits_for_the_timed_out_call_and_gets_a_new_key_once_it_was_refunded():
    """A timed-out charge is retried: the retry starts only once the first call returned and
    was refunded, and under a key of its own (the first one's effect was compensated)."""
    bank = _Bank()
    plan = agenttx.Plan(nodes=[_charge_node(timeout=0.2, retries=1)])
    result = agenttx.run_plan(
        plan, tools=bank.tools(), initial={}, hooks=bank.on(agenttx.EventKind.RETRIED)
    )
    assert result.status is PlanStatus.SUCCEEDED
    assert bank.charges == ["ch-1", "ch-2"]
    assert bank.refunds == ["ch-1"]
    assert len(bank.keys) == 2
    assert bank.keys[0] != bank.keys[1]
    assert result.nodes["charge"].idempotency_key == bank.keys[1]
    assert result.nodes["charge"].output == {"charge_id": "ch-2"}


def _keys(value: object) -> object:
    """The keys of every object in `value`, in their order, at every depth."""
    if isinstance(value, dict):
        return [(key, _keys(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [_keys(item) for item in value]
    return None


def test_a_plan_node_gets_objects_in_the_key_order_given():
    """A node's literal input, an initial value and another node's output reach the tool
    with their keys in the order given, at every depth."""
    seen: list[object] = []

    @agenttx.tool
    def echo(value: dict) -> dict:
        seen.append(_keys(value))
        return {"w": 1, "value": value}

    nested = {"zip": "N1", "lines": [{"sku": "b", "qty": 2}], "at": {"y": 1, "x": 2}}
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("literal", tool="echo", inputs={"value": nested}),
            agenttx.Node("given", tool="echo", inputs={"value": "${initial.order}"}),
            agenttx.Node("output", tool="echo", inputs={"value": "${literal}"}),
        ],
        initial=["order"],
    )
    result = agenttx.run_plan(plan, tools=[echo], initial={"order": nested}, store=MemoryStore())
    assert result.status is PlanStatus.SUCCEEDED
    assert sorted(seen, key=json.dumps) == sorted(
        [_keys(nested), _keys(nested), _keys({"w": 1, "value": nested})], key=json.dumps
    )
