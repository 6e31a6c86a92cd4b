"""The `record.*` built-in tools: rows in tables under state keys `records/{table}/{id}`.

`record.insert` checks a primary key and foreign keys and fails with Postgres-style messages,
so the Clean Hint cleaner produces the same unique, not-null and foreign-key hints it produces
for a real database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import ToolError
from .._tools import Tool, ToolContext, tool
from ._args import id_text, identifier, json_type, required_str, value_text
from ._specs import DESCRIPTIONS, PARAMETERS

if TYPE_CHECKING:
    from .._json import JSONValue

__all__ = ["RECORD_TOOLS", "record_get", "record_insert"]


def _state_key(table: str, row_id: str) -> str:
    return f"records/{table}/{row_id}"


@tool(
    name="record.insert",
    description=DESCRIPTIONS["record.insert"],
    parameters=PARAMETERS["record.insert"],
    inline=True,
)
def record_insert(ctx: ToolContext, /, **arguments: JSONValue) -> JSONValue:
    """Insert a row into `table` with primary key `id`; output the row plus `"table"`.

    Arguments: `table` (identifier), `id` (non-empty string or number; stored keyed by its
    text, `101` and `"101"` are the same key), `fields` (object, default `{}`), `references`
    (object `{field: referenced_table}`; any other value is ignored).

    In order: the primary key must be free; then, for each reference in sorted field order,
    the referenced table must be a string identifier, `fields[field]` must be present and not
    null, and the row `records/{referenced_table}/{value}` must exist, where `value` is the
    field's string, or the JSON text of any other value. The stored row is `fields` plus
    `"id"` (the original id value, overwriting any `id` field). Nothing is written on failure.
    """
    table = identifier(required_str(arguments, "table"), "table")
    row_id = id_text(arguments, "id")
    fields = arguments.get("fields")
    if fields is None:
        fields = {}
    elif not isinstance(fields, dict):
        raise ToolError(f"invalid type: {json_type(fields)} for field `fields`, expected an object")
    references = arguments.get("references")

    key = _state_key(table, row_id)
    if key in ctx.state:
        raise ToolError(
            f'ERROR: duplicate key value violates unique constraint "{table}_pkey"\n'
            f"DETAIL: Key (id)=({row_id}) already exists."
        )
    if isinstance(references, dict):
        for field in sorted(references):
            ref_table = references[field]
            if not isinstance(ref_table, str):
                raise ToolError(
                    f"invalid type: {json_type(ref_table)} for references.{field}, "
                    "expected a string"
                )
            identifier(ref_table, "referenced table")
            value = fields.get(field)
            if value is None:
                raise ToolError(
                    f'ERROR: null value in column "{field}" of relation "{table}" '
                    "violates not-null constraint"
                )
            ref_id = value_text(value)
            if _state_key(ref_table, ref_id) not in ctx.state:
                raise ToolError(
                    f'ERROR: insert or update on table "{table}" violates foreign key '
                    f'constraint "{table}_{field}_fkey"\n'
                    f'DETAIL: Key ({field})=({ref_id}) is not present in table "{ref_table}".'
                )

    row: dict[str, JSONValue] = {**fields, "id": arguments["id"]}
    ctx.state.put(key, row)
    return {**row, "table": table}


@tool(
    name="record.get",
    description=DESCRIPTIONS["record.get"],
    parameters=PARAMETERS["record.get"],
    inline=True,
)
def record_get(ctx: ToolContext, /, **arguments: JSONValue) -> JSONValue:
    """The row stored under `table` (identifier) and `id` (string or number), as inserted.

    A missing row fails with ``no row with id={id} in table "{table}"``, which gives the
    record_not_found hint with key `id`.
    """
    table = identifier(required_str(arguments, "table"), "table")
    row_id = id_text(arguments, "id")
    key = _state_key(table, row_id)
    if key not in ctx.state:
        raise ToolError(f'no row with id={row_id} in table "{table}"')
    return ctx.state.get(key)


RECORD_TOOLS: tuple[Tool[..., JSONValue], ...] = (record_insert, record_get)
