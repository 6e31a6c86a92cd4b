"""The 35 Clean Hint rules, in priority order (`docs/protocol.md#hint-rules`).

Each rule has a name, a category, its alternatives (patterns built with `_scan`), the groups
that name its key, and a template. `_hints.clean_error` applies them.
"""

from __future__ import annotations

import enum
import functools
from typing import TYPE_CHECKING, Final, TypeAlias, final

import attrs

from ._scan import (
    _MYSQL_FK_OPEN,
    _alt,
    _http_status,
    _locate_field_required,
    _locate_input_should_be,
    _locate_missing_argument,
    _locate_mysql_foreign_key,
    _locate_pg_foreign_key,
    _locate_pg_unique,
    _locate_required_property,
    _locate_type_mismatch,
    _locate_unavailable,
    _locate_unresolved,
    _Pattern,
    _Scan,
    _word,
)
from ._templates import (
    Groups,
    _duplicate_call_id,
    _field_of_found,
    _file_not_found,
    _first_column,
    _fixed,
    _foreign_key,
    _get,
    _java_npe,
    _output_mismatch,
    _permission_denied,
    _singular,
    _unknown_field,
)

if TYPE_CHECKING:
    import re
    from collections.abc import Callable


class HintCategory(str, enum.Enum):
    """What kind of failure a hint describes; values are those of `docs/protocol.md#clean-hints`."""

    FOREIGN_KEY_VIOLATION = "foreign_key_violation"
    UNIQUE_VIOLATION = "unique_violation"
    NOT_NULL_VIOLATION = "not_null_violation"
    MISSING_SCHEMA_OBJECT = "missing_schema_object"
    MISSING_RECORD = "missing_record"
    MISSING_KEY = "missing_key"
    MISSING_ARGUMENT = "missing_argument"
    NULL_REFERENCE = "null_reference"
    INVALID_VALUE = "invalid_value"
    UNRESOLVED_REFERENCE = "unresolved_reference"
    UNKNOWN_TOOL = "unknown_tool"
    FILE_NOT_FOUND = "file_not_found"
    PERMISSION_DENIED = "permission_denied"
    AUTHENTICATION = "authentication"
    RATE_LIMITED = "rate_limited"
    HTTP_CLIENT_ERROR = "http_client_error"
    HTTP_SERVER_ERROR = "http_server_error"
    TIMEOUT = "timeout"
    CONNECTION_FAILURE = "connection_failure"
    MALFORMED_JSON = "malformed_json"
    UNKNOWN = "unknown"

    @property
    def transient(self) -> bool:
        """True for failures a plain retry may cure: timeouts, 429s, 5xx, failed connections."""
        return self in _TRANSIENT


_TRANSIENT: Final = frozenset(
    {
        HintCategory.TIMEOUT,
        HintCategory.RATE_LIMITED,
        HintCategory.HTTP_SERVER_ERROR,
        HintCategory.CONNECTION_FAILURE,
    }
)


@final
@attrs.frozen
class _Rule:
    """A rule: its name and category, its alternatives, and how it renders and names a key."""

    name: str
    category: HintCategory
    patterns: tuple[_Pattern, ...]
    key_groups: tuple[str, ...]
    render: Callable[[Groups], str]
    #: Where the key comes from when no key group captured one (a rule with no key group).
    key_from: Callable[[Groups], str | None] | None = None

    def find(self, patterns: tuple[_Pattern, ...], scan: _Scan) -> re.Match[str] | None:
        """The leftmost match of `patterns`, the candidates among this rule's alternatives."""
        # A search for `A|B|C` returns the leftmost position where an alternative matches,
        # trying them in order there. Searching for each alone and keeping the leftmost match,
        # the earlier alternative on a tie, returns the same match, and lets each be found its way.
        best: re.Match[str] | None = None
        for pattern in patterns:
            match = pattern.find(scan)
            if match is not None and (best is None or match.start() < best.start()):
                best = match
        return best


#: Per rule: the rule, its candidate patterns, and literals one of which any match contains.

_Candidates: TypeAlias = "tuple[tuple[_Rule, tuple[_Pattern, ...], tuple[str, ...], bool], ...]"


