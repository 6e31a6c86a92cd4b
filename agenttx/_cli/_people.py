"""The commands that decide: `approvals` lists what waits for a person, `approve`, `reject`
and `review` write one decision each (and nothing else)."""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Final

from .._approvals import (
    APPROVAL,
    REVIEW,
    ApprovalRequest,
    Review,
    request_of,
    requests_for,
    review_of,
    scopes_alive,
)
from .._errors import AgentTxError, JSONValueError
from .._json import MAX_NESTING_DEPTH, canonical_dumps, check_json
from .._step import edit_check
from ._reading import patiently
from ._shown import uk_time
from ._target import add_target, open_target
from ._terminal import WAIT, Failure, Parser, add_wait, cut, duration, say

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Sequence

    from ._store import CliStore
    from ._target import Target

__all__ = ["add_approval_commands", "waiting_count", "waiting_lines"]

#: Stored ids and tool names are cut to this many characters where they are listed.
_ID: Final = 64


def add_approval_commands(commands: argparse._SubParsersAction[Parser]) -> None:
    approvals = commands.add_parser(
        "approvals",
        help="list the approval requests and reviews waiting for a person",
        description="Each pending approval request (id, transaction or plan run, step or node, "
        "tool, arguments, when asked) and each pending review of a call whose outcome is "
        "unknown (id, where, tool, idempotency key, and the evidence). Read-only.",
    )
    add_target(approvals)
    add_wait(approvals)
    approvals.set_defaults(run=_run_approvals)

    approve = commands.add_parser(
        "approve",
        help="approve a pending request: its call then runs once",
        description="Approve request REQUEST as NAME. The call runs once, when the agent sends "
        "it again (in whichever process holds the transaction). Writes the decision.",
    )
    add_target(approve)
    approve.add_argument("request", metavar="REQUEST", help="an approval request id")
    approve.add_argument("--actor", required=True, metavar="NAME", help="who approves")
    approve.add_argument(
        "--expires-in", type=duration, metavar="SECONDS", help="how long the approval lasts"
    )
    approve.add_argument("--note", default="", help="a note kept with the approval")
    approve.set_defaults(run=_run_approve)

    reject = commands.add_parser(
        "reject",
        help="reject a pending request: the agent is told why",
        description="Reject request REQUEST as NAME for REASON: the step fails with a hint "
        "carrying the reason when the agent sends the call again. Writes the decision.",
    )
    add_target(reject)
    reject.add_argument("request", metavar="REQUEST", help="an approval request id")
    reject.add_argument("--actor", required=True, metavar="NAME", help="who rejects")
    reject.add_argument("--reason", required=True, help="why (told to the agent)")
    reject.set_defaults(run=_run_reject)

    review = commands.add_parser(
        "review",
        help="resolve a pending review: did the call happen?",
        description="Resolve review REVIEW as NAME: done (with the call's output, as JSON) or "
        "not_done (the call runs again with the same idempotency key). Writes the decision.",
    )
    add_target(review)
    review.add_argument("review", metavar="REVIEW", help="a review id")
    review.add_argument("--outcome", required=True, choices=("done", "not_done"))
    review.add_argument("--output", default="null", metavar="JSON", help="the call's output")
    review.add_argument("--actor", required=True, metavar="NAME", help="who decides")
    review.set_defaults(run=_run_review)


def _run_approvals(args: argparse.Namespace) -> None:
    store = open_target(args.db, args.wait, schema=args.schema).store
    try:
        book = requests_for(store)
        alive = patiently(args.wait, lambda: scopes_alive(store))
        requests = patiently(args.wait, lambda: book.pending_approvals(alive=alive))
        reviews = patiently(args.wait, lambda: book.pending_reviews(alive=alive))
    except AgentTxError as exc:
        raise Failure(str(exc)) from None
    finally:
        store.close()
    for line in _approval_lines(requests, reviews):
        say(line)


def _where(scope: str, scope_id: str, step: int | None, node: str | None) -> str:
    """Where a request waits, each stored id cut (a line stays short)."""
    place = f"step {step}" if step is not None else f"node {cut(str(node), _ID)}"
    return f"{place} of {'plan run' if scope == 'plan' else 'transaction'} {cut(scope_id, _ID)}"


def _approval_lines(requests: Sequence[ApprovalRequest], reviews: Sequence[Review]) -> list[str]:
    """The lines of `approvals DB`: pending requests, then pending reviews, oldest first."""
    lines = [f"{len(requests)} approval request(s) pending" + (":" if requests else "")]
    for request in requests:
        where = _where(request.scope, request.scope_id, request.step, request.node)
        lines.append(f"  {cut(request.id, _ID)}  {cut(request.tool, _ID)}  {where}")
        lines.append(f"    arguments {cut(canonical_dumps(request.arguments))}")
        lines.append(f"    asked {uk_time(request.requested_at.timestamp())}")
    lines.append(f"{len(reviews)} review(s) pending" + (":" if reviews else ""))
    for review in reviews:
        where = _where(review.scope, review.scope_id, review.step, review.node)
        lines.append(f"  {cut(review.id, _ID)}  {cut(review.tool, _ID)}  {where}")
        lines.append(f"    arguments {cut(canonical_dumps(review.arguments))}")
        lines.append(f"    idempotency key {cut(review.idempotency_key)}")
        lines.extend(f"    - {cut(error)}" for error in review.errors)
    return lines


