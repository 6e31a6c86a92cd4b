"""agenttx.integrations.mcp: the tools of a real MCP server (in memory) as agenttx tools."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
from typing import TYPE_CHECKING, Any

import pytest
from mcp import Client
from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError as MCPToolError
from mcp.types import ListToolsResult
from mcp.types import Tool as MCPTool
from pydantic import BaseModel

import agenttx
from _shop import EMAIL, OLD_EMAIL, ORDER
from agenttx.integrations import mcp as mcp_integration
from agenttx.integrations.mcp import share_errors, tools_from_mcp

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

CUSTOMERS = {
    EMAIL: {"id": "c-1", "email": EMAIL, "status": "active"},
    OLD_EMAIL: {"id": "c-old", "email": OLD_EMAIL, "status": "closed"},
}


class Charged(BaseModel):
    """A charge, as the server returns it (structured content)."""

    charge_id: str
    amount: int


class Address(BaseModel):
    """A postal address: the schema holds it under `$defs`."""

    city: str
    postcode: str


class ShopServer:
    """An MCP server for the order workflow, and what its tools did."""

    def __init__(self) -> None:
        self.charges: list[str] = []
        self.refunds: list[str] = []
        self.reservations: list[str] = []
        self.calls: list[str] = []
        server = self.server = MCPServer("shop")

        @server.tool(name="customers.lookup")
        def lookup_customer(email: str) -> dict[str, Any]:
            """Find a customer by email address."""
            self.calls.append("customers.lookup")
            customer = CUSTOMERS.get(email)
            if customer is None:
                raise MCPToolError(f"no customer with email {email!r}")
            return dict(customer)

        @server.tool()
        def charge(customer_id: str, amount: int) -> Charged:
            """Charge the customer's card, in pence."""
            self.calls.append("charge")
            charge_id = f"ch-{len(self.charges) + 1}"
            self.charges.append(charge_id)
            return Charged(charge_id=charge_id, amount=amount)

        @server.tool()
        def refund(charge_id: str) -> str:
            """Refund a charge (idempotent)."""
            self.calls.append("refund")
            if charge_id not in self.charges:
                raise MCPToolError(f"no charge {charge_id}")
            if charge_id not in self.refunds:
                self.refunds.append(charge_id)
            return f"refunded {charge_id}"

        @server.tool()
        def reserve(customer_id: str, sku: str, quantity: int) -> dict[str, Any]:
            """Reserve stock for the customer's order."""
            self.calls.append("reserve")
            if CUSTOMERS[EMAIL]["id"] != customer_id:
                raise MCPToolError(
                    'insert or update on table "reservations" violates foreign key constraint '
                    '"reservations_customer_id_fkey"\nDETAIL: Key (customer_id)=('
                    f'{customer_id}) is not present in table "active_customers".'
                )
            self.reservations.append(sku)
            return {"reservation_id": f"r-{len(self.reservations)}", "quantity": quantity}

        @server.tool()
        def ship(address: Address, gift: bool = False) -> str:
            """Ship to an address."""
            return f"shipping to {address.city}{' as a gift' if gift else ''}"


def run(test: Callable[[Client, ShopServer], Awaitable[None]]) -> ShopServer:
    """Run `test` against a fresh server, through the SDK's in-memory client-server transport."""
    shop = ShopServer()

    async def main() -> None:
        async with Client(shop.server) as client:
            await test(client, shop)

    asyncio.run(main())
    return shop


def confirmation_tool(delivered: list[agenttx.StagedEffect]) -> agenttx.Tool[Any, Any]:
    """A local agenttx tool next to the MCP ones: it stages the confirmation email."""

    @agenttx.tool
    def send_confirmation(ctx: agenttx.ToolContext, email: str, order_id: str) -> str:
        """Email the order confirmation (sent after commit)."""
        return ctx.stage_effect("email", {"to": email, "order_id": order_id})

    return send_confirmation


# ---------------------------------------------------------------------- the order workflow


