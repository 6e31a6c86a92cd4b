"""`${...}` references: the grammar, and resolution of `${steps.N.path}` against step outputs.

Grammar (`docs/protocol.md#reference-grammar`)::

    ${steps.N}  ${steps.N.seg.seg...}      N = [0-9]+, seg = [A-Za-z0-9_-]+

plus one addition: `$${` is an escape that writes a literal `${`. In an interactive step, text
that does not match the grammar is kept as it is (`${steps.x}` stays `${steps.x}`) and records
no dependency. Plans use two more namespaces, `${initial.field...}` and `${node_id.field...}`,
and are strict: there, any `${` that is not a well-formed reference is a `ReferenceSyntaxError`.

Resolution is pure: it reads the outputs it is given and never re-scans a value it substituted,
so a tool output containing `${steps.1.secret}` passes through as text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias, final

import attrs

from ._errors import InvalidArgument, JSONValueError, ReferenceSyntaxError
from ._json import JSONValue, canonical_dumps, check_json

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = [
    "Dependency",
    "PlanReference",
    "PlanValue",
    "Reference",
    "Resolution",
    "compile_plan_value",
    "is_path_segment",
    "is_plan_namespace",
    "named_dependencies",
    "parse_template",
    "resolve_plan_reference",
    "resolve_plan_value",
    "resolve_references",
    "resolve_value",
]

_SEGMENT: Final = r"[A-Za-z0-9_\-]+"
_ESCAPE: Final = "$${"
_STEPS_TOKEN: Final = re.compile(
    rf"(?P<escape>\$\$\{{)|\$\{{steps\.(?P<step>[0-9]+)(?P<path>(?:\.{_SEGMENT})*)\}}"
)
_PLAN_TOKEN: Final = re.compile(
    rf"(?P<escape>\$\$\{{)|\$\{{(?P<ns>[A-Za-z_][A-Za-z0-9_\-]*)(?P<path>(?:\.{_SEGMENT})*)\}}"
)
_OPEN: Final = re.compile(r"\$\{")
_NAMESPACE_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_SEGMENT_RE: Final = re.compile(_SEGMENT)
#: Step ids in references stop at 2**32 - 1: a larger id never names a step, whatever `outputs`
#: holds (`docs/protocol.md#resolution-errors`).
_MAX_STEP_ID: Final = 2**32 - 1
_MAX_STEP_DIGITS: Final = len(str(_MAX_STEP_ID))
#: What a step id past u32 parses to: one id that never names a step.
_NO_STEP: Final = _MAX_STEP_ID + 1
#: No list is longer than sys.maxsize (19 digits), so a longer index is never present.
_MAX_INDEX_DIGITS: Final = 19


@attrs.frozen(kw_only=True)
class Reference:
    """One parsed reference, as written in `text`."""

    text: str
    namespace: str  # "steps", "initial" or a plan node id
    step: int | None  # the step id, for the "steps" namespace only: 2**32 for any id past u32
    path: tuple[str, ...]


@attrs.frozen(kw_only=True, weakref_slot=False)  # no weakref slot: see `_UnfrozenDependency`
class Dependency:
    """An explicit dependency found by resolving one reference.

    `from_step` produced the value; `source_key` names it in that step's output (the last
    non-numeric path segment, else the consuming field); `target_key` is the consuming field (the
    key of the nearest enclosing object, or `source_key` when the arguments are a bare string).
    """

    from_step: int
    source_key: str
    target_key: str


class _UnfrozenDependency:
    """`Dependency`'s slots without its frozen `__setattr__`: `_dependency` fills one with plain
    attribute stores, then makes it a `Dependency` (`__class__`), frozen from then on; a
    resolved reference costs a third less than through the class's `__init__`. The layouts
    must match for the class change: the same slots and no weakref slot."""

    __slots__ = tuple(field.name for field in attrs.fields(Dependency))


@attrs.frozen(kw_only=True)
class Resolution:
    """The outcome of `resolve_references`.

    On success `error` is None and `value` is the resolved arguments. On failure `error` is one
    of the two messages of `docs/protocol.md#resolution-errors`, `value` is the arguments
    unresolved, and `dependencies` holds those collected before the failure (plus, for a
    missing key, the failing one), so the caller can still record them in the dependency graph.
    """

    value: JSONValue
    dependencies: tuple[Dependency, ...]
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when every reference resolved."""
        return self.error is None


