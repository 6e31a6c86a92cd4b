"""Running one step's tool: under its deadline, with its context fenced when it ends.

A tool runs on a worker thread (`_workers`) unless it is declared `inline`: an async tool there
runs in an event loop of its own. Under `aexecute_step` an async tool runs in the caller's task
and is cancelled at the deadline. A call still running at its deadline is left to finish on its
worker; the outcome says so (`Outcome.running`), so that the undos it registered wait for it.
Whatever happens, the tool's context is closed before its outcome is read, so nothing it
registers afterwards can land.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from .._errors import JSONValueError, ToolError
from .._json import JSONValue, check_json, check_json_sized, json_kind
from ._outputs import OutputSerializer, to_json_value
from ._tool import StagedEffect, Tool, ToolContext, UndoRecord
from ._transient import transient_verdict
from ._workers import (
    DeadlineExceeded,
    Running,
    abandoned_call,
    acall_with_deadline,
    alarm_after,
    call_with_deadline,
    interrupted_call,
    is_awaitable,
    resolve_awaitable,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

_log = logging.getLogger("agenttx")

__all__ = [
    "Call",
    "Failure",
    "Landed",
    "Orphan",
    "Orphans",
    "Outcome",
    "Returned",
    "arun_tool",
    "closed",
    "declared_undo",
    "keep_abandoned",
    "run_tool",
    "still_running",
    "watch",
    "with_key",
]


class Call(NamedTuple):
    """A step that passed the checks and is ready to run its tool."""

    step_id: int
    tool: Tool[Any, Any]
    arguments: JSONValue
    raw_context: str
    context: ToolContext | None  # None when the tool takes no context: nothing to collect
    timeout: float  # the step timeout, in seconds
    log_undo: Callable[[UndoRecord], object] | None  # writes an undo durably, if durable
    #: The first `seq` of this attempt's undo records: attempts of a step never share one, so a
    #: kept (failed) record is never overwritten by a later attempt's.
    seq_base: int = 0


def with_key(call: Call, key: str, arguments: JSONValue = None) -> Call:
    """The call again, with a fresh context whose idempotency key is `key` (a retry of a call
    whose outcome was unknown keeps its key) and a new deadline; with `arguments` instead of
    the call's when given (an approver's edit). A call without a context gets only those."""
    if arguments is not None:
        call = call._replace(arguments=arguments)
    old = call.context
    if old is None:
        return call
    context = ToolContext(
        tx_id=old.tx_id,
        step_id=old.step_id,
        idempotency_key=key,
        deadline=time.monotonic() + call.timeout,
        store=old._store,  # noqa: SLF001  (this package's class)
        compensations=old._compensations,  # noqa: SLF001
        log_undo=old._log_undo,  # noqa: SLF001
        seq_base=old._seq_base,  # noqa: SLF001
    )
    return call._replace(context=context)


def closed(
    context: ToolContext | None,
) -> tuple[tuple[UndoRecord, ...], tuple[StagedEffect, ...]]:
    """Fence the step's context and take what its tool registered."""
    if context is None:
        return (), ()
    return context._close()  # noqa: SLF001  (the step owns its context)


class Failure(NamedTuple):
    """Why a step failed, before the hint cleaner reads it.

    `message` is the raw error text (a `ToolError`'s message, or the exception as Python
    formats it). `key` names the offending input when the tool said so (`ToolError(key=...)`):
    it overrides the key the cleaner finds. `transient` overrides the cleaner's verdict when not
    None. `mistake` marks an argument or protocol mistake of the agent (malformed JSON, an
    unknown tool, arguments that do not fit the tool's schema), caught before any tool ran.
    `timed_out` marks a call that ran past its deadline (its hint reads as transient).
    """

    message: str
    key: str | None = None
    transient: bool | None = None
    mistake: bool = False
    #: The call ran past its deadline (set where the deadline fired, never read from text).
    timed_out: bool = False


