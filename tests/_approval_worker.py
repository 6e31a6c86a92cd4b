"""A worker process for the SIGKILL test of approvals (`tests/test_approvals.py`).

`python _approval_worker.py PHASE DB ROOT [--no-check]`:

- `ask`: begin a transaction and send the charge, which waits for approval; print
  `{"tx": ..., "request": ...}` and exit with the transaction open;
- `run`: resume the transaction and send the charge again (it was approved meanwhile): the tool
  appends the charge to `ROOT/charges.log`, then sleeps until the parent kills the process;
- `resume`: resume the transaction after the kill, send the charge again and print the result
  (and commit, if it succeeded) as JSON;
- `begin-run` (with `--no-approval`): begin a transaction and send the charge, which needs no
  approval, then hang in it until killed.
- `recover`: recover the store (resume) and print the pending reviews as JSON, sending nothing.

The charge's status check reads `charges.log` by idempotency key; `--no-check` declares the tool
without one (it goes to review).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import agenttx
from agenttx.stores import SQLiteStore

ARGS = {"amount": 500, "card": "4242"}


def main() -> None:
    phase, db, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    with_check = "--no-check" not in sys.argv
    charges = root / "charges.log"

    def status(arguments: dict, key: str) -> agenttx.CheckResult:
        del arguments
        for line in charges.read_text().splitlines() if charges.exists() else ():
            entry = json.loads(line)
            if entry["key"] == key:
                return agenttx.CheckResult.done({"charge_id": entry["charge_id"], "checked": True})
        return agenttx.CheckResult.not_done()

    options = {"check": status} if with_check else {"on_unknown": "review"}
    options["needs_approval"] = "--no-approval" not in sys.argv

    @agenttx.tool(name="charge", **options)
    def charge(ctx: agenttx.ToolContext, amount: int, card: str) -> dict:
        """Charge a card, then (in phase `run`) hang until killed."""
        entry = {"key": ctx.idempotency_key, "charge_id": f"ch_{ctx.idempotency_key[:8]}"}
        with charges.open("a") as log:
            log.write(json.dumps({**entry, "amount": amount, "card": card}) + "\n")
            log.flush()
            os.fsync(log.fileno())
        if phase in ("run", "plan-run", "begin-run"):
            time.sleep(60)  # the parent kills the process here
        return entry

    store = SQLiteStore(db)
    engine = agenttx.Engine(tools=[charge], store=store)
    if phase.startswith("plan-"):
        _plan_phase(phase, engine)
        return
    if phase == "ask":
        tx = engine.begin(agent_id="crash")
        result = tx.call("charge", ARGS)
        print(json.dumps({"tx": tx.id, "request": result.approval.id}), flush=True)
        return  # the transaction stays open in the file
    if phase == "begin-run":  # a call needing no approval, killed while it runs
        engine.begin(agent_id="crash").call("charge", ARGS)
        return
    engine.recover("resume")
    if phase == "recover":
        reviews = [{"id": r.id, "errors": list(r.errors)} for r in engine.pending_reviews()]
        print(json.dumps({"reviews": reviews}), flush=True)
        return
    (tx,) = engine.transactions()
    result = tx.call("charge", ARGS)
    out: dict[str, object] = {"status": result.status.value, "output": result.output}
    if result.review is not None:
        out["review"] = result.review.id
        out["errors"] = list(result.review.errors)
    if result.ok:
        out["committed"] = tx.commit().steps_committed
    print(json.dumps(out), flush=True)
    store.close()


PLAN = agenttx.Plan(
    nodes=[
        agenttx.Node(
            "charge",
            tool="charge",
            inputs={"amount": "${initial.amount}", "card": "${initial.card}"},
        )
    ],
    initial=["amount", "card"],
)


def _plan_phase(phase: str, engine: agenttx.Engine) -> None:
    """`plan-ask`: start a run whose node waits for approval, print the request and vanish;
    `plan-run` and `plan-resume`: recover the run and print how it ended."""
    if phase == "plan-ask":
        run = engine.start_plan(PLAN, initial=ARGS, run_id="run-1")
        while not run.pending_approvals():
            time.sleep(0.01)
        (request,) = run.pending_approvals()
        print(json.dumps({"run": run.id, "request": request.id}), flush=True)
        os._exit(0)  # the run stays RUNNING in the file, as after a crash
    report = engine.recover("resume")
    result = engine.get_plan("run-1").wait(60)
    node = result.nodes["charge"]
    out = {
        "resumed": list(report.plans_resumed),
        "status": result.status.value,
        "state": node.state.value,
        "output": node.output,
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
