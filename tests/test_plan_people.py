"""Plan nodes that need a person: WAITING_APPROVAL while independent nodes go on, rejection."""

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
