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
committed effects. `PostgresStore(dsn_or_pool)` (extra `agenttx[postgres]`) implements it on a
PostgreSQL server shared by workers on many machines, with leases that fence every write.
`agenttx.testing.check_store(factory)` checks any implementation against the contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._durable import DurableStore as DurableStore
from ._durable import EffectRow as EffectRow
from ._durable import EndedTransaction as EndedTransaction
from ._durable import OutboxEntry as OutboxEntry
from ._durable import TxImage as TxImage
from ._durable import UndoRow as UndoRow
from ._memory import MemoryStore as MemoryStore
from ._protocol import Store as Store

if TYPE_CHECKING:
    from ._postgres import PostgresStore as PostgresStore
    from ._sqlite import SQLiteStore as SQLiteStore

__all__ = [
    "DurableStore",
    "EffectRow",
    "EndedTransaction",
    "MemoryStore",
    "OutboxEntry",
    "PostgresStore",
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
