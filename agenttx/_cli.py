"""The command line: `agenttx demo | inspect | graph | plans | audit | lineage | approvals |
approve | reject | review` (also `python -m agenttx`).

Every command reads, except `approve`, `reject` and `review`, which decide one pending approval
request or review, and write nothing else. `inspect` and `graph` open the SQLite file
read-only and look at transactions without taking them over, so they are safe to run beside a
live agent. They show the open transactions, and the ended ones the store keeps as history
(within its retention: `SQLiteStore(keep_history=..., keep_history_for=...)`), with what
became of every step attempt. A transaction that ends (commits or aborts) between the listing
and its read is left out of the open ones (`inspect DB TX` then shows it ended); one whose
stored rows cannot be read is listed as `UNREADABLE`, with the reason on a line of its own,
and the others are listed as usual. A read that finds the store locked by a writer is tried
again until `--wait` seconds have passed.

Nothing prints a traceback. Exit status: 0 done; 2 a problem with what was given (a bad option,
a missing file, a file that is not an agenttx store, an unknown or unreadable transaction, a
transcript that is not a JSON list), printed as one line; 1 a store that stayed locked for the
whole `--wait`, or any unexpected error, printed as one line `agenttx: error: TYPE: MESSAGE`;
130 interrupted (Ctrl-C), quietly.

Everything printed passes through `_printable`, so text from a store or a transcript (agent
ids, tool names, hints, context, values, error messages) can never send control characters
to the terminal: C0 and C1 controls, DEL, Unicode's bidirectional overrides and line
separators, and lone surrogates are written as escapes (`\\x1b`, `\\r`, `\\u202e`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import math
import os
import sqlite3
import sys
import time
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple, NoReturn, TypeVar

from . import _demo
from ._approvals import ApprovalRequest, Review, requests_for, scopes_alive
from ._audit import DEFAULT_LIMIT, stored_audit
from ._errors import AgentTxError, InvalidArgument, StorageError, TransactionNotFound
from ._events import audit_jsonl
from ._graph import DependencyGraph
from ._history import StepHistory
from ._json import canonical_dumps
from ._lineage import lineage_from_openai
from ._plans import Plan, StoredNode, read_run
from ._render import DrawnEdge, DrawnNode, render_graph
from ._results import AttemptStatus, TxStatus
from ._txlog import Ended, Restored, add_live_steps, read_history, read_image
from ._version import __version__
from .stores import SQLiteStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import TextIO

    from ._lineage import LineageGraph, LineageNode
    from .stores import EndedTransaction, TxImage
    from .stores._plans import PlanImage

__all__ = ["main"]

_T = TypeVar("_T")

FORMATS: Final = ("dot", "mermaid", "json")
#: Values longer than this are cut in `inspect`'s listing of steps.
WIDTH: Final = 96
#: How long `inspect` and `graph` wait for a locked store by default, in seconds.
WAIT: Final = 5.0
#: How many ended transactions (and plan runs) `inspect DB` lists, the last to end first.
ENDED_SHOWN: Final = 20
#: How many ended transactions and plan runs `audit DB` reads by default.
AUDIT_LIMIT: Final = DEFAULT_LIMIT

#: Exit statuses.
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130

#: SQLite's primary result codes for a lock held elsewhere: SQLITE_BUSY, SQLITE_LOCKED.
_BUSY_CODES: Final = frozenset({5, 6})
#: The longest pause between two tries of a busy read, and the longest SQLite waits for a
#: lock within one try (so that a try does not outlast `--wait` by more), in seconds.
_MAX_PAUSE: Final = 0.25
_MAX_TRY: Final = 0.5


def _escapes(*, json_text: bool) -> dict[int, str]:
    """The `str.translate` table of `_printable`: the code points a terminal may act on or
    that may reorder what it shows, each to an escape (JSON's `\\uXXXX` in JSON text, where
    they can only stand inside strings, so the text stays JSON with the same values)."""
    codes = chain(
        range(0x20),  # C0, tab and newline included: one printed line stays one line
        range(0x7F, 0xA0),  # DEL and C1 (0x9b is CSI, as ESC [ is)
        (0x061C, 0x200E, 0x200F, 0x2028, 0x2029),  # bidi marks, line and paragraph separators
        range(0x202A, 0x202F),  # bidi embeddings and overrides
        range(0x2066, 0x206A),  # bidi isolates
        range(0xD800, 0xE000),  # lone surrogates (from JSON's \ud800): no encoding takes them
    )
    table = {}
    for code in codes:
        if json_text or code > 0xFF:
            table[code] = f"\\u{code:04x}"
        else:
            table[code] = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code, f"\\x{code:02x}")
    return table


_TEXT_ESCAPES: Final = _escapes(json_text=False)
_JSON_ESCAPES: Final = _escapes(json_text=True)


class _Ended(NamedTuple):
    """An ended transaction kept as history, decoded: its row, its image as it ended (its
    steps: the live ones at the end) and its history (`None` if it ended without one)."""

    row: EndedTransaction
    restored: Restored
    ended: Ended | None


class _Failure(Exception):
    """A problem printed as one line `agenttx COMMAND: MESSAGE`; exit `status` (2: the person
    at the terminal can fix what they gave; 1: the store stayed locked)."""

    def __init__(self, message: str, *, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """argparse, with its error line escaped like everything else printed."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {_printable(message)}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with `argv` (default: `sys.argv[1:]`); return the exit status.

    Raises only argparse's `SystemExit` (0 after `--help` and `--version`, 2 for a bad
    argument, printed as usage and one error line); anything else, `KeyboardInterrupt`
    included (130), becomes a status, and no traceback is printed: see the module docstring
    for what each status means.
    """
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`agenttx graph ... | head`): nothing more can be said to it,
        # and Python's flush of stdout at exit must not complain either.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - the last resort: one line instead of a traceback
        _say(f"agenttx: error: {type(exc).__name__}: {exc}", stream=sys.stderr)
        return EXIT_ERROR


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)  # --help, --version, a bad argument: SystemExit, as argparse
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        command: Callable[[argparse.Namespace], None] = args.run
        command(args)
    except _Failure as exc:
        _say(f"agenttx {args.command}: {exc}", stream=sys.stderr)
        return exc.status
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="agenttx", description="Transactions for AI agent tool calls.")
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
        help="list the open and recently ended transactions of a SQLite store, or show one",
        description="Without TX: each open transaction (id, agent, status, steps, age), the "
        "effects waiting in the outbox, and the transactions that ended most recently (id, "
        "agent, final status, live steps at the end, how long ago), as far as the store keeps "
        "them; one whose stored rows cannot be read is listed as UNREADABLE, with the reason. "
        "With TX, open: its steps, edges, constraints, context, staged effects and undo "
        "records; ended: its final status, its steps and edges at the end, every step attempt "
        "with what became of it (live, failed, rewound, compensated), its constraints and its "
        "compensation failures. Read-only.",
    )
    inspect.add_argument("db", metavar="DB", help="the SQLite file")
    inspect.add_argument("tx", metavar="TX", nargs="?", help="a transaction id")
    _add_wait(inspect)
    inspect.set_defaults(run=_run_inspect)

    graph = commands.add_parser(
        "graph",
        help="print the dependency graph of a stored transaction",
        description="The dependency graph of a transaction of a SQLite store, open or ended "
        "(kept as history): for an ended one, its live steps at the end, with every attempt "
        "that failed or was undone as an extra node marked failed, rewound or compensated, as "
        "the transaction's export_graph drew it. Read-only.",
    )
    graph.add_argument("db", metavar="DB", help="the SQLite file")
    graph.add_argument("tx", metavar="TX", help="a transaction id")
    graph.add_argument("--format", choices=FORMATS, default="mermaid")
    _add_wait(graph)
    graph.set_defaults(run=_run_graph)

    plans = commands.add_parser(
        "plans",
        help="list the plan runs of a SQLite store, or show one run's nodes live",
        description="Without RUN: each plan run (id, status, nodes by state, last change). "
        "With RUN: the run's status, plan version, cancellation, and each node's state, "
        "unresolved prerequisites, attempts, retries, first start, end and error, as the "
        "store has them now; or, with --format dot or mermaid, the plan's graph with each "
        "node's state. Times are UK dates, with the time zone (Europe/London) named. "
        "Read-only.",
    )
    plans.add_argument("db", metavar="DB", help="the SQLite file")
    plans.add_argument("run_id", metavar="RUN", nargs="?", help="a plan run id")
    plans.add_argument("--format", choices=("text", "dot", "mermaid"), default="text")
    _add_wait(plans)
    plans.set_defaults(run=_run_plans)

    audit = commands.add_parser(
        "audit",
        help="print the audit trail of a SQLite store, or of one transaction or plan run",
        description="The audit events the store keeps, as JSON lines (one event object per "
        "line: scope, scope_id, seq, kind, at, zone, step or node, attempt, actor, data): of "
        "transaction or plan run TX, or, without TX, of the ended transactions and plan runs "
        "the store keeps (the last --limit of each), each one's events in order. A "
        "transaction's events are kept when it ends, within the store's retention; a plan "
        "run's are written as it runs. Read-only.",
    )
    audit.add_argument("db", metavar="DB", help="the SQLite file")
    audit.add_argument("tx", metavar="TX", nargs="?", help="a transaction or plan run id")
    audit.add_argument(
        "--limit",
        type=_count,
        default=AUDIT_LIMIT,
        metavar="N",
        help=f"without TX: how many ended transactions and plan runs (default: {AUDIT_LIMIT})",
    )
    _add_wait(audit)
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
        type=_count,
        default=4,
        metavar="N",
        help="the shortest string value that links two calls (default: 4)",
    )
    lineage.add_argument("--match-numbers", action="store_true")
    lineage.set_defaults(run=_run_lineage)
    _add_approval_commands(commands)
    return parser


def _add_wait(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--wait",
        type=_seconds,
        default=WAIT,
        metavar="SECONDS",
        help=f"how long to keep trying while a writer holds the store locked (default: {WAIT:g})",
    )


def _count(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return value


# ---------------------------------------------------------------------- commands


def _run_demo(args: argparse.Namespace) -> None:
    _demo.run(directory=args.dir)


def _run_inspect(args: argparse.Namespace) -> None:
    store = _open(args.db, args.wait)
    try:
        lines = _list(store, args.wait) if args.tx is None else _show(store, args.tx, args.wait)
    finally:
        store.close()
    for line in lines:
        _say(line)


def _run_graph(args: argparse.Namespace) -> None:
    store = _open(args.db, args.wait)
    try:
        found = _restored(store, args.tx, args.wait)
    finally:
        store.close()
    try:
        if isinstance(found, _Ended):
            text = _ended_graph(found, args.format)
        else:
            text = _render(_graph_of(found), args.format)
    except Exception as exc:  # noqa: BLE001 - stored rows decoded, yet not a graph
        raise _unreadable(args.tx, exc) from None
    _say_block(text, json_text=args.format == "json")


def _run_plans(args: argparse.Namespace) -> None:
    store = _open(args.db, args.wait)
    try:
        if args.run_id is None:
            if args.format != "text":
                raise _Failure("--format dot or mermaid needs a RUN")
            lines = _plan_list(store, args.wait)
        else:
            try:
                image = _patiently(args.wait, lambda: store.read_plan(args.run_id))
            except TransactionNotFound:
                raise _Failure(f"no plan run `{args.run_id}` in {args.db}") from None
            except InvalidArgument as exc:
                raise _Failure(str(exc)) from None
            try:
                lines = _plan_shown(image, args.format)
            except (AgentTxError, ValueError, KeyError, TypeError) as exc:
                raise _unreadable(args.run_id, exc) from None
    finally:
        store.close()
    if args.run_id is not None and args.format != "text":
        _say_block("\n".join(lines), json_text=False)
        return
    for line in lines:
        _say(line)


def _run_audit(args: argparse.Namespace) -> None:
    if args.limit < 1:
        raise _Failure("--limit must be at least 1")
    store = _open(args.db, args.wait)
    try:
        events = _patiently(args.wait, lambda: stored_audit(store, args.tx, limit=args.limit))
    except TransactionNotFound:
        raise _Failure(
            f"no audit trail of `{args.tx}` in {args.db} (open, pruned by the retention, "
            "or unknown)"
        ) from None
    except InvalidArgument as exc:
        raise _Failure(str(exc)) from None
    except StorageError as exc:
        if _is_busy(exc):
            raise
        raise _unreadable(args.tx or args.db, exc) from None
    finally:
        store.close()
    _say_block(audit_jsonl(events), json_text=True)


def _run_lineage(args: argparse.Namespace) -> None:
    path = Path(args.transcript)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _Failure(f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _Failure(f"{path} is not a JSON transcript: cannot read it: {exc}") from None
    try:
        messages = json.loads(text)
    except ValueError as exc:
        raise _Failure(f"{path} is not a JSON transcript: {exc}") from None
    except RecursionError:
        raise _Failure(f"{path} is not a JSON transcript: it is nested too deeply") from None
    if not isinstance(messages, list):
        raise _Failure(f"{path} must hold a JSON list of chat messages")
    graph = lineage_from_openai(
        messages,
        min_value_length=args.min_value_length,
        match_numbers=args.match_numbers,
        evidence=args.evidence,
    )
    if args.format == "text":
        for line in _lineage_text(graph):
            _say(line)
        return
    _say_block(_render(graph, args.format), json_text=args.format == "json")


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


# ---------------------------------------------------------------------- reading the store


def _open(db: str, wait: float) -> SQLiteStore:
    if not Path(db).exists():
        raise _Failure(f"no such file: {db}")
    try:
        return _patiently(
            wait, lambda: SQLiteStore(db, readonly=True, busy_timeout=min(wait, _MAX_TRY))
        )
    except AgentTxError as exc:
        raise _Failure(str(exc)) from None


def _patiently(wait: float, read: Callable[[], _T]) -> _T:
    """`read()`, tried again while it finds the store locked, until `wait` seconds have passed;
    then `_Failure`, status 1. Any other error is raised as it is. (SQLite waits for a lock
    within each try, up to the store's `busy_timeout`, but not in every case: a reader can be
    told the file is busy at once while a writer checkpoints or recovers it.)"""
    deadline = time.monotonic() + wait
    pause = 0.01
    while True:
        try:
            return read()
        except StorageError as exc:
            left = deadline - time.monotonic()
            if not _is_busy(exc):
                raise
            if left <= 0:
                raise _Failure(str(exc), status=EXIT_ERROR) from None
        time.sleep(min(pause, left))
        pause = min(2 * pause, _MAX_PAUSE)


def _is_busy(exc: StorageError) -> bool:
    """Whether `exc` comes from SQLite finding the file locked by another connection."""
    cause = exc.__cause__
    if not isinstance(cause, sqlite3.OperationalError):
        return False
    code = getattr(cause, "sqlite_errorcode", None)
    if code is None:  # pragma: no cover - Python 3.10 has no sqlite_errorcode
        return "locked" in str(cause) or "busy" in str(cause)
    return code & 0xFF in _BUSY_CODES


def _peek(store: SQLiteStore, tx_id: str, wait: float) -> TxImage:
    """Transaction `tx_id`'s stored image. Raises `TransactionNotFound` if it has ended,
    `_Failure` if the store stayed locked, and whatever reading corrupt rows raises."""
    return _patiently(wait, lambda: store.peek(tx_id))


def _restored(store: SQLiteStore, tx_id: str, wait: float) -> Restored | _Ended:
    """Open transaction `tx_id`, decoded; or, if it has ended, its history (`_ended`)."""
    try:
        image = _peek(store, tx_id, wait)
    except TransactionNotFound:
        return _ended(store, tx_id, wait)
    except InvalidArgument as exc:
        raise _Failure(str(exc)) from None
    except _Failure:
        raise
    except Exception as exc:  # noqa: BLE001 - corrupt rows may raise anything while decoded
        raise _unreadable(tx_id, exc) from None
    if image.record == "null":
        raise _Failure(f"transaction {tx_id} has begun but recorded nothing yet")
    try:
        return read_image(image)
    except Exception as exc:  # noqa: BLE001 - e.g. RecursionError from deeply nested rows
        raise _unreadable(tx_id, exc) from None


def _ended(store: SQLiteStore, tx_id: str, wait: float) -> _Ended:
    """Ended transaction `tx_id` as the store keeps it, decoded; `_Failure` if it keeps none."""
    try:
        row, image = _patiently(wait, lambda: store.peek_ended(tx_id))
    except TransactionNotFound:
        raise _Failure(
            f"no open or ended transaction {tx_id} in {store.path} (ended ones are kept as "
            "history within the store's retention)"
        ) from None
    except _Failure:
        raise
    except Exception as exc:  # noqa: BLE001 - corrupt rows may raise anything while decoded
        raise _unreadable(tx_id, exc) from None
    if image.record == "null":
        raise _Failure(f"transaction {tx_id} ended without recording anything")
    try:
        return _Ended(row, read_image(image), read_history(row.history))
    except Exception as exc:  # noqa: BLE001 - e.g. RecursionError from deeply nested rows
        raise _unreadable(tx_id, exc) from None


def _unreadable(tx_id: str, exc: Exception) -> _Failure:
    return _Failure(f"transaction {tx_id} is unreadable: {_reason(exc)}")


def _reason(exc: Exception) -> str:
    """What went wrong reading a transaction, for one line."""
    if isinstance(exc, RecursionError):
        return "its rows are nested too deeply"
    if isinstance(exc, AgentTxError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _graph_of(restored: Restored) -> DependencyGraph:
    graph = DependencyGraph()
    add_live_steps(graph, restored.steps, 1)
    return graph


def _status(restored: Restored) -> str:
    return "ACTIVE" if restored.ended is None else f"{restored.ended}, undos to retry"


def _final_status(record: object, ended: Ended | None) -> str:
    """An ended transaction's final status: as its history says, else as its record says (it
    ended keeping undos), else unknown ("ENDED")."""
    if ended is not None:
        return ended.status
    status = record.get("ended") if isinstance(record, dict) else None
    return status if isinstance(status, str) else "ENDED"


def _live_steps(ended: Ended | None) -> str:
    """How many steps were live when the transaction ended ("?" without a history)."""
    if ended is None:
        return "?"
    return str(sum(attempt.status is AttemptStatus.LIVE for attempt in ended.attempts))


def _ended_graph(found: _Ended, fmt: str) -> str:
    """An ended transaction's graph as its `export_graph` drew it when it ended: its live
    steps (none once aborted), and each attempt that failed or was undone, marked."""
    graph = DependencyGraph()
    if found.ended is not None and found.ended.status == TxStatus.COMMITTED.value:
        add_live_steps(graph, found.restored.steps, 1)
    attempts = () if found.ended is None else found.ended.attempts
    return StepHistory.of(attempts).export(graph, fmt)


def _age(created_at: object) -> str:
    """How long ago `created_at` (seconds since the epoch, as stored) was; "?" if it is not a
    finite number."""
    if isinstance(created_at, bool) or not isinstance(created_at, (int, float)):
        return "?"
    try:
        moment = float(created_at)
    except OverflowError:  # an int too large for a float
        return "?"
    if not math.isfinite(moment):
        return "?"
    seconds = max(0.0, time.time() - moment)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


# ---------------------------------------------------------------------- what is printed


def _list(store: SQLiteStore, wait: float) -> list[str]:
    """The lines of `inspect DB`: each transaction still open when it is read (the listing
    and the reads are not one snapshot: a writer may end transactions in between)."""
    try:
        ids = _patiently(wait, store.open_transactions)
    except AgentTxError as exc:
        raise _Failure(str(exc)) from None
    rows = [("TX", "AGENT", "STATUS", "STEPS", "AGE")]
    reasons: list[str] = []
    for tx_id in ids:
        try:
            rows.append(_row(tx_id, _peek(store, tx_id, wait)))
        except TransactionNotFound:
            continue  # committed or aborted since the listing: no longer open
        except _Failure:
            raise
        except Exception as exc:  # noqa: BLE001 - one bad transaction must not hide the others
            rows.append((_printable(tx_id), "?", "UNREADABLE", "?", "?"))
            reasons.append(_cut(f"unreadable {_printable(tx_id)}: {_reason(exc)}", 2 * WIDTH))
    try:
        pending = len(_patiently(wait, lambda: store.pending_effects(10_000)))
    except AgentTxError as exc:
        raise _Failure(str(exc)) from None
    count = len(rows) - 1
    lines = [f"{store.path}: {count} open transaction{'s' * (count != 1)}"]
    if count:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines.extend(
            ("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))).rstrip()
            for row in rows
        )
    lines.extend(reasons)
    lines.append(f"outbox: {pending} effect{'s' * (pending != 1)} waiting for delivery")
    lines.extend(_ended_list(store, wait))
    runs = _plan_list(store, wait, limit=ENDED_SHOWN)
    if runs == [_NO_RUNS]:
        lines.append("plan runs: none")
    else:
        lines.append(f"plan runs: the last {len(runs) - 1}, the last changed first")
        lines.extend(f"  {line}".rstrip() for line in runs)
    return lines


def _ended_list(store: SQLiteStore, wait: float) -> list[str]:
    """The section of `inspect DB` on the ended transactions kept as history."""
    try:
        ended = _patiently(wait, lambda: store.ended_transactions(ENDED_SHOWN))
    except AgentTxError as exc:
        raise _Failure(str(exc)) from None
    if not ended:
        return ["ended: none kept as history"]
    rows = [("TX", "AGENT", "STATUS", "STEPS", "ENDED")]
    reasons: list[str] = []
    for row in ended:
        try:
            rows.append(_ended_row(row))
        except Exception as exc:  # noqa: BLE001 - one bad transaction must not hide the others
            rows.append((_printable(row.tx_id), "?", "UNREADABLE", "?", _age(row.ended_at)))
            reasons.append(_cut(f"unreadable {_printable(row.tx_id)}: {_reason(exc)}", 2 * WIDTH))
    count = len(ended)
    lines = [f"ended: the last {count} kept as history, the last to end first"]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines.extend(
        ("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))).rstrip()
        for row in rows
    )
    lines.extend(reasons)
    return lines


def _ended_row(row: EndedTransaction) -> tuple[str, str, str, str, str]:
    """One row of the ended section, its cells escaped."""
    record = json.loads(row.record)
    ended = read_history(row.history)
    agent = record.get("agent_id", "?") if isinstance(record, dict) else "?"
    return (
        _printable(row.tx_id),
        _printable(str(agent)) or "-",
        _printable(_final_status(record, ended)),
        _live_steps(ended),
        _age(row.ended_at),
    )


def _row(tx_id: str, image: TxImage) -> tuple[str, str, str, str, str]:
    """One row of the listing, its cells escaped (so that the columns line up as shown)."""
    if image.record == "null":
        return (_printable(tx_id), "?", "BEGUN", "0", "?")
    restored = read_image(image)
    return (
        _printable(tx_id),
        _printable(str(restored.agent_id)) or "-",
        _printable(_status(restored)),
        str(len(restored.steps)),
        _age(restored.record.get("created_at")),
    )


def _show(store: SQLiteStore, tx_id: str, wait: float) -> list[str]:
    """The lines of `inspect DB TX`, all built before any is printed."""
    found = _restored(store, tx_id, wait)
    try:
        return _shown_ended(found) if isinstance(found, _Ended) else _shown(found)
    except Exception as exc:  # noqa: BLE001 - decoded rows of the wrong shape fail anywhere
        raise _unreadable(tx_id, exc) from None


def _shown_ended(found: _Ended) -> list[str]:
    """The lines of `inspect DB TX` for an ended transaction."""
    restored, ended = found.restored, found.ended
    status = _final_status(restored.record, ended)
    committed = status == TxStatus.COMMITTED.value
    ago = _age(found.row.ended_at)
    lines = [
        f"transaction {restored.tx_id} (ended)",
        f"  agent: {restored.agent_id or '-'}   status: {status}   ended: {ago} ago",
        f"steps ({len(restored.steps)}{'' if committed else ', undone when it ended'}):",
    ]
    lines.extend(_steps_and_edges(restored))
    if ended is None:
        lines.append("attempts: not recorded (it ended without a history)")
        return lines
    lines.append(f"attempts ({len(ended.attempts)}):")
    for number, attempt in enumerate(ended.attempts, 1):
        became = attempt.status.value
        if committed and attempt.status is AttemptStatus.LIVE:
            became = "committed"
        lines.append(f"  {number}. step {attempt.step_id} {attempt.tool_name}: {became}")
    lines.append(f"constraints ({len(ended.constraints)}):")
    lines.extend(f"  - {constraint}" for constraint in ended.constraints)
    failures = ended.compensation_failures
    lines.append(f"compensation failures ({len(failures)}):")
    lines.extend(f"  - {failure}" for failure in failures)
    return lines


def _shown(restored: Restored) -> list[str]:
    age = _age(restored.record.get("created_at"))
    lines = [
        f"transaction {restored.tx_id}",
        f"  agent: {restored.agent_id or '-'}   status: {_status(restored)}",
        f"  next step: {restored.progress.next_step}   age: {age}",
        f"steps ({len(restored.steps)}):",
    ]
    lines.extend(_steps_and_edges(restored))
    lines.append(f"constraints ({len(restored.progress.constraints)}):")
    lines.extend(f"  - {constraint}" for constraint in restored.progress.constraints)
    context = [(k, s.raw_context) for k, s in sorted(restored.steps.items()) if s.raw_context]
    lines.append(f"context ({len(context)}):")
    lines.extend(f"  {step_id}. {_cut(str(text))}" for step_id, text in context)
    lines.append(f"staged effects ({len(restored.effects)}):")
    lines.extend(
        f"  step {effect.step_id} {effect.channel} {_cut(canonical_dumps(effect.payload))} "
        f"key={effect.idempotency_key}"
        for effect in restored.effects
    )
    lines.append(f"undo records ({len(restored.undos)}):")
    lines.extend(f"  step {undo.step_id}.{undo.seq} {undo.description}" for undo in restored.undos)
    return lines


def _steps_and_edges(restored: Restored) -> list[str]:
    """Each step (arguments, output), then the `edges (N):` between them."""
    lines = []
    for step_id, step in sorted(restored.steps.items()):
        lines.append(f"  {step_id}. {step.tool_name} {_cut(canonical_dumps(step.arguments))}")
        lines.append(f"     -> {_cut(canonical_dumps(step.output))}")
    edges = _graph_of(restored).edges()
    lines.append(f"edges ({len(edges)}):")
    lines.extend(
        f"  step {edge.source} -> step {edge.target}  "
        f"{edge.source_key} -> {edge.target_key}  ({edge.kind.value})"
        for edge in edges
    )
    return lines


def uk_time(at: object) -> str:
    """A stored time (seconds since the epoch) as a UK date with its zone named, e.g.
    "1 Dec 2026 21:40:05 GMT" (or BST in summer); "-" if there is none."""
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return "-"
    try:
        from zoneinfo import ZoneInfo  # noqa: PLC0415  (only this command needs it)

        zone: dt.tzinfo = ZoneInfo("Europe/London")
    except (ImportError, LookupError, OSError):  # no time zone database: say UTC
        zone = dt.timezone.utc
    try:
        moment = dt.datetime.fromtimestamp(at, zone)
    except (OverflowError, OSError, ValueError):
        return "-"
    return f"{moment.day} {moment:%b %Y %H:%M:%S} {moment.tzname()}"


_NO_RUNS: Final = "no plan runs"


def _plan_list(store: SQLiteStore, wait: float, *, limit: int = 100) -> list[str]:
    """The lines of `plans DB`: each run (the last `limit`), the last changed first."""
    runs = _patiently(wait, lambda: store.plan_runs(limit))
    if not runs:
        return [_NO_RUNS]
    lines = [f"{'RUN':<34} {'STATUS':<10} {'NODES':<40} UPDATED"]
    for run_id, status, updated_at in runs:
        try:
            image = _patiently(wait, functools.partial(store.read_plan, run_id))
        except TransactionNotFound:
            continue
        counts: dict[str, int] = {}
        for node in image.nodes:
            counts[node.state] = counts.get(node.state, 0) + 1
        nodes = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        lines.append(
            f"{_cut(run_id, 34):<34} {status:<10} {_cut(nodes, 40):<40} {uk_time(updated_at)}"
        )
    return lines


def _plan_shown(image: PlanImage, fmt: str) -> list[str]:
    """The lines of `plans DB RUN`: the run and each node, or its graph in `fmt`."""
    record, nodes = read_run(image)
    plan_json = record.get("plan")
    if fmt != "text":
        plan = Plan.from_json(plan_json)
        ids = {node.id: f"n{index}" for index, node in enumerate(plan.nodes)}
        drawn = [
            DrawnNode(ids[node.id], f"{node.id}: {node.tool}", _drawn_state(nodes, node.id))
            for node in plan.nodes
        ]
        edges = [
            DrawnEdge(ids[before], ids[node.id], "after" if before in node.after else "value")
            for node in plan.nodes
            for before in sorted(plan.prerequisites(node.id))
        ]
        return render_graph(drawn, edges, fmt).rstrip("\n").split("\n")
    lines = [
        f"plan run {image.run_id}: {image.status}",
        f"  plan version {record.get('plan_version', '?')}",
        f"  started {uk_time(image.created_at)}, last change {uk_time(image.updated_at)}",
    ]
    if image.cancel is not None:
        lines.append(f"  cancelled: {image.cancel}")
    lines.append(
        f"  {'NODE':<24} {'STATE':<10} {'WAITS':>5} {'TRIES':>5} {'RETRIES':>7}  "
        f"{'STARTED':<24} FINISHED"
    )
    order = [node["id"] for node in plan_json["nodes"]] if isinstance(plan_json, dict) else []
    for node_id in order or sorted(nodes):
        stored = nodes[node_id]
        fields = stored.record
        lines.append(
            f"  {_cut(node_id, 24):<24} {stored.state:<10} {fields.get('unresolved', 0):>5} "
            f"{fields.get('number', 0):>5} {fields.get('retries', 0):>7}  "
            f"{uk_time(fields.get('started_at')):<24} {uk_time(fields.get('finished_at'))}"
        )
        if stored.error:
            lines.append(f"      error: {_cut(str(stored.error))}")
    return lines


def _drawn_state(nodes: dict[str, StoredNode], node_id: str) -> str:
    stored = nodes.get(node_id)
    return "pending" if stored is None else stored.state.lower()


def _render(graph: DependencyGraph | LineageGraph, fmt: str) -> str:
    """A graph in one of `FORMATS`: both graph kinds export the same three."""
    return {"dot": graph.to_dot, "mermaid": graph.to_mermaid, "json": graph.to_json}[fmt]()


def _cut(text: str, width: int = WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _printable(text: str, *, json_text: bool = False) -> str:
    """`text` with every character a terminal could act on escaped (see `_escapes`); the one
    place that makes text safe to print, applied to every line the command line prints."""
    return text.translate(_JSON_ESCAPES if json_text else _TEXT_ESCAPES)


def _say(line: str, *, stream: TextIO | None = None) -> None:
    """Print one line, escaped: a newline inside it is shown as `\\n`, not obeyed."""
    _write(_printable(line) + "\n", sys.stdout if stream is None else stream)


def _say_block(text: str, *, json_text: bool) -> None:
    """Print a rendered graph: its lines as lines, each escaped (as JSON escapes, for JSON)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    _write("".join(_printable(line, json_text=json_text) + "\n" for line in lines), sys.stdout)


