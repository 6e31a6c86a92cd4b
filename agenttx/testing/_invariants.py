"""Invariant checks that users can run against their own graphs and transactions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._graph import DependencyGraph, EdgeKind

if TYPE_CHECKING:
    from .._graph import Leaf
    from .._json import JSONValue

__all__ = ["check_graph_invariants"]


def check_graph_invariants(graph: DependencyGraph) -> None:
    """Raise `AssertionError`, naming the offence, if `graph` breaks an invariant.

    * every edge goes from an earlier step to a later one, and both ends are in the graph;
    * no implicit edge feeds an input key that an explicit dependency of that step covers;
    * implicit edges are unique per (source, source key, target, target key);
    * the graph equals one built fresh from its own steps: so after `truncate_from(t)`, what is
      left is exactly what the retained steps alone would have built. Like a transaction, the
      fresh build records each step's output before adding the next step.
    """
    steps = set(graph.steps())
    implicit_seen: set[tuple[int, str, int, str]] = set()
    for edge in graph.edges():
        if edge.source not in steps or edge.target not in steps:
            raise AssertionError(f"edge {edge} has an end that is not a step of the graph")
        if edge.source >= edge.target:
            raise AssertionError(f"edge {edge} does not go from an earlier to a later step")
        if edge.kind is EdgeKind.IMPLICIT:
            node = graph.node(edge.target)
            assert node is not None  # checked above
            if any(dep.target_key == edge.target_key for dep in node.explicit):
                raise AssertionError(f"implicit edge {edge} duplicates an explicit dependency")
            label = (edge.source, edge.source_key, edge.target, edge.target_key)
            if label in implicit_seen:
                raise AssertionError(f"implicit edge {edge} is recorded twice")
            implicit_seen.add(label)

    fresh = DependencyGraph()
    for node in graph.nodes():
        fresh.add_step(node.step_id, node.tool_name, _from_leaves(node.input_leaves), node.explicit)
        if node.output_leaves:
            fresh.record_output(node.step_id, _from_leaves(node.output_leaves))
    if fresh.edges() != graph.edges():
        missing = set(fresh.edges()) - set(graph.edges())
        extra = set(graph.edges()) - set(fresh.edges())
        raise AssertionError(
            "the graph differs from one rebuilt from its steps: "
            f"missing {sorted(map(str, missing))}, extra {sorted(map(str, extra))}"
        )


def _from_leaves(leaves: tuple[Leaf, ...]) -> JSONValue:
    """A JSON value whose scalar leaves are exactly `leaves`, in order."""
    return [{key: value} for key, value in leaves]  # a leaf's key survives only in an object
