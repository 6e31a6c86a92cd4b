"""Plan validation: one example per problem code, cycle paths, report order, random DAGs."""

from __future__ import annotations

import enum
import itertools
from typing import Annotated, Any, Literal, NewType, Optional, TypedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st

import _orders
import agenttx
from _orders import INITIAL, TOOLS
from agenttx import Node, Plan, PlanProblem, PlanProblemCode, PlanValidationError
from agenttx.testing import plans

Code = PlanProblemCode


def problems_of(plan: Plan, tools: Any = TOOLS) -> list[tuple[str, str]]:
    """(code, subject) of each problem, in report order."""
    return [(problem.code.value, problem.subject) for problem in plan.validate(tools)]


def only(plan: Plan, tools: Any = TOOLS) -> PlanProblem:
    """The single problem of `plan`."""
    problems = plan.validate(tools)
    assert len(problems) == 1, problems
    return problems[0]


# ---------------------------------------------------------------------- the valid plan


def test_the_order_workflow_is_valid():
    """The order workflow validates clean against its tools."""
    assert _orders.plan().validate(TOOLS) == ()


def test_validate_takes_what_a_transaction_takes():
    """Tools may be a list, a mapping of names to callables or a registry of either."""
    plan = _orders.plan()
    assert plan.validate({tool.name: tool for tool in TOOLS}) == ()
    assert plan.validate([*TOOLS, _orders.release_reservation]) == ()


def test_a_plan_keeps_its_validation_for_the_same_tools_only(monkeypatch):
    """A second `validate` with the very same tools gives the kept answer without checking
    again; other tools (another tool object under a name, one tool fewer) are checked afresh."""
    from agenttx._plans import _validate  # noqa: PLC0415

    checked: list[int] = []
    real = _validate._Checker.node

    def counting(self, position, node):
        checked.append(position)
        real(self, position, node)

    monkeypatch.setattr(_validate._Checker, "node", counting)
    plan = _orders.plan()
    first = plan.validate(TOOLS)
    assert first == ()
    assert len(checked) == len(plan.nodes)
    assert plan.validate(list(TOOLS)) is first  # the same tool objects: kept
    assert len(checked) == len(plan.nodes)

    @agenttx.tool(name="check_stock")
    def other_check_stock(code: str) -> dict:
        """Another tool under the same name: it takes a `code`, not a `sku`."""
        return {"code": code}

    others = [other_check_stock if tool.name == "check_stock" else tool for tool in TOOLS]
    assert ("MISSING_INPUT", "stock_check.code") in problems_of(plan, others)
    assert len(checked) == 2 * len(plan.nodes)
    fewer = [tool for tool in TOOLS if tool.name != "check_stock"]
    assert [p.code for p in plan.validate(fewer)] == [Code.UNKNOWN_TOOL]
    assert plan.validate(TOOLS) == ()  # back to the first tools: checked again, still valid
    assert len(checked) == 4 * len(plan.nodes)


def test_invalid_tools_raise_rather_than_report():
    """A tools argument that is not tools is misuse: InvalidArgument, not a problem."""
    with pytest.raises(agenttx.InvalidArgument, match="not a tool"):
        _orders.plan().validate([42])


def test_check_raises_with_every_problem():
    """`plan.check` raises PlanValidationError (an InvalidArgument) carrying all problems."""
    plan = _orders.plan(
        stock_check={"tool": "check_stok"}, reserve={"inputs": {"customer_id": "x"}}
    )
    with pytest.raises(PlanValidationError) as caught:
        plan.check(TOOLS)
    error = caught.value
    assert isinstance(error, agenttx.InvalidArgument)
    assert error.code == "invalid_plan"
    assert error.problems == plan.validate(TOOLS)
    assert len(error.problems) == 3
    assert "3 problems" in str(error)
    assert "UNKNOWN_TOOL stock_check" in str(error)
    _orders.plan().check(TOOLS)  # a valid plan passes silently


def test_error_message_lists_the_first_problems_only():
    """A long report is shortened in the message; `problems` keeps every one."""
    nodes = [Node(f"n{i}", tool="nothing") for i in range(12)]
    with pytest.raises(PlanValidationError) as caught:
        Plan(nodes=nodes).check(TOOLS)
    assert len(caught.value.problems) == 12
    assert str(caught.value).endswith("and 7 more")


