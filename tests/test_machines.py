"""State machines over interleaved transactions, crashes at every durable write, and recovery.

`MachineBase` runs several transactions at once on one store (a hypothesis `Bundle` of them):
steps that succeed or fail (the controller rewinds), manual rewinds, aborts and commits, with
write conflicts between them, against a small model. On `SQLiteStore` it also kills the
"process" (every transaction and the store object at once) between two rules, or in the middle
of an operation: before or after any durable write, inside a tool, inside a compensation. A
death is simulated in this process: the store is closed at that instant (it writes nothing
more: `SQLiteStore.close` drops what is buffered) and every tool, compensation and dispatcher
does nothing from then on, so nothing the doomed objects do afterwards reaches the file or the
world. A new store and `Engine.recover("resume")` then take over, and the model checks that:

* every transaction that was open is resumed with the same live steps, outputs, state and next
  step (or, for the one caught mid-operation, with one of the outcomes that operation allows);
* every undo that reached the file is compensated exactly once unless its step is live or
  committed (twice only when the death fell between the compensation and the deletion of its
  record: compensations are at-least-once); no compensated step is ever live or committed;
* the committed state is the serial application of the commits; nothing is committed twice;
* every effect of a committed transaction is delivered, none of another;
* the idempotency key of an attempt that reached the file differs from every other attempt's.

The regression tests of the two defects that the machines were written to find come first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import agenttx
from agenttx import Engine, EngineConfig, StepStatus, TxStatus
from agenttx.stores import MemoryStore, SQLiteStore

if TYPE_CHECKING:
    from collections.abc import Callable

FAST = EngineConfig(idle_timeout=None, compensation_retries=1)
SLOW = os.environ.get("AGENTTX_SLOW") == "1"


class Died(BaseException):
    """The simulated death of the process: nothing after it reaches the file or the world."""


@dataclass
class Ground:
    """What reached the file, across the store objects of one file (one per "process")."""

    undo_uids: dict[tuple[str, int, int], int] = field(default_factory=dict)  # place -> uid
    in_file: set[int] = field(default_factory=set)  # uids whose undo record is in the file
    reached_file: set[int] = field(default_factory=set)  # uids whose undo ever was


class CrashableStore(SQLiteStore):
    """A `SQLiteStore` that can die before or after its n-th durable write from now.

    Dying runs `on_death` (so that the test's tools and compensations stop too), closes the
    store, which writes nothing (buffered writes are dropped), and raises `Died`. `ground`
    learns which undo records reached the file and which were deleted from it.
    """

    WRITES = (
        "begin",
        "record_transaction",
        "record_step",
        "record_progress",
        "record_undo",
        "forget_undo",
        "restore",
        "flush",
        "commit",
        "discard",
        "discard_state",
        "load",
        "mark_delivered",
        "mark_failed",
    )

    def __init__(
        self, path: Path, ground: Ground, on_death: Callable[[], None] = lambda: None
    ) -> None:
        super().__init__(path)
        self.ground = ground
        self.on_death = on_death
        self.countdown: int | None = None  # writes to let through before dying
        self.after = False  # die just after that write instead of just before it
        self.named: str | None = None  # count only the writes of that name
        self.writes: list[str] = []  # the durable writes made, by name

    def arm(self, countdown: int, *, after: bool) -> None:
        """Die at the durable write `countdown` from now (0: the next one)."""
        self.countdown, self.after, self.named = countdown, after, None

    def arm_at(self, name: str, *, after: bool, skip: int = 0) -> None:
        """Die at the next durable write called `name` (after `skip` of them)."""
        self.countdown, self.after, self.named = skip, after, name

    def disarm(self) -> None:
        """Die at no write."""
        self.countdown = self.named = None

    def die(self) -> None:
        """Die now: close without writing, then raise `Died`."""
        self.disarm()
        self.on_death()
        self.close()
        raise Died

    def durable(self, name: str, write: Callable[[], Any]) -> Any:
        """Make the durable write `name`, dying before or after it if it is the one."""
        counted = self.countdown is not None and self.named in (None, name)
        due = counted and self.countdown == 0
        if counted:
            self.countdown -= 1  # type: ignore[operator]
        if due and not self.after:
            self.die()
        result = write()
        self.writes.append(name)
        if due:
            self.die()
        return result

    def record_undo(self, tx_id: str, undo: Any) -> None:
        def write() -> None:
            SQLiteStore.record_undo(self, tx_id, undo)
            payload = json.loads(undo.record)["payload"]
            if isinstance(payload, dict) and "uid" in payload:
                self.ground.undo_uids[tx_id, undo.step_id, undo.seq] = payload["uid"]
                self.ground.in_file.add(payload["uid"])
                self.ground.reached_file.add(payload["uid"])

        self.durable("record_undo", write)

    def forget_undo(self, tx_id: str, step_id: int, seq: int) -> None:
        def write() -> None:
            SQLiteStore.forget_undo(self, tx_id, step_id, seq)
            uid = self.ground.undo_uids.get((tx_id, step_id, seq))
            self.ground.in_file.discard(uid)  # type: ignore[arg-type]

        self.durable("forget_undo", write)


def _wrap(name: str) -> Callable[..., Any]:
    original = getattr(SQLiteStore, name)

    def method(self: CrashableStore, *args: Any, **kwargs: Any) -> Any:
        return self.durable(name, lambda: original(self, *args, **kwargs))

    method.__name__ = name
    return method


for _name in CrashableStore.WRITES:
    if _name not in ("record_undo", "forget_undo"):
        setattr(CrashableStore, _name, _wrap(_name))
del _name


# ---------------------------------------------------------------------- defects 1 and 2


class Shop:
    """A charge refunded by a compensation; charges and refunds go to files, like real effects.

    `die_in_refund` makes the next refund kill the process before it refunds anything.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.refunds = root / "refunds.log"
        self.keys = root / "keys.log"
        self.ground = Ground()
        self.store: CrashableStore | None = None
        self.die_in_refund = False

        @agenttx.compensation(name="refund")
        def refund(payload: Any) -> None:
            if self.die_in_refund:
                self.die_in_refund = False
                assert self.store is not None
                self.store.die()
            _append(self.refunds, payload["arguments"]["order"])

        @agenttx.tool(name="charge", compensate="refund")
        def charge(ctx: agenttx.ToolContext, order: str) -> dict[str, Any]:
            _append(self.keys, ctx.idempotency_key)
            ctx.state.put(f"orders/{order}", {"charged": True})
            return {"order": order}

        @agenttx.tool(name="fail")
        def fail(order: str) -> dict[str, Any]:
            raise agenttx.ToolError(f"cannot ship {order}")

        self.tools = [refund, charge, fail]

    def engine(self) -> Engine:
        """An engine on a new store object for the file: a new process, as far as it knows."""
        self.store = CrashableStore(self.root / "db", self.ground)
        return Engine(tools=self.tools, store=self.store, config=FAST)

    def refunded(self) -> list[str]:
        return _lines(self.refunds)


def _append(path: Path, line: str) -> None:
    with path.open("a") as file:
        file.write(line + "\n")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _interrupt(shop: Shop, tx: agenttx.Transaction, how: str) -> None:
    """Rewind `tx` to step 1 (a failing step 2, or a manual rollback), or abort it, expecting
    the simulated death somewhere on the way."""
    with pytest.raises(BaseException) as caught:  # noqa: PT012
        if how == "fail":
            tx.execute_step(2, "fail", {"order": "o1"})
        elif how == "rollback":
            tx.execute_step(2, "charge", {"order": "o2"})
            tx.rollback(1)
        else:
            tx.rollback()
    assert shop.store is not None
    assert shop.store.countdown is None, "the armed death never came"
    del caught  # Died, or what the doomed objects raised after it: either way it is dead


DEATHS = {
    # where the process dies: arm the store, or the refund
    "after the rewind intent": ("record_progress", True),
    "in the refund": None,
    "after the refund, before its record is deleted": ("forget_undo", False),
    "before the store is restored": ("restore", False),
    "after the store is restored": ("restore", True),
    "before the final progress": ("record_progress", False, 1),
}


@pytest.mark.parametrize("how", ["fail", "rollback"])
@pytest.mark.parametrize("death", list(DEATHS))
def test_a_crash_in_a_rewind_never_brings_a_refunded_charge_back(tmp_path, how, death):
    """Defect 1: a process that dies anywhere in a rewind, after a charge's refund ran or not,
    is resumed with the rewind finished: the charge step is not live, it is refunded exactly
    once (twice only if the death came between the refund and the deletion of its record:
    compensations are at least once), and a commit afterwards publishes none of its writes."""
    shop = Shop(tmp_path)
    engine = shop.engine()
    tx = engine.begin()
    assert tx.execute_step(1, "charge", {"order": "o1"}).ok
    plan = DEATHS[death]
    assert shop.store is not None
    if plan is None:
        shop.die_in_refund = True
    else:
        name, after, *skip = plan
        shop.store.arm_at(name, after=after, skip=skip[0] if skip else 0)
    _interrupt(shop, tx, how)
    refunds_before = shop.refunded()

    engine = shop.engine()
    report = engine.recover("resume")
    assert report.resumed == (tx.id,)
    assert report.failures == ()
    resumed = engine.get(tx.id)
    assert resumed.status is TxStatus.ACTIVE
    assert resumed.next_step_id == 1
    assert resumed.steps == ()
    assert resumed.read("orders/o1") is None
    expected = ["o2", "o1"] if how == "rollback" else ["o1"]
    if death == "after the refund, before its record is deleted":
        assert refunds_before == expected[:1]
        expected = [*expected[:1], *expected]  # the refund that died undeleted runs again
    assert shop.refunded() == expected
    assert "live" not in [attempt.status for attempt in resumed.history]
    assert resumed.commit().steps_committed == 0
    assert engine.store.read_committed("orders/o1") is None
    assert engine.store.read_committed("orders/o2") is None
    assert engine.store.open_transactions() == ()  # type: ignore[attr-defined]
    assert shop.refunded() == expected  # nothing is compensated after a commit


ABORT_DEATHS = {
    "after the abort intent": ("record_progress", True),
    "in the refund": None,
    "after the refund, before its record is deleted": ("forget_undo", False),
    "before the discard": ("discard", False),
}


@pytest.mark.parametrize("death", list(ABORT_DEATHS))
def test_a_crash_in_an_abort_is_finished_as_an_abort(tmp_path, death):
    """Defect 1, abort: a process that dies in the middle of an abort is not resumed as a live
    transaction: recovery finishes the abort (the charge refunded once), and it ends."""
    shop = Shop(tmp_path)
    engine = shop.engine()
    tx = engine.begin()
    assert tx.execute_step(1, "charge", {"order": "o1"}).ok
    assert shop.store is not None
    plan = ABORT_DEATHS[death]
    if plan is None:
        shop.die_in_refund = True
    else:
        shop.store.arm_at(plan[0], after=plan[1])
    _interrupt(shop, tx, "abort")

    engine = shop.engine()
    report = engine.recover("resume")
    assert report.failures == ()
    assert engine.get(tx.id).status is TxStatus.ROLLED_BACK
    twice = death == "after the refund, before its record is deleted"
    assert shop.refunded() == ["o1", "o1"] if twice else ["o1"]
    assert engine.store.open_transactions() == ()  # type: ignore[attr-defined]
    assert engine.store.read_committed("orders/o1") is None


class Dying:
    """Tools for a process that is killed (SIGKILL) in the middle of its step 2, every time.

    The charge registers its refund before it charges, and writes each attempt's idempotency
    key to a file before the kill, so the keys of the dead attempts survive them.
    """

    def __init__(self, root: Path, *, die: bool) -> None:
        self.root = root
        keys, refunds = root / "keys.log", root / "refunds.log"

        @agenttx.compensation(name="refund")
        def refund(payload: Any) -> None:
            _append(refunds, payload["key"])

        @agenttx.tool(name="charge")
        def charge(ctx: agenttx.ToolContext, order: str) -> dict[str, Any]:
            key = ctx.idempotency_key
            ctx.register_undo("refund", {"key": key})
            _append(keys, key)
            if die and ctx.step_id == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return {"order": order}

        self.tools = [refund, charge]

    def engine(self) -> Engine:
        return Engine(tools=self.tools, store=SQLiteStore(self.root / "db"), config=FAST)


def _die_in_step_two(root: Path, first: bool) -> None:
    engine = Dying(root, die=True).engine()
    if first:
        tx = engine.begin()
        tx.execute_step(1, "charge", {"order": "o1"})
    else:
        engine.recover("resume")
        (tx,) = engine.transactions()
    tx.execute_step(2, "charge", {"order": "o2"})


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_step_killed_twice_gets_a_new_idempotency_key_each_time(tmp_path):
    """Defect 2: a step whose process is killed twice while its tool runs is rewound (its charge
    refunded) by each resume, and each attempt, the third included, gets an idempotency key of
    its own: a payment provider never mistakes the new charge for the refunded one."""
    context = multiprocessing.get_context("spawn")
    for first in (True, False):
        child = context.Process(target=_die_in_step_two, args=(tmp_path, first))
        child.start()
        child.join(60)
        assert child.exitcode == -signal.SIGKILL
    dying = Dying(tmp_path, die=False)
    engine = dying.engine()
    report = engine.recover("resume")
    (tx,) = engine.transactions()
    assert report.resumed == (tx.id,)
    assert tx.execute_step(2, "charge", {"order": "o2"}).ok
    keys = _lines(tmp_path / "keys.log")
    assert len(keys) == 4  # step 1, then three attempts of step 2
    attempts = keys[1:]
    assert len(set(attempts)) == 3, attempts
    assert _lines(tmp_path / "refunds.log") == attempts[:2]  # each dead attempt, once
    assert [step.step_id for step in tx.steps] == [1, 2]
    tx.commit()
    assert _lines(tmp_path / "refunds.log") == attempts[:2]


class FlakyStore(SQLiteStore):
    """A `SQLiteStore` whose next `forget_undo` fails once, as a write does when another
    process holds the file's lock past `busy_timeout`, or the disk is full."""

    forget_fails = False

    def forget_undo(self, tx_id: str, step_id: int, seq: int) -> None:
        if self.forget_fails:
            self.forget_fails = False
            raise agenttx.StorageError("database is locked")
        super().forget_undo(tx_id, step_id, seq)


def test_a_failed_undo_deletion_loses_no_refund(tmp_path):
    """A rewind whose first refund runs but whose record cannot be deleted (a failed durable
    write) still refunds every other charge, now or at the next recovery: a charge is never
    left standing because a bookkeeping write failed."""
    shop = Shop(tmp_path)
    store = FlakyStore(tmp_path / "db")
    engine = Engine(tools=shop.tools, store=store, config=FAST)
    tx = engine.begin()
    for step in (1, 2, 3):
        assert tx.execute_step(step, "charge", {"order": f"o{step}"}).ok
    store.forget_fails = True
    with contextlib.suppress(agenttx.StorageError):
        tx.rollback(1)
    store.close()
    engine = shop.engine()
    engine.recover("abort")  # retries what the failed transaction kept
    assert sorted(set(shop.refunded())) == ["o1", "o2", "o3"]


class FailingStore(SQLiteStore):
    """A `SQLiteStore` whose file refuses writes from the first `restore` after `arm()` on (a
    full disk, an I/O error, or another process holding the write lock past `busy_timeout`),
    except the deletion of undo records."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.armed = self.failing = False

    def refuse(self) -> None:
        if self.failing:
            raise agenttx.StorageError("disk I/O error")

    def restore(self, tx_id: str, step: int) -> int:
        self.failing = self.failing or self.armed
        self.refuse()
        return super().restore(tx_id, step)

    def discard(self, tx_id: str) -> None:
        self.refuse()
        super().discard(tx_id)

    def discard_state(self, tx_id: str) -> None:
        self.refuse()
        super().discard_state(tx_id)

    def record_progress(self, tx_id: str, progress: str) -> None:
        self.refuse()
        super().record_progress(tx_id, progress)

    def record_transaction(self, tx_id: str, record: str) -> None:
        self.refuse()
        super().record_transaction(tx_id, record)


def test_a_failed_restore_never_brings_refunded_steps_back(tmp_path):
    """A rewind whose store restore fails ends the transaction FAILED; the charges below the
    rewind target are refunded only if the file can record the abort first. Here it cannot, so
    they are kept for recovery, which resumes them as live with their charges standing (never
    a refunded step as live: committing it would publish a refunded charge)."""
    shop = Shop(tmp_path)
    store = FailingStore(tmp_path / "db")
    engine = Engine(tools=shop.tools, store=store, config=FAST)
    tx = engine.begin()
    for step in (1, 2, 3):
        assert tx.execute_step(step, "charge", {"order": f"o{step}"}).ok
    store.armed = True
    with pytest.raises(agenttx.StorageError):
        tx.rollback(3)
    assert tx.status is TxStatus.FAILED
    assert shop.refunded() == ["o3"]  # the abort could not be recorded: o2, o1 are kept
    assert len(tx.view().compensation_failures) == 2
    store.close()  # the process ends; the disk is fine again

    engine = shop.engine()
    engine.recover("resume")
    for resumed in engine.transactions():
        live = [step.output["order"] for step in resumed.steps]  # type: ignore[index,call-overload]
        assert resumed.status.terminal or not set(live) & set(shop.refunded()), live


# ---------------------------------------------------------------------- the machines

KEYS = ("a", "b", "c")
FAILURES = {
    "plain": "something went wrong",
    "transient": "upstream returned HTTP 503",
    "keyed": "KeyError: 'value'",
}
MAX_OPEN = 4  # transactions open at once


@dataclass
class Attempt:
    """One run of the probe tool: a step's attempt."""

    uid: int
    tx_id: str
    step_id: int
    key: str
    value: int
    base: int  # the key's committed version when it ran (its base, if it is the first write)
    idempotency_key: str


@dataclass(eq=False)
class TxModel:
    """What a transaction should hold: its live attempts, in step order."""

    tx_id: str
    live: list[Attempt] = field(default_factory=list)
    ended: bool = False

    def uids(self) -> list[int]:
        return [attempt.uid for attempt in self.live]

    def __repr__(self) -> str:
        return f"<tx {self.tx_id[:8]} live={self.uids()} ended={self.ended}>"


def _uids(tx: agenttx.Transaction) -> list[int]:
    """The attempts of a transaction's live steps, in step order."""
    return [step.output["uid"] for step in tx.steps]  # type: ignore[index,call-overload]


class MachineBase(RuleBasedStateMachine):
    """Interleaved transactions on one store against a model; see the module docstring."""

    txs = Bundle("txs")
    is_async = False

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="agenttx-machine-"))
        self.ground = Ground()
        self.models: dict[str, TxModel] = {}
        self.open: dict[str, agenttx.Transaction] = {}  # the current object of each open one
        self.ended: dict[str, agenttx.Transaction | None] = {}  # the last object of each
        self.attempts: dict[int, Attempt] = {}
        self.registered: set[int] = set()  # uids whose register_undo returned
        self.undone: dict[int, int] = {}  # uid -> compensations that took effect
        self.again: dict[int, int] = {}  # uid -> compensations that must run again
        self.committed: dict[str, int] = {}
        self.versions: dict[str, int] = {}  # commits that wrote each key
        self.committed_uids: set[int] = set()
        self.expected_dispatch: list[int] = []
        self.dispatched: list[int] = []
        self.redelivered_ok: set[int] = set()
        self.dead = False
        self.die_in_tool = False
        self.compensation_countdown: int | None = None
        self.compensation_after = False
        self.loop = asyncio.new_event_loop() if self.is_async else None
        self.engine = self.make_engine()

    def teardown(self) -> None:
        store = self.engine.store
        if isinstance(store, SQLiteStore):
            store.close()
        if self.loop is not None:
            self.loop.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ the world

    def make_store(self) -> agenttx.stores.Store:
        return MemoryStore()

    def make_engine(self) -> Engine:
        return Engine(
            tools=self.make_tools(),
            store=self.make_store(),
            config=FAST,
            dispatcher=self.deliver,
        )

    def make_tools(self) -> list[Any]:
        def undo(payload: dict[str, Any]) -> None:
            if self.dead:
                raise Died
            if self.compensation_countdown == 0:
                self.compensation_countdown = None
                if self.compensation_after:
                    self.undone[payload["uid"]] = self.undone.get(payload["uid"], 0) + 1
                self.kill()
            if self.compensation_countdown is not None:
                self.compensation_countdown -= 1
            self.undone[payload["uid"]] = self.undone.get(payload["uid"], 0) + 1

        def probe(ctx: agenttx.ToolContext, key: str, value: int, fail: str = "") -> Any:
            if self.dead:
                raise Died
            uid = len(self.attempts) + 1
            self.attempts[uid] = Attempt(
                uid=uid,
                tx_id=ctx.tx_id,
                step_id=ctx.step_id,
                key=key,
                value=value,
                base=self.versions.get(key, 0),
                idempotency_key=ctx.idempotency_key,
            )
            ctx.register_undo("probe.undo", {"uid": uid})  # before the effect
            self.registered.add(uid)
            ctx.state.put(f"probe/{key}", value)
            ctx.stage_effect("probe", {"uid": uid})
            if self.die_in_tool:
                self.kill()
            if fail:
                raise agenttx.ToolError(FAILURES[fail])
            return {"uid": uid}

        if not self.is_async:
            return [
                agenttx.compensation(name="probe.undo")(undo),
                agenttx.tool(name="probe")(probe),
            ]

        async def aundo(payload: dict[str, Any]) -> None:
            await asyncio.sleep(0)
            undo(payload)

        async def aprobe(ctx: agenttx.ToolContext, key: str, value: int, fail: str = "") -> Any:
            await asyncio.sleep(0)  # another task may run here
            return probe(ctx, key, value, fail)

        return [
            agenttx.compensation(name="probe.undo")(aundo),
            agenttx.tool(name="probe")(aprobe),
        ]

    def deliver(self, effect: agenttx.StagedEffect) -> None:
        if self.dead:
            raise Died
        self.dispatched.append(effect.payload["uid"])  # type: ignore[index,call-overload]

    def kill(self) -> None:
        """The process dies now (only a durable store's machine can die)."""
        raise AssertionError("this machine does not crash")

    def run_step(self, tx: agenttx.Transaction, arguments: dict[str, Any]) -> agenttx.StepResult:
        step = tx.next_step_id
        if self.loop is not None:
            return self.loop.run_until_complete(tx.aexecute_step(step, "probe", arguments))
        return tx.execute_step(step, "probe", arguments)

    def durable(self, uid: int) -> bool:
        """Whether the attempt's undo record was kept: its effect may have happened."""
        return uid in self.registered or uid in self.ground.reached_file

    def live_uids(self) -> set[int]:
        return {uid for model in self.models.values() if not model.ended for uid in model.uids()}

    # ------------------------------------------------------------------ the operations

    def op_begin(self) -> TxModel:
        tx = self.engine.begin()
        model = TxModel(tx.id)
        self.models[tx.id] = model
        self.open[tx.id] = tx
        return model

    def op_step_succeeds(self, model: TxModel, key: str, value: int) -> None:
        tx = self.open[model.tx_id]
        step = tx.next_step_id
        result = self.run_step(tx, {"key": key, "value": value})
        assert result.status is StepStatus.SUCCESS, result
        assert result.next_step_id == step + 1
        attempt = self.attempts[result.output["uid"]]  # type: ignore[index,call-overload]
        assert (attempt.tx_id, attempt.step_id, attempt.key) == (model.tx_id, step, key)
        model.live.append(attempt)

    def op_step_fails(self, model: TxModel, key: str, failure: str) -> None:
        tx = self.open[model.tx_id]
        step = tx.next_step_id
        result = self.run_step(tx, {"key": key, "value": -1, "fail": failure})
        assert result.status is not StepStatus.SUCCESS
        if result.status is StepStatus.FAILED:
            assert tx.status is TxStatus.FAILED
            assert result.next_step_id == 0
            self.end(model)
            return
        assert tx.status is TxStatus.ACTIVE
        target = result.next_step_id
        assert 1 <= target <= step, result
        assert max(result.rollback_to_step, 1) == target, result
        del model.live[target - 1 :]

    def op_rollback_to(self, model: TxModel, target: int) -> None:
        result = self.open[model.tx_id].rollback(to_step=target)
        assert (result.aborted, result.next_step_id) == (False, target)
        del model.live[target - 1 :]

    def op_abort(self, model: TxModel) -> None:
        tx = self.open[model.tx_id]
        assert tx.rollback().aborted
        assert tx.status is TxStatus.ROLLED_BACK
        self.end(model)

    def conflicts(self, model: TxModel) -> list[str]:
        """The keys a commit of `model` must refuse: first committer wins on written keys."""
        bases: dict[str, int] = {}
        for attempt in model.live:
            bases.setdefault(attempt.key, attempt.base)
        return sorted(k for k, base in bases.items() if self.versions.get(k, 0) != base)

    def op_commit(self, model: TxModel) -> None:
        tx = self.open[model.tx_id]
        if conflicts := self.conflicts(model):
            with pytest.raises(agenttx.WriteConflict) as caught:
                tx.commit()
            assert caught.value.key == f"probe/{conflicts[0]}"
            assert tx.status is TxStatus.FAILED
            self.end(model)
            return
        result = tx.commit()
        assert result.steps_committed == len(model.live)
        assert tx.status is TxStatus.COMMITTED
        self.publish(model)

    def publish(self, model: TxModel) -> None:
        """The model of a commit: the live writes, then the effects in staging order."""
        for key in {attempt.key for attempt in model.live}:
            self.versions[key] = self.versions.get(key, 0) + 1
        for attempt in model.live:
            self.committed[attempt.key] = attempt.value
        self.committed_uids.update(model.uids())
        self.expected_dispatch.extend(model.uids())
        self.end(model)

    def end(self, model: TxModel) -> None:
        model.ended = True
        model.live.clear()
        self.ended[model.tx_id] = self.open.pop(model.tx_id)

    def refuses(self, model: TxModel, call: Callable[[agenttx.Transaction], object]) -> None:
        """An ended transaction refuses every call (if this process has an object for it)."""
        tx = self.ended[model.tx_id]
        if tx is None:  # it ended in a process that died: this one never had it
            return
        with pytest.raises(agenttx.InvalidTransactionState):
            call(tx)

    # ------------------------------------------------------------------ rules

    @initialize(target=txs)
    def first(self) -> TxModel:
        """A transaction is open from the start."""
        return self.op_begin()

    @precondition(lambda self: len(self.open) < MAX_OPEN)
    @rule(target=txs)
    def begin(self) -> TxModel:
        """A transaction begins on the shared store."""
        return self.op_begin()

    @rule(model=txs, key=st.sampled_from(KEYS), value=st.integers(0, 2))
    def step_succeeds(self, model: TxModel, key: str, value: int) -> None:
        """A probe call that succeeds becomes a live step."""
        if model.ended:
            self.refuses(model, lambda tx: tx.execute_step(1, "probe", {"key": key}))
            return
        self.op_step_succeeds(model, key, value)

    @rule(model=txs, key=st.sampled_from(KEYS), failure=st.sampled_from(sorted(FAILURES)))
    def step_fails(self, model: TxModel, key: str, failure: str) -> None:
        """A probe call that fails rewinds to the step the result names, or aborts."""
        if model.ended:
            self.refuses(model, lambda tx: tx.rollback(1))
            return
        self.op_step_fails(model, key, failure)

    @rule(model=txs, data=st.data())
    def rollback_to(self, model: TxModel, data: st.DataObject) -> None:
        """A manual rewind drops the steps from `to_step` on."""
        if model.ended or not model.live:
            return
        target = data.draw(st.integers(1, len(model.live)), label="to_step")
        self.op_rollback_to(model, target)

    @rule(model=txs)
    def abort(self, model: TxModel) -> None:
        """A full rollback compensates every step and ends the transaction."""
        if model.ended:
            self.refuses(model, lambda tx: tx.rollback())
            return
        self.op_abort(model)

    @rule(model=txs)
    def commit(self, model: TxModel) -> None:
        """A commit publishes the live writes, or is refused on a key committed meanwhile."""
        if model.ended:
            self.refuses(model, lambda tx: tx.commit())
            return
        self.op_commit(model)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def state_is_the_live_steps_writes(self) -> None:
        """Each open transaction reads its live steps' last writes, else the committed state;
        the store's committed state is the model's.

        Only keys a transaction wrote are read through it: reading any other key would record
        the read, and fix the base version its later write is checked against at commit (as an
        agent's read does), which would change what the model must expect.
        """
        store = self.engine.store
        for key in KEYS:
            text = store.read_committed(f"probe/{key}")
            assert (None if text is None else json.loads(text)) == self.committed.get(key), key
        for tx_id, tx in self.open.items():
            written: dict[str, int] = {}
            for attempt in self.models[tx_id].live:
                written[attempt.key] = attempt.value
            in_overlay = set(store.written_keys(tx_id))
            assert {f"probe/{key}" for key in written} <= in_overlay, tx_id
            for key in KEYS:
                if f"probe/{key}" in in_overlay:  # an overlay entry answers: no read recorded
                    assert tx.read(f"probe/{key}") == written.get(key), (tx_id, key)

    @invariant()
    def steps_match_the_model(self) -> None:
        """Each open transaction is ACTIVE with the model's live steps and next step."""
        for tx_id, tx in self.open.items():
            model = self.models[tx_id]
            assert tx.status is TxStatus.ACTIVE, (model, tx.status)
            assert _uids(tx) == model.uids(), model
            assert [s.step_id for s in tx.steps] == list(range(1, len(model.live) + 1))
            assert tx.next_step_id == len(model.live) + 1

    @invariant()
    def every_undo_ran_once_unless_live_or_committed(self) -> None:
        """An attempt whose undo was kept is compensated once (twice only where a death fell
        between its compensation and the deletion of its record) unless its step is live or
        committed; no compensated attempt is ever live or committed."""
        live = self.live_uids()
        for uid in self.attempts:
            count = self.undone.get(uid, 0)
            if uid in live or uid in self.committed_uids:
                assert count == 0, f"attempt {uid} was compensated, yet it is live or committed"
            elif not self.durable(uid):
                assert count == 0, f"attempt {uid} left no undo, yet it was compensated"
            else:
                assert count == 1 + self.again.get(uid, 0), (uid, count)

    @invariant()
    def idempotency_keys_are_never_reused(self) -> None:
        """No two attempts that kept an undo got the same idempotency key."""
        keys = [a.idempotency_key for a in self.attempts.values() if self.durable(a.uid)]
        assert len(keys) == len(set(keys))

    @invariant()
    def only_commits_dispatch(self) -> None:
        """The effects delivered are those of committed steps, in commit then staging order;
        one is delivered again only after a death in its commit's delivery."""
        first = list(dict.fromkeys(self.dispatched))
        assert first == self.expected_dispatch
        again = [uid for uid in self.dispatched if self.dispatched.count(uid) > 1]
        assert set(again) <= self.redelivered_ok


