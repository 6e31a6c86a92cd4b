"""The dependency graph of a transaction's steps: who consumed whose output.

This is the only module that imports rustworkx; no rustworkx type or node index leaves it.

Nodes are steps. An edge `P -> C` says step C consumed something step P produced. Explicit
edges come from `${steps.N.path}` references (`docs/protocol.md#explicit-edges`); implicit edges
are inferred from equal values (`docs/protocol.md#implicit-edges`): an input leaf links to the
most recent earlier step that output the same linkable value under a linking key.
`find_root_cause` walks the edges backwards from a failed step's bad input to the earliest step
that produced it.

How the rules are carried out:

* Implicit producers are found through an index from (lower-cased output key, typed value) to
  producers, never by scanning earlier steps, so adding a step costs the same at step 10 as at
  step 10,000.
* Values are compared with strict JSON equality, as serde_json does: `7`, `7.0`, `"7"` and
  `True` are four different values (`0.0` and `-0.0` are equal).
* Adding step N first removes every step >= N, so steps are always held in ascending order,
  even if step N itself was absent (a transaction's step ids are always contiguous, so this
  only matters for a graph driven directly).
"""

from __future__ import annotations

import bisect
import enum
import functools
import json
from typing import TYPE_CHECKING, Final, NamedTuple, TypeAlias, final

import attrs

from ._errors import InvalidArgument
from ._json import JSONScalar, JSONValue, ValueTag, check_json, scalar_leaves, value_tag
from ._refs import Dependency
from ._render import DrawnEdge, DrawnNode, render_graph

if TYPE_CHECKING:
    from collections.abc import Iterable

    import rustworkx as rx

__all__ = [
    "DependencyGraph",
    "Edge",
    "EdgeKind",
    "StepNode",
]

Leaf: TypeAlias = tuple[str, JSONScalar]
# (producer step, position of the leaf in the producer's output, the output key as written)
_Producer: TypeAlias = tuple[int, int, str]

_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@functools.lru_cache(maxsize=4096)  # keys repeat across steps; the walk lowers them often
def _lower(key: str) -> str:
    """ASCII-only lower-casing: keys compare ignoring ASCII case only (`İD` is not `id`)."""
    return key.lower() if key.isascii() else key.translate(_ASCII_LOWER)


def _linkable(value: JSONScalar) -> bool:
    """Non-empty strings and numbers link; booleans, null and "" never do."""
    if isinstance(value, str):
        return value != ""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: The shortest string, and the smallest number in absolute value, that `copied_from` takes as
#: copied from an earlier output: shorter strings and smaller numbers (a count, a flag, "no")
#: are too often equal by chance.
MIN_COPIED_CHARS: Final = 3
MIN_COPIED_NUMBER: Final = 1000


def _distinctive(value: JSONScalar) -> bool:
    """Whether `value` is distinctive enough to say it was copied (`copied_from`)."""
    if isinstance(value, str):
        return len(value) >= MIN_COPIED_CHARS
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) >= MIN_COPIED_NUMBER


class EdgeKind(enum.Enum):
    """How an edge was found."""

    EXPLICIT = "explicit"  # from a `${steps.N.path}` reference
    IMPLICIT = "implicit"  # inferred from an equal value under a linking key


@final
@attrs.frozen(kw_only=True)
class Edge:
    """Step `target` consumed, as its input `target_key`, the output `source_key` of `source`."""

    source: int
    target: int
    source_key: str
    target_key: str
    kind: EdgeKind


@final
@attrs.frozen(kw_only=True)
class StepNode:
    """A step as the graph knows it: its scalar leaves and the explicit dependencies it was given.

    `input_leaves` and `output_leaves` are `(leaf key, scalar)` pairs in leaf order (see
    `DependencyGraph.add_step`); `output_leaves` is empty until `record_output`. `explicit` holds
    the dependencies passed to `add_step`, including those it dropped.
    """

    step_id: int
    tool_name: str
    input_leaves: tuple[Leaf, ...]
    output_leaves: tuple[Leaf, ...]
    explicit: tuple[Dependency, ...]


