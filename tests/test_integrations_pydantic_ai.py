"""agenttx.integrations.pydantic_ai: agenttx tools in pydantic-ai, driven offline."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import agenttx
from _scripted import ScriptedModel, call, say, turn
from _shop import EMAIL, OLD_EMAIL, ORDER, TOOL_NAMES, Shop
from agenttx.integrations import pydantic_ai as atx_pai
from agenttx.integrations._common import voided_payload

REF = "${steps.1.id}"


def _charge(call_id: str) -> Any:
    return call("charge", {"customer_id": REF, "amount": ORDER["amount"]}, call_id)


def _reserve(call_id: str) -> Any:
    arguments = {"customer_id": REF, "sku": ORDER["sku"], "quantity": ORDER["quantity"]}
    return call("reserve", arguments, call_id)


def _confirm(call_id: str) -> Any:
    arguments = {"customer_id": REF, "email": "${steps.1.email}", "order_id": ORDER["order_id"]}
    return call("send_confirmation", arguments, call_id)


def _workflow() -> list[Any]:
    """The order workflow: the old email first (step 3 fails, root cause step 1), then the fix."""
    return [
        call("lookup_customer", {"email": OLD_EMAIL}, "c1"),
        turn(_charge("c2"), _reserve("c3"), _confirm("c4")),
        call("lookup_customer", {"email": EMAIL}, "c5"),
        turn(_charge("c6"), _reserve("c7"), _confirm("c8")),
        say("Order placed."),
    ]


def _agent(tx: agenttx.Transaction, model: ScriptedModel, *, history: str = "truncate") -> Agent:
    llm = OpenAIChatModel(
        "scripted-model", provider=OpenAIProvider(openai_client=model.async_openai())
    )
    return Agent(
        llm,
        instructions="Place the order.",
        toolsets=[atx_pai.Toolset(tx)],
        capabilities=[ProcessHistory(atx_pai.history_processor(tx, history=history))],
    )


def _run(agent: Agent) -> Any:
    return asyncio.run(agent.run("Order 2 of SKU-1 for Ada.")).output


def _tool_outputs(body: dict[str, Any]) -> dict[str, Any]:
    """call id -> the tool result a chat-completions request carries (JSON parsed if it is)."""
    found: dict[str, Any] = {}
    for message in body["messages"]:
        if message.get("role") == "tool":
            try:
                found[message["tool_call_id"]] = json.loads(message["content"])
            except ValueError:
                found[message["tool_call_id"]] = message["content"]
    return found


def _tool_call_ids(body: dict[str, Any]) -> list[str]:
    """The call ids of the assistant tool calls a chat-completions request replays."""
    return [
        tool_call["id"]
        for message in body["messages"]
        for tool_call in message.get("tool_calls") or ()
    ]


def test_order_workflow_rewinds_compensates_replays_and_commits():
    """Bad data from step 1 fails step 3: rewind to 1, refund, replay, commit, one email."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(_workflow())
    assert _run(_agent(tx, model)) == "Order placed."
    failure = _tool_outputs(model.requests[2])["c3"]
    assert failure["ok"] is False
    assert failure["root_cause"] == {"step": 1, "key": "customer_id"}
    assert failure["voided_steps"] == [1, 2]
    assert failure["next_step"] == 1
    assert shop.refunds == ["ch-1"]
    assert shop.calls == [  # the confirmation of the failed turn never ran (the barrier)
        "lookup_customer",
        "charge",
        "reserve",
        "lookup_customer",
        "charge",
        "reserve",
        "send_confirmation",
    ]
    assert shop.delivered == []
    assert tx.commit().steps_committed == 4
    assert [effect.payload["to"] for effect in shop.delivered] == [EMAIL]
    assert shop.live_charges == ["ch-2"]
    assert [record.call_id for record in tx.steps] == ["c5", "c6", "c7", "c8"]


