"""The plan model: nodes and plans checked on construction, versions, analysis, resolution."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import _orders
import agenttx
from _orders import INITIAL, TOOLS
from agenttx import InvalidArgument, Node, Plan, PlanValidationError
from agenttx._plans import UnresolvedInput, resolve_inputs, resolve_resource
from agenttx._refs import resolve_plan_value

ROOT = Path(__file__).parent.parent

# ---------------------------------------------------------------------- nodes


def test_node_takes_its_id_by_position_and_the_rest_by_keyword():
    """`Node("id", tool=...)` as the design shows; every other field is keyword-only."""
    node = Node("stock_check", tool="check_stock", inputs={"sku": "${initial.sku}"})
    assert (node.id, node.tool, dict(node.inputs)) == (
        "stock_check",
        "check_stock",
        {"sku": "${initial.sku}"},
    )
    assert (node.after, node.retries, node.timeout, node.compensate) == ((), 0, None, None)
    with pytest.raises(TypeError):
        Node("a", "check_stock")  # type: ignore[misc]


def test_node_takes_a_tool_object_by_its_name():
    """A decorated tool stands for its registered name."""
    assert Node("a", tool=_orders.check_stock).tool == "check_stock"


@pytest.mark.parametrize(
    "node_id", ["", "a.b", "9lives", "has space", "initial", "steps", "x" * 129, 7, None]
)
def test_node_ids_are_names_without_dots(node_id):
    """An id must be a reference namespace: no dots, not reserved, not empty, not too long."""
    with pytest.raises(InvalidArgument, match="node id"):
        Node(node_id, tool="t")


@pytest.mark.parametrize("node_id", ["a", "_x", "stock-check", "n0", "A_b-9", "x" * 128])
def test_good_node_ids(node_id):
    """Letters, digits, `_` and `-`, starting with a letter or `_`."""
    assert Node(node_id, tool="t").id == node_id


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"tool": ""}, "node `a`: tool must be a string"),
        ({"tool": 3}, "node `a`: tool must be a string"),
        ({"inputs": ["x"]}, "node `a`: inputs must be a mapping"),
        ({"inputs": {"": 1}}, "node `a`: inputs key must be a string"),
        ({"after": "b"}, "node `a`: after must be a list of names"),
        ({"after": ["b", 3]}, "node `a`: after entry must be a string"),
        ({"exclusive_resource": ""}, "node `a`: exclusive_resource must be a string"),
        ({"resources": {"api": 0}}, r"node `a`: resources\['api'\] must be an integer > 0"),
        ({"resources": {"api": True}}, r"resources\['api'\] must be an integer > 0"),
        ({"resources": {"api": 1.5}}, r"resources\['api'\] must be an integer > 0"),
        ({"resources": [("api", 1)]}, "resources must be a mapping"),
        ({"retries": -1}, "node `a`: retries must be an integer >= 0"),
        ({"retries": 1.0}, "retries must be an integer >= 0"),
        ({"retries": True}, "retries must be an integer >= 0"),
        ({"timeout": 0}, "node `a`: timeout must be None or a number > 0"),
        ({"timeout": -1.0}, "timeout must be None or a number > 0"),
        ({"timeout": float("inf")}, "timeout must be None or a number > 0"),
        ({"timeout": "5"}, "timeout must be None or a number > 0"),
        ({"compensate": ""}, "node `a`: compensate must be a string"),
        ({"optional": ["nope"]}, "optional and fallback name input 'nope'"),
        ({"fallback": {"nope": 1}}, "optional and fallback name input 'nope'"),
    ],
)
def test_each_field_is_checked_and_named(fields, match):
    """A bad field raises InvalidArgument naming the node and the field."""
    fields = {"tool": "t", **fields}
    with pytest.raises(InvalidArgument, match=match):
        Node("a", **fields)


def test_inputs_must_be_json():
    """A non-JSON input value is a JSONValueError naming the node's inputs."""
    with pytest.raises(agenttx.JSONValueError, match="inputs of node `a`"):
        Node("a", tool="t", inputs={"x": {1, 2}})
    with pytest.raises(agenttx.JSONValueError, match="fallback of node `a`"):
        Node("a", tool="t", inputs={"x": "${b.x}"}, fallback={"x": float("nan")})


