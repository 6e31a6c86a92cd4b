"""agenttx.integrations.openai against the real OpenAI SDK, offline (a scripted model)."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import agenttx
from _scripted import (
    CUSTOMER,
    ScriptedModel,
    call,
    chat_tool_messages,
    order_script,
    responses_outputs,
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
from agenttx.integrations import openai as atx_openai

if TYPE_CHECKING:
    import openai

MODEL = "scripted-model"
PROMPT = [{"role": "user", "content": "Order 2 x SKU-1 for ada@example.com, 42 pence."}]


def chat_loop(client: openai.OpenAI, runner: atx_openai.ToolRunner) -> list[dict[str, Any]]:
    """The loop a user writes (the one in examples/openai_chat.py)."""
    messages: list[Any] = list(PROMPT)
    while True:
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=runner.tools)
        if not reply.choices[0].message.tool_calls:
            break
        messages = runner.handle(messages, reply.choices[0].message)
    return messages


def assert_order_committed_once(shop: Shop, tx: agenttx.Transaction) -> None:
    assert shop.refunds == ["ch-1"]  # the charge made for the closed account was refunded
    assert shop.live_charges == ["ch-2"]
    assert shop.delivered == []  # nothing goes out before the commit
    result = tx.commit()
    assert result.effects_dispatched == 1
    assert [e.payload for e in shop.delivered] == [
        {"to": EMAIL, "customer_id": "c-1", "subject": "Order o-1"}
    ]


# ---------------------------------------------------------------------- tools=


def test_tools_offers_each_tool_with_its_spec():
    """tools() gives one chat-completions function per tool (no compensation), from its spec."""
    shop = Shop()
    offered = atx_openai.tools(shop.tools)
    assert [t["function"]["name"] for t in offered] == list(TOOL_NAMES)
    specs = {s.wire_name: s for s in shop.transaction().tool_specs}
    for entry in offered:
        assert entry["type"] == "function"
        spec = specs[entry["function"]["name"]]
        assert entry["function"]["parameters"] == spec.parameters
        assert entry["function"]["description"] == spec.description
    assert offered == atx_openai.tools(shop.transaction())


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_changed_tools_list_changes_nothing_else(api):
    """Each `runner.tools` and `tools()` is a new deep copy: changing one, down to a schema,
    leaves the next one, the specs and the argument checks as they were."""
    shop = Shop()
    tx = shop.transaction()
    runner = (atx_openai.ToolRunner if api == "chat" else atx_openai.ResponsesToolRunner)(tx)
    before = atx_openai.tools(tx, api=api)
    for offered in (runner.tools, atx_openai.tools(tx, api=api)):
        for entry in offered:
            schema = entry["function"]["parameters"] if api == "chat" else entry["parameters"]
            schema["properties"].clear()
            schema["required"] = ["nothing"]
            entry["type"] = "changed"
    assert runner.tools == before == atx_openai.tools(tx, api=api)
    assert all(spec.parameters["properties"] for spec in tx.tool_specs)


def test_responses_tools_are_flat_and_not_strict():
    """tools(api="responses") puts name and parameters at the top level, strict off."""
    shop = Shop()
    offered = atx_openai.tools(shop.transaction(), api="responses")
    assert [t["name"] for t in offered] == list(TOOL_NAMES)
    assert all(t["type"] == "function" and t["strict"] is False for t in offered)
    assert atx_openai.ResponsesToolRunner(shop.transaction()).tools == offered


def test_dotted_names_go_out_as_wire_names_and_come_back():
    """A tool registered as `orders.lookup` is offered as `orders_lookup` and runs by that name."""

    @agenttx.tool(name="orders.lookup")
    def lookup(order_id: str) -> dict[str, str]:
        """Look an order up."""
        return {"order_id": order_id}

    tx = agenttx.Transaction(tools=[lookup])
    runner = atx_openai.ToolRunner(tx)
    assert runner.tools[0]["function"]["name"] == "orders_lookup"
    model = ScriptedModel([call("orders_lookup", {"order_id": "o-9"}), say("ok")])
    messages = chat_loop(model.openai(), runner)
    (result,) = chat_tool_messages({"messages": messages})
    assert result["content"]["ok"] is True
    assert result["content"]["output"] == {"order_id": "o-9"}
    assert model.requests[0]["tools"] == runner.tools


# ---------------------------------------------------------------------- the order workflow


def test_order_workflow_chat_completions():
    """Bad lookup -> reserve fails on customer_id -> jump to step 1, refund -> replay -> commit."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(order_script())
    messages = chat_loop(model.openai(), atx_openai.ToolRunner(tx))
    assert model.remaining == 0
    assert shop.calls == [
        "lookup_customer",
        "charge",
        "reserve",
        "lookup_customer",
        "charge",
        "reserve",
        "send_confirmation",
    ]
    failed = chat_tool_messages(model.requests[2])[-1]
    assert failed["tool_call_id"] == "call_reserve_1"
    assert failed["content"]["ok"] is False
    assert failed["content"]["next_step"] == 1
    assert failed["content"]["root_cause"] == {"step": 1, "key": "customer_id"}
    final = chat_tool_messages({"messages": messages})
    assert [m["content"]["ok"] for m in final] == [False, True, True, True, True]
    assert [m["content"]["step"] for m in final[1:]] == [1, 2, 3, 4]
    assert_order_committed_once(shop, tx)


