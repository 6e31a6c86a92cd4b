"""What a store may keep beyond `Store` and `DurableStore`: each capability is a protocol with
its contract, and the library asks a store for one only through these protocols.

A capability is optional: a store that lacks one is used without it, as the table says.

    protocol          kept by                      without it
    PlanStore         SQLiteStore, PostgresStore   plan runs live in the process only
    HistoryStore      SQLiteStore, PostgresStore   no stored audit trail of ended transactions
    ClaimingOutbox    PostgresStore                dispatchers read `pending_effects`
    LeasedStore       PostgresStore                recovery checks owners' processes on this host
    RequestStore      all three shipped stores     a table in this process (`MemoryRequests`)
    ConversationStore SQLiteStore, PostgresStore   a runner keeps its conversation in memory
    DecisionBellStore PostgresStore                a wait for decisions polls the store (`_bell`)

Which capabilities a store has is decided by its class (its methods), once: `is_plan_store`,
`keeps_history`, `claims_effects` and `leases_owners` remember the answer per class, so that no
protocol `isinstance` check (about 20 us) runs on a per-step path.

Every method raises as `Store`'s do: `InvalidArgument` for a malformed argument,
`TransactionNotFound` where it says so, `StorageError` when the storage fails (and, on a store
with owners, when another store took the transaction or run over). Each is safe to call from
any thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeGuard, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._durable import EndedTransaction, OutboxEntry, TxImage
    from ._plans import PlanChange, PlanImage, PlanNodeRow

__all__ = [
    "ClaimingOutbox",
    "ConversationStore",
    "HistoryStore",
    "LeasedStore",
    "PlanStore",
    "claims_effects",
    "has_capability",
    "is_plan_store",
    "keeps_conversations",
    "keeps_history",
    "leases_owners",
]


@runtime_checkable
class PlanStore(Protocol):
    """A store that keeps plan runs durably: a run's record and status, one row per node, the
    run's audit events, its cancellation, and the holds, units and rate tokens its nodes take.

    **Who calls it, and in what order.** A run's runner calls `begin_plan` once, then
    `write_plan` for every batch of node transitions (claims included) and reads
    `plan_cancel_reason` before each dispatch; the last `write_plan` sets the run's final
    `status`. Anyone may call `cancel_plan`, `read_plan`, `plan_runs`, `running_plans`,
    `orphaned_plans` and `plan_audit` at any time, from any process. Recovery calls
    `running_plans`, then `claim_plan` for each run whose owner it judged dead, and resumes the
    runs it claimed.

    **Atomicity.** `begin_plan`, `write_plan`, `cancel_plan` and `claim_plan` are each one
    atomic, durable write: a crash leaves all of it or none. Reads see one consistent state.
    Writes are fenced by owner: once a run was claimed by another store, the previous
    runner's `write_plan` raises `StorageError` and changes nothing.

    **Records.** The store treats node records, run records and events as opaque text: a
    change appends `PlanChange.append` to the node's record, never rewrites it.
    """

    def begin_plan(self, run_id: str, record: str, nodes: Sequence[PlanNodeRow]) -> None:
        """Write run `run_id` (its `record`, status RUNNING, owned by this store) with its
        `nodes`, in one durable write. `InvalidArgument` if the store has that run already.
        Not idempotent."""
        ...

    def write_plan(
        self,
        run_id: str,
        changes: Sequence[PlanChange],
        *,
        status: str | None = None,
        events: Sequence[tuple[int, str]] = (),
    ) -> tuple[bool | None, ...]:
        """Make node `changes` in order (and set the run's `status`) in one durable write, if
        this store holds the run, with the audit `events` (`(seq, JSON text)`, replacing any
        of the same seq). For each change, whether it was made: False if its `expect` (a
        compare-and-set) did not hold, None if the resource, units or rate token it would take
        are another's; that change alone is skipped. `StorageError` if another store took the
        run over, `TransactionNotFound` if there is no such run. Not idempotent: a change
        appends to its node's record."""
        ...

    def read_plan(self, run_id: str) -> PlanImage:
        """Run `run_id` as stored, read in one consistent read; `TransactionNotFound` if there
        is no such run. Changes nothing."""
        ...

    def claim_plan(self, run_id: str, owner: str | None) -> PlanImage | None:
        """Take RUNNING run `run_id` over for recovery if, and only if, its owner is still
        `owner` (what `running_plans` gave), in one atomic compare-and-set that also frees the
        dead runner's holds and units: the image, or None (another recoverer won, the run
        ended, or `owner` is alive by the store's own knowledge). Of several recoverers racing
        for one run, exactly one gets the image."""
        ...

    def cancel_plan(self, run_id: str, reason: str) -> bool:
        """Record that run `run_id` is cancelled, for whichever process runs it (it reads it
        before its next dispatch). False if the run has ended or was cancelled already (so
        repeating it changes nothing); `TransactionNotFound` if there is no such run."""
        ...

    def plan_cancel_reason(self, run_id: str) -> str | None:
        """The cancellation recorded for run `run_id`, or None. Cheap: a runner calls it before
        every dispatch."""
        ...

    def running_plans(self) -> tuple[tuple[str, str | None], ...]:
        """The RUNNING runs, any process's, as `(run_id, owner)`, by id."""
        ...

    def plan_runs(self, limit: int = 100) -> tuple[tuple[str, str, float], ...]:
        """Up to `limit` runs as `(run_id, status, updated_at)`, the last updated first."""
        ...

    def orphaned_plans(self) -> tuple[str, ...]:
        """The RUNNING runs whose runner is gone by the store's own knowledge, by id: those a
        recovery could take over now (`SQLiteStore`: no store of this process holds it and its
        owner's process is not alive on this host; `PostgresStore`: its lease has expired).
        Only reads; for people looking at runs (`agenttx plans` shows them as ORPHANED)."""
        ...

    def plan_audit(self, run_id: str) -> tuple[str, ...]:
        """The audit events stored for run `run_id` (`Event.to_json` texts), in seq order;
        empty if it has none (or there is no such run). `InvalidArgument` for a malformed id."""
        ...


@runtime_checkable
class HistoryStore(Protocol):
    """A durable store that keeps ended transactions as history (`DurableStore`'s
    **History**), read back for audits and `agenttx show`. Both methods only read, in one
    consistent read, and may be called by anyone at any time, on a read-only store too."""

    def ended_transactions(self, limit: int = 100) -> tuple[EndedTransaction, ...]:
        """Up to `limit` ended transactions kept as history, the last to end first."""
        ...

    def peek_ended(self, tx_id: str) -> tuple[EndedTransaction, TxImage]:
        """Ended transaction `tx_id` as kept: its row, and its image as it ended (its `owner`
        None, its undo records gone). `TransactionNotFound` if the store keeps no ended
        `tx_id` (it is open, was pruned, or never was); `InvalidArgument` for a malformed id."""
        ...


@runtime_checkable
class ClaimingOutbox(Protocol):
    """A durable store whose outbox hands each of several concurrent dispatchers its own
    entries. A dispatcher calls `claim_effects` instead of `pending_effects`, then
    `mark_delivered` or `mark_failed` for each entry it got."""

    def claim_effects(
        self,
        limit: int = 100,
        *,
        tx_id: str | None = None,
        now: float | None = None,
        hold: float | None = None,
    ) -> tuple[OutboxEntry, ...]:
        """Claim up to `limit` due undelivered entries (of transaction `tx_id` only, if given),
        in commit then staging order, for `hold` seconds (the store's default if None), in one
        atomic write: dispatchers running at once get disjoint entries, and an entry claimed
        and not marked within `hold` is offered again (so delivery stays at least once). `now`
        is the caller's clock, in seconds since the epoch."""
        ...


@runtime_checkable
class LeasedStore(Protocol):
    """A durable store that knows better than a process check on this host whether the
    owner of a transaction or plan run is alive (`PostgresStore`: leases renewed by the
    holder; its `claim` takes over only an expired one)."""

    def owner_alive(self, owner: str | None) -> bool:
        """Whether recovery must leave alone a transaction or plan run of `owner` (an owner
        record, as `DurableStore.owner` returns it) without trying to claim it. Pure: reads
        and changes nothing it need not; called once per open transaction or run."""
        ...

    def check_lease(self, tx_id: str) -> None:
        """Called before each tool of transaction `tx_id` runs: raise `StorageError` ("lease
        lost") unless this store still holds it, and holds it long enough that no recovery
        takes it over before the tool could return (renewing the lease if need be). Writes
        only to renew; `TransactionNotFound` if the store never held it."""
        ...


@runtime_checkable
class ReleasingStore(Protocol):
    """A durable store that can stop holding an open transaction so that another store, in any
    process, may claim it at once (`Engine.close`)."""

    def release(self, tx_id: str) -> None:
        """Write what is buffered for `tx_id`, then give up this store's hold on it, in one
        fenced write; a no-op if this store does not hold it; `StorageError` if another store
        took it over meanwhile (it is let go all the same). Idempotent."""
        ...


@runtime_checkable
class ConversationStore(Protocol):
    """A durable store that keeps, with each open transaction, the conversation of the agent
    that drives it (an integration's runner: docs/integrations.md#durable-agent-runs).

    **Who calls it, and in what order.** The runner of the transaction calls
    `record_conversation` when a model turn arrives (before any of its calls runs) and when
    the turn's results are in; anyone may call `read_conversation`, from any process (a
    restarted agent, after `Engine.recover("resume")`).

    **Atomicity.** `record_conversation` is one durable write, fenced like every write of the
    transaction: once another store took the transaction over (or it ended), it raises
    `StorageError` and changes nothing. It replaces the state text and the messages from
    `start` on together, or changes nothing. The store treats both as opaque, and drops them
    when the transaction ends.

    **Append-only.** The messages are a log numbered from 0: a write appends its `messages`
    at `start` (the number of messages its writer knows to be recorded, so each message is
    written once), and replaces those from `start` on only when a writer rewrites the end of
    its history. A writer that gives `start` past the end of the log leaves a gap, which
    `read_messages` returns as missing messages: the reader compares their number with the
    count its state recorded.
    """

    def record_conversation(
        self, tx_id: str, text: str, messages: Sequence[str] = (), *, start: int = 0
    ) -> None:
        """Record the conversation of open transaction `tx_id`, held by this store, durably:
        `text` (JSON text) replaces the state recorded before, and `messages` (JSON texts)
        become the log's messages from position `start` on (those after them go). With the
        defaults, the log is emptied: `text` is the whole record. `InvalidArgument` for text
        that is not UTF-8, a `start` that is not an int >= 0, or a write over
        `MAX_CONVERSATION_BYTES`; `StorageError` if this store does not hold the transaction
        (any more). Idempotent."""
        ...

    def read_conversation(self, tx_id: str) -> str | None:
        """The last state text recorded for open transaction `tx_id`, or None if none was
        (or the transaction is not open). Reads only; one consistent read."""
        ...

    def read_messages(self, tx_id: str, count: int) -> tuple[str, ...]:
        """The messages of the log of `tx_id` at positions below `count`, in order (fewer if
        the log holds fewer; none once the transaction ended). Reads only."""
        ...


_ANSWERS: dict[tuple[type, type], bool] = {}


def has_capability(store: object, protocol: type) -> bool:
    """`isinstance(store, protocol)`, remembered per store class (the methods decide)."""
    key = (type(store), protocol)
    answer = _ANSWERS.get(key)
    if answer is None:
        answer = _ANSWERS[key] = isinstance(store, protocol)
    return answer


def is_plan_store(store: object) -> TypeGuard[PlanStore]:
    """Whether `store` keeps plan runs durably (`PlanStore`)."""
    return has_capability(store, PlanStore)


def keeps_history(store: object) -> TypeGuard[HistoryStore]:
    """Whether `store` keeps ended transactions (`HistoryStore`)."""
    return has_capability(store, HistoryStore)


def claims_effects(store: object) -> TypeGuard[ClaimingOutbox]:
    """Whether `store`'s outbox hands dispatchers their own entries (`ClaimingOutbox`)."""
    return has_capability(store, ClaimingOutbox)


def leases_owners(store: object) -> TypeGuard[LeasedStore]:
    """Whether `store` judges its owners alive itself and fences tools by leases
    (`LeasedStore`)."""
    return has_capability(store, LeasedStore)


def keeps_conversations(store: object) -> TypeGuard[ConversationStore]:
    """Whether `store` keeps agents' conversations with their transactions
    (`ConversationStore`)."""
    return has_capability(store, ConversationStore)


def releases(store: object) -> TypeGuard[ReleasingStore]:
    """Whether `store` can hand an open transaction back to recovery (`ReleasingStore`)."""
    return has_capability(store, ReleasingStore)