def test_order_workflow_rewinds_refunds_through_mcp_replays_and_commits():
    """A reserve failing on bad data from step 1 rewinds there, refunds via the MCP tool,
    and after the replay the commit sends the staged email once."""
    delivered: list[agenttx.StagedEffect] = []
    outcomes: dict[str, Any] = {}

    async def test(client: Client, shop: ShopServer) -> None:
        tools = await tools_from_mcp(client, compensations={"charge": "refund"})
        tx = agenttx.Transaction(
            tools=[*tools, confirmation_tool(delivered)], dispatcher=delivered.append
        )
        customer = "${steps.1.id}"
        first = await tx.acall("customers.lookup", {"email": OLD_EMAIL}, call_id="a")
        assert first.output == CUSTOMERS[OLD_EMAIL]  # JSON text became the object
        charged = await tx.acall(
            "charge", {"customer_id": customer, "amount": ORDER["amount"]}, call_id="b"
        )
        assert charged.output == {"charge_id": "ch-1", "amount": 42}  # structured content
        failed = await tx.acall(
            "reserve", {"customer_id": customer, "sku": "SKU-1", "quantity": 2}, call_id="c"
        )
        outcomes["failed"] = failed
        assert shop.refunds == ["ch-1"]  # compensated through the server's refund tool
        # The model replays from the root cause, with the customer's current email.
        assert failed.next_step_id == 1
        replay = [
            ("customers_lookup", {"email": EMAIL}),  # the wire name works too
            ("charge", {"customer_id": customer, "amount": ORDER["amount"]}),
            ("reserve", {"customer_id": customer, "sku": "SKU-1", "quantity": 2}),
            ("send_confirmation", {"email": "${steps.1.email}", "order_id": "o-1"}),
        ]
        for name, arguments in replay:
            result = await tx.acall(name, arguments)
            assert result.status is agenttx.StepStatus.SUCCESS, result.for_model()
        assert delivered == []  # staged until commit
        tx.commit()

    shop = run(test)
    failed = outcomes["failed"]
    assert failed.status is agenttx.StepStatus.ROLLBACK_TRIGGERED
    assert failed.strategy is agenttx.RollbackStrategy.DEPENDENCY_JUMP
    assert failed.rollback_to_step == 1
    assert failed.root_cause == agenttx.RootCause(step=1, key="customer_id")
    assert set(failed.voided_call_ids) == {"a", "b"}
    assert "customer_id" in failed.for_model()["error"]
    assert shop.charges == ["ch-1", "ch-2"]
    assert shop.refunds == ["ch-1"]
    assert shop.reservations == ["SKU-1"]
    assert [effect.payload for effect in delivered] == [{"to": EMAIL, "order_id": "o-1"}]


def test_what_reaches_the_model_is_the_servers_spec():
    """Each MCP tool keeps its name, gets a provider-safe wire name, its description, and its
    inputSchema (with `$defs`) as parameters; a call validates against it."""
    seen: dict[str, Any] = {}

    async def test(client: Client, shop: ShopServer) -> None:
        listed = {item.name: item for item in (await client.list_tools()).tools}
        tools = await tools_from_mcp(client)
        seen["names"] = [t.name for t in tools]
        seen["specs"] = {t.name: t.spec for t in tools}
        seen["listed"] = listed
        tx = agenttx.Transaction(tools=tools)
        shipped = await tx.acall("ship", {"address": {"city": "Leeds", "postcode": "LS1"}})
        seen["shipped"] = shipped
        wrong = await tx.acall("ship", {"address": {"city": "Leeds"}})
        seen["wrong"] = wrong

    shop = run(test)
    assert seen["names"] == ["customers.lookup", "charge", "refund", "reserve", "ship"]
    specs, listed = seen["specs"], seen["listed"]
    assert specs["customers.lookup"].wire_name == "customers_lookup"
    for name, spec in specs.items():
        assert spec.description == listed[name].description
        assert spec.parameters == listed[name].input_schema
    assert "$defs" in specs["ship"].parameters
    assert seen["shipped"].output == {"result": "shipping to Leeds"}
    wrong = seen["wrong"]
    assert wrong.status is not agenttx.StepStatus.SUCCESS
    assert "postcode" in wrong.for_model()["error"]
    assert "ship" not in shop.calls


