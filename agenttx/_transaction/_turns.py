"""Calls that number themselves: `call`, `call_turn` and their async forms, over the step API.

An agent loop gets tool calls from a model, not step numbers. `call` sends the next step
itself, under the transaction's turn, so concurrent calls get consecutive numbers in arrival
order; a `RETRY` decision (a transient failure the policy retries) is resent at once by `call`
itself, after the one backoff (`RETRY_BACKOFF`), as many times as the controller allows.
`call_turn` runs one model turn: its calls in order, stopping at the first that fails; each
call after it gets a `NOT_RUN` result, so that every call the model made gets an answer.

These are functions of the public step API (`Steps`) and the transaction's turn lock: each
holds the turn for its whole length (retries and backoff included), so concurrent calls from
threads or tasks run one at a time, in arrival order, and each gets the step number current
when its turn comes; none is refused for being concurrent.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._rollback import RollbackStrategy
from .._turns import RETRY_BACKOFF, TurnCall, not_run, turn_calls

if TYPE_CHECKING:
    from .._results import StepResult
    from ._turnlock import Calls

__all__ = ["RETRY_BACKOFF", "Steps", "TurnCalls", "acall", "acall_turn", "call", "call_turn"]

# Where `call` and `acall` wait between attempts (tests replace them with fakes).
sleep = time.sleep


async def asleep(seconds: float) -> None:
    """`asyncio.sleep`, imported when first needed (not by `import agenttx`)."""
    import asyncio  # noqa: PLC0415

    await asyncio.sleep(seconds)


#: What `call_turn` takes; `Iterable[object]` too, so that an unannotated mixed list (which mypy
#: infers as `list[object]`) type-checks: every item is checked when the turn starts.
TurnCalls = Iterable[TurnCall | tuple[Any, ...]] | Iterable[object]


class Steps(Protocol):
    """The public step API the calls here are written against (a `Transaction` is one).

    `execute_step` and `aexecute_step` take the turn themselves; called under a turn already
    held by the same thread or task, they pass straight through (`Calls`).
    """

    @property
    def next_step_id(self) -> int:
        """The step id to send next."""
        ...

    def execute_step(
        self,
        step_id: int,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        raw_context: str = ...,
        call_id: str | None = ...,
    ) -> StepResult:
        """Run one tool call as step `step_id`."""
        ...

    async def aexecute_step(
        self,
        step_id: int,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        raw_context: str = ...,
        call_id: str | None = ...,
    ) -> StepResult:
        """`execute_step` for async code."""
        ...


def call(  # noqa: PLR0917  (the turn, then `Transaction.call`'s own arguments)
    steps: Steps,
    turn: Calls,
    tool_name: str,
    arguments: Mapping[str, Any] | str,
    call_id: str | None,
    raw_context: str,
) -> StepResult:
    """`Transaction.call`: the next step, resent while the decision is RETRY, under `turn`."""
    with turn:
        step, attempt = steps.next_step_id, 0
        while True:
            result = steps.execute_step(
                step, tool_name, arguments, raw_context=raw_context, call_id=call_id
            )
            if result.strategy is not RollbackStrategy.RETRY:
                return result
            attempt += 1
            sleep(RETRY_BACKOFF.delay(attempt))
            step = result.next_step_id


async def acall(  # noqa: PLR0917  (as `call`)
    steps: Steps,
    turn: Calls,
    tool_name: str,
    arguments: Mapping[str, Any] | str,
    call_id: str | None,
    raw_context: str,
) -> StepResult:
    """`call` for async code: waits for its turn, and between attempts, without blocking."""
    async with turn:
        step, attempt = steps.next_step_id, 0
        while True:
            result = await steps.aexecute_step(
                step, tool_name, arguments, raw_context=raw_context, call_id=call_id
            )
            if result.strategy is not RollbackStrategy.RETRY:
                return result
            attempt += 1
            await asleep(RETRY_BACKOFF.delay(attempt))
            step = result.next_step_id


def call_turn(steps: Steps, turn: Calls, calls: TurnCalls) -> tuple[StepResult, ...]:
    """`Transaction.call_turn`: `calls` in order through `call`, the turn held throughout."""
    checked = turn_calls(calls)
    results: list[StepResult] = []
    failed: StepResult | None = None
    with turn:
        for item in checked:
            if failed is not None:
                results.append(not_run(item, failed))
                continue
            result = call(steps, turn, item.name, item.arguments, item.call_id, "")
            results.append(result)
            if not result.ok:
                failed = result
    return tuple(results)


async def acall_turn(steps: Steps, turn: Calls, calls: TurnCalls) -> tuple[StepResult, ...]:
    """`call_turn` for async code (through `acall`)."""
    checked = turn_calls(calls)
    results: list[StepResult] = []
    failed: StepResult | None = None
    async with turn:
        for item in checked:
            if failed is not None:
                results.append(not_run(item, failed))
                continue
            result = await acall(steps, turn, item.name, item.arguments, item.call_id, "")
            results.append(result)
            if not result.ok:
                failed = result
    return tuple(results)
