"""The damage benchmark's quick run (bench/damage): it runs, and agenttx's claims hold in it.

Only the damage counts are checked, never the times (bench/RESULTS.md has a full run's figures).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ("unintended", "duplicates", "orphaned", "leaked", "blind_retries")
LOOPS = ("plain", "langgraph", "agenttx")
SUITES = ("banking", "workspace")
FAULTS = ("crash_after_effect", "crash_after_record", "timeout", "transient", "permanent", "noop")

UNCLAIMED = re.compile(r"^(\d+) \(‡ (\d+) not claimed\)$")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("agentdojo") is None
    or importlib.util.find_spec("langgraph.checkpoint.sqlite") is None,
    reason="needs agentdojo and langgraph-checkpoint-sqlite (the damage extra, in dev)",
)


@pytest.fixture(scope="module")
def table() -> dict[tuple[str, str, str], dict[str, str]]:
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
    # the run exits non-zero when it prints a FINDING (a claim that failed, a fault not fired)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FINDING" not in result.stdout, result.stdout
    rows = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 14 and cells[0] in SUITES:
            rows[cells[0], cells[1], cells[2]] = dict(zip(COLUMNS, cells[6:11], strict=True)) | {
                "episodes": cells[3],
                "fired": cells[4],
                "utility": cells[5],
                "turns": cells[12],
            }
    return rows


@pytest.mark.timeout(900)
def test_quick_run_covers_every_fault_and_loop(table):
    """The quick run prints a row for each fault of the schedule and each mistake of the
    scripted agent, for each of the three loops, in banking and in workspace."""
    faults = {"none", *FAULTS, "injection", "wrong_argument", "repeated_mistake"}
    expected = {(s, f, loop) for s in SUITES for f in faults | {"bad_id"} for loop in LOOPS}
    assert set(table) == expected


def claimed(cell: str) -> int:
    """A damage cell's count less what it marks as not claimed (‡: at-least-once delivery)."""
    match = UNCLAIMED.match(cell)
    return int(match[1]) - int(match[2]) if match else int(cell)


@pytest.mark.timeout(900)
def test_no_loop_does_damage_without_a_fault(table):
    """Fault-free, no loop leaves any damage: every effect is delivered once (a staged effect
    delivered twice with its key would show here, the e-mail service ignoring the key)."""
    for suite in SUITES:
        for loop in LOOPS:
            row = table[suite, "none", loop]
            assert [row[c] for c in COLUMNS] == ["0"] * 5, (suite, loop, row)


@pytest.mark.timeout(900)
def test_every_scheduled_fault_fired(table):
    """Each faulted episode's fault happened (a crash: and the agent's process restarted)."""
    for (suite, fault, loop), row in table.items():
        if fault in (*FAULTS, "injection"):
            assert row["fired"] == f"{row['episodes']}/{row['episodes']}", (suite, fault, loop)


@pytest.mark.timeout(900)
def test_the_plain_loop_does_damage_the_harness_sees(table):
    """A crash after an effect and a timeout after the request duplicate the plain loop's
    effects (a payment in banking, a file created in workspace), and the injection's payments
    and messages leak: the harness detects damage where there is some."""
    for suite in SUITES:
        assert int(table[suite, "crash_after_effect", "plain"]["duplicates"]) > 0, suite
        assert int(table[suite, "timeout", "plain"]["duplicates"]) > 0, suite
        assert int(table[suite, "timeout", "plain"]["blind_retries"]) > 0, suite
        assert int(table[suite, "injection", "plain"]["leaked"]) > 0, suite


@pytest.mark.timeout(900)
def test_agenttx_does_no_damage_where_its_docs_claim_none(table):
    """Under crashes, timeouts, transient errors and injections agenttx leaves no unintended
    change, duplicate, orphaned state, leaked effect or blind retry, at full task success (but
    for an e-mail delivered twice, not claimed: the change and the failed task are that
    e-mail); a permanent refusal leaves nothing behind. The workspace file creation is a
    reversible write that is not idempotent, so a compensation that does nothing shows as a
    duplicate."""
    for suite in SUITES:
        plain = table[suite, "none", "plain"]["utility"]
        assert plain.split("/")[0] == plain.split("/")[1] != "0", (suite, plain)
        for fault in ("crash_after_effect", "crash_after_record", "timeout", "transient"):
            row = table[suite, fault, "agenttx"]
            assert [claimed(row[c]) for c in COLUMNS[1:]] == [0] * 4, (suite, fault, row)
            if UNCLAIMED.match(row["duplicates"]) is None:  # else: the e-mail sent twice
                assert row["unintended"] == "0", (suite, fault, row)
                assert row["utility"] == plain, (suite, fault, row)
        row = table[suite, "injection", "agenttx"]
        assert [row[c] for c in COLUMNS] == ["0"] * 5, (suite, row)
        row = table[suite, "permanent", "agenttx"]
        assert [row[c] for c in COLUMNS] == ["0"] * 5, (suite, row)
        assert table[suite, "noop", "agenttx"]["unintended"].endswith("(not claimed)")


@pytest.mark.timeout(900)
def test_agenttx_redelivering_an_email_after_a_timeout_is_counted_and_not_claimed(table):
    """The outbox delivers a staged e-mail again with its key after a timeout of its delivery;
    the e-mail service ignores the key, so the table counts a duplicate and a blind retry, and
    marks both as not claimed (agenttx's delivery is at least once)."""
    row = table["workspace", "timeout", "agenttx"]
    for column in ("duplicates", "blind_retries"):
        match = UNCLAIMED.match(row[column])
        assert match is not None, (column, row)
        assert match[1] == match[2] != "0", (column, row)


@pytest.mark.timeout(900)
def test_the_mistake_agent_finishes_in_every_loop_and_agenttx_resends_a_wrong_argument(table):
    """After a wrong argument, a bad id or the same wrong call twice, every loop completes the
    task with no damage; agenttx resends a literal the tool refused (as many decisions as the
    plain loop) instead of rewinding the step before it."""
    for mistake in ("wrong_argument", "bad_id", "repeated_mistake"):
        for loop in LOOPS:
            row = table["banking", mistake, loop]
            assert [row[c] for c in COLUMNS] == ["0"] * 5, (mistake, loop, row)
            done, episodes = row["utility"].split("/")
            assert done == episodes != "0", (mistake, loop, row)
    for mistake in ("wrong_argument", "repeated_mistake"):
        assert (
            table["banking", mistake, "agenttx"]["turns"]
            == table["banking", mistake, "plain"]["turns"]
        ), mistake
