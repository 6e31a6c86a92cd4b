"""`agenttx._refs`: the `${...}` grammar and resolution (`docs/protocol.md#references`)."""

from __future__ import annotations

import copy
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agenttx
from agenttx import Dependency, JSONValueError, ReferenceSyntaxError, resolve_references
from agenttx._json import JSONValue, canonical_dumps, check_json
from agenttx._refs import (
    Reference,
    is_path_segment,
    is_plan_namespace,
    named_dependencies,
    parse_template,
    resolve_plan_value,
    resolve_value,
)
from agenttx._refs import _is_index as is_index
from agenttx._refs import _size_at_least as size_at_least
from agenttx.testing import json_scalars, json_values, step_sequences

# The outputs most tests resolve against: step 1 and step 2 completed, step 3 is running.
OUTPUTS: dict[int, JSONValue] = {
    1: {
        "id": 101,
        "ok": True,
        "none": None,
        "ratio": 1.5,
        "profile": {"email": "a@b.c", "tags": ["x", "y"], "name": "Ann"},
        "items": [{"sku": "s-0"}, {"sku": "s-1"}],
        "matrix": [[1, 2], [3, 4]],
        "by_pos": {"1": "one", "-1": "minus one"},
    },
    2: ["first", "second"],
}
CURRENT = 3


def resolve(
    arguments: object,
    outputs: dict | None = None,
    current_step: int = CURRENT,
    max_bytes: int | None = None,
):
    return resolve_references(
        arguments,
        OUTPUTS if outputs is None else outputs,
        current_step=current_step,
        max_bytes=max_bytes,
    )


def dep(step: int, source: str, target: str) -> Dependency:
    return Dependency(from_step=step, source_key=source, target_key=target)


def string_values(value: object) -> list[str]:
    """Every string value (not key) inside a JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in string_values(item)]
    if isinstance(value, dict):
        return [s for item in value.values() for s in string_values(item)]
    return []


def nested_lists(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


# ------------------------------------------------------------------------------ grammar


@pytest.mark.parametrize(
    "text",
    [
        "${steps.x.y}",
        "${steps.1.a b}",
        "$ {not a ref}",
        "${other.1}",
        "${steps.}",
        "${steps.1.}",
        "${steps.1..id}",
        "${steps.1.id",
        "${steps.-1.id}",
        "${steps.1.a.b$c}",
        "${steps.1.profile.e{mail}}",
        "${steps.1.ü}",
        "${Steps.1.id}",
        "${ steps.1.id}",
        "${steps.1.id }",
        "{steps.1.id}",
        "$steps.1.id",
    ],
)
def test_text_that_does_not_match_the_grammar_is_unchanged_with_no_dependency(text):
    """A string with no match of the reference regex is returned as it is, with no dependency."""
    result = resolve({"arg": text})
    assert result.ok
    assert result.value == {"arg": text}
    assert result.dependencies == ()


@pytest.mark.parametrize("text", ["${steps.x.y}", "${steps.1.a b}", "$ {not a ref}", "${other.1}"])
def test_non_matching_text_parses_as_one_literal(text):
    """In steps mode, text that does not match the grammar is a single literal piece."""
    assert parse_template(text) == (text,)


def test_parse_template_splits_literals_and_references():
    """parse_template yields literals and References in order, with step id and path."""
    assert parse_template("a ${steps.1.x.0} b ${steps.22}") == (
        "a ",
        Reference(text="${steps.1.x.0}", namespace="steps", step=1, path=("x", "0")),
        " b ",
        Reference(text="${steps.22}", namespace="steps", step=22, path=()),
    )


def test_parse_template_of_empty_text_is_empty():
    """The empty string has no pieces."""
    assert parse_template("") == ()


def test_segments_may_use_letters_digits_underscore_and_dash():
    """A segment is [A-Za-z0-9_-]+, so `_` and `-` are part of a key."""
    outputs = {1: {"user_id": {"first-name": "Ann"}}}
    result = resolve({"n": "${steps.1.user_id.first-name}"}, outputs)
    assert result.value == {"n": "Ann"}
    assert result.dependencies == (dep(1, "first-name", "n"),)


def test_reference_is_found_after_an_unterminated_one():
    """A broken reference is literal text and a valid one after it still resolves."""
    result = resolve({"a": "${steps.1.x${steps.1.id}"})
    assert result.value == {"a": "${steps.1.x101"}
    assert result.dependencies == (dep(1, "id", "a"),)


def test_step_id_with_leading_zero_names_the_same_step():
    """The step id is parsed as a decimal integer: `01` is step 1."""
    result = resolve({"a": "${steps.01.id}"})
    assert result.value == {"a": 101}
    assert result.dependencies == (dep(1, "id", "a"),)


# ------------------------------------------------------------------------------ what is scanned


def test_steps_n_without_path_yields_the_whole_output():
    """`${steps.N}` resolves to the step's entire output."""
    result = resolve({"all": "${steps.2}"})
    assert result.value == {"all": ["first", "second"]}
    assert result.dependencies == (dep(2, "all", "all"),)


def test_object_keys_are_never_resolved():
    """References in object keys are left alone and record nothing."""
    arguments = {"${steps.1.id}": 1, "x": {"${steps.2}": "plain"}}
    result = resolve(arguments)
    assert result.value == arguments
    assert list(result.value["x"]) == ["${steps.2}"]
    assert result.dependencies == ()


def test_numbers_booleans_and_null_pass_through():
    """Non-string scalars are returned unchanged."""
    arguments = {"n": 7, "f": -2.5, "t": True, "b": False, "z": None, "l": [0, None, 1e300]}
    result = resolve(arguments)
    assert result.ok
    assert result.value == arguments
    assert result.dependencies == ()


@pytest.mark.parametrize("scalar", [0, 1.25, True, False, None])
def test_top_level_scalar_arguments_pass_through(scalar):
    """Arguments that are a bare scalar come back unchanged."""
    result = resolve(scalar)
    assert result.value is scalar
    assert result.dependencies == ()


def test_strings_are_scanned_recursively_through_arrays_and_objects():
    """String values at any depth are resolved."""
    arguments = {"a": [{"b": ["${steps.1.id}", {"c": "v=${steps.1.ok}"}]}]}
    result = resolve(arguments)
    assert result.value == {"a": [{"b": [101, {"c": "v=true"}]}]}


# ------------------------------------------------------------------------------ whole-string


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${steps.1.id}", 101),
        ("${steps.1.ratio}", 1.5),
        ("${steps.1.ok}", True),
        ("${steps.1.none}", None),
        ("${steps.1.profile.email}", "a@b.c"),
        ("${steps.1.profile.tags}", ["x", "y"]),
        ("${steps.1.profile}", {"email": "a@b.c", "tags": ["x", "y"], "name": "Ann"}),
    ],
)
def test_whole_string_reference_keeps_the_json_type(text, expected):
    """A string that is exactly one reference becomes the referenced value, type preserved."""
    result = resolve({"v": text})
    assert result.ok
    assert result.value == {"v": expected}
    assert type(result.value["v"]) is type(expected)


