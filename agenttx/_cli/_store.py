"""`CliStore`: what the command line reads and decides through, as store protocols only."""

from __future__ import annotations

from typing import Protocol

from ..stores import DurableStore, HistoryStore, PlanStore, RequestStore

__all__ = ["CliStore"]


class CliStore(DurableStore, HistoryStore, PlanStore, RequestStore, Protocol):
    """A store every command works on: `SQLiteStore` and `PostgresStore` both are one."""

    def close(self) -> None:
        """Let the store go."""
        ...
