"""What a callable declares: its parameters, their annotations, defaults and descriptions.

`read_signature(fn, skip_context=...)` reads a tool's signature once, at decoration, into a
neutral record (`Signature`) that tool specs (`_schema`, `_spec`) and plan validation read:
each `Parameter` (name, resolved annotation, default, whether it is required, its description
from the docstring) and the `Returns` (annotation, description, the NewType name, TypedDict
fields). Nothing here does I/O or calls the function.

Annotations are resolved with `typing.get_type_hints(include_extras=True)`, so `Annotated`
metadata survives and string annotations (`from __future__ import annotations`) are evaluated in
the function's globals. A forward reference that cannot be resolved does not fail: that one
annotation becomes `UNRESOLVED`, which schemas treat as "any value".

Docstrings: the summary is the first paragraph; per-argument descriptions are read from a Google
(`Args:`), NumPy (`Parameters` underlined with dashes) or reST (`:param name:`) section, and the
return description from `Returns:` / `Returns` / `:returns:`.
"""

from __future__ import annotations

import inspect
import re
import sys
import typing
from typing import TYPE_CHECKING, Any, Final, final

import attrs

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "NO_DEFAULT",
    "UNRESOLVED",
    "Docstring",
    "Field",
    "Parameter",
    "Returns",
    "Signature",
    "newtype_name",
    "parse_docstring",
    "read_signature",
    "typed_dict_fields",
]


@final
class _Marker:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: The `default` of a parameter that has none.
NO_DEFAULT: Final[Any] = _Marker("NO_DEFAULT")
#: The annotation of a parameter that has none, or whose annotation could not be resolved.
UNRESOLVED: Final[Any] = _Marker("UNRESOLVED")


@final
@attrs.frozen(kw_only=True)
class Parameter:
    """One argument a tool takes by keyword: `default` is `NO_DEFAULT` when it is required."""

    name: str
    annotation: Any = UNRESOLVED
    default: Any = NO_DEFAULT
    description: str = ""

    @property
    def required(self) -> bool:
        """Whether a call must pass it (it has no default)."""
        return self.default is NO_DEFAULT


@final
@attrs.frozen(kw_only=True)
class Field:
    """A key of a TypedDict: its annotation and whether it is required."""

    name: str
    annotation: Any
    required: bool


@final
@attrs.frozen(kw_only=True)
class Returns:
    """The return annotation: `semantic_name` is a NewType's name, `fields` a TypedDict's keys."""

    annotation: Any = UNRESOLVED
    description: str = ""
    semantic_name: str | None = None
    fields: tuple[Field, ...] = ()


@final
@attrs.frozen(kw_only=True)
class Docstring:
    """A parsed docstring: summary, the text before any section, and per-argument text."""

    summary: str = ""
    description: str = ""
    arguments: dict[str, str] = attrs.field(factory=dict)
    returns: str = ""


@final
@attrs.frozen(kw_only=True)
class Signature:
    """What a tool declares; `extra_keywords` is True when it takes `**kwargs`."""

    parameters: tuple[Parameter, ...]
    returns: Returns
    summary: str
    description: str
    extra_keywords: bool
    #: The annotation of `**kwargs` values (`UNRESOLVED` when absent or unannotated).
    extra_annotation: Any = UNRESOLVED


def read_signature(fn: Callable[..., object], *, skip_context: bool) -> Signature:
    """Read `fn`'s keyword parameters (the first one skipped when it is the context).

    Positional-only parameters and `*args` cannot receive a keyword argument, so they are left
    out. A callable without a readable signature (some builtins) declares `**kwargs` only.
    Never raises for a callable; never calls it.
    """
    text = inspect.getdoc(fn)
    if text is None and not inspect.isroutine(fn):  # a callable object: its `__call__`'s doc
        text = inspect.getdoc(type(fn).__call__)
    doc = parse_docstring(text or "")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return Signature(
            parameters=(),
            returns=Returns(description=doc.returns),
            summary=doc.summary,
            description=doc.description,
            extra_keywords=True,
        )
    hints = _type_hints(fn, signature)
    parameters: list[Parameter] = []
    extra = False
    extra_annotation: Any = UNRESOLVED
    listed = list(signature.parameters.values())
    if skip_context and listed:
        listed = listed[1:]
    for parameter in listed:
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            extra = True
            extra_annotation = hints.get(parameter.name, UNRESOLVED)
            continue
        if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
            continue
        default = parameter.default
        parameters.append(
            Parameter(
                name=parameter.name,
                annotation=hints.get(parameter.name, UNRESOLVED),
                default=NO_DEFAULT if default is inspect.Parameter.empty else default,
                description=doc.arguments.get(parameter.name, ""),
            )
        )
    return Signature(
        parameters=tuple(parameters),
        returns=_returns(hints.get("return", UNRESOLVED), doc.returns),
        summary=doc.summary,
        description=doc.description,
        extra_keywords=extra,
        extra_annotation=extra_annotation,
    )


