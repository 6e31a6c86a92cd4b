"""Plan nodes that need a person: approval before the call, review when its outcome is unknown.

A guarded node (its tool declared with `needs_approval=`, `check=` or `on_unknown="review"`)
goes through the same guarded attempt as a transaction's step, the step core's
(`_step.attempt`): approval bound to the tool, the digest of the arguments and the plan
version, consumed once before the call starts; a status check asked only once a timed-out
call has returned; a review when it cannot tell. `NodeGate` keeps what is the plan's: it
drives that attempt without blocking the run's loop, shows a node waiting for a person as
`WAITING_APPROVAL` or `NEEDS_REVIEW` while independent nodes go on, polls for the decision
and sends the same call through the gate again; it lists the run's pending requests and
reviews, records each decision's audit event once (built from the stored decision, wherever
it was made), and withdraws what is still pending when the run ends.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Final

from .._approvals import decision_of, request_of, requests_for, review_of
from .._step import Desk, Refused, Settled, Waiting, Where, adrive, attempt, decision_event
from .._tools import Outcome
from ..stores import decision_bell
from ._scheduler import NodeState

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from .._approvals import ApprovalRequest, Requests, Review
    from .._events import EventKind
    from .._json import JSONValue
    from .._tools import Call, Failure, Orphan, UndoRecord
    from ..stores import RequestRow, Store

__all__ = ["NodeGate"]

#: How often a waiting node looks for a decision, at most (seconds); it starts faster.
POLL_MAX: Final = 0.5


class NodeGate:
    """Approvals and reviews of one plan run's nodes (owned by the run's loop; `states` may be
    read from any thread)."""

    __slots__ = (
        "_book",
        "_decisions",
        "_lock",
        "_note",
        "_run_id",
        "_store",
        "_version",
        "durable",
        "states",
    )

    def __init__(
        self,
        run_id: str,
        plan_version: str,
        store: Store,
        note: Callable[
            [EventKind, str | None, str | None, Mapping[str, JSONValue], float | None], None
        ],
    ) -> None:
        self._run_id = run_id
        #: The requests whose decision event was recorded (once each, wherever it was made).
        self._decisions: set[str] = set()
        self._lock = threading.Lock()
        self._version = plan_version
        self._store = store
        self._book: Requests | None = None
        self._note = note
        #: Whether the run is durable (its store holds it under a lease): then consuming an
        #: approval is fenced by that lease (set by the run once its journal is open).
        self.durable = False
        #: The nodes waiting for a person now, with what they wait for.
        self.states: dict[str, NodeState] = {}

    @property
    def book(self) -> Requests:
        """The store's requests (looked up on first use)."""
        if self._book is None:
            self._book = requests_for(self._store)
        return self._book

    def pending_approvals(self) -> tuple[ApprovalRequest, ...]:
        """The run's approval requests waiting for a decision, oldest first."""
        rows = self.book.of_scope(self._run_id)
        return tuple(
            request_of(row) for row in rows if row.kind == "approval" and row.state == "pending"
        )

    def pending_reviews(self) -> tuple[Review, ...]:
        """The run's reviews waiting for a person, oldest first."""
        rows = self.book.of_scope(self._run_id)
        return tuple(
            review_of(row) for row in rows if row.kind == "review" and row.state == "pending"
        )

    async def run(  # noqa: PLR0917  (the node's side of the desk)
        self,
        node: str,
        call: Call,
        key: str,
        keep: Callable[[tuple[UndoRecord, ...]], None],
        keep_running: Callable[[Orphan, bool], None],
        dispatched: Callable[[Call], None],
        again: Callable[[], Awaitable[Failure | None]],
        keep_declared: Callable[[UndoRecord], None] | None = None,
    ) -> Settled | Refused:
        """The node's guarded attempt through the step core (`_step.attempt`, driven without
        blocking the loop): while it waits for a person the node shows `WAITING_APPROVAL` or
        `NEEDS_REVIEW`, and once one decided the same call goes through the gate again.
        `key` is the node's idempotency key; `keep` keeps undo records of a call that has
        returned, `keep_running` one still running (`held`: its outcome is to be decided);
        `dispatched` sees each call just before it runs; `again`, before the call goes through
        the gate again, says why it cannot (an earlier call of the node still runs: the
        attempt fails with that); `keep_declared` is the node's `Desk.keep_declared`. A node
        writes to the run's one overlay, never rewound per node: an unknown attempt has no
        writes of its own to drop."""
        where = Where(
            "plan", self._run_id, node=node, plan_version=self._version, durable=self.durable
        )

        def note(kind: EventKind, actor: str | None, data: Mapping[str, JSONValue]) -> None:
            self._note(kind, node, actor, data, None)

        desk = Desk(
            where=where,
            book=self.book,
            note=note,
            key_of=lambda sent: key if sent.context is None else sent.context.idempotency_key,
            keep=keep,
            keep_running=keep_running,
            drop_writes=_nothing,
            dispatched=dispatched,
            decided=self._decided,
            prepared_context=call.context,
            keep_declared=keep_declared,
        )
        try:
            while True:
                result = await adrive(attempt(call, desk))
                if not isinstance(result, Waiting):
                    return result
                waited = NodeState.WAITING_APPROVAL
                if result.review is not None:
                    waited = NodeState.NEEDS_REVIEW
                self.states[node] = waited
                await self.wait_decided(result.row_id)
                self.states.pop(node, None)
                if self._runs_again(result):
                    failure = await again()
                    if failure is not None:
                        return Settled(call, Outcome(error=failure))
        finally:
            self.states.pop(node, None)

    def withdraw(self, why: str) -> None:
        """The run has ended: its requests still pending can no longer be decided (nothing to
        do, and no store read, for a run that never asked)."""
        self.states.clear()
        if self._book is not None:
            with contextlib.suppress(Exception):  # the run's end is what matters
                for row in self._book.of_scope(self._run_id):  # decided elsewhere, unseen
                    self._decided(row)
                self._book.withdraw(self._run_id, why, fence=self.durable)

    def decided_row(self, request_id: str) -> None:
        """Record the event of a decision just made on request `request_id` (any thread)."""
        row = self.book.get(request_id, self._run_id)
        if row is not None:
            self._decided(row)

    def _decided(self, row: RequestRow) -> None:
        """Record, once, the event of the decision `row` holds, built from the row wherever
        it was made (`_step.decision_event`), on the node it is about."""
        event = decision_event(row)
        if event is None:
            return
        with self._lock:
            if row.id in self._decisions:
                return
            self._decisions.add(row.id)
        kind, actor, at, data = event
        node = request_of(row).node
        self._note(kind, node, actor, data, at)

    def _runs_again(self, waited: Waiting) -> bool:
        """Whether the call runs after the decision on what it `waited` for (not when a
        person said the reviewed call happened)."""
        if waited.review is None:
            return True
        row = self.book.get(waited.row_id)
        return row is None or decision_of(row).get("outcome") != "done"

    async def wait_decided(self, row_id: str) -> None:
        """Return once request or review `row_id` is no longer pending: asked again after
        10 ms, doubling up to `POLL_MAX`, each sleep cut short by the store's bell when a
        decision is made (`LISTEN`/`NOTIFY` on PostgreSQL)."""
        bell = decision_bell(self._store)
        delay = 0.01
        while True:
            mark = bell.mark()
            row = self.book.get(row_id)
            if row is None or row.state != "pending":
                return
            await bell.asleep(delay, mark)
            delay = min(2 * delay, POLL_MAX)


def _nothing() -> None:
    """What a plan node's unknown attempt drops: nothing (see `NodeGate.run`)."""
