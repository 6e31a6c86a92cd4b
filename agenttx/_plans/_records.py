"""What a plan run keeps while it runs: its node records (each also the node's scheduler
entry), their attempts, the inbox through which attempts hand their outcomes to the run's loop,
the store wrapper that serializes the nodes' state calls, and the flat records of the run's
timings, audit data and settings (see `_execution`)."""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import threading
from typing import TYPE_CHECKING, Final, NamedTuple, cast, final

from .._events import deferred_data
from .._tools import UndoRecord, derive_key
from ._metrics import AttemptTiming, NodeTiming
from ._results import PlanEventKind
from ._scheduler import Entry

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Mapping, Sequence
    from decimal import Decimal

    from .._events import DeferredData
    from .._hints import CleanHint
    from .._json import JSONValue
    from .._limits import Isolation
    from .._step import Settled
    from .._tools import Outcome, ToolContext
    from ..stores import DurableStore, EffectRow, Store, UndoRow
    from ._journal import StoredNode
    from ._model import Node
    from ._scheduler import RateLimit, Start

__all__ = [
    "COMPLETED",
    "DISPATCHED",
    "SEQ_BITS",
    "Attempt",
    "Crashed",
    "Finished",
    "HeldEvent",
    "Inbox",
    "NodeRecord",
    "SerializedStore",
    "attempts_made",
    "generation_of",
    "node_timing",
    "node_undo",
    "node_units",
    "retried_count",
    "settings_record",
    "wall_time",
]

#: Undo records of attempt n of a node are numbered from `n << SEQ_BITS`: never shared.
SEQ_BITS: Final = 20


@final
class SerializedStore:
    """The run's store, with one transaction's calls serialized: tools on several threads
    share one overlay, and the `Store` protocol asks the owner to serialize them."""

    __slots__ = ("_lock", "_store")

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()

    def get(self, tx_id: str, key: str) -> str | None:
        with self._lock:
            return self._store.get(tx_id, key)

    def put(self, tx_id: str, key: str, value: str) -> None:
        with self._lock:
            self._store.put(tx_id, key, value)

    def delete(self, tx_id: str, key: str) -> None:
        with self._lock:
            self._store.delete(tx_id, key)

    # The durable log's calls (`TxLog`), on a durable store only.

    def begin(self, tx_id: str, *, isolation: Isolation, record: str) -> None:
        with self._lock:
            cast("DurableStore", self._store).begin(tx_id, isolation=isolation, record=record)

    def record_undo(self, tx_id: str, undo: UndoRow) -> None:
        with self._lock:
            cast("DurableStore", self._store).record_undo(tx_id, undo)

    def forget_undo(self, tx_id: str, step_id: int, seq: int) -> None:
        with self._lock:
            cast("DurableStore", self._store).forget_undo(tx_id, step_id, seq)

    def record_step(
        self, tx_id: str, step_id: int, step: str, effects: Sequence[EffectRow], progress: str
    ) -> None:
        with self._lock:
            cast("DurableStore", self._store).record_step(tx_id, step_id, step, effects, progress)

    def flush(self, tx_id: str) -> None:
        with self._lock:
            cast("DurableStore", self._store).flush(tx_id)

    def record_transaction(self, tx_id: str, record: str) -> None:
        with self._lock:
            cast("DurableStore", self._store).record_transaction(tx_id, record)

    def discard_state(self, tx_id: str, *, history: str | None = None) -> None:
        with self._lock:
            cast("DurableStore", self._store).discard_state(tx_id, history=history)


# ---------------------------------------------------------------------- one run


class Attempt:
    """One attempt's bookkeeping (mutable until it ends). A plain slotted class: one is made
    a node start."""

    __slots__ = (
        "arguments",
        "context",
        "eligible_at",
        "ended_costs",
        "finished_at",
        "id",
        "node",
        "number",
        "previous",
        "started_at",
        "task",
    )

    def __init__(
        self, start: Start, eligible_at: float, started_at: float, context: ToolContext | None
    ) -> None:
        # The start's fields, not the `Start`: a named tuple stays tracked by the garbage
        # collector, and a run of thousands of nodes would keep one more such object a node.
        self.node = start.node
        self.id = start.attempt  # the attempt id, `<node>#<number>`
        self.number = start.number
        self.eligible_at = eligible_at
        self.started_at = started_at
        self.context = context  # None once the attempt has ended (see `release`)
        self.arguments: JSONValue = None
        self.finished_at: float | None = None
        self.task: asyncio.Task[None] | None = None
        self.ended_costs: tuple[tuple[str, Decimal], ...] = ()
        self.previous: Attempt | None = None  # the node's attempt before this one

    @property
    def costs(self) -> tuple[tuple[str, Decimal], ...]:
        """What the attempt reported (so far, if it still runs)."""
        return self.ended_costs if self.context is None else self.context.costs

    def release(self) -> None:
        """Keep what the ended attempt reported and let its (closed) context go: a run of
        thousands of nodes keeps no contexts alive."""
        if self.context is not None:
            self.ended_costs = self.context.costs
            self.context = None


