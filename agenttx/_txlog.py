"""A transaction's durable log: what a `DurableStore` keeps so it can be resumed or aborted.

`TxLog` writes, for one transaction: its descriptive record, with the transaction's row at
`begin`; each undo record as soon as a tool registers it (before the effect it undoes); each
successful step with its staged effects; and the progress (next step, controller counters,
constraints) after every rewind; and, in the write that ends it (commit, abort, or the end
that keeps failed undos for recovery), its history (`history_text`: the final status, every
step attempt with what became of it, the constraints, the compensation failures and the
audit events), which a store that keeps ended transactions keeps with them. Everything is
JSON text. `read_image` turns what `DurableStore.load` returns back into Python objects for
`Engine.recover`, and `read_history` the history of an ended one for `agenttx inspect`.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Final, NamedTuple, cast, final

import attrs

from ._errors import InvalidArgument, StorageError
from ._events import Event, from_compact
from ._json import JSONValue, canonical_dumps, compact_encoder
from ._refs import Dependency
from ._results import AttemptStatus, StepAttempt
from ._rollback import ControllerState, RollbackPolicy
from ._tools import StagedEffect, UndoRecord
from .stores import DurableStore, EffectRow, Store, UndoRow, is_durable, leases_owners

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from ._graph import DependencyGraph
    from ._limits import Isolation
    from ._settings import Settings
    from .stores import TxImage

__all__ = [
    "FORMAT",
    "Ended",
    "LiveStep",
    "Progress",
    "Restored",
    "TxLog",
    "add_live_steps",
    "end_keeping_undos",
    "history_text",
    "read_history",
    "read_image",
    "recovered_history",
]

#: The version of the record formats below, stored in each transaction record.
FORMAT: Final = 1

#: A step record is `[tool, arguments, output, raw_context, [[from, source key, target key]]]`,
#: followed by the step's call id when it has one (a record without it has none): compact
#: JSON, not canonical (a step's values were checked when it ran, and key order does not
#: matter to the reader), which makes it about twice as fast to write.
_encode_step: Final = compact_encoder(sort_keys=False)

#: An undo record and a staged effect's payload are kept as they were given, keys in their
#: order (a compensation or a dispatcher gets the payload recovery reads back as the tool gave
#: it); logs written before sorted them, and read back as sorted.
_encode_payload: Final = compact_encoder(sort_keys=False)


class LiveStep(NamedTuple):
    """A live step (succeeded, not rewound), as the transaction keeps it."""

    tool_name: str
    arguments: JSONValue
    output: JSONValue
    raw_context: str
    dependencies: tuple[Dependency, ...]
    call_id: str | None = None  # the provider's id of the call, when the caller gave one


class Progress(NamedTuple):
    """Where a transaction stands between steps, beyond its live steps.

    `rewinding` is set while a rewind is under way: written before its first compensation
    runs, so that recovery finishes it (compensates what is left and truncates) instead of
    bringing back steps whose undos have run. It is `(target, None)` for a rewind that
    `target` runs after, and `(0, status)` for an abort that ends the transaction as `status`.
    `transient` lists the constraints added by transient failures, as `(step, text)`: they
    are dropped when that step succeeds (`_constraints`). `keys` is the idempotency-key
    generation (`Timeline.generation`); a log written before it existed reads `rewinds`.
    """

    next_step: int
    controller: ControllerState
    constraints: tuple[str, ...]
    rewinds: int
    rewinding: tuple[int, str | None] | None = None
    transient: tuple[tuple[int, str], ...] = ()
    keys: int = 0


class Restored(NamedTuple):
    """A transaction read back from its durable log."""

    tx_id: str
    agent_id: str
    settings: dict[str, JSONValue]  # isolation, step_timeout, max_constraints, ...
    policy: RollbackPolicy
    steps: dict[int, LiveStep]
    progress: Progress
    undos: tuple[UndoRecord, ...]  # in registration order
    effects: tuple[StagedEffect, ...]  # in staging order
    owner: str | None
    record: dict[str, JSONValue]  # the record as written, to rewrite it
    ended: str | None  # the final status, if it ended with undo records left to retry
    snapshots: tuple[int, ...]  # the steps the store can restore


class Ended(NamedTuple):
    """How a transaction ended, as its history (`history_text`) says."""

    status: str  # a `TxStatus` value: COMMITTED, ROLLED_BACK or FAILED
    attempts: tuple[StepAttempt, ...]  # every step executed, oldest first
    constraints: tuple[str, ...]
    compensation_failures: tuple[str, ...]
    audit: tuple[Event, ...] = ()  # its audit events, when the history kept them


@final
class TxLog:
    """Writes one transaction's durable records; see the module docstring.

    Calls follow the transaction's own serialization; `undo` may come from the worker thread
    running a tool, while the transaction waits for it.
    """

    __slots__ = ("_lease", "_progress", "_record", "_store", "_tx_id")

    def __init__(
        self,
        store: DurableStore,
        tx_id: str,
        *,
        record: dict[str, JSONValue] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self._store = store
        self._tx_id = tx_id
        #: A store whose transactions another worker may take over while this one runs (its
        #: leases expired) checks the lease before each tool: `PostgresStore.check_lease`.
        self._lease: Callable[[str], object] | None = (
            store.check_lease if leases_owners(store) else None
        )
        self._progress = _FRESH if progress is None else _progress_text(progress)
        self._record: dict[str, JSONValue] = record or {}

    @classmethod
    def begin(
        cls,
        store: DurableStore,
        tx_id: str,
        *,
        isolation: Isolation,
        agent_id: str,
        policy: RollbackPolicy,
        settings: dict[str, JSONValue],
    ) -> TxLog:
        """Begin the transaction in `store` with its record (who runs it and with which
        settings), in one durable write, and return its log."""
        record: dict[str, JSONValue] = {
            "format": FORMAT,
            "agent_id": agent_id,
            "policy": attrs.asdict(policy),
            "settings": settings,
            "created_at": time.time(),
        }
        store.begin(tx_id, isolation=isolation, record=canonical_dumps(record))
        return cls(store, tx_id, record=record)

    @classmethod
    def open(cls, store: Store, tx_id: str, *, agent_id: str, settings: Settings) -> TxLog | None:
        """Begin the transaction in `store`: with its durable log on a `DurableStore` (returned),
        else with nothing to log (None)."""
        if not is_durable(store):
            store.begin(tx_id, isolation=settings.isolation)  # checks the id; snapshot 0
            return None
        return cls.begin(
            store,
            tx_id,
            isolation=settings.isolation,
            agent_id=agent_id,
            policy=settings.policy,
            settings=settings.to_record(),
        )

    def commit(self, history: str) -> None:
        """Commit the transaction in the store, with its `history` (`history_text`)."""
        self._store.commit(self._tx_id, history=history)

    def end(self, status: str, history: str, *, keep_undos: bool) -> None:
        """End the transaction as `status` with its `history` (`history_text`): discard it,
        or, `keep_undos`, keep the undo records that failed (see `end_keeping_undos`)."""
        if keep_undos:
            end_keeping_undos(self._store, self._tx_id, self._record, status, history)
        else:
            self._store.discard(self._tx_id, history=history)

    def check_lease(self) -> None:
        """Before a tool runs: `StorageError` ("lease lost") unless the store still holds the
        transaction, so that a worker that lost it runs no tool. One fenced statement on a
        store with leases (`PostgresStore.check_lease`); nothing to check on the others (on
        `SQLiteStore` recovery takes over only a transaction whose process has died)."""
        if self._lease is not None:
            self._lease(self._tx_id)

    def undo(self, record: UndoRecord) -> None:
        """Write an undo record, durably, before the effect it undoes happens."""
        text = _encode_payload(
            {"kind": record.kind, "payload": record.payload, "description": record.description}
        )
        self._store.record_undo(
            self._tx_id, UndoRow(step_id=record.step_id, seq=record.seq, record=text)
        )

    def forget(self, record: UndoRecord) -> None:
        """Delete an undo record whose compensation succeeded."""
        self._store.forget_undo(self._tx_id, record.step_id, record.seq)

    def step(
        self,
        step_id: int,
        step: LiveStep,
        effects: Sequence[StagedEffect],
        progress: Progress | None = None,
    ) -> None:
        """Write a successful step with its staged effects and, in the same write, the
        progress: `progress` if given (a transient constraint dropped), else unchanged."""
        fields: list[JSONValue] = [
            step.tool_name,
            step.arguments,
            step.output,
            step.raw_context,
            [[d.from_step, d.source_key, d.target_key] for d in step.dependencies],
        ]
        if step.call_id is not None:
            fields.append(step.call_id)
        text = _encode_step(fields)
        rows = [
            EffectRow(
                step_id=e.step_id,
                channel=e.channel,
                payload=_encode_payload(e.payload),
                idempotency_key=e.idempotency_key,
            )
            for e in effects
        ]
        progress_text = self._progress if progress is None else _progress_text(progress)
        self._store.record_step(self._tx_id, step_id, text, rows, progress_text)
        self._progress = progress_text

    def progress(self, progress: Progress) -> None:
        """Write the progress after a rewind."""
        self._progress = _progress_text(progress)
        self._store.record_progress(self._tx_id, self._progress)


def end_keeping_undos(
    store: DurableStore,
    tx_id: str,
    record: dict[str, JSONValue],
    status: str,
    history: str | None = None,
) -> None:
    """Mark the transaction's record as ended with `status`, then discard all but its undos
    (and its `history`, kept for when recovery ends it; `None` keeps the one kept before).

    The record says it ended, so a later recovery compensates those records but never
    resumes the transaction.
    """
    store.record_transaction(tx_id, canonical_dumps({**record, "ended": status}))
    store.discard_state(tx_id, history=history)


#: Attempts are `[step, tool, status]` in the history, then the call id when the attempt had
#: one: a transaction's history is written in the write that ends it, so it is kept small and
#: cheap to build.
_encode_history: Final = compact_encoder(sort_keys=False)
COMPENSATED: Final = AttemptStatus.COMPENSATED
REWOUND: Final = AttemptStatus.REWOUND


def history_text(
    status: str,
    attempts: list[JSONValue],
    constraints: Iterable[str],
    compensation_failures: Iterable[str],
    audit: Mapping[str, Any] | None = None,
) -> str:
    """The history of a transaction that ends as `status` (JSON text; see `read_history`);
    `attempts` are `[step_id, tool_name, status value]` (and the call id, if any), oldest
    first; `audit` its audit events (`EventSink.compact`), if any."""
    return _encode_history(
        {
            "format": FORMAT,
            "status": status,
            "attempts": attempts,
            "constraints": list(constraints),
            "compensation_failures": list(compensation_failures),
            "audit": None if audit is None else dict(audit),
        }
    )


def recovered_history(
    restored: Restored,
    status: str,
    failures: Sequence[str],
    audit: Mapping[str, Any] | None = None,
) -> str:
    """The history of a transaction that recovery aborts: its live steps were undone (those
    with undo records compensated), and `failures` are the compensations that failed; `audit`
    the events of what recovery did."""
    undone = {undo.step_id for undo in restored.undos}
    attempts: list[JSONValue] = []
    for step_id, step in sorted(restored.steps.items()):
        row: list[JSONValue] = [
            step_id,
            step.tool_name,
            (COMPENSATED if step_id in undone else REWOUND).value,
        ]
        if step.call_id is not None:
            row.append(step.call_id)
        attempts.append(row)
    return history_text(status, attempts, restored.progress.constraints, failures, audit)


def read_history(text: str | None) -> Ended | None:
    """Decode `history_text`'s text (`None` for no history); `StorageError` if malformed."""
    if text is None:
        return None
    try:
        document = json.loads(text)
        if document is None:
            return None
        attempts = tuple(_attempt(*row) for row in document["attempts"])
        ended = Ended(
            status=document["status"],
            attempts=attempts,
            constraints=tuple(document["constraints"]),
            compensation_failures=tuple(document["compensation_failures"]),
            audit=_audit(document.get("audit")),
        )
    except (ValueError, KeyError, TypeError, InvalidArgument) as exc:
        raise StorageError(f"unreadable history: {exc}") from exc
    texts = (ended.status, *ended.constraints, *ended.compensation_failures)
    if not all(isinstance(t, str) for t in texts) or not all(
        isinstance(a.step_id, int)
        and isinstance(a.tool_name, str)
        and (a.call_id is None or isinstance(a.call_id, str))
        for a in attempts
    ):
        raise StorageError("unreadable history: a field has the wrong type")
    return ended


