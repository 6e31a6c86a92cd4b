"""The Saga ledger, compensation with retries and deadlines, the backoff, and effect delivery."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import random
import threading
import time
import weakref

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import agenttx
from agenttx._saga import (
    COMPENSATION_BACKOFF,
    OUTBOX_BACKOFF,
    Backoff,
    SagaLedger,
    check_dispatcher,
    deliver_outbox,
    dispatch_effects,
)
from agenttx._saga._attempts import Attempt
from agenttx._tools import StagedEffect, UndoRecord, resolve_awaitable
from agenttx.stores import EffectRow, SQLiteStore

NO_WAIT = Backoff(base=0, max_wait=0)


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

    ledger = SagaLedger(attempts=3, backoff=Backoff(base=0.01, max_wait=1))
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
    ledger = SagaLedger(attempts=2, backoff=NO_WAIT)
    records = [record(2, kind="bad", payload=2), record(1, kind="good", payload=1)]
    report = asyncio.run(ledger.acompensate(records, compensations))
    assert seen == [1]
    assert (report.succeeded, report.failures) == (1, ("undo 2.0: nope",))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"attempts": 0}, "compensation_retries must be >= 1"),
        ({"attempts": True}, "compensation_retries must be an integer"),
        ({"backoff": 0.01}, "backoff must be a Backoff"),
        ({"timeout": 0}, "compensation_timeout must be a number of seconds > 0"),
        ({"timeout": math.inf}, "compensation_timeout"),
        ({"timeout": 1e300}, "compensation_timeout"),
        ({"timeout": True}, "compensation_timeout"),
    ],
)
def test_ledger_options_are_checked(options, message):
    """attempts, backoff and timeout are checked on construction, naming the option."""
    with pytest.raises(agenttx.InvalidArgument, match=message):
        SagaLedger(**options)


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
    """JsonlDispatcher writes one JSON line per effect, creating parent directories."""
    path = tmp_path / "out" / "box.jsonl"
    outbox = agenttx.JsonlDispatcher(path)
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
    """A JSON-lines path that cannot be opened is reported as `append to ...`."""
    (tmp_path / "dir").mkdir()
    delivered, errors = dispatch_effects([effect(1)], agenttx.JsonlDispatcher(tmp_path / "dir"))
    assert delivered == 0
    assert "append to" in errors[0]


# ---------------------------------------------------------------- the backoff


def test_the_two_backoffs_keep_their_schedules():
    """Compensations wait 10 ms doubling to 2.56 s; the outbox 0.5 s doubling to 300 s."""
    assert [COMPENSATION_BACKOFF.delay(n) for n in (1, 2, 3, 9, 10, 10**6)] == [
        0.01,
        0.02,
        0.04,
        2.56,
        2.56,
        2.56,
    ]
    assert [OUTBOX_BACKOFF.delay(n) for n in (1, 2, 10, 11, 10**6)] == [0.5, 1.0, 256.0, 300, 300]


def test_full_jitter_draws_below_the_wait_from_the_given_source():
    """With jitter, the wait is the capped wait times the source's draw, clamped to [0, 1]."""
    draws = iter([0.5, 0.25, -3.0, 7.0, math.nan])
    backoff = Backoff(base=1, max_wait=4, jitter=True, rng=lambda: next(draws))
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 0.5, 0.0, 4.0, 4.0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"base": -1, "max_wait": 1}, "base must be 0 or"),
        ({"base": 1e-9, "max_wait": 1}, "base must be 0 or"),
        ({"base": math.nan, "max_wait": 1}, "base must be 0 or"),
        ({"base": True, "max_wait": 1}, "base must be 0 or"),
        ({"base": 1, "factor": 0.5, "max_wait": 1}, "factor must be a finite number >= 1"),
        ({"base": 1, "factor": math.inf, "max_wait": 1}, "factor must be"),
        ({"base": 1, "max_wait": 1e9}, "max_wait must be a number of seconds from 0"),
        ({"base": 1, "max_wait": -1}, "max_wait must be"),
        ({"base": 2, "max_wait": 1}, "max_wait must be >= base"),
        ({"base": 1, "max_wait": 1, "jitter": 1}, "jitter must be True or False"),
        ({"base": 1, "max_wait": 1, "rng": 0.5}, "rng must be a callable"),
    ],
)
def test_backoff_fields_are_checked(options, message):
    """Each field is checked on construction, and the error names it."""
    with pytest.raises(agenttx.InvalidArgument, match=message):
        Backoff(**options)


