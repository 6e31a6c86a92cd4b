"""The built-in tools: their arguments, outputs, state keys, sandbox and messages."""

from __future__ import annotations

import errno
import json
import os
import stat
import sys

import pytest

import agenttx
import agenttx.builtins
from agenttx._errors import InvalidArgument, ToolError
from agenttx._tools import Compensation, StagedEffect, Tool, ToolContext, ToolRegistry
from agenttx.builtins import _args, _fs
from agenttx.stores import MemoryStore

TX = "t1"
TOOL_NAMES = [
    "kv.put",
    "kv.get",
    "kv.delete",
    "record.insert",
    "record.get",
    "fs.write",
    "fs.read",
    "effect.stage",
]
JSON_VALUES_OF_EACH_TYPE = [
    (None, "null"),
    (True, "boolean"),
    (7, "number"),
    (1.5, "number"),
    ("s", "string"),
    ([1], "array"),
    ({"a": 1}, "object"),
]


class RecordingStore:
    """A MemoryStore that records the mutations made through it."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.calls: list[tuple[str, str]] = []

    def begin(self, tx_id: str) -> None:
        self.inner.begin(tx_id)

    def get(self, tx_id: str, key: str) -> str | None:
        return self.inner.get(tx_id, key)

    def put(self, tx_id: str, key: str, value: str) -> None:
        self.calls.append(("put", key))
        self.inner.put(tx_id, key, value)

    def delete(self, tx_id: str, key: str) -> None:
        self.calls.append(("delete", key))
        self.inner.delete(tx_id, key)


@pytest.fixture
def store() -> RecordingStore:
    recording = RecordingStore()
    recording.begin(TX)
    return recording


def new_context(store: RecordingStore) -> ToolContext:
    return ToolContext(
        tx_id=TX,
        step_id=1,
        idempotency_key="k",
        deadline=float("inf"),
        store=store,  # type: ignore[arg-type]
        compensations={"fs.restore_file": agenttx.builtins.restore_file},
    )


@pytest.fixture
def ctx(store: RecordingStore) -> ToolContext:
    return new_context(store)


@pytest.fixture
def root(tmp_path):
    return tmp_path / "sandbox"


@pytest.fixture
def tools(root) -> dict[str, Tool]:
    return {t.name: t for t in agenttx.builtins.tools(root) if isinstance(t, Tool)}


def call(tools, ctx, name, /, **arguments):
    return tools[name](ctx, **arguments)


def failure(tools, ctx, name, /, **arguments) -> str:
    with pytest.raises(ToolError) as info:
        tools[name](ctx, **arguments)
    assert str(info.value) == info.value.message
    return info.value.message


def stored(store: RecordingStore, key: str):
    text = store.get(TX, key)
    return None if text is None else json.loads(text)


def undos_of(ctx: ToolContext):
    undos, _ = ctx._close()
    return list(undos)


# ---------------------------------------------------------------------- the catalogue


def test_tools_lists_every_builtin_then_the_compensation(root):
    """`tools()` returns the eight reference tools and the `fs.restore_file` compensation."""
    listed = agenttx.builtins.tools(root)
    assert [t.name for t in listed] == [*TOOL_NAMES, "fs.restore_file"]
    assert all(isinstance(t, Tool) for t in listed[:-1])
    assert listed[-1] is agenttx.builtins.restore_file
    assert isinstance(agenttx.builtins.restore_file, Compensation)


def test_tools_register_as_one_transaction_toolset(root):
    """The list passes registry validation and gives the documented sorted tool names."""
    registry = ToolRegistry(agenttx.builtins.tools(root))
    assert list(registry.names()) == sorted(TOOL_NAMES)
    assert list(registry.wire_names()) == sorted(name.replace(".", "_") for name in TOOL_NAMES)
    assert list(registry.compensations) == ["fs.restore_file"]
    assert all(registry.tools[name].wants_context for name in TOOL_NAMES)


def test_building_the_tools_touches_no_file(root):
    """Nothing is created on disk until `fs.write` runs."""
    agenttx.builtins.tools(root)
    assert not root.exists()


def test_roots_do_not_interfere(tmp_path, ctx):
    """Two `tools()` calls with different roots write and read in their own roots."""
    first = {t.name: t for t in agenttx.builtins.tools(tmp_path / "one")}
    second = {t.name: t for t in agenttx.builtins.tools(tmp_path / "two")}
    call(first, ctx, "fs.write", path="f.txt", contents="one")
    call(second, ctx, "fs.write", path="f.txt", contents="two")
    assert (tmp_path / "one" / "f.txt").read_text() == "one"
    assert call(second, ctx, "fs.read", path="f.txt")["contents"] == "two"


def test_builtins_public_surface():
    """`agenttx.builtins` exports exactly `restore_file` and `tools`."""
    assert agenttx.builtins.__all__ == ["restore_file", "tools"]


# ---------------------------------------------------------------------- argument helpers


@pytest.mark.parametrize(("value", "kind"), JSON_VALUES_OF_EACH_TYPE)
def test_json_type_names_each_kind_as_serde_does(value, kind):
    """Type names are null, boolean, number, string, array and object (bool is not a number)."""
    assert _args.json_type(value) == kind


def test_json_type_of_a_non_json_value_is_its_python_type():
    """Values no JSON text can produce are named by their Python type."""
    assert _args.json_type(b"x") == "bytes"


@pytest.mark.parametrize(
    ("value", "text"),
    [(101, "101"), (-3, "-3"), (1.5, "1.5"), (100.0, "100.0"), ("x y", "x y"), (True, "true")],
)
def test_value_text_renders_numbers_as_json(value, text):
    """Numbers render as their JSON text, strings as themselves."""
    assert _args.value_text(value) == text


@pytest.mark.parametrize("name", ["a", "A_9", "x" * 128])
def test_identifier_accepts_1_to_128_word_chars(name):
    """Identifiers are 1-128 ASCII letters, digits or underscores."""
    assert _args.identifier(name, "table") == name


@pytest.mark.parametrize("name", ["", "x" * 129, "a-b", "a b", "é", "a\n", "a.b"])
def test_identifier_rejects_anything_else(name):
    """Anything else is refused with the documented message."""
    with pytest.raises(ToolError) as info:
        _args.identifier(name, "channel")
    assert info.value.message == f"invalid channel `{name}`: expected 1-128 chars of [A-Za-z0-9_]"


# ---------------------------------------------------------------------- kv.*


def test_kv_put_writes_the_value_under_kv_key(tools, ctx, store):
    """`kv.put` stores the value's JSON at `kv/{key}` and echoes key and value."""
    assert call(tools, ctx, "kv.put", key="a", value={"n": [1, 2]}) == {
        "key": "a",
        "value": {"n": [1, 2]},
    }
    assert store.get(TX, "kv/a") == '{"n":[1,2]}'


