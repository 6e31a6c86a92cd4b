"""The approval inbox: what waits for a person (`inbox`), and the decisions a person makes
in it (`approve`, `reject`, `edit`, `resolve`).

A decision goes through the one book the command line's `approve`, `reject` and `review`
write through (`requests_for(store)`): one compare-and-set in the store, so the waiting agent
consumes a decision made in the page exactly once, as one made in the terminal. An edit is
checked as the command line and the approval desk check one (`_step.edit_check`): against the
schema stored with the request; a request stored without one is refused an edit, and the page
says so before anyone types. Every decision records its actor.
"""

from __future__ import annotations

import contextlib
import difflib
import json
from typing import TYPE_CHECKING, Final, final

import attrs

from .._approvals import ApprovalRequest, Review, requests_for, scopes_alive
from .._approvals import loads as loads_record
from .._cli import WAIT, patiently, printable, uk_time
from .._errors import AgentTxError, JSONValueError
from .._json import check_json
from .._limits import MAX_PAYLOAD_BYTES
from .._plans import Plan
from .._step import edit_check
from .._txlog import read_image
from ._values import Shown, shown_json, shown_text, size_text

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .._cli import CliStore
    from .._json import JSONValue

__all__ = [
    "Decided",
    "Inbox",
    "approve",
    "edit",
    "inbox",
    "reject",
    "resolve",
]

#: Outcomes a review is resolved with.
OUTCOMES: Final = ("done", "not_done")
#: The largest arguments (JSON, characters) the inbox puts in an edit form: above it the
#: page says to approve or reject them as asked (the inbox stays small).
EDIT_INLINE: Final = 64 * 1024
#: The most earlier steps a request lists (the last ones; the others are counted).
AFTER_SHOWN: Final = 20
#: The most lines of either side the edit's diff compares (past it: a summary).
DIFF_LINES: Final = 2_000
#: The most lines of a diff the flash shows.
DIFF_SHOWN: Final = 400


@final
@attrs.frozen(kw_only=True)
class Waiting:
    """A request waiting for approval: its id, tool, arguments (shown, and as the JSON the
    edit form starts from: "" if over `EDIT_INLINE`, with `size_said` its size), where it
    waits, what it follows, whether its tool's schema is stored (without it an edit cannot be
    checked, and is refused), and whether its arguments hold characters a text area would
    obey or hide (`hidden`: they are written there as JSON escapes, the same value)."""

    id: str
    tool: Shown
    arguments: Shown
    editable: str
    where: Shown
    after: tuple[Shown, ...]
    run_href: str
    asked: str
    schema: bool
    hidden: bool = False
    size_said: str = ""


@final
@attrs.frozen(kw_only=True)
class Open:
    """A review of a call whose outcome is unknown, with its evidence."""

    id: str
    tool: Shown
    arguments: Shown
    where: Shown
    run_href: str
    key: Shown
    attempts: int
    errors: tuple[Shown, ...]
    opened: str


#: The inbox shows the oldest this many approval requests and reviews (each with its forms),
#: and says how many more wait: an agent that floods the inbox cannot make it huge, nor hide
#: that later requests wait.
SHOWN: Final = 100
#: How many pending requests (and reviews) the inbox reads at most to count them.
SCAN: Final = 10_000


@final
@attrs.frozen(kw_only=True)
class Inbox:
    """What waits for a person, oldest first: at most `SHOWN` approval requests and `SHOWN`
    reviews; `more_requests` and `more_reviews` count the others the inbox read (of at most
    `SCAN` each: `scan_full` says it read that many, so there may be more still)."""

    requests: tuple[Waiting, ...]
    reviews: tuple[Open, ...]
    more_requests: int = 0
    more_reviews: int = 0
    scan_full: bool = False


def _where(scope: str, scope_id: str, step: int | None, node: str | None) -> str:
    place = f"step {step}" if step is not None else f"node {node}"
    return f"{place} of {'plan run' if scope == 'plan' else 'transaction'} {scope_id}"


def _href(scope: str, scope_id: str) -> str:
    from urllib.parse import quote  # noqa: PLC0415

    return f"/{'plan' if scope == 'plan' else 'tx'}/{quote(scope_id, safe='')}"


