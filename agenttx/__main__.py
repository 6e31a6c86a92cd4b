"""`python -m agenttx COMMAND` and the `agenttx` script: the command line (see `agenttx._cli`),
with `agenttx ui` (see `agenttx._ui`) plugged in."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ._cli import main as _command_line
from ._ui import add_ui_command

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line, `ui` included, with `argv` (default: `sys.argv[1:]`); return the
    exit status (as `agenttx._cli.main`)."""
    return _command_line(argv, extra=(add_ui_command,))


if __name__ == "__main__":
    sys.exit(main())
