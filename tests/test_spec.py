"""Tool specs: built at decoration, wire names, overrides, the registry, and validation."""

from __future__ import annotations

from typing import Literal

import pytest

import agenttx
from agenttx._tools import ToolRegistry, wire_name
from agenttx.integrations import _common


@agenttx.tool(name="payments.charge")
def charge(amount: float, card: str, currency: Literal["EUR", "USD"] = "EUR") -> dict:
    """Charge a card.

    Args:
        amount: In euros.
        card: The card token.
    """
    return {"amount": amount, "card": card, "currency": currency}


@agenttx.tool
def count(ctx: agenttx.ToolContext, n: int) -> dict:
    """Count to n."""
    return {"n": n, "type": type(n).__name__}


def test_spec_is_built_at_decoration():
    """`tool.spec` holds the names, the docstring description and the derived schema."""
    spec = charge.spec
    assert isinstance(spec, agenttx.ToolSpec)
    assert (spec.name, spec.wire_name, charge.wire_name) == (
        "payments.charge",
        "payments_charge",
        "payments_charge",
    )
    assert spec.description == "Charge a card."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "amount": {"type": "number", "description": "In euros."},
            "card": {"type": "string", "description": "The card token."},
            "currency": {"type": "string", "enum": ["EUR", "USD"], "default": "EUR"},
        },
        "required": ["amount", "card"],
        "additionalProperties": False,
    }
    assert count.spec.parameters["properties"] == {"n": {"type": "integer"}}  # ctx skipped


@pytest.mark.parametrize(
    ("name", "wire"),
    [
        ("kv.put", "kv_put"),
        ("a-b_c9", "a-b_c9"),
        ("café au lait", "caf__au_lait"),
        ("x" * 64, "x" * 64),
    ],
)
def test_wire_names(name, wire):
    """Every character outside [A-Za-z0-9_-] becomes `_`."""
    assert wire_name(name) == wire


def test_names_that_cannot_be_mapped_are_refused_at_decoration():
    """A name whose wire name is over 64 characters raises InvalidArgument naming the tool."""
    with pytest.raises(agenttx.InvalidArgument, match=r"tool `x{65}`: its wire name must be 1-64"):
        agenttx.tool(name="x" * 65)(lambda: None)


def test_overrides_and_bad_parameters():
    """`description=` and `parameters=` replace the derived ones; a non-object schema is refused."""
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

    @agenttx.tool(description="Search.", parameters=schema)
    def search(**arguments: object) -> object:
        return arguments

    assert search.spec.description == "Search."
    assert search.spec.parameters == schema
    for bad in ({"type": "array"}, [1], {"properties": {}}, "object"):
        with pytest.raises(agenttx.InvalidArgument, match="tool `f`: parameters= must be"):
            agenttx.tool(name="f", parameters=bad)(lambda: None)  # type: ignore[arg-type]
    with pytest.raises(agenttx.InvalidArgument, match="description= must be a string"):
        agenttx.tool(name="f", description=3)(lambda: None)  # type: ignore[arg-type]


def test_parameters_are_a_new_copy_on_each_access():
    """Changing what `spec.parameters` returned (or the schema a spec was built from) changes
    neither the spec, nor what integrations send, nor how the tool's arguments are checked."""
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

    @agenttx.tool(name="search", parameters=schema)
    def search(**arguments: object) -> object:
        return arguments

    schema["properties"]["q"]["type"] = "integer"  # the caller's own dict, after decoration
    taken = search.spec.parameters
    assert taken == search.spec.parameters
    assert taken is not search.spec.parameters
    taken["properties"]["q"]["type"] = "integer"
    taken["required"].append("extra")
    taken["additionalProperties"] = True
    assert search.spec.parameters == {
        "type": "object",
        "properties": {"q": {"type": "string"}},
        "required": ["q"],
    }
    sent = _common.specs_json([search.spec])
    assert sent[0]["parameters"] == search.spec.parameters
    assert sent[0]["parameters"] is not _common.specs_json([search.spec])[0]["parameters"]
    tx = agenttx.Transaction([search])
    assert not tx.execute_step(1, "search", {"q": 3}).ok  # still checked as a string
    assert tx.execute_step(1, "search", {"q": "x"}).ok


def test_a_spec_built_directly_keeps_a_checked_copy():
    """`ToolSpec(parameters=...)` copies the schema (a change to the dict given is not seen) and
    refuses a schema that is not made of JSON values."""
    schema: dict[str, object] = {"type": "object", "properties": {}}
    spec = agenttx.ToolSpec(name="t", wire_name="t", description="", parameters=schema)  # type: ignore[arg-type]
    schema["properties"] = {"x": {}}
    assert spec.parameters == {"type": "object", "properties": {}}
    assert spec == agenttx.ToolSpec(
        name="t", wire_name="t", description="", parameters={"type": "object", "properties": {}}
    )
    for bad in ({"type": "object", "default": {1, 2}}, {"type": "object", "x": float("nan")}):
        with pytest.raises(agenttx.InvalidArgument, match="tool `t`: parameters"):
            agenttx.ToolSpec(name="t", wire_name="t", description="", parameters=bad)  # type: ignore[arg-type]


