"""A rewind preview: what a rollback would do, worked out without doing it."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agenttx
from agenttx import Engine, EngineConfig, InvalidArgument, InvalidTransactionState
from agenttx.stores import SQLiteStore

KINDS = ("charge", "write", "mail", "look", "callback")


class Shop:
    """Tools of every undo kind; `ran` lists the undos run, in order, as (kind, payload)."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, object]] = []

        @agenttx.compensation(name="refund")
        def refund(payload):
            self.ran.append(("refund", payload))

        @agenttx.compensation(name="restore")
        def restore(payload):
            self.ran.append(("restore", payload))

        @agenttx.tool(name="charge", compensate=refund)
        def charge(n: int) -> dict:
            return {"charged": n}

        @agenttx.tool(name="write")
        def write(ctx: agenttx.ToolContext, n: int) -> dict:
            ctx.register_undo("restore", {"n": n, "part": "b", "a": 1})
            ctx.register_undo("restore", {"n": n, "part": "second"})
            ctx.state.put(f"k{n}", n)
            return {}

        @agenttx.tool(name="mail")
        def mail(ctx: agenttx.ToolContext, n: int) -> dict:
            ctx.stage_effect("email", {"n": n})
            return {}

        @agenttx.tool(name="look")
        def look(n: int) -> dict:
            return {"n": n}

        @agenttx.tool(name="callback")
        def callback(ctx: agenttx.ToolContext, n: int) -> dict:
            ctx.register_undo(lambda: self.ran.append(("fn", None)))
            return {}

        self.tools = [refund, restore, charge, write, mail, look, callback]

    def run(self, tx: agenttx.Transaction, kinds: list[str]) -> None:
        for number, kind in enumerate(kinds, 1):
            result = tx.execute_step(number, kind, {"n": number})
            assert result.status is agenttx.StepStatus.SUCCESS, result


def _ran(preview: agenttx.RollbackPreview) -> list[tuple[str, object]]:
    return [(c.kind, None if c.kind == "fn" else c.payload) for c in preview.compensations]


def test_preview_lists_what_a_rollback_would_undo():
    """The voided steps, compensations (newest first, with payloads), drops and irreversible."""
    shop = Shop()
    tx = agenttx.Transaction(tools=shop.tools)
    shop.run(tx, ["charge", "write", "mail", "look"])
    preview = tx.preview_rollback(2)
    assert preview.to_step == 2
    assert preview.voided_steps == (2, 3, 4)
    assert [(c.step_id, c.tool_name, c.kind, c.payload) for c in preview.compensations] == [
        (2, "write", "restore", {"n": 2, "part": "second"}),
        (2, "write", "restore", {"n": 2, "part": "b", "a": 1}),
    ]
    assert [(e.step_id, e.channel, e.payload) for e in preview.dropped_effects] == [
        (3, "email", {"n": 3})
    ]
    assert preview.irreversible == (4,)
    assert preview.describe() == (
        "voids step(s) 2, 3, 4; compensates restore (step 2), restore (step 2); "
        "drops email (step 3); cannot undo what step(s) 4 did outside it"
    )
    whole = tx.preview_rollback()
    assert whole.aborts
    assert whole.voided_steps == (1, 2, 3, 4)
    assert [c.kind for c in whole.compensations] == ["restore", "restore", "refund"]
    assert whole.compensations[-1].payload == {"arguments": {"n": 1}, "output": {"charged": 1}}
    assert tx.preview_rollback(0) == whole


def test_preview_payload_is_a_copy():
    """Changing a previewed payload changes nothing the rollback will use."""
    shop = Shop()
    tx = agenttx.Transaction(tools=shop.tools)
    shop.run(tx, ["write"])
    tx.preview_rollback(1).compensations[0].payload["n"] = 99  # type: ignore[index]
    tx.rollback(1)
    assert shop.ran[0] == ("restore", {"n": 1, "part": "second"})


@settings(max_examples=60)
@given(
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6),
    data=st.data(),
)
def test_preview_agrees_with_the_rollback(kinds, data):
    """A rollback right after its preview voids, compensates and drops exactly what it said."""
    shop = Shop()
    tx = agenttx.Transaction(tools=shop.tools)
    shop.run(tx, kinds)
    target = data.draw(st.integers(0, len(kinds)), label="to_step")
    preview = tx.preview_rollback(target)
    before = {step.step_id for step in tx.steps}
    effects = tx.view().pending_effects
    result = tx.rollback(target)
    assert shop.ran == _ran(preview)
    assert result.compensations_run == len(preview.compensations)
    assert tuple(sorted(before - {step.step_id for step in tx.steps})) == preview.voided_steps
    if target:
        assert effects - tx.view().pending_effects == len(preview.dropped_effects)
    else:
        assert len(preview.dropped_effects) == effects


