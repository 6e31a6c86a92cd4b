"""`Transaction`: the public surface of an interactive transaction, over the parts it holds.

The transaction makes its parts (`_setup`) and hands each what it shares with the others:
the timeline and the constraints list (changed by the step driver, read by the views), the
undo ledger, the turn lock, the state lock. Each public method delegates to the part that
owns it: the step driver (`Pipeline`: steps, rollback, commit, the status), the people desk
(`People`), the views (`Views`), the calls that number themselves (`_turns`). The step path
goes through one delegation, then stays inside the step driver.
"""

from __future__ import annotations

import functools
import threading
import uuid
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from .._errors import InvalidArgument, InvalidTransactionState
from .._events import EventSink
from .._limits import DEFAULT_ISOLATION, Isolation
from .._prepare import check_agent_id
from .._results import CommitResult, RollbackResult, StepResult, TxStatus
from .._rollback import RollbackController, RollbackPolicy
from .._saga import CompensationReport, Dispatcher, SagaLedger, check_dispatcher
from .._settings import DEFAULT_STEP_TIMEOUT, Settings, settings_of
from .._timeline import Timeline
from .._tools import Orphans, ToolRegistry, ToolsArgument, to_json_value
from .._txlog import Restored, TxLog
from ..stores import DurableStore, MemoryStore, Store, is_store
from . import _turns as turns
from ._people import People
from ._pipeline import Pipeline, compensation_event
from ._record import Record
from ._turnlock import Calls
from ._views import Views

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from types import TracebackType

    from typing_extensions import Self

    from .._approvals import Approval, ApprovalRequest, Review
    from .._events import Event, HookLike
    from .._graph import DependencyGraph
    from .._json import JSONValue
    from .._lineage import LineageGraph
    from .._preview import RollbackPreview
    from .._results import ContextEntry, StepAttempt, StepRecord, TransactionView
    from .._tools import OutputSerializer, ToolSpec


__all__ = ["Transaction"]

#: The policy of a transaction begun without one: frozen, so one instance serves every one.
_DEFAULT_POLICY: Final = RollbackPolicy()