class NodeRecord(Entry):
    """What the run keeps per node: the scheduler's entry of the node (this class extends it:
    one object a node, not two; only the scheduler changes its fields), what each start reads
    of the plan (found once, on construction), and what happened. No tool: a kept result
    reads the records, and keeps no tool alive."""

    __slots__ = (
        "_derive",
        "_key",
        "eligible_at",
        "error",
        "finished_at",
        "finished_wall",
        "last",
        "node",
        "output",
        "retried",
        "started_wall",
        "step_id",
        "tried",
        "undos",
        "units",
    )

    def __init__(  # noqa: PLR0917  (once a node, from `PlanExecution._records`)
        self,
        index: int,
        node: Node,
        derive: Callable[..., str],
        prerequisites: frozenset[str],
        optional: frozenset[str],
        hold: str | None,
        units: tuple[tuple[str, int, int], ...],
        attempts: int,
        retried: int,
    ) -> None:
        # The scheduler's part: `optional` (the prerequisites whose failure still releases
        # it), `exclusive` (its exclusive resource, resolved: held across runs when durable).
        super().__init__(
            node.id, prerequisites, optional, node.resources, hold, node.tool, attempts
        )
        self.step_id = index + 1  # its step id in the state transaction (plan order, from 1)
        self.node = node
        self._derive = derive  # the run's idempotency keys: derived when first read
        self._key: str | None = None
        self.units = units  # its units of resource capacities, `(resource, units, capacity)`
        self.retried = retried  # attempts that failed and were retried before a crash
        # The attempts as a chain from the last (no list a node: most nodes have one attempt).
        self.last: Attempt | None = None
        self.tried = 0  # how many attempts were made
        self.eligible_at: float | None = None
        self.output: JSONValue = None
        self.error: CleanHint | None = None
        # A tuple: most nodes register none, and the shared empty tuple costs no object a node.
        self.undos: tuple[tuple[float, UndoRecord], ...] = ()
        self.finished_at: float | None = None  # when it ended, by `time.monotonic()`
        self.finished_wall: dt.datetime | None = None  # of a node restored from the record
        self.started_wall: dt.datetime | None = None  # of a node restored from the record

    @property
    def key(self) -> str:
        """Every attempt's idempotency key (derived once, when first read: an inline tool
        without a context never reads it during the run)."""
        key = self._key
        if key is None:
            key = self._key = self._derive(self.id, self.tool)
        return key

    def regenerate(self, generation: int) -> None:
        """Derive the node's key again, for `generation` (an earlier call of the node was
        compensated: the next one must not be taken for it)."""
        self._key = self._derive(self.id, self.tool, generation) if generation else None

    @property
    def attempts(self) -> list[Attempt]:
        """The node's attempts, oldest first."""
        found: list[Attempt] = []
        attempt = self.last
        while attempt is not None:
            found.append(attempt)
            attempt = attempt.previous
        found.reverse()
        return found

    def add(self, attempt: Attempt) -> None:
        """Count `attempt` as the node's latest."""
        attempt.previous = self.last
        self.last = attempt
        self.tried += 1


#: An event held until the transition it reports is durable: kind, node, attempt, data.
HeldEvent = tuple[
    PlanEventKind, "str | None", "str | None", "Mapping[str, JSONValue] | DeferredData | None"
]


class Finished(NamedTuple):
    attempt: Attempt
    outcome: Outcome
    #: A guarded attempt's end, as the step core settled it (`_step.finish` once recorded).
    settled: Settled | None = None


class Crashed(NamedTuple):
    attempt: Attempt
    error: BaseException


