"""One measure of bench/compare.py in a fresh process, on whichever agenttx `PYTHONPATH` names.

Run by bench/compare.py, never by hand::

    PYTHONPATH=/path/to/a/checkout python bench/_probe.py MEASURE [--quick]

It prints one JSON object: `{"value": float | null}` (null: the checkout lacks the feature, such
as plans before they were built). Each measure calls the code of the bench script that owns the
workload (`_chain`, `transaction`, `throughput`, `durable`, `plans`) and imports only what that
measure needs, so that no measure pays for another's imports. The measure runs once on its quick
workload first, untimed: the first calls' lazy imports and caches would weigh on a mean.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

#: The measures, each `(quick size, full size)` of its workload; see `measure`.
SIZES: dict[str, tuple[int, int]] = {
    "step": (10, 300),  # 20-step chains of an inline no-op tool, in memory
    "langgraph": (3, 100),  # runs of the same chain as a LangGraph StateGraph
    "tps_memory": (64, 512),  # 20 kv.put + commit transactions on a MemoryStore
    "tps_sqlite": (32, 512),  # the same on a SQLiteStore file
    "durable_step": (10, 100),  # 20-step chains on a SQLiteStore file
    "plan_memory": (500, 10_000),  # nodes of the overhead plan, in memory
    "plan_durable": (100, 1_000),  # nodes of the overhead plan on a SQLiteStore file
}


def measure(name: str, size: int) -> float | None:  # noqa: PLR0911  (one return a measure)
    """The figure of measure `name` on a workload of `size` (see SIZES), or None if this
    checkout lacks what it measures."""
    mean = statistics.fmean
    if name == "step":
        from transaction import bench_agenttx  # noqa: PLC0415

        return bench_agenttx(size, statistic=mean)
    if name == "langgraph":
        from transaction import bench_langgraph  # noqa: PLC0415

        return bench_langgraph(size, statistic=mean)
    if name == "tps_memory":
        from throughput import batch  # noqa: PLC0415

        return batch(1, size)
    with tempfile.TemporaryDirectory(prefix="agenttx-compare-") as directory:
        if name == "tps_sqlite":
            from durable import throughput_batch  # noqa: PLC0415

            path = Path(directory) / "throughput.db"
            return throughput_batch(path, size, exclusive=False, threads=1)
        if name == "durable_step":
            from durable import bench_agenttx as durable_chains  # noqa: PLC0415

            return durable_chains(Path(directory), size, statistic=mean)
    import asyncio  # noqa: PLC0415

    import plans  # noqa: PLC0415

    if not plans.runner_available():
        return None
    if name == "plan_memory":
        return asyncio.run(plans.time_overhead(size, size // 10, 1)).wall_us
    if name == "plan_durable":
        return asyncio.run(plans.time_durable(size, 1))
    raise SystemExit(f"unknown measure {name!r}")


def main() -> int:
    """Run one measure and print its figure as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measure", choices=sorted(SIZES))
    parser.add_argument("--quick", action="store_true", help="the small workload")
    args = parser.parse_args()
    quick, full = SIZES[args.measure]
    measure(args.measure, quick)  # warms up: first calls, lazy imports, caches
    value = measure(args.measure, quick if args.quick else full)
    print(json.dumps({"value": value}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
