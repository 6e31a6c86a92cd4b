"""`SQLiteStore`: the `DurableStore` protocol in one SQLite file, shared by threads and processes.

**Layout** (schema version 1; `PRAGMA application_id` marks the file as an agenttx store and
`PRAGMA user_version` holds the schema version, which `MIGRATIONS` brings up to date):

======== ===================================================================================
meta     one row: `commit_version`, the durable commit counter
committed `key -> (version, value)`: the committed map
txs      one row per transaction with a durable record: `record` (JSON text, `"null"` until
         `record_transaction`), `owner` (JSON: pid, hostname, per-store token), `serializable`
log      the transaction's history, `(tx_id, seq)` -> an event (see below), seq from 0
undos    `(tx_id, step_id, seq) -> record`: the undo records, write-ahead of their effects
outbox   committed effects with their delivery history, in commit then staging order
======== ===================================================================================

A transaction's `log` is the sequence of its calls that change durable state, as events:
`WRITE` (key, base version, value or NULL for a tombstone: a journal entry), `SNAPSHOT` (step,
journal position), `RESTORE` (step), `STEP` (step id, record, progress, and the position of
snapshot `step` when it is the only one taken since the last durable write), `EFFECT` (step
id, channel, payload, idempotency key), `PROGRESS` (text) and `READ` (key, version;
serializable only). `load` replays them, with the very code the live calls run, into the same
overlay, journal and snapshots (the prior entry of a `WRITE` is the key's overlay entry before
it, so the file need not store it).

Why a log: a durable point appends its events at the end of the transaction's key range, in
one statement, so it dirties one B-tree page, and a step without state writes appends one row.
On a 2-core VM, a SQLite write transaction costs about 12 us, plus about 3 us per row and 5 us
per page it writes. `restore` deletes the `WRITE` events it reverts (the reverse replay runs on
the in-memory mirror) and appends a `RESTORE`. Events that a restore made moot stay until the
transaction ends (the replay skips them), except replaced `PROGRESS` events, deleted in
batches. Commit validates and publishes from the mirror, moves its effects to `outbox` and
deletes the transaction's rows, in one `BEGIN IMMEDIATE` transaction.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import socket
import sqlite3
import threading
from bisect import bisect_right
from itertools import islice
from typing import TYPE_CHECKING, Final, Literal, TypeAlias, final

import attrs

from .._errors import (
    InvalidArgument,
    ReadConflict,
    StorageError,
    TransactionNotFound,
    WriteConflict,
)
from ._durable import EffectRow, OutboxEntry, TxImage, UndoRow
from ._protocol import (
    MAX_STEP,
    check_key,
    check_step,
    check_tx_id,
    check_value,
    snapshot_not_found,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from types import TracebackType

    from ._durable import DurableStore

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "SQLiteStore"]

#: `PRAGMA application_id` of an agenttx store: "AGTX" in ASCII.
APPLICATION_ID: Final = 0x41475458

#: The schema migrations, in order: applying `MIGRATIONS[v]` takes a file from schema version
#: `v` to `v + 1`. Version 0 is an empty file. Append; never edit a released migration.
MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        (
            "CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 0), "
            "commit_version INTEGER NOT NULL)"
        ),
        "INSERT INTO meta (id, commit_version) VALUES (0, 0)",
        (
            "CREATE TABLE committed (key TEXT NOT NULL PRIMARY KEY, version INTEGER NOT NULL, "
            "value TEXT NOT NULL) WITHOUT ROWID"
        ),
        (
            "CREATE TABLE txs (tx_id TEXT NOT NULL PRIMARY KEY, record TEXT NOT NULL, "
            "owner TEXT, serializable INTEGER NOT NULL) WITHOUT ROWID"
        ),
        (
            "CREATE TABLE log (tx_id TEXT NOT NULL, seq INTEGER NOT NULL, kind INTEGER NOT NULL, "
            "step INTEGER, num INTEGER, name TEXT, body TEXT, extra TEXT, "
            "PRIMARY KEY (tx_id, seq)) WITHOUT ROWID"
        ),
        (
            "CREATE TABLE undos (tx_id TEXT NOT NULL, step_id INTEGER NOT NULL, "
            "seq INTEGER NOT NULL, record TEXT NOT NULL, PRIMARY KEY (tx_id, step_id, seq)) "
            "WITHOUT ROWID"
        ),
        (
            "CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, tx_id TEXT NOT NULL, "
            "step_id INTEGER NOT NULL, channel TEXT NOT NULL, payload TEXT NOT NULL, "
            "idempotency_key TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, "
            "last_error TEXT, not_before REAL NOT NULL DEFAULT 0, "
            "delivered INTEGER NOT NULL DEFAULT 0)"
        ),
        "CREATE INDEX outbox_pending ON outbox (id) WHERE delivered = 0",
    ),
)
#: The schema version this code writes: the number of migrations.
SCHEMA_VERSION: Final = len(MIGRATIONS)

#: Undo sequence numbers and outbox ids are SQLite integers.
_MAX_INT64: Final = 2**63 - 1
#: Keys per `IN (...)` query at commit; chunks are padded to a power of two, so that a handful
#: of prepared statements serve every size.
_IN_CHUNK: Final = 512

# The kinds of `log` events; the columns each one uses are in the module docstring.
_WRITE: Final = 1
_SNAPSHOT: Final = 2
_RESTORE: Final = 3
_STEP: Final = 4
_EFFECT: Final = 5
_PROGRESS: Final = 6
_READ: Final = 7

_INSERT_LOG: Final = (
    "INSERT INTO log (tx_id, seq, kind, step, num, name, body, extra) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_SELECT_COMMITTED: Final = "SELECT version, value FROM committed WHERE key = ?"
_SELECT_OWNER: Final = "SELECT owner FROM txs WHERE tx_id = ?"
_DELETE_LOG_ROW: Final = "DELETE FROM log WHERE tx_id = ? AND seq = ?"
#: Durable writes of at most this many events, and nothing else, are one fenced statement.
_MULTI_ROWS: Final = 16
#: Replaced `PROGRESS` events are deleted once there are this many.
_STALE_PROGRESS: Final = 32
_SELECT_OUTBOX: Final = (
    "SELECT id, tx_id, step_id, channel, payload, idempotency_key, attempts, last_error, "
    "not_before FROM outbox WHERE delivered = 0"
)
_SELECT_PENDING: Final = f"{_SELECT_OUTBOX} ORDER BY id LIMIT ?"
_SELECT_PENDING_OF: Final = f"{_SELECT_OUTBOX} AND tx_id = ? ORDER BY id LIMIT ?"

#: An overlay entry: (base version, value), the value `None` for a tombstone.
_Entry: TypeAlias = tuple[int, "str | None"]
#: A journal entry: (key, the key's prior overlay entry or `None`, the entry written).
_Undo: TypeAlias = tuple[str, "_Entry | None", _Entry]
#: A `log` row: tx_id, seq, kind, step, num, name, body, extra.
_Row: TypeAlias = tuple[
    str, int, int, "int | None", "int | None", "str | None", "str | None", "str | None"
]


@attrs.define(eq=False, repr=False)
class _Tx:
    """The in-process mirror of one transaction this store holds, and what it has not yet written.

    The overlay, journal and snapshots are `MemoryStore`'s (`snapshots` keeps the order taken,
    a retaken step moving to the end, so positions never decrease along it). Journal entries
    `[0, flushed)` are `WRITE` events in the file; `runs` maps journal positions to their `seq`s.
    """

    overlay: dict[str, _Entry] = attrs.Factory(dict)
    journal: list[_Undo] = attrs.Factory(list)
    snapshots: dict[int, int] = attrs.Factory(lambda: {0: 0})
    steps_in_order: bool = True
    reads: dict[str, int] | None = None
    effects: list[EffectRow] = attrs.Factory(list)
    flushed: int = 0
    #: (journal position, seq) where each run of consecutive `WRITE` events begins. The file's
    #: `WRITE` events are in journal order (a restore deletes those at or past its position).
    runs: list[tuple[int, int]] = attrs.Factory(list)
    #: Snapshots taken since the last durable point, in the order taken: step -> position.
    dirty_snapshots: dict[int, int] = attrs.Factory(dict)
    dirty_reads: list[tuple[str, int]] = attrs.Factory(list)
    next_seq: int = 0
    #: The seq of the `PROGRESS` event holding the current progress (`None` if a `STEP` event
    #: holds it), and those of replaced `PROGRESS` events still in the file (deleted
    #: `_STALE_PROGRESS` at a time, rather than one per write).
    progress_seq: int | None = None
    stale_progress: list[int] = attrs.Factory(list)

    def write(self, key: str, entry: _Entry) -> None:
        """Journal and apply one overlay write (used by the replay; `_write` inlines it)."""
        prior = self.overlay.get(key)
        self.journal.append((key, prior, entry))
        self.overlay[key] = entry

    def take_snapshot(self, step: int, position: int) -> None:
        """Record snapshot `step` at journal `position`, moving a retaken step to the end."""
        snapshots = self.snapshots
        if self.steps_in_order and snapshots and step < next(reversed(snapshots)):
            self.steps_in_order = False
        snapshots.pop(step, None)
        snapshots[step] = position

    def rewind(self, step: int, position: int) -> int:
        """Revert the journal to `position` (snapshot `step`'s), newest first; drop the snapshots
        of later steps and of reverted history. Returns the number of entries reverted."""
        journal, overlay, snapshots = self.journal, self.overlay, self.snapshots
        reverted = len(journal) - position
        for _ in range(reverted):
            key, prior, _entry = journal.pop()
            if prior is None:
                del overlay[key]
            else:
                overlay[key] = prior
        if self.steps_in_order:
            while next(reversed(snapshots)) != step:
                snapshots.popitem()
        else:
            self.snapshots = {s: p for s, p in snapshots.items() if s <= step and p <= position}
            self.steps_in_order = list(self.snapshots) == sorted(self.snapshots)
        if self.effects:
            self.effects = [effect for effect in self.effects if effect.step_id < step]
        return reverted

    def pending(self, tx_id: str, upto: int, *, snapshots: bool = True) -> list[_Row]:
        """The events not yet in the file: journal entries `[flushed, upto)`, then the dirty
        snapshots (unless the caller writes them itself) and reads, numbered from `next_seq`."""
        seq = self.next_seq
        rows: list[_Row] = []
        for key, _prior, (base, value) in islice(self.journal, self.flushed, upto):
            rows.append((tx_id, seq, _WRITE, None, base, key, value, None))
            seq += 1
        for step, position in self.dirty_snapshots.items() if snapshots else ():
            rows.append((tx_id, seq, _SNAPSHOT, step, position, None, None, None))
            seq += 1
        for key, version in self.dirty_reads:
            rows.append((tx_id, seq, _READ, None, version, key, None, None))
            seq += 1
        return rows

    def persisted(self, rows: int, upto: int) -> None:
        """Account for `rows` events written, starting with journal entries `[flushed, upto)`."""
        if upto > self.flushed:
            self.runs.append((self.flushed, self.next_seq))
            self.flushed = upto
        self.next_seq += rows
        if self.dirty_snapshots:
            self.dirty_snapshots = {}
        if self.dirty_reads:
            self.dirty_reads = []

    def new_progress(self, seq: int | None) -> None:
        """The progress is now the `PROGRESS` event `seq` (`None`: a `STEP` event's)."""
        if self.progress_seq is not None:
            self.stale_progress.append(self.progress_seq)
        self.progress_seq = seq

    def seq_at(self, position: int) -> int:
        """The seq of the `WRITE` event of flushed journal entry `position`."""
        start, seq = self.runs[bisect_right(self.runs, (position, _MAX_INT64)) - 1]
        return seq + position - start


@final
@attrs.define(eq=False, repr=False, init=False)
class SQLiteStore:
    """A `DurableStore` in one SQLite file (WAL mode), shared by threads and by processes.

    ``SQLiteStore(path, *, durability="normal", busy_timeout=5.0)`` opens or creates the file;
    `durability` is `synchronous=NORMAL` (a commit survives a crash of the process, and may be
    lost to a power failure) or `"full"` (`synchronous=FULL`: an fsync per durable write).
    `busy_timeout` is how long, in seconds, a write waits for another process's write before it
    raises `StorageError`. Close the store with `close()`, or use it as a context manager. A
    file that is not SQLite, a SQLite file that is not an agenttx store, or a store with a newer
    schema than this code knows raises `StorageError` here; an older schema is migrated.

    **Behaviour** is `MemoryStore`'s on every observable of the `Store` contract, plus the
    `DurableStore` protocol. Each transaction this store holds (begun or loaded here) has an
    in-process mirror: overlay, journal and snapshots, as in `MemoryStore`. So `snapshot`, `get`
    of an own write and `written_keys` run no SQL; `get` of another key, and the first `put` or
    `delete` of a key (for its base version), read the committed table. `put` and `delete` are
    buffered, and reach the file in the next durable write (`record_step`, `record_progress`,
    `record_undo`, `forget_undo`, `record_transaction`, `restore`, `flush`, `commit`, `load`),
    together with the snapshots taken and the reads recorded since the last one. Each durable
    write is one SQLite transaction: `BEGIN IMMEDIATE` ... `COMMIT`, or, for the frequent small
    ones (a step's record, say), one statement with the owner check built in, which SQLite runs
    as a transaction of its own.

    **After a crash** (or a `close()` without `flush`), `load` rebuilds a transaction exactly as
    it was at its last durable write: the writes and snapshots made after it are lost, so
    restoring such a snapshot raises `StorageError` (not found). Answering "nothing to revert"
    instead would be right for those (their writes are lost too), but the file cannot tell them
    from snapshots never taken or already dropped, for which it would be wrong; the engine
    takes snapshot K again before it runs step K again.

    **Ownership.** `begin` and `load` write this store's owner (JSON: pid, hostname, a random
    token per `SQLiteStore` instance) into the transaction's row. Every durable write checks it:
    if another store has loaded the transaction since, it raises `StorageError` (taken over), and
    if the row is gone (committed or discarded elsewhere), `TransactionNotFound`; either way this
    store stops holding the transaction. `is_open` answers for this store; `begin` refuses an id
    with a row in the file, from any process. `discard` and `discard_state` act on the file
    whichever store holds the transaction.

    **Threads.** One connection, guarded by one `threading.Lock` held for the whole of every
    call (its SQL included), rather than a connection per thread: SQLite admits one writer at a
    time anyway, and a second connection of this process would wait for it in SQLite's busy
    handler, which sleeps in steps of up to 100 ms, where a lock hands over at once; the
    mirrors need a lock in any case; and the reads are point lookups of a few microseconds, so
    WAL's concurrent readers would gain little. Calls for different transactions may run in any
    threads; calls for one transaction must not overlap, except `discard` (as for
    `MemoryStore`). A long commit delays the other threads' calls meanwhile.

    **Processes** share the file through SQLite's locks: `BEGIN IMMEDIATE` takes the write lock
    first, waiting up to `busy_timeout`, so a commit validates and publishes atomically against
    every process (first committer wins). Do not use one instance in two processes (after a
    `fork`, open a new one): the connection cannot be shared.

    **Errors.** `sqlite3` exceptions never escape: they become `StorageError` with the original
    as `__cause__` (a write that waited `busy_timeout` says so), and the SQLite transaction is
    rolled back, so the call has no effect, on the file or on the mirror.
    """

    _path: str
    _durability: str
    _busy_timeout: float
    _lock: threading.Lock
    _conn: sqlite3.Connection
    _cur: sqlite3.Cursor
    _owner: str
    _closed: bool
    _txs: dict[str, _Tx]
    _in_sql: dict[int, str]
    _multi_sql: dict[int, str]

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Literal["normal", "full"] = "normal",
        busy_timeout: float = 5.0,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidArgument(f"path must be a str or os.PathLike, not {type(path).__name__}")
        if durability not in {"normal", "full"}:
            raise InvalidArgument(f'durability must be "normal" or "full", got {durability!r}')
        if (
            isinstance(busy_timeout, bool)
            or not isinstance(busy_timeout, (int, float))
            or not 0 <= busy_timeout < math.inf
        ):
            raise InvalidArgument(
                f"busy_timeout must be a finite number of seconds >= 0, got {busy_timeout!r}"
            )
        self._path = os.fspath(path)
        self._durability = durability
        self._busy_timeout = float(busy_timeout)
        self._lock = threading.Lock()
        self._owner = json.dumps(
            {"hostname": socket.gethostname(), "pid": os.getpid(), "token": secrets.token_hex(8)},
            separators=(",", ":"),
        )
        self._closed = False
        self._txs = {}
        self._in_sql = {}
        self._multi_sql = {}
        try:
            self._conn = sqlite3.connect(
                self._path,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=256,
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the store `{self._path}`: {exc}") from exc
        self._cur = self._conn.cursor()
        try:
            self._open_schema()
        except BaseException:
            self._closed = True
            self._conn.close()
            raise

    def _open_schema(self) -> None:
        """Check that the file is an agenttx store (or empty), set the pragmas, migrate."""
        cur = self._cur
        try:
            application_id, version, objects = self._identify()
        except sqlite3.DatabaseError as exc:
            if _is_busy(exc):
                raise self._failure("read the schema", exc) from exc
            raise StorageError(
                f"`{self._path}` is not a SQLite database (or it is encrypted or corrupt): {exc}"
            ) from exc
        self._check_schema(application_id, version, objects)
        try:
            mode = cur.execute("PRAGMA journal_mode = WAL").fetchall()[0][0]
            cur.execute(f"PRAGMA synchronous = {self._durability.upper()}")
            if version < len(MIGRATIONS):
                cur.execute("BEGIN IMMEDIATE")
                try:
                    # Read again under the write lock: another process may have migrated.
                    application_id, version, objects = self._identify()
                    self._check_schema(application_id, version, objects)
                    for statements in MIGRATIONS[version:]:
                        for statement in statements:
                            cur.execute(statement)
                    cur.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    cur.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
                    cur.execute("COMMIT")
                except BaseException:
                    self._rollback()
                    raise
        except sqlite3.Error as exc:
            raise self._failure("set up the schema", exc) from exc
        if mode != "wal" and self._path != ":memory:":  # pragma: no cover - needs such a disk
            raise StorageError(
                f"`{self._path}` cannot use SQLite's WAL mode (journal mode {mode!r}): put the "
                "store on a local file system"
            )

    def _identify(self) -> tuple[int, int, int]:
        cur = self._cur
        application_id = cur.execute("PRAGMA application_id").fetchall()[0][0]
        version = cur.execute("PRAGMA user_version").fetchall()[0][0]
        objects = cur.execute("SELECT count(*) FROM sqlite_master").fetchall()[0][0]
        return application_id, version, objects

    def _check_schema(self, application_id: int, version: int, objects: int) -> None:
        if application_id == 0 and version == 0 and objects == 0:
            return  # an empty database: the migrations create the store
        if application_id != APPLICATION_ID:
            raise StorageError(
                f"`{self._path}` is a SQLite database but not an agenttx store "
                f"(application_id {application_id}, user_version {version}, {objects} schema "
                "objects): give SQLiteStore a new file or one it created"
            )
        if version > len(MIGRATIONS):
            raise StorageError(
                f"the store `{self._path}` has schema version {version}, newer than this "
                f"version of agenttx knows ({len(MIGRATIONS)}): upgrade agenttx to open it"
            )

    # ------------------------------------------------------------ the store itself

    @property
    def path(self) -> str:
        """The database file's path, as given."""
        return self._path

    def close(self) -> None:
        """Close the connection; idempotent. Buffered writes not yet written are dropped
        (call `flush` first to keep them); the transactions stay in the file for `load`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._txs.clear()
            try:
                self._conn.close()
            except sqlite3.Error as exc:  # pragma: no cover - close fails only if SQLite does
                raise StorageError(f"cannot close the store `{self._path}`: {exc}") from exc

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._txs)} open transactions held here"
        return f"<SQLiteStore {self._path!r}: {state}>"

    # ------------------------------------------------------------ lifecycle

    def begin(self, tx_id: str, *, serializable: bool = False) -> None:
        """Open transaction `tx_id` and take its snapshot 0 (see `Store.begin`).

        Writes the transaction's row (owned by this store) at once. Raises `InvalidArgument`
        if this store holds the transaction, or the file has a row for it (open in another
        store, or kept by `discard_state` for recovery).
        """
        check_tx_id(tx_id)
        with self._lock:
            if tx_id in self._txs:
                raise InvalidArgument(
                    f"transaction `{tx_id}` is already open: commit or discard it first"
                )
            self._check_not_closed()
            try:
                cursor = self._cur.execute(
                    "INSERT OR IGNORE INTO txs (tx_id, record, owner, serializable) "
                    "VALUES (?, 'null', ?, ?)",
                    (tx_id, self._owner, int(serializable)),
                )
                inserted = cursor.rowcount
            except sqlite3.Error as exc:
                raise self._failure(f"begin transaction `{tx_id}`", exc) from exc
            if inserted != 1:
                raise InvalidArgument(
                    f"transaction `{tx_id}` is already open in another store on `{self._path}` "
                    "(or kept there for recovery): load and end it, or use another id"
                )
            self._txs[tx_id] = _Tx(reads={} if serializable else None)

    def commit(self, tx_id: str) -> int:
        """Validate and publish the overlay in one SQLite transaction (see `Store.commit`).

        Also moves the staged effects to the outbox, in staging order, and deletes the
        transaction's rows (record, log, undo records).
        """
        with self._lock:
            tx = self._open(tx_id)
            overlay = tx.overlay
            with self._writing(f"commit transaction `{tx_id}`") as cur:
                self._fence(tx_id)
                self._validate(tx)
                version = cur.execute("SELECT commit_version FROM meta").fetchall()[0][0] + 1
                cur.execute("UPDATE meta SET commit_version = ?", (version,))
                cur.executemany(
                    "INSERT OR REPLACE INTO committed (key, version, value) VALUES (?, ?, ?)",
                    [(k, version, v) for k, (_, v) in overlay.items() if v is not None],
                )
                cur.executemany(
                    "DELETE FROM committed WHERE key = ?",
                    [(k,) for k, (_, v) in overlay.items() if v is None],
                )
                if tx.effects:
                    cur.executemany(
                        "INSERT INTO outbox (tx_id, step_id, channel, payload, idempotency_key) "
                        "VALUES (?, ?, ?, ?, ?)",
                        [(tx_id, *effect) for effect in tx.effects],
                    )
                self._delete_rows(tx_id, keep_record=False)
            del self._txs[tx_id]
        return len(overlay)

    def _validate(self, tx: _Tx) -> None:
        """Inside the commit's write transaction: raise `WriteConflict` for the smallest key
        committed since the transaction first wrote it, then `ReadConflict` likewise for the
        keys a serializable transaction read."""
        overlay = tx.overlay
        if overlay:
            current = self._versions(list(overlay))
            conflicts = [k for k, (base, _) in overlay.items() if current.get(k, 0) != base]
            if conflicts:
                raise WriteConflict(key=min(conflicts))
        if tx.reads:
            current = self._versions(list(tx.reads))
            stale = [k for k, read in tx.reads.items() if current.get(k, 0) != read]
            if stale:
                raise ReadConflict(key=min(stale))

    def discard(self, tx_id: str) -> None:
        """End the transaction and delete all its rows, whichever store holds it; a no-op if
        there is no such transaction (see `Store.discard`)."""
        self._discard(tx_id, keep_record=False)

    def discard_state(self, tx_id: str) -> None:
        """End the transaction's state but keep its record and undo records, whichever store
        holds it; a no-op if there is no such transaction (see `DurableStore.discard_state`)."""
        self._discard(tx_id, keep_record=True)

    def _discard(self, tx_id: str, *, keep_record: bool) -> None:
        try:
            check_tx_id(tx_id)
        except InvalidArgument:
            return  # no transaction can have this id
        doing = f"discard transaction `{tx_id}`"
        with self._lock:
            self._check_not_closed()
            with self._writing(doing):
                self._delete_rows(tx_id, keep_record=keep_record)
            self._txs.pop(tx_id, None)

    def is_open(self, tx_id: str) -> bool:
        """Whether this store holds the transaction: begun or loaded here, and not ended."""
        with self._lock:
            return tx_id in self._txs

    # ------------------------------------------------------------ the overlay

    def get(self, tx_id: str, key: str) -> str | None:
        """The transaction's own write of `key`, else the committed value (`Store.get`)."""
        check_key(key)
        with self._lock:
            tx = self._txs.get(tx_id)
            if tx is None:
                raise self._not_open(tx_id)
            entry = tx.overlay.get(key)
            if entry is not None:
                return entry[1]
            row = self._committed_row(key)
            reads = tx.reads
            if reads is not None and key not in reads:
                version = 0 if row is None else row[0]
                reads[key] = version
                tx.dirty_reads.append((key, version))
        return None if row is None else row[1]

    def put(self, tx_id: str, key: str, value: str) -> None:
        """Write `value` to the overlay, journaled and buffered until the next durable write."""
        check_key(key)
        check_value(value)
        self._write(tx_id, key, value)

    def delete(self, tx_id: str, key: str) -> None:
        """Write a tombstone for `key` to the overlay, journaled and buffered (`Store.delete`)."""
        check_key(key)
        self._write(tx_id, key, None)

    def _write(self, tx_id: str, key: str, value: str | None) -> None:
        with self._lock:
            tx = self._txs.get(tx_id)
            if tx is None:
                raise self._not_open(tx_id)
            prior = tx.overlay.get(key)
            if prior is None:
                row = self._committed_row(key)
                entry = (0 if row is None else row[0], value)
            else:
                entry = (prior[0], value)
            tx.journal.append((key, prior, entry))
            tx.overlay[key] = entry

    def written_keys(self, tx_id: str) -> tuple[str, ...]:
        """The keys in the overlay, tombstones included, sorted."""
        with self._lock:
            tx = self._open(tx_id)
            return tuple(sorted(tx.overlay))

    # ------------------------------------------------------------ snapshots

    def snapshot(self, tx_id: str, step: int) -> None:
        """Record the journal position for `step`, in O(1) and in memory (`Store.snapshot`);
        it reaches the file with the next durable write."""
        check_step(step)
        with self._lock:
            tx = self._txs.get(tx_id)
            if tx is None:
                raise self._not_open(tx_id)
            position = len(tx.journal)
            tx.take_snapshot(step, position)
            dirty = tx.dirty_snapshots
            dirty.pop(step, None)
            dirty[step] = position

    def restore(self, tx_id: str, step: int) -> int:
        """Rewind to snapshot `step` (`Store.restore`) and drop the step records and staged
        effects of steps >= `step` (`DurableStore`), durably, in one SQLite transaction.

        The reverse replay runs on the mirror, in O(mutations reverted); the file loses the
        reverted `WRITE` events in one range delete.
        """
        check_step(step)
        with self._lock:
            tx = self._open(tx_id)
            position = tx.snapshots.get(step)
            if position is None:
                raise StorageError(snapshot_not_found(tx_id, step))
            upto = min(position, len(tx.journal))
            rows = tx.pending(tx_id, upto)
            rows.append((tx_id, tx.next_seq + len(rows), _RESTORE, step, None, None, None, None))
            doing = f"restore snapshot {step} of transaction `{tx_id}`"
            with self._writing(doing) as cur:
                self._fence(tx_id)
                if position < tx.flushed:
                    cur.execute(
                        "DELETE FROM log WHERE tx_id = ? AND seq >= ? AND kind = ?",
                        (tx_id, tx.seq_at(position), _WRITE),
                    )
                cur.executemany(_INSERT_LOG, rows)
            tx.persisted(len(rows), upto)
            if position < tx.flushed:
                tx.flushed = position
                while tx.runs and tx.runs[-1][0] >= position:
                    tx.runs.pop()
            return tx.rewind(step, position)

    # ------------------------------------------------------------ committed state

    def read_committed(self, key: str) -> str | None:
        """The committed value of `key`, or `None`."""
        check_key(key)
        with self._lock:
            self._check_not_closed()
            row = self._committed_row(key)
        return None if row is None else row[1]

    def committed_version(self, key: str) -> int:
        """The number of the commit that last wrote `key`, or 0 if it is absent."""
        check_key(key)
        with self._lock:
            self._check_not_closed()
            row = self._committed_row(key)
        return 0 if row is None else row[0]

    # ------------------------------------------------------------ durable records

    def record_transaction(self, tx_id: str, record: str) -> None:
        """Replace the transaction's record (JSON text), durably, with the buffered writes."""
        check_value(record)
        statement = ("UPDATE txs SET record = ? WHERE tx_id = ?", (record, tx_id))
        fenced = (f"{statement[0]} AND owner = ?", (record, tx_id, self._owner))
        self._durable_write(tx_id, "record transaction", statement, fenced=fenced)

    def record_step(
        self,
        tx_id: str,
        step_id: int,
        step: str,
        effects: Sequence[EffectRow],
        progress: str,
    ) -> None:
        """Durably and atomically: the buffered writes and snapshots, step `step_id`'s record
        (replacing one of the same step), its `effects` (each keeps its own `step_id`) and the
        transaction's progress.

        One `STEP` event holds the record, the progress and, when it is the only snapshot
        taken since the last durable write, snapshot `step_id`; then one `EFFECT` event per
        effect. So a step without state writes or effects appends one row.
        """
        _check_int(step_id, "step_id", MAX_STEP)
        check_value(step)
        check_value(progress)
        checked = [] if type(effects) in {tuple, list} and not effects else _check_effects(effects)
        with self._lock:
            tx = self._txs.get(tx_id)
            if tx is None:
                raise self._not_open(tx_id)
            upto = len(tx.journal)
            dirty = tx.dirty_snapshots
            folded = dirty[step_id] if len(dirty) == 1 and step_id in dirty else None
            rows = tx.pending(tx_id, upto, snapshots=folded is None)
            seq = tx.next_seq + len(rows)
            rows.append((tx_id, seq, _STEP, step_id, folded, None, step, progress))
            for effect in checked:
                seq += 1
                rows.append((tx_id, seq, _EFFECT, effect[0], None, *effect[1:]))
            self._write_rows(tx_id, tx, rows, upto, doing="record a step")
            tx.new_progress(None)
            tx.effects += checked

    def record_progress(self, tx_id: str, progress: str) -> None:
        """Durably and atomically: the buffered writes and snapshots, and the new progress."""
        check_value(progress)
        self._durable_write(tx_id, "record progress", None, progress)

    def record_undo(self, tx_id: str, undo: UndoRow) -> None:
        """Store an undo record durably, with the buffered writes, replacing one in the same
        place `(step_id, seq)`."""
        step_id, seq, record = _check_undo(undo)
        statement = (
            "INSERT OR REPLACE INTO undos (tx_id, step_id, seq, record) VALUES (?, ?, ?, ?)",
            (tx_id, step_id, seq, record),
        )
        fenced = (
            (
                "INSERT OR REPLACE INTO undos (tx_id, step_id, seq, record) SELECT ?, ?, ?, ? "
                "WHERE EXISTS (SELECT 1 FROM txs WHERE tx_id = ? AND owner = ?)"
            ),
            (*statement[1], tx_id, self._owner),
        )
        self._durable_write(tx_id, "record an undo", statement, fenced=fenced)

    def forget_undo(self, tx_id: str, step_id: int, seq: int) -> None:
        """Delete an undo record, with the buffered writes; idempotent."""
        _check_int(step_id, "step_id", MAX_STEP)
        _check_int(seq, "seq", _MAX_INT64)
        statement = (
            "DELETE FROM undos WHERE tx_id = ? AND step_id = ? AND seq = ?",
            (tx_id, step_id, seq),
        )
        self._durable_write(tx_id, "forget an undo", statement)

    def flush(self, tx_id: str) -> None:
        """Write the buffered writes, snapshots and reads durably; without them, no SQL runs."""
        with self._lock:
            tx = self._open(tx_id)
            if tx.flushed == len(tx.journal) and not tx.dirty_snapshots and not tx.dirty_reads:
                return
        self._durable_write(tx_id, "flush", None)

    def _durable_write(
        self,
        tx_id: str,
        doing: str,
        statement: tuple[str, tuple[object, ...]] | None,
        progress: str | None = None,
        *,
        fenced: tuple[str, tuple[object, ...]] | None = None,
    ) -> None:
        """One durable write: the pending events, then a `PROGRESS` event and `statement`.

        With nothing pending, `fenced` (if given) runs alone instead: `statement` with the
        owner check built in, changing one row if and only if this store owns the transaction.
        """
        with self._lock:
            tx = self._open(tx_id)
            upto = len(tx.journal)
            rows = tx.pending(tx_id, upto)
            if fenced is not None and not rows and len(tx.stale_progress) < _STALE_PROGRESS:
                try:
                    if self._cur.execute(*fenced).rowcount != 1:
                        self._fence(tx_id)  # raises: the transaction is not this store's
                except sqlite3.Error as exc:
                    raise self._failure(f"{doing} for transaction `{tx_id}`", exc) from exc
                return
            seq = tx.next_seq + len(rows)
            if progress is not None:
                rows.append((tx_id, seq, _PROGRESS, None, None, None, progress, None))
            self._write_rows(tx_id, tx, rows, upto, doing=doing, statement=statement)
            if progress is not None:
                tx.new_progress(seq)

    def _write_rows(
        self,
        tx_id: str,
        tx: _Tx,
        rows: list[_Row],
        upto: int,
        *,
        doing: str,
        statement: tuple[str, tuple[object, ...]] | None = None,
    ) -> None:
        """Append `rows` (journal entries `[flushed, upto)` first) and run `statement`, in one
        SQLite transaction, if this store still owns the transaction; then account for them.

        A few rows and nothing else go in one fenced statement (`_insert_fenced`); otherwise
        `BEGIN IMMEDIATE`, the owner check, the rows, the deletion of the replaced `PROGRESS`
        events once there are `_STALE_PROGRESS` of them, `statement`, `COMMIT`.
        """
        stale = tx.stale_progress if len(tx.stale_progress) >= _STALE_PROGRESS else None
        if statement is None and stale is None and 0 < len(rows) <= _MULTI_ROWS:
            self._insert_fenced(tx_id, rows, doing)
        else:
            doing = f"{doing} for transaction `{tx_id}`"
            with self._writing(doing) as cur:
                self._fence(tx_id)
                if rows:
                    cur.executemany(_INSERT_LOG, rows)
                if stale is not None:
                    cur.executemany(_DELETE_LOG_ROW, [(tx_id, seq) for seq in stale])
                if statement is not None:
                    cur.execute(*statement)
            if stale is not None:
                tx.stale_progress = []
        tx.persisted(len(rows), upto)

    def _insert_fenced(self, tx_id: str, rows: list[_Row], doing: str) -> None:
        """Append `rows` to the log in one statement, hence one implicit SQLite transaction,
        if this store owns `tx_id`; else change nothing and raise as `_fence` does.

        An implicit transaction is as safe as `BEGIN IMMEDIATE` here: SQLite takes the write
        lock for it at once, and retries with the busy handler while it has read nothing.
        """
        count = len(rows)
        sql = self._multi_sql.get(count)
        if sql is None:
            values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * count)
            sql = self._multi_sql[count] = (  # placeholders only:
                "INSERT INTO log (tx_id, seq, kind, step, num, name, body, extra) "  # noqa: S608
                f"SELECT * FROM (VALUES {values}) "
                "WHERE EXISTS (SELECT 1 FROM txs WHERE tx_id = ? AND owner = ?)"
            )
        parameters = [value for row in rows for value in row]
        parameters += (tx_id, self._owner)
        try:
            inserted = self._cur.execute(sql, parameters).rowcount
            if inserted != count:
                self._fence(tx_id)  # raises: the transaction is not this store's any more
                raise StorageError(  # pragma: no cover - unreachable: the owner check failed
                    f"could not {doing} for transaction `{tx_id}`: the log refused the events"
                )
        except sqlite3.Error as exc:
            raise self._failure(f"{doing} for transaction `{tx_id}`", exc) from exc

    # ------------------------------------------------------------ recovery

    def open_transactions(self) -> tuple[str, ...]:
        """The ids of every transaction with a row in the file, any process's, sorted."""
        with self._lock:
            self._check_not_closed()
            try:
                rows = self._cur.execute("SELECT tx_id FROM txs ORDER BY tx_id").fetchall()
            except sqlite3.Error as exc:
                raise self._failure("list the open transactions", exc) from exc
        return tuple(row[0] for row in rows)

    def owner(self, tx_id: str) -> str | None:
        """The owner of transaction `tx_id` in the file (JSON text: `hostname`, `pid` and this
        store instance's `token`), without taking it over. `TransactionNotFound` if none."""
        check_tx_id(tx_id)
        with self._lock:
            self._check_not_closed()
            try:
                rows = self._cur.execute(_SELECT_OWNER, (tx_id,)).fetchall()
            except sqlite3.Error as exc:
                raise self._failure(f"read the owner of transaction `{tx_id}`", exc) from exc
        if not rows:
            raise TransactionNotFound(tx_id=tx_id)
        owner: str | None = rows[0][0]
        return owner

    def load(self, tx_id: str) -> TxImage:
        """Read transaction `tx_id` back and hold it here (see `DurableStore.load`).

        Replays its log into a new mirror, writes this store as its owner, and returns its
        image with the previous owner. If this store already holds it, its buffered writes are
        written first (and the mirror rebuilt, the same); if `discard_state` ended its state,
        it starts again as `begin` leaves it. Raises `TransactionNotFound` if the file has no
        row for it.
        """
        check_tx_id(tx_id)
        doing = f"load transaction `{tx_id}`"
        with self._lock:
            self._check_not_closed()
            held = self._txs.get(tx_id)
            with self._writing(doing) as cur:
                record, owner, serializable = self._tx_row(tx_id)
                if held is not None and owner == self._owner:
                    cur.executemany(_INSERT_LOG, held.pending(tx_id, len(held.journal)))
                events = cur.execute(
                    "SELECT seq, kind, step, num, name, body, extra FROM log WHERE tx_id = ? "
                    "ORDER BY seq",
                    (tx_id,),
                ).fetchall()
                undos = cur.execute(
                    "SELECT step_id, seq, record FROM undos WHERE tx_id = ? ORDER BY step_id, seq",
                    (tx_id,),
                ).fetchall()
                tx, steps, progress = self._replay(tx_id, events, serializable=bool(serializable))
                cur.execute("UPDATE txs SET owner = ? WHERE tx_id = ?", (self._owner, tx_id))
            self._txs[tx_id] = tx
        return TxImage(
            tx_id=tx_id,
            record=record,
            progress=progress,
            steps=tuple(sorted(steps.items())),
            undos=tuple(UndoRow(*row) for row in undos),
            effects=tuple(tx.effects),
            owner=owner,
            snapshots=tuple(sorted(tx.snapshots)),
        )

    def _tx_row(self, tx_id: str) -> tuple[str, str | None, int]:
        """The transaction's `txs` row: record, owner, serializable. `TransactionNotFound`."""
        rows = self._cur.execute(
            "SELECT record, owner, serializable FROM txs WHERE tx_id = ?", (tx_id,)
        ).fetchall()
        if not rows:
            raise TransactionNotFound(tx_id=tx_id)
        record, owner, serializable = rows[0]
        return record, owner, serializable

    def _replay(
        self,
        tx_id: str,
        events: list[tuple[int, int, int, int, str, str, str]],
        *,
        serializable: bool,
    ) -> tuple[_Tx, dict[int, str], str | None]:
        """A new mirror, the step records and the progress, from the transaction's log."""
        tx = _Tx(reads={} if serializable else None)
        steps: dict[int, str] = {}
        progress: str | None = None
        last_write = -2
        for seq, kind, step, num, name, body, extra in events:
            if kind == _WRITE:
                if seq != last_write + 1:  # a new run: see `_Tx.runs`
                    tx.runs.append((len(tx.journal), seq))
                last_write = seq
                tx.write(name, (num, body))
            elif kind == _SNAPSHOT:
                tx.take_snapshot(step, num)
            elif kind == _RESTORE and step in tx.snapshots:
                tx.rewind(step, tx.snapshots[step])
                steps = {s: record for s, record in steps.items() if s < step}
            elif kind == _STEP:
                if num is not None:
                    tx.take_snapshot(step, num)
                steps[step] = body
                progress = extra
                tx.new_progress(None)
            elif kind == _EFFECT:
                tx.effects.append(EffectRow(step, name, body, extra))
            elif kind == _PROGRESS:
                progress = body
                tx.new_progress(seq)
            elif kind == _READ and tx.reads is not None:
                tx.reads.setdefault(name, num)
            else:
                raise StorageError(
                    f"the log of transaction `{tx_id}` in `{self._path}` is corrupt: "
                    f"event {seq} of kind {kind} cannot be replayed"
                )
            tx.next_seq = seq + 1
        tx.flushed = len(tx.journal)
        return tx, steps, progress

    # ------------------------------------------------------------ the outbox

    def pending_effects(
        self, limit: int = 100, *, tx_id: str | None = None
    ) -> tuple[OutboxEntry, ...]:
        """Up to `limit` undelivered entries (of transaction `tx_id` only, if given), in commit
        then staging order, those waiting for their `not_before` included."""
        _check_int(limit, "limit", _MAX_INT64, minimum=1)
        if tx_id is not None:
            check_tx_id(tx_id)
        with self._lock:
            self._check_not_closed()
            try:
                rows = self._cur.execute(
                    _SELECT_PENDING if tx_id is None else _SELECT_PENDING_OF,
                    (limit,) if tx_id is None else (tx_id, limit),
                ).fetchall()
            except sqlite3.Error as exc:
                raise self._failure("read the outbox", exc) from exc
        return tuple(OutboxEntry(*row) for row in rows)

    def mark_delivered(self, entry_id: int) -> None:
        """Mark an outbox entry delivered; idempotent. `InvalidArgument` if there is none."""
        _check_int(entry_id, "entry_id", _MAX_INT64, minimum=1)
        self._update_outbox(entry_id, "UPDATE outbox SET delivered = 1 WHERE id = ?", ())

    def mark_failed(self, entry_id: int, error: str, not_before: float) -> None:
        """Count a failed delivery of an undelivered entry: keep `error`, hold it back until
        `not_before`. A no-op on a delivered entry; `InvalidArgument` if there is none."""
        _check_int(entry_id, "entry_id", _MAX_INT64, minimum=1)
        check_value(error)
        if (
            isinstance(not_before, bool)
            or not isinstance(not_before, (int, float))
            or not math.isfinite(not_before)
        ):
            raise InvalidArgument(f"not_before must be a finite number, got {not_before!r}")
        self._update_outbox(
            entry_id,
            "UPDATE outbox SET attempts = attempts + 1, last_error = ?, not_before = ? "
            "WHERE id = ? AND delivered = 0",
            (error, float(not_before)),
        )

    def _update_outbox(self, entry_id: int, sql: str, values: tuple[object, ...]) -> None:
        doing = f"update outbox entry {entry_id}"
        with self._lock:
            self._check_not_closed()
            with self._writing(doing) as cur:
                if cur.execute(sql, (*values, entry_id)).rowcount == 0:
                    self._check_entry(entry_id)

    def _check_entry(self, entry_id: int) -> None:
        if not self._cur.execute("SELECT 1 FROM outbox WHERE id = ?", (entry_id,)).fetchall():
            raise InvalidArgument(f"there is no outbox entry {entry_id}")

    # ------------------------------------------------------------ helpers

    def _open(self, tx_id: str) -> _Tx:
        """The transaction `tx_id` this store holds; the caller holds the lock."""
        tx = self._txs.get(tx_id)
        if tx is None:
            raise self._not_open(tx_id)
        return tx

    def _not_open(self, tx_id: str) -> Exception:
        """The error for a transaction this store does not hold (or for a closed store)."""
        if self._closed:
            return self._closed_error()
        return TransactionNotFound(tx_id=tx_id)

    def _check_not_closed(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _closed_error(self) -> StorageError:
        return StorageError(f"the SQLiteStore for `{self._path}` is closed")

    def _committed_row(self, key: str) -> tuple[int, str] | None:
        """The committed (version, value) of `key`; the caller holds the lock."""
        try:
            rows = self._cur.execute(_SELECT_COMMITTED, (key,)).fetchall()
        except sqlite3.Error as exc:
            raise self._failure("read the committed state", exc) from exc
        return rows[0] if rows else None

    def _versions(self, keys: list[str]) -> dict[str, int]:
        """The committed versions of those of `keys` that are present, inside a transaction."""
        found: dict[str, int] = {}
        execute = self._cur.execute
        for start in range(0, len(keys), _IN_CHUNK):
            chunk = keys[start : start + _IN_CHUNK]
            size = 1 << (len(chunk) - 1).bit_length()
            sql = self._in_sql.get(size)
            if sql is None:
                marks = ", ".join("?" * size)
                sql = self._in_sql[size] = (
                    f"SELECT key, version FROM committed WHERE key IN ({marks})"  # noqa: S608
                )
            found.update(execute(sql, chunk + chunk[-1:] * (size - len(chunk))).fetchall())
        return found

    def _fence(self, tx_id: str) -> None:
        """Check, inside a write transaction, that this store still owns `tx_id`."""
        rows = self._cur.execute(_SELECT_OWNER, (tx_id,)).fetchall()
        if rows and rows[0][0] == self._owner:
            return
        self._txs.pop(tx_id, None)
        if not rows:
            raise TransactionNotFound(tx_id=tx_id)
        raise StorageError(
            f"transaction `{tx_id}` was taken over by another store (owner {rows[0][0]}): "
            "this store no longer holds it"
        )

    def _delete_rows(self, tx_id: str, *, keep_record: bool) -> None:
        execute = self._cur.execute
        execute("DELETE FROM log WHERE tx_id = ?", (tx_id,))
        if not keep_record:
            execute("DELETE FROM undos WHERE tx_id = ?", (tx_id,))
            execute("DELETE FROM txs WHERE tx_id = ?", (tx_id,))

    @contextlib.contextmanager
    def _writing(self, doing: str) -> Iterator[sqlite3.Cursor]:
        """Run the block in one write transaction: `BEGIN IMMEDIATE` (waiting up to the busy
        timeout), then `COMMIT`; if the block raises, `ROLLBACK` and re-raise, a
        `sqlite3.Error` as `StorageError`. The caller holds the lock."""
        cur = self._cur
        try:
            cur.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._failure(doing, exc) from exc
        try:
            yield cur
        except sqlite3.Error as exc:
            self._rollback()
            raise self._failure(doing, exc) from exc
        except BaseException:
            self._rollback()
            raise
        try:
            cur.execute("COMMIT")
        except sqlite3.Error as exc:  # pragma: no cover - SQLite fails a COMMIT only on I/O errors
            self._rollback()
            raise self._failure(doing, exc) from exc

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # if so, SQLite has rolled back by itself
                self._cur.execute("ROLLBACK")

    def _failure(self, doing: str, exc: sqlite3.Error) -> StorageError:
        if _is_busy(exc):
            return StorageError(
                f"could not {doing}: the store `{self._path}` stayed locked by another "
                f"connection for the whole busy timeout ({self._busy_timeout:g} s)"
            )
        return StorageError(f"could not {doing} in the store `{self._path}`: {exc}")


def _is_busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite gave up waiting for a lock (SQLITE_BUSY or SQLITE_LOCKED)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in {5, 6}
    return "locked" in str(exc)  # pragma: no cover - Python 3.10 has no sqlite_errorcode


def _check_int(value: object, what: str, maximum: int, *, minimum: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidArgument(f"{what} must be an integer in {minimum}-{maximum}, got {value!r}")


def _check_effects(effects: Iterable[object]) -> list[EffectRow]:
    """The effects as `EffectRow`s, each checked; `InvalidArgument` names the first bad one."""
    if isinstance(effects, (str, bytes)):
        raise InvalidArgument("effects must be a sequence of EffectRow, not text")
    try:
        items = list(effects)
    except TypeError:
        raise InvalidArgument(f"effects must be a sequence of EffectRow, not {effects!r}") from None
    checked = []
    for index, effect in enumerate(items):
        if not isinstance(effect, tuple) or len(effect) != len(EffectRow._fields):
            raise InvalidArgument(f"effect {index} must be an EffectRow, not {effect!r}")
        row = EffectRow(*effect)
        _check_int(row.step_id, f"the step_id of effect {index}", MAX_STEP)
        for name in ("channel", "payload", "idempotency_key"):
            if not isinstance(getattr(row, name), str):
                raise InvalidArgument(f"the {name} of effect {index} must be text")
            check_value(getattr(row, name))
        checked.append(row)
    return checked


def _check_undo(undo: object) -> tuple[int, int, str]:
    if not isinstance(undo, tuple) or len(undo) != len(UndoRow._fields):
        raise InvalidArgument(f"undo records must be UndoRow, not {undo!r}")
    step_id, seq, record = undo
    _check_int(step_id, "step_id", MAX_STEP)
    _check_int(seq, "seq", _MAX_INT64)
    check_value(record)
    return step_id, seq, record


if TYPE_CHECKING:

    def _conforms(store: SQLiteStore) -> DurableStore:
        return store  # mypy checks here that SQLiteStore satisfies the protocol
