"""Helpers of the `agenttx ui` tests (`test_ui_browser.py`, `test_ui_crash.py`): the agent and
plan processes they drive, the `agenttx ui` server as a process, the forms of a page read
without a browser, and a small PNG decoder to tell a screenshot from a blank one."""

from __future__ import annotations

import contextlib
import html.parser
import json
import os
import re
import secrets
import signal
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Iterator

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
AGENT = TESTS / "_ui_agent.py"
PLAN = TESTS / "_ui_plan.py"
#: What the agent of `_ui_agent.py` sends, and the tool's name.
ARGS = {"amount": 500, "card": "4242"}


class Backend(NamedTuple):
    """A store's backend: TARGET, the options naming it beside TARGET (`--schema` for
    PostgreSQL, for the agent and `agenttx ui` alike), and its schema ("" for SQLite)."""

    target: str
    options: tuple[str, ...]
    schema: str


@contextlib.contextmanager
def backend_of(kind: str, folder: Path) -> Iterator[Backend]:
    """An empty store: a SQLite file in `folder`, or a new schema on the test session's
    PostgreSQL server (dropped after)."""
    from agenttx.stores import PostgresStore, SQLiteStore  # noqa: PLC0415
    from conftest import drop_schema, postgres_dsn  # noqa: PLC0415

    if kind == "sqlite":
        SQLiteStore(folder / "agent.db").close()  # the file exists, an empty store
        yield Backend(str(folder / "agent.db"), (), "")
        return
    dsn, schema = postgres_dsn(), f"t_{secrets.token_hex(6)}"
    PostgresStore(dsn, schema=schema).close()  # the schema exists, migrated
    try:
        yield Backend(dsn, ("--schema", schema), schema)
    finally:
        drop_schema(dsn, schema)


def child_env() -> dict[str, str]:
    """The environment of a child process: this worktree's agenttx first."""
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), path) if p)}


#: The processes `spawn` started, killed by `reap` if still running when a test ends.
SPAWNED: list[subprocess.Popen[str]] = []


def spawn(script: Path, *args: str) -> subprocess.Popen[str]:
    """`python SCRIPT ARGS...`, its output piped (killed by `reap` if left running)."""
    process = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    SPAWNED.append(process)
    return process


def reap() -> None:
    """Kill what `spawn` started and a test left running (it failed halfway)."""
    while SPAWNED:
        process = SPAWNED.pop()
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=60)


def first_line(process: subprocess.Popen[str]) -> dict[str, Any]:
    """The first line the process prints, as JSON (its stderr if it printed none)."""
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        _, err = process.communicate(timeout=60)
        raise AssertionError(
            f"the process ended (status {process.returncode}) printing nothing: {err}"
        )
    return dict(json.loads(line))


def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    """The last line the process prints before it exits 0, as JSON."""
    out, err = process.communicate(timeout=240)
    assert process.returncode == 0, err
    return dict(json.loads(out.strip().splitlines()[-1]))


def kill(process: subprocess.Popen[str]) -> None:
    """SIGKILL the process and reap it; it must not have ended by itself first."""
    assert process.poll() is None, process.communicate()
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL


def effects(root: Path) -> list[dict[str, Any]]:
    """The charges the agent's tool made (its effect counter)."""
    log = root / "effects.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


# ---------------------------------------------------------------------- the server


class Server(NamedTuple):
    """A running `agenttx ui`: the URL it printed, its origin and its token."""

    url: str
    origin: str
    token: str
    process: subprocess.Popen[str]

    def page(self, path: str) -> str:
        """The URL of `path` on this server, with the token."""
        joiner = "&" if "?" in path else "?"
        return f"{self.origin}{path}{joiner}token={self.token}"


_URL = re.compile(r"^agenttx ui: (?P<origin>http://[^/\s]+)/\?token=(?P<token>\S+)$")


@contextlib.contextmanager
def ui_server(target: str, *options: str) -> Iterator[Server]:
    """`python -m agenttx ui TARGET --port 0 OPTIONS...` as a process, stopped (SIGTERM) after;
    its log goes to a file (a pipe nobody reads would fill and stop it)."""
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "agenttx", "ui", target, "--port", "0", *options],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=child_env(),
            cwd=ROOT,
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline().rstrip("\n")
            found = _URL.match(line)
            if found is None:
                process.kill()
                process.communicate(timeout=60)
                log.seek(0)
                raise AssertionError(f"agenttx ui printed {line!r}, not its URL: {log.read()}")
            yield Server(line.split(": ", 1)[1], found["origin"], found["token"], process)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.communicate(timeout=30)


