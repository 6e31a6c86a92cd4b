"""What the store keeps of a transaction when it ends: its commit or its discard (`Record`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .._errors import TransactionNotFound
from .._events import EventKind
from .._results import TxStatus
from ..stores import is_durable

if TYPE_CHECKING:
    from .._events import EventSink
    from .._json import JSONValue
    from .._txlog import TxLog
    from ..stores import Store
    from ._views import Views

__all__ = ["Record"]


class Record:
    """The store's side of a transaction's end, with its durable log (`TxLog`) or without.

    On a `DurableStore` the log writes the end and the history (with the audit trail) in one
    commit; on any other store, the store commits or discards the transaction's writes. Called
    by the transaction while it holds its turn, once per end. The steps and the progress the
    log writes on the way are the step pipeline's (they are on its hot path).
    """

    __slots__ = ("_events", "_log", "_store", "_tx_id", "_views")

    def __init__(
        self, tx_id: str, *, store: Store, log: TxLog | None, events: EventSink, views: Views
    ) -> None:
        self._tx_id = tx_id
        self._store = store
        self._log = log
        self._events = events
        self._views = views

    def commit(self, data: dict[str, JSONValue]) -> float:
        """Commit the store's side; a durable log keeps the history in the same commit, with
        the audit trail ending in the `committed` event (`data`), which the caller records once
        the commit succeeded, at the time returned. Raises what the store raises (a conflict:
        `WriteConflict` or `ReadConflict`)."""
        at = time.time()
        if self._log is None:
            self._store.commit(self._tx_id)
        else:
            audit = self._events.compact([(EventKind.COMMITTED, at, data)])
            self._log.commit(self._views.history_text(TxStatus.COMMITTED, audit))
        return at

    def committed_anyway(self) -> bool:
        """After the store's commit raised: whether it committed all the same (a durable store
        no longer has the transaction; any other store no longer has it open). Never raises:
        if it cannot tell, False (the transaction stays as it was)."""
        try:
            if is_durable(self._store):
                self._store.owner(self._tx_id)
                return False
            return not self._store.is_open(self._tx_id)
        except TransactionNotFound:
            return True
        except Exception:  # noqa: BLE001  (cannot tell: it stays as it was, ACTIVE)
            return False

    def discard(self, final: TxStatus, *, keep_undos: bool) -> None:
        """End the store's side as `final` without committing; a durable store keeps the
        history, and with `keep_undos` the undo records that failed, for recovery."""
        if self._log is None:
            self._store.discard(self._tx_id)
        else:
            self._log.end(final.value, self._views.history_text(final), keep_undos=keep_undos)
