"""Durable agent runs and decisions that close the loop, for the OpenAI (chat and Responses) and
Anthropic runners, through the real SDKs and a scripted model, offline.

A turn whose call needs a person waits (`runner.waiting`); a decision made in another process
lets `runner.resume()` answer every call of the turn, in order, without another model turn.
On a durable store the conversation is kept with the transaction: an agent process killed in
the middle of a turn is recovered, its runner restored, and the run finishes with one charge
and one email.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import pytest

import agenttx
from _durable_agent import (
    APPROVAL_SCRIPT,
    EMAIL,
    GATED_PLAN,
    agent_loop,
    client_of,
    effects,
    first_messages,
    make_engine,
    make_store,
    make_tools,
    model_turn,
    plan_tools,
    runner_class,
)
from _scripted import (
    ScriptedModel,
    anthropic_tool_results,
    call,
    chat_tool_messages,
    responses_outputs,
    say,
    turn,
)
from agenttx.stores import MemoryStore, SQLiteStore

PROVIDERS = ("chat", "responses", "anthropic")
AGENT = Path(__file__).resolve().parent / "_durable_agent.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(AGENT.parent.parent), str(AGENT.parent)])}

pytestmark = pytest.mark.timeout(180)  # a hang guard: subprocesses and polls


def results(provider: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """`(call id, parsed result)` of every tool result a request holds, in order."""
    if provider == "chat":
        return [(m["tool_call_id"], m["content"]) for m in chat_tool_messages(body)]
    if provider == "responses":
        return [(i["call_id"], i["output"]) for i in responses_outputs(body)]
    return [(b["tool_use_id"], b["content"]) for b in anthropic_tool_results(body)]


def last_is_the_model_turn(provider: str, messages: list[Any]) -> bool:
    """Whether the conversation ends with the model's calls, no result after them."""
    last = messages[-1]
    if provider == "responses":
        return last.get("type") == "function_call"
    return last.get("role") == "assistant"