class MemoryMachine(MachineBase):
    """The machine on a `MemoryStore`, with sync steps."""


class AsyncMemoryMachine(MachineBase):
    """The machine with `aexecute_step`, async tools and async compensations."""

    is_async = True

    @precondition(lambda self: len(self.open) >= 2)
    @rule(data=st.data(), key=st.sampled_from(KEYS))
    def two_steps_at_once(self, data: st.DataObject, key: str) -> None:
        """Two transactions run a step each, concurrently on one loop: both succeed."""
        first, second = data.draw(
            st.lists(st.sampled_from(list(self.open)), min_size=2, max_size=2, unique=True)
        )

        async def both() -> list[agenttx.StepResult]:
            return await asyncio.gather(
                *(
                    self.open[tx_id].aexecute_step(
                        self.open[tx_id].next_step_id, "probe", {"key": key, "value": 1}
                    )
                    for tx_id in (first, second)
                )
            )

        assert self.loop is not None
        for tx_id, result in zip(
            (first, second), self.loop.run_until_complete(both()), strict=True
        ):
            assert result.ok, result
            self.models[tx_id].live.append(self.attempts[result.output["uid"]])  # type: ignore[index,call-overload]


@dataclass
class Interrupted:
    """The operation a death interrupted, and what the model held before it."""

    op: str
    model: TxModel
    before: list[Attempt]
    first_uid: int  # the uid the operation's attempt got, if it ran the tool
    target: int  # the step a rollback_to rewinds to
    conflict: bool  # whether a commit had to be refused


