"""The file behind `SQLiteStore`: its layout and migrations, and the connection that runs on it.

**Layout** (schema version 9; `PRAGMA application_id` marks the file as an agenttx store and
`PRAGMA user_version` holds the schema version, which `MIGRATIONS` brings up to date):

======== ===================================================================================
meta     one row: `commit_version`, the durable commit counter
committed `key -> (version, value)`: the committed map
txs      one row per open transaction with a durable record: `record` (JSON text, `"null"`
         if neither `begin` nor `record_transaction` gave one), `owner` (JSON: pid, hostname,
         per-store token), `isolation` (the level's name), `history` (the JSON text
         `discard_state` kept for its end, or NULL), `conversation` (`_conversations`)
log      the transaction's events, `(tx_id, seq)` -> an event (see below), seq from 0
undos    `(tx_id, step_id, seq) -> record`: the undo records, write-ahead of their effects
outbox   committed effects with their delivery history, in commit then staging order
ended    the ended transactions kept as history, in the order they ended (`seq`): `tx_id`,
         `record`, `isolation`, `history` (the JSON text given at the end, or NULL), `steps`
         (the live step records at the end, see `_sqlite_mirror.steps_text`) and `ended_at`
         (seconds since the epoch). Appended by the write that ends the transaction, at the
         end of the table, so it dirties only the last page or two. No index: one on `tx_id`
         would cost every commit a page at a random place (about 3% of the throughput), and
         the reads (`agenttx inspect`) scan from the newest row. An id can appear more than
         once (a transaction begun with the id of an ended one): its newest row is its history
plan_runs one row per plan run: `record`, `status`, `owner`, `cancel` (see `_plans`)
plan_nodes `(run_id, node_id) -> (state, attempt, record)`: each node of a plan run
plan_audit `(run_id, seq) -> event`: the audit events of a plan run (`Event.to_json` text)
requests approval requests and reviews: `id -> (kind, scope_id, state, digest, record,
         decision)` (see `_approvals`)
======== ===================================================================================

A transaction's `log` is the sequence of its calls that change durable state, as events:
`WRITE` (key, base version, value or NULL for a tombstone: a journal entry), `SNAPSHOT` (step,
journal position), `RESTORE` (step), `STEP` (step id, record, progress or NULL if unchanged, and
the position of snapshot `step` when it is the only one taken since the last durable write),
`EFFECT` (step id, channel, payload, idempotency key), `PROGRESS` (text) and `READ` (key,
version; not under read committed). `_sqlite_mirror.replay` turns them back into a transaction.

`StoreFile` is one open connection to such a file: it checks what the file is, migrates it (or,
read-only, refuses any schema but this code's), checks before each write that the path still
names that file, runs the store's SQLite transactions, turning `sqlite3` errors into
`StorageError`, and the queries and writes that need no transaction's mirror. Every SQL text
the store runs is here, as the constants below or in `StoreFile`'s methods. The checks at the
end keep values the columns cannot hold out of the file.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sqlite3
from typing import TYPE_CHECKING, Final, Literal, cast, final

import attrs

from .._errors import InvalidArgument, StorageError, TransactionNotFound
from ._approvals import REQUEST_TABLES
from ._conversations import CONVERSATION_COLUMN, CONVERSATION_LOG
from ._durable import EffectRow, EndedTransaction, OutboxEntry, UndoRow
from ._plans import (
    PLAN_AUDIT_TABLES,
    PLAN_HOLD_TABLES,
    PLAN_RATE_TABLES,
    PLAN_TABLES,
    PLAN_UNIT_TABLES,
    prune_audit,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

__all__ = [
    "APPLICATION_ID",
    "DELETE_LOG_ROW",
    "DELETE_LOG_WRITES_FROM",
    "DELETE_UNDO",
    "EFFECT",
    "INSERT_LOG",
    "INSERT_TX",
    "INSERT_UNDO",
    "INSERT_UNDO_FENCED",
    "IN_CHUNK",
    "MIGRATIONS",
    "PROGRESS",
    "READ",
    "RELEASE_OWNER",
    "RESTORE",
    "SCHEMA_VERSION",
    "SELECT_COMMITTED",
    "SELECT_ENDED_TX",
    "SELECT_LOG",
    "SELECT_OWNER",
    "SELECT_TX",
    "SELECT_UNDOS",
    "SNAPSHOT",
    "STEP",
    "UPDATE_OWNER",
    "UPDATE_RECORD",
    "UPDATE_RECORD_FENCED",
    "WRITE",
    "StoreFile",
    "check_effects",
    "check_undo",
    "is_busy",
]

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
    # 1 -> 2: a transaction's isolation level by name (three levels), instead of `serializable`
    # (two). Rows of version 1 had the two levels of then: 1 is "serializable", 0 "read
    # committed". SQLite cannot drop a column before 3.35, so the table is rebuilt.
    (
        (
            "CREATE TABLE txs_2 (tx_id TEXT NOT NULL PRIMARY KEY, record TEXT NOT NULL, "
            "owner TEXT, isolation TEXT NOT NULL) WITHOUT ROWID"
        ),
        (
            "INSERT INTO txs_2 (tx_id, record, owner, isolation) SELECT tx_id, record, owner, "
            "CASE serializable WHEN 0 THEN 'read_committed' ELSE 'serializable' END FROM txs"
        ),
        "DROP TABLE txs",
        "ALTER TABLE txs_2 RENAME TO txs",
    ),
    # 2 -> 3: the ended transactions kept as history, and the history `discard_state` keeps.
    (
        "ALTER TABLE txs ADD COLUMN history TEXT",
        (
            "CREATE TABLE ended (seq INTEGER PRIMARY KEY, tx_id TEXT NOT NULL, "
            "record TEXT NOT NULL, isolation TEXT NOT NULL, history TEXT, "
            "steps TEXT NOT NULL, ended_at REAL NOT NULL)"
        ),
    ),
    # 3 -> 4: plan runs and their nodes (`_plans`).
    PLAN_TABLES,
    # 4 -> 5: plan runs' audit events (`_plans`); approval requests and reviews (`_approvals`).
    (*PLAN_AUDIT_TABLES, *REQUEST_TABLES),
    # 5 -> 6: the holds of plan nodes' exclusive resources, across runs (`_plans`).
    PLAN_HOLD_TABLES,
    # 6 -> 7: the units of plan resources' capacities held, counted across runs (`_plans`).
    PLAN_UNIT_TABLES,
    PLAN_RATE_TABLES,  # 7 -> 8: the token buckets of tools' rate limits (`_plans`)
    CONVERSATION_COLUMN,  # 8 -> 9: an agent's conversation with its transaction
    CONVERSATION_LOG,  # 9 -> 10: its messages as a log a write appends to
)
#: The schema version this code writes: the number of migrations.
SCHEMA_VERSION: Final = len(MIGRATIONS)

#: Keys per `IN (...)` query of `StoreFile.committed_versions`.
IN_CHUNK: Final = 512

# The kinds of `log` events; the columns each one uses are in the module docstring.
WRITE: Final = 1
SNAPSHOT: Final = 2
RESTORE: Final = 3
STEP: Final = 4
EFFECT: Final = 5
PROGRESS: Final = 6
READ: Final = 7

# The statements the store runs (sqlite3 prepares each once per connection). A "fenced"
# statement carries the owner check: it changes a row only if the store owns the transaction.
INSERT_LOG: Final = (
    "INSERT INTO log (tx_id, seq, kind, step, num, name, body, extra) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_TX: Final = "INSERT OR IGNORE INTO txs (tx_id, record, owner, isolation) VALUES (?, ?, ?, ?)"
SELECT_COMMITTED: Final = "SELECT version, value FROM committed WHERE key = ?"
SELECT_OWNER: Final = "SELECT owner FROM txs WHERE tx_id = ?"
UPDATE_OWNER: Final = "UPDATE txs SET owner = ? WHERE tx_id = ?"
#: No store holds the transaction any more (`release`): any recovery may claim it at once.
RELEASE_OWNER: Final = "UPDATE txs SET owner = NULL WHERE tx_id = ? AND owner = ?"
UPDATE_RECORD: Final = "UPDATE txs SET record = ? WHERE tx_id = ?"
UPDATE_RECORD_FENCED: Final = f"{UPDATE_RECORD} AND owner = ?"
_OWNED: Final = "EXISTS (SELECT 1 FROM txs WHERE tx_id = ? AND owner = ?)"
INSERT_UNDO: Final = (
    "INSERT OR REPLACE INTO undos (tx_id, step_id, seq, record) VALUES (?, ?, ?, ?)"
)
INSERT_UNDO_FENCED: Final = (
    f"INSERT OR REPLACE INTO undos (tx_id, step_id, seq, record) SELECT ?, ?, ?, ? WHERE {_OWNED}"
)
DELETE_UNDO: Final = "DELETE FROM undos WHERE tx_id = ? AND step_id = ? AND seq = ?"
DELETE_LOG_ROW: Final = "DELETE FROM log WHERE tx_id = ? AND seq = ?"
#: The `WRITE` events from a seq on (a restore reverts them), given tx_id, seq and WRITE.
DELETE_LOG_WRITES_FROM: Final = "DELETE FROM log WHERE tx_id = ? AND seq >= ? AND kind = ?"
SELECT_TX: Final = "SELECT record, owner, isolation FROM txs WHERE tx_id = ?"
#: The newest history of `tx_id`: the scan starts at the newest row.
SELECT_ENDED_TX: Final = (
    "SELECT record, history, steps, ended_at FROM ended WHERE tx_id = ? ORDER BY seq DESC LIMIT 1"
)
SELECT_LOG: Final = (
    "SELECT seq, kind, step, num, name, body, extra FROM log WHERE tx_id = ? ORDER BY seq"
)
SELECT_UNDOS: Final = "SELECT step_id, seq, record FROM undos WHERE tx_id = ? ORDER BY step_id, seq"
_SELECT_OUTBOX: Final = (
    "SELECT id, tx_id, step_id, channel, payload, idempotency_key, attempts, last_error, "
    "not_before FROM outbox WHERE delivered = 0"
)
_SELECT_PENDING: Final = f"{_SELECT_OUTBOX} ORDER BY id LIMIT ?"
_SELECT_PENDING_OF: Final = f"{_SELECT_OUTBOX} AND tx_id = ? ORDER BY id LIMIT ?"
_MARK_DELIVERED: Final = "UPDATE outbox SET delivered = 1 WHERE id = ?"
_MARK_FAILED: Final = (
    "UPDATE outbox SET attempts = attempts + 1, last_error = ?, not_before = ? "
    "WHERE id = ? AND delivered = 0"
)
_SELECT_COMMIT_VERSION: Final = "SELECT commit_version FROM meta"
_UPDATE_COMMIT_VERSION: Final = "UPDATE meta SET commit_version = ?"
_UPSERT_COMMITTED: Final = "INSERT OR REPLACE INTO committed (key, version, value) VALUES (?, ?, ?)"
_DELETE_COMMITTED: Final = "DELETE FROM committed WHERE key = ?"
_INSERT_OUTBOX: Final = (
    "INSERT INTO outbox (tx_id, step_id, channel, payload, idempotency_key) VALUES (?, ?, ?, ?, ?)"
)
_DELETE_LOG: Final = "DELETE FROM log WHERE tx_id = ?"
_DELETE_UNDOS: Final = "DELETE FROM undos WHERE tx_id = ?"
_DELETE_TX: Final = "DELETE FROM txs WHERE tx_id = ?"
#: Keep an ending transaction as history, given history (NULL: the one kept), steps,
#: ended_at and tx_id.
_INSERT_ENDED: Final = (
    "INSERT INTO ended (tx_id, record, isolation, history, steps, ended_at) "
    "SELECT tx_id, record, isolation, COALESCE(?, history), ?, ? FROM txs WHERE tx_id = ?"
)
_RELEASE_TX: Final = "UPDATE txs SET owner = NULL, history = COALESCE(?, history) WHERE tx_id = ?"
#: The newest `?` histories, each the newest of its id (the check reads only newer rows).
_SELECT_ENDED: Final = (
    "SELECT tx_id, record, history, ended_at FROM ended AS e WHERE NOT EXISTS "
    "(SELECT 1 FROM ended AS n WHERE n.seq > e.seq AND n.tx_id = e.tx_id) "
    "ORDER BY seq DESC LIMIT ?"
)
#: The ended transactions past the newest `?`.
_PRUNE_BEYOND: Final = (
    "DELETE FROM ended WHERE seq <= (SELECT seq FROM ended ORDER BY seq DESC LIMIT 1 OFFSET ?)"
)
#: The ended transactions before the first, in the order they ended, that ended at `?` or
#: later (all, if none did). `ended_at` has no index, which would cost every end a page
#: write: the scan starts at the oldest and stops at the first that stays.
_PRUNE_BEFORE: Final = (
    "DELETE FROM ended WHERE seq < COALESCE("
    "(SELECT seq FROM ended WHERE ended_at >= ? ORDER BY seq LIMIT 1), "
    "(SELECT max(seq) + 1 FROM ended))"
)
#: The requests of transactions and plan runs that are no longer open, last changed before
#: the cutoff (the retention's age: see `_approvals`).
_PRUNE_REQUESTS: Final = (
    "DELETE FROM requests WHERE updated_at < ? "
    "AND scope_id NOT IN (SELECT tx_id FROM txs) "
    "AND scope_id NOT IN (SELECT run_id FROM plan_runs WHERE status = 'RUNNING')"
)
_SELECT_TX_IDS: Final = "SELECT tx_id FROM txs ORDER BY tx_id"
_SELECT_COMMITTED_FROM: Final = (
    "SELECT key, version, value FROM committed WHERE key >= ? ORDER BY key LIMIT ?"
)
_SELECT_OUTBOX_ENTRY: Final = "SELECT 1 FROM outbox WHERE id = ?"
#: SQLite's result code for a write to a database it opened read-only.
_SQLITE_READONLY: Final = 8
#: SQLite's result codes for a file that is not a database, or a damaged one (SQLITE_CORRUPT,
#: SQLITE_NOTADB); any other error reading the schema is the file system's, or a lock's.
_NOT_A_DATABASE: Final = frozenset({11, 26})
#: A write that changes nothing; SQLite refuses it if it opened the file read-only.
_PROBE_WRITE: Final = "UPDATE meta SET commit_version = commit_version WHERE 0"


@final
@attrs.define(eq=False, repr=False, init=False)
class StoreFile:
    """One open connection to a store's file, and the SQLite transactions run on it.

    ``StoreFile(path, durability=..., busy_timeout=..., readonly=..., exclusive=...)`` opens
    the file and checks that it is an agenttx store; `exclusive` takes SQLite's lock on the
    file at once and keeps it until `close`. Writable, it creates the file if need be (an empty
    database is a new store), sets WAL mode and `synchronous` and applies the missing
    migrations. Read-only, it opens an existing file with `mode=ro` and requires this code's
    schema version exactly. Every problem is a `StorageError`. The caller serializes all use
    (`SQLiteStore` holds its lock); `cur` is the one cursor.

    Besides the SQLite transactions, it runs the queries that involve no transaction's mirror
    or ownership: the committed state, the transactions in the file, the outbox.
    """

    path: str
    busy_timeout: float
    readonly: bool
    conn: sqlite3.Connection
    cur: sqlite3.Cursor
    #: The prepared texts of `committed_versions` and `insert_log` (negative: fenced), by size.
    _in_sql: dict[int, str]
    _multi_sql: dict[int, str]
    #: The file's absolute path (a later `chdir` must not change which file is checked), and
    #: its identity `(st_dev, st_ino)` when opened; `None` if nothing is written (read-only, or
    #: an in-memory database).
    _absolute: str
    _identity: tuple[int, int] | None

    def __init__(
        self,
        path: str,
        *,
        durability: Literal["normal", "full"],
        busy_timeout: float,
        readonly: bool,
        exclusive: bool = False,
    ) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.readonly = readonly
        self._in_sql = {}
        self._multi_sql = {}
        self._absolute = str(pathlib.Path(path).absolute())
        self._identity = None
        before = None if readonly or path == ":memory:" else _identity_of(self._absolute)
        target = path
        if readonly:
            if not pathlib.Path(path).exists():
                raise StorageError(f"no such file: {path} (a read-only store never creates one)")
            target = f"{pathlib.Path(path).absolute().as_uri()}?mode=ro"
        try:
            self.conn = sqlite3.connect(
                target,
                uri=readonly,
                timeout=busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=256,
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the store `{path}`: {exc}") from exc
        self.cur = self.conn.cursor()
        try:
            if exclusive:  # before the first read, so that SQLite keeps the WAL index in memory
                self.cur.execute("PRAGMA locking_mode = EXCLUSIVE")
            self._open_schema(durability)
            if before is not None or not (readonly or path == ":memory:"):
                self._identity = self._identify_file(before)
        except BaseException:
            self.conn.close()
            raise

    def _identify_file(self, before: tuple[int, int] | None) -> tuple[int, int]:
        """The identity of the file just opened: the one at the path now, which must be the
        one that was there before the connection opened it, if there was one."""
        identity = _identity_of(self._absolute)
        if identity is None or (before is not None and identity != before):
            raise StorageError(
                f"the store `{self.path}` was deleted or replaced while it was being opened"
            )
        return identity

    def check_file(self, doing: str) -> None:
        """Raise `StorageError` if the path no longer names the file this connection has open
        (deleted, renamed away, or replaced by another file): a write would go to a file that
        no other process opens, and be lost with this connection. One `stat` call."""
        identity = self._identity
        if identity is None:
            return
        try:
            status = os.stat(self._absolute)  # noqa: PTH116  (the cheapest call: on every write)
        except FileNotFoundError:
            what = "was deleted (or renamed away) after this store opened it"
        except OSError as exc:
            raise StorageError(
                f"could not {doing}: cannot check the store file `{self.path}`: {exc}"
            ) from exc
        else:
            if (status.st_dev, status.st_ino) == identity:
                return
            what = "was replaced by another file after this store opened it"
        raise StorageError(
            f"could not {doing}: the store file `{self.path}` {what}; writing on would lose "
            "the writes with this connection: close this store, and open the file again"
        )

    def close(self) -> None:
        """Close the connection."""
        try:
            self.conn.close()
        except sqlite3.Error as exc:  # pragma: no cover - close fails only if SQLite does
            raise StorageError(f"cannot close the store `{self.path}`: {exc}") from exc

    # ------------------------------------------------------------ the schema

    def _open_schema(self, durability: str) -> None:
        """Check that the file is an agenttx store (or empty), set the pragmas, migrate."""
        cur = self.cur
        try:
            application_id, version, objects = self._identify()
        except sqlite3.DatabaseError as exc:
            code = getattr(exc, "sqlite_errorcode", None)
            if is_busy(exc) or (code is not None and code & 0xFF not in _NOT_A_DATABASE):
                raise self.failure("read the schema", exc) from exc
            raise StorageError(
                f"`{self.path}` is not a SQLite database (or it is encrypted or corrupt): {exc}"
            ) from exc
        self._check_schema(application_id, version, objects)
        if self.readonly:
            return
        try:
            mode = cur.execute("PRAGMA journal_mode = WAL").fetchall()[0][0]
            cur.execute(f"PRAGMA synchronous = {durability.upper()}")
            if version == len(MIGRATIONS):
                # SQLite opens a file it may not write read-only without a word: find out now,
                # not at the first commit. The statement writes nothing and is rolled back.
                cur.execute("BEGIN IMMEDIATE")
                try:
                    cur.execute(_PROBE_WRITE)
                finally:
                    self.rollback()
            else:
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
                    self.rollback()
                    raise
        except sqlite3.Error as exc:
            raise self.failure("set up the schema", exc) from exc
        if mode != "wal" and self.path != ":memory:":  # pragma: no cover - needs such a disk
            raise StorageError(
                f"`{self.path}` cannot use SQLite's WAL mode (journal mode {mode!r}): put the "
                "store on a local file system"
            )

    def _identify(self) -> tuple[int, int, int]:
        cur = self.cur
        application_id = cur.execute("PRAGMA application_id").fetchall()[0][0]
        version = cur.execute("PRAGMA user_version").fetchall()[0][0]
        objects = cur.execute("SELECT count(*) FROM sqlite_master").fetchall()[0][0]
        return application_id, version, objects

    def _check_schema(self, application_id: int, version: int, objects: int) -> None:
        if application_id == 0 and version == 0 and objects == 0:
            if self.readonly:
                raise StorageError(
                    f"`{self.path}` is an empty SQLite database, not an agenttx store: a "
                    "read-only store does not create one"
                )
            return  # an empty database: the migrations create the store
        if application_id != APPLICATION_ID:
            raise StorageError(
                f"`{self.path}` is a SQLite database but not an agenttx store "
                f"(application_id {application_id}, user_version {version}, {objects} schema "
                "objects): give SQLiteStore a new file or one it created"
            )
        if version > len(MIGRATIONS):
            raise StorageError(
                f"the store `{self.path}` has schema version {version}, newer than this "
                f"version of agenttx knows ({len(MIGRATIONS)}): upgrade agenttx to open it"
            )
        if self.readonly and version < len(MIGRATIONS):
            raise StorageError(
                f"the store `{self.path}` has schema version {version}, older than this "
                f"version of agenttx reads ({len(MIGRATIONS)}), and a read-only store does not "
                "migrate it: open it once without readonly=True, or use the agenttx that wrote it"
            )

    # ------------------------------------------------------------ SQLite transactions

    @contextlib.contextmanager
    def writing(self, doing: str) -> Iterator[sqlite3.Cursor]:
        """Run the block in one write transaction: `BEGIN IMMEDIATE` (waiting up to the busy
        timeout), then `COMMIT`; if the block raises, `ROLLBACK` and re-raise, a
        `sqlite3.Error` as `StorageError`. First `check_file`."""
        self.check_file(doing)
        with self._transaction("BEGIN IMMEDIATE", doing) as cur:
            yield cur

    @contextlib.contextmanager
    def reading(self, doing: str) -> Iterator[sqlite3.Cursor]:
        """Run the block's queries in one read transaction, so that they see one state of the
        file; errors as for `writing`. It takes no write lock: in WAL mode, writers go on."""
        with self._transaction("BEGIN", doing) as cur:
            yield cur

    @contextlib.contextmanager
    def _transaction(self, begin: str, doing: str) -> Iterator[sqlite3.Cursor]:
        cur = self.cur
        try:
            cur.execute(begin)
        except sqlite3.Error as exc:
            raise self.failure(doing, exc) from exc
        try:
            yield cur
        except sqlite3.Error as exc:
            self.rollback()
            raise self.failure(doing, exc) from exc
        except BaseException:
            self.rollback()
            raise
        try:
            cur.execute("COMMIT")
        except sqlite3.Error as exc:  # pragma: no cover - SQLite fails a COMMIT only on I/O errors
            self.rollback()
            raise self.failure(doing, exc) from exc

    def rollback(self) -> None:
        """Roll back the SQLite transaction in progress, if any; never raises `sqlite3.Error`."""
        if self.conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # if so, SQLite has rolled back by itself
                self.cur.execute("ROLLBACK")

    def failure(self, doing: str, exc: sqlite3.Error) -> StorageError:
        """The `StorageError` for `exc`, raised while trying to `doing`."""
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF == _SQLITE_READONLY and not self.readonly:
            return StorageError(
                f"could not {doing}: SQLite cannot write the store `{self.path}` (it opened it "
                "read-only: check that this user may write the file, its directory and its "
                f"-wal and -shm files), or open it with readonly=True: {exc}"
            )
        if is_busy(exc):
            return StorageError(
                f"could not {doing}: the store `{self.path}` stayed locked by another "
                f"connection for the whole busy timeout ({self.busy_timeout:g} s); a store "
                "opened with exclusive=True keeps it locked until it closes"
            )
        return StorageError(f"could not {doing} in the store `{self.path}`: {exc}")

    # ------------------------------------------------------------ queries

    def committed_versions(self, keys: list[str]) -> dict[str, int]:
        """The committed versions of those of `keys` that are present; run it inside a
        transaction. Keys go `IN_CHUNK` per query, padded to a power of two, so that a handful
        of prepared statements serve every size."""
        found: dict[str, int] = {}
        execute = self.cur.execute
        for start in range(0, len(keys), IN_CHUNK):
            chunk = keys[start : start + IN_CHUNK]
            size = 1 << (len(chunk) - 1).bit_length()
            sql = self._in_sql.get(size)
            if sql is None:
                marks = ", ".join("?" * size)
                sql = self._in_sql[size] = (
                    f"SELECT key, version FROM committed WHERE key IN ({marks})"  # noqa: S608
                )
            found.update(execute(sql, chunk + chunk[-1:] * (size - len(chunk))).fetchall())
        return found

    def committed_keys(self, prefix: str, limit: int) -> list[tuple[str, int, str]]:
        """Up to `limit` committed `(key, version, value)` rows whose key starts with `prefix`,
        sorted by key: the keys that do are the first ones >= it (SQLite sorts text as UTF-8
        bytes, that is, by code point), so one indexed range query finds them."""
        try:
            rows: list[tuple[str, int, str]] = self.cur.execute(
                _SELECT_COMMITTED_FROM, (prefix, limit)
            ).fetchall()
        except sqlite3.Error as exc:
            raise self.failure("read the committed state", exc) from exc
        kept = 0
        while kept < len(rows) and rows[kept][0].startswith(prefix):
            kept += 1
        return rows[:kept]

    def insert_log(
        self, rows: Sequence[tuple[object, ...]], fence: tuple[str, str] | None, doing: str
    ) -> int:
        """Append `rows` to the log in one statement, once `check_file` passes; with a `fence`
        `(tx_id, owner)`, only if `owner` owns `tx_id`. The number of rows inserted: all or
        none. `sqlite3.Error` escapes, for the caller to turn."""
        self.check_file(doing)
        count = len(rows)
        key = count if fence is None else -count
        sql = self._multi_sql.get(key)
        if sql is None:
            values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * count)
            insert = "INSERT INTO log (tx_id, seq, kind, step, num, name, body, extra) "
            sql = self._multi_sql[key] = (  # placeholders only:
                f"{insert}VALUES {values}"
                if fence is None
                else f"{insert}SELECT * FROM (VALUES {values}) WHERE {_OWNED}"  # noqa: S608
            )
        parameters = [value for row in rows for value in row]
        if fence is not None:
            parameters += fence
        inserted: int = self.cur.execute(sql, parameters).rowcount
        return inserted

    def write(self, sql: str, parameters: Sequence[object], doing: str) -> int:
        """Run one statement that writes, alone (SQLite runs it as a transaction of its own),
        once `check_file` passes; return the number of rows it changed. Errors as `StorageError`.
        """
        self.check_file(doing)
        try:
            changed: int = self.cur.execute(sql, parameters).rowcount
        except sqlite3.Error as exc:
            raise self.failure(doing, exc) from exc
        return changed

    def open_transactions(self) -> tuple[str, ...]:
        """The ids of every transaction with a row in the file, sorted."""
        try:
            rows = self.cur.execute(_SELECT_TX_IDS).fetchall()
        except sqlite3.Error as exc:
            raise self.failure("list the open transactions", exc) from exc
        return tuple(row[0] for row in rows)

    def owner(self, tx_id: str) -> str | None:
        """The `owner` of transaction `tx_id`'s row; `TransactionNotFound` if it has none."""
        try:
            rows = self.cur.execute(SELECT_OWNER, (tx_id,)).fetchall()
        except sqlite3.Error as exc:
            raise self.failure(f"read the owner of transaction `{tx_id}`", exc) from exc
        if not rows:
            raise TransactionNotFound(tx_id=tx_id)
        owner: str | None = rows[0][0]
        return owner

    def pending_effects(self, limit: int, tx_id: str | None) -> tuple[OutboxEntry, ...]:
        """Up to `limit` undelivered outbox entries (of `tx_id` only, unless `None`), in order."""
        try:
            rows = self.cur.execute(
                _SELECT_PENDING if tx_id is None else _SELECT_PENDING_OF,
                (limit,) if tx_id is None else (tx_id, limit),
            ).fetchall()
        except sqlite3.Error as exc:
            raise self.failure("read the outbox", exc) from exc
        return tuple(
            OutboxEntry(
                id=row[0],
                tx_id=row[1],
                step_id=row[2],
                channel=row[3],
                payload=row[4],
                idempotency_key=row[5],
                attempts=row[6],
                last_error=row[7],
                not_before=row[8],
            )
            for row in rows
        )

    def publish(
        self, tx_id: str, writes: dict[str, tuple[int, str | None]], effects: list[EffectRow]
    ) -> None:
        """Inside a write transaction: commit the overlay `writes` (key -> (base, value), a
        value `None` deleting the key) with the next commit number, move `effects` to the
        outbox in order. `sqlite3.Error` escapes. (The caller then ends the transaction.)"""
        execute, executemany = self.cur.execute, self.cur.executemany
        version = execute(_SELECT_COMMIT_VERSION).fetchall()[0][0] + 1
        execute(_UPDATE_COMMIT_VERSION, (version,))
        executemany(
            _UPSERT_COMMITTED, [(k, version, v) for k, (_, v) in writes.items() if v is not None]
        )
        executemany(_DELETE_COMMITTED, [(k,) for k, (_, v) in writes.items() if v is None])
        if effects:
            executemany(
                _INSERT_OUTBOX,
                [(tx_id, e.step_id, e.channel, e.payload, e.idempotency_key) for e in effects],
            )

    def end_transaction(
        self, tx_id: str, history: str | None, steps: str | None, ended_at: float
    ) -> bool:
        """Inside a write transaction: end open transaction `tx_id`, deleting its rows (its
        record, log and undo records). With `steps` (JSON text, see the layout), first keep
        it as history, ended at `ended_at`, with `history` (`None`: the one `discard_state`
        kept, if any). False, changing nothing, if `tx_id` is not open in the file.
        `sqlite3.Error` escapes."""
        execute = self.cur.execute
        if steps is not None:
            execute(_INSERT_ENDED, (history, steps, ended_at, tx_id))
        if execute(_DELETE_TX, (tx_id,)).rowcount == 0:
            return False
        execute(_DELETE_LOG, (tx_id,))
        execute(_DELETE_UNDOS, (tx_id,))
        return True

    def release_transaction(self, tx_id: str, history: str | None) -> None:
        """Inside a write transaction: delete the transaction's log and set its owner to NULL
        (no store holds it, any recovery may claim it), keeping its row, its record and its
        undo records; `history`, unless `None`, is kept for when it ends. `sqlite3.Error`
        escapes."""
        self.cur.execute(_DELETE_LOG, (tx_id,))
        self.cur.execute(_RELEASE_TX, (history, tx_id))

    def prune(self, keep: int | None, keep_for: float | None, now: float) -> None:
        """Inside a write transaction: delete the history of the ended transactions beyond the
        newest `keep`, and of those that ended before `now - keep_for` (`None`: no such
        limit), and likewise the audit events of ended plan runs, and the approval requests
        and reviews of ended transactions and runs last changed before then. `sqlite3.Error`
        escapes."""
        if keep is not None:
            self.cur.execute(_PRUNE_BEYOND, (keep,))
        if keep_for is not None:
            self.cur.execute(_PRUNE_BEFORE, (now - keep_for,))
            self.cur.execute(_PRUNE_REQUESTS, (now - keep_for,))
        prune_audit(self.cur, keep, keep_for, now)  # the ended plan runs' audit events too

    def ended_transactions(self, limit: int) -> tuple[EndedTransaction, ...]:
        """Up to `limit` ended transactions kept as history, the last to end first."""
        try:
            rows = self.cur.execute(_SELECT_ENDED, (limit,)).fetchall()
        except sqlite3.Error as exc:
            raise self.failure("list the ended transactions", exc) from exc
        return tuple(
            EndedTransaction(tx_id=row[0], record=row[1], history=row[2], ended_at=row[3])
            for row in rows
        )

    def mark_delivered(self, entry_id: int) -> None:
        """Mark outbox entry `entry_id` delivered (see `update_outbox`)."""
        self.update_outbox(entry_id, _MARK_DELIVERED, ())

    def mark_failed(self, entry_id: int, error: str, not_before: float) -> None:
        """Count a failed delivery of an undelivered entry (see `update_outbox`)."""
        self.update_outbox(entry_id, _MARK_FAILED, (error, not_before))

    def update_outbox(self, entry_id: int, sql: str, values: tuple[object, ...]) -> None:
        """Run `sql` with `(*values, entry_id)` in a write transaction; if it changes no row,
        `InvalidArgument` unless outbox entry `entry_id` exists."""
        with self.writing(f"update outbox entry {entry_id}") as cur:
            if (
                cur.execute(sql, (*values, entry_id)).rowcount == 0
                and not cur.execute(_SELECT_OUTBOX_ENTRY, (entry_id,)).fetchall()
            ):
                raise InvalidArgument(f"there is no outbox entry {entry_id}")


