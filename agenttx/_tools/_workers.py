"""Worker threads that run blocking tools under a deadline the caller can walk away from.

A sync function cannot be interrupted from outside in Python, so a tool that must not hold the
caller past its step timeout runs on a worker thread while the caller waits with a timeout.
If the deadline passes, the caller returns and the worker is left to finish on its own; the
transaction fences the tool's context first, so whatever the tool does afterwards is refused.

Workers are daemon threads kept in a small idle pool and reused. A handoff is one lock round
trip between two threads: the caller releases the worker's `go` lock and waits on its `done`
lock; the worker runs the call, releases `done` and at once waits on `go` again. Everything
else (taking the worker from the pool, putting it back, dropping the result) is done by the
caller, so that once the worker wakes its caller it holds the interpreter lock for only a few
more instructions, and the woken caller seldom has to wait for it.
A worker is put back in the pool only by the caller that collected its result, or by the
worker itself when it finishes a call its caller walked away from: a worker stuck in a tool
that never returns is never reused; the pool creates another when it needs one. A caller
interrupted (Ctrl-C) just as its call returns ends the worker instead, for it cannot tell
whether its wait took the `done` lock.
"""

from __future__ import annotations

import contextlib
import heapq
import inspect
import itertools
import os
import threading
import time
import weakref
from contextvars import copy_context
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeGuard, TypeVar, cast

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Awaitable, Callable
    from contextvars import Context

__all__ = [
    "Alarm",
    "DeadlineExceeded",
    "Running",
    "abandoned_call",
    "acall_with_deadline",
    "alarm_after",
    "call_with_deadline",
    "interrupted_call",
    "is_awaitable",
    "resolve_awaitable",
]

T = TypeVar("T")

#: Idle workers kept for reuse; more are created on demand and end when the pool is full.
MAX_IDLE_WORKERS: Final = 32


