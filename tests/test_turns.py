"""Calls that number themselves (`call`, `call_turn`) and the FIFO turn every call waits for."""

from __future__ import annotations

import asyncio
import itertools
import signal
import sys
import threading
import time

import pytest

import agenttx
from agenttx import RollbackStrategy, StepStatus, TxStatus, _turns
from agenttx._saga import Backoff
from agenttx._transaction import _turns as calls_of

N = 8


def _echo_tools(log: list[str] | None = None):
    @agenttx.tool(inline=True)
    def echo(n: int) -> dict:
        if log is not None:
            log.append(f"echo {n}")
        return {"n": n}

    @agenttx.tool(inline=True)
    def boom() -> dict:
        raise agenttx.ToolError("nope")

    return [echo, boom]


def _flaky(times: int):
    state = {"left": times, "runs": 0}

    @agenttx.tool(inline=True)
    def fetch() -> dict:
        state["runs"] += 1
        if state["left"] > 0:
            state["left"] -= 1
            raise agenttx.ToolError("upstream unavailable", transient=True)
        return {"ok": True}

    @agenttx.tool(inline=True)
    def first() -> dict:
        return {}

    return state, [fetch, first]


@pytest.fixture
def sleeps(monkeypatch):
    """Record the waits `call` and `acall` make, without waiting; a backoff without jitter."""
    waits: list[float] = []

    async def asleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(calls_of, "sleep", waits.append)
    monkeypatch.setattr(calls_of, "asleep", asleep)
    monkeypatch.setattr(calls_of, "RETRY_BACKOFF", Backoff(base=1.0, max_wait=10.0))
    return waits


# ---------------------------------------------------------------- call


def test_call_sends_the_next_step_itself():
    """Each call is the next step: 1, 2, 3, whatever the tool; the results say so."""
    tx = agenttx.Transaction(tools=_echo_tools())
    results = [tx.call("echo", {"n": n}) for n in range(3)]
    assert [r.step_id for r in results] == [1, 2, 3]
    assert [r.output for r in results] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert tx.next_step_id == 4


def test_call_records_the_call_id_on_the_step_and_the_result():
    """The provider's call id goes through `call` to the step and back on the result."""
    tx = agenttx.Transaction(tools=_echo_tools())
    assert tx.call("echo", {"n": 1}, call_id="call_1").call_id == "call_1"
    assert asyncio.run(tx.acall("echo", {"n": 2}, call_id="call_2")).call_id == "call_2"
    with pytest.raises(agenttx.InvalidArgument, match="call_id"):
        tx.call("echo", {"n": 3}, call_id=7)  # type: ignore[arg-type]
    assert tx.next_step_id == 3


def test_call_takes_json_text_and_references():
    """Arguments may be the model's JSON text, and may reference an earlier step's output."""
    tx = agenttx.Transaction(tools=_echo_tools())
    tx.call("echo", '{"n": 7}')
    assert tx.call("echo", {"n": "${steps.1.n}"}).output == {"n": 7}


def test_call_after_a_failure_sends_the_step_the_transaction_resumes_at():
    """After a rewind the next call is numbered from where the transaction resumed."""
    tx = agenttx.Transaction(tools=_echo_tools())
    tx.call("echo", {"n": 1})
    failed = tx.call("boom", {})
    assert not failed.ok
    assert tx.call("echo", {"n": 2}).step_id == failed.next_step_id


def test_call_on_an_ended_transaction_raises_like_execute_step():
    """Misuse raises: a call after commit is InvalidTransactionState, and changes nothing."""
    tx = agenttx.Transaction(tools=_echo_tools())
    tx.call("echo", {"n": 1})
    tx.commit()
    with pytest.raises(agenttx.InvalidTransactionState):
        tx.call("echo", {"n": 2})
    with pytest.raises(agenttx.InvalidTransactionState):
        asyncio.run(tx.acall("echo", {"n": 2}))