Piece: TypeAlias = str | Reference


def parse_template(text: str, *, mode: Literal["steps", "plan"] = "steps") -> tuple[Piece, ...]:
    """Split `text` into literal strings and references, left to right.

    Escapes are applied (`$${` becomes a literal `${`). In `steps` mode anything that is not a
    valid `${steps.N.path}` is literal. In `plan` mode the namespaces are `initial` and node ids,
    and a malformed reference raises `ReferenceSyntaxError` naming its position and problem.
    A `text` that is not a string raises `InvalidArgument`.
    """
    if not isinstance(text, str):
        raise InvalidArgument(f"text must be a string, got {type(text).__name__}")
    return tuple(
        piece if isinstance(piece, str) else _reference(piece, mode)
        for piece in _tokenize(text, mode)
    )


def _tokenize(text: str, mode: str) -> list[str | re.Match[str]]:
    """The one tokenizer of the grammar: literal runs and reference matches, left to right.

    Escapes are applied and merged into the literal around them, so two literals never follow
    each other and no literal is empty. In `plan` mode a `${` that starts no reference raises.
    Everything that reads `${...}` (`parse_template`, resolution) goes through here.
    """
    token = _STEPS_TOKEN if mode == "steps" else _PLAN_TOKEN
    whole = token.fullmatch(text)
    if whole is not None and whole.group("escape") is None:  # the common `${steps.1.id}`
        return [whole]
    pieces: list[str | re.Match[str]] = []
    position = 0
    if mode == "steps" and _ESCAPE not in text:  # no escape to merge, nothing to reject
        for match in token.finditer(text):
            start, end = match.span()
            if start > position:
                pieces.append(text[position:start])
            pieces.append(match)
            position = end
        if position < len(text):
            pieces.append(text[position:])
        return pieces
    strict = mode == "plan"
    literal: list[str] = []
    for match in token.finditer(text):
        start = match.start()
        if strict:
            _reject_malformed(text, position, start)
        literal.append(text[position:start])
        position = match.end()
        if match.group("escape"):
            literal.append("${")
            continue
        if literal_text := "".join(literal):
            pieces.append(literal_text)
        literal.clear()
        pieces.append(match)
    if strict:
        _reject_malformed(text, position, len(text))
    if literal_text := "".join(literal) + text[position:]:
        pieces.append(literal_text)
    return pieces


def _reference(match: re.Match[str], mode: str) -> Reference:
    path = tuple(match.group("path").split(".")[1:])
    if mode == "steps":
        return Reference(text=match.group(0), namespace="steps", step=_step_id(match), path=path)
    namespace = match.group("ns")
    if namespace == "steps":
        raise ReferenceSyntaxError(
            text=match.string,
            position=match.start(),
            problem="`${steps.N}` references belong to interactive transactions; "
            "in a plan, reference a node by its id",
        )
    if namespace == "initial" and not path:
        raise ReferenceSyntaxError(
            text=match.string,
            position=match.start(),
            problem="`${initial}` needs a field, as in `${initial.customer_email}`",
        )
    return Reference(text=match.group(0), namespace=namespace, step=None, path=path)


def _step_id(match: re.Match[str]) -> int:
    """The step id of a `steps` match; `_NO_STEP` for one past u32, which names no step.

    Counting the digits first keeps `int()` off a run of thousands of them, which would raise
    past the interpreter's int-to-str limit. Leading zeros do not count: `007` is step 7.
    """
    digits = match.group("step").lstrip("0")
    if len(digits) > _MAX_STEP_DIGITS:
        return _NO_STEP
    return min(int(digits or "0"), _NO_STEP)


