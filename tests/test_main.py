"""The command line: `python -m agenttx demo`, `--help`, `--version`."""

from __future__ import annotations

import subprocess
import sys

import pytest

import agenttx
from agenttx import _demo
from agenttx.__main__ import main


def test_demo_prints_the_seed_example_and_its_root_cause():
    """The demo resolves the references, prints the graph and finds step 2 as the root cause."""
    done = subprocess.run(
        [sys.executable, "-m", "agenttx", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert 'resolved to {"user":"u-7"}' in done.stdout
    assert "step 2 -> step 5  id -> user  (explicit)" in done.stdout
    assert "step 5 -> step 7  owner_id -> owner_id  (implicit)" in done.stdout
    assert "root cause of step 9's bad `user_id`: step 2 (create_user)" in done.stdout
    assert "flowchart LR" in done.stdout


def test_demo_returns_the_graph():
    """The demo's graph is the seed example's: find_root_cause(9, 'user_id') == 2."""
    lines: list[str] = []
    graph = _demo.run(lines.append)
    assert graph.find_root_cause(9, "user_id") == 2
    assert graph.steps() == (2, 5, 7, 9)
    assert lines


def test_demo_command_in_process(capsys):
    """main(["demo"]) prints the demo and returns 0."""
    assert main(["demo"]) == 0
    assert "root cause of step 9's bad `user_id`: step 2" in capsys.readouterr().out


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
