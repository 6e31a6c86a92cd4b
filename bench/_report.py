"""The results table every benchmark script prints (imported as `_report` from `bench/`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One line of the results table."""

    name: str
    measured: str
    target: str
    ratio: float  # measured / target, normalised so that at most 1 passes
    detail: str = ""

    @property
    def passed(self) -> bool:
        """True when the target is met."""
        return self.ratio <= 1.0


def print_table(rows: list[Row]) -> None:
    """Print the rows as an aligned table, then each row's detail line."""
    headers = ("benchmark", "measured", "target", "ratio", "result")
    cells = [
        (r.name, r.measured, r.target, f"{r.ratio:.2f}", "pass" if r.passed else "MISS")
        for r in rows
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


def report(rows: list[Row], *, quick: bool) -> int:
    """Print the table and the verdict; the exit status is 1 if a full run missed a target.

    A quick run (a smoke test on a shared machine) reports missed timings without failing;
    its correctness checks fail it by raising before this point.
    """
    print_table(rows)
    missed = [row.name for row in rows if not row.passed]
    if not missed:
        print("\nAll targets met.")
        return 0
    print(f"\nMISSED {len(missed)} target(s): {', '.join(missed)}")
    if quick:
        print("(quick run: timing targets are reported, not enforced; run without --quick)")
        return 0
    return 1
