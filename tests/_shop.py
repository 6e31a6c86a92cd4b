"""The order workflow the integration tests share: a small shop behind four agenttx tools.

`Shop()` is one isolated world (customers, charges, refunds, reservations, delivered emails);
`shop.tools` are its agenttx tools and compensation, `shop.transaction()` a transaction over
them whose staged effects go to `shop.deliver` (an in-memory dispatcher that records them).

The workflow every integration test drives (`ORDER` holds the values):

1. `lookup_customer(email)`: with `OLD_EMAIL` it returns customer `c-old`, whose account is
   closed (the bad data); with `EMAIL` it returns the active customer `c-1`.
2. `charge(customer_id, amount)`: records a charge; its compensation `refund` records a refund.
3. `reserve(customer_id, sku, quantity)`: fails for a closed account with
   `ToolError(..., key="customer_id")`, so agenttx traces `customer_id` back to step 1 (the
   root cause), rewinds there and refunds the charge.
4. `send_confirmation(customer_id, email, order_id)`: stages an email (`ctx.stage_effect`),
   delivered once, after the commit.

`happy_calls()` and `bad_calls()` are the calls of that workflow as `(name, arguments)` pairs,
with the customer id passed as a `${steps.1.id}` reference (the way agenttx's prompt teaches).
`order_plan()` is the workflow as a plan a model proposes (`propose_plan`), `BAD_PLAN` one
with a wrong tool name and a bad reference, and the two `assert_*` helpers check the answers.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Final

import agenttx

if TYPE_CHECKING:
    from collections.abc import Iterator

EMAIL: Final = "ada@example.com"
OLD_EMAIL: Final = "ada@old.example"
ORDER: Final = {"sku": "SKU-1", "quantity": 2, "amount": 42, "order_id": "o-1"}

CUSTOMERS: Final[dict[str, dict[str, Any]]] = {
    EMAIL: {"id": "c-1", "name": "Ada", "email": EMAIL, "status": "active"},
    OLD_EMAIL: {"id": "c-old", "name": "Ada", "email": OLD_EMAIL, "status": "closed"},
}

TOOL_NAMES: Final = ("lookup_customer", "charge", "reserve", "send_confirmation")


class Shop:
    """One isolated shop: its tools, what they did, and the emails delivered after commit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.charges: list[dict[str, Any]] = []
        self.refunds: list[str] = []
        self.reservations: list[dict[str, Any]] = []
        self.delivered: list[agenttx.StagedEffect] = []
        self.calls: list[str] = []  # tool names, in the order the tools ran
        self.tools = self._build()

    # ------------------------------------------------------------------ the world

    @property
    def live_charges(self) -> list[str]:
        """Charge ids charged and not refunded."""
        return [c["charge_id"] for c in self.charges if c["charge_id"] not in self.refunds]

    def deliver(self, effect: agenttx.StagedEffect, /) -> None:
        """The effect dispatcher: records each delivered effect (after commit)."""
        with self._lock:
            self.delivered.append(effect)

    def transaction(self, **options: Any) -> agenttx.Transaction:
        """A transaction over the shop's tools that delivers its effects to `deliver`."""
        return agenttx.Transaction(tools=self.tools, dispatcher=self.deliver, **options)

    # ------------------------------------------------------------------ the tools

    def _build(self) -> list[agenttx.ToolLike]:
        shop = self

        @agenttx.compensation(name="refund")
        def refund(payload: dict[str, Any]) -> None:
            """Refund a charge (idempotent on the charge id)."""
            charge_id = payload["output"]["charge_id"]
            with shop._lock:
                if charge_id not in shop.refunds:
                    shop.refunds.append(charge_id)

        @agenttx.tool
        def lookup_customer(email: str) -> dict[str, Any]:
            """Find a customer by email address.

            Args:
                email: The customer's email address.
            """
            shop.calls.append("lookup_customer")
            customer = CUSTOMERS.get(email.strip().lower())
            if customer is None:
                raise agenttx.ToolError(f"no customer with email {email!r}", key="email")
            return dict(customer)

        @agenttx.tool(compensate=refund)
        def charge(customer_id: str, amount: int) -> dict[str, Any]:
            """Charge the customer's card.

            Args:
                customer_id: The customer's id, from lookup_customer.
                amount: The amount in pence.
            """
            shop.calls.append("charge")
            with shop._lock:
                charge_id = f"ch-{len(shop.charges) + 1}"
                shop.charges.append(
                    {"charge_id": charge_id, "customer_id": customer_id, "amount": amount}
                )
            return {"charge_id": charge_id, "amount": amount}

        @agenttx.tool
        def reserve(customer_id: str, sku: str, quantity: int) -> dict[str, Any]:
            """Reserve stock for the customer's order.

            Args:
                customer_id: The customer's id, from lookup_customer.
                sku: The stock keeping unit.
                quantity: How many to reserve.
            """
            shop.calls.append("reserve")
            customer = next((c for c in CUSTOMERS.values() if c["id"] == customer_id), None)
            if customer is None or customer["status"] != "active":
                raise agenttx.ToolError(
                    f"customer {customer_id} has a closed account; "
                    "look the customer up by their current email",
                    key="customer_id",
                )
            with shop._lock:
                shop.reservations.append(
                    {"customer_id": customer_id, "sku": sku, "quantity": quantity}
                )
            return {"reservation_id": f"r-{len(shop.reservations)}", "sku": sku}

        @agenttx.tool
        def send_confirmation(
            ctx: agenttx.ToolContext, customer_id: str, email: str, order_id: str
        ) -> dict[str, Any]:
            """Email the order confirmation (sent once, after the transaction commits).

            Args:
                customer_id: The customer's id, from lookup_customer.
                email: Where to send the confirmation.
                order_id: The order's id.
            """
            shop.calls.append("send_confirmation")
            key = ctx.stage_effect(
                "email",
                {"to": email, "customer_id": customer_id, "subject": f"Order {order_id}"},
            )
            return {"queued": True, "idempotency_key": key}

        return [lookup_customer, charge, reserve, send_confirmation, refund]


