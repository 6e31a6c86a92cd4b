"""A plan run for the live page test of `agenttx ui` (`tests/test_ui_browser.py`).

`python _ui_plan.py DB ROOT`: start the plan run `live-1` on the SQLite file DB, with two
nodes, `first` then `second` (after it); each node's tool waits until the test makes the file
`ROOT/go-NODE`, so the page sees the states change while it is open. Prints `{"run": ...}`
once the run started, then `{"status": ..., "states": {...}}` when it ended.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import agenttx
from agenttx.stores import SQLiteStore


def main() -> None:
    db, root = sys.argv[1], Path(sys.argv[2])

    @agenttx.tool
    def step(name: str) -> dict:
        """Do one step of the plan, once the test lets it.

        Args:
            name: the node's name
        """
        (root / f"started-{name}").write_text("1")
        while not (root / f"go-{name}").exists():
            time.sleep(0.05)
        return {"done": name}

    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("first", tool="step", inputs={"name": "first"}),
            agenttx.Node("second", tool="step", inputs={"name": "second"}, after=["first"]),
        ],
    )
    engine = agenttx.Engine(tools=[step], store=SQLiteStore(db))
    run = engine.start_plan(plan, initial={}, run_id="live-1")
    print(json.dumps({"run": run.id}), flush=True)
    result = run.wait(300)
    states = {name: node.state.value for name, node in result.nodes.items()}
    print(json.dumps({"status": result.status.value, "states": states}), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
