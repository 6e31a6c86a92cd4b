"""Durable plan runs on SQLiteStore: transitions recorded, claims, recovery, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import os
import runpy
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from decimal import Decimal
from pathlib import Path
from unittest import mock

import pytest

import agenttx
from agenttx import NodeState, PlanStatus
from agenttx._plans import read_run
from agenttx._plans._execution import PlanExecution
from agenttx._plans._journal import PlanJournal, fold
from agenttx._saga import Backoff
from agenttx._tools import derive_key
from agenttx.stores import SQLiteStore
from agenttx.stores import _sqlite_file as file_module

NO_WAIT = Backoff(base=0, max_wait=0)
ROOT = Path(__file__).resolve().parent.parent


def _diamond() -> agenttx.Plan:
    return agenttx.Plan(
        nodes=[
            agenttx.Node("a", tool="add", inputs={"a": "${initial.n}", "b": 1}),
            agenttx.Node("b", tool="add", inputs={"a": "${initial.n}", "b": 2}),
            agenttx.Node("c", tool="add", inputs={"a": "${a.sum}", "b": "${b.sum}"}),
        ],
        initial=["n"],
    )


@agenttx.tool
def add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


@pytest.fixture
def store(durable_backend):
    """A durable store: SQLite, then PostgreSQL (the shared `durable_backend`)."""
    return durable_backend()


def _nodes(store: SQLiteStore, run_id: str) -> dict[str, dict]:
    image = store.read_plan(run_id)
    return {node.node_id: {"state": node.state, **fold(node.record)} for node in image.nodes}


def test_a_nodes_reported_costs_are_recorded_retries_apart(store):
    """Each node's record keeps the GBP its attempts reported, exact, by category; the cost of
    an attempt that another followed counts as `retry`, as the run's metrics count it."""
    tries: list[int] = []

    @agenttx.tool
    def flaky(ctx: agenttx.ToolContext) -> dict[str, int]:
        tries.append(1)
        ctx.add_cost("0.10")
        ctx.add_cost("0.002", category="model")
        if len(tries) < 2:
            raise ConnectionError("connection refused")
        return {"ok": 1}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("charge", tool="flaky", retries=1),
            agenttx.Node("free", tool="add", inputs={"a": 1, "b": 2}),
        ]
    )
    result = agenttx.run_plan(
        plan, tools=[flaky, add], initial={}, store=store, run_id="r", backoff=NO_WAIT
    )
    assert result.status is PlanStatus.SUCCEEDED
    nodes = _nodes(store, "r")
    assert nodes["charge"]["cost"] == {"retry": "0.102", "tool": "0.10", "model": "0.002"}
    assert "cost" not in nodes["free"]
    metrics = result.metrics.cost
    assert (metrics.retry, metrics.tool, metrics.model) == (
        Decimal("0.102"),
        Decimal("0.10"),
        Decimal("0.002"),
    )


def test_every_transition_of_a_run_is_recorded(store):
    """Each node's state, inputs, output, attempt, timestamps and history are in the file."""
    engine = agenttx.Engine(tools=[add], store=store)
    result = engine.run_plan(_diamond(), initial={"n": 1}, run_id="r1")
    assert result.status is PlanStatus.SUCCEEDED
    image = store.read_plan("r1")
    assert image.status == "SUCCEEDED"
    assert image.cancel is None
    nodes = _nodes(store, "r1")
    assert {k: v["state"] for k, v in nodes.items()} == dict.fromkeys("abc", "SUCCEEDED")
    c = nodes["c"]
    assert c["inputs"] == {"a": 2, "b": 3}
    assert c["output"] == {"sum": 5}
    assert c["attempt"] == "c#1"
    assert c["unresolved"] == 0
    assert [step[0] for step in c["history"]] == ["PENDING", "READY", "RUNNING", "SUCCEEDED"]
    assert c["started_at"] <= c["finished_at"]
    record, _ = read_run(image)
    assert record["plan_version"] == _diamond().version
    assert record["initial"] == {"n": 1}
    assert agenttx.Plan.from_json(record["plan"]).version == _diamond().version


def test_a_dependant_starts_only_after_its_prerequisites_are_recorded(store, durable_backend):
    """When a node's tool runs, the file already says its prerequisites SUCCEEDED."""
    seen: list[str] = []
    other = durable_backend()  # another store on the same file or schema

    @agenttx.tool
    def look(sum: int) -> dict[str, int]:  # noqa: A002
        nodes = {node.node_id: node for node in other.read_plan("r").nodes}
        seen.append(nodes["a"].state)
        return {"sum": sum}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("a", tool="add", inputs={"a": 1, "b": 1}),
            agenttx.Node("d", tool="look", inputs={"sum": "${a.sum}"}),
        ]
    )
    result = agenttx.run_plan(plan, tools=[add, look], initial={}, store=store, run_id="r")
    assert result.status is PlanStatus.SUCCEEDED
    assert seen == ["SUCCEEDED"]


def test_retries_and_failures_are_recorded_with_their_hint(store):
    """A retried node shows each attempt; a failed one its error; its dependants SKIPPED."""
    calls: list[str] = []

    @agenttx.tool
    def flaky(ctx: agenttx.ToolContext) -> dict[str, int]:
        calls.append(ctx.idempotency_key)
        if len(calls) == 1:
            raise ConnectionError("connection refused")
        return {"n": 1}

    @agenttx.tool
    def broken() -> dict[str, int]:
        raise ValueError("the warehouse id is unknown")

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("f", tool="flaky", retries=1),
            agenttx.Node("x", tool="broken"),
            agenttx.Node("after_x", tool="add", inputs={"a": 1, "b": 1}, after=("x",)),
        ]
    )
    result = agenttx.run_plan(
        plan, tools=[flaky, broken, add], initial={}, store=store, run_id="r", backoff=NO_WAIT
    )
    assert result.status is PlanStatus.FAILED
    nodes = _nodes(store, "r")
    assert nodes["f"]["state"] == "SUCCEEDED"
    assert nodes["f"]["retries"] == 1
    assert [h[0] for h in nodes["f"]["history"]] == [
        "READY", "RUNNING", "READY", "RUNNING", "SUCCEEDED"
    ]  # fmt: skip
    assert calls == [derive_key("r", plan.version, "f", "flaky")] * 2
    assert nodes["x"]["state"] == "FAILED"
    assert "warehouse id is unknown" in nodes["x"]["error"]
    assert nodes["after_x"]["state"] == "SKIPPED"
    assert store.read_plan("r").status == "FAILED"


def test_only_one_claim_of_a_node_succeeds(store):
    """Two runners holding the same run: the second claim of a node is refused."""
    agenttx.run_plan(_diamond(), tools=[add], initial={"n": 1}, store=store, run_id="done")
    journal = PlanJournal.begin(store, "r", {"plan": None}, [("a", "READY", 0)])
    twin = PlanJournal.resumed(store, "r", read_run(store.read_plan("r"))[1])
    assert journal.claim("a", "a#1", 1)
    assert not twin.claim("a", "a#9", 1)
    assert store.read_plan("r").nodes[0].attempt == "a#1"
    twin.end_attempt("a", "a#9", "SUCCEEDED", output={})
    assert not twin.flush()  # not its attempt: nothing written
    journal.end_attempt("a", "a#1", "SUCCEEDED", output={"ok": 1})
    assert journal.flush()
    assert not journal.claim("a", "a#2", 2)  # a completed node is never claimed again
    assert read_run(store.read_plan("r"))[1]["a"].output == {"ok": 1}


def test_a_store_that_lost_the_run_writes_nothing(tmp_path):
    """Once recovery claims a run, the old owner's writes raise StorageError."""
    path = tmp_path / "plans.db"
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        journal = PlanJournal.begin(first, "r", {"plan": None}, [("a", "READY", 0)])
        owner = first.read_plan("r").owner
        assert second.claim_plan("r", owner) is None  # a store open in this process
        first.close()
        assert second.claim_plan("r", owner) is not None
        with pytest.raises(agenttx.StorageError):
            journal.claim("a", "a#1", 1)


