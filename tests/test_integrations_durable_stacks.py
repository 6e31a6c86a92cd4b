"""Durable runs and decisions that close the loop on the framework stacks, offline: LangGraph
(`TransactionalToolNode`, `interrupt()` and a checkpointer) and the OpenAI Agents SDK.

A turn whose call needs a person stops the framework's run the framework's way; a decision made
in another process lets it continue and answer every call of the turn, in order, without another
model turn. An agent process killed in the middle of a turn is recovered and restored from what
the framework and the transaction kept, and finishes with one charge and one email.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import agents
import pytest
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic_ai.messages import ModelMessagesTypeAdapter, ToolCallPart
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults

import agenttx
from _durable_agent import APPROVAL_SCRIPT, EMAIL, PROMPT, effects, make_engine
from _scripted import ScriptedModel, call, chat_tool_messages, say, turn
from _stack_agent import (
    ScriptedChatModel,
    as_turns,
    build_graph,
    config_of,
    first_input,
    mcp_engine,
    mcp_loop,
    mcp_server,
    mcp_turn,
    pai_agent,
    saver_of,
    sdk_agent,
    sdk_run,
)
from agenttx._approvals import requests_for
from agenttx.integrations import openai_agents as atx_agents
from agenttx.integrations import pydantic_ai as atx_pai
from agenttx.integrations.langchain import TransactionalToolNode
from agenttx.stores import SQLiteStore

AGENT = Path(__file__).resolve().parent / "_stack_agent.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(AGENT.parent.parent), str(AGENT.parent)])}

pytestmark = pytest.mark.timeout(180)  # a hang guard: subprocesses and polls


def cli(*args: str) -> None:
    """`python -m agenttx ARGS` in a process of its own."""
    subprocess.run(
        [sys.executable, "-m", "agenttx", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=ENV,
    )


def edit_elsewhere(db: Path, request_id: str, amount: int) -> None:
    """Approve `request_id` with another amount, from an engine in another process."""
    code = (
        "import agenttx\nfrom agenttx.stores import SQLiteStore\n"
        f"engine = agenttx.Engine(store=SQLiteStore({str(db)!r}))\n"
        f"engine.approve({request_id!r}, actor='alice', "
        f"arguments={{'order_id': 'o-1', 'amount': {amount}}})\n"
    )
    subprocess.run([sys.executable, "-c", code], timeout=120, check=True, env=ENV)


def run_phase(stack: str, root: Path, phase: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(AGENT), stack, str(root / "agent.db"), str(root), phase],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def kill_in_the_turn(stack: str, root: Path) -> str:
    """Run the agent in a process and SIGKILL it in the turn's third call (after the lookup and
    the charge ran, before the next model turn); return the transaction's id."""
    running = run_phase(stack, root, "kill", {**ENV, "AGENTTX_TEST_PAUSE": "1"})
    paused = root / "paused"
    while not paused.exists():
        assert running.poll() is None, running.communicate()
        time.sleep(0.02)
    running.send_signal(signal.SIGKILL)
    out, _ = running.communicate(timeout=60)
    assert running.returncode == -signal.SIGKILL
    return json.loads(out.splitlines()[0])["tx"]


def ask_in_a_process(stack: str, root: Path) -> dict[str, str]:
    """Run the agent in a process until the turn waits for approval; it exits then."""
    running = run_phase(stack, root, "ask", ENV)
    out, err = running.communicate(timeout=120)
    assert running.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


# ---------------------------------------------------------------------- LangGraph


