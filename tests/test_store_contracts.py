"""What a store may keep beyond `Store` is a protocol each (`agenttx.stores._contracts`), and the
library asks a store for a capability only through them."""

from __future__ import annotations

import pytest

import agenttx
from agenttx import InvalidArgument, Node, Plan
from agenttx.stores import (
    ClaimingOutbox,
    HistoryStore,
    LeasedStore,
    MemoryStore,
    PlanStore,
    RequestStore,
    SQLiteStore,
    claims_effects,
    is_plan_store,
    keeps_history,
    leases_owners,
)


def test_the_shipped_stores_have_the_capabilities_they_document(tmp_path):
    """SQLiteStore keeps plan runs, history and requests; MemoryStore only requests; neither
    claims outbox entries nor leases owners (PostgresStore's, checked by mypy in its module)."""
    store = SQLiteStore(tmp_path / "db")
    try:
        assert is_plan_store(store)
        assert keeps_history(store)
        assert isinstance(store, RequestStore)
        assert not claims_effects(store)
        assert not leases_owners(store)
    finally:
        store.close()
    memory = MemoryStore()
    assert not is_plan_store(memory)
    assert not keeps_history(memory)
    assert isinstance(memory, RequestStore)


def test_a_store_with_some_plan_methods_keeps_no_plan_runs():
    """A store has a capability only with every method of its protocol: the five methods that
    were once probed do not make a plan store without `plan_audit`, `plan_runs`, ..."""

    class Partial(MemoryStore):
        def begin_plan(self, *args: object) -> None: ...
        def write_plan(self, *args: object, **kwargs: object) -> tuple[bool | None, ...]: ...
        def read_plan(self, *args: object) -> object: ...
        def cancel_plan(self, *args: object) -> bool: ...
        def claim_plan(self, *args: object) -> object: ...

    assert not is_plan_store(Partial())
    assert not isinstance(Partial(), PlanStore)


def test_each_check_answers_by_the_class_and_the_protocol():
    """The checks answer each protocol for each class (an answer for one is not reused for
    another), as `isinstance` against the protocol does."""

    class Leased(MemoryStore):
        def owner_alive(self, owner: str | None) -> bool:
            return owner is not None

    class Claiming(MemoryStore):
        def claim_effects(self, limit: int = 100, **kwargs: object) -> tuple[object, ...]:
            return ()

    class History(MemoryStore):
        def ended_transactions(self, limit: int = 100) -> tuple[object, ...]:
            return ()

        def peek_ended(self, tx_id: str) -> tuple[object, object]:
            raise agenttx.TransactionNotFound(tx_id=tx_id)

    for store, protocol, check in (
        (Leased(), LeasedStore, leases_owners),
        (Claiming(), ClaimingOutbox, claims_effects),
        (History(), HistoryStore, keeps_history),
    ):
        assert check(store)
        assert isinstance(store, protocol)
        others = [c for c in (leases_owners, claims_effects, keeps_history) if c is not check]
        assert not any(other(store) for other in others)


def test_a_plan_run_refuses_an_object_that_is_not_a_whole_store():
    """`run_plan(store=)` checks the whole `Store` protocol: an object with only `begin`,
    `commit`, `discard` and `is_open` is refused before anything runs."""

    class FourMethods:
        def begin(self, *args: object, **kwargs: object) -> None: ...
        def commit(self, *args: object, **kwargs: object) -> int:
            return 0

        def discard(self, *args: object, **kwargs: object) -> None: ...
        def is_open(self, tx_id: str) -> bool:
            return False

    @agenttx.tool
    def add(n: int) -> int:
        return n + 1

    plan = Plan(nodes=[Node("a", tool="add", inputs={"n": 1})])
    with pytest.raises(InvalidArgument, match="store must be a Store"):
        agenttx.run_plan(plan, tools=[add], initial={}, store=FourMethods())  # type: ignore[arg-type]
