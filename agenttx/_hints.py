"""Clean Hints: one short, actionable line made from a raw tool error or stack trace.

`clean_error` is the reference engine's `ErrorCleaner::clean` (spec section 6). It bounds the input
to 64 KiB, finds the first of 31 ordered rules that matches anywhere in it and renders that rule's
template; when no rule matches, it quotes the most telling line of the trace. The result is a
`CleanHint` whose text starts with `Hint: `, is one line and has at most 240 characters. Rules that
name the offending key (a column, a field, a missing output key) put it in `CleanHint.key`, which
lets the rollback controller jump back to the step that produced it.

Same behaviour, different engine. The reference runs its patterns on Rust's `regex` crate, which
is linear-time whatever the pattern. Python's `re` backtracks, and several reference patterns,
searched naively, take quadratic time on hostile input: thousands of `Key (` with no `)` make
`Key \\((?P<key>[^)]+)\\)...` rescan the rest of the text from each of them, and a long word makes
`(?P<func>\\w+)\\(\\) missing` start over at every letter. `re` also pays a fixed cost at every
position where a pattern might start, so a pattern must begin with a literal for a search to be
cheap. Hence these devices, each explained where it is used:

* literal prefilters: a call first notes which rare characters occur, then looks for each rule's
  literals, and searches only with patterns whose literals all occur;
* a *locator* finds the start of the leftmost match in linear time from literal anchors and the
  pattern's structure, and the reference pattern then runs once, anchored there, to capture;
* a leading `\\b` becomes a look-behind after the literal it guards (`HTTP(?<!\\wHTTP)`), so the
  search jumps from one occurrence of the literal to the next;
* the four case-insensitive rules run case-sensitively on a case-folded copy of the text;
* the fallback's line-by-line steps visit only the lines that can matter.

`tests/test_hints.py` checks the whole against a naive implementation of the reference patterns
and algorithm, and each rewritten pattern against its reference pattern.

Porting notes (spec appendix B). `\\d`, `\\w`, `\\s` and `\\b` are Python's Unicode classes, which
agree with Rust's except on rare characters: Python counts U+001C..U+001F as whitespace (so they are
collapsed and trimmed too) and does not count combining marks as word characters. Rust's `$` in
`type_mismatch` is `\\Z` here. Lone surrogates, which a Rust string cannot hold, count as three
bytes towards the 64 KiB bound (their `surrogatepass` encoding).
"""

from __future__ import annotations

import enum
import functools
import re
from typing import TYPE_CHECKING, Final, TypeAlias, final

import attrs

from ._errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "MAX_HINT_CHARS",
    "MAX_INPUT_BYTES",
    "CleanHint",
    "HintCategory",
    "add_constraint",
    "clean_error",
]

#: Longest input examined, in UTF-8 bytes; longer input keeps its first quarter and last three.
MAX_INPUT_BYTES: Final = 65_536
#: Longest hint text, in characters (code points).
MAX_HINT_CHARS: Final = 240

_HEAD_BYTES: Final = MAX_INPUT_BYTES // 4
_TAIL_BYTES: Final = MAX_INPUT_BYTES - _HEAD_BYTES


class HintCategory(str, enum.Enum):
    """What kind of failure a hint describes; the values are the reference's category names."""

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
@attrs.frozen(kw_only=True)
class CleanHint:
    """A deterministic one-line summary of a failed step, and the key it blames.

    `text` starts with `Hint: `, holds no line break (`\\n` or `\\r`) and has at most
    `MAX_HINT_CHARS` characters. `rule` names the matching rule (`"pg_foreign_key"`); it is None
    only for the generic fallback, whose category is `UNKNOWN`. `key` is the offending key found
    by a keyed rule (a column, field or output key) and None otherwise; it is never empty.
    Construction checks these, and raises `InvalidArgument` when one does not hold.
    """

    text: str
    category: HintCategory
    rule: str | None = None
    key: str | None = None

    def __attrs_post_init__(self) -> None:
        text = self.text
        if not isinstance(text, str) or not text.startswith("Hint: "):
            raise InvalidArgument(f"hint text must start with 'Hint: ', got {text!r:.40}")
        if "\n" in text or "\r" in text:
            raise InvalidArgument(f"hint text must be one line, got {text!r:.40}")
        if len(text) > MAX_HINT_CHARS:
            raise InvalidArgument(
                f"hint text has {len(text)} characters, more than {MAX_HINT_CHARS}"
            )
        if not isinstance(self.category, HintCategory):
            raise InvalidArgument(f"hint category must be a HintCategory, got {self.category!r}")
        for name, value in (("rule", self.rule), ("key", self.key)):
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidArgument(f"hint {name} must be None or a non-empty string")


