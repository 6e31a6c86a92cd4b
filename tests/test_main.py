"""The command line: `python -m agenttx demo`, `--help`, `--version`."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

import agenttx
from agenttx import _demo
from agenttx.__main__ import main


def test_demo_runs_the_order_workflow():
    """The demo fails on the foreign key, jumps to step 1, reverts, replays and commits."""
    done = subprocess.run(
        [sys.executable, "-m", "agenttx", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Hint: Foreign key constraint failed for 'customer_id'." in out
    assert "dependency_jump: rewound to step 1, send step 1 next" in out
    assert "stock/SKU-1 = None, receipt exists = False, staged emails = 0" in out
    assert "step 1 -> step 5  id -> customer_id  (explicit)" in out
    assert "5 steps committed, 1 effect dispatched after the commit, 0 left in the outbox" in out
    assert out.index("email sent") > out.index("commit:")


def test_the_demo_file_can_be_inspected_after_it_ends(tmp_path):
    """The demo ends with the `agenttx inspect` commands; run on its file once it has ended,
    they show its committed transaction and the attempts that were rewound and compensated."""
    done = subprocess.run(
        [sys.executable, "-m", "agenttx", "demo", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = lines.index("the file keeps the transaction as history; to look at what it did:")
    commands = [shlex.split(line) for line in lines[start + 1 : start + 5]]
    assert [command[:2] for command in commands] == [
        ["agenttx", "inspect"],
        ["agenttx", "inspect"],
        ["agenttx", "graph"],
        ["agenttx", "audit"],
    ]
    assert commands[0][2] == str(tmp_path / "agenttx.db")
    outputs = []
    for command in commands:
        shown = subprocess.run(
            [sys.executable, "-m", "agenttx", *command[1:]],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.returncode == 0, shown.stderr
        outputs.append(shown.stdout)
    listing, detail, graph, audit = outputs
    tx_id = commands[1][3]
    assert listing.splitlines()[0].endswith(": 0 open transactions")
    assert [tx_id, "demo", "COMMITTED", "5"] in [line.split()[:4] for line in listing.splitlines()]
    assert f"transaction {tx_id} (ended)" in detail
    assert "status: COMMITTED" in detail
    assert "  3. step 3 fs.write: compensated" in detail
    assert "  2. step 2 kv.put: rewound" in detail
    assert "  5. step 5 record.insert: failed" in detail
    assert "  10. step 5 record.insert: committed" in detail
    assert "  step 1 -> step 5  id -> customer_id  (explicit)" in detail
    assert graph == (tmp_path / "graph.mmd").read_text(encoding="utf-8")
    assert ":::compensated" in graph
    assert [line.split()[1] for line in audit.splitlines()][-1] == "committed"
    assert any(
        line.split()[1:4] == ["step_failed", "step", "5"] and "Hint: Foreign key" in line
        for line in audit.splitlines()
    ), audit
    as_json = subprocess.run(
        [sys.executable, "-m", "agenttx", *commands[3][1:], "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [event["seq"] for event in events] == list(range(len(events)))
    kinds = [event["kind"] for event in events]
    assert kinds[-1] == "committed"
    assert kinds.index("step_failed") < kinds.index("compensated") < kinds.index("step_rewound")
    assert {event["scope_id"] for event in events} == {tx_id}


def test_demo_returns_the_committed_transaction():
    """The demo's transaction ends COMMITTED with the order and the stock published."""
    lines: list[str] = []
    tx = _demo.run(lines.append)
    assert tx.status is agenttx.TxStatus.COMMITTED
    assert tx.read("records/orders/o-1") == {"customer_id": "c-1", "sku": "SKU-1", "id": "o-1"}
    assert tx.read("kv/stock/SKU-1") == {"reserved": 2}
    assert len(tx.constraints) == 1


def test_demo_command_in_process(capsys):
    """main(["demo"]) prints the demo and returns 0."""
    assert main(["demo"]) == 0
    assert "1 effect dispatched after the commit" in capsys.readouterr().out


def test_no_command_prints_help_and_fails(capsys):
    """Without a command the usage goes to stderr and the exit status is 2."""
    assert main([]) == 2
    assert "usage: agenttx" in capsys.readouterr().err


def test_version(capsys):
    """--version prints the package version."""
    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0
    assert agenttx.__version__ in capsys.readouterr().out


def test_unknown_command_is_refused(capsys):
    """An unknown command is an argparse error naming the choices."""
    with pytest.raises(SystemExit) as caught:
        main(["frobnicate"])
    assert caught.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
