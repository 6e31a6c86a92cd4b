"""Every benchmark script's `--quick` run passes its correctness checks and prints its table.

Timings are not checked here (the machines are shared and noisy): the figures come from full
runs by hand, recorded in bench/RESULTS.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))
HEADER = re.compile(r"^benchmark +measured +target +ratio +result$", re.MULTILINE)


def test_there_are_benchmarks():
    """The bench folder is found and holds the scripts the issues ask for."""
    assert {p.name for p in SCRIPTS} >= {"graph.py", "store.py", "transaction.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_quick_run(script: Path) -> None:
    """The quick run exits 0 (its correctness checks hold) and prints the results table."""
    env = dict(os.environ)
    # The benchmarks import agenttx; make this checkout importable even when not installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, str(script), "--quick"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert HEADER.search(result.stdout), result.stdout
