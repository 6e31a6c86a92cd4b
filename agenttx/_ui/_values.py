"""Values from an agent or a tool, made safe to show in a page: every string shown with its
terminal escape codes and other control characters written out as visible text (`\\x1b`),
cut to its first 4 KiB with its whole size said, and folded when it is long.

Pure: the templates escape the text (Jinja2's autoescape) and decide the folding from
`Shown.long`; nothing here writes HTML.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final, final

import attrs

from .._cli import printable

if TYPE_CHECKING:
    from .._json import JSONValue

__all__ = ["CUT", "FOLD", "Shown", "shown", "shown_json", "shown_text", "size_text"]

#: The most of a value a page shows: its first 4 KiB (characters), then its size is said.
CUT: Final = 4096
#: A value longer than this (or on several lines) is folded (`<details>`).
FOLD: Final = 120


@final
@attrs.frozen(kw_only=True)
class Shown:
    """A value as a page shows it: `text` (visible characters only, at most `CUT` of them),
    `size` (the whole value's length in UTF-8 bytes), `cut` (whether `text` is only its
    start) and `long` (whether it is folded)."""

    text: str
    size: int
    cut: bool

    @property
    def long(self) -> bool:
        """Whether the page folds it: too long for a line, or on several lines."""
        return self.cut or len(self.text) > FOLD or "\n" in self.text

    @property
    def summary(self) -> str:
        """Its first line, shortened, for the fold's summary."""
        first = self.text.split("\n", 1)[0]
        return first[:FOLD] + ("..." if len(first) > FOLD or "\n" in self.text else "")

    @property
    def size_said(self) -> str:
        """Its size for a person (`10.0 MB`)."""
        return size_text(self.size)


def size_text(size: int) -> str:
    """`size` bytes for a person: `512 B`, `4.0 KB`, `10.0 MB`."""
    if size < 1000:
        return f"{size} B"
    for unit in ("KB", "MB", "GB"):
        size_f = size / 1000
        if size_f < 1000 or unit == "GB":
            return f"{size_f:.1f} {unit}"
        size = int(size_f)
    return f"{size} B"  # pragma: no cover - the loop returns


def shown_text(text: str, *, limit: int = CUT) -> Shown:
    """A string as text (a tool name, an agent id, an error message): control characters
    written out, cut to `limit` characters. Costs the same for a 10 MB string as for a short
    one but for counting its size."""
    head = text[: limit + 1]
    cut = len(text) > limit
    size = _utf8_size(text)
    return Shown(text=printable(head[:limit]), size=size, cut=cut)


def shown_json(value: JSONValue, *, pretty: bool = False) -> Shown:
    """A JSON value as JSON text (indented with `pretty`, unless it fits on a short line),
    every line's control characters written out, cut to `CUT` characters. A huge string is cut
    before it is encoded."""
    trimmed = _trimmed(value)
    text = json.dumps(trimmed, ensure_ascii=False)
    if pretty and len(text) > FOLD:
        text = json.dumps(trimmed, ensure_ascii=False, indent=2)
    lines = [printable(line, json_text=True) for line in text[: CUT + 1].split("\n")]
    whole = "\n".join(lines)
    size = _json_size(value)
    cut = size > len(text.encode("utf-8", "surrogatepass")) or len(text) > CUT
    return Shown(text=whole[:CUT], size=size, cut=cut)


def shown(value: object) -> Shown:
    """A stored value: a string as text, anything else as JSON."""
    if isinstance(value, str):
        return shown_text(value)
    return shown_json(value)  # type: ignore[arg-type]  # stored values are JSON


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))  # 10 MB: a few milliseconds


def _trimmed(value: JSONValue) -> JSONValue:
    """`value` with every string cut to a little more than `CUT` characters (what is shown
    of it), so that encoding it costs little however large its strings are."""
    if isinstance(value, str):
        return value[: CUT + 1]
    if isinstance(value, list):
        return [_trimmed(item) for item in value[: CUT + 1]]
    if isinstance(value, dict):
        return {key[: CUT + 1]: _trimmed(item) for key, item in list(value.items())[: CUT + 1]}
    return value


def _json_size(value: JSONValue) -> int:
    """The length of `value`'s compact JSON in UTF-8 bytes, about (a string's escapes are
    counted as one character each: the size said is what the value weighs)."""
    if isinstance(value, str):
        return _utf8_size(value) + 2
    if isinstance(value, list):
        return 2 + sum(_json_size(item) + 1 for item in value) - (1 if value else 0)
    if isinstance(value, dict):
        parts = sum(_utf8_size(key) + 3 + _json_size(item) + 1 for key, item in value.items())
        return 2 + parts - (1 if value else 0)
    return len(json.dumps(value))