def test_kv_put_value_defaults_to_null(tools, ctx, store):
    """A missing `value` stores null, and `kv.get` then finds the key with value null."""
    assert call(tools, ctx, "kv.put", key="a") == {"key": "a", "value": None}
    assert store.get(TX, "kv/a") == "null"
    assert call(tools, ctx, "kv.get", key="a") == {"key": "a", "value": None}


def test_kv_get_reads_what_put_wrote(tools, ctx):
    """`kv.get` outputs `{"key", "value"}`."""
    call(tools, ctx, "kv.put", key="a", value=3)
    assert call(tools, ctx, "kv.get", key="a") == {"key": "a", "value": 3}


def test_kv_get_missing_key_message(tools, ctx):
    """A missing key fails with the record-not-found message."""
    assert failure(tools, ctx, "kv.get", key="a") == 'no row with key=a in table "kv"'


def test_kv_delete_existing_key(tools, ctx, store):
    """Deleting an existing key reports it and removes it."""
    call(tools, ctx, "kv.put", key="a", value=1)
    assert call(tools, ctx, "kv.delete", key="a") == {"key": "a", "deleted": True}
    assert store.get(TX, "kv/a") is None
    assert failure(tools, ctx, "kv.get", key="a") == 'no row with key=a in table "kv"'


def test_kv_delete_missing_key_writes_no_tombstone(tools, ctx, store):
    """Deleting an absent key reports false and writes nothing."""
    assert call(tools, ctx, "kv.delete", key="a") == {"key": "a", "deleted": False}
    assert store.calls == []


@pytest.mark.parametrize("name", ["kv.put", "kv.get", "kv.delete"])
@pytest.mark.parametrize(("value", "kind"), JSON_VALUES_OF_EACH_TYPE)
def test_kv_key_must_be_a_string(tools, ctx, name, value, kind):
    """A null key is missing; any other non-string key is a type error naming its JSON type."""
    if kind == "string":
        return
    message = failure(tools, ctx, name, key=value)
    if kind == "null":
        assert message == "missing field `key`"
    else:
        assert message == f"invalid type: {kind} for field `key`, expected a string"


@pytest.mark.parametrize("name", ["kv.put", "kv.get", "kv.delete"])
def test_kv_key_is_required(tools, ctx, name):
    """A missing key gives the serde missing-field message."""
    assert failure(tools, ctx, name) == "missing field `key`"


def test_unknown_arguments_are_ignored(tools, ctx):
    """Unknown arguments are ignored (even one named `ctx`)."""
    assert call(tools, ctx, "kv.put", key="a", value=1, extra=[1], ctx=2) == {
        "key": "a",
        "value": 1,
    }


# ---------------------------------------------------------------------- record.*


def test_record_insert_stores_the_row_and_outputs_it_with_the_table(tools, ctx, store):
    """The row is fields + id, stored at `records/{table}/{id}`; output adds `table`."""
    output = call(tools, ctx, "record.insert", table="users", id="u1", fields={"name": "Ann"})
    assert output == {"name": "Ann", "id": "u1", "table": "users"}
    assert stored(store, "records/users/u1") == {"name": "Ann", "id": "u1"}


def test_record_insert_numeric_id_keys_by_its_text_and_keeps_the_number(tools, ctx, store):
    """`101` is stored under `records/t/101` and the row keeps the number."""
    assert call(tools, ctx, "record.insert", table="t", id=101) == {"id": 101, "table": "t"}
    assert stored(store, "records/t/101") == {"id": 101}
    assert call(tools, ctx, "record.get", table="t", id="101") == {"id": 101}


def test_record_insert_float_id_uses_its_json_text(tools, ctx, store):
    """A float id is keyed by its canonical JSON text."""
    call(tools, ctx, "record.insert", table="t", id=1.5)
    assert stored(store, "records/t/1.5") == {"id": 1.5}


def test_record_insert_id_overwrites_an_id_field(tools, ctx, store):
    """The `id` argument wins over an `id` inside `fields`; `table` in fields is overwritten."""
    output = call(tools, ctx, "record.insert", table="t", id="a", fields={"id": "b", "table": 1})
    assert output == {"id": "a", "table": "t"}
    assert stored(store, "records/t/a") == {"id": "a", "table": 1}


