"""JSON Schemas from Python annotations, and a small validator for them.

`schema_for(annotation)` (in `_typeschema`) maps an annotation to a JSON Schema (the table is in
`docs/protocol.md#tool-specs`); `parameters_schema(signature)` builds a tool's `parameters`
object. `compile_schema(schema)` turns a schema (derived, or supplied with `parameters=`) into a
`Validator`, once, at decoration; `Validator.check(arguments)` then runs per step.

The validator supports `type`, `enum`, `const`, `properties`, `required`,
`additionalProperties`, `items`, `prefixItems`, `minItems`/`maxItems`, `minLength`/`maxLength`,
`minimum`/`maximum` (and the exclusive ones), `anyOf`, `oneOf` (checked as `anyOf`), `allOf`, and
`$ref` to `#`, `#/$defs/...` or `#/definitions/...`. Every other keyword is ignored (it neither
accepts nor refuses anything), so schemas from MCP servers or pydantic load as they are.

JSON coercions: an integer is a valid `number`; a float with an integral value (`3.0`) is a valid
`integer` and reaches the tool as `3`; a boolean is never a number or an integer; a string is
never a number. A `null` for a property whose schema refuses null counts as absent: a missing
required argument, or for an optional one, the argument is dropped so its default applies (models
in strict mode send null for what they leave out).

Messages are serde-style, the style of the built-in tools, and each names the argument path
(`amount`, `items[2].sku`): ``missing field `x` ``, ``invalid type: {found} for field `x`,
expected {expected}``, ``invalid value: {found} for field `x`, expected {expected}`` and
``unknown field `x`, expected one of `a`, `b` ``. The validator recurses at most
`MAX_SCHEMA_DEPTH` levels and tries at most `MAX_BRANCHES` branches of `anyOf`/`allOf` per
call, so a hostile schema or value cannot exhaust the stack or the CPU.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple, final

from .._errors import InvalidArgument
from .._json import JSONValue, canonical_dumps, check_json, json_kind
from ._typeschema import _count, parameters_schema, schema_for

__all__ = [
    "MAX_BRANCHES",
    "MAX_SCHEMA_DEPTH",
    "Validator",
    "Violation",
    "compile_schema",
    "parameters_schema",
    "schema_for",
]

#: How deep the validator follows a schema into a value (containers, `$ref`s and combinators).
MAX_SCHEMA_DEPTH: Final = 200
#: How many `anyOf`/`oneOf`/`allOf` branches one validation may try in all.
MAX_BRANCHES: Final = 500_000

_NONE_TYPE: Final = type(None)


# ---------------------------------------------------------------------- the validator


class Violation(NamedTuple):
    """Why arguments do not fit a schema: the message and the argument (top-level) it names."""

    message: str
    key: str | None


@final
class _Bad:
    """A failed check: what kind, where (segments innermost first), what was found and expected."""

    __slots__ = ("expected", "found", "kind", "segments")

    def __init__(self, kind: str, found: str = "", expected: str = "") -> None:
        self.kind = kind  # "type", "value", "missing", "unknown" or "limit"
        self.found = found
        self.expected = expected
        self.segments: list[str | int] = []


@final
class _Fix:
    """A check that passed once the value is replaced (`3.0` -> `3`; a null property dropped)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value


_DROP: Final = object()
_NULLISH: Final = frozenset({"type", "value"})
_Result = _Bad | _Fix | None
_Check = Callable[[Any, int, list[int]], _Result]


@final
class Validator:
    """A compiled schema. `check(arguments)` returns the arguments to pass (coerced) or why not.

    Thread-safe and reentrant: it holds no state between calls.
    """

    __slots__ = ("_check", "_flat", "_required", "schema")

    def __init__(self, check: _Check, schema: Mapping[str, JSONValue]) -> None:
        self._check = check
        self.schema = schema
        flat = _flat_types(schema)
        self._flat: dict[str, type] | None = None if flat is None else flat[0]
        self._required: frozenset[str] = frozenset() if flat is None else flat[1]

    def check(self, arguments: JSONValue) -> tuple[JSONValue, Violation | None]:
        """The arguments after coercion (the same object when none applied), or a violation."""
        flat = self._flat
        if flat is not None and type(arguments) is dict and arguments.keys() >= self._required:
            # The fast path of a flat schema (every call of a typical tool, on every step):
            # each argument is a property of exactly its one plain type, so the full check
            # would pass it unchanged. Anything else takes the full check below.
            for key, item in arguments.items():
                expected = flat.get(key)  # `object`: a property that takes any value
                if type(item) is not expected and expected is not object:
                    break
            else:
                return arguments, None
        try:
            result = self._check(arguments, 0, [MAX_BRANCHES])
        except RecursionError:  # the caller's stack was already deep
            result = _Bad("limit")
        if result is None:
            return arguments, None
        if isinstance(result, _Fix):
            return result.value, None  # type: ignore[return-value]  # built from JSON values
        return arguments, _violation(result)


