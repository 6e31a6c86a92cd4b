"""Durable steps and throughput on PostgresStore, side by side with DBOS on the same server.

Run from the repository root, with a server (`.ci/postgres` starts one)::

    pip install -e '.[postgres,bench]'   # psycopg, and DBOS for the comparison
    AGENTTX_POSTGRES_DSN=postgresql://... python bench/postgres.py          # the full run
    AGENTTX_POSTGRES_DSN=postgresql://... python bench/postgres.py --quick  # a smoke run

Per step: 20-step chains of a no-op tool (inline, so the figure is the engine's and the store's
overhead) on an `Engine` with a `PostgresStore`, committed at the end; the figure is the median
`execute_step` time, each step durable (its record is on the server before `execute_step`
returns: one round trip). In the same process, the same chain as a DBOS workflow of 20
`@DBOS.step`s with DBOS's system database on the same server (a checkpoint per step); its figure
is the median time of one run divided by 20.

Throughput: 512 transactions of 20 `kv.put` steps and a commit, split over 1, 4 and 16 worker
processes, each with its own engine and store (its own connections), all on one schema; the
figure is the transactions committed per second from the moment all workers are ready to the
last one's end. The server's CPU time over the run (its processes' user and system time, read
from /proc) and the workers' (the CPU time of their transactions) are reported beside it, as
shares of the wall time: what one worker keeps busy bounds the scaling on the machine's cores.

Targets (issue 15): a durable step at least 10 times cheaper than DBOS's on the same server,
and the throughput of 4 workers at least 3 times that of 1.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import agenttx
from _chain import STEPS, noop, time_chains
from _report import Row, report
from agenttx import builtins

RATIO_TARGET = 10.0
SCALING_TARGET = 3.0
DSN_VARIABLE = "AGENTTX_POSTGRES_DSN"


def bench_agenttx(dsn: str, schema: str, chains: int) -> float:
    """Median microseconds per durable execute_step on a PostgresStore."""
    from agenttx.stores import PostgresStore  # noqa: PLC0415

    tool = agenttx.tool(name="noop", inline=True)(noop)
    with PostgresStore(dsn, schema=schema) as store:
        engine = agenttx.Engine(
            tools=[tool], store=store, config=agenttx.EngineConfig(idle_timeout=None)
        )
        return time_chains(engine.begin, chains)


def bench_dbos(dsn: str, runs: int) -> float | None:
    """Median microseconds per step of a 20-step DBOS workflow, its system database on the
    same server (a database of its own, `agenttx_dbos_bench`)."""
    try:
        from dbos import DBOS  # noqa: PLC0415
    except ImportError:
        return None
    logging.getLogger("dbos").setLevel(logging.ERROR)

    @DBOS.step()
    def step_fn(a: str, b: int) -> dict[str, Any]:
        return noop(a, b, "lit", True)

    @DBOS.workflow()
    def chain() -> dict[str, Any]:
        output = {"id": "start"}
        for step in range(1, STEPS + 1):
            output = step_fn(output["id"], step)
        return output

    base = dsn.rsplit("/", 1)[0]
    DBOS(
        config={
            "name": "agenttx-bench",
            "system_database_url": f"{base}/agenttx_dbos_bench",
            "log_level": "ERROR",
        }
    )
    DBOS.launch()
    try:
        times: list[float] = []
        for _ in range(runs):
            started = time.perf_counter_ns()
            final = chain()
            times.append((time.perf_counter_ns() - started) / STEPS)
            if final != {"id": "start", "n": STEPS}:
                raise SystemExit("dbos workflow went wrong")
    finally:
        DBOS.destroy(destroy_registry=True)
    return statistics.median(times) / 1000


# ---------------------------------------------------------------------- throughput


def worker(dsn: str, schema: str, first: int, *, step: int, total: int, go: str) -> None:
    """One worker process: wait for `go`, run its share of the transactions, print its end."""
    from agenttx.stores import PostgresStore  # noqa: PLC0415

    with PostgresStore(dsn, schema=schema) as store, tempfile.TemporaryDirectory() as root:
        engine = agenttx.Engine(
            tools=builtins.tools(root), store=store, config=agenttx.EngineConfig(idle_timeout=None)
        )
        print("ready", flush=True)
        while not Path(go).exists():
            time.sleep(0.001)
        cpu = time.process_time()
        for n in range(first, total, step):
            tx = engine.begin()
            for s in range(1, STEPS + 1):
                if not tx.execute_step(s, "kv.put", {"key": f"t{n}/s{s}", "value": s}).ok:
                    raise SystemExit(f"kv.put step {s} failed")
            tx.commit()
        print(f"end {time.time()} {time.process_time() - cpu}", flush=True)


def server_cpu(dsn: str) -> float:
    """The CPU seconds the server's processes have used: the postmaster's own and its reaped
    children's, and its live children's (from /proc; 0 if it cannot be read)."""
    import psycopg  # noqa: PLC0415

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    if row is None:
        return 0.0
    try:
        postmaster = int(Path(f"/proc/{row[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            pid, parent = int(entry.name), int(fields[1])
            if pid == postmaster:
                total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
            elif parent == postmaster:
                total += int(fields[11]) + int(fields[12])
    return total / tick


def bench_throughput(
    dsn: str, schema: str, transactions: int, workers: int
) -> tuple[float, float, float]:
    """Transactions per second of `workers` processes, the server's CPU share meanwhile, and
    the workers' (the CPU time of their transactions over the wall time)."""
    from agenttx.stores import PostgresStore  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as directory:
        go = Path(directory) / "go"
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        processes = [
            subprocess.Popen(  # noqa: S603  (this script)
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    *(dsn, schema, str(first), str(workers), str(transactions), str(go)),
                ],
                stdout=subprocess.PIPE,
                text=True,
                env=environment,
            )
            for first in range(workers)
        ]
        for process in processes:
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                raise SystemExit("a worker did not start")
        cpu = server_cpu(dsn)
        started = time.time()
        go.touch()
        ends, clients = [], 0.0
        for process in processes:
            out, _ = process.communicate(timeout=600)
            if process.returncode != 0:
                raise SystemExit("a worker failed")
            ends.append(float(out.split()[1]))
            clients += float(out.split()[2])
        elapsed = max(ends) - started
        cpu = server_cpu(dsn) - cpu
    with PostgresStore(dsn, schema=schema) as store:
        rows = store.committed_keys("kv/t", limit=transactions * STEPS + 1)
    if len(rows) != transactions * STEPS:
        raise SystemExit("not every transaction was committed")
    return transactions / elapsed, cpu / elapsed, clients / elapsed


