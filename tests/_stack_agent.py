"""The order-support agent of `_durable_agent`, on the framework stacks, for
`tests/test_integrations_durable_stacks.py`: a LangGraph graph (`TransactionalToolNode`, a
SQLite checkpointer) and an OpenAI Agents SDK agent (`function_tools`, the scripted model).

`python _stack_agent.py STACK DB ROOT PHASE` runs one phase in a process of its own (STACK:
langgraph or agents; DB the agenttx SQLite file; ROOT the directory of the effects log and
the checkpoints):

- `kill`: begin a transaction, print its id, run the agent on `KILL_SCRIPT`; the third call
  (`send_email`) writes `ROOT/paused` and sleeps until the parent kills the process, after the
  lookup and the charge ran and before the next model turn.
- `ask`: begin a transaction, run the agent on `APPROVAL_SCRIPT` until its third call waits for
  approval, print `{"tx": ..., "request": ...}` and exit with the transaction open.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from pydantic import Field

from _durable_agent import APPROVAL_SCRIPT, KILL_SCRIPT, PROMPT, make_engine
from _scripted import MODEL, ScriptedModel, Turn
from agenttx.integrations import openai_agents as atx_agents
from agenttx.integrations.langchain import TransactionalToolNode
from agenttx.stores import SQLiteStore


class ScriptedChatModel(BaseChatModel):
    """A LangChain chat model that plays scripted turns and records what it was sent."""

    turns: list[Any]
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.seen.append(list(messages))
        this = self.turns[len(self.seen) - 1]
        message = AIMessage(
            this.text,
            tool_calls=[
                {"name": c.name, "args": c.arguments, "id": c.id, "type": "tool_call"}
                for c in this.calls
            ],
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def bind_tools(self, tools, **kwargs):
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


def as_turns(script: Any) -> list[Turn]:
    return [item if isinstance(item, Turn) else Turn(calls=(item,)) for item in script]


def build_graph(model: ScriptedChatModel, node: TransactionalToolNode, saver: Any) -> Any:
    """The ReAct graph: the model, then the tools node while the model calls tools."""

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.bind_tools(node.tools).invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def saver_of(root: Path) -> Any:
    """A SQLite checkpointer in `root/checkpoints.db` (one connection, shared by threads)."""
    import sqlite3  # noqa: PLC0415

    return SqliteSaver(sqlite3.connect(root / "checkpoints.db", check_same_thread=False))


def config_of(tx_id: str) -> dict[str, Any]:
    """The graph's thread: one per transaction."""
    return {"configurable": {"thread_id": tx_id}}


def first_input() -> dict[str, Any]:
    return {"messages": [HumanMessage(PROMPT)]}


# ---------------------------------------------------------------------- OpenAI Agents SDK


def sdk_agent(tx: Any, model: ScriptedModel) -> Any:
    """An Agents SDK agent over the transaction's tools and the scripted model (chat API)."""
    import agents  # noqa: PLC0415

    agents.set_tracing_disabled(True)
    llm = agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=model.async_openai())
    return agents.Agent(
        name="support",
        instructions="Help with orders.",
        tools=atx_agents.function_tools(tx),
        model=llm,
    )


def sdk_run(tx: Any, agent: Any, given: Any) -> Any:
    """`Runner.run` with agenttx's run config and hooks (the conversation kept with `tx`)."""
    import agents  # noqa: PLC0415

    return asyncio.run(
        agents.Runner.run(
            agent, given, run_config=atx_agents.run_config(tx), hooks=atx_agents.hooks(tx)
        )
    )


def sdk_main(tx: Any, root: Path, phase: str) -> None:
    script = KILL_SCRIPT if phase == "kill" else APPROVAL_SCRIPT
    agent = sdk_agent(tx, ScriptedModel(script))
    print(json.dumps({"tx": tx.id}), flush=True)
    result = sdk_run(tx, agent, PROMPT)
    if phase == "kill":
        raise SystemExit("the process was not killed")
    assert result.interruptions
    (root / "state.json").write_text(result.to_state().to_string())
    (request,) = atx_agents.waiting(tx)
    print(json.dumps({"tx": tx.id, "request": request.id}), flush=True)
    os._exit(0)  # the transaction stays open in the store, as after a crash


# ---------------------------------------------------------------------- pydantic-ai


def pai_agent(tx: Any, model: ScriptedModel) -> Any:
    """A pydantic-ai agent over the transaction's toolset and the scripted model (chat API);
    its output may be the calls it deferred for a person."""
    from pydantic_ai import Agent  # noqa: PLC0415
    from pydantic_ai.capabilities import ProcessHistory  # noqa: PLC0415
    from pydantic_ai.models.openai import OpenAIChatModel  # noqa: PLC0415
    from pydantic_ai.providers.openai import OpenAIProvider  # noqa: PLC0415
    from pydantic_ai.tools import DeferredToolRequests  # noqa: PLC0415

    from agenttx.integrations import pydantic_ai as atx_pai  # noqa: PLC0415

    llm = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=model.async_openai()))
    return Agent(
        llm,
        instructions="Help with orders.",
        toolsets=[atx_pai.Toolset(tx)],
        capabilities=[ProcessHistory(atx_pai.history_processor(tx))],
        output_type=[str, DeferredToolRequests],
    )


