"""`Runner`, what every provider's runner is: a conversation kept with its transaction, and
turns that wait for people and resume without another model turn.

A provider module (`openai`, `anthropic`) parses its message shapes, builds the history with
the model's new message, and hands it with the message's `ModelCall`s to `_handle` (or
`_ahandle`); it implements `_complete(history, outcomes)`, which appends every result of a
turn in the provider's format and applies the history rewrite. The rest is here:

- **A turn that waits.** The turn's calls run in order (`_common.run_turn`); when one returns
  `NEEDS_APPROVAL` or `NEEDS_REVIEW` the turn stops there: the calls before it are answered
  (kept until the turn completes), the waiting call and the calls after it are not (a later
  call was written for the steps before it, and step numbers follow the calls' order).
  `waiting` shows the request; `wait`/`await_decisions` poll the store until a person decided
  (`_saga.Backoff`); `resume`/`aresume` send the waiting call again (the transaction runs it
  once with the approved or edited arguments, consuming the approval, or fails it with the
  rejection's reason), then the calls after it, and complete the turn: every result appended
  at once, in the calls' order, so the next model request answers every call and no model
  turn is spent on the decision.
- **A durable conversation.** On a store that keeps conversations (`stores.ConversationStore`:
  SQLiteStore, PostgresStore) the runner writes its state (`_conversation.dump`) when a model
  message arrives, before any of its calls runs, when a turn stops to wait, and when it
  completes; each write fenced like every write of the transaction. `restore(tx)` reads it
  back and completes a turn a crash interrupted from the journal: a call already recorded as
  a live step (matched by call id, from the turn's first step) is answered from its recorded
  output, never run again; a call waiting for a person shows in `waiting`; the others run at
  `resume`.

Contracts: one runner per transaction in a process (a second one raises `FailedPrecondition`
while the first lives); misuse (`resume` with nothing to resume or an undecided request,
`handle` while a turn is open, `restore` of a transaction with no stored conversation, of a
store that keeps none, or of another provider's conversation) raises a typed error and changes
nothing. Not thread-safe, like the runners.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from typing import TYPE_CHECKING, Any, ClassVar, Final

import attrs
from typing_extensions import Self

from .._approvals import request_of, requests_for, review_of
from .._errors import FailedPrecondition, InvalidArgument
from .._plans import plan_tool_spec
from .._results import StepResult, StepStatus
from .._saga import Backoff
from ..stores import keeps_conversations
from ._common import (
    History,
    Outcome,
    Rewrite,
    arun_turn_with_plans,
    check_history,
    check_transaction,
    rewrite_for,
    run_turn_with_plans,
)
from ._conversation import OpenTurn, Wait, WaitKind, dump, load

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._approvals import ApprovalRequest, Review
    from .._tools import ToolSpec
    from .._transaction import Transaction
    from ..stores import RequestRow
    from ._common import ModelCall

__all__ = ["DECISION_POLL", "Runner"]

#: How `wait` polls the store for decisions: 50 ms, doubling, at most 2 s, with full jitter.
DECISION_POLL: Final = Backoff(base=0.05, max_wait=2.0, jitter=True)

Message = dict[str, Any]

_WAITS: Final[dict[StepStatus, WaitKind]] = {
    StepStatus.NEEDS_APPROVAL: "approval",
    StepStatus.NEEDS_REVIEW: "review",
}

#: The runner of each transaction in this process (weakly: a runner dropped frees its place).
_RUNNERS: weakref.WeakKeyDictionary[Transaction, weakref.ref[Runner]] = weakref.WeakKeyDictionary()


def _check_timeout(timeout: object) -> float:
    if timeout is None:
        return math.inf
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not timeout >= 0
        or math.isnan(timeout)
    ):
        raise InvalidArgument(f"timeout must be None or a number >= 0, got {timeout!r}")
    return float(timeout)


def _recorded(step_id: int, output: Any, call_id: str) -> Outcome:
    """The answer of a call recorded as live step `step_id`: what the model got when it ran."""
    result = StepResult(
        status=StepStatus.SUCCESS,
        step_id=step_id,
        next_step_id=step_id + 1,
        output=output,
        call_id=call_id,
    )
    return Outcome(call_id=call_id, payload=result.for_model(), is_error=False, result=result)


class Runner:
    """What every provider's runner holds: the transaction, the history policy, the step each
    call id was sent as (so a later rewind knows which calls it voided), the conversation and
    the turn in progress. See the module docstring for the contract.

    With `plans=True` the runner also offers the model `propose_plan` (`plan_spec`) and
    answers its calls (`_common.run_turn_with_plans`). Raises `InvalidArgument` for a `plans`
    that is not a bool, and when a tool of the transaction is itself named `propose_plan`.
    """

    #: The provider format this runner writes ("openai.chat", "openai.responses", "anthropic").
    _kind: ClassVar[str] = ""

    def __init__(
        self, tx: Transaction, *, history: History = "truncate", plans: bool = False
    ) -> None:
        self._tx = check_transaction(tx, type(self).__name__)
        self._history = check_history(history)
        self._steps: dict[str, int] = {}  # call id -> the step it was sent as
        self._messages: list[Message] = []
        self._turn: OpenTurn | None = None
        if not isinstance(plans, bool):
            raise InvalidArgument(f"plans must be True or False, got {plans!r:.80}")
        self._plans = plans
        self._plan_spec = plan_tool_spec(self._tx) if plans else None

    def _claim(self) -> None:
        """Become the transaction's runner in this process, unless another live one is."""
        held = _RUNNERS.get(self._tx)
        other = None if held is None else held()
        if other is self:
            return
        if other is not None:
            raise FailedPrecondition(
                f"transaction `{self._tx.id}` already has a runner ({type(other).__name__}) in "
                "this process: one runner serves one conversation; use that one"
            )
        _RUNNERS[self._tx] = weakref.ref(self)

    # ------------------------------------------------------------------ what it shows

    @property
    def tx(self) -> Transaction:
        """The transaction the tool calls run in."""
        return self._tx

    @property
    def history(self) -> History:
        """How the history is rewritten after a rewind: `"truncate"`, `"void"` or `"keep"`."""
        return self._history

    @property
    def plans(self) -> bool:
        """Whether the model is offered `propose_plan` and its plans run."""
        return self._plans

    @property
    def plan_spec(self) -> ToolSpec | None:
        """The `propose_plan` tool offered with the tools; None without `plans`."""
        return self._plan_spec

    @property
    def messages(self) -> list[Message]:
        """The conversation as the runner last wrote it (a new list; the messages are shared).

        While a turn is open (`unanswered`), it ends with the model's message: the turn's
        results are appended together when it completes.
        """
        return list(self._messages)

    @property
    def unanswered(self) -> tuple[str, ...]:
        """The call ids of the last model turn not answered yet, in order (empty when the
        turn is complete): the waiting call, the calls after it, or calls a crash left."""
        turn = self._turn
        return () if turn is None else tuple(c.call_id for c in turn.rest)

    @property
    def waiting(self) -> tuple[ApprovalRequest | Review, ...]:
        """The approval requests and reviews the open turn waits on, as stored now (decided
        or not, until `resume` answers their calls); empty when nothing waits."""
        found: list[ApprovalRequest | Review] = []
        for _, row in self._rows():
            if row is not None:
                found.append(review_of(row) if row.kind == "review" else request_of(row))
        return tuple(found)

    # ------------------------------------------------------------------ restore

    @classmethod
    def restore(
        cls, tx: Transaction, *, history: History | None = None, plans: bool = False
    ) -> Self:
        """A runner for `tx` with the conversation its runner kept in the store.

        Use it after a restart: `engine.recover("resume")`, then `restore(engine.get(tx_id))`.
        A turn the crash interrupted is completed from the journal as far as it can be without
        running anything (see the module docstring); `unanswered` and `waiting` say what is
        left, and `resume()` runs it. `history` overrides the stored history policy; `plans`
        offers `propose_plan` again, as the runner's constructor does.

        Raises `InvalidArgument` if `tx` is not a transaction, its store keeps no
        conversations (a `MemoryStore`: nothing survives the process), or the conversation was
        written by another provider's runner (its error names the runner to use);
        `FailedPrecondition` if the transaction has ended or no conversation was stored for
        it; `StorageError` if the stored one cannot be read.
        """
        tx = check_transaction(tx, f"{cls.__name__}.restore")
        store = tx.store
        if not keeps_conversations(store):
            raise InvalidArgument(
                f"{cls.__name__}.restore: the store of transaction `{tx.id}` "
                f"({type(store).__name__}) keeps no conversations, so none survives the "
                "process; use a SQLiteStore or a PostgresStore"
            )
        if tx.status.terminal:
            raise FailedPrecondition(
                f"transaction `{tx.id}` has ended ({tx.status.value}): there is no run to restore"
            )
        text = store.read_conversation(tx.id)
        if text is None:
            raise FailedPrecondition(
                f"no conversation is stored for transaction `{tx.id}`: no runner handled a "
                "model turn of it on this store"
            )
        saved = load(text, f"transaction `{tx.id}`")
        if saved.runner != cls._kind:
            use = _RUNNER_OF.get(saved.runner, "the runner that wrote it")
            raise InvalidArgument(
                f"the conversation of transaction `{tx.id}` was written by a {saved.runner} "
                f"runner, not {cls._kind}: restore it with {use}"
            )
        runner = cls(tx, history=saved.history if history is None else history, plans=plans)
        runner._claim()
        runner._messages = saved.messages
        runner._steps = saved.steps
        runner._turn = saved.turn
        runner._reconcile()
        return runner

    def _reconcile(self) -> None:
        """After a restore: answer from the journal the calls of the open turn that ran."""
        turn = self._turn
        if turn is None:
            return
        live = {
            s.call_id: s
            for s in self._tx.steps
            if s.call_id is not None and s.step_id >= turn.first_step
        }
        answers = list(turn.answers)
        for call in turn.rest:
            step = live.get(call.call_id)
            if step is None:
                break
            answers.append(_recorded(step.step_id, step.output, call.call_id))
            self._steps[call.call_id] = step.step_id
        answered = {o.call_id for o in answers}
        waiting = tuple(w for w in turn.waiting if w.call_id not in answered)
        turn = attrs.evolve(turn, answers=tuple(answers), waiting=waiting)
        if turn.rest and not waiting:
            waiting = self._found_waiting(turn.rest[0])
            turn = attrs.evolve(turn, waiting=waiting)
        self._turn = turn
        if not turn.rest:
            self._complete_turn(turn)

    def _found_waiting(self, call: ModelCall) -> tuple[Wait, ...]:
        """The request a crash left for the next call: one asked at the transaction's next
        step and not rejected (a rejected one answers the call sent again anyway)."""
        step = self._tx.next_step_id
        for row in requests_for(self._tx.store).of_scope(self._tx.id):
            if row.kind not in ("approval", "review"):
                continue  # a guarded call's start record: nothing a person decides
            if row.state not in ("pending", "approved", "resolved"):
                continue
            found = review_of(row) if row.kind == "review" else request_of(row)
            if found.step == step:
                kind: WaitKind = "review" if row.kind == "review" else "approval"
                return (Wait(call_id=call.call_id, kind=kind, request_id=row.id),)
        return ()

    # ------------------------------------------------------------------ waiting for people

    def _rows(self) -> list[tuple[Wait, RequestRow | None]]:
        turn = self._turn
        if turn is None or not turn.waiting:
            return []
        book = requests_for(self._tx.store)
        return [(w, book.get(w.request_id)) for w in turn.waiting]

    def _undecided(self) -> list[str]:
        """The waiting requests no person has decided yet, as `id (kind)`."""
        return [
            f"`{w.request_id}` ({w.kind})"
            for w, row in self._rows()
            if row is not None and row.state == "pending"
        ]

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a person decided every request the turn waits on (in this process or
        another, on the same store); True once they have, False if `timeout` seconds passed
        first (None: no limit). Polls the store with backoff (`DECISION_POLL`); returns at
        once when nothing waits. `InvalidArgument` for a negative or non-number timeout."""
        limit = _check_timeout(timeout)
        deadline = time.monotonic() + limit
        attempt = 0
        while self._undecided():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            attempt += 1
            time.sleep(min(DECISION_POLL.delay(attempt), left))
        return True

    async def await_decisions(self, timeout: float | None = None) -> bool:
        """`wait` for async code: sleeps on the event loop between polls."""
        limit = _check_timeout(timeout)
        deadline = time.monotonic() + limit
        attempt = 0
        while self._undecided():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            attempt += 1
            await asyncio.sleep(min(DECISION_POLL.delay(attempt), left))
        return True

    # ------------------------------------------------------------------ resume

    def _resumable(self) -> OpenTurn:
        turn = self._turn
        if turn is None:
            raise FailedPrecondition(
                f"{type(self).__name__}.resume: nothing to resume: the last turn of transaction "
                f"`{self._tx.id}` has every result; send the messages to the model"
            )
        undecided = self._undecided()
        if undecided:
            raise FailedPrecondition(
                f"{type(self).__name__}.resume: {', '.join(undecided)} still waits for a "
                "person's decision; call wait() first (agenttx approve / reject, or "
                "engine.approve / engine.reject, decide it)"
            )
        return attrs.evolve(turn, waiting=())

    def resume(self) -> list[Message]:
        """Complete the open turn once people decided; return the messages to send next.

        The waiting call is sent again (an approved call runs once with the approved, or the
        approver's edited, arguments; a rejected one is answered with the person's reason),
        then the calls after it; every result of the turn is appended in the calls' order.
        If another call of the turn needs a person, the turn waits again (`waiting`), and the
        messages end with the model's message. Raises `FailedPrecondition` if nothing is left
        to answer or a request is still undecided (changing nothing).
        """
        turn = self._resumable()
        self._turn = turn
        return self._go(turn, run_turn_with_plans(self._tx, turn.rest, plans=self._plans))

    async def aresume(self) -> list[Message]:
        """`resume` for async code: the calls run through `tx.acall_turn`."""
        turn = self._resumable()
        self._turn = turn
        return self._go(turn, await arun_turn_with_plans(self._tx, turn.rest, plans=self._plans))

    # ------------------------------------------------------------------ a model turn

    def _open(self, history: list[Message], calls: Sequence[ModelCall]) -> OpenTurn | None:
        """Take the model's new message: the history with it, written before any call runs."""
        if self._turn is not None:
            raise FailedPrecondition(
                f"{type(self).__name__}.handle: the last turn still waits for "
                f"{', '.join(self.unanswered)} (transaction `{self._tx.id}`); wait() for the "
                "people's decisions and resume() it before the next model turn"
            )
        self._claim()
        turn = OpenTurn(calls=tuple(calls), first_step=self._tx.next_step_id) if calls else None
        before = self._messages
        self._messages, self._turn = history, turn
        try:
            self._save()
        except BaseException:
            self._messages, self._turn = before, None
            raise
        return turn

    def _handle(self, history: list[Message], calls: Sequence[ModelCall]) -> list[Message]:
        turn = self._open(history, calls)
        if turn is None:
            return list(self._messages)
        return self._go(turn, run_turn_with_plans(self._tx, calls, plans=self._plans))

    async def _ahandle(self, history: list[Message], calls: Sequence[ModelCall]) -> list[Message]:
        turn = self._open(history, calls)
        if turn is None:
            return list(self._messages)
        return self._go(turn, await arun_turn_with_plans(self._tx, calls, plans=self._plans))

    def _go(self, turn: OpenTurn, outcomes: Sequence[Outcome]) -> list[Message]:
        """Take the outcomes of `turn.rest`: stop at a call that waits, else complete."""
        answers = list(turn.answers)
        for outcome in outcomes:
            result = outcome.result
            kind = None if result is None else _WAITS.get(result.status)
            if result is not None and kind is not None:
                request = result.approval if kind == "approval" else result.review
                request_id = "" if request is None else request.id
                wait = Wait(call_id=outcome.call_id, kind=kind, request_id=request_id)
                self._turn = attrs.evolve(turn, answers=tuple(answers), waiting=(wait,))
                self._save()
                return list(self._messages)
            answers.append(outcome)
            if result is not None and result.ok:
                self._steps[outcome.call_id] = result.step_id
        return self._complete_turn(attrs.evolve(turn, answers=tuple(answers), waiting=()))

    def _complete_turn(self, turn: OpenTurn) -> list[Message]:
        self._messages = self._complete(list(self._messages), turn.answers)
        self._turn = None
        self._save()
        return list(self._messages)

    def _complete(self, history: list[Message], outcomes: Sequence[Outcome]) -> list[Message]:
        """The provider's: `history` (a new list) with every result of the turn appended in
        order, then rewritten as the history policy says (see `_rewrite`)."""
        raise NotImplementedError  # pragma: no cover  (every provider's runner defines it)

    def _rewrite(self, outcomes: Sequence[Outcome]) -> Rewrite:
        """Record the steps of the calls that succeeded, then the rewrite the outcomes ask for."""
        for outcome in outcomes:
            if outcome.result is not None and outcome.result.ok:  # only live steps are voided
                self._steps[outcome.call_id] = outcome.result.step_id
        return rewrite_for(self._history, outcomes, self._steps)

    def _save(self) -> None:
        """Write the runner's state with the transaction, on a store that keeps it (fenced)."""
        store = self._tx.store
        if not keeps_conversations(store) or self._tx.status.terminal:
            return
        text = dump(self._kind, self._history, self._messages, self._steps, self._turn)
        store.record_conversation(self._tx.id, text)


#: The class to restore a conversation of each kind with, for the error that names it.
_RUNNER_OF: Final = {
    "openai.chat": "agenttx.integrations.openai.ToolRunner",
    "openai.responses": "agenttx.integrations.openai.ResponsesToolRunner",
    "anthropic": "agenttx.integrations.anthropic.ToolRunner",
    "langgraph": "agenttx.integrations.langchain.TransactionalToolNode",
    "pydantic_ai": "agenttx.integrations.pydantic_ai.restore",
}
