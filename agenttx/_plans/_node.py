"""A plan's node: one tool call, its inputs (literals and `${...}` references), its order,
resources, retries, timeout and compensation; and the resolution of its inputs at run time.

`Node` checks each field on its own on construction and raises `InvalidArgument` naming the
node and the field; what needs the whole plan or the tools is `Plan.validate`'s. Nothing here
does I/O or calls a tool.
"""

from __future__ import annotations

import math
import types
from collections.abc import Iterable, Mapping
from typing import Any, Final, cast, final

import attrs

from .._errors import InvalidArgument, ReferenceSyntaxError
from .._json import JSONValue, canonical_dumps, check_json
from .._limits import MAX_NODE_RETRIES_IN_CODE
from .._refs import (
    PlanValue,
    Reference,
    compile_plan_value,
    is_plan_namespace,
    parse_template,
    resolve_plan_reference,
    resolve_plan_value,
)
from .._tools import Compensation, Tool

__all__ = [
    "MAX_NODE_ID",
    "InputRef",
    "Node",
    "UnresolvedInput",
    "resolve_inputs",
    "resolve_resource",
]

#: The longest node id, initial key or resource name accepted.
MAX_NODE_ID: Final = 128
#: Namespaces of the reference grammar that no node may take as its id.
_RESERVED: Final = frozenset({"initial", "steps"})


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
    `retries` bounds retries of transient failures (at most 1000 here, 10 in a plan from
    JSON: see `docs/plans.md#plan-limits`), `timeout` (seconds) each attempt;
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
        if retries > MAX_NODE_RETRIES_IN_CODE:
            raise _fail(
                node,
                "retries",
                f"must be at most {MAX_NODE_RETRIES_IN_CODE} (MAX_NODE_RETRIES_IN_CODE), "
                f"got {retries!r:.80}",
            )
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