def test_malformed_references_wait_for_validation():
    """A malformed reference does not fail construction: `validate` reports it with the rest."""
    node = Node("a", tool="t", inputs={"x": "${b.x", "y": "${b.y}"})
    assert [ref.text for ref in node.input_refs] == ["${b.y}"]


def test_nodes_are_read_only_copies():
    """Mappings are copied and read-only, so a plan's version cannot go stale."""
    inputs = {"sku": "${initial.sku}"}
    node = Node("a", tool="t", inputs=inputs, resources={"api": 1})
    inputs["sku"] = "changed"
    assert node.inputs["sku"] == "${initial.sku}"
    with pytest.raises(TypeError):
        node.inputs["sku"] = "x"  # type: ignore[index]
    with pytest.raises(AttributeError):
        node.tool = "other"  # type: ignore[misc]


def test_nodes_compare_by_value_and_hash():
    """Equal fields make equal nodes with equal hashes."""
    one = Node("a", tool="t", inputs={"x": 1, "y": 2}, after=["b"])
    two = Node("a", tool="t", inputs={"y": 2, "x": 1}, after=("b",))
    assert one == two
    assert hash(one) == hash(two)
    assert one != Node("a", tool="t", inputs={"x": 1})
    assert len({one, two}) == 1


def test_timeout_is_a_float():
    """An integer timeout is kept as a float, so `5` and `5.0` give one version."""
    assert Node("a", tool="t", timeout=5).timeout == 5.0
    assert Plan(nodes=[Node("a", tool="t", timeout=5)]).version == (
        Plan(nodes=[Node("a", tool="t", timeout=5.0)]).version
    )


def test_compensate_takes_a_compensation_or_its_name():
    """A compensation object is kept; its name is what the version and validation read."""
    node = Node("a", tool="t", compensate=_orders.release_reservation)
    assert node.compensation_name == "release_reservation"
    named = Node("a", tool="t", compensate="release_reservation")
    assert Plan(nodes=[node]).version == Plan(nodes=[named]).version


# ---------------------------------------------------------------------- plans


def test_plan_takes_lists():
    """Nodes and initial may be given as lists; they are kept as tuples."""
    plan = _orders.plan()
    assert isinstance(plan.nodes, tuple)
    assert plan.initial == INITIAL
    assert plan.node_ids == ("customer_lookup", "stock_check", "reserve", "confirm")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"nodes": []}, "at least one node"),
        ({"nodes": "abc"}, "must be a list of Node"),
        ({"nodes": [{"id": "a"}]}, r"nodes\[0\] must be a Node"),
        ({"initial": "sku"}, "initial must be a list"),
        ({"initial": ["a.b"]}, "initial key 'a.b'"),
        ({"initial": [""]}, "initial key ''"),
        ({"initial": ["sku", "sku"]}, "lists sku more than once"),
    ],
)
def test_plan_fields_are_checked(fields, match):
    """A bad plan field raises InvalidArgument saying what is wrong."""
    fields = {"nodes": [Node("a", tool="t")], **fields}
    with pytest.raises(InvalidArgument, match=match):
        Plan(**fields)


def test_prerequisites_are_distinct_value_dependencies_and_after():
    """References and `after` count; initial inputs and exclusive resources do not."""
    plan = _orders.plan()
    assert plan.prerequisites("customer_lookup") == frozenset()
    assert plan.prerequisites("reserve") == {"customer_lookup", "stock_check"}
    assert plan.prerequisites("confirm") == {"customer_lookup", "reserve"}
    assert plan.dependants("customer_lookup") == {"reserve", "confirm"}
    assert plan.dependants("confirm") == frozenset()


def test_analysis_of_an_unknown_node_raises():
    """Asking about a node the plan lacks is InvalidArgument naming it."""
    plan = _orders.plan()
    for method in (plan.node, plan.prerequisites, plan.dependants, plan.input_refs):
        with pytest.raises(InvalidArgument, match="no node 'ghost'"):
            method("ghost")


