"""The command line's parser and its read-only commands (see the package docstring)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeAlias

from .. import _demo
from .._audit import DEFAULT_LIMIT, stored_audit
from .._errors import AgentTxError, InvalidArgument, StorageError, TransactionNotFound
from .._events import audit_jsonl
from .._json import canonical_dumps
from .._lineage import lineage_from_openai
from .._version import __version__
from ._people import add_approval_commands, waiting_count, waiting_lines
from ._reading import (
    EndedFound,
    ended_graph,
    graph_of,
    is_busy,
    patiently,
    read_tx,
    unreadable,
)
from ._shown import (
    list_transactions,
    plan_list,
    plan_shown,
    show_preview,
    show_transaction,
    waiting_nodes,
)
from ._target import ENV, Target, add_target, hide_dsn, is_dsn, open_target, resolve_target
from ._terminal import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    Failure,
    Parser,
    add_wait,
    forget_hidden,
    render,
    say,
    say_block,
    whole_number,
)
from ._trail import audit_lines

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence

    from .._lineage import LineageGraph, LineageNode

__all__ = ["AddCommand", "main"]

#: Adds one command to the command line's subparsers (`main`'s `extra`).
AddCommand: TypeAlias = "Callable[[argparse._SubParsersAction[Parser]], None]"  # noqa: SLF001

FORMATS: Final = ("dot", "mermaid", "json")
#: How many ended transactions and plan runs `audit DB` reads by default.
AUDIT_LIMIT: Final = DEFAULT_LIMIT


def main(argv: Sequence[str] | None = None, *, extra: Sequence[AddCommand] = ()) -> int:
    """Run the command line with `argv` (default: `sys.argv[1:]`); return the exit status.
    `extra` adds commands from packages the command line must not import (`agenttx ui`, from
    `agenttx._ui`, which reads through this package): each adds its subparser, whose `run`
    default runs it.

    Raises only argparse's `SystemExit` (0 after `--help` and `--version`, 2 for a bad
    argument, printed as usage and one error line); anything else, `KeyboardInterrupt`
    included (130), becomes a status, and no traceback is printed: see the module docstring
    for what each status means.
    """
    try:
        return _main(argv, extra)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`agenttx graph ... | head`): nothing more can be said to it,
        # and Python's flush of stdout at exit must not complain either.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - the last resort: one line instead of a traceback
        say(f"agenttx: error: {type(exc).__name__}: {exc}", stream=sys.stderr)
        return EXIT_ERROR


def _main(argv: Sequence[str] | None, extra: Sequence[AddCommand]) -> int:
    forget_hidden()
    for arg in (*(sys.argv[1:] if argv is None else argv), os.environ.get(ENV, "")):
        if is_dsn(arg):  # before argparse, whose errors may quote an argument
            hide_dsn(arg)
    parser = _parser(extra)
    args = parser.parse_args(argv)  # --help, --version, a bad argument: SystemExit, as argparse
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        command: Callable[[argparse.Namespace], None] = args.run
        command(args)
    except Failure as exc:
        say(f"agenttx {args.command}: {exc}", stream=sys.stderr)
        return exc.status
    return 0


def _parser(extra: Sequence[AddCommand] = ()) -> argparse.ArgumentParser:
    parser = Parser(prog="agenttx", description="Transactions for AI agent tool calls.")
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
        help="list the open and recently ended transactions of a store, or show one",
        description="Without TX: each open transaction (id, agent, status, steps, age), the "
        "effects waiting in the outbox, and the transactions that ended most recently (id, "
        "agent, final status, live steps at the end, how long ago), as far as the store keeps "
        "them; one whose stored rows cannot be read is listed as UNREADABLE, with the reason. "
        "With TX, open: its steps, edges, constraints, context, staged effects and undo "
        "records; ended: its final status, its steps and edges at the end, every step attempt "
        "with what became of it (live, failed, rewound, compensated), its constraints and its "
        "compensation failures; then what waits for a person in it (each pending approval "
        "request and review, with the tool, the arguments and the commands that decide it). "
        "A TX that is a plan run's id shows the run, as `plans TARGET RUN` does. With TX and "
        "--preview STEP: what a rollback of the open transaction to STEP (0: an abort) would "
        "do, without doing it: the steps it would void, the compensations it would run with "
        "their payloads, the staged effects it would drop and the voided steps that left "
        "nothing to undo. Read-only.",
    )
    add_target(inspect)
    inspect.add_argument("tx", metavar="TX", nargs="?", help="a transaction or plan run id")
    inspect.add_argument(
        "--preview",
        type=whole_number,
        metavar="STEP",
        help="with TX: what a rollback to STEP would do (0: an abort), without doing it",
    )
    add_wait(inspect)
    inspect.set_defaults(run=_run_inspect)

    graph = commands.add_parser(
        "graph",
        help="print the dependency graph of a stored transaction",
        description="The dependency graph of a transaction of a store, open or ended "
        "(kept as history): for an ended one, its live steps at the end, with every attempt "
        "that failed or was undone as an extra node marked failed, rewound or compensated, as "
        "the transaction's export_graph drew it. Read-only.",
    )
    add_target(graph)
    graph.add_argument("tx", metavar="TX", help="a transaction id")
    graph.add_argument("--format", choices=FORMATS, default="mermaid")
    add_wait(graph)
    graph.set_defaults(run=_run_graph)

    plans = commands.add_parser(
        "plans",
        help="list the plan runs of a store, or show one run's nodes live",
        description="Without RUN: each plan run (id, status, nodes by state, last change); a "
        "RUNNING run whose runner is gone (SQLite: its process has died; PostgreSQL: its "
        "lease has expired) is shown as ORPHANED. With RUN: the run's status, plan version, "
        "cancellation, and each node's state, its unfinished prerequisites (WAITS), attempts, "
        "retries, first start, end and error, as the store has them now, then what waits "
        "for a person in it; or, with --format dot or mermaid, the plan's graph with each "
        "node's state. Times are UK dates, with the time zone (Europe/London) named. "
        "Read-only.",
    )
    add_target(plans)
    plans.add_argument("run_id", metavar="RUN", nargs="?", help="a plan run id")
    plans.add_argument("--format", choices=("text", "dot", "mermaid"), default="text")
    add_wait(plans)
    plans.set_defaults(run=_run_plans)

    audit = commands.add_parser(
        "audit",
        help="print the audit trail of a store, or of one transaction or plan run",
        description="The audit events the store keeps, one line an event: its time (UTC), "
        "kind, step or node, actor and a short summary (the tool; what waits for approval "
        "or review, and its request id; a failure's hint; the compensation), each line "
        "escaped and cut; with --json, as JSON lines (one event object per line: scope, "
        "scope_id, seq, kind, at, zone, step or node, attempt, actor, data). Of transaction "
        "or plan run TX, or, without TX, of the ended transactions and plan runs the store "
        "keeps (the last --limit of each, each one's events in order under a line naming "
        "it). A transaction's events are kept when it ends, within the store's retention; a "
        "plan run's are written as it runs. Read-only.",
    )
    add_target(audit)
    audit.add_argument("tx", metavar="TX", nargs="?", help="a transaction or plan run id")
    audit.add_argument(
        "--limit",
        type=whole_number,
        default=AUDIT_LIMIT,
        metavar="N",
        help=f"without TX: how many ended transactions and plan runs (default: {AUDIT_LIMIT})",
    )
    audit.add_argument("--json", action="store_true", help="the events as JSON lines")
    add_wait(audit)
    audit.set_defaults(run=_run_audit)

    lineage = commands.add_parser(
        "lineage",
        help="derive tool-to-tool lineage from an OpenAI chat transcript",
        description="Read a JSON list of chat messages (OpenAI format: assistant messages with "
        "tool_calls, tool messages with tool_call_id) and print which tool call consumed a "
        "value another produced. In a transcript driven by agenttx, ${steps.N...} references "
        "are links too, and the calls a rewind voided are listed apart, without links.",
    )
    lineage.add_argument("transcript", metavar="TRANSCRIPT.json")
    lineage.add_argument("--format", choices=("text", *FORMATS), default="text")
    lineage.add_argument("--evidence", action="store_true", help="paths and confidence")
    lineage.add_argument(
        "--min-value-length",
        type=whole_number,
        default=4,
        metavar="N",
        help="the shortest string value that links two calls (default: 4)",
    )
    lineage.add_argument("--match-numbers", action="store_true")
    lineage.set_defaults(run=_run_lineage)
    add_approval_commands(commands)
    for add in extra:
        add(commands)
    return parser


def _run_demo(args: argparse.Namespace) -> None:
    _demo.run(directory=args.dir)


def _opened(args: argparse.Namespace, shifted: str | None = None) -> Target:
    resolve_target(args, shifted)
    return open_target(args.db, args.wait, schema=args.schema)


def _run_inspect(args: argparse.Namespace) -> None:
    target = _opened(args, "tx")
    if args.preview is not None and args.tx is None:
        target.store.close()
        raise Failure("--preview needs a transaction id (TX)")
    store = target.store
    try:
        if args.tx is None:
            lines = list_transactions(store, args.wait, name=target.name)
            approvals, reviews = waiting_count(store, args.wait)
            line = f"waiting for a person: {approvals} approval request(s), {reviews} review(s)"
            if approvals or reviews:
                line += f" (see: {target.command('approvals')})"
            lines.append(line)
        elif args.preview is not None:
            lines = show_preview(store, args.tx, args.preview, args.wait, name=target.name)
        else:  # a plan run (whose state is a transaction of the same id), else a transaction
            plan = _plan_lines(target, args.tx, args.wait, "text")
            if plan is None:
                lines = show_transaction(store, args.tx, args.wait, name=target.name)
                lines.extend(waiting_lines(store, args.tx, args.wait, target=target))
            else:
                lines = plan
    finally:
        store.close()
    for line in lines:
        say(line)


def _run_graph(args: argparse.Namespace) -> None:
    target = _opened(args)
    try:
        found = read_tx(target.store, args.tx, args.wait, name=target.name)
    finally:
        target.store.close()
    try:
        if isinstance(found, EndedFound):
            text = ended_graph(found, args.format)
        else:
            text = render(graph_of(found), args.format)
    except Exception as exc:  # noqa: BLE001 - stored rows decoded, yet not a graph
        raise unreadable(args.tx, exc) from None
    say_block(text, json_text=args.format == "json")


def _run_plans(args: argparse.Namespace) -> None:
    if args.run_id is None and args.format != "text":
        raise Failure("--format dot or mermaid needs a RUN")
    target = _opened(args, "run_id")
    try:
        if args.run_id is None:
            lines = plan_list(target.store, args.wait)
        else:
            found = _plan_lines(target, args.run_id, args.wait, args.format)
            if found is None:
                raise Failure(f"no plan run `{args.run_id}` in {target.name}")
            lines = found
    finally:
        target.store.close()
    if args.run_id is not None and args.format != "text":
        say_block("\n".join(lines), json_text=False)
        return
    for line in lines:
        say(line)


def _plan_lines(target: Target, run_id: str, wait: float, fmt: str) -> list[str] | None:
    """The lines of `plans TARGET RUN` (in text, with what waits for a person in the run);
    None if there is no such run."""
    store = target.store
    try:
        image = patiently(wait, lambda: store.read_plan(run_id))
    except TransactionNotFound:
        return None
    except InvalidArgument as exc:
        raise Failure(str(exc)) from None
    orphaned = image.status == "RUNNING" and run_id in patiently(wait, store.orphaned_plans)
    waiting = waiting_nodes(store, image, wait)
    try:
        lines = plan_shown(image, fmt, orphaned=orphaned, waiting=waiting)
    except (AgentTxError, ValueError, KeyError, TypeError) as exc:
        raise unreadable(run_id, exc) from None
    if fmt == "text":
        lines.extend(waiting_lines(store, run_id, wait, target=target))
    return lines


def _run_audit(args: argparse.Namespace) -> None:
    if args.limit < 1:
        raise Failure("--limit must be at least 1")
    target = _opened(args, "tx")
    store = target.store
    try:
        events = patiently(args.wait, lambda: stored_audit(store, args.tx, limit=args.limit))
    except TransactionNotFound:
        raise Failure(
            f"no audit trail of `{args.tx}` in {target.name} (open, pruned by the retention, "
            "or unknown)"
        ) from None
    except InvalidArgument as exc:
        raise Failure(str(exc)) from None
    except StorageError as exc:
        if is_busy(exc):
            raise
        raise unreadable(args.tx or target.name, exc) from None
    finally:
        store.close()
    if args.json:
        say_block(audit_jsonl(events), json_text=True)
        return
    for line in audit_lines(events, headers=args.tx is None):
        say(line)


def _run_lineage(args: argparse.Namespace) -> None:
    path = Path(args.transcript)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise Failure(f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise Failure(f"{path} is not a JSON transcript: cannot read it: {exc}") from None
    try:
        messages = json.loads(text)
    except ValueError as exc:
        raise Failure(f"{path} is not a JSON transcript: {exc}") from None
    except RecursionError:
        raise Failure(f"{path} is not a JSON transcript: it is nested too deeply") from None
    if not isinstance(messages, list):
        raise Failure(f"{path} must hold a JSON list of chat messages")
    graph = lineage_from_openai(
        messages,
        min_value_length=args.min_value_length,
        match_numbers=args.match_numbers,
        evidence=args.evidence,
    )
    if args.format == "text":
        for line in _lineage_text(graph):
            say(line)
        return
    say_block(render(graph, args.format), json_text=args.format == "json")


def _lineage_text(graph: LineageGraph) -> list[str]:
    """The text of `lineage`: a count line, one line per link, one per voided call.

    A value link ends with the value as JSON; a reference ends with the reference as written
    and the keys it links (`${steps.1.id}  id -> customer_id`).
    """

    def name(node: LineageNode) -> str:
        step = "" if node.step is None else f", step {node.step}"
        return f"{node.tool_name} ({node.call_id}{step})"

    references = sum(1 for edge in graph.edges if edge.explicit)
    voided = [node for node in graph.nodes if node.voided]
    head = f"{len(graph.nodes)} tool calls, {len(graph.edges)} links"
    if references:
        head += f" ({references} by reference)"
    if voided:
        head += f", {len(voided)} voided by a rewind"
    lines = [head]
    for edge in graph.edges:
        if edge.explicit:
            what = f"{edge.value}  {edge.source_key} -> {edge.target_key}"
        else:
            what = canonical_dumps(edge.value)
        lines.append(f"  {name(edge.source)} -> {name(edge.target)}  {what}")
    lines.extend(f"  voided: {name(node)}" for node in voided)
    return lines
