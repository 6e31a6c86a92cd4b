"""The people desk of a transaction: approvals, reviews, and what waits for a person (`People`).

A call of a guarded tool (`Tool.guarded`: declared with `needs_approval=`, `check=` or
`on_unknown="review"`) goes through the step core (`_step.attempt`) with this desk's `Desk`:
it waits for approval (`NEEDS_APPROVAL`), fails if rejected, or consumes its approval (one
compare-and-set in the store, durable before the tool runs) and runs with the approved
arguments. A call whose outcome is unknown is never retried blindly: the tool's status check
decides, and without one, or if it cannot tell, a person reviews it (`NEEDS_REVIEW`). Nothing
is rewound while a call waits: the transaction stays on that step.
"""

from __future__ import annotations

import contextlib
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from .._approvals import approval_expired, call_digest, request_of, requests_for, review_of
from .._errors import FailedPrecondition
from .._events import EventKind
from .._results import TxStatus
from .._step import (
    Desk,
    Settled,
    Where,
    blocking_request,
    decision_event,
    edit_check,
    finish,
    unsettled,
)
from .._tools import Call, Failure, closed, derive_key, keep_abandoned
from ..stores import is_durable

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._approvals import Approval, ApprovalRequest, Requests, Review
    from .._events import EventSink
    from .._json import JSONValue
    from .._saga import SagaLedger
    from .._timeline import Timeline
    from .._tools import Orphans, ToolRegistry, UndoRecord
    from ..stores import RequestRow, Store

__all__ = ["People"]


