"""agenttx.stores.SQLiteStore: the Store contract on disk, the DurableStore records, the outbox."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import multiprocessing
import os
import pathlib
import shutil
import sqlite3
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import agenttx
import agenttx.stores._sqlite_file as file_module
from agenttx import (
    AgentTxError,
    InvalidArgument,
    ReadConflict,
    StorageError,
    TransactionNotFound,
    WriteConflict,
)
from agenttx._limits import ISOLATION_LEVELS
from agenttx.stores import (
    DurableStore,
    EffectRow,
    MemoryStore,
    OutboxEntry,
    SQLiteStore,
    Store,
    TxImage,
    UndoRow,
)
from agenttx.stores._sqlite_file import StoreFile
from agenttx.stores._sqlite_mirror import replay
from agenttx.testing import check_store

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

# ---------------------------------------------------------------- helpers


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "store.db")


@pytest.fixture
def store(path: str) -> Iterator[SQLiteStore]:
    with SQLiteStore(path) as opened:
        yield opened


def as_effect(entry: OutboxEntry) -> EffectRow:
    """The effect an outbox entry holds."""
    return EffectRow(
        step_id=entry.step_id,
        channel=entry.channel,
        payload=entry.payload,
        idempotency_key=entry.idempotency_key,
    )


def committed(store: Store, **values: str) -> None:
    """Commit `values` (keys given as keyword names) in one transaction of its own."""
    store.begin("setup")
    for key, value in values.items():
        store.put("setup", key, value)
    store.commit("setup")


def reopen(path: str, *tx_ids: str) -> SQLiteStore:
    """A new store on the file that has loaded `tx_ids`: what a process does after a crash."""
    fresh = SQLiteStore(path)
    for tx_id in tx_ids:
        fresh.load(tx_id)
    return fresh


@contextlib.contextmanager
def raw(path: str) -> Iterator[sqlite3.Connection]:
    """A plain SQLite connection to the file, to look at or damage what the store wrote."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        yield connection
    finally:
        connection.close()


EFFECT_1 = EffectRow(step_id=1, channel="email", payload='{"to":"a"}', idempotency_key="k1")
EFFECT_2 = EffectRow(step_id=2, channel="email", payload='{"to":"b"}', idempotency_key="k2")

# ---------------------------------------------------------------- the Store contract


def test_check_store_passes(tmp_path: Path) -> None:
    """SQLiteStore passes the conformance suite, each example on a new file."""
    counter = itertools.count()
    check_store(lambda: SQLiteStore(tmp_path / f"{next(counter)}.db"), max_examples=40)


def test_satisfies_both_protocols(store: SQLiteStore) -> None:
    """SQLiteStore is a Store and a DurableStore at run time; MemoryStore is not durable."""
    assert isinstance(store, Store)
    assert isinstance(store, DurableStore)
    assert not isinstance(MemoryStore(), DurableStore)


TX_IDS = ("t1", "t2", "t3")
KEYS = ("a", "b", "ключ")
VALUES = ("1", '"x"', "null", '{"k":["é",2.5]}', "")
STEPS = (0, 1, 2, 3)

# One op is (name, argument); all ops of a `work` rule go to one transaction, so that the calls
# that must meet for a bug to show (writes, flushes, rewinds) are made densely.
_OPS = st.one_of(
    st.tuples(st.just("put"), st.tuples(st.sampled_from(KEYS), st.sampled_from(VALUES))),
    st.tuples(st.just("delete"), st.sampled_from(KEYS)),
    st.tuples(st.just("get"), st.sampled_from(KEYS)),
    st.tuples(st.sampled_from(("snapshot", "restore")), st.sampled_from(STEPS)),
    st.tuples(st.sampled_from(("record_step", "record_step_with_effect")), st.sampled_from(STEPS)),
    st.tuples(
        st.sampled_from(("flush", "record_progress", "written_keys", "commit", "discard")),
        st.none(),
    ),
)


@dataclasses.dataclass
class _Durable:
    """The model of a transaction's durable records: what `load` must give back."""

    progress: str | None = None
    steps: dict[int, str] = dataclasses.field(default_factory=dict)
    effects: list[EffectRow] = dataclasses.field(default_factory=list)


class StoresAgree(RuleBasedStateMachine):
    """MemoryStore and SQLiteStore get the same calls; every result, error and state agrees.

    `reopen` flushes every open transaction, opens the file in a new SQLiteStore and loads
    them all, as recovery after a crash does: nothing observable may change. `flush`,
    `record_step` and `record_progress` go to SQLite only: they change no `Store` observable,
    and a small model checks the steps, effects, progress and outbox they leave, and the live
    steps each ended transaction is kept with as history.
    """

    #: Whether the SQLiteStore is opened with `exclusive=True`: then the file is read through
    #: the store's own connection, and `reopen` closes the store before it opens a new one.
    exclusive = False

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="agenttx-stores-agree-")
        self.path = str(pathlib.Path(self.directory) / "store.db")
        self.memory = MemoryStore()
        self.sqlite = self.open_store()
        self.raw = None if self.exclusive else sqlite3.connect(self.path, isolation_level=None)
        self.durable: dict[str, _Durable] = {}
        self.outbox: list[tuple[str, EffectRow]] = []
        #: The live steps each ended transaction left, as its history keeps them.
        self.ended: dict[str, tuple[tuple[int, str], ...]] = {}
        self.counter = itertools.count()

    def open_store(self) -> Any:
        """A new durable store on the machine's backend (`test_postgres_store` overrides it)."""
        return SQLiteStore(self.path, exclusive=self.exclusive)

    @property
    def file(self) -> sqlite3.Connection:
        """A connection to the file, for reading what it holds."""
        return self.sqlite._conn if self.raw is None else self.raw

    def teardown(self) -> None:
        if self.raw is not None:
            self.raw.close()
        self.sqlite.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def both(self, label: str, call: Callable[[Any], object]) -> bool:
        """Make the call on both stores; the outcomes must agree. True if it returned."""
        outcomes = []
        for store in (self.memory, self.sqlite):
            try:
                outcomes.append(("returned", call(store)))
            except AgentTxError as exc:
                outcomes.append(("raised", type(exc).__name__, str(exc)))
        assert outcomes[0] == outcomes[1], f"{label}: memory {outcomes[0]}, sqlite {outcomes[1]}"
        return outcomes[0][0] == "returned"

    def durable_call(self, tx: str, name: str, step: int) -> None:
        """A SQLite-only durable call, mirrored in the model."""
        model, text = self.durable[tx], f'"{next(self.counter)}"'
        if name == "record_progress":
            self.sqlite.record_progress(tx, text)
        elif name == "flush":
            self.sqlite.flush(tx)
            return
        else:
            effects = [
                EffectRow(
                    step_id=step, channel="channel", payload=text, idempotency_key=f"key{text}"
                )
            ]
            effects = effects if name == "record_step_with_effect" else []
            if step % 2 and model.progress is not None:
                text = model.progress  # a step that leaves the progress as it was
            self.sqlite.record_step(tx, step, f"[{text}]", effects, text)
            model.steps[step] = f"[{text}]"
            model.effects += effects
        model.progress = text

    @rule(
        tx=st.sampled_from(TX_IDS),
        isolation=st.sampled_from(ISOLATION_LEVELS),
        ops=st.lists(_OPS, min_size=1, max_size=8),
    )
    def work(self, tx: str, isolation: str, ops: list[tuple[str, Any]]) -> None:
        """Calls on one transaction; it is begun first (at the isolation level) if not open."""
        for name, argument in ops:
            if not self.memory.is_open(tx):
                self.both(f"begin({tx!r})", lambda s: s.begin(tx, isolation=isolation))
                self.durable[tx] = _Durable()
            label = f"{name}({tx!r}, {argument!r})"
            if name in {"flush", "record_progress", "record_step", "record_step_with_effect"}:
                self.durable_call(tx, name, argument)
            elif name == "put":
                self.both(label, lambda s, kv=argument: s.put(tx, *kv))
            elif name in {"delete", "get", "snapshot"}:
                self.both(label, lambda s, n=name, a=argument: getattr(s, n)(tx, a))
            elif name == "restore":
                if self.both(label, lambda s, a=argument: s.restore(tx, a)):
                    model = self.durable[tx]
                    model.steps = {k: v for k, v in model.steps.items() if k < argument}
                    model.effects = [e for e in model.effects if e.step_id < argument]
            elif self.both(label, lambda s, n=name: getattr(s, n)(tx)) and name != "written_keys":
                ended = self.durable.pop(tx)  # committed or discarded
                self.ended[tx] = tuple(sorted(ended.steps.items()))
                if name == "commit":
                    self.outbox += [(tx, effect) for effect in ended.effects]

    @rule(tx=st.sampled_from(TX_IDS))
    def begin_again(self, tx: str) -> None:
        """Beginning an open transaction fails alike; a closed one begins alike."""
        if self.both(f"begin({tx!r})", lambda s: s.begin(tx)):
            self.durable[tx] = _Durable()

    @rule()
    def reopen(self) -> None:
        """Flush, reopen the file in a new store and load every open transaction."""
        open_txs = tuple(tx for tx in TX_IDS if self.memory.is_open(tx))
        for tx in open_txs:
            self.sqlite.flush(tx)
        if self.exclusive:  # the lock goes with the store
            self.sqlite.close()
        fresh = self.open_store()
        assert fresh.open_transactions() == open_txs
        for tx in open_txs:
            image, model = fresh.load(tx), self.durable[tx]
            assert image.progress == model.progress, tx
            assert image.steps == tuple(sorted(model.steps.items())), tx
            assert image.effects == tuple(model.effects), tx
        self.sqlite.close()
        self.sqlite = fresh

    @invariant()
    def same_state(self) -> None:
        memory, sqlite = self.memory, self.sqlite
        for tx in TX_IDS:
            assert memory.is_open(tx) == sqlite.is_open(tx), tx
            if not memory.is_open(tx):
                continue
            mine, theirs = memory._txs[tx], sqlite._txs[tx]
            assert theirs.overlay == mine.overlay, tx
            assert theirs.journal == mine.journal, tx
            assert dict(theirs.snapshots) == dict(mine.snapshots), tx
            assert (theirs.reads, theirs.serializable) == (mine.reads, mine.serializable), tx
            for step in STEPS:
                if step not in mine.snapshots:
                    self.both(f"restore({tx!r}, {step})", lambda s, t=tx, k=step: s.restore(t, k))
        for key in KEYS:
            self.both(f"read_committed({key!r})", lambda s, key=key: s.read_committed(key))
            self.both(f"committed_version({key!r})", lambda s, key=key: s.committed_version(key))
        open_txs = tuple(tx for tx in TX_IDS if memory.is_open(tx))
        assert sqlite.open_transactions() == open_txs
        pending = [(entry.tx_id, as_effect(entry)) for entry in sqlite.pending_effects(999)]
        assert pending == self.outbox
        assert {row.tx_id for row in sqlite.ended_transactions()} == set(self.ended)
        for tx, steps in self.ended.items():
            assert sqlite.peek_ended(tx)[1].steps == steps, tx

    @invariant()
    def file_agrees(self) -> None:
        """The file holds exactly the flushed journal; replaying it, plus the events not yet
        written, rebuilds the mirror: a flush and reload now would change nothing."""
        for tx in TX_IDS:
            if not self.memory.is_open(tx):
                continue
            live = self.sqlite._txs[tx]
            rows = self.file.execute(
                "SELECT seq, kind, step, num, name, body, extra FROM log WHERE tx_id = ? "
                "ORDER BY seq",
                (tx,),
            ).fetchall()
            writes = {row[0]: row for row in rows if row[1] == file_module.WRITE}
            assert len(writes) == live.flushed, tx
            for position in range(live.flushed):
                key, _, (base, value) = live.journal[position]
                row = writes[live.seq_at(position)]
                assert (row[4], row[3], row[5]) == (key, base, value), (tx, position)
            pending = [row[1:] for row in live.pending(tx, len(live.journal))]
            (isolation,) = self.file.execute(
                "SELECT isolation FROM txs WHERE tx_id = ?", (tx,)
            ).fetchone()
            replayed, steps, progress = replay(
                tx, rows + pending, isolation=isolation, path=self.sqlite.path
            )
            model = self.durable[tx]
            assert (steps, progress) == (model.steps, model.progress), tx
            assert replayed.effects == live.effects == model.effects, tx
            assert replayed.overlay == live.overlay, tx
            assert replayed.journal == live.journal, tx
            assert dict(replayed.snapshots) == dict(live.snapshots), tx
            assert (replayed.reads, replayed.serializable) == (live.reads, live.serializable), tx
            positions = range(live.flushed)
            assert [replayed.seq_at(p) for p in positions] == [live.seq_at(p) for p in positions]


