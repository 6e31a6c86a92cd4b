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
- **Plans in a turn.** With `plans=True` a turn's `propose_plan` calls are answered after its
  other calls (`_plan_calls`): each valid plan runs beside the turn (`start_plan`), under a
  run id derived from the transaction, the turn and the call id and kept in the conversation
  before it starts; the turn polls it (`PLAN_POLL`) and waits, as for a step, while one of its
  nodes waits for a person. When a tool call of the turn waits, its plan calls wait with it.
- **A durable conversation.** On a store that keeps conversations (`stores.ConversationStore`:
  SQLiteStore, PostgresStore) the runner writes its state (`_conversation.dump`) when a model
  message arrives, before any of its calls runs, when a turn stops to wait, and when it
  completes; each write fenced like every write of the transaction. `restore(tx)` reads it
  back and completes a turn a crash interrupted from the journal: a call already recorded as
  a live step (matched by call id, from the turn's first step) is answered from its recorded
  output, never run again; if a call of the turn failed or its steps were undone, the calls not
  kept are answered from the journal as that failure (`_undone`), never run again; a call
  waiting for a person shows in `waiting`; a plan call is answered from the run it started;
  the others run at `resume`.

Contracts: one runner per transaction in a process (a second one raises `FailedPrecondition`
while the first lives); misuse (`resume` with nothing to resume or an undecided request,
`handle` while a turn is open, a `handle` or `resume` while another of the runner is under
way, `restore` of a transaction with no stored conversation, of a
store that keeps none, or of another provider's conversation) raises a typed error and changes
nothing. Not thread-safe, like the runners.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import weakref
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeAlias, cast, final

import attrs
from typing_extensions import Self

from .._approvals import decision_of, request_of, requests_for, review_of
from .._errors import FailedPrecondition, InvalidArgument
from .._plans import PLAN_TOOL, plan_tool_spec
from .._results import StepResult, StepStatus
from .._saga import Backoff
from ..stores import decision_bell, keeps_conversations
from ._common import (
    History,
    Outcome,
    Rewrite,
    _not_run,
    arun_turn,
    check_history,
    check_transaction,
    plan_not_run,
    proposal_of,
    rewrite_for,
    run_turn,
)
from ._conversation import OpenTurn, Wait, WaitKind, dump, dump_messages, load
from ._plan_calls import PlanCalls, plan_run_id

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterator, Mapping, Sequence

    from .._approvals import ApprovalRequest, Review
    from .._json import JSONValue
    from .._tools import ToolSpec
    from .._transaction import Transaction
    from ..stores import Bell, RequestRow
    from ._common import ModelCall, Payload

__all__ = ["DECISION_POLL", "PLAN_POLL", "Runner", "decision_waits"]

#: How `wait` polls the store for decisions: 50 ms, doubling, at most 2 s, with full jitter.
DECISION_POLL: Final = Backoff(base=0.05, max_wait=2.0, jitter=True)

Message = dict[str, Any]

_WAITS: Final[dict[StepStatus, WaitKind]] = {
    StepStatus.NEEDS_APPROVAL: "approval",
    StepStatus.NEEDS_REVIEW: "review",
}

#: The runner of each transaction in this process (weakly: a runner dropped frees its place).
_RUNNERS: weakref.WeakKeyDictionary[Transaction, weakref.ref[Runner]] = weakref.WeakKeyDictionary()


def decision_waits(
    pending: Callable[[], object], timeout: object, bell: Bell
) -> Iterator[tuple[float, int] | None]:
    """The sleeps of a wait for people's decisions: each `(seconds, mark)` to sleep on the
    store's `bell` (`bell.sleep(seconds, mark)`, which a decision cuts short) before `pending()`
    is asked again (`DECISION_POLL`), then None once nothing is pending; it ends without None
    when `timeout` seconds (None: no limit) passed first. `InvalidArgument` for a negative or
    non-number timeout. One loop for the sync and the async waits of every integration."""
    deadline = time.monotonic() + _check_timeout(timeout)
    attempt = 0
    while True:
        mark = bell.mark()  # before asking: a decision made after it cuts the sleep short
        if not pending():
            break
        left = deadline - time.monotonic()
        if left <= 0:
            return
        attempt += 1
        yield min(DECISION_POLL.delay(attempt), left), mark
    yield None


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


@final
@attrs.frozen(kw_only=True)
class _Calls:
    """Work for a turn's driver: run these tool calls of `tx` as one turn, send back the
    outcomes."""

    tx: Transaction
    calls: Sequence[ModelCall]


_Work: TypeAlias = "_Calls | float"

#: How a turn polls a plan run that goes on: 20 ms, doubling, at most 0.5 s, with full jitter.
PLAN_POLL: Final = Backoff(base=0.02, max_wait=0.5, jitter=True)


def _wait_of(outcome: Outcome) -> Wait | None:
    """The wait of a call whose step waits for a person, else None."""
    result = outcome.result
    kind = None if result is None else _WAITS.get(result.status)
    if result is None or kind is None:
        return None
    request = result.approval if kind == "approval" else result.review
    request_id = "" if request is None else request.id
    return Wait(call_id=outcome.call_id, kind=kind, request_id=request_id)


def _drive(work: Generator[_Work, Any, list[Message]]) -> list[Message]:
    """Run `Runner._advance` in this thread: the calls through `run_turn`, sleeps blocking."""
    try:
        item = next(work)
        while True:
            if isinstance(item, _Calls):
                item = work.send(run_turn(item.tx, item.calls))
            else:
                time.sleep(item)
                item = next(work)
    except StopIteration as stop:
        return cast("list[Message]", stop.value)


async def _adrive(work: Generator[_Work, Any, list[Message]]) -> list[Message]:
    """`_drive` for async code: the calls through `arun_turn`, sleeps on the event loop."""
    try:
        item = next(work)
        while True:
            if isinstance(item, _Calls):
                item = work.send(await arun_turn(item.tx, item.calls))
            else:
                await asyncio.sleep(item)
                item = next(work)
    except StopIteration as stop:
        return cast("list[Message]", stop.value)


class Runner:
    """What every provider's runner holds: the transaction, the history policy, the step each
    call id was sent as (so a later rewind knows which calls it voided), the conversation and
    the turn in progress. See the module docstring for the contract.

    With `plans=True` the runner also offers the model `propose_plan` (`plan_spec`) and
    answers its calls (see the module docstring). Raises `InvalidArgument` for a `plans`
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
        self._kept: list[Message] = []  # the messages as recorded last (`_save`)
        self._turn: OpenTurn | None = None
        if not isinstance(plans, bool):
            raise InvalidArgument(f"plans must be True or False, got {plans!r:.80}")
        self._plans = plans
        self._plan_spec = plan_tool_spec(self._tx) if plans else None
        self._plan_calls = PlanCalls(self._tx)
        self._running: str | None = None  # the handle or resume under way, if any

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
        saved = load(text, f"transaction `{tx.id}`", lambda n: store.read_messages(tx.id, n))
        if saved.runner != cls._kind:
            use = _RUNNER_OF.get(saved.runner, "the runner that wrote it")
            raise InvalidArgument(
                f"the conversation of transaction `{tx.id}` was written by a {saved.runner} "
                f"runner, not {cls._kind}: restore it with {use}"
            )
        runner = cls(tx, history=saved.history if history is None else history, plans=plans)
        runner._claim()
        runner._messages = saved.messages
        runner._kept = [] if saved.format == 1 else list(saved.messages)
        runner._steps = saved.steps
        runner._turn = saved.turn
        runner._reconcile()
        return runner

    def _reconcile(self) -> None:
        """After a restore: answer from the journal the calls of the open turn that ran.

        A tool call recorded as a live step (by call id, from the turn's first step) is
        answered from its output. If a call of the turn failed meanwhile (the transaction's
        constraints gained a hint since the turn was written) or its steps were undone (the
        transaction is back before them), the calls not kept are answered from the journal
        as the failed turn they were, never run again (`_undone`). A `propose_plan` call is
        left to `resume`, which answers it from the run it started, if it started one.
        """
        turn = self._turn
        if turn is None:
            return
        tx = self._tx
        live = {s.call_id: s for s in tx.steps if s.call_id is not None}
        answers = list(turn.answers)
        left: list[ModelCall] = []
        expected = turn.first_step
        for call in turn.rest:
            if self._is_plan(call):
                continue
            step = live.get(call.call_id)
            if left or step is None or step.step_id < turn.first_step:
                left.append(call)
                continue
            answers.append(_recorded(step.step_id, step.output, call.call_id))
            self._steps[call.call_id] = step.step_id
            expected = step.step_id + 1
        turn = attrs.evolve(turn, answers=tuple(answers))
        hints = tx.constraints
        failed = hints != turn.constraints
        if left and (failed or tx.next_step_id < expected):
            turn = attrs.evolve(turn, answers=(*answers, *self._undone(left)))
        answered = {o.call_id for o in turn.answers}
        waiting = tuple(w for w in turn.waiting if w.call_id not in answered)
        turn = attrs.evolve(turn, waiting=waiting)
        if turn.rest and not waiting:
            turn = attrs.evolve(turn, waiting=self._found_waiting(turn))
        self._turn = turn
        if not turn.rest:
            self._complete_turn(turn)

    def _undone(self, calls: Sequence[ModelCall]) -> list[Outcome]:
        """The answers of tool calls of a turn that failed before a crash: the first with the
        failure (the transaction's latest hint) and the steps its rewind undid, so the
        history is rewritten as the runner would have; the others as not run."""
        tx = self._tx
        step = tx.next_step_id
        live = {s.step_id for s in tx.steps}
        voided = sorted((s, i) for i, s in self._steps.items() if s >= step and s not in live)
        hint = tx.constraints[-1] if tx.constraints else "Hint: Step failed."
        result = StepResult(
            status=StepStatus.FAILED,
            step_id=step,
            next_step_id=step,
            error=hint,
            call_id=calls[0].call_id,
            voided_steps=tuple(s for s, _ in voided),
            voided_call_ids=tuple(i for _, i in voided),
        )
        undone = ", ".join(str(s) for s, _ in voided)
        payload: Payload = {
            "ok": False,
            "step": None,
            "error": (
                f"{hint} (The call ran before the agent restarted: this failure ended the "
                "turn, and what it undid stays undone.)"
            ),
            "next_step": step,
        }
        if undone:
            payload["voided_steps"] = [s for s, _ in voided]
        payload["instruction"] = (
            f"Calls of this turn from here were not kept; continue with step {step}, "
            "sending again what is still needed."
        )
        first = Outcome(call_id=calls[0].call_id, payload=payload, is_error=True, result=result)
        return [first, *(_not_run(call, step, step) for call in calls[1:])]

    def _found_waiting(self, turn: OpenTurn) -> tuple[Wait, ...]:
        """The request a crash left for the next call: one asked at the transaction's next
        step and not rejected (a rejected one answers the call sent again anyway), or one a
        node of the run a plan call started waits on."""
        call = turn.rest[0]
        if self._is_plan(call):
            run_id = turn.run_of(call.call_id)
            ran = None if run_id is None else self._plan_calls.check(call, run_id)
            return (ran,) if isinstance(ran, Wait) else ()
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
        bell = decision_bell(self._tx.store)
        for pause in decision_waits(self._undecided, timeout, bell):
            if pause is None:
                return True
            bell.sleep(*pause)
        return False

    async def await_decisions(self, timeout: float | None = None) -> bool:
        """`wait` for async code: sleeps on the event loop between polls."""
        bell = decision_bell(self._tx.store)
        for pause in decision_waits(self._undecided, timeout, bell):
            if pause is None:
                return True
            await bell.asleep(*pause)
        return False

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
        approver's edited, arguments; a rejected one is answered with the person's reason,
        whole, under `rejection`), then the calls after it, then the turn's `propose_plan`
        calls (a plan run that waited goes on); every result of the turn is appended in the
        calls' order. If another call of the turn needs a person, the turn waits again
        (`waiting`), and the messages end with the model's message. Raises
        `FailedPrecondition` if nothing is left to answer, a request is still undecided, or
        another `resume` or `handle` of this runner is under way (changing nothing).
        """
        with self._busy("resume"):
            rejections = self._rejections()
            turn = self._resumable()
            self._turn = turn
            return _drive(self._advance(turn, rejections))

    async def aresume(self) -> list[Message]:
        """`resume` for async code: the calls run through `tx.acall_turn`."""
        with self._busy("aresume"):
            rejections = self._rejections()
            turn = self._resumable()
            self._turn = turn
            return await _adrive(self._advance(turn, rejections))

    def _rejections(self) -> dict[str, dict[str, JSONValue]]:
        """The rejected requests the turn waited on: call id -> who rejected it and why."""
        found: dict[str, dict[str, JSONValue]] = {}
        for wait, row in self._rows():
            if row is not None and row.state == "rejected":
                decision = decision_of(row)
                found[wait.call_id] = {
                    "by": str(decision.get("actor", "")),
                    "reason": str(decision.get("reason", "")),
                }
        return found

    @contextlib.contextmanager
    def _busy(self, what: str) -> Iterator[None]:
        """Hold the runner for one `handle` or `resume` (sync or async) at a time."""
        if self._running is not None:
            raise FailedPrecondition(
                f"{type(self).__name__}.{what}: this runner's {self._running} is under way "
                f"(transaction `{self._tx.id}`); wait for it to return"
            )
        self._running = what
        try:
            yield
        finally:
            self._running = None

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
        turn = (
            OpenTurn(
                calls=tuple(calls),
                first_step=self._tx.next_step_id,
                constraints=self._tx.constraints,
            )
            if calls
            else None
        )
        before = self._messages
        self._messages, self._turn = history, turn
        try:
            self._save()
        except BaseException:
            self._messages, self._turn = before, None
            raise
        return turn

    def _handle(self, history: list[Message], calls: Sequence[ModelCall]) -> list[Message]:
        with self._busy("handle"):
            turn = self._open(history, calls)
            if turn is None:
                return list(self._messages)
            return _drive(self._advance(turn, {}))

    async def _ahandle(self, history: list[Message], calls: Sequence[ModelCall]) -> list[Message]:
        with self._busy("handle"):
            turn = self._open(history, calls)
            if turn is None:
                return list(self._messages)
            return await _adrive(self._advance(turn, {}))

    def _is_plan(self, call: ModelCall) -> bool:
        return self._plans and call.name == PLAN_TOOL

    def _advance(
        self, turn: OpenTurn, rejections: Mapping[str, dict[str, JSONValue]]
    ) -> Generator[_Work, Any, list[Message]]:
        """Run what is left of `turn`: its tool calls as one turn (the driver runs them and
        sends their outcomes back), then its plan calls; stop where a call waits for a person,
        else complete the turn. Yields the work for the driver: the calls to run, or a delay
        to sleep while a plan run goes on."""
        rest = turn.rest
        others = [c for c in rest if not self._is_plan(c)]
        outcomes: Sequence[Outcome] = (yield _Calls(tx=self._tx, calls=others)) if others else ()
        answers = list(turn.answers)
        for outcome in outcomes:
            wait = _wait_of(outcome)
            if wait is not None:
                return self._wait(attrs.evolve(turn, answers=tuple(answers)), wait)
            rejected = rejections.get(outcome.call_id)
            if rejected is not None and outcome.is_error:
                answers.append(
                    attrs.evolve(outcome, payload={**outcome.payload, "rejection": rejected})
                )
            else:
                answers.append(outcome)
            if outcome.result is not None and outcome.result.ok:
                self._steps[outcome.call_id] = outcome.result.step_id
        turn = attrs.evolve(turn, answers=tuple(answers), waiting=())
        failed = any(o.is_error for o in answers)
        for call in (c for c in rest if self._is_plan(c)):
            run_id = turn.run_of(call.call_id)
            if run_id is None:
                checked = plan_not_run(call, self._tx) if failed else proposal_of(self._tx, call)
                if isinstance(checked, Outcome):
                    turn = attrs.evolve(turn, answers=(*turn.answers, checked))
                    failed = failed or checked.is_error
                    continue
                run_id = plan_run_id(self._tx.id, turn.first_step, call.call_id)
                turn = attrs.evolve(turn, plans=(*turn.plans, (call.call_id, run_id)))
                self._turn = turn
                self._save()  # the run's id is kept before the run starts
                self._plan_calls.start(checked, run_id)
            attempt = 0
            while (found := self._plan_calls.check(call, run_id)) is None:
                attempt += 1
                yield PLAN_POLL.delay(attempt)
            if isinstance(found, Wait):
                return self._wait(turn, found)
            turn = attrs.evolve(turn, answers=(*turn.answers, found))
            failed = failed or found.is_error
        return self._complete_turn(turn)

    def _wait(self, turn: OpenTurn, wait: Wait) -> list[Message]:
        """Stop `turn` where `wait` waits for a person, and keep it."""
        self._turn = attrs.evolve(turn, waiting=(wait,), constraints=self._tx.constraints)
        self._save()
        return list(self._messages)

    def _complete_turn(self, turn: OpenTurn) -> list[Message]:
        self._messages = self._complete(list(self._messages), turn.ordered())
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
        """Write the runner's state with the transaction, on a store that keeps it (fenced).

        Append-only: the messages recorded last time (the same objects, in the same places)
        are not written again; the write gives the messages from the first one that changed,
        usually the turn's new ones, with the small record of the rest of the state. A
        message is never changed in place (a rewrite makes a new one), so identity tells.
        """
        store = self._tx.store
        if not keeps_conversations(store) or self._tx.status.terminal:
            return
        messages, kept = self._messages, self._kept
        start, end = 0, min(len(kept), len(messages))
        while start < end and messages[start] is kept[start]:
            start += 1
        new = dump_messages(messages[start:])
        text = dump(self._kind, self._history, len(messages), self._steps, self._turn)
        store.record_conversation(self._tx.id, text, new, start=start)
        self._kept = list(messages)


#: The class to restore a conversation of each kind with, for the error that names it.
_RUNNER_OF: Final = {
    "openai.chat": "agenttx.integrations.openai.ToolRunner",
    "openai.responses": "agenttx.integrations.openai.ResponsesToolRunner",
    "anthropic": "agenttx.integrations.anthropic.ToolRunner",
    "langgraph": "agenttx.integrations.langchain.TransactionalToolNode",
    "pydantic_ai": "agenttx.integrations.pydantic_ai.restore",
}
