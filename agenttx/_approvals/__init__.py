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

The package: `_records` holds the public records and their JSON rows, `_book` the `Requests`
book over a store, `_gate` what a guarded call does next and the status check.
"""

from __future__ import annotations

from ._book import Requests, requests_for, scopes_alive
from ._gate import (
    ENDED_WHILE_RUNNING,
    approval_expired,
    check_outcome,
    cut_off,
    gate_action,
    needs_approval,
    run_check,
)
from ._records import (
    APPROVAL,
    CALL,
    REVIEW,
    Approval,
    ApprovalRequest,
    CheckResult,
    Review,
    approval_of,
    call_digest,
    decision_of,
    loads,
    request_of,
    review_of,
    utc,
)

__all__ = [
    "APPROVAL",
    "CALL",
    "ENDED_WHILE_RUNNING",
    "REVIEW",
    "Approval",
    "ApprovalRequest",
    "CheckResult",
    "Requests",
    "Review",
    "approval_expired",
    "approval_of",
    "call_digest",
    "check_outcome",
    "cut_off",
    "decision_of",
    "gate_action",
    "loads",
    "needs_approval",
    "request_of",
    "requests_for",
    "review_of",
    "run_check",
    "scopes_alive",
    "utc",
]
