"""The results table every benchmark script prints (imported as `_report` from `bench/`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass(frozen=True)
class Row:
    """One line of the results table."""

    name: str
    measured: str
    target: str
    ratio: float  # measured / target, normalised so that at most 1 passes
    detail: str = ""
    peer: bool = False  # a peer's figure, reported beside ours: no target, no verdict

    @property
    def passed(self) -> bool:
        """True when the target is met (a peer's row has none to miss)."""
        return self.peer or self.ratio <= 1.0

    @property
    def verdict(self) -> str:
        """The result column: pass, MISS, or peer."""
        if self.peer:
            return "peer"
        return "pass" if self.passed else "MISS"


def print_table(rows: list[Row]) -> None:
    """Print the rows as an aligned table, then each row's detail line."""
    headers = ("benchmark", "measured", "target", "ratio", "result")
    cells = [
        (r.name, r.measured, r.target, "-" if r.peer else f"{r.ratio:.2f}", r.verdict) for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    print("  ".join("-" * w for w in widths))
    for cell in cells:
        print("  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)).rstrip())
    print()
    for row in rows:
        if row.detail:
            print(f"{row.name}: {row.detail}")


def report(rows: list[Row], *, quick: bool, notes: Sequence[str] = ()) -> int:
    """Print the table and the verdict; the exit status is 1 if a full run missed a target.

    `notes` are printed after the table: targets that were not measured, and why (a target
    that cannot be measured yet is said so, never shown as a pass).

    A quick run (a smoke test on a shared machine) reports missed timings without failing;
    its correctness checks fail it by raising before this point.
    """
    print_table(rows)
    if notes:
        print()
    for note in notes:
        print(note)
    missed = [row.name for row in rows if not row.passed]
    if all(row.peer for row in rows):
        print("\nNo target was measured.")
        return 0
    if not missed:
        print("\nAll measured targets met." if notes else "\nAll targets met.")
        return 0
    print(f"\nMISSED {len(missed)} target(s): {', '.join(missed)}")
    if quick:
        print("(quick run: timing targets are reported, not enforced; run without --quick)")
        return 0
    return 1
