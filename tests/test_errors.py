"""The exception tree: stable codes, built-in bases, data on each error."""

from __future__ import annotations

import pytest

import agenttx
from agenttx import _errors

CODES = {
    "AgentTxError": "agenttx_error",
    "FailedPrecondition": "failed_precondition",
    "StepOutOfOrder": "step_out_of_order",
    "InvalidTransactionState": "invalid_transaction_state",
    "IllegalTransition": "illegal_transition",
    "TransactionNotFound": "transaction_not_found",
    "InvalidArgument": "invalid_argument",
    "JSONValueError": "invalid_json_value",
    "ReferenceSyntaxError": "malformed_reference",
    "PlanValidationError": "invalid_plan",
    "PlanToolMissing": "plan_tool_missing",
    "WriteConflict": "write_conflict",
    "ReadConflict": "read_conflict",
    "StorageError": "storage_error",
    "ToolError": "tool_error",
    "ToolOutputError": "invalid_tool_output",
    "ApprovalError": "approval_error",
    "ApprovalNotFound": "approval_not_found",
    "ApprovalExpired": "approval_expired",
    "ApprovalConsumed": "approval_consumed",
    "ApprovalRejected": "approval_rejected",
    "ReviewNotFound": "review_not_found",
}


def test_code_table_is_pinned():
    """Every exception class has the code the table says, and the table lists them all."""
    classes = {name: getattr(_errors, name) for name in _errors.__all__}
    assert {name: cls.code for name, cls in classes.items()} == CODES


def test_codes_are_unique():
    """No two exception classes share a code."""
    assert len(set(CODES.values())) == len(CODES)


@pytest.mark.parametrize("name", sorted(CODES))
def test_every_error_derives_from_agenttx_error(name):
    """Catching AgentTxError catches everything agenttx raises."""
    assert issubclass(getattr(agenttx, name), agenttx.AgentTxError)


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (agenttx.InvalidArgument, ValueError),
        (agenttx.JSONValueError, ValueError),
        (agenttx.ReferenceSyntaxError, ValueError),
        (agenttx.TransactionNotFound, LookupError),
    ],
)
def test_misuse_errors_subclass_the_matching_builtin(error, builtin):
    """Misuse errors can also be caught by the built-in exception they specialise."""
    assert issubclass(error, builtin)


@pytest.mark.parametrize(
    "error",
    [agenttx.StepOutOfOrder, agenttx.InvalidTransactionState, agenttx.IllegalTransition],
)
def test_precondition_errors_are_failed_preconditions(error):
    """Protocol misuse in the wrong state is a FailedPrecondition."""
    assert issubclass(error, agenttx.FailedPrecondition)


def test_step_out_of_order_carries_data_and_says_what_to_do():
    """StepOutOfOrder names the expected step and tells the caller where to find it."""
    error = agenttx.StepOutOfOrder(expected=1, got=3)
    assert (error.expected, error.got) == (1, 3)
    assert str(error).startswith("step 3 is out of order: expected step 1")
    assert "next_step_id" in str(error)


def test_messages_match_the_reference():
    """Display texts are the documented messages, with the offender's data attached."""
    assert str(agenttx.TransactionNotFound(tx_id="t-1")) == "transaction `t-1` not found"
    state = agenttx.InvalidTransactionState(tx_id="t-1", status="COMMITTED")
    assert str(state) == "transaction `t-1` is COMMITTED, expected ACTIVE"
    assert state.status == "COMMITTED"
    transition = agenttx.IllegalTransition(source="COMMITTED", target="ACTIVE")
    assert str(transition) == "illegal transaction state transition COMMITTED -> ACTIVE"
    conflict = agenttx.WriteConflict(key="kv/inventory")
    assert conflict.key == "kv/inventory"
    assert str(conflict) == (
        "write conflict on key `kv/inventory`: it was committed by another transaction"
    )


def test_data_errors_name_the_offender():
    """JSON and reference syntax errors carry where and what went wrong."""
    json_error = agenttx.JSONValueError(path="$.a[1]", problem="set is not a JSON type")
    assert (json_error.path, json_error.problem) == ("$.a[1]", "set is not a JSON type")
    assert "$.a[1]" in str(json_error)
    syntax = agenttx.ReferenceSyntaxError(text="${a.}", position=0, problem="empty segment")
    assert (syntax.text, syntax.position, syntax.problem) == ("${a.}", 0, "empty segment")
