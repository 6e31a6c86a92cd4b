"""Run the order workflow as a plan: validated before anything runs, then run concurrently.

Run it with `python examples/order_plan.py`. An agent proposes the whole order workflow at once
as a `Plan`: look the customer up and check the stock together, reserve the stock once both are
known (holding the exclusive resource `order:{order_id}`), then send the confirmation.

The script first validates two broken versions of the plan and prints what `validate` reports:
a warehouse id fed into a customer id (`typing.NewType`s are semantic types) and a cycle. It
then runs the valid plan: the stock service fails once with a transient error, the node is
retried under the same idempotency key, and the run's metrics and its cost in GBP are printed.
Last, the same plan runs for an order whose confirmation is refused: the run fails and the
reservation is released by its compensation. The cost per completed workflow counts both runs.
"""

from __future__ import annotations

from decimal import Decimal
from typing import NewType, TypedDict

import agenttx

CustomerId = NewType("CustomerId", str)
WarehouseId = NewType("WarehouseId", str)


class Customer(TypedDict):
    """What `lookup_customer` returns."""

    customer_id: CustomerId
    name: str


class Stock(TypedDict):
    """What `check_stock` returns."""

    warehouse_id: WarehouseId
    available: int


class Reservation(TypedDict):
    """What `reserve_stock` returns."""

    reservation_id: str


class Confirmation(TypedDict):
    """What `send_confirmation` returns."""

    message_id: str


stock_calls: list[str] = []  # the idempotency key of each call of `check_stock`


@agenttx.tool
def lookup_customer(ctx: agenttx.ToolContext, email: str) -> Customer:
    """Find the customer by email (a model call resolves fuzzy addresses: it has a cost)."""
    ctx.add_cost(Decimal("0.0021"), category="model")
    name = email.split("@", 1)[0]
    return {"customer_id": CustomerId(f"c-{name}"), "name": name.title()}


@agenttx.tool
def check_stock(ctx: agenttx.ToolContext, sku: str) -> Stock:
    """Find a warehouse that holds the SKU; the inventory service is flaky."""
    stock_calls.append(ctx.idempotency_key)
    ctx.add_cost(Decimal("0.0005"), category="tool")
    if len(stock_calls) == 1:
        raise agenttx.ToolError("inventory service unavailable (HTTP 503)", transient=True)
    return {"warehouse_id": WarehouseId(f"wh-leeds-{sku.lower()}"), "available": 7}


@agenttx.compensation(name="release_reservation")
def release_reservation(payload: dict[str, dict[str, str]]) -> None:
    """Undo `reserve_stock`: called with the node's arguments and output."""
    print(f"  [warehouse] released {payload['output']['reservation_id']}")


@agenttx.tool
def reserve_stock(
    ctx: agenttx.ToolContext, customer_id: CustomerId, warehouse_id: WarehouseId, quantity: int
) -> Reservation:
    """Reserve `quantity` items in the warehouse for the customer."""
    ctx.add_cost(Decimal("0.01"), category="infrastructure")
    reservation = f"res-{customer_id}-{warehouse_id}-{quantity}"
    print(f"  [warehouse] reserved {reservation}")
    return {"reservation_id": reservation}


@agenttx.tool
def send_confirmation(order_id: str, email: str) -> Confirmation:
    """Email the confirmation (after the reservation: business order, no value flows)."""
    if email.endswith(".invalid"):
        raise agenttx.ToolError(f"mailbox {email} does not exist", key="email")
    return {"message_id": f"msg-{order_id}"}


TOOLS = [lookup_customer, check_stock, reserve_stock, send_confirmation, release_reservation]
INITIAL = ["customer_email", "sku", "quantity", "order_id", "currency"]


