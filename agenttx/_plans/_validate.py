"""Plan validation: every problem of a plan against a set of tools, before anything runs.

`validate_plan(plan, tools)` reads each node in plan order and reports, in this order per node:
duplicate ids, unknown tools and compensations, inputs the tool does not take, malformed
references, references to undeclared initial keys, unknown nodes and the node itself, fields
the producer's return type lacks, type mismatches, unsupported transformations, unmapped
required parameters, duplicate edges, and the same checks for `after` and
`exclusive_resource`. Cycles come last, once every schema problem is listed.

Types come from annotations (`read_signature`): a parameter's annotation is its input type, a
`TypedDict` return annotation gives the output's fields (nested `TypedDict`s nested fields).
A type that cannot be known (no annotation, `Any`, `dict`, a class that is not a JSON shape,
an `${initial.key}`) never causes a problem: a mismatch is reported only when two annotations
contradict each other. `typing.NewType`s are semantic types compared by name: a value of a
NewType feeds its own NewType or its base type, never another NewType, while a plain value may
feed a NewType of its base type (it makes no claim of meaning). A union accepts a value any
member accepts, and a union value is accepted when any member is.


Cycles are reported by `find_cycles` (`_cycles`), after every schema problem.
"""

from __future__ import annotations

import collections
import collections.abc
import difflib
import enum
import functools
import types
import typing
from typing import TYPE_CHECKING, Any, Final, Literal

from .._errors import InvalidArgument, ReferenceSyntaxError
from .._refs import Reference, parse_template
from .._tools import UNRESOLVED, ToolRegistry, newtype_name
from .._tools import typed_dict_fields as _read_typed_dict_fields
from ._cycles import find_cycles
from ._problems import PlanProblem, PlanProblemCode

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._tools import Tool, ToolsArgument
    from ._node import InputRef, Node
    from ._problems import PlanShape

__all__ = ["validate_plan"]

Code = PlanProblemCode
#: How deep type comparison and path walking look into nested types before giving up (unknown).
_MAX_TYPE_DEPTH: Final = 8
_UNKNOWN: Final[Any] = UNRESOLVED


def validate_plan(plan: PlanShape, tools: ToolsArgument) -> tuple[PlanProblem, ...]:
    """Every problem of `plan` against `tools`: schema problems in plan order, then cycles.

    A plan is immutable, and so are tools: the answer is kept on the plan with the tools it
    was for (by identity, under their names), and given again for the same tools, so that a
    plan run again (or checked, then run) is not validated twice. Other tools, or the same
    functions wrapped anew, are validated afresh.
    """
    registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
    key = (*registry.tools.items(), *registry.compensations.items())
    kept = plan._validated  # noqa: SLF001  (one unit: the plans package)
    if kept is not None and _same_tools(kept[0], key):
        return kept[1]
    checker = _Checker(plan, registry)
    for position, node in enumerate(plan.nodes):
        checker.node(position, node)
    problems = (*checker.problems, *find_cycles(plan))
    object.__setattr__(plan, "_validated", (key, problems))
    return problems


def _same_tools(
    kept: tuple[tuple[str, object], ...], given: tuple[tuple[str, object], ...]
) -> bool:
    """Whether two registries hold the very same tool objects under the same names."""
    return len(kept) == len(given) and all(
        name == other_name and tool is other
        for (name, tool), (other_name, other) in zip(kept, given, strict=True)
    )


class _ToolInfo:
    """What validation reads of one tool: its inputs, their types, its return type."""

    __slots__ = ("accepts_any", "annotations", "name", "properties", "required", "returns")

    def __init__(self, tool: Tool[Any, Any]) -> None:
        signature = tool.signature
        schema = tool.validator.schema  # what `spec.parameters` copies on each read: read only
        properties = schema.get("properties")
        required = schema.get("required")
        self.name = tool.name
        self.properties = frozenset(properties) if isinstance(properties, dict) else frozenset()
        self.required = (
            tuple(r for r in required if isinstance(r, str)) if isinstance(required, list) else ()
        )
        self.accepts_any = schema.get("additionalProperties", True) is not False
        self.annotations = {p.name: p.annotation for p in signature.parameters}
        self.returns = signature.returns.annotation


