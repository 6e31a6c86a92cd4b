"""The JSON Schema of a plan for a set of tools, and the `propose_plan` tool a model is offered.

`plan_schema(tools)` describes exactly what `Plan.from_json` reads (the node fields, their
types and the limits of a plan from JSON), with the tool names as an enum and, per tool, the
tool's own parameter schema for a node's `inputs`. Wherever an input (or a value inside it)
is constrained, a string holding `${` is accepted too: a reference is resolved at run time, so
a model-side validator must not refuse it. The schema never refuses a plan that `from_json`
and `Plan.validate` accept; what it cannot say (unique node ids, references to existing nodes,
the 64 KiB of a node's inputs, types that flow between nodes) `Plan.validate` and `from_json`
report, with a "did you mean" where one fits.

A tool's `$defs` (or `definitions`) move into the plan schema's `$defs` under the tool's wire
name (`charge.Card`) and its local `$ref`s follow them; a `$ref` that is neither `#` nor one
of those definitions becomes `{}` (anything), as the tools' own validator treats one it
cannot follow. Pure: no tool is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

from .._errors import InvalidArgument
from .._limits import MAX_NODE_INPUT_BYTES, MAX_NODE_RETRIES, MAX_NODE_TIMEOUT, MAX_PLAN_NODES
from .._tools import ToolRegistry, ToolSpec
from ._node import MAX_NODE_ID

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._json import JSONValue
    from .._tools import ToolsArgument

__all__ = ["PLAN_TOOL", "HasToolSpecs", "plan_schema", "plan_tool_spec", "specs_of"]

#: The name of the tool a runner offers with `plans=True`.
PLAN_TOOL: Final = "propose_plan"
#: The dialect `plan_schema` is written in.
DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
#: How deep into a tool's parameter schema references are allowed (deeper: anything goes).
_MAX_DEPTH: Final = 12

_NAME: Final[dict[str, JSONValue]] = {"type": "string", "minLength": 1, "maxLength": MAX_NODE_ID}
_NAMES: Final[dict[str, JSONValue]] = {"type": "array", "items": _NAME}
#: What a reference looks like where a value of another type is expected.
_REFERENCE: Final[dict[str, JSONValue]] = {"type": "string", "pattern": r"\$\{"}
#: Keywords that describe a schema without constraining a value.
_ANNOTATIONS: Final = frozenset(
    {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly"}
)


@runtime_checkable
class HasToolSpecs(Protocol):
    """What offers its tools' specs (a `Transaction`, an `Engine`)."""

    @property
    def tool_specs(self) -> tuple[ToolSpec, ...]: ...


def specs_of(tools: ToolsArgument | HasToolSpecs, where: str) -> tuple[ToolSpec, ...]:
    """The specs of `tools`: a `Transaction` or `Engine`, or what `Transaction(tools=...)`
    takes. Raises `InvalidArgument` (naming `where`) for anything else."""
    if isinstance(tools, HasToolSpecs):
        return tools.tool_specs
    if isinstance(tools, (str, bytes)):
        raise InvalidArgument(f"{where} takes tools, a Transaction or an Engine, got {tools!r:.80}")
    try:
        return ToolRegistry(tools).specs()
    except TypeError as exc:  # not iterable
        raise InvalidArgument(
            f"{where} takes tools, a Transaction or an Engine, got {type(tools).__name__}"
        ) from exc


def plan_schema(specs: Sequence[ToolSpec]) -> dict[str, JSONValue]:
    """The JSON Schema (draft 2020-12) of a plan from JSON for tools with these specs.

    A new object each call: the caller may change it.
    """
    defs: dict[str, JSONValue] = {}
    names: list[JSONValue] = []
    branches: list[JSONValue] = []
    for spec in specs:
        accepted: list[JSONValue] = list(dict.fromkeys((spec.name, spec.wire_name)))
        names.extend(accepted)
        inputs = _Inputs(spec, defs).schema()
        branches.append(
            {
                "if": {"properties": {"tool": {"enum": accepted}}, "required": ["tool"]},
                "then": {"properties": {"inputs": inputs}},
            }
        )
    node: dict[str, JSONValue] = {
        "type": "object",
        "description": "One tool call of the plan.",
        "properties": _node_properties(names),
        "required": ["id", "tool"],
        "additionalProperties": False,
    }
    if branches:
        node["allOf"] = branches
    schema: dict[str, JSONValue] = {
        "$schema": DIALECT,
        "title": "agenttx plan",
        "description": (
            "A plan: tool calls (nodes) wired by ${node_id.path} references. Nodes run as soon "
            "as every node they reference (or list in `after`) has succeeded."
        ),
        "type": "object",
        "properties": {
            "format": {"const": 1, "description": "The plan format; leave it out or give 1."},
            "initial": {
                "type": "array",
                "description": (
                    "Names of the values given when the plan starts, used as ${initial.key}."
                ),
                "items": {"type": "string", "pattern": f"^[A-Za-z0-9_-]{{1,{MAX_NODE_ID}}}$"},
                "uniqueItems": True,
            },
            "nodes": {"type": "array", "minItems": 1, "maxItems": MAX_PLAN_NODES, "items": node},
        },
        "required": ["nodes"],
        "additionalProperties": False,
    }
    if defs:
        schema["$defs"] = defs
    return schema


