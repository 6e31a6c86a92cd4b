"""Cycles of a plan: one `CYCLE` problem per ring of nodes that wait for each other.

Cycles are found by depth-first search with unvisited/visiting/visited states over value and
`after` edges (producer to consumer; several references between two nodes are one edge),
nodes in plan order and neighbours in sorted order, so reports are deterministic. One cycle is
reported per strongly connected group of nodes: the first the search meets, as a path
`a -> b -> a`. Nothing is inferred or removed to break a cycle.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from ._problems import PlanProblem, PlanProblemCode

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._problems import PlanShape

__all__ = ["find_cycles"]


def find_cycles(plan: PlanShape) -> tuple[PlanProblem, ...]:
    """One `CYCLE` problem per strongly connected group of nodes, in plan order."""
    if _acyclic(plan):
        return ()  # the commonest plan: no search for groups, no sorted neighbours
    successors = _successors(plan)
    component = _components(plan, successors)
    problems: list[PlanProblem] = []
    reported: set[int] = set()
    sizes = collections.Counter(component.values())
    for start in successors:
        group = component[start]
        if group in reported or sizes[group] < 2:
            continue
        reported.add(group)
        path = _first_cycle(start, successors, component)
        text = " -> ".join(path)
        problems.append(
            PlanProblem(
                code=PlanProblemCode.CYCLE,
                subject=text,
                message=f"nodes {text} wait for each other, so none of them can start; "
                "remove one of these references or after entries.",
            )
        )
    return tuple(problems)


def _acyclic(plan: PlanShape) -> bool:
    """Whether the value and `after` edges between existing nodes (self edges left out) form
    no cycle: Kahn's count-down, in time linear in the plan's size."""
    dependants = plan._dependants  # noqa: SLF001  (one unit: the plans package)
    known = plan._by_id  # noqa: SLF001
    counts: dict[str, int] = {}
    queue: list[str] = []
    for node_id, needed in plan._prerequisites.items():  # noqa: SLF001
        count = 0
        for other in needed:
            if other in known and other != node_id:  # others are no edge
                count += 1
        counts[node_id] = count
        if not count:
            queue.append(node_id)
    seen = 0
    while queue:
        seen += 1
        for dependant in dependants[queue.pop()]:
            left = counts[dependant] - 1
            counts[dependant] = left
            if not left:
                queue.append(dependant)
    return seen == len(counts)


def _successors(plan: PlanShape) -> dict[str, list[str]]:
    """Producer -> sorted distinct consumers, over existing nodes, self edges left out."""
    ids = list(dict.fromkeys(plan.node_ids))
    known = set(ids)
    successors: dict[str, set[str]] = {node_id: set() for node_id in ids}
    for node_id in ids:
        for other in plan.prerequisites(node_id):
            if other in known and other != node_id:
                successors[other].add(node_id)
    return {node_id: sorted(successors[node_id]) for node_id in ids}


def _components(plan: PlanShape, successors: Mapping[str, list[str]]) -> dict[str, int]:
    """Tarjan's strongly connected components, iteratively: node -> component number."""
    del plan
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    component: dict[str, int] = {}
    counter = 0
    groups = 0
    for root in successors:
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node_id, child = work[-1]
            children = successors[node_id]
            if child < len(children):
                work[-1] = (node_id, child + 1)
                nxt = children[child]
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node_id] = min(low[node_id], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node_id])
            if low[node_id] == index[node_id]:
                number = groups
                groups += 1
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = number
                    if member == node_id:
                        break
    return component


def _first_cycle(
    start: str, successors: Mapping[str, list[str]], component: Mapping[str, int]
) -> list[str]:
    """The first back edge a depth-first search from `start` meets, as a closed path.

    The search stays inside `start`'s component, where every search meets a back edge.
    """
    group = component[start]
    state: dict[str, int] = {start: 1}  # absent: unvisited, 1: visiting, 2: visited
    path = [start]
    work: list[tuple[str, int]] = [(start, 0)]
    while work:
        node_id, child = work[-1]
        children = successors[node_id]
        if child < len(children):
            work[-1] = (node_id, child + 1)
            nxt = children[child]
            if component[nxt] != group:
                continue
            seen = state.get(nxt)
            if seen == 1:
                return [*path[path.index(nxt) :], nxt]
            if seen is None:
                state[nxt] = 1
                path.append(nxt)
                work.append((nxt, 0))
            continue
        # In a strongly connected group every node leads back to `start`, which stays on the
        # path, so the search meets a back edge before it finishes any node.
        state[node_id] = 2  # pragma: no cover - see above
        path.pop()  # pragma: no cover
        work.pop()  # pragma: no cover
    msg = f"no cycle through `{start}`"  # pragma: no cover - see above
    raise AssertionError(msg)  # pragma: no cover
