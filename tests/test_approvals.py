"""Approvals bound to the exact call, status checks for unknown outcomes, and human review."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import agenttx
from agenttx import CheckResult, RollbackStrategy, StepStatus
from agenttx._approvals import Requests, call_digest, requests_for
from agenttx.stores import MemoryStore, PostgresStore, SQLiteStore


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request, tmp_path):
    """Each test runs on a MemoryStore, a SQLiteStore and a PostgresStore."""
    if request.param == "memory":
        yield MemoryStore()
        return
    if request.param == "postgres":
        dsn, schema = request.getfixturevalue("pg_schema")
        with PostgresStore(dsn, schema=schema) as postgres:
            yield postgres
        return
    with SQLiteStore(tmp_path / "approvals.db") as sqlite:
        yield sqlite


class Card:
    """A fake payment provider: charges by idempotency key, counting real charges."""

    def __init__(self) -> None:
        self.charges: list[tuple[int, str]] = []
        self.keys: list[str] = []
        self.lock = threading.Lock()

    def charge(self, amount: int, key: str) -> dict:
        with self.lock:
            self.keys.append(key)
            if any(k == key for _, k in self.charges):
                return {"charge_id": f"ch_{key[:8]}", "amount": amount, "replayed": True}
            self.charges.append((amount, key))
        return {"charge_id": f"ch_{key[:8]}", "amount": amount}


def _charge_tool(card: Card, **options):
    @agenttx.tool(name="charge", **options)
    def charge(ctx: agenttx.ToolContext, amount: int, card_number: str) -> dict:
        """Charge a card.

        Args:
            amount: pence
            card_number: the card
        """
        return card.charge(amount, ctx.idempotency_key)

    return charge


def _tx(store, *tools, **settings):
    return agenttx.Transaction(tools=list(tools), store=store, **settings)


ARGS = {"amount": 500, "card_number": "4242"}


# ------------------------------------------------------------ approvals


def test_an_unapproved_call_does_not_run_and_the_step_waits(store):
    """A call needing approval returns NEEDS_APPROVAL with the exact request; nothing runs."""
    card = Card()
    tx = _tx(store, _charge_tool(card, needs_approval=True))
    result = tx.call("charge", ARGS)
    assert result.status is StepStatus.NEEDS_APPROVAL
    assert not result.ok
    assert card.charges == []
    request = result.approval
    assert request is not None
    assert (request.tool, request.arguments, request.step) == ("charge", ARGS, 1)
    assert request.digest == call_digest("charge", ARGS)
    assert request.scope == "transaction"
    assert request.scope_id == tx.id
    assert request.requested_at.tzinfo is not None
    assert result.next_step_id == 1 == tx.next_step_id
    assert tx.status is agenttx.TxStatus.ACTIVE
    payload = result.for_model()
    assert payload["awaiting"] == "approval"
    assert request.id in payload["error"]
    assert "approve" in payload["instruction"]


def test_sending_the_call_again_before_a_decision_reuses_the_request(store):
    """Re-sending a waiting call gives the same request; only one is pending."""
    tx = _tx(store, _charge_tool(Card(), needs_approval=True))
    first = tx.call("charge", ARGS)
    second = tx.call("charge", ARGS)
    assert second.approval.id == first.approval.id
    assert [r.id for r in tx.pending_approvals()] == [first.approval.id]
    assert [r.id for r in requests_for(store).pending_approvals()] == [first.approval.id]


def test_an_approved_call_runs_exactly_once(store):
    """After approval the same call runs once; the next identical call needs a new approval."""
    card = Card()
    tx = _tx(store, _charge_tool(card, needs_approval=True))
    request = tx.call("charge", ARGS).approval
    approval = tx.approve(request.id, actor="alice", note="ok for the demo")
    assert (approval.actor, approval.note, approval.edited) == ("alice", "ok for the demo", False)
    assert approval.expires_at is None
    ran = tx.call("charge", ARGS)
    assert ran.status is StepStatus.SUCCESS
    assert len(card.charges) == 1
    again = tx.call("charge", ARGS)
    assert again.status is StepStatus.NEEDS_APPROVAL
    assert again.approval.id != request.id
    assert len(card.charges) == 1
    with pytest.raises(agenttx.ApprovalConsumed) as caught:
        tx.approve(request.id, actor="bob")
    assert caught.value.code == "approval_consumed"
    assert caught.value.request_id == request.id


def test_changed_arguments_need_their_own_approval(store):
    """An approval covers one digest: other arguments wait for their own approval."""
    card = Card()
    tx = _tx(store, _charge_tool(card, needs_approval=True))
    request = tx.call("charge", ARGS).approval
    tx.approve(request.id, actor="alice")
    other = tx.call("charge", {**ARGS, "amount": 501})
    assert other.status is StepStatus.NEEDS_APPROVAL
    assert other.approval.id != request.id
    assert card.charges == []
    # While the other request waits, its step is blocked for any other call: a mistake.
    blocked = tx.call("charge", ARGS)
    assert blocked.status is StepStatus.ROLLBACK_TRIGGERED
    assert blocked.strategy is RollbackStrategy.RESEND
    assert other.approval.id in blocked.hint.text or "waits for" in blocked.hint.text
    assert card.charges == []
    tx.reject(other.approval.id, actor="alice", reason="wrong amount")
    assert tx.call("charge", ARGS).ok  # the approved one still runs
    assert card.charges[0][0] == 500


def test_needs_approval_can_decide_from_the_arguments(store):
    """A callable rule asks only above a threshold; a rule that raises asks (safe default)."""
    card = Card()

    def above_100(arguments):
        if arguments["amount"] == 13:
            raise RuntimeError("unlucky")
        return arguments["amount"] > 100

    tx = _tx(store, _charge_tool(card, needs_approval=above_100))
    assert tx.call("charge", {**ARGS, "amount": 50}).ok
    assert tx.call("charge", ARGS).status is StepStatus.NEEDS_APPROVAL
    tx.reject(tx.pending_approvals()[0].id, actor="alice", reason="not now")
    assert tx.call("charge", {**ARGS, "amount": 13}).status is StepStatus.NEEDS_APPROVAL
    assert [amount for amount, _ in card.charges] == [50]


def test_an_expired_approval_is_refused(store):
    """An approval past its expiry does not run the call: a new request is made."""
    card = Card()
    tx = _tx(store, _charge_tool(card, needs_approval=True))
    request = tx.call("charge", ARGS).approval
    approval = tx.approve(request.id, actor="alice", expires_in=0.05)
    assert approval.expires_at is not None
    time.sleep(0.1)
    result = tx.call("charge", ARGS)
    assert result.status is StepStatus.NEEDS_APPROVAL
    assert result.approval.id != request.id
    assert card.charges == []
    with pytest.raises(agenttx.ApprovalExpired):
        tx.approve(request.id, actor="alice")


def test_a_rejection_fails_the_step_with_the_reason(store):
    """A rejected call fails with a hint carrying the reason, and nothing is rewound."""
    card = Card()
    tool = _charge_tool(card, needs_approval=True)
    tx = _tx(store, tool, agenttx.tool(lambda: {"ok": True}, name="noop"))
    assert tx.call("noop", {}).ok
    request = tx.call("charge", ARGS).approval
    tx.reject(request.id, actor="bob", reason="card flagged for fraud")
    result = tx.call("charge", ARGS)
    assert result.status is StepStatus.ROLLBACK_TRIGGERED
    assert "card flagged for fraud" in result.hint.text
    assert "bob" in result.hint.text
    assert result.next_step_id == 2  # the same step: the agent changes course
    assert result.voided_steps == ()
    assert card.charges == []
    with pytest.raises(agenttx.ApprovalRejected) as caught:
        tx.approve(request.id, actor="alice")
    assert (caught.value.actor, caught.value.reason) == ("bob", "card flagged for fraud")


def test_an_edited_approval_runs_the_edited_call_and_records_it(store):
    """The approver may change the arguments: the call runs with them, and the step shows it."""
    card = Card()
    tx = _tx(store, _charge_tool(card, needs_approval=True))
    request = tx.call("charge", ARGS).approval
    approval = tx.approve(request.id, actor="alice", arguments={**ARGS, "amount": 90})
    assert approval.edited
    assert approval.arguments == {**ARGS, "amount": 90}
    assert approval.digest == call_digest("charge", approval.arguments)
    result = tx.call("charge", ARGS)
    assert result.ok
    assert card.charges[0][0] == 90
    assert tx.steps[0].arguments == {**ARGS, "amount": 90}


def test_edited_arguments_must_fit_the_tool(store):
    """An edit that breaks the tool's schema is refused, and the request stays pending."""
    tx = _tx(store, _charge_tool(Card(), needs_approval=True))
    request = tx.call("charge", ARGS).approval
    with pytest.raises(agenttx.InvalidArgument, match="do not fit"):
        tx.approve(request.id, actor="alice", arguments={"amount": "lots"})
    assert [r.id for r in tx.pending_approvals()] == [request.id]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"actor": ""}, agenttx.InvalidArgument),
        ({"actor": "   "}, agenttx.InvalidArgument),
        ({"actor": 3}, agenttx.InvalidArgument),
        ({"actor": "a", "expires_in": -1}, agenttx.InvalidArgument),
        ({"actor": "a", "expires_in": float("nan")}, agenttx.InvalidArgument),
        ({"actor": "a", "note": 5}, agenttx.InvalidArgument),
        ({"actor": "a", "arguments": [1]}, agenttx.InvalidArgument),
    ],
)
def test_bad_decisions_are_refused_and_change_nothing(store, kwargs, error):
    """An empty actor, a bad expiry, note or edit raises a typed error; the request waits."""
    tx = _tx(store, _charge_tool(Card(), needs_approval=True))
    request = tx.call("charge", ARGS).approval
    with pytest.raises(error):
        tx.approve(request.id, **kwargs)
    assert [r.id for r in tx.pending_approvals()] == [request.id]


