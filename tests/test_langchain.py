"""agenttx.integrations.langchain: LangChain tools as agenttx tools, and a LangGraph graph whose
tools node runs each turn through a transaction, driven offline by a scripted chat model."""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import sys
from typing import Annotated, Any

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import InjectedToolCallId, StructuredTool, Tool, ToolException
from langchain_core.tools import tool as lc_tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, InjectedStore, tools_condition
from mcp import Client
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, Field, field_validator

import agenttx
from _shop import EMAIL, OLD_EMAIL, ORDER, Shop
from agenttx.integrations.langchain import TransactionalToolNode, from_langchain, tool_schemas
from agenttx.integrations.mcp import tools_from_mcp

CUSTOMER = "${steps.1.id}"


class ScriptedChatModel(BaseChatModel):
    """A chat model that plays scripted AIMessages and records what it was sent."""

    turns: list[AIMessage]
    seen: list[list[BaseMessage]] = Field(default_factory=list)
    bound: list[Any] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.seen.append(list(messages))
        self.bound.append(kwargs.get("tools"))
        return ChatResult(generations=[ChatGeneration(message=self.turns[len(self.seen) - 1])])

    def bind_tools(self, tools, **kwargs):
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


def turn(*calls: tuple[str, dict[str, Any] | str, str], text: str = "") -> AIMessage:
    """An AIMessage with tool calls `(name, arguments, id)`."""
    return AIMessage(
        text, tool_calls=[{"name": n, "args": a, "id": i, "type": "tool_call"} for n, a, i in calls]
    )


def graph(model: ScriptedChatModel, node: TransactionalToolNode) -> Any:
    """The usual ReAct graph: the model, then the tools node while the model calls tools."""

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.bind_tools(node.tools).invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.bind_tools(node.tools).ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent if model.name != "async" else aagent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile()


def langchain_shop(shop: Shop) -> list[Any]:
    """The shop's lookup, charge and reserve as LangChain tools wrapped by `from_langchain`,
    with the shop's own `send_confirmation` and `refund` next to them."""
    own = {t.name: t for t in shop.tools if isinstance(t, (agenttx.Tool, agenttx.Compensation))}

    @lc_tool
    def lookup_customer(email: str) -> dict[str, Any]:
        """Find a customer by email address."""
        return own["lookup_customer"](email)

    @lc_tool
    def charge(customer_id: str, amount: int) -> dict[str, Any]:
        """Charge the customer's card, in pence."""
        return own["charge"](customer_id, amount)

    async def reserve_stock(customer_id: str, sku: str, quantity: int) -> dict[str, Any]:
        try:
            return own["reserve"](customer_id, sku, quantity)
        except agenttx.ToolError:
            raise ToolException(
                'insert or update on table "reservations" violates foreign key constraint '
                f'"fk"\nDETAIL: Key (customer_id)=({customer_id}) is not present in table '
                '"active_customers".'
            ) from None

    reserve = StructuredTool.from_function(
        coroutine=reserve_stock, name="reserve", description="Reserve stock for the order."
    )
    return [
        from_langchain(lookup_customer),
        from_langchain(charge, compensate="refund"),
        from_langchain(reserve),
        own["send_confirmation"],
        own["refund"],
    ]


def order_turns() -> list[AIMessage]:
    """The model's turns: the old email, a failing reserve, then the replay and a reply."""
    amount = ORDER["amount"]
    return [
        turn(("lookup_customer", {"email": OLD_EMAIL}, "a")),
        turn(
            ("charge", {"customer_id": CUSTOMER, "amount": amount}, "b"),
            ("reserve", {"customer_id": CUSTOMER, "sku": "SKU-1", "quantity": 2}, "c"),
            text="Charging and reserving.",
        ),
        turn(("lookup_customer", {"email": EMAIL}, "d")),
        turn(
            ("charge", {"customer_id": CUSTOMER, "amount": amount}, "e"),
            ("reserve", {"customer_id": CUSTOMER, "sku": "SKU-1", "quantity": 2}, "f"),
            (
                "send_confirmation",
                {"customer_id": CUSTOMER, "email": "${steps.1.email}", "order_id": "o-1"},
                "g",
            ),
        ),
        AIMessage("Your order is confirmed."),
    ]


def payload(message: BaseMessage) -> dict[str, Any]:
    """The JSON a ToolMessage carries."""
    return json.loads(message.content)


# ---------------------------------------------------------------------- the order workflow


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_order_workflow_in_a_langgraph_graph(mode):
    """A reserve failing on bad data from step 1 rewinds there and refunds the charge; the
    model replays; after the commit the staged email goes out once."""
    shop = Shop()
    tx = agenttx.Transaction(tools=langchain_shop(shop), dispatcher=shop.deliver)
    model = ScriptedChatModel(turns=order_turns(), name=mode)
    app = graph(model, TransactionalToolNode(tx))
    start = {"messages": [HumanMessage("Order SKU-1 for ada")]}
    final = app.invoke(start) if mode == "sync" else asyncio.run(app.ainvoke(start))
    assert shop.refunds == ["ch-1"]
    assert shop.live_charges == ["ch-2"]
    assert shop.delivered == []
    tx.commit()
    assert [effect.payload["to"] for effect in shop.delivered] == [EMAIL]
    assert final["messages"][-1].content == "Your order is confirmed."
    assert len(shop.reservations) == 1


def test_what_reached_the_model_after_the_rewind_truncate():
    """The model gets the wire-name schemas; after the rewind the voided calls and their
    results are gone from its history, and the failed call's result carries the hint."""
    shop = Shop()
    tx = agenttx.Transaction(tools=langchain_shop(shop), dispatcher=shop.deliver)
    model = ScriptedChatModel(turns=order_turns())
    app = graph(model, TransactionalToolNode(tx))
    app.invoke({"messages": [HumanMessage("Order SKU-1 for ada")]})
    assert model.bound[0] == tool_schemas(tx)
    assert [t["function"]["name"] for t in model.bound[0]] == [
        "lookup_customer",
        "charge",
        "reserve",
        "send_confirmation",
    ]
    assert model.bound[0][0]["function"]["parameters"]["properties"] == {
        "email": {"type": "string"}
    }
    # The third model call: the first turn is gone, the second keeps only the failed call.
    human, ai, result = model.seen[2]
    assert isinstance(human, HumanMessage)
    assert ai.content == "Charging and reserving."
    assert [call["id"] for call in ai.tool_calls] == ["c"]
    assert isinstance(result, ToolMessage)
    assert (result.tool_call_id, result.status, result.name) == ("c", "error", "reserve")
    failed = payload(result)
    assert failed["ok"] is False
    assert failed["step"] == 3
    assert failed["next_step"] == 1
    assert failed["voided_steps"] == [1, 2]
    assert failed["root_cause"] == {"step": 1, "key": "customer_id"}
    assert "customer_id" in failed["error"]
    # The last model call sees every replayed call answered with its for_model payload.
    replies = [m for m in model.seen[4] if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.status) for m in replies] == [
        ("c", "error"),
        ("d", "success"),
        ("e", "success"),
        ("f", "success"),
        ("g", "success"),
    ]
    replayed = payload(replies[1])
    assert list(replayed)[:4] == ["ok", "step", "output", "next_step"]
    assert replayed["output"] == {"id": "c-1", "name": "Ada", "email": EMAIL, "status": "active"}
    assert (replayed["ok"], replayed["step"], replayed["next_step"]) == (True, 1, 2)


def test_history_void_overwrites_the_voided_results():
    """`history="void"` keeps the voided calls but replaces their results by a note."""
    shop = Shop()
    tx = agenttx.Transaction(tools=langchain_shop(shop), dispatcher=shop.deliver)
    model = ScriptedChatModel(turns=order_turns())
    app = graph(model, TransactionalToolNode(tx, history="void"))
    app.invoke({"messages": [HumanMessage("Order")]})
    seen = model.seen[2]
    results = {m.tool_call_id: m for m in seen if isinstance(m, ToolMessage)}
    assert list(results) == ["a", "b", "c"]
    for call_id in ("a", "b"):
        assert results[call_id].status == "error"
        assert payload(results[call_id])["voided"] is True
    assert payload(results["c"])["voided_steps"] == [1, 2]
    assert [len(m.tool_calls) for m in seen if isinstance(m, AIMessage)] == [1, 2]


def test_history_keep_leaves_the_history_alone():
    """`history="keep"` leaves the voided results; only the payload's voided_steps says so."""
    shop = Shop()
    tx = agenttx.Transaction(tools=langchain_shop(shop), dispatcher=shop.deliver)
    model = ScriptedChatModel(turns=order_turns())
    app = graph(model, TransactionalToolNode(tx, history="keep"))
    app.invoke({"messages": [HumanMessage("Order")]})
    results = [m for m in model.seen[2] if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.status) for m in results] == [
        ("a", "success"),
        ("b", "success"),
        ("c", "error"),
    ]


# ---------------------------------------------------------------------- model mistakes


def node_reply(tx: agenttx.Transaction, message: AIMessage) -> list[ToolMessage]:
    """What the node answers to one AIMessage, outside a graph."""
    return TransactionalToolNode(tx).invoke({"messages": [HumanMessage("hi"), message]})["messages"]


def test_model_mistakes_become_tool_messages():
    """An unknown tool and a missing argument are error results, and the calls after the
    first failure are answered as not run: a result for every call, no exception."""
    shop = Shop()
    tx = shop.transaction()
    replies = node_reply(
        tx,
        turn(
            ("no_such_tool", {}, "x1"),
            ("lookup_customer", {"email": EMAIL}, "x2"),
        ),
    )
    assert [(m.tool_call_id, m.status) for m in replies] == [("x1", "error"), ("x2", "error")]
    assert "no_such_tool" in payload(replies[0])["error"]
    assert shop.calls == []
    replies = node_reply(tx, turn(("charge", {"customer_id": "c-1"}, "x3")))
    assert replies[0].status == "error"
    assert "amount" in payload(replies[0])["error"]
    assert shop.charges == []


def test_malformed_arguments_are_answered():
    """An invalid tool call (arguments that are not JSON) gets an error ToolMessage."""
    shop = Shop()
    tx = shop.transaction()
    message = AIMessage(
        "",
        invalid_tool_calls=[
            {"name": "charge", "args": '{"amount": ', "id": "bad", "error": "not JSON"}
        ],
    )
    (reply,) = node_reply(tx, message)
    assert (reply.tool_call_id, reply.status) == ("bad", "error")
    assert payload(reply)["ok"] is False
    assert shop.charges == []


def test_a_duplicate_call_id_is_answered_not_raised():
    """A call id sent twice in one turn gets an error result; a later turn may reuse it."""
    shop = Shop()
    tx = shop.transaction()
    node_reply(tx, turn(("lookup_customer", {"email": EMAIL}, "same")))
    (reply,) = node_reply(tx, turn(("lookup_customer", {"email": EMAIL}, "same")))
    assert (reply.tool_call_id, reply.status) == ("same", "success")
    first, second = node_reply(
        tx,
        turn(("lookup_customer", {"email": EMAIL}, "twice"), ("lookup_customer", {}, "twice")),
    )
    assert (first.status, second.tool_call_id, second.status) == ("success", "twice", "error")
    assert shop.calls == ["lookup_customer"] * 3


