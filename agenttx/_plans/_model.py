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
"""

from __future__ import annotations

import enum
import hashlib
import math
import types
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, cast, final

import attrs

from .._errors import InvalidArgument, PlanValidationError, ReferenceSyntaxError
from .._json import JSONValue, canonical_dumps, check_json
from .._refs import (
    PlanValue,
    Reference,
    compile_plan_value,
    is_path_segment,
    is_plan_namespace,
    parse_template,
    resolve_plan_reference,
    resolve_plan_value,
)
from .._tools import Compensation, Tool

if TYPE_CHECKING:
    from .._tools import ToolsArgument

__all__ = [
    "MAX_NODE_ID",
    "InputRef",
    "Node",
    "Plan",
    "PlanProblem",
    "PlanProblemCode",
    "UnresolvedInput",
    "resolve_inputs",
    "resolve_resource",
]

#: The longest node id, initial key or resource name accepted.
MAX_NODE_ID: Final = 128
#: Namespaces of the reference grammar that no node may take as its id.
_RESERVED: Final = frozenset({"initial", "steps"})
#: Bumped when the canonical form changes, so every version changes with it.
_FORMAT: Final = 1


class PlanProblemCode(str, enum.Enum):
    """What is wrong with a plan (`PlanProblem.code`); each value is its name."""

    UNKNOWN_NODE = "UNKNOWN_NODE"
    """A reference, or `after`, names a node the plan does not have."""
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    """A node calls a tool (or names a compensation) that is not registered."""
    UNKNOWN_INPUT = "UNKNOWN_INPUT"
    """A node maps an input its tool does not take."""
    DUPLICATE_NODE = "DUPLICATE_NODE"
    """Two nodes share an id."""
    MISSING_INPUT = "MISSING_INPUT"
    """A required parameter is unmapped, or `${initial.key}` names an undeclared key."""
    MISSING_OUTPUT = "MISSING_OUTPUT"
    """A reference names a field the producer's return type lacks."""
    MALFORMED_PATH = "MALFORMED_PATH"
    """A reference does not follow the grammar, or its path does not fit the producer's type."""
    TYPE_MISMATCH = "TYPE_MISMATCH"
    """An input's type, from annotations, contradicts the parameter's."""
    UNSUPPORTED_TRANSFORMATION = "UNSUPPORTED_TRANSFORMATION"
    """An input asks for a conversion plans do not make, such as a list written into text."""
    SELF_DEPENDENCY = "SELF_DEPENDENCY"
    """A node references its own output, or lists itself in `after`."""
    DUPLICATE_EDGE = "DUPLICATE_EDGE"
    """One node maps the identical reference twice, or lists a node twice in `after`."""
    CYCLE = "CYCLE"
    """The nodes depend on each other in a ring; the subject is the ring's path."""

    def __str__(self) -> str:
        return self.value


@final
@attrs.frozen(kw_only=True)
class PlanProblem:
    """One problem `Plan.validate` found.

    `subject` names the offender: a node id (`stock_check`), a node's input or field
    (`reserve.customer_id`, `customer_lookup.account_status`), an initial key (`initial.sku`) or,
    for a `CYCLE`, its path (`customer_lookup -> reserve -> customer_lookup`). `message` is one
    sentence saying what is wrong and what to do.
    """

    code: PlanProblemCode
    subject: str
    message: str

    def __str__(self) -> str:
        return f"{self.code.value} {self.subject}: {self.message}"


@final
@attrs.frozen(kw_only=True)
class InputRef:
    """One reference in a node's inputs: the input (`param`) holding it, and what it names.

    `namespace` is `initial` or a node id; `path` the fields after it. `whole` is True when the
    input is exactly this one reference at its top level (the value passes with its own type);
    False when it sits inside a longer string (it is written into text) or inside a list or
    object.
    """

    param: str
    namespace: str
    path: tuple[str, ...]
    text: str
    whole: bool
    interpolated: bool


class UnresolvedInput(Exception):
    """A node's input could not be resolved at run time; `message` says why, `param` where."""

    def __init__(self, *, param: str, message: str) -> None:
        self.param = param
        self.message = message
        super().__init__(message)


# ---------------------------------------------------------------------- nodes


def _fail(node: object, field: str, problem: str) -> InvalidArgument:
    return InvalidArgument(f"node `{node}`: {field} {problem}")


