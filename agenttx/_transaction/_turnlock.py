"""The turn lock: a transaction's calls run one at a time, in arrival order (`Calls`)."""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any

from .._errors import InvalidTransactionState
from .._results import TxStatus

__all__ = ["Calls"]


class _Waiter:
    """A call waiting for its turn: a thread blocked on `grant`, or a task awaiting `future`."""

    __slots__ = ("future", "grant", "granted", "loop", "task", "thread")

    def __init__(self, thread: int, task: object, loop: Any, future: Any) -> None:
        self.thread = thread
        self.task = task
        self.loop = loop
        self.future = future
        self.granted = False
        self.grant: threading.Lock | None = None
        if future is None:
            self.grant = threading.Lock()
            self.grant.acquire()


def _resolve(future: Any) -> None:
    """Wake an awaiting task (on its loop); a cancelled future has already been handled."""
    if not future.done():
        future.set_result(None)


class Calls:
    """A transaction's turns: calls run one at a time, in arrival order (a FIFO ticket queue).

    A thread enters with `with calls:`, a task with `async with calls:`; the turn is
    held for the whole call, tool and compensations included, and handed directly to the
    oldest waiter when it ends, so a newcomer never overtakes a waiter. Entering again from the
    thread or task that holds the turn (a tool calling back into its transaction, or a call
    made of calls) passes straight through: the status check then says what is wrong. A thread
    that would block the event loop running the task that holds the turn (a sync call from a
    sibling task) raises `InvalidTransactionState` rather than deadlock. A waiter interrupted
    or cancelled while queued leaves the queue; if the turn reached it meanwhile, it passes it
    on. `last` stamps the start and the end of each call (for the idle reaper). `turns` counts
    the turns that ended: it changes between two turns and never during one (only the holder
    adds to it, as it gives the turn up), so it tells one turn from another (a call id is
    unique within a turn: docs/protocol.md#call-ids-and-turns).

    A class rather than a lock with a generator: it runs on every step. `_turn` is a lock held
    for as long as anyone holds the turn, hand-overs included, so a free turn costs what a
    plain lock does: one non-blocking acquire to take it and one release to give it back. The
    queue and its `_mutex` come in only when someone waits. A re-entry takes no lock.

    Why no waiter is stranded: a waiter queues (under `_mutex`) and then tries the turn; a
    holder frees the turn and then looks at the queue. So either the waiter gets the turn
    itself, or the holder sees it and wakes it, or another call took the turn in between,
    and that call will look at the queue when it ends.
    """

    __slots__ = (
        "_depth",
        "_mutex",
        "_owner",
        "_task",
        "_turn",
        "_tx_id",
        "_waiters",
        "last",
        "turns",
    )

    def __init__(self, tx_id: str = "") -> None:
        self._tx_id = tx_id
        self._turn = threading.Lock()  # held while a call holds the turn
        self._mutex = threading.Lock()  # guards the queue
        self._owner: int | None = None  # the thread holding the turn
        self._task: object = None  # the task holding it, when it is held by a task
        self._depth = 0  # re-entries by the holder
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self.last = time.monotonic()
        self.turns = 0  # the turns that ended

    @property
    def busy(self) -> bool:
        """True while a call holds the turn."""
        return self._turn.locked()

    @property
    def held_here(self) -> bool:
        """True while the calling thread (and task, if a task holds it) holds the turn: a call
        made now would re-enter it, inside the call that holds it."""
        return self._owner == threading.get_ident() and (
            self._task is None or self._task is _current_task()
        )

    def try_enter(self) -> bool:
        """Take the turn if it is free and nobody waits, else return False at once."""
        if self._waiters or not self._turn.acquire(False):
            return False
        self._owner = threading.get_ident()
        return True

    def __enter__(self) -> None:
        # The common case first: the turn is free and nobody waits (so nobody is overtaken).
        # Then this thread cannot be holding it already: no re-entry to look for.
        if not self._waiters and self._turn.acquire(False):
            self._owner = threading.get_ident()
            self.last = time.monotonic()
            return
        me = threading.get_ident()
        # Only the holder sets `_owner` to itself or away from itself, and only the holder
        # touches `_depth`: a re-entry needs no lock.
        if self._owner == me and (self._task is None or self._task is _current_task()):
            self._depth += 1
            return
        self.last = time.monotonic()
        with self._mutex:
            if self._owner == me:  # a task on this thread's loop holds it: waiting would deadlock
                raise self._would_block()
            waiter = _Waiter(me, None, None, None)
            self._queue(waiter)
        grant = waiter.grant
        assert grant is not None
        try:
            grant.acquire()
        except BaseException:
            self._leave_queue(waiter)
            raise

    def __exit__(self, *exc: object) -> None:
        if self._depth:
            self._depth -= 1
            return
        self.turns += 1
        if self._waiters:
            with self._mutex:
                self._pass_on()
        else:
            self._owner = self._task = None
            self._turn.release()
            if self._waiters:  # one queued as the turn was freed
                self._wake()
        self.last = time.monotonic()

    def leave(self) -> None:
        """End the turn without counting it as activity (the idle reaper's `try_enter`)."""
        if self._depth:
            self._depth -= 1
            return
        self.turns += 1
        with self._mutex:
            self._pass_on()

    async def __aenter__(self) -> None:
        import asyncio  # noqa: PLC0415  (not loaded by `import agenttx`)

        me = threading.get_ident()
        task = asyncio.current_task()
        if self._owner == me and (self._task is None or self._task is task):
            self._depth += 1  # the holder itself (or a loop nested in its sync call)
            return
        self.last = time.monotonic()
        if not self._waiters and self._turn.acquire(False):
            self._task = task  # the task first: see `_pass_on`
            self._owner = me
            return
        with self._mutex:
            loop = asyncio.get_running_loop()
            waiter = _Waiter(me, task, loop, loop.create_future())
            self._queue(waiter)
        try:
            await waiter.future
        except BaseException:
            self._leave_queue(waiter)
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()

    def _would_block(self) -> InvalidTransactionState:
        error = InvalidTransactionState(tx_id=self._tx_id, status=TxStatus.EXECUTING.value)
        message = (
            f"transaction `{self._tx_id}` is running an async call on this thread's event loop: "
            "a sync call would block the loop it waits for; await the async method instead"
        )
        error.args = (message,)
        return error

    def _queue(self, waiter: _Waiter) -> None:
        """Queue `waiter`, then take the turn for the oldest waiter if it is free (under
        `_mutex`): it may have been freed since the caller found it taken."""
        self._waiters.append(waiter)
        if self._turn.acquire(False):
            self._pass_on()

    def _wake(self) -> None:
        """Give a waiter the turn just freed, unless another call has taken it (that call
        hands it on when it ends)."""
        with self._mutex:
            if self._waiters and self._turn.acquire(False):
                self._pass_on()

    def _leave_queue(self, waiter: _Waiter) -> None:
        """A waiter interrupted or cancelled: out of the queue, or pass on the turn it got."""
        with self._mutex:
            if waiter.granted:
                self._depth = 0
                self.turns += 1
                self._pass_on()
            else:
                self._waiters.remove(waiter)

    def _pass_on(self) -> None:
        """Hand the turn (held) to the oldest waiter that can take it, or free it (under
        `_mutex`)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            waiter.granted = True
            # The task first: a thread that reads `_owner` unlocked must never see its own id
            # next to a task that is not the holder's.
            self._task = waiter.task
            self._owner = waiter.thread
            if waiter.grant is not None:
                waiter.grant.release()
                return
            try:
                waiter.loop.call_soon_threadsafe(_resolve, waiter.future)
            except RuntimeError:  # its loop has closed: nobody will take it
                continue
            return
        self._owner = self._task = None
        self._turn.release()


def _current_task() -> object:
    """The running task, or None outside a running event loop."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return None
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None
