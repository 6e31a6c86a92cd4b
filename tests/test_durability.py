"""Transactions on a durable store: the log they keep, recovery (abort and resume), the outbox."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import agenttx
from agenttx import Engine, EngineConfig, TxStatus, builtins
from agenttx.stores import MemoryStore, SQLiteStore

if TYPE_CHECKING:
    from collections.abc import Callable

FAST = EngineConfig(idle_timeout=None, compensation_retries=1)


class Shop:
    """Tools whose effects and undos are written to a file, so a crash cannot fake them."""

    def __init__(self, root: Path, *, refund_fails: bool = False) -> None:
        self.journal = root / "effects.log"
        self.refund_fails = refund_fails

        @agenttx.compensation(name="shop.refund")
        def refund(payload) -> None:
            if self.refund_fails:
                raise RuntimeError("payment provider down")
            self.write(f"refund {payload['order']}")

        @agenttx.tool(name="charge")
        def charge(ctx: agenttx.ToolContext, order: str, amount: int) -> dict:
            ctx.register_undo("shop.refund", {"order": order})
            self.write(f"charge {order}")
            ctx.state.put(f"orders/{order}", {"amount": amount})
            return {"order": order, "amount": amount}

        @agenttx.tool(name="notify")
        def notify(ctx: agenttx.ToolContext, to: str) -> dict:
            return {"key": ctx.stage_effect("email", {"to": to})}

        @agenttx.tool(name="fail")
        def fail(order: str) -> dict:
            raise agenttx.ToolError(f"cannot ship {order}")

        @agenttx.tool(name="die")
        def die(ctx: agenttx.ToolContext, order: str) -> dict:
            ctx.register_undo("shop.refund", {"order": order})
            self.write(f"charge {order}")
            ctx.state.put(f"orders/{order}", {"amount": 0})
            ctx.state.get(f"orders/{order}")
            os._exit(0)  # the process dies in the middle of the step

        @agenttx.tool(name="send")
        def send(ctx: agenttx.ToolContext, order: str) -> dict:
            self.write(f"send {order} {ctx.idempotency_key}")
            if not (root / "sent-once").exists():
                (root / "sent-once").touch()
                os._exit(0)  # dies before anything of the step reaches the store
            return {"key": ctx.idempotency_key}

        self.tools = [refund, charge, notify, fail, die, send]

    def write(self, line: str) -> None:
        with self.journal.open("a") as journal:
            journal.write(line + "\n")

    def lines(self) -> list[str]:
        return self.journal.read_text().splitlines() if self.journal.exists() else []


def engine_on(
    path: Path | Callable[..., Any], shop: Shop, *, exclusive: bool = False, **kwargs
) -> Engine:
    """An engine on the SQLite file `path`, or on a new store of a `durable_backend`."""
    store = SQLiteStore(path, exclusive=exclusive) if isinstance(path, Path) else path()
    return Engine(tools=shop.tools, store=store, config=FAST, **kwargs)


def crash(engine: Engine) -> None:
    """What a dead process leaves: the file, and nothing of the engine's memory."""
    engine.close()
    engine.store.close()  # type: ignore[attr-defined]


def test_abort_recovery_compensates_an_open_transaction_newest_first(tmp_path, durable_backend):
    """A transaction left open by a crash is compensated newest first, then discarded."""
    shop = Shop(tmp_path)
    engine = engine_on(durable_backend, shop)
    tx = engine.begin(agent_id="a")
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    tx.execute_step(2, "charge", {"order": "o2", "amount": 7})
    crash(engine)

    engine = engine_on(durable_backend, shop)
    report = engine.recover()
    assert (report.transactions, report.compensations_run, report.failures) == (1, 2, ())
    assert shop.lines() == ["charge o1", "charge o2", "refund o2", "refund o1"]
    assert engine.store.open_transactions() == ()  # type: ignore[attr-defined]
    assert engine.store.read_committed("orders/o1") is None
    assert engine.recover() == agenttx.RecoveryReport()  # nothing left to do


def test_resume_continues_from_the_next_step(tmp_path, durable_backend):
    """Resume rebuilds the steps, constraints, counters and graph; the agent goes on."""
    shop = Shop(tmp_path)
    engine = engine_on(durable_backend, shop)
    tx = engine.begin(agent_id="agent-7")
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    failed = tx.execute_step(2, "fail", {"order": "${steps.1.order}"})
    assert failed.next_step_id == 1  # a local backtrack: step 1 is undone too
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    tx.execute_step(2, "charge", {"order": "o2", "amount": "${steps.1.amount}"})
    before = tx.view()
    crash(engine)

    engine = engine_on(durable_backend, shop)
    report = engine.recover("resume")
    assert report.resumed == (tx.id,)
    resumed = engine.get(tx.id)
    view = resumed.view()
    assert (view.agent_id, view.next_step_id, view.constraints) == (
        "agent-7",
        before.next_step_id,
        before.constraints,
    )
    assert resumed.steps == tx.steps
    assert resumed.global_resets == tx.global_resets
    assert resumed.graph.to_json() == tx.graph.to_json()
    assert resumed.read("orders/o2") == {"amount": 5}
    assert [(a.step_id, a.status.value) for a in resumed.history] == [(1, "live"), (2, "live")]
    step = resumed.next_step_id
    result = resumed.execute_step(step, "charge", {"order": "o3", "amount": "${steps.1.amount}"})
    assert result.output == {"order": "o3", "amount": 5}
    assert resumed.commit().steps_committed == step
    assert engine.store.read_committed("orders/o3") == '{"amount":5}'
    assert shop.lines().count("refund o1") == 1  # by the backtrack, before the crash


