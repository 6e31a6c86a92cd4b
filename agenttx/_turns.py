"""Calls that number themselves: `call`, `call_turn` and their async forms (`Turns`).

An agent loop gets tool calls from a model, not step numbers. `call` sends the next step
itself, under the transaction's turn, so concurrent calls get consecutive numbers in arrival
order; a `RETRY` decision (a transient failure the policy retries) is resent at once by `call`
itself, after the one backoff (`RETRY_BACKOFF`), as many times as the controller allows.
`call_turn` runs one model turn: its calls in order, stopping at the first that fails; each
call after it gets a `NOT_RUN` result, so that every call the model made gets an answer.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping, Sized
from typing import TYPE_CHECKING, Any, Final, Protocol, final

import attrs

from ._errors import InvalidArgument, JSONValueError
from ._hints import CleanHint, HintCategory
from ._limits import MAX_CALLS_PER_TURN
from ._prepare import check_call_id, check_tool_call
from ._results import StepResult, StepStatus
from ._rollback import RollbackStrategy
from ._saga import Backoff

if TYPE_CHECKING:
    from ._observed import Calls

__all__ = ["RETRY_BACKOFF", "TurnCall", "Turns"]

#: The wait before `call` resends a step the controller decided to `RETRY`: 0.25 s, then
#: doubling, at most 8 s, with full jitter (callers that failed together do not retry together).
RETRY_BACKOFF: Final = Backoff(base=0.25, max_wait=8.0, jitter=True)

# Where `call` and `acall` wait between attempts (tests replace them with fakes).
sleep = time.sleep


async def asleep(seconds: float) -> None:
    """`asyncio.sleep`, imported when first needed (not by `import agenttx`)."""
    import asyncio  # noqa: PLC0415

    await asyncio.sleep(seconds)


def _check_call_id(_: object, __: object, value: str | None) -> None:
    check_call_id(value)


@final
@attrs.frozen
class TurnCall:
    """One tool call of a model turn, for `Transaction.call_turn`.

    `name` is the tool's registered or wire name, `arguments` a mapping or the JSON text the
    model sent, `call_id` the provider's id for the call (echoed in its result). Checked on
    construction as `execute_step` checks a call before anything changes, so that `execute_step`
    never refuses it (`InvalidArgument`): a name of 1-128 characters; arguments that are JSON
    text of at most 1 MiB, or a mapping that is a JSON value (`JSONValueError`) of at most
    1 MiB of canonical JSON; a call id that is None or 1-256 characters of valid text.
    """

    name: str
    arguments: Mapping[str, Any] | str
    call_id: str | None = attrs.field(default=None, kw_only=True, validator=_check_call_id)

    def __attrs_post_init__(self) -> None:
        # The checks `execute_step` makes before anything changes: a turn that it would refuse
        # partway raises before its first call runs.
        check_tool_call(self.name, self.arguments)


TurnCall.__module__ = "agenttx"


def turn_calls(calls: object) -> tuple[TurnCall, ...]:
    """`calls` as `TurnCall`s, every item checked before any runs (`InvalidArgument` names it).

    More than `MAX_CALLS_PER_TURN` calls raise `InvalidArgument` before any item is checked
    (an iterator is read no further than one item past the limit).
    """
    if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Iterable):
        raise InvalidArgument(
            f"calls must be an iterable of (tool_name, arguments[, call_id]) tuples or TurnCalls,"
            f" got {type(calls).__name__}"
        )
    items = list(itertools.islice(calls, MAX_CALLS_PER_TURN + 1))  # an endless one ends here
    if len(items) > MAX_CALLS_PER_TURN:  # before any is checked: none runs
        count = len(calls) if isinstance(calls, Sized) else "more than that"
        raise InvalidArgument(
            f"a turn holds at most {MAX_CALLS_PER_TURN} calls (MAX_CALLS_PER_TURN), got {count}"
        )
    checked: list[TurnCall] = []
    for index, item in enumerate(items):
        if isinstance(item, TurnCall):
            checked.append(item)
            continue
        if not isinstance(item, tuple) or len(item) not in (2, 3):
            raise InvalidArgument(
                f"calls[{index}] must be a (tool_name, arguments[, call_id]) tuple or a TurnCall,"
                f" got {_describe(item)}"
            )
        try:
            if len(item) == 2:
                checked.append(TurnCall(item[0], item[1]))
            else:
                checked.append(TurnCall(item[0], item[1], call_id=item[2]))
        except JSONValueError as exc:
            what = f"the arguments of calls[{index}]"
            raise JSONValueError(path=exc.path, problem=exc.problem, what=what) from None
        except InvalidArgument as exc:
            raise InvalidArgument(f"calls[{index}]: {exc}") from None
    return tuple(checked)


def _describe(item: object) -> str:
    if isinstance(item, tuple):
        return f"a tuple of {len(item)} items"
    return type(item).__name__


def not_run(call: TurnCall, failed: StepResult) -> StepResult:
    """The result of a call of a turn that was not sent because the step `failed` failed.

    It claims no step number (`step_id` is 0: it was never sent); `next_step_id` is where the
    transaction resumes, as in `failed`; the hint says which step failed first.
    """
    text = (
        f"Hint: Not run: step {failed.step_id} failed first; "
        f"send this call again, as step {failed.next_step_id} or later, if it is still needed."
    )
    if failed.status is StepStatus.FAILED:
        text = f"Hint: Not run: step {failed.step_id} failed first and the transaction aborted."
    elif failed.status in (StepStatus.NEEDS_APPROVAL, StepStatus.NEEDS_REVIEW):
        text = (
            f"Hint: Not run: step {failed.step_id} waits for a person first; "
            f"send this call again after it, if it is still needed."
        )
    return StepResult(
        status=StepStatus.NOT_RUN,
        step_id=0,
        call_id=call.call_id,
        next_step_id=failed.next_step_id,
        hint=CleanHint(text=text, category=HintCategory.UNKNOWN, rule="not_run"),
        error=text.removeprefix("Hint: "),
        constraints=failed.constraints,
    )


#: What `call_turn` takes; `Iterable[object]` too, so that an unannotated mixed list (which mypy
#: infers as `list[object]`) type-checks: every item is checked when the turn starts.
_Calls = Iterable[TurnCall | tuple[Any, ...]] | Iterable[object]


class _Host(Protocol):
    """What `Turns` needs of the transaction it is mixed into."""

    _calls: Calls

    @property
    def next_step_id(self) -> int: ...

    def execute_step(
        self,
        step_id: int,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        raw_context: str = ...,
        call_id: str | None = ...,
    ) -> StepResult: ...

    async def aexecute_step(
        self,
        step_id: int,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        raw_context: str = ...,
        call_id: str | None = ...,
    ) -> StepResult: ...

    def call(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        call_id: str | None = ...,
        raw_context: str = ...,
    ) -> StepResult: ...

    async def acall(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        call_id: str | None = ...,
        raw_context: str = ...,
    ) -> StepResult: ...


class Turns:
    """`call`, `acall`, `call_turn` and `acall_turn`, mixed into `Transaction`.

    Each holds the transaction's turn for its whole length (retries and backoff included), so
    concurrent calls from threads or tasks run one at a time, in arrival order, and each gets
    the step number current when its turn comes; none is refused for being concurrent.
    """

    __slots__ = ()

    def call(
        self: _Host,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        call_id: str | None = None,
        raw_context: str = "",
    ) -> StepResult:
        """Send `tool_name(arguments)` as the next step; resend it while the decision is RETRY.

        The result is the last attempt's. Misuse raises as `execute_step` does
        (`InvalidTransactionState` once the transaction has ended, `InvalidArgument`).
        Thread-safe: concurrent calls wait for their turn and are numbered in arrival order.
        """
        with self._calls:
            step, attempt = self.next_step_id, 0
            while True:
                result = self.execute_step(
                    step, tool_name, arguments, raw_context=raw_context, call_id=call_id
                )
                if result.strategy is not RollbackStrategy.RETRY:
                    return result
                attempt += 1
                sleep(RETRY_BACKOFF.delay(attempt))
                step = result.next_step_id

    async def acall(
        self: _Host,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        call_id: str | None = None,
        raw_context: str = "",
    ) -> StepResult:
        """`call` for async code: waits for its turn, and between attempts, without blocking."""
        async with self._calls:
            step, attempt = self.next_step_id, 0
            while True:
                result = await self.aexecute_step(
                    step, tool_name, arguments, raw_context=raw_context, call_id=call_id
                )
                if result.strategy is not RollbackStrategy.RETRY:
                    return result
                attempt += 1
                await asleep(RETRY_BACKOFF.delay(attempt))
                step = result.next_step_id

    def call_turn(self: _Host, calls: _Calls) -> tuple[StepResult, ...]:
        """Run one model turn: `calls` in order, through `call`, stopping at the first failure.

        `calls` holds `(tool_name, arguments)` or `(tool_name, arguments, call_id)` tuples or
        `TurnCall`s, at most `MAX_CALLS_PER_TURN` (128) of them (`InvalidArgument` for more).
        All are checked before any runs, against every limit `execute_step` would
        refuse a call for (`InvalidArgument` names the bad item; see `TurnCall`), so a turn
        either raises before anything ran or returns one result per call, in order: the calls
        after the first that failed are not sent and get a `StepStatus.NOT_RUN` result (see
        `not_run`). Still raised from the call where it happens: `InvalidTransactionState` if
        the transaction has ended, and what a step raises to the developer whatever the
        arguments (`ToolOutputError`, a store's error). The turn is held from the first call to
        the last: no other call runs in between.
        """
        checked = turn_calls(calls)
        results: list[StepResult] = []
        failed: StepResult | None = None
        with self._calls:
            for item in checked:
                if failed is not None:
                    results.append(not_run(item, failed))
                    continue
                result = self.call(item.name, item.arguments, call_id=item.call_id)
                results.append(result)
                if not result.ok:
                    failed = result
        return tuple(results)

    async def acall_turn(self: _Host, calls: _Calls) -> tuple[StepResult, ...]:
        """`call_turn` for async code (through `acall`)."""
        checked = turn_calls(calls)
        results: list[StepResult] = []
        failed: StepResult | None = None
        async with self._calls:
            for item in checked:
                if failed is not None:
                    results.append(not_run(item, failed))
                    continue
                result = await self.acall(item.name, item.arguments, call_id=item.call_id)
                results.append(result)
                if not result.ok:
                    failed = result
        return tuple(results)
