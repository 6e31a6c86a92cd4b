"""PostgresStore: the store contract on a real server, migrations, leases and fencing, failures."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import psycopg
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

import agenttx
from agenttx import (
    InvalidArgument,
    ReadConflict,
    StepStatus,
    StorageError,
    TransactionNotFound,
    WriteConflict,
)
from agenttx.stores import EffectRow, PostgresStore, UndoRow
from agenttx.stores._postgres_schema import binary_array
from agenttx.testing import check_store
from conftest import drop_schema, postgres_dsn
from test_sqlite_store import StoresAgree

if TYPE_CHECKING:
    from collections.abc import Iterator

EFFECT = EffectRow(step_id=1, channel="email", payload='{"to":"a"}', idempotency_key="k1")


@pytest.fixture
def store(pg_schema: tuple[str, str]) -> Iterator[PostgresStore]:
    dsn, schema = pg_schema
    with PostgresStore(dsn, schema=schema) as opened:
        yield opened


def _other(store: PostgresStore, **options: Any) -> PostgresStore:
    return PostgresStore(postgres_dsn(), schema=store.schema, **options)


def _raw(sql: str, values: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres_dsn(), autocommit=True) as conn:
        cur = conn.execute(sql, values)
        return cur.fetchall() if cur.description else []


# ---------------------------------------------------------------- without a server


def test_import_agenttx_does_not_load_psycopg() -> None:
    """`import agenttx` and `import agenttx.stores` load no driver; asking for the class loads
    it (the module), and only making a store connects."""
    code = (
        "import sys, agenttx, agenttx.stores\n"
        "assert 'psycopg' not in sys.modules, 'psycopg loaded'\n"
        "assert 'PostgresStore' in dir(agenttx.stores)\n"
        "agenttx.stores.PostgresStore\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_a_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without psycopg, making a store raises ImportError naming `agenttx[postgres]`."""
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ImportError, match=r"pip install 'agenttx\[postgres\]'"):
        PostgresStore("postgresql://nowhere/db")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"schema": "Bad-Name"}, "schema must be"),
        ({"schema": "pg_catalog"}, "reserved"),
        ({"schema": "1abc"}, "schema must be"),
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"lease_seconds": float("inf")}, "lease_seconds"),
        ({"statement_timeout": -1}, "statement_timeout"),
        ({"migrate": "yes"}, "migrate"),
    ],
)
def test_bad_options_are_refused_before_connecting(options: dict[str, Any], message: str) -> None:
    """Options are checked first, with InvalidArgument naming the offender."""
    with pytest.raises(InvalidArgument, match=message):
        PostgresStore("postgresql://nowhere/db", **options)


def test_a_dsn_or_pool_is_required() -> None:
    """Anything but a DSN or a pool is refused by name."""
    with pytest.raises(InvalidArgument, match="dsn_or_pool"):
        PostgresStore(42)


def test_an_unreachable_server_is_a_storage_error() -> None:
    """A server that does not answer gives StorageError with the cause."""
    with pytest.raises(StorageError, match="cannot connect") as caught:
        PostgresStore("postgresql://postgres@127.0.0.1:1/nothing", connect_timeout=1)
    assert isinstance(caught.value.__cause__, psycopg.Error)


# ---------------------------------------------------------------- the contract


def test_check_store_passes(pg_schema: tuple[str, str]) -> None:
    """PostgresStore passes the conformance suite, each example on an emptied schema."""
    dsn, schema = pg_schema
    tables = "committed, txs, log, undos, outbox, ended, plan_runs, plan_nodes"
    made: list[PostgresStore] = []

    def fresh() -> PostgresStore:
        for old in made:
            old.close()
        _raw(
            f"TRUNCATE {', '.join(f'{schema}.{t}' for t in tables.split(', '))}"
            if made
            else "SELECT 1"
        )
        if made:
            _raw(f"UPDATE {schema}.meta SET commit_version = 0")
        made.append(PostgresStore(dsn, schema=schema))
        return made[-1]

    check_store(fresh, max_examples=25)
    for old in made:
        old.close()


class PostgresAgrees(StoresAgree):
    """The differential machine of test_sqlite_store with a PostgresStore in SQLite's place."""

    counter_of_schemas = itertools.count()

    def open_store(self) -> Any:
        if not hasattr(self, "schema"):
            self.schema = f"t_agree_{next(self.counter_of_schemas)}_{id(self):x}"
        return PostgresStore(postgres_dsn(), schema=self.schema)

    def teardown(self) -> None:
        super().teardown()
        drop_schema(postgres_dsn(), self.schema)

    def file_agrees(self) -> None:
        """The SQLite file check does not apply; `reopen` checks the images instead."""


def test_postgres_agrees_with_memory() -> None:
    """Random interleavings of three transactions, reopens included, give identical results
    on MemoryStore and PostgresStore."""
    postgres_dsn()
    run_state_machine_as_test(
        PostgresAgrees, settings=settings(max_examples=15, stateful_step_count=25, deadline=None)
    )


