"""Plan nodes that need a person: approval before the call, review when its outcome is unknown.

`NodeGate` is the plan runner's side of `_approvals`: a node whose tool needs approval (decided
on the node's resolved inputs) waits in `WAITING_APPROVAL` while independent nodes go on; its
approval is bound to the tool, the digest of the arguments and the plan version, and consumed
once (a compare-and-set in the store) before the call starts. A node dispatched again after a
crash whose approved call started but never recorded an outcome is checked by the tool's status
check, or waits in `NEEDS_REVIEW` for a person. A rejection fails the node (never retried),
with the reason in its hint.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Final, NamedTuple

from .._approvals import (
    CheckResult,
    approval_expired,
    approval_of,
    call_digest,
    check_outcome,
    decision_of,
    gate_action,
    needs_approval,
    request_of,
    requests_for,
    review_of,
    run_check,
)
from .._json import checked_size_bound
from .._tools import Call, Failure, Outcome, with_key
from ._scheduler import NodeState

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._approvals import ApprovalRequest, Requests, Review
    from .._json import JSONValue
    from ..stores import RequestRow, Store

__all__ = ["NodeGate", "Waiting"]

#: How often a waiting node looks for a decision, at most (seconds); it starts faster.
POLL_MAX: Final = 0.5

_ENDED_WHILE_RUNNING: Final = (
    "the node's approved call started but its outcome was never recorded: the process "
    "ended while the tool ran"
)


class Waiting(NamedTuple):
    """A node waits for a person: request or review `row_id`."""

    row_id: str
    state: NodeState  # WAITING_APPROVAL or NEEDS_REVIEW


class NodeGate:
    """Approvals and reviews of one plan run's nodes (owned by the run's loop; `states` may be
    read from any thread)."""

    __slots__ = ("_book", "_note", "_run_id", "_store", "_version", "durable", "states")

    def __init__(
        self,
        run_id: str,
        plan_version: str,
        store: Store,
        note: Callable[[str, str, str | None, Mapping[str, JSONValue]], None],
    ) -> None:
        self._run_id = run_id
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

    def gate(self, node: str, call: Call) -> Call | Failure | Outcome | Waiting:  # noqa: PLR0911 (one per action)
        """The call to run (its approval consumed), why the node fails, its output (from a
        status check or a review), or what it waits for."""
        tool, book = call.tool, self.book
        digest = call_digest(tool.name, call.arguments)
        rule = tool.needs_approval
        needs = needs_approval(rule, tool.name, call.arguments) if rule is not False else False
        key = call.context.idempotency_key if call.context is not None else ""
        self.states.pop(node, None)
        while True:
            action, row = gate_action(
                book.of_scope(self._run_id),
                digest,
                None,
                needs=needs is not False,
                node=node,
                plan_version=self._version,
            )
            if action == "run":
                return call
            assert row is not None or action == "request"
            if action == "review" and row is not None:
                return self._wait(node, row.id, NodeState.NEEDS_REVIEW)
            if action == "resolved" and row is not None:
                if not book.apply_review(row):
                    continue
                decision = decision_of(row)
                if decision.get("outcome") == "done":
                    return _done(decision.get("output"))
                return with_key(call, review_of(row).idempotency_key)
            if action == "unknown" and row is not None:
                return self._unknown(node, call, row)
            if action == "pending" and row is not None:
                return self._wait(node, row.id, NodeState.WAITING_APPROVAL)
            if action == "rejected" and row is not None:
                decision = decision_of(row)
                return Failure(
                    f"the call of tool '{tool.name}' by node `{node}` was rejected by "
                    f"{decision.get('actor')}: {decision.get('reason')}",
                    mistake=True,
                )
            if action == "approved" and row is not None:
                if approval_expired(row, time.time()):
                    if book.expire(row):
                        self._note("APPROVAL_EXPIRED", node, None, {"request": row.id})
                    continue
                if not book.consume(row, step=None, key=key, node=node, fence=self.durable):
                    continue
                approval = approval_of(row.id, decision_of(row))
                data: dict[str, JSONValue] = {"request": row.id, "edited": approval.edited}
                self._note("APPROVAL_CONSUMED", node, approval.actor, data)
                return with_key(call, key, approval.arguments if approval.edited else None)
            request = book.request(
                scope="plan",
                scope_id=self._run_id,
                node=node,
                tool=tool.name,
                arguments=call.arguments,
                digest=digest,
                plan_version=self._version,
                why=needs if isinstance(needs, str) else None,
                fence=self.durable,
            )
            self._note("APPROVAL_REQUESTED", node, None, {"request": request.id})
            return self._wait(node, request.id, NodeState.WAITING_APPROVAL)

    def withdraw(self, why: str) -> None:
        """The run has ended: its requests still pending can no longer be decided (nothing to
        do, and no store read, for a run that never asked)."""
        self.states.clear()
        if self._book is not None:
            with contextlib.suppress(Exception):  # the run's end is what matters
                self._book.withdraw(self._run_id, why, fence=self.durable)

    def _wait(self, node: str, row_id: str, state: NodeState) -> Waiting:
        self.states[node] = state
        return Waiting(row_id, state)

    def _unknown(self, node: str, call: Call, row: RequestRow) -> Outcome | Call | Waiting:
        """An approved call that started and never recorded its outcome: check, or review."""
        decision = decision_of(row)
        key = str(decision.get("idempotency_key") or "")
        approval = approval_of(row.id, decision)
        if approval.edited:
            call = call._replace(arguments=approval.arguments)
        self._note("OUTCOME_UNKNOWN", node, None, {"tool": call.tool.name})
        errors = [_ENDED_WHILE_RUNNING]
        check = call.tool.check
        if check is not None:
            verdict, failure = run_check(check, call.arguments, key, call.timeout)
            if failure is not None:
                errors.append(failure)
        else:
            verdict = CheckResult.unknown()
            errors.append("the tool has no status check")
        if verdict.status == "done":
            self.book.finish(row, "done (status check)")
            return _done(verdict.output)
        if verdict.status == "not_done":
            return with_key(call, key)
        review = self.book.open_review(
            scope="plan",
            scope_id=self._run_id,
            node=node,
            tool=call.tool.name,
            arguments=call.arguments,
            digest=row.digest,
            idempotency_key=key,
            errors=errors,
            timings={"timeout_s": call.timeout},
            plan_version=self._version,
            fence=self.durable,
        )
        self.book.finish(row, f"review {review.id}")
        self._note("REVIEW_REQUESTED", node, None, {"review": review.id})
        return self._wait(node, review.id, NodeState.NEEDS_REVIEW)

    def timed_out(self, node: str, call: Call, outcome: Outcome) -> Outcome | Call | Waiting:
        """The node's call timed out while its tool still ran: its outcome is unknown. The
        tool's status check says done (the output), not done (the call again, same key), or
        cannot tell, and then a person reviews it."""
        key = call.context.idempotency_key if call.context is not None else ""
        assert outcome.error is not None
        errors = [outcome.error.message + " while the tool still ran"]
        self._note("OUTCOME_UNKNOWN", node, None, {"tool": call.tool.name})
        verdict = check_outcome(call.tool.check, call.arguments, key, call.timeout, errors)
        if verdict.status == "done":
            return _done(verdict.output)._replace(undos=outcome.undos)
        if verdict.status == "not_done":
            return with_key(call, key)
        review = self.book.open_review(
            scope="plan",
            scope_id=self._run_id,
            node=node,
            tool=call.tool.name,
            arguments=call.arguments,
            digest=call_digest(call.tool.name, call.arguments),
            idempotency_key=key,
            errors=errors,
            timings={"timeout_s": call.timeout},
            plan_version=self._version,
            fence=self.durable,
        )
        self._note("REVIEW_REQUESTED", node, None, {"review": review.id})
        return self._wait(node, review.id, NodeState.NEEDS_REVIEW)

    async def decided(self, waiting: Waiting) -> None:
        """Return once request or review `waiting.row_id` is no longer pending."""
        import asyncio  # noqa: PLC0415  (`import agenttx` does not load asyncio)

        delay = 0.01
        while True:
            row = self.book.get(waiting.row_id)
            if row is None or row.state != "pending":
                return
            await asyncio.sleep(delay)
            delay = min(2 * delay, POLL_MAX)

    def failed(self, node: str) -> None:
        """The node's approved call returned a failure: its approval is used up (a retry asks
        again)."""
        for row in self.book.of_scope(self._run_id):
            if row.state == "consumed" and decision_of(row).get("consumed_node") == node:
                self.book.finish(row, "failed")


def _done(output: JSONValue) -> Outcome:
    return Outcome(output=output, size=checked_size_bound(output))