def drop(dsn: str, schema: str) -> None:
    import psycopg  # noqa: PLC0415

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def main() -> int:
    """Run the benchmarks, print the table, return 1 if a full run missed a target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--dsn", default=os.environ.get(DSN_VARIABLE, ""))
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        dsn, schema, first, step, total, go = args.worker
        worker(dsn, schema, int(first), step=int(step), total=int(total), go=go)
        return 0
    if not args.dsn:
        if os.environ.get("AGENTTX_REQUIRE_POSTGRES") == "1":
            raise SystemExit(f"no PostgreSQL server: set {DSN_VARIABLE}")
        skipped = Row(name="PostgresStore", measured="skipped", target="-", ratio=0.0, peer=True)
        return report([skipped], quick=args.quick, notes=[f"no server: set {DSN_VARIABLE}"])
    chains, runs, transactions = (5, 3, 32) if args.quick else (200, 50, 512)
    counts = (1, 2) if args.quick else (1, 4, 16)
    prefix = f"bench_{os.getpid()}"
    try:
        ours = bench_agenttx(args.dsn, f"{prefix}_steps", chains)
        with Path(os.devnull).open("w") as quiet, contextlib.redirect_stdout(quiet):
            dbos = bench_dbos(args.dsn, runs)
        throughput = {
            n: bench_throughput(args.dsn, f"{prefix}_tps_{n}", transactions, n) for n in counts
        }
    finally:
        for name in ("steps", *(f"tps_{n}" for n in counts)):
            drop(args.dsn, f"{prefix}_{name}")
    rows = [
        Row(
            name="execute_step, PostgresStore",
            measured=f"{ours:.1f} us",
            target="-",
            ratio=0.0,
            detail=f"median over {chains * (STEPS - 1):,} durable steps, one round trip each",
            peer=True,
        )
    ]
    notes: list[str] = []
    if dbos is None:
        notes.append("DBOS is not installed (pip install -e '.[bench]'): no comparison")
    else:
        rows.append(
            Row(
                name="DBOS on PostgreSQL / agenttx",
                measured=f"{dbos / ours:.1f}x",
                target=f">= {RATIO_TARGET:g}x",
                ratio=RATIO_TARGET / (dbos / ours),
                detail=f"DBOS: {dbos:.1f} us a step, median of {runs} runs, same server",
            )
        )
    for n, (tps, cpu, clients) in throughput.items():
        rows.append(
            Row(
                name=f"20 kv.put + commit, {n} worker{'s' if n > 1 else ''}",
                measured=f"{tps:,.0f} tx/s",
                target="-",
                ratio=0.0,
                detail=f"{transactions} transactions; CPU meanwhile: server {cpu:.2f} cores, "
                f"workers {clients:.2f} cores",
                peer=True,
            )
        )
    low, high = counts[0], counts[1]
    scaling = throughput[high][0] / throughput[low][0]
    rows.append(
        Row(
            name=f"scaling {low} -> {high} workers",
            measured=f"{scaling:.2f}x",
            target=f">= {SCALING_TARGET:g}x" if high == 4 else "-",
            ratio=SCALING_TARGET / scaling if high == 4 else 0.0,
            detail=f"on {os.cpu_count()} cores shared by the clients and the server",
        )
    )
    busy = sum(throughput[low][1:])
    cores = os.cpu_count() or 1
    notes.append(
        f"{low} worker kept {busy:.2f} cores busy (itself and the server): were each "
        f"transaction to cost as much CPU with more workers, {cores} cores would allow "
        f"about {cores} / {busy:.2f} = {cores / max(busy, 0.01):.1f}x; "
        "more scaling than that means the CPU a transaction fell with concurrency"
    )
    return report(rows, quick=args.quick, notes=notes)


if __name__ == "__main__":
    sys.exit(main())