def test_a_repeated_failure_is_remembered_across_a_crash(tmp_path, durable_backend):
    """The rewinds each failure caused are in the durable log: after a crash and a resume,
    the same call failing the same way again aborts instead of rewinding once more."""
    shop = Shop(tmp_path)
    engine = engine_on(durable_backend, shop)
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    first = tx.execute_step(2, "fail", {"order": "o1"})
    assert first.strategy is agenttx.RollbackStrategy.LOCAL_BACKTRACK
    crash(engine)

    engine = engine_on(durable_backend, shop)
    (tx_id,) = engine.recover("resume").resumed
    resumed = engine.get(tx_id)
    assert resumed.execute_step(1, "charge", {"order": "o1", "amount": 5}).ok
    again = resumed.execute_step(2, "fail", {"order": "o1"})
    assert again.strategy is agenttx.RollbackStrategy.ABORT
    assert again.abort_reason is not None
    assert again.abort_reason.startswith("repeated failure")
    assert shop.lines() == ["charge o1", "refund o1", "charge o1", "refund o1"]


def _die_in_a_step(path: Path, root: Path, exclusive: bool) -> None:
    shop = Shop(root)
    engine = engine_on(path, shop, exclusive=exclusive)
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    tx.execute_step(2, "die", {"order": "o2"})


@pytest.mark.parametrize("exclusive", [False, True], ids=["shared", "exclusive"])
@pytest.mark.parametrize("mode", ["abort", "resume"])
def test_a_step_interrupted_by_the_death_of_its_process(tmp_path, mode, exclusive):
    """A process killed in the middle of a step: its undo ran on recovery, its writes are gone.
    An exclusive store's lock dies with its process."""
    context = multiprocessing.get_context("spawn")
    child = context.Process(target=_die_in_a_step, args=(tmp_path / "db", tmp_path, exclusive))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    shop = Shop(tmp_path)
    assert shop.lines() == ["charge o1", "charge o2"]

    engine = engine_on(tmp_path / "db", shop, exclusive=exclusive)
    report = engine.recover(mode)
    assert report.transactions == 1
    if mode == "abort":
        assert shop.lines()[2:] == ["refund o2", "refund o1"]
        return
    assert shop.lines()[2:] == ["refund o2"]  # only the interrupted step is undone
    assert report.compensations_run == 1
    tx = engine.get(report.resumed[0])
    assert (tx.status, tx.next_step_id) == (TxStatus.ACTIVE, 2)
    assert tx.read("orders/o2") is None
    assert tx.read("orders/o1") == {"amount": 5}
    tx.execute_step(2, "charge", {"order": "o2", "amount": 9})
    tx.commit()
    assert json.loads(engine.store.read_committed("orders/o2")) == {"amount": 9}


def _die_before_anything_is_durable(path: Path, root: Path) -> None:
    engine = engine_on(path, Shop(root))
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    tx.execute_step(2, "send", {"order": "o1"})


def test_a_step_that_died_before_anything_was_durable_keeps_its_key(tmp_path):
    """Nothing of the step reached the store: resume cannot tell it was sent, so nothing is
    compensated and the step sent again gets the same idempotency key (the documented choice:
    a receiver deduplicating on it returns what the dead attempt did)."""
    context = multiprocessing.get_context("spawn")
    child = context.Process(
        target=_die_before_anything_is_durable, args=(tmp_path / "db", tmp_path)
    )
    child.start()
    child.join(60)
    assert child.exitcode == 0
    shop = Shop(tmp_path)
    engine = engine_on(tmp_path / "db", shop)
    report = engine.recover("resume")
    assert report.compensations_run == 0
    tx = engine.get(report.resumed[0])
    assert tx.next_step_id == 2
    result = tx.execute_step(2, "send", {"order": "o1"})
    first, second = [line.split()[2] for line in shop.lines() if line.startswith("send")]
    assert first == second == result.output["key"]
    assert not [line for line in shop.lines() if line.startswith("refund")]


def test_a_failing_compensation_is_kept_reported_and_retried(tmp_path, durable_backend):
    """A compensation that fails in recovery stays in the store and runs at the next one."""
    shop = Shop(tmp_path, refund_fails=True)
    engine = engine_on(durable_backend, shop)
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    crash(engine)

    engine = engine_on(durable_backend, shop)
    first = engine.recover()
    assert first.compensations_run == 0
    assert first.failures == (f'{tx.id}: shop.refund({{"order":"o1"}}): payment provider down',)
    crash(engine)

    shop.refund_fails = False
    engine = engine_on(durable_backend, shop)
    second = engine.recover("resume")  # it ended: never resumed, only compensated
    assert (second.compensations_run, second.failures, second.resumed) == (1, (), ())
    assert shop.lines() == ["charge o1", "refund o1"]
    assert engine.recover() == agenttx.RecoveryReport()