def test_keys_and_values_keep_any_text(store: PostgresStore) -> None:
    """NUL characters, non-ASCII text and long keys round-trip; keys sort by code point."""
    values = {"a\x00b": "v\x00", "ключ": "é", "z" * 1024: '"x"', "\U0001f600": "😀"}
    store.begin("t")
    for key, value in values.items():
        store.put("t", key, value)
    store.commit("t")
    for key, value in values.items():
        assert store.read_committed(key) == value
    keys = [row[0] for row in store.committed_keys()]
    assert keys == sorted(values)


def test_effects_keep_any_text_through_the_outbox(store: PostgresStore) -> None:
    """Effects whose texts hold quotes, backslashes, braces, commas and non-ASCII text reach
    the outbox as they were, in staging order."""
    texts = ['{"a": "b,c"}', '"\\"', "{}", "ключ 😀", "NULL", "a\tb"]
    effects = [
        EffectRow(step_id=n + 1, channel=text, payload=text, idempotency_key=f"{text}/{n}")
        for n, text in enumerate(texts)
    ]
    store.begin("t")
    store.record_step("t", 1, "[1]", effects, "p")
    store.commit("t")
    pending = store.pending_effects()
    assert [(e.step_id, e.channel, e.payload, e.idempotency_key) for e in pending] == [
        (e.step_id, e.channel, e.payload, e.idempotency_key) for e in effects
    ]


# ---------------------------------------------------------------- migrations


def test_migrations_are_recorded_and_idempotent(store: PostgresStore) -> None:
    """The schema records each migration once; migrate() again changes nothing."""
    assert store.migrate() == 8
    rows = _raw(f"SELECT version FROM {store.schema}.migrations ORDER BY version")
    assert rows == [(1,), (2,), (3,), (4,), (5,), (6,), (7,), (8,)]


def test_a_newer_schema_is_refused(store: PostgresStore) -> None:
    """A schema migrated by a newer agenttx is refused with StorageError naming the versions."""
    _raw(f"INSERT INTO {store.schema}.migrations (version, description) VALUES (99, 'future')")
    with pytest.raises(StorageError, match="version 99, newer"):
        _other(store)
    with pytest.raises(StorageError, match="version 99, newer"):
        store.migrate()


def test_without_migrate_an_empty_schema_is_refused(pg_schema: tuple[str, str]) -> None:
    """migrate=False requires the schema at this code's version."""
    dsn, schema = pg_schema
    with pytest.raises(StorageError, match=r"run PostgresStore\.migrate"):
        PostgresStore(dsn, schema=schema, migrate=False)


def test_workers_starting_together_migrate_once(pg_schema: tuple[str, str]) -> None:
    """Stores opened at once on a new schema all work: the advisory lock serializes them."""
    dsn, schema = pg_schema
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            PostgresStore(dsn, schema=schema).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _raw(f"SELECT count(*) FROM {schema}.migrations") == [(8,)]


# ---------------------------------------------------------------- leases and fencing


def test_a_takeover_fences_every_later_write(store: PostgresStore) -> None:
    """Once another store loads the transaction, each durable write of the first raises
    StorageError (lease lost) and writes nothing; the first lets the transaction go."""
    store.begin("t", record='{"r":1}')
    store.put("t", "k", '"mine"')
    store.record_step("t", 1, "[1]", [], "p1")
    with _other(store) as thief:
        image = thief.load("t")
        assert image.steps == ((1, "[1]"),)
        before = _raw(f"SELECT count(*) FROM {store.schema}.log")
        store.put("t", "k", '"stale"')
        with pytest.raises(StorageError, match="lease lost"):
            store.record_step("t", 2, "[2]", [EFFECT], "p2")
        assert not store.is_open("t")
        assert _raw(f"SELECT count(*) FROM {store.schema}.log") == before
        with pytest.raises(StorageError, match="lease lost"):
            store.commit("t")
        assert thief.commit("t") == 1
    assert store.read_committed("k") == '"mine"'


@pytest.mark.parametrize("puts", [0, 7, 12])
def test_a_step_after_a_takeover_writes_nothing(store: PostgresStore, puts: int) -> None:
    """A step's record alone (one row), with a few buffered writes (one prepared statement)
    or with more (a fenced transaction): after a takeover each writes no row and loses the
    lease; held, each lands whole."""
    store.begin("t")
    for n in range(puts):
        store.put("t", f"k{n}", str(n))
    with _other(store) as thief:
        thief.load("t")
        with pytest.raises(StorageError, match="lease lost"):
            store.record_step("t", 1, "[1]", [], "p1")
        assert _raw(f"SELECT count(*) FROM {store.schema}.log") == [(0,)]
        assert not store.is_open("t")
    store.begin("u")
    for n in range(puts):
        store.put("u", f"k{n}", str(n))
    store.record_step("u", 1, "[1]", [EFFECT], "p1")
    image = store.peek("u")
    assert image.steps == ((1, "[1]"),)
    assert image.effects == (EFFECT,)
    assert store.commit("u") == puts
    assert [key for key, _, _ in store.committed_keys("k")] == sorted(f"k{n}" for n in range(puts))


