"""`agenttx ui TARGET`: serve the page over a store until interrupted.

It binds `--host` (127.0.0.1 by default) and `--port` (8765; 0 picks a free one), prints one
line `agenttx ui: http://HOST:PORT/?token=TOKEN` once it listens (the real port), and serves
until SIGINT or SIGTERM (uvicorn's own handling: it finishes the requests under way). The
token is `--token`, else `AGENTTX_UI_TOKEN` (better: argv is visible to every local user in
the process list), else a fresh `secrets.token_urlsafe(32)`; a token given must be at least
`MIN_TOKEN` characters. It reads through a read-only store (`open_target`, as `agenttx
inspect`), and writes each decision through a store opened for it (as `agenttx approve`, which
prunes nothing), so it is safe beside running agents; on PostgreSQL every statement of either
gives up after `STATEMENT_TIMEOUT` seconds (a page then says why in one line). Starlette,
uvicorn and Jinja2 are imported only when it runs; without them it says
which extra to install (`pip install 'agenttx[ui]'`), status 2.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
import urllib.parse
from typing import TYPE_CHECKING, Final

from .._cli import WAIT, Failure, add_target, open_target

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterator
    from contextlib import AbstractContextManager

    from .._cli import CliStore, Parser

__all__ = [
    "EXTRA",
    "MIN_TOKEN",
    "STATEMENT_TIMEOUT",
    "TOKEN_ENV",
    "add_ui_command",
    "given_token",
    "url_line",
    "writer_of",
]

#: What to install for `agenttx ui`.
EXTRA: Final = "pip install 'agenttx[ui]'"
#: The environment variable that gives the token when `--token` does not.
TOKEN_ENV: Final = "AGENTTX_UI_TOKEN"  # noqa: S105 - a variable's name, not a secret
_PORT: Final = 8765
#: The shortest token a person may give (`--token`, `AGENTTX_UI_TOKEN`): guessing one must
#: be hopeless (the fresh one is 43 characters).
MIN_TOKEN: Final = 32
#: The longest a statement of the page's PostgreSQL stores may run or wait for a lock (s),
#: as a SQLite store waits 5 s for a lock.
STATEMENT_TIMEOUT: Final = 5.0


def add_ui_command(commands: argparse._SubParsersAction[Parser]) -> None:
    """Add `ui` to the command line's subparsers."""
    ui = commands.add_parser(
        "ui",
        help="serve a local web page over a store: runs, graphs, the approval inbox, the audit",
        description="Serve a local web app over TARGET: the runs (live), each transaction "
        "with its graph, timeline, compensations, staged effects and rewind preview, each "
        "plan run with its DAG and timeline, the approval inbox (approve, reject with a "
        "reason, edit the arguments, resolve reviews) and the audit trail. Binds 127.0.0.1 "
        "by default and prints the URL with its token; every request without the token is "
        f"refused. Needs the ui extra: {EXTRA}.",
    )
    add_target(ui)
    ui.add_argument("--host", default="127.0.0.1", help="the address to bind (127.0.0.1)")
    ui.add_argument(
        "--port", type=_port, default=_PORT, help=f"the port ({_PORT}; 0 picks a free one)"
    )
    ui.add_argument("--read-only", action="store_true", help="serve no writes at all")
    ui.add_argument(
        "--token",
        help=f"the token the URL carries, at least {MIN_TOKEN} characters (default: "
        f"${TOKEN_ENV}, or a new one). Prefer ${TOKEN_ENV}: an argument is visible to "
        "every local user in the process list",
    )
    ui.add_argument("--actor", metavar="NAME", help="who decides (default: ui:<os user>)")
    ui.set_defaults(run=_run_ui)


def _port(text: str) -> int:
    import argparse  # noqa: PLC0415

    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {port}")
    return port


def url_line(host: str, port: int, token: str) -> str:
    """The one line `agenttx ui` prints once it listens."""
    shown = f"[{host}]" if ":" in host else host
    return f"agenttx ui: http://{shown}:{port}/?token={urllib.parse.quote(token, safe='')}"


def _run_ui(args: argparse.Namespace) -> None:
    try:
        import jinja2  # noqa: F401, PLC0415
        import starlette  # noqa: F401, PLC0415
        import uvicorn  # noqa: PLC0415
    except ImportError as exc:
        raise Failure(
            f"needs Starlette, uvicorn and Jinja2 ({exc.name} is missing): {EXTRA}"
        ) from None
    from ._app import make_app  # noqa: PLC0415

    token = given_token(args.token or os.environ.get(TOKEN_ENV))
    target = open_target(args.db, WAIT, schema=args.schema, statement_timeout=STATEMENT_TIMEOUT)
    writer = writer_of(args.db, args.schema)
    try:
        sock = _listening(args.host, args.port)
    except OSError as exc:
        target.store.close()
        raise Failure(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    try:
        app = make_app(
            target.store,
            token=token,
            read_only=args.read_only,
            actor=args.actor,
            writer=writer,
            hosts=(f"[{args.host}]" if ":" in args.host else args.host,),
        )
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        print(url_line(args.host, sock.getsockname()[1], token), flush=True)  # noqa: T201
        server.run(sockets=[sock])
    finally:
        sock.close()
        target.store.close()
    sys.stdout.flush()


def given_token(given: str | None) -> str:
    """The server's token: `given` (`--token` or `AGENTTX_UI_TOKEN`) if it is one (at least
    `MIN_TOKEN` characters of the URL-safe ones), else `Failure`; a fresh one if None."""
    from ._security import check_token  # noqa: PLC0415

    if not given:
        return secrets.token_urlsafe(32)
    if len(given) < MIN_TOKEN:
        raise Failure(
            f"the token must be at least {MIN_TOKEN} characters (it is all that guards the "
            f"page; leave it out for a fresh one), got {len(given)}"
        )
    try:
        return check_token(given)
    except ValueError as exc:
        raise Failure(str(exc)) from None


def writer_of(db: str | None, schema: str) -> Callable[[], AbstractContextManager[CliStore]]:
    """What opens the store a decision is written through: writable, pruning nothing (as
    `agenttx approve`), its PostgreSQL statements bounded by `STATEMENT_TIMEOUT`; closed after
    the decision."""

    @contextlib.contextmanager
    def writer() -> Iterator[CliStore]:
        store = open_target(
            db, WAIT, schema=schema, write=True, statement_timeout=STATEMENT_TIMEOUT
        ).store
        try:
            yield store
        finally:
            store.close()

    return writer


def _listening(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` (0: a free one) and listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock
