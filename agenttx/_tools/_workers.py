"""Worker threads that run blocking tools under a deadline the caller can walk away from.

A sync function cannot be interrupted from outside in Python, so a tool that must not hold the
caller past its step timeout runs on a worker thread while the caller waits with a timeout.
If the deadline passes, the caller returns and the worker is left to finish on its own; the
transaction fences the tool's context first, so whatever the tool does afterwards is refused.

Workers are daemon threads kept in a small idle pool and reused: a handoff costs tens of
microseconds (two thread switches), creating a thread costs more. A worker stuck in a tool that
never returns is simply never reused; the pool creates another when it needs one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import os
import threading
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeGuard, TypeVar, cast

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = [
    "DeadlineExceeded",
    "Running",
    "acall_with_deadline",
    "call_with_deadline",
    "is_awaitable",
    "resolve_awaitable",
]

T = TypeVar("T")

#: Idle workers kept for reuse; more are created on demand and end when the pool is full.
MAX_IDLE_WORKERS: Final = 32


class DeadlineExceeded(Exception):
    """The function was still running at its deadline; it goes on, on its worker.

    `running` is its call, to wait for it or read its outcome once it has finished.
    """

    def __init__(self, running: Running) -> None:
        super().__init__("deadline exceeded")
        self.running = running


class Running(Protocol):
    """A call that outlived its deadline and may still be running."""

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the call to finish; return whether it has."""
        ...

    def outcome(self) -> object:
        """The call's result once it has finished; raises what the call raised."""
        ...


class _Job(Generic[T]):
    """One call: the function, its context variables, and its result or exception."""

    __slots__ = ("context", "done", "error", "fn", "notify", "result")

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.context = contextvars.copy_context()  # the tool sees the caller's context vars
        self.done = threading.Lock()
        self.done.acquire()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.notify: Callable[[], None] | None = None

    def run(self) -> None:
        try:
            self.result = self.context.run(self.fn)
        except BaseException as exc:  # noqa: BLE001  (handed to the caller, who re-raises it)
            self.error = exc
        self.done.release()
        if self.notify is not None:
            self.notify()

    def wait(self, timeout: float) -> bool:
        if not self.done.acquire(timeout=max(timeout, 0.0)):
            return False
        self.done.release()
        return True

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return cast("T", self.result)  # run set it, since there was no error


class _Worker:
    __slots__ = ("_go", "_job")

    def __init__(self) -> None:
        self._go = threading.Lock()
        self._go.acquire()
        self._job: _Job[Any] | None = None
        threading.Thread(target=self._loop, name="agenttx-tool", daemon=True).start()

    def start(self, job: _Job[Any]) -> None:
        self._job = job
        self._go.release()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            job, self._job = self._job, None
            assert job is not None
            job.run()
            del job  # drop the result before waiting for the next job
            if len(_idle) >= MAX_IDLE_WORKERS:
                return
            _idle.append(self)


_idle: list[_Worker] = []  # list.append and list.pop are atomic: no lock needed


def _start(job: _Job[Any]) -> None:
    try:
        worker = _idle.pop()
    except IndexError:
        worker = _Worker()
    worker.start(job)


def call_with_deadline(fn: Callable[[], T], timeout: float) -> T:
    """Call `fn` on a worker thread; return its result or re-raise its exception.

    Raises `DeadlineExceeded` if it has not returned after `timeout` seconds. If the wait is
    interrupted (a `KeyboardInterrupt` in the main thread), that propagates at once; in both
    cases `fn` keeps running on its worker.
    """
    job: _Job[T] = _Job(fn)
    _start(job)
    if not job.done.acquire(timeout=timeout):
        raise DeadlineExceeded(job)
    return job.outcome()


async def acall_with_deadline(fn: Callable[[], T], timeout: float) -> T:
    """`call_with_deadline` for async code: the event loop keeps running while `fn` does.

    A cancellation of the awaiting task propagates at once, leaving `fn` running.
    """
    loop = asyncio.get_running_loop()
    finished = loop.create_future()

    def notify() -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
            loop.call_soon_threadsafe(_settle, finished)

    job: _Job[T] = _Job(fn)
    job.notify = notify
    _start(job)
    done, _ = await asyncio.wait((finished,), timeout=timeout)
    if not done:
        raise DeadlineExceeded(job)
    return job.outcome()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# A forked child has none of its parent's threads: its pool starts empty.
os.register_at_fork(after_in_child=_idle.clear)


_PLAIN: Final = frozenset({dict, list, str, int, float, bool})


def is_awaitable(value: object) -> TypeGuard[Awaitable[object]]:
    """`inspect.isawaitable`, answered at once for the plain JSON values tools mostly return."""
    return value is not None and type(value) not in _PLAIN and inspect.isawaitable(value)


def resolve_awaitable(value: object) -> object:
    """Run `value` to completion if it is awaitable, from synchronous code.

    With no event loop running in this thread the awaitable runs on a fresh loop; inside a
    running loop (sync code called from async code) it runs on a loop in a helper thread, so
    the caller's loop is never re-entered.
    """
    if not is_awaitable(value):
        return value
    awaitable: Awaitable[object] = value

    async def wait() -> object:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()