def inbox(store: CliStore) -> Inbox:
    """The pending approval requests and reviews of the open transactions and running plan
    runs (those of a run that ended without withdrawing them are left out, as `agenttx
    approvals` leaves them out)."""
    book = requests_for(store)
    alive = patiently(WAIT, lambda: scopes_alive(store))
    requests = patiently(WAIT, lambda: book.pending_approvals(SCAN, alive=alive))
    reviews = patiently(WAIT, lambda: book.pending_reviews(SCAN, alive=alive))
    return Inbox(
        requests=tuple(_waiting(store, request) for request in requests[:SHOWN]),
        reviews=tuple(_open(review) for review in reviews[:SHOWN]),
        more_requests=max(0, len(requests) - SHOWN),
        more_reviews=max(0, len(reviews) - SHOWN),
        scan_full=SCAN in (len(requests), len(reviews)),
    )


def _waiting(store: CliStore, request: ApprovalRequest) -> Waiting:
    row = patiently(WAIT, lambda: requests_for(store).get(request.id))
    schema = row is not None and isinstance(loads_record(row.record).get("schema"), dict)
    try:
        editable = json.dumps(request.arguments, ensure_ascii=False, indent=2)
    except (TypeError, ValueError):  # pragma: no cover - stored arguments are JSON
        editable = "{}"
    size = len(editable)
    if size > EDIT_INLINE:
        editable = ""
    visible, hidden = escaped_json(editable)
    return Waiting(
        id=request.id,
        tool=shown_text(request.tool, limit=200),
        arguments=shown_json(request.arguments, pretty=True),
        editable=visible,
        hidden=hidden,
        size_said=size_text(size),
        where=shown_text(_where(request.scope, request.scope_id, request.step, request.node)),
        after=_after(store, request),
        run_href=_href(request.scope, request.scope_id),
        asked=uk_time(request.requested_at.timestamp()),
        schema=schema,
    )


def escaped_json(text: str) -> tuple[str, bool]:
    """JSON text `text` with every control, bidi or other format character written as a
    JSON escape (`\\u202e`; they can stand only inside strings, so the value is the same), and
    whether there was one."""

    escaped = "\n".join(printable(line, json_text=True) for line in text.split("\n"))
    return escaped, escaped != text


def _after(store: CliStore, request: ApprovalRequest) -> tuple[Shown, ...]:
    """What led to the call: a plan node's prerequisites (from the plan), or the steps of
    the transaction before it (its live steps now)."""
    try:
        if request.node is not None:
            image = patiently(WAIT, lambda: store.read_plan(request.scope_id))
            plan = Plan.from_json(json.loads(image.record).get("plan"))
            return tuple(
                shown_text(f"node {before}", limit=200)
                for before in sorted(plan.prerequisites(request.node))
            )
        restored = read_image(patiently(WAIT, lambda: store.peek(request.scope_id)))
    except (AgentTxError, ValueError, KeyError, TypeError, AttributeError):
        return ()
    before = [
        step_id for step_id in restored.steps if request.step is None or step_id < request.step
    ]
    shown = [
        shown_text(f"step {step_id} {restored.steps[step_id].tool_name}", limit=200)
        for step_id in sorted(before)[-AFTER_SHOWN:]
    ]
    if len(before) > AFTER_SHOWN:
        shown.insert(0, shown_text(f"{len(before) - AFTER_SHOWN} earlier steps"))
    return tuple(shown)


def _open(review: Review) -> Open:
    return Open(
        id=review.id,
        tool=shown_text(review.tool, limit=200),
        arguments=shown_json(review.arguments, pretty=True),
        where=shown_text(_where(review.scope, review.scope_id, review.step, review.node)),
        run_href=_href(review.scope, review.scope_id),
        key=shown_text(review.idempotency_key, limit=200),
        attempts=review.attempts,
        errors=tuple(shown_text(error) for error in review.errors),
        opened=uk_time(review.opened_at.timestamp()),
    )


# ------------------------------------------------------------------------ decisions


@final
@attrs.frozen(kw_only=True)
class Decided:
    """What a decision did, for the flash: a line, whether it was refused, and (a refused
    edit) the difference between the model's arguments and the edit, line by line."""

    said: str
    refused: bool = False
    diff: tuple[str, ...] = ()


def approve(store: CliStore, request_id: str, *, actor: str) -> Decided:
    """Approve request `request_id` as `actor`, as `agenttx approve` does."""
    try:
        approval = requests_for(store).approve(
            request_id, actor=actor, validate=edit_check(lambda _name: None)
        )
    except AgentTxError as exc:
        return Decided(said=f"not approved: {exc} ({exc.code})", refused=True)
    return Decided(said=f"approved {approval.request_id} by {approval.actor}")


def reject(store: CliStore, request_id: str, *, actor: str, reason: str) -> Decided:
    """Reject request `request_id` as `actor` for `reason`, as `agenttx reject` does."""
    try:
        requests_for(store).reject(request_id, actor=actor, reason=reason)
    except AgentTxError as exc:
        return Decided(said=f"not rejected: {exc} ({exc.code})", refused=True)
    return Decided(said=f"rejected {request_id} by {actor}: {reason}")


