"""The step core drives a transaction's step and a plan's node alike: one differential test.

Each flow (success, a tool's error, a transient retry, an approval approved, edited or
rejected, an outcome found unknown and settled by the status check or by a person) runs once
as step 1 of a `Transaction` and once as the only node of a `Plan`, against the same fake
payment provider; the two runs must agree on what the provider saw (calls, idempotency keys,
charges), on the outcome, on the audit events about people and unknown outcomes, and on the
states the store's requests end in.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

import pytest
from tests._lifecycle_tools import Provider as Charges
from tests._lifecycle_tools import charging_tools

import agenttx
from agenttx import CheckResult, EventKind, NodeState, StepStatus
from agenttx._approvals import requests_for
from agenttx.stores import MemoryStore

pytestmark = pytest.mark.timeout(60)

#: The events the step core records about people and unknown outcomes.
PEOPLE = frozenset(
    {
        EventKind.APPROVAL_REQUESTED,
        EventKind.APPROVED,
        EventKind.REJECTED,
        EventKind.APPROVAL_CONSUMED,
        EventKind.OUTCOME_UNKNOWN,
        EventKind.REVIEW_REQUESTED,
        EventKind.REVIEWED,
    }
)
TIMEOUT = 0.2


class Provider:
    """A payment provider that deduplicates charges by idempotency key."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.calls: list[tuple[str, int]] = []
        self.charges: dict[str, int] = {}
        self.released = threading.Event()  # a late call returns once it is set
        self.lock = threading.Lock()

    def charge(self, key: str, amount: int) -> dict[str, Any]:
        with self.lock:
            self.calls.append((key, amount))
            attempt = len(self.calls)
        if self.behaviour == "error":
            raise agenttx.ToolError("card declined", transient=False)
        if self.behaviour == "transient" and attempt == 1:
            raise agenttx.ToolError("503 Service Unavailable", transient=True)
        if self.behaviour == "late_not_done" and attempt == 1:
            self.released.wait(10)  # it never reached the provider's books
            return {}
        with self.lock:
            self.charges.setdefault(key, amount)
        if self.behaviour.startswith("late") and attempt == 1:
            self.released.wait(10)  # the provider answers after the deadline
        return {"charge": key[:8], "amount": amount}

    def status(self, verdict: str) -> Any:
        def check(arguments: Any, key: str) -> CheckResult:
            del arguments
            if verdict == "unknown":
                return CheckResult.unknown("the provider does not say")
            with self.lock:
                amount = self.charges.get(key)
            if amount is None:
                return CheckResult.not_done()
            return CheckResult.done({"charge": key[:8], "amount": amount})

        return check


def _tool(provider: Provider, **options: Any) -> agenttx.Tool[Any, Any]:
    @agenttx.tool(name="charge", **options)
    def charge(ctx: agenttx.ToolContext, amount: int) -> dict:
        """Charge `amount`."""
        return provider.charge(ctx.idempotency_key, amount)

    return charge


def _release_when_unknown(provider: Provider) -> Any:
    def hook(event: agenttx.Event) -> None:
        if event.kind is EventKind.OUTCOME_UNKNOWN:
            provider.released.set()

    return hook


#: name -> (provider behaviour, tool options, what a person does: a list of actions)
FLOWS: dict[str, tuple[str, dict[str, Any], list[tuple[str, Any]]]] = {
    "success": ("ok", {}, []),
    "tool error": ("error", {}, []),
    "transient retry": ("transient", {}, []),
    "approved": ("ok", {"needs_approval": True}, [("approve", None)]),
    "edited": ("ok", {"needs_approval": True}, [("approve", {"amount": 7})]),
    "rejected": ("ok", {"needs_approval": True}, [("reject", "too much")]),
    "check says done": ("late", {"check": "done"}, []),
    "check says not done": ("late_not_done", {"check": "not_done"}, []),
    "review says done": (
        "late",
        {"check": "unknown"},
        [("review", {"charge": "by hand", "amount": 5})],
    ),
}


class Seen:
    """What one run produced, in terms both drivers share."""

    def __init__(self, ok: bool, output: Any, events: list[str], rows: list[tuple[str, str]]):
        self.ok = ok
        self.output = output
        self.events = events
        self.rows = rows


def _options(provider: Provider, options: dict[str, Any]) -> dict[str, Any]:
    options = dict(options)
    if "check" in options:
        options["check"] = provider.status(options["check"])
    return options


def _people_events(events: Any) -> list[str]:
    return [event.kind.value for event in events if event.kind in PEOPLE]


def _rows(store: MemoryStore, scope_id: str) -> list[tuple[str, str]]:
    book = agenttx._approvals.requests_for(store)
    return sorted((row.kind, row.state) for row in book.of_scope(scope_id))


def _decide(target: Any, pending: Any, actions: list[tuple[str, Any]]) -> None:
    for action, value in actions:
        if action == "approve":
            target.approve(pending.id, actor="alice", arguments=value)
        elif action == "reject":
            target.reject(pending.id, actor="alice", reason=value)
        else:
            target.resolve_review(pending.id, outcome="done", output=value, actor="ops")


