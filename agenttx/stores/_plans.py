"""What a durable store keeps of a plan run, and the SQL that keeps it in `SQLiteStore`'s file.

A plan run is one row of `plan_runs` (its record, status, owner and any cancellation) and one
row per node in `plan_nodes` (its state, the attempt that holds it, and its record: text the
plan layer writes and reads, opaque here). They live in the store's one file, beside the
transactions' `log` (schema version 4). A write (`write_plan`) is one SQLite write transaction
of any number of node changes, so a run never shows a node's new state without the rest of the
transitions written with it. A change appends to the node's record (`record || ?`) rather than
replacing it: the plan layer appends one line per transition, so the cost of a transition does
not grow with the node's history. Writes are fenced by owner (a runner that lost its run to a
recoverer changes nothing), and a change can carry a compare-and-set (`expect`): a claim
succeeds only if the node is still in the states given with the attempt given, so only one
claim of a node succeeds. The statements are constant texts, so SQLite's statement cache
prepares each once per connection.

A node's exclusive resource (`order:7`) is held across runs through a row of `plan_holds`
(schema version 6), keyed by the resource: a claim that carries `hold` inserts it in the same
write, and is refused (its result None, nothing of it written) when another run's node holds
the resource; the file's write lock makes the check and the insert one step. A change with
`release` deletes the node's hold, the run's end deletes all of its holds, and a recoverer's
takeover (`claim_plan`) frees the dead runner's.

A resource's capacity (`resources={"payments_api": 1}`) is counted across runs the same way:
a claim that carries `units` (`(resource, units, capacity)`) adds rows to `plan_units`
(schema version 7) only if the units every other node of any run holds, plus its own, stay
within the capacity; otherwise it is refused like a held claim. Its units are freed with its
hold.

A tool's rate limit is counted across runs too: a claim that carries `rate` (`(tool,
per_second, burst)`) takes a token from the tool's bucket in `plan_rates` (schema version 8),
refilled since its last take at the claim's `per_second` up to its `burst`, full at first; an
empty bucket refuses the claim like a held one, and a claim refused for another reason gives
its token back in the same write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, TypeAlias, final

import attrs

from .._errors import InvalidArgument, StorageError, TransactionNotFound
from ._protocol import MAX_INT64, check_int, check_value

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable, Sequence

__all__ = [
    "PLAN_AUDIT_TABLES",
    "PLAN_HOLD_TABLES",
    "PLAN_RATE_TABLES",
    "PLAN_TABLES",
    "PLAN_UNIT_TABLES",
    "ListedRun",
    "PlanChange",
    "PlanExpect",
    "PlanImage",
    "PlanNodeRow",
    "begin_plan",
    "cancel_plan",
    "claim_plan",
    "list_plans",
    "list_runs",
    "plan_holds",
    "plan_rates",
    "plan_units",
    "prune_audit",
    "read_audit",
    "read_cancel",
    "read_plan",
    "run_owner",
    "running_plans",
    "write_audit",
    "write_plan",
]

#: The migration that adds the plan tables (schema version 3 -> 4).
PLAN_TABLES: Final = (
    (
        "CREATE TABLE plan_runs (run_id TEXT NOT NULL PRIMARY KEY, record TEXT NOT NULL, "
        "status TEXT NOT NULL, owner TEXT, cancel TEXT, created_at REAL NOT NULL, "
        "updated_at REAL NOT NULL) WITHOUT ROWID"
    ),
    (
        "CREATE TABLE plan_nodes (run_id TEXT NOT NULL, node_id TEXT NOT NULL, "
        "state TEXT NOT NULL, attempt TEXT, record TEXT NOT NULL, "
        "PRIMARY KEY (run_id, node_id)) WITHOUT ROWID"
    ),
)

#: The migration that adds the audit events of plan runs (schema version 4 -> 5): a run's
#: events, `(run_id, seq) -> event` (`Event.to_json` text), written with its transitions.
PLAN_AUDIT_TABLES: Final = (
    (
        "CREATE TABLE plan_audit (run_id TEXT NOT NULL, seq INTEGER NOT NULL, "
        "event TEXT NOT NULL, PRIMARY KEY (run_id, seq)) WITHOUT ROWID"
    ),
)

#: The migration that adds the holds of exclusive resources (schema version 5 -> 6):
#: `resource -> (run_id, node_id, attempt, acquired_at)`, one holder per resource.
PLAN_HOLD_TABLES: Final = (
    (
        "CREATE TABLE plan_holds (resource TEXT NOT NULL PRIMARY KEY, run_id TEXT NOT NULL, "
        "node_id TEXT NOT NULL, attempt TEXT NOT NULL, acquired_at REAL NOT NULL) WITHOUT ROWID"
    ),
    "CREATE INDEX plan_holds_run ON plan_holds (run_id, node_id)",
)

#: The migration that adds the units of resource capacities held (schema version 6 -> 7):
#: `(resource, run_id, node_id) -> (attempt, units, acquired_at)`, summed per resource.
PLAN_UNIT_TABLES: Final = (
    (
        "CREATE TABLE plan_units (resource TEXT NOT NULL, run_id TEXT NOT NULL, "
        "node_id TEXT NOT NULL, attempt TEXT NOT NULL, units INTEGER NOT NULL, "
        "acquired_at REAL NOT NULL, PRIMARY KEY (resource, run_id, node_id)) WITHOUT ROWID"
    ),
    "CREATE INDEX plan_units_run ON plan_units (run_id, node_id)",
)

#: The migration that adds the token buckets of tools' rate limits, counted across runs
#: (schema version 7 -> 8): a bucket's `tokens` as of `updated_at`.
PLAN_RATE_TABLES: Final = (
    (
        "CREATE TABLE plan_rates (tool TEXT NOT NULL PRIMARY KEY, tokens REAL NOT NULL, "
        "updated_at REAL NOT NULL) WITHOUT ROWID"
    ),
)

_RUNNING: Final = "RUNNING"


def _text(_instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str):
        raise InvalidArgument(f"{attribute.name} must be text, not {type(value).__name__}")
    check_value(value)


def _optional_text(
    _instance: object, attribute: attrs.Attribute[str | None], value: object
) -> None:
    if value is not None:
        _text(_instance, attribute, value)  # type: ignore[arg-type]


@final
@attrs.frozen(kw_only=True)
class PlanNodeRow:
    """One node of a plan run as stored: its state's name, the attempt id that holds it (or
    None) and its record (JSON text, opaque to the store)."""

    node_id: str = attrs.field(validator=_text)
    state: str = attrs.field(validator=_text)
    attempt: str | None = attrs.field(validator=_optional_text)
    record: str = attrs.field(validator=_text)


@final
@attrs.frozen(kw_only=True)
class PlanExpect:
    """A compare-and-set on one node: the write happens only if the node's state is one of
    `states` and its attempt is `attempt` (None: no attempt yet)."""

    node_id: str
    states: tuple[str, ...]
    attempt: str | None


@final
@attrs.frozen(kw_only=True)
class PlanChange:
    """One node's transition in a `write_plan`: its new `state` and `attempt`, and `append`,
    text added to the end of its record (opaque to the store). With `expect` (a compare-and-set
    on this node: `expect.node_id` must be `node_id`), the change is made only if the node's
    state is one of `expect.states` with attempt `expect.attempt`.

    `hold` (a claim's: with `expect` and `attempt`) is an exclusive resource the node takes
    with the change: the change is made only if no other run's node holds it. `units` (a
    claim's too) are `(resource, units, capacity)`: the change is made only if, for each, the
    units held by every other node of any run plus these stay within the capacity. `release`
    frees what the node holds (its attempt ended), once the change is made. `rate` (a claim's
    too) is `(tool, per_second, burst)`: the change is made only if the tool's token bucket,
    shared by every run on the store (refilled at `per_second` up to `burst` tokens, full at
    first), has a token, which the change takes."""

    node_id: str = attrs.field(validator=_text)
    state: str = attrs.field(validator=_text)
    attempt: str | None = attrs.field(validator=_optional_text)
    append: str = attrs.field(validator=_text)
    expect: PlanExpect | None = None
    hold: str | None = attrs.field(default=None, validator=_optional_text)
    units: tuple[tuple[str, int, int], ...] = ()
    rate: tuple[str, float, int] | None = None
    release: bool = False


@final
@attrs.frozen(kw_only=True)
class PlanImage:
    """A plan run as stored: its record, status, owner, cancellation reason (or None), times
    (seconds since the epoch) and nodes (in the order `begin_plan` gave them)."""

    run_id: str
    record: str
    status: str
    owner: str | None
    cancel: str | None
    created_at: float
    updated_at: float
    nodes: tuple[PlanNodeRow, ...]


def begin_plan(
    cur: sqlite3.Cursor,
    run_id: str,
    record: str,
    nodes: Sequence[PlanNodeRow],
    *,
    owner: str,
    now: float,
) -> None:
    """Insert run `run_id` with its nodes; `InvalidArgument` if the file has that run."""
    if cur.execute("SELECT 1 FROM plan_runs WHERE run_id = ?", (run_id,)).fetchall():
        raise InvalidArgument(f"plan run `{run_id}` exists in the store already")
    cur.execute(
        "INSERT INTO plan_runs (run_id, record, status, owner, cancel, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, NULL, ?, ?)",
        (run_id, record, _RUNNING, owner, now, now),
    )
    cur.executemany(
        "INSERT INTO plan_nodes (run_id, node_id, state, attempt, record) VALUES (?, ?, ?, ?, ?)",
        [(run_id, row.node_id, row.state, row.attempt, row.record) for row in nodes],
    )


_FENCE: Final = (
    "UPDATE plan_runs SET updated_at = ?, status = coalesce(?, status) "
    "WHERE run_id = ? AND owner = ?"
)
_CHANGE: Final = (
    "UPDATE plan_nodes SET state = ?, attempt = ?, record = record || ? "
    "WHERE run_id = ? AND node_id = ?"
)
_CHANGE_IF: Final = (
    "UPDATE plan_nodes SET state = ?, attempt = ?, record = record || ? "
    "WHERE run_id = ? AND node_id = ? AND attempt IS ? AND instr(?, '|' || state || '|') > 0"
)
#: Take a resource: a new row, or the row this node held already (a retry, a resumed run).
_HOLD: Final = (
    "INSERT INTO plan_holds (resource, run_id, node_id, attempt, acquired_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (resource) DO UPDATE SET attempt = excluded.attempt, "
    "acquired_at = excluded.acquired_at "
    "WHERE plan_holds.run_id = excluded.run_id AND plan_holds.node_id = excluded.node_id"
)
_UNHOLD: Final = "DELETE FROM plan_holds WHERE run_id = ? AND node_id = ?"
_UNHOLD_ATTEMPT: Final = "DELETE FROM plan_holds WHERE run_id = ? AND node_id = ? AND attempt = ?"
_UNHOLD_RUN: Final = "DELETE FROM plan_holds WHERE run_id = ?"
_USED: Final = (
    "SELECT coalesce(sum(units), 0) FROM plan_units WHERE resource = ? "
    "AND NOT (run_id = ? AND node_id = ?)"
)
_TAKE_UNITS: Final = (
    "INSERT OR REPLACE INTO plan_units (resource, run_id, node_id, attempt, units, acquired_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
_UNUNITS: Final = "DELETE FROM plan_units WHERE run_id = ? AND node_id = ?"
_UNUNITS_RUN: Final = "DELETE FROM plan_units WHERE run_id = ?"


def _take_units(cur: sqlite3.Cursor, run_id: str, change: PlanChange, now: float) -> bool:
    """Take the claim's units if every capacity has room for them (under the write lock)."""
    for resource, units, capacity in change.units:
        (used,) = cur.execute(_USED, (resource, run_id, change.node_id)).fetchone()
        if used + units > capacity:
            return False
    cur.executemany(
        _TAKE_UNITS,
        [
            (resource, run_id, change.node_id, change.attempt, units, now)
            for resource, units, _ in change.units
        ],
    )
    return True


_RATE: Final = "SELECT tokens, updated_at FROM plan_rates WHERE tool = ?"
_SET_RATE: Final = "INSERT OR REPLACE INTO plan_rates (tool, tokens, updated_at) VALUES (?, ?, ?)"


def _take_token(cur: sqlite3.Cursor, rate: tuple[str, float, int], now: float) -> bool:
    """Take a token from the tool's bucket if it has one (under the write lock)."""
    tool, per_second, burst = rate
    row = cur.execute(_RATE, (tool,)).fetchone()
    tokens = float(burst) if row is None else _refilled(row[0], row[1], now, per_second, burst)
    if tokens < 1.0:
        return False
    cur.execute(_SET_RATE, (tool, tokens - 1.0, now))
    return True


def _give_token(cur: sqlite3.Cursor, rate: tuple[str, float, int]) -> None:
    """Put back the token a claim took and did not use."""
    cur.execute(
        "UPDATE plan_rates SET tokens = min(tokens + 1.0, ?) WHERE tool = ?", (rate[2], rate[0])
    )


def _refilled(tokens: float, updated_at: float, now: float, per_second: float, burst: int) -> float:
    """A bucket's tokens at `now`: refilled at `per_second` since `updated_at`, up to `burst`
    (a clock that went back refills nothing)."""
    return min(float(burst), tokens + max(0.0, now - updated_at) * per_second)


def _take(cur: sqlite3.Cursor, run_id: str, change: PlanChange, now: float) -> bool:
    """Take what a claim takes across runs (its exclusive resource, its units, a token of
    its tool's rate), all or none (under the write lock)."""
    if change.attempt is None:
        raise InvalidArgument(f"a claim of node `{change.node_id}` that takes needs its attempt")
    hold = change.hold
    if hold is not None:
        taken = (hold, run_id, change.node_id, change.attempt, now)
        if cur.execute(_HOLD, taken).rowcount != 1:
            return False
    if (change.units and not _take_units(cur, run_id, change, now)) or (
        change.rate is not None and not _take_token(cur, change.rate, now)
    ):
        cur.execute(_UNHOLD_ATTEMPT, (run_id, change.node_id, change.attempt))
        cur.execute(_UNUNITS, (run_id, change.node_id))
        return False
    return True


def _untake(cur: sqlite3.Cursor, run_id: str, change: PlanChange) -> None:
    """Give back what `_take` took for a claim whose compare-and-set did not hold."""
    cur.execute(_UNHOLD_ATTEMPT, (run_id, change.node_id, change.attempt))
    cur.execute(_UNUNITS, (run_id, change.node_id))
    if change.rate is not None:
        _give_token(cur, change.rate)


def _release(cur: sqlite3.Cursor, run_id: str, node_id: str) -> None:
    cur.execute(_UNHOLD, (run_id, node_id))
    cur.execute(_UNUNITS, (run_id, node_id))


def write_plan(
    cur: sqlite3.Cursor,
    run_id: str,
    changes: Sequence[PlanChange],
    *,
    owner: str,
    now: float,
    status: str | None = None,
) -> tuple[bool | None, ...]:
    """Make `changes` in order (and set the run's `status`, if given) if `owner` holds the
    run: for each change, whether it was made (False: its `expect` did not hold; None: its
    `hold` is another run's; that change alone was skipped). An ended `status` frees the
    run's holds. `StorageError` if another owner has taken the run over,
    `TransactionNotFound` if it is not in the file; then nothing is written."""
    if cur.execute(_FENCE, (now, status, run_id, owner)).rowcount != 1:
        found = cur.execute("SELECT owner FROM plan_runs WHERE run_id = ?", (run_id,)).fetchall()
        if not found:
            raise TransactionNotFound(tx_id=run_id)
        raise StorageError(f"plan run `{run_id}` was taken over by another store")
    made: list[bool | None] = []
    plain: list[tuple[str, str | None, str, str, str]] = []
    for change in changes:
        expect = change.expect
        values = (change.state, change.attempt, change.append, run_id, change.node_id)
        if expect is None and not change.release:
            plain.append(values)
            made.append(True)
            continue
        if plain:  # in order: the changes before this one first
            cur.executemany(_CHANGE, plain)
            plain = []
        if expect is None:
            cur.execute(_CHANGE, values)
            _release(cur, run_id, change.node_id)
            made.append(True)
            continue
        if expect.node_id != change.node_id:
            raise InvalidArgument(f"a change of node `{change.node_id}` expects another node")
        takes = change.hold is not None or change.units or change.rate is not None
        if takes and not _take(cur, run_id, change, now):
            made.append(None)
            continue
        states = "|" + "|".join(expect.states) + "|"
        ok = cur.execute(_CHANGE_IF, (*values, expect.attempt, states)).rowcount == 1
        if not ok and takes:
            _untake(cur, run_id, change)
        elif ok and change.release:
            _release(cur, run_id, change.node_id)
        made.append(ok)
    if plain:
        cur.executemany(_CHANGE, plain)
    if status is not None and status != _RUNNING:
        cur.execute(_UNHOLD_RUN, (run_id,))
        cur.execute(_UNUNITS_RUN, (run_id,))
    return tuple(made)


def plan_units(cur: sqlite3.Cursor) -> tuple[tuple[str, str, str, int], ...]:
    """The units of resource capacities held, as `(resource, run_id, node_id, units)`."""
    rows = cur.execute(
        "SELECT resource, run_id, node_id, units FROM plan_units ORDER BY resource, run_id, node_id"
    ).fetchall()
    return tuple((resource, run, node, units) for resource, run, node, units in rows)


def plan_rates(cur: sqlite3.Cursor) -> tuple[tuple[str, float, float], ...]:
    """The token buckets of tools' rate limits, as `(tool, tokens, updated_at)`, by tool."""
    rows = cur.execute("SELECT tool, tokens, updated_at FROM plan_rates ORDER BY tool")
    return tuple((tool, tokens, updated_at) for tool, tokens, updated_at in rows.fetchall())


def plan_holds(cur: sqlite3.Cursor) -> tuple[tuple[str, str, str, str], ...]:
    """The exclusive resources held, as `(resource, run_id, node_id, attempt)`, by resource."""
    rows = cur.execute(
        "SELECT resource, run_id, node_id, attempt FROM plan_holds ORDER BY resource"
    ).fetchall()
    return tuple((resource, run, node, attempt) for resource, run, node, attempt in rows)


def write_audit(cur: sqlite3.Cursor, run_id: str, events: Sequence[tuple[int, str]]) -> None:
    """Store audit `events` of run `run_id` as `(seq, event text)`, replacing the same seq."""
    cur.executemany(
        "INSERT OR REPLACE INTO plan_audit (run_id, seq, event) VALUES (?, ?, ?)",
        [(run_id, seq, text) for seq, text in events],
    )


#: The statuses of a plan run that has ended.
_ENDED: Final = ("SUCCEEDED", "FAILED", "CANCELLED")
_ENDED_RUNS: Final = "SELECT run_id FROM plan_runs WHERE status IN (?, ?, ?)"


def prune_audit(cur: sqlite3.Cursor, keep: int | None, keep_for: float | None, now: float) -> None:
    """Delete the audit events of the ended plan runs beyond the newest `keep` (by their last
    change) and of those that ended before `now - keep_for` (`None`: no such limit), as the
    store's retention does for ended transactions. The runs themselves stay."""
    if keep is not None:
        cur.execute(
            f"DELETE FROM plan_audit WHERE run_id IN ({_ENDED_RUNS} "  # noqa: S608 - constants
            "ORDER BY updated_at DESC, run_id DESC LIMIT -1 OFFSET ?)",
            (*_ENDED, keep),
        )
    if keep_for is not None:
        cur.execute(
            f"DELETE FROM plan_audit WHERE run_id IN ({_ENDED_RUNS} "  # noqa: S608 - constants
            "AND updated_at < ?)",
            (*_ENDED, now - keep_for),
        )


def read_audit(cur: sqlite3.Cursor, run_id: str) -> tuple[str, ...]:
    """The audit events stored for run `run_id` (event texts), in seq order."""
    rows = cur.execute(
        "SELECT event FROM plan_audit WHERE run_id = ? ORDER BY seq", (run_id,)
    ).fetchall()
    return tuple(text for (text,) in rows)


def cancel_plan(cur: sqlite3.Cursor, run_id: str, reason: str) -> bool:
    """Record the cancellation of a running run that has none; False if it has ended or was
    cancelled already; `TransactionNotFound` if the file has no such run."""
    changed: int = cur.execute(
        "UPDATE plan_runs SET cancel = ? WHERE run_id = ? AND status = ? AND cancel IS NULL",
        (reason, run_id, _RUNNING),
    ).rowcount
    if changed:
        return True
    if not cur.execute("SELECT 1 FROM plan_runs WHERE run_id = ?", (run_id,)).fetchall():
        raise TransactionNotFound(tx_id=run_id)
    return False


def read_cancel(cur: sqlite3.Cursor, run_id: str) -> str | None:
    """The cancellation reason recorded for the run, or None."""
    rows = cur.execute("SELECT cancel FROM plan_runs WHERE run_id = ?", (run_id,)).fetchall()
    return rows[0][0] if rows else None


def read_plan(cur: sqlite3.Cursor, run_id: str) -> PlanImage:
    """The run as stored (run it in a read transaction); `TransactionNotFound` if absent."""
    runs = cur.execute(
        "SELECT record, status, owner, cancel, created_at, updated_at FROM plan_runs "
        "WHERE run_id = ?",
        (run_id,),
    ).fetchall()
    if not runs:
        raise TransactionNotFound(tx_id=run_id)
    record, status, owner, cancel, created_at, updated_at = runs[0]
    nodes = cur.execute(
        "SELECT node_id, state, attempt, record FROM plan_nodes WHERE run_id = ?",
        (run_id,),
    ).fetchall()
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
            for node_id, state, attempt, text in nodes
        ),
    )


