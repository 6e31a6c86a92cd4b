"""`MemoryStore`: the `Store` protocol in process memory, for tests and single-process agents."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, TypeAlias

import attrs

from .._errors import (
    InvalidArgument,
    ReadConflict,
    StorageError,
    TransactionNotFound,
    WriteConflict,
)
from .._limits import DEFAULT_ISOLATION, Isolation, check_isolation
from ._protocol import check_key, check_step, check_tx_id, check_value, snapshot_not_found

if TYPE_CHECKING:
    from ._protocol import Store

__all__ = ["MemoryStore"]

#: An overlay entry: (base version, value), the value `None` for a tombstone. Entries are
#: immutable, so the journal can hold the very tuple it will put back.
_Entry: TypeAlias = tuple[int, "str | None"]
#: A journal entry: (key, the key's prior overlay entry, or `None` if it had none).
_Undo: TypeAlias = tuple[str, "_Entry | None"]


@attrs.define(eq=False, repr=False)
class _Tx:
    """One open transaction's private state; only that transaction's calls touch it."""

    overlay: dict[str, _Entry] = attrs.Factory(dict)
    journal: list[_Undo] = attrs.Factory(list)
    #: step -> journal length when the snapshot was taken. Kept in the order the snapshots were
    #: taken (a retaken step moves to the end), so journal positions never decrease along it.
    snapshots: dict[int, int] = attrs.Factory(lambda: {0: 0})
    #: True while the steps in `snapshots` also increase along it, as they do when a transaction
    #: snapshots each step before running it: then a restore drops a suffix, popped in O(dropped).
    steps_in_order: bool = True
    #: key -> the committed version the transaction first read it at; `None` under read
    #: committed, which records no reads. Reads by steps later rewound stay recorded, and fix
    #: the base of a later write of the key: conservative, never unsafe.
    reads: dict[str, int] | None = None
    #: Whether commit validates `reads` (serializable).
    serializable: bool = False


@attrs.define(eq=False, repr=False)
class MemoryStore:
    """A `Store` held in process memory: nothing touches files or the network.

    Costs: `get`, `put`, `delete` and `snapshot` are O(1); `restore` is O(mutations reverted)
    plus O(snapshots dropped) (O(snapshots) if they were taken out of step order); `commit` is
    O(keys written); `written_keys` sorts the overlay. Memory grows with the
    committed data and, per open transaction, with its overlay and journal (one entry per
    mutation, until a restore reverts it or the transaction ends).

    Thread safety: one `threading.Lock` guards everything shared: the committed map, the commit
    counter and the set of open transactions. `commit` holds it while it validates and
    publishes, so a commit is atomic to every other thread; the other methods hold it only for
    a lookup. A transaction's overlay, journal and snapshots are touched only by calls for that
    transaction, which must not overlap (its `Transaction` serializes them). So calls for
    different transactions may run in any threads at once, and `read_committed`,
    `committed_version`, `is_open` and `discard` may run anywhere; two overlapping calls for
    the same transaction are not supported, except that `discard` may end a transaction from
    another thread (an idle reaper, say): a call of its owner that overlaps the discard takes
    effect wholly before it, or raises `TransactionNotFound`. Nothing here calls back into user
    code while it holds the lock.

    The store does not persist anything: open transactions and committed data die with the
    process. Use `SQLiteStore` to keep them.
    """

    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _committed: dict[str, tuple[int, str]] = attrs.field(init=False, factory=dict)
    _commit_version: int = attrs.field(init=False, default=0)
    _txs: dict[str, _Tx] = attrs.field(init=False, factory=dict)

    def __repr__(self) -> str:
        with self._lock:
            keys, open_txs, version = len(self._committed), len(self._txs), self._commit_version
        return (
            f"<MemoryStore: {keys} committed keys, {open_txs} open transactions, "
            f"commit version {version}>"
        )

    # ------------------------------------------------------------ lifecycle

    def begin(self, tx_id: str, *, isolation: Isolation = DEFAULT_ISOLATION) -> None:
        """Open transaction `tx_id` and take its snapshot 0 (see `Store.begin`)."""
        check_tx_id(tx_id)
        check_isolation(isolation)
        with self._lock:
            if tx_id in self._txs:
                raise InvalidArgument(
                    f"transaction `{tx_id}` is already open: commit or discard it first"
                )
            self._txs[tx_id] = _Tx(
                reads=None if isolation == "read_committed" else {},
                serializable=isolation == "serializable",
            )

    def commit(self, tx_id: str) -> int:
        """Validate and publish the overlay atomically, first committer wins (`Store.commit`)."""
        with self._lock:
            tx = self._open(tx_id)
            committed = self._committed
            conflicts = []
            for key, (base, _) in tx.overlay.items():
                current = committed.get(key)
                if (0 if current is None else current[0]) != base:
                    conflicts.append(key)
            if conflicts:
                raise WriteConflict(key=min(conflicts))
            if tx.serializable and tx.reads:
                stale = [
                    key
                    for key, read in tx.reads.items()
                    if (0 if (current := committed.get(key)) is None else current[0]) != read
                ]
                if stale:
                    raise ReadConflict(key=min(stale))
            version = self._commit_version + 1
            for key, (_, value) in tx.overlay.items():
                if value is None:
                    committed.pop(key, None)
                else:
                    committed[key] = (version, value)
            self._commit_version = version
            del self._txs[tx_id]
        return len(tx.overlay)

    def discard(self, tx_id: str) -> None:
        """End the transaction and drop its state; a no-op if it is not open (`Store.discard`)."""
        with self._lock:
            self._txs.pop(tx_id, None)

    def is_open(self, tx_id: str) -> bool:
        """Whether the transaction has begun and not ended."""
        with self._lock:
            return tx_id in self._txs

    # ------------------------------------------------------------ the overlay

    def get(self, tx_id: str, key: str) -> str | None:
        """The transaction's own write of `key`, else the committed value (`Store.get`)."""
        check_key(key)
        with self._lock:
            tx = self._open(tx_id)
            entry = tx.overlay.get(key)
            if entry is not None:
                return entry[1]
            current = self._committed.get(key)
            if tx.reads is not None:
                tx.reads.setdefault(key, 0 if current is None else current[0])
        return None if current is None else current[1]

    def put(self, tx_id: str, key: str, value: str) -> None:
        """Write `value` to the overlay, journaled (`Store.put`)."""
        check_key(key)
        check_value(value)
        self._write(tx_id, key, value)

    def delete(self, tx_id: str, key: str) -> None:
        """Write a tombstone for `key` to the overlay, journaled (`Store.delete`)."""
        check_key(key)
        self._write(tx_id, key, None)

    def _write(self, tx_id: str, key: str, value: str | None) -> None:
        with self._lock:
            tx = self._open(tx_id)
            prior = tx.overlay.get(key)
            if prior is not None:
                base = prior[0]
            elif tx.reads is not None and key in tx.reads:
                base = tx.reads[key]
            else:
                current = self._committed.get(key)
                base = 0 if current is None else current[0]
        # Journal first: if the overlay write never happened, reverting the entry is harmless.
        tx.journal.append((key, prior))
        tx.overlay[key] = (base, value)

    def written_keys(self, tx_id: str) -> tuple[str, ...]:
        """The keys in the overlay, tombstones included, sorted."""
        with self._lock:
            tx = self._open(tx_id)
        return tuple(sorted(tx.overlay))

    # ------------------------------------------------------------ snapshots

    def snapshot(self, tx_id: str, step: int) -> None:
        """Record the journal position for `step`, in O(1) (`Store.snapshot`)."""
        check_step(step)
        with self._lock:
            tx = self._open(tx_id)
        snapshots = tx.snapshots
        if tx.steps_in_order and snapshots and step < next(reversed(snapshots)):
            tx.steps_in_order = False
        snapshots.pop(step, None)  # a retaken snapshot moves to the end: see `_Tx.snapshots`
        snapshots[step] = len(tx.journal)

    def restore(self, tx_id: str, step: int) -> int:
        """Revert the mutations since snapshot `step`, newest first (`Store.restore`)."""
        check_step(step)
        with self._lock:
            tx = self._open(tx_id)
        snapshots = tx.snapshots
        position = snapshots.get(step)
        if position is None:
            raise StorageError(snapshot_not_found(tx_id, step))
        journal, overlay = tx.journal, tx.overlay
        reverted = len(journal) - position
        for _ in range(reverted):
            key, prior = journal.pop()
            if prior is None:
                del overlay[key]
            else:
                overlay[key] = prior
        # Drop the snapshots of later steps and those of reverted history. Positions never
        # decrease along `snapshots`, so when steps do not either, those form a suffix.
        if tx.steps_in_order:
            while next(reversed(snapshots)) != step:
                snapshots.popitem()
        else:
            tx.snapshots = {s: p for s, p in snapshots.items() if s <= step and p <= position}
            tx.steps_in_order = list(tx.snapshots) == sorted(tx.snapshots)
        return reverted

    # ------------------------------------------------------------ committed state

    def read_committed(self, key: str) -> str | None:
        """The committed value of `key`, or `None`."""
        check_key(key)
        with self._lock:
            current = self._committed.get(key)
        return None if current is None else current[1]

    def committed_version(self, key: str) -> int:
        """The number of the commit that last wrote `key`, or 0 if it is absent."""
        check_key(key)
        with self._lock:
            current = self._committed.get(key)
        return 0 if current is None else current[0]

    # ------------------------------------------------------------ helpers

    def _open(self, tx_id: str) -> _Tx:
        """The open transaction `tx_id`; the caller holds the lock."""
        tx = self._txs.get(tx_id)
        if tx is None:
            raise TransactionNotFound(tx_id=tx_id)
        return tx


if TYPE_CHECKING:

    def _conforms(store: MemoryStore) -> Store:
        return store  # mypy checks here that MemoryStore satisfies the protocol
