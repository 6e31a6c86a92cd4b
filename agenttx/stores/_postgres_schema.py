"""The schema behind `PostgresStore`: its migrations, and every SQL text the store runs.

**Layout** (in the store's own schema, `agenttx` by default; migrations 1 to 7):

=========== ================================================================================
migrations  one row per migration applied: `version`, `description`, `applied_at`
meta        one row: `commit_version`, the commit counter (its row lock serializes commits)
committed   `key -> (version, value)`: the committed map; keys and values are `bytea` (UTF-8),
            so that any text the contract admits fits, and keys sort by code point
txs         one row per open transaction: `record`, `isolation`, `history`, `conversation`
            (migration 6; as SQLite's), and its lease: `owner` (JSON: hostname, pid, per-store
            token), `epoch` (from the sequence `epochs`, new at every begin, load and claim) and
            `lease_until`
log         the transaction's events, `(tx_id, seq)`, exactly as in the SQLite file (see
            `_sqlite_file`); `name`, `body` and `extra` are `bytea`
undos       `(tx_id, step_id, seq) -> record`: the undo records, write-ahead of their effects
outbox      committed effects, their delivery history and the dispatcher's claim on them
ended       the ended transactions kept as history, in the order they ended
plan_runs   one row per plan run, with a lease like `txs` (`owner`, `epoch`, `lease_until`)
plan_nodes  `(run_id, node_id) -> (state, attempt, record)`
plan_audit  `(run_id, seq) -> event`: the audit events of a plan run (migration 2)
requests    approval requests and reviews, each state change a compare-and-set (migration 2)
plan_holds  `resource -> (run_id, node_id, attempt, acquired_at)`: the exclusive resource a
            running plan node holds, one holder per resource by the primary key (migration 3)
plan_units  `(resource, run_id, node_id) -> (attempt, units, acquired_at)`: the units of a
            resource's capacity running plan nodes hold, summed under an advisory lock
            (migration 4)
plan_rates  `tool -> (tokens, updated_at)`: a rate-limited tool's token bucket, shared by
            every run, refilled by the server's clock (migration 5)
conversation_messages
            `(tx_id, seq) -> message`: the log of an agent's conversation (`_conversations`),
            deleted with its `txs` row (migration 7). A change of a request's state notifies
            channel `agenttx_decided` with the schema's name (migration 8: `_bell`)
=========== ================================================================================

Every write to a transaction's rows carries its fence: the `txs` row must still have the
writer's epoch, read under `FOR KEY SHARE` so that a takeover (which locks the row `FOR
UPDATE`) waits for the write to end, and a write waits for a takeover to end and then sees the
new epoch. `MIGRATIONS` are ordered; a store applies the missing ones in one transaction, under
an advisory lock, and refuses a schema newer than it knows.
"""

# The schema name is checked by `check_schema_name` (an identifier of [a-z0-9_]), so building
# the texts with it cannot inject SQL; the values all go as parameters.
# ruff: noqa: S608

from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING, Final, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._sqlite_mirror import Row, TxMirror

__all__ = [
    "COMMANDS",
    "COMMIT_FENCE",
    "HOLDS_LOCK",
    "LOG_ROWS_PREPARED",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Sql",
    "Statement",
    "binary_array",
]

