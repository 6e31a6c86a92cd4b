"""The command line, run as a person would: `python -m agenttx inspect | graph | lineage`."""

from __future__ import annotations

import contextlib
import io
import json
import re
import sqlite3
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agenttx
from agenttx import Engine, EngineConfig, StorageError, TransactionNotFound, builtins
from agenttx.stores import SQLiteStore


def agenttx_cli(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agenttx", *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def database(tmp_path_factory) -> tuple[Path, str]:
    """A store with one open transaction of three steps (after a failure and a rewind) and one
    committed effect waiting in the outbox."""
    root = tmp_path_factory.mktemp("cli")
    store = SQLiteStore(root / "agent.db")
    engine = Engine(
        tools=builtins.tools(str(root)), store=store, config=EngineConfig(idle_timeout=None)
    )
    done = engine.begin(agent_id="mailer")
    done.execute_step(1, "effect.stage", {"channel": "email", "payload": {"to": "ada@x.io"}})
    done.commit()
    # mistake_retries=0: the missing key, written in the call, rewinds as any failure would.
    tx = engine.begin(agent_id="support-bot", policy={"mistake_retries": 0})
    insert = {"table": "customers", "id": "c-1", "fields": {"name": "Ada"}}
    tx.execute_step(1, "record.insert", insert)
    assert tx.execute_step(2, "kv.get", {"key": "missing"}).next_step_id == 1  # rewound
    tx.execute_step(1, "record.insert", insert, raw_context="create the customer first")
    tx.execute_step(2, "kv.put", {"key": "owner", "value": "${steps.1.id}"})
    tx.execute_step(3, "effect.stage", {"channel": "hook", "payload": {"id": "${steps.1.id}"}})
    store.close()  # the transaction stays open in the file, as after a crash
    return root / "agent.db", tx.id


def test_inspect_lists_open_transactions(database):
    """`inspect DB` lists each open transaction with its agent, status and steps, and the outbox."""
    db, tx_id = database
    done = agenttx_cli("inspect", str(db))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{db}: 1 open transaction"
    assert lines[1].split() == ["TX", "AGENT", "STATUS", "STEPS", "AGE"]
    assert lines[2].split()[:4] == [tx_id, "support-bot", "ACTIVE", "3"]
    assert lines[3] == "outbox: 1 effect waiting for delivery"


def test_inspect_says_when_the_outbox_count_is_capped(tmp_path):
    """`inspect DB` counts the outbox up to 10,000 and shows more as `10,000+`, not as 10,000."""
    from agenttx.stores import EffectRow  # noqa: PLC0415

    with SQLiteStore(tmp_path / "many.db") as store:
        for tx_id, count in (("t-full", 10_000), ("t-more", 1)):
            store.begin(tx_id)
            effects = [
                EffectRow(step_id=1, channel="c", payload="{}", idempotency_key=f"{tx_id}-{n}")
                for n in range(count)
            ]
            store.record_step(tx_id, 1, "{}", effects, "{}")
            store.commit(tx_id)
            done = agenttx_cli("inspect", str(tmp_path / "many.db"))
            assert done.returncode == 0, done.stderr
            counted = "10000" if tx_id == "t-full" else "10,000+"
            assert f"outbox: {counted} effects waiting for delivery" in done.stdout


def test_inspect_of_a_directory_or_a_missing_file_says_so(tmp_path):
    """`inspect DIR` says it is a directory, not a SQLite database (SQLite says "disk I/O
    error"); a missing file is "no such file"; both exit 2, as other bad input does."""
    for command in ("inspect", "approvals", "plans", "audit"):
        done = agenttx_cli(command, str(tmp_path))
        assert done.returncode == 2
        assert (
            done.stderr == f"agenttx {command}: {tmp_path} is a directory, not a SQLite database\n"
        )
        done = agenttx_cli(command, str(tmp_path / "none.db"))
        assert (done.returncode, done.stderr) == (
            2,
            f"agenttx {command}: no such file: {tmp_path / 'none.db'}\n",
        )
    done = agenttx_cli("approve", str(tmp_path), "apr-1", "--actor", "a")
    assert "is a directory, not a SQLite database" in done.stderr


def test_inspect_shows_one_transaction(database):
    """`inspect DB TX` shows steps, edges, constraints, context, staged effects and undos."""
    db, tx_id = database
    done = agenttx_cli("inspect", str(db), tx_id)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"transaction {tx_id}" in out
    assert "steps (3):" in out
    assert '  2. kv.put {"key":"owner","value":"c-1"}' in out
    assert "  step 1 -> step 2  id -> value  (explicit)" in out
    assert "constraints (1):" in out
    assert "  1. create the customer first" in out
    assert "staged effects (1):" in out
    assert "undo records (0):" in out


def test_inspect_previews_a_rollback(database):
    """`inspect DB TX --preview STEP` says what a rollback would do and changes nothing."""
    db, tx_id = database
    before = db.read_bytes()
    done = agenttx_cli("inspect", str(db), tx_id, "--preview", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"transaction {tx_id}: what a rollback to step 2 would do (nothing done)",
        "voided steps (2):",
        "  2. kv.put",
        "  3. effect.stage",
        "compensations, in the order they would run (0):",
        "staged effects dropped (1):",
        '  step 3 hook {"id":"c-1"}',
        (
            "voided steps with no undo of their own (1): their state writes are restored, "
            "anything else they did stays done"
        ),
        "  2. kv.put",
    ]
    assert db.read_bytes() == before
    aborted = agenttx_cli("inspect", str(db), tx_id, "--preview", "0")
    assert "what an abort would do" in aborted.stdout
    assert "voided steps (3):" in aborted.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("--preview", "4"), "to_step 4 must be lower than the next step 4"),
        (("--preview", "x"), "argument --preview"),
        (("--preview",), "argument --preview"),
    ],
)
def test_inspect_refuses_a_bad_preview(database, arguments, message):
    """A step the rollback would refuse, or no step, is a usage error (exit 2)."""
    db, tx_id = database
    done = agenttx_cli("inspect", str(db), tx_id, *arguments)
    assert done.returncode == 2
    assert message in done.stderr
    assert agenttx_cli("inspect", str(db), "--preview", "1").stderr == (
        "agenttx inspect: --preview needs a transaction id (TX)\n"
    )


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("dot", 's1 -> s2 [label="id -> value"];'),
        ("mermaid", 's1 -->|"id -> value"| s2'),
        ("json", '"target_key": "value"'),
    ],
)
def test_graph_prints_each_format(database, fmt, expected):
    """`graph DB TX --format F` prints the dependency graph in F, deterministically."""
    db, tx_id = database
    first = agenttx_cli("graph", str(db), tx_id, "--format", fmt)
    assert first.returncode == 0, first.stderr
    assert expected in first.stdout
    assert agenttx_cli("graph", str(db), tx_id, "--format", fmt).stdout == first.stdout


def test_inspect_and_graph_write_nothing(database):
    """Inspection is read-only: the file's bytes and its owner are unchanged."""
    db, tx_id = database
    before = db.read_bytes()
    agenttx_cli("inspect", str(db), tx_id)
    agenttx_cli("graph", str(db), tx_id)
    assert db.read_bytes() == before


