"""`Requests`: the book of approval requests and reviews over a store, where every change of
state is one compare-and-set (`stores._approvals.RequestStore`)."""

from __future__ import annotations

import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any, Final, final

from .._errors import (
    ApprovalConsumed,
    ApprovalError,
    ApprovalExpired,
    ApprovalNotFound,
    ApprovalRejected,
    InvalidArgument,
    ReviewNotFound,
)
from .._json import JSONValue, canonical_dumps, check_json, compact_encoder
from .._limits import MAX_PAYLOAD_BYTES
from ..stores import MemoryRequests, RequestRow, RequestStore, is_durable, is_plan_store
from ._records import (
    APPROVAL,
    CALL,
    MAX_ACTOR,
    MAX_NOTE,
    REVIEW,
    Approval,
    ApprovalRequest,
    Review,
    Scope,
    approval_of,
    call_digest,
    loads,
    request_of,
    review_of,
    utc,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ..stores import Store

__all__ = ["Requests", "requests_for", "scopes_alive"]


def _check_actor(actor: object) -> str:
    if not isinstance(actor, str) or not actor.strip():
        raise InvalidArgument("actor must name who decides: a non-empty string")
    if len(actor) > MAX_ACTOR:
        raise InvalidArgument(f"actor must be at most {MAX_ACTOR} characters")
    return actor


def _check_text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, got {type(value).__name__}")
    if len(value) > MAX_NOTE:
        raise InvalidArgument(f"{what} must be at most {MAX_NOTE} characters")
    return value


#: The longest an approval may wait for its call: ten years (seconds); past it, an expiry is
#: a mistake (and past the range of a timestamp, an overflow).
MAX_EXPIRES_IN: Final = 10 * 366 * 86_400

#: Requests and decisions are kept as compact JSON with keys in their order: the arguments an
#: approval runs (an approver's edit included) reach the tool as they were given. Only the
#: digest (`call_digest`) reads them canonically; rows written before kept sorted keys.
_dumps: Final = compact_encoder(sort_keys=False)


def _check_expires_in(expires_in: object) -> float | None:
    if expires_in is None:
        return None
    if (
        isinstance(expires_in, bool)
        or not isinstance(expires_in, (int, float))
        or not 0 < expires_in <= MAX_EXPIRES_IN
    ):
        raise InvalidArgument(
            f"expires_in must be a positive number of seconds, at most {MAX_EXPIRES_IN} (ten "
            f"years), got {expires_in!r:.40}"
        )
    return float(expires_in)


#: Stores without a requests table of their own keep their requests here, in this process.
_FALLBACK: weakref.WeakKeyDictionary[object, MemoryRequests] = weakref.WeakKeyDictionary()


def requests_for(store: Store) -> Requests:
    """The book of approval requests and reviews kept by `store` (or, for a store without a
    requests table, in this process beside it)."""
    if isinstance(store, RequestStore):
        return Requests(store)
    try:
        table = _FALLBACK.get(store)
        if table is None:
            table = _FALLBACK.setdefault(store, MemoryRequests())
    except TypeError:  # a store that cannot be weakly referenced: a table of its own
        table = MemoryRequests()
    return Requests(table)


def scopes_alive(store: Store) -> Callable[[str], bool]:
    """Whether a transaction or plan run is still open in `store`, for filtering listings: on
    a durable store, any process's (read once, now); else, this store's."""
    if is_durable(store):
        alive = set(store.open_transactions())
        if is_plan_store(store):
            alive.update(run_id for run_id, _ in store.running_plans())
        return alive.__contains__
    return store.is_open


@final
class Requests:
    """The approval requests and reviews of one store: create, decide, consume, list.

    Every state change is one compare-and-set in the store, so it is atomic across threads and
    (on `SQLiteStore`) processes. `scope_id=` on the deciding methods restricts them to one
    transaction or plan run (a request of another one is `ApprovalNotFound`).
    """

    __slots__ = ("_table",)

    def __init__(self, table: RequestStore) -> None:
        self._table = table

    # ------------------------------------------------------------ reading

    def of_scope(self, scope_id: str) -> tuple[RequestRow, ...]:
        """Every request and review of one transaction or plan run, oldest first."""
        return self._table.requests_of(scope_id)

    def get(self, request_id: str, scope_id: str | None = None) -> RequestRow | None:
        """The row of `request_id` (of `scope_id`, if given), or None."""
        if not isinstance(request_id, str) or not request_id:
            raise InvalidArgument(f"a request id must be a non-empty string, got {request_id!r}")
        row = self._table.get_request(request_id)
        if row is None or (scope_id is not None and row.scope_id != scope_id):
            return None
        return row

    def pending_approvals(
        self, limit: int = 1000, alive: Callable[[str], bool] | None = None
    ) -> tuple[ApprovalRequest, ...]:
        """The requests waiting for a decision, oldest first; only those of the transactions
        and plan runs `alive` accepts, if given (one that ended without withdrawing its
        requests, in a process that died, is left out)."""
        rows = self._table.list_requests(APPROVAL, "pending", limit)
        return tuple(request_of(row) for row in rows if alive is None or alive(row.scope_id))

    def pending_reviews(
        self, limit: int = 1000, alive: Callable[[str], bool] | None = None
    ) -> tuple[Review, ...]:
        """The reviews waiting for a person, oldest first (`alive` as for `pending_approvals`)."""
        rows = self._table.list_requests(REVIEW, "pending", limit)
        return tuple(review_of(row) for row in rows if alive is None or alive(row.scope_id))

    # ------------------------------------------------------------ approvals

    def request(
        self,
        *,
        scope: Scope,
        scope_id: str,
        tool: str,
        arguments: JSONValue,
        digest: str,
        step: int | None = None,
        node: str | None = None,
        plan_version: str | None = None,
        why: str | None = None,
        schema: JSONValue = None,
        fence: bool = False,
        call_id: str | None = None,
    ) -> ApprovalRequest:
        """Record a new pending request for this call and return it; `schema` (the tool's
        parameters) is stored with it, so that an edit can be checked where the tool is not,
        and `call_id` (the model's id of the call it was asked for), so that a framework can
        tell which call a request belongs to.
        With `fence` (a durable transaction or plan run), only while the store still holds
        `scope_id` (see `consume`).
        """
        now = time.time()
        request = ApprovalRequest(
            id=f"apr-{uuid.uuid4().hex}",
            scope=scope,
            scope_id=scope_id,
            step=step,
            node=node,
            tool=tool,
            arguments=arguments,
            digest=digest,
            plan_version=plan_version,
            requested_at=utc(now),
        )
        record = request.to_json()
        if why is not None:
            record["why"] = why
        if schema is not None:
            record["schema"] = schema
        if call_id is not None:
            record["call_id"] = call_id
        self._table.add_request(
            RequestRow(
                id=request.id,
                kind=APPROVAL,
                scope_id=scope_id,
                state="pending",
                digest=digest,
                record=_dumps(record),
                created_at=now,
                updated_at=now,
            ),
            fence=scope_id if fence else None,
        )
        return request

    def approve(
        self,
        request_id: str,
        *,
        actor: str,
        expires_in: float | None = None,
        note: str = "",
        arguments: Mapping[str, Any] | None = None,
        scope_id: str | None = None,
        validate: Callable[[str, object, JSONValue], JSONValue] | None = None,
    ) -> Approval:
        """Approve a pending request, as `actor`; `arguments` edits the call (recorded).

        `validate(tool, arguments, schema)` checks edited arguments (`_step.validate_edit`:
        against the live tool, else the `schema` stored with the request) and returns them as
        the tool will get them. Raises `InvalidArgument` (an empty actor, bad arguments),
        `ApprovalNotFound`, `ApprovalRejected`, `ApprovalConsumed`, `ApprovalExpired`, or
        `ApprovalError` for a request approved already.
        """
        actor = _check_actor(actor)
        note = _check_text(note, "note")
        expires = _check_expires_in(expires_in)
        row = self._pending(request_id, scope_id)
        request = request_of(row)
        edited = arguments is not None
        approved: JSONValue = request.arguments
        digest = request.digest
        if arguments is not None:
            if validate is None:
                raise InvalidArgument(
                    f"cannot check the edited arguments of request `{request_id}` here: "
                    "approve it without an edit, or through a transaction, plan run or engine"
                )
            approved = validate(request.tool, arguments, loads(row.record).get("schema"))
            digest = call_digest(request.tool, approved)
        now = time.time()
        decision: dict[str, JSONValue] = {
            "actor": actor,
            "decided_at": now,
            "expires_at": None if expires is None else now + expires,
            "note": note,
            "arguments": approved,
            "digest": digest,
            "edited": edited,
        }
        changed = self._table.set_request_state(
            row.id, ("pending",), "approved", decision=_dumps(decision), now=now
        )
        if changed is None:
            self._refuse(self._table.get_request(row.id) or row)
        return approval_of(request.id, decision)

    def reject(
        self, request_id: str, *, actor: str, reason: str, scope_id: str | None = None
    ) -> RequestRow:
        """Reject a pending request, as `actor`, for `reason` (told to the agent)."""
        actor = _check_actor(actor)
        reason = _check_text(reason, "reason")
        if not reason.strip():
            raise InvalidArgument("reason must say why the call is rejected")
        row = self._pending(request_id, scope_id)
        now = time.time()
        decision: dict[str, JSONValue] = {"actor": actor, "decided_at": now, "reason": reason}
        changed = self._table.set_request_state(
            row.id, ("pending",), "rejected", decision=_dumps(decision), now=now
        )
        if changed is None:
            self._refuse(self._table.get_request(row.id) or row)
        assert changed is not None  # _refuse raised otherwise
        return changed

    def _pending(self, request_id: str, scope_id: str | None) -> RequestRow:
        row = self.get(request_id, scope_id)
        if row is None or row.kind != APPROVAL:
            raise ApprovalNotFound(request_id=request_id)
        if row.state != "pending":
            self._refuse(row)
        return row

    @staticmethod
    def _refuse(row: RequestRow) -> None:
        """Raise the error for deciding a request that is not pending any more."""
        decision = loads(row.decision)
        if row.state == "rejected":
            raise ApprovalRejected(
                request_id=row.id,
                actor=str(decision.get("actor", "")),
                reason=str(decision.get("reason", "")),
            )
        if row.state in ("consumed", "finished"):
            raise ApprovalConsumed(request_id=row.id)
        if row.state == "expired":
            raise ApprovalExpired(request_id=row.id, expired_at=decision.get("expires_at"))
        if row.state == "withdrawn":
            raise ApprovalError(
                f"approval request `{row.id}` was withdrawn: {decision.get('withdrawn')}",
                request_id=row.id,
            )
        if row.state == "approved":
            expires_at = decision.get("expires_at")
            if expires_at is not None and expires_at <= time.time():
                raise ApprovalExpired(request_id=row.id, expired_at=expires_at)
            raise ApprovalError(
                f"approval request `{row.id}` was approved already, by "
                f"{decision.get('actor', 'someone')}",
                request_id=row.id,
            )
        raise ApprovalError(f"approval request `{row.id}` is {row.state}", request_id=row.id)

    def started(
        self,
        *,
        scope: Scope = "transaction",
        scope_id: str,
        step: int | None,
        tool: str,
        arguments: JSONValue,
        digest: str,
        key: str,
        node: str | None = None,
        plan_version: str | None = None,
        fence: bool = False,
    ) -> RequestRow:
        """Record, durably before it runs, that a call needing no approval but whose outcome
        matters (`on_unknown="review"`) starts: found again at its step after a crash, it is
        checked, not run blindly. A row of kind `call`, consumed at once; `finish` ends it.
        `fence`: only while the store still holds transaction `scope_id` (see `consume`)."""
        now = time.time()
        record: dict[str, JSONValue] = {
            "scope": scope,
            "scope_id": scope_id,
            "step": step,
            "node": node,
            "tool": tool,
            "arguments": arguments,
            "plan_version": plan_version,
        }
        decision: dict[str, JSONValue] = {
            "consumed_at": now,
            "consumed_step": step,
            "consumed_node": node,
            "idempotency_key": key,
        }
        row = RequestRow(
            id=f"call-{uuid.uuid4().hex}",
            kind=CALL,
            scope_id=scope_id,
            state="consumed",
            digest=digest,
            record=_dumps(record),
            decision=_dumps(decision),
            created_at=now,
            updated_at=now,
        )
        self._table.add_request(row, fence=scope_id if fence else None)
        return row

    def expire(self, row: RequestRow, *, fence: bool = False) -> bool:
        """Mark an approved request whose approval has expired; True if this call did it.
        `fence`: only while the store still holds the request's scope (see `consume`)."""
        return (
            self._table.set_request_state(
                row.id,
                ("approved",),
                "expired",
                decision=row.decision,
                now=time.time(),
                fence=row.scope_id if fence else None,
            )
            is not None
        )

    def consume(
        self,
        row: RequestRow,
        *,
        step: int | None,
        key: str,
        node: str | None = None,
        fence: bool = False,
    ) -> bool:
        """Consume the approval of `row` for the call about to start (the compare-and-set that
        makes it run once): record the step (or node) and the idempotency key. False if it was
        consumed (or changed) meanwhile. With `fence` (a durable transaction or plan run), the
        store makes the change only while it still holds the row's scope, in the same database
        transaction, and raises `StorageError` otherwise: a worker that lost its run never
        starts the call."""
        decision = loads(row.decision)
        now = time.time()
        decision.update({"consumed_at": now, "consumed_step": step, "idempotency_key": key})
        if node is not None:
            decision["consumed_node"] = node
        return (
            self._table.set_request_state(
                row.id,
                ("approved",),
                "consumed",
                decision=_dumps(decision),
                now=now,
                fence=row.scope_id if fence else None,
            )
            is not None
        )

    def finish(self, row: RequestRow, outcome: str, *, fence: bool = False) -> None:
        """Record that the approved call's outcome was recorded (`outcome`: what became of it).
        `fence`: only while the store still holds the request's scope (see `consume`)."""
        decision = loads(row.decision)
        decision["outcome"] = outcome
        self._table.set_request_state(
            row.id,
            ("consumed",),
            "finished",
            decision=_dumps(decision),
            now=time.time(),
            fence=row.scope_id if fence else None,
        )

    def withdraw(
        self, scope_id: str, why: str, from_step: int | None = None, *, fence: bool = False
    ) -> int:
        """Withdraw the pending requests and reviews of a transaction or plan run that has
        ended (`why`): they can no longer be decided. Returns how many. With `fence`, only
        while the store still holds `scope_id` (an abort: a worker that lost it withdraws
        nothing of its new owner's).

        With `from_step`, only those of transaction steps >= `from_step`, which a rewind
        dropped: then a review resolved and not yet taken is withdrawn too, and a call started
        there and never finished is finished (its undo records were compensated by the rewind).
        """
        withdrawn = 0
        for row in self._table.requests_of(scope_id):
            state = row.state
            if from_step is not None:
                request = request_of(row)
                step = request.step
                if state == "consumed":
                    step = loads(row.decision).get("consumed_step")
                if not isinstance(step, int) or step < from_step or request.node is not None:
                    continue
                if state == "consumed":
                    self.finish(row, why, fence=fence)
                    withdrawn += 1
                    continue
            if state != "pending" and not (from_step is not None and state == "resolved"):
                continue
            decision = _dumps({"withdrawn": why})
            changed = self._table.set_request_state(
                row.id,
                (state,),
                "withdrawn",
                decision=decision,
                now=time.time(),
                fence=scope_id if fence else None,
            )
            withdrawn += changed is not None
        return withdrawn

    # ------------------------------------------------------------ reviews

    def open_review(
        self,
        *,
        scope: Scope,
        scope_id: str,
        tool: str,
        arguments: JSONValue,
        digest: str,
        idempotency_key: str,
        step: int | None = None,
        node: str | None = None,
        attempts: int = 1,
        errors: Sequence[str] = (),
        timings: Mapping[str, float] | None = None,
        plan_version: str | None = None,
        fence: bool = False,
    ) -> Review:
        """Record a pending review of a call whose outcome is unknown, and return it (bound to
        `plan_version` for a plan node); `fence` as for `request`."""
        now = time.time()
        review = Review(
            id=f"rev-{uuid.uuid4().hex}",
            scope=scope,
            scope_id=scope_id,
            step=step,
            node=node,
            tool=tool,
            arguments=arguments,
            idempotency_key=idempotency_key,
            attempts=attempts,
            errors=tuple(errors),
            timings=dict(timings or {}),
            opened_at=utc(now),
        )
        self._table.add_request(
            RequestRow(
                id=review.id,
                kind=REVIEW,
                scope_id=scope_id,
                state="pending",
                digest=digest,
                record=_dumps({**review.to_json(), "plan_version": plan_version}),
                created_at=now,
                updated_at=now,
            ),
            fence=scope_id if fence else None,
        )
        return review

    def resolve_review(
        self,
        review_id: str,
        *,
        outcome: str,
        output: JSONValue = None,
        actor: str,
        scope_id: str | None = None,
    ) -> RequestRow:
        """Resolve a pending review: `outcome` "done" (with the call's `output`) or "not_done".

        Raises `InvalidArgument` (an empty actor, another outcome, an output that is not
        JSON or is over the 1 MiB limit of a tool's output) or `ReviewNotFound` (unknown, or
        not pending any more).
        """
        actor = _check_actor(actor)
        if outcome not in ("done", "not_done"):
            raise InvalidArgument(f'outcome must be "done" or "not_done", got {outcome!r}')
        output = check_json(output, what="review output")
        if len(canonical_dumps(output).encode()) > MAX_PAYLOAD_BYTES:
            raise InvalidArgument(
                f"review output exceeds {MAX_PAYLOAD_BYTES} bytes, the limit of a tool's output"
            )
        if outcome == "not_done":
            output = None
        row = self.get(review_id, scope_id)
        if row is None or row.kind != REVIEW:
            raise ReviewNotFound(request_id=review_id)
        now = time.time()
        decision: dict[str, JSONValue] = {
            "actor": actor,
            "decided_at": now,
            "outcome": outcome,
            "output": output,
        }
        changed = self._table.set_request_state(
            row.id, ("pending",), "resolved", decision=_dumps(decision), now=now
        )
        if changed is None:
            raise ReviewNotFound(request_id=review_id, resolved=True)
        return changed

    def apply_review(self, row: RequestRow, *, fence: bool = False) -> bool:
        """Mark a resolved review as taken by its step; False if another call took it.
        `fence`: only while the store still holds the review's scope (see `consume`): a worker
        that lost it takes nothing of its new owner's."""
        return (
            self._table.set_request_state(
                row.id,
                ("resolved",),
                "applied",
                decision=row.decision,
                now=time.time(),
                fence=row.scope_id if fence else None,
            )
            is not None
        )
