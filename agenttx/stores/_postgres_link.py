"""The connections behind `PostgresStore`: connecting, reconnecting, migrating, errors, and the
thread that renews the store's leases on a connection of its own (`Renewer`).

`Link` holds one psycopg connection (autocommit: every statement outside `transaction()` is its
own PostgreSQL transaction), made from a DSN or taken from a `psycopg_pool.ConnectionPool`.
The statements of the per-step path and of commit (`Hot`) are prepared on each connection
before its first use, and run straight through libpq, their parameters already bytes: psycopg's
adaptation and its Python wait loop cost a step more than the server does. `run` executes one
(a blocking call, the GIL released); `batch` sends several at once in pipeline mode and waits
once for all their results (one round trip).
Every psycopg error becomes a `StorageError` naming what the store was doing, with the error as
`__cause__`; an error that leaves the connection unusable (the server restarted, the network
dropped) also drops the connection, and the next call connects again. A statement timeout
(`statement_timeout`) cancels the statement and its transaction: the call has no effect.
"""

from __future__ import annotations

import contextlib
import re
import select
import threading
from typing import TYPE_CHECKING, Any, Final

from .._errors import InvalidArgument, StorageError
from ._postgres_schema import COMMANDS, MIGRATION_LOCK, MIGRATIONS, SCHEMA_VERSION, Sql

if TYPE_CHECKING:
    import weakref
    from collections.abc import Iterator, Sequence

    import psycopg

    from ._postgres_schema import Statement

__all__ = ["Link", "Renewer", "check_schema_name", "import_psycopg"]

_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_EXTRA_HINT: Final = "pip install 'agenttx[postgres]'"
#: libpq's diagnostic field of the SQLSTATE (`PG_DIAG_SQLSTATE`), and the SQLSTATE of a
#: prepared statement that does not exist (`invalid_sql_statement_name`).
_SQLSTATE: Final = ord("C")
_GONE: Final = b"26000"


def import_psycopg() -> Any:
    """The `psycopg` module; `ImportError` naming the extra to install if it is missing."""
    try:
        import psycopg  # noqa: PLC0415  (the optional driver: never loaded by `import agenttx`)
    except ImportError as exc:
        raise ImportError(
            f"PostgresStore needs psycopg 3 and psycopg-pool: {_EXTRA_HINT} ({exc})"
        ) from exc
    return psycopg


def check_schema_name(schema: object) -> str:
    """`schema`, if it is a lower-case SQL identifier (1-63 chars of `[a-z0-9_]`, not starting
    with a digit); else `InvalidArgument`. Such a name needs no quoting and cannot inject SQL."""
    if not isinstance(schema, str) or _SCHEMA_NAME.fullmatch(schema) is None:
        raise InvalidArgument(
            f"schema must be 1-63 chars of [a-z0-9_], not starting with a digit, got {schema!r}"
        )
    if schema.startswith("pg_"):
        raise InvalidArgument(f"schema {schema!r} is reserved by PostgreSQL (pg_...)")
    return schema


