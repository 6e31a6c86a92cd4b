"""The chain workload shared by bench/transaction.py and bench/durable.py (imported as `_chain`).

A chain of `STEPS` calls of a no-op tool, each with one `${steps.N.id}` reference to the
previous step's output and three literal arguments; the same chain as a LangGraph `StateGraph`
of `STEPS` nodes, for the side-by-side comparisons.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import agenttx

    #: How the per-step figures are summed up: the scripts' tables take the median;
    #: bench/compare.py the mean (every step's time counts, the collector's pauses too).
    Statistic = Callable[[Sequence[float]], float]

STEPS = 20


def noop(a: str, b: int, c: str, d: bool) -> dict[str, Any]:  # noqa: ARG001
    """The tool: does nothing, returns an id for the next step to reference."""
    return {"id": a, "n": b}


def time_chains(
    begin: Callable[[], agenttx.Transaction],
    transactions: int,
    *,
    statistic: Statistic = statistics.median,
) -> float:
    """Microseconds per `execute_step` of the tool "noop" over `transactions` chains, the
    median of the steps' times (or `statistic` of them).

    The first step of each chain is not timed (it has no reference); each chain commits.
    """
    times: list[float] = []
    for _ in range(transactions):
        tx = begin()
        tx.execute_step(1, "noop", {"a": "start", "b": 1, "c": "lit", "d": True})
        for step in range(2, STEPS + 1):
            arguments = {"a": f"${{steps.{step - 1}.id}}", "b": step, "c": "lit", "d": True}
            started = time.perf_counter_ns()
            result = tx.execute_step(step, "noop", arguments)
            times.append(time.perf_counter_ns() - started)
            if not result.ok or result.output != {"id": "start", "n": step}:
                raise SystemExit(f"agenttx step {step} went wrong: {result}")
        if tx.commit().steps_committed != STEPS:
            raise SystemExit("agenttx commit went wrong")
    return statistic(times) / 1000


def time_langgraph(
    checkpointer: object, runs: int, *, statistic: Statistic = statistics.median
) -> float:
    """Microseconds per node of the chain as a LangGraph graph with `checkpointer`: the median
    (or `statistic`) over runs of one run's time divided by its nodes."""
    from langgraph.graph import END, START, StateGraph  # noqa: PLC0415
    from typing_extensions import TypedDict  # noqa: PLC0415

    class State(TypedDict):
        outputs: dict[str, dict[str, Any]]

    def node(step: int) -> Any:
        def run(state: State) -> dict[str, Any]:
            previous = state["outputs"].get(str(step - 1), {"id": "start"})
            output = noop(previous["id"], step, "lit", True)
            return {"outputs": {**state["outputs"], str(step): output}}

        return run

    builder = StateGraph(State)
    for step in range(1, STEPS + 1):
        builder.add_node(f"s{step}", node(step))
        builder.add_edge(START if step == 1 else f"s{step - 1}", f"s{step}")
    builder.add_edge(f"s{STEPS}", END)
    graph = builder.compile(checkpointer=checkpointer)  # type: ignore[arg-type]
    times: list[float] = []
    for run in range(runs):
        config = {"configurable": {"thread_id": f"t{run}"}}
        started = time.perf_counter_ns()
        final = graph.invoke({"outputs": {}}, config)  # type: ignore[arg-type]
        times.append((time.perf_counter_ns() - started) / STEPS)
        if final["outputs"][str(STEPS)] != {"id": "start", "n": STEPS}:
            raise SystemExit("langgraph chain went wrong")
    return statistic(times) / 1000
