"""The lifecycle of a tool-call attempt on a transaction: a state machine against a model, on
every store, and one example test per rule the step core enforces."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    INVARIANT_MARKER,
    RULE_MARKER,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from tests._lifecycle_tools import LIMIT, Provider, charging_tools

import agenttx
from agenttx import EngineConfig, StepStatus
from agenttx._approvals import decision_of, requests_for
from agenttx.stores import MemoryStore, PostgresStore, SQLiteStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

STEP_TIMEOUT = 0.1
FAST = EngineConfig(idle_timeout=None, compensation_retries=1)
SLOW = os.environ.get("AGENTTX_SLOW") == "1"
GRACE = 0.25  # LATE_RESULT_GRACE in the state machine (1 s in the library)
MACHINE_SETTINGS = settings(
    max_examples=400 if SLOW else 60, stateful_step_count=50 if SLOW else 25, deadline=None
)


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """`tx.call` resends a RETRY at once (its backoff sleeps are not what is tested)."""
    monkeypatch.setattr("agenttx._transaction._turns.sleep", lambda _seconds: None)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Callable[[], Any]]:
    """Makes store objects on one backend: the same MemoryStore, or new objects on one SQLite
    file or PostgreSQL schema per call (a restarted process, a second worker)."""
    made: list[Any] = []
    if request.param == "memory":
        memory = MemoryStore()

        def make() -> Any:
            return memory

    elif request.param == "sqlite":
        path = tmp_path / f"{uuid.uuid4().hex}.db"

        def make() -> Any:
            made.append(SQLiteStore(path))
            return made[-1]

    else:
        dsn, schema = request.getfixturevalue("pg_schema")

        def make() -> Any:
            made.append(PostgresStore(dsn, schema=schema))
            return made[-1]

    make.durable = request.param != "memory"  # type: ignore[attr-defined]
    yield make
    for store in made:
        store.close()


# ------------------------------------------------------------ the state machine


class LifecycleMachine(RuleBasedStateMachine):
    """Sends, decisions, reviews, releases, rewinds, commits, crashes and lease losses on
    transactions (a new one once one ended) on one store with a guarded charging tool,
    checked against a small model."""

    make_store: Callable[[], Any] = staticmethod(MemoryStore)  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.provider = Provider()
        self.tools = charging_tools(self.provider)
        self.durable = bool(getattr(self.make_store, "durable", False))
        self.store = self.make_store()
        self.opened = [self.store]
        self.tx = agenttx.Transaction(
            tools=self.tools, store=self.store, step_timeout=STEP_TIMEOUT, hooks=[self._hook]
        )
        self.tx_id = self.tx.id
        self.tx_ids = [self.tx_id]  # every transaction of the example, on the one store
        self.baseline = 0  # what the committed transactions charged
        self.engine: agenttx.Engine | None = None
        self.live: dict[int, int] = {}  # step -> amount charged, of the steps that succeeded
        #: What blocks the next step: {"kind", "id", "step", "amount", "state"}.
        self.waiting: dict[str, Any] | None = None
        self.ended: str | None = None  # "committed" or "aborted"
        #: The decisions on approval requests not yet used, by amount (an approval is bound to
        #: the tool and the arguments' digest, at any step): "approved" or "rejected".
        self.decided: dict[int, str] = {}

    def _hook(self, event: agenttx.Event) -> None:
        self.provider.hook(event)
        if event.kind is agenttx.EventKind.STEP_REWOUND:
            self.provider.note("rewound", event.step)
        elif event.kind is agenttx.EventKind.APPROVAL_CONSUMED:
            self.provider.note("consumed", event.data["request"])

    def teardown(self) -> None:
        self.provider.release_all()
        if not self.tx.status.terminal:  # no open transaction left for the next example's recovery
            self.tx.rollback(0)
        for store in self.opened:
            if store is not self.store or self.durable:
                store.close()

    # ------------------------------------------------------------ model helpers

    def _running(self) -> bool:
        """A `hang` call not yet released (its thread may hold a charge not yet recorded)."""
        return any(not gate.is_set() for gate in self.provider.gates)

    def _blocking(self) -> bool:
        waiting = self.waiting
        if waiting is None:
            return False
        return waiting["state"] == "pending" or (
            waiting["kind"] == "review" and waiting["state"] != "applied"
        )

    @staticmethod
    def _resend(result: agenttx.StepResult, step: int, *, ran: bool) -> None:
        """A call refused at a waiting step: sent again at its own number, nothing ran."""
        assert result.status is StepStatus.ROLLBACK_TRIGGERED, result
        assert result.strategy is agenttx.RollbackStrategy.RESEND, result
        assert not ran
        assert result.next_step_id == step

    def _after(self, result: agenttx.StepResult, step: int) -> None:
        """Bring the model up to `result` of a call sent as `step`."""
        for gone in [s for s in self.live if s >= result.next_step_id]:
            del self.live[gone]
        if result.status is StepStatus.SUCCESS:
            self.live[step] = result.output["amount"]
        if self.tx.status.terminal:
            self.ended = "aborted"
            self.live.clear()

    # ------------------------------------------------------------ rules

    @precondition(lambda self: self.ended is None)
    @rule(
        amount=st.sampled_from([10, 20, 30, 60, 80]),
        behaviour=st.sampled_from(["ok", "ok", "fail", "transient", "late", "hang"]),
        same=st.booleans(),
    )
    def send(self, amount: int, behaviour: str, same: bool) -> None:
        """Send the next call: the waiting one again (`same`), or a call of `amount`."""
        waiting = self.waiting
        if same and waiting is not None:
            amount = waiting["amount"]
        refused = waiting is not None and self._blocking() and amount != waiting["amount"]
        # The call under review sent again while it still runs waits on its review (or, once
        # resolved, for the call to return): nothing runs and nothing is rewound
        # (test_the_same_call_sent_again_while_its_reviewed_call_still_runs_keeps_waiting).
        held = self._running() and not refused
        arguments = {"amount": amount, "memo": "m"}
        step = self.tx.next_step_id
        runs = len(self.provider.runs())
        self.provider.plan[:] = [behaviour]
        result = self.tx.call("charge", arguments)
        self.provider.plan.clear()
        ran = len(self.provider.runs()) > runs
        if refused:  # a blocked step runs nothing, and the controller is not asked
            self._resend(result, step, ran=ran)
            assert "this call did not run" in result.hint.text
            return
        if held and waiting is not None and waiting["state"] == "resolved":
            # Resolved, not yet taken: the call sent again waits for the earlier one to return,
            # refused at its own number without asking the controller.
            assert waiting["kind"] == "review", waiting
            self._resend(result, step, ran=ran)
            assert "still running" in result.error, result
            return
        assert not held or (waiting is not None and waiting["state"] == "pending"), waiting
        if waiting is not None and waiting["state"] == "pending" and amount == waiting["amount"]:
            expected = (
                StepStatus.NEEDS_APPROVAL
                if waiting["kind"] == "approval"
                else StepStatus.NEEDS_REVIEW
            )
            assert result.status is expected, result
            assert (result.approval or result.review).id == waiting["id"]
            assert not ran
            return
        reviewed = (
            waiting is not None and waiting["kind"] == "review" and amount == waiting["amount"]
        )
        edited = reviewed and bool(waiting and waiting.get("edited"))
        if amount > LIMIT and not reviewed:  # the approval gate: bound to the call, not the step
            decided = self.decided.pop(amount, None)
            edited = decided == "edited"
            if decided is None:  # a new request
                assert result.status is StepStatus.NEEDS_APPROVAL, result
                assert not ran
            elif decided == "rejected":  # refused again, at any step, until rolled back
                assert not result.ok, result
                assert "rejected by bob" in result.error, result
                assert not ran
                self.decided[amount] = decided
            else:  # the approval is consumed: the call runs
                assert ran, result
        if result.status is StepStatus.NEEDS_APPROVAL:
            self.waiting = {
                "kind": "approval",
                "id": result.approval.id,
                "step": step,
                "amount": amount,
                "state": "pending",
            }
        elif result.status is StepStatus.NEEDS_REVIEW:
            self.waiting = {
                "kind": "review",
                "id": result.review.id,
                "step": step,
                "amount": amount,
                "state": "pending",
                "edited": edited,
            }
        else:
            self.waiting = None
        self._after(result, step)

    @precondition(
        lambda self: (
            self.ended is None
            and self.waiting is not None
            and self.waiting["kind"] == "approval"
            and self.waiting["state"] == "pending"
        )
    )
    @rule(verdict=st.sampled_from(["approve", "edit", "reject", "bad edit"]))
    def decide(self, verdict: str) -> None:
        """Approve, approve with an edit (fitting the schema, or not), or reject."""
        waiting = self.waiting
        assert waiting is not None
        if verdict == "reject":
            self.tx.reject(waiting["id"], actor="bob", reason="not today")
            waiting["state"] = "rejected"
            self.decided[waiting["amount"]] = "rejected"
            return
        if verdict == "bad edit":
            with pytest.raises(agenttx.InvalidArgument):
                self.tx.approve(waiting["id"], actor="alice", arguments={"amount": "lots"})
            assert [r.id for r in self.tx.pending_approvals()] == [waiting["id"]]
            return
        edit = {"amount": 70, "memo": "edited"} if verdict == "edit" else None
        approval = self.tx.approve(waiting["id"], actor="alice", arguments=edit)
        assert approval.edited is (edit is not None)
        waiting["state"] = "approved"
        self.decided[waiting["amount"]] = "edited" if edit is not None else "approved"

    @precondition(
        lambda self: (
            self.ended is None
            and self.waiting is not None
            and self.waiting["kind"] == "review"
            and self.waiting["state"] == "pending"
        )
    )
    @rule(done=st.booleans())
    def resolve(self, done: bool) -> None:
        """A person says whether the call under review happened (it charged: `done` is true)."""
        waiting = self.waiting
        assert waiting is not None
        key = next(r.idempotency_key for r in self.tx.pending_reviews() if r.id == waiting["id"])
        if done:
            with self.provider.lock:  # what the call charged (an approver may have edited it)
                amount = self.provider.charged.get(key, waiting["amount"])
            output = {"key": key, "amount": amount, "step": waiting["step"]}
            self.tx.resolve_review(waiting["id"], outcome="done", output=output, actor="ops")
        else:
            self.tx.resolve_review(waiting["id"], outcome="not_done", actor="ops")
        waiting["state"] = "resolved"

    @precondition(lambda self: self._running())
    @rule()
    def release(self) -> None:
        """The late call still running returns."""
        self.provider.release_all()
        # Until its worker has returned, a rewind leaves its undo for the transaction's next
        # action (documented): wait for the return the gate only lets happen, so the model
        # knows when the undo runs (no public API tells).
        self.tx._pipeline._orphans.wait(5.0)

    @precondition(lambda self: self.ended is None and not self._running())
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        """Rewind to a step before the next one, or abort (to step 0)."""
        to = data.draw(st.integers(0, self.tx.next_step_id - 1))
        # A held call back since the last call is settled by the rewind at once: its undo runs
        # in it (test_a_rewind_below_a_review_undoes_its_held_call_that_returned).
        self.tx.rollback(to)
        if to == 0:
            self.ended = "aborted"
            self.live.clear()
            assert self.provider.net() == self.baseline
            return
        for gone in [s for s in self.live if s >= to]:
            del self.live[gone]
        if self.waiting is not None and self.waiting["step"] >= to:
            self.waiting = None

    @precondition(lambda self: self.ended is None)
    @rule()
    def commit(self) -> None:
        """Commit: refused while a step waits or a call runs, else the live charges stand."""
        if self._running() or self._blocking():
            with pytest.raises(agenttx.FailedPrecondition):
                self.tx.commit()
            assert self.tx.status is agenttx.TxStatus.ACTIVE
            return
        self.tx.commit()
        self.ended = "committed"
        assert self.provider.net() == self.baseline + sum(self.live.values())
        self.baseline = self.provider.net()
        self.live.clear()

    @precondition(lambda self: self.ended is not None)
    @rule()
    def send_after_the_end(self) -> None:
        """An ended transaction refuses calls and runs nothing."""
        runs = len(self.provider.runs())
        with pytest.raises(agenttx.InvalidTransactionState):
            self.tx.call("charge", {"amount": 5, "memo": "late"})
        assert len(self.provider.runs()) == runs

    @precondition(lambda self: self.ended is not None and not self._running())
    @rule()
    def begin(self) -> None:
        """A new transaction on the same store (what ended stays as it ended)."""
        self.tx = agenttx.Transaction(
            tools=self.tools, store=self.store, step_timeout=STEP_TIMEOUT, hooks=[self._hook]
        )
        self.tx_id = self.tx.id
        self.tx_ids.append(self.tx_id)
        self.live.clear()
        self.waiting = None
        self.decided.clear()
        self.ended = None
        self.provider.note("rewound", None)  # keys of another transaction are not compared

    def _reopen(self) -> None:
        """Recover the transaction on a fresh store object, as a restarted process does."""
        self.store = self.make_store()
        self.opened.append(self.store)
        self.engine = agenttx.Engine(
            tools=self.tools, store=self.store, config=FAST, hooks=[self._hook]
        )
        report = self.engine.recover("resume")
        assert self.tx_id in report.resumed, report
        self.tx = self.engine.get(self.tx_id)
        for gone in [s for s in self.live if s >= self.tx.next_step_id]:
            del self.live[gone]

    @precondition(lambda self: self.durable and self.ended is None and not self._running())
    @rule()
    def crash(self) -> None:
        """The process dies between calls; another one resumes the transaction. A step waiting
        in NEEDS_REVIEW (its call returned, its undo records written as it returned, even with
        no call since) is rewound by recovery: the call is undone and its review, pending or
        resolved, withdrawn
        (test_a_held_call_back_before_a_restart_is_undone_once_its_review_says_done)."""
        waiting = self.waiting
        self.store.close()
        del self.tx
        self._reopen()
        if waiting is None or waiting["kind"] != "review":
            return
        assert self.tx.pending_reviews() == ()
        with pytest.raises(agenttx.ReviewNotFound):
            self.tx.resolve_review(waiting["id"], outcome="not_done", actor="ops")
        self.waiting = None

    @precondition(
        lambda self: (
            self.durable
            and self.ended is None
            and not self._running()
            and self.waiting is None
            and self.tx.next_step_id > 1
        )
    )
    @rule()
    def lose_the_lease(self) -> None:
        """Another worker takes the transaction over: the old one is fenced and runs nothing."""
        thief = self.make_store()
        self.opened.append(thief)
        thief.load(self.tx_id)
        runs = len(self.provider.runs())
        with pytest.raises(agenttx.StorageError):
            self.tx.call("charge", {"amount": 5, "memo": "fenced"})
        assert len(self.provider.runs()) == runs
        self.store.close()
        thief.close()
        self._reopen()

    # ------------------------------------------------------------ invariants

    @invariant()
    def net_charges_match_the_live_steps(self) -> None:
        """Between calls, with nothing running nor under review, what the provider charged
        is what the live steps charged (0 after an abort)."""
        if self._running() or (self.waiting is not None and self.waiting["kind"] == "review"):
            return
        assert self.provider.net() == self.baseline + sum(self.live.values()), (
            self.live,
            self.provider.trace,
        )

    @invariant()
    def nothing_charged_above_the_limit_without_a_consumed_approval(self) -> None:
        """Each run above the limit used the key of a consumed approval; each approval was
        consumed once."""
        consumed = [e for e in self.provider.trace if e[0] == "consumed"]
        assert len({e[1] for e in consumed}) == len(consumed)
        keys = {
            decision_of(row).get("idempotency_key")
            for tx_id in self.tx_ids
            for row in requests_for(self.store).of_scope(tx_id)
            if row.kind == "approval"
        }
        for run in self.provider.runs():
            if run[3] > LIMIT:
                assert run[2] in keys, (run, self.provider.trace)

    @invariant()
    def the_status_check_never_ran_while_its_call_did(self) -> None:
        """The status check is asked only once the call has returned."""
        assert all(not e[2] for e in self.provider.trace if e[0] == "check")

    @invariant()
    def a_refunded_key_never_runs_again(self) -> None:
        """A refund means a rewind undid the call, so its step's key changed: no call runs with
        a key that was refunded (a provider would answer it with the refunded charge)."""
        refunded: set[str] = set()
        for entry in self.provider.trace:
            if entry[0] == "refund":
                refunded.add(entry[2])
            elif entry[0] == "run":
                assert entry[2] not in refunded, self.provider.trace

    @invariant()
    def a_resent_call_keeps_its_key_unless_its_step_was_undone(self) -> None:
        """After a timeout or a transient failure the same call at the same step runs with the
        same key, unless a refund or a rewind touched that step in between."""
        last: dict[tuple[int, int], tuple[str, str]] = {}  # (step, amount) -> (key, behaviour)
        for entry in self.provider.trace:
            if entry[0] in ("refund", "rewound"):
                for mark in [m for m in last if entry[1] is None or m[0] >= entry[1]]:
                    del last[mark]
            elif entry[0] == "run":
                _, step, key, amount, behaviour = entry
                before = last.get((step, amount))
                if before is not None and before[1] in ("transient", "late", "hang"):
                    assert key == before[0], self.provider.trace
                last[step, amount] = (key, behaviour)


@pytest.mark.timeout(900)
def test_the_lifecycle_machine(stores: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Random sends, decisions, reviews, releases, rewinds, commits, crashes and lease losses
    keep the lifecycle's rules, on every store."""
    # A `hang` call is awaited for the grace before its review opens: a shorter grace (still
    # longer than the step's timeout, so both bounds are exercised) keeps each one cheap.
    monkeypatch.setattr("agenttx._step._gate.LATE_RESULT_GRACE", GRACE)
    machine = type("Machine", (LifecycleMachine,), {"make_store": staticmethod(stores)})
    run_state_machine_as_test(machine, settings=MACHINE_SETTINGS)