def test_call_resends_a_retry_decision_after_the_backoff(sleeps):
    """A transient failure decided RETRY is resent by `call` itself, after each backoff wait."""
    state, tools = _flaky(2)
    tx = agenttx.Transaction(tools=tools, policy=agenttx.RollbackPolicy(transient_retries=2))
    tx.call("first", {})
    result = tx.call("fetch", {})
    assert result.ok
    assert (result.step_id, result.next_step_id) == (2, 3)
    assert state["runs"] == 3
    assert sleeps == [1.0, 2.0]


def test_call_stops_resending_when_the_policy_stops_retrying(sleeps):
    """The controller bounds the retries: past `transient_retries` the result is not RETRY."""
    state, tools = _flaky(100)
    tx = agenttx.Transaction(tools=tools, policy=agenttx.RollbackPolicy(transient_retries=2))
    tx.call("first", {})
    result = tx.call("fetch", {})
    assert result.strategy is not RollbackStrategy.RETRY
    assert not result.ok
    assert state["runs"] == 3
    assert sleeps == [1.0, 2.0]


def test_acall_resends_a_retry_decision_after_an_async_backoff(sleeps):
    """`acall` resends a RETRY too, waiting through the async sleep."""
    state, tools = _flaky(1)
    tx = agenttx.Transaction(tools=tools)
    result = asyncio.run(tx.acall("fetch", {}))
    assert result.ok
    assert state["runs"] == 2
    assert sleeps == [1.0]


def test_the_default_retry_backoff_is_bounded_and_jittered():
    """The one retry backoff waits at most its cap, with jitter (never a thundering herd)."""
    backoff = _turns.RETRY_BACKOFF
    assert backoff.jitter
    assert all(0 <= backoff.delay(n) <= backoff.max_wait for n in range(1, 40))


# ---------------------------------------------------------------- call_turn


def test_call_turn_runs_in_order_and_stops_at_the_first_failure():
    """The calls after the first failure are not sent: NOT_RUN results, one per call, in order."""
    log: list[str] = []
    tx = agenttx.Transaction(tools=_echo_tools(log))
    results = tx.call_turn(
        [("echo", {"n": 1}, "c1"), ("boom", {}, "c2"), ("echo", {"n": 3}, "c3"), ("echo", {"n": 4})]
    )
    assert [r.status for r in results] == [
        StepStatus.SUCCESS,
        StepStatus.ROLLBACK_TRIGGERED,
        StepStatus.NOT_RUN,
        StepStatus.NOT_RUN,
    ]
    assert log == ["echo 1"]
    assert [r.call_id for r in results] == ["c1", "c2", "c3", None]
    not_run = results[2]
    assert not not_run.ok
    assert not_run.step_id == 0  # never sent: it claims no step number
    assert not_run.next_step_id == results[1].next_step_id == tx.next_step_id
    assert not_run.hint is not None
    assert "step 2 failed first" in not_run.hint.text
    assert not_run.error is not None
    assert not_run.error.startswith("Not run: step 2 failed first")
    payload = not_run.for_model()
    assert payload["ok"] is False
    assert payload["step"] is None
    assert payload["error"] == not_run.hint.text
    assert payload["next_step"] == tx.next_step_id
    assert payload["instruction"] == (
        "This call was not run because an earlier call of the turn failed: "
        f"send it again as step {tx.next_step_id} or later, if it is still needed."
    )


def test_call_turn_after_an_abort_says_the_transaction_aborted():
    """When the failure aborts the transaction, the NOT_RUN results say so."""
    tx = agenttx.Transaction(
        tools=_echo_tools(), policy=agenttx.RollbackPolicy(max_local_depth=0, max_global_resets=0)
    )
    results = tx.call_turn([("boom", {}), ("echo", {"n": 1})])
    assert results[0].status is StepStatus.FAILED
    assert tx.status is TxStatus.FAILED
    assert results[1].status is StepStatus.NOT_RUN
    assert results[1].error is not None
    assert "aborted" in results[1].error


