"""The in-process mirror of a `SQLiteStore` transaction, and the replay that rebuilds it.

Each transaction a `SQLiteStore` holds has a `TxMirror`: an `Overlay` (the overlay, journal,
snapshots and read versions, the very class `MemoryStore` uses), plus the bookkeeping of what
the file has and has not received yet. The live calls
change it; `replay` rebuilds it from the transaction's `log` (the events are described in
`_sqlite_file`), with the very code the live calls run, into the same overlay, journal and
snapshots (the prior entry of a `WRITE` is the key's overlay entry before it, so the file need
not store it). `read_transaction` reads a transaction's rows and replays them: `load` keeps the
mirror it returns, `peek` only the image; `read_ended` reads an ended one kept as history.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from itertools import islice
from typing import TYPE_CHECKING, TypeAlias

import attrs

from .._errors import StorageError, TransactionNotFound
from .._limits import ISOLATION_LEVELS
from ._durable import EffectRow, EndedTransaction, TxImage, UndoRow
from ._overlay import Overlay
from ._protocol import MAX_INT64
from ._sqlite_file import (
    EFFECT,
    PROGRESS,
    READ,
    RESTORE,
    SELECT_ENDED_TX,
    SELECT_LOG,
    SELECT_TX,
    SELECT_UNDOS,
    SNAPSHOT,
    STEP,
    WRITE,
)

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Sequence

__all__ = [
    "Row",
    "TxMirror",
    "ended_image",
    "read_ended",
    "read_transaction",
    "replay",
    "replay_image",
    "steps_text",
]

#: Compact JSON of what the store built itself (ids and texts: ASCII escapes are the fast path).
_encode_steps = json.JSONEncoder(separators=(",", ":")).encode

#: A `log` row: tx_id, seq, kind, step, num, name, body, extra.
Row: TypeAlias = tuple[
    str, int, int, "int | None", "int | None", "str | None", "str | None", "str | None"
]


@attrs.define(eq=False, repr=False)
class TxMirror(Overlay):
    """The in-process mirror of one transaction a store holds, and what it has not yet written.

    The overlay, journal, snapshots and read versions are an `Overlay`, as `MemoryStore` keeps
    them; a rewind also drops the staged effects of the steps rewound. Journal entries
    `[0, flushed)` are `WRITE` events in the file; `runs` maps journal positions to their `seq`s.
    """

    effects: list[EffectRow] = attrs.Factory(list)
    #: The live step records: step id -> record, as in the file (kept with the history when
    #: the transaction ends, without reading them back).
    steps: dict[int, str] = attrs.Factory(dict)
    flushed: int = 0
    #: (journal position, seq) where each run of consecutive `WRITE` events begins. The file's
    #: `WRITE` events are in journal order (a restore deletes those at or past its position).
    runs: list[tuple[int, int]] = attrs.Factory(list)
    #: Snapshots taken since the last durable point, in the order taken: step -> position.
    dirty_snapshots: dict[int, int] = attrs.Factory(dict)
    dirty_reads: list[tuple[str, int]] = attrs.Factory(list)
    next_seq: int = 0
    #: The current progress text (`None`: none yet); the seq of the `PROGRESS` event holding
    #: it (`None` if a `STEP` event holds it); and the seqs of replaced `PROGRESS` events
    #: still in the file (deleted `_STALE_PROGRESS` at a time, rather than one per write).
    progress: str | None = None
    progress_seq: int | None = None
    stale_progress: list[int] = attrs.Factory(list)
    #: How many commits the store had made when the transaction first read the committed
    #: state there (`None`: not yet); `replayed`: the mirror was rebuilt from the file, so the
    #: versions in it were read before, perhaps in another process.
    first_read: int | None = None
    replayed: bool = False

    def rewind(self, step: int, position: int) -> int:
        """`Overlay.rewind`, and drop the step records and staged effects of steps >= `step`."""
        reverted = super().rewind(step, position)
        if self.effects:
            self.effects = [effect for effect in self.effects if effect.step_id < step]
        if self.steps:
            self.steps = {s: record for s, record in self.steps.items() if s < step}
        return reverted

    def pending(self, tx_id: str, upto: int, *, snapshots: bool = True) -> list[Row]:
        """The events not yet in the file: journal entries `[flushed, upto)`, then the dirty
        snapshots (unless the caller writes them itself) and reads, numbered from `next_seq`."""
        seq = self.next_seq
        rows: list[Row] = []
        for key, _prior, (base, value) in islice(self.journal, self.flushed, upto):
            rows.append((tx_id, seq, WRITE, None, base, key, value, None))
            seq += 1
        for step, position in self.dirty_snapshots.items() if snapshots else ():
            rows.append((tx_id, seq, SNAPSHOT, step, position, None, None, None))
            seq += 1
        for key, version in self.dirty_reads:
            rows.append((tx_id, seq, READ, None, version, key, None, None))
            seq += 1
        return rows

    def persisted(self, rows: int, upto: int) -> None:
        """Account for `rows` events written, starting with journal entries `[flushed, upto)`."""
        if upto > self.flushed:
            self.runs.append((self.flushed, self.next_seq))
            self.flushed = upto
        self.next_seq += rows
        if self.dirty_snapshots:
            self.dirty_snapshots = {}
        if self.dirty_reads:
            self.dirty_reads = []

    def new_progress(self, text: str, seq: int | None) -> None:
        """The progress is now `text`, held by the `PROGRESS` event `seq` (`None`: by a `STEP`
        event)."""
        if self.progress_seq is not None:
            self.stale_progress.append(self.progress_seq)
        self.progress = text
        self.progress_seq = seq

    def seq_at(self, position: int) -> int:
        """The seq of the `WRITE` event of flushed journal entry `position`."""
        start, seq = self.runs[bisect_right(self.runs, (position, MAX_INT64)) - 1]
        return seq + position - start


def replay(
    tx_id: str,
    events: Sequence[tuple[int, int, int, int, str, str, str]],
    *,
    isolation: str,
    path: str,
) -> tuple[TxMirror, dict[int, str], str | None]:
    """A new mirror, the step records and the progress, from the log `events` of a transaction
    begun with `isolation` (`seq, kind, step, num, name, body, extra`, in seq order).
    `StorageError` names the first event that cannot be replayed, or an unknown isolation
    level (the file at `path` is corrupt)."""
    if isolation not in ISOLATION_LEVELS:
        raise StorageError(
            f"transaction `{tx_id}` in `{path}` has an unknown isolation level {isolation!r}: "
            "the file is corrupt, or written by a newer agenttx"
        )
    tx = TxMirror.begun(isolation)
    tx.replayed = True
    last_write = -2
    for seq, kind, step, num, name, body, extra in events:
        if kind == WRITE:
            if seq != last_write + 1:  # a new run: see `TxMirror.runs`
                tx.runs.append((len(tx.journal), seq))
            last_write = seq
            tx.write(name, (num, body))
        elif kind == SNAPSHOT:
            tx.take_snapshot(step, num)
        elif kind == RESTORE and step in tx.snapshots:
            tx.rewind(step, tx.snapshots[step])
        elif kind == STEP:
            if num is not None:
                tx.take_snapshot(step, num)
            tx.steps[step] = body
            if extra is not None:  # else the progress is unchanged
                tx.new_progress(extra, None)
        elif kind == EFFECT:
            tx.effects.append(
                EffectRow(step_id=step, channel=name, payload=body, idempotency_key=extra)
            )
        elif kind == PROGRESS:
            tx.new_progress(body, seq)
        elif kind == READ and tx.reads is not None:
            tx.read(name, num)
        else:
            raise StorageError(
                f"the log of transaction `{tx_id}` in `{path}` is corrupt: "
                f"event {seq} of kind {kind} cannot be replayed"
            )
        tx.next_seq = seq + 1
    tx.flushed = len(tx.journal)
    return tx, tx.steps, tx.progress


def read_transaction(cur: sqlite3.Cursor, tx_id: str, *, path: str) -> tuple[TxImage, TxMirror]:
    """Open transaction `tx_id` as the file holds it: its image (`owner` is the one in the file
    now) and a new mirror of it. Read-only; run it inside one SQLite transaction, so that the
    rows read agree. `TransactionNotFound` if the file has no open transaction `tx_id`."""
    rows = cur.execute(SELECT_TX, (tx_id,)).fetchall()
    if not rows:
        raise TransactionNotFound(tx_id=tx_id)
    record, owner, isolation = rows[0]
    return _image(cur, tx_id, record, owner, isolation, path=path)


def read_ended(cur: sqlite3.Cursor, tx_id: str, *, path: str) -> tuple[EndedTransaction, TxImage]:
    """Ended transaction `tx_id`, kept as history: its row, and its image as it ended (its
    step records: the live steps at its end; no progress, undo records, effects, owner or
    snapshots). Read-only. `TransactionNotFound` if the file keeps no ended `tx_id`;
    `StorageError` if its steps cannot be read (the file is corrupt)."""
    rows = cur.execute(SELECT_ENDED_TX, (tx_id,)).fetchall()
    if not rows:
        raise TransactionNotFound(tx_id=tx_id)
    record, history, steps, ended_at = rows[0]
    return ended_image(tx_id, (record, history, steps, ended_at), where=f" in `{path}`")


def ended_image(
    tx_id: str, row: tuple[str, str, str, float], *, where: str = ""
) -> tuple[EndedTransaction, TxImage]:
    """An ended transaction's stored `(record, history, steps, ended_at)` as its history row and
    its image as it ended (see `read_ended`); `StorageError` if its steps cannot be read
    (`where` names the store in the message)."""
    record, history, steps, ended_at = row
    try:
        image_steps = _read_steps(steps)
    except (ValueError, TypeError, RecursionError) as exc:
        raise StorageError(
            f"the history of transaction `{tx_id}`{where} is corrupt: its steps: {exc}"
        ) from exc
    ended = EndedTransaction(tx_id=tx_id, record=record, history=history, ended_at=ended_at)
    image = TxImage(
        tx_id=tx_id,
        record=record,
        progress=None,
        steps=image_steps,
        undos=(),
        effects=(),
        owner=None,
        snapshots=(),
    )
    return ended, image


def steps_text(steps: dict[int, str]) -> str:
    """The `steps` column of an ended transaction: a line of JSON `[[step_id, ...], [length,
    ...]]`, then the records, one after the other, as they are: no escaping (the store does
    not require them to be JSON), so it is about as cheap as `str.join`, in the write that
    ends the transaction."""
    records = list(steps.values())
    header = _encode_steps([list(steps), [len(record) for record in records]])
    return f"{header}\n{''.join(records)}"


def _read_steps(text: str) -> tuple[tuple[int, str], ...]:
    """The `(step_id, record)` pairs of `steps_text`'s text, in step order; `ValueError` or
    `TypeError` if it is not such a text."""
    header, newline, body = text.partition("\n")
    step_ids, lengths = json.loads(header)
    if (
        not newline
        or len(step_ids) != len(lengths)
        or not all(type(n) is int and n >= 0 for n in (*step_ids, *lengths))
        or sum(lengths) != len(body)
    ):
        raise ValueError("the header does not describe the records")
    pairs, start = [], 0
    for step_id, length in zip(step_ids, lengths, strict=True):
        pairs.append((step_id, body[start : start + length]))
        start += length
    return tuple(sorted(pairs))


def _image(
    cur: sqlite3.Cursor,
    tx_id: str,
    record: str,
    owner: str | None,
    isolation: str,
    *,
    path: str,
) -> tuple[TxImage, TxMirror]:
    events = cur.execute(SELECT_LOG, (tx_id,)).fetchall()
    undos = cur.execute(SELECT_UNDOS, (tx_id,)).fetchall()
    return replay_image(
        tx_id,
        record=record,
        owner=owner,
        isolation=isolation,
        events=events,
        undos=undos,
        path=path,
    )


def replay_image(
    tx_id: str,
    *,
    record: str,
    owner: str | None,
    isolation: str,
    events: Sequence[tuple[int, int, int, int, str, str, str]],
    undos: Sequence[tuple[int, int, str]],
    path: str,
) -> tuple[TxImage, TxMirror]:
    """The image of transaction `tx_id` and a new mirror of it, from its row's `record`,
    `owner` and `isolation`, its log `events` (as `replay` takes them) and its `undos`
    (`step_id, seq, record`, in order), as a log-based store read them. `StorageError` as
    `replay` raises."""
    tx, steps, progress = replay(tx_id, events, isolation=isolation, path=path)
    image = TxImage(
        tx_id=tx_id,
        record=record,
        progress=progress,
        steps=tuple(sorted(steps.items())),
        undos=tuple(UndoRow(step_id=s, seq=q, record=r) for s, q, r in undos),
        effects=tuple(tx.effects),
        owner=owner,
        snapshots=tuple(sorted(tx.snapshots)),
    )
    return image, tx