def test_order_workflow_async_client():
    """The same workflow with openai.AsyncOpenAI and `await runner.ahandle(...)`."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(order_script())
    runner = atx_openai.ToolRunner(tx)

    async def loop() -> list[dict[str, Any]]:
        client = model.async_openai()
        messages: list[Any] = list(PROMPT)
        while True:
            reply = await client.chat.completions.create(
                model=MODEL, messages=messages, tools=runner.tools
            )
            if not reply.choices[0].message.tool_calls:
                return messages
            messages = await runner.ahandle(messages, reply.choices[0].message)

    asyncio.run(loop())
    assert model.remaining == 0
    assert_order_committed_once(shop, tx)


def test_order_workflow_responses_api():
    """The same workflow through the Responses API: function_call / function_call_output items."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(order_script())
    client = model.openai()
    runner = atx_openai.ResponsesToolRunner(tx)
    items: Any = PROMPT[0]["content"]
    while True:
        response = client.responses.create(model=MODEL, input=items, tools=runner.tools)
        if not any(item.type == "function_call" for item in response.output):
            break
        items = runner.handle(items, response)
    assert model.remaining == 0
    outputs = responses_outputs(model.requests[2])
    assert [o["call_id"] for o in outputs] == ["call_reserve_1"]  # truncated: 1 and 2 dropped
    assert outputs[0]["output"]["root_cause"] == {"step": 1, "key": "customer_id"}
    assert "note" in outputs[0]["output"]
    assert_order_committed_once(shop, tx)


# ---------------------------------------------------------------------- what reached the model


def rewind_request(history: str) -> list[dict[str, Any]]:
    """The messages the model receives right after the rewind, under a history policy."""
    shop = Shop()
    model = ScriptedModel(order_script()[:3])
    runner = atx_openai.ToolRunner(shop.transaction(), history=history)  # type: ignore[arg-type]
    client = model.openai()
    messages: list[Any] = list(PROMPT)
    for _ in range(2):
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=runner.tools)
        messages = runner.handle(messages, reply.choices[0].message)
    client.chat.completions.create(model=MODEL, messages=messages, tools=runner.tools)
    return model.last["messages"]


def calls_and_results(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, call id) for each tool call and each tool result, in order."""
    found = []
    for m in messages:
        found.extend(("assistant", c["id"]) for c in m.get("tool_calls", ()))
        if m["role"] == "tool":
            found.append(("tool", m["tool_call_id"]))
    return found


def test_truncate_drops_the_voided_calls_and_notes_it():
    """history="truncate": lookup and charge are gone; the failed reserve's result has a note."""
    messages = rewind_request("truncate")
    assert calls_and_results(messages) == [
        ("assistant", "call_reserve_1"),
        ("tool", "call_reserve_1"),
    ]
    assert messages[0] == PROMPT[0]
    result = json.loads(messages[-1]["content"])
    assert result["voided_steps"] == [1, 2]
    assert result["note"] == (
        "The rollback undid steps 1 and 2 (2 tool calls); their calls and results were "
        "removed from this conversation."
    )
    assert list(result)[-1] == "note"


