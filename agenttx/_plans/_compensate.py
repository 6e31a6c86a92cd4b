"""Compensation of a failed or cancelled plan run's completed work, through a Saga ledger.

`compensate_nodes` runs the undos the nodes recorded (their tools' and nodes' `compensate=`,
and what they registered with `ctx.register_undo`), newest first, and reports each one as a
`CompensationOutcome`; each step is also recorded in the run's audit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._saga import SagaLedger
from ._results import CompensationOutcome, CompensationStatus, PlanEventKind

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from .._tools import Compensation, UndoRecord

__all__ = ["compensate_nodes"]


async def compensate_nodes(
    undos: Iterable[tuple[float, str, UndoRecord]],
    stranded: Iterable[tuple[str, UndoRecord]],
    compensations: Mapping[str, Compensation[Any, Any]],
    *,
    run: bool,
    record: Callable[..., None],
    on_compensated: Callable[[UndoRecord], object] | None = None,
) -> tuple[CompensationOutcome, ...]:
    """Run `undos` (`(recorded at, node id, record)`), newest first, through a Saga ledger.

    With `run` False nothing runs and each is reported REQUESTED. `stranded` undos belong to
    calls that may still be running (a sync tool interrupted or timed out on its worker): they
    are never run, since undoing before the effect lands would undo nothing, and each is
    reported FAILED, kept for manual intervention. `record(kind, node=..., data=...)` appends
    each step to the run's audit. A compensation's failure never stops the others.
    `on_compensated(undo)` is called after each compensation that succeeded (the durable log
    forgets its record).
    """
    entries = sorted(
        undos,
        key=lambda entry: (entry[0], entry[2].seq),
        reverse=True,
    )
    owners = {id(undo): node_id for _, node_id, undo in entries}
    records = [undo for _, _, undo in entries]
    for undo in records:
        record(
            PlanEventKind.COMPENSATION_REQUESTED,
            node=owners[id(undo)],
            data={"kind": undo.kind, "description": undo.description},
        )
    failed: dict[int, str] = {}
    if run and records:
        ledger = SagaLedger(on_compensated=on_compensated)
        try:
            await ledger.acompensate(records, compensations)
        finally:
            failed = {id(undo): error for undo, error in ledger.failed}
    outcomes: list[CompensationOutcome] = []
    for undo in records:
        error = failed.get(id(undo))
        if not run:
            status, error = CompensationStatus.REQUESTED, "not run: compensate_on='never'"
        elif error is not None:
            status = CompensationStatus.FAILED
        else:
            status = CompensationStatus.COMPLETED
        outcomes.append(
            CompensationOutcome(
                node_id=owners[id(undo)],
                kind=undo.kind,
                description=undo.description,
                status=status,
                error=error,
            )
        )
        if status is not CompensationStatus.REQUESTED:
            record(
                PlanEventKind.COMPENSATED if error is None else PlanEventKind.COMPENSATION_FAILED,
                node=owners[id(undo)],
                data={"kind": undo.kind, **({"error": error} if error else {})},
            )
    for node_id, undo in stranded:
        reason = (
            "not run: its tool was still running on a worker thread when the node ended; "
            "undo it by hand once the call has finished"
        )
        outcomes.append(
            CompensationOutcome(
                node_id=node_id,
                kind=undo.kind,
                description=undo.description,
                status=CompensationStatus.FAILED,
                error=reason,
            )
        )
        record(
            PlanEventKind.COMPENSATION_FAILED,
            node=node_id,
            data={"kind": undo.kind, "error": reason},
        )
    return tuple(outcomes)
