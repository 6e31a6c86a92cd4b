"""What a transaction shows: its steps, graph, history, constraints and a view of it all.

`Observed` holds a transaction's state and answers every read-only question about it;
`Transaction` adds the operations that change it. Reads take a lock that is held only for
bookkeeping, never while a tool, a compensation or a dispatcher runs, so they never wait for
user code.
"""

from __future__ import annotations

import collections
import json
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Literal

import attrs

from ._approvals import requests_for
from ._errors import IllegalTransition, InvalidTransactionState, TransactionNotFound
from ._events import Event, EventKind, EventSink
from ._lineage import LineageStep, lineage_from_steps
from ._results import (
    TRANSITIONS,
    ContextEntry,
    StepAttempt,
    StepRecord,
    TransactionView,
    TxStatus,
)
from ._timeline import Timeline
from ._tools import Orphans
from ._txlog import history_text
from .stores import is_durable

if TYPE_CHECKING:
    from ._approvals import Requests
    from ._graph import DependencyGraph
    from ._json import JSONValue
    from ._lineage import LineageGraph
    from ._rollback import RollbackController, RollbackPolicy
    from ._saga import Dispatcher, SagaLedger
    from ._settings import Settings
    from ._tools import ToolRegistry, ToolSpec, UndoRecord
    from ._txlog import TxLog
    from .stores import Store

__all__ = ["Calls", "Observed"]


class _Waiter:
    """A call waiting for its turn: a thread blocked on `grant`, or a task awaiting `future`."""

    __slots__ = ("future", "grant", "granted", "loop", "task", "thread")

    def __init__(self, thread: int, task: object, loop: Any, future: Any) -> None:
        self.thread = thread
        self.task = task
        self.loop = loop
        self.future = future
        self.granted = False
        self.grant: threading.Lock | None = None
        if future is None:
            self.grant = threading.Lock()
            self.grant.acquire()


def _resolve(future: Any) -> None:
    """Wake an awaiting task (on its loop); a cancelled future has already been handled."""
    if not future.done():
        future.set_result(None)