def _calls(email: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "lookup_customer", {"email": email}
    yield "charge", {"customer_id": "${steps.1.id}", "amount": ORDER["amount"]}
    yield "reserve", {"customer_id": "${steps.1.id}", "sku": ORDER["sku"], "quantity": 2}
    yield (
        "send_confirmation",
        {"customer_id": "${steps.1.id}", "email": "${steps.1.email}", "order_id": "o-1"},
    )


def happy_calls() -> list[tuple[str, dict[str, Any]]]:
    """The four calls of the workflow with the customer's current email: all succeed."""
    return list(_calls(EMAIL))


def bad_calls() -> list[tuple[str, dict[str, Any]]]:
    """The workflow with the old email: step 3 (`reserve`) fails, its root cause is step 1."""
    return list(_calls(OLD_EMAIL))


# ---------------------------------------------------------------------- a model's plan


def order_plan(*, lookup_tool: str = "lookup_customer", customer: str = "lookup") -> dict[str, Any]:
    """The order workflow as a plan a model proposes; `lookup_tool` and `customer` (the node
    the charge and the reservation take the customer id from) let a script get them wrong."""
    ref = f"${{{customer}.id}}"
    return {
        "nodes": [
            {"id": "lookup", "tool": lookup_tool, "inputs": {"email": EMAIL}},
            {"id": "pay", "tool": "charge", "inputs": {"customer_id": ref, "amount": 42}},
            {
                "id": "hold",
                "tool": "reserve",
                "inputs": {"customer_id": ref, "sku": "SKU-1", "quantity": 2},
            },
            {
                "id": "confirm",
                "tool": "send_confirmation",
                "inputs": {"customer_id": ref, "email": "${lookup.email}", "order_id": "o-1"},
                "after": ["pay", "hold"],
            },
        ]
    }


BAD_PLAN = order_plan(lookup_tool="lookup_custmer", customer="lokup")


def assert_refused_with_every_problem(payload: dict[str, Any]) -> None:
    """The answer to BAD_PLAN: refused, every problem listed with its "did you mean"."""
    assert payload["ok"] is False
    assert payload["plan"] == "REFUSED"
    assert payload["step"] is None
    assert payload["next_step"] == 1  # no step was used
    problems = payload["problems"]
    assert problems[0] == (
        "UNKNOWN_TOOL lookup: node `lookup` calls tool `lookup_custmer`, which is not "
        "registered (did you mean `lookup_customer`?)."
    )
    unknown = [p for p in problems if p.startswith("UNKNOWN_NODE lokup:")]
    assert len(unknown) == 3  # pay, hold and confirm each name the node that is not there
    assert all("(did you mean `lookup`?)" in p for p in unknown)
    assert len(problems) == 4
    assert "propose_plan" in payload["instruction"]


def assert_plan_ran(payload: dict[str, Any], shop: Shop) -> None:
    """The answer to the corrected plan: it ran, each node's output is there."""
    assert payload["ok"] is True
    assert payload["plan"] == "SUCCEEDED"
    assert payload["nodes"]["lookup"] == {
        "tool": "lookup_customer",
        "state": "SUCCEEDED",
        "output": CUSTOMER_ADA,
    }
    assert payload["nodes"]["pay"]["output"] == {"charge_id": "ch-1", "amount": 42}
    assert payload["nodes"]["confirm"]["state"] == "SUCCEEDED"
    assert payload["next_step"] == 1
    assert sorted(shop.calls) == sorted(TOOL_NAMES)  # each tool ran once
    assert shop.live_charges == ["ch-1"]
    assert [e.payload["subject"] for e in shop.delivered] == ["Order o-1"]  # the plan committed


CUSTOMER_ADA = {"id": "c-1", "name": "Ada", "email": EMAIL, "status": "active"}