def _type_hints(fn: Callable[..., object], signature: inspect.Signature) -> dict[str, Any]:
    """The resolved annotations; each one that does not resolve is left out (UNRESOLVED)."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # noqa: BLE001, S110  (a bad forward reference: resolve one by one)
        pass
    target = inspect.unwrap(fn) if callable(fn) else fn
    namespace = dict(getattr(target, "__globals__", {}))
    hints: dict[str, Any] = {}
    annotations = {
        name: parameter.annotation
        for name, parameter in signature.parameters.items()
        if parameter.annotation is not inspect.Parameter.empty
    }
    if signature.return_annotation is not inspect.Signature.empty:
        annotations["return"] = signature.return_annotation
    for name, annotation in annotations.items():
        try:  # the same evaluation get_type_hints does, one annotation at a time
            holder = type("_Holder", (), {"__annotations__": {name: annotation}})
            hints[name] = typing.get_type_hints(holder, namespace, include_extras=True)[name]
        except Exception:  # noqa: BLE001, S112  (unresolvable: any value)
            continue
    return hints


def typed_dict_fields(annotation: object) -> tuple[Field, ...] | None:
    """The keys of a TypedDict class, in declaration order; None for anything else.

    A `typing_extensions.TypedDict` counts too (on Python < 3.13 it is a class of its own that
    `typing.is_typeddict` does not recognise); typing_extensions is asked only if the caller's
    code has already imported it.
    """
    if not isinstance(annotation, type):
        return None
    extensions = sys.modules.get("typing_extensions")
    if not (
        typing.is_typeddict(annotation)
        or (extensions is not None and extensions.is_typeddict(annotation))
    ):
        return None
    try:
        hints = typing.get_type_hints(annotation, include_extras=True)
    except Exception:  # noqa: BLE001  (unresolvable forward references: keys without types)
        hints = dict.fromkeys(getattr(annotation, "__annotations__", {}), UNRESOLVED)
    required = getattr(annotation, "__required_keys__", frozenset(hints))
    return tuple(
        Field(name=name, annotation=hint, required=name in required) for name, hint in hints.items()
    )


def newtype_name(annotation: object) -> str | None:
    """The name of a `typing.NewType`, or None."""
    supertype = getattr(annotation, "__supertype__", None)
    if supertype is None or not callable(annotation):
        return None
    name = getattr(annotation, "__name__", None)
    return name if isinstance(name, str) else None


def _returns(annotation: Any, description: str) -> Returns:
    plain = annotation
    if typing.get_origin(plain) is typing.Annotated:
        plain = typing.get_args(plain)[0]
    return Returns(
        annotation=annotation,
        description=description,
        semantic_name=newtype_name(plain),
        fields=typed_dict_fields(plain) or (),
    )


# ---------------------------------------------------------------------- docstrings

_GOOGLE_ARGS: Final = frozenset({"args", "arguments", "parameters", "params", "keyword args"})
_GOOGLE_RETURNS: Final = frozenset({"returns", "return", "yields"})
_GOOGLE_SECTIONS: Final = (
    _GOOGLE_ARGS
    | _GOOGLE_RETURNS
    | frozenset(
        {"raises", "examples", "example", "notes", "note", "see also", "attributes", "warnings"}
    )
)
_NUMPY_UNDERLINE: Final = re.compile(r"-{3,}\s*")
_GOOGLE_ITEM: Final = re.compile(r"(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")
_NUMPY_ITEM: Final = re.compile(r"(\*{0,2}\w+)(?:\s*:\s*.*)?")
_REST_FIELD: Final = re.compile(r":(\w+)(?:\s+([^:]*?))?\s*:\s*(.*)")


def parse_docstring(text: str) -> Docstring:
    """Split a (cleaned) docstring into summary, description, argument and return texts.

    Recognises Google, NumPy and reST sections; text it does not recognise stays in the
    description. Descriptions are whitespace-collapsed to one line each.
    """
    lines = inspect.cleandoc(text).splitlines() if text else []
    body: list[str] = []
    arguments: dict[str, str] = {}
    returns: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        header = stripped.rstrip(":").lower()
        numpy = i + 1 < len(lines) and _NUMPY_UNDERLINE.fullmatch(lines[i + 1].strip()) is not None
        if numpy and stripped:
            i = _numpy_section(lines, i + 2, header, arguments, returns)
            continue
        if stripped.endswith(":") and header in _GOOGLE_SECTIONS and not line.startswith(" "):
            i = _google_section(lines, i + 1, header, arguments, returns)
            continue
        if stripped.startswith(":"):
            i = _rest_field(lines, i, arguments, returns)
            continue
        body.append(line)
        i += 1
    paragraphs = _paragraphs(body)
    return Docstring(
        summary=paragraphs[0] if paragraphs else "",
        description="\n\n".join(paragraphs),
        arguments=arguments,
        returns=_collapse(returns),
    )


def _paragraphs(lines: list[str]) -> list[str]:
    paragraphs: list[str] = []
    current: list[str] = []
    for line in [*lines, ""]:
        if line.strip():
            current.append(line)
        elif current:
            paragraphs.append(_collapse(current))
            current = []
    return paragraphs


def _collapse(lines: list[str]) -> str:
    return " ".join(" ".join(lines).split())


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _google_section(
    lines: list[str], i: int, header: str, arguments: dict[str, str], returns: list[str]
) -> int:
    """Read an indented Google section from line `i`; return the first line after it."""
    item_indent: int | None = None
    name: str | None = None
    text: list[str] = []

    def flush() -> None:
        if name is not None:
            arguments[name.lstrip("*")] = _collapse(text)

    while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
        line = lines[i]
        i += 1
        if not line.strip():
            continue
        if header in _GOOGLE_RETURNS:
            returns.append(line)
            continue
        if header not in _GOOGLE_ARGS:
            continue
        indent = _indent(line)
        if item_indent is None:
            item_indent = indent
        match = _GOOGLE_ITEM.fullmatch(line.strip()) if indent <= item_indent else None
        if match is not None:
            flush()
            name, text = match.group(1), [match.group(2)]
        elif name is not None:
            text.append(line)
    flush()
    return i


def _numpy_section(
    lines: list[str], i: int, header: str, arguments: dict[str, str], returns: list[str]
) -> int:
    """Read a NumPy section (its underline already skipped) up to the next section."""
    name: str | None = None
    text: list[str] = []

    def flush() -> None:
        if name is not None:
            arguments[name.lstrip("*")] = _collapse(text)

    while i < len(lines):
        line = lines[i]
        if i + 1 < len(lines) and _NUMPY_UNDERLINE.fullmatch(lines[i + 1].strip()) and line.strip():
            break
        i += 1
        if not line.strip():
            continue
        if header in _GOOGLE_RETURNS:
            if line.startswith((" ", "\t")):
                returns.append(line)
            continue
        if header not in _GOOGLE_ARGS and header != "other parameters":
            continue
        if not line.startswith((" ", "\t")):
            match = _NUMPY_ITEM.fullmatch(line.strip())
            flush()
            name, text = (match.group(1), []) if match is not None else (None, [])
        elif name is not None:
            text.append(line)
    flush()
    return i


def _rest_field(lines: list[str], i: int, arguments: dict[str, str], returns: list[str]) -> int:
    """Read one reST field (`:param name:`, `:param int name:`, `:returns:`) and its lines."""
    match = _REST_FIELD.fullmatch(lines[i].strip())
    i += 1
    text = [match.group(3)] if match is not None else []
    while i < len(lines) and lines[i].startswith((" ", "\t")) and lines[i].strip():
        text.append(lines[i])
        i += 1
    if match is None:
        return i
    field, spec = match.group(1).lower(), (match.group(2) or "").split()
    if field in {"param", "parameter", "arg", "argument", "key", "keyword"} and spec:
        arguments[spec[-1].lstrip("*")] = _collapse(text)
    elif field in {"returns", "return"}:
        returns.extend(text)
    return i
