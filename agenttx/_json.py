"""JSON values: validation, canonical text, scalar leaves and strict equality.

Everything that crosses a step boundary (arguments, outputs, staged payloads) is a JSON value:
`None`, `bool`, `int`, `float` (finite), `str`, `list` and `dict` with `str` keys. `check_json`
enforces that once, at the boundary; everything downstream may then trust the shape.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

from ._errors import JSONValueError

__all__ = [
    "MAX_NESTING_DEPTH",
    "JSONScalar",
    "JSONValue",
    "ValueTag",
    "canonical_dumps",
    "check_json",
    "checked_size_bound",
    "compact_encoder",
    "json_kind",
    "scalar_leaves",
    "value_tag",
]

JSONScalar: TypeAlias = bool | int | float | str | None
JSONValue: TypeAlias = JSONScalar | list["JSONValue"] | dict[str, "JSONValue"]

#: A value tagged with its JSON kind, hashable, for strict equality: `7`, `7.0`, `"7"` and `True`
#: all differ, as they do in serde_json (the reference). `0.0` and `-0.0` are equal in both.
ValueTag: TypeAlias = tuple[str, JSONScalar]

#: Containers may nest at most this deep: `[[1]]` has depth 2. Deeper values are refused with a
#: `JSONValueError`, so no walker in agenttx can exhaust the interpreter's recursion limit.
MAX_NESTING_DEPTH: Final = 64


class _Invalid(Exception):
    def __init__(self, problem: str) -> None:
        self.problem = problem
        self.parts: list[str] = []


def check_json(value: object, *, what: str = "value") -> JSONValue:
    """Return `value` unchanged if it is a JSON value, else raise `JSONValueError`.

    The error's `path` points at the first offending part (depth-first, in key order as given),
    and its `problem` names it: the Python type, a non-finite float, a non-string key, a
    container that contains itself, or nesting deeper than `MAX_NESTING_DEPTH`. `what` names the
    value in the message (for example "output of step 3").
    """
    checked_size_bound(value, what=what)
    return value  # type: ignore[return-value]  # just checked


def checked_size_bound(value: object, *, what: str = "value") -> int:
    """`check_json`, returning an upper bound of the value's canonical JSON size in bytes.

    Strings count 6 bytes a character (the longest escape, `\\u001f`), integers a digit per 3
    bits, other scalars their longest form. The bound comes free with the check, so callers that
    enforce a size limit only serialize the rare value whose bound exceeds it.
    """
    if type(value) is str:  # the common scalars, without a call or a set
        return 6 * len(value) + 2
    if type(value) is int:
        return value.bit_length() // 3 + 2
    if value is None or type(value) is bool:
        return 5
    try:
        return _check(value, 0, set())
    except _Invalid as exc:
        path = "$" + "".join(reversed(exc.parts))
        raise JSONValueError(path=path, problem=exc.problem, what=what) from None


def _check(value: object, depth: int, active: set[int]) -> int:
    if type(value) is dict or type(value) is list:
        return _check_container(value, depth, active)
    if isinstance(value, str):
        return 6 * len(value) + 2
    if value is None or isinstance(value, bool):
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Invalid(f"{value!r} is not a finite number")
        return 32
    if not isinstance(value, (dict, list)):
        raise _Invalid(f"{type(value).__name__} is not a JSON type")
    return _check_container(value, depth, active)


def _check_container(value: dict[Any, Any] | list[Any], depth: int, active: set[int]) -> int:
    if depth >= MAX_NESTING_DEPTH:
        raise _Invalid(f"nested deeper than {MAX_NESTING_DEPTH} levels")
    marker = id(value)
    if marker in active:
        raise _Invalid("the container contains itself")
    active.add(marker)
    size = 2
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Invalid(f"object key {key!r} is a {type(key).__name__}, not a string")
            size += 6 * len(key) + 4
            kind = type(item)  # the common scalars inline: no call
            if kind is str:
                size += 6 * len(item) + 2
                continue
            if kind is int:
                size += item.bit_length() // 3 + 2
                continue
            if item is None or kind is bool:
                size += 5
                continue
            try:
                size += _check(item, depth + 1, active)
            except _Invalid as exc:
                exc.parts.append(_key_part(key))
                raise
    else:
        for index, item in enumerate(value):
            try:
                size += _check(item, depth + 1, active) + 1
            except _Invalid as exc:
                exc.parts.append(f"[{index}]")
                raise
    active.discard(marker)
    return size


def _key_part(key: str) -> str:
    if key.isidentifier():
        return f".{key}"
    return f"[{json.dumps(key, ensure_ascii=False)}]"


_encode_str: Final[Callable[[str], str]] = (
    getattr(json.encoder, "c_encode_basestring", None) or json.encoder.py_encode_basestring
)


def _not_json(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def compact_encoder(*, sort_keys: bool) -> Callable[[JSONValue], str]:
    """A function writing compact JSON with raw UTF-8: exactly
    `json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)`.

    Where CPython has its C encoder, the function calls it directly: `JSONEncoder.encode`
    builds a new one on every call, which costs about as much as encoding a small value.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has the C encoder
        return json.JSONEncoder(
            separators=(",", ":"), sort_keys=sort_keys, ensure_ascii=False
        ).encode
    # markers=None: the callers pass checked values, which contain no cycles.
    encode = make(None, _not_json, _encode_str, None, ":", ",", sort_keys, False, True)

    def dumps(value: JSONValue) -> str:
        return "".join(encode(value, 0))

    return dumps