class DeadlineExceeded(Exception):
    """The function was still running at its deadline; it goes on, on its worker.

    `running` is the call, to wait for it and read its outcome once it has finished.
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

    def on_return(self, callback: Callable[[], object]) -> None:
        """Call `callback` once, when the call has finished: on the worker thread as it
        finishes (before `wait` returns True), or at once in this thread if it has finished
        already. `callback` must not raise, nor wait for anything held while waiting for it."""
        ...


class _Late:
    """The outcome of a call its caller walked away from, handed over when it finishes.

    Made only when a caller walks away at a deadline, so the fast path never pays for it.
    `on_return` and `finish` settle under `_guard` who runs the callback, so it runs once
    whichever comes first; run by `finish`, it has ended before `wait` says the call has.
    """

    __slots__ = ("_fired", "_guard", "_then", "done", "error", "result")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None
        self._guard = threading.Lock()
        self._then: Callable[[], object] | None = None
        self._fired = False

    def finish(self, result: object, error: BaseException | None) -> None:
        """Hand over the call's outcome (from the thread that saw it return), then run the
        callback `on_return` registered, if any."""
        self.result, self.error = result, error
        with self._guard:
            self._fired = True
            then, self._then = self._then, None
        if then is not None:  # before `done`: whoever waits for the call sees what it did
            with contextlib.suppress(Exception):  # its contract: it does not raise
                then()
        self.done.release()

    def on_return(self, callback: Callable[[], object]) -> None:
        with self._guard:
            if not self._fired:
                self._then = callback
                return
        callback()

    def wait(self, timeout: float) -> bool:
        if not self.done.acquire(True, max(timeout, 0.0)):
            return False
        self.done.release()
        return True

    def outcome(self) -> object:
        if self.error is not None:
            raise self.error
        return self.result


class _Worker:
    """A daemon thread that runs one call at a time for whichever caller took it from the pool.

    Three locks. `go` is released by the caller when a call is ready (or the worker must end);
    `done` is released by the worker when the call has returned; `claim` is a test-and-set that
    settles the one race, a call returning as its caller walks away: the worker takes it before
    releasing `done`, a caller walking away takes it instead, and whichever fails to take it
    knows the other got there first.
    """

    __slots__ = (
        "_claim",
        "_context",
        "_done",
        "_error",
        "_fn",
        "_go",
        "_late",
        "_notify",
        "_result",
    )

    def __init__(self) -> None:
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self._claim = threading.Lock()
        self._fn: Callable[[], Any] | None = None
        self._context: Context | None = None
        self._notify: Callable[[], None] | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._late: _Late | None = None
        threading.Thread(target=self._loop, name="agenttx-tool", daemon=True).start()

    def call(self, fn: Callable[[], Any], timeout: float, owner: object) -> Any:
        """`call_with_deadline` on this worker (`start`, `finished` and `collect` in one frame).

        Written out rather than calling the other methods: each method call costs a visible
        share of a handoff.
        """
        self._fn = fn
        self._context = copy_context()  # the tool sees the caller's context vars
        self._go.release()
        try:
            returned = self._done.acquire(True, timeout)  # positional: parsed faster
        except BaseException:  # interrupted: walk away, leaving fn running
            kept = self._late = _Late()
            if self._claim.acquire(blocking=False):  # still running: its outcome comes later
                _interrupted.call = (owner, kept)
            else:
                # The call has returned. A signal that arrived just before the wait blocked is
                # raised only after it, so `done` may be ours already or not: neither waiting
                # for it nor reusing the worker is safe. The worker ends instead.
                self._late = None
                _interrupted.call = None
                self._retire()
            raise
        if not returned and (late := self.abandon()) is not None:
            raise DeadlineExceeded(late)
        return self.collect()

    def start(self, fn: Callable[[], Any], notify: Callable[[], None]) -> None:
        """Hand the worker a call; it calls `notify` once `done` is released."""
        self._fn = fn
        self._context = copy_context()
        self._notify = notify
        self._go.release()

    def finished(self) -> None:
        """Wait for `done`, which the worker released before calling `notify`: no wait."""
        self._done.acquire()

    def abandon(self) -> _Late | None:
        """Walk away from the call; None if it returned meanwhile (then collect or discard).

        Otherwise the caller must not touch the worker again: when the call returns, the worker
        finds the claim taken, hands the outcome to the returned `_Late` and goes back to the
        pool. The `_Late` is set before the claim is tried, so the worker always finds it.
        """
        late = self._late = _Late()
        if self._claim.acquire(blocking=False):
            return late
        self._late = None
        # The worker took the claim first: it is about to release `done`, with no code between.
        self._done.acquire()
        return None

    def collect(self) -> Any:
        """The call's result, or raise its exception; the worker goes back to the pool."""
        result, error = self._result, self._error
        self._fn = self._context = self._notify = self._result = self._error = self._late = None
        self._claim.release()
        if len(_idle) < MAX_IDLE_WORKERS:
            _idle.append(self)
        else:
            self._retire()
        if error is not None:
            raise error
        return result

    def discard(self) -> None:
        """Drop the call's outcome; the worker goes back to the pool."""
        self._result = self._error = None
        self.collect()

    def _retire(self) -> None:
        """Send the worker away once its call has returned: its thread ends, unused."""
        self._fn = self._context = self._notify = self._result = self._error = None
        self._go.release()  # taken by the worker for the call: no call set, so it ends

    def _loop(self) -> None:
        go, done, claim = self._go, self._done, self._claim
        while True:
            go.acquire()
            fn, context, notify = self._fn, self._context, self._notify
            if fn is None or context is None:
                return  # sent away by a full pool
            try:
                self._result = context.run(fn)
            except BaseException as exc:  # noqa: BLE001  (handed to the caller, who re-raises it)
                self._error = exc
            del fn, context  # hold nothing of the call while idle
            if claim.acquire(blocking=False):
                done.release()  # from here the caller runs; this thread only waits for `go`
                if notify is not None:
                    notify()
            else:  # the caller walked away: hand it the outcome, then drop it here
                late = self._late
                if late is not None:  # its callback runs here, before the worker is reused
                    late.finish(self._result, self._error)
                self.discard()
            del notify


_idle: list[_Worker] = []  # list.append and list.pop are atomic: no lock needed


def _take() -> _Worker:
    try:
        return _idle.pop()
    except IndexError:
        return _Worker()


def call_with_deadline(fn: Callable[[], T], timeout: float, owner: object = None) -> T:
    """Call `fn` on a worker thread; return its result or re-raise its exception.

    Raises `DeadlineExceeded` if it has not returned after `timeout` seconds. If the wait is
    interrupted (a `KeyboardInterrupt` in the main thread), that propagates at once; in both
    cases `fn` keeps running on its worker. After an interruption, the caller finds the call
    still running with `interrupted_call(owner)` (`owner`: what the call was made for).
    """
    return cast("T", _take().call(fn, timeout, owner))


async def acall_with_deadline(fn: Callable[[], T], timeout: float) -> T:
    """`call_with_deadline` for async code: the event loop keeps running while `fn` does.

    A cancellation of the awaiting task propagates at once, leaving `fn` running: the task's
    owner finds the call with `abandoned_call(task)`, as it does one past its deadline.
    """
    import asyncio  # noqa: PLC0415  (`import agenttx` does not load asyncio)

    loop = asyncio.get_running_loop()
    settled = loop.create_future()

    def notify() -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
            loop.call_soon_threadsafe(_settle, settled)

    worker = _take()
    worker.start(fn, notify)
    try:
        done, _ = await asyncio.wait((settled,), timeout=timeout)
    except BaseException:  # cancelled: walk away, leaving fn running
        late = worker.abandon()
        if late is None:  # it returned meanwhile: its outcome, handed over as a late one
            late = _Late()
            try:
                returned = worker.collect()
            except BaseException as exc:  # noqa: BLE001  (the call's own error, kept)
                late.finish(None, exc)
            else:
                late.finish(returned, None)
        _walk_away(late)
        raise
    if done:
        worker.finished()
    elif (late := worker.abandon()) is not None:
        _walk_away(late)
        raise DeadlineExceeded(late)
    return cast("T", worker.collect())


