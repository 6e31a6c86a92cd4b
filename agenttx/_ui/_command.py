"""`agenttx ui TARGET`: serve the page over a store until interrupted.

It binds `--host` (127.0.0.1 by default) and `--port` (8765; 0 picks a free one), prints one
line `agenttx ui: http://HOST:PORT/?token=TOKEN` once it listens (the real port), and serves
until SIGINT or SIGTERM (uvicorn's own handling: it finishes the requests under way). The
token is `--token`, else `AGENTTX_UI_TOKEN`, else a fresh `secrets.token_urlsafe(32)`. It
reads through a read-only store (`open_target`, as `agenttx inspect`), and writes each
decision through a store opened for it (as `agenttx approve`), so it is safe beside running
agents. Starlette, uvicorn and Jinja2 are imported only when it runs; without them it says
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
    from collections.abc import Iterator

    from .._cli import CliStore, Parser

__all__ = ["EXTRA", "TOKEN_ENV", "add_ui_command", "url_line"]

#: What to install for `agenttx ui`.
EXTRA: Final = "pip install 'agenttx[ui]'"
#: The environment variable that gives the token when `--token` does not.
TOKEN_ENV: Final = "AGENTTX_UI_TOKEN"  # noqa: S105 - a variable's name, not a secret
_PORT: Final = 8765


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
    ui.add_argument("--token", help=f"the token the URL carries (default: ${TOKEN_ENV}, or new)")
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
    from ._security import check_token  # noqa: PLC0415

    token = args.token or os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(32)
    try:
        check_token(token)
    except ValueError as exc:
        raise Failure(str(exc)) from None
    target = open_target(args.db, WAIT, schema=args.schema)

    @contextlib.contextmanager
    def writer() -> Iterator[CliStore]:
        store = open_target(args.db, WAIT, schema=args.schema, write=True).store
        try:
            yield store
        finally:
            store.close()

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
        )
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        print(url_line(args.host, sock.getsockname()[1], token), flush=True)  # noqa: T201
        server.run(sockets=[sock])
    finally:
        sock.close()
        target.store.close()
    sys.stdout.flush()


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