def test_a_turn_after_the_transaction_ended_is_answered():
    """Calls sent after the commit get an error result saying the transaction has ended."""
    shop = Shop()
    tx = shop.transaction()
    tx.commit()
    (reply,) = node_reply(tx, turn(("lookup_customer", {"email": EMAIL}, "late")))
    assert (reply.tool_call_id, reply.status) == ("late", "error")
    assert "ended" in payload(reply)["instruction"]
    assert shop.calls == []


# ---------------------------------------------------------------------- from_langchain


def test_from_langchain_takes_the_tools_own_spec():
    """The spec is the LangChain tool's: name, description, and its tool-call schema."""

    @lc_tool
    def add(a: int, b: int = 2) -> int:
        """Add two numbers."""
        return a + b

    wrapped = from_langchain(add, name="math.add")
    assert wrapped.name == "math.add"
    assert wrapped.spec.wire_name == "math_add"
    assert wrapped.spec.description == "Add two numbers."
    parameters = wrapped.spec.parameters
    assert parameters["required"] == ["a"]
    assert set(parameters["properties"]) == {"a", "b"}
    assert parameters["additionalProperties"] is False
    tx = agenttx.Transaction(tools=[wrapped])
    assert tx.call("math_add", {"a": 40}).output == 42


def test_a_tool_exception_fails_the_step_even_when_the_tool_handles_it():
    """A ToolException becomes a ToolError whose text reaches the hint, whatever the tool's
    handle_tool_error says (LangChain would report it as an output)."""

    def explode(order_id: str) -> str:
        raise ToolException(f"order {order_id} is locked")

    handled = StructuredTool.from_function(
        explode, name="explode", description="Explode.", handle_tool_error=True
    )
    tx = agenttx.Transaction(tools=[from_langchain(handled)])
    result = tx.call("explode", {"order_id": "o-9"})
    assert result.status is not agenttx.StepStatus.SUCCESS
    assert "o-9 is locked" in result.hint.text


def test_an_async_only_langchain_tool_runs_under_call_and_acall():
    """A tool with only a coroutine runs through ainvoke, from sync and async calls alike."""

    async def double(x: int) -> int:
        return 2 * x

    wrapped = from_langchain(
        StructuredTool.from_function(coroutine=double, name="double", description="Double x.")
    )
    tx = agenttx.Transaction(tools=[wrapped])
    assert tx.call("double", {"x": 2}).output == 4
    assert asyncio.run(tx.acall("double", {"x": 3})).output == 6


def test_the_tools_own_validators_name_the_bad_field():
    """A pydantic validator of the tool failing is a failed step keyed on the field."""

    class Args(BaseModel):
        sku: str

        @field_validator("sku")
        @classmethod
        def known(cls, value: str) -> str:
            if not value.startswith("SKU-"):
                raise ValueError("unknown sku")
            return value

    checked = StructuredTool.from_function(
        lambda sku: sku, name="check", description="Check a SKU.", args_schema=Args
    )
    tx = agenttx.Transaction(tools=[from_langchain(checked)])
    result = tx.call("check", {"sku": "nope"})
    assert result.status is not agenttx.StepStatus.SUCCESS
    assert "invalid value for field `sku`: unknown sku" in result.hint.text
    assert result.hint.key == "sku"


# ---------------------------------------------------------------------- developer misuse


@pytest.mark.parametrize("thing", [len, "charge", 42])
def test_from_langchain_refuses_a_non_tool_naming_it(thing):
    """Anything but a LangChain BaseTool is refused with InvalidArgument naming it."""
    with pytest.raises(agenttx.InvalidArgument, match=re.escape(repr(thing))):
        from_langchain(thing)


def test_tool_schemas_refuses_an_unwrapped_langchain_tool():
    """A LangChain tool in the list must be wrapped first; the error says so."""

    @lc_tool
    def ping() -> str:
        """Ping."""
        return "pong"

    with pytest.raises(agenttx.InvalidArgument, match=r"wrap it with .*from_langchain"):
        tool_schemas([ping])
    with pytest.raises(agenttx.InvalidArgument, match="42"):
        tool_schemas([42])
    with pytest.raises(agenttx.InvalidArgument, match="takes a Transaction, an Engine or a list"):
        tool_schemas("tools")


