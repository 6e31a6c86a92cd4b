"""Crash campaign: kill a worker with SIGKILL at random moments, recover, check nothing was lost.

Run from the repository root::

    python campaigns/crash.py --trials 1000        # the full campaign (about 25 minutes)
    python campaigns/crash.py --trials 1000 --mode resume   # recovery resumes, then finishes
    python campaigns/crash.py --trials 5           # a smoke run (tests/test_crash.py does this)
    python campaigns/crash.py --contend            # 4 processes x 250 transactions, one file
    python campaigns/crash.py --exclusive          # the campaign on SQLiteStore(exclusive=True)
    python campaigns/crash.py --store postgres     # on PostgresStore (AGENTTX_POSTGRES_DSN)

With `--store postgres` the workers share a new schema on the server named by
AGENTTX_POSTGRES_DSN (or `--dsn`), with a lease of `LEASE` seconds: a killed worker's leases run
out before the checker recovers, as they would for a worker on another machine.

Each trial starts a worker process that runs random transactions on one SQLite file: `kv.put`
writes, `fs.write` files, staged effects, charges undone by a compensation, failing steps
(rewinds), manual rewinds, commits and aborts. After a random delay it is killed with SIGKILL.
The checker then recovers the file and delivers the outbox. With `--mode abort` (the default)
recovery aborts what the worker left open. With `--mode resume` it resumes it, and the checker
finishes each resumed transaction as an agent would: it charges again at the step it resumed at,
with the arguments the worker used for a charge at that step, writes the marker of the live
steps, then commits (or, one time in five, aborts). Then it checks:

* the committed state equals the serial application, in commit order, of the transactions that
  committed (each one's last step writes a marker listing its live writes, so the marker is
  committed exactly when its writes are): no partial commit is visible and nothing is lost;
* no transaction is left open;
* charges are told apart by their attempt's idempotency key: every charge of a transaction
  that did not commit was refunded at least once, and no charge of a committed transaction
  was; the committed state holds a charge's write exactly when the charge was committed, so a
  refunded charge never is;
* no two charges that happened got the same idempotency key: an attempt after a rewind, or
  after a resume, never reuses the key of one whose effect may have happened;
* every effect of a committed transaction was delivered at least once, with its original
  idempotency key, and none of a transaction that did not commit.

The file, the sandbox and the logs carry over from trial to trial, so later trials recover and
check on top of everything before them. The exit status is 1 if any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import agenttx
from agenttx import Engine, EngineConfig, TxStatus, builtins
from agenttx.stores import SQLiteStore

KEYS = [f"k{i}" for i in range(6)]
FILES = [f"f{i}.txt" for i in range(3)]
CONFIG = EngineConfig(idle_timeout=None, compensation_retries=1)
#: The lease of the PostgreSQL workers (seconds): short, so that recovery need not wait long.
LEASE = 0.3


def _append(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and fsync it: what is in the log happened."""
    with path.open("a") as log:
        log.write(json.dumps(record, sort_keys=True) + "\n")
        log.flush()
        os.fsync(log.fileno())


