"""The damage benchmark's quick run (bench/damage): it runs, and agenttx's claims hold in it.

Only the damage counts are checked, never the times (bench/RESULTS.md has a full run's figures).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ("unintended", "duplicates", "orphaned", "leaked", "blind_retries")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("agentdojo") is None
    or importlib.util.find_spec("langgraph.checkpoint.sqlite") is None,
    reason="needs agentdojo and langgraph-checkpoint-sqlite (the damage extra, in dev)",
)


@pytest.fixture(scope="module")
def table() -> dict[tuple[str, str], dict[str, str]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "bench.damage", "--quick"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 13 and cells[0] == "banking":
            rows[cells[1], cells[2]] = dict(zip(COLUMNS, cells[5:10], strict=True)) | {
                "utility": cells[4],
                "turns": cells[11],
            }
    return rows


@pytest.mark.timeout(900)
def test_quick_run_covers_every_fault_and_loop(table):
    """The quick run prints a row for each fault of the schedule and each mistake of the
    scripted agent, for each of the three loops."""
    faults = {"none", "crash_after_effect", "crash_after_record", "timeout", "transient"}
    faults |= {"permanent", "noop", "injection", "wrong_argument", "bad_id", "repeated_mistake"}
    assert set(table) == {(f, loop) for f in faults for loop in ("plain", "langgraph", "agenttx")}


@pytest.mark.timeout(900)
def test_the_plain_loop_does_damage_the_harness_sees(table):
    """A crash after an effect and a timeout after the request duplicate the plain loop's
    effects, and the injection's payments leak: the harness detects damage where there is some."""
    assert int(table["crash_after_effect", "plain"]["duplicates"]) > 0
    assert int(table["timeout", "plain"]["duplicates"]) > 0
    assert int(table["timeout", "plain"]["blind_retries"]) > 0
    assert int(table["injection", "plain"]["leaked"]) > 0


@pytest.mark.timeout(900)
def test_agenttx_does_no_damage_where_its_docs_claim_none(table):
    """Under crashes, timeouts, transient errors and injections agenttx leaves no duplicate,
    no leaked effect, no orphaned state and no unintended change, at full task success."""
    for fault in ("crash_after_effect", "crash_after_record", "timeout", "transient", "injection"):
        row = table[fault, "agenttx"]
        assert [row[c] for c in COLUMNS[:4]] == ["0"] * 4, (fault, row)
        assert row["utility"] == table["none", "plain"]["utility"] == "3/3", (fault, row)
    assert table["noop", "agenttx"]["unintended"].endswith("(not claimed)")


@pytest.mark.timeout(900)
def test_the_mistake_agent_finishes_in_every_loop_and_agenttx_resends_a_wrong_argument(table):
    """After a wrong argument, a bad id or the same wrong call twice, every loop completes the
    task with no damage; agenttx resends a literal the tool refused (as many decisions as the
    plain loop) instead of rewinding the step before it."""
    for mistake in ("wrong_argument", "bad_id", "repeated_mistake"):
        for loop in ("plain", "langgraph", "agenttx"):
            row = table[mistake, loop]
            assert [row[c] for c in COLUMNS] == ["0"] * 5, (mistake, loop, row)
            done, episodes = row["utility"].split("/")
            assert done == episodes != "0", (mistake, loop, row)
    for mistake in ("wrong_argument", "repeated_mistake"):
        assert table[mistake, "agenttx"]["turns"] == table[mistake, "plain"]["turns"], mistake
