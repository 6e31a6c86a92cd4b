"""LangChain tools as agenttx tools, and a transactional drop-in for LangGraph's `ToolNode`.

* `from_langchain(base_tool)` wraps a LangChain `BaseTool` as an agenttx tool whose spec is the
  tool's own (its `tool_call_schema` as JSON Schema, its description); a `ToolException` it
  raises fails the step with its message.
* `tool_schemas(tools_or_tx)` is the list for `model.bind_tools(...)`: one OpenAI-format
  function per tool, under its wire name.
* `TransactionalToolNode(tx, history=...)` runs the tool calls of the last `AIMessage` of a
  LangGraph `messages` state as one turn (`tx.call_turn`, or `acall_turn` in an async graph) and
  returns one `ToolMessage` per call; after a rewind it rewrites the history through the
  `messages` reducer (`RemoveMessage` to truncate, a message with the same id to void).

What reaches the model is described in docs/integrations.md ("LangChain and LangGraph").
Needs the `agenttx[langchain]` extra; `import agenttx` never imports this module or the SDK.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

try:
    from langchain_core.messages import AIMessage, RemoveMessage, ToolMessage
    from langchain_core.runnables import Runnable
    from langchain_core.tools import BaseTool, ToolException
except ImportError as exc:
    raise ImportError(
        "agenttx.integrations.langchain needs LangChain: pip install 'agenttx[langchain]'"
    ) from exc

from .._errors import FailedPrecondition, InvalidArgument, ToolError
from .._tools import Compensation, Tool, ToolRegistry, tool

if TYPE_CHECKING:
    from collections.abc import Callable

    from langchain_core.messages import BaseMessage
    from langchain_core.runnables import RunnableConfig

    from .._json import JSONValue
    from .._results import StepResult
    from .._tools import ToolLike, ToolSpec

__all__ = ["TransactionalToolNode", "from_langchain", "tool_schemas"]

History = Literal["truncate", "void", "keep"]
_HISTORIES: Final = ("truncate", "void", "keep")


# ---------------------------------------------------------------------- LangChain tools


def from_langchain(
    base_tool: object,
    *,
    name: str | None = None,
    compensate: Compensation[Any, Any] | str | None = None,
) -> Tool[Any, Any]:
    """An agenttx tool that runs the LangChain tool `base_tool`, one step per call.

    The spec is the tool's own: its description, and its `tool_call_schema` (the arguments the
    model sends, without injected ones) as JSON Schema; unexpected arguments are refused unless
    the schema allows them. `name` registers it under another name (default: the tool's).
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
        raise InvalidArgument(f"from_langchain: {base_tool!r} is not a LangChain BaseTool{hint}")
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
    if getattr(base_tool, "func", True) is None and getattr(base_tool, "coroutine", None):

        async def arun_langchain_tool(**arguments: Any) -> object:
            try:
                return await strict.ainvoke(arguments)
            except Exception as exc:
                raise _tool_error(exc) from exc

        return decorate(arun_langchain_tool)

    def run_langchain_tool(**arguments: Any) -> object:
        try:
            return strict.invoke(arguments)
        except Exception as exc:
            raise _tool_error(exc) from exc

    return decorate(run_langchain_tool)


def _parameters(base_tool: BaseTool) -> dict[str, Any]:
    """The tool's arguments as a JSON Schema object (top-level title and description dropped)."""
    try:
        schema = base_tool.tool_call_schema
        if isinstance(schema, dict):
            found: object = schema
        elif hasattr(schema, "model_json_schema"):
            found = schema.model_json_schema()
        else:  # a pydantic v1 model
            found = schema.schema()
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


def _tool_error(exc: Exception) -> Exception:
    """What a LangChain tool's exception becomes: a `ToolError` for the ones LangChain names."""
    if isinstance(exc, ToolException):
        return ToolError(str(exc) or type(exc).__name__)
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ == "ValidationError" and callable(errors):
        try:
            first = errors()[0]
            location = first.get("loc") or ()
        except Exception:  # noqa: BLE001  (an unusual ValidationError: keep its text)
            return exc
        key = str(location[0]) if location else None
        return ToolError(str(exc), key=key)
    return exc


def _specs(tools_or_tx: object) -> tuple[ToolSpec, ...]:
    """The specs of a transaction's or engine's tools, or of a list of tools."""
    specs = getattr(tools_or_tx, "tool_specs", None)
    if isinstance(specs, tuple):
        return specs
    if isinstance(tools_or_tx, (str, bytes, Mapping)) or not isinstance(tools_or_tx, Iterable):
        raise InvalidArgument(
            f"tool_schemas: expected a transaction, an engine or a list of tools, "
            f"got {tools_or_tx!r}"
        )
    items: list[ToolLike] = []
    for item in tools_or_tx:
        if isinstance(item, BaseTool):
            raise InvalidArgument(
                f"tool_schemas: {item!r} is a LangChain tool; wrap it with from_langchain first"
            )
        if not (isinstance(item, (Tool, Compensation)) or callable(item)):
            raise InvalidArgument(f"tool_schemas: {item!r} is not a tool")
        items.append(item)
    return ToolRegistry(items).specs()


def tool_schemas(tools_or_tx: object) -> list[dict[str, JSONValue]]:
    """The tools as OpenAI-format function dicts for `model.bind_tools(...)`, by wire name.

    `tools_or_tx` is a transaction, an engine, or a list of agenttx tools (and
    compensations, which are skipped). Each entry is `{"type": "function", "function":
    {"name": <wire name>, "description": ..., "parameters": <JSON Schema>}}`, in
    registration order. Raises `InvalidArgument` naming anything that is not a tool (a
    LangChain tool must be wrapped with `from_langchain` first).
    """
    return [
        {
            "type": "function",
            "function": {
                "name": spec.wire_name,
                "description": spec.description,
                "parameters": spec.parameters,
            },
        }
        for spec in _specs(tools_or_tx)
    ]


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
    succeeded (a failure, a rollback, a call not run after an earlier failure of the turn).

    After a rewind, `history` says what happens to the voided calls already in the state:
    `"truncate"` (default) removes their `ToolMessage`s and their calls from the `AIMessage`s
    that made them (an `AIMessage` left with neither calls nor text is removed); `"void"`
    replaces their results by a note that they were undone; `"keep"` leaves them, and the
    payload's `voided_steps` is all the model gets. Messages without an id cannot be
    rewritten and are left as they are.

    Misuse by the model (an unknown tool, malformed arguments, a duplicate call id, a call
    after the transaction ended) becomes a `ToolMessage`, never an exception. Raises
    `InvalidArgument` for an input without messages or whose last message is not an
    `AIMessage`, and at construction for a non-transaction or an unknown `history`.
    Calls on one node are serialized by the transaction.
    """

    def __init__(self, tx: object, *, history: History = "truncate", name: str = "tools") -> None:
        from .._transaction import Transaction  # noqa: PLC0415

        if not isinstance(tx, Transaction):
            raise InvalidArgument(
                f"TransactionalToolNode: expected an agenttx Transaction, got {tx!r}"
            )
        if history not in _HISTORIES:
            raise InvalidArgument(
                f"TransactionalToolNode: history must be one of {', '.join(_HISTORIES)}, "
                f"got {history!r}"
            )
        self.tx = tx
        self.history: History = history
        self.name = name

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
        try:
            results = self.tx.call_turn([call.turn for call in calls])
        except FailedPrecondition as exc:  # the transaction has ended: tell the model
            return self._refused(calls, exc, as_list=as_list)
        return self._reply(messages, calls, results, as_list=as_list)

    async def ainvoke(
        self,
        input: Any,  # noqa: A002
        config: RunnableConfig | None = None,  # noqa: ARG002  (Runnable's signature)
        **kwargs: Any,  # noqa: ARG002
    ) -> Any:
        """`invoke` for async graphs: the turn runs through `tx.acall_turn`."""
        messages, as_list = _messages_of(input)
        calls = _calls_of(messages)
        try:
            results = await self.tx.acall_turn([call.turn for call in calls])
        except FailedPrecondition as exc:
            return self._refused(calls, exc, as_list=as_list)
        return self._reply(messages, calls, results, as_list=as_list)

    def _reply(
        self,
        messages: list[BaseMessage],
        calls: list[_Call],
        results: Iterable[StepResult],
        *,
        as_list: bool,
    ) -> Any:
        results = list(results)
        voided = {call_id for result in results for call_id in result.voided_call_ids}
        history = self.history if voided else "keep"
        out: list[BaseMessage] = []
        if history == "truncate":
            out.extend(_truncate(messages, voided))
        elif history == "void":
            out.extend(_void(messages[:-1], voided))
        for call, result in zip(calls, results, strict=True):
            if history != "keep" and call.call_id in voided:
                if history == "void":
                    out.append(_void_message(call.call_id, call.name))
                continue  # truncate: its call is gone from the AIMessage too
            out.append(_tool_message(call, result.for_model()))
        return out if as_list else {"messages": out}

    def _refused(self, calls: list[_Call], exc: Exception, *, as_list: bool) -> Any:
        """One error result per call, when the transaction refuses the turn (it has ended)."""
        payload: dict[str, JSONValue] = {
            "ok": False,
            "error": f"{exc}",
            "instruction": "The transaction has ended: no more tool calls can run in it.",
        }
        out = [_tool_message(call, payload) for call in calls]
        return out if as_list else {"messages": out}


class _Call:
    """One tool call of the model's turn: what goes to `call_turn`, and how to answer it."""

    __slots__ = ("call_id", "name", "turn")

    def __init__(self, name: str, arguments: object, call_id: str | None) -> None:
        self.name = name
        self.call_id = call_id or ""
        self.turn = (name, arguments, call_id) if call_id else (name, arguments)


def _tool_message(call: _Call, payload: Mapping[str, JSONValue]) -> ToolMessage:
    return ToolMessage(
        content=json.dumps(payload, ensure_ascii=False),
        tool_call_id=call.call_id,
        name=call.name,
        status="success" if payload.get("ok") is True else "error",
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
            f"non-empty `messages` list), got {type(state).__name__}"
        )
    return messages, isinstance(state, list)


def _calls_of(messages: list[BaseMessage]) -> list[_Call]:
    """The last AIMessage's calls, valid ones first, then the invalid ones (malformed JSON)."""
    last = messages[-1]
    if not isinstance(last, AIMessage):
        raise InvalidArgument(
            "TransactionalToolNode: the last message must be an AIMessage with tool calls, "
            f"got {type(last).__name__}"
        )
    calls = [_Call(call["name"], call["args"], call.get("id")) for call in last.tool_calls]
    for invalid in last.invalid_tool_calls:
        raw = invalid.get("args")
        calls.append(
            _Call(invalid.get("name") or "", raw if isinstance(raw, str) else "", invalid.get("id"))
        )
    return calls


def _truncate(messages: list[BaseMessage], voided: set[str]) -> Iterable[BaseMessage]:
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


def _void(messages: list[BaseMessage], voided: set[str]) -> Iterable[BaseMessage]:
    """Reducer updates that overwrite the voided calls' results with a note (same ids)."""
    for message in messages:
        if (
            isinstance(message, ToolMessage)
            and message.id is not None
            and message.tool_call_id in voided
        ):
            replaced = _void_message(message.tool_call_id, message.name)
            yield replaced.model_copy(update={"id": message.id})


#: What a voided call's result becomes under `history="void"`.
VOIDED: Final[dict[str, JSONValue]] = {
    "ok": False,
    "voided": True,
    "error": "This call was undone by a rollback: its result no longer holds.",
}


def _void_message(call_id: str, tool_name: str | None) -> ToolMessage:
    return ToolMessage(
        content=json.dumps(VOIDED, ensure_ascii=False),
        tool_call_id=call_id,
        name=tool_name,
        status="error",
    )


def _has_text(message: AIMessage) -> bool:
    content = message.content
    if isinstance(content, str):
        return bool(content.strip())
    return any(
        isinstance(block, str) or (isinstance(block, dict) and block.get("type") == "text")
        for block in content
    )


def _without_calls(content: str | list[str | dict[Any, Any]], voided: set[str]) -> Any:
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


def _kwargs_without_calls(kwargs: dict[str, Any], voided: set[str]) -> dict[str, Any]:
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