def test_call_turn_accepts_turn_calls_and_tuples():
    """Items are (name, arguments), (name, arguments, call_id) or TurnCall, in one list."""
    tx = agenttx.Transaction(tools=_echo_tools())
    results = tx.call_turn(
        iter(
            [
                ("echo", {"n": 1}),
                ("echo", '{"n": 2}', "c2"),
                agenttx.TurnCall("echo", {"n": 3}, call_id="c3"),
            ]
        )
    )
    assert [r.output for r in results] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert [r.step_id for r in results] == [1, 2, 3]
    assert tx.call_turn([]) == ()


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ([("echo", {"n": 1}), ("echo",)], r"calls\[1\] must be a \(tool_name"),
        ([("echo", {"n": 1}), ["echo", {}]], r"calls\[1\] must be .* got list"),
        ([("echo", {"n": 1}), (3, {})], r"calls\[1\]: tool_name must be 1-128 characters"),
        ([("echo", {"n": 1}), ("", {})], r"calls\[1\]: tool_name must be 1-128"),
        ([("echo", {"n": 1}), ("e" * 129, {})], r"calls\[1\]: tool_name must be 1-128"),
        ([("echo", 5)], r"calls\[0\]: .*arguments must be a mapping or JSON text"),
        # every limit execute_step refuses a call for, checked before the first call runs
        (
            [("echo", {"n": 1}), ("echo", '{"n": "' + "x" * 1_048_576 + '"}')],
            r"calls\[1\]: arguments_json exceeds 1048576 bytes",
        ),
        (
            [("echo", {"n": 1}), ("echo", {"n": "x" * 1_048_576})],
            r"calls\[1\]: arguments exceed 1048576 bytes",
        ),
        (
            [("echo", {"n": 1}), ("echo", {"n": float("nan")})],
            r"not a JSON value in the arguments of calls\[1\] at \$\.n",
        ),
        ([("echo", {"n": 1}), ("echo", {"n": 1}, "c" * 257)], r"calls\[1\]: call_id must be"),
        ([("echo", {"n": 1}), ("echo", {"n": 1}, "\ud800")], r"calls\[1\]: call_id must be"),
        ([("echo", {}, "")], r"calls\[0\]: call_id must be 1-256 characters"),
        ([("echo", {}, 7)], r"calls\[0\]: call_id"),
        ("echo", "calls must be an iterable"),
        ({"echo": {}}, "calls must be an iterable"),
        (None, "calls must be an iterable"),
    ],
)
def test_call_turn_refuses_bad_items_before_running_any(calls, message):
    """A malformed item raises InvalidArgument naming it, and no call of the turn runs."""
    log: list[str] = []
    tx = agenttx.Transaction(tools=_echo_tools(log))
    with pytest.raises(agenttx.InvalidArgument, match=message):
        tx.call_turn(calls)
    with pytest.raises(agenttx.InvalidArgument, match=message):
        asyncio.run(tx.acall_turn(calls))
    assert log == []
    assert tx.next_step_id == 1


def test_a_turn_of_more_calls_than_the_limit_is_refused_before_any_runs():
    """A turn of more than MAX_CALLS_PER_TURN calls raises InvalidArgument naming the limit and
    the count, and none of its calls runs; a turn of exactly the limit runs."""
    log: list[str] = []
    tx = agenttx.Transaction(tools=_echo_tools(log))
    limit = _turns.MAX_CALLS_PER_TURN
    assert limit == 128
    too_many = [("echo", {"n": n}) for n in range(50_000)]
    message = rf"at most {limit} calls \(MAX_CALLS_PER_TURN\), got "
    with pytest.raises(agenttx.InvalidArgument, match=message + "50000$"):
        tx.call_turn(too_many)
    with pytest.raises(agenttx.InvalidArgument, match=message + "50000$"):
        asyncio.run(tx.acall_turn(too_many))

    def endless():  # read past the limit (a regression) fails here, instead of for ever
        for n in itertools.count():
            assert n <= limit, "the turn read past its limit"
            yield ("echo", {"n": n})

    with pytest.raises(agenttx.InvalidArgument, match=message + "more than that$"):
        tx.call_turn(endless())
    assert (log, tx.next_step_id) == ([], 1)
    results = tx.call_turn([("echo", {"n": n}) for n in range(limit)])
    assert [r.status for r in results] == [StepStatus.SUCCESS] * limit
    assert tx.next_step_id == limit + 1


