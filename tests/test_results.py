"""What a transaction reports: call ids on steps and results, and the payload for the model."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agenttx
from agenttx import RollbackStrategy, RootCause, StepStatus

RESEND = RollbackStrategy.RESEND


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


def test_a_call_id_sent_twice_in_one_turn_fails_the_second_call_as_a_mistake():
    """A call id a live step of the same turn already has fails the step (nothing runs), and
    the hint names the call id, the step that has it and what to do."""
    ran: list[str] = []

    @agenttx.tool(name="note")
    def note(text: str) -> dict:
        ran.append(text)
        return {"text": text}

    tx = agenttx.Transaction([note])
    _, result = tx.call_turn([("note", {"text": "one"}, "c-1"), ("note", {"text": "two"}, "c-1")])
    assert result.status is not StepStatus.SUCCESS
    assert ran == ["one"]
    assert result.call_id == "c-1"
    assert result.error is not None
    assert "duplicate call id: 'c-1' is the call id of step 1" in result.error
    assert result.hint == agenttx.CleanHint(
        text=(
            "Hint: Call id 'c-1' was already used by step 1, which still stands. "
            "Send the call again with a call id of its own."
        ),
        category=agenttx.HintCategory.INVALID_VALUE,
        rule="duplicate_call_id",
    )
    assert result.for_model()["error"] == result.hint.text


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
    reused = asyncio.run(tx.aexecute_step(2, "put", {"key": "b"}, call_id="c-1"))
    assert (reused.ok, reused.call_id) == (True, "c-1")  # a turn of its own: reuse is fine
    _, duplicate = asyncio.run(tx.acall_turn([("put", {"key": "c"}, "c-2")] * 2))
    assert not duplicate.ok
    assert "duplicate call id: 'c-2' is the call id of step 3" in (duplicate.error or "")


# ---------------------------------------------------------------- mistakes


def shop_tools(log: list[str]) -> list:
    """A charge (refunded by its undo), a lookup that fails on a bad customer, a flaky call."""
    flaky = {"left": 1}

    @agenttx.compensation(name="refund")
    def refund(payload) -> None:
        log.append(f"refund {payload['order']}")

    @agenttx.tool(name="charge")
    def charge(ctx: agenttx.ToolContext, order: str) -> dict:
        ctx.register_undo("refund", {"order": order})
        log.append(f"charge {order}")
        return {"order": order, "customer": "c-404"}

    @agenttx.tool(name="ship")
    def ship(customer: str) -> dict:
        if customer != "c-1":
            raise agenttx.ToolError(f"no such customer {customer}", key="customer")
        return {"shipped": customer}

    @agenttx.tool(name="quote")
    def quote(order: str) -> dict:
        if flaky["left"]:
            flaky["left"] -= 1
            raise agenttx.ToolError("quote service unavailable", transient=True)
        return {"price": 5}

    return [refund, charge, ship, quote]


@pytest.mark.parametrize(
    ("tool", "arguments", "error"),
    [
        ("chrage", {"order": "o2"}, "unknown tool 'chrage'"),
        ("charge", '{"order": ', "invalid arguments JSON"),
    ],
)
def test_a_mistake_resends_the_step_and_keeps_the_work(tool, arguments, error):
    """By default an unknown tool or malformed JSON at step 2 is a RESEND of step 2: step 1
    stays live, nothing is compensated, the step number is reused, the attempt is in history."""
    log: list[str] = []
    tx = agenttx.Transaction(shop_tools(log))
    tx.execute_step(1, "charge", {"order": "o1"}, call_id="c1")
    result = tx.execute_step(2, tool, arguments, call_id="c2")
    assert (result.status, result.strategy) == (StepStatus.ROLLBACK_TRIGGERED, RESEND)
    assert (result.rollback_to_step, result.next_step_id, result.context_reset) == (2, 2, False)
    assert (result.voided_steps, result.voided_call_ids, result.root_cause) == ((), (), None)
    assert result.error is not None
    assert error in result.error
    assert log == ["charge o1"]
    assert [(s.step_id, s.call_id) for s in tx.steps] == [(1, "c1")]
    assert [(a.step_id, a.status.value, a.call_id) for a in tx.history] == [
        (1, "live", "c1"),
        (2, "failed", "c2"),
    ]
    assert tx.execute_step(2, "charge", {"order": "o2"}, call_id="c2").ok
    assert log == ["charge o1", "charge o2"]


@pytest.mark.parametrize(
    ("tool", "arguments"), [("chrage", {"order": "o2"}), ("charge", '{"order": ')]
)
def test_mistake_retries_zero_is_the_reference_local_backtrack(tool, arguments):
    """With RollbackPolicy(mistake_retries=0) a mistake at step 2 backtracks to step 1 and
    refunds its charge, as the reference does."""
    log: list[str] = []
    policy = agenttx.RollbackPolicy(mistake_retries=0)
    tx = agenttx.Transaction(shop_tools(log), policy=policy)
    tx.execute_step(1, "charge", {"order": "o1"}, call_id="c1")
    result = tx.execute_step(2, tool, arguments)
    assert (result.strategy, result.next_step_id) == (RollbackStrategy.LOCAL_BACKTRACK, 1)
    assert (result.voided_steps, result.voided_call_ids) == ((1,), ("c1",))
    assert log == ["charge o1", "refund o1"]
    assert tx.steps == ()


def test_the_fourth_consecutive_mistake_is_decided_as_any_failure():
    """Three mistakes in a row at one step are resent; the fourth backtracks (and refunds)."""
    log: list[str] = []
    tx = agenttx.Transaction(shop_tools(log))
    tx.execute_step(1, "charge", {"order": "o1"})
    strategies = [tx.execute_step(2, "nope", {}).strategy for _ in range(4)]
    assert strategies == [RESEND, RESEND, RESEND, RollbackStrategy.LOCAL_BACKTRACK]
    assert log == ["charge o1", "refund o1"]
    assert tx.next_step_id == 1


def test_a_duplicate_call_id_is_resent():
    """A call id sent again within one turn is a mistake: RESEND, the live step untouched."""
    log: list[str] = []
    tx = agenttx.Transaction(shop_tools(log))
    _, result = tx.call_turn([("charge", {"order": "o1"}, "c1"), ("charge", {"order": "o2"}, "c1")])
    assert (result.strategy, result.next_step_id, result.call_id) == (RESEND, 2, "c1")
    assert log == ["charge o1"]
    assert tx.execute_step(2, "charge", {"order": "o2"}, call_id="c2").ok


def test_a_resend_is_asynchronous_too():
    """aexecute_step resends a mistake the same way."""
    log: list[str] = []
    tx = agenttx.Transaction(shop_tools(log))

    async def main() -> agenttx.StepResult:
        await tx.aexecute_step(1, "charge", {"order": "o1"})
        return await tx.aexecute_step(2, "nope", {})

    result = asyncio.run(main())
    assert (result.strategy, result.next_step_id, log) == (RESEND, 2, ["charge o1"])


# ---------------------------------------------------------------- voided steps and root causes


def test_a_dependency_jump_reports_the_voided_steps_and_the_root_cause():
    """A failure traced to step 1 voids steps 1-2 with their call ids and names the root."""
    log: list[str] = []
    tx = agenttx.Transaction(shop_tools(log))
    tx.execute_step(1, "charge", {"order": "o1"}, call_id="c1")
    tx.execute_step(2, "quote", {"order": "o1"})  # fails transiently, then is retried
    tx.execute_step(2, "quote", {"order": "o1"}, call_id="c2")
    result = tx.execute_step(3, "ship", {"customer": "${steps.1.customer}"}, call_id="c3")
    assert result.strategy is RollbackStrategy.DEPENDENCY_JUMP
    assert (result.voided_steps, result.voided_call_ids) == ((1, 2), ("c1", "c2"))
    assert result.root_cause == RootCause(1, "customer")
    assert result.call_id == "c3"
    assert log == ["charge o1", "refund o1"]


def test_a_local_backtrack_reports_the_voided_steps_without_a_root_cause():
    """An untraceable failure backtracks one step: that step is voided, no root cause."""
    log: list[str] = []
    # A customer written in the call is a mistake of the call by default (a resend).
    policy = agenttx.RollbackPolicy(mistake_retries=0)
    tx = agenttx.Transaction(shop_tools(log), policy=policy)
    tx.execute_step(1, "charge", {"order": "o1"}, call_id="c1")
    tx.execute_step(2, "charge", {"order": "o2"})
    result = tx.execute_step(3, "ship", {"customer": "c-9"})
    assert result.strategy is RollbackStrategy.LOCAL_BACKTRACK
    assert (result.voided_steps, result.voided_call_ids, result.root_cause) == ((2,), (), None)


def test_a_global_reset_and_an_abort_void_every_live_step():
    """A global reset and an abort void every live step, with every call id."""
    policy = agenttx.RollbackPolicy(max_local_depth=0, max_global_resets=1, mistake_retries=0)
    tx = agenttx.Transaction(shop_tools([]), policy=policy)
    tx.execute_step(1, "charge", {"order": "o1"}, call_id="c1")
    tx.execute_step(2, "charge", {"order": "o2"}, call_id="c2")
    reset = tx.execute_step(3, "nope", {})
    assert reset.strategy is RollbackStrategy.GLOBAL_RESET
    assert (reset.voided_steps, reset.voided_call_ids) == ((1, 2), ("c1", "c2"))
    tx.execute_step(1, "charge", {"order": "o1"}, call_id="c1")
    aborted = tx.execute_step(2, "nope", {})
    assert aborted.strategy is RollbackStrategy.ABORT
    assert (aborted.voided_steps, aborted.voided_call_ids) == ((1,), ("c1",))
    assert aborted.next_step_id == 0


def test_a_retry_voids_nothing():
    """A transient failure retries the step itself: nothing is voided."""
    tx = agenttx.Transaction(shop_tools([]))
    tx.execute_step(1, "charge", {"order": "o1"})
    result = tx.execute_step(2, "quote", {"order": "o1"})
    assert (result.strategy, result.voided_steps, result.root_cause) == (
        RollbackStrategy.RETRY,
        (),
        None,
    )


def test_root_cause_is_a_validated_record():
    """RootCause(step, key) compares by value and refuses a step below 1 or a non-text key."""
    assert RootCause(2, "id") == RootCause(step=2, key="id")
    assert RootCause(2).key is None
    for step, key in [(0, "id"), (True, "id"), ("2", "id"), (2, 3)]:
        with pytest.raises(agenttx.InvalidArgument, match="RootCause"):
            RootCause(step, key)  # type: ignore[arg-type]


# ---------------------------------------------------------------- transient constraints


def test_a_transient_constraint_is_dropped_once_the_retry_succeeds():
    """The hint of a transient failure is a constraint until the retry of that step succeeds;
    a lasting hint stays."""
    tx = agenttx.Transaction(shop_tools([]))
    tx.execute_step(1, "charge", {"order": "o1"})
    failed = tx.execute_step(2, "quote", {"order": "o1"})
    assert failed.strategy is RollbackStrategy.RETRY
    assert len(failed.constraints) == 1
    assert "quote service unavailable" in failed.constraints[0]
    retried = tx.execute_step(2, "quote", {"order": "o1"})
    assert (retried.ok, retried.constraints, tx.constraints) == (True, (), ())
    lasting = tx.execute_step(3, "ship", {"customer": "c-9"})
    assert len(lasting.constraints) == 1
    assert tx.execute_step(lasting.next_step_id, "charge", {"order": "o2"}).constraints == (
        lasting.constraints
    )


def test_a_transient_hint_already_kept_as_lasting_stays():
    """A transient failure whose hint text is already a lasting constraint leaves it lasting:
    the retry succeeding does not drop it."""
    outcomes = [False, True]  # lasting, then transient, then success

    @agenttx.tool(name="flaky")
    def flaky() -> dict:
        if outcomes:
            raise agenttx.ToolError("service unavailable", transient=outcomes.pop(0))
        return {}

    tx = agenttx.Transaction([flaky])
    lasting = tx.execute_step(1, "flaky", {})
    assert lasting.strategy is RollbackStrategy.LOCAL_BACKTRACK
    retry = tx.execute_step(1, "flaky", {})
    assert retry.strategy is RollbackStrategy.RETRY
    assert retry.constraints == lasting.constraints
    assert tx.execute_step(1, "flaky", {}).constraints == lasting.constraints


# ---------------------------------------------------------------- the payload for the model


def payload_of(result: agenttx.StepResult) -> dict:
    """The payload, checked to be deterministic, JSON, and in the documented key order."""
    payload = result.for_model()
    assert payload == result.for_model()
    assert json.loads(json.dumps(payload)) == payload
    order = ["ok", "step", "output", "error", "next_step", "voided_steps", "compensated"]
    order += ["constraints", "root_cause", "bad_value", "abort_reason", "instruction"]
    assert list(payload) == [key for key in order if key in payload]
    return payload


def test_the_payload_of_a_success():
    """ok, step, output, next step and an instruction that teaches references."""
    tx = agenttx.Transaction(shop_tools([]))
    assert payload_of(tx.execute_step(1, "charge", {"order": "o1"})) == {
        "ok": True,
        "step": 1,
        "output": {"order": "o1", "customer": "c-404"},
        "next_step": 2,
        "instruction": (
            "Continue with step 2; pass on a value of this output as ${steps.1.<field>}, "
            "never copied."
        ),
    }


def test_the_payload_of_a_retry():
    """A transient failure: the hint, the same step next, its constraint."""
    tx = agenttx.Transaction(shop_tools([]))
    payload = payload_of(tx.execute_step(1, "quote", {"order": "o1"}))
    hint = payload["error"]
    assert "quote service unavailable" in hint
    assert payload == {
        "ok": False,
        "step": 1,
        "error": hint,
        "next_step": 1,
        "constraints": [hint],
        "instruction": ("The failure was temporary: send step 1 again with the same arguments."),
    }


def test_the_payload_of_a_resend_after_a_mistake():
    """A mistake: the hint naming the tools, the same step next, no voided steps."""
    tx = agenttx.Transaction(shop_tools([]))
    tx.execute_step(1, "charge", {"order": "o1"})
    hint = "Hint: Tool 'chrage' does not exist. Use one of: charge, quote, ship."
    assert payload_of(tx.execute_step(2, "chrage", {})) == {
        "ok": False,
        "step": 2,
        "error": hint,
        "next_step": 2,
        "constraints": [hint],
        "instruction": "Fix the call as the error says and send step 2 again.",
    }


def test_the_payload_of_a_rewind_to_a_root_cause():
    """A dependency jump: the voided steps, the root cause and what to send again."""
    tx = agenttx.Transaction(shop_tools([]), policy=agenttx.RollbackPolicy(transient_retries=0))
    tx.execute_step(1, "charge", {"order": "o1"})
    tx.execute_step(2, "charge", {"order": "o2"})
    payload = payload_of(tx.execute_step(3, "ship", {"customer": "${steps.1.customer}"}))
    hint = payload["error"]
    assert "c-404" in hint
    assert payload == {
        "ok": False,
        "step": 3,
        "error": hint,
        "next_step": 1,
        "voided_steps": [1, 2],
        "compensated": [
            {"step": 2, "compensation": "refund"},
            {"step": 1, "compensation": "refund"},
        ],
        "constraints": [hint],
        "root_cause": {"step": 1, "key": "customer"},
        "bad_value": {"key": "customer", "value": "c-404", "step": 1},
        "instruction": (
            "Step 1 produced the bad value of 'customer': steps 1-2 were undone and their "
            "outputs no longer exist; send step 1 again with a corrected value, then redo "
            "the rest."
        ),
    }


def test_the_payload_of_a_local_backtrack_and_a_global_reset():
    """A local backtrack names the step undone; a global reset says to start again."""
    policy = agenttx.RollbackPolicy(max_local_depth=1, mistake_retries=0, repeat_limit=0)
    tx = agenttx.Transaction(shop_tools([]), policy=policy)
    tx.execute_step(1, "charge", {"order": "o1"})
    tx.execute_step(2, "charge", {"order": "o2"})
    local = payload_of(tx.execute_step(3, "ship", {"customer": "c-9"}))
    assert (local["voided_steps"], local["next_step"]) == ([2], 2)
    assert local["instruction"] == (
        "Step 2 was undone and its output no longer exists: send step 2 again, correcting the "
        "cause of the error."
    )
    tx.execute_step(2, "charge", {"order": "o2"})
    reset = payload_of(tx.execute_step(3, "ship", {"customer": "c-9"}))
    assert (reset["voided_steps"], reset["next_step"]) == ([1, 2], 1)
    assert reset["instruction"] == (
        "Every step was undone: start again from step 1, keeping to the constraints."
    )


def test_the_payload_of_an_abort():
    """An abort: every live step voided, next step 0, send nothing more."""
    policy = agenttx.RollbackPolicy(max_local_depth=0, max_global_resets=0, mistake_retries=0)
    tx = agenttx.Transaction(shop_tools([]), policy=policy)
    tx.execute_step(1, "charge", {"order": "o1"})
    payload = payload_of(tx.execute_step(2, "ship", {"customer": "c-9"}))
    assert payload == {
        "ok": False,
        "step": 2,
        "error": payload["error"],
        "next_step": 0,
        "voided_steps": [1],
        "compensated": [{"step": 1, "compensation": "refund"}],
        "constraints": [payload["error"]],
        "bad_value": {"key": "customer", "value": "c-9", "step": 2},
        "abort_reason": "local backtrack depth exhausted; global reset budget (0) exhausted",
        "instruction": "The transaction was aborted and every step undone: send no more steps.",
    }


def test_the_payload_without_a_hint_falls_back_to_the_error():
    """A failed result with no hint (built by hand) sends its error text, or an empty one."""
    result = agenttx.StepResult(
        status=StepStatus.ROLLBACK_TRIGGERED, step_id=3, next_step_id=3, error="boom"
    )
    assert result.for_model()["error"] == "boom"
    bare = agenttx.StepResult(status=StepStatus.ROLLBACK_TRIGGERED, step_id=3, next_step_id=3)
    assert bare.for_model()["error"] == ""
    assert bare.for_model()["instruction"] == (
        "Send step 3 next, correcting the cause of the error."
    )


def test_a_mistake_never_leaves_a_transient_constraint():
    """A mistake whose hint reads as transient is still a lasting constraint (it is no
    failure of the service, and its resend succeeding does not make it untrue)."""
    from agenttx._tools import Failure  # noqa: PLC0415

    tx = agenttx.Transaction(shop_tools([]))
    tx.execute_step(1, "charge", {"order": "o1"})
    steps = tx._pipeline
    with tx._calls:  # drive the failure path with a hand-made mistake
        parsed = steps._open(2, "quote", {"order": "o1"}, "", None)
        steps._prepare(2, "quote", parsed, "", None)
        result = steps._fail(2, Failure("upstream timed out", mistake=True))
    assert result.strategy is RESEND
    assert tx.execute_step(2, "charge", {"order": "o2"}).constraints == result.constraints
    assert result.constraints != ()


def test_an_async_rewind_reports_voided_steps_and_drops_transient_constraints():
    """aexecute_step fills voided_steps, voided_call_ids and root_cause, and drops a transient
    constraint on the retry's success, as execute_step does."""
    log: list[str] = []
    tx = agenttx.Transaction(shop_tools(log))

    async def main() -> tuple[agenttx.StepResult, agenttx.StepResult]:
        await tx.aexecute_step(1, "charge", {"order": "o1"}, call_id="c1")
        await tx.aexecute_step(2, "quote", {"order": "o1"}, call_id="q1")  # transient
        retried = await tx.aexecute_step(2, "quote", {"order": "o1"}, call_id="q2")
        failed = await tx.aexecute_step(3, "ship", {"customer": "${steps.1.customer}"})
        return retried, failed

    retried, failed = asyncio.run(main())
    assert (retried.ok, retried.constraints) == (True, ())
    assert (failed.voided_steps, failed.voided_call_ids) == ((1, 2), ("c1", "q2"))
    assert failed.root_cause == RootCause(1, "customer")
    assert log == ["charge o1", "refund o1"]


