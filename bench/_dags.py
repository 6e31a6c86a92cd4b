"""The DAG workloads of bench/plans.py and their LangGraph peer (imported as `_dags`).

A workload is a tuple of `DagNode`s in topological order: an id, how long its tool sleeps, and
the ids it waits for. `order_dag()` is the order workflow; `random_dag(n, seed)` draws a
reproducible DAG; `critical_path(nodes, durations)` is the longest path through it weighted by
measured durations; `run_langgraph(nodes)` runs the same DAG as a LangGraph `StateGraph` of
sleeping async nodes (fan-out and fan-in, superstep execution) and reports what it measured.
"""

from __future__ import annotations

import asyncio
import operator
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


@dataclass(frozen=True)
class DagNode:
    """One node of a workload: its id, its tool's sleep in seconds, and its prerequisites."""

    id: str
    seconds: float
    prerequisites: tuple[str, ...] = ()


@dataclass
class Measured:
    """One run of a workload: the wall time of the call and each node's (start, end) times."""

    wall_s: float
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)

    def critical_path_s(self, nodes: Sequence[DagNode]) -> float:
        """The longest path through `nodes` weighted by the durations this run measured."""
        return critical_path(nodes, {k: end - start for k, (start, end) in self.spans.items()})

    def ratio(self, nodes: Sequence[DagNode]) -> float:
        """Makespan (the call's wall time) over the critical path of measured durations."""
        return self.wall_s / self.critical_path_s(nodes)


def order_dag() -> tuple[DagNode, ...]:
    """The order workflow: lookup and stock check together, then reserve, then confirm."""
    return (
        DagNode("customer_lookup", 0.030),
        DagNode("stock_check", 0.020),
        DagNode("reserve", 0.040, ("customer_lookup", "stock_check")),
        DagNode("confirm", 0.010, ("reserve",)),
    )


def random_dag(
    n: int,
    seed: int,
    *,
    seconds: tuple[float, float] = (0.010, 0.050),
    max_prerequisites: int = 3,
    window: int | None = None,
) -> tuple[DagNode, ...]:
    """A reproducible random DAG of `n` nodes `n0`..`n{n-1}`, in topological order.

    Node i waits for 0 to `max_prerequisites` distinct earlier nodes, drawn among the `window`
    nodes before it (all of them when None); its tool sleeps a uniform draw from `seconds`.
    """
    rng = random.Random(seed)
    nodes: list[DagNode] = []
    for i in range(n):
        lowest = 0 if window is None else max(0, i - window)
        pool = range(lowest, i)
        count = rng.randint(0, min(max_prerequisites, len(pool)))
        prerequisites = tuple(f"n{j}" for j in sorted(rng.sample(pool, count)))
        nodes.append(DagNode(f"n{i}", rng.uniform(*seconds), prerequisites))
    return tuple(nodes)


def critical_path(nodes: Sequence[DagNode], durations: Mapping[str, float]) -> float:
    """The longest path through `nodes` (in topological order), each weighing its duration."""
    finish: dict[str, float] = {}
    for node in nodes:
        ready = max((finish[p] for p in node.prerequisites), default=0.0)
        finish[node.id] = ready + durations[node.id]
    return max(finish.values())


def langgraph_available() -> bool:
    """True when LangGraph is installed (pip install -e '.[bench]')."""
    try:
        import langgraph.graph  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def build_langgraph(nodes: Sequence[DagNode], spans: dict[str, tuple[float, float]]) -> Any:
    """The workload as a compiled LangGraph `StateGraph` of sleeping async nodes.

    A node with no prerequisite hangs off START; one prerequisite is a plain edge; several are
    one waiting edge (`add_edge([a, b], c)`: c runs once, after both), so each node runs once.
    Nodes no one waits for lead to END. Each node records its (start, end) in `spans` and adds
    its id to the state's `done` list (a list reducer, so parallel writes merge). No
    checkpointer: the run is in memory, as agenttx's is.
    """
    from langgraph.graph import END, START, StateGraph  # noqa: PLC0415
    from typing_extensions import TypedDict  # noqa: PLC0415

    class State(TypedDict):
        done: Annotated[list[str], operator.add]

    def make(node: DagNode) -> Any:
        async def run(state: State) -> dict[str, list[str]]:  # noqa: ARG001
            started = time.perf_counter()
            await asyncio.sleep(node.seconds)
            spans[node.id] = (started, time.perf_counter())
            return {"done": [node.id]}

        return run

    builder = StateGraph(State)
    awaited: set[str] = set()
    for node in nodes:
        builder.add_node(node.id, make(node))
        if not node.prerequisites:
            builder.add_edge(START, node.id)
        elif len(node.prerequisites) == 1:
            builder.add_edge(node.prerequisites[0], node.id)
        else:
            builder.add_edge(list(node.prerequisites), node.id)
        awaited.update(node.prerequisites)
    for node in nodes:
        if node.id not in awaited:
            builder.add_edge(node.id, END)
    return builder.compile()


async def run_langgraph(nodes: Sequence[DagNode]) -> Measured:
    """Run the workload once on LangGraph; check every node ran exactly once."""
    spans: dict[str, tuple[float, float]] = {}
    graph = build_langgraph(nodes, spans)
    config = {"max_concurrency": len(nodes), "recursion_limit": len(nodes) + 10}
    started = time.perf_counter()
    final = await graph.ainvoke({"done": []}, config)
    measured = Measured(wall_s=time.perf_counter() - started, spans=spans)
    if sorted(final["done"]) != sorted(node.id for node in nodes):
        raise SystemExit(f"langgraph ran {sorted(final['done'])}, not each node once")
    return measured