def _identity_of(path: str) -> tuple[int, int] | None:
    """`(st_dev, st_ino)` of the file at `path`, or `None` if there is none."""
    try:
        status = pathlib.Path(path).stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"cannot open the store `{path}`: {exc}") from exc
    return status.st_dev, status.st_ino


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite gave up waiting for a lock (SQLITE_BUSY or SQLITE_LOCKED)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in {5, 6}
    return "locked" in str(exc)  # pragma: no cover - Python 3.10 has no sqlite_errorcode


# ---------------------------------------------------------------- what the rows may hold


def check_effects(effects: Iterable[object]) -> list[EffectRow]:
    """The effects, a list of `EffectRow`s (checked when they were built); `InvalidArgument`
    names the first that is not one."""
    if isinstance(effects, (str, bytes)):
        raise InvalidArgument("effects must be a sequence of EffectRow, not text")
    try:
        items = list(effects)
    except TypeError:
        raise InvalidArgument(f"effects must be a sequence of EffectRow, not {effects!r}") from None
    for index, effect in enumerate(items):
        if not isinstance(effect, EffectRow):
            raise InvalidArgument(f"effect {index} must be an EffectRow, not {effect!r}")
    return cast("list[EffectRow]", items)


def check_undo(undo: object) -> UndoRow:
    """`undo`, if it is an `UndoRow` (checked when it was built); else `InvalidArgument`."""
    if not isinstance(undo, UndoRow):
        raise InvalidArgument(f"undo records must be UndoRow, not {undo!r}")
    return undo
