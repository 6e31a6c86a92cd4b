"""One model turn at a time, for frameworks that run each tool call of a turn as its own task.

The OpenAI Agents SDK and pydantic-ai hand every tool call of a model turn to its own asyncio
task, started in the model's order. `TurnGate` puts those calls back together as a turn: they
reach `tx.acall` one at a time, in arrival order, and once one call of a turn has failed the
later calls of that turn are not run (the "turn barrier"): each gets the payload of a
`StepStatus.NOT_RUN` result. A later call of a failed turn was numbered by the model from the
steps before the failure; after a rewind (or a resend of the failed step) running it would
give it another step's number. The gate also remembers every call id a rewind voided, so the
history rewrite of the next model request can drop or void them.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Final, final

from .._errors import InvalidArgument, InvalidTransactionState
from .._results import StepResult, StepStatus

if TYPE_CHECKING:
    from collections.abc import Hashable, Mapping
    from typing import Any

    from .._json import JSONValue
    from .._transaction import Transaction

__all__ = ["HISTORY_MODES", "TurnGate", "check_history", "gate_for"]

#: What a history rewrite does with the calls a rewind voided (see docs/integrations.md).
HISTORY_MODES: Final = ("truncate", "void", "keep")


def check_history(history: object) -> str:
    """`history` itself, or `InvalidArgument` naming the modes."""
    if history not in HISTORY_MODES:
        raise InvalidArgument(
            f"history must be one of {', '.join(map(repr, HISTORY_MODES))}, got {history!r}"
        )
    return str(history)


def _check_transaction(tx: object, what: str) -> Transaction:
    from .._transaction import Transaction  # noqa: PLC0415  (layer 3, already loaded)

    if not isinstance(tx, Transaction):
        raise InvalidArgument(
            f"{what} needs an agenttx.Transaction (the calls run as its steps), got "
            f"{type(tx).__name__} {tx!r:.80}"
        )
    return tx


@final
class TurnGate:
    """The calls of one transaction, one at a time and a model turn at a time.

    Contract: `call` runs each call as the next step of the transaction, in the order the calls
    reach the gate (FIFO, per event loop). `turn` identifies the model turn the call belongs
    to: once a call of a turn has failed, every later call with the same `turn` gets a
    not-run payload without touching the transaction. Misuse on the model's side that the
    transaction raises (a call after it ended, arguments over the input limits) becomes a
    failed payload too, never an exception; a developer error (a tool output that is not
    JSON) is raised. Not thread-safe across event loops running at once on one transaction.
    """

    __slots__ = ("__weakref__", "_anchor", "_failed", "_locks", "_tx", "_voided")

    def __init__(self, tx: Transaction) -> None:
        self._tx = tx
        self._failed: Hashable | None = None  # the turn that has failed, if any
        self._anchor: object = None  # keeps alive what the failed turn's key names by id
        self._voided: set[str] = set()
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def transaction(self) -> Transaction:
        """The transaction the calls run on."""
        return self._tx

    @property
    def voided_call_ids(self) -> frozenset[str]:
        """Every call id a rewind has voided so far (their steps were undone)."""
        return frozenset(self._voided)

    async def call(
        self,
        turn: Hashable,
        name: str,
        arguments: Mapping[str, Any] | str,
        *,
        call_id: str | None,
        anchor: object = None,
    ) -> dict[str, JSONValue]:
        """Run one call of model turn `turn` and return the payload for the model.

        `anchor` is kept alive while `turn` is the failed turn (pass the object whose `id()`
        is part of `turn`, so the id cannot be reused by another turn meanwhile).
        """
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        async with lock:
            if self._failed is not None and self._failed == turn:
                return self._not_run(call_id).for_model()
            try:
                result = await self._tx.acall(name, arguments, call_id=call_id)
            except (InvalidTransactionState, InvalidArgument) as exc:
                if type(exc).__name__ == "ToolOutputError":
                    raise  # the developer's tool returned a value that is not JSON
                self._failed, self._anchor = turn, anchor
                return _refused(exc, self._tx.next_step_id)
            if not result.ok:
                self._failed, self._anchor = turn, anchor
            self._voided.update(result.voided_call_ids)
            return result.for_model()

    def _not_run(self, call_id: str | None) -> StepResult:
        step = self._tx.next_step_id
        return StepResult(
            status=StepStatus.NOT_RUN, step_id=step, next_step_id=step, call_id=call_id
        )


def _refused(exc: Exception, next_step: int) -> dict[str, JSONValue]:
    """The payload for a call the transaction refused (it has ended, or input over limits)."""
    ended = isinstance(exc, InvalidTransactionState)
    return {
        "ok": False,
        "error": str(exc),
        "next_step": next_step,
        "instruction": (
            "The transaction has ended: no more tool calls can run in it."
            if ended
            else "Fix the arguments and send the call again."
        ),
    }


#: One gate per transaction, so every tool and history filter of one transaction shares it.
_GATES: weakref.WeakKeyDictionary[Transaction, TurnGate] = weakref.WeakKeyDictionary()


def gate_for(tx: object, what: str) -> TurnGate:
    """The transaction's gate (made on first use); `InvalidArgument` if `tx` is not one."""
    checked = _check_transaction(tx, what)
    gate = _GATES.get(checked)
    if gate is None:
        gate = _GATES[checked] = TurnGate(checked)
    return gate