def test_the_node_refuses_bad_construction_and_bad_state():
    """A non-transaction, an unknown history policy, a state without an AIMessage last."""
    shop = Shop()
    with pytest.raises(agenttx.InvalidArgument, match=r"needs an agenttx\.Transaction"):
        TransactionalToolNode(shop.tools)
    with pytest.raises(agenttx.InvalidArgument, match="history must be one of"):
        TransactionalToolNode(shop.transaction(), history="forget")
    node = TransactionalToolNode(shop.transaction())
    with pytest.raises(agenttx.InvalidArgument, match="no messages"):
        node.invoke({"messages": []})
    with pytest.raises(agenttx.InvalidArgument, match="must be an AIMessage"):
        node.invoke({"messages": [HumanMessage("hi")]})


def test_a_list_state_gets_a_list_back():
    """A state that is a list of messages is answered with a list of ToolMessages."""
    shop = Shop()
    node = TransactionalToolNode(shop.transaction())
    replies = node.invoke([turn(("lookup_customer", {"email": EMAIL}, "l1"))])
    assert [m.tool_call_id for m in replies] == ["l1"]


def test_a_missing_sdk_names_the_extra(monkeypatch):
    """Without langchain-core, importing the integration says which extra to install."""
    monkeypatch.setitem(sys.modules, "langchain_core.messages", None)
    monkeypatch.delitem(sys.modules, "agenttx.integrations.langchain")
    with pytest.raises(ImportError, match=r"pip install 'agenttx\[langchain\]'"):
        importlib.import_module("agenttx.integrations.langchain")


def test_a_legacy_single_input_tool_takes_its_one_argument():
    """A `Tool(func=...)` takes one string, `__arg1`, as LangChain offers it to models."""
    echo = Tool(name="echo", func=lambda text: text.upper(), description="Echo, loudly.")
    wrapped = from_langchain(echo)
    assert wrapped.spec.parameters["required"] == ["__arg1"]
    tx = agenttx.Transaction(tools=[wrapped])
    assert tx.call("echo", {"__arg1": "hi"}).output == "HI"