def tool_results(messages: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """`(call id, parsed result)` of every ToolMessage, in order."""
    return [(m.tool_call_id, json.loads(m.content)) for m in messages if isinstance(m, ToolMessage)]


class Graph:
    """A LangGraph agent in this process on a SQLite file, with an in-memory checkpointer."""

    def __init__(self, root: Path, script: Any = APPROVAL_SCRIPT) -> None:
        self.root = root
        self.db = root / "agent.db"
        self.engine = make_engine(root, SQLiteStore(self.db))
        self.tx = self.engine.begin(agent_id="support")
        self.node = TransactionalToolNode(self.tx)
        self.model = ScriptedChatModel(turns=as_turns(script))
        self.graph = build_graph(self.model, self.node, InMemorySaver())
        self.config = config_of(self.tx.id)

    def first_turn(self) -> dict[str, Any]:
        return self.graph.invoke(first_input(), self.config)

    def resume(self) -> dict[str, Any]:
        return self.graph.invoke(Command(resume=True), self.config)


def test_langgraph_an_approval_from_another_process_completes_the_turn_without_a_model_turn(
    tmp_path,
):
    """Three calls, the third needs approval: the graph interrupts with the request; approved
    with `agenttx approve`, `Command(resume=...)` runs it once and answers all three in order;
    two model requests, as without an approval."""
    graph = Graph(tmp_path)
    state = graph.first_turn()
    (interrupted,) = state["__interrupt__"]
    (request,) = graph.node.waiting
    assert interrupted.value["waiting"][0]["id"] == request.id
    assert (request.tool, request.arguments) == ("issue_refund", {"order_id": "o-1", "amount": 30})
    assert graph.tx.next_step_id == 3  # lookup and email ran as steps 1 and 2
    assert len(graph.model.seen) == 1
    assert graph.node.wait(timeout=0) is False

    cli("approve", str(graph.db), request.id, "--actor", "alice")
    assert graph.node.wait(timeout=60) is True
    state = graph.resume()
    assert "__interrupt__" not in state
    assert effects(tmp_path) == ["refund_issued o-1 30"]  # exactly once
    assert len(graph.model.seen) == 2
    answered = tool_results(graph.model.seen[-1])
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert all(result["ok"] for _, result in answered)
    assert [r["step"] for _, r in answered] == [1, 2, 3]
    graph.tx.commit()
    assert effects(tmp_path) == ["refund_issued o-1 30", f"email {EMAIL} Refund of o-1"]


def test_langgraph_a_rejection_answers_the_call_with_the_reason(tmp_path):
    """Rejected with `agenttx reject --reason`: the call's ToolMessage carries the person's
    reason, the tool never runs, the other calls keep their results; no extra model turn."""
    graph = Graph(tmp_path)
    graph.first_turn()
    (request,) = graph.node.waiting
    cli("reject", str(graph.db), request.id, "--actor", "bob", "--reason", "refunds need a ticket")
    graph.resume()
    assert len(graph.model.seen) == 2
    answered = tool_results(graph.model.seen[-1])
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert answered[0][1]["ok"]
    assert answered[1][1]["ok"]
    assert answered[2][1]["ok"] is False
    assert "refunds need a ticket" in answered[2][1]["error"]
    assert effects(tmp_path) == []


def test_langgraph_an_edited_approval_runs_the_call_with_the_edited_arguments(tmp_path):
    """Approved with other arguments in another process, the tool gets those, once."""
    graph = Graph(tmp_path)
    graph.first_turn()
    (request,) = graph.node.waiting
    edit_elsewhere(graph.db, request.id, 25)
    graph.resume()
    assert effects(tmp_path) == ["refund_issued o-1 25"]
    answered = tool_results(graph.model.seen[-1])
    assert answered[2][1]["output"] == {"refund_id": "rf-1", "order_id": "o-1", "amount": 25}
    assert len(graph.model.seen) == 2


def test_langgraph_a_resume_before_the_decision_interrupts_again(tmp_path):
    """`Command(resume=...)` while the request is undecided runs nothing and interrupts again;
    after the decision the next resume completes the turn."""
    graph = Graph(tmp_path)
    graph.first_turn()
    state = graph.resume()
    assert "__interrupt__" in state
    assert graph.tx.next_step_id == 3
    graph.engine.approve(graph.node.waiting[0].id, actor="alice")
    assert "__interrupt__" not in graph.resume()
    assert effects(tmp_path) == ["refund_issued o-1 30"]
    assert len(graph.model.seen) == 2


def test_langgraph_an_approval_resumes_the_graph_across_a_restart(tmp_path):
    """The agent process interrupts and exits; approved from the command line, a new process
    recovers the transaction and resumes the graph from its SQLite checkpoint: one refund,
    all three results in order, one model request in the new process."""
    found = ask_in_a_process("langgraph", tmp_path)
    cli("approve", str(tmp_path / "agent.db"), found["request"], "--actor", "alice")
    engine = make_engine(tmp_path, SQLiteStore(tmp_path / "agent.db"))
    assert found["tx"] in engine.recover("resume").resumed
    node = TransactionalToolNode(engine.get(found["tx"]))
    model = ScriptedChatModel(turns=[say("Done.")])
    graph = build_graph(model, node, saver_of(tmp_path))
    state = graph.invoke(Command(resume=True), config_of(found["tx"]))
    assert "__interrupt__" not in state
    assert len(model.seen) == 1
    answered = tool_results(model.seen[0])
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert all(result["ok"] for _, result in answered)
    assert effects(tmp_path) == ["refund_issued o-1 30"]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_langgraph_an_agent_killed_in_a_turn_is_restored_and_finishes(tmp_path):
    """SIGKILL after the charge, before the next model turn; recover, run the graph again from
    its checkpoint: the lookup and the charge are answered from the journal, the email runs,
    one charge, one email, and the model's next request holds every tool result."""
    tx_id = kill_in_the_turn("langgraph", tmp_path)
    engine = make_engine(tmp_path, SQLiteStore(tmp_path / "agent.db"))
    assert tx_id in engine.recover("resume").resumed
    node = TransactionalToolNode(engine.get(tx_id))
    model = ScriptedChatModel(turns=[say("Order o-1 is charged and Ada is told.")])
    graph = build_graph(model, node, saver_of(tmp_path))
    graph.invoke(None, config_of(tx_id))  # from the last checkpoint: the tools node again
    assert len(model.seen) == 1
    answered = tool_results(model.seen[0])
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert all(result["ok"] for _, result in answered)
    (charged,) = effects(tmp_path)  # one charge, none refunded, none made twice
    assert charged.startswith(f"charge {answered[1][1]['output']['charge_id']} 42")
    engine.get(tx_id).commit()
    assert effects(tmp_path) == [charged, f"email {EMAIL} Order o-1"]


def test_langgraph_a_waiting_node_outside_a_graph_says_so(tmp_path):
    """Invoked on its own (no graph to interrupt), a turn that waits raises
    FailedPrecondition naming what to do; the calls before the waiting one ran."""
    graph = Graph(tmp_path)
    message = as_turns(APPROVAL_SCRIPT)[0]
    from langchain_core.messages import AIMessage  # noqa: PLC0415

    ai = AIMessage(
        "",
        id="m-1",
        tool_calls=[
            {"name": c.name, "args": c.arguments, "id": c.id, "type": "tool_call"}
            for c in message.calls
        ],
    )
    with pytest.raises(agenttx.FailedPrecondition, match="checkpointer"):
        graph.node.invoke({"messages": [ai]})
    assert graph.tx.next_step_id == 3
    assert [r.tool for r in graph.node.waiting] == ["issue_refund"]


# ---------------------------------------------------------------------- OpenAI Agents SDK


def sdk_results(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """`(call id, parsed result)` of every tool message of a chat-completions request."""
    return [(m["tool_call_id"], m["content"]) for m in chat_tool_messages(body)]


class SdkAgent:
    """An Agents SDK agent in this process on a SQLite file."""

    def __init__(self, root: Path, script: Any = APPROVAL_SCRIPT) -> None:
        self.db = root / "agent.db"
        self.engine = make_engine(root, SQLiteStore(self.db))
        self.tx = self.engine.begin(agent_id="support")
        self.model = ScriptedModel(script)
        self.agent = sdk_agent(self.tx, self.model)

    def run(self, given: Any) -> Any:
        return sdk_run(self.tx, self.agent, given)

    def resume(self, result: Any) -> Any:
        state = result.to_state()
        assert atx_agents.approve_decided(self.tx, state) is True
        return self.run(state)


def test_sdk_an_approval_from_another_process_completes_the_turn_without_a_model_turn(tmp_path):
    """Three calls, the third needs approval: the SDK run stops with an interruption for it,
    the two others ran; approved with `agenttx approve`, `approve_decided` and `Runner.run(agent,
    state)` run it once and answer all three in order; two model requests in all."""
    sdk = SdkAgent(tmp_path)
    result = sdk.run(PROMPT)
    (interruption,) = result.interruptions
    assert interruption.call_id == "c3"
    (request,) = atx_agents.waiting(sdk.tx)
    assert (request.tool, request.arguments) == ("issue_refund", {"order_id": "o-1", "amount": 30})
    assert sdk.tx.next_step_id == 3
    assert atx_agents.approve_decided(sdk.tx, result.to_state()) is False  # undecided
    assert atx_agents.wait(sdk.tx, timeout=0) is False

    cli("approve", str(sdk.db), request.id, "--actor", "alice")
    assert atx_agents.wait(sdk.tx, timeout=60) is True
    result = sdk.resume(result)
    assert result.final_output == "Done."
    assert effects(tmp_path) == ["refund_issued o-1 30"]  # exactly once
    assert len(sdk.model.requests) == 2
    answered = sdk_results(sdk.model.last)
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert [r["step"] for _, r in answered] == [1, 2, 3]
    assert all(r["ok"] for _, r in answered)
    sdk.tx.commit()
    assert effects(tmp_path) == ["refund_issued o-1 30", f"email {EMAIL} Refund of o-1"]


def test_sdk_a_rejection_answers_the_call_with_the_reason(tmp_path):
    """Rejected with a reason: the call's tool result carries it, the tool never runs."""
    sdk = SdkAgent(tmp_path)
    result = sdk.run(PROMPT)
    (request,) = atx_agents.waiting(sdk.tx)
    cli("reject", str(sdk.db), request.id, "--actor", "bob", "--reason", "refunds need a ticket")
    sdk.resume(result)
    assert len(sdk.model.requests) == 2
    answered = sdk_results(sdk.model.last)
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert answered[0][1]["ok"]
    assert answered[1][1]["ok"]
    assert answered[2][1]["ok"] is False
    assert "refunds need a ticket" in answered[2][1]["error"]
    assert effects(tmp_path) == []


def test_sdk_an_edited_approval_runs_the_call_with_the_edited_arguments(tmp_path):
    """Approved with other arguments in another process, the tool gets those, once."""
    sdk = SdkAgent(tmp_path)
    result = sdk.run(PROMPT)
    (request,) = atx_agents.waiting(sdk.tx)
    edit_elsewhere(sdk.db, request.id, 25)
    sdk.resume(result)
    assert effects(tmp_path) == ["refund_issued o-1 25"]
    answered = sdk_results(sdk.model.last)
    assert answered[2][1]["output"] == {"refund_id": "rf-1", "order_id": "o-1", "amount": 25}
    assert len(sdk.model.requests) == 2


@pytest.mark.parametrize("how", ["run_state", "restore"])
def test_sdk_an_approval_resumes_the_run_across_a_restart(how, tmp_path):
    """The agent process stops on the interruption and exits; approved from the command line, a
    new process recovers the transaction and goes on, from the SDK's saved `RunState` or from the
    conversation agenttx kept (`restore`): one refund, all three results in order, one model
    request in the new process."""
    import agents  # noqa: PLC0415

    found = ask_in_a_process("agents", tmp_path)
    cli("approve", str(tmp_path / "agent.db"), found["request"], "--actor", "alice")
    engine = make_engine(tmp_path, SQLiteStore(tmp_path / "agent.db"))
    assert found["tx"] in engine.recover("resume").resumed
    tx = engine.get(found["tx"])
    model = ScriptedModel([say("Done.")])
    agent = sdk_agent(tx, model)
    if how == "run_state":
        text = (tmp_path / "state.json").read_text()
        state = asyncio.run(agents.RunState.from_string(agent, text))
        assert atx_agents.approve_decided(tx, state) is True
        sdk_run(tx, agent, state)
    else:
        runner = atx_agents.restore(tx)
        assert runner.unanswered == ("c3",)
        assert [r.id for r in runner.waiting] == [found["request"]]
        sdk_run(tx, agent, runner.resume())
    assert len(model.requests) == 1
    answered = sdk_results(model.last)
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert all(r["ok"] for _, r in answered)
    assert effects(tmp_path) == ["refund_issued o-1 30"]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_sdk_an_agent_killed_in_a_turn_is_restored_and_finishes(tmp_path):
    """SIGKILL after the charge, before the next model turn; recover, `restore(tx)` (the
    conversation `hooks(tx)` kept), resume and run on: one charge, one email, and the model's
    next request holds the whole conversation with every tool result."""
    tx_id = kill_in_the_turn("agents", tmp_path)
    engine = make_engine(tmp_path, SQLiteStore(tmp_path / "agent.db"))
    assert tx_id in engine.recover("resume").resumed
    tx = engine.get(tx_id)
    runner = atx_agents.restore(tx)
    assert runner.unanswered == ("c3",)  # the lookup and the charge: from the journal
    model = ScriptedModel([say("Order o-1 is charged and Ada is told.")])
    result = sdk_run(tx, sdk_agent(tx, model), runner.resume())
    assert result.final_output == "Order o-1 is charged and Ada is told."
    assert len(model.requests) == 1
    sent = model.requests[0]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool", "tool"]
    assert sent[1]["content"] == PROMPT
    assert [c["id"] for c in sent[2]["tool_calls"]] == ["c1", "c2", "c3"]
    answered = sdk_results(model.requests[0])
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert all(r["ok"] for _, r in answered)
    (charged,) = effects(tmp_path)
    assert charged.startswith(f"charge {answered[1][1]['output']['charge_id']} 42")
    tx.commit()
    assert effects(tmp_path) == [charged, f"email {EMAIL} Order o-1"]


# ---------------------------------------------------------------------- pydantic-ai


class PaiAgent:
    """A pydantic-ai agent in this process on a SQLite file."""

    def __init__(self, root: Path, script: Any = APPROVAL_SCRIPT) -> None:
        self.db = root / "agent.db"
        self.engine = make_engine(root, SQLiteStore(self.db))
        self.tx = self.engine.begin(agent_id="support")
        self.model = ScriptedModel(script)
        self.agent = pai_agent(self.tx, self.model)

    def run(self, **options: Any) -> Any:
        return asyncio.run(self.agent.run(**options))

    def resume(self, result: Any) -> Any:
        decided = atx_pai.approve_decided(self.tx, result.output)
        assert decided is not None
        return self.run(message_history=result.all_messages(), deferred_tool_results=decided)


def test_pydantic_ai_an_approval_from_another_process_completes_the_turn_without_a_model_turn(
    tmp_path,
):
    """Three calls, the third needs approval: the run ends with it deferred
    (`DeferredToolRequests`), the two others ran; approved with `agenttx approve`,
    `approve_decided` gives the `deferred_tool_results` that run it once and answer all three in
    order; two model requests in all."""
    pai = PaiAgent(tmp_path)
    result = pai.run(user_prompt=PROMPT)
    assert isinstance(result.output, DeferredToolRequests)
    assert [c.tool_call_id for c in result.output.approvals] == ["c3"]
    (request,) = pai.tx.pending_approvals()
    assert pai.tx.next_step_id == 3
    assert atx_pai.approve_decided(pai.tx, result.output) is None  # undecided
    cli("approve", str(pai.db), request.id, "--actor", "alice")
    result = pai.resume(result)
    assert result.output == "Done."
    assert effects(tmp_path) == ["refund_issued o-1 30"]  # exactly once
    assert len(pai.model.requests) == 2
    answered = sdk_results(pai.model.last)
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert [r["step"] for _, r in answered] == [1, 2, 3]
    pai.tx.commit()
    assert effects(tmp_path) == ["refund_issued o-1 30", f"email {EMAIL} Refund of o-1"]


def test_pydantic_ai_a_rejection_answers_the_call_with_the_reason(tmp_path):
    """Rejected with a reason: the call's tool return carries it, the tool never runs."""
    pai = PaiAgent(tmp_path)
    result = pai.run(user_prompt=PROMPT)
    (request,) = pai.tx.pending_approvals()
    cli("reject", str(pai.db), request.id, "--actor", "bob", "--reason", "refunds need a ticket")
    pai.resume(result)
    assert len(pai.model.requests) == 2
    answered = sdk_results(pai.model.last)
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert answered[2][1]["ok"] is False
    assert "refunds need a ticket" in answered[2][1]["error"]
    assert effects(tmp_path) == []


def test_pydantic_ai_an_edited_approval_runs_the_call_with_the_edited_arguments(tmp_path):
    """Approved with other arguments in another process, the tool gets those, once."""
    pai = PaiAgent(tmp_path)
    result = pai.run(user_prompt=PROMPT)
    (request,) = pai.tx.pending_approvals()
    edit_elsewhere(pai.db, request.id, 25)
    pai.resume(result)
    assert effects(tmp_path) == ["refund_issued o-1 25"]
    answered = sdk_results(pai.model.last)
    assert answered[2][1]["output"] == {"refund_id": "rf-1", "order_id": "o-1", "amount": 25}
    assert len(pai.model.requests) == 2


def test_pydantic_ai_an_approval_resumes_the_run_across_a_restart(tmp_path):
    """The agent process ends its run with the deferred call and exits (its history saved);
    approved from the command line, a new process recovers the transaction and resumes:
    one refund, all three results in order, one model request in the new process."""

    found = ask_in_a_process("pydantic_ai", tmp_path)
    cli("approve", str(tmp_path / "agent.db"), found["request"], "--actor", "alice")
    engine = make_engine(tmp_path, SQLiteStore(tmp_path / "agent.db"))
    assert found["tx"] in engine.recover("resume").resumed
    tx = engine.get(found["tx"])
    history = ModelMessagesTypeAdapter.validate_json((tmp_path / "history.json").read_bytes())
    deferred = DeferredToolRequests(
        approvals=[
            ToolCallPart(tool_name=name, tool_call_id=call_id)
            for call_id, name in json.loads((tmp_path / "deferred.json").read_text())
        ]
    )
    model = ScriptedModel([say("Done.")])
    decided = atx_pai.approve_decided(tx, deferred)
    assert decided is not None
    asyncio.run(pai_agent(tx, model).run(message_history=history, deferred_tool_results=decided))
    assert len(model.requests) == 1
    answered = sdk_results(model.last)
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert all(r["ok"] for _, r in answered)
    assert effects(tmp_path) == ["refund_issued o-1 30"]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_pydantic_ai_an_agent_killed_in_a_turn_is_restored_and_finishes(tmp_path):
    """SIGKILL after the charge, before the next model turn; recover, `restore(tx)` (the
    conversation the toolset kept), resume and run on: one charge, one email, and the model's
    next request holds the whole conversation with every tool result."""
    tx_id = kill_in_the_turn("pydantic_ai", tmp_path)
    engine = make_engine(tmp_path, SQLiteStore(tmp_path / "agent.db"))
    assert tx_id in engine.recover("resume").resumed
    tx = engine.get(tx_id)
    runner = atx_pai.restore(tx)
    assert runner.unanswered == ("c3",)  # the lookup and the charge: from the journal
    runner.resume()
    model = ScriptedModel([say("Order o-1 is charged and Ada is told.")])
    result = asyncio.run(pai_agent(tx, model).run(message_history=runner.message_history()))
    assert result.output == "Order o-1 is charged and Ada is told."
    assert len(model.requests) == 1
    sent = model.requests[0]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool", "tool"]
    assert sent[1]["content"] == PROMPT
    assert [c["id"] for c in sent[2]["tool_calls"]] == ["c1", "c2", "c3"]
    answered = sdk_results(model.requests[0])
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert all(r["ok"] for _, r in answered)
    (charged,) = effects(tmp_path)
    assert charged.startswith(f"charge {answered[1][1]['output']['charge_id']} 42")
    tx.commit()
    assert effects(tmp_path) == [charged, f"email {EMAIL} Order o-1"]


# ---------------------------------------------------------------------- MCP


def run_mcp(root: Path, test: Any) -> None:
    """Run `test(client, engine)` against the MCP server of `_stack_agent`, in memory."""
    from mcp import Client  # noqa: PLC0415

    async def main() -> None:
        async with Client(mcp_server(root)) as client:
            engine = await mcp_engine(client, root / "agent.db")
            await test(engine)

    asyncio.run(main())


@pytest.mark.parametrize("decision", ["approve", "reject", "edit"])
def test_mcp_a_decision_from_another_process_completes_the_turn_without_a_model_turn(
    decision, tmp_path
):
    """MCP tools in the OpenAI chat runner, `issue_refund` needing approval
    (`tools_from_mcp(needs_approval=...)`): the turn waits; approved, rejected with a reason or
    edited from another process, `aresume()` answers all three calls in order (the refund runs
    at most once, on the server, with the decided arguments); two model requests in all."""
    from agenttx.integrations.openai import ToolRunner  # noqa: PLC0415

    model = ScriptedModel(APPROVAL_SCRIPT)
    llm = model.async_openai()

    async def test(engine: agenttx.Engine) -> None:
        tx = engine.begin(agent_id="support")
        runner = ToolRunner(tx)
        first = [{"role": "user", "content": PROMPT}]
        reply, _ = await mcp_turn(runner, llm, first)
        await runner.ahandle(first, reply)
        (request,) = runner.waiting
        assert (request.tool, request.arguments) == (
            "issue_refund",
            {"order_id": "o-1", "amount": 30},
        )
        assert tx.next_step_id == 3
        db = str(tmp_path / "agent.db")
        if decision == "approve":
            cli("approve", db, request.id, "--actor", "alice")
        elif decision == "reject":
            cli("reject", db, request.id, "--actor", "bob", "--reason", "refunds need a ticket")
        else:
            edit_elsewhere(tmp_path / "agent.db", request.id, 25)
        assert await runner.await_decisions(timeout=60) is True
        await mcp_loop(runner, llm, await runner.aresume())

    run_mcp(tmp_path, test)
    assert len(model.requests) == 2
    answered = sdk_results(model.last)
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    sent = [line for line in effects(tmp_path) if line.startswith("refund_issued")]
    if decision == "reject":
        assert "refunds need a ticket" in answered[2][1]["error"]
        assert sent == []
    else:
        amount = 30 if decision == "approve" else 25
        assert answered[2][1]["output"]["amount"] == amount
        assert sent == [f"refund_issued o-1 {amount}"]


def test_mcp_an_approval_resumes_the_turn_across_a_restart(tmp_path):
    """The agent process waits and exits; approved from the command line, a new process (a new
    MCP session) recovers, restores the runner and resumes: one refund, three results, one model
    request in the new process."""
    from agenttx.integrations.openai import ToolRunner  # noqa: PLC0415

    found = ask_in_a_process("mcp", tmp_path)
    cli("approve", str(tmp_path / "agent.db"), found["request"], "--actor", "alice")
    model = ScriptedModel([say("Done.")])

    async def test(engine: agenttx.Engine) -> None:
        assert found["tx"] in engine.recover("resume").resumed
        runner = ToolRunner.restore(engine.get(found["tx"]))
        assert runner.unanswered == ("c3",)
        await mcp_loop(runner, model.async_openai(), await runner.aresume())

    run_mcp(tmp_path, test)
    assert len(model.requests) == 1
    answered = sdk_results(model.last)
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert all(r["ok"] for _, r in answered)
    assert [e for e in effects(tmp_path) if e.startswith("refund_issued")] == [
        "refund_issued o-1 30"
    ]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_mcp_an_agent_killed_in_a_turn_is_restored_and_finishes(tmp_path):
    """SIGKILL in the email's call (on the server), after the charge; a new process with a new
    MCP session recovers, restores the runner and resumes: one charge, one email, and the
    model's next request holds every tool result."""
    from agenttx.integrations.openai import ToolRunner  # noqa: PLC0415

    tx_id = kill_in_the_turn("mcp", tmp_path)
    model = ScriptedModel([say("Order o-1 is charged and Ada is told.")])

    async def test(engine: agenttx.Engine) -> None:
        assert tx_id in engine.recover("resume").resumed
        tx = engine.get(tx_id)
        runner = ToolRunner.restore(tx)
        assert runner.unanswered == ("c3",)
        await mcp_loop(runner, model.async_openai(), await runner.aresume())
        tx.commit()

    run_mcp(tmp_path, test)
    assert len(model.requests) == 1
    sent = model.requests[0]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "tool"]
    answered = sdk_results(model.requests[0])
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert all(r["ok"] for _, r in answered)
    assert effects(tmp_path) == ["charge ch-4242-42 42 4242", f"email {EMAIL} Order o-1"]


def test_pydantic_ai_approve_decided_leaves_other_tools_deferred_calls_to_the_caller():
    """`approve_decided` approves only the deferred calls of the transaction's own tools: a
    tool of pydantic-ai's own `requires_approval` gets no approval that no person gave."""
    from agenttx.integrations import pydantic_ai as atx_pai  # noqa: PLC0415

    @agenttx.tool
    def issue_refund(order_id: str, amount: int) -> dict:
        """Refund an order."""
        return {"order_id": order_id, "amount": amount}

    tx = agenttx.Transaction(tools=[issue_refund])
    requests = DeferredToolRequests(
        approvals=[
            ToolCallPart("issue_refund", {"order_id": "o-1", "amount": 30}, "c1"),
            ToolCallPart("wipe_database", {}, "c2"),
        ]
    )
    results = atx_pai.approve_decided(tx, requests)
    assert results is not None
    assert results.approvals == {"c1": True}


# ---------------------------------------------------------------------- the same two patterns

#: Look up, then two refunds (each needs a person's approval), in one turn.
TWO_REFUNDS = (
    turn(
        call("lookup_order", {"order_id": "o-1"}, "c1"),
        call("issue_refund", {"order_id": "o-1", "amount": 30}, "c2"),
        call("issue_refund", {"order_id": "o-1", "amount": 12}, "c3"),
    ),
    say("Done."),
)


def refunds(root: Path) -> list[str]:
    return [line for line in effects(root) if line.startswith("refund_issued")]


def test_pydantic_ai_two_gated_calls_of_a_turn_each_wait_for_their_own_decision(tmp_path):
    """Two approval-gated calls in one turn: each is deferred until a person decided its own
    request, runs once, and all three calls are answered with one extra model request."""
    pai = PaiAgent(tmp_path, TWO_REFUNDS)
    result = pai.run(user_prompt=PROMPT)
    asked = []
    while isinstance(result.output, DeferredToolRequests):
        (request,) = pai.tx.pending_approvals()
        asked.append(request.arguments["amount"])
        pai.engine.approve(request.id, actor="alice")
        result = pai.resume(result)
    assert asked == [30, 12]
    assert refunds(tmp_path) == ["refund_issued o-1 30", "refund_issued o-1 12"]
    assert len(pai.model.requests) == 2
    assert [c for c, r in sdk_results(pai.model.last) if r["ok"]] == ["c1", "c2", "c3"]


def test_pydantic_ai_the_same_deferred_results_sent_twice_run_the_call_once(tmp_path):
    """The same history and `deferred_tool_results` resumed twice: the approved call runs once,
    the second resume gets its recorded result, and no second request is asked."""
    pai = PaiAgent(tmp_path, [*APPROVAL_SCRIPT, say("Done again.")])
    result = pai.run(user_prompt=PROMPT)
    (request,) = pai.tx.pending_approvals()
    pai.engine.approve(request.id, actor="alice")
    answers = []
    for _ in range(2):
        pai.resume(result)
        answers.append(dict(sdk_results(pai.model.last))["c3"])
    assert refunds(tmp_path) == ["refund_issued o-1 30"]
    assert answers[0] == answers[1]
    assert answers[1]["step"] == 3
    assert pai.tx.pending_approvals() == ()
    assert len(pai.engine.store.list_requests("approval", "pending", 10)) == 0


def test_langgraph_two_gated_calls_of_a_turn_each_wait_for_their_own_decision(tmp_path):
    """Two approval-gated calls in one turn: the graph interrupts for each in turn, each runs
    once after its own decision, and the next model request answers all three calls."""
    graph = Graph(tmp_path, TWO_REFUNDS)
    state = graph.first_turn()
    asked = []
    while "__interrupt__" in state:
        (request,) = graph.node.waiting
        asked.append(request.arguments["amount"])
        graph.engine.approve(request.id, actor="alice")
        state = graph.resume()
    assert asked == [30, 12]
    assert refunds(tmp_path) == ["refund_issued o-1 30", "refund_issued o-1 12"]
    assert len(graph.model.seen) == 2
    assert [c for c, r in tool_results(graph.model.seen[-1]) if r["ok"]] == ["c1", "c2", "c3"]


def test_langgraph_the_same_checkpoint_resumed_twice_runs_the_call_once(tmp_path):
    """The interrupted checkpoint resumed twice: the approved call runs once, both resumes
    answer it with the same result, and no second request is asked."""
    graph = Graph(tmp_path, [*APPROVAL_SCRIPT, say("Done again.")])
    graph.first_turn()
    saved = graph.graph.get_state(graph.config).config
    (request,) = graph.node.waiting
    graph.engine.approve(request.id, actor="alice")
    answers = []
    for _ in range(2):
        graph.graph.invoke(Command(resume=True), saved)
        answers.append(dict(tool_results(graph.model.seen[-1]))["c3"])
    assert refunds(tmp_path) == ["refund_issued o-1 30"]
    assert answers[0] == answers[1]
    assert graph.node.waiting == ()
    assert len(graph.engine.store.list_requests("approval", "pending", 10)) == 0


def test_pydantic_ai_the_same_history_resumed_twice_runs_a_reviewed_call_once(tmp_path):
    """A call whose step timed out is deferred for a review; resolved `done`, the same history
    and deferred results resumed twice do not run the tool again."""
    import threading  # noqa: PLC0415

    charges: list[int] = []
    first = threading.Event()
    returned = threading.Event()

    @agenttx.compensation(name="refund")
    def refund(payload: Any) -> None:
        """Refund."""

    @agenttx.tool(compensate=refund, on_unknown="review")
    def charge(amount: int) -> dict:
        """Charge the card."""
        charges.append(amount)
        if not first.is_set():
            first.set()
            time.sleep(0.6)  # past the step timeout: the outcome is unknown
            returned.set()
        return {"charged": amount}

    engine = agenttx.Engine(
        tools=[charge, refund],
        store=SQLiteStore(tmp_path / "a.db"),
        config=agenttx.EngineConfig(step_timeout=0.2),
    )
    tx = engine.begin(agent_id="a")
    model = ScriptedModel([call("charge", {"amount": 42}, "c1"), say("Done."), say("Again.")])
    agent = pai_agent(tx, model)
    result = asyncio.run(agent.run("Charge 42."))
    assert isinstance(result.output, DeferredToolRequests)
    assert returned.wait(30)
    (review,) = tx.pending_reviews()
    tx.resolve_review(review.id, outcome="done", output={"charged": 42}, actor="ops")
    for _ in range(2):
        decided = atx_pai.approve_decided(tx, result.output)
        assert decided is not None
        asyncio.run(agent.run(message_history=result.all_messages(), deferred_tool_results=decided))
        assert dict(sdk_results(model.last))["c1"]["step"] == 1
    assert charges == [42]
    assert [s.step_id for s in tx.steps] == [1]


def test_pydantic_ai_a_later_turn_that_reuses_a_call_id_is_asked_and_runs(tmp_path):
    """A later model turn reuses the id of an approved call that ran, with the same arguments:
    it is a new call, deferred for its own request and run once approved."""
    refund = call("issue_refund", {"order_id": "o-1", "amount": 30}, "c1")
    pai = PaiAgent(tmp_path, [refund, refund, say("Refunded twice.")])
    result = pai.run(user_prompt="Refund 30 twice.")
    asked = []
    while isinstance(result.output, DeferredToolRequests):
        (request,) = pai.tx.pending_approvals()
        asked.append(request.step)
        pai.engine.approve(request.id, actor="alice")
        result = pai.resume(result)
    assert asked == [1, 2]
    assert refunds(tmp_path) == ["refund_issued o-1 30", "refund_issued o-1 30"]
    assert [(s.step_id, s.call_id) for s in pai.tx.steps] == [(1, "c1"), (2, "c1")]
    assert [r["step"] for _, r in sdk_results(pai.model.last)] == [1, 2]


def test_pydantic_ai_the_same_deferred_results_resumed_at_once_run_the_call_once(tmp_path):
    """Two workers (each its own event loop) resume the same history and deferred results at
    once: the call runs once, both runs answer it with its result, no request is asked again,
    and a later identical refund still needs a person."""
    import threading  # noqa: PLC0415

    pai = PaiAgent(tmp_path, [APPROVAL_SCRIPT[0], say("Done."), say("Done.")])
    result = pai.run(user_prompt=PROMPT)
    (request,) = pai.tx.pending_approvals()
    pai.engine.approve(request.id, actor="alice")
    decided = atx_pai.approve_decided(pai.tx, result.output)
    history = result.all_messages()
    outputs: list[Any] = [None, None]
    barrier = threading.Barrier(2)

    def worker(i: int) -> None:
        barrier.wait()
        ran = asyncio.run(pai.agent.run(message_history=history, deferred_tool_results=decided))
        outputs[i] = ran.output

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outputs == ["Done.", "Done."]
    assert refunds(tmp_path) == ["refund_issued o-1 30"]
    assert pai.tx.pending_approvals() == ()
    assert [dict(sdk_results(b))["c3"]["step"] for b in pai.model.requests[1:]] == [3, 3]
    later = ScriptedModel([call("issue_refund", {"order_id": "o-1", "amount": 30}, "c9")])
    again = asyncio.run(pai_agent(pai.tx, later).run("Another refund of 30."))
    assert isinstance(again.output, DeferredToolRequests)
    assert refunds(tmp_path) == ["refund_issued o-1 30"]


def restarted(root: Path, tx_id: str) -> tuple[Any, Any]:
    """A new engine on the same SQLite file, its transactions resumed: (engine, `tx_id`)."""
    engine = make_engine(root, SQLiteStore(root / "agent.db"))
    engine.recover("resume")
    return engine, engine.get(tx_id)


def test_sdk_after_a_restart_a_stale_state_of_two_identical_calls_runs_neither_again(tmp_path):
    """Two identical gated calls of one turn both ran; after a restart the first saved state
    is resumed again: each call is answered from its own step (the request asked for its call
    id), nothing is asked or run again."""
    refund = {"order_id": "o-1", "amount": 30}
    sdk = SdkAgent(
        tmp_path,
        [
            turn(call("issue_refund", refund, "c2"), call("issue_refund", refund, "c3")),
            say("Done."),
        ],
    )
    result = sdk.run("Refund 30 twice.")
    stale = result.to_state().to_string()
    while result.interruptions:
        state = result.to_state()
        if atx_agents.approve_decided(sdk.tx, state):
            result = sdk.run(state)
        else:
            for request in atx_agents.waiting(sdk.tx):
                sdk.engine.approve(request.id, actor="alice")
    assert refunds(tmp_path) == ["refund_issued o-1 30"] * 2
    sdk.engine.close()
    _engine, tx = restarted(tmp_path, sdk.tx.id)
    model = ScriptedModel([say("Stale."), say("x")])
    agent = sdk_agent(tx, model)
    state = asyncio.run(agents.RunState.from_string(agent, stale))
    assert atx_agents.approve_decided(tx, state) is True
    result = sdk_run(tx, agent, state)
    assert result.interruptions == []
    assert atx_agents.waiting(tx) == ()
    assert refunds(tmp_path) == ["refund_issued o-1 30"] * 2
    assert [r["step"] for _, r in sdk_results(model.last)] == [1, 2]
    assert [(s.step_id, s.call_id) for s in tx.steps] == [(1, "c2"), (2, "c3")]


def test_pydantic_ai_after_a_restart_a_stale_deferral_never_takes_a_later_calls_approval(
    tmp_path,
):
    """A call ran on its approval; a later identical call (another id) waits on its own,
    approved; after a restart the first deferral is resumed again with only (call id, tool)
    kept: the first call is answered from its step, the later call's approval is left for it
    and it runs on it, asked once."""
    refund = {"order_id": "o-1", "amount": 30}
    pai = PaiAgent(
        tmp_path,
        [call("issue_refund", refund, "c3"), call("issue_refund", refund, "c4"), say("Done.")],
    )
    first = pai.run(user_prompt="Refund 30.")
    history = ModelMessagesTypeAdapter.dump_json(first.all_messages())
    kept = DeferredToolRequests(approvals=list(first.output.approvals))  # no metadata
    (r1,) = pai.tx.pending_approvals()
    pai.engine.approve(r1.id, actor="alice")
    second = pai.resume(first)
    assert isinstance(second.output, DeferredToolRequests)
    (r2,) = pai.tx.pending_approvals()
    pai.engine.approve(r2.id, actor="alice")
    pai.engine.close()
    _engine, tx = restarted(tmp_path, pai.tx.id)
    model = ScriptedModel([say("Stale."), say("Done.")])
    agent = pai_agent(tx, model)
    decided = atx_pai.approve_decided(tx, kept)
    assert decided is not None
    messages = ModelMessagesTypeAdapter.validate_json(history)
    asyncio.run(agent.run(message_history=messages, deferred_tool_results=decided))
    assert refunds(tmp_path) == ["refund_issued o-1 30"]
    assert dict(sdk_results(model.last))["c3"]["step"] == 1
    later = atx_pai.approve_decided(tx, second.output)
    assert later is not None
    asyncio.run(agent.run(message_history=second.all_messages(), deferred_tool_results=later))
    assert refunds(tmp_path) == ["refund_issued o-1 30"] * 2
    assert [(s.step_id, s.call_id) for s in tx.steps] == [(1, "c3"), (2, "c4")]
    assert tx.pending_approvals() == ()


def test_pydantic_ai_after_a_restart_a_call_that_waited_with_another_and_ran_is_not_asked(
    tmp_path,
):
    """Two gated calls of a turn: the second waited with the first, then was asked and ran;
    after a restart the first deferral is resumed again with its own results: the second is
    answered from its step (the store says it ran), no request is asked."""
    pai = PaiAgent(
        tmp_path,
        [
            turn(
                call("issue_refund", {"order_id": "o-1", "amount": 30}, "c2"),
                call("issue_refund", {"order_id": "o-1", "amount": 12}, "c3"),
            ),
            say("Done."),
            say("x"),
        ],
    )
    first = pai.run(user_prompt="Two refunds.")
    history = ModelMessagesTypeAdapter.dump_json(first.all_messages())
    for request in pai.tx.pending_approvals():
        pai.engine.approve(request.id, actor="alice")
    stale = atx_pai.approve_decided(pai.tx, first.output)
    assert stale is not None
    result = pai.run(message_history=first.all_messages(), deferred_tool_results=stale)
    while isinstance(result.output, DeferredToolRequests):
        for request in pai.tx.pending_approvals():
            pai.engine.approve(request.id, actor="alice")
        result = pai.resume(result)
    assert refunds(tmp_path) == ["refund_issued o-1 30", "refund_issued o-1 12"]
    pai.engine.close()
    _engine, tx = restarted(tmp_path, pai.tx.id)
    model = ScriptedModel([say("Stale."), say("x")])
    messages = ModelMessagesTypeAdapter.validate_json(history)
    asyncio.run(pai_agent(tx, model).run(message_history=messages, deferred_tool_results=stale))
    assert tx.pending_approvals() == ()
    assert refunds(tmp_path) == ["refund_issued o-1 30", "refund_issued o-1 12"]
    assert [(s.step_id, s.call_id) for s in tx.steps] == [(1, "c2"), (2, "c3")]
    assert [r["step"] for _, r in sdk_results(model.last)] == [1, 2]


def test_pydantic_ai_metadata_naming_another_request_is_not_believed(tmp_path):
    """A later turn reuses a call id for the same refund, approved; after a restart its
    results come with metadata naming the earlier call's request: the store says which request
    was asked for the call, so it runs on its own approval, and a later identical call under a
    new id is asked again."""
    refund = call("issue_refund", {"order_id": "o-1", "amount": 30}, "c1")
    pai = PaiAgent(tmp_path, [refund, say("Refunded."), refund, say("Again.")])
    first = pai.resume(_approved(pai, pai.run(user_prompt="Refund 30.")))
    (r1,) = list(requests_for(pai.tx.store).of_scope(pai.tx.id))
    second = pai.run(user_prompt="Refund another 30.", message_history=first.all_messages())
    assert isinstance(second.output, DeferredToolRequests)
    _approved(pai, second)
    pai.engine.close()
    _engine, tx = restarted(tmp_path, pai.tx.id)
    model = ScriptedModel(
        [say("Again."), call("issue_refund", {"order_id": "o-1", "amount": 30}, "c9")]
    )
    agent = pai_agent(tx, model)
    named = DeferredToolResults(approvals={"c1": True}, metadata={"c1": {"agenttx_request": r1.id}})
    out = asyncio.run(agent.run(message_history=second.all_messages(), deferred_tool_results=named))
    assert refunds(tmp_path) == ["refund_issued o-1 30"] * 2
    assert dict(sdk_results(model.last))["c1"]["step"] == 2
    later = asyncio.run(agent.run("One more.", message_history=out.all_messages()))
    assert isinstance(later.output, DeferredToolRequests)
    assert refunds(tmp_path) == ["refund_issued o-1 30"] * 2


def _approved(pai: PaiAgent, result: Any) -> Any:
    """`result` once every pending request of `pai`'s transaction was approved."""
    for request in pai.tx.pending_approvals():
        pai.engine.approve(request.id, actor="alice")
    return result


def test_sdk_after_a_restart_a_call_that_waited_with_a_rejected_call_is_not_run(tmp_path):
    """Two gated calls of a turn stop the run; the process restarts and a person rejects the
    first call's request: the second call, which waited with it, is answered as not run and no
    one is asked about it, as without the restart."""
    sdk = SdkAgent(
        tmp_path,
        [
            turn(
                call("issue_refund", {"order_id": "o-1", "amount": 30}, "c2"),
                call("issue_refund", {"order_id": "o-1", "amount": 12}, "c3"),
            )
        ],
    )
    saved = sdk.run("Two refunds.").to_state().to_string()
    (request,) = sdk.tx.pending_approvals()
    sdk.engine.close()
    engine, tx = restarted(tmp_path, sdk.tx.id)
    engine.reject(request.id, actor="bob", reason="no")
    model = ScriptedModel([say("Done.")])
    agent = sdk_agent(tx, model)
    state = asyncio.run(agents.RunState.from_string(agent, saved))
    asked = []
    for _ in range(4):
        if not atx_agents.approve_decided(tx, state):
            asked.extend(atx_agents.waiting(tx))
            break
        result = sdk_run(tx, agent, state)
        if not result.interruptions:
            break
        state = result.to_state()
    assert asked == []
    assert refunds(tmp_path) == []
    answered = dict(sdk_results(model.last))
    assert "rejected by bob" in answered["c2"]["error"]
    assert answered["c3"]["ok"] is False
    assert tx.pending_approvals() == ()