def _violation(bad: _Bad) -> Violation:
    segments = bad.segments[::-1]
    key = segments[0] if segments and isinstance(segments[0], str) else None
    path = _path(segments)
    if bad.kind == "limit":
        return Violation(
            "arguments are too deeply nested or too complex for the tool's schema", key
        )
    if bad.kind == "missing":
        return Violation(f"missing field `{path}`", key)
    if bad.kind == "unknown":
        return Violation(f"unknown field `{path}`, {bad.expected}", key)
    where = f" for field `{path}`" if path else ""
    if bad.kind == "type" and not path and bad.expected == "an object":
        return Violation(f"invalid type: {bad.found}, expected a JSON object of arguments", None)
    label = "invalid type" if bad.kind == "type" else "invalid value"
    return Violation(f"{label}: {bad.found}{where}, expected {bad.expected}", key)


def _path(segments: list[str | int]) -> str:
    parts: list[str] = []
    for segment in segments:
        if isinstance(segment, int):
            parts.append(f"[{segment}]")
        else:
            name = segment.replace("`", "'").replace("\n", " ")
            parts.append(f".{name}" if parts else name)
    return "".join(parts)


def compile_schema(schema: Mapping[str, JSONValue], *, what: str = "schema") -> Validator:
    """Compile `schema` (a JSON Schema object) into a `Validator`.

    Raises `InvalidArgument` naming `what` when `schema` is not a JSON object of JSON values.
    Unknown keywords are ignored; a `$ref` it cannot follow accepts anything.
    """
    if not isinstance(schema, Mapping):
        raise InvalidArgument(f"{what} must be a JSON Schema object, got {type(schema).__name__}")
    try:
        checked = check_json(dict(schema), what=what)
    except Exception as exc:
        raise InvalidArgument(f"{what} must be a JSON Schema object of JSON values: {exc}") from exc
    assert isinstance(checked, dict)
    return Validator(_Compiler(checked).compile(checked), checked)