#: The schema migrations, in order, as (description, statements); `{s}` is the schema, quoted.
#: Applying `MIGRATIONS[v]` takes the schema from version `v` to `v + 1`. Append; never edit
#: a released migration.
MIGRATIONS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    (
        "transactions, log, undo records, outbox, history, plan runs",
        (
            "CREATE SEQUENCE {s}.epochs",
            (
                "CREATE TABLE {s}.meta (id integer PRIMARY KEY CHECK (id = 0), "
                "commit_version bigint NOT NULL)"
            ),
            "INSERT INTO {s}.meta (id, commit_version) VALUES (0, 0)",
            (
                "CREATE TABLE {s}.committed (key bytea PRIMARY KEY, version bigint NOT NULL, "
                "value bytea NOT NULL)"
            ),
            (
                "CREATE TABLE {s}.txs (tx_id text PRIMARY KEY, record text NOT NULL, "
                "owner text, epoch bigint NOT NULL, lease_until timestamptz, "
                "isolation text NOT NULL, history text)"
            ),
            (
                "CREATE TABLE {s}.log (tx_id text NOT NULL, seq bigint NOT NULL, "
                "kind smallint NOT NULL, step bigint, num bigint, name bytea, body bytea, "
                "extra bytea, PRIMARY KEY (tx_id, seq))"
            ),
            (
                "CREATE TABLE {s}.undos (tx_id text NOT NULL, step_id bigint NOT NULL, "
                "seq bigint NOT NULL, record text NOT NULL, PRIMARY KEY (tx_id, step_id, seq))"
            ),
            (
                "CREATE TABLE {s}.outbox (id bigserial PRIMARY KEY, tx_id text NOT NULL, "
                "step_id bigint NOT NULL, channel text NOT NULL, payload text NOT NULL, "
                "idempotency_key text NOT NULL, attempts integer NOT NULL DEFAULT 0, "
                "last_error text, not_before double precision NOT NULL DEFAULT 0, "
                "delivered boolean NOT NULL DEFAULT false, claimed_by text, "
                "claimed_until double precision NOT NULL DEFAULT 0)"
            ),
            "CREATE INDEX outbox_pending ON {s}.outbox (id) WHERE NOT delivered",
            (
                "CREATE TABLE {s}.ended (seq bigserial PRIMARY KEY, tx_id text NOT NULL, "
                "record text NOT NULL, isolation text NOT NULL, history text, "
                "steps bytea NOT NULL, ended_at double precision NOT NULL)"
            ),
            (
                "CREATE TABLE {s}.plan_runs (run_id text PRIMARY KEY, record text NOT NULL, "
                "status text NOT NULL, owner text, epoch bigint NOT NULL, "
                "lease_until timestamptz, cancel text, created_at double precision NOT NULL, "
                "updated_at double precision NOT NULL)"
            ),
            (
                "CREATE TABLE {s}.plan_nodes (run_id text NOT NULL, node_id text NOT NULL, "
                "position integer NOT NULL, state text NOT NULL, attempt text, "
                "record text NOT NULL, PRIMARY KEY (run_id, node_id))"
            ),
        ),
    ),
    (
        "approval requests and reviews; the audit events of plan runs",
        (
            (
                "CREATE TABLE {s}.requests (id text PRIMARY KEY, kind text NOT NULL, "
                "scope_id text NOT NULL, state text NOT NULL, digest text NOT NULL, "
                "record text NOT NULL, decision text, created_at double precision NOT NULL, "
                "updated_at double precision NOT NULL)"
            ),
            "CREATE INDEX requests_scope ON {s}.requests (scope_id)",
            "CREATE INDEX requests_state ON {s}.requests (kind, state)",
            (
                "CREATE TABLE {s}.plan_audit (run_id text NOT NULL, seq bigint NOT NULL, "
                "event text NOT NULL, PRIMARY KEY (run_id, seq))"
            ),
        ),
    ),
    (
        "the holds of plan nodes' exclusive resources, across runs",
        (
            (
                "CREATE TABLE {s}.plan_holds (resource text PRIMARY KEY, run_id text NOT NULL, "
                "node_id text NOT NULL, attempt text NOT NULL, "
                "acquired_at double precision NOT NULL)"
            ),
            "CREATE INDEX plan_holds_run ON {s}.plan_holds (run_id, node_id)",
        ),
    ),
    (
        "the units of plan resources' capacities held, counted across runs",
        (
            (
                "CREATE TABLE {s}.plan_units (resource text NOT NULL, run_id text NOT NULL, "
                "node_id text NOT NULL, attempt text NOT NULL, units bigint NOT NULL, "
                "acquired_at double precision NOT NULL, "
                "PRIMARY KEY (resource, run_id, node_id))"
            ),
            "CREATE INDEX plan_units_run ON {s}.plan_units (run_id, node_id)",
        ),
    ),
    (
        "the token buckets of tools' rate limits, counted across runs",
        (
            (
                "CREATE TABLE {s}.plan_rates (tool text PRIMARY KEY, "
                "tokens double precision NOT NULL, updated_at double precision NOT NULL)"
            ),
        ),
    ),
    (
        "an agent's conversation with its transaction",
        ("ALTER TABLE {s}.txs ADD COLUMN conversation text",),
    ),
    (
        "the messages of an agent's conversation, as a log a write appends to",
        (
            (
                "CREATE TABLE {s}.conversation_messages (tx_id text NOT NULL, "
                "seq bigint NOT NULL, message text NOT NULL, PRIMARY KEY (tx_id, seq))"
            ),
        ),
    ),
    (
        "a notification when a request changes state, for the waits on people's decisions",
        (
            (
                "CREATE FUNCTION {s}.request_decided() RETURNS trigger LANGUAGE plpgsql AS "
                "$$BEGIN PERFORM pg_notify('agenttx_decided', TG_TABLE_SCHEMA); "
                "RETURN NULL; END$$"
            ),
            (
                "CREATE TRIGGER request_decided AFTER UPDATE OF state ON {s}.requests "
                "FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) "
                "EXECUTE FUNCTION {s}.request_decided()"
            ),
        ),
    ),
)

#: The advisory lock (with the schema's hash) under which every write takes or frees holds
#: and units of plan nodes: claims count capacities' units under it, and no two writes can
#: wait on each other's rows of `plan_holds` or `plan_units`.
HOLDS_LOCK: Final = 0x41475455
#: The schema version this code writes: the number of migrations.
SCHEMA_VERSION: Final = len(MIGRATIONS)

#: The `pg_advisory_xact_lock` key that serializes migrations ("AGTX").
MIGRATION_LOCK: Final = 0x41475458

# The kinds of `log` events, as in `_sqlite_file`.
WRITE: Final = 1
SNAPSHOT: Final = 2
RESTORE: Final = 3
STEP: Final = 4
EFFECT: Final = 5
PROGRESS: Final = 6
READ: Final = 7