class _Checker:
    __slots__ = (
        "_ids",
        "_infos",
        "_initial",
        "_plan",
        "_registry",
        "_seen",
        "problems",
    )

    def __init__(self, plan: PlanShape, registry: ToolRegistry) -> None:
        self._plan = plan
        self._registry = registry
        self._initial = frozenset(plan.initial)
        self._infos: dict[str, _ToolInfo | None] = {}
        self._seen: dict[str, int] = {}
        self._ids: list[str] | None = None  # sorted, for suggestions: when a problem needs them
        self.problems: list[PlanProblem] = []

    @property
    def ids(self) -> list[str]:
        """The plan's node ids, sorted (read only to suggest a name in a problem)."""
        if self._ids is None:
            self._ids = sorted(set(self._plan.node_ids))
        return self._ids

    def _mismatch(self, source: Any, target: Any) -> bool:
        """`_mismatch`, answered once per pair of types: a plan of thousands of nodes uses few
        (and plans of one program share them: kept across validations)."""
        try:
            return _known_mismatch(source, target)
        except TypeError:  # an unhashable annotation
            return _mismatch(source, target, 0)

    def _field(self, annotation: Any, segment: str) -> tuple[str, Any]:
        """`_field`, answered once per type and segment (a plan reads few distinct fields)."""
        try:
            return _known_field(annotation, segment)
        except TypeError:  # an unhashable annotation
            return _field(annotation, segment)

    def _add(self, code: PlanProblemCode, subject: str, message: str) -> None:
        self.problems.append(PlanProblem(code=code, subject=subject, message=message))

    def _info(self, name: str) -> _ToolInfo | None:
        if name not in self._infos:
            tool = self._registry.get(name)
            self._infos[name] = None if tool is None else _ToolInfo(tool)
        return self._infos[name]

    def node(self, position: int, node: Node) -> None:
        node_id = node.id
        first = self._seen.setdefault(node_id, position)
        if first != position:
            self._add(
                Code.DUPLICATE_NODE,
                node_id,
                f"nodes[{first}] and nodes[{position}] both have the id `{node_id}`; "
                "give each node its own id.",
            )
        info = self._info(node.tool)
        if info is None:
            self._add(
                Code.UNKNOWN_TOOL,
                node_id,
                f"node `{node_id}` calls tool `{node.tool}`, which is not registered"
                f"{_did_you_mean(node.tool, self._registry.names())}.",
            )
        compensate = node.compensate
        if isinstance(compensate, str) and compensate not in self._registry.compensations:
            self._add(
                Code.UNKNOWN_TOOL,
                f"{node_id}.compensate",
                f"node `{node_id}` is compensated by `{compensate}`, which is not a registered "
                f"compensation{_did_you_mean(compensate, sorted(self._registry.compensations))}.",
            )
        refs_by_param: dict[str, list[InputRef]] = {}
        for ref in node.input_refs:
            refs = refs_by_param.get(ref.param)
            if refs is None:
                refs_by_param[ref.param] = [ref]
            else:
                refs.append(ref)
        malformed = dict(node._malformed) if node._malformed else {}  # noqa: SLF001  (one unit: the plans package)
        for param in sorted(node.inputs) if len(node.inputs) > 1 else node.inputs:
            self._input(node, info, param, refs_by_param.get(param, ()), malformed.get(param))
        if info is not None:
            for param in info.required:
                if param not in node.inputs:
                    self._add(
                        Code.MISSING_INPUT,
                        f"{node_id}.{param}",
                        f"node `{node_id}` does not map `{param}`, a required parameter of "
                        f"tool `{info.name}`.",
                    )
        self._duplicate_edges(node)
        self._after(node)
        self._resource(node)

    def _input(
        self,
        node: Node,
        info: _ToolInfo | None,
        param: str,
        refs: Sequence[InputRef],
        malformed: str | None,
    ) -> None:
        node_id = node.id
        subject = f"{node_id}.{param}"
        if info is not None and param not in info.properties and not info.accepts_any:
            self._add(
                Code.UNKNOWN_INPUT,
                subject,
                f"node `{node_id}` maps `{param}`, which tool `{info.name}` does not take"
                f"{_did_you_mean(param, sorted(info.properties))}.",
            )
            info = None  # no parameter type to compare with
        if malformed is not None:
            self._add(
                Code.MALFORMED_PATH,
                subject,
                f"input `{param}` of node `{node_id}` has a malformed reference: {malformed}.",
            )
            return
        target = _UNKNOWN if info is None else info.annotations.get(param, _UNKNOWN)
        value = node.inputs[param]
        resolved = True
        for ref in refs:
            found = self._reference(node, ref)
            if found is None:
                resolved = False
                continue
            if ref.whole:
                self._compare(subject, ref.text, found, target)
            elif ref.interpolated and _kind(found) in {"array", "object"}:
                self._add(
                    Code.UNSUPPORTED_TRANSFORMATION,
                    subject,
                    f"input `{param}` of node `{node_id}` writes {ref.text}, "
                    f"{_article(_type_name(found))}, into text; map it to an input of its own.",
                )
        if not refs:
            self._compare(subject, f"the literal {value!r:.60}", type(value), target)
        elif resolved and isinstance(value, str) and not refs[0].whole:
            self._compare(subject, f"the text {value!r:.60}", str, target)
        if (
            param in node.optional
            and param not in node.fallback
            and info is not None
            and param in info.required
        ):
            self._add(
                Code.MISSING_INPUT,
                subject,
                f"input `{param}` of node `{node_id}` is optional, but tool `{info.name}` "
                "requires it; give it a fallback or make it required.",
            )

    def _reference(self, node: Node, ref: InputRef) -> Any | None:  # noqa: PLR0911
        """The type a reference names (`_UNKNOWN` if unknown); None after reporting a problem."""
        namespace = ref.namespace
        if namespace == "initial":
            key = ref.path[0]
            if key not in self._initial:
                self._add(
                    Code.MISSING_INPUT,
                    f"initial.{key}",
                    f"node `{node.id}` uses {ref.text}, but the plan does not declare "
                    f"`{key}` in initial{_did_you_mean(key, sorted(self._initial))}.",
                )
                return None
            return _UNKNOWN
        if namespace == node.id:
            self._add(
                Code.SELF_DEPENDENCY,
                node.id,
                f"node `{node.id}` uses its own output {ref.text}; take the value from "
                "another node or from initial.",
            )
            return None
        producer = self._plan._by_id.get(namespace)  # noqa: SLF001  (one unit: the plans package)
        if producer is None:
            self._add(
                Code.UNKNOWN_NODE,
                namespace,
                f"node `{node.id}` uses {ref.text}, but the plan has no node `{namespace}`"
                f"{_did_you_mean(namespace, self.ids)}.",
            )
            return None
        info = self._info(producer.tool)
        current = _UNKNOWN if info is None else info.returns
        for depth, segment in enumerate(ref.path):
            status, current = self._field(current, segment)
            if status == "ok":
                continue
            where = ".".join((namespace, *ref.path[: depth + 1]))
            if status == "missing":
                owner = (
                    f"the output of `{namespace}` (tool `{producer.tool}`)"
                    if depth == 0
                    else f"`{'.'.join((namespace, *ref.path[:depth]))}`"
                )
                self._add(
                    Code.MISSING_OUTPUT,
                    where,
                    f"node `{node.id}` uses {ref.text}, but {owner} has no field `{segment}`"
                    f"{_did_you_mean(segment, _field_names(current))}.",
                )
                return None
            if status == "not-index":
                parent = ".".join((namespace, *ref.path[:depth]))
                self._add(
                    Code.MALFORMED_PATH,
                    where,
                    f"node `{node.id}` uses {ref.text}, but `{parent}` is a list, "
                    f"so `{segment}` must be an index such as 0.",
                )
                return None
        return current

    def _compare(self, subject: str, what: str, source: Any, target: Any) -> None:
        if self._mismatch(source, target):
            node_id, _, param = subject.partition(".")
            self._add(
                Code.TYPE_MISMATCH,
                subject,
                f"input `{param}` of node `{node_id}` takes {_article(_type_name(target))}, "
                f"but {what} is {_article(_type_name(source))}.",
            )

    def _duplicate_edges(self, node: Node) -> None:
        if len(node.input_refs) < 2 and len(node.after) < 2:
            return  # one reference, one `after`: nothing can repeat (the commonest node)
        mapped: dict[str, str] = {}
        for ref in node.input_refs:
            if not ref.whole or ref.namespace == "initial":
                continue
            first = mapped.setdefault(ref.text, ref.param)
            if first != ref.param:
                self._add(
                    Code.DUPLICATE_EDGE,
                    f"{node.id}.{ref.param}",
                    f"inputs `{first}` and `{ref.param}` of node `{node.id}` both map "
                    f"{ref.text}; map it once.",
                )
        if len(set(node.after)) == len(node.after):
            return
        counts = collections.Counter(node.after)
        for other, count in counts.items():
            if count > 1:
                self._add(
                    Code.DUPLICATE_EDGE,
                    f"{node.id}.after",
                    f"node `{node.id}` lists `{other}` in after {count} times; list it once.",
                )

    def _after(self, node: Node) -> None:
        for other in dict.fromkeys(node.after) if len(node.after) > 1 else node.after:
            if other == node.id:
                self._add(
                    Code.SELF_DEPENDENCY,
                    node.id,
                    f"node `{node.id}` lists itself in after; a node cannot wait for itself.",
                )
            elif other not in self._seen and not _has(self._plan, other):
                self._add(
                    Code.UNKNOWN_NODE,
                    other,
                    f"node `{node.id}` runs after `{other}`, but the plan has no node `{other}`"
                    f"{_did_you_mean(other, self.ids)}.",
                )

    def _resource(self, node: Node) -> None:
        resource = node.exclusive_resource
        if resource is None or "${" not in resource:
            return
        subject = f"{node.id}.exclusive_resource"
        try:
            pieces = parse_template(resource, mode="plan")
        except ReferenceSyntaxError as exc:
            self._add(
                Code.MALFORMED_PATH,
                subject,
                f"the exclusive resource of node `{node.id}` has a malformed reference: "
                f"{exc.problem}.",
            )
            return
        for piece in pieces:
            if not isinstance(piece, Reference):
                continue
            if piece.namespace != "initial":
                self._add(
                    Code.MALFORMED_PATH,
                    subject,
                    f"the exclusive resource of node `{node.id}` uses {piece.text}; it may "
                    "use only `${initial.key}`, so it is known before the node is ready.",
                )
            elif piece.path[0] not in self._initial:
                self._add(
                    Code.MISSING_INPUT,
                    f"initial.{piece.path[0]}",
                    f"the exclusive resource of node `{node.id}` uses {piece.text}, but the "
                    f"plan does not declare `{piece.path[0]}` in initial.",
                )


