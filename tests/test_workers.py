"""Worker threads for blocking tools: results, errors, deadlines, reuse, context variables."""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

from agenttx._tools import _workers
from agenttx._tools._workers import DeadlineExceeded, acall_with_deadline, call_with_deadline

if TYPE_CHECKING:
    from collections.abc import Callable

COLOUR: contextvars.ContextVar[str] = contextvars.ContextVar("colour", default="none")


def test_returns_the_result_and_runs_on_another_thread():
    """The function runs on a worker thread and its result comes back."""
    caller = threading.get_ident()
    assert call_with_deadline(lambda: threading.get_ident() != caller, 5.0) is True


def test_reraises_exceptions_including_base_exceptions():
    """Whatever the function raises is raised in the caller, SystemExit included."""

    def fail() -> None:
        raise ValueError("boom")

    def leave() -> None:
        raise SystemExit(3)

    with pytest.raises(ValueError, match="boom"):
        call_with_deadline(fail, 5.0)
    with pytest.raises(SystemExit):
        call_with_deadline(leave, 5.0)


def test_a_function_past_its_deadline_is_left_running():
    """At the deadline the caller gets DeadlineExceeded; the function finishes on its own."""
    release, finished = threading.Event(), threading.Event()

    def hang() -> None:
        release.wait(5.0)
        finished.set()

    with pytest.raises(DeadlineExceeded):
        call_with_deadline(hang, 0.02)
    assert not finished.is_set()
    release.set()
    assert finished.wait(5.0)


@pytest.mark.timeout(30)
def test_a_late_call_runs_its_return_callback_once_before_its_wait_says_it_returned():
    """`on_return` on a call walked away from: its callback runs once, on the worker as the
    call returns and before `wait` says so; registered after the return, at once."""
    release = threading.Event()
    seen: list[tuple[str, object]] = []

    with pytest.raises(DeadlineExceeded) as caught:
        call_with_deadline(lambda: release.wait(10.0) and "landed", 0.02)
    running = caught.value.running

    def callback() -> None:
        seen.append((threading.current_thread().name, running.outcome()))

    running.on_return(callback)
    assert seen == []
    release.set()
    assert running.wait(10.0)
    assert seen == [("agenttx-tool", "landed")]  # done before the wait returned
    later: list[str] = []
    running.on_return(lambda: later.append(threading.current_thread().name))
    assert later == [threading.current_thread().name]
    assert seen == [("agenttx-tool", "landed")]


def test_context_variables_travel_with_the_call():
    """The function sees the caller's context variables, as asyncio.to_thread does."""
    token = COLOUR.set("blue")
    try:
        assert call_with_deadline(COLOUR.get, 5.0) == "blue"
    finally:
        COLOUR.reset(token)


def test_idle_workers_are_reused():
    """Sequential calls reuse one idle worker rather than starting a thread each."""
    call_with_deadline(lambda: None, 5.0)
    before = threading.active_count()
    idents = {call_with_deadline(threading.get_ident, 5.0) for _ in range(50)}
    assert len(idents) == 1
    assert threading.active_count() == before


def test_the_idle_pool_is_bounded(monkeypatch):
    """A worker finding the idle pool full ends instead of waiting for more work."""
    monkeypatch.setattr(_workers, "MAX_IDLE_WORKERS", 0)
    monkeypatch.setattr(_workers, "_idle", [])
    worker = call_with_deadline(threading.current_thread, 5.0)
    worker.join(5.0)
    assert not worker.is_alive()
    assert _workers._idle == []


def test_async_variant_keeps_the_loop_running():
    """While the function blocks, other coroutines on the loop make progress."""
    release = threading.Event()
    ticks = []

    async def ticker() -> None:
        for _ in range(3):
            ticks.append(1)
            await asyncio.sleep(0)
        release.set()

    async def main() -> str:
        waiter = asyncio.ensure_future(ticker())
        result = await acall_with_deadline(lambda: "done" if release.wait(5.0) else "late", 5.0)
        await waiter
        return result

    assert asyncio.run(main()) == "done"
    assert ticks == [1, 1, 1]


def test_async_variant_deadline_and_errors():
    """The async variant raises DeadlineExceeded at the deadline and re-raises errors."""
    release = threading.Event()

    def fail() -> None:
        raise KeyError("k")

    async def main() -> None:
        with pytest.raises(DeadlineExceeded):
            await acall_with_deadline(lambda: release.wait(5.0), 0.02)
        with pytest.raises(KeyError):
            await acall_with_deadline(fail, 5.0)

    asyncio.run(main())
    release.set()


def test_a_worker_outliving_its_loop_does_not_fail():
    """A function still running when its event loop closes finishes quietly."""
    release, finished = threading.Event(), threading.Event()

    def hang() -> None:
        release.wait(5.0)
        finished.set()

    async def main() -> None:
        with pytest.raises(DeadlineExceeded):
            await acall_with_deadline(hang, 0.01)

    asyncio.run(main())  # the loop is closed when main returns
    release.set()
    assert finished.wait(5.0)


