"""`bench/store.py --quick` runs to completion and prints its results table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_store_benchmark_quick_run() -> None:
    """The quick run exits 0 (its correctness checks hold) and prints the results table."""
    env = dict(os.environ)
    # The benchmark imports agenttx; make this checkout importable even when it is not installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "store.py"), "--quick"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    header = re.compile(r"^benchmark +measured +target +ratio +result$", re.MULTILINE)
    assert header.search(result.stdout), result.stdout
    assert "restore after 1,000 writes" in result.stdout
    assert "commit of 200 keys" in result.stdout
