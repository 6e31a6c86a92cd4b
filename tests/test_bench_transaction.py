"""`bench/transaction.py --quick` runs its chain correctly and prints its results table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_transaction_benchmark_quick_run() -> None:
    """The quick run exits 0 (the chain resolves and commits) and prints the table header."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "transaction.py"), "--quick"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "execute_step per step (agenttx)" in result.stdout
