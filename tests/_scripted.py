"""A scripted model behind the real OpenAI and Anthropic SDKs, offline.

`ScriptedModel(turns)` plays one turn per request the SDK sends, through an `httpx2.MockTransport`
(the SDKs' current releases take an `httpx2` client), in the wire format of the endpoint the SDK
called: chat completions (`/chat/completions`), the Responses API (`/responses`) or Anthropic
Messages (`/messages`). So one script drives any of the three. Every request body is recorded
(`model.requests`) so a test can assert what reached the model: the tools, the messages.

A turn is `Turn(calls=(...), text="...")`, or a callable taking the request body and returning
one (to react to what the model was sent). `call(name, arguments, id)` builds a tool call;
`arguments` is a dict (sent as JSON text) or a string sent verbatim (to script malformed JSON).
Call ids default to `call_<n>` (OpenAI) or `toolu_<n>` (Anthropic), numbered across the script.

A request with `"stream": true` is answered as the endpoint streams: server-sent events of
`chat.completion.chunk`s for chat completions (text, then each call's arguments in pieces), or
the Responses API's events (`response.created`, each output item added, its text or arguments
in deltas, done, then `response.completed`). So a streaming run is driven by the same script.

When the script is exhausted the transport answers 400 with `script exhausted`, which the SDK
raises as a `BadRequestError` (clients are built with `max_retries=0`, so nothing is retried).

    model = ScriptedModel([turn(call("lookup_customer", {"email": EMAIL})), say("ok")])
    client = model.openai()  # openai.OpenAI; also async_openai(), anthropic(), ...
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any, Final

import attrs
import httpx2

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import anthropic
    import openai

MODEL: Final = "scripted-model"


@attrs.frozen(kw_only=True)
class Call:
    """One tool call the model makes: `arguments` is a dict, or raw text sent as it is."""

    name: str
    arguments: dict[str, Any] | str = attrs.field(factory=dict)
    id: str | None = None

    def arguments_text(self) -> str:
        """The arguments as the JSON text OpenAI sends."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)

    def arguments_object(self) -> Any:
        """The arguments as the JSON object Anthropic sends (raw text is parsed, or kept)."""
        if isinstance(self.arguments, str):
            try:
                return json.loads(self.arguments)
            except ValueError:
                return self.arguments
        return self.arguments


@attrs.frozen(kw_only=True)
class Turn:
    """One model turn: tool calls (in order), and/or text."""

    calls: tuple[Call, ...] = ()
    text: str = ""


def call(name: str, arguments: dict[str, Any] | str | None = None, id: str | None = None) -> Call:  # noqa: A002
    """A tool call (`arguments` default to `{}`)."""
    return Call(name=name, arguments={} if arguments is None else arguments, id=id)


def turn(*calls: Call, text: str = "") -> Turn:
    """A turn with these calls (and optional text)."""
    return Turn(calls=calls, text=text)


def say(text: str) -> Turn:
    """A final turn: text only, no tool call."""
    return Turn(text=text)


ScriptItem = Turn | Call | str


