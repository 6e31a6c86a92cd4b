"""The command line: `agenttx demo | inspect | graph | lineage` (also `python -m agenttx`).

Every command reads; none changes a store: `inspect` and `graph` open the SQLite file
read-only and look at transactions without taking them over, so they are safe to run beside a
live agent. Errors a person can fix (a missing file, a file that is not an agenttx store, an
unknown transaction, a transcript that is not JSON) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

from . import _demo
from ._errors import AgentTxError, TransactionNotFound
from ._graph import DependencyGraph
from ._json import canonical_dumps
from ._lineage import lineage_from_openai
from ._txlog import Restored, add_live_steps, read_image
from ._version import __version__
from .stores import SQLiteStore

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._lineage import LineageGraph

__all__ = ["main"]

FORMATS: Final = ("dot", "mermaid", "json")
#: Values longer than this are cut in `inspect`'s listing of steps.
WIDTH: Final = 96


class _Failure(Exception):
    """A problem the person at the terminal can fix; printed as one line, exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with `argv` (default: `sys.argv[1:]`); return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        command: Callable[[argparse.Namespace], None] = args.run
        command(args)
    except _Failure as exc:
        print(f"agenttx {args.command}: {exc}", file=sys.stderr)
        return 2
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agenttx", description="Transactions for AI agent tool calls."
    )
    parser.add_argument("--version", action="version", version=f"agenttx {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run the demo: an order workflow that fails, rewinds to the root cause and commits",
        description="Run an order workflow through a transaction on a SQLite file: a "
        "foreign-key failure, the hint, the dependency jump with its compensations, the "
        "corrected replay, the commit and the email dispatched after it. Ends with the graph "
        "as text, and writes it as Mermaid beside the database.",
    )
    demo.add_argument("--dir", help="where the database, files and graph go (default: temp)")
    demo.set_defaults(run=_run_demo)

    inspect = commands.add_parser(
        "inspect",
        help="list the open transactions of a SQLite store, or show one",
        description="Without TX: each open transaction (id, agent, status, steps, age) and the "
        "effects waiting in the outbox. With TX: its steps, edges, constraints, context, "
        "staged effects and undo records. Read-only.",
    )
    inspect.add_argument("db", metavar="DB", help="the SQLite file")
    inspect.add_argument("tx", metavar="TX", nargs="?", help="a transaction id")
    inspect.set_defaults(run=_run_inspect)

    graph = commands.add_parser(
        "graph",
        help="print the dependency graph of a stored transaction",
        description="The dependency graph of an open transaction of a SQLite store. Read-only.",
    )
    graph.add_argument("db", metavar="DB", help="the SQLite file")
    graph.add_argument("tx", metavar="TX", help="a transaction id")
    graph.add_argument("--format", choices=FORMATS, default="mermaid")
    graph.set_defaults(run=_run_graph)

    lineage = commands.add_parser(
        "lineage",
        help="derive tool-to-tool lineage from an OpenAI chat transcript",
        description="Read a JSON list of chat messages (OpenAI format: assistant messages with "
        "tool_calls, tool messages with tool_call_id) and print which tool call consumed a "
        "value another produced.",
    )
    lineage.add_argument("transcript", metavar="TRANSCRIPT.json")
    lineage.add_argument("--format", choices=("text", *FORMATS), default="text")
    lineage.add_argument("--evidence", action="store_true", help="paths and confidence")
    lineage.add_argument("--min-value-length", type=int, default=4)
    lineage.add_argument("--match-numbers", action="store_true")
    lineage.set_defaults(run=_run_lineage)
    return parser


# ---------------------------------------------------------------------- commands


def _run_demo(args: argparse.Namespace) -> None:
    _demo.run(directory=args.dir)


def _run_inspect(args: argparse.Namespace) -> None:
    store = _open(args.db)
    try:
        if args.tx is None:
            _list(store)
        else:
            _show(_restored(store, args.tx))
    finally:
        store.close()


def _run_graph(args: argparse.Namespace) -> None:
    store = _open(args.db)
    try:
        graph = _graph_of(_restored(store, args.tx))
    finally:
        store.close()
    print(_render(graph, args.format), end="")


