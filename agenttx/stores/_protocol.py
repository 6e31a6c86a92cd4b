"""The `Store` protocol: transactional key-value state, and the identifier rules every store checks.

The checks live here, beside the contract that states them, so that every backend refuses the
same input with the same error and message.
"""

from __future__ import annotations

import re
from typing import Final, Protocol, runtime_checkable

from .._errors import InvalidArgument
from .._limits import DEFAULT_ISOLATION, Isolation

__all__ = [
    "MAX_INT64",
    "MAX_KEY_BYTES",
    "MAX_STEP",
    "MAX_TX_ID_CHARS",
    "Store",
    "check_int",
    "check_key",
    "check_step",
    "check_tx_id",
    "check_value",
    "snapshot_not_found",
]

#: A transaction id is 1 to this many characters of `[A-Za-z0-9_-]`.
MAX_TX_ID_CHARS: Final = 128
#: A state key is 1 to this many bytes once encoded as UTF-8.
MAX_KEY_BYTES: Final = 1024
#: Snapshot steps are step ids: integers from 0 to this (see docs/protocol.md#input-limits).
MAX_STEP: Final = 2**32 - 1
#: Undo sequence numbers and outbox ids are SQLite integers: up to this.
MAX_INT64: Final = 2**63 - 1

_TX_ID = re.compile(f"[A-Za-z0-9_-]{{1,{MAX_TX_ID_CHARS}}}")