def test_sqlite_agrees_with_memory() -> None:
    """Random interleavings of three transactions, reopens included, give identical results."""
    run_state_machine_as_test(
        StoresAgree, settings=settings(max_examples=100, stateful_step_count=40, deadline=None)
    )


class StoresAgreeExclusive(StoresAgree):
    """The same, with the SQLiteStore opened `exclusive=True` (no owner checks in its writes,
    and commits that skip validating versions no other commit can have changed)."""

    exclusive = True


def test_exclusive_sqlite_agrees_with_memory() -> None:
    """Exclusive mode changes nothing observable, conflicts included."""
    run_state_machine_as_test(
        StoresAgreeExclusive,
        settings=settings(max_examples=60, stateful_step_count=40, deadline=None),
    )


@pytest.mark.slow
def test_sqlite_agrees_with_memory_long_campaign() -> None:
    """The differential machine, run much longer."""
    for machine in (StoresAgree, StoresAgreeExclusive):
        run_state_machine_as_test(
            machine, settings=settings(max_examples=2000, stateful_step_count=80, deadline=None)
        )


# ---------------------------------------------------------------- durability


def test_commits_are_seen_by_another_instance(path: str) -> None:
    """Data committed by one store is read, with its version, by another on the same file."""
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        committed(first, a="1", b="2")
        assert second.read_committed("a") == "1"
        assert second.committed_version("b") == 1
        second.begin("t")
        second.delete("t", "a")
        assert second.commit("t") == 1
        assert first.read_committed("a") is None
        assert first.committed_version("a") == 0
    with SQLiteStore(path) as third:
        assert third.read_committed("b") == "2"
        assert third.committed_version("b") == 1


def test_flushed_state_survives_reopen_and_load(path: str) -> None:
    """Writes, snapshots, steps, undo records, effects and progress come back from the file."""
    with SQLiteStore(path) as first:
        committed(first, a='"old"')
        first.begin("t")
        first.record_transaction("t", '{"agent":"x"}')
        first.snapshot("t", 1)
        first.put("t", "a", '"new"')
        first.record_undo("t", UndoRow(step_id=1, seq=0, record='{"kind":"fs"}'))
        first.put("t", "b", "2")
        first.record_step("t", 1, '{"out":1}', [EFFECT_1], '{"next":2}')
        first.snapshot("t", 2)
        first.delete("t", "a")
        first.record_step("t", 2, '{"out":2}', [EFFECT_2], '{"next":3}')
        owner = json.loads(first._owner)

    with SQLiteStore(path) as second:
        assert second.open_transactions() == ("t",)
        assert not second.is_open("t")
        image = second.load("t")
        assert image == TxImage(
            tx_id="t",
            record='{"agent":"x"}',
            progress='{"next":3}',
            steps=((1, '{"out":1}'), (2, '{"out":2}')),
            undos=(UndoRow(step_id=1, seq=0, record='{"kind":"fs"}'),),
            effects=(EFFECT_1, EFFECT_2),
            owner=image.owner,
            snapshots=(0, 1, 2),
        )
        assert json.loads(image.owner or "") == owner
        assert set(owner) == {"pid", "hostname", "token"}
        assert owner["pid"] == os.getpid()
        assert second.is_open("t")
        assert second.get("t", "a") is None
        assert second.written_keys("t") == ("a", "b")
        assert second.restore("t", 2) == 1
        assert second.get("t", "a") == '"new"'
        assert second.restore("t", 1) == 2
        assert second.get("t", "a") == '"old"'
        assert second.written_keys("t") == ()


def test_begin_writes_the_record_with_the_row(path: str) -> None:
    """`begin(record=...)` is durable at once; `record_transaction` replaces the record."""
    with SQLiteStore(path) as first:
        first.begin("t", record='{"agent":"x"}')
        first.begin("u")
        with SQLiteStore(path) as second:
            assert second.peek("t").record == '{"agent":"x"}'
            assert second.peek("u").record == "null"
        first.record_transaction("t", '{"agent":"y"}')
    with SQLiteStore(path) as second:
        assert second.load("t").record == '{"agent":"y"}'


def test_writes_after_the_last_durable_point_are_lost(path: str) -> None:
    """A reopen without flush keeps the state of the last durable write, snapshots included."""
    first = SQLiteStore(path)
    first.begin("t")
    first.put("t", "a", "1")
    first.record_progress("t", '{"next":1}')
    first.snapshot("t", 1)
    first.put("t", "b", "2")  # buffered: never written
    first.close()  # as a crash: close() does not flush

    with reopen(path, "t") as second:
        assert second.get("t", "a") == "1"
        assert second.get("t", "b") is None
        assert second.written_keys("t") == ("a",)
        with pytest.raises(StorageError, match="snapshot for step 1 of transaction `t` not found"):
            second.restore("t", 1)
        assert second.restore("t", 0) == 1


def test_claim_is_a_compare_and_set_on_the_owner(path: str) -> None:
    """Of two recoverers that read the same dead owner, the first claim wins and the second
    gets None; neither can claim from a store still open in this process."""
    with SQLiteStore(path) as dead:
        dead.begin("t")
        dead.put("t", "a", "1")
        dead.flush("t")
        owner = dead.owner("t")
    first, second = SQLiteStore(path), SQLiteStore(path)
    image = first.claim("t", owner)
    assert image is not None
    assert image.owner == owner
    assert first.is_open("t")
    assert first.get("t", "a") == "1"
    assert second.claim("t", owner) is None  # the owner changed: the compare fails
    assert not second.is_open("t")
    assert second.claim("t", first.owner("t")) is None  # first is open here: alive
    assert first.claim("t", first.owner("t")) is None  # nor from itself
    current = first.owner("t")
    first.close()  # now that owner is gone
    assert second.claim("t", current) is not None
    assert second.owner("t") != current
    with pytest.raises(TransactionNotFound):
        second.claim("nope", None)
    second.close()


def test_discard_state_releases_the_transaction(path: str) -> None:
    """After discard_state no store holds the transaction: its owner is None, any store may
    claim it, even in the process that released it."""
    with SQLiteStore(path) as store:
        store.begin("t")
        store.record_undo("t", UndoRow(step_id=1, seq=0, record='"u"'))
        store.discard_state("t")
        assert store.owner("t") is None
        image = store.claim("t", None)
        assert image is not None
        assert image.undos == (UndoRow(step_id=1, seq=0, record='"u"'),)


@pytest.mark.parametrize("name", ["discard", "discard_state"])
def test_a_store_that_lost_a_transaction_does_not_discard_it(path: str, name: str) -> None:
    """discard (or discard_state) by a store that held the transaction and lost it to a
    takeover raises StorageError and deletes nothing: the new owner keeps it; so does every
    later discard there, even once the new owner ended it."""
    with SQLiteStore(path) as old, SQLiteStore(path) as new:
        old.begin("t")
        old.put("t", "a", "1")
        old.flush("t")
        new.load("t")
        with pytest.raises(StorageError, match="taken over"):
            getattr(old, name)("t")
        assert not old.is_open("t")
        assert new.get("t", "a") == "1"
        assert new.commit("t") == 1
        with pytest.raises(StorageError, match="lease lost"):
            old.discard("t")


def test_a_store_that_found_a_transaction_lost_ends_nothing_of_it_later(path: str) -> None:
    """Once a write found the transaction taken over, the store's later calls on it (a discard,
    a commit, a read) raise StorageError (lease lost) and end nothing: the new owner keeps it."""
    with SQLiteStore(path) as old, SQLiteStore(path) as new:
        old.begin("t")
        old.put("t", "a", "1")
        old.flush("t")
        new.load("t")
        with pytest.raises(StorageError, match="lease lost"):
            old.record_progress("t", "{}")
        for call in (old.discard, old.discard_state, old.commit, old.written_keys):
            with pytest.raises(StorageError, match="lease lost: transaction `t`"):
                call("t")
        assert new.open_transactions() == ("t",)
        assert new.commit("t") == 1
    with SQLiteStore(path) as store:
        assert store.read_committed("a") == "1"


def test_load_of_a_transaction_held_here_flushes_it_first(store: SQLiteStore) -> None:
    """load() of a transaction this store holds keeps its buffered writes and snapshots."""
    store.begin("t")
    store.put("t", "a", "1")
    store.snapshot("t", 1)
    store.put("t", "a", "2")
    image = store.load("t")
    assert image.owner == store._owner
    assert store.get("t", "a") == "2"
    assert store.restore("t", 1) == 1
    assert store.get("t", "a") == "1"


def test_serializable_reads_survive_a_reload(path: str) -> None:
    """The read set is durable: a reloaded serializable transaction still conflicts."""
    with SQLiteStore(path) as first:
        committed(first, a="1")
        first.begin("t", isolation="serializable")
        assert first.get("t", "a") == "1"
        first.put("t", "b", "2")
        first.flush("t")
    with reopen(path, "t") as second:
        committed(second, a="9")
        with pytest.raises(ReadConflict) as caught:
            second.commit("t")
        assert caught.value.key == "a"


def test_read_versions_survive_a_reload_by_default(path: str) -> None:
    """At the default level a read fixes the key's base durably: a reloaded transaction that
    writes the key after another commit changed it conflicts."""
    with SQLiteStore(path) as first:
        committed(first, n="1")
        first.begin("t")
        assert first.get("t", "n") == "1"
        first.flush("t")
    with reopen(path, "t") as second:
        committed(second, n="9")
        second.put("t", "n", "2")
        with pytest.raises(WriteConflict) as caught:
            second.commit("t")
        assert type(caught.value) is WriteConflict


