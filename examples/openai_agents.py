"""An OpenAI Agents SDK agent whose tool calls run in an agenttx transaction, offline.

The agent places an order: it looks the customer up, charges the card, reserves stock and
emails a confirmation. Its first lookup uses an old email address, so the customer it finds has
a closed account; the reservation fails on that customer id. agenttx traces `customer_id` back
to the lookup (the root cause), rewinds there, refunds the charge, and tells the model which
steps were undone. The model looks the customer up again and finishes; the transaction commits
and only then is the one confirmation email sent.

The model is scripted (a mock HTTP transport plays its turns), so this runs without a key.
With a real key, drop `scripted_model()` and pass `model="gpt-5"` (or any model name) to the
`Agent`: the rest is the code you would write.

Run: `python examples/openai_agents.py` (needs `pip install 'agenttx[openai-agents]' httpx2`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import agents
import httpx2
import openai
from agents import Agent, OpenAIChatCompletionsModel, Runner

import agenttx
from agenttx.integrations import openai_agents as atx_agents

# ---------------------------------------------------------------------- the tools

CUSTOMERS = {
    "ada@example.com": {"id": "c-1", "email": "ada@example.com", "status": "active"},
    "ada@old.example": {"id": "c-old", "email": "ada@old.example", "status": "closed"},
}
charges: list[str] = []
refunds: list[str] = []
sent: list[dict[str, Any]] = []


@agenttx.tool
def lookup_customer(email: str) -> dict[str, str]:
    """Find a customer by email address.

    Args:
        email: The customer's email address.
    """
    customer = CUSTOMERS.get(email)
    if customer is None:
        raise agenttx.ToolError(f"no customer with email {email}", key="email")
    return customer


@agenttx.compensation(name="refund")
def refund(payload: dict[str, Any]) -> None:
    """Refund a charge (idempotent)."""
    charge_id = payload["output"]["charge_id"]
    if charge_id not in refunds:
        refunds.append(charge_id)


@agenttx.tool(compensate=refund)
def charge(customer_id: str, amount: int) -> dict[str, Any]:
    """Charge the customer's card.

    Args:
        customer_id: The customer's id, from lookup_customer.
        amount: The amount in pence.
    """
    charges.append(f"ch-{len(charges) + 1}")
    return {"charge_id": charges[-1], "customer_id": customer_id, "amount": amount}


@agenttx.tool
def reserve(customer_id: str, sku: str, quantity: int) -> dict[str, Any]:
    """Reserve stock for the customer's order.

    Args:
        customer_id: The customer's id, from lookup_customer.
        sku: The stock keeping unit.
        quantity: How many to reserve.
    """
    if customer_id != "c-1":
        raise agenttx.ToolError(f"customer {customer_id} has a closed account", key="customer_id")
    return {"reservation": "r-1", "sku": sku, "quantity": quantity}


@agenttx.tool
def send_confirmation(ctx: agenttx.ToolContext, email: str, order_id: str) -> dict[str, Any]:
    """Email the order confirmation (sent once, after the transaction commits).

    Args:
        email: Where to send the confirmation.
        order_id: The order's id.
    """
    ctx.stage_effect("email", {"to": email, "subject": f"Order {order_id}"})
    return {"queued": True}


def send_email(effect: agenttx.StagedEffect) -> None:
    """The effect dispatcher: agenttx calls it after the commit, once per staged email."""
    sent.append(effect.payload)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the scripted model

LOOKUP = '{"email": "%s"}'
ORDER_TURN = [
    ("charge", '{"customer_id": "${steps.1.id}", "amount": 4200}'),
    ("reserve", '{"customer_id": "${steps.1.id}", "sku": "SKU-1", "quantity": 2}'),
    ("send_confirmation", '{"email": "${steps.1.email}", "order_id": "o-1"}'),
]
TURNS: list[list[tuple[str, str]] | str] = [
    [("lookup_customer", LOOKUP % "ada@old.example")],
    ORDER_TURN,  # reserve fails: the customer from step 1 is closed
    [("lookup_customer", LOOKUP % "ada@example.com")],
    ORDER_TURN,
    "Order o-1 is placed; the confirmation goes to ada@example.com.",
]


def scripted_model() -> OpenAIChatCompletionsModel:
    """A chat-completions model whose answers are `TURNS`, played by a mock HTTP transport."""
    played = iter(TURNS)
    counter = iter(range(1, 100))
    seen: list[str] = []
    shown = {"tools": False, "rewind": False}

    def answer(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        results = {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}
        if not shown["tools"]:
            shown["tools"] = True
            print("model is offered:", [tool["function"]["name"] for tool in body["tools"]])
        dropped = [call_id for call_id in seen if call_id not in results]
        if dropped and not shown["rewind"]:
            shown["rewind"] = True
            print(f"  (rewound: the model no longer sees the undone call {', '.join(dropped)})")
        for call_id, content in results.items():  # what the model reads: the new tool results
            if call_id not in seen:
                seen.append(call_id)
                print(f"  {call_id} -> {content[:140]}")
        turn = next(played)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if isinstance(turn, str):
            message["content"] = turn
        else:
            message["tool_calls"] = [
                {
                    "id": f"call_{next(counter)}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
                for name, arguments in turn
            ]
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return httpx2.Response(
            200,
            json={
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [choice],
            },
        )

    client = openai.AsyncOpenAI(
        api_key="offline", http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
    )
    return OpenAIChatCompletionsModel(model="scripted", openai_client=client)


# ---------------------------------------------------------------------- the agent loop


async def main() -> None:
    agents.set_tracing_disabled(True)  # offline: no traces uploaded
    tools = [lookup_customer, charge, refund, reserve, send_confirmation]
    # The user-side code: a transaction, an agent with its tools, one run, the commit.
    tx = agenttx.Transaction(tools=tools, dispatcher=send_email)
    agent = Agent(
        name="shop",
        instructions=agenttx.prompt(tx),
        tools=atx_agents.function_tools(tx),
        model=scripted_model(),
    )
    result = await Runner.run(
        agent, "Order 2 of SKU-1 for Ada.", run_config=atx_agents.run_config(tx)
    )
    print("agent:", result.final_output)
    print("before commit: charges", charges, "refunds", refunds, "emails sent", len(sent))
    tx.commit()
    print("after commit: emails sent", sent)


if __name__ == "__main__":
    asyncio.run(main())