def test_input_refs_say_where_each_reference_sits():
    """Each reference names its input, namespace and path, and whether it is whole."""
    node = Node(
        "a",
        tool="t",
        inputs={"x": "${b.y.0}", "note": "id-${initial.order_id}", "many": ["${c}"]},
    )
    refs = {
        (ref.param, ref.namespace, ref.path, ref.whole, ref.interpolated) for ref in node.input_refs
    }
    assert refs == {
        ("x", "b", ("y", "0"), True, False),
        ("note", "initial", ("order_id",), False, True),
        ("many", "c", (), False, False),
    }
    assert Plan(nodes=[node]).input_refs("a") == node.input_refs


def test_topological_order_breaks_ties_by_plan_order():
    """Each node comes after its prerequisites; ready nodes come in plan order."""
    assert _orders.plan().topological_order() == (
        "customer_lookup",
        "stock_check",
        "reserve",
        "confirm",
    )
    reordered = Plan(nodes=list(reversed(_orders.nodes())), initial=INITIAL)
    assert reordered.topological_order() == ("stock_check", "customer_lookup", "reserve", "confirm")


def test_topological_order_of_a_cycle_raises():
    """A ring has no order: PlanValidationError with the CYCLE problem."""
    plan = _orders.plan(customer_lookup={"after": ["confirm"]})
    with pytest.raises(PlanValidationError) as caught:
        plan.topological_order()
    assert [problem.subject for problem in caught.value.problems] == [
        "customer_lookup -> confirm -> customer_lookup"
    ]


# ---------------------------------------------------------------------- versions


def test_version_is_a_sha256_of_the_canonical_form():
    """The version is 64 hex digits, pinned for a small plan so the canonical form is stable."""
    plan = Plan(nodes=[Node("a", tool="t", inputs={"x": "${initial.k}"})], initial=["k"])
    assert plan.to_json() == {
        "format": 1,
        "initial": ["k"],
        "nodes": [
            {
                "id": "a",
                "tool": "t",
                "inputs": {"x": "${initial.k}"},
                "after": [],
                "exclusive_resource": None,
                "resources": {},
                "retries": 0,
                "timeout": None,
                "compensate": None,
                "optional": [],
                "fallback": {},
            }
        ],
    }
    canonical = (
        '{"format":1,"initial":["k"],"nodes":[{"after":[],"compensate":null,'
        '"exclusive_resource":null,"fallback":{},"id":"a","inputs":{"x":"${initial.k}"},'
        '"optional":[],"resources":{},"retries":0,"timeout":null,"tool":"t"}]}'
    )
    assert plan.version == hashlib.sha256(canonical.encode()).hexdigest()
    assert plan.version == "208f2ed0ee3f760862c1bc575d7ec1fdb6e81149b4fc8dd372cc882863e98e0e"


def test_version_ignores_mapping_and_set_orders():
    """Key order of mappings and the order of after, optional and initial do not matter."""
    one = Plan(
        nodes=[
            Node("b", tool="t"),
            Node("c", tool="t"),
            Node(
                "a",
                tool="t",
                inputs={"x": 1, "y": {"p": 1, "q": 2}},
                after=["b", "c"],
                resources={"r": 1, "s": 2},
            ),
        ],
        initial=["k", "j"],
    )
    two = Plan(
        nodes=[
            Node("b", tool="t"),
            Node("c", tool="t"),
            Node(
                "a",
                tool="t",
                inputs={"y": {"q": 2, "p": 1}, "x": 1},
                after=["c", "b"],
                resources={"s": 2, "r": 1},
            ),
        ],
        initial=["j", "k"],
    )
    assert one.version == two.version