def test_an_unregistered_kind_is_reported_not_dropped(tmp_path):
    """An in-memory undo cannot survive a crash: recovery reports it and keeps it."""

    @agenttx.tool
    def remember(ctx: agenttx.ToolContext) -> dict:
        ctx.register_undo(lambda: None, description="forget the thing")
        return {}

    engine = Engine(tools=[remember], store=SQLiteStore(tmp_path / "db"), config=FAST)
    tx = engine.begin()
    tx.execute_step(1, "remember", {})
    crash(engine)
    engine = Engine(tools=[remember], store=SQLiteStore(tmp_path / "db"), config=FAST)
    for _ in range(2):  # kept and reported each time, never silently dropped
        report = engine.recover()
        assert report.failures == (
            f"{tx.id}: forget the thing: no compensation registered for kind `fn`",
        )


def test_an_abort_with_a_failed_compensation_keeps_it_for_recovery(tmp_path, durable_backend):
    """A live abort whose compensation fails leaves it in the store for the next recovery."""
    shop = Shop(tmp_path, refund_fails=True)
    engine = engine_on(durable_backend, shop)
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    assert tx.rollback().compensation_errors
    assert tx.status is TxStatus.ROLLED_BACK
    assert engine.store.open_transactions() == (tx.id,)  # type: ignore[attr-defined]
    crash(engine)
    shop.refund_fails = False
    engine = engine_on(durable_backend, shop)
    assert engine.recover("resume").compensations_run == 1
    assert shop.lines() == ["charge o1", "refund o1"]


def test_committed_effects_wait_in_the_outbox_until_delivered(tmp_path, durable_backend):
    """With no dispatcher, committed effects stay pending; dispatch_pending delivers them once."""
    shop = Shop(tmp_path)
    engine = engine_on(durable_backend, shop)
    tx = engine.begin()
    key = tx.execute_step(1, "notify", {"to": "ada@x.io"}).output["key"]
    uncommitted = engine.begin()
    uncommitted.execute_step(1, "notify", {"to": "nobody@x.io"})
    assert engine.pending_effects() == ()  # nothing before the commit
    tx.commit()
    pending = engine.pending_effects()
    assert [(e.channel, json.loads(e.payload), e.idempotency_key) for e in pending] == [
        ("email", {"to": "ada@x.io"}, key)
    ]
    crash(engine)  # the delivery survives a crash

    sent: list[agenttx.StagedEffect] = []
    engine = engine_on(durable_backend, shop, dispatcher=sent.append)
    assert engine.dispatch_pending() == agenttx.DispatchReport(delivered=1)
    assert [(e.payload, e.idempotency_key) for e in sent] == [({"to": "ada@x.io"}, key)]
    assert engine.pending_effects() == ()
    assert engine.dispatch_pending() == agenttx.DispatchReport()


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_commit_interrupted_around_the_store_says_what_the_store_did(
    tmp_path, durable_backend, monkeypatch, when
):
    """A KeyboardInterrupt raised by the store's commit propagates. Raised before the store
    committed, the transaction is ACTIVE again and commits later; raised after, it is
    COMMITTED as the store is, and its effect waits in the outbox."""
    shop = Shop(tmp_path)
    engine = engine_on(durable_backend, shop)
    store_type = type(engine.store)
    real_commit = store_type.commit

    def interrupted(self, tx_id, **kwargs):
        if when == "after":
            real_commit(self, tx_id, **kwargs)
        raise KeyboardInterrupt

    tx = engine.begin()
    tx.execute_step(1, "notify", {"to": "ada@x.io"})
    monkeypatch.setattr(store_type, "commit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tx.commit()
    monkeypatch.setattr(store_type, "commit", real_commit)
    if when == "before":
        assert tx.status is agenttx.TxStatus.ACTIVE
        assert engine.pending_effects() == ()
        assert tx.commit().effects_dispatched == 0  # no dispatcher: into the outbox
    else:
        assert tx.status is agenttx.TxStatus.COMMITTED
        assert tx.view().pending_effects == 1
        with pytest.raises(agenttx.InvalidTransactionState):
            tx.commit()
    assert [json.loads(e.payload) for e in engine.pending_effects()] == [{"to": "ada@x.io"}]


def test_a_failed_delivery_keeps_its_error_and_backs_off(tmp_path, durable_backend):
    """A delivery failure is counted and kept; the entry waits, then is delivered later."""
    attempts = []

    def flaky(effect: agenttx.StagedEffect) -> None:
        attempts.append(effect.idempotency_key)
        if len(attempts) == 1:
            raise ConnectionError("smtp down")

    shop = Shop(tmp_path)
    engine = engine_on(durable_backend, shop, dispatcher=flaky)
    tx = engine.begin()
    tx.execute_step(1, "notify", {"to": "ada@x.io"})
    result = tx.commit()
    assert result.effects_dispatched == 0
    assert result.dispatch_errors[0].endswith("smtp down")
    (entry,) = engine.pending_effects()  # listed while it waits
    assert (entry.attempts, entry.last_error) == (1, "smtp down")
    assert entry.not_before > 0
    assert engine.dispatch_pending() == agenttx.DispatchReport()  # not due yet: it backs off
    engine.store.mark_failed(entry.id, "smtp down", 0.0)  # type: ignore[attr-defined]
    assert engine.dispatch_pending().delivered == 1  # due now
    assert attempts[0] == attempts[1]  # the same key every time
    assert engine.pending_effects() == ()


def test_memory_engines_have_nothing_to_recover_or_deliver():
    """On a MemoryStore, recover and the outbox calls are harmless no-ops."""
    engine = Engine(store=MemoryStore(), dispatcher=print)
    assert engine.recover() == agenttx.RecoveryReport()
    assert engine.pending_effects() == ()
    assert engine.dispatch_pending() == agenttx.DispatchReport()
    with pytest.raises(agenttx.InvalidArgument, match="mode"):
        engine.recover("later")  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="dispatcher"):
        Engine().dispatch_pending()