def test_whole_string_reference_at_top_level():
    """Arguments that are a bare reference string resolve to the value itself."""
    result = resolve("${steps.1.id}")
    assert result.value == 101
    assert result.dependencies == (dep(1, "id", "id"),)


def test_whole_string_reference_returns_a_copy_not_an_alias():
    """Mutating a resolved object or array never changes the outputs mapping."""
    outputs = copy.deepcopy(OUTPUTS)
    before = copy.deepcopy(outputs)
    result = resolve({"p": "${steps.1.profile}", "all": "${steps.2}"}, outputs)
    profile = result.value["p"]
    assert profile == outputs[1]["profile"]
    assert profile is not outputs[1]["profile"]
    assert profile["tags"] is not outputs[1]["profile"]["tags"]
    assert result.value["all"] is not outputs[2]
    profile["tags"].append("z")
    profile["email"] = "changed"
    result.value["all"].clear()
    assert outputs == before


def test_same_reference_twice_gives_independent_copies():
    """Two whole-string references to one object do not share structure."""
    result = resolve(["${steps.1.profile}", "${steps.1.profile}"])
    first, second = result.value
    assert first == second
    assert first is not second
    assert first["tags"] is not second["tags"]


# ------------------------------------------------------------------------------ interpolation


def test_spec_example_of_embedded_interpolation():
    """The documented example interpolates strings verbatim and numbers as JSON."""
    text = "mail ${steps.1.profile.email} tag=${steps.1.profile.tags.1} id=${steps.1.id}"
    result = resolve({"body": text})
    assert result.value == {"body": "mail a@b.c tag=y id=101"}
    assert result.dependencies == (
        dep(1, "email", "body"),
        dep(1, "tags", "body"),
        dep(1, "id", "body"),
    )


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (101, "<101>"),
        (-3, "<-3>"),
        (1.5, "<1.5>"),
        (True, "<true>"),
        (False, "<false>"),
        (None, "<null>"),
        ([1, 2], "<[1,2]>"),
        ({"a": 1}, '<{"a":1}>'),
        ({"b": 1, "a": {"d": 2, "c": 3}}, '<{"a":{"c":3,"d":2},"b":1}>'),
        (["x", {"q": 'say "hi"\\'}], '<["x",{"q":"say \\"hi\\"\\\\"}]>'),
        ({"é": "ü"}, '<{"é":"ü"}>'),
        ([], "<[]>"),
        ({}, "<{}>"),
        ("plain", "<plain>"),
        ('with "quotes"', '<with "quotes">'),
        ("", "<>"),
    ],
)
def test_embedded_reference_is_interpolated(output, expected):
    """Strings go in verbatim; other values as compact JSON, sorted keys, nested strings quoted."""
    result = resolve({"s": "<${steps.1.v}>"}, {1: {"v": output}})
    assert result.ok
    assert result.value == {"s": expected}


def test_two_adjacent_references_are_both_interpolated():
    """`${a}${b}` is not a whole-string reference: both parts are joined as text."""
    result = resolve({"s": "${steps.1.id}${steps.1.profile.name}"})
    assert result.value == {"s": "101Ann"}


def test_embedded_whole_output_of_a_step():
    """`${steps.N}` inside text interpolates the whole output as JSON."""
    result = resolve({"s": "out=${steps.2}"})
    assert result.value == {"s": 'out=["first","second"]'}
    assert result.dependencies == (dep(2, "s", "s"),)


# ------------------------------------------------------------------------------ path walking


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${steps.2.0}", "first"),
        ("${steps.2.1}", "second"),
        ("${steps.2.01}", "second"),
        ("${steps.2.001}", "second"),
        ("${steps.1.items.1.sku}", "s-1"),
        ("${steps.1.matrix.1.0}", 3),
        ("${steps.1.by_pos.1}", "one"),
        ("${steps.1.by_pos.-1}", "minus one"),
    ],
)
def test_numeric_segments_index_arrays_and_objects_use_keys(text, expected):
    """Arrays are indexed by an unsigned integer segment (`01` is 1); objects by key text."""
    result = resolve({"v": text})
    assert result.ok, result.error
    assert result.value == {"v": expected}


@pytest.mark.parametrize(
    ("text", "segment"),
    [
        ("${steps.2.-1}", "-1"),
        ("${steps.2.2}", "2"),
        ("${steps.2.99999999999999999999999}", "99999999999999999999999"),
        ("${steps.1.items.1_0}", "1_0"),
        ("${steps.1.items.x}", "x"),
        ("${steps.1.by_pos.0}", "0"),
        ("${steps.1.id.x}", "x"),
        ("${steps.1.id.0}", "0"),
        ("${steps.1.profile.email.0}", "0"),
        ("${steps.1.none.x}", "x"),
        ("${steps.1.nope}", "nope"),
        ("${steps.1.profile.nope.deeper}", "nope"),
    ],
)
def test_segment_that_cannot_be_resolved_is_the_missing_key(text, segment):
    """`-1`, past-the-end and `1_0` do not index arrays; scalars cannot be indexed."""
    result = resolve({"v": text})
    assert not result.ok
    assert result.error == (
        f"unresolved reference {text}: key '{segment}' not present in output of step "
        f"{text.split('.')[1]}"
    )
    assert result.dependencies[-1] == dep(int(text.split(".")[1]), segment, segment)


@pytest.mark.parametrize(
    ("segment", "expected"),
    [
        ("0", True),
        ("01", True),
        ("123", True),
        ("-1", False),
        ("+1", False),
        ("1_0", False),
        ("1.0", False),
        ("", False),
        ("x", False),
        ("\u0661", False),  # ARABIC-INDIC DIGIT ONE
        ("\u00b2", False),  # SUPERSCRIPT TWO: str.isdigit() says True
        ("\uff11", False),  # FULLWIDTH DIGIT ONE
    ],
)
def test_only_ascii_digit_segments_are_indices(segment, expected):
    """A segment is an array index only if it is all ASCII digits."""
    assert is_index(segment) is expected


def test_non_ascii_digit_segment_is_not_a_reference():
    """A non-ASCII digit cannot appear in a segment, so the text stays literal."""
    text = "${steps.2.\u0661}"
    result = resolve({"v": text})
    assert result.value == {"v": text}
    assert result.dependencies == ()


# ------------------------------------------------------------------------------ failures


