"""LangChain tools as agenttx tools, and a transactional drop-in for LangGraph's `ToolNode`.

* `from_langchain(base_tool)` wraps a LangChain `BaseTool` as an agenttx tool whose spec is the
  tool's own (its parameters as LangChain sends them to a model, its description); a
  `ToolException` it raises fails the step with its message.
* `tool_schemas(tools_or_tx)` is the list for `model.bind_tools(...)`: one OpenAI-format
  function per tool, under its wire name.
* `TransactionalToolNode(tx, history=...)` runs the tool calls of the last `AIMessage` of a
  LangGraph `messages` state as one turn (`tx.call_turn`, or `acall_turn` in an async graph) and
  returns one `ToolMessage` per call; after a rewind it rewrites the history through the
  `messages` reducer (`RemoveMessage` to truncate, a message with the same id to void). Like
  LangGraph's `ToolNode`, it supplies the arguments a tool declares as injected
  (`InjectedState`, `InjectedStore`, `InjectedToolCallId`): they reach the LangChain tool only,
  never the step's recorded arguments (`_Injection`).

What reaches the model is described in docs/integrations.md ("LangChain and LangGraph").
Needs the `agenttx[langchain]` extra; `import agenttx` never imports this module or the SDK.
"""

from __future__ import annotations

import contextlib
import json
import typing
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple

try:
    from langchain_core.messages import AIMessage, RemoveMessage, ToolMessage
    from langchain_core.runnables import Runnable
    from langchain_core.tools import BaseTool, InjectedToolCallId, ToolException
    from langchain_core.tools.base import get_all_basemodel_annotations
    from langchain_core.utils.function_calling import convert_to_openai_tool
except ImportError as exc:
    raise ImportError(
        "agenttx.integrations.langchain needs LangChain: pip install 'agenttx[langchain]'"
    ) from exc

from .._errors import FailedPrecondition, InvalidArgument, ToolError
from .._events import EventKind
from .._tools import Compensation, Tool, ToolContext, tool
from . import _common
from ._framework import FrameworkRunner, runner_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from langchain_core.messages import BaseMessage
    from langchain_core.runnables import RunnableConfig

    from .._approvals import ApprovalRequest, Review
    from .._json import JSONValue
    from .._transaction import Transaction

__all__ = ["TransactionalToolNode", "from_langchain", "tool_schemas"]


# ---------------------------------------------------------------------- LangChain tools


def from_langchain(
    base_tool: object,
    *,
    name: str | None = None,
    compensate: Compensation[Any, Any] | str | None = None,
) -> Tool[Any, Any]:
    """An agenttx tool that runs the LangChain tool `base_tool`, one step per call.

    The spec is the tool's own: its description, and its parameters as LangChain sends them to
    a model (`convert_to_openai_tool`: the JSON Schema of its `tool_call_schema`, injected
    arguments left out, titles dropped, references inlined); unexpected arguments are refused
    unless the schema allows them. `name` registers it under another name (default: the tool's).
    `compensate` is the agenttx compensation that undoes a call (see `agenttx.tool`).

    A tool with a synchronous implementation runs through `invoke`; one that only has a
    coroutine (`StructuredTool(coroutine=...)`) through `ainvoke`. A `ToolException` fails the
    step with its message, and so does a pydantic `ValidationError` raised by the tool's own
    validators (its `key` is the first field named), even if the tool sets
    `handle_tool_error`/`handle_validation_error`: LangChain would otherwise turn them into
    an output, and the step would count as a success. The output is what the tool returns.

    Raises `InvalidArgument` naming `base_tool` if it is not a LangChain `BaseTool`, or if its
    schema cannot be read.
    """
    if not isinstance(base_tool, BaseTool):
        hint = "; pass a plain function to agenttx.tool instead" if callable(base_tool) else ""
        raise InvalidArgument(
            f"from_langchain: {_common.describe(base_tool)} is not a LangChain BaseTool{hint}"
        )
    strict = base_tool.model_copy(
        update={"handle_tool_error": False, "handle_validation_error": False}
    )
    parameters = _parameters(base_tool)
    description = base_tool.description or ""
    decorate: Callable[[Callable[..., Any]], Tool[Any, Any]] = tool(
        name=name if name is not None else base_tool.name,
        description=description,
        parameters=parameters,
        compensate=compensate,
    )
    needs = _needs(base_tool)
    is_async = getattr(base_tool, "func", True) is None and getattr(base_tool, "coroutine", None)
    if needs is not None:
        return decorate(_injecting(strict, needs, is_async=bool(is_async)))
    if is_async:

        async def arun_langchain_tool(**arguments: Any) -> object:
            try:
                return await strict.ainvoke(arguments)
            except Exception as exc:
                raise _converted(exc) from exc

        return decorate(arun_langchain_tool)

    def run_langchain_tool(**arguments: Any) -> object:
        try:
            return strict.invoke(arguments)
        except Exception as exc:
            raise _converted(exc) from exc

    return decorate(run_langchain_tool)


