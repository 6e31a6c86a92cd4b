"""The matching machinery of the Clean Hint cleaner: a scanned text and linear-time patterns.

Python's `re` backtracks, so several of the patterns that define the hint rules, searched as
written, take quadratic time on hostile input. This module holds what keeps every search linear:
the `_Scan` of one text (which rare characters and literals occur, found once), patterns gated by
those literals, and *locators* that find where the leftmost match of a pattern starts from its
literal anchors, so the defining pattern then runs once, anchored there. `_clean.py` explains the
whole design; `_rules.py` holds the rules built from these parts.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Final, TypeAlias, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable

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
        """The statuses that follow HTTP prefix form `form` anywhere in the text (rules 29-32)."""
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

    source: str  # the regular expression, compiled when first needed (`regex`)
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

    @property
    def regex(self) -> re.Pattern[str]:
        """The compiled pattern (compiling them all at import would slow `import agenttx`)."""
        return _compiled(self.source)


@functools.cache
def _compiled(source: str) -> re.Pattern[str]:
    return re.compile(source)


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
    return _Pattern(pattern, groups, chars, either, folded, locate, gate)


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


# ---------------------------------------------------------------- locators of rules 1-35
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

# Rules 5 and 8: a key run from `Key (` to the first `)`.
_locate_pg_foreign_key = _run_to_stop_locator(
    r"Key \(", ")", 1, r"\)=\([^)]*\) is not present in table \"[^\"]+\""
)
_locate_pg_unique = _run_to_stop_locator(r"Key \(", ")", 1, r"\)=\([^)]*\) already exists")

# Rule 6: `.*?` runs to the end of the line from every `foreign key constraint fails (` on it.
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


# Rule 15, pydantic alternative `(?P<key2>\w+)\s*\n\s*Field required`. Searched forwards, `\w+`
# starts over at every letter of a long word. Its leftmost match starts where a word starts, at
# the first `Field required` whose preceding whitespace holds a newline and follows a word; that
# is the last such occurrence in the reversed text, which a greedy `.*` finds in one backward
# pass. (`\s*\n\s*` is written `[^\S\n]*\n\s*`: the same strings, with the newline it splits at
# fixed, so a long blank run is not split every possible way.)
_FIELD_REQUIRED_REVERSED: Final = re.compile(r"(?s:.*)deriuqer dleiF\s*\n[^\S\n]*(?P<word>\w+)")


def _locate_field_required(scan: _Scan) -> int:
    found = _FIELD_REQUIRED_REVERSED.match(scan.reversed())
    return -1 if found is None else len(scan.text) - found.end("word")


# Rule 22, pydantic alternative `(?P<key2>\w+)[^\S\n]*\n\s*Input should be`: located as rule 15's
# pydantic alternative is (above), its leftmost match starting at the word before the first
# `Input should be` whose preceding whitespace holds a newline and follows a word.
_INPUT_SHOULD_BE_REVERSED: Final = re.compile(r"(?s:.*)eb dluohs tupnI\s*\n[^\S\n]*(?P<word>\w+)")


def _locate_input_should_be(scan: _Scan) -> int:
    found = _INPUT_SHOULD_BE_REVERSED.match(scan.reversed())
    return -1 if found is None else len(scan.text) - found.end("word")


# Rule 15, JSON Schema alternative `'(?P<key3>[^']+)' is a required property`, would be tried at
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


# Rule 17, `(?P<func>\w+)\(\) missing ...`: as for `Field required`, the leftmost match starts
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


# Rule 21: the match ends at the end of the text (`$`, here `\Z`) and holds no newline, so it
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


# Rules 29-32 share the prefix `\b(?:HTTP(?:/\d(?:\.\d)?)?|[Ss]tatus(?: [Cc]ode)?:?|returned)\s*`,
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
    """Rules 29-32's patterns: `digits` are characters every accepted status contains."""

    def gate_for(form: str) -> Gate:
        def gate(scan: _Scan) -> bool:
            return any(accepts(found) for found in scan.statuses(form))

        return gate

    return tuple(
        _alt(rf"{prefix}\s*{status}", _HTTP_NEEDLES[form], form, *digits, gate=gate_for(form))
        for form, prefix in _HTTP_PREFIXES.items()
    )
