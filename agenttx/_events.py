"""Audit events: the frozen `Event` record, its `EventKind`, the `EventHook` protocol, the sink.

Every decision a transaction or a plan run makes is one append-only `Event`, numbered per
scope (`seq` 0, 1, 2, ... within one transaction or one plan run). The same objects are kept
for `tx.audit()` / `PlanResult.audit`, written with the durable log on a durable store, and
delivered to hooks.

`EventSink` is the private recorder each transaction and plan run owns. It is cheap when nobody
listens: `emit` keeps a tuple and the wall-clock time, and `Event` objects are built when read
(or when a hook is registered). Hooks are called outside every lock of the sink, one event at
a time and in `seq` order; a hook that raises is reported (the `agenttx` logger and a
`RuntimeWarning`) and never breaks the caller.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol, Union, cast, final, runtime_checkable

import attrs

from ._errors import InvalidArgument

if TYPE_CHECKING:
    from ._json import JSONValue

__all__ = [
    "DeferredData",
    "Event",
    "EventHook",
    "EventKind",
    "EventSink",
    "HookLike",
    "RecordedEvents",
    "Scope",
    "audit_jsonl",
    "deferred_data",
    "from_compact",
    "hook_callables",
]

_log = logging.getLogger("agenttx")

Scope = Literal["transaction", "plan"]
_SCOPES = ("transaction", "plan")


class EventKind(enum.Enum):
    """What an audit event records (values are snake_case strings, stable in exports)."""

    # transaction steps
    STEP_DISPATCHED = "step_dispatched"
    STEP_COMPLETED = "step_completed"
    STEP_FAILED = "step_failed"
    STEP_REWOUND = "step_rewound"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    COMMITTED = "committed"
    ABORTED = "aborted"
    EFFECT_DELIVERED = "effect_delivered"
    # approvals and review
    APPROVAL_REQUESTED = "approval_requested"
    APPROVED = "approved"
    REJECTED = "rejected"
    APPROVAL_CONSUMED = "approval_consumed"
    APPROVAL_EXPIRED = "approval_expired"
    OUTCOME_UNKNOWN = "outcome_unknown"
    REVIEW_REQUESTED = "review_requested"
    REVIEWED = "reviewed"
    # plan runs (COMMITTED, COMPENSATED and COMPENSATION_FAILED above are shared)
    VALIDATED = "validated"
    DISPATCHED = "dispatched"
    RETRIED = "retried"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"
    LATE_RESULT_REFUSED = "late_result_refused"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLED = "cancelled"
    DISCARDED = "discarded"
    EFFECTS_DISPATCHED = "effects_dispatched"
    COMPENSATION_REQUESTED = "compensation_requested"
    FINISHED = "finished"


def _frozen_data(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


def _check_scope(_instance: object, _attribute: object, value: object) -> None:
    if value not in _SCOPES:
        raise InvalidArgument(f"event scope must be 'transaction' or 'plan', got {value!r:.80}")


@final
@attrs.frozen(kw_only=True)
class Event:
    """One audit entry: what happened (`kind`), when (`at`, UTC), where, who, and details.

    `scope` is "transaction" or "plan" and `scope_id` the transaction or plan run id; `seq`
    numbers the events of one scope from 0 without gaps, in the order they were recorded.
    `step` (a transaction's step id) or `node` (a plan node id) and `attempt` (an attempt id)
    join the event to what it concerns; `actor` names the person or process that decided, where
    there is one. `data` holds JSON values only (a hint, a reason, a status, a count).
    """

    kind: EventKind = attrs.field(validator=attrs.validators.instance_of(EventKind))
    at: dt.datetime
    scope: Scope = attrs.field(validator=_check_scope)
    scope_id: str
    seq: int
    step: int | None = None
    node: str | None = None
    attempt: str | None = None
    actor: str | None = None
    data: Mapping[str, JSONValue] = attrs.field(factory=dict, converter=_frozen_data)

    def to_json(self) -> dict[str, JSONValue]:
        """The event as a JSON object.

        Keys: `scope`, `scope_id`, `seq`, `kind` (its value), `at` (ISO 8601 with the UTC offset),
        `zone` (the zone's name), then `step`, `node`, `attempt`, `actor` when set, and `data`
        (always, possibly empty). `Event.from_json` reads it back.
        """
        entry: dict[str, JSONValue] = {
            "scope": self.scope,
            "scope_id": self.scope_id,
            "seq": self.seq,
            "kind": self.kind.value,
            "at": self.at.isoformat(),
            "zone": self.at.tzname(),
        }
        if self.step is not None:
            entry["step"] = self.step
        if self.node is not None:
            entry["node"] = self.node
        if self.attempt is not None:
            entry["attempt"] = self.attempt
        if self.actor is not None:
            entry["actor"] = self.actor
        entry["data"] = dict(self.data)
        return entry

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> Event:
        """The event `to_json` produced; `InvalidArgument` if `entry` is not one."""
        try:
            at = dt.datetime.fromisoformat(entry["at"])
            if at.tzinfo is None:
                at = at.replace(tzinfo=dt.timezone.utc)  # written by agenttx: always UTC
            return cls(
                kind=EventKind(entry["kind"]),
                at=at.astimezone(dt.timezone.utc),
                scope=entry["scope"],
                scope_id=str(entry["scope_id"]),
                seq=int(entry["seq"]),
                step=entry.get("step"),
                node=entry.get("node"),
                attempt=entry.get("attempt"),
                actor=entry.get("actor"),
                data=entry.get("data") or {},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"not an audit event: {exc}") from None


def from_compact(scope: Scope, document: Mapping[str, Any]) -> tuple[Event, ...]:
    """The events `EventSink.compact` wrote; `InvalidArgument` if `document` is not that."""
    try:
        return tuple(_compact_events(scope, document))
    except (KeyError, TypeError, ValueError, OverflowError, OSError) as exc:
        raise InvalidArgument(f"not a compact audit trail: {exc}") from None


def _compact_events(scope: Scope, document: Mapping[str, Any]) -> Iterable[Event]:
    scope_id = document["scope_id"]
    first = document["first"]
    if not isinstance(scope_id, str) or isinstance(first, bool) or not isinstance(first, int):
        raise TypeError("scope_id or first has the wrong type")
    for offset, row in enumerate(document["events"]):
        kind, at, step, node, attempt, actor, data = [*row, *(None,) * 7][:7]
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            raise TypeError(f"a time is {type(at).__name__}")
        yield Event(
            kind=EventKind(kind),
            at=dt.datetime.fromtimestamp(at, dt.timezone.utc),
            scope=scope,
            scope_id=scope_id,
            seq=first + offset,
            step=step,
            node=node,
            attempt=attempt,
            actor=actor,
            data=data or {},
        )


def audit_jsonl(events: Iterable[Event]) -> str:
    """The events as JSON lines: one `Event.to_json` object per line, each ending with a newline.

    Lines keep the order given; non-ASCII text is written as is (UTF-8).
    """
    return "".join(
        json.dumps(event.to_json(), ensure_ascii=False, separators=(",", ":")) + "\n"
        for event in events
    )


@runtime_checkable
class EventHook(Protocol):
    """Something that wants every audit event as it is recorded.

    `on_event` is called once per event, in `seq` order within one transaction or plan run,
    from the thread that recorded it (or from another thread of the same transaction or run
    that is delivering at that moment), never while agenttx holds one of its locks. It must not
    block for long: the step waits for it. It may read the transaction (`tx.audit()`,
    `tx.view()`), but must not drive it (no `execute_step`, `rollback`, `commit`). An exception
    it raises is logged on the `agenttx` logger and warned about (`RuntimeWarning`), and never
    changes the step's outcome.
    """

    def on_event(self, event: Event) -> None:
        """Receive one event."""


HookLike = Union[EventHook, Callable[[Event], object]]  # noqa: UP007 - a runtime alias on 3.10


def hook_callables(hooks: Iterable[HookLike] | None) -> tuple[Callable[[Event], object], ...]:
    """The functions to call for `hooks`: `EventHook`s' `on_event`, or plain callables.

    Raises `InvalidArgument` naming the offender if an item is neither, or if `hooks` is a
    string or not iterable.
    """
    if hooks is None:
        return ()
    given: object = hooks
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise InvalidArgument(
            f"hooks must be an iterable of EventHook objects or callables, got {hooks!r:.80}"
        )
    found: list[Callable[[Event], object]] = []
    for hook in hooks:
        on_event = getattr(hook, "on_event", None)
        if callable(on_event):
            found.append(on_event)
        elif callable(hook):
            found.append(hook)
        else:
            raise InvalidArgument(f"hook {hook!r:.80} has no on_event method and is not callable")
    return tuple(found)


#: Event data given as `(name, *args)`, `name` from `deferred_data`: the builder registered
#: under it gives the mapping from `args` when the event is built, written or delivered (each
#: time: it must give equal mappings). A run of thousands of nodes then keeps one flat tuple
#: of scalars an event until its audit is read, not nested containers.
DeferredData = tuple[Any, ...]

_BUILDERS: dict[str, Callable[..., Mapping[str, Any]]] = {}


def deferred_data(name: str, build: Callable[..., Mapping[str, Any]]) -> str:
    """Register `build` (at import) as the builder of `(name, *args)` data; return `name`."""
    _BUILDERS[name] = build
    return name


def _data(data: Mapping[str, Any] | DeferredData | None) -> Mapping[str, Any] | None:
    """The mapping of recorded data (built from deferred data)."""
    if type(data) is tuple:
        return _BUILDERS[data[0]](*data[1:])
    return cast("Mapping[str, Any] | None", data)


# A recorded event before it is materialised: (kind's value, unix time, step, node, attempt,
# actor, data); its seq is its place in the list. Appending this tuple is what a step pays when
# nobody listens. It holds no object the garbage collector tracks when its data holds only
# scalars (or is deferred with scalar arguments): the collector then stops tracking it, and a
# run of thousands of events adds nothing to every later collection.
_Raw = tuple[str, float, int | None, str | None, str | None, str | None, Any]
_KINDS: dict[str, EventKind] = {kind.value: kind for kind in EventKind}

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_now = time.time
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _materialise(scope: Scope, scope_id: str, seq: int, raw: _Raw) -> Event:
    kind, at, step, node, attempt, actor, data = raw
    data = _data(data)
    return Event(
        kind=_KINDS[kind],
        at=dt.datetime.fromtimestamp(at, dt.timezone.utc),
        scope=scope,
        scope_id=scope_id,
        seq=seq,
        step=step,
        node=node,
        attempt=attempt,
        actor=actor,
        data=data if data is not None else _EMPTY,
    )


@final
class RecordedEvents:
    """The events a sink had recorded at one moment (`EventSink.recorded`), built into `Event`s
    when first called for, then kept (a plan result whose audit is never read never pays for
    its thousands of `Event` objects).

    Calling it returns the same tuple each time; `len()` counts the events without building
    them. Thread-safe: two first calls at once may both build, and return equal tuples.
    """

    __slots__ = ("_built", "_count", "_raw", "_scope", "_scope_id", "_start")

    def __init__(self, scope: Scope, scope_id: str, start: int, raw: list[_Raw]) -> None:
        self._scope: Scope = scope
        self._scope_id = scope_id
        self._start = start
        self._raw: list[_Raw] | None = raw
        self._count = len(raw)
        self._built: tuple[Event, ...] | None = None

    def __call__(self) -> tuple[Event, ...]:
        built = self._built
        if built is None:
            raw = self._raw or []
            scope, scope_id, seq = self._scope, self._scope_id, self._start
            built = tuple(
                _materialise(scope, scope_id, seq + offset, item) for offset, item in enumerate(raw)
            )
            self._built = built
            self._raw = None  # the tuples recorded can go: the events hold what they held
        return built

    def __len__(self) -> int:
        return self._count


class EventSink:
    """Numbers, keeps and delivers the events of one transaction or plan run.

    Thread-safe: an event's `seq` is its place in the order events were recorded, whichever
    thread recorded them (appending to a list is atomic). `emit` never raises because of a
    hook. The sink takes `data` over: the caller must not change the mapping afterwards (the
    `Event` built from it holds a read-only copy). Events are kept in memory for the life of
    the owner; `take_unpersisted()` hands the ones not yet written to a durable store (in
    `seq` order, each once) so that the owner writes them with its next durable write.
    """

    __slots__ = (
        "_delivered",
        "_delivering",
        "_hooks",
        "_lock",
        "_persisted",
        "_raw",
        "_start",
        "scope",
        "scope_id",
    )

    def __init__(
        self,
        scope: Scope,
        scope_id: str,
        hooks: Iterable[HookLike] | None = None,
        *,
        start_seq: int = 0,
    ) -> None:
        self.scope: Scope = scope
        self.scope_id = scope_id
        self._hooks = hook_callables(hooks)
        self._lock = threading.Lock()
        self._raw: list[_Raw] = []
        self._delivered = 0
        self._delivering = False
        self._persisted = 0
        self._start = start_seq

    @property
    def has_hooks(self) -> bool:
        """True if a hook listens."""
        return bool(self._hooks)

    def add_hooks(self, hooks: Iterable[HookLike] | None) -> None:
        """Also deliver future events to `hooks` (validated as in the constructor)."""
        more = hook_callables(hooks)
        with self._lock:
            self._hooks = self._hooks + more

    def emit(
        self,
        kind: EventKind,
        *,
        step: int | None = None,
        node: str | None = None,
        attempt: str | None = None,
        actor: str | None = None,
        data: Mapping[str, JSONValue] | None = None,
        at: float | None = None,
    ) -> None:
        """Record one event (numbered next) and deliver it to the hooks, outside the lock.

        `data` holds JSON values (the sink takes it over); `at` is the event's time in seconds
        since the epoch (default: now). Safe to call while the caller holds its own lock only
        if no hook listens; otherwise call `emit` outside it, or `record` under it and
        `deliver` after releasing it.
        """
        self._raw.append(  # `_value_`: the enum property's value, without its call
            (kind._value_, time.time() if at is None else at, step, node, attempt, actor, data)
        )
        if self._hooks:
            self.deliver()

    def step(self, kind: EventKind, step: int, data: Mapping[str, JSONValue] | None) -> None:
        """`emit(kind, step=step, data=data)`, with less call overhead (once or twice a step)."""
        self._raw.append((kind._value_, _now(), step, None, None, None, data))  # no enum property
        if self._hooks:
            self.deliver()

    def record(
        self,
        kind: EventKind,
        *,
        step: int | None = None,
        node: str | None = None,
        attempt: str | None = None,
        actor: str | None = None,
        data: Mapping[str, JSONValue] | DeferredData | None = None,
        at: float | None = None,
    ) -> None:
        """Record one event without delivering it (the owner calls `deliver` later); `data`
        may be `DeferredData`."""
        self._raw.append(
            # `_value_`: what `.value` reads, without the enum property's call (twice a node)
            (kind._value_, time.time() if at is None else at, step, node, attempt, actor, data)
        )

    def deliver(self) -> None:
        """Call the hooks for every recorded event not yet delivered, in order.

        One thread delivers at a time; a call made while another thread (or a hook, re-entering)
        is delivering returns at once, and that delivery picks the new events up.
        """
        if not self._hooks:
            return
        with self._lock:
            if self._delivering:
                return
            self._delivering = True
        try:
            while True:
                with self._lock:
                    first = self._delivered
                    batch = self._raw[first:]
                    self._delivered = first + len(batch)
                    hooks = self._hooks
                    if not batch:
                        self._delivering = False
                        return
                seq = self._start + first
                for offset, raw in enumerate(batch):
                    event = _materialise(self.scope, self.scope_id, seq + offset, raw)
                    for hook in hooks:
                        _call(hook, event)
        except BaseException:
            with self._lock:
                self._delivering = False
            raise

    def _events(self, first: int, raw: list[_Raw]) -> tuple[Event, ...]:
        seq = self._start + first
        return tuple(
            _materialise(self.scope, self.scope_id, seq + offset, item)
            for offset, item in enumerate(raw)
        )

    def events(self) -> tuple[Event, ...]:
        """Every event recorded so far, in `seq` order."""
        return self._events(0, self._raw[:])

    def recorded(self) -> RecordedEvents:
        """`events()`, built when first called for (see `RecordedEvents`)."""
        return RecordedEvents(self.scope, self.scope_id, self._start, self._raw[:])

    def upcoming(
        self,
        items: Iterable[
            tuple[
                EventKind,
                float,
                str | None,
                str | None,
                Mapping[str, JSONValue] | DeferredData | None,
            ]
        ],
    ) -> tuple[Event, ...]:
        """The events that recording `items` (`(kind, at, node, attempt, data)`, in order)
        next would give, without recording them (for a write that must hold them)."""
        raw: list[_Raw] = [
            (kind.value, at, None, node, attempt, None, data)
            for kind, at, node, attempt, data in items
        ]
        return self._events(len(self._raw), raw)

    def __len__(self) -> int:
        return len(self._raw)

    def take_unpersisted(self) -> tuple[Event, ...]:
        """The events not yet handed out by this method, in order; each is handed out once."""
        with self._lock:
            first = self._persisted
            raw = self._raw[first:]
            self._persisted = first + len(raw)
        return self._events(first, raw)

    def take_unpersisted_rows(self) -> list[tuple[int, str]]:
        """`take_unpersisted`, as `(seq, JSON text)` rows for a store: the text is what
        `Event.to_json` gives, written compactly (cheaper than building the `Event`s)."""
        with self._lock:
            first = self._persisted
            raw = self._raw[first:]
            self._persisted = first + len(raw)
        seq = self._start + first
        return [
            (seq + offset, _dumps(self._entry(seq + offset, item)))
            for offset, item in enumerate(raw)
        ]

    def compact(
        self, then: Iterable[tuple[EventKind, float, Mapping[str, JSONValue] | None]] = ()
    ) -> dict[str, Any]:
        """Every event so far, then the events `then` (`(kind, at, data)`) would give if
        recorded next, in the compact form a transaction's history keeps (`from_compact`
        reads it back): `{"scope_id", "first", "events": [[kind, at, step, node, attempt,
        actor, data], ...]}`, each list cut after its last non-null item (an event with its
        data in place is the tuple recorded, which JSON writes as the same list: the history
        is written once, as JSON, so no row is copied)."""
        rows: list[Sequence[Any]] = []
        raw: list[_Raw] = [
            *self._raw[:],
            *((kind.value, at, None, None, None, None, data) for kind, at, data in then),
        ]
        for event in raw:
            data = event[6]
            if data is not None and type(data) is not tuple:  # most: the row as recorded
                rows.append(event)  # JSON writes a tuple as a list
                continue
            kind, at, step, node, attempt, actor, _ = event
            row: list[Any] = [kind, at, step, node, attempt, actor, _data(data)]
            while row[-1] is None:
                row.pop()
            rows.append(row)
        return {"scope_id": self.scope_id, "first": self._start, "events": rows}

    def _entry(self, seq: int, raw: _Raw) -> dict[str, Any]:
        kind, at, step, node, attempt, actor, data = raw
        data = _data(data)
        entry: dict[str, Any] = {
            "scope": self.scope,
            "scope_id": self.scope_id,
            "seq": seq,
            "kind": kind,
            "at": dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat(),
            "zone": "UTC",
        }
        if step is not None:
            entry["step"] = step
        if node is not None:
            entry["node"] = node
        if attempt is not None:
            entry["attempt"] = attempt
        if actor is not None:
            entry["actor"] = actor
        entry["data"] = {} if data is None else dict(data)
        return entry

    def return_unpersisted(self, count: int) -> None:
        """Hand the last `count` events taken back (their durable write failed)."""
        with self._lock:
            self._persisted = max(0, self._persisted - count)


def _call(hook: Callable[[Event], object], event: Event) -> None:
    try:
        hook(event)
    except Exception as exc:  # noqa: BLE001 - a hook never breaks a step; reported below
        message = (
            f"agenttx: event hook {hook!r:.80} raised {type(exc).__name__} on "
            f"{event.kind.value} of {event.scope} {event.scope_id} (seq {event.seq}): {exc}"
        )
        try:
            _log.error(message, exc_info=exc)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        except Exception:  # noqa: BLE001, S110 - warnings set to "error" must not break a step
            pass