@pytest.mark.parametrize(
    "change",
    [
        {"retries": 1},
        {"timeout": 3.0},
        {"inputs": {"x": 2}},
        {"tool": "u"},
        {"exclusive_resource": "r"},
        {"resources": {"r": 1}},
        {"after": ["b"]},
    ],
)
def test_version_changes_with_anything_that_changes_a_run(change):
    """Each field that can change a run changes the version."""
    fields = {"tool": "t", "inputs": {"x": 1}, **change}
    base = Plan(nodes=[Node("b", tool="t"), Node("a", tool="t", inputs={"x": 1})])
    changed = Plan(nodes=[Node("b", tool="t"), Node("a", **fields)])
    assert base.version != changed.version


def test_version_changes_with_node_order():
    """Node order breaks ties between ready nodes, so it is part of the version."""
    one = Plan(nodes=[Node("a", tool="t"), Node("b", tool="t")])
    two = Plan(nodes=[Node("b", tool="t"), Node("a", tool="t")])
    assert one.version != two.version


def test_version_is_stable_across_processes():
    """Another interpreter with another hash seed computes the same version."""
    script = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, "tests")
        import _orders
        print(_orders.plan().version)
        """
    )
    versions = set()
    for seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)},
        )
        versions.add(result.stdout.strip())
    assert versions == {_orders.plan().version}


def test_json_form_round_trips():
    """`Plan.from_json(plan.to_json())` is an equal plan with the same version."""
    plan = _orders.plan(reserve={"retries": 2, "timeout": 1.5, "resources": {"db": 1}})
    again = Plan.from_json(plan.to_json())
    assert again.version == plan.version
    assert again.to_json() == plan.to_json()


def test_from_json_takes_an_agents_plan():
    """An agent's JSON plan may leave out defaults and the format."""
    plan = Plan.from_json(
        {
            "initial": ["sku"],
            "nodes": [
                {"id": "stock_check", "tool": "check_stock", "inputs": {"sku": "${initial.sku}"}}
            ],
        }
    )
    assert plan.validate(TOOLS) == ()


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ([], "must be an object"),
        ({"nodes": []}, "at least one node"),
        ({"nodes": {}}, "needs `nodes`"),
        ({"nodes": [1]}, "must be an object"),
        ({"nodes": [{"id": "a"}]}, "needs `id` and `tool`"),
        ({"nodes": [{"id": "a", "tool": "t", "colour": 1}]}, "unknown field"),
        ({"nodes": [{"id": "a", "tool": "t"}], "extra": 1}, "unknown field"),
        ({"nodes": [{"id": "a", "tool": "t"}], "format": 2}, "format 2"),
        ({"nodes": [{"id": "a", "tool": "t"}], "initial": "k"}, "list of key names"),
        ({"nodes": [{"id": "a", "tool": "t", "retries": -1}]}, "retries"),
    ],
)
def test_from_json_refuses_bad_plans(data, match):
    """A malformed JSON plan raises InvalidArgument saying what is wrong."""
    with pytest.raises(InvalidArgument, match=match):
        Plan.from_json(data)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("retries", 1_000_000_000, r"node `a`: retries must be at most 10 \(MAX_NODE_RETRIES\)"),
        ("retries", 11, r"node `a`: retries must be at most 10 \(MAX_NODE_RETRIES\)"),
        ("timeout", 3601, r"node `a`: timeout must be at most 3600 seconds \(MAX_NODE_TIMEOUT\)"),
        ("timeout", 1e300, r"node `a`: timeout must be at most 3600 seconds"),
        (
            "inputs",
            {"n": "x" * 65_536},
            r"node `a`: inputs must be at most 65536 bytes of JSON \(MAX_NODE_INPUT_BYTES\)",
        ),
    ],
)
def test_from_json_bounds_a_models_node(field, value, match):
    """A JSON plan's node may not ask for more retries, a longer timeout or larger inputs than
    the documented limits: InvalidArgument names the node, the field and the limit."""
    with pytest.raises(InvalidArgument, match=match):
        Plan.from_json({"nodes": [{"id": "a", "tool": "t", field: value}]})


def test_from_json_takes_a_node_at_the_limits():
    """Retries, timeout and inputs exactly at the limits are accepted."""
    inputs = {"n": "x" * (65_536 - len('{"n":""}'))}
    plan = Plan.from_json(
        {"nodes": [{"id": "a", "tool": "t", "retries": 10, "timeout": 3600, "inputs": inputs}]}
    )
    assert plan.node("a").retries == 10
    assert plan.node("a").timeout == 3600.0


