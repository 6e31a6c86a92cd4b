"""Plan crash campaign: kill plan runs with SIGKILL at random moments, recover, check the runs.

Run from the repository root::

    python campaigns/plan_crash.py --trials 1000     # the full campaign
    python campaigns/plan_crash.py --trials 3        # a smoke run (tests/test_plan_crash.py)

Each trial starts a worker process that runs random plans (DAGs of 4-9 nodes, some of whose
tools fail transiently once) on one SQLite file through `Engine.run_plan`. The worker kills
itself with SIGKILL at a moment drawn for the trial: before a node's claim is written, after
it (the dispatch), inside a tool after its effect and before its result is persisted, after a
result is persisted, or after dependants are released; and the campaign kills it after a random
delay if it is still alive. The checker then opens the file, calls `Engine.recover()`, waits for
the plan runs it resumed, and checks:

* every run in the file completed, and each node's output equals the crash-free result (the
  plans are pure functions of their inputs, computed here without running anything);
* no node's effect ran twice for one idempotency key: tools apply their effect in a side
  table keyed by the idempotency key, once (a retry with the same key finds it and applies
  nothing), and no node of a run ever has effects under two keys;
* no dependant started before its prerequisites were recorded: each tool reads, when it
  starts, its prerequisites' durable state, which must be SUCCEEDED;
* nothing stays claimed: no node RUNNING, no run RUNNING, no store transaction left open.

The files carry over from trial to trial. The exit status is 1 if any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
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
from agenttx._plans._journal import PlanJournal
from agenttx._saga import Backoff
from agenttx.stores import SQLiteStore

CONFIG = EngineConfig(idle_timeout=None)
NO_WAIT = Backoff(base=0, max_wait=0)
POINTS = ("before_claim", "after_claim", "in_tool", "after_result", "after_release")
RUNS_PER_WORKER = 3


class World:
    """The campaign's files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.db = str(root / "plans.db")
        self.effects = str(root / "effects.db")
        self.problems = root / "problems.log"
        self.ready = root / "ready"


def plan_of(run_id: str) -> tuple[agenttx.Plan, dict[str, list[str]]]:
    """The random plan of a run (a function of its id), and each node's prerequisites."""
    rng = random.Random(run_id)
    size = rng.randint(4, 9)
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
                },
                retries=2,
            )
        )
    return agenttx.Plan(nodes=nodes, initial=["seed"]), deps


def value_of(node: str, seed: int, values: list[int]) -> int:
    """What node `node` outputs: a pure function of its inputs."""
    digest = hashlib.sha256(f"{node}:{seed}:{values}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100_000 + sum(values) % 7


def expected(run_id: str, seed: int) -> dict[str, int]:
    """The crash-free outputs of a run."""
    _, deps = plan_of(run_id)
    out: dict[str, int] = {}
    for node, before in deps.items():
        out[node] = value_of(node, seed, [out[d] for d in before])
    return out


def _effects(world: World) -> sqlite3.Connection:
    conn = sqlite3.connect(world.effects, timeout=30, isolation_level=None)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL, run TEXT NOT NULL, "
        "node TEXT NOT NULL, value INTEGER NOT NULL)"
    )
    conn.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT NOT NULL)")
    return conn


def _problem(world: World, text: str) -> None:
    with world.problems.open("a") as log:
        log.write(text + "\n")
        log.flush()
        os.fsync(log.fileno())


def make_tool(world: World, crash: Any) -> Any:
    """The campaign's one tool: checks its prerequisites are recorded, applies its effect once
    per idempotency key, fails transiently on the first call of some keys."""

    @agenttx.tool
    def work(
        ctx: agenttx.ToolContext, node: str, seed: int, deps: list[str], values: list[int]
    ) -> dict[str, int]:
        run = ctx.tx_id
        if deps:
            with contextlib.closing(sqlite3.connect(world.db, timeout=30)) as plans:
                marks = ", ".join("?" * len(deps))
                rows = plans.execute(
                    f"SELECT node_id, state FROM plan_nodes WHERE run_id = ? AND node_id IN ({marks})",  # noqa: S608, E501
                    (run, *deps),
                ).fetchall()
            states = dict(rows)
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
        return {"value": value}

    return work


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

    claim, end_attempt, transitions = (
        PlanJournal.claim,
        PlanJournal.end_attempt,
        PlanJournal.transitions,
    )

    def claim_hook(self: PlanJournal, *args: Any, **kwargs: Any) -> bool:
        crash("before_claim")
        done = claim(self, *args, **kwargs)
        crash("after_claim")
        return done

    def end_hook(self: PlanJournal, *args: Any, **kwargs: Any) -> bool:
        done = end_attempt(self, *args, **kwargs)
        crash("after_result")
        return done

    def transitions_hook(self: PlanJournal, *args: Any, **kwargs: Any) -> None:
        transitions(self, *args, **kwargs)
        crash("after_release")

    PlanJournal.claim = claim_hook  # type: ignore[method-assign]
    PlanJournal.end_attempt = end_hook  # type: ignore[method-assign]
    PlanJournal.transitions = transitions_hook  # type: ignore[method-assign]
    store = SQLiteStore(world.db)
    engine = Engine(tools=[make_tool(world, crash)], store=store, config=CONFIG)
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


def check(world: World) -> tuple[list[str], int, int]:
    """Recover, wait for the resumed runs, check; the problems, runs resumed, runs checked."""
    problems: list[str] = []
    with SQLiteStore(world.db) as store:
        engine = Engine(tools=[make_tool(world, lambda _at: None)], store=store, config=CONFIG)
        report = engine.recover()
        problems += [f"recovery: {line}" for line in report.failures]
        for run_id in report.plans_resumed:
            result = engine.get_plan(run_id).wait(120)
            if result.status is not agenttx.PlanStatus.SUCCEEDED:
                problems.append(f"{run_id}: resumed run ended {result.status.value}")
        runs = store.plan_runs(limit=1_000_000)
        for run_id, status, _ in runs:
            image = store.read_plan(run_id)
            if status != "SUCCEEDED":
                problems.append(f"{run_id}: {status} after recovery")
                continue
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
        if store.open_transactions():
            problems.append(f"transactions left open: {store.open_transactions()}")
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
    return problems, len(report.plans_resumed), len(runs)


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
            [sys.executable, __file__, "--worker", str(world.root), str(worker_seed), str(trial)]
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
        elif trial % 100 == 0:
            elapsed = time.monotonic() - started
            print(f"{trial} trials, {failed} failed, {elapsed:.0f} s", flush=True)
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
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        root, worker_seed, trial = args.worker
        work(World(Path(root)), int(worker_seed), int(trial))
        return 0
    root = Path(args.root or tempfile.mkdtemp(prefix="agenttx-plan-crash-"))
    return campaign(World(root), args.trials, args.seed, args.max_delay)


if __name__ == "__main__":
    sys.exit(main())