@runtime_checkable
class Store(Protocol):
    """Transactional key-value state: one committed map, and a private overlay per transaction.

    **Who calls it, and in what order.** A `Transaction` owns one transaction id and calls, for
    it: `begin` once; then any number of `get`, `put`, `delete`, `snapshot`, `restore` and
    `written_keys` (the transaction takes snapshot K just before step K runs, and restores one
    to rewind); then `commit` or `discard`. After a `WriteConflict` the transaction is still
    open and unchanged, and the caller discards it. `read_committed`, `committed_version`,
    `is_open` and `discard` may be called by anyone, at any time.

    **Data.** Keys are text of 1-`MAX_KEY_BYTES` bytes in UTF-8; values are JSON texts, stored
    and returned exactly as given (the caller encodes and decodes the JSON). `None` means absent,
    so the JSON text `"null"` is a value like any other. The store numbers its successful
    commits 1, 2, 3, ... (an empty commit takes a number too; a conflicting one does not). A
    committed key's version is the number of the commit that last wrote it; an absent key's
    version is 0, including a key that a commit deleted.

    **The overlay.** `put` and `delete` write the transaction's overlay entry for the key (a
    value, or a tombstone), never the committed map. The entry keeps a *base version*, fixed when
    the key enters the overlay and kept by later writes of the key: the version the transaction
    *first read* the key at, if it has read the key from committed state (see isolation, below),
    else the key's committed version at this write (0 if it was absent then). A transaction reads
    its own writes; other transactions, and `read_committed`, see only committed data.

    **Reads.** Unless the isolation is `"read_committed"`, the first `get` of a key that is not
    in the overlay records the key's committed version then (its *read version*), once per key
    and transaction: later reads, rewinds and writes never change it. So a read-fixed base is
    kept even when `restore` reverts the step that read it: a later write of the key gets that
    old base, which may report a conflict that a finer rule would not, and never misses one.

    **The journal and snapshots.** Each `put` and `delete` appends one journal entry holding the
    key's prior overlay entry (or "no entry"), atomically with the write. `snapshot(tx, K)`
    records the journal's length under step K. `restore(tx, K)` reverts the journal entries
    made since then, newest first, so the overlay is exactly what it was at the snapshot: a key
    first written after the snapshot leaves the overlay altogether (and its base version with
    it; a later write fixes a new one). Restore also drops the snapshots of steps after K, and
    those whose journal position is after snapshot K's (possible only when snapshots are taken
    out of step order), since they describe reverted history. Snapshot K itself stays valid.

    **Commit: first committer wins.** Under one lock, atomically: if any key still in the
    overlay has a committed version other than its base version, raise `WriteConflict` naming
    the smallest such key (in code-point order) and change nothing; for a serializable
    transaction, then likewise `ReadConflict` for the smallest key read whose committed version
    is no longer its read version; otherwise publish every overlay entry (a tombstone deletes the
    key), give them the next commit number, and end the transaction.

    **Isolation**, chosen per transaction at `begin`, weakest first:

    * `"read_committed"`: the base is the version at the key's first write; reads are not
      recorded. Lost updates are possible (two transactions read a key, each writes the value
      it computed, both commit: the first write is lost), and so is write skew.
    * `"no_lost_updates"` (the default): the base is fixed at the key's first access, a read
      from committed state or a write, so a read-modify-write of a key that another transaction
      committed in between raises `WriteConflict`. Keys read and not written are not checked:
      write skew (two transactions each read what the other writes) is still possible.
    * `"serializable"`: as `"no_lost_updates"`, and commit validates every key read from
      committed state (`ReadConflict`): with commits serialized by the store, the committed
      history is equivalent to running the transactions one at a time in commit order.

    At every level: only keys still in the overlay (and, serializable, read) are checked, so a
    key whose writes were all rewound, and never read, is not. ABA goes undetected: if the key
    was absent at its base (version 0) and another transaction created and then deleted it,
    its version is 0 again and no conflict is raised.

    **Errors and their order.** Arguments are checked first, with no effect:
    `InvalidArgument` for a malformed transaction id in `begin` (see `check_tx_id`) or an
    isolation level not in `ISOLATION_LEVELS` (`check_isolation`), a key of the
    wrong length or not encodable as UTF-8 (`check_key`), a value that is not such text
    (`check_value`), or a snapshot step outside 0-`MAX_STEP` (`check_step`). Then the
    transaction is looked up: any method taking a `tx_id`, other than `begin`, `discard` and
    `is_open`, raises `TransactionNotFound` if it is not open (never begun, committed or
    discarded). A failure of the backend itself is a `StorageError` with the original
    exception as `__cause__`; nothing else escapes.

    **Atomicity and durability.** Every method is atomic: it takes full effect or, when it
    raises, none. Reads return fresh immutable values (`str`, `int`, `tuple`), never live
    internal structures. Whether and when effects survive the process is the store's to say.

    **Concurrency.** Calls for *different* transactions may run concurrently, from several
    threads (and, for a store that says so, several processes). Calls for *one* transaction must
    not overlap: its owner serializes them. `read_committed`, `committed_version`, `is_open` and
    `discard` are safe from any thread at any time. A store must not call back into agenttx or
    into user code.
    """

    def begin(self, tx_id: str, *, isolation: Isolation = DEFAULT_ISOLATION) -> None:
        """Open transaction `tx_id` with an empty overlay, and take its snapshot 0.

        `isolation` is one of `"read_committed"`, `"no_lost_updates"` (the default) and
        `"serializable"` (see the class docstring). Raises `InvalidArgument` if the id or the
        isolation is malformed, or the transaction is already open. An id may be reused once
        its transaction has ended. Not idempotent.
        """
        ...

    def get(self, tx_id: str, key: str) -> str | None:
        """The transaction's view of `key`: its own overlay entry, else the committed value.

        `None` if the key is absent from that view (a tombstone in the overlay, or not
        committed). Changes nothing, except that a read from committed state records the
        key's read version unless the transaction is `"read_committed"` (class docstring).
        """
        ...

    def put(self, tx_id: str, key: str, value: str) -> None:
        """Write `value` to the transaction's overlay, journaled atomically with the write.

        A key entering the overlay takes its base version: its read version if it has one, else
        its committed version now. Each call appends a journal entry, even if it writes the same
        value again.
        """
        ...

    def delete(self, tx_id: str, key: str) -> None:
        """Write a tombstone for `key` to the overlay: the same rules as `put`.

        Deleting an absent key is allowed: it still writes (and journals) a tombstone, which is
        checked and counted at commit like any overlay entry.
        """
        ...

    def snapshot(self, tx_id: str, step: int) -> None:
        """Record the journal's current length as snapshot `step`, in O(1).

        Taking a snapshot of a step again moves it to the current position (the transaction
        does this on every attempt of a step). Idempotent while nothing is written in between.
        """
        ...

    def restore(self, tx_id: str, step: int) -> int:
        """Rewind the overlay to snapshot `step`; return the number of journal entries reverted.

        Reverts every mutation since the snapshot, newest first, in O(those mutations), and
        drops later snapshots (see the class docstring). Snapshot `step` remains and can be
        restored again: at once, that reverts 0 entries. Raises `StorageError` ("snapshot for
        step N of transaction `t` not found") if there is no such snapshot.
        """
        ...

    def commit(self, tx_id: str) -> int:
        """Publish the overlay atomically and end the transaction; return the keys published.

        The count includes tombstones. Raises `WriteConflict` (the smallest conflicting key),
        changing nothing and leaving the transaction open, if another transaction committed a
        key of the overlay after its base version; for a serializable transaction, then raises
        `ReadConflict` likewise if another committed a key after this one read it. Not
        idempotent: a second call raises `TransactionNotFound`.
        """
        ...

    def discard(self, tx_id: str) -> None:
        """Drop the transaction's overlay, journal and snapshots, and end it (an abort).

        Idempotent: discarding a transaction that is not open (or never was) does nothing.
        """
        ...

    def read_committed(self, key: str) -> str | None:
        """The committed value of `key`, or `None` if it is absent. A pure read."""
        ...

    def committed_version(self, key: str) -> int:
        """The number of the commit that last wrote `key`, or 0 if it is absent. A pure read."""
        ...

    def written_keys(self, tx_id: str) -> tuple[str, ...]:
        """The keys in the transaction's overlay (values and tombstones), sorted by code point."""
        ...

    def is_open(self, tx_id: str) -> bool:
        """Whether transaction `tx_id` has begun and not yet committed or been discarded."""
        ...


