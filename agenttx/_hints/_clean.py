"""Clean Hints: one short, actionable line made from a raw tool error or stack trace.

`clean_error` carries out `docs/protocol.md#clean-hints`. It bounds the input to 64 KiB, finds the
first of 35 ordered rules that matches anywhere in it and renders that rule's template; when no
rule matches, it reads an HTTP status line (`503 Service Unavailable`) as the HTTP rules would,
or else quotes the most telling line of the trace. The result is a `CleanHint` whose text
starts with `Hint: `, is one line and has at most 240 characters. Rules that name the offending key
(a column, a field, a missing output key) put it in `CleanHint.key`, which lets the rollback
controller jump back to the step that produced it.

Each rule is defined by plain regular expressions (listed in `tests/test_hints.py`), the kind a
linear-time engine runs as they are. Python's `re` backtracks, and several defining patterns,
searched naively, take quadratic time on hostile input: thousands of `Key (` with no `)`
make `Key \\((?P<key>[^)]+)\\)...` rescan the rest of the text from each of them, and a long word
makes `(?P<func>\\w+)\\(\\) missing` start over at every letter. `re` also pays a fixed cost at
every position where a pattern might start, so a pattern must begin with a literal for a search to
be cheap. Hence these devices, each explained where it is used:

* literal prefilters: a call first notes which rare characters occur, then looks for each rule's
  literals, and searches only with patterns whose literals all occur;
* a *locator* finds the start of the leftmost match in linear time from literal anchors and the
  pattern's structure, and the defining pattern then runs once, anchored there, to capture;
* a leading `\\b` becomes a look-behind after the literal it guards (`HTTP(?<!\\wHTTP)`), so the
  search jumps from one occurrence of the literal to the next;
* the four case-insensitive rules run case-sensitively on a case-folded copy of the text;
* the fallback's line-by-line steps visit only the lines that can matter.

`tests/test_hints.py` checks the whole against a naive implementation of the defining patterns
and of `docs/protocol.md#the-cleaner`, and each rewritten pattern against its defining pattern.

Character classes: `\\d`, `\\w`, `\\s` and `\\b` are Python's Unicode classes, so U+001C..U+001F
count as whitespace (they are collapsed and trimmed too) and combining marks are not word
characters. The `$` that ends `type_mismatch`'s defining pattern is `\\Z` here. Lone surrogates
count as three bytes towards the 64 KiB bound (their `surrogatepass` encoding), then become
U+FFFD, so that every hint and key is valid Unicode that any store can keep.
"""

from __future__ import annotations

import re
from typing import Final, final

import attrs

