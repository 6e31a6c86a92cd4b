"""What a transaction reports: call ids on steps and results, and the payload for the model."""

from __future__ import annotations

import asyncio

import pytest

import agenttx
from agenttx import StepStatus


def kv_tools() -> list:
    """Two tools: `put` writes a key with an undo, `boom` fails naming a key."""

    @agenttx.compensation(name="undo")
    def undo(payload) -> None:
        del payload

    @agenttx.tool(name="put")
    def put(ctx: agenttx.ToolContext, key: str, value: int = 0) -> dict:
        ctx.register_undo("undo", {"key": key})
        ctx.state.put(key, value)
        return {"key": key, "value": value}

    @agenttx.tool(name="boom")
    def boom(key: str) -> dict:
        raise agenttx.ToolError(f"bad value for {key}", key="key")

    return [undo, put, boom]


# ---------------------------------------------------------------- call ids


def test_a_call_id_is_on_the_result_the_live_step_and_the_history():
    """The call id a step was sent with comes back on its result, its StepRecord and its
    attempt in the history, for a failed step too."""
    tx = agenttx.Transaction(kv_tools())
    result = tx.execute_step(1, "put", {"key": "a"}, call_id="call_1")
    assert (result.ok, result.call_id) == (True, "call_1")
    assert [(s.step_id, s.call_id) for s in tx.steps] == [(1, "call_1")]
    failed = tx.execute_step(2, "boom", {"key": "b"}, call_id="call_2")
    assert (failed.ok, failed.call_id) == (False, "call_2")
    assert [(a.step_id, a.call_id) for a in tx.history][:2] == [(1, "call_1"), (2, "call_2")]
    assert tx.execute_step(tx.next_step_id, "put", {"key": "c"}).call_id is None


def test_a_call_id_of_a_live_step_fails_the_step_as_a_mistake():
    """Sending a call id a live step already has fails the step (nothing runs), and the hint
    names the call id, the step that has it and what to do."""
    ran: list[str] = []

    @agenttx.tool(name="note")
    def note(text: str) -> dict:
        ran.append(text)
        return {"text": text}

    tx = agenttx.Transaction([note])
    tx.execute_step(1, "note", {"text": "one"}, call_id="c-1")
    result = tx.execute_step(2, "note", {"text": "two"}, call_id="c-1")
    assert result.status is not StepStatus.SUCCESS
    assert ran == ["one"]
    assert result.call_id == "c-1"
    assert result.error is not None
    assert "duplicate call id: 'c-1' is the call id of step 1" in result.error
    assert "new call id" in result.hint.text or "call id of its own" in result.hint.text


def test_a_call_id_freed_by_a_rewind_can_be_sent_again():
    """Once a rewind has undone the step that had a call id, a new step may use it."""
    tx = agenttx.Transaction(kv_tools())
    tx.execute_step(1, "put", {"key": "a"}, call_id="c-1")
    tx.execute_step(2, "put", {"key": "b"}, call_id="c-2")
    tx.rollback(to_step=2)
    again = tx.execute_step(2, "put", {"key": "b"}, call_id="c-2")
    assert (again.ok, again.call_id) == (True, "c-2")
    assert [s.call_id for s in tx.steps] == ["c-1", "c-2"]


@pytest.mark.parametrize(
    ("call_id", "message"),
    [
        (7, "call_id must be a string or None, got int"),
        ("", "call_id must be 1-256 characters, got 0"),
        ("x" * 257, "call_id must be 1-256 characters, got 257"),
        ("\ud800", "lone surrogate"),
    ],
)
def test_a_bad_call_id_raises_and_changes_nothing(call_id, message):
    """A call id that is not text of 1-256 characters, or not valid Unicode, is misuse:
    InvalidArgument, and the transaction is unchanged."""
    tx = agenttx.Transaction(kv_tools())
    with pytest.raises(agenttx.InvalidArgument, match=message):
        tx.execute_step(1, "put", {"key": "a"}, call_id=call_id)
    with pytest.raises(agenttx.InvalidArgument, match=message):
        asyncio.run(tx.aexecute_step(1, "put", {"key": "a"}, call_id=call_id))
    assert (tx.next_step_id, tx.history, tx.status) == (1, (), agenttx.TxStatus.ACTIVE)
    assert tx.execute_step(1, "put", {"key": "a"}, call_id="x" * 256).ok


def test_aexecute_step_takes_the_call_id_and_raw_context_by_keyword():
    """aexecute_step records the call id like execute_step; both options are keyword-only."""
    tx = agenttx.Transaction(kv_tools())
    result = asyncio.run(tx.aexecute_step(1, "put", {"key": "a"}, call_id="c-1", raw_context="r"))
    assert (result.ok, result.call_id, tx.context[0].raw_context) == (True, "c-1", "r")
    with pytest.raises(TypeError):
        asyncio.run(tx.aexecute_step(2, "put", {"key": "b"}, "positional context"))  # type: ignore[misc]
    duplicate = asyncio.run(tx.aexecute_step(2, "put", {"key": "b"}, call_id="c-1"))
    assert not duplicate.ok
    assert "duplicate call id" in (duplicate.error or "")
