"""The store's bell: a wait for people's decisions wakes when one is made (`stores/_bell.py`).

No test times anything: a bell that does not ring leaves its sleeper asleep for an hour, and
the test's timeout fails it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

import pytest

from agenttx.stores import MemoryStore, PostgresStore, RequestRow, SQLiteStore, decision_bell
from agenttx.stores._bell import PLAIN_BELL, Bell, ListeningBell
from conftest import postgres_dsn

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

HOUR = 3600.0


def _request(store: PostgresStore, request_id: str = "apr-1") -> None:
    store.add_request(
        RequestRow(
            id=request_id, kind="approval", scope_id="t", state="pending", digest="d", record="{}"
        )
    )


def _decide(store: PostgresStore, request_id: str = "apr-1") -> None:
    decided = store.set_request_state(request_id, ["pending"], "approved", decision="{}", now=1.0)
    assert decided is not None


def _listening(bell: Bell) -> int:
    """The bell's mark once it listens: it rings once when it starts listening (decisions
    made before were not heard), so a sleep on an earlier mark proves nothing."""
    mark = bell.mark()
    while bell.mark() == mark:
        bell.sleep(1.0, mark)
    return bell.mark()


@pytest.fixture
def store(pg_schema: tuple[str, str]) -> Iterator[PostgresStore]:
    dsn, schema = pg_schema
    with PostgresStore(dsn, schema=schema) as opened:
        yield opened


def test_stores_without_notifications_have_the_plain_bell(tmp_path: Path) -> None:
    """SQLite and memory stores have the plain bell: it never rings, its sleep is a sleep."""
    with SQLiteStore(tmp_path / "s.db") as sqlite:
        assert decision_bell(sqlite) is PLAIN_BELL
    assert decision_bell(MemoryStore()) is PLAIN_BELL
    assert PLAIN_BELL.mark() == 0
    PLAIN_BELL.sleep(0.0, 0)
    asyncio.run(PLAIN_BELL.asleep(0.0, 0))


@pytest.mark.timeout(60)
def test_a_decision_by_another_process_rings_a_sleeping_waiter(store: PostgresStore) -> None:
    """A waiter asleep on a PostgresStore's bell wakes when a request of its schema is
    decided through another connection (the trigger's NOTIFY), long before its sleep ends."""
    bell = decision_bell(store)
    assert isinstance(bell, Bell)
    assert bell is not PLAIN_BELL
    _request(store)
    mark = _listening(bell)
    woke = threading.Event()

    def sleeper() -> None:
        bell.sleep(HOUR, mark)
        woke.set()

    thread = threading.Thread(target=sleeper, daemon=True)
    thread.start()
    with PostgresStore(postgres_dsn(), schema=store.schema) as other:
        _decide(other)
    assert woke.wait(50)
    assert bell.mark() != mark


@pytest.mark.timeout(60)
def test_a_ring_between_the_question_and_the_sleep_is_not_missed(store: PostgresStore) -> None:
    """A decision made after the waiter's mark and before it sleeps makes the sleep return at
    once: the waiter asks the store again."""
    bell = decision_bell(store)
    _request(store)
    mark = _listening(bell)
    with PostgresStore(postgres_dsn(), schema=store.schema) as other:
        _decide(other)
    bell.sleep(HOUR, mark)  # returns, or the test's timeout fails it


@pytest.mark.timeout(60)
def test_an_async_sleeper_wakes_on_a_decision(store: PostgresStore) -> None:
    """`asleep` on the bell ends when a decision rings it, without a thread per sleeper."""
    bell = decision_bell(store)
    _request(store)

    async def main() -> None:
        mark = bell.mark()
        while bell.mark() == mark:
            await bell.asleep(1.0, mark)
        mark = bell.mark()
        sleeping = asyncio.ensure_future(bell.asleep(HOUR, mark))
        await asyncio.sleep(0)
        with PostgresStore(postgres_dsn(), schema=store.schema) as other:
            await asyncio.to_thread(_decide, other)
        await sleeping

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_decisions_in_another_schema_do_not_ring(store: PostgresStore, pg_schema) -> None:
    """The notification names its schema: a decision in another schema on the same server
    leaves the bell quiet (its waiters are not woken for nothing)."""
    from conftest import drop_schema  # noqa: PLC0415

    bell = decision_bell(store)
    mark = _listening(bell)
    elsewhere = f"{store.schema}_x"
    try:
        with PostgresStore(postgres_dsn(), schema=elsewhere) as other:
            _request(other)
            _decide(other)
        bell.sleep(1.0, mark)
        assert bell.mark() == mark
    finally:
        drop_schema(postgres_dsn(), elsewhere)


@pytest.mark.timeout(60)
def test_closing_the_store_wakes_its_sleepers_and_stops_listening(
    store: PostgresStore,
) -> None:
    """`close` wakes whoever sleeps on the bell, ends its thread and its connection; the
    closed store's bell is the plain one."""
    bell = decision_bell(store)
    assert isinstance(bell, ListeningBell)
    mark = _listening(bell)
    asleep = threading.Event()
    done = threading.Event()

    def sleeper() -> None:
        asleep.set()
        bell.sleep(HOUR, mark)
        done.set()

    thread = threading.Thread(target=sleeper, daemon=True)
    thread.start()
    assert asleep.wait(50)
    store.close()
    assert done.wait(50)
    assert decision_bell(store) is PLAIN_BELL
    listening = bell._thread
    assert listening is not None
    assert not listening.is_alive()