def _reject_malformed(text: str, start: int, end: int) -> None:
    """Raise for the first `${` between start and end (none there is a valid reference)."""
    opening = _OPEN.search(text, start, end)
    if opening is None:
        return
    position = opening.start()
    body_start = opening.end()
    close = text.find("}", body_start)
    if close == -1:
        problem = "no closing `}`"
    else:
        body = text[body_start:close]
        head, _, _ = body.partition(".")
        if not body:
            problem = "empty reference `${}`"
        elif not _NAMESPACE_RE.fullmatch(head):
            problem = f"`{head}` is not a namespace: use `initial` or a node id"
        else:
            # Some segment is bad, or the token regex would have matched here.
            bad = next((s for s in body.split(".")[1:] if not _SEGMENT_RE.fullmatch(s)), "")
            if bad:
                problem = f"path segment `{bad}` may only use letters, digits, `_` and `-`"
            else:
                problem = "empty path segment (two dots, or a trailing dot)"
    raise ReferenceSyntaxError(text=text, position=position, problem=problem)


class _Unresolved(Exception):
    def __init__(self, message: str) -> None:
        self.message = message


def resolve_references(
    arguments: object,
    outputs: Mapping[int, JSONValue],
    *,
    current_step: int,
    max_bytes: int | None = None,
) -> Resolution:
    """Resolve every `${steps.N.path}` in the string values of `arguments`.

    `outputs` maps each completed (succeeded, not rewound) step to its output; only steps below
    `current_step` may be referenced. Object keys are never scanned. A string that is exactly one
    reference becomes the referenced value with its JSON type (a copy: the result never aliases
    `outputs`); references inside longer strings are interpolated, strings verbatim and other
    values as compact JSON with sorted keys. Traversal order, and so the order of the returned
    dependencies, is: object fields in sorted key order, then references left to right; the
    resolved value keeps every object's keys in the order given (docs/protocol.md#key-order).

    `max_bytes` bounds what the references insert, in total: each string counts a byte a
    character, other values at least their compact JSON size. The first reference past it fails
    the resolution, so a few bytes of references to a large output (`["${steps.1}", ...]`)
    cannot make the resolved arguments, or their copy, many times larger than both. None: no
    bound.

    Raises `JSONValueError` if `arguments` is not a JSON value, and
    `InvalidArgument` (naming the argument) if `outputs` is not a mapping of int step ids,
    `current_step` is not an int, or `max_bytes` is neither None nor an int >= 0. A reference
    that cannot be resolved is not raised: it is reported in the returned `Resolution.error`.
    """
    if max_bytes is not None and (
        not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0
    ):
        raise InvalidArgument(f"max_bytes must be None or an int >= 0, got {max_bytes!r:.40}")
    if not isinstance(current_step, int) or isinstance(current_step, bool):
        raise InvalidArgument(f"current_step must be an int, got {type(current_step).__name__}")
    _check_outputs(outputs)
    value = check_json(arguments, what="arguments")
    resolved, dependencies, error = resolve_value(value, outputs, current_step, max_bytes=max_bytes)
    return Resolution(value=resolved, dependencies=dependencies, error=error)


def _check_outputs(outputs: object) -> None:
    """`InvalidArgument` unless `outputs` is a mapping keyed by int step ids.

    Its values are not walked here: they are read as references reach them, and what cannot
    be written into text fails the resolution (`Resolution.error`)."""
    if not isinstance(outputs, Mapping):
        raise InvalidArgument(
            f"outputs must be a mapping of step id to output, got {type(outputs).__name__}"
        )
    for step in outputs:
        if not isinstance(step, int) or isinstance(step, bool):
            raise InvalidArgument(
                f"outputs must be keyed by int step ids, got the key {step!r:.40} "
                f"({type(step).__name__})"
            )