def list_plans(cur: sqlite3.Cursor, limit: int) -> tuple[tuple[str, str, float], ...]:
    """Up to `limit` runs as `(run_id, status, updated_at)`, the last updated first."""
    rows = cur.execute(
        "SELECT run_id, status, updated_at FROM plan_runs ORDER BY updated_at DESC, run_id LIMIT ?",
        (limit,),
    ).fetchall()
    return tuple((run_id, status, updated_at) for run_id, status, updated_at in rows)


def run_owner(cur: sqlite3.Cursor, run_id: str) -> str | None:
    """The owner of RUNNING run `run_id`, or None (no such run, or it has ended)."""
    rows = cur.execute(
        "SELECT owner FROM plan_runs WHERE run_id = ? AND status = ?", (run_id, _RUNNING)
    ).fetchall()
    return rows[0][0] if rows else None


def claim_plan(cur: sqlite3.Cursor, run_id: str, was: str | None, owner: str) -> bool:
    """Make `owner` the run's owner if it is still `was` and the run is RUNNING; the dead
    owner's holds are freed with it (the new owner claims its nodes, and their holds, again)."""
    changed: int = cur.execute(
        "UPDATE plan_runs SET owner = ? WHERE run_id = ? AND owner IS ? AND status = ?",
        (owner, run_id, was, _RUNNING),
    ).rowcount
    if changed == 1:
        cur.execute(_UNHOLD_RUN, (run_id,))
        cur.execute(_UNUNITS_RUN, (run_id,))
    return changed == 1


