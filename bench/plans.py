"""Plans: makespan against the critical path, side by side with LangGraph, and scheduling overhead.

Run from the repository root::

    pip install -e '.[bench]'      # LangGraph, for the comparison
    python bench/plans.py          # the full run
    python bench/plans.py --quick  # a smoke run (used by tests/test_bench.py)

Makespan / critical path. Each workload is a DAG of sleeping async tools: the order
workflow (`customer_lookup` 30 ms and `stock_check` 20 ms together, `reserve` 40 ms after both,
holding the exclusive resource `order:{order_id}`, `confirm` 10 ms after `reserve`) and random
50-node DAGs (seeds 0, 1, ...; each node waits for 0-3 earlier nodes and sleeps 10-50 ms).
agenttx runs each as a `Plan` with `arun_plan` (the order workflow with typed tools and
`${...}` references; a random DAG's first prerequisite is a reference, the others `after`);
LangGraph runs the same DAG as a `StateGraph` of the same sleeping async nodes (fan-out from
START, waiting edges for fan-in, superstep execution, no checkpointer). Each tool records its
own start and end; the critical path is the longest path of those measured durations through
the DAG, and the makespan is the wall time of the whole call (validation included), so the
ratio charges each framework for everything it adds to the tools' own time. One untimed warm-up
run each, then the median ratio over the runs. Both frameworks run in the same process, one
after the other, on the same DAGs.

Scheduling overhead. A 10,000-node plan of one inline no-op tool (`inline=True`: it runs on the
event loop, so tool time is nil): node i takes its input from a reference to one of the 64
nodes before it, some nodes also wait for another (`after`), the first ones read
`${initial.seed}`. The figure is the wall time of `arun_plan` (validation included: each run
has a plan of its own, never validated before, though a plan keeps its last validation) divided
by the nodes, the median over runs; beside it the process's CPU time, which the wall time equals
on an idle machine (one thread does all the work) but exceeds on a shared one (other jobs'
turns). Flatness: the tool records when each node is called, by the loop thread's CPU clock
and by the wall clock; the verdict is the CPU time the last 1,000 nodes took over the CPU time
the first 1,000 took (median over runs), with the wall-clock ratio and the whole run's CPU time
a node on a plan a tenth the size beside it. These runs come first, each after a
`gc.collect()`, with the garbage collector enabled.

Targets (issue 13, section 5): makespan / critical path at most 1.02 on both workloads;
overhead at most 30 us a node in memory; last 1,000 / first 1,000 at most 1.25. The durable
target (at most 150 us a node on SQLite): the same overhead plan, smaller (1,000 nodes), run on
a `SQLiteStore` in a fresh file each run, so every node's transitions are written durably; the
figure is the wall time a node, the median over runs.
`--quick` checks correctness (every node succeeds, each LangGraph node runs once) on smaller
runs; missed timings are reported, not turned into a failing exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NewType, TypedDict

import agenttx
from _dags import (
    DagNode,
    Measured,
    langgraph_available,
    order_dag,
    random_dag,
    run_langgraph,
)
from _report import Row, report

if TYPE_CHECKING:
    from collections.abc import Sequence

RATIO_TARGET = 1.02
OVERHEAD_TARGET_US = 30.0
FLAT_TARGET = 1.25
DURABLE_TARGET_US = 150.0
OVERHEAD_WINDOW = 64

CustomerId = NewType("CustomerId", str)
WarehouseId = NewType("WarehouseId", str)


class Customer(TypedDict):
    """What `lookup_customer` returns."""

    customer_id: CustomerId


class Stock(TypedDict):
    """What `check_stock` returns."""

    warehouse_id: WarehouseId
    available: int


class Reservation(TypedDict):
    """What `reserve_stock` returns."""

    reservation_id: str


class Sent(TypedDict):
    """What `send_confirmation` returns."""

    message_id: str


class Token(TypedDict):
    """What the random DAGs' tool returns: the next node's input."""

    token: str


class Value(TypedDict):
    """What the overhead plan's tool returns."""

    value: int


