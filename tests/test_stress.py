"""Threads running random transactions on shared keys; a checker replays the recorded history.

Each worker begins transactions on one engine, runs read-modify-write steps on a few shared
keys, and sometimes rewinds, aborts or commits. A lock around every write and every commit
stamps them with one global sequence, so the checker knows, for each commit attempt, whether
another transaction committed one of its keys after its base (its first write under read
committed, its first read otherwise: a write conflict) or, in serializable mode, a key after it
read it (a read conflict). It verifies that:

* a commit was refused exactly when the checker sees a conflict;
* the committed state is the last committed write of every key (no committed write is lost);
* above read committed, every value a committed transaction read (and, as every step does,
  wrote back changed) is the value a serial run in commit order would have read: no update
  is lost, and in serializable mode the history is equivalent to the commit order.

The default run is short; `AGENTTX_SLOW=1` runs the long one.
"""

from __future__ import annotations

import contextvars
import itertools
import random
import threading
import time
from dataclasses import dataclass, field

import pytest

import agenttx
from agenttx import Engine, EngineConfig, TxStatus

KEYS = [f"k{i}" for i in range(4)]


@dataclass
class Step:
    key: str
    read: int
    read_own: bool  # the value came from this transaction's own earlier write
    read_seq: int  # sequence of the read, for the serializable check
    wrote: int
    write_seq: int


@dataclass
class Attempt:
    steps: list[Step] = field(default_factory=list)  # the live steps
    # Every read from committed state, rewound steps' too: the store keeps them in the read set.
    reads: list[tuple[str, int]] = field(default_factory=list)
    committed: bool = False
    commit_seq: int = 0


class History:
    """The global sequence and what every transaction did, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clock = itertools.count(1)
        self.attempts: list[Attempt] = []


def make_tool(history: History, current: contextvars.ContextVar[Attempt]):
    @agenttx.tool  # on a worker thread: the context variable travels with the call
    def rmw(ctx: agenttx.ToolContext, key: str, by: int) -> dict:
        attempt = current.get()
        with history.lock:  # the read, the write and their stamps happen at one point
            own = any(step.key == key for step in attempt.steps)
            read_seq = next(history.clock)
            value = ctx.state.get(key, 0)
            assert isinstance(value, int)
            ctx.state.put(key, value + by)
            write_seq = next(history.clock)
        if not own:
            attempt.reads.append((key, read_seq))
        attempt.steps.append(Step(key, value, own, read_seq, value + by, write_seq))
        return {"key": key, "value": value + by}

    return rmw


def run_workers(isolation: str, workers: int, transactions: int, seed: int) -> tuple:
    history = History()
    current: contextvars.ContextVar[Attempt] = contextvars.ContextVar("attempt")
    rmw = make_tool(history, current)
    engine = Engine(tools=[rmw], config=EngineConfig(isolation=isolation, idle_timeout=None))

    def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        for _ in range(transactions):
            tx = engine.begin(agent_id=f"w{index}")
            attempt = Attempt()
            current.set(attempt)
            for _ in range(rng.randint(1, 4)):
                tx.execute_step(
                    tx.next_step_id, "rmw", {"key": rng.choice(KEYS), "by": rng.randint(1, 9)}
                )
                time.sleep(0)  # let other workers in between steps: that is where conflicts are
                if rng.random() < 0.15 and tx.next_step_id > 1:  # a manual rewind
                    target = rng.randint(1, tx.next_step_id - 1)
                    tx.rollback(to_step=target)
                    del attempt.steps[target - 1 :]
            if rng.random() < 0.1:
                tx.rollback()
                continue
            with history.lock:
                try:
                    tx.commit()
                    attempt.committed = True
                except agenttx.WriteConflict:
                    assert tx.status is TxStatus.FAILED
                attempt.commit_seq = next(history.clock)
                history.attempts.append(attempt)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return engine, history


def check(engine: Engine, history: History, *, isolation: str) -> tuple[int, int]:
    """Verify the history; return (commits, refusals)."""
    serializable = isolation == "serializable"
    attempts = sorted(history.attempts, key=lambda a: a.commit_seq)
    committed_writes: dict[str, list[tuple[int, int]]] = {k: [] for k in KEYS}  # seq, value
    state: dict[str, int] = {}
    refusals = 0
    for attempt in attempts:
        first_write: dict[str, int] = {}
        for step in attempt.steps:
            first_write.setdefault(step.key, step.write_seq)
        first_read: dict[str, int] = {}
        for key, seq in attempt.reads:
            first_read.setdefault(key, seq)

        def changed_since(key: str, since: int, attempt: Attempt = attempt) -> bool:
            return any(since < seq < attempt.commit_seq for seq, _ in committed_writes[key])

        if isolation == "read_committed":  # the base is fixed at the first write
            conflict = any(changed_since(k, s) for k, s in first_write.items())
        else:  # at the first read (every step reads first), kept across rewinds
            conflict = any(changed_since(k, first_read.get(k, s)) for k, s in first_write.items())
        if serializable:
            conflict = conflict or any(changed_since(k, s) for k, s in first_read.items())
        assert attempt.committed == (not conflict), (attempt, conflict)
        if not attempt.committed:
            refusals += 1
            continue
        if isolation != "read_committed":  # no lost update: each value read from committed
            for step in attempt.steps:  # state and written equals the state at the commit
                if not step.read_own:
                    assert step.read == state.get(step.key, 0), step
        last: dict[str, int] = {}
        for step in attempt.steps:
            last[step.key] = step.wrote
        for key, value in last.items():
            committed_writes[key].append((attempt.commit_seq, value))
            state[key] = value
    for key in KEYS:
        text = engine.store.read_committed(key)
        assert (None if text is None else int(text)) == state.get(key), key
    return len(attempts) - refusals, refusals


@pytest.mark.parametrize("isolation", ["read_committed", "no_lost_updates", "serializable"])
def test_short_stress(isolation):
    """16 threads, 25 transactions each: the history checks out, with some conflicts seen."""
    engine, history = run_workers(isolation, workers=16, transactions=25, seed=1)
    commits, refusals = check(engine, history, isolation=isolation)
    assert commits > 0
    assert refusals > 0  # the keys are few: conflicts must occur, and be refused


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["read_committed", "no_lost_updates", "serializable"])
@pytest.mark.parametrize("seed", range(5))
def test_long_stress(isolation, seed):
    """Slow campaign: 16 threads, 200 transactions each, five seeds."""
    engine, history = run_workers(isolation, workers=16, transactions=200, seed=seed)
    check(engine, history, isolation=isolation)