def test_lineage_of_a_transcript(tmp_path):
    """`lineage TRANSCRIPT.json` prints which call consumed another's value."""
    transcript = [
        {"role": "user", "content": "refund order 4411"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "find_order", "arguments": '{"q": "4411"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"order_id": "ord-4411-x"}'},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "refund", "arguments": '{"order": "ord-4411-x"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "refunded"},
    ]
    path = tmp_path / "transcript.json"
    path.write_text(json.dumps(transcript))
    done = agenttx_cli("lineage", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "2 tool calls, 1 links",
        '  find_order (c1) -> refund (c2)  "ord-4411-x"',
    ]
    mermaid = agenttx_cli("lineage", str(path), "--format", "mermaid")
    assert mermaid.returncode == 0
    assert mermaid.stdout.startswith("flowchart")


def test_lineage_of_a_transcript_driven_by_agenttx(tmp_path):
    """With step payloads and `${steps.N...}` references, `lineage` prints each reference with
    its keys, counts them in the first line, and lists the calls a rewind voided; a key that
    holds a control character is escaped like any other printed text."""

    def call(call_id: str, arguments: dict[str, str]) -> dict[str, object]:
        function = {"name": "t", "arguments": json.dumps(arguments)}
        return {"id": call_id, "type": "function", "function": function}

    def result(call_id: str, payload: dict[str, object]) -> dict[str, object]:
        return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(payload)}

    transcript = [
        {"role": "assistant", "tool_calls": [call("a", {})]},
        result("a", {"ok": True, "step": 1, "output": {"id": "x-1"}, "next_step": 2}),
        {"role": "assistant", "tool_calls": [call("b", {"v": "${steps.1.id}"})]},
        result("b", {"ok": False, "step": 2, "error": "no", "next_step": 1, "voided_steps": [1]}),
        {"role": "assistant", "tool_calls": [call("c", {})]},
        result("c", {"ok": True, "step": 1, "output": {"id": "x-2"}, "next_step": 2}),
        {"role": "assistant", "tool_calls": [call("d", {"odd\u001bkey": "${steps.1.id}"})]},
        result("d", {"ok": True, "step": 2, "output": None, "next_step": 3}),
    ]
    path = tmp_path / "transcript.json"
    path.write_text(json.dumps(transcript))
    done = agenttx_cli("lineage", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "4 tool calls, 1 links (1 by reference), 1 voided by a rewind",
        "  t (c, step 1) -> t (d, step 2)  ${steps.1.id}  id -> odd\\x1bkey",
        "  voided: t (a, step 1)",
    ]


def test_helpful_errors(tmp_path, database):
    """A missing file, a file that is not a store, and an unknown transaction: one line, exit 2."""
    db, _ = database
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    cases = [
        (("inspect", str(tmp_path / "nope.db")), "no such file"),
        (("inspect", str(text)), "not"),
        (("inspect", str(other)), "not an agenttx store"),
        (("graph", str(db), "no-such-tx"), "no open or ended transaction no-such-tx"),
        (("lineage", str(tmp_path / "nope.json")), "no such file"),
        (("lineage", str(bad_json)), "is not a JSON transcript"),
    ]
    for arguments, message in cases:
        done = agenttx_cli(*arguments)
        assert done.returncode == 2, (arguments, done.stdout, done.stderr)
        assert message in done.stderr, (arguments, done.stderr)
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "nope.db").exists()  # inspecting never creates a file


@pytest.mark.parametrize("command", ["demo", "inspect", "graph", "plans", "audit", "lineage"])
def test_every_command_has_help(command):
    """`agenttx COMMAND --help` describes the command and exits 0."""
    done = agenttx_cli(command, "--help")
    assert done.returncode == 0
    assert f"usage: agenttx {command}" in done.stdout


def test_the_commands_in_process(database, tmp_path, capsys):
    """main() runs each command in this process too (the subprocess tests cover the wiring)."""
    from agenttx._cli import main  # noqa: PLC0415

    db, tx_id = database
    assert main(["inspect", str(db)]) == 0
    assert "support-bot" in capsys.readouterr().out
    assert main(["inspect", str(db), tx_id]) == 0
    assert "undo records (0):" in capsys.readouterr().out
    for fmt in ("dot", "mermaid", "json"):
        assert main(["graph", str(db), tx_id, "--format", fmt]) == 0
        assert "kv.put" in capsys.readouterr().out
    transcript = tmp_path / "t.json"
    transcript.write_text(json.dumps([{"role": "assistant", "tool_calls": []}]))
    for fmt in ("text", "dot", "mermaid", "json"):
        assert main(["lineage", str(transcript), "--format", fmt, "--evidence"]) == 0
        assert capsys.readouterr().out
    transcript.write_text('{"role": "assistant"}')
    assert main(["lineage", str(transcript)]) == 2
    assert "must hold a JSON list" in capsys.readouterr().err
    assert main(["graph", str(db), "nope"]) == 2
    assert main(["inspect", str(tmp_path / "missing.db")]) == 2
    assert main([]) == 2
    assert "usage: agenttx" in capsys.readouterr().err


def test_inspect_shows_begun_and_ended_transactions(tmp_path, capsys):
    """A transaction with no record yet, and one ended with undos left, are listed as such."""
    import agenttx  # noqa: PLC0415
    from agenttx._cli import main  # noqa: PLC0415

    @agenttx.compensation(name="undo.fails")
    def fails(payload) -> None:
        raise RuntimeError("down")

    @agenttx.tool
    def act(ctx: agenttx.ToolContext) -> dict:
        ctx.register_undo("undo.fails", {})
        return {}

    store = SQLiteStore(tmp_path / "db")
    store.begin("begun-only")
    engine = Engine(
        tools=[fails, act],
        store=store,
        config=EngineConfig(idle_timeout=None, compensation_retries=1),
    )
    tx = engine.begin(agent_id="a")
    tx.execute_step(1, "act", {})
    tx.rollback()  # the undo fails: kept for recovery, the transaction ended
    store.close()
    assert main(["inspect", str(tmp_path / "db")]) == 0
    out = capsys.readouterr().out
    assert "begun-only" in out
    assert "BEGUN" in out
    assert "ROLLED_BACK, undos to retry" in out
    assert main(["inspect", str(tmp_path / "db"), "begun-only"]) == 2
    assert "recorded nothing yet" in capsys.readouterr().err


# ---------------------------------------------------------------------- hostile conditions

#: A control character a terminal would act on: C0 (newline aside), DEL, C1.
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def run_main(capsys, *arguments: str) -> tuple[int, str, str]:
    """Run the command line in this process; return (status, stdout, stderr)."""
    from agenttx._cli import main  # noqa: PLC0415

    try:
        status = main(list(arguments))
    except SystemExit as exc:  # argparse's way out, as `python -m agenttx` exits
        status = exc.code if isinstance(exc.code, int) else -1
    out, err = capsys.readouterr()
    return status, out, err


