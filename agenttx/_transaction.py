"""The interactive transaction: every tool call is a numbered step that can be rolled back.

The step pipeline (the reference engine's, spec section 2.5): check the status and the step id,
take an O(1) store snapshot, parse the arguments, find the tool, resolve `${steps.N.path}`
references, add the step to the dependency graph, run the tool, keep what it registered (undo
records, staged effects) even when it fails, and on success store the output and advance.
On failure the error becomes a Clean Hint, the hint joins the constraints, the rollback
controller decides where to resume, and the transaction rewinds: compensations newest first,
staged effects dropped, the store restored, steps, context and graph truncated.

Agent-caused failures come back as a `StepResult`; only misuse of the protocol raises.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

import attrs

from ._calls import Call, Outcome, arun_tool, closed, run_tool
from ._errors import (
    IllegalTransition,
    InvalidArgument,
    InvalidTransactionState,
    StepOutOfOrder,
    WriteConflict,
)
from ._graph import DependencyGraph
from ._hints import CleanHint, add_constraint, clean_error
from ._history import StepHistory
from ._json import JSONValue, canonical_dumps, check_json, checked_size_bound
from ._limits import (
    MAX_AGENT_ID_BYTES,
    MAX_PAYLOAD_BYTES,
    Isolation,
    check_isolation,
    is_positive_int,
    is_positive_number,
    over_limit,
)
from ._lineage_sources import lineage_from_steps
from ._policy import RollbackController, RollbackDecision, RollbackPolicy, RollbackStrategy
from ._refs import Dependency, resolve_value
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
from ._saga import (
    CompensationReport,
    Dispatcher,
    SagaLedger,
    deliver_outbox,
    dispatch_effects,
)
from ._tools import (
    MAX_TOOL_NAME,
    StagedEffect,
    ToolContext,
    ToolRegistry,
    ToolSpec,
    derive_key,
)
from ._txlog import LiveStep, Progress, Restored, TxLog, add_live_steps
from .stores import DurableStore, MemoryStore, Store
from .stores._durable import is_durable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from types import TracebackType

    from typing_extensions import Self

    from ._lineage import LineageGraph

__all__ = ["Transaction"]


@attrs.define(init=False)
class Transaction:
    """One agent run's tool calls, executed as numbered steps that can be rolled back.

    `tools`: decorated tools, compensations and plain callables, or `{name: callable}`.
    `store`: where state lives (default: a private `MemoryStore`); share one store between
    transactions that should see each other's commits and conflicts. `dispatcher`: delivers
    staged effects after commit (a callable, `{channel: callable}` or `OutboxDispatcher`).

    `isolation`: "no_lost_updates" (the default: a key's base version is fixed when the
    transaction first reads or writes it, so commit raises `WriteConflict` if another
    transaction committed a key it wrote since then; write skew is possible), "read_committed"
    (the reference's: the base is fixed at the first write, so a read-modify-write may lose an
    update) or "serializable" (commit also checks that no key this transaction read from
    committed state has been committed since, raising `ReadConflict`; with commits serialized
    by the store, the committed history is then equivalent to running the transactions one at
    a time in commit order). Reads by steps that were later rewound still count: a conflict
    may be reported that a finer check would not, never the reverse.

    Calls are serialized by a lock, so a transaction may be shared between threads; a call
    made while another is running waits for it. `with Transaction(...) as tx:` commits when
    the block ends normally and aborts (compensating) when it raises, then re-raises.
    """

    _registry: ToolRegistry
    _store: Store
    _policy: RollbackPolicy
    _agent_id: str
    _dispatcher: Dispatcher | None
    _step_timeout: float
    _max_constraints: int
    _ledger: SagaLedger
    _id: str
    _controller: RollbackController = attrs.field(init=False)
    _status: TxStatus = attrs.field(init=False, default=TxStatus.ACTIVE)
    _next_step: int = attrs.field(init=False, default=1)
    _steps: dict[int, LiveStep] = attrs.field(init=False, factory=dict)
    _outputs: dict[int, JSONValue] = attrs.field(init=False, factory=dict)
    _constraints: list[str] = attrs.field(init=False, factory=list)
    _effects: list[StagedEffect] = attrs.field(init=False, factory=list)
    # The graph is brought up to date only when it is needed (a failure, `graph`,
    # `find_root_cause`): successful steps only record their dependencies, so a transaction that
    # never fails never pays for it. `_graph_upto` is the last live step already in the graph;
    # `_pending` is the node of the step being executed, added if that step fails.
    _graph: DependencyGraph = attrs.field(init=False, factory=DependencyGraph)
    _graph_upto: int = attrs.field(init=False, default=0)
    _pending: tuple[int, str, JSONValue, tuple[Dependency, ...]] | None = attrs.field(
        init=False, default=None
    )
    _rewinds: int = attrs.field(init=False, default=0)
    # Every step executed, in order: live, failed, rewound or compensated (see `history`).
    _history: StepHistory = attrs.field(init=False, factory=StepHistory)
    # The durable log, on a `DurableStore`: records, undos, steps and progress survive a crash.
    _log: TxLog | None = attrs.field(init=False, default=None)
    _lock: threading.RLock = attrs.field(init=False, factory=threading.RLock)
    _last_activity: float = attrs.field(init=False, factory=time.monotonic)

    def __init__(
        self,
        tools: ToolRegistry | Iterable[ToolSpec] | Mapping[str, Callable[..., Any]] = (),
        *,
        store: Store | None = None,
        policy: RollbackPolicy | None = None,
        agent_id: str = "",
        dispatcher: Dispatcher | None = None,
        step_timeout: float = 30.0,
        max_constraints: int = 32,
        compensation_retries: int = 3,
        isolation: Isolation = "no_lost_updates",
        tx_id: str | None = None,
    ) -> None:
        if not isinstance(agent_id, str) or len(agent_id.encode()) > MAX_AGENT_ID_BYTES:
            raise InvalidArgument("agent_id exceeds 256 bytes")
        if policy is not None and not isinstance(policy, RollbackPolicy):
            raise InvalidArgument(f"policy must be a RollbackPolicy, got {policy!r}")
        if not is_positive_number(step_timeout):
            raise InvalidArgument(f"step_timeout must be a number > 0, got {step_timeout!r}")
        if not is_positive_int(max_constraints):
            raise InvalidArgument(
                f"max_constraints must be an integer > 0, got {max_constraints!r}"
            )
        store = MemoryStore() if store is None else store
        tx_id = str(uuid.uuid4()) if tx_id is None else tx_id
        policy = policy or RollbackPolicy()
        registry = ToolRegistry(tools)
        ledger = SagaLedger(attempts=compensation_retries)
        check_isolation(isolation)
        log = None
        if is_durable(store):  # begin with the record that recovery reads
            settings: dict[str, JSONValue] = {
                "isolation": isolation,
                "step_timeout": float(step_timeout),
                "max_constraints": max_constraints,
                "compensation_retries": ledger.attempts,
            }
            log = TxLog.begin(
                store,
                tx_id,
                isolation=isolation,
                agent_id=agent_id,
                policy=policy,
                settings=settings,
            )
        else:
            store.begin(tx_id, isolation=isolation)  # checks the id; snapshot 0
        self.__attrs_init__(
            registry=registry,
            store=store,
            policy=policy,
            agent_id=agent_id,
            dispatcher=dispatcher,
            step_timeout=float(step_timeout),
            max_constraints=max_constraints,
            ledger=ledger,
            id=tx_id,
        )
        self._controller = RollbackController(self._policy)
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

        The store must already hold it open (`DurableStore.load`). A step that was running
        when the process died is rewound first: the undo records it registered are
        compensated, newest first, and its state writes reverted; the report says how that
        went.
        """
        settings = restored.settings
        ledger = SagaLedger(attempts=cast("int", settings["compensation_retries"]))
        tx = cls.__new__(cls)
        tx.__attrs_init__(
            registry=registry,
            store=store,
            policy=restored.policy,
            agent_id=restored.agent_id,
            dispatcher=dispatcher,
            step_timeout=float(cast("float", settings["step_timeout"])),
            max_constraints=cast("int", settings["max_constraints"]),
            ledger=ledger,
            id=restored.tx_id,
        )
        report = tx._adopt(restored, store)  # noqa: SLF001  (its own class)
        return tx, report

    def _adopt(self, restored: Restored, store: DurableStore) -> CompensationReport:
        progress = restored.progress
        self._controller = RollbackController.from_state(restored.policy, progress.controller)
        self._steps = dict(restored.steps)
        self._outputs = {step_id: step.output for step_id, step in restored.steps.items()}
        self._constraints = list(progress.constraints)
        self._effects = [e for e in restored.effects if e.step_id < progress.next_step]
        self._rewinds = progress.rewinds
        self._next_step = progress.next_step
        self._log = TxLog(store, self._id, record=restored.record, progress=progress)
        self._ledger.on_compensated = self._log.forget
        self._ledger.record(restored.undos)
        undone = {undo.step_id for undo in restored.undos}
        for step_id, step in sorted(restored.steps.items()):
            self._history.succeeded(step_id, step.tool_name, had_undos=step_id in undone)
        interrupted = progress.next_step
        if interrupted not in restored.snapshots:  # it had not started: nothing to undo
            return CompensationReport()
        with self._lock:
            return self._rewind_step(interrupted)

    # ------------------------------------------------------------------ properties

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
        return self._next_step

    @property
    def constraints(self) -> tuple[str, ...]:
        """Every distinct hint so far, oldest first (capped at `max_constraints`)."""
        return tuple(self._constraints)

    @property
    def context(self) -> tuple[ContextEntry, ...]:
        """The `raw_context` of each live step, in step order."""
        return self._context_entries()

    @property
    def steps(self) -> tuple[StepRecord, ...]:
        """The live steps: succeeded and not rewound, in step order."""
        return tuple(
            StepRecord(step_id=k, tool_name=s.tool_name, arguments=s.arguments, output=s.output)
            for k, s in self._steps.items()
        )

    def _context_entries(self) -> tuple[ContextEntry, ...]:
        return tuple(
            ContextEntry(step_id=k, tool_name=s.tool_name, raw_context=s.raw_context)
            for k, s in self._steps.items()
        )

    @property
    def graph(self) -> DependencyGraph:
        """The dependency graph of the live steps, brought up to date on access."""
        with self._lock:
            return self._synced_graph()

    @property
    def global_resets(self) -> int:
        """How many global resets the controller has made."""
        return self._controller.global_resets

    @property
    def policy(self) -> RollbackPolicy:
        """The rollback policy in force."""
        return self._policy

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
        with self._lock:
            steps = self.steps
        return lineage_from_steps(
            steps,
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
        with self._lock:
            return self._history.attempts()

    def export_graph(self, format: Literal["dot", "mermaid", "json"] = "dot") -> str:  # noqa: A002
        """The dependency graph with the history of the steps: deterministic DOT, Mermaid or JSON.

        Live steps are the graph's nodes (`s{step}`), linked by their edges; every attempt that
        failed or was undone is an extra node (`a{n}`, `n` its place in `history`), marked
        "failed", "rewound" or "compensated".
        """
        with self._lock:
            return self._history.export(self._synced_graph(), format)

    def find_root_cause(self, step_id: int, error_key: str) -> int | None:
        """The earliest step that produced the value `step_id` received as `error_key`."""
        with self._lock:
            return self._synced_graph().find_root_cause(step_id, error_key)

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
        """The `time.monotonic()` of the last call on this transaction (any call counts)."""
        return self._last_activity

    def abort_if_idle(self, idle_timeout: float) -> bool:
        """Abort (compensating) if ACTIVE, not busy, and idle for `idle_timeout` seconds.

        Returns whether it aborted. A transaction in the middle of a call is skipped, never
        waited for: this is what an idle reaper calls from its own thread.
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

    def view(self) -> TransactionView:
        """A snapshot of the transaction's state; works after it has ended."""
        self._last_activity = time.monotonic()
        with self._lock:
            return TransactionView(
                tx_id=self._id,
                agent_id=self._agent_id,
                status=self._status,
                next_step_id=self._next_step,
                steps_completed=len(self._steps),
                constraints=tuple(self._constraints),
                global_resets=self._controller.global_resets,
                context=self._context_entries(),
                pending_effects=len(self._effects),
                compensation_failures=tuple(
                    f"{record.description}: {error}" for record, error in self._ledger.failed
                ),
            )

    # ------------------------------------------------------------------ status

    def _transition(self, target: TxStatus) -> None:
        if target not in TRANSITIONS[self._status]:
            raise IllegalTransition(source=self._status.value, target=target.value)
        self._status = target

    def _ensure_active(self) -> None:
        self._last_activity = time.monotonic()  # every call counts as activity
        if self._status is not TxStatus.ACTIVE:
            raise InvalidTransactionState(tx_id=self._id, status=self._status.value)

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

        Raises `StepOutOfOrder` unless `step_id == next_step_id`, `InvalidTransactionState`
        unless the transaction is ACTIVE, and `InvalidArgument` (or `JSONValueError`) for a
        tool name outside 1-128 characters, arguments that are not JSON or over 1 MiB, or a
        raw context over 1 MiB; in each case nothing changes. Everything the agent got wrong
        comes back as a failed `StepResult`.
        """
        with self._lock:
            prepared = self._prepare(step_id, tool_name, arguments, raw_context)
            if isinstance(prepared, str):
                return self._fail(step_id, prepared)
            try:
                outcome = run_tool(prepared)
            except BaseException:
                self._abandon_step(prepared)
                raise
            self._keep_registered(outcome)
            if outcome.error is None:
                return self._succeed(prepared, outcome)
            return self._fail(step_id, outcome.error)

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
        with self._lock:
            prepared = self._prepare(step_id, tool_name, arguments, raw_context)
        if isinstance(prepared, str):
            return await self._afail(step_id, prepared)
        try:
            outcome = await arun_tool(prepared)
        except BaseException:
            with self._lock:
                self._abandon_step(prepared)
            raise
        with self._lock:
            self._keep_registered(outcome)
            if outcome.error is None:
                return self._succeed(prepared, outcome)
        return await self._afail(step_id, outcome.error)

    def _prepare(
        self, step_id: int, tool_name: str, arguments: Mapping[str, Any] | str, raw_context: str
    ) -> Call | str:
        """Check the call; return it ready to run, or the message of an agent-caused failure.

        Raises for protocol misuse before changing anything.
        """
        self._ensure_active()
        if isinstance(step_id, bool) or not isinstance(step_id, int) or step_id != self._next_step:
            raise StepOutOfOrder(expected=self._next_step, got=step_id)
        if not isinstance(tool_name, str) or not 1 <= len(tool_name) <= MAX_TOOL_NAME:
            raise InvalidArgument(f"tool_name must be 1-{MAX_TOOL_NAME} characters")
        if not isinstance(raw_context, str):
            raise InvalidArgument(f"raw_context must be a string, got {type(raw_context).__name__}")
        if over_limit(raw_context):
            raise InvalidArgument(f"raw_context exceeds {MAX_PAYLOAD_BYTES} bytes")
        if isinstance(arguments, str):
            if over_limit(arguments):
                raise InvalidArgument(f"arguments_json exceeds {MAX_PAYLOAD_BYTES} bytes")
            parsed: JSONValue | str = arguments
        elif type(arguments) is dict or isinstance(arguments, Mapping):
            parsed = dict(arguments)
            if (
                checked_size_bound(parsed, what="arguments") > MAX_PAYLOAD_BYTES
                and len(canonical_dumps(parsed).encode()) > MAX_PAYLOAD_BYTES
            ):
                raise InvalidArgument(f"arguments exceed {MAX_PAYLOAD_BYTES} bytes")
        else:
            raise InvalidArgument(
                f"arguments must be a mapping or JSON text, got {type(arguments).__name__}"
            )

        self._store.snapshot(self._id, step_id)  # first: if the store fails, nothing changed
        self._transition(TxStatus.EXECUTING)
        self._controller.observe_step(step_id)

        if isinstance(parsed, str):
            text = parsed
            try:
                parsed = check_json(json.loads(text) if text.strip() else {}, what="arguments")
            except (ValueError, RecursionError) as exc:
                self._pending = (step_id, tool_name, None, ())
                return f"invalid arguments JSON: {exc}"
        tool = self._registry.tools.get(tool_name)
        if tool is None:
            self._pending = (step_id, tool_name, parsed, ())
            return (
                f"unknown tool '{tool_name}'; registered tools: {', '.join(self._registry.names())}"
            )
        resolved, dependencies, error = resolve_value(parsed, self._outputs, step_id)
        self._pending = (step_id, tool_name, resolved, dependencies)
        if error is not None:
            return error
        log_undo = None if self._log is None else self._log.undo
        context = None
        if tool.wants_context:
            generation = self._rewinds
            context = ToolContext(
                tx_id=self._id,
                step_id=step_id,
                idempotency_key=lambda: derive_key(
                    self._id, step_id, tool_name, resolved, generation
                ),
                deadline=time.monotonic() + self._step_timeout,
                store=self._store,
                compensations=self._registry.compensations,
                log_undo=log_undo,
            )
        return Call(
            step_id=step_id,
            tool=tool,
            arguments=resolved,
            raw_context=raw_context,
            context=context,
            timeout=self._step_timeout,
            log_undo=log_undo,
        )

    def _abandon_step(self, call: Call) -> None:
        """Undo a step interrupted by a BaseException and return to ACTIVE at the same step."""
        undos, _ = closed(call.context)  # its staged effects are dropped
        self._ledger.record(undos)
        self._rewind_step(call.step_id)

    def _rewind_step(self, step_id: int) -> CompensationReport:
        """Compensate and rewind the step being executed, back to ACTIVE at the same step."""
        self._transition(TxStatus.ROLLING_BACK)
        with self._ending_if_interrupted():
            records = self._ledger.take_from(step_id)
            report = self._ledger.compensate(records, self._registry.compensations)
            self._rewind_state(step_id)
        self._transition(TxStatus.ACTIVE)
        return report

    @contextlib.contextmanager
    def _ending_if_interrupted(self) -> Iterator[None]:
        """Around a rewind: if it cannot finish, end the transaction FAILED, then re-raise.

        A store that fails to restore, or a compensation interrupted by a KeyboardInterrupt or a
        cancellation, leaves a state that cannot be trusted. The reference then aborts (its
        `fail_hard`): after an ordinary exception the remaining undo records still run; after
        an interrupt they are kept as failed, not run, and reported by `view()`.
        """
        try:
            yield
        except BaseException as exc:
            self._fail_hard(run_compensations=isinstance(exc, Exception))
            raise

    def _fail_hard(self, *, run_compensations: bool) -> None:
        remaining = self._ledger.take_from(0)
        if run_compensations:
            self._ledger.compensate(remaining, self._registry.compensations)
        else:
            self._ledger.keep_failed(remaining, "not run: the transaction was interrupted")
        with contextlib.suppress(Exception):  # the original error is the one to report
            self._discard(TxStatus.FAILED)
        self._effects.clear()
        self._history.undo_from(0)
        self._steps.clear()
        self._outputs.clear()
        self._graph.clear()
        self._graph_upto = 0
        self._pending = None
        self._next_step = 0
        if self._status is not TxStatus.ROLLING_BACK:
            self._transition(TxStatus.ROLLING_BACK)
        self._transition(TxStatus.FAILED)

    def _keep_registered(self, outcome: Outcome) -> None:
        """Keep what the tool registered, whether it succeeded or not (a rewind undoes it)."""
        if outcome.undos:
            self._ledger.record(outcome.undos)
        if outcome.effects:
            self._effects.extend(outcome.effects)

    def _succeed(self, call: Call, outcome: Outcome) -> StepResult:
        step_id = call.step_id
        output = outcome.output
        assert self._pending is not None  # set by _prepare for this step
        step = LiveStep(call.tool.name, call.arguments, output, call.raw_context, self._pending[3])
        if self._log is not None:
            try:
                self._log.step(step_id, step, outcome.effects)
            except BaseException:  # not durable: the step did not happen
                self._rewind_step(step_id)
                raise
        self._steps[step_id] = step
        self._outputs[step_id] = output
        self._history.succeeded(step_id, call.tool.name, had_undos=bool(outcome.undos))
        self._pending = None
        self._next_step = step_id + 1
        self._transition(TxStatus.ACTIVE)
        return StepResult(
            status=StepStatus.SUCCESS,
            step_id=step_id,
            next_step_id=self._next_step,
            output=output,
            constraints=tuple(self._constraints),
        )

    # ------------------------------------------------------------------ failure and rewind

    def _synced_graph(self) -> DependencyGraph:
        """The graph, with the live steps added since it was last needed."""
        add_live_steps(self._graph, self._steps, self._graph_upto + 1)
        self._graph_upto = max(self._graph_upto, self._next_step - 1)
        return self._graph

    def _decide(self, step_id: int, error: str) -> tuple[RollbackDecision, CleanHint]:
        hint = clean_error(error)
        add_constraint(self._constraints, hint.text, self._max_constraints)
        graph = self._synced_graph()
        if self._pending is not None:  # the failed step's node, for the root-cause walk
            pending_step, tool_name, inputs, dependencies = self._pending
            graph.add_step(pending_step, tool_name, inputs, dependencies, validate=False)
            self._pending = None
            self._history.failed(step_id, tool_name)
        decision = self._controller.decide(
            step_id, hint.key, graph.find_root_cause, transient=hint.category.transient
        )
        self._transition(TxStatus.ROLLING_BACK)
        return decision, hint

    def _fail(self, step_id: int, error: str) -> StepResult:
        decision, hint = self._decide(step_id, error)
        started = time.perf_counter()
        with self._ending_if_interrupted():
            report = self._ledger.compensate(
                self._ledger.take_from(_rewind_target(decision)), self._registry.compensations
            )
            return self._apply(
                step_id, decision, hint=hint, error=error, report=report, started=started
            )

    async def _afail(self, step_id: int, error: str) -> StepResult:
        with self._lock:
            decision, hint = self._decide(step_id, error)
            records = self._ledger.take_from(_rewind_target(decision))
        started = time.perf_counter()
        try:
            report = await self._ledger.acompensate(records, self._registry.compensations)
        except BaseException as exc:
            with self._lock:
                self._fail_hard(run_compensations=isinstance(exc, Exception))
            raise
        with self._lock, self._ending_if_interrupted():
            return self._apply(
                step_id, decision, hint=hint, error=error, report=report, started=started
            )

    def _apply(
        self,
        step_id: int,
        decision: RollbackDecision,
        *,
        hint: CleanHint,
        error: str,
        report: CompensationReport,
        started: float,
    ) -> StepResult:
        """Finish the rewind (or abort) the decision asked for, after its compensations ran."""
        strategy = decision.strategy
        if strategy is RollbackStrategy.ABORT:
            self._end(TxStatus.FAILED)
            status, target, reset = StepStatus.FAILED, 0, True
        elif strategy is RollbackStrategy.GLOBAL_RESET:
            self._rewind_state(0)
            self._log_progress()
            self._transition(TxStatus.ACTIVE)
            status, target, reset = StepStatus.ROLLBACK_TRIGGERED, 0, True
        else:
            target = decision.target_step
            self._rewind_state(target)
            self._log_progress()
            self._transition(TxStatus.ACTIVE)
            status, reset = StepStatus.ROLLBACK_TRIGGERED, False
        return StepResult(
            status=status,
            step_id=step_id,
            next_step_id=self._next_step,
            hint=hint,
            error=error,
            strategy=strategy,
            rollback_to_step=target,
            constraints=tuple(self._constraints),
            context_reset=reset,
            abort_reason=decision.reason if strategy is RollbackStrategy.ABORT else None,
            compensation_errors=report.failures,
            rollback_latency_ms=(time.perf_counter() - started) * 1000,
        )

    def _rewind_state(self, target: int) -> None:
        """After compensation: drop effects, restore the store, truncate to before `target`."""
        self._rewinds += 1
        self._effects = [effect for effect in self._effects if effect.step_id < target]
        self._store.restore(self._id, target)
        for step in [s for s in self._steps if s >= target]:
            del self._steps[step]
            del self._outputs[step]
        self._history.undo_from(target)
        self._graph.truncate_from(max(target, 1))
        self._graph_upto = min(self._graph_upto, max(target, 1) - 1)
        self._pending = None
        self._next_step = max(target, 1)

    def _log_progress(self) -> None:
        if self._log is not None:
            self._log.progress(
                Progress(
                    next_step=self._next_step,
                    controller=self._controller.state(),
                    constraints=tuple(self._constraints),
                    rewinds=self._rewinds,
                )
            )

    def _discard(self, final: TxStatus) -> None:
        """End the store's side; a durable store keeps undo records that failed, for recovery."""
        if self._log is not None and self._ledger.failed:
            self._log.end_keeping_undos(final.value)
        else:
            self._store.discard(self._id)

    def _end(self, final: TxStatus) -> None:
        """Abort after compensation: discard state and effects, and end as `final`."""
        self._rewinds += 1
        self._effects.clear()
        self._discard(final)
        self._history.undo_from(0)
        self._steps.clear()
        self._outputs.clear()
        self._graph.clear()
        self._graph_upto = 0
        self._pending = None
        self._next_step = 0
        self._transition(final)

    # ------------------------------------------------------------------ rollback and commit

    def rollback(self, to_step: int | None = None, *, reason: str = "") -> RollbackResult:
        """Rewind to just before `to_step` (it runs next), or abort with None or 0.

        A rewind compensates the undo records of steps >= `to_step`, newest first, drops their
        staged effects and restores the store; the controller's counters and the constraints
        are left alone. Raises `InvalidArgument` unless `to_step < next_step_id`. `reason` is
        for the caller's logs; agenttx does not interpret it.
        """
        del reason
        with self._lock:
            self._ensure_active()
            if to_step is not None and (isinstance(to_step, bool) or not isinstance(to_step, int)):
                raise InvalidArgument(f"to_step must be an integer, got {to_step!r}")
            if to_step:
                if not 0 < to_step < self._next_step:
                    raise InvalidArgument(
                        f"to_step {to_step} must be lower than the next step {self._next_step}"
                    )
                self._transition(TxStatus.ROLLING_BACK)
                with self._ending_if_interrupted():
                    report = self._ledger.compensate(
                        self._ledger.take_from(to_step), self._registry.compensations
                    )
                    self._rewind_state(to_step)
                    self._log_progress()
                self._transition(TxStatus.ACTIVE)
                return RollbackResult(
                    aborted=False,
                    next_step_id=to_step,
                    compensations_run=report.succeeded,
                    compensation_errors=report.failures,
                )
            report = self._abort(TxStatus.ROLLED_BACK)
            return RollbackResult(
                aborted=True,
                next_step_id=0,
                compensations_run=report.succeeded,
                compensation_errors=report.failures,
            )

    def _abort(self, final: TxStatus) -> CompensationReport:
        if self._status is not TxStatus.ROLLING_BACK:
            self._transition(TxStatus.ROLLING_BACK)
        with self._ending_if_interrupted():
            report = self._ledger.compensate(
                self._ledger.take_from(0), self._registry.compensations
            )
            self._end(final)
        return report

    def commit(self) -> CommitResult:
        """Publish every write atomically, then dispatch the staged effects in staging order.

        First committer wins: if another transaction committed a key this one wrote, after this
        one first read or wrote it (read committed: wrote it; serializable: also a key it read,
        after it read it), the
        transaction is compensated, ends FAILED, and `WriteConflict` (or its subclass
        `ReadConflict`), naming the key, is raised. Dispatch errors are reported in the result;
        they never undo the commit. Nothing is compensated after a commit.

        On a `DurableStore` the effects go into its outbox in the same atomic commit and are
        delivered from there (a failure is retried later by `Engine.dispatch_pending`), so a
        crash between the commit and the delivery loses none of them.
        """
        with self._lock:
            self._ensure_active()
            self._transition(TxStatus.COMMITTING)
            try:
                self._store.commit(self._id)
            except WriteConflict:
                self._transition(TxStatus.ROLLING_BACK)
                self._abort(TxStatus.FAILED)
                raise
            except BaseException:
                self._transition(TxStatus.ACTIVE)
                raise
            self._ledger.forget_all()
            effects = tuple(self._effects)
            self._effects.clear()
            steps = len(self._steps)
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


def _rewind_target(decision: RollbackDecision) -> int:
    """The first step a decision undoes: all of them (0) for an abort."""
    return 0 if decision.strategy is RollbackStrategy.ABORT else decision.target_step
