"""Audit events: the frozen Event record, JSON export, hooks and the event sink."""

from __future__ import annotations

import datetime as dt
import gc
import json
import logging
import threading

import pytest

import agenttx
from agenttx._events import EventSink, deferred_data, from_compact, hook_callables

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


def test_fast_rows_match_to_json_and_compact_reads_back():
    """The JSON a store gets without building Events is exactly Event.to_json; the compact
    form a history keeps reads back as the same events, plus the ones looked ahead."""
    sink = EventSink("transaction", "tx", start_seq=5)
    sink.emit(agenttx.EventKind.STEP_DISPATCHED, step=1, data={"tool": "t"})
    sink.emit(agenttx.EventKind.APPROVED, step=3, actor="alice")
    events = sink.events()
    assert [e.seq for e in events] == [5, 6]
    rows = sink.take_unpersisted_rows()
    assert [(seq, json.loads(text)) for seq, text in rows] == [
        (5, events[0].to_json()),
        (6, events[1].to_json()),
    ]
    assert sink.take_unpersisted_rows() == []
    document = json.loads(json.dumps(sink.compact([(agenttx.EventKind.COMMITTED, 0.0, None)])))
    back = from_compact("transaction", document)
    assert back[:2] == events
    assert (back[2].seq, back[2].kind, back[2].at.year) == (7, agenttx.EventKind.COMMITTED, 1970)
    assert len(sink) == 2  # nothing recorded by looking ahead
    for broken in ({}, {"scope_id": 1, "first": 0, "events": []}, {**document, "events": [["x"]]}):
        with pytest.raises(agenttx.InvalidArgument, match="compact"):
            from_compact("transaction", broken)


def test_hook_callables_refuses_what_cannot_listen():
    """A string, a non-iterable or an item without on_event that is not callable is refused."""
    assert hook_callables(None) == ()
    for bad in ("hook", 3, [object()]):
        with pytest.raises(agenttx.InvalidArgument, match="hook"):
            hook_callables(bad)  # type: ignore[arg-type]


# -- transactions ---------------------------------------------------------------------


def _shop(log: list[str]) -> list[object]:
    @agenttx.compensation(name="shop.release")
    def release(payload: dict) -> None:
        log.append(f"release {payload['output']['sku']}")

    @agenttx.tool(name="reserve", compensate=release)
    def reserve(sku: str) -> dict:
        return {"sku": sku}

    @agenttx.tool(name="notify")
    def notify(ctx: agenttx.ToolContext, to: str) -> dict:
        return {"key": ctx.stage_effect("email", {"to": to})}

    @agenttx.tool(name="charge")
    def charge(amount: int) -> dict:
        raise agenttx.ToolError("card declined", key="amount", transient=False)

    return [release, reserve, notify, charge]


def _kinds(events: tuple[agenttx.Event, ...]) -> list[tuple[str, int | None]]:
    return [(event.kind.value, event.step) for event in events]


def test_transaction_audit_records_steps_commit_and_delivery_in_order():
    """Dispatch, completion, commit and each delivered effect are events, numbered in order."""
    sent: list[agenttx.StagedEffect] = []
    tx = agenttx.Transaction(tools=_shop([]), dispatcher=sent.append)
    tx.call("reserve", {"sku": "s-1"}, call_id="call_1")
    tx.call("notify", {"to": "ada@example.com"})
    tx.commit()
    events = tx.audit()
    assert _kinds(events) == [
        ("step_dispatched", 1),
        ("step_completed", 1),
        ("step_dispatched", 2),
        ("step_completed", 2),
        ("committed", None),
        ("effect_delivered", 2),
    ]
    assert [event.seq for event in events] == list(range(6))
    assert {(event.scope, event.scope_id) for event in events} == {("transaction", tx.id)}
    assert events[0].data == {"tool": "reserve", "call_id": "call_1"}
    assert events[4].data == {"steps": 2, "effects": 1}
    assert events[5].data == {"channel": "email", "idempotency_key": sent[0].idempotency_key}