def test_void_overwrites_the_voided_results():
    """history="void": every call stays, the voided results say "voided by rollback"."""
    messages = rewind_request("void")
    assert calls_and_results(messages) == [
        ("assistant", "call_lookup_old"),
        ("tool", "call_lookup_old"),
        ("assistant", "call_charge_1"),
        ("assistant", "call_reserve_1"),
        ("tool", "call_charge_1"),
        ("tool", "call_reserve_1"),
    ]
    tools = chat_tool_messages({"messages": messages})
    for result, step in zip(tools[:2], (1, 2), strict=True):
        assert result["content"] == atx_openai_voided(step)
    assert "note" not in tools[2]["content"]
    assert tools[2]["content"]["voided_steps"] == [1, 2]


def atx_openai_voided(step: int) -> dict[str, Any]:
    return {
        "ok": False,
        "step": step,
        "voided": True,
        "error": (
            f"Voided by rollback: step {step} was undone (and compensated); "
            "its output no longer holds."
        ),
        "instruction": "Do not use this result; follow the latest tool result.",
    }


def test_keep_leaves_the_history_as_it_was():
    """history="keep": the voided results stay as sent; the failure's payload lists them."""
    messages = rewind_request("keep")
    tools = chat_tool_messages({"messages": messages})
    assert [t["content"]["ok"] for t in tools] == [True, True, False]
    assert tools[0]["content"]["output"]["id"] == "c-old"
    assert tools[2]["content"]["voided_steps"] == [1, 2]


# ---------------------------------------------------------------------- bad input from the model


def one_turn(tx: agenttx.Transaction, *calls: Any) -> list[dict[str, Any]]:
    """Play one scripted turn of `calls` through a runner; return the tool results, parsed."""
    model = ScriptedModel([turn(*calls)])
    reply = model.openai().chat.completions.create(model=MODEL, messages=PROMPT)
    messages = atx_openai.ToolRunner(tx).handle(PROMPT, reply.choices[0].message)
    return [m["content"] for m in chat_tool_messages({"messages": messages})]


def test_unknown_tool_is_a_result_and_the_step_is_resent():
    """An unknown tool name becomes a failed result for step 1; nothing after it runs."""
    shop = Shop()
    tx = shop.transaction()
    first, second = one_turn(
        tx, call("refund_everything", {}), call("lookup_customer", {"email": EMAIL})
    )
    assert first["ok"] is False
    assert "refund_everything" in first["error"]
    assert first["next_step"] == 1
    assert second["ok"] is False
    assert second["step"] is None  # never sent: it claims no step number
    assert "Not run: step 1 failed first" in second["error"]
    assert shop.calls == []
    assert tx.next_step_id == 1


def test_malformed_arguments_are_a_result():
    """Arguments that are not JSON come back as a failed result naming the problem."""
    tx = Shop().transaction()
    (result,) = one_turn(tx, call("lookup_customer", '{"email": "ada@'))
    assert result["ok"] is False
    assert result["next_step"] == 1
    assert "json" in result["error"].lower()


def test_arguments_nested_too_deep_are_a_failed_step_as_in_the_core():
    """JSON arguments nested 10,000 deep are the failed step the transaction makes of them (the
    Anthropic runner answers such a tool_use input the same); nothing runs."""
    shop = Shop()
    text = '{"email": ' + '{"a": ' * 10_000 + "{}" + "}" * 10_001
    expected = Shop().transaction().call("lookup_customer", text).for_model()
    (result,) = one_turn(shop.transaction(), call("lookup_customer", text))
    assert result == expected
    assert "Malformed JSON" in result["error"]
    assert shop.calls == []