def _check_name(node: str, field: str, value: object) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NODE_ID:
        raise _fail(
            node, field, f"must be a string of 1-{MAX_NODE_ID} characters, got {value!r:.80}"
        )
    return value


def _names(node: str, field: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, tuple):
        raise _fail(node, field, f"must be a list of names, not {value!r:.80}")
    return tuple(_check_name(node, f"{field} entry", item) for item in value)


def _mapping(node: str, field: str, value: object) -> dict[str, Any]:
    if type(value) is dict and not value:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(node, field, f"must be a mapping, got {value!r:.80}")
    for key in value:
        _check_name(node, f"{field} key", key)
    return dict(value)


def _as_tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    """A list as a tuple; anything else is left for `__attrs_post_init__` to refuse by name."""
    if type(value) is tuple:
        return value
    if type(value) is list:
        return tuple(value)
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        return value  # type: ignore[return-value]
    return tuple(value)


def _as_name(value: str | Tool[Any, Any]) -> str:
    """A tool's name; anything else is left for `__attrs_post_init__` to check."""
    return value.name if isinstance(value, Tool) else value


def _mapping_repr(value: Mapping[str, Any]) -> str:
    return repr(dict(value))


#: The read-only empty mapping every node without `resources` or `fallback` shares (a plan of
#: thousands of nodes then holds no two of them for the garbage collector to walk).
_NOTHING: Final[Mapping[str, Any]] = types.MappingProxyType({})


