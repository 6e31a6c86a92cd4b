"""Plan crash campaign: kill plan runs with SIGKILL at random moments, recover, check the runs.

Run from the repository root::

    python campaigns/plan_crash.py --trials 1000     # the full campaign
    python campaigns/plan_crash.py --trials 3        # a smoke run (tests/test_plan_crash.py)
    python campaigns/plan_crash.py --store postgres  # on PostgresStore (AGENTTX_POSTGRES_DSN)

Each trial starts a worker process that runs random plans (DAGs of 4-9 nodes, some of whose
tools fail transiently once; in a quarter of the runs the last node fails for good) on one
SQLite file (or, with `--store postgres`, one PostgreSQL schema) through `Engine.run_plan`.
Each tool applies an effect in a side table, writes its value to `ctx.state`, stages an effect
for the engine's dispatcher, and declares a compensation.
The worker kills itself with SIGKILL at a moment drawn for the trial: before a round of claims
is written, after it (the dispatch), after buffered results and releases are written, inside a
tool after its effect and before its result is persisted, after a node's state writes and
staged effects are written, inside the delivery of a committed effect, or inside a
compensation; and the campaign kills it after a random delay if it is still alive. The checker
then opens the store, calls `Engine.recover()`, waits for the plan runs it resumed (which
deliver what their runs left in the outbox), and checks:

* every run in the file completed as a crash-free run does: SUCCEEDED, or FAILED at its doomed
  last node, and each node's output equals the crash-free result (the plans are pure functions
  of their inputs, computed here without running anything);
* no node's effect ran twice for one idempotency key: tools apply their effect in a side
  table keyed by the idempotency key, once (a retry with the same key finds it and applies
  nothing), and no node of a run ever has effects under two keys;
* no dependant started before its prerequisites were recorded: each tool reads, when it
  starts, its prerequisites' durable state, which must be SUCCEEDED;
* the run's state is kept across the crash: a SUCCEEDED run committed every node's value
  (those written before the crash included), a FAILED one nothing;
* completed nodes are compensated when the run fails, those completed before the crash
  included: a FAILED run's completed nodes were all undone, a SUCCEEDED run's none;
* retry budgets survive: no node was retried more than its `retries`, and no tool call went
  without an attempt number of its own (calls per key <= the node's recorded attempts);
* effects go out once through the outbox: every node of a SUCCEEDED run had its effect
  delivered, under one idempotency key, none of a FAILED run, and the outbox is empty;
* nothing stays claimed: no node RUNNING, no run RUNNING, no store transaction left open.

With `--store postgres` the worker and the checker share a schema (`--schema`, default a new
one) on the server named by `--dsn` or AGENTTX_POSTGRES_DSN, with leases (and outbox claims) of
`LEASE` seconds: the killed worker's leases must run out before the checker's recovery may take
its runs over, as for a worker on another machine, so the checker waits past them and recovers
again while recovery skips a run (up to `RECOVERY_PATIENCE` seconds). Every check reads the
store through the store's own API (`plan_runs`, `read_plan`, `read_committed`,
`open_transactions`, `pending_effects`), so one code path checks both stores; only the tools'
prerequisite check reads the durable node states directly (SQLite: its own connection to the
file; PostgreSQL: `read_plan` on a second store of the worker's, its own connection). The side
table of effects (`effects.db`, SQLite) stands for the tools' remote systems on both.

The files (and the schema) carry over from trial to trial; a line of progress is printed every
50 trials. The exit status is 1 if any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import agenttx
from agenttx import Engine, EngineConfig
from agenttx._plans import read_run
from agenttx._plans._durable import DurableRun
from agenttx._plans._journal import PlanJournal
from agenttx._saga import Backoff
from agenttx.stores import SQLiteStore

CONFIG = EngineConfig(idle_timeout=None)
NO_WAIT = Backoff(base=0, max_wait=0)
POINTS = (
    "before_claim",
    "after_claim",
    "after_flush",
    "in_tool",
    "after_state",
    "in_delivery",
    "in_compensation",
)
RETRIES = 2
RUNS_PER_WORKER = 3
#: The lease (and outbox claim) of the PostgreSQL stores, seconds: short, so recovery waits little.
LEASE = 0.3
#: How long the PostgreSQL checker goes on recovering runs whose lease has not yet run out.
RECOVERY_PATIENCE = 30.0
PROGRESS_EVERY = 50


class World:
    """The campaign's files, and its store: the SQLite file, or a PostgreSQL schema."""

    def __init__(self, root: Path, *, dsn: str = "", schema: str = "") -> None:
        self.root = root
        self.dsn = dsn  # PostgreSQL, if given, in `schema`
        self.schema = schema
        self.db = str(root / "plans.db")
        self.effects = str(root / "effects.db")
        self.problems = root / "problems.log"
        self.ready = root / "ready"
        root.mkdir(parents=True, exist_ok=True)
        self._reader: Any = None
        self._reader_lock = threading.Lock()

    def store(self) -> Any:
        """A new store on the campaign's file, or its PostgreSQL schema."""
        if self.dsn:
            from agenttx.stores import PostgresStore  # noqa: PLC0415

            return PostgresStore(
                self.dsn, schema=self.schema, lease_seconds=LEASE, outbox_hold=LEASE
            )
        return SQLiteStore(self.db)

    def options(self) -> list[str]:
        """The command-line options that open the same store in a worker."""
        if self.dsn:
            return ["--store", "postgres", "--dsn", self.dsn, "--schema", self.schema]
        return []

    def node_states(self, run: str, nodes: list[str]) -> dict[str, str]:
        """The durable states of nodes `nodes` of run `run`, read on a connection of its own
        (not the worker's store, whose buffers are not durable)."""
        if self.dsn:
            with self._reader_lock:
                if self._reader is None:
                    from agenttx.stores import PostgresStore  # noqa: PLC0415

                    self._reader = PostgresStore(self.dsn, schema=self.schema, migrate=False)
                image = self._reader.read_plan(run)
            return {n.node_id: n.state for n in image.nodes if n.node_id in nodes}
        with contextlib.closing(sqlite3.connect(self.db, timeout=30)) as plans:
            marks = ", ".join("?" * len(nodes))
            rows = plans.execute(
                f"SELECT node_id, state FROM plan_nodes WHERE run_id = ? AND node_id IN ({marks})",  # noqa: S608
                (run, *nodes),
            ).fetchall()
        return dict(rows)