def _dump(path) -> list[str]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as reader:
        return list(reader.iterdump())


def test_preview_changes_nothing(tmp_path):
    """Store rows, the journal, the undo records, the audit trail and the view stay as they were."""
    shop = Shop()
    store = SQLiteStore(tmp_path / "agent.db")
    engine = Engine(tools=shop.tools, store=store, config=EngineConfig(idle_timeout=None))
    tx = engine.begin()
    shop.run(tx, ["charge", "write", "mail", "look"])
    rows, audit, view = _dump(tmp_path / "agent.db"), tx.audit(), tx.view()
    last = tx.last_activity  # a view counts as activity, a preview does not
    first = tx.preview_rollback(1)
    assert tx.preview_rollback(1) == first  # the same answer: nothing was taken
    assert tx.last_activity == last
    assert _dump(tmp_path / "agent.db") == rows
    assert (tx.audit(), tx.view()) == (audit, view)
    assert shop.ran == []
    engine.close()


def test_preview_of_a_resumed_transaction(tmp_path):
    """`engine.get(tx_id).preview_rollback` after a crash says what it said before the crash."""
    shop = Shop()
    store = SQLiteStore(tmp_path / "agent.db")
    engine = Engine(tools=shop.tools, store=store, config=EngineConfig(idle_timeout=None))
    tx = engine.begin()
    shop.run(tx, ["charge", "write", "mail", "look"])
    before = tx.preview_rollback(2)
    store.close()  # as after a crash: the transaction stays open in the file

    again = Engine(
        tools=shop.tools, store=SQLiteStore(tmp_path / "agent.db"), config=EngineConfig()
    )
    assert again.recover("resume").resumed == (tx.id,)
    resumed = again.get(tx.id)
    assert resumed.preview_rollback(2) == before
    resumed.rollback(2)
    assert shop.ran == _ran(before)
    again.close()


@pytest.mark.parametrize("to_step", [5, -1, 1.0, True, "1"])
def test_preview_refuses_a_bad_target(to_step):
    """A target `rollback` would refuse raises `InvalidArgument`, as `rollback` does."""
    shop = Shop()
    tx = agenttx.Transaction(tools=shop.tools)
    shop.run(tx, ["charge", "look"])
    with pytest.raises(InvalidArgument, match="to_step") as previewed:
        tx.preview_rollback(to_step)
    with pytest.raises(InvalidArgument) as rolled:
        tx.rollback(to_step)
    assert str(previewed.value) == str(rolled.value)
    assert shop.ran == []


def test_preview_of_an_ended_transaction_is_refused():
    """After the end there is nothing to roll back: `InvalidTransactionState`."""
    shop = Shop()
    tx = agenttx.Transaction(tools=shop.tools)
    shop.run(tx, ["charge"])
    tx.commit()
    with pytest.raises(InvalidTransactionState):
        tx.preview_rollback(1)


@pytest.mark.timeout(60)
def test_preview_during_a_step_answers_as_of_the_last_step():
    """Asked from another thread while a tool runs, the preview does not wait for it."""
    shop = Shop()
    started, release = threading.Event(), threading.Event()

    @agenttx.tool(name="slow")
    def slow(ctx: agenttx.ToolContext, n: int) -> dict:
        ctx.register_undo("restore", {"n": n, "slow": True})
        started.set()
        release.wait(30)
        return {}

    tx = agenttx.Transaction(tools=[*shop.tools, slow])
    shop.run(tx, ["charge"])
    runner = threading.Thread(target=tx.execute_step, args=(2, "slow", {"n": 2}))
    runner.start()
    try:
        assert started.wait(30)
        assert tx.status is agenttx.TxStatus.EXECUTING
        preview = tx.preview_rollback(1)
    finally:
        release.set()
        runner.join(30)
    assert preview.voided_steps == (1,)
    assert [c.kind for c in preview.compensations] == ["refund"]
    assert [c.kind for c in tx.preview_rollback(1).compensations] == ["restore", "refund"]