def _hold_open(path: Path, ready, release) -> None:
    engine = Engine(store=SQLiteStore(path), config=FAST, tools=builtins.tools(str(path.parent)))
    tx = engine.begin()
    tx.execute_step(1, "kv.put", {"key": "k", "value": 1})
    ready.set()
    release.wait(60)


def test_recovery_leaves_a_live_process_alone(tmp_path):
    """A transaction whose owner process is alive is skipped, not aborted under its feet."""
    context = multiprocessing.get_context("spawn")
    ready, release = context.Event(), context.Event()
    child = context.Process(target=_hold_open, args=(tmp_path / "db", ready, release))
    child.start()
    try:
        assert ready.wait(60)
        engine = Engine(store=SQLiteStore(tmp_path / "db"), config=FAST)
        report = engine.recover()
        assert report.transactions == 0
        assert len(report.skipped) == 1
    finally:
        release.set()
        child.join(60)
    assert engine.recover().transactions == 1  # now it is dead: recovered


def test_a_transaction_that_died_before_its_record_is_discarded(tmp_path):
    """A transaction begun without its record leaves nothing to undo: discarded.

    The engine begins with the record now, but a store used directly, or a file written by an
    earlier version (which wrote the record separately), can hold one. Found by the crash
    campaign: such a transaction used to be reported unreadable forever.
    """
    store = SQLiteStore(tmp_path / "db")
    store.begin("t-1")  # the row exists, without a record
    store.close()
    engine = Engine(store=SQLiteStore(tmp_path / "db"), config=FAST)
    report = engine.recover()
    assert (report.transactions, report.failures) == (1, ())
    assert engine.store.open_transactions() == ()  # type: ignore[attr-defined]


def test_a_transaction_begins_durably_with_its_record(tmp_path):
    """The engine's `begin` writes the transaction's row and its record in one durable write:
    another store sees both at once, with no window in which a crash leaves a bare row."""
    engine = Engine(store=SQLiteStore(tmp_path / "db"), config=FAST)
    tx = engine.begin(agent_id="agent-9", isolation="serializable")
    with SQLiteStore(tmp_path / "db", readonly=True) as reader:
        record = json.loads(reader.peek(tx.id).record)
    assert record["agent_id"] == "agent-9"
    assert record["settings"]["isolation"] == "serializable"


def test_owner_alive_reads_the_owner_record():
    """Only another live process on this host counts as a live owner."""
    import socket  # noqa: PLC0415

    from agenttx._recovery import owner_alive  # noqa: PLC0415

    host = socket.gethostname()
    assert not owner_alive(None)
    assert not owner_alive("not json")
    assert not owner_alive(json.dumps({"pid": os.getppid(), "hostname": "elsewhere"}))
    assert not owner_alive(json.dumps({"pid": os.getpid(), "hostname": host}))  # ourselves
    assert owner_alive(json.dumps({"pid": os.getppid(), "hostname": host}))
    dead = multiprocessing.get_context("spawn").Process(target=int)
    dead.start()
    dead.join()
    assert not owner_alive(json.dumps({"pid": dead.pid, "hostname": host}))
    assert not owner_alive(json.dumps({"pid": "12", "hostname": host}))  # not a pid


