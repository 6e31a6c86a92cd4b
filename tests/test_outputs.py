"""Tool outputs: `to_json_value`, the output serializer setting, and `ToolOutputError`."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import enum
import json
import multiprocessing
import os
import uuid
from collections import OrderedDict
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs
import pytest

import agenttx
from agenttx import Engine, EngineConfig, TxStatus, to_json_value
from agenttx.stores import SQLiteStore

if TYPE_CHECKING:
    from pathlib import Path


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1


class Pair(NamedTuple):
    left: int
    right: int


@dataclasses.dataclass
class Line:
    sku: str
    price: decimal.Decimal


@attrs.frozen
class Order:
    id: uuid.UUID
    lines: tuple[Line, ...]
    placed: dt.datetime
    tags: frozenset[str]
    color: Color


ORDER_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")
PLACED = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)


def order() -> Order:
    return Order(
        id=ORDER_ID,
        lines=(Line("a-1", decimal.Decimal("19.90")), Line("b-2", decimal.Decimal("1E+2"))),
        placed=PLACED,
        tags=frozenset({"gift", "express", "bulk"}),
        color=Color.BLUE,
    )


ORDER_JSON = {
    "id": "12345678-1234-5678-1234-567812345678",
    "lines": [{"sku": "a-1", "price": "19.90"}, {"sku": "b-2", "price": "1E+2"}],
    "placed": "2024-01-02T03:04:05+00:00",
    "tags": ["bulk", "express", "gift"],
    "color": "blue",
}


# ------------------------------------------------------------------ to_json_value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (dt.datetime(2024, 1, 2, 3, 4, 5), "2024-01-02T03:04:05"),  # noqa: DTZ001  (naive: no offset)
        (PLACED, "2024-01-02T03:04:05+00:00"),
        (dt.date(2024, 2, 29), "2024-02-29"),
        (dt.time(23, 59, 1, 500), "23:59:01.000500"),
        (ORDER_ID, "12345678-1234-5678-1234-567812345678"),
        (decimal.Decimal("0.1"), "0.1"),
        (decimal.Decimal("19.90"), "19.90"),
        (decimal.Decimal("-1E+3"), "-1E+3"),
        (Color.RED, "red"),
        (Level.LOW, 1),
        ((1, "a", None), [1, "a", None]),
        (Pair(1, 2), [1, 2]),
        ({3, 1, 2}, [1, 2, 3]),
        (frozenset({"b", "a"}), ["a", "b"]),
        (set(), []),
        (Line("x", decimal.Decimal("2.50")), {"sku": "x", "price": "2.50"}),
        (OrderedDict([("b", 1), ("a", 2)]), {"b": 1, "a": 2}),
        (MappingProxyType({"k": (1,)}), {"k": [1]}),
        ({Color.RED: 1, ORDER_ID: 2}, {"red": 1, "12345678-1234-5678-1234-567812345678": 2}),
        ("text", "text"),
        (None, None),
        (1.5, 1.5),
    ],
    ids=repr,
)
def test_each_type_converts_to_its_documented_json(value, expected):
    """Each row of the conversion table in docs/protocol.md#outputs."""
    assert to_json_value(value) == expected
    assert agenttx._json.check_json(to_json_value(value)) == expected


def test_nested_values_convert_all_the_way_down():
    """An attrs class holding dataclasses, Decimals, a UUID, a datetime, a set and an Enum."""
    assert to_json_value(order()) == ORDER_JSON
    assert to_json_value({"orders": [order(), (order(),)]}) == {
        "orders": [ORDER_JSON, [ORDER_JSON]]
    }


def test_a_pydantic_model_is_dumped_in_json_mode():
    """A pydantic model (recognised by model_dump, not imported) becomes its JSON dump."""
    pydantic = pytest.importorskip("pydantic")

    class Customer(pydantic.BaseModel):
        id: uuid.UUID
        since: dt.date
        balance: decimal.Decimal
        lines: list[Line]

    customer = Customer(
        id=ORDER_ID,
        since=dt.date(2020, 5, 1),
        balance="10.00",
        lines=[Line("a", decimal.Decimal("1.5"))],
    )
    assert to_json_value(customer) == {
        "id": "12345678-1234-5678-1234-567812345678",
        "since": "2020-05-01",
        "balance": "10.00",
        "lines": [{"sku": "a", "price": "1.5"}],
    }
    assert to_json_value([customer]) == [to_json_value(customer)]


