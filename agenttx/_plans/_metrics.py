"""What a plan run measured: makespan, critical path, parallelism, waits, latency and cost.

Pure functions of timings: `plan_metrics(timings, started_at=..., finished_at=...)` reads one
`NodeTiming` per node (its tool, its prerequisites, and each attempt's times and reported costs,
all in `time.monotonic()` seconds) and returns `PlanMetrics`. Nothing here runs a tool or reads
a clock, so tests drive it with synthetic timings.

Definitions (also in `docs/plans.md#metrics-and-cost`):

* a node's *duration* is from its first attempt's start to its last attempt's end (retries and
  their backoff included); a node that never started lasts 0;
* `makespan_s`: from the run's start to its end;
* `critical_path_s`: the longest path through the plan's graph (value and `after` edges) where
  each node weighs its duration; `critical_path` lists its nodes, first to last;
* `parallelism`: the time-weighted mean number of attempts running at once over the makespan,
  which equals the sum of every attempt's running time divided by the makespan (backoff waits
  are not running time);
* queue waits: a node's *prerequisite wait* is from the run's start until its prerequisites were
  all done (its first attempt became eligible); its *capacity wait* is, summed over its
  attempts, the time from becoming eligible (prerequisites done, or the backoff over) to
  starting: time spent queued for concurrency, resources, exclusive holds or rate limits;
* latency percentiles are nearest-rank (`p` percent of the values are at most it): per node over
  its attempts' running times, per tool over its attempts, and for the run over node durations;
* cost: every attempt's reported costs, failed and cancelled ones included; what an attempt that
  was followed by another attempt of the same node reported counts as `retry` overhead, whatever
  category it was reported under.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TypeVar, final

import attrs

from .._errors import InvalidArgument
from .._tools import COST_CATEGORIES

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

__all__ = [
    "CURRENCY",
    "NO_COST",
    "AttemptTiming",
    "CostBreakdown",
    "LazyMap",
    "NodeMetrics",
    "NodeTiming",
    "PlanMetrics",
    "ToolMetrics",
    "node_metrics",
    "percentile",
    "plan_metrics",
]

#: The currency of every cost: pounds sterling.
CURRENCY: Final = "GBP"
_ZERO: Final = Decimal(0)


def _check_amount(_: object, attribute: attrs.Attribute[Decimal], value: object) -> None:
    if not isinstance(value, Decimal) or not value.is_finite() or value < 0:
        raise InvalidArgument(f"{attribute.name} must be a finite Decimal >= 0, got {value!r}")


def _amount() -> Decimal:
    return _ZERO


@final
@attrs.frozen(kw_only=True)
class CostBreakdown:
    """Spending in GBP by category, as `Decimal`s: never floats, never rounded.

    `model` (model calls and tokens), `tool` (tool charges), `infrastructure`, `retry` (retry
    overhead); `total` is their sum. Breakdowns add up with `+`. Each field must be a finite,
    non-negative `Decimal` (`InvalidArgument` names it).
    """

    model: Decimal = attrs.field(factory=_amount, validator=_check_amount)
    tool: Decimal = attrs.field(factory=_amount, validator=_check_amount)
    infrastructure: Decimal = attrs.field(factory=_amount, validator=_check_amount)
    retry: Decimal = attrs.field(factory=_amount, validator=_check_amount)

    @property
    def currency(self) -> str:
        """The ISO 4217 code of every amount: `GBP`."""
        return CURRENCY

    @property
    def total(self) -> Decimal:
        """The sum of every category."""
        return self.model + self.tool + self.infrastructure + self.retry

    def __add__(self, other: object) -> CostBreakdown:
        if not isinstance(other, CostBreakdown):
            return NotImplemented
        return CostBreakdown(
            model=self.model + other.model,
            tool=self.tool + other.tool,
            infrastructure=self.infrastructure + other.infrastructure,
            retry=self.retry + other.retry,
        )

    @classmethod
    def of(cls, entries: Iterable[tuple[str, Decimal]]) -> CostBreakdown:
        """The breakdown of `(category, amount)` entries (categories of `COST_CATEGORIES`)."""
        sums = dict.fromkeys(COST_CATEGORIES, _ZERO)
        found = False
        for category, amount in entries:
            if category not in sums:
                raise InvalidArgument(f"unknown cost category {category!r}")
            sums[category] += amount
            found = True
        return cls(**sums) if found else NO_COST


#: The breakdown of no spending (shared: breakdowns are immutable).
NO_COST: Final = CostBreakdown()


class AttemptTiming(NamedTuple):
    """One attempt of a node: when it could start, started and ended, and what it reported.

    `eligible_at <= started_at <= finished_at` (monotonic seconds: the runner clamps them so);
    `costs` are `(category, amount)` pairs as `ToolContext.add_cost` checked them. A tuple: a
    run of thousands of nodes keeps one per attempt, and tuples of numbers cost the garbage
    collector nothing.
    """

    eligible_at: float
    started_at: float
    finished_at: float
    costs: tuple[tuple[str, Decimal], ...] = ()

    @property
    def running_s(self) -> float:
        """How long the attempt ran."""
        return self.finished_at - self.started_at


class NodeTiming(NamedTuple):
    """A node's tool, its prerequisites (node ids) and its attempts, oldest first.

    `eligible_at` is when its prerequisites were all done, for a node that never started (a
    skipped or cancelled node has no attempts); None when they never were.
    """

    node_id: str
    tool: str
    prerequisites: frozenset[str] = frozenset()
    attempts: tuple[AttemptTiming, ...] = ()
    eligible_at: float | None = None

    @property
    def started_at(self) -> float | None:
        """When its first attempt started, or None."""
        return self.attempts[0].started_at if self.attempts else None

    @property
    def duration_s(self) -> float:
        """From its first attempt's start to its last one's end; 0 if it never started."""
        if not self.attempts:
            return 0.0
        return self.attempts[-1].finished_at - self.attempts[0].started_at


@final
@attrs.frozen(kw_only=True)
class NodeMetrics:
    """One node's figures: see the module docstring for each definition."""

    duration_s: float
    attempts: int
    retries: int
    prerequisite_wait_s: float
    capacity_wait_s: float
    latency_p50_s: float
    latency_p95_s: float
    cost: CostBreakdown