def test_problem_codes_are_their_names():
    """Each code's value is its name, and the issue's codes are all there."""
    assert {code.name for code in Code} >= {
        "UNKNOWN_NODE",
        "UNKNOWN_TOOL",
        "DUPLICATE_NODE",
        "MISSING_INPUT",
        "MISSING_OUTPUT",
        "MALFORMED_PATH",
        "TYPE_MISMATCH",
        "UNSUPPORTED_TRANSFORMATION",
        "SELF_DEPENDENCY",
        "DUPLICATE_EDGE",
        "CYCLE",
    }
    assert all(code.value == code.name == str(code) for code in Code)
    assert Code("CYCLE") is Code.CYCLE


# ---------------------------------------------------------------------- one example per code


def test_unknown_node_in_a_reference():
    """A reference to a node the plan lacks is UNKNOWN_NODE, subject the missing node."""
    plan = _orders.plan(
        reserve={
            "inputs": {
                "customer_id": "${customer_lookup.customer_id}",
                "warehouse_id": "${stok_check.warehouse_id}",
                "quantity": "${initial.quantity}",
            }
        }
    )
    problem = only(plan)
    assert (problem.code, problem.subject) == (Code.UNKNOWN_NODE, "stok_check")
    assert "did you mean `stock_check`" in problem.message


def test_unknown_node_in_after():
    """`after` naming a node the plan lacks is UNKNOWN_NODE too."""
    problem = only(_orders.plan(confirm={"after": ["reserv"]}))
    assert (problem.code, problem.subject) == (Code.UNKNOWN_NODE, "reserv")
    assert "runs after `reserv`" in problem.message


def test_unknown_tool():
    """A node calling an unregistered tool is UNKNOWN_TOOL, subject the node."""
    problem = only(_orders.plan(stock_check={"tool": "check_stok"}))
    assert (problem.code, problem.subject) == (Code.UNKNOWN_TOOL, "stock_check")
    assert "`check_stok`" in problem.message
    assert "did you mean `check_stock`" in problem.message


def test_unknown_compensation_is_an_unknown_tool():
    """A compensation name nobody registered is UNKNOWN_TOOL on `node.compensate`."""
    problem = only(_orders.plan(reserve={"compensate": "release"}))
    assert (problem.code, problem.subject) == (Code.UNKNOWN_TOOL, "reserve.compensate")
    assert _orders.plan(reserve={"compensate": "release_reservation"}).validate(TOOLS) == ()
    compensation = _orders.release_reservation
    assert _orders.plan(reserve={"compensate": compensation}).validate(TOOLS) == ()


def test_unknown_input():
    """An input the tool does not take is UNKNOWN_INPUT on `node.input`."""
    plan = _orders.plan(stock_check={"inputs": {"sku": "${initial.sku}", "skus": "x"}})
    problem = only(plan)
    assert (problem.code, problem.subject) == (Code.UNKNOWN_INPUT, "stock_check.skus")
    assert "did you mean `sku`" in problem.message


