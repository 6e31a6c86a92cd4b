"""The interactive transaction: every tool call is a numbered step that can be rolled back.

The step pipeline is docs/protocol.md#step-pipeline. Every rewind and abort goes through
`_rewind`, in one order: the decision is written to the durable log first (with a new rewind
count, which changes every idempotency key), then the undo records are compensated newest
first, then the store is restored and the timeline truncated, and the progress written. A
crash anywhere in between is finished by recovery, never undone. Agent-caused failures come
back as a `StepResult`; only misuse raises.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import TYPE_CHECKING, Any, Final

import attrs

from ._approvals import requests_for
from ._constraints import add_hint, without_transient
from ._errors import (
    FailedPrecondition,
    InvalidArgument,
    JSONValueError,
    StorageError,
    ToolOutputError,
    TransactionNotFound,
    WriteConflict,
)
from ._events import EventKind, EventSink
from ._guarded import Guarded
from ._hints import CleanHint, clean_error
from ._limits import DEFAULT_ISOLATION, Isolation
from ._observed import Observed
from ._prepare import (
    Arguments,
    check_agent_id,
    check_call,
    check_call_id,
    duplicate_call_id,
    output_error,
    prepare_call,
)
from ._results import (
    CommitResult,
    RollbackResult,
    StepResult,
    StepStatus,
    TxStatus,
    failed_step,
)
from ._rollback import RollbackController, RollbackDecision, RollbackPolicy, RollbackStrategy
from ._saga import CompensationReport, Dispatcher, SagaLedger, check_dispatcher, deliver_committed
from ._settings import DEFAULT_STEP_TIMEOUT, Settings
from ._timeline import Pending, Timeline
from ._tools import (
    Call,
    Failure,
    Orphan,
    Outcome,
    ToolRegistry,
    ToolsArgument,
    arun_tool,
    closed,
    run_tool,
    still_running,
    to_json_value,
)
from ._turns import Turns
from ._txlog import LiveStep, Progress, Restored, TxLog
from .stores import DurableStore, MemoryStore, Store, is_store

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping
    from types import TracebackType

    from typing_extensions import Self

    from ._events import HookLike
    from ._json import JSONValue
    from ._tools import OutputSerializer, StagedEffect


__all__ = ["Transaction"]


@attrs.define(init=False, eq=False, repr=False)
class Transaction(Turns, Guarded, Observed):
    """One agent run's tool calls, executed as numbered steps that can be rolled back.

    `tools`: decorated tools, compensations and plain callables, or `{name: callable}`.
    `store`: where state lives (default: a private `MemoryStore`); share one store between
    transactions that should see each other's commits and conflicts. `dispatcher`: delivers
    staged effects after commit (a callable, `{channel: callable}` or `JsonlDispatcher`).
    `isolation`: see docs/protocol.md#isolation-levels. `output_serializer` converts a tool
    output that is not JSON (default `to_json_value`, docs/protocol.md#outputs). `hooks`:
    `EventHook`s or callables given each audit event as it is recorded; `audit()` returns
    them all (docs/audit.md). Calls are serialized, so a transaction may be shared between
    threads and tasks: a call made while another is running waits for its turn, and turns
    come in arrival order (FIFO).
    Observers (`view`, `history`, `graph`, ...) never wait for a tool or a compensation:
    they take a lock held only for bookkeeping. Transactions compare by identity. `with
    Transaction(...) as tx:` commits when the block ends normally and aborts (compensating)
    when it raises, then re-raises.
    """

    def __init__(
        self,
        tools: ToolsArgument = (),
        *,
        store: Store | None = None,
        policy: RollbackPolicy | None = None,
        agent_id: str = "",
        dispatcher: Dispatcher | None = None,
        step_timeout: float = DEFAULT_STEP_TIMEOUT,
        max_constraints: int = 32,
        compensation_retries: int = 3,
        compensation_timeout: float = DEFAULT_STEP_TIMEOUT,
        dispatch_timeout: float = DEFAULT_STEP_TIMEOUT,
        isolation: Isolation = DEFAULT_ISOLATION,
        output_serializer: OutputSerializer = to_json_value,
        tx_id: str | None = None,
        hooks: Iterable[HookLike] | None = None,
    ) -> None:
        check_agent_id(agent_id)
        check_dispatcher(dispatcher)
        if store is not None and not is_store(store):
            raise InvalidArgument(f"store must be a Store, got {type(store).__name__}")
        settings = Settings(
            step_timeout=step_timeout,
            max_constraints=max_constraints,
            compensation_retries=compensation_retries,
            compensation_timeout=compensation_timeout,
            dispatch_timeout=dispatch_timeout,
            isolation=isolation,
            policy=RollbackPolicy() if policy is None else policy,
            output_serializer=output_serializer,
        )
        store = MemoryStore() if store is None else store
        tx_id = str(uuid.uuid4()) if tx_id is None else tx_id
        registry = ToolRegistry(tools)
        events = EventSink("transaction", tx_id, hooks)  # checks the hooks before the store
        log = TxLog.open(store, tx_id, agent_id=agent_id, settings=settings)
        self._setup(
            log,
            settings,
            events,
            registry=registry,
            store=store,
            agent_id=agent_id,
            dispatcher=dispatcher,
            id=tx_id,
            controller=RollbackController(settings.policy),
        )

    def _setup(
        self, log: TxLog | None, settings: Settings, events: EventSink, **fields: Any
    ) -> None:
        ledger = SagaLedger(
            attempts=settings.compensation_retries, timeout=settings.compensation_timeout
        )
        self.__attrs_init__(settings=settings, ledger=ledger, **fields)
        self._events = events
        ledger.on_outcome = self._compensation_event
        if log is not None:
            self._log = log
            ledger.on_compensated = log.forget

    @classmethod
    def _resume(
        cls,
        restored: Restored,
        *,
        registry: ToolRegistry,
        store: DurableStore,
        dispatcher: Dispatcher | None,
        output_serializer: OutputSerializer = to_json_value,
        hooks: Iterable[HookLike] | None = None,
    ) -> tuple[Transaction, CompensationReport]:
        """The transaction `restored` from its durable log, ready for its next step.

        The store must already hold it open (`DurableStore.load`). A rewind or abort that was
        under way when the process died is finished (its remaining undo records compensated);
        else a step that was running is rewound. The report says how that went; after an
        abort the transaction has ended.
        """
        progress = restored.progress
        tx = cls.__new__(cls)
        tx._setup(  # noqa: SLF001  (its own class)
            TxLog(store, restored.tx_id, record=restored.record, progress=progress),
            Settings.from_record(restored.settings, restored.policy, output_serializer),
            EventSink("transaction", restored.tx_id, hooks),
            registry=registry,
            store=store,
            agent_id=restored.agent_id,
            dispatcher=dispatcher,
            id=restored.tx_id,
            controller=RollbackController.from_state(restored.policy, progress.controller),
        )
        return tx, tx._adopt(restored)  # noqa: SLF001

    def _adopt(self, restored: Restored) -> CompensationReport:
        progress = restored.progress
        book = requests_for(self._store)
        if book.of_scope(self._id):  # it asked a person: its requests block and gate again
            self._requests = book
        self._constraints = list(progress.constraints)
        self._transient_hints = list(progress.transient)
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
        """Abort (compensating) if ACTIVE, not busy, and idle for `idle_timeout` seconds.

        Idleness counts from the end of the last call. Returns whether it aborted. A
        transaction in the middle of a call is skipped, never waited for: this is what an idle
        reaper calls from its own thread. One whose call waits for a person (an approval
        request or a review not yet decided, or decided and not yet taken) is not idle.
        """
        if not self._calls.try_enter():
            return False
        try:
            idle = time.monotonic() - self._calls.last
            if self._status is not TxStatus.ACTIVE or idle < idle_timeout:
                return False
            if self._waits_for_person():  # not idle: a person has the next move
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
        *,
        raw_context: str = "",
        call_id: str | None = None,
    ) -> StepResult:
        """Run one tool call as step `step_id` (docs/protocol.md#step-pipeline).

        `call_id` is the provider's id of the call (1-256 characters), recorded on the step and
        returned on the result; one already used by a live step fails the step (a mistake).
        Everything the agent got wrong comes back as a failed `StepResult`. Misuse raises, and
        changes nothing: `StepOutOfOrder` unless `step_id == next_step_id`,
        `InvalidTransactionState` unless ACTIVE, `InvalidArgument` (docs/protocol.md#input-limits).
        A call made while another runs (from another thread) waits for its turn: calls run one
        at a time, in arrival order; `step_id` is checked when its turn comes.
        A tool output that is not JSON, even after `output_serializer`, raises `ToolOutputError`
        once the step is undone: the transaction is ACTIVE at the same step
        (docs/protocol.md#outputs).
        """
        with self._calls:  # the turn, FIFO (as `_call()` gives, one call less a step)
            self._ensure_active()
            parsed = check_call(step_id, self.next_step_id, tool_name, arguments, raw_context)
            if call_id is not None:  # most calls have none: no call to check it
                check_call_id(call_id)
            self._start(step_id)
            prepared: Call | Failure | None = None
            try:
                prepared = self._prepare(step_id, tool_name, parsed, raw_context, call_id)
                if isinstance(prepared, Call) and self._requests is not None:
                    blocked = self._unless_blocked(prepared)
                    if isinstance(blocked, Failure):
                        return self._blocked(step_id, blocked)
                if isinstance(prepared, Call) and self._orphans:
                    prepared = self._unless_orphans(prepared, self._settings.step_timeout)
                if isinstance(prepared, Failure):
                    return self._fail(step_id, prepared)
                if prepared.tool.guarded:
                    return self._run_guarded(prepared)
                self._dispatched(prepared)
                outcome = run_tool(prepared, self._settings.output_serializer)
            except BaseException as exc:
                self._abandon(step_id, prepared, exc)
                raise
            return self._settle(prepared, outcome)

    def _settle(self, call: Call, outcome: Outcome) -> StepResult:
        """The step's result once its tool has run (sync): kept, refused, succeeded or failed."""
        self._keep_registered(call, outcome)
        if outcome.refused is not None:
            raise self._refuse(call, outcome.refused)
        error = output_error(call, outcome)
        if error is None:
            return self._succeed(call, outcome)
        return self._fail(call.step_id, error)

    async def aexecute_step(
        self,
        step_id: int,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        raw_context: str = "",
        call_id: str | None = None,
    ) -> StepResult:
        """`execute_step` for async code: async tools and compensations run on the caller's loop.

        A call made while another runs waits for its turn without blocking the loop (calls
        run one at a time, in arrival order), as with `execute_step`.
        """
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
        # The whole call holds the turn (`aexecute_step`): no other call runs meanwhile.
        self._ensure_active()
        parsed = check_call(step_id, self.next_step_id, tool_name, arguments, raw_context)
        if call_id is not None:  # most calls have none: no call to check it
            check_call_id(call_id)
        self._start(step_id)
        prepared: Call | Failure | None = None
        try:
            prepared = self._prepare(step_id, tool_name, parsed, raw_context, call_id)
            if isinstance(prepared, Call) and self._requests is not None:
                blocked = self._unless_blocked(prepared)
                if isinstance(blocked, Failure):
                    return self._blocked(step_id, blocked)
            if isinstance(prepared, Call) and self._orphans:
                timeout = self._settings.step_timeout
                await self._orphans.await_wait(timeout)
                prepared = self._unless_orphans(prepared, timeout)
            if isinstance(prepared, Failure):
                return await self._afail(step_id, prepared)
            if prepared.tool.guarded:  # its store reads and status check block: short
                return await self._arun_guarded(prepared)
            self._dispatched(prepared)
            outcome = await arun_tool(prepared, self._settings.output_serializer)
        except BaseException as exc:
            self._abandon(step_id, prepared, exc)
            raise
        self._keep_registered(prepared, outcome)
        if outcome.refused is not None:
            raise self._refuse(prepared, outcome.refused)
        error = output_error(prepared, outcome)
        if error is None:
            return self._succeed(prepared, outcome)
        return await self._afail(step_id, error)

    def _start(self, step_id: int) -> None:
        self._store.snapshot(self._id, step_id)  # first: if the store fails, nothing changed
        self._transition(TxStatus.EXECUTING)
        self._controller._observe(step_id)  # noqa: SLF001  (checked by check_call)

    def _prepare(
        self, step_id: int, tool_name: str, parsed: Arguments, raw_context: str, call_id: str | None
    ) -> Call | Failure:
        """The call ready to run, or why the agent's call fails; never raises for agent
        input (an unexpected error becomes the failure's message)."""
        timeline = self._timeline
        timeline.pending = Pending(step_id, tool_name, None, ())
        timeline.call_id = call_id
        if call_id is not None and call_id in timeline.call_ids:
            return duplicate_call_id(call_id, timeline.call_ids[call_id])
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
        """Keep what the tool registered, whether it succeeded or not (a rewind undoes it).

        The undos of a call still running after its deadline wait for it (`_orphans`).
        """
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
        assert pending is not None  # set by _resolve for this step
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
                self._constraints, self._transient_hints = dropped
        self._transition(TxStatus.ACTIVE)
        self._events.step(STEP_COMPLETED, step_id, {"tool": call.tool.name})
        return StepResult(
            status=StepStatus.SUCCESS,
            step_id=step_id,
            next_step_id=self._timeline.next_step,
            output=outcome.output,
            constraints=tuple(self._constraints),
            call_id=call_id,
        )

    def _refuse(self, call: Call, refused: JSONValueError) -> ToolOutputError:
        """Undo a step whose output is not JSON; the error to raise to the developer.

        The tool ran, so its effect may have happened: its undo records (and its `compensate=`,
        recorded with output null) are compensated by the one rewind path, which logs the
        rewind first, so recovery finishes it after a crash. The step is never logged as done;
        the transaction is ACTIVE at the same step. The model is not told: this is a bug in the
        tool or the serializer, not in the agent's arguments.
        """
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

    def _blocked(self, step_id: int, failure: Failure) -> StepResult:
        """A call refused at a step that waits for a person: nothing ran, nothing is undone,
        and the controller is not asked (a refusal never escalates to a rewind that would
        drop the waiting request); the same step is next."""
        hint = clean_error(failure.message)
        with self._state_lock:
            call_id = self._timeline.call_id
            self._timeline.pending = None
            self._timeline.call_id = None
        self._transition(TxStatus.ACTIVE)
        data: dict[str, JSONValue] = {
            "hint": hint.text,
            "category": hint.category.value,
            "strategy": RollbackStrategy.RESEND.value,
            "rollback_to_step": step_id,
        }
        self._events.emit(EventKind.STEP_FAILED, step=step_id, data=data)
        return failed_step(
            step_id,
            decision=RollbackDecision(strategy=RollbackStrategy.RESEND, target_step=step_id),
            hint=hint,
            error=failure.message,
            next_step_id=step_id,
            constraints=tuple(self._constraints),
            compensation_errors=(),
            started=time.perf_counter(),
            call_id=call_id,
        )

    def _unless_orphans(self, call: Call, wait: float) -> Call | Failure:
        """The call, unless an earlier timed-out call still runs (its effect may land); first,
        compensate the undos of the timed-out calls that have finished."""
        return still_running(call, wait) if self._settle_orphans(wait) else call

    def _settle_orphans(self, wait: float) -> bool:
        records, kept, running = self._orphans.settle(wait)
        if kept:  # an unknown outcome's: a person or the status check decides it
            self._ledger.record(kept)
        if records:  # compensated: a step sent again gets a key of its own
            self._timeline.generation += 1
            self._ledger.compensate(records, self._registry.compensations)
            if self._status is TxStatus.EXECUTING or self._status is TxStatus.ACTIVE:
                self._log_progress()
        return running

    def _decide(self, step_id: int, failure: Failure) -> tuple[RollbackDecision, CleanHint]:
        hint = clean_error(failure.message)
        if failure.key is not None and failure.key != hint.key:
            hint = attrs.evolve(hint, key=failure.key)
        transient = hint.category.transient if failure.transient is None else failure.transient
        pending = self._timeline.pending  # the failed call, before `failed()` forgets it
        with self._state_lock:
            add_hint(
                self._constraints,
                self._transient_hints,
                hint.text,
                self._settings.max_constraints,
                transient_step=step_id if transient and not failure.mistake else None,
            )
            self._timeline.failed()
            graph = self._timeline.graph()
        decision = self._controller.decide(
            step_id, hint.key, graph.find_root_cause, transient=transient, mistake=failure.mistake
        )
        # Recorded before the rewind it decides, so the audit reads in the order things happen.
        strategy = decision.strategy
        data: dict[str, JSONValue] = {
            "hint": hint.text,
            "category": hint.category.value,
            "strategy": strategy.value,
            "rollback_to_step": 0 if strategy is RollbackStrategy.ABORT else decision.target_step,
        }
        if pending is not None:
            data["tool"] = pending.tool_name
        self._events.emit(EventKind.STEP_FAILED, step=step_id, data=data)
        return decision, hint

    def _fail(self, step_id: int, failure: Failure) -> StepResult:
        decision, hint = self._decide(step_id, failure)
        started = time.perf_counter()
        target, final = _rewind_target(decision)
        report = self._rewind(target, final=final)
        return self._failed(step_id, decision, hint, failure, report=report, started=started)

    async def _afail(self, step_id: int, failure: Failure) -> StepResult:
        decision, hint = self._decide(step_id, failure)
        target, final = _rewind_target(decision)
        records = self._begin_rewind(target, final)
        started = time.perf_counter()
        try:
            report = await self._ledger.acompensate(records, self._registry.compensations)
        except BaseException as exc:
            self._fail_hard(run_compensations=isinstance(exc, Exception))
            raise
        with self._ending_if_interrupted():
            self._finish_rewind(target, final)
        return self._failed(step_id, decision, hint, failure, report=report, started=started)

    def _failed(
        self,
        step_id: int,
        decision: RollbackDecision,
        hint: CleanHint,
        failure: Failure,
        *,
        report: CompensationReport,
        started: float,
    ) -> StepResult:
        """The failed step's result, once its rewind is done (calls are serialized, so the
        timeline still holds the step's call id and what the rewind dropped)."""
        return failed_step(
            step_id,
            decision=decision,
            hint=hint,
            error=failure.message,
            next_step_id=self._timeline.next_step,
            constraints=tuple(self._constraints),
            compensation_errors=report.failures,
            started=started,
            call_id=self._timeline.call_id,
            voided=self._timeline.dropped,
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
                timeline.undid = bool(records) or _drops(timeline, target)
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
        if self._requests is not None:
            why = f"step rewound to {target}"
            if target < self._timeline.next_step:
                # What waited at a step the rewind drops waits no more (a step sent again at
                # its own number drops nothing: what waits there still blocks it).
                self._requests.withdraw(self._id, why, from_step=target)
            elif self._timeline.undid:
                # The rewind compensated the step's call: its outcome is known (undone), and
                # the call sent again gets a new key and, if it needs one, a new approval.
                self._requests.finish_started(self._id, why, from_step=target)
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
        self._withdraw(final)
        if self._log is None:
            self._store.discard(self._id)
        else:
            failed = bool(self._ledger.failed)
            self._log.end(final.value, self._history_text(final), keep_undos=failed)

    def rollback(self, to_step: int | None = None, *, reason: str = "") -> RollbackResult:
        """Rewind to just before `to_step` (it runs next), or abort with None or 0.

        A rewind compensates the undo records of steps >= `to_step`, newest first, drops their
        staged effects and restores the store; the controller's counters and the constraints
        are left alone. Raises `InvalidArgument` unless `to_step < next_step_id`. `reason` is
        for the caller's logs; agenttx does not interpret it.
        """
        del reason
        with self._call():
            self._ensure_active()
            if to_step is not None and (isinstance(to_step, bool) or not isinstance(to_step, int)):
                raise InvalidArgument(f"to_step must be an integer, got {to_step!r}")
            if to_step and not 0 < to_step < self._timeline.next_step:
                raise InvalidArgument(
                    f"to_step {to_step} must be lower than the next step {self.next_step_id}"
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
        """Publish every write atomically, then dispatch the staged effects in staging order.

        First committer wins (docs/protocol.md#isolation-levels): on a conflict the transaction
        is compensated, ends FAILED, and `WriteConflict` (or `ReadConflict`) naming the key is
        raised. Dispatch errors are reported in the result, never undo the commit, and on a
        `DurableStore` are retried from its outbox (docs/protocol.md#dispatch-and-the-outbox).
        Raises `FailedPrecondition`, changing nothing, while a timed-out tool call is still
        running after waiting for it up to the step timeout (its effect may still land), and
        while a call waits for a person or has an unknown outcome (a pending approval request,
        a review not yet taken, a call started and never finished: see
        docs/protocol.md#the-lifecycle-of-a-tool-call).
        """
        with self._call():
            self._ensure_active()
            self._check_settled()
            self._note_decisions()  # the trail is stored with the commit
            if self._orphans and self._settle_orphans(self._settings.step_timeout):
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
                at = self._commit_store(committed)  # with its history, on a durable store
            except WriteConflict:
                self._abort(TxStatus.FAILED)
                raise
            except BaseException:
                if not self._store_committed():
                    self._transition(TxStatus.ACTIVE)
                    raise
                # Interrupted (KeyboardInterrupt, say) after the store committed: the object
                # says so too; the effects are not delivered here (a durable store's outbox
                # delivers them; on another store they stay counted in `view()`).
                self._committed(committed, time.time(), deliver=False)
                raise
            effects, steps = self._committed(committed, at, deliver=True)
        dispatched, failures = deliver_committed(
            effects,
            self._dispatcher,
            self._store,
            self._id,
            timeout=self._settings.dispatch_timeout,
            on_delivered=self._delivered if effects else None,
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
        self._withdraw(TxStatus.COMMITTED)
        self._events.emit(EventKind.COMMITTED, data=data, at=at)
        return effects, steps

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._status is not TxStatus.ACTIVE:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()


_STILL_RUNNING: Final = "not run: its tool was still running after its timeout"
STEP_DISPATCHED: Final = EventKind.STEP_DISPATCHED
STEP_COMPLETED: Final = EventKind.STEP_COMPLETED


def _drops(timeline: Timeline, target: int) -> bool:
    """Whether a rewind to `target` drops a live step or a staged effect (the failed step's
    own effects included: they are staged before it is recorded)."""
    return any(step >= target for step in timeline.steps) or any(
        effect.step_id >= target for effect in timeline.effects
    )


def _rewind_target(decision: RollbackDecision) -> tuple[int, TxStatus | None]:
    """Where a decision rewinds to, and the final status if it aborts."""
    if decision.strategy is RollbackStrategy.ABORT:
        return 0, TxStatus.FAILED
    if decision.strategy is RollbackStrategy.GLOBAL_RESET:
        return 0, None
    return decision.target_step, None