def _write(text: str, stream: TextIO) -> None:
    """Write `text`, with what the stream's encoding cannot hold as backslash escapes."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
    stream.flush()


# ---------------------------------------------------------------------- approvals and reviews


def _add_approval_commands(commands: argparse._SubParsersAction[_Parser]) -> None:
    approvals = commands.add_parser(
        "approvals",
        help="list the approval requests and reviews waiting for a person",
        description="Each pending approval request (id, transaction or plan run, step or node, "
        "tool, arguments, when asked) and each pending review of a call whose outcome is "
        "unknown (id, where, tool, idempotency key, and the evidence). Read-only.",
    )
    approvals.add_argument("db", metavar="DB", help="the SQLite file")
    _add_wait(approvals)
    approvals.set_defaults(run=_run_approvals)

    approve = commands.add_parser(
        "approve",
        help="approve a pending request: its call then runs once",
        description="Approve request REQUEST as NAME. The call runs once, when the agent sends "
        "it again (in whichever process holds the transaction). Writes the decision.",
    )
    approve.add_argument("db", metavar="DB", help="the SQLite file")
    approve.add_argument("request", metavar="REQUEST", help="an approval request id")
    approve.add_argument("--actor", required=True, metavar="NAME", help="who approves")
    approve.add_argument(
        "--expires-in", type=_seconds, metavar="SECONDS", help="how long the approval lasts"
    )
    approve.add_argument("--note", default="", help="a note kept with the approval")
    approve.set_defaults(run=_run_approve)

    reject = commands.add_parser(
        "reject",
        help="reject a pending request: the agent is told why",
        description="Reject request REQUEST as NAME for REASON: the step fails with a hint "
        "carrying the reason when the agent sends the call again. Writes the decision.",
    )
    reject.add_argument("db", metavar="DB", help="the SQLite file")
    reject.add_argument("request", metavar="REQUEST", help="an approval request id")
    reject.add_argument("--actor", required=True, metavar="NAME", help="who rejects")
    reject.add_argument("--reason", required=True, help="why (told to the agent)")
    reject.set_defaults(run=_run_reject)

    review = commands.add_parser(
        "review",
        help="resolve a pending review: did the call happen?",
        description="Resolve review REVIEW as NAME: done (with the call's output, as JSON) or "
        "not_done (the call runs again with the same idempotency key). Writes the decision.",
    )
    review.add_argument("db", metavar="DB", help="the SQLite file")
    review.add_argument("review", metavar="REVIEW", help="a review id")
    review.add_argument("--outcome", required=True, choices=("done", "not_done"))
    review.add_argument("--output", default="null", metavar="JSON", help="the call's output")
    review.add_argument("--actor", required=True, metavar="NAME", help="who decides")
    review.set_defaults(run=_run_review)


def _run_approvals(args: argparse.Namespace) -> None:
    store = _open(args.db, args.wait)
    try:
        book = requests_for(store)
        alive = _patiently(args.wait, lambda: scopes_alive(store))
        requests = _patiently(args.wait, lambda: book.pending_approvals(alive=alive))
        reviews = _patiently(args.wait, lambda: book.pending_reviews(alive=alive))
    except AgentTxError as exc:
        raise _Failure(str(exc)) from None
    finally:
        store.close()
    for line in _approval_lines(requests, reviews):
        _say(line)


def _where(scope: str, scope_id: str, step: int | None, node: str | None) -> str:
    place = f"step {step}" if step is not None else f"node {node}"
    return f"{place} of {'plan run' if scope == 'plan' else 'transaction'} {scope_id}"


def _approval_lines(requests: Sequence[ApprovalRequest], reviews: Sequence[Review]) -> list[str]:
    """The lines of `approvals DB`: pending requests, then pending reviews, oldest first."""
    lines = [f"{len(requests)} approval request(s) pending" + (":" if requests else "")]
    for request in requests:
        where = _where(request.scope, request.scope_id, request.step, request.node)
        lines.append(f"  {request.id}  {request.tool}  {where}")
        lines.append(f"    arguments {_cut(canonical_dumps(request.arguments))}")
        lines.append(f"    asked {uk_time(request.requested_at.timestamp())}")
    lines.append(f"{len(reviews)} review(s) pending" + (":" if reviews else ""))
    for review in reviews:
        where = _where(review.scope, review.scope_id, review.step, review.node)
        lines.append(f"  {review.id}  {review.tool}  {where}")
        lines.append(f"    arguments {_cut(canonical_dumps(review.arguments))}")
        lines.append(f"    idempotency key {review.idempotency_key}")
        lines.extend(f"    - {_cut(error)}" for error in review.errors)
    return lines


@contextlib.contextmanager
def _writable(db: str) -> Iterator[SQLiteStore]:
    if not Path(db).exists():
        raise _Failure(f"no such file: {db}")
    try:
        store = SQLiteStore(db)
    except AgentTxError as exc:
        raise _Failure(str(exc)) from None
    try:
        yield store
    except AgentTxError as exc:
        raise _Failure(f"{exc} ({exc.code})") from None
    finally:
        store.close()


def _run_approve(args: argparse.Namespace) -> None:
    with _writable(args.db) as store:
        approval = requests_for(store).approve(
            args.request, actor=args.actor, expires_in=args.expires_in, note=args.note
        )
    until = (
        "" if approval.expires_at is None else f", until {uk_time(approval.expires_at.timestamp())}"
    )
    _say(f"approved {approval.request_id} by {approval.actor}{until}")


def _run_reject(args: argparse.Namespace) -> None:
    with _writable(args.db) as store:
        requests_for(store).reject(args.request, actor=args.actor, reason=args.reason)
    _say(f"rejected {args.request} by {args.actor}: {args.reason}")


def _run_review(args: argparse.Namespace) -> None:
    try:
        output = json.loads(args.output)
    except ValueError as exc:
        raise _Failure(f"--output is not JSON: {exc}") from None
    with _writable(args.db) as store:
        requests_for(store).resolve_review(
            args.review, outcome=args.outcome, output=output, actor=args.actor
        )
    _say(f"review {args.review} resolved {args.outcome} by {args.actor}")
