"""The transaction at its edges: late tools, hostile input, huge values, misuse, observers."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import agenttx
from agenttx import StepStatus, TxStatus

# ---------------------------------------------------------------- an undo waits for its effect


def _late_charge(events: list[str], release: threading.Event, finished: threading.Event):
    """A tool that registers its undo, then charges only after `release` (past its deadline)."""

    @agenttx.tool
    def charge(ctx: agenttx.ToolContext, amount: int) -> dict:
        ctx.register_undo(lambda: events.append("refund"))
        release.wait(10.0)
        events.append("charge")
        finished.set()
        return {"charged": amount}

    return charge


def test_an_undo_never_runs_before_its_late_effect():
    """A timed-out tool still running keeps its undo; it runs after the effect, once."""
    events: list[str] = []
    release, finished = threading.Event(), threading.Event()
    tx = agenttx.Transaction(tools=[_late_charge(events, release, finished)], step_timeout=0.05)
    result = tx.execute_step(1, "charge", {"amount": 5})
    assert result.error == "tool 'charge' timed out after 50 ms"
    assert events == []  # the refund did not run while the charge could still land
    release.set()
    assert finished.wait(10.0)
    assert tx.rollback().aborted
    assert events == ["charge", "refund"]


def test_a_retry_does_not_start_while_the_earlier_call_may_still_land():
    """While the timed-out call runs, the step is not started again; after it, it is."""
    events: list[str] = []
    release, finished = threading.Event(), threading.Event()
    tx = agenttx.Transaction(tools=[_late_charge(events, release, finished)], step_timeout=0.05)
    first = tx.execute_step(1, "charge", {"amount": 5})
    assert first.status is StepStatus.ROLLBACK_TRIGGERED
    retry = tx.execute_step(tx.next_step_id, "charge", {"amount": 5})
    assert "earlier call that is still running" in (retry.error or "")
    assert events == []  # the tool was not called a second time
    release.set()
    assert finished.wait(10.0)
    events.clear()
    ok = tx.execute_step(tx.next_step_id, "charge", {"amount": 5})
    assert ok.ok  # the earlier call finished: its refund ran first, then the new charge
    assert events == ["refund", "charge"]


def test_commit_refuses_while_a_timed_out_call_still_runs():
    """Commit raises FailedPrecondition and changes nothing while a late effect may land."""
    events: list[str] = []
    release, finished = threading.Event(), threading.Event()
    tx = agenttx.Transaction(tools=[_late_charge(events, release, finished)], step_timeout=0.05)
    tx.execute_step(1, "charge", {"amount": 5})
    with pytest.raises(agenttx.FailedPrecondition, match="still running"):
        tx.commit()
    assert tx.status is TxStatus.ACTIVE
    release.set()
    assert finished.wait(10.0)
    assert tx.commit().steps_committed == 0
    assert events == ["charge", "refund"]


def test_a_declared_compensation_runs_for_a_tool_that_returned_late():
    """A `compensate=` tool that returns after its deadline is compensated with its output."""
    refunds: list[object] = []
    release = threading.Event()

    @agenttx.compensation(name="refund")
    def refund(payload: dict) -> None:
        refunds.append(payload["output"])

    @agenttx.tool(compensate=refund)
    def charge(amount: int) -> dict:
        release.wait(10.0)
        return {"charge_id": f"ch-{amount}"}

    tx = agenttx.Transaction(tools=[charge, refund], step_timeout=0.05)
    assert not tx.execute_step(1, "charge", {"amount": 7}).ok
    assert refunds == []
    release.set()
    tx.rollback()
    assert refunds == [{"charge_id": "ch-7"}]


# ---------------------------------------------------------------- async tools that block


def test_an_async_tool_that_blocks_fails_at_its_deadline_under_execute_step():
    """`time.sleep` inside `async def` still times out the step, and its late write is refused."""
    refused: list[str] = []
    release = threading.Event()

    @agenttx.tool
    async def blocking(ctx: agenttx.ToolContext) -> dict:
        release.wait(10.0)  # blocks its event loop
        try:
            ctx.state.put("late", 1)
        except agenttx.InvalidArgument as exc:
            refused.append(str(exc))
        return {"ok": True}

    tx = agenttx.Transaction(tools=[blocking], step_timeout=0.05)
    result = tx.execute_step(1, "blocking", {})
    assert result.error == "tool 'blocking' timed out after 50 ms"
    release.set()
    tx.rollback()
    assert refused == ["step 1 has ended: its context accepts no more calls"]
    assert tx.read("late") is None


def test_an_async_tool_that_blocks_the_loop_fails_as_timed_out_under_aexecute_step():
    """Under aexecute_step a loop-blocking tool cannot be interrupted, but fails as timed out."""

    @agenttx.tool
    async def blocking(ctx: agenttx.ToolContext) -> dict:
        time.sleep(0.2)  # noqa: ASYNC251  (the bug this guards against)
        ctx.state.put("late", 1)  # the timer thread fenced the context at the deadline
        return {"ok": True}

    async def run() -> agenttx.StepResult:
        tx = agenttx.Transaction(tools=[blocking], step_timeout=0.05)
        return await tx.aexecute_step(1, "blocking", {})

    result = asyncio.run(run())
    assert result.status is not StepStatus.SUCCESS
    assert result.error is not None
    assert "timed out" in result.error or "accepts no more calls" in result.error


# ---------------------------------------------------------------- hostile input never wedges


@pytest.mark.parametrize(
    "arguments",
    [
        {"x": "${steps." + "9" * 5000 + ".id}"},
        {"x": "${steps.1.items." + "7" * 5000 + "}"},
    ],
)
def test_hostile_references_fail_the_step_and_leave_the_transaction_usable(arguments):
    """Huge step ids and huge indices are failed steps, never a wedged transaction."""

    @agenttx.tool(inline=True)
    def make() -> dict:
        return {"items": [1, 2]}

    @agenttx.tool(inline=True)
    def use(x: object) -> dict:
        return {"x": x}

    tx = agenttx.Transaction(tools=[make, use])
    assert tx.execute_step(1, "make", {}).ok
    result = tx.execute_step(2, "use", arguments)
    assert result.status is not StepStatus.SUCCESS
    assert result.hint is not None
    assert tx.status is TxStatus.ACTIVE
    assert tx.rollback().aborted
    assert tx.status is TxStatus.ROLLED_BACK


def test_references_cannot_multiply_a_small_call_past_the_limit():
    """Resolved arguments over 1 MiB fail the step before the tool runs; nothing is stored."""
    called: list[int] = []

    @agenttx.tool(inline=True)
    def make() -> dict:
        return {"big": "x" * 600_000}

    @agenttx.tool(inline=True)
    def use(ctx: agenttx.ToolContext, a: str, b: str) -> dict:
        called.append(1)
        ctx.state.put("k", len(a) + len(b))
        return {}

    tx = agenttx.Transaction(tools=[make, use])
    assert tx.execute_step(1, "make", {}).ok
    copied = tx.execute_step(2, "use", {"a": "${steps.1.big}", "b": "${steps.1.big}"})
    assert copied.error == (
        "reference ${steps.1.big} takes what references insert past 1048576 bytes"
    )
    # Under the limit inserted, but over it once added to the literal arguments:
    tx = agenttx.Transaction(tools=[make, use])
    assert tx.execute_step(1, "make", {}).ok
    added = tx.execute_step(2, "use", {"a": "${steps.1.big}", "b": "y" * 600_000})
    assert added.error == "resolved arguments exceed 1048576 bytes"
    assert called == []
    assert tx.read("k") is None


def test_an_output_over_the_limit_fails_the_step_and_keeps_its_undo():
    """A huge output is a failed step: nothing stored, and the effect it reports is undone."""
    refunds: list[object] = []

    @agenttx.compensation(name="refund")
    def refund(payload: dict) -> None:
        refunds.append(payload["arguments"])

    @agenttx.tool(inline=True, compensate=refund)
    def charge(amount: int) -> dict:
        return {"receipt": "r" * 1_100_000}

    tx = agenttx.Transaction(tools=[charge, refund])
    result = tx.execute_step(1, "charge", {"amount": 3})
    assert result.error == "the output of tool 'charge' exceeds 1048576 bytes"
    assert refunds == [{"amount": 3}]
    assert tx.steps == ()


# ---------------------------------------------------------------- misuse gets typed errors


def test_misuse_raises_invalid_argument_naming_the_argument():
    """A non-store, a lone surrogate in agent_id and a non-int step id are InvalidArgument."""
    with pytest.raises(agenttx.InvalidArgument, match="store must be a Store"):
        agenttx.Transaction(store=object())  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="agent_id"):
        agenttx.Transaction(agent_id="\ud800")
    tx = agenttx.Transaction()
    with pytest.raises(agenttx.InvalidArgument, match="step_id must be an integer"):
        tx.execute_step("1", "x", {})  # type: ignore[arg-type]
    with pytest.raises(agenttx.StepOutOfOrder):
        tx.execute_step(2, "x", {})
    with pytest.raises(agenttx.InvalidArgument, match="step_timeout"):
        agenttx.Transaction(step_timeout=0)


# ---------------------------------------------------------------- identity, repr, observers


def test_a_transaction_compares_by_identity_and_its_repr_hides_arguments():
    """Two transactions are never equal; repr never shows an argument or an output."""

    @agenttx.tool(inline=True)
    def login(api_key: str) -> dict:
        return {"token": "tok-SECRET-OUT"}

    tx = agenttx.Transaction(tools=[login])
    assert tx.execute_step(1, "login", {"api_key": "sk-SECRET-IN"}).ok
    other = agenttx.Transaction(tools=[login])
    assert tx == tx  # noqa: PLR0124  (identity equality is the point)
    assert tx != other
    assert len({tx, other}) == 2
    assert "SECRET" not in repr(tx)
    assert "SECRET" not in str(tx)


def test_observers_do_not_wait_for_a_running_tool():
    """view(), history, graph and steps answer while a tool runs (they never take its lock)."""
    entered, release = threading.Event(), threading.Event()

    @agenttx.tool
    def slow() -> dict:
        entered.set()
        release.wait(10.0)
        return {}

    tx = agenttx.Transaction(tools=[slow])
    worker = threading.Thread(target=tx.execute_step, args=(1, "slow", {}))
    worker.start()
    try:
        assert entered.wait(10.0)
        answers: list[object] = []
        reader = threading.Thread(
            target=lambda: answers.extend([tx.view(), tx.history, tx.graph, tx.steps])
        )
        reader.start()
        reader.join(5.0)
        assert not reader.is_alive()
        assert answers[0].status is TxStatus.EXECUTING  # type: ignore[attr-defined]
    finally:
        release.set()
        worker.join(10.0)
    assert tx.status is TxStatus.ACTIVE
