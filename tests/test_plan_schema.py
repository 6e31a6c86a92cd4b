"""The JSON Schema of a plan (`Plan.json_schema`) and the `propose_plan` tool (`plan_tool_spec`)."""

from __future__ import annotations

import copy
import enum
import json
from pathlib import Path
from typing import Any, Literal, NewType, TypedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _orders
import agenttx
from agenttx import InvalidArgument, Node, Plan
from agenttx._limits import (
    MAX_NODE_INPUT_BYTES,
    MAX_NODE_RETRIES,
    MAX_NODE_TIMEOUT,
    MAX_PLAN_NODES,
)
from agenttx.testing import plans

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).parent.parent


def validator(schema: dict[str, Any]) -> Any:
    """A draft 2020-12 validator of `schema`, after checking the schema itself."""
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(schema: dict[str, Any], document: object) -> list[str]:
    return [error.message for error in validator(schema).iter_errors(document)]


# ---------------------------------------------------------------------- tools of many shapes

Sku = NewType("Sku", str)


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Address(TypedDict):
    street: str
    number: int


class Made(TypedDict):
    id: str
    count: int
    tags: list[str]


@agenttx.tool
def make(name: str, count: int = 1) -> Made:
    """Make something."""
    return {"id": f"m-{name}", "count": count, "tags": [name]}


@agenttx.tool(name="ship.parcel")
def ship(
    sku: Sku,
    address: Address,
    sizes: list[int],
    colour: Colour,
    *,
    mode: Literal["air", "sea"] = "sea",
    note: str | None = None,
    pair: tuple[int, str] | None = None,
) -> dict[str, Any]:
    """Ship a parcel."""
    return {"ok": True}


@agenttx.tool
def relay(**values: Any) -> dict[str, Any]:
    """Pass values on."""
    return {"value": 1, **values}


@agenttx.compensation
def unmake(payload: dict[str, Any]) -> None:
    """Undo make."""


TOOLS = [make, ship, relay, unmake]


# ---------------------------------------------------------------------- the schema itself


def test_the_schema_is_a_valid_draft_2020_12_schema_naming_every_tool():
    """`Plan.json_schema(tools)` is a valid JSON Schema (draft 2020-12) whose `tool` enum lists
    each tool by its registered and its wire name; a transaction or a registry give the same."""
    schema = Plan.json_schema(TOOLS)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    node = schema["properties"]["nodes"]["items"]
    assert node["properties"]["tool"]["enum"] == ["make", "ship.parcel", "ship_parcel", "relay"]
    assert Plan.json_schema(agenttx.Transaction(tools=TOOLS)) == schema
    assert Plan.json_schema(agenttx.Engine(tools=TOOLS)) == schema
    assert Plan.json_schema(TOOLS) is not Plan.json_schema(TOOLS)  # a new object each call


def test_the_schema_states_the_limits_of_a_plan_from_json():
    """The node count, retries and timeout limits and the field shapes are in the schema."""
    props = Plan.json_schema(TOOLS)["properties"]
    assert props["nodes"]["maxItems"] == MAX_PLAN_NODES
    node = props["nodes"]["items"]
    assert node["required"] == ["id", "tool"]
    assert node["additionalProperties"] is False
    fields = node["properties"]
    assert set(fields) == set(Node("a", tool="t").to_json())  # every field from_json reads
    assert fields["retries"]["maximum"] == MAX_NODE_RETRIES
    assert fields["timeout"]["anyOf"][0]["maximum"] == MAX_NODE_TIMEOUT
    assert str(MAX_NODE_INPUT_BYTES) in fields["inputs"]["description"]