@pytest.mark.parametrize("call", ["commit", "restore", "record_undo", "record_transaction"])
def test_every_kind_of_write_checks_the_epoch(store: PostgresStore, call: str) -> None:
    """Commit, restore and the multi-statement writes are fenced too."""
    store.begin("t")
    store.snapshot("t", 1)
    store.put("t", "k", "1")
    with _other(store) as thief:
        thief.load("t")
        calls = {
            "commit": lambda: store.commit("t"),
            "restore": lambda: store.restore("t", 1),
            "record_undo": lambda: store.record_undo("t", UndoRow(step_id=1, seq=0, record="{}")),
            "record_transaction": lambda: store.record_transaction("t", "{}"),
        }
        with pytest.raises(StorageError, match="lease lost"):
            calls[call]()
        assert thief.peek("t").undos == ()
    assert store.read_committed("k") is None


def test_an_epoch_is_never_reused(store: PostgresStore) -> None:
    """A holder that lost a transaction cannot write to a later one of the same id."""
    store.begin("t")
    with _other(store) as second, _other(store) as third:
        second.load("t")
        second.commit("t")
        third.begin("t")
        store.put("t", "k", "1")
        with pytest.raises(StorageError, match="lease lost"):
            store.flush("t")
        third.commit("t")
    assert store.read_committed("k") is None


def test_a_claim_waits_for_the_lease_to_expire(store: PostgresStore) -> None:
    """Recovery takes over only an expired lease: a live holder renews it; a dead one's runs
    out, then exactly one claim succeeds."""
    with _other(store, lease_seconds=0.6) as holder:
        holder.begin("t", record='{"r":1}')
        owner = holder.owner("t")
        time.sleep(1.0)  # renewed meanwhile
        assert store.claim("t", owner) is None
        holder._renewer.stop()  # the holder freezes: its lease runs out
        time.sleep(0.8)
        image = store.claim("t", owner)
        assert image is not None
        assert image.record == '{"r":1}'
        assert store.claim("t", owner) is None  # the owner changed
        with pytest.raises(StorageError, match="lease lost"):
            holder.record_progress("t", '"late"')


def test_discard_state_releases_the_lease_for_any_recovery(store: PostgresStore) -> None:
    """A transaction whose state was discarded has no owner and no lease: a claim takes it."""
    store.begin("t", record='{"r":1}')
    store.record_undo("t", UndoRow(step_id=1, seq=0, record='{"u":1}'))
    store.discard_state("t")
    assert store.owner("t") is None
    with _other(store) as recoverer:
        image = recoverer.claim("t", None)
        assert image is not None
        assert [undo.record for undo in image.undos] == ['{"u":1}']


# ---------------------------------------------------------------- failures


def test_a_lost_connection_is_a_storage_error_then_reconnects(store: PostgresStore) -> None:
    """A connection killed by the server gives StorageError with the cause, changes nothing,
    and the next call connects again; the transaction goes on."""
    store.begin("t")
    store.put("t", "k", "1")
    store.record_step("t", 1, "[1]", [], "p")
    pid = store._link._conn.info.backend_pid  # type: ignore[union-attr]
    assert _raw("SELECT pg_terminate_backend(%s)", (pid,)) == [(True,)]
    with pytest.raises(StorageError, match="connection") as caught:
        store.put("t", "j", "2")  # reads the committed version: the first call to notice
    assert isinstance(caught.value.__cause__, psycopg.Error)
    store.put("t", "j", "2")  # reconnected
    store.record_step("t", 2, "[2]", [], "p")
    assert store.commit("t") == 2
    assert store.read_committed("j") == "2"


def test_a_statement_timeout_is_a_storage_error_with_no_effect(store: PostgresStore) -> None:
    """A commit stuck behind a lock past the statement timeout raises StorageError, leaves the
    transaction open and unchanged, and commits once the lock is gone."""
    with _other(store, statement_timeout=0.2) as timed:
        timed.begin("t")
        timed.put("t", "k", "1")
        with psycopg.connect(postgres_dsn()) as blocker:
            blocker.execute(f"SELECT * FROM {store.schema}.meta FOR UPDATE")
            with pytest.raises(StorageError, match="timed out"):
                timed.commit("t")
            blocker.rollback()
        assert timed.is_open("t")
        assert timed.commit("t") == 1
    assert store.read_committed("k") == "1"


