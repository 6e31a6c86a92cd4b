"""An approver's edited arguments, checked once for every place a person can decide.

A transaction, a plan run and the approval desk (an `Engine`, or the command line, in any
process) all check an edit here: it must be a JSON object within the size limit of a call's
arguments, and fit the tool's parameters schema, the live tool's when this process has it, else
the schema stored with the request when it was made. An edit that cannot be checked (no tool
here and no schema stored, a request made before schemas were stored) is refused: an unchecked
edit would reach the tool and fail there, rewinding good work and blaming the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from .._errors import InvalidArgument, JSONValueError
from .._json import canonical_dumps, check_json_sized
from .._limits import MAX_PAYLOAD_BYTES
from .._tools import compile_schema

if TYPE_CHECKING:
    from .._json import JSONValue
    from .._tools import Tool

__all__ = ["EditCheck", "edit_check", "validate_edit"]

#: Checks an edit of a call of tool `name` whose request stored `schema`: the arguments as the
#: tool will get them, or `InvalidArgument`.
EditCheck: TypeAlias = Callable[[str, object, "JSONValue"], "JSONValue"]


def validate_edit(
    tool_name: str, arguments: object, tool: Tool[Any, Any] | None, schema: JSONValue
) -> JSONValue:
    """`arguments` as the tool will get them, or `InvalidArgument` saying why they do not fit.

    `tool` is the live tool (None if this process does not have it), `schema` the parameters
    schema stored with the request (None for requests made before it was stored).
    """
    if not isinstance(arguments, Mapping):
        raise InvalidArgument(f"arguments must be a mapping, got {type(arguments).__name__}")
    try:
        checked, bound = check_json_sized(dict(arguments), what="arguments")
    except JSONValueError as exc:
        raise InvalidArgument(f"the edited arguments are not JSON: {exc}") from None
    if bound > MAX_PAYLOAD_BYTES and len(canonical_dumps(checked).encode()) > MAX_PAYLOAD_BYTES:
        raise InvalidArgument(
            f"the edited arguments exceed {MAX_PAYLOAD_BYTES} bytes, the limit of a call's"
        )
    if tool is not None:
        validator = tool.validator
    elif isinstance(schema, dict):
        validator = compile_schema(schema, what=f"the stored schema of tool `{tool_name}`")
    else:
        raise InvalidArgument(
            f"cannot check the edited arguments: tool `{tool_name}` is not registered here and "
            "its request holds no schema; approve without an edit, or from a process that has "
            "the tool"
        )
    fitted, violation = validator.check(checked)
    if violation is not None:
        raise InvalidArgument(
            f"the edited arguments do not fit tool `{tool_name}`: {violation.message}"
        )
    return fitted


def edit_check(lookup: Callable[[str], Tool[Any, Any] | None]) -> EditCheck:
    """The `EditCheck` of a process whose tools `lookup` finds by name."""

    def check(tool_name: str, arguments: object, schema: JSONValue) -> JSONValue:
        return validate_edit(tool_name, arguments, lookup(tool_name), schema)

    return check