def test_a_failed_step_is_recorded_before_its_rewind_and_compensations():
    """A failure's decision comes first, then each compensation, then the abort."""
    log: list[str] = []
    tx = agenttx.Transaction(
        tools=_shop(log),
        policy=agenttx.RollbackPolicy(max_local_depth=0, max_global_resets=0, mistake_retries=0),
    )
    tx.call("reserve", {"sku": "s-1"})
    result = tx.call("charge", {"amount": 5})
    assert result.strategy is agenttx.RollbackStrategy.ABORT
    kinds = [event.kind.value for event in tx.audit()]
    assert kinds[:2] == ["step_dispatched", "step_completed"]
    failed = kinds.index("step_failed")
    assert failed < kinds.index("compensated")
    assert log == ["release s-1"]
    failure = tx.audit()[failed]
    assert failure.step == 2
    assert failure.data["tool"] == "charge"
    assert failure.data["strategy"] == result.strategy.value
    assert "card declined" in str(failure.data["hint"])
    assert failure.data["rollback_to_step"] == 0
    last = tx.audit()[-1]
    assert last.kind is agenttx.EventKind.ABORTED
    assert last.data == {"status": "FAILED", "steps_undone": [1]}


def test_rollback_to_a_step_and_abort_are_recorded():
    """A manual rewind names the steps it undid; an abort names its final status."""
    tx = agenttx.Transaction(tools=_shop([]))
    tx.call("reserve", {"sku": "a"})
    tx.call("reserve", {"sku": "b"})
    tx.rollback(2)
    rewound = tx.audit()[-1]
    assert rewound.kind is agenttx.EventKind.STEP_REWOUND
    assert rewound.data == {"to_step": 2, "steps_undone": [2]}
    assert tx.audit()[-2].kind is agenttx.EventKind.COMPENSATED
    tx.rollback()
    aborted = tx.audit()[-1]
    assert aborted.kind is agenttx.EventKind.ABORTED
    assert aborted.data == {"status": "ROLLED_BACK", "steps_undone": [1]}


def test_a_failing_compensation_is_recorded_with_its_error():
    """A compensation that fails every attempt is a compensation_failed event with the error."""

    @agenttx.compensation(name="broken.undo")
    def undo(payload: dict) -> None:
        raise RuntimeError("undo refused")

    @agenttx.tool(name="make", compensate=undo)
    def make() -> dict:
        return {}

    tx = agenttx.Transaction(tools=[undo, make], compensation_retries=1)
    tx.call("make", {})
    tx.rollback()
    failed = [e for e in tx.audit() if e.kind is agenttx.EventKind.COMPENSATION_FAILED]
    assert len(failed) == 1
    assert failed[0].step == 1
    assert "undo refused" in str(failed[0].data["error"])


def test_transaction_hooks_see_every_event_and_a_raising_hook_breaks_nothing():
    """Hooks get what tx.audit() holds, as it happens; a broken hook is only reported."""
    seen: list[agenttx.Event] = []

    def broken(event: agenttx.Event) -> None:
        raise ValueError("oops")

    tx = agenttx.Transaction(tools=_shop([]), hooks=[seen.append, broken])
    with pytest.warns(RuntimeWarning, match="oops"):
        result = tx.call("reserve", {"sku": "s"})
    with pytest.warns(RuntimeWarning, match="oops"):
        tx.commit()
    assert result.status is agenttx.StepStatus.SUCCESS
    assert tx.status is agenttx.TxStatus.COMMITTED
    assert tuple(seen) == tx.audit()


def test_transaction_refuses_bad_hooks_before_beginning():
    """A hook that cannot listen is refused at construction, before the store is touched."""
    store = agenttx.stores.MemoryStore()
    with pytest.raises(agenttx.InvalidArgument, match="hook"):
        agenttx.Transaction(tools=_shop([]), store=store, hooks=[42])