def test_an_owner_of_another_user_counts_as_alive(monkeypatch):
    """A process that exists but may not be signalled (another user's) is a live owner."""
    import socket  # noqa: PLC0415

    from agenttx._recovery import owner_alive  # noqa: PLC0415

    def refuse(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", refuse)
    assert owner_alive(json.dumps({"pid": 424242, "hostname": socket.gethostname()}))


def test_recovery_itself_refuses_an_unknown_mode(tmp_path):
    """The recovery function checks its mode too, before it lists anything."""
    from agenttx._recovery import recover  # noqa: PLC0415

    with (
        SQLiteStore(tmp_path / "db") as store,
        pytest.raises(agenttx.InvalidArgument, match="mode"),
    ):
        recover(store, None, mode="later", dispatcher=None, live=())  # type: ignore[arg-type]


def test_recover_refuses_an_unknown_mode(tmp_path):
    """A mode other than abort or resume is refused, durable store or not."""
    engine = Engine(store=SQLiteStore(tmp_path / "db"), config=FAST)
    with pytest.raises(agenttx.InvalidArgument, match="mode"):
        engine.recover("later")  # type: ignore[arg-type]


def test_an_unreadable_log_is_reported_and_left(tmp_path):
    """A transaction whose record cannot be read is reported, not guessed at, and kept."""
    store = SQLiteStore(tmp_path / "db")
    store.begin("t-1")
    store.record_transaction("t-1", '{"format": 1}')  # no agent, no settings
    store.close()
    engine = Engine(store=SQLiteStore(tmp_path / "db"), config=FAST)
    report = engine.recover()
    assert report.transactions == 0
    assert report.failures[0].startswith("t-1: transaction `t-1`: unreadable durable log")
    assert engine.store.open_transactions() == ("t-1",)  # type: ignore[attr-defined]


# ---------------------------------------------------------------- several recoverers at once

TRANSACTIONS, UNDOS = 6, 3


class SlowShop(Shop):
    """A Shop whose refunds take a moment, so that racing recoverers overlap in them."""

    def write(self, line: str) -> None:
        if line.startswith("refund"):
            time.sleep(0.002)
        super().write(line)


def _leave_open_transactions(path: Path, root: Path) -> list[str]:
    """TRANSACTIONS transactions of UNDOS charges each, left open by a crash."""
    shop = Shop(root)
    engine = engine_on(path, shop)
    ids = []
    for n in range(TRANSACTIONS):
        tx = engine.begin()
        for step in range(1, UNDOS + 1):
            tx.execute_step(step, "charge", {"order": f"o{n}-{step}", "amount": 1})
        ids.append(tx.id)
    crash(engine)
    return ids


def _assert_each_refund_ran_once(shop: Shop, reports: list[agenttx.RecoveryReport]) -> None:
    refunds = [line for line in shop.lines() if line.startswith("refund")]
    expected = [f"refund o{n}-{s}" for n in range(TRANSACTIONS) for s in range(1, UNDOS + 1)]
    assert sorted(refunds) == sorted(expected)  # every undo ran, and none twice
    assert sum(r.compensations_run for r in reports) == TRANSACTIONS * UNDOS
    assert sum(r.transactions for r in reports) == TRANSACTIONS
    assert all(r.failures == () for r in reports), reports


def test_two_threads_recovering_one_file_run_each_compensation_once(tmp_path):
    """Two engines (stores) of one process recover the same file at once: each transaction is
    claimed by one of them, so each undo runs exactly once, and nothing is reported failed."""
    _leave_open_transactions(tmp_path / "db", tmp_path)
    shop = SlowShop(tmp_path)
    engines = [engine_on(tmp_path / "db", shop) for _ in range(2)]
    barrier = threading.Barrier(2)
    reports: list[agenttx.RecoveryReport] = []
    errors: list[BaseException] = []

    def recover(engine: Engine) -> None:
        try:
            barrier.wait()
            reports.append(engine.recover())
        except BaseException as exc:  # surfaced below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=recover, args=(e,)) for e in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    _assert_each_refund_ran_once(shop, reports)
    assert engines[0].store.open_transactions() == ()  # type: ignore[attr-defined]


def _recover_in_a_process(path: Path, root: Path, barrier, results) -> None:
    engine = engine_on(path, SlowShop(root))
    barrier.wait()
    report = engine.recover()
    results.put((report.transactions, report.compensations_run, report.failures))


def test_two_processes_recovering_one_file_run_each_compensation_once(tmp_path):
    """Two processes recover the same file at once: each undo runs exactly once."""
    context = multiprocessing.get_context("spawn")
    # Left by a process that has exited: this one is alive, and its transactions would be.
    dead = context.Process(target=_leave_open_transactions, args=(tmp_path / "db", tmp_path))
    dead.start()
    dead.join(60)
    assert dead.exitcode == 0
    barrier, results = context.Barrier(2), context.Queue()
    children = [
        context.Process(
            target=_recover_in_a_process, args=(tmp_path / "db", tmp_path, barrier, results)
        )
        for _ in range(2)
    ]
    for child in children:
        child.start()
    outcomes = [results.get(timeout=120) for _ in children]
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    reports = [
        agenttx.RecoveryReport(transactions=t, compensations_run=r, failures=f)
        for t, r, f in outcomes
    ]
    _assert_each_refund_ran_once(Shop(tmp_path), reports)
    with SQLiteStore(tmp_path / "db") as store:
        assert store.open_transactions() == ()


def test_a_storage_error_on_one_transaction_is_reported_and_the_others_recovered(
    tmp_path, monkeypatch
):
    """A discard that fails (a full disk, say) is a line in failures; the next transactions
    are still recovered, and the failed one stays in the file."""
    ids = _leave_open_transactions(tmp_path / "db", tmp_path)
    doomed = sorted(ids)[1]
    discard = SQLiteStore.discard

    def full_disk(self: SQLiteStore, tx_id: str, *, history: str | None = None) -> None:
        if tx_id == doomed:
            raise agenttx.StorageError("could not discard: database or disk is full")
        discard(self, tx_id, history=history)

    monkeypatch.setattr(SQLiteStore, "discard", full_disk)
    shop = Shop(tmp_path)
    engine = engine_on(tmp_path / "db", shop)
    report = engine.recover()
    assert report.failures == (f"{doomed}: could not discard: database or disk is full",)
    assert report.transactions == TRANSACTIONS
    assert report.compensations_run == TRANSACTIONS * UNDOS  # the doomed one's ran too
    assert engine.store.open_transactions() == (doomed,)  # type: ignore[attr-defined]


def test_a_takeover_during_recovery_is_reported_and_stops_only_that_transaction(tmp_path):
    """Another store takes a transaction over while recovery compensates it: recovery runs
    none of its remaining undos (the new owner will), reports it, and goes on."""
    ids = _leave_open_transactions(tmp_path / "db", tmp_path)
    victim = ids[0]  # its orders are o0-1, o0-2, ...
    thief = SQLiteStore(tmp_path / "db")
    shop = Shop(tmp_path)

    @agenttx.compensation(name="shop.refund")
    def refund(payload) -> None:
        shop.write(f"refund {payload['order']}")
        if payload["order"].startswith("o0-") and not thief.is_open(victim):
            thief.load(victim)  # another process would do this with a store of its own

    engine = Engine(
        tools=[*shop.tools[1:], refund], store=SQLiteStore(tmp_path / "db"), config=FAST
    )
    report = engine.recover()
    assert len(report.failures) == 1
    assert report.failures[0].startswith(f"{victim}: ")
    assert "taken over" in report.failures[0]
    assert report.transactions == TRANSACTIONS
    refunds = [line for line in shop.lines() if line.startswith("refund o0-")]
    assert refunds == [f"refund o0-{UNDOS}"]  # the newest; then the takeover stopped it
    assert engine.store.open_transactions() == (victim,)  # type: ignore[attr-defined]
    assert thief.is_open(victim)
    thief.close()


def test_a_transaction_ended_meanwhile_is_left_out(tmp_path, monkeypatch):
    """A transaction another recoverer finished between the listing and the claim is neither
    recovered nor a failure."""
    ids = _leave_open_transactions(tmp_path / "db", tmp_path)
    engine = engine_on(tmp_path / "db", Shop(tmp_path))
    listed = engine.store.open_transactions()  # type: ignore[attr-defined]
    with SQLiteStore(tmp_path / "db") as other:
        other.discard(ids[0])
    monkeypatch.setattr(SQLiteStore, "open_transactions", lambda self: listed)
    report = engine.recover()
    assert (report.transactions, report.failures, report.skipped) == (TRANSACTIONS - 1, (), ())


# ---------------------------------------------------------------------- history of ended ones


def ended(engine: Engine, tx_id: str):
    """The history the store keeps of ended transaction `tx_id`, decoded, and its image."""
    from agenttx._txlog import read_history  # noqa: PLC0415

    row, image = engine.store.peek_ended(tx_id)  # type: ignore[attr-defined]
    return read_history(row.history), image


def test_a_committed_transaction_keeps_its_history(tmp_path):
    """The commit keeps, with the transaction, its status, every attempt with what became of
    it (as `history` said), its constraints and its live steps."""
    shop = Shop(tmp_path)
    engine = engine_on(tmp_path / "db", shop)
    tx = engine.begin(agent_id="a")
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    tx.execute_step(2, "fail", {"order": "${steps.1.order}"})  # rewinds step 1 (compensated)
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    tx.execute_step(2, "notify", {"to": "ada@x.io"})
    attempts = tx.history
    tx.commit()
    history, image = ended(engine, tx.id)
    assert history.status == "COMMITTED"
    assert history.attempts == attempts
    assert [a.status.value for a in attempts] == ["compensated", "failed", "live", "live"]
    assert history.constraints == tx.constraints != ()
    assert history.compensation_failures == ()
    assert [(step_id, json.loads(text)[0]) for step_id, text in image.steps] == [
        (1, "charge"),
        (2, "notify"),
    ]
    assert json.loads(image.record)["agent_id"] == "a"
    assert len(engine.pending_effects()) == 1  # the outbox as before


def test_an_aborted_transaction_keeps_its_history(tmp_path):
    """A rollback keeps ROLLED_BACK with every attempt undone, and the steps it undid."""
    shop = Shop(tmp_path)
    engine = engine_on(tmp_path / "db", shop)
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    tx.execute_step(2, "notify", {"to": "ada@x.io"})
    tx.rollback()
    history, image = ended(engine, tx.id)
    assert history.status == "ROLLED_BACK"
    assert [a.status.value for a in history.attempts] == ["compensated", "rewound"]
    assert history.attempts == tx.history
    assert [step_id for step_id, _ in image.steps] == [1, 2]
    assert engine.store.open_transactions() == ()  # type: ignore[attr-defined]


def test_a_conflicting_commit_keeps_a_failed_history(tmp_path):
    """A commit that loses to a conflict ends FAILED, and its history says so."""
    shop = Shop(tmp_path)
    engine = engine_on(tmp_path / "db", shop)
    first, second = engine.begin(), engine.begin()
    first.execute_step(1, "charge", {"order": "o1", "amount": 5})
    second.execute_step(1, "charge", {"order": "o1", "amount": 6})
    first.commit()
    with pytest.raises(agenttx.WriteConflict):
        second.commit()
    history, _ = ended(engine, second.id)
    assert history.status == "FAILED"
    assert [a.status.value for a in history.attempts] == ["compensated"]
    assert ended(engine, first.id)[0].status == "COMMITTED"


def test_a_failed_compensation_keeps_the_history_until_recovery_ends_it(tmp_path):
    """An abort that keeps a failed undo for recovery is not history yet; when recovery ends
    it, the history the transaction gave (with the failure) is kept."""
    shop = Shop(tmp_path, refund_fails=True)
    engine = engine_on(tmp_path / "db", shop)
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    tx.rollback()
    assert engine.store.ended_transactions() == ()  # type: ignore[attr-defined]
    crash(engine)
    shop.refund_fails = False
    engine = engine_on(tmp_path / "db", shop)
    assert engine.recover().compensations_run == 1
    history, _ = ended(engine, tx.id)
    assert history.status == "ROLLED_BACK"
    assert [a.status.value for a in history.attempts] == ["compensated"]
    assert "payment provider down" in history.compensation_failures[0]


def test_recovery_gives_an_aborted_crashed_transaction_a_history(tmp_path):
    """A transaction a crash left open, aborted by recovery, is kept ROLLED_BACK with its
    live steps undone (compensated where they had undo records)."""
    shop = Shop(tmp_path)
    engine = engine_on(tmp_path / "db", shop)
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    tx.execute_step(2, "notify", {"to": "ada@x.io"})
    crash(engine)
    engine = engine_on(tmp_path / "db", shop)
    assert engine.recover().transactions == 1
    history, image = ended(engine, tx.id)
    assert history.status == "ROLLED_BACK"
    assert [(a.step_id, a.tool_name, a.status.value) for a in history.attempts] == [
        (1, "charge", "compensated"),
        (2, "notify", "rewound"),
    ]
    assert [step_id for step_id, _ in image.steps] == [1, 2]


def test_a_rewind_that_cannot_finish_keeps_a_failed_history_with_nothing_live(
    tmp_path, monkeypatch
):
    """A store that fails to restore ends the transaction FAILED; its history marks every
    step undone, none live."""
    shop = Shop(tmp_path)
    engine = engine_on(tmp_path / "db", shop)
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    tx.execute_step(2, "notify", {"to": "ada@x.io"})

    def broken(self, tx_id, step):
        raise agenttx.StorageError("disk gone")

    monkeypatch.setattr(SQLiteStore, "restore", broken)
    with pytest.raises(agenttx.StorageError, match="disk gone"):
        tx.rollback(to_step=2)
    assert tx.status is TxStatus.FAILED
    history, _ = ended(engine, tx.id)
    assert history.status == "FAILED"
    assert [a.status.value for a in history.attempts] == ["compensated", "rewound"]


def test_call_ids_survive_a_resume_and_the_end(tmp_path):
    """Call ids are in the durable log: a resumed transaction has them on its steps, still
    refuses a call id sent twice in one turn, and the history kept at the end lists them."""
    shop = Shop(tmp_path)
    engine = engine_on(tmp_path / "db", shop)
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5}, call_id="call_a")
    tx.execute_step(2, "notify", {"to": "ada@x.io"})  # no call id: a five-field record
    crash(engine)

    engine = engine_on(tmp_path / "db", shop)
    assert engine.recover("resume").resumed == (tx.id,)
    resumed = engine.get(tx.id)
    assert [(s.step_id, s.call_id) for s in resumed.steps] == [(1, "call_a"), (2, None)]
    assert [a.call_id for a in resumed.history] == ["call_a", None]
    _, duplicate = resumed.call_turn(
        [("notify", {"to": "b@x.io"}, "call_c"), ("notify", {"to": "c@x.io"}, "call_c")]
    )
    assert not duplicate.ok
    assert "duplicate call id" in (duplicate.error or "")
    step = resumed.next_step_id
    assert resumed.execute_step(step, "notify", {"to": "b@x.io"}, call_id="call_b").ok
    attempts, live = resumed.history, [s.call_id for s in resumed.steps]
    assert live[0] == "call_a"
    assert live[-1] == "call_b"
    resumed.commit()
    history, image = ended(engine, tx.id)
    assert history.attempts == attempts
    assert [a.call_id for a in attempts if a.status.value == "live"] == live
    assert [len(json.loads(text)) for _, text in image.steps] == [
        5 if call_id is None else 6 for call_id in live
    ]