class _Needs(NamedTuple):
    """The arguments a LangChain tool declares as injected by LangGraph: each `InjectedState`
    parameter with its state field (None: the whole state), the `InjectedStore` parameter and
    the `InjectedToolCallId` parameter."""

    state: dict[str, str | None]
    store: str | None
    call_id: str | None


class _Injection(NamedTuple):
    """What `TransactionalToolNode` hands the tools of the turn it runs (a context variable,
    which worker threads see too): the graph state, the graph's store and the transaction."""

    state: object
    store: object
    tx: Transaction


_INJECTION: ContextVar[_Injection | None] = ContextVar("agenttx_langgraph", default=None)


def _needs(base_tool: BaseTool) -> _Needs | None:
    """What `base_tool` wants injected, read as LangGraph's `ToolNode` reads it (the annotations
    of its input schema, then of its function); None if nothing."""
    markers: dict[str, type] = {"call_id": InjectedToolCallId}
    try:
        from langgraph.prebuilt import InjectedState, InjectedStore  # noqa: PLC0415
    except ImportError:  # LangChain without LangGraph: only the call id can be injected
        pass
    else:
        markers |= {"state": InjectedState, "store": InjectedStore}
    annotations: dict[str, Any] = {}
    func = getattr(base_tool, "func", None) or getattr(base_tool, "coroutine", None)
    if func is not None:
        with contextlib.suppress(Exception):  # unresolvable hints: the schema still has them
            annotations.update(typing.get_type_hints(func, include_extras=True))
    try:
        annotations.update(get_all_basemodel_annotations(base_tool.get_input_schema()))
    except Exception:  # noqa: BLE001  (no readable schema: nothing to inject)
        return None
    state: dict[str, str | None] = {}
    store = call_id = None
    for name, annotation in annotations.items():
        if typing.get_origin(annotation) is not typing.Annotated:
            continue
        for marker in typing.get_args(annotation)[1:]:
            kind = next((k for k, m in markers.items() if _is(marker, m)), None)
            if kind == "call_id":
                call_id = name
            elif kind == "state":
                state[name] = None if isinstance(marker, type) else getattr(marker, "field", None)
            elif kind == "store":
                store = name
    if not (state or store or call_id):
        return None
    return _Needs(state=state, store=store, call_id=call_id)


def _is(marker: object, kind: type) -> bool:
    return isinstance(marker, kind) or (isinstance(marker, type) and issubclass(marker, kind))


