"""Transactions per second on the memory store: 512 transactions of 20 `kv.put` steps + commit.

Run from the repository root::

    python bench/throughput.py          # the full run: 1, 4 and 16 threads
    python bench/throughput.py --quick  # a smoke run (used by tests/test_bench.py)

One `Engine` with the built-in tools and a `MemoryStore`; each worker thread begins its share of the
512 transactions, runs 20 `kv.put` steps on keys of its own, and commits. The figure is the wall
time of the whole batch, best of `--repeat` batches (a fresh engine each). The target is the
issue's: at least 3,000 transactions a second on one thread (the AgentTx protocol's Rust
implementation publishes 1,119 in process, with RocksDB). Threads share the GIL, so more of them add
contention, not speed; the 4- and 16-thread rows show that commits stay correct and cheap under it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time

import agenttx
from _report import Row, report
from agenttx import builtins

TRANSACTIONS = 512
STEPS = 20
TARGET_TPS = 3_000.0


def batch(threads: int, transactions: int) -> float:
    """Run one batch; return its transactions per second."""
    engine = agenttx.Engine(tools=builtins.tools(tempfile.mkdtemp(prefix="agenttx-bench-")))
    share = [transactions // threads + (i < transactions % threads) for i in range(threads)]

    def work(worker: int) -> None:
        for n in range(share[worker]):
            tx = engine.begin()
            for step in range(1, STEPS + 1):
                key = f"w{worker}/t{n}/s{step}"
                if not tx.execute_step(step, "kv.put", {"key": key, "value": step}).ok:
                    raise SystemExit(f"step {step} failed")
            tx.commit()

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    committed = sum(tx.status is agenttx.TxStatus.COMMITTED for tx in engine.transactions())
    if committed != transactions:
        raise SystemExit(f"{committed} of {transactions} transactions committed")
    return transactions / elapsed


def main() -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 transactions, 1 repetition")
    parser.add_argument("--repeat", type=int, default=None, help="batches per row (default 3)")
    args = parser.parse_args()
    transactions = 64 if args.quick else TRANSACTIONS
    repeat = args.repeat or (1 if args.quick else 3)
    rows = []
    for threads in (1, 4, 16):
        best = max(batch(threads, transactions) for _ in range(repeat))
        rows.append(
            Row(
                name=f"{threads} thread{'s' if threads > 1 else ''}",
                measured=f"{best:,.0f} tx/s",
                target=f">= {TARGET_TPS:,.0f} tx/s" if threads == 1 else "-",
                ratio=TARGET_TPS / best if threads == 1 else 0.0,
                detail=f"best of {repeat} batches of {transactions} x ({STEPS} kv.put + commit)",
            )
        )
    return report(rows, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
