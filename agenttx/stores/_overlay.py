"""`Overlay`: one open transaction's private state, as every store in this package keeps it.

The overlay of its writes (each with its base version), the undo journal, the snapshots, and
the read versions its isolation level records, with the operations the `Store` contract
defines on them: write, rewind to a snapshot, validate at commit. `MemoryStore` keeps one per
open transaction; `SQLiteStore` keeps one per transaction it holds, extended with what the file
has not received yet (`_sqlite_mirror.TxMirror`), and rebuilds it from the file with these same
operations. So the two stores cannot drift apart on the contract's rules.

An `Overlay` does no locking and no argument checking: its store does both, and only the
calls of the transaction that owns it touch it (they do not overlap).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

import attrs

from .._errors import ReadConflict, WriteConflict

if TYPE_CHECKING:
    from collections.abc import Callable

    from typing_extensions import Self

__all__ = ["Entry", "Overlay", "Undo"]

#: An overlay entry: (base version, value), the value `None` for a tombstone. Entries are
#: immutable, so the journal can hold the very tuple it will put back.
Entry: TypeAlias = tuple[int, "str | None"]
#: A journal entry: (key, the key's prior overlay entry or `None`, the entry written).
Undo: TypeAlias = tuple[str, "Entry | None", Entry]


@attrs.define(eq=False, repr=False)
class Overlay:
    """One open transaction's overlay, journal, snapshots and read versions (see `Store`).

    Costs: `base`, `write`, `read` and `take_snapshot` are O(1); `rewind` is O(entries
    reverted) plus O(snapshots dropped), O(snapshots) if they were taken out of step order;
    `validate` is O(keys written, and read if serializable).
    """

    overlay: dict[str, Entry] = attrs.Factory(dict)
    journal: list[Undo] = attrs.Factory(list)
    #: step -> journal length when the snapshot was taken. Kept in the order the snapshots were
    #: taken (a retaken step moves to the end), so journal positions never decrease along it.
    snapshots: dict[int, int] = attrs.Factory(lambda: {0: 0})
    #: True while the steps in `snapshots` also increase along it, as they do when a transaction
    #: snapshots each step before running it: then a rewind drops a suffix, popped in O(dropped).
    steps_in_order: bool = True
    #: key -> the committed version the transaction first read it at; `None` under read
    #: committed, which records no reads. Reads by steps later rewound stay recorded, and fix
    #: the base of a later write of the key: conservative, never unsafe.
    reads: dict[str, int] | None = None
    #: Whether `validate` also checks `reads` (serializable).
    serializable: bool = False

    @classmethod
    def begun(cls, isolation: str) -> Self:
        """The state of a transaction just begun at `isolation` (a checked level): empty, with
        snapshot 0."""
        return cls(
            reads=None if isolation == "read_committed" else {},
            serializable=isolation == "serializable",
        )

    def base(self, key: str) -> int | None:
        """The base version a write of `key` now keeps: its overlay entry's, else its read
        version; `None` if it has neither (then it is the key's committed version now)."""
        entry = self.overlay.get(key)
        if entry is not None:
            return entry[0]
        reads = self.reads
        return None if reads is None else reads.get(key)

    def write(self, key: str, entry: Entry) -> None:
        """Journal and apply one overlay write, `entry` holding the base from `base`.

        The journal entry goes first: if the overlay write never happened, reverting the entry
        is harmless.
        """
        self.journal.append((key, self.overlay.get(key), entry))
        self.overlay[key] = entry

    def read(self, key: str, version: int) -> bool:
        """Note that the transaction read `key` from committed state at `version`; True if that
        recorded its read version (the first such read, at a level that records reads)."""
        reads = self.reads
        if reads is None or key in reads:
            return False
        reads[key] = version
        return True

    def take_snapshot(self, step: int, position: int) -> None:
        """Record snapshot `step` at journal `position`, moving a retaken step to the end."""
        snapshots = self.snapshots
        if self.steps_in_order and snapshots and step < next(reversed(snapshots)):
            self.steps_in_order = False
        snapshots.pop(step, None)
        snapshots[step] = position

    def rewind(self, step: int, position: int) -> int:
        """Revert the journal to `position` (snapshot `step`'s), newest first; drop the snapshots
        of later steps and of reverted history. Returns the number of entries reverted. The
        read versions stay (see `reads`)."""
        journal, overlay, snapshots = self.journal, self.overlay, self.snapshots
        reverted = len(journal) - position
        for _ in range(reverted):
            key, prior, _entry = journal.pop()
            if prior is None:
                del overlay[key]
            else:
                overlay[key] = prior
        # Positions never decrease along `snapshots`, so when steps do not either, the
        # snapshots to drop form a suffix.
        if self.steps_in_order:
            while next(reversed(snapshots)) != step:
                snapshots.popitem()
        else:
            self.snapshots = {s: p for s, p in snapshots.items() if s <= step and p <= position}
            self.steps_in_order = list(self.snapshots) == sorted(self.snapshots)
        return reverted

    def checked_keys(self) -> list[str]:
        """The keys `validate` asks the committed version of: those written, and those read
        if serializable."""
        if self.serializable and self.reads:
            return list({**self.overlay, **self.reads})
        return list(self.overlay)

    def validate(self, version: Callable[[str], int]) -> None:
        """Raise `WriteConflict` for the smallest key of the overlay whose committed version,
        `version(key)`, is not its base; then, if serializable, `ReadConflict` likewise for the
        keys read. Changes nothing."""
        stale = [key for key, (base, _) in self.overlay.items() if version(key) != base]
        if stale:
            raise WriteConflict(key=min(stale))
        if self.serializable and self.reads:
            stale = [key for key, read in self.reads.items() if version(key) != read]
            if stale:
                raise ReadConflict(key=min(stale))