def test_unknown_and_foreign_requests_are_not_found(store):
    """Approving an unknown id, or another transaction's request, raises ApprovalNotFound."""
    tool = _charge_tool(Card(), needs_approval=True)
    tx, other = _tx(store, tool), _tx(store, tool)
    request = tx.call("charge", ARGS).approval
    with pytest.raises(agenttx.ApprovalNotFound) as caught:
        tx.approve("apr-nope", actor="alice")
    assert isinstance(caught.value, LookupError)
    assert caught.value.code == "approval_not_found"
    with pytest.raises(agenttx.ApprovalNotFound):
        other.approve(request.id, actor="alice")
    with pytest.raises(agenttx.ApprovalNotFound):
        other.reject(request.id, actor="alice", reason="no")
    with pytest.raises(agenttx.InvalidArgument):
        tx.approve("", actor="alice")


def test_deciding_twice_is_refused(store):
    """An approved request cannot be approved or rejected again; a rejection needs a reason."""
    tx = _tx(store, _charge_tool(Card(), needs_approval=True))
    request = tx.call("charge", ARGS).approval
    with pytest.raises(agenttx.InvalidArgument, match="reason"):
        tx.reject(request.id, actor="bob", reason=" ")
    tx.approve(request.id, actor="alice")
    with pytest.raises(agenttx.ApprovalError, match="approved already") as caught:
        tx.approve(request.id, actor="alice")
    assert type(caught.value) is agenttx.ApprovalError
    with pytest.raises(agenttx.ApprovalError):
        tx.reject(request.id, actor="bob", reason="too late")