def test_read_committed_records_no_reads(path: str) -> None:
    """Read committed writes no READ event, so its reads cost nothing on disk."""
    with SQLiteStore(path) as store:
        store.begin("t", isolation="read_committed")
        store.get("t", "a")
        store.put("t", "b", "1")
        store.flush("t")
        with raw(path) as connection:
            kinds = connection.execute("SELECT kind FROM log WHERE tx_id = 't'").fetchall()
        assert kinds == [(file_module.WRITE,)]


def _schema_1_file(path: str) -> None:
    """A store file as the first release wrote it: schema 1, with a `serializable` column."""
    with raw(path) as connection:
        for statement in file_module.MIGRATIONS[0]:
            connection.execute(statement)
        connection.execute(f"PRAGMA application_id = {file_module.APPLICATION_ID}")
        connection.execute("PRAGMA user_version = 1")
        connection.execute("INSERT INTO committed VALUES ('a', 1, '1')")
        connection.execute("UPDATE meta SET commit_version = 1")
        for tx_id, serializable in (("ser", 1), ("rc", 0)):
            connection.execute(
                "INSERT INTO txs (tx_id, record, owner, serializable) VALUES (?, '{}', NULL, ?)",
                (tx_id, serializable),
            )
            # Each read `a` at version 1 and wrote `b` (base 0).
            connection.executemany(
                "INSERT INTO log (tx_id, seq, kind, num, name, body) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (tx_id, 0, file_module.WRITE, 0, "b", "2"),
                    *([(tx_id, 1, file_module.READ, 1, "a", None)] if serializable else []),
                ],
            )


def test_schema_1_is_migrated_keeping_each_transactions_isolation(path: str) -> None:
    """A file of schema 1 is migrated: serializable 1 stays serializable (its reads are
    validated), 0 becomes read committed (a rewrite of a key it read does not conflict)."""
    _schema_1_file(path)
    with SQLiteStore(path) as store:
        with raw(path) as connection:
            assert (
                connection.execute("PRAGMA user_version").fetchone()[0]
                == file_module.SCHEMA_VERSION
            )
            rows = connection.execute("SELECT tx_id, isolation FROM txs ORDER BY tx_id")
            assert rows.fetchall() == [("rc", "read_committed"), ("ser", "serializable")]
        assert store.open_transactions() == ("rc", "ser")
        for tx_id in ("ser", "rc"):
            store.load(tx_id)
            assert store.get(tx_id, "b") == "2"
        committed(store, a="9")
        with pytest.raises(ReadConflict):
            store.commit("ser")
        assert store.get("rc", "a") == "9"
        store.put("rc", "a", "10")
        assert store.commit("rc") == 2
        assert store.read_committed("a") == "10"


def test_an_unknown_isolation_in_the_file_is_corruption(path: str) -> None:
    """A transaction row with a level this code does not know is refused on load, not guessed."""
    with SQLiteStore(path) as store:
        store.begin("t")
        store.close()
    with raw(path) as connection:
        connection.execute("UPDATE txs SET isolation = 'snapshot'")
    with SQLiteStore(path) as store, pytest.raises(StorageError, match="unknown isolation"):
        store.load("t")


def test_replaced_progress_rows_are_deleted_in_batches(store: SQLiteStore, path: str) -> None:
    """The log keeps fewer than 33 replaced progress rows; the last progress wins on load."""
    store.begin("t")
    for n in range(100):
        store.record_progress("t", str(n))
        with raw(path) as connection:
            rows = connection.execute("SELECT count(*) FROM log WHERE kind = 6").fetchone()[0]
        assert rows <= 33
    store.record_step("t", 1, "{}", [], "step")
    assert store.load("t").progress == "step"
    store.record_progress("t", "after")
    assert store.load("t").progress == "after"


def test_a_step_that_keeps_the_progress_writes_none_and_keeps_its_holder(
    store: SQLiteStore, path: str
) -> None:
    """A step whose progress is unchanged stores NULL for it; the progress row it leaves
    current is never deleted as replaced, however many batches of deletions run."""
    store.begin("t")
    for n in range(1, 80):
        store.record_progress("t", f"p{n}")
        store.record_step("t", n, "{}", [], f"p{n}")
        if n in {32, 33, 79}:  # the replaced rows are (or are about to be) 31, 32 and more
            store.record_step("t", n, "{}", [], f"p{n}")
            with SQLiteStore(path, readonly=True) as reader:  # the file, not the mirror
                assert reader.peek("t").progress == f"p{n}", n
    with raw(path) as connection:
        extras = connection.execute("SELECT extra FROM log WHERE kind = 4").fetchall()
        progress_rows = connection.execute("SELECT count(*) FROM log WHERE kind = 6").fetchone()
    assert set(extras) == {(None,)}
    assert progress_rows[0] <= 33
    store.record_step("t", 80, "{}", [], "new")
    assert store.load("t").progress == "new"


def test_flush_is_idempotent_and_writes_nothing_when_clean(store: SQLiteStore, path: str) -> None:
    """A second flush runs no SQL: the log does not grow (snapshot 0 of `begin` needs no row)."""
    store.begin("t")
    store.put("t", "a", "1")
    store.flush("t")
    with raw(path) as connection:
        rows = connection.execute("SELECT count(*) FROM log").fetchone()[0]
    store.flush("t")
    with raw(path) as connection:
        assert connection.execute("SELECT count(*) FROM log").fetchone()[0] == rows == 1


# ---------------------------------------------------------------- commit, restore, discard_state


def test_commit_moves_effects_to_the_outbox_atomically(path: str) -> None:
    """Commit publishes, moves the effects in commit then staging order and deletes the rows."""
    with SQLiteStore(path) as store:
        store.begin("t1")
        store.put("t1", "a", "1")
        store.record_undo("t1", UndoRow(step_id=1, seq=0, record="{}"))
        store.record_step("t1", 1, "{}", [EFFECT_1, EFFECT_2], "{}")
        store.begin("t2")
        store.put("t2", "a", "2")
        store.record_step("t2", 1, "{}", [EFFECT_2], "{}")
        store.commit("t2")
        # t1 conflicts on `a`: nothing moves, nothing is published, t1 stays open.
        with pytest.raises(WriteConflict):
            store.commit("t1")
        assert store.is_open("t1")
        assert [entry.tx_id for entry in store.pending_effects()] == ["t2"]
        store.discard("t1")
        store.begin("t3")
        store.record_step("t3", 1, "{}", [EFFECT_1], "{}")
        store.record_step("t3", 2, "{}", [EFFECT_2], "{}")
        assert store.commit("t3") == 0
        assert store.open_transactions() == ()
        pending = store.pending_effects()
    assert [(e.tx_id, e.idempotency_key) for e in pending] == [
        ("t2", "k2"),
        ("t3", "k1"),
        ("t3", "k2"),
    ]
    assert pending[1] == OutboxEntry(
        id=pending[1].id,
        tx_id="t3",
        step_id=1,
        channel="email",
        payload='{"to":"a"}',
        idempotency_key="k1",
        attempts=0,
        last_error=None,
        not_before=0.0,
    )
    with raw(path) as connection:
        for table in ("txs", "log", "undos"):
            assert connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0
        assert connection.execute("SELECT count(*) FROM ended").fetchone()[0] == 3  # history


def test_restore_drops_steps_and_effects_but_not_undo_records(path: str) -> None:
    """restore(K) forgets the steps and effects of steps >= K; undo records stay."""
    with SQLiteStore(path) as store:
        store.begin("t")
        for step, effect in ((1, EFFECT_1), (2, EFFECT_2)):
            store.snapshot("t", step)
            store.put("t", f"k{step}", "1")
            store.record_undo("t", UndoRow(step_id=step, seq=0, record=f'"undo {step}"'))
            store.record_step("t", step, f'"step {step}"', [effect], f'"after {step}"')
        assert store.restore("t", 2) == 1
        image = store.load("t")
        assert image.steps == ((1, '"step 1"'),)
        assert image.effects == (EFFECT_1,)
        assert image.undos == (
            UndoRow(step_id=1, seq=0, record='"undo 1"'),
            UndoRow(step_id=2, seq=0, record='"undo 2"'),
        )
        assert image.progress == '"after 2"'
        store.forget_undo("t", 2, 0)
        store.forget_undo("t", 2, 0)  # idempotent
        store.commit("t")
        assert [entry.idempotency_key for entry in store.pending_effects()] == ["k1"]


def test_discard_state_keeps_the_record_and_undo_records(path: str) -> None:
    """discard_state ends the state; the record and undo records wait for recovery."""
    with SQLiteStore(path) as store:
        store.begin("t")
        store.record_transaction("t", '{"r":1}')
        store.put("t", "a", "1")
        store.record_undo("t", UndoRow(step_id=1, seq=0, record='"u"'))
        store.record_step("t", 1, "{}", [EFFECT_1], '"p"')
        store.discard_state("t")
        store.discard_state("t")  # idempotent
        assert not store.is_open("t")
        assert store.open_transactions() == ("t",)
        with pytest.raises(InvalidArgument, match="kept there for recovery"):
            store.begin("t")
    with SQLiteStore(path) as recovery:
        image = recovery.load("t")
        assert (image.record, image.undos) == (
            '{"r":1}',
            (UndoRow(step_id=1, seq=0, record='"u"'),),
        )
        assert (image.progress, image.steps, image.effects) == (None, (), ())
        assert recovery.written_keys("t") == ()
        assert recovery.restore("t", 0) == 0
        recovery.forget_undo("t", 1, 0)
        recovery.discard("t")
        assert recovery.open_transactions() == ()
        recovery.begin("t")  # the id is free again


def test_discard_of_unknown_or_malformed_ids_does_nothing(store: SQLiteStore) -> None:
    """discard and discard_state of ids that name no transaction are no-ops."""
    for tx_id in ("nope", "bad id", ""):
        store.discard(tx_id)
        store.discard_state(tx_id)
    assert store.open_transactions() == ()


# ---------------------------------------------------------------- ownership


