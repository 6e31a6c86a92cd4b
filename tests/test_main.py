"""The command line: `python -m agenttx demo`, `--help`, `--version`."""

from __future__ import annotations

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
