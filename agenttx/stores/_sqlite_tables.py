"""What `SQLiteStore` keeps beside transactions, in the same file: plan runs (with their holds,
units and rate buckets), ended transactions kept as history, approval requests and reviews,
agents' conversations, and the outbox. `SharedTables` is mixed into `SQLiteStore`; each method
takes the store's lock and runs in one read or write of the file (the SQL is in `_plans`,
`_approvals`, `_conversations`, `_sqlite_file` and `_sqlite_mirror`), as `PostgresStore`'s
`SharedRows` does on its server."""

from __future__ import annotations

import math
import sqlite3
import time
from typing import TYPE_CHECKING, Any

from .._errors import InvalidArgument, StorageError
from . import _approvals as request_tables
from . import _plans as plan_tables
from ._conversations import (
    SELECT_CONVERSATION,
    SELECT_MESSAGES,
    UPDATE_CONVERSATION,
    UPDATE_CONVERSATION_FENCED,
    appended,
)
from ._owners import owner_gone
from ._protocol import MAX_INT64, check_int, check_tx_id, check_value
from ._sqlite_mirror import read_ended

if TYPE_CHECKING:
    import threading
    from collections.abc import Sequence

    from ._approvals import RequestRow
    from ._durable import EndedTransaction, OutboxEntry, TxImage
    from ._log_rows import Lost
    from ._plans import ListedRun, PlanChange, PlanImage, PlanNodeRow
    from ._sqlite_file import StoreFile
    from ._sqlite_mirror import TxMirror

__all__ = ["SharedTables"]