def _audit(document: object) -> tuple[Event, ...]:
    """The audit events a history holds (none in a history written before it kept them)."""
    if document is None:
        return ()
    if isinstance(document, list):  # `Event.to_json` objects, as an earlier build wrote them
        return tuple(Event.from_json(entry) for entry in document)
    if not isinstance(document, dict):
        raise TypeError("the audit is not an object")
    return from_compact("transaction", document)


def _attempt(step_id: int, tool_name: str, status: str, call_id: str | None = None) -> StepAttempt:
    """One attempt of a history row (histories written before call ids have three fields)."""
    return StepAttempt(
        step_id=step_id, tool_name=tool_name, status=AttemptStatus(status), call_id=call_id
    )


def _call_id(rest: list[Any], step_id: int) -> str | None:
    """The call id after a step record's five fields (none in records written before them)."""
    call_id = rest[0] if len(rest) == 1 else None
    if len(rest) > 1 or not (call_id is None or isinstance(call_id, str)):
        raise TypeError(f"malformed step record {step_id}")
    return call_id


def _marks(document: JSONValue) -> tuple[tuple[int, str], ...]:
    """The transient constraint marks of a progress record (none before they existed)."""
    marks = tuple((mark[0], mark[1]) for mark in cast("list[list[Any]]", document))
    if not all(isinstance(step, int) and isinstance(text, str) for step, text in marks):
        raise TypeError(f"malformed transient constraints: {document!r}")
    return marks