@final
class _Compiler:
    """Compiles one root schema; `$ref`s to its definitions share one compiled check each."""

    __slots__ = ("_refs", "_root")

    def __init__(self, root: dict[str, JSONValue]) -> None:
        self._root = root
        self._refs: dict[str, list[_Check]] = {}

    def compile(self, schema: JSONValue) -> _Check:
        if schema is False:
            return _refuse
        if not isinstance(schema, dict) or not schema:
            return _accept  # true, {}, or not a schema at all
        checks: list[_Check] = []
        ref = schema.get("$ref")
        if isinstance(ref, str):
            checks.append(self._ref(ref))
        kinds = schema.get("type")
        if isinstance(kinds, str):
            kinds = [kinds]
        has_object = any(k in schema for k in ("properties", "required", "additionalProperties"))
        # `{"type": "object", "properties": ...}`: the object check refuses a non-object itself
        fused = has_object and kinds == ["object"]
        if isinstance(kinds, list) and all(isinstance(k, str) for k in kinds) and not fused:
            checks.append(_type_check(tuple(k for k in kinds if isinstance(k, str))))
        if "const" in schema:
            checks.append(_enum_check([schema["const"]]))
        values = schema.get("enum")
        if isinstance(values, list):
            checks.append(_enum_check(values))
        if has_object:
            checks.append(self._object(schema, must_be_object=fused))
        if any(k in schema for k in ("items", "prefixItems", "minItems", "maxItems")):
            checks.append(self._array(schema))
        bounds = _number_check(schema)
        if bounds is not None:
            checks.append(bounds)
        lengths = _length_check(schema)
        if lengths is not None:
            checks.append(lengths)
        for keyword in ("anyOf", "oneOf"):
            branches = schema.get(keyword)
            if isinstance(branches, list) and branches:
                checks.append(_any_of(tuple(self.compile(b) for b in branches)))
        branches = schema.get("allOf")
        if isinstance(branches, list) and branches:
            checks.append(_all_of(tuple(self.compile(b) for b in branches), spend=True))
        if not checks:
            return _accept
        if len(checks) == 1:
            return checks[0]
        return _all_of(tuple(checks), spend=False)

    def _ref(self, ref: str) -> _Check:
        """A check that follows `ref` (compiled once, on first use, so cycles terminate)."""
        cell = self._refs.get(ref)
        if cell is None:
            cell = []
            self._refs[ref] = cell
            target = _resolve(self._root, ref)
            cell.append(_accept if target is None else self.compile(target))
        compiled = cell

        def follow(value: Any, depth: int, budget: list[int]) -> _Result:
            if depth > MAX_SCHEMA_DEPTH:
                return _Bad("limit")
            return compiled[0](value, depth + 1, budget) if compiled else None

        return follow

    def _object(self, schema: dict[str, JSONValue], *, must_be_object: bool) -> _Check:
        raw = schema.get("properties")
        properties = (
            {name: self.compile(sub) for name, sub in raw.items()} if isinstance(raw, dict) else {}
        )
        names = schema.get("required")
        required = tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()
        extra_schema = schema.get("additionalProperties", True)
        extra: _Check | None = None if extra_schema is True else self.compile(extra_schema)
        refused = extra_schema is False
        known = ", ".join(f"`{name}`" for name in properties)
        unknown_text = f"expected one of {known}" if known else "there are no fields"
        required_set = frozenset(required)
        # Properties whose schema is one plain type: a value of exactly that Python type passes
        # without a call (the common case of a flat signature).
        fast: dict[str, type] = {}
        for name, sub in raw.items() if isinstance(raw, dict) else ():
            kind = sub.get("type") if isinstance(sub, dict) else None
            if isinstance(sub, dict) and isinstance(kind, str) and set(sub) <= _ANNOTATIONS:
                exact = _EXACT.get(kind)
                if exact is not None:
                    fast[name] = exact

        def check(value: Any, depth: int, budget: list[int]) -> _Result:  # noqa: PLR0911
            if type(value) is not dict:
                if must_be_object:
                    return _Bad("type", json_kind(value), "an object")
                return None  # `type` says whether it must be an object
            if depth > MAX_SCHEMA_DEPTH:
                return _Bad("limit")
            if not required_set <= value.keys():
                for name in required:
                    if name not in value:
                        bad = _Bad("missing")
                        bad.segments.append(name)
                        return bad
            fixes: dict[str, object] | None = None
            for key, item in value.items():
                if type(item) is fast.get(key):
                    continue
                sub = properties.get(key)
                if sub is None:
                    if refused:
                        bad = _Bad("unknown", expected=unknown_text)
                        bad.segments.append(key)
                        return bad
                    if extra is None:
                        continue
                    sub = extra
                result = sub(item, depth + 1, budget)
                if result is None:
                    continue
                if isinstance(result, _Bad):
                    if item is None and not result.segments and result.kind in _NULLISH:
                        # null for a required argument is missing; an optional one is dropped,
                        # so that its default applies
                        result = _Bad("missing") if key in required_set else _Fix(_DROP)
                    if isinstance(result, _Bad):
                        result.segments.append(key)
                        return result
                if fixes is None:
                    fixes = {}
                fixes[key] = result.value
            if fixes is None:
                return None
            fixed = {k: fixes.get(k, v) for k, v in value.items()}
            return _Fix({k: v for k, v in fixed.items() if v is not _DROP})

        return check

    def _array(self, schema: dict[str, JSONValue]) -> _Check:
        raw_prefix = schema.get("prefixItems")
        prefix = (
            tuple(self.compile(sub) for sub in raw_prefix) if isinstance(raw_prefix, list) else ()
        )
        raw_items = schema.get("items", True)
        if isinstance(raw_items, list):  # draft 4-7 tuple form
            prefix = tuple(self.compile(sub) for sub in raw_items)
            raw_items = schema.get("additionalItems", True)
        items: _Check | None = None if raw_items is True else self.compile(raw_items)
        low_n = _count(schema.get("minItems"))
        high_n = _count(schema.get("maxItems"))

        def check(value: Any, depth: int, budget: list[int]) -> _Result:
            if type(value) is not list:
                return None
            if depth > MAX_SCHEMA_DEPTH:
                return _Bad("limit")
            count = len(value)
            if (low_n is not None and count < low_n) or (high_n is not None and count > high_n):
                return _Bad("value", f"an array of {count} items", _count_text(low_n, high_n))
            fixes: dict[int, object] | None = None
            for index, item in enumerate(value):
                sub = prefix[index] if index < len(prefix) else items
                if sub is None:
                    if index >= len(prefix):
                        break
                    continue
                result = sub(item, depth + 1, budget)
                if result is None:
                    continue
                if isinstance(result, _Bad):
                    result.segments.append(index)
                    return result
                if fixes is None:
                    fixes = {}
                fixes[index] = result.value
            if fixes is None:
                return None
            return _Fix([fixes.get(i, v) for i, v in enumerate(value)])

        return check


