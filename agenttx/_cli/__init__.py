"""The command line: `agenttx demo | inspect | graph | plans | audit | lineage | approvals |
approve | reject | review` (also `python -m agenttx`).

Every command but `demo` and `lineage` takes a TARGET: a SQLite file, a PostgreSQL DSN
(`postgresql://...`, `postgres://...`, with `--schema`), or, left out, the `AGENTTX_DATABASE`
environment variable; `_target.open_target` opens it, and the commands read it only through the
store protocols (`_store.CliStore`), so they print the same on both stores. Every command
reads, except `approve`, `reject` and `review`, which decide one pending approval request or
review, and write nothing else. `inspect` and `graph` open a SQLite file read-only (and a
PostgreSQL store without migrating, pruning or taking a lease) and look at transactions without
taking them over, so they are safe to run beside a live agent. They show the open
transactions, and the ended ones the store keeps as history (within its retention:
`keep_history=..., keep_history_for=...`), with what became of every step attempt, and what
waits for a person. A transaction that ends (commits or aborts) between the listing and its
read is left out of the open ones (`inspect DB TX` then shows it ended); one whose stored rows
cannot be read is listed as `UNREADABLE`, with the reason on a line of its own, and the others
are listed as usual. A read that finds a SQLite file locked by a writer is tried again until
`--wait` seconds have passed.

Nothing prints a traceback. Exit status: 0 done; 2 a problem with what was given (a bad option,
no TARGET, a missing file, a directory, a file that is not an agenttx store, a server that
cannot be reached, a malformed DSN, psycopg missing, an unknown or unreadable transaction, a
transcript that is not a JSON list), printed as one line; 1 a store that stayed
locked for the whole `--wait`, or any unexpected error, printed as one line `agenttx: error:
TYPE: MESSAGE`; 130 interrupted (Ctrl-C), quietly.

Everything printed passes through `_terminal.printable`, so text from a store or a transcript (agent
ids, tool names, hints, context, values, error messages) can never send control characters
to the terminal: C0 and C1 controls, DEL, Unicode's bidirectional overrides and line
separators, and lone surrogates are written as escapes (`\\x1b`, `\\r`, `\\u202e`).

The package also lends `agenttx ui` (`agenttx._ui`, which must not be imported from here)
its readers, exported below, and takes its command through `main(extra=...)`.

The package: `_main` parses and runs the commands, `_target` opens TARGET, `_store` is the
protocol the commands read through, `_reading` reads a store patiently and read-only, `_shown`
builds the lines of `inspect` and `plans`, `_trail` those of `audit`, `_people` holds the
commands that decide approvals and reviews and what waits for a person, and `_terminal` is the
one place that prints (and refuses).
"""

from __future__ import annotations

from ._main import AddCommand, main
from ._reading import EndedFound, age_of, final_status, graph_of, patiently, read_tx, tx_status
from ._shown import (
    ORPHANED,
    shown_status,
    uk_time,
    unfinished_prerequisites,
    waiting_nodes,
)
from ._store import CliStore
from ._target import Target, add_target, open_target
from ._terminal import WAIT, Failure, Parser, add_wait, cut, printable, say
from ._trail import summary

__all__ = [
    "ORPHANED",
    "WAIT",
    "AddCommand",
    "CliStore",
    "EndedFound",
    "Failure",
    "Parser",
    "Target",
    "add_target",
    "add_wait",
    "age_of",
    "cut",
    "final_status",
    "graph_of",
    "main",
    "open_target",
    "patiently",
    "printable",
    "read_tx",
    "say",
    "shown_status",
    "summary",
    "tx_status",
    "uk_time",
    "unfinished_prerequisites",
    "waiting_nodes",
]