def test_from_json_bounds_the_number_of_nodes():
    """A JSON plan may have 1000 nodes (MAX_PLAN_NODES), not 1001."""
    nodes = [{"id": f"n{i}", "tool": "t"} for i in range(1001)]
    with pytest.raises(InvalidArgument, match=r"at most 1000 nodes \(MAX_PLAN_NODES\), got 1001"):
        Plan.from_json({"nodes": nodes})
    assert len(Plan.from_json({"nodes": nodes[:1000]}).nodes) == 1000


def test_from_json_takes_json_text():
    """`Plan.from_json` reads a plan's JSON text (str or UTF-8 bytes) as it reads the mapping."""
    plan = _orders.plan(reserve={"retries": 2})
    text = json.dumps(plan.to_json())
    assert Plan.from_json(text).version == plan.version
    assert Plan.from_json(text.encode()).version == plan.version
    agents = '{"nodes": [{"id": "a", "tool": "check_stock", "inputs": {"sku": "s"}}]}'
    assert Plan.from_json(agents).validate(TOOLS) == ()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"nodes": [', "a plan in JSON text is malformed: Expecting value"),
        ("", "a plan in JSON text is malformed"),
        ("[" * 100_000 + "]" * 100_000, "a plan in JSON text is malformed"),
        (b"\xff{}", "not UTF-8"),
        ('"a plan"', "must be an object"),
        ('{"nodes": [{"id": "a", "tool": "t", "retries": 11}]}', "MAX_NODE_RETRIES"),
        ('{"nodes": [{"id": "a", "tool": "t", "timeout": NaN}]}', "not a finite number"),
        (" " * (1_048_576 + 1), "at most 1048576 bytes"),
        (b" " * (1_048_576 + 1), "at most 1048576 bytes"),
    ],
)
def test_from_json_refuses_bad_text_with_the_same_error(text, match):
    """Malformed, oversized or non-UTF-8 text raises the InvalidArgument a bad mapping does,
    saying what is wrong; a well-formed text is held to every check a mapping is."""
    with pytest.raises(InvalidArgument, match=match):
        Plan.from_json(text)


def test_a_python_node_keeps_a_larger_but_bounded_retry_budget():
    """A Node built in Python may ask for up to 1000 retries (MAX_NODE_RETRIES_IN_CODE), and a
    plan built in Python is not held to the JSON limits; a billion retries are refused."""
    node = Node("a", tool="t", retries=1000, timeout=7200)
    assert Plan(nodes=[node]).node("a").retries == 1000
    with pytest.raises(InvalidArgument, match=r"node `a`: retries must be at most 1000"):
        Node("a", tool="t", retries=1_000_000_000)


# ---------------------------------------------------------------------- resolution

OUTPUTS = {
    "customer_lookup": {"customer_id": "c-1", "account_status": "active", "extra": [1, 2]},
    "stock_check": {"warehouse_id": "w-1", "available": 3},
}
VALUES = {"customer_email": "a@b", "sku": "S", "quantity": 2, "order_id": "o-1", "currency": "GBP"}


def test_a_node_receives_exactly_its_mapped_inputs():
    """Only mapped inputs are passed; whole references keep their JSON type."""
    reserve = _orders.plan().node("reserve")
    assert resolve_inputs(reserve, VALUES, OUTPUTS) == {
        "customer_id": "c-1",
        "warehouse_id": "w-1",
        "quantity": 2,
    }


def test_literals_escapes_and_interpolation():
    """Literals pass through, `$${` writes `${`, scalars are written into text as JSON."""
    node = Node(
        "n",
        tool="t",
        inputs={
            "literal": {"a": [1, None, True]},
            "escaped": "cost: $${initial.price}",
            "text": "order ${initial.order_id} x${initial.quantity} ${stock_check.available}",
            "nested": ["${customer_lookup.extra.1}", {"k": "${initial.sku}"}],
        },
    )
    assert resolve_inputs(node, VALUES, OUTPUTS) == {
        "literal": {"a": [1, None, True]},
        "escaped": "cost: ${initial.price}",
        "text": "order o-1 x2 3",
        "nested": [2, {"k": "S"}],
    }


