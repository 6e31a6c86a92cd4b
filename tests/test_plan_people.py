"""Plan nodes that need a person: approval while independent nodes go on, status checks and
review when a node's outcome is unknown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

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


def _on_unknown(release: threading.Event):
    """A hook that lets the timed-out call return once its outcome is found unknown (while
    the run awaits its return, before it asks the status check)."""

    def hook(event: agenttx.Event) -> None:
        if event.kind.name == "OUTCOME_UNKNOWN":
            release.set()

    return [hook]


def test_a_timed_out_node_with_a_status_check_is_not_run_twice(release):
    """The node's call times out while running; once it returned the check finds it:
    SUCCEEDED, one call."""
    ledger = Ledger()

    def check(arguments, key):
        if ("charge", key) in ledger.calls:
            return agenttx.CheckResult.done({"charge_id": "found"})
        return agenttx.CheckResult.not_done()

    tool = _slow_charge(ledger, release, check=check)
    result = agenttx.run_plan(
        _one_node(),
        tools=[tool],
        initial={"customer": "c", "amount": 5},
        hooks=_on_unknown(release),
    )
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
    release.set()  # the first call has ended by the time a person decides
    run.resolve_review(review.id, outcome="not_done", actor="ops")
    result = run.wait(10)
    assert result.status is PlanStatus.SUCCEEDED
    assert result.nodes["charge"].output == {"charge_id": "second"}
    assert calls == [review.idempotency_key] * 2


def test_a_failed_approved_call_uses_its_approval_up_and_its_retry_asks_again():
    """The approved call fails; the retry needs a new approval, and the first one is ended."""
    calls = []

    @agenttx.tool(name="charge", needs_approval=True)
    def charge(customer_id: str, amount: int) -> dict:
        calls.append(amount)
        if len(calls) == 1:
            raise TimeoutError("the bank did not answer")
        return {"charge_id": "ch-2"}

    store = MemoryStore()
    run = agenttx.start_plan(
        _one_node(timeout=None),
        tools=[charge],
        initial={"customer": "c", "amount": 5},
        store=store,
    )
    _until(lambda: bool(run.pending_approvals()))
    (first,) = run.pending_approvals()
    run.approve(first.id, actor="alice")
    _until(lambda: bool(run.pending_approvals()) and run.pending_approvals()[0].id != first.id)
    assert calls == [5]
    assert run.pending_reviews() == ()  # a failure is a known outcome: no review
    (second,) = run.pending_approvals()
    run.approve(second.id, actor="alice")
    result = run.wait(10)
    assert result.status is PlanStatus.SUCCEEDED
    assert result.nodes["charge"].attempts == 2
    assert calls == [5, 5]
    consumed = [e for e in result.audit if e.kind.name == "APPROVAL_CONSUMED"]
    assert [e.data["request"] for e in consumed] == [first.id, second.id]
    assert "OUTCOME_UNKNOWN" not in [e.kind.name for e in result.audit]
    with pytest.raises(agenttx.ApprovalConsumed):
        run.approve(first.id, actor="alice")


def _timed_out_with(release: threading.Event, check) -> tuple[agenttx.PlanRun, Ledger]:
    ledger = Ledger()
    tool = _slow_charge(ledger, release, check=check)
    run = agenttx.start_plan(
        _one_node(),
        tools=[tool],
        initial={"customer": "c", "amount": 5},
        hooks=_on_unknown(release),
    )
    return run, ledger


@pytest.mark.parametrize("kind", ["raises", "unknown"])
def test_a_timed_out_node_whose_check_cannot_tell_goes_to_review(release, kind):
    """A check that raises, or answers unknown, is kept as evidence in the review's errors."""

    def check(arguments, key):
        if kind == "raises":
            raise ConnectionError("status API down")
        return agenttx.CheckResult.unknown("the bank is silent")

    run, ledger = _timed_out_with(release, check)
    _until(lambda: bool(run.pending_reviews()))
    (review,) = run.pending_reviews()
    assert run.node_states()["charge"] is NodeState.NEEDS_REVIEW
    evidence = " | ".join(review.errors)
    assert "timed out" in evidence
    assert ("status API down" if kind == "raises" else "the bank is silent") in evidence
    run.resolve_review(review.id, outcome="done", output={"charge_id": "ops"}, actor="ops")
    result = run.wait(10)
    assert result.nodes["charge"].output == {"charge_id": "ops"}
    assert len(ledger.calls) == 1


