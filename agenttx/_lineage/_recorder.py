"""Tool lineage by value provenance: which tool call consumed a value another call produced.

`LineageRecorder` watches an agent loop (iterations, tool starts, tool ends) and links a call to
an earlier call when an argument value equals a value in that call's result. By default it is
agentfootprint's `toolLineageRecorder` exactly (`docs/lineage.md`), quirks included:

* values are strings of at least `min_value_length` UTF-16 code units and, with `match_numbers`,
  finite numbers compared as JavaScript number text (`12345.0` is `"12345"`, `1e-7` is
  `"1e-7"`); booleans and null never match; object keys are never values;
* object values are visited integer-like keys first (ascending), then in insertion order;
  a scalar is kept at depth `<= max_depth` (a bare argument is depth 0, `{"k": v}` depth 1);
* one producer per value, the most recent `on_tool_end` (last producer wins); an edge needs the
  producer's iteration to be strictly lower than the consumer's, so calls of one iteration never
  link; nothing is retroactive;
* `start_run` with a new run id resets everything; malformed events are ignored, never raised.

`evidence=True` keeps every producer of a value (so a same-iteration re-producer no longer hides
an earlier producer), and gives each edge its argument and result paths, a confidence with the
reasons behind it, and whether the producing call had failed. Its edges are a superset of the
default mode's for the same events; see `docs/lineage.md`.

Deviations a Python port cannot avoid, or chooses: call ids must be non-empty strings (JS accepts
any truthy id); containers are mappings, lists, tuples, dataclass and attrs instances (other
objects, sets and bytes are leaves that never match); a container met again inside itself is
not walked a second time (JS walks it again until `max_depth`; the values found are the same).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from typing import Final, NamedTuple, TypeAlias, TypeGuard, final

import attrs

from .._errors import InvalidArgument
from .._render import dot_quote, mermaid_quote

__all__ = [
    "LineageEdge",
    "LineageGraph",
    "LineageNode",
    "LineageRecorder",
    "is_call_id",
]

#: An iteration number as the agent loop reports it. Any int or float (NaN and infinities
#: too), as JS accepts any number: only the relative order matters.
Iteration: TypeAlias = int | float

UNKNOWN_TOOL: Final = "(unknown)"
#: Labels in DOT and Mermaid show at most this many characters of a value.
LABEL_WIDTH: Final = 32

# The largest canonical JS array index, 2**32 - 2: such keys come first in `Object.values`.
_MAX_ARRAY_INDEX: Final = 4_294_967_294
_ASCII_DIGITS: Final = frozenset("0123456789")

# Evidence scoring (see docs/lineage.md): a base by the kinds of the two sides, adjusted by key
# affinity and penalties, clamped and rounded to two decimals.
_BASE: Final[dict[str, float]] = {
    "exact_string": 0.7,
    "exact_number": 0.4,
    "number_as_text": 0.3,
}
_ADJUST: Final[dict[str, float]] = {
    "same_key": 0.2,
    "key_suffix": 0.15,
    "key_overlap": 0.1,
    "key_clash": -0.1,
    "common_value": -0.3,
    "failed_source": -0.3,
    "earlier_producer": 0.0,
}
_MIN_CONFIDENCE: Final = 0.05
_MAX_CONFIDENCE: Final = 0.99
#: Values that many unrelated calls share; an edge carrying one is weak evidence.
# fmt: off
_COMMON_VALUES: Final = frozenset([
    "true", "false", "none", "null", "nil", "undefined", "ok", "okay", "yes", "no", "success",
    "succeeded", "error", "failed", "failure", "default", "unknown", "pending", "active",
    "enabled", "disabled",
])
# fmt: on
#: Key tokens too generic to show affinity on their own (`user_id` and `order_id` share `id`).
_GENERIC_TOKENS: Final = frozenset(
    {"id", "ids", "key", "keys", "value", "values", "name", "names", "type", "data", "item"}
)
_CAMEL_1: Final = re.compile(r"([a-z0-9])([A-Z])")
_CAMEL_2: Final = re.compile(r"([A-Z]+)([A-Z][a-z])")
_SEPARATORS: Final = re.compile(r"[\W_]+")


# ---------------------------------------------------------------- validation helpers


def _check_count(_instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{attribute.name} must be an int, got {value!r}")
    if value < 0:
        raise InvalidArgument(f"{attribute.name} must be >= 0, got {value}")


def _check_flag(_instance: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{attribute.name} must be a bool, got {value!r}")


def _check_str(_instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str):
        raise InvalidArgument(f"{attribute.name} must be a string, got {value!r}")


def _check_call_id(_instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not is_call_id(value):
        raise InvalidArgument(f"{attribute.name} must be a non-empty string, got {value!r}")


def _check_optional_str(
    _instance: object, attribute: attrs.Attribute[str | None], value: object
) -> None:
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"{attribute.name} must be a string or None, got {value!r}")


def _check_optional_flag(
    _instance: object, attribute: attrs.Attribute[bool | None], value: object
) -> None:
    if value is not None and not isinstance(value, bool):
        raise InvalidArgument(f"{attribute.name} must be a bool or None, got {value!r}")


def _check_optional_step(
    _instance: object, attribute: attrs.Attribute[int | None], value: object
) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidArgument(f"{attribute.name} must be an int or None, got {value!r}")


def _check_iteration(
    _instance: object, attribute: attrs.Attribute[Iteration], value: object
) -> None:
    if not _is_number(value):
        raise InvalidArgument(f"{attribute.name} must be an int or float, got {value!r}")


def _check_confidence(
    _instance: object, attribute: attrs.Attribute[float | None], value: object
) -> None:
    if value is None:
        return
    if not isinstance(value, float) or not 0.0 <= value <= 1.0:
        raise InvalidArgument(f"{attribute.name} must be a float within [0, 1], got {value!r}")


def _check_reasons(
    _instance: object, attribute: attrs.Attribute[tuple[str, ...]], value: object
) -> None:
    if not isinstance(value, tuple) or not all(isinstance(r, str) for r in value):
        raise InvalidArgument(f"{attribute.name} must be a tuple of strings, got {value!r}")


def _check_node(_instance: object, attribute: attrs.Attribute[LineageNode], value: object) -> None:
    if not isinstance(value, LineageNode):
        raise InvalidArgument(f"{attribute.name} must be a LineageNode, got {value!r}")


def _is_number(value: object) -> TypeGuard[int | float]:
    """A JS `number`: an int or float, never a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_call_id(value: object) -> TypeGuard[str]:
    """The JS truthiness check on `toolCallId`, for the string ids this port accepts."""
    return isinstance(value, str) and value != ""


