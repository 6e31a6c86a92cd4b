"""JSON values: validation with a path, canonical text, scalar leaves and strict equality."""

from __future__ import annotations

import collections
import contextlib
import enum
import json
import math
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agenttx
from agenttx._json import (
    MAX_INT_DIGITS,
    canonical_dumps,
    check_json,
    check_json_sized,
    checked_size_bound,
    compact_encoder,
    scalar_leaves,
    value_tag,
)
from agenttx.testing import json_scalars, json_values


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


# ------------------------------------------------------------- one rule for every store
#
# What check_json accepts, every store can keep: canonical text that encodes as UTF-8 and reads
# back equal. Lone surrogates and integers past the int-to-str limit used to pass the check and
# fail later, in SQLiteStore, after the tool had run.


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        ("\ud800", "$", "string holds the surrogate U+D800 at index 0, which UTF-8 cannot encode"),
        (
            {"a": ["ok", "é\udfffx"]},
            "$.a[1]",
            "string holds the surrogate U+DFFF at index 1, which UTF-8 cannot encode",
        ),
        (
            # A pair of surrogates is two code points in a Python str: UTF-8 refuses both.
            ["\ud83d\ude00"],
            "$[0]",
            "string holds the surrogate U+D83D at index 0, which UTF-8 cannot encode",
        ),
        (
            {"k\ud800": 1},
            "$",
            (
                "object key 'k\\ud800' holds the surrogate U+D800 at index 1, "
                "which UTF-8 cannot encode"
            ),
        ),
        (
            {"outer": {"\udc80": "v"}},
            "$.outer",
            "object key '\\udc80' holds the surrogate U+DC80 at index 0, which UTF-8 cannot encode",
        ),
    ],
)
def test_strings_and_keys_that_utf8_cannot_encode_are_refused(value, path, problem):
    """A surrogate code point, in a string value or an object key, is refused with its path."""
    with pytest.raises(agenttx.JSONValueError) as caught:
        check_json(value, what="the output of tool 't'")
    assert (caught.value.path, caught.value.problem) == (path, problem)
    str(caught.value).encode()  # the message itself can be stored


@pytest.mark.parametrize("check", [check_json, checked_size_bound])
def test_the_size_bound_check_refuses_surrogates_and_huge_integers_too(check):
    """checked_size_bound applies the same rule as check_json, fast paths included."""
    for value in ["\ud800", {"\ud800": 1}, 10**4300, [-(10**4300)]]:
        with pytest.raises(agenttx.JSONValueError):
            check(value)


def test_valid_non_ascii_text_is_accepted():
    """Non-ASCII text that UTF-8 encodes (accents, CJK, emoji, U+FFFF) passes unchanged."""
    value = {"ключ": ["Zoë", "日本語", "\U0001f600", "\uffff", "\ue000"]}
    assert check_json(value) is value


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (10**MAX_INT_DIGITS, "$"),
        (-(10**MAX_INT_DIGITS), "$"),
        ({"n": [1, 10**5000]}, "$.n[1]"),
        ({"n": 2**100_000}, "$.n"),
    ],
    ids=["10**limit", "-10**limit", "10**5000 nested", "2**100000"],
)
def test_integers_of_more_than_the_digit_limit_are_refused(value, path):
    """An integer with more than MAX_INT_DIGITS digits is refused, without printing it."""
    with pytest.raises(agenttx.JSONValueError) as caught:
        check_json(value)
    assert caught.value.path == path
    assert caught.value.problem == f"integer has more than {MAX_INT_DIGITS} digits"


@pytest.mark.parametrize(
    "value",
    [10**MAX_INT_DIGITS - 1, -(10**MAX_INT_DIGITS - 1), 2**14000],
    ids=["10**limit-1", "-(10**limit-1)", "2**14000"],
)
def test_integers_up_to_the_digit_limit_round_trip(value):
    """The largest accepted integers are written and read back exactly."""
    assert check_json(value) is value
    assert json.loads(canonical_dumps(check_json({"n": value}))) == {"n": value}


@pytest.mark.skipif(not hasattr(sys, "set_int_max_str_digits"), reason="no int-to-str limit")
def test_a_lowered_interpreter_limit_lowers_the_digit_bound():
    """With the limit set to 640 digits, a 641-digit integer is refused, a 640-digit one kept."""
    saved = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        assert check_json(10**640 - 1) == 10**640 - 1
        with pytest.raises(agenttx.JSONValueError, match="more than 640 digits"):
            check_json([10**640])
        # A value checked before the limit was lowered: canonical_dumps still raises typed.
        with pytest.raises(agenttx.JSONValueError, match="more than 640 digits") as caught:
            canonical_dumps({"n": 10**700})
        assert caught.value.path == "$.n"
    finally:
        sys.set_int_max_str_digits(saved)


class _RaisingItems(dict):
    def items(self):
        raise RuntimeError("boom")


class _NotPairs(dict):
    def items(self):
        return [1, 2]