def test_refusing_what_is_not_tools():
    """Anything that is not tools, a transaction or an engine is an InvalidArgument."""
    for bad in ("make", 42):
        with pytest.raises(InvalidArgument):
            Plan.json_schema(bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- valid plans pass

MADE = "${first.id}"


def test_a_plan_with_references_everywhere_validates():
    """References are accepted wherever a value goes: a whole parameter, inside a list, an
    object, a tuple, an enum or a literal position, and in text; so are literals."""
    plan = {
        "initial": ["street"],
        "nodes": [
            {"id": "first", "tool": "make", "inputs": {"name": "box"}},
            {
                "id": "send",
                "tool": "ship_parcel",
                "inputs": {
                    "sku": MADE,
                    "address": {"street": "${initial.street}", "number": "${first.count}"},
                    "sizes": [1, "${first.count}"],
                    "colour": "${first.tags.0}",
                    "mode": "${first.tags.0}",
                    "pair": ["${first.count}", "x"],
                    "note": "made ${first.id}",
                },
                "after": ["first"],
                "retries": 10,
                "timeout": 3600,
                "exclusive_resource": "street:${initial.street}",
                "resources": {"api": 2},
            },
            {
                "id": "whole",
                "tool": "ship.parcel",
                "inputs": {"sku": "s", "address": "${first}", "sizes": "${first}", "colour": "red"},
            },
        ],
    }
    schema = Plan.json_schema(TOOLS)
    assert errors(schema, plan) == []


def order_plans() -> list[Plan]:
    """The order workflow's plans the plan tests use, each valid against its tools."""
    return [
        _orders.plan(),
        _orders.plan(reserve={"retries": 2, "timeout": 1.5, "resources": {"db": 1}}),
        _orders.plan(confirm={"optional": ["customer_id"], "fallback": {"customer_id": "c-0"}}),
    ]


@pytest.mark.parametrize("plan", order_plans(), ids=["plain", "settings", "fallback"])
def test_the_order_plans_validate_in_both_forms(plan):
    """Each valid order plan validates against the schema of its tools, in its canonical JSON
    form (every field written, nulls included) and as JSON text read back."""
    assert plan.validate(_orders.TOOLS) == ()
    schema = Plan.json_schema(_orders.TOOLS)
    assert errors(schema, plan.to_json()) == []
    assert errors(schema, json.loads(json.dumps(plan.to_json()))) == []


def test_the_example_plans_of_the_docs_and_examples_validate():
    """The plan of examples/order_plan.py validates against the schema of its tools."""
    import runpy  # noqa: PLC0415

    example = runpy.run_path(str(ROOT / "examples" / "order_plan.py"), run_name="not_main")
    tools = [
        example[name]
        for name in ("lookup_customer", "check_stock", "reserve_stock", "send_confirmation")
    ]
    tools.append(example["release_reservation"])
    plan = example["order_plan"]()
    assert plan.validate(tools) == ()
    assert errors(Plan.json_schema(tools), plan.to_json()) == []


@settings(max_examples=60, deadline=None)
@given(plans(tool="relay", max_nodes=10))
def test_every_plan_of_the_hypothesis_strategy_validates(plan):
    """Every plan `agenttx.testing.plans()` draws (valid against its tool) passes the schema."""
    assert plan.validate([relay]) == ()
    assert errors(Plan.json_schema(TOOLS), plan.to_json()) == []


def _literal(kind: str) -> st.SearchStrategy[Any]:
    return {
        "name": st.text(max_size=5),
        "count": st.integers(-5, 5),
        "sku": st.text(max_size=5),
        "address": st.fixed_dictionaries({"street": st.text(max_size=3), "number": st.integers()}),
        "sizes": st.lists(st.integers(), max_size=3),
        "colour": st.sampled_from(["red", "blue"]),
        "mode": st.sampled_from(["air", "sea"]),
        "note": st.none() | st.text(max_size=3),
        "pair": st.tuples(st.integers(), st.text(max_size=2)).map(list),
    }[kind]


#: The field of `make`'s output that fits each parameter (a reference to any other node's
#: output, whose type is unknown, fits any parameter).
FITS = {"name": "id", "count": "count", "sku": "id", "note": "id"}


@st.composite
def typed_plans(draw: st.DrawFn) -> Plan:
    """Plans of `make` and `ship.parcel` nodes: each input a literal of its type or a reference
    (whole or in text), with random node settings."""
    count = draw(st.integers(1, 5))
    nodes = []
    tools: dict[str, str] = {}
    for index in range(count):
        earlier = list(tools)
        tool = draw(st.sampled_from(["make", "ship.parcel", "ship_parcel"]))
        params = ("name", "count") if tool == "make" else ("sku", "address", "sizes", "colour")
        optional = () if tool == "make" else ("mode", "note", "pair")
        chosen = [*params, *draw(st.lists(st.sampled_from(params[1:] + optional)))]
        inputs = {}
        for param in dict.fromkeys(chosen):
            source = draw(st.sampled_from(earlier)) if earlier and draw(st.booleans()) else None
            if source is not None and tools[source] != "make":
                inputs[param] = draw(st.sampled_from([f"${{{source}.x}}", f"${{{source}.x.0}}"]))
            elif source is not None and param in FITS:
                field = FITS[param]
                inputs[param] = draw(
                    st.sampled_from([f"${{{source}.{field}}}", f"x-${{{source}.id}}"])
                    if field == "id"
                    else st.just(f"${{{source}.{field}}}")
                )
            else:
                inputs[param] = draw(_literal(param))
        fields: dict[str, Any] = {
            "inputs": inputs,
            "after": draw(st.lists(st.sampled_from(earlier), unique=True)) if earlier else [],
            "retries": draw(st.integers(0, 10)),
            "timeout": draw(st.none() | st.floats(0.001, 3600)),
            "compensate": draw(st.none() | st.just("unmake")),
        }
        if draw(st.booleans()):
            fields["exclusive_resource"] = draw(st.sampled_from(["r", "order-1"]))
            fields["resources"] = {"api": draw(st.integers(1, 3))}
        tools[f"n{index}"] = tool
        nodes.append(Node(f"n{index}", tool=tool, **fields))
    return Plan(nodes=nodes)


@settings(max_examples=150, deadline=None)
@given(typed_plans())
def test_the_schema_never_refuses_a_plan_that_validates(plan):
    """Whatever a random plan of typed tools holds, if `Plan.validate` accepts it, so does the
    schema: a model-side validator never blocks a valid plan."""
    if plan.validate(TOOLS) == ():
        assert errors(Plan.json_schema(TOOLS), plan.to_json()) == []


# ---------------------------------------------------------------------- invalid plans fail

GOOD: dict[str, Any] = {
    "nodes": [
        {"id": "first", "tool": "make", "inputs": {"name": "box"}},
        {"id": "second", "tool": "make", "inputs": {"name": MADE, "count": 2}},
    ]
}


def changed(path: tuple[Any, ...], value: object) -> dict[str, Any]:
    """GOOD with the value at `path` set (or, for `...`, deleted)."""
    plan = copy.deepcopy(GOOD)
    target: Any = plan
    for key in path[:-1]:
        target = target[key]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return plan


@pytest.mark.parametrize(
    ("plan", "why"),
    [
        (changed(("nodes", 0, "tool"), "mkae"), "an unknown tool"),
        (changed(("nodes", 0, "inputs", "name"), 3), "a literal of the wrong type"),
        (changed(("nodes", 0, "inputs"), {}), "a required input missing"),
        (changed(("nodes", 0, "inputs", "colour"), "red"), "an input the tool does not take"),
        (changed(("nodes", 0, "id"), "1st"), "an id that starts with a digit"),
        (changed(("nodes", 0, "id"), "steps"), "a reserved id"),
        (changed(("nodes", 0, "id"), "a.b"), "a dotted id"),
        (changed(("nodes", 0, "retries"), 11), "too many retries"),
        (changed(("nodes", 0, "timeout"), 3601), "too long a timeout"),
        (changed(("nodes", 0, "timeout"), 0), "a zero timeout"),
        (changed(("nodes", 0, "colour"), 1), "an unknown node field"),
        (changed(("nodes", 0, "tool"), ...), "no tool"),
        (changed(("nodes", 0, "after"), ["a", "a"]), "a node twice in after"),
        (changed(("nodes", 0, "resources"), {"api": 0}), "zero units"),
        (changed(("format",), 2), "another format"),
        (changed(("extra",), 1), "an unknown plan field"),
        ({"nodes": []}, "no nodes"),
        ({"nodes": [GOOD["nodes"][0]] * 1001}, "too many nodes"),
        ([], "not an object"),
    ],
)
def test_typical_invalid_plans_are_refused(plan, why):
    """The schema refuses the mistakes a model makes in a plan's shape."""
    assert errors(Plan.json_schema(TOOLS), plan), why


def test_a_refused_input_is_named_by_its_path():
    """A wrong literal is reported at its node and input, so a model knows what to fix."""
    plan = changed(("nodes", 1, "inputs", "count"), "two")
    (error,) = validator(Plan.json_schema(TOOLS)).iter_errors(plan)
    assert list(error.absolute_path) == ["nodes", 1, "inputs", "count"]


# ---------------------------------------------------------------------- $defs and $refs


def test_a_tools_definitions_move_into_the_plan_schema():
    """A tool whose parameters use `$defs` and `$ref` (`#` included) keeps them working: the
    definitions move under the tool's wire name, references still allowed inside them."""
    parameters = {
        "type": "object",
        "properties": {
            "box": {"$ref": "#/$defs/Box"},
            "again": {"$ref": "#"},
            "lost": {"$ref": "https://example.invalid/schema"},
        },
        "required": ["box"],
        "additionalProperties": False,
        "$defs": {"Box": {"type": "object", "properties": {"size": {"type": "integer"}}}},
    }

    @agenttx.tool(name="pack.box", parameters=parameters)
    def pack(**values: Any) -> dict[str, Any]:
        return values

    schema = Plan.json_schema([pack])
    assert set(schema["$defs"]) == {"pack_box.Box", "pack_box"}

    def plan(inputs: dict[str, Any]) -> dict[str, Any]:
        return {"nodes": [{"id": "p", "tool": "pack.box", "inputs": inputs}]}

    assert errors(schema, plan({"box": {"size": "${x.n}"}, "lost": [1]})) == []
    assert errors(schema, plan({"box": {"size": 1}, "again": {"box": "${x.b}"}})) == []
    assert errors(schema, plan({"box": {"size": "big"}}))
    assert errors(schema, plan({"box": {"size": 1}, "again": {"box": {"size": "big"}}}))


# ---------------------------------------------------------------------- the propose_plan tool


def test_the_propose_plan_tool_takes_a_plan_without_initial_values():
    """`plan_tool_spec(tools)` is a `ToolSpec` named propose_plan whose parameters are the plan
    schema without its dialect, and whose plans declare no initial values."""
    spec = agenttx.plan_tool_spec(TOOLS)
    assert isinstance(spec, agenttx.ToolSpec)
    assert (spec.name, spec.wire_name) == ("propose_plan", "propose_plan")
    assert "plan" in spec.description
    parameters = spec.parameters
    assert "$schema" not in parameters
    assert parameters["type"] == "object"
    expected = Plan.json_schema(TOOLS)
    assert parameters["properties"]["nodes"] == expected["properties"]["nodes"]
    assert errors(parameters, GOOD) == []
    assert errors(parameters, {**GOOD, "initial": ["k"]})
    assert agenttx.plan_tool_spec(agenttx.Transaction(tools=TOOLS)) == spec


def test_a_tool_named_propose_plan_is_refused():
    """A registered tool that takes the name propose_plan would be shadowed: InvalidArgument."""

    @agenttx.tool(name="propose_plan")
    def propose_plan() -> None: ...

    with pytest.raises(InvalidArgument, match="propose_plan"):
        agenttx.plan_tool_spec([propose_plan])