# ---------------------------------------------------------------- value objects


@final
@attrs.frozen(kw_only=True)
class LineageNode:
    """One accepted tool call (a `ToolCallRef`), created by `on_tool_start`.

    `index` is the call's position in `LineageGraph.nodes` (arrival order, from 0): calls may
    share a `call_id`, so the index is the node's identity in exports. `iteration` is the
    recorder's iteration when the call started.

    The recorder leaves `step` None and `voided` False; the adapters that know what agenttx
    did set them (docs/lineage.md#references-and-rewinds): `step` is the step number the call
    was sent as, `voided` says a later rewind undid it, so it is not part of the final lineage.
    """

    index: int = attrs.field(validator=_check_count)
    call_id: str = attrs.field(validator=_check_call_id)
    tool_name: str = attrs.field(validator=_check_str)
    iteration: Iteration = attrs.field(validator=_check_iteration)
    step: int | None = attrs.field(default=None, validator=_check_optional_step)
    voided: bool = attrs.field(default=False, validator=_check_flag)


@final
@attrs.frozen(kw_only=True)
class LineageEdge:
    """Call `target` received, as an argument, `value` that call `source` had returned.

    `value` is the matched value text: a string as it was, a number as JS writes it. The other
    fields are evidence and stay None (or empty) in the default mode. In evidence mode:
    `source_path` and `target_path` locate the value in the result and in the arguments
    (`$`, `$.fcid`, `$.hosts[0]`; the first occurrence in walk order), `confidence` is within
    [0, 1], `reasons` explains it (see docs/lineage.md) and `source_failed` says whether the
    producing `on_tool_end` was marked `error=True`.

    An explicit edge (`explicit=True`) is not a matched value but a `${steps.N.path}` reference
    the target's arguments held to the step the source was
    (docs/lineage.md#references-and-rewinds): `value` is the reference text, `source_key` and
    `target_key` are the keys the dependency graph gives the same reference (the last named
    segment of the path, and the argument that received it), and the evidence fields stay None.
    Value edges leave `source_key` and `target_key` None.
    """

    source: LineageNode = attrs.field(validator=_check_node)
    target: LineageNode = attrs.field(validator=_check_node)
    value: str = attrs.field(validator=_check_str)
    source_path: str | None = attrs.field(default=None, validator=_check_optional_str)
    target_path: str | None = attrs.field(default=None, validator=_check_optional_str)
    confidence: float | None = attrs.field(default=None, validator=_check_confidence)
    reasons: tuple[str, ...] = attrs.field(default=(), validator=_check_reasons)
    source_failed: bool | None = attrs.field(default=None, validator=_check_optional_flag)
    explicit: bool = attrs.field(default=False, validator=_check_flag)
    source_key: str | None = attrs.field(default=None, validator=_check_optional_str)
    target_key: str | None = attrs.field(default=None, validator=_check_optional_str)

    def __attrs_post_init__(self) -> None:
        if self.explicit and (self.source_key is None or self.target_key is None):
            raise InvalidArgument("an explicit edge needs a source_key and a target_key")