def test_a_set_of_unsortable_items_keeps_its_iteration_order():
    """Mixed types cannot be sorted: the array holds every item all the same."""
    value = {1, "a", None}
    converted = to_json_value(value)
    assert sorted(converted, key=repr) == sorted([1, "a", None], key=repr)


def test_conversion_is_deterministic_and_leaves_the_value_alone():
    """The same value converts to the same JSON text every time; the input is not changed."""
    value = {"order": order(), "ids": {uuid.UUID(int=i) for i in range(50)}}
    before = repr(value)
    first = json.dumps(to_json_value(value))
    assert all(json.dumps(to_json_value(value)) == first for _ in range(3))
    assert repr(value) == before


@pytest.mark.parametrize(
    "value",
    [b"bytes", object(), {1: "int key"}, float("nan"), [complex(1, 2)]],
    ids=["bytes", "object", "int-key", "nan", "complex"],
)
def test_what_it_cannot_convert_is_left_for_the_check(value):
    """Unknown types, non-text keys and NaN are left as they are; the JSON check names them."""
    converted = to_json_value(value)
    with pytest.raises(agenttx.JSONValueError):
        agenttx._json.check_json(converted)


def test_a_cycle_and_deep_nesting_do_not_recurse_forever():
    """A container holding itself and a 10,000-deep nest come back for the check to refuse."""
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    with pytest.raises(agenttx.JSONValueError, match="contains itself"):
        agenttx._json.check_json(to_json_value((cyclic,)))
    deep: Any = ()
    for _ in range(10_000):
        deep = (deep,)
    with pytest.raises(agenttx.JSONValueError, match="deeper"):
        agenttx._json.check_json(to_json_value(deep))


# ------------------------------------------------------------------ in a transaction


def test_a_step_returns_the_converted_output_and_references_see_it():
    """The step's output is the JSON; a later step's reference resolves into it."""

    @agenttx.tool
    def place() -> Order:
        return order()

    @agenttx.tool
    def ship(order_id: str, when: str) -> dict:
        return {"shipped": order_id, "placed": when}

    tx = agenttx.Transaction(tools=[place, ship])
    assert tx.execute_step(1, "place", {}).output == ORDER_JSON
    result = tx.execute_step(2, "ship", {"order_id": "${steps.1.id}", "when": "${steps.1.placed}"})
    assert result.output == {"shipped": str(ORDER_ID), "placed": "2024-01-02T03:04:05+00:00"}


def test_a_declared_compensation_gets_the_converted_output():
    """`compensate=` is called with the JSON the step returned, not the Python object."""
    seen = []

    @agenttx.compensation(name="cancel")
    def cancel(payload):
        seen.append(payload)

    @agenttx.tool(compensate=cancel)
    def place() -> Order:
        return order()

    tx = agenttx.Transaction(tools=[place])
    tx.execute_step(1, "place", {})
    tx.rollback()
    assert seen == [{"arguments": {}, "output": ORDER_JSON}]


def test_the_serializer_runs_only_for_outputs_that_are_not_json():
    """A custom serializer is not called for a JSON output (the hot path), and is for others."""
    calls = []

    def serializer(value):
        calls.append(value)
        return {"custom": repr(value)}

    @agenttx.tool
    def plain() -> dict:
        return {"a": [1, 2]}

    @agenttx.tool
    def odd() -> object:
        return b"raw"

    tx = agenttx.Transaction(tools=[plain, odd], output_serializer=serializer)
    assert tx.execute_step(1, "plain", {}).output == {"a": [1, 2]}
    assert calls == []
    assert tx.execute_step(2, "odd", {}).output == {"custom": "b'raw'"}
    assert calls == [b"raw"]