def test_duplicate_call_id_is_a_result_not_a_renumbering():
    """A call id already used by a live step fails that call; the step numbers do not move."""
    shop = Shop()
    tx = shop.transaction()
    first, second = one_turn(
        tx,
        call("lookup_customer", {"email": EMAIL}, "dup"),
        call("charge", {"customer_id": CUSTOMER, "amount": 1}, "dup"),
    )
    assert first["ok"] is True
    assert first["step"] == 1
    assert second["ok"] is False
    assert second["next_step"] == 2
    assert shop.charges == []


def test_calls_after_the_end_are_told_so():
    """After commit, a turn's calls each get a result saying the transaction has ended."""
    shop = Shop()
    tx = shop.transaction()
    tx.commit()
    (result,) = one_turn(tx, call("lookup_customer", {"email": EMAIL}))
    assert result["ok"] is False
    assert "ended (committed)" in result["error"]
    assert shop.calls == []


def test_oversized_arguments_and_names_are_refused_as_results():
    """A tool name or arguments over the limits are refused as the step, never a traceback."""
    tx = Shop().transaction()
    first, second = one_turn(
        tx, call("x" * 500, {}), call("lookup_customer", {"email": "a" * 2_000_000})
    )
    assert first["ok"] is False
    assert "unknown tool" in first["error"]
    assert "Not run: step 1 was refused first" in second["error"]
    (big,) = one_turn(tx, call("lookup_customer", {"email": "a" * 2_000_000}))
    assert big["ok"] is False
    assert "exceed" in big["error"]


def test_an_assistant_message_already_appended_is_not_appended_twice():
    """handle() accepts a history that already ends with the assistant message."""
    tx = Shop().transaction()
    model = ScriptedModel([call("lookup_customer", {"email": EMAIL})])
    reply = model.openai().chat.completions.create(model=MODEL, messages=PROMPT)
    message = reply.choices[0].message
    messages = atx_openai.ToolRunner(tx).handle([*PROMPT, message], message)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]


def test_a_reply_without_tool_calls_runs_nothing():
    """An assistant message with only text is appended; no step runs."""
    tx = Shop().transaction()
    messages = atx_openai.ToolRunner(tx).handle(PROMPT, {"role": "assistant", "content": "hi"})
    assert messages == [*PROMPT, {"role": "assistant", "content": "hi"}]
    assert tx.next_step_id == 1


# ---------------------------------------------------------------- bad input from the developer


def test_a_non_tool_in_the_tools_list_is_named():
    """tools() refuses a list item that is not a tool, naming its position and type."""
    shop = Shop()
    spec = {"type": "function", "function": {"name": "x"}}
    with pytest.raises(agenttx.InvalidArgument, match=r"item 1 of the tools list is dict"):
        atx_openai.tools([shop.tools[0], spec])
    with pytest.raises(agenttx.InvalidArgument, match="got str"):
        atx_openai.tools("lookup_customer")
    with pytest.raises(agenttx.InvalidArgument, match="api must be"):
        atx_openai.tools(shop.tools, api="assistants")  # type: ignore[arg-type]


def test_wrong_sdk_objects_are_refused_with_what_to_pass():
    """A ChatCompletion, a Choice, a client, or a user message is refused with what to pass."""
    tx = Shop().transaction()
    runner = atx_openai.ToolRunner(tx)
    model = ScriptedModel([say("a"), say("b")])
    client = model.openai()
    completion = client.chat.completions.create(model=MODEL, messages=PROMPT)
    with pytest.raises(agenttx.InvalidArgument, match=r"completion\.choices\[0\]\.message"):
        runner.handle(PROMPT, completion)
    with pytest.raises(agenttx.InvalidArgument, match=r"choice\.message"):
        runner.handle(PROMPT, completion.choices[0])
    with pytest.raises(agenttx.InvalidArgument, match=r"openai\.OpenAI"):
        runner.handle(PROMPT, client)
    with pytest.raises(agenttx.InvalidArgument, match="role 'user'"):
        runner.handle(PROMPT, PROMPT[0])
    with pytest.raises(agenttx.InvalidArgument, match="not a ChatCompletion"):
        atx_openai.ResponsesToolRunner(tx).handle("hi", completion)
    with pytest.raises(agenttx.InvalidArgument, match=r"needs an agenttx\.Transaction"):
        atx_openai.ToolRunner(client)  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="history must be one of"):
        atx_openai.ToolRunner(tx, history="drop")  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="messages must be a list"):
        runner.handle("hello", {"role": "assistant", "content": "x"})
    assert tx.next_step_id == 1