@pytest.mark.parametrize("history", ["truncate", "void", "keep"])
def test_what_reaches_the_model_schemas_results_and_history(history):
    """The model gets wire names, the specs' schemas, the payloads, the documented history."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(_workflow())
    _run(_agent(tx, model, history=history))
    specs = {spec.wire_name: spec for spec in tx.tool_specs}
    offered = model.requests[0]["tools"]
    assert [tool["function"]["name"] for tool in offered] == list(TOOL_NAMES)
    for tool in offered:
        spec = specs[tool["function"]["name"]]
        assert tool["function"]["parameters"] == spec.parameters
        assert tool["function"]["description"] == spec.description
    first = _tool_outputs(model.requests[1])["c1"]
    assert first["ok"] is True
    assert first["step"] == 1
    assert first["output"]["id"] == "c-old"
    after = model.requests[2]
    outputs = _tool_outputs(after)
    assert outputs["c4"]["ok"] is False
    assert outputs["c4"]["step"] is None  # never sent (the turn barrier)
    assert "Not run: step 3 failed first" in outputs["c4"]["error"]
    assert outputs["c3"]["voided_steps"] == [1, 2]
    if history == "truncate":
        assert not {"c1", "c2"} & set(outputs)
        assert not {"c1", "c2"} & set(_tool_call_ids(after))
        assert outputs["c3"]["note"] == (
            "The rollback undid steps 1 and 2 (2 tool calls); "
            "their calls and results were removed from this conversation."
        )
    elif history == "void":
        assert outputs["c1"] == voided_payload(1)
        assert outputs["c2"] == voided_payload(2)
        assert outputs["c1"]["voided"] is True
        assert {"c1", "c2"} <= set(_tool_call_ids(after))
        assert "note" not in outputs["c3"]
    else:
        assert outputs["c1"] == first
        assert outputs["c2"]["ok"] is True
        assert "note" not in outputs["c3"]
    final = _tool_outputs(model.requests[-1])
    assert [final[c]["step"] for c in ("c5", "c6", "c7", "c8")] == [1, 2, 3, 4]


def test_tool_definitions_carry_the_specs():
    """Each tool definition has the wire name, the JSON Schema, and runs sequentially."""

    @agenttx.tool(name="orders.lookup")
    def lookup(order_id: str) -> dict[str, str]:
        """Look an order up."""
        return {"order_id": order_id}

    tx = agenttx.Transaction(tools=[lookup])
    (definition,) = atx_pai.Toolset(tx).tool_definitions
    assert definition.name == "orders_lookup"
    assert definition.parameters_json_schema == lookup.spec.parameters
    assert definition.description == lookup.spec.description
    assert definition.sequential is True
    assert definition.strict is None
    assert atx_pai.Toolset(tx, strict=True).tool_definitions[0].strict is True
    seen: list[ToolCallPart] = []

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        assert [tool.name for tool in info.function_tools] == ["orders_lookup"]
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("orders_lookup", {"order_id": "o-9"}, "c1")])
        returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        assert returned[0].content["output"] == {"order_id": "o-9"}
        seen.extend(p for m in messages for p in m.parts if isinstance(p, ToolCallPart))
        return ModelResponse(parts=[TextPart("ok")])

    agent = Agent(FunctionModel(script), toolsets=[atx_pai.Toolset(tx)])
    assert asyncio.run(agent.run("go")).output == "ok"
    assert [p.tool_call_id for p in seen] == ["c1"]
    assert [record.tool_name for record in tx.steps] == ["orders.lookup"]


def test_model_mistakes_come_back_as_tool_results():
    """Malformed or unexpected arguments and an unknown tool give the model a result, no raise."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(
        [
            turn(call("lookup_customer", '{"email": ', "c1")),
            turn(call("lookup_customer", {"email": EMAIL, "extra": 1}, "c2")),
            turn(call("lookup_customers", {"email": EMAIL}, "c3")),
            say("gave up"),
        ]
    )
    assert _run(_agent(tx, model)) == "gave up"
    malformed = _tool_outputs(model.requests[1])["c1"]
    assert malformed["ok"] is False
    assert "JSON" in malformed["error"]
    assert malformed["next_step"] == 1
    unexpected = _tool_outputs(model.requests[2])["c2"]
    assert unexpected["ok"] is False
    assert "extra" in unexpected["error"]
    unknown = _tool_outputs(model.requests[3])["c3"]  # pydantic-ai's own retry prompt
    assert "Unknown tool name: 'lookup_customers'" in json.dumps(unknown)
    assert shop.calls == []
    assert tx.next_step_id == 1


def test_a_call_after_the_transaction_ended_is_a_tool_result():
    """A call on an ended transaction tells the model so, instead of raising out of the run."""
    shop = Shop()
    tx = shop.transaction()
    tx.rollback()
    model = ScriptedModel([call("lookup_customer", {"email": EMAIL}, "c1"), say("stopped")])
    assert _run(_agent(tx, model)) == "stopped"
    payload = _tool_outputs(model.requests[1])["c1"]
    assert payload["ok"] is False
    assert "the transaction has ended" in payload["error"]
    assert shop.calls == []