class Outcome(NamedTuple):
    """What running a tool produced: its output or error, and what it registered."""

    output: JSONValue = None
    error: Failure | None = None
    undos: tuple[UndoRecord, ...] = ()
    effects: tuple[StagedEffect, ...] = ()
    #: The tool's call, if it was still running at its deadline: its effect may still land.
    running: Running | None = None
    #: An upper bound of the output's canonical JSON size in bytes (`checked_size_bound`).
    size: int = 0
    #: Why the tool's output is not JSON even after the output serializer: a developer error
    #: (`ToolOutputError`), never a failed step. Its `__cause__` is what the serializer raised.
    refused: JSONValueError | None = None


def run_tool(call: Call, serializer: OutputSerializer = to_json_value) -> Outcome:
    """Run the tool: on a worker thread under the deadline, unless it is inline.

    An async tool runs on the worker too, in an event loop of its own, so that one that blocks
    (a `time.sleep` inside `async def`) still fails the step at its deadline. `serializer`
    converts an output that is not JSON (docs/protocol.md#outputs); it is not called for one
    that is.
    """
    try:
        output = _call(call)
    except DeadlineExceeded as late:
        return _failed(call, _timed_out(call), running=late.running)
    except Exception as exc:  # noqa: BLE001  (a tool's failure is the agent's data)
        return _failed(call, exc)
    return _succeeded(call, output, serializer)


async def arun_tool(call: Call, serializer: OutputSerializer = to_json_value) -> Outcome:
    """`run_tool` for `aexecute_step`: the event loop keeps running while a sync tool does.

    An async tool runs in the caller's task. If it blocks the event loop past its deadline
    nothing can interrupt it, but its context is fenced at the deadline by a timer thread and
    the step fails as timed out when it returns.
    """
    try:
        output = await _acall(call)
    except DeadlineExceeded as late:
        return _failed(call, _timed_out(call), running=late.running)
    except Exception as exc:  # noqa: BLE001
        return _failed(call, exc)
    return _succeeded(call, output, serializer)


def _call(call: Call) -> object:
    if call.tool.inline:
        started = time.monotonic()
        output = _invoke(call)
        if type(output) is not dict and is_awaitable(output):  # most outputs: dicts, no call
            return resolve_awaitable(_bounded(call, output))
        if time.monotonic() - started > call.timeout:  # `_check_in_time`, inline: every step
            raise _timed_out(call)
        return output
    return call_with_deadline(partial(_invoke_to_end, call), call.timeout, call)


def _invoke_to_end(call: Call) -> object:
    """On the worker: call the tool, and run what it returns to completion if it is awaitable."""
    output = _invoke(call)
    return resolve_awaitable(_bounded(call, output)) if is_awaitable(output) else output


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
        raise _timed_out(call)


class _TimedOut(ToolError):
    """The failure of a call past its deadline (typed: `Failure.timed_out`)."""


def _timed_out(call: Call) -> ToolError:
    """The failure of a step that timed out; the hint cleaner reads it as transient.

    See `docs/protocol.md#timeouts-and-interruptions`.
    """
    return _TimedOut(f"tool '{call.tool.name}' timed out after {round(call.timeout * 1000)} ms")


async def _bounded(call: Call, awaitable: Awaitable[object]) -> object:
    """Await an async tool under the step timeout; cancel it and fail the step after it.

    The tool runs in the current task, so that a `KeyboardInterrupt` it raises reaches the
    caller's await. Its context is fenced at the deadline by a timer thread, which fires even
    if the tool blocks the event loop: nothing it registers or writes after the deadline
    lands. A tool that swallows the cancellation, or blocks, delays the step until it returns,
    and the step fails as timed out all the same.
    """
    import asyncio  # noqa: PLC0415  (not loaded by `import agenttx`)

    # Two fences: one on the loop, ordered before the cancellation at the same deadline, and
    # the watchdog thread's, for a tool that blocks the loop.
    fence = alarm_after(call.timeout, closed, call.context) if call.context is not None else None
    on_loop = asyncio.get_running_loop().call_later(call.timeout, closed, call.context)
    started = time.monotonic()
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
        else:  # pragma: no cover  (Python 3.10)
            try:
                output = await asyncio.wait_for(awaitable, timeout=call.timeout)
            except asyncio.TimeoutError:
                if time.monotonic() - started >= call.timeout:
                    raise _timed_out(call) from None
                raise
        _check_in_time(call, started)  # it swallowed the cancellation, or blocked the loop
        return output
    finally:
        if fence is not None:
            fence.cancel()
        on_loop.cancel()