class _Drawn:
    """A stand-in for `st.data()` that draws `value` (the step a `rollback` rewinds to)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def draw(self, strategy: Any) -> int:
        del strategy
        return self.value


#: Paths the machine reaches rarely by chance, each sent through its own rules (preconditions
#: checked) with every invariant checked after each rule, as the machine would; the third item
#: is what the model then says waits for a person ("kind state", or None).
PATHS: dict[str, list[tuple[str, dict[str, Any], str | None]]] = {
    # The call under review sent again while it still runs: it waits on the review, pending,
    # then resolved (test_the_same_call_sent_again_while_its_reviewed_call_still_runs_...).
    "sent again while its reviewed call runs": [
        ("send", {"amount": 10, "behaviour": "hang", "same": False}, "review pending"),
        ("send", {"amount": 10, "behaviour": "ok", "same": True}, "review pending"),
        ("resolve", {"done": False}, "review resolved"),
        ("send", {"amount": 10, "behaviour": "ok", "same": True}, "review resolved"),
        ("release", {}, "review resolved"),
        ("send", {"amount": 10, "behaviour": "ok", "same": True}, None),
        ("commit", {}, None),
    ],
    # The retry of an edited call times out again: the call sent again finds its review
    # (test_the_review_of_an_edited_call_retried_is_found_by_the_call_sent_again).
    "an edited call's retry times out again": [
        ("send", {"amount": 60, "behaviour": "ok", "same": False}, "approval pending"),
        ("decide", {"verdict": "edit"}, "approval approved"),
        ("send", {"amount": 60, "behaviour": "hang", "same": True}, "review pending"),
        ("release", {}, "review pending"),
        ("resolve", {"done": False}, "review resolved"),
        ("send", {"amount": 60, "behaviour": "late", "same": True}, "review pending"),
        ("send", {"amount": 60, "behaviour": "ok", "same": True}, "review pending"),
        ("resolve", {"done": True}, "review resolved"),
        ("send", {"amount": 60, "behaviour": "ok", "same": True}, None),
        ("commit", {}, None),
    ],
    # A rewind below a review whose held call is back undoes it at once
    # (test_a_rewind_below_a_review_undoes_its_held_call_that_returned).
    "a rewind below a review with its held call back": [
        ("send", {"amount": 10, "behaviour": "ok", "same": False}, None),
        ("send", {"amount": 20, "behaviour": "hang", "same": False}, "review pending"),
        ("release", {}, "review pending"),
        ("rollback", {"data": _Drawn(1)}, None),
        ("commit", {}, None),
    ],
    # Recovery rewinds a step waiting in NEEDS_REVIEW whose call returned, pending or
    # resolved, and withdraws its review
    # (test_recovery_undoes_a_returned_call_under_review_and_settles_its_review).
    "a crash while a review waits": [
        ("send", {"amount": 10, "behaviour": "hang", "same": False}, "review pending"),
        ("release", {}, "review pending"),
        ("send", {"amount": 10, "behaviour": "ok", "same": True}, "review pending"),
        ("crash", {}, None),
        ("send", {"amount": 10, "behaviour": "hang", "same": False}, "review pending"),
        ("resolve", {"done": False}, "review resolved"),
        ("release", {}, "review resolved"),
        ("send", {"amount": 10, "behaviour": "late", "same": True}, "review pending"),
        ("resolve", {"done": True}, "review resolved"),
        ("crash", {}, None),
        ("send", {"amount": 10, "behaviour": "ok", "same": False}, None),
        ("commit", {}, None),
    ],
    # A held call back, then a crash before any other action: its undo was written as it
    # returned, so recovery undoes it, its review pending or resolved
    # (test_a_held_call_back_before_a_restart_is_undone_once_its_review_says_done).
    "a crash with a held call back": [
        ("send", {"amount": 10, "behaviour": "ok", "same": False}, None),
        ("send", {"amount": 20, "behaviour": "hang", "same": False}, "review pending"),
        ("release", {}, "review pending"),
        ("crash", {}, None),
        ("send", {"amount": 30, "behaviour": "hang", "same": False}, "review pending"),
        ("resolve", {"done": True}, "review resolved"),
        ("release", {}, "review resolved"),
        ("crash", {}, None),
        ("send", {"amount": 30, "behaviour": "ok", "same": False}, None),
        ("commit", {}, None),
    ],
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", list(PATHS))
def test_the_lifecycle_machine_on_a_rare_path(
    stores: Callable[[], Any], monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The machine's rules and invariants hold along each path it reaches rarely by chance
    (a crash only on a durable store)."""
    if "crash" in path and not getattr(stores, "durable", False):
        pytest.skip("a MemoryStore does not survive its process")
    monkeypatch.setattr("agenttx._step._gate.LATE_RESULT_GRACE", GRACE)
    machine = type("Machine", (LifecycleMachine,), {"make_store": staticmethod(stores)})()
    invariants = [f for f in vars(LifecycleMachine).values() if hasattr(f, INVARIANT_MARKER)]
    assert len(invariants) == 5
    try:
        for name, arguments, waits in PATHS[path]:
            rule_of = getattr(getattr(LifecycleMachine, name), RULE_MARKER)
            assert all(condition(machine) for condition in rule_of.preconditions), name
            getattr(machine, name)(**arguments)
            for check in invariants:
                check(machine)
            waiting = machine.waiting
            assert waits == (None if waiting is None else f"{waiting['kind']} {waiting['state']}")
        assert machine.ended == "committed"
    finally:
        machine.teardown()


