"""JSON values: validation, canonical text, scalar leaves and strict equality.

Everything that crosses a step boundary (arguments, outputs, staged payloads) is a JSON value:
`None`, `bool`, `int` (at most `MAX_INT_DIGITS` digits), `float` (finite), `str` (valid Unicode),
`list` and `dict` with `str` keys. `check_json` enforces that once, at the boundary, with one rule
for every store: a value it accepts can be written as canonical JSON, encoded as UTF-8 and read
back equal. Everything downstream may then trust the shape.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

from ._errors import JSONValueError

__all__ = [
    "MAX_INT_DIGITS",
    "MAX_NESTING_DEPTH",
    "JSONScalar",
    "JSONValue",
    "ValueTag",
    "canonical_dumps",
    "check_json",
    "check_json_sized",
    "checked_size_bound",
    "compact_encoder",
    "json_kind",
    "scalar_leaves",
    "value_tag",
]

JSONScalar: TypeAlias = bool | int | float | str | None
JSONValue: TypeAlias = JSONScalar | list["JSONValue"] | dict[str, "JSONValue"]

#: A value tagged with its JSON kind, hashable, for strict equality: `7`, `7.0`, `"7"` and `True`
#: all differ (strict JSON equality, as serde_json compares). `0.0` and `-0.0` are equal.
ValueTag: TypeAlias = tuple[str, JSONScalar]

#: Containers may nest at most this deep: `[[1]]` has depth 2. Deeper values are refused with a
#: `JSONValueError`, so no walker in agenttx can exhaust the interpreter's recursion limit.
MAX_NESTING_DEPTH: Final = 64

#: Integers may have at most this many decimal digits (`abs(n) < 10**4300`): CPython's default
#: limit on converting between `int` and `str`, past which `str(n)`, `json.dumps` and
#: `json.loads` raise `ValueError`. An interpreter whose limit was lowered with
#: `sys.set_int_max_str_digits` lowers this bound to match, so that what is accepted can always
#: be written and read back.
MAX_INT_DIGITS: Final = 4300

# Below 2**2126 an integer has at most 640 digits, the lowest limit an interpreter accepts: such
# integers (all but the rarest) need no further check.
_SAFE_INT_BITS: Final = 2126


_KEY_TYPE: Final = "object key {} is a {}, not a string"


class _Invalid(Exception):
    def __init__(self, problem: str) -> None:
        self.problem = problem
        self.parts: list[str] = []


class _NotPlain(Exception):
    """The value holds an instance of a subclass of a JSON type: check a plain copy instead."""


def check_json(value: object, *, what: str = "value") -> JSONValue:
    """Return `value` as a JSON value, else raise `JSONValueError`.

    A value made of the plain JSON types (exactly `dict`, `list`, `str`, `int`, `float`, `bool`,
    `None`) is returned as it is, the same object. A value holding an instance of a subclass of
    those types (an `OrderedDict`, an `IntEnum` member) is returned as a copy made of the plain
    types, read once as `json.dumps` reads it (a `dict` subclass through its `items()`), so that
    no code of the subclass runs after the check and every store keeps the same value.

    The error's `path` points at the first offending part (depth-first, in key order as given),
    and its `problem` names it: the Python type, a non-finite float, an integer of more than
    `MAX_INT_DIGITS` digits, a string or object key holding a surrogate (which UTF-8 cannot
    encode), a non-string key, a container that contains itself, one whose `items()` raised, or
    nesting deeper than `MAX_NESTING_DEPTH`. `what` names the value in the message (for example
    "output of step 3"). Nothing else is raised.
    """
    if type(value) is str:  # the common scalars, without a call or a set
        if value.isascii():
            return value
    elif type(value) is int:
        if value.bit_length() <= _SAFE_INT_BITS:
            return value
    elif value is None or type(value) is bool:
        return value
    try:
        _check(value, 0, set())
    except _NotPlain:
        return _check_plain(value, what)[0]
    except _Invalid as exc:
        raise _error(exc, what) from None
    return value  # type: ignore[return-value]  # just checked


def checked_size_bound(value: object, *, what: str = "value") -> int:
    """`check_json`, returning an upper bound of the value's canonical JSON size in bytes.

    Strings count 6 bytes a character (the longest escape, `\\u001f`), integers a digit per 3
    bits, other scalars their longest form. The bound comes free with the check, so callers that
    enforce a size limit only serialize the rare value whose bound exceeds it. The bound is that
    of the value `check_json` returns; a caller that may be given subclasses of the JSON types
    should use `check_json_sized`, which returns that value too.
    """
    if type(value) is str:  # the common scalars, without a call, a tuple or a set
        if value.isascii():
            return 6 * len(value) + 2
    elif type(value) is int:
        bits = value.bit_length()
        if bits <= _SAFE_INT_BITS:
            return bits // 3 + 2
    elif value is None or type(value) is bool:
        return 5
    try:
        return _check(value, 0, set())
    except _NotPlain:
        return _check_plain(value, what)[1]
    except _Invalid as exc:
        raise _error(exc, what) from None


def check_json_sized(value: object, *, what: str = "value") -> tuple[JSONValue, int]:
    """`check_json` and `checked_size_bound` at once: the checked value and its size bound."""
    try:
        if type(value) is dict:  # arguments and most outputs: `_check`'s first case, inline
            return value, _check_container(value, 0, set())
        return value, _check(value, 0, set())  # type: ignore[return-value]  # just checked
    except _NotPlain:
        return _check_plain(value, what)
    except _Invalid as exc:
        raise _error(exc, what) from None


def _check_plain(value: object, what: str) -> tuple[JSONValue, int]:
    """Copy `value` once into plain types, then check the copy, which no subclass can change."""
    try:
        plain = _plain(value, 0, set())
        return plain, _check(plain, 0, set())  # type: ignore[return-value]  # just checked
    except _Invalid as exc:
        raise _error(exc, what) from None


def _error(exc: _Invalid, what: str) -> JSONValueError:
    return JSONValueError(path="$" + "".join(reversed(exc.parts)), problem=exc.problem, what=what)


def _check(value: object, depth: int, active: set[int]) -> int:
    if type(value) is dict or type(value) is list:
        return _check_container(value, depth, active)
    if type(value) is str:
        if not value.isascii():
            _check_text(value)
        return 6 * len(value) + 2
    if value is None or type(value) is bool:
        return 5
    if type(value) is int:
        bits = value.bit_length()
        if bits > _SAFE_INT_BITS:
            _check_big_int(value)
        return bits // 3 + 2
    if type(value) is float:
        if not math.isfinite(value):
            raise _Invalid(f"{value!r} is not a finite number")
        return 32
    if isinstance(value, (str, int, float, dict, list)):
        raise _NotPlain
    raise _Invalid(f"{type(value).__name__} is not a JSON type")


def _check_container(value: dict[Any, Any] | list[Any], depth: int, active: set[int]) -> int:
    if depth >= MAX_NESTING_DEPTH:
        raise _Invalid(f"nested deeper than {MAX_NESTING_DEPTH} levels")
    marker = id(value)
    if marker in active:
        raise _Invalid("the container contains itself")
    active.add(marker)
    size = 2
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                if isinstance(key, str):
                    raise _NotPlain
                raise _Invalid(
                    f"object key {_preview(key)} is a {type(key).__name__}, not a string"
                )
            if not key.isascii():
                _check_key(key)
            size += 6 * len(key) + 4
            kind = type(item)  # the common scalars inline: no call
            if kind is str:
                if item.isascii():
                    size += 6 * len(item) + 2
                    continue
            elif kind is int:
                bits = item.bit_length()
                if bits <= _SAFE_INT_BITS:
                    size += bits // 3 + 2
                    continue
            elif item is None or kind is bool:
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


def _check_text(text: str) -> None:
    """Raise unless `text` (not ASCII) can be encoded as UTF-8: it holds no surrogate."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise _Invalid(
            f"string holds {_surrogate(text, exc.start)}, which UTF-8 cannot encode"
        ) from None