def _failed(call: Call, exc: Exception, *, running: Running | None = None) -> Outcome:
    undos, effects = closed(call.context)
    if isinstance(exc, ToolError):
        transient = exc.transient
        if transient is None and exc.__cause__ is not None:  # `raise ToolError(...) from exc`
            transient = transient_verdict(exc.__cause__)
        failure = Failure(
            exc.message, key=exc.key, transient=transient, timed_out=isinstance(exc, _TimedOut)
        )
    else:
        import traceback  # noqa: PLC0415  (a failure's path: not at `import agenttx`)

        message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        failure = Failure(message, transient=transient_verdict(exc))
    return Outcome(error=failure, undos=undos, effects=effects, running=running)


def _succeeded(call: Call, output: object, serializer: OutputSerializer) -> Outcome:
    undos, effects = closed(call.context)
    checked: JSONValue = None
    size = 0
    refused: JSONValueError | None = None
    try:
        checked, size = check_json_sized(output)
    except JSONValueError:  # the rare path: convert, then check again
        try:
            checked, size = check_json_sized(serializer(output))
        except JSONValueError as exc:
            refused = exc
        except Exception as exc:  # noqa: BLE001  (the developer's serializer: reported to them)
            refused = JSONValueError(
                path="$", problem=f"the output serializer raised {type(exc).__name__}: {exc}"
            )
            refused.__cause__ = exc
    compensation = call.tool.compensate  # `compensation_name`, without the property's call
    if compensation is not None:
        if not isinstance(compensation, str):
            compensation = compensation.name
        # The tool returned, so its effect happened: undo it on a rewind even if its output
        # is refused (then with output null).
        declared = declared_undo(call, compensation, call.seq_base + len(undos), checked)
        if call.log_undo is not None:
            call.log_undo(declared)  # after the effect: all a declared undo can do
        undos = (*undos, declared)
    return Outcome(checked, None, undos, effects, None, size, refused)


def declared_undo(call: Call, kind: str, seq: int, output: JSONValue) -> UndoRecord:
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


class Orphan(NamedTuple):
    """A timed-out call whose worker was still running: its undos wait until it has finished.

    Running an undo while its effect may still land would undo nothing and then let the effect
    happen; so the transaction compensates an orphan's undos only once `running` has finished.
    A host keeps its orphans `watch`ed: the undo the call declares is then written durably as
    the call returns (`Returned`), not at the host's next action.
    """

    call: Call
    undos: tuple[UndoRecord, ...]  # registered before the deadline, in registration order
    running: Running
    #: Its outcome is unknown and a person or its status check decides it: once it returns its
    #: undos are kept (undone by a later rewind), not compensated.
    held: bool = False
    #: What it left once returned, shared by its copies (`watch`); None: not watched.
    returned: Returned | None = None

    def finished_undos(self) -> tuple[UndoRecord, ...]:
        """Its undo records once it has finished, with its declared undo if the tool returned.

        A `compensate=` undo is recorded for a tool that returned, however late: its effect
        happened. Call only after `running.wait` returned True. For a watched orphan, the
        records its return worked out and wrote (see `unrecorded` for a write that failed);
        else worked out and written now (the write's error raised).
        """
        if self.returned is not None:
            return self.returned.take(self)
        records, error = _work_out(self)
        if error is not None:
            raise error
        return records

    def unrecorded(self) -> Exception | None:
        """Why the undo its return declared could not be written durably (a lost lease, a
        closed store), once `finished_undos` was called; None if it was, or there was none."""
        return None if self.returned is None else self.returned.error