class SharedTables:
    """Plan runs, requests and the outbox of a `SQLiteStore` (see the module docstring)."""

    __slots__ = ()

    _lock: threading.Lock
    _file: StoreFile
    _cur: sqlite3.Cursor
    _owner: str
    _exclusive: bool
    _txs: dict[str, TxMirror]
    _lost: Lost
    _path: str

    if TYPE_CHECKING:  # SQLiteStore's

        def _check_not_closed(self) -> None: ...

        def _check_writable(self) -> None: ...

        def _fence(self, tx_id: str) -> None: ...

        def _durable_write(
            self,
            tx_id: str,
            doing: str,
            statement: tuple[str, tuple[object, ...]] | None,
            progress: str | None = None,
            *,
            fenced: tuple[str, tuple[object, ...]] | None = None,
        ) -> None: ...

    # ------------------------------------------------------------ plan runs

    def begin_plan(self, run_id: str, record: str, nodes: Sequence[PlanNodeRow]) -> None:
        """Write plan run `run_id` (its `record`, RUNNING, owned by this store) with its
        `nodes`, in one durable write. `InvalidArgument` if the file has that run already."""
        check_tx_id(run_id)
        check_value(record)
        self._check_writable()
        with self._lock:
            self._check_not_closed()
            with self._file.writing(f"begin plan run `{run_id}`") as cur:
                plan_tables.begin_plan(
                    cur, run_id, record, nodes, owner=self._owner, now=time.time()
                )

    def write_plan(
        self,
        run_id: str,
        changes: Sequence[PlanChange],
        *,
        status: str | None = None,
        events: Sequence[tuple[int, str]] = (),
    ) -> tuple[bool | None, ...]:
        """Make node `changes` in order (and set the run's `status`) in one durable write, if
        this store holds the run: for each change, whether it was made (False: its `expect`,
        a compare-and-set, did not hold; None: the exclusive resource it would `hold` is
        another run's; that change alone was skipped). `StorageError` if
        another store took the run over, `TransactionNotFound` if the file has no such run.
        `events` are audit events of the run, `(seq, JSON text)`, stored in the same write
        (replacing any of the same seq)."""
        for seq, text in events:
            check_int(seq, "seq", MAX_INT64)
            check_value(text)
        self._check_writable()
        with self._lock:
            self._check_not_closed()
            with self._file.writing(f"write plan run `{run_id}`") as cur:
                made = plan_tables.write_plan(
                    cur, run_id, changes, owner=self._owner, now=time.time(), status=status
                )
                if events:
                    plan_tables.write_audit(cur, run_id, events)
                return made

    def plan_holds(self) -> tuple[tuple[str, str, str, str], ...]:
        """The exclusive resources held by plan nodes of any run in the file, as `(resource,
        run_id, node_id, attempt)`, by resource."""
        with self._lock:
            self._check_not_closed()
            with self._file.reading("list the plan holds") as cur:
                return plan_tables.plan_holds(cur)

    def plan_units(self) -> tuple[tuple[str, str, str, int], ...]:
        """The units of resource capacities held by plan nodes of any run in the file, as
        `(resource, run_id, node_id, units)`."""
        with self._lock:
            self._check_not_closed()
            with self._file.reading("list the plan units") as cur:
                return plan_tables.plan_units(cur)

    def plan_rates(self) -> tuple[tuple[str, float, float], ...]:
        """The token buckets of tools' rate limits, shared by every run in the file, as
        `(tool, tokens, updated_at)`, by tool."""
        with self._lock:
            self._check_not_closed()
            with self._file.reading("list the rate buckets") as cur:
                return plan_tables.plan_rates(cur)

    def plan_audit(self, run_id: str) -> tuple[str, ...]:
        """The audit events stored for plan run `run_id` (JSON texts, `Event.to_json`), in
        seq order; empty if it has none (or no such run)."""
        check_tx_id(run_id)
        with self._lock:
            self._check_not_closed()
            with self._file.reading(f"read the audit of plan run `{run_id}`") as cur:
                return plan_tables.read_audit(cur, run_id)

    def cancel_plan(self, run_id: str, reason: str) -> bool:
        """Record that run `run_id` is cancelled, for whichever process runs it (it reads it
        before its next dispatch). False if the run has ended or was cancelled already;
        `TransactionNotFound` if the file has no such run."""
        check_tx_id(run_id)
        check_value(reason)
        self._check_writable()
        with self._lock:
            self._check_not_closed()
            with self._file.writing(f"cancel plan run `{run_id}`") as cur:
                return plan_tables.cancel_plan(cur, run_id, reason)

    def plan_cancel_reason(self, run_id: str) -> str | None:
        """The cancellation recorded for run `run_id`, or None (one indexed read)."""
        with self._lock:
            self._check_not_closed()
            try:
                return plan_tables.read_cancel(self._cur, run_id)
            except sqlite3.Error as exc:
                raise self._file.failure(f"read plan run `{run_id}`", exc) from exc

    def read_plan(self, run_id: str) -> PlanImage:
        """Plan run `run_id` as stored, read in one read transaction; `TransactionNotFound`
        if the file has no such run. Works on a read-only store."""
        check_tx_id(run_id)
        with self._lock:
            self._check_not_closed()
            with self._file.reading(f"read plan run `{run_id}`") as cur:
                return plan_tables.read_plan(cur, run_id)

    def plan_runs(self, limit: int = 100) -> tuple[tuple[str, str, float], ...]:
        """Up to `limit` plan runs as `(run_id, status, updated_at)`, the last updated first."""
        check_int(limit, "limit", MAX_INT64, minimum=1)
        with self._lock:
            self._check_not_closed()
            with self._file.reading("list the plan runs") as cur:
                return plan_tables.list_plans(cur, limit)

    def list_runs(
        self, limit: int = 50, offset: int = 0, *, kind: str | None = None
    ) -> tuple[ListedRun, ...]:
        """One page of the ended transactions kept as history and the plan runs, the latest
        first (ties by id, descending), `offset` rows skipped; `kind` ("tx" or "plan") keeps
        one kind only. Each row is `(kind, id, at, status, record, history)`: an ended
        transaction's record and history texts as kept (`status` None), or a plan run's status
        (`record`, `history` None); `at` is when it ended or last changed. One read: the page's
        keys (`LIMIT`/`OFFSET`), then its rows by primary key, so a page does not read the
        records of the others. Works on a read-only store."""

        def fetch(sql: str, values: Sequence[object]) -> list[Any]:
            return cur.execute(sql, tuple(values)).fetchall()

        with self._lock:
            self._check_not_closed()
            with self._file.reading("list the runs") as cur:
                return plan_tables.list_runs(fetch, limit, offset, kind)

    def running_plans(self) -> tuple[tuple[str, str | None], ...]:
        """The RUNNING plan runs in the file, any process's, as `(run_id, owner)`, by id."""
        with self._lock:
            self._check_not_closed()
            with self._file.reading("list the running plan runs") as cur:
                return plan_tables.running_plans(cur)

    def orphaned_plans(self) -> tuple[str, ...]:
        """The RUNNING plan runs whose owner is gone, by id: no store of this process holds
        it, and its process is not alive on this host (`owner_alive`). Works read-only."""
        return tuple(run_id for run_id, owner in self.running_plans() if owner_gone(owner))

    # ------------------------------------------------------------ history

    def ended_transactions(self, limit: int = 100) -> tuple[EndedTransaction, ...]:
        """Up to `limit` ended transactions kept as history, the last to end first (ties by
        id, descending). One indexed query; on a writable or read-only store."""
        check_int(limit, "limit", MAX_INT64, minimum=1)
        with self._lock:
            self._check_not_closed()
            return self._file.ended_transactions(limit)

    def peek_ended(self, tx_id: str) -> tuple[EndedTransaction, TxImage]:
        """Ended transaction `tx_id` kept as history: its row, and its image as it ended, read
        in one SQLite read transaction. The image's step records are the live steps at the end
        (for an aborted transaction, those the abort undid), its `owner` is `None` and its undo
        records are gone. Raises `TransactionNotFound` if the file keeps no ended `tx_id` (it
        is open, was pruned, or never was)."""
        check_tx_id(tx_id)
        with self._lock:
            self._check_not_closed()
            with self._file.reading(f"read the history of transaction `{tx_id}`") as cur:
                return read_ended(cur, tx_id, path=self._path)

    # ------------------------------------------------------------ approvals and reviews

    def add_request(self, row: RequestRow, *, fence: str | None = None) -> None:
        """Insert approval request or review `row`, durably (`RequestStore.add_request`);
        with `fence`, in the same write as the check that this store still owns it."""
        request_tables.check_request_id(row.id)
        check_value(row.record)
        self._check_writable()
        with self._lock:
            self._check_not_closed()
            with self._file.writing(f"record request `{row.id}`") as cur:
                if fence is not None:
                    self._fence_scope(cur, fence)
                request_tables.add_request(cur, row)

    def get_request(self, request_id: str) -> RequestRow | None:
        """The request with this id, or None (`RequestStore.get_request`)."""
        with self._lock:
            self._check_not_closed()
            with self._file.reading(f"read request `{request_id}`") as cur:
                return request_tables.get_request(cur, request_id)

    def requests_of(self, scope_id: str) -> tuple[RequestRow, ...]:
        """The requests of one transaction or plan run (`RequestStore.requests_of`)."""
        with self._lock:
            self._check_not_closed()
            with self._file.reading(f"read the requests of `{scope_id}`") as cur:
                return request_tables.requests_of(cur, scope_id)

    def set_request_state(
        self,
        request_id: str,
        expect: Sequence[str],
        state: str,
        *,
        decision: str | None,
        now: float,
        fence: str | None = None,
    ) -> RequestRow | None:
        """The durable compare-and-set of `RequestStore.set_request_state`: one `BEGIN
        IMMEDIATE` write, so two processes racing for one request see one of them win; with
        `fence`, the owner check is in the same write."""
        if decision is not None:
            check_value(decision)
        self._check_writable()
        with self._lock:
            self._check_not_closed()
            with self._file.writing(f"decide request `{request_id}`") as cur:
                if fence is not None:
                    self._fence_scope(cur, fence)
                return request_tables.set_request_state(
                    cur, request_id, tuple(expect), state, decision=decision, now=now
                )

    def list_requests(self, kind: str, state: str, limit: int) -> tuple[RequestRow, ...]:
        """Up to `limit` requests of `kind` in `state` (`RequestStore.list_requests`)."""
        check_int(limit, "limit", MAX_INT64, minimum=1)
        with self._lock:
            self._check_not_closed()
            with self._file.reading("list the requests") as cur:
                return request_tables.list_requests(cur, kind, state, limit)

    # ------------------------------------------------------------ conversations

    def record_conversation(
        self, tx_id: str, text: str, messages: Sequence[str] = (), *, start: int = 0
    ) -> None:
        """Record the conversation of transaction `tx_id` (`ConversationStore`): `text`, and
        `messages` from position `start` on, durably, with the buffered writes, in one
        statement (a trigger appends the messages), if this store holds it (else
        `StorageError`)."""
        check_tx_id(tx_id)
        append = appended(text, messages, start)
        self._durable_write(
            tx_id,
            "record the conversation",
            (UPDATE_CONVERSATION, (text, append, tx_id)),
            fenced=(UPDATE_CONVERSATION_FENCED, (text, append, tx_id, self._owner)),
        )

    def read_conversation(self, tx_id: str) -> str | None:
        """The conversation recorded for open transaction `tx_id`, or None
        (`ConversationStore`)."""
        check_tx_id(tx_id)
        with self._lock:
            self._check_not_closed()
            with self._file.reading(f"read the conversation of `{tx_id}`") as cur:
                rows = cur.execute(SELECT_CONVERSATION, (tx_id,)).fetchall()
        return rows[0][0] if rows else None

    def read_messages(self, tx_id: str, count: int) -> tuple[str, ...]:
        """The first `count` messages recorded for `tx_id`, in order (`ConversationStore`)."""
        check_tx_id(tx_id)
        check_int(count, "count", MAX_INT64)
        with self._lock:
            self._check_not_closed()
            with self._file.reading(f"read the messages of `{tx_id}`") as cur:
                rows = cur.execute(SELECT_MESSAGES, (tx_id, count)).fetchall()
        return tuple(row[0] for row in rows)

    # ------------------------------------------------------------ the outbox

    def pending_effects(
        self, limit: int = 100, *, tx_id: str | None = None
    ) -> tuple[OutboxEntry, ...]:
        """Up to `limit` undelivered entries (of transaction `tx_id` only, if given), in commit
        then staging order, those waiting for their `not_before` included."""
        check_int(limit, "limit", MAX_INT64, minimum=1)
        if tx_id is not None:
            check_tx_id(tx_id)
        with self._lock:
            self._check_not_closed()
            return self._file.pending_effects(limit, tx_id)

    def mark_delivered(self, entry_id: int) -> None:
        """Mark an outbox entry delivered; idempotent. `InvalidArgument` if there is none."""
        check_int(entry_id, "entry_id", MAX_INT64, minimum=1)
        self._check_writable()
        with self._lock:
            self._check_not_closed()
            self._file.mark_delivered(entry_id)

    def mark_failed(self, entry_id: int, error: str, not_before: float) -> None:
        """Count a failed delivery of an undelivered entry: keep `error`, hold it back until
        `not_before`. A no-op on a delivered entry; `InvalidArgument` if there is none."""
        check_int(entry_id, "entry_id", MAX_INT64, minimum=1)
        check_value(error)
        if (
            isinstance(not_before, bool)
            or not isinstance(not_before, (int, float))
            or not math.isfinite(not_before)
        ):
            raise InvalidArgument(f"not_before must be a finite number, got {not_before!r}")
        self._check_writable()
        with self._lock:
            self._check_not_closed()
            self._file.mark_failed(entry_id, error, float(not_before))

    def _fence_scope(self, cur: sqlite3.Cursor, scope_id: str) -> None:
        """Check, inside a write transaction, that this store still owns transaction or plan
        run `scope_id` (an exclusive store owns everything in its file); `StorageError` if not.
        """
        if self._exclusive:
            return
        lost = self._lost.error(scope_id)
        if lost is not None:
            raise lost
        if scope_id in self._txs:
            self._fence(scope_id)
            return
        if plan_tables.run_owner(cur, scope_id) != self._owner:
            raise StorageError(
                f"`{scope_id}` is not held by this store (taken over by another store, "
                "or ended): it may not start a call"
            )