def _check_key(key: str) -> None:
    try:
        key.encode()
    except UnicodeEncodeError as exc:
        raise _Invalid(
            f"object key {_preview(key)} holds {_surrogate(key, exc.start)}, "
            "which UTF-8 cannot encode"
        ) from None


def _surrogate(text: str, index: int) -> str:
    return f"the surrogate U+{ord(text[index]):04X} at index {index}"


def _check_big_int(value: int) -> None:
    limit = _int_digit_limit()
    if abs(value) >= _ten_to(limit):
        raise _Invalid(f"integer has more than {limit} digits")


def _int_digit_limit() -> int:
    """`MAX_INT_DIGITS`, or the interpreter's int-to-str limit if that is lower."""
    get_limit: Callable[[], int] | None = getattr(sys, "get_int_max_str_digits", None)
    limit = 0 if get_limit is None else get_limit()  # 0: unlimited, or a Python without one
    return MAX_INT_DIGITS if limit == 0 else min(limit, MAX_INT_DIGITS)


@functools.cache
def _ten_to(power: int) -> int:
    value: int = 10**power
    return value


def _preview(value: object) -> str:
    """`repr(value)` in ASCII-safe form, cut to 40 characters; never raises."""
    # repr escapes a str's surrogates; ascii() escapes whatever a foreign __repr__ returns.
    try:
        text = repr(value) if type(value) is str else ascii(value)
    except Exception:  # noqa: BLE001 - any failure of foreign code: name the type instead
        return f"<{type(value).__name__}>"
    return text if len(text) <= 40 else text[:39] + "\u2026"