@pytest.mark.parametrize("fields", [None, {}])
def test_record_insert_fields_default_to_empty(tools, ctx, fields):
    """Missing or null `fields` means no fields."""
    arguments = {} if fields is None else {"fields": fields}
    assert call(tools, ctx, "record.insert", table="t", id="a", **arguments) == {
        "id": "a",
        "table": "t",
    }


def test_record_insert_duplicate_primary_key(tools, ctx, store):
    """A second insert with the same id (string or number) fails Postgres-style."""
    call(tools, ctx, "record.insert", table="users", id=101)
    message = failure(tools, ctx, "record.insert", table="users", id="101")
    assert message == (
        'ERROR: duplicate key value violates unique constraint "users_pkey"\n'
        "DETAIL: Key (id)=(101) already exists."
    )
    assert store.calls == [("put", "records/users/101")]


def test_record_insert_foreign_key_present(tools, ctx):
    """A reference to an existing row passes, with string or numeric ids."""
    call(tools, ctx, "record.insert", table="users", id=7)
    call(tools, ctx, "record.insert", table="teams", id="red")
    output = call(
        tools,
        ctx,
        "record.insert",
        table="orders",
        id="o1",
        fields={"user_id": 7, "team": "red"},
        references={"user_id": "users", "team": "teams"},
    )
    assert output == {"user_id": 7, "team": "red", "id": "o1", "table": "orders"}


def test_record_insert_foreign_key_missing(tools, ctx, store):
    """A reference to a missing row fails with the FK message and writes nothing."""
    message = failure(
        tools,
        ctx,
        "record.insert",
        table="orders",
        id="o1",
        fields={"user_id": 42},
        references={"user_id": "users"},
    )
    assert message == (
        'ERROR: insert or update on table "orders" violates foreign key constraint '
        '"orders_user_id_fkey"\n'
        'DETAIL: Key (user_id)=(42) is not present in table "users".'
    )
    assert store.calls == []


def test_record_insert_foreign_key_non_string_value_uses_json_text(tools, ctx):
    """A non-string FK value is looked up (and reported) by its JSON text."""
    message = failure(
        tools,
        ctx,
        "record.insert",
        table="o",
        id=1,
        fields={"ref": {"b": 1, "a": [True]}},
        references={"ref": "r"},
    )
    assert 'DETAIL: Key (ref)=({"a":[true],"b":1}) is not present in table "r".' in message


def test_record_insert_references_checked_in_key_order(tools, ctx):
    """With several missing references, the first in sorted field order is reported."""
    message = failure(
        tools,
        ctx,
        "record.insert",
        table="o",
        id=1,
        fields={"b_id": 1, "a_id": 2},
        references={"b_id": "bs", "a_id": "as_"},
    )
    assert '"o_a_id_fkey"' in message


@pytest.mark.parametrize("fields", [{}, {"user_id": None}])
def test_record_insert_null_foreign_key(tools, ctx, fields):
    """A referenced field that is missing or null fails with the not-null message."""
    message = failure(
        tools,
        ctx,
        "record.insert",
        table="orders",
        id=1,
        fields=fields,
        references={"user_id": "users"},
    )
    assert message == (
        'ERROR: null value in column "user_id" of relation "orders" violates not-null constraint'
    )


@pytest.mark.parametrize("references", [None, "users", ["users"], 3, True])
def test_record_insert_non_object_references_are_ignored(tools, ctx, references):
    """A non-object `references` is silently ignored."""
    output = call(
        tools, ctx, "record.insert", table="t", id=1, fields={"u": 9}, references=references
    )
    assert output == {"u": 9, "id": 1, "table": "t"}


@pytest.mark.parametrize(("value", "kind"), JSON_VALUES_OF_EACH_TYPE)
def test_record_insert_referenced_table_must_be_a_string(tools, ctx, value, kind):
    """A non-string referenced table names its type and the field that holds it."""
    if kind == "string":
        return
    message = failure(
        tools, ctx, "record.insert", table="t", id=1, fields={"u": 1}, references={"u": value}
    )
    assert message == f"invalid type: {kind} for references.u, expected a string"


def test_record_insert_referenced_table_must_be_an_identifier(tools, ctx):
    """A referenced table that is not an identifier is refused."""
    message = failure(
        tools, ctx, "record.insert", table="t", id=1, fields={"u": 1}, references={"u": "a-b"}
    )
    assert message == "invalid referenced table `a-b`: expected 1-128 chars of [A-Za-z0-9_]"


def test_record_insert_primary_key_is_checked_before_references(tools, ctx):
    """The primary-key check comes before the foreign-key checks."""
    call(tools, ctx, "record.insert", table="t", id=1)
    message = failure(tools, ctx, "record.insert", table="t", id=1, references={"u": 5})
    assert message.startswith("ERROR: duplicate key value")


@pytest.mark.parametrize(("value", "kind"), JSON_VALUES_OF_EACH_TYPE)
def test_record_insert_fields_must_be_an_object(tools, ctx, value, kind):
    """Non-object `fields` (null aside) is a type error."""
    if kind in {"null", "object"}:
        return
    message = failure(tools, ctx, "record.insert", table="t", id=1, fields=value)
    assert message == f"invalid type: {kind} for field `fields`, expected an object"


@pytest.mark.parametrize("name", ["record.insert", "record.get"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "missing field `id`"),
        ("", "invalid type: string for field `id`, expected a string or number"),
        (True, "invalid type: boolean for field `id`, expected a string or number"),
        ([1], "invalid type: array for field `id`, expected a string or number"),
        ({}, "invalid type: object for field `id`, expected a string or number"),
    ],
)
def test_record_id_must_be_a_non_empty_string_or_number(tools, ctx, name, value, message):
    """Ids accept a non-empty string or a number; the empty string is an `invalid type`."""
    assert failure(tools, ctx, name, table="t", id=value) == message


