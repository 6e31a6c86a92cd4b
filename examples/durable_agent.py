"""A durable agent run: a person's approval closes the loop, and the run survives a crash.

Run it with `python examples/durable_agent.py`. It needs `pip install 'agenttx[openai]' httpx2`
and no API key: the model is scripted, played to the real `openai` client through a mock HTTP
transport.

An agent process asks the model what to do about a customer charged twice. The model sends
three calls in one turn: look the order up, refund 30 pence (a tool that needs a person's
approval) and email the customer. The lookup runs; the refund waits, and with it the email
written after it. A second process (this script's first one, standing in for
`agenttx approve`) approves the refund. The agent's `runner.wait()` sees the decision,
`runner.resume()` runs the refund once and then the email, and completes the turn without
asking the model again. Then the agent process dies, before its next model turn. A new
process recovers the transaction, restores the runner with the conversation kept in the
SQLite file, and sends it to the model, which sees every result; the run commits, and the
email goes out once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import openai

import agenttx
from agenttx.integrations.openai import ToolRunner
from agenttx.stores import SQLiteStore

REQUEST = "Order o-1 was charged twice; refund 30 pence and tell ada@example.com."


def tools(ledger: Path) -> list[Any]:
    """The agent's tools; the payment provider's ledger survives any process."""

    def record(line: str) -> None:
        with ledger.open("a") as out:
            out.write(line + "\n")

    @agenttx.tool
    def lookup_order(order_id: str) -> dict[str, Any]:
        """Look an order up.

        Args:
            order_id: The order's id.
        """
        return {"order_id": order_id, "charged": 84, "email": "ada@example.com"}

    @agenttx.tool(needs_approval=True)
    def refund(order_id: str, amount: int) -> dict[str, Any]:
        """Refund part of an order; a person approves every refund first.

        Args:
            order_id: The order's id.
            amount: In pence.
        """
        record(f"refund {order_id} {amount}")
        return {"refund_id": f"rf-{order_id}", "amount": amount}

    @agenttx.tool
    def send_email(ctx: agenttx.ToolContext, to: str, subject: str) -> dict[str, Any]:
        """Email the customer (sent once, after the commit).

        Args:
            to: The address.
            subject: The subject.
        """
        ctx.stage_effect("email", {"to": to, "subject": subject})
        return {"queued": True}

    return [lookup_order, refund, send_email]


def engine_on(root: Path) -> agenttx.Engine:
    def deliver(effect: agenttx.StagedEffect) -> None:
        assert isinstance(effect.payload, dict)
        print(f"    [email] to {effect.payload['to']}: {effect.payload['subject']}")

    store = SQLiteStore(root / "agent.db")
    return agenttx.Engine(tools=tools(root / "payments.log"), store=store, dispatcher=deliver)


def scripted_client() -> openai.OpenAI:
    """The model: three calls in its first turn; once it sees their results, a final answer."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        messages = json.loads(request.content)["messages"]
        message: dict[str, Any] = {"role": "assistant", "content": None}
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if results:
            for result in results:
                print(f"  the model reads: {result[:90]}...")
            message["content"] = "Refunded 30p on o-1 and told Ada."
            print(f"model: {message['content']}")
        else:
            calls = [
                ("lookup_order", {"order_id": "o-1"}),
                ("refund", {"order_id": "o-1", "amount": 30}),
                ("send_email", {"to": "ada@example.com", "subject": "Your refund for o-1"}),
            ]
            print("model: " + ", ".join(f"{name}({json.dumps(args)})" for name, args in calls))
            message["tool_calls"] = [
                {
                    "id": f"call_{n}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
                for n, (name, arguments) in enumerate(calls, 1)
            ]
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        body = {"id": "c", "object": "chat.completion", "created": 0, "model": "scripted"}
        return httpx2.Response(200, json={**body, "choices": [choice]})

    transport = httpx2.MockTransport(handler)
    return openai.OpenAI(api_key="offline", http_client=httpx2.Client(transport=transport))


def run(
    client: openai.OpenAI, runner: ToolRunner, messages: list[Any], *, crash: bool = False
) -> list[Any]:
    """The loop you write: a turn that waits for a person resumes without a model turn.

    `crash` stands for the accident: the process dies once the turn is resumed.
    """
    while True:
        reply = client.chat.completions.create(
            model="scripted", messages=messages, tools=runner.tools
        )
        if not reply.choices[0].message.tool_calls:
            return messages
        messages = runner.handle(messages, reply.choices[0].message)
        while runner.waiting:
            print(f"agent: waiting for a person on {runner.waiting[0].tool}", flush=True)
            runner.wait(timeout=60)
            messages = runner.resume()
            print("agent: resumed; the turn has all its results", flush=True)
            if crash:
                os._exit(1)  # the agent process dies here, before its next model turn


def agent(root: Path) -> None:
    """The first agent process: it begins the run, waits for the approval, and dies."""
    engine = engine_on(root)
    tx = engine.begin(agent_id="support")
    (root / "tx").write_text(tx.id)
    run(scripted_client(), ToolRunner(tx), [{"role": "user", "content": REQUEST}], crash=True)


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="agenttx-durable-"))
    print("== the agent process")
    sys.stdout.flush()
    agent_process = subprocess.Popen([sys.executable, __file__, "--agent", str(root)])  # noqa: S603
    approver = engine_on(root)
    while not approver.pending_approvals():  # as `agenttx approvals DB` would show it
        assert agent_process.poll() is None, "the agent process ended early"
        time.sleep(0.05)
    (request,) = approver.pending_approvals()
    print(f"== a person approves {request.tool}({json.dumps(request.arguments)})")
    sys.stdout.flush()
    approver.approve(request.id, actor="alice")
    agent_process.wait(timeout=60)
    print(f"== the agent process died (exit status {agent_process.returncode})")

    print("== a new process recovers the run and goes on")
    engine = engine_on(root)
    tx_id = (root / "tx").read_text()
    engine.recover("resume")
    runner = ToolRunner.restore(engine.get(tx_id))
    print(f"restored {len(runner.messages)} messages; nothing waits: {runner.waiting == ()}")
    run(scripted_client(), runner, runner.messages)
    engine.get(tx_id).commit()
    print("payments ledger:", (root / "payments.log").read_text().split("\n")[:-1])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--agent"]:
        agent(Path(sys.argv[2]))
    else:
        main()