class Link:
    """One connection of a store to its server, made again after it breaks.

    The caller serializes all use (the store's lock). `conn()` returns a live connection;
    `failure()` turns a psycopg error into `StorageError` and drops a broken connection.
    """

    def __init__(
        self,
        dsn_or_pool: object,
        *,
        schema: str,
        connect_timeout: float,
        statement_timeout: float | None,
    ) -> None:
        self.psycopg = import_psycopg()
        self.schema = schema
        self.sql = Sql(schema)
        self._source = dsn_or_pool
        self._pooled = not isinstance(dsn_or_pool, str)
        self._connect_timeout = connect_timeout
        self._statement_timeout = statement_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._cur: psycopg.Cursor[Any] | None = None
        self._encoding = "utf-8"
        #: The connection the hot statements are prepared on (at the first `run` on it: the
        #: schema may not exist before).
        self._prepared: object = None
        pq = self.psycopg.pq
        self._done = frozenset({pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK})
        self._bad = pq.ConnStatus.BAD
        self._idle = pq.TransactionStatus.IDLE
        self._sync = pq.ExecStatus.PIPELINE_SYNC

    @property
    def where(self) -> str:
        """The server and schema, for messages (never the password)."""
        conn = self._conn
        if conn is not None and not conn.closed:
            info = conn.info
            return f"{info.host}:{info.port}/{info.dbname} schema {self.schema}"
        return f"schema {self.schema}"

    def cursor(self, doing: str) -> psycopg.Cursor[Any]:
        """The cursor of a live connection, connecting first if there is none."""
        cur = self._cur
        if cur is not None and self._conn is not None and not self._conn.closed:
            return cur
        self.drop()
        try:
            conn = self._connect()
        except self.psycopg.Error as exc:
            raise StorageError(
                f"could not {doing}: cannot connect to the PostgreSQL server: {exc}"
            ) from exc
        self._conn = conn
        self._cur = conn.cursor()
        return self._cur

    def _connect(self) -> psycopg.Connection[Any]:
        if self._pooled:
            conn: psycopg.Connection[Any] = self._source.getconn(  # type: ignore[attr-defined]
                timeout=self._connect_timeout
            )
            if conn.info.transaction_status != self.psycopg.pq.TransactionStatus.IDLE:
                conn.rollback()
            conn.autocommit = True
        else:
            conn = self.psycopg.connect(
                self._source,
                autocommit=True,
                connect_timeout=max(1, round(self._connect_timeout)),
            )
        if self._statement_timeout is not None:
            conn.execute(
                "SELECT set_config('statement_timeout', %s, false)",
                (f"{round(self._statement_timeout * 1000)}ms",),
            )
        self._encoding = conn.info.encoding
        return conn

    def ready(self, doing: str) -> psycopg.Connection[Any]:
        """The live connection, with the hot statements prepared on it (the store's schema
        must be at its version). `StorageError` if it cannot be had."""
        conn = self.cursor(doing).connection
        if self._prepared is not conn:
            try:
                self._prepare(conn)
            except self.psycopg.Error as exc:
                raise self.failure(doing, exc) from exc
            self._prepared = conn
        return conn

    def _prepare(self, conn: psycopg.Connection[Any]) -> None:
        """Prepare the hot statements on `conn` that it lacks (another store sharing a pool
        may have prepared them there: same name, same text), in two round trips. Each is
        prepared by the protocol, with its own text (what `pg_stat_activity` shows of it)."""
        wanted = self.sql.hot.statements
        names = [name.decode() for name, _ in wanted]
        rows = conn.execute(
            "SELECT name FROM pg_prepared_statements WHERE name = ANY(%s)", (names,)
        ).fetchall()
        have = {row[0].encode() for row in rows}
        missing = [(name, text.encode()) for name, text in wanted if name not in have]
        if missing:
            pgconn: Any = conn.pgconn
            for result in self._send(pgconn, missing, prepare=True):
                if not self.ok(result):
                    raise self.error(result)

    def run(
        self, doing: str, name: bytes, params: Sequence[bytes | None], formats: Sequence[int]
    ) -> Any:
        """Execute hot statement `name` (see `Hot`) with `params` (each in text, 0, or binary,
        1, format as `formats` says), outside any transaction; its `PGresult`, columns in
        binary format. An error is `StorageError`, as `failure` makes.

        The statements are prepared on each connection before its first use (`ready`), and
        again if they are gone (psycopg deallocates every prepared statement after a rollback,
        a pool may discard them): the statement, not run, is then run once more. The call
        blocks in libpq, so a KeyboardInterrupt waits for the statement's end
        (`statement_timeout` bounds one that waits on a lock)."""
        conn = self.ready(doing)
        pgconn: Any = conn.pgconn  # its stub does not let a parameter be None (NULL)
        try:
            result = pgconn.exec_prepared(name, params, param_formats=formats, result_format=1)
            if result.status not in self._done and result.error_field(_SQLSTATE) == _GONE:
                self._prepare(conn)
                result = pgconn.exec_prepared(name, params, param_formats=formats, result_format=1)
        except self.psycopg.Error as exc:
            raise self.failure(doing, exc) from exc
        if result.status not in self._done:
            error = self.error(result)
            raise self.failure(doing, error) from error
        return result

    def batch(self, doing: str, statements: Sequence[Statement]) -> list[Any]:
        """Send `statements` (hot statements, or `COMMANDS`) at once in pipeline mode, with
        one Sync: one round trip. Their results, in order: an error's result stays in the list
        (those after it are `PIPELINE_ABORTED`), and a transaction the error aborted is the
        caller's to `rollback`. A lost connection raises `StorageError` (and is dropped), as
        does any other psycopg error; prepared statements gone are prepared again, and the
        batch sent again, as `run` does. An interrupt while waiting drops the connection (the
        server then rolls back what it had not committed)."""
        conn = self.ready(doing)
        pgconn: Any = conn.pgconn
        try:
            results = self._send(pgconn, statements)
            if any(result.error_field(_SQLSTATE) == _GONE for result in results):
                self.rollback(doing)
                self._prepare(conn)
                results = self._send(pgconn, statements)
        except self.psycopg.Error as exc:
            raise self.failure(doing, exc) from exc
        return results

    def _send(
        self,
        pgconn: Any,
        statements: Sequence[tuple[Any, ...]],
        *,
        prepare: bool = False,
    ) -> list[Any]:
        """In pipeline mode: send `statements` (or, with `prepare`, prepare `(name, text)`s)
        and a Sync, and read their results."""
        pgconn.enter_pipeline_mode()
        try:
            for statement in statements:
                name = statement[0]
                if prepare:
                    pgconn.send_prepare(name, statement[1])
                elif name in COMMANDS:
                    pgconn.send_query_params(name, None)
                else:
                    pgconn.send_query_prepared(
                        name, statement[1], param_formats=statement[2], result_format=1
                    )
            pgconn.pipeline_sync()
            results = self._results(pgconn)
            pgconn.exit_pipeline_mode()
        except BaseException:
            self.drop()  # in pipeline mode, with results not read: in no state to go on
            raise
        return results

    def _results(self, pgconn: Any) -> list[Any]:
        """In pipeline mode, after a Sync: send what is buffered, and read the results."""
        socket = pgconn.socket
        while pgconn.flush():  # the server's replies are read as they come, meanwhile
            readable, _, _ = select.select([socket], [socket], [])
            if readable:
                pgconn.consume_input()
        results: list[Any] = []
        while True:
            while pgconn.is_busy():
                select.select([socket], [], [])
                pgconn.consume_input()
            result = pgconn.get_result()
            if pgconn.status == self._bad:
                raise self._lost(result)
            if result is None:  # the end of one statement's results
                continue
            if result.status == self._sync:
                return results
            results.append(result)

    def rollback(self, doing: str) -> None:
        """Roll back the transaction open on the connection, if any (after a failed `batch`)."""
        conn = self._conn
        if conn is None or conn.closed or conn.info.transaction_status == self._idle:
            return
        try:
            result = conn.pgconn.exec_(b"ROLLBACK")
        except self.psycopg.Error as exc:
            raise self.failure(doing, exc) from exc
        if result.status not in self._done:
            raise self.failure(doing, self.error(result))

    def ok(self, result: Any) -> bool:
        """Whether `result` is a statement's success."""
        return result.status in self._done

    def sqlstate(self, result: Any) -> bytes | None:
        """The SQLSTATE of a failed `result`."""
        state: bytes | None = result.error_field(_SQLSTATE)
        return state

    def error(self, result: Any) -> Exception:
        """The psycopg error of a failed `result`, as psycopg raises it."""
        conn = self._conn
        if conn is None or conn.pgconn.status == self._bad:
            return self._lost(result)
        error: Exception = self.psycopg.errors.error_from_result(result, encoding=self._encoding)
        return error

    def _lost(self, result: Any) -> Exception:
        message = (result and result.error_message) or b"no connection to the server"
        error: Exception = self.psycopg.OperationalError(
            message.decode(self._encoding, "replace").strip()
        )
        return error

    @contextlib.contextmanager
    def transaction(self, doing: str, *, snapshot: bool = False) -> Iterator[psycopg.Cursor[Any]]:
        """Run the block in one PostgreSQL transaction (READ COMMITTED, or with `snapshot`,
        REPEATABLE READ READ ONLY: one consistent view for several reads). If the block raises,
        the transaction is rolled back and the exception goes on, a psycopg error as
        `StorageError`."""
        cur = self.cursor(doing)
        conn = cur.connection
        try:
            with conn.transaction():
                if snapshot:
                    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                yield cur
        except self.psycopg.Error as exc:
            raise self.failure(doing, exc) from exc

    def failure(self, doing: str, exc: BaseException) -> StorageError:
        """The `StorageError` for psycopg error `exc`, raised while trying to `doing`; drops
        the connection if `exc` broke it."""
        conn = self._conn
        broken = conn is None or conn.closed or bool(getattr(conn, "broken", False))
        if broken or isinstance(exc, self.psycopg.OperationalError):
            self.drop()
        kind = type(exc).__name__
        if isinstance(exc, self.psycopg.errors.QueryCanceled):
            return StorageError(f"could not {doing}: the statement timed out ({kind}: {exc})")
        if broken:
            return StorageError(
                f"could not {doing}: the connection to the PostgreSQL server was lost "
                f"(it reconnects on the next call): {kind}: {exc}"
            )
        return StorageError(f"could not {doing} in PostgreSQL ({self.where}): {kind}: {exc}")

    def drop(self) -> None:
        """Close the connection (or give it back to the pool), if any; never raises."""
        conn, self._conn, self._cur = self._conn, None, None
        if conn is None:
            return
        with contextlib.suppress(Exception):
            if self._pooled:
                self._source.putconn(conn)  # type: ignore[attr-defined]
            else:
                conn.close()

    # ------------------------------------------------------------ the schema

    def migrate(self) -> int:
        """Create the schema or bring it up to date, in one transaction under an advisory lock
        (several workers may start at once); return the schema version. `StorageError` if the
        schema is newer than this code knows."""
        doing = f"migrate the schema `{self.schema}`"
        sql = self.sql
        with self.transaction(doing) as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
            cur.execute(sql.create_migrations)
            version = self._version(cur)
            for number in range(version, SCHEMA_VERSION):
                description, statements = MIGRATIONS[number]
                for statement in statements:
                    cur.execute(statement.format(s=self.schema))
                cur.execute(sql.insert_migration, (number + 1, description))
        return SCHEMA_VERSION

    def check_version(self) -> None:
        """`StorageError` unless the schema is at this code's version (read-only check)."""
        doing = f"read the schema version of `{self.schema}`"
        with self.transaction(doing) as cur:
            cur.execute("SELECT to_regclass(%s)", (f"{self.schema}.migrations",))
            row = cur.fetchone()
            version = 0 if row is None or row[0] is None else self._version(cur)
        if version != SCHEMA_VERSION:
            raise StorageError(
                f"the schema `{self.schema}` is at version {version}, not {SCHEMA_VERSION}: "
                "run PostgresStore.migrate() (or open it with migrate=True)"
            )

    def _version(self, cur: psycopg.Cursor[Any]) -> int:
        cur.execute(self.sql.select_version)
        row = cur.fetchone()
        version = 0 if row is None or row[0] is None else int(row[0])
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"the schema `{self.schema}` has version {version}, newer than this version "
                f"of agenttx knows ({SCHEMA_VERSION}): upgrade agenttx to use it"
            )
        return version