def test_a_json_schema_args_schema_is_taken_as_it_is():
    """A LangChain tool declared with a JSON Schema dict keeps it as its parameters."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "Where."}},
        "required": ["city"],
    }
    weather = StructuredTool.from_function(
        lambda city: f"sunny in {city}",
        name="weather",
        description="The weather.",
        args_schema=schema,
    )
    wrapped = from_langchain(weather)
    assert wrapped.spec.parameters == {**schema, "additionalProperties": False}
    tx = agenttx.Transaction(tools=[wrapped])
    assert tx.call("weather", {"city": "Leeds"}).output == "sunny in Leeds"
    refused = tx.call("weather", {"city": "Leeds", "town": "Leeds"})
    assert refused.status is not agenttx.StepStatus.SUCCESS
    assert "town" in refused.for_model()["error"]


def test_truncate_rewrites_provider_shaped_messages_through_the_reducer():
    """An AIMessage with text, a `tool_use` block and raw OpenAI tool_calls loses only the
    voided call; its ToolMessage is removed; the current AIMessage keeps the failed call."""
    shop = Shop()
    tx = shop.transaction()
    node = TransactionalToolNode(tx)
    lookup = {"name": "lookup_customer", "args": {"email": OLD_EMAIL}, "id": "a"}
    first = AIMessage(
        id="ai-1",
        content=[
            {"type": "text", "text": "Looking the customer up."},
            {"type": "tool_use", "id": "a", "name": "lookup_customer", "input": lookup["args"]},
        ],
        tool_calls=[lookup],
        additional_kwargs={"tool_calls": [{"id": "a", "type": "function"}]},
    )
    human = HumanMessage("Order", id="h")
    (answer,) = node.invoke({"messages": [human, first]})["messages"]
    answer = answer.model_copy(update={"id": "tm-1"})
    second = turn(
        ("charge", {"customer_id": CUSTOMER, "amount": 42}, "b"),
        ("reserve", {"customer_id": CUSTOMER, "sku": "SKU-1", "quantity": 2}, "c"),
    ).model_copy(update={"id": "ai-2"})
    updates = node.invoke({"messages": [human, first, answer, second]})["messages"]
    rewritten, removed, current, failed = updates
    assert rewritten.id == "ai-1"
    assert rewritten.tool_calls == []
    assert rewritten.content == [{"type": "text", "text": "Looking the customer up."}]
    assert "tool_calls" not in rewritten.additional_kwargs
    assert isinstance(removed, RemoveMessage)
    assert removed.id == "tm-1"
    assert current.id == "ai-2"
    assert [call["id"] for call in current.tool_calls] == ["c"]
    assert (failed.tool_call_id, failed.status) == ("c", "error")
    assert payload(failed)["note"].startswith("The rollback undid steps 1 and 2")


def test_any_other_exception_fails_the_step_as_python_formats_it():
    """An exception LangChain does not name fails the step with its type and text."""

    def lookup(key: str) -> str:
        return {"a": "1"}[key]

    wrapped = from_langchain(StructuredTool.from_function(lookup, description="Look up."))
    tx = agenttx.Transaction(tools=[wrapped])
    result = tx.call("lookup", {"key": "zz"})
    assert result.status is not agenttx.StepStatus.SUCCESS
    assert "zz" in result.for_model()["error"]


def test_mcp_tools_run_in_an_async_langgraph_graph():
    """Tools from an MCP session run as steps of an async graph, on the session's loop."""
    server = MCPServer("math")

    @server.tool(name="math.double")
    def double(x: int) -> int:
        """Double x."""
        return 2 * x

    model = ScriptedChatModel(
        turns=[turn(("math_double", {"x": 21}, "m1")), AIMessage("42")], name="async"
    )

    async def main() -> dict[str, Any]:
        async with Client(server) as client:
            tx = agenttx.Transaction(tools=await tools_from_mcp(client))
            app = graph(model, TransactionalToolNode(tx))
            final = await app.ainvoke({"messages": [HumanMessage("double 21")]})
            tx.commit()
            return final

    final = asyncio.run(main())
    (answer,) = [m for m in final["messages"] if isinstance(m, ToolMessage)]
    assert (answer.tool_call_id, answer.name, answer.status) == ("m1", "math_double", "success")
    assert payload(answer)["output"] == {"result": 42}
    assert model.bound[0][0]["function"]["name"] == "math_double"


# ---------------------------------------------------------------------- injected arguments