def runner_available() -> bool:
    """True once the plan runner is built (`agenttx.arun_plan`)."""
    return hasattr(agenttx, "arun_plan")


# --- makespan / critical path ----------------------------------------------------------------


def order_tools(spans: dict[str, tuple[float, float]]) -> list[Any]:
    """The order workflow's four tools, sleeping the order DAG's durations, recording spans."""
    seconds = {node.id: node.seconds for node in order_dag()}

    async def sleep(node: str) -> None:
        started = time.perf_counter()
        await asyncio.sleep(seconds[node])
        spans[node] = (started, time.perf_counter())

    @agenttx.tool
    async def lookup_customer(email: str) -> Customer:
        """Find the customer by email."""
        await sleep("customer_lookup")
        return {"customer_id": CustomerId(f"c-{len(email)}")}

    @agenttx.tool
    async def check_stock(sku: str) -> Stock:
        """Find a warehouse holding the SKU."""
        await sleep("stock_check")
        return {"warehouse_id": WarehouseId(f"w-{sku}"), "available": 5}

    @agenttx.tool
    async def reserve_stock(
        customer_id: CustomerId, warehouse_id: WarehouseId, quantity: int
    ) -> Reservation:
        """Reserve the stock for the customer."""
        await sleep("reserve")
        return {"reservation_id": f"r-{customer_id}-{warehouse_id}-{quantity}"}

    @agenttx.tool
    async def send_confirmation(order_id: str, email: str) -> Sent:
        """Email the confirmation (after the reservation: a business-order edge, no value)."""
        await sleep("confirm")
        return {"message_id": f"m-{order_id}-{email}"}

    return [lookup_customer, check_stock, reserve_stock, send_confirmation]


def order_plan() -> Any:
    """The order workflow as a plan: typed tools, references, an exclusive resource, `after`."""
    return agenttx.Plan(
        nodes=[
            agenttx.Node(
                "customer_lookup",
                tool="lookup_customer",
                inputs={"email": "${initial.customer_email}"},
            ),
            agenttx.Node("stock_check", tool="check_stock", inputs={"sku": "${initial.sku}"}),
            agenttx.Node(
                "reserve",
                tool="reserve_stock",
                inputs={
                    "customer_id": "${customer_lookup.customer_id}",
                    "warehouse_id": "${stock_check.warehouse_id}",
                    "quantity": "${initial.quantity}",
                },
                exclusive_resource="order:${initial.order_id}",
            ),
            agenttx.Node(
                "confirm",
                tool="send_confirmation",
                inputs={"order_id": "${initial.order_id}", "email": "${initial.customer_email}"},
                after=["reserve"],
            ),
        ],
        initial=["customer_email", "sku", "quantity", "order_id", "currency"],
    )


ORDER_INITIAL = {
    "customer_email": "ada@example.com",
    "sku": "SKU-1",
    "quantity": 2,
    "order_id": "o-1",
    "currency": "GBP",
}


def work_tool(nodes: Sequence[DagNode], spans: dict[str, tuple[float, float]]) -> Any:
    """The random DAGs' one tool: sleeps the node's duration, records its span."""
    seconds = {node.id: node.seconds for node in nodes}

    @agenttx.tool
    async def work(node: str, token: str = "") -> Token:  # noqa: ARG001
        """Sleep as long as the node says; return a token for the next node."""
        started = time.perf_counter()
        await asyncio.sleep(seconds[node])
        spans[node] = (started, time.perf_counter())
        return {"token": node}

    return work


def dag_plan(nodes: Sequence[DagNode]) -> Any:
    """A DAG as a plan of `work` nodes: the first prerequisite a reference, the rest `after`."""
    plan_nodes = []
    for node in nodes:
        inputs: dict[str, Any] = {"node": node.id}
        if node.prerequisites:
            inputs["token"] = f"${{{node.prerequisites[0]}.token}}"
        plan_nodes.append(
            agenttx.Node(node.id, tool="work", inputs=inputs, after=list(node.prerequisites[1:]))
        )
    return agenttx.Plan(nodes=plan_nodes, initial=[])


