"""The shared test scaffolding: the scripted model behind the real SDKs, and the shop workflow."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

import agenttx
from _scripted import (
    ScriptedModel,
    anthropic_tool_results,
    call,
    chat_tool_messages,
    responses_outputs,
    say,
    tool_names,
    turn,
)
from _shop import EMAIL, OLD_EMAIL, Shop, bad_calls, happy_calls

TOOL = {"type": "function", "function": {"name": "lookup_customer", "parameters": {}}}


def test_chat_completions_turns_and_recorded_requests():
    """The OpenAI client gets scripted tool calls then text; every request body is recorded."""
    model = ScriptedModel([turn(call("lookup_customer", {"email": EMAIL})), say("done")])
    client = model.openai()
    first = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], tools=[TOOL]
    )
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None
    (tool_call,) = message.tool_calls
    assert tool_call.id == "call_1"
    assert tool_call.function.name == "lookup_customer"
    assert json.loads(tool_call.function.arguments) == {"email": EMAIL}
    messages = [
        {"role": "user", "content": "hi"},
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"ok": True})},
    ]
    second = client.chat.completions.create(model="m", messages=messages)
    assert second.choices[0].message.content == "done"
    assert tool_names(model.requests[0]) == ["lookup_customer"]
    assert chat_tool_messages(model.last) == [
        {"role": "tool", "tool_call_id": "call_1", "content": {"ok": True}}
    ]
    assert model.remaining == 0


def test_exhausted_script_is_a_bad_request():
    """A request past the end of the script raises the SDK's BadRequestError, not a hang."""
    model = ScriptedModel([])
    with pytest.raises(openai.BadRequestError, match="script exhausted"):
        model.openai().chat.completions.create(model="m", messages=[])


def test_responses_api_function_calls():
    """The Responses API gets function_call items with call ids, and text as a message item."""
    model = ScriptedModel([turn(call("charge", '{"amount": 1', "c9")), say("bye")])
    client = model.openai()
    response = client.responses.create(model="m", input="hi")
    (item,) = response.output
    assert item.type == "function_call"
    assert (item.call_id, item.name, item.arguments) == ("c9", "charge", '{"amount": 1')
    done = client.responses.create(
        model="m",
        input=[{"type": "function_call_output", "call_id": "c9", "output": '{"ok": false}'}],
    )
    assert done.output_text == "bye"
    assert responses_outputs(model.last) == [
        {"type": "function_call_output", "call_id": "c9", "output": {"ok": False}}
    ]


def test_anthropic_messages_and_async_clients():
    """Anthropic gets tool_use blocks (sync and async clients); tool_result blocks are read back."""
    model = ScriptedModel([turn(call("lookup_customer", {"email": EMAIL}), text="looking"), "ok"])
    message = model.anthropic().messages.create(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.stop_reason == "tool_use"
    text, use = message.content
    assert text.type == "text"
    assert use.type == "tool_use"
    assert (use.id, use.name, use.input) == ("toolu_1", "lookup_customer", {"email": EMAIL})
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"ok": true}'}

    async def second() -> str:
        client = model.async_anthropic()
        answer = await client.messages.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": [result]}]
        )
        return answer.content[0].text  # type: ignore[union-attr]

    assert asyncio.run(second()) == "ok"
    assert anthropic_tool_results(model.last)[0]["content"] == {"ok": True}


def test_async_openai_client():
    """The async OpenAI client is served by the same script."""
    model = ScriptedModel([say("hello")])

    async def ask() -> str | None:
        answer = await model.async_openai().chat.completions.create(model="m", messages=[])
        return answer.choices[0].message.content

    assert asyncio.run(ask()) == "hello"


def test_shop_workflow_rewinds_to_the_lookup_and_refunds():
    """The bad lookup makes step 3 fail on `customer_id`; the jump to step 1 refunds the charge."""
    shop = Shop()
    tx = shop.transaction()
    results = [tx.execute_step(i, n, a) for i, (n, a) in enumerate(bad_calls()[:3], 1)]
    assert [r.ok for r in results] == [True, True, False]
    failed = results[2]
    assert failed.strategy is agenttx.RollbackStrategy.DEPENDENCY_JUMP
    assert failed.rollback_to_step == 1
    assert shop.refunds == ["ch-1"]
    for i, (name, arguments) in enumerate(happy_calls(), 1):
        assert tx.execute_step(i, name, arguments).ok
    assert shop.delivered == []
    tx.commit()
    assert [e.payload for e in shop.delivered] == [
        {"to": EMAIL, "customer_id": "c-1", "subject": "Order o-1"}
    ]
    assert shop.live_charges == ["ch-2"]
    assert OLD_EMAIL not in json.dumps([e.payload for e in shop.delivered])