def test_the_caller_puts_the_worker_back_before_returning(monkeypatch):
    """When the call returns, its worker is already idle in the pool, ready for the next."""
    monkeypatch.setattr(_workers, "_idle", [])
    worker = call_with_deadline(threading.current_thread, 5.0)
    assert len(_workers._idle) == 1
    assert call_with_deadline(threading.current_thread, 5.0) is worker


def test_a_worker_walked_away_from_is_reused_only_once_it_returns(monkeypatch):
    """A worker still in a call its caller left is not in the pool; it rejoins when done."""
    monkeypatch.setattr(_workers, "_idle", [])
    release = threading.Event()
    hung: list[threading.Thread] = []

    def hang() -> None:
        hung.append(threading.current_thread())
        release.wait(5.0)

    with pytest.raises(DeadlineExceeded):
        call_with_deadline(hang, 0.02)
    assert _workers._idle == []
    assert call_with_deadline(threading.current_thread, 5.0) is not hung[0]
    assert len(_workers._idle) == 1
    release.set()
    assert _wait_for(lambda: len(_workers._idle) == 2)
    assert call_with_deadline(lambda: "fresh", 5.0) == "fresh"  # no stale outcome left behind


def test_outcomes_never_cross_calls_when_calls_end_at_their_deadline():
    """Calls that return right at their deadline yield their own result or DeadlineExceeded."""
    results = []
    for i in range(300):
        try:
            results.append(call_with_deadline(lambda i=i: i, 1e-6 * (i % 30)))
        except DeadlineExceeded:
            results.append(None)
    assert all(result in {i, None} for i, result in enumerate(results))
    assert [call_with_deadline(lambda i=i: i, 5.0) for i in range(50)] == list(range(50))
    assert _wait_for(lambda: len(set(map(id, _workers._idle))) == len(_workers._idle))