def check_tx_id(tx_id: object) -> None:
    """Raise `InvalidArgument` unless `tx_id` is 1-128 characters of `[A-Za-z0-9_-]`."""
    if not isinstance(tx_id, str) or _TX_ID.fullmatch(tx_id) is None:
        raise InvalidArgument(
            f"invalid transaction id `{tx_id}`: expected 1-{MAX_TX_ID_CHARS} chars of [A-Za-z0-9_-]"
        )


def check_key(key: object) -> None:
    """Raise `InvalidArgument` unless `key` is text of 1-1024 bytes in UTF-8."""
    if not isinstance(key, str):
        raise InvalidArgument(f"state keys must be text, not {type(key).__name__}")
    if key.isascii():
        size = len(key)
    else:
        try:
            size = len(key.encode())
        except UnicodeEncodeError:
            raise InvalidArgument(
                f"state key {key[:40]!r} cannot be encoded as UTF-8 (a lone surrogate)"
            ) from None
    if not 1 <= size <= MAX_KEY_BYTES:
        raise InvalidArgument(f"state keys must be 1-{MAX_KEY_BYTES} bytes")


def check_value(value: object) -> None:
    """Raise `InvalidArgument` unless `value` is text that can be encoded as UTF-8."""
    if not isinstance(value, str):
        raise InvalidArgument(f"state values must be JSON text, not {type(value).__name__}")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidArgument(
                "state values must be text that can be encoded as UTF-8 (a lone surrogate)"
            ) from None


def check_int(value: object, what: str, maximum: int, *, minimum: int = 0) -> None:
    """Raise `InvalidArgument` unless `value` is an `int` (not a `bool`) in the range."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidArgument(f"{what} must be an integer in {minimum}-{maximum}, got {value!r}")


def check_step(step: object) -> None:
    """Raise `InvalidArgument` unless `step` is an `int` (not a `bool`) in 0-`MAX_STEP`."""
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise InvalidArgument(f"snapshot steps must be integers in 0-{MAX_STEP}, got {step!r}")


def snapshot_not_found(tx_id: str, step: int) -> str:
    """The message of the `StorageError` that `restore` raises for a missing snapshot."""
    return f"snapshot for step {step} of transaction `{tx_id}` not found"