def test_missing_sdk_names_the_extra_to_install():
    """Without the openai package, importing the integration says which extra to install."""
    code = (
        "import sys; sys.modules['openai'] = None\n"
        "try:\n    import agenttx.integrations.openai\n"
        "except ImportError as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert "pip install 'agenttx[openai]'" in done.stdout


def test_import_agenttx_does_not_import_the_sdk():
    """`import agenttx` loads no SDK; the integration module loads its own."""
    code = (
        "import sys, agenttx; print('openai' in sys.modules);"
        "import agenttx.integrations.openai; print('openai' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["False", "True"]


def doc_examples() -> list[dict[str, Any]]:
    """The JSON examples of docs/integrations.md#history-after-a-rewind, in order."""
    text = (Path(__file__).parent.parent / "docs" / "integrations.md").read_text(encoding="utf-8")
    section = text.split("## History after a rewind", 1)[1].split("\n## ", 1)[0]
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, re.DOTALL)]


def test_the_docs_show_what_reaches_the_model():
    """The note, the failed result after truncation and the voided result are as documented."""
    note, failed, voided = doc_examples()
    truncated = json.loads(rewind_request("truncate")[-1]["content"])
    assert truncated["note"] == note["note"]
    assert {key: truncated[key] for key in failed} == failed
    documented_order = [key for key in truncated if key in failed]
    assert documented_order == list(failed)
    void = chat_tool_messages({"messages": rewind_request("void")})
    assert void[0]["content"] == voided


@pytest.mark.parametrize("history", ["truncate", "void"])
def test_the_callers_messages_are_never_changed(history):
    """handle() returns new lists and dicts: the history passed in stays as it was."""
    shop = Shop()
    model = ScriptedModel(order_script()[:2])
    runner = atx_openai.ToolRunner(shop.transaction(), history=history)
    client = model.openai()
    first = client.chat.completions.create(model=MODEL, messages=PROMPT)
    before = runner.handle(PROMPT, first.choices[0].message)
    frozen = copy.deepcopy(before)
    second = client.chat.completions.create(model=MODEL, messages=before)
    after = runner.handle(before, second.choices[0].message)
    assert before == frozen
    assert after != before


def test_a_mistake_after_good_work_undoes_nothing():
    """An unknown tool at step 3 is resent as step 3: the charge at step 2 is not refunded."""
    shop = Shop()
    tx = shop.transaction()
    lookup, charged, mistake = one_turn(
        tx,
        call("lookup_customer", {"email": EMAIL}),
        call("charge", {"customer_id": CUSTOMER, "amount": 42}),
        call("reserve_stock", {"sku": "SKU-1"}),
    )
    assert (lookup["ok"], charged["ok"], mistake["ok"]) == (True, True, False)
    assert mistake["step"] == 3
    assert mistake["next_step"] == 3
    assert "voided_steps" not in mistake
    assert shop.refunds == []
    assert shop.live_charges == ["ch-1"]


def test_schema_violations_name_the_argument():
    """An argument of the wrong type is a failed result naming it; the tool never runs."""
    shop = Shop()
    tx = shop.transaction()
    (result,) = one_turn(tx, call("charge", {"customer_id": "c-1", "amount": "lots"}))
    assert result["ok"] is False
    assert "amount" in result["error"]
    assert result["next_step"] == 1
    assert shop.charges == []


# ---------------------------------------------------------------------- mistakes to learn from


