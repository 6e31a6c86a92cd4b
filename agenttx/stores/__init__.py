"""State stores: where a transaction's key-value state lives (layer 1).

A store keeps the committed state and, for every open transaction, a private overlay of its
writes with an undo journal and snapshots; `Store` is the protocol and states the contract.
Transactions that should see each other's commits, and conflict, share one store::

    from agenttx.stores import MemoryStore

    store = MemoryStore()
    store.begin("tx-1")
    store.put("tx-1", "kv/greeting", '"hello"')
    store.snapshot("tx-1", 1)
    store.delete("tx-1", "kv/greeting")
    store.restore("tx-1", 1)  # the delete is reverted
    store.commit("tx-1")
    assert store.read_committed("kv/greeting") == '"hello"'

`SQLiteStore(path)` keeps the same state in a SQLite file, shared by threads and processes, and
implements `DurableStore`: the records a transaction needs to survive a crash, and an outbox of
committed effects. What a store may keep beyond that is a protocol each, with its contract:
`PlanStore` (plan runs), `HistoryStore` (ended transactions), `RequestStore` (approval requests
and reviews), `ConversationStore` (an agent's conversation), `ClaimingOutbox`, `LeasedStore`
and `ReleasingStore`; the library uses a capability a store has, and goes without one it lacks.
`PostgresStore(dsn_or_pool)` (extra `agenttx[postgres]`) implements it on a
PostgreSQL server shared by workers on many machines, with leases that fence every write.
`agenttx.testing.check_store(factory)` checks any implementation against the contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._approvals import MemoryRequests as MemoryRequests

# `MemoryRequests`, `owner_alive` and the `is_*`, `keeps_*`, `claims_*` and `leases_*` checks
# are for the library's upper layers, which import from this package, never from its
# modules: they are not public (not in `__all__`).
from ._approvals import RequestRow as RequestRow
from ._approvals import RequestStore as RequestStore
from ._bell import Bell as Bell
from ._bell import decision_bell as decision_bell
from ._contracts import ClaimingOutbox as ClaimingOutbox
from ._contracts import ConversationStore as ConversationStore
from ._contracts import HistoryStore as HistoryStore
from ._contracts import LeasedStore as LeasedStore
from ._contracts import PlanStore as PlanStore
from ._contracts import ReleasingStore as ReleasingStore
from ._contracts import claims_effects as claims_effects
from ._contracts import is_plan_store as is_plan_store
from ._contracts import keeps_conversations as keeps_conversations
from ._contracts import keeps_history as keeps_history
from ._contracts import leases_owners as leases_owners
from ._contracts import releases as releases
from ._durable import DurableStore as DurableStore
from ._durable import EffectRow as EffectRow
from ._durable import EndedTransaction as EndedTransaction
from ._durable import OutboxEntry as OutboxEntry
from ._durable import TxImage as TxImage
from ._durable import UndoRow as UndoRow
from ._durable import is_durable as is_durable
from ._durable import is_store as is_store
from ._memory import MemoryStore as MemoryStore
from ._owners import owner_alive as owner_alive
from ._plans import PlanChange as PlanChange
from ._plans import PlanExpect as PlanExpect
from ._plans import PlanImage as PlanImage
from ._plans import PlanNodeRow as PlanNodeRow
from ._protocol import Store as Store

if TYPE_CHECKING:
    from ._postgres import PostgresStore as PostgresStore
    from ._sqlite import SQLiteStore as SQLiteStore

__all__ = [
    "ClaimingOutbox",
    "ConversationStore",
    "DurableStore",
    "EffectRow",
    "EndedTransaction",
    "HistoryStore",
    "LeasedStore",
    "MemoryStore",
    "OutboxEntry",
    "PlanChange",
    "PlanExpect",
    "PlanImage",
    "PlanNodeRow",
    "PlanStore",
    "PostgresStore",
    "ReleasingStore",
    "RequestRow",
    "RequestStore",
    "SQLiteStore",
    "Store",
    "TxImage",
    "UndoRow",
]

for _name in __all__:
    _obj = globals().get(_name)  # SQLiteStore and PostgresStore are not loaded yet
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj


if not TYPE_CHECKING:  # type checkers see the import at the top (this would hide typos)

    def __getattr__(name: str) -> object:
        """Load `SQLiteStore` (and sqlite3) or `PostgresStore` when first asked for, not at
        `import agenttx`. `PostgresStore` loads psycopg only when a store is made, so that a
        missing extra raises `ImportError` naming it there."""
        if name == "SQLiteStore":
            from ._sqlite import SQLiteStore  # noqa: PLC0415

            SQLiteStore.__module__ = __name__
            globals()[name] = SQLiteStore  # later lookups find it without this function
            return SQLiteStore
        if name == "PostgresStore":
            from ._postgres import PostgresStore  # noqa: PLC0415

            PostgresStore.__module__ = __name__
            globals()[name] = PostgresStore
            return PostgresStore
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names, `SQLiteStore` and `PostgresStore` included before they load."""
    return sorted({*globals(), *__all__})