def test_a_step_stuck_behind_a_lock_times_out_with_no_effect(store: PostgresStore) -> None:
    """A step's write waiting on its transaction's row past the statement timeout raises
    StorageError naming the timeout, writes nothing, and the step goes through once the lock
    is gone."""
    with _other(store, statement_timeout=0.2) as timed:
        timed.begin("t")
        with psycopg.connect(postgres_dsn()) as blocker:
            blocker.execute(f"SELECT * FROM {store.schema}.txs FOR UPDATE")
            with pytest.raises(StorageError, match="timed out") as caught:
                timed.record_step("t", 1, "[1]", [], "p")
            assert isinstance(caught.value.__cause__, psycopg.errors.QueryCanceled)
            blocker.rollback()
        assert _raw(f"SELECT count(*) FROM {store.schema}.log") == [(0,)]
        timed.record_step("t", 1, "[1]", [], "p")
        assert timed.peek("t").steps == ((1, "[1]"),)


def test_the_step_statements_are_prepared_again_when_gone(store: PostgresStore) -> None:
    """The per-step statements, dropped from the connection (`DEALLOCATE ALL`, as psycopg does
    after a rollback, or a pool's reset), are prepared again and the call goes through."""
    store.begin("t")
    store.put("t", "k", "1")
    store.record_step("t", 1, "[1]", [], "p")
    conn = store._link._conn
    assert conn is not None
    conn.execute("DEALLOCATE ALL")
    assert store.read_committed("k") is None
    conn.execute("DEALLOCATE ALL")
    store.put("t", "j", "2")
    store.record_step("t", 2, "[2]", [], "p")
    assert store.commit("t") == 2
    assert store.read_committed("j") == "2"


def test_a_commit_prepares_its_statements_again_when_gone(store: PostgresStore) -> None:
    """A commit whose prepared statements were dropped from the connection rolls back what
    ran, prepares them again and commits once."""
    store.begin("t")
    store.put("t", "k", "1")
    store.record_step("t", 1, "[1]", [EFFECT], "p")
    conn = store._link._conn
    assert conn is not None
    conn.execute("DEALLOCATE ALL")
    assert store.commit("t") == 1
    assert store.read_committed("k") == "1"
    assert len(store.pending_effects()) == 1
    assert _raw(f"SELECT commit_version FROM {store.schema}.meta") == [(1,)]


