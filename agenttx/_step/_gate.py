"""One guarded attempt, for a transaction's step and a plan's node alike: the approval gate,
the run, and an outcome that may be unknown, written once as a generator of actions.

`attempt(call, desk)` decides everything about a call of a guarded tool (declared with
`needs_approval=`, `check=` or `on_unknown="review"`): whether it waits for a person, fails
because a person rejected it, consumes its approval (one compare-and-set, durable before the
tool runs, fenced by the worker's lease on a durable store), runs, and what happens when its
outcome is unknown. It yields the actions whose form depends on sync or async code (`Run` the
tool, `AwaitReturn` of a call past its deadline, `Check` its status) and a driver
(`_drive.drive` or `_drive.adrive`) performs them; the store's bookkeeping and the host's own
side (`Desk`: audit events, undo records, a call still running, dropping what an unknown
attempt wrote) are plain calls. It returns the attempt's end: `Settled` (an outcome to record,
then `finish`), `Waiting` (a person decides) or `Refused` (a person rejected the call).

The rules it enforces, for both hosts:
- the status check is asked only once the call has returned: a call still running past its
  deadline is awaited (up to its timeout again), and if it still runs it is kept as running
  (its undo records wait for it, the host blocks further calls and the commit meanwhile) and a
  person reviews it;
- an unknown outcome is never retried blindly: `not_done` retries with the same idempotency
  key (what the unknown attempt wrote dropped first), `unknown` opens a review;
- a second timeout of a retried call is not checked again: a person reviews it;
- a call kept as running writes its declared undo as it returns (`_tools.watch`), and a call
  said `done` keeps the undo its tool declares unless its return left one: a process that
  died before that write does not leave the call's effect without an undo.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Generator, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, TypeAlias

import attrs

from .._approvals import (
    ENDED_WHILE_RUNNING,
    CheckResult,
    approval_expired,
    approval_of,
    call_digest,
    decision_of,
    gate_action,
    needs_approval,
    request_of,
    review_of,
    utc,
)
from .._events import EventKind
from .._json import canonical_dumps, checked_size_bound
from .._limits import MAX_PAYLOAD_BYTES
from .._tools import Call, Failure, Orphan, Outcome, closed, declared_undo, with_key
from ._lifecycle import Lifecycle, Phase

if TYPE_CHECKING:
    from .._approvals import ApprovalRequest, Requests, Review
    from .._json import JSONValue
    from .._tools import Running, UndoRecord
    from ..stores import RequestRow

__all__ = [
    "AwaitReturn",
    "Check",
    "Desk",
    "Refused",
    "Run",
    "Settled",
    "Waiting",
    "Where",
    "attempt",
    "blocking_request",
    "decision_event",
    "finish",
    "unsettled",
]


#: How long, at least, a call past its deadline is awaited before its outcome is found unknown
#: with the call still running (seconds); its own timeout when that is longer.
LATE_RESULT_GRACE: Final = 1.0


class Where(NamedTuple):
    """Whose call this is: a transaction's `step` or a plan run's `node`."""

    scope: Literal["transaction", "plan"]
    scope_id: str
    step: int | None = None
    node: str | None = None
    plan_version: str | None = None
    #: The host holds its run under a lease on a durable store: consuming an approval and
    #: recording a call's start are fenced by it, and a start is recorded before the call.
    durable: bool = False
    #: The model's id of the call (a transaction's step), recorded with a request asked for it.
    call_id: str | None = None


@attrs.frozen(kw_only=True)
class Desk:
    """What the step core needs of its host (a transaction or a plan run) for one attempt."""

    where: Where
    book: Requests
    #: Record an audit event about this step or node (`kind`, `actor`, `data`).
    note: Callable[[EventKind, str | None, Mapping[str, JSONValue]], None]
    #: The idempotency key `call` runs with.
    key_of: Callable[[Call], str]
    #: Keep undo records of an attempt whose tool has returned (compensated by a rewind or a
    #: failed plan like any other).
    keep: Callable[[tuple[UndoRecord, ...]], None]
    #: Keep an attempt still running past its deadline: its undo records wait until it returns;
    #: `held` (its outcome is to be decided) keeps them then, else they are compensated.
    keep_running: Callable[[Orphan, bool], None]
    #: Drop what an attempt whose outcome is unknown wrote to state, before a retry or review.
    drop_writes: Callable[[], None]
    #: The call is about to run (its dispatch event).
    dispatched: Callable[[Call], None]
    #: A person's decision found in `row` (`decision_event`): the host records its event once.
    decided: Callable[[RequestRow], None]
    #: The context the host prepared the call with (it keeps what was registered there).
    prepared_context: object = None
    #: A call abandoned as it ran (an interrupt, a cancelled task): the host keeps what it
    #: registered, as running if its worker still runs it (its undos then wait for it). None:
    #: they are kept at once (`keep`).
    abandoned: Callable[[Call], None] | None = None
    #: Keep, durably, the undo a tool's `compensate=` declares for a call a person or its
    #: status check said happened, unless the host keeps one of that kind for the call's step
    #: already (its call returned in this process). None: the host keeps nothing more.
    keep_declared: Callable[[UndoRecord], None] | None = None


class Run(NamedTuple):
    """Action: run `call`'s tool; the reply is its `Outcome`."""

    call: Call


