"""What a transaction shows: its steps, graph, lineage, history, audit trail, a view (`Views`)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Literal

from .._lineage import LineageStep, lineage_from_steps
from .._preview import preview_rollback
from .._results import ContextEntry, StepRecord, TransactionView
from .._txlog import history_text

if TYPE_CHECKING:
    import threading

    from .._events import Event, EventSink
    from .._graph import DependencyGraph
    from .._json import JSONValue
    from .._lineage import LineageGraph
    from .._preview import RollbackPreview
    from .._results import StepAttempt, TxStatus
    from .._rollback import RollbackController
    from .._saga import SagaLedger
    from .._timeline import Timeline
    from ..stores import Store
    from ._turnlock import Calls

__all__ = ["Views"]


class Views:
    """The read-only observers of one transaction (`Transaction.view`, `history`, `graph`, ...).

    A view holds the transaction's parts, never the transaction: the timeline, the constraints
    (a list the transaction changes in place, never replaces), the controller, the undo ledger,
    the audit sink, the store and the turn lock. It changes nothing but the turn lock's activity
    stamp (`view` and `read` count as activity). Every read of the timeline or the constraints
    takes `lock`, which the transaction holds only for bookkeeping, never while a tool, a
    compensation or a dispatcher runs: a view never waits for user code, and it may be asked
    from any thread, during a step and after the transaction has ended. The status is the
    transaction's: `view` is given it.
    """

    __slots__ = (
        "_agent_id",
        "_calls",
        "_constraints",
        "_controller",
        "_events",
        "_ledger",
        "_lock",
        "_store",
        "_timeline",
        "_tx_id",
    )

    def __init__(
        self,
        tx_id: str,
        agent_id: str,
        *,
        timeline: Timeline,
        constraints: list[str],
        controller: RollbackController,
        ledger: SagaLedger,
        events: EventSink,
        store: Store,
        calls: Calls,
        lock: threading.RLock,
    ) -> None:
        self._tx_id = tx_id
        self._agent_id = agent_id
        self._timeline = timeline
        self._constraints = constraints
        self._controller = controller
        self._ledger = ledger
        self._events = events
        self._store = store
        self._calls = calls
        self._lock = lock

    def context(self) -> tuple[ContextEntry, ...]:
        """The `raw_context` of each live step, in step order."""
        with self._lock:
            return self._context_entries()

    def steps(self) -> tuple[StepRecord, ...]:
        """The live steps, in step order."""
        with self._lock:
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

    def preview_rollback(self, to_step: object) -> RollbackPreview:
        """What a rollback to `to_step` would do now (`preview_rollback`); changes nothing."""
        with self._lock:
            timeline = self._timeline
            return preview_rollback(
                to_step,
                next_step=timeline.next_step,
                tools={step: live.tool_name for step, live in timeline.steps.items()},
                undos=self._ledger.pending(),
                effects=tuple(timeline.effects),
            )

    def graph(self) -> DependencyGraph:
        """The dependency graph of the live steps, brought up to date."""
        with self._lock:
            return self._timeline.graph()

    def lineage(
        self, *, min_value_length: int, match_numbers: bool, max_depth: int, evidence: bool
    ) -> LineageGraph:
        """The lineage of the live steps, each an iteration of its own (`Transaction.lineage`)."""
        with self._lock:
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

    def history(self) -> tuple[StepAttempt, ...]:
        """Every step attempt, in order, with what became of it."""
        with self._lock:
            return self._timeline.history.attempts()

    def export_graph(self, format: Literal["dot", "mermaid", "json"]) -> str:  # noqa: A002
        """The dependency graph with the history of the steps (`Transaction.export_graph`)."""
        with self._lock:
            return self._timeline.history.export(self._timeline.graph(), format)

    def find_root_cause(self, step_id: int, error_key: str) -> int | None:
        """The earliest step that produced the value `step_id` received as `error_key`."""
        with self._lock:
            return self._timeline.graph().find_root_cause(step_id, error_key)

    def read(self, key: str) -> JSONValue:
        """State `key` as the transaction sees it (its writes, then committed); None if absent."""
        self._calls.last = time.monotonic()
        if self._store.is_open(self._tx_id):
            text = self._store.get(self._tx_id, key)
        else:
            text = self._store.read_committed(key)
        return None if text is None else json.loads(text)

    def view(self, status: TxStatus) -> TransactionView:
        """A snapshot of the transaction, whose status is `status`."""
        self._calls.last = time.monotonic()
        with self._lock:
            return TransactionView(
                tx_id=self._tx_id,
                agent_id=self._agent_id,
                status=status,
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
        """The audit trail so far, in `seq` order."""
        return self._events.events()

    def history_text(self, final: TxStatus, audit: dict[str, Any] | None = None) -> str:
        """The history a durable store keeps when the transaction ends as `final`, with the
        audit trail (`audit`, or the events recorded so far), compact (`EventSink.compact`)."""
        events = self._events.compact() if audit is None else audit
        with self._lock:
            return history_text(
                final.value,
                self._timeline.history.rows(),
                self._constraints,
                (f"{record.description}: {error}" for record, error in self._ledger.failed),
                events,
            )
