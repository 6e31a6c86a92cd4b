"""The plan scheduler: a pure ready-set scheduler with resource limits and exactly-once results.

It has the shape of `graphlib.TopologicalSorter` (build, `get_ready`, `done`, `is_active`) and
does no I/O: no clocks (the caller passes `now`, a `time.monotonic()` reading), no threads, no
tools. The runner drives it; tests drive it without running anything::

    sched = Scheduler(
        [
            Task(id="lookup"),
            Task(id="stock"),
            Task(id="reserve", prerequisites={"lookup", "stock"}, exclusive="order:7"),
            Task(id="confirm", prerequisites={"reserve"}),
        ],
        max_concurrency=8,
    )
    while sched.is_active():
        for start in sched.get_ready(now=time.monotonic()):
            ...  # dispatch start.node; keep start.attempt
        ...  # on each result: sched.done(node, attempt) or sched.failed(node, attempt, ...)

The contract, per node:

- Its unresolved count starts at the number of distinct prerequisite nodes (`Task.prerequisites`
  is a set) and drops by one when a prerequisite's success is applied, or when a prerequisite
  listed in `Task.optional` ends FAILED, TIMED_OUT or SKIPPED (the node then runs with its
  fallback). At zero the node is READY.
- `get_ready(now)` starts READY nodes (state RUNNING, each with a fresh attempt id) while the
  limits allow: at most `max_concurrency` running, a named resource's tokens (`capacities`) never
  over-committed, one holder per exclusive key, and at most a token bucket's worth of starts per
  rate-limited tool (`rate_limits`, refilled by `now`). A node the limits hold back stays queued
  (READY), first come first served per limit, and starts on a later call; it is never dropped.
- `done(node, attempt)` and `failed(node, attempt, ...)` are applied exactly once, keyed by
  (node, attempt id): a second delivery of an applied result is `Delivery.DUPLICATE`; a result of
  an attempt that is not the node's running one (superseded by a retry, cancelled, never issued)
  is `Delivery.STALE`. Neither changes anything. An unknown node id is misuse and raises.
- A final failure makes the node FAILED (or TIMED_OUT); with `on_failure="skip_dependants"`
  (the default) its dependants are SKIPPED, transitively (a node that lists the failed or skipped
  prerequisite in `optional` is released instead), and independent work goes on; with
  `"cancel_all"` every unfinished node is CANCELLED. A failure with `retry_at` makes the node
  READY again, startable with a new attempt once `now >= retry_at`.
- `cancel(reason)` stops new starts and makes every unfinished node CANCELLED; the running
  attempts it ends are returned (`Update.interrupted`) so the runner can stop them, and their
  late results are refused as STALE.
- Every node ends in exactly one of SUCCEEDED, FAILED, TIMED_OUT, CANCELLED, SKIPPED, and a
  terminal state never changes. `NodeState` lives here so the scheduler and the runner share
  one enum.
- `next_wakeup()` is when time alone could start something (a retry's `retry_at`, a tool's
  next token); right after `get_ready(now)` it is None or later than `now`, so a loop that
  waits for it or for the next result never spins.

Cost: building is O(nodes + edges) (it also refuses unknown prerequisites and cycles); each
result costs O(1) plus its dependants; `get_ready` costs O(1) per node it starts or queues on
a limit, plus the rate-limited tools that have waiting nodes. Nothing scans all nodes per
event, except `cancel` and a `cancel_all` failure, which end the run (once).

Not thread-safe: one caller (the runner's loop) owns a scheduler. Inputs being valid, deadlines
and approvals are the runner's checks; it reports a node it will not run as failed.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import TYPE_CHECKING, Final, Literal, cast, final

from .._errors import InvalidArgument
from ._tasks import (
    _APPLIED,
    _APPLIED_DELIVERY,
    _DUPLICATE,
    _EPSILON,
    _STALE,
    _TERMINAL,
    Delivery,
    Entry,
    NodeState,
    RateLimit,
    Start,
    Task,
    Update,
    _entry,
    _Gate,
    _new_start,
    _new_update,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "Delivery",
    "Entry",
    "NodeState",
    "RateLimit",
    "Scheduler",
    "Start",
    "Task",
    "Update",
]

#: The failure policies `Scheduler(on_failure=...)` accepts.
FailurePolicy = Literal["skip_dependants", "cancel_all"]
_POLICIES: Final = ("skip_dependants", "cancel_all")


@final
class Scheduler:
    """A pure ready-set scheduler over `tasks`: see the module docstring for the contract.

    Raises `InvalidArgument` for a duplicate node id, a prerequisite that is not a node, a node
    that is its own prerequisite, a cycle, a `max_concurrency` that is not an integer > 0, a
    capacity that is not an integer >= 0, a resource with no capacity or asked for beyond it,
    and an unknown `on_failure`. A task may be given as an `Entry` (the runner's per-node
    record, its fields checked already); `acyclic=True` skips the cycle check, for
    prerequisites known to have none (a validated plan's).
    """

    __slots__ = (
        "_cancel_reason",
        "_dirty",
        "_entries",
        "_finished",
        "_max",
        "_on_failure",
        "_rated",
        "_ready",
        "_retries",
        "_running",
        "_seq",
        "_waiting_rates",
    )

    def __init__(
        self,
        tasks: Iterable[Task | Entry],
        *,
        max_concurrency: int,
        capacities: Mapping[str, int] | None = None,
        rate_limits: Mapping[str, RateLimit] | None = None,
        on_failure: FailurePolicy = "skip_dependants",
        acyclic: bool = False,
    ) -> None:
        if (
            not isinstance(max_concurrency, int)
            or isinstance(max_concurrency, bool)
            or max_concurrency <= 0
        ):
            raise InvalidArgument(
                f"max_concurrency must be an integer > 0, got {max_concurrency!r}"
            )
        if on_failure not in _POLICIES:
            raise InvalidArgument(
                f"on_failure must be 'skip_dependants' or 'cancel_all', got {on_failure!r}"
            )
        self._max = max_concurrency
        self._on_failure = on_failure
        self._cancel_reason: str | None = None
        self._running = 0
        self._finished = 0
        self._seq = 0
        self._ready: deque[Entry] = deque()
        self._retries: list[tuple[float, int, Entry]] = []
        self._dirty: dict[_Gate, None] = {}  # resource gates released while nodes wait on them
        self._waiting_rates: dict[_Gate, None] = {}  # rate gates with waiting nodes
        resources = _resource_gates(capacities or {})
        self._rated = rated = _rate_gates(rate_limits or {})
        exclusive: dict[str, _Gate] = {}
        entries: dict[str, Entry] = {}
        self._entries = entries
        # One task at a time (a generator's are dropped as read).
        for task in tasks:
            entry = _entry(task)
            node_id = entry.id
            if node_id in entries:
                raise InvalidArgument(f"duplicate node id {node_id!r}")
            if entry.resources or entry.exclusive is not None or entry.tool in rated:
                entry.demands = self._demands(entry, resources, exclusive)
            entries[node_id] = entry
        for node_id, entry in entries.items():
            for prerequisite in entry.prerequisites:
                source = entries.get(prerequisite)
                if source is None or prerequisite == node_id:
                    raise InvalidArgument(
                        f"node {node_id!r} lists itself as a prerequisite"
                        if prerequisite == node_id
                        else f"node {node_id!r} waits for {prerequisite!r}, which is not a node"
                    )
                cast("list[str]", source.dependants).append(node_id)
        if not acyclic:
            _refuse_cycles(
                {node_id: entry.prerequisites for node_id, entry in entries.items()}, entries
            )
        ready = self._ready
        for entry in entries.values():
            entry.dependants = tuple(entry.dependants)
            if entry.count == 0:
                entry.state = NodeState.READY
                ready.append(entry)

    def _demands(
        self, entry: Entry, resources: dict[str, _Gate], exclusive: dict[str, _Gate]
    ) -> tuple[tuple[_Gate, float], ...]:
        node_id, key = entry.id, entry.exclusive
        demands: list[tuple[_Gate, float]] = []
        for name, amount in entry.resources.items():
            gate = resources.get(name)
            if gate is None:
                raise InvalidArgument(
                    f"node {node_id!r} holds resource {name!r}, which has no capacity"
                    f" (give it one in capacities)"
                )
            if amount > gate.capacity:
                raise InvalidArgument(
                    f"node {node_id!r} holds {amount} of resource {name!r}, beyond its capacity"
                    f" {gate.capacity:g}: it could never start"
                )
            demands.append((gate, amount))
        if key is not None:
            gate = exclusive.get(key)
            if gate is None:
                gate = exclusive[key] = _Gate(f"exclusive:{key}", 1)
            demands.append((gate, 1))
        rated = self._rated.get(entry.tool)
        if rated is not None:
            demands.append((rated, 1))
        return tuple(demands)

    # -- what the runner reads ------------------------------------------------------------

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node id, in the order the tasks were given."""
        return tuple(self._entries)

    @property
    def on_failure(self) -> FailurePolicy:
        """The failure policy chosen at construction."""
        return self._on_failure

    @property
    def cancel_reason(self) -> str | None:
        """The reason given to `cancel`, or None while the run is not cancelled."""
        return self._cancel_reason

    @property
    def running_count(self) -> int:
        """How many attempts are running (started, result not yet applied)."""
        return self._running

    def state(self, node: str) -> NodeState:
        """The node's state; raises `InvalidArgument` for an unknown node."""
        return self._entry(node).state

    def unresolved(self, node: str) -> int:
        """How many of the node's distinct prerequisites are unresolved."""
        return self._entry(node).count

    def attempts(self, node: str) -> tuple[str, ...]:
        """The attempt ids issued for the node, oldest first."""
        entry = self._entry(node)
        return tuple(f"{entry.id}#{entry.first + i}" for i in range(1, entry.issued + 1))

    def is_active(self) -> bool:
        """True while some node has not reached a terminal state (as `graphlib`'s)."""
        return self._finished < len(self._entries)

    def next_wakeup(self) -> float | None:
        """The earliest `now` at which `get_ready` could start a node that time holds back.

        That is a retry's `retry_at` or a rate-limited tool's next token; None when nothing
        waits for time (the next start then waits for a result, or nothing is left). A node
        held back by concurrency or a resource waits for a result, not for time. Right after
        `get_ready(now)`, the answer is None or later than `now`, so a loop that sleeps until
        it (or the next result) never spins.
        """
        if self._cancel_reason is not None:
            return None
        # A bucket holding a token has nodes waiting for a free slot, not for time.
        times = [gate.due() for gate in self._waiting_rates if gate.tokens + _EPSILON < 1]
        if self._retries:
            times.append(self._retries[0][0])
        return min(times, default=None)

    def _entry(self, node: str) -> Entry:
        entry = self._entries.get(node)
        if entry is None:
            raise InvalidArgument(f"unknown node {node!r}")
        return entry

    # -- starting ---------------------------------------------------------------------------

    def get_ready(self, now: float) -> tuple[Start, ...]:
        """Start every READY node the limits allow at `now`; each is RUNNING on return.

        Nodes held back by a limit that has room again go first, then the READY nodes not yet
        tried (retries that are due among them), in the order they became startable. Returns ()
        once cancelled. `now` must not go backwards between calls.
        """
        if self._cancel_reason is not None:
            return ()
        started: list[Start] = []
        retries = self._retries
        while retries and retries[0][0] <= now:
            self._ready.append(heapq.heappop(retries)[2])
        if self._dirty:
            for gate in list(self._dirty):
                if self._drain(gate, now, started):
                    del self._dirty[gate]
        if self._waiting_rates:
            for gate in list(self._waiting_rates):
                self._drain(gate, now, started)
                if not gate.queue:  # a rate limit's line waits for time, not for a release
                    del self._waiting_rates[gate]
        ready = self._ready
        while ready and self._running < self._max:
            self._try_start(ready.popleft(), now, None, started)
        return tuple(started)

    def _drain(self, gate: _Gate, now: float, started: list[Start]) -> bool:
        """Start the nodes waiting on `gate` while it has room; True once it has none to give."""
        queue = gate.queue
        if gate.rate:
            gate.refill(now)
        while queue:
            if self._running >= self._max:
                return False
            head = queue[0]
            if gate.tokens + _EPSILON < _demand(head, gate):
                return True
            queue.popleft()
            self._try_start(head, now, gate, started)
        return True

    def _try_start(self, entry: Entry, now: float, via: _Gate | None, started: list[Start]) -> None:
        """Start `entry`, or queue it on the first limit that holds it back.

        A node joins the back of a limit's line when others already wait there (first come,
        first served), except on `via`, the line it was just taken from.
        """
        for gate, amount in entry.demands:
            if gate.rate:
                gate.refill(now)
            if (gate.queue and gate is not via) or gate.tokens + _EPSILON < amount:
                gate.queue.append(entry)
                if gate.rate:
                    self._waiting_rates[gate] = None
                if entry.waited is None:
                    entry.waited = []
                entry.waited.append(gate.label)
                return
        for gate, amount in entry.demands:
            gate.tokens -= amount
        entry.issued += 1
        number = entry.first + entry.issued
        attempt = entry.current = f"{entry.id}#{number}"
        entry.state = NodeState.RUNNING
        self._running += 1
        waited = entry.waited
        entry.waited = None
        started.append(
            _new_start(Start, (entry.id, attempt, number, tuple(waited) if waited else ()))
        )

    def _release(self, entry: Entry) -> None:
        """Give back what a running node held and free its concurrency slot."""
        self._running -= 1
        self._give_back(entry)

    def _give_back(self, entry: Entry) -> None:
        """Give back the tokens a running node held (rate limits' come back with time)."""
        for gate, amount in entry.demands:
            if not gate.rate:
                gate.tokens += amount
                if gate.queue:
                    self._dirty[gate] = None

    # -- results ----------------------------------------------------------------------------

    def _claim(self, node: str, attempt: str) -> Entry | Update:
        """The entry if `attempt` is its running attempt, else the refusal to return."""
        entry = self._entries.get(node)
        if entry is None:
            raise InvalidArgument(f"unknown node {node!r}")
        if entry.state is NodeState.RUNNING and entry.current == attempt:
            return entry
        index = entry.index(attempt)
        if index is None:
            return _STALE
        return _DUPLICATE if index < entry.applied else _STALE

    def done(self, node: str, attempt: str) -> Update:
        """Apply the success of `attempt` of `node`: SUCCEEDED, its dependants' counts drop.

        Applied once: a repeat is DUPLICATE, another attempt's result STALE, both changing
        nothing. Raises `InvalidArgument` for an unknown node.
        """
        entry = self._entries.get(node)
        if entry is None or entry.state is not NodeState.RUNNING or entry.current != attempt:
            claimed = self._claim(node, attempt)  # refused (or misuse): it says how
            if isinstance(claimed, Update):
                return claimed
            entry = claimed  # pragma: no cover  (the check above let it through)
        entry.applied = entry.issued
        self._running -= 1
        if entry.demands:
            self._give_back(entry)
        entry.state = NodeState.SUCCEEDED
        self._finished += 1
        ready: list[str] = []
        entries = self._entries
        pending = NodeState.PENDING
        for dependant_id in entry.dependants:  # `_resolve`, inline: the commonest path
            dependant = entries[dependant_id]
            dependant.count -= 1
            if dependant.count == 0 and dependant.state is pending:
                dependant.state = NodeState.READY
                self._ready.append(dependant)
                ready.append(dependant_id)
        return (
            _new_update(Update, (_APPLIED_DELIVERY, tuple(ready), (), (), ()))
            if ready
            else _APPLIED
        )

    def failed(
        self, node: str, attempt: str, *, retry_at: float | None = None, timed_out: bool = False
    ) -> Update:
        """Apply the failure of `attempt` of `node`.

        With `retry_at` the node is READY again and starts (a new attempt) once `now >=
        retry_at`; the runner decides whether a failure is retried. Without, the node ends
        FAILED (TIMED_OUT if `timed_out`) and the failure policy runs. Applied once, like `done`.
        """
        if retry_at is not None and (
            not isinstance(retry_at, (int, float))
            or isinstance(retry_at, bool)
            or not math.isfinite(retry_at)
        ):
            raise InvalidArgument(f"retry_at must be a finite time or None, got {retry_at!r}")
        claimed = self._claim(node, attempt)
        if isinstance(claimed, Update):
            return claimed
        entry = claimed
        entry.applied = entry.issued
        self._release(entry)
        if retry_at is not None:
            entry.state = NodeState.READY
            self._seq += 1
            heapq.heappush(self._retries, (retry_at, self._seq, entry))
            return _APPLIED
        self._end(entry, NodeState.TIMED_OUT if timed_out else NodeState.FAILED)
        if self._on_failure == "cancel_all":
            return self._cancel_all(f"node {node!r} failed")
        ready: list[str] = []
        skipped: list[str] = []
        self._propagate(entry, ready, skipped)
        return Update(delivery=Delivery.APPLIED, ready=tuple(ready), skipped=tuple(skipped))

    def postpone(self, start: Start, retry_at: float, label: str) -> bool:
        """Take back `start`, which did not begin (a limit outside this scheduler, `label`,
        e.g. `"hold:order:7"`, held it back): the node is READY again, starts once `now >=
        retry_at` with the same attempt number, and its next `Start` names `label` (once) among the
        limits it waited for. False (nothing changed) if `start` is not the node's running
        attempt."""
        entry = self._entry(start.node)
        if entry.state is not NodeState.RUNNING or entry.current != start.attempt:
            return False
        entry.issued -= 1  # not issued after all: the next start takes the same number
        entry.current = f"{entry.id}#{entry.first + entry.issued}" if entry.issued else ""
        self._release(entry)
        entry.state = NodeState.READY
        entry.waited = [*start.waited] if label in start.waited else [*start.waited, label]
        self._seq += 1
        heapq.heappush(self._retries, (retry_at, self._seq, entry))
        return True

    def cancel(self, reason: str) -> Update:
        """Cancel the run: no more starts; every unfinished node becomes CANCELLED.

        Returns the nodes cancelled and the running attempts to stop (`interrupted`); their
        results will be STALE. A second call changes nothing and is DUPLICATE.
        """
        if not isinstance(reason, str):
            raise InvalidArgument(f"reason must be a string, got {reason!r}")
        if self._cancel_reason is not None:
            return _DUPLICATE
        return self._cancel_all(reason)

    def _cancel_all(self, reason: str) -> Update:
        self._cancel_reason = reason
        cancelled: list[str] = []
        interrupted: list[Start] = []
        for entry in self._entries.values():
            state = entry.state
            if state in _TERMINAL:
                continue
            if state is NodeState.RUNNING:
                self._release(entry)
                interrupted.append(
                    Start(
                        node=entry.id,
                        attempt=entry.current,
                        number=entry.first + entry.issued,
                    )
                )
            self._end(entry, NodeState.CANCELLED)
            cancelled.append(entry.id)
        self._ready.clear()
        self._retries.clear()
        self._dirty.clear()
        self._waiting_rates.clear()
        return Update(
            delivery=Delivery.APPLIED, cancelled=tuple(cancelled), interrupted=tuple(interrupted)
        )

    def _end(self, entry: Entry, state: NodeState) -> None:
        entry.state = state
        self._finished += 1

    def _resolve(self, entry: Entry, ready: list[str]) -> None:
        """One prerequisite of `entry` is resolved: count down, READY at zero."""
        entry.count -= 1
        if entry.count == 0 and entry.state is NodeState.PENDING:
            entry.state = NodeState.READY
            self._ready.append(entry)
            ready.append(entry.id)

    def _propagate(self, failed: Entry, ready: list[str], skipped: list[str]) -> None:
        """Skip what waits on `failed` (transitively); release what lists it as optional."""
        stack = [failed]
        while stack:
            source = stack.pop()
            for dependant_id in source.dependants:
                dependant = self._entries[dependant_id]
                if source.id in dependant.optional:
                    self._resolve(dependant, ready)
                elif dependant.state is NodeState.PENDING:  # not skipped through another one yet
                    self._end(dependant, NodeState.SKIPPED)
                    skipped.append(dependant.id)
                    stack.append(dependant)


def _demand(entry: Entry, gate: _Gate) -> float:
    for candidate, amount in entry.demands:
        if candidate is gate:
            return amount
    raise AssertionError(gate.label)  # pragma: no cover - a node waits only on its own limits


def _resource_gates(capacities: Mapping[str, int]) -> dict[str, _Gate]:
    gates: dict[str, _Gate] = {}
    for name, capacity in capacities.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"resource names must be non-empty strings, got {name!r}")
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise InvalidArgument(
                f"capacity of resource {name!r} must be an integer >= 0, got {capacity!r}"
            )
        gates[name] = _Gate(f"resource:{name}", capacity)
    return gates