@pytest.mark.parametrize(
    ("inputs", "direct"),
    [
        ({"a": "${customer_lookup.customer_id}", "b": 7, "c": "${initial.sku}"}, True),
        ({"a": "${stock_check.available}", "b": None, "c": "plain"}, True),
        ({"a": "${customer_lookup.extra}"}, True),  # a list: read the general way (a copy)
        ({"a": "${customer_lookup.extra.1}"}, True),  # an index: read the general way
        ({"a": "${customer_lookup.nope}"}, True),  # missing: the general way's error
        ({"a": "x ${initial.sku}"}, False),  # interpolated
        ({"a": ["${initial.sku}"]}, False),  # nested
        ({"a": "cost $${initial.sku}"}, False),  # an escape
    ],
)
def test_the_direct_reading_agrees_with_the_general_one(inputs, direct):
    """Nodes of literal scalars and whole references are read directly, with the result (or
    the error) the general reading gives; other nodes are read the general way."""
    from agenttx._plans._node import _resolve_inputs  # noqa: PLC0415

    node = Node("n", tool="t", inputs=inputs)
    assert bool(node._direct_inputs()) is direct

    def outcome(resolve: Any) -> object:
        try:
            return resolve(node, VALUES, OUTPUTS)
        except UnresolvedInput as exc:
            return ("unresolved", exc.param, exc.message)

    assert outcome(resolve_inputs) == outcome(_resolve_inputs)


def test_resolved_values_do_not_alias_outputs():
    """Changing what a node received never changes the producer's output."""
    node = Node("n", tool="t", inputs={"x": "${customer_lookup.extra}"})
    received = resolve_inputs(node, VALUES, OUTPUTS)
    received["x"].append(3)  # type: ignore[union-attr]
    assert OUTPUTS["customer_lookup"]["extra"] == [1, 2]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            {"x": "${customer_lookup.missing}"},
            "key 'missing' not present in the output of node customer_lookup",
        ),
        ({"x": "${reserve.id}"}, "points to node reserve, which has no output"),
        ({"x": "${initial.nope}"}, "key 'nope' not present in the initial inputs"),
        ({"x": "list: ${customer_lookup.extra}"}, "is a list, which cannot be written into text"),
        ({"x": "obj: ${customer_lookup}"}, "is an object, which cannot be written into text"),
        ({"x": "${bad"}, "no closing"),
    ],
)
def test_unresolvable_inputs_raise_naming_the_input(inputs, message):
    """A required input that cannot be resolved raises UnresolvedInput naming it."""
    node = Node("n", tool="t", inputs=inputs)
    with pytest.raises(UnresolvedInput, match=message) as caught:
        resolve_inputs(node, VALUES, OUTPUTS)
    assert caught.value.param == "x"
    assert "input `x` of node `n`" in caught.value.message


def test_optional_inputs_are_left_out_and_fallbacks_used():
    """Without its producer's output, an optional input is omitted and a fallback replaces one."""
    node = Node(
        "n",
        tool="t",
        inputs={"a": "${reserve.id}", "b": "${reserve.id}", "c": "${stock_check.available}"},
        optional=["a"],
        fallback={"b": "none"},
    )
    assert resolve_inputs(node, VALUES, OUTPUTS) == {"b": "none", "c": 3}
    done = {**OUTPUTS, "reserve": {"id": "r-1"}}
    assert resolve_inputs(node, VALUES, done) == {"a": "r-1", "b": "r-1", "c": 3}


@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers() | st.text(), min_size=1))
def test_literal_inputs_resolve_to_themselves(inputs):
    """A node whose inputs hold no reference receives them unchanged."""
    clean = {
        key: value.replace("$", "") if isinstance(value, str) else value
        for key, value in inputs.items()
    }
    assert resolve_inputs(Node("n", tool="t", inputs=clean), {}, {}) == clean