WORKER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import agenttx
    from agenttx.stores import SQLiteStore

    root = Path(sys.argv[1])

    def count(name):
        with (root / "calls.log").open("a") as log:
            log.write(name + "\\n")

    @agenttx.tool
    def step(ctx: agenttx.ToolContext, name: str, crash: bool) -> dict[str, str]:
        count(f"{name} {ctx.idempotency_key}")
        if crash and not (root / "crashed").exists():
            (root / "crashed").touch()
            os._exit(9)  # the process dies after the effect, before the result is recorded
        return {"name": name}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("a", tool="step", inputs={"name": "a", "crash": False}),
            agenttx.Node("b", tool="step", inputs={"name": "b", "crash": False}, after=("a",)),
            agenttx.Node("c", tool="step", inputs={"name": "${b.name}", "crash": True}),
            agenttx.Node("d", tool="step", inputs={"name": "d", "crash": False}, after=("c",)),
        ]
    )
    engine = agenttx.Engine(tools=[step], store=SQLiteStore(root / "plans.db"))
    if sys.argv[2] == "run":
        engine.run_plan(plan, initial={}, run_id="crashy", max_concurrency=1)
    else:
        report = engine.recover()
        print(json.dumps(list(report.plans_resumed)))
        result = engine.get_plan("crashy").wait(30)
        print(json.dumps({k: [v.state.value, v.output] for k, v in result.nodes.items()}))
    """
)


def test_recovery_resumes_a_killed_run_without_running_completed_nodes_again(tmp_path):
    """After the process dies inside a tool, recovery resumes the run: the completed nodes are
    not run again, the interrupted one runs again with the same idempotency key, and its
    dependants follow; nothing stays claimed."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {"PYTHONPATH": str(ROOT)}
    died = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "run"], env=env, check=False, timeout=60
    )
    assert died.returncode == 9
    with SQLiteStore(tmp_path / "plans.db", readonly=True) as view:
        image = view.read_plan("crashy")
    assert image.status == "RUNNING"
    assert {n.node_id: n.state for n in image.nodes}["c"] == "RUNNING"  # claimed, never ended
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "recover"],
        env=env,
        check=False,
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    resumed, nodes = (json.loads(line) for line in done.stdout.splitlines())
    assert resumed == ["crashy"]
    assert nodes == {
        "a": ["SUCCEEDED", {"name": "a"}],
        "b": ["SUCCEEDED", {"name": "b"}],
        "c": ["SUCCEEDED", {"name": "b"}],
        "d": ["SUCCEEDED", {"name": "d"}],
    }
    calls = (tmp_path / "calls.log").read_text().split("\n")[:-1]
    names = [line.split()[0] for line in calls]
    assert names == ["a", "b", "b", "b", "d"]  # c ran twice (its inputs say "b"), a and b once
    assert calls[2].split()[1] == calls[3].split()[1]  # the same idempotency key
    with SQLiteStore(tmp_path / "plans.db") as after:
        image = after.read_plan("crashy")
        assert image.status == "SUCCEEDED"
        assert all(n.state == "SUCCEEDED" for n in image.nodes)
        assert after.open_transactions() == ()
        assert agenttx.Engine(tools=[], store=after).recover() == agenttx.RecoveryReport()
        # The audit trail holds both runners' events, numbered on without a gap or a clash.
        events = [agenttx.Event.from_json(json.loads(text)) for text in after.plan_audit("crashy")]
        assert [event.seq for event in events] == list(range(len(events)))
        kinds = [event.kind for event in events]
        assert kinds.count(agenttx.EventKind.VALIDATED) == 2  # the first runner, the resumed one
        assert kinds[-1] is agenttx.EventKind.FINISHED


def test_cancel_plan_from_another_thread_is_recorded_then_seen(store):
    """`Engine.cancel_plan` records the cancellation durably; the runner stops dispatching."""
    release = threading.Event()
    started = threading.Event()

    @agenttx.tool
    def wait() -> dict[str, int]:
        started.set()
        release.wait(10)
        return {"n": 1}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("w", tool="wait"),
            agenttx.Node("after", tool="add", inputs={"a": 1, "b": 1}, after=("w",)),
        ]
    )
    engine = agenttx.Engine(tools=[wait, add], store=store)
    run = engine.start_plan(plan, initial={}, run_id="r")
    assert engine.get_plan("r") is run
    assert started.wait(10)
    engine.cancel_plan("r", "the customer changed their mind")
    release.set()
    result = run.wait(10)
    assert result.status is PlanStatus.CANCELLED
    assert result.nodes["after"].state is NodeState.CANCELLED
    image = store.read_plan("r")
    assert image.cancel == "the customer changed their mind"
    assert image.status == "CANCELLED"
    with pytest.raises(agenttx.FailedPrecondition, match="ended or was cancelled"):
        engine.cancel_plan("r")


def test_a_cancellation_from_another_store_is_seen_before_the_next_dispatch(tmp_path):
    """Another process (here, another store on the file) cancels; the runner reads it."""
    path = tmp_path / "plans.db"
    release = threading.Event()

    @agenttx.tool
    def wait() -> dict[str, int]:
        release.wait(10)
        return {"n": 1}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("w", tool="wait"),
            agenttx.Node("after", tool="add", inputs={"a": 1, "b": 1}, after=("w",)),
        ]
    )
    with SQLiteStore(path) as store, SQLiteStore(path) as other:
        run = agenttx.start_plan(plan, tools=[wait, add], initial={}, store=store, run_id="r")
        for _ in range(100):
            if any(n.state == "RUNNING" for n in other.read_plan("r").nodes):
                break
            release.wait(0.05)
        assert other.cancel_plan("r", "stop")
        release.set()
        result = run.wait(10)
    assert result.status is PlanStatus.CANCELLED
    assert result.cancel_reason == "stop"
    assert result.nodes["after"].state is NodeState.CANCELLED


def test_unknown_plan_runs_are_refused_with_typed_errors(store):
    """get_plan and cancel_plan of a run nobody knows raise TransactionNotFound."""
    engine = agenttx.Engine(tools=[add], store=store)
    with pytest.raises(agenttx.TransactionNotFound):
        engine.get_plan("nope")
    with pytest.raises(agenttx.TransactionNotFound):
        engine.cancel_plan("nope")
    with pytest.raises(agenttx.TransactionNotFound):
        store.read_plan("nope")
    engine.run_plan(_diamond(), initial={"n": 1}, run_id="r")
    with pytest.raises(agenttx.InvalidArgument, match="exists in the store already"):
        engine.run_plan(_diamond(), initial={"n": 1}, run_id="r")


