"""The records of approvals and reviews (`ApprovalRequest`, `Approval`, `Review`,
`CheckResult`), the digest that binds an approval to its call, and the JSON rows a store keeps
them in (read back by `request_of`, `approval_of`, `review_of`)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import TYPE_CHECKING, Any, Final, Literal, final

import attrs

from .._json import JSONValue, canonical_dumps, check_json

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..stores import RequestRow

__all__ = [
    "APPROVAL",
    "CALL",
    "MAX_ACTOR",
    "MAX_NOTE",
    "REVIEW",
    "Approval",
    "ApprovalRequest",
    "CheckResult",
    "Review",
    "Scope",
    "approval_of",
    "call_digest",
    "decision_of",
    "loads",
    "request_of",
    "review_of",
    "utc",
]

APPROVAL: Final = "approval"
REVIEW: Final = "review"
CALL: Final = "call"  # a started call that needed no approval (`Requests.started`)

#: The longest actor name, note or reason accepted (characters).
MAX_ACTOR: Final = 256
MAX_NOTE: Final = 4096

Scope = Literal["transaction", "plan"]


def utc(seconds: float) -> dt.datetime:
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


def loads(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def request_of(row: RequestRow) -> ApprovalRequest:
    """The `ApprovalRequest` a row holds."""
    record = loads(row.record)
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
        requested_at=utc(row.created_at),
    )


def approval_of(request_id: str, decision: Mapping[str, Any]) -> Approval:
    """The `Approval` a decision holds."""
    expires_at = decision.get("expires_at")
    return Approval(
        request_id=request_id,
        actor=str(decision.get("actor", "")),
        decided_at=utc(float(decision.get("decided_at", 0.0))),
        expires_at=None if expires_at is None else utc(float(expires_at)),
        note=str(decision.get("note", "")),
        arguments=decision.get("arguments"),
        digest=str(decision.get("digest", "")),
        edited=bool(decision.get("edited", False)),
    )


def decision_of(row: RequestRow) -> dict[str, Any]:
    """The decision a row holds (an empty dict while it is pending)."""
    return loads(row.decision)


def review_of(row: RequestRow) -> Review:
    """The `Review` a row holds."""
    record = loads(row.record)
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
        opened_at=utc(row.created_at),
    )