def _check_nodes(
    _instance: object, attribute: attrs.Attribute[tuple[LineageNode, ...]], value: object
) -> None:
    if not isinstance(value, tuple):
        raise InvalidArgument(f"{attribute.name} must be a tuple, got {value!r}")
    for position, node in enumerate(value):
        if not isinstance(node, LineageNode) or node.index != position:
            raise InvalidArgument(
                f"nodes[{position}] must be a LineageNode with index {position}, got {node!r}"
            )


def _check_edges(
    instance: LineageGraph, attribute: attrs.Attribute[tuple[LineageEdge, ...]], value: object
) -> None:
    if not isinstance(value, tuple):
        raise InvalidArgument(f"{attribute.name} must be a tuple, got {value!r}")
    nodes = instance.nodes
    for position, edge in enumerate(value):
        if not isinstance(edge, LineageEdge):
            raise InvalidArgument(f"edges[{position}] must be a LineageEdge, got {edge!r}")
        for end in (edge.source, edge.target):
            # Identity first: a node with a NaN iteration is not equal to itself.
            if end.index >= len(nodes) or (nodes[end.index] is not end and nodes[end.index] != end):
                raise InvalidArgument(f"edges[{position}] refers to a node not in nodes: {end!r}")


@final
@attrs.frozen(kw_only=True)
class LineageGraph:
    """A snapshot of a recorder's lineage: its calls and the value edges between them.

    `nodes` are in `on_tool_start` order, every accepted call included (calls without edges and
    calls with a repeated id too). `edges` are in consumer order, and within one consumer in the
    order its argument values were walked; an adapter that adds explicit edges puts a consumer's
    explicit edges first, in the order of its references. Edge endpoints are entries of `nodes`
    (checked on construction). `evidence` says which mode recorded it. The exports are
    deterministic.
    """

    nodes: tuple[LineageNode, ...] = attrs.field(default=(), validator=_check_nodes)
    edges: tuple[LineageEdge, ...] = attrs.field(default=(), validator=_check_edges)
    evidence: bool = attrs.field(default=False, validator=_check_flag)

    def to_dot(self) -> str:
        """The graph in Graphviz DOT, calls of one iteration ranked together.

        Edges are labelled with the value (at most `LABEL_WIDTH` characters) and, in evidence
        mode, the paths and the confidence; edges from failed calls are dashed. Explicit edges
        are bold and labelled with the reference and its keys; voided calls are dashed boxes.
        """
        lines = ["digraph lineage {", "  rankdir=LR;", "  node [shape=box];"]
        lines.extend(
            f"  n{node.index} [label={dot_quote(_node_label(node))}"
            f"{', style=dashed' if node.voided else ''}];"
            for node in self.nodes
        )
        for group in _iteration_groups(self.nodes):
            if len(group) > 1:
                members = " ".join(f"n{node.index};" for node in group)
                lines.append(f"  {{ rank=same; {members} }}")
        for edge in self.edges:
            label = dot_quote("\n".join(_edge_label_parts(edge)))
            style = ", style=dashed" if edge.source_failed else ""
            if edge.explicit:
                style = ", style=bold"
            lines.append(f"  n{edge.source.index} -> n{edge.target.index} [label={label}{style}];")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def to_mermaid(self) -> str:
        """The graph as a Mermaid flowchart, labelled as `to_dot`.

        Edges from failed sources are dotted, explicit edges thick.
        """
        lines = ["flowchart LR"]
        lines.extend(f"  n{node.index}[{mermaid_quote(_node_label(node))}]" for node in self.nodes)
        for edge in self.edges:
            arrow = "==>" if edge.explicit else "-.->" if edge.source_failed else "-->"
            label = mermaid_quote(", ".join(_edge_label_parts(edge)))
            lines.append(f"  n{edge.source.index} {arrow}|{label}| n{edge.target.index}")
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        """The graph as indented JSON with sorted keys and full values.

        `{"evidence": bool, "nodes": [...], "edges": [...]}`; edges refer to nodes by `index`.
        A non-finite iteration is written as JS writes it (`"NaN"`), so the text is strict JSON.
        Evidence fields appear only in evidence mode; a node's `step` only when it is known and
        `voided` only when true; an edge's `explicit`, `source_key` and `target_key` only on an
        explicit edge. So a graph of values alone exports as it did before those fields existed.
        """
        nodes: list[dict[str, object]] = []
        for node in self.nodes:
            described: dict[str, object] = {
                "index": node.index,
                "call_id": node.call_id,
                "tool_name": node.tool_name,
                "iteration": node.iteration
                if math.isfinite(node.iteration)
                else _js_number_text(node.iteration),
            }
            if node.step is not None:
                described["step"] = node.step
            if node.voided:
                described["voided"] = True
            nodes.append(described)
        edges: list[dict[str, object]] = []
        for edge in self.edges:
            entry: dict[str, object] = {
                "source": edge.source.index,
                "target": edge.target.index,
                "value": edge.value,
            }
            if edge.explicit:
                entry.update(explicit=True, source_key=edge.source_key, target_key=edge.target_key)
            if self.evidence:
                entry.update(
                    source_path=edge.source_path,
                    target_path=edge.target_path,
                    confidence=edge.confidence,
                    reasons=list(edge.reasons),
                    source_failed=edge.source_failed,
                )
            edges.append(entry)
        document = {"evidence": self.evidence, "nodes": nodes, "edges": edges}
        return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _node_label(node: LineageNode) -> str:
    iteration = _js_number_text(node.iteration)
    step = "" if node.step is None else f"step {node.step}, "
    voided = ", voided" if node.voided else ""
    return f"{node.call_id}: {node.tool_name} ({step}iteration {iteration}{voided})"