def test_kwargs_tools_take_any_input():
    """A tool with `**kwargs` takes inputs it does not name."""

    @agenttx.tool
    def anything(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    plan = Plan(nodes=[Node("a", tool="anything", inputs={"x": 1, "y": "z"})])
    assert plan.validate([anything]) == ()


def test_duplicate_node():
    """Two nodes with one id are DUPLICATE_NODE, reported once, at the second."""
    plan = Plan(nodes=[*_orders.nodes(), _orders.nodes()[1]], initial=INITIAL)
    problem = only(plan)
    assert (problem.code, problem.subject) == (Code.DUPLICATE_NODE, "stock_check")
    assert "nodes[1] and nodes[4] both have the id `stock_check`" in problem.message


def test_missing_input_for_a_required_parameter():
    """An unmapped required parameter is MISSING_INPUT on `node.param`; defaults may be left."""
    plan = _orders.plan(
        reserve={
            "inputs": {
                "customer_id": "${customer_lookup.customer_id}",
                "warehouse_id": "${stock_check.warehouse_id}",
            }
        },
        confirm={"inputs": {"order_id": "o", "customer_id": "${customer_lookup.customer_id}"}},
    )
    problem = only(plan)
    assert (problem.code, problem.subject) == (Code.MISSING_INPUT, "reserve.quantity")
    assert "required parameter of tool `reserve_stock`" in problem.message


def test_missing_input_for_an_undeclared_initial_key():
    """`${initial.k}` with `k` not declared is MISSING_INPUT on `initial.k`."""
    problem = only(_orders.plan(stock_check={"inputs": {"sku": "${initial.skuu}"}}))
    assert (problem.code, problem.subject) == (Code.MISSING_INPUT, "initial.skuu")
    assert "did you mean `sku`" in problem.message


def test_missing_input_for_an_undeclared_key_in_the_exclusive_resource():
    """An exclusive resource's `${initial.k}` must be declared too."""
    problem = only(_orders.plan(reserve={"exclusive_resource": "order:${initial.order}"}))
    assert (problem.code, problem.subject) == (Code.MISSING_INPUT, "initial.order")


def test_optional_input_of_a_required_parameter_needs_a_fallback():
    """An optional input the tool requires is MISSING_INPUT unless it has a fallback."""
    problem = only(_orders.plan(confirm={"optional": ["customer_id"]}))
    assert (problem.code, problem.subject) == (Code.MISSING_INPUT, "confirm.customer_id")
    fine = _orders.plan(confirm={"optional": ["customer_id"], "fallback": {"customer_id": "c"}})
    assert fine.validate(TOOLS) == ()
    assert _orders.plan(confirm={"optional": ["currency"]}).validate(TOOLS) == ()


def test_missing_output():
    """A field the producer's TypedDict lacks is MISSING_OUTPUT on `producer.field`."""
    plan = _orders.plan(
        confirm={
            "inputs": {
                "order_id": "${initial.order_id}",
                "customer_id": "${customer_lookup.customer_id}",
                "currency": "${customer_lookup.account_statuz}",
            }
        }
    )
    problem = only(plan)
    assert (problem.code, problem.subject) == (
        Code.MISSING_OUTPUT,
        "customer_lookup.account_statuz",
    )
    assert "did you mean `account_status`" in problem.message


class Address(TypedDict):
    """A nested output type."""

    postcode: str
    lines: list[str]


class Profile(TypedDict):
    """An output with a nested TypedDict."""

    name: str
    address: Address


@agenttx.tool
def profile(email: str) -> Profile:
    """Read a profile."""
    return Profile(name=email, address=Address(postcode="N1", lines=[]))


@agenttx.tool
def anything_out(email: str) -> dict:  # type: ignore[type-arg]
    """An unannotated output: its fields are unknown."""
    return {"email": email}


@agenttx.tool
def label(text: str, count: int = 1) -> str:
    """Write a label."""
    return text * count


def _two(producer: str, reference: str, consumer: str = "label", param: str = "text") -> Plan:
    return Plan(
        nodes=[
            Node("p", tool=producer, inputs={"email": "e"}),
            Node("c", tool=consumer, inputs={param: reference}),
        ]
    )


NESTED = [profile, anything_out, label]


def test_nested_typed_dicts_give_nested_fields():
    """A nested TypedDict is walked: a missing nested field names its full path."""
    assert _two("profile", "${p.address.postcode}").validate(NESTED) == ()
    problem = only(_two("profile", "${p.address.postcod}"), NESTED)
    assert (problem.code, problem.subject) == (Code.MISSING_OUTPUT, "p.address.postcod")


def test_a_scalar_has_no_fields():
    """A path into a `str` field is MISSING_OUTPUT: the field is not there."""
    problem = only(_two("profile", "${p.name.first}"), NESTED)
    assert (problem.code, problem.subject) == (Code.MISSING_OUTPUT, "p.name.first")


def test_unknown_output_types_allow_any_field():
    """An unannotated or `dict` return is unknown: any field may be referenced."""
    assert _two("anything_out", "${p.whatever.deep}").validate(NESTED) == ()


def test_malformed_path_in_an_input():
    """A reference that breaks the grammar is MALFORMED_PATH on `node.param`."""
    problem = only(_orders.plan(stock_check={"inputs": {"sku": "${initial.sku"}}))
    assert (problem.code, problem.subject) == (Code.MALFORMED_PATH, "stock_check.sku")
    assert "no closing `}`" in problem.message


@pytest.mark.parametrize("text", ["${steps.1.id}", "${}", "${initial}", "${a..b}", "${9a.x}"])
def test_malformed_paths_of_every_kind(text):
    """Interactive references, empty ones and bad names are all malformed in a plan."""
    problem = only(Plan(nodes=[Node("c", tool="label", inputs={"text": text})]), NESTED)
    assert (problem.code, problem.subject) == (Code.MALFORMED_PATH, "c.text")


def test_a_list_item_is_named_by_its_index():
    """A list walked with a name is MALFORMED_PATH; with an index it is fine."""
    assert _two("profile", "${p.address.lines.0}").validate(NESTED) == ()
    problem = only(_two("profile", "${p.address.lines.first}"), NESTED)
    assert (problem.code, problem.subject) == (Code.MALFORMED_PATH, "p.address.lines.first")
    assert "must be an index" in problem.message


def test_exclusive_resource_takes_initial_references_only():
    """An exclusive resource naming a node's output is MALFORMED_PATH; syntax errors too."""
    problem = only(_orders.plan(reserve={"exclusive_resource": "w:${stock_check.warehouse_id}"}))
    assert (problem.code, problem.subject) == (Code.MALFORMED_PATH, "reserve.exclusive_resource")
    problem = only(_orders.plan(reserve={"exclusive_resource": "w:${initial.order_id"}))
    assert (problem.code, problem.subject) == (Code.MALFORMED_PATH, "reserve.exclusive_resource")


def test_type_mismatch_between_two_newtypes():
    """A WarehouseId never feeds a CustomerId: TYPE_MISMATCH on `node.param`."""
    plan = _orders.plan(
        reserve={
            "inputs": {
                "customer_id": "${stock_check.warehouse_id}",
                "warehouse_id": "w-1",
                "quantity": "${initial.quantity}",
            }
        }
    )
    problem = only(plan)
    assert (problem.code, problem.subject) == (Code.TYPE_MISMATCH, "reserve.customer_id")
    assert problem.message == (
        "input `customer_id` of node `reserve` takes a `CustomerId`, "
        "but ${stock_check.warehouse_id} is a `WarehouseId`."
    )


def test_type_mismatch_of_json_kinds():
    """An int field feeding a str parameter is a TYPE_MISMATCH."""
    plan = _orders.plan(stock_check={"inputs": {"sku": "${customer_lookup.customer_id}"}})
    assert plan.validate(TOOLS) == ()  # a CustomerId feeds a str: its base type
    plan = Plan(
        nodes=[
            Node("p", tool="profile", inputs={"email": "e"}),
            Node("c", tool="label", inputs={"text": "${p.name}", "count": "${p.address.lines}"}),
        ]
    )
    problem = only(plan, NESTED)
    assert (problem.code, problem.subject) == (Code.TYPE_MISMATCH, "c.count")
    assert "${p.address.lines} is a `list[str]`" in problem.message


def test_type_mismatch_of_literals_and_text():
    """Literals are checked by their JSON type, and text with references is a string."""
    problem = only(_orders.plan(reserve={"inputs": {**_reserve_inputs(), "quantity": "3"}}))
    assert (problem.code, problem.subject) == (Code.TYPE_MISMATCH, "reserve.quantity")
    assert "the literal '3' is a `str`" in problem.message
    plan = _orders.plan(reserve={"inputs": {**_reserve_inputs(), "quantity": "n-${initial.sku}"}})
    assert only(plan).code is Code.TYPE_MISMATCH
    assert (
        _orders.plan(reserve={"inputs": {**_reserve_inputs(), "quantity": 3}}).validate(TOOLS) == ()
    )


def _reserve_inputs() -> dict[str, Any]:
    return {
        "customer_id": "${customer_lookup.customer_id}",
        "warehouse_id": "${stock_check.warehouse_id}",
        "quantity": "${initial.quantity}",
    }


Sub = NewType("Sub", _orders.CustomerId)
Price = NewType("Price", float)


class Mixed(TypedDict):
    """Fields of several shapes for the compatibility table."""

    customer: _orders.CustomerId
    sub: Sub
    plain: str
    count: int
    maybe: Optional[str]  # noqa: UP045  (the typing spelling is what users write too)
    flag: bool
    ids: list[_orders.CustomerId]
    any_value: Any


@agenttx.tool
def mixed() -> Mixed:
    """Produce every shape."""
    raise NotImplementedError


NO_CUSTOMER = _orders.CustomerId("")
NO_SUB = Sub(NO_CUSTOMER)
NO_PRICE = Price(0.0)


@agenttx.tool
def consume(  # noqa: PLR0917
    customer: _orders.CustomerId = NO_CUSTOMER,
    sub: Sub = NO_SUB,
    text: str = "",
    price: Price = NO_PRICE,
    number: float = 0.0,
    count: int = 0,
    warehouses: list[_orders.WarehouseId] | None = None,
    customers: list[_orders.CustomerId] | None = None,
    either: int | str = 0,
) -> None:
    """Take every shape."""


@pytest.mark.parametrize(
    ("field", "param", "mismatch"),
    [
        ("customer", "customer", False),  # the same NewType
        ("sub", "customer", False),  # a narrower NewType feeds its base NewType
        ("customer", "sub", True),  # ... but not the other way
        ("customer", "text", False),  # a NewType feeds its base type
        ("plain", "customer", False),  # a plain value may feed a NewType of its base
        ("count", "number", False),  # an int feeds a float
        ("count", "price", False),  # ... and a NewType of float
        ("plain", "count", True),
        ("flag", "count", True),  # a boolean is not an integer
        ("maybe", "text", False),  # a union value: accepted when any member is
        ("plain", "either", False),  # a union parameter: any member accepts
        ("flag", "either", True),
        ("ids", "customers", False),
        ("ids", "warehouses", True),  # element types are semantic too
        ("any_value", "count", False),  # unknown: never a mismatch
    ],
)
def test_type_compatibility_table(field, param, mismatch):
    """The documented compatibility rules, one row each."""
    plan = Plan(
        nodes=[
            Node("m", tool="mixed"),
            Node("c", tool="consume", inputs={param: f"${{m.{field}}}"}),
        ]
    )
    codes = [problem.code for problem in plan.validate([mixed, consume])]
    assert codes == ([Code.TYPE_MISMATCH] if mismatch else [])


def test_unsupported_transformation():
    """Writing a list into a longer string is UNSUPPORTED_TRANSFORMATION on `node.param`."""
    plan = _two("profile", "lines: ${p.address.lines}")
    problem = only(plan, NESTED)
    assert (problem.code, problem.subject) == (Code.UNSUPPORTED_TRANSFORMATION, "c.text")
    assert "${p.address.lines}" in problem.message
    assert _two("profile", "to ${p.address.postcode}").validate(NESTED) == ()


def test_self_dependency_by_reference():
    """A node using its own output is SELF_DEPENDENCY, not a cycle."""
    problem = only(_orders.plan(stock_check={"inputs": {"sku": "${stock_check.sku}"}}))
    assert (problem.code, problem.subject) == (Code.SELF_DEPENDENCY, "stock_check")


def test_self_dependency_by_after():
    """A node listing itself in `after` is SELF_DEPENDENCY."""
    problem = only(_orders.plan(confirm={"after": ["reserve", "confirm"]}))
    assert (problem.code, problem.subject) == (Code.SELF_DEPENDENCY, "confirm")


def test_duplicate_edge_from_two_identical_mappings():
    """One reference mapped whole into two inputs of a node is DUPLICATE_EDGE."""

    @agenttx.tool
    def pair(first: str, second: str) -> None:
        """Take two strings."""

    plan = _two("profile", "${p.name}", consumer="pair", param="first")
    plan = Plan(
        nodes=[
            plan.nodes[0],
            Node("c", tool="pair", inputs={"first": "${p.name}", "second": "${p.name}"}),
        ]
    )
    problem = only(plan, [profile, pair])
    assert (problem.code, problem.subject) == (Code.DUPLICATE_EDGE, "c.second")
    assert "inputs `first` and `second`" in problem.message
    different = Plan(
        nodes=[
            plan.nodes[0],
            Node(
                "c", tool="pair", inputs={"first": "${p.name}", "second": "${p.address.postcode}"}
            ),
        ]
    )
    assert different.validate([profile, pair]) == ()


def test_duplicate_edge_in_after():
    """A node listed twice in `after` is DUPLICATE_EDGE on `node.after`."""
    problem = only(_orders.plan(confirm={"after": ["reserve", "reserve"]}))
    assert (problem.code, problem.subject) == (Code.DUPLICATE_EDGE, "confirm.after")


def test_cycle_path_of_two_nodes():
    """A two-node ring is one CYCLE whose subject is its path, in plan order."""
    plan = _orders.plan(
        customer_lookup={"inputs": {"email": "${initial.customer_email}"}, "after": ["reserve"]}
    )
    problem = only(plan)
    assert problem.code is Code.CYCLE
    assert problem.subject == "customer_lookup -> reserve -> customer_lookup"


def test_several_mappings_between_two_nodes_are_one_edge():
    """Two references from one producer make one edge: the ring is reported once."""

    @agenttx.tool
    def echo(a: str = "", b: str = "") -> dict[str, Any]:
        """Return the inputs."""
        return {"a": a, "b": b}

    plan = Plan(
        nodes=[
            Node("x", tool="echo", inputs={"a": "${y.a}", "b": "${y.b}"}),
            Node("y", tool="echo", inputs={"a": "${x.a}", "b": "${x.b}"}),
        ]
    )
    assert problems_of(plan, [echo]) == [("CYCLE", "x -> y -> x")]


def test_cycle_through_business_order():
    """`after` edges close rings like references do."""

    @agenttx.tool
    def step() -> None:
        """Do nothing."""

    plan = Plan(
        nodes=[
            Node("a", tool="step", after=["c"]),
            Node("b", tool="step", after=["a"]),
            Node("c", tool="step", after=["b"]),
            Node("d", tool="step", after=["c"]),
        ]
    )
    assert problems_of(plan, [step]) == [("CYCLE", "a -> b -> c -> a")]


def test_one_cycle_per_tangle_and_one_per_separate_tangle():
    """Rings that share nodes are one report; separate rings are one report each."""

    @agenttx.tool
    def step() -> None:
        """Do nothing."""

    plan = Plan(
        nodes=[
            Node("a", tool="step", after=["b", "c"]),
            Node("b", tool="step", after=["a"]),
            Node("c", tool="step", after=["a"]),
            Node("d", tool="step", after=["e"]),
            Node("e", tool="step", after=["d"]),
        ]
    )
    assert problems_of(plan, [step]) == [("CYCLE", "a -> b -> a"), ("CYCLE", "d -> e -> d")]


def test_schema_problems_come_before_cycles():
    """A plan with a ring and schema problems lists the schema problems first."""
    plan = _orders.plan(
        customer_lookup={"inputs": {"email": "${reserve.quantity}"}},
        confirm={"tool": "send_confirmations"},
    )
    assert problems_of(plan) == [
        ("TYPE_MISMATCH", "customer_lookup.email"),
        ("UNKNOWN_TOOL", "confirm"),
        ("CYCLE", "customer_lookup -> reserve -> customer_lookup"),
    ]


def test_every_problem_of_a_bad_plan_at_once_in_plan_order():
    """All problems come in one report, node by node, deterministic across calls."""
    plan = Plan(
        nodes=[
            Node("customer_lookup", tool="lookup_customer", inputs={"email": "${ghost.email}"}),
            Node("stock_check", tool="check_stok", inputs={"sku": "${initial.skuu}"}),
            Node("reserve", tool="reserve_stock", inputs={"customer_id": "${reserve.x}"}),
        ],
        initial=INITIAL,
    )
    expected = [
        ("UNKNOWN_NODE", "ghost"),
        ("UNKNOWN_TOOL", "stock_check"),
        ("MISSING_INPUT", "initial.skuu"),
        ("SELF_DEPENDENCY", "reserve"),
        ("MISSING_INPUT", "reserve.warehouse_id"),
        ("MISSING_INPUT", "reserve.quantity"),
    ]
    assert problems_of(plan) == expected
    assert plan.validate(TOOLS) == plan.validate(TOOLS)


def test_messages_are_one_sentence():
    """Every message is one sentence: it ends with a full stop and holds no line break."""
    plan = Plan(
        nodes=[
            Node("a", tool="lookup_customer", inputs={"email": "${b.x}", "x": "${a}"}),
            Node("b", tool="nothing", after=["a", "a", "zz"]),
            Node("b", tool="label", inputs={"text": "${initial.q}"}),
        ]
    )
    problems = plan.validate([*TOOLS, label])
    assert len(problems) >= 6
    for problem in problems:
        assert problem.message.endswith(".")
        assert "\n" not in problem.message
        assert str(problem).startswith(f"{problem.code.value} {problem.subject}: ")


# ---------------------------------------------------------------------- large and random plans


@agenttx.tool
def relay(value: str = "", **more: Any) -> dict[str, Any]:
    """Pass a value on."""
    return {"value": value, **more}


def test_a_long_chain_validates_without_recursion():
    """A 10,000-node chain (deeper than the recursion limit) validates, and its ring is found."""
    size = 10_000
    nodes = [Node("n0", tool="relay")]
    nodes += [
        Node(f"n{i}", tool="relay", inputs={"value": f"${{n{i - 1}.value}}"})
        for i in range(1, size)
    ]
    assert Plan(nodes=nodes).validate([relay]) == ()
    nodes[0] = Node("n0", tool="relay", inputs={"value": f"${{n{size - 1}.value}}"})
    (problem,) = Plan(nodes=nodes).validate([relay])
    assert problem.code is Code.CYCLE
    assert problem.subject.split(" -> ") == [f"n{i}" for i in range(size)] + ["n0"]


@st.composite
def dags(draw: st.DrawFn, *, max_nodes: int = 12) -> tuple[list[str], list[tuple[int, int]]]:
    """Node ids and edges (i, j) with i < j: producer i, consumer j (acyclic by construction)."""
    count = draw(st.integers(1, max_nodes))
    ids = [f"n{i}" for i in range(count)]
    # Shuffle plan order so that edges do not always point forward in it.
    order = draw(st.permutations(ids))
    pairs = [(i, j) for j in range(count) for i in range(j)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    return list(order), edges


def _build(order: list[str], edges: list[tuple[int, int]], kinds: list[bool]) -> Plan:
    """A plan over `relay`: edge k is a reference when kinds[k], else an `after` entry."""
    inputs: dict[str, dict[str, Any]] = {name: {} for name in order}
    after: dict[str, list[str]] = {name: [] for name in order}
    for k, (i, j) in enumerate(edges):
        producer, consumer = f"n{i}", f"n{j}"
        if kinds[k % len(kinds)]:
            inputs[consumer][f"from_{producer}"] = f"${{{producer}.value}}"
        else:
            after[consumer].append(producer)
    return Plan(
        nodes=[Node(name, tool="relay", inputs=inputs[name], after=after[name]) for name in order]
    )


@given(dags(), st.lists(st.booleans(), min_size=1, max_size=5))
def test_random_dags_validate_clean(dag, kinds):
    """Every random DAG, wired by references and `after`, has no problem."""
    order, edges = dag
    plan = _build(order, edges, kinds)
    assert plan.validate([relay]) == ()
    position = {name: index for index, name in enumerate(plan.topological_order())}
    for i, j in edges:
        assert position[f"n{i}"] < position[f"n{j}"]


@given(dags(), st.lists(st.booleans(), min_size=1, max_size=5), st.data())
def test_a_back_edge_gives_exactly_one_real_cycle(dag, kinds, data):
    """Adding one edge against a path of a DAG yields exactly one CYCLE, a real ring of it."""
    order, edges = dag
    successors: dict[int, set[int]] = {}
    for i, j in edges:
        successors.setdefault(i, set()).add(j)
    reach = [(i, j) for i in range(len(order)) for j in _reachable(i, successors) if j != i]
    if not reach:
        return
    start, end = data.draw(st.sampled_from(reach))  # a path start -> ... -> end exists
    back = (end, start)
    plan = _build(order, [*edges, back], kinds)
    problems = plan.validate([relay])
    assert [problem.code for problem in problems] == [Code.CYCLE]
    path = problems[0].subject.split(" -> ")
    assert path[0] == path[-1]
    assert len(set(path[:-1])) == len(path) - 1  # a simple ring
    graph = {(f"n{i}", f"n{j}") for i, j in [*edges, back]}
    steps = list(itertools.pairwise(path))
    assert all(step in graph for step in steps)
    assert (f"n{end}", f"n{start}") in steps  # every ring of DAG + edge uses the edge
    with pytest.raises(PlanValidationError) as caught:
        plan.topological_order()
    assert caught.value.problems == problems


@given(plans())
def test_random_plans_from_the_testing_strategy_validate_clean(plan):
    """`agenttx.testing.plans()` draws acyclic plans that validate clean and order fully."""
    assert plan.validate([relay]) == ()
    assert sorted(plan.topological_order()) == sorted(plan.node_ids)


@given(plans(cycle=True, max_nodes=8))
def test_random_plans_with_a_cycle_report_one_real_ring(plan):
    """`plans(cycle=True)` draws plans with one ring; validation reports exactly that ring."""
    (problem,) = plan.validate([relay])
    assert problem.code is Code.CYCLE
    path = problem.subject.split(" -> ")
    assert path[0] == path[-1]
    assert len(path) >= 3
    for producer, consumer in itertools.pairwise(path):
        assert producer in plan.prerequisites(consumer)


def test_the_plans_strategy_refuses_impossible_sizes():
    """Sizes that cannot make a plan (or a ring) are refused up front."""
    with pytest.raises(agenttx.InvalidArgument, match="min_nodes"):
        plans(min_nodes=3, max_nodes=2)
    with pytest.raises(agenttx.InvalidArgument, match="at least 2 with cycle=True"):
        plans(max_nodes=1, cycle=True)
    with pytest.raises(agenttx.InvalidArgument, match="integers"):
        plans(max_nodes="3")  # type: ignore[arg-type]


def _reachable(start: int, successors: dict[int, set[int]]) -> set[int]:
    seen = {start}
    stack = [start]
    while stack:
        for nxt in successors.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


# ---------------------------------------------------------------------- more shapes of types


class Colour(enum.Enum):
    """An enum: its JSON kind is not inferred."""

    RED = "red"


class Small(TypedDict):
    """A TypedDict parameter type."""

    name: str


class Wide(TypedDict, total=False):
    """A TypedDict with an optional key."""

    name: str
    extra: int


class Other(TypedDict):
    """A TypedDict without `name`."""

    title: str


class Shapes(TypedDict):
    """Every shape a path or a type comparison can meet."""

    other: Other
    small: Small
    wide: Wide
    nameless: dict[str, int]
    ids: dict[str, _orders.CustomerId]
    pair: tuple[str, int]
    many: tuple[int, ...]
    maybe_small: Optional[Small]  # noqa: UP045
    either: Small | Wide
    kind: Literal["a", "b"]
    colour: Colour
    tagged: Annotated[_orders.CustomerId, "a tag"]
    nothing: None
    thing: Colour | None


@agenttx.tool
def shapes() -> Shapes:
    """Produce every shape."""
    raise NotImplementedError


@agenttx.tool
def take(  # noqa: PLR0917
    small: Small | None = None,
    text: str = "",
    count: int = 0,
    warehouses: dict[str, _orders.WarehouseId] | None = None,
    colour: Colour = Colour.RED,
    warehouse: _orders.WarehouseId | None = None,
) -> None:
    """Take some shapes."""


@pytest.mark.parametrize(
    ("reference", "param", "expected"),
    [
        ("${s.small}", "small", []),
        ("${s.wide}", "small", []),  # `name` is declared, if not required: not a contradiction
        ("${s.other}", "small", [("TYPE_MISMATCH", "c.small")]),  # no `name` at all
        ("${s.small.name}", "text", []),
        ("${s.nameless.anything}", "count", []),  # dict[str, int]: any key, int values
        ("${s.nameless.anything}", "text", [("TYPE_MISMATCH", "c.text")]),
        ("${s.ids}", "warehouses", [("TYPE_MISMATCH", "c.warehouses")]),
        ("${s.pair.1}", "count", []),
        ("${s.pair.0}", "count", [("TYPE_MISMATCH", "c.count")]),
        ("${s.pair.2}", "count", [("MISSING_OUTPUT", "s.pair.2")]),
        (
            "${s.pair.99999999999999999999}",
            "count",
            [("MISSING_OUTPUT", "s.pair.99999999999999999999")],
        ),
        ("${s.many.7}", "count", []),
        ("${s.many.x}", "count", [("MALFORMED_PATH", "s.many.x")]),
        ("${s.maybe_small.name}", "text", []),  # Optional[X] is walked as X
        ("${s.maybe_small.nope}", "text", [("MISSING_OUTPUT", "s.maybe_small.nope")]),
        ("${s.either.anything}", "text", []),  # a union of two shapes: unknown
        ("${s.kind}", "text", []),
        ("${s.kind}", "count", [("TYPE_MISMATCH", "c.count")]),
        ("${s.colour}", "colour", []),
        ("${s.colour}", "count", []),  # an enum's values are not inferred: unknown
        ("${s.tagged}", "warehouse", [("TYPE_MISMATCH", "c.warehouse")]),
        ("${s.nothing}", "text", [("TYPE_MISMATCH", "c.text")]),
        ("${s.thing}", "text", []),
        ("${s.small.name.more}", "text", [("MISSING_OUTPUT", "s.small.name.more")]),
    ],
)
def test_paths_and_types_of_every_shape(reference, param, expected):
    """Walking paths into TypedDicts, dicts, tuples, unions and literals, and comparing them."""
    plan = Plan(nodes=[Node("s", tool="shapes"), Node("c", tool="take", inputs={param: reference})])
    assert problems_of(plan, [shapes, take]) == expected


def test_a_null_literal_is_named_in_the_message():
    """A `None` literal for a `str` parameter reads naturally in the message."""
    problem = only(Plan(nodes=[Node("c", tool="take", inputs={"text": None})]), [take])
    assert (
        problem.message == "input `text` of node `c` takes a `str`, but the literal None is None."
    )


Deep = NewType("Deep", str)
for _level in range(10):
    Deep = NewType(f"Deep{_level}", Deep)  # type: ignore[misc]


@agenttx.tool
def deep_out() -> dict[str, Deep]:  # type: ignore[valid-type]
    """Return a value of a NewType ten layers deep."""
    raise NotImplementedError


def test_very_deep_newtypes_are_unknown_not_an_error():
    """Types nested past the comparison depth are unknown: no problem, no recursion error."""
    plan = Plan(
        nodes=[Node("s", tool="deep_out"), Node("c", tool="take", inputs={"count": "${s.x}"})]
    )
    assert plan.validate([deep_out, take]) == ()


def test_missing_output_messages_name_where_the_field_is_missing():
    """Top-level fields name the producer and its tool; nested ones name the parent path."""
    top = only(_orders.plan(stock_check={"inputs": {"sku": "${customer_lookup.emial}"}}))
    assert top.message == (
        "node `stock_check` uses ${customer_lookup.emial}, but the output of `customer_lookup` "
        "(tool `lookup_customer`) has no field `emial`."
    )
    nested = only(_two("profile", "${p.address.postcod}"), NESTED)
    assert nested.message == (
        "node `c` uses ${p.address.postcod}, but `p.address` has no field `postcod` "
        "(did you mean `postcode`?)."
    )


def test_a_name_repeated_in_after_is_reported_once():
    """However often `after` repeats a node, that is one DUPLICATE_EDGE."""
    problem = only(_orders.plan(confirm={"after": ["reserve"] * 1000}))
    assert problem.message == "node `confirm` lists `reserve` in after 1000 times; list it once."