#: The call each task last walked away from (`acall_with_deadline`), until its owner takes
#: it with `abandoned_call`; a task nobody asks about is dropped with it.
_walked_away: weakref.WeakKeyDictionary[object, Running] = weakref.WeakKeyDictionary()


def _walk_away(late: _Late) -> None:
    import asyncio  # noqa: PLC0415  (loaded already: the caller awaits)

    task = asyncio.current_task()
    if task is not None:
        _walked_away[task] = late


#: The call this thread last walked away from when `call_with_deadline` was interrupted, with
#: the owner it was made for, until `interrupted_call` takes it.
_interrupted = threading.local()


def interrupted_call(owner: object) -> Running | None:
    """The call made for `owner` that this thread's `call_with_deadline` walked away from when
    it was interrupted, still running then; None if there is none. Taken once: the owner
    keeps the call's undo records until it has returned."""
    entry: tuple[object, Running] | None = getattr(_interrupted, "call", None)
    if entry is None or entry[0] is not owner:
        return None
    _interrupted.call = None
    return entry[1]


def abandoned_call(task: object) -> Running | None:
    """The call `task` last walked away from in `acall_with_deadline`, at its deadline or
    when it was cancelled (one that returned just as it was cancelled is handed over too), to
    wait for it and read its outcome; None if there is none. Taken once: a cancelled task's
    owner takes it to keep the call's undo records until it has returned."""
    return _walked_away.pop(task, None)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# --- the watchdog: one thread for every timed fence ------------------------------------------


class Alarm:
    """A callback due at a monotonic time, run by the watchdog thread unless cancelled first."""

    __slots__ = ("_args", "_fn", "cancelled")

    def __init__(self, fn: Callable[..., object], args: tuple[object, ...]) -> None:
        self._fn = fn
        self._args = args
        self.cancelled = False

    def cancel(self) -> None:
        """Keep the callback from running (a no-op once it has run)."""
        self.cancelled = True

    def fire(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._fn(*self._args)


class _Watchdog:
    """One daemon thread that runs alarms when they are due, earliest first.

    It replaces a `threading.Timer` per call: starting a thread waits for it to run, which on a
    loaded machine costs milliseconds between an async tool's calls. Scheduling is a heap push
    under a lock; cancelling marks the alarm, which is dropped when it comes due (or when
    cancelled alarms outnumber live ones, so the heap stays small under a high call rate). A
    callback that raises is dropped: alarms fence contexts, which never raise.
    """

    _COMPACT_AT: Final = 1024

    def __init__(self) -> None:
        self._ready = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Alarm]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, delay: float, fn: Callable[..., object], *args: object) -> Alarm:
        alarm = Alarm(fn, args)
        entry = (time.monotonic() + delay, next(self._order), alarm)
        with self._ready:
            heap = self._heap
            if len(heap) >= self._COMPACT_AT and len(heap) & (len(heap) - 1) == 0:
                heap[:] = [item for item in heap if not item[2].cancelled]
                heapq.heapify(heap)
            heapq.heappush(heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="agenttx-watchdog", daemon=True
                )
                self._thread.start()
            elif heap[0] is entry:
                self._ready.notify()
        return alarm

    def _loop(self) -> None:
        heap = self._heap
        while True:
            with self._ready:
                while not heap or heap[0][0] > time.monotonic():
                    self._ready.wait(heap[0][0] - time.monotonic() if heap else None)
                _, _, alarm = heapq.heappop(heap)
            with contextlib.suppress(Exception):
                alarm.fire()

    def forked(self) -> None:
        """In a forked child: no thread runs the heap; start afresh."""
        self._ready = threading.Condition(threading.Lock())
        self._heap = []
        self._thread = None


_watchdog = _Watchdog()


def alarm_after(delay: float, fn: Callable[..., object], *args: object) -> Alarm:
    """Call `fn(*args)` on the watchdog thread `delay` seconds from now, unless the returned
    `Alarm` is cancelled first. For short callbacks only: every alarm shares the one thread."""
    return _watchdog.schedule(delay, fn, *args)


def _forked() -> None:
    _idle.clear()
    _watchdog.forked()


# A forked child has none of its parent's threads: its pool and its watchdog start empty.
os.register_at_fork(after_in_child=_forked)


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
    import asyncio  # noqa: PLC0415  (loaded by the first awaitable, not by `import agenttx`)
    import concurrent.futures  # noqa: PLC0415

    awaitable: Awaitable[object] = value

    async def wait() -> object:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()
