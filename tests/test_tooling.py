"""The codebase passes ruff (lint and format) and mypy --strict, as CI requires."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SOURCES = ["agenttx", "tests", "examples", "bench", "campaigns"]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.parametrize("command", [("check",), ("format", "--check")], ids=" ".join)
def test_ruff(command):
    """ruff finds nothing to fix."""
    done = _run("ruff", *command, *SOURCES)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict():
    """mypy --strict passes on the package and on the typing checks in tests/typing."""
    done = _run("mypy", "--strict", "agenttx", "tests/typing")
    assert done.returncode == 0, done.stdout + done.stderr
