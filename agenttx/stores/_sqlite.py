"""`SQLiteStore`: the `DurableStore` protocol in one SQLite file, shared by threads and processes.

The store is three modules: this one, the store and its durable writes; `_sqlite_file`, the
file's layout, migrations and connection, and all the SQL text the store runs; `_sqlite_mirror`,
the in-process mirror of a transaction (an `_overlay.Overlay`, as `MemoryStore` keeps, plus
what the file has not received yet) and the replay of its `log` that rebuilds it. Its base,
`_log_rows.LogStore`, shared with `PostgresStore`, holds the overlay calls and assembles the
events of a step, a restore or a progress; this module writes them.

Why a log of events per transaction (`_sqlite_file` lists them): a durable point appends its
events at the end of the transaction's key range, in one statement, so it dirties one B-tree
page, and a step without state writes appends one row. On a 2-core VM, a SQLite write
transaction costs about 12 us, plus about 3 us per row and 5 us per page it writes. `restore`
deletes the `WRITE` events it reverts (the reverse replay runs on the in-memory mirror) and
appends a `RESTORE`. Events that a restore made moot stay until the transaction ends (the
replay skips them), except replaced `PROGRESS` events, deleted in batches. Commit validates and
publishes from the mirror, moves its effects to `outbox`, appends the transaction's history to
`ended` (its record, the history text its caller gave, and its live step records, which the
mirror holds) and deletes the transaction's rows, in one `BEGIN IMMEDIATE` transaction. The
history goes to a table of its own, appended in the order transactions end, rather than staying
in `log`: a `log` that keeps ended transactions grows, and each durable write then lands in a
large B-tree at the random place of its transaction id, which cost about a third of the
throughput. Appending a row to the last page costs about 4% of the throughput of 20-step
transactions; the retention deletes old history in batches (`_PRUNE_EVERY`).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import socket
import sqlite3
import threading
import time
import weakref
from typing import TYPE_CHECKING, Final, Literal, final

import attrs

from .._errors import (
    InvalidArgument,
    StorageError,
    TransactionNotFound,
)
from .._limits import DEFAULT_ISOLATION, Isolation, check_isolation
from . import _plans as plan_tables
from ._log_rows import LogStore, Lost
from ._owners import OPEN_HERE
from ._protocol import (
    MAX_INT64,
    MAX_STEP,
    check_int,
    check_key,
    check_tx_id,
    check_value,
)
from ._sqlite_file import (
    DELETE_LOG_ROW,
    DELETE_LOG_WRITES_FROM,
    DELETE_UNDO,
    INSERT_LOG,
    INSERT_TX,
    INSERT_UNDO,
    INSERT_UNDO_FENCED,
    RELEASE_OWNER,
    SELECT_COMMITTED,
    SELECT_OWNER,
    UPDATE_OWNER,
    UPDATE_RECORD,
    UPDATE_RECORD_FENCED,
    WRITE,
    StoreFile,
    check_undo,
)
from ._sqlite_mirror import Row, TxMirror, read_transaction, steps_text
from ._sqlite_tables import SharedTables

if TYPE_CHECKING:
    from ._approvals import RequestStore
    from ._contracts import HistoryStore, PlanStore
    from ._durable import (
        DurableStore,
        TxImage,
        UndoRow,
    )
    from ._plans import PlanImage

__all__ = ["SQLiteStore"]

#: Durable writes of at most this many events, and nothing else, are one fenced statement.
_MULTI_ROWS: Final = 16
#: Replaced `PROGRESS` events are deleted once there are this many.
_STALE_PROGRESS: Final = 32
#: The history beyond the retention is pruned when the store opens, and then at every this
#: many transactions it ends, in the write that ends the last of them.
_PRUNE_EVERY: Final = 64
#: The default retention of ended transactions: how many, and for how long (seconds).
KEEP_HISTORY: Final = 1000
KEEP_HISTORY_FOR: Final = 7 * 24 * 3600.0


@final
@attrs.define(eq=False, repr=False, init=False)
class SQLiteStore(SharedTables, LogStore):
    """A `DurableStore` in one SQLite file (WAL mode), shared by threads and by processes
    (or, `exclusive`, held by one store).

    ``SQLiteStore(path, *, durability="normal", busy_timeout=5.0, readonly=False,
    exclusive=False, keep_history=1000, keep_history_for=7 * 24 * 3600.0)`` opens or creates
    the file; `durability` is `synchronous=NORMAL` (a commit
    survives a crash of the process, and may be lost to a power failure) or `"full"`
    (`synchronous=FULL`: an fsync per durable write). `busy_timeout` is how long, in seconds, a
    write waits for another process's write before it raises `StorageError`. Close the store
    with `close()`, or use it as a context manager. A file that is not SQLite, a SQLite file
    that is not an agenttx store, or a store with a newer schema than this code knows raises
    `StorageError` here; an older schema is migrated.

    **The file** must stay where it is while the store is open. Opened writable, the store
    checks at once that SQLite can write it (SQLite opens a file it may not write read-only,
    silently), and raises `StorageError` if not. Before each write to the file it checks, with
    one `stat` (about 2 us), that the path still names the file it opened: if the file was
    deleted, renamed away or replaced (another file moved over it), the write would reach a
    file no one else opens and be lost with this store, so it raises `StorageError` instead,
    changing nothing; moving the same file back makes the store work again. A `path` that is
    not a file name (not text, empty, or with a NUL character) raises `InvalidArgument`.

    **History.** A transaction that ends (`commit`, `discard`) is kept as history: its record,
    its live step records at the end, the `history` text its caller gave and the time it
    ended, in the very SQLite transaction that ends it: no write of its own, so no crash can
    end a transaction without its history. `ended_transactions` lists them, the last to end
    first, and `peek_ended` reads one back; `agenttx inspect` shows them. An ended transaction
    is not open: `open_transactions`, `owner`, `load`, `claim` and `peek` ignore it, and
    `begin` of its id begins anew; the new transaction's end replaces the history of the
    earlier one, which stays until then (deleting it at `begin` would cost every `begin` a
    lookup). The retention keeps the last `keep_history` ended transactions (an `int` >= 0)
    that ended less than `keep_history_for` seconds ago (a number >= 0), in the order they
    ended: one goes with every one that ended before it, so another process's slow clock may
    delay it. `None` lifts either limit, and 0 keeps none (an end then keeps nothing). The
    history beyond it is deleted when the store opens (unless read-only), and then once every
    64 ends, in the write that ends the last of them: so up to 63 more may be kept meanwhile,
    and each store prunes by its own count. The same limits, applied to the ended plan runs
    by their last change, prune the runs' audit events (`plan_audit`; the runs stay).

    **Read-only** (``readonly=True``), for inspecting a store, even one that other processes
    are using: the file is opened with SQLite's `mode=ro` and is never created, migrated or
    written (as for any reader, SQLite may create the `-wal` and `-shm` side files and use the
    `-shm` index), and `durability` does not apply. A missing file, an empty or foreign one, and a
    schema version other than this code's raise `StorageError`. The reads work:
    `read_committed`, `committed_version`, `committed_keys`, `open_transactions`, `owner`,
    `peek`, `pending_effects`, `ended_transactions`, `peek_ended`, and `is_open` (always
    false). Every other call raises
    `StorageError` ("the store is read-only") before it touches the file, once its arguments
    are checked: those that change the file, and the `Store` calls on a transaction, since a
    read-only store can hold none.

    **Exclusive** (``exclusive=True``), for a file that only this store uses: SQLite's
    `locking_mode=EXCLUSIVE`. The store takes the file's lock when it opens and keeps it until
    `close` (or until the process ends, however it ends), so each SQLite transaction skips the
    file-lock system calls and the shared-memory index, which makes a durable write about 5 us
    cheaper; durability and every other behaviour are unchanged. Any other connection, in this
    process or another, read-only ones included, waits `busy_timeout` for the lock and then
    raises `StorageError`. Use it when one process runs the engine (as with RocksDB, which
    locks its directory); keep the default to share the file between processes, or to inspect
    it with `agenttx inspect` while it runs. It cannot be combined with `readonly=True`.

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
    whichever store holds the transaction, except when this store held it and another has
    taken it over since: then they raise `StorageError` (taken over) and delete nothing. `claim`
    takes a transaction over only if its owner is still the one given (a compare-and-set) and is
    not a store open in this process: recovery uses it, so that two recoverers never both take
    one transaction.

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
    _readonly: bool
    _exclusive: bool
    _lock: threading.Lock
    _file: StoreFile
    _conn: sqlite3.Connection
    _cur: sqlite3.Cursor
    _owner: str
    _closed: bool
    _txs: dict[str, TxMirror]
    _lost: Lost
    _commits: int
    _keep_history: int | None
    _keep_history_for: float | None
    _keeps_history: bool
    #: Transactions ended here since the last prune.
    _ends: int

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Literal["normal", "full"] = "normal",
        busy_timeout: float = 5.0,
        readonly: bool = False,
        exclusive: bool = False,
        keep_history: int | None = KEEP_HISTORY,
        keep_history_for: float | None = KEEP_HISTORY_FOR,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidArgument(f"path must be a str or os.PathLike, not {type(path).__name__}")
        text = os.fspath(path)
        if not isinstance(text, str):
            raise InvalidArgument(f"path must name a file as text, not {type(text).__name__}")
        if not text or "\0" in text:
            raise InvalidArgument(f"path must be a file name without NUL characters, got {text!r}")
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
        if not isinstance(readonly, bool):
            raise InvalidArgument(f"readonly must be True or False, got {readonly!r}")
        if not isinstance(exclusive, bool):
            raise InvalidArgument(f"exclusive must be True or False, got {exclusive!r}")
        if readonly and exclusive:
            raise InvalidArgument(
                "readonly=True and exclusive=True cannot be combined: a read-only store must "
                "not lock out the process that writes the file"
            )
        if keep_history is not None:
            check_int(keep_history, "keep_history", MAX_INT64)
        if keep_history_for is not None and (
            isinstance(keep_history_for, bool)
            or not isinstance(keep_history_for, (int, float))
            or not 0 <= keep_history_for < math.inf
        ):
            raise InvalidArgument(
                "keep_history_for must be a finite number of seconds >= 0, or None, got "
                f"{keep_history_for!r}"
            )
        self._keep_history = keep_history
        self._keep_history_for = None if keep_history_for is None else float(keep_history_for)
        self._keeps_history = keep_history != 0 and keep_history_for != 0
        self._ends = 0
        self._path = text
        self._readonly = readonly
        self._exclusive = exclusive
        self._lock = threading.Lock()
        self._owner = json.dumps(
            {"hostname": socket.gethostname(), "pid": os.getpid(), "token": secrets.token_hex(8)},
            separators=(",", ":"),
        )
        self._closed = False
        self._txs = {}
        self._lost = Lost()
        self._commits = 0
        self._file = StoreFile(
            self._path,
            durability=durability,
            busy_timeout=float(busy_timeout),
            readonly=readonly,
            exclusive=exclusive,
        )
        self._conn = self._file.conn
        self._cur = self._file.cur
        if not readonly:
            self._prune_at_open()
            OPEN_HERE.add(self._owner)
            weakref.finalize(self, OPEN_HERE.discard, self._owner)

    def _prune_at_open(self) -> None:
        """Delete the history beyond the retention (opening a writable store already waits
        for the write lock, to set up the schema)."""
        try:
            with self._file.writing("prune the history"):
                self._file.prune(self._keep_history, self._keep_history_for, time.time())
        except BaseException:
            self._file.close()
            raise

    # ------------------------------------------------------------ the store itself

    @property
    def path(self) -> str:
        """The database file's path, as given."""
        return self._path

    @property
    def readonly(self) -> bool:
        """Whether the store was opened with `readonly=True`."""
        return self._readonly

    @property
    def keep_history(self) -> int | None:
        """How many ended transactions the store keeps as history (`None`: no limit)."""
        return self._keep_history

    @property
    def keep_history_for(self) -> float | None:
        """How long, in seconds, the store keeps an ended transaction (`None`: no limit)."""
        return self._keep_history_for

    @property
    def exclusive(self) -> bool:
        """Whether the store was opened with `exclusive=True` (it holds the file's lock)."""
        return self._exclusive

    def close(self) -> None:
        """Close the connection; idempotent. Buffered writes not yet written are dropped
        (call `flush` first to keep them); the transactions stay in the file for `load`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._txs.clear()
            OPEN_HERE.discard(self._owner)
            self._file.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._txs)} open transactions held here"
        return f"<SQLiteStore {self._path!r}: {state}>"

    # ------------------------------------------------------------ lifecycle

    def begin(
        self,
        tx_id: str,
        *,
        isolation: Isolation = DEFAULT_ISOLATION,
        record: str = "null",
    ) -> None:
        """Open transaction `tx_id` and take its snapshot 0 (see `Store.begin`).

        Writes the transaction's row (owned by this store, with its `record` and isolation) at
        once. Raises `InvalidArgument` if this store holds the transaction, or the file has it
        open (in another store, or kept by `discard_state` for recovery). An ended transaction
        of that id is no obstacle: its history stays until this one ends and replaces it.
        """
        check_tx_id(tx_id)
        check_isolation(isolation)
        check_value(record)
        self._check_writable()
        with self._lock:
            if tx_id in self._txs:
                raise InvalidArgument(
                    f"transaction `{tx_id}` is already open: commit or discard it first"
                )
            self._check_not_closed()
            inserted = self._file.write(
                INSERT_TX, (tx_id, record, self._owner, isolation), f"begin transaction `{tx_id}`"
            )
            if inserted != 1:
                raise InvalidArgument(
                    f"transaction `{tx_id}` is already open in another store on `{self._path}` "
                    "(or kept there for recovery): load and end it, or use another id"
                )
            self._txs[tx_id] = TxMirror.begun(isolation)
            self._lost.forget(tx_id)

    def commit(self, tx_id: str, *, history: str | None = None) -> int:
        """Validate and publish the overlay in one SQLite transaction (see `Store.commit`).

        Also moves the staged effects to the outbox, in staging order, deletes the undo
        records and ends the transaction, keeping it with `history` (see "History").
        """
        if history is not None:
            check_value(history)
        with self._lock:
            tx = self._open(tx_id)
            overlay = tx.overlay
            with self._file.writing(f"commit transaction `{tx_id}`"):
                self._fence(tx_id)
                if not self._reads_current(tx):
                    self._validate(tx)
                self._file.publish(tx_id, overlay, tx.effects)
                self._end(tx_id, history, tx)
            del self._txs[tx_id]
            self._commits += 1
        return len(overlay)

    def _end(self, tx_id: str, history: str | None, tx: TxMirror | None) -> bool:
        """Inside a write transaction: end open transaction `tx_id` (its mirror `tx`, if this
        store holds it), kept as history if the retention keeps any, and prune the history if
        this is the `_PRUNE_EVERY`th end here. False if it was not open."""
        steps = None
        if self._keeps_history:
            if tx is None:  # held elsewhere, or by no one: its live steps are in its log
                try:
                    _image, tx = read_transaction(self._cur, tx_id, path=self._path)
                except TransactionNotFound:
                    return False
                except StorageError:  # a log that cannot be replayed must not stop its end
                    tx = TxMirror()
            steps = steps_text(tx.steps)
        now = time.time()
        if not self._file.end_transaction(tx_id, history, steps, now):
            return False
        self._ends += 1
        if self._ends >= _PRUNE_EVERY and self._keeps_history:
            self._file.prune(self._keep_history, self._keep_history_for, now)
            self._ends = 0
        return True

    def _reads_current(self, tx: TxMirror) -> bool:
        """Whether every committed version `tx` read is known to be current without asking the
        file: on an exclusive store, the only one that commits to it, when it has committed
        nothing since the transaction first read the committed state (in this store)."""
        return self._exclusive and not tx.replayed and tx.first_read in {None, self._commits}

    def _validate(self, tx: TxMirror) -> None:
        """Inside the commit's write transaction: raise `WriteConflict` for the smallest key of
        the overlay committed since its base version, then `ReadConflict` likewise for the
        keys a serializable transaction read."""
        keys = tx.checked_keys()
        current = self._file.committed_versions(keys) if keys else {}
        tx.validate(lambda key: current.get(key, 0))

    def discard(self, tx_id: str, *, history: str | None = None) -> None:
        """End the transaction and delete its undo records, whichever store holds it, keeping
        it as history with `history` (or the one `discard_state` kept; see "History"); a no-op
        if there is no such open transaction (see `DurableStore.discard`)."""
        self._discard(tx_id, history, keep_record=False)

    def discard_state(self, tx_id: str, *, history: str | None = None) -> None:
        """End the transaction's state but keep its record and undo records, and `history`
        (unless `None`) for when it ends, whichever store holds it; a no-op if there is no such
        open transaction (see `DurableStore.discard_state`)."""
        self._discard(tx_id, history, keep_record=True)

    def _discard(self, tx_id: str, history: str | None, *, keep_record: bool) -> None:
        if history is not None:
            check_value(history)
        self._check_writable()
        try:
            check_tx_id(tx_id)
        except InvalidArgument:
            return  # no transaction can have this id
        doing = f"discard transaction `{tx_id}`"
        with self._lock:
            self._check_not_closed()
            lost = self._lost.error(tx_id)
            if lost is not None:  # lost to another store: end nothing of its new owner's
                raise lost
            with self._file.writing(doing):
                if tx_id in self._txs:
                    # Held here: unless this store still owns it, end nothing (see "Ownership").
                    self._fence(tx_id)
                if keep_record:
                    self._file.release_transaction(tx_id, history)
                else:
                    self._end(tx_id, history, self._txs.get(tx_id))
            self._txs.pop(tx_id, None)

    # ------------------------------------------------------------ committed state

    def committed_keys(
        self, prefix: str = "", limit: int = 1000
    ) -> tuple[tuple[str, int, str], ...]:
        """Up to `limit` committed `(key, version, value)` rows whose key starts with `prefix`,
        sorted by key (by code point), for inspection. One indexed range query."""
        if not isinstance(prefix, str) or prefix:
            check_key(prefix)
        check_int(limit, "limit", MAX_INT64, minimum=1)
        with self._lock:
            self._check_not_closed()
            return tuple(self._file.committed_keys(prefix, limit))

    # ------------------------------------------------------------ durable records

    def record_transaction(self, tx_id: str, record: str) -> None:
        """Replace the transaction's record (JSON text), durably, with the buffered writes."""
        check_value(record)
        statement = (UPDATE_RECORD, (record, tx_id))
        fenced = (UPDATE_RECORD_FENCED, (record, tx_id, self._owner))
        self._durable_write(tx_id, "record transaction", statement, fenced=fenced)

    def record_undo(self, tx_id: str, undo: UndoRow) -> None:
        """Store an undo record durably, with the buffered writes, replacing one in the same
        place `(step_id, seq)`."""
        undo = check_undo(undo)
        values = (tx_id, undo.step_id, undo.seq, undo.record)
        statement = (INSERT_UNDO, values)
        fenced = (INSERT_UNDO_FENCED, (*values, tx_id, self._owner))
        self._durable_write(tx_id, "record an undo", statement, fenced=fenced)

    def forget_undo(self, tx_id: str, step_id: int, seq: int) -> None:
        """Delete an undo record, with the buffered writes; idempotent."""
        check_int(step_id, "step_id", MAX_STEP)
        check_int(seq, "seq", MAX_INT64)
        statement = (DELETE_UNDO, (tx_id, step_id, seq))
        self._durable_write(tx_id, "forget an undo", statement)

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
                if self._exclusive and statement is not None:
                    fenced = statement  # no other store can have taken the transaction over
                doing = f"{doing} for transaction `{tx_id}`"
                if self._file.write(*fenced, doing) != 1:
                    try:
                        self._fence(tx_id)  # raises: the transaction is not this store's
                    except sqlite3.Error as exc:
                        raise self._file.failure(doing, exc) from exc
                return
            self._write_pending(
                tx_id, tx, rows, upto, doing=doing, statement=statement, progress=progress
            )

    def _rewrite_log(self, tx_id: str, rows: list[Row], since: int | None, doing: str) -> None:
        """In one SQLite transaction, if this store still owns the transaction: delete the
        `WRITE` events from seq `since` on (unless `None`), append `rows` (`LogStore`'s hook,
        for `restore`)."""
        with self._file.writing(doing) as cur:
            self._fence(tx_id)
            if since is not None:
                cur.execute(DELETE_LOG_WRITES_FROM, (tx_id, since, WRITE))
            cur.executemany(INSERT_LOG, rows)

    def _write_rows(
        self,
        tx_id: str,
        tx: TxMirror,
        rows: list[Row],
        upto: int,
        *,
        doing: str,
        statement: tuple[str, tuple[object, ...]] | None = None,
    ) -> None:
        """Append `rows` (journal entries `[flushed, upto)` first) and run `statement`, in one
        SQLite transaction, if this store still owns the transaction; then account for them.

        A few rows and nothing else go in one statement (`_append_log`); otherwise
        `BEGIN IMMEDIATE`, the owner check, the rows, the deletion of the replaced `PROGRESS`
        events once there are `_STALE_PROGRESS` of them, `statement`, `COMMIT`.
        """
        stale = tx.stale_progress if len(tx.stale_progress) >= _STALE_PROGRESS else None
        if statement is None and stale is None and 0 < len(rows) <= _MULTI_ROWS:
            self._append_log(tx_id, rows, doing)
        else:
            doing = f"{doing} for transaction `{tx_id}`"
            with self._file.writing(doing) as cur:
                self._fence(tx_id)
                if rows:
                    cur.executemany(INSERT_LOG, rows)
                if stale is not None:
                    cur.executemany(DELETE_LOG_ROW, [(tx_id, seq) for seq in stale])
                if statement is not None:
                    cur.execute(*statement)
            if stale is not None:
                tx.stale_progress = []
        tx.persisted(len(rows), upto)

    def _append_log(self, tx_id: str, rows: list[Row], doing: str) -> None:
        """Append `rows` to the log in one statement, hence one implicit SQLite transaction,
        if this store owns `tx_id`; else change nothing and raise as `_fence` does.

        An implicit transaction is as safe as `BEGIN IMMEDIATE` here: SQLite takes the write
        lock for it at once, and retries with the busy handler while it has read nothing. The
        owner check is built into the statement, except on an exclusive store: no other store
        can open the file, so none can have taken the transaction over.
        """
        try:
            fence = None if self._exclusive else (tx_id, self._owner)
            if self._file.insert_log(rows, fence, f"{doing} for transaction `{tx_id}`") != len(
                rows
            ):
                self._fence(tx_id)  # raises: the transaction is not this store's any more
                raise StorageError(  # pragma: no cover - unreachable: the owner check failed
                    f"could not {doing} for transaction `{tx_id}`: the log refused the events"
                )
        except sqlite3.Error as exc:
            raise self._file.failure(f"{doing} for transaction `{tx_id}`", exc) from exc

    # ------------------------------------------------------------ recovery

    def open_transactions(self) -> tuple[str, ...]:
        """The ids of every transaction with a row in the file, any process's, sorted."""
        with self._lock:
            self._check_not_closed()
            return self._file.open_transactions()

    def owner(self, tx_id: str) -> str | None:
        """The owner of transaction `tx_id` in the file (JSON text: `hostname`, `pid` and this
        store instance's `token`), without taking it over. `TransactionNotFound` if none."""
        check_tx_id(tx_id)
        with self._lock:
            self._check_not_closed()
            return self._file.owner(tx_id)

    def load(self, tx_id: str) -> TxImage:
        """Read transaction `tx_id` back and hold it here (see `DurableStore.load`).

        Replays its log into a new mirror, writes this store as its owner, and returns its
        image with the previous owner. If this store already holds it, its buffered writes are
        written first (and the mirror rebuilt, the same); if `discard_state` ended its state,
        it starts again as `begin` leaves it. Raises `TransactionNotFound` if the file has no
        row for it.
        """
        check_tx_id(tx_id)
        self._check_writable()
        doing = f"load transaction `{tx_id}`"
        with self._lock:
            self._check_not_closed()
            held = self._txs.get(tx_id)
            with self._file.writing(doing) as cur:
                if held is not None:
                    rows = cur.execute(SELECT_OWNER, (tx_id,)).fetchall()
                    if rows and rows[0][0] == self._owner:
                        cur.executemany(INSERT_LOG, held.pending(tx_id, len(held.journal)))
                image, tx = read_transaction(cur, tx_id, path=self._path)
                cur.execute(UPDATE_OWNER, (self._owner, tx_id))
            self._txs[tx_id] = tx
            self._lost.forget(tx_id)
        return image

    def claim(self, tx_id: str, owner: str | None) -> TxImage | None:
        """Take transaction `tx_id` over for recovery if its owner is still `owner`, in one
        SQLite write transaction (see `DurableStore.claim`): `None` if it is not, or if
        `owner` is a `SQLiteStore` open in this process. `TransactionNotFound` if the file
        has no row for it."""
        check_tx_id(tx_id)
        if owner is not None:
            check_value(owner)
        self._check_writable()
        doing = f"claim transaction `{tx_id}`"
        with self._lock:
            self._check_not_closed()
            if owner in OPEN_HERE:
                return None
            with self._file.writing(doing) as cur:
                rows = cur.execute(SELECT_OWNER, (tx_id,)).fetchall()
                if not rows:
                    raise TransactionNotFound(tx_id=tx_id)
                if rows[0][0] != owner:
                    return None  # taken since the caller read the owner
                image, tx = read_transaction(cur, tx_id, path=self._path)
                cur.execute(UPDATE_OWNER, (self._owner, tx_id))
            self._txs[tx_id] = tx
            self._lost.forget(tx_id)
        return image

    def peek(self, tx_id: str) -> TxImage:
        """Transaction `tx_id` as the file holds it, taking nothing over (see
        `DurableStore.peek`): the image `load` would return, and no change anywhere.

        Any process's transaction, on a writable or read-only store. For a transaction this
        store holds, the image is its last durable write: its buffered writes are not written.
        The rows are read in one SQLite read transaction, which waits for no writer. Raises
        `TransactionNotFound` if the file has no row for it.
        """
        check_tx_id(tx_id)
        with self._lock:
            self._check_not_closed()
            with self._file.reading(f"peek at transaction `{tx_id}`") as cur:
                image, _mirror = read_transaction(cur, tx_id, path=self._path)
        return image

    # ------------------------------------------------------------ plan runs

    def claim_plan(self, run_id: str, owner: str | None) -> PlanImage | None:
        """Take RUNNING run `run_id` over if its owner is still `owner` and is not a store
        open in this process (a compare-and-set, for recovery): its image, or None."""
        check_tx_id(run_id)
        self._check_writable()
        if owner in OPEN_HERE:
            return None
        with self._lock:
            self._check_not_closed()
            with self._file.writing(f"claim plan run `{run_id}`") as cur:
                if not plan_tables.claim_plan(cur, run_id, owner, self._owner):
                    return None
                return plan_tables.read_plan(cur, run_id)

    # ------------------------------------------------------------ helpers

    def _not_open(self, tx_id: str) -> Exception:
        """The error for a transaction this store does not hold (a closed store holds none)."""
        if self._closed:
            return self._closed_error()
        if self._readonly:
            return self._readonly_error()
        return self._lost.error(tx_id) or TransactionNotFound(tx_id=tx_id)

    def _check_writable(self) -> None:  # no lock needed: `_readonly` never changes
        if self._readonly:
            raise self._readonly_error()

    def _readonly_error(self) -> StorageError:
        return StorageError(f"the store is read-only: `{self._path}` was opened with readonly=True")

    def _check_not_closed(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _closed_error(self) -> StorageError:
        return StorageError(f"the SQLiteStore for `{self._path}` is closed")

    def _committed_row(self, key: str) -> tuple[int, str] | None:
        """The committed (version, value) of `key`; the caller holds the lock."""
        try:
            rows = self._cur.execute(SELECT_COMMITTED, (key,)).fetchall()
        except sqlite3.Error as exc:
            raise self._file.failure("read the committed state", exc) from exc
        return rows[0] if rows else None

    def _first_read(self, tx: TxMirror, key: str) -> tuple[int, str] | None:
        """`_committed_row`, noting when `tx` first read committed state (`_reads_current`)."""
        row = self._committed_row(key)
        if tx.first_read is None:
            tx.first_read = self._commits
        return row

    def _released(self, tx_id: str) -> tuple[str, tuple[object, ...]]:
        """The statement that gives up this store's ownership of `tx_id` (`release`)."""
        return RELEASE_OWNER, (tx_id, self._owner)

    def _let_go(self, tx_id: str) -> None:
        self._txs.pop(tx_id, None)

    def _fence(self, tx_id: str) -> None:
        """Check, inside a write transaction, that this store still owns `tx_id`; else let it go
        and raise `StorageError` "lease lost", as every later call on it does (`Lost`)."""
        rows = self._cur.execute(SELECT_OWNER, (tx_id,)).fetchall()
        if rows and rows[0][0] == self._owner:
            return
        self._txs.pop(tx_id, None)
        what = f"taken over by another store (owner {rows[0][0]})" if rows else "ended by another"
        raise self._lost.add(tx_id, f"held here by owner {self._owner}", what)


if TYPE_CHECKING:

    def _conforms(store: SQLiteStore) -> tuple[DurableStore, RequestStore, PlanStore, HistoryStore]:
        return store, store, store, store  # mypy checks here that it satisfies each protocol
