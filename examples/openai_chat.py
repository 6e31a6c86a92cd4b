"""An OpenAI chat-completions agent loop with agenttx: tools, a rewind, a refund, one email.

Run it with `python examples/openai_chat.py`. It needs `pip install 'agenttx[openai]' httpx2`
and no API key: the model is scripted, played to the real `openai` client through a mock HTTP
transport. With a key, `python examples/openai_chat.py --live` sends the same loop to OpenAI
(`OPENAI_MODEL`, default gpt-4.1-mini); a real model may take another path.

The scripted model looks the customer up by an old email address (step 1: a closed account),
charges the card (step 2) and reserves stock (step 3). The reservation fails on `customer_id`;
agenttx traces that value back to step 1, rewinds there and refunds the charge. The model,
told what happened, looks the customer up again, charges, reserves, and stages the
confirmation email, which is sent once, after the commit. The loop you write is `run_order`.
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

CUSTOMERS = {
    "ada@old.example": {"id": "c-old", "email": "ada@old.example", "status": "closed"},
    "ada@example.com": {"id": "c-1", "email": "ada@example.com", "status": "active"},
}
REQUEST = "Order 2 x SKU-1 for Ada (ada@example.com, once ada@old.example) at 42 pence."


# ---------------------------------------------------------------------- your tools


@agenttx.compensation(name="refund")
def refund(payload: dict[str, Any]) -> None:
    """Refund a charge: agenttx calls this when a rewind undoes the charge."""
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
    charge_id = f"ch-{customer_id}"
    print(f"    [payments] charge {charge_id}: {amount}p")
    return {"charge_id": charge_id, "amount": amount}


@agenttx.tool
def reserve(customer_id: str, sku: str, quantity: int) -> dict[str, Any]:
    """Reserve stock for an order.

    Args:
        customer_id: The customer's id, from lookup_customer.
        sku: The stock keeping unit.
        quantity: How many to reserve.
    """
    if customer_id != "c-1":
        raise agenttx.ToolError(f"customer {customer_id} has a closed account", key="customer_id")
    return {"reservation": f"r-{sku}-{quantity}"}


@agenttx.tool
def send_confirmation(ctx: agenttx.ToolContext, email: str, order_id: str) -> dict[str, Any]:
    """Email the order confirmation (sent after the order commits).

    Args:
        email: Where to send it.
        order_id: The order's id.
    """
    ctx.stage_effect("email", {"to": email, "subject": f"Order {order_id} confirmed"})
    return {"queued": True}


def send_email(effect: agenttx.StagedEffect) -> None:
    """The effect dispatcher: runs once per staged email, after the commit."""
    email = effect.payload
    assert isinstance(email, dict)
    print(f"    [email] to {email['to']}: {email['subject']}")


TOOLS = [lookup_customer, charge, reserve, send_confirmation, refund]


# ---------------------------------------------------------------------- the loop you write


def run_order(client: openai.OpenAI, model: str) -> agenttx.Transaction:
    """The agent loop: six lines between the first message and the commit."""
    tx = agenttx.Transaction(tools=TOOLS, dispatcher=send_email)
    messages: list[Any] = [
        {"role": "system", "content": agenttx.prompt(tx)},
        {"role": "user", "content": REQUEST},
    ]
    runner = ToolRunner(tx)
    while True:
        reply = client.chat.completions.create(model=model, messages=messages, tools=runner.tools)
        if not reply.choices[0].message.tool_calls:
            break
        messages = runner.handle(messages, reply.choices[0].message)
    tx.commit()
    return tx


# ---------------------------------------------------------------------- the scripted model


def scripted_client() -> openai.OpenAI:
    """A real OpenAI client whose HTTP transport plays back a scripted model, turn by turn."""
    customer = "${steps.1.id}"
    turns = [
        [("lookup_customer", {"email": "ada@old.example"})],
        [
            ("charge", {"customer_id": customer, "amount": 42}),
            ("reserve", {"customer_id": customer, "sku": "SKU-1", "quantity": 2}),
        ],
        [("lookup_customer", {"email": "ada@example.com"})],
        [
            ("charge", {"customer_id": customer, "amount": 42}),
            ("reserve", {"customer_id": customer, "sku": "SKU-1", "quantity": 2}),
            ("send_confirmation", {"email": "${steps.1.email}", "order_id": "o-1"}),
        ],
        "Order o-1 is placed; the confirmation email goes out now.",
    ]
    ids = iter(range(1, 100))

    def handler(request: httpx2.Request) -> httpx2.Response:
        messages = json.loads(request.content)["messages"]
        results = []
        while messages[-1]["role"] == "tool":  # the results of the model's last turn
            results.insert(0, messages.pop()["content"])
        for result in results:
            print(f"  result: {result}")
        turn = turns.pop(0)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if isinstance(turn, str):
            message["content"] = turn
            print(f"model: {turn}")
        else:
            print("model: " + ", ".join(f"{name}({json.dumps(args)})" for name, args in turn))
            message["tool_calls"] = [
                {
                    "id": f"call_{next(ids)}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
                for name, arguments in turn
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
    print(f"transaction {tx.status.value.lower()}")