def resolve_value(
    value: JSONValue,
    outputs: Mapping[int, JSONValue],
    current_step: int,
    *,
    max_bytes: int | None = None,
) -> tuple[JSONValue, tuple[Dependency, ...], str | None]:
    """`resolve_references` on a checked JSON value, as a plain `(value, dependencies, error)`.

    For the transaction's hot path, which has checked the value already. Never raises for a
    checked value and checked outputs: whatever the agent wrote (step ids or indices thousands
    of digits long, an integer too long to write into text, references past `max_bytes`) comes
    back as the error string.
    """
    state = _State(outputs, current_step, max_bytes)
    try:
        resolved = _resolve(value, "", state)
    except _Unresolved as failure:
        return value, tuple(state.dependencies), failure.message
    return resolved, tuple(state.dependencies), None


def named_dependencies(value: object) -> tuple[tuple[Reference, Dependency], ...]:
    """Every `${steps.N.path}` in the string values of `value`, with the dependency it names.

    The dependency is the one resolution would record if the reference resolved (its keys
    follow `docs/protocol.md#recorded-dependencies`), found without reading any output: for
    code that has the arguments an agent wrote but not, or not all, the outputs they name.
    Order is resolution's traversal order: object fields in sorted key order, then references
    left to right; duplicates are kept. Unlike resolution it never stops early, and it skips
    what resolution would refuse to read: references to a step past 2**32 - 1, object keys
    that are not strings. Mappings, lists and tuples are walked, iteratively and each container
    once, so a deep, shared or self-containing value costs one visit per container; anything
    else that is not a string is a leaf. Never raises.
    """
    found: list[tuple[Reference, Dependency]] = []
    seen: set[int] = set()
    # The same text in the same field names the same dependencies: read it once.
    named: dict[tuple[str, str], tuple[tuple[Reference, Dependency], ...]] = {}
    stack: list[tuple[object, str]] = [(value, "")]
    while stack:
        item, field = stack.pop()
        if isinstance(item, str):
            if "${" in item:
                key = (item, field)
                if key not in named:
                    named[key] = tuple(_named_in(item, field))
                found.extend(named[key])
            continue
        children: Iterator[tuple[object, str]]
        if isinstance(item, Mapping):
            keys = sorted(key for key in item if isinstance(key, str))
            children = ((item[key], key) for key in reversed(keys))
        elif isinstance(item, (list, tuple)):
            children = ((child, field) for child in reversed(item))
        else:
            continue
        if id(item) in seen:
            continue
        seen.add(id(item))
        stack.extend(children)
    return tuple(found)


def _named_in(text: str, field: str) -> Iterator[tuple[Reference, Dependency]]:
    for piece in _tokenize(text, "steps"):
        if isinstance(piece, str):
            continue
        reference = _reference(piece, "steps")
        step = reference.step
        if step is None or step > _MAX_STEP_ID:
            continue
        yield reference, _dependency(step, list(reference.path), field)


class _State:
    """One resolution: what it reads, what it found, and what references may still insert."""

    __slots__ = ("current_step", "dependencies", "left", "max_bytes", "outputs")

    def __init__(
        self, outputs: Mapping[int, JSONValue], current_step: int, max_bytes: int | None
    ) -> None:
        self.outputs = outputs
        self.current_step = current_step
        self.dependencies: list[Dependency] = []
        self.max_bytes = max_bytes
        self.left = 0 if max_bytes is None else max_bytes

    def spend(self, size: int, match: re.Match[str]) -> None:
        """Count `size` bytes inserted by `match`; fail the resolution past `max_bytes`."""
        self.left -= size
        if self.left < 0:
            raise _Unresolved(
                f"reference {match.group(0)} takes what references insert past "
                f"{self.max_bytes} bytes"
            )


def _resolve(value: JSONValue, field: str, state: _State) -> JSONValue:
    if isinstance(value, str):
        if "${" not in value:
            return value
        return _resolve_string(value, field, state)
    if isinstance(value, list):
        return [_resolve(item, field, state) for item in value]
    if isinstance(value, dict):
        # The resolved object keeps its keys in the order given (docs/protocol.md#key-order).
        # Most arguments are flat objects of plain values: copied as they are, in one pass.
        resolved: dict[str, JSONValue] = {}
        for key, item in value.items():
            if isinstance(item, (dict, list)) or (isinstance(item, str) and "${" in item):
                return _resolve_fields(value, state)
            resolved[key] = item
        return resolved
    return value


