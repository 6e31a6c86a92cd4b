"""The limits on what a transaction accepts (payload sizes, calls per turn, the isolation
levels) and on what a plan may ask for."""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

from ._errors import InvalidArgument

__all__ = [
    "DEFAULT_ISOLATION",
    "ISOLATION_LEVELS",
    "MAX_AGENT_ID_BYTES",
    "MAX_CALLS_PER_TURN",
    "MAX_NODE_INPUT_BYTES",
    "MAX_NODE_RETRIES",
    "MAX_NODE_RETRIES_IN_CODE",
    "MAX_NODE_TIMEOUT",
    "MAX_PAYLOAD_BYTES",
    "MAX_PLAN_NODES",
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

# A plan read from JSON (`Plan.from_json`) is usually a model's proposal: it may not ask for
# more than a person would grant. Each bound is far above what a sound plan needs, and low
# enough that one plan cannot hold a worker, a queue or a store for hours.
#: The most nodes a plan from JSON may have (the scheduler and validation are linear in it;
#: an agent's plan with more tool calls than this is a runaway, not a workflow).
MAX_PLAN_NODES: Final = 1000
#: The most retries of transient failures a node of a plan from JSON may ask for: with the
#: runner's backoff (at most 8 s a wait) ten retries wait under 90 s in all.
MAX_NODE_RETRIES: Final = 10
#: The longest timeout (seconds) a node of a plan from JSON may give each attempt: one hour.
MAX_NODE_TIMEOUT: Final = 3600.0
#: The largest inputs a node of a plan from JSON may map, as canonical JSON in UTF-8 (64 KiB):
#: inputs are references and small literals; data belongs in initial values or outputs.
MAX_NODE_INPUT_BYTES: Final = 65_536
#: The most retries a `Node` built in Python may ask for: far above any plan's needs, it only
#: refuses the absurd (a billion retries would keep a node alive for centuries).
MAX_NODE_RETRIES_IN_CODE: Final = 1000


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