def test_a_version_3_file_gains_the_plan_tables(tmp_path):
    """Opening a store of schema version 3 migrates it to the latest, keeping what it had."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        for statements in file_module.MIGRATIONS[:3]:
            for statement in statements:
                conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {file_module.APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 3")
        conn.execute("INSERT INTO committed VALUES ('k', 1, '\"v\"')")
    with SQLiteStore(path) as store:
        assert store.read_committed("k") == '"v"'
        assert store.plan_runs() == ()
        agenttx.run_plan(_diamond(), tools=[add], initial={"n": 1}, store=store, run_id="r")
        assert store.plan_runs()[0][:2] == ("r", "SUCCEEDED")
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == file_module.SCHEMA_VERSION


def test_a_memory_store_run_keeps_no_durable_record():
    """On a store without plan tables, runs work as before (nothing to recover)."""
    result = agenttx.run_plan(_diamond(), tools=[add], initial={"n": 1})
    assert result.status is PlanStatus.SUCCEEDED
    assert agenttx.Engine(tools=[add]).recover() == agenttx.RecoveryReport()


def test_a_runner_that_lost_its_run_cancels_and_compensates_nothing(tmp_path):
    """When the store refuses the run's writes (taken over, or gone), the runner cancels its
    copy of the run and leaves completed nodes alone: they belong to whoever holds the run."""
    undone: list[str] = []
    release = threading.Event()
    started = threading.Event()

    @agenttx.compensation
    def undo(payload):
        undone.append(payload["output"]["name"])

    @agenttx.tool(compensate=undo)
    def step(name: str) -> dict[str, str]:
        return {"name": name}

    @agenttx.tool
    def wait(prior: str) -> dict[str, str]:
        started.set()
        release.wait(10)
        return {"name": prior}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("a", tool="step", inputs={"name": "a"}),
            agenttx.Node("w", tool="wait", inputs={"prior": "${a.name}"}),
            agenttx.Node("z", tool="step", inputs={"name": "${w.name}"}),
        ]
    )
    path = tmp_path / "plans.db"
    with SQLiteStore(path) as store:
        run = agenttx.start_plan(
            plan, tools=[undo, step, wait], initial={}, store=store, run_id="r"
        )
        assert started.wait(10)
        with sqlite3.connect(path) as conn:  # a recoverer on another host takes the run over
            conn.execute("UPDATE plan_runs SET owner = '{\"pid\": 1}' WHERE run_id = 'r'")
        release.set()
        result = run.wait(10)
        assert result.status is PlanStatus.CANCELLED
        assert "taken over by another store" in (result.cancel_reason or "")
        assert undone == []
        assert result.compensations == ()
        stored = {n.node_id: n.state for n in store.read_plan("r").nodes}
    assert stored == {"a": "SUCCEEDED", "w": "RUNNING", "z": "PENDING"}  # as it was taken


def _wide(n: int) -> agenttx.Plan:
    """`n` independent nodes, each with one dependant."""
    nodes = []
    for i in range(n):
        nodes.append(agenttx.Node(f"a{i}", tool="add", inputs={"a": i, "b": 1}))
        nodes.append(agenttx.Node(f"b{i}", tool="add", inputs={"a": f"${{a{i}.sum}}", "b": 1}))
    return agenttx.Plan(nodes=nodes)


def test_a_round_of_transitions_is_one_write(store, monkeypatch):
    """Completions, the release of dependants and the next round's claims go in one write
    each round, not three writes a node; every node is still recorded."""
    writes: list[int] = []
    write = SQLiteStore.write_plan

    def counted(self, run_id, changes, **kwargs):
        writes.append(len(changes))
        return write(self, run_id, changes, **kwargs)

    monkeypatch.setattr(SQLiteStore, "write_plan", counted)
    inline = agenttx.tool(add.__wrapped__, name="add", inline=True)
    result = agenttx.run_plan(
        _wide(20), tools=[inline], initial={}, store=store, run_id="r", max_concurrency=64
    )
    assert result.status is PlanStatus.SUCCEEDED
    assert len(writes) <= 4  # claims of a*, then b* claims with a* ends, then the end
    nodes = _nodes(store, "r")
    assert all(node["state"] == "SUCCEEDED" for node in nodes.values())
    assert nodes["b7"]["inputs"] == {"a": 8, "b": 1}
    assert [h[0] for h in nodes["b7"]["history"]] == ["PENDING", "READY", "RUNNING", "SUCCEEDED"]


def test_a_transition_appends_a_line_to_the_node_record(store):
    """A node's record is its first line plus one line per transition, folded on reading; a
    record of the first format (one JSON text) reads the same."""
    agenttx.run_plan(_diamond(), tools=[add], initial={"n": 1}, store=store, run_id="r")
    row = next(node for node in store.read_plan("r").nodes if node.node_id == "c")
    lines = row.record.split("\n")
    assert len(lines) == 4  # begun PENDING; READY; RUNNING; SUCCEEDED
    assert json.loads(lines[-1])["h"][0] == "SUCCEEDED"
    folded = fold(row.record)
    assert fold(json.dumps(folded)) == folded
    assert folded["output"] == {"sum": 5}


def test_events_are_emitted_after_the_transitions_they_report_are_durable(store, monkeypatch):
    """No audit event reports a node's completion before the write that records it."""
    early: list[str] = []
    write = SQLiteStore.write_plan

    def checked(self, run_id, changes, **kwargs):
        reported = {e.node for e in run._audit.events() if e.kind is agenttx.EventKind.COMPLETED}
        early.extend(c.node_id for c in changes if c.state == "SUCCEEDED" and c.node_id in reported)
        return write(self, run_id, changes, **kwargs)

    monkeypatch.setattr(SQLiteStore, "write_plan", checked)
    run = PlanExecution(
        _diamond(),
        tools=[add],
        initial={"n": 1},
        max_concurrency=8,
        resources=None,
        on_failure="skip_dependants",
        store=store,
        rate_limits=None,
        run_id="r",
        dispatcher=None,
        compensate_on="failure",
        backoff=None,
    )
    result = asyncio.run(run.execute())
    assert result.status is PlanStatus.SUCCEEDED
    completed = [e.node for e in result.audit if e.kind is agenttx.EventKind.COMPLETED]
    assert sorted(completed) == ["a", "b", "c"]
    assert early == []


