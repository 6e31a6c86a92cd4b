"""The three agent loops, each run in a process of its own that a crash fault kills.

Each `run_*` drives one episode's calls (the "agent": a scripted sequence of tool calls) through
`Service.call`, counts each model turn (an agent decision) with `Service.turn`, and returns what
the loop itself reports: "done" or "failed". `resume` is True in the process started after a
crash, which resumes the way the loop's documentation says: the plain loop has no record and
starts the task again; LangGraph resumes its thread from the last checkpoint; agenttx recovers
its SQLite file.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from _world import MONEY, Service
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, StructuredTool, ToolException
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from pydantic import create_model

import agenttx
from agenttx.stores import SQLiteStore

if TYPE_CHECKING:
    from _agent import Script

Call = tuple[str, dict[str, Any]]
# The person who approves calls in the injection arm (None elsewhere): yes to the user's own.
# There agenttx and LangGraph ask for an approval before every call that moves money or sends
# anything (`gated`); the plain loop asks none.
Approver = Callable[[str, dict[str, Any]], bool] | None
REJECTED = "rejected by the person who approves"
# Overrides of agenttx's rollback policy (`--repeat-limit`); empty: the library's defaults.
Policy = dict[str, Any]
TRANSIENT = (TimeoutError, ConnectionError)
RETRIES = 2  # what agents commonly do: retry a failed call a couple of times, then give up


def gated(service: Service, name: str) -> bool:
    """Whether a call of tool `name` needs an approval in the injection arm."""
    return name in service.irreversible or name in MONEY


# ---------------------------------------------------------------- 1. the plain loop
def run_plain(
    service: Service, script: Script, resume: bool, approve: Approver, policy: Policy
) -> dict[str, Any]:
    """Call each tool; retry a timeout or a 5xx twice; give a tool's error back to the agent,
    which sends its correction if it has one and otherwise stops."""
    del resume, approve, policy  # no record to resume from, no approvals: the task starts again
    for i, (name, _args) in enumerate(script.calls):
        sent = 0
        while True:
            service.turn()
            error = _call_with_retries(service, name, script.args(i, sent), i)
            sent += 1
            if error is None:
                break
            if isinstance(error, TRANSIENT) or not script.is_mistake(i, sent - 1):
                return {"status": "failed"}
        service.boundary(i)
    service.turn()  # the answer
    return {"status": "done"}


def _call_with_retries(
    service: Service, name: str, args: dict[str, Any], call: int
) -> Exception | None:
    """One decision of the agent: the call, retried on a timeout or a 5xx as retry decorators
    do; the error it ended with, or None."""
    for attempt in range(RETRIES + 1):
        try:
            service.call(name, args, call)
        except TRANSIENT as error:
            if attempt == RETRIES:
                return error
        except Exception as error:  # noqa: BLE001 -- the tool's error goes back to the agent
            return error
        else:
            return None
    return None


# ---------------------------------------------------------------- 2. LangGraph
def run_langgraph(
    service: Service, script: Script, resume: bool, approve: Approver, policy: Policy
) -> dict[str, Any]:
    """A `ToolNode` and a scripted model node in a `StateGraph` checkpointed by `SqliteSaver`.

    The model node reads the conversation: after an error it sends its correction if it has
    one, else the same call again (at most twice); after a result it sends the next call. After
    a crash the thread is resumed from its last checkpoint with `graph.invoke(None, config)`, as
    LangGraph's persistence docs describe. In the injection arm a call that moves money or
    sends anything is put to the person first, inside the tool node (what LangGraph's
    human-in-the-loop `interrupt()` before a tool pauses for, answered at once here); a rejected
    call comes back as the tool's error and the model node drops it and goes on, as agenttx's
    agent does.
    """
    del policy

    def make(function: Any) -> StructuredTool:
        schema = create_model(
            function.name,
            __base__=function.parameters,
            tool_call_id=(Annotated[str, InjectedToolCallId], ...),
        )

        def run(tool_call_id: str, **_arguments: Any) -> str:  # the agent's own, as it sent them
            call, sent, _ = (int(part) for part in tool_call_id[1:].split("-"))
            args = script.args(call, sent)
            asked = approve is not None and gated(service, function.name)
            if asked and approve is not None and not approve(function.name, args):
                raise ToolException(REJECTED)
            return json.dumps(service.call(function.name, args, call))

        return StructuredTool.from_function(
            func=run, name=function.name, description=function.description, args_schema=schema
        )

    def model(state: MessagesState) -> dict[str, Any]:
        service.turn()
        results = [m for m in state["messages"] if isinstance(m, ToolMessage)]
        i, errors, sent = 0, 0, [0] * len(script.calls)
        for message in results:
            call = int(message.tool_call_id[1:].split("-")[0])
            sent[call] += 1
            if message.status != "error" or REJECTED in str(message.content):
                i, errors = i + 1, 0  # a result, or a call the person refused: dropped
            elif not script.is_mistake(call, sent[call] - 1):
                errors += 1  # the right call failed: retried at most twice
        if results and results[-1].status != "error":
            service.boundary(i - 1)  # the tools' checkpoint is written: the next call starts
        if errors > RETRIES:
            return {"messages": [AIMessage(content="failed")]}
        if i >= len(script.calls):
            return {"messages": [AIMessage(content="done")]}
        name = script.calls[i][0]
        call = {
            "name": name,
            "args": script.args(i, sent[i]),
            "id": f"c{i}-{sent[i]}-{len(results)}",
            "type": "tool_call",
        }
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if getattr(last, "tool_calls", None) else END

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    tools = [make(f) for f in service.suite.tools]
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    connection = sqlite3.connect(service.directory / "langgraph.db", check_same_thread=False)
    app = graph.compile(checkpointer=SqliteSaver(connection))
    config = {"configurable": {"thread_id": "episode"}, "recursion_limit": 10_000}
    # durability="sync": each superstep's checkpoint is written before the next one starts (the
    # default, "async", writes it while the next step runs, so a crash can lose it).
    final = app.invoke(None if resume else {"messages": []}, config, durability="sync")
    connection.close()
    status = final["messages"][-1].content
    return {"status": status}


# ---------------------------------------------------------------- 3. agenttx
def run_agenttx(  # noqa: PLR0915 -- one loop, read top to bottom
    service: Service, script: Script, resume: bool, approve: Approver, policy: Policy
) -> dict[str, Any]:
    """Each call a step of one transaction on a `SQLiteStore`; `engine.recover("resume")`.

    The agent sends the step agenttx names (`next_step_id`): the next one after a success, the
    same one after a retry or a resend, an earlier one after a rewind, none after an abort.
    """

    @agenttx.compensation(name="world.restore")
    def restore(payload: agenttx.JSONValue) -> None:
        assert isinstance(payload, dict)
        call = payload["call"]
        assert isinstance(call, int)
        live = None
        for entry in service.entries():  # the effect of this call not yet undone, if any
            if entry["call"] == call and entry["event"] == "effect":
                live = entry
            elif entry["call"] == call and entry["event"] == "undo":
                live = None
        if live is not None:
            service.restore(call, live["before"])

    def make(name: str) -> agenttx.Tool[..., Any]:
        staged = name in service.irreversible

        def body(ctx: agenttx.ToolContext, call: int, args: dict[str, Any]) -> Any:
            if staged:  # a message or a payment: sent by the outbox once the work commits
                service.validate(name, args, call)  # refused now, not after the commit
                key = ctx.stage_effect("service", {"tool": name, "call": call, "args": args})
                return {"staged": key}
            ctx.register_undo("world.restore", {"call": call})  # durable before the effect
            return {"result": service.call(name, args, call)}

        return agenttx.tool(name=name, needs_approval=approve is not None and gated(service, name))(
            body
        )

    def deliver(effect: agenttx.StagedEffect) -> None:
        payload = effect.payload
        assert isinstance(payload, dict)
        service.call(payload["tool"], payload["args"], payload["call"], key=effect.idempotency_key)

    tools: list[Any] = [restore, *(make(f.name) for f in service.suite.tools)]
    engine = agenttx.Engine(
        tools=tools,
        store=SQLiteStore(service.directory / "agenttx.db"),
        dispatcher={"service": deliver},
    )
    state = service.directory / "agenttx.json"
    if resume:
        report = engine.recover("resume")
        saved = json.loads(state.read_text())
        if saved["tx"] not in report.resumed:
            # It ended before the crash (the crash hit the outbox's delivery after the commit):
            # the store's audit trail of an ended transaction says how it ended.
            ended = engine.audit(saved["tx"])[-1].kind
            _deliver(engine)
            done = ended is agenttx.EventKind.COMMITTED and not engine.pending_effects()
            return {"status": "done" if done else "failed"}
        tx = engine.get(saved["tx"])
    else:
        tx = engine.begin(agent_id="damage", policy=policy or None)
    order = list(range(len(script.calls)))  # step i + 1 makes call order[i]
    sent = [0] * len(script.calls)  # the times the agent sent each call
    while tx.status is agenttx.TxStatus.ACTIVE:
        i = tx.next_step_id - 1
        if i >= len(order):
            break
        state.write_text(json.dumps({"tx": tx.id}))
        service.turn()
        call = order[i]
        name, args = script.calls[call][0], script.args(call, sent[call])
        sent[call] += 1
        step = {"call": call, "args": args}
        r = tx.execute_step(i + 1, name, step)
        if approve is not None and r.approval is not None:
            if approve(name, args):
                tx.approve(r.approval.id, actor="owner")
            else:
                tx.reject(r.approval.id, actor="owner", reason="not what I asked for")
            r = tx.execute_step(i + 1, name, step)
            if not r.ok and tx.status is agenttx.TxStatus.ACTIVE:
                # refused: the agent drops the call and goes on with its own task
                order.pop(i)
                continue
        if r.ok:
            service.boundary(call)
    if tx.status is agenttx.TxStatus.ACTIVE:
        service.turn()  # the answer, and the commit
        tx.commit()
    _deliver(engine)
    done = tx.status is agenttx.TxStatus.COMMITTED and not engine.pending_effects()
    return {"status": "done" if done else "failed"}


def _deliver(engine: agenttx.Engine) -> None:
    """Deliver the outbox; a delivery that failed is offered again after its backoff."""
    deadline = time.monotonic() + 2.0
    while engine.pending_effects() and time.monotonic() < deadline:
        engine.dispatch_pending()
        time.sleep(0.05)


LOOPS: dict[str, Callable[[Service, Script, bool, Approver, Policy], dict[str, Any]]] = {
    "plain": run_plain,
    "langgraph": run_langgraph,
    "agenttx": run_agenttx,
}
# The agent's loop state per episode lives in files under the episode's directory.
__all__ = ["LOOPS", "Path"]