def test_exclusive_resources_resolve_from_initial_values():
    """`order:${initial.order_id}` names one resource per order; no resource gives None."""
    reserve = _orders.plan().node("reserve")
    assert resolve_resource(reserve, VALUES) == "order:o-1"
    assert resolve_resource(reserve, {**VALUES, "order_id": 7}) == "order:7"
    assert resolve_resource(Node("n", tool="t", exclusive_resource="global"), {}) == "global"
    assert resolve_resource(Node("n", tool="t"), VALUES) is None
    with pytest.raises(UnresolvedInput, match="exclusive resource of node `reserve`"):
        resolve_resource(reserve, {})


def test_initial_values_are_checked_against_the_declaration():
    """Unknown keys, missing keys and non-JSON values are refused before a run."""
    plan = _orders.plan()
    assert plan.check_initial(VALUES) == VALUES
    with pytest.raises(InvalidArgument, match="does not declare: colour"):
        plan.check_initial({**VALUES, "colour": "red"})
    with pytest.raises(InvalidArgument, match="lack declared key"):
        plan.check_initial({"sku": "S"})
    with pytest.raises(agenttx.JSONValueError, match="initial values"):
        plan.check_initial({**VALUES, "quantity": float("nan")})
    with pytest.raises(InvalidArgument, match="must be a mapping"):
        plan.check_initial([("sku", "S")])


def test_a_fallback_also_replaces_a_missing_key():
    """A fallback stands in when the producer succeeded but its output lacks the field."""
    node = Node("n", tool="t", inputs={"a": "${stock_check.nope}"}, fallback={"a": 0})
    assert resolve_inputs(node, VALUES, OUTPUTS) == {"a": 0}


def test_plans_hash_by_version_and_take_any_iterable():
    """Equal plans hash alike; nodes, after and initial may come from any iterable."""
    one = Plan(nodes=(n for n in _orders.nodes()), initial=iter(INITIAL))
    two = _orders.plan()
    assert one == two
    assert len({one, two}) == 1
    assert Node("a", tool="t", after=(x for x in ["b"])).after == ("b",)


def test_node_repr_reads_like_the_call():
    """A node's repr shows plain mappings, as it was written."""
    node = Node("a", tool="t", inputs={"x": 1}, resources={"r": 2})
    assert repr(node).startswith("Node(id='a', tool='t', inputs={'x': 1}, after=()")
    assert "resources={'r': 2}" in repr(node)


_PIECES = st.sampled_from(
    [
        "${customer_lookup.customer_id}",
        "${customer_lookup.extra}",
        "${customer_lookup.extra.0}",
        "${customer_lookup.missing}",
        "${stock_check.available}",
        "${reserve.id}",
        "${initial.quantity}",
        "${initial.nope}",
        "$${initial.sku}",
        "${bad",
        "text ",
        "",
    ]
)
_INPUTS = st.one_of(
    st.lists(_PIECES, min_size=1, max_size=3).map("".join),
    st.lists(_PIECES, max_size=2),
    st.integers(),
    st.none(),
    st.booleans(),
)


@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), _INPUTS, min_size=1))
def test_inputs_resolve_as_resolve_plan_value_says(inputs):
    """Each input resolves (or fails, with the same message) as `resolve_plan_value` of it,
    whole references included, and again the same when the node is resolved a second time."""
    node = Node("n", tool="t", inputs=inputs)
    namespaces = {"initial": VALUES, **OUTPUTS}
    expected: dict[str, object] = {}
    error: tuple[str, str] | None = None
    for param, value in inputs.items():
        resolved, message = resolve_plan_value(value, namespaces)
        if message is not None:
            error = (param, f"input `{param}` of node `n`: {message}")
            break
        expected[param] = resolved
    for _ in range(2):
        if error is None:
            assert resolve_inputs(node, VALUES, OUTPUTS) == expected
        else:
            with pytest.raises(UnresolvedInput) as caught:
                resolve_inputs(node, VALUES, OUTPUTS)
            assert (caught.value.param, caught.value.message) == error