def test_turn_call_checks_its_fields():
    """TurnCall is a frozen record checked on construction, as execute_step checks a call."""
    call = agenttx.TurnCall("echo", {"n": 1}, call_id="c1")
    assert (call.name, call.arguments, call.call_id) == ("echo", {"n": 1}, "c1")
    with pytest.raises(agenttx.InvalidArgument):
        agenttx.TurnCall("", {})
    with pytest.raises(agenttx.InvalidArgument, match="arguments exceed 1048576 bytes"):
        agenttx.TurnCall("echo", {"n": "x" * 1_048_576})
    with pytest.raises(agenttx.JSONValueError):
        agenttx.TurnCall("echo", {"n": {1, 2}})
    with pytest.raises(AttributeError):
        call.name = "other"  # type: ignore[misc]


def test_a_turn_raises_before_anything_ran_or_answers_every_call():
    """A refused call raises before the turn's first call runs (nothing lost); once the checks
    pass, every call gets a result, duplicate call ids and unknown tools included."""
    log: list[str] = []
    tx = agenttx.Transaction(tools=_echo_tools(log))
    assert tx.call("echo", {"n": 0}, call_id="c0").ok
    huge = {"n": "x" * 1_048_576}
    for turn in (tx.call_turn, lambda calls: asyncio.run(tx.acall_turn(calls))):
        with pytest.raises(agenttx.InvalidArgument, match=r"calls\[2\]"):
            turn([("echo", {"n": 1}, "c1"), ("echo", {"n": 2}, "c2"), ("echo", huge, "c3")])
        assert (log, tx.next_step_id, len(tx.history)) == (["echo 0"], 2, 1)
    results = tx.call_turn([("echo", {"n": 1}, "c1"), ("echo", {"n": 2}, "c1"), ("nope", {}, "c3")])
    assert [r.status for r in results] == [
        StepStatus.SUCCESS,
        StepStatus.ROLLBACK_TRIGGERED,
        StepStatus.NOT_RUN,
    ]
    assert [r.call_id for r in results] == ["c1", "c1", "c3"]
    assert log == ["echo 0", "echo 1"]


def test_acall_turn_stops_at_the_first_failure():
    """The async turn: same order, same NOT_RUN results."""
    log: list[str] = []
    tx = agenttx.Transaction(tools=_echo_tools(log))
    results = asyncio.run(tx.acall_turn([("echo", {"n": 1}), ("boom", {}), ("echo", {"n": 3})]))
    assert [r.status for r in results] == [
        StepStatus.SUCCESS,
        StepStatus.ROLLBACK_TRIGGERED,
        StepStatus.NOT_RUN,
    ]
    assert log == ["echo 1"]


# ---------------------------------------------------------------- serialization: threads


def _gate_tools():
    """A tool `hold` that blocks until `gate` is set, and a quick `echo`."""
    gate, entered = threading.Event(), threading.Event()

    @agenttx.tool(inline=True)
    def hold() -> dict:
        entered.set()
        assert gate.wait(10)
        return {}

    @agenttx.tool(inline=True)
    def echo(n: int) -> dict:
        return {"n": n}

    return gate, entered, [hold, echo]


def _queued(tx: agenttx.Transaction) -> int:
    return len(tx._calls._waiters)


def _wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_concurrent_calls_from_threads_run_one_at_a_time_in_arrival_order():
    """Threads that call while a call runs wait in a queue and are numbered in arrival order."""
    gate, entered, tools = _gate_tools()
    tx = agenttx.Transaction(tools=tools)
    holder = threading.Thread(target=tx.call, args=("hold", {}))
    holder.start()
    assert entered.wait(10)
    results: dict[int, agenttx.StepResult] = {}
    threads = []
    for n in range(N):
        thread = threading.Thread(
            target=lambda n=n: results.__setitem__(n, tx.call("echo", {"n": n}))
        )
        thread.start()
        threads.append(thread)
        _wait_until(lambda n=n: _queued(tx) == n + 1)  # thread n has arrived
    gate.set()
    for thread in [holder, *threads]:
        thread.join(10)
    assert all(results[n].ok for n in range(N))
    assert [results[n].step_id for n in range(N)] == list(range(2, N + 2))
    assert [s.step_id for s in tx.steps] == list(range(1, N + 2))
    assert _queued(tx) == 0