def add_constraint(constraints: list[str], text: str, max_constraints: int) -> None:
    """Record hint `text` in a transaction's constraint list, in place.

    As the reference's `Transaction::add_constraint`: `text` is appended unless an exactly equal
    entry is already present (a duplicate is not moved to the end); then the oldest entries are
    dropped while the list is longer than `max(max_constraints, 1)`.
    """
    if text not in constraints:
        constraints.append(text)
    excess = len(constraints) - max(max_constraints, 1)
    if excess > 0:
        del constraints[:excess]


# ---------------------------------------------------------------- the algorithm


def clean_error(raw: str) -> CleanHint:
    """Turn a raw error message or stack trace into a `CleanHint`; never raises for a `str`.

    The first rule, in the reference's priority order, that matches anywhere in the bounded
    input wins, wherever its match is; its leftmost match supplies the captures. Without a match,
    the hint quotes the trace's salient line (spec section 6). The result depends on `raw` alone,
    the work is linear in the length of the bounded input, and the function is safe to call from
    several threads at once.
    """
    scan = _Scan(_bounded(raw))
    checked: tuple[str, ...] = ()
    present = False
    for rule, patterns, needles, folded in _candidates(scan.signature()):
        if needles is not checked:  # the rules of a family share their needles (and the answer)
            checked, present = needles, scan.contains_any(needles, folded)
        if not present:
            continue
        match = rule.find(patterns, scan)
        if match is not None:
            groups = match.groupdict()
            key = _pick(groups, rule.key_groups)
            return CleanHint(
                text=_one_line(rule.render(groups)),
                category=rule.category,
                rule=rule.name,
                key=None if key is None else _first_column(key) or None,
            )
    line = _salient_line(scan)
    if line is None:
        line = "unknown error"
    return CleanHint(
        text=_one_line(
            f'Hint: Step failed with "{line}". Change the arguments so this error cannot recur.'
        ),
        category=HintCategory.UNKNOWN,
    )


def _bounded(raw: str) -> str:
    """At most `MAX_INPUT_BYTES` UTF-8 bytes: the head and tail, cut at character boundaries."""
    if len(raw) <= _HEAD_BYTES:  # at most four bytes a character: within the bound
        return raw
    if raw.isascii():
        if len(raw) <= MAX_INPUT_BYTES:
            return raw
        return f"{raw[:_HEAD_BYTES]}\n...\n{raw[-_TAIL_BYTES:]}"
    data = raw.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_INPUT_BYTES:
        return raw
    head_end = _HEAD_BYTES
    while data[head_end] & 0xC0 == 0x80:  # a continuation byte: move the cut down
        head_end -= 1
    tail_start = len(data) - _TAIL_BYTES
    while data[tail_start] & 0xC0 == 0x80:  # move the cut up
        tail_start += 1
    head = data[:head_end].decode("utf-8", "surrogatepass")
    tail = data[tail_start:].decode("utf-8", "surrogatepass")
    return f"{head}\n...\n{tail}"


def _one_line(text: str) -> str:
    """Collapse whitespace runs into one space; past 240 characters keep 239 and append `…`."""
    if len(text) <= MAX_HINT_CHARS:
        return " ".join(text.split())
    # Collapsing a prefix of the text gives a prefix of the collapsed text (a word cut in two is
    # a prefix of the whole word), so a long text is collapsed only as far as the hint needs.
    size = 2 * MAX_HINT_CHARS
    while True:
        collapsed = " ".join(text[:size].split())
        if len(collapsed) > MAX_HINT_CHARS:
            return collapsed[: MAX_HINT_CHARS - 1] + "\u2026"
        if size >= len(text):
            return collapsed
        size *= 4


Groups: TypeAlias = "Mapping[str, str | None]"


def _pick(groups: Groups, names: tuple[str, ...]) -> str | None:
    """The first of the named captures that is non-empty once trimmed, trimmed; else None."""
    for name in names:
        value = groups.get(name)
        if value:
            value = value.strip()
            if value:
                return value
    return None


def _get(groups: Groups, *names: str) -> str:
    """`_pick`, or the literal `unknown` when every named capture is empty or did not take part."""
    value = _pick(groups, names)
    return "unknown" if value is None else value


def _first_column(key: str) -> str:
    """The first column of a possibly composite key: `(tenant_id, user_id)` gives `tenant_id`."""
    return key.strip("()").split(",", 1)[0].strip().strip("\"`'")


