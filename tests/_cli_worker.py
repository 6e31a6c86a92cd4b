"""A process that owns a plan run, for the command line's ORPHANED tests.

Run as ``python tests/_cli_worker.py TARGET SCHEMA LEASE``: TARGET a SQLite file or a PostgreSQL
DSN (SCHEMA its schema, LEASE its lease in seconds). It starts plan run `held` of two nodes
(`block`, whose tool never returns, and `next` after it), prints ``ready`` once `block` runs,
and waits to be killed.
"""

from __future__ import annotations

import sys
import threading

import agenttx
from agenttx import Engine, EngineConfig


def main(target: str, schema: str, lease: float) -> None:
    started = threading.Event()

    @agenttx.tool(name="block")
    def block() -> dict[str, int]:
        started.set()
        threading.Event().wait()
        return {}

    @agenttx.tool(name="step")
    def step() -> dict[str, int]:
        return {}

    if target.startswith("postgresql://"):
        from agenttx.stores import PostgresStore  # noqa: PLC0415

        store: object = PostgresStore(target, schema=schema, lease_seconds=lease)
    else:
        from agenttx.stores import SQLiteStore  # noqa: PLC0415

        store = SQLiteStore(target)
    engine = Engine(tools=[block, step], store=store, config=EngineConfig(idle_timeout=None))  # type: ignore[arg-type]
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("block", tool="block"),
            agenttx.Node("next", tool="step", after=("block",)),
        ]
    )
    engine.start_plan(plan, initial={}, run_id="held")
    started.wait()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