@pytest.mark.parametrize("name", ["record.insert", "record.get"])
def test_record_table_checks(tools, ctx, name):
    """`table` is required, a string, and an identifier."""
    assert failure(tools, ctx, name, id=1) == "missing field `table`"
    assert (
        failure(tools, ctx, name, table=5, id=1)
        == "invalid type: number for field `table`, expected a string"
    )
    assert (
        failure(tools, ctx, name, table="x" * 129, id=1)
        == f"invalid table `{'x' * 129}`: expected 1-128 chars of [A-Za-z0-9_]"
    )


def test_record_table_is_checked_before_id(tools, ctx):
    """Arguments are checked in order: table, then id."""
    assert failure(tools, ctx, "record.insert") == "missing field `table`"


def test_record_get_returns_the_stored_row(tools, ctx):
    """`record.get` outputs the row as inserted, without `table`."""
    call(tools, ctx, "record.insert", table="users", id="u1", fields={"n": 1})
    assert call(tools, ctx, "record.get", table="users", id="u1") == {"n": 1, "id": "u1"}


def test_record_get_missing_row_message(tools, ctx):
    """A missing row fails with the record-not-found message, numeric ids as text."""
    assert (
        failure(tools, ctx, "record.get", table="users", id=7)
        == 'no row with id=7 in table "users"'
    )


# ---------------------------------------------------------------------- effect.stage


def test_effect_stage_stages_the_effect(tools, ctx):
    """`effect.stage` stages on the context and outputs the key actually used."""
    output = call(tools, ctx, "effect.stage", channel="email", payload={"to": "a@b"})
    _, effects = ctx._close()
    assert effects == (
        StagedEffect(
            tx_id=TX,
            step_id=1,
            channel="email",
            payload={"to": "a@b"},
            idempotency_key=output["idempotency_key"],
        ),
    )
    assert output == {
        "staged": True,
        "channel": "email",
        "idempotency_key": effects[0].idempotency_key,
    }
    assert len(output["idempotency_key"]) == 32


def test_effect_stage_keeps_a_given_key_and_defaults_payload_to_null(tools, ctx):
    """A given idempotency key is used as is; a missing payload is null."""
    output = call(tools, ctx, "effect.stage", channel="hook", idempotency_key="abc")
    assert output == {"staged": True, "channel": "hook", "idempotency_key": "abc"}
    _, effects = ctx._close()
    assert effects[0].payload is None


def test_effect_stage_key_is_deterministic(tools, store):
    """Without a key, the same call derives the same key."""
    first = call(tools, new_context(store), "effect.stage", channel="c", payload=[1])
    second = call(tools, new_context(store), "effect.stage", channel="c", payload=[1])
    assert first == second


@pytest.mark.parametrize(("value", "kind"), JSON_VALUES_OF_EACH_TYPE)
def test_effect_stage_idempotency_key_must_be_a_string(tools, ctx, value, kind):
    """A non-string, non-null idempotency key is a type error."""
    if kind in {"null", "string"}:
        return
    assert (
        failure(tools, ctx, "effect.stage", channel="c", idempotency_key=value)
        == f"invalid type: {kind} for field `idempotency_key`, expected a string"
    )


def test_effect_stage_channel_checks(tools, ctx):
    """`channel` is required, a string, and an identifier; nothing is staged on failure."""
    assert failure(tools, ctx, "effect.stage") == "missing field `channel`"
    assert (
        failure(tools, ctx, "effect.stage", channel=1)
        == "invalid type: number for field `channel`, expected a string"
    )
    assert (
        failure(tools, ctx, "effect.stage", channel="e-mail")
        == "invalid channel `e-mail`: expected 1-128 chars of [A-Za-z0-9_]"
    )
    assert ctx._close() == ((), ())


# ---------------------------------------------------------------------- fs.write / fs.read


def test_fs_write_writes_and_registers_the_undo(tools, ctx, root):
    """A new file: output path and UTF-8 byte count; the undo has the real paths and null."""
    output = call(tools, ctx, "fs.write", path="notes/a.txt", contents="héllo")
    assert output == {"path": "notes/a.txt", "bytes": 6}
    target = root / "notes" / "a.txt"
    assert target.read_bytes() == "héllo".encode()
    (undo,) = undos_of(ctx)
    assert undo.kind == "fs.restore_file"
    assert undo.payload == {
        "path": os.path.realpath(target),
        "prior_hex": None,
        "root": os.path.realpath(root),
    }
    assert undo.step_id == 1


def test_fs_write_records_prior_bytes_as_lowercase_hex(tools, ctx, root):
    """Overwriting records the file's prior bytes, hex encoded."""
    root.mkdir()
    (root / "a.bin").write_bytes(b"\x00\xab\xff")
    call(tools, ctx, "fs.write", path="a.bin", contents="new")
    (undo,) = undos_of(ctx)
    assert undo.payload["prior_hex"] == "00abff"
    assert (root / "a.bin").read_text() == "new"


def test_fs_write_leaves_no_temporary_file(tools, ctx, root):
    """The atomic write renames its temporary file into place."""
    call(tools, ctx, "fs.write", path="a.txt", contents="x")
    assert sorted(p.name for p in root.iterdir()) == ["a.txt"]


