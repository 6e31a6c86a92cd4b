"""`Bell`: how a wait for people's decisions learns that one was made.

A process that waits for an approval or a review asks the store whether the request is still
pending, sleeps, and asks again. A store's bell shortens the sleep: `PostgresStore`'s rings when
any request of its schema changes state (a trigger on the `requests` table sends a
`NOTIFY agenttx_decided` with the schema's name, in the transaction that decides, so it is heard
once the decision is committed; `agenttx approve`, `agenttx ui` and another worker all ring
it). Every other store has the plain bell, which only sleeps.

The protocol between a waiter and its bell: take `mark()` before asking the store, then
`sleep(seconds, mark)`, which returns at once if the bell rang since the mark (so a decision
made between the question and the sleep is not missed), else when it rings or `seconds`
passed. A ring never says what was decided: the waiter asks the store again. A bell that
cannot listen (its connection lost) rings once it listens again, so waiters re-ask.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeGuard, runtime_checkable

from ._contracts import has_capability

if TYPE_CHECKING:
    import asyncio

    from ._postgres_link import Link

__all__ = [
    "CHANNEL",
    "PLAIN_BELL",
    "Bell",
    "DecisionBellStore",
    "ListeningBell",
    "decision_bell",
    "rings_decisions",
]

#: The PostgreSQL channel the `requests` table's trigger notifies (payload: the schema).
CHANNEL: Final = "agenttx_decided"


class Bell:
    """The plain bell: it never rings, its sleeps are `time.sleep` and `asyncio.sleep`."""

    __slots__ = ()

    def mark(self) -> int:
        """How many times the bell rang so far (take it before asking the store)."""
        return 0

    def sleep(self, seconds: float, mark: int) -> None:
        """Sleep `seconds`, or less once the bell rang after `mark`."""
        del mark
        time.sleep(seconds)

    async def asleep(self, seconds: float, mark: int) -> None:
        """`sleep` for async code: the event loop goes on meanwhile."""
        import asyncio  # noqa: PLC0415  (`import agenttx` does not load asyncio)

        del mark
        await asyncio.sleep(seconds)

    def close(self) -> None:
        """Let the bell go (the plain one holds nothing)."""


#: The bell of every store that has no other.
PLAIN_BELL: Final = Bell()


@runtime_checkable
class DecisionBellStore(Protocol):
    """A store that wakes a wait for people's decisions as soon as one is made, by any
    process (`PostgresStore`: `LISTEN`/`NOTIFY`). A capability like those of `_contracts`."""

    def decision_bell(self) -> Bell:
        """The bell a wait on this store's requests sleeps on (the plain bell once closed)."""
        ...


def rings_decisions(store: object) -> TypeGuard[DecisionBellStore]:
    """Whether `store` wakes waits for decisions itself (`DecisionBellStore`)."""
    return has_capability(store, DecisionBellStore)


def decision_bell(store: object) -> Bell:
    """`store`'s bell if it is a `DecisionBellStore`, else `PLAIN_BELL`."""
    return store.decision_bell() if rings_decisions(store) else PLAIN_BELL


class ListeningBell(Bell):
    """A bell that a thread rings for each `NOTIFY` on `CHANNEL` naming its schema, on a
    connection of its own (a `Link`), from the first `mark()` until `close()`."""

    __slots__ = ("_changed", "_link", "_rings", "_sleepers", "_start", "_stopped", "_thread")

    def __init__(self, link: Link) -> None:
        self._link = link
        self._changed = threading.Condition()
        self._rings = 0
        #: The async sleeps on the bell now: each `(its event loop, the future that wakes it)`.
        self._sleepers: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        self._stopped = threading.Event()
        self._start = threading.Lock()
        self._thread: threading.Thread | None = None

    def mark(self) -> int:
        if self._thread is None and not self._stopped.is_set():
            with self._start:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._listen, name="agenttx-postgres-decisions", daemon=True
                    )
                    self._thread.start()
        return self._rings

    def sleep(self, seconds: float, mark: int) -> None:
        with self._changed:
            self._changed.wait_for(
                lambda: self._rings != mark or self._stopped.is_set(), timeout=seconds
            )

    async def asleep(self, seconds: float, mark: int) -> None:
        import asyncio  # noqa: PLC0415

        loop = asyncio.get_running_loop()
        rung: asyncio.Future[None] = loop.create_future()
        waiter = (loop, rung)
        with self._changed:
            if self._rings != mark or self._stopped.is_set():
                return
            self._sleepers.add(waiter)
        try:
            await asyncio.wait_for(rung, seconds)
        except asyncio.TimeoutError:
            pass
        finally:
            with self._changed:
                self._sleepers.discard(waiter)

    def close(self) -> None:
        """Stop listening (within a second) and close the bell's connection; a waiter
        asleep on it wakes, and later sleeps are plain."""
        self._stopped.set()
        self._ring()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self._link.drop()

    def _ring(self) -> None:
        with self._changed:
            self._rings += 1
            self._changed.notify_all()
            sleepers = list(self._sleepers)
        for loop, rung in sleepers:
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                loop.call_soon_threadsafe(_wake, rung)

    def _listen(self) -> None:
        schema = self._link.schema
        while not self._stopped.is_set():
            try:
                conn: Any = self._link.cursor("listen for decisions").connection
                conn.execute(f"LISTEN {CHANNEL}")
                # Decisions made while not listening (first start, a lost connection) were
                # not heard: the waiters ask again.
                self._ring()
                while not self._stopped.is_set():
                    for note in conn.notifies(timeout=1.0):
                        if note.payload == schema:
                            self._ring()
            except Exception as exc:  # noqa: BLE001 - listen again; waiters poll meanwhile
                self._link.failure("listen for decisions", exc)
                self._stopped.wait(1.0)
        self._link.drop()


def _wake(rung: asyncio.Future[None]) -> None:
    """On the sleeper's event loop: end its sleep (once)."""
    if not rung.done():
        rung.set_result(None)