def test_many_threads_calling_at_once_all_succeed_with_consecutive_steps():
    """N threads released together: every call succeeds, the step ids are 1..N, none repeated."""
    tools = _echo_tools()
    tx = agenttx.Transaction(tools=tools)
    barrier = threading.Barrier(N)
    results: list[agenttx.StepResult] = []

    def run(n: int) -> None:
        barrier.wait()
        results.append(tx.call("echo", {"n": n}))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(N)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert all(r.ok for r in results)
    assert sorted(r.step_id for r in results) == list(range(1, N + 1))
    assert {s.step_id: s.output for s in tx.steps} == {r.step_id: r.output for r in results}


def test_execute_step_with_a_stale_step_id_still_raises_when_its_turn_comes():
    """A queued execute_step whose step id was taken meanwhile gets StepOutOfOrder, not a new id."""
    gate, entered, tools = _gate_tools()
    tx = agenttx.Transaction(tools=tools)
    holder = threading.Thread(target=tx.execute_step, args=(1, "hold", {}))
    holder.start()
    assert entered.wait(10)
    errors: list[BaseException] = []

    def stale() -> None:
        try:
            tx.execute_step(1, "echo", {"n": 1})
        except agenttx.StepOutOfOrder as exc:
            errors.append(exc)

    thread = threading.Thread(target=stale)
    thread.start()
    _wait_until(lambda: _queued(tx) == 1)
    gate.set()
    holder.join(10)
    thread.join(10)
    assert len(errors) == 1
    assert (errors[0].expected, errors[0].got) == (2, 1)
    assert tx.next_step_id == 2


def test_the_idle_reaper_skips_a_busy_transaction_without_counting_as_activity():
    """abort_if_idle never waits for a running call, and a refusal leaves `last_activity` alone."""
    gate, entered, tools = _gate_tools()
    tx = agenttx.Transaction(tools=tools)
    holder = threading.Thread(target=tx.call, args=("hold", {}))
    holder.start()
    assert entered.wait(10)
    before = tx.last_activity
    assert tx.abort_if_idle(0.0) is False
    assert tx.last_activity == before
    gate.set()
    holder.join(10)
    last = tx.last_activity
    assert tx.abort_if_idle(3600.0) is False  # not idle long enough
    assert tx.last_activity == last
    assert tx.abort_if_idle(0.0) is True
    assert tx.status is TxStatus.ROLLED_BACK


def test_a_tool_calling_back_into_its_transaction_is_refused_not_deadlocked():
    """A call from inside a running step (same thread) raises InvalidTransactionState at once."""
    seen: list[BaseException] = []
    tx: agenttx.Transaction

    @agenttx.tool(inline=True)
    def nested() -> dict:
        try:
            tx.call("nested", {})
        except agenttx.InvalidTransactionState as exc:
            seen.append(exc)
        return {}

    tx = agenttx.Transaction(tools=[nested])
    assert tx.call("nested", {}).ok
    assert len(seen) == 1
    assert tx.next_step_id == 2


# ---------------------------------------------------------------- serialization: tasks


def _async_gate_tools():
    @agenttx.tool
    async def hold(gate: str) -> dict:
        await GATES[gate].wait()
        return {}

    @agenttx.tool
    async def aecho(n: int) -> dict:
        await asyncio.sleep(0)
        return {"n": n}

    return [hold, aecho]


GATES: dict[str, asyncio.Event] = {}


