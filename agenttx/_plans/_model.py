"""A plan: nodes (tool calls) wired by `${...}` references, and what can be read from it alone.

A `Node` names a tool, maps each of the tool's parameters to an `${initial.key}` reference, a
`${node_id.path}` reference or a literal, and may add business order (`after`), an exclusive
resource (mutual exclusion, never an edge), resource claims, retries, a timeout and a
compensation. A `Plan` is the nodes and the names of the initial inputs.

Three kinds of relation are kept apart: value dependencies come from references only, business
order from `after` only, and exclusive resources order nothing (nodes holding one merely never
run at the same time). A node receives exactly the inputs it maps: no other output is passed on.

Construction checks each field on its own and raises `InvalidArgument` naming the node and the
field. Everything that needs the whole plan or the tools (unknown nodes and tools, duplicate ids,
references, types, cycles) is reported by `Plan.validate`, all problems at once. Nothing here
does I/O or calls a tool.

`Node` and the resolution of its inputs are in `_node`; the checks of a whole plan are in
`_validate` and `_cycles`, which read a plan through `_problems.PlanShape`, so that this module
calls them and they never import it.
"""

from __future__ import annotations

import hashlib
import json
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, cast, final

import attrs

from .._errors import InvalidArgument, PlanValidationError
from .._json import JSONValue, canonical_dumps, check_json
from .._limits import (
    MAX_NODE_INPUT_BYTES,
    MAX_NODE_RETRIES,
    MAX_NODE_TIMEOUT,
    MAX_PAYLOAD_BYTES,
    MAX_PLAN_NODES,
    over_limit,
)
from .._refs import is_path_segment
from ._cycles import find_cycles
from ._node import (
    MAX_NODE_ID,
    InputRef,
    Node,
    UnresolvedInput,
    _as_tuple,
    resolve_inputs,
    resolve_resource,
)
from ._schema import plan_schema, specs_of
from ._validate import validate_plan

if TYPE_CHECKING:
    from .._tools import ToolsArgument
    from ._problems import PlanProblem
    from ._schema import HasToolSpecs

# `Node`, `UnresolvedInput` and the two resolvers live in `_node`; the run's modules that
# import them from here (with the plan) still may.
__all__ = ["Node", "Plan", "UnresolvedInput", "resolve_inputs", "resolve_resource"]

#: Bumped when the canonical form changes, so every version changes with it.
_FORMAT: Final = 1


# ---------------------------------------------------------------------- plans


