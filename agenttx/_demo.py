"""The demo behind `python -m agenttx demo`: an order workflow that fails, rewinds and commits.

A scripted agent creates a customer (step 1, in the wrong table), reserves stock (2), writes a
receipt file (3), stages a confirmation email (4) and inserts the order (5). The insert fails
on its foreign key; the dependency graph traces `customer_id` back to step 1, so the
transaction jumps there: the receipt is deleted, the stock reservation reverted and the email
dropped. The agent, now holding the hint, fixes step 1 and replays; the commit publishes the
state and the email together (the email into the SQLite file's outbox), and only then sends it.
Everything lives in one SQLite file, the embedded default, which keeps the ended transaction as
history: the demo ends with the `agenttx inspect` commands that show what it did, and the
`agenttx ui` command that shows it in a page.
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import builtins
from ._engine import Engine, EngineConfig
from ._json import canonical_dumps
from ._results import AttemptStatus
from .stores import SQLiteStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._json import JSONValue
    from ._results import StepResult
    from ._tools import StagedEffect
    from ._transaction import Transaction

Call = tuple[str, dict[str, Any]]


def _plan(customer_table: str) -> dict[int, Call]:
    return {
        1: (
            "record.insert",
            {"table": customer_table, "id": "c-1", "fields": {"name": "Ada", "email": "ada@x.io"}},
        ),
        2: ("kv.put", {"key": "stock/SKU-1", "value": {"reserved": 2}}),
        3: ("fs.write", {"path": "receipts/o-1.txt", "contents": "1 x SKU-1 for Ada"}),
        4: (
            "effect.stage",
            {"channel": "email", "payload": {"to": "${steps.1.email}", "subject": "Order o-1"}},
        ),
        5: (
            "record.insert",
            {
                "table": "orders",
                "id": "o-1",
                "fields": {"customer_id": "${steps.1.id}", "sku": "SKU-1"},
                "references": {"customer_id": "customers"},
            },
        ),
    }


def _show(out: Callable[[str], object], step: int, call: Call, result: StepResult) -> None:
    tool, arguments = call
    out(f"step {step}  {tool} {canonical_dumps(arguments)}")
    if result.ok:
        out(f"        ok -> {canonical_dumps(result.output)}")
        return
    out(f"        FAILED: {result.error.splitlines()[0] if result.error else ''}")
    if result.hint is not None:
        out(f"        {result.hint.text}")
    out(
        f"        {result.strategy.value}: rewound to step {result.rollback_to_step}, "
        f"send step {result.next_step_id} next"
    )


def run(out: Callable[[str], object] = print, *, directory: str | None = None) -> Transaction:
    """Print the order workflow step by step and return its committed transaction.

    The database, the sandboxed files and `graph.mmd` go in `directory` (default: a new
    temporary directory).
    """
    sent: list[JSONValue] = []

    def send_email(effect: StagedEffect) -> None:
        sent.append(effect.payload)
        out(f"        email sent: {canonical_dumps(effect.payload)} key={effect.idempotency_key}")

    root = directory or tempfile.mkdtemp(prefix="agenttx-demo-")
    Path(root).mkdir(parents=True, exist_ok=True)
    database = Path(root, "agenttx.db")
    engine = Engine(
        tools=builtins.tools(root),
        store=SQLiteStore(database),
        dispatcher={"email": send_email},
        config=EngineConfig(idle_timeout=None),
    )
    tx = engine.begin(agent_id="demo")
    out(f"agenttx demo: an order workflow (state in {database}, files in {root})\n")

    plan = _plan("customer")  # the agent's first attempt puts the customer in the wrong table
    while tx.next_step_id in plan:
        step = tx.next_step_id
        result = tx.execute_step(step, *plan[step])
        _show(out, step, plan[step], result)
        if not result.ok:
            break
    receipt = Path(root, "receipts", "o-1.txt")
    out(
        f"\nafter the rewind: stock/SKU-1 = {tx.read('kv/stock/SKU-1')}, "
        f"receipt exists = {receipt.exists()}, staged emails = {tx.view().pending_effects}"
    )
    out(f"constraints the agent now works under: {list(tx.constraints)}")

    out("\nthe agent fixes step 1 and replays:")
    plan = _plan("customers")
    while tx.next_step_id in plan:
        step = tx.next_step_id
        _show(out, step, plan[step], tx.execute_step(step, *plan[step]))

    out("\ndependency graph (live steps, and the attempts that were undone):")
    for attempt in tx.history:
        if attempt.status is not AttemptStatus.LIVE:
            out(f"  step {attempt.step_id} {attempt.tool_name}: {attempt.status.value}")
    for edge in tx.graph.edges():
        out(
            f"  step {edge.source} -> step {edge.target}  {edge.source_key} -> {edge.target_key}"
            f"  ({edge.kind.value})"
        )
    mermaid = Path(root, "graph.mmd")
    mermaid.write_text(tx.export_graph("mermaid"), encoding="utf-8")
    out(f"  (as Mermaid in {mermaid})\n")

    out("commit:")
    committed = tx.commit()
    out(
        f"        {committed.steps_committed} steps committed, "
        f"{committed.effects_dispatched} effect dispatched after the commit, "
        f"{len(engine.pending_effects())} left in the outbox"
    )
    where, which = shlex.quote(str(database)), shlex.quote(tx.id)
    out("\nthe file keeps the transaction as history; to look at what it did:")
    out(f"  agenttx inspect {where}")
    out(f"  agenttx inspect {where} {which}")
    out(f"  agenttx graph {where} {which} --format mermaid")
    out(f"  agenttx audit {where} {which}")
    out("or in a page (pip install 'agenttx[ui]'; open the URL it prints, then the transaction):")
    out(f"  agenttx ui {where}")
    return tx