# ------------------------------------------------------------ one example per rule


def _tx(store: Any, provider: Provider, **options: Any) -> agenttx.Transaction:
    return agenttx.Transaction(
        tools=charging_tools(provider),
        store=store,
        step_timeout=STEP_TIMEOUT,
        hooks=[provider.hook],
        **options,
    )


@pytest.fixture
def provider() -> Iterator[Provider]:
    """A provider whose hanging calls are released when the test ends."""
    made = Provider()
    yield made
    made.release_all()


SMALL = {"amount": 10, "memo": "m"}
OTHER = {"amount": 20, "memo": "m"}


@pytest.mark.parametrize("behaviour", ["transient", "late"])
def test_a_step_resent_by_call_after_a_transient_failure_or_timeout_keeps_its_key(
    provider: Provider, behaviour: str
) -> None:
    """`tx.call`'s own RETRY resend of a step that failed transiently or timed out keeps
    `ctx.idempotency_key` (rule 1: only an undo of the step changes it)."""
    tool_keys: list[str] = []

    @agenttx.tool(name="ping")
    def ping(ctx: agenttx.ToolContext, n: int) -> dict[str, int]:
        """Ping.

        Args:
            n: a number
        """
        tool_keys.append(ctx.idempotency_key)
        if len(tool_keys) == 1:
            if behaviour == "transient":
                raise agenttx.ToolError("busy, try again", transient=True)
            while time.monotonic() < ctx.deadline + 0.03:  # returns just after its deadline
                time.sleep(0.005)
        return {"n": n}

    tx = agenttx.Transaction(tools=[ping], step_timeout=STEP_TIMEOUT)
    result = tx.call("ping", {"n": 1})
    assert result.ok, result
    assert len(tool_keys) == 2
    assert tool_keys[0] == tool_keys[1]


