"""The calls a plan run walked away from while their tools still ran, until they return.

A sync tool runs on a worker thread, which nothing can interrupt: when its node times out, is
cancelled, or loses a sibling under `on_failure="cancel_all"` (or the run is aborted), the
attempt ends but the call goes on, and its effect may still land. Its undo records are kept
here with the call (`_tools.Orphan`) and wait for it: undoing before the effect lands would
undo nothing. Once the call has returned (`finished`), its undos apply, the declared
`compensate=` undo included if the tool returned, however late. The run waits for a node's
late calls before that node runs again (a retry never runs beside the call it retries), and
for all of them at its end, up to a bound; those still running then are reported.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    from .._tools import Orphan

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
    """A run's late calls (from its loop's thread, and the waits from a worker thread)."""

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: list[LateCall] = []

    def __bool__(self) -> bool:
        return bool(self._calls)

    def add(self, node: str, attempt: str, orphan: Orphan) -> None:
        """Keep `orphan`, a call of `node`'s `attempt` still running after it ended."""
        self._calls.append(LateCall(node, attempt, orphan))

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