def test_a_log_and_history_without_call_ids_still_load():
    """Step records and history rows written before call ids (five and three fields) read
    back with no call id; a malformed sixth field is a StorageError."""
    from agenttx._txlog import _call_id, read_history  # noqa: PLC0415

    history = read_history(
        json.dumps(
            {
                "format": 1,
                "status": "COMMITTED",
                "attempts": [[1, "charge", "live"], [2, "notify", "failed", "c-2"]],
                "constraints": [],
                "compensation_failures": [],
            }
        )
    )
    assert history is not None
    assert [(a.step_id, a.call_id) for a in history.attempts] == [(1, None), (2, "c-2")]
    assert _call_id([], 1) is None
    assert _call_id(["c"], 1) == "c"
    for rest in ([3], ["a", "b"]):
        with pytest.raises(TypeError, match="malformed step record 4"):
            _call_id(rest, 4)


def test_a_transient_constraint_is_dropped_durably(tmp_path):
    """A transient failure's constraint survives a resume, is dropped when the retried step
    succeeds after it, and a second resume agrees that it is gone."""
    shop = Shop(tmp_path)
    calls = {"left": 1}

    @agenttx.tool(name="quote")
    def quote(order: str) -> dict:
        if calls["left"]:
            calls["left"] -= 1
            raise agenttx.ToolError("quote service unavailable", transient=True)
        return {"price": 5}

    shop.tools.append(quote)
    engine = engine_on(tmp_path / "db", shop)
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    tx.execute_step(2, "fail", {"order": "o1"})  # a lasting constraint
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    failed = tx.execute_step(2, "quote", {"order": "o1"})
    assert failed.strategy is agenttx.RollbackStrategy.RETRY
    assert len(failed.constraints) == 2
    crash(engine)

    engine = engine_on(tmp_path / "db", shop)
    assert engine.recover("resume").resumed == (tx.id,)
    resumed = engine.get(tx.id)
    assert resumed.constraints == failed.constraints
    retried = resumed.execute_step(2, "quote", {"order": "o1"})
    assert retried.ok
    assert retried.constraints == failed.constraints[:1]
    crash(engine)

    engine = engine_on(tmp_path / "db", shop)
    assert engine.recover("resume").resumed == (tx.id,)
    again = engine.get(tx.id)
    assert again.constraints == failed.constraints[:1]
    assert again.execute_step(3, "notify", {"to": "a@x.io"}).constraints == again.constraints