def _injecting(strict: BaseTool, needs: _Needs, *, is_async: bool) -> Callable[..., Any]:
    """The step function of a tool with injected arguments: it adds them from the running
    `TransactionalToolNode`, then invokes the tool (with a whole tool call for a call id)."""

    def tool_input(ctx: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
        injection = _INJECTION.get()
        wanted = [*needs.state, *filter(None, (needs.store, needs.call_id))]
        if injection is None:
            raise ToolError(
                f"LangChain tool {strict.name!r} takes LangGraph's injected arguments "
                f"({', '.join(wanted)}): run it through TransactionalToolNode in a graph"
            )
        given = dict(arguments)
        for parameter, field in needs.state.items():
            given[parameter] = _state_value(injection.state, field, strict.name)
        if needs.store is not None:
            if injection.store is None:
                raise ToolError(
                    f"LangChain tool {strict.name!r} takes the graph's store "
                    f"({needs.store}): compile the graph with a store"
                )
            given[needs.store] = injection.store
        if needs.call_id is None:
            return given
        call_id = _call_id(injection.tx, ctx.step_id)
        return {"type": "tool_call", "name": strict.name, "args": given, "id": call_id}

    if is_async:

        async def arun_langchain_tool(ctx: ToolContext, **arguments: Any) -> object:
            given = tool_input(ctx, arguments)
            try:
                return _unwrapped_output(await strict.ainvoke(given))
            except Exception as exc:
                raise _converted(exc) from exc

        return arun_langchain_tool

    def run_langchain_tool(ctx: ToolContext, **arguments: Any) -> object:
        given = tool_input(ctx, arguments)
        try:
            return _unwrapped_output(strict.invoke(given))
        except Exception as exc:
            raise _converted(exc) from exc

    return run_langchain_tool


def _state_value(state: object, field: str | None, name: str) -> object:
    """The state (or its `field`) as LangGraph's `ToolNode` injects it; a list state is the
    `messages` field."""
    if isinstance(state, list) and field in {None, "messages"}:
        state = {"messages": state}
    if field is None:
        return state
    if isinstance(state, Mapping):
        if field in state:
            return state[field]
    elif hasattr(state, field):
        return getattr(state, field)
    raise ToolError(f"LangChain tool {name!r} takes state field {field!r}, which the state lacks")


def _call_id(tx: Transaction, step_id: int) -> str:
    """The provider's call id of step `step_id`, from the event its dispatch recorded."""
    for event in reversed(tx.audit()):
        if event.kind is EventKind.STEP_DISPATCHED and event.step == step_id:
            found = event.data.get("call_id")
            if isinstance(found, str):
                return found
            break
    raise ToolError(f"step {step_id} was sent without a call id, which its tool takes")


def _unwrapped_output(output: object) -> object:
    """A tool invoked with a whole tool call answers with a `ToolMessage`: its content (the JSON
    LangChain wrote of the tool's value read back), or its artifact when it has one."""
    if not isinstance(output, ToolMessage):
        return output
    if output.artifact is not None:
        return output.artifact
    content = output.content
    if isinstance(content, str) and content[:1] in {"{", "[", '"'}:
        try:
            return json.loads(content)
        except ValueError:
            return content
    return content


def _parameters(base_tool: BaseTool) -> dict[str, Any]:
    """The tool's arguments as LangChain presents them to a model (`convert_to_openai_tool`).

    That is the JSON Schema of its `tool_call_schema` with titles dropped and references
    inlined (a legacy single-input `Tool` takes `__arg1`); `additionalProperties` is false
    unless the schema says otherwise.
    """
    try:
        function = convert_to_openai_tool(base_tool)["function"]
        found: object = function.get("parameters", {"type": "object", "properties": {}})
    except Exception as exc:
        raise InvalidArgument(
            f"from_langchain: cannot read the argument schema of LangChain tool "
            f"{base_tool.name!r}: {exc}"
        ) from exc
    if not isinstance(found, dict) or found.get("type", "object") != "object":
        raise InvalidArgument(
            f"from_langchain: the argument schema of LangChain tool {base_tool.name!r} is not "
            f"a JSON Schema object: {found!r}"
        )
    parameters = {k: v for k, v in found.items() if k not in {"title", "description"}}
    parameters["type"] = "object"
    parameters.setdefault("properties", {})
    parameters.setdefault("additionalProperties", False)
    return parameters


def _converted(exc: Exception) -> Exception:
    """`_tool_error(exc)`, or a plain re-raise (`raise X from X` would make X its own cause)."""
    converted = _tool_error(exc)
    if converted is exc:
        raise exc
    return converted


def _tool_error(exc: Exception) -> Exception:
    """What a LangChain tool's exception becomes: a `ToolError` for the ones LangChain names.

    A pydantic `ValidationError` becomes one line per error, `invalid value for field
    `{path}`: {message}`, keyed on the first error's top-level field.
    """
    if isinstance(exc, ToolException):
        return ToolError(str(exc) or type(exc).__name__)
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ != "ValidationError" or not callable(errors):
        return exc
    try:
        found = [(tuple(e.get("loc") or ()), str(e.get("msg", ""))) for e in errors()]
    except Exception:  # noqa: BLE001  (an unusual ValidationError: keep it as it is)
        return exc
    if not found:
        return exc
    lines = [
        f"invalid value for field `{'.'.join(map(str, loc)) or '?'}`: "
        f"{message.removeprefix('Value error, ')}"
        for loc, message in found
    ]
    first = found[0][0]
    return ToolError("; ".join(lines), key=str(first[0]) if first else None)


def tool_schemas(tools_or_tx: object) -> list[dict[str, JSONValue]]:
    """The tools as OpenAI-format function dicts for `model.bind_tools(...)`, by wire name.

    `tools_or_tx` is a transaction, an engine, one tool, or a list of agenttx tools (and
    compensations, which are not offered). Each entry is `{"type": "function", "function":
    {"name": <wire name>, "description": ..., "parameters": <JSON Schema>}}`, in
    registration order. Raises `InvalidArgument` naming anything that is not a tool (a
    LangChain tool must be wrapped with `from_langchain` first).
    """
    if isinstance(tools_or_tx, BaseTool):
        raise _unwrapped(tools_or_tx)
    if isinstance(tools_or_tx, (list, tuple)):
        for item in tools_or_tx:
            if isinstance(item, BaseTool):
                raise _unwrapped(item)
    return [
        {"type": "function", "function": spec}
        for spec in _common.specs_json(_common.resolve_specs(tools_or_tx, "tool_schemas"))
    ]


def _unwrapped(item: BaseTool) -> InvalidArgument:
    return InvalidArgument(
        f"tool_schemas: {item.name!r} is a LangChain tool; wrap it with "
        "agenttx.integrations.langchain.from_langchain first, and pass the wrapped tool"
    )


# ---------------------------------------------------------------------- the LangGraph node


class TransactionalToolNode(Runnable[Any, Any]):
    """A drop-in for LangGraph's `ToolNode` that runs each turn's calls through a transaction.

    Add it as the tools node of a `StateGraph` whose state has `messages` (with LangGraph's
    `add_messages` reducer): `graph.add_node("tools", TransactionalToolNode(tx))`, routed to by
    `tools_condition`. Each time it runs it takes the last message, an `AIMessage`, and sends
    its tool calls (then its invalid tool calls, whose malformed arguments fail as mistakes) to
    `tx.call_turn` (`acall_turn` when the graph runs asynchronously), in order. It returns
    `{"messages": [...]}` (a list, for a state that is a list of messages) with one
    `ToolMessage` per call: `tool_call_id` the call's id, `name` the tool name the model
    used, content the JSON of `result.for_model()`, and `status="error"` unless the step
    succeeded (a failure, a rollback, a call not run).

    After a rewind, `history` says what happens to the voided calls already in the state:
    `"truncate"` (default) removes their `ToolMessage`s and their calls from the `AIMessage`s
    that made them (an `AIMessage` left with neither calls nor text is removed) and adds a
    `note` to the failed call's result; `"void"` replaces their results by a payload saying
    they were undone; `"keep"` leaves them, and the payload's `voided_steps` is all the model
    gets. Messages without an id cannot be rewritten and are left as they are.

    A tool wrapped with `from_langchain` that declares LangGraph's injected arguments gets them
    as `ToolNode` gives them: `InjectedState` the node's input state (or its field),
    `InjectedStore` the graph's store, `InjectedToolCallId` the call's id. They are never part
    of the step's arguments (not recorded, not shown to the model, not accepted from it).

    Mistakes of the model (an unknown tool, malformed arguments, a duplicate call id, a call
    after the transaction ended) become `ToolMessage`s, never exceptions. Raises
    `InvalidArgument` for an input without messages or whose last message is not an
    `AIMessage`, and at construction for a non-transaction or an unknown `history`.
    Concurrent runs on one transaction are serialized by it, a turn at a time.
    """

    def __init__(
        self, tx: Transaction, *, history: _common.History = "truncate", name: str = "tools"
    ) -> None:
        self.tx = _common.check_transaction(tx, "TransactionalToolNode")
        try:
            self.history: _common.History = _common.check_history(history)
        except InvalidArgument as exc:
            raise InvalidArgument(f"TransactionalToolNode: {exc}") from None
        self.name = name
        # How far the turns got (restored from the store on first use after a restart).
        self._runner: FrameworkRunner | None = None

    @property
    def waiting(self) -> tuple[ApprovalRequest | Review, ...]:
        """The approval requests and reviews the last turn waits on (empty when none)."""
        return () if self._runner is None else self._runner.waiting

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a person decided what the last turn waits on; False after `timeout`
        seconds (None: no limit). See `_runs.Runner.wait`."""
        return True if self._runner is None else self._runner.wait(timeout)

    @property
    def tools(self) -> list[dict[str, JSONValue]]:
        """The transaction's tools for `model.bind_tools(...)` (see `tool_schemas`)."""
        return tool_schemas(self.tx)

    def invoke(
        self,
        input: Any,  # noqa: A002  (Runnable's parameter name)
        config: RunnableConfig | None = None,  # noqa: ARG002  (Runnable's signature)
        **kwargs: Any,  # noqa: ARG002
    ) -> Any:
        """Run the last `AIMessage`'s tool calls as one turn; see the class docstring."""
        messages, as_list = _messages_of(input)
        calls = _calls_of(messages)
        runner = self._runner = runner_of(self.tx, self.history, self._runner)
        token = _INJECTION.set(_Injection(input, _graph_store(), self.tx))
        try:
            runner.turn(messages[-1].id, [call for call, _ in calls])
            while runner.done is None:
                _wait_for_people(runner)
                runner.resume()
        finally:
            _INJECTION.reset(token)
        return self._reply(messages, calls, runner.done, runner.steps, as_list=as_list)

    async def ainvoke(
        self,
        input: Any,  # noqa: A002
        config: RunnableConfig | None = None,  # noqa: ARG002
        **kwargs: Any,  # noqa: ARG002
    ) -> Any:
        """`invoke` for async graphs: the turn runs through `tx.acall_turn`."""
        messages, as_list = _messages_of(input)
        calls = _calls_of(messages)
        runner = self._runner = runner_of(self.tx, self.history, self._runner)
        token = _INJECTION.set(_Injection(input, _graph_store(), self.tx))
        try:
            await runner.aturn(messages[-1].id, [call for call, _ in calls])
            while runner.done is None:
                _wait_for_people(runner)
                await runner.aresume()
        finally:
            _INJECTION.reset(token)
        return self._reply(messages, calls, runner.done, runner.steps, as_list=as_list)

    def _reply(
        self,
        messages: list[BaseMessage],
        calls: list[tuple[_common.ModelCall, str]],
        outcomes: tuple[_common.Outcome, ...],
        steps: Mapping[str, int],
        *,
        as_list: bool,
    ) -> Any:
        rewrite = _common.rewrite_for(self.history, outcomes, steps)
        out: list[BaseMessage] = []
        if rewrite.drop:
            out.extend(_truncate(messages, rewrite.drop))
        if rewrite.replace:
            out.extend(_void(messages[:-1], rewrite.replace))
        for (_, name), outcome in zip(calls, outcomes, strict=True):
            call_id = outcome.call_id
            if call_id in rewrite.drop:
                continue  # its call is gone from the AIMessage too
            replaced = rewrite.replace.get(call_id)
            if replaced is not None:
                out.append(_tool_message(call_id, name, replaced, error=True))
                continue
            payload = _common.with_note(outcome.payload, rewrite.notes.get(call_id))
            out.append(_tool_message(call_id, name, payload, error=outcome.is_error))
        return out if as_list else {"messages": out}


def _wait_for_people(runner: FrameworkRunner) -> None:
    """LangGraph's `interrupt()` while a request of the turn is undecided: the graph stops
    (its checkpointer keeps it); `Command(resume=...)` runs the node again, which finds the
    turn where it stopped. The decisions are read from the transaction's store, never from
    the resume value; a resume before every decision interrupts again."""
    from langgraph.types import interrupt  # noqa: PLC0415  (LangGraph is needed only here)

    while runner.undecided:
        value = {
            "transaction": runner.tx.id,
            "waiting": [
                {"id": r.id, "kind": type(r).__name__, "tool": r.tool, "step": r.step}
                for r in runner.waiting
            ],
        }
        try:
            interrupt(value)
        except RuntimeError as exc:  # not inside a graph run: nothing to interrupt
            raise FailedPrecondition(
                f"TransactionalToolNode: a call of transaction `{runner.tx.id}` waits for a "
                "person and the node is not running in a LangGraph graph to interrupt; run "
                f"it as a node of a graph compiled with a checkpointer ({exc})"
            ) from None


def _graph_store() -> object:
    """The store of the LangGraph graph running this node (`compile(store=...)`), or None."""
    try:
        from langgraph.config import get_store  # noqa: PLC0415
    except ImportError:
        return None
    try:
        return get_store()
    except Exception:  # noqa: BLE001  (not inside a graph run: no store to give)
        return None


def _tool_message(
    call_id: str, name: str | None, payload: _common.Payload, *, error: bool
) -> ToolMessage:
    return ToolMessage(
        content=_common.dumps(payload),
        tool_call_id=call_id,
        name=name,
        status="error" if error else "success",
    )


def _messages_of(state: object) -> tuple[list[BaseMessage], bool]:
    """The state's messages, and whether the state is a list of messages itself."""
    messages = state if isinstance(state, list) else None
    if isinstance(state, Mapping):
        messages = state.get("messages")
    elif messages is None:
        messages = getattr(state, "messages", None)
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument(
            "TransactionalToolNode: the input has no messages (expected a state with a "
            f"non-empty `messages` list), got {_common.describe(state)}"
        )
    return messages, isinstance(state, list)


def _calls_of(messages: list[BaseMessage]) -> list[tuple[_common.ModelCall, str]]:
    """The last AIMessage's calls (valid ones, then invalid ones), with the name the model used."""
    last = messages[-1]
    if not isinstance(last, AIMessage):
        raise InvalidArgument(
            "TransactionalToolNode: the last message must be an AIMessage with tool calls, "
            f"got {_common.describe(last)}"
        )
    calls = [
        (
            _common.ModelCall(call_id=c.get("id") or "", name=c["name"], arguments=c["args"]),
            c["name"],
        )
        for c in last.tool_calls
    ]
    for invalid in last.invalid_tool_calls:
        name = invalid.get("name") or ""
        raw = invalid.get("args")
        call = _common.ModelCall(
            call_id=invalid.get("id") or "",
            name=name,
            arguments=raw if isinstance(raw, str) else "",
        )
        calls.append((call, name))
    return calls


def _model_call(call_id: str | None, name: str, arguments: object) -> _common.ModelCall:
    # A call without an id is refused by the turn (every provider sends one).
    return _common.ModelCall(call_id=call_id or "", name=name, arguments=arguments)


def _truncate(messages: list[BaseMessage], voided: frozenset[str]) -> Iterable[BaseMessage]:
    """Reducer updates that drop the voided calls and their results from the history."""
    for message in messages:
        if message.id is None:
            continue
        if isinstance(message, ToolMessage) and message.tool_call_id in voided:
            yield RemoveMessage(id=message.id)
        elif isinstance(message, AIMessage) and any(
            call.get("id") in voided for call in (*message.tool_calls, *message.invalid_tool_calls)
        ):
            kept = [call for call in message.tool_calls if call.get("id") not in voided]
            kept_invalid = [
                call for call in message.invalid_tool_calls if call.get("id") not in voided
            ]
            if not (kept or kept_invalid or _has_text(message)):
                yield RemoveMessage(id=message.id)
                continue
            yield message.model_copy(
                update={
                    "tool_calls": kept,
                    "invalid_tool_calls": kept_invalid,
                    "content": _without_calls(message.content, voided),
                    "additional_kwargs": _kwargs_without_calls(message.additional_kwargs, voided),
                }
            )


def _void(
    messages: list[BaseMessage], replace: Mapping[str, _common.Payload]
) -> Iterable[BaseMessage]:
    """Reducer updates that overwrite the voided calls' results (same message ids)."""
    for message in messages:
        if isinstance(message, ToolMessage) and message.id is not None:
            payload = replace.get(message.tool_call_id)
            if payload is not None:
                replaced = _tool_message(message.tool_call_id, message.name, payload, error=True)
                yield replaced.model_copy(update={"id": message.id})


def _has_text(message: AIMessage) -> bool:
    content = message.content
    if isinstance(content, str):
        return bool(content.strip())
    return any(
        isinstance(block, str) or (isinstance(block, dict) and block.get("type") == "text")
        for block in content
    )


def _without_calls(content: str | list[str | dict[Any, Any]], voided: frozenset[str]) -> Any:
    """Content blocks without the voided `tool_use` blocks (Anthropic-style content)."""
    if isinstance(content, str):
        return content
    return [
        block
        for block in content
        if not (
            isinstance(block, dict)
            and block.get("type") in {"tool_use", "tool_call"}
            and block.get("id") in voided
        )
    ]


def _kwargs_without_calls(kwargs: dict[str, Any], voided: frozenset[str]) -> dict[str, Any]:
    """`additional_kwargs` without the voided raw OpenAI `tool_calls` entries."""
    raw = kwargs.get("tool_calls")
    if not isinstance(raw, list):
        return kwargs
    kept = [call for call in raw if not (isinstance(call, dict) and call.get("id") in voided)]
    updated = dict(kwargs)
    if kept:
        updated["tool_calls"] = kept
    else:
        updated.pop("tool_calls")
    return updated
