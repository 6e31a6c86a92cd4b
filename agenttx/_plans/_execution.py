"""One plan run: validated first, then every ready node at once, within the limits.

`arun_plan` checks everything before anything runs (the plan against the tools, the initial
values, the limits) and then drives the sans-I/O `Scheduler` from one asyncio loop: each start
the scheduler hands out is re-checked (prerequisites recorded, run not cancelled, inputs that
resolve and fit the tool's spec) and becomes an asyncio task that runs the tool through the one
call path of `agenttx._tools` (`arun_tool`: deadlines, worker threads for sync tools, the
context fenced when the call ends). Results go back to the scheduler keyed by attempt id, so a
late or repeated result is refused. Failures are cleaned into hints; a transient one is retried
with the library's one jittered `Backoff`, with the same idempotency key, up to `Node.retries`.

State: the run is ONE store transaction (id = the run id). Tools' `ctx.state` calls are
serialized through a lock (the store's journal is linear) and nodes of one plan see each other's
writes as they happen. A failed attempt's writes are not rewound (no journal restore per node:
concurrent nodes interleave in one overlay); what a node must undo it registers with
`ctx.register_undo` or a compensation. The overlay commits when the plan succeeds, and staged
effects are delivered after that commit; a failed or cancelled plan discards it and publishes
nothing. Completed nodes are then compensated, newest completion first, through a `SagaLedger`.

Durable runs (a store that keeps plan runs): every transition goes through the run's
`DurableRun` (`_durable`), buffered and written at the barriers (before a round's tools start,
with their claims; before the loop waits; before the end), and each audit event is held until
its transition is written.

`PlanExecution` is the run: constructed (and so checked) in the caller's thread, executed once
by `execute` on an event loop; `_runner` builds the public API on it. It holds the parts it is
made of: `NodeTasks` (`_attempts`) run the attempts, `NodeEnds` (`_outcomes`) apply their ends,
`LateCalls` (`_late`) keep the calls they walked away from, `NodeGate` (`_people`) the waits
for a person, `_ending` reads the results. See `docs/plans.md#running-a-plan`.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Final, Literal, cast

from .._errors import (
    FailedPrecondition,
    InvalidArgument,
    PlanValidationError,
    WriteConflict,
)
from .._events import DeferredData, Event, EventKind, EventSink
from .._json import canonical_dumps
from .._saga import Backoff
from .._step import EditCheck, edit_check, finish
from .._tools import (
    Call,
    Compensation,
    Failure,
    ToolContext,
    ToolRegistry,
    UndoRecord,
    closed,
    key_deriver,
    run_tool,
)
from .._turns import RETRY_BACKOFF
from ._attempts import NodeTasks
from ._checks import (
    check_capacities,
    check_limit,
    check_rate_limits,
    check_run_id,
    check_store,
    optional_prerequisites,
)
from ._compensate import compensate_nodes
from ._durable import ENDED_STORED, DurableRun
from ._ending import node_results, plan_status, run_metrics
from ._journal import StoredNode, is_plan_store
from ._late import LateCalls
from ._model import Node, Plan, UnresolvedInput, resolve_inputs, resolve_resource
from ._outcomes import CANCEL_GRACE, DEFAULT_NODE_TIMEOUT, NodeEnds
from ._people import NodeGate
from ._records import (
    DISPATCHED,
    SEQ_BITS,
    Attempt,
    Crashed,
    Finished,
    HeldEvent,
    Inbox,
    NodeRecord,
    attempts_made,
    generation_of,
    node_units,
    retried_count,
    settings_record,
)
from ._results import (
    CompensationOutcome,
    PlanEventKind,
    PlanResult,
    PlanStatus,
)
from ._scheduler import NodeState, RateLimit, Scheduler, Start, Update

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from .._events import HookLike
    from .._json import JSONValue
    from .._saga import Dispatcher
    from .._tools import Tool, ToolsArgument
    from ..stores import Store

__all__ = ["CANCEL_GRACE", "DEFAULT_NODE_TIMEOUT", "CompensateOn", "FailurePolicy", "PlanExecution"]

_monotonic: Final = time.monotonic

FailurePolicy = Literal["skip_dependants", "cancel_all"]
CompensateOn = Literal["failure", "never"]
_COMPENSATE_ON: Final = ("failure", "never")


# ---------------------------------------------------------------------- the store


#: How often, in seconds, a durable run waiting for results looks for a cancellation that
#: another process recorded.
CANCEL_POLL: Final = 0.1


class PlanExecution:
    """One plan run: checked on construction, executed once by `execute`."""

    def __init__(
        self,
        plan: object,
        *,
        tools: ToolsArgument,
        initial: object,
        max_concurrency: object,
        resources: object,
        on_failure: object,
        store: object,
        rate_limits: object,
        run_id: object,
        dispatcher: Dispatcher | None,
        compensate_on: object,
        backoff: object,
        restored: dict[str, StoredNode] | None = None,
        hooks: Iterable[HookLike] | None = None,
    ) -> None:
        if not isinstance(plan, Plan):
            raise InvalidArgument(f"plan must be a Plan, got {plan!r:.80}")
        self._max = check_limit("max_concurrency", max_concurrency, minimum=1)
        if on_failure not in ("skip_dependants", "cancel_all"):
            raise InvalidArgument(
                f"on_failure must be 'skip_dependants' or 'cancel_all', got {on_failure!r:.80}"
            )
        if compensate_on not in _COMPENSATE_ON:
            raise InvalidArgument(
                f"compensate_on must be 'failure' or 'never', got {compensate_on!r:.80}"
            )
        if backoff is not None and not isinstance(backoff, Backoff):
            raise InvalidArgument(f"backoff must be a Backoff, got {backoff!r:.80}")
        capacities = check_capacities(resources)
        limits = check_rate_limits(rate_limits)
        registry = ToolRegistry(tools)
        problems = plan.validate(registry)
        if problems:
            raise PlanValidationError(problems)
        self._plan = plan
        self._initial = plan.check_initial(initial)
        if run_id is None:
            run_id = uuid.uuid4().hex
        self.id = check_run_id(run_id)
        self._store = check_store(store, self.id)
        self._registry = registry
        self._compensations: dict[str, Compensation[Any, Any]] = dict(registry.compensations)
        self._nodes: dict[str, NodeRecord] = {}
        #: The nodes' tools, by name (not on the records: a kept result keeps no tool alive).
        self._tools: dict[str, Tool[Any, Any]] = {}
        #: How many times a node's key changed (an earlier call of it was compensated).
        self._generations: dict[str, int] = {}
        self._scheduler = self._build(plan, registry, restored, on_failure, capacities, limits)
        #: Each rate-limited tool's `(tool, per_second, burst)`: a durable run also counts it
        #: over every run on the store, taking a token of the tool's bucket with each claim.
        self._rates = {
            tool: (tool, limit.per_second, limit.burst) for tool, limit in limits.items()
        }
        self._dispatcher = dispatcher
        self._compensate = compensate_on == "failure"
        self._backoff: Backoff = backoff if backoff is not None else RETRY_BACKOFF
        self._outputs: dict[str, JSONValue] = {}
        #: Undos of async tools that did not unwind when cancelled: reported, never run.
        self._stranded: list[tuple[str, UndoRecord]] = []
        #: The calls attempts walked away from while their tools ran: their undos wait.
        self._late = LateCalls(
            keep=lambda node, undos: self._ends.keep_undos(node, undos, over=True),
            record=self._event,
            compensations=self._compensations,
            run=self._compensate,
            forget=lambda: None if self._log.txlog is None else self._log.txlog.forget,
        )
        self._effects: list[Any] = []
        self._completions: list[str] = []
        self._lock = threading.Lock()
        # A resumed run numbers its events after those its durable record holds.
        stored = store.plan_audit if restored is not None and is_plan_store(store) else None
        self._audit = EventSink(
            "plan", self.id, hooks, start_seq=len(stored(self.id)) if stored is not None else 0
        )
        self._people = NodeGate(self.id, plan.version, self._store, self._note_person)
        self._cancel_reason: str | None = None
        self._status = PlanStatus.RUNNING
        self._closing = False  # set once the run's outcome is decided: no more cancellations
        self._wake: Callable[[], None] | None = None
        self._settings = settings_record(self._max, on_failure, compensate_on, capacities, limits)
        #: The run's durable half: its journal, claims and the durable log of its state.
        self._log = DurableRun(self.id, self._store, restored, self._lost_run)
        #: Events whose transitions are buffered in the journal, emitted once it is written.
        self._held: list[HeldEvent] = []
        self._tasks = NodeTasks(
            self._people,
            self._late,
            self._nodes,
            lambda node, undos: self._ends.keep_undos(node, undos, over=True),
            self._generations,
            self._log,
            self._flush,
        )
        self._ends = NodeEnds(
            scheduler=self._scheduler,
            nodes=self._nodes,
            tools=self._tools,
            log=self._log,
            event=self._event,
            outputs=self._outputs,
            effects=self._effects,
            completions=self._completions,
            late=self._late,
            stranded=self._stranded,
            backoff=self._backoff,
            take=self._tasks.take,
        )
        self._event(
            PlanEventKind.VALIDATED,
            data={"plan_version": plan.version, "nodes": len(plan.nodes), "problems": 0},
        )

    def _build(  # noqa: PLR0917  (the checked arguments of `__init__`)
        self,
        plan: Plan,
        registry: ToolRegistry,
        restored: dict[str, StoredNode] | None,
        on_failure: FailurePolicy,
        capacities: dict[str, int],
        limits: dict[str, RateLimit],
    ) -> Scheduler:
        """Fill `_nodes` (a record a node) and return the run's scheduler, of those records."""
        return Scheduler(
            self._records(plan, registry, restored, capacities),
            max_concurrency=self._max,
            capacities=capacities,
            rate_limits=limits,
            on_failure=on_failure,
            acyclic=True,  # validation found no cycle
        )

    def _records(
        self,
        plan: Plan,
        registry: ToolRegistry,
        restored: dict[str, StoredNode] | None,
        capacities: dict[str, int],
    ) -> Iterator[NodeRecord]:
        """Make each node's record (also its scheduler entry), one at a time."""
        node_key = key_deriver(self.id, plan.version)
        prerequisites = plan.prerequisites
        lookup = registry.get
        records = self._nodes
        for index, node in enumerate(plan.nodes):
            node_id = node.id
            tool = lookup(node.tool)
            if tool is None:  # pragma: no cover  (validate reports UNKNOWN_TOOL first)
                raise InvalidArgument(f"node `{node_id}`: tool `{node.tool}` is not registered")
            self._tools[node.tool] = tool
            record = records[node_id] = NodeRecord(
                index,
                node,
                node_key,
                prerequisites(node_id),
                optional_prerequisites(node),
                None if node.exclusive_resource is None else self._exclusive(node),
                node_units(node, capacities) if node.resources else (),
                attempts_made(restored, node_id) if restored else 0,
                retried_count(restored, node_id) if restored else 0,
            )
            if isinstance(node.compensate, Compensation):
                self._compensations.setdefault(node.compensate.name, node.compensate)
            if restored and (generation := generation_of(restored, node_id)):
                self._generations[node_id] = generation
                record.regenerate(generation)
            yield record

    def _lost_run(self, error: Exception) -> None:
        """The store lost the run (`DurableRun.persist`): cancel it here, once."""
        with self._lock:
            if self._cancel_reason is None and not self._closing:
                self._cancel_reason = f"the durable record of the run was lost: {error}"
                self._event_locked(
                    PlanEventKind.CANCEL_REQUESTED, data={"reason": self._cancel_reason}
                )

    @property
    def durable(self) -> bool:
        """Whether the run's store keeps plan runs (its record is durable)."""
        return self._log.durable

    # -- steering (any thread) ----------------------------------------------------------

    @property
    def status(self) -> PlanStatus:
        return self._status

    def request_cancel(self, reason: str) -> None:
        """Record the cancellation, then wake the loop, which stops dispatching and cancels."""
        if not isinstance(reason, str):
            raise InvalidArgument(f"reason must be a string, got {reason!r:.80}")
        with self._lock:
            if self._closing:
                raise FailedPrecondition(f"plan run `{self.id}` has ended: it cannot be cancelled")
            if self._cancel_reason is not None:
                raise FailedPrecondition(f"plan run `{self.id}` is already cancelled")
            self._cancel_reason = reason
            self._event_locked(PlanEventKind.CANCEL_REQUESTED, data={"reason": reason})
        self._audit.deliver()
        wake = self._wake
        if wake is not None:
            wake()

    def _event(
        self,
        kind: PlanEventKind,
        *,
        node: str | None = None,
        attempt: str | None = None,
        data: Mapping[str, JSONValue] | DeferredData | None = None,
    ) -> None:
        with self._lock:  # `_event_locked`, inline: twice a node
            journal = self._log.journal
            if self._held or (journal is not None and journal.pending):
                self._held.append((kind, node, attempt, data))
            else:
                self._audit.record(kind, node=node, attempt=attempt, data=data)
        if self._audit.has_hooks:
            self._audit.deliver()

    def _event_locked(
        self,
        kind: PlanEventKind,
        *,
        node: str | None = None,
        attempt: str | None = None,
        data: Mapping[str, JSONValue] | DeferredData | None = None,
        at: float | None = None,
    ) -> None:
        journal = self._log.journal
        if self._held or (journal is not None and journal.pending):
            # Its transition is buffered: the event waits until it is durable (`_flush`).
            self._held.append((kind, node, attempt, data))
            return
        # Recorded under the run's lock (the order of the audit is the order of decisions);
        # hooks are called by `_event` or the caller after the lock is released.
        self._audit.record(kind, node=node, attempt=attempt, data=data, at=at)

    def _exclusive(self, node: Node) -> str | None:
        """The node's exclusive resource, resolved; `InvalidArgument` if it cannot be."""
        try:
            return resolve_resource(node, self._initial)
        except UnresolvedInput as exc:
            raise InvalidArgument(exc.message) from None

    def _cancelling(self) -> str | None:
        """The reason of a cancellation requested (by any thread, or, on a durable run, by
        any process through the store), or None."""
        if self._cancel_reason is None and self._log.journal is not None:
            reason = self._log.persist(self._log.journal.cancel_reason)
            if isinstance(reason, str):
                with self._lock:
                    if self._cancel_reason is None and not self._closing:
                        self._cancel_reason = reason
                        self._event_locked(PlanEventKind.CANCEL_REQUESTED, data={"reason": reason})
        return self._cancel_reason

    # -- the durable record -------------------------------------------------------------

    def _claim(self, starts: tuple[Start, ...]) -> None:
        """Claim the round's `starts` in one durable write, before any of their tools runs
        (`DurableRun.claim`), then emit the events held for it."""
        self._log.claim(
            starts, self._nodes, self._rates, self._audit_rows, self._scheduler, self._backoff
        )
        self._flush()

    def _flush(self) -> None:
        """Write the journal's buffered transitions (with the audit events recorded since the
        last write), then emit the events held for them."""
        journal = self._log.journal
        if journal is not None and journal.pending:
            self._log.persist(journal.flush, None, self._audit_rows())
        if self._held:
            with self._lock:
                held, self._held = self._held, []
                for kind, node, attempt, data in held:
                    self._audit.record(kind, node=node, attempt=attempt, data=data)
            self._audit.deliver()

    def audit(self) -> tuple[Event, ...]:
        """The run's audit events so far, in `seq` order."""
        return self._audit.events()

    def _audit_rows(self) -> list[tuple[int, str]]:
        """The audit events not yet written, as `(seq, JSON text)` rows."""
        return self._audit.take_unpersisted_rows()

    def open_journal(self) -> None:
        """Write the run's durable record (or take over the resumed one's), once; `start_plan`
        does it in the caller's thread, so that the run is in the store when it returns."""
        log = self._log
        if log.journal is not None or log.lost:
            return
        self._people.durable = True  # an approval is consumed under the run's lease from now
        scheduler = self._scheduler
        log.open_journal(
            {
                "plan": self._plan.to_json(),
                "plan_version": self._plan.version,
                "initial": self._initial,
                "settings": self._settings,
            },
            (
                (node_id, scheduler.state(node_id).value, scheduler.unresolved(node_id))
                for node_id in self._nodes
            ),
        )

    # -- the loop -------------------------------------------------------------------------

    async def execute(self) -> PlanResult:
        """Run the plan to its end; see the module docstring. Call once."""
        import asyncio  # noqa: PLC0415  (`import agenttx` does not load asyncio)

        inbox = Inbox(asyncio.get_running_loop())
        self._wake = inbox.wake
        self._started = time.monotonic()
        # Wall times are this offset plus a `time.monotonic()` reading: one clock read a
        # transition, and the `datetime`s are built only when a node's result is read.
        self._epoch = time.time() - self._started
        for node_id in self._nodes:
            if self._scheduler.state(node_id) is NodeState.READY:
                self._nodes[node_id].eligible_at = self._started
        running: dict[str, Attempt] = {}
        if self.durable:
            self.open_journal()
        try:
            self._log.open_state(self._plan.nodes, self._nodes)
            await self._drive(inbox, running)
        except BaseException as exc:
            # The awaiting task was cancelled (or KeyboardInterrupt): cancel the run, clean up
            # (compensations included), then re-raise.
            with self._lock:
                if self._cancel_reason is None:
                    self._cancel_reason = f"interrupted by {type(exc).__name__}"
                    self._event_locked(
                        PlanEventKind.CANCEL_REQUESTED, data={"reason": self._cancel_reason}
                    )
            await self._ends.apply(self._scheduler.cancel(self._cancel_reason or ""), running)
            await self._finish()
            raise
        return await self._finish()

    async def _drive(self, inbox: Inbox, running: dict[str, Attempt]) -> None:
        scheduler = self._scheduler
        records = self._nodes
        while scheduler.is_active():
            reason = self._cancelling()
            if reason is not None:
                await self._ends.apply(scheduler.cancel(reason), running)
                break
            starts = scheduler.get_ready(time.monotonic())
            if starts and self._log.journal is not None:
                self._claim(starts)
            for start in starts:
                if self._cancel_reason is not None:  # requested by a thread meanwhile
                    break  # it stays RUNNING in the scheduler; the cancellation ends it
                if records[start.node].state is not NodeState.RUNNING:  # its scheduler entry
                    continue  # ended meanwhile (cancel_all after an earlier start's failure)
                stored = self._log.restored.pop(start.node, None)
                if stored is not None and stored.state in ENDED_STORED:
                    await self._ends.apply(self._ends.replay(start, stored), running)
                    continue
                ended = self._dispatch(start, inbox, running)
                if ended is None:  # it runs in a task
                    continue
                if isinstance(ended, Finished):  # an inline tool, run in place
                    running.pop(start.attempt, None)
                    ended = self._ends.complete(ended.attempt, ended.outcome)
                # Apply what the end released or ended (awaiting only what it interrupted).
                if ended.interrupted:
                    await self._ends.apply(ended, running)
                else:
                    self._ends.settle(ended, running)
            if starts:
                continue  # the starts may have released or ended nodes: look again
            if not scheduler.is_active():
                break
            wakeup = scheduler.next_wakeup()
            if not running and wakeup is None:
                # Nothing runs, nothing is due later and nothing could start: a stall the
                # scheduler's checks should make impossible; end the run rather than hang.
                with self._lock:
                    self._cancel_reason = "no node can start: the limits leave no room"
                    self._event_locked(
                        PlanEventKind.CANCEL_REQUESTED, data={"reason": self._cancel_reason}
                    )
                continue
            self._flush()  # what the round recorded is durable before the run waits
            timeout = None if wakeup is None else max(0.0, wakeup - time.monotonic())
            if self._log.journal is not None:  # look for another process's cancellation
                timeout = CANCEL_POLL if timeout is None else min(timeout, CANCEL_POLL)
            await inbox.wait(timeout)
            while (message := inbox.take()) is not None:
                await self._receive(message, running)

    def _dispatch(
        self,
        start: Start,
        inbox: Inbox,
        running: dict[str, Attempt],
    ) -> Update | Finished | None:
        """Re-check a start, then run its attempt as a task (None); or run an inline sync
        tool in place (its `Finished`); or fail it at once (the scheduler's update)."""
        node_id = start.node
        record = self._nodes[node_id]
        node = record.node
        tool = self._tools[record.tool]
        now = _monotonic()
        eligible = record.eligible_at
        timeout = node.timeout or DEFAULT_NODE_TIMEOUT
        context = None
        if tool.wants_context or tool.guarded:  # as a transaction's step: only if it is used
            context = ToolContext(
                tx_id=self.id,
                step_id=record.step_id,
                idempotency_key=record.key,
                deadline=now + timeout,
                store=cast("Store", self._log.serialized),  # get, put and delete are all it calls
                compensations=self._compensations,
                log_undo=self._log.log_undo,
                seq_base=start.number << SEQ_BITS,
            )
        attempt = Attempt(
            start, now if eligible is None or eligible > now else eligible, now, context
        )
        record.add(attempt)
        # The re-checks: every prerequisite's success recorded (its output kept), unless the
        # node takes it as optional; inputs that resolve and fit the tool; the claim held.
        prerequisites = record.prerequisites
        outputs = self._outputs
        optional = record.optional
        failure: Failure | None = None
        arguments: JSONValue = None
        for name in prerequisites:
            if name not in outputs and name not in optional:  # pragma: no cover
                unmet = sorted(p for p in prerequisites if p not in outputs and p not in optional)
                failure = Failure(f"node `{node_id}` started before {', '.join(unmet)} succeeded")
                break
        if failure is None:
            try:
                resolved = resolve_inputs(node, self._initial, outputs)
            except UnresolvedInput as exc:
                failure = Failure(exc.message, key=exc.param, mistake=True)
            else:
                arguments, violation = tool.validator.check(resolved)
                if violation is not None:
                    failure = Failure(
                        f"node `{node_id}` input does not fit tool '{tool.name}': "
                        f"{violation.message}",
                        key=violation.key,
                        mistake=True,
                    )
        if node_id in self._log.unclaimed and failure is None:  # its claim did not hold
            failure = Failure(
                f"node `{node_id}` is claimed by another runner of plan run `{self.id}`",
                mistake=True,
            )
        self._event(
            PlanEventKind.DISPATCHED,
            node=node_id,
            attempt=start.attempt,
            data=(
                DISPATCHED,
                start.number,
                node.tool,
                self.id,  # the key's parts: derived when the event is read
                self._plan.version,
                node_id,
                tuple(sorted(prerequisites)) if len(prerequisites) > 1 else tuple(prerequisites),
                failure is None,
                self._scheduler.running_count,  # the checks made (data built when read)
                self._max,
                start.waited,
                timeout,
            )
            + ((self._generations.get(node_id, 0),) if self._generations else ()),
        )
        if failure is not None:
            closed(context)
            attempt.release()
            attempt.finished_at = _monotonic()
            return self._ends.fail(attempt, failure, retry=False)
        attempt.arguments = arguments
        call = Call(
            record.step_id,
            tool,
            arguments,
            "",
            context,
            timeout,
            self._log.log_undo,
            start.number << SEQ_BITS,
        )
        running[start.attempt] = attempt
        if tool.inline and not tool.is_async and not tool.guarded:
            # An inline sync tool runs on the loop's thread in any case, and cannot be
            # interrupted: call it here, without a task (`run_tool` still checks its deadline).
            outcome = run_tool(call)
            attempt.finished_at = _monotonic()
            return Finished(attempt, outcome)
        import asyncio  # noqa: PLC0415  (`import agenttx` does not load asyncio)

        if self._late and self._late.of(node_id):  # an earlier call of the node still runs
            attempt.task = asyncio.ensure_future(self._tasks.after_late(attempt, call, inbox))
            return None
        if tool.guarded:  # it may wait for a person: through the gate, in a task of its own
            attempt.task = asyncio.ensure_future(self._tasks.guarded(attempt, call, inbox))
            return None
        attempt.task = asyncio.ensure_future(self._tasks.plain(attempt, call, inbox))
        return None

    def _note_person(
        self,
        kind: EventKind,
        node: str | None,
        actor: str | None,
        data: Mapping[str, JSONValue],
        at: float | None,
    ) -> None:
        """Record an approval or review event of a node (`_people`), with its actor."""
        with self._lock:
            self._audit.record(kind, node=node, actor=actor, data=data, at=at)
        self._audit.deliver()

    @property
    def people(self) -> NodeGate:
        """The run's approvals and reviews."""
        return self._people

    def edit_check(self) -> EditCheck:
        """How an approver's edit of a call of this run is checked (`_step.validate_edit`)."""
        return edit_check(self._registry.get)

    def node_states(self) -> dict[str, NodeState]:
        """Every node's state now; a started node waiting for a person shows
        WAITING_APPROVAL or NEEDS_REVIEW. Safe from any thread (a snapshot)."""
        waiting = dict(self._people.states)
        return {
            node_id: waiting.get(node_id) or self._scheduler.state(node_id)
            for node_id in self._nodes
        }

    async def _receive(self, message: Finished | Crashed, running: dict[str, Attempt]) -> None:
        attempt = message.attempt
        running.pop(attempt.id, None)
        if isinstance(message, Crashed):
            raise message.error
        update = self._ends.complete(attempt, message.outcome)
        settled = message.settled
        if settled is not None and settled.guard is not None:
            self._flush()  # the node's end is durable before its guard says how the call ended
            finish(self._people.book, settled, fence=self._people.durable)
        if update.interrupted:
            await self._ends.apply(update, running)
        else:
            self._ends.settle(update, running)

    # -- the end --------------------------------------------------------------------------

    def _end(self, status: PlanStatus) -> None:
        """Write the run's final status with every audit event not yet written (those held
        for that write, and the `finished` event, recorded once it is durable), then set it."""
        ended = time.time()
        finished_data: dict[str, JSONValue] = {"status": status.value}
        if self._log.journal is None:
            self._flush()
            with self._lock:
                self._status = status
                self._event_locked(PlanEventKind.FINISHED, data=finished_data, at=ended)
            return
        with self._lock:
            held = [*self._held, (PlanEventKind.FINISHED, None, None, finished_data)]
            self._held = []
            last = self._audit.upcoming(
                (kind, ended, node, attempt, data) for kind, node, attempt, data in held
            )
            rows = self._audit_rows()
        rows += [(event.seq, canonical_dumps(event.to_json())) for event in last]
        self._log.persist(self._log.journal.flush, status.value, rows)
        with self._lock:
            self._status = status
            for kind, node, attempt, data in held:
                self._audit.record(kind, node=node, attempt=attempt, data=data, at=ended)

    async def _finish(self) -> PlanResult:
        import asyncio  # noqa: PLC0415

        finished = time.monotonic()
        late: tuple[CompensationOutcome, ...] = ()
        if self._late:
            late, stranded = await self._late.end(lost=self._log.lost)
            self._stranded += stranded
        self._flush()  # every node's end is durable before the state commits
        with self._lock:
            status = plan_status(
                self._nodes, self._scheduler, self._plan, cancelled=self._cancel_reason is not None
            )
            self._closing = True
        self._people.withdraw(f"plan run `{self.id}` ended")
        error: str | None = None
        committed = 0
        delivered = 0
        dispatch_errors: tuple[str, ...] = ()
        if status is PlanStatus.SUCCEEDED:
            try:
                committed = self._store.commit(self.id)
            except WriteConflict as exc:
                error = f"write conflict on state key {exc.key!r}: another commit changed it"
                status = PlanStatus.FAILED
                self._event(PlanEventKind.FAILED, data={"error": error})
            except Exception as exc:  # noqa: BLE001  (a store failure: nothing was published)
                error = f"the commit failed: {type(exc).__name__}: {exc}"
                status = PlanStatus.FAILED
                self._event(PlanEventKind.FAILED, data={"error": error[:1000]})
            else:
                self._event(PlanEventKind.COMMITTED, data={"keys": committed})
                # A resumed run delivers what the crashed one committed to the outbox too.
                pending = self._effects or (self._log.txlog is not None and self._log.resumed)
                if pending and self._dispatcher is not None:  # it may block: off the loop
                    delivered, dispatch_errors = await asyncio.to_thread(
                        self._log.deliver, self._effects, self._dispatcher
                    )
                self._event(
                    PlanEventKind.EFFECTS_DISPATCHED,
                    data={"delivered": delivered, "errors": list(dispatch_errors)},
                )
        compensations: tuple[CompensationOutcome, ...] = late
        if status is not PlanStatus.SUCCEEDED:
            if not self._log.lost:  # a runner that lost the run leaves its nodes to the new one
                compensations += await self._ends.compensate_completed(
                    self._compensations, run=self._compensate
                )
            if self._log.begun:  # never another's transaction of the same id
                with contextlib.suppress(Exception):  # a store failure: already not published
                    self._log.end_state(status, compensations)
        elif self._stranded:  # reported: undone by nobody
            compensations += await compensate_nodes(
                (), self._stranded, {}, run=False, record=self._event
            )
            self._event(PlanEventKind.DISCARDED, data={"effects_dropped": len(self._effects)})
        self._end(status)
        self._audit.deliver()
        return PlanResult(
            run_id=self.id,
            plan_version=self._plan.version,
            status=status,
            nodes=node_results(self._nodes, self._scheduler, self._epoch),
            metrics=run_metrics(self._nodes, self._started, finished),
            compensations=compensations,
            cancel_reason=self._cancel_reason,
            error=error,
            committed_keys=committed,
            effects_dispatched=delivered,
            dispatch_errors=dispatch_errors,
            audit=self._audit.recorded(),
        )
