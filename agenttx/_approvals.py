"""Approvals bound to the exact call, status checks for uncertain outcomes, and human review.

A tool declared `@tool(needs_approval=...)` does not run until a person approves the exact call:
the request (`ApprovalRequest`) names the transaction or plan run, the step or node, the tool,
the resolved arguments and their `digest` (SHA-256 of the canonical JSON of tool and
arguments). An `Approval` records who decided, when, until when, with what note, and the
arguments it approves (the approver may edit them; `edited` says so). An approval is consumed
once, by a compare-and-set in the store, before the call it approves runs; so a resume, a retry
or a second process never runs it twice.

A call whose outcome is unknown (its step timed out while its tool still ran, or the process
died after an approved call started and before its result was recorded) is not retried blindly:
the tool's `check(arguments, idempotency_key)` says `CheckResult.done(output)`,
`CheckResult.not_done()` (safe to retry with the same key) or `CheckResult.unknown(reason)`;
unknown, or no check, opens a `Review` that a person resolves (`done` with the output, or
`not_done`).

`Requests` is the book over a store (`stores._approvals.RequestStore`): every state change is
one compare-and-set there. Request states: `pending -> approved | rejected`, `approved ->
consumed | expired`, `consumed -> finished` (the call's outcome was recorded). Review states:
`pending -> resolved -> applied` (the step took the resolution).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, cast, final

import attrs

from ._errors import (
    ApprovalConsumed,
    ApprovalError,
    ApprovalExpired,
    ApprovalNotFound,
    ApprovalRejected,
    InvalidArgument,
    ReviewNotFound,
)
from ._json import JSONValue, canonical_dumps, check_json
from ._tools import DeadlineExceeded, call_with_deadline
from .stores._approvals import MemoryRequests, RequestRow, RequestStore
from .stores._durable import is_durable

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .stores import Store

__all__ = [
    "APPROVAL",
    "CALL",
    "REVIEW",
    "Approval",
    "ApprovalRequest",
    "CheckResult",
    "Requests",
    "Review",
    "approval_expired",
    "approval_of",
    "call_digest",
    "decision_of",
    "gate_action",
    "needs_approval",
    "request_of",
    "requests_for",
    "review_of",
    "run_check",
    "scopes_alive",
]

APPROVAL: Final = "approval"
REVIEW: Final = "review"
CALL: Final = "call"  # a started call that needed no approval (`Requests.started`)

#: The longest actor name, note or reason accepted (characters).
MAX_ACTOR: Final = 256
MAX_NOTE: Final = 4096

Scope = Literal["transaction", "plan"]


def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc)


def call_digest(tool: str, arguments: JSONValue) -> str:
    """The SHA-256 (hex) of the canonical JSON of `{"tool": tool, "arguments": arguments}`."""
    text = canonical_dumps({"tool": tool, "arguments": arguments})
    return hashlib.sha256(text.encode()).hexdigest()


@final
@attrs.frozen(kw_only=True)
class ApprovalRequest:
    """A call waiting for a person's approval: exactly this tool with exactly these arguments.

    `scope` is "transaction" or "plan", `scope_id` the transaction or plan run id; `step` (a
    transaction's step) or `node` (a plan node) says where; `plan_version` is the plan's
    version for a node (None for a step). `requested_at` is timezone-aware (UTC).
    """

    id: str
    scope: Scope
    scope_id: str
    tool: str
    arguments: JSONValue
    digest: str
    requested_at: dt.datetime
    step: int | None = None
    node: str | None = None
    plan_version: str | None = None

    def to_json(self) -> dict[str, JSONValue]:
        """The request as a JSON object (`requested_at` in ISO 8601)."""
        return {
            "id": self.id,
            "scope": self.scope,
            "scope_id": self.scope_id,
            "step": self.step,
            "node": self.node,
            "tool": self.tool,
            "arguments": self.arguments,
            "digest": self.digest,
            "plan_version": self.plan_version,
            "requested_at": self.requested_at.isoformat(),
        }


@final
@attrs.frozen(kw_only=True)
class Approval:
    """A person's approval of request `request_id`.

    `arguments` and `digest` are what it approves: the request's, or the approver's edit
    (`edited` is then True). `expires_at` is None for an approval that does not expire.
    """

    request_id: str
    actor: str
    decided_at: dt.datetime
    arguments: JSONValue
    digest: str
    expires_at: dt.datetime | None = None
    note: str = ""
    edited: bool = False


@final
@attrs.frozen(kw_only=True)
class Review:
    """A call whose outcome is unknown, waiting for a person to say whether it happened.

    The evidence: the `tool`, the `arguments`, the `idempotency_key` of the call (a retry after
    a `not_done` review reuses it), `attempts` (how often it was started), `errors` (what went
    wrong: the timeout, the crash, the check's answer or failure) and `timings` (seconds).
    """

    id: str
    scope: Scope
    scope_id: str
    tool: str
    arguments: JSONValue
    idempotency_key: str
    opened_at: dt.datetime
    step: int | None = None
    node: str | None = None
    attempts: int = 1
    errors: tuple[str, ...] = ()
    timings: Mapping[str, float] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, JSONValue]:
        """The review as a JSON object (`opened_at` in ISO 8601)."""
        return {
            "id": self.id,
            "scope": self.scope,
            "scope_id": self.scope_id,
            "step": self.step,
            "node": self.node,
            "tool": self.tool,
            "arguments": self.arguments,
            "idempotency_key": self.idempotency_key,
            "attempts": self.attempts,
            "errors": list(self.errors),
            "timings": dict(self.timings),
            "opened_at": self.opened_at.isoformat(),
        }


@final
@attrs.frozen(kw_only=True)
class CheckResult:
    """What a tool's status check says about a call: build it with `done(output)`,
    `not_done()` or `unknown(reason)`."""

    status: Literal["done", "not_done", "unknown"]
    output: JSONValue = None
    reason: str = ""

    @classmethod
    def done(cls, output: JSONValue = None) -> CheckResult:
        """The call's effect happened; `output` is recorded as the step's output."""
        return cls(status="done", output=check_json(output, what="check output"))

    @classmethod
    def not_done(cls) -> CheckResult:
        """The call's effect did not happen: it is safe to run it again with the same key."""
        return cls(status="not_done")

    @classmethod
    def unknown(cls, reason: str = "") -> CheckResult:
        """The check cannot tell: a person reviews the call."""
        return cls(status="unknown", reason=str(reason))


def needs_approval(rule: object, tool: str, arguments: JSONValue) -> bool | str:
    """Whether a call needs approval under `rule` (True, False, or a callable of the arguments).

    A callable that raises, or returns something other than a bool, makes the call need
    approval (safe by default); its error is returned as text instead of True, for the record.
    """
    if rule is True or rule is False:
        return rule
    try:
        verdict = rule(arguments)  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001  (a rule that fails asks a person)
        return f"tool `{tool}`: needs_approval raised {type(exc).__name__}: {exc}"
    if isinstance(verdict, bool):
        return verdict
    return f"tool `{tool}`: needs_approval returned {type(verdict).__name__}, not a bool"


def run_check(
    check: Callable[..., object], arguments: JSONValue, key: str, timeout: float
) -> tuple[CheckResult, str | None]:
    """Call `check(arguments, key)` under `timeout`: its verdict, and its failure as text.

    A check that raises, hangs past the timeout or returns something else than a
    `CheckResult` gives `unknown`, with the failure (kept in the review's evidence).
    """
    try:
        verdict = call_with_deadline(lambda: check(arguments, key), timeout)
    except DeadlineExceeded:
        failure = f"the status check did not answer within {timeout:g} s"
        return CheckResult.unknown(failure), failure
    except Exception as exc:  # noqa: BLE001  (a failing check is evidence, not a crash)
        failure = f"the status check raised {type(exc).__name__}: {exc}"
        return CheckResult.unknown(failure), failure
    if not isinstance(verdict, CheckResult):
        failure = f"the status check returned {type(verdict).__name__}, not a CheckResult"
        return CheckResult.unknown(failure), failure
    return verdict, None


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


def _check_expires_in(expires_in: object) -> float | None:
    if expires_in is None:
        return None
    if (
        isinstance(expires_in, bool)
        or not isinstance(expires_in, (int, float))
        or not 0 < expires_in < math.inf
    ):
        raise InvalidArgument(
            f"expires_in must be a positive number of seconds, got {expires_in!r}"
        )
    return float(expires_in)


def _loads(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


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
        running = getattr(store, "running_plans", None)
        if callable(running):
            alive.update(run_id for run_id, _ in running())
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
    ) -> ApprovalRequest:
        """Record a new pending request for this call and return it."""
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
            requested_at=_utc(now),
        )
        record = request.to_json()
        if why is not None:
            record["why"] = why
        self._table.add_request(
            RequestRow(
                id=request.id,
                kind=APPROVAL,
                scope_id=scope_id,
                state="pending",
                digest=digest,
                record=canonical_dumps(record),
                created_at=now,
                updated_at=now,
            )
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
        validate: Callable[[str, JSONValue], JSONValue] | None = None,
    ) -> Approval:
        """Approve a pending request, as `actor`; `arguments` edits the call (recorded).

        `validate(tool, arguments)` checks edited arguments (the tool's spec) and returns them
        as the tool will get them. Raises `InvalidArgument` (an empty actor, bad arguments),
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
            if not isinstance(arguments, Mapping):
                raise InvalidArgument(
                    f"arguments must be a mapping, got {type(arguments).__name__}"
                )
            approved = check_json(dict(arguments), what="arguments")
            if validate is not None:
                approved = validate(request.tool, approved)
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
            row.id, ("pending",), "approved", decision=canonical_dumps(decision), now=now
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
            row.id, ("pending",), "rejected", decision=canonical_dumps(decision), now=now
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
        decision = _loads(row.decision)
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
        scope_id: str,
        step: int,
        tool: str,
        arguments: JSONValue,
        digest: str,
        key: str,
        fence: bool = False,
    ) -> RequestRow:
        """Record, durably before it runs, that a call needing no approval but whose outcome
        matters (`on_unknown="review"`) starts: found again at its step after a crash, it is
        checked, not run blindly. A row of kind `call`, consumed at once; `finish` ends it.
        `fence`: only while the store still holds transaction `scope_id` (see `consume`)."""
        now = time.time()
        record: dict[str, JSONValue] = {
            "scope": "transaction",
            "scope_id": scope_id,
            "step": step,
            "node": None,
            "tool": tool,
            "arguments": arguments,
        }
        decision: dict[str, JSONValue] = {
            "consumed_at": now,
            "consumed_step": step,
            "idempotency_key": key,
        }
        row = RequestRow(
            id=f"call-{uuid.uuid4().hex}",
            kind=CALL,
            scope_id=scope_id,
            state="consumed",
            digest=digest,
            record=canonical_dumps(record),
            decision=canonical_dumps(decision),
            created_at=now,
            updated_at=now,
        )
        self._table.add_request(row, fence=scope_id if fence else None)
        return row

    def expire(self, row: RequestRow) -> bool:
        """Mark an approved request whose approval has expired; True if this call did it."""
        return (
            self._table.set_request_state(
                row.id, ("approved",), "expired", decision=row.decision, now=time.time()
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
        decision = _loads(row.decision)
        now = time.time()
        decision.update({"consumed_at": now, "consumed_step": step, "idempotency_key": key})
        if node is not None:
            decision["consumed_node"] = node
        return (
            self._table.set_request_state(
                row.id,
                ("approved",),
                "consumed",
                decision=canonical_dumps(decision),
                now=now,
                fence=row.scope_id if fence else None,
            )
            is not None
        )

    def finish(self, row: RequestRow, outcome: str) -> None:
        """Record that the approved call's outcome was recorded (`outcome`: what became of it)."""
        decision = _loads(row.decision)
        decision["outcome"] = outcome
        self._table.set_request_state(
            row.id, ("consumed",), "finished", decision=canonical_dumps(decision), now=time.time()
        )

    def withdraw(self, scope_id: str, why: str) -> int:
        """Withdraw the pending requests and reviews of a transaction or plan run that has
        ended (`why`): they can no longer be decided. Returns how many."""
        withdrawn = 0
        for row in self._table.requests_of(scope_id):
            if row.state != "pending":
                continue
            decision = canonical_dumps({"withdrawn": why})
            changed = self._table.set_request_state(
                row.id, ("pending",), "withdrawn", decision=decision, now=time.time()
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
    ) -> Review:
        """Record a pending review of a call whose outcome is unknown, and return it (bound to
        `plan_version` for a plan node)."""
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
            opened_at=_utc(now),
        )
        self._table.add_request(
            RequestRow(
                id=review.id,
                kind=REVIEW,
                scope_id=scope_id,
                state="pending",
                digest=digest,
                record=canonical_dumps({**review.to_json(), "plan_version": plan_version}),
                created_at=now,
                updated_at=now,
            )
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
        JSON) or `ReviewNotFound` (unknown, or not pending any more).
        """
        actor = _check_actor(actor)
        if outcome not in ("done", "not_done"):
            raise InvalidArgument(f'outcome must be "done" or "not_done", got {outcome!r}')
        output = check_json(output, what="review output")
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
            row.id, ("pending",), "resolved", decision=canonical_dumps(decision), now=now
        )
        if changed is None:
            raise ReviewNotFound(request_id=review_id, resolved=True)
        return changed

    def apply_review(self, row: RequestRow) -> bool:
        """Mark a resolved review as taken by its step; False if another call took it."""
        return (
            self._table.set_request_state(
                row.id, ("resolved",), "applied", decision=row.decision, now=time.time()
            )
            is not None
        )


def request_of(row: RequestRow) -> ApprovalRequest:
    """The `ApprovalRequest` a row holds."""
    record = _loads(row.record)
    return ApprovalRequest(
        id=row.id,
        scope=record.get("scope", "transaction"),
        scope_id=row.scope_id,
        step=record.get("step"),
        node=record.get("node"),
        tool=str(record.get("tool", "")),
        arguments=record.get("arguments"),
        digest=row.digest,
        plan_version=record.get("plan_version"),
        requested_at=_utc(row.created_at),
    )


def approval_of(request_id: str, decision: Mapping[str, Any]) -> Approval:
    """The `Approval` a decision holds."""
    expires_at = decision.get("expires_at")
    return Approval(
        request_id=request_id,
        actor=str(decision.get("actor", "")),
        decided_at=_utc(float(decision.get("decided_at", 0.0))),
        expires_at=None if expires_at is None else _utc(float(expires_at)),
        note=str(decision.get("note", "")),
        arguments=decision.get("arguments"),
        digest=str(decision.get("digest", "")),
        edited=bool(decision.get("edited", False)),
    )


def decision_of(row: RequestRow) -> dict[str, Any]:
    """The decision a row holds (an empty dict while it is pending)."""
    return _loads(row.decision)


def review_of(row: RequestRow) -> Review:
    """The `Review` a row holds."""
    record = _loads(row.record)
    return Review(
        id=row.id,
        scope=record.get("scope", "transaction"),
        scope_id=row.scope_id,
        step=record.get("step"),
        node=record.get("node"),
        tool=str(record.get("tool", "")),
        arguments=record.get("arguments"),
        idempotency_key=str(record.get("idempotency_key", "")),
        attempts=int(record.get("attempts", 1)),
        errors=tuple(str(error) for error in record.get("errors", ())),
        timings={str(k): float(v) for k, v in dict(record.get("timings", {})).items()},
        opened_at=_utc(row.created_at),
    )


#: What a guarded call does next (`gate_action`).
Action = Literal[
    "run", "request", "pending", "approved", "rejected", "unknown", "review", "resolved"
]


def gate_action(
    rows: Sequence[RequestRow],
    digest: str,
    step: int | None,
    *,
    needs: bool,
    node: str | None = None,
    plan_version: str | None = None,
) -> tuple[Action, RequestRow | None]:
    """What a guarded call of `digest` at `step` (or plan `node`) does, given its scope's
    requests (oldest first); for a node, requests of another `plan_version` do not count.

    First, an unsettled outcome of this very call at this step: a pending review (`review`),
    a resolved one not yet taken (`resolved`), or an approval consumed here whose call never
    recorded its outcome (`unknown`: the process ended while it ran). Then, if the call needs
    approval, the newest request for it decides: `pending`, `approved` (the caller checks its
    expiry), `rejected`; none, or only used or expired ones, means a new `request`. A call that
    needs no approval may `run`.
    """
    newest: RequestRow | None = None
    for row in reversed(rows):
        decision = None
        if row.digest != digest:
            decision = _loads(row.decision)
            if decision.get("digest") != digest:
                continue
        record = _loads(row.record)
        if record.get("node") != node or (
            node is not None and record.get("plan_version") != plan_version
        ):
            continue
        if row.kind == REVIEW:
            if row.state in ("pending", "resolved") and record.get("step") == step:
                return ("review" if row.state == "pending" else "resolved"), row
            continue
        if row.state == "consumed":
            decision = _loads(row.decision) if decision is None else decision
            if decision.get("consumed_step") == step and decision.get("consumed_node") == node:
                return "unknown", row
        if newest is None and row.kind == APPROVAL:
            newest = row
    if not needs:
        return "run", None
    if newest is None or newest.state not in ("pending", "approved", "rejected"):
        return "request", None
    return cast("Action", newest.state), newest


def approval_expired(row: RequestRow, now: float) -> bool:
    """Whether the approval of an approved `row` has expired at `now`."""
    expires_at = _loads(row.decision).get("expires_at")
    return expires_at is not None and float(expires_at) <= now
