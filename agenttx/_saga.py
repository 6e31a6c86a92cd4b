"""The Saga side of a transaction: undo records, their compensation, and staged effects.

Undo records are kept in step order and compensated newest first. Each compensation gets up
to `attempts` tries with exponential backoff (10 ms, 20 ms, 40 ms, ...); a failure never stops
the others, is reported, and the record is kept (`SagaLedger.failed`) rather than forgotten, so
it can be retried and is still visible after a commit. Staged effects are dispatched only after
a commit, in staging order; dispatch errors are reported and never undo the commit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeGuard, final

import attrs

from ._errors import InvalidArgument
from ._tools import StagedEffect

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    from ._tools import Compensation, UndoRecord
    from .stores import DurableStore, OutboxEntry

__all__ = [
    "CompensationReport",
    "EffectDispatcher",
    "OutboxDispatcher",
    "SagaLedger",
    "dispatch_effects",
    "resolve_awaitable",
]

BACKOFF_BASE: Final = 0.010  # seconds; doubled per attempt, capped at 2**8 times


@final
@attrs.frozen(kw_only=True)
class CompensationReport:
    """How many compensations succeeded, and a line per one that failed for good."""

    succeeded: int = 0
    failures: tuple[str, ...] = ()


_PLAIN: Final = frozenset({dict, list, str, int, float, bool})


def is_awaitable(value: object) -> TypeGuard[Awaitable[object]]:
    """`inspect.isawaitable`, answered at once for the plain JSON values tools mostly return."""
    return value is not None and type(value) not in _PLAIN and inspect.isawaitable(value)


def resolve_awaitable(value: object) -> object:
    """Run `value` to completion if it is awaitable, from synchronous code.

    With no event loop running in this thread the awaitable runs on a fresh loop; inside a
    running loop (sync code called from async code) it runs on a loop in a helper thread, so
    the caller's loop is never re-entered.
    """
    if not is_awaitable(value):
        return value
    awaitable: Awaitable[object] = value

    async def wait() -> object:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()


@attrs.define
class SagaLedger:
    """The undo records of one transaction's live steps, plus those that failed to run."""

    attempts: int = 3
    backoff: float = BACKOFF_BASE
    #: Called with each record whose compensation succeeded (a durable store forgets it).
    on_compensated: Callable[[UndoRecord], object] | None = None
    _records: list[UndoRecord] = attrs.field(init=False, factory=list)
    _failed: list[tuple[UndoRecord, str]] = attrs.field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise InvalidArgument(f"compensation_retries must be an integer, got {self.attempts!r}")
        if self.attempts < 1:
            raise InvalidArgument("compensation_retries must be >= 1")

    @property
    def failed(self) -> tuple[tuple[UndoRecord, str], ...]:
        """Records whose compensation failed every attempt, with the last error, oldest first."""
        return tuple(self._failed)

    def pending(self) -> tuple[UndoRecord, ...]:
        """The records of live steps, in the order they were recorded."""
        return tuple(self._records)

    def record(self, records: Iterable[UndoRecord]) -> None:
        """Keep `records` (all from one step, in registration order)."""
        self._records.extend(records)

    def keep_failed(self, records: Sequence[UndoRecord], reason: str) -> None:
        """Keep `records` as failed with `reason`, without running them (for recovery)."""
        self._failed.extend((record, reason) for record in records)

    @contextlib.contextmanager
    def _interruptible(self, records: Sequence[UndoRecord], index: int) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            reason = f"interrupted by {type(exc).__name__}"
            self.keep_failed(records[index : index + 1], reason)
            self.keep_failed(records[index + 1 :], f"not run: {reason}")
            raise

    def take_from(self, step: int) -> list[UndoRecord]:
        """Remove and return the records of steps >= `step`, newest first."""
        cut = len(self._records)
        while cut and self._records[cut - 1].step_id >= step:
            cut -= 1
        taken = self._records[cut:]
        del self._records[cut:]
        taken.reverse()
        return taken

    def forget_all(self) -> None:
        """Drop the records of live steps (after a commit: nothing is compensated any more)."""
        self._records.clear()

    def compensate(
        self,
        records: Sequence[UndoRecord],
        compensations: Mapping[str, Compensation[Any, Any]],
        *,
        sleep: Callable[[float], object] = time.sleep,
    ) -> CompensationReport:
        """Run `records` in the order given; see the module docstring.

        If a compensation raises a BaseException (KeyboardInterrupt, cancellation), that record
        and the ones not yet run are kept as failed (`interrupted`) and the exception propagates.
        """
        succeeded = 0
        failures: list[str] = []
        for index, record in enumerate(records):
            error: str | None = None
            with self._interruptible(records, index):
                for attempt in range(self.attempts):
                    error = _run_once(record, compensations, resolve_awaitable)
                    if error is None:
                        break
                    if attempt + 1 < self.attempts:
                        sleep(self.backoff * (1 << min(attempt, 8)))
            if error is None:
                succeeded += 1
                if self.on_compensated is not None:
                    self.on_compensated(record)
            else:
                self._failed.append((record, error))
                failures.append(f"{record.description}: {error}")
        return CompensationReport(succeeded=succeeded, failures=tuple(failures))

    async def acompensate(
        self, records: Sequence[UndoRecord], compensations: Mapping[str, Compensation[Any, Any]]
    ) -> CompensationReport:
        """`compensate` for async callers: awaits async compensations on the running loop."""
        succeeded = 0
        failures: list[str] = []
        for index, record in enumerate(records):
            error: str | None = None
            with self._interruptible(records, index):
                for attempt in range(self.attempts):
                    error = await _arun_once(record, compensations)
                    if error is None:
                        break
                    if attempt + 1 < self.attempts:
                        await asyncio.sleep(self.backoff * (1 << min(attempt, 8)))
            if error is None:
                succeeded += 1
                if self.on_compensated is not None:
                    self.on_compensated(record)
            else:
                self._failed.append((record, error))
                failures.append(f"{record.description}: {error}")
        return CompensationReport(succeeded=succeeded, failures=tuple(failures))