def _as_step(name: str) -> tuple[Provider, Seen]:
    behaviour, options, actions = FLOWS[name]
    provider = Provider(behaviour)
    store = MemoryStore()
    tx = agenttx.Transaction(
        tools=[_tool(provider, **_options(provider, options))],
        store=store,
        step_timeout=TIMEOUT,
        hooks=[_release_when_unknown(provider)],
    )
    result = tx.call("charge", {"amount": 5})
    if actions:
        assert result.status in (StepStatus.NEEDS_APPROVAL, StepStatus.NEEDS_REVIEW), result
        _decide(tx, result.approval or result.review, actions)
        result = tx.call("charge", {"amount": 5})
    return provider, Seen(result.ok, result.output, _people_events(tx.audit()), _rows(store, tx.id))


def _as_node(name: str) -> tuple[Provider, Seen]:
    behaviour, options, actions = FLOWS[name]
    provider = Provider(behaviour)
    store = MemoryStore()
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node(
                "pay",
                tool="charge",
                inputs={"amount": "${initial.amount}"},
                retries=1,
                timeout=TIMEOUT,
            )
        ],
        initial=["amount"],
    )
    run = agenttx.start_plan(
        plan,
        tools=[_tool(provider, **_options(provider, options))],
        initial={"amount": 5},
        store=store,
        hooks=[_release_when_unknown(provider)],
    )
    if actions:
        pending = None
        while pending is None:  # the node waits for a person (bounded by the timeout mark)
            waiting = run.pending_approvals() or run.pending_reviews()
            pending = waiting[0] if waiting else None
            time.sleep(0.01)
        _decide(run, pending, actions)
    result = run.wait(30)
    node = result.nodes["pay"]
    ok = node.state is NodeState.SUCCEEDED
    return provider, Seen(ok, node.output, _people_events(result.audit), _rows(store, run.id))


def _keyless(output: Any, provider: Provider) -> Any:
    """`output` with the charge id that its run's idempotency key made replaced by `<key>`."""
    keys = {key[:8] for key, _ in provider.calls}
    if isinstance(output, dict) and output.get("charge") in keys:
        return {**output, "charge": "<key>"}
    return output


@pytest.mark.parametrize("name", list(FLOWS))
def test_a_step_and_a_node_go_through_the_same_lifecycle(name: str) -> None:
    """The same flow as a transaction's step and as a plan's node: the provider saw the same
    calls (counts, amounts, one key reused across attempts), the outcome and the output agree,
    and so do the events about people and unknown outcomes and the requests' final states."""
    step_provider, step = _as_step(name)
    node_provider, node = _as_node(name)
    assert step.ok == node.ok, (step.ok, node.ok)
    assert _keyless(step.output, step_provider) == _keyless(node.output, node_provider)
    assert [amount for _, amount in step_provider.calls] == [
        amount for _, amount in node_provider.calls
    ]
    assert len(set(step_provider.calls)) == len(set(node_provider.calls))
    assert len({key for key, _ in step_provider.calls}) == len(
        {key for key, _ in node_provider.calls}
    )
    assert sorted(step_provider.charges.values()) == sorted(node_provider.charges.values())
    assert step.events == node.events
    assert step.rows == node.rows


def test_the_flows_cover_every_ending() -> None:
    """The table is not vacuous: its flows end in success and in failure, and through each
    kind of person's decision and each status-check answer."""
    endings = {name: _as_step(name)[1].ok for name in ("success", "tool error", "rejected")}
    assert endings == {"success": True, "tool error": False, "rejected": False}
    actions = {action for _, _, acts in FLOWS.values() for action, _ in acts}
    assert actions == {"approve", "reject", "review"}


# ------------------------------------------------------------ abandoned calls (an attack's finds)


def _slow_charge(order: list[str], started: threading.Event, release: threading.Event) -> Any:
    @agenttx.compensation(name="refund")
    def refund(payload: Any) -> None:
        del payload
        order.append("refund")

    @agenttx.tool(name="charge", compensate=refund)
    def charge(amount: int) -> dict:
        """Charge `amount`; the provider answers once released."""
        started.set()
        release.wait(10)
        order.append("charge")
        return {"amount": amount}

    return refund, charge