def till() -> tuple[list[Any], dict[str, list[str]]]:
    """A charge that echoes its customer (refunded on rewind) and a reservation that a database
    refuses for an unknown customer and the tool refuses for a quantity that is not an int."""
    seen: dict[str, list[str]] = {"calls": [], "charges": [], "refunds": []}

    @agenttx.compensation(name="refund")
    def refund(payload: dict[str, Any]) -> None:
        seen["refunds"].append(payload["output"]["charge_id"])

    @agenttx.tool(compensate=refund)
    def charge(customer_id: str, amount: int) -> dict[str, Any]:
        """Charge the customer."""
        seen["calls"].append("charge")
        seen["charges"].append(f"ch-{len(seen['charges']) + 1}")
        return {"charge_id": seen["charges"][-1], "customer_id": customer_id}

    @agenttx.tool
    def reserve(customer_id: str, quantity: object) -> dict[str, Any]:
        """Reserve stock."""
        seen["calls"].append("reserve")
        if customer_id != "c-1":
            raise agenttx.ToolError(
                f'DETAIL:  Key (customer_id)=({customer_id}) is not present in table "customers".'
            )
        if not isinstance(quantity, int):
            message = f'invalid type: "{quantity}" for field quantity, expected an integer'
            raise ValueError(message)  # noqa: TRY004  (the plain exception a tool may raise)
        return {"reserved": quantity}

    return [refund, charge, reserve], seen


def test_a_model_repeating_its_mistake_is_stopped_after_one_rewind():
    """A model that sends the same bad customer again after the rewind is told the bad value
    and, the second time, that the run ended (the loop named): two model turns of calls, two
    charges, both refunded, never a third charge-and-refund cycle."""
    tools, seen = till()
    tx = agenttx.Transaction(tools=tools)

    def stubborn(body: dict[str, Any]) -> Any:
        results = chat_tool_messages(body)
        if results and results[-1]["content"]["next_step"] == 0:
            return say("I could not place the order.")
        return turn(
            call("charge", {"customer_id": "c-404", "amount": 42}),
            call("reserve", {"customer_id": "c-404", "quantity": 1}),
        )

    model = ScriptedModel([stubborn] * 8)
    messages = chat_loop(model.openai(), atx_openai.ToolRunner(tx))
    assert len(model.requests) == 3
    assert seen["charges"] == seen["refunds"] == ["ch-1", "ch-2"]
    rewound = chat_tool_messages(model.requests[1])[-1]["content"]
    assert rewound["bad_value"] == {"key": "customer_id", "value": "c-404", "step": 1}
    assert rewound["compensated"] == [{"step": 1, "compensation": "refund"}]
    ended = chat_tool_messages({"messages": messages})[-1]["content"]
    assert ended["abort_reason"].startswith("repeated failure")
    assert ended["instruction"].startswith("The same call failed the same way")
    assert tx.status is agenttx.TxStatus.FAILED


def test_a_literal_the_tool_refuses_costs_one_more_call_and_no_refund():
    """`quantity: "two"` refused by the tool is resent alone: N + 1 tool calls, the charge
    kept, the model told which value was wrong."""
    tools, seen = till()
    tx = agenttx.Transaction(tools=tools)
    model = ScriptedModel(
        [
            turn(
                call("charge", {"customer_id": "c-1", "amount": 42}),
                call("reserve", {"customer_id": "c-1", "quantity": "two"}),
            ),
            turn(call("reserve", {"customer_id": "c-1", "quantity": 2})),
            say("Reserved."),
        ]
    )
    chat_loop(model.openai(), atx_openai.ToolRunner(tx))
    assert model.remaining == 0
    assert seen["calls"] == ["charge", "reserve", "reserve"]
    assert seen["refunds"] == []
    resend = chat_tool_messages(model.requests[1])[-1]["content"]
    assert (resend["step"], resend["next_step"]) == (2, 2)
    assert resend["bad_value"] == {"key": "quantity", "value": "two", "step": 2}
    assert tx.commit().steps_committed == 2


# ---------------------------------------------------------------------- plans a model proposes


