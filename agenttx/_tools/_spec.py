"""Tool specs: what a model is told about a tool, built once at decoration.

A `ToolSpec` holds a tool's registered `name`, its `wire_name` (the name sent to a model
provider), its `description` and its `parameters` (a JSON Schema object). The schema comes from
the signature and docstring (`_signature`, `_schema`) unless `@tool(parameters=...)` gives one;
the description is the docstring's text before its sections unless `@tool(description=...)`.

Wire names: OpenAI and Anthropic accept tool names matching `^[a-zA-Z0-9_-]{1,64}$`. The wire
name of a tool is its registered name with every other character replaced by `_`
(`kv.put` -> `kv_put`); a name whose wire name would be longer than 64 characters is refused at
decoration, and two tools with one wire name are refused in one registry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Final, cast, final

import attrs

from .._errors import InvalidArgument
from .._json import check_json
from ._schema import Validator, compile_schema, parameters_schema
from ._signature import Signature, read_signature

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._json import JSONValue

__all__ = ["MAX_WIRE_NAME", "ToolSpec", "build_spec", "secret_parameters", "wire_name"]

#: The longest name OpenAI and Anthropic accept for a tool.
MAX_WIRE_NAME: Final = 64
_NOT_WIRE: Final = re.compile(r"[^A-Za-z0-9_-]")


def wire_name(name: str) -> str:
    """`name` with every character outside `[A-Za-z0-9_-]` replaced by `_` (`kv.put` -> `kv_put`).

    Raises `InvalidArgument` when the result is empty or longer than 64 characters.
    """
    wire = _NOT_WIRE.sub("_", name)
    if not 1 <= len(wire) <= MAX_WIRE_NAME:
        raise InvalidArgument(
            f"tool `{name}`: its wire name must be 1-{MAX_WIRE_NAME} characters of "
            f"[A-Za-z0-9_-] (model providers refuse others), got {len(wire)}; use a shorter name"
        )
    return wire


@final
@attrs.frozen(kw_only=True)
class ToolSpec:
    """What a model is told about a tool; `parameters` is a JSON Schema object.

    `name` is the registered name (the one steps record), `wire_name` the provider-safe one;
    a call may use either. Build one with `@tool`; `tool.spec` returns it.

    The spec keeps its own copy of the `parameters` it is given, and `parameters` returns a new
    copy on each access: a caller that changes what it got changes nothing else (not what other
    integrations send, not the tool's compiled validator). Raises `InvalidArgument` for a name,
    wire name or description of the wrong form, and for `parameters` that are not a JSON Schema
    object made of JSON values.
    """

    __module__ = "agenttx"

    name: str
    wire_name: str
    description: str
    _parameters: Mapping[str, JSONValue] = attrs.field(alias="parameters", repr=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgument(f"ToolSpec name must be a non-empty string, got {self.name!r}")
        if self.wire_name != wire_name(self.name):
            raise InvalidArgument(
                f"tool `{self.name}`: wire_name must be {wire_name(self.name)!r}, "
                f"got {self.wire_name!r}"
            )
        if not isinstance(self.description, str):
            raise InvalidArgument(f"tool `{self.name}`: description must be a string")
        given: object = self._parameters
        _check_object_schema(self.name, given)
        checked = check_json(
            dict(cast("Mapping[str, object]", given)), what=f"tool `{self.name}`: parameters"
        )
        object.__setattr__(self, "_parameters", _copied(checked))  # its own: no caller holds it

    @property
    def parameters(self) -> dict[str, JSONValue]:
        """The JSON Schema object of the arguments: a new deep copy on each access."""
        return cast("dict[str, JSONValue]", _copied(cast("JSONValue", self._parameters)))


def _copied(value: JSONValue) -> JSONValue:
    """A deep copy of a JSON value (checked, so at most `MAX_NESTING_DEPTH` deep)."""
    if type(value) is dict:
        return {key: _copied(item) for key, item in value.items()}
    if type(value) is list:
        return [_copied(item) for item in value]
    return value


def _check_object_schema(name: str, parameters: object) -> None:
    if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
        raise InvalidArgument(
            f"tool `{name}`: parameters= must be a JSON Schema object with "
            f'"type": "object", got {parameters!r:.200}'
        )


def build_spec(
    fn: Callable[..., object],
    *,
    name: str,
    skip_context: bool,
    description: str | None,
    parameters: Mapping[str, JSONValue] | None,
) -> tuple[ToolSpec, Validator, Signature | None]:
    """The spec of a tool, the validator of its arguments, and the signature read to build
    them (None when `parameters` is given: none was read), for the tool to keep.

    Raises `InvalidArgument` naming the tool for a name that cannot be mapped, a description
    that is not a string, or `parameters` that is not a JSON Schema object of JSON values.
    """
    wire = wire_name(name)
    if description is not None and not isinstance(description, str):
        raise InvalidArgument(
            f"tool `{name}`: description= must be a string, got {type(description).__name__}"
        )
    signature: Signature | None = None
    if parameters is not None:
        _check_object_schema(name, parameters)
        validator = compile_schema(parameters, what=f"tool `{name}`: parameters=")
        schema = validator.schema
    else:
        signature = read_signature(fn, skip_context=skip_context)
        schema = parameters_schema(signature)
        validator = compile_schema(schema, what=f"tool `{name}`: parameters")
        if description is None:
            description = signature.description
    if description is None:
        description = ""
    spec = ToolSpec(name=name, wire_name=wire, description=description, parameters=schema)
    return spec, validator, signature


def secret_parameters(
    name: str, secret: object, parameters: Mapping[str, JSONValue]
) -> frozenset[str]:
    """The secret parameters of tool `name`: those `secret=` names (each must be one of its
    parameters) and those its schema marks `writeOnly` or `format: password`."""
    properties = parameters.get("properties")
    known = properties if isinstance(properties, Mapping) else {}
    if isinstance(secret, (str, bytes)) or not isinstance(secret, Iterable):
        raise InvalidArgument(
            f"tool `{name}`: secret= must be a list of parameter names, got {secret!r}"
        )
    declared = list(cast("Iterable[object]", secret))
    for parameter in declared:
        if not isinstance(parameter, str) or parameter not in known:
            raise InvalidArgument(
                f"tool `{name}`: secret= names {parameter!r}, which is not one of its "
                f"parameters ({', '.join(sorted(known)) or 'none'})"
            )
    marked = {
        key
        for key, schema in known.items()
        if isinstance(schema, Mapping)
        and (schema.get("writeOnly") is True or schema.get("format") == "password")
    }
    return frozenset(cast("list[str]", declared)) | marked
