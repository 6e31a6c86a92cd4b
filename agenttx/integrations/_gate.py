"""One model turn at a time, for frameworks that run each tool call of a turn as its own task.

The OpenAI Agents SDK and pydantic-ai hand every tool call of a model turn to its own asyncio
task, started in the model's order. `TurnGate` puts those calls back together as a turn: they
run one at a time, in arrival order, each as a one-call turn through `_common.arun_turn` (so
the model-side problems become tool results exactly as for the other integrations), and once
one call of a turn has failed the later calls of that turn are not run (the "turn barrier"):
each gets the payload of a `StepStatus.NOT_RUN` result. A later call of a failed turn was
written by the model for the steps before the failure; after a rewind (or a resend of the
failed step) running it would give it another step's number. The gate also remembers the
calls whose results asked for a history rewrite, so the framework's history hook can apply
`_common.rewrite_for` before the next model request. A call id is unique within its model
turn only (docs/protocol.md#call-ids-and-turns): a later turn may send an id again, and a call
that repeats the id of an earlier call of its own turn is refused (the turn barrier follows).

People in the loop: a call that waits for a person stops its turn, and the later calls of the
turn wait with it (`waits_in`, `wait_with`). Once people decided, `decide_waiting` tells the
framework what to do with each call its run stopped on, in order: send it again, answer it
without sending it (not run, or its recorded result), or let it wait on the request it asks
now, in its order. A call that a person approved and that ran already, sent again with the
same id, tool and arguments (a saved run state resumed twice), is answered with its recorded
result, never run or asked again.
"""

from __future__ import annotations

import asyncio
import json
import uuid
import weakref
from typing import TYPE_CHECKING, Final, cast, final

import attrs

from .._approvals import (
    call_digest,
    decision_of,
    needs_approval,
    request_of,
    requests_for,
    review_of,
)
from .._results import StepResult, StepStatus
from .._transaction import plan_setting
from .._turns import TurnCall, not_run
from ._common import (
    ModelCall,
    Outcome,
    Rewrite,
    _not_run,
    _refused,
    arun_turn,
    check_transaction,
    rewrite_for,
    run_turn,
)

if TYPE_CHECKING:
    from collections.abc import Hashable

    from .._json import JSONValue
    from .._transaction import Transaction
    from ._common import History

__all__ = ["Decided", "TurnGate", "gate_for"]

#: The statuses of a call that waits for a person.
_WAITING: Final = frozenset({StepStatus.NEEDS_APPROVAL, StepStatus.NEEDS_REVIEW})