def test_the_engine_config_sets_the_serializer_of_its_transactions():
    """`EngineConfig(output_serializer=...)` reaches every transaction the engine begins."""

    @agenttx.tool
    def odd() -> object:
        return b"raw"

    engine = Engine(tools=[odd], config=EngineConfig(output_serializer=lambda v: v.decode()))
    assert engine.begin().execute_step(1, "odd", {}).output == "raw"


def test_a_serializer_that_is_not_callable_is_refused():
    """A non-callable serializer raises InvalidArgument naming the setting."""
    with pytest.raises(agenttx.InvalidArgument, match="output_serializer must be a callable"):
        agenttx.Transaction(output_serializer="json")  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="output_serializer must be a callable"):
        EngineConfig(output_serializer=None)  # type: ignore[arg-type]


class Shop:
    """A charge with a durable undo, a state write, a staged email and a declared refund."""

    def __init__(self, output: object) -> None:
        self.log: list[str] = []

        @agenttx.compensation(name="refund")
        def refund(payload) -> None:
            self.log.append(f"refund {payload['arguments']['order']} {payload['output']}")

        @agenttx.compensation(name="void")
        def void(payload) -> None:
            self.log.append(f"void {payload['order']}")

        @agenttx.tool(name="charge", compensate=refund)
        def charge(ctx: agenttx.ToolContext, order: str) -> object:
            ctx.register_undo("void", {"order": order})
            self.log.append(f"charge {order}")
            ctx.state.put(f"orders/{order}", {"paid": True})
            ctx.stage_effect("email", {"order": order})
            return output if order == "bad" else {"order": order}

        self.tools = [refund, void, charge]


def test_an_output_that_is_not_json_undoes_the_step_and_raises_to_the_developer():
    """ToolOutputError names the tool, step and path; the step's undos ran; the transaction is
    ACTIVE at the same step, with no step kept, no hint, no constraint and nothing staged."""
    shop = Shop({"receipt": {"items": [1, object()]}})
    sent = []
    tx = agenttx.Transaction(tools=shop.tools, dispatcher=sent.append)
    assert tx.execute_step(1, "charge", {"order": "good"}).ok
    with pytest.raises(agenttx.ToolOutputError) as caught:
        tx.execute_step(2, "charge", {"order": "bad"})
    error = caught.value
    assert isinstance(error, TypeError)
    assert isinstance(error, agenttx.AgentTxError)
    assert error.code == "invalid_tool_output"
    assert (error.tool, error.step_id, error.path) == ("charge", 2, "$.receipt.items[1]")
    assert error.problem == "object is not a JSON type"
    assert error.compensation_errors == ()
    assert "tool 'charge' at step 2" in str(error)
    # The refused step's declared refund (output null) ran, then its own undo; step 1 is intact.
    assert shop.log == ["charge good", "charge bad", "refund bad None", "void bad"]
    assert (tx.status, tx.next_step_id) == (TxStatus.ACTIVE, 2)
    assert [step.step_id for step in tx.steps] == [1]
    assert tx.constraints == ()
    assert tx.read("orders/bad") is None
    assert tx.read("orders/good") == {"paid": True}
    # Once the tool is fixed, the same step number is sent again and commits.
    assert tx.execute_step(2, "charge", {"order": "other"}).ok
    assert tx.commit().steps_committed == 2
    assert [effect.payload for effect in sent] == [{"order": "good"}, {"order": "other"}]


def test_a_serializer_that_raises_is_the_cause_of_the_tool_output_error():
    """What the serializer raised is chained; the step is undone as for a refused output."""
    shop = Shop(b"raw")

    def serializer(value):
        raise ValueError("cannot encode bytes")

    tx = agenttx.Transaction(tools=shop.tools, output_serializer=serializer)
    with pytest.raises(agenttx.ToolOutputError, match="ValueError: cannot encode") as caught:
        tx.execute_step(1, "charge", {"order": "bad"})
    assert isinstance(caught.value.__cause__, ValueError)
    assert caught.value.path == "$"
    assert shop.log == ["charge bad", "refund bad None", "void bad"]
    assert (tx.status, tx.next_step_id) == (TxStatus.ACTIVE, 1)


