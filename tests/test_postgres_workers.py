"""PostgresStore with several worker processes, each with its own engine and connections."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agenttx.stores import EffectRow, PostgresStore

WORKER = str(Path(__file__).with_name("_pg_worker.py"))


@pytest.fixture
def shared(pg_schema: tuple[str, str], tmp_path: Path) -> tuple[str, str, Path]:
    """`(dsn, schema, root)`, the schema migrated before the workers start."""
    dsn, schema = pg_schema
    PostgresStore(dsn, schema=schema).close()
    return dsn, schema, tmp_path


def _start(shared: tuple[str, str, Path], mode: str, *args: object) -> subprocess.Popen[str]:
    dsn, schema, root = shared
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, WORKER, mode, dsn, schema, str(root), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )


def _finish(worker: subprocess.Popen[str], timeout: float = 120) -> list[str]:
    out, err = worker.communicate(timeout=timeout)
    assert worker.returncode == 0, err
    return out.split()


def _lines(root: Path) -> list[str]:
    path = root / "effects.log"
    return path.read_text().splitlines() if path.exists() else []


def test_four_workers_lose_no_update(shared: tuple[str, str, Path]) -> None:
    """4 processes x 250 read-modify-write transactions over 8 shared counters: every
    increment is counted once, conflicts retried, none lost."""
    workers = [_start(shared, "rmw", seed, 250, 8) for seed in range(4)]
    results = [_finish(worker, timeout=300) for worker in workers]
    assert all(result[:2] == ["done", "250"] for result in results)
    dsn, schema, _ = shared
    with PostgresStore(dsn, schema=schema) as store:
        total = sum(int(store.read_committed(f"counter/{k}") or "0") for k in range(8))
    assert total == 1000


def test_a_frozen_worker_past_its_lease_writes_nothing(shared: tuple[str, str, Path]) -> None:
    """SIGSTOP a worker past its lease, recover its transaction elsewhere, SIGCONT it: its
    next step is refused with StorageError (lease lost) before its tool runs, and nothing of
    it is committed or delivered."""
    dsn, schema, root = shared
    worker = _start(shared, "hold", 0.6)
    assert worker.stdout is not None
    ready = worker.stdout.readline().split()
    assert ready[0] == "ready", worker.stderr.read() if worker.stderr else ""
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        time.sleep(1.2)
        recoverer = _start(shared, "recover")
        (root / "go").touch()
        assert _finish(recoverer) == ["recovered", "1", "1", "0", "0"]
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    out = _finish(worker)
    assert out[:4] == ["lost", "StorageError:", "lease", "lost:"], out
    assert _lines(root) == ["charge o1", "refund o1"]  # no "note o1": the tool never ran
    with PostgresStore(dsn, schema=schema) as store:
        assert store.read_committed("orders/o1") is None
        assert store.read_committed("notes/o1") is None
        assert store.open_transactions() == ()
        assert store.pending_effects() == ()


def test_two_recoverers_never_both_take_a_transaction(shared: tuple[str, str, Path]) -> None:
    """A worker killed with 20 open transactions; two recoverer processes at once take each
    exactly once, so every compensation runs once."""
    dsn, schema, root = shared
    holder = _start(shared, "open", 20, 0.5)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "ready"
    holder.kill()
    holder.communicate()
    time.sleep(0.7)  # its leases run out
    recoverers = [_start(shared, "recover") for _ in range(2)]
    (root / "go").touch()
    reports = [_finish(recoverer) for recoverer in recoverers]
    assert sum(int(report[1]) for report in reports) == 20
    assert all(report[4] == "0" for report in reports)  # no failures
    refunds = sorted(line for line in _lines(root) if line.startswith("refund"))
    assert refunds == sorted(f"refund o{n}" for n in range(20))
    with PostgresStore(dsn, schema=schema) as store:
        assert store.open_transactions() == ()


def test_competing_dispatchers_deliver_each_key_once(shared: tuple[str, str, Path]) -> None:
    """60 committed effects, three dispatcher processes at once: each key delivered once."""
    dsn, schema, root = shared
    with PostgresStore(dsn, schema=schema) as store:
        for n in range(60):
            tx_id = f"t{n}"
            store.begin(tx_id)
            effects = [
                EffectRow(step_id=1, channel="email", payload="{}", idempotency_key=f"key-{n}")
            ]
            store.record_step(tx_id, 1, "{}", effects, "{}")
            store.commit(tx_id)
    dispatchers = [_start(shared, "dispatch") for _ in range(3)]
    (root / "go").touch()
    counts = [int(_finish(dispatcher)[1]) for dispatcher in dispatchers]
    assert sum(counts) == 60
    delivered = [line.split()[1] for line in _lines(root) if line.startswith("deliver")]
    assert sorted(delivered) == sorted(f"key-{n}" for n in range(60))