def doomed(run_id: str) -> bool:
    """Whether the run's last node fails for good (a quarter of the runs)."""
    return hashlib.sha256(f"doom:{run_id}".encode()).digest()[0] % 4 == 0


def plan_of(run_id: str) -> tuple[agenttx.Plan, dict[str, list[str]]]:
    """The random plan of a run (a function of its id), and each node's prerequisites."""
    rng = random.Random(run_id)
    size = rng.randint(4, 9)
    doom = doomed(run_id)
    deps: dict[str, list[str]] = {}
    nodes = []
    for i in range(size):
        name = f"n{i}"
        earlier = [f"n{j}" for j in range(i)]
        chosen = sorted(rng.sample(earlier, min(len(earlier), rng.randint(0, 3))))
        deps[name] = chosen
        nodes.append(
            agenttx.Node(
                name,
                tool="work",
                inputs={
                    "node": name,
                    "seed": "${initial.seed}",
                    "deps": list(chosen),
                    "values": [f"${{{d}.value}}" for d in chosen],
                    "doom": doom and i == size - 1,
                    "run": run_id,
                },
                retries=RETRIES,
            )
        )
    return agenttx.Plan(nodes=nodes, initial=["seed"]), deps


def value_of(node: str, seed: int, values: list[int]) -> int:
    """What node `node` outputs: a pure function of its inputs."""
    digest = hashlib.sha256(f"{node}:{seed}:{values}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100_000 + sum(values) % 7


def expected(run_id: str, seed: int) -> dict[str, int | None]:
    """The crash-free outputs of a run (None for its doomed node)."""
    _, deps = plan_of(run_id)
    out: dict[str, int | None] = {}
    last = list(deps)[-1]
    for node, before in deps.items():
        values = [out[d] for d in before]
        failed = doomed(run_id) and node == last
        out[node] = None if failed else value_of(node, seed, values)  # type: ignore[arg-type]
    return out


def _effects(world: World) -> sqlite3.Connection:
    conn = sqlite3.connect(world.effects, timeout=30, isolation_level=None)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL, run TEXT NOT NULL, "
        "node TEXT NOT NULL, value INTEGER NOT NULL)"
    )
    conn.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT NOT NULL)")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS delivered (key TEXT NOT NULL, run TEXT NOT NULL, "
        "node TEXT NOT NULL)"
    )
    conn.execute("CREATE TABLE IF NOT EXISTS undone (run TEXT NOT NULL, node TEXT NOT NULL)")
    return conn