def test_a_check_that_fails_then_passes_commits_on_a_new_try(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the server's version check fails but the versions read afterwards pass (a key
    deleted back to its base meanwhile), the commit is tried again and goes through once."""
    store.begin("t")
    store.put("t", "k", "1")
    real = store._hot.commit
    calls: list[int] = []

    def stale_once(*args: Any, **kwargs: Any) -> Any:
        statements, writes, reads = real(*args, **kwargs)
        if not calls:  # the first try checks a base no key has
            name, (keys, _versions), formats = statements[writes]
            statements[writes] = (name, (keys, binary_array(20, [(7).to_bytes(8, "big")])), formats)
        calls.append(1)
        return statements, writes, reads

    monkeypatch.setattr(store._hot, "commit", stale_once)
    assert store.commit("t") == 1
    assert len(calls) == 2
    assert store.read_committed("k") == "1"
    assert _raw(f"SELECT commit_version FROM {store.schema}.meta") == [(1,)]


def test_a_serializable_read_conflict_is_raised_across_stores(store: PostgresStore) -> None:
    """A serializable transaction whose read key was committed by another worker since gets
    ReadConflict at commit, and writes nothing."""
    with _other(store) as other:
        store.begin("a", isolation="serializable")
        assert store.get("a", "r") is None
        store.put("a", "w", "1")
        other.begin("b")
        other.put("b", "r", "x")
        other.commit("b")
        with pytest.raises(ReadConflict) as caught:
            store.commit("a")
        assert caught.value.key == "r"
    assert store.read_committed("w") is None


def test_stores_sharing_a_pool_share_its_prepared_statements(pg_schema: tuple[str, str]) -> None:
    """A pooled connection that already has the per-step statements (another store of the
    same schema used it) is used as it is; a store of another schema prepares its own."""
    from psycopg_pool import ConnectionPool  # noqa: PLC0415

    dsn, schema = pg_schema
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        for tx_id in ("a", "b"):
            with PostgresStore(pool, schema=schema) as store:
                store.begin(tx_id)
                store.put(tx_id, tx_id, "1")
                store.record_step(tx_id, 1, "[1]", [], "p")
                assert store.commit(tx_id) == 1
        try:
            with PostgresStore(pool, schema=f"{schema}_b") as other:
                other.begin("c")
                other.record_step("c", 1, "[1]", [], "p")
                assert other.commit("c") == 0
                assert other.read_committed("a") is None
        finally:
            drop_schema(dsn, f"{schema}_b")
        with PostgresStore(pool, schema=schema) as store:
            assert store.read_committed("a") == store.read_committed("b") == "1"


def test_a_write_conflict_is_raised_across_stores(store: PostgresStore) -> None:
    """First committer wins across workers."""
    with _other(store) as other:
        store.begin("a")
        other.begin("b")
        assert store.get("a", "n") is None
        assert other.get("b", "n") is None
        other.put("b", "n", "1")
        other.commit("b")
        store.put("a", "n", "2")
        with pytest.raises(WriteConflict):
            store.commit("a")
    assert store.read_committed("n") == "1"


@pytest.mark.parametrize("failure", ["conflict", "lease lost", "statement error"])
def test_a_failed_commit_rolls_back_all_it_sent(store: PostgresStore, failure: str) -> None:
    """A commit that fails after sending its first statements at once (a conflict found, the
    lease lost, a statement failing on the server) ends no transaction, moves no counter and
    leaves the connection out of any transaction; the store goes on."""
    store.begin("a")
    store.put("a", "n", "2")
    store.record_step("a", 1, "[1]", [], "p")
    with _other(store) as other:
        if failure == "conflict":
            other.begin("b")
            other.put("b", "n", "1")
            other.commit("b")
            expected: Any = WriteConflict
        elif failure == "lease lost":
            other.load("a")
            expected = StorageError
        else:
            _raw(f"ALTER TABLE {store.schema}.meta ADD CONSTRAINT small CHECK (commit_version < 1)")
            expected = StorageError
        before = _raw(f"SELECT commit_version FROM {store.schema}.meta")
        with pytest.raises(expected):
            store.commit("a")
        assert _raw(f"SELECT commit_version FROM {store.schema}.meta") == before
        assert _raw(f"SELECT count(*) FROM {store.schema}.ended WHERE tx_id = 'a'") == [(0,)]
        assert other.peek("a").steps == ((1, "[1]"),)
        conn = store._link._conn
        assert conn is not None
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    store.begin("c")
    store.record_step("c", 1, "[1]", [], "p")
    assert store.peek("c").steps == ((1, "[1]"),)


# ---------------------------------------------------------------- the outbox


def test_competing_dispatchers_claim_disjoint_entries(store: PostgresStore) -> None:
    """Two dispatchers claiming at once get each entry once; a delivered one is gone, and an
    entry whose claim ran out is offered again."""
    store.begin("t")
    effects = [
        EffectRow(step_id=1, channel="c", payload=str(n), idempotency_key=f"k{n}") for n in range(6)
    ]
    store.record_step("t", 1, "[1]", effects, "p")
    store.commit("t")
    with _other(store) as other:
        first = store.claim_effects(3)
        second = other.claim_effects(10)
        assert [e.payload for e in first] == ["0", "1", "2"]
        assert [e.payload for e in second] == ["3", "4", "5"]
        assert other.claim_effects(10) == ()
        for entry in first:
            store.mark_delivered(entry.id)
        again = other.claim_effects(10, now=time.time() + 120)  # the claims ran out
        assert [e.payload for e in again] == ["3", "4", "5"]
    assert len(store.pending_effects()) == 3


def _restart_server() -> None:
    """Restart the test server at once (`pg_ctl -m immediate`: as if it crashed), as the
    server's user (`AGENTTX_PG_USER`, default `postgres`) when run as root; skips unless
    `.ci/postgres` or the test session (tests/_pgserver.py) started it."""
    data = os.environ.get("AGENTTX_PG_DATA")
    if not data:
        if os.environ.get("AGENTTX_REQUIRE_POSTGRES") == "1":
            pytest.fail("AGENTTX_PG_DATA is not set: start the server with .ci/postgres")
        pytest.skip("AGENTTX_PG_DATA is not set: neither the tests nor .ci/postgres started it")
    pg_ctl = str(Path(os.environ.get("AGENTTX_PG_BIN", "/usr/lib/postgresql/15/bin")) / "pg_ctl")
    command = [pg_ctl, "-D", data, "-m", "immediate", "-w", "-t", "60", "restart"]
    command += ["-l", str(Path(data).parent / "server.log")]
    if os.geteuid() == 0:
        user = os.environ.get("AGENTTX_PG_USER") or "postgres"
        command = ["runuser", "-u", user, "--", *command]
    subprocess.run(command, check=True, capture_output=True, timeout=120)


def test_a_server_restart_loses_nothing_acknowledged(store: PostgresStore) -> None:
    """Commits run while the server restarts: calls during the restart raise StorageError,
    the store reconnects, every commit that returned is there, and a transaction begun before
    the restart commits after it."""
    store.begin("long")
    store.put("long", "long", '"before"')
    store.record_step("long", 1, "[1]", [], "p")
    acknowledged: list[str] = []
    failures: list[str] = []
    stop = threading.Event()

    def commit_forever() -> None:
        for n in itertools.count():
            if stop.is_set():
                return
            tx_id = f"r{n}"
            try:
                store.begin(tx_id)
                store.put(tx_id, f"k{n}", str(n))
                store.record_step(tx_id, 1, "[1]", [], "p")
                store.commit(tx_id)
            except StorageError as exc:
                failures.append(str(exc))
                time.sleep(0.05)
                continue
            acknowledged.append(f"k{n}")

    worker = threading.Thread(target=commit_forever)
    worker.start()
    try:
        time.sleep(0.5)
        _restart_server()
        time.sleep(1.0)
    finally:
        stop.set()
        worker.join(30)
    assert failures, "the restart went unnoticed"
    assert len(acknowledged) > 5
    with _other(store) as reader:
        for key in acknowledged:
            assert reader.read_committed(key) == key[1:], key
    for _attempt in range(20):
        try:
            assert store.commit("long") == 1
            break
        except StorageError:
            time.sleep(0.2)
    assert store.read_committed("long") == '"before"'


def test_a_pool_lends_the_store_its_connections(pg_schema: tuple[str, str]) -> None:
    """Given a psycopg_pool.ConnectionPool, the store takes two connections and gives them back
    at close; transactions and leases work as with a DSN."""
    from psycopg_pool import ConnectionPool  # noqa: PLC0415

    dsn, schema = pg_schema
    with ConnectionPool(dsn, min_size=2, max_size=4, open=True) as pool:
        with PostgresStore(pool, schema=schema, lease_seconds=0.3) as store:
            store.begin("t")
            store.put("t", "k", "1")
            time.sleep(0.5)  # renewed through the pool's second connection
            with _other(store) as rival:
                assert rival.claim("t", store.owner("t")) is None
            assert store.commit("t") == 1
            assert pool.get_stats()["pool_available"] <= 2
        assert pool.get_stats()["pool_available"] >= 2


def test_a_call_blocked_on_the_server_does_not_stop_the_renewals(
    store: PostgresStore,
) -> None:
    """While one commit waits for a lock past the lease, the store's other transactions keep
    their leases: the renewal does not wait for the store's lock."""
    with _other(store, lease_seconds=0.6) as holder, psycopg.connect(postgres_dsn()) as blocker:
        holder.begin("a")
        holder.put("a", "k", "1")
        holder.begin("b")
        owner = holder.owner("b")
        blocker.execute(f"SELECT * FROM {store.schema}.meta FOR UPDATE")
        committing = threading.Thread(target=holder.commit, args=("a",))
        committing.start()
        time.sleep(1.5)
        assert store.claim("b", owner) is None  # still renewed
        blocker.rollback()
        committing.join(10)
        assert store.read_committed("k") == "1"