def test_an_approval_is_consumed_once_under_a_race(store):
    """Two books racing to consume one approval: exactly one wins."""
    tx = _tx(store, _charge_tool(Card(), needs_approval=True))
    request = tx.call("charge", ARGS).approval
    tx.approve(request.id, actor="alice")
    book = requests_for(store)
    row = book.get(request.id)
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def consume() -> None:
        barrier.wait()
        results.append(book.consume(row, step=1, key="k"))

    threads = [threading.Thread(target=consume) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 7 + [True]


def test_async_steps_wait_for_approval_too(store):
    """`acall` of a tool needing approval waits, and runs once approved."""
    import asyncio  # noqa: PLC0415

    card = Card()
    tx = _tx(store, _charge_tool(card, needs_approval=True))

    async def main() -> None:
        waiting = await tx.acall("charge", ARGS)
        assert waiting.status is StepStatus.NEEDS_APPROVAL
        tx.approve(waiting.approval.id, actor="alice")
        assert (await tx.acall("charge", ARGS)).ok

    asyncio.run(main())
    assert len(card.charges) == 1


def test_a_tool_rejects_bad_options_at_decoration():
    """needs_approval=, check= and on_unknown= are checked when the tool is declared."""
    with pytest.raises(agenttx.InvalidArgument, match="needs_approval"):
        agenttx.tool(lambda: None, name="a", needs_approval="yes")
    with pytest.raises(agenttx.InvalidArgument, match="check"):
        agenttx.tool(lambda: None, name="b", check=3)
    with pytest.raises(agenttx.InvalidArgument, match="on_unknown"):
        agenttx.tool(lambda: None, name="c", on_unknown="shrug")
    plain = agenttx.tool(lambda: None, name="d")
    assert not plain.guarded
    assert plain.on_unknown == "retry"
    checked = agenttx.tool(lambda: None, name="e", check=lambda a, k: CheckResult.not_done())
    assert checked.guarded
    assert checked.on_unknown == "review"
    assert checked.renamed("f").check is checked.check


# ------------------------------------------------------------ engines and durability


def test_an_engine_decides_requests_found_by_id(tmp_path):
    """A second engine on the same file lists and approves; the first transaction goes on."""
    card = Card()
    tool = _charge_tool(card, needs_approval=True)
    path = tmp_path / "shared.db"
    with SQLiteStore(path) as one, SQLiteStore(path) as two:
        asking = agenttx.Engine(tools=[tool], store=one)
        deciding = agenttx.Engine(tools=[tool], store=two)
        tx = asking.begin(agent_id="agent")
        request = tx.call("charge", ARGS).approval
        assert [r.id for r in deciding.pending_approvals()] == [request.id]
        deciding.approve(request.id, actor="alice", expires_in=60)
        assert deciding.pending_approvals() == ()
        assert tx.call("charge", ARGS).ok
        assert len(card.charges) == 1
        with pytest.raises(agenttx.ApprovalConsumed):
            deciding.approve(request.id, actor="alice")
        with pytest.raises(agenttx.ApprovalNotFound):
            deciding.reject("apr-missing", actor="alice", reason="no")


def test_an_approval_given_after_a_restart_lets_the_resumed_transaction_go_on(tmp_path):
    """Requests survive the process: approve after a restart, resume, and the call runs once."""
    card = Card()
    tool = _charge_tool(card, needs_approval=True)
    path = tmp_path / "restart.db"
    store = SQLiteStore(path)
    engine = agenttx.Engine(tools=[tool], store=store)
    tx = engine.begin(agent_id="agent")
    assert tx.call("charge", ARGS).status is StepStatus.NEEDS_APPROVAL
    tx_id = tx.id
    store.close()  # the process is gone; nothing was committed

    with SQLiteStore(path) as reopened:
        engine = agenttx.Engine(tools=[tool], store=reopened)
        report = engine.recover("resume")
        assert tx_id in report.resumed
        (request,) = engine.pending_approvals()
        assert request.scope_id == tx_id
        engine.approve(request.id, actor="alice")
        resumed = engine.get(tx_id)
        assert resumed.call("charge", ARGS).ok
        assert resumed.commit().steps_committed == 1
    assert len(card.charges) == 1


# ------------------------------------------------------------ fenced by the lease


def _take_plan_away(store, run_id: str) -> None:
    """Make plan run `run_id` another store's, as a takeover does, behind `store`'s back."""
    if isinstance(store, PostgresStore):
        import psycopg  # noqa: PLC0415

        with psycopg.connect(os.environ["AGENTTX_POSTGRES_DSN"], autocommit=True) as conn:
            conn.execute(
                f"UPDATE {store.schema}.plan_runs SET owner = 'thief', epoch = epoch + 1000 "
                "WHERE run_id = %s",
                (run_id,),
            )
        return
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE plan_runs SET owner = 'thief' WHERE run_id = ?", (run_id,))


def test_a_worker_that_lost_its_transaction_never_starts_the_approved_call(durable_backend):
    """Consuming an approval is fenced by the transaction's lease in the same database
    transaction: once another store has taken the transaction over, the old worker's call
    raises StorageError, the tool does not run and the approval is still there to consume."""
    card = Card()
    tool = _charge_tool(card, needs_approval=True)
    tx = _tx(durable_backend(), tool)
    request = tx.call("charge", ARGS).approval
    tx.approve(request.id, actor="alice")
    thief = durable_backend()
    thief.load(tx.id)
    with pytest.raises(agenttx.StorageError):
        tx.call("charge", ARGS)
    assert card.charges == []
    assert requests_for(thief).get(request.id).state == "approved"


def test_the_fence_alone_refuses_the_consumption(durable_backend):
    """The same compare-and-set succeeds unfenced: it is the lease check that refuses it, and
    a refused consumption changes nothing."""
    store = durable_backend()
    tx = _tx(store, _charge_tool(Card(), needs_approval=True))
    request = tx.call("charge", ARGS).approval
    tx.approve(request.id, actor="alice")
    book = requests_for(store)
    durable_backend().load(tx.id)
    row = book.get(request.id)
    with pytest.raises(agenttx.StorageError):
        book.consume(row, step=1, key="k", fence=True)
    assert book.get(request.id) == row
    assert book.consume(row, step=1, key="k")
    assert book.get(request.id).state == "consumed"


def test_a_call_whose_outcome_matters_is_not_started_by_a_worker_that_lost_it(durable_backend):
    """The durable start record of an `on_unknown="review"` call is fenced the same way: no
    row is written and the tool does not run."""
    card = Card()
    tx = _tx(durable_backend(), _charge_tool(card, on_unknown="review"))
    assert tx.call("charge", {"amount": 1, "card_number": "1"}).ok
    thief = durable_backend()
    thief.load(tx.id)
    with pytest.raises(agenttx.StorageError):
        tx.call("charge", ARGS)
    assert len(card.charges) == 1
    assert [row.kind for row in requests_for(thief).of_scope(tx.id)] == ["call"]


def test_a_plan_run_lost_to_another_worker_cannot_consume_its_approval(durable_backend):
    """For a plan run the fence is the run's lease (or owner): held, the consumption goes
    through; taken over, StorageError and nothing changes; a run never held is refused."""
    store = durable_backend()
    book = requests_for(store)
    store.begin_plan("run-1", "{}", [])
    rows = []
    for _ in range(2):
        request = book.request(
            scope="plan",
            scope_id="run-1",
            node="pay",
            tool="charge",
            arguments=ARGS,
            digest=call_digest("charge", ARGS),
            plan_version="v1",
        )
        book.approve(request.id, actor="alice")
        rows.append(book.get(request.id))
    assert book.consume(rows[0], step=None, key="k0", node="pay", fence=True)
    _take_plan_away(store, "run-1")
    with pytest.raises(agenttx.StorageError):
        book.consume(rows[1], step=None, key="k1", node="pay", fence=True)
    assert book.get(rows[1].id).state == "approved"
    with pytest.raises(agenttx.StorageError, match="not held by this store"):
        store.set_request_state(
            rows[1].id, ("approved",), "consumed", decision=None, now=1.0, fence="never-held"
        )
    assert book.get(rows[1].id).state == "approved"


# ------------------------------------------------------------ outcome unknown and review


def _slow_charge(card: Card, release: threading.Event, **options):
    @agenttx.tool(name="charge", **options)
    def charge(ctx: agenttx.ToolContext, amount: int, card_number: str) -> dict:
        """Charge a card, slowly (the provider answers late)."""
        output = card.charge(amount, ctx.idempotency_key)
        release.wait(5)
        return output

    return charge


@pytest.fixture
def release():
    """Lets the slow tools of a test finish when it ends."""
    event = threading.Event()
    yield event
    event.set()


def _release_when_unknown(release: threading.Event):
    """A hook that lets a slow tool return as soon as its outcome is found unknown: the status
    check is asked only once the call has returned, so the tests that want it asked return."""

    def hook(event: agenttx.Event) -> None:
        if event.kind is agenttx.EventKind.OUTCOME_UNKNOWN:
            release.set()

    return hook


def _status(card: Card):
    def check(arguments, key):
        for amount, charged_key in card.charges:
            if charged_key == key:
                return CheckResult.done({"charge_id": f"ch_{key[:8]}", "amount": amount})
        return CheckResult.not_done()

    return check


def test_a_timed_out_charge_with_a_status_check_is_not_charged_twice(store, release):
    """The check finds the charge: the step succeeds with its output, nothing runs again."""
    card = Card()
    tool = _slow_charge(card, release, check=_status(card))
    tx = _tx(store, tool, step_timeout=0.2, hooks=[_release_when_unknown(release)])
    result = tx.call("charge", ARGS)
    assert result.status is StepStatus.SUCCESS
    assert result.output["amount"] == 500
    assert len(card.charges) == 1
    assert len(card.keys) == 1
    assert tx.commit().steps_committed == 1


def test_a_not_done_check_retries_with_the_same_key(store, release):
    """A check saying not done runs the call again with the same idempotency key."""
    card = Card()
    attempts: list[str] = []

    @agenttx.tool(name="charge", check=lambda arguments, key: CheckResult.not_done())
    def charge(ctx: agenttx.ToolContext, amount: int, card_number: str) -> dict:
        """Charge a card: the first attempt hangs before charging."""
        attempts.append(ctx.idempotency_key)
        if len(attempts) == 1:
            release.wait(5)
            return {}
        return card.charge(amount, ctx.idempotency_key)

    tx = _tx(store, charge, step_timeout=0.2, hooks=[_release_when_unknown(release)])
    result = tx.call("charge", ARGS)
    assert result.ok
    assert len(attempts) == 2
    assert attempts[0] == attempts[1]
    assert len(card.charges) == 1


def test_a_timed_out_charge_without_a_check_goes_to_review(store, release):
    """No check: NEEDS_REVIEW with the evidence; the transaction waits on that step."""
    card = Card()
    tool = _slow_charge(card, release, on_unknown="review")
    tx = _tx(store, tool, step_timeout=0.2, hooks=[_release_when_unknown(release)])
    result = tx.call("charge", ARGS)
    assert result.status is StepStatus.NEEDS_REVIEW
    review = result.review
    assert review is not None
    assert (review.tool, review.arguments, review.step) == ("charge", ARGS, 1)
    assert review.idempotency_key == card.keys[0]
    assert any("timed out" in error for error in review.errors)
    assert any("no status check" in error for error in review.errors)
    assert review.timings["timeout_s"] == 0.2
    assert result.next_step_id == 1
    assert result.for_model()["awaiting"] == "review"
    assert [r.id for r in tx.pending_reviews()] == [review.id]
    assert [r.id for r in requests_for(store).pending_reviews()] == [review.id]
    again = tx.call("charge", ARGS)  # still waiting: the same review, the tool not run
    assert again.review.id == review.id
    assert len(card.keys) == 1


def test_a_review_resolved_done_records_the_output_without_running(store, release):
    """resolve_review(done) then re-sending: the step succeeds with the reviewer's output."""
    card = Card()
    tx = _tx(store, _slow_charge(card, release, on_unknown="review"), step_timeout=0.2)
    review = tx.call("charge", ARGS).review
    tx.resolve_review(review.id, outcome="done", output={"charge_id": "ch_x"}, actor="ops")
    release.set()  # the step waits until the late call has returned
    result = tx.call("charge", ARGS)
    assert result.ok
    assert result.output == {"charge_id": "ch_x"}
    assert len(card.keys) == 1
    with pytest.raises(agenttx.ReviewNotFound) as caught:
        tx.resolve_review(review.id, outcome="done", actor="ops")
    assert caught.value.resolved


def test_a_review_resolved_not_done_retries_with_the_same_key(store, release):
    """resolve_review(not_done) then re-sending: the tool runs again with the same key."""
    card = Card()
    tx = _tx(store, _slow_charge(card, release, on_unknown="review"), step_timeout=0.2)
    review = tx.call("charge", ARGS).review
    release.set()
    tx.resolve_review(review.id, outcome="not_done", actor="ops")
    result = tx.call("charge", ARGS)
    assert result.ok
    assert card.keys == [review.idempotency_key, review.idempotency_key]
    assert len(card.charges) == 1  # the provider deduplicated by key


@pytest.mark.parametrize("kind", ["raises", "hangs", "returns junk", "unknown"])
def test_a_failing_check_is_kept_as_evidence_and_goes_to_review(store, release, kind):
    """A check that raises, hangs, returns junk or cannot tell sends the call to review."""

    def check(arguments, key):
        if kind == "raises":
            raise ConnectionError("provider down")
        if kind == "hangs":
            release.wait(5)
        if kind == "returns junk":
            return "done"
        return CheckResult.unknown("no record yet")

    card = Card()
    returned = threading.Event()
    tool = _slow_charge(card, returned, check=check)
    tx = _tx(store, tool, step_timeout=0.2, hooks=[_release_when_unknown(returned)])
    result = tx.call("charge", ARGS)
    assert result.status is StepStatus.NEEDS_REVIEW
    evidence = " | ".join(result.review.errors)
    expected = {
        "raises": "ConnectionError: provider down",
        "hangs": "did not answer within",
        "returns junk": "not a CheckResult",
        "unknown": "no record yet",
    }[kind]
    assert expected in evidence


def test_bad_review_resolutions_are_refused(store, release):
    """Another outcome, an empty actor, a non-JSON output or an unknown id raise."""
    tx = _tx(store, _slow_charge(Card(), release, on_unknown="review"), step_timeout=0.2)
    review = tx.call("charge", ARGS).review
    with pytest.raises(agenttx.InvalidArgument):
        tx.resolve_review(review.id, outcome="maybe", actor="ops")
    with pytest.raises(agenttx.InvalidArgument):
        tx.resolve_review(review.id, outcome="done", actor="")
    with pytest.raises(agenttx.InvalidArgument):
        tx.resolve_review(review.id, outcome="done", output=object(), actor="ops")
    with pytest.raises(agenttx.ReviewNotFound):
        tx.resolve_review("rev-nope", outcome="done", actor="ops")
    assert [r.id for r in tx.pending_reviews()] == [review.id]


def test_an_approved_call_interrupted_while_running_is_checked_not_rerun(store):
    """An approved call cut short (its outcome never recorded) is checked when sent again."""
    card = Card()
    interrupt = [True]

    @agenttx.tool(name="charge", needs_approval=True, check=_status(card), inline=True)
    def charge(ctx: agenttx.ToolContext, amount: int, card_number: str) -> dict:
        """Charge a card; the first time, the process is interrupted right after."""
        output = card.charge(amount, ctx.idempotency_key)
        if interrupt.pop() if interrupt else False:
            raise KeyboardInterrupt
        return output

    tx = _tx(store, charge)
    request = tx.call("charge", ARGS).approval
    tx.approve(request.id, actor="alice")
    with pytest.raises(KeyboardInterrupt):
        tx.call("charge", ARGS)
    result = tx.call("charge", ARGS)
    assert result.ok
    assert result.output["amount"] == 500
    assert len(card.charges) == 1
    assert len(card.keys) == 1  # the tool did not run again


def _cut_off_charge(card: Card, **options):
    """A charge whose first call is cut off (KeyboardInterrupt) after the card was charged."""
    interrupt = [True]

    @agenttx.tool(name="charge", inline=True, **options)
    def charge(ctx: agenttx.ToolContext, amount: int, card_number: str) -> dict:
        output = card.charge(amount, ctx.idempotency_key)
        if interrupt:
            interrupt.pop()
            raise KeyboardInterrupt
        return output

    return charge


def _cut_off_then_recovered(durable_backend, tool) -> tuple[agenttx.Engine, str]:
    """Begin in one engine, cut the call off, close that engine; recover in another."""
    first = agenttx.Engine(tools=[tool], store=durable_backend())
    tx = first.begin()
    if tool.needs_approval is True:
        tx.approve(tx.call("charge", ARGS).approval.id, actor="alice")
    with pytest.raises(KeyboardInterrupt):
        tx.call("charge", ARGS)
    first.close()
    engine = agenttx.Engine(tools=[tool], store=durable_backend())
    assert engine.pending_reviews() == ()
    assert engine.recover("resume").resumed == (tx.id,)
    return engine, tx.id


@pytest.mark.parametrize(
    ("options", "evidence"),
    [
        ({"needs_approval": True}, "the tool has no status check"),
        ({"on_unknown": "review"}, "the tool has no status check"),
        (
            {"check": lambda arguments, key: CheckResult.unknown("the bank is down")},
            "the status check cannot tell: the bank is down",
        ),
    ],
    ids=["approval", "on_unknown", "check_unknown"],
)
def test_a_call_cut_off_by_a_crash_is_under_review_right_after_recovery(
    durable_backend, options, evidence
):
    """Recovery opens the review of a call cut off after its approval was consumed (or its
    start recorded) at once, with the evidence a re-sent call gets; the re-sent call waits on
    that same review, and once it is resolved goes on without running the tool again."""
    card = Card()
    engine, tx_id = _cut_off_then_recovered(durable_backend, _cut_off_charge(card, **options))
    (review,) = engine.pending_reviews()
    assert (review.scope_id, review.step, review.tool, review.arguments) == (
        tx_id,
        1,
        "charge",
        ARGS,
    )
    assert review.idempotency_key == card.keys[0]
    assert review.errors[0].startswith("the call started (its approval was consumed)")
    assert review.errors[1:] == (evidence,)
    tx = engine.get(tx_id)
    assert [event.kind.name for event in tx.audit()][-2:] == ["OUTCOME_UNKNOWN", "REVIEW_REQUESTED"]
    waiting = tx.call("charge", ARGS)
    assert waiting.status is StepStatus.NEEDS_REVIEW
    assert waiting.review == review
    assert engine.pending_reviews() == (review,)  # the same one, not a second
    engine.resolve_review(review.id, outcome="done", output={"charge_id": "x"}, actor="ops")
    assert tx.call("charge", ARGS).output == {"charge_id": "x"}
    assert len(card.keys) == 1  # the tool ran once, before the crash
    assert tx.commit().steps_committed == 1


def test_a_cut_off_call_whose_check_tells_opens_no_review_at_recovery(durable_backend):
    """A status check that says the call was done opens no review: the re-sent call is
    checked again and records the check's output, without running the tool."""
    card = Card()
    tool = _cut_off_charge(card, check=_status(card))
    engine, tx_id = _cut_off_then_recovered(durable_backend, tool)
    assert engine.pending_reviews() == ()
    result = engine.get(tx_id).call("charge", ARGS)
    assert result.ok
    assert result.output == {"charge_id": f"ch_{card.keys[0][:8]}", "amount": 500}
    assert len(card.keys) == 1


def test_requests_reject_a_duplicate_id():
    """A book refuses a second request with an id it has."""
    book = Requests(requests_for(MemoryStore())._table)
    request = book.request(
        scope="transaction", scope_id="t", tool="x", arguments={}, digest="d", step=1
    )
    row = book.get(request.id)
    with pytest.raises(agenttx.InvalidArgument, match="exists"):
        book._table.add_request(row)


def test_approvals_and_reviews_are_in_the_audit_trail(store, release):
    """Requested, approved (with the actor), consumed, unknown, review requested, reviewed."""
    card = Card()
    seen: list[agenttx.Event] = []
    tool = _slow_charge(card, release, needs_approval=True)
    tx = agenttx.Transaction(tools=[tool], store=store, step_timeout=0.2, hooks=[seen.append])
    request = tx.call("charge", ARGS).approval
    tx.approve(request.id, actor="alice", expires_in=60)
    review = tx.call("charge", ARGS).review
    tx.resolve_review(review.id, outcome="done", output={"charge_id": "c"}, actor="ops")
    release.set()  # the late call returns: the step is no longer blocked by it
    assert tx.call("charge", ARGS).ok
    kinds = [event.kind.name for event in tx.audit()]
    assert kinds[:4] == ["APPROVAL_REQUESTED", "APPROVED", "APPROVAL_CONSUMED", "STEP_DISPATCHED"]
    assert kinds[4:] == ["OUTCOME_UNKNOWN", "REVIEW_REQUESTED", "REVIEWED", "STEP_COMPLETED"]
    actors = {event.kind.name: event.actor for event in tx.audit()}
    assert actors["APPROVED"] == actors["APPROVAL_CONSUMED"] == "alice"
    assert actors["REVIEWED"] == "ops"
    assert [event.kind for event in seen] == [event.kind for event in tx.audit()]


# ------------------------------------------------------------ SIGKILL: exactly once

WORKER = Path(__file__).resolve().parent / "_approval_worker.py"


def _worker(phase: str, db: Path, root: Path, *flags: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(WORKER.parent.parent)}
    return subprocess.Popen(
        [sys.executable, str(WORKER), phase, str(db), str(root), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(process: subprocess.Popen[str]) -> dict:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _kill_once_charged(running: subprocess.Popen[str], charges: Path) -> None:
    """SIGKILL worker `running` as soon as its charge is in the `charges` log."""
    deadline = time.monotonic() + 60
    while not (charges.exists() and charges.read_text().strip()):
        assert running.poll() is None, running.communicate()
        assert time.monotonic() < deadline, "the worker never charged"
        time.sleep(0.02)
    running.send_signal(signal.SIGKILL)
    running.communicate(timeout=60)
    assert running.returncode == -signal.SIGKILL


def _killed_while_charging(tmp_path: Path, *flags: str) -> tuple[Path, dict]:
    """Ask, approve from this process, run in a worker killed once the charge happened."""
    db = tmp_path / "crash.db"
    asked = _finish(_worker("ask", db, tmp_path, *flags))
    with SQLiteStore(db) as store:
        (pending,) = agenttx.Engine(store=store).pending_approvals()
        assert pending.id == asked["request"]
        agenttx.Engine(store=store).approve(asked["request"], actor="alice")
    running = _worker("run", db, tmp_path, *flags)
    charges = tmp_path / "charges.log"
    _kill_once_charged(running, charges)
    return db, asked


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_an_approved_call_runs_exactly_once_across_a_sigkill_and_resume(tmp_path):
    """Killed after the approved charge happened: the resumed call is checked, not re-run."""
    db, _ = _killed_while_charging(tmp_path)
    resumed = _finish(_worker("resume", db, tmp_path))
    assert resumed["status"] == "SUCCESS"
    assert resumed["output"]["checked"] is True  # the status check's output, not a new charge
    assert resumed["committed"] == 1
    lines = (tmp_path / "charges.log").read_text().splitlines()
    assert len(lines) == 1


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_checked_call_killed_while_running_is_checked_not_rerun(tmp_path):
    """A call needing no approval, with a status check, killed while running: its start was
    recorded, so the resumed transaction checks it instead of running it again."""
    db = tmp_path / "direct.db"
    running = _worker("begin-run", db, tmp_path, "--no-approval")
    charges = tmp_path / "charges.log"
    _kill_once_charged(running, charges)
    resumed = _finish(_worker("resume", db, tmp_path, "--no-approval"))
    assert resumed["status"] == "SUCCESS"
    assert resumed["output"]["checked"] is True
    assert len(charges.read_text().splitlines()) == 1


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_killed_approved_call_without_a_check_goes_to_review_then_on(tmp_path):
    """Without a check the resumed call waits for review; resolved done, it goes on, once."""
    db, asked = _killed_while_charging(tmp_path, "--no-check")
    waiting = _finish(_worker("resume", db, tmp_path, "--no-check"))
    assert waiting["status"] == "NEEDS_REVIEW"
    assert any("outcome was never recorded" in error for error in waiting["errors"])
    with SQLiteStore(db) as store:
        engine = agenttx.Engine(store=store)
        (review,) = engine.pending_reviews()
        assert review.id == waiting["review"]
        assert review.scope_id == asked["tx"]
        engine.resolve_review(review.id, outcome="done", output={"charge_id": "x"}, actor="ops")
    resumed = _finish(_worker("resume", db, tmp_path, "--no-check"))
    assert resumed["status"] == "SUCCESS"
    assert resumed["output"] == {"charge_id": "x"}
    assert len((tmp_path / "charges.log").read_text().splitlines()) == 1


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_killed_call_is_under_review_as_soon_as_it_is_recovered(tmp_path):
    """After a SIGKILL mid-call, recovery alone opens the review (listed by every engine on
    the file); the call sent again later waits on that same review."""
    db, asked = _killed_while_charging(tmp_path, "--no-check")
    recovered = _finish(_worker("recover", db, tmp_path, "--no-check"))
    (opened,) = recovered["reviews"]
    assert opened["errors"][1:] == ["the tool has no status check"]
    with SQLiteStore(db) as store:
        (review,) = agenttx.Engine(store=store).pending_reviews()
    assert (review.id, review.scope_id) == (opened["id"], asked["tx"])
    waiting = _finish(_worker("resume", db, tmp_path, "--no-check"))
    assert (waiting["status"], waiting["review"]) == ("NEEDS_REVIEW", review.id)
    with SQLiteStore(db) as store:
        assert [r.id for r in agenttx.Engine(store=store).pending_reviews()] == [review.id]
    assert len((tmp_path / "charges.log").read_text().splitlines()) == 1


def test_ending_a_transaction_withdraws_its_pending_requests(store):
    """Commit (or abort) withdraws what still waits: not listed, and cannot be approved."""
    tx = _tx(store, _charge_tool(Card(), needs_approval=True))
    request = tx.call("charge", ARGS).approval
    engine = agenttx.Engine(store=store)
    assert [r.id for r in engine.pending_approvals()] == [request.id]
    with pytest.raises(agenttx.FailedPrecondition, match="cannot commit"):
        tx.commit()  # a commit would drop the waiting call unrecorded
    tx.rollback()
    assert engine.pending_approvals() == ()
    with pytest.raises(agenttx.ApprovalError, match="withdrawn"):
        engine.approve(request.id, actor="alice")
    aborted = _tx(store, _charge_tool(Card(), needs_approval=True))
    aborted.call("charge", ARGS)
    aborted.rollback()
    assert engine.pending_approvals() == ()


def test_listings_leave_out_requests_of_transactions_that_are_gone(tmp_path):
    """A request of a transaction no longer open in the file (ended elsewhere) is not listed."""
    tool = _charge_tool(Card(), needs_approval=True)
    with SQLiteStore(tmp_path / "gone.db") as store:
        tx = agenttx.Engine(tools=[tool], store=store).begin()
        request = tx.call("charge", ARGS).approval
        engine = agenttx.Engine(store=store)
        assert [r.id for r in engine.pending_approvals()] == [request.id]
        store.discard(tx.id)  # as a recovery in another process would end it
        assert engine.pending_approvals() == ()
        assert [r.id for r in requests_for(store).pending_approvals()] == [request.id]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_an_approved_plan_node_runs_exactly_once_across_a_sigkill_and_resume(tmp_path):
    """A plan node approved after its process died, killed while charging, resumed: the
    status check settles it; one charge."""
    db = tmp_path / "plan.db"
    asked = _finish(_worker("plan-ask", db, tmp_path))
    with SQLiteStore(db) as store:
        engine = agenttx.Engine(store=store)
        (pending,) = engine.pending_approvals()
        assert (pending.id, pending.node, pending.scope) == (asked["request"], "charge", "plan")
        engine.approve(pending.id, actor="alice")
    running = _worker("plan-run", db, tmp_path)
    charges = tmp_path / "charges.log"
    deadline = time.monotonic() + 60
    while not (charges.exists() and charges.read_text().strip()):
        assert running.poll() is None, running.communicate()
        assert time.monotonic() < deadline, "the worker never charged"
        time.sleep(0.02)
    running.send_signal(signal.SIGKILL)
    running.communicate(timeout=60)
    assert running.returncode == -signal.SIGKILL  # killed while its tool ran, not ended
    resumed = _finish(_worker("plan-resume", db, tmp_path))
    assert resumed["resumed"] == ["run-1"]
    assert (resumed["status"], resumed["state"]) == ("SUCCEEDED", "SUCCEEDED")
    assert resumed["output"]["checked"] is True
    assert len(charges.read_text().splitlines()) == 1


def test_a_transaction_waiting_for_a_person_is_not_reaped_as_idle(store):
    """abort_if_idle skips a transaction whose call waits for approval; once done, it is idle."""
    tx = _tx(store, _charge_tool(Card(), needs_approval=True))
    request = tx.call("charge", ARGS).approval
    assert not tx.abort_if_idle(0.0)
    tx.approve(request.id, actor="alice")
    assert not tx.abort_if_idle(0.0)  # approved: the agent has yet to send it again
    assert tx.call("charge", ARGS).ok
    assert tx.abort_if_idle(0.0)
    assert tx.status is agenttx.TxStatus.ROLLED_BACK


def test_an_async_tool_waits_for_approval_and_runs_in_the_callers_task(store):
    """An async tool needing approval runs on the caller's loop once approved."""
    import asyncio  # noqa: PLC0415

    seen: list[object] = []

    @agenttx.tool(name="charge", needs_approval=True)
    async def charge(amount: int, card_number: str) -> dict:
        seen.append(asyncio.get_running_loop())
        return {"amount": amount}

    tx = _tx(store, charge)

    async def main() -> None:
        waiting = await tx.acall("charge", ARGS)
        tx.approve(waiting.approval.id, actor="alice")
        assert (await tx.acall("charge", ARGS)).output == {"amount": 500}
        assert seen == [asyncio.get_running_loop()]

    asyncio.run(main())


def test_the_calls_of_a_turn_after_one_waiting_for_a_person_are_not_run(store):
    """call_turn stops at a call waiting for approval; the rest are NOT_RUN, saying why."""
    card = Card()
    tx = _tx(store, _charge_tool(card, needs_approval=True))
    first, second = tx.call_turn([("charge", ARGS, "c1"), ("charge", {**ARGS, "amount": 1}, "c2")])
    assert first.status is StepStatus.NEEDS_APPROVAL
    assert second.status is StepStatus.NOT_RUN
    assert "waits for a person" in second.hint.text
    assert card.charges == []


def test_the_requests_of_ended_transactions_follow_the_history_retention(tmp_path):
    """SQLite keeps decided requests of ended transactions for keep_history_for, then prunes
    them; those of open transactions stay."""
    tool = _charge_tool(Card(), needs_approval=True)
    path = tmp_path / "retention.db"
    with SQLiteStore(path) as store:
        ended = _tx(store, tool)
        gone = ended.call("charge", ARGS).approval
        ended.rollback()
        still = agenttx.Engine(tools=[tool], store=store).begin()
        kept = still.call("charge", ARGS).approval
    time.sleep(0.05)
    with SQLiteStore(path, keep_history_for=0.01) as store:
        book = requests_for(store)
        assert book.get(gone.id) is None
        assert book.get(kept.id) is not None


# ------------------------------------------------------------ a state machine against a model


class ApprovalMachine(RuleBasedStateMachine):
    """Random sends, approvals and rejections against a model: nothing runs unapproved, and
    each approval runs its call exactly once."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[int] = []

        @agenttx.tool(name="charge", needs_approval=True)
        def charge(amount: int) -> dict:
            self.runs.append(amount)
            return {"amount": amount}

        self.tx = agenttx.Transaction(tools=[charge])
        self.requests: dict[int, list[list[str]]] = {}  # amount -> [[id, state], ...]
        self.consumed = 0
        self.ended = False

    def _newest(self, amount: int) -> list[str] | None:
        made = self.requests.get(amount)
        return made[-1] if made else None

    def _all(self, state: str) -> list[list[str]]:
        return [entry for made in self.requests.values() for entry in made if entry[1] == state]

    @precondition(lambda self: not self.ended)
    @rule(amount=st.integers(1, 3))
    def send(self, amount: int) -> None:
        newest = self._newest(amount)
        result = self.tx.call("charge", {"amount": amount})
        others = (e for a, made in self.requests.items() if a != amount for e in made)
        if any(entry[1] == "pending" for entry in others):  # its step waits for a person
            assert not result.ok
            assert "waits for" in result.hint.text
            self._after_failure(result)
            return
        if newest is None or newest[1] in ("consumed", "withdrawn"):
            assert result.status is StepStatus.NEEDS_APPROVAL
            self.requests.setdefault(amount, []).append([result.approval.id, "pending"])
        elif newest[1] == "pending":
            assert result.status is StepStatus.NEEDS_APPROVAL
            assert result.approval.id == newest[0]
        elif newest[1] == "approved":
            assert result.ok
            assert result.output == {"amount": amount}
            newest[1] = "consumed"
            self.consumed += 1
        else:  # rejected
            assert not result.ok
            assert "too much" in result.hint.text
            self._after_failure(result)

    def _after_failure(self, result: agenttx.StepResult) -> None:
        """A rewind below the failed step withdraws what waited at the steps it dropped."""
        self.ended = result.status is StepStatus.FAILED
        if self.ended or (result.rollback_to_step or 0) < result.step_id:
            for entry in self._all("pending"):
                entry[1] = "withdrawn"

    @precondition(lambda self: any(e[1] == "pending" for m in self.requests.values() for e in m))
    @rule(data=st.data(), reject=st.booleans())
    def decide(self, data: st.DataObject, reject: bool) -> None:
        entry = data.draw(st.sampled_from(self._all("pending")))
        if reject:
            self.tx.reject(entry[0], actor="bob", reason="too much")
            entry[1] = "rejected"
        else:
            self.tx.approve(entry[0], actor="alice")
            entry[1] = "approved"

    @precondition(lambda self: any(e[1] != "pending" for m in self.requests.values() for e in m))
    @rule(data=st.data())
    def decide_again(self, data: st.DataObject) -> None:
        decided = [e for m in self.requests.values() for e in m if e[1] != "pending"]
        entry = data.draw(st.sampled_from(decided))
        with pytest.raises(agenttx.ApprovalError):
            self.tx.approve(entry[0], actor="carol")

    @invariant()
    def each_approval_ran_once_and_nothing_else_ran(self) -> None:
        assert len(self.runs) == self.consumed


TestApprovalMachine = ApprovalMachine.TestCase
TestApprovalMachine.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)


def _keys(value: object) -> object:
    """The keys of every object in `value`, in their order, at every depth."""
    if isinstance(value, dict):
        return [(key, _keys(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [_keys(item) for item in value]
    return None


def test_an_approved_call_gets_its_arguments_in_the_order_given(store):
    """The tool of an approved call gets the arguments in the model's key order, and an
    approver's edit in the approver's order, at every depth, on every store."""
    seen: list[object] = []

    @agenttx.tool(needs_approval=True)
    def ship(order: dict) -> dict:
        seen.append(_keys(order))
        return {"shipped": True}

    tx = _tx(store, ship)
    sent = {"order": {"zip": "N1", "lines": [{"sku": "b", "qty": 2}], "at": {"y": 1, "x": 2}}}
    tx.approve(tx.call("ship", sent).approval.id, actor="alice")
    assert tx.call("ship", sent).ok
    edited = {"order": {"qty": {"n": 1, "m": 2}, "b": 1, "a": 2}}
    request = tx.call("ship", {"order": {"b": 0}}).approval
    approval = tx.approve(request.id, actor="alice", arguments=edited)
    assert _keys(approval.arguments) == _keys(edited)
    assert tx.call("ship", {"order": {"b": 0}}).ok
    assert seen == [_keys(sent["order"]), _keys(edited["order"])]


def test_a_request_records_the_call_id_it_was_asked_for():
    """A request asked for a call sent with a call id names that id in its stored record (a
    framework looks up which call a request belongs to); one asked without an id names none."""
    store = MemoryStore()
    tx = _tx(store, _charge_tool(Card(), needs_approval=True))
    asked = tx.call("charge", ARGS, call_id="call-7")
    assert asked.status is StepStatus.NEEDS_APPROVAL
    assert asked.approval is not None
    record = json.loads(requests_for(store).get(asked.approval.id).record)
    assert record["call_id"] == "call-7"
    other = _tx(MemoryStore(), _charge_tool(Card(), needs_approval=True))
    plain = other.call("charge", ARGS)
    assert plain.approval is not None
    assert "call_id" not in json.loads(requests_for(other.store).get(plain.approval.id).record)