def _singular(table: str) -> str:
    """Naive English singular of a table name, schema dropped: `public.companies` -> `company`."""
    name = table.rsplit(".", 1)[-1]
    if name.endswith("ies"):
        return name[:-3] + "y"
    if name.endswith(("sses", "xes", "ches")):
        return name[:-2]
    if name.endswith("s") and not name.endswith("ss"):
        return name[:-1]
    return name  # `status` -> `statu` above: the reference's documented naive case


# ---------------------------------------------------------------- matching machinery
#
# Cost model. `c in text` for one character runs at memchr speed (under a microsecond for 64 KiB);
# looking for a longer literal, or searching with a pattern, walks the text at 0.3 to 3 ns a
# character, and `re` adds tens of nanoseconds at each place where it tries a pattern. Looking
# for all 70 patterns would spend most of the time budget on a short trace, and milliseconds on
# 64 KiB. So a call first notes which of the rare characters in the patterns' literals occur in
# the text (`_Scan.signature`). Only the patterns whose rare characters all occur are candidates,
# and a rule whose candidates' first literals are all absent is skipped (`_candidates`, cached
# per signature). A literal is looked for at most once a call, and a pattern is searched for only
# when all its literals occur.

#: Characters that gate patterns, rarest in ordinary traces first. A pattern is gated by the first
#: two of them that its literals contain: each extra character makes every call a little slower.
_GATE_RARITY: Final = "`;{}$QJZXKYVW=\"',-UDHNPLF"
#: Case-insensitive patterns are gated by these letters, in either case, instead; no other
#: character folds to them (see `_Scan.folded`).
_FOLDED_GATE_LETTERS: Final = "qx"
#: The gate characters in use, in signature order. Filled in by `_gates`.
_GATE_CHARS: list[str] = []
#: Texts longer than this are searched for a literal only when all its characters occur.
_LONG_TEXT: Final = 4096


@attrs.define
class _Scan:
    """The bounded text of one `clean_error` call, and what is learnt about it on the way."""

    text: str
    _folded: str | None = None
    _reversed: str | None = None
    # What is known to occur (in the text, in the folded text): literals, and characters (the
    # latter only for long texts); the statuses after each HTTP prefix form.
    _found: dict[str, bool] = attrs.field(factory=dict)
    _found_folded: dict[str, bool] = attrs.field(factory=dict)
    _chars: dict[str, bool] | None = None
    _chars_folded: dict[str, bool] | None = None
    _statuses: dict[str, frozenset[str]] | None = None

    def signature(self) -> int:
        """Byte `i` (bit `8 * i`) is set when `_GATE_CHARS[i]` occurs in the text."""
        text = self.text
        return int.from_bytes(bytes([char in text for char in _GATE_CHARS]), "little")

    def contains_any(self, needles: tuple[str, ...], folded: bool) -> bool:
        """Whether one of `needles` occurs in the text (folded, if `folded`), remembered."""
        if folded:
            found, text = self._found_folded, self.folded()
        else:
            found, text = self._found, self.text
        long = len(text) > _LONG_TEXT
        for needle in needles:
            present = found.get(needle)
            if present is None:
                present = self._contains(needle, folded) if long else needle in text
                found[needle] = present
            if present:
                return True
        return False

    def _contains(self, needle: str, folded: bool) -> bool:
        # On a long text, looking for each of the needle's characters first (memchr speed,
        # remembered) often saves a scan for the needle, which can cost 0.1 ms.
        if folded:
            text = self.folded()
            if self._chars_folded is None:
                self._chars_folded = {}
            chars = self._chars_folded
        else:
            text = self.text
            if self._chars is None:
                self._chars = {}
            chars = self._chars
        for char in needle:
            present = chars.get(char)
            if present is None:
                present = chars[char] = char in text
            if not present:
                return False
        return needle in text

    def folded(self) -> str:
        """The text case-folded, so that the case-insensitive rules can run case-sensitively.

        Each character maps to exactly one character, and it matches an ASCII letter under
        `re.IGNORECASE` exactly when it maps to that letter: `str.lower` does this for every
        character but U+0130 (which it turns into two), U+0131 and U+017F, mapped here by hand.
        The mapping keeps word, digit and space characters what they are, so a lower-case pattern
        matches the folded text exactly where its `(?i)` form matches the text (checked for every
        code point by `tests/test_hints.py`).
        """
        if self._folded is None:
            text = self.text
            if text.isascii():
                self._folded = text.lower()
            else:
                text = text.replace("\u0130", "i").lower()
                self._folded = text.replace("\u0131", "i").replace("\u017f", "s")
        return self._folded

    def reversed(self) -> str:
        """The text backwards: a forward search there finds the last occurrence of something."""
        if self._reversed is None:
            self._reversed = self.text[::-1]
        return self._reversed

    def statuses(self, form: str) -> frozenset[str]:
        """The statuses that follow HTTP prefix form `form` anywhere in the text (rules 25-28)."""
        if self._statuses is None:
            self._statuses = {}
        found = self._statuses.get(form)
        if found is None:
            found = self._statuses[form] = frozenset(_HTTP_STATUS[form].findall(self.text))
        return found