def test_a_transaction_taken_over_is_fenced(path: str) -> None:
    """After another store loads it, the first store's durable writes fail and it lets go."""
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        first.begin("t")
        first.put("t", "a", "1")
        first.flush("t")
        assert second.owner("t") == first._owner
        image = second.load("t")
        assert image.owner == first._owner
        assert first.owner("t") == second._owner
        first.put("t", "a", "2")
        with pytest.raises(StorageError, match="taken over by another store") as caught:
            first.record_progress("t", "{}")
        assert caught.value.__cause__ is None
        assert not first.is_open("t")
        with pytest.raises(StorageError, match="lease lost"):
            first.commit("t")
        assert second.get("t", "a") == "1"
        assert second.commit("t") == 1


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.record_transaction("t", "{}"),
        lambda s: s.record_undo("t", UndoRow(step_id=1, seq=0, record="{}")),
        lambda s: s.forget_undo("t", 1, 0),
        lambda s: s.record_progress("t", "{}"),
        lambda s: s.record_step("t", 1, "{}", [EFFECT_1], "{}"),
        lambda s: s.restore("t", 0),
        lambda s: s.commit("t"),
        lambda s: (s.put("t", "a", "1"), s.flush("t")),
        lambda s: (
            s.put("t", "a", "1"),
            s.record_undo("t", UndoRow(step_id=1, seq=0, record="{}")),
        ),
    ],
)
def test_every_durable_call_is_fenced(path: str, call: Callable[[SQLiteStore], object]) -> None:
    """Each call that writes the file checks ownership: after a takeover, it changes nothing."""
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        first.begin("t")
        first.record_undo("t", UndoRow(step_id=1, seq=0, record='"kept"'))
        second.load("t")
        with pytest.raises(StorageError, match="taken over by another store"):
            call(first)
        assert not first.is_open("t")
        image = second.load("t")
        assert (image.record, image.undos, image.progress) == (
            "null",
            (UndoRow(step_id=1, seq=0, record='"kept"'),),
            None,
        )
        assert second.written_keys("t") == ()


def test_a_transaction_ended_elsewhere_is_a_lost_lease(path: str) -> None:
    """If another store discards it, the holder's next durable write, and every call after it,
    raises StorageError (lease lost), naming the transaction, not TransactionNotFound."""
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        first.begin("t")
        second.discard("t")
        first.put("t", "a", "1")
        with pytest.raises(StorageError, match=r"lease lost: transaction `t`.*ended by another"):
            first.commit("t")
        assert not first.is_open("t")
        for call in (lambda: first.get("t", "a"), lambda: first.discard("t")):
            with pytest.raises(StorageError, match="lease lost"):
                call()


def test_begin_refuses_an_id_open_in_another_store(path: str) -> None:
    """Transaction ids are unique across the file, not only in one store."""
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        first.begin("t")
        with pytest.raises(InvalidArgument, match="already open in another store"):
            second.begin("t")
        with pytest.raises(InvalidArgument, match="already open: commit or discard it first"):
            first.begin("t")


def test_load_and_owner_of_an_unknown_transaction_raise(store: SQLiteStore) -> None:
    """load() and owner() need a row in the file, and a well-formed id."""
    for call in (store.load, store.owner):
        with pytest.raises(TransactionNotFound):
            call("ghost")
        with pytest.raises(InvalidArgument):
            call("bad id")


def test_load_refuses_a_corrupt_log(store: SQLiteStore, path: str) -> None:
    """An event the replay cannot apply is a StorageError, and ownership does not change."""
    store.begin("t")
    store.flush("t")
    with raw(path) as connection:
        connection.execute("INSERT INTO log (tx_id, seq, kind) VALUES ('t', 0, 99)")
        connection.execute("UPDATE txs SET owner = 'someone'")
    with pytest.raises(StorageError, match=r"log of transaction `t` .* is corrupt"):
        store.load("t")
    with raw(path) as connection:
        assert connection.execute("SELECT owner FROM txs").fetchone()[0] == "someone"


# ---------------------------------------------------------------- the outbox


def test_outbox_delivery_bookkeeping(store: SQLiteStore) -> None:
    """mark_failed counts and sets not_before, mark_delivered removes; both check the id."""
    store.begin("t")
    store.record_step("t", 1, "{}", [EFFECT_1, EFFECT_2], "{}")
    store.commit("t")
    store.begin("u")
    store.record_step("u", 1, "{}", [EFFECT_1], "{}")
    store.commit("u")
    first, second, third = store.pending_effects()
    assert store.pending_effects(limit=1) == (first,)
    assert store.pending_effects(tx_id="u") == (third,)
    assert store.pending_effects(1, tx_id="t") == (first,)
    store.mark_delivered(third.id)

    store.mark_failed(first.id, "smtp down", 0)
    store.mark_failed(first.id, "smtp still down", 0)
    retried = store.pending_effects()[0]
    assert (retried.attempts, retried.last_error) == (2, "smtp still down")

    store.mark_failed(first.id, "later", 4e9)  # far in the future: the caller holds it back
    waiting = store.pending_effects()[0]
    assert (waiting.id, waiting.not_before, waiting.attempts) == (first.id, 4e9, 3)
    store.mark_delivered(first.id)
    assert store.pending_effects() == (second,)

    store.mark_delivered(second.id)
    store.mark_delivered(second.id)  # idempotent
    store.mark_failed(second.id, "too late", 0)  # a delivered entry stays delivered
    assert store.pending_effects() == ()

    for call in (
        lambda: store.mark_delivered(second.id + 100),
        lambda: store.mark_failed(second.id + 100, "x", 0),
    ):
        with pytest.raises(InvalidArgument, match="there is no outbox entry"):
            call()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: EffectRow(step_id=1, channel=2, payload="p", idempotency_key="k"),
            "channel must be text, not int",
        ),
        (
            lambda: EffectRow(step_id=2**32, channel="c", payload="p", idempotency_key="k"),
            "step_id must be an integer in 0-4294967295",
        ),
        (
            lambda: EffectRow(step_id=True, channel="c", payload="p", idempotency_key="k"),
            "step_id must be an integer",
        ),
        (
            lambda: EffectRow(step_id=1, channel="c", payload="\udc00", idempotency_key="k"),
            "payload must be text that can be encoded as UTF-8",
        ),
        (lambda: UndoRow(step_id=1, seq=2**63, record="{}"), "seq must be an integer"),
        (lambda: UndoRow(step_id=-1, seq=0, record="{}"), "step_id must be an integer"),
        (lambda: UndoRow(step_id=1, seq=0, record=None), "record must be text, not NoneType"),
    ],
)
def test_rows_are_checked_when_built(build: Callable[[], object], message: str) -> None:
    """EffectRow and UndoRow refuse a bad field on construction, naming it."""
    with pytest.raises(InvalidArgument, match=message):
        build()


def test_rows_are_frozen_keyword_only_values() -> None:
    """The row types are immutable attrs values built by keyword, not tuples."""
    with pytest.raises(TypeError):
        UndoRow(1, 0, "{}")  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        EFFECT_1.step_id = 2  # type: ignore[misc]
    assert not isinstance(EFFECT_1, tuple)
    assert EFFECT_1 == attrs.evolve(EFFECT_1) != attrs.evolve(EFFECT_1, channel="sms")
    assert hash(EFFECT_1) == hash(attrs.evolve(EFFECT_1))
    for row_type in (EffectRow, UndoRow, TxImage, OutboxEntry):
        assert attrs.has(row_type)
        assert "__slots__" in vars(row_type)
        assert "__dict__" not in vars(row_type)
        with pytest.raises(TypeError):  # keyword-only
            row_type(*(None,) * len(attrs.fields(row_type)))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.pending_effects(0), "limit must be an integer"),
        (lambda s: s.pending_effects(True), "limit must be an integer"),
        (lambda s: s.pending_effects(tx_id="a b"), "invalid transaction id"),
        (lambda s: s.mark_delivered(0), "entry_id must be an integer"),
        (lambda s: s.mark_failed(1, "x", float("nan")), "not_before must be a finite number"),
        (lambda s: s.mark_failed(1, "x", True), "not_before must be a finite number"),
        (lambda s: s.mark_failed(1, "\ud800", 0), "UTF-8"),
        (lambda s: s.record_step("t", -1, "{}", [], "{}"), "step_id must be an integer"),
        (lambda s: s.record_step("t", 1, "{}", "ab", "{}"), "not text"),
        (lambda s: s.record_step("t", 1, "{}", 5, "{}"), "must be a sequence of EffectRow"),
        (lambda s: s.record_step("t", 1, "{}", [("a",)], "{}"), "effect 0 must be an EffectRow"),
        (
            lambda s: s.record_step("t", 1, "{}", [(1, "c", "p", "k")], "{}"),
            "effect 0 must be an EffectRow",  # a tuple is not one any more
        ),
        (lambda s: s.record_undo("t", (1, 0, "{}")), "undo records must be UndoRow"),
        (lambda s: s.record_step("t", 1, 5, [], "{}"), "JSON text"),
        (lambda s: s.record_progress("t", None), "JSON text"),
        (lambda s: s.record_transaction("t", b"{}"), "JSON text"),
        (lambda s: s.begin("u", record=None), "JSON text"),
        (lambda s: s.record_undo("t", (1, 0)), "undo records must be UndoRow"),
        (
            lambda s: s.record_undo("t", UndoRow(step_id=1, seq=-1, record="{}")),
            "seq must be an integer",
        ),
        (lambda s: s.forget_undo("t", 1, 2**63), "seq must be an integer"),
    ],
)
def test_durable_calls_check_their_arguments(store: SQLiteStore, call, message) -> None:
    """Malformed arguments raise InvalidArgument naming the offender, before any lookup."""
    with pytest.raises(InvalidArgument, match=message):
        call(store)


def test_durable_calls_need_an_open_transaction(store: SQLiteStore) -> None:
    """Every durable call on a transaction this store does not hold raises TransactionNotFound."""
    calls = [
        lambda: store.record_transaction("t", "{}"),
        lambda: store.record_step("t", 1, "{}", [], "{}"),
        lambda: store.record_progress("t", "{}"),
        lambda: store.record_undo("t", UndoRow(step_id=1, seq=0, record="{}")),
        lambda: store.forget_undo("t", 1, 0),
        lambda: store.flush("t"),
    ]
    for call in calls:
        with pytest.raises(TransactionNotFound):
            call()


# ---------------------------------------------------------------- inspection


def durable_fixture(path: str) -> str:
    """Fill the file: committed keys, an outbox entry, and transaction `t` open with a record,
    a step with an effect, an undo record, a snapshot and a write. Returns `t`'s owner."""
    with SQLiteStore(path) as store:
        committed(store, a="1", b="2")
        store.begin("done")
        store.record_step("done", 1, "{}", [EFFECT_1], "{}")
        store.commit("done")
        store.begin("t", isolation="serializable")
        store.record_transaction("t", '{"name":"t"}')
        store.put("t", "a", "10")
        store.snapshot("t", 1)
        store.record_step("t", 1, '{"step":1}', [EFFECT_2], '{"next":2}')
        store.record_undo("t", UndoRow(step_id=1, seq=0, record='"undo"'))
        owner = store.owner("t")
    assert owner is not None
    return owner


EXPECTED_T = TxImage(
    tx_id="t",
    record='{"name":"t"}',
    progress='{"next":2}',
    steps=((1, '{"step":1}'),),
    undos=(UndoRow(step_id=1, seq=0, record='"undo"'),),
    effects=(EFFECT_2,),
    owner=None,
    snapshots=(0, 1),
)