def _node_properties(names: list[JSONValue]) -> dict[str, JSONValue]:
    tool: dict[str, JSONValue] = (
        {"enum": names} if names else {"type": "string", "minLength": 1, "maxLength": MAX_NODE_ID}
    )
    tool["description"] = "The tool the node calls."
    return {
        "id": {
            "type": "string",
            "description": (
                "The node's id, which references name: letters, digits, _ and -, starting with "
                "a letter or _."
            ),
            "pattern": "^[A-Za-z_][A-Za-z0-9_-]*$",
            "maxLength": MAX_NODE_ID,
            "not": {"enum": ["initial", "steps"]},
        },
        "tool": tool,
        "inputs": {
            "type": "object",
            "description": (
                "The tool's arguments: each a literal JSON value, a reference ${node_id.path} "
                "(${node_id} for the whole output) or ${initial.key}, or a string with "
                "references inside it; $${ writes a literal ${. At most "
                f"{MAX_NODE_INPUT_BYTES} bytes of JSON."
            ),
            "propertyNames": _NAME,
        },
        "after": {
            **_NAMES,
            "uniqueItems": True,
            "description": "Nodes that must succeed first, though no value flows from them.",
        },
        "exclusive_resource": {
            "anyOf": [_NAME, {"type": "null"}],
            "description": (
                "A resource held while the node runs (it may use ${initial.key}): nodes holding "
                "the same one never run at the same time."
            ),
        },
        "resources": {
            "type": "object",
            "description": "Units of shared capacities the node holds while it runs.",
            "propertyNames": _NAME,
            "additionalProperties": {"type": "integer", "minimum": 1},
        },
        "retries": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_NODE_RETRIES,
            "description": "Retries of transient failures.",
        },
        "timeout": {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_NODE_TIMEOUT},
                {"type": "null"},
            ],
            "description": "Seconds each attempt may take.",
        },
        "compensate": {
            "anyOf": [_NAME, {"type": "null"}],
            "description": "The registered compensation that undoes the node's effect.",
        },
        "optional": {
            **_NAMES,
            "description": "Inputs the node runs without when their producer did not succeed.",
        },
        "fallback": {
            "type": "object",
            "description": "Values used instead of inputs whose producer did not succeed.",
            "propertyNames": _NAME,
        },
    }


