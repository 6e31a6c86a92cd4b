"""agenttx.integrations.openai_agents: agenttx tools in the OpenAI Agents SDK, driven offline."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import agents
import pytest
from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner

import agenttx
from _scripted import ScriptedModel, call, say, turn
from _shop import EMAIL, OLD_EMAIL, ORDER, TOOL_NAMES, Shop
from agenttx._approvals import requests_for
from agenttx._transaction import turn_lock
from agenttx.integrations import openai_agents as atx_agents
from agenttx.integrations._common import voided_payload

agents.set_tracing_disabled(True)

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


def _agent(tx: agenttx.Transaction, model: ScriptedModel, *, responses: bool = False) -> Agent:
    client = model.async_openai()
    llm: Any = (
        OpenAIResponsesModel(model="scripted-model", openai_client=client)
        if responses
        else OpenAIChatCompletionsModel(model="scripted-model", openai_client=client)
    )
    return Agent(
        name="shop", instructions="Place the order.", tools=atx_agents.function_tools(tx), model=llm
    )


def _run(agent: Agent, config: agents.RunConfig) -> Any:
    return asyncio.run(Runner.run(agent, "Order 2 of SKU-1 for Ada.", run_config=config))


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
    result = _run(_agent(tx, model), atx_agents.run_config(tx))
    assert result.final_output == "Order placed."
    failure = _tool_outputs(model.requests[2])["c3"]
    assert failure["ok"] is False
    assert failure["root_cause"] == {"step": 1, "key": "customer_id"}
    assert failure["voided_steps"] == [1, 2]
    assert failure["next_step"] == 1
    assert shop.refunds == ["ch-1"]  # the first charge, compensated by the rewind
    # the turn barrier: the confirmation of the failed turn never ran
    assert shop.calls == [
        "lookup_customer",
        "charge",
        "reserve",
        "lookup_customer",
        "charge",
        "reserve",
        "send_confirmation",
    ]
    assert shop.delivered == []  # staged, not sent before the commit
    commit = tx.commit()
    assert commit.steps_committed == 4
    assert [effect.payload["to"] for effect in shop.delivered] == [EMAIL]
    assert shop.live_charges == ["ch-2"]
    assert [record.call_id for record in tx.steps] == ["c5", "c6", "c7", "c8"]


@pytest.mark.parametrize("history", ["truncate", "void", "keep"])
def test_what_reaches_the_model_schemas_results_and_history(history):
    """The model gets wire names, the specs' schemas, the payloads, the documented history."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(_workflow())
    _run(_agent(tx, model), atx_agents.run_config(tx, history=history))
    specs = {spec.wire_name: spec for spec in tx.tool_specs}
    offered = model.requests[0]["tools"]
    assert [tool["function"]["name"] for tool in offered] == list(TOOL_NAMES)
    for tool in offered:
        spec = specs[tool["function"]["name"]]
        assert tool["function"]["parameters"] == spec.parameters
        assert tool["function"]["description"] == spec.description
        assert tool["function"]["strict"] is True  # every argument required: strict as it is
    # each result is the step's `for_model()` payload, as JSON text
    first = _tool_outputs(model.requests[1])["c1"]
    assert first["ok"] is True
    assert first["step"] == 1
    assert first["output"]["id"] == "c-old"
    assert first["next_step"] == 2
    after = model.requests[2]  # the request right after the rewind
    outputs = _tool_outputs(after)
    not_run = outputs["c4"]
    assert not_run["ok"] is False
    assert not_run["step"] is None  # never sent (the turn barrier)
    assert "Not run: step 3 failed first" in not_run["error"]
    assert "c3" in outputs
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


