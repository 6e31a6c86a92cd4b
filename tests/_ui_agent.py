"""An agent process for the tests of `agenttx ui` (`tests/test_ui_browser.py`, `test_ui_crash.py`).

`python _ui_agent.py PHASE TARGET ROOT [TX] [--schema NAME] [--no-check]`, TARGET a SQLite file or a
PostgreSQL DSN (with `--schema`); ROOT a folder shared with the test:

- `wait`: begin a transaction, hand the model's turn (one `charge` call, which needs a person's
  approval) to an OpenAI chat `ToolRunner`, print `{"tx": ..., "request": ...}`, then wait for
  the decision with `runner.wait()` (made by anyone on the store: here, the web app), write
  `ROOT/decided`, and `runner.resume()`: the call runs once (approved, or edited), or the model
  gets the person's reason (rejected). Commits when the call succeeded; prints the outcome.
- `resume`: after a SIGKILL, `engine.recover("resume")` (again until the dead worker's lease
  ran out, on PostgreSQL), `ToolRunner.restore(engine.get(TX))` with the conversation kept in
  the store, wait for what still waits for a person, resume, commit; print the outcome.

The charge appends one line per effect to `ROOT/effects.log` (the effect counter, fsynced).
Gates the test makes as files: `ROOT/hold-decided` holds the agent once the decision is seen,
before the call is sent again; `ROOT/hold-effect` holds the charge after its effect, before it
returns (so before its outcome is recorded). A held agent waits there to be killed.
The charge's status check reads the log by idempotency key; `--no-check` declares the tool
without one (a call cut short goes to review).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import agenttx
from agenttx.integrations.openai import ToolRunner

ARGS = {"amount": 500, "card": "4242"}
#: The lease of a PostgreSQL worker, short so that the restarted agent takes over soon.
LEASE = 2.0


def _hold(gate: Path) -> None:
    """Wait here, forever, if the test made `gate` (it kills the process)."""
    if gate.exists():
        (gate.parent / f"{gate.name}.reached").write_text("1")
        while True:
            time.sleep(1)


def _engine(target: str, schema: str, root: Path, *, check: bool) -> agenttx.Engine:
    effects = root / "effects.log"

    def status(arguments: dict, key: str) -> agenttx.CheckResult:
        del arguments
        for line in effects.read_text().splitlines() if effects.exists() else ():
            entry = json.loads(line)
            if entry["key"] == key:
                return agenttx.CheckResult.done({"charge_id": entry["charge_id"], "checked": True})
        return agenttx.CheckResult.not_done()

    options: dict[str, Any] = {"check": status} if check else {"on_unknown": "review"}

    @agenttx.tool(name="charge", needs_approval=True, **options)
    def charge(ctx: agenttx.ToolContext, amount: int, card: str) -> dict:
        """Charge a card.

        Args:
            amount: the amount in pence
            card: the card's token
        """
        entry = {"key": ctx.idempotency_key, "charge_id": f"ch_{ctx.idempotency_key[:8]}"}
        with effects.open("a") as log:
            log.write(json.dumps({**entry, "amount": amount, "card": card}) + "\n")
            log.flush()
            os.fsync(log.fileno())
        _hold(root / "hold-effect")
        return {**entry, "amount": amount}

    if target.startswith(("postgresql://", "postgres://")):
        from agenttx.stores import PostgresStore  # noqa: PLC0415

        store: Any = PostgresStore(target, schema=schema, lease_seconds=LEASE)
    else:
        from agenttx.stores import SQLiteStore  # noqa: PLC0415

        store = SQLiteStore(target)
    config = agenttx.EngineConfig(idle_timeout=None)
    return agenttx.Engine(tools=[charge], store=store, config=config)


def _finish(
    engine: agenttx.Engine, tx: agenttx.Transaction, runner: ToolRunner, root: Path
) -> None:
    """Wait for the decision, send the call again, commit if it ran; print the outcome."""
    decided = runner.wait(timeout=300)
    (root / "decided").write_text("1")
    _hold(root / "hold-decided")
    messages = runner.resume()
    while runner.waiting:  # sent again, the call went to review: a person resolves it
        (root / "waiting.json").write_text(json.dumps([w.id for w in runner.waiting]))
        runner.wait(timeout=300)
        messages = runner.resume()
    answer = json.loads(messages[-1]["content"])
    out: dict[str, Any] = {"tx": tx.id, "decided": decided, "answer": answer}
    if answer.get("ok"):
        out["committed"] = tx.commit().steps_committed
    else:
        tx.rollback()
    out["status"] = tx.status.name
    print(json.dumps(out), flush=True)
    engine.close()


def main() -> None:
    phase, target, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    schema = sys.argv[sys.argv.index("--schema") + 1] if "--schema" in sys.argv else "agenttx"
    engine = _engine(target, schema, root, check="--no-check" not in sys.argv)
    if phase == "wait":
        tx = engine.begin(agent_id="ui-agent")
        runner = ToolRunner(tx)
        call = {"id": "call_1", "type": "function"}
        call["function"] = {"name": "charge", "arguments": json.dumps(ARGS)}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        runner.handle([{"role": "user", "content": "Charge 5 GBP to card 4242."}], message)
        (request,) = runner.waiting
        print(json.dumps({"tx": tx.id, "request": request.id}), flush=True)
        _finish(engine, tx, runner, root)
        return
    tx_id = sys.argv[4]
    for _ in range(600):  # on PostgreSQL, until the dead worker's lease ran out
        report = engine.recover("resume")
        if tx_id in report.resumed:
            break
        time.sleep(0.2)
    else:
        raise SystemExit(f"{tx_id} was never recovered: {report}")
    tx = engine.get(tx_id)
    _finish(engine, tx, ToolRunner.restore(tx), root)


if __name__ == "__main__":
    main()