def test_an_older_schema_is_migrated_keeping_its_data(store: PostgresStore) -> None:
    """A schema at version 1 (no approvals, plan audit, holds, units, rates, conversations,
    their message log or the decisions' notification) gains them, and keeps its state."""
    store.begin("t")
    store.put("t", "k", "1")
    store.commit("t")
    schema = store.schema
    _raw(f"DROP TABLE {schema}.requests, {schema}.plan_audit, {schema}.plan_holds")
    _raw(f"DROP TABLE {schema}.plan_units, {schema}.plan_rates")
    _raw(f"DROP TABLE {schema}.conversation_messages")
    _raw(f"ALTER TABLE {schema}.txs DROP COLUMN conversation")
    _raw(f"DROP FUNCTION {schema}.request_decided()")
    _raw(f"DELETE FROM {schema}.migrations WHERE version >= 2")
    with _other(store) as upgraded:
        assert upgraded.read_committed("k") == "1"
        assert upgraded.requests_of("t") == ()
        assert upgraded.plan_holds() == ()
        assert upgraded.plan_units() == ()
        assert upgraded.plan_rates() == ()
        upgraded.begin("t2", record="{}")
        upgraded.record_conversation("t2", "[1]", ["[2]"])
        assert upgraded.read_conversation("t2") == "[1]"
        assert upgraded.read_messages("t2", 9) == ("[2]",)
    versions = _raw(f"SELECT version FROM {schema}.migrations ORDER BY version")
    assert versions == [(1,), (2,), (3,), (4,), (5,), (6,), (7,), (8,)]