def _start(record: UndoRecord, compensations: Mapping[str, Compensation[Any, Any]]) -> object:
    """Call the record's undo; may return an awaitable. Raises what the undo raises."""
    if record.action is not None:
        return record.action()
    compensation = compensations.get(record.kind)
    if compensation is None:
        raise LookupError(f"no compensation registered for kind `{record.kind}`")
    return compensation(record.payload)


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _run_once(
    record: UndoRecord,
    compensations: Mapping[str, Compensation[Any, Any]],
    finish: Callable[[object], object],
) -> str | None:
    try:
        finish(_start(record, compensations))
    except Exception as exc:  # noqa: BLE001  (a compensation's failure is data: it is reported)
        return _describe(exc)
    return None


async def _arun_once(
    record: UndoRecord, compensations: Mapping[str, Compensation[Any, Any]]
) -> str | None:
    try:
        result = _start(record, compensations)
        if is_awaitable(result):
            await result
    except Exception as exc:  # noqa: BLE001
        return _describe(exc)
    return None


# ---------------------------------------------------------------------- dispatch


class EffectDispatcher(Protocol):
    """Delivers one committed staged effect.

    Called after the commit is durable, once per effect, in staging order, from the thread
    that committed. It may raise: the error is reported in `CommitResult.dispatch_errors` and
    the commit stands. It should be idempotent on `effect.idempotency_key`, which is stable.
    """

    def __call__(self, effect: StagedEffect, /) -> object: ...