class _BadRepr:
    def __repr__(self):
        raise ValueError("no repr")


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        (_RaisingItems(a=1), "$", "reading the items of a _RaisingItems raised RuntimeError"),
        (
            {"out": [_RaisingItems()]},
            "$.out[0]",
            "reading the items of a _RaisingItems raised RuntimeError",
        ),
        (_NotPairs(a=1), "$", "reading the items of a _NotPairs raised TypeError"),
        ({(_BadRepr(),): 1}, "$", "object key <tuple> is a tuple, not a string"),
        (
            {"x" * 100: 1, b"k" * 100: 2},
            "$",
            "object key b'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\u2026 is a bytes, not a string",
        ),
    ],
)
def test_foreign_objects_that_misbehave_give_a_typed_error(value, path, problem):
    """An items() that raises, or a key whose repr raises, gives JSONValueError, nothing else."""
    with pytest.raises(agenttx.JSONValueError) as caught:
        check_json(value)
    assert (caught.value.path, caught.value.problem) == (path, problem)


def test_subclasses_of_json_types_come_back_as_plain_copies():
    """OrderedDict, IntEnum, str-enum and list subclasses are copied into the exact types."""

    class Level(enum.IntEnum):
        HIGH = 7

    class Colour(str, enum.Enum):
        RED = "red"

    class Ratio(float):
        pass

    class Items(list):
        pass

    value = {"o": collections.OrderedDict(b=Level.HIGH, a=Items([Colour.RED, Ratio(0.5)]))}
    plain = check_json(value)
    assert plain == {"o": {"b": 7, "a": ["red", 0.5]}}
    assert type(plain["o"]) is dict
    assert [type(x) for x in (plain["o"]["b"], plain["o"]["a"], *plain["o"]["a"])] == [
        int,
        list,
        str,
        float,
    ]
    assert check_json_sized(value) == (plain, checked_size_bound(plain))


def test_a_subclass_is_read_once_so_later_calls_cannot_change_the_value():
    """The copy is taken in the check: a dict whose items() changes later cannot alter it."""
    calls = []

    class Flaky(dict):
        def items(self):
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("second read")
            return super().items()

    plain = check_json({"out": Flaky(a=1)})
    assert calls == [1]
    assert canonical_dumps(plain) == '{"out":{"a":1}}'


def test_a_cycle_through_a_subclass_is_refused():
    """A subclassed container that contains itself is named as such."""
    loop = collections.OrderedDict()
    loop["self"] = loop
    with pytest.raises(agenttx.JSONValueError, match="contains itself") as caught:
        check_json({"a": loop})
    assert caught.value.path == "$.a.self"


def test_deep_nesting_through_subclasses_is_refused():
    """Subclassed containers count towards MAX_NESTING_DEPTH as plain ones do."""

    class Deep(list):
        pass

    value: object = 1
    for _ in range(100_000):
        value = Deep([value])
    with pytest.raises(agenttx.JSONValueError, match="deeper than"):
        check_json(value)


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        ({1, 2}, "$", "set is not a JSON type"),
        ([10**5000], "$[0]", f"integer has more than {MAX_INT_DIGITS} digits"),
        (10**5000, "$", f"integer has more than {MAX_INT_DIGITS} digits"),
        (_RaisingItems(a=1), "$", "reading the items of a _RaisingItems raised RuntimeError"),
    ],
    ids=["set", "huge int nested", "huge int", "items raises"],
)
def test_canonical_dumps_raises_only_json_value_error(value, path, problem):
    """canonical_dumps of what is not JSON raises JSONValueError naming the part, not TypeError."""
    with pytest.raises(agenttx.JSONValueError) as caught:
        canonical_dumps(value)
    assert (caught.value.path, caught.value.problem) == (path, problem)


def _text_with_surrogates() -> st.SearchStrategy[str]:
    surrogate = st.characters(categories=["Cs"])
    return st.lists(st.one_of(st.characters(), surrogate), max_size=6).map("".join)


def _anything() -> st.SearchStrategy[object]:
    """JSON-like values with every way to be wrong: surrogates, huge integers, NaN, subclasses."""
    scalars = st.one_of(
        json_scalars(),
        _text_with_surrogates(),
        st.floats(),
        # Built, not sampled: hypothesis cannot repr an integer past the int-to-str limit.
        st.builds(_near_the_digit_limit, st.integers(-2, 2), st.booleans()),
        st.builds(_Text, st.text(max_size=4)),
        st.builds(_Number, st.integers()),
        st.just(b"bytes"),
    )
    keys = st.one_of(st.text(max_size=4), _text_with_surrogates(), st.integers())
    return st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(keys, children, max_size=4),
            st.dictionaries(st.text(max_size=4), children, max_size=4).map(collections.OrderedDict),
            st.lists(children, max_size=3).map(tuple),
        ),
        max_leaves=12,
    )


def _near_the_digit_limit(offset: int, negative: bool) -> int:
    value = 10**MAX_INT_DIGITS + offset
    return -value if negative else value


class _Text(str):
    __slots__ = ()


class _Number(int):
    pass


@given(_anything())
def test_what_check_json_accepts_every_store_can_keep(value):
    """check_json raises only JSONValueError; what it returns dumps, encodes and reads back."""
    try:
        checked = check_json(value)
    except agenttx.JSONValueError:
        with contextlib.suppress(agenttx.JSONValueError):  # or NaN written as json.dumps does
            canonical_dumps(value)
        return
    text = canonical_dumps(checked)
    assert json.loads(text.encode("utf-8")) == checked
    assert checked_size_bound(checked) >= len(text.encode("utf-8"))
