"""The command line on every store: each command on a SQLite file and on a PostgreSQL DSN (or
`AGENTTX_DATABASE`), ORPHANED plan runs, unfinished prerequisites, the readable audit trail,
what waits for a person, and hostile strings shown as text."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

import agenttx
from agenttx import Engine, EngineConfig
from agenttx._approvals import requests_for
from agenttx._cli import main, open_target
from agenttx._cli._trail import LINE, audit_lines
from agenttx._events import Event, EventKind
from conftest import drop_schema, postgres_dsn

if TYPE_CHECKING:
    from collections.abc import Iterator

WORKER = Path(__file__).with_name("_cli_worker.py")


class Backend:
    """One store's backend: `make()` opens a store on it; `args` name it on the command line
    (TARGET, and `--schema` for PostgreSQL); `text` is TARGET alone."""

    def __init__(self, kind: str, text: str, schema: str) -> None:
        self.kind = kind
        self.text = text
        self.schema = schema
        self.made: list[Any] = []

    @property
    def args(self) -> list[str]:
        """TARGET, and `--schema NAME` (before the other arguments: options go anywhere)."""
        return [self.text, *self.schema_args]

    @property
    def schema_args(self) -> list[str]:
        return ["--schema", self.schema] if self.kind == "postgres" else []

    def make(self, **options: Any) -> Any:
        if self.kind == "sqlite":
            from agenttx.stores import SQLiteStore  # noqa: PLC0415

            options.pop("lease_seconds", None)
            store: Any = SQLiteStore(self.text, **options)
        else:
            from agenttx.stores import PostgresStore  # noqa: PLC0415

            store = PostgresStore(self.text, schema=self.schema, **options)
        self.made.append(store)
        return store


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        made = Backend("sqlite", str(tmp_path / "cli.db"), "")
        made.make().close()  # the file exists, an empty store
    else:
        made = Backend("postgres", postgres_dsn(), f"t_{secrets.token_hex(6)}")
        made.make().close()  # the schema exists, migrated
    yield made
    for store in made.made:
        store.close()
    if made.kind == "postgres":
        drop_schema(made.text, made.schema)


def run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    """The command line in this process: (status, stdout, stderr)."""
    try:
        status = main(list(arguments))
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else -1
    out, err = capsys.readouterr()
    return status, out, err


@agenttx.tool(name="add")
def add(n: int) -> dict[str, int]:
    return {"n": n + 1}


@agenttx.tool(name="charge", needs_approval=True)
def charge(amount: int) -> dict[str, int]:
    return {"amount": amount}


@agenttx.tool(name="slow", on_unknown="review")
def slow(n: int) -> dict[str, int]:
    time.sleep(0.3)
    return {"n": n}


class Filled(NamedTuple):
    engine: Engine
    ended: agenttx.Transaction
    waiting: agenttx.Transaction
    request: str
    review: str


@pytest.fixture
def filled(backend: Backend) -> Iterator[Filled]:
    """A store with an ended transaction, an open one waiting for the approval of a charge,
    a review of a call whose outcome is unknown, and a finished plan run `done-run`."""
    store = backend.make()
    engine = Engine(tools=[add, charge, slow], store=store, config=EngineConfig(idle_timeout=None))
    ended = engine.begin(agent_id="writer")
    ended.call("add", {"n": 1})
    ended.commit()
    waiting = engine.begin(agent_id="payer")
    request = waiting.call("charge", {"amount": 4200}).approval.id
    other = Engine(tools=[slow], store=store, config=EngineConfig(step_timeout=0.05))
    review = other.begin().call("slow", {"n": 1}).review.id
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("x", tool="add", inputs={"n": 1}),
            agenttx.Node("y", tool="add", inputs={"n": "${x.n}"}),
        ]
    )
    engine.run_plan(plan, initial={}, run_id="done-run")
    yield Filled(engine, ended, waiting, request, review)
    engine.close()
    other.close()


@pytest.mark.timeout(300)
def test_the_reading_commands_work_on_both_stores(backend: Backend, filled: Filled, capsys) -> None:
    """inspect (--preview too), graph and plans give the same answers on a SQLite file and on
    a PostgreSQL DSN."""
    ended, waiting, request = filled.ended, filled.waiting, filled.request
    target = backend.args

    status, out, err = run(capsys, "inspect", *target)
    assert (status, err) == (0, ""), err
    assert "2 open transactions" in out.splitlines()[0]
    assert waiting.id in out
    assert re.search(rf"{ended.id}\s+writer\s+COMMITTED\s+1", out)
    assert "plan runs: the last 1, the last changed first" in out
    assert "waiting for a person: 1 approval request(s), 1 review(s) (see: agenttx approvals" in out

    status, out, err = run(capsys, "inspect", *target, waiting.id)
    assert (status, err) == (0, ""), err
    lines = out.splitlines()
    at = lines.index("waiting for a person (1):")
    assert lines[at + 1] == f"  approval {request}  tool charge  step 1 of transaction {waiting.id}"
    assert lines[at + 2] == '    arguments {"amount":4200}'
    schema = " ".join(["", *backend.schema_args])
    assert f"    approve: agenttx approve {backend.text} {request} --actor NAME{schema}" in lines
    reject = f"agenttx reject {backend.text} {request} --actor NAME --reason TEXT{schema}"
    assert f"    reject:  {reject}" in lines

    status, out, err = run(capsys, "inspect", *target, waiting.id, "--preview", "0")
    assert (status, err) == (0, ""), err
    assert out.startswith(f"transaction {waiting.id}: what an abort would do (nothing done)\n")

    status, out, err = run(capsys, "inspect", *target, ended.id)
    assert (status, err) == (0, ""), err
    assert out.startswith(f"transaction {ended.id} (ended)\n")
    assert out.endswith("waiting for a person: nothing\n")

    status, out, err = run(capsys, "inspect", *target, "done-run")
    assert (status, err) == (0, ""), err
    assert out.startswith("plan run done-run: SUCCEEDED\n")

    status, out, err = run(capsys, "graph", *target, ended.id, "--format", "mermaid")
    assert (status, err) == (0, ""), err
    assert out.startswith("flowchart")

    status, out, err = run(capsys, "plans", *target)
    assert (status, err) == (0, ""), err
    assert re.search(r"done-run\s+SUCCEEDED\s+2 SUCCEEDED", out)
    status, out, err = run(capsys, "plans", *target, "done-run")
    assert (status, err) == (0, ""), err
    assert re.search(r"\n  y\s+SUCCEEDED\s+0\s+1\s+0", out)
    assert out.endswith("waiting for a person: nothing\n")
    assert run(capsys, "plans", *target, "--wait", "2", "done-run") == (status, out, err)
    status, out, err = run(capsys, "plans", *target, "done-run", "--format", "dot")
    assert (status, err) == (0, ""), err
    assert out.startswith("digraph agenttx {")


@pytest.mark.timeout(300)
def test_audit_works_on_both_stores(backend: Backend, filled: Filled, capsys) -> None:
    """`audit` prints the same readable lines, and the same JSON lines with --json, on a
    SQLite file and on a PostgreSQL DSN."""
    ended, target = filled.ended, backend.args
    status, out, err = run(capsys, "audit", *target, ended.id)
    assert (status, err) == (0, ""), err
    assert [line.split()[1:4] for line in out.splitlines()] == [
        ["step_dispatched", "step", "1"],
        ["step_completed", "step", "1"],
        ["committed", "-", "-"],
    ]
    status, out, err = run(capsys, "audit", *target, ended.id, "--json")
    assert (status, err) == (0, ""), err
    assert [json.loads(line)["kind"] for line in out.splitlines()] == [
        "step_dispatched",
        "step_completed",
        "committed",
    ]
    status, out, err = run(capsys, "audit", *target)
    assert (status, err) == (0, ""), err
    assert f"transaction {ended.id}" in out.splitlines()
    assert "plan run done-run" in out.splitlines()


@pytest.mark.timeout(300)
def test_the_deciding_commands_work_on_both_stores(
    backend: Backend, filled: Filled, capsys
) -> None:
    """approvals, reject, review and approve decide on a SQLite file and on a PostgreSQL DSN,
    and `inspect TX` then shows nothing waiting."""
    request, review, target = filled.request, filled.review, backend.args
    status, out, err = run(capsys, "approvals", *target)
    assert (status, err) == (0, ""), err
    assert "1 approval request(s) pending:" in out
    assert "1 review(s) pending:" in out
    status, out, err = run(capsys, "reject", *target, request, "--actor", "bob", "--reason", "no")
    assert (status, out, err) == (0, f"rejected {request} by bob: no\n", "")
    status, out, err = run(
        capsys, "review", *target, review, "--outcome", "not_done", "--actor", "ops"
    )
    assert (status, out, err) == (0, f"review {review} resolved not_done by ops\n", "")
    assert run(capsys, "approve", *target, request, "--actor", "alice")[0] == 2
    status, out, err = run(capsys, "inspect", *target, filled.waiting.id)
    assert out.endswith("waiting for a person: nothing\n")


@pytest.mark.timeout(300)
def test_agenttx_database_names_the_target(backend: Backend, capsys, monkeypatch) -> None:
    """Without TARGET, every command reads `AGENTTX_DATABASE`, with the same output; a lone
    argument that names no store is the TX (or RUN) then."""
    store = backend.make()
    engine = Engine(tools=[add, charge], store=store, config=EngineConfig(idle_timeout=None))
    tx = engine.begin(agent_id="env")
    request = tx.call("charge", {"amount": 1}).approval.id
    given = {
        name: run(capsys, *command[:1], *backend.args, *command[1:])
        for name, command in {
            "inspect": ["inspect"],
            "tx": ["inspect", tx.id],
            "plans": ["plans"],
            "approvals": ["approvals"],
        }.items()
    }
    monkeypatch.setenv("AGENTTX_DATABASE", backend.text)
    schema = backend.schema_args
    status, out, err = run(capsys, "inspect", *schema)
    assert (status, err) == (0, "")
    *listing, last = out.splitlines()
    assert listing == given["inspect"][1].splitlines()[:-1]
    assert last.endswith(f"(see: {' '.join(['agenttx', 'approvals', *schema])})")
    assert run(capsys, "plans", *schema) == given["plans"]
    assert run(capsys, "approvals", *schema) == given["approvals"]
    status, out, err = run(capsys, "inspect", *schema, tx.id)
    assert (status, err) == (0, "")
    assert f"agenttx approve {' '.join([request, '--actor', 'NAME', *schema])}\n" in out
    # The listing names the transaction's age, which may have ticked a second meanwhile.
    aged = [
        re.sub(r"age: \d+s", "age: Ns", text.split("waiting for a person")[0])
        for text in (out, given["tx"][1])
    ]
    assert aged[0] == aged[1]
    status, out, err = run(capsys, "approve", *schema, request, "--actor", "alice")
    assert (status, err) == (0, ""), err
    assert out == f"approved {request} by alice\n"
    monkeypatch.delenv("AGENTTX_DATABASE")
    status, out, err = run(capsys, "inspect")
    assert (status, out) == (2, "")
    assert err == "agenttx inspect: no TARGET given, and AGENTTX_DATABASE is not set\n"
    engine.close()


def _worker(backend: Backend, lease: float) -> subprocess.Popen[str]:
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), backend.text, backend.schema or "-", str(lease)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert worker.stdout is not None
    assert worker.stdout.readline() == "ready\n"
    return worker


@pytest.mark.timeout(300)
def test_a_run_whose_owner_died_is_orphaned(backend: Backend, capsys) -> None:
    """`plans` shows a run as RUNNING while its process lives, and as ORPHANED once it is
    killed (SQLite: at once; PostgreSQL: once its lease has expired)."""
    worker = _worker(backend, lease=2.0)
    try:
        status, out, err = run(capsys, "plans", *backend.args)
        assert (status, err) == (0, ""), err
        assert re.search(r"held\s+RUNNING\s+", out), out
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        assert worker.stdout is not None
        worker.stdout.close()
    while True:
        status, out, err = run(capsys, "plans", *backend.args)
        assert (status, err) == (0, ""), err
        if backend.kind == "sqlite" or "ORPHANED" in out:
            break
        time.sleep(0.2)  # the lease runs out
    assert re.search(r"held\s+ORPHANED\s+1 PENDING, 1 RUNNING", out), out
    status, out, err = run(capsys, "plans", *backend.args, "held")
    assert (status, err) == (0, ""), err
    assert out.startswith("plan run held: ORPHANED (its runner is gone")
    assert re.search(r"\n  next\s+PENDING\s+1\s", out), out


@pytest.mark.timeout(300)
def test_waits_counts_only_unfinished_prerequisites(backend: Backend, capsys) -> None:
    """A node waiting on four prerequisites, three of them done, shows WAITS 1 (the stored
    count, written when the node last changed, says 4), and its live run RUNNING."""
    release = threading.Event()

    @agenttx.tool(name="hold")
    def hold() -> dict[str, int]:
        release.wait(timeout=120)
        return {}

    store = backend.make()
    engine = Engine(tools=[add, hold], store=store, config=EngineConfig(idle_timeout=None))
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("a", tool="add", inputs={"n": 1}),
            agenttx.Node("b", tool="add", inputs={"n": 1}),
            agenttx.Node("c", tool="add", inputs={"n": 1}),
            agenttx.Node("d", tool="hold"),
            agenttx.Node("e", tool="add", inputs={"n": 1}, after=("a", "b", "c", "d")),
        ]
    )
    run_ = engine.start_plan(plan, initial={}, run_id="waiting-run")
    try:
        while True:
            status, out, err = run(capsys, "plans", *backend.args, "waiting-run")
            assert (status, err) == (0, ""), err
            done = all(re.search(rf"\n  {node}\s+SUCCEEDED", out) for node in "abc")
            if done and re.search(r"\n  d\s+RUNNING", out):
                break
            time.sleep(0.05)
        assert out.startswith("plan run waiting-run: RUNNING\n"), out
        assert re.search(r"\n  e\s+PENDING\s+1\s", out), out
    finally:
        release.set()
        run_.wait()
        engine.close()


@pytest.mark.timeout(300)
def test_a_plan_node_waiting_for_approval_is_shown_waiting(backend: Backend, capsys) -> None:
    """A started node whose call waits for a person's approval shows WAITING_APPROVAL in
    `plans TARGET`, `plans TARGET RUN` (text and graph) and `inspect TARGET RUN`, as
    `run.node_states()` says (the store keeps it RUNNING); approved, it runs and succeeds."""
    store = backend.make()
    engine = Engine(tools=[add, charge], store=store, config=EngineConfig(idle_timeout=None))
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("pay", tool="charge", inputs={"amount": 5}),
            agenttx.Node("after", tool="add", inputs={"n": 1}, after=("pay",)),
        ]
    )
    run_ = engine.start_plan(plan, initial={}, run_id="gated-run")
    try:
        while not run_.pending_approvals():
            time.sleep(0.05)
        assert run_.node_states()["pay"] is agenttx.NodeState.WAITING_APPROVAL
        status, out, err = run(capsys, "plans", *backend.args)
        assert (status, err) == (0, ""), err
        assert re.search(r"gated-run\s+RUNNING\s+1 PENDING, 1 WAITING_APPROVAL", out), out
        for command in ("plans", "inspect"):
            status, out, err = run(capsys, command, *backend.args, "gated-run")
            assert (status, err) == (0, ""), err
            assert re.search(r"\n  pay\s+WAITING_APPROVAL\s+0\s", out), out
            assert re.search(r"\n  after\s+PENDING\s", out), out
        status, out, err = run(capsys, "plans", *backend.args, "gated-run", "--format", "mermaid")
        assert (status, err) == (0, ""), err
        assert "waiting_approval" in out, out
        run_.approve(run_.pending_approvals()[0].id, actor="alice")
        assert run_.wait(timeout=120).status is agenttx.PlanStatus.SUCCEEDED
        status, out, err = run(capsys, "plans", *backend.args, "gated-run")
        assert re.search(r"\n  pay\s+SUCCEEDED\s", out), out
    finally:
        if not run_.done:
            run_.cancel("the test ends")
            run_.wait(timeout=120)
        engine.close()


def test_audit_lines_are_readable_bounded_and_escaped() -> None:
    """One line an event: UTC time to the second, kind, step or node, actor, and a summary
    (the tool, what waits and its id, a failure's hint, a compensation's kind); every agent
    string escaped and every line cut to LINE characters, a 10 MB one too."""
    at = dt.datetime(2026, 12, 1, 21, 40, 5, 123456, tzinfo=dt.timezone.utc)
    hostile = "\x1b[31m<script>alert(1)</script>\u202e"
    events = [
        Event(kind=EventKind.STEP_DISPATCHED, at=at, scope="transaction", scope_id="t1", seq=0,
              step=1, data={"tool": "charge"}),
        Event(kind=EventKind.APPROVAL_REQUESTED, at=at, scope="transaction", scope_id="t1",
              seq=1, step=1, data={"request": "apr-1", "tool": "charge"}),
        Event(kind=EventKind.APPROVED, at=at, scope="transaction", scope_id="t1", seq=2,
              actor="alice", data={"request": "apr-1", "note": "", "edited": True}),
        Event(kind=EventKind.STEP_FAILED, at=at, scope="transaction", scope_id="t1", seq=3,
              step=2, data={"tool": hostile, "hint": "Hint: " + hostile + "x" * 10_000_000}),
        Event(kind=EventKind.COMPENSATED, at=at, scope="plan", scope_id="r1", seq=0,
              node=hostile, actor=hostile * 3, data={"kind": "refund", "description": "d"}),
    ]  # fmt: skip
    lines = audit_lines(events, headers=True)
    assert lines[0] == "transaction t1"
    assert lines[1] == (
        "2026-12-01T21:40:05Z  step_dispatched         step 1            -                 charge"
    )
    assert lines[2].endswith(
        "step 1            -                 charge: waiting for approval apr-1"
    )
    assert lines[3].endswith("alice             approved apr-1 with edited arguments")
    assert lines[4].startswith("2026-12-01T21:40:05Z  step_failed             step 2  ")
    assert "\\x1b[31m<script>alert(1)</script>\\u202e: Hint: \\x1b[31m<script>" in lines[4]
    assert lines[5] == "plan run r1"
    assert "node \\x1b[31m" in lines[6]
    assert "refund: d" in lines[6]
    assert all(len(line) <= LINE for line in lines)
    assert not any(ch in line for line in lines for ch in "\x1b\u202e")


@pytest.mark.timeout(300)
def test_hostile_stored_strings_are_shown_as_text_and_bounded(backend: Backend, capsys) -> None:
    """A request whose tool name and arguments hold markup, escape codes and 10 MB is shown by
    `inspect`, `approvals` and `audit` as escaped text, each line bounded."""
    store = backend.make()
    engine = Engine(tools=[charge], store=store, config=EngineConfig(idle_timeout=None))
    tx = engine.begin(agent_id="\x1b[2Jagent")
    tx.call("charge", {"amount": 1})
    hostile = "\x1b[31m<script>alert(1)</script>"
    stored = requests_for(store).request(
        scope="transaction",
        scope_id=tx.id,
        tool=hostile + "T" * 10_000_000,
        arguments={"note": hostile + "B" * 10_000_000},
        digest="0" * 64,
        step=1,
    )
    for command in (["inspect", *backend.args, tx.id], ["approvals", *backend.args]):
        status, out, err = run(capsys, *command)
        assert (status, err) == (0, ""), err
        assert "\x1b" not in out
        assert stored.id in out
        assert "\\x1b[31m<script>alert(1)</script>" in out
        assert max(map(len, out.splitlines())) < 200
    engine.close()


def test_an_unreachable_server_or_a_bad_dsn_is_one_line_and_status_2(capsys) -> None:
    """A DSN naming no server, or a malformed one, exits 2 with one line that never shows the
    password."""
    for dsn in (
        "postgresql://user:s3cret@127.0.0.1:1/db?connect_timeout=1",
        "postgresql://user:s3cret@[::1/x",
        "postgres://user:s3cret@127.0.0.1:1/db?sslmode=nonsense",
    ):
        status, out, err = run(capsys, "plans", dsn)
        assert (status, out) == (2, ""), err
        assert err.startswith("agenttx plans: cannot open postgres"), err
        assert err.count("\n") == 1
        assert "s3cret" not in err


@pytest.mark.parametrize(
    ("dsn", "hidden"),
    [
        # libpq quotes a malformed percent-encoding of the password
        ("postgresql://agent:s3cret%PW@127.0.0.1:1/db", ["s3cret", "cret%PW"]),
        # an '@' in the password: libpq splits at the first '@' and names the rest as host
        ("postgresql://agent:p@ss3cretPW@127.0.0.1:1/db", ["ss3cretPW", "p@ss"]),
        ("postgresql://agent:x@y@z3cretPW@127.0.0.1:1/db", ["y@z3cret", "z3cretPW", "x@y"]),
        # a password in the query, malformed, and a short one quoted whole
        ("postgresql://agent@127.0.0.1:1/db?password=qu3ryPW%zz", ["qu3ryPW", '"p%']),
        ("postgresql://agent:p%@127.0.0.1:1/db", ['"p%"', ":p%"]),
        ("postgresql://agent:a%40b3cretPW@127.0.0.1:1/db?connect_timeout=1", ["b3cretPW"]),
    ],
)
def test_no_part_of_a_dsn_password_shows_in_any_message(capsys, dsn, hidden) -> None:
    """Whatever the driver's message quotes of a DSN (its password as libpq splits it at the
    first '@', percent-decoded or raw, a `password=` parameter), no part of the password
    shows, on stderr as in the name of the store; argparse's errors hide it too."""
    status, out, err = run(capsys, "plans", dsn)
    assert (status, out) == (2, ""), err
    assert err.startswith("agenttx plans: cannot open postgresql://agent"), err
    for text in hidden:
        assert text not in err, err
    status, out, err = run(capsys, "plans", "x.db", "RUN", dsn)  # argparse quotes it
    assert status == 2
    assert "unrecognized arguments: postgresql://agent" in err, err
    for text in hidden:
        assert text not in err, err