def _count_text(low: int | None, high: int | None) -> str:
    if low is not None and low == high:
        return f"{low} items"
    if high is None:
        return f"at least {low} items"
    if low is None:
        return f"at most {high} items"
    return f"{low} to {high} items"


def _resolve(root: dict[str, JSONValue], ref: str) -> JSONValue | None:
    """The schema a local `$ref` points to (`#`, `#/$defs/x`, JSON pointers); None otherwise."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node: JSONValue = root
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _accept(_value: Any, _depth: int, _budget: list[int]) -> _Result:
    return None


def _refuse(value: Any, _depth: int, _budget: list[int]) -> _Result:
    return _Bad("value", _found(value), "nothing (no value is allowed here)")


_ARTICLES: Final = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
    "array": "an array",
    "object": "an object",
}


def _expected(kinds: Sequence[str]) -> str:
    """`a string`, `a string or number`: an article on the first only, as the built-ins say."""
    words = [_ARTICLES.get(kinds[0], kinds[0]), *kinds[1:]]
    return " or ".join(words)


#: Keywords that do not constrain a value.
_ANNOTATIONS: Final = frozenset(
    {"type", "description", "title", "default", "examples", "x-semantic-type", "$comment"}
)
_EXACT: Final[Mapping[str, type]] = {
    "string": str,
    "boolean": bool,
    "integer": int,
    "array": list,
    "object": dict,
    "null": _NONE_TYPE,
}


#: The keywords a flat schema (`_flat_types`) may have at its root.
_FLAT_ROOT: Final = _ANNOTATIONS | {
    "properties",
    "required",
    "additionalProperties",
    "$schema",
    "$id",
    "$defs",
    "definitions",
}


def _flat_types(schema: Mapping[str, JSONValue]) -> tuple[dict[str, type], frozenset[str]] | None:
    """The Python type of each property and the required names of a flat schema: an object
    whose properties each take one plain type (`{"type": "integer"}`, annotations aside) or any
    value (annotations only: `object`), and nothing else constrained at its root. None for any
    other schema.

    An argument object whose every field is one of those properties, of exactly that type,
    with every required field present, passes the full check unchanged (`Validator.check`).
    """
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if (
        schema.get("type") != "object"
        or not set(schema) <= _FLAT_ROOT
        or not isinstance(properties, dict)
        or not isinstance(required, list)
    ):
        return None
    types: dict[str, type] = {}
    for name, sub in properties.items():
        if not isinstance(sub, dict) or not set(sub) <= _ANNOTATIONS:
            return None
        kind = sub.get("type")
        if kind is None:  # unconstrained: any JSON value (arguments are checked JSON already)
            types[name] = object
            continue
        if not isinstance(kind, str):
            return None
        exact = _EXACT.get(kind)
        if exact is None:
            return None
        types[name] = exact
    return types, frozenset(name for name in required if isinstance(name, str))


def _type_check(kinds: tuple[str, ...]) -> _Check:
    """The check of `type`; one type gets a fast path for a value of exactly its Python type."""
    general = _general_type_check(kinds)
    exact = _EXACT.get(kinds[0]) if len(kinds) == 1 else None
    if exact is None:
        return general

    def check(value: Any, depth: int, budget: list[int]) -> _Result:
        if type(value) is exact:
            return None
        return general(value, depth, budget)

    return check


def _general_type_check(kinds: tuple[str, ...]) -> _Check:
    allowed = frozenset(kinds)
    expected = _expected(kinds)
    integer = "integer" in allowed and "number" not in allowed

    def check(value: Any, _depth: int, _budget: list[int]) -> _Result:
        kind = type(value)
        if kind is str:
            name = "string"
        elif kind is bool:
            name = "boolean"
        elif kind is int:
            if "integer" in allowed or "number" in allowed:
                return None
            name = "number"
        elif kind is float:
            if "number" in allowed:
                return None
            if integer and value.is_integer():
                return _Fix(int(value))
            if integer:
                return _Bad("value", _found(value), expected)
            name = "number"
        elif value is None:
            name = "null"
        elif kind is list:
            name = "array"
        elif kind is dict:
            name = "object"
        else:
            name = json_kind(value)
        if name in allowed:
            return None
        return _Bad("type", name, expected)

    return check


def _same(a: object, b: object) -> bool:
    """JSON equality: `true` is not `1`, `1` is `1.0`."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return type(a) is type(b) and canonical_dumps(a) == canonical_dumps(b)  # type: ignore[arg-type]
    return type(a) is type(b) and a == b


