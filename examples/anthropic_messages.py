"""An Anthropic Messages agent loop with agenttx: tools, a rewind, a refund, one email.

Run it with `python examples/anthropic_messages.py`. It needs
`pip install 'agenttx[anthropic]' httpx2` and no API key: the model is scripted, played to the
real `anthropic` client through a mock HTTP transport. With a key,
`python examples/anthropic_messages.py --live` sends the same loop to Anthropic
(`ANTHROPIC_MODEL`, default claude-sonnet-4-5); a real model may take another path.

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

import anthropic
import httpx2

import agenttx
from agenttx.integrations.anthropic import ToolRunner

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


def run_order(client: anthropic.Anthropic, model: str) -> agenttx.Transaction:
    """The agent loop: six lines between the first message and the commit."""
    tx = agenttx.Transaction(tools=TOOLS, dispatcher=send_email)
    system = agenttx.prompt(tx)
    messages: list[Any] = [{"role": "user", "content": REQUEST}]
    runner = ToolRunner(tx)
    while True:
        reply = client.messages.create(
            model=model, max_tokens=1024, system=system, messages=messages, tools=runner.tools
        )
        if reply.stop_reason != "tool_use":
            break
        messages = runner.handle(messages, reply)
    tx.commit()
    return tx


# ---------------------------------------------------------------------- the scripted model


def scripted_client() -> anthropic.Anthropic:
    """A real Anthropic client whose HTTP transport plays back a scripted model, turn by turn."""
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
        last = json.loads(request.content)["messages"][-1]
        for block in last["content"] if isinstance(last["content"], list) else ():
            if block["type"] == "tool_result":  # the results of the model's last turn
                flag = " (is_error)" if block["is_error"] else ""
                print(f"  result{flag}: {block['content']}")
        turn = turns.pop(0)
        if isinstance(turn, str):
            print(f"model: {turn}")
            content: list[dict[str, Any]] = [{"type": "text", "text": turn}]
        else:
            print("model: " + ", ".join(f"{name}({json.dumps(args)})" for name, args in turn))
            content = [
                {"type": "tool_use", "id": f"toolu_{next(ids)}", "name": name, "input": arguments}
                for name, arguments in turn
            ]
        message = {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "model": "scripted",
            "content": content,
            "stop_reason": "end_turn" if isinstance(turn, str) else "tool_use",
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return httpx2.Response(200, json=message)

    transport = httpx2.MockTransport(handler)
    return anthropic.Anthropic(api_key="offline", http_client=httpx2.Client(transport=transport))


if __name__ == "__main__":
    if "--live" in sys.argv:
        model = os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-5")
        tx = run_order(anthropic.Anthropic(), model)
    else:
        tx = run_order(scripted_client(), "scripted")
    print(f"transaction {tx.status.value.lower()}")