STRATEGIES = st.sampled_from(list(RollbackStrategy))
TEXT = st.text(max_size=20)


@given(
    ok=st.booleans(),
    strategy=STRATEGIES,
    step=st.integers(1, 50),
    following=st.integers(0, 51),
    voided=st.integers(0, 5),
    constraints=st.lists(TEXT, max_size=3),
    key=st.none() | TEXT,
    output=st.none() | st.integers() | st.dictionaries(TEXT, st.integers(), max_size=3),
)
def test_every_payload_is_json_in_the_documented_order(  # noqa: PLR0917  (hypothesis)
    ok, strategy, step, following, voided, constraints, key, output
):
    """Whatever the result, the payload is JSON with the documented keys in order, a
    one-sentence instruction, and no empty optional key."""
    result = agenttx.StepResult(
        status=StepStatus.SUCCESS if ok else StepStatus.ROLLBACK_TRIGGERED,
        step_id=step,
        next_step_id=following,
        output=output if ok else None,
        error=None if ok else "boom",
        strategy=RollbackStrategy.NONE if ok else strategy,
        constraints=tuple(constraints),
        voided_steps=tuple(range(1, voided + 1)),
        root_cause=RootCause(1, key) if strategy is RollbackStrategy.DEPENDENCY_JUMP else None,
    )
    payload = payload_of(result)
    assert payload["ok"] is ok
    assert ("output" in payload, "error" in payload) == (ok, not ok)
    assert all(payload[k] for k in ("voided_steps", "constraints") if k in payload)
    instruction = payload["instruction"]
    assert isinstance(instruction, str)
    assert instruction.endswith(".")
    assert instruction[0].isupper()


