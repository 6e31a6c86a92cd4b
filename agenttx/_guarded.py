"""Guarded calls: a step whose tool needs a person's approval, or whose outcome may be unknown.

`Guarded` is mixed into `Transaction`. A call of a guarded tool (`Tool.guarded`: declared
with `needs_approval=`, `check=` or `on_unknown="review"`) passes the gate first
(`_approvals.gate_action`): it waits for approval (`NEEDS_APPROVAL`), fails if rejected, or
consumes its approval (one compare-and-set in the store, durable before the tool runs) and
runs with the approved arguments. A call whose outcome is unknown (it timed out while its
tool still ran, or the process ended after its approval was consumed and before its result
was recorded) is never retried blindly: the tool's status check decides, and without one, or
if it cannot tell, a person reviews it (`NEEDS_REVIEW`). Nothing is rewound while a call
waits: the transaction stays on that step.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Protocol

from ._approvals import approval_expired, call_digest, request_of, review_of
from ._errors import FailedPrecondition
from ._events import EventKind
from ._results import StepResult, StepStatus, TxStatus
from ._step import (
    Desk,
    Refused,
    Settled,
    Waiting,
    Where,
    adrive,
    attempt,
    blocking_request,
    decision_event,
    drive,
    finish,
    unsettled,
    validate_edit,
)
from ._tools import Call, Failure, derive_key
from .stores import is_durable

if TYPE_CHECKING:
    import threading
    from collections.abc import Mapping

    from ._approvals import Approval, ApprovalRequest, Requests, Review
    from ._events import EventSink
    from ._json import JSONValue
    from ._saga import SagaLedger
    from ._settings import Settings
    from ._timeline import Timeline
    from ._tools import Orphans, Outcome, ToolRegistry
    from .stores import RequestRow, Store

__all__ = ["Guarded"]


class _Host(Protocol):
    """What `Guarded` needs of the transaction it is mixed into."""

    _id: str
    _store: Store
    _settings: Settings
    _registry: ToolRegistry
    _ledger: SagaLedger
    _timeline: Timeline
    _constraints: list[str]
    _state_lock: threading.RLock
    _orphans: Orphans
    _decisions: set[str]
    _requests: Requests | None
    _events: EventSink

    def _book(self) -> Requests: ...
    def _note(
        self,
        kind: str,
        step: int | None,
        actor: str | None = None,
        data: Mapping[str, JSONValue] | None = None,
    ) -> None: ...
    def _transition(self, target: TxStatus) -> None: ...
    def _dispatched(self, call: Call) -> None: ...
    def _succeed(self, call: Call, outcome: Outcome) -> StepResult: ...
    def _fail(self, step_id: int, failure: Failure) -> StepResult: ...
    def _settle(self, call: Call, outcome: Outcome) -> StepResult: ...
    def _waiting(
        self, call: Call, *, approval: ApprovalRequest | None = None, review: Review | None = None
    ) -> StepResult: ...
    def _desk(self, call: Call) -> Desk: ...
    def _unless_blocked(self, call: Call) -> Call | Failure: ...
    def _check_settled(self) -> None: ...
    def _guarded_result(self, call: Call, result: Settled | Waiting | Refused) -> StepResult: ...
    def _key_of(self, call: Call) -> str: ...
    def _validate_edit(self, tool: str, arguments: object, schema: JSONValue) -> JSONValue: ...
    def _decided_row(self, request_id: str) -> None: ...
    def _decided(self, row: RequestRow) -> None: ...
    def _note_decisions(self) -> None: ...
    def _withdraw(self, final: TxStatus) -> None: ...
    def _waits_for_person(self) -> bool: ...


class Guarded:
    """Approvals, status checks and reviews for a transaction's steps (mixed into it)."""

    __slots__ = ()

    # ------------------------------------------------------------ deciding (any thread)

    def approve(
        self: _Host,
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
        approval = self._book().approve(
            request_id,
            actor=actor,
            expires_in=expires_in,
            note=note,
            arguments=arguments,
            scope_id=self._id,
            validate=self._validate_edit,
        )
        self._decided_row(request_id)
        return approval

    def reject(self: _Host, request_id: str, *, actor: str, reason: str) -> None:
        """Reject request `request_id` of this transaction, as `actor`, for `reason`.

        When the agent sends that call again its step fails with a hint carrying the reason,
        so that it can change course. Raises as `approve` does, and `InvalidArgument` for an
        empty reason.
        """
        self._book().reject(request_id, actor=actor, reason=reason, scope_id=self._id)
        self._decided_row(request_id)

    def resolve_review(
        self: _Host,
        review_id: str,
        *,
        outcome: str,
        output: JSONValue = None,
        actor: str,
    ) -> None:
        """Say whether the call under review `review_id` happened, as `actor`.

        `outcome="done"` records `output` as the call's output when the agent sends the call
        again (the tool does not run); `"not_done"` runs it again then, with the same
        idempotency key. Raises `InvalidArgument` (an empty actor, another outcome) or
        `ReviewNotFound` (not a pending review of this transaction).
        """
        self._book().resolve_review(
            review_id, outcome=outcome, output=output, actor=actor, scope_id=self._id
        )
        self._decided_row(review_id)

    def pending_approvals(self: _Host) -> tuple[ApprovalRequest, ...]:
        """This transaction's approval requests waiting for a decision, oldest first."""
        return tuple(
            request_of(row)
            for row in self._book().of_scope(self._id)
            if row.kind == "approval" and row.state == "pending"
        )

    def pending_reviews(self: _Host) -> tuple[Review, ...]:
        """This transaction's reviews waiting for a person, oldest first."""
        return tuple(
            review_of(row)
            for row in self._book().of_scope(self._id)
            if row.kind == "review" and row.state == "pending"
        )

    # ------------------------------------------------------------ the step (holds the turn)

    def _note(
        self: _Host,
        kind: str,
        step: int | None,
        actor: str | None = None,
        data: Mapping[str, JSONValue] | None = None,
    ) -> None:
        """Record an audit event (`EventKind[kind]`) on the transaction's sink."""
        self._events.emit(EventKind[kind], step=step, actor=actor, data=data)

    def _waits_for_person(self: _Host) -> bool:
        """Whether a call of this transaction waits for a person, or for the agent to send it
        again after one decided (no store read for a transaction that never asked)."""
        if self._requests is None:
            return False
        now = time.time()
        for row in self._requests.of_scope(self._id):
            if row.state in ("pending", "resolved"):
                return True
            if row.state == "approved" and not approval_expired(row, now):
                return True
        return False

    def _withdraw(self: _Host, final: TxStatus) -> None:
        """The transaction ended: its requests still pending can no longer be decided."""
        if self._requests is None:  # it never asked: nothing to withdraw, no store read
            return
        with contextlib.suppress(Exception):  # the end is what matters
            self._note_decisions()
        fence = final is not TxStatus.COMMITTED and is_durable(self._store)  # held: an abort
        with contextlib.suppress(Exception):  # the end is what matters; a listing filters them
            self._requests.withdraw(self._id, f"the transaction ended {final.value}", fence=fence)

    def _decided_row(self: _Host, request_id: str) -> None:
        """Record the event of a decision just made here, from its row as stored."""
        row = self._book().get(request_id, self._id)
        if row is not None:
            self._decided(row)

    def _decided(self: _Host, row: RequestRow) -> None:
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

    def _note_decisions(self: _Host) -> None:
        """Record the events of decisions made elsewhere and not yet seen by a call (before
        the transaction ends: its trail is stored then)."""
        if self._requests is None:
            return
        for row in self._requests.of_scope(self._id):
            self._decided(row)

    def _validate_edit(self: _Host, tool: str, arguments: object, schema: JSONValue) -> JSONValue:
        """Edited arguments as the tool will get them; `InvalidArgument` if they do not fit."""
        return validate_edit(tool, arguments, self._registry.get(tool), schema)

    def _desk(self: _Host, call: Call) -> Desk:
        """What the step core needs of this transaction for the guarded attempt of `call`."""
        step, orphans = call.step_id, self._orphans

        def note(kind: EventKind, actor: str | None, data: Mapping[str, JSONValue]) -> None:
            self._events.emit(kind, step=step, actor=actor, data=data)

        def drop_writes() -> None:
            self._store.restore(self._id, step)

        return Desk(
            where=Where("transaction", self._id, step, durable=is_durable(self._store)),
            book=self._book(),
            note=note,
            key_of=self._key_of,
            keep=self._ledger.record,
            keep_running=lambda orphan, held: orphans.add(orphan._replace(held=held)),
            drop_writes=drop_writes,
            dispatched=self._dispatched,
            decided=self._decided,
            prepared_context=call.context,
        )

    def _run_guarded(self: _Host, call: Call) -> StepResult:
        """Run a guarded call through the step core (`_step.attempt`), in this thread."""
        result = drive(attempt(call, self._desk(call)), self._settings.output_serializer)
        return self._guarded_result(call, result)

    async def _arun_guarded(self: _Host, call: Call) -> StepResult:
        """`_run_guarded` for `aexecute_step`: the tool, the waits and the status check run
        without blocking the event loop."""
        work = attempt(call, self._desk(call))
        result = await adrive(work, self._settings.output_serializer)
        return self._guarded_result(call, result)

    def _guarded_result(self: _Host, call: Call, result: Settled | Waiting | Refused) -> StepResult:
        """The step's result once the step core ended the attempt."""
        if isinstance(result, Waiting):
            return self._waiting(call, approval=result.approval, review=result.review)
        if isinstance(result, Refused):
            return self._fail(call.step_id, result.failure)
        try:
            if result.decided:
                return self._succeed(result.call, result.outcome)
            return self._settle(result.call, result.outcome)
        finally:  # after the step is recorded: a crash before this finds it recorded
            finish(self._book(), result, fence=is_durable(self._store))

    def _unless_blocked(self: _Host, call: Call) -> Call | Failure:
        """The call, unless its step waits for a person (or an unknown outcome) on another
        call: then the agent's mistake, and nothing runs
        (docs/protocol.md#the-lifecycle-of-a-tool-call)."""
        if self._requests is None:  # it never asked: nothing can block
            return call
        digest = call_digest(call.tool.name, call.arguments)
        row = blocking_request(self._requests.of_scope(self._id), call.step_id, digest)
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

    def _check_settled(self: _Host) -> None:
        """Raise `FailedPrecondition` while a call of this transaction waits for a person or
        has an unknown outcome: committing would drop it unrecorded."""
        if self._requests is None:
            return
        waiting = unsettled(self._requests.of_scope(self._id), self._timeline.steps)
        if waiting:
            ids = ", ".join(f"`{row.id}` ({row.kind} {row.state})" for row in waiting)
            raise FailedPrecondition(
                f"transaction `{self._id}` cannot commit: {ids} still waits for a person or an "
                "unknown outcome; decide it, send the call again, or roll back"
            )

    def _key_of(self: _Host, call: Call) -> str:
        """The call's idempotency key (its context's, or the one it would have)."""
        if call.context is not None:
            return call.context.idempotency_key
        generation = self._timeline.generation
        return derive_key(self._id, call.step_id, call.tool.name, call.arguments, generation)

    def _waiting(
        self: _Host,
        call: Call,
        *,
        approval: ApprovalRequest | None = None,
        review: Review | None = None,
    ) -> StepResult:
        """The step waits for a person: nothing rewound, the same step is next."""
        with self._state_lock:
            timeline = self._timeline
            call_id = timeline.call_id
            timeline.pending = None
            timeline.call_id = None
        self._transition(TxStatus.ACTIVE)
        return StepResult(
            status=StepStatus.NEEDS_APPROVAL if approval is not None else StepStatus.NEEDS_REVIEW,
            step_id=call.step_id,
            next_step_id=call.step_id,
            constraints=tuple(self._constraints),
            call_id=call_id,
            approval=approval,
            review=review,
        )
