"""JSON values: validation with a path, canonical text, scalar leaves and strict equality."""

from __future__ import annotations

import enum
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agenttx
from agenttx._json import (
    canonical_dumps,
    check_json,
    checked_size_bound,
    compact_encoder,
    scalar_leaves,
    value_tag,
)
from agenttx.testing import json_values


@given(json_values())
def test_json_values_pass_unchanged(value):
    """Any JSON value is accepted and returned as the same object."""
    assert check_json(value) is value


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        ({1, 2}, "$", "set is not a JSON type"),
        ({"a": [1, {2}]}, "$.a[1]", "set is not a JSON type"),
        ({"a": (1, 2)}, "$.a", "tuple is not a JSON type"),
        ({"a": object()}, "$.a", "object is not a JSON type"),
        ([math.nan], "$[0]", "nan is not a finite number"),
        ({"x": {"y": math.inf}}, "$.x.y", "inf is not a finite number"),
        ({"weird key": [-math.inf]}, '$["weird key"][0]', "-inf is not a finite number"),
        ({1: "a"}, "$", "object key 1 is a int, not a string"),
        ({"a": {None: 1}}, "$.a", "object key None is a NoneType, not a string"),
        (b"bytes", "$", "bytes is not a JSON type"),
    ],
)
def test_non_json_values_are_refused_with_their_path(value, path, problem):
    """Each kind of non-JSON value gives a JSONValueError naming where and what."""
    with pytest.raises(agenttx.JSONValueError) as caught:
        check_json(value, what="arguments")
    assert caught.value.path == path
    assert caught.value.problem == problem
    assert str(caught.value) == f"not a JSON value in arguments at {path}: {problem}"
    assert isinstance(caught.value, ValueError)


def test_self_referencing_structures_are_refused():
    """A container that contains itself is named as such, not reported as too deep."""
    loop: list[object] = [1]
    loop.append(loop)
    with pytest.raises(agenttx.JSONValueError, match="contains itself") as caught:
        check_json({"a": loop})
    assert caught.value.path == "$.a[1]"


def test_shared_but_acyclic_structures_are_fine():
    """The same list used twice is a DAG, not a cycle."""
    shared = [1, 2]
    assert check_json({"a": shared, "b": shared}) == {"a": [1, 2], "b": [1, 2]}


def test_nesting_up_to_the_limit_is_accepted_and_beyond_is_refused():
    """Containers may nest MAX_NESTING_DEPTH deep; one more level is refused."""
    limit = agenttx.MAX_NESTING_DEPTH
    value: object = 1
    for _ in range(limit):
        value = [value]
    check_json(value)
    with pytest.raises(agenttx.JSONValueError, match=f"deeper than {limit}"):
        check_json([value])


def test_very_deep_nesting_does_not_exhaust_recursion():
    """A hostile 100,000-level structure is refused cleanly, not with RecursionError."""
    value: object = []
    for _ in range(100_000):
        value = [value]
    with pytest.raises(agenttx.JSONValueError):
        check_json(value)


def test_canonical_dumps_is_compact_sorted_and_utf8():
    """Canonical text has no spaces, sorted keys and raw non-ASCII characters."""
    assert canonical_dumps({"b": [1, 2.5], "a": "é", "c": None}) == (
        '{"a":"é","b":[1,2.5],"c":null}'
    )


@given(json_values())
def test_canonical_dumps_is_exactly_json_dumps(value):
    """The fast paths write what `json.dumps` with the canonical options writes, byte for byte."""
    expected = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    assert canonical_dumps(value) == expected


@given(json_values(), st.booleans())
def test_compact_encoder_is_exactly_json_dumps(value, sort_keys):
    """The C encoder called directly writes what `json.dumps` writes, in both key orders."""
    expected = json.dumps(value, separators=(",", ":"), sort_keys=sort_keys, ensure_ascii=False)
    assert compact_encoder(sort_keys=sort_keys)(value) == expected


def test_compact_encoder_refuses_what_is_not_json():
    """A value that is not JSON raises TypeError, as `json.dumps` does."""
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        compact_encoder(sort_keys=False)([{1, 2}])


@pytest.mark.parametrize("value", ["", 'é"\n\x00\u2028', -(2**70), 0, True, False, None, 1.5])
def test_canonical_dumps_scalar_fast_paths(value):
    """Each scalar fast path agrees with `json.dumps`, escapes and big integers included."""
    expected = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    assert canonical_dumps(value) == expected


@given(json_values())
def test_canonical_dumps_round_trips(value):
    """Canonical text parses back to an equal value."""
    assert json.loads(canonical_dumps(value)) == value


def test_scalar_leaves_keep_only_the_leaf_key_in_sorted_order():
    """Leaves are depth first with sorted keys; arrays pass their key to their elements."""
    value = {
        "references": {"user_id": 1},
        "fields": {"user_id": 2, "tags": ["a", "b"]},
        "empty": {},
        "none": [],
        "flag": True,
    }
    assert scalar_leaves(value) == [
        ("tags", "a"),
        ("tags", "b"),
        ("user_id", 2),
        ("flag", True),
        ("user_id", 1),
    ]


def test_top_level_scalars_get_the_empty_key():
    """A bare scalar is one leaf with the key ''; a bare array gives each element that key."""
    assert scalar_leaves("u-7") == [("", "u-7")]
    assert scalar_leaves([1, [2]]) == [("", 1), ("", 2)]


def test_value_tags_are_strict_json_equality():
    """7, 7.0, '7' and True are four different values; 0.0 equals -0.0."""
    tags = {value_tag(7), value_tag(7.0), value_tag("7"), value_tag(True), value_tag(1)}
    assert len(tags) == 5
    assert value_tag(0.0) == value_tag(-0.0)
    assert value_tag(None) == ("n", None)


def test_value_tags_treat_subclasses_as_their_json_kind():
    """An IntEnum member is a JSON integer and a str-enum member a JSON string."""

    class Level(enum.IntEnum):
        HIGH = 7

    class Colour(str, enum.Enum):
        RED = "red"

    assert value_tag(Level.HIGH) == value_tag(7)
    assert value_tag(Colour.RED) == value_tag("red")


@given(json_values())
def test_size_bound_is_an_upper_bound_of_the_canonical_text(value):
    """checked_size_bound never underestimates the UTF-8 size of the canonical JSON text."""
    exact = len(canonical_dumps(value).encode("utf-8", "surrogatepass"))
    assert checked_size_bound(value) >= exact


def test_size_bound_counts_escapes_and_big_integers():
    """Control characters (6-byte escapes) and long integers stay within the bound."""
    for value in ["\x00" * 100, 10**300, {"\x01" * 10: ["\x1f" * 7, -(10**50)]}]:
        assert checked_size_bound(value) >= len(canonical_dumps(value).encode())
