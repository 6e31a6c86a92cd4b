"""What reaches the terminal: escaped lines, one-line failures with their exit status,
argparse's errors (escaped too), and the argument types the commands share."""

from __future__ import annotations

import argparse
import math
import sys
from itertools import chain
from typing import TYPE_CHECKING, Final, NoReturn

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import TextIO

    from .._graph import DependencyGraph
    from .._lineage import LineageGraph

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "WAIT",
    "WIDTH",
    "Failure",
    "Parser",
    "add_wait",
    "cut",
    "duration",
    "forget_hidden",
    "hide",
    "printable",
    "render",
    "say",
    "say_block",
    "whole_number",
]

#: Values longer than this are cut in `inspect`'s listing of steps.
WIDTH: Final = 96
#: How long `inspect` and `graph` wait for a locked store by default, in seconds.
WAIT: Final = 5.0

#: Exit statuses.
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130


def _escapes(*, json_text: bool) -> dict[int, str]:
    """The `str.translate` table of `printable`: the code points a terminal may act on or
    that may reorder what it shows, each to an escape (JSON's `\\uXXXX` in JSON text, where
    they can only stand inside strings, so the text stays JSON with the same values)."""
    codes = chain(
        range(0x20),  # C0, tab and newline included: one printed line stays one line
        range(0x7F, 0xA0),  # DEL and C1 (0x9b is CSI, as ESC [ is)
        (0x061C, 0x200E, 0x200F, 0x2028, 0x2029),  # bidi marks, line and paragraph separators
        range(0x202A, 0x202F),  # bidi embeddings and overrides
        range(0x2066, 0x206A),  # bidi isolates
        range(0xD800, 0xE000),  # lone surrogates (from JSON's \ud800): no encoding takes them
    )
    table = {}
    for code in codes:
        if json_text or code > 0xFF:
            table[code] = f"\\u{code:04x}"
        else:
            table[code] = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code, f"\\x{code:02x}")
    return table


_TEXT_ESCAPES: Final = _escapes(json_text=False)
_JSON_ESCAPES: Final = _escapes(json_text=True)


class Failure(Exception):
    """A problem printed as one line `agenttx COMMAND: MESSAGE`; exit `status` (2: the person
    at the terminal can fix what they gave; 1: the store stayed locked)."""

    def __init__(self, message: str, *, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


class Parser(argparse.ArgumentParser):
    """argparse, with its error line escaped like everything else printed, and a command's
    options taken anywhere among its arguments (`inspect DB --schema s TX`: argparse alone
    refuses TX there, once it has passed the optional positionals)."""

    _intermixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """A command's arguments parsed intermixed (`parse_known_intermixed_args`, which calls
        this again for each of its two passes); the top parser's as argparse does."""
        if self._intermixing or self._subparsers is not None:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {printable(message)}\n")


def add_wait(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--wait",
        type=duration,
        default=WAIT,
        metavar="SECONDS",
        help=f"how long to keep trying while a writer holds the store locked (default: {WAIT:g})",
    )


def whole_number(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def duration(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return value


def render(graph: DependencyGraph | LineageGraph, fmt: str) -> str:
    """A graph in one of `FORMATS`: both graph kinds export the same three."""
    return {"dot": graph.to_dot, "mermaid": graph.to_mermaid, "json": graph.to_json}[fmt]()


def cut(text: str, width: int = WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


#: The texts no line may show (`hide`), longest first, each with what is shown instead.
_HIDDEN: list[tuple[str, str]] = []
#: A hidden text shorter than this is replaced only where a message quotes it whole (`"pw"`,
#: `'pw'`): replaced everywhere, two letters would blot out every word holding them.
_MIN_HIDDEN: Final = 3


def hide(texts: Iterable[str], *, shown_as: str = "***") -> None:
    """Write each of `texts` as `shown_as` in every line printed from now on (a DSN's
    password: `dsn_secrets`; a whole DSN as its name without the password), until
    `forget_hidden`."""
    known = {text for text, _ in _HIDDEN}
    _HIDDEN.extend((text, shown_as) for text in dict.fromkeys(texts) if text and text not in known)
    _HIDDEN.sort(key=lambda pair: len(pair[0]), reverse=True)


def forget_hidden() -> None:
    """Show again what `hide` hid (a new command starts)."""
    _HIDDEN.clear()


def _unhidden(text: str) -> str:
    for hidden, shown in _HIDDEN:
        if len(hidden) >= _MIN_HIDDEN:
            text = text.replace(hidden, shown)
        else:
            for quote in ('"', "'"):
                text = text.replace(f"{quote}{hidden}{quote}", f"{quote}{shown}{quote}")
    return text


def printable(text: str, *, json_text: bool = False) -> str:
    """`text` with every character a terminal could act on escaped (see `_escapes`), and what
    must not be shown (`hide`) written `***`; the one place that makes text safe to print,
    applied to every line the command line prints."""
    if _HIDDEN:
        text = _unhidden(text)
    return text.translate(_JSON_ESCAPES if json_text else _TEXT_ESCAPES)


def say(line: str, *, stream: TextIO | None = None) -> None:
    """Print one line, escaped: a newline inside it is shown as `\\n`, not obeyed."""
    _write(printable(line) + "\n", sys.stdout if stream is None else stream)


def say_block(text: str, *, json_text: bool) -> None:
    """Print a rendered graph: its lines as lines, each escaped (as JSON escapes, for JSON)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    _write("".join(printable(line, json_text=json_text) + "\n" for line in lines), sys.stdout)


def _write(text: str, stream: TextIO) -> None:
    """Write `text`, with what the stream's encoding cannot hold as backslash escapes."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
    stream.flush()
