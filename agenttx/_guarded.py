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
from typing import TYPE_CHECKING, Any, Final, Protocol

from ._approvals import (
    CheckResult,
    approval_expired,
    approval_of,
    call_digest,
    check_outcome,
    decision_of,
    gate_action,
    needs_approval,
    request_of,
    review_of,
)
from ._errors import InvalidArgument
from ._events import EventKind
from ._json import checked_size_bound
from ._results import StepResult, StepStatus, TxStatus
from ._tools import Call, Failure, Outcome, arun_tool, derive_key, run_tool, with_key
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
    from ._tools import ToolRegistry
    from .stores import RequestRow, Store

__all__ = ["Guarded"]

#: Why a call consumed here found at its step again had no recorded outcome.
_ENDED_WHILE_RUNNING: Final = (
    "the call started (its approval was consumed) but its outcome was never recorded: "
    "the process ended, or the step was interrupted, while the tool ran"
)


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
    _guard: RequestRow | None
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
    def _gate(self, call: Call) -> Call | Failure | StepResult: ...
    def _waiting(
        self, call: Call, *, approval: ApprovalRequest | None = None, review: Review | None = None
    ) -> StepResult: ...
    def _settle_guarded(self, call: Call, outcome: Outcome, *, retried: bool) -> StepResult: ...
    def _unknown(
        self,
        call: Call,
        guard: RequestRow | None,
        errors: list[str],
        *,
        check: bool = True,
        undos: tuple[Any, ...] = (),
    ) -> StepResult: ...
    def _reviewed(self, call: Call, row: RequestRow) -> StepResult: ...
    def _key_of(self, call: Call) -> str: ...
    def _validate_edit(self, tool: str, arguments: JSONValue) -> JSONValue: ...
    def _step_of(self, request_id: str) -> int | None: ...
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
        data: dict[str, JSONValue] = {
            "request": request_id,
            "note": note,
            "edited": approval.edited,
        }
        if approval.expires_at is not None:
            data["expires_at"] = approval.expires_at.isoformat()
        self._note("APPROVED", self._step_of(request_id), actor, data)
        return approval

    def reject(self: _Host, request_id: str, *, actor: str, reason: str) -> None:
        """Reject request `request_id` of this transaction, as `actor`, for `reason`.

        When the agent sends that call again its step fails with a hint carrying the reason,
        so that it can change course. Raises as `approve` does, and `InvalidArgument` for an
        empty reason.
        """
        self._book().reject(request_id, actor=actor, reason=reason, scope_id=self._id)
        data: dict[str, JSONValue] = {"request": request_id, "reason": reason}
        self._note("REJECTED", self._step_of(request_id), actor, data)

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
        data: dict[str, JSONValue] = {"review": review_id, "outcome": outcome}
        self._note("REVIEWED", self._step_of(review_id), actor, data)

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
        with contextlib.suppress(Exception):  # the end is what matters; a listing filters them
            self._requests.withdraw(self._id, f"the transaction ended {final.value}")

    def _step_of(self: _Host, request_id: str) -> int | None:
        """The step a request or review of this transaction is about (for its event)."""
        row = self._book().get(request_id, self._id)
        step = None if row is None else review_of(row).step
        return step if isinstance(step, int) else None

    def _validate_edit(self: _Host, tool: str, arguments: JSONValue) -> JSONValue:
        """Edited arguments as the tool will get them; `InvalidArgument` if they do not fit."""
        found = self._registry.get(tool)
        if found is None:
            return arguments
        checked, violation = found.validator.check(arguments)
        if violation is not None:
            raise InvalidArgument(
                f"the edited arguments do not fit tool `{tool}`: {violation.message}"
            )
        return checked

    def _run_guarded(self: _Host, call: Call) -> StepResult:
        """Run a guarded call: through the gate, then its tool, then its outcome settled."""
        gated = self._gate(call)
        if isinstance(gated, StepResult):
            return gated
        if isinstance(gated, Failure):
            return self._fail(call.step_id, gated)
        self._dispatched(gated)
        outcome = run_tool(gated, self._settings.output_serializer)
        return self._settle_guarded(gated, outcome, retried=False)

    async def _arun_guarded(self: _Host, call: Call) -> StepResult:
        """`_run_guarded` for `aexecute_step`: the tool runs as `arun_tool` runs it (an async
        tool in the caller's task); the gate, a status check and the bookkeeping are sync."""
        gated = self._gate(call)
        if isinstance(gated, StepResult):
            return gated
        if isinstance(gated, Failure):
            return self._fail(call.step_id, gated)
        self._dispatched(gated)
        outcome = await arun_tool(gated, self._settings.output_serializer)
        return self._settle_guarded(gated, outcome, retried=False)

    def _gate(self: _Host, call: Call) -> Call | Failure | StepResult:  # noqa: PLR0911 (one per action)
        """The call to run (its approval consumed), why it fails, or the result that waits."""
        tool, step = call.tool, call.step_id
        book = self._book()
        digest = call_digest(tool.name, call.arguments)
        rule = tool.needs_approval
        needs = needs_approval(rule, tool.name, call.arguments) if rule is not False else False
        why = needs if isinstance(needs, str) else None
        while True:
            action, row = gate_action(
                book.of_scope(self._id), digest, step, needs=needs is not False
            )
            if action == "run":
                if tool.on_unknown == "review" and is_durable(self._store):
                    key = self._key_of(call)  # its start is durable before it runs
                    started: RequestRow | None = book.started(
                        scope_id=self._id,
                        step=step,
                        tool=tool.name,
                        arguments=call.arguments,
                        digest=digest,
                        key=key,
                        fence=True,
                    )
                    self._guard = started
                return call
            if action == "review":
                assert row is not None
                return self._waiting(call, review=review_of(row))
            if action == "resolved":
                assert row is not None
                if book.apply_review(row):
                    return self._reviewed(call, row)
                continue  # taken meanwhile: look again
            if action == "unknown":
                assert row is not None
                approval = approval_of(row.id, decision_of(row))
                if approval.edited:
                    call = call._replace(arguments=approval.arguments)
                return self._unknown(call, row, [_ENDED_WHILE_RUNNING])
            if action == "pending":
                assert row is not None
                return self._waiting(call, approval=request_of(row))
            if action == "rejected":
                assert row is not None
                decision = decision_of(row)
                return Failure(
                    f"the call of tool '{tool.name}' was rejected by {decision.get('actor')}: "
                    f"{decision.get('reason')}; do not send it again unchanged",
                    mistake=True,
                )
            if action == "approved":
                assert row is not None
                if approval_expired(row, time.time()):
                    if book.expire(row):
                        self._note("APPROVAL_EXPIRED", step, None, {"request": row.id})
                    continue
                key = self._key_of(call)
                if not book.consume(row, step=step, key=key, fence=is_durable(self._store)):
                    continue  # consumed or changed meanwhile: look again
                approval = approval_of(row.id, decision_of(row))
                consumed: dict[str, JSONValue] = {"request": row.id, "edited": approval.edited}
                self._note("APPROVAL_CONSUMED", step, approval.actor, consumed)
                self._guard = book.get(row.id)
                return with_key(call, key, approval.arguments if approval.edited else None)
            request = book.request(
                scope="transaction",
                scope_id=self._id,
                step=step,
                tool=tool.name,
                arguments=call.arguments,
                digest=digest,
                why=why,
            )
            data: dict[str, JSONValue] = {"request": request.id, "tool": tool.name}
            self._note("APPROVAL_REQUESTED", step, None, data)
            return self._waiting(call, approval=request)

    def _key_of(self: _Host, call: Call) -> str:
        """The call's idempotency key (its context's, or the one it would have)."""
        if call.context is not None:
            return call.context.idempotency_key
        rewinds = self._timeline.rewinds
        return derive_key(self._id, call.step_id, call.tool.name, call.arguments, rewinds)

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

    def _settle_guarded(self: _Host, call: Call, outcome: Outcome, *, retried: bool) -> StepResult:
        """Settle a guarded call's outcome; one that timed out while running is unknown."""
        guard, self._guard = self._guard, None
        if outcome.running is not None and call.tool.on_unknown == "review":
            assert outcome.error is not None
            errors = [outcome.error.message + " while the tool still ran"]
            return self._unknown(call, guard, errors, check=not retried, undos=outcome.undos)
        try:
            return self._settle(call, outcome)
        finally:  # after the step is recorded: a crash before this finds it recorded
            if guard is not None:
                failed = outcome.error is not None or outcome.refused is not None
                self._book().finish(guard, "failed" if failed else "succeeded")

    def _unknown(
        self: _Host,
        call: Call,
        guard: RequestRow | None,
        errors: list[str],
        *,
        check: bool = True,
        undos: tuple[Any, ...] = (),
    ) -> StepResult:
        """A call whose outcome is unknown: its status check decides, else a person does."""
        book, step, tool = self._book(), call.step_id, call.tool
        key = self._key_of(call)
        if guard is not None:
            key = str(decision_of(guard).get("idempotency_key") or key)
        self._note("OUTCOME_UNKNOWN", step, None, {"tool": tool.name, "reason": errors[0]})
        if undos:  # undone by a later rewind (compensations are idempotent)
            self._ledger.record(undos)
        started = time.monotonic()
        if check:
            timeout = self._settings.step_timeout
            verdict = check_outcome(tool.check, call.arguments, key, timeout, errors)
        else:
            verdict = CheckResult.unknown()
            errors.append("it timed out again")
        checked_in = time.monotonic() - started
        if verdict.status == "done":
            output = verdict.output
            try:
                return self._succeed(call, Outcome(output=output, size=checked_size_bound(output)))
            finally:
                if guard is not None:
                    book.finish(guard, "done (status check)")
        self._store.restore(self._id, step)  # what the unknown attempt wrote is dropped
        if verdict.status == "not_done":
            if guard is not None:
                self._guard = guard
            retry = with_key(call, key)
            self._dispatched(retry)
            return self._settle_guarded(
                retry, run_tool(retry, self._settings.output_serializer), retried=True
            )
        review = book.open_review(
            scope="transaction",
            scope_id=self._id,
            step=step,
            tool=tool.name,
            arguments=call.arguments,
            digest=guard.digest if guard is not None else call_digest(tool.name, call.arguments),
            idempotency_key=key,
            errors=errors,
            timings={"timeout_s": call.timeout, "check_s": round(checked_in, 6)},
        )
        if guard is not None:
            book.finish(guard, f"review {review.id}")
        self._note("REVIEW_REQUESTED", step, None, {"review": review.id, "tool": tool.name})
        return self._waiting(call, review=review)

    def _reviewed(self: _Host, call: Call, row: RequestRow) -> StepResult:
        """Apply a resolved review to the call sent again: its output, or a retry."""
        decision = decision_of(row)
        review = review_of(row)
        call = call._replace(arguments=review.arguments)  # an approver's edit, if any
        if decision.get("outcome") == "done":
            output = decision.get("output")
            return self._succeed(call, Outcome(output=output, size=checked_size_bound(output)))
        retry = with_key(call, review.idempotency_key)
        self._dispatched(retry)
        return self._settle_guarded(
            retry, run_tool(retry, self._settings.output_serializer), retried=True
        )
