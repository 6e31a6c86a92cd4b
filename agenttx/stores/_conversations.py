"""What a durable store keeps of an agent's conversation, and the SQL that keeps it.

An integration's runner (`agenttx.integrations`) keeps the conversation that drives a
transaction with the transaction, so that an agent process that restarts finds it again. The
store treats it as opaque JSON text of the runner's own (internal) format, one text per open
transaction, replaced by each write: `SQLiteStore` and `PostgresStore` keep it in a column of
the transaction's row (`txs.conversation`), so it is written under the same fence as every
other write of the transaction and goes when the transaction ends. `MemoryStore` keeps none:
a runner on it holds the conversation in its process only.
"""

from __future__ import annotations

from typing import Final

from .._errors import InvalidArgument
from ._protocol import check_value

__all__ = [
    "CONVERSATION_COLUMN",
    "MAX_CONVERSATION_BYTES",
    "SELECT_CONVERSATION",
    "UPDATE_CONVERSATION",
    "UPDATE_CONVERSATION_FENCED",
    "check_conversation",
]

#: The largest conversation a store keeps, in bytes of UTF-8: far above what a model's
#: context holds, far below what a SQLite or PostgreSQL text value may hold (1 GB).
MAX_CONVERSATION_BYTES: Final = 64 * 1024 * 1024

#: The SQLite migration that adds the column (schema version 8 -> 9).
CONVERSATION_COLUMN: Final = ("ALTER TABLE txs ADD COLUMN conversation TEXT",)

SELECT_CONVERSATION: Final = "SELECT conversation FROM txs WHERE tx_id = ?"
UPDATE_CONVERSATION: Final = "UPDATE txs SET conversation = ? WHERE tx_id = ?"
UPDATE_CONVERSATION_FENCED: Final = f"{UPDATE_CONVERSATION} AND owner = ?"


def check_conversation(text: object) -> str:
    """`text` if it is text a store keeps as a conversation; else `InvalidArgument` saying why
    (not text, not encodable as UTF-8, or over `MAX_CONVERSATION_BYTES`)."""
    if not isinstance(text, str):
        raise InvalidArgument(f"a conversation must be JSON text, not {type(text).__name__}")
    check_value(text)
    if len(text) > MAX_CONVERSATION_BYTES // 4:
        size = len(text.encode("utf-8"))
        if size > MAX_CONVERSATION_BYTES:
            raise InvalidArgument(
                f"the conversation is {size} bytes, over the {MAX_CONVERSATION_BYTES} bytes a "
                "store keeps with a transaction: end this transaction and go on in a new one "
                "with a shorter history"
            )
    return text