def _has(plan: PlanShape, node_id: str) -> bool:
    try:
        plan.node(node_id)
    except InvalidArgument:
        return False
    return True


#: Past this many names, no "did you mean": a hostile plan must not cost a fuzzy match each.
_MAX_SUGGESTIONS: Final = 256


def _did_you_mean(name: str, choices: collections.abc.Sequence[str]) -> str:
    if len(choices) > _MAX_SUGGESTIONS:
        return ""
    close = difflib.get_close_matches(name, choices, n=1)
    return f" (did you mean `{close[0]}`?)" if close else ""


# ---------------------------------------------------------------------- types


def _plain(annotation: Any) -> Any:
    """`annotation` without `Annotated` metadata."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _is_unknown(annotation: Any) -> bool:
    return (
        annotation is _UNKNOWN
        or annotation is Any
        or annotation is object
        or isinstance(annotation, typing.TypeVar)
    )


def _union_members(annotation: Any) -> tuple[Any, ...] | None:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return typing.get_args(annotation)
    return None


def _base(annotation: Any) -> Any:
    """A NewType's base type, through every layer of NewType."""
    for _ in range(_MAX_TYPE_DEPTH):
        if newtype_name(annotation) is None:
            return annotation
        annotation = _plain(annotation.__supertype__)
    return _UNKNOWN