def _iteration_groups(nodes: tuple[LineageNode, ...]) -> list[list[LineageNode]]:
    """Nodes grouped by iteration text, groups in order of first appearance."""
    groups: dict[str, list[LineageNode]] = {}
    for node in nodes:
        groups.setdefault(_js_number_text(node.iteration), []).append(node)
    return list(groups.values())


def _edge_label_parts(edge: LineageEdge) -> list[str]:
    parts = [_truncate(edge.value)]
    if edge.explicit:
        parts.append(f"{edge.source_key} -> {edge.target_key}")
    if edge.source_path is not None and edge.target_path is not None:
        parts.append(f"{edge.source_path} -> {edge.target_path}")
    if edge.confidence is not None:
        parts.append(f"confidence {edge.confidence:.2f}")
    return parts


def _truncate(text: str) -> str:
    return text if len(text) <= LABEL_WIDTH else text[: LABEL_WIDTH - 1] + "\N{HORIZONTAL ELLIPSIS}"


# ---------------------------------------------------------------- JS number text


def _js_number_text(number: float) -> str:
    """`String(number)` in JavaScript (`Number.prototype.toString()`), for any float or int.

    Ints go through float first, as JS holds every number as a double (`2**53 + 1` prints as
    `9007199254740992`); an int too large for a float is `Infinity`, as in JS.
    """
    try:
        value = float(number)
    except OverflowError:
        value = math.inf if number > 0 else -math.inf
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "0"  # -0 too
    return ("-" if value < 0 else "") + _js_positive_text(abs(value))


def _js_positive_text(value: float) -> str:
    """ECMAScript's Number::toString for a finite `value > 0`."""
    # repr gives the shortest digits that round-trip, the digits ECMAScript asks for.
    mantissa, _, exponent_text = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    raw = (whole + fraction).lstrip("0")
    digits = raw.rstrip("0")
    # The value is 0.digits * 10**n: k digits, the decimal point after the n-th.
    k = len(digits)
    n = int(exponent_text or "0") - len(fraction) + len(raw)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    power = n - 1
    head = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{head}e{'+' if power >= 0 else '-'}{abs(power)}"


