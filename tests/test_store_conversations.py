"""`ConversationStore`: SQLiteStore and PostgresStore keep an agent's conversation with its
open transaction, fenced like every write of it; MemoryStore keeps none."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import TYPE_CHECKING, Any

import pytest

import agenttx
from agenttx.stores import MemoryStore, SQLiteStore, keeps_conversations
from agenttx.stores import _sqlite_file as file_module

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def test_only_the_durable_stores_keep_conversations(tmp_path: Path) -> None:
    """SQLiteStore keeps conversations; MemoryStore does not (a runner keeps it in memory)."""
    with SQLiteStore(tmp_path / "a.db") as store:
        assert keeps_conversations(store)
    assert not keeps_conversations(MemoryStore())


def test_a_conversation_is_kept_replaced_and_dropped_at_the_end(
    durable_backend: Callable[..., Any],
) -> None:
    """Recorded, read back by another store, replaced by the next write, gone once the
    transaction ends."""
    store, other = durable_backend(), durable_backend()
    store.begin("t1", record="{}")
    assert store.read_conversation("t1") is None
    store.record_conversation("t1", '{"messages": ["é"]}')
    assert other.read_conversation("t1") == '{"messages": ["é"]}'
    store.record_conversation("t1", "[2]")
    assert other.read_conversation("t1") == "[2]"
    store.commit("t1")
    assert other.read_conversation("t1") is None


def test_a_store_that_lost_the_transaction_cannot_write_its_conversation(
    durable_backend: Callable[..., Any],
) -> None:
    """Once another store took the transaction over, the old holder's write raises
    StorageError and changes nothing."""
    store, other = durable_backend(), durable_backend()
    store.begin("t1", record="{}")
    store.record_conversation("t1", "[1]")
    other.load("t1")
    with pytest.raises(agenttx.StorageError):
        store.record_conversation("t1", "[2]")
    assert other.read_conversation("t1") == "[1]"
    other.record_conversation("t1", "[3]")
    assert store.read_conversation("t1") == "[3]"


def test_bad_conversations_are_refused(
    durable_backend: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text that is not UTF-8, not text, or over the size limit raises InvalidArgument."""
    from agenttx.stores import _conversations  # noqa: PLC0415

    store = durable_backend()
    store.begin("t1", record="{}")
    with pytest.raises(agenttx.InvalidArgument, match="UTF-8"):
        store.record_conversation("t1", "\ud800")
    with pytest.raises(agenttx.InvalidArgument, match="JSON text"):
        store.record_conversation("t1", b"[]")
    monkeypatch.setattr(_conversations, "MAX_CONVERSATION_BYTES", 100)
    with pytest.raises(agenttx.InvalidArgument, match="over the 100 bytes"):
        store.record_conversation("t1", "x" * 101)
    assert store.read_conversation("t1") is None


def _downgrade_to_9(connection: sqlite3.Connection) -> None:
    """Take a file back to schema 9: no message log."""
    connection.execute("DROP TRIGGER conversation_appended")
    connection.execute("DROP TRIGGER conversation_ended")
    connection.execute("DROP TABLE conversation_messages")
    connection.execute("ALTER TABLE txs DROP COLUMN conversation_append")
    connection.execute("PRAGMA user_version = 9")


def test_a_schema_8_file_is_migrated_and_its_transactions_stay_readable(tmp_path: Path) -> None:
    """A file of schema 8 (before conversations) opens: its open transaction loads, and gets a
    conversation."""
    path = str(tmp_path / "old.db")
    with SQLiteStore(path) as store:
        store.begin("t1", record='{"old": true}')
    with contextlib.closing(sqlite3.connect(path)) as connection:  # back to schema 8
        _downgrade_to_9(connection)
        connection.execute("ALTER TABLE txs DROP COLUMN conversation")
        connection.execute("PRAGMA user_version = 8")
        connection.commit()
    with SQLiteStore(path) as store:
        assert store.load("t1").record == '{"old": true}'
        store.record_conversation("t1", "[1]", ['{"m":0}'])
        assert store.read_conversation("t1") == "[1]"
        assert store.read_messages("t1", 5) == ('{"m":0}',)
    with contextlib.closing(sqlite3.connect(path)) as connection:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
    assert version == file_module.SCHEMA_VERSION == 10


def test_messages_are_appended_once_rewritten_from_a_position_and_dropped_at_the_end(
    durable_backend: Callable[..., Any],
) -> None:
    """A write appends its messages at `start`, keeping those before it and dropping those
    after its last one; another store reads them in order (the first `count`); the log goes
    when the transaction ends."""
    store, other = durable_backend(), durable_backend()
    store.begin("t1", record="{}")
    assert other.read_messages("t1", 10) == ()
    store.record_conversation("t1", "s1", ['{"a":1}', '"é"'])
    store.record_conversation("t1", "s2", ["[3]", "[4]"], start=2)
    assert other.read_conversation("t1") == "s2"
    assert other.read_messages("t1", 10) == ('{"a":1}', '"é"', "[3]", "[4]")
    assert other.read_messages("t1", 3) == ('{"a":1}', '"é"', "[3]")
    store.record_conversation("t1", "s3", ["[2]"], start=1)  # a rewritten end
    assert other.read_messages("t1", 10) == ('{"a":1}', "[2]")
    store.record_conversation("t1", "whole")  # a whole record: no log
    assert other.read_messages("t1", 10) == ()
    store.record_conversation("t1", "s4", ["[1]"])
    store.begin("t2", record="{}")
    store.record_conversation("t2", "other", ["[9]"])
    store.commit("t1")
    assert other.read_conversation("t1") is None
    assert other.read_messages("t1", 10) == ()
    assert other.read_messages("t2", 10) == ("[9]",)


def test_bad_appends_are_refused_and_change_nothing(
    durable_backend: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that is not an int >= 0, a message that is not UTF-8 text, one text instead of
    a sequence, or a write over the size limit raises InvalidArgument; nothing is written."""
    from agenttx.stores import _conversations  # noqa: PLC0415

    store = durable_backend()
    store.begin("t1", record="{}")
    store.record_conversation("t1", "s0", ["[0]"])
    for messages, start in (
        (["[1]"], -1),
        (["[1]"], True),
        (["\ud800"], 1),
        ([b"[1]"], 1),
        ("[1]", 1),
    ):
        with pytest.raises(agenttx.InvalidArgument):
            store.record_conversation("t1", "s1", messages, start=start)
    monkeypatch.setattr(_conversations, "MAX_CONVERSATION_BYTES", 100)
    with pytest.raises(agenttx.InvalidArgument, match="over the 100 bytes"):
        store.record_conversation("t1", "s1", ["x" * 60, "y" * 60], start=1)
    assert store.read_conversation("t1") == "s0"
    assert store.read_messages("t1", 10) == ("[0]",)


def test_a_store_that_lost_the_transaction_cannot_append_to_its_log(
    durable_backend: Callable[..., Any],
) -> None:
    """The old holder's append raises StorageError and leaves the log as it was."""
    store, other = durable_backend(), durable_backend()
    store.begin("t1", record="{}")
    store.record_conversation("t1", "s1", ["[1]"])
    other.load("t1")
    with pytest.raises(agenttx.StorageError):
        store.record_conversation("t1", "s2", ["[2]"], start=1)
    assert other.read_conversation("t1") == "s1"
    assert other.read_messages("t1", 10) == ("[1]",)