def test_responses_model_gets_the_same_tools_and_payloads():
    """Through the Responses API the tools and the function_call_output payloads are the same."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(_workflow())
    result = _run(_agent(tx, model, responses=True), atx_agents.run_config(tx))
    assert result.final_output == "Order placed."
    assert [tool["name"] for tool in model.requests[0]["tools"]] == list(TOOL_NAMES)
    after = model.requests[2]["input"]
    call_ids = {item.get("call_id") for item in after if isinstance(item, dict)}
    assert not {"c1", "c2"} & call_ids  # truncated
    outputs = {
        item["call_id"]: json.loads(item["output"])
        for item in after
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }
    assert outputs["c3"]["root_cause"] == {"step": 1, "key": "customer_id"}
    tx.commit()
    assert len(shop.delivered) == 1


def test_wire_names_and_strict_schemas():
    """A dotted tool name is offered by its wire name; strict only when the schema already is."""

    @agenttx.tool(name="orders.lookup")
    def lookup(order_id: str) -> dict[str, str]:
        """Look an order up."""
        return {"order_id": order_id}

    @agenttx.tool
    def search(text: str, limit: int = 10) -> list[str]:
        """Search orders."""
        return [text] * min(limit, 1)

    tx = agenttx.Transaction(tools=[lookup, search])
    by_name = {tool.name: tool for tool in atx_agents.function_tools(tx)}
    assert set(by_name) == {"orders_lookup", "search"}
    assert by_name["orders_lookup"].strict_json_schema is True
    assert by_name["search"].strict_json_schema is False  # `limit` is optional
    assert by_name["search"].params_json_schema == search.spec.parameters
    assert not any(t.strict_json_schema for t in atx_agents.function_tools(tx, strict=False))
    with pytest.raises(agenttx.InvalidArgument, match="tool `search`"):
        atx_agents.function_tools(tx, strict=True)
    model = ScriptedModel([call("orders_lookup", {"order_id": "o-9"}, "c1"), say("ok")])
    agent = Agent(
        name="a",
        tools=atx_agents.function_tools(tx),
        model=OpenAIChatCompletionsModel(model="m", openai_client=model.async_openai()),
    )
    _run(agent, atx_agents.run_config(tx))
    assert _tool_outputs(model.requests[1])["c1"]["output"] == {"order_id": "o-9"}
    assert tx.steps[0].tool_name == "orders.lookup"


def test_model_mistakes_come_back_as_tool_results():
    """An unknown tool or malformed arguments give the model a result; nothing runs, no raise."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(
        [
            turn(call("lookup_customers", {"email": EMAIL}, "c1")),
            turn(call("lookup_customer", '{"email": ', "c2")),
            turn(call("lookup_customer", {"email": EMAIL, "extra": 1}, "c3")),
            say("gave up"),
        ]
    )
    result = _run(_agent(tx, model), atx_agents.run_config(tx))
    assert result.final_output == "gave up"
    unknown = _tool_outputs(model.requests[1])["c1"]
    assert "lookup_customers" in unknown  # the SDK's own "not found" result
    malformed = _tool_outputs(model.requests[2])["c2"]
    assert malformed["ok"] is False
    assert "JSON" in malformed["error"]
    assert malformed["next_step"] == 1  # the same step, sent again
    unexpected = _tool_outputs(model.requests[3])["c3"]
    assert unexpected["ok"] is False
    assert "extra" in unexpected["error"]
    assert shop.calls == []
    assert tx.next_step_id == 1


def test_a_call_after_the_transaction_ended_is_a_tool_result():
    """A call on an ended transaction tells the model so, instead of raising out of the run."""
    shop = Shop()
    tx = shop.transaction()
    tx.rollback()
    model = ScriptedModel([call("lookup_customer", {"email": EMAIL}, "c1"), say("stopped")])
    result = _run(_agent(tx, model), atx_agents.run_config(tx))
    assert result.final_output == "stopped"
    payload = _tool_outputs(model.requests[1])["c1"]
    assert payload["ok"] is False
    assert "the transaction has ended" in payload["error"]
    assert shop.calls == []


