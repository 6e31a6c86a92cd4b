"""JSON Schemas from Python annotations (the table is in `docs/protocol.md#tool-specs`).

`schema_for(annotation)` maps an annotation to a JSON Schema; `parameters_schema(signature)`
builds a tool's `parameters` object. `_schema` compiles either (or a schema supplied with
`parameters=`) into a `Validator`.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from .._json import JSONValue, check_json, json_kind
from ._signature import UNRESOLVED, Signature, newtype_name, typed_dict_fields

__all__ = ["parameters_schema", "schema_for"]

_NONE_TYPE: Final = type(None)


# ---------------------------------------------------------------------- annotations -> schema


def schema_for(annotation: object) -> dict[str, JSONValue]:
    """The JSON Schema of values of `annotation`; `{}` (anything) for what it cannot map.

    Never raises: an annotation object that fails when compared or inspected maps to `{}`.
    """
    try:
        return _schema(annotation, ())
    except Exception:  # noqa: BLE001  (a hostile annotation object: any value)
        return {}


def parameters_schema(signature: Signature) -> dict[str, JSONValue]:
    """A tool's `parameters`: an object schema of its keyword parameters.

    Each property has its annotation's schema, the docstring's description (an `Annotated`
    description wins), and `default` when the default is a JSON value. `additionalProperties`
    is false unless the function takes `**kwargs`.
    """
    properties: dict[str, JSONValue] = {}
    required: list[JSONValue] = []
    for parameter in signature.parameters:
        schema = schema_for(parameter.annotation)
        if parameter.description and "description" not in schema:
            schema = {**schema, "description": parameter.description}
        if not parameter.required:
            default = _json_or_absent(parameter.default)
            if default is not _ABSENT:
                schema = {**schema, "default": typing.cast("JSONValue", default)}
        else:
            required.append(parameter.name)
        properties[parameter.name] = schema
    result: dict[str, JSONValue] = {"type": "object", "properties": properties}
    if required:
        result["required"] = required
    if signature.extra_keywords:
        extra = schema_for(signature.extra_annotation)
        if extra:  # `**kwargs: int`; any value needs no keyword
            result["additionalProperties"] = extra
    else:
        result["additionalProperties"] = False
    return result


_ABSENT: Final = object()


def _json_or_absent(value: object) -> object:
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        return check_json(value)
    except Exception:  # noqa: BLE001  (a default that is no JSON value is not shown)
        return _ABSENT


_SCALARS: Final[Mapping[object, str]] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    None: "null",
    _NONE_TYPE: "null",
}
_ARRAYS: Final = (list, set, frozenset, Sequence, typing.Sequence)
_OBJECTS: Final = (dict, Mapping, typing.Mapping)


def _schema(annotation: object, active: tuple[object, ...]) -> dict[str, JSONValue]:  # noqa: PLR0911
    """`schema_for`; `active` holds the TypedDicts being expanded (a recursive one stops)."""
    if annotation is UNRESOLVED or annotation is Any or annotation is object:
        return {}
    simple = _SCALARS.get(annotation) if _hashable(annotation) else None
    if simple is not None:
        return {"type": simple}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        schema = _schema(args[0], active)
        text = next((m for m in args[1:] if isinstance(m, str)), None)
        return schema if text is None else {**schema, "description": text}
    if origin is Literal:
        return _enum_schema(list(args))
    if origin is typing.Union or origin is types.UnionType:
        return _union([_schema(arg, active) for arg in args])
    semantic = newtype_name(annotation)
    if semantic is not None:
        base = _schema(getattr(annotation, "__supertype__", None), active)
        return {**base, "x-semantic-type": semantic}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        schema = _enum_schema([member.value for member in annotation])
        return {**schema, "title": annotation.__name__}
    fields = typed_dict_fields(annotation)
    if fields is not None:
        if annotation in active:
            return {"type": "object"}
        properties = {f.name: _schema(f.annotation, (*active, annotation)) for f in fields}
        record: dict[str, JSONValue] = {"type": "object", "properties": dict(properties)}
        required: list[JSONValue] = [f.name for f in fields if f.required]
        if required:
            record["required"] = required
        record["additionalProperties"] = False
        return record
    if annotation is tuple or origin is tuple:
        return _tuple(args, active)
    if annotation in _ARRAYS or origin in _ARRAYS:
        return (
            {"type": "array"} if not args else {"type": "array", "items": _schema(args[0], active)}
        )
    if annotation in _OBJECTS or origin in _OBJECTS:
        if len(args) == 2:
            return {"type": "object", "additionalProperties": _schema(args[1], active)}
        return {"type": "object"}
    return {}


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _tuple(args: tuple[object, ...], active: tuple[object, ...]) -> dict[str, JSONValue]:
    if not args:
        return {"type": "array"}
    if len(args) == 2 and args[1] is Ellipsis:
        return {"type": "array", "items": _schema(args[0], active)}
    if args == ((),):  # tuple[()]
        return {"type": "array", "maxItems": 0}
    prefix: list[JSONValue] = [_schema(arg, active) for arg in args]
    return {
        "type": "array",
        "prefixItems": prefix,
        "items": False,
        "minItems": len(prefix),
        "maxItems": len(prefix),
    }


def _enum_schema(values: list[object]) -> dict[str, JSONValue]:
    checked: list[JSONValue] = []
    for value in values:
        item = _json_or_absent(value)
        if item is not _ABSENT:
            checked.append(item)  # type: ignore[arg-type]  # _json_or_absent checked it
    kinds = {_TYPE_OF[json_kind(v)] if not _is_integer(v) else "integer" for v in checked}
    schema: dict[str, JSONValue] = {"enum": checked}
    if len(kinds) == 1:
        return {"type": kinds.pop(), **schema}
    return schema


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: object) -> int | None:
    """A schema's count keyword (`minItems`...): a non-negative integer, or None (ignored)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _union(schemas: list[dict[str, JSONValue]]) -> dict[str, JSONValue]:
    """`anyOf` of the members, or a `type` list when every member is a bare type."""
    if any(schema == {} for schema in schemas):
        return {}
    if all(list(schema) == ["type"] and isinstance(schema["type"], str) for schema in schemas):
        kinds: list[JSONValue] = list(dict.fromkeys(schema["type"] for schema in schemas))
        return {"type": kinds[0]} if len(kinds) == 1 else {"type": kinds}
    return {"anyOf": list(schemas)}


_TYPE_OF: Final = {
    "null": "null",
    "boolean": "boolean",
    "number": "number",
    "string": "string",
    "array": "array",
    "object": "object",
}
