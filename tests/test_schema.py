"""JSON Schemas from annotations, and the validator with its JSON coercions and limits."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, NewType, Optional, TypedDict, Union

import pytest
import typing_extensions
from hypothesis import given
from hypothesis import strategies as st

from agenttx._errors import InvalidArgument
from agenttx._tools import _schema
from agenttx._tools._schema import compile_schema, parameters_schema, schema_for
from agenttx._tools._signature import read_signature

Sku = NewType("Sku", str)


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Line(TypedDict):
    sku: Sku
    qty: int


class ExtLine(typing_extensions.TypedDict):
    sku: Sku
    qty: int


@pytest.mark.parametrize(
    ("annotation", "schema"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (None, {"type": "null"}),
        (Any, {}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (list, {"type": "array"}),
        (tuple[int, ...], {"type": "array", "items": {"type": "integer"}}),
        (
            tuple[int, str],
            {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "items": False,
                "minItems": 2,
                "maxItems": 2,
            },
        ),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
        (dict, {"type": "object"}),
        (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
        (Literal[1, "a"], {"enum": [1, "a"]}),
        (Color, {"type": "string", "enum": ["red", "green"], "title": "Color"}),
        (Optional[int], {"type": ["integer", "null"]}),  # noqa: UP045
        (Union[int, str], {"type": ["integer", "string"]}),  # noqa: UP007
        (
            int | list[int],
            {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}]},
        ),
        (Sku, {"type": "string", "x-semantic-type": "Sku"}),
        (Annotated[int, "how many"], {"type": "integer", "description": "how many"}),
        (
            Line,
            {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "x-semantic-type": "Sku"},
                    "qty": {"type": "integer"},
                },
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
        ),
        (object(), {}),
    ],
)
def test_annotation_schemas(annotation, schema):
    """Each supported annotation maps to the documented schema; unknown ones accept anything."""
    assert schema_for(annotation) == schema


def test_typing_extensions_typed_dict_schema_is_the_typing_one():
    """A `typing_extensions.TypedDict` gets the same object schema as a `typing.TypedDict`."""
    assert schema_for(ExtLine) == schema_for(Line)
    assert schema_for(ExtLine)["required"] == ["sku", "qty"]


def test_parameters_schema_has_defaults_descriptions_and_required():
    """A signature gives an object schema: required names, defaults, docstring descriptions."""

    def charge(amount: int, card: str = "visa", color: Color = Color.RED) -> None:
        """Charge.

        Args:
            amount: In cents.
        """

    schema = parameters_schema(read_signature(charge, skip_context=False))
    assert schema == {
        "type": "object",
        "properties": {
            "amount": {"type": "integer", "description": "In cents."},
            "card": {"type": "string", "default": "visa"},
            "color": {
                "type": "string",
                "enum": ["red", "green"],
                "title": "Color",
                "default": "red",
            },
        },
        "required": ["amount"],
        "additionalProperties": False,
    }


def check(schema, value):
    return compile_schema(schema).check(value)


ORDER = parameters_schema(read_signature(lambda amount, items, note=None: None, skip_context=False))


def order_validator():
    def order(amount: float, items: list[Line], note: Optional[str] = None, n: int = 1) -> None:  # noqa: UP045
        return None

    return compile_schema(parameters_schema(read_signature(order, skip_context=False)))


@pytest.mark.parametrize(
    ("arguments", "message", "key"),
    [
        ({"items": []}, "missing field `amount`", "amount"),
        ({"amount": None, "items": []}, "missing field `amount`", "amount"),
        (
            {"amount": "two", "items": []},
            "invalid type: string for field `amount`, expected a number",
            "amount",
        ),
        (
            {"amount": True, "items": []},
            "invalid type: boolean for field `amount`, expected a number",
            "amount",
        ),
        (
            {
                "amount": 1,
                "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 1}, {"sku": 3, "qty": 1}],
            },
            "invalid type: number for field `items[2].sku`, expected a string",
            "items",
        ),
        ({"amount": 1, "items": [{"sku": "a"}]}, "missing field `items[0].qty`", "items"),
        (
            {"amount": 1, "items": [], "extra": 1},
            "unknown field `extra`, expected one of `amount`, `items`, `note`, `n`",
            "extra",
        ),
        (
            {"amount": 1, "items": [], "n": 1.5},
            "invalid value: number 1.5 for field `n`, expected an integer",
            "n",
        ),
        (
            {"amount": 1, "items": [], "n": "2"},
            "invalid type: string for field `n`, expected an integer",
            "n",
        ),
        ([1], "invalid type: array, expected a JSON object of arguments", None),
    ],
)
def test_violations_name_the_argument(arguments, message, key):
    """Each violation names the argument path and what was wrong, in serde style."""
    _, violation = order_validator().check(arguments)
    assert violation is not None
    assert (violation.message, violation.key) == (message, key)


def test_coercions():
    """An int is a number; 3.0 is the integer 3; an optional null is kept when allowed."""
    validator = order_validator()
    arguments = {"amount": 3, "items": [{"sku": "a", "qty": 2.0}], "n": 3.0, "note": None}
    fixed, violation = validator.check(arguments)
    assert violation is None
    assert fixed == {"amount": 3, "items": [{"sku": "a", "qty": 2}], "n": 3, "note": None}
    assert type(fixed["n"]) is int
    assert arguments["n"] == 3.0  # the caller's value is not changed (copy on write)
    same = {"amount": 1.5, "items": []}
    assert validator.check(same) == (same, None)
    assert validator.check(same)[0] is same


def test_enum_const_and_bounds():
    """enum and const compare as JSON (true is not 1); bounds and lengths name the limit."""
    assert (
        check({"enum": [1, "a"]}, True)[1].message
        == 'invalid value: boolean true, expected one of 1, "a"'
    )
    assert check({"enum": [1, "a"]}, 1.0)[1] is None
    assert check({"const": "x"}, "y")[1].message == 'invalid value: string "y", expected "x"'
    assert (
        check({"type": "integer", "minimum": 1}, 0)[1].message
        == "invalid value: number 0, expected at least 1"
    )
    assert check({"type": "string", "maxLength": 2}, "abc")[1].message == (
        "invalid value: a string of 3 characters, expected at most 2 characters"
    )
    assert check({"type": "array", "prefixItems": [{}], "items": False}, [1, 2])[1].message == (
        "invalid value: number 2 for field `[1]`, expected nothing (no value is allowed here)"
    )


def test_any_of_reports_types_or_the_deeper_failure():
    """anyOf lists the types when none fits, or reports the branch that failed deeper."""
    schema = {
        "anyOf": [{"type": "integer"}, {"type": "object", "properties": {"a": {"type": "string"}}}]
    }
    assert check(schema, "x")[1].message == "invalid type: string, expected an integer or an object"
    assert (
        check(schema, {"a": 1})[1].message
        == "invalid type: number for field `a`, expected a string"
    )
    assert check(schema, {"a": "ok"})[1] is None


def test_refs_and_cycles():
    """`$ref` to `#/$defs/...` is followed; a recursive schema validates nested values."""
    schema = {
        "type": "object",
        "properties": {"tree": {"$ref": "#/$defs/node"}},
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
            }
        },
    }
    good = {"tree": {"v": 1, "kids": [{"v": 2, "kids": []}]}}
    assert check(schema, good)[1] is None
    bad = {"tree": {"v": 1, "kids": [{"v": "x"}]}}
    assert (
        check(schema, bad)[1].message
        == "invalid type: string for field `tree.kids[0].v`, expected an integer"
    )
    assert check({"$ref": "#/$defs/missing"}, 5)[1] is None  # unresolvable: accepts
    assert check({"$ref": "https://example.com/s.json"}, 5)[1] is None


def test_hostile_schemas_are_bounded(monkeypatch):
    """A self-referencing alias, or exponential anyOf, ends with a limit violation, not a crash."""
    alias = {"$ref": "#/$defs/a", "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}}
    _, violation = check(alias, 1)
    assert violation is not None
    assert "too deeply nested or too complex" in violation.message
    nested: dict = {"type": "integer"}
    for _ in range(10):
        nested = {"anyOf": [{"type": "string"}, {"allOf": [nested]}, {"allOf": [nested]}]}
    monkeypatch.setattr(_schema, "MAX_BRANCHES", 1_000)
    _, violation = check({"type": "array", "items": nested}, [1.5])
    assert violation is not None
    assert "too complex" in violation.message
    for _ in range(40):
        nested = {"anyOf": [nested]}
    with pytest.raises(InvalidArgument, match="nested deeper than"):
        compile_schema(nested)
    deep = current = []
    for _ in range(60):
        current.append([])
        current = current[0]
    assert check({"type": "array", "items": {"$ref": "#"}}, deep)[1] is None


def test_unknown_keywords_are_ignored_and_bad_schemas_refused():
    """Unknown keywords change nothing; a non-object or non-JSON schema is InvalidArgument."""
    assert check({"type": "string", "format": "email", "pattern": "^x$"}, "y")[1] is None
    with pytest.raises(InvalidArgument, match="JSON Schema object"):
        compile_schema([1])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="JSON values"):
        compile_schema({"type": object()})  # type: ignore[dict-item]


def test_a_hostile_annotation_maps_to_any_value():
    """An annotation object that raises when compared gives `{}`, not a failed decoration."""

    class Weird:
        __hash__ = None  # type: ignore[assignment]

        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no")

    assert schema_for(Weird()) == {}


_FLAT_SCHEMA = {
    "type": "object",
    "description": "a flat tool",
    "properties": {
        "a": {"type": "string", "description": "text"},
        "b": {"type": "integer", "default": 1},
        "c": {"type": "boolean"},
        "d": {"type": "null"},
        "e": {"type": "array"},
        "f": {"description": "any value"},
    },
    "required": ["a", "c"],
    "additionalProperties": False,
}
_FLAT_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@given(
    arguments=st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e", "f", "x"]), _FLAT_VALUES),
    extra=st.sampled_from([False, True, {"type": "integer"}]),
)
def test_the_flat_fast_path_answers_as_the_full_check(arguments, extra):
    """A flat schema's fast path passes only what the full check passes unchanged."""
    schema = {**_FLAT_SCHEMA, "additionalProperties": extra}
    validator, slow = compile_schema(schema), compile_schema(schema)
    assert validator._flat is not None
    slow._flat = None  # the full check only
    checked, violation = validator.check(arguments)
    expected, expected_violation = slow.check(arguments)
    assert (checked, violation) == (expected, expected_violation)
    assert (checked is arguments) == (expected is arguments)  # coerced: a new object


def test_only_a_flat_schema_takes_the_fast_path():
    """A property with more than one plain type, or a constraint at the root, turns it off."""
    assert compile_schema(_FLAT_SCHEMA)._flat == {
        "a": str,
        "b": int,
        "c": bool,
        "d": type(None),
        "e": list,
        "f": object,
    }
    assert compile_schema({**_FLAT_SCHEMA, "minProperties": 1})._flat is None
    assert compile_schema({"type": "object", "properties": {"n": {"type": "number"}}})._flat is None
    bounded = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    assert compile_schema(bounded)._flat is None
    assert compile_schema({"type": "array"})._flat is None
    assert compile_schema({"type": "object", "required": "a"})._flat is None
