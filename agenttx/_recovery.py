"""Crash recovery: take over the transactions a dead process left open in a durable store.

`recover` reads each open transaction's durable log and either aborts it (presumed abort:
compensate its undo records newest first, then discard its state), or resumes it (rebuild the
`Transaction`, finishing a rewind that was under way or rewinding the step that was running
when the process died; see docs/protocol.md#crash-recovery). A compensation that fails, or
whose kind is not registered, stays in the store and is reported; the next recovery tries it
again.

Several recoverers may run at once, in threads or processes, on one file. Each transaction is
taken with `DurableStore.claim`, a compare-and-set on its owner: the one recoverer whose claim
succeeds recovers it, the others skip it, so no compensation is run by two of them. (One that
ran and then lost its process before the store forgot it runs again at the next recovery:
compensations run at least once, and exactly once unless a recoverer dies.) Whatever goes
wrong with one transaction (a log that cannot be read, a store error on a full disk, a takeover
by another process half-way) is a line in the report's `failures`, and the others go on.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Literal

import attrs

from ._approvals import (
    ENDED_WHILE_RUNNING,
    approval_of,
    check_outcome,
    cut_off,
    decision_of,
    request_of,
)
from ._errors import AgentTxError, InvalidArgument, TransactionNotFound
from ._events import EventKind, EventSink
from ._plans import abort_run, is_plan_store, missing_tool, plan_of, resume_plan
from ._results import RecoveryReport, TxStatus
from ._saga import SagaLedger
from ._settings import Settings
from ._tools import to_json_value
from ._transaction import Transaction
from ._txlog import end_keeping_undos, read_image, recovered_history
from .stores import is_durable, leases_owners, owner_alive

if TYPE_CHECKING:
    from collections.abc import Container, Iterable

    from ._events import HookLike
    from ._json import JSONValue
    from ._plans import PlanRun
    from ._saga import Dispatcher
    from ._tools import OutputSerializer, ToolRegistry, UndoRecord
    from ._txlog import Restored
    from .stores import DurableStore, Store

__all__ = ["cancel_stranded_plan", "owner_alive", "recover", "recover_plans"]


@attrs.define
class _Tally:
    """What one recovery has done so far, across its transactions."""

    taken: int = 0
    run: int = 0
    failures: list[str] = attrs.Factory(list)
    resumed: list[Transaction] = attrs.Factory(list)
    skipped: list[str] = attrs.Factory(list)


#: The actor named by the events of what recovery does.
RECOVERY_ACTOR = "agenttx.recovery"


def recover(
    store: DurableStore,
    registry: ToolRegistry,
    *,
    mode: Literal["abort", "resume"],
    dispatcher: Dispatcher | None,
    live: Container[str],
    output_serializer: OutputSerializer = to_json_value,
    hooks: Iterable[HookLike] | None = None,
) -> tuple[RecoveryReport, list[Transaction]]:
    """Recover every open transaction of `store` not in `live` and not owned by a live process.

    The state transactions of RUNNING plan runs are left to `recover_plans`, which resumes
    them with their runs. Returns the report and, in resume mode, the rebuilt transactions
    (an interrupted abort is finished, so that one has ended; the report's `resumed` lists
    only those still active). A transaction another recoverer claims first, or whose owner is
    alive, is in `skipped`; one that ended meanwhile is left out. Raises only for a bad
    `mode`, or a failure to list the open transactions. Resumed transactions convert outputs
    with `output_serializer`.
    """
    if mode not in ("abort", "resume"):
        raise InvalidArgument(f"mode must be 'abort' or 'resume', got {mode!r}")
    tally = _Tally()
    # A running plan run's state transaction (its id is the run's) is resumed with the run.
    plans = {run_id for run_id, _ in store.running_plans()} if is_plan_store(store) else set()
    for tx_id in store.open_transactions():
        if tx_id in live or tx_id in plans:
            continue
        try:
            _recover_one(
                store,
                tx_id,
                registry,
                mode=mode,
                dispatcher=dispatcher,
                tally=tally,
                output_serializer=output_serializer,
                hooks=hooks,
            )
        except AgentTxError as exc:
            tally.failures.append(f"{tx_id}: {exc}")
    return (
        RecoveryReport(
            transactions=tally.taken,
            compensations_run=tally.run,
            failures=tuple(tally.failures),
            resumed=tuple(tx.id for tx in tally.resumed if tx.status is TxStatus.ACTIVE),
            skipped=tuple(tally.skipped),
        ),
        tally.resumed,
    )


def _recover_one(
    store: DurableStore,
    tx_id: str,
    registry: ToolRegistry,
    *,
    mode: Literal["abort", "resume"],
    dispatcher: Dispatcher | None,
    tally: _Tally,
    output_serializer: OutputSerializer,
    hooks: Iterable[HookLike] | None = None,
) -> None:
    """Claim and recover one transaction, adding to `tally`; `AgentTxError` escapes for the
    caller to report (what was done before it is counted)."""
    try:
        owner = store.owner(tx_id)
        if _alive(store, owner):
            tally.skipped.append(tx_id)
            return
        image = store.claim(tx_id, owner)
    except TransactionNotFound:
        return  # it ended since it was listed (another recoverer finished it): nothing to do
    if image is None:  # another recoverer (or a live store of this process) holds it
        tally.skipped.append(tx_id)
        return
    if image.record == "null":  # died between begin and its record: nothing durable
        tally.taken += 1
        store.discard(tx_id)
        return
    restored = read_image(image)
    tally.taken += 1
    if mode == "resume" and restored.ended is None:
        tx, report = Transaction._resume(  # noqa: SLF001  (recovery builds transactions)
            restored,
            registry=registry,
            store=store,
            dispatcher=dispatcher,
            output_serializer=output_serializer,
            hooks=hooks,
        )
        tally.run += report.succeeded
        tally.failures.extend(f"{tx_id}: {line}" for line in report.failures)
        tally.resumed.append(tx)  # an interrupted abort was finished: it has ended
        if tx.status is TxStatus.ACTIVE:
            _review_cut_off(tx, registry, Settings.from_record(restored.settings, restored.policy))
        return
    _abort(store, tx_id, restored, registry, tally, events=EventSink("transaction", tx_id, hooks))


def _review_cut_off(tx: Transaction, registry: ToolRegistry, settings: Settings) -> None:
    """Open now the review the resumed transaction's next step would open when sent again.

    That step's call was cut off by the crash after its approval was consumed (or its start
    recorded, `on_unknown="review"`), so its outcome is unknown: as when it is sent again, the
    tool's status check runs (under the step timeout) and, if it cannot tell, a review is
    opened with the same evidence, timings, arguments and idempotency key, and the call's row
    is finished with it. Sent again, the call finds that review (`gate_action`: `review`), so a
    person can decide it before the agent comes back, and no second one is opened. A check
    that tells (`done`, `not_done`) opens nothing: the call sent again runs the check again and
    acts on it. A tool this engine does not know is left to the call sent again.
    """
    people = tx._people  # noqa: SLF001  (the transaction's desk: it then knows it waits)
    book = people.book()
    step = tx.next_step_id
    row = cut_off(book.of_scope(tx.id), step)
    if row is None:
        return
    request, decision = request_of(row), decision_of(row)
    tool = registry.get(request.tool)
    if tool is None:
        return
    approval = approval_of(row.id, decision)
    arguments = approval.arguments if approval.edited else request.arguments
    key = str(decision.get("idempotency_key") or "")
    errors = [ENDED_WHILE_RUNNING]
    started = time.monotonic()
    verdict = check_outcome(tool.check, arguments, key, settings.step_timeout, errors)
    if verdict.status != "unknown":
        return
    checked_in = time.monotonic() - started
    review = book.open_review(
        scope="transaction",
        scope_id=tx.id,
        step=step,
        tool=tool.name,
        arguments=arguments,
        digest=row.digest,
        idempotency_key=key,
        errors=errors,
        timings={"timeout_s": settings.step_timeout, "check_s": round(checked_in, 6)},
    )
    book.finish(row, f"review {review.id}")
    note = people.note  # the events the call sent again would have recorded
    note("OUTCOME_UNKNOWN", step, None, {"tool": tool.name, "reason": errors[0]})
    note("REVIEW_REQUESTED", step, None, {"review": review.id, "tool": tool.name})


def _abort(
    store: DurableStore,
    tx_id: str,
    restored: Restored,
    registry: ToolRegistry,
    tally: _Tally,
    *,
    events: EventSink,
) -> None:
    """Compensate the transaction's undo records newest first, then discard it; keep the
    record and the failed undo records if any compensation failed."""

    def forget(record: UndoRecord) -> None:
        # Counted first: the compensation ran, even if the store then fails to forget it (the
        # next recovery runs it again, so that it runs at least once).
        tally.run += 1
        store.forget_undo(tx_id, record.step_id, record.seq)

    settings = Settings.from_record(restored.settings, restored.policy)

    def outcome(record: UndoRecord, error: str | None) -> None:
        data: dict[str, JSONValue] = {"kind": record.kind, "description": record.description}
        if error is not None:
            data["error"] = error
        kind = EventKind.COMPENSATED if error is None else EventKind.COMPENSATION_FAILED
        events.emit(kind, step=record.step_id, actor=RECOVERY_ACTOR, data=data)

    settings = Settings.from_record(restored.settings, restored.policy)
    ledger = SagaLedger(
        attempts=settings.compensation_retries,
        timeout=settings.compensation_timeout,
        on_compensated=forget,
        on_outcome=outcome,
    )
    report = ledger.compensate(
        sorted(restored.undos, key=lambda r: (r.step_id, r.seq), reverse=True),
        registry.compensations,
    )
    tally.failures.extend(f"{tx_id}: {line}" for line in report.failures)
    status = restored.ended or "ROLLED_BACK"
    # A transaction that ended itself gave its history then (the store keeps it); one that
    # recovery aborts gets one here: its live steps were undone.
    # Its own events before the crash were not durable: the trail holds what recovery did.
    if not restored.ended:
        undone: list[JSONValue] = [*sorted(restored.steps)]
        events.emit(
            EventKind.ABORTED,
            actor=RECOVERY_ACTOR,
            data={"status": status, "steps_undone": undone, "by": "recovery"},
        )
    history = (
        None
        if restored.ended
        else recovered_history(restored, status, report.failures, events.compact())
    )
    if report.failures:  # the record and the failed undos stay, for next time
        end_keeping_undos(store, tx_id, restored.record, status, history)
    else:
        store.discard(tx_id, history=history)


def recover_plans(
    store: DurableStore,
    registry: ToolRegistry,
    *,
    dispatcher: Dispatcher | None,
    live: Container[str],
    hooks: Iterable[HookLike] | None = None,
    mode: Literal["abort", "resume"] = "resume",
) -> tuple[list[PlanRun], list[str], list[str], int]:
    """Resume every RUNNING plan run of `store` not in `live` whose owner is not a live
    process: each is claimed (a compare-and-set on its owner, so one recoverer takes it) and
    resumed on a background thread (`resume_plan`). A run a tool of whose plan is not
    registered cannot be resumed: in `"resume"` mode it is left as it is and reported
    (`PlanToolMissing`); in `"abort"` mode, or once it was cancelled, it is ended CANCELLED,
    its completed nodes compensated (`abort_run`). Returns the resumed runs, the ids skipped
    (alive, or claimed by another recoverer), a line per run that could not be resumed or
    compensation that failed, and how many compensations ran."""
    resumed: list[PlanRun] = []
    skipped: list[str] = []
    failures: list[str] = []
    ran = 0
    plans = store if is_plan_store(store) else None
    if plans is None:
        return resumed, skipped, failures, ran
    for run_id, owner in plans.running_plans():
        if run_id in live:
            continue
        if _alive(store, owner):
            skipped.append(run_id)
            continue
        try:
            # Read before the claim: a run that cannot be resumed is left unclaimed.
            missing = missing_tool(plan_of(plans.read_plan(run_id)), registry, run_id)
            cancelled = plans.plan_cancel_reason(run_id) if missing is not None else None
            if missing is not None and mode == "resume" and cancelled is None:
                failures.append(f"plan run {run_id}: {missing}")
                continue
            image = plans.claim_plan(run_id, owner)
            if image is None:
                skipped.append(run_id)
                continue
            if missing is not None:
                why = cancelled if cancelled is not None else f"aborted by recovery: {missing}"
                count, lines = abort_run(
                    store, image, registry, reason=why, actor=RECOVERY_ACTOR, hooks=hooks
                )
                ran += count
                failures.extend(lines)
                continue
            resumed.append(
                resume_plan(store, image, tools=registry, dispatcher=dispatcher, hooks=hooks)
            )
        except AgentTxError as exc:
            failures.append(f"plan run {run_id}: {exc}")
    return resumed, skipped, failures, ran


def cancel_stranded_plan(
    store: Store,
    run_id: str,
    registry: ToolRegistry,
    reason: str,
    hooks: Iterable[HookLike] | None = None,
) -> tuple[int, list[str]] | None:
    """End RUNNING run `run_id` now if no live process holds it and a tool of its plan is
    not registered (recovery could not resume it to see its cancellation): claimed, its
    completed nodes compensated, CANCELLED (`abort_run`). How many compensations ran and the
    lines of those that failed; None if it was left to its runner or to recovery."""
    if not is_durable(store):
        return None
    durable = store
    plans = store if is_plan_store(store) else None
    if plans is None:
        return None
    owners = dict(plans.running_plans())
    if run_id not in owners or _alive(durable, owners[run_id]):
        return None
    if missing_tool(plan_of(plans.read_plan(run_id)), registry, run_id) is None:
        return None  # the next recovery resumes it, and it reads its cancellation
    image = plans.claim_plan(run_id, owners[run_id])
    if image is None:
        return None
    return abort_run(durable, image, registry, reason=reason, actor=RECOVERY_ACTOR, hooks=hooks)


def _alive(store: DurableStore, owner: str | None) -> bool:
    """Whether recovery must leave `owner`'s transaction or plan run alone: the store says, if
    it knows better than a process check on this host (`PostgresStore`: the lease decides, in
    its `claim`), else `owner_alive`."""
    if leases_owners(store):
        return store.owner_alive(owner)
    return owner_alive(owner)
