"""Tools and compensations: decorators, the registry's validation, and the tool context."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agenttx
from agenttx._tools import (
    Compensation,
    Tool,
    ToolContext,
    ToolRegistry,
    derive_key,
    key_deriver,
)
from agenttx.stores import MemoryStore


@agenttx.compensation(name="payments.refund")
def refund(payload):
    return payload


@agenttx.tool(name="payments.charge", compensate=refund)
def charge(amount: int, card: str) -> dict:
    return {"charged": amount, "card": card}


@agenttx.tool
def create_user(name: str) -> dict:
    return {"id": f"u-{name}"}


@agenttx.tool
def with_context(ctx: agenttx.ToolContext, key: str) -> dict:
    return {"step": ctx.step_id, "key": key}


@agenttx.tool
def named_ctx(ctx, key: str) -> dict:
    return {"step": ctx.step_id}


@agenttx.tool
async def async_tool(x: int) -> int:
    return x + 1


def test_bare_decorator_names_the_tool_after_the_function():
    """@tool registers the function under its own name and keeps it callable."""
    assert isinstance(create_user, Tool)
    assert create_user.name == "create_user"
    assert create_user("ada") == {"id": "u-ada"}
    assert create_user.compensation_name is None


def test_called_decorator_takes_a_name_and_a_compensation():
    """@tool(name=..., compensate=...) records both; the compensation keeps its own name."""
    assert charge.name == "payments.charge"
    assert charge.compensation_name == "payments.refund"
    assert isinstance(refund, Compensation)
    assert refund.name == "payments.refund"
    assert refund({"a": 1}) == {"a": 1}
    assert charge(5, card="x") == {"charged": 5, "card": "x"}


def test_context_is_detected_by_annotation_or_name():
    """A first parameter annotated ToolContext, or named ctx, receives the context."""
    assert with_context.wants_context
    assert named_ctx.wants_context
    assert not create_user.wants_context


def test_async_tools_are_recognised():
    """async def tools are marked async."""
    assert async_tool.is_async
    assert not create_user.is_async


@pytest.mark.parametrize("bad", [3, "not callable"])
def test_non_callables_are_refused_at_decoration(bad):
    """Decorating something that cannot be called is an InvalidArgument."""
    with pytest.raises(agenttx.InvalidArgument, match="not callable"):
        agenttx.tool(bad)


@pytest.mark.parametrize("name", ["", "x" * 129, 7])
def test_bad_names_are_refused(name):
    """Tool names are 1-128 characters."""
    with pytest.raises(agenttx.InvalidArgument, match="1-128"):
        agenttx.tool(name=name)(lambda: None)


def test_bad_compensate_is_refused_naming_the_tool():
    """compensate= must be a compensation or its name."""
    with pytest.raises(agenttx.InvalidArgument, match="tool `f`"):
        agenttx.tool(name="f", compensate=42)(lambda: None)  # type: ignore[call-overload]


def test_registry_refuses_duplicates_and_dangling_compensations():
    """Two tools with one name, or compensate= naming nothing, are refused with the tool's name."""
    with pytest.raises(agenttx.InvalidArgument, match="tool `create_user` is registered twice"):
        ToolRegistry([create_user, create_user])
    dangling = agenttx.tool(name="ship", compensate="nowhere")(lambda: None)
    with pytest.raises(agenttx.InvalidArgument, match="tool `ship`: compensate='nowhere'"):
        ToolRegistry([dangling])
    other = agenttx.compensation(name="payments.refund")(lambda payload: None)
    with pytest.raises(agenttx.InvalidArgument, match=r"compensation `payments\.refund`"):
        ToolRegistry([charge, other])


def test_registry_accepts_lists_mappings_and_plain_callables():
    """Tools come as decorated tools, compensations and plain callables, or a name mapping."""

    def plain(x: int) -> int:
        return x

    registry = ToolRegistry([charge, plain, refund])
    assert registry.names() == ("payments.charge", "plain")
    assert set(registry.compensations) == {"payments.refund"}
    mapped = ToolRegistry({"double": lambda x: 2 * x, "renamed": create_user, "undo": refund})
    assert mapped.names() == ("double", "renamed")
    assert mapped.tools["renamed"].name == "renamed"
    assert set(mapped.compensations) == {"undo"}
    with pytest.raises(agenttx.InvalidArgument, match="tools must be"):
        ToolRegistry("kv.put")  # type: ignore[arg-type]


def _context(store=None, compensations=None):
    store = store or MemoryStore()
    store.begin("t1")
    return ToolContext(
        tx_id="t1",
        step_id=3,
        idempotency_key="k",
        deadline=float("inf"),
        store=store,
        compensations=compensations or {"payments.refund": refund},
    )


def test_context_state_is_a_json_view_of_the_overlay():
    """put/get/delete/in work on JSON values; delete reports whether the key existed."""
    ctx = _context()
    assert ctx.state.get("a") is None
    assert ctx.state.get("a", 5) == 5
    ctx.state.put("a", {"x": [1, 2]})
    assert "a" in ctx.state
    assert ctx.state.get("a") == {"x": [1, 2]}
    assert ctx.state.delete("a") is True
    assert ctx.state.delete("a") is False
    with pytest.raises(agenttx.JSONValueError):
        ctx.state.put("a", {1, 2})