async def run_agenttx(nodes: Sequence[DagNode], *, order: bool) -> tuple[Measured, Any]:
    """Run the workload once with `arun_plan`; check every node succeeded."""
    spans: dict[str, tuple[float, float]] = {}
    if order:
        plan, tools, initial = order_plan(), order_tools(spans), ORDER_INITIAL
    else:
        plan, tools, initial = dag_plan(nodes), [work_tool(nodes, spans)], {}
    started = time.perf_counter()
    result = await agenttx.arun_plan(plan, tools=tools, initial=initial, max_concurrency=len(nodes))
    measured = Measured(wall_s=time.perf_counter() - started, spans=spans)
    _check_succeeded(result, len(nodes))
    if set(spans) != {node.id for node in nodes}:
        raise SystemExit(f"agenttx ran {sorted(spans)}, not every node")
    return measured, result


def _check_succeeded(result: Any, count: int) -> None:
    states = {node_id: node.state for node_id, node in result.nodes.items()}
    if len(states) != count or any(s is not agenttx.NodeState.SUCCEEDED for s in states.values()):
        bad = {k: v for k, v in states.items() if v is not agenttx.NodeState.SUCCEEDED}
        raise SystemExit(f"agenttx plan did not succeed: {bad or states}")


async def ratios(
    workloads: Sequence[tuple[str, Sequence[DagNode]]], runs: int, *, peer: bool
) -> dict[str, list[float]]:
    """Makespan / critical path of every run, by framework (`agenttx`, `langgraph`).

    Each workload runs once untimed per framework first (imports, caches), then `runs` times.
    """
    found: dict[str, list[float]] = {"agenttx": [], "langgraph": [], "agenttx_own": []}
    for name, nodes in workloads:
        order = name == "order"
        if runner_available():
            await run_agenttx(nodes, order=order)
            for _ in range(runs):
                measured, result = await run_agenttx(nodes, order=order)
                found["agenttx"].append(measured.ratio(nodes))
                metrics = result.metrics
                found["agenttx_own"].append(metrics.makespan_s / metrics.critical_path_s)
        if peer:
            await run_langgraph(nodes)
            for _ in range(runs):
                found["langgraph"].append((await run_langgraph(nodes)).ratio(nodes))
    return found


def ratio_rows(label: str, found: dict[str, list[float]], detail: str) -> list[Row]:
    """The table rows of one workload's ratios."""
    rows: list[Row] = []
    if found["agenttx"]:
        ours = statistics.median(found["agenttx"])
        own = statistics.median(found["agenttx_own"])
        rows.append(
            Row(
                name=f"{label}: makespan / critical path",
                measured=f"{ours:.3f}",
                target=f"<= {RATIO_TARGET:g}",
                ratio=ours / RATIO_TARGET,
                detail=f"{detail}; max {max(found['agenttx']):.3f};"
                f" by result.metrics (makespan_s / critical_path_s): {own:.3f}",
            )
        )
    if found["langgraph"]:
        theirs = statistics.median(found["langgraph"])
        rows.append(
            Row(
                name=f"{label}: LangGraph (peer)",
                measured=f"{theirs:.3f}",
                target="-",
                ratio=0.0,
                peer=True,
                detail=f"{detail}; the same DAG as a StateGraph, superstep execution;"
                f" min {min(found['langgraph']):.3f}, max {max(found['langgraph']):.3f}",
            )
        )
    return rows


# --- scheduling overhead ---------------------------------------------------------------------


def overhead_plan(n: int, seed: int) -> Any:
    """An `n`-node plan of the inline tool `step`, shaped by `random_dag(window=64)`."""
    nodes = []
    for node in random_dag(n, seed, max_prerequisites=2, window=OVERHEAD_WINDOW):
        if node.prerequisites:
            first, *rest = node.prerequisites
            inputs = {"x": f"${{{first}.value}}"}
        else:
            inputs, rest = {"x": "${initial.seed}"}, []
        nodes.append(agenttx.Node(node.id, tool="step", inputs=inputs, after=rest))
    return agenttx.Plan(nodes=nodes, initial=["seed"])