def test_peek_is_load_without_the_takeover(path: str) -> None:
    """peek returns the image load would; the owner, the file and the holder stay as they are."""
    with SQLiteStore(path) as holder, SQLiteStore(path) as inspector:
        holder.begin("t")
        holder.record_transaction("t", '{"name":"t"}')
        holder.put("t", "a", "10")
        holder.snapshot("t", 1)
        holder.record_step("t", 1, '{"step":1}', [EFFECT_2], '{"next":2}')
        holder.record_undo("t", UndoRow(step_id=1, seq=0, record='"undo"'))
        owner = holder.owner("t")
        changes = inspector._conn.total_changes
        image = inspector.peek("t")
        assert image == attrs.evolve(EXPECTED_T, owner=owner)
        assert inspector._conn.total_changes == changes
        assert holder.owner("t") == owner
        assert not inspector.is_open("t")
        holder.record_progress("t", "{}")  # not fenced: the holder still owns it
        assert holder.commit("t") == 1
        with SQLiteStore(path) as other:
            assert other.read_committed("a") == "10"


def test_peek_matches_load_image(path: str) -> None:
    """On the same file, peek and then load return equal images, both naming the holder."""
    owner = durable_fixture(path)
    with SQLiteStore(path) as store:
        peeked = store.peek("t")
        assert peeked == attrs.evolve(EXPECTED_T, owner=owner)
        assert store.load("t") == peeked
        assert store.owner("t") == store._owner
        assert store.peek("t") == attrs.evolve(peeked, owner=store._owner)


def test_peek_shows_a_held_transaction_at_its_last_durable_write(store: SQLiteStore) -> None:
    """peek writes nothing: a held transaction's buffered writes and snapshots stay buffered."""
    store.begin("t")
    store.put("t", "a", "1")
    store.snapshot("t", 1)
    changes = store._conn.total_changes
    assert store.peek("t").snapshots == (0,)
    assert store._conn.total_changes == changes
    store.flush("t")
    assert store._conn.total_changes > changes
    assert store.peek("t").snapshots == (0, 1)
    assert store.get("t", "a") == "1"


def test_peek_raises_for_unknown_ids_and_sqlite_failures(store: SQLiteStore, path: str) -> None:
    """peek: TransactionNotFound, InvalidArgument for a malformed id, StorageError on failure."""
    with pytest.raises(TransactionNotFound) as caught:
        store.peek("ghost")
    assert caught.value.tx_id == "ghost"
    with pytest.raises(InvalidArgument):
        store.peek("bad id")
    store.begin("t")
    with raw(path) as connection:
        connection.execute("DROP TABLE undos")
    with pytest.raises(StorageError, match="could not peek at transaction `t`") as failed:
        store.peek("t")
    assert isinstance(failed.value.__cause__, sqlite3.OperationalError)
    assert not store._conn.in_transaction
    store.record_progress("t", "{}")  # the failed read left no transaction behind


def test_committed_keys_lists_a_prefix_in_key_order(store: SQLiteStore) -> None:
    """committed_keys returns (key, version, value) rows with the prefix, sorted, up to limit."""
    committed(store, a="1", ab="2", b="3")
    store.begin("more")
    for key in ("ab/\U0001d11e", "abc", "ab\x00", "é", "a", "zz"):
        store.put("more", key, f'"{len(key)}"')
    store.delete("more", "b")
    store.commit("more")
    everything = store.committed_keys()
    assert [key for key, _, _ in everything] == sorted(
        ["a", "ab", "ab/\U0001d11e", "abc", "ab\x00", "é", "zz"]
    )
    assert store.committed_keys("ab") == (
        ("ab", 1, "2"),
        ("ab\x00", 2, '"3"'),
        ("ab/\U0001d11e", 2, '"4"'),
        ("abc", 2, '"3"'),
    )
    assert store.committed_keys("a", limit=2) == (("a", 2, '"1"'), ("ab", 1, "2"))
    assert store.committed_keys("abc") == (("abc", 2, '"3"'),)
    assert store.committed_keys("b") == ()
    assert store.committed_keys("é") == (("é", 2, '"1"'),)
    assert store.committed_keys("zzz") == ()


@settings(max_examples=40, deadline=None)
@given(
    keys=st.sets(
        st.text(st.sampled_from("ab\x00é\U0001d11e"), min_size=1, max_size=4), max_size=12
    ),
    prefix=st.text(st.sampled_from("ab\x00é\U0001d11e"), max_size=3),
    limit=st.integers(1, 15),
)
def test_committed_keys_agrees_with_python(keys: set[str], prefix: str, limit: int) -> None:
    """committed_keys(prefix, limit) is the first `limit` of the sorted keys with the prefix."""
    with tempfile.TemporaryDirectory() as directory, SQLiteStore(f"{directory}/s.db") as store:
        if keys:
            committed(store, **{key: f'"{key}"' for key in keys})
        expected = [(k, 1, f'"{k}"') for k in sorted(keys) if k.startswith(prefix)][:limit]
        assert store.committed_keys(prefix, limit) == tuple(expected)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"limit": 0}, "limit must be an integer"),
        ({"limit": True}, "limit must be an integer"),
        ({"prefix": 5}, "state keys must be text"),
        ({"prefix": "\ud800"}, "lone surrogate"),
        ({"prefix": "x" * 1025}, "1-1024 bytes"),
    ],
)
def test_committed_keys_checks_its_arguments(
    store: SQLiteStore, arguments: dict[str, Any], message: str
) -> None:
    """A bad prefix or limit raises InvalidArgument."""
    with pytest.raises(InvalidArgument, match=message):
        store.committed_keys(**arguments)


def test_committed_keys_failures_are_storage_errors(store: SQLiteStore, path: str) -> None:
    """committed_keys turns a SQLite failure into StorageError, and needs an open store."""
    with raw(path) as connection:
        connection.execute("DROP TABLE committed")
    with pytest.raises(StorageError, match="could not read the committed state"):
        store.committed_keys()
    store.close()
    with pytest.raises(StorageError, match="is closed"):
        store.committed_keys()


# ---------------------------------------------------------------- read-only stores


def file_state(path: str) -> tuple[bytes, int]:
    """The database file's bytes and modification time."""
    file = pathlib.Path(path)
    return file.read_bytes(), file.stat().st_mtime_ns


#: Every call a read-only store refuses, with arguments that pass the argument checks.
REFUSED: list[Callable[[SQLiteStore], object]] = [
    lambda s: s.begin("new"),
    lambda s: s.commit("t"),
    lambda s: s.discard("t"),
    lambda s: s.discard_state("t"),
    lambda s: s.discard("bad id"),
    lambda s: s.get("t", "a"),
    lambda s: s.put("t", "a", "1"),
    lambda s: s.delete("t", "a"),
    lambda s: s.written_keys("t"),
    lambda s: s.snapshot("t", 2),
    lambda s: s.restore("t", 1),
    lambda s: s.record_transaction("t", "{}"),
    lambda s: s.record_step("t", 2, "{}", [EFFECT_1], "{}"),
    lambda s: s.record_progress("t", "{}"),
    lambda s: s.record_undo("t", UndoRow(step_id=2, seq=0, record="{}")),
    lambda s: s.forget_undo("t", 1, 0),
    lambda s: s.flush("t"),
    lambda s: s.load("t"),
    lambda s: s.mark_delivered(1),
    lambda s: s.mark_failed(1, "boom", 0),
]


def test_a_readonly_store_reads_and_writes_nothing(path: str) -> None:
    """readonly=True: the reads work, every other call raises, and the file stays byte-identical."""
    owner = durable_fixture(path)
    before = file_state(path)
    time.sleep(0.02)  # so that a write would show in the modification time
    with SQLiteStore(path, readonly=True) as store:
        assert store.readonly
        assert store.read_committed("a") == "1"
        assert store.committed_version("b") == 1
        assert store.committed_keys() == (("a", 1, "1"), ("b", 1, "2"))
        assert store.open_transactions() == ("t",)
        assert store.owner("t") == owner
        assert store.peek("t") == attrs.evolve(EXPECTED_T, owner=owner)
        (entry,) = store.pending_effects()
        assert (entry.tx_id, as_effect(entry)) == ("done", EFFECT_1)
        assert not store.is_open("t")
        for call in REFUSED:
            with pytest.raises(StorageError, match="the store is read-only"):
                call(store)
        assert store.owner("t") == owner
    assert file_state(path) == before
    wal = pathlib.Path(f"{path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    with SQLiteStore(path) as store:
        assert store.pending_effects()[0].attempts == 0
        assert store.load("t") == attrs.evolve(EXPECTED_T, owner=owner)


def test_a_readonly_store_follows_a_live_writer(path: str) -> None:
    """A read-only store sees each commit and durable write another store makes meanwhile."""
    with SQLiteStore(path) as writer:
        committed(writer, a="1")
        with SQLiteStore(path, readonly=True) as reader:
            assert reader.read_committed("a") == "1"
            writer.begin("t")
            writer.put("t", "a", "2")
            writer.snapshot("t", 1)
            assert reader.open_transactions() == ("t",)
            assert reader.peek("t").snapshots == (0,)
            writer.flush("t")
            assert reader.peek("t").snapshots == (0, 1)
            writer.commit("t")
            assert reader.committed_keys() == (("a", 2, "2"),)
            assert reader.open_transactions() == ()
            with pytest.raises(TransactionNotFound):
                reader.peek("t")


def test_a_readonly_store_needs_an_existing_file(tmp_path: Path) -> None:
    """A missing file raises StorageError and is not created."""
    missing = tmp_path / "missing.db"
    with pytest.raises(StorageError, match=f"no such file: {missing}"):
        SQLiteStore(missing, readonly=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is an empty SQLite database, not an agenttx store"),
        (b"not a database, but long enough to have a header\n" * 20, "is not a SQLite database"),
        (None, "is a SQLite database but not an agenttx store"),
    ],
)
def test_a_readonly_store_refuses_other_files(
    path: str, content: bytes | None, message: str
) -> None:
    """An empty, non-SQLite or foreign SQLite file raises StorageError and stays as it was."""
    if content is None:
        with raw(path) as connection:
            connection.execute("CREATE TABLE invoices (id INTEGER)")
    else:
        pathlib.Path(path).write_bytes(content)
    before = file_state(path)
    with pytest.raises(StorageError, match=message):
        SQLiteStore(path, readonly=True)
    assert file_state(path) == before


