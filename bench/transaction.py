"""Per-step overhead of `Transaction.execute_step`, side by side with LangGraph.

Run from the repository root::

    pip install -e '.[bench]'            # LangGraph, for the comparison
    python bench/transaction.py          # the full run
    python bench/transaction.py --quick  # a smoke run (used by tests/test_bench_transaction.py)

The workload is the issue's: a chain of steps, each a call of a no-op tool with one
`${steps.N.id}` reference to the previous step's output and three literal arguments, on the
default in-memory store. agenttx runs 20-step transactions (a fresh `Transaction` each, then a
commit) and times every `execute_step` with `time.perf_counter_ns`; the figure is the median
over all timed steps. LangGraph runs the same chain as a `StateGraph` of 20 nodes, each
reading the previous node's output from the state and calling the same no-op function,
compiled with its `InMemorySaver` checkpointer (a checkpoint per step, the closest match to
agenttx's per-step snapshot); the figure is the median over runs of one `invoke` divided by
20. Both are measured in the same process, one after the other, and compared as a ratio.

The no-op tool is declared `inline=True`, as the built-in `kv.*` tools are, so the figure is
the engine's own overhead. A default sync tool runs on a worker thread, so that a hanging tool
fails its step at the timeout; the third row measures that handoff, with the same tool.

Targets: agenttx at most 15 us median per step; at least 15 times less than LangGraph; a tool
on a worker thread at most 100 us per step (the handoff is two thread switches).
`--quick` checks correctness only (the chain resolves its references and commits); missed
timings are reported, not turned into a failing exit status.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import TYPE_CHECKING

import agenttx
from _chain import STEPS, noop, time_chains, time_langgraph
from _report import Row, report

if TYPE_CHECKING:
    from _chain import Statistic

STEP_TARGET_US = 15.0
WORKER_STEP_TARGET_US = 100.0
RATIO_TARGET = 15.0


def bench_agenttx(
    transactions: int, *, inline: bool = True, statistic: Statistic = statistics.median
) -> float:
    """Median (or `statistic`) microseconds per execute_step over `transactions` 20-step
    chains, each a `Transaction` on the default in-memory store."""
    tool = agenttx.tool(name="noop", inline=inline)(noop)
    return time_chains(lambda: agenttx.Transaction(tools=[tool]), transactions, statistic=statistic)


def bench_langgraph(runs: int, *, statistic: Statistic = statistics.median) -> float | None:
    """Median (or `statistic`) microseconds per node of a 20-node LangGraph chain, or None if
    LangGraph is not installed."""
    try:
        from langgraph.checkpoint.memory import InMemorySaver  # noqa: PLC0415
    except ImportError:
        return None
    return time_langgraph(InMemorySaver(), runs, statistic=statistic)


def main() -> int:
    """Run the benchmark, print the table, return 1 if a target is missed on a full run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args()
    transactions, runs = (20, 5) if args.quick else (500, 200)

    ours = bench_agenttx(transactions)
    on_worker = bench_agenttx(transactions, inline=False)
    theirs = bench_langgraph(runs)
    rows = [
        Row(
            name="execute_step per step",
            measured=f"{ours:.1f} us",
            target=f"<= {STEP_TARGET_US:g} us",
            ratio=ours / STEP_TARGET_US,
            detail=f"median over {transactions * (STEPS - 1):,} steps of {STEPS}-step chains",
        ),
        Row(
            name="execute_step, tool on a worker",
            measured=f"{on_worker:.1f} us",
            target=f"<= {WORKER_STEP_TARGET_US:g} us",
            ratio=on_worker / WORKER_STEP_TARGET_US,
            detail=f"the same chain without inline=True: +{on_worker - ours:.1f} us a step",
        ),
    ]
    if theirs is None:
        print("LangGraph is not installed (pip install -e '.[bench]'): no comparison\n")
    else:
        rows.append(
            Row(
                name="LangGraph / agenttx per step",
                measured=f"{theirs / ours:.1f}x",
                target=f">= {RATIO_TARGET:g}x",
                ratio=RATIO_TARGET / (theirs / ours),
                detail=f"LangGraph + InMemorySaver: {theirs:.1f} us a node, median of {runs} runs",
            )
        )
    return report(rows, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
