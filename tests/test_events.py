"""Audit events: the frozen Event record, JSON export, hooks and the event sink."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading

import pytest

import agenttx
from agenttx._events import EventSink, hook_callables

AT = dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc)


def _event(**changes: object) -> agenttx.Event:
    fields: dict[str, object] = {
        "kind": agenttx.EventKind.APPROVED,
        "at": AT,
        "scope": "transaction",
        "scope_id": "tx-1",
        "seq": 3,
        "step": 2,
        "actor": "alice",
        "data": {"note": "ok"},
    }
    fields.update(changes)
    return agenttx.Event(**fields)  # type: ignore[arg-type]


def test_event_kinds_are_snake_case_and_unique():
    """Every kind's value is its lower-case name, so exports are stable and readable."""
    values = [kind.value for kind in agenttx.EventKind]
    assert len(values) == len(set(values))
    assert all(kind.value == kind.name.lower() for kind in agenttx.EventKind)


def test_event_is_frozen_and_its_data_read_only():
    """An Event cannot be changed after it is built, nor can its data."""
    event = _event()
    with pytest.raises(AttributeError):
        event.seq = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        event.data["note"] = "changed"  # type: ignore[index]


def test_event_refuses_unknown_scope_and_kind():
    """A scope other than transaction/plan, or a kind that is not an EventKind, is refused."""
    with pytest.raises(agenttx.InvalidArgument, match="scope"):
        _event(scope="session")
    with pytest.raises(TypeError):
        _event(kind="approved")


def test_to_json_round_trips_through_from_json():
    """to_json names scope, seq, kind, time and zone, omits unset joins, and reads back equal."""
    event = _event()
    entry = event.to_json()
    assert entry == {
        "scope": "transaction",
        "scope_id": "tx-1",
        "seq": 3,
        "kind": "approved",
        "at": "2026-01-02T03:04:05.123456+00:00",
        "zone": "UTC",
        "step": 2,
        "actor": "alice",
        "data": {"note": "ok"},
    }
    assert agenttx.Event.from_json(json.loads(json.dumps(entry))) == event


def test_from_json_refuses_what_is_not_an_event():
    """Missing keys, an unknown kind or a bad time give InvalidArgument, not KeyError."""
    good = _event().to_json()
    for broken in ({}, {**good, "kind": "exploded"}, {**good, "at": "yesterday"}):
        with pytest.raises(agenttx.InvalidArgument, match="not an audit event"):
            agenttx.Event.from_json(broken)


def test_audit_jsonl_writes_one_object_per_line_in_order():
    """audit_jsonl keeps the order, ends every line with a newline and keeps non-ASCII text."""
    events = [_event(seq=0, data={"who": "Zoë"}), _event(seq=1, data={})]
    text = agenttx.audit_jsonl(events)
    assert text.endswith("\n")
    lines = text.splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [0, 1]
    assert "Zoë" in lines[0]
    assert agenttx.audit_jsonl([]) == ""


def test_sink_numbers_events_and_materialises_them_on_read():
    """The sink numbers events from 0, keeps them in order, and reports UTC times."""
    sink = EventSink("plan", "run-1")
    sink.emit(agenttx.EventKind.VALIDATED, data={"nodes": 2})
    sink.emit(agenttx.EventKind.DISPATCHED, node="a", attempt="a#1")
    events = sink.events()
    assert [(e.seq, e.kind, e.node, e.attempt) for e in events] == [
        (0, agenttx.EventKind.VALIDATED, None, None),
        (1, agenttx.EventKind.DISPATCHED, "a", "a#1"),
    ]
    assert all(e.scope == "plan" and e.scope_id == "run-1" for e in events)
    assert all(e.at.tzinfo is dt.timezone.utc for e in events)
    assert events[0].data == {"nodes": 2}
    assert len(sink) == 2


def test_sink_copies_the_data_it_is_given():
    """Changing the caller's mapping after emit does not change the recorded event."""
    sink = EventSink("transaction", "tx")
    data = {"n": 1}
    sink.emit(agenttx.EventKind.STEP_COMPLETED, step=1, data=data)
    data["n"] = 2
    assert sink.events()[0].data == {"n": 1}


