"""TARGET: the store a command reads or decides in, a SQLite file or a PostgreSQL DSN, or the
`AGENTTX_DATABASE` environment variable when it is left out. `open_target` is the one place
that opens a store for the command line; the commands read it only through the store
protocols (`CliStore`), so every command gives the same output on both stores."""

from __future__ import annotations

import os
import re
import shlex
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple

from .._errors import AgentTxError
from ._reading import check_database_path, patiently
from ._terminal import Failure, hide

if TYPE_CHECKING:
    import argparse

    from ._store import CliStore

__all__ = [
    "ENV",
    "Target",
    "add_target",
    "dsn_secrets",
    "hide_dsn",
    "is_dsn",
    "open_target",
    "resolve_target",
]

#: The environment variable naming the TARGET when a command is given none.
ENV: Final = "AGENTTX_DATABASE"
#: The schemes of a PostgreSQL connection URI (libpq's).
_SCHEMES: Final = ("postgresql://", "postgres://")
#: How long to try to reach a PostgreSQL server, in seconds.
_CONNECT_TIMEOUT: Final = 5.0
#: The longest SQLite waits for a lock within one try of a read (so that a try does not
#: outlast `--wait` by more), in seconds.
_MAX_TRY: Final = 0.5
_EXTRA: Final = "pip install 'agenttx[postgres]'"
#: `PostgresStore`'s default schema.
_SCHEMA: Final = "agenttx"


class Target(NamedTuple):
    """An open store, the name to show for it in messages (a DSN without its password), the
    TARGET to write in a command the person may run next ("" when it came from
    `AGENTTX_DATABASE`: the command finds it there too) and the options it needs."""

    store: CliStore
    name: str
    arg: str
    options: str = ""

    def command(self, verb: str, rest: str = "") -> str:
        """The command line `agenttx VERB TARGET REST OPTIONS` on this store (options last:
        argparse takes no positional after an option once an optional one was left out)."""
        return " ".join(part for part in ("agenttx", verb, self.arg, rest, self.options) if part)


def is_dsn(text: str) -> bool:
    """Whether `text` is a PostgreSQL connection URI (`postgresql://...`, `postgres://...`)."""
    return text.startswith(_SCHEMES)


def add_target(command: argparse.ArgumentParser) -> None:
    """TARGET (optional: `AGENTTX_DATABASE` when left out) and `--schema`."""
    command.add_argument(
        "db",
        metavar="TARGET",
        nargs="?",
        help=f"a SQLite file or a PostgreSQL DSN (postgresql://...); default: ${ENV}",
    )
    command.add_argument(
        "--schema",
        default=_SCHEMA,
        metavar="NAME",
        help="the PostgreSQL schema of the store (default: agenttx); ignored for SQLite",
    )


def resolve_target(args: argparse.Namespace, shifted: str | None = None) -> None:
    """With `AGENTTX_DATABASE` set, a command whose optional argument `shifted` follows TARGET
    (`inspect [TARGET] [TX]`) takes a lone first argument that is neither a DSN nor an
    existing file as that argument, and its TARGET from the environment."""
    if shifted is None or not os.environ.get(ENV) or args.db is None:
        return
    if getattr(args, shifted) is None and not _names_a_store(args.db):
        setattr(args, shifted, args.db)
        args.db = None


def _names_a_store(text: str) -> bool:
    return is_dsn(text) or Path(text).exists()


def open_target(
    db: str | None,
    wait: float,
    *,
    schema: str = _SCHEMA,
    write: bool = False,
    statement_timeout: float | None = None,
) -> Target:
    """The store TARGET `db` names (None: `AGENTTX_DATABASE`), opened read-only unless
    `write`; `Failure` (one line, status 2) if it cannot be opened. Opening changes nothing,
    written or not: no pruning of the history (a decision must not delete what the agents
    keep), no migration. `statement_timeout` (seconds, PostgreSQL): the longest a statement
    may run or wait for a lock (a SQLite store waits `wait`, or 5 s to write)."""
    arg = "" if db is None else db
    if db is None:
        db = os.environ.get(ENV, "")
        if not db:
            raise Failure(f"no TARGET given, and {ENV} is not set")
    if is_dsn(db):
        name = hide_dsn(db)
        options = "" if schema == _SCHEMA else f"--schema {schema}"
        store = _open_postgres(db, name, schema, statement_timeout)
        return Target(store, name, _quoted(arg and name), options)
    check_database_path(db)
    from ..stores import SQLiteStore  # noqa: PLC0415  (sqlite3 only when a file is read)

    try:
        if write:  # a decision waits for the write lock as long as the store's default
            store = SQLiteStore(db, keep_history=None, keep_history_for=None)
        else:
            store = patiently(
                wait, lambda: SQLiteStore(db, readonly=True, busy_timeout=min(wait, _MAX_TRY))
            )
    except AgentTxError as exc:
        raise Failure(str(exc)) from None
    return Target(store, db, _quoted(arg))