def test_concurrent_tasks_run_one_at_a_time_in_arrival_order():
    """N tasks calling at once all succeed, numbered in the order they arrived."""
    tx = agenttx.Transaction(tools=_async_gate_tools())

    async def main() -> list[agenttx.StepResult]:
        return await asyncio.gather(*(tx.acall("aecho", {"n": n}) for n in range(N)))

    results = asyncio.run(main())
    assert all(r.ok for r in results)
    assert [r.step_id for r in results] == list(range(1, N + 1))
    assert [r.output for r in results] == [{"n": n} for n in range(N)]


def test_concurrent_aexecute_step_waits_instead_of_raising():
    """Two aexecute_step calls at once: the second waits for the first, then runs."""
    tx = agenttx.Transaction(tools=_async_gate_tools())

    async def main() -> list[agenttx.StepResult]:
        return await asyncio.gather(
            tx.aexecute_step(1, "aecho", {"n": 1}), tx.aexecute_step(2, "aecho", {"n": 2})
        )

    first, second = asyncio.run(main())
    assert (first.ok, second.ok) == (True, True)
    assert (first.step_id, second.step_id) == (1, 2)


def test_a_stale_aexecute_step_raises_step_out_of_order_when_its_turn_comes():
    """Two tasks sending step 1: the second gets StepOutOfOrder, never a new number."""
    tx = agenttx.Transaction(tools=_async_gate_tools())

    async def main() -> list[object]:
        return await asyncio.gather(
            tx.aexecute_step(1, "aecho", {"n": 1}),
            tx.aexecute_step(1, "aecho", {"n": 2}),
            return_exceptions=True,
        )

    first, second = asyncio.run(main())
    assert isinstance(first, agenttx.StepResult)
    assert first.ok
    assert isinstance(second, agenttx.StepOutOfOrder)


def test_a_task_cancelled_while_queued_leaves_the_queue():
    """Cancelling a waiting task removes it; the next waiter runs, numbered after the holder."""
    tx = agenttx.Transaction(tools=_async_gate_tools())

    async def main() -> tuple[agenttx.StepResult, BaseException | None, agenttx.StepResult]:
        GATES["a"] = asyncio.Event()
        holder = asyncio.create_task(tx.acall("hold", {"gate": "a"}))
        await asyncio.sleep(0.01)
        cancelled = asyncio.create_task(tx.acall("aecho", {"n": 1}))
        waiter = asyncio.create_task(tx.acall("aecho", {"n": 2}))
        await asyncio.sleep(0.01)
        assert _queued(tx) == 2
        cancelled.cancel()
        await asyncio.sleep(0.01)
        assert _queued(tx) == 1
        GATES["a"].set()
        first, last = await holder, await waiter
        error = None
        try:
            await cancelled
        except asyncio.CancelledError as exc:
            error = exc
        return first, error, last

    first, error, last = asyncio.run(main())
    assert isinstance(error, asyncio.CancelledError)
    assert (first.step_id, last.step_id) == (1, 2)
    assert last.output == {"n": 2}
    assert _queued(tx) == 0
    assert not tx._calls.busy


def test_a_task_cancelled_as_the_turn_reaches_it_passes_the_turn_on():
    """A waiter cancelled after it was handed the turn hands it to the next; nothing wedges."""
    tx = agenttx.Transaction(tools=_async_gate_tools())

    async def main() -> agenttx.StepResult:
        GATES["b"] = asyncio.Event()
        holder = asyncio.create_task(tx.acall("hold", {"gate": "b"}))
        await asyncio.sleep(0.01)
        doomed = asyncio.create_task(tx.acall("aecho", {"n": 1}))
        waiter = asyncio.create_task(tx.acall("aecho", {"n": 2}))
        await asyncio.sleep(0.01)
        GATES["b"].set()
        await holder  # its end hands the turn to `doomed`, whose task has not run yet
        doomed.cancel()
        result = await waiter
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return result

    result = asyncio.run(main())
    assert (result.step_id, result.output) == (2, {"n": 2})
    assert not tx._calls.busy