def test_a_timed_out_node_whose_check_says_not_done_runs_again_with_the_same_key(release):
    """not_done from the check: the call runs again under the key of the first call."""
    ledger = Ledger()

    @agenttx.tool(name="charge", check=lambda arguments, key: agenttx.CheckResult.not_done())
    def charge(ctx: agenttx.ToolContext, customer_id: str, amount: int) -> dict:
        ledger.add("charge", ctx.idempotency_key)
        release.wait(5)  # the first call returns once its outcome is unknown; the second at once
        return {"charge_id": "second"}

    result = agenttx.run_plan(
        _one_node(),
        tools=[charge],
        initial={"customer": "c", "amount": 5},
        hooks=_on_unknown(release),
    )
    assert result.status is PlanStatus.SUCCEEDED
    assert result.nodes["charge"].output == {"charge_id": "second"}
    keys = [key for _, key in ledger.calls]
    assert len(keys) == 2
    assert keys[0] == keys[1]


@pytest.mark.timeout(60)
def test_a_timed_out_node_is_not_checked_nor_run_again_while_its_call_is_in_flight(release):
    """The check is asked only once the call has returned: a call still in flight, whose
    honest check would say not_done, goes to review instead of starting a second charge."""
    ledger = Ledger()
    charged: list[str] = []

    def check(arguments, key):
        if key in charged:
            return agenttx.CheckResult.done({"charge_id": "found"})
        return agenttx.CheckResult.not_done()  # honest: it has not landed yet

    @agenttx.tool(name="charge", check=check)
    def charge(ctx: agenttx.ToolContext, customer_id: str, amount: int) -> dict:
        ledger.add("charge", ctx.idempotency_key)
        release.wait(30)
        charged.append(ctx.idempotency_key)
        return {"charge_id": "late"}

    run = agenttx.start_plan(_one_node(), tools=[charge], initial={"customer": "c", "amount": 5})
    _until(lambda: run.node_states()["charge"] is NodeState.NEEDS_REVIEW)
    assert len(ledger.calls) == 1  # no second execution beside the one in flight
    (review,) = run.pending_reviews()
    assert any("only once it has returned" in error for error in review.errors)
    release.set()
    run.resolve_review(review.id, outcome="done", output={"charge_id": "late"}, actor="ops")
    result = run.wait(30)
    assert result.status is PlanStatus.SUCCEEDED
    assert len(ledger.calls) == 1
    assert len(charged) == 1


WORKER = Path(__file__).resolve().parent / "_plan_people_worker.py"