@final
class TurnGate:
    """The calls of one transaction, one at a time and a model turn at a time.

    Contract: `call` runs each call as the next step of the transaction, in the order the calls
    reach the gate (FIFO per event loop: `asyncio.Lock` wakes its waiters in order). `turn`
    identifies the model turn the call belongs to: once a call of a turn has failed, every
    later call with the same `turn` gets a not-run payload without touching the transaction.
    What the model got wrong, or a call after the transaction ended, is a payload, never an
    exception (`_common.arun_turn`). Calls from two event loops running at once on one
    transaction are serialized by the transaction itself, but the barrier then sees them in
    the transaction's order.
    """

    __slots__ = (
        "_anchor",
        "_barred",
        "_failed",
        "_failure",
        "_locks",
        "_rewinds",
        "_sent",
        "_steps",
        "_tx",
        "_waits",
        "_with",
    )

    def __init__(self, tx: Transaction) -> None:
        # Weak: `_GATES` keeps the gate as long as its transaction lives; whoever calls through
        # the gate (a tool, a toolset) holds the transaction itself and passes it to `call`.
        self._tx = weakref.ref(tx)
        self._failed: Hashable | None = None  # the turn that has failed, if any
        self._failure: Outcome | None = None  # the outcome of its failed call
        self._anchor: object = None  # keeps alive what the failed turn's key names by id
        self._rewinds: list[Outcome] = []  # the outcomes that voided calls, in order
        self._steps: dict[str, int] = {}  # call id -> the step it ran as
        self._sent: tuple[Hashable, dict[str, int], object] | None = None  # a turn's call ids
        self._waits: dict[str, Hashable] = {}  # call id -> its turn, for calls that wait
        self._with: dict[str, Hashable] = {}  # call id -> the turn of the call it waits with
        self._barred: dict[Hashable, Outcome] = {}  # turn -> its waiting call's failure
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def transaction(self) -> Transaction:
        """The transaction the calls run on."""
        tx = self._tx()
        assert tx is not None, "a gate outlived its transaction"  # its users hold it
        return tx

    @property
    def voided_call_ids(self) -> frozenset[str]:
        """Every call id a rewind has voided so far (their steps were undone)."""
        return frozenset(
            call_id
            for outcome in self._rewinds
            if outcome.result is not None
            for call_id in outcome.result.voided_call_ids
        )

    def rewrite(self, history: History) -> Rewrite:
        """The history rewrite every rewind so far asks for under `history`, merged."""
        drop: set[str] = set()
        replace: dict[str, dict[str, JSONValue]] = {}
        notes: dict[str, str] = {}
        voided: dict[str, frozenset[int]] = {}
        for outcome in self._rewinds:
            one = rewrite_for(history, [outcome], self._steps)
            drop |= one.drop
            replace.update(one.replace)
            notes.update(one.notes)
            for call_id, steps in one.voided.items():
                voided[call_id] = voided.get(call_id, frozenset()) | steps
        return Rewrite(
            drop=frozenset(drop),
            replace=replace,
            notes=notes,
            voided=voided,
            truncate=history == "truncate" and bool(voided),
        )

    def waits_in(self, turn: Hashable) -> bool:
        """Whether a call of model turn `turn` waits for a person (it has not been sent again
        since): a later call of that turn is to wait with it, its step comes after."""
        return any(waiting == turn for waiting in self._waits.values())

    def wait_with(self, call_id: str, turn: Hashable) -> None:
        """Note that call `call_id` of model turn `turn` waits with the call of `turn` that
        waits for a person (`waits_in`): if that call fails once sent again, this one is not
        run (`decide_waiting`)."""
        self._with[call_id] = turn

    async def call(
        self,
        tx: Transaction,
        turn: Hashable,
        name: str,
        arguments: object,
        *,
        call_id: str | None,
        anchor: object = None,
    ) -> dict[str, JSONValue]:
        """Run one call of model turn `turn` on `tx` and return the payload for the model.

        `tx` is the gate's transaction: the caller passes it (and so keeps it alive).
        `arguments` is what the model sent (JSON text or a decoded value). `anchor` is kept
        alive while `turn` is the failed turn: pass the object whose `id()` is part of `turn`,
        so that id cannot name another turn meanwhile. A missing `call_id` gets a fresh one.
        """
        outcome = await self.run(tx, turn, name, arguments, call_id=call_id, anchor=anchor)
        return outcome.payload

    async def run(
        self,
        tx: Transaction,
        turn: Hashable,
        name: str,
        arguments: object,
        *,
        call_id: str | None,
        anchor: object = None,
    ) -> Outcome:
        """`call`, returning the whole outcome. A call that waits for a person
        (`NEEDS_APPROVAL`, `NEEDS_REVIEW`) stops its turn like a failure, except for itself:
        sent again in the same turn (once decided) it runs, and the turn goes on."""
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        model_call = ModelCall(
            call_id=call_id or f"agenttx-{uuid.uuid4().hex}", name=name, arguments=arguments
        )
        async with lock:
            waited = self._waits.pop(model_call.call_id, None)
            resent = waited is not None and waited == turn
            if resent:  # the waiting call, once decided: it holds the turn no more
                self._failed, self._failure, self._anchor = None, None, None
            failure = self._failure
            if failure is not None and self._failed == turn and not tx.status.terminal:
                payload = self._not_run(tx, name, model_call, failure)
                return Outcome(call_id=model_call.call_id, payload=payload, is_error=True)
            outcome = None if resent else self._repeated(tx, turn, model_call, anchor)
            if outcome is None and not resent:
                outcome = _approved_before(tx, name, model_call)
            if outcome is None:
                (outcome,) = await arun_turn(tx, [model_call])
            if outcome.is_error:
                self._failed, self._failure, self._anchor = turn, outcome, anchor
                if waited is not None:  # the calls that waited with it are not to run
                    self._barred[waited] = outcome
            self._note(turn, outcome)
            return outcome

    def _note(self, turn: Hashable, outcome: Outcome) -> None:
        """Keep what the gate needs to know of `outcome`, a call of model turn `turn`."""
        result = outcome.result
        if result is not None:
            if result.status in _WAITING:
                self._waits[outcome.call_id] = turn
            if result.ok:
                self._steps[outcome.call_id] = result.step_id
            if result.voided_call_ids:
                self._rewinds.append(outcome)

    def decide_waiting(
        self, tx: Transaction, name: str, call_id: str, arguments: object
    ) -> Decided:
        """What a framework does with call `call_id` (of tool `name`, `arguments` as the model
        sent them) that its run stopped on for a person, once nothing of `tx` waits.

        The framework kept the call waiting; agenttx may not have asked anyone about it yet
        (it waited with an earlier call of its turn, `wait_with`). In order:

        - the call it waited with failed once sent again: answered as not run (the turn
          barrier);
        - it ran already (a saved run state resumed twice): answered with its recorded result,
          never run or asked again;
        - a person decided a request for it (approved, edited or rejected): `send` it again,
          the transaction runs it with the decision (or answers the person's reason); so is a
          call whose tool needs no approval;
        - else it is sent to the transaction now, in its order (the calls before it ran): if
          it needs approval, its request is asked and it waits (`Decided()`: the framework
          stops on it again); if not, it runs now and is answered with its payload.

        Synchronous (`run_turn`): call it while the framework's run is not running.
        """
        call = ModelCall(call_id=call_id, name=name, arguments=arguments)
        turn = self._with.get(call_id)
        barred = None if turn is None else self._barred.get(turn)
        if barred is not None:
            return Decided(payload=self._not_run(tx, name, call, barred))
        ran = _approved_before(tx, name, call)
        if ran is not None:
            return Decided(payload=ran.payload)
        if _asked(tx, name, call) or not _may_wait(tx, name, call):
            return Decided(send=True)
        (outcome,) = run_turn(tx, [call])
        self._note(("decided", call_id) if turn is None else turn, outcome)
        result = outcome.result
        if result is not None and result.status in _WAITING:
            self._waits.pop(call_id, None)  # the framework sends it again: not a resend
            return Decided()
        if outcome.is_error and turn is not None:
            self._barred[turn] = outcome
        return Decided(payload=outcome.payload)

    def _repeated(
        self, tx: Transaction, turn: Hashable, call: ModelCall, anchor: object
    ) -> Outcome | None:
        """The refusal of a call whose id an earlier call of its turn has, else None (and the
        id is noted for the turn). Each call runs as a turn of its own in the transaction,
        so the gate, which knows the model's turn, is the one to tell. `anchor` is kept alive
        with the turn's ids (see `call`)."""
        sent = self._sent
        if sent is None or sent[0] != turn:
            self._sent = sent = (turn, {}, anchor)
        ids = sent[1]
        first = ids.get(call.call_id)
        if first is None:
            ids[call.call_id] = tx.next_step_id
            return None
        why = f"call id '{call.call_id}' was already sent in this turn, as step {first}"
        return _refused(call, tx.next_step_id, why)

    @staticmethod
    def _not_run(
        tx: Transaction, name: str, call: ModelCall, failure: Outcome
    ) -> dict[str, JSONValue]:
        """The payload of a call after `failure` in its turn, as `call_turn` answers it."""
        failed = failure.result
        if failed is None:  # refused before it became a step (over a limit)
            step = tx.next_step_id
            first = failure.payload.get("step")
            first = first if isinstance(first, int) else step
            return _not_run(call, first, step, refused=True).payload
        result = not_run(TurnCall(name, "{}"), failed)
        return attrs.evolve(result, call_id=call.call_id).for_model()