class AwaitReturn(NamedTuple):
    """Action: wait up to `timeout` seconds for a call past its deadline to return; the reply
    is whether it has."""

    running: Running
    timeout: float


class Check(NamedTuple):
    """Action: ask the tool's status check about `call` (`_approvals.check_outcome`, adding
    to `errors` why it cannot tell); the reply is the `CheckResult`."""

    call: Call
    key: str
    errors: list[str]


Action: TypeAlias = Run | AwaitReturn | Check


class Settled(NamedTuple):
    """The attempt ended with `outcome` for `call`: the host records it, then calls `finish`.

    `guard` is the request row that fenced the call (a consumed approval, a recorded start);
    `finished` says what became of it when that is not the outcome's success or failure.
    `decided` is True when the outcome is not the tool's, now: a status check or a person said
    the call happened, with this output (its undo records were kept already: those its return
    left, else the one its tool declares, with this output, through `Desk.keep_declared`).
    """

    call: Call
    outcome: Outcome
    guard: RequestRow | None = None
    finished: str | None = None
    decided: bool = False


class Waiting(NamedTuple):
    """The attempt waits for a person: an approval request, or a review."""

    approval: ApprovalRequest | None = None
    review: Review | None = None

    @property
    def row_id(self) -> str:
        """The id of the request or review waited for."""
        found = self.approval if self.approval is not None else self.review
        assert found is not None
        return found.id


class Refused(NamedTuple):
    """A person rejected the call: the step or node fails with `failure` (a mistake)."""

    failure: Failure


Result: TypeAlias = Settled | Waiting | Refused
Work: TypeAlias = Generator[Action, Any, Result]


