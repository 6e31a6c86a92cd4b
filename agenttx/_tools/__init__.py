"""Tools: the decorator, the context a tool receives, and running a call under its deadline."""

from __future__ import annotations

from ._calls import Call as Call
from ._calls import Failure as Failure
from ._calls import Landed as Landed
from ._calls import Orphan as Orphan
from ._calls import Orphans as Orphans
from ._calls import Outcome as Outcome
from ._calls import arun_tool as arun_tool
from ._calls import closed as closed
from ._calls import declared_undo as declared_undo
from ._calls import keep_abandoned as keep_abandoned
from ._calls import run_tool as run_tool
from ._calls import still_running as still_running
from ._calls import watch as watch
from ._calls import with_key as with_key
from ._costs import COST_CATEGORIES as COST_CATEGORIES
from ._costs import check_cost as check_cost
from ._outputs import OutputSerializer as OutputSerializer
from ._outputs import to_json_value as to_json_value
from ._schema import Validator as Validator
from ._schema import Violation as Violation
from ._schema import compile_schema as compile_schema
from ._schema import schema_for as schema_for
from ._signature import UNRESOLVED as UNRESOLVED
from ._signature import Signature as Signature
from ._signature import newtype_name as newtype_name
from ._signature import read_signature as read_signature
from ._signature import typed_dict_fields as typed_dict_fields
from ._spec import ToolSpec as ToolSpec
from ._spec import wire_name as wire_name
from ._tool import MAX_TOOL_NAME as MAX_TOOL_NAME
from ._tool import Compensation as Compensation
from ._tool import StagedEffect as StagedEffect
from ._tool import StateView as StateView
from ._tool import Tool as Tool
from ._tool import ToolContext as ToolContext
from ._tool import ToolLike as ToolLike
from ._tool import ToolRegistry as ToolRegistry
from ._tool import ToolsArgument as ToolsArgument
from ._tool import UndoRecord as UndoRecord
from ._tool import compensation as compensation
from ._tool import derive_key as derive_key
from ._tool import key_deriver as key_deriver
from ._tool import tool as tool
from ._transient import is_transient_status as is_transient_status
from ._transient import transient_verdict as transient_verdict
from ._workers import DeadlineExceeded as DeadlineExceeded
from ._workers import Running as Running
from ._workers import abandoned_call as abandoned_call
from ._workers import acall_with_deadline as acall_with_deadline
from ._workers import call_with_deadline as call_with_deadline
from ._workers import is_awaitable as is_awaitable
from ._workers import resolve_awaitable as resolve_awaitable

__all__ = [
    "COST_CATEGORIES",
    "MAX_TOOL_NAME",
    "UNRESOLVED",
    "Call",
    "Compensation",
    "DeadlineExceeded",
    "Failure",
    "Landed",
    "Orphan",
    "Orphans",
    "Outcome",
    "OutputSerializer",
    "Running",
    "Signature",
    "StagedEffect",
    "StateView",
    "Tool",
    "ToolContext",
    "ToolLike",
    "ToolRegistry",
    "ToolSpec",
    "ToolsArgument",
    "UndoRecord",
    "Validator",
    "Violation",
    "abandoned_call",
    "acall_with_deadline",
    "arun_tool",
    "call_with_deadline",
    "check_cost",
    "closed",
    "compensation",
    "compile_schema",
    "declared_undo",
    "derive_key",
    "is_awaitable",
    "is_transient_status",
    "keep_abandoned",
    "key_deriver",
    "newtype_name",
    "read_signature",
    "resolve_awaitable",
    "run_tool",
    "schema_for",
    "still_running",
    "to_json_value",
    "tool",
    "transient_verdict",
    "typed_dict_fields",
    "watch",
    "wire_name",
    "with_key",
]
