"""The agenttx command line: `python -m agenttx COMMAND` (also installed as `agenttx`)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from . import __version__, _demo

if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with `argv` (default: `sys.argv[1:]`); return the exit status."""
    parser = argparse.ArgumentParser(
        prog="agenttx", description="Transactions for AI agent tool calls."
    )
    parser.add_argument("--version", action="version", version=f"agenttx {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser(
        "demo",
        help="run the demo: an order workflow that fails, rewinds to the root cause and commits",
        description="Run an order workflow through a transaction: a foreign-key failure, the "
        "hint, the dependency jump with its compensations, the corrected replay and the commit.",
    )
    args = parser.parse_args(argv)
    if args.command == "demo":
        _demo.run()
        return 0
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