def test_a_models_plan_is_refused_with_every_problem_then_corrected_and_run():
    """Acceptance: through the chat runner with plans=True, a plan with a wrong tool name and
    a bad reference is answered with every problem and its "did you mean", nothing runs and
    no step is used; the corrected plan runs, and the model gets its outputs."""
    shop = Shop()
    tx = shop.transaction()
    runner = atx_openai.ToolRunner(tx, plans=True)
    seen: list[tuple[list[str], int]] = []

    def corrected(body: dict[str, Any]) -> Any:
        seen.append((list(shop.calls), tx.next_step_id))
        return turn(call("propose_plan", order_plan(), "call_plan_2"))

    model = ScriptedModel([turn(call("propose_plan", BAD_PLAN, "call_plan_1")), corrected, "ok"])
    messages = chat_loop(model.openai(), runner)
    assert seen == [([], 1)]  # after the refusal: no tool ran, no step used
    refused, ran = chat_tool_messages({"messages": messages})
    assert refused["tool_call_id"] == "call_plan_1"
    assert_refused_with_every_problem(refused["content"])
    assert ran["tool_call_id"] == "call_plan_2"
    assert_plan_ran(ran["content"], shop)
    assert chat_tool_messages(model.last)[-1] == ran  # the model got the result
    assert len(model.requests) == 3
    offered = model.requests[0]["tools"]
    assert offered[-1]["function"]["name"] == "propose_plan"
    assert offered[-1]["function"]["parameters"] == agenttx.plan_tool_spec(tx).parameters
    assert [t["function"]["name"] for t in offered[:-1]] == list(TOOL_NAMES)
    assert tx.view().steps_completed == 0
    tx.commit()


def test_the_responses_runner_answers_a_plan_too():
    """The Responses runner offers propose_plan (flat, not strict) and answers a refused plan
    and a corrected one with function_call_output items."""
    shop = Shop()
    tx = shop.transaction()
    runner = atx_openai.ResponsesToolRunner(tx, plans=True)
    assert runner.tools[-1]["name"] == "propose_plan"
    assert runner.tools[-1]["strict"] is False
    client = ScriptedModel(
        [call("propose_plan", BAD_PLAN, "c1"), call("propose_plan", order_plan(), "c2"), "ok"]
    )
    items: Any = "Order 2 x SKU-1 for ada@example.com, 42 pence."
    while True:
        response = client.openai().responses.create(model=MODEL, input=items, tools=runner.tools)
        if not any(i.type == "function_call" for i in response.output):
            break
        items = runner.handle(items, response)
    refused, ran = responses_outputs({"input": items})
    assert_refused_with_every_problem(refused["output"])
    assert_plan_ran(ran["output"], shop)


def test_an_async_runner_runs_a_plan_on_the_event_loop():
    """`ahandle` answers propose_plan too, running the plan with `arun_plan` on the loop."""
    shop = Shop()
    runner = atx_openai.ToolRunner(shop.transaction(), plans=True)
    model = ScriptedModel([call("propose_plan", order_plan(), "c1"), "ok"])

    async def loop() -> list[dict[str, Any]]:
        client = model.async_openai()
        messages: list[Any] = list(PROMPT)
        while True:
            reply = await client.chat.completions.create(
                model=MODEL, messages=messages, tools=runner.tools
            )
            if not reply.choices[0].message.tool_calls:
                return messages
            messages = await runner.ahandle(messages, reply.choices[0].message)

    (ran,) = chat_tool_messages({"messages": asyncio.run(loop())})
    assert_plan_ran(ran["content"], shop)


def test_without_plans_propose_plan_is_an_unknown_tool():
    """A runner made without plans=True does not offer propose_plan, and a call to it is an
    unknown tool's mistake, as before."""
    shop = Shop()
    runner = atx_openai.ToolRunner(shop.transaction())
    assert runner.plans is False
    assert runner.plan_spec is None
    assert "propose_plan" not in [t["function"]["name"] for t in runner.tools]
    model = ScriptedModel([call("propose_plan", order_plan()), "ok"])
    (answer,) = chat_tool_messages({"messages": chat_loop(model.openai(), runner)})
    assert answer["content"]["ok"] is False
    assert "propose_plan' does not exist" in answer["content"]["error"]
    assert shop.calls == []


# ---------------------------------------------------------------------- reused call ids