@dataclass(frozen=True)
class Overhead:
    """What the overhead runs measured, each figure the median over runs, in us a node."""

    wall_us: float  # the wall time of `arun_plan`
    cpu_us: float  # the process's CPU time in it: what the wall time is on an idle machine
    flat: float  # the last `block` nodes' time over the first `block` nodes', in CPU time
    flat_wall: float  # the same in wall time
    validation_us: float  # `plan.validate` alone
    before_us: float  # from the call to the first tool call: checks, validation, set-up
    after_us: float  # from the last tool call to the return: commit, results, metrics


async def time_overhead(n: int, block: int, runs: int) -> Overhead:
    """Run the `n`-node overhead plan `runs` times (after one warm-up) and measure it."""
    calls: list[int] = []
    cpu_calls: list[int] = []

    @agenttx.tool(inline=True)
    def step(x: int) -> Value:
        """Do nothing but note the time."""
        calls.append(time.perf_counter_ns())
        cpu_calls.append(time.thread_time_ns())
        return {"value": x}

    figures: list[tuple[float, ...]] = []
    for run in range(runs + 1):  # the first run warms up, untimed
        # Validation alone, timed on a twin of the plan: a plan keeps its last validation
        # (for the same tools), and the timed run must validate its own plan afresh.
        twin = overhead_plan(n, seed=run)
        started = time.perf_counter_ns()
        problems = twin.validate([step])
        validation = time.perf_counter_ns() - started
        del twin
        plan = overhead_plan(n, seed=run)
        if problems:
            raise SystemExit(f"overhead plan is invalid: {problems[:3]}")
        calls.clear()
        cpu_calls.clear()
        gc.collect()  # each run starts from the same heap; the collector stays enabled
        cpu = time.process_time_ns()
        started = time.perf_counter_ns()
        result = await agenttx.arun_plan(
            plan, tools=[step], initial={"seed": 1}, max_concurrency=64
        )
        ended = time.perf_counter_ns()
        cpu = time.process_time_ns() - cpu
        _check_succeeded(result, n)
        if len(calls) != n:
            raise SystemExit(f"the tool ran {len(calls)} times for {n} nodes")
        if run:
            flat = (cpu_calls[-1] - cpu_calls[-block]) / (cpu_calls[block - 1] - cpu_calls[0])
            flat_wall = (calls[-1] - calls[-block]) / (calls[block - 1] - calls[0])
            times = (ended - started, cpu, validation, calls[0] - started, ended - calls[-1])
            wall, cpu_ns, valid, before, after = (t / n / 1000 for t in times)
            figures.append((wall, cpu_ns, flat, flat_wall, valid, before, after))
    return Overhead(*(statistics.median(column) for column in zip(*figures, strict=True)))


async def time_durable(n: int, runs: int) -> float:
    """Run the `n`-node overhead plan durably on SQLite `runs` times (after one warm-up); return
    the median wall time a node, in microseconds."""
    import tempfile  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    @agenttx.tool(inline=True)
    def step(x: int) -> Value:
        """Do nothing."""
        return {"value": x}

    figures: list[float] = []
    with tempfile.TemporaryDirectory() as root:
        for run in range(runs + 1):  # the first run warms up, untimed
            plan = overhead_plan(n, seed=run)
            store = agenttx.stores.SQLiteStore(str(Path(root) / f"plans-{run}.db"))
            try:
                gc.collect()
                started = time.perf_counter_ns()
                result = await agenttx.arun_plan(
                    plan, tools=[step], initial={"seed": 1}, max_concurrency=64, store=store
                )
                ended = time.perf_counter_ns()
            finally:
                store.close()
            _check_succeeded(result, n)
            if run:
                figures.append((ended - started) / n / 1000)
    return statistics.median(figures)


# --- the run ---------------------------------------------------------------------------------


