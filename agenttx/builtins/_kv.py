"""The `kv.*` built-in tools: a transactional key-value table under state keys `kv/{key}`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import ToolError
from .._tools import Tool, ToolContext, tool
from ._args import required_str
from ._specs import DESCRIPTIONS, PARAMETERS

if TYPE_CHECKING:
    from .._json import JSONValue

__all__ = ["KV_TOOLS", "kv_delete", "kv_get", "kv_put"]


def _state_key(key: str) -> str:
    return f"kv/{key}"


@tool(
    name="kv.put",
    description=DESCRIPTIONS["kv.put"],
    parameters=PARAMETERS["kv.put"],
    inline=True,
)
def kv_put(ctx: ToolContext, /, **arguments: JSONValue) -> JSONValue:
    """Write `value` (any JSON value, default null) under `key`; output `{"key", "value"}`.

    Raises `ToolError` for a missing, null or non-string `key`. Unknown arguments are ignored.
    """
    key = required_str(arguments, "key")
    value = arguments.get("value")
    ctx.state.put(_state_key(key), value)
    return {"key": key, "value": value}


@tool(
    name="kv.get",
    description=DESCRIPTIONS["kv.get"],
    parameters=PARAMETERS["kv.get"],
    inline=True,
)
def kv_get(ctx: ToolContext, /, **arguments: JSONValue) -> JSONValue:
    """Read `key`; output `{"key", "value"}`.

    A key that was never written (or was deleted) fails with
    ``no row with key={key} in table "kv"``, which gives the record_not_found hint.
    """
    key = required_str(arguments, "key")
    state_key = _state_key(key)
    if state_key not in ctx.state:
        raise ToolError(f'no row with key={key} in table "kv"')
    return {"key": key, "value": ctx.state.get(state_key)}


@tool(
    name="kv.delete",
    description=DESCRIPTIONS["kv.delete"],
    parameters=PARAMETERS["kv.delete"],
    inline=True,
)
def kv_delete(ctx: ToolContext, /, **arguments: JSONValue) -> JSONValue:
    """Delete `key`; output `{"key", "deleted": bool}`.

    A tombstone is written only when the key exists, so deleting an absent key writes nothing
    (and `deleted` is false).
    """
    key = required_str(arguments, "key")
    return {"key": key, "deleted": ctx.state.delete(_state_key(key))}


KV_TOOLS: tuple[Tool[..., JSONValue], ...] = (kv_put, kv_get, kv_delete)