@pytest.mark.parametrize("attempt", [0, -1, True, 1.0])
def test_delay_takes_an_attempt_number_from_one(attempt):
    """delay refuses anything but an integer >= 1."""
    with pytest.raises(agenttx.InvalidArgument, match="attempt must be an integer >= 1"):
        NO_WAIT.delay(attempt)


backoffs = st.builds(
    lambda base, factor, spread, jitter, seed: Backoff(
        base=base,
        factor=factor,
        max_wait=min(base * spread, 604_800.0),
        jitter=jitter,
        rng=random.Random(seed).random,
    ),
    base=st.just(0.0) | st.floats(1e-6, 604_800.0),
    factor=st.floats(1.0, 1e6),
    spread=st.floats(1.0, 1e12),
    jitter=st.booleans(),
    seed=st.integers(),
)


@given(backoffs, st.lists(st.integers(1, 10**6), min_size=1, max_size=20))
def test_delays_are_bounded_and_grow_without_jitter(backoff, attempts):
    """Delays are in [0, max_wait] for any attempt up to 10**6; without jitter, non-decreasing."""
    attempts.sort()
    delays = [backoff.delay(n) for n in attempts]
    assert all(0.0 <= delay <= backoff.max_wait for delay in delays)
    if not backoff.jitter:
        assert delays == sorted(delays)
        assert delays == [backoff.delay(n) for n in attempts]  # deterministic


# ---------------------------------------------------------------- deadlines


@pytest.fixture
def never():
    """An event nobody sets during the test; teardown sets it, so blocked workers end."""
    event = threading.Event()
    yield event
    event.set()


def finishes(fn, *args):
    """Run fn on a thread; fail (rather than hang) if it has not returned after 10 s."""
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("value", fn(*args)), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "still blocked after 10 s"
    return outcome["value"]


