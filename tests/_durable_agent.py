"""An order-support agent on a durable store, for `tests/test_integrations_durable.py`.

The tools write what they did to `ROOT/effects.log` (one line per effect), so a test counts the
charges, refunds and emails of every process, killed ones included. The staged email goes out
through `deliver` after the commit, which also logs it.

`python _durable_agent.py PROVIDER BACKEND TARGET SCHEMA ROOT PHASE` runs one phase in a
process of its own (PROVIDER: chat, responses or anthropic; BACKEND: sqlite, with TARGET the
file, or postgres, with TARGET the DSN and SCHEMA the schema):

- `kill`: begin a transaction, print its id, and run the agent loop on `KILL_SCRIPT`: the third
  call of the first turn (`send_email`) writes `ROOT/paused` and sleeps until the parent kills
  the process, after the lookup and the charge ran and before the next model turn.
- `ask`: begin a transaction, handle the first turn of `APPROVAL_SCRIPT` (its third call waits
  for approval), print `{"tx": ..., "request": ...}` and exit with the transaction open.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import agenttx
from _scripted import MODEL, ScriptedModel, call, say, turn

if TYPE_CHECKING:
    from agenttx.stores import Store

EMAIL: Final = "ada@example.com"
PROMPT: Final = "Order o-1 was charged twice; refund 30 and tell Ada."

#: Charge the order, then email: the kill comes in the email's call, after the charge.
KILL_SCRIPT: Final = (
    turn(
        call("lookup_order", {"order_id": "o-1"}, "c1"),
        call("charge", {"amount": 42, "card": "4242"}, "c2"),
        call("send_email", {"to": EMAIL, "subject": "Order o-1"}, "c3"),
    ),
    say("Order o-1 is charged and Ada is told."),
)

#: Look up, email, and refund (which needs a person's approval), in one turn.
APPROVAL_SCRIPT: Final = (
    turn(
        call("lookup_order", {"order_id": "o-1"}, "c1"),
        call("send_email", {"to": EMAIL, "subject": "Refund of o-1"}, "c2"),
        call("issue_refund", {"order_id": "o-1", "amount": 30}, "c3"),
    ),
    say("Done."),
)


def effects(root: Path) -> list[str]:
    """What the tools did, in every process: one line per effect."""
    log = root / "effects.log"
    return log.read_text().splitlines() if log.exists() else []


def _log(root: Path, line: str) -> None:
    with (root / "effects.log").open("a") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def make_tools(root: Path) -> list[Any]:
    """The agent's tools, logging their effects under `root`."""

    @agenttx.compensation(name="refund_charge")
    def refund_charge(payload: dict[str, Any]) -> None:
        """Refund a charge."""
        _log(root, f"refund {payload['output']['charge_id']}")

    @agenttx.tool
    def lookup_order(order_id: str) -> dict[str, Any]:
        """Look an order up.

        Args:
            order_id: The order's id.
        """
        return {"order_id": order_id, "amount": 42, "email": EMAIL}

    @agenttx.tool(compensate=refund_charge)
    def charge(ctx: agenttx.ToolContext, amount: int, card: str) -> dict[str, Any]:
        """Charge a card.

        Args:
            amount: In pence.
            card: The card.
        """
        charge_id = "ch-" + ctx.idempotency_key[:8]
        _log(root, f"charge {charge_id} {amount} {card}")
        return {"charge_id": charge_id, "amount": amount}

    @agenttx.tool
    def send_email(ctx: agenttx.ToolContext, to: str, subject: str) -> dict[str, Any]:
        """Email the customer (sent once, after the commit).

        Args:
            to: The address.
            subject: The subject.
        """
        paused = root / "paused"
        if os.environ.get("AGENTTX_TEST_PAUSE") == "1" and not paused.exists():
            paused.write_text(str(os.getpid()))
            time.sleep(600)  # the parent kills the process here
        ctx.stage_effect("email", {"to": to, "subject": subject})
        return {"queued": True}

    @agenttx.tool(needs_approval=True)
    def issue_refund(order_id: str, amount: int) -> dict[str, Any]:
        """Refund part of an order (a person approves it first).

        Args:
            order_id: The order's id.
            amount: In pence.
        """
        _log(root, f"refund_issued {order_id} {amount}")
        return {"refund_id": "rf-1", "order_id": order_id, "amount": amount}

    return [lookup_order, charge, send_email, issue_refund, refund_charge]