def test_fs_write_leaves_a_file_named_like_its_temporary_file_alone(tools, ctx, root):
    """A user's `a.txt.agenttx-tmp` survives a write of `a.txt`: temporary names are random."""
    root.mkdir()
    (root / "a.txt.agenttx-tmp").write_text("the user's own file")
    call(tools, ctx, "fs.write", path="a.txt", contents="x")
    assert sorted(p.name for p in root.iterdir()) == ["a.txt", "a.txt.agenttx-tmp"]
    assert (root / "a.txt").read_text() == "x"
    assert (root / "a.txt.agenttx-tmp").read_text() == "the user's own file"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")
def test_fs_write_keeps_the_file_mode(tools, ctx, root):
    """Overwriting keeps the existing file's permission bits."""
    root.mkdir()
    (root / "run.sh").write_text("old")
    (root / "run.sh").chmod(0o750)
    call(tools, ctx, "fs.write", path="run.sh", contents="new")
    assert stat.S_IMODE((root / "run.sh").stat().st_mode) == 0o750


def test_fs_write_normalises_inner_dots_and_slashes(tools, ctx, root):
    """`a/./b//c.txt` is `a/b/c.txt`; the output echoes the path as given."""
    output = call(tools, ctx, "fs.write", path="a/./b//c.txt", contents="")
    assert output == {"path": "a/./b//c.txt", "bytes": 0}
    assert (root / "a" / "b" / "c.txt").read_text() == ""


def test_undo_is_registered_before_the_write(tools, ctx, root, monkeypatch):
    """When the write itself fails, the undo is still registered (it came first)."""
    root.mkdir()

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(_fs.os, "replace", refuse)
    message = failure(tools, ctx, "fs.write", path="f.txt", contents="x")
    assert message == f"{os.strerror(errno.EACCES)}: 'f.txt'"
    assert list(root.iterdir()) == []  # the temporary file is gone too
    (undo,) = undos_of(ctx)
    assert undo.payload["path"] == os.path.realpath(root / "f.txt")
    assert undo.payload["prior_hex"] is None


def test_failed_write_removes_its_temporary_file(tools, ctx, root, monkeypatch):
    """A write failing after the temporary file exists removes it and keeps the old file."""
    root.mkdir()
    (root / "f.txt").write_text("old")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_fs.os, "fsync", full_disk)
    message = failure(tools, ctx, "fs.write", path="f.txt", contents="new")
    assert message == f"{os.strerror(errno.ENOSPC)}: 'f.txt'"
    assert sorted(p.name for p in root.iterdir()) == ["f.txt"]
    assert (root / "f.txt").read_text() == "old"
    (undo,) = undos_of(ctx)
    assert undo.payload["prior_hex"] == b"old".hex()


def test_fs_write_onto_a_directory_fails_before_registering(tools, ctx, root):
    """A directory target fails while reading the prior bytes: nothing to undo yet."""
    (root / "d").mkdir(parents=True)
    assert failure(tools, ctx, "fs.write", path="d", contents="x") == "Is a directory: 'd'"
    assert undos_of(ctx) == []


def test_fs_write_under_a_file_reports_the_io_error(tools, ctx, root):
    """A parent that is a file fails with the I/O error text and the relative path."""
    root.mkdir()
    (root / "f").write_text("")
    message = failure(tools, ctx, "fs.write", path="f/x.txt", contents="x")
    assert message.endswith(": 'f/x.txt'")
    assert message.split(":")[0] in {os.strerror(errno.EEXIST), os.strerror(errno.ENOTDIR)}


def test_fs_read_reads_the_file(tools, ctx, root):
    """`fs.read` outputs the path and the contents."""
    call(tools, ctx, "fs.write", path="a/b.txt", contents="hi ✓")
    assert call(tools, ctx, "fs.read", path="a/b.txt") == {"path": "a/b.txt", "contents": "hi ✓"}


def test_fs_read_decodes_lossily(tools, ctx, root):
    """Invalid UTF-8 is replaced with U+FFFD."""
    root.mkdir()
    (root / "bin").write_bytes(b"ok\xff\xfe!")
    assert call(tools, ctx, "fs.read", path="bin")["contents"] == "ok\ufffd\ufffd!"


def test_fs_read_missing_file_message(tools, ctx):
    """A missing file gives the documented message with the relative path."""
    assert (
        failure(tools, ctx, "fs.read", path="nope.txt") == "No such file or directory: 'nope.txt'"
    )


def test_fs_read_creates_no_directories(tools, ctx, root):
    """Reading creates neither the root nor any parent directory."""
    assert (
        failure(tools, ctx, "fs.read", path="a/b/c.txt") == "No such file or directory: 'a/b/c.txt'"
    )
    assert not root.exists()
    root.mkdir()
    failure(tools, ctx, "fs.read", path="a/b/c.txt")
    assert list(root.iterdir()) == []


def test_fs_read_directory_reports_the_io_error(tools, ctx, root):
    """Other I/O errors read `{strerror}: '{path}'`."""
    (root / "d").mkdir(parents=True)
    assert failure(tools, ctx, "fs.read", path="d") == "Is a directory: 'd'"


def test_fs_read_registers_nothing(tools, ctx, root):
    """Reading records no undo and stages nothing."""
    call(tools, ctx, "fs.write", path="a", contents="")
    ctx2 = new_context(RecordingStore())
    call(tools, ctx2, "fs.read", path="a")
    assert ctx2._close() == ((), ())


ESCAPES = ["../x", "/etc/passwd", "a/../../x", "", ".hidden", "./x", "a/..", "..", "."]


@pytest.mark.parametrize("name", ["fs.write", "fs.read"])
@pytest.mark.parametrize("path", ESCAPES)
def test_sandbox_escapes_are_refused(tools, ctx, root, name, path):
    """Escaping paths fail with the sandbox message, create nothing and register nothing."""
    message = failure(tools, ctx, name, path=path, contents="x")
    assert message == f"path '{path}' escapes the sandbox"
    assert not root.exists()
    assert undos_of(ctx) == []


