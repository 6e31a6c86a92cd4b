"""Static checks of the public types: mypy checks this file (`mypy` with the project config).

Nothing here runs; each `assert_type` fails type checking if a public signature regresses.
"""

from __future__ import annotations

from typing_extensions import assert_type

import agenttx

outputs: dict[int, agenttx.JSONValue] = {1: {"id": 7}}
resolution = agenttx.resolve_references({"user": "${steps.1.id}"}, outputs, current_step=2)
assert_type(resolution, agenttx.Resolution)
assert_type(resolution.value, agenttx.JSONValue)
assert_type(resolution.error, "str | None")
assert_type(resolution.dependencies, "tuple[agenttx.Dependency, ...]")

graph = agenttx.DependencyGraph()
assert_type(graph.add_step(1, "t", {}), "tuple[agenttx.Edge, ...]")
assert_type(graph.find_root_cause(2, "user"), "int | None")
assert_type(graph.dependents_of(1), "tuple[int, ...]")
assert_type(graph.node(1), "agenttx.StepNode | None")
assert_type(graph.to_mermaid(), str)
edge = graph.edges()[0]
assert_type(edge.kind, agenttx.EdgeKind)

error = agenttx.StepOutOfOrder(expected=1, got=3)
assert_type(error.expected, int)
assert_type(agenttx.WriteConflict.code, str)


# Decorated tools keep their signatures (ParamSpec), bare and called, sync and async.
@agenttx.tool
def add(x: int, y: int = 1) -> int:
    return x + y


@agenttx.tool(name="math.scale", compensate="math.unscale")
async def scale(x: float) -> float:
    return 2 * x


@agenttx.compensation(name="math.unscale")
def unscale(payload: dict[str, object]) -> None:
    return None


assert_type(add(1), int)
assert_type(add(1, y=2), int)
assert_type(add.name, str)
add("one")  # type: ignore[arg-type]  # the real parameter type is seen (unused-ignore fails)
add(1, z=2)  # type: ignore[call-arg]
assert_type(unscale({"a": 1}), None)


async def use_scale() -> float:
    return await scale(1.5)


tx = agenttx.Transaction(tools=[add, scale, unscale])
assert_type(tx.execute_step(1, "add", {"x": 1}), agenttx.StepResult)
assert_type(tx.commit(), agenttx.CommitResult)
assert_type(tx.rollback(), agenttx.RollbackResult)
assert_type(tx.status, agenttx.TxStatus)


# A mixed tools list, unannotated (mypy infers `list[object]`), is accepted as it is.
def plain(x: int) -> int:
    return x


mixed = [add, unscale, plain]
agenttx.Transaction(tools=mixed)
agenttx.Engine(tools=mixed)
agenttx.Transaction(tools={"add": add, "plain": plain})
named = {"add": add, "unscale": unscale, "plain": plain}
agenttx.Engine(tools=named)

# Specs: one per tool, in registration order, on tools, transactions and engines.
assert_type(add.spec, agenttx.ToolSpec)
assert_type(add.wire_name, str)
assert_type(add.spec.parameters, "dict[str, agenttx.JSONValue]")  # a copy of its own
assert_type(tx.tool_specs, "tuple[agenttx.ToolSpec, ...]")
assert_type(agenttx.Engine(tools=mixed).tool_specs, "tuple[agenttx.ToolSpec, ...]")


@agenttx.tool(description="Search.", parameters={"type": "object", "properties": {}})
def search(**arguments: object) -> object:
    return arguments


# Calls that number themselves: results, and an unannotated mixed turn.
assert_type(tx.call("add", {"x": 1}, call_id="c1"), agenttx.StepResult)
turn = [("add", {"x": 1}), ("add", '{"x": 2}', "c2"), agenttx.TurnCall("add", {"x": 3})]
assert_type(tx.call_turn(turn), "tuple[agenttx.StepResult, ...]")


async def use_acall() -> None:
    assert_type(await tx.acall("add", {"x": 1}), agenttx.StepResult)
    assert_type(await tx.acall_turn(turn), "tuple[agenttx.StepResult, ...]")


assert_type(agenttx.prompt(tx), str)
assert_type(agenttx.PROMPT, str)