@contextlib.contextmanager
def _writable(args: argparse.Namespace) -> Iterator[CliStore]:
    store = open_target(args.db, WAIT, schema=args.schema, write=True).store
    try:
        yield store
    except AgentTxError as exc:
        raise Failure(f"{exc} ({exc.code})") from None
    finally:
        store.close()


def _run_approve(args: argparse.Namespace) -> None:
    with _writable(args) as store:
        approval = requests_for(store).approve(
            args.request,
            actor=args.actor,
            expires_in=args.expires_in,
            note=args.note,
            validate=edit_check(lambda _name: None),  # no edit here; checked if one comes
        )
    until = (
        "" if approval.expires_at is None else f", until {uk_time(approval.expires_at.timestamp())}"
    )
    say(f"approved {approval.request_id} by {approval.actor}{until}")


def _run_reject(args: argparse.Namespace) -> None:
    with _writable(args) as store:
        requests_for(store).reject(args.request, actor=args.actor, reason=args.reason)
    say(f"rejected {args.request} by {args.actor}: {args.reason}")


_too_deep = f"--output is nested deeper than {MAX_NESTING_DEPTH} levels (the most a JSON value may)"


def _run_review(args: argparse.Namespace) -> None:
    try:
        output = check_json(json.loads(args.output), what="--output")
    except RecursionError:  # json.loads gives up far past the depth a JSON value may have
        raise Failure(_too_deep) from None
    except JSONValueError as exc:
        deep = exc.problem.startswith("nested deeper")  # the path would be as long as the value
        raise Failure(_too_deep if deep else f"--output is {exc}") from None
    except ValueError as exc:
        raise Failure(f"--output is not JSON: {exc}") from None
    with _writable(args) as store:
        requests_for(store).resolve_review(
            args.review, outcome=args.outcome, output=output, actor=args.actor
        )
    say(f"review {args.review} resolved {args.outcome} by {args.actor}")


def waiting_lines(store: CliStore, scope_id: str, wait: float, *, target: Target) -> list[str]:
    """The section of `inspect TARGET TX` (and `plans TARGET RUN`) on what waits for a person
    in transaction or plan run `scope_id`: each pending approval request and review, with the
    tool, its arguments (cut), its id, and the commands that decide it on `target`."""
    rows = patiently(wait, lambda: requests_for(store).of_scope(scope_id))
    pending = [row for row in rows if row.state == "pending" and row.kind in (APPROVAL, REVIEW)]
    if not pending:
        return ["waiting for a person: nothing"]
    lines = [f"waiting for a person ({len(pending)}):"]
    for row in pending:
        if row.kind == APPROVAL:
            request = request_of(row)
            where = _where(request.scope, request.scope_id, request.step, request.node)
            lines.append(
                f"  approval {cut(request.id, _ID)}  tool {cut(request.tool, _ID)}  {where}"
            )
            lines.append(f"    arguments {cut(canonical_dumps(request.arguments))}")
            lines.append(f"    asked {uk_time(request.requested_at.timestamp())}")
            approve = target.command("approve", f"{request.id} --actor NAME")
            lines.append(f"    approve: {approve}")
            reject = target.command("reject", f"{request.id} --actor NAME --reason TEXT")
            lines.append(f"    reject:  {reject}")
        else:
            review = review_of(row)
            where = _where(review.scope, review.scope_id, review.step, review.node)
            lines.append(f"  review {cut(review.id, _ID)}  tool {cut(review.tool, _ID)}  {where}")
            lines.append(f"    arguments {cut(canonical_dumps(review.arguments))}")
            lines.extend(f"    - {cut(error)}" for error in review.errors)
            rest = f"{review.id} --outcome done|not_done --actor NAME [--output JSON]"
            lines.append(f"    decide:  {target.command('review', rest)}")
    return lines


def waiting_count(store: CliStore, wait: float) -> tuple[int, int]:
    """How many approval requests and reviews of open transactions and running plan runs
    wait for a person."""
    book = requests_for(store)
    alive = patiently(wait, lambda: scopes_alive(store))
    requests = patiently(wait, lambda: book.pending_approvals(alive=alive))
    reviews = patiently(wait, lambda: book.pending_reviews(alive=alive))
    return len(requests), len(reviews)
