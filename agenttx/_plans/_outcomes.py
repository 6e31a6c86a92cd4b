"""What a plan node's attempt ended with, applied to the run (see `_execution`).

`NodeEnds` applies an attempt's outcome: a success records the node's output, its undos (the
node's `compensate=` in the place of its tool's) and, on a durable run, its state writes and
effects before its completion; a failure is read by the step core's classifier (`classify`)
and retried with the run's backoff while it is transient and the node has retries left; a
result the scheduler refuses (the attempt was stopped first: a late or repeated result) is
recorded as such. What an attempt that did not succeed registered is kept for compensation,
and the undos of a call still running wait for it (`_late`). It also applies what the
scheduler's updates end: readiness, skips, cancellations, and the attempts they interrupt
(async tools cancelled and awaited, sync tools' calls kept running until they return).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

from .._hints import clean_error
from .._step import classify
from .._tools import Call, Failure, Orphan, abandoned_call, closed
from ._checks import output_check
from ._compensate import compensate_nodes
from ._records import COMPLETED, SEQ_BITS, node_undo, wall_time
from ._results import PlanEventKind
from ._scheduler import Delivery

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._json import JSONValue
    from .._saga import Backoff
    from .._tools import Compensation, Outcome, StagedEffect, Tool, UndoRecord
    from ._checks import OutputCheck
    from ._durable import DurableRun
    from ._journal import StoredNode
    from ._late import LateCalls
    from ._records import Attempt, NodeRecord
    from ._results import CompensationOutcome
    from ._scheduler import Scheduler, Start, Update

__all__ = ["CANCEL_GRACE", "DEFAULT_NODE_TIMEOUT", "NodeEnds"]

_monotonic: Final = time.monotonic
#: Each attempt's deadline, in seconds, for a node without `timeout=`.
DEFAULT_NODE_TIMEOUT: Final = 30.0
#: How long a cancellation waits for cancelled async tools to unwind, in seconds.
CANCEL_GRACE: Final = 5.0


class NodeEnds:
    """Applies the ends of one run's attempts (from the run's loop). It shares the run's
    records, outputs, staged effects, completions and stranded undos (the same objects);
    `event(kind, node=, attempt=, data=)` records an audit event, `take(attempt_id)` gives
    what a stopped guarded attempt sent and had registered (`NodeTasks.take`)."""

    __slots__ = (
        "_backoff",
        "_checks",
        "_completions",
        "_effects",
        "_event",
        "_late",
        "_log",
        "_nodes",
        "_outputs",
        "_scheduler",
        "_stranded",
        "_take",
        "_tools",
    )

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        nodes: dict[str, NodeRecord],
        tools: dict[str, Tool[Any, Any]],
        log: DurableRun,
        event: Callable[..., None],
        outputs: dict[str, JSONValue],
        effects: list[StagedEffect],
        completions: list[str],
        late: LateCalls,
        stranded: list[tuple[str, UndoRecord]],
        backoff: Backoff,
        take: Callable[[str], tuple[Call | None, tuple[UndoRecord, ...]]],
    ) -> None:
        self._scheduler = scheduler
        self._nodes = nodes
        self._tools = tools
        self._log = log
        self._event = event
        self._outputs = outputs
        self._effects = effects
        self._completions = completions
        self._late = late
        self._stranded = stranded
        self._backoff = backoff
        self._take = take
        self._checks: dict[str, OutputCheck | None] = {}

    def _transitions(self, nodes: tuple[str, ...], state: str) -> list[tuple[str, str, int]]:
        return [(node_id, state, self._scheduler.unresolved(node_id)) for node_id in nodes]

    def complete(self, attempt: Attempt, outcome: Outcome) -> Update:
        """Apply the outcome of an attempt whose tool has returned; the scheduler's update."""
        attempt.release()  # its tool has returned: the context is closed
        record = self._nodes[attempt.node]
        failure = outcome.error
        if failure is None and outcome.refused is not None:
            failure = Failure(f"output of tool '{record.node.tool}' is not JSON: {outcome.refused}")
        if failure is None:
            failure = self._check_output(self._tools[record.tool], outcome.output)
            if failure is not None:
                failure = failure._replace(mistake=True)  # a broken contract: never retried
        if failure is not None:
            return self.fail(attempt, failure, retry=True, outcome=outcome)
        update = self._scheduler.done(attempt.node, attempt.id)
        if update.delivery is Delivery.APPLIED:
            self._succeed(attempt, record, outcome)
        else:  # the attempt was stopped first: what its tool did is undone all the same
            self._refused(attempt, update)
            self._keep_outcome(attempt, outcome)
        return update

    def _check_output(self, tool: Tool[Any, Any], output: JSONValue) -> Failure | None:
        name = tool.name
        try:
            check = self._checks[name]
        except KeyError:
            check = self._checks[name] = output_check(tool)
        return None if check is None else check.failure(name, output)

    def _succeed(self, attempt: Attempt, record: NodeRecord, outcome: Outcome) -> None:
        node_id = attempt.node
        node = record.node
        now = _monotonic()
        undos = outcome.undos
        kind = None if node.compensate is None else node.compensation_name
        if kind is not None:
            kept = list(undos)
            declared = self._tools[record.tool].compensation_name
            if declared is not None and kept and kept[-1].kind == declared:
                kept.pop()  # the node's compensation replaces the tool's
            kept.append(node_undo(attempt, kind, record.step_id, len(kept), outcome))
            undos = tuple(kept)
        if undos:
            record.undos += tuple((now, undo) for undo in undos)
        record.output = outcome.output
        record.finished_at = now
        if self._log.txlog is not None:
            self._log.persist(self._log.write_state, record, attempt, outcome, kind, list(undos))
        if self._log.journal is not None:
            self._log.persist(
                self._log.journal.end_attempt,
                node_id,
                attempt.id,
                "SUCCEEDED",
                inputs=attempt.arguments,
                output=outcome.output,
                costs=attempt.costs,
            )
        self._outputs[node_id] = outcome.output
        if outcome.effects:
            self._effects.extend(outcome.effects)
        self._completions.append(node_id)
        self._event(
            PlanEventKind.COMPLETED,
            node=node_id,
            attempt=attempt.id,
            data=(COMPLETED, attempt.number, len(outcome.effects)),
        )

    def fail(
        self,
        attempt: Attempt,
        failure: Failure,
        *,
        retry: bool,
        outcome: Outcome | None = None,
    ) -> Update:
        node_id = attempt.node
        record = self._nodes[node_id]
        node = record.node
        hint, transient, timed_out, _ = classify(failure)
        retry_at: float | None = None
        number = attempt.number
        # The budget counts the failures retried before a crash too (a resumed run's).
        failures = record.retried + record.tried
        if retry and transient and not failure.mistake and failures <= node.retries:
            retry_at = time.monotonic() + self._backoff.delay(number)
        update = self._scheduler.failed(node_id, attempt.id, retry_at=retry_at, timed_out=timed_out)
        if update.delivery is not Delivery.APPLIED:
            self._refused(attempt, update)
            if outcome is not None:
                self._keep_outcome(attempt, outcome)
            return update
        now = time.monotonic()
        # What a failed attempt registered before failing may have half happened: kept, and
        # compensated with the node's others if the plan fails (or, for a call still running,
        # once it has returned: `_late`).
        if outcome is not None:
            self._keep_outcome(attempt, outcome)
        data: dict[str, JSONValue] = {
            "number": number,
            "hint": hint.text,
            "category": hint.category.value,
            "transient": transient,
        }
        if self._log.journal is not None:
            stored_state = (
                "READY" if retry_at is not None else ("TIMED_OUT" if timed_out else "FAILED")
            )
            self._log.persist(
                self._log.journal.end_attempt,
                node_id,
                attempt.id,
                stored_state,
                inputs=attempt.arguments,
                error=hint.text,
                costs=attempt.costs,
            )
        if retry_at is not None:
            record.eligible_at = retry_at
            data["retry_in_s"] = max(0.0, retry_at - now)
            self._event(PlanEventKind.RETRIED, node=node_id, attempt=attempt.id, data=data)
        else:
            record.error = hint
            record.finished_at = now
            data["timed_out"] = timed_out
            self._event(PlanEventKind.FAILED, node=node_id, attempt=attempt.id, data=data)
        return update

    def _refused(self, attempt: Attempt, update: Update) -> None:
        self._event(
            PlanEventKind.LATE_RESULT_REFUSED,
            node=attempt.node,
            attempt=attempt.id,
            data={"delivery": update.delivery.value},
        )

    async def apply(self, update: Update, running: dict[str, Attempt]) -> None:
        """Apply what an update ended (`settle`), then wait for the async tools it cancelled
        to unwind and keep what the interrupted attempts registered."""
        import asyncio  # noqa: PLC0415

        stopped = self.settle(update, running)
        if not stopped:
            return
        tasks = [
            attempt.task
            for attempt, _ in stopped
            if attempt.task is not None and not attempt.task.done()
        ]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_GRACE)
        for attempt, undos in stopped:
            # What an interrupted attempt registered may have half happened. A sync tool goes
            # on on its worker thread: its undos wait for the call (`_late`), since undoing
            # while its effect may still land would undo nothing. An async tool that has
            # unwound is over; one that has not is kept, not run (`_stranded`).
            stopped_task = attempt.task
            sent, abandoned = self._take(attempt.id)
            undos += abandoned  # noqa: PLW2901  (those kept as its call was abandoned)
            if stopped_task is None:
                self.keep_undos(attempt.node, undos, over=True)
                continue
            if stopped_task.done() and not stopped_task.cancelled():
                continue  # it ended first: its outcome, in the inbox, keeps them
            call_running = abandoned_call(stopped_task)
            if call_running is not None:
                call = sent if sent is not None else self._call_of(attempt)
                self._late.add(attempt.node, attempt.id, Orphan(call, undos, call_running))
                continue
            self.keep_undos(attempt.node, undos, over=stopped_task.done())

    def settle(
        self, update: Update, running: dict[str, Attempt]
    ) -> list[tuple[Attempt, tuple[UndoRecord, ...]]]:
        """Apply what an update ended: record readiness, skips and cancellations; stop the
        interrupted attempts (their contexts fenced: a late result is refused by attempt id),
        returned with what they registered, for `apply` to cancel and wait for."""
        ready, skipped, cancelled = update.ready, update.skipped, update.cancelled
        if not (ready or skipped or cancelled or update.interrupted):
            return []
        now = _monotonic()
        if self._log.journal is not None and (ready or skipped or cancelled):
            self._log.persist(
                self._log.journal.transitions,
                [
                    *self._transitions(ready, "READY"),
                    *self._transitions(skipped, "SKIPPED"),
                    *self._transitions(cancelled, "CANCELLED"),
                ],
            )
        records = self._nodes
        for node_id in ready:
            records[node_id].eligible_at = now
        for node_id in skipped:
            self._event(PlanEventKind.SKIPPED, node=node_id)
        stopped: list[tuple[Attempt, tuple[UndoRecord, ...]]] = []
        for start in update.interrupted:
            attempt = running.pop(start.attempt, None)
            if attempt is None:
                continue
            undos, _ = closed(attempt.context)
            attempt.release()
            attempt.finished_at = now
            stopped.append((attempt, undos))
        for node_id in cancelled:
            records[node_id].finished_at = now
            self._event(
                PlanEventKind.CANCELLED,
                node=node_id,
                data={"reason": self._scheduler.cancel_reason},
            )
        return stopped

    def _keep_outcome(self, attempt: Attempt, outcome: Outcome) -> None:
        """Keep what an attempt that did not succeed registered: its undos, and, for a call
        still running after its deadline, the call, which they wait for (`_late`)."""
        if outcome.running is not None:
            orphan = Orphan(self._call_of(attempt), outcome.undos, outcome.running)
            self._late.add(attempt.node, attempt.id, orphan)
        else:
            self.keep_undos(attempt.node, outcome.undos, over=True)

    def _call_of(self, attempt: Attempt) -> Call:
        """The call `attempt` made (for a call it walked away from)."""
        record = self._nodes[attempt.node]
        return Call(
            record.step_id,
            self._tools[record.tool],
            attempt.arguments,
            "",
            None,
            record.node.timeout or DEFAULT_NODE_TIMEOUT,
            self._log.log_undo,
            attempt.number << SEQ_BITS,
        )

    def keep_undos(self, node_id: str, undos: tuple[UndoRecord, ...], *, over: bool) -> None:
        """Keep undos for compensation; those of a call that may still run, as stranded."""
        if over:
            if undos:
                now = time.monotonic()
                self._nodes[node_id].undos += tuple((now, undo) for undo in undos)
        else:
            self._stranded.extend((node_id, undo) for undo in undos)

    def replay(self, start: Start, stored: StoredNode) -> Update:
        """End a node of a resumed run as its durable record says, without running it."""
        node_id = start.node
        record = self._nodes[node_id]
        started = stored.record.get("started_at")
        finished = stored.record.get("finished_at")
        record.started_wall = wall_time(started)
        record.finished_wall = wall_time(finished)
        if stored.state == "SUCCEEDED":
            update = self._scheduler.done(node_id, start.attempt)
            record.output = stored.output
            self._outputs[node_id] = stored.output
            self._completions.append(node_id)
            self._event(
                PlanEventKind.COMPLETED,
                node=node_id,
                attempt=stored.attempt,
                data={"restored": True},
            )
            return update
        update = self._scheduler.failed(
            node_id, start.attempt, retry_at=None, timed_out=stored.state == "TIMED_OUT"
        )
        record.error = clean_error(stored.error or "failed before the crash")
        self._event(
            PlanEventKind.FAILED,
            node=node_id,
            attempt=stored.attempt,
            data={"restored": True, "hint": record.error.text},
        )
        return update

    async def compensate_completed(
        self, compensations: Mapping[str, Compensation[Any, Any]], *, run: bool
    ) -> tuple[CompensationOutcome, ...]:
        """Undo completed work, newest completion first (see `compensate_nodes`); on a durable
        log, each undo record is forgotten once its compensation succeeded."""
        txlog = self._log.txlog
        return await compensate_nodes(
            [
                (at, node_id, undo)
                for node_id, record in self._nodes.items()
                for at, undo in record.undos
            ],
            self._stranded,
            compensations,
            run=run,
            record=self._event,
            on_compensated=None if txlog is None else txlog.forget,
        )