def test_missing_key_message_and_dependency():
    """A missing key fails with the exact message and a segment-to-segment dependency."""
    result = resolve({"v": "${steps.1.profile.phone}"})
    assert result.error == (
        "unresolved reference ${steps.1.profile.phone}: key 'phone' not present in output of step 1"
    )
    assert result.dependencies == (dep(1, "phone", "phone"),)


def test_missing_key_dependency_comes_after_earlier_ones():
    """The failing reference's dependency is appended after those resolved before it."""
    arguments = {"b": "x ${steps.1.id} ${steps.2.7}", "a": ["${steps.1.profile.tags.0}"]}
    result = resolve(arguments)
    assert result.error == (
        "unresolved reference ${steps.2.7}: key '7' not present in output of step 2"
    )
    assert result.dependencies == (
        dep(1, "tags", "a"),
        dep(1, "id", "b"),
        dep(2, "7", "7"),
    )


@pytest.mark.parametrize(
    ("text", "outputs", "current_step"),
    [
        ("${steps.5.id}", OUTPUTS, CURRENT),  # never ran
        ("${steps.3.id}", {**OUTPUTS, 3: {"id": 1}}, 3),  # the current step
        ("${steps.4.id}", {**OUTPUTS, 4: {"id": 1}}, 3),  # a later step
        ("${steps.2}", {1: OUTPUTS[1]}, CURRENT),  # rewound: not in the live outputs
        ("${steps.0}", OUTPUTS, CURRENT),  # steps are 1-based; 0 is not an output here
        ("${steps.99999999999.x}", OUTPUTS, CURRENT),  # overflows u32
        ("${steps.99999999999.x}", {99999999999: {"x": 1}}, 10**12),  # overflows u32
        ("${steps.4294967296}", {4294967296: 1}, 2**33),  # u32::MAX + 1
    ],
)
def test_reference_to_a_step_that_has_not_completed(text, outputs, current_step):
    """A step that is absent, not earlier than the current one, or over u32 fails, no dependency."""
    result = resolve({"v": text}, outputs, current_step)
    assert result.error == f"reference {text} points to a step that has not completed"
    assert result.dependencies == ()
    assert result.value == {"v": text}


def test_largest_u32_step_id_is_a_step():
    """Step id u32::MAX parses and resolves like any other completed step."""
    result = resolve({"v": "${steps.4294967295}"}, {4294967295: "max"}, 2**33)
    assert result.ok
    assert result.value == {"v": "max"}


def test_not_completed_keeps_earlier_dependencies_only():
    """The not-completed failure adds nothing for itself but keeps what came before."""
    result = resolve({"a": "${steps.1.id}", "b": "${steps.1.ok} ${steps.9.x}"})
    assert result.error == "reference ${steps.9.x} points to a step that has not completed"
    assert result.dependencies == (dep(1, "id", "a"), dep(1, "ok", "b"))


def test_first_failure_stops_resolution():
    """References after the first failure are not resolved and record nothing."""
    arguments = {
        "a": "${steps.1.id}",
        "b": "${steps.9.x} ${steps.1.nope}",
        "c": "${steps.1.missing}",
        "d": "${steps.1.ok}",
    }
    result = resolve(arguments)
    assert result.error == "reference ${steps.9.x} points to a step that has not completed"
    assert result.dependencies == (dep(1, "id", "a"),)


def test_first_failure_stops_resolution_within_a_string():
    """A failure in the middle of a string stops before the references to its right."""
    result = resolve({"s": "${steps.1.id} ${steps.1.nope} ${steps.1.ok}"})
    assert result.error == (
        "unresolved reference ${steps.1.nope}: key 'nope' not present in output of step 1"
    )
    assert result.dependencies == (dep(1, "id", "s"), dep(1, "nope", "nope"))


def test_failure_keeps_the_unresolved_arguments():
    """On failure, Resolution.value is the arguments as given, nothing substituted."""
    arguments = {"a": "${steps.1.id}", "b": ["x", "${steps.1.nope}"], "c": 3}
    snapshot = copy.deepcopy(arguments)
    result = resolve(arguments)
    assert not result.ok
    assert result.value == snapshot
    assert arguments == snapshot


def test_successful_resolution_is_ok_and_leaves_arguments_untouched():
    """On success error is None, ok is True, and the input arguments are not mutated."""
    arguments = {"a": "${steps.1.id}", "b": ["${steps.1.profile}"]}
    snapshot = copy.deepcopy(arguments)
    result = resolve(arguments)
    assert result.ok
    assert result.error is None
    assert arguments == snapshot


# ------------------------------------------------------------------------------ dependency keys


@pytest.mark.parametrize(
    ("text", "source"),
    [
        ("${steps.1.id}", "id"),
        ("${steps.1.profile.email}", "email"),
        ("${steps.1.profile.tags.1}", "tags"),
        ("${steps.1.matrix.1.0}", "matrix"),
        ("${steps.1.items.0.sku}", "sku"),
        ("${steps.1.by_pos.1}", "by_pos"),
        ("${steps.1.by_pos.-1}", "-1"),
        ("${steps.1}", "field"),
        ("${steps.2.1}", "field"),
        ("x ${steps.2.01} y", "field"),
    ],
)
def test_source_key_is_last_non_numeric_segment_else_the_field(text, source):
    """source_key is the last non-numeric segment, or the enclosing field if there is none."""
    result = resolve({"field": text})
    assert result.ok
    assert result.dependencies == (dep(int(text.split(".")[1].rstrip("}")), source, "field"),)


def test_target_key_is_the_nearest_enclosing_object_key():
    """target_key is the key of the nearest containing object, not an outer one."""
    result = resolve({"outer": {"inner": "${steps.1.id}"}})
    assert result.dependencies == (dep(1, "id", "inner"),)


def test_array_elements_inherit_the_field_that_holds_the_array():
    """Elements of an array, at any array depth, take the field holding the array."""
    result = resolve({"ids": ["${steps.1.id}", ["${steps.1.profile.email}"], {"k": "${steps.2}"}]})
    assert result.dependencies == (
        dep(1, "id", "ids"),
        dep(1, "email", "ids"),
        dep(2, "k", "k"),
    )


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("${steps.1.profile.email}", (dep(1, "email", "email"),)),
        ("to ${steps.1.profile.email}", (dep(1, "email", "email"),)),
        (
            ["${steps.1.id}", "${steps.1.profile.tags.0}"],
            (dep(1, "id", "id"), dep(1, "tags", "tags")),
        ),
        ("${steps.2.0}", (dep(2, "", ""),)),
        ("${steps.2}", (dep(2, "", ""),)),
    ],
)
def test_top_level_string_target_key_equals_source_key(arguments, expected):
    """With no enclosing object the field is "" and target_key is the source_key."""
    assert resolve(arguments).dependencies == expected


