"""Reading the audit trail back from a durable store, for `Engine.audit` and `agenttx audit`.

An ended transaction's events are in the history its store keeps (`SQLiteStore`, within its
retention: `keep_history`, `keep_history_for`); a plan run's are in the store's plan audit,
written with its transitions. Both are `Event.to_json` objects, read back with
`Event.from_json`. A store that keeps neither has no stored trail (empty results).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

from ._errors import InvalidArgument, StorageError, TransactionNotFound
from ._events import Event, audit_jsonl
from ._txlog import read_history
from .stores import is_plan_store, keeps_history

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import TextIO

    from .stores import Store

__all__ = ["DEFAULT_LIMIT", "merge_scopes", "stored_audit", "write_jsonl"]

#: How many ended transactions and plan runs an audit of the whole store reads by default.
DEFAULT_LIMIT: Final = 1000


def _transaction_events(store: object, tx_id: str) -> tuple[Event, ...] | None:
    """The events of ended transaction `tx_id` its store keeps, or None if it keeps none."""
    if not keeps_history(store):
        return None
    try:
        row, _image = store.peek_ended(tx_id)
    except (TransactionNotFound, InvalidArgument):
        return None
    ended = read_history(row.history)
    return None if ended is None else ended.audit


def _plan_events(store: object, run_id: str) -> tuple[Event, ...] | None:
    """The events of plan run `run_id` its store keeps, or None if it keeps none."""
    if not is_plan_store(store):
        return None
    try:
        texts = store.plan_audit(run_id)
    except InvalidArgument:
        return None
    if not texts:
        return None
    try:
        return tuple(Event.from_json(json.loads(text)) for text in texts)
    except (ValueError, InvalidArgument) as exc:
        raise StorageError(f"plan run `{run_id}`: unreadable audit event: {exc}") from exc


def stored_audit(
    store: Store, scope_id: str | None = None, *, limit: int = DEFAULT_LIMIT
) -> tuple[Event, ...]:
    """The audit events `store` keeps: of transaction or plan run `scope_id`, or (None) of
    the last `limit` ended transactions and plan runs, oldest event first.

    Raises `TransactionNotFound` if the store keeps no events of `scope_id` (it is open, was
    pruned by the retention, or never was), `StorageError` for a record it cannot read.
    """
    if scope_id is not None:
        if not isinstance(scope_id, str):
            raise InvalidArgument(f"the id must be a string, got {type(scope_id).__name__}")
        found = _transaction_events(store, scope_id)
        if found is None:
            found = _plan_events(store, scope_id)
        if found is None:
            raise TransactionNotFound(tx_id=scope_id)
        return found
    events: list[Event] = []
    if keeps_history(store):
        for row in store.ended_transactions(limit):
            history = read_history(row.history)
            if history is not None:
                events.extend(history.audit)
    if is_plan_store(store):
        for run_id, _status, _updated in store.plan_runs(limit):
            events.extend(_plan_events(store, run_id) or ())
    return merge_scopes(events)


def merge_scopes(events: Iterable[Event]) -> tuple[Event, ...]:
    """`events` of several scopes, each scope's in `seq` order, scopes by their first event's
    time (then id), one scope after the other (a scope's own order is never broken)."""
    scopes: dict[tuple[str, str], list[Event]] = {}
    for event in events:
        scopes.setdefault((event.scope, event.scope_id), []).append(event)
    ordered = sorted(
        (sorted(group, key=lambda e: e.seq) for group in scopes.values()),
        key=lambda group: (group[0].at, group[0].scope_id),
    )
    return tuple(event for group in ordered for event in group)


def write_jsonl(events: Iterable[Event], file: TextIO) -> int:
    """Write `events` to `file` as JSON lines (`audit_jsonl`); return how many."""
    items = tuple(events)
    file.write(audit_jsonl(items))
    return len(items)