def wait_until(condition):
    """Poll `condition` for up to 10 s (a hang guard, not a timing check)."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition not met after 10 s"
        time.sleep(0.001)


def test_a_compensation_that_never_returns_is_abandoned_and_kept(never):
    """A stuck compensation times out, is not retried while it runs, and is kept as failed."""
    calls = []

    def stuck():
        calls.append(1)
        never.wait()

    ledger = SagaLedger(attempts=3, timeout=0.2, backoff=NO_WAIT)
    stuck_record, other = record(2, action=stuck), record(1, action=lambda: calls.append(2))
    report = finishes(ledger.compensate, [stuck_record, other], {})
    error = "timed out after 200 ms, still running after timeout: not tried again"
    assert report == agenttx.CompensationReport(
        succeeded=1, failures=(f"undo 2.0: {error}",), ran=((1, "fn"),)
    )
    assert ledger.failed == ((stuck_record, error),)
    assert ledger.running == (stuck_record,)
    assert calls == [1, 2]  # the stuck one ran once; the next record still ran

    report = finishes(ledger.compensate, [stuck_record], {})  # asked again while it runs
    assert report.failures == ("undo 2.0: still running after timeout: not tried again",)
    never.set()
    wait_until(lambda: not ledger.running)
    assert calls == [1, 2]  # nothing ran twice


def test_the_last_attempt_timing_out_is_reported_as_timed_out(never):
    """With one attempt, the failure line is just the timeout."""
    ledger = SagaLedger(attempts=1, timeout=0.02)
    report = finishes(ledger.compensate, [record(1, action=never.wait)], {})
    assert report.failures == ("undo 1.0: timed out after 20 ms",)


def test_a_timed_out_attempt_that_has_ended_is_retried():
    """Once the abandoned attempt has ended, the next attempt runs (one at a time)."""
    release, calls, sleeps = threading.Event(), [], []

    def slow_then_fine():
        calls.append(1)
        if len(calls) == 1:
            release.wait()

    ledger = SagaLedger(attempts=2, timeout=0.2)

    def pause(seconds):  # the backoff: let the first attempt end before the second is due
        sleeps.append(seconds)
        release.set()
        wait_until(lambda: not ledger.running)

    report = finishes(
        lambda: ledger.compensate([record(1, action=slow_then_fine)], {}, sleep=pause)
    )
    assert (report.succeeded, report.failures, calls, sleeps) == (1, (), [1, 1], [0.01])


def test_async_compensations_are_cancelled_at_the_deadline():
    """An async compensation past its deadline is cancelled, then retried, never concurrently."""
    active, runs, cancelled = [], [], []

    async def hang(payload):
        active.append(1)
        runs.append(len(active))
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(1)
            raise
        finally:
            active.pop()

    ledger = SagaLedger(attempts=2, timeout=0.2, backoff=NO_WAIT)
    compensations = {"hang": agenttx.compensation(name="hang")(hang)}
    report = finishes(asyncio.run, ledger.acompensate([record(1, kind="hang")], compensations))
    assert report.failures == ("undo 1.0: timed out after 200 ms",)
    assert (runs, cancelled, ledger.running) == ([1, 1], [1, 1], ())


def test_an_async_compensation_that_ignores_cancellation_is_not_retried():
    """A coroutine that swallows its cancellation is still running: it is not started again."""
    release, runs = threading.Event(), []

    async def stubborn():
        runs.append(1)
        while not release.is_set():
            try:
                await asyncio.sleep(0.001)
            except asyncio.CancelledError:
                continue

    async def main():
        ledger = SagaLedger(attempts=3, timeout=0.2, backoff=NO_WAIT)
        stuck = record(1, action=stubborn)
        report = await ledger.acompensate([stuck], {})
        running = ledger.running
        release.set()
        return report, running == (stuck,)

    report, was_running = finishes(asyncio.run, main())
    assert report.failures == (
        "undo 1.0: timed out after 200 ms, still running after timeout: not tried again",
    )
    assert (was_running, runs) == (True, [1])


def test_a_blocking_compensation_does_not_block_the_event_loop(never):
    """Under acompensate a sync compensation runs on a worker: the loop keeps running."""
    loop_ran, seen = threading.Event(), []

    def blocking():
        seen.append(loop_ran.wait(10))  # never set if this blocked the loop's thread
        never.wait()

    async def tick():
        loop_ran.set()

    async def main():
        task = asyncio.ensure_future(tick())
        report = await SagaLedger(attempts=1, timeout=0.2).acompensate(
            [record(1, action=blocking)], {}
        )
        await task
        return report

    report = finishes(asyncio.run, main())
    assert (report.failures, seen) == (("undo 1.0: timed out after 200 ms",), [True])


def test_an_interrupt_keeps_the_record_and_the_rest_as_failed():
    """A KeyboardInterrupt from a compensation propagates; it and the rest are kept, not run."""

    def interrupt():
        raise KeyboardInterrupt

    ledger = SagaLedger()
    first, second = record(2, action=interrupt), record(1, action=lambda: None)
    with pytest.raises(KeyboardInterrupt):
        ledger.compensate([first, second], {})
    assert ledger.failed == (
        (first, "interrupted by KeyboardInterrupt"),
        (second, "not run: interrupted by KeyboardInterrupt"),
    )


def test_an_interrupt_during_the_backoff_is_kept_too():
    """An interrupt while waiting to retry keeps the record as interrupted and propagates."""

    def fail():
        raise OSError("busy")

    def interrupted(seconds):
        raise KeyboardInterrupt

    ledger = SagaLedger(attempts=2)
    with pytest.raises(KeyboardInterrupt):
        ledger.compensate([record(1, action=fail)], {}, sleep=interrupted)
    assert [reason for _, reason in ledger.failed] == ["interrupted by KeyboardInterrupt"]


def test_cancelling_acompensate_cancels_the_running_compensation():
    """Cancelling the caller cancels the compensation's task and keeps the record."""
    cancelled = []

    async def main():
        begun = asyncio.Event()

        async def hang():
            begun.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(1)
                raise

        ledger = SagaLedger(timeout=30)
        stuck = record(1, action=hang)
        task = asyncio.ensure_future(ledger.acompensate([stuck], {}))
        await begun.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)  # let the compensation see its cancellation
        return ledger.failed, ledger.running, stuck

    failed, running, stuck = asyncio.run(main())
    assert (failed, running, cancelled) == (((stuck, "interrupted by CancelledError"),), (), [1])


