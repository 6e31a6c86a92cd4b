"""What the log-based durable stores do alike, between a call and their SQL.

`SQLiteStore` and `PostgresStore` keep each transaction they hold as a `TxMirror` (the overlay,
journal and snapshots, and what the database has not received yet) and write it as events
appended to the transaction's log (the events are listed in `_sqlite_file`). `LogStore` is
their common base: the overlay calls (`get`, `put`, `delete`, `snapshot`, `written_keys`), the
events of a step, a restore, a progress or a flush, the reads of the committed state, and the
context manager (which calls the store's `close`). Each store brings
its own SQL through four hooks, called with the store's lock held:

- `_first_read(tx, key)`: the committed `(version, value)` of `key`, or `None`, read for `tx`;
- `_durable_write(tx_id, doing, statement, progress=None)`: the pending events, then a
  `PROGRESS` event holding `progress` and `statement`, durably, if the store still holds the
  transaction (it takes the lock itself);
- `_write_rows(tx_id, tx, rows, upto, *, doing)`: append `rows` (journal entries `[flushed,
  upto)` first) durably if the store still holds the transaction, then account for them;
- `_rewrite_log(tx_id, rows, since, doing)`: in one database transaction, if the store still
  holds the transaction, delete its `WRITE` events from seq `since` on (unless `None`) and
  append `rows`.

Every public method takes the store's lock for the whole call, so the mirror and the database
change together.

`Lost` remembers the transactions a store let go because another store took them over (or ended
them) while it held them: every later call of the store on such a transaction raises
`StorageError` ("lease lost"), a `discard` included, so that a worker that lost a transaction
never ends it under its new owner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, final

from .._errors import StorageError
from ._protocol import MAX_STEP, check_int, check_key, check_step, check_value, snapshot_not_found
from ._sqlite_file import EFFECT, PROGRESS, RESTORE, STEP, check_effects

if TYPE_CHECKING:
    import threading
    from collections.abc import Sequence
    from types import TracebackType

    from typing_extensions import Self

    from ._durable import EffectRow
    from ._sqlite_mirror import Row, TxMirror

__all__ = ["LogStore", "Lost"]

#: How many lost transactions a store remembers (the oldest are forgotten first): a worker
#: finds out at its next call, so only a transaction it keeps using long after counts.
_LOST_KEPT: Final = 4096


@final
class Lost:
    """The transactions a store held and lost to another store (a takeover, or an end there),
    each with the error its calls on it raise from then on; the store's lock guards it.

    A store adds a transaction when a fenced call finds it no longer its own, and forgets it
    when it holds it again (`begin`, `load`, `claim` of the same id).
    """

    __slots__ = ("_messages",)

    def __init__(self) -> None:
        self._messages: dict[str, str] = {}

    def add(self, tx_id: str, held: str, what: str) -> StorageError:
        """Remember that this store lost `tx_id`, which it held (`held`: at which epoch, or as
        which owner) and which was `what` (taken over, or ended, by another store); the error
        to raise, now and at every later call on it."""
        message = (
            f"lease lost: transaction `{tx_id}`, {held}, was {what}: this store no longer "
            "holds it, and writes, deletes and runs nothing for it"
        )
        messages = self._messages
        messages.pop(tx_id, None)
        messages[tx_id] = message
        if len(messages) > _LOST_KEPT:
            del messages[next(iter(messages))]
        return StorageError(message)

    def error(self, tx_id: str) -> StorageError | None:
        """The lease-lost error of `tx_id`, if this store lost it; else `None`."""
        message = self._messages.get(tx_id)
        return None if message is None else StorageError(message)

    def forget(self, tx_id: str) -> None:
        """`tx_id` is held here again (or anew)."""
        self._messages.pop(tx_id, None)


class LogStore:
    """The half of a log-based durable store that does not depend on its database (see the
    module docstring)."""

    __slots__ = ()

    _lock: threading.Lock
    _txs: dict[str, TxMirror]

    if TYPE_CHECKING:  # each store's own, with its SQL

        def _not_open(self, tx_id: str) -> Exception: ...

        def _check_not_closed(self) -> None: ...

        def _committed_row(self, key: str) -> tuple[int, str] | None: ...

        def _first_read(self, tx: TxMirror, key: str) -> tuple[int, str] | None: ...

        def close(self) -> None: ...

        def _durable_write(
            self,
            tx_id: str,
            doing: str,
            statement: tuple[str, tuple[object, ...]] | None,
            progress: str | None = None,
        ) -> None: ...

        def _write_rows(
            self,
            tx_id: str,
            tx: TxMirror,
            rows: list[Row],
            upto: int,
            *,
            doing: str,
            statement: tuple[str, tuple[object, ...]] | None = None,
        ) -> None: ...

        def _rewrite_log(
            self, tx_id: str, rows: list[Row], since: int | None, doing: str
        ) -> None: ...

        def _released(self, tx_id: str) -> tuple[str, tuple[object, ...]]: ...

        def _let_go(self, tx_id: str) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def is_open(self, tx_id: str) -> bool:
        """Whether this store holds the transaction: begun or loaded here, and not ended."""
        with self._lock:
            return tx_id in self._txs

    def release(self, tx_id: str) -> None:
        """Stop holding open transaction `tx_id`, and leave it to recovery at once.

        Its buffered writes are written and the store's hold on it is given up, in one fenced
        database transaction (SQLite: its owner cleared; PostgreSQL: its lease ended, with a
        new epoch), and this store no longer holds it: any store, in any process, may `claim`
        it now (`Engine.close` does this for its open transactions). A no-op if this store
        does not hold it; `StorageError` if another store took it over meanwhile (it is let go
        all the same).
        """
        with self._lock:
            if tx_id not in self._txs:
                return
        try:
            self._durable_write(tx_id, "release", self._released(tx_id))
        finally:
            with self._lock:
                self._let_go(tx_id)

    # ------------------------------------------------------------ the overlay

    def get(self, tx_id: str, key: str) -> str | None:
        """The transaction's own write of `key`, else the committed value (`Store.get`)."""
        check_key(key)
        with self._lock:
            tx = self._txs.get(tx_id)
            if tx is None:
                raise self._not_open(tx_id)
            entry = tx.overlay.get(key)
            if entry is not None:
                return entry[1]
            row = self._first_read(tx, key)
            version = 0 if row is None else row[0]
            if tx.read(key, version):
                tx.dirty_reads.append((key, version))
        return None if row is None else row[1]

    def put(self, tx_id: str, key: str, value: str) -> None:
        """Write `value` to the overlay, journaled and buffered until the next durable write."""
        check_key(key)
        check_value(value)
        self._write(tx_id, key, value)

    def delete(self, tx_id: str, key: str) -> None:
        """Write a tombstone for `key` to the overlay, journaled and buffered (`Store.delete`)."""
        check_key(key)
        self._write(tx_id, key, None)

    def _write(self, tx_id: str, key: str, value: str | None) -> None:
        with self._lock:
            tx = self._txs.get(tx_id)
            if tx is None:
                raise self._not_open(tx_id)
            base = tx.base(key)
            if base is None:
                row = self._first_read(tx, key)
                base = 0 if row is None else row[0]
            tx.write(key, (base, value))

    def written_keys(self, tx_id: str) -> tuple[str, ...]:
        """The keys in the overlay, tombstones included, sorted."""
        with self._lock:
            return tuple(sorted(self._open(tx_id).overlay))

    # ------------------------------------------------------------ snapshots

    def snapshot(self, tx_id: str, step: int) -> None:
        """Record the journal position for `step`, in O(1) and in memory (`Store.snapshot`);
        it reaches the database with the next durable write."""
        check_step(step)
        with self._lock:
            tx = self._txs.get(tx_id)
            if tx is None:
                raise self._not_open(tx_id)
            position = len(tx.journal)
            tx.take_snapshot(step, position)
            dirty = tx.dirty_snapshots
            dirty.pop(step, None)
            dirty[step] = position

    def restore(self, tx_id: str, step: int) -> int:
        """Rewind to snapshot `step` (`Store.restore`) and drop the step records and staged
        effects of steps >= `step` (`DurableStore`), durably, in one database transaction.

        The reverse replay runs on the mirror, in O(mutations reverted); the database loses
        the reverted `WRITE` events in one range delete, and gains a `RESTORE` event.
        """
        check_step(step)
        with self._lock:
            tx = self._open(tx_id)
            position = tx.snapshots.get(step)
            if position is None:
                raise StorageError(snapshot_not_found(tx_id, step))
            upto = min(position, len(tx.journal))
            rows = tx.pending(tx_id, upto)
            rows.append((tx_id, tx.next_seq + len(rows), RESTORE, step, None, None, None, None))
            since = tx.seq_at(position) if position < tx.flushed else None
            self._rewrite_log(
                tx_id, rows, since, f"restore snapshot {step} of transaction `{tx_id}`"
            )
            tx.persisted(len(rows), upto)
            if position < tx.flushed:
                tx.flushed = position
                while tx.runs and tx.runs[-1][0] >= position:
                    tx.runs.pop()
            return tx.rewind(step, position)

    # ------------------------------------------------------------ committed state

    def read_committed(self, key: str) -> str | None:
        """The committed value of `key`, or `None`."""
        check_key(key)
        with self._lock:
            self._check_not_closed()
            row = self._committed_row(key)
        return None if row is None else row[1]

    def committed_version(self, key: str) -> int:
        """The number of the commit that last wrote `key`, or 0 if it is absent."""
        check_key(key)
        with self._lock:
            self._check_not_closed()
            row = self._committed_row(key)
        return 0 if row is None else row[0]

    # ------------------------------------------------------------ durable records

    def record_step(
        self,
        tx_id: str,
        step_id: int,
        step: str,
        effects: Sequence[EffectRow],
        progress: str,
    ) -> None:
        """Durably and atomically: the buffered writes and snapshots, step `step_id`'s record
        (replacing one of the same step), its `effects` (each keeps its own `step_id`) and the
        transaction's progress.

        One `STEP` event holds the record, the progress (or NULL if it is unchanged, the usual
        case, which keeps the rows small) and, when it is the only snapshot taken since the
        last durable write, snapshot `step_id`; then one `EFFECT` event per effect. So a step
        without state writes or effects appends one row.
        """
        check_int(step_id, "step_id", MAX_STEP)
        check_value(step)
        check_value(progress)
        checked = [] if type(effects) in {tuple, list} and not effects else check_effects(effects)
        with self._lock:
            tx = self._txs.get(tx_id)
            if tx is None:
                raise self._not_open(tx_id)
            upto = len(tx.journal)
            dirty = tx.dirty_snapshots
            folded = dirty[step_id] if len(dirty) == 1 and step_id in dirty else None
            rows = tx.pending(tx_id, upto, snapshots=folded is None)
            seq = tx.next_seq + len(rows)
            changed = progress != tx.progress  # else the event says "unchanged": fewer bytes
            rows.append(
                (tx_id, seq, STEP, step_id, folded, None, step, progress if changed else None)
            )
            for effect in checked:
                seq += 1
                rows.append(
                    (
                        tx_id,
                        seq,
                        EFFECT,
                        effect.step_id,
                        None,
                        effect.channel,
                        effect.payload,
                        effect.idempotency_key,
                    )
                )
            self._write_rows(tx_id, tx, rows, upto, doing="record a step")
            if changed:
                tx.new_progress(progress, None)
            tx.effects += checked
            tx.steps[step_id] = step

    def record_progress(self, tx_id: str, progress: str) -> None:
        """Durably and atomically: the buffered writes and snapshots, and the new progress."""
        check_value(progress)
        self._durable_write(tx_id, "record progress", None, progress)

    def flush(self, tx_id: str) -> None:
        """Write the buffered writes, snapshots and reads durably; without them, no SQL runs."""
        with self._lock:
            tx = self._open(tx_id)
            if tx.flushed == len(tx.journal) and not tx.dirty_snapshots and not tx.dirty_reads:
                return
        self._durable_write(tx_id, "flush", None)

    def _write_pending(
        self,
        tx_id: str,
        tx: TxMirror,
        rows: list[Row],
        upto: int,
        *,
        doing: str,
        statement: tuple[str, tuple[object, ...]] | None,
        progress: str | None,
    ) -> None:
        """The end of a `_durable_write`: `rows` (the pending events), a `PROGRESS` event
        holding `progress` (unless `None`) and `statement`, written by `_write_rows`."""
        seq = tx.next_seq + len(rows)
        if progress is not None:
            rows.append((tx_id, seq, PROGRESS, None, None, None, progress, None))
        self._write_rows(tx_id, tx, rows, upto, doing=doing, statement=statement)
        if progress is not None:
            tx.new_progress(progress, seq)

    def _open(self, tx_id: str) -> TxMirror:
        """The transaction `tx_id` this store holds; the caller holds the lock."""
        tx = self._txs.get(tx_id)
        if tx is None:
            raise self._not_open(tx_id)
        return tx