Locate: TypeAlias = "Callable[[_Scan], int]"
Gate: TypeAlias = "Callable[[_Scan], bool]"


@final
@attrs.frozen
class _Pattern:
    """One alternative of a rule, and how to find its leftmost match cheaply.

    `needles` are groups of literals: every match contains one literal of each group (in the
    folded text if `folded`). `chars` has the signature bits of the gate characters that the
    one-literal groups contain, and each mask in `either` a pair of bits one of which must be set
    (a rare letter, for a folded pattern). `gate`, if set, tells exactly whether the pattern
    matches anywhere. `locate`, if set, returns the start of the leftmost match, or -1, and the
    pattern is matched there; otherwise the pattern is searched for, which the comment at its
    rule shows to be linear.
    """

    regex: re.Pattern[str]
    needles: tuple[tuple[str, ...], ...]
    chars: int
    either: tuple[int, ...]
    folded: bool
    locate: Locate | None
    gate: Gate | None

    def find(self, scan: _Scan) -> re.Match[str] | None:
        folded = self.folded
        for needles in self.needles:
            if not scan.contains_any(needles, folded):
                return None
        if self.gate is not None and not self.gate(scan):
            return None
        text = scan.folded() if folded else scan.text
        if self.locate is None:
            return self.regex.search(text)
        start = self.locate(scan)
        return None if start < 0 else self.regex.match(text, start)

    def possible(self, signature: int) -> bool:
        """Whether the gate characters allow a match in a text with this signature."""
        return self.chars & signature == self.chars and all(m & signature for m in self.either)


def _alt(
    pattern: str,
    *needles: str | tuple[str, ...],
    folded: bool = False,
    locate: Locate | None = None,
    gate: Gate | None = None,
) -> _Pattern:
    """A `_Pattern`; each needle is a literal, or a tuple of literals one of which must occur."""
    groups = tuple((n,) if isinstance(n, str) else n for n in needles)
    chars, either = _gates("".join(g[0] for g in groups if len(g) == 1), folded=folded)
    return _Pattern(re.compile(pattern), groups, chars, either, folded, locate, gate)


def _gates(literals: str, *, folded: bool) -> tuple[int, tuple[int, ...]]:
    """The signature bits that must be set, and the pairs of which one must, for `literals`."""

    def bit(char: str) -> int:
        if char not in _GATE_CHARS:
            _GATE_CHARS.append(char)
        return 1 << 8 * _GATE_CHARS.index(char)

    if folded:
        letters = [c for c in _FOLDED_GATE_LETTERS if c in literals][:1]
        return 0, tuple(bit(c) | bit(c.upper()) for c in letters)
    chars = 0
    for char in [c for c in _GATE_RARITY if c in literals][:2]:
        chars |= bit(char)
    return chars, ()


@final
@attrs.frozen
class _Rule:
    """A rule: its name and category, its alternatives, and how it renders and names a key."""

    name: str
    category: HintCategory
    patterns: tuple[_Pattern, ...]
    key_groups: tuple[str, ...]
    render: Callable[[Groups], str]

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


def _word(literal: str) -> str:
    r"""`\b` then `literal` (which starts with a word character), as a pattern `re` can scan for.

    The look-behind after the literal tests the character before it, as `\b` does there, but
    leaves the literal first, so a search jumps between its occurrences instead of trying every
    position.
    """
    escaped = re.escape(literal)
    return rf"{escaped}(?<!\w{escaped})"


def _run_to_stop(
    text: str,
    pos: int,
    prefix: re.Pattern[str],
    *,
    stop: str,
    min_run: int,
    suffix: re.Pattern[str],
) -> int:
    """Start of the leftmost match of `prefix [^stop]{min_run,} suffix` at or after `pos`, or -1.

    This is the shape `Key \\((?P<key>[^)]+)\\)=...`: `prefix` (never containing `stop`), a run
    of other characters, and at the first `stop` after the prefix a `suffix` that starts with
    `stop`. Searched naively, the run is rescanned from every later prefix inside it. Here, take
    the first valid suffix `j` that leaves room for the run: if no `stop` lies between the prefix
    and `j`, this start matches. Otherwise the start fails (its first `stop` comes before `j`, so
    it is not a valid suffix), and so does every start whose prefix ends before that last `stop`,
    so the next candidate lies after it. Every round moves past a `stop` or a valid suffix, and
    the scans do not overlap: the work is linear.
    """
    while True:
        head = prefix.search(text, pos)
        if head is None:
            return -1
        run_start = head.end()
        tail = suffix.search(text, run_start + min_run)
        if tail is None:
            return -1
        last_stop = text.rfind(stop, run_start, tail.start())
        if last_stop < 0:
            return head.start()
        pos = last_stop + 1


