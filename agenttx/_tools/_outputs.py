"""Tool outputs developers actually return, converted to JSON (docs/protocol.md#outputs).

`to_json_value` is the default output serializer: a step runs it only when the tool's output
fails the JSON check, so an output that already is JSON costs nothing more. No third-party
package is imported: a pydantic model is recognised by its `model_dump` method.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import attrs

from .._json import MAX_NESTING_DEPTH

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["OutputSerializer", "to_json_value"]

#: Turns a tool's output that is not JSON into one that is: `to_json_value`, or your own.
OutputSerializer: TypeAlias = "Callable[[Any], object]"

_SCALARS: Final = (str, int, float, bool, type(None))


def to_json_value(value: object) -> object:
    """`value` with the common Python types converted to JSON types, recursively.

    | Python value | JSON value |
    |---|---|
    | pydantic model (anything with `model_dump`) | `model_dump(mode="json")`, converted again |
    | dataclass instance, attrs instance | an object of its fields, in declaration order |
    | `datetime`, `date`, `time` | ISO 8601 text (`isoformat()`; the offset kept if aware) |
    | `UUID` | its canonical text |
    | `Decimal` | its exact text (`str`, e.g. `"19.90"`), never a lossy float |
    | `Enum` member | its value, converted |
    | tuple, list | an array |
    | set, frozenset | an array, sorted when its converted items are sortable, for determinism |
    | dict, other `Mapping` | an object; `str`, `UUID` and str-valued `Enum` keys become text |

    Anything else (bytes, a custom class, a non-string key, NaN, a cycle, nesting deeper than
    `MAX_NESTING_DEPTH`) is left as it is, for the JSON check that follows to name. Deterministic
    for deterministic input; never mutates `value`. Exceptions raised by a model's
    `model_dump` or a field's property propagate.
    """
    return _convert(value, 0, set())


def _convert(value: object, depth: int, active: set[int]) -> object:  # noqa: PLR0911
    if type(value) in _SCALARS:
        return value
    if depth > MAX_NESTING_DEPTH:
        return value  # the check names the depth
    if isinstance(value, enum.Enum):
        return _convert(value.value, depth, active)
    if isinstance(value, _SCALARS):  # a str or int subclass that is not an Enum
        return value
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    marker = id(value)
    if marker in active:
        return value  # a cycle: the check says the container contains itself
    active.add(marker)
    try:
        return _convert_container(value, depth, active)
    finally:
        active.discard(marker)


def _convert_container(value: object, depth: int, active: set[int]) -> object:  # noqa: PLR0911
    inner = depth + 1
    if isinstance(value, list | tuple):
        return [_convert(item, inner, active) for item in value]
    if isinstance(value, Mapping):
        return {_key(key): _convert(item, inner, active) for key, item in value.items()}
    if isinstance(value, set | frozenset):
        items = [_convert(item, inner, active) for item in value]
        try:
            return sorted(items)  # type: ignore[type-var]  # TypeError when not sortable
        except TypeError:
            return items
    kind = type(value)
    dump = getattr(kind, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return _convert(value.model_dump(mode="json"), inner, active)  # type: ignore[attr-defined]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return {f.name: _convert(getattr(value, f.name), inner, active) for f in fields}
    if attrs.has(kind):
        fields = attrs.fields(kind)
        return {f.name: _convert(getattr(value, f.name), inner, active) for f in fields}
    return value


def _key(key: object) -> object:
    """A mapping key as text where that is unambiguous; other keys are left for the check."""
    if isinstance(key, enum.Enum) and isinstance(key.value, str):
        return key.value
    if isinstance(key, uuid.UUID):
        return str(key)
    return key