def test_a_root_cause_without_a_key_reads_as_a_bad_value():
    """A jump result built with a keyless root cause still gives a sentence without 'None'."""
    result = agenttx.StepResult(
        status=StepStatus.ROLLBACK_TRIGGERED,
        step_id=3,
        next_step_id=1,
        strategy=RollbackStrategy.DEPENDENCY_JUMP,
        voided_steps=(1, 2),
        root_cause=RootCause(1),
    )
    payload = result.for_model()
    assert payload["root_cause"] == {"step": 1, "key": None}
    assert payload["instruction"] == (
        "Step 1 produced a bad value: steps 1-2 were undone and their outputs no longer exist; "
        "send step 1 again with a corrected value, then redo the rest."
    )


def test_a_bad_value_integer_is_bounded_like_a_string():
    """BadValue refuses an integer of more than 200 digits, as it refuses a longer string."""
    assert agenttx.BadValue(key="n", value=-(10**199) + 1, step=1).value == -(10**199) + 1
    for value in (10**200, -(10**199)):
        with pytest.raises(agenttx.InvalidArgument, match="at most 200 digits"):
            agenttx.BadValue(key="n", value=value, step=1)


# ---------------------------------------------------------------- the success path's builder


@given(
    step=st.integers(1, 10**6),
    output=st.none() | st.text() | st.integers() | st.tuples(st.integers()),
    constraints=st.lists(st.text(), max_size=3).map(tuple),
    call_id=st.none() | st.text(min_size=1),
)
def test_a_success_result_built_fast_equals_the_class_built_one(step, output, constraints, call_id):
    """`succeeded_step` gives the `StepResult` the class builds: every field, the hash, a
    frozen object that `attrs.evolve`, pickle and copy treat as any other."""
    import copy  # noqa: PLC0415
    import pickle  # noqa: PLC0415

    import attrs  # noqa: PLC0415

    from agenttx._results import succeeded_step  # noqa: PLC0415

    fast = succeeded_step(step, step + 1, output, constraints, call_id)
    built = agenttx.StepResult(
        status=StepStatus.SUCCESS,
        step_id=step,
        next_step_id=step + 1,
        output=output,
        constraints=constraints,
        call_id=call_id,
    )
    assert type(fast) is agenttx.StepResult
    for field in attrs.fields(agenttx.StepResult):
        assert getattr(fast, field.name) == getattr(built, field.name), field.name
    assert fast == built
    assert hash(fast) == hash(built)
    assert repr(fast) == repr(built)
    assert pickle.loads(pickle.dumps(fast)) == copy.deepcopy(fast) == built
    assert attrs.evolve(fast, call_id="c") == attrs.evolve(built, call_id="c")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        fast.step_id = 0
