"""The agenttx exception tree.

Every error agenttx raises derives from `AgentTxError` and carries a stable string `code`
(pinned by `tests/test_errors.py`), so callers can match on it across releases::

    AgentTxError                          agenttx_error
    ├── FailedPrecondition                failed_precondition
    │   ├── StepOutOfOrder                step_out_of_order        (.expected, .got)
    │   ├── InvalidTransactionState       invalid_transaction_state (.tx_id, .status)
    │   └── IllegalTransition             illegal_transition       (.source, .target)
    ├── TransactionNotFound (LookupError) transaction_not_found    (.tx_id)
    ├── InvalidArgument (ValueError)      invalid_argument
    │   ├── JSONValueError                invalid_json_value       (.path, .problem)
    │   ├── ReferenceSyntaxError          malformed_reference      (.text, .position, .problem)
    │   └── PlanValidationError           invalid_plan             (.problems)
    ├── WriteConflict                     write_conflict           (.key)
    │   └── ReadConflict                  read_conflict            (.key)
    ├── StorageError                      storage_error
    ├── ToolError                         tool_error               (.message, .key, .transient)
    ├── ToolOutputError (TypeError)       invalid_tool_output      (.tool, .step_id, .path)
    └── ApprovalError                     approval_error           (.request_id)
        ├── ApprovalNotFound (LookupError) approval_not_found
        ├── ApprovalExpired               approval_expired         (.expired_at)
        ├── ApprovalConsumed              approval_consumed
        ├── ApprovalRejected              approval_rejected        (.actor, .reason)
        └── ReviewNotFound (LookupError)  review_not_found

Agent-caused failures (a tool raising, an unknown tool, a reference to a missing key) are not
raised: they come back as failed steps with a Clean Hint. These exceptions are for misuse of the
library and for infrastructure problems. Errors from rustworkx and sqlite3 never escape; they are
re-raised as one of these with the original attached as `__cause__`.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AgentTxError",
    "ApprovalConsumed",
    "ApprovalError",
    "ApprovalExpired",
    "ApprovalNotFound",
    "ApprovalRejected",
    "FailedPrecondition",
    "IllegalTransition",
    "InvalidArgument",
    "InvalidTransactionState",
    "JSONValueError",
    "PlanToolMissing",
    "PlanValidationError",
    "ReadConflict",
    "ReferenceSyntaxError",
    "ReviewNotFound",
    "StepOutOfOrder",
    "StorageError",
    "ToolError",
    "ToolOutputError",
    "TransactionNotFound",
    "WriteConflict",
]


class AgentTxError(Exception):
    """Base class of every agenttx error; `code` is stable across releases."""

    code: ClassVar[str] = "agenttx_error"


class FailedPrecondition(AgentTxError):
    """The call is valid in general but not in the transaction's current state."""

    code: ClassVar[str] = "failed_precondition"


class StepOutOfOrder(FailedPrecondition):
    """A step id other than the transaction's `next_step_id` was sent."""

    code: ClassVar[str] = "step_out_of_order"

    def __init__(self, *, expected: int, got: int) -> None:
        self.expected = expected
        self.got = got
        super().__init__(
            f"step {got} is out of order: expected step {expected} "
            f"(send the step id from the last result's next_step_id)"
        )


class InvalidTransactionState(FailedPrecondition):
    """The transaction is not ACTIVE (it is executing, committing or has ended)."""

    code: ClassVar[str] = "invalid_transaction_state"

    def __init__(self, *, tx_id: str, status: str) -> None:
        self.tx_id = tx_id
        self.status = status
        super().__init__(f"transaction `{tx_id}` is {status}, expected ACTIVE")


class IllegalTransition(FailedPrecondition):
    """A status change outside the legal transition table; the status is left unchanged."""

    code: ClassVar[str] = "illegal_transition"

    def __init__(self, *, source: str, target: str) -> None:
        self.source = source
        self.target = target
        super().__init__(f"illegal transaction state transition {source} -> {target}")