@final
@attrs.frozen(unsafe_hash=False)
class Node:
    """One tool call of a plan.

    `id` is the name other nodes reference it by: letters, digits, `_` and `-`, starting with a
    letter or `_`, at most 128 characters, and neither `initial` nor `steps`. `tool` is a
    registered tool's name (a `Tool` is taken by its name). `inputs` maps each parameter to a
    reference (`"${initial.sku}"`, `"${stock_check.warehouse_id}"`), a literal JSON value, or a
    string with references inside it (`"order-${initial.order_id}"`); `$${` writes a literal
    `${`. `after` lists nodes that must succeed first though no value flows (business order).
    `exclusive_resource` names a resource held while the node runs (it may use
    `${initial.key}`), `resources` claims units of shared capacities (`{"payments_api": 1}`).
    `retries` bounds retries of transient failures, `timeout` (seconds) each attempt;
    `compensate` is a registered compensation (or its name) that undoes the node's effect.
    `optional` lists inputs the node can run without when their producer did not succeed, and
    `fallback` gives a value to use instead.

    Each field is checked here and `InvalidArgument` names the node and the field; references
    and names of other nodes and tools are checked by `Plan.validate`. Mappings are copied and
    read-only. Nodes are equal when every field is; they hash by id and tool.
    """

    id: str
    tool: str = attrs.field(kw_only=True, converter=_as_name)
    inputs: Mapping[str, JSONValue] = attrs.field(kw_only=True, factory=dict, repr=_mapping_repr)
    after: tuple[str, ...] = attrs.field(kw_only=True, default=(), converter=_as_tuple)
    exclusive_resource: str | None = attrs.field(kw_only=True, default=None)
    resources: Mapping[str, int] = attrs.field(kw_only=True, factory=dict, repr=_mapping_repr)
    retries: int = attrs.field(kw_only=True, default=0)
    timeout: float | None = attrs.field(kw_only=True, default=None)
    compensate: str | Compensation[Any, Any] | None = attrs.field(kw_only=True, default=None)
    optional: tuple[str, ...] = attrs.field(kw_only=True, default=(), converter=_as_tuple)
    fallback: Mapping[str, JSONValue] = attrs.field(kw_only=True, factory=dict, repr=_mapping_repr)
    _refs: tuple[InputRef, ...] = attrs.field(init=False, default=(), eq=False, repr=False)
    _malformed: tuple[tuple[str, str], ...] = attrs.field(
        init=False, default=(), eq=False, repr=False
    )
    _compiled: dict[str, PlanValue] | None = attrs.field(
        init=False, default=None, eq=False, repr=False
    )
    # `resolve_inputs`' plan for the node, found on first use: see `_direct_inputs`.
    _direct: tuple[tuple[str, bool, Any, tuple[str, ...]], ...] | bool | None = attrs.field(
        init=False, default=None, eq=False, repr=False
    )

    def __attrs_post_init__(self) -> None:
        set_ = object.__setattr__
        node = self.id
        if not isinstance(node, str) or not 1 <= len(node) <= MAX_NODE_ID:
            raise InvalidArgument(
                f"node id must be a string of 1-{MAX_NODE_ID} characters, got {node!r:.80}"
            )
        if not is_plan_namespace(node) or node in _RESERVED:
            raise InvalidArgument(
                f"node id {node!r} must start with a letter or `_` and use only letters, digits, "
                "`_` and `-` (no dots), and may not be `initial` or `steps`"
            )
        _check_name(node, "tool", self.tool)
        inputs = _mapping(node, "inputs", self.inputs)
        # A mapping with string keys checks as an object.
        checked = cast("dict[str, JSONValue]", check_json(inputs, what=f"inputs of node `{node}`"))
        set_(self, "inputs", types.MappingProxyType(checked))
        set_(self, "after", _names(node, "after", self.after))
        resource = self.exclusive_resource
        if resource is not None:
            _check_name(node, "exclusive_resource", resource)
        resources = _mapping(node, "resources", self.resources)
        for name, units in resources.items():
            if not isinstance(units, int) or isinstance(units, bool) or units <= 0:
                raise _fail(node, f"resources[{name!r}]", f"must be an integer > 0, got {units!r}")
        set_(self, "resources", types.MappingProxyType(resources) if resources else _NOTHING)
        retries = self.retries
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise _fail(node, "retries", f"must be an integer >= 0, got {retries!r}")
        timeout = self.timeout
        if timeout is not None:
            if (
                not isinstance(timeout, (int, float))
                or isinstance(timeout, bool)
                or not math.isfinite(timeout)
                or timeout <= 0
            ):
                raise _fail(node, "timeout", f"must be None or a number > 0, got {timeout!r}")
            set_(self, "timeout", float(timeout))
        compensate = self.compensate
        if compensate is not None and not isinstance(compensate, Compensation):
            _check_name(node, "compensate", compensate)
        optional = _names(node, "optional", self.optional)
        fallback = _mapping(node, "fallback", self.fallback)
        for name in (*optional, *fallback):
            if name not in checked:
                raise _fail(
                    node, "optional and fallback", f"name input {name!r}, which it does not map"
                )
        set_(self, "optional", optional)
        if fallback:
            fallback = cast(
                "dict[str, Any]", check_json(fallback, what=f"fallback of node `{node}`")
            )
        set_(self, "fallback", types.MappingProxyType(fallback) if fallback else _NOTHING)
        refs: list[InputRef] = []
        malformed: list[tuple[str, str]] = []
        for param, value in checked.items():
            _collect(param, value, refs, malformed)
        set_(self, "_refs", tuple(refs))
        set_(self, "_malformed", tuple(malformed))

    def __hash__(self) -> int:
        return hash((self.id, self.tool))

    @property
    def input_refs(self) -> tuple[InputRef, ...]:
        """Every well-formed reference in `inputs`, input by input, left to right."""
        return self._refs

    def compiled_input(self, param: str) -> PlanValue:
        """Input `param` with its references parsed, once per node (for `resolve_inputs`)."""
        compiled = self._compiled
        if compiled is None:
            compiled = {name: compile_plan_value(value) for name, value in self.inputs.items()}
            object.__setattr__(self, "_compiled", compiled)
        return compiled[param]

    def _direct_inputs(self) -> tuple[tuple[str, bool, Any, tuple[str, ...]], ...] | bool:
        """How `resolve_inputs` reads the inputs of a node whose every input is a literal
        scalar or one whole reference, and that has no optional input or fallback: a row an
        input, `(param, False, literal, ())` or `(param, True, namespace, path)`; False for
        any other node (read the general way). Found once a node, then kept."""
        direct = self._direct
        if direct is not None:
            return direct
        rows: list[tuple[str, bool, Any, tuple[str, ...]]] = []
        found: tuple[tuple[str, bool, Any, tuple[str, ...]], ...] | bool = False
        if not (self.optional or self.fallback or self._malformed):
            refs = self._refs
            for param, value in self.inputs.items():
                ref = None
                for candidate in refs:
                    if candidate.whole and candidate.param == param:
                        ref = candidate
                        break
                if ref is not None:
                    rows.append((param, True, ref.namespace, ref.path))
                elif isinstance(value, (dict, list)) or (isinstance(value, str) and "${" in value):
                    break  # nested or interpolated: the general way
                else:
                    rows.append((param, False, value, ()))
            else:
                found = tuple(rows)
        object.__setattr__(self, "_direct", found)
        return found

    @property
    def compensation_name(self) -> str | None:
        """The name of the compensation `compensate=` gives, if any."""
        compensate = self.compensate
        return compensate.name if isinstance(compensate, Compensation) else compensate

    def to_json(self) -> dict[str, JSONValue]:
        """The node's canonical JSON form (what `Plan.version` digests)."""
        return {
            "id": self.id,
            "tool": self.tool,
            "inputs": dict(self.inputs),
            "after": list[JSONValue](sorted(self.after)),
            "exclusive_resource": self.exclusive_resource,
            "resources": dict(self.resources),
            "retries": self.retries,
            "timeout": self.timeout,
            "compensate": self.compensation_name,
            "optional": list[JSONValue](sorted(self.optional)),
            "fallback": dict(self.fallback),
        }