def attempt(call: Call, desk: Desk) -> Work:  # noqa: PLR0911, PLR0915 (one branch per gate action)
    """The guarded attempt of `call` (see the module docstring)."""
    life = Lifecycle()
    where, book, tool = desk.where, desk.book, call.tool
    digest = call_digest(tool.name, call.arguments)
    rule = tool.needs_approval
    needs = needs_approval(rule, tool.name, call.arguments) if rule is not False else False
    guard: RequestRow | None = None
    while True:
        action, row = gate_action(
            book.of_scope(where.scope_id),
            digest,
            where.step,
            needs=needs is not False,
            node=where.node,
            plan_version=where.plan_version,
        )
        if action == "run":
            if tool.on_unknown == "review" and where.durable:  # durable before it runs
                guard = book.started(
                    scope=where.scope,
                    scope_id=where.scope_id,
                    step=where.step,
                    node=where.node,
                    plan_version=where.plan_version,
                    tool=tool.name,
                    arguments=call.arguments,
                    digest=digest,
                    key=desk.key_of(call),
                    fence=True,
                )
            break
        assert row is not None or action == "request"
        if action == "review" and row is not None:
            life.advance(Phase.GATED)
            life.advance(Phase.WAITING)
            return Waiting(review=review_of(row))
        if action == "resolved" and row is not None:
            desk.decided(row)
            if not book.apply_review(row, fence=where.durable):
                continue  # taken meanwhile: look again
            life.advance(Phase.GATED)
            return (yield from _reviewed(call, row, desk, life))
        if action == "unknown" and row is not None:
            desk.decided(row)
            decision = decision_of(row)
            approval = approval_of(row.id, decision)
            if approval.edited:
                call = call._replace(arguments=approval.arguments)
            key = str(decision.get("idempotency_key") or desk.key_of(call))
            life.advance(Phase.GATED)
            life.advance(Phase.UNKNOWN)
            return (yield from _unknown(call, desk, life, row, key, [ENDED_WHILE_RUNNING]))
        if action == "pending" and row is not None:
            life.advance(Phase.GATED)
            life.advance(Phase.WAITING)
            return Waiting(approval=request_of(row))
        if action == "rejected" and row is not None:
            desk.decided(row)
            decision = decision_of(row)
            by = "" if where.node is None else f" by node `{where.node}`"
            life.advance(Phase.SETTLED)
            return Refused(
                Failure(
                    f"the call of tool '{tool.name}'{by} was rejected by "
                    f"{decision.get('actor')}: {decision.get('reason')}; do not send it again "
                    "unchanged",
                    mistake=True,
                )
            )
        if action == "approved" and row is not None:
            desk.decided(row)
            if approval_expired(row, time.time()):
                if book.expire(row, fence=where.durable):
                    desk.note(EventKind.APPROVAL_EXPIRED, None, {"request": row.id})
                continue
            key = desk.key_of(call)
            if not book.consume(
                row, step=where.step, key=key, node=where.node, fence=where.durable
            ):
                continue  # consumed or changed meanwhile: look again
            approval = approval_of(row.id, decision_of(row))
            consumed: dict[str, JSONValue] = {"request": row.id, "edited": approval.edited}
            desk.note(EventKind.APPROVAL_CONSUMED, approval.actor, consumed)
            guard = book.get(row.id)
            call = with_key(call, key, approval.arguments if approval.edited else None)
            break
        request = book.request(
            scope=where.scope,
            scope_id=where.scope_id,
            step=where.step,
            node=where.node,
            tool=tool.name,
            arguments=call.arguments,
            digest=digest,
            plan_version=where.plan_version,
            why=needs if isinstance(needs, str) else None,
            schema=dict(tool.validator.schema),
            fence=where.durable,
            call_id=where.call_id,
        )
        desk.note(EventKind.APPROVAL_REQUESTED, None, {"request": request.id, "tool": tool.name})
        life.advance(Phase.GATED)
        life.advance(Phase.WAITING)
        return Waiting(approval=request)
    life.advance(Phase.GATED)
    return (yield from _run(call, desk, life, guard, retried=False))


def _run(
    call: Call,
    desk: Desk,
    life: Lifecycle,
    guard: RequestRow | None,
    *,
    retried: bool,
    digest: str | None = None,
) -> Work:
    """Run the call; one that timed out while its tool still ran has an unknown outcome."""
    life.advance(Phase.RUNNING)
    desk.dispatched(call)
    try:
        outcome: Outcome = yield Run(call)
    except BaseException:
        # Abandoned while it ran (an interrupt, a cancelled task): what it registered on its
        # own context (the gate made one for an approved or retried call) is kept, for the
        # rewind that follows; the host keeps the prepared context's.
        if desk.abandoned is not None:
            desk.abandoned(call)
        elif call.context is not desk.prepared_context:
            desk.keep(closed(call.context)[0])
        raise
    if outcome.running is not None and call.tool.on_unknown == "review":
        assert outcome.error is not None
        life.advance(Phase.ORPHANED)
        errors = [outcome.error.message + " while the tool still ran"]
        key = desk.key_of(call)
        if guard is not None:
            key = str(decision_of(guard).get("idempotency_key") or key)
        orphan = Orphan(call, outcome.undos, outcome.running)
        return (
            yield from _unknown(
                call, desk, life, guard, key, errors, orphan, retried=retried, digest=digest
            )
        )
    life.advance(Phase.SETTLED)
    return Settled(call, outcome, guard)


