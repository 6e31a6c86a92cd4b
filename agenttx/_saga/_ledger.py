"""Undo records and their compensation.

Undo records are kept in step order and compensated newest first. Each compensation gets up
to `attempts` tries, `backoff` apart (10 ms, 20 ms, 40 ms, ... by default), each under a
deadline of `timeout` seconds. A failure never stops the others, is reported, and the record is
kept (`SagaLedger.failed`) rather than forgotten, so it can be retried and is still visible after
a commit.

A compensation that does not return by its deadline is abandoned on its worker thread (an async
one is cancelled) and the attempt counts as failed ("timed out after N ms"). It may still be
running when its next attempt is due: then the record is not tried again (two runs of one undo
at once could interleave), it is kept as failed ("still running after timeout"), and
`SagaLedger.running` lists it until it ends. Compensations must therefore be idempotent: an
abandoned run may still finish, and recovery may run the record again.
"""

from __future__ import annotations

import contextlib
import inspect
import time
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from .._errors import InvalidArgument
from ._attempts import DEFAULT_TIMEOUT, Attempt, Work, adrive, check_timeout, describe, drive
from ._backoff import Backoff

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

    from .._tools import Compensation, UndoRecord

__all__ = ["COMPENSATION_BACKOFF", "STILL_RUNNING", "CompensationReport", "SagaLedger"]

#: Waits between the attempts at one compensation: 10 ms doubling, capped at 2.56 s.
COMPENSATION_BACKOFF: Final = Backoff(base=0.010, max_wait=0.010 * 2**8)
#: Why a record was not tried (again): an earlier attempt at it has not ended.
STILL_RUNNING: Final = "still running after timeout"


@final
@attrs.frozen(kw_only=True)
class CompensationReport:
    """How many compensations succeeded, and a line per one that failed for good.

    `ran` names each one that succeeded, as `(step, kind)` of its undo record, in the order run.
    """

    succeeded: int = 0
    failures: tuple[str, ...] = ()
    ran: tuple[tuple[int, str], ...] = ()


def _check_attempts(_: object, __: object, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"compensation_retries must be an integer, got {value!r}")
    if value < 1:
        raise InvalidArgument("compensation_retries must be >= 1")


def _check_backoff(_: object, __: object, value: object) -> None:
    if not isinstance(value, Backoff):
        raise InvalidArgument(f"backoff must be a Backoff, got {value!r}")


def _compensation_timeout(value: object) -> float:
    return check_timeout("compensation_timeout", value)


def _held_weakly(
    callback: Callable[[UndoRecord, str | None], object] | None,
) -> Callable[[UndoRecord, str | None], object] | None:
    """`callback`, through a weak reference if it is a bound method (see `on_outcome`)."""
    if callback is None or not inspect.ismethod(callback):
        return callback
    method = weakref.WeakMethod(callback)

    def call(record: UndoRecord, error: str | None) -> None:
        bound = method()
        if bound is not None:
            bound(record, error)

    return call


