"""What a transaction reports: its statuses, and the results of its operations.

Value objects only (frozen, slotted, keyword-only attrs classes); the `Transaction` in
`_transaction/` produces them.
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING, Any, Final, TypeAlias, final

import attrs

from ._errors import InvalidArgument
from ._rollback import REPEATED_FAILURE, RollbackStrategy

if TYPE_CHECKING:
    from ._approvals import ApprovalRequest, Review
    from ._hints import CleanHint
    from ._json import JSONValue
    from ._rollback import RollbackDecision
    from ._tools import StagedEffect

__all__ = [
    "MAX_BAD_VALUE_CHARS",
    "REDACTED",
    "TRANSITIONS",
    "AttemptStatus",
    "BadValue",
    "CommitResult",
    "ContextEntry",
    "DispatchReport",
    "RecoveryReport",
    "RollbackResult",
    "RootCause",
    "StepAttempt",
    "StepRecord",
    "StepResult",
    "StepStatus",
    "TransactionView",
    "TxStatus",
    "Voided",
    "failed_step",
    "refused_step",
    "rewind_target",
    "succeeded_step",
    "waiting_step",
]

#: The longest string value a `BadValue` quotes whole; a longer one is cut, ending in `...`.
MAX_BAD_VALUE_CHARS: Final = 200
#: What a `BadValue` shows in place of a secret argument's value.
REDACTED: Final = "[redacted]"

#: The live steps a rewind undoes, and the call ids of those that had one, in step order
#: (`Timeline.dropped`, `failed_step(voided=)`).
Voided: TypeAlias = "tuple[tuple[int, ...], tuple[str, ...]]"


class TxStatus(enum.Enum):
    """The life cycle of a transaction; the last three are terminal."""

    ACTIVE = "ACTIVE"
    EXECUTING = "EXECUTING"
    ROLLING_BACK = "ROLLING_BACK"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    FAILED = "FAILED"

    # Members are singletons compared by identity, so the identity hash is correct, and it is
    # computed in C: `Enum.__hash__` hashes the name in Python, on every status check.
    __hash__ = object.__hash__

    @property
    def terminal(self) -> bool:
        """True once the transaction has ended."""
        return self in _TERMINAL


_TERMINAL: Final = frozenset({TxStatus.COMMITTED, TxStatus.ROLLED_BACK, TxStatus.FAILED})
TRANSITIONS: Final[dict[TxStatus, frozenset[TxStatus]]] = {
    TxStatus.ACTIVE: frozenset({TxStatus.EXECUTING, TxStatus.COMMITTING, TxStatus.ROLLING_BACK}),
    TxStatus.EXECUTING: frozenset({TxStatus.ACTIVE, TxStatus.ROLLING_BACK}),
    TxStatus.ROLLING_BACK: frozenset({TxStatus.ACTIVE, TxStatus.ROLLED_BACK, TxStatus.FAILED}),
    TxStatus.COMMITTING: frozenset({TxStatus.COMMITTED, TxStatus.ACTIVE, TxStatus.ROLLING_BACK}),
    TxStatus.COMMITTED: frozenset(),
    TxStatus.ROLLED_BACK: frozenset(),
    TxStatus.FAILED: frozenset(),
}


class StepStatus(enum.Enum):
    """The outcome of one step."""

    SUCCESS = "SUCCESS"
    ROLLBACK_TRIGGERED = "ROLLBACK_TRIGGERED"
    FAILED = "FAILED"  # the transaction aborted
    NOT_RUN = "NOT_RUN"  # a call of a turn not sent, because an earlier call failed (call_turn)
    NEEDS_APPROVAL = "NEEDS_APPROVAL"  # not run: waits for a person's approval (`approval`)
    NEEDS_REVIEW = "NEEDS_REVIEW"  # its outcome is unknown: waits for a person (`review`)


class AttemptStatus(enum.Enum):
    """What became of one execution of a step (see `Transaction.history`)."""

    LIVE = "live"  # succeeded, and kept
    FAILED = "failed"
    REWOUND = "rewound"  # undone by a rewind or an abort, with nothing to compensate
    COMPENSATED = "compensated"  # undone, with its undo records run


@final
@attrs.frozen(kw_only=True)
class ContextEntry:
    """What the agent said when it sent a step that succeeded (`raw_context`)."""

    step_id: int
    tool_name: str
    raw_context: str


@final
@attrs.frozen(kw_only=True)
class StepRecord:
    """A live (succeeded, not rewound) step: its resolved arguments and its output.

    `call_id` is the id the caller gave the call (`execute_step(..., call_id=...)`), if any.
    """

    step_id: int
    tool_name: str
    arguments: JSONValue
    output: JSONValue
    call_id: str | None = None


def _check_root_step(_instance: object, _attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{type(_instance).__name__} step must be an int >= 1, got {value!r}")


def _check_root_key(
    _instance: object, _attribute: attrs.Attribute[str | None], value: str | None
) -> None:
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"RootCause key must be a string or None, got {value!r}")


@final
@attrs.frozen
class RootCause:
    """The step a dependency jump rewound to: it produced `key`, the bad input of the failed
    step (`RootCause(3, "customer_id")`). Validated (`InvalidArgument`)."""

    step: int = attrs.field(validator=_check_root_step)
    key: str | None = attrs.field(default=None, validator=_check_root_key)


def _check_bad_value(_instance: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, (str, int, float, bool)):
        raise InvalidArgument(f"BadValue value must be a JSON scalar, got {value!r}")
    if isinstance(value, str) and len(value) > MAX_BAD_VALUE_CHARS:
        raise InvalidArgument(f"BadValue value must have at most {MAX_BAD_VALUE_CHARS} characters")
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and not -(10 ** (MAX_BAD_VALUE_CHARS - 1)) < value < 10**MAX_BAD_VALUE_CHARS
    ):
        raise InvalidArgument(f"BadValue value must have at most {MAX_BAD_VALUE_CHARS} digits")


def _check_key(_instance: object, _attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"BadValue key must be a non-empty string, got {value!r}")


@final
@attrs.frozen(kw_only=True)
class BadValue:
    """The argument a failed step was given under its hint's key, for the model to correct.

    `key` is the hint's key, `value` the value the call received under it (a JSON scalar; one
    whose JSON text is over `MAX_BAD_VALUE_CHARS` characters, a string or an integer, is cut to
    a string ending in `...`; `"[redacted]"` for a
    tool's secret parameter, with `redacted` true), and `step` the step that produced it: the
    earliest step the value came from (by a reference or an equal earlier output), or the
    failed step itself when the call wrote it. Validated (`InvalidArgument`).
    """

    key: str = attrs.field(validator=_check_key)
    value: str | int | float | bool | None = attrs.field(validator=_check_bad_value)
    step: int = attrs.field(validator=_check_root_step)
    redacted: bool = False

    def to_json(self) -> dict[str, JSONValue]:
        """`{"key", "value", "step"}`, as `for_model()` sends it."""
        return {"key": self.key, "value": self.value, "step": self.step}


@final
@attrs.frozen(kw_only=True, weakref_slot=False)  # no weakref slot: see `_Unfrozen`
class StepResult:
    """The answer to `execute_step`: what happened and which step the agent sends next.

    `call_id` is the id the call was sent with, if any. `output` is set on success. On
    failure `hint` is the Clean Hint, `error` the raw error text,
    `strategy` and `rollback_to_step` say where the transaction rewound to, `next_step_id` is the
    step to send next (0 once aborted), `context_reset` tells the agent to drop what it
    remembers of the rewound steps, and `constraints` lists every hint so far.
    `voided_steps` are the live steps the rewind (or abort) undid, in step order, and
    `voided_call_ids` the call ids of those that had one; `root_cause` is set when the rewind
    jumped to the step that produced the bad input. `bad_value` is the argument the hint's key
    names, when the call had one, and `compensated` the `(step, compensation)` of each undo
    the rewind (or abort) ran, in the order run. `for_model()` is what to send the model.
    A call that waits for a person has status `NEEDS_APPROVAL` (with `approval`, the request)
    or `NEEDS_REVIEW` (with `review`); nothing was rewound and `next_step_id` is the same step.
    """

    status: StepStatus
    step_id: int
    next_step_id: int
    output: JSONValue = None
    hint: CleanHint | None = None
    error: str | None = None
    strategy: RollbackStrategy = RollbackStrategy.NONE
    rollback_to_step: int = 0
    constraints: tuple[str, ...] = ()
    context_reset: bool = False
    abort_reason: str | None = None
    compensation_errors: tuple[str, ...] = ()
    rollback_latency_ms: float = 0.0
    call_id: str | None = None
    voided_steps: tuple[int, ...] = ()
    voided_call_ids: tuple[str, ...] = ()
    root_cause: RootCause | None = None
    approval: ApprovalRequest | None = None
    review: Review | None = None
    bad_value: BadValue | None = None
    compensated: tuple[tuple[int, str], ...] = ()

    @property
    def ok(self) -> bool:
        """True when the step succeeded."""
        return self.status is StepStatus.SUCCESS

    def for_model(self) -> dict[str, JSONValue]:
        """The tool result to send the model (docs/protocol.md#what-the-model-receives).

        Keys, in this order: `ok`, `step`, `output` (on success) or `error` (the hint text; for
        a call waiting for a person, what it waits for, and then `awaiting`: "approval" or
        "review"),
        `next_step`, then `voided_steps`, `compensated` (`[{"step", "compensation"}]`),
        `constraints`, `root_cause` (`{"step", "key"}`), `bad_value` (`{"key", "value", "step"}`)
        and `abort_reason` when they are not empty, and `instruction`, one sentence saying what
        to send next.
        A new dict each call, JSON-serializable (the output is JSON already); deterministic.
        """
        # A call `call_turn` did not send claims no step: null, not the 0 of `step_id`.
        step = None if self.status is StepStatus.NOT_RUN else self.step_id
        payload: dict[str, JSONValue] = {"ok": self.ok, "step": step}
        if self.ok:
            payload["output"] = self.output
        elif self.approval is not None:
            request = self.approval.id
            payload["error"] = f"this call awaits a person's approval (request {request})"
            payload["awaiting"] = "approval"
        elif self.review is not None:
            review = self.review.id
            payload["error"] = (
                f"the outcome of this call is unknown; a person reviews it ({review})"
            )
            payload["awaiting"] = "review"
        else:
            payload["error"] = self.hint.text if self.hint is not None else self.error or ""
        payload["next_step"] = self.next_step_id
        if self.voided_steps:
            payload["voided_steps"] = list(self.voided_steps)
        if self.compensated:
            payload["compensated"] = [
                {"step": step, "compensation": name} for step, name in self.compensated
            ]
        if self.constraints:
            payload["constraints"] = list(self.constraints)
        if self.root_cause is not None:
            payload["root_cause"] = {"step": self.root_cause.step, "key": self.root_cause.key}
        if self.bad_value is not None:
            payload["bad_value"] = self.bad_value.to_json()
        if self.abort_reason is not None:
            payload["abort_reason"] = self.abort_reason
        payload["instruction"] = _instruction(self)
        return payload


class _Unfrozen:
    """`StepResult`'s slots without its frozen `__setattr__`: a result of a successful step is
    filled with plain attribute stores, then becomes a `StepResult` (`__class__`), frozen from
    then on. The class-generated `__init__` of a frozen class stores each of its 21 fields with
    a call of `object.__setattr__`, which cost about a tenth of an inline tool's step. The
    layouts must match for the class change: the same slots, and no weakref slot (CPython
    refuses it beside other slots)."""

    __slots__ = tuple(field.name for field in attrs.fields(StepResult))


def succeeded_step(
    step_id: int,
    next_step_id: int,
    output: JSONValue,
    constraints: tuple[str, ...],
    call_id: str | None,
) -> StepResult:
    """The result of a step that succeeded: `StepResult(status=SUCCESS, ...)`, every other
    field at its default, built without the frozen class's per-field calls (once a step)."""
    result: Any = _Unfrozen()
    result.status = StepStatus.SUCCESS
    result.step_id = step_id
    result.next_step_id = next_step_id
    result.output = output
    result.hint = result.error = result.abort_reason = None
    result.root_cause = result.approval = result.review = result.bad_value = None
    result.strategy = RollbackStrategy.NONE
    result.rollback_to_step = 0
    result.constraints = constraints
    result.context_reset = False
    result.compensation_errors = result.voided_steps = result.voided_call_ids = ()
    result.compensated = ()
    result.rollback_latency_ms = 0.0
    result.call_id = call_id
    result.__class__ = StepResult  # frozen from here on
    return result  # type: ignore[no-any-return]  # a StepResult now


def _undone(steps: tuple[int, ...]) -> str:
    """What a rewind undid: live steps are consecutive, so a range says which."""
    if len(steps) == 1:
        return f"step {steps[0]} was undone and its output no longer exists"
    return f"steps {steps[0]}-{steps[-1]} were undone and their outputs no longer exist"


#: The instruction after a failure that needs no step range: by strategy, with `{step}`.
_INSTRUCTIONS: Final = {
    RollbackStrategy.RESEND: "Fix the call as the error says and send step {step} again.",
    RollbackStrategy.RETRY: (
        "The failure was temporary: send step {step} again with the same arguments."
    ),
    RollbackStrategy.GLOBAL_RESET: (
        "Every step was undone: start again from step 1, keeping to the constraints."
    ),
    RollbackStrategy.ABORT: (
        "The transaction was aborted and every step undone: send no more steps."
    ),
}


#: The instruction after an abort for a repeated failure (`docs/protocol.md#repeated-failures`).
_REPEATED: Final = (
    "The same call failed the same way after a rewind, so the transaction was aborted and "
    "every step undone: send no more steps; report the error and the bad value instead."
)


#: The instruction for a call that did not run, by status, with `{step}` (the next step).
_WAITING: Final = {
    StepStatus.NEEDS_APPROVAL: (
        "A person must approve this exact call first: once approved, send step {step} again "
        "with the same tool and arguments; it then runs once."
    ),
    StepStatus.NEEDS_REVIEW: (
        "Do not repeat or change this call: once the review is resolved, send step {step} "
        "again with the same tool and arguments to learn its outcome."
    ),
    StepStatus.NOT_RUN: (
        "This call was not run because an earlier call of the turn failed: "
        "send it again as step {step} or later, if it is still needed."
    ),
}


def _instruction(result: StepResult) -> str:
    """One sentence: what the model does next, after `result`."""
    step, following, strategy = result.step_id, result.next_step_id, result.strategy
    if result.ok:
        return (
            f"Continue with step {following}; pass on a value of this output as "
            f"${{steps.{step}.<field>}}, never copied."
        )
    waiting = _WAITING.get(result.status)
    if waiting is not None:
        return waiting.format(step=following)
    repeated = (result.abort_reason or "").startswith(REPEATED_FAILURE)
    fixed = _REPEATED if repeated else _INSTRUCTIONS.get(strategy)
    if fixed is not None:
        return fixed.format(step=step)
    if not result.voided_steps:
        return f"Send step {following} next, correcting the cause of the error."
    undone = _undone(result.voided_steps)
    root = result.root_cause
    if strategy is RollbackStrategy.DEPENDENCY_JUMP and root is not None:
        value = "a bad value" if root.key is None else f"the bad value of {root.key!r}"
        return (
            f"Step {root.step} produced {value}: {undone}; send step {following} again with a "
            "corrected value, then redo the rest."
        )
    return f"{undone.capitalize()}: send step {following} again, correcting the cause of the error."


def failed_step(
    step_id: int,
    *,
    decision: RollbackDecision,
    hint: CleanHint,
    error: str,
    next_step_id: int,
    constraints: tuple[str, ...],
    compensation_errors: tuple[str, ...],
    started: float,
    call_id: str | None = None,
    voided: Voided = ((), ()),
    bad_value: BadValue | None = None,
    compensated: tuple[tuple[int, str], ...] = (),
) -> StepResult:
    """The result of a failed step, once the rewind (or abort) `decision` asked for is done;
    `voided` are the live steps it undid and their call ids (`Timeline.dropped`), `compensated`
    the undos it ran (`CompensationReport.ran`)."""
    strategy = decision.strategy
    aborted = strategy is RollbackStrategy.ABORT
    root = None
    if strategy is RollbackStrategy.DEPENDENCY_JUMP:
        root = RootCause(decision.target_step, decision.root_key)
    return StepResult(
        status=StepStatus.FAILED if aborted else StepStatus.ROLLBACK_TRIGGERED,
        step_id=step_id,
        next_step_id=next_step_id,
        hint=hint,
        error=error,
        strategy=strategy,
        rollback_to_step=0 if aborted else decision.target_step,
        constraints=constraints,
        context_reset=aborted or strategy is RollbackStrategy.GLOBAL_RESET,
        abort_reason=decision.reason if aborted else None,
        compensation_errors=compensation_errors,
        rollback_latency_ms=(time.perf_counter() - started) * 1000,
        call_id=call_id,
        voided_steps=voided[0],
        voided_call_ids=voided[1],
        root_cause=root,
        bad_value=bad_value,
        compensated=compensated,
    )


def refused_step(
    step_id: int, hint: CleanHint, error: str, constraints: tuple[str, ...], call_id: str | None
) -> StepResult:
    """A call refused at a step that waits for a person: sent again at its own number
    (`RESEND`), nothing run, nothing undone, and no decision of the controller asked."""
    return StepResult(
        status=StepStatus.ROLLBACK_TRIGGERED,
        step_id=step_id,
        next_step_id=step_id,
        hint=hint,
        error=error,
        strategy=RollbackStrategy.RESEND,
        rollback_to_step=step_id,
        constraints=constraints,
        call_id=call_id,
    )


def waiting_step(
    step_id: int,
    constraints: tuple[str, ...],
    call_id: str | None,
    approval: ApprovalRequest | None,
    review: Review | None,
) -> StepResult:
    """A step that waits for a person (`approval` or `review`): the same step is next."""
    return StepResult(
        status=StepStatus.NEEDS_APPROVAL if approval is not None else StepStatus.NEEDS_REVIEW,
        step_id=step_id,
        next_step_id=step_id,
        constraints=constraints,
        call_id=call_id,
        approval=approval,
        review=review,
    )


def rewind_target(decision: RollbackDecision) -> tuple[int, TxStatus | None]:
    """Where a decision rewinds to, and the final status if it aborts."""
    if decision.strategy is RollbackStrategy.ABORT:
        return 0, TxStatus.FAILED
    if decision.strategy is RollbackStrategy.GLOBAL_RESET:
        return 0, None
    return decision.target_step, None


@final
@attrs.frozen(kw_only=True)
class RollbackResult:
    """The answer to `rollback`."""

    aborted: bool
    next_step_id: int
    compensations_run: int
    compensation_errors: tuple[str, ...] = ()


@final
@attrs.frozen(kw_only=True)
class CommitResult:
    """The answer to `commit`: what was published and what was dispatched.

    `effects` are the committed staged effects in staging order; with no dispatcher they are
    handed back here for the caller to deliver (`effects_dispatched` is then 0).
    """

    steps_committed: int
    effects_dispatched: int
    dispatch_errors: tuple[str, ...] = ()
    effects: tuple[StagedEffect, ...] = ()


@final
@attrs.frozen(kw_only=True)
class TransactionView:
    """A read-only picture of a transaction, ended ones too (`Transaction.view()`)."""

    tx_id: str
    agent_id: str
    status: TxStatus
    next_step_id: int
    steps_completed: int
    constraints: tuple[str, ...]
    global_resets: int
    context: tuple[ContextEntry, ...]
    pending_effects: int
    compensation_failures: tuple[str, ...] = ()


@final
@attrs.frozen(kw_only=True)
class RecoveryReport:
    """What `Engine.recover` did with the transactions it found open in a durable store.

    `transactions` counts those it took over (aborted or resumed); `compensations_run` the
    undo records compensated successfully; `failures` has a line `"{tx_id}: {what failed}"` per
    compensation that failed (kept for the next recovery) and per transaction that could not be
    read. `resumed` lists the ids of the transactions resumed, ready for `Engine.get`.
    `skipped` lists those left alone because a live process owns them or another recoverer
    claimed them first (plan runs too). `plans_resumed` lists the plan runs resumed, running
    on background threads: steer them with `Engine.get_plan` and `Engine.cancel_plan`.
    """

    transactions: int = 0
    compensations_run: int = 0
    failures: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    plans_resumed: tuple[str, ...] = ()


@final
@attrs.frozen(kw_only=True)
class DispatchReport:
    """What `Engine.dispatch_pending` delivered from the outbox, and a line per failure."""

    delivered: int = 0
    failures: tuple[str, ...] = ()


@final
@attrs.frozen(kw_only=True)
class StepAttempt:
    """One execution of a step and what became of it (see `Transaction.history`), with the
    call id it was sent with, if any."""

    step_id: int
    tool_name: str
    status: AttemptStatus
    call_id: str | None = None
