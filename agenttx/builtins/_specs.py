"""The specs of the built-in tools: their descriptions and argument schemas.

The built-in tools take `**arguments` (no schema can be derived from that), so each is given its
schema here, matching `docs/protocol.md#built-in-arguments`. The schemas are deliberately
permissive where a tool checks an argument itself with the protocol's message (identifiers,
non-empty ids, lone surrogates, `references` values): what the validator refuses first gets the
same message the tool would give (``missing field `key` ``, ``invalid type: number for field
`key`, expected a string``), so the hint is the same whichever refuses it. Unknown arguments are
allowed (the tools ignore them), and null for an optional argument counts as absent, as in the
tools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .._json import JSONValue

__all__ = ["DESCRIPTIONS", "PARAMETERS"]

_KEY: Final[JSONValue] = {"type": "string", "description": "The key."}
_TABLE: Final[JSONValue] = {
    "type": "string",
    "description": "The table: 1-128 characters of [A-Za-z0-9_].",
}
_ID: Final[JSONValue] = {
    "type": ["string", "number"],
    "description": 'The primary key: a non-empty string or a number (101 and "101" are one key).',
}
_PATH: Final[JSONValue] = {
    "type": "string",
    "description": "A relative path inside the sandbox (no `..`, not absolute).",
}


def _object(properties: dict[str, JSONValue], *required: str) -> dict[str, JSONValue]:
    return {"type": "object", "properties": properties, "required": list(required)}


PARAMETERS: Final[dict[str, dict[str, JSONValue]]] = {
    "kv.put": _object(
        {"key": _KEY, "value": {"description": "Any JSON value (default null)."}}, "key"
    ),
    "kv.get": _object({"key": _KEY}, "key"),
    "kv.delete": _object({"key": _KEY}, "key"),
    "record.insert": _object(
        {
            "table": _TABLE,
            "id": _ID,
            "fields": {"type": "object", "description": "The row's columns (default {})."},
            "references": {
                "description": (
                    "An object {field: referenced_table}: each field's value must be the id of "
                    "an existing row of that table."
                ),
            },
        },
        "table",
        "id",
    ),
    "record.get": _object({"table": _TABLE, "id": _ID}, "table", "id"),
    "fs.write": _object(
        {"path": _PATH, "contents": {"type": "string", "description": "The text to write."}},
        "path",
        "contents",
    ),
    "fs.read": _object({"path": _PATH}, "path"),
    "effect.stage": _object(
        {
            "channel": {
                "type": "string",
                "description": "The channel: 1-128 characters of [A-Za-z0-9_].",
            },
            "payload": {"description": "Any JSON value (default null)."},
            "idempotency_key": {
                "type": "string",
                "description": (
                    "Optional; derived from the transaction, step and payload if absent."
                ),
            },
        },
        "channel",
    ),
}

DESCRIPTIONS: Final[dict[str, str]] = {
    "kv.put": "Write `value` under `key` in the key-value table; returns {key, value}.",
    "kv.get": "Read `key` from the key-value table; returns {key, value}; fails if it is absent.",
    "kv.delete": "Delete `key` from the key-value table; returns {key, deleted}.",
    "record.insert": (
        "Insert a row with primary key `id` into `table`, checking the primary key and the "
        "foreign keys named in `references`; returns the row plus `table`."
    ),
    "record.get": "Read the row `id` of `table`; fails if there is none.",
    "fs.write": "Write `contents` to the file at `path` in the sandbox; returns {path, bytes}.",
    "fs.read": "Read the file at `path` in the sandbox; returns {path, contents}.",
    "effect.stage": (
        "Stage `payload` on `channel`, to be dispatched once, after the transaction commits; "
        "returns {staged, channel, idempotency_key}."
    ),
}
