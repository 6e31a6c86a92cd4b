"""What a plan run reports: each node's result, the audit record, compensations and metrics.

Everything here is a frozen record: `PlanResult` (the run), `NodeResult` (one node),
`CompensationOutcome` (one undo of a completed node); the audit entries are `agenttx.Event`s
(scope "plan"). The audit is append-only while the run goes on and exported as JSON lines by
`PlanResult.audit_jsonl()`. Timestamps are timezone-aware UTC datetimes; durations and metrics
come from the monotonic clock.
"""

from __future__ import annotations

import enum
from decimal import Decimal
from types import MappingProxyType
from typing import TYPE_CHECKING, final

import attrs

from .._errors import InvalidArgument
from .._events import Event, EventKind, RecordedEvents, audit_jsonl
from ._metrics import NO_COST, CostBreakdown, LazyMap, PlanMetrics
from ._scheduler import NodeState

if TYPE_CHECKING:
    import datetime as dt
    from collections.abc import Callable, Iterable, Mapping

    from .._hints import CleanHint
    from .._json import JSONValue

__all__ = [
    "CompensationOutcome",
    "CompensationStatus",
    "NodeResult",
    "PlanEventKind",
    "PlanResult",
    "PlanStatus",
    "cost_per_completed_workflow",
]


class PlanStatus(enum.Enum):
    """Where a plan run is: RUNNING, then one of SUCCEEDED, FAILED, CANCELLED."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"  # every node that counts succeeded; state committed, effects sent
    FAILED = "FAILED"  # a node failed (or the commit conflicted); nothing published
    CANCELLED = "CANCELLED"  # `PlanRun.cancel` or the awaiting task was cancelled

    @property
    def is_terminal(self) -> bool:
        """True once the run has ended."""
        return self is not PlanStatus.RUNNING


class CompensationStatus(enum.Enum):
    """How one compensation went: REQUESTED, then COMPLETED or FAILED (kept)."""

    REQUESTED = "REQUESTED"  # not run (compensate_on="never", or the run was interrupted)
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"  # every attempt failed: kept for manual intervention


@final
@attrs.frozen(kw_only=True)
class CompensationOutcome:
    """One undo of a node: which compensation (`kind`), its status, and the last error."""

    node_id: str
    kind: str
    description: str
    status: CompensationStatus
    error: str | None = None


#: The plan modules' name for the event kinds (plan runs record `EventKind` members).
PlanEventKind = EventKind


@final
@attrs.frozen(kw_only=True)
class NodeResult:
    """How one node ended.

    `state` is terminal (SUCCEEDED, FAILED, TIMED_OUT, CANCELLED, SKIPPED). `output` is the
    tool's output for a SUCCEEDED node (else None); `error` the Clean Hint of its last failure.
    `attempts` counts the attempts started, `attempt_ids` names them; every attempt shares
    `idempotency_key`. `started_at` / `finished_at` are UTC datetimes of its first start and its
    end (None if it never started). `cost` is what its attempts reported.
    """

    node_id: str
    tool: str
    state: NodeState
    output: JSONValue = None
    error: CleanHint | None = None
    attempts: int = 0
    attempt_ids: tuple[str, ...] = ()
    idempotency_key: str = ""
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    cost: CostBreakdown = NO_COST


def _frozen_nodes(value: Mapping[str, NodeResult]) -> Mapping[str, NodeResult]:
    if isinstance(value, LazyMap):  # read-only already: each result is built when read
        return value
    return MappingProxyType(dict(value))


def _built_events(value: tuple[Event, ...] | RecordedEvents) -> tuple[Event, ...]:
    return value() if isinstance(value, RecordedEvents) else value


def _built_metrics(value: PlanMetrics | Callable[[], PlanMetrics]) -> PlanMetrics:
    return value if isinstance(value, PlanMetrics) else value()


@final
@attrs.frozen(kw_only=True, repr=False)
class PlanResult:
    """The end of a plan run.

    `status` is SUCCEEDED, FAILED or CANCELLED; `nodes[node_id]` each node's `NodeResult`, in
    plan order; `metrics` the run's `PlanMetrics`; `compensations` each undo run (or requested)
    for completed nodes, newest completion first; `cancel_reason` why it was cancelled;
    `error` what ended a failed run that no node explains (a commit conflict); `committed_keys`
    the state keys the commit published; `effects_dispatched` / `dispatch_errors` what delivery
    of the staged effects did (delivery errors never undo the commit); `audit` the append-only
    record of the run.
    """

    run_id: str
    plan_version: str
    status: PlanStatus
    nodes: Mapping[str, NodeResult] = attrs.field(converter=_frozen_nodes)
    # Given as `metrics=`: the metrics, or a function computing them when first read.
    _metrics: PlanMetrics | Callable[[], PlanMetrics] = attrs.field(eq=_built_metrics)
    compensations: tuple[CompensationOutcome, ...] = ()
    cancel_reason: str | None = None
    error: str | None = None
    committed_keys: int = 0
    effects_dispatched: int = 0
    dispatch_errors: tuple[str, ...] = ()
    # Given as `audit=`: the events, or the runner's `RecordedEvents`, built when first read.
    _audit: tuple[Event, ...] | RecordedEvents = attrs.field(default=(), eq=_built_events)

    def __repr__(self) -> str:
        # A summary: the whole result may hold thousands of nodes and events, and asyncio
        # formats the repr of a finished main task's result when `asyncio.run` returns.
        return (
            f"<agenttx.PlanResult {self.run_id!r} {self.status.value} nodes={len(self.nodes)} "
            f"events={len(self._audit)}>"
        )

    @property
    def audit(self) -> tuple[Event, ...]:
        """The append-only record of the run, in `seq` order (built when first read, then the
        same tuple at every read)."""
        audit = self._audit
        if isinstance(audit, RecordedEvents):
            audit = audit()
            object.__setattr__(self, "_audit", audit)
        return audit

    @property
    def metrics(self) -> PlanMetrics:
        """The run's `PlanMetrics`: computed when first read (a caller that never reads them
        never pays for them), from the run's final records, then the same object at every
        read."""
        metrics = self._metrics
        if not isinstance(metrics, PlanMetrics):
            metrics = metrics()
            object.__setattr__(self, "_metrics", metrics)
        return metrics

    @property
    def succeeded(self) -> bool:
        """True for a run that ended SUCCEEDED."""
        return self.status is PlanStatus.SUCCEEDED

    def outputs(self) -> dict[str, JSONValue]:
        """The output of every SUCCEEDED node, by node id."""
        return {
            node_id: result.output
            for node_id, result in self.nodes.items()
            if result.state is NodeState.SUCCEEDED
        }

    def audit_jsonl(self) -> str:
        """The audit record as JSON lines: one object per event, in order, each line ending
        with a newline."""
        return audit_jsonl(self.audit)


def cost_per_completed_workflow(results: Iterable[PlanResult]) -> Decimal:
    """Total spend of every run (failed and cancelled ones included) per SUCCEEDED run, in GBP.

    Exact `Decimal` division, not rounded. Raises `InvalidArgument` when no run succeeded
    (the cost per completed workflow is then undefined), or when an item is not a `PlanResult`.
    """
    total = Decimal(0)
    completed = 0
    runs = 0
    for result in results:
        if not isinstance(result, PlanResult):
            raise InvalidArgument(f"expected PlanResult objects, got {result!r:.80}")
        runs += 1
        total += result.metrics.cost.total
        completed += result.status is PlanStatus.SUCCEEDED
    if not completed:
        raise InvalidArgument(
            f"no completed run among {runs}: the cost per completed workflow is undefined "
            f"(total spend {total} GBP)"
        )
    return total / completed