def test_a_rewind_that_undid_the_step_changes_its_key(provider: Provider) -> None:
    """The key of a step changes once a rewind compensated it (rule 1, the other side)."""
    tx = _tx(MemoryStore(), provider)
    assert tx.call("charge", SMALL).ok
    tx.rollback(1)
    assert tx.call("charge", SMALL).ok
    first, second = (run[2] for run in provider.runs())
    assert first != second
    assert provider.net() == 10


def test_the_undo_of_a_call_still_running_runs_once_it_returned(provider: Provider) -> None:
    """A call past its deadline keeps its undo; once it returns a rewind refunds it once
    (rule 2)."""
    tx = _tx(MemoryStore(), provider)
    provider.plan[:] = ["hang"]
    review = tx.call("charge", SMALL)
    assert review.status is StepStatus.NEEDS_REVIEW
    provider.release_all()
    tx.resolve_review(review.review.id, outcome="not_done", actor="ops")
    assert tx.call("charge", SMALL).ok  # the same key: the provider does not charge twice
    assert provider.net() == 10
    tx.rollback(1)
    assert provider.net() == 0
    refunds = [e for e in provider.trace if e[0] == "refund"]
    assert len({e[2] for e in refunds}) == 1


def test_the_status_check_waits_for_the_call_to_return(provider: Provider) -> None:
    """A call still running past its deadline is not checked: it goes to review; a late call
    that returned is checked, after it returned (rule 3)."""
    tx = _tx(MemoryStore(), provider)
    provider.plan[:] = ["hang"]
    result = tx.call("charge", SMALL)
    assert result.status is StepStatus.NEEDS_REVIEW
    assert [e for e in provider.trace if e[0] == "check"] == []
    assert any("only once it has returned" in error for error in result.review.errors)
    with pytest.raises(agenttx.FailedPrecondition):
        tx.commit()
    provider.release_all()
    late = _tx(MemoryStore(), provider)
    provider.plan[:] = ["late"]
    assert late.call("charge", OTHER).ok
    checks = [e for e in provider.trace if e[0] == "check"]
    assert len(checks) == 1
    assert checks[0][2] is False  # the call had returned when its check was asked


