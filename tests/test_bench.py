"""Every benchmark script's `--quick` run passes its correctness checks and prints its table.

Timings are not checked here (the machines are shared and noisy): the figures come from full
runs by hand, recorded in bench/RESULTS.md.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import agenttx

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


@pytest.mark.timeout(300)
def test_compare_runs_both_trees_and_removes_its_worktree(tmp_path: Path) -> None:
    """bench/compare.py's smoke run measures the old commit and this tree, writes its JSON, and
    leaves no worktree behind."""
    worktrees = _git("worktree", "list", "--porcelain")
    out = tmp_path / "compare.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "bench/compare.py", "--rounds", "1", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert HEADER.search(result.stdout), result.stdout
    found = json.loads(out.read_text())
    assert found["rounds"] == 1
    assert len(found["commit"]) == 40
    measures = found["measures"]
    for key in ("step", "tps_memory", "tps_sqlite", "durable_step", "import", "first_use"):
        assert set(measures[key]["figures"]) == {"old", "new"}, key  # both trees, 1ffc288's API
        assert all(v > 0 for values in measures[key]["figures"].values() for v in values), key
    for key in ("plan_memory", "plan_durable"):  # 1ffc288 had no plans: this tree only
        assert set(measures[key]["figures"]) == {"new"}, key
    assert _git("worktree", "list", "--porcelain") == worktrees


def test_import_agenttx_loads_only_the_errors_and_the_version():
    """`import agenttx` loads no module of its own beyond the errors and the version."""
    code = "import sys, agenttx; print(sorted(m for m in sys.modules if m.startswith('agenttx')))"
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(["agenttx", "agenttx._errors", "agenttx._version"])


def test_a_lazy_name_loads_with_its_module_and_pins_what_loaded_with_it():
    """Asking for one name loads its module; every public class loaded with it reports `agenttx`."""
    code = (
        "import agenttx\n"
        "assert 'Transaction' not in vars(agenttx) and 'Transaction' in dir(agenttx)\n"
        "tx = agenttx.Transaction(tools=[])\n"
        "assert 'StepResult' in vars(agenttx)\n"  # loaded with Transaction: published
        "assert type(tx.execute_step(1, 'nope', {})).__module__ == 'agenttx'\n"
        "assert agenttx.InvalidArgument.__module__ == 'agenttx'\n"
        "assert agenttx.stores.MemoryStore.__module__ == 'agenttx.stores'\n"
        "from agenttx import *\n"
        "assert Plan is agenttx.Plan and Plan.__module__ == 'agenttx'\n"
        "try:\n"
        "    agenttx.NoSuchName\n"
        "except AttributeError as exc:\n"
        "    assert 'NoSuchName' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr


def test_the_lazy_table_and_the_type_checkers_imports_agree():
    """Every name of `agenttx.__all__` is loaded with the package or listed in the lazy table, and
    the `TYPE_CHECKING` imports name the same module for it."""
    source = (ROOT / "agenttx" / "__init__.py").read_text()
    imported = {
        alias.asname or alias.name: f".{node.module}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        for alias in node.names
    }
    errors = {name for name, module in imported.items() if module == "._errors"}
    assert set(agenttx.__all__) == errors | set(agenttx._LAZY)
    assert {name: imported[name] for name in agenttx._LAZY} == agenttx._LAZY


def _git(*arguments: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *arguments], capture_output=True, text=True, check=True
    ).stdout