def test_concurrent_calls_of_a_turn_run_in_order_with_the_barrier():
    """Without run_config the SDK starts a turn's calls together: still steps in call order."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(
        [
            turn(
                call("lookup_customer", {"email": OLD_EMAIL}, "c1"),
                _charge("c2"),
                _reserve("c3"),
                _confirm("c4"),
            ),
            say("stopped"),
        ]
    )
    _run(_agent(tx, model), agents.RunConfig())
    outputs = _tool_outputs(model.requests[1])
    assert [outputs[c]["step"] for c in ("c1", "c2", "c3")] == [1, 2, 3]
    assert outputs["c3"]["ok"] is False
    assert outputs["c4"]["ok"] is False  # not run: its turn had failed
    assert shop.calls == ["lookup_customer", "charge", "reserve"]


def test_two_runs_on_two_event_loops_share_one_transaction():
    """Two runs, each on its own event loop, on one transaction: steps continue, no error."""
    shop = Shop()
    tx = shop.transaction()
    first = ScriptedModel([call("lookup_customer", {"email": EMAIL}, "c1"), say("found")])
    second = ScriptedModel([_charge("c2"), say("charged")])
    config = atx_agents.run_config(tx)
    for model, answer in ((first, "found"), (second, "charged")):
        assert _run(_agent(tx, model), config).final_output == answer
    assert [record.tool_name for record in tx.steps] == ["lookup_customer", "charge"]
    assert _tool_outputs(second.requests[1])["c2"]["step"] == 2


def test_developer_misuse_raises_invalid_argument():
    """Not a transaction, an unknown history mode, a clashing RunConfig option: InvalidArgument."""
    shop = Shop()
    tx = shop.transaction()
    with pytest.raises(agenttx.InvalidArgument, match=r"needs an agenttx\.Transaction.*list"):
        atx_agents.function_tools(shop.tools)  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="input_filter needs"):
        atx_agents.input_filter(object())  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="history must be one of"):
        atx_agents.input_filter(tx, history="drop")
    with pytest.raises(agenttx.InvalidArgument, match="call_model_input_filter"):
        atx_agents.run_config(tx, call_model_input_filter=lambda data: data.model_data)
    with pytest.raises(agenttx.InvalidArgument, match="strict must be"):
        atx_agents.function_tools(tx, strict="yes")  # type: ignore[arg-type]


def test_the_sdk_is_imported_only_with_the_module_and_named_when_missing():
    """`import agenttx` leaves agents alone; without it the module names the pip install."""
    code = (
        "import sys, agenttx; print('agents' in sys.modules);"
        "import agenttx.integrations.openai_agents; print('agents' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["False", "True"]
    code = (
        "import sys; sys.modules['agents'] = None\n"
        "try:\n    import agenttx.integrations.openai_agents\n"
        "except ImportError as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert "pip install 'agenttx[openai-agents]'" in done.stdout


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
def test_a_streamed_run_rewinds_compensates_replays_and_commits(responses):
    """`Runner.run_streamed` over a model that streams its turns (server-sent events): the same
    rewind, refund, replay and commit as a plain run, and the events reach the caller."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(_workflow())
    agent = _agent(tx, model, responses=responses)
    kinds: list[str] = []

    async def main() -> Any:
        streamed = Runner.run_streamed(
            agent, "Order 2 of SKU-1 for Ada.", run_config=atx_agents.run_config(tx)
        )
        kinds.extend(
            [
                getattr(getattr(event, "item", None), "type", event.type)
                async for event in streamed.stream_events()
            ]
        )
        return streamed

    streamed = asyncio.run(main())
    assert streamed.final_output == "Order placed."
    assert all(body.get("stream") is True for body in model.requests)
    assert kinds.count("tool_call_output_item") == 8  # every call is answered
    assert "raw_response_event" in kinds  # the model's deltas reached the caller
    assert shop.calls.count("send_confirmation") == 1  # the failed turn's was not run
    if responses:
        outputs = {
            item["call_id"]: json.loads(item["output"])
            for item in model.requests[2]["input"]
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        }
        failure = outputs["c3"]
    else:
        failure = _tool_outputs(model.requests[2])["c3"]
    assert failure["root_cause"] == {"step": 1, "key": "customer_id"}
    assert failure["voided_steps"] == [1, 2]
    assert shop.refunds == ["ch-1"]
    tx.commit()
    assert [effect.payload["to"] for effect in shop.delivered] == [EMAIL]
    assert shop.live_charges == ["ch-2"]
    assert [record.call_id for record in tx.steps] == ["c5", "c6", "c7", "c8"]


