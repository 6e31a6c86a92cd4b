"""Argument checks for the built-in tools, with serde-style messages.

The messages are part of the contract (`docs/protocol.md#built-in-arguments`): the Clean Hint
cleaner matches them (`missing field` gives the missing_field hint and key, `invalid type: ...`
the type_mismatch hint), and tests pin them verbatim. Every check raises `ToolError`, which fails
the step.

Unknown arguments are ignored.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from .._errors import ToolError
from .._json import JSONValue, canonical_dumps
from .._json import json_kind as json_type

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "id_text",
    "identifier",
    "json_type",
    "optional_str",
    "required_str",
    "text_arg",
    "value_text",
]

_IDENTIFIER: Final = re.compile(r"[A-Za-z0-9_]{1,128}")


def value_text(value: JSONValue) -> str:
    """A value as text: a string as is, anything else as its canonical JSON (`101` -> `101`)."""
    if isinstance(value, str):
        return value
    return canonical_dumps(value)


def required_str(arguments: Mapping[str, JSONValue], name: str) -> str:
    """The string argument `name`.

    Raises ``ToolError("missing field `name`")`` when it is absent or null, and
    ``ToolError("invalid type: {t} for field `name`, expected a string")`` for another type.
    """
    value = arguments.get(name)
    if value is None:
        raise ToolError(f"missing field `{name}`")
    if not isinstance(value, str):
        raise ToolError(f"invalid type: {json_type(value)} for field `{name}`, expected a string")
    return value


def optional_str(arguments: Mapping[str, JSONValue], name: str) -> str | None:
    """The optional string argument `name`: None when absent or null, else as `required_str`."""
    if arguments.get(name) is None:
        return None
    return required_str(arguments, name)


def id_text(arguments: Mapping[str, JSONValue], name: str) -> str:
    """The id argument `name` as text: a non-empty string as is, a number as its JSON text.

    Raises ``missing field `name` `` when absent or null, and
    ``invalid type: {t} for field `name`, expected a string or number`` for anything else,
    including the empty string (an odd message for a string, kept so that it gets the same
    hint as every other value of the wrong type).
    """
    value = arguments.get(name)
    if value is None:
        raise ToolError(f"missing field `{name}`")
    if isinstance(value, str) and value:
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return canonical_dumps(value)
    raise ToolError(
        f"invalid type: {json_type(value)} for field `{name}`, expected a string or number"
    )


def identifier(value: str, what: str) -> str:
    """`value` if it is 1-128 characters of ASCII `[A-Za-z0-9_]`.

    Otherwise raises ``invalid {what} `{value}`: expected 1-128 chars of [A-Za-z0-9_]``.
    """
    if _IDENTIFIER.fullmatch(value) is None:
        raise ToolError(f"invalid {what} `{value}`: expected 1-128 chars of [A-Za-z0-9_]")
    return value


def text_arg(arguments: Mapping[str, JSONValue], name: str) -> str:
    """As `required_str`, and the string must be encodable as UTF-8 (no lone surrogates).

    JSON text can carry a lone surrogate (`"\\ud800"`), which no file name or file can hold;
    it fails with ``invalid value: lone surrogate at index {i} for field `name`, expected
    UTF-8 text``.
    """
    value = required_str(arguments, name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolError(
            f"invalid value: lone surrogate at index {exc.start} for field `{name}`, "
            "expected UTF-8 text"
        ) from None
    return value
