"""The Saga ledger, compensation with retries, and effect dispatch."""

from __future__ import annotations

import asyncio
import json

import pytest

import agenttx
from agenttx._saga import SagaLedger, dispatch_effects
from agenttx._tools import StagedEffect, UndoRecord, resolve_awaitable


def record(step, seq=0, kind="fn", action=None, payload=None):
    return UndoRecord(
        step_id=step,
        seq=seq,
        kind=kind,
        payload=payload,
        description=f"undo {step}.{seq}",
        action=action,
    )


def effect(step, channel="email", payload=None):
    return StagedEffect(
        tx_id="t",
        step_id=step,
        channel=channel,
        payload=payload or {"n": step},
        idempotency_key=f"k{step}",
    )


def test_take_from_returns_newest_first_and_keeps_the_rest():
    """take_from(T) removes the records of steps >= T, newest first."""
    ledger = SagaLedger()
    ledger.record([record(1), record(2, 0), record(2, 1), record(3)])
    taken = ledger.take_from(2)
    assert [(r.step_id, r.seq) for r in taken] == [(3, 0), (2, 1), (2, 0)]
    assert [r.step_id for r in ledger.pending()] == [1]


def test_retries_with_backoff_then_reports_and_keeps_the_failure():
    """A failing undo is tried `attempts` times with doubling sleeps; the others still run."""
    calls, sleeps = [], []

    def flaky():
        calls.append("flaky")
        raise RuntimeError("boom")

    ledger = SagaLedger(attempts=3, backoff=0.01)
    records = [record(2, action=flaky), record(1, action=lambda: calls.append("ok"))]
    report = ledger.compensate(records, {}, sleep=sleeps.append)
    assert calls == ["flaky", "flaky", "flaky", "ok"]
    assert sleeps == [0.01, 0.02]
    assert (report.succeeded, report.failures) == (1, ("undo 2.0: boom",))
    assert [(r.step_id, error) for r, error in ledger.failed] == [(2, "boom")]


def test_a_compensation_that_recovers_on_retry_succeeds():
    """Success on the second attempt counts as success, with one backoff."""
    attempts = []

    def second_time_lucky():
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("busy")

    sleeps: list[float] = []
    report = SagaLedger().compensate([record(1, action=second_time_lucky)], {}, sleep=sleeps.append)
    assert (report.succeeded, report.failures, len(sleeps)) == (1, (), 1)


def test_unknown_kinds_fail_with_a_clear_message():
    """A record whose kind names no compensation fails, naming the kind."""
    ledger = SagaLedger(attempts=1)
    report = ledger.compensate([record(1, kind="mail.unsend")], {})
    assert report.failures == ("undo 1.0: no compensation registered for kind `mail.unsend`",)


def test_registered_compensations_get_the_payload():
    """A durable record calls its compensation with the recorded payload."""
    seen = []
    undo = agenttx.compensation(name="files.restore")(seen.append)
    SagaLedger().compensate([record(1, kind="files.restore", payload={"p": 1})], {undo.name: undo})
    assert seen == [{"p": 1}]


def test_async_compensation_paths():
    """acompensate awaits async undos, retries failures with async sleeps, and reports them."""
    seen = []

    async def good(payload):
        seen.append(payload)

    async def bad(payload):
        raise ValueError("nope")

    compensations = {
        "good": agenttx.compensation(name="good")(good),
        "bad": agenttx.compensation(name="bad")(bad),
    }
    ledger = SagaLedger(attempts=2, backoff=0)
    records = [record(2, kind="bad", payload=2), record(1, kind="good", payload=1)]
    report = asyncio.run(ledger.acompensate(records, compensations))
    assert seen == [1]
    assert (report.succeeded, report.failures) == (1, ("undo 2.0: nope",))


def test_compensation_retries_must_be_a_positive_integer():
    """attempts below 1, or not an integer, is refused."""
    with pytest.raises(agenttx.InvalidArgument, match=">= 1"):
        SagaLedger(attempts=0)
    with pytest.raises(agenttx.InvalidArgument, match="integer"):
        SagaLedger(attempts=True)


def test_resolve_awaitable_runs_coroutines_from_sync_code():
    """Outside a loop a coroutine runs on a fresh loop; inside one, on a helper thread's loop."""

    async def answer():
        return 42

    assert resolve_awaitable(answer()) == 42
    assert resolve_awaitable({"plain": 1}) == {"plain": 1}

    async def inside():
        return resolve_awaitable(answer())

    assert asyncio.run(inside()) == 42


def test_dispatch_in_order_with_mapping_and_errors():
    """Effects go out in staging order; a missing channel and a raising target are reported."""
    out = []

    def broken(effect):
        raise ConnectionError("down")

    delivered, errors = dispatch_effects(
        [effect(1), effect(2, "sms"), effect(3, "webhook")],
        {"email": out.append, "webhook": broken},
    )
    assert delivered == 1
    assert [e.step_id for e in out] == [1]
    assert errors == (
        "sms effect k2 (step 2): no dispatcher for channel `sms`",
        "webhook effect k3 (step 3): down",
    )
    assert dispatch_effects([effect(1)], None) == (0, ())


def test_dispatch_awaits_async_dispatchers():
    """An async dispatcher is awaited."""
    out = []

    async def deliver(effect):
        out.append(effect.step_id)

    assert dispatch_effects([effect(1), effect(2)], deliver) == (2, ())
    assert out == [1, 2]


def test_outbox_dispatcher_appends_fsynced_json_lines(tmp_path):
    """OutboxDispatcher writes one JSON line per effect, creating parent directories."""
    path = tmp_path / "out" / "box.jsonl"
    outbox = agenttx.OutboxDispatcher(path)
    assert dispatch_effects([effect(1), effect(2)], outbox) == (2, ())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step_id"] for line in lines] == [1, 2]
    assert set(lines[0]) == {
        "tx_id",
        "committed_at_ms",
        "step_id",
        "channel",
        "payload",
        "idempotency_key",
    }
    assert lines[0]["idempotency_key"] == "k1"
    assert "box.jsonl" in repr(outbox)


def test_outbox_dispatcher_reports_open_errors(tmp_path):
    """An outbox path that cannot be opened is reported as `open outbox ...`."""
    (tmp_path / "dir").mkdir()
    delivered, errors = dispatch_effects([effect(1)], agenttx.OutboxDispatcher(tmp_path / "dir"))
    assert delivered == 0
    assert "open outbox" in errors[0]