def one_line(err: str) -> str:
    """The single line of `err`; fails if there are more (a traceback has several)."""
    assert err.endswith("\n"), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err[:-1]


def check_listing(out: str) -> list[list[str]]:
    """Check the shape of `inspect DB`'s output; return the open transactions' rows (header
    excluded). The ended section after the outbox line is checked by `ended_listing`."""
    lines = out.splitlines()
    assert re.fullmatch(r".+: \d+ open transactions?", lines[0]), out
    count = int(lines[0].rsplit(": ", 1)[1].split()[0])
    outbox = [i for i, line in enumerate(lines) if line.startswith("outbox: ")]
    assert len(outbox) == 1, out
    assert re.fullmatch(r"outbox: \d+ effects? waiting for delivery", lines[outbox[0]]), out
    ended_listing(out)
    if count == 0:
        assert outbox == [1], out
        return []
    assert lines[1].split() == ["TX", "AGENT", "STATUS", "STEPS", "AGE"], out
    rows = [line.split() for line in lines[2 : 2 + count]]
    assert all(len(row) >= 5 for row in rows), out
    return rows


def ended_listing(out: str) -> list[list[str]]:
    """Check the shape of the ended section of `inspect DB`'s output (after the outbox line);
    return its rows (header excluded)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("outbox: ")) + 1
    section = lines[start:]
    section = section[: next(i for i, line in enumerate(section) if line.startswith("plan runs:"))]
    if section == ["ended: none kept as history"]:
        return []
    match = re.fullmatch(
        r"ended: the last (\d+) kept as history, the last to end first", section[0]
    )
    assert match, out
    count = int(match[1])
    assert section[1].split() == ["TX", "AGENT", "STATUS", "STEPS", "ENDED"], out
    rows = [line.split() for line in section[2 : 2 + count]]
    assert all(len(row) == 5 for row in rows), out
    assert all(line.startswith("unreadable ") for line in section[2 + count :]), out
    return rows


def test_inspect_skips_a_transaction_that_ends_while_listing(database, capsys, monkeypatch):
    """A transaction committed between the listing and its read is left out, not an error."""
    db, tx_id = database
    real_peek = SQLiteStore.peek

    def peek(store: SQLiteStore, wanted: str):
        if wanted == tx_id:
            raise TransactionNotFound(tx_id=wanted)
        return real_peek(store, wanted)

    monkeypatch.setattr(SQLiteStore, "peek", peek)
    status, out, err = run_main(capsys, "inspect", str(db))
    assert (status, err) == (0, "")
    assert check_listing(out) == []
    assert out.splitlines()[0] == f"{db}: 0 open transactions"


def test_inspect_beside_a_live_agent(tmp_path, capsys):
    """`inspect` run again and again while another thread begins, steps, commits and rolls
    back transactions on the same file: never an exception, always a well-formed answer."""
    db = tmp_path / "live.db"
    store = SQLiteStore(db)
    engine = Engine(
        tools=builtins.tools(str(tmp_path)), store=store, config=EngineConfig(idle_timeout=None)
    )
    for _ in range(3):  # a few that stay open throughout
        engine.begin(agent_id="idle").execute_step(1, "kv.put", {"key": "idle", "value": 1})
    stop = threading.Event()
    failures: list[BaseException] = []

    def agent() -> None:
        try:
            n = 0
            while not stop.is_set():
                tx = engine.begin(agent_id="busy")
                for step in (1, 2, 3):
                    tx.execute_step(step, "kv.put", {"key": f"k{n}.{step}", "value": n})
                if n % 3:
                    tx.commit()
                else:
                    tx.rollback()
                n += 1
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        for _ in range(150):
            status, out, err = run_main(capsys, "inspect", str(db))
            assert (status, err) == (0, ""), (status, out, err)
            rows = check_listing(out)
            assert {row[1] for row in rows} <= {"idle", "busy", "?"}
            assert all(row[2] in {"ACTIVE", "BEGUN"} for row in rows), out
            for row in rows[-1:]:  # the newest: the one most likely to end under us
                status, out, err = run_main(capsys, "inspect", str(db), row[0])
                if status == 0 and out.startswith(f"transaction {row[0]} (ended)\n"):
                    last = out.rstrip("\n").splitlines()[-2]  # it ended since the listing
                    assert last.startswith("compensation failures ("), out
                elif status == 0:
                    assert out.startswith(f"transaction {row[0]}\n"), out
                    shown = out.rstrip("\n").splitlines()
                    assert shown[-2].startswith("undo records ("), out
                    assert shown[-1] == "waiting for a person: nothing", out
                else:  # ended, and its history pruned since (by a prune every 64 ends)
                    assert status == 2, (status, out, err)
                    assert out == ""
                    assert "no open or ended transaction" in one_line(err), err
    finally:
        stop.set()
        thread.join()
        store.close()
    assert failures == []


def locked_store(db: Path) -> tuple[SQLiteStore, StorageError]:
    """Hold `db` with an exclusive store; return it and the busy error a reader then gets."""
    holder = SQLiteStore(db, exclusive=True)
    with pytest.raises(StorageError, match="locked") as caught:
        SQLiteStore(db, readonly=True, busy_timeout=0)
    return holder, caught.value


def test_a_store_that_stays_locked_is_one_line_and_status_1(database, tmp_path, capsys):
    """A store another process keeps locked past `--wait`: one line, exit status 1."""
    db = tmp_path / "locked.db"
    db.write_bytes(database[0].read_bytes())
    holder, _ = locked_store(db)
    try:
        for arguments in (("inspect", str(db)), ("graph", str(db), database[1])):
            status, out, err = run_main(capsys, *arguments, "--wait", "0")
            assert (status, out) == (1, "")
            line = one_line(err)
            assert line.startswith(f"agenttx {arguments[0]}: ")
            assert "locked" in line
    finally:
        holder.close()
    status, out, _ = run_main(capsys, "inspect", str(db), "--wait", "0")
    assert status == 0
    assert "support-bot" in out


def test_a_busy_read_is_retried(database, tmp_path, capsys, monkeypatch):
    """A read that finds the store busy is tried again until `--wait` runs out."""
    db, tx_id = database
    copy = tmp_path / "copy.db"
    copy.write_bytes(db.read_bytes())
    holder, busy = locked_store(copy)
    holder.close()
    real_peek = SQLiteStore.peek
    calls: list[str] = []

    def peek(store: SQLiteStore, wanted: str):
        calls.append(wanted)
        if len(calls) <= 2:
            raise busy
        return real_peek(store, wanted)

    monkeypatch.setattr(SQLiteStore, "peek", peek)
    status, out, err = run_main(capsys, "inspect", str(db), "--wait", "60")
    assert (status, err) == (0, "")
    assert check_listing(out)[0][:2] == [tx_id, "support-bot"]
    assert len(calls) == 3
    status, out, err = run_main(capsys, "graph", str(db), tx_id)
    assert (status, err) == (0, "")
    assert "kv.put" in out

    def always_busy(store: SQLiteStore, wanted: str):
        raise busy

    monkeypatch.setattr(SQLiteStore, "peek", always_busy)
    status, out, err = run_main(capsys, "inspect", str(db), "--wait", "0.05")
    assert (status, out) == (1, "")
    assert "locked" in one_line(err)


def corrupt_store(root: Path) -> tuple[Path, str, dict[str, str]]:
    """A store with one sound open transaction and others whose stored rows are garbage
    (written with raw sqlite3); return the file, the sound id, and what each bad one holds."""
    from agenttx.stores._sqlite_file import STEP  # noqa: PLC0415

    db = root / "corrupt.db"
    store = SQLiteStore(db)
    engine = Engine(
        tools=builtins.tools(str(root)), store=store, config=EngineConfig(idle_timeout=None)
    )
    good = engine.begin(agent_id="good")
    good.execute_step(1, "kv.put", {"key": "a", "value": 1})
    bad: dict[str, str] = {}
    for what in ("record not JSON", "record nested", "record shape", "step not JSON",
                 "step shape", "step nested", "log seq"):  # fmt: skip
        tx = engine.begin(agent_id="bad")
        tx.execute_step(1, "kv.put", {"key": "b", "value": 2})
        bad[tx.id] = what
    store.close()
    with sqlite3.connect(db) as conn:
        for tx_id, what in bad.items():
            if what.startswith("record"):
                record = {
                    "record not JSON": "{not json",
                    "record nested": "[" * 100_000,
                    "record shape": '{"agent_id": "x"}',
                }[what]
                conn.execute("UPDATE txs SET record = ? WHERE tx_id = ?", (record, tx_id))
            elif what.startswith("step"):
                body = {
                    "step not JSON": "\x00garbage",
                    "step shape": "[1, 2]",
                    "step nested": "[" * 100_000,
                }[what]
                conn.execute(
                    "UPDATE log SET body = ? WHERE tx_id = ? AND kind = ?", (body, tx_id, STEP)
                )
            else:
                conn.execute("UPDATE log SET seq = 'x' WHERE tx_id = ? AND kind = ?", (tx_id, STEP))
        conn.execute(
            "INSERT INTO txs (tx_id, record, owner, isolation) "
            "VALUES (?, 'null', NULL, 'read_committed')",
            ("bad\x1b[2J",),
        )
    bad["bad\x1b[2J"] = "tx id"
    return db, good.id, bad


def test_inspect_lists_corrupt_transactions_as_unreadable(tmp_path, capsys):
    """A transaction whose stored rows are not valid is listed as UNREADABLE with a one-line
    reason, and the others are listed as usual; showing it is a one-line error, status 2."""
    db, good, bad = corrupt_store(tmp_path)
    status, out, err = run_main(capsys, "inspect", str(db))
    assert (status, err) == (0, ""), err
    assert not CONTROL.search(out)
    rows = {row[0]: row for row in check_listing(out)}
    assert rows[good][1:4] == ["good", "ACTIVE", "1"]
    shown = {tx_id.replace("\x1b", "\\x1b") for tx_id in bad}
    assert {tx_id for tx_id, row in rows.items() if row[2] == "UNREADABLE"} == shown, out
    reasons = [line for line in out.splitlines() if line.startswith("unreadable ")]
    assert {line.removeprefix("unreadable ").split(": ")[0] for line in reasons} == shown, out
    for tx_id, what in bad.items():
        expected = "invalid transaction id" if what == "tx id" else "unreadable"
        for command in ("inspect", "graph"):
            status, out, err = run_main(capsys, command, str(db), tx_id)
            assert (status, out) == (2, ""), (what, err)
            assert expected in one_line(err), (what, err)
    status, out, err = run_main(capsys, "graph", str(db), good)
    assert (status, err) == (0, "")


def test_stored_text_is_printed_with_control_characters_escaped(tmp_path, capsys):
    """Agent ids, tool names, hints, context, values and errors from the store reach the
    terminal with every control character escaped (`\\x1b`), in every command and format."""
    import agenttx  # noqa: PLC0415

    @agenttx.tool(name="make\x1b]0;pwned\x07")
    def make(ctx: agenttx.ToolContext) -> dict:
        return {"id": "x\x7fy\x9b2Jz", "\u202eevil": 1}

    @agenttx.tool(name="use")
    def use(ctx: agenttx.ToolContext, key: str) -> dict:
        raise agenttx.ToolError("the id is wrong \x9b2J here")

    db = tmp_path / "esc.db"
    store = SQLiteStore(db)
    engine = Engine(tools=[make, use], store=store, config=EngineConfig(idle_timeout=None))
    tx = engine.begin(agent_id="\x1b[31mred")
    assert tx.execute_step(1, "use", {"key": "x"}).next_step_id == 1  # a hint, no step
    tx.execute_step(1, "make\x1b]0;pwned\x07", {}, raw_context="first\r\x1b[2Jwiped")
    assert any("\x9b" in hint for hint in tx.constraints)
    store.close()
    with sqlite3.connect(db) as conn:  # JSON text may hold a lone surrogate; Python cannot print it
        (record,) = conn.execute("SELECT record FROM txs WHERE tx_id = ?", (tx.id,)).fetchone()
        record = json.loads(record)
        record["agent_id"] += "\ud800"
        conn.execute("UPDATE txs SET record = ? WHERE tx_id = ?", (json.dumps(record), tx.id))
    runs = [
        ("inspect", str(db)),
        ("inspect", str(db), tx.id),
        *(("graph", str(db), tx.id, "--format", fmt) for fmt in ("dot", "mermaid", "json")),
        ("graph", str(db), "\x1b[31m"),
    ]
    outputs = {}
    for arguments in runs:
        status, out, err = run_main(capsys, *arguments)
        assert not CONTROL.search(out + err), (arguments, out, err)
        assert "\ud800" not in out
        outputs[arguments[-1]] = (status, out, err)
    listing = outputs[str(db)][1]
    assert "\\x1b[31mred\\ud800" in listing
    shown = outputs[tx.id][1]
    assert "\\x1b[31mred\\ud800" in shown
    assert "\\x9b2J here" in shown
    assert "first\\r\\x1b[2Jwiped" in shown
    assert "make\\x1b]0;pwned\\x07" in shown
    assert "\\x7fy\\x9b2Jz" in shown
    assert "\\u202eevil" in shown
    assert "make\\x1b]0;pwned\\x07" in outputs["mermaid"][1]
    document = json.loads(outputs["json"][1])  # still JSON, with the same strings
    assert document["nodes"][0]["tool"] == "make\x1b]0;pwned\x07"
    status, _, err = outputs["\x1b[31m"]
    assert status == 2
    assert "\\x1b[31m" in one_line(err)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[" * 100_000, "is not a JSON transcript"),
        ('{"messages": [' * 50_000, "is not a JSON transcript"),
        ("[1, 2", "is not a JSON transcript"),
        ('{"role": "assistant"}', "must hold a JSON list"),
        ('"just text"', "must hold a JSON list"),
        ("42", "must hold a JSON list"),
        (b"[\xff\xfe]", "is not a JSON transcript"),
        ("", "is not a JSON transcript"),
    ],
)
def test_lineage_of_bad_input_is_one_line_and_status_2(tmp_path, capsys, content, message):
    """Deeply nested, malformed or non-transcript JSON: one line, exit status 2."""
    path = tmp_path / "in.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    status, out, err = run_main(capsys, "lineage", str(path))
    assert (status, out) == (2, "")
    line = one_line(err)
    assert line.startswith("agenttx lineage: ")
    assert message in line


def test_lineage_of_deep_json_never_prints_a_traceback(tmp_path):
    """The same through `python -m agenttx`: no RecursionError traceback."""
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    done = agenttx_cli("lineage", str(path))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "arguments",
    [
        ("lineage", "t.json", "--min-value-length", "-1"),
        ("lineage", "t.json", "--min-value-length", "four"),
        ("lineage", "t.json", "--min-value-length", "9" * 5000),
        ("inspect", "x.db", "--wait", "-1"),
        ("inspect", "x.db", "--wait", "nan"),
        ("graph", "x.db", "tx", "--wait", "inf"),
    ],
)
def test_numeric_options_out_of_range(capsys, arguments):
    """A numeric option out of range is an argparse error: usage, one error line, status 2."""
    status, out, err = run_main(capsys, *arguments)
    assert (status, out) == (2, "")
    assert "Traceback" not in err
    assert err.startswith(f"usage: agenttx {arguments[0]}")
    assert err.splitlines()[-1].startswith(
        f"agenttx {arguments[0]}: error: argument {arguments[-2]}"
    )


def test_min_value_length_out_of_range_through_the_command(tmp_path):
    """`--min-value-length -1` through `python -m agenttx`: exit 2, no traceback."""
    path = tmp_path / "t.json"
    path.write_text("[]")
    done = agenttx_cli("lineage", str(path), "--min-value-length", "-1")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "--min-value-length" in done.stderr.splitlines()[-1]


def test_an_unexpected_error_is_one_line_and_status_1(tmp_path, capsys, monkeypatch):
    """Whatever goes wrong inside a command prints `agenttx: error: TYPE: MESSAGE`, escaped,
    and exits 1; an interrupt exits 130 quietly; a closed pipe exits 1 quietly."""
    from agenttx._cli import _main as _cli  # noqa: PLC0415

    path = tmp_path / "t.json"
    path.write_text("[]")

    def boom(*args, **kwargs):
        raise RuntimeError("boom \x1b[0m\nsecond line")

    monkeypatch.setattr(_cli, "lineage_from_openai", boom)
    status, out, err = run_main(capsys, "lineage", str(path))
    assert (status, out) == (1, "")
    assert one_line(err) == "agenttx: error: RuntimeError: boom \\x1b[0m\\nsecond line"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_cli, "lineage_from_openai", interrupted)
    assert run_main(capsys, "lineage", str(path)) == (130, "", "")

    def closed_pipe(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(_cli, "lineage_from_openai", closed_pipe)
    assert run_main(capsys, "lineage", str(path)) == (1, "", "")


#: Any JSON value, strings with control characters and lone surrogates included.
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(st.characters(codec=None, max_codepoint=0x2FFF), max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)
#: A step row: mostly the right shape (tool, arguments, output, context, dependencies).
STEP_ROWS = JSON_VALUES | st.tuples(
    JSON_VALUES, JSON_VALUES, JSON_VALUES, JSON_VALUES, st.lists(st.lists(JSON_VALUES, max_size=4))
).map(list)


@pytest.fixture(scope="module")
def sound_store(tmp_path_factory) -> tuple[bytes, str]:
    """The bytes of a store with one open transaction of two linked steps, and its id."""
    root = tmp_path_factory.mktemp("sound")
    store = SQLiteStore(root / "sound.db")
    engine = Engine(
        tools=builtins.tools(str(root)), store=store, config=EngineConfig(idle_timeout=None)
    )
    tx = engine.begin(agent_id="a")
    tx.execute_step(1, "kv.put", {"key": "k", "value": "v"})
    tx.execute_step(2, "kv.put", {"key": "l", "value": "${steps.1.key}"})
    store.close()
    return (root / "sound.db").read_bytes(), tx.id


@settings(max_examples=40)
@given(
    record=st.none()
    | st.fixed_dictionaries(
        {},
        optional={
            "format": JSON_VALUES,
            "agent_id": JSON_VALUES,
            "policy": JSON_VALUES | st.just({}),
            "settings": JSON_VALUES,
            "created_at": JSON_VALUES,
            "ended": JSON_VALUES,
        },
    ),
    step=st.none() | STEP_ROWS,
)
def test_any_stored_json_is_shown_or_refused_in_one_line(sound_store, record, step):
    """Whatever JSON a transaction's record or step row holds, `inspect` and `graph` either
    show it or say in one line that it is unreadable, and print no control character."""
    from agenttx._cli import main  # noqa: PLC0415
    from agenttx.stores._sqlite_file import STEP  # noqa: PLC0415

    content, tx_id = sound_store
    with tempfile.TemporaryDirectory() as root:
        db = Path(root) / "fuzz.db"
        db.write_bytes(content)
        with contextlib.closing(sqlite3.connect(db)) as conn, conn:
            if record is not None:
                sql = "UPDATE txs SET record = ? WHERE tx_id = ?"
                conn.execute(sql, (json.dumps(record), tx_id))
            if step is not None:
                sql = "UPDATE log SET body = ? WHERE tx_id = ? AND kind = ? AND step = 2"
                conn.execute(sql, (json.dumps(step), tx_id, STEP))
        for arguments in (
            ["inspect", str(db)],
            ["inspect", str(db), tx_id],
            *(["graph", str(db), tx_id, "--format", fmt] for fmt in ("dot", "mermaid", "json")),
        ):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = main(arguments)
            assert not CONTROL.search(out.getvalue() + err.getvalue())
            if status == 0:
                assert err.getvalue() == ""
            else:
                assert (status, out.getvalue()) == (2, ""), err.getvalue()
                assert "unreadable" in one_line(err.getvalue())


@pytest.mark.parametrize(
    "created_at", [True, "yesterday", None, 10**400, float("inf"), float("nan")]
)
def test_the_age_of_a_bad_timestamp_is_unknown(created_at):
    """A stored `created_at` that is not a finite number shows as age "?", never an error."""
    from agenttx._cli._reading import age_of as _age  # noqa: PLC0415

    assert _age(created_at) == "?"
    assert _age(0).endswith("d")


# ---------------------------------------------------------------------- ended transactions


@pytest.fixture(scope="module")
def ended_store(tmp_path_factory) -> tuple[Path, dict[str, agenttx.Transaction], dict[str, str]]:
    """A store whose transactions have all ended: one committed after a failure and a rewind,
    one rolled back, one that lost a commit conflict (FAILED); with each one's graph, drawn
    by `export_graph` as it ended, in each format."""
    root = tmp_path_factory.mktemp("ended")
    store = SQLiteStore(root / "ended.db")
    engine = Engine(
        tools=builtins.tools(str(root)), store=store, config=EngineConfig(idle_timeout=None)
    )
    # mistake_retries=0: the missing key, written in the call, rewinds as any failure would.
    committed = engine.begin(agent_id="writer", policy={"mistake_retries": 0})
    insert = {"table": "customers", "id": "c-1", "fields": {"name": "Ada"}}
    committed.execute_step(1, "record.insert", insert)
    committed.execute_step(2, "fs.write", {"path": "a.txt", "contents": "x"})
    failed = committed.execute_step(3, "kv.get", {"key": "missing"})
    assert failed.next_step_id == 2  # step 2 undone: the file write compensated
    committed.execute_step(2, "fs.write", {"path": "a.txt", "contents": "y"})
    committed.execute_step(3, "kv.put", {"key": "owner", "value": "${steps.1.id}"})
    graphs = {fmt: committed.export_graph(fmt) for fmt in ("dot", "mermaid", "json")}
    committed.commit()
    aborted = engine.begin(agent_id="quitter")
    aborted.execute_step(1, "kv.put", {"key": "k", "value": 1})
    aborted.execute_step(2, "kv.put", {"key": "l", "value": "${steps.1.key}"})
    aborted.rollback()
    first, loser = engine.begin(agent_id="first"), engine.begin(agent_id="loser")
    first.execute_step(1, "kv.put", {"key": "race", "value": 1})
    loser.execute_step(1, "kv.put", {"key": "race", "value": 2})
    first.commit()
    with pytest.raises(agenttx.WriteConflict):
        loser.commit()
    store.close()
    txs = {"committed": committed, "aborted": aborted, "first": first, "loser": loser}
    return root / "ended.db", txs, graphs


def test_inspect_lists_the_recently_ended_transactions(ended_store, capsys):
    """`inspect DB` lists, after the open ones and the outbox, the ended transactions the
    store keeps, the last to end first, with their agent, final status and live steps."""
    db, txs, _ = ended_store
    status, out, err = run_main(capsys, "inspect", str(db))
    assert (status, err) == (0, "")
    assert check_listing(out) == []
    rows = ended_listing(out)
    assert [row[:4] for row in rows] == [
        [txs["loser"].id, "loser", "FAILED", "0"],
        [txs["first"].id, "first", "COMMITTED", "1"],
        [txs["aborted"].id, "quitter", "ROLLED_BACK", "0"],
        [txs["committed"].id, "writer", "COMMITTED", "3"],
    ]
    assert all(re.fullmatch(r"\d+[smhd]", row[4]) for row in rows), out


def test_inspect_shows_an_ended_transaction(ended_store, capsys):
    """`inspect DB TX` on an ended transaction: its final status, its live steps and edges at
    the end, every attempt with what became of it, its constraints and compensation failures."""
    db, txs, _ = ended_store
    committed = txs["committed"]
    status, out, err = run_main(capsys, "inspect", str(db), committed.id)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"transaction {committed.id} (ended)"
    assert re.fullmatch(r"  agent: writer   status: COMMITTED   ended: \d+[smhd] ago", lines[1])
    assert "steps (3):" in lines
    assert '  3. kv.put {"key":"owner","value":"c-1"}' in lines
    assert "  step 1 -> step 3  id -> value  (explicit)" in lines
    attempts = lines[lines.index(f"attempts ({len(committed.history)}):") + 1 :]
    expected = [
        f"  {n}. step {a.step_id} {a.tool_name}: "
        + ("committed" if a.status.value == "live" else a.status.value)
        for n, a in enumerate(committed.history, 1)
    ]
    assert attempts[: len(expected)] == expected
    assert {"compensated", "failed", "committed"} <= {line.rsplit(": ", 1)[1] for line in expected}
    assert f"constraints ({len(committed.constraints)}):" in lines
    assert lines[-2:] == ["compensation failures (0):", "waiting for a person: nothing"]
    aborted = txs["aborted"]
    status, out, err = run_main(capsys, "inspect", str(db), aborted.id)
    assert (status, err) == (0, "")
    assert "status: ROLLED_BACK" in out
    assert "steps (2, undone when it ended):" in out
    assert "  step 1 -> step 2  key -> value  (explicit)" in out
    assert "  1. step 1 kv.put: rewound\n  2. step 2 kv.put: rewound\n" in out


@pytest.mark.parametrize("fmt", ["dot", "mermaid", "json"])
def test_graph_of_an_ended_transaction_is_its_export_graph(ended_store, capsys, fmt):
    """`graph DB TX` draws an ended transaction as its `export_graph` did when it ended: the
    live steps, and the undone attempts marked (none live once it aborted)."""
    db, txs, graphs = ended_store
    status, out, err = run_main(capsys, "graph", str(db), txs["committed"].id, "--format", fmt)
    assert (status, err) == (0, "")
    assert out == graphs[fmt]
    assert "compensated" in out
    status, out, err = run_main(capsys, "graph", str(db), txs["aborted"].id, "--format", fmt)
    assert (status, err) == (0, "")
    assert out == txs["aborted"].export_graph(fmt)
    assert "rewound" in out


def test_an_ended_transaction_pruned_or_unknown_is_one_line(ended_store, capsys):
    """An id that is neither open nor kept: one line naming both, status 2."""
    db, _, _ = ended_store
    for command in ("inspect", "graph"):
        status, out, err = run_main(capsys, command, str(db), "gone")
        assert (status, out) == (2, "")
        assert "no open or ended transaction gone" in one_line(err)


def test_ended_transactions_are_printed_escaped(tmp_path, capsys):
    """Agent ids, tool names, hints and values of an ended transaction reach the terminal with
    control characters escaped, in the listing, the detail and every graph format."""

    @agenttx.compensation(name="undo\x1b[2J")
    def undo(payload) -> None:
        raise RuntimeError("refused \x9b31m")

    @agenttx.tool(name="make\x1b]0;pwned\x07")
    def make(ctx: agenttx.ToolContext) -> dict:
        ctx.register_undo("undo\x1b[2J", {})
        return {"\u202eevil": "x\x7fy"}

    @agenttx.tool(name="use")
    def use(ctx: agenttx.ToolContext) -> dict:
        raise agenttx.ToolError("the id is wrong \x9b2J here")

    db = tmp_path / "esc.db"
    store = SQLiteStore(db)
    engine = Engine(
        tools=[undo, make, use],
        store=store,
        config=EngineConfig(idle_timeout=None, compensation_retries=1),
    )
    tx = engine.begin(agent_id="\x1b[31mred")
    tx.execute_step(1, "make\x1b]0;pwned\x07", {})
    tx.execute_step(2, "use", {})  # fails: step 1 is rewound, its compensation fails
    tx.execute_step(tx.next_step_id, "make\x1b]0;pwned\x07", {})
    tx.commit()
    store.close()
    outputs = {}
    for arguments in (
        ("inspect", str(db)),
        ("inspect", str(db), tx.id),
        *(("graph", str(db), tx.id, "--format", fmt) for fmt in ("dot", "mermaid", "json")),
    ):
        status, out, err = run_main(capsys, *arguments)
        assert (status, err) == (0, ""), (arguments, err)
        assert not CONTROL.search(out), (arguments, out)
        outputs[arguments[-1]] = out
    assert "\\x1b[31mred" in outputs[str(db)]
    shown = outputs[tx.id]
    assert "make\\x1b]0;pwned\\x07" in shown
    assert "\\u202eevil" in shown
    assert "\\x9b2J here" in shown
    assert "make\\x1b]0;pwned\\x07 (compensated)" in outputs["dot"]
    document = json.loads(outputs["json"])  # still JSON, with the same strings
    assert {node["tool"] for node in document["nodes"]} >= {"make\x1b]0;pwned\x07", "use"}


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("history", "not json"),
        ("history", '{"status": "COMMITTED"}'),
        (
            "history",
            '{"status": 1, "attempts": [], "constraints": [], "compensation_failures": []}',
        ),
        (
            "history",
            '{"status":"X","attempts":[[1,"t","gone"]],"constraints":[],"compensation_failures":[]}',
        ),
        ("steps", "[[1, 2]]"),
        ("record", "[" * 10_000 + "]" * 10_000),
    ],
)
def test_a_corrupt_ended_transaction_is_unreadable(ended_store, tmp_path, capsys, column, value):
    """An ended transaction whose stored rows are not valid is listed as UNREADABLE with a
    one-line reason; showing or drawing it is a one-line error, status 2."""
    source, txs, _ = ended_store
    db = tmp_path / "corrupt.db"
    db.write_bytes(source.read_bytes())
    tx_id = txs["aborted"].id
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(f"UPDATE ended SET {column} = ? WHERE tx_id = ?", (value, tx_id))
    status, out, err = run_main(capsys, "inspect", str(db))
    assert (status, err) == (0, "")
    rows = {row[0]: row for row in ended_listing(out)}
    if column != "steps":  # the listing reads no steps
        assert rows[tx_id][2] == "UNREADABLE", out
        assert f"unreadable {tx_id}: " in out
    assert rows[txs["committed"].id][2] == "COMMITTED"
    for command in ("inspect", "graph"):
        status, out, err = run_main(capsys, command, str(db), tx_id)
        assert (status, out) == (2, ""), err
        assert "unreadable" in one_line(err)


def test_a_transaction_ended_on_the_store_directly_is_listed_without_history(tmp_path, capsys):
    """A transaction begun and committed on the store itself (no record, no history) is
    listed as ENDED with what is unknown as "?"; showing it is one line, status 2."""
    db = tmp_path / "bare.db"
    with SQLiteStore(db) as store:
        store.begin("bare")
        store.commit("bare")
    status, out, err = run_main(capsys, "inspect", str(db))
    assert (status, err) == (0, "")
    assert [row[:4] for row in ended_listing(out)] == [["bare", "?", "ENDED", "?"]]
    for command in ("inspect", "graph"):
        status, out, err = run_main(capsys, command, str(db), "bare")
        assert (status, out) == (2, "")
        assert "ended without recording anything" in one_line(err)


# ---------------------------------------------------------------- plans


@agenttx.tool
def _add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


@agenttx.tool
def _fails() -> dict[str, int]:
    raise ValueError("the warehouse id is unknown")


def _plan_db(path: Path) -> None:
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("x", tool="_add", inputs={"a": 1, "b": 2}),
            agenttx.Node("y", tool="_add", inputs={"a": "${x.sum}", "b": 1}),
            agenttx.Node("bad", tool="_fails"),
            agenttx.Node("after_bad", tool="_add", inputs={"a": 1, "b": 1}, after=("bad",)),
        ]
    )
    with SQLiteStore(path) as store:
        engine = Engine(tools=[_add, _fails], store=store)
        engine.run_plan(plan.__class__(nodes=plan.nodes[:2]), initial={}, run_id="good")
        engine.run_plan(plan, initial={}, run_id="mixed")


def test_plans_lists_runs_and_shows_one_with_uk_times(tmp_path, capsys):
    """`plans DB` lists each run with its nodes by state; `plans DB RUN` shows each node's
    state and counts, with times as UK dates naming the zone."""
    path = tmp_path / "plans.db"
    _plan_db(path)
    status, out, _ = run_main(capsys, "plans", str(path))
    assert status == 0
    assert re.search(r"good\s+SUCCEEDED\s+2 SUCCEEDED", out)
    assert re.search(r"mixed\s+FAILED\s+1 FAILED, 1 SKIPPED, 2 SUCCEEDED", out)
    status, out, _ = run_main(capsys, "plans", str(path), "mixed")
    assert status == 0
    assert "plan run mixed: FAILED" in out
    assert re.search(
        r"\n  y\s+SUCCEEDED\s+0\s+1\s+0\s+\d{1,2} [A-Z][a-z]{2} \d{4} [\d:]{8} (GMT|BST)", out
    )
    assert re.search(r"\n  after_bad\s+SKIPPED\s+0\s+0\s+0\s+-", out)  # `bad` has finished
    assert "error: " in out
    assert "warehouse id is unknown" in out


def test_plans_exports_a_run_as_dot_and_mermaid_with_states(tmp_path, capsys):
    """`--format dot|mermaid` draws the plan's graph through the renderer, states filled."""
    path = tmp_path / "plans.db"
    _plan_db(path)
    status, out, _ = run_main(capsys, "plans", str(path), "mixed", "--format", "mermaid")
    assert status == 0
    assert out.startswith("flowchart LR\n")
    assert '["bad: _fails (failed)"]:::failed' in out
    assert '["after_bad: _add (skipped)"]:::skipped' in out
    assert 'n0 -->|"value"| n1' in out
    assert '-->|"after"|' in out
    status, out, _ = run_main(capsys, "plans", str(path), "mixed", "--format", "dot")
    assert status == 0
    assert out.startswith("digraph agenttx {")
    assert 'label="x: _add (succeeded)", style=filled, fillcolor="#d4edda"' in out