class TransactionNotFound(AgentTxError, LookupError):
    """No transaction with this id is known to the engine or store."""

    code: ClassVar[str] = "transaction_not_found"

    def __init__(self, *, tx_id: str) -> None:
        self.tx_id = tx_id
        super().__init__(f"transaction `{tx_id}` not found")


class InvalidArgument(AgentTxError, ValueError):
    """An argument to an agenttx call is invalid; the message names the offender."""

    code: ClassVar[str] = "invalid_argument"


class JSONValueError(InvalidArgument):
    """A value that must be JSON is not: wrong type, NaN, non-string key, cycle or too deep.

    `path` locates the offending part in JSONPath-like notation (`$` is the whole value,
    `$.items[2]` the third element of `items`); `problem` says what is wrong with it; `what`
    names the whole value in the message ("arguments", "output of step 3").
    """

    code: ClassVar[str] = "invalid_json_value"

    def __init__(self, *, path: str, problem: str, what: str = "value") -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"not a JSON value in {what} at {path}: {problem}")


class ReferenceSyntaxError(InvalidArgument):
    """A `${...}` reference in a plan input does not follow the reference grammar.

    Interactive steps never raise this: there, text that is not a valid `${steps.N.path}`
    reference is kept literally (see `docs/protocol.md#reference-grammar`).
    """

    code: ClassVar[str] = "malformed_reference"

    def __init__(self, *, text: str, position: int, problem: str) -> None:
        self.text = text
        self.position = position
        self.problem = problem
        super().__init__(f"malformed reference at position {position} of {text!r}: {problem}")


class PlanValidationError(InvalidArgument):
    """A plan failed validation; `problems` holds every `PlanProblem` found, in report order.

    Raised before any tool of the plan runs. The message lists the first problems; read
    `problems` for all of them.
    """

    code: ClassVar[str] = "invalid_plan"

    #: How many problems the message spells out; `problems` always holds all of them.
    SHOWN: ClassVar[int] = 5

    def __init__(self, problems: tuple[Any, ...]) -> None:
        self.problems = tuple(problems)
        shown = "; ".join(str(problem) for problem in self.problems[: self.SHOWN])
        more = len(self.problems) - self.SHOWN
        tail = f"; and {more} more" if more > 0 else ""
        count = len(self.problems)
        super().__init__(
            f"the plan is invalid ({count} problem{'s' if count != 1 else ''}): {shown}{tail}"
        )


class PlanToolMissing(InvalidArgument):
    """A durable plan run cannot be resumed: tool `tool` that its plan uses is no longer
    registered. Cancelling the run (or recovering in `"abort"` mode) still ends it,
    compensating its completed nodes through the registered compensations."""

    code: ClassVar[str] = "plan_tool_missing"

    def __init__(self, *, run_id: str, tool: str) -> None:
        self.run_id = run_id
        self.tool = tool
        super().__init__(
            f"plan run `{run_id}` cannot be resumed: its tool `{tool}` is not registered; "
            "register it and recover again, or cancel the run (its completed nodes are "
            "compensated)"
        )


class WriteConflict(AgentTxError):
    """Another transaction committed a key this one wrote, since the key's base version: its
    first read or write (its first write under `read_committed`)."""

    code: ClassVar[str] = "write_conflict"

    def __init__(self, *, key: str) -> None:
        self.key = key
        super().__init__(f"write conflict on key `{key}`: it was committed by another transaction")


class ReadConflict(WriteConflict):
    """A serializable transaction read a key that another transaction committed since.

    A `WriteConflict`, so code that retries on conflicts catches both.
    """

    code: ClassVar[str] = "read_conflict"

    def __init__(self, *, key: str) -> None:
        self.key = key
        AgentTxError.__init__(
            self,
            f"read conflict on key `{key}`: another transaction committed it after this one "
            "read it",
        )


class StorageError(AgentTxError):
    """The state store failed; the original exception is attached as `__cause__`."""

    code: ClassVar[str] = "storage_error"


