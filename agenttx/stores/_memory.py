"""`MemoryStore`: the `Store` protocol in process memory, for tests and single-process agents."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import attrs

from .._errors import InvalidArgument, StorageError, TransactionNotFound
from .._limits import DEFAULT_ISOLATION, Isolation, check_isolation
from ._approvals import MemoryRequests
from ._overlay import Overlay
from ._protocol import (
    MAX_STEP,
    check_key,
    check_step,
    check_tx_id,
    check_value,
    snapshot_not_found,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._approvals import RequestRow, RequestStore
    from ._protocol import Store

__all__ = ["MemoryStore"]


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
    _txs: dict[str, Overlay] = attrs.field(init=False, factory=dict)
    _requests: MemoryRequests = attrs.field(init=False, factory=MemoryRequests)

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
            self._txs[tx_id] = Overlay.begun(isolation)

    def commit(self, tx_id: str) -> int:
        """Validate and publish the overlay atomically, first committer wins (`Store.commit`)."""
        with self._lock:
            tx = self._open(tx_id)
            committed = self._committed
            tx.validate(lambda key: 0 if (current := committed.get(key)) is None else current[0])
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
            tx.read(key, 0 if current is None else current[0])
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
            base = tx.base(key)
            if base is None:
                current = self._committed.get(key)
                base = 0 if current is None else current[0]
        tx.write(key, (base, value))

    def written_keys(self, tx_id: str) -> tuple[str, ...]:
        """The keys in the overlay, tombstones included, sorted."""
        with self._lock:
            tx = self._open(tx_id)
        return tuple(sorted(tx.overlay))

    # ------------------------------------------------------------ snapshots

    def snapshot(self, tx_id: str, step: int) -> None:
        """Record the journal position for `step`, in O(1) (`Store.snapshot`)."""
        if type(step) is not int or not 0 <= step <= MAX_STEP:  # `check_step`'s common case
            check_step(step)
        with self._lock:
            tx = self._txs.get(tx_id)  # `_open`, inline: once a step
        if tx is None:
            raise TransactionNotFound(tx_id=tx_id)
        tx.take_snapshot(step, len(tx.journal))

    def restore(self, tx_id: str, step: int) -> int:
        """Revert the mutations since snapshot `step`, newest first (`Store.restore`)."""
        check_step(step)
        with self._lock:
            tx = self._open(tx_id)
        position = tx.snapshots.get(step)
        if position is None:
            raise StorageError(snapshot_not_found(tx_id, step))
        return tx.rewind(step, position)

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

    # ------------------------------------------------------------ approvals and reviews

    def add_request(self, row: RequestRow, *, fence: str | None = None) -> None:
        """Keep approval request or review `row` (`RequestStore.add_request`; in one process
        there is no owner to fence)."""
        self._requests.add_request(row, fence=fence)

    def get_request(self, request_id: str) -> RequestRow | None:
        """The request with this id, or None."""
        return self._requests.get_request(request_id)

    def requests_of(self, scope_id: str) -> tuple[RequestRow, ...]:
        """The requests of one transaction or plan run, oldest first."""
        return self._requests.requests_of(scope_id)

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
        """The compare-and-set of `RequestStore.set_request_state` (`fence` is ignored)."""
        return self._requests.set_request_state(
            request_id, expect, state, decision=decision, now=now, fence=fence
        )

    def list_requests(self, kind: str, state: str, limit: int) -> tuple[RequestRow, ...]:
        """Up to `limit` requests of `kind` in `state`, oldest first."""
        return self._requests.list_requests(kind, state, limit)

    # ------------------------------------------------------------ helpers

    def _open(self, tx_id: str) -> Overlay:
        """The open transaction `tx_id`; the caller holds the lock."""
        tx = self._txs.get(tx_id)
        if tx is None:
            raise TransactionNotFound(tx_id=tx_id)
        return tx


if TYPE_CHECKING:

    def _conforms(store: MemoryStore) -> Store:
        return store  # mypy checks here that MemoryStore satisfies the protocol


if TYPE_CHECKING:

    def _keeps_requests(store: MemoryStore) -> RequestStore:
        return store  # mypy checks here that MemoryStore satisfies the protocol