def _open_postgres(
    dsn: str, name: str, schema: str, statement_timeout: float | None = None
) -> CliStore:
    """A `PostgresStore` on `dsn` that changes nothing by opening: no migration, no pruning of
    the history (the workers' stores do both), and no lease taken."""
    from ..stores import PostgresStore  # noqa: PLC0415  (psycopg only for a DSN)

    try:
        return PostgresStore(
            dsn,
            schema=schema,
            migrate=False,
            keep_history=None,
            keep_history_for=None,
            connect_timeout=_CONNECT_TIMEOUT,
            statement_timeout=statement_timeout,
        )
    except ImportError:
        raise Failure(f"a PostgreSQL TARGET needs psycopg: {_EXTRA}") from None
    except AgentTxError as exc:
        message = " ".join(str(exc).replace(dsn, name).split())
        raise Failure(f"cannot open {name}: {message}") from None


#: The '@'-separated pieces of a password whose runs `dsn_secrets` lists (the rest is one).
_MAX_PIECES: Final = 16
#: `password=` in a DSN's query (libpq's URI parameter), its value up to the next parameter.
_QUERY_PASSWORD: Final = re.compile(r"([?&]password=)([^&#]*)")


def _credentials(rest: str) -> tuple[int, int] | None:
    """Where the password of a DSN after its scheme (`rest`) starts and ends: after the first
    ':' of the user information, up to the last '@' before the first '/' that follows the
    first '@' (a password may hold an '@', which libpq splits at the first one and urllib at
    the last); None without one. A '/' before the first '@' leaves no user information, for
    libpq and urllib alike."""
    first = rest.find("@")
    if first == -1 or "/" in rest[:first]:
        return None
    slash = rest.find("/", first)
    end = rest.rfind("@", 0, len(rest) if slash == -1 else slash)
    colon = rest.find(":", 0, end)
    return None if colon == -1 else (colon + 1, end)


def dsn_secrets(dsn: str) -> tuple[str, ...]:
    """Every text of `dsn` that may be (a part of) its password, longest first: the password
    as libpq reads it (up to the first '@'), as urllib does (up to the last '@' of the
    authority), each run of its pieces between '@'s, the `password=` query parameters, each
    raw and percent-decoded. Whatever a message quotes of the DSN, these are what must not show."""
    rest = dsn.split("://", 1)[-1]
    passwords = [value for _, value in _QUERY_PASSWORD.findall(rest)]
    first = rest.find("@")
    if first != -1:
        passwords.append(rest[:first].partition(":")[2])  # libpq's, even after a '/'
    found = _credentials(rest)
    if found is not None:
        passwords.append(rest[found[0] : found[1]])
    candidates: set[str] = set()
    for password in passwords:
        pieces = password.split("@")[:_MAX_PIECES]
        for start in range(len(pieces)):  # every run of pieces: libpq may show any of them
            for end in range(start + 1, len(pieces) + 1):
                piece = "@".join(pieces[start:end])
                candidates.update((piece, urllib.parse.unquote(piece)))
        candidates.update((password, urllib.parse.unquote(password)))
    candidates.discard("")
    return tuple(sorted(candidates, key=lambda text: (-len(text), text)))


def hide_dsn(dsn: str) -> str:
    """Hide `dsn`'s password (`dsn_secrets`) from every line printed from now on, the
    driver's messages included, and `dsn` itself behind its name; return that name."""
    name = _without_password(dsn)
    if name != dsn:
        hide([dsn], shown_as=name)
    hide(dsn_secrets(dsn))
    return name


def _without_password(dsn: str) -> str:
    """`dsn` with its password, if any, written as `***` (it is shown in messages)."""
    scheme, _, rest = dsn.partition("://")
    found = _credentials(rest)
    if found is not None:
        rest = f"{rest[: found[0]]}***{rest[found[1] :]}"
    return scheme + "://" + _QUERY_PASSWORD.sub(r"\1***", rest)


def _quoted(arg: str) -> str:
    return shlex.quote(arg) if arg else ""
