"""Worker threads for blocking tools: results, errors, deadlines, reuse, context variables."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from agenttx._tools import _workers
from agenttx._tools._workers import DeadlineExceeded, acall_with_deadline, call_with_deadline

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