def test_is_error_fails_the_step_with_the_servers_text():
    """A result with isError fails the step; its text reaches the hint cleaner."""
    seen: dict[str, Any] = {}

    async def test(client: Client, shop: ShopServer) -> None:
        tx = agenttx.Transaction(tools=await tools_from_mcp(client))
        seen["result"] = await tx.acall("customers.lookup", {"email": "nobody@example.com"})

    run(test)
    result = seen["result"]
    assert result.status is not agenttx.StepStatus.SUCCESS
    assert "nobody@example.com" in result.hint.text
    assert result.for_model()["ok"] is False


class OrdersServer:
    """An MCP server whose `orders` tool fails on the customer id `find_customer` produced,
    in three ways: a plain exception shared with `share_errors`, the SDK's own `ToolError`,
    and a plain exception the SDK withholds."""

    def __init__(self) -> None:
        self.charges: list[str] = []
        self.refunds: list[str] = []
        server = self.server = MCPServer("orders")

        @server.tool()
        def find_customer(name: str) -> dict[str, Any]:
            """Find a customer by name."""
            return {"customer_id": "c-404", "name": name}

        @server.tool()
        def charge(customer_id: str, amount: int) -> dict[str, Any]:
            """Charge the customer."""
            self.charges.append(customer_id)
            return {"charge_id": f"ch-{len(self.charges)}", "customer_id": customer_id}

        @server.tool()
        def refund(charge_id: str) -> str:
            """Refund a charge."""
            self.refunds.append(charge_id)
            return "refunded"

        @server.tool()
        @share_errors
        def orders(customer_id: str, charge_id: str) -> list[str]:
            """The customer's orders (a plain exception, shared)."""
            raise ValueError(f"customer {customer_id} not found")

        @server.tool()
        @share_errors
        async def orders_async(customer_id: str, charge_id: str, address: Address) -> list[str]:
            """The customer's orders (async, a plain exception, shared)."""
            raise LookupError(f"no customer {customer_id}")

        @server.tool()
        def orders_mcp(customer_id: str, charge_id: str) -> list[str]:
            """The customer's orders (the SDK's ToolError)."""
            raise MCPToolError(f"customer {customer_id} not found")

        @server.tool()
        def orders_withheld(customer_id: str, charge_id: str) -> list[str]:
            """The customer's orders (a plain exception, withheld by the SDK)."""
            raise ValueError(f"customer {customer_id} not found")


def _orders_run(tool_name: str) -> tuple[agenttx.StepResult, OrdersServer]:
    """Find the customer, charge them, then ask `tool_name`: the failed step's result."""
    server = OrdersServer()
    seen: dict[str, agenttx.StepResult] = {}
    extra = {"address": {"city": "Leeds", "postcode": "LS1"}} if tool_name == "orders_async" else {}

    async def main() -> None:
        async with Client(server.server) as client:
            tools = await tools_from_mcp(client, compensations={"charge": "refund"})
            tx = agenttx.Transaction(tools=tools)
            await tx.acall("find_customer", {"name": "Ada"})
            customer = "${steps.1.customer_id}"
            await tx.acall("charge", {"customer_id": customer, "amount": 5})
            arguments = {"customer_id": customer, "charge_id": "${steps.2.charge_id}", **extra}
            seen["failed"] = await tx.acall(tool_name, arguments)

    asyncio.run(main())
    return seen["failed"], server


@pytest.mark.parametrize("tool_name", ["orders", "orders_async", "orders_mcp"])
def test_a_servers_error_text_rewinds_to_the_step_that_produced_the_bad_value(tool_name):
    """A plain exception shared by `share_errors`, or the SDK's ToolError, reaches agenttx with
    its text; the value it quotes names the argument, so the rewind goes to its producer."""
    failed, server = _orders_run(tool_name)
    assert failed.status is agenttx.StepStatus.ROLLBACK_TRIGGERED
    assert failed.root_cause == agenttx.RootCause(step=1, key="customer_id")
    assert failed.rollback_to_step == 1
    assert server.refunds == ["ch-1"]  # the charge made with the bad id is refunded
    assert "Error executing tool" not in failed.error
    assert "c-404" in failed.error
    if tool_name != "orders_mcp":  # Python's own form of the exception
        assert failed.error.startswith(("ValueError: ", "LookupError: "))


