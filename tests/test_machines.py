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
import signal
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

import agenttx
from agenttx import Engine, EngineConfig, StepStatus, TxStatus
from agenttx.stores import MemoryStore, SQLiteStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

FAST = EngineConfig(idle_timeout=None, compensation_retries=1)
SLOW = os.environ.get("AGENTTX_SLOW") == "1"


class Died(BaseException):  # noqa: N818  (it is not an error: the process is gone)
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
    with pytest.raises(BaseException) as caught:  # noqa: PT011, PT012
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
            if die and ctx.step_id == 2:  # noqa: PLR2004
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
    assert len(keys) == 4  # step 1, then three attempts of step 2  # noqa: PLR2004
    attempts = keys[1:]
    assert len(set(attempts)) == 3, attempts  # noqa: PLR2004
    assert _lines(tmp_path / "refunds.log") == attempts[:2]  # each dead attempt, once
    assert [step.step_id for step in tx.steps] == [1, 2]
    tx.commit()
    assert _lines(tmp_path / "refunds.log") == attempts[:2]