def test_a_readonly_store_refuses_another_schema_version(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer schema, or an older one it would have to migrate, raises StorageError saying so."""
    SQLiteStore(path).close()
    extra = ("CREATE TABLE added (n INTEGER)",)
    current = len(file_module.MIGRATIONS)
    monkeypatch.setattr(file_module, "MIGRATIONS", (*file_module.MIGRATIONS, extra))
    match = rf"schema version {current}, older than .* reads \({current + 1}\)"
    with pytest.raises(StorageError, match=match):
        SQLiteStore(path, readonly=True)
    with raw(path) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == current
    monkeypatch.undo()
    with raw(path) as connection:
        connection.execute("PRAGMA user_version = 99")
    with pytest.raises(StorageError, match=r"schema version 99, newer than"):
        SQLiteStore(path, readonly=True)


def test_a_closed_readonly_store_raises(path: str) -> None:
    """After close(), a read-only store's reads raise StorageError (closed) too."""
    SQLiteStore(path).close()
    store = SQLiteStore(path, readonly=True)
    store.close()
    with pytest.raises(StorageError, match="is closed"):
        store.peek("t")
    with pytest.raises(StorageError, match="is closed"):
        store.get("t", "a")


# ---------------------------------------------------------------- concurrency


def _increment_worker(path: str, worker: int, rounds: int, barrier: Any, results: Any) -> None:
    """Commit `rounds` read-modify-write increments, retrying on conflicts; report the counts.

    The transactions are serializable: under read committed, a read is not validated and a
    read-modify-write may lose an update (by design, as with MemoryStore).
    """
    successes = [0, 0, 0]
    conflicts = 0
    with SQLiteStore(path, busy_timeout=60) as store:
        # Round 0: everyone reads and writes counter/0, then commits at once: all but one conflict.
        tx = f"w{worker}-first"
        store.begin(tx, isolation="serializable")
        store.put(tx, "counter/0", str(int(store.get(tx, "counter/0") or "0") + 1))
        store.flush(tx)
        barrier.wait()
        try:
            store.commit(tx)
            successes[0] += 1
        except WriteConflict:
            conflicts += 1
            store.discard(tx)
        for attempt in itertools.count():
            index = (worker + attempt) % 3
            if sum(successes) > rounds:
                break
            tx = f"w{worker}-{attempt}"
            key = f"counter/{index}"
            store.begin(tx, isolation="serializable")
            value = int(store.get(tx, key) or "0")
            store.snapshot(tx, 1)
            store.put(tx, key, str(value + 1))
            store.record_step(tx, 1, "{}", [], "{}")
            try:
                store.commit(tx)
                successes[index] += 1
            except WriteConflict:
                conflicts += 1
                store.discard(tx)
    results.put((worker, successes, conflicts))


def test_processes_lose_no_update(path: str) -> None:
    """Three processes increment overlapping counters: every commit counts, conflicts raise
    WriteConflict (ReadConflict is one)."""
    SQLiteStore(path).close()  # create the schema once
    context = multiprocessing.get_context("spawn")
    workers, rounds = 3, 15
    barrier, results = context.Barrier(workers), context.Queue()
    processes = [
        context.Process(target=_increment_worker, args=(path, n, rounds, barrier, results))
        for n in range(workers)
    ]
    for process in processes:
        process.start()
    reports = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    totals = [sum(report[1][index] for report in reports) for index in range(3)]
    conflicts = sum(report[2] for report in reports)
    assert conflicts >= workers - 1  # round 0 guarantees them
    with SQLiteStore(path) as store:
        assert [int(store.read_committed(f"counter/{i}") or "0") for i in range(3)] == totals
        assert sum(store.committed_version(f"counter/{i}") > 0 for i in range(3)) == 3
        assert store.open_transactions() == ()


def test_threads_share_one_store(store: SQLiteStore) -> None:
    """Four threads increment one counter (serializable) through one store: no update is lost."""
    done: list[int] = []

    def work(worker: int) -> None:
        count = 0
        for attempt in itertools.count():
            if count == 25:
                break
            tx = f"w{worker}-{attempt}"
            store.begin(tx, isolation="serializable")
            value = int(store.get(tx, "n") or "0")
            store.put(tx, "n", str(value + 1))
            store.record_progress(tx, "{}")
            try:
                store.commit(tx)
                count += 1
            except WriteConflict:
                store.discard(tx)
        done.append(count)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert done == [25] * 4
    assert store.read_committed("n") == "100"


def test_a_write_lock_held_too_long_is_a_storage_error(path: str) -> None:
    """SQLITE_BUSY after busy_timeout becomes a StorageError that says so."""
    with SQLiteStore(path, busy_timeout=0.05) as store:
        with raw(path) as blocker:
            blocker.execute("BEGIN IMMEDIATE")
            with pytest.raises(
                StorageError, match=r"stayed locked .* busy timeout \(0.05 s\)"
            ) as e:
                store.begin("t")
            assert isinstance(e.value.__cause__, sqlite3.OperationalError)
            assert not store.is_open("t")
            with pytest.raises(StorageError, match=r"could not discard transaction `u`: .* locked"):
                store.discard("u")
            blocker.execute("ROLLBACK")
        store.begin("t")


# ---------------------------------------------------------------- the file and its schema


def test_a_new_file_gets_the_schema_and_wal(store: SQLiteStore, path: str) -> None:
    """The file is marked as an agenttx store at the current schema version, in WAL mode."""
    with raw(path) as connection:
        assert connection.execute("PRAGMA application_id").fetchone()[0] == 0x41475458
        assert connection.execute("PRAGMA user_version").fetchone()[0] == len(
            file_module.MIGRATIONS
        )
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


def test_durability_full_sets_synchronous_full(path: str) -> None:
    """durability="full" is synchronous=FULL."""
    with SQLiteStore(path, durability="full") as store:
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2


def test_migrations_run_in_order_once(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file at an older schema version gets exactly the migrations it lacks."""
    SQLiteStore(path).close()
    extra = ("CREATE TABLE added (n INTEGER)", "INSERT INTO added VALUES (1)")
    current = len(file_module.MIGRATIONS)
    monkeypatch.setattr(file_module, "MIGRATIONS", (*file_module.MIGRATIONS, extra))
    SQLiteStore(path).close()
    SQLiteStore(path).close()
    with raw(path) as connection:
        assert connection.execute("SELECT n FROM added").fetchall() == [(1,)]
        assert connection.execute("PRAGMA user_version").fetchone()[0] == current + 1


def test_a_failing_migration_changes_nothing(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A migration that fails half-way is rolled back whole: the file keeps its version."""
    SQLiteStore(path).close()
    broken = ("CREATE TABLE added (n INTEGER)", "INSERT INTO nowhere VALUES (1)")
    current = len(file_module.MIGRATIONS)
    monkeypatch.setattr(file_module, "MIGRATIONS", (*file_module.MIGRATIONS, broken))
    with pytest.raises(StorageError, match=r"could not set up the schema .* no such table") as e:
        SQLiteStore(path)
    assert isinstance(e.value.__cause__, sqlite3.OperationalError)
    with raw(path) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == current
        tables = connection.execute("SELECT name FROM sqlite_master WHERE name = 'added'")
        assert tables.fetchall() == []


def test_a_file_locked_while_opening_is_a_storage_error(path: str) -> None:
    """A file another connection holds locked past busy_timeout cannot be opened."""
    with raw(path) as blocker:
        blocker.execute("CREATE TABLE t (n INTEGER)")
        blocker.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StorageError, match=r"could not read the schema: .* stayed locked"):
            SQLiteStore(path, busy_timeout=0.05)
        blocker.execute("ROLLBACK")


def test_a_newer_schema_is_refused(path: str) -> None:
    """A store written by a newer agenttx raises StorageError instead of being misread."""
    SQLiteStore(path).close()
    with raw(path) as connection:
        connection.execute("PRAGMA user_version = 99")
    with pytest.raises(StorageError, match=r"schema version 99, newer than .* upgrade agenttx"):
        SQLiteStore(path)


def test_a_file_that_is_not_sqlite_is_refused(path: str) -> None:
    """Opening a text file raises StorageError with the sqlite3 error as cause."""
    with pathlib.Path(path).open("w", encoding="utf-8") as file:
        file.write("not a database, but long enough to have a header\n" * 20)
    with pytest.raises(StorageError, match="is not a SQLite database") as caught:
        SQLiteStore(path)
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)


def test_a_foreign_sqlite_file_is_refused_and_left_alone(path: str) -> None:
    """A SQLite database of another application raises StorageError and is not modified."""
    with raw(path) as connection:
        connection.execute("CREATE TABLE invoices (id INTEGER)")
    with pytest.raises(StorageError, match="not an agenttx store"):
        SQLiteStore(path)
    with raw(path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_a_path_that_cannot_be_opened_is_a_storage_error(tmp_path: Path) -> None:
    """A file in a missing directory raises StorageError."""
    with pytest.raises(StorageError, match="cannot open the store"):
        SQLiteStore(tmp_path / "missing" / "store.db")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"durability": "bogus"}, 'durability must be "normal" or "full"'),
        ({"busy_timeout": -1}, "busy_timeout must be a finite number"),
        ({"busy_timeout": float("inf")}, "busy_timeout must be a finite number"),
        ({"busy_timeout": True}, "busy_timeout must be a finite number"),
        ({"readonly": 1}, "readonly must be True or False"),
        ({"exclusive": "yes"}, "exclusive must be True or False"),
        ({"readonly": True, "exclusive": True}, "cannot be combined"),
    ],
)
def test_options_are_checked(path: str, arguments: dict[str, Any], message: str) -> None:
    """Bad options raise InvalidArgument before the file is touched."""
    with pytest.raises(InvalidArgument, match=message):
        SQLiteStore(path, **arguments)
    assert not pathlib.Path(path).exists()


def test_the_path_must_be_a_path() -> None:
    """A path of the wrong type raises InvalidArgument."""
    with pytest.raises(InvalidArgument, match=r"path must be a str or os\.PathLike"):
        SQLiteStore(3)  # type: ignore[arg-type]


