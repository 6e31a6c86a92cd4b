"""What a store keeps of approval requests and reviews, and the SQL that keeps it in SQLite.

A request is one row: its id, its kind (`approval` or `review`), the transaction or plan run it
belongs to (`scope_id`), its state, the digest of the call it is about, and two JSON texts the
approvals layer writes and reads, opaque here: the request (`record`) and what was decided
(`decision`). Every change of state is a compare-and-set (`set_request_state`): it happens only
from the states the caller expects, in one write, so two processes that race to approve, reject
or consume one request see exactly one of them succeed. A write that starts a call (consuming an
approval, or recording a call's start) is fenced: given `fence`, the id of the transaction or plan
run making it, a durable store makes it only while it still holds that scope (its lease, or its
ownership of the run), checked in the same database transaction, and raises `StorageError` with
nothing changed otherwise, so a worker that lost its run can never start the call.
`MemoryRequests` keeps the same rows in process memory, for `MemoryStore` and for stores without
a table of their own; `SQLiteStore` keeps them in table `requests` of its file (schema version
5, `REQUEST_TABLES`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Final, Protocol, final, runtime_checkable

import attrs

from .._errors import InvalidArgument

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Sequence

__all__ = [
    "REQUEST_TABLES",
    "MemoryRequests",
    "RequestRow",
    "RequestStore",
    "add_request",
    "get_request",
    "list_requests",
    "requests_of",
    "set_request_state",
]

#: The migration that adds the requests table (schema version 4 -> 5).
REQUEST_TABLES: Final = (
    (
        "CREATE TABLE requests (id TEXT NOT NULL PRIMARY KEY, kind TEXT NOT NULL, "
        "scope_id TEXT NOT NULL, state TEXT NOT NULL, digest TEXT NOT NULL, "
        "record TEXT NOT NULL, decision TEXT, created_at REAL NOT NULL, "
        "updated_at REAL NOT NULL) WITHOUT ROWID"
    ),
    "CREATE INDEX requests_scope ON requests (scope_id)",
    "CREATE INDEX requests_state ON requests (kind, state)",
)

#: The longest request id accepted (characters).
MAX_REQUEST_ID: Final = 128


def _text(_instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str):
        raise InvalidArgument(f"{attribute.name} must be text, not {type(value).__name__}")


def _optional_text(
    _instance: object, attribute: attrs.Attribute[str | None], value: object
) -> None:
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"{attribute.name} must be text or None, not {type(value).__name__}")


@final
@attrs.frozen(kw_only=True)
class RequestRow:
    """One approval request or review as a store keeps it (JSON texts opaque to the store)."""

    id: str = attrs.field(validator=_text)
    kind: str = attrs.field(validator=_text)
    scope_id: str = attrs.field(validator=_text)
    state: str = attrs.field(validator=_text)
    digest: str = attrs.field(validator=_text)
    record: str = attrs.field(validator=_text)
    decision: str | None = attrs.field(default=None, validator=_optional_text)
    created_at: float = 0.0
    updated_at: float = 0.0


@runtime_checkable
class RequestStore(Protocol):
    """A store that keeps approval requests and reviews (`MemoryStore`, `SQLiteStore`).

    Every method is atomic and safe to call from any thread; on a durable store each write is
    durable when it returns, and visible to every process that opens the store.
    """

    def add_request(self, row: RequestRow, *, fence: str | None = None) -> None:
        """Insert `row`; `InvalidArgument` if a request with its id exists already. With
        `fence`, only while this store holds that transaction or plan run (`StorageError`
        otherwise; stores without owners ignore it)."""
        ...

    def get_request(self, request_id: str) -> RequestRow | None:
        """The request with this id, or None."""
        ...

    def requests_of(self, scope_id: str) -> tuple[RequestRow, ...]:
        """Every request of transaction or plan run `scope_id`, oldest first."""
        ...

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
        """Compare-and-set: if the request is in one of the states `expect`, move it to
        `state` with `decision` and return the new row; else change nothing and return None.
        With `fence`, the change is made only while this store holds that transaction or plan
        run, checked in the same database transaction: `StorageError` otherwise, with nothing
        changed (stores without owners ignore it)."""
        ...

    def list_requests(self, kind: str, state: str, limit: int) -> tuple[RequestRow, ...]:
        """Up to `limit` requests of `kind` in `state`, oldest first (any scope)."""
        ...


@final
class MemoryRequests:
    """`RequestStore` in process memory: a dict under a lock."""

    __slots__ = ("_lock", "_rows")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, RequestRow] = {}

    def add_request(self, row: RequestRow, *, fence: str | None = None) -> None:  # noqa: ARG002
        """See `RequestStore.add_request` (in one process there is no owner to fence)."""
        check_request_id(row.id)
        with self._lock:
            if row.id in self._rows:
                raise InvalidArgument(f"request `{row.id}` exists already")
            self._rows[row.id] = row

    def get_request(self, request_id: str) -> RequestRow | None:
        """See `RequestStore.get_request`."""
        with self._lock:
            return self._rows.get(request_id)

    def requests_of(self, scope_id: str) -> tuple[RequestRow, ...]:
        """See `RequestStore.requests_of`."""
        with self._lock:
            return tuple(row for row in self._rows.values() if row.scope_id == scope_id)

    def set_request_state(
        self,
        request_id: str,
        expect: Sequence[str],
        state: str,
        *,
        decision: str | None,
        now: float,
        fence: str | None = None,  # noqa: ARG002  (in one process there is no owner to fence)
    ) -> RequestRow | None:
        """See `RequestStore.set_request_state`."""
        with self._lock:
            row = self._rows.get(request_id)
            if row is None or row.state not in expect:
                return None
            row = attrs.evolve(row, state=state, decision=decision, updated_at=now)
            self._rows[request_id] = row
            return row

    def list_requests(self, kind: str, state: str, limit: int) -> tuple[RequestRow, ...]:
        """See `RequestStore.list_requests`."""
        with self._lock:
            rows = [row for row in self._rows.values() if row.kind == kind and row.state == state]
        return tuple(rows[:limit])


def check_request_id(request_id: object) -> None:
    """Raise `InvalidArgument` unless `request_id` is text of 1-128 characters."""
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= MAX_REQUEST_ID:
        raise InvalidArgument(f"a request id must be 1-{MAX_REQUEST_ID} characters")


# ------------------------------------------------------------ SQL (run inside a write or read)

_COLUMNS: Final = "id, kind, scope_id, state, digest, record, decision, created_at, updated_at"


def _row(values: tuple[object, ...]) -> RequestRow:
    (id_, kind, scope_id, state, digest, record, decision, created, updated) = values
    return RequestRow(
        id=str(id_),
        kind=str(kind),
        scope_id=str(scope_id),
        state=str(state),
        digest=str(digest),
        record=str(record),
        decision=None if decision is None else str(decision),
        created_at=float(created),  # type: ignore[arg-type]
        updated_at=float(updated),  # type: ignore[arg-type]
    )


def add_request(cur: sqlite3.Cursor, row: RequestRow) -> None:
    """Insert `row`; `InvalidArgument` if its id exists already."""
    if cur.execute("SELECT 1 FROM requests WHERE id = ?", (row.id,)).fetchall():
        raise InvalidArgument(f"request `{row.id}` exists already")
    cur.execute(
        f"INSERT INTO requests ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
        (
            row.id,
            row.kind,
            row.scope_id,
            row.state,
            row.digest,
            row.record,
            row.decision,
            row.created_at,
            row.updated_at,
        ),
    )


def get_request(cur: sqlite3.Cursor, request_id: str) -> RequestRow | None:
    """The row with this id, or None."""
    rows = cur.execute(
        f"SELECT {_COLUMNS} FROM requests WHERE id = ?",  # noqa: S608
        (request_id,),
    ).fetchall()
    return _row(rows[0]) if rows else None


def requests_of(cur: sqlite3.Cursor, scope_id: str) -> tuple[RequestRow, ...]:
    """The rows of one scope, oldest first."""
    rows = cur.execute(
        f"SELECT {_COLUMNS} FROM requests WHERE scope_id = ? ORDER BY created_at, id",  # noqa: S608
        (scope_id,),
    ).fetchall()
    return tuple(_row(row) for row in rows)


def set_request_state(
    cur: sqlite3.Cursor,
    request_id: str,
    expect: Sequence[str],
    state: str,
    *,
    decision: str | None,
    now: float,
) -> RequestRow | None:
    """The compare-and-set of `RequestStore.set_request_state` (inside a write transaction)."""
    marks = ", ".join("?" for _ in expect)
    changed: int = cur.execute(
        f"UPDATE requests SET state = ?, decision = ?, updated_at = ? "  # noqa: S608
        f"WHERE id = ? AND state IN ({marks})",
        (state, decision, now, request_id, *expect),
    ).rowcount
    return get_request(cur, request_id) if changed else None


def list_requests(cur: sqlite3.Cursor, kind: str, state: str, limit: int) -> tuple[RequestRow, ...]:
    """Up to `limit` rows of `kind` in `state`, oldest first."""
    rows = cur.execute(
        f"SELECT {_COLUMNS} FROM requests WHERE kind = ? AND state = ? "  # noqa: S608
        "ORDER BY created_at, id LIMIT ?",
        (kind, state, limit),
    ).fetchall()
    return tuple(_row(row) for row in rows)