def running_plans(cur: sqlite3.Cursor) -> tuple[tuple[str, str | None], ...]:
    """The RUNNING runs as `(run_id, owner)`, by id."""
    rows = cur.execute(
        "SELECT run_id, owner FROM plan_runs WHERE status = ? ORDER BY run_id", (_RUNNING,)
    ).fetchall()
    return tuple((run_id, owner) for run_id, owner in rows)


#: A page of `list_runs`: `(kind, id, at, status, record, history)`; `kind` "tx" (an ended
#: transaction: `status` None, its record and history texts as kept) or "plan" (a plan run:
#: its status, `record` and `history` None); `at` when it ended or last changed.
ListedRun: TypeAlias = "tuple[str, str, float, str | None, str | None, str | None]"

#: The ended transactions (the last row kept of each; not a plan run's own transaction, which
#: has the run's id) and the plan runs, as `(kind, id, at, key)`: SQLite's (a bare column
#: beside `max()` comes from the row of the maximum) and PostgreSQL's (`DISTINCT ON`), in the
#: tables prefixed `{s}`.
_RUNS: Final = {
    "sqlite": {
        "tx": (
            "SELECT 'tx', tx_id, ended_at, max(seq) FROM {s}ended "
            "WHERE tx_id NOT IN (SELECT run_id FROM {s}plan_runs) GROUP BY tx_id"
        ),
        "plan": "SELECT 'plan', run_id, updated_at, NULL FROM {s}plan_runs",
    },
    "postgres": {
        "tx": (
            "SELECT * FROM (SELECT DISTINCT ON (tx_id) 'tx', tx_id, ended_at, seq FROM {s}ended "
            "WHERE tx_id NOT IN (SELECT run_id FROM {s}plan_runs) ORDER BY tx_id, seq DESC) AS e"
        ),
        "plan": "SELECT 'plan', run_id, updated_at, NULL::bigint FROM {s}plan_runs",
    },
}


