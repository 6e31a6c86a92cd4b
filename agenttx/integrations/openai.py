"""agenttx in an OpenAI agent loop: chat completions and the Responses API.

Needs the `agenttx[openai]` extra. The loop a user writes (docs/integrations.md):

    runner = ToolRunner(tx)  # history="truncate" | "void" | "keep"; plans=True
    while True:
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=runner.tools)
        if not reply.choices[0].message.tool_calls:
            break
        messages = runner.handle(messages, reply.choices[0].message)

`ToolRunner.handle` runs the turn's tool calls through `tx.call_turn` (in order, one step
each, stopping at the first failure), appends the assistant message and one `role: "tool"`
message per call whose content is `json.dumps(result.for_model())`, and after a rewind
rewrites the history as `history` says. `ResponsesToolRunner` is the same for the Responses
API (`function_call` / `function_call_output` items). With `plans=True` the model is also
offered `propose_plan`, and a plan it proposes is checked and run (docs/plans.md). What the
model sees is documented in docs/integrations.md; nothing in this module changes a step's
outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, final

try:
    import openai as _openai
except ImportError as exc:  # pragma: no cover  (tested by hiding the SDK, in a subprocess)
    raise ImportError(
        "agenttx.integrations.openai needs the OpenAI SDK: pip install 'agenttx[openai]'"
    ) from exc

from .._errors import InvalidArgument
from ._common import (
    ModelCall,
    Outcome,
    Rewrite,
    Runner,
    describe,
    dumps,
    resolve_specs,
    voided_payload,
    with_note,
)

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterable, Iterator, Sequence

    from openai.types.chat import ChatCompletionMessage
    from openai.types.responses import Response

    from .._tools import ToolSpec
    from ._common import ToolsOrTx

__all__ = ["ResponsesToolRunner", "ToolRunner", "tools"]

Message = dict[str, Any]


def tools(tools_or_tx: ToolsOrTx, *, api: Literal["chat", "responses"] = "chat") -> list[Message]:
    """The `tools=` list for `client.chat.completions.create` (or `responses.create`).

    `tools_or_tx` is a `Transaction`, an `Engine`, one tool, or a list of tools (what
    `Transaction(tools=...)` accepts; compensations are left out). Each tool is offered under
    its wire name with its spec's description and JSON Schema parameters. Raises
    `InvalidArgument` naming any item that is not a tool, and for an unknown `api`.
    """
    if api not in ("chat", "responses"):
        raise InvalidArgument(f"api must be 'chat' or 'responses', got {api!r}")
    specs = resolve_specs(tools_or_tx, "agenttx.integrations.openai.tools()")
    return [_entry(spec, api) for spec in specs]


def _entry(spec: ToolSpec, api: Literal["chat", "responses"]) -> Message:
    """One tool of the `tools=` list, in the format of `api`."""
    if api == "chat":
        return {
            "type": "function",
            "function": {
                "name": spec.wire_name,
                "description": spec.description,
                "parameters": spec.parameters,
            },
        }
    return {
        "type": "function",
        "name": spec.wire_name,
        "description": spec.description,
        "parameters": spec.parameters,
        "strict": False,
    }


# ---------------------------------------------------------------------- shared runner state


class _Runner(Runner):
    """A runner of either OpenAI API: `tools` for the API it serves."""

    _api: Literal["chat", "responses"]

    @property
    def tools(self) -> list[Message]:
        """The `tools=` list to send with every request (a new deep copy each time), with
        `propose_plan` last when the runner was made with `plans=True`."""
        offered = tools(self._tx, api=self._api)  # each spec.parameters is a new copy
        if self._plan_spec is not None:
            offered.append(_entry(self._plan_spec, self._api))
        return offered


def _as_dict(item: object, where: str) -> Message:
    """A message or item as a plain dict: a dict as it is (never changed), SDK models dumped."""
    if type(item) is dict:
        return item  # shared with the caller's list: the runners build new dicts, never edit
    if isinstance(item, Mapping):
        return dict(item)
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        dumped = dump(mode="json", exclude_none=True, warnings=False)
        if isinstance(dumped, dict):
            return dumped
    raise InvalidArgument(f"{where} is {describe(item)}, not a message")


def _as_list(messages: object, where: str) -> list[Message]:
    if isinstance(messages, (str, bytes, Mapping)) or not hasattr(messages, "__iter__"):
        raise InvalidArgument(
            f"{where}: messages must be a list of messages, got {describe(messages)}"
        )
    found = list(messages)
    if set(map(type, found)) <= {dict}:  # the usual case, checked at C speed: nothing to convert
        return found
    return [
        m if type(m) is dict else _as_dict(m, f"{where}: messages[{i}]")
        for i, m in enumerate(found)
    ]


# ---------------------------------------------------------------------- chat completions


def _assistant(message: object) -> Message:
    """The assistant message as a dict, refusing the SDK objects users pass by mistake."""
    if isinstance(message, _openai.types.chat.ChatCompletion):
        raise InvalidArgument(
            "ToolRunner.handle takes the assistant message, not the ChatCompletion: "
            "pass completion.choices[0].message"
        )
    if isinstance(message, _openai.types.chat.chat_completion.Choice):
        raise InvalidArgument("ToolRunner.handle takes the assistant message: pass choice.message")
    if not isinstance(message, (Mapping, _openai.types.chat.ChatCompletionMessage)):
        raise InvalidArgument(
            "ToolRunner.handle takes a ChatCompletionMessage (completion.choices[0].message) "
            f"or its dict, got {describe(message)}"
        )
    found = _as_dict(message, "the assistant message")
    if found.get("role") != "assistant":
        raise InvalidArgument(
            f"ToolRunner.handle: the assistant message has role {found.get('role')!r}, "
            "not 'assistant'"
        )
    return found


def _chat_calls(message: Message) -> list[ModelCall]:
    calls = []
    for index, raw in enumerate(message.get("tool_calls") or ()):
        if not isinstance(raw, Mapping) or not isinstance(raw.get("id"), str):
            raise InvalidArgument(
                f"ToolRunner.handle: tool_calls[{index}] has no string id: {describe(raw)}"
            )
        function = raw.get("function") or raw.get("custom") or {}
        if not isinstance(function, Mapping):
            function = {}
        arguments = function.get("arguments", function.get("input", "{}"))
        calls.append(ModelCall(call_id=raw["id"], name=function.get("name"), arguments=arguments))
    return calls


def _same_turn(last: Message | None, message: Message, id_key: str) -> bool:
    """True when `last` is `message` already appended by the caller (same role and call ids)."""
    if last is None or last.get("role") != message.get("role"):
        return False
    ids = [c.get("id") for c in last.get(id_key) or ()]
    return ids == [c.get("id") for c in message.get(id_key) or ()] and bool(ids)


def _chat_entries(messages: list[Message]) -> Iterator[tuple[Hashable, bool, object, object]]:
    """The tool calls and results of a chat history, for `Rewrite.reached`: a call is keyed
    `(message index, position)`, a result by its message index."""
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            for position, call in enumerate(message.get("tool_calls") or ()):
                if isinstance(call, Mapping):
                    yield (index, position), False, call.get("id"), None
        elif role == "tool":
            yield index, True, message.get("tool_call_id"), message.get("content")


def _rewrite_chat(messages: list[Message], rewrite: Rewrite) -> list[Message]:
    if rewrite.empty:
        return messages
    reached = rewrite.reached(_chat_entries(messages))
    if not reached:
        return messages
    out: list[Message] = []
    for index, original in enumerate(messages):
        message = original
        role = message.get("role")
        calls = message.get("tool_calls")
        if role == "assistant" and calls and rewrite.truncate:
            kept = [c for position, c in enumerate(calls) if (index, position) not in reached]
            if len(kept) != len(calls):
                if kept:
                    message = {**message, "tool_calls": kept}
                elif message.get("content"):
                    message = {k: v for k, v in message.items() if k != "tool_calls"}
                else:
                    continue
        elif role == "tool" and index in reached:
            if rewrite.truncate:
                continue
            message = {**message, "content": dumps(voided_payload(reached[index]))}
        out.append(message)
    return out


@final
class ToolRunner(_Runner):
    """Runs the tool calls of chat-completions turns in a transaction.

    `tools` is the `tools=` list; `handle(messages, assistant_message)` returns the messages to
    send next (a new list; the one given is not changed). Not thread-safe: one runner serves
    one conversation (the transaction itself serializes concurrent calls).
    """

    _api = "chat"

    def handle(self, messages: Iterable[object], assistant_message: object) -> list[Message]:
        """Run the turn's tool calls; return the history with the assistant message and results.

        `assistant_message` is the SDK's `ChatCompletionMessage` (or its dict); if `messages`
        already ends with it, it is not appended twice. One `role: "tool"` message per tool
        call, in order, even for calls that were not run. After a rewind the history is
        rewritten as `history` says. A message with no tool calls is appended and nothing runs.
        """
        history, message, calls = self._parse(messages, assistant_message)
        return self._finish(history, message, self._run_turn(calls))

    async def ahandle(self, messages: Iterable[object], assistant_message: object) -> list[Message]:
        """`handle` for async code: the tools run through `tx.acall_turn`."""
        history, message, calls = self._parse(messages, assistant_message)
        return self._finish(history, message, await self._arun_turn(calls))

    def _parse(
        self, messages: Iterable[object], assistant_message: ChatCompletionMessage | object
    ) -> tuple[list[Message], Message, list[ModelCall]]:
        history = _as_list(messages, "ToolRunner.handle")
        message = _assistant(assistant_message)
        return history, message, _chat_calls(message)

    def _finish(
        self, history: list[Message], message: Message, outcomes: Sequence[Outcome]
    ) -> list[Message]:
        if not _same_turn(history[-1] if history else None, message, "tool_calls"):
            history.append(message)
        rewrite = self._rewrite(outcomes)
        history.extend(
            {
                "role": "tool",
                "tool_call_id": o.call_id,
                "content": dumps(with_note(o.payload, rewrite.notes.get(o.call_id))),
            }
            for o in outcomes
        )
        return _rewrite_chat(history, rewrite)


# ---------------------------------------------------------------------- the Responses API


def _output_items(response: object) -> list[Message]:
    if isinstance(response, _openai.types.chat.ChatCompletion):
        raise InvalidArgument(
            "ResponsesToolRunner.handle takes a Response from client.responses.create, "
            "not a ChatCompletion (use ToolRunner for chat completions)"
        )
    if isinstance(response, _openai.types.responses.Response):
        return [_as_dict(item, "an output item") for item in response.output]
    if isinstance(response, Mapping) and isinstance(response.get("output"), list):
        return [_as_dict(item, "an output item") for item in response["output"]]
    if isinstance(response, list):
        return [_as_dict(item, f"output[{i}]") for i, item in enumerate(response)]
    raise InvalidArgument(
        "ResponsesToolRunner.handle takes a Response (or its output items), "
        f"got {describe(response)}"
    )


def _responses_calls(items: Sequence[Message]) -> list[ModelCall]:
    calls = []
    for item in items:
        if item.get("type") != "function_call":
            continue
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise InvalidArgument(
                f"ResponsesToolRunner.handle: a function_call has no call_id: {item!r}"
            )
        calls.append(
            ModelCall(call_id=call_id, name=item.get("name"), arguments=item.get("arguments", "{}"))
        )
    return calls


def _rewrite_items(items: list[Message], rewrite: Rewrite) -> list[Message]:
    if rewrite.empty:
        return items
    reached = rewrite.reached(
        (index, item.get("type") == "function_call_output", item.get("call_id"), item.get("output"))
        for index, item in enumerate(items)
        if item.get("type") in ("function_call", "function_call_output")
    )
    if not reached:
        return items
    out: list[Message] = []
    for index, original in enumerate(items):
        item = original
        if index in reached:
            if rewrite.truncate:
                continue
            if item.get("type") == "function_call_output":
                item = {**item, "output": dumps(voided_payload(reached[index]))}
        out.append(item)
    return out


@final
class ResponsesToolRunner(_Runner):
    """Runs the function calls of Responses API turns in a transaction.

    `tools` is the Responses `tools=` list; `handle(input_items, response)` returns the input
    items to send next: the ones given, the response's output items, and one
    `function_call_output` per function call. History rewrites need the full input each
    request; with `previous_response_id` (the server keeps the history) use `history="keep"`.
    """

    _api = "responses"

    def handle(
        self, input_items: str | Iterable[object], response: Response | object
    ) -> list[Message]:
        """Run the response's function calls; return the input items for the next request.

        `input_items` may be the first request's input string (it becomes a user message).
        """
        items, calls = self._parse(input_items, response)
        return self._finish(items, self._run_turn(calls))

    async def ahandle(
        self, input_items: str | Iterable[object], response: Response | object
    ) -> list[Message]:
        """`handle` for async code: the tools run through `tx.acall_turn`."""
        items, calls = self._parse(input_items, response)
        return self._finish(items, await self._arun_turn(calls))

    def _parse(
        self, input_items: object, response: object
    ) -> tuple[list[Message], list[ModelCall]]:
        if isinstance(input_items, str):
            items = [{"role": "user", "content": input_items}]
        else:
            items = _as_list(input_items, "ResponsesToolRunner.handle")
        output = _output_items(response)
        known = {i.get("id") for i in items if i.get("id") is not None}
        items.extend(i for i in output if i.get("id") is None or i.get("id") not in known)
        return items, _responses_calls(output)

    def _finish(self, items: list[Message], outcomes: Sequence[Outcome]) -> list[Message]:
        rewrite = self._rewrite(outcomes)
        items.extend(
            {
                "type": "function_call_output",
                "call_id": o.call_id,
                "output": dumps(with_note(o.payload, rewrite.notes.get(o.call_id))),
            }
            for o in outcomes
        )
        return _rewrite_items(items, rewrite)