def _resolve_fields(value: dict[str, JSONValue], state: _State) -> JSONValue:
    """An object holding references or containers. Sorted key order is the traversal order,
    so the dependencies come out in the order `docs/protocol.md#recorded-dependencies` gives;
    `fromkeys` first places the keys in the order given."""
    resolved: dict[str, JSONValue] = dict.fromkeys(value)
    for key in sorted(value):
        item = value[key]
        if isinstance(item, str):
            if "${" in item:
                item = _resolve_string(item, key, state)
        elif isinstance(item, (dict, list)):
            item = _resolve(item, key, state)
        resolved[key] = item
    return resolved


def _resolve_string(text: str, field: str, state: _State) -> JSONValue:
    pieces = _tokenize(text, "steps")
    if len(pieces) == 1:
        piece = pieces[0]
        if isinstance(piece, str):  # no reference, perhaps an escape
            return piece
        # A string that is exactly one reference: the value itself, with its JSON type.
        value = _lookup(piece, field, state)
        if state.max_bytes is not None:
            size = len(value) + 2 if isinstance(value, str) else _size_at_least(value, state.left)
            state.spend(size, piece)
        return _copy(value) if isinstance(value, (dict, list)) else value  # scalars: no call
    parts: list[str] = []
    for piece in pieces:
        if isinstance(piece, str):
            parts.append(piece)
            continue
        value = _lookup(piece, field, state)
        inserted = value if isinstance(value, str) else _interpolated(piece, value)
        if state.max_bytes is not None:
            state.spend(len(inserted), piece)
        parts.append(inserted)
    return "".join(parts)


def _size_at_least(value: JSONValue, limit: int) -> int:
    """A lower bound of the compact JSON size of `value`; past `limit`, any larger number.

    Stops as soon as the count passes `limit`, so sizing a huge value costs no more than the
    limit allows.
    """
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        size = 1
        for key, item in value.items():
            size += len(key) + 4 + _size_at_least(item, limit - size)
            if size > limit:
                break
        return size
    if isinstance(value, list):
        size = 1
        for item in value:
            size += 1 + _size_at_least(item, limit - size)
            if size > limit:
                break
        return size
    if isinstance(value, int) and not isinstance(value, bool):
        # abs(value) >= 2**(bits - 1), which has more than (bits - 1) * 0.3 digits
        return max(value.bit_length() - 1, 0) * 3 // 10 + 1
    return 3  # `1.0`, `true`, `null` and longer


def _interpolated(match: re.Match[str], value: JSONValue) -> str:
    try:
        return canonical_dumps(value)
    except JSONValueError as exc:  # an integer past the int-to-str limit, in unchecked outputs
        raise _Unresolved(
            f"reference {match.group(0)} cannot be written into text: {exc.problem}"
        ) from None


def _lookup(match: re.Match[str], field: str, state: _State) -> JSONValue:
    text = match.group(0)
    digits = match.group("step")
    step = int(digits) if len(digits) < _MAX_STEP_DIGITS else _step_id(match)  # most: short
    outputs = state.outputs
    if step > _MAX_STEP_ID or step >= state.current_step or step not in outputs:
        raise _Unresolved(f"reference {text} points to a step that has not completed")
    path = match.group("path").split(".")[1:]
    value = outputs[step]
    for segment in path:
        found, value = _index(value, segment)
        if not found:
            state.dependencies.append(
                Dependency(from_step=step, source_key=segment, target_key=segment)
            )
            raise _Unresolved(
                f"unresolved reference {text}: key '{segment}' not present in output of step {step}"
            )
    state.dependencies.append(_dependency(step, path, field))
    return value


def _dependency(step: int, path: list[str], field: str) -> Dependency:
    """The dependency a resolved reference records (`docs/protocol.md#recorded-dependencies`)."""
    source_key = field
    for segment in reversed(path):  # the last segment that is no index (a loop: no generator)
        if not (segment.isascii() and segment.isdigit()):  # `_is_index`, inline
            source_key = segment
            break
    dependency: Any = _UnfrozenDependency()
    dependency.from_step = step
    dependency.source_key = source_key
    dependency.target_key = field or source_key
    dependency.__class__ = Dependency  # frozen from here on
    return dependency  # type: ignore[no-any-return]  # a Dependency now


