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
    assert {p.name for p in SCRIPTS} >= {"graph.py", "plans.py", "store.py", "transaction.py"}


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


def test_import_agenttx_leaves_the_heavy_modules_to_the_paths_that_use_them():
    """A fresh `import agenttx` loads none of asyncio, sqlite3, socket, rustworkx and the like."""
    heavy = ("asyncio", "sqlite3", "concurrent.futures", "typing_extensions", "socket", "rustworkx")
    code = f"import sys, agenttx; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_sqlite_store_loads_on_first_use_by_either_import_form():
    """Either way of reaching `SQLiteStore` loads it (and sqlite3) on first use, at its path."""
    code = (
        "import sys, agenttx.stores as s\n"
        "assert 'sqlite3' not in sys.modules\n"
        "assert 'SQLiteStore' in dir(s) and 'SQLiteStore' in s.__all__\n"
        "from agenttx.stores import SQLiteStore\n"
        "assert 'sqlite3' in sys.modules and s.SQLiteStore is SQLiteStore\n"
        "assert SQLiteStore.__module__ == 'agenttx.stores'\n"
        "assert not hasattr(s, 'NoSuchStore')\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with this checkout importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
        check=False,
    )