@pytest.mark.parametrize("kind", ["review", "approval"])
def test_a_waiting_step_blocks_other_calls_and_the_commit(provider: Provider, kind: str) -> None:
    """While a step waits in NEEDS_REVIEW or NEEDS_APPROVAL another call there is refused
    (nothing runs) and `commit()` raises, until it is decided and sent again (rule 4)."""
    tx = _tx(MemoryStore(), provider)
    waiting_call = SMALL if kind == "review" else {"amount": 60, "memo": "m"}
    provider.plan[:] = ["hang"] if kind == "review" else []
    first = tx.call("charge", waiting_call)
    assert first.status is (
        StepStatus.NEEDS_REVIEW if kind == "review" else StepStatus.NEEDS_APPROVAL
    )
    runs = len(provider.runs())
    other = tx.call("charge", OTHER)
    assert not other.ok
    assert "this call did not run" in other.hint.text
    assert other.next_step_id == 1
    assert len(provider.runs()) == runs
    with pytest.raises(agenttx.FailedPrecondition):
        tx.commit()
    provider.release_all()
    if kind == "review":
        tx.resolve_review(first.review.id, outcome="not_done", actor="ops")
        with pytest.raises(agenttx.FailedPrecondition):  # resolved, not yet sent again
            tx.commit()
    else:
        tx.approve(first.approval.id, actor="alice")
    assert tx.call("charge", waiting_call).ok
    assert tx.commit().steps_committed == 1