class Calls:
    """A transaction's turns: calls run one at a time, in arrival order (a FIFO ticket queue).

    A thread enters with `with calls:`, a task with `async with calls:`; the turn is
    held for the whole call, tool and compensations included, and handed directly to the
    oldest waiter when it ends, so a newcomer never overtakes a waiter. Entering again from the
    thread or task that holds the turn (a tool calling back into its transaction, or a call
    made of calls) passes straight through: the status check then says what is wrong. A thread
    that would block the event loop running the task that holds the turn (a sync call from a
    sibling task) raises `InvalidTransactionState` rather than deadlock. A waiter interrupted
    or cancelled while queued leaves the queue; if the turn reached it meanwhile, it passes it
    on. `last` stamps the start and the end of each call (for the idle reaper).

    A class rather than a lock with a generator: it runs on every step. `_turn` is a lock held
    for as long as anyone holds the turn, hand-overs included, so a free turn costs what a
    plain lock does: one non-blocking acquire to take it and one release to give it back. The
    queue and its `_mutex` come in only when someone waits. A re-entry takes no lock.

    Why no waiter is stranded: a waiter queues (under `_mutex`) and then tries the turn; a
    holder frees the turn and then looks at the queue. So either the waiter gets the turn
    itself, or the holder sees it and wakes it, or another call took the turn in between,
    and that call will look at the queue when it ends.
    """

    __slots__ = ("_depth", "_mutex", "_owner", "_task", "_turn", "_tx_id", "_waiters", "last")

    def __init__(self, tx_id: str = "") -> None:
        self._tx_id = tx_id
        self._turn = threading.Lock()  # held while a call holds the turn
        self._mutex = threading.Lock()  # guards the queue
        self._owner: int | None = None  # the thread holding the turn
        self._task: object = None  # the task holding it, when it is held by a task
        self._depth = 0  # re-entries by the holder
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self.last = time.monotonic()

    @property
    def busy(self) -> bool:
        """True while a call holds the turn."""
        return self._turn.locked()

    def try_enter(self) -> bool:
        """Take the turn if it is free and nobody waits, else return False at once."""
        if self._waiters or not self._turn.acquire(False):
            return False
        self._owner = threading.get_ident()
        return True

    def __enter__(self) -> None:
        # The common case first: the turn is free and nobody waits (so nobody is overtaken).
        # Then this thread cannot be holding it already: no re-entry to look for.
        if not self._waiters and self._turn.acquire(False):
            self._owner = threading.get_ident()
            self.last = time.monotonic()
            return
        me = threading.get_ident()
        # Only the holder sets `_owner` to itself or away from itself, and only the holder
        # touches `_depth`: a re-entry needs no lock.
        if self._owner == me and (self._task is None or self._task is _current_task()):
            self._depth += 1
            return
        self.last = time.monotonic()
        with self._mutex:
            if self._owner == me:  # a task on this thread's loop holds it: waiting would deadlock
                raise self._would_block()
            waiter = _Waiter(me, None, None, None)
            self._queue(waiter)
        grant = waiter.grant
        assert grant is not None
        try:
            grant.acquire()
        except BaseException:
            self._leave_queue(waiter)
            raise

    def __exit__(self, *exc: object) -> None:
        if self._depth:
            self._depth -= 1
            return
        if self._waiters:
            with self._mutex:
                self._pass_on()
        else:
            self._owner = self._task = None
            self._turn.release()
            if self._waiters:  # one queued as the turn was freed
                self._wake()
        self.last = time.monotonic()

    def leave(self) -> None:
        """End the turn without counting it as activity (the idle reaper's `try_enter`)."""
        if self._depth:
            self._depth -= 1
            return
        with self._mutex:
            self._pass_on()

    async def __aenter__(self) -> None:
        import asyncio  # noqa: PLC0415  (not loaded by `import agenttx`)

        me = threading.get_ident()
        task = asyncio.current_task()
        if self._owner == me and (self._task is None or self._task is task):
            self._depth += 1  # the holder itself (or a loop nested in its sync call)
            return
        self.last = time.monotonic()
        if not self._waiters and self._turn.acquire(False):
            self._task = task  # the task first: see `_pass_on`
            self._owner = me
            return
        with self._mutex:
            loop = asyncio.get_running_loop()
            waiter = _Waiter(me, task, loop, loop.create_future())
            self._queue(waiter)
        try:
            await waiter.future
        except BaseException:
            self._leave_queue(waiter)
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()

    def _would_block(self) -> InvalidTransactionState:
        error = InvalidTransactionState(tx_id=self._tx_id, status=TxStatus.EXECUTING.value)
        message = (
            f"transaction `{self._tx_id}` is running an async call on this thread's event loop: "
            "a sync call would block the loop it waits for; await the async method instead"
        )
        error.args = (message,)
        return error

    def _queue(self, waiter: _Waiter) -> None:
        """Queue `waiter`, then take the turn for the oldest waiter if it is free (under
        `_mutex`): it may have been freed since the caller found it taken."""
        self._waiters.append(waiter)
        if self._turn.acquire(False):
            self._pass_on()

    def _wake(self) -> None:
        """Give a waiter the turn just freed, unless another call has taken it (that call
        hands it on when it ends)."""
        with self._mutex:
            if self._waiters and self._turn.acquire(False):
                self._pass_on()

    def _leave_queue(self, waiter: _Waiter) -> None:
        """A waiter interrupted or cancelled: out of the queue, or pass on the turn it got."""
        with self._mutex:
            if waiter.granted:
                self._depth = 0
                self._pass_on()
            else:
                self._waiters.remove(waiter)

    def _pass_on(self) -> None:
        """Hand the turn (held) to the oldest waiter that can take it, or free it (under
        `_mutex`)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            waiter.granted = True
            # The task first: a thread that reads `_owner` unlocked must never see its own id
            # next to a task that is not the holder's.
            self._task = waiter.task
            self._owner = waiter.thread
            if waiter.grant is not None:
                waiter.grant.release()
                return
            try:
                waiter.loop.call_soon_threadsafe(_resolve, waiter.future)
            except RuntimeError:  # its loop has closed: nobody will take it
                continue
            return
        self._owner = self._task = None
        self._turn.release()


def _current_task() -> object:
    """The running task, or None outside a running event loop."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return None
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


