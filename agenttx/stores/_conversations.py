"""What a durable store keeps of an agent's conversation, and the SQL that keeps it.

An integration's runner (`agenttx.integrations`) keeps the conversation that drives a
transaction with the transaction, so that an agent process that restarts finds it again. The
store treats it as opaque JSON texts of the runner's own (internal) format: one text per open
transaction (the runner's state), replaced by each write, and a log of messages, numbered from
0, that a write appends to. A write gives the state, the position `start` its messages go at,
and the messages: those before `start` stay as they are, those from `start` on are replaced
(a rewritten history), so a growing conversation writes each message once.

`SQLiteStore` and `PostgresStore` keep the state in a column of the transaction's row
(`txs.conversation`) and the messages in `conversation_messages (tx_id, seq, message)`; a
write is one statement on the transaction's row, so it is fenced like every other write of the
transaction, and atomic: the state and its messages land together or not at all. On SQLite
the statement sets `txs.conversation_append` (`{"start": n, "messages": [...]}`) and a trigger
moves the messages into the log; on PostgreSQL it is one statement of common table
expressions. Both drop the log when the transaction's row goes (it ended). `MemoryStore` keeps
none: a runner on it holds the conversation in its process only.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

from .._errors import InvalidArgument
from ._protocol import MAX_INT64, check_int, check_value

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "CONVERSATION_COLUMN",
    "CONVERSATION_LOG",
    "MAX_CONVERSATION_BYTES",
    "SELECT_CONVERSATION",
    "SELECT_MESSAGES",
    "UPDATE_CONVERSATION",
    "UPDATE_CONVERSATION_FENCED",
    "appended",
    "check_conversation",
]

#: The largest conversation a store keeps, in bytes of UTF-8: far above what a model's
#: context holds, far below what a SQLite or PostgreSQL text value may hold (1 GB).
MAX_CONVERSATION_BYTES: Final = 64 * 1024 * 1024

#: The SQLite migration that adds the column (schema version 8 -> 9).
CONVERSATION_COLUMN: Final = ("ALTER TABLE txs ADD COLUMN conversation TEXT",)

#: The SQLite migration that adds the message log (schema version 9 -> 10). A conversation
#: kept before it (a whole record in `txs.conversation`) stays as it is: the runner reads it,
#: and its next write starts the log.
CONVERSATION_LOG: Final = (
    (
        "CREATE TABLE conversation_messages (tx_id TEXT NOT NULL, seq INTEGER NOT NULL, "
        "message TEXT NOT NULL, PRIMARY KEY (tx_id, seq)) WITHOUT ROWID"
    ),
    "ALTER TABLE txs ADD COLUMN conversation_append TEXT",
    (
        "CREATE TRIGGER conversation_appended AFTER UPDATE OF conversation_append ON txs "
        "WHEN NEW.conversation_append IS NOT NULL BEGIN "
        "DELETE FROM conversation_messages WHERE tx_id = NEW.tx_id "
        "AND seq >= json_extract(NEW.conversation_append, '$.start'); "
        "INSERT INTO conversation_messages (tx_id, seq, message) "
        "SELECT NEW.tx_id, json_extract(NEW.conversation_append, '$.start') + key, value "
        "FROM json_each(NEW.conversation_append, '$.messages'); "
        "UPDATE txs SET conversation_append = NULL WHERE tx_id = NEW.tx_id; END"
    ),
    (
        "CREATE TRIGGER conversation_ended AFTER DELETE ON txs BEGIN "
        "DELETE FROM conversation_messages WHERE tx_id = OLD.tx_id; END"
    ),
)

SELECT_CONVERSATION: Final = "SELECT conversation FROM txs WHERE tx_id = ?"
SELECT_MESSAGES: Final = (
    "SELECT message FROM conversation_messages WHERE tx_id = ? AND seq < ? ORDER BY seq"
)
UPDATE_CONVERSATION: Final = (
    "UPDATE txs SET conversation = ?, conversation_append = ? WHERE tx_id = ?"
)
UPDATE_CONVERSATION_FENCED: Final = f"{UPDATE_CONVERSATION} AND owner = ?"


def appended(text: object, messages: Sequence[str], start: object) -> str:
    """The `conversation_append` value of a write (`{"start": n, "messages": [...]}`), once
    `text`, `messages` and `start` are checked: `InvalidArgument` for text or a message that is
    not UTF-8 text, a `start` that is not an int >= 0, or a write over
    `MAX_CONVERSATION_BYTES`."""
    state = check_conversation(text)
    check_int(start, "start", MAX_INT64)
    if isinstance(messages, (str, bytes)):
        raise InvalidArgument("messages must be a sequence of JSON texts, not one text")
    size = len(state)
    for message in messages:
        check_value(message)
        size += len(message)
    if size > MAX_CONVERSATION_BYTES // 4:
        check_conversation(state + "".join(messages))
    return json.dumps({"start": start, "messages": list(messages)}, ensure_ascii=False)


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