def _run_to_stop_locator(prefix: str, stop: str, min_run: int, suffix: str) -> Locate:
    prefix_re, suffix_re = re.compile(prefix), re.compile(suffix)

    def locate(scan: _Scan) -> int:
        return _run_to_stop(scan.text, 0, prefix_re, stop=stop, min_run=min_run, suffix=suffix_re)

    return locate


# ---------------------------------------------------------------- locators of rules 1-31
#
# A plain search is linear for a pattern that begins with a literal and whose unbounded runs
# each end the pattern or stop at a character of that literal, as in
# `Duplicate entry '(?P<value>[^']*)'`: the scan from one start ends at the next start, so no
# text is scanned twice. The patterns below need more.

# Rules 1 and 2: `\d+` is followed by `[^}]*`, which matches digits too, so `re` would retry every
# shorter digit run; `(?!\d)` prevents that and changes no match (the run absorbs the digits).
_locate_unresolved = _run_to_stop_locator(
    r"unresolved reference \$\{steps\.\d+(?!\d)",
    "}",
    0,
    r"\}: key '[^']+' not present in output of step \d+",
)
_locate_unavailable = _run_to_stop_locator(
    r"reference \$\{steps\.\d+(?!\d)", "}", 0, r"\} points to a step that has not completed"
)

# Rules 4 and 7: a key run from `Key (` to the first `)`.
_locate_pg_foreign_key = _run_to_stop_locator(
    r"Key \(", ")", 1, r"\)=\([^)]*\) is not present in table \"[^\"]+\""
)
_locate_pg_unique = _run_to_stop_locator(r"Key \(", ")", 1, r"\)=\([^)]*\) already exists")

# Rule 5: `.*?` runs to the end of the line from every `foreign key constraint fails (` on it.
_MYSQL_FK_OPEN: Final = "foreign key constraint fails ("
_MYSQL_FK_CLOSE: Final = re.compile(r"FOREIGN KEY \(`[^`]+`\) REFERENCES `[^`]+`")


def _locate_mysql_foreign_key(scan: _Scan) -> int:
    # A start matches when a valid `FOREIGN KEY (...) REFERENCES ...` begins later on its line.
    # Take the first valid one after the start: a newline before it fails this start and every
    # start before that newline; otherwise this start is the leftmost match.
    text = scan.text
    pos = 0
    while True:
        start = text.find(_MYSQL_FK_OPEN, pos)
        if start < 0:
            return -1
        run_start = start + len(_MYSQL_FK_OPEN)
        close = _MYSQL_FK_CLOSE.search(text, run_start)
        if close is None:
            return -1
        newline = text.rfind("\n", run_start, close.start())
        if newline < 0:
            return start
        pos = newline + 1


# Rule 14, pydantic alternative `(?P<key2>\w+)\s*\n\s*Field required`. Searched forwards, `\w+`
# starts over at every letter of a long word. Its leftmost match starts where a word starts, at
# the first `Field required` whose preceding whitespace holds a newline and follows a word; that
# is the last such occurrence in the reversed text, which a greedy `.*` finds in one backward
# pass. (`\s*\n\s*` is written `[^\S\n]*\n\s*`: the same strings, with the newline it splits at
# fixed, so a long blank run is not split every possible way.)
_FIELD_REQUIRED_REVERSED: Final = re.compile(r"(?s:.*)deriuqer dleiF\s*\n[^\S\n]*(?P<word>\w+)")


def _locate_field_required(scan: _Scan) -> int:
    found = _FIELD_REQUIRED_REVERSED.match(scan.reversed())
    return -1 if found is None else len(scan.text) - found.end("word")


# Rule 14, JSON Schema alternative `'(?P<key3>[^']+)' is a required property`, would be tried at
# every `'`. A match ends at the first `' is a required property` that has a character other than
# `'` before it (a non-empty key) and some `'` further back, and starts at the nearest such `'`.
_REQUIRED_PROPERTY_END: Final = re.compile(
    r"' is a required property(?<=[^']' is a required property)"
)


def _locate_required_property(scan: _Scan) -> int:
    text = scan.text
    end = _REQUIRED_PROPERTY_END.search(text)
    while end is not None:
        opening = text.rfind("'", 0, end.start())
        if opening >= 0:
            return opening
        end = _REQUIRED_PROPERTY_END.search(text, end.start() + 1)  # will find this one's `'`
    return -1