class ScriptedModel:
    """Plays scripted turns to the SDKs through a mock HTTP transport; records every request.

    A script item is a `Turn`, a single `Call` (a turn with that one call), a string (a final
    text turn), or a callable `(request_body) -> Turn`. Thread-safe: requests are answered in
    arrival order.
    """

    def __init__(self, turns: Iterable[ScriptItem | Callable[[dict[str, Any]], Turn]]) -> None:
        self._turns = list(turns)
        self._lock = threading.Lock()
        self._next_id = 0
        self.requests: list[dict[str, Any]] = []  # JSON request bodies, in order
        self.paths: list[str] = []  # the URL path of each request

    # ------------------------------------------------------------------ clients

    @property
    def transport(self) -> httpx2.MockTransport:
        """A fresh mock transport over this model (sync and async)."""
        return httpx2.MockTransport(self.handler)

    def openai(self) -> openai.OpenAI:
        """A real `openai.OpenAI` client talking to this model."""
        import openai  # noqa: PLC0415

        return openai.OpenAI(
            api_key="test", max_retries=0, http_client=httpx2.Client(transport=self.transport)
        )

    def async_openai(self) -> openai.AsyncOpenAI:
        """A real `openai.AsyncOpenAI` client talking to this model."""
        import openai  # noqa: PLC0415

        return openai.AsyncOpenAI(
            api_key="test", max_retries=0, http_client=httpx2.AsyncClient(transport=self.transport)
        )

    def anthropic(self) -> anthropic.Anthropic:
        """A real `anthropic.Anthropic` client talking to this model."""
        import anthropic  # noqa: PLC0415

        return anthropic.Anthropic(
            api_key="test", max_retries=0, http_client=httpx2.Client(transport=self.transport)
        )

    def async_anthropic(self) -> anthropic.AsyncAnthropic:
        """A real `anthropic.AsyncAnthropic` client talking to this model."""
        import anthropic  # noqa: PLC0415

        return anthropic.AsyncAnthropic(
            api_key="test", max_retries=0, http_client=httpx2.AsyncClient(transport=self.transport)
        )

    # ------------------------------------------------------------------ state

    @property
    def remaining(self) -> int:
        """How many scripted turns have not been played."""
        return len(self._turns)

    @property
    def last(self) -> dict[str, Any]:
        """The body of the last request."""
        return self.requests[-1]

    # ------------------------------------------------------------------ the transport

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        """Answer one SDK request with the next scripted turn, in the endpoint's format."""
        body = json.loads(request.content) if request.content else {}
        path = request.url.path
        with self._lock:
            self.requests.append(body)
            self.paths.append(path)
            if not self._turns:
                return _error(400, "script exhausted: the model has no more scripted turns")
            item = self._turns.pop(0)
            scripted = item(body) if callable(item) else item
            this = _as_turn(scripted)
            n = len(self.requests)
            stream = bool(body.get("stream"))
            if path.endswith("/chat/completions"):
                chat = self._chat(this, n)
                return (
                    _sse(_chat_chunks(chat), done=True)
                    if stream
                    else httpx2.Response(200, json=chat)
                )
            if path.endswith("/responses"):
                response = self._responses(this, n)
                return (
                    _sse(_response_events(response))
                    if stream
                    else httpx2.Response(200, json=response)
                )
            if path.endswith("/messages"):
                return httpx2.Response(200, json=self._messages(this, n))
        return _error(404, f"the scripted model does not serve {path}")

    def _id(self, call: Call, prefix: str) -> str:
        if call.id is not None:
            return call.id
        self._next_id += 1
        return f"{prefix}_{self._next_id}"

    def _chat(self, this: Turn, n: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": this.text or None}
        if this.calls:
            message["tool_calls"] = [
                {
                    "id": self._id(c, "call"),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_text()},
                }
                for c in this.calls
            ]
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls" if this.calls else "stop",
                    "message": message,
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def _responses(self, this: Turn, n: int) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if this.text:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": this.text, "annotations": []}],
                }
            )
        for index, c in enumerate(this.calls):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{n}_{index}",
                    "call_id": self._id(c, "call"),
                    "name": c.name,
                    "arguments": c.arguments_text(),
                    "status": "completed",
                }
            )
        return {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 0,
            "model": MODEL,
            "status": "completed",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }

    def _messages(self, this: Turn, n: int) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if this.text:
            content.append({"type": "text", "text": this.text})
        content.extend(
            {
                "type": "tool_use",
                "id": self._id(c, "toolu"),
                "name": c.name,
                "input": c.arguments_object(),
            }
            for c in this.calls
        )
        return {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": content,
            "stop_reason": "tool_use" if this.calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }


def _sse(events: list[dict[str, Any]], *, done: bool = False) -> httpx2.Response:
    """Server-sent events, one `data:` line each (and the `event:` name when it has a type)."""
    lines = []
    for event in events:
        name = event.get("type")
        head = f"event: {name}\n" if isinstance(name, str) and "." in name else ""
        lines.append(f"{head}data: {json.dumps(event)}\n\n")
    if done:
        lines.append("data: [DONE]\n\n")
    return httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content="".join(lines).encode()
    )


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _chat_chunks(chat: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat completion as the stream of chunks that builds it."""
    head = {key: chat[key] for key in ("id", "created", "model")}
    message = chat["choices"][0]["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {**head, "object": "chat.completion.chunk", "choices": [choice]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks.extend(chunk({"content": piece}) for piece in _pieces(message["content"] or "") if piece)
    for index, tool_call in enumerate(message.get("tool_calls") or ()):
        function = tool_call["function"]
        opening = {"index": index, "id": tool_call["id"], "type": "function"}
        chunks.append(chunk({"tool_calls": [{**opening, "function": {"name": function["name"]}}]}))
        chunks.extend(
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in _pieces(function["arguments"])
        )
    chunks.append(chunk({}, chat["choices"][0]["finish_reason"]))
    chunks.append(
        {**head, "object": "chat.completion.chunk", "choices": [], "usage": chat["usage"]}
    )
    return chunks


def _response_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses API response as the stream of events that builds it."""
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "response": {**response, "status": "in_progress", "output": []},
        }
    ]
    for index, item in enumerate(response["output"]):
        if item["type"] == "function_call":
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "arguments": "", "status": "in_progress"},
                }
            )
            events.extend(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "delta": piece,
                }
                for piece in _pieces(item["arguments"])
            )
        else:
            text = item["content"][0]["text"]
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "content": [], "status": "in_progress"},
                }
            )
            events.extend(
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": piece,
                    "logprobs": [],
                }
                for piece in _pieces(text)
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": response})
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


def _as_turn(item: object) -> Turn:
    if isinstance(item, Turn):
        return item
    if isinstance(item, Call):
        return Turn(calls=(item,))
    if isinstance(item, str):
        return Turn(text=item)
    raise TypeError(f"not a scripted turn: {item!r}")