def test_a_cancelled_acall_keeps_its_running_call_until_it_returns() -> None:
    """Cancelling `acall` while its sync tool runs on a worker: the call is kept as running,
    `commit()` refuses meanwhile, and its `compensate=` undo runs once, after the charge."""
    import asyncio  # noqa: PLC0415

    order: list[str] = []
    started, release = threading.Event(), threading.Event()
    tx = agenttx.Transaction(tools=list(_slow_charge(order, started, release)), step_timeout=5)

    async def cancel_it() -> None:
        task = asyncio.ensure_future(tx.acall("charge", {"amount": 5}))
        await asyncio.to_thread(started.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    with pytest.raises(agenttx.FailedPrecondition, match="still running"):
        tx.commit()  # the charge may still land
    release.set()
    tx.rollback()
    assert order == ["charge", "refund"]


@pytest.mark.skipif(sys.platform == "win32", reason="needs pthread_kill")
@pytest.mark.timeout(60)
def test_an_interrupted_sync_call_keeps_its_running_call_until_it_returns() -> None:
    """A KeyboardInterrupt in `tx.call` while its sync tool runs on a worker: the call is kept
    as running, `commit()` refuses meanwhile, and its `compensate=` undo runs once, after the
    charge (not at once, before the charge lands)."""
    order: list[str] = []
    started, release = threading.Event(), threading.Event()
    tx = agenttx.Transaction(tools=list(_slow_charge(order, started, release)), step_timeout=5)

    def interrupt_once_started() -> None:
        started.wait(10)
        time.sleep(0.2)  # the caller is blocked in its wait for the worker by then
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]

    threading.Thread(target=interrupt_once_started).start()
    with pytest.raises(KeyboardInterrupt):
        tx.call("charge", {"amount": 5})  # the main thread waits for the worker here
    assert order == []  # nothing undone before the charge lands
    with pytest.raises(agenttx.FailedPrecondition, match="still running"):
        tx.commit()  # the charge may still land
    release.set()
    tx.rollback()
    assert order == ["charge", "refund"]


def test_an_abort_reports_the_undo_of_a_call_still_running() -> None:
    """Aborting while a timed-out call still runs: its declared `compensate=` undo is not run
    (its charge has not landed) but kept as failed and reported, not silently lost."""
    order: list[str] = []
    started, release = threading.Event(), threading.Event()
    tx = agenttx.Transaction(tools=list(_slow_charge(order, started, release)), step_timeout=0.1)
    try:
        assert not tx.call("charge", {"amount": 5}).ok  # timed out, still running
        tx.rollback()
        failures = tx.view().compensation_failures
        assert any("refund for step 1" in f and "still running" in f for f in failures)
        assert order == []
    finally:
        release.set()


@pytest.mark.parametrize("expires_in", [10**400, 1e300, 11 * 366 * 86_400])
def test_an_absurd_expiry_is_refused(expires_in: float) -> None:
    """An expiry past ten years (or past a timestamp's range) is `InvalidArgument`, and the
    request stays pending."""
    tx = agenttx.Transaction(tools=[_tool(Provider("ok"), needs_approval=True)])
    request = tx.call("charge", {"amount": 5}).approval
    with pytest.raises(agenttx.InvalidArgument, match="expires_in"):
        tx.approve(request.id, actor="alice", expires_in=expires_in)
    assert [r.id for r in tx.pending_approvals()] == [request.id]


def test_a_node_decided_not_done_runs_again_once_its_call_returned() -> None:
    """A plan node in review whose call still runs, resolved `not_done`: it waits for that
    call, then runs it again with the same key (not a TIMED_OUT failure for waiting)."""
    provider = Provider("late_not_done")
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("pay", tool="charge", inputs={"amount": "${initial.amount}"}, timeout=0.1)
        ],
        initial=["amount"],
    )
    tool = _tool(provider, check=provider.status("unknown"))
    run = agenttx.start_plan(plan, tools=[tool], initial={"amount": 5}, store=MemoryStore())
    try:
        while not run.pending_reviews():  # after the late-result grace (bounded by the mark)
            time.sleep(0.01)
        review = run.pending_reviews()[0]
        run.resolve_review(review.id, outcome="not_done", actor="ops")
        time.sleep(0.5)  # longer than the node's timeout: the node keeps waiting for its call
    finally:
        provider.released.set()
    result = run.wait(30)
    assert result.nodes["pay"].state is NodeState.SUCCEEDED
    assert len(provider.calls) == 2
    assert len({key for key, _ in provider.calls}) == 1


def test_a_guarded_call_whose_failure_aborts_a_durable_transaction_returns_its_result(
    durable_backend: Any,
) -> None:
    """On a durable store, a guarded call (its start recorded) whose failure makes the
    controller abort the transaction returns the FAILED step, its row finished, instead of
    raising `StorageError` once the abort let the store go."""
    provider = Charges()
    store = durable_backend()
    tx = agenttx.Transaction(tools=charging_tools(provider), store=store, step_timeout=TIMEOUT)
    provider.plan[:] = ["fail"]
    assert tx.call("charge", {"amount": 10, "memo": "m"}).status is StepStatus.ROLLBACK_TRIGGERED
    assert tx.call("charge", {"amount": 10, "memo": "m"}).ok
    provider.plan[:] = ["fail"]
    result = tx.call("charge", {"amount": 10, "memo": "m"})
    assert result.status is StepStatus.FAILED, result
    assert result.strategy is agenttx.RollbackStrategy.ABORT
    assert tx.status is agenttx.TxStatus.FAILED
    assert provider.net() == 0
    rows = requests_for(store).of_scope(tx.id)
    assert [row.state for row in rows] == ["finished"] * 3, rows