RESUME_WORKER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import agenttx
    from agenttx._saga import Backoff
    from agenttx.stores import SQLiteStore

    root, scenario, phase = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

    def note(name, line):
        with (root / name).open("a") as log:
            log.write(line + "\\n")

    def once(flag):
        # True the first time only, across processes
        if (root / flag).exists():
            return False
        (root / flag).touch()
        return True

    @agenttx.compensation
    def undo(payload):
        note("undone.log", payload["output"]["name"])

    @agenttx.tool(compensate=undo)
    def step(ctx: agenttx.ToolContext, name: str) -> dict[str, str]:
        note("calls.log", f"{name} {ctx.idempotency_key}")
        ctx.state.put(f"k/{name}", name)
        ctx.stage_effect("mail", {"name": name})
        if name == "x":
            raise ValueError("x is refused for good")
        if name == "b" and scenario in ("state", "compensate", "failed") and once("crashed"):
            os._exit(9)  # dies after its writes and effect, before its result is recorded
        if name == "b" and scenario == "compensate":
            raise ValueError("b is refused for good")
        return {"name": name}

    @agenttx.tool
    def flaky(ctx: agenttx.ToolContext) -> dict[str, str]:
        note("calls.log", f"f {ctx.idempotency_key}")
        calls = len((root / "calls.log").read_text().splitlines())
        if calls == 3:
            os._exit(9)  # the third attempt dies: two failures were retried before it
        raise ConnectionError("connection refused")

    def deliver(effect):
        if scenario == "outbox" and once("crashed"):
            os._exit(9)  # dies after the commit, before the first delivery
        note("sent.log", f"{effect.payload['name']} {effect.idempotency_key}")

    if scenario == "budget":
        plan = agenttx.Plan(nodes=[agenttx.Node("f", tool="flaky", retries=2)])
    else:
        x = agenttx.Node("x", tool="step", inputs={"name": "x"})
        first = [x] if scenario == "failed" else []
        plan = agenttx.Plan(
            nodes=[
                *first,
                agenttx.Node("a", tool="step", inputs={"name": "a"}),
                agenttx.Node("b", tool="step", inputs={"name": "b"}, after=("a",)),
                agenttx.Node("c", tool="step", inputs={"name": "c"}, after=("b",)),
            ]
        )
    store = SQLiteStore(root / "plans.db")
    engine = agenttx.Engine(tools=[step, flaky, undo], store=store, dispatcher=deliver)
    nowait = Backoff(base=0, max_wait=0)
    if phase == "run":
        engine.run_plan(plan, initial={}, run_id="r", max_concurrency=1, backoff=nowait)
        sys.exit(0)
    report = engine.recover()
    result = engine.get_plan("r").wait(30)
    print(json.dumps({
        "resumed": list(report.plans_resumed),
        "status": result.status.value,
        "nodes": {k: [v.state.value, list(v.attempt_ids)] for k, v in result.nodes.items()},
        "committed": dict((k, v) for k, _, v in store.committed_keys("k/")),
        "outbox": len(store.pending_effects()),
        "open": list(store.open_transactions()),
        "compensations": [[c.node_id, c.status.value] for c in result.compensations],
        "errors": {k: v.error.text for k, v in result.nodes.items() if v.error},
    }))
    """
)


def _crash_then_recover(tmp_path: Path, scenario: str) -> dict:
    """Run the scenario's plan in a process that dies, then recover it in this one (so that
    the resume is measured by coverage; the recover phase of the script never exits)."""
    script = tmp_path / "worker.py"
    script.write_text(RESUME_WORKER)
    env = {"PYTHONPATH": str(ROOT)}
    run = [sys.executable, str(script), str(tmp_path), scenario]
    died = subprocess.run([*run, "run"], env=env, check=False, timeout=60)
    assert died.returncode == 9
    out = io.StringIO()
    argv = [str(script), str(tmp_path), scenario, "recover"]
    with mock.patch.object(sys, "argv", argv), contextlib.redirect_stdout(out):
        done = runpy.run_path(str(script), run_name="__main__")
    done["store"].close()
    return json.loads(out.getvalue())


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_state_writes_of_nodes_completed_before_a_crash_are_kept(tmp_path):
    """The run's state transaction is resumed with the run: what completed nodes wrote before
    the crash is committed with the rest, and each effect is delivered once."""
    out = _crash_then_recover(tmp_path, "state")
    assert out["resumed"] == ["r"]
    assert out["status"] == "SUCCEEDED"
    assert out["committed"] == {"k/a": '"a"', "k/b": '"b"', "k/c": '"c"'}
    assert [line.split()[0] for line in _lines(tmp_path / "calls.log")] == ["a", "b", "b", "c"]
    sent = _lines(tmp_path / "sent.log")
    assert sorted(line.split()[0] for line in sent) == ["a", "b", "c"]  # b's dead attempt: none
    assert out["outbox"] == 0
    assert out["open"] == []


def test_a_resumed_run_that_fails_compensates_nodes_completed_before_the_crash(tmp_path):
    """Undo records are durable: `a` completed before the crash, the resumed run fails at `b`,
    and `a` (and `b`'s dead attempt, whose effect may have happened) are compensated; nothing
    is published."""
    out = _crash_then_recover(tmp_path, "compensate")
    assert out["status"] == "FAILED"
    assert out["nodes"]["a"][0] == "SUCCEEDED"
    assert out["nodes"]["b"][0] == "FAILED"
    assert out["nodes"]["c"][0] == "SKIPPED"
    assert ["a", "COMPLETED"] in out["compensations"]
    assert "a" in _lines(tmp_path / "undone.log")
    assert out["committed"] == {}
    assert _lines(tmp_path / "sent.log") == []
    assert out["outbox"] == 0
    assert out["open"] == []  # every undo record compensated: the transaction is gone


def test_a_node_that_failed_before_the_crash_stays_failed_with_its_error(tmp_path):
    """`x` failed for good before the crash: the resumed run does not run it again, keeps its
    error, and ends FAILED once the other nodes are done (compensating them)."""
    out = _crash_then_recover(tmp_path, "failed")
    assert out["resumed"] == ["r"]
    assert out["status"] == "FAILED"
    assert out["nodes"]["x"][0] == "FAILED"
    assert "x is refused for good" in out["errors"]["x"]
    calls = [line.split()[0] for line in _lines(tmp_path / "calls.log")]
    assert calls == ["x", "a", "b", "b", "c"]  # x, before the crash, and only then


def _died_running(tmp_path: Path) -> Path:
    """A store holding RUNNING run `r` whose process died (the `budget` scenario's)."""
    script = tmp_path / "worker.py"
    script.write_text(RESUME_WORKER)
    run = [sys.executable, str(script), str(tmp_path), "budget", "run"]
    died = subprocess.run(run, env={"PYTHONPATH": str(ROOT)}, check=False, timeout=60)
    assert died.returncode == 9
    return tmp_path / "plans.db"


def test_recovery_leaves_a_run_of_a_live_owner_alone(tmp_path):
    """A RUNNING run whose owner record names a live process on this host is skipped."""
    import socket  # noqa: PLC0415

    db = _died_running(tmp_path)
    owner = json.dumps({"pid": os.getppid(), "hostname": socket.gethostname(), "id": "x"})
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE plan_runs SET owner = ? WHERE run_id = 'r'", (owner,))
    conn.close()
    with SQLiteStore(db) as store:
        report = agenttx.Engine(store=store).recover("resume")
        assert report.plans_resumed == ()
        assert "r" in report.skipped
        assert [run_id for run_id, _ in store.running_plans()] == ["r"]


def test_recovery_reports_a_run_whose_record_it_cannot_read(tmp_path):
    """A run record without its settings is a failure naming the run; nothing runs."""
    db = _died_running(tmp_path)
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute("SELECT record FROM plan_runs WHERE run_id = 'r'").fetchone()
        record = json.loads(text)
        del record["settings"]
        conn.execute("UPDATE plan_runs SET record = ? WHERE run_id = 'r'", (json.dumps(record),))
    conn.close()
    calls = len(_lines(tmp_path / "calls.log"))
    with SQLiteStore(db) as store:
        report = agenttx.Engine(store=store).recover("resume")
        assert report.plans_resumed == ()
        (failure,) = report.failures
        assert failure.startswith("plan run r:")
        assert "unreadable durable record" in failure
    assert len(_lines(tmp_path / "calls.log")) == calls


def test_recovery_leaves_a_run_of_a_store_open_in_this_process_alone(tmp_path):
    """A second engine on the file does not take over a run the first one is running."""
    release = threading.Event()

    @agenttx.tool
    def hold() -> dict[str, bool]:
        release.wait(10)
        return {"held": True}

    db = tmp_path / "db"
    with SQLiteStore(db) as one, SQLiteStore(db) as two:
        run = agenttx.Engine(tools=[hold], store=one).start_plan(
            agenttx.Plan(nodes=[agenttx.Node("h", tool="hold")]), initial={}
        )
        try:
            report = agenttx.Engine(tools=[hold], store=two).recover("resume")
            assert report.plans_resumed == ()
            assert run.id in report.skipped
        finally:
            release.set()
        assert run.wait(10).status is PlanStatus.SUCCEEDED


def test_a_resumed_node_gets_only_the_retries_it_has_left(tmp_path):
    """Two transient failures were retried before the crash killed the third attempt: the
    resumed node runs once more (attempt 4, same idempotency key) and is not retried again."""
    out = _crash_then_recover(tmp_path, "budget")
    assert out["status"] == "FAILED"
    assert out["nodes"]["f"] == ["FAILED", ["f#4"]]
    keys = [line.split()[1] for line in _lines(tmp_path / "calls.log")]
    assert len(keys) == 4
    assert len(set(keys)) == 1


def test_effects_committed_before_a_crash_are_delivered_on_recovery(tmp_path):
    """The commit put the effects in the outbox; the process died before delivering them; the
    resumed run delivers them, once each, and runs no node again."""
    out = _crash_then_recover(tmp_path, "outbox")
    assert out["status"] == "SUCCEEDED"
    assert [line.split()[0] for line in _lines(tmp_path / "calls.log")] == ["a", "b", "c"]
    assert sorted(line.split()[0] for line in _lines(tmp_path / "sent.log")) == ["a", "b", "c"]
    assert out["outbox"] == 0
    assert out["committed"] == {"k/a": '"a"', "k/b": '"b"', "k/c": '"c"'}


def test_undo_records_whose_compensation_failed_are_kept_for_recovery(store):
    """A failed run whose compensation fails keeps its undo records in the store (the run's
    transaction ends keeping them); `Engine.recover` retries them later, then forgets them."""
    broken = [True]
    undone: list[str] = []

    @agenttx.compensation
    def unreserve(payload):
        if broken[0]:
            raise ConnectionError("the warehouse is down")
        undone.append(payload["output"]["id"])

    @agenttx.tool(compensate=unreserve)
    def reserve() -> dict[str, str]:
        return {"id": "r-1"}

    @agenttx.tool
    def refuse(id: str) -> dict[str, str]:  # noqa: A002
        raise ValueError("refused")

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("reserve", tool="reserve"),
            agenttx.Node("confirm", tool="refuse", inputs={"id": "${reserve.id}"}),
        ]
    )
    engine = agenttx.Engine(tools=[reserve, refuse, unreserve], store=store)
    result = engine.run_plan(plan, initial={}, run_id="r")
    assert result.status is PlanStatus.FAILED
    assert [c.status.value for c in result.compensations] == ["FAILED"]
    assert store.open_transactions() == ("r",)
    assert len(store.peek("r").undos) == 1
    assert store.read_plan("r").status == "FAILED"
    broken[0] = False
    report = engine.recover()
    assert report.compensations_run == 1
    assert undone == ["r-1"]
    assert store.open_transactions() == ()


