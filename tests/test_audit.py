"""The stored audit trail: ended transactions and plan runs read back, exported, retained."""

from __future__ import annotations

import io
import json

import pytest

import agenttx
from agenttx.stores import SQLiteStore

FAST = agenttx.EngineConfig(idle_timeout=None, compensation_timeout=5.0)


def _tools(log: list[str]) -> list[object]:
    @agenttx.compensation(name="refund")
    def refund(payload: dict) -> None:
        log.append(f"refund {payload['arguments']['order']}")

    @agenttx.tool(name="charge", compensate=refund)
    def charge(order: str) -> dict:
        log.append(f"charge {order}")
        return {"order": order}

    @agenttx.tool(name="add")
    def add(n: int) -> dict:
        return {"n": n + 1}

    return [refund, charge, add]


def _engine(path, log: list[str], **store_options: object) -> agenttx.Engine:
    store = SQLiteStore(path, **store_options)  # type: ignore[arg-type]
    return agenttx.Engine(tools=_tools(log), store=store, config=FAST)


def _close(engine: agenttx.Engine) -> None:
    engine.close()
    engine.store.close()  # type: ignore[attr-defined]


def test_an_ended_transaction_audit_is_read_back_by_another_engine(tmp_path):
    """The history of a committed transaction holds its events, `committed` last."""
    engine = _engine(tmp_path / "db", [])
    tx = engine.begin()
    tx.call("charge", {"order": "o1"})
    tx.commit()
    live = tx.audit()
    _close(engine)

    engine = _engine(tmp_path / "db", [])
    stored = engine.audit(tx.id)
    assert stored == live
    assert stored[-1].kind is agenttx.EventKind.COMMITTED
    assert [event.seq for event in stored] == list(range(len(stored)))
    _close(engine)


def test_an_aborted_transaction_keeps_its_compensations_in_the_trail(tmp_path):
    """A rollback's compensations and its abort are in the stored trail."""
    engine = _engine(tmp_path / "db", [])
    tx = engine.begin()
    tx.call("charge", {"order": "o1"})
    tx.rollback()
    _close(engine)

    engine = _engine(tmp_path / "db", [])
    kinds = [event.kind for event in engine.audit(tx.id)]
    assert kinds[-2:] == [agenttx.EventKind.COMPENSATED, agenttx.EventKind.ABORTED]
    _close(engine)


def test_recovery_records_what_it_did_with_its_actor(tmp_path):
    """A transaction that recovery aborts gets a trail of its compensations and the abort."""
    log: list[str] = []
    engine = _engine(tmp_path / "db", log)
    tx = engine.begin()
    tx.call("charge", {"order": "o1"})
    _close(engine)  # a crash: nothing of the engine's memory survives

    engine = _engine(tmp_path / "db", log)
    report = engine.recover()
    assert report.compensations_run == 1
    events = engine.audit(tx.id)
    assert [event.kind for event in events] == [
        agenttx.EventKind.COMPENSATED,
        agenttx.EventKind.ABORTED,
    ]
    assert {event.actor for event in events} == {"agenttx.recovery"}
    assert events[-1].data["steps_undone"] == [1]
    _close(engine)


def test_a_durable_plan_run_writes_its_events_with_its_transitions(tmp_path):
    """Every event of a durable run is in the store, `finished` included, equal to the result's."""
    engine = _engine(tmp_path / "db", [])
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("a", tool="add", inputs={"n": "${initial.n}"}),
            agenttx.Node("b", tool="add", inputs={"n": "${a.n}"}),
        ],
        initial=["n"],
    )
    result = engine.run_plan(plan, initial={"n": 1})
    assert result.succeeded
    _close(engine)

    engine = _engine(tmp_path / "db", [])
    stored = engine.audit(result.run_id)
    assert stored == result.audit
    assert stored[-1].kind is agenttx.EventKind.FINISHED
    _close(engine)


