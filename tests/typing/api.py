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