def _semantic_names(annotation: Any) -> list[str]:
    """The NewType names of `annotation`, narrowest first (`[]` for a plain type)."""
    names: list[str] = []
    for _ in range(_MAX_TYPE_DEPTH):
        name = newtype_name(annotation)
        if name is None:
            break
        names.append(name)
        annotation = _plain(annotation.__supertype__)
    return names


_ARRAYS: Final = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Iterable)
_OBJECTS: Final = (dict, collections.abc.Mapping)


@functools.lru_cache(maxsize=1024)
def _cached_fields(annotation: Any) -> tuple[Any, ...] | None:
    return _read_typed_dict_fields(annotation)


def typed_dict_fields(annotation: Any) -> tuple[Any, ...] | None:
    """The keys of a TypedDict (read once per class: validation asks for them per reference)."""
    if not isinstance(annotation, type):
        return None
    try:
        return _cached_fields(annotation)
    except TypeError:  # an unhashable class object: read it every time
        return _read_typed_dict_fields(annotation)


def _kind(annotation: Any) -> str | None:  # noqa: PLR0911  (one answer per kind of type)
    """The JSON kind of a (plain, non-union) type, or None when unknown."""
    annotation = _base(_plain(annotation))
    if _is_unknown(annotation):
        return None
    if annotation is None or annotation is type(None):
        return "null"
    if typing.get_origin(annotation) is Literal:
        kinds = {_kind(type(value)) for value in typing.get_args(annotation)}
        return kinds.pop() if len(kinds) == 1 else None
    origin = typing.get_origin(annotation) or annotation
    if not isinstance(origin, type):
        return None
    if issubclass(origin, enum.Enum):
        return None
    if origin is bool:
        return "boolean"
    if issubclass(origin, (str, bytes)):
        return "string"
    if issubclass(origin, int):
        return "integer"
    if issubclass(origin, float):
        return "number"
    if typed_dict_fields(origin) is not None or issubclass(origin, _OBJECTS):
        return "object"
    if issubclass(origin, _ARRAYS):
        return "array"
    return None


