"""Per-step overhead of `Transaction.call` next to `execute_step`, on the same trivial tool.

Run from the repository root::

    python bench/call.py          # the full run
    python bench/call.py --quick  # a smoke run (used by tests/test_bench.py)

The workload is bench/transaction.py's chain: 20-step transactions of an `inline=True` no-op
tool, each step with one `${steps.N.id}` reference and three literal arguments, on the default
in-memory store, each transaction committed. Chains sent with `execute_step(step, ...)` and
chains sent with `call(...)` (which numbers the step itself, under the transaction's turn)
alternate in one process, so both see the same machine; every step is timed with
`time.perf_counter_ns`, and the figures are the medians over all timed steps (the first step of
each chain, which has no reference, is not timed).

Target: `call` costs at most 2 us a step more than `execute_step` (issue 12).
`--quick` checks correctness only (both chains resolve their references, number the steps 1 to
20 and commit); missed timings are reported, not turned into a failing exit status.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import agenttx
from _chain import STEPS, noop
from _report import Row, report

OVERHEAD_TARGET_US = 2.0


def _chain(tx: agenttx.Transaction, *, numbered: bool, times: list[int]) -> None:
    """Send one chain through `execute_step` (numbered) or `call`, timing steps 2..STEPS."""
    first = {"a": "start", "b": 1, "c": "lit", "d": True}
    result = tx.execute_step(1, "noop", first) if numbered else tx.call("noop", first)
    for step in range(2, STEPS + 1):
        arguments = {"a": f"${{steps.{step - 1}.id}}", "b": step, "c": "lit", "d": True}
        if numbered:
            started = time.perf_counter_ns()
            result = tx.execute_step(step, "noop", arguments)
            times.append(time.perf_counter_ns() - started)
        else:
            started = time.perf_counter_ns()
            result = tx.call("noop", arguments)
            times.append(time.perf_counter_ns() - started)
        if not result.ok or result.step_id != step or result.output != {"id": "start", "n": step}:
            raise SystemExit(f"step {step} went wrong: {result}")
    if tx.commit().steps_committed != STEPS:
        raise SystemExit("commit went wrong")


def bench(transactions: int) -> tuple[float, float]:
    """Median microseconds per step through (execute_step, call), chains interleaved."""
    tool = agenttx.tool(name="noop", inline=True)(noop)
    numbered: list[int] = []
    called: list[int] = []
    for _ in range(transactions):
        _chain(agenttx.Transaction(tools=[tool]), numbered=True, times=numbered)
        _chain(agenttx.Transaction(tools=[tool]), numbered=False, times=called)
    return statistics.median(numbered) / 1000, statistics.median(called) / 1000


def main() -> int:
    """Run the benchmark, print the table, return 1 if the target is missed on a full run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args()
    transactions = 20 if args.quick else 1000
    bench(max(1, transactions // 10))  # warm-up
    execute, call = bench(transactions)
    overhead = call - execute
    rows = [
        Row(
            name="call - execute_step per step",
            measured=f"{overhead:+.2f} us",
            target=f"<= {OVERHEAD_TARGET_US:g} us",
            ratio=max(overhead, 0.0) / OVERHEAD_TARGET_US,
            detail=(
                f"execute_step {execute:.2f} us, call {call:.2f} us a step (ratio "
                f"{call / execute:.3f}), medians over {transactions * (STEPS - 1):,} steps each"
            ),
        )
    ]
    return report(rows, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