@pytest.mark.parametrize("name", ["fs.write", "fs.read"])
def test_symlinked_directory_pointing_outside_is_an_escape(tools, ctx, root, tmp_path, name):
    """`link/x`, where `link` points outside the sandbox, is refused; nothing is created."""
    outside = tmp_path / "outside"
    outside.mkdir()
    root.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    for path in ["link/x", "link/sub/x"]:
        message = failure(tools, ctx, name, path=path, contents="x")
        assert message == f"path '{path}' escapes the sandbox"
    assert list(outside.iterdir()) == []


def test_directory_swapped_for_a_symlink_while_created_is_an_escape(tools, ctx, root, monkeypatch):
    """A parent replaced by an escaping symlink between check and creation is caught."""
    outside = root.parent / "outside"
    outside.mkdir()
    root.mkdir()
    real_mkdir = os.mkdir

    def racing_mkdir(name, mode=0o777, *, dir_fd=None):
        real_mkdir(name, mode, dir_fd=dir_fd)
        if name == "a":
            os.rmdir(name, dir_fd=dir_fd)
            os.symlink(outside, name, dir_fd=dir_fd)

    monkeypatch.setattr(_fs.os, "mkdir", racing_mkdir)
    assert failure(tools, ctx, "fs.write", path="a/x", contents="x") == (
        "path 'a/x' escapes the sandbox"
    )
    assert list(outside.iterdir()) == []
    assert undos_of(ctx) == []


def test_symlinked_directory_inside_the_sandbox_is_allowed(tools, ctx, root):
    """A symlink that stays inside the root is followed."""
    (root / "real").mkdir(parents=True)
    (root / "alias").symlink_to(root / "real", target_is_directory=True)
    call(tools, ctx, "fs.write", path="alias/f.txt", contents="x")
    assert (root / "real" / "f.txt").read_text() == "x"
    (undo,) = undos_of(ctx)
    assert undo.payload["path"] == os.path.realpath(root / "real" / "f.txt")


@pytest.mark.parametrize("name", ["fs.write", "fs.read"])
@pytest.mark.parametrize("inside", [True, False])
def test_target_symlink_is_an_escape(tools, ctx, root, name, inside):
    """A target that is itself a symlink is refused, wherever it points."""
    root.mkdir()
    pointee = (root if inside else root.parent) / "pointee.txt"
    pointee.write_text("secret")
    (root / "t.txt").symlink_to(pointee)
    message = failure(tools, ctx, name, path="t.txt", contents="x")
    assert message == "path 't.txt' escapes the sandbox"
    assert pointee.read_text() == "secret"


def test_temporary_symlink_is_not_followed(tools, ctx, root, tmp_path):
    """A symlink planted at `<path>.agenttx-tmp` is neither written through nor removed."""
    root.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("safe")
    (root / "a.txt.agenttx-tmp").symlink_to(victim)
    call(tools, ctx, "fs.write", path="a.txt", contents="x")
    assert victim.read_text() == "safe"
    assert (root / "a.txt").read_text() == "x"
    assert (root / "a.txt.agenttx-tmp").is_symlink()


@pytest.mark.parametrize("name", ["fs.write", "fs.read"])
def test_fs_path_argument_checks(tools, ctx, name):
    """`path` is a required string."""
    assert failure(tools, ctx, name, contents="x") == "missing field `path`"
    assert (
        failure(tools, ctx, name, path=["a"], contents="x")
        == "invalid type: array for field `path`, expected a string"
    )


def test_fs_write_contents_argument_checks(tools, ctx, root):
    """`contents` is a required string; a lone surrogate cannot be written as UTF-8."""
    assert failure(tools, ctx, "fs.write", path="a") == "missing field `contents`"
    assert (
        failure(tools, ctx, "fs.write", path="a", contents=3)
        == "invalid type: number for field `contents`, expected a string"
    )
    assert failure(tools, ctx, "fs.write", path="a", contents="ok\ud800") == (
        "invalid value: lone surrogate at index 2 for field `contents`, expected UTF-8 text"
    )
    assert not root.exists()


@pytest.mark.parametrize("name", ["fs.write", "fs.read"])
def test_nul_byte_in_path(tools, ctx, name):
    """A NUL byte fails the step with an I/O-style message, not with a Python ValueError."""
    assert (
        failure(tools, ctx, name, path="a\0b", contents="x")
        == "file name contained an unexpected NUL byte: 'a\0b'"
    )


# ---------------------------------------------------------------------- fs.restore_file


def run_undo(ctx: ToolContext) -> None:
    for undo in reversed(undos_of(ctx)):
        agenttx.builtins.restore_file(undo.payload)


def test_restore_file_puts_prior_bytes_back(tools, ctx, root):
    """Undoing an overwrite restores the prior bytes exactly."""
    root.mkdir()
    (root / "a.bin").write_bytes(b"\x00old\xff")
    call(tools, ctx, "fs.write", path="a.bin", contents="new")
    run_undo(ctx)
    assert (root / "a.bin").read_bytes() == b"\x00old\xff"
    assert sorted(p.name for p in root.iterdir()) == ["a.bin"]


def test_restore_file_deletes_a_new_file(tools, ctx, root):
    """Undoing the creation of a file deletes it (the created directory stays)."""
    call(tools, ctx, "fs.write", path="d/new.txt", contents="x")
    run_undo(ctx)
    assert not (root / "d" / "new.txt").exists()
    assert (root / "d").is_dir()