def injected_tools(seen: dict[str, Any]) -> list[Any]:
    """LangChain tools taking LangGraph's injected arguments (state, a state field, the store,
    the call id), sync and async; each records what it was given in `seen`."""

    @lc_tool
    def note(
        text: str,
        state: Annotated[dict, InjectedState],
        messages: Annotated[list, InjectedState("messages")],
        tool_call_id: Annotated[str, InjectedToolCallId],
    ) -> dict[str, Any]:
        """Take a note."""
        seen["note"] = (text, len(state["messages"]), len(messages), tool_call_id)
        return {"noted": text, "call": tool_call_id}

    async def remember(key: str, store: Annotated[Any, InjectedStore()]) -> str:
        """Remember a key in the graph's store."""
        store.put(("notes",), key, {"set": True})
        seen["remember"] = key
        return f"remembered {key}"

    return [
        from_langchain(note),
        from_langchain(StructuredTool.from_function(coroutine=remember, name="remember")),
    ]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_node_supplies_langgraphs_injected_arguments(mode):
    """State, a state field, the graph's store and the call id reach the tools that declare
    them, as LangGraph's ToolNode gives them; the model is never asked for them."""
    from langgraph.store.memory import InMemoryStore  # noqa: PLC0415

    seen: dict[str, Any] = {}
    tx = agenttx.Transaction(tools=injected_tools(seen))
    node = TransactionalToolNode(tx)
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in node.tools}
    assert set(parameters["note"]["properties"]) == {"text"}
    assert set(parameters["remember"]["properties"]) == {"key"}
    calls = turn(("note", {"text": "hi"}, "call-n"), ("remember", {"key": "k1"}, "call-r"))
    model = ScriptedChatModel(turns=[calls, AIMessage("done")], name=mode)
    store = InMemoryStore()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    app = builder.compile(store=store)
    start = {"messages": [HumanMessage("note it")]}
    final = app.invoke(start) if mode == "sync" else asyncio.run(app.ainvoke(start))
    assert seen["note"] == ("hi", 2, 2, "call-n")
    assert seen["remember"] == "k1"
    assert store.get(("notes",), "k1").value == {"set": True}
    results = {m.tool_call_id: json.loads(m.content) for m in final["messages"][2:4]}
    assert results["call-n"]["output"] == {"noted": "hi", "call": "call-n"}
    assert results["call-r"]["output"] == "remembered k1"
    assert [step.arguments for step in tx.steps] == [{"text": "hi"}, {"key": "k1"}]


def test_injected_arguments_are_not_taken_from_the_model():
    """A model that sends an injected argument itself is answered with a failed call."""
    seen: dict[str, Any] = {}
    tx = agenttx.Transaction(tools=injected_tools(seen))
    node = TransactionalToolNode(tx)
    forged = turn(("note", {"text": "hi", "tool_call_id": "forged"}, "call-f"))
    (message,) = node.invoke({"messages": [HumanMessage("x"), forged]})["messages"]
    assert message.status == "error"
    assert "note" not in seen


def test_a_tool_with_injected_arguments_outside_the_node_says_so():
    """Called outside a TransactionalToolNode (no graph to inject from), the step fails naming
    what the tool takes; without a store, it says to compile the graph with one."""
    seen: dict[str, Any] = {}
    tx = agenttx.Transaction(tools=injected_tools(seen))
    outside = tx.call("note", {"text": "hi"}, call_id="c1")
    assert "TransactionalToolNode" in outside.error
    assert "state, messages, tool_call_id" in outside.error
    node = TransactionalToolNode(tx)
    next_step = tx.next_step_id
    reply = node.invoke({"messages": [HumanMessage("x"), turn(("remember", {"key": "k"}, "c2"))]})
    assert tx.next_step_id <= next_step  # the step failed
    assert "compile the graph with a store" in reply["messages"][-1].content
    assert seen == {}


def test_a_later_turn_reusing_call_ids_without_a_message_id_runs_its_calls():
    """A node called with plain messages (no message ids): a later model turn that reuses the
    last turn's call ids with other arguments is a new turn, run, not taken for the last one."""
    ran: list[int] = []

    @agenttx.tool
    def charge(amount: int) -> dict:
        """Charge `amount`."""
        ran.append(amount)
        return {"charged": amount}

    tx = agenttx.Transaction(tools=[charge])
    node = TransactionalToolNode(tx)
    first = AIMessage("", tool_calls=[{"name": "charge", "args": {"amount": 1}, "id": "call_0"}])
    answered = node.invoke([HumanMessage("hi"), first])
    later = AIMessage("", tool_calls=[{"name": "charge", "args": {"amount": 500}, "id": "call_0"}])
    out = node.invoke([HumanMessage("hi"), first, *answered, later])
    assert ran == [1, 500]
    assert json.loads(out[0].content)["output"] == {"charged": 500}