class _Inputs:
    """The `inputs` schema of one tool: its parameters, references allowed in every value."""

    def __init__(self, spec: ToolSpec, defs: dict[str, JSONValue]) -> None:
        self._parameters = spec.parameters  # a copy of its own
        self._prefix = f"{spec.wire_name}."
        self._defs = defs

    def schema(self) -> dict[str, JSONValue]:
        parameters = self._parameters
        for keyword in ("$defs", "definitions"):
            found = parameters.pop(keyword, None)
            if isinstance(found, dict):
                for name, definition in found.items():
                    self._defs[self._prefix + name] = self._wrap(definition, 1)
        if _has_root_ref(parameters):
            self._defs[self._prefix.rstrip(".")] = self._deep(parameters, 1)
        return self._deep(parameters, 0)

    def _wrap(self, schema: JSONValue, depth: int) -> JSONValue:
        """`schema` for a value that may also be a reference."""
        if depth > _MAX_DEPTH:
            return {}  # anything: deeper than a plan's inputs are checked here
        if not isinstance(schema, dict):
            return schema  # `true`, `false` (no reference helps), or not a schema
        deep = self._deep(schema, depth)
        if deep.keys() <= _ANNOTATIONS:
            return deep  # anything goes already
        described: dict[str, JSONValue] = {
            key: deep.pop(key) for key in ("title", "description") if key in deep
        }
        return {**described, "anyOf": [deep, dict(_REFERENCE)]}

    def _deep(self, schema: dict[str, JSONValue], depth: int) -> dict[str, JSONValue]:
        """`schema` with references allowed in the values it holds (not in itself)."""
        out: dict[str, JSONValue] = {}
        combined: list[dict[str, JSONValue]] = []
        for key, value in schema.items():
            if key in ("properties", "patternProperties") and isinstance(value, dict):
                out[key] = {name: self._wrap(sub, depth + 1) for name, sub in value.items()}
            elif key in ("additionalProperties", "items", "contains") and isinstance(value, dict):
                out[key] = self._wrap(value, depth + 1)
            elif key == "prefixItems" and isinstance(value, list):
                out[key] = [self._wrap(sub, depth + 1) for sub in value]
            elif key in ("anyOf", "oneOf", "allOf") and isinstance(value, list):
                members: list[JSONValue] = [
                    self._deep(sub, depth + 1) if isinstance(sub, dict) else sub for sub in value
                ]
                # A oneOf whose members now overlap (both take a reference) would refuse the
                # value: it is checked as anyOf, as the tools' own validator does.
                combined.append({"allOf" if key == "allOf" else "anyOf": members})
            elif key in ("if", "then", "else") and isinstance(value, dict):
                out[key] = self._deep(value, depth + 1)
            elif key == "$ref":
                target = self._ref(value)
                if target is not None:  # else anything: a reference it cannot follow
                    out[key] = target
            else:
                out[key] = value
        if len(combined) == 1:
            out.update(combined[0])
        elif combined:
            members = [*combined]
            out["allOf"] = members
        return out

    def _ref(self, ref: JSONValue) -> str | None:
        """Where a `$ref` of the tool's schema points now; None for one it cannot follow."""
        if ref == "#":
            return f"#/$defs/{self._prefix.rstrip('.')}"
        if isinstance(ref, str):
            for keyword in ("$defs", "definitions"):
                head = f"#/{keyword}/"
                rest = ref[len(head) :]
                if ref.startswith(head) and rest and "/" not in rest:
                    return f"#/$defs/{self._prefix}{rest}"
        return None


def _has_root_ref(value: JSONValue) -> bool:
    """Whether a schema refers to its own root (`"$ref": "#"`) anywhere."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            if item.get("$ref") == "#":
                return True
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return False


def plan_tool_spec(tools: ToolsArgument | HasToolSpecs) -> ToolSpec:
    """The `propose_plan` tool: its parameters are `Plan.json_schema(tools)` for a plan that
    declares no initial values (a proposed plan writes its values into the inputs).

    Raises `InvalidArgument` for what is not tools, and when one of the tools is itself named
    `propose_plan`.
    """
    specs = specs_of(tools, "plan_tool_spec()")
    for spec in specs:
        if PLAN_TOOL in (spec.name, spec.wire_name):
            raise InvalidArgument(
                f"tool `{spec.name}` has the name `{PLAN_TOOL}`, which plans=True offers the "
                "model for its plans; rename the tool"
            )
    parameters = plan_schema(specs)
    del parameters["$schema"]  # providers take the schema without its dialect
    properties = parameters["properties"]
    assert isinstance(properties, dict)  # plan_schema wrote it
    properties["initial"] = {
        "type": "array",
        "maxItems": 0,
        "description": "No initial values are given to a proposed plan: leave it out.",
    }
    return ToolSpec(
        name=PLAN_TOOL,
        wire_name=PLAN_TOOL,
        description=_DESCRIPTION,
        parameters=parameters,
    )


_DESCRIPTION: Final = (
    "Propose a whole plan of tool calls at once, instead of calling the tools one by one. "
    "Each node calls one tool; an input may take another node's output by reference, "
    '"${node_id.field}". Nodes run as soon as the nodes they reference (or list in "after") '
    "have succeeded, independent ones at the same time. The plan is checked before anything "
    "runs: if it has problems, you get every one of them and nothing runs; then send the whole "
    "corrected plan. Once it ran, you get each node's output or error."
)
