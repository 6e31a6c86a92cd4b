"""The order workflow as a plan: typed tools and the plan the plan tests start from.

Initial inputs: `customer_email`, `sku`, `quantity`, `order_id`, `currency`.
`customer_lookup` and `stock_check` can run together; `reserve` waits for both and holds the
exclusive resource `order:${initial.order_id}`; `confirm` waits for `reserve` (business order).
The return types are `TypedDict`s and the ids `NewType`s, so validation can check them.
"""

from __future__ import annotations

from typing import Any, NewType, TypedDict

import agenttx

CustomerId = NewType("CustomerId", str)
WarehouseId = NewType("WarehouseId", str)
ReservationId = NewType("ReservationId", str)

INITIAL = ("customer_email", "sku", "quantity", "order_id", "currency")


class Customer(TypedDict):
    """What `lookup_customer` returns."""

    customer_id: CustomerId
    account_status: str


class Stock(TypedDict):
    """What `check_stock` returns."""

    warehouse_id: WarehouseId
    available: int


class Reservation(TypedDict):
    """What `reserve_stock` returns."""

    reservation_id: ReservationId
    quantity: int


@agenttx.compensation
def release_reservation(payload: dict[str, Any]) -> None:
    """Undo a reservation (does nothing here)."""
    del payload


@agenttx.tool
def lookup_customer(email: str) -> Customer:
    """Find the customer with this email."""
    return Customer(customer_id=CustomerId(f"c-{email}"), account_status="active")


@agenttx.tool
def check_stock(sku: str) -> Stock:
    """Find a warehouse holding `sku`."""
    return Stock(warehouse_id=WarehouseId(f"w-{sku}"), available=10)


@agenttx.tool(compensate=release_reservation)
def reserve_stock(customer_id: CustomerId, warehouse_id: WarehouseId, quantity: int) -> Reservation:
    """Reserve `quantity` items for the customer."""
    return Reservation(
        reservation_id=ReservationId(f"r-{customer_id}-{warehouse_id}"), quantity=quantity
    )


@agenttx.tool
def send_confirmation(
    order_id: str, customer_id: CustomerId, currency: str = "GBP"
) -> dict[str, Any]:
    """Send the order confirmation."""
    return {"order_id": order_id, "customer_id": customer_id, "currency": currency}


TOOLS = [lookup_customer, check_stock, reserve_stock, send_confirmation]


def nodes(**changes: dict[str, Any]) -> list[agenttx.Node]:
    """The order workflow's nodes; `changes[node_id]` replaces fields of that node."""
    fields: dict[str, dict[str, Any]] = {
        "customer_lookup": {
            "tool": "lookup_customer",
            "inputs": {"email": "${initial.customer_email}"},
        },
        "stock_check": {"tool": "check_stock", "inputs": {"sku": "${initial.sku}"}},
        "reserve": {
            "tool": "reserve_stock",
            "inputs": {
                "customer_id": "${customer_lookup.customer_id}",
                "warehouse_id": "${stock_check.warehouse_id}",
                "quantity": "${initial.quantity}",
            },
            "exclusive_resource": "order:${initial.order_id}",
        },
        "confirm": {
            "tool": "send_confirmation",
            "inputs": {
                "order_id": "${initial.order_id}",
                "customer_id": "${customer_lookup.customer_id}",
                "currency": "${initial.currency}",
            },
            "after": ["reserve"],
        },
    }
    for node_id, change in changes.items():
        fields[node_id] = {**fields[node_id], **change}
    return [agenttx.Node(node_id, **node) for node_id, node in fields.items()]


def plan(**changes: dict[str, Any]) -> agenttx.Plan:
    """The order workflow's plan, with `changes` applied (see `nodes`)."""
    return agenttx.Plan(nodes=nodes(**changes), initial=INITIAL)