def test_a_worker_that_lost_its_lease_runs_nothing(durable_backend: Any) -> None:
    """Once another store object took the transaction over, the old one's next call raises
    `StorageError` and its approved call does not run (rule 5)."""
    provider = Provider()
    tx = _tx(durable_backend(), provider)
    request = tx.call("charge", {"amount": 60, "memo": "m"}).approval
    tx.approve(request.id, actor="alice")
    thief = durable_backend()
    thief.load(tx.id)
    with pytest.raises(agenttx.StorageError):
        tx.call("charge", {"amount": 60, "memo": "m"})
    assert provider.runs() == []
    assert provider.net() == 0


@pytest.mark.timeout(30)
def test_an_async_call_does_not_stall_the_loop_while_its_status_check_waits() -> None:
    """`await tx.acall(...)` of a gated call whose status check blocks lets another coroutine
    on the same loop run meanwhile: the check, once asked, sees the event that coroutine sets
    (a check run on the loop's thread would see it unset when its wait ran out)."""
    asked = threading.Event()
    freed = threading.Event()
    gone = threading.Event()

    def check(arguments: dict[str, Any], key: str) -> agenttx.CheckResult:
        del arguments, key
        asked.set()
        freed.wait(5)
        return agenttx.CheckResult.done({"checked": freed.is_set()})

    @agenttx.tool(name="slow", check=check)
    def slow(n: int) -> dict[str, int]:
        """Slow.

        Args:
            n: a number
        """
        gone.wait(0.6)  # returns after its deadline: its check decides
        return {"n": n}

    # The check answers within the step's timeout: long enough for `other` to be scheduled.
    tx = agenttx.Transaction(tools=[slow], step_timeout=0.5)

    async def other() -> None:
        await asyncio.to_thread(asked.wait, 5)  # frees the check only once it is asked
        freed.set()

    async def main() -> agenttx.StepResult:
        result, _ = await asyncio.gather(tx.acall("slow", {"n": 1}), other())
        return result

    result = asyncio.run(main())
    assert result.ok, result
    assert result.output == {"checked": True}


@pytest.mark.timeout(30)
def test_the_same_call_sent_again_while_its_reviewed_call_still_runs_keeps_waiting(
    provider: Provider,
) -> None:
    """The call under review sent again while it still runs is answered NEEDS_REVIEW with the
    same review, nothing runs, and nothing is rewound (rule 4: never escalated to a rewind)."""
    tx = _tx(MemoryStore(), provider)
    provider.plan[:] = ["hang"]
    review = tx.call("charge", SMALL).review
    for _ in range(3):
        again = tx.call("charge", SMALL)
        assert again.status is StepStatus.NEEDS_REVIEW, again
        assert again.review.id == review.id
    assert tx.status is agenttx.TxStatus.ACTIVE
    assert [r.id for r in tx.pending_reviews()] == [review.id]
    assert len(provider.runs()) == 1