class _BytesPath:
    def __fspath__(self) -> bytes:
        return b"store.db"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("store\0.db", "path must be a file name without NUL"),
        (pathlib.Path("dir") / "a\0b", "path must be a file name without NUL"),
        ("", "path must be a file name"),
        (b"store.db", "path must be a str or os.PathLike"),
        (_BytesPath(), "path must name a file as text"),
    ],
)
def test_a_path_that_names_no_file_is_an_invalid_argument(
    bad: object, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NUL characters, an empty name and bytes raise InvalidArgument naming `path`, not a
    ValueError of sqlite3's or a private temporary database."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgument, match=message):
        SQLiteStore(bad)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- the file under the store


def _every_write(store: SQLiteStore) -> dict[str, Callable[[], object]]:
    """A call of each kind that writes the file, on transaction `t` (begun, with a write)."""
    return {
        "begin": lambda: store.begin("other"),
        "put+flush": lambda: (store.put("t", "a", "2"), store.flush("t")),
        "record_step": lambda: store.record_step("t", 1, "{}", [], "{}"),
        "record_progress": lambda: store.record_progress("t", '"p"'),
        "record_undo": lambda: store.record_undo("t", UndoRow(step_id=1, seq=0, record='"u"')),
        "record_transaction": lambda: store.record_transaction("t", '{"r":1}'),
        "restore": lambda: store.restore("t", 0),
        "load": lambda: store.load("t"),
        "discard": lambda: store.discard("t"),
        "commit": lambda: store.commit("t"),
    }


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("how", ["deleted", "replaced", "renamed away"])
def test_a_file_deleted_or_replaced_under_the_store_is_noticed(
    path: str, how: str, exclusive: bool
) -> None:
    """Every write checks that the path still names the file opened: after it was deleted,
    replaced or renamed, no write is acknowledged (StorageError), and none lands anywhere."""
    store = SQLiteStore(path, exclusive=exclusive)
    committed(store, a="1")
    store.begin("t")
    store.put("t", "a", "2")
    store.snapshot("t", 1)
    store.flush("t")
    aside = f"{path}.aside"
    if how == "deleted":
        pathlib.Path(path).unlink()
    elif how == "renamed away":
        pathlib.Path(path).rename(aside)
    else:
        SQLiteStore(aside).close()
        pathlib.Path(aside).replace(path)
    message = "was deleted" if how != "replaced" else "was replaced by another file"
    for name, call in _every_write(store).items():
        with pytest.raises(StorageError, match=message):
            call()
        assert store.is_open("t"), name
    store.close()


def test_the_same_file_moved_back_is_written_again(path: str) -> None:
    """The check compares identities, not names: once the file is back, writes go through."""
    with SQLiteStore(path) as store:
        store.begin("t")
        store.put("t", "a", "1")
        pathlib.Path(path).rename(f"{path}.aside")
        with pytest.raises(StorageError, match="was deleted"):
            store.commit("t")
        pathlib.Path(f"{path}.aside").rename(path)
        assert store.commit("t") == 1
    with SQLiteStore(path) as store:
        assert store.read_committed("a") == "1"


def test_a_relative_path_is_checked_where_it_was_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chdir after opening does not make the file look deleted."""
    monkeypatch.chdir(tmp_path)
    with SQLiteStore("store.db") as store:
        monkeypatch.chdir(tmp_path.parent)
        store.begin("t")
        store.put("t", "a", "1")
        assert store.commit("t") == 1


def test_a_readonly_store_does_not_check_the_file(path: str) -> None:
    """A read-only store writes nothing, so it has nothing to check: its reads go on."""
    with SQLiteStore(path) as writer:
        committed(writer, a="1")
    with SQLiteStore(path, readonly=True) as reader:
        pathlib.Path(path).unlink()
        assert reader.read_committed("a") == "1"


def _open_as_sqlite_does_without_write_permission(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every connection read-only, as SQLite makes one on a file it may not write."""
    connect = sqlite3.connect

    def read_only(target: str, **options: Any) -> sqlite3.Connection:
        if options.get("uri"):
            return connect(target, **options)
        uri = f"{pathlib.Path(target).absolute().as_uri()}?mode=ro"
        return connect(uri, **{**options, "uri": True})

    monkeypatch.setattr(sqlite3, "connect", read_only)


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_file_sqlite_can_only_read_fails_when_opened(
    path: str, monkeypatch: pytest.MonkeyPatch, exclusive: bool
) -> None:
    """SQLite opens a file it may not write read-only, silently: the store finds out when it
    opens (StorageError), not at its first commit."""
    with SQLiteStore(path) as store:
        committed(store, a="1")
    _open_as_sqlite_does_without_write_permission(monkeypatch)
    # Exclusive, SQLite fails earlier: it cannot keep the WAL index in memory read-only.
    match = "could not read the schema" if exclusive else "SQLite cannot write the store"
    with pytest.raises(StorageError, match=match) as caught:
        SQLiteStore(path, exclusive=exclusive)
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    with SQLiteStore(path, readonly=True) as reader:  # reading it is fine
        assert reader.read_committed("a") == "1"


def _may_write(target: pathlib.Path) -> bool:
    """Whether this process may write the file `target`, or create a file in directory `target`
    (root may, whatever the permissions say, unless it lacks CAP_DAC_OVERRIDE)."""
    try:
        if target.is_dir():
            probe = target / "probe"
            probe.touch()
            probe.unlink()
        else:
            with target.open("r+b"):
                pass
    except PermissionError:
        return False
    return True


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_file_this_user_may_not_write_fails_when_opened(path: str, what: str) -> None:
    """A read-only file, or a directory where SQLite cannot create its -wal and -shm files,
    raises StorageError at open."""
    with SQLiteStore(path) as store:
        committed(store, a="1")
    for side in ("-wal", "-shm"):
        pathlib.Path(path + side).unlink(missing_ok=True)
    target = pathlib.Path(path) if what == "file" else pathlib.Path(path).parent
    mode = target.stat().st_mode
    target.chmod(0o444 if what == "file" else 0o555)
    if _may_write(target):
        target.chmod(mode)
        pytest.skip("this process may write whatever the permissions say (root)")
    try:
        with pytest.raises(StorageError):
            SQLiteStore(path)
    finally:
        target.chmod(mode)


def test_a_closed_store_raises_storage_error(path: str) -> None:
    """After close() every call raises StorageError; close() is idempotent."""
    store = SQLiteStore(path)
    store.begin("t")
    with store:
        pass
    store.close()
    assert repr(store) == f"<SQLiteStore {path!r}: closed>"
    calls: list[Callable[[], object]] = [
        lambda: store.begin("u"),
        lambda: store.get("t", "a"),
        lambda: store.put("t", "a", "1"),
        lambda: store.read_committed("a"),
        lambda: store.committed_version("a"),
        store.open_transactions,
        lambda: store.load("t"),
        lambda: store.owner("t"),
        lambda: store.discard("t"),
        store.pending_effects,
        lambda: store.mark_delivered(1),
    ]
    for call in calls:
        with pytest.raises(StorageError, match="is closed"):
            call()
    assert not store.is_open("t")


def test_sqlite_failures_become_storage_errors_and_change_nothing(
    store: SQLiteStore, path: str
) -> None:
    """A failing statement rolls its SQLite transaction back: the call has no effect."""
    committed(store, a="1")
    store.begin("t")
    store.put("t", "a", "2")
    store.record_step("t", 1, "{}", [EFFECT_1], "{}")
    with raw(path) as connection:
        connection.execute("DROP TABLE outbox")
    with pytest.raises(StorageError, match="could not commit transaction `t`") as caught:
        store.commit("t")
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    assert store.is_open("t")
    assert store.read_committed("a") == "1"
    assert store.committed_version("a") == 1
    with pytest.raises(StorageError, match="could not read the outbox"):
        store.pending_effects()
    with raw(path) as connection:
        connection.execute("DROP TABLE log")
    for call in (
        lambda: store.record_progress("t", "{}"),
        lambda: store.restore("t", 0),
        lambda: store.discard("t"),
        lambda: store.load("t"),
    ):
        with pytest.raises(StorageError, match="no such table: log"):
            call()
    assert store.get("t", "a") == "2"
    with raw(path) as connection:
        connection.execute("DROP TABLE txs")
        connection.execute("DROP TABLE committed")
    with pytest.raises(StorageError, match="could not list the open transactions"):
        store.open_transactions()
    with pytest.raises(StorageError, match="could not read the owner"):
        store.owner("t")
    with pytest.raises(StorageError, match=r"could not record transaction .* no such table: txs"):
        store.record_transaction("t", "{}")
    with pytest.raises(StorageError, match="could not read the committed state"):
        store.read_committed("a")


def test_text_round_trips_exactly(store: SQLiteStore, path: str) -> None:
    """Keys and values with NUL, non-ASCII and JSON "null" come back as given."""
    pairs = {"k\x00ey": "v\x00al", "ключ/𝄞": '"𝄞"', "n": "null", "e": ""}
    store.begin("t")
    for key, value in pairs.items():
        store.put("t", key, value)
    store.flush("t")
    with reopen(path, "t") as other:
        assert {key: other.get("t", key) for key in pairs} == pairs
        other.commit("t")
        assert {key: other.read_committed(key) for key in pairs} == pairs


def test_repr_names_the_file_without_dumping_data(store: SQLiteStore, path: str) -> None:
    """The repr shows the path and the number of transactions held."""
    store.begin("t")
    assert repr(store) == f"<SQLiteStore {path!r}: 1 open transactions held here>"
    assert store.path == path


# ---------------------------------------------------------------- exclusive


def test_check_store_passes_exclusive(tmp_path: Path) -> None:
    """The conformance suite, on exclusive stores."""
    counter = itertools.count()
    check_store(
        lambda: SQLiteStore(tmp_path / f"{next(counter)}.db", exclusive=True), max_examples=20
    )


@pytest.mark.parametrize(
    "other",
    [
        {},
        {"readonly": True},
        {"exclusive": True},
    ],
    ids=["shared", "readonly", "exclusive"],
)
def test_an_exclusive_store_locks_out_every_other_connection(
    path: str, other: dict[str, bool]
) -> None:
    """Another store on the file, of any kind, waits its busy timeout and raises; so does a
    plain sqlite3 reader. Once the exclusive store closes, the file opens as usual."""
    with SQLiteStore(path, exclusive=True) as store:
        assert store.exclusive
        store.begin("t1")
        store.put("t1", "k", "1")
        store.commit("t1")
        with pytest.raises(StorageError, match=r"stayed locked .* exclusive=True keeps it locked"):
            SQLiteStore(path, busy_timeout=0.05, **other)
        reader = sqlite3.connect(path, timeout=0.05)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            reader.execute("SELECT count(*) FROM committed").fetchall()
        reader.close()
        assert not pathlib.Path(f"{path}-shm").exists()  # its WAL index is in its own memory
    with SQLiteStore(path, readonly=True) as reader_store:
        assert reader_store.read_committed("k") == "1"
        assert not reader_store.exclusive


def test_an_exclusive_store_still_validates_what_it_cannot_vouch_for(path: str) -> None:
    """An exclusive store skips validating a commit only when it has committed nothing since
    the transaction first read: a commit in between, or a transaction loaded from the file
    (whose versions were read before the store opened), is validated as usual."""
    with SQLiteStore(path, exclusive=True) as store:
        for tx in ("a", "b"):
            store.begin(tx)
            store.put(tx, "k", tx)
        store.commit("b")
        with pytest.raises(WriteConflict, match="`k`"):
            store.commit("a")
        store.begin("c")
        store.put("c", "k", "c")  # reads version 1
        store.flush("c")
    with SQLiteStore(path) as shared:  # a commit the next exclusive store never saw
        shared.begin("d")
        shared.put("d", "k", "d")
        shared.commit("d")
    with SQLiteStore(path, exclusive=True) as store:
        store.load("c")
        with pytest.raises(WriteConflict, match="`k`"):
            store.commit("c")
        store.begin("e")
        store.put("e", "k", "e")
        assert store.commit("e") == 1
        assert store.read_committed("k") == "e"


# ---------------------------------------------------------------- history of ended transactions


def ended_ids(store: SQLiteStore) -> list[str]:
    return [row.tx_id for row in store.ended_transactions(10_000)]


def end_some(store: SQLiteStore, tx_ids: list[str], *, commit: bool = True) -> None:
    """Begin each of `tx_ids` with one step, and commit (or discard) it."""
    for tx_id in tx_ids:
        store.begin(tx_id, record=json.dumps({"agent_id": tx_id}))
        store.record_step(tx_id, 1, f'["tool-{tx_id}"]', [], "{}")
        if commit:
            store.commit(tx_id, history=f'{{"status":"done {tx_id}"}}')
        else:
            store.discard(tx_id, history=f'{{"status":"gone {tx_id}"}}')


def test_an_ended_transaction_is_kept_with_its_history_and_live_steps(path: str) -> None:
    """commit and discard keep the record, the history given and the live step records (a
    restore drops the rewound ones, a step recorded again replaces its record), newest first."""
    with SQLiteStore(path) as store:
        store.begin("t1", record='{"agent_id":"a"}')
        store.snapshot("t1", 1)
        store.record_step("t1", 1, '"one"', [], "{}")
        store.snapshot("t1", 2)
        store.record_step("t1", 2, '"two"', [], "{}")
        store.restore("t1", 2)
        store.snapshot("t1", 2)
        store.record_step("t1", 2, '"two again"', [], "{}")
        store.record_step("t1", 1, "not JSON at all", [], "{}")
        store.commit("t1", history='{"status":"COMMITTED"}')
        store.begin("t2")
        store.record_step("t2", 1, '"x"', [], "{}")
        store.discard("t2", history='{"status":"ROLLED_BACK"}')
        store.begin("t3")
        store.commit("t3")  # no history given: kept, with None
        assert store.open_transactions() == ()
        rows = store.ended_transactions()
        assert [(r.tx_id, r.record, r.history) for r in rows] == [
            ("t3", "null", None),
            ("t2", "null", '{"status":"ROLLED_BACK"}'),
            ("t1", '{"agent_id":"a"}', '{"status":"COMMITTED"}'),
        ]
        assert rows[0].ended_at >= rows[1].ended_at >= rows[2].ended_at > 0
        assert store.ended_transactions(1) == rows[:1]
        ended, image = store.peek_ended("t1")
        assert ended == rows[2]
        assert image.steps == ((1, "not JSON at all"), (2, '"two again"'))
        assert (image.record, image.owner, image.undos, image.effects) == (
            '{"agent_id":"a"}',
            None,
            (),
            (),
        )
    with SQLiteStore(path, readonly=True) as reader:  # what `agenttx inspect` opens
        assert reader.ended_transactions() == rows
        assert reader.peek_ended("t2")[1].steps == ((1, '"x"'),)


def test_ended_transactions_are_invisible_to_recovery(path: str) -> None:
    """An ended transaction is not open: not listed, and owner, peek, load and claim raise
    TransactionNotFound; discard of it is a no-op that keeps its history."""
    with SQLiteStore(path) as store:
        end_some(store, ["c"])
        end_some(store, ["d"], commit=False)
        assert store.open_transactions() == ()
        for tx_id in ("c", "d"):
            for call in (store.owner, store.peek, store.load):
                with pytest.raises(TransactionNotFound):
                    call(tx_id)
            with pytest.raises(TransactionNotFound):
                store.claim(tx_id, None)
            store.discard(tx_id)
            store.discard_state(tx_id)
        assert ended_ids(store) == ["d", "c"]
        assert store.open_transactions() == ()
    engine = agenttx.Engine(store=SQLiteStore(path))
    try:
        report = engine.recover()
        assert (report.transactions, report.failures, report.skipped) == (0, (), ())
    finally:
        engine.close()
        engine.store.close()  # type: ignore[attr-defined]


def test_an_ended_id_can_be_begun_again_and_its_end_replaces_the_history(path: str) -> None:
    """begin of an ended id begins a new transaction; the earlier history stays until the new
    one ends, which replaces it."""
    with SQLiteStore(path) as store:
        end_some(store, ["t", "u"])
        store.begin("t")
        assert store.is_open("t")
        assert store.open_transactions() == ("t",)
        assert ended_ids(store) == ["u", "t"]
        store.record_step("t", 1, '"new"', [], "{}")
        store.commit("t", history='"second"')
        assert ended_ids(store) == ["t", "u"]
        assert store.peek_ended("t")[0].history == '"second"'
        assert store.peek_ended("t")[1].steps == ((1, '"new"'),)
        store.begin("u")
        store.discard("u", history='"third"')
        assert ended_ids(store) == ["u", "t"]
        assert store.peek_ended("u")[0].history == '"third"'


def test_a_failed_commit_keeps_no_history(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The history is written in the commit's own SQLite transaction: a commit that fails
    after writing it (or before) leaves no history, and the transaction open and unchanged."""
    real = StoreFile.end_transaction

    def fail_after(self, tx_id, history, steps, ended_at):
        real(self, tx_id, history, steps, ended_at)  # the history row is written ...
        raise sqlite3.OperationalError("disk I/O error")  # ... and the commit fails

    with SQLiteStore(path) as store:
        store.begin("t")
        store.put("t", "a", "1")
        store.record_step("t", 1, '"s"', [EFFECT_1], "{}")
        monkeypatch.setattr(StoreFile, "end_transaction", fail_after)
        with pytest.raises(StorageError, match="disk I/O error"):
            store.commit("t", history='"h"')
        monkeypatch.undo()
        assert store.ended_transactions() == ()
        with pytest.raises(TransactionNotFound):
            store.peek_ended("t")
        assert store.is_open("t")
        assert store.open_transactions() == ("t",)
        assert store.read_committed("a") is None
        assert store.pending_effects() == ()
        with raw(path) as connection:
            connection.execute("DROP TABLE outbox")  # the commit fails before the history
        with pytest.raises(StorageError):
            store.commit("t", history='"h"')
        assert store.ended_transactions() == ()
        assert store.open_transactions() == ("t",)


def test_retention_by_count_prunes_every_64_ends_and_at_open(path: str) -> None:
    """keep_history=N keeps the last N ended transactions: pruned once every 64 ends (so
    more may be kept meanwhile) and when a store opens."""
    with SQLiteStore(path, keep_history=None) as store:
        end_some(store, [f"a{n:02}" for n in range(70)])
        assert len(ended_ids(store)) == 70
    with SQLiteStore(path, keep_history=3) as store:
        assert ended_ids(store) == ["a69", "a68", "a67"]  # pruned at open
        end_some(store, [f"b{n:02}" for n in range(63)])
        assert len(ended_ids(store)) == 66  # not yet: 63 ends since the last prune
        end_some(store, ["c"], commit=False)
        assert ended_ids(store) == ["c", "b62", "b61"]  # the 64th end pruned


def test_retention_by_age(path: str) -> None:
    """keep_history_for=S deletes the history of transactions that ended more than S seconds
    ago (checked here at open, with the end times moved back in the file)."""
    with SQLiteStore(path) as store:
        end_some(store, ["old", "older", "new"])
    with raw(path) as connection:
        connection.execute("UPDATE ended SET ended_at = ended_at - 7200 WHERE tx_id != 'new'")
    with SQLiteStore(path, keep_history_for=None) as store:
        assert ended_ids(store) == ["new", "older", "old"]
    with SQLiteStore(path, keep_history_for=3600) as store:
        assert ended_ids(store) == ["new"]
    with raw(path) as connection:
        connection.execute("UPDATE ended SET ended_at = ended_at - 7200")
    with SQLiteStore(path, keep_history_for=3600) as store:
        assert ended_ids(store) == []  # every one too old


@pytest.mark.parametrize("keep", [{"keep_history": 0}, {"keep_history_for": 0}])
def test_retention_zero_keeps_nothing(path: str, keep: dict[str, int]) -> None:
    """keep_history=0 or keep_history_for=0: an end keeps nothing, and opening deletes what
    the file kept."""
    with SQLiteStore(path) as store:
        end_some(store, ["kept"])
    with SQLiteStore(path, **keep) as store:
        assert store.ended_transactions() == ()
        end_some(store, ["c"])
        end_some(store, ["d"], commit=False)
        assert store.ended_transactions() == ()
        assert store.open_transactions() == ()
    with raw(path) as connection:
        for table in ("txs", "log", "undos", "ended"):
            assert connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"keep_history": -1}, "keep_history"),
        ({"keep_history": 1.5}, "keep_history"),
        ({"keep_history": True}, "keep_history"),
        ({"keep_history": "10"}, "keep_history"),
        ({"keep_history_for": -1}, "keep_history_for"),
        ({"keep_history_for": float("inf")}, "keep_history_for"),
        ({"keep_history_for": float("nan")}, "keep_history_for"),
        ({"keep_history_for": False}, "keep_history_for"),
        ({"keep_history_for": "1d"}, "keep_history_for"),
    ],
)
def test_retention_is_validated(path: str, arguments: dict[str, object], message: str) -> None:
    """A bad retention raises InvalidArgument naming the argument, before the file is made."""
    with pytest.raises(InvalidArgument, match=message):
        SQLiteStore(path, **arguments)  # type: ignore[arg-type]
    assert not pathlib.Path(path).exists()


def test_retention_defaults_and_limits(path: str) -> None:
    """The defaults are 1000 transactions and 7 days; None lifts a limit."""
    with SQLiteStore(path) as store:
        assert (store.keep_history, store.keep_history_for) == (1000, 7 * 24 * 3600.0)
    with SQLiteStore(path, keep_history=None, keep_history_for=None) as store:
        assert (store.keep_history, store.keep_history_for) == (None, None)


def test_history_of_a_transaction_discarded_by_another_store(path: str) -> None:
    """discard by a store that does not hold the transaction keeps its live steps too (read
    back from its log); discard_state keeps a history for the end recovery gives it."""
    with SQLiteStore(path) as holder, SQLiteStore(path) as other:
        holder.begin("t")
        holder.record_step("t", 1, '"one"', [], "{}")
        holder.snapshot("t", 2)
        holder.record_step("t", 2, '"two"', [], "{}")
        holder.restore("t", 2)
        other.discard("t", history='"h"')
        assert other.peek_ended("t")[1].steps == ((1, '"one"'),)
        holder.begin("k")
        holder.record_undo("k", UndoRow(step_id=1, seq=0, record="{}"))
        holder.discard_state("k", history='"kept"')
        assert holder.open_transactions() == ("k",)  # recovery's, not history yet
        assert holder.ended_transactions()[0].tx_id == "t"
        other.load("k")
        other.discard("k")  # no history given: the one discard_state kept
        assert other.peek_ended("k")[0].history == '"kept"'


def test_a_corrupt_history_is_a_storage_error(path: str) -> None:
    """Steps in the file that are not the JSON the store writes raise StorageError."""
    with SQLiteStore(path) as store:
        end_some(store, ["t"])
        for steps in ("not json", '[["x"]]', "[[1, 2]]", '{"a": 1}', "[[1],[5]]\nabc", "[[1],[3]]"):
            with raw(path) as connection:
                connection.execute("UPDATE ended SET steps = ?", (steps,))
            with pytest.raises(StorageError, match=r"history of transaction `t`.*is corrupt"):
                store.peek_ended("t")


def test_a_transaction_whose_log_cannot_be_replayed_still_ends(path: str) -> None:
    """discard by a store that does not hold a transaction with a corrupt log ends it all the
    same, kept without steps."""
    with SQLiteStore(path) as store:
        store.begin("t")
        store.record_step("t", 1, '"s"', [], "{}")
    with raw(path) as connection:
        connection.execute("UPDATE log SET kind = 99 WHERE tx_id = 't'")
    with SQLiteStore(path) as store:
        with pytest.raises(StorageError, match="corrupt"):
            store.peek("t")
        store.discard("t", history='"h"')
        assert store.open_transactions() == ()
        assert store.peek_ended("t")[1].steps == ()