def _approved_before(tx: Transaction, name: str, call: ModelCall) -> Outcome | None:
    """The recorded answer of `call` if it is an approved call that ran already, else None.

    A framework that resumes a saved run state twice (a double click, two workers) sends the
    call a person approved twice. The first consumed the approval and ran as a live step;
    sent again, with the same call id, tool and arguments, the step gate would open a second
    request for it. The second is answered with what the first got instead: never run or
    asked again. Only a live step whose approval was consumed for this digest counts.
    """
    found = [s for s in tx.steps if s.call_id == call.call_id and s.tool_name == name]
    ok, arguments = _parsed(call)
    if not found or not ok:
        return None
    digest = call_digest(name, arguments)
    steps = {s.step_id: s for s in found}
    for row in requests_for(tx.store).of_scope(tx.id):
        if row.kind != "approval" or row.state not in ("consumed", "finished"):
            continue
        decision = decision_of(row)
        step = steps.get(decision.get("consumed_step"))  # type: ignore[arg-type]
        if step is None or decision.get("consumed_node") is not None:
            continue
        if digest in (row.digest, decision.get("digest")):
            result = StepResult(
                status=StepStatus.SUCCESS,
                step_id=step.step_id,
                next_step_id=tx.next_step_id,
                output=step.output,
                call_id=call.call_id,
            )
            return Outcome(
                call_id=call.call_id, payload=result.for_model(), is_error=False, result=None
            )
    return None