def _progress_text(progress: Progress) -> str:
    document: dict[str, JSONValue] = {
        "next_step": progress.next_step,
        "controller": progress.controller.to_json(),
        "constraints": list(progress.constraints),
        "rewinds": progress.rewinds,
    }
    if progress.keys != progress.rewinds:
        document["keys"] = progress.keys
    if progress.rewinding is not None:
        document["rewinding"] = list(progress.rewinding)
    if progress.transient:
        document["transient"] = [list(mark) for mark in progress.transient]
    return canonical_dumps(document)


#: The progress of a transaction that has not run a step yet.
_FRESH: Final = _progress_text(Progress(1, ControllerState(), (), 0))


def _rewinding(document: JSONValue) -> tuple[int, str | None] | None:
    if document is None:
        return None
    target, final = cast("list[Any]", document)
    if not isinstance(target, int) or not (final is None or isinstance(final, str)):
        raise TypeError(f"malformed rewind in progress: {document!r}")
    return target, final


def add_live_steps(graph: DependencyGraph, steps: Mapping[int, LiveStep], first: int) -> None:
    """Add the live steps from `first` on (consecutive ids) to `graph`, with their outputs."""
    step_id = first
    while (step := steps.get(step_id)) is not None:
        graph.add_step(step_id, step.tool_name, step.arguments, step.dependencies, validate=False)
        graph.record_output(step_id, step.output, validate=False)
        step_id += 1


