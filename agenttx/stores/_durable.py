"""`DurableStore`: a `Store` that also keeps what a transaction needs to survive a crash.

A `Transaction` on a durable store writes, besides its state: its descriptive record, one record
per successful step with the step's staged effects and the transaction's progress, and its undo
records, before the effects they undo. After a crash, `Engine.recover` reads them back to abort
(compensate) or resume each open transaction, and the outbox holds every committed effect until
it is delivered. The store treats every record as opaque JSON text, except the outbox's fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeGuard, final, runtime_checkable

import attrs

from .._errors import InvalidArgument
from .._limits import DEFAULT_ISOLATION, Isolation
from ._protocol import MAX_INT64, MAX_STEP, Store, check_int, check_value

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "DurableStore",
    "EffectRow",
    "EndedTransaction",
    "OutboxEntry",
    "TxImage",
    "UndoRow",
    "is_durable",
    "is_store",
]


def _step_id(_instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    check_int(value, attribute.name, MAX_STEP)


def _seq(_instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    check_int(value, attribute.name, MAX_INT64)


def _text(_instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str):
        raise InvalidArgument(f"{attribute.name} must be text, not {type(value).__name__}")
    try:
        check_value(value)
    except InvalidArgument:
        raise InvalidArgument(
            f"{attribute.name} must be text that can be encoded as UTF-8 (a lone surrogate)"
        ) from None


@final
@attrs.frozen(kw_only=True)
class EffectRow:
    """A staged effect as stored: its step, channel, payload (JSON text) and idempotency key.

    Checked on construction: `InvalidArgument` names the field (a step id is an `int` in
    0-`MAX_STEP`; the others are text that can be encoded as UTF-8).
    """

    step_id: int = attrs.field(validator=_step_id)
    channel: str = attrs.field(validator=_text)
    payload: str = attrs.field(validator=_text)
    idempotency_key: str = attrs.field(validator=_text)


@final
@attrs.frozen(kw_only=True)
class UndoRow:
    """An undo record as stored: its place (step, sequence number) and the record (JSON text).

    Checked on construction, as `EffectRow` is (`seq` is an `int` in 0-2**63-1).
    """

    step_id: int = attrs.field(validator=_step_id)
    seq: int = attrs.field(validator=_seq)
    record: str = attrs.field(validator=_text)


@final
@attrs.frozen(kw_only=True)
class TxImage:
    """Everything durable about one transaction, as `DurableStore.load` and `peek` return it
    (and `SQLiteStore.peek_ended`, for one kept as history once it ended).

    `steps` are `(step_id, record)` in step order, `undos` in `(step_id, seq)` order and
    `effects` in staging order. `progress` is the text of the last `record_step` (or
    `record_progress`), or `None` if there was none. `owner` describes the process that last
    held the transaction (JSON text, the store's own format), `None` if unknown or released by
    `discard_state`: the owner before the `load` or `claim` that returned the image (for
    `peek`, the current owner). `record` is the one `begin` or `record_transaction` wrote last
    (`"null"` if neither wrote one). Built by the store from what it checked when it stored it.
    """

    tx_id: str
    record: str
    progress: str | None
    steps: tuple[tuple[int, str], ...]
    undos: tuple[UndoRow, ...]
    effects: tuple[EffectRow, ...]
    owner: str | None
    #: The steps that have a snapshot the store can restore, ascending. A step whose snapshot
    #: was taken but never reached the disk is missing: nothing was written durably after it.
    snapshots: tuple[int, ...] = ()


@final
@attrs.frozen(kw_only=True)
class EndedTransaction:
    """An ended transaction that a store keeps as history (see `SQLiteStore`'s retention).

    `record` is its descriptive record (JSON text, as for `TxImage`); `history` is the JSON
    text the transaction layer gave when it ended (what became of each step attempt, the final
    status, ...), or `None` if it gave none; `ended_at` is when it ended, in seconds since the
    epoch, by the store's clock. Built by the store from what it checked when it stored it.
    """

    tx_id: str
    record: str
    history: str | None
    ended_at: float


@final
@attrs.frozen(kw_only=True)
class OutboxEntry:
    """A committed effect waiting in the outbox, with its delivery history.

    Built by the store from what it checked when it stored the effect.
    """

    id: int
    tx_id: str
    step_id: int
    channel: str
    payload: str
    idempotency_key: str
    attempts: int
    last_error: str | None
    not_before: float  # seconds since the epoch; 0 for "now"


@runtime_checkable
class DurableStore(Store, Protocol):
    """A `Store` whose transactions, undo records and committed effects survive the process.

    **Who calls it, and in what order.** For each transaction, its owner calls `begin` with
    the transaction's descriptive `record`; then, interleaved with the `Store` calls,
    `record_undo` as soon as a tool registers an undo (before the effect it undoes happens),
    `forget_undo` when a compensation succeeded, and `record_step` when a step succeeded
    (`record_progress` when one failed). On `commit`, a durable store also moves the
    transaction's staged effects into the outbox, in the same atomic commit, and forgets its
    undo records. `restore(tx, K)` also drops the step records and staged effects of steps
    >= K (not the undo records: those leave one by one through `forget_undo`). `discard` ends
    the transaction and drops its undo records; `discard_state` keeps the transaction's record
    and its remaining undo records, so that the next recovery retries them.

    **History.** `commit`, `discard` and `discard_state` take an optional `history`: JSON text,
    opaque to the store, that the transaction layer gives to describe how the transaction
    ended. A store may keep an ended transaction (its record, step records and `history`) as
    history, for inspection, in the same atomic write that ends it: never in a write of its
    own, so no crash can separate the end from its history. `SQLiteStore` does, within its
    retention. An ended transaction is not open in any sense of this protocol: it is not in
    `open_transactions`, `owner`, `load`, `claim` and `peek` raise `TransactionNotFound` for
    it, `discard` of it is a no-op, and `begin` of its id begins a new transaction (whose end
    replaces the history).

    **Atomicity and buffering.** `put` and `delete` may be buffered in the process: the writes
    of a step reach the disk, with their journal entries, in the atomic write of the next
    `record_step`, `record_progress`, `record_undo`, `restore`, `commit` or `flush`. So a crash
    loses at most the state writes of the step that was running, which a resume rewinds anyway.
    `record_undo` is durable when it returns: write-ahead of the effect. (A store may write
    them on other durable calls too; `SQLiteStore` does on every one.) After a crash, `load`
    gives the transaction back exactly as it was at its last durable write: the writes *and
    the snapshots* made after it are lost, so restoring such a snapshot raises `StorageError`
    and `TxImage.snapshots` omits it. "Nothing to revert" would be right for those snapshots
    (their writes are lost too), but a store cannot tell them from snapshots never taken or
    already dropped, for which it would be wrong.

    **Recovery.** `open_transactions()` lists every transaction begun and not ended in the
    file, by any process; `load(tx_id)` reads one back and makes this process its owner, so
    that the usual `Store` calls work on it (its overlay, journal and snapshots included).
    A transaction is open in the file from its `begin` (so `begin` refuses an id that any
    process has open, or that `discard_state` kept) until `commit` or `discard`. `is_open` answers
    for this store instance only. Ownership is fenced: once another store has loaded the
    transaction (or committed or discarded it), the previous holder's next durable call
    raises `StorageError` ("lease lost"), and the holder lets it go and remembers it: every
    later call of that store on it raises the same error and changes nothing, until it
    begins, loads or claims the id again. `discard` and `discard_state` work whoever holds it,
    except that a store that held the transaction and lost it raises too, rather than end it
    under its new owner. A store whose transactions can be taken over while their holder runs
    (leases that expire: `PostgresStore`) may also have `check_lease(tx_id)`, which a
    transaction calls before each tool runs: `StorageError` ("lease lost") unless the store
    still holds it. `owner(tx_id)` and `peek(tx_id)` inspect a transaction without
    taking it over. Recovery takes a transaction over with `claim`, never `load`: a claim
    succeeds only if the owner is still the one the recoverer judged dead, atomically.

    **The outbox.** `pending_effects` lists undelivered entries, oldest first; a dispatcher
    calls `mark_delivered` or `mark_failed` for each. An entry is delivered at least once.
    Errors are as for `Store`: `InvalidArgument`, `TransactionNotFound`, `StorageError`.
    """

    def begin(
        self, tx_id: str, *, isolation: Isolation = DEFAULT_ISOLATION, record: str = "null"
    ) -> None:
        """`Store.begin`, writing the transaction durably with its descriptive `record` (JSON
        text) and its isolation level before it returns: one durable write, so that no crash can
        leave a transaction without its record (unless the caller omits it). The read versions
        that the isolation level records are durable like the writes (buffered until the next
        durable write), and `load` gives them back."""
        ...

    def commit(self, tx_id: str, *, history: str | None = None) -> int:
        """`Store.commit`, which also moves the staged effects to the outbox and forgets the
        undo records, in the same atomic commit; a store that keeps history keeps the
        transaction's with `history` (JSON text, or `None`) in that commit too."""
        ...

    def discard(self, tx_id: str, *, history: str | None = None) -> None:
        """`Store.discard`: end the transaction and forget its undo records, whoever holds it;
        a store that keeps history keeps the transaction's in the same write, with `history`
        (JSON text), or, if `None`, with the one `discard_state` kept, if any. A no-op for an id
        that is not open (an ended one included)."""
        ...

    def record_transaction(self, tx_id: str, record: str) -> None:
        """Store (or replace) the open transaction's descriptive record (JSON text), durably."""
        ...

    def record_step(
        self,
        tx_id: str,
        step_id: int,
        step: str,
        effects: Sequence[EffectRow],
        progress: str,
    ) -> None:
        """Durably and atomically: flush buffered writes, store step `step_id`'s record,
        append its staged `effects`, and replace the transaction's progress (JSON text).

        Recording a step again replaces its record. Each effect keeps its own `step_id`
        (normally `step_id`), which is what `restore` and the outbox go by.
        """
        ...

    def record_progress(self, tx_id: str, progress: str) -> None:
        """Durably and atomically: flush buffered writes and replace the progress."""
        ...

    def record_undo(self, tx_id: str, undo: UndoRow) -> None:
        """Store an undo record durably (flushing buffered writes first); replaces one in
        the same place."""
        ...

    def forget_undo(self, tx_id: str, step_id: int, seq: int) -> None:
        """Delete an undo record (its compensation succeeded). Idempotent."""
        ...

    def flush(self, tx_id: str) -> None:
        """Write the transaction's buffered writes durably. Idempotent."""
        ...

    def discard_state(self, tx_id: str, *, history: str | None = None) -> None:
        """End the transaction's state (overlay, journal, snapshots, steps, effects) but keep
        its record and remaining undo records for the next recovery, and `history` (JSON text;
        `None` keeps the one kept before, if any) for when it ends. Idempotent.

        Afterwards the transaction is not open, stays in `open_transactions` with no owner
        (`owner` returns `None`: no store holds it, and any recovery may claim it), and its id
        cannot be begun again until `discard`; `load` reopens it with the state `begin` leaves (an
        empty overlay, snapshot 0) and its undo records in the image.
        """
        ...

    def open_transactions(self) -> tuple[str, ...]:
        """The ids of all open transactions with a durable record, sorted: begun, in any
        process, and not committed or discarded, including those whose state `discard_state`
        ended. Never an ended transaction kept as history: recovery must not touch those."""
        ...

    def owner(self, tx_id: str) -> str | None:
        """The owner record of transaction `tx_id` (as `TxImage.owner`), without taking it over.

        JSON text with at least `pid` (int) and `hostname` (str), or `None` if unknown.
        Raises `TransactionNotFound` if the file has no such transaction.
        """
        ...

    def load(self, tx_id: str) -> TxImage:
        """Read a transaction back and take it over in this process (see the class docstring).

        The image names the previous owner. If this store already holds the transaction, its
        buffered writes are written first. Raises `TransactionNotFound` if the file has none.
        """
        ...

    def claim(self, tx_id: str, owner: str | None) -> TxImage | None:
        """Take transaction `tx_id` over for recovery if, and only if, its owner is still
        `owner`: `load`, fused with the check in one atomic compare-and-set.

        `owner` is what `owner(tx_id)` returned when the caller judged that owner dead. So of
        several recoverers racing for one transaction, in any processes, exactly one gets the
        image and the others get `None`: the first claim changes the owner, and the others'
        compare fails. Also `None`, taking nothing, when `owner` is a store open in this
        process (this one included): it is alive, whatever its process id says. Raises
        `TransactionNotFound` if the file has no such transaction (it may have ended since).
        """
        ...

    def peek(self, tx_id: str) -> TxImage:
        """Read a transaction back without taking it over: the image `load` would return
        (`owner` is the current owner), with no change to the file or to this store.

        Works for any process's transaction, whoever holds it, and changes no ownership: the
        holder's next durable call goes through. It writes nothing, so a transaction this
        store holds shows its last durable write, not its buffered writes. The image is one
        consistent state of the transaction. Raises `TransactionNotFound` if the file has none.
        """
        ...

    def pending_effects(
        self, limit: int = 100, *, tx_id: str | None = None
    ) -> tuple[OutboxEntry, ...]:
        """Up to `limit` undelivered outbox entries (of transaction `tx_id` only, if given), in
        commit then staging order. Entries that `mark_failed` holds back are listed too: the
        caller compares their `not_before` with its clock."""
        ...

    def mark_delivered(self, entry_id: int) -> None:
        """Mark an outbox entry delivered. Idempotent; `InvalidArgument` if there is none."""
        ...

    def mark_failed(self, entry_id: int, error: str, not_before: float) -> None:
        """Count a failed delivery: keep `error` and do not offer it again before `not_before`.

        A no-op on an entry already delivered (delivery wins); `InvalidArgument` if there is
        no such entry.
        """
        ...


_STORE_TYPES: dict[type, bool] = {}
_DURABLE_TYPES: dict[type, bool] = {}


def is_store(store: object) -> TypeGuard[Store]:
    """`isinstance(store, Store)`, remembered per class, like `is_durable`."""
    kind = type(store)
    conforms = _STORE_TYPES.get(kind)
    if conforms is None:
        conforms = _STORE_TYPES[kind] = isinstance(store, Store)
    return conforms


def is_durable(store: Store) -> TypeGuard[DurableStore]:
    """`isinstance(store, DurableStore)`, remembered per store class.

    A protocol `isinstance` check looks up every method (about 20 us); transactions ask it at
    every `begin`. The answer depends only on the class, whose methods are what count.
    """
    kind = type(store)
    durable = _DURABLE_TYPES.get(kind)
    if durable is None:
        durable = _DURABLE_TYPES[kind] = isinstance(store, DurableStore)
    return durable
