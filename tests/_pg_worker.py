"""A worker process for the multi-worker PostgreSQL tests: one engine, its own store and pool.

Run as ``python tests/_pg_worker.py MODE DSN SCHEMA ROOT [ARGS...]``; it reports on stdout, one
line per event, and writes the effects its tools have to `ROOT/effects.log` (appended with
O_APPEND, so lines from several processes never mix). Modes:

- ``rmw SEED COUNT KEYS``: COUNT read-modify-write transactions, each incrementing one of KEYS
  counters, retried on `WriteConflict`; prints ``done COMMITS CONFLICTS``.
- ``hold LEASE``: begins a transaction, charges order `o1` (an undo, an effect), prints
  ``ready TX_ID``, then waits for `ROOT/go` and tries a second step (`note`, which logs its
  call) and a commit; prints ``lost ERROR`` if the store refused, ``committed`` if not.
- ``open COUNT LEASE``: leaves COUNT transactions open, each with one charge, prints ``ready``
  and waits to be killed.
- ``recover``: waits for `ROOT/go`, recovers (abort), prints ``recovered TAKEN RUN SKIPPED``.
- ``dispatch``: waits for `ROOT/go`, delivers the outbox (each effect's key to the log) until
  it is empty; prints ``delivered N``.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import agenttx
from agenttx import Engine, EngineConfig, StorageError, TransactionNotFound, WriteConflict
from agenttx.stores import PostgresStore

CONFIG = EngineConfig(idle_timeout=None, compensation_retries=1)


def log(root: Path, line: str) -> None:
    """Append one line to the effects log, atomically with respect to other processes."""
    fd = os.open(root / "effects.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def tools(root: Path) -> list[object]:
    @agenttx.compensation(name="shop.refund")
    def refund(payload: dict) -> None:
        log(root, f"refund {payload['order']}")

    @agenttx.tool(name="charge")
    def charge(ctx: agenttx.ToolContext, order: str) -> dict:
        ctx.register_undo("shop.refund", {"order": order})
        log(root, f"charge {order}")
        ctx.state.put(f"orders/{order}", {"charged": True})
        ctx.stage_effect("email", {"order": order})
        return {"order": order}

    @agenttx.tool(name="incr")
    def incr(ctx: agenttx.ToolContext, key: str) -> dict:
        value = ctx.state.get(key) or 0
        ctx.state.put(key, value + 1)
        return {"value": value + 1}

    @agenttx.tool(name="note")
    def note(ctx: agenttx.ToolContext, order: str) -> dict:
        log(root, f"note {order}")
        ctx.state.put(f"notes/{order}", "late")
        return {}

    return [refund, charge, incr, note]


def wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.02)


def rmw(engine: Engine, root: Path, args: list[str]) -> None:
    seed, count, keys = int(args[0]), int(args[1]), int(args[2])
    rng = random.Random(seed)
    conflicts = 0
    for _ in range(count):
        key = f"counter/{rng.randrange(keys)}"
        while True:
            tx = engine.begin()
            tx.execute_step(1, "incr", {"key": key})
            try:
                tx.commit()
                break
            except WriteConflict:
                conflicts += 1
    print(f"done {count} {conflicts}", flush=True)


def hold(engine: Engine, root: Path, args: list[str]) -> None:
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "o1"})
    print(f"ready {tx.id}", flush=True)
    wait_for(root / "go")
    try:
        tx.execute_step(2, "note", {"order": "o1"})
        tx.commit()
    except (StorageError, TransactionNotFound) as exc:
        print(f"lost {type(exc).__name__}: {exc}", flush=True)
    else:
        print("committed", flush=True)


def leave_open(engine: Engine, root: Path, args: list[str]) -> None:
    for n in range(int(args[0])):
        tx = engine.begin()
        tx.execute_step(1, "charge", {"order": f"o{n}"})
    print("ready", flush=True)
    time.sleep(600)


def recover(engine: Engine, root: Path, args: list[str]) -> None:
    wait_for(root / "go")
    report = engine.recover()
    print(
        f"recovered {report.transactions} {report.compensations_run} "
        f"{len(report.skipped)} {len(report.failures)}",
        flush=True,
    )


def dispatch(engine: Engine, root: Path, args: list[str]) -> None:
    wait_for(root / "go")
    delivered = 0
    while engine.pending_effects():
        done = engine.dispatch_pending().delivered
        delivered += done
        if not done:
            time.sleep(0.01)  # the rest are claimed by the other dispatchers
    print(f"delivered {delivered}", flush=True)


MODES = {"rmw": rmw, "hold": hold, "open": leave_open, "recover": recover, "dispatch": dispatch}


def main() -> None:
    mode, dsn, schema, root_text, *args = sys.argv[1:]
    root = Path(root_text)
    lease = float(args[-1]) if mode in {"hold", "open"} else 30.0
    store = PostgresStore(dsn, schema=schema, lease_seconds=lease)

    def deliver(effect: agenttx.StagedEffect) -> None:
        log(root, f"deliver {effect.idempotency_key}")

    engine = Engine(tools=tools(root), store=store, config=CONFIG, dispatcher=deliver)
    MODES[mode](engine, root, args)
    engine.close()
    store.close()


if __name__ == "__main__":
    main()