def read_image(image: TxImage) -> Restored:
    """Decode a transaction's durable log; raise `StorageError` if it is malformed.

    The next step is the later of the recorded progress and the last live step + 1: a step
    that succeeded after the last rewind is recorded with the progress unchanged.
    """
    try:
        record = json.loads(image.record)
        progress = json.loads(image.progress) if image.progress is not None else None
        steps: dict[int, LiveStep] = {}
        for step_id, text in image.steps:
            tool_name, arguments, output, raw_context, dependencies, *rest = json.loads(text)
            call_id = _call_id(rest, step_id)
            steps[step_id] = LiveStep(
                tool_name=tool_name,
                arguments=arguments,
                output=output,
                raw_context=raw_context,
                dependencies=tuple(
                    Dependency(from_step=f, source_key=s, target_key=t) for f, s, t in dependencies
                ),
                call_id=call_id,
            )
        undos = []
        for row in image.undos:
            undo = json.loads(row.record)
            undos.append(
                UndoRecord(
                    step_id=row.step_id,
                    seq=row.seq,
                    kind=undo["kind"],
                    payload=undo["payload"],
                    description=undo["description"],
                )
            )
        effects = tuple(
            StagedEffect(
                tx_id=image.tx_id,
                step_id=row.step_id,
                channel=row.channel,
                payload=json.loads(row.payload),
                idempotency_key=row.idempotency_key,
            )
            for row in image.effects
        )
        controller = ControllerState.from_json(progress["controller"]) if progress else None
        last = max(steps, default=0)
        restored_progress = Progress(
            next_step=max(progress["next_step"] if progress else 1, last + 1),
            controller=controller or ControllerState(),
            constraints=tuple(progress["constraints"]) if progress else (),
            rewinds=progress["rewinds"] if progress else 0,
            rewinding=_rewinding(progress.get("rewinding")) if progress else None,
            transient=_marks(progress.get("transient", [])) if progress else (),
            keys=progress.get("keys", progress["rewinds"]) if progress else 0,
        )
        return Restored(
            tx_id=image.tx_id,
            agent_id=record["agent_id"],
            settings=record["settings"],
            policy=RollbackPolicy(**record["policy"]),
            steps=steps,
            progress=restored_progress,
            undos=tuple(undos),
            effects=effects,
            owner=image.owner,
            record=record,
            ended=record.get("ended"),
            snapshots=image.snapshots,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"transaction `{image.tx_id}`: unreadable durable log: {exc}") from exc
