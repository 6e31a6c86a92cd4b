"""Ending a durable plan run that cannot be resumed: a tool its plan uses is not registered.

A run left `RUNNING` by a dead process is resumed by recovery with the tools registered then.
If one of its plan's tools is missing, it cannot run again (`PlanToolMissing`), but it can
always end: `abort_run` compensates the undo records its completed nodes left in the run's
state transaction, newest first, through the compensations registered by kind (they are
registered apart from the tools), cancels its unfinished nodes and ends the run CANCELLED,
with the audit of what it did. An undo record whose compensation fails, or whose kind is not
registered either, is kept in the store and reported; the next recovery tries it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._errors import PlanToolMissing, StorageError, TransactionNotFound
from .._events import EventKind, EventSink
from .._saga import SagaLedger
from .._txlog import end_keeping_undos, history_text, read_image
from ..stores import is_plan_store
from ._journal import PlanJournal, read_run
from ._model import Plan

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .._events import HookLike
    from .._json import JSONValue
    from .._tools import ToolRegistry, UndoRecord
    from ..stores import DurableStore, PlanImage

__all__ = ["abort_run", "missing_tool", "plan_of"]

#: Node states a run's end leaves as they are.
_ENDED = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED"})


def plan_of(image: PlanImage) -> Plan:
    """The plan of a stored run; `StorageError` if its record (its plan, initial values and
    settings) cannot be read."""
    record, _ = read_run(image)
    problem = "its settings or initial values are missing"
    if isinstance(record.get("settings"), dict) and "initial" in record:
        try:
            return Plan.from_json(record["plan"])
        except (KeyError, TypeError, ValueError) as exc:
            problem = str(exc)
    raise StorageError(f"plan run `{image.run_id}`: unreadable durable record: {problem}")


def missing_tool(plan: Plan, registry: ToolRegistry, run_id: str) -> PlanToolMissing | None:
    """The error naming the first tool of `plan` that `registry` lacks, or None."""
    for node in plan.nodes:
        if registry.get(node.tool) is None:
            return PlanToolMissing(run_id=run_id, tool=node.tool)
    return None


def abort_run(
    store: DurableStore,
    image: PlanImage,
    registry: ToolRegistry,
    *,
    reason: str,
    actor: str,
    hooks: Iterable[HookLike] | None = None,
) -> tuple[int, list[str]]:
    """End run `image` (claimed by the caller) CANCELLED, compensating what its nodes did;
    how many compensations ran, and a line per one that failed (kept for the next recovery).
    """
    run_id = image.run_id
    _, nodes = read_run(image)
    plan = plan_of(image)
    stored = len(store.plan_audit(run_id)) if is_plan_store(store) else 0
    sink = EventSink("plan", run_id, hooks, start_seq=stored)
    sink.record(EventKind.CANCEL_REQUESTED, actor=actor, data={"reason": reason})
    ran, failures = _compensate(store, run_id, plan, registry, sink, actor)
    journal = PlanJournal.resumed(store, run_id, nodes)
    open_nodes = [node_id for node_id, node in nodes.items() if node.state not in _ENDED]
    for node_id in open_nodes:
        sink.record(EventKind.CANCELLED, node=node_id, actor=actor, data={"reason": reason})
    journal.transitions((node_id, "CANCELLED", 0) for node_id in open_nodes)
    sink.record(EventKind.FINISHED, actor=actor, data={"status": "CANCELLED"})
    journal.flush("CANCELLED", sink.take_unpersisted_rows())
    sink.deliver()
    return ran, [f"plan run {run_id}: {line}" for line in failures]


def _compensate(  # noqa: PLR0917  (one run's parts)
    store: DurableStore,
    run_id: str,
    plan: Plan,
    registry: ToolRegistry,
    sink: EventSink,
    actor: str,
) -> tuple[int, list[str]]:
    """Compensate the undo records of the run's state transaction (id: the run id), then end
    it: discarded, or keeping the records whose compensation failed."""
    try:
        image = store.claim(run_id, store.owner(run_id))
    except TransactionNotFound:
        return 0, []  # never begun, or ended before the crash: nothing to undo
    if image is None:
        raise StorageError(f"the state transaction of plan run `{run_id}` is held by a live store")
    if image.record == "null":  # died between begin and its record: nothing durable
        store.discard(run_id)
        return 0, []
    restored = read_image(image)
    nodes = plan.nodes
    ran = 0

    def node_of(undo: UndoRecord) -> str | None:
        return nodes[undo.step_id - 1].id if 1 <= undo.step_id <= len(nodes) else None

    def forget(undo: UndoRecord) -> None:
        nonlocal ran
        ran += 1
        store.forget_undo(run_id, undo.step_id, undo.seq)

    def outcome(undo: UndoRecord, error: str | None) -> None:
        data: dict[str, JSONValue] = {"kind": undo.kind, "description": undo.description}
        if error is not None:
            data["error"] = error
        kind = EventKind.COMPENSATED if error is None else EventKind.COMPENSATION_FAILED
        sink.record(kind, node=node_of(undo), actor=actor, data=data)

    records = sorted(restored.undos, key=lambda undo: (undo.step_id, undo.seq), reverse=True)
    for undo in records:
        data: dict[str, Any] = {"kind": undo.kind, "description": undo.description}
        sink.record(EventKind.COMPENSATION_REQUESTED, node=node_of(undo), actor=actor, data=data)
    ledger = SagaLedger(on_compensated=forget, on_outcome=outcome)
    report = ledger.compensate(records, registry.compensations)
    failures = list(report.failures)
    if failures:  # the record and the failed undos stay, for the next recovery
        history = history_text("CANCELLED", [], (), failures)
        end_keeping_undos(store, run_id, restored.record, "CANCELLED", history)
    else:
        store.discard(run_id)
    return ran, failures