def test_one_dependency_per_occurrence_duplicates_kept():
    """Every occurrence records a dependency, even identical ones."""
    result = resolve({"a": "${steps.1.id}-${steps.1.id}", "b": ["${steps.1.id}", "${steps.1.id}"]})
    assert result.dependencies == (
        dep(1, "id", "a"),
        dep(1, "id", "a"),
        dep(1, "id", "b"),
        dep(1, "id", "b"),
    )


def test_dependency_order_is_sorted_fields_then_left_to_right():
    """Dependencies follow object fields in sorted key order, then references left to right."""
    arguments = {
        "z": "${steps.1.id}",
        "a": ["${steps.2.1} and ${steps.1.ok}"],
        "m": {"y": "${steps.1.profile.name}", "b": "${steps.1.ratio}"},
        "B": "${steps.1.none}",
    }
    result = resolve(arguments)
    assert result.ok
    assert result.dependencies == (
        dep(1, "none", "B"),
        dep(2, "a", "a"),
        dep(1, "ok", "a"),
        dep(1, "ratio", "b"),
        dep(1, "name", "y"),
        dep(1, "id", "z"),
    )
    assert result.value == {
        "z": 101,
        "a": ["second and true"],
        "m": {"y": "Ann", "b": 1.5},
        "B": None,
    }


# ------------------------------------------------------------------------------ no re-scan


def test_resolved_value_is_never_rescanned():
    """An output that contains reference text passes through as text."""
    outputs = {1: {"note": "${steps.1.secret}", "secret": "s3cr3t", "deep": ["${steps.1.secret}"]}}
    result = resolve(
        {"a": "${steps.1.note}", "b": "x ${steps.1.note}", "c": "${steps.1.deep}"}, outputs
    )
    assert result.ok
    assert result.value == {
        "a": "${steps.1.secret}",
        "b": "x ${steps.1.secret}",
        "c": ["${steps.1.secret}"],
    }
    assert result.dependencies == (dep(1, "note", "a"), dep(1, "note", "b"), dep(1, "deep", "c"))


def test_resolved_escape_text_is_not_unescaped():
    """An output containing `$${` is inserted as is, not turned into `${`."""
    result = resolve({"a": "[${steps.1.t}]", "b": "${steps.1.t}"}, {1: {"t": "$${x}"}})
    assert result.value == {"a": "[$${x}]", "b": "$${x}"}


# ------------------------------------------------------------------------------ escape


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$${", "${"),
        ("$${steps.1.id}", "${steps.1.id}"),
        ("cost: $${price} each", "cost: ${price} each"),
        ("a $${ b $${ c", "a ${ b ${ c"),
        ("$${steps.1.id}$${steps.2}", "${steps.1.id}${steps.2}"),
        ("$$", "$$"),
        ("$$$${", "$$${"),
    ],
)
def test_escape_writes_a_literal_dollar_brace_with_no_dependency(text, expected):
    """`$${` becomes a literal `${`, which is never resolved."""
    result = resolve({"s": text})
    assert result.ok
    assert result.value == {"s": expected}
    assert result.dependencies == ()


def test_escape_next_to_a_real_reference():
    """An escape and a reference in one string: only the reference resolves."""
    result = resolve({"s": "$${steps.1.id} is ${steps.1.id}"})
    assert result.value == {"s": "${steps.1.id} is 101"}
    assert result.dependencies == (dep(1, "id", "s"),)


def test_escaped_whole_string_stays_a_string():
    """`$${steps.1.id}` alone is literal text, not a whole-string reference."""
    result = resolve("$${steps.1.id}")
    assert result.value == "${steps.1.id}"
    assert result.dependencies == ()


def test_escape_then_reference_interpolates():
    """A trailing escape after a reference makes the string interpolated text."""
    result = resolve({"s": "${steps.1.id}$${"})
    assert result.value == {"s": "101${"}


def test_escape_merges_into_one_literal_piece():
    """parse_template joins an escape with its surrounding literal text."""
    assert parse_template("a$${b${steps.1}c") == (
        "a${b",
        Reference(text="${steps.1}", namespace="steps", step=1, path=()),
        "c",
    )


# ------------------------------------------------------------------------------ non-JSON arguments


def _self_list() -> list[object]:
    items: list[object] = [1]
    items.append(items)
    return items


def _self_dict() -> dict[str, object]:
    mapping: dict[str, object] = {}
    mapping["me"] = {"again": mapping}
    return mapping


@pytest.mark.parametrize(
    ("arguments", "path", "problem"),
    [
        ({1, 2}, "$", "set is not a JSON type"),
        ({"a": [1, {2}]}, "$.a[1]", "set is not a JSON type"),
        ({"a": (1, 2)}, "$.a", "tuple is not a JSON type"),
        ({"x": math.nan}, "$.x", "nan is not a finite number"),
        ([1, math.inf], "$[1]", "inf is not a finite number"),
        ({"bad key": -math.inf}, '$["bad key"]', "-inf is not a finite number"),
        ({1: "a"}, "$", "object key 1 is a int, not a string"),
        ({"outer": {None: "a"}}, "$.outer", "object key None is a NoneType"),
        (_self_list(), "$[1]", "the container contains itself"),
        (_self_dict(), "$.me.again", "the container contains itself"),
        (nested_lists(agenttx.MAX_NESTING_DEPTH + 1), "$" + "[0]" * 64, "nested deeper than 64"),
        ({"k": b"bytes"}, "$.k", "bytes is not a JSON type"),
    ],
)
def test_non_json_arguments_raise_json_value_error_naming_the_path(arguments, path, problem):
    """Arguments that are not JSON raise JSONValueError with the offending path."""
    with pytest.raises(JSONValueError) as info:
        resolve(arguments)
    assert info.value.path == path
    assert problem in info.value.problem
    assert "arguments" in str(info.value)
    assert path in str(info.value)
    assert isinstance(info.value, ValueError)


def test_nesting_up_to_the_limit_is_accepted():
    """Exactly MAX_NESTING_DEPTH nested containers is still a JSON value."""
    arguments = nested_lists(agenttx.MAX_NESTING_DEPTH)
    assert resolve(arguments).value == arguments


def test_non_json_arguments_raise_even_with_a_failing_reference():
    """The JSON check happens before any reference is looked at."""
    with pytest.raises(JSONValueError):
        resolve({"a": "${steps.9.x}", "b": {1, 2}})


# ------------------------------------------------------------------------------ plan mode


def test_plan_initial_reference():
    """`${initial.field}` parses to the `initial` namespace with the field as path."""
    assert parse_template("${initial.customer_email}", mode="plan") == (
        Reference(
            text="${initial.customer_email}",
            namespace="initial",
            step=None,
            path=("customer_email",),
        ),
    )