def _die_in(phase: str, tmp_path: Path) -> dict:
    """Run the worker's `phase` until it kills itself; what it printed."""
    env = {**os.environ, "PYTHONPATH": str(WORKER.parent.parent)}
    died = subprocess.run(
        [sys.executable, str(WORKER), phase, str(tmp_path / "db"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert died.returncode == -signal.SIGKILL, died.stderr
    lines = died.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def _resume(tmp_path: Path, *tools: object) -> tuple[agenttx.Engine, agenttx.PlanRun]:
    store = SQLiteStore(tmp_path / "db")
    engine = agenttx.Engine(tools=list(tools), store=store)
    report = engine.recover("resume")
    assert report.plans_resumed == ("r",)
    return engine, engine.get_plan("r")


def _charged(tmp_path: Path) -> list[str]:
    return (tmp_path / "charges.log").read_text().split()


posix = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")


def _crash_tool(ledger: Ledger, **options):
    @agenttx.tool(name="charge", needs_approval=True, **options)
    def charge(ctx: agenttx.ToolContext, customer_id: str, amount: int) -> dict:
        ledger.add("charge", ctx.idempotency_key)
        return {"charge_id": "resumed"}

    return charge


@posix
def test_a_resumed_node_whose_approved_call_died_is_checked_not_run_again(tmp_path):
    """The approved call started, then the process died: the resumed run asks the check,
    which finds the charge by its key; the node succeeds with that output, no new call."""
    _die_in("charge", tmp_path)
    (key,) = _charged(tmp_path)
    asked: list[str] = []

    def check(arguments, given):
        asked.append(given)
        if given in _charged(tmp_path):
            return agenttx.CheckResult.done({"charge_id": "found"})
        return agenttx.CheckResult.not_done()

    ledger = Ledger()
    engine, run = _resume(tmp_path, _crash_tool(ledger, check=check))
    result = run.wait(20)
    assert result.status is PlanStatus.SUCCEEDED
    assert result.nodes["charge"].output == {"charge_id": "found"}
    assert ledger.calls == []
    assert asked == [key]
    assert "OUTCOME_UNKNOWN" in [event.kind.name for event in result.audit]
    assert engine.pending_approvals() == ()
    engine.store.close()  # type: ignore[attr-defined]


@posix
def test_a_resumed_node_whose_check_says_not_done_runs_again_with_the_same_key(tmp_path):
    """The check finds no charge: the call runs again under the key of the call that died,
    without asking for approval again."""
    _die_in("charge", tmp_path)
    (key,) = _charged(tmp_path)
    ledger = Ledger()
    tool = _crash_tool(ledger, check=lambda arguments, asked: agenttx.CheckResult.not_done())
    engine, run = _resume(tmp_path, tool)
    result = run.wait(20)
    assert result.status is PlanStatus.SUCCEEDED
    assert ledger.calls == [("charge", key)]
    engine.store.close()  # type: ignore[attr-defined]


@posix
def test_a_resumed_node_without_a_check_goes_to_review(tmp_path):
    """No check: the resumed node needs review, with the key of the call that died and why;
    resolved done, it succeeds with the person's output and nothing runs again."""
    _die_in("charge", tmp_path)
    (key,) = _charged(tmp_path)
    ledger = Ledger()
    engine, run = _resume(tmp_path, _crash_tool(ledger, on_unknown="review"))
    _until(lambda: bool(engine.pending_reviews()))
    (review,) = engine.pending_reviews()
    assert (review.node, review.idempotency_key) == ("charge", key)
    assert any("no status check" in error for error in review.errors)
    assert run.node_states()["charge"] is NodeState.NEEDS_REVIEW
    engine.resolve_review(review.id, outcome="done", output={"charge_id": "ops"}, actor="ops")
    result = run.wait(20)
    assert result.nodes["charge"].output == {"charge_id": "ops"}
    assert ledger.calls == []
    engine.store.close()  # type: ignore[attr-defined]


@posix
def test_a_resumed_node_said_done_by_its_review_keeps_its_undo_for_a_failed_run(tmp_path):
    """The node's call was cut off by the crash while under review: resolved done after the
    resume, the node keeps the undo its tool declares, with the reviewed output, and the run
    that then fails compensates it."""
    opened = _die_in("review-then", tmp_path)
    refunds: list[object] = []

    @agenttx.compensation(name="refund")
    def refund(payload: dict) -> None:
        refunds.append(payload["output"])

    @agenttx.tool(name="charge", on_unknown="review", compensate=refund)
    def charge(customer_id: str, amount: int) -> dict:
        raise AssertionError("a call said done is not run again")

    @agenttx.tool(name="then")
    def then(charge_id: str) -> dict:
        raise agenttx.ToolError(f"the receipt for {charge_id} bounced", transient=False)

    engine, run = _resume(tmp_path, charge, refund, then)
    _until(lambda: bool(engine.pending_reviews()))
    assert [review.id for review in engine.pending_reviews()] == [opened["review"]]
    engine.resolve_review(
        opened["review"], outcome="done", output={"charge_id": "ops"}, actor="ops"
    )
    result = run.wait(20)
    assert result.status is PlanStatus.FAILED
    assert result.nodes["charge"].output == {"charge_id": "ops"}
    assert refunds == [{"charge_id": "ops"}]
    engine.store.close()  # type: ignore[attr-defined]


@posix
def test_a_resumed_node_waits_for_the_request_it_made_before_the_crash(tmp_path):
    """The request pending at the crash is waited for again, not asked a second time."""
    asked = _die_in("ask", tmp_path)
    ledger = Ledger()
    engine, run = _resume(tmp_path, _crash_tool(ledger))
    _until(lambda: run.node_states()["charge"] is NodeState.WAITING_APPROVAL)
    assert [request.id for request in engine.pending_approvals()] == [asked["request"]]
    engine.approve(asked["request"], actor="alice")
    result = run.wait(20)
    assert result.status is PlanStatus.SUCCEEDED
    assert len(ledger.calls) == 1
    engine.store.close()  # type: ignore[attr-defined]


@posix
def test_an_approval_that_expired_before_the_resume_is_asked_again(tmp_path):
    """Approved before the resume with an expiry that passed: the resumed node records the
    expiry, asks again, and runs only on the new approval."""
    asked = _die_in("ask", tmp_path)
    with SQLiteStore(tmp_path / "db") as store:
        agenttx.Engine(store=store).approve(asked["request"], actor="alice", expires_in=0.01)
    time.sleep(0.05)
    ledger = Ledger()
    engine, run = _resume(tmp_path, _crash_tool(ledger))
    _until(lambda: bool(engine.pending_approvals()))
    (again,) = engine.pending_approvals()
    assert again.id != asked["request"]
    assert ledger.calls == []
    engine.approve(again.id, actor="bob")
    result = run.wait(20)
    assert result.status is PlanStatus.SUCCEEDED
    assert len(ledger.calls) == 1
    expired = [e for e in result.audit if e.kind.name == "APPROVAL_EXPIRED"]
    assert [e.data["request"] for e in expired] == [asked["request"]]
    engine.store.close()  # type: ignore[attr-defined]


@posix
def test_a_resumed_node_waits_for_the_review_opened_before_the_crash(tmp_path):
    """The review open at the crash keeps the resumed node in NEEDS_REVIEW; resolved
    not_done, the call runs again with the key of the one that hung."""
    opened = _die_in("review", tmp_path)
    (key,) = _charged(tmp_path)
    ledger = Ledger()

    @agenttx.tool(name="charge", on_unknown="review")
    def charge(ctx: agenttx.ToolContext, customer_id: str, amount: int) -> dict:
        ledger.add("charge", ctx.idempotency_key)
        return {"charge_id": "again"}

    engine, run = _resume(tmp_path, charge)
    _until(lambda: run.node_states()["charge"] is NodeState.NEEDS_REVIEW)
    assert [review.id for review in engine.pending_reviews()] == [opened["review"]]
    engine.resolve_review(opened["review"], outcome="not_done", actor="ops")
    result = run.wait(20)
    assert result.nodes["charge"].output == {"charge_id": "again"}
    assert ledger.calls == [("charge", key)]
    engine.store.close()  # type: ignore[attr-defined]


def test_an_edited_approval_runs_the_edited_call_and_a_bad_edit_is_refused():
    """Edited arguments that do not fit the tool are refused (the request stays pending);
    fitting ones are what the node's call runs with, recorded as edited."""
    ledger = Ledger()
    run = agenttx.start_plan(_plan(), tools=_tools(ledger), initial=INITIAL)
    _until(lambda: bool(run.pending_approvals()))
    (request,) = run.pending_approvals()
    with pytest.raises(agenttx.InvalidArgument, match="do not fit tool `charge`"):
        run.approve(request.id, actor="alice", arguments={"customer_id": "c-1", "amount": "x"})
    assert [r.id for r in run.pending_approvals()] == [request.id]
    approval = run.approve(
        request.id, actor="alice", arguments={"customer_id": "c-1", "amount": 99}
    )
    assert approval.edited
    result = run.wait(10)
    assert result.status is PlanStatus.SUCCEEDED
    assert ("charge", 99) in ledger.calls
    assert ("charge", 4200) not in ledger.calls
    consumed = [e for e in result.audit if e.kind.name == "APPROVAL_CONSUMED"]
    assert [e.data["edited"] for e in consumed] == [True]


def test_an_interrupt_in_an_approved_call_ends_the_run_and_wait_raises_it():
    """KeyboardInterrupt from a tool that needed approval: the run ends CANCELLED, the
    completed node is compensated, and `wait` re-raises the interrupt."""
    undone: list[str] = []

    @agenttx.compensation(name="forget")
    def forget(payload: dict) -> None:
        undone.append(payload["output"]["customer_id"])

    @agenttx.tool(compensate=forget)
    def lookup(email: str) -> dict:
        return {"customer_id": "c-" + email}

    @agenttx.tool(needs_approval=True)
    def charge(customer_id: str, amount: int) -> dict:
        raise KeyboardInterrupt

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("lookup", tool="lookup", inputs={"email": "ada"}),
            agenttx.Node(
                "charge",
                tool="charge",
                inputs={"customer_id": "${lookup.customer_id}", "amount": 1},
            ),
        ]
    )
    run = agenttx.start_plan(plan, tools=[lookup, charge, forget], initial={})
    _until(lambda: bool(run.pending_approvals()))
    run.approve(run.pending_approvals()[0].id, actor="alice")
    with pytest.raises(KeyboardInterrupt):
        run.wait(10)
    assert run.status is PlanStatus.CANCELLED
    assert undone == ["c-ada"]


@pytest.mark.timeout(60)
def test_an_approved_call_abandoned_when_a_sibling_fails_is_refunded_once_it_lands():
    """An approved charge (its own context, from the gate) still runs when a sibling's failure
    cancels its node: its undos, registered and declared, run once it has returned."""
    go = threading.Event()
    charging = threading.Event()
    refunds: list[object] = []

    @agenttx.compensation
    def refund(payload):
        refunds.append(payload)

    @agenttx.tool(needs_approval=True, compensate=refund)
    def charge(ctx: agenttx.ToolContext, amount: int) -> dict:
        ctx.register_undo("refund", {"registered": amount})
        charging.set()
        go.wait(30)
        return {"charge_id": "ch-1"}

    @agenttx.tool
    def doomed(amount: int) -> dict:
        charging.wait(30)
        raise agenttx.ToolError("the card was declined", transient=False)

    def hook(event: agenttx.Event) -> None:
        if event.kind is agenttx.EventKind.CANCELLED and event.node == "charge":
            go.set()

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("charge", tool="charge", inputs={"amount": 5}, timeout=30),
            agenttx.Node("doomed", tool="doomed", inputs={"amount": 5}),
        ]
    )
    run = agenttx.start_plan(
        plan, tools=[charge, refund, doomed], initial={}, on_failure="cancel_all", hooks=[hook]
    )
    _until(lambda: bool(run.pending_approvals()))
    (request,) = run.pending_approvals()
    run.approve(request.id, actor="alice")
    result = run.wait(30)
    assert result.status is PlanStatus.FAILED
    assert sorted(map(str, refunds)) == sorted(
        map(str, [{"registered": 5}, {"arguments": {"amount": 5}, "output": {"charge_id": "ch-1"}}])
    )
    kinds = [e.kind for e in result.audit if e.node == "charge"]
    assert agenttx.EventKind.LATE_RESULT_REFUSED in kinds
    assert kinds.count(agenttx.EventKind.COMPENSATED) == 2
