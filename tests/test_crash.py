"""The crash campaign, short: SIGKILLed workers, recovery, and the checks of campaigns/crash.py.

The full campaigns (1,000 trials each) are run by hand:
`python campaigns/crash.py --trials 1000 --mode abort` and `... --mode resume`, and with
`--store postgres` on the server named by AGENTTX_POSTGRES_DSN (the slow test below).
"""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("mode", ["abort", "resume"])
@pytest.mark.parametrize("store", [[], ["--exclusive"]], ids=["shared", "exclusive"])
def test_a_short_crash_campaign_finds_nothing_lost(tmp_path, mode, store):
    """Four kill-recover-check trials pass every check, with transactions committed, whether
    recovery aborts or resumes (and finishes) what the killed worker left open; on an exclusive
    store too, whose lock dies with the killed worker."""
    done = run(
        "--trials", "4", "--max-delay", "0.8", "--root", str(tmp_path), "--mode", mode, *store
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 trials, 0 failed" in done.stdout
    committed = int(done.stdout.split("failed, in")[1].split(":")[1].split()[0])
    assert committed > 0, done.stdout  # the workers got far enough to commit
    assert f"{mode} mode" in done.stdout
    resumed = int(done.stdout.split("mode, ")[1].split()[0])
    # A worker is nearly always inside a transaction when it is killed (it begins the next one
    # at once), so four kills leave some to resume; abort mode resumes none.
    assert (resumed > 0) == (mode == "resume"), done.stdout


def test_the_resume_campaign_catches_a_charge_committed_after_its_refund(tmp_path):
    """The checker is not blind: a refund log claiming a committed charge was refunded (what a
    revived compensated step would produce) fails the trial."""
    for delay in ("0.3", "0.6", "1.2", "2.4"):  # a loaded machine may kill before any commit
        done = run(
            "--trials", "1", "--max-delay", delay, "--root", str(tmp_path), "--mode", "resume"
        )
        assert done.returncode == 0, done.stdout + done.stderr
        if int(done.stdout.split("failed, in")[1].split(":")[1].split()[0]) > 0:
            break
    else:
        pytest.fail("no trial committed a transaction: " + done.stdout)
    charges = [json.loads(line) for line in (tmp_path / "charges.log").read_text().splitlines()]
    with (tmp_path / "refunds.log").open("a") as refunds:
        for charge in charges:  # one of them was committed
            refunds.write(json.dumps({"charge": charge["charge"], "key": charge["key"]}) + "\n")
    done = run("--trials", "1", "--max-delay", "0.3", "--root", str(tmp_path), "--mode", "resume")
    assert done.returncode == 1
    assert "committed charges refunded" in done.stdout


def test_processes_sharing_one_file_lose_no_update(tmp_path):
    """Two processes of read-modify-write transactions on one file: every increment counts."""
    done = run("--contend", "--processes", "2", "--transactions", "30", "--root", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "60 committed" in done.stdout


@pytest.mark.parametrize("mode", ["abort", "resume"])
def test_a_short_crash_campaign_on_postgres_finds_nothing_lost(tmp_path, mode, pg_schema):
    """The same kill-recover-check trials on PostgresStore: a killed worker's leases run out,
    recovery takes its transactions, and every check passes."""
    dsn, schema = pg_schema
    done = run(
        *("--trials", "4", "--max-delay", "0.8", "--root", str(tmp_path), "--mode", mode),
        *("--store", "postgres", "--dsn", dsn, "--schema", schema),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 trials, 0 failed" in done.stdout
    committed = int(done.stdout.split("failed, in")[1].split(":")[1].split()[0])
    assert committed > 0, done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["abort", "resume"])
def test_the_full_crash_campaign_on_postgres(tmp_path, mode, pg_schema):
    """1,000 SIGKILLed workers on PostgresStore, none losing anything (AGENTTX_SLOW=1)."""
    dsn, schema = pg_schema
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *("--trials", "1000", "--root", str(tmp_path), "--mode", mode),
            *("--store", "postgres", "--dsn", dsn, "--schema", schema),
        ],
        capture_output=True,
        text=True,
        timeout=7200,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1000 trials, 0 failed" in done.stdout
