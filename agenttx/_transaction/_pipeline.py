"""The step pipeline (docs/protocol.md#step-pipeline) and the one rewind path (`Pipeline`).

Every rewind and abort goes through `_rewind`, in one order: the decision is written to the
durable log first (a new key generation if it undoes something), then the undo records are
compensated newest first, then the store is restored, the timeline truncated, and the
progress written. A crash in between is finished by recovery, never undone. Agent-caused
failures come back as a `StepResult`; only misuse raises.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Final

import attrs

from .._constraints import add_hint, without_transient
from .._errors import (
    FailedPrecondition,
    IllegalTransition,
    InvalidArgument,
    InvalidTransactionState,
    JSONValueError,
    StorageError,
    ToolOutputError,
    TransactionNotFound,
    WriteConflict,
)
from .._events import EventKind
from .._hints import clean_error
from .._limits import MAX_PAYLOAD_BYTES
from .._prepare import (
    Arguments,
    check_call,
    check_call_id,
    duplicate_call_id,
    output_error,
    prepare_call,
)
from .._results import (
    TRANSITIONS,
    CommitResult,
    RollbackResult,
    StepResult,
    TxStatus,
    failed_step,
    refused_step,
    rewind_target,
    succeeded_step,
    waiting_step,
)
from .._rollback import RollbackStrategy
from .._saga import CompensationReport, deliver_committed
from .._step import Refused, Settled, Waiting, adrive, attempt, classify, drive
from .._timeline import Pending
from .._tools import (
    Call,
    Failure,
    Orphan,
    Outcome,
    arun_tool,
    closed,
    keep_abandoned,
    run_tool,
    still_running,
)
from .._txlog import LiveStep, Progress
from ._failure import Decided, decide_failure, without_secrets

if TYPE_CHECKING:
    import threading
    from collections.abc import Iterator, Mapping

    from .._approvals import ApprovalRequest, Review
    from .._events import EventSink
    from .._json import JSONValue
    from .._rollback import RollbackController
    from .._saga import Dispatcher, SagaLedger
    from .._settings import Settings
    from .._timeline import Timeline
    from .._tools import Orphans, StagedEffect, ToolRegistry, UndoRecord
    from .._txlog import Restored, TxLog
    from ..stores import Store
    from ._people import People
    from ._record import Record
    from ._turnlock import Calls

__all__ = ["Pipeline", "compensation_event"]


@attrs.define(kw_only=True, eq=False, repr=False)
class Pipeline:
    """A transaction's step driver: its status, steps, rewinds, rollback and commit.

    It owns the status and the transient marks; it changes the parts it was given (timeline,
    constraints list, in place, undo ledger, orphans) under `state_lock` for what a view
    reads. Each entry point (`execute_step`, `aexecute_step`, `rollback`, `commit`,
    `abort_if_idle`, `adopt`) holds the turn (`Calls`) for its whole length. Misuse raises
    before anything changes; an agent's mistake is a failed `StepResult`.
    """

    _id: str
    _registry: ToolRegistry
    _store: Store
    _settings: Settings
    _dispatcher: Dispatcher | None
    _controller: RollbackController
    _ledger: SagaLedger
    _events: EventSink
    _log: TxLog | None
    _timeline: Timeline
    _constraints: list[str]  # changed in place, never replaced: the views hold it
    _orphans: Orphans
    _calls: Calls
    _state_lock: threading.RLock
    _people: People
    _record: Record
    _status: TxStatus = attrs.field(init=False, default=TxStatus.ACTIVE)
    # The constraints added by transient failures, `(step, text)`: dropped when it succeeds.
    _transient_hints: list[tuple[int, str]] = attrs.field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        if self._log is not None:
            self._ledger.on_compensated = self._log.forget

    @property
    def status(self) -> TxStatus:
        """The transaction's status (one store: an observer never sees half a change)."""
        return self._status

    def adopt(self, restored: Restored) -> CompensationReport:
        """On resume: take over what `restored` holds, then finish its rewind or abort, or
        rewind the step that was running; what compensating it reported."""
        progress = restored.progress
        self._people.adopt()  # it asked a person: its requests block and gate again
        self._constraints[:] = progress.constraints
        self._transient_hints[:] = progress.transient
        self._ledger.record(restored.undos)
        self._timeline.adopt(restored)
        with self._calls:
            if progress.rewinding is not None:  # finish it: never bring compensated steps back
                target, final = progress.rewinding
                return self._rewind(target, final=None if final is None else TxStatus(final))
            interrupted = progress.next_step
            if interrupted not in restored.snapshots:  # it had not started: nothing to undo
                return CompensationReport()
            return self._rewind(interrupted)

    def abort_if_idle(self, idle_timeout: float) -> bool:
        """`Transaction.abort_if_idle`: never waits for the turn."""
        if not self._calls.try_enter():
            return False
        try:
            idle = time.monotonic() - self._calls.last
            if self._status is not TxStatus.ACTIVE or idle < idle_timeout:
                return False
            if self._people.waits_for_person():  # not idle: a person has the next move
                return False
            self._abort(TxStatus.ROLLED_BACK)
            return True
        finally:
            self._calls.leave()

    def execute_step(
        self,
        step_id: int,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        raw_context: str,
        call_id: str | None,
    ) -> StepResult:
        """`Transaction.execute_step`: the step pipeline, under the turn (FIFO)."""
        with self._calls:  # the turn, FIFO
            parsed = self._open(step_id, tool_name, arguments, raw_context, call_id)
            prepared: Call | Failure | None = None
            try:
                prepared = self._prepare(step_id, tool_name, parsed, raw_context, call_id)
                waits = self._people.requests is not None or self._orphans.calls  # most: no
                if isinstance(prepared, Call) and waits:
                    admitted = self._admit(prepared, self._settings.step_timeout)
                    if isinstance(admitted, StepResult):
                        return admitted
                    prepared = admitted
                if isinstance(prepared, Failure):
                    return self._fail(step_id, prepared)
                if prepared.tool.guarded:
                    return self._run_guarded(prepared)
                self._dispatched(prepared)
                outcome = run_tool(prepared, self._settings.output_serializer)
            except BaseException as exc:
                if isinstance(prepared, Call) and not prepared.tool.guarded:  # as `_aexecute`
                    keep_abandoned(self._orphans, prepared, closed(prepared.context)[0])
                self._abandon(step_id, prepared, exc)
                raise
            return self._settle(prepared, outcome)

    def _settle(self, call: Call, outcome: Outcome) -> StepResult:
        """The step's result once its tool has run (sync): kept, refused, succeeded or failed."""
        error = self._outcome_error(call, outcome)
        if error is None:
            return self._succeed(call, outcome)
        return self._fail(call.step_id, error)

    def _outcome_error(self, call: Call, outcome: Outcome) -> Failure | None:
        """Keep what the tool registered; why the step failed (None: it succeeded)."""
        if outcome.undos or outcome.effects or outcome.running is not None:  # most: nothing
            self._keep_registered(call, outcome)
        if outcome.refused is not None:
            raise self._refuse(call, outcome.refused)
        ok = outcome.error is None and outcome.size <= MAX_PAYLOAD_BYTES  # no call: most steps
        return None if ok else output_error(call, outcome)

    def _run_guarded(self, call: Call) -> StepResult:
        """Run a guarded call through the step core (`_step.attempt`), in this thread."""
        desk = self._people.desk(call, self._dispatched, self._timeline.call_id)
        result = drive(attempt(call, desk), self._settings.output_serializer)
        return self._guarded_result(call, result)

    async def _arun_guarded(self, call: Call) -> StepResult:
        """`_run_guarded` for `aexecute_step`: the tool, the waits and the status check run
        without blocking the event loop."""
        work = attempt(call, self._people.desk(call, self._dispatched, self._timeline.call_id))
        result = await adrive(work, self._settings.output_serializer)
        return self._guarded_result(call, result)

    def _guarded_result(self, call: Call, result: Settled | Waiting | Refused) -> StepResult:
        """The step's result once the step core ended the attempt."""
        if isinstance(result, Waiting):
            return self._waiting(call, approval=result.approval, review=result.review)
        if isinstance(result, Refused):
            return self._fail(call.step_id, result.failure)
        try:
            if result.decided:
                return self._succeed(result.call, result.outcome)
            return self._settle(result.call, result.outcome)
        finally:  # after the step is recorded: a crash before this finds it recorded
            self._people.finish(result, ended=self._status.terminal)

    def _waiting(
        self, call: Call, *, approval: ApprovalRequest | None, review: Review | None
    ) -> StepResult:
        """The step waits for a person: nothing rewound, the same step is next."""
        call_id = self._same_step()
        return waiting_step(call.step_id, tuple(self._constraints), call_id, approval, review)

    def _same_step(self) -> str | None:
        """The step ends with nothing to undo and is sent again at its own number: ACTIVE,
        no call pending; the call id it had."""
        with self._state_lock:
            timeline = self._timeline
            call_id, timeline.pending, timeline.call_id = timeline.call_id, None, None
        self._transition(TxStatus.ACTIVE)
        return call_id

    async def aexecute_step(
        self,
        step_id: int,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        raw_context: str,
        call_id: str | None,
    ) -> StepResult:
        """`Transaction.aexecute_step`: the turn is awaited without blocking the loop."""
        async with self._calls:
            return await self._aexecute(step_id, tool_name, arguments, raw_context, call_id)

    async def _aexecute(
        self,
        step_id: int,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        raw_context: str,
        call_id: str | None,
    ) -> StepResult:
        parsed = self._open(step_id, tool_name, arguments, raw_context, call_id)  # holds the turn
        prepared: Call | Failure | None = None
        try:
            prepared = self._prepare(step_id, tool_name, parsed, raw_context, call_id)
            if isinstance(prepared, Call):
                if self._orphans:  # waited for off the loop, then settled without waiting
                    await self._orphans.await_wait(self._settings.step_timeout)
                admitted = self._admit(prepared, 0.0)
                if isinstance(admitted, StepResult):
                    return admitted
                prepared = admitted
            if isinstance(prepared, Failure):
                return await self._afail(step_id, prepared)
            if prepared.tool.guarded:  # its store reads and status check block: short
                return await self._arun_guarded(prepared)
            self._dispatched(prepared)
            outcome = await arun_tool(prepared, self._settings.output_serializer)
        except BaseException as exc:
            if isinstance(prepared, Call) and not prepared.tool.guarded:  # the core keeps those
                keep_abandoned(self._orphans, prepared, closed(prepared.context)[0])
            self._abandon(step_id, prepared, exc)
            raise
        error = self._outcome_error(prepared, outcome)
        if error is None:
            return self._succeed(prepared, outcome)
        return await self._afail(step_id, error)

    def _open(
        self,
        step_id: int,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        raw_context: str,
        call_id: str | None,
    ) -> Arguments:
        """Check the call (misuse raises, changing nothing), then start the step."""
        if self._status is not TxStatus.ACTIVE:
            self._ensure_active()
        parsed = check_call(step_id, self._timeline.next_step, tool_name, arguments, raw_context)
        if call_id is not None:  # most calls have none: no call to check it
            check_call_id(call_id)
        self._store.snapshot(self._id, step_id)  # first: if the store fails, nothing changed
        self._status = TxStatus.EXECUTING  # from ACTIVE, checked above (`TRANSITIONS`)
        self._controller._observe(step_id)  # noqa: SLF001  (checked by check_call)
        return parsed

    def _prepare(
        self, step_id: int, tool_name: str, parsed: Arguments, raw_context: str, call_id: str | None
    ) -> Call | Failure:
        """The call ready to run, or why the agent's call fails; never raises for agent
        input (an unexpected error becomes the failure's message)."""
        timeline = self._timeline  # `pending` is None: each step's end clears it
        timeline.call_id = call_id
        if call_id is not None and (used := timeline.used(call_id, self._calls.turns)) is not None:
            timeline.pending = Pending(step_id, tool_name, None, ())
            return duplicate_call_id(call_id, used)  # within the turn: a later one may reuse it
        try:
            prepared, timeline.pending = prepare_call(
                step_id,
                tool_name,
                parsed,
                raw_context,
                registry=self._registry,
                outputs=timeline.outputs,
                sizes=timeline.sizes,
                generation=timeline.generation,
                rewinds=timeline.rewinds,
                tx_id=self._id,
                store=self._store,
                timeout=self._settings.step_timeout,
                log_undo=None if self._log is None else self._log.undo,
            )
        except Exception as exc:  # noqa: BLE001  (agent input: a failed step, never a wedge)
            timeline.pending = Pending(step_id, tool_name, None, ())
            return Failure(f"{type(exc).__name__}: {exc}")
        return prepared

    def _dispatched(self, call: Call) -> None:
        if self._log is not None:  # a worker that lost the transaction's lease runs no tool
            self._log.check_lease()
        data: dict[str, JSONValue] = {"tool": call.tool.name}
        call_id = self._timeline.call_id
        if call_id is not None:
            data["call_id"] = call_id
        self._events.step(STEP_DISPATCHED, call.step_id, data)

    def _keep_registered(self, call: Call, outcome: Outcome) -> None:
        """Keep what the tool registered, whether it succeeded or not (a rewind undoes it);
        the undos of a call still running after its deadline wait for it (`_orphans`)."""
        if outcome.running is not None:
            self._orphans.add(Orphan(call, outcome.undos, outcome.running))
        elif outcome.undos:
            self._ledger.record(outcome.undos)
        if outcome.effects:
            with self._state_lock:
                self._timeline.stage(outcome.effects)

    def _succeed(self, call: Call, outcome: Outcome) -> StepResult:
        step_id = call.step_id
        pending = self._timeline.pending
        assert pending is not None  # set by `_prepare` for this step
        call_id = self._timeline.call_id
        step = LiveStep(
            call.tool.name,
            call.arguments,
            outcome.output,
            call.raw_context,
            pending.dependencies,
            call_id,
        )
        # A transient constraint of this step is dropped, in the write that records it.
        dropped = None
        if self._transient_hints:
            dropped = without_transient(self._constraints, self._transient_hints, step_id)
        if self._log is not None:
            try:
                progress = None if dropped is None else self._progress(*dropped)
                self._log.step(step_id, step, outcome.effects, progress)
            except BaseException:  # not durable: the step did not happen
                self._rewind(step_id)
                raise
        with self._state_lock:
            self._timeline.append(step_id, step, outcome)
            if dropped is not None:
                self._constraints[:], self._transient_hints[:] = dropped
        self._transition(TxStatus.ACTIVE)
        self._events.step(STEP_COMPLETED, step_id, {"tool": call.tool.name})
        return succeeded_step(
            step_id, self._timeline.next_step, outcome.output, tuple(self._constraints), call_id
        )

    def _refuse(self, call: Call, refused: JSONValueError) -> ToolOutputError:
        """Undo a step whose output is not JSON; the error to raise to the developer. The tool
        ran: its undo records (its `compensate=` with output null) are compensated by the one
        rewind path, logged first. The step is never logged as done; the transaction is ACTIVE
        at the same step. The model is not told: this is a bug of the tool or the serializer."""
        report = self._rewind(call.step_id)
        error = ToolOutputError(
            tool=call.tool.name,
            step_id=call.step_id,
            path=refused.path,
            problem=refused.problem,
            compensation_errors=report.failures,
        )
        error.__cause__ = refused.__cause__ if refused.__cause__ is not None else refused
        return error

    def _abandon(self, step_id: int, prepared: Call | Failure | None, cause: BaseException) -> None:
        """Undo a step interrupted by `cause` and return to ACTIVE at the same step.

        If `cause` is the store's (it lost the transaction, or its connection), the rewind's
        own durable write fails for the same reason: `cause` is what the caller is told.
        """
        if isinstance(prepared, Call):
            undos, _ = closed(prepared.context)  # its staged effects are dropped
            if not self._orphans.runs(prepared.context):  # else they wait for it to return
                self._ledger.record(undos)
        if self._status is TxStatus.EXECUTING:
            try:
                self._rewind(step_id)
            except (StorageError, TransactionNotFound):
                if not isinstance(cause, (StorageError, TransactionNotFound)):
                    raise

    def _admit(self, call: Call, wait: float) -> Call | Failure | StepResult:
        """Whether the prepared `call` may run now (sync and async steps alike): not at a step
        that waits for a person, nor beside an earlier call still running after `wait` more
        seconds (a timeout; or, if that call is under review, the review)."""
        if self._people.requests is not None:
            blocked = self._people.unless_blocked(call)
            if isinstance(blocked, Failure):
                return self._blocked(call.step_id, blocked)
        if self._orphans and self._settle_orphans(wait):
            failure = still_running(call, self._settings.step_timeout)
            return self._held(call, failure) if self._orphans.held_at(call.step_id) else failure
        return call

    def _held(self, call: Call, failure: Failure) -> StepResult:
        """The call sent again while its step's earlier call, under review, still runs: it
        waits on that review (or, resolved, for the call), never asking the controller."""
        review = self._people.pending_review_at(call.step_id)
        if review is not None:
            return self._waiting(call, approval=None, review=review)
        return self._blocked(call.step_id, failure)

    def _blocked(self, step_id: int, failure: Failure) -> StepResult:
        """A call refused at a step that waits for a person: nothing ran, nothing is undone,
        and the controller is not asked (a refusal never escalates to a rewind that would
        drop the waiting request); the same step is next."""
        hint = clean_error(failure.message)
        call_id = self._same_step()
        data: dict[str, JSONValue] = {"hint": hint.text, "category": hint.category.value}
        data.update(strategy=RollbackStrategy.RESEND.value, rollback_to_step=step_id)
        self._events.emit(EventKind.STEP_FAILED, step=step_id, data=data)
        return refused_step(step_id, hint, failure.message, tuple(self._constraints), call_id)

    def _settle_orphans(self, wait: float) -> bool:
        landed = self._orphans.settle(wait)  # an undo a return could not write: reported only
        for unrecorded, error in landed.unrecorded:
            self._ledger.keep_failed(unrecorded, f"not recorded as its late call returned: {error}")
        if landed.kept:  # an unknown outcome's: a person or the status check decides it
            self._ledger.record(landed.kept)
        if landed.undo:  # compensated: a step sent again gets a key of its own
            self._timeline.generation += 1
            self._ledger.compensate(landed.undo, self._registry.compensations)
            if self._status is TxStatus.EXECUTING or self._status is TxStatus.ACTIVE:
                self._log_progress()
        return landed.running

    def _decide(self, step_id: int, failure: Failure) -> Decided:
        pending = self._timeline.pending  # the failed call, before `failed()` forgets it
        failure = without_secrets(failure, pending, self._registry)  # before the cleaner reads
        hint, transient, _, mistake = classify(failure)  # the step core's one reading
        with self._state_lock:
            add_hint(
                self._constraints,
                self._transient_hints,
                hint.text,
                self._settings.max_constraints,
                transient_step=step_id if transient and not mistake else None,
            )
            self._timeline.failed()
            graph = self._timeline.graph()
        decided = decide_failure(
            self._controller,
            step_id,
            hint,
            graph=graph,
            pending=pending,
            registry=self._registry,
            transient=transient,
            mistake=mistake,
        )
        # Recorded before the rewind it decides, so the audit reads in the order things happen.
        self._events.emit(EventKind.STEP_FAILED, step=step_id, data=decided.event)
        return decided._replace(error=failure.message)

    def _fail(self, step_id: int, failure: Failure) -> StepResult:
        decided = self._decide(step_id, failure)
        started = time.perf_counter()
        target, final = rewind_target(decided.decision)
        report = self._rewind(target, final=final)
        return self._failed(step_id, decided, report=report, started=started)

    async def _afail(self, step_id: int, failure: Failure) -> StepResult:
        decided = self._decide(step_id, failure)
        target, final = rewind_target(decided.decision)
        records = self._begin_rewind(target, final)
        started = time.perf_counter()
        try:
            report = await self._ledger.acompensate(records, self._registry.compensations)
        except BaseException as exc:
            self._fail_hard(run_compensations=isinstance(exc, Exception))
            raise
        with self._ending_if_interrupted():
            self._finish_rewind(target, final)
        return self._failed(step_id, decided, report=report, started=started)

    def _failed(
        self,
        step_id: int,
        decided: Decided,
        *,
        report: CompensationReport,
        started: float,
    ) -> StepResult:
        """The failed step's result, once its rewind is done (calls are serialized, so the
        timeline still holds the step's call id and what the rewind dropped)."""
        return failed_step(
            step_id,
            decision=decided.decision,
            hint=decided.hint,
            error=decided.error,
            next_step_id=self._timeline.next_step,
            constraints=tuple(self._constraints),
            compensation_errors=report.failures,
            started=started,
            call_id=self._timeline.call_id,
            voided=self._timeline.dropped,
            bad_value=decided.bad_value,
            compensated=report.ran,
        )

    def _rewind(self, target: int, *, final: TxStatus | None = None) -> CompensationReport:
        """Rewind to just before step `target` (or abort as `final`): the one rewind path.

        In order: the decision is logged durably, the undo records of steps >= `target` (all
        of them for an abort) are compensated newest first, then the store is restored (or
        discarded), the timeline truncated (or cleared), the progress logged and the status
        set. If it cannot finish, the transaction ends FAILED (`_ending_if_interrupted`).
        """
        records = self._begin_rewind(target, final)
        with self._ending_if_interrupted():
            report = self._ledger.compensate(records, self._registry.compensations)
            self._finish_rewind(target, final)
        return report

    def _begin_rewind(self, target: int, final: TxStatus | None) -> list[Any]:
        if self._status is not TxStatus.ROLLING_BACK:
            self._transition(TxStatus.ROLLING_BACK)
        with self._ending_if_interrupted():
            timeline = self._timeline
            timeline.rewinds += 1  # the next attempt numbers its undo records apart
            if final is None:
                records = self._ledger.take_from(target)
                timeline.undid = bool(records) or timeline.drops(target)
                if timeline.undid:  # docs/protocol.md#idempotency-keys
                    timeline.generation += 1
                self._log_progress(rewinding=(target, None))
                return records
            timeline.generation += 1
            self._log_progress(rewinding=(0, final.value))
            self._settle_orphans(0.0)  # an abort cannot wait for what is still running:
            self._ledger.keep_failed(self._orphans.give_up(), _STILL_RUNNING)
            return self._ledger.take_from(0)

    def _finish_rewind(self, target: int, final: TxStatus | None) -> None:
        if final is not None:
            with self._state_lock:
                dropped: list[JSONValue] = [*sorted(self._timeline.steps)]
                self._timeline.clear()
            self._events.emit(
                EventKind.ABORTED, data={"status": final.value, "steps_undone": dropped}
            )
            self._discard(final)
            self._transition(final)
            return
        self._store.restore(self._id, target)
        self._orphans.release_from(target)  # a held call of a dropped step is undone once back
        self._settle_orphans(0.0)  # and at once if it is back already: nothing left in memory
        self._people.rewound(target, dropped=target < self._timeline.next_step)
        with self._state_lock:
            undone: list[JSONValue] = [step for step in self._timeline.steps if step >= target]
            self._timeline.truncate(target)
        self._log_progress()
        self._transition(TxStatus.ACTIVE)
        self._events.emit(
            EventKind.STEP_REWOUND, step=target, data={"to_step": target, "steps_undone": undone}
        )

    @contextlib.contextmanager
    def _ending_if_interrupted(self) -> Iterator[None]:
        """Around a rewind: if it cannot finish, end the transaction FAILED, then re-raise.

        After an ordinary exception (a failing store) the remaining undo records run, once the
        log records the abort; after an interrupt, or if it cannot, they are kept as failed.
        """
        try:
            yield
        except BaseException as exc:
            self._fail_hard(run_compensations=isinstance(exc, Exception))
            raise

    def _fail_hard(self, *, run_compensations: bool) -> None:
        if self._status in (TxStatus.FAILED, TxStatus.ROLLED_BACK, TxStatus.COMMITTED):
            return
        remaining, reason = self._ledger.take_from(0), "not run: the transaction was interrupted"
        if run_compensations:
            try:  # only once the log says so: else recovery could revive compensated steps
                self._log_progress(rewinding=(0, TxStatus.FAILED.value))
            except Exception as exc:  # noqa: BLE001  (the original error is the one to report)
                reason = f"not run: the store could not record the abort: {exc}"
            else:
                with contextlib.suppress(Exception):  # a failing store: the ledger keeps the rest
                    self._ledger.compensate(remaining, self._registry.compensations)
                remaining = []
        self._ledger.keep_failed(remaining, reason)
        self._ledger.keep_failed(self._orphans.give_up(), _STILL_RUNNING)
        with self._state_lock:
            self._timeline.clear()
        with contextlib.suppress(Exception):  # the original error is the one to report
            self._discard(TxStatus.FAILED)
        if self._status is not TxStatus.ROLLING_BACK:
            self._transition(TxStatus.ROLLING_BACK)
        self._transition(TxStatus.FAILED)

    def _log_progress(self, rewinding: tuple[int, str | None] | None = None) -> None:
        if self._log is not None:
            progress = self._progress(self._constraints, self._transient_hints, rewinding)
            self._log.progress(progress)

    def _progress(
        self,
        constraints: list[str],
        transient: list[tuple[int, str]],
        rewinding: tuple[int, str | None] | None = None,
    ) -> Progress:
        timeline, state = self._timeline, self._controller.state()
        return Progress(
            timeline.next_step,
            state,
            tuple(constraints),
            timeline.rewinds,
            rewinding=rewinding,
            transient=tuple(transient),
            keys=timeline.generation,
        )

    def _discard(self, final: TxStatus) -> None:
        """End the store's side; a durable store keeps undo records that failed, for recovery."""
        self._people.withdraw(final)
        self._record.discard(final, keep_undos=bool(self._ledger.failed))

    def rollback(self, to_step: int | None) -> RollbackResult:
        """`Transaction.rollback`, under the turn."""
        with self._calls:
            self._ensure_active()
            if to_step is not None and (isinstance(to_step, bool) or not isinstance(to_step, int)):
                raise InvalidArgument(f"to_step must be an integer, got {to_step!r}")
            if to_step and not 0 < to_step < self._timeline.next_step:
                raise InvalidArgument(
                    f"to_step {to_step} must be lower than the next step {self._timeline.next_step}"
                )
            report = self._rewind(to_step) if to_step else self._abort(TxStatus.ROLLED_BACK)
            return RollbackResult(
                aborted=not to_step,
                next_step_id=to_step or 0,
                compensations_run=report.succeeded,
                compensation_errors=report.failures,
            )

    def _abort(self, final: TxStatus) -> CompensationReport:
        if self._orphans:  # give timed-out calls their time, so that their undos can run
            self._settle_orphans(self._settings.step_timeout)
        return self._rewind(0, final=final)

    def commit(self) -> CommitResult:
        """`Transaction.commit`, under the turn; the effects are delivered after it."""
        with self._calls:
            self._ensure_active()
            if self._people.requests is not None:  # it asked a person: none is left waiting
                self._people.check_settled()
                self._people.note_decisions()  # the trail is stored with the commit
            if self._orphans.calls and self._settle_orphans(self._settings.step_timeout):
                raise FailedPrecondition(
                    f"transaction `{self._id}`: a timed-out tool call is still running and its "
                    "effect may still land; commit again later, or roll back"
                )
            self._transition(TxStatus.COMMITTING)
            with self._state_lock:
                committed: dict[str, JSONValue] = {
                    "steps": len(self._timeline.steps),
                    "effects": len(self._timeline.effects),
                }
            try:
                at = self._record.commit(committed)  # with its history, on a durable store
            except WriteConflict:
                self._abort(TxStatus.FAILED)
                raise
            except BaseException:
                if not self._record.committed_anyway():
                    self._transition(TxStatus.ACTIVE)
                    raise
                # Interrupted (KeyboardInterrupt, say) after the store committed: the object
                # says so too; the effects are not delivered here (a durable store's outbox
                # delivers them; on another store they stay counted in `view()`).
                self._committed(committed, time.time(), deliver=False)
                raise
            effects, steps = self._committed(committed, at, deliver=True)
        dispatched, failures = 0, tuple[str, ...]()  # most commits: nothing to deliver
        if effects:
            dispatched, failures = deliver_committed(
                effects,
                self._dispatcher,
                self._store,
                self._id,
                timeout=self._settings.dispatch_timeout,
                on_delivered=self._delivered,
            )
        return CommitResult(
            steps_committed=steps,
            effects_dispatched=dispatched,
            dispatch_errors=failures,
            effects=effects,
        )

    def _committed(
        self, data: dict[str, JSONValue], at: float, *, deliver: bool
    ) -> tuple[tuple[StagedEffect, ...], int]:
        """The store has committed: end COMMITTED; the effects to `deliver` (taken out of the
        timeline, else left there, counted by `view().pending_effects`) and the steps."""
        self._ledger.forget_all()
        with self._state_lock:
            effects = tuple(self._timeline.effects)
            if deliver:
                self._timeline.effects.clear()
            steps = len(self._timeline.steps)
        self._transition(TxStatus.COMMITTED)
        self._people.withdraw(TxStatus.COMMITTED)
        self._events.emit(EventKind.COMMITTED, data=data, at=at)
        return effects, steps

    def _delivered(self, channel: str, idempotency_key: str, step_id: int) -> None:
        self._events.emit(
            EventKind.EFFECT_DELIVERED,
            step=step_id,
            data={"channel": channel, "idempotency_key": idempotency_key},
        )

    def _transition(self, target: TxStatus) -> None:
        if target not in TRANSITIONS[self._status]:
            raise IllegalTransition(source=self._status.value, target=target.value)
        self._status = target  # one store: observers never see half of it

    def _ensure_active(self) -> None:
        if self._status is not TxStatus.ACTIVE:
            raise InvalidTransactionState(tx_id=self._id, status=self._status.value)


def compensation_event(events: EventSink, record: UndoRecord, error: str | None) -> None:
    """The audit event of one compensation run (the ledger's `on_outcome`, given the sink
    with `functools.partial`: it holds no reference to the transaction, so no cycle)."""
    data: dict[str, JSONValue] = {"kind": record.kind, "description": record.description}
    if error is None:
        events.emit(EventKind.COMPENSATED, step=record.step_id, data=data)
    else:
        data["error"] = error
        events.emit(EventKind.COMPENSATION_FAILED, step=record.step_id, data=data)


_STILL_RUNNING: Final = "not run: its tool was still running after its timeout"
STEP_DISPATCHED: Final = EventKind.STEP_DISPATCHED
STEP_COMPLETED: Final = EventKind.STEP_COMPLETED
