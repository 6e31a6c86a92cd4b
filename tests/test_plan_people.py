"""Plan nodes that need a person: approval while independent nodes go on, status checks and
review when a node's outcome is unknown."""

from __future__ import annotations

import threading
import time

import pytest

import agenttx
from agenttx import NodeState, PlanStatus
from agenttx.stores import MemoryStore, SQLiteStore


class Ledger:
    """What the tools did, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, object]] = []

    def add(self, name: str, value: object) -> None:
        with self.lock:
            self.calls.append((name, value))


def _tools(ledger: Ledger, **charge_options):
    @agenttx.tool
    def lookup(email: str) -> dict:
        ledger.add("lookup", email)
        return {"customer_id": "c-" + email}

    @agenttx.tool(**{"needs_approval": True, **charge_options})
    def charge(customer_id: str, amount: int) -> dict:
        ledger.add("charge", amount)
        return {"charge_id": "ch-1"}

    @agenttx.tool
    def receipt(charge_id: str) -> dict:
        ledger.add("receipt", charge_id)
        return {"sent": True}

    return [lookup, charge, receipt]


def _plan() -> agenttx.Plan:
    return agenttx.Plan(
        nodes=[
            agenttx.Node("lookup", tool="lookup", inputs={"email": "${initial.email}"}),
            agenttx.Node(
                "charge",
                tool="charge",
                inputs={"customer_id": "${initial.customer}", "amount": "${initial.amount}"},
            ),
            agenttx.Node("receipt", tool="receipt", inputs={"charge_id": "${charge.charge_id}"}),
        ],
        initial=["email", "customer", "amount"],
    )


INITIAL = {"email": "ada@x.io", "customer": "c-1", "amount": 4200}


def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_a_node_waits_for_approval_while_independent_nodes_go_on():
    """The charge node waits in WAITING_APPROVAL; lookup succeeds meanwhile; approved, it runs."""
    ledger = Ledger()
    plan = _plan()
    run = agenttx.start_plan(plan, tools=_tools(ledger), initial=INITIAL, store=MemoryStore())
    _until(lambda: run.node_states()["charge"] is NodeState.WAITING_APPROVAL)
    _until(lambda: run.node_states()["lookup"] is NodeState.SUCCEEDED)
    assert run.node_states()["receipt"] is NodeState.PENDING
    assert ("charge", 4200) not in ledger.calls
    (request,) = run.pending_approvals()
    assert (request.scope, request.node, request.tool) == ("plan", "charge", "charge")
    assert request.scope_id == run.id
    assert request.plan_version == plan.version
    assert request.arguments == {"customer_id": "c-1", "amount": 4200}
    run.approve(request.id, actor="alice")
    result = run.wait(10)
    assert result.status is PlanStatus.SUCCEEDED
    assert ledger.calls.count(("charge", 4200)) == 1
    assert result.nodes["receipt"].state is NodeState.SUCCEEDED
    kinds = [(e.kind.name, e.node, e.actor) for e in result.audit]
    assert ("APPROVAL_REQUESTED", "charge", None) in kinds
    assert ("APPROVED", "charge", "alice") in kinds
    assert ("APPROVAL_CONSUMED", "charge", "alice") in kinds


def test_a_rejected_node_fails_with_the_reason_and_is_not_retried():
    """A rejection fails the node (no retry); its dependants are skipped."""
    ledger = Ledger()
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node(
                "charge",
                tool="charge",
                inputs={"customer_id": "${initial.customer}", "amount": "${initial.amount}"},
                retries=3,
            ),
            agenttx.Node("receipt", tool="receipt", inputs={"charge_id": "${charge.charge_id}"}),
        ],
        initial=["customer", "amount"],
    )
    run = agenttx.start_plan(
        plan, tools=_tools(ledger), initial={"customer": "c", "amount": 1}, store=MemoryStore()
    )
    _until(lambda: bool(run.pending_approvals()))
    (request,) = run.pending_approvals()
    run.reject(request.id, actor="bob", reason="over budget")
    result = run.wait(10)
    assert result.status is PlanStatus.FAILED
    charge = result.nodes["charge"]
    assert charge.state is NodeState.FAILED
    assert "over budget" in charge.error.text
    assert charge.attempts == 1
    assert result.nodes["receipt"].state is NodeState.SKIPPED
    assert ledger.calls == []
    with pytest.raises(agenttx.ApprovalRejected):
        run.approve(request.id, actor="alice")


def test_an_engine_approves_a_plan_node_from_another_engine(tmp_path):
    """On SQLite, a second engine on the file lists and approves the node's request."""
    ledger = Ledger()
    tools = _tools(ledger, needs_approval=lambda arguments: arguments["amount"] > 1000)
    path = tmp_path / "plan.db"
    with SQLiteStore(path) as one, SQLiteStore(path) as two:
        runner = agenttx.Engine(tools=tools, store=one)
        desk = agenttx.Engine(store=two)
        run = runner.start_plan(_plan(), initial=INITIAL)
        _until(lambda: bool(desk.pending_approvals()))
        (request,) = desk.pending_approvals()
        assert request.node == "charge"
        with pytest.raises(agenttx.InvalidArgument):
            desk.approve(request.id, actor="")
        desk.approve(request.id, actor="alice", expires_in=60)
        result = run.wait(20)
        assert result.status is PlanStatus.SUCCEEDED
        assert ledger.calls.count(("charge", 4200)) == 1
        assert desk.pending_approvals() == ()