#: The fence of a write to transaction (tx_id, epoch): its row, still at that epoch, locked
#: against a takeover until the write commits.
_FENCE: Final = "SELECT 1 FROM {s}.txs WHERE tx_id = %s AND epoch = %s FOR KEY SHARE"
_LEASE: Final = "now() + make_interval(secs => %s)"
#: The server's clock in seconds since the epoch, and a rate bucket's tokens refilled by it
#: (two parameters: the burst, then the tokens a second; a clock that went back adds none).
_CLOCK: Final = "extract(epoch from clock_timestamp())"
_REFILLED: Final = (
    f"least(%s::float8, b.tokens + greatest(0, {_CLOCK} - b.updated_at) * %s::float8)"
)
#: The most `log` rows a durable write appends in one prepared statement (a step's record with
#: a few buffered writes); more go in a PostgreSQL transaction, fenced first.
LOG_ROWS_PREPARED: Final = 8
_UPSERT_LOG: Final = (
    " ON CONFLICT (tx_id, seq) DO UPDATE SET kind = excluded.kind, step = excluded.step, "
    "num = excluded.num, name = excluded.name, body = excluded.body, extra = excluded.extra"
)


_LOG_FORMATS: Final = tuple(
    (0, 0, *(0, 0, 0, 0, 1, 1, 1) * rows) for rows in range(1, LOG_ROWS_PREPARED + 1)
)


def _hot_name(text: str) -> bytes:
    """The name a hot statement is prepared under: its text's digest, so that two stores
    sharing a pooled connection (even of other schemas or versions) never mistake one
    statement for another, and one already prepared there can be used as it is."""
    return b"agenttx_" + hashlib.sha256(text.encode()).hexdigest()[:40].encode()


def _log_fenced(s: str, rows: int) -> str:
    """Append `rows` events to the log if transaction $1 is still at epoch $2 (the fence),
    with scalar parameters: $3.. are each row's seq, kind, step, num, name, body, extra."""
    types = ("bigint", "smallint", "bigint", "bigint", "bytea", "bytea", "bytea")
    values = ", ".join(
        "(" + ", ".join(f"${3 + 7 * row + n}::{t}" for n, t in enumerate(types)) + ")"
        for row in range(rows)
    )
    return (
        f"INSERT INTO {s}.log (tx_id, seq, kind, step, num, name, body, extra) "
        f"SELECT $1::text, v.q, v.k, v.st, v.n, v.nm, v.b, v.e FROM (VALUES {values}) "
        "AS v(q, k, st, n, nm, b, e) "
        f"WHERE EXISTS (SELECT 1 FROM {s}.txs WHERE tx_id = $1::text AND epoch = $2::bigint "
        "FOR KEY SHARE)" + _UPSERT_LOG
    )


#: A statement of a batch (`Link.batch`): a hot statement's name (or `BEGIN`, `COMMIT`), its
#: parameters (bytes, or None for NULL) and their formats (0 text, 1 binary).
Statement: TypeAlias = "tuple[bytes, Sequence[bytes | None], Sequence[int]]"
#: The index of a commit's fence among its statements (`Hot.commit`).
COMMIT_FENCE: Final = 1
#: The commands a batch sends as they are, unprepared.
COMMANDS: Final = frozenset({b"BEGIN", b"COMMIT"})
_BYTEA: Final = 17
_INT8: Final = 20
_TEXT: Final = 25
_INT8_OF: Final = struct.Struct("!q").pack


def binary_array(oid: int, items: Sequence[bytes]) -> bytes:
    """A one-dimensional array of non-NULL `items` (each already in its type's binary form) in
    PostgreSQL's binary array format, element type `oid`: no quoting, any bytes."""
    if not items:
        return struct.pack("!iiI", 0, 0, oid)
    head = struct.pack("!iiIii", 1, 0, oid, len(items), 1)
    return head + b"".join(struct.pack("!i", len(item)) + item for item in items)


def _int8_array(values: Sequence[int]) -> bytes:
    return binary_array(_INT8, [_INT8_OF(value) for value in values])