# Rule 16, `(?P<func>\w+)\(\) missing ...`: as for `Field required`, the leftmost match starts
# where the word before the first valid `() missing ...` starts.
_MISSING_ARGUMENT_TAIL: Final = re.compile(
    r"\(\) missing (?<=\w\(\) missing )\d+ required (?:positional |keyword-only )?"
    r"arguments?: '[^']+'"
)
_WORD_RUN: Final = re.compile(r"\w+")


def _locate_missing_argument(scan: _Scan) -> int:
    tail = _MISSING_ARGUMENT_TAIL.search(scan.text)
    if tail is None:
        return -1
    backwards = scan.reversed()
    word = _WORD_RUN.match(backwards, len(backwards) - tail.start())
    return -1 if word is None else tail.start() - len(word.group())


# Rule 20: the match ends at the end of the text (`$`, here `\Z`) and holds no newline, so it
# lies on the last line, where `[^,\n]+` is the run up to the first `,`. That `,` must begin
# `, expected ` followed by at least one more character.
_TYPE_MISMATCH_OPEN: Final = re.compile(r"invalid type: ")
_TYPE_MISMATCH_EXPECTED: Final = re.compile(r", expected .")


def _locate_type_mismatch(scan: _Scan) -> int:
    text = scan.text
    last_line = text.rfind("\n") + 1
    return _run_to_stop(
        text, last_line, _TYPE_MISMATCH_OPEN, stop=",", min_run=1, suffix=_TYPE_MISMATCH_EXPECTED
    )


# Rules 25-28 share the prefix `\b(?:HTTP(?:/\d(?:\.\d)?)?|[Ss]tatus(?: [Cc]ode)?:?|returned)\s*`,
# split here into one pattern per leading literal (no two can match at one position). After a
# given occurrence of a prefix form, a status can begin at one place only (its optional parts and
# the blanks cannot both be followed by a digit), so the set of 3-character statuses found after
# each form tells each rule whether it matches anywhere: one pass serves all four rules, and only
# the winner searches for its leftmost match.
_HTTP_PREFIXES: Final = {
    "HTTP": _word("HTTP") + r"(?:/\d(?:\.\d)?)?",
    "Status": _word("Status") + r"(?: [Cc]ode)?:?",
    "status": _word("status") + r"(?: [Cc]ode)?:?",
    "returned": _word("returned"),
}
#: A literal shared by forms, so that one scan rules out both `Status` and `status`.
_HTTP_NEEDLES: Final = {
    "HTTP": "HTTP",
    "Status": "tatus",
    "status": "tatus",
    "returned": "returned",
}
_HTTP_STATUS: Final = {
    form: re.compile(rf"{prefix}\s*([45]\d\d)\b") for form, prefix in _HTTP_PREFIXES.items()
}


def _http_status(status: str, digits: str, accepts: Callable[[str], bool]) -> tuple[_Pattern, ...]:
    """Rule 25-28's patterns: `digits` are characters every accepted status contains."""

    def gate_for(form: str) -> Gate:
        def gate(scan: _Scan) -> bool:
            return any(accepts(found) for found in scan.statuses(form))

        return gate

    return tuple(
        _alt(rf"{prefix}\s*{status}", _HTTP_NEEDLES[form], form, *digits, gate=gate_for(form))
        for form, prefix in _HTTP_PREFIXES.items()
    )


# ---------------------------------------------------------------- the rules, in priority order
#
# Each `_alt` lists literals its matches contain, rarest first; they are only a quick way to skip
# the pattern, never a condition of their own.


def _foreign_key(g: Groups) -> str:
    return (
        f"Hint: Foreign key constraint failed for '{_first_column(_get(g, 'key'))}'. "
        f"Ensure target {_singular(_get(g, 'table'))} exists before step execution."
    )


def _java_npe(g: Groups) -> str:
    key = _pick(g, ("key", "key2"))
    if key is None:
        return "Hint: Null reference encountered. Validate that all required inputs are non-null."
    return (
        f"Hint: '{key}' is null when calling {_get(g, 'method', 'method2')}. "
        f"Initialize '{key}' before this step."
    )


def _file_not_found(g: Groups) -> str:
    path = _pick(g, ("path", "path2", "path3"))
    if path is None:
        return "Hint: File does not exist. Create it in an earlier step or correct the path."
    return f"Hint: File '{path}' does not exist. Create it in an earlier step or correct the path."


def _permission_denied(g: Groups) -> str:
    path = _pick(g, ("path", "path2"))
    if path is None:
        return "Hint: Permission denied. Use a resource the agent is allowed to modify."
    return f"Hint: Permission denied for '{path}'. Use a path inside the writable sandbox."