def test_history_processor_rewrites_only_voided_calls():
    """Truncate drops the voided parts and emptied messages; void replaces the returns only."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel([*_workflow()[:2], say("stop")])
    _run(_agent(tx, model))
    history = [
        ModelRequest(parts=[UserPromptPart("order")]),
        ModelResponse(parts=[ToolCallPart("lookup_customer", {"email": OLD_EMAIL}, "c1")]),
        ModelRequest(parts=[ToolReturnPart("lookup_customer", {"ok": True}, "c1")]),
        ModelResponse(parts=[TextPart("charging"), ToolCallPart("charge", {}, "c2")]),
        ModelRequest(parts=[ToolReturnPart("charge", {"ok": True}, "c2")]),
        ModelResponse(parts=[ToolCallPart("reserve", {}, "c3")]),
        ModelRequest(parts=[ToolReturnPart("reserve", {"ok": False}, "c3")]),
    ]
    truncated = atx_pai.history_processor(tx)(history)
    assert [type(m).__name__ for m in truncated] == [
        "ModelRequest",
        "ModelResponse",
        "ModelResponse",
        "ModelRequest",
    ]
    assert truncated[1].parts == [TextPart("charging")]
    assert truncated[2] is history[5]
    (failed,) = truncated[3].parts
    assert failed.content["ok"] is False
    assert failed.content["note"].startswith("The rollback undid steps 1 and 2")
    voided = atx_pai.history_processor(tx, history="void")(history)
    assert [len(m.parts) for m in voided] == [len(m.parts) for m in history]
    assert voided[2].parts[0].content == voided_payload(1)
    assert voided[4].parts[0].content == voided_payload(2)
    assert voided[1] is history[1]
    assert voided[6] is history[6]
    assert atx_pai.history_processor(tx, history="keep")(history) is history


def test_developer_misuse_raises_invalid_argument():
    """Not a transaction, an unknown history mode or a bad strict flag: InvalidArgument."""
    shop = Shop()
    tx = shop.transaction()
    with pytest.raises(agenttx.InvalidArgument, match=r"Toolset needs .*Transaction.*list"):
        atx_pai.Toolset(shop.tools)  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="history_processor needs"):
        atx_pai.history_processor(object())  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="history must be one of"):
        atx_pai.history_processor(tx, history="drop")
    with pytest.raises(agenttx.InvalidArgument, match="strict must be"):
        atx_pai.Toolset(tx, strict="yes")  # type: ignore[arg-type]


def test_the_sdk_is_imported_only_with_the_module_and_named_when_missing():
    """`import agenttx` leaves pydantic_ai alone; without it the module names the pip install."""
    code = (
        "import sys, agenttx; print('pydantic_ai' in sys.modules);"
        "import agenttx.integrations.pydantic_ai; print('pydantic_ai' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["False", "True"]
    code = (
        "import sys; sys.modules['pydantic_ai'] = None\n"
        "try:\n    import agenttx.integrations.pydantic_ai\n"
        "except ImportError as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert "pip install 'agenttx[pydantic-ai]'" in done.stdout


def test_a_streamed_run_rewinds_compensates_replays_and_commits():
    """`agent.run_stream` over a model that streams its turns (server-sent events): the same
    rewind, refund, replay and commit as a plain run, and the text streams to the caller."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(_workflow())
    agent = _agent(tx, model)
    pieces: list[str] = []

    async def main() -> str:
        async with agent.run_stream("Order 2 of SKU-1 for Ada.") as streamed:
            pieces.extend([text async for text in streamed.stream_text(delta=True)])
            return await streamed.get_output()

    assert asyncio.run(main()) == "Order placed."
    assert "".join(pieces) == "Order placed."
    assert all(body.get("stream") is True for body in model.requests)
    failure = _tool_outputs(model.requests[2])["c3"]
    assert failure["root_cause"] == {"step": 1, "key": "customer_id"}
    assert failure["voided_steps"] == [1, 2]
    assert shop.refunds == ["ch-1"]
    assert shop.calls.count("send_confirmation") == 1  # the failed turn's was not run
    tx.commit()
    assert [effect.payload["to"] for effect in shop.delivered] == [EMAIL]
    assert shop.live_charges == ["ch-2"]
    assert [record.call_id for record in tx.steps] == ["c5", "c6", "c7", "c8"]