def test_an_error_the_sdk_withholds_says_so():
    """A plain exception the SDK withholds fails the step saying how to share its text."""
    failed, server = _orders_run("orders_withheld")
    assert failed.status is agenttx.StepStatus.ROLLBACK_TRIGGERED
    assert failed.root_cause is None  # nothing to follow: the text never left the server
    assert "withheld" in failed.error
    assert "share_errors" in failed.error
    assert server.refunds == ["ch-1"]  # the local backtrack to step 2 undoes the charge


def test_share_errors_keeps_the_signature_and_the_sdks_own_errors():
    """The wrapped tool keeps its name and signature; the SDK's ToolError passes unchanged."""

    def look(customer_id: str, *, limit: int = 3) -> str:
        raise MCPToolError("as it was")

    wrapped = share_errors(look)
    assert wrapped.__name__ == "look"
    assert str(inspect.signature(wrapped)) == str(inspect.signature(look))
    with pytest.raises(MCPToolError, match=r"^as it was$"):
        wrapped("c-1")


def test_model_mistakes_are_results_not_tracebacks():
    """An unknown tool, malformed JSON or a missing argument is a failed step for the model;
    the server is never called."""
    seen: list[agenttx.StepResult] = []

    async def test(client: Client, shop: ShopServer) -> None:
        tx = agenttx.Transaction(tools=await tools_from_mcp(client))
        seen.append(await tx.acall("nope", {}))
        seen.append(await tx.acall("charge", '{"customer_id": '))
        seen.append(await tx.acall("charge", {"customer_id": "c-1"}))

    shop = run(test)
    assert all(r.status is not agenttx.StepStatus.SUCCESS for r in seen)
    assert all(r.for_model()["ok"] is False for r in seen)
    assert "amount" in seen[2].for_model()["error"]
    assert shop.calls == []


def test_a_synchronous_call_from_another_thread_hops_to_the_sessions_loop():
    """`tx.call` (sync) from a worker thread runs the MCP call on the session's loop."""
    seen: dict[str, Any] = {}

    async def test(client: Client, shop: ShopServer) -> None:
        tx = agenttx.Transaction(tools=await tools_from_mcp(client))
        arguments = {"customer_id": "c-1", "amount": 5}
        # The loop keeps running (serving the session) while the thread's call waits for it.
        seen["r"] = await asyncio.to_thread(tx.call, "charge", arguments)

    shop = run(test)
    assert seen["r"].output == {"charge_id": "ch-1", "amount": 5}
    assert shop.charges == ["ch-1"]


def test_an_agenttx_compensation_may_undo_an_mcp_tool():
    """`compensations` also takes an agenttx Compensation, called with arguments and output."""
    undone: list[Any] = []

    @agenttx.compensation
    def forget(payload: Any) -> None:
        undone.append(payload)

    async def test(client: Client, shop: ShopServer) -> None:
        tools = await tools_from_mcp(client, compensations={"charge": forget})
        tx = agenttx.Transaction(tools=tools)
        await tx.acall("charge", {"customer_id": "c-1", "amount": 5})
        tx.rollback(0)

    run(test)
    assert undone == [
        {
            "arguments": {"customer_id": "c-1", "amount": 5},
            "output": {"charge_id": "ch-1", "amount": 5},
        }
    ]


# ---------------------------------------------------------------------- developer misuse


def test_a_non_session_is_refused_naming_it():
    """Anything without the SDK's async list_tools/call_tool is refused with InvalidArgument."""
    with pytest.raises(agenttx.InvalidArgument, match="dict is not an MCP client session"):
        asyncio.run(tools_from_mcp({}))