def _read(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a log; a line cut short by a kill is ignored."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


class World:
    """The file, the sandbox and the logs of one campaign."""

    def __init__(
        self, root: Path, *, exclusive: bool = False, dsn: str = "", schema: str = ""
    ) -> None:
        self.root = root
        self.exclusive = exclusive
        self.dsn = dsn  # PostgreSQL, if given, in `schema`
        self.schema = schema
        self.db = root / "agenttx.db"
        self.sandbox = root / "sandbox"
        self.sandbox.mkdir(parents=True, exist_ok=True)
        self.charges = root / "charges.log"
        self.refunds = root / "refunds.log"
        self.delivered = root / "delivered.log"
        self.problems = root / "problems.log"  # what a worker found wrong before it was killed
        self.ready = root / "ready"  # a worker has started

    def tools(self) -> list[Any]:
        @agenttx.compensation(name="audit.refund")
        def refund(payload: Any) -> None:
            _append(self.refunds, {"charge": payload["charge"], "key": payload["key"]})

        @agenttx.tool(name="audit.charge")
        def charge(ctx: agenttx.ToolContext, charge: str) -> dict[str, Any]:
            key = ctx.idempotency_key  # what a payment provider would deduplicate on
            ctx.register_undo("audit.refund", {"charge": charge, "key": key})  # before the effect
            _append(self.charges, {"charge": charge, "key": key})
            ctx.state.put(f"charges/{key}", charge)  # committed exactly when the charge is
            return {"charge": charge, "key": key}

        return [*builtins.tools(str(self.sandbox)), refund, charge]

    def deliver(self, effect: agenttx.StagedEffect) -> None:
        _append(self.delivered, {"key": effect.idempotency_key, "payload": effect.payload})

    def store(self) -> Any:
        """A new store on the campaign's file, or its PostgreSQL schema."""
        if self.dsn:
            from agenttx.stores import PostgresStore  # noqa: PLC0415

            return PostgresStore(
                self.dsn, schema=self.schema, lease_seconds=LEASE, outbox_hold=LEASE
            )
        return SQLiteStore(self.db, exclusive=self.exclusive)

    def options(self) -> list[str]:
        """The command-line options that open the same store in a worker."""
        if self.dsn:
            return ["--store", "postgres", "--dsn", self.dsn, "--schema", self.schema]
        return ["--exclusive"] if self.exclusive else []

    def committed(self) -> list[tuple[str, int, str]]:
        """Every committed `(key, version, value)`, read by a connection of its own."""
        if self.dsn:
            with self.store() as store:
                return list(store.committed_keys("", 10**9))
        with contextlib.closing(sqlite3.connect(self.db)) as conn:  # closed now, not at GC
            return conn.execute("SELECT key, version, value FROM committed").fetchall()

    def engine(self) -> Engine:
        return Engine(
            tools=self.tools(),
            store=self.store(),
            config=CONFIG,
            dispatcher={"hook": self.deliver},
        )


# ---------------------------------------------------------------------- the worker


def work(world: World, seed: int) -> None:
    """Run random transactions until killed (or orphaned)."""
    rng = random.Random(seed)
    engine = world.engine()
    world.ready.touch()  # the kill is timed from here: start-up is not worth killing
    campaign = os.getppid()
    serial = 0
    while os.getppid() == campaign:  # a campaign that died leaves no worker running for ever
        serial += 1
        run_one(engine, rng, f"{seed}-{serial}", world.problems)


def run_one(engine: Engine, rng: random.Random, name: str, problems: Path) -> None:
    """One random transaction; its last live step writes the marker of what it did."""
    tx = engine.begin(agent_id=name)
    live: list[tuple[int, str, Any]] = []  # (step, kind, what) of the live steps
    for n in range(rng.randint(2, 7)):
        step = tx.next_step_id
        op = rng.choice(("put", "put", "file", "effect", "charge", "fail"))
        tag = f"{tx.id}:{step}:{n}"
        if op == "put":
            key = rng.choice(KEYS)
            result = tx.execute_step(step, "kv.put", {"key": key, "value": tag})
            what: Any = [key, tag]
        elif op == "file":
            path = rng.choice(FILES)
            result = tx.execute_step(step, "fs.write", {"path": path, "contents": tag})
            what = [path, tag]
        elif op == "effect":
            result = tx.execute_step(
                step, "effect.stage", {"channel": "hook", "payload": {"tag": tag}}
            )
            what = result.output["idempotency_key"] if result.ok else None
        elif op == "charge":  # the same arguments at the same step: only the key tells them apart
            result = tx.execute_step(step, "audit.charge", {"charge": f"{tx.id}:{step}"})
            what = result.output["key"] if result.ok else None
        else:
            result = tx.execute_step(step, "record.get", {"table": "missing", "id": tag})
            what = None
        if result.ok:
            live.append((step, op, what))
        live = [entry for entry in live if entry[0] < tx.next_step_id]  # after any rewind
        if tx.status is not TxStatus.ACTIVE:
            return  # aborted by the controller
        if live and rng.random() < 0.1:
            target = rng.randint(1, tx.next_step_id - 1)
            tx.rollback(to_step=target)
            live = [entry for entry in live if entry[0] < target]
    marker = {
        "kv": [what for _, op, what in live if op == "put"],
        "files": [what for _, op, what in live if op == "file"],
        "effects": [what for _, op, what in live if op == "effect"],
        "charges": [what for _, op, what in live if op == "charge"],
    }
    if marker != marker_of(tx):  # the checker rebuilds markers so: the steps must agree
        _append(problems, {"tx": tx.id, "marker": marker, "steps": marker_of(tx)})
    tx.execute_step(tx.next_step_id, "kv.put", {"key": f"marker/{tx.id}", "value": marker})
    if rng.random() < 0.85:
        tx.commit()
    else:
        tx.rollback()


def marker_of(tx: agenttx.Transaction) -> dict[str, list[Any]]:
    """The marker of `tx`'s live steps, from the steps themselves (a marker step excepted)."""
    marker: dict[str, list[Any]] = {"kv": [], "files": [], "effects": [], "charges": []}
    for step in tx.steps:
        arguments: Any = step.arguments
        output: Any = step.output
        if step.tool_name == "kv.put" and not arguments["key"].startswith("marker/"):
            marker["kv"].append([arguments["key"], arguments["value"]])
        elif step.tool_name == "fs.write":
            marker["files"].append([arguments["path"], arguments["contents"]])
        elif step.tool_name == "effect.stage":
            marker["effects"].append(output["idempotency_key"])
        elif step.tool_name == "audit.charge":
            marker["charges"].append(output["key"])
    return marker


def finish(tx: agenttx.Transaction, rng: random.Random) -> None:
    """Finish a resumed transaction as its agent would: charge again at the step it resumed at
    (the arguments a charge there always has), write the marker, then commit or abort."""
    step = tx.next_step_id
    result = tx.execute_step(step, "audit.charge", {"charge": f"{tx.id}:{step}"})
    assert result.ok, result
    marker = marker_of(tx)
    tx.execute_step(tx.next_step_id, "kv.put", {"key": f"marker/{tx.id}", "value": marker})
    if rng.random() < 0.8:
        with contextlib.suppress(agenttx.WriteConflict):  # aborted: its charges are refunded
            tx.commit()
    else:
        tx.rollback()


# ---------------------------------------------------------------------- the checker


def check(world: World, mode: str, rng: random.Random) -> tuple[list[str], int]:
    """Recover, finish what was resumed, deliver, and check every property; return the
    problems found and the number of transactions resumed."""
    if world.dsn:
        time.sleep(LEASE * 1.5)  # the killed worker's leases run out
    engine = world.engine()
    problems: list[str] = []
    report = engine.recover(mode)  # type: ignore[arg-type]
    if report.failures:
        problems.append(f"recovery failures: {report.failures}")
    store: Any = engine.store
    for tx_id in report.resumed:
        tx = engine.get(tx_id)
        if tx.status is TxStatus.ACTIVE:
            try:
                finish(tx, rng)
            except Exception as exc:  # noqa: BLE001  (a problem to report, with the others)
                problems.append(f"finishing resumed {tx_id}: {type(exc).__name__}: {exc}")
    if store.open_transactions():
        problems.append(f"open after recovery: {store.open_transactions()}")
    while engine.pending_effects():
        engine.dispatch_pending()
    store.close()  # first: an exclusive store would lock the next connection out
    problems.extend(verify(world))
    problems.extend(f"worker: {record}" for record in _read(world.problems))
    world.problems.unlink(missing_ok=True)
    return problems, len(report.resumed)


def verify(world: World) -> list[str]:
    """Check the committed state, the files and the logs against each other."""
    problems: list[str] = []
    committed = {key: (version, json.loads(value)) for key, version, value in world.committed()}
    markers = sorted(
        (version, value)
        for key, (version, value) in committed.items()
        if key.startswith("kv/marker/")
    )
    expected_kv: dict[str, str] = {}
    expected_files: dict[str, str] = {}
    effects: set[str] = set()
    charges: set[str] = set()
    for _, marker in markers:
        expected_kv.update(dict(marker["kv"]))
        expected_files.update(dict(marker["files"]))
        effects.update(marker["effects"])
        charges.update(marker["charges"])
    actual_kv = {
        k[3:]: v
        for k, (_, v) in committed.items()
        if k.startswith("kv/k")  # not the markers
    }
    problems.extend(
        f"kv {key}: {actual_kv.get(key)!r} != serially {expected_kv.get(key)!r}"
        for key in sorted(set(actual_kv) | set(expected_kv))
        if actual_kv.get(key) != expected_kv.get(key)
    )
    for path in FILES:
        file = world.sandbox / path
        actual = file.read_text() if file.exists() else None
        if actual != expected_files.get(path):
            problems.append(f"file {path}: {actual!r} != {expected_files.get(path)!r}")
    delivered = {record["key"] for record in _read(world.delivered)}
    if missing := effects - delivered:
        problems.append(f"committed effects never delivered: {sorted(missing)[:5]}")
    if stray := delivered - effects:
        problems.append(f"effects delivered for uncommitted transactions: {sorted(stray)[:5]}")
    attempts = [record["key"] for record in _read(world.charges)]
    charged = set(attempts)
    refunded = {record["key"] for record in _read(world.refunds)}
    if wrongly := charges & refunded:
        problems.append(f"committed charges refunded: {sorted(wrongly)[:5]}")
    if unrefunded := charged - charges - refunded:
        problems.append(
            f"charges of uncommitted transactions not refunded: {sorted(unrefunded)[:5]}"
        )
    if len(charged) != len(attempts):
        reused = sorted({key for key in attempts if attempts.count(key) > 1})
        problems.append(f"idempotency keys of charges that happened reused: {reused[:5]}")
    in_state = {key.removeprefix("charges/") for key in committed if key.startswith("charges/")}
    if in_state != charges:
        problems.append(
            f"committed charge writes {sorted(in_state - charges)[:5]} without their charge, "
            f"charges {sorted(charges - in_state)[:5]} without their write"
        )
    return problems


def campaign(world: World, trials: int, seed: int, max_delay: float, mode: str) -> int:
    """Run `trials` kill-and-check rounds; print a summary; return the exit status."""
    rng = random.Random(seed)
    started = time.monotonic()
    failed = resumed = 0
    for trial in range(1, trials + 1):
        worker = subprocess.Popen(  # noqa: S603  (our own script)
            [
                sys.executable,
                __file__,
                "--worker",
                str(world.root),
                str(rng.randrange(2**31)),
                *world.options(),
            ],
        )
        delay = rng.uniform(0.05, 0.05 + max_delay)
        deadline = time.monotonic() + 30
        while not world.ready.exists() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the worker's start-up
        time.sleep(delay)
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        world.ready.unlink(missing_ok=True)
        problems, count = check(world, mode, random.Random(rng.randrange(2**31)))
        resumed += count
        if worker.returncode != -signal.SIGKILL:  # it raised: its traceback is on stderr
            problems.append(f"the worker exited by itself, status {worker.returncode}")
        if problems:
            failed += 1
            print(f"trial {trial}: " + "; ".join(problems), flush=True)
        elif trial % 100 == 0:
            elapsed = time.monotonic() - started
            print(f"{trial} trials, {failed} failed, {elapsed:.0f} s", flush=True)
    markers = sum(1 for row in world.committed() if row[0].startswith("kv/marker/"))
    print(
        f"{trials} trials, {failed} failed, in {time.monotonic() - started:.0f} s: "
        f"{markers} transactions committed, {len(_read(world.charges))} charges "
        f"({len(_read(world.refunds))} refunds), {len(_read(world.delivered))} deliveries; "
        f"{mode} mode, {resumed} transactions resumed"
    )
    return 1 if failed else 0


# ---------------------------------------------------------------------- contention


def contend_worker(db: str, transactions: int, out: str) -> None:
    """Increment random shared counters; count successes and conflicts into `out`."""
    engine = Engine(tools=builtins.tools(tempfile.mkdtemp()), store=SQLiteStore(db), config=CONFIG)
    rng = random.Random(os.getpid())
    done = conflicts = 0
    for _ in range(transactions):
        while True:
            tx = engine.begin(isolation="serializable")  # a read-modify-write: reads validated
            for step, key in enumerate(rng.sample(KEYS[:3], 2), start=1):
                value = tx.read(f"kv/{key}") or 0
                tx.execute_step(step, "kv.put", {"key": key, "value": value + 1})
            try:
                tx.commit()
            except agenttx.WriteConflict:  # ReadConflict included
                conflicts += 1
                continue
            done += 1
            break
    Path(out).write_text(json.dumps({"done": done, "conflicts": conflicts}))


def contend(root: Path, processes: int, transactions: int) -> int:
    """`processes` workers x `transactions` on one file: no update may be lost."""
    db = str(root / "contend.db")
    SQLiteStore(db).close()
    outs = [str(root / f"contend-{i}.json") for i in range(processes)]
    workers = [
        subprocess.Popen(  # noqa: S603
            [sys.executable, __file__, "--contend-worker", db, str(transactions), out]
        )
        for out in outs
    ]
    for worker in workers:
        worker.wait()
    results = [json.loads(Path(out).read_text()) for out in outs]
    store = SQLiteStore(db)
    total = sum(json.loads(store.read_committed(f"kv/{key}") or "0") for key in KEYS[:3])
    store.close()
    done = sum(r["done"] for r in results)
    conflicts = sum(r["conflicts"] for r in results)
    print(
        f"{processes} processes x {transactions} transactions: {done} committed, "
        f"{conflicts} WriteConflicts retried; counters sum to {total} (expected {2 * done})"
    )
    return 0 if total == 2 * done == 2 * processes * transactions else 1


def main() -> int:
    """Parse the command line and run the campaign, a worker or the contention run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--max-delay", type=float, default=0.6, help="seconds from the worker's start to its kill"
    )
    parser.add_argument("--root", help="where the file and logs go (default: a temp dir)")
    parser.add_argument("--contend", action="store_true", help="the multi-process run")
    parser.add_argument(
        "--exclusive", action="store_true", help="open the store with exclusive=True"
    )
    parser.add_argument(
        "--mode",
        choices=("abort", "resume"),
        default="abort",
        help="how the checker recovers what a killed worker left open",
    )
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--dsn", default=os.environ.get("AGENTTX_POSTGRES_DSN", ""))
    parser.add_argument("--schema", help="the PostgreSQL schema (default: a new one)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--transactions", type=int, default=250)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--contend-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    postgres = args.store == "postgres"
    if postgres and not args.dsn:
        parser.error("--store postgres needs --dsn or AGENTTX_POSTGRES_DSN")
    dsn = args.dsn if postgres else ""
    schema = args.schema or f"crash_{os.getpid()}_{int(time.time())}"
    if args.worker:
        world = World(Path(args.worker[0]), exclusive=args.exclusive, dsn=dsn, schema=schema)
        work(world, int(args.worker[1]))
        return 0
    if args.contend_worker:
        db, transactions, out = args.contend_worker
        contend_worker(db, int(transactions), out)
        return 0
    root = Path(args.root or tempfile.mkdtemp(prefix="agenttx-crash-"))
    if args.contend:
        return contend(root, args.processes, args.transactions)
    world = World(root, exclusive=args.exclusive, dsn=dsn, schema=schema)
    return campaign(world, args.trials, args.seed, args.max_delay, args.mode)


if __name__ == "__main__":
    sys.exit(main())
