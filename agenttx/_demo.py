"""The demo behind `python -m agenttx demo`: the seed example, step by step.

An agent creates a user (step 2), looks up the owner by a reference to that user (step 5), reads
a cart by the owner's id written out literally (step 7), and inserts an order that references the
owner (step 9). The insert fails on `user_id`; the dependency graph traces the bad value back
through the rename `id -> user -> owner_id -> user_id` to the step that produced it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._graph import DependencyGraph, EdgeKind
from ._json import JSONValue, canonical_dumps
from ._refs import resolve_references

if TYPE_CHECKING:
    from collections.abc import Callable

# (step, tool, arguments as the agent sent them, output the tool returned)
SEED_STEPS: tuple[tuple[int, str, JSONValue, JSONValue], ...] = (
    (2, "create_user", {"name": "Ada"}, {"id": "u-7"}),
    (5, "lookup_owner", {"user": "${steps.2.id}"}, {"owner_id": "u-7"}),
    (7, "get_cart", {"owner_id": "u-7"}, {"cart_id": "c-3", "items": 2}),
    (9, "insert_order", {"user_id": "${steps.5.owner_id}", "cart": "${steps.7.cart_id}"}, None),
)
FAILED_STEP = 9
FAILED_KEY = "user_id"


def run(out: Callable[[str], object] = print) -> DependencyGraph:
    """Print the seed example step by step and return its dependency graph."""
    graph = DependencyGraph()
    outputs: dict[int, JSONValue] = {}
    out("agenttx demo: ${steps.N.path} references and the dependency graph\n")
    for step_id, tool, arguments, output in SEED_STEPS:
        resolution = resolve_references(arguments, outputs, current_step=step_id)
        graph.add_step(step_id, tool, resolution.value, resolution.dependencies)
        out(f"step {step_id}  {tool}({canonical_dumps(arguments)})")
        if resolution.value != arguments:
            out(f"        resolved to {canonical_dumps(resolution.value)}")
        if step_id == FAILED_STEP:
            out(f"        FAILED: the database rejects `{FAILED_KEY}` (foreign key violation)")
            continue
        graph.record_output(step_id, output)
        outputs[step_id] = output
        out(f"        -> {canonical_dumps(output)}")

    out("\ndependency graph (explicit edges from references, implicit ones from equal values):")
    for edge in graph.edges():
        kind = "explicit" if edge.kind is EdgeKind.EXPLICIT else "implicit"
        out(
            f"  step {edge.source} -> step {edge.target}  {edge.source_key} -> {edge.target_key}"
            f"  ({kind})"
        )

    root = graph.find_root_cause(FAILED_STEP, FAILED_KEY)
    out(
        f"\nroot cause of step {FAILED_STEP}'s bad `{FAILED_KEY}`: "
        f"step {root} ({graph.tool_of(root) if root is not None else 'none'})"
    )
    out(f"the agent would resume at step {root}, with the hint added to its constraints")
    out("\nMermaid:\n" + graph.to_mermaid())
    return graph
