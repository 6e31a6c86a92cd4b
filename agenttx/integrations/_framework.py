"""`FrameworkRunner`: the runner of a turn whose conversation a framework keeps.

LangGraph keeps the messages in its own state (a checkpointer makes them durable); what it
does not keep is how far the tool calls of its last model turn got. `FrameworkRunner` is a
`_runs.Runner` without a conversation: its one "message" is the record of the turn in progress
(the model message's id) and, once the turn completed, its answers. So a node the framework
runs again (after `interrupt()`, or after a crash, from its last checkpoint) gets the answers
of the calls that ran instead of running them a second time:

- `turn(message_id, calls)` runs a new model turn, or recognizes the one it already ran or
  began (the same message id, or with no id the same call ids): `done` has the answers when
  every call is answered; otherwise the turn waits for a person (`waiting`), and `resume()`
  completes it once they decided.
- On a store that keeps conversations (`stores.ConversationStore`) the record is written with
  the transaction (fenced), so `FrameworkRunner.restore(tx)` in a new process finds the turn a
  crash interrupted: the calls recorded as live steps are answered from the journal, a request
  asked before the crash shows in `waiting`, the rest run at `resume()`.

Not thread-safe; one runner per transaction in a process (`_runs.Runner`).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, ClassVar

from .._errors import FailedPrecondition
from ..stores import keeps_conversations
from ._common import Outcome
from ._runs import Runner

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._transaction import Transaction
    from ._common import History, ModelCall

__all__ = ["FrameworkRunner", "runner_of"]


class FrameworkRunner(Runner):
    """A runner whose messages are the record of its last turn (see the module docstring)."""

    _kind: ClassVar[str] = "langgraph"

    def __init__(
        self, tx: Transaction, *, history: History = "truncate", plans: bool = False
    ) -> None:
        super().__init__(tx, history=history, plans=plans)
        self._done: tuple[Outcome, ...] | None = None

    @property
    def done(self) -> tuple[Outcome, ...] | None:
        """Every answer of the last turn once it completed, in the calls' order; else None."""
        return self._done

    @property
    def undecided(self) -> bool:
        """Whether a request the open turn waits on is still undecided."""
        return bool(self._undecided())

    @property
    def steps(self) -> dict[str, int]:
        """The step each call id ran as (a copy), for the history rewrite."""
        return dict(self._steps)

    def _marker(self) -> dict[str, Any]:
        return self._messages[0] if self._messages else {}

    def _same(self, message_id: str | None, calls: Sequence[ModelCall]) -> bool:
        marker = self._marker()
        if message_id is not None and marker.get("message") is not None:
            return bool(marker["message"] == message_id)
        ids = [c.call_id for c in calls]
        if marker.get("calls") != ids:
            return False
        # No message id: a later turn may reuse the call ids (models do); what it asks tells
        # it apart. A marker written before the fingerprint was kept compares by ids alone.
        return bool(marker.get("asks", _asks(calls)) == _asks(calls))

    def turn(self, message_id: str | None, calls: Sequence[ModelCall]) -> None:
        """Run the model turn `calls` of message `message_id`, unless it is the one this runner
        ran or began (then nothing runs: `done` or `waiting` says where it is). Raises
        `FailedPrecondition` for another turn while this one waits for a person."""
        if not self._recognized(message_id, calls):
            self._handle([_marker_of(message_id, calls)], calls)
            self._done = () if not calls else self._done

    async def aturn(self, message_id: str | None, calls: Sequence[ModelCall]) -> None:
        """`turn` for async code: the calls run through `tx.acall_turn`."""
        if not self._recognized(message_id, calls):
            await self._ahandle([_marker_of(message_id, calls)], calls)
            self._done = () if not calls else self._done

    def _recognized(self, message_id: str | None, calls: Sequence[ModelCall]) -> bool:
        if self._same(message_id, calls):
            if self._turn is not None or self._done is not None:
                return True
            answers = self._marker().get("answers")
            if isinstance(answers, list):  # completed before a restart
                self._done = tuple(
                    Outcome(call_id=str(i), payload=p, is_error=bool(e)) for i, p, e in answers
                )
                return True
        if self._turn is not None:
            raise FailedPrecondition(
                f"transaction `{self._tx.id}`: a new model turn arrived while the last one "
                f"still waits for {', '.join(self.unanswered)}; resume the graph once people "
                "decided, before the next model turn"
            )
        self._done = None
        return False

    def _complete(self, history: list[dict[str, Any]], outcomes: Sequence[Outcome]) -> list[Any]:
        self._done = tuple(outcomes)
        for outcome in outcomes:
            if outcome.result is not None and outcome.result.ok:
                self._steps[outcome.call_id] = outcome.result.step_id
        marker = dict(history[0]) if history else {}
        marker["answers"] = [[o.call_id, o.payload, o.is_error] for o in outcomes]
        return [marker]


def runner_of(tx: Transaction, history: History, held: FrameworkRunner | None) -> FrameworkRunner:
    """`held` if there is one, else the runner restored from the store (when it keeps a
    record for `tx`), else a new one."""
    if held is not None:
        return held
    store = tx.store
    if (
        keeps_conversations(store)
        and not tx.status.terminal
        and store.read_conversation(tx.id) is not None
    ):
        return FrameworkRunner.restore(tx, history=history)
    return FrameworkRunner(tx, history=history)


def _marker_of(message_id: str | None, calls: Sequence[ModelCall]) -> dict[str, Any]:
    """What the runner keeps to know a turn again: its message id, its call ids, and a
    fingerprint of what the calls ask (for a message without an id)."""
    return {"message": message_id, "calls": [c.call_id for c in calls], "asks": _asks(calls)}


def _asks(calls: Sequence[ModelCall]) -> str:
    """A fingerprint of the calls' tool names and arguments, as sent (never raises)."""
    text = repr([(c.name, c.arguments) for c in calls])
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:32]