def test_a_task_waits_for_a_thread_without_blocking_its_loop():
    """While a thread holds the turn, a task's acall waits and the loop keeps running."""
    gate, entered, tools = _gate_tools()
    tx = agenttx.Transaction(tools=tools)
    holder = threading.Thread(target=tx.call, args=("hold", {}))
    holder.start()
    assert entered.wait(10)

    async def main() -> tuple[agenttx.StepResult, int]:
        task = asyncio.create_task(tx.acall("echo", {"n": 5}))
        ticks = 0
        while _queued(tx) == 0:  # noqa: ASYNC110  (the queue has no event to wait on)
            await asyncio.sleep(0.001)
        for _ in range(5):  # the loop is free while the task waits
            await asyncio.sleep(0.001)
            ticks += 1
        gate.set()
        return await task, ticks

    result, ticks = asyncio.run(main())
    holder.join(10)
    assert ticks == 5
    assert (result.ok, result.step_id) == (True, 2)


def test_a_thread_waits_for_a_task():
    """While a task holds the turn, a thread's call waits, then runs after it."""
    tx = agenttx.Transaction(tools=_async_gate_tools())
    results: list[agenttx.StepResult] = []

    async def main() -> agenttx.StepResult:
        GATES["c"] = asyncio.Event()
        holder = asyncio.create_task(tx.acall("hold", {"gate": "c"}))
        await asyncio.sleep(0.01)
        thread = threading.Thread(target=lambda: results.append(tx.call("aecho", {"n": 1})))
        thread.start()
        while _queued(tx) == 0:  # noqa: ASYNC110  (the queue has no event to wait on)
            await asyncio.sleep(0.001)
        GATES["c"].set()
        first = await holder
        await asyncio.to_thread(thread.join, 10)
        return first

    first = asyncio.run(main())
    assert first.step_id == 1
    assert [(r.ok, r.step_id) for r in results] == [(True, 2)]


def test_a_sync_call_from_a_sibling_task_is_refused_instead_of_deadlocking_the_loop():
    """A sync call on the loop's thread while a task holds the turn raises, never blocks."""
    tx = agenttx.Transaction(tools=_async_gate_tools())

    async def main() -> None:
        GATES["d"] = asyncio.Event()
        holder = asyncio.create_task(tx.acall("hold", {"gate": "d"}))
        await asyncio.sleep(0.01)
        with pytest.raises(agenttx.InvalidTransactionState, match="await the async method"):
            tx.call("aecho", {"n": 1})
        GATES["d"].set()
        assert (await holder).ok

    asyncio.run(main())
    assert tx.next_step_id == 2


