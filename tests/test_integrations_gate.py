"""The turn gate the framework integrations share: order, the turn barrier, rewinds, lifetime."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from typing import Any

import pytest

import agenttx
from _shop import EMAIL, OLD_EMAIL, ORDER, Shop
from agenttx.integrations._gate import _GATES, gate_for

REF = "${steps.1.id}"
RESERVE = {"customer_id": REF, "sku": ORDER["sku"], "quantity": ORDER["quantity"]}
CHARGE = {"customer_id": REF, "amount": ORDER["amount"]}


async def _turn(gate: Any, tx: agenttx.Transaction, turn: object, calls: list[Any]) -> list[Any]:
    """Start every call of a turn as its own task at once, as the frameworks do."""
    tasks = [
        asyncio.create_task(gate.call(tx, turn, name, json.dumps(args), call_id=call_id))
        for name, args, call_id in calls
    ]
    return await asyncio.gather(*tasks)


def test_concurrent_calls_run_in_arrival_order_and_stop_at_a_failure():
    """A turn's tasks become steps 1, 2, 3 in order; the call after the failure is not run."""
    shop = Shop()
    tx = shop.transaction()
    gate = gate_for(tx, "test")
    calls = [
        ("lookup_customer", {"email": OLD_EMAIL}, "c1"),
        ("charge", CHARGE, "c2"),
        ("reserve", RESERVE, "c3"),
        ("send_confirmation", {"customer_id": REF, "email": EMAIL, "order_id": "o-1"}, "c4"),
    ]
    payloads = asyncio.run(_turn(gate, tx, "turn-1", calls))
    assert [p.get("step") for p in payloads[:3]] == [1, 2, 3]
    assert [p["ok"] for p in payloads] == [True, True, False, False]
    assert shop.calls == ["lookup_customer", "charge", "reserve"]
    assert gate.voided_call_ids == {"c1", "c2"}
    # a new turn is not barred: it runs as the step the rewind asked for
    (again,) = asyncio.run(_turn(gate, tx, "turn-2", [(*calls[0][:2], "c5")]))
    assert again["ok"] is True
    assert again["step"] == 1


def test_model_side_problems_are_payloads_and_bar_the_rest_of_the_turn():
    """Malformed arguments fail the call (a payload) and the turn's next call is not run."""
    shop = Shop()
    tx = shop.transaction()
    gate = gate_for(tx, "test")

    async def turn() -> list[Any]:
        first = gate.call(tx, 1, "lookup_customer", '{"email": ', call_id="c1")
        second = gate.call(tx, 1, "lookup_customer", {"email": EMAIL}, call_id="c2")
        return list(await asyncio.gather(first, second))

    malformed, barred = asyncio.run(turn())
    assert malformed["ok"] is False
    assert "JSON" in malformed["error"]
    assert barred["ok"] is False
    assert shop.calls == []
    tx.rollback()
    (ended,) = asyncio.run(_turn(gate, tx, 2, [("lookup_customer", {"email": EMAIL}, "c3")]))
    assert ended["ok"] is False
    assert "the transaction has ended" in ended["error"]


def test_rewrites_of_every_rewind_are_merged():
    """Two rewinds: truncate drops all four voided calls and notes both failures; void replaces."""
    shop = Shop()
    tx = shop.transaction()
    gate = gate_for(tx, "test")
    for n, turn in enumerate(("a", "b")):
        ids = [f"{turn}{i}" for i in range(3)]
        calls = [
            ("lookup_customer", {"email": OLD_EMAIL}, ids[0]),
            ("charge", CHARGE, ids[1]),
            ("reserve", RESERVE, ids[2]),
        ]
        payloads = asyncio.run(_turn(gate, tx, n, calls))
        assert payloads[2]["voided_steps"] == [1, 2]
    truncate = gate.rewrite("truncate")
    assert truncate.drop == {"a0", "a1", "b0", "b1"}
    assert set(truncate.notes) == {"a2", "b2"}
    void = gate.rewrite("void")
    assert set(void.replace) == {"a0", "a1", "b0", "b1"}
    assert void.replace["b1"]["step"] == 2
    assert gate.rewrite("keep").empty
    assert shop.refunds == ["ch-1", "ch-2"]


def test_one_gate_per_transaction_for_its_lifetime():
    """Every hook of one transaction shares its gate; the gate goes with the transaction."""
    shop = Shop()
    tx = shop.transaction()
    gate = gate_for(tx, "test")
    assert gate_for(tx, "again") is gate
    assert gate.transaction is tx
    assert gate_for(shop.transaction(), "other") is not gate
    alive = weakref.ref(tx)
    del tx, gate
    gc.collect()
    assert alive() is None
    assert all(key is not None for key in _GATES)


def test_a_gate_needs_a_transaction():
    """Anything but a Transaction is InvalidArgument naming what was passed."""
    with pytest.raises(agenttx.InvalidArgument, match=r"where needs an agenttx\.Transaction"):
        gate_for([1, 2], "where")


def test_a_refused_call_or_a_reused_call_id_bars_the_rest_of_the_turn():
    """Oversized arguments are refused; a call id sent twice in one turn is refused; later
    calls of the turn do not run; a later turn may send the id again."""
    shop = Shop()
    tx = shop.transaction()
    gate = gate_for(tx, "test")
    huge = json.dumps({"email": "x" * 2_000_000})

    async def turn(key: object, calls: list[tuple[str, object, str]]) -> list[Any]:
        return [await gate.call(tx, key, name, args, call_id=cid) for name, args, cid in calls]

    refused, after_refusal = asyncio.run(
        turn(1, [("lookup_customer", huge, "c1"), ("lookup_customer", {"email": EMAIL}, "c2")])
    )
    assert refused["ok"] is False
    assert "refused" in refused["error"]
    assert after_refusal["step"] is None  # never sent: it claims no step
    assert "Not run: step 1 was refused first" in after_refusal["error"]
    first, reused, after_mistake = asyncio.run(
        turn(
            2,
            [
                ("lookup_customer", {"email": EMAIL}, "c3"),
                ("charge", CHARGE, "c3"),
                ("reserve", RESERVE, "c4"),
            ],
        )
    )
    assert first["ok"] is True
    assert reused["ok"] is False
    assert reused["step"] == 2
    assert "call id 'c3' was already sent in this turn, as step 1" in reused["error"]
    assert after_mistake["step"] is None
    assert "Not run: step 2 was refused first" in after_mistake["error"]
    assert shop.calls == ["lookup_customer"]
    (again,) = asyncio.run(turn(3, [("lookup_customer", {"email": EMAIL}, "c3")]))
    assert (again["ok"], again["step"]) == (True, 2)  # a later turn may reuse the id