def _rate_gates(rate_limits: Mapping[str, RateLimit]) -> dict[str, _Gate]:
    gates: dict[str, _Gate] = {}
    for tool, limit in rate_limits.items():
        if not isinstance(limit, RateLimit):
            raise InvalidArgument(f"rate limit of tool {tool!r} must be a RateLimit, got {limit!r}")
        gates[tool] = _Gate(f"rate:{tool}", limit.burst, limit.per_second)
    return gates


def _refuse_cycles(prerequisites: Mapping[str, frozenset[str]], entries: dict[str, Entry]) -> None:
    """Raise `InvalidArgument` naming a cycle's path if the prerequisites have one (Kahn)."""
    counts = {entry: entry.count for entry in entries.values()}  # keyed by identity: cheap
    queue = [entry for entry, count in counts.items() if count == 0]
    seen = 0
    while queue:
        seen += 1
        for dependant_id in queue.pop().dependants:
            dependant = entries[dependant_id]
            left = counts[dependant] - 1
            counts[dependant] = left
            if left == 0:
                queue.append(dependant)
    if seen == len(entries):
        return
    # Every node left has a prerequisite left: walk back through them until one repeats.
    stuck = {entry.id for entry, count in counts.items() if count > 0}
    node = min(stuck)
    path: list[str] = []
    where: dict[str, int] = {}
    while node not in where:
        where[node] = len(path)
        path.append(node)
        node = min(p for p in prerequisites[node] if p in stuck)
    cycle = [*path[where[node] :], node]
    cycle.reverse()  # prerequisite first, as the plan reads
    raise InvalidArgument(f"the prerequisites form a cycle: {' -> '.join(cycle)}")