def test_hooks_receive_every_event_in_order():
    """An EventHook object and a plain callable both get each event once, in seq order."""
    seen: list[tuple[str, int]] = []

    class Hook:
        def on_event(self, event: agenttx.Event) -> None:
            seen.append(("hook", event.seq))

    hook = Hook()
    assert isinstance(hook, agenttx.EventHook)
    sink = EventSink("transaction", "tx", [hook, lambda e: seen.append(("fn", e.seq))])
    for _ in range(3):
        sink.emit(agenttx.EventKind.STEP_DISPATCHED)
    assert seen == [("hook", 0), ("fn", 0), ("hook", 1), ("fn", 1), ("hook", 2), ("fn", 2)]


def test_a_raising_hook_is_reported_and_never_raises(caplog: pytest.LogCaptureFixture):
    """A hook that raises is logged and warned about; later hooks and events still run."""
    seen: list[int] = []

    def broken(event: agenttx.Event) -> None:
        raise RuntimeError("hook bug")

    sink = EventSink("transaction", "tx", [broken, lambda e: seen.append(e.seq)])
    with caplog.at_level(logging.ERROR, logger="agenttx"):
        with pytest.warns(RuntimeWarning, match="hook bug"):
            sink.emit(agenttx.EventKind.STEP_FAILED, step=1)
        with pytest.warns(RuntimeWarning):
            sink.emit(agenttx.EventKind.STEP_FAILED, step=2)
    assert seen == [0, 1]
    assert "RuntimeError" in caplog.text
    assert "step_failed" in caplog.text


def test_a_reentrant_hook_does_not_recurse():
    """A hook that emits gets the new event after the current one, not nested inside it."""
    seen: list[int] = []
    sink = EventSink("transaction", "tx")

    def reenter(event: agenttx.Event) -> None:
        seen.append(event.seq)
        if event.seq == 0:
            sink.emit(agenttx.EventKind.STEP_COMPLETED)
            seen.append(-1)

    sink.add_hooks([reenter])
    sink.emit(agenttx.EventKind.STEP_DISPATCHED)
    assert seen == [0, -1, 1]


def test_record_defers_delivery_until_deliver():
    """record keeps the event without calling hooks; deliver calls them afterwards."""
    seen: list[int] = []
    sink = EventSink("plan", "run", [lambda e: seen.append(e.seq)])
    sink.record(agenttx.EventKind.CANCEL_REQUESTED, data={"reason": "x"})
    assert seen == []
    sink.deliver()
    assert seen == [0]


def test_events_from_many_threads_are_numbered_without_gaps():
    """Concurrent emits give seq 0..n-1 exactly once each, and hooks see them in order."""
    seen: list[int] = []
    sink = EventSink("plan", "run", [lambda e: seen.append(e.seq)])

    def work() -> None:
        for _ in range(200):
            sink.emit(agenttx.EventKind.COMPLETED, node="n")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [e.seq for e in sink.events()] == list(range(800))
    assert seen == list(range(800))


def test_take_unpersisted_hands_out_each_event_once():
    """Events are handed to the durable writer once each, and handed back after a failure."""
    sink = EventSink("transaction", "tx")
    sink.emit(agenttx.EventKind.STEP_DISPATCHED, step=1)
    assert [e.seq for e in sink.take_unpersisted()] == [0]
    sink.emit(agenttx.EventKind.STEP_COMPLETED, step=1)
    sink.emit(agenttx.EventKind.COMMITTED)
    taken = sink.take_unpersisted()
    assert [e.seq for e in taken] == [1, 2]
    sink.return_unpersisted(len(taken))
    assert [e.seq for e in sink.take_unpersisted()] == [1, 2]
    assert sink.take_unpersisted() == ()


def test_hook_callables_refuses_what_cannot_listen():
    """A string, a non-iterable or an item without on_event that is not callable is refused."""
    assert hook_callables(None) == ()
    for bad in ("hook", 3, [object()]):
        with pytest.raises(agenttx.InvalidArgument, match="hook"):
            hook_callables(bad)  # type: ignore[arg-type]
