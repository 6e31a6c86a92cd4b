"""agenttx.integrations.anthropic against the real Anthropic SDK, offline (a scripted model)."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

import agenttx
from _scripted import (
    ScriptedModel,
    anthropic_tool_results,
    call,
    order_script,
    reused_ids_script,
    say,
    turn,
)
from _shop import (
    BAD_PLAN,
    EMAIL,
    TOOL_NAMES,
    Shop,
    assert_plan_ran,
    assert_refused_with_every_problem,
    order_plan,
)
from agenttx.integrations import anthropic as atx_anthropic

if TYPE_CHECKING:
    import anthropic

MODEL = "scripted-model"
PROMPT = [{"role": "user", "content": "Order 2 x SKU-1 for ada@example.com, 42 pence."}]


def messages_loop(
    client: anthropic.Anthropic, runner: atx_anthropic.ToolRunner
) -> list[dict[str, Any]]:
    """The loop a user writes (the one in examples/anthropic_messages.py)."""
    messages: list[Any] = list(PROMPT)
    while True:
        reply = client.messages.create(
            model=MODEL, max_tokens=1024, messages=messages, tools=runner.tools
        )
        if reply.stop_reason != "tool_use":
            break
        messages = runner.handle(messages, reply)
    return messages


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


def assert_alternating(messages: list[dict[str, Any]]) -> None:
    """Roles alternate, and each assistant tool_use is answered by the next user message."""
    assert all(a["role"] != b["role"] for a, b in itertools.pairwise(messages))
    for index, message in enumerate(messages):
        if message["role"] != "assistant" or not isinstance(message["content"], list):
            continue
        uses = [b["id"] for b in message["content"] if b["type"] == "tool_use"]
        if not uses:
            continue
        answer = messages[index + 1]["content"]
        results = [b["tool_use_id"] for b in answer if b["type"] == "tool_result"]
        assert results == uses
        assert [b["type"] for b in answer[: len(results)]] == ["tool_result"] * len(results)


def assert_order_committed_once(shop: Shop, tx: agenttx.Transaction) -> None:
    assert shop.refunds == ["ch-1"]
    assert shop.live_charges == ["ch-2"]
    assert shop.delivered == []
    assert tx.commit().effects_dispatched == 1
    assert [e.payload for e in shop.delivered] == [
        {"to": EMAIL, "customer_id": "c-1", "subject": "Order o-1"}
    ]


def test_tools_use_input_schema():
    """tools() gives name, description and input_schema per tool, from its spec."""
    shop = Shop()
    offered = atx_anthropic.tools(shop.transaction())
    assert [t["name"] for t in offered] == list(TOOL_NAMES)
    specs = {s.wire_name: s for s in shop.transaction().tool_specs}
    for entry in offered:
        assert set(entry) == {"name", "description", "input_schema"}
        assert entry["input_schema"] == specs[entry["name"]].parameters
    assert offered == atx_anthropic.tools(shop.tools)


def test_a_changed_tools_list_changes_nothing_else():
    """Each `runner.tools` and `tools()` is a new deep copy: changing an `input_schema` in one
    leaves the next one and the specs as they were."""
    tx = Shop().transaction()
    runner = atx_anthropic.ToolRunner(tx)
    before = atx_anthropic.tools(tx)
    for offered in (runner.tools, atx_anthropic.tools(tx)):
        for entry in offered:
            entry["input_schema"]["properties"].clear()
            entry["name"] = "changed"
    assert runner.tools == before == atx_anthropic.tools(tx)
    assert all(spec.parameters["properties"] for spec in tx.tool_specs)


def test_order_workflow_messages():
    """Bad lookup -> reserve fails on customer_id -> jump to step 1, refund -> replay -> commit."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(order_script())
    messages = messages_loop(model.anthropic(), atx_anthropic.ToolRunner(tx))
    assert model.remaining == 0
    assert model.requests[0]["tools"] == atx_anthropic.tools(tx)
    for body in model.requests:
        assert_alternating(body["messages"])
    failed = anthropic_tool_results(model.requests[2])[-1]
    assert failed["tool_use_id"] == "call_reserve_1"
    assert failed["is_error"] is True
    assert failed["content"]["root_cause"] == {"step": 1, "key": "customer_id"}
    final = anthropic_tool_results({"messages": messages})
    assert [r["is_error"] for r in final] == [True, False, False, False, False]
    assert [r["content"]["step"] for r in final[1:]] == [1, 2, 3, 4]
    assert_order_committed_once(shop, tx)


