"""A model proposes a whole plan; agenttx checks it, the model corrects it, then it runs.

Run it with `python examples/model_plan.py`. It needs `pip install 'agenttx[openai]' httpx2`
and no API key: the model is scripted, played to the real `openai` client through a mock HTTP
transport. With a key, `python examples/model_plan.py --live` sends the same loop to OpenAI
(`OPENAI_MODEL`, default gpt-4.1-mini); a real model may take another path.

The runner is made with `plans=True`, so the model is offered `propose_plan` beside the tools,
and the system prompt (`agenttx.prompt(tx, plans=True)`) teaches it the plan format. The
scripted model's first plan calls a tool that does not exist (`lookup_custmer`) and references
a node that does not exist (`${lokup.id}`). Nothing runs: the tool result lists every problem,
each with a "did you mean". The model sends the corrected plan; the charge and the reservation
run at the same time, the confirmation after both, and the model gets each node's output.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import httpx2
import openai

import agenttx
from agenttx.integrations.openai import ToolRunner

CUSTOMERS = {"ada@example.com": {"id": "c-1", "email": "ada@example.com", "status": "active"}}
REQUEST = "Order 2 x SKU-1 for Ada (ada@example.com) at 42 pence, as one plan."


# ---------------------------------------------------------------------- your tools


@agenttx.compensation(name="refund")
def refund(payload: dict[str, Any]) -> None:
    """Refund a charge: agenttx calls this if the plan fails after the charge."""
    print(f"    [payments] refund {payload['output']['charge_id']}")


@agenttx.tool
def lookup_customer(email: str) -> dict[str, Any]:
    """Find a customer by email address.

    Args:
        email: The customer's email address.
    """
    customer = CUSTOMERS.get(email)
    if customer is None:
        raise agenttx.ToolError(f"no customer with email {email!r}", key="email")
    return customer


@agenttx.tool(compensate=refund)
def charge(customer_id: str, amount: int) -> dict[str, Any]:
    """Charge the customer's card.

    Args:
        customer_id: The customer's id, from lookup_customer.
        amount: The amount in pence.
    """
    print(f"    [payments] charge ch-{customer_id}: {amount}p")
    return {"charge_id": f"ch-{customer_id}", "amount": amount}


@agenttx.tool
def reserve(customer_id: str, sku: str, quantity: int) -> dict[str, Any]:
    """Reserve stock for an order.

    Args:
        customer_id: The customer's id, from lookup_customer.
        sku: The stock keeping unit.
        quantity: How many to reserve.
    """
    print(f"    [warehouse] reserve {quantity} x {sku} for {customer_id}")
    return {"reservation": f"r-{sku}-{quantity}"}


@agenttx.tool
def send_confirmation(ctx: agenttx.ToolContext, email: str, order_id: str) -> dict[str, Any]:
    """Email the order confirmation (sent once the plan commits).

    Args:
        email: Where to send it.
        order_id: The order's id.
    """
    ctx.stage_effect("email", {"to": email, "subject": f"Order {order_id} confirmed"})
    return {"queued": True}


def send_email(effect: agenttx.StagedEffect) -> None:
    """The effect dispatcher: runs once per staged email, after the plan commits."""
    email = effect.payload
    assert isinstance(email, dict)
    print(f"    [email] to {email['to']}: {email['subject']}")


TOOLS = [lookup_customer, charge, reserve, send_confirmation, refund]


# ---------------------------------------------------------------------- the loop you write


def run_order(client: openai.OpenAI, model: str) -> agenttx.Transaction:
    """The agent loop, with plans: `plans=True` on the runner and in the prompt."""
    tx = agenttx.Transaction(tools=TOOLS, dispatcher=send_email)
    messages: list[Any] = [
        {"role": "system", "content": agenttx.prompt(tx, plans=True)},
        {"role": "user", "content": REQUEST},
    ]
    runner = ToolRunner(tx, plans=True)
    while True:
        reply = client.chat.completions.create(model=model, messages=messages, tools=runner.tools)
        if not reply.choices[0].message.tool_calls:
            break
        messages = runner.handle(messages, reply.choices[0].message)
    tx.commit()
    return tx


# ---------------------------------------------------------------------- the scripted model


def order_plan(lookup_tool: str, customer: str) -> dict[str, Any]:
    """The plan the scripted model proposes (with a wrong tool and node name at first)."""
    ref = f"${{{customer}.id}}"
    return {
        "nodes": [
            {"id": "lookup", "tool": lookup_tool, "inputs": {"email": "ada@example.com"}},
            {"id": "pay", "tool": "charge", "inputs": {"customer_id": ref, "amount": 42}},
            {
                "id": "hold",
                "tool": "reserve",
                "inputs": {"customer_id": ref, "sku": "SKU-1", "quantity": 2},
            },
            {
                "id": "confirm",
                "tool": "send_confirmation",
                "inputs": {"email": "${lookup.email}", "order_id": "o-1"},
                "after": ["pay", "hold"],
            },
        ]
    }


def scripted_client() -> openai.OpenAI:
    """A real OpenAI client whose HTTP transport plays back a scripted model, turn by turn."""
    turns: list[Any] = [
        order_plan("lookup_custmer", "lokup"),
        order_plan("lookup_customer", "lookup"),
        "Order o-1 is placed: charged, reserved, and the confirmation is on its way.",
    ]
    ids = iter(range(1, 100))

    def handler(request: httpx2.Request) -> httpx2.Response:
        messages = json.loads(request.content)["messages"]
        if messages[-1]["role"] == "tool":  # the answer to the model's last plan
            print(f"  result: {json.dumps(json.loads(messages[-1]['content']), indent=2)}")
        turn = turns.pop(0)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if isinstance(turn, str):
            message["content"] = turn
            print(f"model: {turn}")
        else:
            names = ", ".join(node["tool"] for node in turn["nodes"])
            print(f"model: propose_plan({len(turn['nodes'])} nodes: {names})")
            message["tool_calls"] = [
                {
                    "id": f"call_{next(ids)}",
                    "type": "function",
                    "function": {"name": "propose_plan", "arguments": json.dumps(turn)},
                }
            ]
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return httpx2.Response(
            200,
            json={
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": "scripted",
                "choices": [choice],
            },
        )

    transport = httpx2.MockTransport(handler)
    return openai.OpenAI(api_key="offline", http_client=httpx2.Client(transport=transport))


if __name__ == "__main__":
    if "--live" in sys.argv:
        tx = run_order(openai.OpenAI(), os.environ.get("OPENAI_MODEL", "gpt-4.1-mini"))
    else:
        tx = run_order(scripted_client(), "scripted")
    print(f"transaction {tx.status.value.lower()}, {tx.view().steps_completed} steps")
