"""The two drivers of a guarded attempt: one for sync code, one for async code.

Both perform the same actions (`_gate.Run`, `AwaitReturn`, `Check`) and differ only in how
they wait: the sync driver calls `run_tool`, waits on the call and runs the status check in
the caller's thread; the async driver awaits `arun_tool` and runs the waits and the status
check (user code that may block) in a worker thread, so the event loop never stalls on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._approvals import check_outcome
from .._tools import arun_tool, run_tool, to_json_value
from ._gate import AwaitReturn, Check, Result, Run, Work

if TYPE_CHECKING:
    from .._tools import OutputSerializer

__all__ = ["adrive", "drive"]


def drive(work: Work, serializer: OutputSerializer = to_json_value) -> Result:
    """Perform `work`'s actions in this thread; its result. An action that raises (an
    interrupt) is thrown into `work`, whose handlers keep what must be kept, then re-raise."""
    reply: object = None
    error: BaseException | None = None
    while True:
        try:
            action = work.send(reply) if error is None else work.throw(error)
        except StopIteration as stop:
            result: Result = stop.value
            return result
        error = None
        try:
            if type(action) is Run:
                reply = run_tool(action.call, serializer)
            elif type(action) is AwaitReturn:
                reply = action.running.wait(action.timeout)
            else:
                assert type(action) is Check
                call = action.call
                reply = check_outcome(
                    call.tool.check, call.arguments, action.key, call.timeout, action.errors
                )
        except BaseException as exc:  # noqa: BLE001  (thrown into `work`, which re-raises it)
            error = exc


async def adrive(work: Work, serializer: OutputSerializer = to_json_value) -> Result:
    """Perform `work`'s actions without blocking the event loop; its result. A cancellation
    or an error of an action is thrown into `work`, as with `drive`."""
    import asyncio  # noqa: PLC0415  (`import agenttx` does not load asyncio)

    reply: object = None
    error: BaseException | None = None
    while True:
        try:
            action = work.send(reply) if error is None else work.throw(error)
        except StopIteration as stop:
            result: Result = stop.value
            return result
        error = None
        try:
            if type(action) is Run:
                reply = await arun_tool(action.call, serializer)
            elif type(action) is AwaitReturn:
                reply = await asyncio.to_thread(action.running.wait, action.timeout)
            else:
                assert type(action) is Check
                call = action.call
                reply = await asyncio.to_thread(
                    check_outcome,
                    call.tool.check,
                    call.arguments,
                    action.key,
                    call.timeout,
                    action.errors,
                )
        except BaseException as exc:  # noqa: BLE001  (thrown into `work`, which re-raises it)
            error = exc