def _fixed(text: str) -> Callable[[Groups], str]:
    return lambda _g: text


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
    # --- network and HTTP. Rules 24 and 29-31 are case-insensitive: they run on the folded text
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


# ---------------------------------------------------------------- the fallback's salient line
#
# The reference splits the text into trimmed, non-empty lines and takes (a) the last line starting
# with `Caused by:`, minus that prefix, trimmed; else (b) the last line that is not a frame and
# starts with an exception name; else (c) the first line that is not a frame; else nothing. Then
# leading package qualifiers are stripped from the chosen line. Lines are split at `\n` only, as
# Rust's `str::lines` does. Splitting 64 KiB into lines in Python costs milliseconds, so no step
# splits: (a) searches the reversed text, where the last line of a kind is the first one found,
# (b) visits only the lines that contain an exception suffix, and (c) skips the leading frame
# lines with one pattern.

# (a) `Caused by:` at the start of a line, reversed.
_CAUSED_BY_REVERSED: Final = re.compile(r":yb desuaC[^\S\n]*(?:\n|\Z)")

# (b) The reference's `^(?:[\w$]+\.)*[A-Z][\w$]*(?:Error|Exception|Fault)\b`, tried at the start of
# a line, so that each line's first token is examined once (tried at each suffix instead, it would
# rescan a long token once for every class name in it). Only a line containing a suffix can match:
# when few do, they are visited from the last one back, found by `str.rfind`; otherwise every line
# from the last such line back is tried by one pattern (its greedy `.*` backs up from one `\n` to
# the previous one at memchr speed), which first rejects a line without a suffix, at memchr speed.
# Of the frame forms, only `Traceback` can begin such a line (`TracebackError: ...`); the others
# begin with a lower-case word followed by a blank or a colon, a digit, `#`, `.`, `^` or `~`.
_EXCEPTION_SUFFIXES: Final = ("Error", "Exception", "Fault")
_EXCEPTION_LINE: Final = (
    r"[^\S\n]*(?P<name>(?!Traceback)(?:[\w$]+\.)*[A-Z][\w$]*(?:Error|Exception|Fault)\b)"
)
_EXCEPTION_LINE_AT: Final = re.compile(_EXCEPTION_LINE)
_LAST_EXCEPTION_LINE: Final = re.compile(
    r"(?:(?s:.*)\n)?(?=[^\n]*rror|[^\n]*xception|[^\n]*ault)" + _EXCEPTION_LINE
)
#: Lines containing a suffix that are visited one by one before the pattern takes over.
_FEW_EXCEPTION_LINES: Final = 64


def _last_exception_line(text: str) -> int:
    """Where (b)'s line starts (its first non-blank character), or -1."""
    # The last occurrence of each suffix before `end`; each is searched for again only when its
    # line has been rejected, from that line's start back, so the searches do not overlap.
    last = [text.rfind("Error"), text.rfind("Exception"), text.rfind("Fault")]
    for _ in range(_FEW_EXCEPTION_LINES):
        position = max(last)
        if position < 0:
            return -1
        start = text.rfind("\n", 0, position) + 1
        line_end = text.find("\n", position)
        found = _EXCEPTION_LINE_AT.match(text, start, len(text) if line_end < 0 else line_end)
        if found is not None:
            return found.start("name")
        last = [
            text.rfind(suffix, 0, start) if at >= start else at
            for suffix, at in zip(_EXCEPTION_SUFFIXES, last, strict=True)
        ]
    position = max(last)
    if position < 0:
        return -1
    line_end = text.find("\n", position)  # the pattern backs up from the end of this line
    found = _LAST_EXCEPTION_LINE.match(text, 0, len(text) if line_end < 0 else line_end)
    return -1 if found is None else found.start("name")


# (c) The reference's frame tests look at a trimmed line; here they are written for the first
# non-blank character of a line of the raw text. A blank that a test needs (after `at`, after the
# digits) must be followed by more of the line, so that it lies inside the trimmed line. A line of
# `^`, `~` and spaces is a frame: such lines and blank lines are skipped in one step when they end
# in `\n` (`re` backtracks to a single `\n` after a character class at memchr speed), else one
# at a time in an inner loop (cheaper than the outer one); `(?![\^~ ])` stops `re` from trying
# every split of a long run of them between the class and the trailing blanks.
_CARET_LINE: Final = r"[\^~][\^~ ]*(?![\^~ ])[^\S\n]*(?=\n|\Z)"
_FRAME: Final = (
    r"(?:at [^\S\n]*\S|File \"|T(?:raceback|he above exception)|\.\.\.|During handling"
    r"|stack backtrace|note: run with|#?\d+(?::|[^\S\n]+\S))[^\n]*"
    rf"|[\^~](?:[\^~ \n]*\n|[\^~ ]*(?![\^~ ])[^\S\n]*(?=\n|\Z))(?:\s*{_CARET_LINE})*"
)
_LEADING_FRAMES: Final = re.compile(rf"\s*(?:(?:{_FRAME})\s*)*")


