"""Reading a store for the command line: read-only, tried again while a writer holds it
locked (until `--wait` runs out), every problem turned into one line (`Failure`)."""

from __future__ import annotations

import math
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple, TypeVar

from .._errors import AgentTxError, InvalidArgument, StorageError, TransactionNotFound
from .._graph import DependencyGraph
from .._history import StepHistory
from .._results import AttemptStatus, TxStatus
from .._txlog import Ended, Restored, add_live_steps, read_history, read_image
from ._terminal import EXIT_ERROR, Failure

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..stores import EndedTransaction, TxImage
    from ._store import CliStore

__all__ = [
    "EndedFound",
    "age_of",
    "check_database_path",
    "ended_graph",
    "final_status",
    "graph_of",
    "is_busy",
    "live_steps",
    "patiently",
    "peek",
    "read_tx",
    "tx_status",
    "unreadable",
    "why_unreadable",
]

_T = TypeVar("_T")

#: SQLite's primary result codes for a lock held elsewhere: SQLITE_BUSY, SQLITE_LOCKED.
_BUSY_CODES: Final = frozenset({5, 6})
#: The longest pause between two tries of a busy read, in seconds.
_MAX_PAUSE: Final = 0.25


class EndedFound(NamedTuple):
    """An ended transaction kept as history, decoded: its row, its image as it ended (its
    steps: the live ones at the end) and its history (`None` if it ended without one)."""

    row: EndedTransaction
    restored: Restored
    ended: Ended | None


def check_database_path(db: str) -> None:
    """`Failure` unless `db` names a file (SQLite would call a directory a "disk I/O error")."""
    path = Path(db)
    if path.is_dir():
        raise Failure(f"{db} is a directory, not a SQLite database")
    if not path.exists():
        raise Failure(f"no such file: {db}")


def patiently(wait: float, read: Callable[[], _T]) -> _T:
    """`read()`, tried again while it finds the store locked, until `wait` seconds have passed;
    then `Failure`, status 1. Any other error is raised as it is. (SQLite waits for a lock
    within each try, up to the store's `busy_timeout`, but not in every case: a reader can be
    told the file is busy at once while a writer checkpoints or recovers it.)"""
    deadline = time.monotonic() + wait
    pause = 0.01
    while True:
        try:
            return read()
        except StorageError as exc:
            left = deadline - time.monotonic()
            if not is_busy(exc):
                raise
            if left <= 0:
                raise Failure(str(exc), status=EXIT_ERROR) from None
        time.sleep(min(pause, left))
        pause = min(2 * pause, _MAX_PAUSE)


def is_busy(exc: StorageError) -> bool:
    """Whether `exc` comes from SQLite finding the file locked by another connection."""
    cause = exc.__cause__
    if not isinstance(cause, sqlite3.OperationalError):
        return False
    code = getattr(cause, "sqlite_errorcode", None)
    if code is None:  # pragma: no cover - Python 3.10 has no sqlite_errorcode
        return "locked" in str(cause) or "busy" in str(cause)
    return code & 0xFF in _BUSY_CODES


def peek(store: CliStore, tx_id: str, wait: float) -> TxImage:
    """Transaction `tx_id`'s stored image. Raises `TransactionNotFound` if it has ended,
    `Failure` if the store stayed locked, and whatever reading corrupt rows raises."""
    return patiently(wait, lambda: store.peek(tx_id))


def read_tx(
    store: CliStore, tx_id: str, wait: float, *, name: str = "the store"
) -> Restored | EndedFound:
    """Open transaction `tx_id`, decoded; or, if it has ended, its history (`read_ended_tx`);
    `name` names the store in messages."""
    try:
        image = peek(store, tx_id, wait)
    except TransactionNotFound:
        return read_ended_tx(store, tx_id, wait, name=name)
    except InvalidArgument as exc:
        raise Failure(str(exc)) from None
    except Failure:
        raise
    except Exception as exc:  # noqa: BLE001 - corrupt rows may raise anything while decoded
        raise unreadable(tx_id, exc) from None
    if image.record == "null":
        raise Failure(f"transaction {tx_id} has begun but recorded nothing yet")
    try:
        return read_image(image)
    except Exception as exc:  # noqa: BLE001 - e.g. RecursionError from deeply nested rows
        raise unreadable(tx_id, exc) from None


def read_ended_tx(
    store: CliStore, tx_id: str, wait: float, *, name: str = "the store"
) -> EndedFound:
    """Ended transaction `tx_id` as the store keeps it, decoded; `Failure` if it keeps none."""
    try:
        row, image = patiently(wait, lambda: store.peek_ended(tx_id))
    except TransactionNotFound:
        raise Failure(
            f"no open or ended transaction {tx_id} in {name} (ended ones are kept as "
            "history within the store's retention)"
        ) from None
    except Failure:
        raise
    except Exception as exc:  # noqa: BLE001 - corrupt rows may raise anything while decoded
        raise unreadable(tx_id, exc) from None
    if image.record == "null":
        raise Failure(f"transaction {tx_id} ended without recording anything")
    try:
        return EndedFound(row, read_image(image), read_history(row.history))
    except Exception as exc:  # noqa: BLE001 - e.g. RecursionError from deeply nested rows
        raise unreadable(tx_id, exc) from None


def unreadable(tx_id: str, exc: Exception) -> Failure:
    return Failure(f"transaction {tx_id} is unreadable: {why_unreadable(exc)}")


def why_unreadable(exc: Exception) -> str:
    """What went wrong reading a transaction, for one line."""
    if isinstance(exc, RecursionError):
        return "its rows are nested too deeply"
    if isinstance(exc, AgentTxError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def graph_of(restored: Restored) -> DependencyGraph:
    graph = DependencyGraph()
    add_live_steps(graph, restored.steps, 1)
    return graph


def tx_status(restored: Restored) -> str:
    return "ACTIVE" if restored.ended is None else f"{restored.ended}, undos to retry"


def final_status(record: object, ended: Ended | None) -> str:
    """An ended transaction's final status: as its history says, else as its record says (it
    ended keeping undos), else unknown ("ENDED")."""
    if ended is not None:
        return ended.status
    status = record.get("ended") if isinstance(record, dict) else None
    return status if isinstance(status, str) else "ENDED"


def live_steps(ended: Ended | None) -> str:
    """How many steps were live when the transaction ended ("?" without a history)."""
    if ended is None:
        return "?"
    return str(sum(attempt.status is AttemptStatus.LIVE for attempt in ended.attempts))


def ended_graph(found: EndedFound, fmt: str) -> str:
    """An ended transaction's graph as its `export_graph` drew it when it ended: its live
    steps (none once aborted), and each attempt that failed or was undone, marked."""
    graph = DependencyGraph()
    if found.ended is not None and found.ended.status == TxStatus.COMMITTED.value:
        add_live_steps(graph, found.restored.steps, 1)
    attempts = () if found.ended is None else found.ended.attempts
    return StepHistory.of(attempts).export(graph, fmt)


def age_of(created_at: object) -> str:
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