@final
@attrs.frozen(kw_only=True, unsafe_hash=False)
class Plan:
    """A DAG of tool calls (`nodes`, in a meaningful order) and the names of its initial inputs.

    `initial` declares the keys `${initial.key}` may name; values come with each run. Node order
    is the tie-break wherever the plan is read in order (validation reports, cycle search,
    scheduling among equally ready nodes). Construction checks the fields' types and raises
    `InvalidArgument`; `validate(tools)` reports every other problem at once. A plan is
    immutable, so `version` and the dependency tables are computed once, on construction, in
    time linear in the plan's size, and one plan may be shared by threads and runs.
    """

    nodes: tuple[Node, ...] = attrs.field(converter=_as_tuple)
    initial: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    _by_id: Mapping[str, Node] = attrs.field(init=False, factory=dict, eq=False, repr=False)
    _prerequisites: Mapping[str, frozenset[str]] = attrs.field(
        init=False, factory=dict, eq=False, repr=False
    )
    _dependants: Mapping[str, frozenset[str]] = attrs.field(
        init=False, factory=dict, eq=False, repr=False
    )
    _version: str = attrs.field(init=False, default="", eq=False, repr=False)
    # The last `validate` answer and the tools it was for (see `_validate.validate_plan`).
    _validated: tuple[tuple[tuple[str, object], ...], tuple[PlanProblem, ...]] | None = attrs.field(
        init=False, default=None, eq=False, repr=False
    )

    def __attrs_post_init__(self) -> None:
        set_ = object.__setattr__
        nodes: object = self.nodes
        if not isinstance(nodes, tuple):
            raise InvalidArgument(f"plan nodes must be a list of Node, got {nodes!r:.80}")
        for position, node in enumerate(nodes):
            if not isinstance(node, Node):
                raise InvalidArgument(f"plan nodes[{position}] must be a Node, got {node!r:.80}")
        if not nodes:
            raise InvalidArgument("a plan needs at least one node")
        set_(self, "nodes", nodes)
        initial: object = self.initial
        if not isinstance(initial, tuple):
            raise InvalidArgument(f"plan initial must be a list of key names, got {initial!r:.80}")
        for key in initial:
            if not isinstance(key, str) or len(key) > MAX_NODE_ID or not is_path_segment(key):
                raise InvalidArgument(
                    f"plan initial key {key!r:.80} must be 1-{MAX_NODE_ID} letters, digits, "
                    "`_` or `-`"
                )
        if len(set(initial)) != len(initial):
            twice = sorted({key for key in initial if initial.count(key) > 1})
            raise InvalidArgument(f"plan initial lists {', '.join(twice)} more than once")
        set_(self, "initial", initial)
        by_id: dict[str, Node] = {}
        for node in nodes:
            by_id.setdefault(node.id, node)
        prerequisites: dict[str, frozenset[str]] = {}
        dependants: dict[str, set[str]] = {node_id: set() for node_id in by_id}
        for node_id, node in by_id.items():
            needed = frozenset(
                {ref.namespace for ref in node.input_refs if ref.namespace != "initial"}
            ) | frozenset(node.after)
            prerequisites[node_id] = needed
            for other in needed:
                if other in dependants:
                    dependants[other].add(node_id)
        set_(self, "_by_id", types.MappingProxyType(by_id))
        set_(self, "_prerequisites", types.MappingProxyType(prerequisites))
        set_(
            self,
            "_dependants",
            types.MappingProxyType({key: frozenset(value) for key, value in dependants.items()}),
        )
        digest = hashlib.sha256(canonical_dumps(self.to_json()).encode()).hexdigest()
        set_(self, "_version", digest)

    def __hash__(self) -> int:
        return hash(self._version)

    @property
    def version(self) -> str:
        """The SHA-256 (hex) of the canonical JSON form: equal plans have equal versions.

        Stable across processes and Python versions; independent of the order of mapping keys,
        `after`, `optional` and `initial`; changed by anything that can change a run, node order
        (the scheduler's tie-break) included.
        """
        return self._version

    @property
    def node_ids(self) -> tuple[str, ...]:
        """The node ids in plan order (a duplicated id appears as often as it is used)."""
        return tuple(node.id for node in self.nodes)

    def node(self, node_id: str) -> Node:
        """The node with this id (the first one, if the id is duplicated).

        Raises `InvalidArgument` if the plan has no such node.
        """
        try:
            return self._by_id[node_id]
        except (KeyError, TypeError):
            raise InvalidArgument(f"the plan has no node {node_id!r:.80}") from None

    def prerequisites(self, node_id: str) -> frozenset[str]:
        """The distinct nodes that must succeed before `node_id` runs: values it references
        and nodes listed in its `after`. Exclusive resources add none.

        Raises `InvalidArgument` if the plan has no such node.
        """
        try:
            return self._prerequisites[node_id]
        except (KeyError, TypeError):
            self.node(node_id)  # raises, naming it
            raise  # pragma: no cover  (every node has its entry)

    def dependants(self, node_id: str) -> frozenset[str]:
        """The nodes that list `node_id` among their prerequisites.

        Raises `InvalidArgument` if the plan has no such node.
        """
        try:
            return self._dependants[node_id]
        except (KeyError, TypeError):
            self.node(node_id)  # raises, naming it
            raise  # pragma: no cover  (every node has its entry)

    def input_refs(self, node_id: str) -> tuple[InputRef, ...]:
        """Every well-formed reference in the inputs of `node_id` (see `InputRef`)."""
        return self.node(node_id).input_refs

    def topological_order(self) -> tuple[str, ...]:
        """Every node id once, each after its prerequisites; ties broken by plan order.

        For a plan whose references name existing nodes (`validate` reports those that do
        not, which are ignored here). Raises `PlanValidationError` with the `CYCLE` problems
        when the nodes form a cycle.
        """
        order = _kahn(self)
        if len(order) < len(self._by_id):
            raise PlanValidationError(find_cycles(self))
        return order

    def validate(self, tools: ToolsArgument) -> tuple[PlanProblem, ...]:
        """Every problem of this plan against `tools` (what `Transaction(tools=...)` accepts).

        Empty when the plan is valid. Schema problems come first, node by node in plan order,
        then cycles; see `docs/plans.md#validation` for each code. Pure: no tool is called.
        Raises `InvalidArgument` only if `tools` itself is invalid. The plan keeps its last
        answer with the tools it was for (the same tool objects under the same names give it
        again, without a second validation; any other tools are validated afresh).
        """
        return validate_plan(self, tools)

    def check(self, tools: ToolsArgument) -> None:
        """Raise `PlanValidationError` carrying every problem, unless `validate(tools)` is empty."""
        problems = self.validate(tools)
        if problems:
            raise PlanValidationError(problems)

    def check_initial(self, values: object) -> dict[str, JSONValue]:
        """The initial values of a run, checked against `initial`: a checked JSON copy.

        Raises `InvalidArgument` when `values` is not a mapping, lacks a declared key or has
        one `initial` does not declare (naming them), and `JSONValueError` when a value is not
        JSON.
        """
        if not isinstance(values, Mapping):
            raise InvalidArgument(f"initial values must be a mapping, got {values!r:.80}")
        declared = set(self.initial)
        unknown = sorted(str(key) for key in values if key not in declared)
        if unknown:
            raise InvalidArgument(
                f"initial values have key(s) the plan does not declare: {', '.join(unknown)}"
            )
        missing = [key for key in self.initial if key not in values]
        if missing:
            raise InvalidArgument(f"initial values lack declared key(s): {', '.join(missing)}")
        return cast("dict[str, JSONValue]", check_json(dict(values), what="initial values"))

    def to_json(self) -> dict[str, JSONValue]:
        """The plan's canonical JSON form; `Plan.from_json` reads it back."""
        return {
            "format": _FORMAT,
            "initial": list[JSONValue](sorted(self.initial)),
            "nodes": [node.to_json() for node in self.nodes],
        }

    @staticmethod
    def json_schema(tools: ToolsArgument | HasToolSpecs) -> dict[str, JSONValue]:
        """The JSON Schema (draft 2020-12) of a plan from JSON for `tools`.

        `tools` is what `Transaction(tools=...)` takes, or a `Transaction` or an `Engine`. The
        schema describes what `from_json` reads, with the tools' names as an enum and each
        tool's parameter schema for the `inputs` of a node that calls it, where any value may
        also be a `${...}` reference. It never refuses a plan that `from_json` and `validate`
        accept; `validate` finds what a schema cannot say (see `docs/plans.md`). A new object
        each call. Raises `InvalidArgument` for what is not tools.
        """
        return plan_schema(specs_of(tools, "Plan.json_schema()"))

    @classmethod
    def from_json(cls, data: object) -> Plan:
        """A plan from its JSON form (as `to_json` writes it, or as an agent proposes one).

        `data` is the JSON value, or its text (`str` or UTF-8 `bytes`) of at most
        `MAX_PAYLOAD_BYTES`. Node fields left out take their defaults; `format` may be omitted.
        Raises `InvalidArgument` (or `JSONValueError`) naming what is wrong (malformed or
        oversized text included), and for a plan past the limits a model's plan is held to
        (`docs/plans.md#plan-limits`): more than `MAX_PLAN_NODES` nodes, or a node whose
        `retries`, `timeout` or `inputs` pass `MAX_NODE_RETRIES`, `MAX_NODE_TIMEOUT` or
        `MAX_NODE_INPUT_BYTES` (naming the node, the field and the limit).
        """
        if isinstance(data, (str, bytes, bytearray)):
            data = _parse(data)
        value = check_json(data, what="plan")
        if not isinstance(value, dict):
            raise InvalidArgument("a plan in JSON must be an object with `nodes` and `initial`")
        unknown = sorted(set(value) - {"format", "initial", "nodes"})
        if unknown:
            raise InvalidArgument(f"a plan in JSON has unknown field(s) {', '.join(unknown)}")
        if value.get("format", _FORMAT) != _FORMAT:
            raise InvalidArgument(f"plan format {value['format']!r} is not supported")
        nodes = value.get("nodes")
        if not isinstance(nodes, list):
            raise InvalidArgument("a plan in JSON needs `nodes`, a list of objects")
        if len(nodes) > MAX_PLAN_NODES:
            raise InvalidArgument(
                f"a plan in JSON may have at most {MAX_PLAN_NODES} nodes (MAX_PLAN_NODES), "
                f"got {len(nodes)}"
            )
        initial = value.get("initial", [])
        if not isinstance(initial, list):
            raise InvalidArgument("plan `initial` must be a list of key names")
        return cls(nodes=tuple(_node_from_json(item) for item in nodes), initial=tuple(initial))