def test_register_undo_by_kind_or_callable():
    """A kind must name a registered compensation; a callable is an in-memory undo."""
    ctx = _context()
    ctx.register_undo("payments.refund", {"id": 1})
    ctx.register_undo(lambda: None)
    with pytest.raises(agenttx.InvalidArgument, match="not a registered compensation"):
        ctx.register_undo("nope", {})
    undos, effects = ctx._close()
    assert [(u.kind, u.seq, u.step_id) for u in undos] == [
        ("payments.refund", 0, 3),
        ("fn", 1, 3),
    ]
    assert undos[0].payload == {"id": 1}
    assert effects == ()


def test_stage_effect_derives_a_deterministic_key():
    """Staged effects get a key hashed from tx, step, channel and payload unless one is given."""
    ctx = _context()
    key = ctx.stage_effect("email", {"to": "a@b.c"})
    assert key == derive_key("t1", 3, "email", {"to": "a@b.c"})
    assert ctx.stage_effect("email", {"to": "a@b.c"}, idempotency_key="mine") == "mine"
    with pytest.raises(agenttx.InvalidArgument, match="channel"):
        ctx.stage_effect("", {})
    _, effects = ctx._close()
    assert [e.idempotency_key for e in effects] == [key, "mine"]


def test_a_closed_context_refuses_writes():
    """After its step ends, a context accepts no writes, undos or effects."""
    ctx = _context()
    ctx._close()
    with pytest.raises(agenttx.InvalidArgument, match="has ended"):
        ctx.state.put("a", 1)
    with pytest.raises(agenttx.InvalidArgument, match="has ended"):
        ctx.register_undo(lambda: None)
    with pytest.raises(agenttx.InvalidArgument, match="has ended"):
        ctx.stage_effect("email", {})


def test_add_cost_keeps_exact_decimals_by_category():
    """add_cost takes a Decimal, an int or a decimal string, and keeps them in report order."""
    ctx = _context()
    ctx.add_cost(Decimal("0.002"), category="model")
    ctx.add_cost("0.10")
    ctx.add_cost(3, category="infrastructure")
    assert ctx.costs == (
        ("model", Decimal("0.002")),
        ("tool", Decimal("0.10")),
        ("infrastructure", Decimal(3)),
    )


@pytest.mark.parametrize(
    ("amount", "category", "match"),
    [
        (0.1, "tool", "float"),
        (Decimal(-1), "tool", ">= 0"),
        (Decimal("NaN"), "tool", "finite"),
        ("Infinity", "tool", "finite"),
        ("ten pence", "tool", "not a decimal number"),
        (True, "tool", "must be a Decimal"),
        (None, "tool", "must be a Decimal"),
        (1, "tokens", "category must be one of"),
    ],
)
def test_add_cost_refuses_floats_negatives_and_unknown_categories(amount, category, match):
    """Floats, negative or non-finite amounts and unknown categories raise InvalidArgument."""
    ctx = _context()
    with pytest.raises(agenttx.InvalidArgument, match=match):
        ctx.add_cost(amount, category=category)
    assert ctx.costs == ()


def test_add_cost_is_fenced_like_every_context_call():
    """A closed context refuses add_cost: a late call cannot add spending to its step."""
    ctx = _context()
    ctx._close()
    with pytest.raises(agenttx.InvalidArgument, match="has ended"):
        ctx.add_cost(1)


def test_derive_key_is_stable_and_sensitive():
    """The same parts give the same 32-hex-digit key; any change gives another."""
    assert derive_key("t", 1, {"a": 1, "b": 2}) == derive_key("t", 1, {"b": 2, "a": 1})
    assert derive_key("t", 1, 1) != derive_key("t", 1, "1")
    assert len(derive_key("t")) == 32


_JSON_PARTS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


@given(shared=st.lists(_JSON_PARTS, max_size=3), rest=st.lists(_JSON_PARTS, max_size=3))
def test_key_deriver_gives_the_keys_derive_key_gives(shared, rest):
    """A deriver for shared first parts gives exactly `derive_key` of all the parts."""
    assert key_deriver(*shared)(*rest) == derive_key(*shared, *rest)


def test_secret_parameters_are_declared_or_marked_in_the_schema():
    """`secret=` names parameters whose values a failed step never shows the model; a schema
    property marked writeOnly or format password is secret too; a renamed tool keeps them."""

    @agenttx.tool(secret=["card"])
    def charge(amount: int, card: str) -> dict:
        return {}

    assert charge.secrets == frozenset({"card"})
    assert charge.renamed("pay").secrets == frozenset({"card"})
    schema = {
        "type": "object",
        "properties": {
            "token": {"type": "string", "writeOnly": True},
            "pin": {"type": "string", "format": "password"},
            "user": {"type": "string"},
        },
    }
    marked = agenttx.tool(parameters=schema)(lambda token, pin, user: {})
    assert marked.secrets == frozenset({"token", "pin"})
    assert agenttx.tool(lambda a: a).secrets == frozenset()


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        ("card", "must be a list of parameter names"),
        (["cvv"], "names 'cvv', which is not one of its parameters \\(amount, card\\)"),
        ([3], "names 3"),
    ],
)
def test_secret_parameters_must_be_parameters(secret, message):
    """A `secret=` that is not a list of the tool's parameter names is refused at decoration."""

    def charge(amount: int, card: str) -> dict:
        return {}

    with pytest.raises(agenttx.InvalidArgument, match=f"tool `charge`: secret= {message}"):
        agenttx.tool(secret=secret)(charge)