def test_a_missing_driver_names_the_extra(capsys, monkeypatch) -> None:
    """Without psycopg, a PostgreSQL TARGET says which extra to install."""
    monkeypatch.setitem(sys.modules, "psycopg", None)
    status, out, err = run(capsys, "inspect", "postgresql://localhost/db")
    assert (status, out) == (2, "")
    assert err == (
        "agenttx inspect: a PostgreSQL TARGET needs psycopg: pip install 'agenttx[postgres]'\n"
    )


def test_a_schema_that_is_not_an_agenttx_store_is_one_line(capsys) -> None:
    """A DSN whose schema holds no agenttx store exits 2, saying so, and creates nothing."""
    dsn = postgres_dsn()
    schema = f"t_{secrets.token_hex(6)}"
    status, out, err = run(capsys, "inspect", dsn, "--schema", schema)
    assert (status, out) == (2, "")
    assert f"the schema `{schema}` is at version 0" in err
    import psycopg  # noqa: PLC0415

    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    assert found is None


def test_a_directory_or_a_missing_file_is_still_one_line(tmp_path, capsys, monkeypatch) -> None:
    """A directory, a missing file or a non-database file as TARGET, given or from the
    environment: one line, status 2."""
    junk = tmp_path / "junk.txt"
    junk.write_text("not a database")
    for target, message in (
        (tmp_path, "is a directory, not a SQLite database"),
        (tmp_path / "missing.db", "no such file"),
        (junk, "not a database"),
    ):
        status, out, err = run(capsys, "audit", str(target))
        assert (status, out) == (2, ""), err
        assert message in err
        assert err.count("\n") == 1
        monkeypatch.setenv("AGENTTX_DATABASE", str(target))
        status, out, err = run(capsys, "plans")
        assert (status, out) == (2, ""), err
        assert message in err
        monkeypatch.delenv("AGENTTX_DATABASE")