def _parse(text: str | bytes | bytearray) -> object:
    """The JSON value of a plan's text; `InvalidArgument` saying why there is none."""
    if len(text) > MAX_PAYLOAD_BYTES or (isinstance(text, str) and over_limit(text)):
        raise InvalidArgument(
            f"a plan in JSON text may be at most {MAX_PAYLOAD_BYTES} bytes (MAX_PAYLOAD_BYTES)"
        )
    try:
        return json.loads(text)
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"a plan in JSON text is not UTF-8: {exc.reason}") from None
    except (ValueError, RecursionError) as exc:
        problem = str(exc) if isinstance(exc, ValueError) else "it is nested too deeply"
        raise InvalidArgument(f"a plan in JSON text is malformed: {problem}") from None


_NODE_FIELDS: Final = frozenset(field.name for field in attrs.fields(Node) if field.init)


def _node_from_json(item: JSONValue) -> Node:
    if not isinstance(item, dict):
        raise InvalidArgument(f"each plan node in JSON must be an object, got {item!r:.80}")
    unknown = sorted(set(item) - _NODE_FIELDS)
    if unknown:
        raise InvalidArgument(
            f"plan node {item.get('id')!r:.80} has unknown field(s) {', '.join(unknown)}"
        )
    if "id" not in item or "tool" not in item:
        raise InvalidArgument(f"plan node {item.get('id')!r:.80} needs `id` and `tool`")
    fields = dict(item)
    node_id = fields.pop("id")
    _check_bounds(node_id, fields)
    return Node(node_id, **fields)  # type: ignore[arg-type]


