"""`PostgresStore`: the `DurableStore` protocol on a PostgreSQL server shared by many workers.

The store is four modules: this one, the store, its transactions, leases and durable writes;
`_postgres_runs`, the plan runs and the outbox (the rows workers share and claim);
`_postgres_schema`, the tables, migrations and every SQL text; `_postgres_link`, the connections
(reconnecting after a failure), the errors and the thread that renews the leases. A transaction
it holds has the same in-process mirror as on `SQLiteStore` (`_sqlite_mirror.TxMirror`) and the
same `log` of events, assembled by the same base class (`_log_rows.LogStore`, with the overlay
calls) and replayed by the same code, so the two stores cannot drift apart on the contract's
rules; this module writes the events with its own SQL.

**Leases and fencing.** Each open transaction (and RUNNING plan run) has an owner, an epoch and
a lease expiry in its row. `begin`, `load`, `claim` (and `begin_plan`, `claim_plan`) give it a
new epoch from one sequence, so an epoch is never reused, not even by a later transaction of the
same id. A background thread per store renews the leases of what the store holds, every third
of the lease. Every write to a transaction's rows is conditioned on its epoch, read `FOR KEY
SHARE` in the same statement or transaction: zero rows means the lease was lost (another worker
took the transaction over, or ended it), and the store raises `StorageError` ("lease lost"),
lets the transaction go and remembers it (`Lost`): every later call on it, `discard` included,
raises the same, so a worker never ends what its new owner holds; it never retries. A takeover
locks the row `FOR UPDATE`, so it waits for a write in flight, and the write that comes after
it sees the new epoch. Recovery takes over (`claim`) only a transaction whose lease has
expired, with `FOR UPDATE SKIP LOCKED`; `check_lease`, before each tool, makes sure that none
can for half a lease.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Final, NoReturn, final

from .._errors import InvalidArgument, StorageError, TransactionNotFound
from .._limits import DEFAULT_ISOLATION, Isolation, check_isolation
from ._bell import ListeningBell
from ._durable import EndedTransaction, TxImage, UndoRow
from ._log_rows import LogStore, Lost
from ._postgres_link import Link, Renewer, check_schema_name
from ._postgres_runs import OUTBOX_HOLD, SharedRows, check_number, first_row
from ._postgres_schema import COMMIT_FENCE, LOG_ROWS_PREPARED, WRITE
from ._protocol import (
    MAX_INT64,
    MAX_STEP,
    check_int,
    check_key,
    check_tx_id,
    check_value,
)
from ._sqlite_file import check_undo
from ._sqlite_mirror import Row, TxMirror, ended_image, replay_image, steps_text

if TYPE_CHECKING:
    from collections.abc import Sequence

    import psycopg

    from ._approvals import RequestStore
    from ._contracts import ClaimingOutbox, HistoryStore, LeasedStore, PlanStore
    from ._durable import DurableStore

__all__ = ["PostgresStore"]

#: The SQLSTATE of a check of a commit that failed (division by zero: see `Hot`), and how many
#: times a commit whose versions failed the check but pass when read again is tried.
_CHECK_FAILED: Final = b"22012"
_COMMIT_ATTEMPTS: Final = 3
#: Replaced `PROGRESS` events are deleted once there are this many.
_STALE_PROGRESS: Final = 32
#: The history beyond the retention is pruned when the store opens, then every this many ends.
_PRUNE_EVERY: Final = 64
KEEP_HISTORY: Final = 1000
KEEP_HISTORY_FOR: Final = 7 * 24 * 3600.0


#: The parameter formats of the hot statements: text (0) or binary (1, for `bytea`).
_TEXT5: Final = (0, 0, 0, 0, 0)
_BINARY1: Final = (1,)


def _int(data: bytes) -> int:
    """A `bigint` column in binary format."""
    return int.from_bytes(data, "big", signed=True)


def _b(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _s(data: bytes | None) -> str | None:
    return None if data is None else bytes(data).decode()


@final
class PostgresStore(SharedRows, LogStore):
    """A `DurableStore` on a PostgreSQL server, for workers on many machines.

    ``PostgresStore(dsn_or_pool, *, schema="agenttx", lease_seconds=30.0,
    statement_timeout=None, connect_timeout=10.0, migrate=True, keep_history=1000,
    keep_history_for=7 * 24 * 3600.0, outbox_hold=60.0)`` connects to the server named by a
    libpq DSN (text), or takes connections from a `psycopg_pool.ConnectionPool` (two: one for
    the store's calls, one for its lease renewal; given back at `close`). Needs the extra: ``pip
    install 'agenttx[postgres]'``. With `migrate` (the default) it creates the `schema` or
    applies the missing migrations (see `migrate`); without, it requires the schema at this
    code's version. A schema newer than this code knows raises `StorageError`. Close it with
    `close()`, or use it as a context manager.

    **Behaviour** is `SQLiteStore`'s on every observable of the `Store` and `DurableStore`
    contracts: each transaction it holds has an in-process mirror, `put` and `delete` are
    buffered until the next durable write, and a step's durable write is one statement (one
    round trip). Commit is one PostgreSQL transaction, in two round trips: it takes the commit
    counter's row lock (so commits are serialized, first committer wins), checks the epoch,
    validates the versions for the transaction's isolation level (`WriteConflict`,
    `ReadConflict`), publishes, moves the effects to the outbox and keeps the history.

    **Leases.** `lease_seconds` (default 30) is how long a worker keeps what it holds without
    renewing; a thread of the store renews every third of it. Another worker's `claim` (recovery)
    takes a transaction or plan run over only once its lease has expired, with a new epoch;
    every later write of the previous holder changes nothing and raises `StorageError` ("lease
    lost"). `load` takes over at once, whatever the lease. A worker paused for longer than its
    lease (a debugger, SIGSTOP, a long GC) may lose its transactions: choose the lease longer
    than such pauses, and shorter than the delay of recovery you accept.

    **The outbox.** Dispatchers claim the entries they deliver (`claim_effects`, `FOR UPDATE
    SKIP LOCKED`), for `outbox_hold` seconds: dispatchers running at once on several workers
    deliver disjoint entries, each once. A dispatcher that dies holding a claim delays those
    entries by up to `outbox_hold`; one slower than `outbox_hold` may see another deliver them
    again (delivery is at least once, always with the idempotency key).

    **Errors.** A psycopg error becomes `StorageError` with it as `__cause__`; the PostgreSQL
    transaction is rolled back, so the call has no effect. A lost connection (server restart,
    network) is dropped and the next call connects again. `statement_timeout` (seconds) bounds
    every statement on the server.

    **Threads.** One connection, guarded by one lock held for the whole of every call, like
    `SQLiteStore`; run one store per process (or more, for more connections).
    """

    def __init__(
        self,
        dsn_or_pool: object,
        *,
        schema: str = "agenttx",
        lease_seconds: float = 30.0,
        statement_timeout: float | None = None,
        connect_timeout: float = 10.0,
        migrate: bool = True,
        keep_history: int | None = KEEP_HISTORY,
        keep_history_for: float | None = KEEP_HISTORY_FOR,
        outbox_hold: float = OUTBOX_HOLD,
    ) -> None:
        if not isinstance(dsn_or_pool, str) and not callable(getattr(dsn_or_pool, "getconn", None)):
            raise InvalidArgument(
                "dsn_or_pool must be a libpq connection string or a psycopg_pool.ConnectionPool, "
                f"not {type(dsn_or_pool).__name__}"
            )
        schema = check_schema_name(schema)
        check_number(lease_seconds, "lease_seconds", minimum=0.1)
        check_number(statement_timeout, "statement_timeout", minimum=0.001, allow_none=True)
        check_number(connect_timeout, "connect_timeout", minimum=0.1)
        if not isinstance(migrate, bool):
            raise InvalidArgument(f"migrate must be True or False, got {migrate!r}")
        if keep_history is not None:
            check_int(keep_history, "keep_history", MAX_INT64)
        check_number(keep_history_for, "keep_history_for", minimum=0, allow_none=True)
        check_number(outbox_hold, "outbox_hold", minimum=0.001)
        self._outbox_hold = float(outbox_hold)
        self._schema = schema
        self._lease = float(lease_seconds)
        self._keep_history = keep_history
        self._keep_history_for = None if keep_history_for is None else float(keep_history_for)
        self._keeps_history = keep_history != 0 and keep_history_for != 0
        self._ends = 0
        self._lock = threading.Lock()
        self._owner = json.dumps(
            {"hostname": socket.gethostname(), "pid": os.getpid(), "token": secrets.token_hex(8)},
            separators=(",", ":"),
        )
        self._closed = False
        self._txs: dict[str, TxMirror] = {}
        self._epochs: dict[str, int] = {}
        self._lost = Lost()
        self._plans: dict[str, int] = {}
        timeout = None if statement_timeout is None else float(statement_timeout)

        def link() -> Link:
            return Link(
                dsn_or_pool,
                schema=schema,
                connect_timeout=float(connect_timeout),
                statement_timeout=timeout,
            )

        self._link = link()
        self._sql = self._link.sql
        self._hot = self._sql.hot
        self._owner_bytes = self._owner.encode()
        self._lease_bytes = repr(self._lease).encode()
        self._renewer = Renewer(weakref.ref(self), link(), self._lease / 3)
        weakref.finalize(self, Renewer.stop, self._renewer)
        #: Rings as a request of the schema changes state (`decision_bell`), on its connection.
        self._bell = ListeningBell(link())
        weakref.finalize(self, ListeningBell.close, self._bell)
        weakref.finalize(self, self._link.drop)
        try:
            if migrate:
                self._link.migrate()
            else:
                self._link.check_version()
            self._prune(time.time())
            self._link.ready(f"prepare the statements of schema `{schema}`")
        except BaseException:
            self._link.drop()
            raise

    # ------------------------------------------------------------ the store itself

    @property
    def schema(self) -> str:
        """The PostgreSQL schema that holds the store's tables."""
        return self._schema

    @property
    def lease_seconds(self) -> float:
        """How long a lease lasts without renewal, in seconds."""
        return self._lease

    def migrate(self) -> int:
        """Create the schema, or apply the migrations it lacks, in order, each recorded in its
        `migrations` table, in one PostgreSQL transaction under an advisory lock (so workers
        starting together migrate once). Returns the schema version. Idempotent. `StorageError`
        if the schema is newer than this code knows. A new store does this itself unless
        opened with `migrate=False`."""
        with self._lock:
            self._check_not_closed()
            return self._link.migrate()

    def close(self) -> None:
        """Stop renewing leases and close the connections; idempotent. Buffered writes not yet
        written are dropped; the transactions and plan runs held stay in the database, their
        leases ended (best effort, one statement each), so that recovery may take them at once.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._expire_leases()
            self._txs.clear()
            self._epochs.clear()
            self._plans.clear()
            self._link.drop()
        self._renewer.stop()
        self._bell.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._txs)} open transactions held here"
        return f"<PostgresStore schema={self._schema!r}: {state}>"

    def owner_alive(self, owner: str | None) -> bool:
        """Whether recovery must leave alone a transaction or plan run of `owner`: never by
        itself on this store, where the lease decides (`claim` takes over only an expired one,
        whichever host holds it). Recovery calls this instead of its per-host process check."""
        del owner
        return False

    # ------------------------------------------------------------ lifecycle

    def begin(
        self,
        tx_id: str,
        *,
        isolation: Isolation = DEFAULT_ISOLATION,
        record: str = "null",
    ) -> None:
        """Open transaction `tx_id` (see `DurableStore.begin`): its row, with this store as
        owner, a new epoch and a lease, in one statement. `InvalidArgument` if this store or
        the database has it open."""
        check_tx_id(tx_id)
        check_isolation(isolation)
        check_value(record)
        doing = f"begin transaction `{tx_id}`"
        with self._lock:
            if tx_id in self._txs:
                raise InvalidArgument(
                    f"transaction `{tx_id}` is already open: commit or discard it first"
                )
            self._check_not_closed()
            params = (
                tx_id.encode(),
                record.encode(),
                self._owner_bytes,
                self._lease_bytes,
                isolation.encode(),
            )
            result = self._link.run(doing, self._hot.begin, params, _TEXT5)
            if not result.ntuples:
                raise InvalidArgument(
                    f"transaction `{tx_id}` is already open in another store on "
                    f"{self._link.where} (or kept there for recovery): load and end it, or use "
                    "another id"
                )
            self._hold(tx_id, TxMirror.begun(isolation), _int(result.get_value(0, 0)))

    def commit(self, tx_id: str, *, history: str | None = None) -> int:
        """Validate and publish the overlay in one PostgreSQL transaction (see the class
        docstring), move the effects to the outbox, end the transaction keeping its history.

        One round trip: every statement goes at once, in pipeline mode (`Hot.commit`), and
        the checks (the epoch, then the versions, under the commit lock) fail on the server,
        aborting the transaction before its COMMIT; the store then reads what failed."""
        if history is not None:
            check_value(history)
        doing = f"commit transaction `{tx_id}`"
        with self._lock:
            tx = self._open(tx_id)
            for _attempt in range(_COMMIT_ATTEMPTS):
                if self._try_commit(tx_id, tx, history, doing):
                    break
            else:
                raise StorageError(
                    f"could not {doing}: the versions it checks changed back and forth "
                    f"{_COMMIT_ATTEMPTS} times (a key deleted and written again): try again"
                )
            self._let_go(tx_id)
            self._ends += 1
            if self._ends >= _PRUNE_EVERY and self._keeps_history:
                self._ends = 0
                with contextlib.suppress(StorageError):  # retention is best effort
                    self._prune(time.time())
        return len(tx.overlay)

    def _try_commit(self, tx_id: str, tx: TxMirror, history: str | None, doing: str) -> bool:
        """One commit of `tx_id`: True if it committed; False if a version check failed on
        the server but the versions read now pass (try again); else it raises, as `commit`."""
        ended = (history, steps_text(tx.steps), time.time()) if self._keeps_history else None
        statements, writes, reads = self._hot.commit(tx_id, self._epochs[tx_id], tx, ended=ended)
        results = self._link.batch(doing, statements)
        link = self._link
        failed = next((n for n, r in enumerate(results) if not link.ok(r)), None)
        if failed is None:
            return True
        result = results[failed]
        link.rollback(doing)
        if link.sqlstate(result) == _CHECK_FAILED:
            if failed == COMMIT_FENCE:
                self._fence_failed(tx_id, doing)
            if failed in {writes, reads}:
                keys = [key.encode() for key in tx.checked_keys()]
                rows = self._all(doing, self._sql.select_versions, (keys,))
                current = {bytes(k).decode(): v for k, v in rows}
                tx.validate(lambda key: current.get(key, 0))
                return False
        error = link.error(result)
        raise link.failure(doing, error) from error

    def discard(self, tx_id: str, *, history: str | None = None) -> None:
        """End the transaction and delete its undo records, whichever store holds it, keeping
        it as history; a no-op if it is not open (see `DurableStore.discard`)."""
        self._discard(tx_id, history, keep_record=False)

    def discard_state(self, tx_id: str, *, history: str | None = None) -> None:
        """End the transaction's state, keep its record and undo records for recovery, release
        its lease (any recovery may claim it); a no-op if it is not open."""
        self._discard(tx_id, history, keep_record=True)

    def _discard(self, tx_id: str, history: str | None, *, keep_record: bool) -> None:
        if history is not None:
            check_value(history)
        try:
            check_tx_id(tx_id)
        except InvalidArgument:
            return
        sql = self._sql
        with self._lock:
            self._check_not_closed()
            lost = self._lost.error(tx_id)
            if lost is not None:  # lost to another store: end nothing of its new owner's
                raise lost
            with self._link.transaction(f"discard transaction `{tx_id}`") as cur:
                cur.execute(sql.select_tx_for_update, (tx_id,))
                row = cur.fetchone()
                held = self._epochs.get(tx_id)
                if held is not None and (row is None or row[3] != held):
                    raise self._lose(tx_id, None if row is None else (row[3], row[1]))
                if row is None:
                    return
                if keep_record:
                    cur.execute(sql.delete_log, (tx_id,))
                    cur.execute(sql.release_tx, (history, tx_id))
                else:
                    self._end(cur, tx_id, history, self._txs.get(tx_id))
            self._let_go(tx_id)

    def _end(
        self, cur: psycopg.Cursor[Any], tx_id: str, history: str | None, tx: TxMirror | None
    ) -> None:
        """Inside a transaction that holds the row: end `tx_id`, kept as history."""
        sql = self._sql
        now = time.time()
        if self._keeps_history:
            if tx is None:
                try:
                    tx = self._replay(cur, tx_id, None)[1]
                except StorageError:  # a log that cannot be replayed must not stop its end
                    tx = TxMirror()
            cur.execute(sql.insert_ended, (history, steps_text(tx.steps).encode(), now, tx_id))
        cur.execute(sql.delete_tx, (tx_id,))
        cur.execute(sql.delete_log, (tx_id,))
        cur.execute(sql.delete_undos, (tx_id,))
        self._ends += 1
        if self._ends >= _PRUNE_EVERY and self._keeps_history:
            self._prune_in(cur, now)
            self._ends = 0

    def _prune(self, now: float) -> None:
        with self._link.transaction("prune the history") as cur:
            self._prune_in(cur, now)

    def _prune_in(self, cur: psycopg.Cursor[Any], now: float) -> None:
        if self._keep_history is not None:
            cur.execute(self._sql.prune_beyond, (self._keep_history,))
        if self._keep_history_for is not None:
            cur.execute(self._sql.prune_before, (now - self._keep_history_for,))

    # ------------------------------------------------------------ committed state

    def committed_keys(
        self, prefix: str = "", limit: int = 1000
    ) -> tuple[tuple[str, int, str], ...]:
        """Up to `limit` committed `(key, version, value)` rows whose key starts with `prefix`,
        sorted by code point."""
        if not isinstance(prefix, str) or prefix:
            check_key(prefix)
        check_int(limit, "limit", MAX_INT64, minimum=1)
        encoded = prefix.encode()
        with self._lock:
            self._check_not_closed()
            rows = self._all(
                "read the committed state", self._sql.select_committed_from, (encoded, limit)
            )
        return tuple(
            (bytes(k).decode(), v, bytes(value).decode())
            for k, v, value in rows
            if bytes(k).startswith(encoded)
        )

    def _first_read(self, tx: TxMirror, key: str) -> tuple[int, str] | None:
        """`_committed_row`, for transaction `tx` (`LogStore`'s hook)."""
        del tx
        return self._committed_row(key)

    def _committed_row(self, key: str) -> tuple[int, str] | None:
        """The committed (version, value) of `key`: one prepared statement."""
        result = self._link.run(
            "read the committed state", self._hot.committed, (key.encode(),), _BINARY1
        )
        if not result.ntuples:
            return None
        return _int(result.get_value(0, 0)), result.get_value(0, 1).decode()

    # ------------------------------------------------------------ durable records

    def record_transaction(self, tx_id: str, record: str) -> None:
        """Replace the transaction's record (JSON text), durably, with the buffered writes."""
        check_value(record)
        self._durable_write(
            tx_id, "record transaction", (self._sql.update_record, (record, tx_id, None))
        )

    def record_undo(self, tx_id: str, undo: UndoRow) -> None:
        """Store an undo record durably, with the buffered writes (replacing one in its place)."""
        undo = check_undo(undo)
        statement = (self._sql.insert_undo, (tx_id, undo.step_id, undo.seq, undo.record))
        self._durable_write(tx_id, "record an undo", statement)

    def forget_undo(self, tx_id: str, step_id: int, seq: int) -> None:
        """Delete an undo record, with the buffered writes; idempotent."""
        check_int(step_id, "step_id", MAX_STEP)
        check_int(seq, "seq", MAX_INT64)
        self._durable_write(tx_id, "forget an undo", (self._sql.delete_undo, (tx_id, step_id, seq)))

    def _durable_write(
        self,
        tx_id: str,
        doing: str,
        statement: tuple[str, tuple[object, ...]] | None,
        progress: str | None = None,
    ) -> None:
        with self._lock:
            tx = self._open(tx_id)
            upto = len(tx.journal)
            rows = tx.pending(tx_id, upto)
            self._write_pending(
                tx_id, tx, rows, upto, doing=doing, statement=statement, progress=progress
            )

    def _rewrite_log(self, tx_id: str, rows: list[Row], since: int | None, doing: str) -> None:
        """In one fenced PostgreSQL transaction: delete the `WRITE` events from seq `since` on
        (unless `None`), append `rows` (`LogStore`'s hook, for `restore`)."""
        with self._link.transaction(doing) as cur:
            self._fence(cur, tx_id)
            if since is not None:
                cur.execute(self._sql.delete_log_writes_from, (tx_id, since, WRITE))
            self._insert(cur, tx_id, rows)

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
        """Append `rows` and run `statement`, fenced by the transaction's epoch: one statement
        if there is nothing else to do, else one PostgreSQL transaction. Then account for them.
        """
        stale = tx.stale_progress if len(tx.stale_progress) >= _STALE_PROGRESS else None
        doing = f"{doing} for transaction `{tx_id}`"
        if statement is None and stale is None and len(rows) <= LOG_ROWS_PREPARED:
            if rows:
                name, params, formats = self._hot.append(tx_id, self._epochs[tx_id], rows)
                result = self._link.run(doing, name, params, formats)
                if result.command_tuples != len(rows):
                    self._fence_failed(tx_id, doing)
        else:
            with self._link.transaction(doing) as cur:
                self._fence(cur, tx_id)
                if rows:
                    self._insert(cur, tx_id, rows)
                if stale is not None:
                    cur.execute(self._sql.delete_log_rows, (tx_id, stale))
                if statement is not None:
                    sql, values = statement
                    if sql is self._sql.update_record:  # fenced by the row's epoch as well
                        values = (*values[:2], self._epochs[tx_id])
                    cur.execute(sql, values)
            if stale is not None:
                tx.stale_progress = []
        tx.persisted(len(rows), upto)

    def _insert(self, cur: psycopg.Cursor[Any], tx_id: str, rows: Sequence[Row]) -> None:
        """Inside a fenced transaction: append `rows` to the log in one statement. psycopg
        errors escape."""
        cur.execute(
            self._sql.insert_log,
            (
                tx_id,
                [row[1] for row in rows],
                [row[2] for row in rows],
                [row[3] for row in rows],
                [row[4] for row in rows],
                [_b(row[5]) for row in rows],
                [_b(row[6]) for row in rows],
                [_b(row[7]) for row in rows],
            ),
        )

    # ------------------------------------------------------------ recovery

    def open_transactions(self) -> tuple[str, ...]:
        """The ids of every open transaction in the database, any worker's, sorted."""
        with self._lock:
            self._check_not_closed()
            rows = self._all("list the open transactions", self._sql.select_tx_ids, ())
        return tuple(row[0] for row in rows)

    def owner(self, tx_id: str) -> str | None:
        """The owner of transaction `tx_id` (JSON text: `hostname`, `pid`, `token`), without
        taking it over. `TransactionNotFound` if the database has none."""
        check_tx_id(tx_id)
        with self._lock:
            self._check_not_closed()
            row = self._one(
                f"read the owner of transaction `{tx_id}`", self._sql.select_owner, (tx_id,)
            )
        if row is None:
            raise TransactionNotFound(tx_id=tx_id)
        owner: str | None = row[0]
        return owner

    def load(self, tx_id: str) -> TxImage:
        """Read transaction `tx_id` back and take it over at once, whatever its lease (see
        `DurableStore.load`): a new epoch fences its previous holder."""
        check_tx_id(tx_id)
        doing = f"load transaction `{tx_id}`"
        with self._lock:
            self._check_not_closed()
            held = self._txs.get(tx_id)
            with self._link.transaction(doing) as cur:
                cur.execute(self._sql.select_tx_for_update, (tx_id,))
                row = cur.fetchone()
                if row is None:
                    raise TransactionNotFound(tx_id=tx_id)
                if held is not None and row[3] == self._epochs.get(tx_id):
                    pending = held.pending(tx_id, len(held.journal))
                    if pending:
                        self._insert(cur, tx_id, pending)
                image, tx = self._replay(cur, tx_id, row)
                cur.execute(self._sql.take_tx, (self._owner, self._lease, tx_id))
                epoch = first_row(cur)[0]
            self._hold(tx_id, tx, epoch)
        return image

    def claim(self, tx_id: str, owner: str | None) -> TxImage | None:
        """Take transaction `tx_id` over for recovery if its owner is still `owner` and its
        lease has expired (or it has none), atomically, skipping a row another worker holds
        locked: the image, or `None`. `TransactionNotFound` if the database has none."""
        check_tx_id(tx_id)
        if owner is not None:
            check_value(owner)
        doing = f"claim transaction `{tx_id}`"
        with self._lock:
            self._check_not_closed()
            with self._link.transaction(doing) as cur:
                cur.execute(self._sql.claim_tx, (tx_id, owner))
                row = cur.fetchone()
                if row is None:
                    cur.execute(self._sql.select_owner, (tx_id,))
                    if cur.fetchone() is None:
                        raise TransactionNotFound(tx_id=tx_id)
                    return None
                image, tx = self._replay(cur, tx_id, row)
                cur.execute(self._sql.take_tx, (self._owner, self._lease, tx_id))
                epoch = first_row(cur)[0]
            self._hold(tx_id, tx, epoch)
        return image

    def peek(self, tx_id: str) -> TxImage:
        """Transaction `tx_id` as the database holds it, taking nothing over, read in one
        REPEATABLE READ transaction. `TransactionNotFound` if there is none."""
        check_tx_id(tx_id)
        with self._lock:
            self._check_not_closed()
            with self._link.transaction(f"peek at transaction `{tx_id}`", snapshot=True) as cur:
                cur.execute(self._sql.select_tx, (tx_id,))
                row = cur.fetchone()
                if row is None:
                    raise TransactionNotFound(tx_id=tx_id)
                return self._replay(cur, tx_id, row)[0]

    def _replay(
        self, cur: psycopg.Cursor[Any], tx_id: str, row: tuple[Any, ...] | None
    ) -> tuple[TxImage, TxMirror]:
        """The image and a new mirror of `tx_id` from its rows (`row`: its `txs` row, read
        here if `None`). `TransactionNotFound` if there is none."""
        sql = self._sql
        if row is None:
            cur.execute(sql.select_tx, (tx_id,))
            row = cur.fetchone()
            if row is None:
                raise TransactionNotFound(tx_id=tx_id)
        record, owner, isolation = row[0], row[1], row[2]
        cur.execute(sql.select_log, (tx_id,))
        events = [
            (seq, kind, step, num, _s(name), _s(body), _s(extra))
            for seq, kind, step, num, name, body, extra in cur.fetchall()
        ]
        cur.execute(sql.select_undos, (tx_id,))
        return replay_image(
            tx_id,
            record=record,
            owner=owner,
            isolation=isolation,
            events=events,  # type: ignore[arg-type]
            undos=cur.fetchall(),
            path=self._link.where,
        )

    # ------------------------------------------------------------ history

    def ended_transactions(self, limit: int = 100) -> tuple[EndedTransaction, ...]:
        """Up to `limit` ended transactions kept as history, the last to end first."""
        check_int(limit, "limit", MAX_INT64, minimum=1)
        with self._lock:
            self._check_not_closed()
            rows = self._all("list the ended transactions", self._sql.select_ended_list, (limit,))
        return tuple(
            EndedTransaction(tx_id=row[0], record=row[1], history=row[2], ended_at=row[3])
            for row in rows
        )

    def peek_ended(self, tx_id: str) -> tuple[EndedTransaction, TxImage]:
        """Ended transaction `tx_id` kept as history: its row and its image as it ended.
        `TransactionNotFound` if none is kept."""
        check_tx_id(tx_id)
        with self._lock:
            self._check_not_closed()
            row = self._one(
                f"read the history of transaction `{tx_id}`", self._sql.select_ended_tx, (tx_id,)
            )
        if row is None:
            raise TransactionNotFound(tx_id=tx_id)
        record, history, steps, ended_at = row
        return ended_image(tx_id, (record, history, bytes(steps).decode(), ended_at))

    # ------------------------------------------------------------ leases

    def check_lease(self, tx_id: str) -> None:
        """Before a tool of transaction `tx_id` runs: `StorageError` (lease lost) unless this
        store still holds it at its epoch, with at least half of its lease left (renewed first
        if less is), in one statement that writes only to renew. So no recovery can take it
        over for half a lease after this returns (`load` can: it takes over at once).
        `TransactionNotFound` if this store does not hold it (and never lost it)."""
        doing = f"check the lease of transaction `{tx_id}`"
        with self._lock:
            self._open(tx_id)
            params = (tx_id.encode(), b"%d" % self._epochs[tx_id], self._lease_bytes)
            if not self._link.run(doing, self._hot.lease, params, (0, 0, 0)).ntuples:
                self._fence_failed(tx_id, doing)

    def _hold(self, tx_id: str, tx: TxMirror, epoch: int) -> None:
        """Hold `tx_id` at `epoch` here; its lease is renewed from now on."""
        self._txs[tx_id] = tx
        self._epochs[tx_id] = epoch
        self._lost.forget(tx_id)
        self._renewer.start()

    def _released(self, tx_id: str) -> tuple[str, tuple[object, ...]]:
        """The statement that ends `tx_id`'s lease and owner, with a new epoch (`release`)."""
        return self._sql.release_tx, (None, tx_id)

    def _let_go(self, tx_id: str) -> None:
        self._txs.pop(tx_id, None)
        self._epochs.pop(tx_id, None)

    def _expire_leases(self) -> None:
        """End the leases of what this store holds (at `close`); errors are ignored: the
        leases then run out by themselves."""
        sql = self._sql
        try:
            cur = self._link.cursor("end the leases")
            if self._epochs:
                cur.execute(sql.renew_txs, (0.0, list(self._epochs), list(self._epochs.values())))
            if self._plans:
                cur.execute(sql.renew_plans, (0.0, list(self._plans), list(self._plans.values())))
        except (StorageError, self._link.psycopg.Error):
            pass

    def _held(self) -> tuple[list[str], list[int], list[str], list[int]]:
        """What to renew: the transactions and plan runs held, with their epochs.

        Without the store's lock, on purpose: a call blocked on the server (a commit waiting
        for a lock) must not stop the renewal of everything else this store holds. Copying a
        dict is atomic in CPython, so each copy is one consistent state."""
        if self._closed:
            return [], [], [], []
        epochs, plans = dict(self._epochs), dict(self._plans)
        return list(epochs), list(epochs.values()), list(plans), list(plans.values())

    def _fence(self, cur: psycopg.Cursor[Any], tx_id: str) -> None:
        """Inside a transaction: lock `tx_id`'s row against a takeover (`FOR KEY SHARE`) if
        it still has this store's epoch; else let it go and raise (see `_fence_failed`)."""
        cur.execute(self._sql.fence, (tx_id, self._epochs[tx_id]))
        if cur.fetchone() is None:
            self._fence_failed(tx_id, None, cur)

    def _fence_failed(
        self, tx_id: str, doing: str | None, cur: psycopg.Cursor[Any] | None = None
    ) -> NoReturn:
        """A fenced write changed nothing: the transaction was taken over, or ended, by another
        store. Let it go and raise `StorageError` (lease lost), as later calls on it do."""
        try:
            if cur is None:
                cur = self._link.cursor(doing or "check the lease")
            cur.execute(self._sql.select_epoch, (tx_id,))
            row = cur.fetchone()
        except self._link.psycopg.Error as exc:
            raise self._link.failure(doing or "check the lease", exc) from exc
        raise self._lose(tx_id, row)

    def _lose(self, tx_id: str, now: tuple[int, str | None] | None) -> StorageError:
        """Let `tx_id` go, lost to another store (`now`: its epoch and owner, None if ended)."""
        held = f"held here at epoch {self._epochs.get(tx_id)}"
        self._let_go(tx_id)
        if now is None:
            return self._lost.add(tx_id, held, "ended by another store")
        what = f"taken over by another store (now at epoch {now[0]}, owner {now[1]})"
        return self._lost.add(tx_id, held, what)

    # ------------------------------------------------------------ helpers

    def _not_open(self, tx_id: str) -> Exception:
        if self._closed:
            return StorageError(f"the PostgresStore for schema `{self._schema}` is closed")
        return self._lost.error(tx_id) or TransactionNotFound(tx_id=tx_id)


if TYPE_CHECKING:

    def _conforms(
        store: PostgresStore,
    ) -> tuple[DurableStore, RequestStore, PlanStore, HistoryStore, ClaimingOutbox, LeasedStore]:
        return store, store, store, store, store, store  # mypy checks each protocol here