@attrs.define(init=False, eq=False, repr=False)
class Transaction:
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

    # Its parts, each with its own contract; the step driver owns the status.
    _id: str
    _agent_id: str
    _registry: ToolRegistry
    _settings: Settings
    _controller: RollbackController
    _timeline: Timeline  # live steps, outputs, effects: truncated together
    _constraints: list[str]  # every distinct hint so far: changed in place, never replaced
    _calls: Calls  # the turn lock: calls one at a time, first come first served
    _people: People  # approvals, reviews, what waits for a person
    _views: Views  # the read-only observers
    _pipeline: Pipeline  # the step pipeline and the rewind path
    _store: Store  # where its state lives (an integration's runner keeps its conversation there)

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
        settings = settings_of(
            step_timeout=step_timeout,
            max_constraints=max_constraints,
            compensation_retries=compensation_retries,
            compensation_timeout=compensation_timeout,
            dispatch_timeout=dispatch_timeout,
            isolation=isolation,
            policy=_DEFAULT_POLICY if policy is None else policy,
            output_serializer=output_serializer,
        )
        store = MemoryStore() if store is None else store
        tx_id = str(uuid.uuid4()) if tx_id is None else tx_id
        registry = ToolRegistry(tools)
        self._open(
            settings,
            registry=registry,
            store=store,
            agent_id=agent_id,
            dispatcher=dispatcher,
            tx_id=tx_id,
            hooks=hooks,
        )

    @classmethod
    def _begin(
        cls,
        settings: Settings,
        *,
        registry: ToolRegistry,
        store: Store,
        agent_id: str,
        dispatcher: Dispatcher | None,
        hooks: Iterable[HookLike] | None,
    ) -> Transaction:
        """`Transaction(...)` for an `Engine`, which checked its store, dispatcher, tools and
        settings when it was made (or built `settings` with `settings_of`): only what
        differs between its transactions is checked here."""
        check_agent_id(agent_id)
        tx = cls.__new__(cls)
        tx._open(  # noqa: SLF001  (its own class)
            settings,
            registry=registry,
            store=store,
            agent_id=agent_id,
            dispatcher=dispatcher,
            tx_id=str(uuid.uuid4()),
            hooks=hooks,
        )
        return tx

    def _open(
        self,
        settings: Settings,
        *,
        registry: ToolRegistry,
        store: Store,
        agent_id: str,
        dispatcher: Dispatcher | None,
        tx_id: str,
        hooks: Iterable[HookLike] | None,
    ) -> None:
        """Begin the transaction in `store`, then make its parts (`_setup`)."""
        events = EventSink("transaction", tx_id, hooks)  # checks the hooks before the store
        log = TxLog.open(store, tx_id, agent_id=agent_id, settings=settings)
        self._setup(
            settings,
            events,
            log=log,
            registry=registry,
            store=store,
            agent_id=agent_id,
            dispatcher=dispatcher,
            tx_id=tx_id,
            controller=RollbackController(settings.policy),
        )

    def _setup(
        self,
        settings: Settings,
        events: EventSink,
        *,
        log: TxLog | None,
        registry: ToolRegistry,
        store: Store,
        agent_id: str,
        dispatcher: Dispatcher | None,
        tx_id: str,
        controller: RollbackController,
    ) -> None:
        """Make the parts and hand each what it shares with the others."""
        ledger = SagaLedger(
            attempts=settings.compensation_retries,
            timeout=settings.compensation_timeout,
            on_outcome=functools.partial(compensation_event, events),
        )
        timeline, constraints, orphans = Timeline(), list[str](), Orphans()
        calls, lock = Calls(tx_id), threading.RLock()
        people = People(
            tx_id,
            store=store,
            registry=registry,
            events=events,
            ledger=ledger,
            orphans=orphans,
            timeline=timeline,
        )
        views = Views(
            tx_id,
            agent_id,
            timeline=timeline,
            constraints=constraints,
            controller=controller,
            ledger=ledger,
            events=events,
            store=store,
            calls=calls,
            lock=lock,
        )
        pipeline = Pipeline(
            id=tx_id,
            registry=registry,
            store=store,
            settings=settings,
            dispatcher=dispatcher,
            controller=controller,
            ledger=ledger,
            events=events,
            log=log,
            timeline=timeline,
            constraints=constraints,
            orphans=orphans,
            calls=calls,
            state_lock=lock,
            people=people,
            record=Record(tx_id, store=store, log=log, events=events, views=views),
        )
        self.__attrs_init__(
            id=tx_id,
            agent_id=agent_id,
            registry=registry,
            settings=settings,
            controller=controller,
            timeline=timeline,
            constraints=constraints,
            calls=calls,
            people=people,
            views=views,
            pipeline=pipeline,
            store=store,
        )

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
            Settings.from_record(restored.settings, restored.policy, output_serializer),
            EventSink("transaction", restored.tx_id, hooks),
            log=TxLog(store, restored.tx_id, record=restored.record, progress=progress),
            registry=registry,
            store=store,
            agent_id=restored.agent_id,
            dispatcher=dispatcher,
            tx_id=restored.tx_id,
            controller=RollbackController.from_state(restored.policy, progress.controller),
        )
        return tx, tx._pipeline.adopt(restored)  # noqa: SLF001

    # ------------------------------------------------------------------ what it shows

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
        return self._pipeline.status

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
        return self._views.context()

    @property
    def steps(self) -> tuple[StepRecord, ...]:
        """The live steps: succeeded and not rewound, in step order."""
        return self._views.steps()

    @property
    def store(self) -> Store:
        """The store the transaction keeps its state in (the one it was begun or resumed on)."""
        return self._store

    @property
    def graph(self) -> DependencyGraph:
        """The dependency graph of the live steps, brought up to date on access."""
        return self._views.graph()

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

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The specs of the registered tools, in registration order (what a model is told)."""
        return self._registry.specs()

    def lineage(
        self,
        *,
        min_value_length: int = 4,
        match_numbers: bool = False,
        max_depth: int = 6,
        evidence: bool = False,
    ) -> LineageGraph:
        """The lineage of the live steps (see `LineageRecorder` and `lineage_from_steps`).

        Each step is an iteration of its own, so a step links to any earlier step whose output
        held a value it received, whether through a reference or copied by the agent. Each
        `${steps.N.path}` reference a step made is also an explicit edge, with the keys its
        edge in `graph` has: every explicit edge of `graph` is an explicit edge here.
        """
        return self._views.lineage(
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
        return self._views.history()

    def export_graph(self, format: Literal["dot", "mermaid", "json"] = "dot") -> str:  # noqa: A002
        """The dependency graph with the history of the steps: deterministic DOT, Mermaid or JSON.

        Live steps are the graph's nodes (`s{step}`), linked by their edges; every attempt that
        failed or was undone is an extra node (`a{n}`, `n` its place in `history`), marked
        "failed", "rewound" or "compensated".
        """
        return self._views.export_graph(format)

    def find_root_cause(self, step_id: int, error_key: str) -> int | None:
        """The earliest step that produced the value `step_id` received as `error_key`."""
        return self._views.find_root_cause(step_id, error_key)

    def read(self, key: str) -> JSONValue:
        """State `key` as this transaction sees it (its writes, then committed); None if absent."""
        return self._views.read(key)

    @property
    def last_activity(self) -> float:
        """The `time.monotonic()` at which the last call on this transaction began or ended."""
        return self._calls.last

    def view(self) -> TransactionView:
        """A snapshot of the transaction's state; works after it has ended, and during a step."""
        return self._views.view(self._pipeline.status)

    def audit(self) -> tuple[Event, ...]:
        """The transaction's audit trail so far: every event in `seq` order (see docs/audit.md).

        Works during a step and after the transaction has ended; thread-safe.
        """
        return self._views.audit()

    def __repr__(self) -> str:
        # Never arguments or outputs: they may hold secrets.
        return (
            f"<Transaction {self._id} status={self._pipeline.status.value} "
            f"next_step={self._timeline.next_step}>"
        )

    # ------------------------------------------------------------------ people (any thread)

    def approve(
        self,
        request_id: str,
        *,
        actor: str,
        expires_in: float | None = None,
        note: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> Approval:
        """Approve request `request_id` of this transaction, as `actor` (docs/approvals.md).

        The approved call runs once, when the agent sends it again. `expires_in` (seconds)
        bounds how long the approval may wait for it; `arguments` edits the call (checked
        against the tool's spec; the edit is recorded and the call runs with them). Raises
        `InvalidArgument` (an empty actor, bad arguments), `ApprovalNotFound` (not a request
        of this transaction), `ApprovalRejected`, `ApprovalConsumed`, `ApprovalExpired`, or
        `ApprovalError` if it was approved already. Safe from any thread, while a call runs.
        """
        return self._people.approve(
            request_id, actor=actor, expires_in=expires_in, note=note, arguments=arguments
        )

    def reject(self, request_id: str, *, actor: str, reason: str) -> None:
        """Reject request `request_id` of this transaction, as `actor`, for `reason`.

        When the agent sends that call again its step fails with a hint carrying the reason,
        so that it can change course. Raises as `approve` does, and `InvalidArgument` for an
        empty reason.
        """
        self._people.reject(request_id, actor=actor, reason=reason)

    def resolve_review(
        self, review_id: str, *, outcome: str, output: JSONValue = None, actor: str
    ) -> None:
        """Say whether the call under review `review_id` happened, as `actor`.

        `outcome="done"` records `output` as the call's output when the agent sends the call
        again (the tool does not run); `"not_done"` runs it again then, with the same
        idempotency key. Raises `InvalidArgument` (an empty actor, another outcome) or
        `ReviewNotFound` (not a pending review of this transaction).
        """
        self._people.resolve_review(review_id, outcome=outcome, output=output, actor=actor)

    def pending_approvals(self) -> tuple[ApprovalRequest, ...]:
        """This transaction's approval requests waiting for a decision, oldest first."""
        return self._people.pending_approvals()

    def pending_reviews(self) -> tuple[Review, ...]:
        """This transaction's reviews waiting for a person, oldest first."""
        return self._people.pending_reviews()

    # ------------------------------------------------------------------ calls numbering themselves

    def call(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        call_id: str | None = None,
        raw_context: str = "",
    ) -> StepResult:
        """Send `tool_name(arguments)` as the next step; resend it while the decision is RETRY.

        The result is the last attempt's. Misuse raises as `execute_step` does
        (`InvalidTransactionState` once the transaction has ended, `InvalidArgument`).
        Thread-safe: concurrent calls wait for their turn and are numbered in arrival order.
        """
        return turns.call(self, self._calls, tool_name, arguments, call_id, raw_context)

    async def acall(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        call_id: str | None = None,
        raw_context: str = "",
    ) -> StepResult:
        """`call` for async code: waits for its turn, and between attempts, without blocking."""
        return await turns.acall(self, self._calls, tool_name, arguments, call_id, raw_context)

    def call_turn(self, calls: turns.TurnCalls) -> tuple[StepResult, ...]:
        """Run one model turn: `calls` in order, through `call`, stopping at the first failure.

        `calls` holds `(tool_name, arguments)` or `(tool_name, arguments, call_id)` tuples or
        `TurnCall`s, at most `MAX_CALLS_PER_TURN` (128) of them (`InvalidArgument` for more).
        All are checked before any runs, against every limit `execute_step` would
        refuse a call for (`InvalidArgument` names the bad item; see `TurnCall`), so a turn
        either raises before anything ran or returns one result per call, in order: the calls
        after the first that failed are not sent and get a `StepStatus.NOT_RUN` result (see
        `not_run`). Still raised from the call where it happens: `InvalidTransactionState` if
        the transaction has ended, and what a step raises to the developer whatever the
        arguments (`ToolOutputError`, a store's error). The turn is held from the first call to
        the last: no other call runs in between.
        """
        return turns.call_turn(self, self._calls, calls)

    async def acall_turn(self, calls: turns.TurnCalls) -> tuple[StepResult, ...]:
        """`call_turn` for async code (through `acall`)."""
        return await turns.acall_turn(self, self._calls, calls)

    # ------------------------------------------------------------------ steps, rollback, commit

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
        return self._pipeline.execute_step(step_id, tool_name, arguments, raw_context, call_id)

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
        pipeline = self._pipeline
        return await pipeline.aexecute_step(step_id, tool_name, arguments, raw_context, call_id)

    def rollback(self, to_step: int | None = None, *, reason: str = "") -> RollbackResult:
        """Rewind to just before `to_step` (it runs next), or abort with None or 0.

        A rewind compensates the undo records of steps >= `to_step`, newest first, drops their
        staged effects and restores the store; the controller's counters and the constraints
        are left alone. Raises `InvalidArgument` unless `to_step < next_step_id`. `reason` is
        for the caller's logs; agenttx does not interpret it.
        """
        del reason
        return self._pipeline.rollback(to_step)

    def preview_rollback(self, to_step: int | None = None) -> RollbackPreview:
        """What `rollback(to_step)` would do now, without doing it (docs/protocol.md).

        The steps it would void, the compensations it would run (newest first, with their
        payloads), the staged effects it would drop and the voided steps that left nothing to
        undo. Changes nothing (no store write, no audit event, no activity) and does not wait
        for a running step: asked from another thread during a step, the answer is as of the
        last step that ended. Raises `InvalidTransactionState` unless the transaction is ACTIVE
        or EXECUTING, and `InvalidArgument` for a `to_step` that is not an integer lower than
        `next_step_id`, as `rollback` would.
        """
        status = self._pipeline.status
        if status is not TxStatus.ACTIVE and status is not TxStatus.EXECUTING:
            raise InvalidTransactionState(tx_id=self._id, status=status.value)
        return self._views.preview_rollback(to_step)

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
        return self._pipeline.commit()

    def abort_if_idle(self, idle_timeout: float) -> bool:
        """Abort (compensating) if ACTIVE, not busy, and idle for `idle_timeout` seconds.

        Idleness counts from the end of the last call. Returns whether it aborted. A
        transaction in the middle of a call is skipped, never waited for: this is what an idle
        reaper calls from its own thread. One whose call waits for a person (an approval
        request or a review not yet decided, or decided and not yet taken) is not idle.
        """
        return self._pipeline.abort_if_idle(idle_timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pipeline.status is not TxStatus.ACTIVE:
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()


def turn_lock(tx: Transaction) -> Calls:
    """The turn lock of `tx` (`_turnlock.Calls`, `with` or `async with`), for an integration
    whose check and the call it decides must be one turn, whatever thread or event loop two
    callers run on: the call made while it is held re-enters it."""
    return tx._calls  # noqa: SLF001  (this package's own parts)


def rewound_steps(tx: Transaction) -> tuple[int, ...]:
    """The steps whose failure rewound `tx` in the rollback controller's current epoch
    (ascending; kept with the progress after every rewind, so they survive a restart): an
    integration restoring a turn that failed before a crash tells which of its calls failed."""
    return tuple(step for step, _ in tx._controller.state().retries)  # noqa: SLF001


def plan_setting(tx: Transaction) -> tuple[ToolRegistry, Store, Dispatcher | None]:
    """What a plan run beside `tx` runs with: its tools, its store and its dispatcher.

    For a plan a model proposes in the transaction's conversation (an integration's runner
    with `plans=True`): the run is a unit of work of its own on the same store, so that it
    sees what the store has committed, and a durable store records it for recovery.
    """
    pipeline = tx._pipeline  # noqa: SLF001  (this package's own parts)
    return tx._registry, pipeline._store, pipeline._dispatcher  # noqa: SLF001