def test_plan_node_reference():
    """`${node_id.field}` parses to the node's namespace with the field as path."""
    assert parse_template("${customer_lookup.customer_id}", mode="plan") == (
        Reference(
            text="${customer_lookup.customer_id}",
            namespace="customer_lookup",
            step=None,
            path=("customer_id",),
        ),
    )


def test_plan_reference_keeps_surrounding_literal_text():
    """Literal text around plan references is kept in order."""
    pieces = parse_template("order:${initial.order_id}/${stock-check.rows.0.sku}!", mode="plan")
    assert pieces == (
        "order:",
        Reference(text="${initial.order_id}", namespace="initial", step=None, path=("order_id",)),
        "/",
        Reference(
            text="${stock-check.rows.0.sku}",
            namespace="stock-check",
            step=None,
            path=("rows", "0", "sku"),
        ),
        "!",
    )


def test_plan_escape_is_a_literal():
    """In a plan `$${` is a literal `${`, even when followed by malformed text."""
    assert parse_template("$${abc and $${} ${initial.x}", mode="plan") == (
        "${abc and ${} ",
        Reference(text="${initial.x}", namespace="initial", step=None, path=("x",)),
    )


def test_plan_text_without_references_is_one_literal():
    """Plan text with no `${` is returned as one literal piece."""
    assert parse_template("just text, $ and {} too", mode="plan") == ("just text, $ and {} too",)


@pytest.mark.parametrize(
    ("text", "position", "problem"),
    [
        ("${abc", 0, "no closing `}`"),
        ("x ${initial.a} ${abc", 15, "no closing `}`"),
        ("${}", 0, "empty reference `${}`"),
        ("${1abc.x}", 0, "`1abc` is not a namespace"),
        ("${ a.b}", 0, "` a` is not a namespace"),
        ("${a..b}", 0, "empty path segment"),
        ("${a.}", 0, "empty path segment"),
        ("pre ${a.b c} post", 4, "path segment `b c` may only use letters, digits, `_` and `-`"),
        ("${a.b$c}", 0, "path segment `b$c`"),
        ("${initial}", 0, "`${initial}` needs a field"),
        ("${steps.1.x}", 0, "`${steps.N}` references belong to interactive transactions"),
        ("ok ${initial.x} then ${steps.2}", 21, "belong to interactive transactions"),
    ],
)
def test_malformed_plan_reference_raises(text, position, problem):
    """A malformed plan reference raises ReferenceSyntaxError with its position and problem."""
    with pytest.raises(ReferenceSyntaxError) as info:
        parse_template(text, mode="plan")
    error = info.value
    assert error.text == text
    assert error.position == position
    assert problem in error.problem
    assert f"position {position}" in str(error)
    assert isinstance(error, ValueError)
    assert error.code == "malformed_reference"


def test_steps_mode_never_raises_on_malformed_text():
    """In steps mode the same malformed texts are literals, not errors."""
    for text in ("${abc", "${}", "${1abc.x}", "${a..b}", "${a.}", "${a.b c}", "${initial}"):
        assert parse_template(text) == (text,)


# ------------------------------------------------------------------------------ properties

_DOLLAR_HEAVY = st.text(alphabet=st.sampled_from(list("${}steps.0129ab_- ")))
_MIXED_TEXT = st.one_of(st.text(), _DOLLAR_HEAVY)


@given(st.text().filter(lambda s: "${" not in s))
def test_text_without_dollar_brace_is_unchanged(text):
    """A string with no `${` resolves to itself with no dependencies."""
    result = resolve({"k": text})
    assert result.value == {"k": text}
    assert result.dependencies == ()
    assert parse_template(text) == ((text,) if text else ())


@given(json_values().filter(lambda v: not any("${" in s for s in string_values(v))))
def test_json_without_references_resolves_to_itself(value):
    """Any JSON value whose string values contain no `${` is resolved to an equal value."""
    result = resolve(value)
    assert result.ok
    assert result.value == value
    assert canonical_dumps(result.value) == canonical_dumps(value)
    assert result.dependencies == ()


@given(json_values())
def test_whole_string_reference_returns_an_equal_value(value):
    """A whole-string reference to any JSON output gives back an equal, unaliased value."""
    for arguments, outputs in (("${steps.1.k}", {1: {"k": value}}), ("${steps.1}", {1: value})):
        result = resolve(arguments, outputs, current_step=2)
        assert result.ok
        assert result.value == value
        assert canonical_dumps(result.value) == canonical_dumps(value)
        if isinstance(value, (list, dict)):
            assert result.value is not value


@given(st.text())
def test_interpolating_a_string_is_verbatim(text):
    """Interpolating a string S into `a${steps.1.k}b` gives `a` + S + `b`."""
    result = resolve("a${steps.1.k}b", {1: {"k": text}}, current_step=2)
    assert result.value == "a" + text + "b"
    assert result.dependencies == (dep(1, "k", "k"),)


@given(json_values().filter(lambda v: not isinstance(v, str)))
def test_interpolating_a_non_string_is_canonical_json(value):
    """Interpolating a non-string V gives its compact sorted-key JSON text."""
    result = resolve({"f": "a${steps.1.k}b"}, {1: {"k": value}}, current_step=2)
    assert result.value == {"f": "a" + canonical_dumps(value) + "b"}


@given(_MIXED_TEXT)
def test_escaping_every_dollar_brace_gives_the_text_back(text):
    """For any text T, resolving T with each `${` written as `$${` yields T, no dependencies."""
    escaped = text.replace("${", "$${")
    result = resolve({"k": escaped})
    assert result.value == {"k": text}
    assert result.dependencies == ()
    assert parse_template(escaped) == ((text,) if text else ())


@given(_MIXED_TEXT.filter(lambda s: "$${" not in s))
def test_parse_template_pieces_concatenate_to_the_text(text):
    """Without escapes, literal pieces and reference texts join back to the input."""
    pieces = parse_template(text)
    assert "".join(p if isinstance(p, str) else p.text for p in pieces) == text
    assert all(piece != "" for piece in pieces)


_SEGMENT = st.text(alphabet=st.sampled_from(list("abcXYZ_-")), min_size=1, max_size=5)


@given(st.dictionaries(st.text(min_size=1, max_size=5), _SEGMENT, min_size=1, max_size=6))
def test_dependencies_follow_sorted_field_order(fields):
    """For fields mapping to output keys, dependencies come in sorted field order."""
    output = {key: f"v-{key}" for key in fields.values()}
    arguments = {field: f"${{steps.1.{key}}}" for field, key in fields.items()}
    result = resolve(arguments, {1: output}, current_step=2)
    assert result.ok
    assert result.value == {field: f"v-{key}" for field, key in fields.items()}
    assert result.dependencies == tuple(dep(1, fields[f], f) for f in sorted(fields))


