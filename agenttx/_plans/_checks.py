"""Checks a plan run makes before anything runs, and the check of each tool's output.

`check_limit`, `check_capacities`, `check_rate_limits` and `check_run_id` refuse bad arguments
with `InvalidArgument` naming them; `optional_prerequisites` reads which prerequisites a node
can do without (its `optional` and `fallback` inputs); `output_check` compiles a tool's declared
`TypedDict` return type once, so that an output missing a field (or with a field of the wrong
type) fails its node with a hint naming the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, final

from .._errors import InvalidArgument
from .._tools import Failure, compile_schema, schema_for
from ..stores import MemoryStore, is_store
from ._scheduler import RateLimit

if TYPE_CHECKING:
    from .._json import JSONValue
    from .._tools import Tool, Validator
    from ..stores import Store
    from ._model import Node

__all__ = [
    "OutputCheck",
    "check_capacities",
    "check_limit",
    "check_rate_limits",
    "check_run_id",
    "check_store",
    "optional_prerequisites",
    "output_check",
]

#: What a run id may be: it is also the id of the run's store transaction.
_RUN_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")


def check_store(store: object, run_id: str) -> Store:
    """`store`, or a new private `MemoryStore` for None; `InvalidArgument` for what is not a
    store, or a store in which `run_id` is already an open transaction (another run's)."""
    if store is None:
        return MemoryStore()
    if not is_store(store):
        raise InvalidArgument(f"store must be a Store, got {store!r:.80}")
    if store.is_open(run_id):
        raise InvalidArgument(
            f"run_id {run_id!r} is a transaction already open in the store; use another"
        )
    return store


def check_run_id(run_id: object) -> str:
    """The run id, or `InvalidArgument` unless it is 1-128 letters, digits, `_` or `-`."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise InvalidArgument(
            f"run_id must be 1-128 characters of letters, digits, `_` and `-`, got {run_id!r:.80}"
        )
    return run_id


def check_limit(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{name} must be an integer >= {minimum}, got {value!r:.80}")
    return value


def check_capacities(resources: object) -> dict[str, int]:
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise InvalidArgument(
            f"resources must be a mapping of names to capacities, got {resources!r:.80}"
        )
    return {
        str(name): check_limit(f"capacity of resource {name!r}", capacity, minimum=0)
        for name, capacity in resources.items()
    }


def check_rate_limits(rate_limits: object) -> dict[str, RateLimit]:
    """`{tool: RateLimit}`, or `{tool: starts per second}` (a bucket of one)."""
    if rate_limits is None:
        return {}
    if not isinstance(rate_limits, Mapping):
        raise InvalidArgument(
            f"rate_limits must be a mapping of tool names, got {rate_limits!r:.80}"
        )
    limits: dict[str, RateLimit] = {}
    for tool, limit in rate_limits.items():
        if isinstance(limit, RateLimit):
            limits[str(tool)] = limit
        elif (
            isinstance(limit, (int, float))
            and not isinstance(limit, bool)
            and math.isfinite(limit)
            and limit > 0
        ):
            limits[str(tool)] = RateLimit(per_second=float(limit))
        else:
            raise InvalidArgument(
                f"rate limit of tool {tool!r} must be a number of starts per second > 0 or a "
                f"RateLimit, got {limit!r:.80}"
            )
    return limits


#: The empty set of node ids, shared (each `frozenset()` call makes a new object).
_NO_NODES: frozenset[str] = frozenset()


def optional_prerequisites(node: Node) -> frozenset[str]:
    """The prerequisites whose failure still releases `node`: those it references only in
    inputs it lists as optional or gives a fallback for, and does not list in `after`."""
    if not (node.optional or node.fallback):
        return _NO_NODES  # shared: one empty set, not one per node
    tolerant = set(node.optional) | set(node.fallback)
    needed: dict[str, bool] = {}
    for ref in node.input_refs:
        if ref.namespace == "initial":
            continue
        needed[ref.namespace] = needed.get(ref.namespace, True) and ref.param in tolerant
    return frozenset(name for name, ok in needed.items() if ok and name not in node.after)


@final
class OutputCheck:
    """A tool's declared return type (TypedDict fields), compiled once per run."""

    __slots__ = ("fields", "type_name")

    def __init__(self, type_name: str, fields: tuple[tuple[str, bool, Validator], ...]) -> None:
        self.type_name = type_name
        self.fields = fields

    def failure(self, tool: str, output: JSONValue) -> Failure | None:
        """Why `output` does not fit the declared type, naming the field; None if it does."""
        if not isinstance(output, dict):
            return Failure(f"{self._where(tool)}: expected an object, got {type(output).__name__}")
        for name, required, validator in self.fields:
            if name not in output:
                if required:
                    return Failure(f"{self._where(tool)}: field `{name}` is missing", key=name)
                continue
            _, violation = validator.check(output[name])
            if violation is not None:
                return Failure(
                    f"{self._where(tool)}: field `{name}`: {violation.message}", key=name
                )
        return None

    def _where(self, tool: str) -> str:
        return f"output of tool '{tool}' does not match its return type {self.type_name}"


def output_check(tool: Tool[Any, Any]) -> OutputCheck | None:
    """The check of the tool's declared return type (its TypedDict's fields), or None.

    Compiled once per return type and kept (a few hundred at most): tools made afresh for
    each run (closures) share their types' compiled checks. The fields are the return type's
    (`read_signature` reads them from it), so the type alone is the key.
    """
    returns = tool.signature.returns
    if not returns.fields:
        return None
    annotation = returns.annotation
    try:
        found = _CHECKS.get(annotation)
    except TypeError:  # an unhashable annotation: compiled each time
        return _compile_check(annotation, returns.fields)
    if found is None:
        found = _compile_check(annotation, returns.fields)
        if len(_CHECKS) >= _MAX_CHECKS:
            _CHECKS.clear()  # a program that makes return types without end: start again
        _CHECKS[annotation] = found
    return found


def _compile_check(annotation: object, fields: tuple[Any, ...]) -> OutputCheck:
    type_name = getattr(annotation, "__name__", "its TypedDict")
    compiled = tuple(
        (field.name, field.required, compile_schema(schema_for(field.annotation)))
        for field in fields
    )
    return OutputCheck(str(type_name), compiled)


#: The compiled checks, by return type (at most `_MAX_CHECKS`); a race compiles one twice.
_CHECKS: dict[object, OutputCheck] = {}
_MAX_CHECKS: Final = 256