def _work_out(orphan: Orphan) -> tuple[tuple[UndoRecord, ...], Exception | None]:
    """The undo records of a finished orphan, its declared undo written durably if it has a
    log; and the error of that write, if it failed."""
    call = orphan.call
    compensation = call.tool.compensation_name
    if compensation is None:
        return orphan.undos, None
    try:
        output = orphan.running.outcome()
    except Exception:  # noqa: BLE001  (it failed: only the undos it registered apply)
        return orphan.undos, None
    try:
        checked = check_json(output)
    except JSONValueError:
        try:  # the default conversion: the transaction's serializer is not at hand here
            checked = check_json(to_json_value(output))
        except Exception:  # noqa: BLE001  (only the payload's output is lost)
            checked = None
    declared = declared_undo(call, compensation, call.seq_base + len(orphan.undos), checked)
    error: Exception | None = None
    if call.log_undo is not None:
        try:
            call.log_undo(declared)
        except Exception as exc:  # noqa: BLE001  (kept for the host to report)
            error = exc
    return (*orphan.undos, declared), error


class Returned:
    """What a watched orphan left to undo once its call returned: worked out, and its declared
    undo written durably, once, by whichever comes first: its worker as the call returns
    (`land`), or its host as it settles it (`take`); never once its host gave it up (`close`).

    Written at the return, the undo outlives a host that does nothing more (no next call, a
    process that dies first): a restarted process finds it (docs/protocol.md, the lifecycle).
    The write goes through the host's durable log (`Call.log_undo`), which the store fences by
    the host's lease: a worker that lost its transaction or plan run writes nothing into it,
    whoever holds it now. A write that fails is logged at once (logger `agenttx`, a warning)
    and kept (`error`) for the host to report with the records, never dropped silently.
    The host's own writes need no lock of ours: the store serializes each write, and this
    object serializes the one write an orphan makes against the host's use of its records.
    """

    __slots__ = ("_lock", "closed", "error", "records")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: tuple[UndoRecord, ...] | None = None
        self.error: Exception | None = None
        self.closed = False

    def land(self, orphan: Orphan) -> None:
        """On the worker, as the call returns: work out and write its undo, unless done or
        given up already."""
        with self._lock:
            if self.records is not None or self.closed:
                return
            self.records, self.error = _work_out(orphan)
            error = self.error
        if error is not None:
            _log.warning(
                "the undo of a late call of tool '%s' (step %s, transaction or run `%s`) "
                "could not be written as it returned: %s; it is reported to its host, "
                "which does not run it",
                orphan.call.tool.name,
                orphan.call.step_id,
                orphan.call.context.tx_id if orphan.call.context is not None else "?",
                error,
            )

    def take(self, orphan: Orphan) -> tuple[UndoRecord, ...]:
        """The host, once the call has finished: its records (worked out now if its worker
        has not yet)."""
        with self._lock:
            if self.records is None:
                self.records, self.error = _work_out(orphan)
            return self.records

    def close(self) -> tuple[UndoRecord, ...] | None:
        """The host gives the call up: its return writes nothing from now on. What it left,
        if it returned (and was worked out) already."""
        with self._lock:
            self.closed = True
            return self.records


def watch(orphan: Orphan) -> Orphan:
    """`orphan`, watched: its undo is written as its call returns (`Returned`)."""
    if orphan.returned is not None:
        return orphan
    watched = orphan._replace(returned=Returned())
    assert watched.returned is not None
    watched.running.on_return(partial(watched.returned.land, watched))
    return watched


def still_running(call: Call, wait: float) -> Failure:
    """Why `call` does not start: an earlier timed-out call still runs after `wait` seconds."""
    return Failure(
        f"tool '{call.tool.name}' timed out after {round(wait * 1000)} ms waiting for an "
        "earlier call that is still running after its own timeout",
        timed_out=True,
    )