@given(st.integers(min_value=1, max_value=2**40), st.integers(min_value=0, max_value=2**40))
def test_steps_at_or_after_the_current_one_never_resolve(step, current_step):
    """A reference to a step >= current_step fails as not completed, with no dependency."""
    current_step = min(current_step, step)
    result = resolve({"v": f"${{steps.{step}}}"}, {step: 1}, current_step)
    assert result.error == f"reference ${{steps.{step}}} points to a step that has not completed"
    assert result.dependencies == ()


# ------------------------------------------------------------------------------ no input raises
#
# Digit runs longer than the interpreter's int-to-str limit (4,300) used to reach int() and
# raise ValueError out of resolution; so did writing such an integer into text.

_LONG = "9" * 5000


@pytest.mark.parametrize(
    "text",
    [
        f"${{steps.{_LONG}.id}}",
        f"${{steps.{_LONG}}}",
        f"${{steps.1{'0' * 5000}}}",
        f"${{steps.{'0' * 5000}3}}",  # step 3 is the current step
        f"${{steps.{'0' * 5000}}}",  # step 0
    ],
    ids=["9*5000.id", "9*5000", "1 then 0*5000", "0*5000 then 3", "0*5000"],
)
def test_a_step_id_of_thousands_of_digits_has_not_completed(text):
    """A step id too long for int() is a step that has not completed, not a ValueError."""
    result = resolve({"v": text})
    assert result.error == f"reference {text} points to a step that has not completed"
    assert result.dependencies == ()
    assert result.value == {"v": text}


def test_leading_zeros_do_not_count_towards_the_step_id_digits():
    """Five thousand leading zeros still name step 1, as the u32 parse reads them."""
    result = resolve({"v": f"${{steps.{'0' * 5000}1.id}}"})
    assert result.value == {"v": 101}
    assert result.dependencies == (dep(1, "id", "v"),)


def test_a_step_id_of_thousands_of_digits_parses_to_no_step():
    """parse_template gives an id past u32 as 2**32, which names no step, however long it is."""
    (reference,) = parse_template(f"${{steps.{_LONG}.id}}")
    assert reference.step == 2**32
    assert reference.path == ("id",)
    (reference,) = parse_template(f"${{steps.{'0' * 5000}42}}")
    assert reference.step == 42


@pytest.mark.parametrize(
    "segment", [_LONG, "1" + "0" * 30, str(2**64)], ids=["9*5000", "10**30", "2**64"]
)
def test_an_index_of_many_digits_is_a_missing_key(segment):
    """An array index too long for int() or for any list is a missing key, not a ValueError."""
    text = f"${{steps.1.items.{segment}}}"
    result = resolve({"v": text})
    assert result.error == (
        f"unresolved reference {text}: key '{segment}' not present in output of step 1"
    )
    assert result.dependencies == (dep(1, segment, segment),)


def test_leading_zeros_do_not_count_towards_the_index_digits():
    """An index of five thousand zeros then 1 is index 1."""
    result = resolve({"v": f"${{steps.1.items.{'0' * 5000}1.sku}}"})
    assert result.value == {"v": "s-1"}


@pytest.mark.parametrize("sign", [1, -1], ids=["positive", "negative"])
def test_interpolating_an_integer_too_long_for_text_fails_the_step(sign):
    """Writing an integer past the int-to-str limit into text is an error string, not ValueError."""
    outputs = {1: {"n": sign * 10**5000, "id": 7}}
    result = resolve({"a": "${steps.1.id}", "b": "n=${steps.1.n}"}, outputs)
    assert result.error == (
        "reference ${steps.1.n} cannot be written into text: integer has more than 4300 digits"
    )
    assert result.dependencies == (dep(1, "id", "a"), dep(1, "n", "b"))
    assert result.value == {"a": "${steps.1.id}", "b": "n=${steps.1.n}"}


def test_a_whole_string_reference_to_a_long_integer_passes_it_on():
    """A whole-string reference never writes text, so even a very long integer is passed on."""
    result = resolve({"v": "${steps.1.n}"}, {1: {"n": 10**5000}})
    assert result.ok
    assert result.value == {"v": 10**5000}


_FRAGMENTS = st.sampled_from(
    [
        "${",
        "$${",
        "steps.",
        "${steps.",
        ".",
        "}",
        "$",
        "{",
        "id",
        "items",
        "n",
        "0",
        "1",
        "2",
        "-",
        "_",
        " ",
        "é",
        "\U0001f600",
    ]
)
_DIGIT_RUNS = st.builds(
    lambda digit, count, tail: digit * count + tail,
    st.sampled_from(["0", "1", "9"]),
    st.sampled_from([1, 10, 19, 20, 4300, 4301, 6000]),
    st.sampled_from(["", "1", "7"]),
)
_ADVERSARIAL_TEXT = st.lists(
    st.one_of(_FRAGMENTS, _DIGIT_RUNS, st.text(max_size=3)), max_size=12
).map("".join)
_ARGUMENTS = st.recursive(
    st.one_of(json_scalars(), _ADVERSARIAL_TEXT),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.text(max_size=4), children, max_size=3),
    ),
    max_leaves=10,
)
_OUTPUT = st.one_of(
    json_values(max_leaves=8),
    st.fixed_dictionaries(
        {"id": json_scalars(), "n": st.sampled_from([1, 10**4300 - 1, 10**4300])},
        optional={"items": st.lists(json_values(max_leaves=3), max_size=3)},
    ),
)


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def _nest(value: object, depth: int, kinds: list[bool]) -> object:
    """`value` wrapped in up to `depth` lists and objects, within MAX_NESTING_DEPTH in all."""
    depth = min(depth, agenttx.MAX_NESTING_DEPTH - _depth(value))
    for wrap_in_dict in kinds[:depth]:
        value = {"k": value} if wrap_in_dict else [value]
    return value


@given(
    _ARGUMENTS,
    st.dictionaries(st.integers(min_value=-2, max_value=6), _OUTPUT, max_size=5),
    st.one_of(st.integers(min_value=-3, max_value=8), st.integers()),
    # how deep to wrap the arguments, and in what: True an object, False a list
    st.tuples(
        st.integers(min_value=0, max_value=agenttx.MAX_NESTING_DEPTH),
        st.lists(st.booleans(), min_size=agenttx.MAX_NESTING_DEPTH, max_size=64),
    ),
    st.sampled_from([None, 0, 10, 10_000]),
)
def test_resolve_value_never_raises(arguments, outputs, current_step, nesting, max_bytes):
    """For any checked arguments and outputs, resolve_value returns (value, deps, error)."""
    arguments = _nest(arguments, *nesting)
    value, dependencies, error = resolve_value(
        check_json(arguments), outputs, current_step, max_bytes=max_bytes
    )
    assert error is None or (isinstance(error, str) and value == arguments)
    assert all(isinstance(d, Dependency) for d in dependencies)