def _check_bounds(node_id: JSONValue, fields: Mapping[str, JSONValue]) -> None:
    """Refuse a node's `retries`, `timeout` or `inputs` past the limits of a plan from JSON
    (values of the wrong type are left for `Node` to refuse by name)."""
    retries = fields.get("retries")
    if isinstance(retries, int) and not isinstance(retries, bool) and retries > MAX_NODE_RETRIES:
        raise InvalidArgument(
            f"node `{node_id!s:.128}`: retries must be at most {MAX_NODE_RETRIES} "
            f"(MAX_NODE_RETRIES) in a plan from JSON, got {retries!r:.80}"
        )
    timeout = fields.get("timeout")
    if (
        isinstance(timeout, (int, float))
        and not isinstance(timeout, bool)
        and timeout > MAX_NODE_TIMEOUT
    ):
        raise InvalidArgument(
            f"node `{node_id!s:.128}`: timeout must be at most {MAX_NODE_TIMEOUT:g} seconds "
            f"(MAX_NODE_TIMEOUT) in a plan from JSON, got {timeout!r:.80}"
        )
    inputs = fields.get("inputs")
    if inputs is not None:
        size = len(canonical_dumps(inputs).encode("utf-8", "surrogatepass"))
        if size > MAX_NODE_INPUT_BYTES:
            raise InvalidArgument(
                f"node `{node_id!s:.128}`: inputs must be at most {MAX_NODE_INPUT_BYTES} bytes "
                f"of JSON (MAX_NODE_INPUT_BYTES) in a plan from JSON, got {size}"
            )


def _kahn(plan: Plan) -> tuple[str, ...]:
    """Kahn's algorithm over existing nodes, ready nodes taken in plan order."""
    import heapq  # noqa: PLC0415

    position = {node_id: index for index, node_id in enumerate(plan._by_id)}  # noqa: SLF001
    count = {
        node_id: sum(1 for other in needed if other in position and other != node_id)
        for node_id, needed in plan._prerequisites.items()  # noqa: SLF001
    }
    selfish = {node_id for node_id, needed in plan._prerequisites.items() if node_id in needed}  # noqa: SLF001
    ready = [
        position[node_id] for node_id, left in count.items() if left == 0 and node_id not in selfish
    ]
    heapq.heapify(ready)
    ids = list(position)
    order: list[str] = []
    while ready:
        node_id = ids[heapq.heappop(ready)]
        order.append(node_id)
        for dependant in plan._dependants[node_id]:  # noqa: SLF001
            if dependant == node_id:
                continue
            count[dependant] -= 1
            if count[dependant] == 0 and dependant not in selfish:
                heapq.heappush(ready, position[dependant])
    return tuple(order)