@final
@attrs.frozen(kw_only=True)
class ToolMetrics:
    """One tool's figures over every attempt of every node that uses it."""

    calls: int
    retries: int
    latency_p50_s: float
    latency_p95_s: float
    cost: CostBreakdown


def _read_only(value: Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(value, LazyMap):  # read-only already, and built as it is read
        return value
    return MappingProxyType(dict(value))


@final
@attrs.frozen(kw_only=True)
class PlanMetrics:
    """What a plan run measured; every time in seconds, every cost in GBP.

    `critical_path_ratio` is `makespan_s / critical_path_s` (1.0 is a run that lost no time to
    scheduling; None when the critical path lasted 0). `queue_wait_s` is `prerequisite_wait_s +
    capacity_wait_s`, summed over nodes. `nodes` and `tools` give per-node and per-tool figures.
    See `docs/plans.md#metrics-and-cost` for each definition.
    """

    makespan_s: float
    critical_path_s: float
    critical_path: tuple[str, ...]
    critical_path_ratio: float | None
    parallelism: float
    queue_wait_s: float
    prerequisite_wait_s: float
    capacity_wait_s: float
    latency_p50_s: float
    latency_p95_s: float
    retries: int
    cost: CostBreakdown
    nodes: Mapping[str, NodeMetrics] = attrs.field(factory=dict, converter=_read_only)
    tools: Mapping[str, ToolMetrics] = attrs.field(factory=dict, converter=_read_only)


def percentile(values: Iterable[float], p: float) -> float:
    """The nearest-rank `p`-th percentile (0 < p <= 100) of `values`; 0.0 for none.

    The smallest value such that at least `p` percent of the values are at most it.
    """
    ordered = sorted(values)
    if not ordered:
        return 0.0
    if not 0 < p <= 100:
        raise InvalidArgument(f"p must be in (0, 100], got {p!r}")
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def plan_metrics(
    timings: Iterable[NodeTiming],
    *,
    started_at: float,
    finished_at: float,
    timing_of: Callable[[str], NodeTiming] | None = None,
) -> PlanMetrics:
    """The metrics of a run that started and ended at these monotonic times.

    Prerequisites that name no node of `timings` are ignored; a node id given twice counts
    once (the last timing). With `timing_of` (which gives a node's timing again, by id) the
    timings are read once and not kept: `nodes` then builds a node's figures from
    `timing_of(node_id)` when read. Raises `InvalidArgument` if the run ends before it starts,
    if an attempt's times are out of order, or if the prerequisites form a cycle.
    """
    if not started_at <= finished_at:
        raise InvalidArgument(
            f"a run must end after it starts, got {started_at!r} .. {finished_at!r}"
        )
    if timing_of is None:
        kept = {timing.node_id: timing for timing in timings}
        timings = kept.values()
        timing_of = kept.__getitem__
    # What the figures need, without keeping one object a node (a run of thousands of nodes
    # would hand each to every later garbage collection): floats and the given sets.
    lasting: dict[str, float] = {}
    prerequisites: dict[str, frozenset[str]] = {}
    makespan = finished_at - started_at
    by_tool: dict[str, list[float]] = {}
    tool_retries: dict[str, int] = {}
    tool_costs: dict[str, list[tuple[str, Decimal]]] = {}
    costs: list[tuple[str, Decimal]] = []
    durations: list[float] = []
    busy = prerequisite_wait = capacity_wait = 0.0
    retries = 0
    for timing in timings:
        attempts = timing.attempts
        tool = timing.tool
        lasting[timing.node_id] = timing.duration_s
        prerequisites[timing.node_id] = timing.prerequisites
        node_retries = max(0, len(attempts) - 1)
        retries += node_retries
        tool_retries[tool] = tool_retries.get(tool, 0) + node_retries
        by_tool.setdefault(tool, []).extend(a.finished_at - a.started_at for a in attempts)
        prerequisite_wait += _prerequisite_wait(timing, started_at)
        if attempts:
            durations.append(timing.duration_s)
            for attempt in attempts:
                if not attempt.eligible_at <= attempt.started_at <= attempt.finished_at:
                    raise InvalidArgument(
                        f"an attempt of node {timing.node_id!r} must become eligible, start and "
                        f"finish in that order, got {attempt.eligible_at!r}, "
                        f"{attempt.started_at!r}, {attempt.finished_at!r}"
                    )
                busy += attempt.finished_at - attempt.started_at
                capacity_wait += attempt.started_at - attempt.eligible_at
            if any(attempt.costs for attempt in attempts):
                node_costs = _attempt_costs(attempts)
                costs.extend(node_costs)
                tool_costs.setdefault(tool, []).extend(node_costs)
    tools = {
        name: ToolMetrics(
            calls=len(running),
            retries=tool_retries[name],
            latency_p50_s=percentile(running, 50),
            latency_p95_s=percentile(running, 95),
            cost=CostBreakdown.of(tool_costs.get(name, ())),
        )
        for name, running in by_tool.items()
    }
    critical_s, path = _longest_path(lasting, prerequisites)
    return PlanMetrics(
        makespan_s=makespan,
        critical_path_s=critical_s,
        critical_path=path,
        critical_path_ratio=makespan / critical_s if critical_s > 0 else None,
        parallelism=busy / makespan if makespan > 0 else 0.0,
        queue_wait_s=prerequisite_wait + capacity_wait,
        prerequisite_wait_s=prerequisite_wait,
        capacity_wait_s=capacity_wait,
        latency_p50_s=percentile(durations, 50),
        latency_p95_s=percentile(durations, 95),
        retries=retries,
        cost=CostBreakdown.of(costs),
        nodes=LazyMap(lasting, lambda node_id: node_metrics(timing_of(node_id), started_at)),
        tools=tools,
    )


def _prerequisite_wait(timing: NodeTiming, started_at: float) -> float:
    eligible = timing.attempts[0].eligible_at if timing.attempts else timing.eligible_at
    return 0.0 if eligible is None else max(0.0, eligible - started_at)


def node_metrics(timing: NodeTiming, started_at: float) -> NodeMetrics:
    """One node's figures, in a run that started at `started_at`."""
    running = [attempt.running_s for attempt in timing.attempts]
    return NodeMetrics(
        duration_s=timing.duration_s,
        attempts=len(timing.attempts),
        retries=max(0, len(timing.attempts) - 1),
        prerequisite_wait_s=_prerequisite_wait(timing, started_at),
        capacity_wait_s=sum(a.started_at - a.eligible_at for a in timing.attempts),
        latency_p50_s=percentile(running, 50),
        latency_p95_s=percentile(running, 95),
        cost=CostBreakdown.of(_attempt_costs(timing.attempts)),
    )


V = TypeVar("V")


@final
class LazyMap(Mapping[str, V]):
    """A read-only mapping whose values are built from their keys when first read, then kept.

    For per-node figures and results of a run of thousands of nodes: a caller that reads a few
    (or none) never pays for the rest. Iteration follows `keys`; `build(key)` is called at most
    once per key.
    """

    __slots__ = ("_build", "_built", "_keys")

    def __init__(self, keys: Mapping[str, object], build: Callable[[str], V]) -> None:
        self._keys = keys
        self._build = build
        self._built: dict[str, V] = {}

    def __getitem__(self, key: str) -> V:
        try:
            return self._built[key]
        except KeyError:
            if key not in self._keys:
                raise
        built = self._built[key] = self._build(key)
        return built

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"<read-only mapping of {len(self._keys)} entries, built as read>"


def _attempt_costs(attempts: tuple[AttemptTiming, ...]) -> list[tuple[str, Decimal]]:
    """Every attempt's costs; those of an attempt that another followed count as `retry`."""
    entries: list[tuple[str, Decimal]] = []
    last = len(attempts) - 1
    for index, attempt in enumerate(attempts):
        if index < last:
            entries.extend(("retry", amount) for _, amount in attempt.costs)
        else:
            entries.extend(attempt.costs)
    return entries


def critical_path(nodes: Mapping[str, NodeTiming]) -> tuple[float, tuple[str, ...]]:
    """The longest path by node duration through the prerequisite graph, and its nodes.

    Kahn's algorithm, O(nodes + edges), no recursion (a 10,000-node chain is fine); ties go to
    the end node reached first. Raises `InvalidArgument` for a cycle.
    """
    return _longest_path(
        {node_id: timing.duration_s for node_id, timing in nodes.items()},
        {node_id: timing.prerequisites for node_id, timing in nodes.items()},
    )


def _longest_path(
    lasting: Mapping[str, float], prerequisites: Mapping[str, frozenset[str]]
) -> tuple[float, tuple[str, ...]]:
    """`critical_path` of nodes given as their durations and prerequisites (same keys).

    The graph is held in a few flat lists of positions (each node's dependants are a slice of
    one list, in the order the nodes list them), not a list a node.
    """
    ids = list(lasting)
    count = len(ids)
    position = {node_id: index for index, node_id in enumerate(ids)}
    waiting = [0] * count
    starts = [0] * (count + 1)
    for index, node_id in enumerate(ids):
        for prerequisite in prerequisites[node_id]:
            source = position.get(prerequisite)
            if source is not None:
                waiting[index] += 1
                starts[source + 1] += 1
    for index in range(count):
        starts[index + 1] += starts[index]
    filled = starts[:-1]
    dependants = [0] * starts[-1]
    for index, node_id in enumerate(ids):
        for prerequisite in prerequisites[node_id]:
            source = position.get(prerequisite)
            if source is not None:
                dependants[filled[source]] = index
                filled[source] += 1
    ready = [index for index in range(count) if waiting[index] == 0]
    best: dict[int, float] = {}
    came_from: dict[int, int] = {}
    for index in ready:
        best[index] = lasting[ids[index]]
        came_from[index] = -1
    seen = 0
    while ready:
        index = ready.pop()
        seen += 1
        for dependant in dependants[starts[index] : starts[index + 1]]:
            candidate = best[index] + lasting[ids[dependant]]
            if dependant not in best or candidate > best[dependant]:
                best[dependant] = candidate
                came_from[dependant] = index
            waiting[dependant] -= 1
            if waiting[dependant] == 0:
                ready.append(dependant)
    if seen != count:
        raise InvalidArgument("the prerequisites of the timed nodes form a cycle")
    if not best:
        return 0.0, ()
    end = max(best, key=lambda index: best[index])
    path: list[str] = []
    cursor = end
    while cursor >= 0:
        path.append(ids[cursor])
        cursor = came_from[cursor]
    path.reverse()
    return best[end], tuple(path)