_STEP_OUTPUTS = {step: f"<{step}>" for step in range(10)}


@given(_ADVERSARIAL_TEXT)
def test_resolution_reads_the_references_parse_template_finds(text):
    """Resolution and parse_template share one tokenizer: the same references, in order."""
    pieces = parse_template(text)
    references = [p for p in pieces if isinstance(p, Reference)]
    result = resolve({"v": text}, _STEP_OUTPUTS, current_step=10)
    # Every output is a string, so a reference with a path fails; so does a step past 9.
    bad = next((r for r in references if r.path or r.step not in _STEP_OUTPUTS), None)
    if bad is None:
        expected = "".join(p if isinstance(p, str) else f"<{p.step}>" for p in pieces)
        assert result.value == {"v": expected}
        assert [d.from_step for d in result.dependencies] == [r.step for r in references]
    else:
        assert result.error is not None
        assert f"reference {bad.text}" in result.error


# ------------------------------------------------------------------------------ max_bytes
#
# A megabyte of arguments holds some 80,000 references: to a large output, they would copy it
# 80,000 times. max_bytes bounds what references insert, so the copy cannot outgrow it.

_BIG = {1: "x" * 10_000, 2: {"rows": [{"id": n} for n in range(1_000)]}}


def test_references_past_max_bytes_fail_at_the_first_one_over():
    """Whole-string references stop at the one that passes max_bytes, which the error names."""
    result = resolve(["${steps.1}"] * 1_000, _BIG, current_step=3, max_bytes=50_000)
    assert result.error == "reference ${steps.1} takes what references insert past 50000 bytes"
    assert len(result.dependencies) == 5  # 10,002 bytes each: the fifth passes 50,000
    assert result.value == ["${steps.1}"] * 1_000


def test_interpolated_references_count_towards_max_bytes():
    """Text written into a string counts as well, a byte a character."""
    result = resolve({"t": "${steps.1}" * 10}, _BIG, current_step=3, max_bytes=50_000)
    assert result.error == "reference ${steps.1} takes what references insert past 50000 bytes"
    within = resolve({"t": "${steps.1}" * 5}, _BIG, current_step=3, max_bytes=50_000)
    assert within.value == {"t": "x" * 50_000}


def test_a_container_is_sized_before_it_is_copied():
    """A referenced object counts at least its compact JSON size."""
    size = len(canonical_dumps(_BIG[2]))
    assert resolve("${steps.2}", _BIG, current_step=3, max_bytes=size).ok
    result = resolve(["${steps.2}", "${steps.2}"], _BIG, current_step=3, max_bytes=size)
    assert result.error == f"reference ${{steps.2}} takes what references insert past {size} bytes"
    assert len(result.dependencies) == 2


@pytest.mark.parametrize("max_bytes", [-1, 1.5, "10", True])
def test_max_bytes_must_be_none_or_a_non_negative_int(max_bytes):
    """A bad max_bytes is misuse: InvalidArgument naming it."""
    with pytest.raises(agenttx.InvalidArgument, match=r"^max_bytes must be None or an int >= 0"):
        resolve("${steps.1}", max_bytes=max_bytes)


def test_without_max_bytes_there_is_no_bound():
    """max_bytes=None (the default) resolves any number of references."""
    result = resolve(["${steps.1}"] * 1_000, _BIG, current_step=3)
    assert result.ok
    assert len(result.value) == 1_000


@given(json_values(), st.sampled_from(["${steps.1}", "a${steps.1}b"]), st.integers(1, 5))
def test_max_bytes_of_the_resolved_size_never_fails(output, text, copies):
    """What references insert never counts more than the resolved arguments' UTF-8 JSON size."""
    arguments = [text] * copies
    resolved = resolve(arguments, {1: output}, current_step=2)
    assert resolved.ok
    size = len(canonical_dumps(resolved.value).encode())
    assert resolve(arguments, {1: output}, current_step=2, max_bytes=size) == resolved


@given(json_values())
def test_size_at_least_is_a_lower_bound_of_the_json_size(value):
    """The size counted for a value never exceeds its compact JSON size in UTF-8."""
    assert size_at_least(value, 10**9) <= len(canonical_dumps(value).encode())


@pytest.mark.parametrize("value", [0, 1, 9, 10, 511, 512, 1023, 1024, -512, 10**100, 2**4000])
def test_size_at_least_of_integers_is_at_most_their_length(value):
    """An integer counts at most its own digits and sign."""
    assert 1 <= size_at_least(value, 10**9) <= len(str(value))


# ---------------------------------------------------------------- named dependencies


def test_deep_shared_and_self_containing_arguments_are_walked_once():
    """Arguments given as Python objects: a 50,000-deep nesting, a list shared 1,000 times and a
    dict inside itself cost one visit per container and never raise RecursionError."""
    deep: object = "${steps.1.id}"
    for _ in range(50_000):
        deep = {"k": [deep]}
    shared = ["${steps.1.id}"]
    looped: dict[str, object] = {"x": "${steps.1.id}"}
    looped["self"] = looped
    found = named_dependencies({"deep": deep, "shared": [shared] * 1000, "looped": looped})
    assert [dependency.target_key for _, dependency in found] == ["k", "x", "shared"]


def test_named_dependencies_follow_resolution():
    """The dependencies named without outputs are those resolution records when it succeeds,
    in the same order (sorted fields, references left to right)."""
    arguments = {
        "z": "${steps.2.items.0}",
        "a": ["${steps.1}", {"b": "at ${steps.1.user.id} and ${steps.2.items.1.sku}"}],
        "raw": "$${steps.1.id}",
    }
    outputs = {1: {"user": {"id": 7}}, 2: {"items": ["x", {"sku": "s"}]}}
    resolution = resolve_references(arguments, outputs, current_step=3)
    assert resolution.ok
    found = named_dependencies(arguments)
    assert tuple(dependency for _, dependency in found) == resolution.dependencies
    assert [reference.text for reference, _ in found] == [
        "${steps.1}",
        "${steps.1.user.id}",
        "${steps.2.items.1.sku}",
        "${steps.2.items.0}",
    ]


@given(step_sequences(max_steps=6))
def test_named_dependencies_are_resolutions_whenever_it_succeeds(steps):
    """Over random reference chains: when a step's references resolve, the dependencies named
    without the outputs are exactly those resolution recorded, in order; when they do not,
    resolution's are a prefix of them, up to the failing one."""
    outputs: dict[int, JSONValue] = {}
    for step in steps:
        resolution = resolve_references(step.arguments, outputs, current_step=step.step_id)
        named = tuple(dependency for _, dependency in named_dependencies(step.arguments))
        if resolution.ok:
            assert named == resolution.dependencies
            outputs[step.step_id] = step.output
        else:
            found = resolution.dependencies
            assert [d.from_step for d in found] == [d.from_step for d in named[: len(found)]]