def _collect(
    param: str, value: JSONValue, refs: list[InputRef], malformed: list[tuple[str, str]]
) -> None:
    """Append the references of one input (nested lists and objects included) to `refs`."""
    if isinstance(value, str):
        if "${" in value:
            _collect_text(param, value, top=True, refs=refs, malformed=malformed)
        return
    stack: list[tuple[JSONValue, bool]] = [(value, True)]
    while stack:
        item, top = stack.pop()
        if isinstance(item, dict):
            stack.extend((child, False) for child in reversed(list(item.values())))
            continue
        if isinstance(item, list):
            stack.extend((child, False) for child in reversed(item))
            continue
        if isinstance(item, str) and "${" in item:
            _collect_text(param, item, top=top, refs=refs, malformed=malformed)


def _collect_text(
    param: str, text: str, *, top: bool, refs: list[InputRef], malformed: list[tuple[str, str]]
) -> None:
    try:
        pieces = parse_template(text, mode="plan")
    except ReferenceSyntaxError as exc:
        malformed.append((param, exc.problem))
        return
    whole = top and len(pieces) == 1
    interpolated = len(pieces) > 1
    refs.extend(
        _input_ref(param, piece, whole=whole, interpolated=interpolated)
        for piece in pieces
        if isinstance(piece, Reference)
    )


def _input_ref(param: str, reference: Reference, *, whole: bool, interpolated: bool) -> InputRef:
    return InputRef(
        param=param,
        namespace=reference.namespace,
        path=reference.path,
        text=reference.text,
        whole=whole,
        interpolated=interpolated,
    )


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
        from ._validate import find_cycles  # noqa: PLC0415  (_validate imports this module)

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
        from ._validate import validate_plan  # noqa: PLC0415  (_validate imports this module)

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

    @classmethod
    def from_json(cls, data: object) -> Plan:
        """A plan from its JSON form (as `to_json` writes it, or as an agent proposes one).

        Node fields left out take their defaults; `format` may be omitted. Raises
        `InvalidArgument` (or `JSONValueError`) naming what is wrong.
        """
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
        initial = value.get("initial", [])
        if not isinstance(initial, list):
            raise InvalidArgument("plan `initial` must be a list of key names")
        return cls(nodes=tuple(_node_from_json(item) for item in nodes), initial=tuple(initial))


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
    return Node(node_id, **fields)  # type: ignore[arg-type]


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


# ---------------------------------------------------------------------- resolution