def test_a_plan_node_under_the_threshold_runs_without_asking():
    """needs_approval= as a function of the node's resolved inputs."""
    ledger = Ledger()
    tools = _tools(ledger, needs_approval=lambda arguments: arguments["amount"] > 10_000)
    result = agenttx.run_plan(_plan(), tools=tools, initial=INITIAL)
    assert result.status is PlanStatus.SUCCEEDED
    assert ("charge", 4200) in ledger.calls


def test_cancelling_a_run_ends_a_waiting_node_cancelled():
    """A node waiting for approval is cancelled with its run; nothing runs."""
    ledger = Ledger()
    run = agenttx.start_plan(_plan(), tools=_tools(ledger), initial=INITIAL)
    _until(lambda: run.node_states()["charge"] is NodeState.WAITING_APPROVAL)
    run.cancel("the customer hung up")
    result = run.wait(10)
    assert result.status is PlanStatus.CANCELLED
    assert result.nodes["charge"].state is NodeState.CANCELLED
    assert all(name != "charge" for name, _ in ledger.calls)


def _slow_charge(ledger: Ledger, release: threading.Event, **options):
    @agenttx.tool(name="charge", **options)
    def charge(ctx: agenttx.ToolContext, customer_id: str, amount: int) -> dict:
        ledger.add("charge", ctx.idempotency_key)
        release.wait(5)
        return {"charge_id": "late"}

    return charge


def _one_node(timeout: float = 0.2) -> agenttx.Plan:
    return agenttx.Plan(
        nodes=[
            agenttx.Node(
                "charge",
                tool="charge",
                inputs={"customer_id": "${initial.customer}", "amount": "${initial.amount}"},
                timeout=timeout,
                retries=2,
            )
        ],
        initial=["customer", "amount"],
    )


@pytest.fixture
def release():
    """Lets the slow tools of a test finish when it ends."""
    event = threading.Event()
    yield event
    event.set()


def test_a_timed_out_node_with_a_status_check_is_not_run_twice(release):
    """The node's call times out while running; the check finds it: SUCCEEDED, one call."""
    ledger = Ledger()

    def check(arguments, key):
        if ("charge", key) in ledger.calls:
            return agenttx.CheckResult.done({"charge_id": "found"})
        return agenttx.CheckResult.not_done()

    tool = _slow_charge(ledger, release, check=check)
    result = agenttx.run_plan(_one_node(), tools=[tool], initial={"customer": "c", "amount": 5})
    assert result.status is PlanStatus.SUCCEEDED
    assert result.nodes["charge"].output == {"charge_id": "found"}
    assert len(ledger.calls) == 1
    kinds = [event.kind.name for event in result.audit]
    assert "OUTCOME_UNKNOWN" in kinds


def test_a_timed_out_node_without_a_check_waits_for_review(release):
    """No check: the node shows NEEDS_REVIEW; resolved done, it succeeds with that output."""
    ledger = Ledger()
    tool = _slow_charge(ledger, release, on_unknown="review")
    run = agenttx.start_plan(_one_node(), tools=[tool], initial={"customer": "c", "amount": 5})
    _until(lambda: run.node_states()["charge"] is NodeState.NEEDS_REVIEW)
    (review,) = run.pending_reviews()
    assert review.node == "charge"
    assert review.idempotency_key == ledger.calls[0][1]
    assert any("timed out" in error for error in review.errors)
    run.resolve_review(review.id, outcome="done", output={"charge_id": "manual"}, actor="ops")
    result = run.wait(10)
    assert result.status is PlanStatus.SUCCEEDED
    assert result.nodes["charge"].output == {"charge_id": "manual"}
    assert len(ledger.calls) == 1


def test_a_node_review_resolved_not_done_runs_again_with_the_same_key(release):
    """not_done: the node's call runs again with the same idempotency key."""
    calls = []

    @agenttx.tool(name="charge", on_unknown="review")
    def charge(ctx: agenttx.ToolContext, customer_id: str, amount: int) -> dict:
        calls.append(ctx.idempotency_key)
        if len(calls) == 1:
            release.wait(5)
        return {"charge_id": "second"}

    run = agenttx.start_plan(_one_node(), tools=[charge], initial={"customer": "c", "amount": 5})
    _until(lambda: bool(run.pending_reviews()))
    (review,) = run.pending_reviews()
    run.resolve_review(review.id, outcome="not_done", actor="ops")
    result = run.wait(10)
    assert result.status is PlanStatus.SUCCEEDED
    assert result.nodes["charge"].output == {"charge_id": "second"}
    assert calls == [review.idempotency_key] * 2