def _mismatch(source: Any, target: Any, depth: int) -> bool:  # noqa: PLR0911  (one answer per kind of type)
    """Whether a value of type `source` contradicts parameter type `target` (unknown: False)."""
    if depth > _MAX_TYPE_DEPTH:
        return False
    source, target = _plain(source), _plain(target)
    if _is_unknown(source) or _is_unknown(target):
        return False
    members = _union_members(target)
    if members is not None:
        return all(_mismatch(source, member, depth + 1) for member in members)
    members = _union_members(source)
    if members is not None:
        return all(_mismatch(member, target, depth + 1) for member in members)
    wanted, offered = _semantic_names(target), _semantic_names(source)
    if wanted and offered and wanted[0] not in offered:
        return True
    source, target = _base(source), _base(target)
    source_kind, target_kind = _kind(source), _kind(target)
    if source_kind is None or target_kind is None:
        return False
    if source_kind != target_kind and not (source_kind == "integer" and target_kind == "number"):
        return True
    return _mismatch_inside(source, target, depth)


def _mismatch_inside(source: Any, target: Any, depth: int) -> bool:  # noqa: PLR0911  (one answer per kind of type)
    """Element and field types of two types of the same JSON kind."""
    target_fields = typed_dict_fields(target)
    if target_fields is not None:
        source_fields = typed_dict_fields(source)
        if source_fields is None:
            return False
        offered = {field.name: field for field in source_fields}
        for field in target_fields:
            have = offered.get(field.name)
            if have is None:
                if field.required:
                    return True
                continue
            if _mismatch(have.annotation, field.annotation, depth + 1):
                return True
        return False
    target_args, source_args = typing.get_args(target), typing.get_args(source)
    if not target_args or not source_args:
        return False
    if _kind(target) == "array":
        return _mismatch(_item(source), _item(target), depth + 1)
    if _kind(target) == "object" and len(target_args) == 2 and len(source_args) == 2:
        return _mismatch(source_args[1], target_args[1], depth + 1)
    return False


