"""The `effect.stage` built-in tool: hold a non-reversible effect until the transaction commits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._tools import ToolContext, tool
from ._args import identifier, optional_str, required_str
from ._specs import DESCRIPTIONS, PARAMETERS

if TYPE_CHECKING:
    from .._json import JSONValue

__all__ = ["effect_stage"]


@tool(
    name="effect.stage",
    description=DESCRIPTIONS["effect.stage"],
    parameters=PARAMETERS["effect.stage"],
    inline=True,
)
def effect_stage(ctx: ToolContext, /, **arguments: JSONValue) -> JSONValue:
    """Stage `payload` (any JSON value, default null) on `channel` (an identifier).

    `idempotency_key` is optional: absent or null lets agenttx derive a deterministic key
    (as does an empty string); any other non-string fails with
    ``invalid type: {t} for field `idempotency_key`, expected a string``.
    Output: `{"staged": true, "channel", "idempotency_key"}` with the key actually used.
    The effect is dispatched only after commit, and dropped if the step is rewound.
    """
    channel = identifier(required_str(arguments, "channel"), "channel")
    payload = arguments.get("payload")
    requested = optional_str(arguments, "idempotency_key")
    key = ctx.stage_effect(channel, payload, requested)
    return {"staged": True, "channel": channel, "idempotency_key": key}