class People:
    """A transaction's requests to people, and the step core's `Desk` for its guarded calls.

    `requests` is the store's book of approval requests and reviews once the transaction has
    asked a person (or was found to have, on resume), else None: a transaction that never
    asked reads nothing from the store for its people, so `requests is None` is the cheap test
    the step path makes before `unless_blocked`. Deciding (`approve`, `reject`,
    `resolve_review`) and the listings are safe from any thread, while a call runs: the book's
    compare-and-set is the only synchronization. Everything else is called by the transaction
    while it holds its turn. Each decision is recorded once in the audit trail, built from the
    stored row (`_step.decision_event`), wherever it was made. Ending a transaction withdraws
    its requests still pending; a failing store never stops an ending here (the end is what
    matters).
    """

    __slots__ = (
        "_decisions",
        "_events",
        "_ledger",
        "_orphans",
        "_registry",
        "_store",
        "_timeline",
        "_tx_id",
        "requests",
    )

    def __init__(
        self,
        tx_id: str,
        *,
        store: Store,
        registry: ToolRegistry,
        events: EventSink,
        ledger: SagaLedger,
        orphans: Orphans,
        timeline: Timeline,
    ) -> None:
        self._tx_id = tx_id
        self._store = store
        self._registry = registry
        self._events = events
        self._ledger = ledger
        self._orphans = orphans
        self._timeline = timeline
        self.requests: Requests | None = None
        self._decisions: set[str] = set()  # the requests whose decision event is in the trail

    def book(self) -> Requests:
        """The store's approval requests and reviews (looked up on first use)."""
        book = self.requests
        if book is None:
            book = self.requests = requests_for(self._store)
        return book

    def adopt(self) -> None:
        """On resume: if the transaction had asked a person, its requests block and gate again."""
        book = requests_for(self._store)
        if book.of_scope(self._tx_id):
            self.requests = book

    # ------------------------------------------------------------ deciding (any thread)

    def approve(
        self,
        request_id: str,
        *,
        actor: str,
        expires_in: float | None,
        note: str,
        arguments: Mapping[str, Any] | None,
    ) -> Approval:
        """Approve request `request_id` (`Transaction.approve`)."""
        approval = self.book().approve(
            request_id,
            actor=actor,
            expires_in=expires_in,
            note=note,
            arguments=arguments,
            scope_id=self._tx_id,
            validate=edit_check(self._registry.get),
        )
        self._decided_row(request_id)
        return approval

    def reject(self, request_id: str, *, actor: str, reason: str) -> None:
        """Reject request `request_id` (`Transaction.reject`)."""
        self.book().reject(request_id, actor=actor, reason=reason, scope_id=self._tx_id)
        self._decided_row(request_id)

    def resolve_review(
        self, review_id: str, *, outcome: str, output: JSONValue, actor: str
    ) -> None:
        """Say whether the call under review happened (`Transaction.resolve_review`)."""
        self.book().resolve_review(
            review_id, outcome=outcome, output=output, actor=actor, scope_id=self._tx_id
        )
        self._decided_row(review_id)

    def pending_approvals(self) -> tuple[ApprovalRequest, ...]:
        """The approval requests waiting for a decision, oldest first."""
        return tuple(
            request_of(row)
            for row in self.book().of_scope(self._tx_id)
            if row.kind == "approval" and row.state == "pending"
        )

    def pending_reviews(self) -> tuple[Review, ...]:
        """The reviews waiting for a person, oldest first."""
        return tuple(
            review_of(row)
            for row in self.book().of_scope(self._tx_id)
            if row.kind == "review" and row.state == "pending"
        )

    # ------------------------------------------------------------ the step (holds the turn)

    def note(
        self,
        kind: str,
        step: int | None,
        actor: str | None = None,
        data: Mapping[str, JSONValue] | None = None,
    ) -> None:
        """Record an audit event (`EventKind[kind]`) on the transaction's sink."""
        self._events.emit(EventKind[kind], step=step, actor=actor, data=data)

    def desk(
        self, call: Call, dispatched: Callable[[Call], None], call_id: str | None = None
    ) -> Desk:
        """What the step core needs of this transaction for the guarded attempt of `call`
        (`dispatched`: the step pipeline's, called as the tool is about to run; `call_id`: the
        model's id of the call, recorded with a request asked for it)."""
        step, orphans, store, tx_id = call.step_id, self._orphans, self._store, self._tx_id

        def note(kind: EventKind, actor: str | None, data: Mapping[str, JSONValue]) -> None:
            self._events.emit(kind, step=step, actor=actor, data=data)

        def drop_writes() -> None:
            store.restore(tx_id, step)

        return Desk(
            where=Where("transaction", tx_id, step, durable=is_durable(store), call_id=call_id),
            book=self.book(),
            note=note,
            key_of=self._key_of,
            keep=self._ledger.record,
            keep_running=lambda orphan, held: orphans.add(orphan._replace(held=held)),
            drop_writes=drop_writes,
            dispatched=dispatched,
            decided=self._decided,
            prepared_context=call.context,
            abandoned=self._abandoned,
            keep_declared=partial(self._keep_declared, call.log_undo),
        )

    def _keep_declared(
        self, log_undo: Callable[[UndoRecord], object] | None, record: UndoRecord
    ) -> None:
        """`Desk.keep_declared`: durable (`log_undo`) before the step is recorded."""
        if any(
            r.step_id == record.step_id and r.kind == record.kind for r in self._ledger.pending()
        ):
            return  # its call returned in this process: the undo kept then has its real output
        if log_undo is not None:
            log_undo(record)
        self._ledger.record((record,))

    def _abandoned(self, call: Call) -> None:
        """A guarded call abandoned as it ran: kept as running while its worker runs it."""
        undos, _ = closed(call.context)
        if not keep_abandoned(self._orphans, call, undos):
            self._ledger.record(undos)

    def finish(self, settled: Settled, *, ended: bool = False) -> None:
        """After the transaction recorded `settled`: end the row that guarded its call, fenced
        by the lease while the transaction is open (once the call's failure `ended` it, its own
        abort let the store go)."""
        finish(self.book(), settled, fence=is_durable(self._store) and not ended)

    def unless_blocked(self, call: Call) -> Call | Failure:
        """The call, unless its step waits for a person (or an unknown outcome) on another
        call: then the agent's mistake, and nothing runs
        (docs/protocol.md#the-lifecycle-of-a-tool-call)."""
        if self.requests is None:  # it never asked: nothing can block
            return call
        digest = call_digest(call.tool.name, call.arguments)
        row = blocking_request(self.requests.of_scope(self._tx_id), call.step_id, digest)
        if row is None:
            return call
        what = {"approval": "an approval of", "review": "a review of"}.get(
            row.kind, "the outcome of"
        )
        return Failure(
            f"step {call.step_id} waits for {what} another call of tool "
            f"'{request_of(row).tool}' (`{row.id}`): send that call again once a person has "
            "decided, or roll back; this call did not run",
            mistake=True,
        )

    def waits_for_person(self) -> bool:
        """Whether a call of this transaction waits for a person, or for the agent to send it
        again after one decided (no store read for a transaction that never asked)."""
        if self.requests is None:
            return False
        now = time.time()
        for row in self.requests.of_scope(self._tx_id):
            if row.state in ("pending", "resolved"):
                return True
            if row.state == "approved" and not approval_expired(row, now):
                return True
        return False

    def check_settled(self) -> None:
        """The commit precondition: raise `FailedPrecondition` while a call of this transaction
        waits for a person or has an unknown outcome (committing would drop it unrecorded)."""
        if self.requests is None:
            return
        waiting = unsettled(self.requests.of_scope(self._tx_id), self._timeline.steps)
        if waiting:
            ids = ", ".join(f"`{row.id}` ({row.kind} {row.state})" for row in waiting)
            raise FailedPrecondition(
                f"transaction `{self._tx_id}` cannot commit: {ids} still waits for a person or "
                "an unknown outcome; decide it, send the call again, or roll back"
            )

    def note_decisions(self) -> None:
        """Record the events of decisions made elsewhere and not yet seen by a call (before
        the transaction ends: its trail is stored then)."""
        if self.requests is None:
            return
        for row in self.requests.of_scope(self._tx_id):
            self._decided(row)

    def rewound(self, target: int, *, dropped: bool) -> None:
        """A rewind to `target` is done (`dropped`: it dropped steps, else it only undid the
        step at `target`, which is sent again at its own number)."""
        if self.requests is None:
            return
        why = f"step rewound to {target}"
        if dropped:
            # What waited at a step the rewind drops waits no more (a step sent again at its
            # own number drops nothing: what waits there still blocks it).
            self.requests.withdraw(self._tx_id, why, from_step=target)
        elif self._timeline.undid:
            # The rewind compensated the step's call: its outcome is known (undone), so what
            # waited on it there (a review, a started call) waits no more, and the call sent
            # again gets a new key and, if it needs one, a new approval.
            self.requests.withdraw(self._tx_id, why, from_step=target)

    def pending_review_at(self, step: int) -> Review | None:
        """The pending review of this transaction's `step`, if any."""
        if self.requests is None:
            return None
        for row in self.requests.of_scope(self._tx_id):
            if row.kind == "review" and row.state == "pending" and review_of(row).step == step:
                return review_of(row)
        return None

    def withdraw(self, final: TxStatus) -> None:
        """The transaction ended: its requests still pending can no longer be decided."""
        if self.requests is None:  # it never asked: nothing to withdraw, no store read
            return
        with contextlib.suppress(Exception):  # the end is what matters
            self.note_decisions()
        fence = final is not TxStatus.COMMITTED and is_durable(self._store)  # held: an abort
        with contextlib.suppress(Exception):  # the end is what matters; a listing filters them
            self.requests.withdraw(self._tx_id, f"the transaction ended {final.value}", fence=fence)

    # ------------------------------------------------------------ helpers

    def _decided_row(self, request_id: str) -> None:
        """Record the event of a decision just made here, from its row as stored."""
        row = self.book().get(request_id, self._tx_id)
        if row is not None:
            self._decided(row)

    def _decided(self, row: RequestRow) -> None:
        """Record, once, the event of the person's decision `row` holds, wherever it was made
        (built from the row: `_step.decision_event`)."""
        if row.id in self._decisions:
            return
        event = decision_event(row)
        if event is None:
            return
        self._decisions.add(row.id)
        kind, actor, at, data = event
        request = review_of(row)
        step = request.step if isinstance(request.step, int) else None
        self._events.emit(kind, step=step, actor=actor, data=data, at=at)

    def _key_of(self, call: Call) -> str:
        """The call's idempotency key (its context's, or the one it would have)."""
        if call.context is not None:
            return call.context.idempotency_key
        generation = self._timeline.generation
        return derive_key(self._tx_id, call.step_id, call.tool.name, call.arguments, generation)