@attrs.define(kw_only=True, eq=False, repr=False)
class SagaLedger:
    """The undo records of one transaction's live steps, plus those that failed to run.

    Not thread-safe: the transaction calls it under its lock (`acompensate` runs outside it, on
    records already taken out with `take_from`).
    """

    attempts: int = attrs.field(default=3, validator=_check_attempts)
    backoff: Backoff = attrs.field(default=COMPENSATION_BACKOFF, validator=_check_backoff)
    timeout: float = attrs.field(default=DEFAULT_TIMEOUT, converter=_compensation_timeout)
    #: Called with each record whose compensation succeeded (a durable store forgets it).
    on_compensated: Callable[[UndoRecord], object] | None = None
    #: Called with each record run and its error (None when it succeeded), after
    #: `on_compensated`; for the audit trail. It must not raise. A bound method is held
    #: weakly: the ledger never keeps its owner alive (no cycle for the collector to find).
    on_outcome: Callable[[UndoRecord, str | None], object] | None = attrs.field(
        default=None, converter=_held_weakly, on_setattr=attrs.setters.convert
    )
    _records: list[UndoRecord] = attrs.field(init=False, factory=list)
    _failed: list[tuple[UndoRecord, str]] = attrs.field(init=False, factory=list)
    # Attempts that may outlive their deadline, with their record; pruned when they end.
    _in_flight: list[tuple[UndoRecord, Attempt]] = attrs.field(init=False, factory=list)

    def __repr__(self) -> str:  # never the records: they hold tool arguments
        return f"<SagaLedger pending={len(self._records)} failed={len(self._failed)}>"

    @property
    def failed(self) -> tuple[tuple[UndoRecord, str], ...]:
        """Records whose compensation failed for good, with the last error, oldest first."""
        return tuple(self._failed)

    @property
    def running(self) -> tuple[UndoRecord, ...]:
        """Records with an attempt still running past its deadline or an interrupt, oldest first."""
        self._in_flight = [
            (record, attempt) for record, attempt in self._in_flight if attempt.running
        ]
        return tuple(record for record, _ in self._in_flight)

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
        """Run `records` in the order given, each on a worker thread; see the module docstring.

        Returns within about `attempts * timeout` seconds plus the backoff per record, whatever
        the compensations do. If a compensation raises a BaseException (KeyboardInterrupt,
        cancellation), that record and the ones not yet run are kept as failed (`interrupted`)
        and the exception propagates.
        """
        return drive(self._compensating(records, compensations), sleep)

    async def acompensate(
        self, records: Sequence[UndoRecord], compensations: Mapping[str, Compensation[Any, Any]]
    ) -> CompensationReport:
        """`compensate` for async callers: a sync compensation runs on a worker thread, an async
        one on the running loop (cancelled at its deadline); the loop is never blocked."""
        return await adrive(self._compensating(records, compensations))

    def _compensating(
        self, records: Sequence[UndoRecord], compensations: Mapping[str, Compensation[Any, Any]]
    ) -> Work[CompensationReport]:
        """The plan of `compensate`: each record's attempts in turn, then the report."""
        ran: list[tuple[int, str]] = []
        failures: list[str] = []
        for index, record in enumerate(records):
            with self._interruptible(records, index):
                error = yield from self._tries(record, partial(_start, record, compensations))
            if error is None:
                ran.append((record.step_id, record.kind))
                try:
                    if self.on_compensated is not None:
                        self.on_compensated(record)
                except Exception as exc:
                    # The store failed (or another process took the transaction over): the
                    # compensated record stays in it, and the others are kept, not run, so that
                    # the next recovery (or the new owner) runs each of them.
                    self.keep_failed(records[index + 1 :], f"not run: {describe(exc)}")
                    raise
            else:
                self._failed.append((record, error))
                failures.append(f"{record.description}: {error}")
            if self.on_outcome is not None:
                self.on_outcome(record, error)
        return CompensationReport(succeeded=len(ran), failures=tuple(failures), ran=tuple(ran))

    def _tries(self, record: UndoRecord, undo: Callable[[], object]) -> Work[str | None]:
        """Up to `attempts` attempts at `record`, `backoff` apart; the last error, or None.

        No attempt starts while an earlier attempt at the same record is still running.
        """
        error: str | None = None
        for number in range(1, self.attempts + 1):
            if number > 1:
                yield self.backoff.delay(number - 1)
            if any(kept is record for kept in self.running):
                reason = f"{STILL_RUNNING}: not tried again"
                return reason if error is None else f"{error}, {reason}"
            attempt = Attempt(undo, self.timeout)
            self._in_flight.append((record, attempt))
            error = yield attempt
            if error is None:
                return None
        return error


def _start(record: UndoRecord, compensations: Mapping[str, Compensation[Any, Any]]) -> object:
    """Call the record's undo; may return an awaitable. Raises what the undo raises."""
    if record.action is not None:
        return record.action()
    compensation = compensations.get(record.kind)
    if compensation is None:
        raise LookupError(f"no compensation registered for kind `{record.kind}`")
    return compensation(record.payload)