@final
@attrs.frozen(kw_only=True)
class Decided:
    """`TurnGate.decide_waiting`'s answer: `send` the call again, answer it with `payload`
    (not sending it), or, with neither, let it wait: its request was just asked."""

    send: bool = False
    payload: dict[str, JSONValue] | None = None


def _parsed(call: ModelCall) -> tuple[bool, JSONValue]:
    """`(True, the call's arguments decoded)`, or `(False, None)` if they are not JSON."""
    text = call.arguments
    try:
        value = cast("JSONValue", json.loads(text) if isinstance(text, str) else text)
        call_digest("", value)  # encodable
    except (TypeError, ValueError, RecursionError):
        return False, None
    return True, value


def _asked(tx: Transaction, name: str, call: ModelCall) -> bool:
    """Whether a person decided a request of `tx` for `call` that is still to be used: one
    for its digest (the arguments as sent), or one asked at the transaction's next step for
    its tool (arguments that refer to earlier steps resolve to other values)."""
    ok, arguments = _parsed(call)
    digest = call_digest(name, arguments) if ok else None
    step = tx.next_step_id
    for row in requests_for(tx.store).of_scope(tx.id):
        if row.kind not in ("approval", "review"):
            continue
        if row.state not in ("approved", "rejected", "resolved"):
            continue
        decision = decision_of(row)
        if digest is not None and digest in (row.digest, decision.get("digest")):
            return True
        asked = request_of(row) if row.kind == "approval" else review_of(row)
        if asked.step == step and asked.tool == name:
            return True
    return False


def _may_wait(tx: Transaction, name: str, call: ModelCall) -> bool:
    """Whether `call` may need a person's approval (its tool's rule on the arguments as sent;
    the transaction decides on the checked arguments when it is sent)."""
    tool = plan_setting(tx)[0].get(name)
    if tool is None or tool.needs_approval is False:
        return False
    ok, arguments = _parsed(call)
    return not ok or needs_approval(tool.needs_approval, name, arguments) is not False


#: One gate per transaction, for as long as the transaction lives, so every tool and history
#: hook of one transaction shares it (the gate refers to its transaction weakly: no cycle).
_GATES: weakref.WeakKeyDictionary[Transaction, TurnGate] = weakref.WeakKeyDictionary()


def gate_for(tx: object, where: str) -> TurnGate:
    """The transaction's gate (made on first use); `InvalidArgument` if `tx` is not one.

    Whoever calls through the gate holds the transaction and passes it to `TurnGate.call`.
    """
    checked = check_transaction(tx, where)
    gate = _GATES.get(checked)
    if gate is None:
        gate = _GATES[checked] = TurnGate(checked)
    return gate