def test_restore_file_undoes_several_writes_newest_first(tools, ctx, root):
    """Two writes to one file, undone newest first, leave the original."""
    root.mkdir()
    (root / "a").write_text("v0")
    call(tools, ctx, "fs.write", path="a", contents="v1")
    call(tools, ctx, "fs.write", path="a", contents="v2")
    run_undo(ctx)
    assert (root / "a").read_text() == "v0"


@pytest.mark.parametrize("prior", [None, b"old"])
def test_restore_file_is_idempotent(tmp_path, prior):
    """Running the same undo twice gives the same result, and a missing file is fine."""
    path = tmp_path / "f"
    path.write_text("new")
    payload = {"path": str(path), "prior_hex": None if prior is None else prior.hex()}
    agenttx.builtins.restore_file(payload)
    agenttx.builtins.restore_file(payload)
    if prior is None:
        assert not path.exists()
    else:
        assert path.read_bytes() == prior


def test_restore_file_recreates_a_missing_parent(tmp_path):
    """Restoring prior bytes recreates a parent directory removed meanwhile."""
    path = tmp_path / "gone" / "f"
    agenttx.builtins.restore_file({"path": str(path), "prior_hex": "4142"})
    assert path.read_bytes() == b"AB"


def test_restore_file_accepts_uppercase_hex(tmp_path):
    """Hex digits are case-insensitive."""
    path = tmp_path / "f"
    agenttx.builtins.restore_file({"path": str(path), "prior_hex": "ABff"})
    assert path.read_bytes() == b"\xab\xff"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({}, "payload missing `path`"),
        (None, "payload missing `path`"),
        ("f", "payload missing `path`"),
        ({"path": 3}, "payload missing `path`"),
        ({"path": ""}, "payload missing `path`"),
        ({"path": "/tmp/x", "prior_hex": "abc"}, "bad hex"),
        ({"path": "/tmp/x", "prior_hex": "zz"}, "bad hex"),
        ({"path": "/tmp/x", "prior_hex": "ab c"}, "bad hex"),
        ({"path": "/tmp/x", "prior_hex": 5}, "`prior_hex` must be a string or null"),
        ({"path": "/tmp/x", "prior_hex": ["ab"]}, "`prior_hex` must be a string or null"),
    ],
)
def test_restore_file_rejects_bad_payloads(payload, message):
    """A bad payload raises ValueError (InvalidArgument) with the documented message."""
    with pytest.raises(InvalidArgument) as info:
        agenttx.builtins.restore_file(payload)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == message


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX symlinks and permission bits")
def test_restore_file_replaces_a_symlink_without_following_it(tmp_path):
    """Restoring over a symlink replaces the link itself, with a default mode file."""
    victim = tmp_path / "victim"
    victim.write_text("safe")
    path = tmp_path / "f"
    path.symlink_to(victim)
    agenttx.builtins.restore_file({"path": str(path), "prior_hex": b"old".hex()})
    assert victim.read_text() == "safe"
    assert not path.is_symlink()
    assert path.read_bytes() == b"old"
    assert stat.S_IMODE(path.stat().st_mode) != 0o777


# ---------------------------------------------------------------------- Clean Hints

HINTS = [
    (
        "kv.get",
        {"key": "a"},
        "Hint: No kv with key=a exists. Create it in an earlier step or use an existing key.",
        "key",
    ),
    (
        "kv.put",
        {"key": 5},
        "Hint: Wrong argument type: got number for field `key`, expected a string.",
        "key",  # the field the value is for (type_mismatch names it)
    ),
    (
        "kv.put",
        {},
        "Hint: Required field 'key' is missing from the arguments. Provide 'key' explicitly.",
        "key",
    ),
    (
        "record.get",
        {"table": "users", "id": 7},
        "Hint: No user with id=7 exists. Create it in an earlier step or use an existing id.",
        "id",
    ),
    (
        "record.insert",
        {"table": "orders", "id": 1, "fields": {"user_id": 42}, "references": {"user_id": "users"}},
        (
            "Hint: Foreign key constraint failed for 'user_id'. "
            "Ensure target user exists before step execution."
        ),
        "user_id",
    ),
    (
        "record.insert",
        {"table": "orders", "id": 1, "references": {"user_id": "users"}},
        "Hint: Column 'user_id' must not be null. Provide a value for 'user_id'.",
        "user_id",
    ),
    (
        "record.insert",
        {"table": "t", "id": 1, "fields": [1]},
        "Hint: Wrong argument type: got array for field `fields`, expected an object.",
        "fields",  # the field the value is for (type_mismatch names it)
    ),
    (
        "record.insert",
        {"table": "t", "id": ""},
        "Hint: Wrong argument type: got string for field `id`, expected a string or number.",
        "id",  # the field the value is for (type_mismatch names it)
    ),
    (
        "fs.read",
        {"path": "nope.txt"},
        "Hint: File 'nope.txt' does not exist. Create it in an earlier step or correct the path.",
        None,
    ),
    (
        "fs.write",
        {"path": "../x", "contents": ""},
        "Hint: Path '../x' is outside the sandbox. Use a relative path without '..'.",
        None,
    ),
    (
        "fs.read",
        {"path": ""},
        "Hint: Path 'unknown' is outside the sandbox. Use a relative path without '..'.",
        None,
    ),
    (
        "effect.stage",
        {"channel": "c", "idempotency_key": 1},
        "Hint: Wrong argument type: got number for field `idempotency_key`, expected a string.",
        "idempotency_key",  # the field the value is for (type_mismatch names it)
    ),
    (
        "effect.stage",
        {"channel": "e-mail"},
        (
            'Hint: Step failed with "invalid channel `e-mail`: expected 1-128 chars of '
            '[A-Za-z0-9_]". Change the arguments so this error cannot recur.'
        ),
        None,
    ),
]


