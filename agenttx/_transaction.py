"""The interactive transaction: every tool call is a numbered step that can be rolled back.

The step pipeline (docs/protocol.md#the-step-pipeline): check the call, take an O(1) store
snapshot, parse the arguments, find the tool, resolve `${steps.N.path}` references, bound and
check what the tool will receive, run the tool, keep what it registered (undo records, staged
effects) even when it fails, and on success store the output and advance. On failure the error
becomes a Clean Hint, the hint joins the constraints, the rollback controller decides where to
resume, and the transaction rewinds.

Every rewind and abort goes through `_rewind`, in one order: the decision is written to the
durable log first (with a new rewind count, which changes every idempotency key), then the
undo records are compensated newest first, then the store is restored and the timeline
truncated, and the progress written. A crash anywhere in between is finished by recovery,
never undone. Agent-caused failures come back as a `StepResult`; only misuse raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

import attrs

from ._errors import (
    FailedPrecondition,
    IllegalTransition,
    InvalidArgument,
    InvalidTransactionState,
    StepOutOfOrder,
    WriteConflict,
)
from ._hints import CleanHint, add_constraint, clean_error
from ._json import JSONValue, canonical_dumps, check_json, checked_size_bound
from ._limits import DEFAULT_ISOLATION, MAX_AGENT_ID_BYTES, MAX_PAYLOAD_BYTES, over_limit
from ._lineage import lineage_from_steps
from ._refs import resolve_value
from ._results import (
    TRANSITIONS,
    CommitResult,
    ContextEntry,
    RollbackResult,
    StepAttempt,
    StepRecord,
    StepResult,
    StepStatus,
    TransactionView,
    TxStatus,
)
from ._rollback import RollbackController, RollbackDecision, RollbackPolicy, RollbackStrategy
from ._saga import CompensationReport, Dispatcher, SagaLedger, deliver_outbox, dispatch_effects
from ._settings import DEFAULT_STEP_TIMEOUT, Settings
from ._timeline import Pending, Timeline
from ._tools import (
    MAX_TOOL_NAME,
    Call,
    Orphan,
    Outcome,
    ToolContext,
    ToolRegistry,
    ToolSpec,
    arun_tool,
    closed,
    derive_key,
    run_tool,
)
from ._txlog import LiveStep, Progress, Restored, TxLog
from .stores import DurableStore, MemoryStore, Store
from .stores._durable import is_durable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from types import TracebackType

    from typing_extensions import Self

    from ._graph import DependencyGraph
    from ._lineage import LineageGraph

__all__ = ["Transaction"]


@attrs.define(init=False, eq=False, repr=False)
class Transaction:
    """One agent run's tool calls, executed as numbered steps that can be rolled back.

    `tools`: decorated tools, compensations and plain callables, or `{name: callable}`.
    `store`: where state lives (default: a private `MemoryStore`); share one store between
    transactions that should see each other's commits and conflicts. `dispatcher`: delivers
    staged effects after commit (a callable, `{channel: callable}` or `OutboxDispatcher`).
    `isolation`: see docs/protocol.md#isolation-levels.

    Calls are serialized by a lock, so a transaction may be shared between threads; a call
    made while another is running waits for it. Observers (`view`, `history`, `graph`, ...)
    never wait for a tool or a compensation: they take a lock held only for bookkeeping.
    Transactions compare by identity. `with Transaction(...) as tx:` commits when the block
    ends normally and aborts (compensating) when it raises, then re-raises.
    """

    _registry: ToolRegistry
    _store: Store
    _settings: Settings
    _agent_id: str
    _dispatcher: Dispatcher | None
    _ledger: SagaLedger
    _id: str
    _controller: RollbackController
    _status: TxStatus = attrs.field(init=False, default=TxStatus.ACTIVE)
    _timeline: Timeline = attrs.field(init=False, factory=Timeline)
    _constraints: list[str] = attrs.field(init=False, factory=list)
    # Timed-out calls whose worker was still running: their undos wait for them.
    _orphans: list[Orphan] = attrs.field(init=False, factory=list)
    # The durable log, on a `DurableStore`: records, undos, steps and progress survive a crash.
    _log: TxLog | None = attrs.field(init=False, default=None)
    _lock: threading.RLock = attrs.field(init=False, factory=threading.RLock)
    _state_lock: threading.RLock = attrs.field(init=False, factory=threading.RLock)
    _last_activity: float = attrs.field(init=False, factory=time.monotonic)

    def __init__(
        self,
        tools: ToolRegistry | Iterable[ToolSpec] | Mapping[str, Callable[..., Any]] = (),
        *,
        store: Store | None = None,
        policy: RollbackPolicy | None = None,
        agent_id: str = "",
        dispatcher: Dispatcher | None = None,
        step_timeout: float = DEFAULT_STEP_TIMEOUT,
        max_constraints: int = 32,
        compensation_retries: int = 3,
        isolation: Literal["read_committed", "serializable"] = DEFAULT_ISOLATION,
        tx_id: str | None = None,
    ) -> None:
        _check_agent_id(agent_id)
        if store is not None and not isinstance(store, Store):
            raise InvalidArgument(f"store must be a Store, got {type(store).__name__}")
        settings = Settings(
            step_timeout=step_timeout,
            max_constraints=max_constraints,
            compensation_retries=compensation_retries,
            isolation=isolation,
            policy=RollbackPolicy() if policy is None else policy,
        )
        store = MemoryStore() if store is None else store
        tx_id = str(uuid.uuid4()) if tx_id is None else tx_id
        registry = ToolRegistry(tools)
        serializable = settings.isolation == "serializable"
        log = None
        if is_durable(store):  # begin with the record that recovery reads
            log = TxLog.begin(
                store,
                tx_id,
                serializable=serializable,
                agent_id=agent_id,
                policy=settings.policy,
                settings=settings.to_record(),
            )
        else:
            store.begin(tx_id, serializable=serializable)  # checks the id; snapshot 0
        self._setup(registry, store, settings, agent_id, dispatcher, tx_id, log)

    def _setup(
        self,
        registry: ToolRegistry,
        store: Store,
        settings: Settings,
        agent_id: str,
        dispatcher: Dispatcher | None,
        tx_id: str,
        log: TxLog | None,
        controller: RollbackController | None = None,
    ) -> None:
        self.__attrs_init__(
            registry=registry,
            store=store,
            settings=settings,
            agent_id=agent_id,
            dispatcher=dispatcher,
            ledger=SagaLedger(attempts=settings.compensation_retries),
            id=tx_id,
            controller=controller or RollbackController(settings.policy),
        )
        if log is not None:
            self._log = log
            self._ledger.on_compensated = log.forget

    @classmethod
    def _resume(
        cls,
        restored: Restored,
        *,
        registry: ToolRegistry,
        store: DurableStore,
        dispatcher: Dispatcher | None,
    ) -> tuple[Transaction, CompensationReport]:
        """The transaction `restored` from its durable log, ready for its next step.

        The store must already hold it open (`DurableStore.load`). A rewind or abort that was
        under way when the process died is finished (its remaining undo records compensated);
        else a step that was running is rewound. The report says how that went; after an
        abort the transaction has ended.
        """
        progress = restored.progress
        settings = Settings.from_record(restored.settings, restored.policy)
        log = TxLog(store, restored.tx_id, record=restored.record, progress=progress)
        tx = cls.__new__(cls)
        tx._setup(  # noqa: SLF001  (its own class)
            registry,
            store,
            settings,
            restored.agent_id,
            dispatcher,
            restored.tx_id,
            log,
            RollbackController.from_state(restored.policy, progress.controller),
        )
        return tx, tx._adopt(restored)  # noqa: SLF001

    def _adopt(self, restored: Restored) -> CompensationReport:
        progress = restored.progress
        self._constraints = list(progress.constraints)
        self._timeline.adopt(
            restored.steps,
            (e for e in restored.effects if e.step_id < progress.next_step),
            next_step=progress.next_step,
            rewinds=progress.rewinds,
            undone={undo.step_id for undo in restored.undos},
        )
        self._ledger.record(restored.undos)
        with self._lock:
            if progress.rewinding is not None:  # finish it: never bring compensated steps back
                target, final = progress.rewinding
                return self._rewind(target, final=None if final is None else TxStatus(final))
            interrupted = progress.next_step
            if interrupted not in restored.snapshots:  # it had not started: nothing to undo
                return CompensationReport()
            return self._rewind(interrupted)

    # ------------------------------------------------------------------ observers

    @property
    def id(self) -> str:
        """The transaction id."""
        return self._id

    @property
    def agent_id(self) -> str:
        """The agent this transaction belongs to."""
        return self._agent_id

    @property
    def status(self) -> TxStatus:
        """The current status."""
        return self._status

    @property
    def next_step_id(self) -> int:
        """The step id to send next (0 once the transaction has aborted)."""
        return self._timeline.next_step

    @property
    def constraints(self) -> tuple[str, ...]:
        """Every distinct hint so far, oldest first (capped at `max_constraints`)."""
        return tuple(self._constraints)

    @property
    def context(self) -> tuple[ContextEntry, ...]:
        """The `raw_context` of each live step, in step order."""
        with self._state_lock:
            return self._context_entries()

    @property
    def steps(self) -> tuple[StepRecord, ...]:
        """The live steps: succeeded and not rewound, in step order."""
        with self._state_lock:
            return tuple(
                StepRecord(step_id=k, tool_name=s.tool_name, arguments=s.arguments, output=s.output)
                for k, s in self._timeline.steps.items()
            )

    def _context_entries(self) -> tuple[ContextEntry, ...]:
        return tuple(
            ContextEntry(step_id=k, tool_name=s.tool_name, raw_context=s.raw_context)
            for k, s in self._timeline.steps.items()
        )

    @property
    def graph(self) -> DependencyGraph:
        """The dependency graph of the live steps, brought up to date on access."""
        with self._state_lock:
            return self._timeline.graph()

    @property
    def global_resets(self) -> int:
        """How many global resets the controller has made."""
        return self._controller.global_resets

    @property
    def policy(self) -> RollbackPolicy:
        """The rollback policy in force."""
        return self._settings.policy

    @property
    def settings(self) -> Settings:
        """The settings this transaction runs with."""
        return self._settings

    @property
    def tools(self) -> tuple[str, ...]:
        """The registered tool names, sorted."""
        return self._registry.names()

    def lineage(
        self,
        *,
        min_value_length: int = 4,
        match_numbers: bool = False,
        max_depth: int = 6,
        evidence: bool = False,
    ) -> LineageGraph:
        """The value-provenance lineage of the live steps (see `LineageRecorder`).

        Each step is an iteration of its own, so a step links to any earlier step whose output
        held a value it received, whether through a reference or copied by the agent.
        """
        return lineage_from_steps(
            self.steps,
            min_value_length=min_value_length,
            match_numbers=match_numbers,
            max_depth=max_depth,
            evidence=evidence,
        )

    @property
    def history(self) -> tuple[StepAttempt, ...]:
        """Every step executed, in order, with what became of it.

        `status` is "live" (succeeded and kept), "failed", "rewound" (undone by a rewind or an
        abort) or "compensated" (undone, with undo records run). A step sent again appears
        once per attempt.
        """
        with self._state_lock:
            return self._timeline.history.attempts()

    def export_graph(self, format: Literal["dot", "mermaid", "json"] = "dot") -> str:  # noqa: A002
        """The dependency graph with the history of the steps: deterministic DOT, Mermaid or JSON.

        Live steps are the graph's nodes (`s{step}`), linked by their edges; every attempt that
        failed or was undone is an extra node (`a{n}`, `n` its place in `history`), marked
        "failed", "rewound" or "compensated".
        """
        with self._state_lock:
            return self._timeline.history.export(self._timeline.graph(), format)

    def find_root_cause(self, step_id: int, error_key: str) -> int | None:
        """The earliest step that produced the value `step_id` received as `error_key`."""
        with self._state_lock:
            return self._timeline.graph().find_root_cause(step_id, error_key)

    def read(self, key: str) -> JSONValue:
        """State `key` as this transaction sees it (its writes, then committed); None if absent."""
        self._last_activity = time.monotonic()
        if self._store.is_open(self._id):
            text = self._store.get(self._id, key)
        else:
            text = self._store.read_committed(key)
        return None if text is None else json.loads(text)

    @property
    def last_activity(self) -> float:
        """The `time.monotonic()` at which the last call on this transaction began or ended."""
        return self._last_activity

    def view(self) -> TransactionView:
        """A snapshot of the transaction's state; works after it has ended, and during a step."""
        self._last_activity = time.monotonic()
        with self._state_lock:
            return TransactionView(
                tx_id=self._id,
                agent_id=self._agent_id,
                status=self._status,
                next_step_id=self._timeline.next_step,
                steps_completed=len(self._timeline.steps),
                constraints=tuple(self._constraints),
                global_resets=self._controller.global_resets,
                context=self._context_entries(),
                pending_effects=len(self._timeline.effects),
                compensation_failures=tuple(
                    f"{record.description}: {error}" for record, error in self._ledger.failed
                ),
            )

    def __repr__(self) -> str:
        # Never arguments or outputs: they may hold secrets.
        return (
            f"<Transaction {self._id} status={self._status.value} "
            f"next_step={self._timeline.next_step}>"
        )

    # ------------------------------------------------------------------ status

    def _transition(self, target: TxStatus) -> None:
        if target not in TRANSITIONS[self._status]:
            raise IllegalTransition(source=self._status.value, target=target.value)
        with self._state_lock:
            self._status = target

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """Around a call: serialize it, and count its start and its end as activity."""
        self._last_activity = time.monotonic()
        try:
            with self._lock:
                yield
        finally:
            self._last_activity = time.monotonic()

    def _ensure_active(self) -> None:
        if self._status is not TxStatus.ACTIVE:
            raise InvalidTransactionState(tx_id=self._id, status=self._status.value)

    def abort_if_idle(self, idle_timeout: float) -> bool:
        """Abort (compensating) if ACTIVE, not busy, and idle for `idle_timeout` seconds.

        Idleness counts from the end of the last call. Returns whether it aborted. A
        transaction in the middle of a call is skipped, never waited for: this is what an idle
        reaper calls from its own thread.
        """
        if not self._lock.acquire(blocking=False):
            return False
        try:
            idle = time.monotonic() - self._last_activity
            if self._status is not TxStatus.ACTIVE or idle < idle_timeout:
                return False
            self._abort(TxStatus.ROLLED_BACK)
            return True
        finally:
            self._lock.release()

    # ------------------------------------------------------------------ steps

    def execute_step(
        self,
        step_id: int,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        raw_context: str = "",
    ) -> StepResult:
        """Run one tool call as step `step_id`; see the module docstring for the pipeline.

        Raises `InvalidArgument` for a step id that is not an integer, `StepOutOfOrder` unless
        `step_id == next_step_id`, `InvalidTransactionState` unless the transaction is ACTIVE,
        and `InvalidArgument` (or `JSONValueError`) for a tool name outside 1-128 characters,
        arguments that are not JSON or over 1 MiB, or a raw context over 1 MiB; in each case
        nothing changes. Everything the agent got wrong comes back as a failed `StepResult`.
        """
        with self._call():
            parsed = self._check_call(step_id, tool_name, arguments, raw_context)
            self._start(step_id)
            prepared: Call | str | None = None
            try:
                prepared = self._prepare(step_id, tool_name, parsed, raw_context)
                if isinstance(prepared, Call):
                    prepared = self._wait_for_orphans(prepared, self._settings.step_timeout)
                if isinstance(prepared, str):
                    return self._fail(step_id, prepared)
                outcome = run_tool(prepared)
            except BaseException:
                self._abandon(step_id, prepared)
                raise
            self._keep_registered(prepared, outcome)
            error = _error_of(prepared, outcome)
            if error is None:
                return self._succeed(prepared, outcome)
            return self._fail(step_id, error)

    async def aexecute_step(
        self,
        step_id: int,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        raw_context: str = "",
    ) -> StepResult:
        """`execute_step` for async code: async tools and compensations run on the caller's loop.

        While the tool runs the transaction is EXECUTING, so another call made meanwhile raises
        `InvalidTransactionState` instead of waiting.
        """
        with self._call():
            parsed = self._check_call(step_id, tool_name, arguments, raw_context)
            self._start(step_id)
        prepared: Call | str | None = None
        try:
            with self._call():
                prepared = self._prepare(step_id, tool_name, parsed, raw_context)
            if isinstance(prepared, Call) and self._orphans:
                timeout = self._settings.step_timeout
                await asyncio.to_thread(self._wait_orphans, timeout)
                with self._call():
                    prepared = self._wait_for_orphans(prepared, timeout)
            if isinstance(prepared, str):
                return await self._afail(step_id, prepared)
            outcome = await arun_tool(prepared)
        except BaseException:
            with self._call():
                self._abandon(step_id, prepared)
            raise
        with self._call():
            self._keep_registered(prepared, outcome)
            error = _error_of(prepared, outcome)
            if error is None:
                return self._succeed(prepared, outcome)
        return await self._afail(step_id, error)

    def _check_call(
        self, step_id: int, tool_name: str, arguments: Mapping[str, Any] | str, raw_context: str
    ) -> JSONValue | str:
        """Refuse protocol misuse before anything changes; return the arguments to parse."""
        self._ensure_active()
        if isinstance(step_id, bool) or not isinstance(step_id, int):
            raise InvalidArgument(f"step_id must be an integer, got {type(step_id).__name__}")
        if step_id != self._timeline.next_step:
            raise StepOutOfOrder(expected=self._timeline.next_step, got=step_id)
        if not isinstance(tool_name, str) or not 1 <= len(tool_name) <= MAX_TOOL_NAME:
            raise InvalidArgument(f"tool_name must be 1-{MAX_TOOL_NAME} characters")
        if not isinstance(raw_context, str):
            raise InvalidArgument(f"raw_context must be a string, got {type(raw_context).__name__}")
        if over_limit(raw_context):
            raise InvalidArgument(f"raw_context exceeds {MAX_PAYLOAD_BYTES} bytes")
        if isinstance(arguments, str):
            if over_limit(arguments):
                raise InvalidArgument(f"arguments_json exceeds {MAX_PAYLOAD_BYTES} bytes")
            return arguments
        if type(arguments) is dict or isinstance(arguments, Mapping):
            parsed = dict(arguments)
            if _too_big(parsed, what="arguments"):
                raise InvalidArgument(f"arguments exceed {MAX_PAYLOAD_BYTES} bytes")
            return parsed
        raise InvalidArgument(
            f"arguments must be a mapping or JSON text, got {type(arguments).__name__}"
        )

    def _start(self, step_id: int) -> None:
        self._store.snapshot(self._id, step_id)  # first: if the store fails, nothing changed
        self._transition(TxStatus.EXECUTING)
        self._controller.observe_step(step_id)

    def _prepare(
        self, step_id: int, tool_name: str, parsed: JSONValue | str, raw_context: str
    ) -> Call | str:
        """The call ready to run, or the message of an agent-caused failure; never raises
        for agent input (an unexpected error becomes the failure's message)."""
        try:
            return self._resolve(step_id, tool_name, parsed, raw_context)
        except Exception as exc:  # noqa: BLE001  (agent input: a failed step, never a wedge)
            return f"{type(exc).__name__}: {exc}"

    def _resolve(
        self, step_id: int, tool_name: str, parsed: JSONValue | str, raw_context: str
    ) -> Call | str:
        timeline = self._timeline
        if isinstance(parsed, str):
            text = parsed
            try:
                parsed = check_json(json.loads(text) if text.strip() else {}, what="arguments")
            except (ValueError, RecursionError) as exc:
                timeline.pending = Pending(step_id, tool_name, None, ())
                return f"invalid arguments JSON: {exc}"
        tool = self._registry.tools.get(tool_name)
        if tool is None:
            timeline.pending = Pending(step_id, tool_name, parsed, ())
            return (
                f"unknown tool '{tool_name}'; registered tools: {', '.join(self._registry.names())}"
            )
        resolved, dependencies, error = resolve_value(parsed, timeline.outputs, step_id)
        timeline.pending = Pending(step_id, tool_name, resolved, dependencies)
        if error is not None:
            return error
        if _too_big(resolved, what="arguments"):  # references can multiply a small call
            return f"resolved arguments exceed {MAX_PAYLOAD_BYTES} bytes"
        timeout = self._settings.step_timeout
        context = None
        if tool.wants_context:
            generation = timeline.rewinds
            context = ToolContext(
                tx_id=self._id,
                step_id=step_id,
                idempotency_key=lambda: derive_key(
                    self._id, step_id, tool_name, resolved, generation
                ),
                deadline=time.monotonic() + timeout,
                store=self._store,
                compensations=self._registry.compensations,
                log_undo=None if self._log is None else self._log.undo,
            )
        return Call(
            step_id=step_id,
            tool=tool,
            arguments=resolved,
            raw_context=raw_context,
            context=context,
            timeout=timeout,
            log_undo=None if self._log is None else self._log.undo,
        )

    def _keep_registered(self, call: Call, outcome: Outcome) -> None:
        """Keep what the tool registered, whether it succeeded or not (a rewind undoes it).

        The undos of a call still running after its deadline wait for it (`_orphans`).
        """
        if outcome.running is not None:
            self._orphans.append(Orphan(call, outcome.undos, outcome.running))
        elif outcome.undos:
            self._ledger.record(outcome.undos)
        if outcome.effects:
            with self._state_lock:
                self._timeline.stage(outcome.effects)

    def _succeed(self, call: Call, outcome: Outcome) -> StepResult:
        step_id = call.step_id
        pending = self._timeline.pending
        assert pending is not None  # set by _resolve for this step
        step = LiveStep(
            call.tool.name, call.arguments, outcome.output, call.raw_context, pending.dependencies
        )
        if self._log is not None:
            try:
                self._log.step(step_id, step, outcome.effects)
            except BaseException:  # not durable: the step did not happen
                self._rewind(step_id)
                raise
        with self._state_lock:
            self._timeline.append(step_id, step, had_undos=bool(outcome.undos))
        self._transition(TxStatus.ACTIVE)
        return StepResult(
            status=StepStatus.SUCCESS,
            step_id=step_id,
            next_step_id=self._timeline.next_step,
            output=outcome.output,
            constraints=tuple(self._constraints),
        )

    def _abandon(self, step_id: int, prepared: Call | str | None) -> None:
        """Undo a step interrupted by a BaseException and return to ACTIVE at the same step."""
        if isinstance(prepared, Call):
            undos, _ = closed(prepared.context)  # its staged effects are dropped
            self._ledger.record(undos)
        if self._status is TxStatus.EXECUTING:
            self._rewind(step_id)

    # ------------------------------------------------------------------ orphaned calls

    def _wait_orphans(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for orphan in list(self._orphans):
            orphan.running.wait(deadline - time.monotonic())

    def _settle_orphans(self, wait: float) -> list[Orphan]:
        """Compensate the undos of the timed-out calls that have finished; return the others."""
        self._wait_orphans(wait)
        still = [orphan for orphan in self._orphans if not orphan.running.wait(0.0)]
        done = [orphan for orphan in self._orphans if orphan not in still]
        self._orphans = still
        for orphan in reversed(done):
            self._ledger.compensate(
                list(reversed(orphan.finished_undos())), self._registry.compensations
            )
        return still

    def _wait_for_orphans(self, call: Call, wait: float) -> Call | str:
        """The call, unless an earlier timed-out call is still running: its effect may land."""
        if not self._orphans or not self._settle_orphans(wait):
            return call
        return (
            f"tool '{call.tool.name}' timed out after {round(wait * 1000)} ms waiting for an "
            "earlier call that is still running after its own timeout"
        )

    def _keep_orphans(self, wait: float) -> None:
        """Before an abort: settle what has finished, keep the rest as failed, for recovery."""
        for orphan in self._settle_orphans(wait):
            self._ledger.keep_failed(
                orphan.undos, "not run: its tool was still running after its timeout"
            )
        self._orphans.clear()

    # ------------------------------------------------------------------ failure and rewind

    def _decide(self, step_id: int, error: str) -> tuple[RollbackDecision, CleanHint]:
        hint = clean_error(error)
        with self._state_lock:
            add_constraint(self._constraints, hint.text, self._settings.max_constraints)
            self._timeline.failed()
            graph = self._timeline.graph()
        decision = self._controller.decide(
            step_id, hint.key, graph.find_root_cause, transient=hint.category.transient
        )
        return decision, hint

    def _fail(self, step_id: int, error: str) -> StepResult:
        decision, hint = self._decide(step_id, error)
        started = time.perf_counter()
        target, final = _rewind_target(decision)
        report = self._rewind(target, final=final)
        return self._failed(step_id, decision, hint, error, report, started)

    async def _afail(self, step_id: int, error: str) -> StepResult:
        with self._call():
            decision, hint = self._decide(step_id, error)
            target, final = _rewind_target(decision)
            records = self._begin_rewind(target, final)
        started = time.perf_counter()
        try:
            report = await self._ledger.acompensate(records, self._registry.compensations)
        except BaseException as exc:
            with self._call():
                self._fail_hard(run_compensations=isinstance(exc, Exception))
            raise
        with self._call(), self._ending_if_interrupted():
            self._finish_rewind(target, final)
        return self._failed(step_id, decision, hint, error, report, started)

    def _failed(
        self,
        step_id: int,
        decision: RollbackDecision,
        hint: CleanHint,
        error: str,
        report: CompensationReport,
        started: float,
    ) -> StepResult:
        strategy = decision.strategy
        aborted = strategy is RollbackStrategy.ABORT
        return StepResult(
            status=StepStatus.FAILED if aborted else StepStatus.ROLLBACK_TRIGGERED,
            step_id=step_id,
            next_step_id=self._timeline.next_step,
            hint=hint,
            error=error,
            strategy=strategy,
            rollback_to_step=0 if aborted else decision.target_step,
            constraints=tuple(self._constraints),
            context_reset=aborted or strategy is RollbackStrategy.GLOBAL_RESET,
            abort_reason=decision.reason if aborted else None,
            compensation_errors=report.failures,
            rollback_latency_ms=(time.perf_counter() - started) * 1000,
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
            self._timeline.rewinds += 1  # every later idempotency key differs
            self._log_progress(rewinding=(target, None if final is None else final.value))
            if final is None:
                return self._ledger.take_from(target)
            self._keep_orphans(0.0)  # an abort cannot wait for what is still running
            return self._ledger.take_from(0)

    def _finish_rewind(self, target: int, final: TxStatus | None) -> None:
        if final is not None:
            with self._state_lock:
                self._timeline.clear()
            self._discard(final)
            self._transition(final)
            return
        self._store.restore(self._id, target)
        with self._state_lock:
            self._timeline.truncate(target)
        self._log_progress()
        self._transition(TxStatus.ACTIVE)

    @contextlib.contextmanager
    def _ending_if_interrupted(self) -> Iterator[None]:
        """Around a rewind: if it cannot finish, end the transaction FAILED, then re-raise.

        A store that fails to restore, or a compensation interrupted by a KeyboardInterrupt or a
        cancellation, leaves a state that cannot be trusted: after an ordinary exception the
        remaining undo records still run; after an interrupt they are kept as failed, not run,
        and reported by `view()`.
        """
        try:
            yield
        except BaseException as exc:
            self._fail_hard(run_compensations=isinstance(exc, Exception))
            raise

    def _fail_hard(self, *, run_compensations: bool) -> None:
        if self._status in (TxStatus.FAILED, TxStatus.ROLLED_BACK, TxStatus.COMMITTED):
            return
        remaining = self._ledger.take_from(0)
        if run_compensations:
            self._ledger.compensate(remaining, self._registry.compensations)
        else:
            self._ledger.keep_failed(remaining, "not run: the transaction was interrupted")
        self._keep_orphans(0.0)
        with contextlib.suppress(Exception):  # the original error is the one to report
            self._discard(TxStatus.FAILED)
        with self._state_lock:
            self._timeline.clear()
        if self._status is not TxStatus.ROLLING_BACK:
            self._transition(TxStatus.ROLLING_BACK)
        self._transition(TxStatus.FAILED)

    def _log_progress(self, rewinding: tuple[int, str | None] | None = None) -> None:
        if self._log is not None:
            self._log.progress(
                Progress(
                    next_step=self._timeline.next_step,
                    controller=self._controller.state(),
                    constraints=tuple(self._constraints),
                    rewinds=self._timeline.rewinds,
                    rewinding=rewinding,
                )
            )

    def _discard(self, final: TxStatus) -> None:
        """End the store's side; a durable store keeps undo records that failed, for recovery."""
        if self._log is not None and self._ledger.failed:
            self._log.end_keeping_undos(final.value)
        else:
            self._store.discard(self._id)

    # ------------------------------------------------------------------ rollback and commit

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
            if not to_step:
                report = self._abort(TxStatus.ROLLED_BACK)
                return RollbackResult(
                    aborted=True,
                    next_step_id=0,
                    compensations_run=report.succeeded,
                    compensation_errors=report.failures,
                )
            if not 0 < to_step < self._timeline.next_step:
                raise InvalidArgument(
                    f"to_step {to_step} must be lower than the next step {self.next_step_id}"
                )
            report = self._rewind(to_step)
            return RollbackResult(
                aborted=False,
                next_step_id=to_step,
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
        is compensated, ends FAILED, and `WriteConflict` (or its subclass `ReadConflict`),
        naming the key, is raised. Dispatch errors are reported in the result; they never undo
        the commit. Nothing is compensated after a commit. Raises `FailedPrecondition`, and
        changes nothing, while a timed-out tool call is still running (waited for up to the
        step timeout): its effect may still land, and its undo could not run after a commit.

        On a `DurableStore` the effects go into its outbox in the same atomic commit and are
        delivered from there (a failure is retried later by `Engine.dispatch_pending`), so a
        crash between the commit and the delivery loses none of them.
        """
        with self._call():
            self._ensure_active()
            if self._orphans and self._settle_orphans(self._settings.step_timeout):
                raise FailedPrecondition(
                    f"transaction `{self._id}`: a timed-out tool call is still running and its "
                    "effect may still land; commit again later, or roll back"
                )
            self._transition(TxStatus.COMMITTING)
            try:
                self._store.commit(self._id)
            except WriteConflict:
                self._abort(TxStatus.FAILED)
                raise
            except BaseException:
                self._transition(TxStatus.ACTIVE)
                raise
            self._ledger.forget_all()
            with self._state_lock:
                effects = tuple(self._timeline.effects)
                self._timeline.effects.clear()
                steps = len(self._timeline.steps)
            self._transition(TxStatus.COMMITTED)
        if self._log is None:
            dispatched, errors = dispatch_effects(effects, self._dispatcher)
        elif self._dispatcher is None or not effects:
            dispatched, errors = 0, ()  # they wait in the outbox for `Engine.dispatch_pending`
        else:  # from the outbox, where the commit put them: a crash now loses nothing
            dispatched, errors = deliver_outbox(
                cast("DurableStore", self._store), self._dispatcher, tx_id=self._id
            )
        return CommitResult(
            steps_committed=steps,
            effects_dispatched=dispatched,
            dispatch_errors=errors,
            effects=effects,
        )

    # ------------------------------------------------------------------ context manager

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


def _rewind_target(decision: RollbackDecision) -> tuple[int, TxStatus | None]:
    """Where a decision rewinds to, and the final status if it aborts."""
    if decision.strategy is RollbackStrategy.ABORT:
        return 0, TxStatus.FAILED
    if decision.strategy is RollbackStrategy.GLOBAL_RESET:
        return 0, None
    return decision.target_step, None


def _check_agent_id(agent_id: object) -> None:
    if not isinstance(agent_id, str):
        raise InvalidArgument(f"agent_id must be a string, got {type(agent_id).__name__}")
    try:
        size = len(agent_id.encode())
    except UnicodeEncodeError:
        raise InvalidArgument("agent_id must be valid Unicode (it has a lone surrogate)") from None
    if size > MAX_AGENT_ID_BYTES:
        raise InvalidArgument(f"agent_id exceeds {MAX_AGENT_ID_BYTES} bytes")


def _error_of(call: Call, outcome: Outcome) -> str | None:
    """Why the step failed: the tool's error, or an output over 1 MiB (nothing is stored)."""
    if outcome.error is not None:
        return outcome.error
    if _too_big(outcome.output, what="output"):  # its effect happened: its undo is kept
        return f"the output of tool '{call.tool.name}' exceeds {MAX_PAYLOAD_BYTES} bytes"
    return None


def _too_big(value: JSONValue, *, what: str) -> bool:
    """Whether `value`'s canonical JSON exceeds 1 MiB; serializes only when the bound is unsure.

    The size bound over-counts at most about 8.3 times (a float `0.0`, counted as 32 bytes),
    so a bound past ten times the limit is over it for sure, and never needs the text.
    """
    bound = checked_size_bound(value, what=what)
    if bound <= MAX_PAYLOAD_BYTES:
        return False
    if bound > 10 * MAX_PAYLOAD_BYTES:
        return True
    return len(canonical_dumps(value).encode()) > MAX_PAYLOAD_BYTES