def test_two_workers_racing_for_one_approval_see_one_win(store: PostgresStore) -> None:
    """A request's state changes by compare-and-set: of two stores consuming one approved
    request at once, exactly one succeeds."""
    from agenttx.stores._approvals import RequestRow  # noqa: PLC0415

    row = RequestRow(
        id="apr-1", kind="approval", scope_id="t", state="APPROVED", digest="d", record="{}"
    )
    store.add_request(row)
    with pytest.raises(InvalidArgument, match="exists already"):
        store.add_request(row)
    with _other(store) as other:
        results: list[object] = []
        barrier = threading.Barrier(2)

        def consume(on: PostgresStore) -> None:
            barrier.wait()
            results.append(
                on.set_request_state("apr-1", ["APPROVED"], "CONSUMED", decision="{}", now=1.0)
            )

        threads = [threading.Thread(target=consume, args=(s,)) for s in (store, other)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(result is None for result in results) == [False, True]
    consumed = store.get_request("apr-1")
    assert consumed is not None
    assert consumed.state == "CONSUMED"
    assert [r.id for r in store.list_requests("approval", "CONSUMED", 10)] == ["apr-1"]


def test_a_failed_delivery_is_kept_and_offered_again_after_its_delay(store: PostgresStore) -> None:
    """Entries are read and claimed per transaction; a failed delivery keeps its error and
    count, releases its claim and is offered again once `not_before` has passed."""
    for tx_id in ("t1", "t2"):
        store.begin(tx_id)
        row = EffectRow(step_id=1, channel="c", payload=tx_id, idempotency_key=f"k-{tx_id}")
        store.record_step(tx_id, 1, "[1]", [row], "p")
        store.commit(tx_id)
    assert [e.payload for e in store.pending_effects(tx_id="t1")] == ["t1"]
    (claimed,) = store.claim_effects(10, tx_id="t2")
    assert claimed.payload == "t2"
    assert store.claim_effects(10, tx_id="t2") == ()  # held by this claim
    later = time.time() + 60
    store.mark_failed(claimed.id, "smtp down", not_before=later)
    (kept,) = store.pending_effects(tx_id="t2")
    assert (kept.attempts, kept.last_error, kept.not_before) == (1, "smtp down", later)
    assert store.claim_effects(10, tx_id="t2") == ()  # not due yet
    (again,) = store.claim_effects(10, tx_id="t2", now=later + 1)
    assert again.id == claimed.id
    store.mark_delivered(again.id)
    store.mark_failed(again.id, "too late", not_before=0)  # a no-op once delivered
    assert store.pending_effects(tx_id="t2") == ()
    with pytest.raises(InvalidArgument, match="finite"):
        store.mark_failed(again.id, "x", not_before=float("nan"))
    with pytest.raises(InvalidArgument, match="no outbox entry"):
        store.mark_delivered(10**9)


def test_a_closed_store_refuses_every_call(store: PostgresStore) -> None:
    """After close (idempotent), reads and writes raise StorageError naming the schema."""
    other = _other(store)
    other.close()
    other.close()
    for call in (other.pending_effects, other.running_plans, lambda: other.plan_runs(5)):
        with pytest.raises(StorageError, match=store.schema):
            call()


# ---------------------------------------------------------------- a worker that lost its lease


def _expire(holder: PostgresStore, tx_id: str) -> None:
    """The holder pauses past its lease (as under SIGSTOP): its renewal stops, its lease ends."""
    holder._renewer.stop()
    _raw(
        f"UPDATE {holder.schema}.txs SET lease_until = now() - interval '1 second' "
        "WHERE tx_id = %s",
        (tx_id,),
    )


class _Shop:
    """Tools that record every call they make (the external effects), and an engine on a
    store of the schema for each worker."""

    def __init__(self) -> None:
        self.calls: list[str] = []

        @agenttx.compensation(name="refund")
        def refund(payload: dict[str, Any]) -> None:
            self.calls.append(f"refund {payload['order']}")

        @agenttx.tool(name="charge")
        def charge(ctx: agenttx.ToolContext, order: str) -> dict[str, Any]:
            ctx.register_undo("refund", {"order": order})
            self.calls.append(f"charge {order}")
            ctx.state.put(f"orders/{order}", "charged")
            return {"order": order}

        @agenttx.tool(name="note")
        def note(ctx: agenttx.ToolContext, order: str) -> dict[str, Any]:
            self.calls.append(f"note {order}")
            ctx.state.put(f"notes/{order}", "noted")
            return {}

        @agenttx.tool(name="ship", needs_approval=True)
        def ship(order: str) -> dict[str, Any]:
            self.calls.append(f"ship {order}")
            return {"shipped": order}

        self.tools = [refund, charge, note, ship]

    def engine(self, store: PostgresStore) -> agenttx.Engine:
        return agenttx.Engine(
            tools=self.tools, store=store, config=agenttx.EngineConfig(idle_timeout=None)
        )


def _taken_over(
    store: PostgresStore, shop: _Shop, mode: Literal["abort", "resume"], first: str = "charge"
) -> tuple[agenttx.Transaction, PostgresStore, agenttx.Engine]:
    """A worker (on `store`) ran step 1 (tool `first`) then paused past its lease; another
    worker's recovery took the transaction over (`mode`). The paused worker's transaction,
    the other's store and engine."""
    tx = shop.engine(store).begin()
    assert tx.execute_step(1, first, {"order": "o1"}).ok
    _expire(store, tx.id)
    other = _other(store)
    engine = shop.engine(other)
    report = engine.recover(mode)
    assert report.transactions == 1
    return tx, other, engine


@pytest.mark.parametrize("action", ["step", "rollback"])
def test_a_worker_that_lost_its_lease_ends_nothing(store: PostgresStore, action: str) -> None:
    """A worker paused past its lease whose transaction recovery resumed elsewhere: its next
    step (or its rollback) fails with StorageError (lease lost), and its error path (rewind,
    abort, discard) deletes nothing: the new owner keeps the transaction, its step and the
    approval given meanwhile, and commits it."""
    shop = _Shop()
    tx, other, engine = _taken_over(store, shop, "resume", first="note")
    with other:
        resumed = engine.get(tx.id)
        waiting = resumed.execute_step(2, "ship", {"order": "o1"})
        assert waiting.status is StepStatus.NEEDS_APPROVAL
        assert waiting.approval is not None
        engine.approve(waiting.approval.id, actor="alice")
        late = (
            (lambda: tx.execute_step(2, "charge", {"order": "o2"}))
            if action == "step"
            else tx.rollback
        )
        with pytest.raises((StorageError, TransactionNotFound)) as caught:
            late()
        assert other.open_transactions() == (tx.id,)
        assert isinstance(caught.value, StorageError)
        assert "lease lost" in str(caught.value)
        with pytest.raises(StorageError, match="lease lost"):
            store.discard(tx.id)
        assert other.peek(tx.id).steps[0][0] == 1
        assert resumed.execute_step(2, "ship", {"order": "o1"}).ok
        resumed.commit()
    assert store.read_committed("notes/o1") == '"noted"'
    assert shop.calls == ["note o1", "ship o1"]


@pytest.mark.parametrize("tool", ["charge", "ship"])
def test_a_worker_that_lost_its_lease_runs_no_tool(store: PostgresStore, tool: str) -> None:
    """After a takeover, the paused worker's next call runs no tool (`charge`) and asks for no
    approval (`ship` needs one) in the transaction it no longer holds: StorageError (lease
    lost), nothing else; the transaction ends FAILED on that worker only."""
    shop = _Shop()
    tx, other, _engine = _taken_over(store, shop, "resume")
    with other:
        with pytest.raises(StorageError, match="lease lost"):
            tx.execute_step(2, tool, {"order": "o2"})
        assert other.requests_of(tx.id) == ()
        assert other.open_transactions() == (tx.id,)
    assert tx.status is agenttx.TxStatus.FAILED
    assert shop.calls == ["charge o1"]


def test_a_tool_checks_the_lease_first(store: PostgresStore) -> None:
    """The check before a tool renews a lease with less than half of it left (a late
    renewal), and refuses one another store took over at once (`load`) with lease lost."""
    shop = _Shop()
    tx = shop.engine(store).begin()
    _expire(store, tx.id)  # nobody took it over: the worker still holds it
    assert tx.execute_step(1, "charge", {"order": "o1"}).ok
    (left,) = _raw(
        f"SELECT lease_until > now() + interval '15 seconds' FROM {store.schema}.txs "
        "WHERE tx_id = %s",
        (tx.id,),
    )
    assert left == (True,)
    with _other(store) as thief:
        thief.load(tx.id)
        with pytest.raises(StorageError, match="lease lost"):
            tx.execute_step(2, "charge", {"order": "o2"})
        assert thief.peek(tx.id).steps == ((1, thief.peek(tx.id).steps[0][1]),)
    assert shop.calls == ["charge o1"]


def test_a_lost_lease_is_never_transaction_not_found(store: PostgresStore) -> None:
    """A transaction taken over and ended by another store: the holder's next write, and each
    call after it (reads, writes, the lease check, commit, discard), raises StorageError
    naming the transaction and the epoch it held, never TransactionNotFound."""
    store.begin("t")
    (epoch,) = _raw(f"SELECT epoch FROM {store.schema}.txs WHERE tx_id = 't'")[0]
    with _other(store) as thief:
        thief.load("t")
        thief.commit("t")
    message = rf"lease lost: transaction `t`, held here at epoch {epoch}, was ended"
    calls = {
        "record_progress": lambda: store.record_progress("t", "p"),
        "get": lambda: store.get("t", "k"),
        "put": lambda: store.put("t", "k", "1"),
        "snapshot": lambda: store.snapshot("t", 1),
        "check_lease": lambda: store.check_lease("t"),
        "commit": lambda: store.commit("t"),
        "discard": lambda: store.discard("t"),
        "discard_state": lambda: store.discard_state("t"),
    }
    for call in calls.values():
        with pytest.raises(StorageError, match=message):
            call()
    store.begin("t")  # held anew: a new transaction of that id
    store.commit("t")


def test_a_worker_whose_transaction_was_aborted_elsewhere_gets_lease_lost(
    store: PostgresStore,
) -> None:
    """Recovery aborted the paused worker's transaction (its row is gone): the worker's next
    step raises StorageError (lease lost), not TransactionNotFound, and runs no tool."""
    shop = _Shop()
    tx, other, _engine = _taken_over(store, shop, "abort")
    other.close()
    with pytest.raises(StorageError, match="lease lost"):
        tx.execute_step(2, "charge", {"order": "o2"})
    assert shop.calls == ["charge o1", "refund o1"]