class _Node:
    """One step's data. Plain and slotted: a transaction creates one per step."""

    __slots__ = (
        "carried",
        "entries",
        "explicit",
        "index",
        "input_leaves",
        "inputs_by_value",
        "output_leaves",
        "step_id",
        "tool_name",
    )

    def __init__(
        self,
        index: int,
        step_id: int,
        *,
        tool_name: str,
        input_leaves: tuple[Leaf, ...],
        explicit: tuple[Dependency, ...],
        inputs_by_value: dict[ValueTag, set[str]],
    ) -> None:
        self.index = index  # the rustworkx node index
        self.step_id = step_id
        self.tool_name = tool_name
        self.input_leaves = input_leaves
        self.explicit = explicit
        # Typed value -> lower-cased keys of the linkable inputs that carry it.
        self.inputs_by_value = inputs_by_value
        self.output_leaves: tuple[Leaf, ...] = ()
        # Lower-cased output key -> the lower-cased keys a root-cause walk arriving under it
        # follows: the key itself plus the inputs the step passed through to it (only where
        # there are such inputs). Built by record_output so the walk does no per-leaf work.
        self.carried: dict[str, set[str]] = {}
        # The value-index entries of the output, to remove them again.
        self.entries: tuple[tuple[str, ValueTag], ...] = ()

    def public(self) -> StepNode:
        return StepNode(
            step_id=self.step_id,
            tool_name=self.tool_name,
            input_leaves=self.input_leaves,
            output_leaves=self.output_leaves,
            explicit=self.explicit,
        )


class _Link(NamedTuple):
    """The rustworkx edge payload: the public edge and its keys lower-cased once."""

    edge: Edge
    source_key: str
    target_key: str


def _new_digraph() -> rx.PyDiGraph[int, _Link]:
    """An empty graph; rustworkx loads with the first one, not at `import agenttx`."""
    import rustworkx  # noqa: PLC0415

    return rustworkx.PyDiGraph(multigraph=True)