def main() -> int:
    """Run the benchmark, print the table, return 1 if a target is missed on a full run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args()
    order_runs, seeds, dag_runs = (3, 2, 1) if args.quick else (20, 10, 3)
    nodes_n, block, overhead_runs = (2_000, 200, 1) if args.quick else (10_000, 1_000, 5)

    notes: list[str] = []
    if not runner_available():
        notes.append("agenttx: not measured: the plan runner (agenttx.arun_plan) is not built")

    # The overhead runs first, in a fresh process: LangGraph's import and the DAG runs leave
    # objects that every garbage collection would walk, and charge them to the runner. So
    # LangGraph is not even imported (`langgraph_available`) before they end.
    overhead_rows: list[Row] = []
    if runner_available():
        overhead = asyncio.run(time_overhead(nodes_n, block, overhead_runs))
        small = asyncio.run(time_overhead(nodes_n // 10, block // 10, overhead_runs))
        overhead_rows = [
            Row(
                name=f"overhead per node, {nodes_n:,} nodes",
                measured=f"{overhead.wall_us:.1f} us",
                target=f"<= {OVERHEAD_TARGET_US:g} us",
                ratio=overhead.wall_us / OVERHEAD_TARGET_US,
                detail=f"arun_plan wall time / nodes, inline no-op tool, median of"
                f" {overhead_runs} runs; CPU time {overhead.cpu_us:.1f} us a node (near the"
                f" wall time on an idle machine: one thread works); before the first tool call"
                f" {overhead.before_us:.1f} us (validation alone {overhead.validation_us:.1f} us),"
                f" after the last"
                f" {overhead.after_us:.1f} us",
            ),
            Row(
                name=f"last / first {block:,} nodes, CPU",
                measured=f"{overhead.flat:.2f}",
                target=f"<= {FLAT_TARGET:g}",
                ratio=overhead.flat / FLAT_TARGET,
                detail="the loop thread's CPU time between the tool's calls, median of runs; in"
                f" wall time {overhead.flat_wall:.2f}; the whole run's CPU time a node:"
                f" {small.cpu_us:.1f} us on a {nodes_n // 10:,}-node plan,"
                f" {overhead.cpu_us:.1f} us on {nodes_n:,} nodes",
            ),
        ]
    peer = langgraph_available()
    if not peer:
        notes.append("LangGraph is not installed (pip install -e '.[bench]'): no peer figures")
    rows: list[Row] = []
    order = asyncio.run(ratios([("order", order_dag())], order_runs, peer=peer))
    rows += ratio_rows("order DAG", order, f"median of {order_runs} runs, 4 nodes")
    dags = [(f"seed {seed}", random_dag(50, seed)) for seed in range(seeds)]
    random_found = asyncio.run(ratios(dags, dag_runs, peer=peer))
    rows += ratio_rows(
        "random 50-node DAGs",
        random_found,
        f"median of {seeds} seeds x {dag_runs} runs, 10-50 ms sleeps",
    )
    rows += overhead_rows
    if runner_available():
        durable_n, durable_runs = (200, 1) if args.quick else (1_000, 3)
        durable = asyncio.run(time_durable(durable_n, durable_runs))
        rows.append(
            Row(
                name=f"durable overhead per node, {durable_n:,} nodes",
                measured=f"{durable:.1f} us",
                target=f"<= {DURABLE_TARGET_US:g} us",
                ratio=durable / DURABLE_TARGET_US,
                detail=f"arun_plan on a SQLiteStore (a fresh file a run) wall time / nodes,"
                f" inline no-op tool, median of {durable_runs} runs",
            )
        )
    if not rows:
        rows.append(_peer_only_placeholder())
    return report(rows, quick=args.quick, notes=notes)


def _peer_only_placeholder() -> Row:
    """A row saying nothing was measured (LangGraph missing and the runner not built)."""
    return Row(name="nothing measured", measured="-", target="-", ratio=0.0, peer=True)


if __name__ == "__main__":
    sys.exit(main())
