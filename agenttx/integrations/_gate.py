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
now, in its order.

A saved run state resumed twice (a double click, two workers, at once or one after the
other) sends the call it stopped on twice. The gate keeps, for each call a run stopped on,
the request asked for it (`_Stop`); the framework says which calls it sends again as that
stop (`run(resend=True)`: the SDK's approved interruption, pydantic-ai's approved deferred
call). Such a call whose request a live step of the same call id and tool used (an approval
consumed, a review applied) is answered with that step's recorded result, never run or
asked again; the check and the run hold the transaction's turn lock, so two event loops
resuming at once give one run. A call of a later model turn that reuses the id is never such
a resend: it gets its own request and runs.
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
    loads,
    needs_approval,
    requests_for,
    review_of,
)
from .._errors import InvalidTransactionState
from .._refs import resolve_value
from .._results import StepResult, StepStatus
from .._transaction import plan_setting, turn_lock
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
    from collections.abc import Hashable, Sequence

    from .._json import JSONValue
    from .._transaction import Transaction
    from ..stores import RequestRow
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
        "_stops",
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
        self._stops: dict[str, _Stop] = {}  # call id -> what its run last stopped on for it
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

    def wait_with(self, call_id: str, turn: Hashable, name: str, arguments: object) -> None:
        """Note that call `call_id` of model turn `turn` (of tool `name`, `arguments` as the
        model sent them) waits with the call of `turn` that waits for a person (`waits_in`):
        if that call fails once sent again, this one is not run (`decide_waiting`); no request
        was asked for it, so it has not run when it is sent again."""
        self._with[call_id] = turn
        digest = _raw_digest(name, arguments)
        if digest is not None:
            self._stops[call_id] = _Stop(digest=digest)

    def sends_first(self, call_id: str, later: Sequence[tuple[str, str, object]]) -> None:
        """Note that the framework sends again call `call_id`, the first of the calls a saved
        run state stopped on, and that the calls `later` ((call id, tool, arguments), in the
        model's order) of that state wait behind it: if it fails once sent, they are answered
        as not run (`decide_waiting`), as when this gate saw them wait. For a state this gate
        did not see stop (a new process): what it saw itself wins. Whether a later call ran
        already is still looked up in the store."""
        if call_id in self._waits or not later:
            return
        key = ("sent first", call_id)
        self._waits[call_id] = key
        for later_id, _name, _arguments in later:
            if later_id not in self._with and later_id not in self._stops:
                self._with[later_id] = key

    def stopped(self, call_id: str, name: str, arguments: object, request: str | None) -> None:
        """Note that a run stopped on call `call_id` (of tool `name`, `arguments` as sent) for
        request `request` (None: it waited with an earlier call of its turn), as the framework
        kept it with the call. What the gate saw itself wins (it may know more: that the call
        ran since). Else what the caller hands over is not believed: the request asked for the
        call and the step that ran it are looked up in the store by the call id each request
        records (see `_ran_before`), so a request named for another call, or a call that
        waited with an earlier one and was asked and run since, is never taken at its word."""
        del request  # the store says which request was asked for the call
        digest = _raw_digest(name, arguments)
        known = self._stops.get(call_id)
        if known is not None and known.digest != digest:
            del self._stops[call_id]  # another call with the id: look it up in the store

    async def call(
        self,
        tx: Transaction,
        turn: Hashable,
        name: str,
        arguments: object,
        *,
        call_id: str | None,
        anchor: object = None,
        resend: bool = False,
    ) -> dict[str, JSONValue]:
        """Run one call of model turn `turn` on `tx` and return the payload for the model.

        `tx` is the gate's transaction: the caller passes it (and so keeps it alive).
        `arguments` is what the model sent (JSON text or a decoded value). `anchor` is kept
        alive while `turn` is the failed turn: pass the object whose `id()` is part of `turn`,
        so that id cannot name another turn meanwhile. A missing `call_id` gets a fresh one.
        `resend`: the framework sends again the call its run stopped on (see `run`).
        """
        outcome = await self.run(
            tx, turn, name, arguments, call_id=call_id, anchor=anchor, resend=resend
        )
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
        resend: bool = False,
    ) -> Outcome:
        """`call`, returning the whole outcome. A call that waits for a person
        (`NEEDS_APPROVAL`, `NEEDS_REVIEW`) stops its turn like a failure, except for itself:
        sent again in the same turn (once decided) it runs, and the turn goes on.

        `resend=True` says the framework sends again, once people decided, the call a saved
        run state stopped on (the SDK's approved interruption, pydantic-ai's approved
        deferred call), perhaps for the second time: if the request it stopped on was used by
        a live step of this call id and tool, it is answered with that step's recorded
        result. The check and the run are one turn of the transaction (its turn lock), so two
        workers resuming one state at once run it once. Any other call is run as it comes."""
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
            if outcome is None and resend:
                async with turn_lock(tx):  # the check and the run: one decision
                    outcome = self._ran_before(tx, name, model_call)
                    if outcome is None:
                        (outcome,) = await arun_turn(tx, [model_call])
                        self._ran(name, model_call, outcome)
            if outcome is None:
                (outcome,) = await arun_turn(tx, [model_call])
            if outcome.is_error:
                self._failed, self._failure, self._anchor = turn, outcome, anchor
                if waited is not None:  # the calls that waited with it are not to run
                    self._barred[waited] = outcome
            self._note(turn, outcome, name, model_call)
            return outcome

    def _note(self, turn: Hashable, outcome: Outcome, name: str, call: ModelCall) -> None:
        """Keep what the gate needs to know of `outcome`, call `call` (of tool `name`) of
        model turn `turn`."""
        result = outcome.result
        if result is not None:
            if result.status in _WAITING:
                self._waits[outcome.call_id] = turn
                request = result.approval or result.review
                digest = _raw_digest(name, call.arguments)
                if digest is not None:
                    asked = None if request is None else request.id
                    self._stops[outcome.call_id] = _Stop(digest=digest, request=asked)
            if result.ok:
                self._steps[outcome.call_id] = result.step_id
            if result.voided_call_ids:
                self._rewinds.append(outcome)

    def _ran(self, name: str, call: ModelCall, outcome: Outcome) -> None:
        """Note the step a call sent again as its stop ran as: sent again once more (the same
        saved state resumed again), it is answered from that step."""
        result = outcome.result
        digest = _raw_digest(name, call.arguments)
        if result is None or not result.ok or digest is None:
            return
        stop = self._stops.get(call.call_id)
        if stop is None or stop.digest != digest:
            stop = _Stop(digest=digest)
        self._stops[call.call_id] = attrs.evolve(stop, ran=result.step_id)

    def _ran_before(self, tx: Transaction, name: str, call: ModelCall) -> Outcome | None:
        """The recorded answer of `call`, sent again as the call a run stopped on, if it ran
        already: the request it stopped on (as this gate knows it, else the newest request
        asked for its call id and arguments, as the store records it) was used by a live step
        of this call id and tool (an approval consumed, a review applied), or the gate saw it
        run as that step. Else None."""
        digest = _raw_digest(name, call.arguments)
        if digest is None:
            return None
        stop = self._stops.get(call.call_id)
        if stop is not None and stop.digest == digest:
            if stop.ran is not None:
                return _recorded(tx, name, call, stop.ran)
            if stop.request is None:  # it waited with an earlier call: never asked, never run
                return None
            row = requests_for(tx.store).get(stop.request)
            return None if row is None else _recorded(tx, name, call, _used_at(row))
        # Nothing known in this process (it restarted): the newest request asked for this call
        # id and its arguments, as the store records it (never another call's request).
        row = _newest(tx, {digest, _checked_digest(tx, name, call)}, call.call_id)
        return None if row is None else _recorded(tx, name, call, _used_at(row))

    def _asked(self, tx: Transaction, name: str, call: ModelCall) -> bool:
        """Whether a person decided a request for `call` that is still to be used: the one
        asked for it when its run stopped (as this gate knows it), else, as the transaction
        finds it when the call is sent, a review of its arguments at the next step resolved,
        or the newest approval request of its arguments approved or rejected. A request of
        another call (an earlier step, one a rewind undid) never counts."""
        digest = _raw_digest(name, call.arguments)
        stop = self._stops.get(call.call_id)
        if digest is not None and stop is not None and stop.digest == digest:
            if stop.request is None:  # it waited with an earlier call: nothing asked yet
                return False
            row = requests_for(tx.store).get(stop.request)
            return row is not None and _decided(row)
        digests = {digest, _checked_digest(tx, name, call)} - {None}
        rows = [
            r
            for r in requests_for(tx.store).of_scope(tx.id)
            if _of(r, digests) and _asked_for(r, call.call_id)
        ]
        step = tx.next_step_id
        for row in rows:
            if row.kind == "review" and row.state == "resolved" and review_of(row).step == step:
                return True
        newest = next((r for r in reversed(rows) if r.kind == "approval"), None)
        return newest is not None and newest.state in ("approved", "rejected")

    def decide_waiting(
        self, tx: Transaction, name: str, call_id: str, arguments: object
    ) -> Decided:
        """What a framework does with call `call_id` (of tool `name`, `arguments` as the model
        sent them) that its run stopped on for a person, once nothing of `tx` waits.

        The framework kept the call waiting; agenttx may not have asked anyone about it yet
        (it waited with an earlier call of its turn, `wait_with`). In order:

        - the call it waited with failed once sent again: answered as not run (the turn
          barrier);
        - it ran already (a saved run state resumed twice: the request it stopped on was used
          by a live step of this call id and tool, see `run`): answered with its recorded
          result, never run or asked again;
        - a person decided the request asked for it (approved, edited or rejected; a review
          resolved): `send` it again, the transaction runs it with the decision (or answers
          the person's reason); so is a call whose tool needs no approval;
        - else it is sent to the transaction now, in its order (the calls before it ran): if
          it needs approval, its request is asked and it waits (`Decided()`: the framework
          stops on it again); if not, it runs now and is answered with its payload.

        Synchronous (`run_turn`): call it while the framework's run is not running, never from
        a call of `tx` (a tool): `InvalidTransactionState` then (the call it would decide could
        not run inside the one that runs). From async code use `adecide_waiting`.
        """
        call = ModelCall(call_id=call_id, name=name, arguments=arguments)
        turn = self._with.get(call_id)
        early = self._barred_answer(tx, name, call, turn)
        if early is not None:
            return early
        lock = turn_lock(tx)
        with lock:  # what it finds and what it runs: one decision
            early = self._found(tx, name, call)
            if early is not None:
                return early
            (outcome,) = run_turn(tx, [call])
        return self._decided(turn, outcome, name, call)

    async def adecide_waiting(
        self, tx: Transaction, name: str, call_id: str, arguments: object
    ) -> Decided:
        """`decide_waiting` for async code: the turn lock is awaited and the call runs with
        `arun_turn`, so the event loop is never blocked (nor is a run of `tx` on it).
        `InvalidTransactionState` from a call of `tx` (a tool), as for `decide_waiting`."""
        call = ModelCall(call_id=call_id, name=name, arguments=arguments)
        turn = self._with.get(call_id)
        early = self._barred_answer(tx, name, call, turn)
        if early is not None:
            return early
        async with turn_lock(tx):  # what it finds and what it runs: one decision
            early = self._found(tx, name, call)
            if early is not None:
                return early
            (outcome,) = await arun_turn(tx, [call])
        return self._decided(turn, outcome, name, call)

    def _barred_answer(
        self, tx: Transaction, name: str, call: ModelCall, turn: Hashable | None
    ) -> Decided | None:
        """The not-run answer of a call whose turn failed before it; `InvalidTransactionState`
        when called from inside a call of `tx`; else None."""
        if turn_lock(tx).held_here:
            error = InvalidTransactionState(tx_id=tx.id, status=tx.status.value)
            message = (
                f"approve_decided (decide_waiting) was called from inside a call of "
                f"transaction `{tx.id}` (a tool): the calls it decides cannot run inside the "
                "one that runs now; call it once the run has stopped, outside the tools"
            )
            error.args = (message,)
            raise error
        barred = None if turn is None else self._barred.get(turn)
        if barred is not None:
            return Decided(payload=self._not_run(tx, name, call, barred))
        return None

    def _found(self, tx: Transaction, name: str, call: ModelCall) -> Decided | None:
        """Under the turn lock: the answer of a call that ran already, `send` for one a person
        decided (or one that needs no approval), else None (it is to be sent now)."""
        ran = self._ran_before(tx, name, call)
        if ran is not None:
            return Decided(payload=ran.payload)
        if self._asked(tx, name, call) or not _may_wait(tx, name, call):
            return Decided(send=True)
        return None

    def _decided(
        self, turn: Hashable | None, outcome: Outcome, name: str, call: ModelCall
    ) -> Decided:
        """What `decide_waiting` answers once the call was sent to the transaction."""
        call_id = call.call_id
        self._note(("decided", call_id) if turn is None else turn, outcome, name, call)
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