from .._errors import InvalidArgument
from ._rules import HintCategory, _candidates
from ._scan import _Scan
from ._templates import _first_column, _pick

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

    See `docs/protocol.md#constraints`: `text` is appended unless an exactly equal entry is
    already present (a duplicate is not moved to the end); then the oldest entries are
    dropped while the list is longer than `max(max_constraints, 1)`. Raises `InvalidArgument`,
    naming the argument, unless `constraints` is a list, `text` a str and `max_constraints` an
    int (not a bool); the list is then unchanged.
    """
    if not isinstance(constraints, list):
        raise InvalidArgument(f"constraints must be a list, got {type(constraints).__name__}")
    if not isinstance(text, str):
        raise InvalidArgument(f"text must be a string, got {type(text).__name__}")
    if not isinstance(max_constraints, int) or isinstance(max_constraints, bool):
        raise InvalidArgument(
            f"max_constraints must be an int, got {type(max_constraints).__name__}"
        )
    text = str.__str__(text)  # a plain str: a subclass's __eq__ must not decide duplicates
    if text not in constraints:
        constraints.append(text)
    excess = len(constraints) - max(max_constraints, 1)
    if excess > 0:
        del constraints[:excess]


# ---------------------------------------------------------------- the algorithm


def clean_error(text: str) -> CleanHint:
    """Turn a raw error message or stack trace into a `CleanHint`; never raises for a `str`.

    The first rule, in the priority order of `docs/protocol.md#hint-rules`, that matches anywhere
    in the bounded input wins, wherever its match is; its leftmost match supplies the captures.
    Without a match, the hint quotes the trace's salient line (`docs/protocol.md#fallback-hint`).
    The result depends on `text` alone, the work is linear in the length of the bounded input, and
    the function is safe to call from several threads at once. Anything but a `str` (None, bytes, an
    exception) raises `InvalidArgument` naming `text`; a `str` subclass is read as the plain string
    it holds.
    """
    if type(text) is not str:
        if not isinstance(text, str):
            raise InvalidArgument(f"text must be a string, got {type(text).__name__}")
        text = str.__str__(text)  # its own methods (len, encode, find) are not to be trusted
    scan = _Scan(_valid_unicode(_bounded(text)))
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
            if key is None and rule.key_from is not None:
                key = rule.key_from(groups)
            return CleanHint(
                text=_one_line(rule.render(groups)),
                category=rule.category,
                rule=rule.name,
                key=None if key is None else _first_column(key) or None,
            )
    status = _status_line(scan.text)
    if status is not None:  # read as if it followed `HTTP`: an HTTP rule matches that
        return clean_error(f"HTTP {status}")
    line = _salient_line(scan)
    if line is None:
        line = "unknown error"
    return CleanHint(
        text=_one_line(
            f'Hint: Step failed with "{line}". Change the arguments so this error cannot recur.'
        ),
        category=HintCategory.UNKNOWN,
    )


# ---------------------------------------------------------------- HTTP status lines
#
# Text no rule matched may still report an HTTP status without one of the HTTP rules' prefixes:
# a status line (`503 Service Unavailable`, also inside httpx's `Server error '503
# Service Unavailable' for url ...`) or the SDKs' `Error code: 503 - {...}`. A 4xx or 5xx status
# given so is read as if it followed `HTTP` (`docs/protocol.md#http-status-lines`). Only text
# that would otherwise get the fallback hint is looked at, so no rule's hint changes.

#: The reason phrases of RFC 9110 (and their older names), by 4xx and 5xx status.
_REASON_PHRASES: Final = {
    "400": ("bad request",),
    "401": ("unauthorized",),
    "402": ("payment required",),
    "403": ("forbidden",),
    "404": ("not found",),
    "405": ("method not allowed",),
    "406": ("not acceptable",),
    "407": ("proxy authentication required",),
    "408": ("request timeout",),
    "409": ("conflict",),
    "410": ("gone",),
    "411": ("length required",),
    "412": ("precondition failed",),
    "413": ("content too large", "payload too large", "request entity too large"),
    "414": ("uri too long", "request-uri too long"),
    "415": ("unsupported media type",),
    "416": ("range not satisfiable", "requested range not satisfiable"),
    "417": ("expectation failed",),
    "418": ("i'm a teapot",),
    "421": ("misdirected request",),
    "422": ("unprocessable content", "unprocessable entity"),
    "423": ("locked",),
    "424": ("failed dependency",),
    "425": ("too early",),
    "426": ("upgrade required",),
    "428": ("precondition required",),
    "429": ("too many requests",),
    "431": ("request header fields too large",),
    "451": ("unavailable for legal reasons",),
    "500": ("internal server error",),
    "501": ("not implemented",),
    "502": ("bad gateway",),
    "503": ("service unavailable",),
    "504": ("gateway timeout",),
    "505": ("http version not supported",),
    "506": ("variant also negotiates",),
    "507": ("insufficient storage",),
    "508": ("loop detected",),
    "510": ("not extended",),
    "511": ("network authentication required",),
}


def _status_line_pattern() -> re.Pattern[str]:
    """One pattern for every status line: `4` or `5` (so that `re` skips to those digits at C
    speed), a look-behind making it start a word, then the rest of each status and its phrases
    (in ASCII case-insensitively), not followed by a word character. Each position costs a
    bounded number of literal comparisons: linear in the text."""
    branches = []
    for first in "45":
        tails = "|".join(
            f"{status[1:]} {re.escape(phrase)}"
            for status, phrases in _REASON_PHRASES.items()
            if status[0] == first
            for phrase in phrases
        )
        branches.append(rf"{first}(?<!\w{first})(?ai:{tails})")
    return re.compile(rf"(?:{'|'.join(branches)})(?!\w)")


_STATUS_LINE: Final = _status_line_pattern()
_ERROR_CODE: Final = re.compile(r"Error code: ([45]\d\d)\b")


def _status_line(text: str) -> str | None:
    """The leftmost 4xx or 5xx status given by a status line or `Error code: `, or None."""
    line = _STATUS_LINE.search(text)
    code = _ERROR_CODE.search(text) if "Error code: " in text else None
    if code is not None and (line is None or code.start() < line.start()):
        return code.group(1)
    return None if line is None else line.group()[:3]


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


def _valid_unicode(text: str) -> str:
    """`text` with each surrogate code point replaced by U+FFFD, as a lossy UTF-8 decode does.

    A tool's error may hold lone surrogates (`os.fsdecode` makes them from undecodable bytes); a
    hint quoting one could not be stored as UTF-8. No pattern tells the two apart (neither is a
    word, digit or space character, both are one code point), so the hint is otherwise the same.
    """
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", text)
    return text


_SURROGATES: Final = re.compile("[\ud800-\udfff]")


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


# ---------------------------------------------------------------- the fallback's salient line
#
# The fallback splits the text into trimmed, non-empty lines and takes (a) the last line starting
# with `Caused by:`, minus that prefix, trimmed; else (b) the last line that is not a frame and
# starts with an exception name; else (c) the first line that is not a frame; else nothing. Then
# leading package qualifiers are stripped from the chosen line. Lines are split at `\n` only
# (`str.splitlines` would split at other characters too). Splitting 64 KiB into lines in Python
# costs milliseconds, so no step splits: (a) searches the reversed text, where the last line of a
# kind is the first one found, (b) visits only the lines that contain an exception suffix, and (c)
# skips the leading frame lines with one pattern.

# (a) `Caused by:` at the start of a line, reversed.
_CAUSED_BY_REVERSED: Final = re.compile(r":yb desuaC[^\S\n]*(?:\n|\Z)")

# (b) The defining `^(?:[\w$]+\.)*[A-Z][\w$]*(?:Error|Exception|Fault)\b`, tried at the start of
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


# `_EXCEPTION_LINE_AT.match` on one line, in time that does not depend on the number of dotted
# segments: `(?:[\w$]+\.)*` can only consume whole non-empty segments, so the class name starts
# at the token's start or just after a dot, before the token's first `..`; its segment ends at the
# next `.` or at the token's end, whose next character is not a word character either way. So one
# search for a class name starting there, bounded to that region, finds the same lines.
_TOKEN: Final = re.compile(r"[^\S\n]*([\w$.]*)")
# The class set comes first so that `re` skips to capitals at C speed; the look-behind then
# requires the capital to start a segment (after a dot, a blank or the line start).
_CLASS_NAME: Final = re.compile(r"[A-Z](?<![^.\s][A-Z])[\w$]*(?:Error|Exception|Fault)\b")


def _exception_name_at(text: str, start: int, end: int) -> int:
    """Where the line at `start` (ending at `end`) has (b)'s exception name, or -1."""
    token = _TOKEN.match(text, start, end)
    assert token is not None  # the pattern matches the empty string
    begin, finish = token.span(1)
    if begin == finish or text[begin] == "." or text.startswith("Traceback", begin, finish):
        return -1
    double_dot = text.find("..", begin, finish)
    limit = finish if double_dot < 0 else double_dot + 1
    return begin if _CLASS_NAME.search(text, begin, limit) is not None else -1


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
        name = _exception_name_at(text, start, len(text) if line_end < 0 else line_end)
        if name >= 0:
            return name
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