class Orphans:
    """The timed-out calls of one transaction whose workers were still running.

    Their undos wait here until the call has finished: `settle` hands back those of finished
    calls, to compensate, and says whether any is still running; `give_up` hands back the
    undos of those still running, to keep as failed (recovery retries kept undo records).
    Each is `watch`ed: the undo it declares is written durably as its call returns.
    """

    __slots__ = ("calls",)

    def __init__(self) -> None:
        #: The orphans still kept, oldest first (read as a plain list on the step's hot path).
        self.calls: list[Orphan] = []

    def __bool__(self) -> bool:
        return bool(self.calls)

    def add(self, orphan: Orphan) -> None:
        """Keep the undos of a call whose worker is still running after its deadline."""
        self.calls.append(watch(orphan))

    def runs(self, context: object) -> bool:
        """Whether a kept call with this context (not None) may still be running."""
        return context is not None and any(o.call.context is context for o in self.calls)

    def held_at(self, step: int) -> bool:
        """Whether a held call (its outcome for a person to decide) of `step` is kept."""
        return any(o.held and o.call.step_id == step for o in self.calls)

    def release_from(self, step: int) -> None:
        """The steps from `step` on were rewound: their held calls are undone once back."""
        self.calls = [
            o._replace(held=False) if o.held and o.call.step_id >= step else o for o in self.calls
        ]

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds, in all, for every orphaned call to finish."""
        deadline = time.monotonic() + timeout
        for orphan in list(self.calls):
            orphan.running.wait(deadline - time.monotonic())

    async def await_wait(self, timeout: float) -> None:
        """`wait` for async code: the event loop keeps running meanwhile."""
        import asyncio  # noqa: PLC0415  (not loaded by `import agenttx`)

        await asyncio.to_thread(self.wait, timeout)

    def settle(self, wait: float) -> Landed:
        """After waiting up to `wait` seconds, what the finished calls left (`Landed`)."""
        self.wait(wait)
        finished = [orphan for orphan in self.calls if orphan.running.wait(0.0)]
        self.calls = [orphan for orphan in self.calls if orphan not in finished]
        landed = Landed([], [], [], running=bool(self.calls))
        for orphan in finished:
            records = orphan.finished_undos()
            error = orphan.unrecorded()
            if error is not None:
                landed.unrecorded.append((records, error))
            elif orphan.held:
                landed.kept.extend(records)
            else:
                landed.undo.extend(records)
        landed.undo.reverse()
        return landed

    def give_up(self) -> list[UndoRecord]:
        """Forget the calls still running; return their undos, to keep as failed: those they
        registered and, for a tool with `compensate=`, the one it declares (its output is not
        known: null), so that an abort reports it and recovery may retry it. A call that
        returned meanwhile gives what it left instead; none writes anything once given up."""
        records: list[UndoRecord] = []
        for orphan in self.calls:
            left = None if orphan.returned is None else orphan.returned.close()
            if left is not None:
                records.extend(left)
                continue
            records.extend(orphan.undos)
            call = orphan.call
            kind = call.tool.compensation_name
            if kind is not None:
                declared = declared_undo(call, kind, call.seq_base + len(orphan.undos), None)
                if call.log_undo is not None:
                    call.log_undo(declared)
                records.append(declared)
        self.calls.clear()
        return records


class Landed(NamedTuple):
    """What `Orphans.settle` found: the undos of the finished calls to compensate, newest
    first (`undo`); those of finished `held` calls to keep, in registration order (`kept`);
    those whose declared undo could not be written, with why (`unrecorded`: to report, never
    to run: the host may have lost its transaction); and whether some call still runs."""

    undo: list[UndoRecord]
    kept: list[UndoRecord]
    unrecorded: list[tuple[tuple[UndoRecord, ...], Exception]]
    running: bool


def keep_abandoned(orphans: Orphans, call: Call, undos: tuple[UndoRecord, ...]) -> bool:
    """After the task running `call` was cancelled, or the sync caller's wait for it was
    interrupted: if a worker thread still runs it (a sync tool outlives its caller), keep it in
    `orphans`, its undos waiting for it to return (its declared `compensate=` undo added
    then); whether it did. Call from that task or thread."""
    if call.tool.is_async or call.tool.inline:
        return False  # it ran in the task, and stopped with it
    running = interrupted_call(call)  # a sync caller's, interrupted
    if running is None and "asyncio" in sys.modules:  # no loop can run without it
        import asyncio  # noqa: PLC0415  (not loaded by `import agenttx`)

        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop: a sync caller
            task = None
        running = None if task is None else abandoned_call(task)
    if running is None:
        return False
    orphans.add(Orphan(call, undos, running))
    return True
