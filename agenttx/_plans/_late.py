"""The calls a plan run walked away from while their tools still ran, until they return.

A sync tool runs on a worker thread, which nothing can interrupt: when its node times out, is
cancelled, or loses a sibling under `on_failure="cancel_all"` (or the run is aborted), the
attempt ends but the call goes on, and its effect may still land. Its undo records are kept
here with the call (`_tools.Orphan`) and wait for it: undoing before the effect lands would
undo nothing. Once the call has returned (`finished`), its undos apply, the declared
`compensate=` undo included if the tool returned, however late; it is written to the run's
durable log as the call returns (`_tools.watch`), fenced by the run's lease, so a runner that
dies before settling it leaves it for recovery. The run waits for a node's
late calls before that node runs again (a retry never runs beside the call it retries), and
for all of them at its end, up to a bound; those still running then are reported.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from .._tools import UndoRecord, watch
from ._compensate import compensate_nodes
from ._results import PlanEventKind

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._json import JSONValue
    from .._tools import Compensation, Orphan
    from ._results import CompensationOutcome

__all__ = ["LATE_GRACE", "LateCall", "LateCalls"]

#: How long the end of a run waits, in all, for the calls its attempts walked away from (in
#: seconds), before it reports those still running.
LATE_GRACE: Final = 5.0


class LateCall(NamedTuple):
    """A call attempt `attempt` of node `node` walked away from while its tool still ran."""

    node: str
    attempt: str
    orphan: Orphan

    def returned(self) -> str:
        """What the call ended with, once finished: `"output"`, or `"error"` if it raised."""
        try:
            self.orphan.running.outcome()
        except Exception:  # noqa: BLE001  (only whether it raised matters here)
            return "error"
        return "output"


class LateCalls:
    """A run's late calls (from its loop's thread, and the waits from a worker thread).

    `keep(node, undos)` keeps undos with their node (compensated if the run fails),
    `record(kind, node=, attempt=, data=)` records an audit event, `compensations` are the
    run's by kind, `run` is whether compensations run (`compensate_on`), and `forget()` gives
    what forgets a compensated undo record on a durable log, if any.
    """

    __slots__ = (
        "_calls",
        "_compensations",
        "_forget",
        "_keep",
        "_record",
        "_run",
        "_unrecorded",
    )

    def __init__(
        self,
        *,
        keep: Callable[[str, tuple[UndoRecord, ...]], None],
        record: Callable[..., None],
        compensations: Mapping[str, Compensation[Any, Any]],
        run: bool,
        forget: Callable[[], Callable[[UndoRecord], object] | None],
    ) -> None:
        self._calls: list[LateCall] = []
        #: The undos of returned calls that could not be written (a lost lease): reported at
        #: the run's end with the stranded ones, never run.
        self._unrecorded: list[tuple[str, UndoRecord]] = []
        self._keep = keep
        self._record = record
        self._compensations = compensations
        self._run = run
        self._forget = forget

    def __bool__(self) -> bool:
        return bool(self._calls)

    def add(self, node: str, attempt: str, orphan: Orphan) -> None:
        """Keep `orphan`, a call of `node`'s `attempt` still running after it ended; its undo
        is written as it returns."""
        self._calls.append(LateCall(node, attempt, watch(orphan)))

    def of(self, node: str) -> bool:
        """Whether `node` has a late call kept (finished or not)."""
        return any(call.node == node for call in self._calls)

    def bound(self) -> float:
        """How long the run's end waits for its late calls (`LATE_GRACE`)."""
        return LATE_GRACE

    def wait(self, timeout: float, node: str | None = None) -> None:
        """Wait up to `timeout` seconds in all for the late calls (of `node`, if given)."""
        deadline = time.monotonic() + timeout
        for call in list(self._calls):
            if node is None or call.node == node:
                call.orphan.running.wait(deadline - time.monotonic())

    async def await_wait(self, timeout: float, node: str | None = None) -> None:
        """`wait` for the run's loop: it goes on meanwhile."""
        import asyncio  # noqa: PLC0415  (`import agenttx` does not load asyncio)

        await asyncio.to_thread(self.wait, timeout, node)

    def take_finished(self, node: str | None = None) -> list[LateCall]:
        """Forget the late calls (of `node`, if given) that have returned; them, oldest first."""
        finished = [
            call
            for call in self._calls
            if (node is None or call.node == node) and call.orphan.running.wait(0.0)
        ]
        if finished:
            self._calls = [call for call in self._calls if call not in finished]
        return finished

    def running(self, node: str | None = None) -> bool:
        """Whether a late call (of `node`, if given) is still running."""
        return any(node is None or call.node == node for call in self._calls)

    def give_up(self) -> list[LateCall]:
        """Forget the late calls still running (the run ends without them); them."""
        calls, self._calls = self._calls, []
        return calls

    async def settle(
        self, node: str | None, wait: float
    ) -> tuple[bool, tuple[CompensationOutcome, ...]]:
        """Wait up to `wait` seconds for the late calls (of `node`, if given); for each that
        has returned, record its late result, then keep its undos (a call a person or its
        status check decides: with its node's, `held`) or compensate them (any other: its
        attempt did not succeed). Whether one still runs, and the compensations."""
        await self.await_wait(wait, node)
        undos: list[tuple[float, str, UndoRecord]] = []
        now = time.monotonic()
        for call in self.take_finished(node):
            records = call.orphan.finished_undos()
            error = call.orphan.unrecorded()
            data: dict[str, JSONValue] = {
                "late": call.returned(),
                "undos": len(records),
                "kept": call.orphan.held and error is None,
            }
            if error is not None:
                data["unrecorded"] = f"{type(error).__name__}: {error}"
            self._record(
                PlanEventKind.LATE_RESULT_REFUSED, node=call.node, attempt=call.attempt, data=data
            )
            if error is not None:  # this runner may have lost the run: reported, never run
                self._unrecorded.extend((call.node, undo) for undo in records)
            elif call.orphan.held:
                self._keep(call.node, records)
            else:
                undos.extend((now, call.node, undo) for undo in records)
        compensated: tuple[CompensationOutcome, ...] = ()
        if undos:
            compensated = await compensate_nodes(
                undos,
                (),
                self._compensations,
                run=self._run,
                record=self._record,
                on_compensated=self._forget(),
            )
        return self.running(node), compensated

    async def end(
        self, *, lost: bool
    ) -> tuple[tuple[CompensationOutcome, ...], list[tuple[str, UndoRecord]]]:
        """At the run's end: wait for every late call, up to `bound()`, and settle those that
        returned (`settle`); then forget those still running (a runner that `lost` the run
        waits for none). The compensations, and the undos of the calls still running, with
        the undo each one's tool declares (reported, undone by nobody)."""
        late: tuple[CompensationOutcome, ...] = ()
        if not lost:
            _, late = await self.settle(None, self.bound())
        stranded, self._unrecorded = self._unrecorded, []
        for call in self.give_up():
            orphan = call.orphan
            left = None if orphan.returned is None else orphan.returned.close()
            if left is not None:  # it returned meanwhile: what it left, written
                stranded.extend((call.node, undo) for undo in left)
                continue
            undos = orphan.undos
            kind = orphan.call.tool.compensation_name
            if kind is not None:  # its tool may yet return: the undo it declares, reported
                undos += (
                    UndoRecord(
                        step_id=orphan.call.step_id,
                        seq=orphan.call.seq_base + len(undos),
                        kind=kind,
                        payload={"arguments": orphan.call.arguments, "output": None},
                        description=f"{kind} for node {call.node} (its call still runs)",
                    ),
                )
            stranded.extend((call.node, undo) for undo in undos)
        return late, stranded