def _error(status: int, message: str) -> httpx2.Response:
    return httpx2.Response(
        status,
        json={"type": "error", "error": {"type": "invalid_request_error", "message": message}},
    )


# ---------------------------------------------------------------------- reading requests


def chat_tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `role: tool` messages of a chat-completions request, with their content parsed."""
    return [
        {**m, "content": json.loads(m["content"])}
        for m in body.get("messages", [])
        if m.get("role") == "tool"
    ]


def responses_outputs(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `function_call_output` items of a Responses request, with their output parsed."""
    items = body.get("input", [])
    if not isinstance(items, list):
        return []
    return [
        {**i, "output": json.loads(i["output"])}
        for i in items
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]


def anthropic_tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `tool_result` blocks of a Messages request, with their JSON content parsed."""
    found = []
    for message in body.get("messages", []):
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                text = block["content"]
                if isinstance(text, list):  # [{"type": "text", "text": ...}]
                    text = "".join(part.get("text", "") for part in text)
                found.append({**block, "content": json.loads(text)})
    return found


def tool_names(body: dict[str, Any]) -> list[str]:
    """The tool names a request offered the model, whatever its format."""
    names = []
    for spec in body.get("tools", []):
        if "function" in spec:  # chat completions
            names.append(spec["function"]["name"])
        else:  # Responses API and Anthropic: the name at the top level
            names.append(spec["name"])
    return names


# ---------------------------------------------------------------------- the order workflow

CUSTOMER: Final = "${steps.1.id}"


def order_script() -> list[ScriptItem]:
    """The shop's order workflow (tests/_shop.py) as a model plays it, five turns.

    1. `lookup_customer` with the old email (`call_lookup_old`): the closed account.
    2. `charge` (`call_charge_1`) and `reserve` (`call_reserve_1`) in one turn: the reserve
       fails on `customer_id`, agenttx rewinds to step 1 and refunds the charge.
    3. `lookup_customer` with the current email (`call_lookup`), sent again as step 1.
    4. `charge`, `reserve`, `send_confirmation` (`call_charge_2`, `call_reserve_2`,
       `call_confirm`): steps 2 to 4.
    5. The final text.
    """
    from _shop import EMAIL, OLD_EMAIL  # noqa: PLC0415

    reserve = {"customer_id": CUSTOMER, "sku": "SKU-1", "quantity": 2}
    charge = {"customer_id": CUSTOMER, "amount": 42}
    confirm = {"customer_id": CUSTOMER, "email": "${steps.1.email}", "order_id": "o-1"}
    return [
        turn(call("lookup_customer", {"email": OLD_EMAIL}, "call_lookup_old")),
        turn(call("charge", charge, "call_charge_1"), call("reserve", reserve, "call_reserve_1")),
        turn(call("lookup_customer", {"email": EMAIL}, "call_lookup")),
        turn(
            call("charge", charge, "call_charge_2"),
            call("reserve", reserve, "call_reserve_2"),
            call("send_confirmation", confirm, "call_confirm"),
        ),
        say("Order o-1 is placed."),
    ]


def reused_ids_script() -> list[ScriptItem]:
    """The order workflow as a model that numbers its call ids per turn plays it (`call_0`,
    `call_1`, ... in every turn, as real models do), five turns.

    1. `lookup_customer` with the current email (`call_0`): step 1, customer c-1.
    2. `lookup_customer` with the old email (`call_0` again): step 2, the closed account.
    3. `charge` (`call_0`) and `reserve` (`call_1`) for `${steps.2.id}`: the charge is step 3,
       the reserve fails on `customer_id`, agenttx rewinds to step 2 (voiding the second
       turn's `call_0` and this turn's `call_0`) and refunds the charge.
    4. `charge`, `reserve`, `send_confirmation` (`call_0`, `call_1`, `call_2`) for
       `${steps.1.id}`: steps 2 to 4.
    5. The final text.
    """
    from _shop import EMAIL, OLD_EMAIL  # noqa: PLC0415

    def order(customer: str) -> tuple[dict[str, Any], dict[str, Any]]:
        charge = {"customer_id": customer, "amount": 42}
        return charge, {"customer_id": customer, "sku": "SKU-1", "quantity": 2}

    confirm = {"customer_id": CUSTOMER, "email": "${steps.1.email}", "order_id": "o-1"}
    bad_charge, bad_reserve = order("${steps.2.id}")
    charge, reserve = order(CUSTOMER)
    return [
        turn(call("lookup_customer", {"email": EMAIL}, "call_0")),
        turn(call("lookup_customer", {"email": OLD_EMAIL}, "call_0")),
        turn(call("charge", bad_charge, "call_0"), call("reserve", bad_reserve, "call_1")),
        turn(
            call("charge", charge, "call_0"),
            call("reserve", reserve, "call_1"),
            call("send_confirmation", confirm, "call_2"),
        ),
        say("Order o-1 is placed."),
    ]