def test_the_whole_store_audit_keeps_each_scope_in_order(tmp_path):
    """audit() reads every kept transaction and run; each scope's events stay in seq order."""
    engine = _engine(tmp_path / "db", [])
    first = engine.begin()
    first.call("charge", {"order": "o1"})
    first.commit()
    second = engine.begin()
    second.call("charge", {"order": "o2"})
    second.rollback()
    _close(engine)

    engine = _engine(tmp_path / "db", [])
    events = engine.audit()
    scopes = [event.scope_id for event in events]
    assert scopes == sorted(scopes, key=[first.id, second.id].index)
    for scope_id in (first.id, second.id):
        seqs = [event.seq for event in events if event.scope_id == scope_id]
        assert seqs == list(range(len(seqs)))
    _close(engine)


def test_retention_drops_the_audit_with_the_history(tmp_path):
    """An ended transaction pruned by keep_history has no stored trail any more."""
    engine = _engine(tmp_path / "db", [], keep_history=1)
    old = engine.begin()
    old.call("charge", {"order": "o1"})
    old.commit()
    new = engine.begin()
    new.call("charge", {"order": "o2"})
    new.commit()
    _close(engine)

    engine = _engine(tmp_path / "db", [], keep_history=1)  # prunes when it opens
    with pytest.raises(agenttx.TransactionNotFound):
        engine.audit(old.id)
    assert engine.audit(new.id)[-1].kind is agenttx.EventKind.COMMITTED
    _close(engine)


def test_export_audit_writes_json_lines_to_a_path_or_a_file(tmp_path):
    """export_audit writes one JSON object per event and returns the count."""
    engine = _engine(tmp_path / "db", [])
    tx = engine.begin()
    tx.call("charge", {"order": "o1"})
    tx.commit()
    path = tmp_path / "audit.jsonl"
    count = engine.export_audit(path, tx.id)
    lines = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    assert count == len(lines) == len(tx.audit())
    assert lines[-1]["kind"] == "committed"
    buffer = io.StringIO()
    assert engine.export_audit(buffer, tx.id) == count
    assert buffer.getvalue() == path.read_text("utf-8")
    _close(engine)


def test_audit_of_an_unknown_id_is_not_found(tmp_path):
    """An id neither held nor stored raises TransactionNotFound; a non-string is refused."""
    engine = _engine(tmp_path / "db", [])
    with pytest.raises(agenttx.TransactionNotFound):
        engine.audit("no-such-id")
    with pytest.raises(agenttx.InvalidArgument):
        engine.audit(42)  # type: ignore[arg-type]
    _close(engine)


def test_a_memory_engine_audits_what_it_holds():
    """Without a durable store, the engine answers from its own transactions."""
    engine = agenttx.Engine(tools=_tools([]))
    tx = engine.begin()
    tx.call("add", {"n": 1})
    assert engine.audit(tx.id) == tx.audit()
    assert engine.audit() == tx.audit()


def test_retention_drops_the_audit_of_old_ended_plan_runs(tmp_path):
    """keep_history bounds the plan runs' audit events as it does the transactions' history;
    the runs themselves stay listed."""
    engine = _engine(tmp_path / "db", [], keep_history=1)
    plan = agenttx.Plan(nodes=[agenttx.Node("a", tool="add", inputs={"n": 1})])
    old = engine.run_plan(plan, initial={})
    new = engine.run_plan(plan, initial={})
    assert engine.store.plan_audit(old.run_id)  # type: ignore[attr-defined]
    _close(engine)

    engine = _engine(tmp_path / "db", [], keep_history=1)  # prunes when it opens
    store = engine.store
    assert store.plan_audit(old.run_id) == ()  # type: ignore[attr-defined]
    assert engine.audit(new.run_id) == new.audit
    with pytest.raises(agenttx.TransactionNotFound):
        engine.audit(old.run_id)
    assert {run_id for run_id, _, _ in store.plan_runs()} == {old.run_id, new.run_id}  # type: ignore[attr-defined]
    _close(engine)