# ---------------------------------------------------------------------- people in the loop


#: Look up, then two refunds (each needs a person's approval), in one turn.
TWO_REFUNDS = (
    turn(
        call("lookup_order", {"order_id": "o-1"}, "c1"),
        call("issue_refund", {"order_id": "o-1", "amount": 30}, "c2"),
        call("issue_refund", {"order_id": "o-1", "amount": 12}, "c3"),
    ),
    say("Done."),
)


def _people(tmp_path: Any, script: Any = TWO_REFUNDS) -> Any:
    """A transaction on SQLite with the durable agent's tools, its SDK agent and model."""
    from _durable_agent import make_engine  # noqa: PLC0415
    from _stack_agent import sdk_agent  # noqa: PLC0415
    from agenttx.stores import SQLiteStore  # noqa: PLC0415

    engine = make_engine(tmp_path, SQLiteStore(tmp_path / "agent.db"))
    tx = engine.begin(agent_id="support")
    model = ScriptedModel(script)
    return engine, tx, model, sdk_agent(tx, model)


def _refunds(tmp_path: Any) -> list[str]:
    from _durable_agent import effects  # noqa: PLC0415

    return [line for line in effects(tmp_path) if line.startswith("refund_issued")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("second", ["approve", "reject"])
def test_two_gated_calls_of_a_turn_each_interrupt_and_run_once_decided(second, tmp_path):
    """Two approval-gated calls in one model turn: the run stops with an interruption for each;
    once the first call's request is decided, the resumed run runs it once and stops again on
    the second (never answering it with a waiting payload), whose request `approve_decided`
    asks then; once that is decided, it runs once (a rejected one gets the person's reason),
    and no extra model turn is made."""
    from _stack_agent import sdk_run  # noqa: PLC0415

    engine, tx, model, agent = _people(tmp_path)
    result = sdk_run(tx, agent, "Refund o-1 twice.")
    assert [i.call_id for i in result.interruptions] == ["c2", "c3"]
    (first,) = atx_agents.waiting(tx)
    assert first.arguments["amount"] == 30
    engine.approve(first.id, actor="alice")
    state = result.to_state()
    assert atx_agents.approve_decided(tx, state) is True
    result = sdk_run(tx, agent, state)
    assert [i.call_id for i in result.interruptions] == ["c3"]
    assert _refunds(tmp_path) == ["refund_issued o-1 30"]
    state = result.to_state()
    assert atx_agents.approve_decided(tx, state) is False  # asks for it, in its order
    (later,) = atx_agents.waiting(tx)
    assert later.arguments["amount"] == 12
    assert later.step == 3
    assert atx_agents.approve_decided(tx, state) is False  # undecided
    if second == "approve":
        engine.approve(later.id, actor="alice")
    else:
        engine.reject(later.id, actor="bob", reason="one refund is enough")
    assert atx_agents.approve_decided(tx, state) is True
    result = sdk_run(tx, agent, state)
    assert not result.interruptions
    assert result.final_output == "Done."
    assert len(model.requests) == 2
    answered = _tool_outputs(model.last)
    assert list(answered) == ["c1", "c2", "c3"]
    assert answered["c2"]["ok"]
    if second == "approve":
        assert answered["c3"]["ok"]
        assert _refunds(tmp_path) == ["refund_issued o-1 30", "refund_issued o-1 12"]
    else:
        assert answered["c3"]["ok"] is False
        assert "one refund is enough" in answered["c3"]["error"]
        assert _refunds(tmp_path) == ["refund_issued o-1 30"]
    assert atx_agents.waiting(tx) == ()


@pytest.mark.timeout(120)
def test_a_call_waiting_with_a_rejected_one_is_not_run_nor_asked(tmp_path):
    """The first of two gated calls of a turn is rejected: the second, which waited with it,
    is answered as not run (the turn barrier), no request is asked for it, and it never runs."""
    from _stack_agent import sdk_run  # noqa: PLC0415

    engine, tx, model, agent = _people(tmp_path)
    result = sdk_run(tx, agent, "Refund o-1 twice.")
    (first,) = atx_agents.waiting(tx)
    engine.reject(first.id, actor="bob", reason="no refunds today")
    while result.interruptions:
        state = result.to_state()
        assert atx_agents.approve_decided(tx, state) is True
        result = sdk_run(tx, agent, state)
    assert len(model.requests) == 2
    answered = _tool_outputs(model.last)
    assert "no refunds today" in answered["c2"]["error"]
    assert answered["c3"]["ok"] is False
    assert "not run" in answered["c3"]["instruction"]
    assert _refunds(tmp_path) == []
    assert [r.id for r in tx.pending_approvals()] == []
    assert len(engine.store.list_requests("approval", "rejected", 10)) == 1


@pytest.mark.timeout(120)
def test_a_saved_state_resumed_twice_asks_once_and_runs_the_approved_call_once(tmp_path):
    """The same saved `RunState` resumed twice (a double click, two workers): the second resume
    opens no second approval request and does not run the approved call again; its call is
    answered with the recorded result of the first."""
    from _durable_agent import APPROVAL_SCRIPT  # noqa: PLC0415
    from _stack_agent import sdk_run  # noqa: PLC0415
    from agenttx._approvals import requests_for  # noqa: PLC0415

    engine, tx, model, agent = _people(tmp_path, [*APPROVAL_SCRIPT, say("Done again.")])
    saved = sdk_run(tx, agent, "Refund o-1.").to_state().to_string()
    (request,) = atx_agents.waiting(tx)
    early = asyncio.run(agents.RunState.from_string(agent, saved))
    assert atx_agents.approve_decided(tx, early) is False
    assert sdk_run(tx, agent, early).interruptions  # resumed before the decision: still waits
    assert [r.id for r in atx_agents.waiting(tx)] == [request.id]  # the same request
    engine.approve(request.id, actor="alice")
    answers = []
    for _ in range(2):
        state = asyncio.run(agents.RunState.from_string(agent, saved))
        assert atx_agents.approve_decided(tx, state) is True
        assert not sdk_run(tx, agent, state).interruptions
        answers.append(_tool_outputs(model.last)["c3"])
    assert _refunds(tmp_path) == ["refund_issued o-1 30"]  # exactly once
    assert answers[0] == answers[1]
    assert answers[1]["ok"]
    assert answers[1]["step"] == 3
    rows = [r for r in requests_for(tx.store).of_scope(tx.id) if r.kind == "approval"]
    assert [r.id for r in rows] == [request.id]
    assert atx_agents.waiting(tx) == ()


@pytest.mark.timeout(120)
def test_two_gated_calls_of_a_turn_are_decided_in_order_across_a_restart(tmp_path):
    """The run stops on two gated calls and the process ends; a new engine recovers the
    transaction and resumes the saved state: each call gets its own request in its order, runs
    once when approved, and the turn is answered with no extra model turn."""
    from _durable_agent import make_engine  # noqa: PLC0415
    from _stack_agent import sdk_agent, sdk_run  # noqa: PLC0415
    from agenttx.stores import SQLiteStore  # noqa: PLC0415

    engine, tx, model, agent = _people(tmp_path)
    saved = sdk_run(tx, agent, "Refund o-1 twice.").to_state().to_string()
    engine.close()

    engine = make_engine(tmp_path, SQLiteStore(tmp_path / "agent.db"))
    assert tx.id in engine.recover("resume").resumed
    tx = engine.get(tx.id)
    agent = sdk_agent(tx, model)
    asked = []
    while True:
        state = asyncio.run(agents.RunState.from_string(agent, saved))
        if not atx_agents.approve_decided(tx, state):
            (request,) = atx_agents.waiting(tx)
            asked.append(request.arguments["amount"])
            engine.approve(request.id, actor="alice")
            continue
        result = sdk_run(tx, agent, state)
        if not result.interruptions:
            break
        saved = result.to_state().to_string()
    assert asked == [30, 12]
    assert _refunds(tmp_path) == ["refund_issued o-1 30", "refund_issued o-1 12"]
    assert len(model.requests) == 2
    assert all(r["ok"] for r in _tool_outputs(model.last).values())


def _drive(tx: Any, agent: Any, result: Any, decide: Any) -> Any:
    """Resume `result` until the run ends, letting `decide` settle each request it waits on."""
    from _stack_agent import sdk_run  # noqa: PLC0415

    while result.interruptions:
        state = result.to_state()
        if not atx_agents.approve_decided(tx, state):
            for request in atx_agents.waiting(tx):
                decide(request)
            continue
        result = sdk_run(tx, agent, state)
    return result


@pytest.mark.timeout(120)
def test_a_saved_state_resumed_twice_runs_a_reviewed_call_once(tmp_path):
    """A call whose step timed out waits for a review; resolved `done`, the same saved state
    resumed twice answers the call with the recorded result both times: the tool is not run
    again."""
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    from _stack_agent import sdk_agent, sdk_run  # noqa: PLC0415
    from agenttx.stores import SQLiteStore  # noqa: PLC0415

    charges: list[int] = []
    first = threading.Event()
    returned = threading.Event()

    @agenttx.compensation(name="refund")
    def refund(payload: Any) -> None:
        """Refund."""

    @agenttx.tool(compensate=refund, on_unknown="review")
    def charge(amount: int) -> dict:
        """Charge the card."""
        charges.append(amount)
        if not first.is_set():
            first.set()
            time.sleep(0.6)  # past the step timeout: the outcome is unknown
            returned.set()
        return {"charged": amount}

    engine = agenttx.Engine(
        tools=[charge, refund],
        store=SQLiteStore(tmp_path / "a.db"),
        config=agenttx.EngineConfig(step_timeout=0.2),
    )
    tx = engine.begin(agent_id="a")
    model = ScriptedModel([call("charge", {"amount": 42}, "c1"), say("Done."), say("Again.")])
    agent = sdk_agent(tx, model)
    saved = sdk_run(tx, agent, "Charge 42.").to_state().to_string()
    assert returned.wait(30)
    (review,) = atx_agents.waiting(tx)
    tx.resolve_review(review.id, outcome="done", output={"charged": 42}, actor="ops")
    answers = []
    for _ in range(2):
        state = asyncio.run(agents.RunState.from_string(agent, saved))
        assert atx_agents.approve_decided(tx, state) is True
        assert not sdk_run(tx, agent, state).interruptions
        answers.append(_tool_outputs(model.last)["c1"])
    assert charges == [42]
    assert answers[0] == answers[1]
    assert answers[1]["step"] == 1
    assert [s.step_id for s in tx.steps] == [1]


@pytest.mark.timeout(120)
def test_a_later_run_that_reuses_a_call_id_for_the_same_gated_call_is_asked_and_runs(tmp_path):
    """A later run whose model reuses the id of an approved call that ran, with the same
    arguments, is a new call: it gets its own approval request and runs once approved, never
    answered with the earlier step's result."""
    from _stack_agent import sdk_run  # noqa: PLC0415

    refund = call("issue_refund", {"order_id": "o-1", "amount": 30}, "c1")
    script = [refund, say("Refunded."), refund, say("Refunded again.")]
    engine, tx, model, agent = _people(tmp_path, script)
    asked = []

    def approve(request: Any) -> None:
        asked.append(request.step)
        engine.approve(request.id, actor="alice")

    result = _drive(tx, agent, sdk_run(tx, agent, "Refund o-1."), approve)
    items = [*result.to_input_list(), {"role": "user", "content": "Once more."}]
    _drive(tx, agent, sdk_run(tx, agent, items), approve)
    assert asked == [1, 2]
    assert _refunds(tmp_path) == ["refund_issued o-1 30", "refund_issued o-1 30"]
    assert [(s.step_id, s.call_id) for s in tx.steps] == [(1, "c1"), (2, "c1")]
    assert _tool_outputs(model.last)["c1"]["step"] == 2


@pytest.mark.timeout(120)
def test_a_saved_state_resumed_twice_at_once_runs_the_call_once_and_asks_nothing(tmp_path):
    """Two workers (each its own event loop) resume the same approved state at once: the call
    runs once, the other worker's run gets its recorded result, and no new request is asked."""
    import threading  # noqa: PLC0415

    from _durable_agent import APPROVAL_SCRIPT  # noqa: PLC0415
    from _stack_agent import sdk_run  # noqa: PLC0415

    script = [APPROVAL_SCRIPT[0], say("Done."), say("Done.")]
    engine, tx, model, agent = _people(tmp_path, script)
    saved = sdk_run(tx, agent, "Refund o-1.").to_state().to_string()
    (request,) = atx_agents.waiting(tx)
    engine.approve(request.id, actor="alice")
    states = [asyncio.run(agents.RunState.from_string(agent, saved)) for _ in range(2)]
    assert all(atx_agents.approve_decided(tx, state) for state in states)
    results: list[Any] = [None, None]
    barrier = threading.Barrier(2)

    def worker(i: int) -> None:
        barrier.wait()
        results[i] = sdk_run(tx, agent, states[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(not r.interruptions for r in results)
    assert _refunds(tmp_path) == ["refund_issued o-1 30"]
    answers = [_tool_outputs(body)["c3"] for body in model.requests[1:]]
    assert [a["step"] for a in answers] == [3, 3]
    assert atx_agents.waiting(tx) == ()
    assert tx.next_step_id == 4


@pytest.mark.timeout(120)
def test_a_rejection_of_a_step_a_rollback_undid_decides_no_later_call(tmp_path):
    """A rejected request at step 3, then a rollback below it: a later turn's second gated call
    (waiting with the first) is not taken as decided by the old rejection; it gets its own
    request, and the run never ends with a request pending."""
    from _stack_agent import sdk_run  # noqa: PLC0415

    script = [
        turn(
            call("lookup_order", {"order_id": "o-1"}, "a1"),
            call("lookup_order", {"order_id": "o-2"}, "a2"),
            call("issue_refund", {"order_id": "o-1", "amount": 30}, "a3"),
        ),
        say("Rejected."),
        turn(
            call("issue_refund", {"order_id": "o-1", "amount": 20}, "b1"),
            call("issue_refund", {"order_id": "o-2", "amount": 25}, "b2"),
        ),
        say("Done."),
    ]
    engine, tx, model, agent = _people(tmp_path, script)
    _drive(
        tx,
        agent,
        sdk_run(tx, agent, "Refund o-1."),
        lambda r: engine.reject(r.id, actor="bob", reason="no"),
    )
    tx.rollback(2)
    asked = []

    def approve(request: Any) -> None:
        asked.append((request.step, request.arguments["amount"]))
        engine.approve(request.id, actor="alice")

    result = _drive(tx, agent, sdk_run(tx, agent, "Refund o-1 20 and o-2 25."), approve)
    assert result.final_output == "Done."
    assert asked == [(2, 20), (3, 25)]
    assert atx_agents.waiting(tx) == ()
    assert _tool_outputs(model.last)["b2"]["ok"] is True
    assert _refunds(tmp_path) == ["refund_issued o-1 20", "refund_issued o-2 25"]


@pytest.mark.timeout(120)
def test_a_call_a_guardrail_blocked_leaves_no_answer_for_a_later_runs_call(tmp_path):
    """A guarded call runs inside the SDK's approval check, then a tool guardrail blocks it
    (the tool is never invoked); a later run reuses the id for a call that needs approval:
    once approved it runs on its own approval, never answered with the blocked call's result."""
    from agents.tool_guardrails import (  # noqa: PLC0415
        ToolGuardrailFunctionOutput,
        tool_input_guardrail,
    )

    from _stack_agent import sdk_agent, sdk_run  # noqa: PLC0415
    from agenttx.stores import SQLiteStore  # noqa: PLC0415

    refunded: list[tuple[str, int]] = []

    @agenttx.tool(needs_approval=lambda a: a["amount"] > 20)
    def issue_refund(order_id: str, amount: int) -> dict[str, Any]:
        """Refund an order (over 20 needs a person)."""
        refunded.append((order_id, amount))
        return {"amount": amount}

    @tool_input_guardrail
    def no_fives(data: Any) -> Any:
        if json.loads(data.context.tool_arguments or "{}").get("amount") == 5:
            return ToolGuardrailFunctionOutput.reject_content("refunds of 5 are blocked")
        return ToolGuardrailFunctionOutput.allow()

    engine = agenttx.Engine(tools=[issue_refund], store=SQLiteStore(tmp_path / "a.db"))
    tx = engine.begin(agent_id="a")
    model = ScriptedModel(
        [
            call("issue_refund", {"order_id": "o-1", "amount": 5}, "c1"),
            say("Blocked."),
            call("issue_refund", {"order_id": "o-2", "amount": 50}, "c1"),
            say("Refunded 50."),
        ]
    )
    agent = sdk_agent(tx, model)
    for tool in agent.tools:
        tool.tool_input_guardrails = [no_fives]
    first = sdk_run(tx, agent, "Refund 5.")
    items = [*first.to_input_list(), {"role": "user", "content": "Refund 50 on o-2."}]
    result = sdk_run(tx, agent, items)
    result = _drive(tx, agent, result, lambda r: engine.approve(r.id, actor="alice"))
    assert refunded == [("o-1", 5), ("o-2", 50)]
    assert _tool_outputs(model.last)["c1"]["step"] == 2
    assert result.final_output == "Refunded 50."
    assert atx_agents.waiting(tx) == ()
    assert all(r.state == "finished" for r in requests_for(tx.store).of_scope(tx.id))


@pytest.mark.timeout(120)
def test_approve_decided_from_a_tool_of_the_transaction_raises_and_changes_nothing(tmp_path):
    """`approve_decided` called from a tool of the transaction (its call holds the turn):
    `InvalidTransactionState` naming what to do, the saved state untouched; called outside
    the run afterwards, the call it waits on is asked and runs once approved."""
    engine, tx, _model, agent = _people(tmp_path)
    from _stack_agent import sdk_run  # noqa: PLC0415

    result = sdk_run(tx, agent, "Refund.")
    (request,) = atx_agents.waiting(tx)
    engine.approve(request.id, actor="alice")
    state = result.to_state()
    assert atx_agents.approve_decided(tx, state) is True
    result = sdk_run(tx, agent, state)
    assert [i.call_id for i in result.interruptions] == ["c3"]
    state = result.to_state()
    raised: list[BaseException] = []

    async def inside() -> None:
        async with turn_lock(tx):  # as a running call of the transaction holds it
            try:
                atx_agents.approve_decided(tx, state)
            except agenttx.InvalidTransactionState as error:
                raised.append(error)
            try:
                await atx_agents.aapprove_decided(tx, state)
            except agenttx.InvalidTransactionState as error:
                raised.append(error)

    asyncio.run(inside())
    assert len(raised) == 2
    assert all("outside the tools" in str(error) for error in raised)
    assert atx_agents.waiting(tx) == ()
    assert _refunds(tmp_path) == ["refund_issued o-1 30"]
    result = _drive(tx, agent, result, lambda r: engine.approve(r.id, actor="bob"))
    assert _refunds(tmp_path) == ["refund_issued o-1 30", "refund_issued o-1 12"]


@pytest.mark.timeout(120)
def test_aapprove_decided_lets_async_code_resume_the_run(tmp_path):
    """`aapprove_decided` is `approve_decided` for async code on the loop that runs the agent:
    False while a request is undecided, True once decided, and the resumed run runs each gated
    call once."""
    engine, tx, _model, agent = _people(tmp_path)

    async def drive() -> Any:
        result = await Runner.run(agent, "Refund.", run_config=atx_agents.run_config(tx))
        while result.interruptions:
            state = result.to_state()
            if not await atx_agents.aapprove_decided(tx, state):
                for request in atx_agents.waiting(tx):
                    engine.approve(request.id, actor="alice")
                continue
            result = await Runner.run(agent, state, run_config=atx_agents.run_config(tx))
        return result

    result = asyncio.run(drive())
    assert result.final_output == "Done."
    assert _refunds(tmp_path) == ["refund_issued o-1 30", "refund_issued o-1 12"]
    assert atx_agents.waiting(tx) == ()