def _enum_check(values: list[JSONValue]) -> _Check:
    shown = ", ".join(_short(v) for v in values[:10]) + (", ..." if len(values) > 10 else "")
    expected = f"one of {shown}" if len(values) != 1 else shown
    scalars = {
        (type(v), v) for v in values if isinstance(v, (str, bool, int)) or v is None
    }  # fast path for the common case

    def check(value: Any, _depth: int, _budget: list[int]) -> _Result:
        if (isinstance(value, (str, bool, int)) or value is None) and (
            type(value),
            value,
        ) in scalars:
            return None
        if any(_same(value, v) for v in values):
            return None
        return _Bad("value", _found(value), expected)

    return check


def _short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, (dict, list)) else None
    if text is None:
        text = json_kind(value)
    text = text.replace("`", "'").replace("\n", " ")
    return text if len(text) <= 40 else text[:39] + "\u2026"


def _found(value: object) -> str:
    kind = json_kind(value)
    if isinstance(value, (dict, list)) or value is None:
        return kind
    return f"{kind} {_short(value)}"


def _number_check(schema: dict[str, JSONValue]) -> _Check | None:
    bounds: list[tuple[float, str, Callable[[float, float], bool]]] = []
    for keyword, text, test in (
        ("minimum", "at least", lambda v, b: v >= b),
        ("maximum", "at most", lambda v, b: v <= b),
        ("exclusiveMinimum", "more than", lambda v, b: v > b),
        ("exclusiveMaximum", "less than", lambda v, b: v < b),
    ):
        bound = schema.get(keyword)
        if isinstance(bound, (int, float)) and not isinstance(bound, bool):
            bounds.append((bound, f"{text} {_short(bound)}", test))
    if not bounds:
        return None

    def check(value: Any, _depth: int, _budget: list[int]) -> _Result:
        if type(value) not in (int, float) or (type(value) is float and math.isnan(value)):
            return None
        for bound, text, test in bounds:
            if not test(value, bound):
                return _Bad("value", _found(value), text)
        return None

    return check


def _length_check(schema: dict[str, JSONValue]) -> _Check | None:
    low_n = _count(schema.get("minLength"))
    high_n = _count(schema.get("maxLength"))
    if low_n is None and high_n is None:
        return None

    def check(value: Any, _depth: int, _budget: list[int]) -> _Result:
        if type(value) is not str:
            return None
        if (low_n is not None and len(value) < low_n) or (
            high_n is not None and len(value) > high_n
        ):
            text = _count_text(low_n, high_n).replace("items", "characters")
            return _Bad("value", f"a string of {len(value)} characters", text)
        return None

    return check


def _spend(budget: list[int]) -> bool:
    budget[0] -= 1
    return budget[0] < 0


def _any_of(branches: tuple[_Check, ...]) -> _Check:
    def check(value: Any, depth: int, budget: list[int]) -> _Result:
        if depth > MAX_SCHEMA_DEPTH:
            return _Bad("limit")
        failures: list[_Bad] = []
        for branch in branches:
            if _spend(budget):
                return _Bad("limit")
            result = branch(value, depth + 1, budget)
            if not isinstance(result, _Bad):
                return result
            if result.kind == "limit":
                return result
            failures.append(result)
        deeper = [f for f in failures if f.segments or f.kind != "type"]
        if deeper:
            return deeper[0]
        expected = " or ".join(dict.fromkeys(f.expected for f in failures))
        return _Bad("type", failures[0].found, expected)

    return check


def _all_of(checks: tuple[_Check, ...], *, spend: bool) -> _Check:
    """Every check in turn, each on the value the previous one fixed; `spend` counts branches."""

    def check(value: Any, depth: int, budget: list[int]) -> _Result:
        fixed: _Fix | None = None
        for sub in checks:
            if spend and _spend(budget):
                return _Bad("limit")
            result = sub(value, depth, budget)
            if result is None:
                continue
            if isinstance(result, _Bad):
                return result
            fixed = result
            value = result.value
        return fixed

    return check
