"""How long `agenttx ui`'s pages take on a store with 10,000 transactions and 1,000 plan runs.

Run from the repository root (needs the ui extra: ``pip install 'agenttx[ui]'``)::

    python bench/ui_pages.py             # the full run: fills the store (20-30 s), then times
    python bench/ui_pages.py --quick     # 200 transactions and 20 plan runs, for the smoke test
    python bench/ui_pages.py --repeat 31 # more repetitions

Target (issue 24): each page loads in under 200 ms with 10,000 transactions and 1,000 plan runs
in the store. The full run exits with status 1, naming the misses, if a page's median is over.

The store
    A SQLite file (``durability="normal"``, history kept for all 10,000: ``keep_history=None``)
    filled through an `Engine`: 10,000 transactions of three steps each (an insert, a charge
    whose output the next step references, a note), of which every 10th rolls back after its
    third step and the rest commit; then 1,000 plan runs of three nodes (a chain). Twenty
    transactions are left open, one of them waiting for the approval of a charge, so that the
    inbox has a request to show. Filling is not timed.

The pages
    ``runs``: ``/`` (the first page: the open transactions and the 50 newest runs);
    ``runs, page 100``: ``/?page=100`` (``LIMIT 50 OFFSET 4,950`` at the store);
    ``transaction``: ``/tx/ID`` of a rolled-back transaction (steps, graph, timeline,
    compensations); ``plan run``: ``/plan/ID`` (nodes, DAG, Gantt chart, totals); ``inbox``:
    ``/inbox`` (the waiting request, its forms); ``audit``: ``/audit`` (the events of the 50
    newest runs).

How they are measured
    Through the ASGI app in this process (Starlette's TestClient: no socket, no browser), over
    a read-only `SQLiteStore` on the file, as `agenttx ui` reads it. Each sample is one GET,
    timed with ``time.perf_counter``; the verdict is the median of ``--repeat`` samples after
    one untimed warm-up; the maximum is shown too. Each response must be 200 and hold the
    page's key element (checked: a correctness failure raises).

``--quick`` fills 200 transactions and 20 plan runs and takes 3 samples a page: a smoke test of
this script, run by ``tests/test_bench.py``; a missed timing is only reported then.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import agenttx
from _report import Row, report
from agenttx import Engine, EngineConfig
from agenttx.stores import SQLiteStore

TARGET_MS = 200.0
TOKEN = "bench"  # noqa: S105 - the token of a server in this process, for this run


@agenttx.tool(name="insert")
def insert(name: str) -> dict[str, str]:
    return {"id": f"c-{name}"}


@agenttx.tool(name="charge")
def charge(customer_id: str, amount: int) -> dict[str, object]:
    return {"charge": f"ch-{customer_id}", "amount": amount}


@agenttx.tool(name="note")
def note(charge: str) -> dict[str, str]:
    return {"noted": charge}


@agenttx.tool(name="pay", needs_approval=True)
def pay(amount: int) -> dict[str, int]:
    return {"paid": amount}


def fill(path: str, transactions: int, plans: int) -> tuple[str, str]:
    """Fill the file; return a rolled-back transaction's id and a plan run's id."""
    store = SQLiteStore(path, durability="normal", keep_history=None, keep_history_for=None)
    engine = Engine(
        tools=[insert, charge, note, pay], store=store, config=EngineConfig(idle_timeout=None)
    )
    rolled = ""
    for number in range(transactions):
        tx = engine.begin(agent_id=f"agent-{number % 7}")
        tx.call("insert", {"name": f"n{number}"})
        tx.call("charge", {"customer_id": "${steps.1.id}", "amount": number})
        tx.call("note", {"charge": "${steps.2.charge}"})
        if number % 10 == 9:
            tx.rollback(0)
            rolled = tx.id
        else:
            tx.commit()
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("a", tool="insert", inputs={"name": "p"}),
            agenttx.Node("b", tool="charge", inputs={"customer_id": "${a.id}", "amount": 1}),
            agenttx.Node("c", tool="note", inputs={"charge": "${b.charge}"}),
        ]
    )
    run_id = ""
    for number in range(plans):
        run_id = f"run-{number:05d}"
        engine.run_plan(plan, initial={}, run_id=run_id)
    for number in range(20):
        tx = engine.begin(agent_id="open")
        tx.call("insert", {"name": f"open{number}"})
        if number == 0:
            assert not tx.call("pay", {"amount": 4200}).ok  # waits for approval
    engine.close()  # the open transactions stay open in the file (released, not ended)
    return rolled, run_id


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a small store, for a smoke test")
    parser.add_argument("--repeat", type=int, default=None, help="samples a page")
    args = parser.parse_args()
    from starlette.testclient import TestClient  # noqa: PLC0415  (the ui extra)

    from agenttx._ui._app import make_app  # noqa: PLC0415

    transactions, plans = (200, 20) if args.quick else (10_000, 1_000)
    repeat = args.repeat or (3 if args.quick else 21)
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "ui.db")
        started = time.perf_counter()
        rolled, run_id = fill(path, transactions, plans)
        filled = time.perf_counter() - started
        store = SQLiteStore(path, readonly=True)
        client = TestClient(make_app(store, token=TOKEN))
        assert client.get(f"/?token={TOKEN}").status_code == 200
        last = max(1, (transactions + plans) // 50)
        pages = [
            ("runs", "/", '<table id="runs">'),
            (f"runs, page {min(100, last)}", f"/?page={min(100, last)}", 'class="run"'),
            ("transaction", f"/tx/{rolled}", '<div id="graph">'),
            ("plan run", f"/plan/{run_id}", '<div id="dag">'),
            ("inbox", "/inbox", 'class="request"'),
            ("audit", "/audit", 'class="event"'),
        ]
        rows = []
        for name, url, needed in pages:
            response = client.get(url)  # warm-up, and the correctness check
            assert response.status_code == 200, (url, response.status_code)
            assert needed in response.text, (url, needed)
            samples = []
            for _ in range(repeat):
                begun = time.perf_counter()
                client.get(url)
                samples.append((time.perf_counter() - begun) * 1000)
            median = statistics.median(samples)
            rows.append(
                Row(
                    name=name,
                    measured=f"{median:.1f} ms",
                    target=f"< {TARGET_MS:.0f} ms",
                    ratio=median / TARGET_MS,
                    detail=f"median of {repeat}, max {max(samples):.1f} ms, "
                    f"{len(response.content):,} bytes",
                )
            )
        client.close()
        store.close()
    notes = [
        (
            f"store: {transactions:,} transactions (every 10th rolled back), {plans:,} plan "
            f"runs, 20 open transactions; filled in {filled:.0f} s (not timed)"
        )
    ]
    return report(rows, quick=args.quick, notes=notes)


if __name__ == "__main__":
    sys.exit(main())