def _unknown(  # noqa: PLR0917  (the evidence of one unknown outcome)
    call: Call,
    desk: Desk,
    life: Lifecycle,
    guard: RequestRow | None,
    key: str,
    errors: list[str],
    orphan: Orphan | None = None,
    *,
    retried: bool = False,
    digest: str | None = None,
) -> Work:
    """A call whose outcome is unknown: its status check decides once it has returned, else
    a person does."""
    tool, where, book = call.tool, desk.where, desk.book
    desk.note(EventKind.OUTCOME_UNKNOWN, None, {"tool": tool.name, "reason": errors[0]})
    returned = True
    if orphan is not None:
        try:
            returned = yield AwaitReturn(orphan.running, max(call.timeout, LATE_RESULT_GRACE))
        except BaseException:
            # Abandoned while the call still runs: its undos wait for it, then run (the step
            # is rewound by the host); never before the effect could have landed.
            desk.keep_running(orphan, False)
            raise
        if returned:
            desk.keep(orphan.finished_undos())  # undone by a later rewind, like any other
        else:
            desk.keep_running(orphan, True)  # its undos wait for it; the host blocks meanwhile
            errors.append(
                f"the call was still running {max(call.timeout, LATE_RESULT_GRACE):g} s after "
                "its deadline; its status "
                "check is asked only once it has returned"
            )
        life.advance(Phase.UNKNOWN)
    started = time.monotonic()
    if not returned:
        verdict = CheckResult.unknown()
    elif retried:
        verdict = CheckResult.unknown()
        errors.append("it timed out again")
    else:
        verdict = yield Check(call, key, errors)
    checked_in = time.monotonic() - started
    if verdict.status == "done" and _fits(verdict.output):
        output = verdict.output
        if orphan is None:  # cut off by a crash: nothing this process saw return kept its undo
            _keep_declared(call, output, desk)
        life.advance(Phase.SETTLED)
        done = Outcome(output=output, size=checked_size_bound(output))
        return Settled(call, done, guard, "done (status check)", decided=True)
    if verdict.status == "done":
        errors.append(f"the status check said done with an output over {MAX_PAYLOAD_BYTES} bytes")
        verdict = CheckResult.unknown()
    desk.drop_writes()  # what the unknown attempt wrote is dropped
    if verdict.status == "not_done":
        retry = with_key(call, key)
        return (yield from _run(retry, desk, life, guard, retried=True, digest=digest))
    if guard is not None:  # the digest of the call as the agent sent it (before an edit)
        digest = guard.digest
    elif digest is None:
        digest = call_digest(tool.name, call.arguments)
    review = book.open_review(
        scope=where.scope,
        scope_id=where.scope_id,
        step=where.step,
        node=where.node,
        tool=tool.name,
        arguments=call.arguments,
        digest=digest,
        idempotency_key=key,
        errors=errors,
        timings={"timeout_s": call.timeout, "check_s": round(checked_in, 6)},
        plan_version=where.plan_version,
        fence=where.durable,
    )
    if guard is not None:
        book.finish(guard, f"review {review.id}", fence=where.durable)
    desk.note(EventKind.REVIEW_REQUESTED, None, {"review": review.id, "tool": tool.name})
    life.advance(Phase.WAITING)
    return Waiting(review=review)