# ---------------------------------------------------------------------- plan namespaces


def test_plan_values_resolve_against_named_namespaces():
    """`resolve_plan_value` reads `initial` and node outputs by name, in strings at any depth."""
    namespaces = {"initial": {"sku": "S", "n": 2}, "stock": {"items": [{"id": "w-1"}]}}
    value = {"a": "${stock.items.0.id}", "b": ["x${initial.n}", "$${initial.sku}"], "c": 1}
    assert resolve_plan_value(value, namespaces) == (
        {"a": "w-1", "b": ["x2", "${initial.sku}"], "c": 1},
        None,
    )


def test_plan_values_are_strict():
    """In plan mode a malformed reference or a list written into text is an error, not text."""
    namespaces = {"initial": {"ids": [1, 2]}}
    assert resolve_plan_value("${initial.ids", namespaces)[1] is not None
    value, error = resolve_plan_value("ids: ${initial.ids}", namespaces)
    assert value == "ids: ${initial.ids}"
    assert error == (
        "reference ${initial.ids} is a list, which cannot be written into text; "
        "map it to an input of its own"
    )
    assert resolve_plan_value("${initial.ids}", namespaces) == ([1, 2], None)


def test_plan_namespaces_and_segments():
    """Node ids must open a reference; initial keys must be one path segment."""
    assert is_plan_namespace("stock_check")
    assert is_plan_namespace("a-b")
    assert not is_plan_namespace("9a")
    assert not is_plan_namespace("a.b")
    assert is_path_segment("0")
    assert not is_path_segment("a.b")
    assert not is_path_segment("")


@pytest.mark.parametrize(
    ("outputs", "current_step", "message"),
    [
        (None, 2, "outputs must be a mapping of step id to output, got NoneType"),
        ([{"x": 1}], 2, "outputs must be a mapping of step id to output, got list"),
        (5, 2, "outputs must be a mapping of step id to output, got int"),
        ({"1": {"x": 1}}, 2, r"outputs must be keyed by int step ids, got the key '1' \(str\)"),
        ({True: {"x": 1}}, 2, r"outputs must be keyed by int step ids, got the key True"),
        ({1: {"x": 1}}, "2", "current_step must be an int, got str"),
        ({1: {"x": 1}}, None, "current_step must be an int, got NoneType"),
        ({1: {"x": 1}}, 2.0, "current_step must be an int, got float"),
    ],
)
def test_misused_arguments_raise_invalid_argument_naming_them(outputs, current_step, message):
    """Outputs that are not a mapping of int step ids, or a current_step that is not an int,
    raise InvalidArgument (a ValueError) naming the argument, never a bare TypeError."""
    with pytest.raises(agenttx.InvalidArgument, match=message) as raised:
        resolve_references({"a": "${steps.1.x}"}, outputs, current_step=current_step)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(agenttx.InvalidArgument, match=message):
        resolve_references({"a": "plain"}, outputs, current_step=current_step)


def test_parse_template_of_a_non_string_raises_invalid_argument():
    """parse_template names a text that is not a string instead of raising TypeError."""
    with pytest.raises(agenttx.InvalidArgument, match="text must be a string, got int"):
        parse_template(5)  # type: ignore[arg-type]


# ---------------------------------------------------------------- key order


def _keys(value: object) -> object:
    """The keys of every object in `value`, in their order, at every depth."""
    if isinstance(value, dict):
        return [(key, _keys(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [_keys(item) for item in value]
    return None


#: JSON objects with no reference in them (a `${` would be resolved, not passed on).
_OBJECTS = st.dictionaries(st.text(max_size=8), json_values(max_leaves=12), max_size=5).filter(
    lambda value: "${" not in json.dumps(value)
)


@given(_OBJECTS)
def test_resolution_keeps_the_key_order_of_every_object(value):
    """Resolved arguments keep each object's keys in the order given, at every depth, though
    the dependencies follow sorted field order."""
    result = resolve_references({"b": value, "a": "${steps.1}"}, {1: value}, current_step=2)
    assert result.ok
    assert _keys(result.value) == _keys({"b": value, "a": value})


@given(_OBJECTS)
def test_a_tool_receives_every_object_in_the_key_order_sent(value):
    """A tool gets `list(keys)` of every object at every depth in the order the agent sent
    them, whether the arguments came as a mapping or as JSON text, or by a reference."""
    seen: list[object] = []

    @agenttx.tool(inline=True)
    def echo(value: dict) -> dict:
        seen.append(_keys(value))
        return {"value": value}

    tx = agenttx.Transaction(tools=[echo])
    assert tx.call("echo", {"value": value}).ok
    assert tx.call("echo", json.dumps({"value": value})).ok
    assert tx.call("echo", {"value": "${steps.1.value}"}).ok
    assert seen == [_keys(value)] * 3


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_tool_echoes_a_nested_object_in_the_order_sent(backend, tmp_path):
    """`{"b": 1, "a": {...}}` reaches the tool, and comes back in its output, with its keys
    in the order sent, on a MemoryStore and a SQLiteStore."""
    from agenttx.stores import MemoryStore, SQLiteStore  # noqa: PLC0415

    @agenttx.tool
    def echo(value: dict) -> dict:
        return value

    store = MemoryStore() if backend == "memory" else SQLiteStore(tmp_path / "s.db")
    tx = agenttx.Transaction(tools=[echo], store=store)
    sent = {"b": 1, "a": {"z": [{"y": 1, "x": 2}], "c": None}}
    result = tx.call("echo", {"value": sent})
    assert json.dumps(result.output) == json.dumps(sent)
    assert json.dumps(tx.steps[0].arguments) == json.dumps({"value": sent})
    tx.commit()
    if backend == "sqlite":
        store.close()


@given(
    step=st.integers(1, 50),
    key=st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True),
    field=st.from_regex(r"[a-z]{0,6}", fullmatch=True),
)
def test_a_resolved_dependency_is_the_one_the_class_builds(step, key, field):
    """A dependency that resolution records equals, hashes and prints as the `Dependency` the
    class builds, and is as frozen."""
    import attrs  # noqa: PLC0415

    text = f"${{steps.{step}.{key}}}"
    arguments = {field: text} if field else text
    resolution = resolve_references(arguments, {step: {key: 1}}, current_step=step + 1)
    (found,) = resolution.dependencies
    built = Dependency(from_step=step, source_key=key, target_key=field or key)
    assert type(found) is Dependency
    assert found == built
    assert hash(found) == hash(built)
    assert repr(found) == repr(built)
    assert copy.deepcopy(found) == built
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        found.from_step = 0