def reused_ids_requests(history: str) -> tuple[Shop, agenttx.Transaction, ScriptedModel]:
    """The order workflow played by a model that numbers its call ids per turn."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(reused_ids_script())
    chat_loop(model.openai(), atx_openai.ToolRunner(tx, history=history))  # type: ignore[arg-type]
    assert model.remaining == 0
    return shop, tx, model


def steps_and_calls(messages: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Each assistant message's call ids, and each tool result as (call id, ok, step)."""
    found: list[tuple[str, ...]] = []
    for m in messages:
        if m.get("tool_calls"):
            found.append(tuple(c["id"] for c in m["tool_calls"]))
        if m["role"] == "tool":
            content = json.loads(m["content"])
            found.append((m["tool_call_id"], str(content["ok"]), str(content["step"])))
    return found


def test_later_turns_may_reuse_call_ids_and_every_call_runs():
    """A model that sends `call_0` in every turn: every call runs (none is refused as a
    duplicate), the rewind refunds the charge, and the order commits once."""
    shop, tx, model = reused_ids_requests("truncate")
    assert shop.calls == [
        "lookup_customer",
        "lookup_customer",
        "charge",
        "reserve",
        "charge",
        "reserve",
        "send_confirmation",
    ]
    assert [(s.step_id, s.call_id) for s in tx.steps] == [
        (1, "call_0"),
        (2, "call_0"),
        (3, "call_1"),
        (4, "call_2"),
    ]
    assert not any("duplicate" in json.dumps(body) for body in model.requests)
    assert_order_committed_once(shop, tx)


def test_truncate_after_reuse_drops_only_the_voided_calls_of_a_reused_id():
    """The rewind voids steps 2 and 3, sent as `call_0` by turns 2 and 3: those calls and
    their results go; turn 1's `call_0` (step 1, still live) stays with its result."""
    _, _, model = reused_ids_requests("truncate")
    after_rewind = model.requests[3]["messages"]
    assert steps_and_calls(after_rewind) == [
        ("call_0",),
        ("call_0", "True", "1"),
        ("call_1",),
        ("call_1", "False", "4"),
    ]
    failed = json.loads(after_rewind[-1]["content"])
    assert failed["voided_steps"] == [2, 3]
    assert failed["note"].startswith("The rollback undid steps 2 and 3 (2 tool calls)")
    assert steps_and_calls(model.last["messages"])[4:] == [
        ("call_0", "call_1", "call_2"),
        ("call_0", "True", "2"),
        ("call_1", "True", "3"),
        ("call_2", "True", "4"),
    ]


def test_void_after_reuse_replaces_only_the_voided_results_of_a_reused_id():
    """history="void": the results of steps 2 and 3 (both `call_0`) are voided; turn 1's
    `call_0` result (step 1) keeps its output."""
    _, _, model = reused_ids_requests("void")
    tools = chat_tool_messages({"messages": model.requests[3]["messages"]})
    assert [(t["tool_call_id"], t["content"]["step"]) for t in tools] == [
        ("call_0", 1),
        ("call_0", 2),
        ("call_0", 3),
        ("call_1", 4),
    ]
    assert tools[0]["content"]["ok"] is True
    assert tools[0]["content"]["output"]["id"] == "c-1"
    assert [t["content"] for t in tools[1:3]] == [atx_openai_voided(2), atx_openai_voided(3)]


def test_responses_api_after_reuse_drops_only_the_voided_items():
    """The same conversation through the Responses API: after the rewind, turn 1's
    `call_0` item and its output stay; the voided `call_0` items of turns 2 and 3 go."""
    shop = Shop()
    tx = shop.transaction()
    model = ScriptedModel(reused_ids_script())
    client = model.openai()
    runner = atx_openai.ResponsesToolRunner(tx)
    items: Any = PROMPT[0]["content"]
    while True:
        response = client.responses.create(model=MODEL, input=items, tools=runner.tools)
        if not any(item.type == "function_call" for item in response.output):
            break
        items = runner.handle(items, response)
    outputs = responses_outputs(model.requests[3])
    assert [(o["call_id"], o["output"]["step"]) for o in outputs] == [("call_0", 1), ("call_1", 4)]
    calls = [i["call_id"] for i in model.requests[3]["input"] if i.get("type") == "function_call"]
    assert calls == ["call_0", "call_1"]
    assert_order_committed_once(shop, tx)