def _utf16_length(text: str) -> int:
    """The JS `length` of a string: UTF-16 code units (a character beyond U+FFFF counts 2)."""
    if text.isascii():
        return len(text)
    return len(text) + sum(1 for char in text if ord(char) > 0xFFFF)


# ---------------------------------------------------------------- flattening


class _Found(NamedTuple):
    """Where a value first appeared: its path, the nearest object key, and its JSON kind."""

    path: str
    key: str | None
    kind: str  # "string" or "number"


_Item: TypeAlias = tuple[object, int, str, str | None]


def _array_index(key: object) -> int | None:
    """The JS array index a key stands for (`"7"` or 7, up to 2**32 - 2), else None."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key if 0 <= key <= _MAX_ARRAY_INDEX else None
    if (
        isinstance(key, str)
        and key
        and set(key) <= _ASCII_DIGITS
        and (key == "0" or key[0] != "0")
        and len(key) <= len(str(_MAX_ARRAY_INDEX))
    ):
        index = int(key)
        return index if index <= _MAX_ARRAY_INDEX else None
    return None


def _object_items(value: object) -> list[tuple[object, object]] | None:
    """The (key, value) pairs of an object-like value in JS `Object.values` order, else None."""
    if isinstance(value, Mapping):
        pairs: list[tuple[object, object]] = list(value.items())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        pairs = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    elif attrs.has(cls := type(value)):
        pairs = [(a.name, getattr(value, a.name)) for a in attrs.fields(cls)]
    else:
        return None
    indexed = [(index, pair) for pair in pairs if (index := _array_index(pair[0])) is not None]
    if not indexed:
        return pairs
    indexed.sort(key=lambda entry: entry[0])  # stable: equal indexes keep insertion order
    others = [pair for pair in pairs if _array_index(pair[0]) is None]
    return [pair for _, pair in indexed] + others


def _child_path(path: str, key: object) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}"
    text = key if isinstance(key, str) else str(key)
    return f"{path}[{json.dumps(text, ensure_ascii=False)}]"


def _collect_values(
    root: object, *, min_length: int, match_numbers: bool, max_depth: int
) -> dict[str, _Found]:
    """`collectValues(root, 0, out)`: matchable value texts in first-appearance order.

    A depth-first pre-order walk. A value at depth > `max_depth` is skipped; strings need
    `min_length` UTF-16 units; finite numbers count only with `match_numbers`, as JS number
    text, whatever their length. Iterative, so deep values cannot exhaust the Python stack.
    """
    found: dict[str, _Found] = {}
    stack: list[_Item | int] = [(root, 0, "$", None)]
    active: set[int] = set()  # ids of the containers on the current path
    while stack:
        item = stack.pop()
        if isinstance(item, int):  # leaving a container
            active.discard(item)
            continue
        value, depth, path, key = item
        if value is None or depth > max_depth:
            continue
        if isinstance(value, str):
            if _utf16_length(value) >= min_length and value not in found:
                found[value] = _Found(path, key, "string")
            continue
        if _is_number(value):
            if match_numbers:
                text = _js_number_text(value)
                if text not in found and _is_finite_text(text):
                    found[text] = _Found(path, key, "number")
            continue
        children: list[_Item]
        if isinstance(value, (list, tuple)):
            children = [(child, depth + 1, f"{path}[{i}]", key) for i, child in enumerate(value)]
        else:
            pairs = _object_items(value)
            if pairs is None:  # booleans and anything else that is not JSON-like
                continue
            children = [
                (child, depth + 1, _child_path(path, k), k if isinstance(k, str) else str(k))
                for k, child in pairs
            ]
        marker = id(value)
        if marker in active:
            continue
        active.add(marker)
        stack.append(marker)
        stack.extend(reversed(children))
    return found


def _is_finite_text(text: str) -> bool:
    return text not in {"NaN", "Infinity", "-Infinity"}


# ---------------------------------------------------------------- evidence scoring


class _Produced(NamedTuple):
    """One `on_tool_end` that produced a value (evidence mode keeps them all)."""

    node: LineageNode
    found: _Found
    failed: bool


def _key_tokens(key: str | None) -> tuple[str, ...]:
    if key is None:
        return ()
    spaced = _CAMEL_2.sub(r"\1 \2", _CAMEL_1.sub(r"\1 \2", key))
    return tuple(token.lower() for token in _SEPARATORS.split(spaced) if token)


def _affinity(source_key: str | None, target_key: str | None) -> str | None:
    """How the result key and the argument key agree, as a reason, or None when neutral."""
    source, target = _key_tokens(source_key), _key_tokens(target_key)
    if not source or not target:
        return None
    if source == target:
        return "same_key"
    shorter, longer = sorted((source, target), key=len)
    if longer[-len(shorter) :] == shorter:
        return "key_suffix"
    source_specific = set(source) - _GENERIC_TOKENS
    target_specific = set(target) - _GENERIC_TOKENS
    if source_specific & target_specific:
        return "key_overlap"
    if source_specific and target_specific:
        return "key_clash"
    return None


def _score(
    value: str, produced: _Produced, consumed: _Found, *, earlier: bool
) -> tuple[float, tuple[str, ...]]:
    """The confidence of an evidence edge and the reasons that made it (docs/lineage.md)."""
    kinds = {produced.found.kind, consumed.kind}
    if kinds == {"string"}:
        reasons = ["exact_string"]
    elif kinds == {"number"}:
        reasons = ["exact_number"]
    else:
        reasons = ["number_as_text"]
    affinity = _affinity(produced.found.key, consumed.key)
    if affinity is not None:
        reasons.append(affinity)
    if value.casefold() in _COMMON_VALUES:
        reasons.append("common_value")
    if produced.failed:
        reasons.append("failed_source")
    if earlier:
        reasons.append("earlier_producer")
    confidence = _BASE[reasons[0]] + sum(_ADJUST[reason] for reason in reasons[1:])
    confidence = min(max(confidence, _MIN_CONFIDENCE), _MAX_CONFIDENCE)
    return round(confidence, 2), tuple(reasons)


# ---------------------------------------------------------------- the recorder


@final
@attrs.define(kw_only=True, eq=False, repr=False)
class LineageRecorder:
    """Records tool lineage by value provenance from an agent loop's events.

    Feed it, in the order they happen: `start_run(run_id)` at each run's start, `on_iteration(n)`
    when the model is called, `on_tool_start(...)` and `on_tool_end(...)` around each tool call.
    Read it with `lineage()`. Options (keyword-only, validated, `InvalidArgument` otherwise):
    `min_value_length` (int >= 0, 0 honoured), `match_numbers`, `max_depth` (int >= 0; 0 links
    bare scalars only) and `evidence` (see the module docstring and docs/lineage.md).

    Events never raise: a malformed one (an empty or non-string call id, a non-numeric
    iteration, the end of an unknown call) is ignored, as agentfootprint ignores it. Memory
    grows with the values seen in a run until the next run or `clear()`. Not thread-safe.
    Compared by identity and hashable; `repr` shows the counts only, never the values seen.
    """

    min_value_length: int = attrs.field(
        default=4, validator=_check_count, on_setattr=attrs.setters.frozen
    )
    match_numbers: bool = attrs.field(
        default=False, validator=_check_flag, on_setattr=attrs.setters.frozen
    )
    max_depth: int = attrs.field(default=6, validator=_check_count, on_setattr=attrs.setters.frozen)
    evidence: bool = attrs.field(
        default=False, validator=_check_flag, on_setattr=attrs.setters.frozen
    )
    _iteration: Iteration = attrs.field(init=False, default=0)
    _run_id: str | None = attrs.field(init=False, default=None)
    _nodes: list[LineageNode] = attrs.field(init=False, factory=list)
    _edges: list[LineageEdge] = attrs.field(init=False, factory=list)
    # Default mode: value -> the last producer. Evidence mode: value -> every production.
    _producers: dict[str, LineageNode] = attrs.field(init=False, factory=dict)
    _history: dict[str, list[_Produced]] = attrs.field(init=False, factory=dict)
    _by_id: dict[str, LineageNode] = attrs.field(init=False, factory=dict)

    def __repr__(self) -> str:
        return f"<LineageRecorder calls={len(self._nodes)} edges={len(self._edges)}>"

    @property
    def iteration(self) -> Iteration:
        """The current iteration: 0 until `on_iteration`, and again after a run reset."""
        return self._iteration

    @property
    def run_id(self) -> str | None:
        """The run id of the last `start_run`, or None (initially and after `clear()`)."""
        return self._run_id

    def _reset(self) -> None:
        self._iteration = 0
        self._nodes.clear()
        self._edges.clear()
        self._producers.clear()
        self._history.clear()
        self._by_id.clear()

    def start_run(self, run_id: str) -> None:
        """Begin run `run_id`: forget everything if it differs from the current run's id.

        The first `start_run` (and the first after `clear()`) never resets, so events recorded
        before it belong to that run. The same id again is not a new run. Switching A, B, A
        resets twice: runs are not stored side by side. Raises `InvalidArgument` if `run_id`
        is not a string (a programming error, not a malformed event).
        """
        if not isinstance(run_id, str):
            raise InvalidArgument(f"run_id must be a string, got {run_id!r}")
        if self._run_id is not None and run_id != self._run_id:
            self._reset()
        self._run_id = run_id

    def on_iteration(self, n: Iteration) -> None:
        """Set the current iteration to `n` (any int or float; not monotonic, NaN allowed).

        Anything else (a bool, None, the string "2") is ignored and leaves it unchanged.
        """
        if _is_number(n):
            self._iteration = n

    def on_tool_start(self, call_id: str, tool_name: str | None, args: object) -> None:
        """Record a call that starts now, and the edges from earlier producers of its args.

        Ignored when `call_id` is not a non-empty string. A non-string `tool_name` becomes
        "(unknown)". A repeated `call_id` adds another node, which then owns the id. An edge
        links each distinct argument value to its producer when the producer's iteration is
        strictly lower than the current one.
        """
        if not is_call_id(call_id):
            return
        node = LineageNode(
            index=len(self._nodes),
            call_id=call_id,
            tool_name=tool_name if isinstance(tool_name, str) else UNKNOWN_TOOL,
            iteration=self._iteration,
        )
        self._nodes.append(node)
        self._by_id[call_id] = node
        values = self._values(args)
        if self.evidence:
            self._link_with_evidence(node, values)
            return
        for value in values:
            producer = self._producers.get(value)
            if producer is not None and producer.iteration < node.iteration:
                self._edges.append(LineageEdge(source=producer, target=node, value=value))

    def _link_with_evidence(self, node: LineageNode, values: dict[str, _Found]) -> None:
        for value, consumed in values.items():
            history = self._history.get(value)
            if not history:
                continue
            # The most recent production from an earlier iteration. When the very last one
            # qualifies, this is the default mode's edge; otherwise the default has none.
            chosen = next((p for p in reversed(history) if p.node.iteration < node.iteration), None)
            if chosen is None:
                continue
            confidence, reasons = _score(value, chosen, consumed, earlier=chosen is not history[-1])
            self._edges.append(
                LineageEdge(
                    source=chosen.node,
                    target=node,
                    value=value,
                    source_path=chosen.found.path,
                    target_path=consumed.path,
                    confidence=confidence,
                    reasons=reasons,
                    source_failed=chosen.failed,
                )
            )

    def on_tool_end(self, call_id: str, result: object = None, *, error: bool = False) -> None:
        """Register the values of `result` as produced by the call `call_id` (its latest node).

        Ignored when `call_id` is not a non-empty string or no call with that id started. In the
        default mode each value's producer is overwritten (last producer wins) and `error` is
        ignored: an error message is a value like any other, as in agentfootprint. In evidence
        mode every production is kept and `error=True` marks the edges from it. Ending a call
        twice registers both results.
        """
        if not is_call_id(call_id):
            return
        node = self._by_id.get(call_id)
        if node is None:
            return
        values = self._values(result)
        if self.evidence:
            failed = bool(error)
            for value, found in values.items():
                self._history.setdefault(value, []).append(_Produced(node, found, failed))
            return
        for value in values:
            self._producers[value] = node

    def _values(self, value: object) -> dict[str, _Found]:
        return _collect_values(
            value,
            min_length=self.min_value_length,
            match_numbers=self.match_numbers,
            max_depth=self.max_depth,
        )

    def lineage(self) -> LineageGraph:
        """A snapshot of the calls and edges so far; later events do not change it."""
        return LineageGraph(
            nodes=tuple(self._nodes), edges=tuple(self._edges), evidence=self.evidence
        )

    def clear(self) -> None:
        """Forget everything, the run id too: the next `start_run` never resets."""
        self._reset()
        self._run_id = None
