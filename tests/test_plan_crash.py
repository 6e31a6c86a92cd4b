"""The plan crash campaign, short: SIGKILLed plan runs, recovery, and the checks of
campaigns/plan_crash.py, on SQLiteStore and on PostgresStore (the server named by
AGENTTX_POSTGRES_DSN). The full campaign (1,000 trials) runs with AGENTTX_SLOW=1, or by hand:
`python campaigns/plan_crash.py --trials 1000 [--store postgres]`."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

SCRIPT = Path(__file__).resolve().parent.parent / "campaigns" / "plan_crash.py"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")


class Backend:
    """Where a campaign keeps its plan runs: the command-line options naming the store, and a
    way to poke its tables behind the engine's back."""

    def __init__(self, root: Path, dsn: str = "", schema: str = "") -> None:
        self.root = root
        self.dsn = dsn
        self.schema = schema
        self.options = ["--store", "postgres", "--dsn", dsn, "--schema", schema] if dsn else []

    def execute(self, sql: str) -> None:
        """Run `sql` on the store's tables (`{s}.` stands for the schema on PostgreSQL)."""
        if self.dsn:
            import psycopg  # noqa: PLC0415

            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(sql.replace("{s}.", f"{self.schema}."))
            return
        with sqlite3.connect(self.root / "plans.db") as conn:
            conn.execute(sql.replace("{s}.", ""))


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each campaign test runs on a SQLite file and on a PostgreSQL schema of its own."""
    if request.param == "postgres":
        dsn, schema = request.getfixturevalue("pg_schema")
        yield Backend(tmp_path, dsn, schema)
        return
    yield Backend(tmp_path)


def run(
    backend: Backend, *arguments: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *arguments, "--root", str(backend.root), *backend.options],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_short_plan_crash_campaign_finds_nothing_wrong(backend):
    """Four kill-recover-check trials pass every check, and recovery resumed runs."""
    done = run(backend, "--trials", "4", "--seed", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 trials, 0 failed" in done.stdout
    resumed = int(done.stdout.split("checked, ")[1].split()[0])
    assert resumed > 0, done.stdout  # the kills left runs to resume


def test_the_checker_is_not_blind_to_lost_state_compensations_or_effects(backend):
    """A run whose committed state, compensations or delivered effects differ from a
    crash-free run's fails the next trial."""
    done = run(backend, "--trials", "3", "--seed", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    with sqlite3.connect(backend.root / "effects.db") as conn:  # t1-0 fails, t2-0 succeeds
        conn.execute("DELETE FROM delivered")
        conn.execute("DELETE FROM undone")
    backend.execute("DELETE FROM {s}.committed")
    done = run(backend, "--trials", "1", "--seed", "4")
    assert done.returncode == 1
    assert "effects delivered for" in done.stdout
    assert "compensated" in done.stdout
    assert "committed state" in done.stdout


def test_the_checker_is_not_blind_to_an_effect_applied_twice(backend):
    """An effect recorded twice under one idempotency key fails the next trial."""
    done = run(backend, "--trials", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    with sqlite3.connect(backend.root / "effects.db") as conn:
        conn.execute("INSERT INTO effects SELECT * FROM effects LIMIT 1")
    done = run(backend, "--trials", "1", "--seed", "2")
    assert done.returncode == 1
    assert "ran 2 times" in done.stdout


def test_the_checker_is_not_blind_to_a_node_left_claimed(backend):
    """A node left RUNNING in a finished run fails the next trial."""
    done = run(backend, "--trials", "2", "--seed", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    backend.execute("UPDATE {s}.plan_nodes SET state = 'RUNNING' WHERE node_id = 'n0'")
    done = run(backend, "--trials", "1", "--seed", "4")
    assert done.returncode == 1
    assert "nodes still claimed" in done.stdout


@pytest.mark.slow
def test_the_full_plan_crash_campaign(backend):
    """1,000 trials: every check passes (AGENTTX_SLOW=1)."""
    done = run(backend, "--trials", "1000", timeout=4 * 3600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "1000 trials, 0 failed" in done.stdout