@final
class OutboxDispatcher:
    """Appends each effect as one fsync'd JSON line to a local file, for a relay to deliver.

    Each line is `{"tx_id", "committed_at_ms", "step_id", "channel", "payload",
    "idempotency_key"}`. Parent directories are created; writers in one process are
    serialized.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()

    def __call__(self, effect: StagedEffect, /) -> None:
        line = json.dumps(
            {
                "tx_id": effect.tx_id,
                "committed_at_ms": int(time.time() * 1000),
                "step_id": effect.step_id,
                "channel": effect.channel,
                "payload": effect.payload,
                "idempotency_key": effect.idempotency_key,
            },
            separators=(",", ":"),
            sort_keys=True,
            ensure_ascii=False,
        )
        with self._lock:
            path = Path(self.path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a", encoding="utf-8") as outbox:
                    outbox.write(line + "\n")
                    outbox.flush()
                    os.fsync(outbox.fileno())
            except OSError as exc:
                raise OSError(f"open outbox {self.path}: {exc}") from exc

    def __repr__(self) -> str:
        return f"OutboxDispatcher({self.path!r})"


Dispatcher = EffectDispatcher | Callable[..., object] | Mapping[str, Callable[..., object]]


def dispatch_effects(
    effects: Sequence[StagedEffect], dispatcher: Dispatcher | None
) -> tuple[int, tuple[str, ...]]:
    """Deliver `effects` in order; return how many were delivered and an error line per failure."""
    if dispatcher is None:
        return 0, ()
    delivered = 0
    errors: list[str] = []
    for effect in effects:
        error = _deliver(effect, dispatcher)
        if error is None:
            delivered += 1
        else:
            errors.append(_dispatch_error(effect, error))
    return delivered, tuple(errors)


def _deliver(effect: StagedEffect, dispatcher: Dispatcher) -> str | None:
    """Deliver one effect; return None, or the error."""
    target: Callable[..., object] | None
    target = dispatcher.get(effect.channel) if isinstance(dispatcher, Mapping) else dispatcher
    if target is None:
        return f"no dispatcher for channel `{effect.channel}`"
    try:
        resolve_awaitable(target(effect))
    except Exception as exc:  # noqa: BLE001  (reported; the commit stands)
        return _describe(exc)
    return None


def _dispatch_error(effect: StagedEffect, error: str) -> str:
    return f"{effect.channel} effect {effect.idempotency_key} (step {effect.step_id}): {error}"


#: Outbox retries wait `OUTBOX_BACKOFF * 2**(attempts - 1)` seconds, at most `OUTBOX_MAX_WAIT`.
OUTBOX_BACKOFF: Final = 0.5
OUTBOX_MAX_WAIT: Final = 300.0


def outbox_effect(entry: OutboxEntry) -> StagedEffect:
    """The staged effect an outbox entry holds."""
    return StagedEffect(
        tx_id=entry.tx_id,
        step_id=entry.step_id,
        channel=entry.channel,
        payload=json.loads(entry.payload),
        idempotency_key=entry.idempotency_key,
    )


def deliver_outbox(
    store: DurableStore,
    dispatcher: Dispatcher,
    *,
    tx_id: str | None = None,
    limit: int = 1000,
    clock: Callable[[], float] = time.time,
) -> tuple[int, tuple[str, ...]]:
    """Deliver the due outbox entries (of one transaction, or all) in commit and staging order.

    Each delivered entry is marked delivered; each failure is counted, keeps its error and
    waits a bounded, doubling backoff before it is offered again. A failure does not hold back
    the entries after it. Returns how many were delivered and an error line per failure. The
    store's own errors (`StorageError`) propagate: the entries stay pending.
    """
    now = clock()
    delivered = 0
    errors: list[str] = []
    for entry in store.pending_effects(limit, tx_id=tx_id):
        if entry.not_before > now:
            continue
        effect = outbox_effect(entry)
        error = _deliver(effect, dispatcher)
        if error is None:
            store.mark_delivered(entry.id)
            delivered += 1
        else:
            wait = min(OUTBOX_BACKOFF * (1 << min(entry.attempts, 20)), OUTBOX_MAX_WAIT)
            store.mark_failed(entry.id, error, now + wait)
            errors.append(_dispatch_error(effect, error))
    return delivered, tuple(errors)
