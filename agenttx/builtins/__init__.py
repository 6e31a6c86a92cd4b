"""Built-in tools: a key-value table, records with keys, sandboxed files and staged effects.

Their arguments, outputs, state keys (`kv/{key}`, `records/{table}/{id}`), sandbox rules and
error messages are those of `docs/protocol.md#built-in-tools`, written so that the Clean Hint
cleaner turns each failure into its hint::

    import agenttx
    import agenttx.builtins

    tx = agenttx.Transaction(tools=agenttx.builtins.tools("sandbox"))
    tx.execute_step(1, "kv.put", {"key": "a", "value": 1})

`restore_file` is the `fs.restore_file` compensation on its own, for a recovery process that
must undo `fs.write`s of transactions that crashed.
"""

# The public path `agenttx.builtins` is fixed by the design; it never shadows the standard
# library's `builtins`, since it is only importable as a submodule of agenttx.
# ruff: noqa: A005

from __future__ import annotations

from ._catalog import tools as tools
from ._fs import restore_file as restore_file

__all__ = ["restore_file", "tools"]