@pytest.mark.parametrize(
    ("compensations", "message"),
    [
        ({"nope": "refund"}, "'nope', which the session does not list"),
        ({"charge": "nope"}, "'nope', which is neither"),
        ({"charge": 42}, "must be an MCP tool's name or an agenttx Compensation"),
        (["charge"], "must map tool names"),
    ],
)
def test_bad_compensations_are_refused_naming_them(compensations, message):
    """A compensation for an unlisted tool, or an undo that is no tool, is refused."""

    async def test(client: Client, shop: ShopServer) -> None:
        with pytest.raises(agenttx.InvalidArgument, match=message):
            await tools_from_mcp(client, compensations=compensations)

    run(test)


def test_needs_approval_makes_a_call_wait_and_bad_settings_are_refused():
    """`needs_approval={"charge": True}`: a charge waits for a person (nothing reaches the
    server); an unlisted tool, or a setting that is not a mapping, is refused naming it."""

    async def test(client: Client, shop: ShopServer) -> None:
        tools = await tools_from_mcp(client, needs_approval={"charge": True})
        tx = agenttx.Transaction(tools=tools)
        result = await tx.acall("charge", {"customer_id": "c-1", "amount": 5})
        assert result.status is agenttx.StepStatus.NEEDS_APPROVAL
        assert shop.charges == []
        with pytest.raises(agenttx.InvalidArgument, match="'nope', which the session"):
            await tools_from_mcp(client, needs_approval={"nope": True})
        with pytest.raises(agenttx.InvalidArgument, match="must map tool names"):
            await tools_from_mcp(client, needs_approval=["charge"])

    run(test)


def test_a_missing_sdk_names_the_extra(monkeypatch):
    """Without the MCP SDK, importing the integration says which extra to install."""
    monkeypatch.setitem(sys.modules, "mcp", None)
    monkeypatch.delitem(sys.modules, "agenttx.integrations.mcp")
    with pytest.raises(ImportError, match=r"pip install 'agenttx\[mcp\]'"):
        importlib.import_module("agenttx.integrations.mcp")


def test_a_name_providers_cannot_take_is_refused_naming_the_tool():
    """An MCP tool whose name has no valid wire form (over 64 characters) is refused."""
    server = MCPServer("long")
    long_name = "x" * 70

    @server.tool(name=long_name)
    def anything() -> str:
        """Anything."""
        return "ok"

    async def main() -> None:
        async with Client(server) as client:
            with pytest.raises(agenttx.InvalidArgument, match=long_name):
                await tools_from_mcp(client)

    asyncio.run(main())


def test_output_and_error_rules_for_content_blocks():
    """Plain text stays a string, several blocks are a list, an image is its JSON form, and
    an error without text still fails the step with a message."""
    server = MCPServer("blocks")

    @server.tool(structured_output=False)
    def words() -> list[str]:
        """Two words."""
        return ["hello", "world"]

    @server.tool(structured_output=False)
    def greeting() -> str:
        """Some text."""
        return "hello"

    @server.tool()
    def picture() -> Image:
        """A tiny image."""
        return Image(data=b"\x89PNG", format="png")

    @server.tool()
    def silent() -> str:
        """Fails without a message."""
        raise MCPToolError("")

    seen: dict[str, agenttx.StepResult] = {}

    async def main() -> None:
        async with Client(server) as client:
            tx = agenttx.Transaction(tools=await tools_from_mcp(client))
            for name in ("words", "greeting", "picture", "silent"):
                seen[name] = await tx.acall(name, {})

    asyncio.run(main())
    assert seen["greeting"].output == "hello"
    assert seen["words"].output == ["hello", "world"]
    image = seen["picture"].output
    assert image["type"] == "image"
    assert image["mimeType"] == "image/png"
    assert seen["silent"].status is not agenttx.StepStatus.SUCCESS
    assert seen["silent"].for_model()["ok"] is False


