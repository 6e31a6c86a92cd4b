"""What a plan run reports at its end, read from its node records and final states: its
status, each node's result and its metrics (see `_execution`).

These read only the records and the scheduler's final states, never the run: a kept
`PlanResult` keeps no store, plan, tools or tasks alive.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from ._metrics import CostBreakdown, LazyMap, NodeTiming, PlanMetrics, plan_metrics
from ._records import node_timing
from ._results import NodeResult, PlanStatus
from ._scheduler import NodeState

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ._model import Plan
    from ._records import NodeRecord
    from ._scheduler import Scheduler

__all__ = ["node_results", "plan_status", "run_metrics"]


def plan_status(
    records: Mapping[str, NodeRecord], scheduler: Scheduler, plan: Plan, *, cancelled: bool
) -> PlanStatus:
    """The run's status once no node runs: CANCELLED if it was cancelled, SUCCEEDED if
    every node succeeded or is absorbed (every dependant takes it as optional and succeeded),
    FAILED otherwise."""
    if cancelled:
        return PlanStatus.CANCELLED
    for node_id in records:
        state = scheduler.state(node_id)
        if state is NodeState.SUCCEEDED:
            continue
        if state is NodeState.CANCELLED or not _absorbed(records, scheduler, plan, node_id):
            return PlanStatus.FAILED
    return PlanStatus.SUCCEEDED


def _absorbed(
    records: Mapping[str, NodeRecord], scheduler: Scheduler, plan: Plan, node_id: str
) -> bool:
    """A node that did not succeed but that every dependant takes as optional."""
    dependants = plan.dependants(node_id)
    return bool(dependants) and all(
        node_id in records[other].optional and scheduler.state(other) is NodeState.SUCCEEDED
        for other in dependants
    )


def node_results(
    records: Mapping[str, NodeRecord], scheduler: Scheduler, epoch: float
) -> LazyMap[NodeResult]:
    """Each node's result, built when first read (from the records and final states only:
    a kept result does not keep the run's store, tools or tasks alive). `epoch` turns a
    `time.monotonic()` reading into seconds since the epoch."""

    def wall(at: float | None) -> dt.datetime | None:
        return None if at is None else dt.datetime.fromtimestamp(at + epoch, dt.timezone.utc)

    def build(node_id: str) -> NodeResult:
        record = records[node_id]
        state = scheduler.state(node_id)
        attempts = record.attempts
        finished = record.finished_wall
        return NodeResult(
            node_id=node_id,
            tool=record.tool,
            state=state,
            output=record.output if state is NodeState.SUCCEEDED else None,
            error=record.error,
            attempts=len(attempts),
            attempt_ids=tuple(attempt.id for attempt in attempts),
            idempotency_key=record.key,
            started_at=wall(attempts[0].started_at) if attempts else record.started_wall,
            finished_at=finished if finished is not None else wall(record.finished_at),
            cost=CostBreakdown.of(entry for attempt in attempts for entry in attempt.costs),
        )

    return LazyMap(records, build)


def run_metrics(
    records: Mapping[str, NodeRecord], started: float, finished: float
) -> Callable[[], PlanMetrics]:
    """The run's metrics, computed when the result's `metrics` is first read (from the
    records, final by then); a node's timing is built again when its figures are read (so
    neither is kept a node: only the records, which the node results read too)."""

    def timing_of(node_id: str) -> NodeTiming:
        record = records[node_id]
        return node_timing(node_id, record, record.prerequisites, finished)

    def compute() -> PlanMetrics:
        return plan_metrics(
            (timing_of(node_id) for node_id in records),
            started_at=started,
            finished_at=finished,
            timing_of=timing_of,
        )

    return compute