# Qualifier stripping, the reference's `^(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Error|Exception|Fault))`
# replaced by `$1`. `re` tries every number of qualifiers in turn, so a line of thousands of them
# takes milliseconds. Yet only one number can work: the qualifiers end at the first `.` that is
# not followed by `[a-z_$]` (every segment before it starts with one, so no class name can start
# there), and all of the line up to that `.` must be qualifier characters, `[\w$.]`.
_QUALIFIER_START: Final = frozenset("abcdefghijklmnopqrstuvwxyz_$")
_QUALIFIER_END: Final = re.compile(r"\.(?![a-z_$])")
_QUALIFIER_RUN: Final = re.compile(r"[\w$.]*")
_EXCEPTION_NAME: Final = re.compile(r"[A-Z][\w$]*(?:Error|Exception|Fault)")
_QUALIFIED_EXCEPTION: Final = re.compile(
    r"(?:[a-z_$][\w$]*\.)+(?P<name>" + _EXCEPTION_NAME.pattern + ")"
)
_SHORT_LINE: Final = 2048


def _salient_line(scan: _Scan) -> str | None:
    """The reference's `salient_line`: the line the fallback hint quotes, or None."""
    text = scan.text
    line: str | None = None
    if "Caused by:" in text:
        found = _CAUSED_BY_REVERSED.search(scan.reversed())
        if found is not None:
            # A bare `Caused by:` gives "", which the hint quotes as `""` (a reference quirk).
            line = _line_from(text, len(text) - found.start()).strip()
    if line is None:
        start = _last_exception_line(text)
        if start >= 0:
            line = _line_from(text, start).rstrip()
    if line is None:
        leading = _LEADING_FRAMES.match(text)  # matches at least the empty string
        start = len(text) if leading is None else leading.end()
        if start == len(text):
            return None
        line = _line_from(text, start).rstrip()
    return _strip_qualifiers(line)


def _strip_qualifiers(line: str) -> str:
    """`com.acme.QuotaExceededException: x` -> `QuotaExceededException: x`; else `line`."""
    if not line or line[0] not in _QUALIFIER_START:
        return line
    if len(line) <= _SHORT_LINE:  # few qualifiers to try: the reference pattern is quick
        found = _QUALIFIED_EXCEPTION.match(line)
        return line if found is None else found.group("name") + line[found.end() :]
    if "Error" not in line and "Exception" not in line and "Fault" not in line:
        return line
    dot = _qualifier_end(line)
    if dot < 0 or not _EXCEPTION_NAME.match(line, dot + 1):
        return line
    return line[dot + 1 :]


def _qualifier_end(line: str) -> int:
    """The `.` that ends `line`'s leading qualifiers, or -1.

    That is the first `.` not followed by `[a-z_$]`, provided that every character before it is a
    word character, `$` or `.`.
    """
    if line.isascii():
        # `re` pays some 25 ns at each `.`; classifying the characters with `str.translate`
        # and looking for the two-character patterns that end the qualifiers is far quicker.
        classes = line.translate(_QUALIFIER_CLASSES)
        ends = [i for i in (classes.find(".."), classes.find(".w"), classes.find(". ")) if i >= 0]
        if classes.endswith("."):
            ends.append(len(classes) - 1)
        dot = min(ends, default=-1)
        return dot if dot >= 0 and classes.find(" ", 0, dot) < 0 else -1
    end = _QUALIFIER_END.search(line)
    if end is None:
        return -1
    qualifiers = _QUALIFIER_RUN.match(line, 0, end.start())
    return end.start() if qualifiers is not None and qualifiers.end() == end.start() else -1


#: ASCII characters by class: `.` stays, `[a-z_$]` become `a`, other `[\w$]` `w`, the rest ` `.
_QUALIFIER_CLASSES: Final = {
    c: "."
    if c == ord(".")
    else "a"
    if chr(c) in _QUALIFIER_START
    else "w"
    if re.fullmatch(r"[\w$]", chr(c))
    else " "
    for c in range(128)
}


def _line_from(text: str, start: int) -> str:
    """The rest of the line that `start` is on."""
    end = text.find("\n", start)
    return text[start:] if end < 0 else text[start:end]