@functools.lru_cache(maxsize=256)
def _candidates(signature: int) -> _Candidates:
    """The rules in priority order, each with its patterns that the signature allows."""
    found: list[tuple[_Rule, tuple[_Pattern, ...], tuple[str, ...], bool]] = []
    for rule in _RULES:
        patterns = tuple(p for p in rule.patterns if p.possible(signature))
        if patterns:
            # Each pattern needs one literal of its first group: one of these must occur.
            first = tuple(dict.fromkeys(n for p in patterns for n in p.needles[0]))
            folded = patterns[0].folded
            if found and found[-1][2] == first and found[-1][3] == folded:
                first = found[-1][2]  # the same object: `clean_error` checks it once
            found.append((rule, patterns, first, folded))
    return tuple(found)


# ---------------------------------------------------------------- the rules, in priority order
#
# Each `_alt` lists literals its matches contain, rarest first; they are only a quick way to skip
# the pattern, never a condition of their own.


_C = HintCategory
_KEY3 = ("key", "key2", "key3")

_RULES: Final[tuple[_Rule, ...]] = (
    # --- agenttx protocol errors
    _Rule(
        "unresolved_reference",
        _C.UNRESOLVED_REFERENCE,
        (
            _alt(
                r"unresolved reference \$\{steps\.(?P<step>\d+)(?!\d)[^}]*\}: "
                r"key '(?P<key>[^']+)' not present in output of step \d+",
                "}: key '",
                "unresolved reference ${steps.",
                locate=_locate_unresolved,
            ),
        ),
        ("key",),
        lambda g: (
            f"Hint: Step {_get(g, 'step')} output has no '{_get(g, 'key')}'. Re-run step "
            f"{_get(g, 'step')} so it returns '{_get(g, 'key')}', or fix the reference."
        ),
    ),
    _Rule(
        "unavailable_step_reference",
        _C.UNRESOLVED_REFERENCE,
        (
            _alt(
                r"reference \$\{steps\.(?P<step>\d+)(?!\d)[^}]*\} "
                r"points to a step that has not completed",
                "} points to a step that has not completed",
                "reference ${steps.",
                locate=_locate_unavailable,
            ),
        ),
        (),
        lambda g: (
            f"Hint: Step {_get(g, 'step')} has not completed; "
            "only reference outputs of earlier successful steps."
        ),
    ),
    _Rule(
        "unknown_tool",
        _C.UNKNOWN_TOOL,
        (
            _alt(
                r"unknown tool '(?P<tool>[^']*)'; registered tools: (?P<tools>[^\n]*)",
                "'; registered tools: ",
                "unknown tool '",
            ),
        ),
        (),
        lambda g: f"Hint: Tool '{_get(g, 'tool')}' does not exist. Use one of: {_get(g, 'tools')}.",
    ),
    # A plan node's output that does not fit its tool's `TypedDict` return type
    # (`_plans._checks.OutputCheck`): the field's message is the argument validator's, which the
    # rules below would take for the arguments' fault. Linear as searched: {tool} stops at a `'`,
    # which the leading literal ends with, so the runs from two starts do not overlap and each
    # start reaches at most one occurrence of the second literal; {type} and {field} are at most
    # 128 characters after their own literal; {why} runs to the end of the line and ends the match.
    _Rule(
        "output_mismatch",
        _C.INVALID_VALUE,
        (
            _alt(
                r"output of tool '(?P<tool>[^'\n]{1,128})' does not match its return type "
                r"(?P<type>[^:\n]{1,128}): (?:expected an object, got (?P<got>\w+)"
                r"|field `(?P<field>[^`\n]{1,128})`(?: is missing|: (?P<why>[^\n]+)))",
                "' does not match its return type ",
                "output of tool '",
            ),
        ),
        (),
        _output_mismatch,
    ),
    # --- SQL constraint violations
    _Rule(
        "pg_foreign_key",
        _C.FOREIGN_KEY_VIOLATION,
        (
            _alt(
                r"Key \((?P<key>[^)]+)\)=\((?P<value>[^)]*)\) "
                r"is not present in table \"(?P<table>[^\"]+)\"",
                ")=(",
                ') is not present in table "',
                "Key (",
                locate=_locate_pg_foreign_key,
            ),
        ),
        ("key",),
        _foreign_key,
    ),
    _Rule(
        "mysql_foreign_key",
        _C.FOREIGN_KEY_VIOLATION,
        (
            _alt(
                r"foreign key constraint fails \(.*?"
                r"FOREIGN KEY \(`(?P<key>[^`]+)`\) REFERENCES `(?P<table>[^`]+)`",
                "`) REFERENCES `",
                _MYSQL_FK_OPEN,
                locate=_locate_mysql_foreign_key,
            ),
        ),
        ("key",),
        _foreign_key,
    ),
    _Rule(
        "sqlite_foreign_key",
        _C.FOREIGN_KEY_VIOLATION,
        (_alt(r"FOREIGN KEY constraint failed", "FOREIGN KEY constraint failed"),),
        (),
        _fixed(
            "Hint: Foreign key constraint failed. "
            "Ensure every referenced row exists before step execution."
        ),
    ),
    _Rule(
        "pg_unique",
        _C.UNIQUE_VIOLATION,
        (
            _alt(
                r"Key \((?P<key>[^)]+)\)=\((?P<value>[^)]*)\) already exists",
                ")=(",
                ") already exists",
                "Key (",
                locate=_locate_pg_unique,
            ),
        ),
        ("key",),
        lambda g: (
            f"Hint: Unique constraint violated for '{_first_column(_get(g, 'key'))}' "
            f"(value '{_get(g, 'value')}' already exists). "
            "Use a new value or update the existing row."
        ),
    ),
    _Rule(
        "mysql_duplicate",
        _C.UNIQUE_VIOLATION,
        (
            _alt(
                r"Duplicate entry '(?P<value>[^']*)' for key '(?:[^'.]*\.)?(?P<key>[^']+)'",
                "Duplicate entry '",
                "' for key '",
            ),
        ),
        ("key",),
        lambda g: (
            f"Hint: Unique constraint violated for '{_get(g, 'key')}' "
            f"(value '{_get(g, 'value')}' already exists). "
            "Use a new value or update the existing row."
        ),
    ),
    _Rule(
        "sqlite_unique",
        _C.UNIQUE_VIOLATION,
        (_alt(r"UNIQUE constraint failed: (?:\w+\.)?(?P<key>\w+)", "UNIQUE constraint failed: "),),
        ("key",),
        lambda g: (
            f"Hint: Unique constraint violated for '{_get(g, 'key')}'. "
            "Use a new value or update the existing row."
        ),
    ),
    _Rule(
        "not_null",
        _C.NOT_NULL_VIOLATION,
        (
            _alt(
                r"null value in column \"(?P<key>[^\"]+)\"(?: of relation \"[^\"]+\")? "
                r"violates not-null constraint",
                'null value in column "',
                " violates not-null constraint",
            ),
            _alt(r"Column '(?P<key2>[^']+)' cannot be null", "Column '", "' cannot be null"),
            _alt(
                r"NOT NULL constraint failed: (?:\w+\.)?(?P<key3>\w+)",
                "NOT NULL constraint failed: ",
            ),
        ),
        _KEY3,
        lambda g: (
            f"Hint: Column '{_get(g, *_KEY3)}' must not be null. "
            f"Provide a value for '{_get(g, *_KEY3)}'."
        ),
    ),
    _Rule(
        "missing_column",
        _C.MISSING_SCHEMA_OBJECT,
        (
            _alt(
                r"column \"(?P<key>[^\"]+)\"(?: of relation \"[^\"]+\")? does not exist",
                '" does not exist',
                'column "',
            ),
            _alt(r"no such column: (?:\w+\.)?(?P<key2>\w+)", "no such ", "no such column: "),
            _alt(r"Unknown column '(?:[^'.]*\.)?(?P<key3>[^']+)'", "Unknown column '"),
        ),
        _KEY3,
        lambda g: (
            f"Hint: Column '{_get(g, *_KEY3)}' does not exist. "
            "Check the schema and use an existing column."
        ),
    ),
    _Rule(
        "missing_table",
        _C.MISSING_SCHEMA_OBJECT,
        (
            _alt(
                r"relation \"(?P<table>[^\"]+)\" does not exist", '" does not exist', 'relation "'
            ),
            _alt(r"no such table: (?P<table2>[\w.]+)", "no such ", "no such table: "),
            _alt(r"Table '(?:[^'.]*\.)?(?P<table3>[^']+)' doesn't exist", "' doesn't exist"),
        ),
        (),
        lambda g: (
            f"Hint: Table '{_get(g, 'table', 'table2', 'table3')}' does not exist. "
            "Create it first or use an existing table."
        ),
    ),
    _Rule(
        "record_not_found",
        _C.MISSING_RECORD,
        (
            _alt(
                r"no row with (?P<key>\w+)=(?P<value>\S+) in table \"(?P<table>[^\"]+)\"",
                ' in table "',
                "=",
                "no row with ",
            ),
        ),
        ("key",),
        lambda g: (
            f"Hint: No {_singular(_get(g, 'table'))} with {_get(g, 'key')}={_get(g, 'value')} "
            f"exists. Create it in an earlier step or use an existing {_get(g, 'key')}."
        ),
    ),
    # --- payload and language runtime errors
    _Rule(
        "missing_field",
        _C.MISSING_ARGUMENT,
        (
            _alt(r"missing field `(?P<key>[^`]+)`", "missing field `"),
            _alt(
                r"(?P<key2>\w+)[^\S\n]*\n\s*Field required",
                "Field required",
                locate=_locate_field_required,
            ),
            _alt(
                r"'(?P<key3>[^']+)' is a required property",
                "' is a required property",
                locate=_locate_required_property,
            ),
        ),
        _KEY3,
        lambda g: (
            f"Hint: Required field '{_get(g, *_KEY3)}' is missing from the arguments. "
            f"Provide '{_get(g, *_KEY3)}' explicitly."
        ),
    ),
    _Rule(
        "python_key_error",
        _C.MISSING_KEY,
        (_alt(r"KeyError: ['\"](?P<key>[^'\"]+)['\"]", "KeyError: ", ("'", '"')),),
        ("key",),
        lambda g: (
            f"Hint: Missing key '{_get(g, 'key')}' in input payload. "
            f"Verify the upstream step output provides '{_get(g, 'key')}'."
        ),
    ),
    _Rule(
        "python_missing_argument",
        _C.MISSING_ARGUMENT,
        (
            _alt(
                r"(?P<func>\w+)\(\) missing \d+ required (?:positional |keyword-only )?"
                r"arguments?: '(?P<key>[^']+)'",
                "() missing ",
                ": '",
                locate=_locate_missing_argument,
            ),
        ),
        ("key",),
        lambda g: (
            f"Hint: {_get(g, 'func')}() requires argument '{_get(g, 'key')}'. "
            f"Pass '{_get(g, 'key')}' in the tool arguments."
        ),
    ),
    _Rule(
        "null_attribute",
        _C.NULL_REFERENCE,
        (
            _alt(
                r"'NoneType' object has no attribute '(?P<key>\w+)'",
                "'NoneType' object has no attribute '",
            ),
            _alt(
                r"Cannot read propert(?:y|ies) of (?:undefined|null) \(reading '(?P<key2>[^']+)'\)",
                " (reading '",
                "Cannot read propert",
            ),
        ),
        ("key", "key2"),
        lambda g: (
            f"Hint: Accessed '{_get(g, 'key', 'key2')}' on a null value. "
            "Ensure the upstream step returns a non-null object."
        ),
    ),
    _Rule(
        "java_npe",
        _C.NULL_REFERENCE,
        (
            _alt(
                r"java\.lang\.NullPointerException"
                r"(?:: Cannot invoke \"(?P<method>[^\"]+)\" because \"(?P<key>[^\"]+)\" is null)?",
                "java.lang.NullPointerException",
            ),
            _alt(
                r"Cannot invoke \"(?P<method2>[^\"]+)\" because \"(?P<key2>[^\"]+)\" is null",
                'Cannot invoke "',
                '" because "',
            ),
        ),
        ("key", "key2"),
        _java_npe,
    ),
    _Rule(
        "invalid_integer",
        _C.INVALID_VALUE,
        (
            _alt(
                r"invalid literal for int\(\) with base \d+: '(?P<value>[^']*)'",
                ": '",
                "invalid literal for int() with base ",
            ),
            _alt(
                r"NumberFormatException: For input string: \"(?P<value2>[^\"]*)\"",
                'NumberFormatException: For input string: "',
            ),
        ),
        (),
        lambda g: (
            f"Hint: '{_get(g, 'value', 'value2')}' is not a valid integer. Pass a numeric value."
        ),
    ),
    _Rule(
        "type_mismatch",
        _C.INVALID_VALUE,
        (
            _alt(
                r"invalid type: (?P<found>[^,\n]+), expected (?P<expected>[^\n]+?)"
                r"(?: at line \d+ column \d+)?\Z",
                ", expected ",
                "invalid type: ",
                locate=_locate_type_mismatch,
            ),
        ),
        (),
        lambda g: (
            f"Hint: Wrong argument type: got {_get(g, 'found')}, expected {_get(g, 'expected')}."
        ),
        _field_of_found,
    ),
    # --- arguments that do not fit a tool's spec (`docs/protocol.md#argument-validation`).
    # Linear as searched: {found} is at most 120 characters, and {key} stops at a backtick,
    # which every occurrence of the leading literal holds.
    _Rule(
        "invalid_value",
        _C.INVALID_VALUE,
        (
            _alt(
                r"invalid value: (?P<found>[^\n]{1,120}?) for field `(?P<key>[^`\n]+)`, "
                r"expected (?P<expected>[^\n]+)",
                " for field `",
                "invalid value: ",
            ),
            # pydantic's ValidationError: the field's location on the line before its message,
            # `{found}` from the `[type=...]` tail when there is one. Matched where the locator
            # puts the leftmost start; each group after the prefix is bounded or runs to a `[`
            # or the end of the line, and the optional tail cannot fail the match.
            _alt(
                r"(?P<key2>\w+)[^\S\n]*\n\s*Input should be[^\S\n]*(?P<expected2>[^\n\[]*)"
                r"(?:\[type=\w+, input_value=(?P<found2>[^\n]{0,120}?), input_type=\w+\])?",
                "Input should be",
                locate=_locate_input_should_be,
            ),
        ),
        ("key", "key2"),
        lambda g: (
            f"Hint: Invalid value for '{_get(g, 'key', 'key2')}': "
            f"got {_get(g, 'found', 'found2')}, expected {_get(g, 'expected', 'expected2')}."
        ),
    ),
    _Rule(
        "unknown_field",
        _C.INVALID_VALUE,
        (
            _alt(
                r"unknown field `(?P<key>[^`\n]+)`, "
                r"(?:expected (?P<expected>[^\n]+)|there are no fields)",
                "unknown field `",
            ),
        ),
        ("key",),
        _unknown_field,
    ),
    # A call id sent again (`_prepare.duplicate_call_id`). Linear as searched: the call id, which
    # may hold any character, is at most 256 characters, so each occurrence of the leading
    # literal is followed for at most 256 characters.
    _Rule(
        "duplicate_call_id",
        _C.INVALID_VALUE,
        (
            _alt(
                r"duplicate call id: '(?P<call_id>(?s:.{1,256}?))' "
                r"is the call id of step (?P<step>\d+)",
                "duplicate call id: '",
                "' is the call id of step ",
            ),
        ),
        (),
        _duplicate_call_id,
    ),
    # --- filesystem
    _Rule(
        "path_escape",
        _C.PERMISSION_DENIED,
        (_alt(r"path '(?P<path>[^']*)' escapes the sandbox", "' escapes the sandbox", "path '"),),
        (),
        lambda g: (
            f"Hint: Path '{_get(g, 'path')}' is outside the sandbox. "
            "Use a relative path without '..'."
        ),
    ),
    _Rule(
        "file_not_found",
        _C.FILE_NOT_FOUND,
        (
            _alt(
                r"No such file or directory(?: \(os error 2\))?(?:: '(?P<path>[^']+)')?",
                "No such file or directory",
            ),
            _alt(
                r"ENOENT: no such file or directory, \w+ '(?P<path2>[^']+)'",
                "ENOENT: no such file or directory, ",
                "'",
            ),
            _alt(r"FileNotFoundException: (?P<path3>\S+)", "FileNotFoundException: "),
        ),
        (),
        _file_not_found,
    ),
    _Rule(
        "permission_denied",
        _C.PERMISSION_DENIED,
        (
            _alt(
                r"Permission denied(?: \(os error 13\))?(?:: '(?P<path>[^']+)')?",
                "Permission denied",
            ),
            _alt(
                r"EACCES: permission denied, \w+ '(?P<path2>[^']+)'",
                "EACCES: permission denied, ",
                "'",
            ),
        ),
        (),
        _permission_denied,
    ),
    # --- network and HTTP. Rules 28 and 33-35 are case-insensitive: they run on the folded text
    # (see `_Scan.folded`), split into one pattern per leading literal with `\b` behind it.
    _Rule(
        "rate_limited",
        _C.RATE_LIMITED,
        (
            _alt(_word("too many requests") + r"\b", "too many requests", folded=True),
            _alt(_word("rate limit") + r"(?:ed)?\b", "rate limit", folded=True),
            _alt(_word("rate-limit") + r"(?:ed)?\b", "rate-limit", folded=True),
            _alt(_word("http") + r"(?:/\d(?:\.\d)?)?\s*429\b", "429", "http", folded=True),
            _alt(_word("status") + r"(?: code)?:?\s*429\b", "429", "status", folded=True),
        ),
        (),
        _fixed("Hint: Rate limited by upstream API. Reduce request frequency or batch the calls."),
    ),
    _Rule(
        "http_auth",
        _C.AUTHENTICATION,
        _http_status(r"(?P<status>401|403)\b", "40", lambda s: s in {"401", "403"}),
        (),
        lambda g: (
            f"Hint: Upstream rejected credentials (HTTP {_get(g, 'status')}). "
            "Use an authorized endpoint or valid credentials."
        ),
    ),
    _Rule(
        "http_not_found",
        _C.HTTP_CLIENT_ERROR,
        _http_status(r"404\b", "404", lambda s: s == "404"),
        (),
        _fixed(
            "Hint: Upstream resource not found (HTTP 404). Verify the URL or resource identifier."
        ),
    ),
    _Rule(
        "http_client_error",
        _C.HTTP_CLIENT_ERROR,
        _http_status(r"(?P<status>4\d\d)\b", "4", lambda s: s[0] == "4"),
        (),
        lambda g: (
            f"Hint: Upstream rejected the request (HTTP {_get(g, 'status')}). "
            "Fix the request parameters."
        ),
    ),
    _Rule(
        "http_server_error",
        _C.HTTP_SERVER_ERROR,
        _http_status(r"(?P<status>5\d\d)\b", "5", lambda s: s[0] == "5"),
        (),
        lambda g: (
            f"Hint: Upstream service failed (HTTP {_get(g, 'status')}). "
            "Retry later or use an alternative service."
        ),
    ),
    _Rule(
        "timeout",
        _C.TIMEOUT,
        (
            _alt(_word("timed out") + r"\b", "time", "timed out", folded=True),
            _alt(_word("timeout") + r"\b", "time", "timeout", folded=True),
            _alt(_word("deadline exceeded") + r"\b", "deadline exceeded", folded=True),
        ),
        (),
        _fixed(
            "Hint: Operation timed out. "
            "Reduce the work done in this step or split it into smaller steps."
        ),
    ),
    _Rule(
        "connection_failure",
        _C.CONNECTION_FAILURE,
        (
            _alt(_word("connection re") + r"(?:fused|set)\b", "conn", "connection re", folded=True),
            _alt(_word("econnre") + r"(?:fused|set)\b", "conn", "econnre", folded=True),
            _alt(_word("could not connect") + r"\b", "conn", "could not connect", folded=True),
            _alt(_word("failed to connect") + r"\b", "conn", "failed to connect", folded=True),
        ),
        (),
        _fixed(
            "Hint: Dependency is unreachable. Verify the host/port or use an available service."
        ),
    ),
    _Rule(
        "malformed_json",
        _C.MALFORMED_JSON,
        (
            _alt(r"jsondecodeerror", "json", "jsondecodeerror", folded=True),
            _alt(r"invalid arguments json", "json", "invalid arguments json", folded=True),
            _alt(r"unexpected token .{0,20} in json", "json", "unexpected token ", folded=True),
            _alt(r"expected value at line \d+ column \d+", "expected value at line ", folded=True),
            _alt(r"eof while parsing", "eof while parsing", folded=True),
        ),
        (),
        _fixed("Hint: Malformed JSON. Emit a single valid JSON object with double-quoted keys."),
    ),
)