def test_plans_refuses_what_it_cannot_show(tmp_path, capsys):
    """An unknown run, a bad id, a graph without a run and a missing file: one line, status 2."""
    path = tmp_path / "plans.db"
    _plan_db(path)
    for arguments, message in [
        (("plans", str(path), "nope"), "no plan run `nope`"),
        (("plans", str(path), "bad id!"), "invalid transaction id"),
        (("plans", str(path), "--format", "dot"), "needs a RUN"),
        (("plans", str(tmp_path / "missing.db")), "no such file"),
    ]:
        status, out, err = run_main(capsys, *arguments)
        assert status == 2, (arguments, out, err)
        assert message in one_line(err)
    empty = tmp_path / "empty.db"
    SQLiteStore(empty).close()
    assert run_main(capsys, "plans", str(empty))[:2] == (0, "no plan runs\n")


def test_uk_time_names_the_zone_in_winter_and_summer():
    """Times are Europe/London dates: GMT in winter, BST in summer; "-" for none."""
    from agenttx._cli._shown import uk_time  # noqa: PLC0415

    assert uk_time(1796161205.0) == "1 Dec 2026 21:40:05 GMT"
    assert uk_time(1782938405.0) == "1 Jul 2026 21:40:05 BST"
    assert uk_time(None) == "-"
    assert uk_time(float("nan")) == "-"
    assert uk_time(True) == "-"