def pai_main(tx: Any, root: Path, phase: str) -> None:
    from pydantic_ai.messages import ModelMessagesTypeAdapter  # noqa: PLC0415

    script = KILL_SCRIPT if phase == "kill" else APPROVAL_SCRIPT
    agent = pai_agent(tx, ScriptedModel(script))
    print(json.dumps({"tx": tx.id}), flush=True)
    result = asyncio.run(agent.run(PROMPT))
    if phase == "kill":
        raise SystemExit("the process was not killed")
    (root / "history.json").write_bytes(ModelMessagesTypeAdapter.dump_json(result.all_messages()))
    (root / "deferred.json").write_text(
        json.dumps([[c.tool_call_id, c.tool_name] for c in result.output.approvals])
    )
    (request,) = tx.pending_approvals()
    print(json.dumps({"tx": tx.id, "request": request.id}), flush=True)
    os._exit(0)  # the transaction stays open in the store, as after a crash


# ---------------------------------------------------------------------- MCP


def mcp_server(root: Path) -> Any:
    """The agent's tools on an MCP server (in memory), logging their effects under `root`:
    the email goes out when its call runs (a server cannot stage an effect)."""
    from mcp.server.mcpserver import MCPServer  # noqa: PLC0415

    from _durable_agent import EMAIL, _log  # noqa: PLC0415

    server = MCPServer("orders")

    @server.tool()
    def lookup_order(order_id: str) -> dict[str, Any]:
        """Look an order up."""
        return {"order_id": order_id, "amount": 42, "email": EMAIL}

    @server.tool()
    def charge(amount: int, card: str) -> dict[str, Any]:
        """Charge a card, in pence."""
        charge_id = f"ch-{card}-{amount}"
        _log(root, f"charge {charge_id} {amount} {card}")
        return {"charge_id": charge_id, "amount": amount}

    @server.tool()
    def refund_charge(charge_id: str) -> str:
        """Refund a charge."""
        _log(root, f"refund {charge_id}")
        return f"refunded {charge_id}"

    @server.tool()
    def send_email(to: str, subject: str) -> dict[str, Any]:
        """Email the customer."""
        paused = root / "paused"
        if os.environ.get("AGENTTX_TEST_PAUSE") == "1" and not paused.exists():
            paused.write_text(str(os.getpid()))
            time.sleep(600)  # the parent kills the process here
        _log(root, f"email {to} {subject}")
        return {"sent": True}

    @server.tool()
    def issue_refund(order_id: str, amount: int) -> dict[str, Any]:
        """Refund part of an order (a person approves it first)."""
        _log(root, f"refund_issued {order_id} {amount}")
        return {"refund_id": "rf-1", "order_id": order_id, "amount": amount}

    return server


async def mcp_engine(client: Any, db: Path) -> Any:
    """An engine over the MCP session's tools: `charge` undone by `refund_charge`, and
    `issue_refund` waiting for a person's approval."""
    import agenttx  # noqa: PLC0415
    from agenttx.integrations.mcp import tools_from_mcp  # noqa: PLC0415

    tools = await tools_from_mcp(
        client,
        compensations={"charge": "refund_charge"},
        needs_approval={"issue_refund": True},
    )
    return agenttx.Engine(tools=tools, store=SQLiteStore(db))


async def mcp_turn(runner: Any, llm: Any, messages: list[Any]) -> tuple[Any, bool]:
    """One chat-completions request: `(reply, has_calls)`."""
    sent = await llm.chat.completions.create(model=MODEL, messages=messages, tools=runner.tools)
    reply = sent.choices[0].message
    return reply, bool(reply.tool_calls)


async def mcp_loop(runner: Any, llm: Any, messages: list[Any]) -> list[Any]:
    """The async agent loop over the OpenAI chat runner: model turns until one has no call."""
    while True:
        reply, has_calls = await mcp_turn(runner, llm, messages)
        if not has_calls:
            return messages
        messages = await runner.ahandle(messages, reply)


def mcp_main(db: Path, root: Path, phase: str) -> None:
    from mcp import Client  # noqa: PLC0415

    from agenttx.integrations.openai import ToolRunner  # noqa: PLC0415

    async def run() -> None:
        async with Client(mcp_server(root)) as client:
            engine = await mcp_engine(client, db)
            tx = engine.begin(agent_id="support")
            runner = ToolRunner(tx)
            script = KILL_SCRIPT if phase == "kill" else APPROVAL_SCRIPT
            llm = ScriptedModel(script).async_openai()
            first = [{"role": "user", "content": PROMPT}]
            print(json.dumps({"tx": tx.id}), flush=True)
            if phase == "kill":
                await mcp_loop(runner, llm, first)
                raise SystemExit("the process was not killed")
            reply, _ = await mcp_turn(runner, llm, first)
            await runner.ahandle(first, reply)
            (request,) = runner.waiting
            print(json.dumps({"tx": tx.id, "request": request.id}), flush=True)
            os._exit(0)  # the transaction stays open in the store, as after a crash

    asyncio.run(run())


def main() -> None:
    stack, db, root_text, phase = sys.argv[1:5]
    root = Path(root_text)
    if stack == "mcp":
        mcp_main(Path(db), root, phase)
        return
    engine = make_engine(root, SQLiteStore(db))
    tx = engine.begin(agent_id="support")
    if stack == "agents":
        sdk_main(tx, root, phase)
        return
    if stack == "pydantic_ai":
        pai_main(tx, root, phase)
        return
    node = TransactionalToolNode(tx)
    script = KILL_SCRIPT if phase == "kill" else APPROVAL_SCRIPT
    graph = build_graph(ScriptedChatModel(turns=as_turns(script)), node, saver_of(root))
    print(json.dumps({"tx": tx.id}), flush=True)
    graph.invoke(first_input(), config_of(tx.id))
    if phase == "kill":
        raise SystemExit("the process was not killed")
    (request,) = node.waiting
    print(json.dumps({"tx": tx.id, "request": request.id}), flush=True)
    os._exit(0)  # the transaction stays open in the store, as after a crash


if __name__ == "__main__":
    main()