@attrs.define(init=False, eq=False, repr=False)
class Observed:
    """A transaction's state, and the read-only view of it (see `Transaction`)."""

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
    # The constraints added by transient failures, `(step, text)`: dropped when it succeeds.
    _transient_hints: list[tuple[int, str]] = attrs.field(init=False, factory=list)
    # Timed-out calls whose worker was still running: their undos wait for them.
    _orphans: Orphans = attrs.field(init=False, factory=Orphans)
    # The durable log, on a `DurableStore`: records, undos, steps and progress survive a crash.
    _log: TxLog | None = attrs.field(init=False, default=None)
    _calls: Calls = attrs.field(
        init=False, default=attrs.Factory(lambda self: Calls(self._id), takes_self=True)
    )
    _state_lock: threading.RLock = attrs.field(init=False, factory=threading.RLock)
    # The audit trail (set by `Transaction._setup`, with the hooks).
    _events: EventSink = attrs.field(init=False)
    # The approval requests and reviews of the store (made on first use: most tools need none).
    _requests: Requests | None = attrs.field(init=False, default=None)
    # The requests whose decision event is in the trail (`Guarded._decided`).
    _decisions: set[str] = attrs.field(init=False, factory=set)

    def _book(self) -> Requests:
        """The store's approval requests and reviews (looked up on first use)."""
        book = self._requests
        if book is None:
            book = self._requests = requests_for(self._store)
        return book

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
                StepRecord(
                    step_id=k,
                    tool_name=s.tool_name,
                    arguments=s.arguments,
                    output=s.output,
                    call_id=s.call_id,
                )
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
        with self._state_lock:
            steps = [
                LineageStep(k, s.tool_name, s.arguments, s.output, s.dependencies)
                for k, s in self._timeline.steps.items()
            ]
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
        self._calls.last = time.monotonic()
        if self._store.is_open(self._id):
            text = self._store.get(self._id, key)
        else:
            text = self._store.read_committed(key)
        return None if text is None else json.loads(text)

    @property
    def last_activity(self) -> float:
        """The `time.monotonic()` at which the last call on this transaction began or ended."""
        return self._calls.last

    def view(self) -> TransactionView:
        """A snapshot of the transaction's state; works after it has ended, and during a step."""
        self._calls.last = time.monotonic()
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

    def audit(self) -> tuple[Event, ...]:
        """The transaction's audit trail so far: every event in `seq` order (see docs/audit.md).

        Works during a step and after the transaction has ended; thread-safe.
        """
        return self._events.events()

    def _history_text(self, final: TxStatus, audit: dict[str, Any] | None = None) -> str:
        """The history a durable store keeps when the transaction ends as `final`, with the
        audit trail (`audit`, or the events recorded so far), compact (`EventSink.compact`)."""
        events = self._events.compact() if audit is None else audit
        with self._state_lock:
            return history_text(
                final.value,
                self._timeline.history.rows(),
                self._constraints,
                (f"{record.description}: {error}" for record, error in self._ledger.failed),
                events,
            )

    def _commit_store(self, data: dict[str, JSONValue]) -> float:
        """Commit the store's side; a durable log keeps the history in the same commit, with
        the audit trail ending in the `committed` event (`data`), which the caller records once
        the commit succeeded, at the time returned."""
        at = time.time()
        if self._log is None:
            self._store.commit(self._id)
        else:
            audit = self._events.compact([(EventKind.COMMITTED, at, data)])
            self._log.commit(self._history_text(TxStatus.COMMITTED, audit))
        return at

    def _store_committed(self) -> bool:
        """After the store's commit raised: whether it committed all the same (a durable store
        no longer has the transaction; any other store no longer has it open)."""
        try:
            if is_durable(self._store):
                self._store.owner(self._id)
                return False
            return not self._store.is_open(self._id)
        except TransactionNotFound:
            return True
        except Exception:  # noqa: BLE001  (cannot tell: it stays as it was, ACTIVE)
            return False

    def _delivered(self, channel: str, idempotency_key: str, step_id: int) -> None:
        self._events.emit(
            EventKind.EFFECT_DELIVERED,
            step=step_id,
            data={"channel": channel, "idempotency_key": idempotency_key},
        )

    def _compensation_event(self, record: UndoRecord, error: str | None) -> None:
        data: dict[str, JSONValue] = {"kind": record.kind, "description": record.description}
        if error is None:
            self._events.emit(EventKind.COMPENSATED, step=record.step_id, data=data)
        else:
            data["error"] = error
            self._events.emit(EventKind.COMPENSATION_FAILED, step=record.step_id, data=data)

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
        self._status = target  # one store: observers never see half of it

    def _call(self) -> Calls:
        """Around a call: wait for its turn (FIFO), and count its start and end as activity."""
        return self._calls

    def _ensure_active(self) -> None:
        if self._status is not TxStatus.ACTIVE:
            raise InvalidTransactionState(tx_id=self._id, status=self._status.value)