def test_a_failing_compensation_is_reported_on_the_error():
    """An undo that fails while undoing the refused step is listed in compensation_errors."""

    @agenttx.compensation(name="refund")
    def refund(payload) -> None:
        raise RuntimeError("provider down")

    @agenttx.tool(compensate=refund)
    def charge() -> object:
        return object()

    tx = agenttx.Transaction(tools=[charge], compensation_retries=1)
    with pytest.raises(agenttx.ToolOutputError, match="1 failed compensation") as caught:
        tx.execute_step(1, "charge", {})
    assert len(caught.value.compensation_errors) == 1
    assert "provider down" in caught.value.compensation_errors[0]


def test_the_async_path_undoes_and_raises_the_same_way():
    """aexecute_step raises ToolOutputError after the same undo; the transaction goes on."""
    shop = Shop(object())
    tx = agenttx.Transaction(tools=shop.tools)

    async def run() -> None:
        with pytest.raises(agenttx.ToolOutputError, match="at step 1"):
            await tx.aexecute_step(1, "charge", {"order": "bad"})
        assert (await tx.aexecute_step(1, "charge", {"order": "ok"})).ok

    asyncio.run(run())
    assert shop.log == ["charge bad", "refund bad None", "void bad", "charge ok"]


def test_the_durable_log_agrees_after_a_refused_output(tmp_path):
    """On SQLite the refused step is not in the log: a resumed transaction is at the same step
    and recovery runs no undo twice."""
    shop = Shop(object())
    config = EngineConfig(idle_timeout=None)
    engine = Engine(tools=shop.tools, store=SQLiteStore(tmp_path / "db"), config=config)
    tx = engine.begin()
    tx.execute_step(1, "charge", {"order": "good"})
    with pytest.raises(agenttx.ToolOutputError):
        tx.execute_step(2, "charge", {"order": "bad"})
    engine.close()
    engine.store.close()  # type: ignore[attr-defined]  # what a dead process leaves

    engine = Engine(tools=shop.tools, store=SQLiteStore(tmp_path / "db"), config=config)
    report = engine.recover("resume")
    assert (report.resumed, report.compensations_run) == ((tx.id,), 0)
    resumed = engine.get(tx.id)
    assert (resumed.status, resumed.next_step_id) == (TxStatus.ACTIVE, 2)
    assert [step.step_id for step in resumed.steps] == [1]
    assert resumed.read("orders/bad") is None
    assert shop.log == ["charge good", "charge bad", "refund bad None", "void bad"]


def _die_while_undoing(path: Path, journal: Path) -> None:
    """Refuse an output, and die inside the first compensation of the undo."""

    @agenttx.compensation(name="refund")
    def refund(payload) -> None:
        with journal.open("a") as out:
            out.write("refund\n")
        os._exit(0)

    @agenttx.tool(compensate=refund)
    def charge(ctx: agenttx.ToolContext) -> object:
        ctx.state.put("orders/x", 1)
        with journal.open("a") as out:
            out.write("charge\n")
        return object()

    engine = Engine(tools=[refund, charge], store=SQLiteStore(path))
    engine.begin().execute_step(1, "charge", {})


def test_a_crash_while_undoing_a_refused_output_is_finished_by_recovery(tmp_path):
    """The rewind is logged before its compensations: recovery finishes it and never revives
    the refused step."""
    journal = tmp_path / "journal"
    child = multiprocessing.get_context("spawn").Process(
        target=_die_while_undoing, args=(tmp_path / "db", journal)
    )
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert journal.read_text().splitlines() == ["charge", "refund"]

    calls = []

    @agenttx.compensation(name="refund")
    def refund(payload) -> None:
        calls.append(payload)

    engine = Engine(
        tools=[refund], store=SQLiteStore(tmp_path / "db"), config=EngineConfig(idle_timeout=None)
    )
    report = engine.recover("resume")
    assert report.compensations_run == 1  # at least once: it had not been recorded as done
    assert calls == [{"arguments": {}, "output": None}]
    tx = engine.get(report.resumed[0])
    assert (tx.status, tx.next_step_id, tx.steps) == (TxStatus.ACTIVE, 1, ())
    assert tx.read("orders/x") is None
