"""The limits on what a transaction accepts: payload sizes, time limits, counts, isolation.

One place for the checks the transaction and the engine both make, so that they refuse the
same values with the same messages.
"""

from __future__ import annotations

import math
from typing import Final, Literal, TypeAlias

from ._errors import InvalidArgument

__all__ = [
    "DEFAULT_ISOLATION",
    "ISOLATION_LEVELS",
    "MAX_AGENT_ID_BYTES",
    "MAX_PAYLOAD_BYTES",
    "Isolation",
    "check_isolation",
    "is_positive_int",
    "is_positive_number",
    "over_limit",
]

MAX_PAYLOAD_BYTES: Final = 1_048_576
MAX_AGENT_ID_BYTES: Final = 256
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


def is_positive_number(value: object) -> bool:
    """A finite number > 0 (not a bool): what every time limit must be."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def is_positive_int(value: object) -> bool:
    """An int > 0 (not a bool): what every count limit must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_isolation(isolation: object) -> None:
    """Raise `InvalidArgument` unless `isolation` is one of `ISOLATION_LEVELS`."""
    if not isinstance(isolation, str) or isolation not in ISOLATION_LEVELS:
        raise InvalidArgument(
            "isolation must be 'read_committed', 'no_lost_updates' (the default) or "
            f"'serializable', got {isolation!r}"
        )