def test_compensate_on_never_drops_the_undo_records(store):
    """With `compensate_on="never"` a failed run reports its undos REQUESTED and leaves
    nothing for recovery to run."""
    undone: list[str] = []

    @agenttx.compensation
    def unreserve(payload):
        undone.append(payload["output"]["id"])

    @agenttx.tool(compensate=unreserve)
    def reserve() -> dict[str, str]:
        return {"id": "r-1"}

    @agenttx.tool
    def refuse(id: str) -> dict[str, str]:  # noqa: A002
        raise ValueError("refused")

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("reserve", tool="reserve"),
            agenttx.Node("confirm", tool="refuse", inputs={"id": "${reserve.id}"}),
        ]
    )
    engine = agenttx.Engine(tools=[reserve, refuse, unreserve], store=store)
    result = engine.run_plan(plan, initial={}, run_id="r", compensate_on="never")
    assert [c.status.value for c in result.compensations] == ["REQUESTED"]
    assert store.open_transactions() == ()
    assert engine.recover().compensations_run == 0
    assert undone == []


def _take_over(store: object, backend: str, run_id: str) -> None:
    """What a recoverer elsewhere does to the run in the database: a new owner (SQLite) or
    a new epoch (PostgreSQL), so that the runner's next write is refused."""
    if backend == "sqlite":
        with sqlite3.connect(store.path) as conn:  # type: ignore[attr-defined]
            conn.execute("UPDATE plan_runs SET owner = '{\"pid\": 1}' WHERE run_id = ?", (run_id,))
        conn.close()
        return
    import psycopg  # noqa: PLC0415

    from conftest import postgres_dsn  # noqa: PLC0415

    with psycopg.connect(postgres_dsn(), autocommit=True) as conn:
        conn.execute(
            f"UPDATE {store.schema}.plan_runs SET epoch = epoch + 1 WHERE run_id = %s",  # type: ignore[attr-defined]
            (run_id,),
        )


def test_a_run_left_by_a_closed_store_is_resumed_and_audited_by_another(durable_backend):
    """A store closes with its run RUNNING and no node run: another store's engine resumes
    it, runs each node once, and reads its audit trail and its listing back."""
    calls: list[int] = []

    @agenttx.tool
    def add(a: int, b: int) -> dict[str, int]:
        calls.append(a)
        return {"sum": a + b}

    one = durable_backend()
    PlanExecution(
        _diamond(),
        tools=[add],
        initial={"n": 1},
        max_concurrency=8,
        resources=None,
        on_failure="skip_dependants",
        store=one,
        rate_limits=None,
        run_id="r",
        dispatcher=None,
        compensate_on="failure",
        backoff=None,
    ).open_journal()
    one.close()
    two = durable_backend()
    engine = agenttx.Engine(tools=[add], store=two)
    report = engine.recover("resume")
    assert report.plans_resumed == ("r",)
    assert engine.recover("resume").plans_resumed == ()  # held by this engine now
    result = engine.get_plan("r").wait(20)
    assert result.status is PlanStatus.SUCCEEDED
    assert len(calls) == len(_diamond().nodes)
    assert agenttx.Engine(store=two).audit("r") == result.audit  # read from the store
    assert ("r", "SUCCEEDED") in [(run_id, status) for run_id, status, _ in two.plan_runs()]
    assert two.running_plans() == ()


def test_a_runner_whose_run_was_taken_over_writes_nothing_more(durable_backend):
    """The run is taken over while a node runs: the runner's next write is refused, it
    cancels its copy and the stored nodes stay as they were taken (both backends)."""
    release = threading.Event()
    started = threading.Event()

    @agenttx.tool
    def hold() -> dict[str, bool]:
        started.set()
        release.wait(10)
        return {"held": True}

    store = durable_backend()
    plan = agenttx.Plan(nodes=[agenttx.Node("h", tool="hold")])
    run = agenttx.start_plan(plan, tools=[hold], initial={}, store=store, run_id="r")
    assert started.wait(10)
    _take_over(store, durable_backend.backend, "r")
    release.set()
    result = run.wait(10)
    assert result.status is PlanStatus.CANCELLED
    assert "taken over by another store" in (result.cancel_reason or "")
    assert {n.node_id: n.state for n in store.read_plan("r").nodes} == {"h": "RUNNING"}


# -- exclusive resources held across runs --------------------------------------------------


def _held_plan(order: int = 7) -> agenttx.Plan:
    return agenttx.Plan(
        nodes=[
            agenttx.Node(
                "pay",
                tool="hold_order",
                inputs={"order_id": "${initial.order_id}"},
                exclusive_resource="order:${initial.order_id}",
            ),
            agenttx.Node(
                "ship",
                tool="hold_order",
                inputs={"order_id": "${pay.order_id}"},
                exclusive_resource="order:${initial.order_id}",
            ),
        ],
        initial=["order_id"],
    )