class Hot:
    """The statements of the per-step path and of commit, run with `Link.run` and `Link.batch`:
    prepared once on each connection (under `_hot_name`s), their parameters sent as bytes, no
    psycopg adaptation. `log_fenced[n - 1]` appends n rows; `committed` reads a key's version
    and value; `begin` inserts a transaction's row with a new epoch and lease; `lease` checks
    (and, if half of it is gone, renews) a transaction's lease before a tool runs; `commit`
    builds a commit's statements."""

    def __init__(self, s: str) -> None:
        texts = {f"log{rows}": _log_fenced(s, rows) for rows in range(1, LOG_ROWS_PREPARED + 1)}
        texts["committed"] = f"SELECT version, value FROM {s}.committed WHERE key = $1::bytea"
        texts["begin"] = (
            f"INSERT INTO {s}.txs (tx_id, record, owner, epoch, lease_until, isolation) "
            f"VALUES ($1::text, $2::text, $3::text, nextval('{s}.epochs'), "
            "now() + make_interval(secs => $4::float8), $5::text) "
            "ON CONFLICT (tx_id) DO NOTHING RETURNING epoch"
        )
        # The lease check before a tool runs: a row if transaction $1 is still at epoch $2
        # with at least half of its lease ($3 seconds) left, or once the lease, shorter than
        # that, is renewed in the same statement (the only case that writes). A claim
        # committed meanwhile needed an expired lease: the renewal then finds its new epoch
        # (after waiting for its row lock) and the statement returns no row.
        texts["lease"] = (
            f"WITH r AS (UPDATE {s}.txs SET lease_until = "
            "now() + make_interval(secs => $3::float8) "
            "WHERE tx_id = $1::text AND epoch = $2::bigint "
            "AND lease_until < now() + make_interval(secs => $3::float8 / 2) RETURNING 1) "
            f"SELECT 1 FROM {s}.txs WHERE tx_id = $1::text AND epoch = $2::bigint "
            "AND lease_until >= now() + make_interval(secs => $3::float8 / 2) "
            "UNION ALL SELECT 1 FROM r"
        )
        # The commit's statements. A failed check divides by zero (its SQLSTATE, 22012, names
        # no other failure of these statements): the transaction is aborted on the server,
        # before the COMMIT sent with it, and the store reads what failed afterwards.
        texts["fence"] = (
            f"SELECT 1 / count(*)::int FROM (SELECT 1 FROM {s}.txs WHERE tx_id = $1::text "
            "AND epoch = $2::bigint FOR UPDATE) AS f"
        )
        ends = (
            f"l AS (DELETE FROM {s}.log WHERE tx_id = $1::text), "
            f"c AS (DELETE FROM {s}.conversation_messages WHERE tx_id = $1::text), "
            f"u AS (DELETE FROM {s}.undos WHERE tx_id = $1::text) "
            f"DELETE FROM {s}.txs WHERE tx_id = $1::text"
        )
        texts["end"] = "WITH " + ends
        texts["end_kept"] = (
            f"WITH e AS (INSERT INTO {s}.ended (tx_id, record, isolation, history, steps, "
            "ended_at) SELECT tx_id, record, isolation, COALESCE($2::text, history), "
            f"$3::bytea, $4::float8 FROM {s}.txs WHERE tx_id = $1::text), " + ends
        )
        texts["next_commit"] = (
            f"UPDATE {s}.meta SET commit_version = commit_version + 1 RETURNING commit_version"
        )
        texts["check"] = (
            "SELECT 1 / (NOT EXISTS (SELECT 1 FROM unnest($1::bytea[], $2::bigint[]) "
            f"AS x(k, b) LEFT JOIN {s}.committed AS c ON c.key = x.k "
            "WHERE coalesce(c.version, 0) <> x.b))::int"
        )
        texts["upsert"] = (
            f"INSERT INTO {s}.committed (key, version, value) SELECT u.k, m.commit_version, u.v "
            f"FROM unnest($1::bytea[], $2::bytea[]) AS u(k, v) CROSS JOIN {s}.meta AS m "
            "WHERE true ON CONFLICT (key) DO UPDATE SET version = excluded.version, "
            "value = excluded.value"
        )
        texts["delete"] = f"DELETE FROM {s}.committed WHERE key = ANY($1::bytea[])"
        texts["outbox"] = (
            f"INSERT INTO {s}.outbox (tx_id, step_id, channel, payload, idempotency_key) "
            "SELECT $1::text, st, c, p, k FROM unnest($2::bigint[], $3::text[], $4::text[], "
            "$5::text[]) WITH ORDINALITY AS u(st, c, p, k, o) ORDER BY o"
        )
        self.statements: tuple[tuple[bytes, str], ...] = tuple(
            (_hot_name(text), text) for text in texts.values()
        )
        self._names = {key: _hot_name(text) for key, text in texts.items()}
        self.log_fenced: tuple[bytes, ...] = tuple(
            self._names[f"log{rows}"] for rows in range(1, LOG_ROWS_PREPARED + 1)
        )
        self.committed: bytes = self._names["committed"]
        self.begin: bytes = self._names["begin"]
        self.lease: bytes = self._names["lease"]

    def append(
        self, tx_id: str, epoch: int, rows: Sequence[Row]
    ) -> tuple[bytes, list[bytes | None], tuple[int, ...]]:
        """The statement, parameters and parameter formats (text 0, binary 1) that append
        `rows` (1 to `LOG_ROWS_PREPARED` of them) to `tx_id`'s log, fenced by `epoch`."""
        params: list[bytes | None] = [tx_id.encode(), b"%d" % epoch]
        for _, seq, kind, step, num, name, body, extra in rows:
            params += (
                b"%d" % seq,
                b"%d" % kind,
                None if step is None else b"%d" % step,
                None if num is None else b"%d" % num,
                None if name is None else name.encode(),
                None if body is None else body.encode(),
                None if extra is None else extra.encode(),
            )
        return self.log_fenced[len(rows) - 1], params, _LOG_FORMATS[len(rows) - 1]

    def _check(self, keys: list[bytes], versions: list[int]) -> Statement:
        """The statement that fails (division by zero) unless each of `keys` has its version
        in `versions` (0: absent)."""
        params = (binary_array(_BYTEA, keys), _int8_array(versions))
        return self._names["check"], params, (1, 1)

    def commit(
        self,
        tx_id: str,
        epoch: int,
        tx: TxMirror,
        *,
        ended: tuple[str | None, str, float] | None,
    ) -> tuple[list[Statement], int | None, int | None]:
        """The statements of a commit of `tx_id` at `epoch`, sent at once: BEGIN; the fence
        (its row still at `epoch`, locked `FOR UPDATE`); its end, kept as history with
        `ended` (`history, steps text, time`) unless `None`; the commit lock and version; the
        checks of the versions of the keys written (then read, if serializable) against the
        overlay's; the writes, the effects to the outbox; COMMIT. Also the indexes of the
        statements checking the writes and the reads (`None` where there is none)."""
        names, t = self._names, tx_id.encode()
        statements: list[Statement] = [
            (b"BEGIN", (), ()),
            (names["fence"], (t, b"%d" % epoch), (0, 0)),  # at `COMMIT_FENCE`
        ]
        if ended is None:
            statements.append((names["end"], (t,), (0,)))
        else:
            history, steps, now = ended
            params = (t, None if history is None else history.encode(), steps.encode())
            statements.append((names["end_kept"], (*params, repr(now).encode()), (0, 0, 1, 0)))
        statements.append((names["next_commit"], (), ()))
        entries = [(key.encode(), base, value) for key, (base, value) in tx.overlay.items()]
        writes = reads = None
        if entries:
            writes = len(statements)
            statements.append(self._check([k for k, _, _ in entries], [b for _, b, _ in entries]))
        if tx.serializable and tx.reads:
            reads = len(statements)
            read = tx.reads
            statements.append(self._check([key.encode() for key in read], list(read.values())))
        puts = [(key, value.encode()) for key, _, value in entries if value is not None]
        if puts:
            keys = binary_array(_BYTEA, [key for key, _ in puts])
            values = binary_array(_BYTEA, [value for _, value in puts])
            statements.append((names["upsert"], (keys, values), (1, 1)))
        deletes = [key for key, _, value in entries if value is None]
        if deletes:
            statements.append((names["delete"], (binary_array(_BYTEA, deletes),), (1,)))
        effects = tx.effects
        if effects:
            outbox = (
                t,
                _int8_array([e.step_id for e in effects]),
                binary_array(_TEXT, [e.channel.encode() for e in effects]),
                binary_array(_TEXT, [e.payload.encode() for e in effects]),
                binary_array(_TEXT, [e.idempotency_key.encode() for e in effects]),
            )
            statements.append((names["outbox"], outbox, (0, 1, 1, 1, 1)))
        statements.append((b"COMMIT", (), ()))
        return statements, writes, reads