def _index(value: JSONValue, segment: str) -> tuple[bool, JSONValue]:
    if isinstance(value, dict):
        if segment in value:
            return True, value[segment]
    elif isinstance(value, list) and _is_index(segment):
        # Count the digits before int(): thousands of them would pass the int-to-str limit.
        digits = segment.lstrip("0")
        if len(digits) <= _MAX_INDEX_DIGITS:
            index = int(digits or "0")
            if index < len(value):
                return True, value[index]
    return False, None


def _is_index(segment: str) -> bool:
    # str.isdigit alone admits non-ASCII digits, and int() admits "1_0"; the grammar does not.
    return segment.isascii() and segment.isdigit()


def _copy(value: JSONValue) -> JSONValue:
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


# ---------------------------------------------------------------------- plans


def is_plan_namespace(name: str) -> bool:
    """Whether `name` can open a plan reference (`${name.path}`): what a plan node id must be."""
    return _NAMESPACE_RE.fullmatch(name) is not None


def is_path_segment(text: str) -> bool:
    """Whether `text` is one segment of a reference path (letters, digits, `_`, `-`)."""
    return _SEGMENT_RE.fullmatch(text) is not None


def resolve_plan_value(
    value: JSONValue, namespaces: Mapping[str, JSONValue]
) -> tuple[JSONValue, str | None]:
    """Resolve every `${initial.x}` and `${node_id.path}` in the strings of a checked JSON value.

    `namespaces` maps `initial` to the initial inputs and each node id with a result to its
    output. Plan mode is strict: a malformed reference, a reference to a namespace `namespaces`
    lacks, a missing key, and a list or object written into a longer string are errors, returned
    as `(value, message)` with `value` unresolved; never raised. On success: `(resolved, None)`.
    A string that is exactly one reference becomes the value itself (a copy, with its JSON type);
    scalars inside longer strings are written as compact JSON (strings verbatim); `$${` writes a
    literal `${`. Object keys are never scanned, and a substituted value is never re-scanned.
    The resolved value shares nothing mutable with `value` or `namespaces`.
    """
    return compile_plan_value(value).resolve(namespaces)


@final
class PlanValue:
    """A checked JSON value with its references parsed once, to resolve many times.

    `compile_plan_value(value).resolve(namespaces)` is `resolve_plan_value(value, namespaces)`;
    a plan node compiles each input once and resolves it at each attempt. A malformed
    reference is kept as its error, returned by every `resolve`.
    """

    # The two commonest inputs take no closure (a plan of thousands of nodes keeps one of
    # these an input for the run): a scalar (`_resolve` and `_reference` None) and a string
    # that is exactly one reference (`_reference` set); anything else has a `_resolve`.
    __slots__ = ("_reference", "_resolve", "_value")

    def __init__(
        self, value: JSONValue, resolve: _Resolver | None, reference: Reference | None = None
    ) -> None:
        self._value = value
        self._resolve = resolve
        self._reference = reference

    def resolve(self, namespaces: Mapping[str, JSONValue]) -> tuple[JSONValue, str | None]:
        """`(resolved, None)`, or `(value, message)` when a reference cannot be resolved."""
        try:
            reference = self._reference
            if reference is not None:
                return _copy(_plan_lookup(reference, namespaces)), None
            resolve = self._resolve
            return (self._value if resolve is None else resolve(namespaces)), None
        except _Unresolved as failure:
            return self._value, failure.message


def compile_plan_value(value: JSONValue) -> PlanValue:
    """Parse the references in `value`'s strings once (see `resolve_plan_value`)."""
    if isinstance(value, (dict, list)):
        return PlanValue(value, _compile_plan(value))
    if isinstance(value, str) and "${" in value:
        only = _whole_reference(value)
        if only is not None:
            return PlanValue(value, None, only)
        return PlanValue(value, _compile_plan_string(value))
    return PlanValue(value, None)  # a scalar: itself