def test_a_history_reads_its_audit_back_and_refuses_a_broken_one():
    """read_history gives back the events a history holds (compact or as objects); a
    history without an audit has none; a malformed audit is a StorageError."""
    from agenttx._events import EventSink  # noqa: PLC0415
    from agenttx._txlog import history_text, read_history  # noqa: PLC0415

    sink = EventSink("transaction", "tx-1")
    sink.emit(agenttx.EventKind.STEP_DISPATCHED, step=1, data={"tool": "t"})
    sink.emit(agenttx.EventKind.ABORTED, data={"status": "ROLLED_BACK"})
    ended = read_history(history_text("ROLLED_BACK", [], [], [], sink.compact()))
    assert ended is not None
    assert ended.audit == sink.events()
    document = json.loads(history_text("ROLLED_BACK", [], [], []))
    assert read_history(json.dumps(document)).audit == ()  # type: ignore[union-attr]
    document["audit"] = [event.to_json() for event in sink.events()]
    assert read_history(json.dumps(document)).audit == sink.events()  # type: ignore[union-attr]
    for broken in (5, {"scope_id": "tx-1"}, [{"kind": "nope"}]):
        document["audit"] = broken
        with pytest.raises(agenttx.StorageError, match="unreadable history"):
            read_history(json.dumps(document))


def test_the_whole_store_audit_reads_the_kept_plan_runs_too(tmp_path):
    """audit() of a fresh engine gives each stored plan run's events, in seq order, beside
    the ended transactions'."""
    engine = _engine(tmp_path / "db", [])
    tx = engine.begin()
    tx.call("charge", {"order": "o1"})
    tx.commit()
    plan = agenttx.Plan(nodes=[agenttx.Node("a", tool="add", inputs={"n": 1})])
    result = engine.run_plan(plan, initial={})
    _close(engine)

    engine = _engine(tmp_path / "db", [])
    events = engine.audit()
    assert tuple(e for e in events if e.scope_id == result.run_id) == result.audit
    assert tuple(e for e in events if e.scope_id == tx.id) == tx.audit()
    _close(engine)


def test_stored_audit_reads_only_what_a_store_offers():
    """A store without histories or plan runs keeps no trail: an id is not found, the whole
    store's is empty; a plan store that refuses the id is not found either; a non-string id is
    refused."""
    from agenttx._audit import stored_audit  # noqa: PLC0415

    class Bare:
        """A store with neither `peek_ended` nor `plan_audit`."""

    class Refusing:
        def plan_audit(self, run_id: str) -> tuple[str, ...]:
            raise agenttx.InvalidArgument(f"bad id {run_id!r}")

    for store in (Bare(), Refusing()):
        with pytest.raises(agenttx.TransactionNotFound):
            stored_audit(store, "r-1")  # type: ignore[arg-type]
    assert stored_audit(Bare()) == ()  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="must be a string"):
        stored_audit(Bare(), 7)  # type: ignore[arg-type]


def test_a_broken_plan_audit_event_is_a_storage_error(tmp_path):
    """A stored plan event that is not an event's JSON raises StorageError naming the run."""
    import sqlite3  # noqa: PLC0415

    engine = _engine(tmp_path / "db", [])
    plan = agenttx.Plan(nodes=[agenttx.Node("a", tool="add", inputs={"n": 1})])
    result = engine.run_plan(plan, initial={})
    _close(engine)
    with sqlite3.connect(tmp_path / "db") as db:
        db.execute(
            "UPDATE plan_audit SET event = '{\"kind\": 5}' WHERE run_id = ?", (result.run_id,)
        )
    db.close()

    engine = _engine(tmp_path / "db", [])
    with pytest.raises(agenttx.StorageError, match=result.run_id):
        engine.audit(result.run_id)
    _close(engine)


def test_an_ended_transaction_without_a_history_adds_no_events(tmp_path):
    """The whole store's audit skips an ended row whose history is gone."""
    from agenttx._audit import stored_audit  # noqa: PLC0415

    engine = _engine(tmp_path / "db", [])
    tx = engine.begin()
    tx.call("charge", {"order": "o1"})
    tx.commit()
    rows = engine.store.ended_transactions(10)  # type: ignore[attr-defined]
    _close(engine)

    class NoHistory:
        def ended_transactions(self, limit: int) -> tuple[object, ...]:
            return tuple(
                row.__class__(
                    tx_id=row.tx_id, record=row.record, history=None, ended_at=row.ended_at
                )
                for row in rows
            )

    assert rows
    assert stored_audit(NoHistory()) == ()  # type: ignore[arg-type]