def _overlaps(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    ordered = sorted(spans)
    return [b for a, b in itertools.pairwise(ordered) if b[0] < a[1]]


def test_two_runs_sharing_an_exclusive_resource_never_overlap(durable_backend):
    """Two runs on two stores of one backend, in two threads, never hold `order:7` at once."""
    spans: list[tuple[float, float]] = []
    guard = threading.Lock()

    @agenttx.tool
    def hold_order(order_id: int) -> dict[str, int]:
        began = time.monotonic()
        time.sleep(0.05)
        with guard:
            spans.append((began, time.monotonic()))
        return {"order_id": order_id}

    stores = [durable_backend(), durable_backend()]
    results: dict[str, agenttx.PlanResult] = {}

    def run(index: int) -> None:
        results[f"r{index}"] = agenttx.run_plan(
            _held_plan(),
            tools=[hold_order],
            initial={"order_id": 7},
            store=stores[index],
            run_id=f"r{index}",
            backoff=Backoff(base=0.01, max_wait=0.05),
        )

    threads = [threading.Thread(target=run, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert {run_id: r.status for run_id, r in results.items()} == {
        "r0": PlanStatus.SUCCEEDED,
        "r1": PlanStatus.SUCCEEDED,
    }
    assert len(spans) == 4
    assert _overlaps(spans) == []
    assert stores[0].plan_holds() == ()
    waited = [
        event.data["checks"]["waited_for"]
        for run_id in results
        for event in results[run_id].audit
        if event.kind is agenttx.EventKind.DISPATCHED
    ]
    assert ["hold:order:7"] in waited  # the run that came second waited for the hold


def test_another_orders_resource_is_not_held_back(store):
    """A run holding `order:7` does not hold back a node of another order."""
    journal = PlanJournal.begin(store, "r1", {}, [("pay", "READY", 0)])
    assert journal.claim_all([("pay", "pay#1", 1)], holds={"pay": "order:7"}) == frozenset()
    other = PlanJournal.begin(store, "r2", {}, [("pay", "READY", 0)])
    assert other.claim_all([("pay", "pay#1", 1)], holds={"pay": "order:8"}) == frozenset()
    assert other.held == frozenset()
    assert [hold[:2] for hold in store.plan_holds()] == [("order:7", "r1"), ("order:8", "r2")]


def test_a_held_claim_is_refused_whole_and_succeeds_once_released(store):
    """A claim whose resource another run holds writes nothing; after the end it succeeds."""
    first = PlanJournal.begin(store, "r1", {}, [("pay", "READY", 0)])
    assert first.claim_all([("pay", "pay#1", 1)], holds={"pay": "order:7"}) == frozenset()
    second = PlanJournal.begin(store, "r2", {}, [("pay", "READY", 0), ("log", "READY", 0)])
    claims = [("pay", "pay#1", 1), ("log", "log#1", 1)]
    assert second.claim_all(claims, holds={"pay": "order:7"}) == frozenset()
    assert second.held == frozenset({"pay"})
    nodes = _nodes(store, "r2")
    assert (nodes["pay"]["state"], nodes["pay"]["attempt"]) == ("READY", None)
    assert nodes["log"]["state"] == "RUNNING"  # the rest of the write was made
    assert second.state("pay") == "READY"
    assert store.plan_holds() == (("order:7", "r1", "pay", "pay#1"),)
    first.end_attempt("pay", "pay#1", "SUCCEEDED", output={"ok": True})
    assert first.flush()
    assert store.plan_holds() == ()
    assert second.claim_all([("pay", "pay#1", 1)], holds={"pay": "order:7"}) == frozenset()
    assert second.held == frozenset()
    assert store.plan_holds() == (("order:7", "r2", "pay", "pay#1"),)


def test_a_retry_keeps_its_hold_and_the_runs_end_frees_it(store):
    """A retried attempt releases and retakes its resource; the run's end frees every hold."""
    journal = PlanJournal.begin(store, "r1", {}, [("pay", "READY", 0)])
    assert journal.claim_all([("pay", "pay#1", 1)], holds={"pay": "order:7"}) == frozenset()
    journal.end_attempt("pay", "pay#1", "READY", error="timeout")
    assert journal.claim_all([("pay", "pay#2", 2)], holds={"pay": "order:7"}) == frozenset()
    assert store.plan_holds() == (("order:7", "r1", "pay", "pay#2"),)
    journal.flush("FAILED")
    assert store.plan_holds() == ()


@pytest.mark.parametrize("ending", ["failure", "cancellation"])
def test_holds_are_released_when_a_run_fails_or_is_cancelled(store, ending):
    """A node that fails, or a run cancelled while the node runs, leaves no hold behind."""
    seen: list[tuple[tuple[str, str, str, str], ...]] = []

    @agenttx.tool
    def hold_order(order_id: int) -> dict[str, int]:
        seen.append(store.plan_holds())
        if ending == "failure":
            raise ValueError("the order is closed")
        store.cancel_plan("r", "stop")
        time.sleep(0.3)
        return {"order_id": order_id}

    result = agenttx.run_plan(
        _held_plan(), tools=[hold_order], initial={"order_id": 7}, store=store, run_id="r"
    )
    expected = PlanStatus.FAILED if ending == "failure" else PlanStatus.CANCELLED
    assert result.status is expected
    assert seen == [(("order:7", "r", "pay", "pay#1"),)]  # held while the tool ran
    assert store.plan_holds() == ()


def test_a_crashed_runs_holds_are_freed_when_recovery_takes_it_over(durable_backend):
    """A dead runner's hold blocks other runs until a recoverer takes its run over."""
    dead = durable_backend(lease_seconds=0.2)
    journal = PlanJournal.begin(dead, "r1", {}, [("pay", "READY", 0)])
    assert journal.claim_all([("pay", "pay#1", 1)], holds={"pay": "order:7"}) == frozenset()
    owner = dead.read_plan("r1").owner
    dead.close()  # the runner dies holding order:7
    live = durable_backend(lease_seconds=0.2)
    other = PlanJournal.begin(live, "r2", {}, [("pay", "READY", 0)])
    assert other.claim_all([("pay", "pay#1", 1)], holds={"pay": "order:7"}) == frozenset()
    assert other.held == frozenset({"pay"})
    time.sleep(0.3)  # past the dead runner's lease (PostgreSQL)
    assert live.claim_plan("r1", owner) is not None
    assert live.plan_holds() == ()
    assert other.claim_all([("pay", "pay#1", 1)], holds={"pay": "order:7"}) == frozenset()
    assert other.held == frozenset()
    assert live.plan_holds() == (("order:7", "r2", "pay", "pay#1"),)


# -- resource capacities counted across runs -----------------------------------------------


def test_a_capacity_of_one_is_never_exceeded_across_two_runs(durable_backend):
    """Two runs with `payments_api: 1`, on two stores in two threads, never pay at once."""
    spans: list[tuple[float, float]] = []
    guard = threading.Lock()

    @agenttx.tool
    def pay(n: int) -> dict[str, int]:
        began = time.monotonic()
        time.sleep(0.05)
        with guard:
            spans.append((began, time.monotonic()))
        return {"n": n}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node(name, tool="pay", inputs={"n": 1}, resources={"payments_api": 1})
            for name in ("p1", "p2")
        ]
    )
    stores = [durable_backend(), durable_backend()]
    results: dict[str, agenttx.PlanResult] = {}

    def run(index: int) -> None:
        results[f"r{index}"] = agenttx.run_plan(
            plan,
            tools=[pay],
            initial={},
            store=stores[index],
            run_id=f"r{index}",
            resources={"payments_api": 1},
            backoff=Backoff(base=0.01, max_wait=0.05),
        )

    threads = [threading.Thread(target=run, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [results[run_id].status for run_id in sorted(results)] == [PlanStatus.SUCCEEDED] * 2
    assert len(spans) == 4
    assert _overlaps(spans) == []
    assert stores[0].plan_units() == ()
    waited = [
        event.data["checks"]["waited_for"]
        for result in results.values()
        for event in result.audit
        if event.kind is agenttx.EventKind.DISPATCHED
    ]
    assert any("shared:payments_api" in labels for labels in waited)


def test_units_are_counted_over_every_run_and_freed_at_the_end(store):
    """A claim past the capacity counted over all runs is held; the units go at the end."""
    first = PlanJournal.begin(store, "r1", {}, [("a", "READY", 0), ("b", "READY", 0)])
    units = {"a": (("api", 1, 2),), "b": (("api", 1, 2),)}
    assert first.claim_all([("a", "a#1", 1)], units=units) == frozenset()
    second = PlanJournal.begin(store, "r2", {}, [("a", "READY", 0)])
    assert second.claim_all([("a", "a#1", 1)], units={"a": (("api", 1, 2),)}) == frozenset()
    assert second.held == frozenset()
    assert first.claim_all([("b", "b#1", 1)], units=units) == frozenset()
    assert first.held == frozenset({"b"})  # 2 of 2 units are taken by r1.a and r2.a
    assert _nodes(store, "r1")["b"]["state"] == "READY"
    assert store.plan_units() == (("api", "r1", "a", 1), ("api", "r2", "a", 1))
    second.end_attempt("a", "a#1", "SUCCEEDED", output={})
    assert second.flush()
    assert store.plan_units() == (("api", "r1", "a", 1),)
    assert first.claim_all([("b", "b#1", 1)], units=units) == frozenset()
    assert first.held == frozenset()
    first.flush("CANCELLED")
    assert store.plan_units() == ()


# -- tools' rate limits counted across runs --------------------------------------------------


def test_a_rate_bucket_is_shared_by_every_run(store):
    """A tool's token bucket is shared by every run on the store: once its one token is
    taken, another run's claim is held (nothing of it written) until the bucket refills."""
    slow = ("charge", 0.001, 1)  # one token at first, then one every 1,000 s
    first = PlanJournal.begin(store, "r1", {}, [("a", "READY", 0)])
    second = PlanJournal.begin(store, "r2", {}, [("a", "READY", 0)])
    assert first.claim_all([("a", "a#1", 1)], rates={"a": slow}) == frozenset()
    assert first.held == frozenset()
    assert second.claim_all([("a", "a#1", 1)], rates={"a": slow}) == frozenset()
    assert second.held == frozenset({"a"})
    assert _nodes(store, "r2")["a"]["state"] == "READY"
    ((tool, tokens, _),) = store.plan_rates()
    assert tool == "charge"
    assert tokens < 0.01
    refilling = ("charge", 1e6, 1)  # a run whose limit refills the bucket at once
    assert second.claim_all([("a", "a#1", 1)], rates={"a": refilling}) == frozenset()
    assert second.held == frozenset()
    assert _nodes(store, "r2")["a"]["state"] == "RUNNING"


def test_a_claim_that_fails_its_compare_and_set_gives_its_token_back(store):
    """The token a refused claim took goes back to the bucket in the same write."""
    rate = ("charge", 0.001, 2)
    journal = PlanJournal.begin(store, "r1", {}, [("a", "READY", 0)])
    assert journal.claim_all([("a", "a#1", 1)], rates={"a": rate}) == frozenset()
    ((_, after_one, _),) = store.plan_rates()
    assert 0.99 < after_one < 1.01
    assert journal.claim_all([("a", "a#2", 2)], rates={"a": rate}) == frozenset({"a"})
    ((_, after_refusal, _),) = store.plan_rates()
    assert 0.99 < after_refusal < 1.01
    assert _nodes(store, "r1")["a"]["attempt"] == "a#1"


def test_runs_crossing_over_several_resources_all_finish_without_overlap(durable_backend):
    """Three runs whose nodes take three resources in different orders and end at different
    times all succeed (no write deadlocks), each resource with one holder at a time and the
    shared `api` never past its capacity."""
    spans: dict[str, list[tuple[float, float]]] = {"r1": [], "r2": [], "r3": []}
    guard = threading.Lock()

    @agenttx.tool
    def use(resource: str, wait: float) -> dict[str, str]:
        began = time.monotonic()
        time.sleep(wait)
        with guard:
            spans[resource].append((began, time.monotonic()))
        return {"resource": resource}

    def plan(order: list[str], wait: float) -> agenttx.Plan:
        return agenttx.Plan(
            nodes=[
                agenttx.Node(
                    f"n{index}",
                    tool="use",
                    inputs={"resource": resource, "wait": wait * (index + 1)},
                    exclusive_resource=resource,
                    resources={"api": 1},
                )
                for index, resource in enumerate(order)
            ]
        )

    orders = [["r1", "r2", "r3"], ["r3", "r2", "r1"], ["r2", "r3", "r1"]]
    stores = [durable_backend() for _ in orders]
    results: dict[int, agenttx.PlanResult] = {}

    def run(index: int) -> None:
        results[index] = agenttx.run_plan(
            plan(orders[index], 0.01 * (index + 1)),
            tools=[use],
            initial={},
            store=stores[index],
            run_id=f"x{index}",
            resources={"api": 2},
            backoff=Backoff(base=0.005, max_wait=0.02),
        )

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(orders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [results[index].status for index in sorted(results)] == [PlanStatus.SUCCEEDED] * 3
    for resource, used in spans.items():
        assert len(used) == 3, resource
        assert _overlaps(used) == [], resource
    every = [span for used in spans.values() for span in used]
    busiest = max(sum(1 for a, b in every if a <= start < b) for start, _ in every)
    assert busiest <= 2  # the api's capacity of 2, counted over the three runs
    assert stores[0].plan_holds() == ()
    assert stores[0].plan_units() == ()


def test_a_rate_limit_is_counted_over_every_run(durable_backend):
    """Two runs whose tool allows 2 starts per 1,000 s, on two stores in two threads: only
    2 of their 4 nodes start (each run alone would start both of its own); the others wait
    until their run is cancelled."""
    calls: list[str] = []
    guard = threading.Lock()

    @agenttx.tool
    def pay(n: int) -> dict[str, int]:
        with guard:
            calls.append(f"pay {n}")
        return {"n": n}

    plan = agenttx.Plan(
        nodes=[agenttx.Node(name, tool="pay", inputs={"n": 1}) for name in ("p1", "p2")]
    )
    stores = [durable_backend(), durable_backend()]
    runs = [
        agenttx.start_plan(
            plan,
            tools=[pay],
            initial={},
            store=stores[index],
            run_id=f"r{index}",
            rate_limits={"pay": agenttx.RateLimit(per_second=0.002, burst=2)},
            backoff=Backoff(base=0.01, max_wait=0.05),
        )
        for index in range(2)
    ]
    deadline = time.monotonic() + 30
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # ample for a third start, were the bucket counted per run
    assert len(calls) == 2
    waiting = [run for run in runs if run.status is PlanStatus.RUNNING]
    assert waiting  # a run with a node that cannot start does not end by itself
    for run in waiting:
        run.cancel("the test is over")
    results = [run.wait(30) for run in runs]
    assert {result.status for result in results} <= {PlanStatus.SUCCEEDED, PlanStatus.CANCELLED}
    states = sorted(node.state.value for result in results for node in result.nodes.values())
    assert states == ["CANCELLED", "CANCELLED", "SUCCEEDED", "SUCCEEDED"]
    ((tool, tokens, _),) = stores[0].plan_rates()
    assert tool == "pay"
    assert tokens < 0.1


# ---------------------------------------------------------------------- tools gone after a crash


def _died_after_a(tmp_path: Path) -> Path:
    """A store holding RUNNING run `r` whose process died inside node `b`, after node `a`
    completed (its `compensate=` undo durable): the `state` scenario's."""
    script = tmp_path / "worker.py"
    script.write_text(RESUME_WORKER)
    run = [sys.executable, str(script), str(tmp_path), "state", "run"]
    died = subprocess.run(run, env={"PYTHONPATH": str(ROOT)}, check=False, timeout=60)
    assert died.returncode == 9
    return tmp_path / "plans.db"


def _undo(undone: list[str]) -> object:
    @agenttx.compensation
    def undo(payload):
        undone.append(payload["output"]["name"])

    return undo


def _ended_cancelled(store: SQLiteStore) -> None:
    image = store.read_plan("r")
    assert image.status == "CANCELLED"
    states = {node.node_id: node.state for node in image.nodes}
    assert states == {"a": "SUCCEEDED", "b": "CANCELLED", "c": "CANCELLED"}
    kinds = [json.loads(text)["kind"] for text in store.plan_audit("r")]
    assert "compensated" in kinds
    assert kinds[-1] == "finished"


def test_a_run_whose_tool_is_gone_is_not_resumed_and_says_which(tmp_path):
    """Resuming a run whose plan uses a tool no longer registered raises `PlanToolMissing`
    (naming it); recovery lists it in `failures`, claims nothing, and an abort still ends it."""
    store = SQLiteStore(_died_after_a(tmp_path))
    undone: list[str] = []
    tools = [_undo(undone)]
    with pytest.raises(agenttx.PlanToolMissing) as info:
        agenttx._plans.resume_plan(store, store.read_plan("r"), tools=tools)
    assert (info.value.tool, info.value.run_id, info.value.code) == (
        "step",
        "r",
        "plan_tool_missing",
    )
    engine = agenttx.Engine(tools=tools, store=store)
    report = engine.recover("resume")
    assert report.plans_resumed == ()
    (line,) = [failure for failure in report.failures if failure.startswith("plan run r")]
    assert "`step`" in line
    assert store.read_plan("r").status == "RUNNING"
    assert undone == []
    report = engine.recover("abort")  # not wedged: the abort ends it
    assert report.compensations_run == 1
    assert undone == ["a"]
    _ended_cancelled(store)
    assert store.open_transactions() == ()
    store.close()


def test_cancelling_a_run_whose_tool_is_gone_compensates_its_completed_nodes(tmp_path):
    """`engine.cancel_plan` ends a dead run that cannot be resumed: `a`'s compensation (found
    by its kind) runs, and the run ends CANCELLED with the audit of it."""
    store = SQLiteStore(_died_after_a(tmp_path))
    undone: list[str] = []
    engine = agenttx.Engine(tools=[_undo(undone)], store=store)
    engine.cancel_plan("r", "the tool was retired")
    assert undone == ["a"]
    _ended_cancelled(store)
    assert store.open_transactions() == ()
    assert engine.recover().plans_resumed == ()
    store.close()


def test_an_undo_whose_compensation_is_gone_too_is_kept_and_retried(tmp_path):
    """Neither the tool nor the compensation is registered: the abort ends the run, keeps
    the undo record as failed (reported), and a later recovery with the compensation runs it."""
    db = _died_after_a(tmp_path)
    store = SQLiteStore(db)
    report = agenttx.Engine(tools=[], store=store).recover("abort")
    assert any("plan run r" in line and "undo" in line for line in report.failures)
    _ended_cancelled_without_compensation = store.read_plan("r")
    assert _ended_cancelled_without_compensation.status == "CANCELLED"
    assert store.open_transactions() == ("r",)  # its undo record is kept
    undone: list[str] = []
    report = agenttx.Engine(tools=[_undo(undone)], store=store).recover("abort")
    assert undone == ["a"]
    assert store.open_transactions() == ()
    store.close()


@pytest.mark.timeout(60)
def test_a_nodes_new_key_after_a_compensated_late_call_is_durable(store):
    """A retry after a late call that was compensated runs under the node's next key; the
    node's record keeps its generation, and a resumed run derives that key again."""
    go = threading.Event()
    calls: list[str] = []
    refunds: list[str] = []

    @agenttx.compensation
    def refund(payload):
        refunds.append(payload["output"]["key"])

    @agenttx.tool(compensate=refund)
    def charge(ctx: agenttx.ToolContext) -> dict[str, str]:
        calls.append(ctx.idempotency_key)
        go.wait(30)
        return {"key": ctx.idempotency_key}

    def hook(event: agenttx.Event) -> None:
        if event.kind is agenttx.EventKind.RETRIED:
            go.set()

    plan = agenttx.Plan(nodes=[agenttx.Node("c", tool="charge", timeout=0.2, retries=1)])
    result = agenttx.run_plan(
        plan, tools=[charge, refund], initial={}, store=store, hooks=[hook], backoff=NO_WAIT
    )
    assert result.status is PlanStatus.SUCCEEDED
    first = derive_key(result.run_id, plan.version, "c", "charge")
    second = derive_key(result.run_id, plan.version, "c", "charge", 1)
    assert calls == [first, second]
    assert refunds == [first]
    assert _nodes(store, result.run_id)["c"]["generation"] == 1
    _, restored = read_run(store.read_plan(result.run_id))
    resumed = PlanExecution(
        plan,
        tools=[charge, refund],
        initial={},
        max_concurrency=1,
        resources=None,
        on_failure="skip_dependants",
        store=agenttx.stores.MemoryStore(),
        rate_limits=None,
        run_id=result.run_id,
        dispatcher=None,
        compensate_on="failure",
        backoff=None,
        restored=restored,
    )
    assert resumed._nodes["c"].key == second


def _keys(value: object) -> object:
    """The keys of every object in `value`, in their order, at every depth."""
    if isinstance(value, dict):
        return [(key, _keys(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [_keys(item) for item in value]
    return None


def test_a_resumed_plan_gives_tools_objects_in_the_key_order_given(durable_backend):
    """A run resumed from its durable record gives each node's tool its literal input and
    the initial values with their keys in the order given, at every depth (the record keeps
    them as given, not sorted)."""
    seen: list[object] = []

    @agenttx.tool
    def echo(value: dict) -> dict:
        seen.append(_keys(value))
        return {"w": 1, "value": value}

    nested = {"zip": "N1", "lines": [{"sku": "b", "qty": 2}], "at": {"y": 1, "x": 2}}
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("literal", tool="echo", inputs={"value": nested}),
            agenttx.Node("given", tool="echo", inputs={"value": "${initial.order}"}),
            agenttx.Node("output", tool="echo", inputs={"value": "${literal}"}),
        ],
        initial=["order"],
    )
    one = durable_backend()
    PlanExecution(
        plan,
        tools=[echo],
        initial={"order": nested},
        max_concurrency=8,
        resources=None,
        on_failure="skip_dependants",
        store=one,
        rate_limits=None,
        run_id="r",
        dispatcher=None,
        compensate_on="failure",
        backoff=None,
    ).open_journal()
    one.close()
    engine = agenttx.Engine(tools=[echo], store=durable_backend())
    assert engine.recover("resume").plans_resumed == ("r",)
    assert engine.get_plan("r").wait(20).status is PlanStatus.SUCCEEDED
    assert sorted(seen, key=json.dumps) == sorted(
        [_keys(nested), _keys(nested), _keys({"w": 1, "value": nested})], key=json.dumps
    )


def test_orphaned_plans_lists_the_running_runs_whose_runner_is_gone(durable_backend):
    """A RUNNING run is not orphaned while the store that began it holds it; once that store
    has closed (SQLite: no store or process holds it; PostgreSQL: its lease ended), every
    store lists it in `orphaned_plans`; an ended run never."""
    from agenttx.stores import PlanNodeRow  # noqa: PLC0415

    runner, reader = durable_backend(), durable_backend()
    node = [PlanNodeRow(node_id="a", state="PENDING", attempt=None, record="{}")]
    runner.begin_plan("running", "{}", node)
    runner.begin_plan("ended", "{}", node)
    runner.write_plan("ended", [], status="SUCCEEDED")
    assert runner.orphaned_plans() == ()
    assert reader.orphaned_plans() == ()
    runner.close()
    assert reader.orphaned_plans() == ("running",)


@pytest.mark.timeout(60)
def test_a_node_call_that_returns_late_writes_its_undo_as_it_returns(store):
    """A node's sync call abandoned at its timeout writes its `compensate=` undo to the run's
    durable log as it returns, while the run is busy with another node (a runner that dies
    then leaves it for recovery); the run's end refunds it once."""
    go, done, timed_out = threading.Event(), threading.Event(), threading.Event()
    refunds: list[str] = []

    @agenttx.compensation
    def refund(payload):
        refunds.append(payload["output"]["charge_id"])

    @agenttx.tool(compensate=refund)
    def charge(amount: int) -> dict:
        go.wait(30)
        return {"charge_id": f"ch-{amount}"}

    @agenttx.tool
    def slow() -> dict:
        done.wait(30)
        return {}

    def hook(event: agenttx.Event) -> None:
        if event.node == "charge" and event.kind is agenttx.EventKind.FAILED:
            timed_out.set()

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("charge", tool="charge", inputs={"amount": 5}, timeout=0.2),
            agenttx.Node("slow", tool="slow", timeout=30),
        ]
    )
    run = agenttx.start_plan(
        plan, tools=[charge, refund, slow], initial={}, store=store, run_id="late", hooks=[hook]
    )
    try:
        assert timed_out.wait(30)
        go.set()
        deadline = time.monotonic() + 20  # a hang guard: the write follows the return at once
        while not store.peek("late").undos and time.monotonic() < deadline:
            time.sleep(0.01)
        rows = store.peek("late").undos
        assert [json.loads(row.record)["payload"]["output"] for row in rows] == [
            {"charge_id": "ch-5"}
        ]
    finally:
        go.set()
        done.set()
    result = run.wait(30)
    assert result.status is PlanStatus.FAILED
    assert result.nodes["charge"].state is NodeState.TIMED_OUT
    assert refunds == ["ch-5"]