def test_audit_prints_the_trail_of_an_ended_transaction_and_plan_run(tmp_path):
    """`audit DB TX --json` prints an ended transaction's events as JSON lines; `audit DB` prints
    every kept scope's, a plan run's included; `inspect DB` lists the plan run."""

    @agenttx.tool(name="add")
    def add(n: int) -> dict:
        return {"n": n + 1}

    path = tmp_path / "audit.db"
    with SQLiteStore(path) as store:
        engine = Engine(tools=[add], store=store, config=EngineConfig(idle_timeout=None))
        tx = engine.begin(agent_id="auditor")
        tx.call("add", {"n": 1})
        tx.commit()
        plan = agenttx.Plan(nodes=[agenttx.Node("a", tool="add", inputs={"n": 1})])
        run = engine.run_plan(plan, initial={})
        engine.close()
    done = agenttx_cli("audit", str(path), tx.id, "--json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["kind"] for line in lines] == ["step_dispatched", "step_completed", "committed"]
    assert {line["scope_id"] for line in lines} == {tx.id}
    everything = agenttx_cli("audit", str(path), "--json")
    assert everything.returncode == 0, everything.stderr
    scopes = {json.loads(line)["scope_id"] for line in everything.stdout.splitlines()}
    assert scopes == {tx.id, run.run_id}
    listing = agenttx_cli("inspect", str(path))
    assert listing.returncode == 0, listing.stderr
    assert "plan runs: the last 1, the last changed first" in listing.stdout
    assert run.run_id in listing.stdout


def test_audit_of_an_unknown_or_open_transaction_is_a_one_line_error(database):
    """An id with no stored trail (the open transaction's, or none) exits 2 with one line."""
    db, tx_id = database
    for missing in (tx_id, "nope"):
        done = agenttx_cli("audit", str(db), missing)
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1
        assert "no audit trail" in done.stderr
    assert agenttx_cli("audit", str(db), "--limit", "0").returncode == 2


@pytest.fixture
def asking(tmp_path) -> tuple[Path, str, str]:
    """A store with one transaction waiting for the approval of a charge, and one review."""

    @agenttx.tool(name="charge", needs_approval=True)
    def charge(amount: int) -> dict:
        return {"amount": amount}

    @agenttx.tool(name="slow", on_unknown="review")
    def slow(n: int) -> dict:
        import time  # noqa: PLC0415

        time.sleep(0.3)
        return {"n": n}

    with SQLiteStore(tmp_path / "ask.db") as store:
        tx = agenttx.Engine(tools=[charge, slow], store=store).begin(agent_id="payer")
        request = tx.call("charge", {"amount": 4200}).approval.id
        other = agenttx.Engine(
            tools=[charge, slow], store=store, config=EngineConfig(step_timeout=0.05)
        )
        review = other.begin().call("slow", {"n": 1}).review.id
    return tmp_path / "ask.db", request, review


def test_approvals_lists_pending_requests_and_reviews(asking):
    """`approvals DB` lists each pending request and review with where it waits."""
    db, request, review = asking
    done = agenttx_cli("approvals", str(db))
    assert done.returncode == 0, done.stderr
    assert "1 approval request(s) pending:" in done.stdout
    assert request in done.stdout
    assert '{"amount":4200}' in done.stdout
    assert "step 1 of transaction" in done.stdout
    assert "1 review(s) pending:" in done.stdout
    assert review in done.stdout
    assert "timed out" in done.stdout


def test_approve_reject_and_review_decide_from_the_terminal(asking, capsys):
    """`approve`, `reject` and `review` write the decision; a second decision is refused."""
    from agenttx._cli import main  # noqa: PLC0415

    db, request, review = asking
    assert main(["approve", str(db), request, "--actor", "alice", "--expires-in", "60"]) == 0
    assert f"approved {request} by alice, until" in capsys.readouterr().out
    assert main(["approve", str(db), request, "--actor", "alice"]) == 2
    assert "approved already" in capsys.readouterr().err
    assert main(["reject", str(db), request, "--actor", "bob", "--reason", "no"]) == 2
    assert main(["reject", str(db), "apr-none", "--actor", "bob", "--reason", "no"]) == 2
    assert "approval_not_found" in capsys.readouterr().err
    assert main(["approve", str(db), "apr-x", "--actor", " "]) == 2
    assert (
        main(["review", str(db), review, "--outcome", "done", "--output", "{", "--actor", "o"]) == 2
    )
    assert "not JSON" in capsys.readouterr().err
    for deep in ("[" * 100 + "]" * 100, "[" * 100_000 + "]" * 100_000):
        too_deep = ["review", str(db), review, "--outcome", "done", "--output", deep]
        assert main([*too_deep, "--actor", "o"]) == 2
        assert capsys.readouterr().err == (
            f"agenttx review: --output is nested deeper than {agenttx.MAX_NESTING_DEPTH} levels "
            "(the most a JSON value may)\n"
        )
    args = ["review", str(db), review, "--outcome", "done", "--output", '{"n": 1}', "--actor", "o"]
    assert main(args) == 0
    assert f"review {review} resolved done by o" in capsys.readouterr().out
    assert main(args) == 2
    assert main(["approvals", str(db)]) == 0
    out = capsys.readouterr().out
    assert "0 approval request(s) pending" in out
    assert "0 review(s) pending" in out
    assert main(["approve", str(db.parent / "missing.db"), request, "--actor", "a"]) == 2


def test_inspect_preview_shows_compensations_and_refuses_an_ended_transaction(tmp_path):
    """`--preview` lists each compensation with its payload; an ended transaction has none."""
    store = SQLiteStore(tmp_path / "agent.db")
    engine = Engine(
        tools=builtins.tools(str(tmp_path)), store=store, config=EngineConfig(idle_timeout=None)
    )
    tx = engine.begin()
    tx.execute_step(1, "fs.write", {"path": "a.txt", "contents": "x"})
    done = engine.begin()
    done.execute_step(1, "kv.put", {"key": "k", "value": 1})
    done.commit()
    store.close()
    shown = agenttx_cli("inspect", str(tmp_path / "agent.db"), tx.id, "--preview", "1")
    assert shown.returncode == 0, shown.stderr
    compensation = tx.preview_rollback(1).compensations[0]
    assert compensation.tool_name == "fs.write"
    assert f'  step 1 fs.write: {compensation.kind} {{"path":' in shown.stdout
    assert "compensations, in the order they would run (1):" in shown.stdout
    ended = agenttx_cli("inspect", str(tmp_path / "agent.db"), done.id, "--preview", "1")
    assert ended.returncode == 2
    assert ended.stderr == (
        f"agenttx inspect: transaction {done.id} has ended (COMMITTED): nothing to roll back\n"
    )
