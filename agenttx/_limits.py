"""The limits on what a transaction accepts: payload sizes, calls per turn, isolation levels."""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

from ._errors import InvalidArgument

__all__ = [
    "DEFAULT_ISOLATION",
    "ISOLATION_LEVELS",
    "MAX_AGENT_ID_BYTES",
    "MAX_CALLS_PER_TURN",
    "MAX_PAYLOAD_BYTES",
    "Isolation",
    "check_isolation",
    "over_limit",
]

MAX_PAYLOAD_BYTES: Final = 1_048_576
MAX_AGENT_ID_BYTES: Final = 256
#: The most calls one `call_turn` (or an integration's model turn) runs: a longer turn is
#: refused before any of its calls runs. A model turn holds a handful of tool calls; thousands
#: are a runaway model, which would otherwise hold the transaction's turn for all of them.
MAX_CALLS_PER_TURN: Final = 128
#: A transaction's isolation level, weakest first; `agenttx.stores.Store` says what each allows.
Isolation: TypeAlias = Literal["read_committed", "no_lost_updates", "serializable"]
ISOLATION_LEVELS: Final[tuple[Isolation, ...]] = (
    "read_committed",
    "no_lost_updates",
    "serializable",
)
DEFAULT_ISOLATION: Final[Isolation] = "no_lost_updates"


def over_limit(text: str) -> bool:
    """Whether `text` is longer than MAX_PAYLOAD_BYTES in UTF-8 (counting at most 4 a character)."""
    return (
        len(text) > MAX_PAYLOAD_BYTES // 4
        and len(text.encode("utf-8", "surrogatepass")) > MAX_PAYLOAD_BYTES
    )


def check_isolation(isolation: object) -> None:
    """Raise `InvalidArgument` unless `isolation` is one of `ISOLATION_LEVELS`."""
    if not isinstance(isolation, str) or isolation not in ISOLATION_LEVELS:
        raise InvalidArgument(
            "isolation must be 'read_committed', 'no_lost_updates' (the default) or "
            f"'serializable', got {isolation!r}"
        )