_encode_sorted: Final = compact_encoder(sort_keys=True)


def canonical_dumps(value: JSONValue) -> str:
    """Compact JSON with sorted keys and raw UTF-8, as the reference writes outputs.

    Floats are written as Python writes them (`1e+20`), where Rust writes `1e20`. Exactly
    `json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)`, with the
    common scalars written directly and containers by `compact_encoder`.
    """
    if type(value) is str:
        return _encode_str(value)
    if type(value) is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    if type(value) is bool:
        return "true" if value else "false"
    return _encode_sorted(value)


def scalar_leaves(value: JSONValue, key: str = "") -> list[tuple[str, JSONScalar]]:
    """Flatten `value` into `(leaf key, scalar)` pairs, depth first, object keys sorted.

    Only a leaf's own key survives: `{"a": {"user_id": 1}}` gives `[("user_id", 1)]`. Array
    elements inherit the key that holds the array; a top-level scalar gets the key `""`. Empty
    containers give nothing.
    """
    leaves: list[tuple[str, JSONScalar]] = []
    _collect_leaves(value, key, leaves)
    return leaves


def _collect_leaves(value: JSONValue, key: str, leaves: list[tuple[str, JSONScalar]]) -> None:
    if isinstance(value, dict):
        for child_key in sorted(value):
            _collect_leaves(value[child_key], child_key, leaves)
    elif isinstance(value, list):
        for item in value:
            _collect_leaves(item, key, leaves)
    else:
        leaves.append((key, value))


_KINDS: Final[dict[type, str]] = {str: "s", bool: "b", int: "i", float: "f", type(None): "n"}


# bool before int: `True` is an int to Python but a boolean to JSON.
_JSON_KINDS: Final[tuple[tuple[type | tuple[type, ...], str], ...]] = (
    (type(None), "null"),
    (bool, "boolean"),
    ((int, float), "number"),
    (str, "string"),
    ((list, tuple), "array"),
    (Mapping, "object"),
)


def json_kind(value: object) -> str:
    """The JSON kind of `value` as serde names it: null, boolean, number, string, array, object.

    Anything else is named by its Python type, for messages about values that are not JSON.
    """
    for kinds, name in _JSON_KINDS:
        if isinstance(value, kinds):
            return name
    return type(value).__name__


def value_tag(value: JSONScalar) -> ValueTag:
    """The strict-equality key of a scalar: its JSON kind plus its value."""
    kind = _KINDS.get(type(value))
    if kind is None:  # a subclass, such as an enum.StrEnum member: tag it as its JSON kind
        kind = next(k for t, k in _KINDS.items() if isinstance(value, t))
    return (kind, value)