def list_runs(
    fetch: Callable[[str, Sequence[object]], Sequence[Sequence[Any]]],
    limit: int,
    offset: int,
    kind: str | None,
    *,
    dialect: str = "sqlite",
    schema: str = "",
) -> tuple[ListedRun, ...]:
    """One page of `list_runs` (SQLite's and PostgreSQL's), read with `fetch(sql, values)` in
    the caller's one read: the page's keys in one query (`LIMIT`/`OFFSET` over the union, in
    time order), then its rows' records by primary key. `InvalidArgument` for a bad argument."""
    check_int(limit, "limit", MAX_INT64, minimum=1)
    check_int(offset, "offset", MAX_INT64)
    queries = _RUNS[dialect]
    if kind is not None and kind not in queries:
        raise InvalidArgument(f"kind must be 'tx', 'plan' or None, got {kind!r:.40}")
    mark = "?" if dialect == "sqlite" else "%s"
    parts = [queries[kind]] if kind is not None else list(queries.values())
    union = " UNION ALL ".join(part.format(s=schema) for part in parts)
    page = fetch(f"{union} ORDER BY 3 DESC, 2 DESC LIMIT {mark} OFFSET {mark}", (limit, offset))
    seqs = [int(key) for kind_of, _, _, key in page if kind_of == "tx"]
    runs = [str(run_id) for kind_of, run_id, _, _ in page if kind_of == "plan"]
    ended: dict[int, tuple[str, str | None]] = {}
    statuses: dict[str, str] = {}
    if seqs:
        marks = ", ".join([mark] * len(seqs))
        sql = f"SELECT seq, record, history FROM {schema}ended WHERE seq IN ({marks})"  # noqa: S608 - placeholders
        ended = {int(seq): (record, history) for seq, record, history in fetch(sql, seqs)}
    if runs:
        marks = ", ".join([mark] * len(runs))
        sql = f"SELECT run_id, status FROM {schema}plan_runs WHERE run_id IN ({marks})"  # noqa: S608
        statuses = {str(run_id): str(status) for run_id, status in fetch(sql, runs)}
    listed: list[ListedRun] = []
    for kind_of, run_id, at, key in page:
        if kind_of == "tx":
            record, history = ended.get(int(key), ("null", None))
            listed.append(("tx", str(run_id), float(at), None, record, history))
        else:
            status = statuses.get(str(run_id), "GONE")
            listed.append(("plan", str(run_id), float(at), status, None, None))
    return tuple(listed)
