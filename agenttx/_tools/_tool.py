"""Tools and compensations: the decorators, the registry and the context a tool runs with.

A tool is a plain function (sync or `async def`) that takes its resolved arguments as keyword
arguments, plus a `ToolContext` when its first parameter asks for one (annotated `ToolContext`,
or named `ctx`). The decorators validate at decoration time and keep the function's signature
for type checkers; the decorated object stays callable as the plain function.
"""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Generic,
    Literal,
    ParamSpec,
    TypeAlias,
    TypeVar,
    cast,
    final,
    overload,
)

import attrs

from .._errors import InvalidArgument
from .._json import JSONValue, canonical_dumps, check_json
from ._costs import check_cost
from ._signature import Signature, read_signature
from ._spec import ToolSpec, build_spec, secret_parameters

if TYPE_CHECKING:
    from decimal import Decimal

    from ..stores import Store
    from ._schema import Validator

__all__ = [
    "Compensation",
    "StagedEffect",
    "StateView",
    "Tool",
    "ToolContext",
    "ToolLike",
    "ToolRegistry",
    "ToolsArgument",
    "UndoRecord",
    "compensation",
    "derive_key",
    "key_deriver",
    "tool",
]

P = ParamSpec("P")
R = TypeVar("R")

MAX_TOOL_NAME: Final = 128


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_TOOL_NAME:
        raise InvalidArgument(f"{what} name must be 1-{MAX_TOOL_NAME} characters, got {name!r}")
    return name


