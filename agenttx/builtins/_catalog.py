"""`tools(fs_root)`: every built-in tool and compensation, ready for a transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._effect import effect_stage
from ._fs import fs_tools
from ._kv import KV_TOOLS
from ._records import RECORD_TOOLS

if TYPE_CHECKING:
    import os

    from .._json import JSONValue
    from .._tools import Compensation, Tool

__all__ = ["tools"]


def tools(
    fs_root: str | os.PathLike[str],
) -> list[Tool[..., JSONValue] | Compensation[..., Any]]:
    """The built-in tools (`docs/protocol.md#built-in-tools`), plus `fs.restore_file`.

    `kv.put`, `kv.get`, `kv.delete`, `record.insert`, `record.get`, `fs.write`, `fs.read`,
    `effect.stage`, then `restore_file`; pass the list as `Transaction(tools=...)`. The `fs.*`
    tools are confined to `fs_root`, which is created on the first `fs.write`; each call returns
    new `fs.*` tools, so lists built for different roots do not interfere. Building the list
    touches no file.

    Every tool takes its arguments as keyword arguments, fails its step with a `ToolError`
    whose message is the one the protocol gives, and ignores arguments it does not know.
    """
    fs_write, fs_read, restore_file = fs_tools(fs_root)
    return [*KV_TOOLS, *RECORD_TOOLS, fs_write, fs_read, effect_stage, restore_file]