def test_order_workflow_async_client():
    """The same workflow with anthropic.AsyncAnthropic and `await runner.ahandle(...)`."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(order_script())
    runner = atx_anthropic.ToolRunner(tx)

    async def loop() -> None:
        client = model.async_anthropic()
        messages: list[Any] = list(PROMPT)
        while True:
            reply = await client.messages.create(
                model=MODEL, max_tokens=1024, messages=messages, tools=runner.tools
            )
            if reply.stop_reason != "tool_use":
                return
            messages = await runner.ahandle(messages, reply)

    asyncio.run(loop())
    assert model.remaining == 0
    assert_order_committed_once(shop, tx)


# ---------------------------------------------------------------------- what reached the model


def rewind_request(history: str, *, text: bool = False) -> list[dict[str, Any]]:
    """The messages the model receives right after the rewind, under a history policy."""
    shop = Shop()
    turns = order_script()[:3]
    if text:  # the model says something before its first call
        turns[0] = turn(*turns[0].calls, text="Looking the customer up.")  # type: ignore[union-attr]
    model = ScriptedModel(turns)
    runner = atx_anthropic.ToolRunner(shop.transaction(), history=history)  # type: ignore[arg-type]
    client = model.anthropic()
    messages: list[Any] = list(PROMPT)
    for _ in range(2):
        reply = client.messages.create(model=MODEL, max_tokens=1024, messages=messages)
        messages = runner.handle(messages, reply)
    client.messages.create(model=MODEL, max_tokens=1024, messages=messages)
    return model.last["messages"]


def test_truncate_keeps_alternation_and_notes_the_rewind():
    """history="truncate": the voided calls go, roles still alternate, the failure has a note."""
    messages = rewind_request("truncate")
    assert roles(messages) == ["user", "assistant", "user"]
    assert [b["id"] for b in messages[1]["content"]] == ["call_reserve_1"]
    (result,) = anthropic_tool_results({"messages": messages})
    assert result["content"]["voided_steps"] == [1, 2]
    assert result["content"]["note"].startswith("The rollback undid steps 1 and 2")


def test_truncate_merges_what_the_rewrite_makes_adjacent():
    """A kept text block of a voided turn is merged into the next assistant message."""
    messages = rewind_request("truncate", text=True)
    assert roles(messages) == ["user", "assistant", "user"]
    assert [b["type"] for b in messages[1]["content"]] == ["text", "tool_use"]
    assert_alternating(messages)


def test_void_replaces_the_voided_results():
    """history="void": every block stays; the voided results say "voided by rollback"."""
    messages = rewind_request("void")
    assert roles(messages) == ["user", "assistant", "user", "assistant", "user"]
    results = anthropic_tool_results({"messages": messages})
    assert [r["tool_use_id"] for r in results] == [
        "call_lookup_old",
        "call_charge_1",
        "call_reserve_1",
    ]
    assert [r["is_error"] for r in results] == [True, True, True]
    assert [r["content"].get("voided") for r in results] == [True, True, None]
    assert results[0]["content"]["error"].startswith("Voided by rollback: step 1")


def test_keep_leaves_the_results():
    """history="keep": the voided results stay as sent (ok), the failure lists the voided steps."""
    results = anthropic_tool_results({"messages": rewind_request("keep")})
    assert [r["is_error"] for r in results] == [False, False, True]
    assert results[2]["content"]["voided_steps"] == [1, 2]


# ---------------------------------------------------------------------- bad input


def one_turn(tx: agenttx.Transaction, *calls: Any) -> list[dict[str, Any]]:
    model = ScriptedModel([turn(*calls)])
    reply = model.anthropic().messages.create(model=MODEL, max_tokens=10, messages=PROMPT)
    messages = atx_anthropic.ToolRunner(tx).handle(PROMPT, reply)
    assert_alternating(messages)
    return anthropic_tool_results({"messages": messages})


def test_every_tool_use_gets_a_result_even_when_not_run():
    """An unknown tool fails its call; the calls after it are answered as not run."""
    shop = Shop()
    tx = shop.transaction()
    results = one_turn(
        tx,
        call("refund_everything", {}, "a"),
        call("lookup_customer", {"email": EMAIL}, "b"),
        call("lookup_customer", {"email": EMAIL}, "c"),
    )
    assert [r["tool_use_id"] for r in results] == ["a", "b", "c"]
    assert all(r["is_error"] for r in results)
    assert "refund_everything" in results[0]["content"]["error"]
    assert [r["content"]["step"] for r in results[1:]] == [None, None]
    assert all("Not run" in r["content"]["error"] for r in results[1:])
    assert shop.calls == []


def test_bad_input_from_the_model_is_a_result():
    """A non-object input, a duplicate id and a call after commit each come back as results."""
    shop = Shop()
    tx = shop.transaction()
    (odd,) = one_turn(tx, call("lookup_customer", "[1, 2]", "x"))
    assert odd["is_error"] is True
    assert odd["content"]["next_step"] == 1
    first, dup = one_turn(
        tx, call("lookup_customer", {"email": EMAIL}, "d"), call("lookup_customer", {}, "d")
    )
    assert (first["is_error"], dup["is_error"]) == (False, True)
    assert dup["content"]["next_step"] == 2
    tx.commit()
    (late,) = one_turn(tx, call("charge", {"customer_id": "c-1", "amount": 1}, "z"))
    assert late["is_error"] is True
    assert "ended (committed)" in late["content"]["error"]
    assert shop.charges == []


def _nested(depth: int) -> dict[str, Any]:
    deep: dict[str, Any] = {}
    for _ in range(depth):
        deep = {"a": deep}
    return deep


def test_an_input_nested_too_deep_is_a_failed_step_as_in_json_text():
    """A tool_use input nested 10,000 deep, in a dict or an SDK Message, sync or async, is a
    failed step with the hint the transaction gives the same arguments as JSON text (as the
    OpenAI runner's); nothing runs and the next call goes on."""
    import anthropic  # noqa: PLC0415

    deep = {"email": _nested(10_000)}
    block = {"type": "tool_use", "id": "t1", "name": "lookup_customer", "input": deep}
    as_dict = {"role": "assistant", "content": [block]}
    as_sdk = anthropic.types.Message.model_validate(
        {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
            "content": [block],
        }
    )
    text = '{"email": ' + '{"a": ' * 10_000 + "{}" + "}" * 10_001
    expected = Shop().transaction().call("lookup_customer", text).for_model()
    assert "Malformed JSON" in str(expected["error"])
    for message in (as_dict, as_sdk):
        for asynchronous in (False, True):
            shop = Shop()
            tx = shop.transaction()
            runner = atx_anthropic.ToolRunner(tx)
            handled = (
                asyncio.run(runner.ahandle(PROMPT, message))
                if asynchronous
                else runner.handle(PROMPT, message)
            )
            assert_alternating(handled)
            (result,) = handled[-1]["content"]
            assert result["is_error"] is True
            assert json.loads(result["content"]) == expected
            assert shop.calls == []
            assert tx.call("lookup_customer", {"email": EMAIL}).ok


def test_wrong_objects_are_refused():
    """A content block, a non-tool, a client or a user message is refused with InvalidArgument."""
    tx = Shop().transaction()
    runner = atx_anthropic.ToolRunner(tx)
    model = ScriptedModel([turn(call("lookup_customer", {"email": EMAIL}))])
    client = model.anthropic()
    reply = client.messages.create(model=MODEL, max_tokens=10, messages=PROMPT)
    with pytest.raises(agenttx.InvalidArgument, match="not one of its content blocks"):
        runner.handle(PROMPT, reply.content[0])
    with pytest.raises(agenttx.InvalidArgument, match=r"anthropic\.Anthropic"):
        runner.handle(PROMPT, client)
    with pytest.raises(agenttx.InvalidArgument, match="role 'user'"):
        runner.handle(PROMPT, PROMPT[0])
    with pytest.raises(agenttx.InvalidArgument, match="item 0 of the tools list is str"):
        atx_anthropic.tools(["lookup_customer"])
    with pytest.raises(agenttx.InvalidArgument, match="needs an agenttx"):
        atx_anthropic.ToolRunner(client)  # type: ignore[arg-type]
    assert tx.next_step_id == 1


def test_sdk_message_objects_in_the_history_are_accepted():
    """A history holding the SDK's Message (as users append it) is sent as role and content."""
    tx = Shop().transaction()
    model = ScriptedModel([turn(call("lookup_customer", {"email": EMAIL}, "u1"))])
    reply = model.anthropic().messages.create(model=MODEL, max_tokens=10, messages=PROMPT)
    messages = atx_anthropic.ToolRunner(tx).handle([*PROMPT, reply], reply)
    assert roles(messages) == ["user", "assistant", "user"]
    assert set(messages[1]) == {"role", "content"}
    assert json.loads(messages[2]["content"][0]["content"])["ok"] is True


def test_missing_sdk_names_the_extra_to_install():
    """Without the anthropic package, importing the integration says which extra to install."""
    code = (
        "import sys; sys.modules['anthropic'] = None\n"
        "try:\n    import agenttx.integrations.anthropic\n"
        "except ImportError as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert "pip install 'agenttx[anthropic]'" in done.stdout


def test_final_text_turn_runs_nothing():
    """A reply without tool_use is appended and runs nothing."""
    tx = Shop().transaction()
    model = ScriptedModel([say("All done.")])
    reply = model.anthropic().messages.create(model=MODEL, max_tokens=10, messages=PROMPT)
    messages = atx_anthropic.ToolRunner(tx).handle(PROMPT, reply)
    assert messages[-1] == {"role": "assistant", "content": [{"type": "text", "text": "All done."}]}
    assert tx.next_step_id == 1


def test_the_callers_messages_are_never_changed():
    """handle() builds new messages: the history passed in stays as it was after a truncation."""
    shop = Shop()
    model = ScriptedModel(order_script()[:2])
    runner = atx_anthropic.ToolRunner(shop.transaction())
    client = model.anthropic()
    first = client.messages.create(model=MODEL, max_tokens=10, messages=PROMPT)
    before = runner.handle(PROMPT, first)
    frozen = copy.deepcopy(before)
    second = client.messages.create(model=MODEL, max_tokens=10, messages=before)
    after = runner.handle(before, second)
    assert before == frozen
    assert roles(after) == ["user", "assistant", "user"]


# ---------------------------------------------------------------------- plans a model proposes


def test_a_models_plan_is_refused_with_every_problem_then_corrected_and_run():
    """Acceptance: through the Anthropic runner with plans=True, a plan with a wrong tool name
    and a bad reference is answered with every problem and its "did you mean", nothing runs
    and no step is used; the corrected plan runs, and the model gets its outputs."""
    shop = Shop()
    tx = shop.transaction()
    runner = atx_anthropic.ToolRunner(tx, plans=True)
    seen: list[tuple[list[str], int]] = []

    def corrected(body: dict[str, Any]) -> Any:
        seen.append((list(shop.calls), tx.next_step_id))
        return turn(call("propose_plan", order_plan(), "toolu_plan_2"))

    model = ScriptedModel([turn(call("propose_plan", BAD_PLAN, "toolu_plan_1")), corrected, "ok"])
    messages = messages_loop(model.anthropic(), runner)
    assert seen == [([], 1)]  # after the refusal: no tool ran, no step used
    assert_alternating(messages)
    refused, ran = anthropic_tool_results({"messages": messages})
    assert (refused["tool_use_id"], refused["is_error"]) == ("toolu_plan_1", True)
    assert_refused_with_every_problem(refused["content"])
    assert (ran["tool_use_id"], ran["is_error"]) == ("toolu_plan_2", False)
    assert_plan_ran(ran["content"], shop)
    assert anthropic_tool_results(model.last)[-1] == ran  # the model got the result
    assert len(model.requests) == 3
    offered = model.requests[0]["tools"]
    assert offered[-1]["name"] == "propose_plan"
    assert offered[-1]["input_schema"] == agenttx.plan_tool_spec(tx).parameters
    assert [t["name"] for t in offered[:-1]] == list(TOOL_NAMES)
    tx.commit()


# ---------------------------------------------------------------------- reused call ids


def reused_ids_conversation(history: str) -> tuple[Shop, agenttx.Transaction, ScriptedModel]:
    """The order workflow played by a model that numbers its call ids per turn."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(reused_ids_script())
    messages_loop(model.anthropic(), atx_anthropic.ToolRunner(tx, history=history))  # type: ignore[arg-type]
    assert model.remaining == 0
    return shop, tx, model


def test_later_turns_may_reuse_tool_use_ids_and_every_call_runs():
    """A model that sends `call_0` in every turn: every call runs, the rewind refunds the
    charge, and the order commits once."""
    shop, tx, _ = reused_ids_conversation("truncate")
    assert shop.calls == [
        "lookup_customer",
        "lookup_customer",
        "charge",
        "reserve",
        "charge",
        "reserve",
        "send_confirmation",
    ]
    assert [s.call_id for s in tx.steps] == ["call_0", "call_0", "call_1", "call_2"]
    assert shop.refunds == ["ch-1"]
    tx.commit()
    assert len(shop.delivered) == 1


def test_truncate_after_reuse_drops_only_the_voided_blocks_of_a_reused_id():
    """The rewind voids steps 2 and 3 (both `call_0`): their blocks go, roles still
    alternate, and turn 1's `call_0` (step 1, live) stays with its result."""
    _, _, model = reused_ids_conversation("truncate")
    messages = model.requests[3]["messages"]
    assert_alternating(messages)
    assert roles(messages) == ["user", "assistant", "user", "assistant", "user"]
    assert [b["id"] for b in messages[1]["content"] if b["type"] == "tool_use"] == ["call_0"]
    assert [b["id"] for b in messages[3]["content"] if b["type"] == "tool_use"] == ["call_1"]
    results = anthropic_tool_results({"messages": messages})
    assert [(r["tool_use_id"], r["content"]["step"]) for r in results] == [
        ("call_0", 1),
        ("call_1", 4),
    ]
    assert results[0]["content"]["output"]["id"] == "c-1"
    assert results[1]["content"]["note"].startswith("The rollback undid steps 2 and 3")
    assert_alternating(model.last["messages"])


def test_void_after_reuse_replaces_only_the_voided_results_of_a_reused_id():
    """history="void": the results of steps 2 and 3 (both `call_0`) are voided; turn 1's
    `call_0` result keeps its output."""
    _, _, model = reused_ids_conversation("void")
    results = anthropic_tool_results({"messages": model.requests[3]["messages"]})
    assert [(r["tool_use_id"], r["content"]["step"]) for r in results] == [
        ("call_0", 1),
        ("call_0", 2),
        ("call_0", 3),
        ("call_1", 4),
    ]
    assert [r["content"].get("voided") for r in results] == [None, True, True, None]
    assert [r["is_error"] for r in results] == [False, True, True, True]