def stored_messages(store: Any, tx_id: str) -> list[Any]:
    """The messages of the conversation kept with `tx_id`: as many of the log's as its record
    counts."""
    count = json.loads(store.read_conversation(tx_id))["count"]
    return [json.loads(text) for text in store.read_messages(tx_id, count)]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m agenttx ARGS` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "agenttx", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=ENV,
    )


def other_process(code: str) -> None:
    """Run Python `code` in a process of its own (it fails the test if it fails)."""
    subprocess.run([sys.executable, "-c", code], timeout=120, check=True, env=ENV)


class Agent:
    """An agent in this process on a SQLite file: its engine, runner and scripted model."""

    def __init__(self, provider: str, root: Path, script: Any = APPROVAL_SCRIPT) -> None:
        self.provider = provider
        self.root = root
        self.db = root / "agent.db"
        self.engine = make_engine(root, SQLiteStore(self.db))
        self.tx = self.engine.begin(agent_id="support")
        self.runner = runner_class(provider)(self.tx)
        self.model = ScriptedModel(script)
        self.client = client_of(provider, self.model)

    def first_turn(self) -> list[Any]:
        reply, has_calls = model_turn(
            self.provider, self.client, self.runner, first_messages(self.provider)
        )
        assert has_calls
        return self.runner.handle(first_messages(self.provider), reply)

    def finish(self, messages: list[Any]) -> list[Any]:
        return agent_loop(self.provider, self.client, self.runner, messages)


# ---------------------------------------------------------------------- decisions close the loop


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_approval_from_another_process_completes_the_turn_without_a_model_turn(
    provider, tmp_path
):
    """Three calls, the third needs approval: two run, one waits; approved with `agenttx
    approve`, `resume()` runs it once and answers all three in order; two model turns, as
    without an approval."""
    agent = Agent(provider, tmp_path)
    messages = agent.first_turn()
    assert last_is_the_model_turn(provider, messages)  # no result yet: the turn waits
    (request,) = agent.runner.waiting
    assert isinstance(request, agenttx.ApprovalRequest)
    assert (request.tool, request.arguments) == ("issue_refund", {"order_id": "o-1", "amount": 30})
    assert agent.runner.unanswered == ("c3",)
    assert agent.runner.messages == messages
    assert agent.tx.next_step_id == 3  # lookup and email ran as steps 1 and 2
    assert effects(tmp_path) == []
    assert agent.runner.wait(timeout=0) is False

    cli("approve", str(agent.db), request.id, "--actor", "alice")
    assert agent.runner.wait(timeout=60) is True
    messages = agent.runner.resume()
    assert agent.runner.waiting == ()
    assert agent.runner.unanswered == ()
    assert effects(tmp_path) == ["refund_issued o-1 30"]  # exactly once
    agent.finish(messages)
    assert len(agent.model.requests) == 2  # the same as a run that needs no approval
    answered = results(provider, agent.model.last)
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert all(result["ok"] for _, result in answered)
    assert answered[2][1]["output"]["amount"] == 30
    with pytest.raises(agenttx.FailedPrecondition, match="nothing to resume"):
        agent.runner.resume()
    agent.tx.commit()
    assert effects(tmp_path) == ["refund_issued o-1 30", f"email {EMAIL} Refund of o-1"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_rejection_answers_the_call_with_the_reason(provider, tmp_path):
    """Rejected with `agenttx reject --reason`, the call is answered with the person's reason as
    its tool result and never runs; the others keep their results."""
    agent = Agent(provider, tmp_path)
    agent.first_turn()
    (request,) = agent.runner.waiting
    cli("reject", str(agent.db), request.id, "--actor", "bob", "--reason", "refunds need a ticket")
    agent.finish(agent.runner.resume())
    assert len(agent.model.requests) == 2
    answered = results(provider, agent.model.last)
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert answered[0][1]["ok"]
    assert answered[1][1]["ok"]
    rejected = answered[2][1]
    assert rejected["ok"] is False
    assert "refunds need a ticket" in rejected["error"]
    assert "bob" in rejected["error"]
    assert effects(tmp_path) == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_edited_approval_runs_the_call_with_the_edited_arguments(provider, tmp_path):
    """Approved with other arguments (an engine in another process), the tool gets those."""
    agent = Agent(provider, tmp_path)
    agent.first_turn()
    (request,) = agent.runner.waiting
    other_process(
        "import agenttx\nfrom agenttx.stores import SQLiteStore\n"
        f"engine = agenttx.Engine(store=SQLiteStore({str(agent.db)!r}))\n"
        f"engine.approve({request.id!r}, actor='alice', "
        "arguments={'order_id': 'o-1', 'amount': 25})\n"
    )
    agent.finish(agent.runner.resume())
    assert effects(tmp_path) == ["refund_issued o-1 25"]
    answered = results(provider, agent.model.last)
    assert answered[2] == ("c3", answered[2][1])
    assert answered[2][1]["output"] == {"refund_id": "rf-1", "order_id": "o-1", "amount": 25}
    assert len(agent.model.requests) == 2


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_approval_resumes_the_turn_across_a_restart(provider, tmp_path):
    """The agent process handles the turn and exits while it waits; approved from the command
    line, a new process recovers, restores the runner and resumes: one refund, all three
    results in order, two model turns in all."""
    db = tmp_path / "agent.db"
    asked = subprocess.run(
        [sys.executable, str(AGENT), provider, "sqlite", str(db), "", str(tmp_path), "ask"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=ENV,
    )
    found = json.loads(asked.stdout.strip().splitlines()[-1])
    cli("approve", str(db), found["request"], "--actor", "alice")

    engine = make_engine(tmp_path, SQLiteStore(db))
    assert found["tx"] in engine.recover("resume").resumed
    runner = runner_class(provider).restore(engine.get(found["tx"]))
    assert runner.unanswered == ("c3",)
    assert [r.id for r in runner.waiting] == [found["request"]]
    assert last_is_the_model_turn(provider, runner.messages)
    assert runner.wait(timeout=0) is True  # decided already
    model = ScriptedModel([say("Done.")])
    agent_loop(provider, client_of(provider, model), runner, runner.resume())
    assert len(model.requests) == 1  # with the child's one: two model turns
    answered = results(provider, model.last)
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert all(result["ok"] for _, result in answered)
    assert effects(tmp_path) == ["refund_issued o-1 30"]
    engine.get(found["tx"]).commit()
    assert effects(tmp_path)[-1] == f"email {EMAIL} Refund of o-1"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_calls_after_a_waiting_call_run_at_resume_in_order(provider, tmp_path):
    """The waiting call in the middle: the call before it runs, the one after it runs at
    resume (steps follow the calls' order); all three answered in order."""
    script = (
        turn(
            call("lookup_order", {"order_id": "o-1"}, "c1"),
            call("issue_refund", {"order_id": "o-1", "amount": 30}, "c2"),
            call("send_email", {"to": EMAIL, "subject": "Refunded"}, "c3"),
        ),
        say("Done."),
    )
    agent = Agent(provider, tmp_path, script)
    agent.first_turn()
    assert agent.runner.unanswered == ("c2", "c3")
    assert agent.tx.next_step_id == 2
    agent.engine.approve(agent.runner.waiting[0].id, actor="alice")
    agent.finish(agent.runner.resume())
    answered = results(provider, agent.model.last)
    assert [(i, r["step"]) for i, r in answered] == [("c1", 1), ("c2", 2), ("c3", 3)]
    assert len(agent.model.requests) == 2


def test_a_rejected_call_in_the_middle_leaves_the_calls_after_it_not_run(tmp_path):
    """Rejected in the middle of the turn: its reason answers it, the call after it is not run
    (it was written for the steps before), and the model is told to send it again."""
    script = (
        turn(
            call("issue_refund", {"order_id": "o-1", "amount": 30}, "c1"),
            call("send_email", {"to": EMAIL, "subject": "Refunded"}, "c2"),
        ),
        say("Sorry."),
    )
    agent = Agent("chat", tmp_path, script)
    agent.first_turn()
    agent.engine.reject(agent.runner.waiting[0].id, actor="bob", reason="no ticket")
    agent.finish(agent.runner.resume())
    (first, second) = results("chat", agent.model.last)
    assert "no ticket" in first[1]["error"]
    assert second[1]["ok"] is False
    assert second[1]["step"] is None  # not run
    assert agent.tx.steps == ()


def test_async_runs_wait_and_resume_on_the_event_loop(tmp_path):
    """`ahandle`, `await_decisions` and `aresume` do what their sync forms do."""
    agent = Agent("anthropic", tmp_path)
    reply, _ = model_turn("anthropic", agent.client, agent.runner, first_messages("anthropic"))

    async def run() -> list[Any]:
        await agent.runner.ahandle(first_messages("anthropic"), reply)
        assert await agent.runner.await_decisions(timeout=0) is False
        agent.engine.approve(agent.runner.waiting[0].id, actor="alice")
        assert await agent.runner.await_decisions(timeout=30) is True
        return await agent.runner.aresume()

    messages = asyncio.run(run())
    assert [i for i, _ in results("anthropic", {"messages": messages})] == ["c1", "c2", "c3"]
    assert effects(tmp_path) == ["refund_issued o-1 30"]


# ---------------------------------------------------------------------- misuse


def test_resume_with_nothing_waiting_or_an_undecided_request_changes_nothing(tmp_path):
    """resume() before any turn, or while the request is undecided, raises FailedPrecondition
    naming what waits; nothing runs."""
    agent = Agent("chat", tmp_path)
    with pytest.raises(agenttx.FailedPrecondition, match="nothing to resume"):
        agent.runner.resume()
    agent.first_turn()
    request = agent.runner.waiting[0]
    with pytest.raises(agenttx.FailedPrecondition, match=request.id):
        agent.runner.resume()
    assert agent.runner.unanswered == ("c3",)
    assert agent.tx.next_step_id == 3
    assert effects(tmp_path) == []
    with pytest.raises(agenttx.InvalidArgument, match="timeout"):
        agent.runner.wait(timeout=-1)


def test_handle_while_a_turn_waits_is_refused(tmp_path):
    """A new model turn before the waiting one is resumed raises FailedPrecondition."""
    agent = Agent("chat", tmp_path)
    messages = agent.first_turn()
    other = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c9",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": "{}"},
            }
        ],
    }
    with pytest.raises(agenttx.FailedPrecondition, match="resume"):
        agent.runner.handle(messages, other)
    assert agent.runner.messages == messages
    assert agent.tx.next_step_id == 3


def test_restore_refuses_what_it_cannot_restore(tmp_path):
    """A MemoryStore's transaction, a transaction with no conversation, one that ended, and an
    unknown id are each refused with a typed error."""
    tools = make_tools(tmp_path)
    memory = agenttx.Transaction(tools=tools, store=MemoryStore())
    with pytest.raises(agenttx.InvalidArgument, match="keeps no conversations"):
        runner_class("chat").restore(memory)
    engine = make_engine(tmp_path, SQLiteStore(tmp_path / "a.db"))
    tx = engine.begin()
    with pytest.raises(agenttx.FailedPrecondition, match="no conversation is stored"):
        runner_class("chat").restore(tx)
    tx.commit()
    with pytest.raises(agenttx.FailedPrecondition, match="has ended"):
        runner_class("chat").restore(tx)
    with pytest.raises(agenttx.TransactionNotFound):
        engine.get("no-such-transaction")
    with pytest.raises(agenttx.InvalidArgument, match=r"needs an agenttx\.Transaction"):
        runner_class("chat").restore("tx-id")


def test_a_conversation_is_restored_only_by_its_provider(tmp_path):
    """An OpenAI chat conversation restored into an Anthropic or Responses runner is refused,
    naming the runner to use."""
    agent = Agent("chat", tmp_path)
    agent.first_turn()
    del agent.runner  # one runner per transaction: the first one is gone
    for provider in ("anthropic", "responses"):
        with pytest.raises(agenttx.InvalidArgument, match=r"openai\.ToolRunner"):
            runner_class(provider).restore(agent.tx)
    assert runner_class("chat").restore(agent.tx).unanswered == ("c3",)


def test_two_runners_on_one_transaction_are_refused(tmp_path):
    """A second runner of one transaction in a process cannot handle a turn while the first
    one lives."""
    agent = Agent("chat", tmp_path)
    agent.first_turn()
    second = runner_class("chat")(agent.tx)
    with pytest.raises(agenttx.FailedPrecondition, match="already has a runner"):
        second.handle(first_messages("chat"), {"role": "assistant", "content": "hi"})
    with pytest.raises(agenttx.FailedPrecondition, match="already has a runner"):
        runner_class("chat").restore(agent.tx)


def test_the_conversation_is_stored_before_any_call_runs(tmp_path):
    """When a tool of the turn runs, the stored conversation already holds the model's calls."""
    seen: list[Any] = []

    def peek() -> dict[str, Any]:
        seen.append(stored_messages(store, tx.id)[-1])
        return {}

    store = SQLiteStore(tmp_path / "a.db")
    tx = agenttx.Transaction(tools=[agenttx.tool(peek)], store=store)
    runner = runner_class("chat")(tx)
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "p1", "type": "function", "function": {"name": "peek", "arguments": "{}"}}
        ],
    }
    messages = runner.handle([{"role": "user", "content": "go"}], reply)
    assert seen == [reply]
    stored = json.loads(store.read_conversation(tx.id))
    assert stored_messages(store, tx.id) == messages == runner.messages
    assert stored["turn"] is None


def test_an_oversized_conversation_is_refused_before_any_call_runs(tmp_path, monkeypatch):
    """A conversation over the store's limit raises InvalidArgument; no call ran."""
    from agenttx.stores import _conversations  # noqa: PLC0415

    monkeypatch.setattr(_conversations, "MAX_CONVERSATION_BYTES", 2000)
    agent = Agent("chat", tmp_path)
    reply, _ = model_turn("chat", agent.client, agent.runner, first_messages("chat"))
    big = [{"role": "user", "content": "x" * 5000}]
    with pytest.raises(agenttx.InvalidArgument, match="over the 2000 bytes"):
        agent.runner.handle(big, reply)
    assert agent.tx.next_step_id == 1
    assert agent.runner.messages == []
    assert agent.runner.unanswered == ()


# ---------------------------------------------------------------------- a killed agent


def _kill_in_the_turn(provider: str, backend: str, target: str, schema: str, root: Path) -> str:
    """Run the agent in a process, SIGKILL it in the turn's third call (after the lookup and
    the charge ran, before the next model turn); return the transaction's id."""
    env = {**ENV, "AGENTTX_TEST_PAUSE": "1"}
    running = subprocess.Popen(
        [sys.executable, str(AGENT), provider, backend, target, schema, str(root), "kill"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    paused = root / "paused"
    while not paused.exists():
        assert running.poll() is None, running.communicate()
        time.sleep(0.02)
    running.send_signal(signal.SIGKILL)
    out, _ = running.communicate(timeout=60)
    assert running.returncode == -signal.SIGKILL
    return json.loads(out.splitlines()[0])["tx"]


def _finish_after_the_kill(provider: str, engine: agenttx.Engine, tx_id: str, root: Path) -> None:
    runner = runner_class(provider).restore(engine.get(tx_id))
    assert runner.unanswered == ("c3",)  # the lookup and the charge are answered from the journal
    assert runner.waiting == ()
    messages = runner.resume()
    model = ScriptedModel([say("Order o-1 is charged and Ada is told.")])
    agent_loop(provider, client_of(provider, model), runner, messages)
    assert len(model.requests) == 1
    answered = results(provider, model.requests[0])
    assert [call_id for call_id, _ in answered] == ["c1", "c2", "c3"]
    assert all(result["ok"] for _, result in answered)
    (charged,) = effects(root)  # one charge, none refunded, none made twice
    assert charged.startswith(f"charge {answered[1][1]['output']['charge_id']} 42")
    engine.get(tx_id).commit()
    assert effects(root) == [charged, f"email {EMAIL} Order o-1"]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_agent_killed_in_a_turn_is_restored_and_finishes(provider, tmp_path):
    """SIGKILL after the charge, before the next model turn; recover, restore, resume: one
    charge, one email, and the model's next request holds every tool result."""
    db = tmp_path / "agent.db"
    tx_id = _kill_in_the_turn(provider, "sqlite", str(db), "", tmp_path)
    engine = make_engine(tmp_path, SQLiteStore(db))
    assert tx_id in engine.recover("resume").resumed
    _finish_after_the_kill(provider, engine, tx_id, tmp_path)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_an_agent_killed_in_a_turn_is_restored_from_postgres(pg_schema, tmp_path):
    """The kill test on PostgreSQL: once the dead worker's lease expired, recovery takes the
    transaction over and the restored runner finishes the run."""
    dsn, schema = pg_schema
    tx_id = _kill_in_the_turn("chat", "postgres", dsn, schema, tmp_path)
    store = make_store("postgres", dsn, schema, lease_seconds=5.0)
    try:
        engine = make_engine(tmp_path, store)
        while tx_id not in engine.recover("resume").resumed:  # until the lease expired
            time.sleep(0.2)
        _finish_after_the_kill("chat", engine, tx_id, tmp_path)
    finally:
        store.close()


def test_a_turn_whose_approved_call_ran_before_a_crash_is_completed_from_the_journal(
    tmp_path, monkeypatch
):
    """The process dies after the approved call ran and before the turn's results were
    stored: the restored runner answers it from its recorded step (it never runs again) and
    completes the turn, with no decision and no model turn left to make."""
    agent = Agent("chat", tmp_path)
    agent.first_turn()
    agent.engine.approve(agent.runner.waiting[0].id, actor="alice")
    kept = SQLiteStore.record_conversation

    def dies(store: SQLiteStore, tx_id: str, text: str, *rest: Any, **options: Any) -> None:
        raise agenttx.StorageError("the process died here")

    monkeypatch.setattr(SQLiteStore, "record_conversation", dies)
    with pytest.raises(agenttx.StorageError, match="died"):
        agent.runner.resume()
    monkeypatch.setattr(SQLiteStore, "record_conversation", kept)
    assert effects(tmp_path) == ["refund_issued o-1 30"]
    agent.engine.close()  # as the process's end would: another engine may take it over

    engine = make_engine(tmp_path, SQLiteStore(agent.db))
    assert agent.tx.id in engine.recover("resume").resumed
    runner = runner_class("chat").restore(engine.get(agent.tx.id))
    assert runner.unanswered == ()
    assert runner.waiting == ()
    answered = results("chat", {"messages": runner.messages})
    assert [(i, r["step"]) for i, r in answered] == [("c1", 1), ("c2", 2), ("c3", 3)]
    assert answered[2][1]["output"]["amount"] == 30
    with pytest.raises(agenttx.FailedPrecondition, match="nothing to resume"):
        runner.resume()
    assert effects(tmp_path) == ["refund_issued o-1 30"]


def test_a_call_under_review_waits_and_resumes_with_the_reviewed_output():
    """A call whose outcome is unknown waits on its Review; resolved `done`, resume answers it
    with the reviewer's output (the tool is not run again), on a MemoryStore too."""
    ran: list[int] = []

    def unknown(arguments: dict[str, Any], key: str) -> agenttx.CheckResult:
        return agenttx.CheckResult.unknown("the provider cannot tell")

    @agenttx.tool(check=unknown)
    def pay(amount: int) -> dict[str, Any]:
        ran.append(amount)
        time.sleep(0.3)  # past the step's timeout: its outcome is unknown
        return {"paid": amount}

    tx = agenttx.Transaction(tools=[pay], step_timeout=0.1)
    runner = runner_class("responses")(tx)
    arguments = '{"amount": 5}'
    reply = [{"type": "function_call", "call_id": "p1", "name": "pay", "arguments": arguments}]
    runner.handle("pay 5", reply)
    (review,) = runner.waiting
    assert isinstance(review, agenttx.Review)
    assert runner.wait(timeout=0) is False
    tx.resolve_review(review.id, outcome="done", output={"paid": 5, "by": "ops"}, actor="ops")
    messages = runner.resume()
    (answer,) = results("responses", {"input": messages})
    assert answer[1]["output"] == {"paid": 5, "by": "ops"}
    assert ran == [5]


def test_a_stored_conversation_that_is_not_one_is_refused(tmp_path):
    """A stored record that is not a runner's (damaged, or of an unknown format) raises
    StorageError on restore, naming the transaction."""
    store = SQLiteStore(tmp_path / "a.db")
    tx = agenttx.Transaction(tools=make_tools(tmp_path), store=store)
    for text in ("not json", '{"format": 99}', '{"format": 1, "runner": "openai.chat"}'):
        store.record_conversation(tx.id, text)
        with pytest.raises(agenttx.StorageError, match=tx.id):
            runner_class("chat").restore(tx)


def test_a_request_asked_just_before_a_crash_shows_in_the_restored_runner(tmp_path, monkeypatch):
    """The process dies after the third call asked for approval and before the runner stored
    that the turn waits: the restored runner answers the first two from the journal and finds
    the request in the store."""
    agent = Agent("anthropic", tmp_path)
    kept = SQLiteStore.record_conversation
    writes: list[str] = []

    def dies_on_the_second_write(
        store: SQLiteStore, tx_id: str, text: str, *rest: Any, **options: Any
    ) -> None:
        writes.append(text)
        if len(writes) == 2:
            raise agenttx.StorageError("the process died here")
        kept(store, tx_id, text, *rest, **options)

    monkeypatch.setattr(SQLiteStore, "record_conversation", dies_on_the_second_write)
    with pytest.raises(agenttx.StorageError, match="died"):
        agent.first_turn()
    monkeypatch.setattr(SQLiteStore, "record_conversation", kept)
    (request,) = agent.engine.pending_approvals()
    agent.engine.close()

    engine = make_engine(tmp_path, SQLiteStore(agent.db))
    assert agent.tx.id in engine.recover("resume").resumed
    runner = runner_class("anthropic").restore(engine.get(agent.tx.id))
    assert runner.unanswered == ("c3",)
    assert [r.id for r in runner.waiting] == [request.id]
    engine.approve(request.id, actor="alice")
    messages = runner.resume()
    answered = results("anthropic", {"messages": messages})
    assert [(i, r["step"]) for i, r in answered] == [("c1", 1), ("c2", 2), ("c3", 3)]
    assert effects(tmp_path) == ["refund_issued o-1 30"]


# ---------------------------------------------------------------------- the runner's own defects


def chat_message(*calls: tuple[str, str, Any]) -> dict[str, Any]:
    """An assistant message of the chat API with these `(id, tool, arguments)` calls."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, n, a in calls
        ],
    }


USER: Final = [{"role": "user", "content": "go"}]


@pytest.mark.timeout(60)
def test_a_plan_node_waiting_for_approval_makes_the_turn_wait(tmp_path):
    """handle() returns while a node of a proposed plan waits for approval: the request shows
    in `waiting`, and resume() answers the call from the run once a person approved."""
    engine = agenttx.Engine(tools=plan_tools(tmp_path), store=SQLiteStore(tmp_path / "a.db"))
    runner = runner_class("chat")(engine.begin(agent_id="a"), plans=True)
    messages = runner.handle(USER, chat_message(("p1", "propose_plan", GATED_PLAN)))
    assert last_is_the_model_turn("chat", messages)
    assert runner.unanswered == ("p1",)
    (request,) = runner.waiting
    assert (request.tool, request.node) == ("refund", "rf")
    engine.approve(request.id, actor="ops")
    assert runner.wait(timeout=30)
    ((call_id, answer),) = results("chat", {"messages": runner.resume()})
    assert (call_id, answer["plan"]) == ("p1", "SUCCEEDED")
    assert answer["nodes"]["rf"]["output"] == {"refund_id": "rf-o-9"}
    assert effects(tmp_path) == ["charge c-7 7", "refund o-9 9"]


@pytest.mark.timeout(60)
def test_a_plan_node_waiting_makes_an_async_turn_wait_without_blocking_the_loop(tmp_path):
    """ahandle() returns while a plan node waits for approval; aresume() answers the call."""
    engine = agenttx.Engine(tools=plan_tools(tmp_path), store=SQLiteStore(tmp_path / "a.db"))
    runner = runner_class("anthropic")(engine.begin(agent_id="a"), plans=True)
    reply = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "p1", "name": "propose_plan", "input": GATED_PLAN}],
    }

    async def main() -> list[Any]:
        await runner.ahandle(USER, reply)
        (request,) = runner.waiting
        engine.approve(request.id, actor="ops")
        assert await runner.await_decisions(timeout=30)
        return await runner.aresume()

    ((_, answer),) = results("anthropic", {"messages": asyncio.run(main())})
    assert answer["plan"] == "SUCCEEDED"
    assert effects(tmp_path) == ["charge c-7 7", "refund o-9 9"]


@pytest.mark.timeout(60)
def test_a_plan_node_request_asked_just_before_a_crash_shows_in_the_restored_runner(
    tmp_path, monkeypatch
):
    """The runner dies after a node of its plan asked for approval and before it stored that
    the turn waits: the restored runner waits on the node's request and answers the call from
    the run (read back from the store), which ran once."""
    engine = agenttx.Engine(tools=plan_tools(tmp_path), store=SQLiteStore(tmp_path / "a.db"))
    tx = engine.begin(agent_id="a")
    runner = runner_class("chat")(tx, plans=True)
    kept = SQLiteStore.record_conversation
    writes: list[str] = []

    def dies_on_the_third_write(
        store: SQLiteStore, tx_id: str, text: str, *rest: Any, **options: Any
    ) -> None:
        writes.append(text)
        if len(writes) == 3:  # the model's message, the run's id, then: the turn waits
            raise agenttx.StorageError("the process died here")
        kept(store, tx_id, text, *rest, **options)

    monkeypatch.setattr(SQLiteStore, "record_conversation", dies_on_the_third_write)
    with pytest.raises(agenttx.StorageError, match="died"):
        runner.handle(USER, chat_message(("p1", "propose_plan", GATED_PLAN)))
    monkeypatch.setattr(SQLiteStore, "record_conversation", kept)
    del runner
    gc.collect()

    restored = runner_class("chat").restore(tx, plans=True)
    (request,) = restored.waiting
    assert request.node == "rf"
    engine.approve(request.id, actor="ops")
    assert restored.wait(timeout=30)
    ((_, answer),) = results("chat", {"messages": restored.resume()})
    assert answer["plan"] == "SUCCEEDED"
    assert answer["nodes"]["ch"] == {
        "tool": "charge",
        "state": "SUCCEEDED",
        "output": {"charge_id": "ch-c-7"},
    }
    assert effects(tmp_path) == ["charge c-7 7", "refund o-9 9"]


PLAN_AGENT: Final = """
import json, sys, time
from pathlib import Path
import agenttx
from agenttx.stores import SQLiteStore
from agenttx.integrations.openai import ToolRunner
from _durable_agent import GATED_PLAN, plan_tools
root = Path(sys.argv[1])
engine = agenttx.Engine(tools=plan_tools(root), store=SQLiteStore(root / "a.db"))
tx = engine.begin(agent_id="a")
call = {"id": "p1", "type": "function",
        "function": {"name": "propose_plan", "arguments": json.dumps(GATED_PLAN)}}
runner = ToolRunner(tx, plans=True)
runner.handle([{"role": "user", "content": "go"}],
              {"role": "assistant", "content": None, "tool_calls": [call]})
print(json.dumps({"tx": tx.id, "waiting": [r.id for r in runner.waiting]}), flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_a_plan_run_waiting_across_a_crash_is_answered_from_that_run(tmp_path):
    """The agent dies while a node of its plan waits for approval: recovery resumes the run,
    the restored runner waits on the same request and answers the call from that run; the
    plan runs once (one charge, one refund, one run in the store)."""
    with subprocess.Popen(
        [sys.executable, "-c", PLAN_AGENT, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    ) as agent:
        try:
            shown = json.loads(agent.stdout.readline())  # type: ignore[union-attr]
        finally:
            agent.kill()
    engine = agenttx.Engine(tools=plan_tools(tmp_path), store=SQLiteStore(tmp_path / "a.db"))
    report = engine.recover("resume")
    (run_id,) = report.plans_resumed
    runner = runner_class("chat").restore(engine.get(shown["tx"]), plans=True)
    assert runner.unanswered == ("p1",)
    assert [r.id for r in runner.waiting] == shown["waiting"]
    engine.approve(shown["waiting"][0], actor="ops")
    assert runner.wait(timeout=30)
    ((_, answer),) = results("chat", {"messages": runner.resume()})
    assert (answer["plan"], answer["run_id"]) == ("SUCCEEDED", run_id)
    assert effects(tmp_path) == ["charge c-7 7", "refund o-9 9"]
    assert [r[0] for r in engine.store.plan_runs()] == [run_id]  # type: ignore[attr-defined]


def test_a_turn_that_failed_and_rewound_before_a_crash_is_answered_from_the_journal(
    tmp_path, monkeypatch
):
    """The process dies after a turn's last call failed and rewound, before the turn's results
    were stored: the restored runner answers the turn with the failure (its hint), rewrites
    the history for the voided call, and runs nothing again."""
    ran: list[str] = []

    @agenttx.compensation(name="uncharge")
    def uncharge(payload: dict[str, Any]) -> None:
        ran.append("refund " + payload["arguments"]["customer_id"])

    @agenttx.tool
    def lookup(email: str) -> dict[str, Any]:
        """Look a customer up."""
        return {"customer_id": "c-old"}

    @agenttx.tool(compensate=uncharge)
    def charge(customer_id: str, amount: int) -> dict[str, Any]:
        """Charge a customer."""
        ran.append("charge " + customer_id)
        return {"charge_id": "ch"}

    @agenttx.tool
    def reserve(customer_id: str) -> dict[str, Any]:
        """Reserve for a customer."""
        raise agenttx.ToolError(f"customer {customer_id} has a closed account", key="customer_id")

    tools = [uncharge, lookup, charge, reserve]
    db = tmp_path / "a.db"
    engine = agenttx.Engine(tools=tools, store=SQLiteStore(db))
    tx = engine.begin(agent_id="a")
    runner = runner_class("chat")(tx)
    messages = runner.handle(USER, chat_message(("c1", "lookup", {"email": "old@x"})))
    kept = SQLiteStore.record_conversation
    writes: list[str] = []

    def dies_on_the_second_write(
        store: SQLiteStore, tx_id: str, text: str, *rest: Any, **options: Any
    ) -> None:
        writes.append(text)
        if len(writes) == 2:
            raise agenttx.StorageError("the process died here")
        kept(store, tx_id, text, *rest, **options)

    monkeypatch.setattr(SQLiteStore, "record_conversation", dies_on_the_second_write)
    second = chat_message(
        ("c2", "charge", {"customer_id": "c-1", "amount": 5}),
        ("c3", "reserve", {"customer_id": "${steps.1.customer_id}"}),
    )
    with pytest.raises(agenttx.StorageError, match="died"):
        runner.handle(messages, second)
    monkeypatch.setattr(SQLiteStore, "record_conversation", kept)
    assert ran == ["charge c-1", "refund c-1"]
    engine.close()

    engine = agenttx.Engine(tools=tools, store=SQLiteStore(db))
    engine.recover("resume")
    restored = runner_class("chat").restore(engine.get(tx.id))
    assert restored.unanswered == ()
    answered = dict(results("chat", {"messages": restored.messages}))
    assert list(answered) == ["c2", "c3"]  # c1's step was voided: truncated away
    assert "closed account" in answered["c2"]["error"]
    assert "rollback undid step 1" in answered["c2"]["note"]
    assert "Not run" in answered["c3"]["error"]
    with pytest.raises(agenttx.FailedPrecondition, match="nothing to resume"):
        restored.resume()
    assert ran == ["charge c-1", "refund c-1"]


def _gated_pair() -> tuple[agenttx.Transaction, list[str]]:
    done: list[str] = []

    @agenttx.tool(needs_approval=True)
    def refund(order_id: str, amount: int) -> dict[str, Any]:
        """Refund an order."""
        done.append("refund")
        return {"refund_id": "rf"}

    @agenttx.tool
    def lookup(email: str) -> dict[str, Any]:
        """Look a customer up."""
        done.append("lookup")
        return {"customer_id": "c-1"}

    return agenttx.Transaction(tools=[refund, lookup]), done


def test_a_second_concurrent_resume_is_refused_and_changes_nothing():
    """Two aresume() at once: the second raises FailedPrecondition; every call runs once."""
    tx, done = _gated_pair()
    runner = runner_class("chat")(tx)
    message = chat_message(
        ("c1", "refund", {"order_id": "o1", "amount": 30}), ("c2", "lookup", {"email": "a@x"})
    )

    async def main() -> list[Any]:
        await runner.ahandle(USER, message)
        tx.approve(runner.waiting[0].id, actor="alice")
        return await asyncio.gather(runner.aresume(), runner.aresume(), return_exceptions=True)

    first, second = asyncio.run(main())
    assert isinstance(second, agenttx.FailedPrecondition)
    assert "under way" in str(second)
    assert [i for i, _ in results("chat", {"messages": first})] == ["c1", "c2"]
    assert done == ["refund", "lookup"]
    assert runner.unanswered == ()


@pytest.mark.timeout(60)
def test_a_plan_call_in_a_turn_that_waits_runs_at_resume():
    """propose_plan in a turn whose other call waits for approval waits with the turn (it is
    not answered as failed) and runs at resume(), after the turn's other calls."""
    tx, done = _gated_pair()
    runner = runner_class("chat")(tx, plans=True)
    plan = {"nodes": [{"id": "lk", "tool": "lookup", "inputs": {"email": "p@x"}}]}
    message = chat_message(
        ("p1", "propose_plan", plan),
        ("c2", "refund", {"order_id": "o1", "amount": 30}),
        ("c3", "lookup", {"email": "z@x"}),
    )
    runner.handle(USER, message)
    assert runner.unanswered == ("p1", "c2", "c3")
    assert done == []
    tx.approve(runner.waiting[0].id, actor="alice")
    answered = dict(results("chat", {"messages": runner.resume()}))
    assert list(answered) == ["p1", "c2", "c3"]
    assert answered["p1"]["plan"] == "SUCCEEDED"
    assert done == ["refund", "lookup", "lookup"]


def test_the_model_gets_the_whole_rejection_reason():
    """A rejected call's answer holds the person's whole reason (the hint is cut short)."""
    tx, _ = _gated_pair()
    runner = runner_class("chat")(tx)
    runner.handle(USER, chat_message(("c1", "refund", {"order_id": "o1", "amount": 30})))
    reason = "Refund to the card ending 9911 instead, amount 25. " * 8 + "Do NOT refund o1."
    tx.reject(runner.waiting[0].id, actor="bob", reason=reason)
    ((_, answer),) = results("chat", {"messages": runner.resume()})
    assert answer["rejection"] == {"by": "bob", "reason": reason}


# ---------------------------------------------------------------------- an append-only record


def rewinding_tools() -> list[Any]:
    """A lookup whose customer a later reservation refuses: the reservation's failure rewinds
    to the lookup (its root cause), voiding it and the charge after it."""

    @agenttx.tool
    def lookup(email: str) -> dict[str, Any]:
        """Look a customer up."""
        return {"customer_id": "c-old"}

    @agenttx.tool
    def reserve(customer_id: str) -> dict[str, Any]:
        """Reserve for a customer."""
        raise agenttx.ToolError(f"customer {customer_id} has a closed account", key="customer_id")

    return [lookup, reserve]


def test_each_write_holds_only_the_messages_that_are_new(tmp_path, monkeypatch):
    """A turn's first write appends the model's message after what is kept, its second the
    results; a history rewritten after a rewind is written from the first message it changed;
    what the log holds is always the runner's messages."""
    store = SQLiteStore(tmp_path / "a.db")
    tx = agenttx.Transaction(tools=rewinding_tools(), store=store)
    runner = runner_class("chat")(tx)
    kept = SQLiteStore.record_conversation
    writes: list[tuple[int, list[Any]]] = []

    def spy(store: SQLiteStore, tx_id: str, text: str, *rest: Any, **options: Any) -> None:
        messages = rest[0] if rest else options.get("messages", ())
        writes.append((options.get("start", 0), [json.loads(m) for m in messages]))
        kept(store, tx_id, text, *rest, **options)

    monkeypatch.setattr(SQLiteStore, "record_conversation", spy)
    first = chat_message(("c1", "lookup", {"email": "old@x"}))
    messages = runner.handle(USER, first)
    assert writes == [(0, [*USER, first]), (2, [messages[2]])]
    second = chat_message(("c2", "reserve", {"customer_id": "${steps.1.customer_id}"}))
    writes.clear()
    messages = runner.handle(messages, second)
    assert writes[0] == (3, [second])
    # the rewind voided c1: the truncated history drops its call and result (from message 1)
    start, rewritten = writes[1]
    assert start == 1
    assert rewritten == messages[1:]
    assert "c1" not in json.dumps(messages)
    assert stored_messages(store, tx.id) == messages == runner.messages


@pytest.mark.timeout(120)
def test_a_crash_between_the_appended_messages_and_the_step_restores_a_consistent_run(
    durable_backend, tmp_path, monkeypatch
):
    """The process dies after the turn's messages were appended and before its call's step was
    recorded: the restored runner has the conversation as it was appended (the model's call
    unanswered, nothing more), runs the call once, and the log and its record agree."""
    engine = make_engine(tmp_path, durable_backend())
    tx = engine.begin(agent_id="a")
    runner = runner_class("chat")(tx)
    reply = chat_message(("c1", "charge", {"amount": 42, "card": "4242"}))

    def dies(self: Any, calls: Any) -> Any:
        raise agenttx.StorageError("the process died here")

    monkeypatch.setattr(agenttx.Transaction, "call_turn", dies)
    with pytest.raises(agenttx.StorageError, match="died"):
        runner.handle(USER, reply)
    monkeypatch.undo()
    assert effects(tmp_path) == []
    engine.close()

    store = durable_backend()
    assert stored_messages(store, tx.id) == [*USER, reply]
    engine = make_engine(tmp_path, store)
    assert tx.id in engine.recover("resume").resumed
    restored = runner_class("chat").restore(engine.get(tx.id))
    assert restored.messages == [*USER, reply]
    assert restored.unanswered == ("c1",)
    messages = restored.resume()
    (answer,) = results("chat", {"messages": messages})
    assert answer[1]["step"] == 1
    assert [e.split()[0] for e in effects(tmp_path)] == ["charge"]  # once
    assert stored_messages(store, tx.id) == messages


def _downgrade(store: Any, tx_id: str, record: str) -> None:
    """Take `store`'s database back to the schema before the message log (SQLite 9,
    PostgreSQL migration 6), with `record` as the conversation of `tx_id`, as the runner of
    that version wrote it (a whole record)."""
    if isinstance(store, SQLiteStore):
        import sqlite3  # noqa: PLC0415

        with contextlib.closing(sqlite3.connect(store.path)) as connection:
            connection.execute("DROP TRIGGER conversation_appended")
            connection.execute("DROP TRIGGER conversation_ended")
            connection.execute("DROP TABLE conversation_messages")
            connection.execute("ALTER TABLE txs DROP COLUMN conversation_append")
            connection.execute("UPDATE txs SET conversation = ? WHERE tx_id = ?", (record, tx_id))
            connection.execute("PRAGMA user_version = 9")
            connection.commit()
        return
    import psycopg  # noqa: PLC0415

    from conftest import postgres_dsn  # noqa: PLC0415

    s = store.schema
    with psycopg.connect(postgres_dsn(), autocommit=True) as connection:
        connection.execute(f"DROP TABLE {s}.conversation_messages")
        connection.execute(f"DROP FUNCTION {s}.request_decided() CASCADE")
        connection.execute(f"DELETE FROM {s}.migrations WHERE version >= 7")
        connection.execute(
            f"UPDATE {s}.txs SET conversation = %s WHERE tx_id = %s", (record, tx_id)
        )


@pytest.mark.timeout(120)
def test_a_conversation_kept_by_the_previous_version_restores_and_goes_on(
    durable_backend, tmp_path
):
    """A database of the version before the message log, holding a waiting turn's whole
    record, opens (migrated), its conversation restores (the turn waits on its request), the
    turn completes once approved, and from then on the log holds the messages."""
    from agenttx.integrations import _conversation  # noqa: PLC0415

    agent_store = durable_backend()
    engine = make_engine(tmp_path, agent_store)
    tx = engine.begin(agent_id="support")
    runner = runner_class("chat")(tx)
    reply = chat_message(
        ("c1", "lookup_order", {"order_id": "o-1"}),
        ("c2", "issue_refund", {"order_id": "o-1", "amount": 30}),
    )
    runner.handle(USER, reply)
    (request,) = runner.waiting
    state = json.loads(agent_store.read_conversation(tx.id))
    old = _conversation.load(json.dumps(state), "t", lambda n: agent_store.read_messages(tx.id, n))
    whole = _conversation.dump("openai.chat", "truncate", old.messages, old.steps, old.turn)
    assert json.loads(whole)["format"] == 1
    engine.close()
    _downgrade(agent_store, tx.id, whole)

    store = durable_backend()  # opens the older database: migrated
    engine = make_engine(tmp_path, store)
    assert tx.id in engine.recover("resume").resumed
    restored = runner_class("chat").restore(engine.get(tx.id))
    assert restored.messages == [*USER, reply]
    assert restored.unanswered == ("c2",)
    assert [r.id for r in restored.waiting] == [request.id]
    engine.approve(request.id, actor="alice")
    messages = restored.resume()
    assert [i for i, r in results("chat", {"messages": messages}) if r["ok"]] == ["c1", "c2"]
    assert effects(tmp_path) == ["refund_issued o-1 30"]
    assert json.loads(store.read_conversation(tx.id))["format"] == 2
    assert stored_messages(store, tx.id) == messages


def test_messages_past_the_count_of_the_record_are_not_read(tmp_path):
    """A log holding more messages than its record counts (appended by a write whose record
    did not land) restores as the record says; one holding fewer is refused with
    StorageError naming the transaction."""
    store = SQLiteStore(tmp_path / "a.db")
    tx = agenttx.Transaction(tools=rewinding_tools(), store=store)
    runner = runner_class("chat")(tx)
    messages = runner.handle(USER, chat_message(("c1", "lookup", {"email": "a@x"})))
    record = store.read_conversation(tx.id)
    store.record_conversation(tx.id, record, ['{"role":"user","content":"junk"}'], start=3)
    del runner
    gc.collect()
    assert runner_class("chat").restore(tx).messages == messages
    gc.collect()
    store.record_conversation(tx.id, record, [], start=2)  # the log lost its last message
    with pytest.raises(agenttx.StorageError, match=tx.id):
        runner_class("chat").restore(tx)
