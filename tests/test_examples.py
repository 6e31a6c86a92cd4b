"""Every script in examples/ runs to completion."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


def test_there_are_examples():
    """The examples folder is found and not empty."""
    assert EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path):
    """The example exits 0 and prints something."""
    done = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_references_example_output():
    """The references example shows a typed value, both failure messages and a refusal."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES[0].parent / "references.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "'customer_id': 101," in done.stdout
    assert "key '5' not present in output of step 2" in done.stdout
    assert "reference ${steps.7.id} points to a step that has not completed" in done.stdout
    assert "refused: not a JSON value in arguments at $.ids" in done.stdout


def test_order_plan_example_output():
    """The plan example shows both validation failures, a retried transient failure with one
    idempotency key, the metrics and cost, and a failed run whose reservation is released."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES[0].parent / "order_plan.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = done.stdout
    assert (
        "TYPE_MISMATCH reserve.customer_id: input `customer_id` of node `reserve` takes a "
        "`CustomerId`, but ${stock_check.warehouse_id} is a `WarehouseId`." in out
    )
    assert "CYCLE customer_lookup -> reserve -> customer_lookup:" in out
    assert out.count("no tool ran") == 2
    assert "stock_check: SUCCEEDED, 2 attempt(s)" in out
    assert "stock_check attempt 1 retried: Hint: Upstream service failed (HTTP 503)." in out
    assert re.search(
        r"check_stock ran 2 times, idempotency key\(s\): \['[0-9a-f]+'\]$", out, re.MULTILINE
    )
    assert re.search(r"makespan \d+ ms, critical path \d+ ms \(.* -> reserve -> confirm\)", out)
    assert "cost: 0.0131 GBP (model 0.0021, tool 0.0005, infrastructure 0.01, retry 0.0005)" in out
    lines = out.splitlines()
    failed = lines.index("an order whose confirmation is refused:")
    assert lines[failed + 1 : failed + 4] == [
        "  [warehouse] reserved res-c-bob-wh-leeds-sku-42-2",
        "  [warehouse] released res-c-bob-wh-leeds-sku-42-2",
        "  status: FAILED",
    ]
    assert "  compensation release_reservation of reserve: COMPLETED" in lines
    assert lines[-1] == "cost per completed workflow over both runs: 0.0257 GBP"


def _readme_blocks() -> list[str]:
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)


def test_readme_has_python_examples():
    """The README shows runnable Python."""
    assert _readme_blocks()


@pytest.mark.parametrize("index", range(len(_readme_blocks())))
def test_readme_example_runs(index):
    """Each Python block of the README runs as written."""
    block = _readme_blocks()[index]
    done = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", ["openai_chat.py", "anthropic_messages.py"])
def test_provider_example_rewinds_refunds_and_emails_once(name):
    """The provider examples charge twice, refund the first charge, and email once, after commit."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES[0].parent / name)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert [line.strip() for line in lines if "[payments]" in line] == [
        "[payments] charge ch-c-old: 42p",
        "[payments] refund ch-c-old",
        "[payments] charge ch-c-1: 42p",
    ]
    emails = [i for i, line in enumerate(lines) if "[email]" in line]
    assert len(emails) == 1
    last_turn = next(i for i, line in enumerate(lines) if line.startswith("model: Order o-1"))
    assert emails[0] > last_turn  # sent by the commit, after the loop ended
    assert '"root_cause": {"step": 1, "key": "customer_id"}' in done.stdout
    assert lines[-1] == "transaction committed"


def test_approvals_example_output():
    """The approvals example waits for approval, runs the approved charge once, settles a
    timed-out charge by its status check, sends an unknown one to review, and charges four."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES[0].parent / "approvals.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = done.stdout
    assert "large charge: NEEDS_APPROVAL" in out
    assert "approved by alice@finance, until" in out
    assert "large charge, sent again: SUCCESS" in out
    assert "the same call once more needs a new approval: NEEDS_APPROVAL" in out
    assert "rejected by alice@finance: already charged once" in out
    assert "timed-out charge, settled by the status check: SUCCESS" in out
    assert "timed-out charge, check failing: NEEDS_REVIEW" in out
    assert "ConnectionError: status endpoint unavailable" in out
    assert "after the review: SUCCESS {'charge_id': 'manual'}" in out
    assert "committed 4 steps; the provider charged 4" in out
    assert "step 2 approval_consumed by alice@finance" in out
    assert "step 4 reviewed by bob@ops" in out


def test_audit_trail_example_output():
    """The audit example prints the events live (the failure, the refund, the rewind, the
    commit) and the same trail read back from the file."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES[0].parent / "audit_trail.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = done.stdout
    live, stored = out.split("read back from", 1)
    kinds = ["step_failed", "compensated", "step_rewound", "committed"]
    assert all(kind in live for kind in kinds), out
    assert all(kind in stored for kind in kinds), out
    assert "11 events; `agenttx audit " in out


def test_model_plan_example_output():
    """The model's plan example shows the refused plan's problems with their "did you mean",
    then the corrected plan's run: one charge, one email, the outputs sent to the model."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES[0].parent / "model_plan.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = done.stdout
    assert "(did you mean `lookup_customer`?)" in out
    assert "(did you mean `lookup`?)" in out
    assert '"plan": "REFUSED"' in out
    assert '"plan": "SUCCEEDED"' in out
    assert out.count("[payments] charge") == 1
    assert out.count("[email] to ada@example.com") == 1
    assert out.rstrip().endswith("transaction committed, 0 steps")
