"""What the runs and the audit pages show, read from the store through the command line's
readers, and the steps of a transaction that `_detail` builds its page from (`_inbox` reads
what waits for a person).

Each function takes a `CliStore` and returns frozen value objects the templates render; every
string from an agent or a tool is `Shown` (`_values`). Reads are patient (`patiently`: a
SQLite file locked by a writer is read again) and read-only, so the page is safe beside
running agents. Listings read one page at the store (`list_runs`, `LIMIT`/`OFFSET`): a page
costs the same however many runs the store keeps. `PageMissing` says a page has nothing to
show (no such transaction or run), in one line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from typing import TYPE_CHECKING, Final, final

import attrs

from .._approvals import requests_for, scopes_alive
from .._audit import stored_audit
from .._cli import (
    WAIT,
    EndedFound,
    Failure,
    final_status,
    graph_of,
    patiently,
    read_tx,
    shown_status,
    summary,
    uk_time,
)
from .._errors import AgentTxError, TransactionNotFound
from .._events import Event, EventKind
from .._txlog import read_history
from ._values import Shown, shown_json, shown_text

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._cli import CliStore
    from .._txlog import Restored

__all__ = [
    "MAX_EVENTS",
    "MAX_ROWS",
    "AuditPage",
    "EventRow",
    "PageMissing",
    "RunRow",
    "RunsPage",
    "StepRow",
    "audit_page",
    "edge_lines",
    "ended_status",
    "read_transaction",
    "runs_page",
    "step_rows",
    "waiting_scopes",
]

#: Rows a listing shows a page.
PER_PAGE: Final = 50
#: Rows read from the store at a time while a filter (status, agent) looks for matches.
_SCAN: Final = 200
#: The kinds of run the listing knows (`kind=`).
KINDS: Final = ("tx", "plan")


class PageMissing(Exception):
    """The page has nothing to show: `str(exc)` says why, in one line."""


# ------------------------------------------------------------------------ runs


@final
@attrs.frozen(kw_only=True)
class RunRow:
    """One run of the listing: `kind` "tx" or "plan", its id, status (as the command line
    prints it), agent (a transaction's; "-" for a plan run), when it began or last changed
    (UK time) and the path of its page."""

    kind: str
    id: Shown
    raw_id: str
    status: str
    agent: Shown
    at: str
    href: str


@final
@attrs.frozen(kw_only=True)
class RunsPage:
    """One page of the runs listing, newest first: the open transactions (on the first page),
    then the ended transactions and plan runs; `page` counts from 1; `more` says there is a
    next page; `filters` are the query's (status, agent, kind)."""

    rows: tuple[RunRow, ...]
    page: int
    more: bool
    filters: dict[str, str]
    scanned: int


def waiting_scopes(store: CliStore) -> frozenset[str]:
    """The transactions and plan runs with an approval request waiting for a person."""
    book = requests_for(store)
    alive = patiently(WAIT, lambda: scopes_alive(store))
    requests = patiently(WAIT, lambda: book.pending_approvals(alive=alive))
    return frozenset(request.scope_id for request in requests)


def _href(kind: str, run_id: str) -> str:
    from urllib.parse import quote  # noqa: PLC0415

    return f"/{'plan' if kind == 'plan' else 'tx'}/{quote(run_id, safe='')}"


def _open_rows(store: CliStore, waiting: frozenset[str]) -> list[RunRow]:
    """The open transactions (not a running plan run's own), newest first."""
    running = {run_id for run_id, _ in patiently(WAIT, store.running_plans)}
    rows: list[tuple[float, RunRow]] = []
    for tx_id in patiently(WAIT, store.open_transactions):
        if tx_id in running:
            continue
        try:
            image = patiently(WAIT, functools.partial(store.peek, tx_id))
            record = json.loads(image.record)
        except TransactionNotFound:
            continue  # ended since the listing
        except (AgentTxError, ValueError):
            record = None
        record = record if isinstance(record, dict) else {}
        created = record.get("created_at")
        status = "WAITING_APPROVAL" if tx_id in waiting else "OPEN"
        if not isinstance(record.get("agent_id"), str):
            status = "UNREADABLE" if image.record != "null" else "BEGUN"
        moment = created if isinstance(created, (int, float)) else 0.0
        rows.append((float(moment), _row("tx", tx_id, status, record.get("agent_id"), moment)))
    rows.sort(key=lambda item: (-item[0], item[1].raw_id))
    return [row for _, row in rows]


def _row(kind: str, run_id: str, status: str, agent: object, at: object) -> RunRow:
    return RunRow(
        kind=kind,
        id=shown_text(run_id, limit=200),
        raw_id=run_id,
        status=status,
        agent=shown_text(agent if isinstance(agent, str) and agent else "-", limit=200),
        at=uk_time(at),
        href=_href(kind, run_id),
    )


def _stored_row(
    found: tuple[str, str, float, str | None, str | None, str | None],
    orphaned: set[str],
    waiting: frozenset[str],
) -> RunRow:
    """A row of an ended transaction or a plan run, as `list_runs` gave it (`found`)."""
    kind, run_id, at, status, record_text, history = found
    if kind == "plan":
        status = status or "GONE"
        if status == "RUNNING" and run_id in waiting:
            status = "WAITING_APPROVAL"
        return _row(kind, run_id, shown_status(status, orphaned=run_id in orphaned), None, at)
    try:
        record = json.loads(record_text or "null")
        said = _history_status(history)
        status = said if said is not None else final_status(record, read_history(history))
    except (AgentTxError, ValueError, RecursionError):
        return _row(kind, run_id, "UNREADABLE", None, at)
    agent = record.get("agent_id") if isinstance(record, dict) else None
    return _row(kind, run_id, status, agent, at)


#: A history's status, in the first bytes of its JSON as `_txlog.history_text` writes it
#: (read without parsing its attempts).
_STATUS: Final = re.compile(r'\{"format":1,"status":"([A-Z_]{1,40})"')


def _history_status(history: str | None) -> str | None:
    """The status a stored history says at its top level, read from its start alone (a
    listing must not parse every attempt of a long transaction), or None to read it whole."""
    found = _STATUS.match(history or "")
    return found.group(1) if found else None


def runs_page(store: CliStore, *, page: int = 1, filters: dict[str, str] | None = None) -> RunsPage:
    """Page `page` of the runs (see `RunsPage`); `filters` keep the runs of one `status`
    (as shown), `agent` and `kind` ("tx" or "plan"). Without status and agent, one page is
    one query (and a read per row); with them, the runs are read newest first until the page
    is full."""
    filters = {key: value for key, value in (filters or {}).items() if value}
    kind = filters.get("kind")
    if kind is not None and kind not in KINDS:
        raise PageMissing(f"kind must be one of {', '.join(KINDS)}")
    page = max(1, page)
    waiting = waiting_scopes(store)
    orphaned = set(patiently(WAIT, store.orphaned_plans)) if kind != "tx" else set()
    wanted = _matcher(filters)
    rows: list[RunRow] = []
    if kind != "plan":
        rows.extend(row for row in _open_rows(store, waiting) if wanted(row))
    first = (page - 1) * PER_PAGE
    if wanted is _everything:
        opened = len(rows)
        skip = max(0, first - opened)
        shown_rows = rows[first : first + PER_PAGE]
        room = PER_PAGE - len(shown_rows)
        found = patiently(WAIT, lambda: store.list_runs(room + 1, skip, kind=kind))
        stored = [_stored_row(item, orphaned, waiting) for item in found[:room]]
        return RunsPage(
            rows=(*shown_rows, *stored),
            page=page,
            more=len(found) > room,
            filters=filters,
            scanned=len(found),
        )
    offset = scanned = 0
    while len(rows) <= first + PER_PAGE:
        found = patiently(WAIT, functools.partial(store.list_runs, _SCAN, offset, kind=kind))
        scanned += len(found)
        rows.extend(
            row for row in (_stored_row(item, orphaned, waiting) for item in found) if wanted(row)
        )
        if len(found) < _SCAN:
            break
        offset += _SCAN
    return RunsPage(
        rows=tuple(rows[first : first + PER_PAGE]),
        page=page,
        more=len(rows) > first + PER_PAGE,
        filters=filters,
        scanned=scanned,
    )


def _everything(_row: RunRow) -> bool:
    return True


def _matcher(filters: dict[str, str]) -> Callable[[RunRow], bool]:
    status = filters.get("status", "").upper()
    agent = filters.get("agent")
    if not status and agent is None:
        return _everything

    def wanted(row: RunRow) -> bool:
        return (not status or row.status == status) and (
            agent is None or (row.agent.text == agent and not row.agent.cut)
        )

    return wanted


# ------------------------------------------------------------------------ audit


@final
@attrs.frozen(kw_only=True)
class EventRow:
    """One audit event as the trail shows it: when (UTC and UK time), its kind, where (step or
    node), who (its actor), what (a summary, `Shown`), and its run (id and page)."""

    at: str
    kind: str
    where: str
    actor: Shown
    what: Shown
    run: Shown
    run_href: str


@final
@attrs.frozen(kw_only=True)
class AuditPage:
    """The audit events of one page of runs (or of one run, `run=`), newest first, filtered by
    `kind` and `actor`, at most `MAX_EVENTS` of them (`found`: how many matched); `runs` is
    how many runs they come from, `more` whether older runs have events too."""

    events: tuple[EventRow, ...]
    page: int
    more: bool
    filters: dict[str, str]
    runs: int
    kinds: tuple[str, ...]
    found: int = 0


def _events_of_page(store: CliStore, page: int) -> tuple[list[Event], int, bool]:
    found = patiently(WAIT, lambda: store.list_runs(PER_PAGE + 1, (page - 1) * PER_PAGE))
    events: list[Event] = []
    for kind, run_id, _at, _status, _record, history in found[:PER_PAGE]:
        if kind == "plan":
            with contextlib.suppress(AgentTxError):
                events.extend(patiently(WAIT, functools.partial(stored_audit, store, run_id)))
            continue
        with contextlib.suppress(AgentTxError):
            ended = read_history(history)
            if ended is not None:
                events.extend(ended.audit)
    return events, min(len(found), PER_PAGE), len(found) > PER_PAGE


def audit_page(
    store: CliStore, *, page: int = 1, filters: dict[str, str] | None = None
) -> AuditPage:
    """The audit trail (see `AuditPage`); `filters`: `kind` (an event kind), `actor`, `run`
    (one transaction's or plan run's events, all of them)."""
    filters = {key: value for key, value in (filters or {}).items() if value}
    page = max(1, page)
    kinds = tuple(kind.value for kind in EventKind)
    kind = filters.get("kind")
    if kind is not None and kind not in kinds:
        raise PageMissing(f"no event kind `{kind[:64]}`")
    run = filters.get("run")
    if run is not None:
        try:
            events = list(patiently(WAIT, lambda: stored_audit(store, run)))
        except TransactionNotFound:
            raise PageMissing(
                "no audit trail of that run in the store (open, pruned, or unknown)"
            ) from None
        except (Failure, AgentTxError) as exc:
            raise PageMissing(str(exc)) from None
        runs, more = 1, False
    else:
        events, runs, more = _events_of_page(store, page)
    actor = filters.get("actor")
    chosen = [
        event
        for event in events
        if (kind is None or event.kind.value == kind) and (actor is None or event.actor == actor)
    ]
    chosen.sort(key=lambda event: (event.at, event.seq), reverse=True)
    return AuditPage(
        events=tuple(_event_row(event) for event in chosen[:MAX_EVENTS]),
        found=len(chosen),
        page=page,
        more=more,
        filters=filters,
        runs=runs,
        kinds=kinds,
    )


def _event_row(event: Event) -> EventRow:
    if event.step is not None:
        where = f"step {event.step}"
    elif event.node is not None:
        where = f"node {event.node}"
    else:
        where = "-"
    kind = "plan" if event.scope == "plan" else "tx"
    return EventRow(
        at=uk_time(event.at.timestamp()),
        kind=event.kind.value,
        where=shown_text(where, limit=80).text,
        actor=shown_text(event.actor or "-", limit=200),
        what=shown_text(summary(event)),
        run=shown_text(event.scope_id, limit=200),
        run_href=_href(kind, event.scope_id),
    )


# ------------------------------------------------------------------------ a transaction's steps


@final
@attrs.frozen(kw_only=True)
class StepRow:
    """A step of a transaction: its number, tool, state (`live`, `committed`, or `undone` for
    the steps an ended transaction undid), arguments and output."""

    step: int
    tool: Shown
    state: str
    arguments: Shown
    output: Shown


#: The most rows of a kind (steps, attempts, compensations, staged effects, edges) a
#: transaction's page shows at once; the steps are paged (`?first=STEP`).
MAX_ROWS: Final = 200
#: The most audit events one page of the trail shows (newest first).
MAX_EVENTS: Final = 1_000


def step_rows(
    restored: Restored, state: str, *, first: int = 1, most: int = MAX_ROWS
) -> tuple[StepRow, ...]:
    """The live steps of `restored` (at its end, for an ended one), each in `state`: at most
    `most` of them, from step `first` on."""
    chosen = sorted(step_id for step_id in restored.steps if step_id >= first)[:most]
    return tuple(
        StepRow(
            step=step_id,
            tool=shown_text(step.tool_name, limit=200),
            state=state,
            arguments=shown_json(step.arguments, pretty=True),
            output=shown_json(step.output, pretty=True),
        )
        for step_id, step in ((step_id, restored.steps[step_id]) for step_id in chosen)
    )


def edge_lines(restored: Restored) -> tuple[str, ...]:
    """The edges between the live steps, one line each (`step 1 -> step 2  id -> customer_id
    (explicit)`), the keys shown as text."""
    try:
        edges = graph_of(restored).edges()
    except (AgentTxError, ValueError, KeyError, TypeError):
        return ()
    return tuple(
        shown_text(
            f"step {edge.source} -> step {edge.target}  {edge.source_key} -> "
            f"{edge.target_key}  ({edge.kind.value})",
            limit=400,
        ).text
        for edge in edges[:MAX_ROWS]
    )


def ended_status(found: EndedFound) -> str:
    """An ended transaction's final status, as `inspect` prints it."""
    return final_status(found.restored.record, found.ended)


def read_transaction(store: CliStore, tx_id: str) -> Restored | EndedFound:
    """Transaction `tx_id`, open or ended; `PageMissing` if the store has neither."""
    try:
        return read_tx(store, tx_id, WAIT)
    except Failure as exc:
        raise PageMissing(str(exc)) from None
