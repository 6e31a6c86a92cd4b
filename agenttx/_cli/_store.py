"""`CliStore`: what the command line and the web page read and decide through, as store
protocols only."""

from __future__ import annotations

from typing import Protocol

from ..stores import DurableStore, HistoryStore, PlanStore, RequestStore

__all__ = ["CliStore"]


class CliStore(DurableStore, HistoryStore, PlanStore, RequestStore, Protocol):
    """A store every command works on: `SQLiteStore` and `PostgresStore` both are one."""

    def list_runs(
        self, limit: int = 50, offset: int = 0, *, kind: str | None = None
    ) -> tuple[tuple[str, str, float, str | None, str | None, str | None], ...]:
        """One page of the ended transactions and plan runs, the latest first, `offset` rows
        skipped, as `(kind, id, at, status, record, history)` (`SQLiteStore.list_runs`)."""
        ...

    def close(self) -> None:
        """Let the store go."""
        ...