@functools.lru_cache(maxsize=4096)
def _known_mismatch(source: Any, target: Any) -> bool:
    """`_mismatch` of two (hashable) types, kept: types do not change."""
    return _mismatch(source, target, 0)


@functools.lru_cache(maxsize=4096)
def _known_field(annotation: Any, segment: str) -> tuple[str, Any]:
    """`_field` of a (hashable) type and a segment, kept."""
    return _field(annotation, segment)


def _item(annotation: Any) -> Any:
    """The element type of a homogeneous array type (`list[X]`, `tuple[X, ...]`), else unknown."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        return _UNKNOWN
    return args[0] if len(args) == 1 else _UNKNOWN


def _field(annotation: Any, segment: str) -> tuple[str, Any]:  # noqa: PLR0911  (one answer per kind of type)
    """Walk one path segment into a type: `("ok", type)`, `("missing", type)` (the type that
    lacks it) or `("not-index", type)` (a list walked with a name)."""
    if annotation is _UNKNOWN or annotation is dict:  # the common unannotated output
        return "ok", _UNKNOWN
    annotation = _plain(annotation)
    members = _union_members(annotation)
    if members is not None:
        present = [member for member in members if _plain(member) not in (None, type(None))]
        if len(present) != 1:
            return "ok", _UNKNOWN
        annotation = _plain(present[0])
    annotation = _base(annotation)
    if _is_unknown(annotation):
        return "ok", _UNKNOWN
    fields = typed_dict_fields(annotation)
    if fields is not None:
        for field in fields:
            if field.name == segment:
                return "ok", field.annotation
        return "missing", annotation
    kind = _kind(annotation)
    if kind is None:
        return "ok", _UNKNOWN
    if kind == "object":
        args = typing.get_args(annotation)
        return "ok", args[1] if len(args) == 2 else _UNKNOWN
    if kind == "array":
        if not (segment.isascii() and segment.isdigit()):
            return "not-index", annotation
        args = typing.get_args(annotation)
        if typing.get_origin(annotation) is tuple and args and args[-1] is not Ellipsis:
            index = int(segment) if len(segment) < 19 else len(args)
            return ("ok", args[index]) if index < len(args) else ("missing", annotation)
        return "ok", _item(annotation)
    return "missing", annotation  # a scalar has no fields


def _field_names(annotation: Any) -> list[str]:
    fields = typed_dict_fields(_base(_plain(annotation)))
    return [field.name for field in fields] if fields else []


def _type_name(annotation: Any) -> str:
    annotation = _plain(annotation)
    name = newtype_name(annotation)
    if name is not None:
        return name
    if annotation is type(None) or annotation is None:
        return "None"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return repr(annotation).replace("typing.", "")


def _article(name: str) -> str:
    if name == "None":
        return "None"
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} `{name}`"