def test_a_synchronous_call_on_the_sessions_own_thread_is_refused_unsent(monkeypatch):
    """`tx.call` (sync) on the thread running the session blocks its loop: the MCP call is
    abandoned unsent (the step fails saying why), and never reaches the server later."""
    monkeypatch.setattr(mcp_integration, "LOOP_START_WAIT", 0.2)
    seen: dict[str, Any] = {}

    async def test(client: Client, shop: ShopServer) -> None:
        tx = agenttx.Transaction(tools=await tools_from_mcp(client))
        seen["r"] = tx.call("charge", {"customer_id": "c-1", "amount": 5})  # blocks the loop
        await asyncio.sleep(0.1)  # the loop runs again: the abandoned call is dropped
        seen["calls"] = list(shop.calls)

    shop = run(test)
    result = seen["r"]
    assert result.status is not agenttx.StepStatus.SUCCESS
    assert "was not sent" in result.for_model()["error"]
    assert seen["calls"] == shop.calls == []
    assert shop.charges == []


class PagedSession:
    """A session-like object whose listing comes in pages (the low-level ClientSession API)."""

    def __init__(self, pages: int, *, endless: bool = False) -> None:
        self.pages, self.endless, self.cursors = pages, endless, []

    async def list_tools(self, *, params: Any = None) -> ListToolsResult:
        cursor = None if params is None else params.cursor
        self.cursors.append(cursor)
        index = len(self.cursors)
        last = index >= self.pages and not self.endless
        tool = MCPTool(name=f"t{index}", input_schema={"type": "object"})
        return ListToolsResult(tools=[tool], next_cursor=None if last else f"c{index}")

    async def call_tool(self, name: str, arguments: Any) -> Any:
        raise AssertionError("not called")


def test_the_listing_follows_the_cursor_and_is_bounded():
    """Every page of the listing is read, following its cursor; an endless one is refused."""
    session = PagedSession(3)
    tools = asyncio.run(tools_from_mcp(session))
    assert [t.name for t in tools] == ["t1", "t2", "t3"]
    assert session.cursors == [None, "c1", "c2"]
    with pytest.raises(agenttx.InvalidArgument, match="more than 100 pages"):
        asyncio.run(tools_from_mcp(PagedSession(1, endless=True)))


def test_a_client_session_works_like_a_client():
    """The SDK's low-level ClientSession (`client.session`) is accepted as well."""
    seen: dict[str, Any] = {}

    async def test(client: Client, shop: ShopServer) -> None:
        tx = agenttx.Transaction(tools=await tools_from_mcp(client.session))
        seen["r"] = await tx.acall("charge", {"customer_id": "c-1", "amount": 5})

    shop = run(test)
    assert seen["r"].output == {"charge_id": "ch-1", "amount": 5}
    assert shop.charges == ["ch-1"]


def test_a_call_after_the_session_closed_fails_the_step_saying_so():
    """A sync call once the session's loop has stopped fails the step, naming the cause."""
    kept: dict[str, Any] = {}

    async def test(client: Client, shop: ShopServer) -> None:
        kept["tx"] = agenttx.Transaction(tools=await tools_from_mcp(client))

    run(test)
    result = kept["tx"].call("charge", {"customer_id": "c-1", "amount": 5})
    assert result.status is not agenttx.StepStatus.SUCCESS
    assert "event loop stopped" in result.for_model()["error"]


def test_a_provider_gets_the_mcp_tools_under_their_wire_names():
    """What a model is offered for MCP tools (here the chat-completions `tools=` list and the
    system prompt) carries each tool's wire name, description and inputSchema."""
    from agenttx.integrations import openai as atx_openai  # noqa: PLC0415

    seen: dict[str, Any] = {}

    async def test(client: Client, shop: ShopServer) -> None:
        listed = (await client.list_tools()).tools
        tx = agenttx.Transaction(tools=await tools_from_mcp(client))
        seen["listed"], seen["offered"] = listed, atx_openai.tools(tx)
        seen["prompt"] = agenttx.prompt(tx)

    run(test)
    offered = {entry["function"]["name"]: entry["function"] for entry in seen["offered"]}
    assert list(offered) == ["customers_lookup", "charge", "refund", "reserve", "ship"]
    for item in seen["listed"]:
        function = offered[item.name.replace(".", "_")]
        assert function["description"] == item.description
        assert function["parameters"] == item.input_schema
    assert "customers_lookup" in seen["prompt"]