class Renewer:
    """The thread that renews a store's leases every `interval` seconds, on its own
    connection. It holds the store weakly, and ends when the store is closed or collected."""

    def __init__(self, store: weakref.ref[Any], link: Link, interval: float) -> None:
        self._store = store
        self._link = link
        self._interval = interval
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def start(self) -> None:
        """Start the thread, once (the first time the store holds something)."""
        if self._thread is not None or self._stopped.is_set():
            return
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="agenttx-postgres-leases", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        """Stop the thread (it ends within one interval) and close its connection."""
        self._stopped.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self._link.drop()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            store = self._store()
            if store is None:
                break
            tx_ids, epochs, run_ids, run_epochs = store._held()  # noqa: SLF001
            lease = store.lease_seconds
            del store  # the thread must not keep the store alive
            self.renew(tx_ids, epochs, run_ids, run_epochs, lease)
        self._link.drop()

    def renew(
        self,
        tx_ids: list[str],
        epochs: list[int],
        run_ids: list[str],
        run_epochs: list[int],
        lease: float,
    ) -> None:
        """Extend the leases of the transactions and runs still at their epochs. A failure is
        retried at the next tick: a lease that runs out meanwhile may be taken over, and the
        holder's next write finds out."""
        sql = self._link.sql
        try:
            cur = self._link.cursor("renew the leases")
            if tx_ids:
                cur.execute(sql.renew_txs, (lease, tx_ids, epochs))
            if run_ids:
                cur.execute(sql.renew_plans, (lease, run_ids, run_epochs))
        except Exception as exc:  # noqa: BLE001 - retried at the next tick
            self._link.failure("renew the leases", exc)