def _used_at(row: RequestRow) -> int | None:
    """The transaction step that used request `row`: an approval consumed by a step (not a
    plan node), or a review its step applied; None if no step used it."""
    if row.kind == "approval" and row.state in ("consumed", "finished"):
        decision = decision_of(row)
        step = decision.get("consumed_step")
        if decision.get("consumed_node") is None and isinstance(step, int):
            return step
    if row.kind == "review" and row.state == "applied":
        return review_of(row).step
    return None


def _recorded(tx: Transaction, name: str, call: ModelCall, step_id: int | None) -> Outcome | None:
    """The answer of `call` from live step `step_id` if that step is this call (its call id
    and tool), else None."""
    step = next(
        (
            s
            for s in tx.steps
            if s.step_id == step_id and s.call_id == call.call_id and s.tool_name == name
        ),
        None,
    )
    if step is None:
        return None
    result = StepResult(
        status=StepStatus.SUCCESS,
        step_id=step.step_id,
        next_step_id=tx.next_step_id,
        output=step.output,
        call_id=call.call_id,
    )
    return Outcome(call_id=call.call_id, payload=result.for_model(), is_error=False, result=None)


def _of(row: RequestRow, digests: set[str | None]) -> bool:
    """Whether `row` is an approval request or a review of a call of one of `digests` (as
    sent, or as an approver edited it)."""
    if row.kind not in ("approval", "review"):
        return False
    return row.digest in digests or decision_of(row).get("digest") in digests