@final
class Inbox:
    """Where a run's attempts post their results, and other threads wake the run's loop.

    One future per wait, resolved by the first post: a result reaches the loop one turn after
    its tool returned (an `asyncio.Queue` read under `wait_for` costs a task and more turns).
    """

    __slots__ = ("_loop", "_messages", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._messages: collections.deque[Finished | Crashed] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def post(self, message: Finished | Crashed | None) -> None:
        """Keep `message` (None only wakes the loop); from the loop's thread."""
        if message is not None:
            self._messages.append(message)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def wake(self) -> None:
        """Wake the loop from any thread (a cancellation was requested)."""
        with contextlib.suppress(RuntimeError):  # a closed loop: the run has ended
            self._loop.call_soon_threadsafe(self.post, None)

    async def wait(self, timeout: float | None) -> None:
        """Return once a message or a wake-up is posted, or after `timeout` seconds."""
        if self._messages:
            return
        waiter = self._waiter = self._loop.create_future()
        timer = None if timeout is None else self._loop.call_later(timeout, self.post, None)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def take(self) -> Finished | Crashed | None:
        """The oldest message not taken, or None."""
        return self._messages.popleft() if self._messages else None


def node_timing(
    node_id: str, record: NodeRecord, prerequisites: frozenset[str], finished: float
) -> NodeTiming:
    """A node's timing for the metrics; an attempt still running at the end ends `finished`."""
    attempts: tuple[AttemptTiming, ...] = ()
    attempt = record.last
    while attempt is not None:  # newest first: each is put before the later ones
        started = attempt.started_at
        ended = attempt.finished_at
        attempts = (
            AttemptTiming(
                min(attempt.eligible_at, started),
                started,
                max(started, ended if ended is not None else finished),
                attempt.costs,
            ),
            *attempts,
        )
        attempt = attempt.previous
    return NodeTiming(node_id, record.tool, prerequisites, attempts, record.eligible_at)


def _dispatched_data(  # noqa: PLR0917  (deferred event data: called with a flat tuple)
    number: int,
    tool: str,
    run_id: str,
    plan_version: str,
    node: str,
    prerequisites: tuple[str, ...],
    valid: bool,
    running: int,
    max_concurrency: int,
    waited: tuple[str, ...],
    timeout: float,
    generation: int = 0,
) -> dict[str, JSONValue]:
    """The data of a `dispatched` event: the attempt and the checks made before it started.

    Recorded as `DeferredData` (`(DISPATCHED, *these arguments)`, scalars and tuples of
    text): the nested mapping is built only when the event is read, written or delivered."""
    return {
        "number": number,
        "tool": tool,
        "idempotency_key": (
            derive_key(run_id, plan_version, node, tool, generation)
            if generation
            else derive_key(run_id, plan_version, node, tool)
        ),
        "checks": {
            "prerequisites": list(prerequisites),
            "inputs": "valid" if valid else "refused",
            "running": running,
            "max_concurrency": max_concurrency,
            "waited_for": list(waited),
            "cancelled": False,
            "timeout_s": timeout,
        },
    }


def _completed_data(number: int, effects_staged: int) -> dict[str, JSONValue]:
    """The data of a `completed` event (recorded as `DeferredData`, as `_dispatched_data`'s)."""
    return {"number": number, "effects_staged": effects_staged}


DISPATCHED: Final = deferred_data("plan.dispatched", _dispatched_data)
COMPLETED: Final = deferred_data("plan.completed", _completed_data)


def node_units(node: Node, capacities: Mapping[str, int]) -> tuple[tuple[str, int, int], ...]:
    """The node's units of resource capacities, `(resource, units, capacity)`, by name."""
    return tuple(
        (name, units, capacities[name])
        for name, units in sorted(node.resources.items())
        if units > 0 and name in capacities
    )


def settings_record(
    max_concurrency: int,
    on_failure: str,
    compensate_on: str,
    capacities: dict[str, int],
    limits: dict[str, RateLimit],
) -> dict[str, JSONValue]:
    """A run's settings as its durable record keeps them, for `resume_plan`."""
    return {
        "max_concurrency": max_concurrency,
        "on_failure": on_failure,
        "compensate_on": compensate_on,
        "resources": cast("JSONValue", capacities),
        "rate_limits": {tool: [limit.per_second, limit.burst] for tool, limit in limits.items()},
    }


def wall_time(at: object) -> dt.datetime | None:
    """A stored time (seconds since the epoch) as a UTC datetime."""
    if isinstance(at, (int, float)) and not isinstance(at, bool):
        return dt.datetime.fromtimestamp(at, dt.timezone.utc)
    return None


def node_undo(
    attempt: Attempt, kind: str, step_id: int, offset: int, outcome: Outcome
) -> UndoRecord:
    """The undo a node's `compensate=` declares: called with its arguments and output."""
    return UndoRecord(
        step_id=step_id,
        seq=(attempt.number << SEQ_BITS) + offset,
        kind=kind,
        payload={"arguments": attempt.arguments, "output": outcome.output},
        description=f"{kind} for node {attempt.node}",
    )


def attempts_made(restored: Mapping[str, StoredNode] | None, node_id: str) -> int:
    """How many attempts a resumed run's node had before the crash (its recorded number)."""
    stored = None if restored is None else restored.get(node_id)
    number = None if stored is None else stored.record.get("number")
    return number if isinstance(number, int) and not isinstance(number, bool) and number > 0 else 0


def generation_of(restored: Mapping[str, StoredNode] | None, node_id: str) -> int:
    """How many times a resumed run's node had its key changed before the crash."""
    stored = None if restored is None else restored.get(node_id)
    generation = None if stored is None else stored.record.get("generation")
    if isinstance(generation, int) and not isinstance(generation, bool) and generation > 0:
        return generation
    return 0


def retried_count(restored: Mapping[str, StoredNode] | None, node_id: str) -> int:
    """How many of a resumed run's node's attempts failed and were retried before the crash."""
    stored = None if restored is None else restored.get(node_id)
    retries = None if stored is None else stored.record.get("retries")
    return (
        retries if isinstance(retries, int) and not isinstance(retries, bool) and retries > 0 else 0
    )