def test_the_mistake_streak_survives_a_resume(tmp_path):
    """Two resends before a crash and one after use up the default three: the fourth
    consecutive mistake at the step backtracks, refunding the step before it."""
    shop = Shop(tmp_path)
    engine = engine_on(tmp_path / "db", shop)
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1", "amount": 5})
    resend = agenttx.RollbackStrategy.RESEND
    assert [tx.execute_step(2, "nope", {}).strategy for _ in range(2)] == [resend, resend]
    crash(engine)

    engine = engine_on(tmp_path / "db", shop)
    assert engine.recover("resume").resumed == (tx.id,)
    resumed = engine.get(tx.id)
    assert resumed.execute_step(2, "nope", {}).strategy is resend
    assert shop.lines() == ["charge o1"]
    fourth = resumed.execute_step(2, "nope", {})
    assert fourth.strategy is agenttx.RollbackStrategy.LOCAL_BACKTRACK
    assert fourth.voided_steps == (1,)
    assert shop.lines() == ["charge o1", "refund o1"]


def _keys(value: object) -> object:
    """The keys of every object in `value`, in their order, at every depth."""
    if isinstance(value, dict):
        return [(key, _keys(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [_keys(item) for item in value]
    return None


NESTED: Any = {
    "zip": "N1",
    "lines": [{"sku": "b", "qty": 2}],
    "at": {"y": 1, "x": {"q": 0, "p": 1}},
}


def _ordered_shop(seen: list[object]) -> list[Any]:
    @agenttx.compensation(name="unship")
    def unship(payload: dict) -> None:
        seen.append(("undo", _keys(payload)))

    @agenttx.tool(name="ship")
    def ship(ctx: agenttx.ToolContext, order: dict) -> dict:
        seen.append(("tool", _keys(order)))
        ctx.register_undo("unship", {"z": 1, "order": order, "a": {"d": 1, "c": 2}})
        return {"w": 1, "order": order}

    return [unship, ship]


def test_an_undo_payload_keeps_its_key_order_after_a_rollback_and_an_abort_recovery(
    durable_backend,
):
    """A compensation gets its payload in the order the tool registered it, at every depth:
    after an in-process rollback, and after `recover("abort")` read it back from the log."""
    seen: list[object] = []
    payload = _keys({"z": 1, "order": NESTED, "a": {"d": 1, "c": 2}})
    engine = Engine(tools=_ordered_shop(seen), store=durable_backend(), config=FAST)
    tx = engine.begin()
    assert tx.call("ship", {"order": NESTED}).ok
    tx.rollback()
    assert seen == [("tool", _keys(NESTED)), ("undo", payload)]
    seen.clear()
    tx = engine.begin()
    assert tx.call("ship", {"order": NESTED}).ok
    crash(engine)
    engine = Engine(tools=_ordered_shop(seen), store=durable_backend(), config=FAST)
    assert engine.recover("abort").compensations_run == 1
    assert seen == [("tool", _keys(NESTED)), ("undo", payload)]


def test_a_resumed_transaction_gives_tools_objects_in_their_key_order(durable_backend):
    """After `recover("resume")`, a tool gets an object in the order it was sent, and an
    earlier step's output (read back from the log) in the order the tool returned it."""
    seen: list[object] = []
    engine = Engine(tools=_ordered_shop(seen), store=durable_backend(), config=FAST)
    tx = engine.begin()
    assert tx.call("ship", {"order": NESTED}).ok
    crash(engine)
    engine = Engine(tools=_ordered_shop(seen), store=durable_backend(), config=FAST)
    assert engine.recover("resume").resumed == (tx.id,)
    resumed = engine.get(tx.id)
    assert resumed.call("ship", {"order": "${steps.1}"}).ok
    assert resumed.call("ship", {"order": {"b": NESTED, "a": 1}}).ok
    assert seen == [
        ("tool", _keys(NESTED)),
        ("tool", _keys({"w": 1, "order": NESTED})),
        ("tool", _keys({"b": NESTED, "a": 1})),
    ]


def test_a_staged_effect_keeps_its_key_order_through_a_resume(durable_backend):
    """An effect staged before a crash reaches the dispatcher, after `recover("resume")` and
    the commit, with its payload's keys in the order the tool staged them."""

    @agenttx.tool(name="mail")
    def mail(ctx: agenttx.ToolContext) -> dict:
        return {"key": ctx.stage_effect("email", {"to": "a@x.io", "body": NESTED, "at": 1})}

    sent: list[agenttx.StagedEffect] = []
    engine = Engine(tools=[mail], store=durable_backend(), config=FAST, dispatcher=sent.append)
    tx = engine.begin()
    assert tx.call("mail", {}).ok
    crash(engine)
    engine = Engine(tools=[mail], store=durable_backend(), config=FAST, dispatcher=sent.append)
    assert engine.recover("resume").resumed == (tx.id,)
    engine.get(tx.id).commit()
    assert [_keys(e.payload) for e in sent] == [_keys({"to": "", "body": NESTED, "at": 1})]