@pytest.mark.parametrize("case", HINTS, ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(HINTS)])
def test_messages_give_the_reference_hints(tools, ctx, case):
    """Each failure's message cleans into the documented hint (and key)."""
    name, arguments, hint, key = case
    cleaned = agenttx.clean_error(failure(tools, ctx, name, **arguments))
    assert (cleaned.text, cleaned.key) == (hint, key)


@pytest.mark.parametrize("case", HINTS, ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(HINTS)])
def test_hints_through_a_transaction_are_the_reference_hints(root, case):
    """Through a transaction (the spec's validator first), each case gives the same hint text."""
    name, arguments, hint, _ = case
    tx = agenttx.Transaction(tools=agenttx.builtins.tools(root))
    result = tx.execute_step(1, name, arguments)
    assert result.hint is not None
    assert result.hint.text == hint


@pytest.mark.parametrize("name", ["kv.put", "kv.get", "kv.delete"])
def test_null_key_through_a_transaction_is_missing(root, name):
    """A null required argument is reported missing, as the tools themselves say."""
    tx = agenttx.Transaction(tools=agenttx.builtins.tools(root))
    assert tx.execute_step(1, name, {"key": None}).error == "missing field `key`"


def test_builtins_have_explicit_specs_and_wire_names(root):
    """Each built-in has a description, an object schema of its arguments, and a wire name."""
    specs = {
        spec.name: spec
        for spec in agenttx.Transaction(tools=agenttx.builtins.tools(root)).tool_specs
    }
    assert list(specs) == TOOL_NAMES
    assert {spec.wire_name for spec in specs.values()} == {n.replace(".", "_") for n in TOOL_NAMES}
    for spec in specs.values():
        assert spec.description
        assert spec.parameters["type"] == "object"
        assert "additionalProperties" not in spec.parameters  # unknown arguments are ignored
    assert specs["record.insert"].parameters["required"] == ["table", "id"]
    assert set(specs["fs.write"].parameters["properties"]) == {"path", "contents"}
    assert specs["effect.stage"].parameters["required"] == ["channel"]


def test_builtins_answer_to_wire_names_and_ignore_nulls_for_optionals(root):
    """`kv_put` reaches `kv.put`; a null optional argument is absent, as the tools treat it."""
    tx = agenttx.Transaction(tools=agenttx.builtins.tools(root))
    assert tx.execute_step(1, "kv_put", {"key": "a", "value": 1}).output == {"key": "a", "value": 1}
    staged = tx.execute_step(2, "effect_stage", {"channel": "mail", "idempotency_key": None})
    assert staged.ok
    inserted = tx.execute_step(3, "record.insert", {"table": "t", "id": 1, "fields": None})
    assert inserted.output == {"id": 1, "table": "t"}


def test_duplicate_key_gives_the_unique_hint(tools, ctx):
    """The primary-key message cleans into the unique-violation hint keyed on `id`."""
    call(tools, ctx, "record.insert", table="users", id=101)
    cleaned = agenttx.clean_error(failure(tools, ctx, "record.insert", table="users", id=101))
    assert cleaned.text == (
        "Hint: Unique constraint violated for 'id' (value '101' already exists). "
        "Use a new value or update the existing row."
    )
    assert cleaned.key == "id"


def test_permission_denied_gives_the_permission_hint(tools, ctx, root, monkeypatch):
    """An unreadable file's I/O error cleans into the permission hint with its path."""
    root.mkdir()
    (root / "secret").write_text("x")

    def refuse(path, flags, *args):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(_fs.os, "open", refuse)
    message = failure(tools, ctx, "fs.read", path="secret")
    assert message == f"{os.strerror(errno.EACCES)}: 'secret'"
    assert agenttx.clean_error(message).text == (
        "Hint: Permission denied for 'secret'. Use a path inside the writable sandbox."
    )


# ---------------------------------------------------------------------- in a transaction


def test_rollback_through_a_transaction_restores_files_and_state(root):
    """In a transaction, rolling back undoes `fs.write` (via the compensation) and `kv.put`."""
    root.mkdir()
    (root / "old.txt").write_text("v0")
    tx = agenttx.Transaction(tools=agenttx.builtins.tools(root))
    assert tx.execute_step(1, "fs.write", {"path": "old.txt", "contents": "v1"}).output == {
        "path": "old.txt",
        "bytes": 2,
    }
    tx.execute_step(2, "fs.write", {"path": "new/n.txt", "contents": "n"})
    tx.execute_step(3, "kv.put", {"key": "k", "value": "${steps.2.path}"})
    assert tx.read("kv/k") == "new/n.txt"
    result = tx.rollback(1)
    assert (result.compensations_run, result.compensation_errors) == (2, ())
    assert (root / "old.txt").read_text() == "v0"
    assert not (root / "new" / "n.txt").exists()
    assert tx.read("kv/k") is None


def test_failed_builtin_step_reports_its_message_and_hint(root):
    """A built-in's failure reaches the step result verbatim, with its Clean Hint."""
    tx = agenttx.Transaction(tools=agenttx.builtins.tools(root))
    result = tx.execute_step(1, "record.get", {"table": "users", "id": 7})
    assert result.error == 'no row with id=7 in table "users"'
    assert result.hint is not None
    assert result.hint.text == (
        "Hint: No user with id=7 exists. Create it in an earlier step or use an existing id."
    )