def _run_lineage(args: argparse.Namespace) -> None:
    path = Path(args.transcript)
    try:
        messages = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _Failure(f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _Failure(f"{path} is not a JSON transcript: {exc}") from None
    if not isinstance(messages, list):
        raise _Failure(f"{path} must hold a JSON list of chat messages")
    graph = lineage_from_openai(
        messages,
        min_value_length=args.min_value_length,
        match_numbers=args.match_numbers,
        evidence=args.evidence,
    )
    if args.format == "text":
        names = {node.index: f"{node.tool_name} ({node.call_id})" for node in graph.nodes}
        print(f"{len(graph.nodes)} tool calls, {len(graph.edges)} links")
        for edge in graph.edges:
            value = canonical_dumps(edge.value)
            print(f"  {names[edge.source.index]} -> {names[edge.target.index]}  {value}")
        return
    print(_render(graph, args.format), end="")


# ---------------------------------------------------------------------- helpers


def _open(db: str) -> SQLiteStore:
    if not Path(db).exists():
        raise _Failure(f"no such file: {db}")
    try:
        return SQLiteStore(db, readonly=True)
    except AgentTxError as exc:
        raise _Failure(str(exc)) from None


def _restored(store: SQLiteStore, tx_id: str) -> Restored:
    try:
        image = store.peek(tx_id)
    except TransactionNotFound:
        raise _Failure(
            f"no open transaction {tx_id} in {store.path} (committed and aborted ones leave it)"
        ) from None
    except AgentTxError as exc:
        raise _Failure(str(exc)) from None
    if image.record == "null":
        raise _Failure(f"transaction {tx_id} has begun but recorded nothing yet")
    try:
        return read_image(image)
    except AgentTxError as exc:
        raise _Failure(str(exc)) from None


def _graph_of(restored: Restored) -> DependencyGraph:
    graph = DependencyGraph()
    add_live_steps(graph, restored.steps, 1)
    return graph


def _status(restored: Restored) -> str:
    return "ACTIVE" if restored.ended is None else f"{restored.ended}, undos to retry"


def _age(created_at: object) -> str:
    if not isinstance(created_at, (int, float)):
        return "?"
    seconds = max(0.0, time.time() - created_at)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _list(store: SQLiteStore) -> None:
    ids = store.open_transactions()
    print(f"{store.path}: {len(ids)} open transaction{'s' * (len(ids) != 1)}")
    rows = [("TX", "AGENT", "STATUS", "STEPS", "AGE")]
    for tx_id in ids:
        image = store.peek(tx_id)
        if image.record == "null":
            rows.append((tx_id, "?", "BEGUN", "0", "?"))
            continue
        restored = read_image(image)
        rows.append(
            (
                tx_id,
                restored.agent_id or "-",
                _status(restored),
                str(len(restored.steps)),
                _age(restored.record.get("created_at")),
            )
        )
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    pending = store.pending_effects(10_000)
    print(f"outbox: {len(pending)} effect{'s' * (len(pending) != 1)} waiting for delivery")


def _show(restored: Restored) -> None:
    print(f"transaction {restored.tx_id}")
    print(f"  agent: {restored.agent_id or '-'}   status: {_status(restored)}")
    print(
        f"  next step: {restored.progress.next_step}   age: "
        f"{_age(restored.record.get('created_at'))}"
    )
    print(f"steps ({len(restored.steps)}):")
    for step_id, step in sorted(restored.steps.items()):
        arguments = _cut(canonical_dumps(step.arguments))
        print(f"  {step_id}. {step.tool_name} {arguments}")
        print(f"     -> {_cut(canonical_dumps(step.output))}")
    edges = _graph_of(restored).edges()
    print(f"edges ({len(edges)}):")
    for edge in edges:
        print(
            f"  step {edge.source} -> step {edge.target}  "
            f"{edge.source_key} -> {edge.target_key}  ({edge.kind.value})"
        )
    print(f"constraints ({len(restored.progress.constraints)}):")
    for constraint in restored.progress.constraints:
        print(f"  - {constraint}")
    context = [(k, s.raw_context) for k, s in sorted(restored.steps.items()) if s.raw_context]
    print(f"context ({len(context)}):")
    for step_id, text in context:
        print(f"  {step_id}. {_cut(text)}")
    print(f"staged effects ({len(restored.effects)}):")
    for effect in restored.effects:
        print(
            f"  step {effect.step_id} {effect.channel} {_cut(canonical_dumps(effect.payload))} "
            f"key={effect.idempotency_key}"
        )
    print(f"undo records ({len(restored.undos)}):")
    for undo in restored.undos:
        print(f"  step {undo.step_id}.{undo.seq} {undo.description}")


def _render(graph: DependencyGraph | LineageGraph, fmt: str) -> str:
    """A graph in one of `FORMATS`: both graph kinds export the same three."""
    return {"dot": graph.to_dot, "mermaid": graph.to_mermaid, "json": graph.to_json}[fmt]()


def _cut(text: str) -> str:
    return text if len(text) <= WIDTH else text[: WIDTH - 3] + "..."
