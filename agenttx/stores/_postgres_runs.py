"""Plan runs, approvals and the outbox of `PostgresStore`: the rows every worker shares.

`SharedRows` is the part of the store that holds no transaction's mirror: plan runs (their own
lease and epoch, renewed with the transactions', and a compare-and-set per node change) and the
outbox (claims with `FOR UPDATE SKIP LOCKED`, so that dispatchers on several workers deliver
disjoint entries), and approval requests and reviews (each state change one conditional update,
so two workers racing to decide or consume a request see one of them win). `PostgresStore`
inherits it; the attributes it uses are the store's.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Final

from .._errors import InvalidArgument, StorageError, TransactionNotFound
from ._approvals import RequestRow, check_request_id
from ._bell import PLAIN_BELL, Bell, ListeningBell
from ._conversations import appended
from ._durable import OutboxEntry
from ._plans import PlanImage, PlanNodeRow, list_runs
from ._postgres_schema import HOLDS_LOCK
from ._protocol import MAX_INT64, check_int, check_tx_id, check_value

if TYPE_CHECKING:
    import threading
    from collections.abc import Sequence

    import psycopg

    from ._log_rows import Lost
    from ._plans import ListedRun, PlanChange
    from ._postgres_link import Link, Renewer
    from ._postgres_schema import Sql

__all__ = ["OUTBOX_HOLD", "SharedRows", "check_number", "first_row"]

#: How long a dispatcher's claim on an outbox entry lasts by default (seconds).
OUTBOX_HOLD: Final = 60.0
_RUNNING: Final = "RUNNING"


def check_number(value: object, what: str, *, minimum: float, allow_none: bool = False) -> None:
    """`InvalidArgument` unless `value` is a finite number >= `minimum` (or None, if allowed)."""
    if value is None and allow_none:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not minimum <= value < math.inf
    ):
        raise InvalidArgument(f"{what} must be a finite number >= {minimum:g}, got {value!r}")


class SharedRows:
    """Plan runs, the outbox and the requests on the store's connection (see the module
    docstring)."""

    _schema: str
    _closed: bool
    _lock: threading.Lock
    _link: Link
    _sql: Sql
    _owner: str
    _lease: float
    _plans: dict[str, int]
    _epochs: dict[str, int]
    _lost: Lost
    _renewer: Renewer
    _bell: ListeningBell
    _outbox_hold: float

    if TYPE_CHECKING:  # PostgresStore's: the fence of a transaction's write, a durable write

        def _fence(self, cur: psycopg.Cursor[Any], tx_id: str) -> None: ...

        def _durable_write(
            self,
            tx_id: str,
            doing: str,
            statement: tuple[str, tuple[object, ...]] | None,
            progress: str | None = None,
        ) -> None: ...

    # ------------------------------------------------------------ plan runs

    def begin_plan(self, run_id: str, record: str, nodes: Sequence[PlanNodeRow]) -> None:
        """Write plan run `run_id` (RUNNING, held by this store under a lease) with its
        `nodes`, in one transaction. `InvalidArgument` if the database has that run."""
        check_tx_id(run_id)
        check_value(record)
        nodes = list(nodes)
        sql = self._sql
        now = time.time()
        with self._lock:
            self._check_not_closed()
            with self._link.transaction(f"begin plan run `{run_id}`") as cur:
                cur.execute(sql.insert_plan, (run_id, record, self._owner, self._lease, now, now))
                row = cur.fetchone()
                if row is None:
                    raise InvalidArgument(f"plan run `{run_id}` exists in the store already")
                cur.execute(
                    sql.insert_nodes,
                    (
                        run_id,
                        [n.node_id for n in nodes],
                        [n.state for n in nodes],
                        [n.attempt for n in nodes],
                        [n.record for n in nodes],
                    ),
                )
            self._plans[run_id] = row[0]
        self._renewer.start()

    def write_plan(
        self,
        run_id: str,
        changes: Sequence[PlanChange],
        *,
        status: str | None = None,
        events: Sequence[tuple[int, str]] = (),
    ) -> tuple[bool | None, ...]:
        """Make node `changes` in order (and set the run's `status`) in one transaction,
        fenced by the run's epoch: for each change, whether it was made (False: its `expect`,
        a compare-and-set, did not hold; None: the exclusive resource it would `hold` is
        another run's (the primary key of `plan_holds` decides); that change alone was
        skipped). An ended `status` frees the run's holds. `StorageError` if
        this store does not hold the run (its lease was lost), `TransactionNotFound` if there is
        no such run; then nothing is written. `events` are audit events of the run, `(seq, JSON
        text)`, stored in the same transaction (replacing any of the same seq)."""
        changes = list(changes)
        events = list(events)
        for seq, text in events:
            check_int(seq, "seq", MAX_INT64)
            check_value(text)
        sql = self._sql
        now = time.time()
        with self._lock:
            self._check_not_closed()
            with self._link.transaction(f"write plan run `{run_id}`") as cur:
                cur.execute(sql.plan_fence, (now, status, run_id, self._plans.get(run_id, 0)))
                if cur.rowcount != 1:
                    cur.execute(sql.select_plan_exists, (run_id,))
                    if cur.fetchone() is None:
                        raise TransactionNotFound(tx_id=run_id)
                    self._plans.pop(run_id, None)
                    raise StorageError(
                        f"plan run `{run_id}` was taken over by another store (lease lost): "
                        "this store no longer holds it"
                    )
                ending = status is not None and status != _RUNNING
                if ending or any(c.hold or c.units or c.rate or c.release for c in changes):
                    # Every write that takes or frees holds or units does so under one lock
                    # per schema, taken after its run's row: no two wait on each other.
                    cur.execute(sql.lock_holds, (HOLDS_LOCK, self._schema))
                made = self._change_nodes(cur, run_id, changes, now)
                if ending:
                    cur.execute(sql.unhold_run, (run_id,))
                    cur.execute(sql.ununits_run, (run_id,))
                if events:
                    cur.execute(
                        sql.upsert_audit,
                        (run_id, [seq for seq, _ in events], [text for _, text in events]),
                    )
            if status is not None and status != _RUNNING:
                self._plans.pop(run_id, None)
        return made

    def _change_nodes(
        self, cur: psycopg.Cursor[Any], run_id: str, changes: list[PlanChange], now: float
    ) -> tuple[bool | None, ...]:
        """Make `changes` in order: runs of unconditional changes of distinct nodes in one
        statement, each compare-and-set (and each hold or release) in one of its own."""
        sql = self._sql
        made: list[bool | None] = []
        batch: list[PlanChange] = []

        def flush() -> None:
            if batch:
                cur.execute(
                    sql.update_nodes,
                    (
                        [c.node_id for c in batch],
                        [c.state for c in batch],
                        [c.attempt for c in batch],
                        [c.append for c in batch],
                        run_id,
                    ),
                )
                batch.clear()

        for change in changes:
            expect = change.expect
            if expect is None:
                if any(c.node_id == change.node_id for c in batch):
                    flush()  # one statement updates a row once: keep a node's changes apart
                batch.append(change)
                made.append(True)
                if change.release:
                    flush()
                    cur.execute(sql.unhold, (run_id, change.node_id))
                    cur.execute(sql.ununits, (run_id, change.node_id))
                continue
            flush()
            if expect.node_id != change.node_id:
                raise InvalidArgument(f"a change of node `{change.node_id}` expects another node")
            hold = change.hold
            if hold is not None:
                if change.attempt is None:
                    raise InvalidArgument(f"a hold of node `{change.node_id}` needs its attempt")
                cur.execute(sql.hold, (hold, run_id, change.node_id, change.attempt, now))
                if cur.rowcount != 1:
                    made.append(None)
                    continue
            if (change.units and not self._take_units(cur, run_id, change, now)) or (
                change.rate is not None and not self._take_token(cur, change.rate)
            ):
                cur.execute(sql.unhold_attempt, (run_id, change.node_id, change.attempt))
                cur.execute(sql.ununits, (run_id, change.node_id))
                made.append(None)
                continue
            cur.execute(
                sql.update_node_if,
                (
                    change.state,
                    change.attempt,
                    change.append,
                    run_id,
                    change.node_id,
                    expect.attempt,
                    list(expect.states),
                ),
            )
            ok = cur.rowcount == 1
            if not ok and (hold is not None or change.units or change.rate is not None):
                cur.execute(sql.unhold_attempt, (run_id, change.node_id, change.attempt))
                cur.execute(sql.ununits, (run_id, change.node_id))
                if change.rate is not None:
                    cur.execute(sql.give_token, (change.rate[2], change.rate[0]))
            elif ok and change.release:
                cur.execute(sql.unhold, (run_id, change.node_id))
                cur.execute(sql.ununits, (run_id, change.node_id))
            made.append(ok)
        flush()
        return tuple(made)

    def _take_units(
        self, cur: psycopg.Cursor[Any], run_id: str, change: PlanChange, now: float
    ) -> bool:
        """Take the claim's units if every capacity has room (under the holds lock)."""
        sql = self._sql
        for resource, units, capacity in change.units:
            cur.execute(sql.used_units, (resource, run_id, change.node_id))
            if int(first_row(cur)[0]) + units > capacity:
                return False
        cur.execute(
            sql.take_units,
            (
                run_id,
                change.node_id,
                change.attempt,
                now,
                [resource for resource, _, _ in change.units],
                [units for _, units, _ in change.units],
            ),
        )
        return True

    def _take_token(self, cur: psycopg.Cursor[Any], rate: tuple[str, float, int]) -> bool:
        """Take a token from the tool's bucket if it has one (see `Sql.take_token`)."""
        tool, per_second, burst = rate
        cur.execute(self._sql.take_token, (tool, burst, burst, per_second, burst, per_second))
        return cur.fetchone() is not None

    def plan_rates(self) -> tuple[tuple[str, float, float], ...]:
        """The token buckets of tools' rate limits, shared by every run, as `(tool, tokens,
        updated_at)` (the server's clock, seconds since the epoch), by tool."""
        with self._lock:
            self._check_not_closed()
            rows = self._all("list the rate buckets", self._sql.select_rates, ())
        return tuple((tool, float(tokens), float(at)) for tool, tokens, at in rows)

    def plan_units(self) -> tuple[tuple[str, str, str, int], ...]:
        """The units of resource capacities held by plan nodes of any run, any worker's, as
        `(resource, run_id, node_id, units)`."""
        with self._lock:
            self._check_not_closed()
            rows = self._all("list the plan units", self._sql.select_units, ())
        return tuple((resource, run, node, int(units)) for resource, run, node, units in rows)

    def plan_holds(self) -> tuple[tuple[str, str, str, str], ...]:
        """The exclusive resources held by plan nodes of any run, any worker's, as
        `(resource, run_id, node_id, attempt)`, by resource."""
        with self._lock:
            self._check_not_closed()
            rows = self._all("list the plan holds", self._sql.select_holds, ())
        return tuple((resource, run, node, attempt) for resource, run, node, attempt in rows)

    def plan_audit(self, run_id: str) -> tuple[str, ...]:
        """The audit events stored for plan run `run_id` (JSON texts), in seq order; empty if
        it has none (or there is no such run)."""
        check_tx_id(run_id)
        with self._lock:
            self._check_not_closed()
            rows = self._all(
                f"read the audit of plan run `{run_id}`", self._sql.select_audit, (run_id,)
            )
        return tuple(row[0] for row in rows)

    # ------------------------------------------------------------ approvals and reviews

    def add_request(self, row: RequestRow, *, fence: str | None = None) -> None:
        """Insert approval request or review `row`, durably; `InvalidArgument` if its id
        exists already (`RequestStore.add_request`); with `fence`, in the transaction that
        checks this store's lease on it."""
        check_request_id(row.id)
        check_value(row.record)
        values = (
            row.id,
            row.kind,
            row.scope_id,
            row.state,
            row.digest,
            row.record,
            row.decision,
            row.created_at,
            row.updated_at,
        )
        with self._lock:
            self._check_not_closed()
            with self._link.transaction(f"record request `{row.id}`") as cur:
                if fence is not None:
                    self._fence_scope(cur, fence)
                cur.execute(self._sql.insert_request, values)
                if cur.rowcount != 1:
                    raise InvalidArgument(f"request `{row.id}` exists already")

    def get_request(self, request_id: str) -> RequestRow | None:
        """The request with this id, or None (`RequestStore.get_request`)."""
        with self._lock:
            self._check_not_closed()
            row = self._one(f"read request `{request_id}`", self._sql.select_request, (request_id,))
        return None if row is None else _request(row)

    def requests_of(self, scope_id: str) -> tuple[RequestRow, ...]:
        """The requests of one transaction or plan run, oldest first."""
        with self._lock:
            self._check_not_closed()
            rows = self._all(
                f"read the requests of `{scope_id}`", self._sql.select_requests_of, (scope_id,)
            )
        return tuple(_request(row) for row in rows)

    def decision_bell(self) -> Bell:
        """What a wait for people's decisions on this store sleeps on: it wakes as a request
        of the schema changes state, decided by any process (`LISTEN`/`NOTIFY`, see
        `_bell`); the plain bell once the store is closed."""
        return PLAIN_BELL if self._closed else self._bell

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
        """The compare-and-set of `RequestStore.set_request_state`: one conditional update,
        so of several workers racing to approve, reject or consume one request, one wins;
        with `fence`, in the transaction that checks this store's lease on it first."""
        if decision is not None:
            check_value(decision)
        values = (state, decision, now, request_id, list(expect))
        doing = f"decide request `{request_id}`"
        with self._lock:
            self._check_not_closed()
            if fence is None:
                row = self._one(doing, self._sql.set_request_state, values)
            else:
                with self._link.transaction(doing) as cur:
                    self._fence_scope(cur, fence)
                    cur.execute(self._sql.set_request_state, values)
                    row = cur.fetchone()
        return None if row is None else _request(row)

    def _fence_scope(self, cur: psycopg.Cursor[Any], scope_id: str) -> None:
        """Inside a transaction: lock transaction or plan run `scope_id` against a takeover
        while it still has this store's epoch; else raise `StorageError` (lease lost)."""
        lost = self._lost.error(scope_id)
        if lost is not None:
            raise lost
        if scope_id in self._epochs:
            self._fence(cur, scope_id)
            return
        epoch = self._plans.get(scope_id)
        if epoch is not None:
            cur.execute(self._sql.plan_key_share, (scope_id, epoch))
            if cur.fetchone() is not None:
                return
            self._plans.pop(scope_id, None)
        raise StorageError(
            f"`{scope_id}` is not held by this store (lease lost, or it has ended): "
            "it may not start a call"
        )

    # ------------------------------------------------------------ conversations

    def record_conversation(
        self, tx_id: str, text: str, messages: Sequence[str] = (), *, start: int = 0
    ) -> None:
        """Record the conversation of transaction `tx_id` (`ConversationStore`): `text`, and
        `messages` from position `start` on, with the buffered writes, in one transaction
        fenced by this store's epoch (the state and the messages in one statement)."""
        check_tx_id(tx_id)
        appended(text, messages, start)
        texts = list(messages)
        values = (text, tx_id, start + len(texts), start, texts)
        self._durable_write(
            tx_id, "record the conversation", (self._sql.update_conversation, values)
        )

    def read_conversation(self, tx_id: str) -> str | None:
        """The conversation recorded for open transaction `tx_id`, or None."""
        check_tx_id(tx_id)
        with self._lock:
            self._check_not_closed()
            row = self._one(
                f"read the conversation of `{tx_id}`", self._sql.select_conversation, (tx_id,)
            )
        return None if row is None else row[0]

    def read_messages(self, tx_id: str, count: int) -> tuple[str, ...]:
        """The first `count` messages recorded for `tx_id`, in order (`ConversationStore`)."""
        check_tx_id(tx_id)
        check_int(count, "count", MAX_INT64)
        with self._lock:
            self._check_not_closed()
            rows = self._all(
                f"read the messages of `{tx_id}`", self._sql.select_messages, (tx_id, count)
            )
        return tuple(row[0] for row in rows)

    def list_requests(self, kind: str, state: str, limit: int) -> tuple[RequestRow, ...]:
        """Up to `limit` requests of `kind` in `state`, oldest first (any scope)."""
        check_int(limit, "limit", MAX_INT64, minimum=1)
        with self._lock:
            self._check_not_closed()
            rows = self._all("list the requests", self._sql.list_requests, (kind, state, limit))
        return tuple(_request(row) for row in rows)

    def cancel_plan(self, run_id: str, reason: str) -> bool:
        """Record that run `run_id` is cancelled, for whichever worker runs it. False if it
        has ended or was cancelled already; `TransactionNotFound` if there is no such run."""
        check_tx_id(run_id)
        check_value(reason)
        with self._lock:
            self._check_not_closed()
            with self._link.transaction(f"cancel plan run `{run_id}`") as cur:
                cur.execute(self._sql.cancel_plan, (reason, run_id))
                if cur.rowcount:
                    return True
                cur.execute(self._sql.select_plan_exists, (run_id,))
                if cur.fetchone() is None:
                    raise TransactionNotFound(tx_id=run_id)
                return False

    def plan_cancel_reason(self, run_id: str) -> str | None:
        """The cancellation recorded for run `run_id`, or None (one indexed read)."""
        with self._lock:
            self._check_not_closed()
            row = self._one(f"read plan run `{run_id}`", self._sql.select_cancel, (run_id,))
        return None if row is None else row[0]

    def read_plan(self, run_id: str) -> PlanImage:
        """Plan run `run_id` as stored, read in one snapshot; `TransactionNotFound` if absent."""
        check_tx_id(run_id)
        with self._lock:
            self._check_not_closed()
            with self._link.transaction(f"read plan run `{run_id}`", snapshot=True) as cur:
                return self._read_plan(cur, run_id)

    def _read_plan(self, cur: psycopg.Cursor[Any], run_id: str) -> PlanImage:
        cur.execute(self._sql.select_plan, (run_id,))
        run = cur.fetchone()
        if run is None:
            raise TransactionNotFound(tx_id=run_id)
        record, status, owner, cancel, created_at, updated_at = run
        cur.execute(self._sql.select_plan_nodes, (run_id,))
        return PlanImage(
            run_id=run_id,
            record=record,
            status=status,
            owner=owner,
            cancel=cancel,
            created_at=created_at,
            updated_at=updated_at,
            nodes=tuple(
                PlanNodeRow(node_id=node_id, state=state, attempt=attempt, record=text)
                for node_id, state, attempt, text in cur.fetchall()
            ),
        )

    def plan_runs(self, limit: int = 100) -> tuple[tuple[str, str, float], ...]:
        """Up to `limit` plan runs as `(run_id, status, updated_at)`, the last updated first."""
        check_int(limit, "limit", MAX_INT64, minimum=1)
        with self._lock:
            self._check_not_closed()
            rows = self._all("list the plan runs", self._sql.list_plans, (limit,))
        return tuple((run_id, status, updated_at) for run_id, status, updated_at in rows)

    def list_runs(
        self, limit: int = 50, offset: int = 0, *, kind: str | None = None
    ) -> tuple[ListedRun, ...]:
        """One page of the ended transactions kept as history and the plan runs, the latest
        first, in one snapshot (`SQLiteStore.list_runs` says the rest)."""

        def fetch(sql: str, values: Sequence[object]) -> list[Any]:
            cur.execute(sql, tuple(values))
            return cur.fetchall()

        with self._lock:
            self._check_not_closed()
            with self._link.transaction("list the runs", snapshot=True) as cur:
                return list_runs(
                    fetch, limit, offset, kind, dialect="postgres", schema=f"{self._schema}."
                )

    def running_plans(self) -> tuple[tuple[str, str | None], ...]:
        """The RUNNING plan runs, any worker's, as `(run_id, owner)`, by id."""
        with self._lock:
            self._check_not_closed()
            rows = self._all("list the running plan runs", self._sql.running_plans, ())
        return tuple((run_id, owner) for run_id, owner in rows)

    def orphaned_plans(self) -> tuple[str, ...]:
        """The RUNNING plan runs whose lease has expired (by the server's clock), by id: those
        a recovery's `claim_plan` would take over now."""
        with self._lock:
            self._check_not_closed()
            rows = self._all("list the orphaned plan runs", self._sql.orphaned_plans, ())
        return tuple(run_id for (run_id,) in rows)

    def claim_plan(self, run_id: str, owner: str | None) -> PlanImage | None:
        """Take RUNNING run `run_id` over if its owner is still `owner` and its lease has
        expired (a compare-and-set with `FOR UPDATE SKIP LOCKED`, for recovery): its image, or
        None. The dead runner's holds of exclusive resources are freed in the same
        transaction (the new runner claims its nodes, and their holds, again)."""
        check_tx_id(run_id)
        with self._lock:
            self._check_not_closed()
            with self._link.transaction(f"claim plan run `{run_id}`") as cur:
                cur.execute(self._sql.claim_plan, (self._owner, self._lease, run_id, owner))
                row = cur.fetchone()
                if row is None:
                    return None
                cur.execute(self._sql.lock_holds, (HOLDS_LOCK, self._schema))
                cur.execute(self._sql.unhold_run, (run_id,))  # the dead runner's holds
                cur.execute(self._sql.ununits_run, (run_id,))
                image = self._read_plan(cur, run_id)
            self._plans[run_id] = row[0]
        self._renewer.start()
        return image

    # ------------------------------------------------------------ the outbox

    def pending_effects(
        self, limit: int = 100, *, tx_id: str | None = None
    ) -> tuple[OutboxEntry, ...]:
        """Up to `limit` undelivered entries (of transaction `tx_id` only, if given), in commit
        then staging order, those waiting for their `not_before` (or claimed) included."""
        check_int(limit, "limit", MAX_INT64, minimum=1)
        if tx_id is not None:
            check_tx_id(tx_id)
        sql = self._sql
        with self._lock:
            self._check_not_closed()
            rows = self._all(
                "read the outbox",
                sql.select_pending if tx_id is None else sql.select_pending_of,
                (limit,) if tx_id is None else (tx_id, limit),
            )
        return tuple(_entry(row) for row in rows)

    def claim_effects(
        self,
        limit: int = 100,
        *,
        tx_id: str | None = None,
        now: float | None = None,
        hold: float | None = None,
    ) -> tuple[OutboxEntry, ...]:
        """Claim up to `limit` due undelivered entries for this dispatcher, in order, for
        `hold` seconds, with `FOR UPDATE SKIP LOCKED`: dispatchers running at once get
        disjoint entries, and an entry claimed and not marked within `hold` is offered again.
        `now` is the caller's clock (seconds since the epoch; default `time.time()`); `hold`
        defaults to the store's `outbox_hold`. `Engine.dispatch_pending` and the delivery after
        a commit claim this way."""
        check_int(limit, "limit", MAX_INT64, minimum=1)
        if tx_id is not None:
            check_tx_id(tx_id)
        hold = self._outbox_hold if hold is None else hold
        check_number(hold, "hold", minimum=0)
        at = time.time() if now is None else float(now)
        sql = self._sql
        with self._lock:
            self._check_not_closed()
            values: tuple[object, ...]
            if tx_id is None:
                statement, values = sql.claim_outbox, (self._owner, at + hold, at, at, limit)
            else:
                statement = sql.claim_outbox_of
                values = (self._owner, at + hold, at, at, tx_id, limit)
            rows = self._all("claim outbox entries", statement, values)
        return tuple(sorted((_entry(row) for row in rows), key=lambda e: e.id))

    def mark_delivered(self, entry_id: int) -> None:
        """Mark an outbox entry delivered; idempotent. `InvalidArgument` if there is none."""
        check_int(entry_id, "entry_id", MAX_INT64, minimum=1)
        self._update_outbox(entry_id, self._sql.mark_delivered, ())

    def mark_failed(self, entry_id: int, error: str, not_before: float) -> None:
        """Count a failed delivery: keep `error`, hold it back until `not_before`, release the
        claim. A no-op on a delivered entry; `InvalidArgument` if there is none."""
        check_int(entry_id, "entry_id", MAX_INT64, minimum=1)
        check_value(error)
        if (
            isinstance(not_before, bool)
            or not isinstance(not_before, (int, float))
            or not math.isfinite(not_before)
        ):
            raise InvalidArgument(f"not_before must be a finite number, got {not_before!r}")
        self._update_outbox(entry_id, self._sql.mark_failed, (error, float(not_before)))

    def _update_outbox(self, entry_id: int, sql: str, values: tuple[object, ...]) -> None:
        with self._lock:
            self._check_not_closed()
            with self._link.transaction(f"update outbox entry {entry_id}") as cur:
                cur.execute(sql, (*values, entry_id))
                if cur.rowcount == 0:
                    cur.execute(self._sql.select_outbox_entry, (entry_id,))
                    if cur.fetchone() is None:
                        raise InvalidArgument(f"there is no outbox entry {entry_id}")

    def _check_not_closed(self) -> None:
        if self._closed:
            raise StorageError(f"the PostgresStore for schema `{self._schema}` is closed")

    def _one(self, doing: str, sql: str, values: Sequence[object]) -> tuple[Any, ...] | None:
        """One statement alone (its own transaction); its first row, or None."""
        try:
            cur = self._link.cursor(doing)
            cur.execute(sql, values)
            row: tuple[Any, ...] | None = cur.fetchone()
        except self._link.psycopg.Error as exc:
            raise self._link.failure(doing, exc) from exc
        return row

    def _all(self, doing: str, sql: str, values: Sequence[object]) -> list[tuple[Any, ...]]:
        """One statement alone (its own transaction); all its rows."""
        try:
            cur = self._link.cursor(doing)
            cur.execute(sql, values)
            rows: list[tuple[Any, ...]] = cur.fetchall()
        except self._link.psycopg.Error as exc:
            raise self._link.failure(doing, exc) from exc
        return rows


def first_row(cur: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    row: tuple[Any, ...] | None = cur.fetchone()
    if row is None:  # pragma: no cover - the statements that call this always return a row
        raise StorageError("the database returned no row where one was expected")
    return row


def _entry(row: tuple[Any, ...]) -> OutboxEntry:
    return OutboxEntry(
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


def _request(row: tuple[Any, ...]) -> RequestRow:
    id_, kind, scope_id, state, digest, record, decision, created, updated = row
    return RequestRow(
        id=id_,
        kind=kind,
        scope_id=scope_id,
        state=state,
        digest=digest,
        record=record,
        decision=decision,
        created_at=float(created),
        updated_at=float(updated),
    )