def _problem(world: World, text: str) -> None:
    with world.problems.open("a") as log:
        log.write(text + "\n")
        log.flush()
        os.fsync(log.fileno())


def make_tools(world: World, crash: Any) -> list[Any]:
    """The campaign's tool and its compensation: the tool checks its prerequisites are
    recorded, applies its effect once per idempotency key, fails transiently on the first call
    of some keys, writes its value to the run's state and stages an effect; a doomed node then
    fails for good. The compensation notes what it undid."""

    @agenttx.compensation
    def unwork(payload: Any) -> None:
        arguments = payload["arguments"]
        with contextlib.closing(_effects(world)) as conn:
            conn.execute(
                "INSERT INTO undone (run, node) VALUES (?, ?)",
                (arguments["run"], arguments["node"]),
            )
        crash("in_compensation")

    @agenttx.tool(compensate=unwork)
    def work(  # noqa: PLR0917  (the plan's inputs)
        ctx: agenttx.ToolContext,
        node: str,
        seed: int,
        deps: list[str],
        values: list[int],
        doom: bool,
        run: str,
    ) -> dict[str, int]:
        if deps:
            states = world.node_states(run, deps)
            late = [d for d in deps if states.get(d) != "SUCCEEDED"]
            if late:
                _problem(world, f"{run}/{node} started before {late} were recorded: {states}")
        value = value_of(node, seed, values)
        with contextlib.closing(_effects(world)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO calls (key) VALUES (?)", (ctx.idempotency_key,))
            (calls,) = conn.execute(
                "SELECT count(*) FROM calls WHERE key = ?", (ctx.idempotency_key,)
            ).fetchone()
            flaky = int(hashlib.sha256(ctx.idempotency_key.encode()).hexdigest(), 16) % 4 == 0
            if flaky and calls == 1:
                conn.execute("COMMIT")
                raise ConnectionError("connection reset (the campaign's transient failure)")
            applied = conn.execute(
                "SELECT 1 FROM effects WHERE key = ?", (ctx.idempotency_key,)
            ).fetchall()
            if not applied:
                conn.execute(
                    "INSERT INTO effects (key, run, node, value) VALUES (?, ?, ?, ?)",
                    (ctx.idempotency_key, run, node, value),
                )
            conn.execute("COMMIT")
        crash("in_tool")
        if doom:
            raise ValueError("the campaign's doomed node is refused for good")
        ctx.state.put(f"v/{run}/{node}", str(value))
        ctx.stage_effect("campaign", {"run": run, "node": node, "value": value})
        return {"value": value}

    return [work, unwork]


def make_dispatcher(world: World, crash: Any) -> Any:
    """The engine's dispatcher: notes each delivery (at least once, with its key)."""

    def deliver(effect: agenttx.StagedEffect) -> None:
        crash("in_delivery")
        payload = effect.payload
        assert isinstance(payload, dict)
        with contextlib.closing(_effects(world)) as conn:
            conn.execute(
                "INSERT INTO delivered (key, run, node) VALUES (?, ?, ?)",
                (effect.idempotency_key, payload["run"], payload["node"]),
            )

    return deliver


def work(world: World, seed: int, trial: int) -> None:
    """The worker: run this trial's plans until killed (at a drawn point, or by the campaign)."""
    rng = random.Random(seed)
    point = rng.choice(POINTS)
    countdown = [rng.randint(1, 6)]
    lock = threading.Lock()

    def crash(at: str) -> None:
        if at != point:
            return
        with lock:
            countdown[0] -= 1
            if countdown[0] == 0:
                os.kill(os.getpid(), signal.SIGKILL)

    claim_all, flush, write_state = (
        PlanJournal.claim_all,
        PlanJournal.flush,
        DurableRun.write_state,
    )

    def claim_hook(self: PlanJournal, *args: Any, **kwargs: Any) -> frozenset[str]:
        crash("before_claim")
        refused = claim_all(self, *args, **kwargs)
        crash("after_claim")
        return refused

    def flush_hook(self: PlanJournal, *args: Any, **kwargs: Any) -> bool:
        done = flush(self, *args, **kwargs)
        crash("after_flush")
        return done

    def state_hook(self: DurableRun, *args: Any, **kwargs: Any) -> None:
        write_state(self, *args, **kwargs)
        crash("after_state")

    PlanJournal.claim_all = claim_hook  # type: ignore[method-assign]
    PlanJournal.flush = flush_hook  # type: ignore[method-assign]
    DurableRun.write_state = state_hook  # type: ignore[method-assign]
    store = world.store()
    engine = Engine(
        tools=make_tools(world, crash),
        store=store,
        config=CONFIG,
        dispatcher=make_dispatcher(world, crash),
    )
    world.ready.touch()
    for index in range(RUNS_PER_WORKER):
        run_id = f"t{trial}-{index}"
        plan, _ = plan_of(run_id)
        engine.run_plan(
            plan,
            initial={"seed": trial * 10 + index},
            run_id=run_id,
            max_concurrency=rng.randint(1, 4),
            backoff=NO_WAIT,
        )
    time.sleep(60)  # not killed at its point: the campaign kills it


def recover(world: World, engine: Engine) -> tuple[list[str], list[str]]:
    """`engine.recover()`: the runs it resumed and its failures. On PostgreSQL, where a run is
    taken over only once the killed worker's lease ran out, wait past the lease first, and
    recover again while recovery skips runs (for up to `RECOVERY_PATIENCE` seconds)."""
    if not world.dsn:
        report = engine.recover()
        return list(report.plans_resumed), list(report.failures)
    time.sleep(LEASE * 1.5)  # the killed worker's leases run out
    resumed: list[str] = []
    failures: list[str] = []
    deadline = time.monotonic() + RECOVERY_PATIENCE
    while True:
        report = engine.recover()
        resumed += report.plans_resumed
        failures += report.failures
        if not report.skipped or time.monotonic() > deadline:
            break
        time.sleep(LEASE / 2)
    if report.skipped:
        failures.append(f"still skipped after {RECOVERY_PATIENCE:.0f} s: {report.skipped}")
    return resumed, failures


def check(world: World) -> tuple[list[str], int, int]:
    """Recover, wait for the resumed runs, check; the problems, runs resumed, runs checked."""
    problems: list[str] = []
    with contextlib.closing(_effects(world)) as conn:
        applied = conn.execute("SELECT key, run, node FROM effects").fetchall()
    with world.store() as store:
        engine = Engine(
            tools=make_tools(world, lambda _at: None),
            store=store,
            config=CONFIG,
            dispatcher=make_dispatcher(world, lambda _at: None),
        )
        resumed, failures = recover(world, engine)
        problems += [f"recovery: {line}" for line in failures]
        for run_id in resumed:
            result = engine.get_plan(run_id).wait(120)
            want_status = "FAILED" if doomed(run_id) else "SUCCEEDED"
            if result.status.value != want_status:
                problems.append(f"{run_id}: resumed run ended {result.status.value}")
        runs = store.plan_runs(limit=1_000_000)
        with contextlib.closing(_effects(world)) as conn:
            calls = dict(conn.execute("SELECT key, count(*) FROM calls GROUP BY key").fetchall())
            undone = conn.execute("SELECT DISTINCT run, node FROM undone").fetchall()
            delivered = conn.execute("SELECT DISTINCT run, node, key FROM delivered").fetchall()
        numbers: dict[tuple[str, str], int] = {}
        for run_id, status, _ in runs:
            image = store.read_plan(run_id)
            problems += _check_run(
                store,
                run_id,
                status=status,
                image=image,
                undone=undone,
                delivered=delivered,
                numbers=numbers,
            )
        for key, run, node in applied:
            if calls.get(key, 0) > numbers.get((run, node), 0):
                problems.append(
                    f"{run}/{node}: {calls[key]} tool calls, {numbers.get((run, node))} attempts"
                )
        if store.open_transactions():
            problems.append(f"transactions left open: {store.open_transactions()}")
        if store.pending_effects():
            problems.append(f"effects left in the outbox: {len(store.pending_effects())}")
    with contextlib.closing(_effects(world)) as conn:
        twice = conn.execute(
            "SELECT key, count(*) FROM effects GROUP BY key HAVING count(*) > 1"
        ).fetchall()
        keys = conn.execute(
            "SELECT run, node, count(DISTINCT key) FROM effects GROUP BY run, node "
            "HAVING count(DISTINCT key) > 1"
        ).fetchall()
    problems += [f"effect of key {key} ran {n} times" for key, n in twice]
    problems += [f"{run}/{node}: effects under {n} keys" for run, node, n in keys]
    if world.problems.exists():
        problems += world.problems.read_text().splitlines()
        world.problems.unlink()
    return problems, len(resumed), len(runs)


def _check_run(
    store: Any,
    run_id: str,
    *,
    status: str,
    image: Any,
    undone: list[tuple[str, str]],
    delivered: list[tuple[str, str, str]],
    numbers: dict[tuple[str, str], int],
) -> list[str]:
    """The problems of one run, against its crash-free result; notes each node's attempts."""
    problems: list[str] = []
    want_status = "FAILED" if doomed(run_id) else "SUCCEEDED"
    if status != want_status:
        return [f"{run_id}: {status} after recovery, a crash-free run ends {want_status}"]
    trial, index = run_id[1:].split("-")
    want = expected(run_id, int(trial) * 10 + int(index))
    stored = read_run(image)[1]
    got_values = {
        node_id: node.output.get("value") if isinstance(node.output, dict) else None
        for node_id, node in stored.items()
    }
    if got_values != want:
        problems.append(f"{run_id}: outputs {got_values} != crash-free {want}")
    claimed = [n.node_id for n in image.nodes if n.state == "RUNNING"]
    if claimed:
        problems.append(f"{run_id}: nodes still claimed: {claimed}")
    for node_id, node in stored.items():
        numbers[run_id, node_id] = int(node.record.get("number") or 0)
        if int(node.record.get("retries") or 0) > RETRIES:
            problems.append(f"{run_id}/{node_id}: retried {node.record['retries']} times")
    succeeded = status == "SUCCEEDED"
    committed = {node_id: store.read_committed(f"v/{run_id}/{node_id}") for node_id in stored}
    want_state = {n: json.dumps(str(v)) if succeeded else None for n, v in want.items()}
    if committed != want_state:
        problems.append(f"{run_id}: committed state {committed} != {want_state}")
    completed = {n for n, v in want.items() if v is not None}
    undone_here = {node for run, node in undone if run == run_id}
    if undone_here != (set() if succeeded else completed):
        problems.append(f"{run_id}: {status}, compensated {sorted(undone_here)}")
    sent = [(node, key) for run, node, key in delivered if run == run_id]
    sent_nodes = {node for node, _ in sent}
    if sent_nodes != (completed if succeeded else set()):
        problems.append(f"{run_id}: {status}, effects delivered for {sorted(sent_nodes)}")
    if len(sent) != len(sent_nodes):
        problems.append(f"{run_id}: an effect delivered under two idempotency keys")
    return problems


def campaign(world: World, trials: int, seed: int, max_delay: float) -> int:
    """Run `trials` kill-and-check rounds; print a summary; return the exit status."""
    rng = random.Random(seed)
    started = time.monotonic()
    failed = resumed = 0
    by_point = dict.fromkeys(("timer", *POINTS), 0)
    checked = 0
    for trial in range(1, trials + 1):
        worker_seed = rng.randrange(2**31)
        worker = subprocess.Popen(  # noqa: S603  (our own script)
            [
                sys.executable,
                __file__,
                *("--worker", str(world.root), str(worker_seed), str(trial)),
                *world.options(),
            ]
        )
        deadline = time.monotonic() + 30
        while not world.ready.exists() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            worker.wait(rng.uniform(0.02, 0.02 + max_delay))
        except subprocess.TimeoutExpired:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            by_point["timer"] += 1
        else:
            by_point[random.Random(worker_seed).choice(POINTS)] += 1
        world.ready.unlink(missing_ok=True)
        problems, count, checked = check(world)
        resumed += count
        if worker.returncode != -signal.SIGKILL:
            problems.append(f"the worker exited by itself, status {worker.returncode}")
        if problems:
            failed += 1
            print(f"trial {trial}: " + "; ".join(problems[:5]), flush=True)
        if trial % PROGRESS_EVERY == 0:
            elapsed = time.monotonic() - started
            print(
                f"{trial} trials, {failed} failed, {elapsed:.0f} s: {resumed} resumed", flush=True
            )
    with contextlib.closing(_effects(world)) as conn:
        (effects,) = conn.execute("SELECT count(*) FROM effects").fetchone()
        (calls,) = conn.execute("SELECT count(*) FROM calls").fetchone()
    points = ", ".join(f"{name} {count}" for name, count in by_point.items())
    print(
        f"{trials} trials, {failed} failed, in {time.monotonic() - started:.0f} s: "
        f"{checked} plan runs checked, {resumed} resumed, {effects} effects "
        f"({calls} tool calls); kills: {points}"
    )
    return 1 if failed else 0


def main() -> int:
    """Parse the command line and run the campaign or a worker."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-delay", type=float, default=1.0, help="seconds before the kill")
    parser.add_argument("--root", help="where the files go (default: a temp dir)")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--dsn", default=os.environ.get("AGENTTX_POSTGRES_DSN", ""))
    parser.add_argument("--schema", help="the PostgreSQL schema (default: a new one)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    postgres = args.store == "postgres"
    if postgres and not args.dsn:
        parser.error("--store postgres needs --dsn or AGENTTX_POSTGRES_DSN")
    dsn = args.dsn if postgres else ""
    schema = args.schema or f"plan_crash_{os.getpid()}_{int(time.time())}"
    if args.worker:
        root, worker_seed, trial = args.worker
        work(World(Path(root), dsn=dsn, schema=schema), int(worker_seed), int(trial))
        return 0
    root = Path(args.root or tempfile.mkdtemp(prefix="agenttx-plan-crash-"))
    world = World(root, dsn=dsn, schema=schema)
    return campaign(world, args.trials, args.seed, args.max_delay)


if __name__ == "__main__":
    sys.exit(main())