def test_async_compensation_failures_are_reported():
    """An async undo that raises is reported with its message."""

    async def broken():
        raise ValueError("nope")

    ledger = SagaLedger(attempts=1)
    report = asyncio.run(ledger.acompensate([record(1, action=broken)], {}))
    assert report.failures == ("undo 1.0: nope",)


# ---------------------------------------------------------------- delivery deadlines


def test_a_delivery_past_its_deadline_is_reported_and_the_rest_go_out(never):
    """A dispatcher that never returns is a dispatch failure; the next effect is delivered."""
    out = []

    def deliver(effect):
        if effect.step_id == 1:
            never.wait()
        out.append(effect.step_id)

    delivered, failures = finishes(
        lambda: dispatch_effects([effect(1), effect(2)], deliver, timeout=0.02)
    )
    assert (delivered, failures, out) == (
        1,
        ("email effect k1 (step 1): timed out after 20 ms",),
        [2],
    )


@pytest.mark.parametrize("timeout", [0, -1, math.nan, "1"])
def test_delivery_timeouts_are_checked(timeout):
    """A delivery timeout that is not a positive number is refused, naming it."""
    with pytest.raises(agenttx.InvalidArgument, match="timeout must be"):
        dispatch_effects([], None, timeout=timeout)


# ---------------------------------------------------------------- the outbox


@pytest.fixture
def outbox(tmp_path):
    """A SQLite store with two committed effects in its outbox."""
    with SQLiteStore(str(tmp_path / "store.db")) as store:
        store.begin("t")
        rows = [
            EffectRow(step_id=1, channel="email", payload='{"to":"a"}', idempotency_key="k1"),
            EffectRow(step_id=1, channel="email", payload='{"to":"b"}', idempotency_key="k2"),
        ]
        store.record_step("t", 1, "{}", rows, "{}")
        store.commit("t")
        yield store


class FlakyOutbox:
    """The outbox side of `store`, whose methods raise StorageError on the calls listed."""

    def __init__(self, store, **failing):
        self.store, self.failing = store, failing
        self.calls = dict.fromkeys(failing, 0)
        self.replace = {}  # entry id -> the entry to list instead

    def _call(self, name, *args, **kwargs):
        if name in self.failing:
            self.calls[name] += 1
            if self.calls[name] in self.failing[name]:
                raise agenttx.StorageError("disk I/O error")
        return getattr(self.store, name)(*args, **kwargs)

    def pending_effects(self, *args, **kwargs):
        entries = self._call("pending_effects", *args, **kwargs)
        return tuple(self.replace.get(entry.id, entry) for entry in entries)

    def mark_delivered(self, *args):
        return self._call("mark_delivered", *args)

    def mark_failed(self, *args):
        return self._call("mark_failed", *args)


def test_a_store_failing_to_mark_delivered_does_not_raise(outbox):
    """If mark_delivered fails, delivery reports it and goes on; the next run delivers it again."""
    sent = []
    flaky = FlakyOutbox(outbox, mark_delivered={1})
    delivered, failures = deliver_outbox(flaky, lambda e: sent.append(e.idempotency_key))
    assert (delivered, sent) == (1, ["k1", "k2"])
    assert failures == (
        (
            "email effect k1 (step 1): delivered, but the outbox could not record it"
            " (disk I/O error): it stays pending and will be offered again"
        ),
    )
    assert [entry.idempotency_key for entry in outbox.pending_effects()] == ["k1"]
    assert deliver_outbox(flaky, lambda e: sent.append(e.idempotency_key)) == (1, ())
    assert (sent, outbox.pending_effects()) == (["k1", "k2", "k1"], ())


