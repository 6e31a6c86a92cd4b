"""The command line, run as a person would: `python -m agenttx inspect | graph | lineage`."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from agenttx import Engine, EngineConfig, builtins
from agenttx.stores import SQLiteStore

if TYPE_CHECKING:
    from pathlib import Path


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
    tx = engine.begin(agent_id="support-bot")
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
        (("graph", str(db), "no-such-tx"), "no open transaction no-such-tx"),
        (("lineage", str(tmp_path / "nope.json")), "no such file"),
        (("lineage", str(bad_json)), "is not a JSON transcript"),
    ]
    for arguments, message in cases:
        done = agenttx_cli(*arguments)
        assert done.returncode == 2, (arguments, done.stdout, done.stderr)
        assert message in done.stderr, (arguments, done.stderr)
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "nope.db").exists()  # inspecting never creates a file


@pytest.mark.parametrize("command", ["demo", "inspect", "graph", "lineage"])
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