@pytest.mark.timeout(30)
def test_the_review_of_an_edited_call_retried_is_found_by_the_call_sent_again(
    provider: Provider,
) -> None:
    """The call whose approval was edited, sent again after its retry timed out again, gets
    the review it waits on (NEEDS_REVIEW), as after its first timeout (rule 4)."""
    tx = _tx(MemoryStore(), provider)
    big = {"amount": 60, "memo": "m"}
    request = tx.call("charge", big).approval
    tx.approve(request.id, actor="alice", arguments={"amount": 70, "memo": "edited"})
    provider.plan[:] = ["hang"]
    first = tx.call("charge", big).review
    provider.release_all()
    tx.resolve_review(first.id, outcome="not_done", actor="ops")
    provider.plan[:] = ["late"]  # the retry times out again: a person reviews it
    second = tx.call("charge", big)
    assert second.status is StepStatus.NEEDS_REVIEW, second
    again = tx.call("charge", big)
    assert again.status is StepStatus.NEEDS_REVIEW, again
    assert again.review.id == second.review.id


def test_a_rewind_below_a_review_undoes_its_held_call_that_returned(provider: Provider) -> None:
    """A rewind that drops a step waiting in NEEDS_REVIEW compensates the undo of its call
    that has returned, in that rewind (rule 2: an undo runs once its call has returned)."""
    tx = _tx(MemoryStore(), provider)
    assert tx.call("charge", SMALL).ok
    provider.plan[:] = ["hang"]
    assert tx.call("charge", OTHER).status is StepStatus.NEEDS_REVIEW
    provider.release_all()
    tx._pipeline._orphans.wait(5.0)  # the held call has returned (no public API tells)
    tx.rollback(1)
    assert provider.net() == 0, provider.trace


def test_recovery_undoes_a_returned_call_under_review_and_settles_its_review(tmp_path: Any) -> None:
    """A step waiting in NEEDS_REVIEW whose call returned, then a restart: recovery rewinds
    the step (its call's undo runs: rule 2), which settles the review (withdrawn: its outcome
    is known, undone); the call sent again starts afresh under a new key, and leaves one
    charge standing."""
    provider = Provider()
    store = SQLiteStore(tmp_path / "review.db")
    tx = _tx(store, provider)
    provider.plan[:] = ["hang"]
    review = tx.call("charge", SMALL).review
    provider.release_all()  # the call returns: its undo records are kept
    assert tx.call("charge", SMALL).status is StepStatus.NEEDS_REVIEW
    store.close()
    again = SQLiteStore(tmp_path / "review.db")
    try:
        engine = agenttx.Engine(tools=charging_tools(provider), store=again, config=FAST)
        engine.recover("resume")
        resumed = engine.get(tx.id)
        assert resumed.pending_reviews() == ()
        with pytest.raises(agenttx.ReviewNotFound):
            resumed.resolve_review(review.id, outcome="not_done", actor="ops")
        assert resumed.call("charge", SMALL).ok
        assert provider.net() == 10, provider.trace
        assert len({run[2] for run in provider.runs()}) == 2  # the refunded key never ran again
    finally:
        again.close()


def _request_without_tools(store: Any) -> str:
    tx = _tx(store, Provider())
    return tx.call("charge", {"amount": 60, "memo": "m"}).approval.id


def test_an_edit_through_an_engine_without_tools_is_checked_against_the_stored_schema(
    tmp_path: Any,
) -> None:
    """`Engine(store=...)` without the tool checks an edit against the schema stored with the
    request: `InvalidArgument`, and the request stays pending; a fitting edit is approved."""
    store = SQLiteStore(tmp_path / "edits.db")
    try:
        request_id = _request_without_tools(store)
        desk = agenttx.Engine(store=store)
        with pytest.raises(agenttx.InvalidArgument, match="do not fit"):
            desk.approve(request_id, actor="alice", arguments={"amount": "lots", "memo": "m"})
        row = requests_for(store).get(request_id)
        assert row.state == "pending"
        approval = desk.approve(request_id, actor="alice", arguments={"amount": 70, "memo": "m"})
        assert approval.edited
    finally:
        store.close()


def test_an_edit_over_the_size_limit_is_refused(tmp_path: Any) -> None:
    """An edit over 1 MiB is refused (`InvalidArgument`), and the request stays pending."""
    store = SQLiteStore(tmp_path / "edits.db")
    try:
        request_id = _request_without_tools(store)
        desk = agenttx.Engine(store=store)
        huge = {"amount": 70, "memo": "x" * (1024 * 1024 + 1)}
        with pytest.raises(agenttx.InvalidArgument, match="exceed"):
            desk.approve(request_id, actor="alice", arguments=huge)
        row = requests_for(store).get(request_id)
        assert row.state == "pending"
    finally:
        store.close()


def _held_back(store: Any, provider: Provider) -> tuple[agenttx.Transaction, agenttx.Review]:
    """A transaction whose charge of 10 is under review while its call hangs."""
    tx = _tx(store, provider)
    provider.plan[:] = ["hang"]
    review = tx.call("charge", SMALL).review
    assert review is not None
    return tx, review


def _recovered(make: Callable[..., Any], provider: Provider, tx_id: str) -> agenttx.Transaction:
    """The transaction resumed by a restarted process on a new store of the same backend."""
    engine = agenttx.Engine(tools=charging_tools(provider), store=make(), config=FAST)
    report = engine.recover("resume")
    assert tx_id in report.resumed, report
    return engine.get(tx_id)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("resolved", [False, True], ids=["pending", "resolved"])
