"""A worker process that dies inside a plan run that needs a person (`tests/test_plan_people.py`).

`python _plan_people_worker.py PHASE DB ROOT`, on plan run `r` of one node `charge`:

- `ask`: start the run; once its approval request is pending, print `{"request": ...}` and die;
- `charge`: start the run, approve its request from this process; the tool appends its
  idempotency key to `ROOT/charges.log`, then the process dies (the outcome is unknown);
- `review`: start the run; the node's call (timeout 0.2 s) hangs, its review opens; print
  `{"review": ...}` and die;
- `review-then`: as `review`, with a `compensate="refund"` on the tool and a second node,
  `then`, that depends on `charge`.

The process dies by SIGKILL (no cleanup, no clean close of the store); the test resumes the run
in its own process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import agenttx
from agenttx.stores import SQLiteStore

INITIAL = {"customer": "c-1", "amount": 4200}


def plan(timeout: float | None = None, *, then: bool = False) -> agenttx.Plan:
    """One node, `charge`, retried at most twice (and `then`, on its output, if asked)."""
    inputs = {"customer_id": "${initial.customer}", "amount": "${initial.amount}"}
    node = agenttx.Node("charge", tool="charge", inputs=inputs, timeout=timeout, retries=2)
    nodes = [node]
    if then:
        nodes.append(agenttx.Node("then", tool="then", inputs={"charge_id": "${charge.charge_id}"}))
    return agenttx.Plan(nodes=nodes, initial=["customer", "amount"])


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit("timed out")
        time.sleep(0.01)


def main() -> None:
    phase, db, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    reviewed = phase.startswith("review")

    @agenttx.compensation(name="refund")
    def refund(payload: dict) -> None:
        del payload

    @agenttx.tool(
        name="charge",
        needs_approval=not reviewed,
        on_unknown="review",
        compensate=refund if phase == "review-then" else None,
    )
    def charge(ctx: agenttx.ToolContext, customer_id: str, amount: int) -> dict:
        with (root / "charges.log").open("a") as log:
            log.write(ctx.idempotency_key + "\n")
        if phase == "charge":
            _die()
        time.sleep(60)
        return {"charge_id": "never"}

    @agenttx.tool(name="then")
    def then(charge_id: str) -> dict:
        return {"charge_id": charge_id}

    store = SQLiteStore(db)
    engine = agenttx.Engine(tools=[charge, refund, then], store=store)
    shape = plan(0.2 if reviewed else None, then=phase == "review-then")
    run = engine.start_plan(shape, initial=INITIAL, run_id="r")
    if reviewed:
        _until(lambda: bool(run.pending_reviews()))
        print(json.dumps({"review": run.pending_reviews()[0].id}))
        _die()
    _until(lambda: bool(run.pending_approvals()))
    (request,) = run.pending_approvals()
    if phase == "ask":
        print(json.dumps({"request": request.id}))
        _die()
    run.approve(request.id, actor="alice")
    time.sleep(60)  # the tool kills the process


if __name__ == "__main__":
    main()