#: Whether the recovering process dies too, and at which of its durable writes.
AGAIN = st.none() | st.tuples(st.integers(0, 5), st.booleans())

OPS = ("step_succeeds", "step_fails", "rollback_to", "abort", "commit")


class SQLiteMachine(MachineBase):
    """The machine on a `SQLiteStore` file, with deaths between rules and inside operations."""

    def make_store(self) -> agenttx.stores.Store:
        return CrashableStore(self.root / "db", self.ground, on_death=self.on_death)

    def on_death(self) -> None:
        self.dead = True
        # A compensation that took effect while its record is still in the file runs again.
        for uid in self.ground.in_file:
            if self.undone.get(uid, 0) == 1 + self.again.get(uid, 0):  # all ran, yet it is kept
                self.again[uid] = self.again.get(uid, 0) + 1

    def kill(self) -> None:
        store = self.engine.store
        assert isinstance(store, CrashableStore)
        store.die()

    @invariant()
    def the_file_holds_the_open_transactions(self) -> None:
        """The file holds exactly the open transactions: a commit or an abort leaves nothing."""
        store = self.engine.store
        assert isinstance(store, SQLiteStore)
        assert set(store.open_transactions()) == set(self.open)

    @rule(again=AGAIN)
    def crash_and_resume(self, again: tuple[int, bool] | None) -> None:
        """The process dies between two calls: every open transaction is resumed as it was."""
        self.on_death()
        self.engine.store.close()  # type: ignore[attr-defined]
        self.resume(None, again)

    @precondition(lambda self: self.open)
    @rule(
        data=st.data(),
        op=st.sampled_from(OPS),
        where=st.one_of(
            st.tuples(st.just("write"), st.integers(0, 6), st.booleans()),
            st.tuples(st.just("compensation"), st.integers(0, 2), st.booleans()),
            st.tuples(st.just("tool"), st.just(0), st.just(False)),
        ),
        key=st.sampled_from(KEYS),
        value=st.integers(0, 2),
        failure=st.sampled_from(sorted(FAILURES)),
        again=AGAIN,
    )
    def crash_during(
        self,
        *,
        data: st.DataObject,
        op: str,
        where: tuple[str, int, bool],
        key: str,
        value: int,
        failure: str,
        again: tuple[int, bool] | None,
    ) -> None:
        """The process dies in the middle of an operation: before or after one of its durable
        writes, in a compensation, or in the tool; the operation's transaction is resumed with
        one of the outcomes the operation allows, and the others as they were."""
        tx_id = data.draw(st.sampled_from(list(self.open)), label="tx")
        model = self.models[tx_id]
        if op == "rollback_to" and not model.live:
            op = "abort"
        target = len(model.live) + 1
        if op == "rollback_to":
            target = data.draw(st.integers(1, len(model.live)), label="to_step")
        kind, n, after = where
        store = self.engine.store
        assert isinstance(store, CrashableStore)
        if kind == "write":
            store.arm(n, after=after)
        elif kind == "compensation":
            self.compensation_countdown, self.compensation_after = n, after
        else:
            self.die_in_tool = True
        before = list(model.live)
        first_uid = len(self.attempts) + 1
        conflicts = self.conflicts(model)
        try:
            if op == "step_succeeds":
                self.op_step_succeeds(model, key, value)
            elif op == "step_fails":
                self.op_step_fails(model, key, failure)
            elif op == "rollback_to":
                self.op_rollback_to(model, target)
            elif op == "abort":
                self.op_abort(model)
            else:
                self.op_commit(model)
        except BaseException:
            if not self.dead:
                raise
            event(f"died in {op} at {kind}")
            if op == "commit":
                self.redelivered_ok.update(attempt.uid for attempt in before)
            self.resume(Interrupted(op, model, before, first_uid, target, bool(conflicts)), again)
            return
        finally:
            store.disarm()
            self.compensation_countdown = None
            self.die_in_tool = False
        event(f"{op} survived {kind}")

    def resume(self, interrupted: Interrupted | None, again: tuple[int, bool] | None) -> None:
        """Recover in a new "process" and check every open transaction against the model.

        With `again`, the recovering process dies too, at that durable write of its recovery
        (if it makes that many), and a third one recovers.
        """
        self.dead = False
        self.engine = self.make_engine()
        report = None
        if again is not None:
            store = self.engine.store
            assert isinstance(store, CrashableStore)
            store.arm(again[0], after=again[1])
            try:
                report = self.engine.recover("resume")
            except BaseException:
                if not self.dead:
                    raise
                event("died again in the recovery")
                self.dead = False
                self.engine = self.make_engine()
            finally:
                store.disarm()
        if report is None:
            report = self.engine.recover("resume")
        assert report.failures == ()
        assert report.skipped == ()
        while self.engine.pending_effects():
            self.engine.dispatch_pending()
        resumed = set(report.resumed)
        for tx_id in list(self.open):
            model = self.models[tx_id]
            tx = self.engine.get(tx_id) if tx_id in resumed else None
            if interrupted is not None and interrupted.model is model:
                self.settle(tx, interrupted)
            else:
                assert tx is not None, f"{model} was not resumed"
                assert tx.status is TxStatus.ACTIVE
                assert _uids(tx) == model.uids(), model
            if tx is not None and tx_id in self.open:
                self.open[tx_id] = tx
        assert set(self.engine.store.open_transactions()) == set(self.open)  # type: ignore[attr-defined]

    def settle(self, tx: agenttx.Transaction | None, interrupted: Interrupted) -> None:
        """The operation interrupted by the death: what it allows, and the model updated."""
        op, model, before = interrupted.op, interrupted.model, interrupted.before
        first_uid, target = interrupted.first_uid, interrupted.target
        uids = None if tx is None or tx.status.terminal else _uids(tx)
        old = [attempt.uid for attempt in before]
        model.live[:] = before
        if uids is None:  # the transaction ended: committed, or aborted
            assert op in ("step_fails", "abort", "commit"), (op, tx and tx.status)
            if op == "commit" and not interrupted.conflict:
                assert tx is None  # a commit leaves no row
                self.publish(model)
            else:
                assert tx is None or tx.status in (TxStatus.FAILED, TxStatus.ROLLED_BACK)
                self.end(model)
            self.ended[model.tx_id] = tx  # the dead process's object tells nothing
            event(f"{op}: ended by the recovery")
            return
        assert tx is not None
        assert tx.status is TxStatus.ACTIVE
        if uids == old:
            event(f"{op}: resumed as before")
            return
        if op == "step_succeeds":
            new = [uid for uid in self.attempts if uid >= first_uid]
            assert uids == [*old, *new], (uids, old, new)
            model.live.append(self.attempts[new[0]])
            event(f"{op}: the step survived")
        elif op == "step_fails":
            assert uids == old[: len(uids)], (uids, old)
            del model.live[len(uids) :]
            event(f"{op}: rewound by the recovery")
        else:
            assert op == "rollback_to", (op, uids, old)
            assert uids == old[: target - 1], (uids, old, target)
            del model.live[target - 1 :]
            event(f"{op}: rewound by the recovery")


MACHINE_SETTINGS = settings(
    max_examples=500 if SLOW else 50,
    stateful_step_count=60 if SLOW else 30,
    deadline=None,
    derandomize=not SLOW,  # the default run is the same every time; AGENTTX_SLOW=1 explores
)
TestMemoryMachine = MemoryMachine.TestCase
TestMemoryMachine.settings = MACHINE_SETTINGS
TestAsyncMemoryMachine = AsyncMemoryMachine.TestCase
TestAsyncMemoryMachine.settings = settings(MACHINE_SETTINGS, max_examples=250 if SLOW else 25)
TestSQLiteMachine = SQLiteMachine.TestCase
TestSQLiteMachine.settings = MACHINE_SETTINGS