def test_engine_hooks_reach_its_transactions_and_plans():
    """Engine(hooks=...) is given to each transaction it begins and each plan it runs."""
    seen: list[agenttx.Event] = []

    @agenttx.tool
    def one() -> dict:
        return {"n": 1}

    engine = agenttx.Engine(tools=[one], hooks=[seen.append])
    tx = engine.begin()
    tx.call("one", {})
    plan = agenttx.Plan(nodes=[agenttx.Node("a", tool="one")])
    engine.run_plan(plan, initial={})
    assert {event.scope for event in seen} == {"transaction", "plan"}
    assert seen[0].kind is agenttx.EventKind.STEP_DISPATCHED


def test_engine_takes_hooks_once_from_any_iterable_and_refuses_bad_ones():
    """A generator of hooks works (read once); a hook that cannot listen fails at once."""
    seen: list[agenttx.Event] = []
    engine = agenttx.Engine(tools=_shop([]), hooks=(hook for hook in [seen.append]))
    engine.begin().call("reserve", {"sku": "s"})
    assert [event.kind for event in seen] == [
        agenttx.EventKind.STEP_DISPATCHED,
        agenttx.EventKind.STEP_COMPLETED,
    ]
    with pytest.raises(agenttx.InvalidArgument, match="hook"):
        agenttx.Engine(tools=_shop([]), hooks=["not a hook"])


def test_plan_hooks_receive_the_run_audit():
    """run_plan(hooks=...) delivers exactly result.audit, in order."""
    seen: list[agenttx.Event] = []

    @agenttx.tool
    def one() -> dict:
        return {"n": 1}

    plan = agenttx.Plan(nodes=[agenttx.Node("a", tool="one"), agenttx.Node("b", tool="one")])
    result = agenttx.run_plan(plan, tools=[one], initial={}, hooks=[seen.append])
    assert tuple(seen) == result.audit
    assert result.audit[-1].kind is agenttx.EventKind.FINISHED


def _nested(number: int, names: tuple[str, ...]) -> dict[str, object]:
    return {"number": number, "checks": {"names": list(names)}}


_NESTED = deferred_data("test.nested", _nested)


def test_deferred_data_reads_the_same_everywhere():
    """Data recorded as `(build, *args)` is built into the same mapping for the events, the
    lazily built record, the durable rows, the compact form and the hooks."""
    seen: list[agenttx.Event] = []
    sink = EventSink("plan", "run-1", [seen.append])
    sink.record(agenttx.EventKind.DISPATCHED, node="a", data=(_NESTED, 1, ("x", "y")))
    sink.deliver()
    expected = {"number": 1, "checks": {"names": ["x", "y"]}}
    (event,) = sink.events()
    assert event.data == expected
    assert seen[0].data == expected
    recorded = sink.recorded()
    assert len(recorded) == 1
    assert recorded() is recorded()
    assert recorded()[0] == event
    ((seq, text),) = sink.take_unpersisted_rows()
    assert seq == 0
    assert json.loads(text)["data"] == expected
    compact = sink.compact()
    assert compact["events"][0][-1] == expected
    assert from_compact("plan", json.loads(json.dumps(compact)))[0].data == expected


def test_recorded_events_of_scalars_leave_the_garbage_collector():
    """An event without data, or with deferred data of scalars and tuples of them, is kept in a
    form the garbage collector stops tracking once it has looked at it."""
    sink = EventSink("plan", "run-1")
    sink.record(agenttx.EventKind.SKIPPED, node="b")
    sink.record(agenttx.EventKind.DISPATCHED, node="a", data=(_NESTED, 1, ("x", "y")))
    gc.collect()
    gc.collect()  # the outer tuple may be looked at before the tuple it holds
    assert not any(gc.is_tracked(raw) for raw in sink._raw)
    assert [event.kind for event in sink.events()] == [
        agenttx.EventKind.SKIPPED,
        agenttx.EventKind.DISPATCHED,
    ]
