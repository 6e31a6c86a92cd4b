"""What running a sync tool on a worker thread (the default) costs, in lock round trips.

Run from the repository root::

    python bench/handoff.py          # the full run (7 rounds of 3 fresh processes)
    python bench/handoff.py --quick  # a smoke run (used by tests/test_bench.py)

Three variants, each measured in its own fresh process (this script, run again with
`--variant`), so that no variant inherits another's threads, caches or CPU placement:

- `default`: the chain of bench/transaction.py (20-step transactions of a no-op tool with one
  `${steps.N.id}` reference and three literal arguments, on the default in-memory store) with
  the tool declared plainly, `@agenttx.tool`, so it runs on a worker thread under its deadline;
  the figure is the median `execute_step` time.
- `inline`: the same chain with the tool declared `@agenttx.tool(inline=True)`: it runs on the
  caller's thread.
- `bare`: two threads passing control back and forth through two locks (one releases a lock
  the other waits on, then waits on the second lock, which the other releases); the figure is
  the median time of one such round trip, the least any handoff to another thread and back
  can cost here.

The variants alternate (round after round, the order rotated each round) so that a slow spell
of a shared machine falls on all of them; each figure is the median of its rounds' medians.
The verdict is the handoff's cost over the inline path in bare round trips,
(default - inline) / bare, with the target at most 1.5: a handoff is one round trip, so the
rest is bookkeeping. `--quick` checks that each variant runs and its chains commit; missed
timings are reported, not turned into a failing exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from _report import Row, report

VARIANTS = ("default", "inline", "bare")
RATIO_TARGET = 1.5


def measure_chain(transactions: int, *, inline: bool) -> float:
    """Median microseconds per execute_step of the no-op chain, tool on a worker or inline."""
    import agenttx  # noqa: PLC0415  (only the chain variants import agenttx)
    from _chain import noop, time_chains  # noqa: PLC0415

    tool = agenttx.tool(name="noop", inline=inline)(noop)
    return time_chains(lambda: agenttx.Transaction(tools=[tool]), transactions)


def measure_bare(round_trips: int) -> float:
    """Median microseconds of one lock round trip between two threads."""
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()
    total = round_trips + round_trips // 10  # the first tenth warms up, untimed

    def echo() -> None:
        for _ in range(total):
            ping.acquire()
            pong.release()

    other = threading.Thread(target=echo, daemon=True)
    other.start()
    clock = time.perf_counter_ns
    times: list[int] = []
    for _ in range(total):
        started = clock()
        ping.release()
        pong.acquire()
        times.append(clock() - started)
    other.join()
    return statistics.median(times[round_trips // 10 :]) / 1000


def run_variant(variant: str, *, quick: bool) -> float:
    """Measure one variant in this process."""
    transactions = 10 if quick else 200  # 19 timed steps each
    if variant == "bare":
        return measure_bare(transactions * 19)
    return measure_chain(transactions, inline=variant == "inline")


def spawn(variant: str, *, quick: bool) -> float:
    """Measure one variant in a fresh process running this script."""
    command = [sys.executable, str(Path(__file__).resolve()), "--variant", variant]
    if quick:
        command.append("--quick")
    result = subprocess.run(  # noqa: S603  (this script, with our own arguments)
        command, capture_output=True, text=True, env=dict(os.environ), timeout=300, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"variant {variant} failed:\n{result.stdout}{result.stderr}")
    return float(json.loads(result.stdout.strip().splitlines()[-1])["us"])


def main() -> int:
    """Run the rounds, print the table, return 1 if the target is missed on a full run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of the three variants")
    parser.add_argument("--variant", choices=VARIANTS, help="measure one variant, print JSON")
    args = parser.parse_args()
    if args.variant is not None:
        figure = run_variant(args.variant, quick=args.quick)
        print(json.dumps({"variant": args.variant, "us": figure}))
        return 0
    rounds = args.rounds or (2 if args.quick else 7)
    figures: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_ in range(rounds):
        shift = round_ % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            figures[variant].append(spawn(variant, quick=args.quick))
    for variant in VARIANTS:
        runs = ", ".join(f"{figure:.1f}" for figure in figures[variant])
        print(f"{variant:>7}: {runs} us")
    print()
    default, inline, bare = (statistics.median(figures[variant]) for variant in VARIANTS)
    ratio = (default - inline) / bare
    rows = [
        Row(
            name="worker handoff / bare round trip",
            measured=f"{ratio:.2f}",
            target=f"<= {RATIO_TARGET:g}",
            ratio=ratio / RATIO_TARGET,
            detail=(
                f"medians of {rounds} fresh processes each: default {default:.1f} us a step,"
                f" inline {inline:.1f} us a step, bare round trip {bare:.1f} us;"
                f" the handoff adds {default - inline:.1f} us"
            ),
        )
    ]
    return report(rows, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