def _many_ended(path: str, count: int) -> int:
    """Copy the file's one ended transaction `count` times (new ids): more history than the
    default retention keeps; the number of ended transactions kept."""
    import sqlite3  # noqa: PLC0415

    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        for number in range(count):
            conn.execute(
                "INSERT INTO ended (tx_id, record, isolation, history, steps, ended_at) "
                "SELECT tx_id || ?, record, isolation, history, steps, ended_at FROM ended "
                "WHERE rowid = (SELECT min(rowid) FROM ended)",
                (f"-copy-{number}",),
            )
        return int(conn.execute("SELECT count(DISTINCT tx_id) FROM ended").fetchone()[0])


@pytest.mark.timeout(300)
def test_a_decision_never_prunes_the_history(tmp_path: Path, capsys) -> None:
    """`agenttx approve` (and every store a decision opens, `agenttx ui`'s too) writes through a
    store that prunes nothing: a store whose agents keep every ended transaction
    (`keep_history=None`) keeps them all, past the default 1,000."""
    from agenttx.stores import SQLiteStore  # noqa: PLC0415

    path = str(tmp_path / "keep.db")
    store = SQLiteStore(path, keep_history=None, keep_history_for=None)
    engine = Engine(tools=[add, charge], store=store, config=EngineConfig(idle_timeout=None))
    ended = engine.begin(agent_id="keeper")
    ended.call("add", {"n": 1})
    ended.commit()
    request = engine.begin(agent_id="payer").call("charge", {"amount": 5}).approval.id
    kept = _many_ended(path, 1_100)
    assert kept == 1_101
    status, _out, err = run(capsys, "approve", path, request, "--actor", "alice")
    assert (status, err) == (0, ""), err
    assert _many_ended(path, 0) == kept
    open_target(path, 1.0, write=True).store.close()
    assert _many_ended(path, 0) == kept
    engine.close()
