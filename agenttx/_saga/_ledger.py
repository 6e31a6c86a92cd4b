"""Undo records and their compensation.

Undo records are kept in step order and compensated newest first. Each compensation gets up
to `attempts` tries with exponential backoff (10 ms, 20 ms, 40 ms, ...); a failure never stops
the others, is reported, and the record is kept (`SagaLedger.failed`) rather than forgotten, so
it can be retried and is still visible after a commit.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from .._errors import InvalidArgument
from .._tools import is_awaitable, resolve_awaitable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

    from .._tools import Compensation, UndoRecord

__all__ = ["BACKOFF_BASE", "CompensationReport", "SagaLedger", "describe"]

BACKOFF_BASE: Final = 0.010  # seconds; doubled per attempt, capped at 2**8 times


@final
@attrs.frozen(kw_only=True)
class CompensationReport:
    """How many compensations succeeded, and a line per one that failed for good."""

    succeeded: int = 0
    failures: tuple[str, ...] = ()


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
                        import asyncio  # noqa: PLC0415  (not loaded by `import agenttx`)

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


def describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _run_once(
    record: UndoRecord,
    compensations: Mapping[str, Compensation[Any, Any]],
    finish: Callable[[object], object],
) -> str | None:
    try:
        finish(_start(record, compensations))
    except Exception as exc:  # noqa: BLE001  (a compensation's failure is data: it is reported)
        return describe(exc)
    return None


async def _arun_once(
    record: UndoRecord, compensations: Mapping[str, Compensation[Any, Any]]
) -> str | None:
    try:
        result = _start(record, compensations)
        if is_awaitable(result):
            await result
    except Exception as exc:  # noqa: BLE001
        return describe(exc)
    return None
