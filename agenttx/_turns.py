"""A model turn's calls: `TurnCall`, their checks, the `NOT_RUN` answer, the retry backoff.

What a transaction's `call_turn` (in `_transaction`), the integrations and the plan runner
share about the calls a model sends in one turn: each is checked before any runs
(`turn_calls`), a call after the first that failed is answered `not_run`, and a step the
controller decided to `RETRY` is resent after `RETRY_BACKOFF`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sized
from typing import Any, Final, final

import attrs

from ._errors import InvalidArgument, JSONValueError
from ._hints import CleanHint, HintCategory
from ._limits import MAX_CALLS_PER_TURN
from ._prepare import check_call_id, check_tool_call
from ._results import StepResult, StepStatus
from ._saga import Backoff

__all__ = ["RETRY_BACKOFF", "TurnCall", "not_run", "turn_calls"]

#: The wait before `call` resends a step the controller decided to `RETRY`: 0.25 s, then
#: doubling, at most 8 s, with full jitter (callers that failed together do not retry together).
RETRY_BACKOFF: Final = Backoff(base=0.25, max_wait=8.0, jitter=True)


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
