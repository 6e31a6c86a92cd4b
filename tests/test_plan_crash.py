"""The plan crash campaign, short: SIGKILLed plan runs, recovery, and the checks of
campaigns/plan_crash.py. The full campaign (1,000 trials) runs with AGENTTX_SLOW=1, or by
hand: `python campaigns/plan_crash.py --trials 1000`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "campaigns" / "plan_crash.py"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")


def run(*arguments: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_short_plan_crash_campaign_finds_nothing_wrong(tmp_path):
    """Four kill-recover-check trials pass every check, and recovery resumed runs."""
    done = run("--trials", "4", "--root", str(tmp_path), "--seed", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 trials, 0 failed" in done.stdout
    resumed = int(done.stdout.split("checked, ")[1].split()[0])
    assert resumed > 0, done.stdout  # the kills left runs to resume


def test_the_checker_is_not_blind_to_lost_state_compensations_or_effects(tmp_path):
    """A run whose committed state, compensations or delivered effects differ from a
    crash-free run's fails the next trial."""
    done = run("--trials", "3", "--root", str(tmp_path), "--seed", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    import sqlite3  # noqa: PLC0415

    with sqlite3.connect(tmp_path / "effects.db") as conn:  # t1-0 fails, t2-0 succeeds
        conn.execute("DELETE FROM delivered")
        conn.execute("DELETE FROM undone")
    with sqlite3.connect(tmp_path / "plans.db") as conn:
        conn.execute("DELETE FROM committed")
    done = run("--trials", "1", "--root", str(tmp_path), "--seed", "4")
    assert done.returncode == 1
    assert "effects delivered for" in done.stdout
    assert "compensated" in done.stdout
    assert "committed state" in done.stdout


def test_the_checker_is_not_blind_to_an_effect_applied_twice(tmp_path):
    """An effect recorded twice under one idempotency key fails the next trial."""
    done = run("--trials", "1", "--root", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    import sqlite3  # noqa: PLC0415

    with sqlite3.connect(tmp_path / "effects.db") as conn:
        conn.execute("INSERT INTO effects SELECT * FROM effects LIMIT 1")
    done = run("--trials", "1", "--root", str(tmp_path), "--seed", "2")
    assert done.returncode == 1
    assert "ran 2 times" in done.stdout


@pytest.mark.slow
def test_the_full_plan_crash_campaign(tmp_path):
    """1,000 trials: every check passes (AGENTTX_SLOW=1)."""
    done = run("--trials", "1000", "--root", str(tmp_path), timeout=4 * 3600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "1000 trials, 0 failed" in done.stdout