def _plain(value: object, depth: int, active: set[int]) -> object:
    """A copy of `value` in which every instance of a subclass of a JSON type is a plain one.

    Read as `json.dumps` reads: a `dict` subclass through its `items()`, a `list` subclass and
    scalar subclasses through their stored data. Other values are left for `_check` to name.
    """
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if isinstance(value, (dict, list)):
        if depth >= MAX_NESTING_DEPTH:
            raise _Invalid(f"nested deeper than {MAX_NESTING_DEPTH} levels")
        marker = id(value)
        if marker in active:
            raise _Invalid("the container contains itself")
        active.add(marker)
        copy = (
            _plain_dict(value, depth, active)
            if isinstance(value, dict)
            else _plain_list(value, depth, active)
        )
        active.discard(marker)
        return copy
    # bool cannot be subclassed, so an int subclass here is a number
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return value


def _plain_dict(value: dict[Any, Any], depth: int, active: set[int]) -> dict[str, object]:
    if type(value) is dict:
        pairs = list(value.items())
    else:
        try:
            pairs = [(key, item) for key, item in value.items()]  # noqa: C416 - checks pairs
        except Exception as exc:  # noqa: BLE001 - foreign code: any failure is the value's fault
            raise _Invalid(
                f"reading the items of a {type(value).__name__} raised {type(exc).__name__}"
            ) from None
    copy: dict[str, object] = {}
    for key, item in pairs:
        if not isinstance(key, str):
            raise _Invalid(_KEY_TYPE.format(_preview(key), type(key).__name__))
        plain_key = str.__str__(key)
        if not plain_key.isascii():
            _check_key(plain_key)  # before the path can name it
        try:
            copy[plain_key] = _plain(item, depth + 1, active)
        except _Invalid as exc:
            exc.parts.append(_key_part(plain_key))
            raise
    return copy


def _plain_list(value: list[Any], depth: int, active: set[int]) -> list[object]:
    copy: list[object] = []
    for index, item in enumerate(list.copy(value)):
        try:
            copy.append(_plain(item, depth + 1, active))
        except _Invalid as exc:
            exc.parts.append(f"[{index}]")
            raise
    return copy


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
    """Compact JSON with sorted keys and raw UTF-8: the form interpolated into text.

    Floats are written as Python writes them (`1e+20`), where serde_json writes `1e20` (see
    `docs/protocol.md#whole-values-and-interpolation`). Exactly
    `json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)`, with the
    common scalars written directly and containers by `compact_encoder`.

    Raises nothing but `JSONValueError` (naming the offending part when `check_json` finds one):
    never for a value `check_json` returned, whose text `json.loads` reads back equal; for one
    that is not JSON, or an integer over a limit the interpreter lowered after the check.
    """
    try:
        if type(value) is str:
            return _encode_str(value)
        if type(value) is int:
            return int.__repr__(value)
        if value is None:
            return "null"
        if type(value) is bool:
            return "true" if value else "false"
        return _encode_sorted(value)
    except MemoryError:
        raise
    except Exception as exc:  # a foreign dict's items() may raise anything
        check_json(value)  # names the offending part, when it can
        raise JSONValueError(
            path="$", problem=f"cannot be written as JSON: {type(exc).__name__}"
        ) from exc


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