def test_threads_and_tasks_on_several_loops_share_one_transaction():
    """Threads calling and tasks on two event loops calling, all at once: every call succeeds,
    the step ids are 1..total with none repeated, and each caller's own calls stay in order."""
    tx = agenttx.Transaction(tools=_async_gate_tools())
    per_caller, lock = 15, threading.Lock()
    seen: dict[str, list[int]] = {}

    def record(caller: str, result: agenttx.StepResult) -> None:
        assert result.ok, result
        with lock:
            seen.setdefault(caller, []).append(result.step_id)

    def thread_caller(name: str) -> None:
        for n in range(per_caller):
            record(name, tx.call("aecho", {"n": n}))

    def loop_caller(name: str) -> None:
        async def one(task: str) -> None:
            for n in range(per_caller):
                record(task, await tx.acall("aecho", {"n": n}))

        async def main() -> None:
            await asyncio.gather(one(f"{name}-a"), one(f"{name}-b"))

        asyncio.run(main())

    threads = [threading.Thread(target=thread_caller, args=(f"t{i}",)) for i in range(3)]
    threads += [threading.Thread(target=loop_caller, args=(f"loop{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    total = per_caller * (3 + 2 * 2)
    assert sorted(step for steps in seen.values() for step in steps) == list(range(1, total + 1))
    assert all(steps == sorted(steps) for steps in seen.values())
    assert not tx._calls.busy


@pytest.mark.skipif(sys.platform == "win32", reason="needs pthread_kill")
def test_a_thread_interrupted_while_queued_leaves_the_queue():
    """A KeyboardInterrupt in a waiting thread takes it out of the queue; the turn still works."""
    gate, entered, tools = _gate_tools()
    tx = agenttx.Transaction(tools=tools)
    holder = threading.Thread(target=tx.call, args=("hold", {}))
    holder.start()
    assert entered.wait(10)

    def interrupt_once_queued() -> None:
        _wait_until(lambda: _queued(tx) == 1)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]

    threading.Thread(target=interrupt_once_queued).start()
    with pytest.raises(KeyboardInterrupt):
        tx.call("echo", {"n": 1})  # the main thread waits here until interrupted
    assert _queued(tx) == 0
    gate.set()
    holder.join(10)
    assert tx.call("echo", {"n": 2}).step_id == 2
    assert not tx._calls.busy


# ---------------------------------------------------------------- call ids and turns


def test_a_call_outside_call_turn_is_a_turn_of_its_own_so_it_may_reuse_a_call_id():
    """`call`, `acall`, `execute_step` and `aexecute_step` are each a turn: a later one may
    send the call id of a live step of an earlier one, and the step records it."""
    log: list[str] = []
    tx = agenttx.Transaction(tools=_echo_tools(log))
    assert tx.call("echo", {"n": 1}, call_id="call_0").ok
    assert asyncio.run(tx.acall("echo", {"n": 2}, call_id="call_0")).ok
    assert tx.execute_step(3, "echo", {"n": 3}, call_id="call_0").ok
    assert asyncio.run(tx.aexecute_step(4, "echo", {"n": 4}, call_id="call_0")).ok
    assert [(s.step_id, s.call_id) for s in tx.steps] == [(n, "call_0") for n in (1, 2, 3, 4)]
    assert log == ["echo 1", "echo 2", "echo 3", "echo 4"]


def test_a_later_call_turn_may_reuse_the_ids_of_an_earlier_one():
    """Two `call_turn`s that both number their calls `call_0`, `call_1`: every call runs, and
    the steps and the history keep each step's call id."""
    log: list[str] = []
    tx = agenttx.Transaction(tools=_echo_tools(log))
    ids = ("call_0", "call_1")
    for turn in (tx.call_turn, lambda calls: asyncio.run(tx.acall_turn(calls))):
        results = turn([("echo", {"n": len(log) + i}, cid) for i, cid in enumerate(ids)])
        assert all(r.ok for r in results)
    assert [s.call_id for s in tx.steps] == ["call_0", "call_1", "call_0", "call_1"]
    (failed,) = tx.call_turn([("boom", {}, "call_0")])  # a new turn: the id is free
    assert (failed.call_id, failed.voided_steps, failed.voided_call_ids) == (
        "call_0",
        (4,),
        ("call_1",),
    )
    tx.rollback(to_step=1)
    assert [(a.step_id, a.call_id, a.status.value) for a in tx.history if a.step_id < 4] == [
        (1, "call_0", "rewound"),
        (2, "call_1", "rewound"),
        (3, "call_0", "rewound"),
    ]


def test_a_call_id_sent_twice_in_one_turn_is_a_mistake_in_both_forms():
    """Within one `call_turn` (or `acall_turn`) a call id a live step of the turn has fails
    the call as a mistake (RESEND), and the rest of the turn is not run."""
    for sync in (True, False):
        log: list[str] = []
        tx = agenttx.Transaction(tools=_echo_tools(log))
        calls = [("echo", {"n": 1}, "c"), ("echo", {"n": 2}, "c"), ("echo", {"n": 3}, "d")]
        results = tx.call_turn(calls) if sync else asyncio.run(tx.acall_turn(calls))
        assert [r.status for r in results] == [
            StepStatus.SUCCESS,
            StepStatus.ROLLBACK_TRIGGERED,
            StepStatus.NOT_RUN,
        ]
        assert results[1].strategy is RollbackStrategy.RESEND
        assert results[1].hint is not None
        assert results[1].hint.rule == "duplicate_call_id"
        assert log == ["echo 1"]