def _whole_reference(text: str) -> Reference | None:
    """The reference `text` is exactly (`"${node.path}"`), or None (text, several, malformed)."""
    try:
        pieces = _tokenize(text, "plan")
        if len(pieces) != 1 or isinstance(pieces[0], str):
            return None
        return _reference(pieces[0], "plan")
    except ReferenceSyntaxError:
        return None  # compiled as the error it is, by `_compile_plan_string`


_Resolver: TypeAlias = "Callable[[Mapping[str, JSONValue]], JSONValue]"


def _constant(value: JSONValue) -> _Resolver:
    return lambda _: value  # a scalar: containers are compiled item by item


def _compile_plan(value: JSONValue) -> _Resolver:
    if isinstance(value, str):
        return _compile_plan_string(value) if "${" in value else _constant(value)
    if isinstance(value, list):
        items = [_compile_plan(item) for item in value]
        return lambda namespaces: [item(namespaces) for item in items]
    if isinstance(value, dict):
        fields = [(key, _compile_plan(item)) for key, item in value.items()]
        return lambda namespaces: {key: item(namespaces) for key, item in fields}
    return _constant(value)


def _compile_plan_string(text: str) -> _Resolver:
    try:
        references = [
            piece if isinstance(piece, str) else (piece, _reference(piece, "plan"))
            for piece in _tokenize(text, "plan")
        ]
    except ReferenceSyntaxError as exc:
        message = str(exc)

        def malformed(_: Mapping[str, JSONValue]) -> JSONValue:
            raise _Unresolved(message)

        return malformed
    if len(references) == 1:
        only = references[0]
        if isinstance(only, str):
            return _constant(only)
        reference = only[1]
        return lambda namespaces: _copy(_plan_lookup(reference, namespaces))

    def interpolate(namespaces: Mapping[str, JSONValue]) -> JSONValue:
        parts: list[str] = []
        for piece in references:
            if isinstance(piece, str):
                parts.append(piece)
                continue
            match, reference = piece
            found = _plan_lookup(reference, namespaces)
            if isinstance(found, (dict, list)):
                kind = "an object" if isinstance(found, dict) else "a list"
                raise _Unresolved(
                    f"reference {reference.text} is {kind}, which cannot be written into text; "
                    "map it to an input of its own"
                )
            parts.append(found if isinstance(found, str) else _interpolated(match, found))
        return "".join(parts)

    return interpolate


class PlanReference(Protocol):
    """A parsed plan reference: a `Reference`, or a plan node's `InputRef` (what resolving it
    reads)."""

    @property
    def text(self) -> str:
        """The reference as written, `${...}` included."""

    @property
    def namespace(self) -> str:
        """`initial` or a node id."""

    @property
    def path(self) -> tuple[str, ...]:
        """The fields after the namespace."""


def resolve_plan_reference(
    reference: PlanReference, namespaces: Mapping[str, JSONValue]
) -> tuple[JSONValue, str | None]:
    """`resolve_plan_value` of a string that is exactly `reference` (parsed already, so not
    again): the value it names (a copy, with its JSON type) and None, or `(reference.text,
    message)`."""
    try:
        return _copy(_plan_lookup(reference, namespaces)), None
    except _Unresolved as failure:
        return reference.text, failure.message


def _plan_lookup(reference: PlanReference, namespaces: Mapping[str, JSONValue]) -> JSONValue:
    namespace = reference.namespace
    if namespace not in namespaces:
        if namespace == "initial":
            raise _Unresolved(f"reference {reference.text}: the plan has no initial inputs")
        raise _Unresolved(
            f"reference {reference.text} points to node {namespace}, which has no output"
        )
    value = namespaces[namespace]
    for segment in reference.path:
        found, value = _index(value, segment)
        if not found:
            where = (
                "the initial inputs"
                if namespace == "initial"
                else f"the output of node {namespace}"
            )
            raise _Unresolved(
                f"unresolved reference {reference.text}: key '{segment}' not present in {where}"
            )
    return value