def test_registry_get_specs_and_collisions():
    """Lookups take either name; specs keep registration order; same wire names are refused."""
    registry = ToolRegistry([count, charge])
    assert registry.get("payments_charge") is charge
    assert registry.get("payments.charge") is charge
    assert registry.get("nope") is None
    assert [spec.name for spec in registry.specs()] == ["count", "payments.charge"]

    @agenttx.tool(name="payments_charge")
    def other() -> None:
        return None

    with pytest.raises(agenttx.InvalidArgument, match="same wire name `payments_charge`"):
        ToolRegistry([charge, other])


def test_mapping_keeps_the_spec_and_settings():
    """A tool registered under another name in a mapping keeps its description and inline flag."""
    fast = agenttx.tool(name="fast", inline=True, description="Fast.")(lambda x: x)
    registry = ToolRegistry({"renamed.fast": fast})
    renamed = registry.get("renamed_fast")
    assert renamed is not None
    assert (renamed.name, renamed.inline, renamed.spec.description) == (
        "renamed.fast",
        True,
        "Fast.",
    )


def test_transaction_and_engine_specs_and_wire_name_calls():
    """`tx.tool_specs` lists the specs; a call by wire name runs and records the registered name."""
    tx = agenttx.Transaction(tools=[charge, count])
    assert tx.tool_specs == (charge.spec, count.spec)
    assert agenttx.Engine(tools=[charge]).tool_specs == (charge.spec,)
    result = tx.execute_step(1, "payments_charge", {"amount": 5, "card": "tok"})
    assert result.ok
    node = tx.graph.node(1)
    assert node is not None
    assert node.tool_name == "payments.charge"


def test_violation_fails_the_step_before_the_tool_runs():
    """A bad argument fails the step as a mistake naming it; the tool is not called."""
    calls = []

    @agenttx.tool
    def book(seats: int) -> int:
        calls.append(seats)
        return seats

    tx = agenttx.Transaction(tools=[book])
    result = tx.execute_step(1, "book", {"seats": "two"})
    assert not result.ok
    assert calls == []
    assert result.error == "invalid type: string for field `seats`, expected an integer"
    assert result.hint is not None
    assert result.hint.key == "seats"
    assert result.hint.text == (
        "Hint: Wrong argument type: got string for field `seats`, expected an integer."
    )


def test_coerced_arguments_reach_the_tool():
    """`3.0` for an integer reaches the tool as the int 3."""
    tx = agenttx.Transaction(tools=[count])
    assert tx.execute_step(1, "count", {"n": 3.0}).output == {"n": 3, "type": "int"}


@pytest.mark.parametrize(
    ("arguments", "hint", "key"),
    [
        (
            {"amount": 1, "card": "t", "note": "x"},
            (
                "Hint: Unknown argument 'note'. "
                "Remove it; expected one of `amount`, `card`, `currency`."
            ),
            "note",
        ),
        (
            {"amount": 1, "card": "t", "currency": "GBP"},
            'Hint: Invalid value for \'currency\': got string "GBP", expected one of "EUR", "USD".',
            "currency",
        ),
        (
            {"card": "t"},
            (
                "Hint: Required field 'amount' is missing from the arguments. "
                "Provide 'amount' explicitly."
            ),
            "amount",
        ),
    ],
)
def test_violations_give_one_line_hints_naming_the_argument(arguments, hint, key):
    """Unknown, invalid and missing arguments each give a hint naming the argument (its key)."""
    tx = agenttx.Transaction(tools=[charge])
    result = tx.execute_step(1, "payments.charge", arguments)
    assert result.hint is not None
    assert (result.hint.text, result.hint.key) == (hint, key)


def test_a_violation_resends_the_step_and_compensates_nothing():
    """A schema violation after a compensable step is a mistake: RESEND, no refund, same step."""
    refunds = []

    @agenttx.compensation(name="refund")
    def refund(payload: dict) -> None:
        refunds.append(payload)

    @agenttx.tool(name="pay", compensate=refund)
    def pay(amount: int) -> dict:
        return {"paid": amount}

    tx = agenttx.Transaction(tools=[pay, refund])
    assert tx.execute_step(1, "pay", {"amount": 5}).ok
    result = tx.execute_step(2, "pay", {"amount": "five"})
    assert result.strategy is agenttx.RollbackStrategy.RESEND
    assert (result.next_step_id, refunds) == (2, [])
    payload = result.for_model()
    assert payload["ok"] is False
    assert payload["error"] == (
        "Hint: Wrong argument type: got string for field `amount`, expected an integer."
    )
    assert tx.execute_step(2, "pay", {"amount": 6}).ok


def test_arguments_that_are_no_object_are_a_mistake_for_any_tool():
    """Even a `**kwargs` tool refuses non-object arguments before running, as a mistake."""
    calls = []

    @agenttx.tool
    def anything(**arguments: object) -> None:
        calls.append(arguments)

    assert anything.spec.parameters == {"type": "object", "properties": {}}
    tx = agenttx.Transaction(tools=[anything])
    result = tx.execute_step(1, "anything", "[1, 2]")
    assert result.error == "invalid type: array, expected a JSON object of arguments"
    assert result.strategy is agenttx.RollbackStrategy.RESEND
    assert calls == []
    assert tx.execute_step(1, "anything", {"x": 1}).ok
    assert calls == [{"x": 1}]
