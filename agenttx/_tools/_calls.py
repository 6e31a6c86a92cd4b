"""Running one step's tool: under its deadline, with its context fenced when it ends.

A sync tool runs on a worker thread (`_workers`) unless it is declared `inline`; an async tool
runs in the caller's task and is cancelled at the deadline. Whatever happens, the tool's context
is closed before its outcome is read, so nothing it registers afterwards can land.
"""

from __future__ import annotations

import sys
import time
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from .._errors import JSONValueError, ToolError
from .._json import JSONValue, check_json, json_kind
from ._tool import StagedEffect, Tool, ToolContext, UndoRecord
from ._workers import (
    DeadlineExceeded,
    acall_with_deadline,
    call_with_deadline,
    is_awaitable,
    resolve_awaitable,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["Call", "Outcome", "arun_tool", "closed", "run_tool"]


class Call(NamedTuple):
    """A step that passed the checks and is ready to run its tool."""

    step_id: int
    tool: Tool[Any, Any]
    arguments: JSONValue
    raw_context: str
    context: ToolContext | None  # None when the tool takes no context: nothing to collect
    timeout: float  # the step timeout, in seconds
    log_undo: Callable[[UndoRecord], object] | None  # writes an undo durably, if durable


def closed(
    context: ToolContext | None,
) -> tuple[tuple[UndoRecord, ...], tuple[StagedEffect, ...]]:
    """Fence the step's context and take what its tool registered."""
    if context is None:
        return (), ()
    return context._close()  # noqa: SLF001  (the step owns its context)


class Outcome(NamedTuple):
    """What running a tool produced: its output or error, and what it registered."""

    output: JSONValue = None
    error: str | None = None
    undos: tuple[UndoRecord, ...] = ()
    effects: tuple[StagedEffect, ...] = ()


def run_tool(call: Call) -> Outcome:
    """Run the tool: on a worker thread under the deadline, unless it is inline or async."""
    try:
        output = _call(call)
    except DeadlineExceeded:
        return _failed(call, _timed_out(call))
    except Exception as exc:  # noqa: BLE001  (a tool's failure is the agent's data)
        return _failed(call, exc)
    return _succeeded(call, output)


async def arun_tool(call: Call) -> Outcome:
    """`run_tool` for `aexecute_step`: the event loop keeps running while a sync tool does."""
    try:
        output = await _acall(call)
    except DeadlineExceeded:
        return _failed(call, _timed_out(call))
    except Exception as exc:  # noqa: BLE001
        return _failed(call, exc)
    return _succeeded(call, output)


def _call(call: Call) -> object:
    if not (call.tool.inline or call.tool.is_async):
        output = call_with_deadline(partial(_invoke, call), call.timeout)
        # A sync function may return an awaitable: it gets the deadline too.
        return resolve_awaitable(_bounded(call, output)) if is_awaitable(output) else output
    started = time.monotonic()
    output = _invoke(call)
    if is_awaitable(output):
        return resolve_awaitable(_bounded(call, output))
    _check_in_time(call, started)
    return output


async def _acall(call: Call) -> object:
    if not (call.tool.inline or call.tool.is_async):
        output = await acall_with_deadline(partial(_invoke, call), call.timeout)
        return await _bounded(call, output) if is_awaitable(output) else output
    started = time.monotonic()
    output = _invoke(call)
    if is_awaitable(output):
        return await _bounded(call, output)
    _check_in_time(call, started)
    return output


def _check_in_time(call: Call, started: float) -> None:
    """An inline tool cannot be interrupted; a result after its deadline still fails the step."""
    if time.monotonic() - started > call.timeout:
        raise DeadlineExceeded


def _timed_out(call: Call) -> ToolError:
    """The reference's timeout failure; the hint cleaner reads it as transient."""
    return ToolError(f"tool '{call.tool.name}' timed out after {round(call.timeout * 1000)} ms")


async def _bounded(call: Call, awaitable: Awaitable[object]) -> object:
    """Await an async tool under the step timeout; cancel it and fail the step after it.

    The tool runs in the current task, so that a `KeyboardInterrupt` it raises reaches the
    caller's await. Its context is fenced at the deadline: a tool that swallows the
    cancellation and goes on delays the step until it returns, but nothing it registers or
    writes after the deadline lands, and the step fails as timed out all the same.
    """
    import asyncio  # noqa: PLC0415  (not loaded by `import agenttx`)

    loop = asyncio.get_running_loop()
    fence = loop.call_later(call.timeout, closed, call.context)
    try:
        if sys.version_info >= (3, 11):
            deadline = asyncio.timeout(call.timeout)
            try:
                async with deadline:
                    output = await awaitable
            except TimeoutError:
                if deadline.expired():  # not a TimeoutError the tool raised itself
                    raise _timed_out(call) from None
                raise
            if deadline.expired():  # it swallowed the cancellation
                raise _timed_out(call)
            return output
        started = time.monotonic()  # pragma: no cover  (Python 3.10)
        try:  # pragma: no cover
            output = await asyncio.wait_for(awaitable, timeout=call.timeout)
        except asyncio.TimeoutError:  # pragma: no cover
            if time.monotonic() - started >= call.timeout:
                raise _timed_out(call) from None
            raise
        if time.monotonic() - started >= call.timeout:  # pragma: no cover
            raise _timed_out(call)
        return output  # pragma: no cover
    finally:
        fence.cancel()


def _failed(call: Call, exc: Exception) -> Outcome:
    undos, effects = closed(call.context)
    if isinstance(exc, ToolError):
        message = exc.message
    else:
        import traceback  # noqa: PLC0415  (a failure's path: not at `import agenttx`)

        message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return Outcome(error=message, undos=undos, effects=effects)


def _succeeded(call: Call, output: object) -> Outcome:
    undos, effects = closed(call.context)
    checked: JSONValue = None
    error: str | None = None
    try:
        checked = check_json(output)
    except JSONValueError as exc:
        error = str(
            JSONValueError(
                path=exc.path,
                problem=exc.problem,
                what=f"the output of tool '{call.tool.name}'",
            )
        )
    compensation = call.tool.compensation_name
    if compensation is not None:
        # The tool returned, so its effect happened: undo it on a rewind even if its output
        # is refused (then with output null).
        declared = _declared_undo(call, compensation, len(undos), checked)
        if call.log_undo is not None:
            call.log_undo(declared)  # after the effect: all a declared undo can do
        undos = (*undos, declared)
    return Outcome(output=checked, error=error, undos=undos, effects=effects)


def _declared_undo(call: Call, kind: str, seq: int, output: JSONValue) -> UndoRecord:
    """The undo a tool's `compensate=` declares, called with its arguments and output."""
    return UndoRecord(
        step_id=call.step_id,
        seq=seq,
        kind=kind,
        payload={"arguments": call.arguments, "output": output},
        description=f"{kind} for step {call.step_id} ({call.tool.name})",
    )


def _invoke(call: Call) -> object:
    """Call the tool with its arguments as keywords (and its context if it asks for one)."""
    arguments = call.arguments
    if not isinstance(arguments, dict):
        kind = json_kind(arguments)
        raise ToolError(f"invalid type: {kind}, expected a JSON object of arguments")
    if call.tool.wants_context:
        return call.tool.__wrapped__(call.context, **arguments)
    return call.tool.__wrapped__(**arguments)