class Sql:
    """The store's SQL texts with the schema filled in (one instance per store)."""

    def __init__(self, schema: str) -> None:  # noqa: PLR0915  (one assignment per statement)
        s = schema
        self.fence = _FENCE.format(s=s)
        self.hot = Hot(s)
        self.select_version = f"SELECT max(version) FROM {s}.migrations"
        self.create_migrations = (
            f"CREATE TABLE IF NOT EXISTS {s}.migrations (version integer PRIMARY KEY, "
            "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        self.insert_migration = f"INSERT INTO {s}.migrations (version, description) VALUES (%s, %s)"
        # ---------------------------------------------------------------- committed state
        self.select_versions = (
            f"SELECT key, version FROM {s}.committed WHERE key = ANY(%s::bytea[])"
        )
        self.select_committed_from = (
            f"SELECT key, version, value FROM {s}.committed WHERE key >= %s ORDER BY key LIMIT %s"
        )
        # ---------------------------------------------------------------- transactions
        self.select_tx = f"SELECT record, owner, isolation, epoch FROM {s}.txs WHERE tx_id = %s"
        self.select_tx_for_update = self.select_tx + " FOR UPDATE"
        self.select_tx_ids = f"SELECT tx_id FROM {s}.txs ORDER BY tx_id"
        self.select_owner = f"SELECT owner FROM {s}.txs WHERE tx_id = %s"
        self.select_epoch = f"SELECT epoch, owner FROM {s}.txs WHERE tx_id = %s"
        self.take_tx = (
            "UPDATE {s}.txs SET owner = %s, epoch = nextval('{s}.epochs'), "
            "lease_until = " + _LEASE + " WHERE tx_id = %s RETURNING epoch"
        ).format(s=s)
        #: The claim: the row, if its owner is still the one given and its lease is over,
        #: skipping it if another worker holds it locked (a write or a claim in progress).
        self.claim_tx = (
            f"SELECT record, owner, isolation, epoch FROM {s}.txs WHERE tx_id = %s "
            "AND owner IS NOT DISTINCT FROM %s "
            "AND (lease_until IS NULL OR lease_until < now()) FOR UPDATE SKIP LOCKED"
        )
        # Renewals skip the rows locked by a call in flight (a commit holds its row while it
        # waits for the commit lock): the renewal must never wait, or every lease of the store
        # would run out behind one blocked call. A skipped row is renewed at the next tick.
        # `FOR NO KEY UPDATE` does not conflict with the `FOR KEY SHARE` of the writes.
        self.renew_txs = (
            "UPDATE {s}.txs AS t SET lease_until = " + _LEASE + " "
            "WHERE t.tx_id IN (SELECT x.tx_id FROM {s}.txs AS x "
            "JOIN unnest(%s::text[], %s::bigint[]) AS h(tx_id, epoch) "
            "ON x.tx_id = h.tx_id AND x.epoch = h.epoch FOR NO KEY UPDATE OF x SKIP LOCKED) "
            "RETURNING t.tx_id"
        ).format(s=s)
        self.renew_plans = (
            "UPDATE {s}.plan_runs AS r SET lease_until = " + _LEASE + " "
            "WHERE r.run_id IN (SELECT x.run_id FROM {s}.plan_runs AS x "
            "JOIN unnest(%s::text[], %s::bigint[]) AS h(run_id, epoch) "
            "ON x.run_id = h.run_id AND x.epoch = h.epoch FOR NO KEY UPDATE OF x SKIP LOCKED) "
            "RETURNING r.run_id"
        ).format(s=s)
        self.update_record = f"UPDATE {s}.txs SET record = %s WHERE tx_id = %s AND epoch = %s"
        # Fenced by the transaction's `fence`, in the same PostgreSQL transaction. One
        # statement: the state, then the messages from `start` on (upserted), and those after
        # the new last one deleted (a row no two parts of the statement touch both).
        self.update_conversation = (
            f"WITH h AS (UPDATE {s}.txs SET conversation = %s WHERE tx_id = %s RETURNING tx_id), "
            f"d AS (DELETE FROM {s}.conversation_messages AS m USING h "
            "WHERE m.tx_id = h.tx_id AND m.seq >= %s) "
            f"INSERT INTO {s}.conversation_messages (tx_id, seq, message) "
            "SELECT h.tx_id, %s + u.n - 1, u.m FROM h, "
            "unnest(%s::text[]) WITH ORDINALITY AS u(m, n) "
            "ON CONFLICT (tx_id, seq) DO UPDATE SET message = excluded.message"
        )
        self.select_messages = (
            f"SELECT message FROM {s}.conversation_messages WHERE tx_id = %s AND seq < %s "
            "ORDER BY seq"
        )
        self.select_conversation = f"SELECT conversation FROM {s}.txs WHERE tx_id = %s"
        self.release_tx = (
            f"UPDATE {s}.txs SET owner = NULL, lease_until = NULL, "
            f"epoch = nextval('{s}.epochs'), history = COALESCE(%s, history) WHERE tx_id = %s"
        )
        self.delete_tx = (  # with its conversation's messages
            f"WITH t AS (DELETE FROM {s}.txs WHERE tx_id = %s RETURNING tx_id) "
            f"DELETE FROM {s}.conversation_messages AS m USING t WHERE m.tx_id = t.tx_id"
        )
        self.delete_log = f"DELETE FROM {s}.log WHERE tx_id = %s"
        self.delete_undos = f"DELETE FROM {s}.undos WHERE tx_id = %s"
        # ---------------------------------------------------------------- the log
        columns = "tx_id, seq, kind, step, num, name, body, extra"
        self.insert_log = (
            "INSERT INTO {s}.log (" + columns + ") "
            "SELECT %s, q, k, st, n, nm, b, e FROM unnest(%s::bigint[], %s::smallint[], "
            "%s::bigint[], %s::bigint[], %s::bytea[], %s::bytea[], %s::bytea[]) "
            "AS u(q, k, st, n, nm, b, e)"
        ).format(s=s)
        # A write whose connection broke after the server committed it is sent again with the
        # same events at the same seqs: the upsert makes that retry harmless (`WHERE true`:
        # else `ON` would read as a join's). The fenced insert of a step is `Hot.log_fenced`.
        self.insert_log += " WHERE true" + _UPSERT_LOG
        self.select_log = (
            f"SELECT seq, kind, step, num, name, body, extra FROM {s}.log "
            "WHERE tx_id = %s ORDER BY seq"
        )
        self.delete_log_rows = f"DELETE FROM {s}.log WHERE tx_id = %s AND seq = ANY(%s::bigint[])"
        self.delete_log_writes_from = (
            f"DELETE FROM {s}.log WHERE tx_id = %s AND seq >= %s AND kind = %s"
        )
        # ---------------------------------------------------------------- undo records
        self.insert_undo = (
            f"INSERT INTO {s}.undos (tx_id, step_id, seq, record) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (tx_id, step_id, seq) DO UPDATE SET record = excluded.record"
        )
        self.delete_undo = f"DELETE FROM {s}.undos WHERE tx_id = %s AND step_id = %s AND seq = %s"
        self.select_undos = (
            f"SELECT step_id, seq, record FROM {s}.undos WHERE tx_id = %s ORDER BY step_id, seq"
        )
        # ---------------------------------------------------------------- history
        self.insert_ended = (
            f"INSERT INTO {s}.ended (tx_id, record, isolation, history, steps, ended_at) "
            "SELECT tx_id, record, isolation, COALESCE(%s, history), %s, %s "
            f"FROM {s}.txs WHERE tx_id = %s"
        )
        self.select_ended = (
            f"SELECT DISTINCT ON (tx_id) tx_id, record, history, ended_at, seq FROM {s}.ended "
            "ORDER BY tx_id, seq DESC"
        )
        self.select_ended_list = (
            "SELECT tx_id, record, history, ended_at FROM (" + self.select_ended + ") AS e "
            "ORDER BY seq DESC LIMIT %s"
        )
        self.select_ended_tx = (
            f"SELECT record, history, steps, ended_at FROM {s}.ended WHERE tx_id = %s "
            "ORDER BY seq DESC LIMIT 1"
        )
        self.prune_beyond = (
            f"DELETE FROM {s}.ended WHERE seq <= "
            f"(SELECT seq FROM {s}.ended ORDER BY seq DESC LIMIT 1 OFFSET %s)"
        )
        self.prune_before = f"DELETE FROM {s}.ended WHERE ended_at < %s"
        # ---------------------------------------------------------------- the outbox
        outbox_columns = (
            "id, tx_id, step_id, channel, payload, idempotency_key, attempts, last_error, "
            "not_before"
        )
        self.select_pending = (
            "SELECT " + outbox_columns + " FROM {s}.outbox WHERE NOT delivered ORDER BY id LIMIT %s"
        ).format(s=s)
        self.select_pending_of = (
            "SELECT " + outbox_columns + " FROM {s}.outbox WHERE NOT delivered AND tx_id = %s "
            "ORDER BY id LIMIT %s"
        ).format(s=s)
        #: Claim up to %s due, unclaimed entries (of any transaction, or of one) for a
        #: dispatcher, skipping those another dispatcher is claiming right now.
        claimable = (
            "SELECT id FROM {s}.outbox WHERE NOT delivered AND not_before <= %s "
            "AND claimed_until <= %s{of} ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
        )
        claim = (
            "UPDATE {s}.outbox AS o SET claimed_by = %s, claimed_until = %s "
            "FROM ("
            + claimable
            + ") AS c WHERE o.id = c.id RETURNING "
            + ", ".join(f"o.{column}" for column in outbox_columns.split(", "))
        )
        self.claim_outbox = claim.format(s=s, of="")
        self.claim_outbox_of = claim.format(s=s, of=" AND tx_id = %s")
        self.mark_delivered = (
            f"UPDATE {s}.outbox SET delivered = true, claimed_until = 0 WHERE id = %s"
        )
        self.mark_failed = (
            f"UPDATE {s}.outbox SET attempts = attempts + 1, last_error = %s, not_before = %s, "
            "claimed_until = 0 WHERE id = %s AND NOT delivered"
        )
        self.select_outbox_entry = f"SELECT 1 FROM {s}.outbox WHERE id = %s"
        # ---------------------------------------------------------------- requests
        request_columns = (
            "id, kind, scope_id, state, digest, record, decision, created_at, updated_at"
        )
        self.insert_request = (
            f"INSERT INTO {s}.requests ({request_columns}) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING"
        )
        self.select_request = f"SELECT {request_columns} FROM {s}.requests WHERE id = %s"
        self.select_requests_of = (
            f"SELECT {request_columns} FROM {s}.requests WHERE scope_id = %s "
            "ORDER BY created_at, id"
        )
        #: The compare-and-set of a request's state: one conditional update, so of two
        #: workers racing to decide or consume a request exactly one changes it.
        self.set_request_state = (
            f"UPDATE {s}.requests SET state = %s, decision = %s, updated_at = %s "
            f"WHERE id = %s AND state = ANY(%s::text[]) RETURNING {request_columns}"
        )
        self.list_requests = (
            f"SELECT {request_columns} FROM {s}.requests WHERE kind = %s AND state = %s "
            "ORDER BY created_at, id LIMIT %s"
        )
        self.upsert_audit = (
            f"INSERT INTO {s}.plan_audit (run_id, seq, event) "
            "SELECT %s, q, e FROM unnest(%s::bigint[], %s::text[]) AS u(q, e) WHERE true "
            "ON CONFLICT (run_id, seq) DO UPDATE SET event = excluded.event"
        )
        self.select_audit = f"SELECT event FROM {s}.plan_audit WHERE run_id = %s ORDER BY seq"
        # ---------------------------------------------------------------- plan runs
        self.insert_plan = (
            "INSERT INTO {s}.plan_runs (run_id, record, status, owner, epoch, lease_until, "
            "cancel, created_at, updated_at) VALUES (%s, %s, 'RUNNING', %s, "
            "nextval('{s}.epochs'), " + _LEASE + ", NULL, %s, %s) "
            "ON CONFLICT (run_id) DO NOTHING RETURNING epoch"
        ).format(s=s)
        self.insert_nodes = (
            f"INSERT INTO {s}.plan_nodes (run_id, node_id, position, state, attempt, record) "
            "SELECT %s, n, o, st, a, r FROM unnest(%s::text[], %s::text[], %s::text[], "
            "%s::text[]) WITH ORDINALITY AS u(n, st, a, r, o)"
        )
        #: The fence of a plan-run write: the run still at the writer's epoch (the row lock
        #: this takes keeps a claim out until the write commits); also its status and time.
        self.plan_fence = (
            f"UPDATE {s}.plan_runs SET updated_at = %s, status = coalesce(%s, status) "
            "WHERE run_id = %s AND epoch = %s"
        )
        #: A plan run still at the writer's epoch, locked against a claim (which takes its
        #: row `FOR UPDATE`) until the caller's transaction ends: the fence of a request write.
        self.plan_key_share = (
            f"SELECT 1 FROM {s}.plan_runs WHERE run_id = %s AND epoch = %s "
            "AND status = 'RUNNING' FOR KEY SHARE"
        )
        self.update_nodes = (
            f"UPDATE {s}.plan_nodes AS p SET state = u.st, attempt = u.a, "
            "record = p.record || u.r "
            "FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[]) AS u(n, st, a, r) "
            "WHERE p.run_id = %s AND p.node_id = u.n"
        )
        self.update_node_if = (
            f"UPDATE {s}.plan_nodes SET state = %s, attempt = %s, record = record || %s "
            "WHERE run_id = %s AND node_id = %s AND attempt IS NOT DISTINCT FROM %s "
            "AND state = ANY(%s::text[])"
        )
        #: Take a resource: a new row, or the row this node held already; the primary key
        #: is the guard (a concurrent insert of the same resource waits for the other's end).
        self.hold = (
            f"INSERT INTO {s}.plan_holds AS h (resource, run_id, node_id, attempt, acquired_at) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (resource) DO UPDATE SET "
            "attempt = excluded.attempt, acquired_at = excluded.acquired_at "
            "WHERE h.run_id = excluded.run_id AND h.node_id = excluded.node_id"
        )
        self.unhold = f"DELETE FROM {s}.plan_holds WHERE run_id = %s AND node_id = %s"
        self.unhold_attempt = (
            f"DELETE FROM {s}.plan_holds WHERE run_id = %s AND node_id = %s AND attempt = %s"
        )
        self.unhold_run = f"DELETE FROM {s}.plan_holds WHERE run_id = %s"
        self.select_holds = (
            f"SELECT resource, run_id, node_id, attempt FROM {s}.plan_holds ORDER BY resource"
        )
        #: Serialize the writes that take or free holds and units (one lock per schema,
        #: held to commit).
        self.lock_holds = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
        self.used_units = (
            f"SELECT coalesce(sum(units), 0) FROM {s}.plan_units WHERE resource = %s "
            "AND NOT (run_id = %s AND node_id = %s)"
        )
        self.take_units = (
            f"INSERT INTO {s}.plan_units (resource, run_id, node_id, attempt, units, "
            "acquired_at) SELECT u.r, %s, %s, %s, u.n, %s "
            "FROM unnest(%s::text[], %s::bigint[]) AS u(r, n) "
            "ON CONFLICT (resource, run_id, node_id) DO UPDATE SET attempt = excluded.attempt, "
            "units = excluded.units, acquired_at = excluded.acquired_at"
        )
        #: Take a token from a tool's bucket (tool, burst, burst, per_second, burst,
        #: per_second): refilled by the server's clock since its last take, up to the burst,
        #: full at first; no row if it has no token. The row lock orders racing takes.
        self.take_token = (
            f"INSERT INTO {s}.plan_rates AS b (tool, tokens, updated_at) "
            f"VALUES (%s, %s - 1, {_CLOCK}) ON CONFLICT (tool) DO UPDATE SET "
            f"tokens = {_REFILLED} - 1, updated_at = {_CLOCK} WHERE {_REFILLED} >= 1 "
            "RETURNING tokens"
        )
        self.give_token = (
            f"UPDATE {s}.plan_rates SET tokens = least(tokens + 1, %s) WHERE tool = %s"
        )
        self.select_rates = f"SELECT tool, tokens, updated_at FROM {s}.plan_rates ORDER BY tool"
        self.ununits = f"DELETE FROM {s}.plan_units WHERE run_id = %s AND node_id = %s"
        self.ununits_run = f"DELETE FROM {s}.plan_units WHERE run_id = %s"
        self.select_units = (
            f"SELECT resource, run_id, node_id, units FROM {s}.plan_units "
            "ORDER BY resource, run_id, node_id"
        )
        self.cancel_plan = (
            f"UPDATE {s}.plan_runs SET cancel = %s WHERE run_id = %s AND status = 'RUNNING' "
            "AND cancel IS NULL"
        )
        self.select_plan_exists = f"SELECT 1 FROM {s}.plan_runs WHERE run_id = %s"
        self.select_cancel = f"SELECT cancel FROM {s}.plan_runs WHERE run_id = %s"
        self.select_plan = (
            f"SELECT record, status, owner, cancel, created_at, updated_at FROM {s}.plan_runs "
            "WHERE run_id = %s"
        )
        self.select_plan_nodes = (
            f"SELECT node_id, state, attempt, record FROM {s}.plan_nodes WHERE run_id = %s "
            "ORDER BY position"
        )
        self.list_plans = (
            f"SELECT run_id, status, updated_at FROM {s}.plan_runs "
            "ORDER BY updated_at DESC, run_id LIMIT %s"
        )
        self.running_plans = (
            f"SELECT run_id, owner FROM {s}.plan_runs WHERE status = 'RUNNING' ORDER BY run_id"
        )
        self.orphaned_plans = (
            f"SELECT run_id FROM {s}.plan_runs WHERE status = 'RUNNING' "
            "AND (lease_until IS NULL OR lease_until < now()) ORDER BY run_id"
        )
        self.claim_plan = (
            "UPDATE {s}.plan_runs SET owner = %s, epoch = nextval('{s}.epochs'), "
            "lease_until = " + _LEASE + " WHERE run_id = ("
            "SELECT run_id FROM {s}.plan_runs WHERE run_id = %s "
            "AND owner IS NOT DISTINCT FROM %s AND status = 'RUNNING' "
            "AND (lease_until IS NULL OR lease_until < now()) FOR UPDATE SKIP LOCKED) "
            "RETURNING epoch"
        ).format(s=s)