# ---------------------------------------------------------------------- forms without a browser


class Form(NamedTuple):
    """A form of a page: its classes, action, method, and fields (name to value)."""

    classes: tuple[str, ...]
    action: str
    method: str
    fields: dict[str, str]
    owner: dict[str, str]  # the data-* attributes of the nearest element carrying some


class _Forms(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[Form] = []
        self._owners: list[tuple[str, dict[str, str]]] = []
        self._form: Form | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {key: value or "" for key, value in attrs}
        data = {key: value for key, value in found.items() if key.startswith("data-")}
        if data and tag not in ("input", "button", "textarea", "form"):
            self._owners.append((tag, data))
        if tag == "form":
            owner = self._owners[-1][1] if self._owners else {}
            self._form = Form(
                tuple(found.get("class", "").split()),
                found.get("action", ""),
                found.get("method", "get").lower(),
                {},
                owner,
            )
        elif self._form is not None and tag in ("input", "select") and found.get("name"):
            if found.get("type") not in ("submit", "button"):
                self._form.fields[found["name"]] = found.get("value", "")
        elif self._form is not None and tag == "textarea" and found.get("name"):
            self._textarea = found["name"]
            self._form.fields[self._textarea] = ""

    def handle_data(self, data: str) -> None:
        if self._form is not None and self._textarea is not None:
            self._form.fields[self._textarea] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self._textarea = None
        elif tag == "form" and self._form is not None:
            self.forms.append(self._form)
            self._form = None
        elif self._owners and self._owners[-1][0] == tag:
            self._owners.pop()


def forms(page: str) -> list[Form]:
    """The forms of an HTML page, each with the data-* attributes of what holds it."""
    parser = _Forms()
    parser.feed(page)
    parser.close()
    return parser.forms


def form_of(page: str, kind: str, **owner: str) -> Form:
    """The one form of class `kind` whose holder has the data-* attributes `owner`
    (`request_id="..."` is `data-request-id`)."""
    wanted = {f"data-{key.replace('_', '-')}": value for key, value in owner.items()}
    found = [
        form
        for form in forms(page)
        if kind in form.classes and all(form.owner.get(k) == v for k, v in wanted.items())
    ]
    assert len(found) == 1, f"{len(found)} forms .{kind} held by {wanted} in:\n{page}"
    return found[0]


# ---------------------------------------------------------------------- screenshots


def png_colours(path: Path, enough: int = 16) -> int:
    """How many distinct pixel colours the PNG at `path` has, counting up to `enough` (the
    decoding stops there). 8-bit RGB or RGBA, not interlaced: what Chromium writes."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    offset, header, idat = 8, b"", bytearray()
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        offset += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8, f"unexpected PNG {header!r}"
    assert colour in (2, 6), f"unexpected PNG {header!r}"
    assert interlace == 0, f"unexpected PNG {header!r}"
    size = 3 if colour == 2 else 4
    raw = zlib.decompress(bytes(idat))
    stride = width * size
    previous = bytearray(stride)
    seen: set[bytes] = set()
    for row in range(height):
        start = row * (stride + 1)
        line = _unfilter(raw[start], bytearray(raw[start + 1 : start + 1 + stride]), previous, size)
        seen.update(bytes(line[i : i + size]) for i in range(0, stride, size * 7))  # 1 in 7
        if len(seen) >= enough:
            return len(seen)
        previous = line
    return len(seen)


def _unfilter(kind: int, line: bytearray, up: bytearray, size: int) -> bytearray:
    if kind == 1:
        for i in range(size, len(line)):
            line[i] = (line[i] + line[i - size]) & 0xFF
    elif kind == 2:
        for i in range(len(line)):
            line[i] = (line[i] + up[i]) & 0xFF
    elif kind == 3:
        for i in range(len(line)):
            left = line[i - size] if i >= size else 0
            line[i] = (line[i] + ((left + up[i]) >> 1)) & 0xFF
    elif kind == 4:
        for i in range(len(line)):
            a = line[i - size] if i >= size else 0
            b = up[i]
            c = up[i - size] if i >= size else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            near = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            line[i] = (line[i] + near) & 0xFF
    return line
