"""The tasks of a plan run's node attempts: a plain tool's call, a guarded node's attempt
through the step core, and an attempt that first waits for its node's late calls.

Each task runs one attempt on the run's loop and posts its end to the run's `Inbox`
(`Finished`, or `Crashed` for an interrupt); cancelling it fences the attempt's context. A
sync tool's call abandoned by a cancellation goes on on its worker: the run finds it with
`_tools.abandoned_call(task)`, and `take` hands it what the guarded attempt's call had
registered on a context of its own, so that those undos wait for that call too
(`_late.LateCalls`).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from .._step import Refused
from .._tools import Outcome, abandoned_call, arun_tool, closed, still_running, with_key
from ._records import Crashed, Finished
from ._results import CompensationStatus

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._tools import Call, Failure, Orphan, UndoRecord
    from ._durable import DurableRun
    from ._late import LateCalls
    from ._people import NodeGate
    from ._records import Attempt, Inbox, NodeRecord

__all__ = ["NodeTasks"]


class NodeTasks:
    """The attempt tasks of one run. `keep(node, undos)` keeps undo records with their node
    (compensated if the run fails); `generations` counts each node's key changes (an earlier
    call of it was compensated), written durably before the call runs, with `flush` after."""

    __slots__ = (
        "_abandoned",
        "_flush",
        "_generations",
        "_keep",
        "_late",
        "_log",
        "_nodes",
        "_people",
        "_sent",
    )

    def __init__(  # noqa: PLR0917  (the run's parts it acts on)
        self,
        people: NodeGate,
        late: LateCalls,
        nodes: Mapping[str, NodeRecord],
        keep: Callable[[str, tuple[UndoRecord, ...]], None],
        generations: dict[str, int],
        log: DurableRun,
        flush: Callable[[], None],
    ) -> None:
        self._people = people
        self._late = late
        self._nodes = nodes
        self._keep = keep
        self._generations = generations
        self._flush = flush
        self._log = log
        #: The call each running guarded attempt sent last (an approver may have edited it).
        self._sent: dict[str, Call] = {}
        #: Undos of a guarded attempt's call abandoned as it ran: they wait for the call.
        self._abandoned: dict[str, tuple[UndoRecord, ...]] = {}

    def take(self, attempt_id: str) -> tuple[Call | None, tuple[UndoRecord, ...]]:
        """For an attempt stopped by the run: the call it sent last through the step core (if
        any), and the undos its own context registered before it was abandoned."""
        return self._sent.pop(attempt_id, None), self._abandoned.pop(attempt_id, ())

    async def plain(self, attempt: Attempt, call: Call, inbox: Inbox) -> None:
        """Run the tool; post its outcome. Cancellation fences the context and ends quietly."""
        import asyncio  # noqa: PLC0415

        try:
            outcome = await arun_tool(call)
        except asyncio.CancelledError:
            closed(attempt.context)
            raise
        except BaseException as exc:  # noqa: BLE001  (KeyboardInterrupt from an async tool)
            closed(attempt.context)
            inbox.post(Crashed(attempt, exc))
            return
        attempt.finished_at = time.monotonic()
        inbox.post(Finished(attempt, outcome))

    async def guarded(self, attempt: Attempt, call: Call, inbox: Inbox) -> None:
        """A node whose tool may need a person: its attempt through the step core
        (`NodeGate.run`), waiting for an approval or a review while independent nodes go on.
        A call still running past its deadline is kept (`_late`) until it returns."""
        import asyncio  # noqa: PLC0415

        node = attempt.node

        def dispatched(sent: Call) -> None:
            abandoned_call(attempt.task)  # an earlier call of the attempt was settled
            self._sent[attempt.id] = sent

        def keep(undos: tuple[UndoRecord, ...]) -> None:
            if sys.exc_info()[1] is not None:  # abandoned as it ran: they wait for it (`take`)
                self._abandoned[attempt.id] = self._abandoned.get(attempt.id, ()) + undos
                return
            abandoned_call(attempt.task)  # its call has returned: kept here, not again
            self._keep(node, undos)

        def keep_running(orphan: Orphan, held: bool) -> None:
            abandoned_call(attempt.task)
            self._late.add(node, attempt.id, orphan._replace(held=held))

        async def again() -> Failure | None:
            # A person decided: the call goes through the gate again only once the node's
            # earlier call has returned, however long that takes (a cancel of the run stops
            # the wait); never a second execution beside it, never a failure for waiting.
            running = bool(self._late.of(node))
            while running:
                running, _ = await self._late.settle(node, call.timeout)
            return None

        def keep_declared(undo: UndoRecord) -> None:
            # A person or the status check said the call happened: its tool's undo, unless a
            # call of the node that returned (here, or in a runner now dead) left one.
            if any(kept.kind == undo.kind for _, kept in self._nodes[node].undos):
                return
            if call.log_undo is not None:
                call.log_undo(undo)
            self._keep(node, (undo,))

        record = self._nodes[node]
        try:
            result = await self._people.run(
                node, call, record.key, keep, keep_running, dispatched, again, keep_declared
            )
        except asyncio.CancelledError:
            closed(attempt.context)
            raise
        except BaseException as exc:  # noqa: BLE001  (KeyboardInterrupt from an async tool)
            closed(attempt.context)
            self._sent.pop(attempt.id, None)
            self._keep(node, self._abandoned.pop(attempt.id, ()))
            inbox.post(Crashed(attempt, exc))
            return
        self._sent.pop(attempt.id, None)
        attempt.finished_at = time.monotonic()
        if isinstance(result, Refused):
            inbox.post(Finished(attempt, Outcome(error=result.failure)))
        else:
            inbox.post(Finished(attempt, result.outcome, result))

    async def after_late(self, attempt: Attempt, call: Call, inbox: Inbox) -> None:
        """A node whose earlier attempt walked away from a call still running: wait for that
        call first (never two at once), up to the node's timeout; if it still runs, the
        attempt fails as timed out. If its undo was compensated, the node's key changes."""
        import asyncio  # noqa: PLC0415

        try:
            running, compensated = await self._late.settle(attempt.node, call.timeout)
        except asyncio.CancelledError:
            closed(attempt.context)
            raise
        if running:
            undos, _ = closed(attempt.context)
            attempt.finished_at = time.monotonic()
            failure = still_running(call, call.timeout)
            inbox.post(Finished(attempt, Outcome(error=failure, undos=undos)))
            return
        if any(c.status is CompensationStatus.COMPLETED for c in compensated):
            call = self._regenerate(attempt, call)
        if call.tool.guarded:
            await self.guarded(attempt, call, inbox)
        else:
            await self.plain(attempt, call, inbox)

    def _regenerate(self, attempt: Attempt, call: Call) -> Call:
        """The node's earlier call was compensated: a key of its own from now on (durable on a
        durable run before the call runs); the call again under it."""
        node = attempt.node
        generation = self._generations[node] = self._generations.get(node, 0) + 1
        record = self._nodes[node]
        record.regenerate(generation)
        log = self._log
        if log.journal is not None:  # durable before the call runs
            log.persist(log.journal.regenerate, node, attempt.id, generation)
            self._flush()
        if call.context is None:
            return call
        old = call.context
        call = with_key(call, record.key)
        closed(old)
        attempt.context = call.context
        return call