def test_a_held_call_back_before_a_restart_is_undone_once_its_review_says_done(
    durable_backend: Callable[..., Any], provider: Provider, resolved: bool
) -> None:
    """A call under review returns, then the process dies before the transaction's next
    action (its review pending, or resolved `done`): its undo was written as it returned, so
    recovery rewinds the step, refunds the charge and withdraws the review (rule 2: an undo
    runs once its call has returned); the call sent again charges once."""
    store = durable_backend()
    tx, review = _held_back(store, provider)
    provider.release_all()
    tx._pipeline._orphans.wait(5.0)  # the held call has returned (no public API tells)
    if resolved:
        output = {"key": review.idempotency_key, "amount": 10, "step": 1}
        tx.resolve_review(review.id, outcome="done", output=output, actor="ops")
    store.close()  # the process dies
    resumed = _recovered(durable_backend, provider, tx.id)
    assert provider.net() == 0, provider.trace
    assert resumed.pending_reviews() == ()
    with pytest.raises(agenttx.ReviewNotFound):
        resumed.resolve_review(review.id, outcome="not_done", actor="ops")
    assert resumed.call("charge", SMALL).ok
    assert provider.net() == 10, provider.trace
    resumed.rollback(0)
    assert provider.net() == 0, provider.trace


@pytest.mark.timeout(60)
def test_a_held_call_cut_off_before_its_undo_is_written_is_undone_once_its_review_says_done(
    durable_backend: Callable[..., Any], provider: Provider, caplog: pytest.LogCaptureFixture
) -> None:
    """The process dies as a call under review returns, before its undo is written (here: its
    store is closed first, and the write is reported): after the restart the review still
    waits; resolved `done` and sent again, the step keeps the undo the tool declares with the
    reviewed output, and an abort refunds the charge."""
    store = durable_backend()
    tx, review = _held_back(store, provider)
    store.close()  # the process is gone: what the call's return writes cannot land
    provider.release_all()
    tx._pipeline._orphans.wait(5.0)
    assert "could not be written as it returned" in caplog.text
    assert provider.net() == 10  # the charge happened
    resumed = _recovered(durable_backend, provider, tx.id)
    assert [r.id for r in resumed.pending_reviews()] == [review.id]
    output = {"key": review.idempotency_key, "amount": 10, "step": 1}
    resumed.resolve_review(review.id, outcome="done", output=output, actor="ops")
    assert resumed.call("charge", SMALL).ok
    assert provider.net() == 10
    resumed.rollback(0)
    assert provider.net() == 0, provider.trace


@pytest.mark.timeout(60)
def test_a_held_call_returning_after_its_lease_was_lost_writes_nothing_and_is_reported(
    durable_backend: Callable[..., Any], provider: Provider, caplog: pytest.LogCaptureFixture
) -> None:
    """A call under review returns on a worker that lost its lease meanwhile: its undo is not
    written into the transaction another store holds, but logged and reported by the old
    worker (`view().compensation_failures`, and never run); the holder's review, resolved
    `done`, keeps the undo, and its abort refunds the charge once."""
    store = durable_backend(lease_seconds=30.0)
    tx, review = _held_back(store, provider)
    thief = durable_backend(lease_seconds=30.0)
    thief.load(tx.id)  # another worker takes the transaction over
    provider.release_all()
    tx._pipeline._orphans.wait(5.0)
    assert "could not be written as it returned" in caplog.text
    assert thief.load(tx.id).undos == ()  # nothing written into the thief's transaction
    with pytest.raises(agenttx.StorageError, match="lease lost"):
        tx.rollback(0)
    failures = tx.view().compensation_failures
    assert any("not recorded as its late call returned" in line for line in failures), failures
    assert provider.net() == 10  # the old worker ran no refund
    store.close()
    thief.close()
    resumed = _recovered(durable_backend, provider, tx.id)
    assert [r.id for r in resumed.pending_reviews()] == [review.id]
    output = {"key": review.idempotency_key, "amount": 10, "step": 1}
    resumed.resolve_review(review.id, outcome="done", output=output, actor="ops")
    assert resumed.call("charge", SMALL).ok
    resumed.rollback(0)
    assert provider.net() == 0, provider.trace
    assert sum(1 for e in provider.trace if e[0] == "refund") == 1, provider.trace


@pytest.mark.timeout(60)
def test_a_timed_out_call_back_before_a_restart_is_undone_by_recovery(
    durable_backend: Callable[..., Any],
) -> None:
    """A plain tool's call that timed out returns, then the process dies before the
    transaction's next action: its `compensate=` undo was written as it returned, so recovery
    runs it (rule 2), and the call sent again charges once."""
    release, charges, refunds = threading.Event(), list[int](), list[int]()

    @agenttx.compensation(name="refund")
    def refund(payload: dict[str, Any]) -> None:
        refunds.append(payload["output"]["charged"])

    @agenttx.tool(compensate=refund)
    def pay(amount: int) -> dict[str, int]:
        release.wait(10.0)
        charges.append(amount)
        return {"charged": amount}

    store = durable_backend()
    tx = agenttx.Transaction(tools=[pay, refund], store=store, step_timeout=STEP_TIMEOUT)
    try:
        assert tx.call("pay", {"amount": 7}).status is StepStatus.ROLLBACK_TRIGGERED
    finally:
        release.set()
    tx._pipeline._orphans.wait(5.0)  # it has returned (no public API tells)
    assert charges == [7]
    store.close()  # the process dies
    engine = agenttx.Engine(tools=[pay, refund], store=durable_backend(), config=FAST)
    engine.recover("resume")
    assert refunds == [7]
    assert engine.get(tx.id).call("pay", {"amount": 7}).ok
    assert (charges, refunds) == ([7, 7], [7])
