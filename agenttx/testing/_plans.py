"""Hypothesis strategies for random plans: acyclic ones, and ones with one injected cycle."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hypothesis import strategies as st

from .._errors import InvalidArgument
from .._plans import Node, Plan

if TYPE_CHECKING:
    from .._json import JSONValue

__all__ = ["plans"]


def plans(
    tool: str = "relay",
    *,
    min_nodes: int = 1,
    max_nodes: int = 12,
    field: str = "value",
    cycle: bool = False,
) -> st.SearchStrategy[Plan]:
    """Random plans whose nodes all call `tool`, wired by references and `after` entries.

    Node ids are `n0`, `n1`, ... in a random plan order. Each edge from a producer to a consumer
    is either an input `from_<producer>` of the consumer mapped to `${<producer>.<field>}`, or
    the producer listed in the consumer's `after`, so `tool` must take any keyword argument
    (`**kwargs`) and return an object with `field` to run. Without `cycle` every plan is
    acyclic and validates clean against such a tool; with `cycle=True` one edge is added
    against an existing path, so the plan has exactly one group of nodes in a ring (and at
    least two nodes). Shrinks towards fewer nodes and edges.
    """
    if not isinstance(min_nodes, int) or not isinstance(max_nodes, int):
        raise InvalidArgument("min_nodes and max_nodes must be integers")
    low = max(min_nodes, 2 if cycle else 1)
    if not 1 <= low <= max_nodes:
        raise InvalidArgument(
            f"need 1 <= min_nodes <= max_nodes (at least 2 with cycle=True), got "
            f"{min_nodes} and {max_nodes}"
        )
    return _plans(tool, low, max_nodes, field, cycle)


@st.composite
def _plans(  # noqa: PLR0917  (the strategy's settings, passed on once)
    draw: st.DrawFn, tool: str, low: int, high: int, field: str, cycle: bool
) -> Plan:
    count = draw(st.integers(low, high))
    # Edges (i, j) with i < j make a DAG in index order; the plan order is shuffled.
    pairs = [(i, j) for j in range(count) for i in range(j)]
    edges: list[tuple[int, int]] = (
        draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    )
    if cycle:
        if not edges:
            edges = [draw(st.sampled_from(pairs))]
        start, end = _path(draw(st.sampled_from(edges)), edges, draw)
        edges.append((end, start))
    kinds = draw(st.lists(st.booleans(), min_size=len(edges), max_size=len(edges)))
    order = draw(st.permutations(range(count)))
    inputs: dict[int, dict[str, JSONValue]] = {index: {} for index in range(count)}
    after: dict[int, list[str]] = {index: [] for index in range(count)}
    for (producer, consumer), by_value in zip(edges, kinds, strict=True):
        if by_value:
            inputs[consumer][f"from_n{producer}"] = f"${{n{producer}.{field}}}"
        else:
            after[consumer].append(f"n{producer}")
    return Plan(
        nodes=[
            Node(f"n{index}", tool=tool, inputs=inputs[index], after=after[index])
            for index in order
        ]
    )


def _path(edge: tuple[int, int], edges: list[tuple[int, int]], draw: st.DrawFn) -> tuple[int, int]:
    """The ends of a path that starts with `edge` and follows further edges, as drawn."""
    start, end = edge
    while True:
        onward = [j for i, j in edges if i == end]
        if not onward or not draw(st.booleans()):
            return start, end
        end = draw(st.sampled_from(onward))