def test_a_forked_child_starts_with_an_empty_pool():
    """After fork the child has none of its parent's workers, and calls still work there."""
    code = (
        "import os, sys\n"
        "from agenttx._tools import _workers\n"
        "_workers.call_with_deadline(lambda: None, 5.0)\n"
        "assert len(_workers._idle) == 1\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = _workers._idle == [] and _workers.call_with_deadline(lambda: 7, 5.0) == 7\n"
        "    os._exit(0 if ok else 1)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.exit(os.waitstatus_to_exitcode(status))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr


def test_async_cancellation_walks_away_and_the_worker_rejoins_later(monkeypatch):
    """Cancelling the awaiting task propagates; the worker rejoins the pool when fn returns."""
    monkeypatch.setattr(_workers, "_idle", [])
    release, started = threading.Event(), threading.Event()

    def hang() -> str:
        started.set()
        release.wait(5.0)
        return "late"

    async def main() -> None:
        task = asyncio.ensure_future(acall_with_deadline(hang, 5.0))
        await asyncio.to_thread(started.wait, 5.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await acall_with_deadline(lambda: "next", 5.0) == "next"

    asyncio.run(main())
    assert len(_workers._idle) == 1
    release.set()
    assert _wait_for(lambda: len(_workers._idle) == 2)


def test_async_results_come_back_on_the_same_pool(monkeypatch):
    """The async variant returns its worker to the pool, where sync calls reuse it."""
    monkeypatch.setattr(_workers, "_idle", [])

    async def main() -> threading.Thread:
        return await acall_with_deadline(threading.current_thread, 5.0)

    worker = asyncio.run(main())
    assert _workers._idle != []
    assert call_with_deadline(threading.current_thread, 5.0) is worker


def _wait_for(condition: Callable[[], bool]) -> bool:
    """Poll `condition` for up to 5 s (for a worker finishing on its own thread)."""
    for _ in range(5000):
        if condition():
            return True
        time.sleep(0.001)
    return condition()


class _LateClaim:
    """The caller's side of a worker's claim lock, made to lose the race it settles.

    It lets the worker take the claim first (the call has returned) before trying it itself:
    the moment a caller gives up on a call that returns just then.
    """

    def __init__(self, claim: threading.Lock) -> None:
        self.claim = claim

    def acquire(self, blocking: bool = True) -> bool:
        assert _wait_for(self.claim.locked)
        return self.claim.acquire(blocking=False)

    def release(self) -> None:
        self.claim.release()


@pytest.fixture
def worker(monkeypatch):
    """The only idle worker, its loop started: a test may swap the caller's side of its locks."""
    monkeypatch.setattr(_workers, "_idle", [])
    call_with_deadline(lambda: None, 5.0)
    [worker] = _workers._idle
    done, claim = worker._done, worker._claim
    yield worker
    worker._done, worker._claim = done, claim


@pytest.fixture
def late_worker(worker):
    """The only idle worker, whose caller always loses the race to its call's return."""
    worker._claim = _LateClaim(worker._claim)
    return worker


class _InterruptedWait:
    """The caller's side of a worker's `done` lock, whose timed wait raises KeyboardInterrupt.

    As a Ctrl-C does: either while the call runs (once it has started), or, for a signal that
    arrived just before the wait blocked, only after the wait has taken the lock.
    """

    def __init__(self, done: threading.Lock, started: threading.Event | None) -> None:
        self.done, self.started, self.held = done, started, False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if timeout == -1:  # an untimed wait: for a call known to have returned
            assert not self.held, "waiting for a lock this thread holds: a deadlock"
            return self.done.acquire(blocking)
        if self.started is None:
            self.held = self.done.acquire()
        else:
            assert self.started.wait(5.0)
        raise KeyboardInterrupt

    def release(self) -> None:
        self.done.release()


def test_a_keyboard_interrupt_while_waiting_propagates(worker):
    """Ctrl-C during the wait reaches the caller; the busy worker rejoins only once it returns."""
    started, release = threading.Event(), threading.Event()
    worker._done = _InterruptedWait(worker._done, started)

    def hang() -> None:
        started.set()
        release.wait(5.0)

    with pytest.raises(KeyboardInterrupt):
        call_with_deadline(hang, 5.0)
    assert _workers._idle == []
    release.set()
    assert _wait_for(lambda: _workers._idle == [worker])


def test_a_keyboard_interrupt_raised_after_the_wait_ends_the_worker(worker):
    """A Ctrl-C raised once the call has returned propagates; the worker ends, nothing hangs."""
    worker._done = _InterruptedWait(worker._done, None)
    ran: list[threading.Thread] = []
    with pytest.raises(KeyboardInterrupt):
        call_with_deadline(lambda: ran.append(threading.current_thread()), 5.0)
    ran[0].join(5.0)
    assert not ran[0].is_alive()
    assert _workers._idle == []
    assert call_with_deadline(lambda: "fresh", 5.0) == "fresh"


def test_a_call_returning_as_its_deadline_passes_gives_its_result(late_worker):
    """If the call returns while its caller gives up, the caller takes the result after all."""
    assert call_with_deadline(lambda: time.sleep(0.05) or "made it", 0.001) == "made it"
    assert _workers._idle == [late_worker]


def test_async_races_with_the_call_returning(late_worker):
    """Async: a deadline or a cancellation as the call returns ends with the worker freed."""

    async def main() -> None:
        assert await acall_with_deadline(lambda: time.sleep(0.05) or "made it", 0.001) == "made it"
        task = asyncio.ensure_future(acall_with_deadline(lambda: time.sleep(0.05), 5.0))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert _workers._idle == [late_worker]


# --- the watchdog ----------------------------------------------------------------------------


def test_alarms_fire_once_in_due_order_on_one_thread():
    """Alarms run when due, earliest first, each once, all on the one watchdog thread."""
    fired: list[tuple[str, int]] = []
    done = threading.Event()

    def note(name: str) -> None:
        fired.append((name, threading.get_ident()))
        if len(fired) == 3:
            done.set()

    _workers.alarm_after(0.06, note, "late")
    _workers.alarm_after(0.02, note, "early")
    alarm = _workers.alarm_after(0.04, note, "middle")
    assert done.wait(5.0)
    assert [name for name, _ in fired] == ["early", "middle", "late"]
    assert len({thread for _, thread in fired}) == 1
    assert fired[0][1] != threading.get_ident()
    alarm.fire()  # an alarm that has run does not run again
    assert len(fired) == 3


def test_a_cancelled_alarm_never_runs_and_cancelled_ones_are_compacted():
    """Cancelling keeps the callback from running; a flood of cancelled alarms does not keep
    the heap growing, and live alarms survive the compaction."""
    fired: list[int] = []
    done = threading.Event()
    for index in range(3000):
        _workers.alarm_after(60.0, fired.append, index).cancel()
    _workers.alarm_after(0.01, done.set)
    assert done.wait(5.0)
    assert fired == []
    assert len(_workers._watchdog._heap) < 2100


def test_a_forked_child_gets_a_watchdog_of_its_own():
    """After a fork, alarms still fire in the child (the parent's thread is not there)."""
    _workers.alarm_after(0.0, lambda: None)  # the parent's watchdog thread is running
    code = (
        "import os, sys, threading\n"
        "from agenttx._tools import _workers\n"
        "_workers.alarm_after(0.0, lambda: None)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    done = threading.Event()\n"
        "    _workers.alarm_after(0.01, done.set)\n"
        "    os._exit(0 if done.wait(5.0) else 1)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.exit(os.waitstatus_to_exitcode(status))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