def _asked_for(row: RequestRow, call_id: str) -> bool:
    """Whether request `row` may have been asked for the call with id `call_id`: the call id
    its record names (a request asked by an older version names none: it may be)."""
    asked = loads(row.record).get("call_id")
    return asked is None or asked == call_id


def _newest(tx: Transaction, digests: set[str | None], call_id: str) -> RequestRow | None:
    """The newest approval request or review of `tx` for a call of one of `digests` asked for
    call id `call_id` (one asked for another call never counts)."""
    rows = requests_for(tx.store).of_scope(tx.id)
    return next(
        (row for row in reversed(rows) if _of(row, digests) and _asked_for(row, call_id)), None
    )


def _decided(row: RequestRow) -> bool:
    """Whether a person decided `row` and no step used it yet."""
    if row.kind == "review":
        return row.state == "resolved"
    return row.state in ("approved", "rejected")


@final
@attrs.frozen(kw_only=True)
class _Stop:
    """What the gate knows of the call a framework's run last stopped on with a call id: the
    digest of its arguments as the model sent them (a call of another model turn that reuses
    the id with other arguments is another call), the request asked for it (None: it waited
    with an earlier call of its turn, nothing was asked for it), and the step it ran as once
    sent again (None until then)."""

    digest: str
    request: str | None = None
    ran: int | None = None


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


def _raw_digest(name: str, arguments: object) -> str | None:
    """The digest of a call of tool `name` with `arguments` as the model sent them, or None
    if they are not JSON."""
    ok, value = _parsed(ModelCall(call_id="", name=name, arguments=arguments))
    return call_digest(name, value) if ok else None


def _checked_digest(tx: Transaction, name: str, call: ModelCall) -> str | None:
    """The digest the transaction gives `call` sent as its next step: its references
    resolved, its arguments checked against the tool's spec; None if that fails."""
    tool = plan_setting(tx)[0].get(name)
    ok, value = _parsed(call)
    if tool is None or not ok:
        return None
    outputs = {s.step_id: s.output for s in tx.steps}
    resolved, _, error = resolve_value(value, outputs, tx.next_step_id)
    if error is not None:
        return None
    checked, violation = tool.validator.check(resolved)
    return None if violation is not None else call_digest(tool.name, checked)


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