# (c) The frame tests look at a trimmed line; here they are written for the first
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


# Qualifier stripping, the defining `^(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Error|Exception|Fault))`
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
    """The salient line the fallback hint quotes (`docs/protocol.md#fallback-hint`), or None."""
    text = scan.text
    line: str | None = None
    if "Caused by:" in text:
        found = _CAUSED_BY_REVERSED.search(scan.reversed())
        if found is not None:
            # A bare `Caused by:` gives "", which the hint quotes as `""` (a deliberate quirk).
            line = _line_from(text, len(text) - found.start()).strip()
    if line is None:
        start = _last_exception_line(text)
        if start >= 0:
            line = _line_from(text, start).rstrip()
    if line is None:
        leading = _LEADING_FRAMES.match(text)  # matches at least the empty string
        start = len(text) if leading is None else leading.end()
        if start < len(text):
            line = _line_from(text, start).rstrip()
        else:  # every line is a frame, or blank; one line alone is a message, not a trace
            line = text.strip()
            if not line or "\n" in line:
                return None
    return _strip_qualifiers(line)


def _strip_qualifiers(line: str) -> str:
    """`com.acme.QuotaExceededException: x` -> `QuotaExceededException: x`; else `line`."""
    if not line or line[0] not in _QUALIFIER_START:
        return line
    if len(line) <= _SHORT_LINE:  # few qualifiers to try: the defining pattern is quick
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
