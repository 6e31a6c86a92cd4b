"""Survive a crash: an agent's transaction on SQLite, a process that dies, and the resume.

Run it with `python examples/crash_recovery.py`. A first process charges a card (registering its
refund first, as every effect should) and stages a receipt email, then dies in the middle of a
third step, after charging again. A second process opens the same file and calls
`engine.recover("resume")`: the interrupted step's charge is refunded and its writes reverted,
the two finished steps are back, and the agent carries on from step 3 and commits. The email
goes out only after the commit, from the outbox.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from pathlib import Path
from typing import Any

import agenttx
from agenttx.stores import SQLiteStore

# The first process runs in a fresh interpreter that imports this module again: it finds the
# directory in the environment, set by the parent before it starts it.
ROOT = os.environ.setdefault("AGENTTX_EXAMPLE_DIR", tempfile.mkdtemp(prefix="agenttx-example-"))
LEDGER = Path(ROOT, "payments.log")
DATABASE = Path(ROOT, "agent.db")


def record(line: str) -> None:
    """The payment provider: what happened there, whatever the agent's process does."""
    with LEDGER.open("a") as ledger:
        ledger.write(line + "\n")


@agenttx.compensation(name="payments.refund")
def refund(payload: agenttx.JSONValue) -> None:
    assert isinstance(payload, dict)
    record(f"refund {payload['charge']}")


@agenttx.tool(name="payments.charge")
def charge(
    ctx: agenttx.ToolContext, order: str, amount: int, crash: bool = False
) -> dict[str, str]:
    charge_id = f"ch-{order}"
    ctx.register_undo("payments.refund", {"charge": charge_id})  # durable before the effect
    record(f"charge {charge_id} {amount}")
    ctx.state.put(f"orders/{order}", {"charge": charge_id, "amount": amount})
    if crash:
        os._exit(1)  # the process dies here, mid-step
    return {"charge_id": charge_id}


@agenttx.tool(name="email.receipt")
def receipt(ctx: agenttx.ToolContext, to: str, charge_id: str) -> dict[str, str]:
    return {"key": ctx.stage_effect("email", {"to": to, "charge": charge_id})}


TOOLS: list[agenttx.Tool[..., Any] | agenttx.Compensation[..., Any]] = [refund, charge, receipt]


def first_process() -> None:
    engine = agenttx.Engine(tools=TOOLS, store=SQLiteStore(DATABASE))
    tx = engine.begin(agent_id="checkout-bot")
    tx.execute_step(1, "payments.charge", {"order": "o-1", "amount": 30})
    tx.execute_step(2, "email.receipt", {"to": "ada@x.io", "charge_id": "${steps.1.charge_id}"})
    tx.execute_step(3, "payments.charge", {"order": "o-2", "amount": 12, "crash": True})


def main() -> None:
    child = multiprocessing.get_context("spawn").Process(target=first_process)
    child.start()
    child.join()
    print(f"the first process died (exit status {child.exitcode}); the provider saw:")
    print("  " + "\n  ".join(LEDGER.read_text().splitlines()))

    sent: list[agenttx.StagedEffect] = []
    engine = agenttx.Engine(
        tools=TOOLS, store=SQLiteStore(DATABASE), dispatcher={"email": sent.append}
    )
    report = engine.recover("resume")
    print(
        f"\nrecovery: {report.transactions} transaction resumed, "
        f"{report.compensations_run} compensation run, failures: {list(report.failures)}"
    )
    tx = engine.get(report.resumed[0])
    print(f"resumed at step {tx.next_step_id}; order o-2 in state: {tx.read('orders/o-2')}")
    assert tx.next_step_id == 3
    assert tx.read("orders/o-2") is None

    tx.execute_step(3, "payments.charge", {"order": "o-2", "amount": 12})
    result = tx.commit()
    print(f"committed {result.steps_committed} steps; emails sent: {[e.payload for e in sent]}")
    print("the provider saw, in the end:")
    print("  " + "\n  ".join(LEDGER.read_text().splitlines()))
    assert LEDGER.read_text().splitlines() == [
        "charge ch-o-1 30",
        "charge ch-o-2 12",
        "refund ch-o-2",
        "charge ch-o-2 12",
    ]
    assert [e.payload for e in sent] == [{"to": "ada@x.io", "charge": "ch-o-1"}]


if __name__ == "__main__":
    main()