class ToolError(AgentTxError):
    """Raised by a tool to fail its step: the message goes to the Clean Hint cleaner verbatim.

    Any other exception a tool raises fails the step too, described as Python formats it
    (`KeyError: 'user_id'`). Neither escapes `execute_step`: both become a failed `StepResult`.
    """

    code: ClassVar[str] = "tool_error"

    def __init__(
        self, message: str, *, key: str | None = None, transient: bool | None = None
    ) -> None:
        self.message = message
        self.key = key  # the offending input: drives the root-cause search
        self.transient = transient  # True: retry the same step; None: the cleaner decides
        super().__init__(message)


class ToolOutputError(AgentTxError, TypeError):
    """A tool returned a value that is not JSON, even after the output serializer converted it.

    A developer error, raised to the caller of `execute_step` (never shown to the model): the
    tool did its work, so the step is undone (its undo records and its `compensate=` run), not
    kept, and the transaction stays ACTIVE at the same step (docs/protocol.md#outputs).
    `tool` and `step_id` name the call, `path` locates the offending part of the output
    (`$.when`), `problem` says what it is; `compensation_errors` lists the undos that failed.
    """

    code: ClassVar[str] = "invalid_tool_output"

    def __init__(
        self,
        *,
        tool: str,
        step_id: int,
        path: str,
        problem: str,
        compensation_errors: tuple[str, ...] = (),
    ) -> None:
        self.tool = tool
        self.step_id = step_id
        self.path = path
        self.problem = problem
        self.compensation_errors = compensation_errors
        undone = (
            "the step was undone"
            if not compensation_errors
            else f"undoing the step left {len(compensation_errors)} failed compensation(s)"
        )
        super().__init__(
            f"the output of tool '{tool}' at step {step_id} is not a JSON value at {path}: "
            f"{problem}; {undone} and step {step_id} is next again. Return JSON values, or "
            "set output_serializer= to convert this type"
        )


class ApprovalError(AgentTxError):
    """An approval or review cannot be decided or used as asked; `request_id` names it.

    Raised by `approve`, `reject` and `resolve_review` (on a transaction or an engine) for a
    request that is not pending; the subclasses say why. The base class itself is raised for a
    request that was already approved (decide it once).
    """

    code: ClassVar[str] = "approval_error"

    def __init__(self, message: str, *, request_id: str) -> None:
        self.request_id = request_id
        super().__init__(message)


class ApprovalNotFound(ApprovalError, LookupError):
    """No approval request with this id is known (to this transaction, or to the store)."""

    code: ClassVar[str] = "approval_not_found"

    def __init__(self, *, request_id: str) -> None:
        super().__init__(f"approval request `{request_id}` not found", request_id=request_id)


class ApprovalExpired(ApprovalError):
    """The approval expired (at `expired_at`, a UNIX time) before the call it approves ran."""

    code: ClassVar[str] = "approval_expired"

    def __init__(self, *, request_id: str, expired_at: float | None = None) -> None:
        self.expired_at = expired_at
        super().__init__(
            f"approval request `{request_id}` has expired: the call needs a new approval",
            request_id=request_id,
        )


class ApprovalConsumed(ApprovalError):
    """The approval was used already: the call it approved has started, once."""

    code: ClassVar[str] = "approval_consumed"

    def __init__(self, *, request_id: str) -> None:
        super().__init__(
            f"approval request `{request_id}` was consumed: the call it approved has started",
            request_id=request_id,
        )


class ApprovalRejected(ApprovalError):
    """The request was rejected by `actor` for `reason`; it cannot be approved any more."""

    code: ClassVar[str] = "approval_rejected"

    def __init__(self, *, request_id: str, actor: str = "", reason: str = "") -> None:
        self.actor = actor
        self.reason = reason
        super().__init__(
            f"approval request `{request_id}` was rejected by {actor or 'someone'}: {reason}",
            request_id=request_id,
        )


class ReviewNotFound(ApprovalError, LookupError):
    """No pending review with this id is known (never opened, or resolved already)."""

    code: ClassVar[str] = "review_not_found"

    def __init__(self, *, request_id: str, resolved: bool = False) -> None:
        self.resolved = resolved
        what = "was resolved already" if resolved else "not found"
        super().__init__(f"review `{request_id}` {what}", request_id=request_id)
