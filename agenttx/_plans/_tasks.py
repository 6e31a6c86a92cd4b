"""What the plan scheduler (`_scheduler`) takes and gives: node states, tasks, rate limits,
the `Start` and `Update` events, and its mutable per-node `Entry` with the gates (resources,
exclusive keys, rate buckets) an entry waits on. Pure and I/O-free, as the scheduler is.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from typing import TYPE_CHECKING, Final, NamedTuple, final

import attrs

from .._errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

__all__ = ["Delivery", "Entry", "NodeState", "RateLimit", "Start", "Task", "Update"]

#: Rate-limit tokens are floats; this slack keeps a token that is due "now" from being missed
#: by a rounding error (the caller would otherwise wake, find 0.9999999 tokens, and sleep again).
_EPSILON: Final = 1e-9


class NodeState(enum.Enum):
    """Where a node of a plan run is; SUCCEEDED, FAILED, TIMED_OUT, CANCELLED and SKIPPED are
    terminal (a node ends in exactly one)."""

    PENDING = "PENDING"  # some prerequisite is unresolved
    READY = "READY"  # prerequisites resolved; queued for a start (limits, or a retry's time)
    RUNNING = "RUNNING"  # an attempt was started and its result is awaited
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"
    SKIPPED = "SKIPPED"  # a (non-optional) prerequisite failed, timed out or was skipped
    # Not scheduler states: the runner shows these while a started node waits for a person
    # (it holds its attempt, RUNNING to the scheduler). See `PlanRun.node_states`.
    WAITING_APPROVAL = "WAITING_APPROVAL"  # its call waits for a person's approval
    NEEDS_REVIEW = "NEEDS_REVIEW"  # its outcome is unknown: a person says whether it happened

    @property
    def is_terminal(self) -> bool:
        """True for SUCCEEDED, FAILED, TIMED_OUT, CANCELLED and SKIPPED."""
        return self in _TERMINAL


_TERMINAL: Final = frozenset(
    {
        NodeState.SUCCEEDED,
        NodeState.FAILED,
        NodeState.TIMED_OUT,
        NodeState.CANCELLED,
        NodeState.SKIPPED,
    }
)
#: The ends of a prerequisite that release a dependant listing it in `Task.optional`.
_RELEASES_OPTIONAL: Final = frozenset({NodeState.FAILED, NodeState.TIMED_OUT, NodeState.SKIPPED})


class Delivery(enum.Enum):
    """What `done`, `failed` and `cancel` made of what they were given."""

    APPLIED = "APPLIED"  # the result (or cancellation) changed the run
    DUPLICATE = "DUPLICATE"  # this attempt's result was applied already (or the run was cancelled)
    STALE = "STALE"  # not the node's running attempt: superseded, cancelled or never issued


def _node_ids(value: Iterable[str]) -> frozenset[str]:
    if isinstance(value, str):
        raise InvalidArgument(f"expected a collection of node ids, got the string {value!r}")
    return frozenset(value)


def _check_ids(task_id: str, name: str, value: frozenset[str]) -> None:
    for item in value:
        if not isinstance(item, str) or not item:
            raise InvalidArgument(
                f"task {task_id!r}: {name} must hold non-empty node ids, got {item!r}"
            )


def _check_resources(task_id: str, value: Mapping[str, int]) -> None:
    for name, amount in value.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"task {task_id!r}: resource names must be non-empty strings")
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            raise InvalidArgument(
                f"task {task_id!r}: resource {name!r} must be held in an integer > 0 of"
                f" tokens, got {amount!r}"
            )


@final
@attrs.frozen(kw_only=True)
class Task:
    """What the scheduler knows of one node of a plan.

    `prerequisites` are the nodes whose success it waits for (value dependencies and business
    order alike; the set makes several edges to one node count once). `optional` is the subset
    whose failure, timeout or skip still releases it. `resources` maps a resource name to the
    tokens it holds while running (each name needs a capacity in `Scheduler(capacities=...)`);
    `exclusive` is a key (already resolved, e.g. `order:7`) that no two running nodes share;
    `tool` names the tool, for per-tool rate limits. `attempts` counts the attempts the node had
    before this scheduler (a resumed run's): its next attempt is numbered after them.

    Raises `InvalidArgument` naming the task and the field for a value of the wrong kind.
    """

    id: str
    prerequisites: frozenset[str] = frozenset()
    optional: frozenset[str] = frozenset()
    resources: Mapping[str, int] = attrs.field(factory=dict, hash=False)
    exclusive: str | None = None
    tool: str = ""
    attempts: int = 0

    def __attrs_post_init__(self) -> None:
        # One method rather than a validator a field: a plan of thousands of nodes builds one
        # task a node before it runs, and the checks are the same.
        set_ = object.__setattr__
        prerequisites = self.prerequisites
        if type(prerequisites) is not frozenset:
            prerequisites = _node_ids(prerequisites)
            set_(self, "prerequisites", prerequisites)
        optional = self.optional
        if type(optional) is not frozenset:
            optional = _node_ids(optional)
            set_(self, "optional", optional)
        resources = dict(self.resources)
        set_(self, "resources", resources)
        task_id = self.id
        if not isinstance(task_id, str) or not task_id:
            raise InvalidArgument(f"id must be a non-empty string, got {task_id!r}")
        _check_ids(task_id, "prerequisites", prerequisites)
        if optional:
            _check_ids(task_id, "optional", optional)
            extra = optional - prerequisites
            if extra:
                raise InvalidArgument(
                    f"task {task_id!r}: optional names {sorted(extra)!r}, which are not among"
                    f" its prerequisites"
                )
        if resources:
            _check_resources(task_id, resources)
        exclusive = self.exclusive
        if exclusive is not None and (not isinstance(exclusive, str) or not exclusive):
            raise InvalidArgument(
                f"task {task_id!r}: exclusive must be None or a non-empty key, got {exclusive!r}"
            )
        if not isinstance(self.tool, str):
            raise InvalidArgument(f"task {task_id!r}: tool must be a string, got {self.tool!r}")
        attempts = self.attempts
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 0:
            raise InvalidArgument(f"attempts must be an integer >= 0, got {attempts!r}")


def _entry(task: object) -> Entry:
    if isinstance(task, Entry):
        return task
    if not isinstance(task, Task):
        raise InvalidArgument(f"tasks must be Task records, got {task!r}")
    return Entry(
        task.id,
        task.prerequisites,
        task.optional,
        task.resources,
        task.exclusive,
        task.tool,
        task.attempts,
    )


def _check_rate(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidArgument(f"{attribute.name} must be a finite number > 0, got {value!r}")


def _check_burst(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidArgument(f"{attribute.name} must be an integer > 0, got {value!r}")


@final
@attrs.frozen(kw_only=True)
class RateLimit:
    """A token bucket for one tool: `per_second` starts on average, at most `burst` at once.

    The bucket starts full when the tool is first asked for; each start takes one token.
    """

    per_second: float = attrs.field(validator=_check_rate)
    burst: int = attrs.field(default=1, validator=_check_burst)


class Start(NamedTuple):
    """One start handed out by `Scheduler.get_ready`: run `node` as attempt `attempt`.

    `attempt` is unique within the scheduler (`"<node>#<number>"`); `number` counts the node's
    attempts from 1. `waited` names the limits that held the node back before this start
    (`"resource:<name>"`, `"exclusive:<key>"`, `"rate:<tool>"`), in the order it met them.
    (A named tuple, not an attrs record: one is made a node start, and a tuple of text the
    garbage collector stops tracking.)
    """

    node: str
    attempt: str
    number: int
    waited: tuple[str, ...] = ()


class Update(NamedTuple):
    """What one `done`, `failed` or `cancel` call changed.

    `ready`: nodes whose unresolved count reached zero (start them with `get_ready`).
    `skipped` / `cancelled`: nodes that became SKIPPED / CANCELLED, in the order they did.
    `interrupted`: the running attempts this call cancelled; stop them, their results are STALE.
    (A named tuple, as `Start`: one is made a completion.)
    """

    delivery: Delivery
    ready: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    cancelled: tuple[str, ...] = ()
    interrupted: tuple[Start, ...] = ()


_APPLIED: Final = Update(delivery=Delivery.APPLIED)
#: The named tuples made on the hot path, without their generated `__new__` (a Python call).
_new_start: Final = tuple.__new__
_new_update: Final = tuple.__new__
_APPLIED_DELIVERY: Final = Delivery.APPLIED
_DUPLICATE: Final = Update(delivery=Delivery.DUPLICATE)
_STALE: Final = Update(delivery=Delivery.STALE)


class _Gate:
    """A limit with a waiting line: a resource's tokens, an exclusive key, a tool's bucket."""

    __slots__ = ("capacity", "label", "last", "queue", "rate", "tokens")

    def __init__(self, label: str, capacity: float, rate: float = 0.0) -> None:
        self.label = label
        self.capacity = capacity
        self.tokens = capacity
        self.rate = rate  # > 0 for a rate limit: tokens come back with time, not on release
        self.last: float | None = None  # the `now` of the last refill (rate limits)
        self.queue: deque[Entry] = deque()

    def refill(self, now: float) -> None:
        """Add the tokens earned since the last refill (rate limits only; `now` never rewinds)."""
        if self.last is None:
            self.last = now
        elif now > self.last:
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
            self.last = now

    def due(self) -> float:
        """When the next whole token is earned (rate limits only)."""
        assert self.last is not None
        return self.last + max(0.0, 1.0 - self.tokens) / self.rate


class Entry:
    """The scheduler's mutable record of one node, made from a `Task` (or given by the
    runner: its per-node record is an `Entry` subclass, so that a node costs one object, not
    two). Only the scheduler changes these fields; a subclass adds its own slots."""

    __slots__ = (
        "applied",
        "count",
        "current",
        "demands",
        "dependants",
        "exclusive",
        "first",
        "id",
        "issued",
        "optional",
        "prerequisites",
        "resources",
        "state",
        "tool",
        "waited",
    )

    def __init__(  # noqa: PLR0917  (a `Task`'s fields, once a node)
        self,
        node: str,
        prerequisites: frozenset[str],
        optional: frozenset[str],
        resources: Mapping[str, int],
        exclusive: str | None,
        tool: str,
        attempts: int,
    ) -> None:
        """The fields of `Task` (checked already: see `Task`)."""
        self.id = node
        self.optional = optional
        self.resources = resources
        self.exclusive = exclusive
        self.tool = tool
        self.state = NodeState.PENDING
        self.count = len(prerequisites)
        self.prerequisites = prerequisites  # the distinct nodes it waits for
        # The ids of the nodes that wait for this one: a list while the scheduler is built,
        # then a tuple of text (which the garbage collector stops tracking).
        self.dependants: Sequence[str] = []
        # Attempt ids are `<id>#<number>`, numbered from `first + 1`: a count and the last id
        # say which were issued (no list of ids a node).
        self.issued = 0  # how many attempts were issued
        self.current = ""  # the id of the last one issued
        self.first = attempts  # attempts numbered before these (a resumed run's)
        self.applied = 0  # how many of them had their result applied
        self.demands: tuple[tuple[_Gate, float], ...] = ()
        self.waited: list[str] | None = None

    def index(self, attempt: object) -> int | None:
        """Where `attempt` is among the attempts issued (0 for the first), or None."""
        if not isinstance(attempt, str):
            return None
        prefix, sep, digits = attempt.rpartition("#")
        if not sep or prefix != self.id or not (digits.isascii() and digits.isdigit()):
            return None
        number = int(digits)
        index = number - self.first - 1
        if str(number) != digits or not 0 <= index < self.issued:
            return None
        return index