def test_a_store_failing_to_mark_failed_does_not_raise(outbox):
    """If mark_failed fails, both errors are reported and the entry is offered again at once."""

    def down(effect):
        raise ConnectionError("smtp down")

    delivered, failures = deliver_outbox(FlakyOutbox(outbox, mark_failed={1}), down)
    assert delivered == 0
    assert failures[0] == (
        "email effect k1 (step 1): smtp down; the outbox could not record the failure"
        " (disk I/O error) and will be offered again"
    )
    first, second = outbox.pending_effects()
    assert (first.attempts, first.not_before, second.attempts) == (0, 0, 1)


def test_a_store_failing_to_list_the_outbox_does_not_raise(outbox):
    """If the pending entries cannot be read, that is the one failure line."""
    assert deliver_outbox(FlakyOutbox(outbox, pending_effects={1}), print) == (
        0,
        ("outbox: the pending effects could not be read: disk I/O error",),
    )


def test_an_unreadable_outbox_payload_is_a_failed_delivery(outbox):
    """An entry whose payload is not JSON is reported and counted, not raised."""
    first, _ = outbox.pending_effects()
    flaky = FlakyOutbox(outbox)
    flaky.replace[first.id] = attrs.evolve(first, payload="{oops")
    delivered, failures = deliver_outbox(flaky, lambda e: None)
    assert delivered == 1
    assert failures[0].startswith("email effect k1 (step 1): unreadable payload: ")
    assert outbox.pending_effects()[0].attempts == 1


def test_a_timed_out_delivery_backs_off_like_any_failure(outbox, never):
    """A delivery past its deadline is a failed attempt: counted and held back by the backoff."""
    backoff = Backoff(base=5, max_wait=60)
    delivered, failures = finishes(
        lambda: deliver_outbox(
            outbox, lambda e: never.wait(), timeout=0.02, clock=lambda: 1000.0, backoff=backoff
        )
    )
    assert (delivered, len(failures)) == (0, 2)
    assert [(e.attempts, e.last_error, e.not_before) for e in outbox.pending_effects()] == [
        (1, "timed out after 20 ms", 1005.0),
        (1, "timed out after 20 ms", 1005.0),
    ]
    # not due before then: nothing is offered
    assert deliver_outbox(outbox, print, clock=lambda: 1004.0) == (0, ())


def test_sync_compensations_under_acompensate():
    """acompensate runs sync undos too: a success counts, an exception is reported."""
    seen = []

    def fail():
        raise OSError("disk full")

    ledger = SagaLedger(attempts=1)
    records = [record(2, action=fail), record(1, action=lambda: seen.append(1))]
    report = asyncio.run(ledger.acompensate(records, {}))
    assert (report.succeeded, report.failures, seen) == (1, ("undo 2.0: disk full",), [1])


def test_an_attempt_runs_only_between_its_start_and_its_end():
    """Attempt.running is False before the call starts and after it has returned."""
    attempt = Attempt(lambda: None, 1.0)
    assert not attempt.running
    assert attempt.run() is None
    assert not attempt.running


def test_check_dispatcher_accepts_what_delivery_accepts_and_names_the_rest():
    """check_dispatcher passes None, a callable and a mapping of channel names to callables
    (what dispatch_effects delivers through), and raises InvalidArgument for anything else."""
    for good in (None, print, {"email": print}, {}, agenttx.JsonlDispatcher("/dev/null")):
        check_dispatcher(good)
    for bad in (5, "email", [print], {"email": 5}, {3: print}):
        with pytest.raises(agenttx.InvalidArgument, match=r"^dispatcher must"):
            check_dispatcher(bad)


def test_a_ledger_never_keeps_its_transaction_alive():
    """A transaction that ended is freed by reference counting alone: its ledger holds the
    audit callback weakly, so no cycle waits for the garbage collector (a speed matter)."""

    @agenttx.compensation(name="undo")
    def undo(payload):
        del payload

    @agenttx.tool(compensate=undo)
    def noop(x: int) -> dict:
        return {"x": x}

    enabled = gc.isenabled()
    gc.disable()
    try:
        tx = agenttx.Transaction(tools=[undo, noop])
        for step in (1, 2, 3):
            tx.execute_step(step, "noop", {"x": step})
        tx.commit()
        ref = weakref.ref(tx)
        del tx
        assert ref() is None
    finally:
        if enabled:
            gc.enable()
