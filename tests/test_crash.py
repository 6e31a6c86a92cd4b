"""The crash campaign, short: SIGKILLed workers, recovery, and the checks of campaigns/crash.py.

The full campaign (1,000 trials) is run by hand: `python campaigns/crash.py --trials 1000`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "campaigns" / "crash.py"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")


def run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.parametrize("mode", [[], ["--exclusive"]], ids=["shared", "exclusive"])
def test_a_short_crash_campaign_finds_nothing_lost(tmp_path, mode):
    """Four kill-recover-check trials pass every check, with transactions committed; on an
    exclusive store too, whose lock dies with the killed worker."""
    done = run("--trials", "4", "--max-delay", "0.8", "--root", str(tmp_path), *mode)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 trials, 0 failed" in done.stdout
    committed = int(done.stdout.split("failed, in")[1].split(":")[1].split()[0])
    assert committed > 0, done.stdout  # the workers got far enough to commit


def test_processes_sharing_one_file_lose_no_update(tmp_path):
    """Two processes of read-modify-write transactions on one file: every increment counts."""
    done = run("--contend", "--processes", "2", "--transactions", "30", "--root", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "60 committed" in done.stdout
