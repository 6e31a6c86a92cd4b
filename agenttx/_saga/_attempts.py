"""One call under a deadline, and the runners that drive a retry plan, sync or async.

A compensation or an effect delivery is user code: it may raise, or never return. Each call is
an `Attempt`: it runs on a worker thread (`call_with_deadline`), so the caller walks away at the
deadline; an async call is awaited on the caller's loop and cancelled at the deadline. Either way
the call may go on after its deadline (a thread cannot be stopped, a coroutine may ignore its
cancellation), and `Attempt.running` says so: the caller must not start the same work again
while it does.

A retry plan is written once, as a generator (`Work`) that yields an `Attempt` to run (and is
sent back its failure line, or None) or a number of seconds to pause, and returns its result.
`drive` runs it synchronously, `adrive` on an event loop; an exception raised while running a
step (a `KeyboardInterrupt`, a cancellation) is thrown into the generator at that step, so its
own `with`/`finally` blocks see it, and then propagates.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import TYPE_CHECKING, Final, Generic, TypeAlias, TypeVar, cast, final

from .._errors import InvalidArgument
from .._tools import (
    DeadlineExceeded,
    acall_with_deadline,
    call_with_deadline,
    is_awaitable,
    resolve_awaitable,
)
from .._validators import is_positive_number

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Generator

__all__ = [
    "DEFAULT_TIMEOUT",
    "Attempt",
    "Work",
    "adrive",
    "check_timeout",
    "describe",
    "drive",
    "timed_out",
]

T = TypeVar("T")

#: Seconds a compensation attempt or an effect delivery may take before it is abandoned.
DEFAULT_TIMEOUT: Final = 30.0

#: A retry plan: yields an `Attempt` (sent back its failure line or None) or seconds to pause.
Work: TypeAlias = "Generator[Attempt | float, str | None, T]"


def describe(exc: BaseException) -> str:
    """An exception as one report line's worth: its message, or its type's name."""
    return str(exc) or type(exc).__name__


def timed_out(timeout: float) -> str:
    """The failure line of an attempt abandoned at its deadline."""
    return f"timed out after {timeout * 1000:g} ms"


def check_timeout(name: str, timeout: object) -> float:
    """`timeout` as a float; `InvalidArgument` naming `name` unless it is a usable deadline."""
    if is_positive_number(timeout) and float(cast("float", timeout)) <= threading.TIMEOUT_MAX:
        return float(cast("float", timeout))
    raise InvalidArgument(
        f"{name} must be a number of seconds > 0 and <= {threading.TIMEOUT_MAX:g}, got {timeout!r}"
    )


@final
class Attempt:
    """One call of `fn` with a deadline of `timeout` seconds; run it once, by `run` or `arun`.

    Both return None if `fn` succeeded, else a failure line: what it raised (an `Exception`),
    or `timed_out(timeout)`. A `BaseException` (a `KeyboardInterrupt`, a cancellation of the
    caller) propagates. `run` calls `fn` on a worker thread and, if it returns an awaitable, runs
    that to completion on the worker too. `arun` calls `fn` on a worker thread and awaits an
    awaitable result on the running loop, in a task cancelled at the deadline (or when the
    caller is cancelled); the event loop keeps running meanwhile.
    """

    __slots__ = ("_fn", "_returned", "_started", "_task", "_timeout")

    def __init__(self, fn: Callable[[], object], timeout: float) -> None:
        self._fn = fn
        self._timeout = timeout
        self._started = False
        self._returned = threading.Event()  # set by the worker when `fn` (and `run`'s await) end
        self._task: asyncio.Future[object] | None = None

    @property
    def running(self) -> bool:
        """Whether the call was started and has not ended (after a timeout or an interrupt)."""
        if not self._started:
            return False
        return not self._returned.is_set() or (self._task is not None and not self._task.done())

    def run(self) -> str | None:
        """Make the call from synchronous code; see the class docstring."""
        self._started = True
        try:
            call_with_deadline(partial(self._call, resolve_awaitable), self._timeout)
        except DeadlineExceeded:
            return timed_out(self._timeout)
        except Exception as exc:  # noqa: BLE001  (user code's failure is data: it is reported)
            return describe(exc)
        return None

    async def arun(self) -> str | None:
        """Make the call from async code; see the class docstring."""
        import asyncio  # noqa: PLC0415  (not loaded by `import agenttx`)

        self._started = True
        started = time.monotonic()
        try:
            result = await acall_with_deadline(partial(self._call, _as_is), self._timeout)
            if not is_awaitable(result):
                return None
            task = self._task = asyncio.ensure_future(result)
        except DeadlineExceeded:
            return timed_out(self._timeout)
        except Exception as exc:  # noqa: BLE001
            return describe(exc)
        remaining = max(self._timeout - (time.monotonic() - started), 0.0)
        try:
            done, _ = await asyncio.wait((task,), timeout=remaining)
        finally:
            if not task.done():  # the deadline passed, or the caller is leaving: stop it
                task.cancel()
                task.add_done_callback(_retrieve)
        if not done:
            return timed_out(self._timeout)
        try:
            task.result()
        except Exception as exc:  # noqa: BLE001
            return describe(exc)
        return None

    def _call(self, finish: Callable[[object], object]) -> object:
        """On the worker: call `fn` and `finish` its result, then mark the call returned."""
        try:
            return finish(self._fn())
        finally:
            self._returned.set()


def _as_is(value: object) -> object:
    return value


def _retrieve(task: asyncio.Future[object]) -> None:
    """Collect an abandoned task's outcome, so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


@final
class _Done(Generic[T]):
    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value


def _advance(work: Work[T], reply: str | BaseException | None) -> Attempt | float | _Done[T]:
    """Send `reply` into `work` (or throw it in, if it is an exception); its next step or result."""
    try:
        if isinstance(reply, BaseException):
            return work.throw(reply)
        return work.send(reply)
    except StopIteration as stop:
        return _Done(stop.value)


def drive(work: Work[T], sleep: Callable[[float], object] = time.sleep) -> T:
    """Run `work` from synchronous code: attempts by `Attempt.run`, pauses by `sleep`."""
    step = _advance(work, None)
    while not isinstance(step, _Done):
        reply: str | BaseException | None = None
        try:
            if isinstance(step, Attempt):
                reply = step.run()
            else:
                sleep(step)
        except BaseException as exc:  # noqa: BLE001  (thrown into `work`, which re-raises it)
            reply = exc
        step = _advance(work, reply)
    return step.value


async def adrive(work: Work[T]) -> T:
    """Run `work` from async code: attempts by `Attempt.arun`, pauses by `asyncio.sleep`."""
    import asyncio  # noqa: PLC0415  (not loaded by `import agenttx`)

    step = _advance(work, None)
    while not isinstance(step, _Done):
        reply: str | BaseException | None = None
        try:
            if isinstance(step, Attempt):
                reply = await step.arun()
            else:
                await asyncio.sleep(step)
        except BaseException as exc:  # noqa: BLE001
            reply = exc
        step = _advance(work, reply)
    return step.value