def order_plan(*, swap_ids: bool = False, lookup_after: tuple[str, ...] = ()) -> agenttx.Plan:
    """The order workflow; the keyword arguments break it for the validation demo."""
    ids = {
        "customer_id": "${customer_lookup.customer_id}",
        "warehouse_id": "${stock_check.warehouse_id}",
    }
    if swap_ids:
        ids = {"customer_id": ids["warehouse_id"], "warehouse_id": ids["customer_id"]}
    return agenttx.Plan(
        nodes=[
            agenttx.Node(
                "customer_lookup",
                tool="lookup_customer",
                inputs={"email": "${initial.customer_email}"},
                after=lookup_after,
            ),
            agenttx.Node(
                "stock_check", tool="check_stock", inputs={"sku": "${initial.sku}"}, retries=2
            ),
            agenttx.Node(
                "reserve",
                tool="reserve_stock",
                inputs={**ids, "quantity": "${initial.quantity}"},
                exclusive_resource="order:${initial.order_id}",
                compensate="release_reservation",
            ),
            agenttx.Node(
                "confirm",
                tool="send_confirmation",
                inputs={"order_id": "${initial.order_id}", "email": "${initial.customer_email}"},
                after=["reserve"],
            ),
        ],
        initial=INITIAL,
    )


def show_problems(title: str, plan: agenttx.Plan) -> None:
    """Print what validation finds, and that `run_plan` refuses the plan before any call."""
    print(title)
    for problem in plan.validate(TOOLS):
        print(f"  {problem.code.value} {problem.subject}: {problem.message}")
    try:
        agenttx.run_plan(plan, tools=TOOLS, initial=order("o-0", "ada@example.com"))
    except agenttx.PlanValidationError as error:
        print(f"  run_plan refused it: {len(error.problems)} problem(s), no tool ran")


def order(order_id: str, email: str) -> dict[str, agenttx.JSONValue]:
    """The initial values of one order."""
    return {
        "customer_email": email,
        "sku": "SKU-42",
        "quantity": 2,
        "order_id": order_id,
        "currency": "GBP",
    }


def show_run(result: agenttx.PlanResult) -> None:
    """Print each node's end, the metrics and the cost of one run."""
    print(f"  status: {result.status.value}")
    for node_id, node in result.nodes.items():
        error = f" ({node.error.text})" if node.error is not None else ""
        print(f"  {node_id}: {node.state.value}, {node.attempts} attempt(s){error}")
    metrics = result.metrics
    print(
        f"  makespan {metrics.makespan_s * 1000:.0f} ms, critical path"
        f" {metrics.critical_path_s * 1000:.0f} ms ({' -> '.join(metrics.critical_path)}),"
        f" parallelism {metrics.parallelism:.2f}, retries {metrics.retries}"
    )
    cost = metrics.cost
    print(
        f"  cost: {cost.total} {cost.currency} (model {cost.model}, tool {cost.tool},"
        f" infrastructure {cost.infrastructure}, retry {cost.retry})"
    )


def main() -> None:
    """Validate two broken plans, run the valid one, then run one that fails and compensates."""
    show_problems("the warehouse and customer ids swapped:", order_plan(swap_ids=True))
    show_problems("a cycle:", order_plan(lookup_after=("reserve",)))

    plan = order_plan()
    assert plan.validate(TOOLS) == ()
    print(f"\nthe valid plan (version {plan.version[:12]}) runs:")
    done = agenttx.run_plan(plan, tools=TOOLS, initial=order("o-1", "ada@example.com"))
    show_run(done)
    for event in done.audit:
        if event.kind is agenttx.EventKind.RETRIED:
            print(f"  {event.node} attempt {event.data['number']} retried: {event.data['hint']}")
    keys = sorted(set(stock_calls))
    print(f"  check_stock ran {len(stock_calls)} times, idempotency key(s): {keys}")

    print("\nan order whose confirmation is refused:")
    failed = agenttx.run_plan(plan, tools=TOOLS, initial=order("o-2", "bob@example.invalid"))
    show_run(failed)
    for outcome in failed.compensations:
        print(f"  compensation {outcome.kind} of {outcome.node_id}: {outcome.status.value}")

    per_order = agenttx.cost_per_completed_workflow([done, failed])
    print(f"\ncost per completed workflow over both runs: {per_order} GBP")


if __name__ == "__main__":
    main()