def _reviewed(call: Call, row: RequestRow, desk: Desk, life: Lifecycle) -> Work:
    """A resolved review applied to the call sent again: its output, or a retry."""
    decision = decision_of(row)
    review = review_of(row)
    call = call._replace(arguments=review.arguments)  # an approver's edit, if any
    if decision.get("outcome") == "done":
        output = decision.get("output")
        _keep_declared(call, output, desk)  # its call may have returned in a process now gone
        life.advance(Phase.SETTLED)
        return Settled(call, Outcome(output=output, size=checked_size_bound(output)), decided=True)
    retry = with_key(call, review.idempotency_key)  # its review: the call as the agent sent it
    return (yield from _run(retry, desk, life, None, retried=True, digest=row.digest))


def _keep_declared(call: Call, output: JSONValue, desk: Desk) -> None:
    """A call said to have happened (`done`) has its declared `compensate=` undo, with the
    output it was said to return: an undo runs once its call has returned, even when the
    process that saw it return (and wrote the undo then) is gone (docs/protocol.md)."""
    kind = call.tool.compensation_name
    if kind is not None and desk.keep_declared is not None:
        desk.keep_declared(declared_undo(call, kind, call.seq_base, output))


def finish(book: Requests, settled: Settled, *, fence: bool = False) -> None:
    """After the host recorded `settled`: end its guard with what became of the call (`fence`:
    only while the host still holds its transaction or run)."""
    guard = settled.guard
    if guard is None:
        return
    outcome = settled.outcome
    what = settled.finished
    if what is None:
        failed = outcome.error is not None or outcome.refused is not None
        what = "failed" if failed else "succeeded"
    book.finish(guard, what, fence=fence)


def decision_event(
    row: RequestRow,
) -> tuple[EventKind, str, float, dict[str, JSONValue]] | None:
    """The audit event of the person's decision that `row` holds, built from the row alone
    (the compare-and-set that recorded the decision): kind, actor, time and data; None if no
    person decided it. So the trail says the same wherever the decision was made."""
    decision = decision_of(row)
    actor = decision.get("actor")
    if not isinstance(actor, str) or not actor:
        return None
    at = float(decision.get("decided_at") or row.updated_at)
    if row.kind == "review":
        return EventKind.REVIEWED, actor, at, {"review": row.id, "outcome": decision.get("outcome")}
    if "reason" in decision:
        return EventKind.REJECTED, actor, at, {"request": row.id, "reason": decision["reason"]}
    data: dict[str, JSONValue] = {
        "request": row.id,
        "note": decision.get("note", ""),
        "edited": bool(decision.get("edited")),
    }
    expires_at = decision.get("expires_at")
    if expires_at is not None:
        data["expires_at"] = utc(float(expires_at)).isoformat()
    return EventKind.APPROVED, actor, at, data


def unsettled(rows: tuple[RequestRow, ...], live: Container[int] = ()) -> list[RequestRow]:
    """The requests of a transaction that still wait on a person or an unknown outcome: a
    pending approval request, a review not yet taken (pending, or resolved and not applied),
    a call started and never finished (its outcome is unknown). While one exists its step is
    blocked for any other call, and the transaction cannot commit. A call started at one of
    the `live` steps was recorded (a crash came before its row was finished): it is settled."""
    found = []
    for row in rows:
        state = row.state
        if (
            state == "pending"
            or (state == "resolved" and row.kind == "review")
            or (state == "consumed" and decision_of(row).get("consumed_step") not in live)
        ):
            found.append(row)
    return found


def _fits(output: JSONValue) -> bool:
    """Whether an output decided without the tool fits the limit of a tool's output."""
    if checked_size_bound(output) <= MAX_PAYLOAD_BYTES:
        return True
    return len(canonical_dumps(output).encode()) <= MAX_PAYLOAD_BYTES


def blocking_request(rows: tuple[RequestRow, ...], step: int, digest: str) -> RequestRow | None:
    """The request that blocks a call of `digest` at transaction step `step` (`unsettled`, at
    that step, for another call), if any."""
    for row in unsettled(rows):
        if row.digest == digest:
            continue
        request = request_of(row)
        at = request.step
        if row.state == "consumed":
            at = decision_of(row).get("consumed_step")
        if at == step and request.node is None:
            return row
    return None