@attrs.define(eq=False, repr=False)
class DependencyGraph:
    """The step dependency graph of one transaction.

    Not thread-safe: a transaction serializes its calls. Every method either completes or, when
    it raises `InvalidArgument` (or `JSONValueError`), leaves the graph exactly as it was.
    Compared by identity and hashable: two graphs with the same steps are still two graphs.
    `repr` shows only the counts, never the inputs or outputs (they may hold secrets).
    """

    _graph: rx.PyDiGraph[int, _Link] = attrs.field(init=False, factory=_new_digraph)
    # Ascending step order is an invariant (see the module docstring), so the last entry is
    # always the highest step and truncation pops from the end.
    _nodes: dict[int, _Node] = attrs.field(init=False, factory=dict)
    # (lower-cased output key, typed value) -> producers in ascending step order, one entry per
    # producer: the first leaf (in leaf order) with that key and value.
    _index: dict[tuple[str, ValueTag], list[_Producer]] = attrs.field(init=False, factory=dict)

    def __repr__(self) -> str:
        return f"<DependencyGraph steps={len(self._nodes)} edges={self._graph.num_edges()}>"

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, step_id: object) -> bool:
        return step_id in self._nodes

    def steps(self) -> tuple[int, ...]:
        """The step ids in the graph, ascending."""
        return tuple(self._nodes)

    def node(self, step_id: int) -> StepNode | None:
        """The node of `step_id`, or None if the graph has no such step."""
        node = self._nodes.get(step_id)
        return None if node is None else node.public()

    def nodes(self) -> tuple[StepNode, ...]:
        """Every node, in ascending step order."""
        return tuple(node.public() for node in self._nodes.values())

    def tool_of(self, step_id: int) -> str | None:
        """The tool name of `step_id`, or None if the graph has no such step."""
        node = self._nodes.get(step_id)
        return None if node is None else node.tool_name

    # ------------------------------------------------------------------ building

    def add_step(
        self,
        step_id: int,
        tool_name: str,
        inputs: JSONValue,
        explicit: Iterable[Dependency] = (),
        *,
        validate: bool = True,
    ) -> tuple[Edge, ...]:
        """Add step `step_id` and return its incoming edges: explicit ones first, then implicit.

        Any step >= `step_id` already present is removed first. An explicit dependency becomes an
        edge only if its `from_step` is in the graph and below `step_id`; others are dropped (but
        still keep their `target_key` from implicit linking). Each scalar input leaf that is not
        the target of an explicit dependency and is linkable (a number or non-empty string) links
        to the most recent earlier step with an equal output leaf whose key matches: equal
        ignoring ASCII case, or the input key ends with `_` + the output key (`user_id` links to
        `id`, not the reverse). Implicit edges are unique per (source, source key, input key).
        `validate=False` skips the checks of the arguments, for callers that have made them.
        """
        dependencies = tuple(explicit)
        if validate:
            _check_step_id(step_id)
            if not isinstance(tool_name, str):
                raise InvalidArgument(f"tool name must be a string, got {tool_name!r}")
            for dependency in dependencies:
                if not isinstance(dependency, Dependency):
                    raise InvalidArgument(
                        f"explicit dependencies of step {step_id} must be Dependency objects, "
                        f"got {dependency!r}"
                    )
            inputs = check_json(inputs, what=f"inputs of step {step_id}")
        leaves = tuple(scalar_leaves(inputs))

        self.truncate_from(step_id)
        index = self._graph.add_node(step_id)
        inputs_by_value: dict[ValueTag, set[str]] = {}
        self._nodes[step_id] = _Node(
            index,
            step_id,
            tool_name=tool_name,
            input_leaves=leaves,
            explicit=dependencies,
            inputs_by_value=inputs_by_value,
        )
        edges = [
            Edge(
                source=dep.from_step,
                target=step_id,
                source_key=dep.source_key,
                target_key=dep.target_key,
                kind=EdgeKind.EXPLICIT,
            )
            for dep in dependencies
            if dep.from_step < step_id and dep.from_step in self._nodes
        ]
        covered = {dep.target_key for dep in dependencies}
        seen: set[tuple[int, str, str]] = set()
        for in_key, value in leaves:
            if not _linkable(value):
                continue
            tag = value_tag(value)
            inputs_by_value.setdefault(tag, set()).add(_lower(in_key))
            if in_key in covered:
                continue
            producer = self._producer(in_key, tag)
            if producer is None:
                continue
            source, _, source_key = producer
            if (source, source_key, in_key) not in seen:
                seen.add((source, source_key, in_key))
                edges.append(
                    Edge(
                        source=source,
                        target=step_id,
                        source_key=source_key,
                        target_key=in_key,
                        kind=EdgeKind.IMPLICIT,
                    )
                )
        self._graph.add_edges_from(
            [
                (
                    self._nodes[edge.source].index,
                    index,
                    _Link(edge, _lower(edge.source_key), _lower(edge.target_key)),
                )
                for edge in edges
            ]
        )
        return tuple(edges)

    def _producer(self, in_key: str, tag: ValueTag) -> _Producer | None:
        """The most recent producer of `tag` under a key that `in_key` links to."""
        lowered = _lower(in_key)
        if not lowered:
            return None
        # Output keys `in_key` links to: itself, and every tail after an underscore.
        candidates = [lowered]
        candidates.extend(lowered[i + 1 :] for i, c in enumerate(lowered[:-1]) if c == "_")
        best: _Producer | None = None
        for candidate in candidates:
            producers = self._index.get((candidate, tag))
            if not producers:
                continue
            # Steps are ascending and adding `step_id` removed every step >= it, so the last
            # producer is the most recent one below `step_id`.
            found = producers[-1]
            if best is None or found[0] > best[0] or (found[0] == best[0] and found[1] < best[1]):
                best = found
        return best

    def record_output(self, step_id: int, output: JSONValue, *, validate: bool = True) -> None:
        """Record the output of a step that succeeded, replacing any output recorded before.

        `validate=False` skips the JSON check of `output`, for callers that have made it.
        """
        node = self._nodes.get(step_id)
        if node is None:
            raise InvalidArgument(f"cannot record the output of step {step_id}: not in the graph")
        if validate:
            output = check_json(output, what=f"output of step {step_id}")
        leaves = tuple(scalar_leaves(output))
        self._unindex(node)
        node.output_leaves = leaves
        entries: dict[tuple[str, ValueTag], tuple[int, str]] = {}
        carried: dict[str, set[str]] = {}
        for position, (out_key, value) in enumerate(leaves):
            if not _linkable(value):
                continue
            lowered = _lower(out_key)
            tag = value_tag(value)
            passed = node.inputs_by_value.get(tag)
            if passed:
                carried.setdefault(lowered, {lowered}).update(passed)
            if lowered:
                entries.setdefault((lowered, tag), (position, out_key))
        node.carried = carried
        node.entries = tuple(entries)
        for entry_key, (position, out_key) in entries.items():
            producers = self._index.setdefault(entry_key, [])
            entry = (step_id, position, out_key)
            if not producers or producers[-1][0] < step_id:
                producers.append(entry)
            else:
                bisect.insort(producers, entry)

    def _unindex(self, node: _Node) -> None:
        step_id = node.step_id
        for entry_key in node.entries:
            producers = self._index[entry_key]
            if producers[-1][0] == step_id:
                producers.pop()  # the common case: the newest producer goes first
            else:
                producers[:] = [p for p in producers if p[0] != step_id]
            if not producers:
                del self._index[entry_key]
        node.entries = ()

    def truncate_from(self, step_id: int) -> None:
        """Remove `step_id` and every later step, with their edges.

        Costs O(removed steps and their leaves and edges), whatever the graph's size: rustworkx
        keeps the indices of the remaining nodes stable, so nothing needs rebuilding.
        """
        removed: list[int] = []
        while self._nodes:
            last = next(reversed(self._nodes))
            if last < step_id:
                break
            node = self._nodes.pop(last)
            self._unindex(node)
            removed.append(node.index)
        if removed:
            self._graph.remove_nodes_from(removed)

    def clear(self) -> None:
        """Remove every step."""
        self._graph = _new_digraph()
        self._nodes.clear()
        self._index.clear()

    # ------------------------------------------------------------------ queries

    def edges(self) -> tuple[Edge, ...]:
        """Every edge, sorted by (target, source, kind, source key, target key)."""
        return tuple(sorted((link.edge for link in self._graph.edges()), key=_edge_order))

    def dependencies_of(self, step_id: int) -> tuple[Edge, ...]:
        """The incoming edges of `step_id`, sorted by (source, target key); () if unknown."""
        node = self._nodes.get(step_id)
        if node is None:
            return ()
        incoming = [link.edge for _, _, link in self._graph.in_edges(node.index)]
        return tuple(
            sorted(incoming, key=lambda e: (e.source, e.target_key, e.kind.value, e.source_key))
        )

    def dependents_of(self, step_id: int) -> tuple[int, ...]:
        """The steps that consumed an output of `step_id`, ascending, each once."""
        node = self._nodes.get(step_id)
        if node is None:
            return ()
        return tuple(sorted({link.edge.target for _, _, link in self._graph.out_edges(node.index)}))

    def find_root_cause(self, step_id: int, key: str) -> int | None:
        """The earliest step that produced the value `step_id` received as its input `key`.

        Walks incoming edges whose target key matches `key` (ignoring ASCII case) back to their
        producers, following renames (`id` consumed as `user`) and pass-throughs (a producer
        whose output under the key equals one of its own linkable inputs is followed through
        that input too). Returns the minimum step reached, or None when `step_id` is unknown or
        no edge carries `key`.
        """
        start = self._nodes.get(step_id)
        if start is None:
            return None
        stack: list[tuple[_Node, str]] = [(start, _lower(key))]
        visited: set[tuple[int, str]] = set()
        root: int | None = None
        while stack:
            node, lowered = stack.pop()
            carried = node.carried.get(lowered) or (lowered,)
            for _, _, link in self._graph.in_edges(node.index):
                if link.target_key not in carried:
                    continue
                source = link.edge.source
                if (source, link.source_key) in visited:
                    continue
                visited.add((source, link.source_key))
                root = source if root is None or source < root else root
                stack.append((self._nodes[source], link.source_key))
        return root

    def is_literal(self, step_id: int, key: str) -> bool:
        """Whether step `step_id` wrote its input `key` itself: it has an input leaf under `key`
        (ignoring ASCII case), no explicit dependency of the step targets `key` (a dropped one
        counts), no edge carries it (`find_root_cause` is None), and no earlier step output its
        value under any key (`copied_from` is None). False for an unknown step.
        """
        node = self._nodes.get(step_id)
        if node is None:
            return False
        lowered = _lower(key)
        if not any(_lower(leaf_key) == lowered for leaf_key, _ in node.input_leaves):
            return False
        if any(_lower(dependency.target_key) == lowered for dependency in node.explicit):
            return False
        return self.find_root_cause(step_id, key) is None and self.copied_from(step_id, key) is None

    def copied_from(self, step_id: int, key: str) -> int | None:
        """The most recent earlier step whose output holds, under any key, a value step
        `step_id` received as its input `key` (ignoring ASCII case): the value was copied from
        that output, as written, into another key. Only distinctive values count
        (`_distinctive`: strings of at least 3 characters, numbers of at least 1000 in absolute
        value), compared with strict JSON equality. None when there is none, or for an unknown
        step. Scans the earlier outputs: for the failure path only.
        """
        node = self._nodes.get(step_id)
        if node is None:
            return None
        lowered = _lower(key)
        wanted = {
            value_tag(value)
            for leaf_key, value in node.input_leaves
            if _lower(leaf_key) == lowered and _distinctive(value)
        }
        if not wanted:
            return None
        for earlier in reversed(self._nodes.values()):
            if earlier.step_id >= step_id:
                continue
            if any(
                _distinctive(value) and value_tag(value) in wanted
                for _, value in earlier.output_leaves
            ):
                return earlier.step_id
        return None

    # ------------------------------------------------------------------ export

    def to_dot(self) -> str:
        """The graph in Graphviz DOT; implicit edges are dashed. Deterministic."""
        return render_graph(*self._drawing(), "dot")

    def to_mermaid(self) -> str:
        """The graph as a Mermaid flowchart; implicit edges are dotted. Deterministic."""
        return render_graph(*self._drawing(), "mermaid")

    def to_json(self) -> str:
        """The graph as indented JSON with sorted keys: `{"nodes": [...], "edges": [...]}`."""
        document = {
            "nodes": [{"step": node.step_id, "tool": node.tool_name} for node in self.nodes()],
            "edges": [
                {
                    "source": edge.source,
                    "target": edge.target,
                    "source_key": edge.source_key,
                    "target_key": edge.target_key,
                    "kind": edge.kind.value,
                }
                for edge in self.edges()
            ],
        }
        return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def _drawing(self) -> tuple[list[DrawnNode], list[DrawnEdge]]:
        nodes = [
            DrawnNode(f"s{node.step_id}", f"{node.step_id}: {node.tool_name}")
            for node in self.nodes()
        ]
        edges = [
            DrawnEdge(
                f"s{edge.source}",
                f"s{edge.target}",
                _edge_label(edge),
                dashed=edge.kind is EdgeKind.IMPLICIT,
            )
            for edge in self.edges()
        ]
        return nodes, edges


def _check_step_id(step_id: object) -> None:
    if not isinstance(step_id, int) or isinstance(step_id, bool) or step_id < 1:
        raise InvalidArgument(f"step id must be an integer >= 1, got {step_id!r}")


def _edge_order(edge: Edge) -> tuple[int, int, str, str, str]:
    return (edge.target, edge.source, edge.kind.value, edge.source_key, edge.target_key)


def _edge_label(edge: Edge) -> str:
    if edge.source_key == edge.target_key:
        return edge.source_key
    return f"{edge.source_key} -> {edge.target_key}"