def resolve_inputs(
    node: Node, initial: Mapping[str, JSONValue], outputs: Mapping[str, JSONValue]
) -> dict[str, JSONValue]:
    """The arguments `node` is called with: exactly its mapped inputs, references resolved.

    `initial` holds the run's initial values; `outputs` maps each node that succeeded to its
    output (a node missing from it has no output: it failed, was skipped or cancelled). Literals
    pass through, `$${` writes `${`, a whole-string reference gives the value with its JSON
    type, and scalars inside longer strings are written as compact JSON (strings verbatim). An
    input listed in `node.optional` whose producer has no output is left out, unless
    `node.fallback` gives a value for it, which is used instead.

    Pure; raises `UnresolvedInput` (naming the input) when a required input cannot be resolved:
    a missing key in an output, a producer without output, a list or object written into text.
    """
    direct = node._direct if node._direct is not None else node._direct_inputs()  # noqa: SLF001
    if direct is not False:
        # The commonest node: literal scalars and whole references to scalars in objects.
        arguments: dict[str, JSONValue] = {}
        for param, is_ref, given, path in cast(
            "tuple[tuple[str, bool, Any, tuple[str, ...]], ...]", direct
        ):
            if not is_ref:
                arguments[param] = given
                continue
            value: Any = initial if given == "initial" else outputs.get(given, _ABSENT)
            for segment in path:
                if type(value) is not dict or segment not in value:
                    value = _ABSENT
                    break
                value = value[segment]
            if value is _ABSENT or isinstance(value, (dict, list)):
                return _resolve_inputs(node, initial, outputs)  # the error, or a copy
            arguments[param] = value
        return arguments
    return _resolve_inputs(node, initial, outputs)


#: What a reference the direct way of `resolve_inputs` cannot read stands for.
_ABSENT: Final[Any] = object()


def _resolve_inputs(
    node: Node, initial: Mapping[str, JSONValue], outputs: Mapping[str, JSONValue]
) -> dict[str, JSONValue]:
    """`resolve_inputs`, the general way: any input, optional inputs and fallbacks."""
    arguments: dict[str, JSONValue] = {}
    missing: set[str] = set()
    if node.optional or node.fallback:
        missing = {
            ref.param
            for ref in node.input_refs
            if ref.namespace != "initial" and ref.namespace not in outputs
        }
    namespaces = _Namespaces(initial if isinstance(initial, dict) else dict(initial), outputs)
    refs = node.input_refs
    for param, value in node.inputs.items():
        if param in missing:
            if param in node.fallback:
                arguments[param] = node.fallback[param]
                continue
            if param in node.optional:
                continue
        if not isinstance(value, (dict, list)) and not (isinstance(value, str) and "${" in value):
            arguments[param] = value  # a literal scalar: as it is
            continue
        # The commonest input, one whole reference, is read from the node's parsed references
        # (no compiled copy kept a node); the rest is compiled once and kept.
        whole = next((ref for ref in refs if ref.whole and ref.param == param), None)
        if whole is not None:
            resolved, error = resolve_plan_reference(whole, namespaces)
        else:
            resolved, error = node.compiled_input(param).resolve(namespaces)
        if error is not None:
            if param in node.fallback:
                arguments[param] = node.fallback[param]
                continue
            raise UnresolvedInput(
                param=param, message=f"input `{param}` of node `{node.id}`: {error}"
            )
        arguments[param] = resolved
    return arguments


def resolve_resource(node: Node, initial: Mapping[str, JSONValue]) -> str | None:
    """The name of the exclusive resource `node` holds, its `${initial.key}`s filled in.

    None when the node holds none. Raises `UnresolvedInput` (param `exclusive_resource`) if a
    reference cannot be resolved, which `Plan.validate` and `Plan.check_initial` rule out.
    """
    resource = node.exclusive_resource
    if resource is None or "${" not in resource:
        return resource
    namespaces = {"initial": initial if isinstance(initial, dict) else dict(initial)}
    resolved, error = resolve_plan_value(resource, namespaces)
    if error is not None:
        raise UnresolvedInput(
            param="exclusive_resource",
            message=f"exclusive resource of node `{node.id}`: {error}",
        )
    return resolved if isinstance(resolved, str) else canonical_dumps(resolved)


class _Namespaces(Mapping[str, JSONValue]):
    """`initial` and the node outputs as one mapping, without copying either."""

    __slots__ = ("_initial", "_outputs")

    def __init__(self, initial: Mapping[str, JSONValue], outputs: Mapping[str, JSONValue]) -> None:
        self._initial = initial
        self._outputs = outputs

    def __getitem__(self, key: str) -> JSONValue:
        if key == "initial":
            return self._initial  # type: ignore[return-value]
        return self._outputs[key]

    def __contains__(self, key: object) -> bool:
        return key == "initial" or key in self._outputs

    def __iter__(self) -> Any:
        yield "initial"
        yield from self._outputs

    def __len__(self) -> int:
        return len(self._outputs) + 1