@final
class Compensation(Generic[P, R]):
    """An undo action, called with the payload recorded for it. It must be idempotent."""

    __slots__ = ("__wrapped__", "is_async", "name")

    def __init__(self, fn: Callable[P, R], *, name: str | None = None) -> None:
        if not callable(fn):
            raise InvalidArgument(f"compensation {name or fn!r} is not callable")
        self.__wrapped__ = fn
        self.name = _check_name(name if name is not None else _function_name(fn), "compensation")
        self.is_async = inspect.iscoroutinefunction(fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.__wrapped__(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<agenttx.Compensation {self.name!r}>"


@final
class Tool(Generic[P, R]):
    """A registered tool: `name`, the wrapped function, and its declared compensation.

    Calling a `Tool` calls the function directly, outside any transaction.
    """

    __slots__ = (
        "__wrapped__",
        "_signature",
        "check",
        "compensate",
        "guarded",
        "inline",
        "is_async",
        "name",
        "needs_approval",
        "on_unknown",
        "secrets",
        "spec",
        "validator",
        "wants_context",
    )

    spec: ToolSpec
    """What a model is told about the tool (`ToolSpec`), built once at decoration."""
    validator: Validator
    """The compiled `spec.parameters`: each step's resolved arguments are checked by it."""
    secrets: frozenset[str]
    """The parameters whose values are never shown to a model after a failure (`secret=`,
    and the properties the schema marks `"writeOnly": true` or `"format": "password"`)."""

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        name: str | None = None,
        compensate: Compensation[Any, Any] | str | None = None,
        inline: bool = False,
        description: str | None = None,
        parameters: Mapping[str, JSONValue] | None = None,
        needs_approval: bool | Callable[[Any], bool] = False,
        check: Callable[[Any, str], Any] | None = None,
        on_unknown: OnUnknown | None = None,
        secret: Iterable[str] = (),
    ) -> None:
        if not callable(fn):
            raise InvalidArgument(f"tool {name or fn!r} is not callable")
        self.__wrapped__ = fn
        self.name = _check_name(name if name is not None else _function_name(fn), "tool")
        if compensate is not None and not isinstance(compensate, (Compensation, str)):
            raise InvalidArgument(
                f"tool `{self.name}`: compensate= must be a compensation or its name, "
                f"got {compensate!r}"
            )
        if not isinstance(inline, bool):
            raise InvalidArgument(f"tool `{self.name}`: inline= must be a bool, got {inline!r}")
        self.compensate = compensate
        self.inline = inline
        self.needs_approval, self.check, self.on_unknown = _check_people(
            self.name, needs_approval, check, on_unknown
        )
        #: Whether a call may need approval or review: one test per step for the others.
        self.guarded = self.needs_approval is not False or self.on_unknown == "review"
        self.is_async = inspect.iscoroutinefunction(fn)
        self.wants_context = _wants_context(fn)
        # The signature read to build the spec is kept (not read a second time when plan
        # validation or an output check first asks for it).
        self.spec, self.validator, self._signature = build_spec(
            fn,
            name=self.name,
            skip_context=self.wants_context,
            description=description,
            parameters=parameters,
        )
        self.secrets = secret_parameters(self.name, secret, self.spec.parameters)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.__wrapped__(*args, **kwargs)

    @property
    def signature(self) -> Signature:
        """The function's parameters and return type (`read_signature`), read once (when the
        spec is built, or on first use): plan validation and output checks read it every run."""
        if self._signature is None:
            self._signature = read_signature(self.__wrapped__, skip_context=self.wants_context)
        return self._signature

    @property
    def wire_name(self) -> str:
        """The provider-safe name (`kv.put` -> `kv_put`); calls may use it or `name`."""
        return self.spec.wire_name

    def renamed(self, name: str) -> Tool[P, R]:
        """This tool under another registered name, with the same settings and spec texts."""
        return Tool(
            self.__wrapped__,
            name=name,
            compensate=self.compensate,
            inline=self.inline,
            description=self.spec.description,
            parameters=self.spec.parameters,
            needs_approval=self.needs_approval,
            check=self.check,
            on_unknown=self.on_unknown,
            secret=self.secrets,
        )

    @property
    def compensation_name(self) -> str | None:
        """The name of the declared compensation, if any."""
        if isinstance(self.compensate, Compensation):
            return self.compensate.name
        return self.compensate

    def __repr__(self) -> str:
        return f"<agenttx.Tool {self.name!r}>"


#: What a tool does with a call whose outcome is unknown (`@tool(on_unknown=...)`).
OnUnknown: TypeAlias = Literal["retry", "review"]


def _check_people(
    name: str, needs_approval: object, check: object, on_unknown: object
) -> tuple[bool | Callable[[Any], bool], Callable[[Any, str], Any] | None, OnUnknown]:
    """Validate `needs_approval=`, `check=` and `on_unknown=` of tool `name`."""
    if not isinstance(needs_approval, bool) and not callable(needs_approval):
        raise InvalidArgument(
            f"tool `{name}`: needs_approval= must be a bool or a callable of the arguments, "
            f"got {needs_approval!r}"
        )
    if check is not None and not callable(check):
        raise InvalidArgument(
            f"tool `{name}`: check= must be a callable (arguments, idempotency_key), got {check!r}"
        )
    if on_unknown is None:
        on_unknown = "review" if check is not None or needs_approval is not False else "retry"
    if on_unknown not in ("retry", "review"):
        raise InvalidArgument(
            f'tool `{name}`: on_unknown= must be "retry" or "review", got {on_unknown!r}'
        )
    return (
        cast("bool | Callable[[Any], bool]", needs_approval),
        cast("Callable[[Any, str], Any] | None", check),
        on_unknown,
    )


def _is_text_or_scalar(value: object) -> bool:
    """True for str and bytes, and for anything that is not iterable (runtime checks only)."""
    return isinstance(value, (str, bytes)) or not isinstance(value, Iterable)


def _is_nonempty_str(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _function_name(fn: Callable[..., object]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _wants_context(fn: Callable[..., object]) -> bool:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature take no context
        return False
    if not parameters:
        return False
    first = parameters[0]
    annotation = first.annotation
    if annotation is ToolContext:
        return True
    if isinstance(annotation, str) and annotation.rsplit(".", 1)[-1] == "ToolContext":
        return True
    return first.name == "ctx"


@overload
def tool(fn: Callable[P, R], /) -> Tool[P, R]: ...
@overload
def tool(
    *,
    name: str | None = None,
    compensate: Compensation[Any, Any] | str | None = None,
    inline: bool = False,
    description: str | None = None,
    parameters: Mapping[str, JSONValue] | None = None,
    needs_approval: bool | Callable[[Any], bool] = False,
    check: Callable[[Any, str], Any] | None = None,
    on_unknown: OnUnknown | None = None,
    secret: Iterable[str] = (),
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...
def tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    compensate: Compensation[Any, Any] | str | None = None,
    inline: bool = False,
    description: str | None = None,
    parameters: Mapping[str, JSONValue] | None = None,
    needs_approval: bool | Callable[[Any], bool] = False,
    check: Callable[[Any, str], Any] | None = None,
    on_unknown: OnUnknown | None = None,
    secret: Iterable[str] = (),
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Register a function as a tool: `@tool` or `@tool(name=..., compensate=..., inline=...)`.

    `compensate` (a `Compensation` or a compensation's name) is recorded each time the tool
    succeeds, and called with `{"arguments": ..., "output": ...}` if the step is rewound.

    A sync tool runs on a worker thread, so that the step fails at its timeout even if the
    tool hangs (an async tool is cancelled instead). `inline=True` runs it on the caller's
    thread instead, saving the thread handoff (tens of microseconds): for fast tools that
    never block, such as the built-in `kv.*` and `record.*`. An inline tool cannot be
    interrupted; if it returns after the deadline, the step still fails as timed out.

    The tool's `spec` (`ToolSpec`) is built here: its `parameters` schema from the signature
    and docstring, or `parameters=` (a JSON Schema object); its description from the docstring,
    or `description=`. Arguments are validated against it before the tool runs
    (`docs/protocol.md#tool-specs`).
    `needs_approval=True` (or a callable deciding from the resolved arguments, e.g. above an
    amount) holds each call until a person approves exactly that call (docs/approvals.md).
    `check(arguments, idempotency_key) -> CheckResult` tells whether a call whose outcome is
    unknown (it timed out while running, or the process died while it ran) happened.
    `on_unknown="review"` (the default for a tool with either) sends such a call to a status
    check and human review instead of a blind retry; `"retry"` is the plain behaviour.
    `secret=` (parameter names) marks arguments whose values a failed step's result never shows
    the model (`StepResult.cause`); a schema property marked `"writeOnly": true` or
    `"format": "password"` is secret too.
    Raises `InvalidArgument` at decoration time for a non-callable, a bad name (one whose wire
    name would be empty or over 64 characters included), a `parameters=` that is not a JSON
    Schema object, or a `secret=` name that is not a parameter.
    """
    options: dict[str, Any] = {
        "name": name,
        "compensate": compensate,
        "inline": inline,
        "description": description,
        "parameters": parameters,
        "needs_approval": needs_approval,
        "check": check,
        "on_unknown": on_unknown,
        "secret": secret,
    }
    if fn is not None:
        return Tool(fn, **options)

    def decorate(inner: Callable[P, R]) -> Tool[P, R]:
        return Tool(inner, **options)

    return decorate


@overload
def compensation(fn: Callable[P, R], /) -> Compensation[P, R]: ...
@overload
def compensation(*, name: str | None = None) -> Callable[[Callable[P, R]], Compensation[P, R]]: ...
def compensation(
    fn: Callable[P, R] | None = None, /, *, name: str | None = None
) -> Compensation[P, R] | Callable[[Callable[P, R]], Compensation[P, R]]:
    """Register an idempotent undo action under `name` (default: the function's name).

    It is called with one argument, the payload recorded by `ctx.register_undo(name, payload)`
    or, for a tool's `compensate=`, `{"arguments": ..., "output": ...}`.
    """
    if fn is not None:
        return Compensation(fn, name=name)

    def decorate(inner: Callable[P, R]) -> Compensation[P, R]:
        return Compensation(inner, name=name)

    return decorate


#: What a tools list may hold: a decorated tool, a compensation, or a plain callable (a tool).
ToolLike = Tool[Any, Any] | Compensation[Any, Any] | Callable[..., Any]

#: What `Transaction(tools=...)` and `Engine(tools=...)` take: any iterable of `ToolLike`, or a
#: mapping of names to them. Items are typed `object` because mypy infers `list[object]` for an
#: unannotated mixed list (`[charge, refund, plain_fn]`: no common base but `object`); each item
#: is checked at construction, and a non-callable raises `InvalidArgument` naming it.
ToolsArgument: TypeAlias = (
    "ToolRegistry | Iterable[ToolLike | object] | Mapping[str, ToolLike | object]"
)


@final
class ToolRegistry:
    """The tools and compensations one transaction can use, validated as a whole."""

    __slots__ = ("compensations", "tools", "wire")

    def __init__(
        self,
        tools: ToolsArgument = (),
    ) -> None:
        self.tools: dict[str, Tool[Any, Any]] = {}
        self.compensations: dict[str, Compensation[Any, Any]] = {}
        #: Wire name -> tool, for calls that come back under the wire name.
        self.wire: dict[str, Tool[Any, Any]] = {}
        if isinstance(tools, ToolRegistry):  # already validated: share its tables
            self.tools, self.compensations, self.wire = tools.tools, tools.compensations, tools.wire
            return
        if isinstance(tools, Mapping):
            items: list[object] = []
            for key, fn in tools.items():
                if isinstance(fn, Compensation):
                    items.append(fn if fn.name == key else Compensation(fn.__wrapped__, name=key))
                elif isinstance(fn, Tool):
                    items.append(fn if fn.name == key else fn.renamed(key))
                else:  # checked as callable by `Tool`
                    items.append(Tool(cast("Callable[..., Any]", fn), name=key))
        elif _is_text_or_scalar(tools):
            raise InvalidArgument(
                f"tools must be a list of tools or a mapping of names to callables, got {tools!r}"
            )
        else:
            items = list(tools)
        for item in items:
            self._add(item)
        for registered in self.tools.values():
            name = registered.compensation_name
            if name is not None and name not in self.compensations:
                raise InvalidArgument(
                    f"tool `{registered.name}`: compensate={name!r} names no registered "
                    "compensation; pass the compensation in the tools list"
                )

    def _add(self, item: object) -> None:
        if isinstance(item, Compensation):
            self._add_compensation(item)
            return
        if isinstance(item, Tool):
            registered: Tool[Any, Any] = item
        elif callable(item):
            registered = Tool(item)
        else:
            raise InvalidArgument(
                f"tools: {item!r:.100} is not a tool, a compensation or a callable"
            )
        if registered.name in self.tools:
            raise InvalidArgument(f"tool `{registered.name}` is registered twice")
        other = self.wire.get(registered.wire_name)
        if other is not None:
            raise InvalidArgument(
                f"tools `{other.name}` and `{registered.name}` have the same wire name "
                f"`{registered.wire_name}`; rename one"
            )
        self.tools[registered.name] = registered
        self.wire[registered.wire_name] = registered
        if isinstance(registered.compensate, Compensation):
            self._add_compensation(registered.compensate)

    def _add_compensation(self, item: Compensation[Any, Any]) -> None:
        existing = self.compensations.get(item.name)
        if existing is not None and existing.__wrapped__ is not item.__wrapped__:
            raise InvalidArgument(f"compensation `{item.name}` is registered twice")
        self.compensations[item.name] = item

    def names(self) -> tuple[str, ...]:
        """The registered tool names, sorted."""
        return tuple(sorted(self.tools))

    def wire_names(self) -> tuple[str, ...]:
        """The tools' wire names, sorted: the names a model is given (`ToolSpec.wire_name`)."""
        return tuple(sorted(self.wire))

    def get(self, name: str) -> Tool[Any, Any] | None:
        """The tool registered under `name`, or whose wire name is `name`; else None."""
        found = self.tools.get(name)
        return found if found is not None else self.wire.get(name)

    def specs(self) -> tuple[ToolSpec, ...]:
        """Every tool's spec, in registration order."""
        return tuple(registered.spec for registered in self.tools.values())


# ---------------------------------------------------------------------- records


@final
@attrs.frozen(kw_only=True)
class UndoRecord:
    """An undo registered by a step: a compensation `kind` and its payload, or a callable.

    Records with a `kind` name a registered compensation and survive a crash (once stores
    persist them); `kind == "fn"` marks an in-memory callable, which cannot be recovered.
    """

    step_id: int
    seq: int
    kind: str
    payload: JSONValue
    description: str
    action: Callable[[], object] | None = attrs.field(default=None, eq=False, repr=False)


@final
@attrs.frozen(kw_only=True)
class StagedEffect:
    """A non-reversible effect (an email, a webhook) held back until the transaction commits."""

    tx_id: str
    step_id: int
    channel: str
    payload: JSONValue
    idempotency_key: str


def derive_key(*parts: JSONValue) -> str:
    """A deterministic idempotency key: 32 hex digits of a hash of the parts' canonical JSON."""
    import hashlib  # noqa: PLC0415  (loads OpenSSL: not at `import agenttx`)

    return hashlib.blake2b(canonical_dumps(list(parts)).encode(), digest_size=16).hexdigest()


def key_deriver(*shared: JSONValue) -> Callable[..., str]:
    """`derive_key` for many keys that share their first parts, hashing those once:
    `key_deriver(a, b)(c, d) == derive_key(a, b, c, d)`."""
    import hashlib  # noqa: PLC0415

    if not shared:
        return derive_key
    # The canonical JSON of the whole list is the shared parts' list without its `]`, then
    # `,` and the rest's list without its `[`.
    base = hashlib.blake2b(canonical_dumps(list(shared))[:-1].encode(), digest_size=16)

    def derive(*parts: JSONValue) -> str:
        if not parts:
            return derive_key(*shared)
        hasher = base.copy()
        hasher.update(("," + canonical_dumps(list(parts))[1:]).encode())
        return hasher.hexdigest()

    return derive


# ---------------------------------------------------------------------- context

_ABSENT: Final = object()


@final
class _Fence:
    """Admits a step's context calls until the step ends, then refuses them all.

    `with fence:` holds its lock for the call, and `close` takes the same lock, so a call that
    a tool on a worker thread makes as its step times out either lands wholly before the
    transaction rewinds, or raises; it never lands after.
    """

    __slots__ = ("_lock", "closed", "step_id")

    def __init__(self, step_id: int) -> None:
        self._lock = threading.Lock()
        self.closed = False
        self.step_id = step_id

    def __enter__(self) -> None:
        self._lock.acquire()
        if self.closed:
            self._lock.release()
            raise InvalidArgument(
                f"step {self.step_id} has ended: its context accepts no more calls"
            )

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()

    def close(self) -> None:
        with self._lock:
            self.closed = True


@final
class StateView:
    """A tool's transactional view of state: its own writes first, then committed state.

    Values are JSON values; writes go to the transaction's overlay and are undone by a rewind.
    """

    __slots__ = ("_fence", "_store", "_tx_id")

    def __init__(self, store: Store, tx_id: str, fence: _Fence) -> None:
        self._store = store
        self._tx_id = tx_id
        self._fence = fence

    def get(self, key: str, default: JSONValue = None) -> JSONValue:
        """The value of `key`, or `default` when it is absent."""
        with self._fence:
            text = self._store.get(self._tx_id, key)
        return default if text is None else json.loads(text)

    def __contains__(self, key: str) -> bool:
        with self._fence:
            return self._store.get(self._tx_id, key) is not None

    def put(self, key: str, value: JSONValue) -> None:
        """Write `value` (a JSON value) under `key`."""
        text = canonical_dumps(check_json(value, what=f"the value of state key {key!r}"))
        with self._fence:
            self._store.put(self._tx_id, key, text)

    def delete(self, key: str) -> bool:
        """Delete `key`; return whether it existed (nothing is written if it did not)."""
        with self._fence:
            if self._store.get(self._tx_id, key) is None:
                return False
            self._store.delete(self._tx_id, key)
            return True


@final
class ToolContext:
    """What a tool can do besides computing its output, all undone by a rewind.

    * `state`: the transaction's key-value view (`get`, `put`, `delete`);
    * `register_undo(kind, payload)`: record a durable undo, to be done by the registered
      compensation `kind`; `register_undo(callable)`: an in-memory one. Register it *before*
      the effect, so that a failure halfway is still undone;
    * `stage_effect(channel, payload, idempotency_key=None)`: hold a non-reversible effect
      until commit; returns its idempotency key;
    * `idempotency_key`: stable for this logical call (transaction, step, tool, arguments),
      and new when the step runs again after its effects were compensated;
    * `deadline`: the `time.monotonic()` by which the tool should return;
    * `add_cost(amount, category="tool")`: report spending in GBP (read by plan runs'
      metrics; a `Transaction` keeps it on the context and does not report it).
    """

    __slots__ = (
        "_compensations",
        "_costs",
        "_effects",
        "_fence",
        "_key",
        "_log_undo",
        "_seq_base",
        "_state",
        "_store",
        "_undos",
        "deadline",
        "step_id",
        "tx_id",
    )

    def __init__(
        self,
        *,
        tx_id: str,
        step_id: int,
        idempotency_key: str | Callable[[], str],
        deadline: float,
        store: Store,
        compensations: Mapping[str, Compensation[Any, Any]],
        log_undo: Callable[[UndoRecord], object] | None = None,
        seq_base: int = 0,
    ) -> None:
        self.tx_id = tx_id
        self._seq_base = seq_base  # undo records number from here: unique in the transaction
        self.step_id = step_id
        self._key = idempotency_key  # a callable is called once, on first use
        self.deadline = deadline
        self._store = store
        self._state: StateView | None = None
        self._compensations = compensations
        self._undos: list[UndoRecord] = []
        self._effects: list[StagedEffect] = []
        self._costs: list[tuple[str, Decimal]] = []
        self._fence = _Fence(step_id)
        self._log_undo = log_undo  # writes the record durably, before the effect it undoes

    @property
    def state(self) -> StateView:
        """The transaction's key-value view of state."""
        if self._state is None:
            self._state = StateView(self._store, self.tx_id, self._fence)
        return self._state

    @property
    def idempotency_key(self) -> str:
        """Stable for this logical call; new when the step reruns after a compensation."""
        if callable(self._key):
            self._key = self._key()
        return self._key

    def register_undo(
        self,
        kind: str | Callable[[], object],
        payload: JSONValue = None,
        /,
        *,
        description: str | None = None,
    ) -> None:
        """Record an undo for this step; see the class docstring.

        `description` names the undo in reports (default: the kind and the payload's start).
        """
        action: Callable[[], object] | None = None
        if isinstance(kind, Compensation):
            kind = kind.name  # a registered compensation, by its name: durable
        if callable(kind):
            if payload is not None:
                raise InvalidArgument(
                    "register_undo: an in-memory undo is called without arguments, so it takes "
                    "no payload; register a compensation and pass its name to send one"
                )
            action, kind = kind, "fn"
            default = f"call {_function_name(action)}"
        else:
            if kind not in self._compensations:
                raise InvalidArgument(
                    f"register_undo: {kind!r} is not a registered compensation "
                    f"(registered: {', '.join(sorted(self._compensations)) or 'none'})"
                )
            payload = check_json(payload, what=f"the payload of undo {kind!r}")
            default = f"{kind}({canonical_dumps(payload)[:80]})"
        with self._fence:
            record = UndoRecord(
                step_id=self.step_id,
                seq=self._seq_base + len(self._undos),
                kind=kind,
                payload=payload,
                description=description or default,
                action=action,
            )
            if self._log_undo is not None:
                self._log_undo(record)
            self._undos.append(record)

    def stage_effect(
        self, channel: str, payload: JSONValue = None, idempotency_key: str | None = None
    ) -> str:
        """Stage an effect for dispatch after commit; return its idempotency key."""
        if not _is_nonempty_str(channel):
            raise InvalidArgument(
                f"stage_effect: channel must be a non-empty string, got {channel!r}"
            )
        payload = check_json(payload, what=f"the payload of a {channel!r} effect")
        if idempotency_key is not None and not isinstance(idempotency_key, str):
            raise InvalidArgument(
                f"stage_effect: idempotency_key must be a string, got {idempotency_key!r}"
            )
        key = idempotency_key or derive_key(self.tx_id, self.step_id, channel, payload)
        effect = StagedEffect(
            tx_id=self.tx_id,
            step_id=self.step_id,
            channel=channel,
            payload=payload,
            idempotency_key=key,
        )
        with self._fence:
            self._effects.append(effect)
        return key

    def add_cost(self, amount: Decimal | str | int, category: str = "tool") -> None:
        """Report spending of this call: `amount` in GBP, under `category`.

        `amount` is a `Decimal`, an `int` or a decimal string (`"0.002"`), finite and >= 0; a
        float is refused, since binary fractions are inexact. `category` is one of
        `COST_CATEGORIES` (`model`, `tool`, `infrastructure`, `retry`). Raises `InvalidArgument`
        for anything else, and once the call has ended (like every context call). A plan run
        sums the costs of every attempt, failed ones included, into `PlanMetrics.cost`.
        """
        entry = check_cost(amount, category)
        with self._fence:
            self._costs.append(entry)

    @property
    def costs(self) -> tuple[tuple[str, Decimal], ...]:
        """The costs reported so far, as `(category, amount)` in the order reported."""
        return tuple(self._costs)

    def _close(self) -> tuple[tuple[UndoRecord, ...], tuple[StagedEffect, ...]]:
        """Fence the context and hand over what the tool registered (transaction use only).

        After this returns, every call the tool makes on the context raises, even from another
        thread, and nothing more is registered.
        """
        self._fence.close()
        return tuple(self._undos), tuple(self._effects)