def edit(store: CliStore, request_id: str, *, actor: str, text: str) -> Decided:  # noqa: PLR0911
    """Approve request `request_id` as `actor` with the arguments `text` (JSON) instead of the
    model's, checked against the tool's schema stored with the request (`_step.edit_check`, as
    the approval desk checks an edit). Refused, with the difference said, if `text` is over
    1 MiB, not JSON, not an object, or does not fit the schema (or none is stored)."""
    book = requests_for(store)
    row = book.get(request_id)
    asked: JSONValue = None
    if row is not None:
        asked = loads_record(row.record).get("arguments")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_PAYLOAD_BYTES:
        return _refused(
            f"the edited arguments exceed {MAX_PAYLOAD_BYTES} bytes, the limit of a call's",
            asked,
            text[:4096],
        )
    try:
        arguments = check_json(json.loads(text), what="the edited arguments")
    except RecursionError:
        return _refused("the edited arguments are nested too deeply", asked, text)
    except JSONValueError as exc:
        return _refused(f"the edited arguments are not JSON: {exc}", asked, text)
    except ValueError as exc:
        return _refused(f"the edited arguments are not JSON: {exc}", asked, text)
    if not isinstance(arguments, dict):
        return _refused("the edited arguments must be a JSON object", asked, text)
    try:
        approval = book.approve(
            request_id, actor=actor, arguments=arguments, validate=edit_check(lambda _: None)
        )
    except AgentTxError as exc:
        return _refused(f"{exc} ({exc.code})", asked, text)
    return Decided(
        said=f"approved {approval.request_id} by {approval.actor} with edited arguments",
        diff=_diff(asked, json.dumps(arguments, ensure_ascii=False, indent=2)),
    )


def _refused(why: str, asked: JSONValue, text: str) -> Decided:
    return Decided(said=f"edit refused: {why}", refused=True, diff=_diff(asked, text))


def _diff(asked: JSONValue, text: str) -> tuple[str, ...]:
    """The difference between the model's arguments and the edit, line by line (the edit
    indented as JSON if it is JSON), at most `DIFF_SHOWN` lines. Bounded: past `DIFF_LINES`
    lines on either side only the lines before the first difference are skipped and the
    rest summed up (difflib's cost grows with the square of the lines)."""
    with contextlib.suppress(ValueError, RecursionError):
        text = json.dumps(json.loads(text), ensure_ascii=False, indent=2)
    before = json.dumps(asked, ensure_ascii=False, indent=2).splitlines()
    after = text.splitlines()
    if max(len(before), len(after)) > DIFF_LINES:
        lines = list(_summed(before, after))
    else:
        lines = list(
            difflib.unified_diff(before, after, "the model's arguments", "the edit", lineterm="")
        )
    return tuple(shown_text(line, limit=400).text for line in lines[:DIFF_SHOWN])


def _summed(before: list[str], after: list[str]) -> Iterator[str]:
    """A difference too long to compare line by line: where it starts, the first lines of
    each side from there, and how many lines each side has (linear time)."""
    start = next(
        (at for at, (old, new) in enumerate(zip(before, after, strict=False)) if old != new),
        min(len(before), len(after)),
    )
    yield (
        f"@@ too long to compare line by line: the model's arguments have {len(before)} lines, "
        f"the edit {len(after)}; they differ from line {start + 1} @@"
    )
    for line in before[start : start + DIFF_SHOWN // 2 - 1]:
        yield f"-{line}"
    for line in after[start : start + DIFF_SHOWN // 2 - 1]:
        yield f"+{line}"


def resolve(
    store: CliStore, review_id: str, *, actor: str, outcome: str, output: str = "null"
) -> Decided:
    """Resolve review `review_id` as `actor`: `done` (with `output`, JSON) or `not_done`, as
    `agenttx review` does."""
    if outcome not in OUTCOMES:
        return Decided(said="not resolved: the outcome must be done or not_done", refused=True)
    try:
        value = check_json(json.loads(output or "null"), what="the output")
    except (ValueError, RecursionError) as exc:
        return Decided(said=f"not resolved: the output is not JSON: {exc}", refused=True)
    try:
        requests_for(store).resolve_review(review_id, outcome=outcome, output=value, actor=actor)
    except AgentTxError as exc:
        return Decided(said=f"not resolved: {exc} ({exc.code})", refused=True)
    return Decided(said=f"review {review_id} resolved {outcome} by {actor}")