def plan_tools(root: Path) -> list[Any]:
    """Tools for a plan a model proposes: `charge`, and `refund`, which needs approval."""

    @agenttx.tool
    def charge(customer_id: str, amount: int) -> dict[str, Any]:
        """Charge a customer."""
        _log(root, f"charge {customer_id} {amount}")
        return {"charge_id": f"ch-{customer_id}"}

    @agenttx.tool(needs_approval=True)
    def refund(order_id: str, amount: int) -> dict[str, Any]:
        """Refund an order."""
        _log(root, f"refund {order_id} {amount}")
        return {"refund_id": f"rf-{order_id}"}

    return [charge, refund]


#: A plan whose second node needs approval.
GATED_PLAN: Final = {
    "nodes": [
        {"id": "ch", "tool": "charge", "inputs": {"customer_id": "c-7", "amount": 7}},
        {"id": "rf", "tool": "refund", "inputs": {"order_id": "o-9", "amount": 9}, "after": ["ch"]},
    ]
}


def make_store(backend: str, target: str, schema: str, **options: Any) -> Store:
    """A durable store on the test's backend."""
    if backend == "sqlite":
        from agenttx.stores import SQLiteStore  # noqa: PLC0415

        return SQLiteStore(target)
    from agenttx.stores import PostgresStore  # noqa: PLC0415

    return PostgresStore(target, schema=schema, **options)


def make_engine(root: Path, store: Store) -> agenttx.Engine:
    """An engine over the tools, delivering the staged emails to the effects log."""

    def deliver(effect: agenttx.StagedEffect, /) -> None:
        _log(root, f"email {effect.payload['to']} {effect.payload['subject']}")

    return agenttx.Engine(tools=make_tools(root), store=store, dispatcher=deliver)


RUNNERS: Final = {"chat": "ToolRunner", "responses": "ResponsesToolRunner"}


def runner_class(provider: str) -> Any:
    """The runner class of `provider`."""
    if provider == "anthropic":
        from agenttx.integrations import anthropic as atx_anthropic  # noqa: PLC0415

        return atx_anthropic.ToolRunner
    from agenttx.integrations import openai as atx_openai  # noqa: PLC0415

    return getattr(atx_openai, RUNNERS[provider])


def client_of(provider: str, model: ScriptedModel) -> Any:
    """The SDK client of `provider` over the scripted model."""
    return model.anthropic() if provider == "anthropic" else model.openai()


def first_messages(provider: str) -> list[dict[str, Any]]:
    """The conversation before the first model turn."""
    return [{"role": "user", "content": PROMPT}]


def model_turn(provider: str, client: Any, runner: Any, messages: list[Any]) -> tuple[Any, bool]:
    """One request to the model: `(reply, has_calls)`."""
    if provider == "chat":
        reply = (
            client.chat.completions.create(model=MODEL, messages=messages, tools=runner.tools)
            .choices[0]
            .message
        )
        return reply, bool(reply.tool_calls)
    if provider == "responses":
        reply = client.responses.create(model=MODEL, input=messages, tools=runner.tools)
        return reply, any(item.type == "function_call" for item in reply.output)
    reply = client.messages.create(
        model=MODEL, max_tokens=1024, messages=messages, tools=runner.tools
    )
    return reply, reply.stop_reason == "tool_use"


def agent_loop(provider: str, client: Any, runner: Any, messages: list[Any]) -> list[Any]:
    """The loop a user writes: model turns until one has no tool call."""
    while True:
        reply, has_calls = model_turn(provider, client, runner, messages)
        if not has_calls:
            return messages
        messages = runner.handle(messages, reply)


def main() -> None:
    provider, backend, target, schema, root, phase = sys.argv[1:7]
    store = make_store(backend, target, schema, lease_seconds=1.0)
    engine = make_engine(Path(root), store)
    tx = engine.begin(agent_id="support")
    runner = runner_class(provider)(tx)
    if phase == "kill":
        print(json.dumps({"tx": tx.id}), flush=True)
        model = ScriptedModel(KILL_SCRIPT)
        agent_loop(provider, client_of(provider, model), runner, first_messages(provider))
        raise SystemExit("the process was not killed")
    model = ScriptedModel(APPROVAL_SCRIPT)
    client = client_of(provider, model)
    reply, _ = model_turn(provider, client, runner, first_messages(provider))
    runner.handle(first_messages(provider), reply)
    (request,) = runner.waiting
    print(json.dumps({"tx": tx.id, "request": request.id}), flush=True)
    os._exit(0)  # the transaction stays open in the store, as after a crash


if __name__ == "__main__":
    main()
