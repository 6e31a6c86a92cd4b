"""agenttx in an Anthropic agent loop: Messages API `tool_use` and `tool_result` blocks.

Needs the `agenttx[anthropic]` extra. The loop a user writes (docs/integrations.md):

    runner = ToolRunner(tx)  # history="truncate" | "void" | "keep"; plans=True
    while True:
        reply = client.messages.create(
            model=MODEL, max_tokens=1024, messages=messages, tools=runner.tools
        )
        if reply.stop_reason != "tool_use":
            break
        messages = runner.handle(messages, reply)

`ToolRunner.handle` runs the reply's `tool_use` blocks through `tx.call_turn` (in order, one
step each, stopping at the first failure), appends the assistant message and then one user
message holding a `tool_result` block for every `tool_use` (content
`json.dumps(result.for_model())`, `is_error` true unless the step succeeded), so roles keep
alternating. After a rewind the history is rewritten as `history` says, merging any two
messages of the same role the rewrite makes adjacent. With `plans=True` the model is also
offered `propose_plan`, and a plan it proposes is checked and run (docs/plans.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeGuard, final

try:
    import anthropic as _anthropic
except ImportError as exc:  # pragma: no cover  (tested by hiding the SDK, in a subprocess)
    raise ImportError(
        "agenttx.integrations.anthropic needs the Anthropic SDK: pip install 'agenttx[anthropic]'"
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

    from .._tools import ToolSpec
    from ._common import ToolsOrTx

__all__ = ["ToolRunner", "tools"]

Message = dict[str, Any]


def tools(tools_or_tx: ToolsOrTx) -> list[Message]:
    """The `tools=` list for `client.messages.create`.

    `tools_or_tx` is a `Transaction`, an `Engine`, one tool, or a list of tools (what
    `Transaction(tools=...)` accepts; compensations are left out). Each tool is offered under
    its wire name, with its spec's description and its parameters as `input_schema`. Raises
    `InvalidArgument` naming any item that is not a tool.
    """
    specs = resolve_specs(tools_or_tx, "agenttx.integrations.anthropic.tools()")
    return [_entry(spec) for spec in specs]


def _entry(spec: ToolSpec) -> Message:
    """One tool of the `tools=` list."""
    return {
        "name": spec.wire_name,
        "description": spec.description,
        "input_schema": spec.parameters,
    }


#: The fields of an SDK object that hold what the model wrote, kept as they are when the
#: object is too deep for pydantic to dump (a message's blocks are then dumped one by one).
_RAW_FIELDS = ("content", "input")


def _dump(item: object, where: str) -> Any:
    if isinstance(item, Mapping):
        return dict(item)
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json", exclude_none=True, warnings=False)
        except (ValueError, RecursionError):
            # pydantic stops at its serialization depth: a `tool_use` input nested that deep
            # is the model's mistake, which the call's step answers (its JSON is too deep).
            found = dump(mode="json", exclude_none=True, warnings=False, exclude=set(_RAW_FIELDS))
            raw = {name: getattr(item, name) for name in _RAW_FIELDS if hasattr(item, name)}
            return {**found, **raw}
    raise InvalidArgument(f"{where} is {describe(item)}, not a message or content block")


def _plain(item: object) -> TypeGuard[Message]:
    """True for a message already in request form (a dict of role and content, blocks dicts)."""
    if type(item) is not dict or not item.keys() <= {"role", "content"}:
        return False
    content = item.get("content")
    return isinstance(content, str) or (
        isinstance(content, list) and all(type(block) is dict for block in content)
    )


def _message(item: object, where: str) -> Message:
    if _plain(item):
        return item  # shared with the caller, never changed: rewrites build new dicts
    found = _dump(item, where)
    if not isinstance(found, dict):  # pragma: no cover  (model_dump returns a dict)
        raise InvalidArgument(f"{where} is {describe(item)}, not a message")
    content = found.get("content")
    if isinstance(content, list):
        content = [_dump(b, f"{where}: a content block") for b in content]
    # A request message is a role and its content (a dumped SDK Message also has id, usage...).
    return {"role": found.get("role"), "content": content}


def _assistant(message: object) -> Message:
    if isinstance(message, (_anthropic.types.ToolUseBlock, _anthropic.types.TextBlock)):
        raise InvalidArgument(
            "ToolRunner.handle takes the whole Message from client.messages.create, "
            f"not one of its content blocks ({describe(message)})"
        )
    if not isinstance(message, (Mapping, _anthropic.types.Message)):
        raise InvalidArgument(
            "ToolRunner.handle takes the Message from client.messages.create (or its dict), "
            f"got {describe(message)}"
        )
    found = _message(message, "the assistant message")
    if found.get("role") != "assistant":
        raise InvalidArgument(
            f"ToolRunner.handle: the message has role {found.get('role')!r}, not 'assistant'"
        )
    return found


def _calls(message: Message) -> list[ModelCall]:
    content = message.get("content")
    calls = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, Mapping) or block.get("type") != "tool_use":
            continue
        call_id = block.get("id")
        if not isinstance(call_id, str):
            raise InvalidArgument(
                f"ToolRunner.handle: a tool_use block has no string id: {block!r}"
            )
        calls.append(
            ModelCall(call_id=call_id, name=block.get("name"), arguments=block.get("input", {}))
        )
    return calls


def _ids(message: Message | None) -> list[object]:
    if message is None or not isinstance(message.get("content"), list):
        return []
    return [
        b.get("id")
        for b in message["content"]
        if isinstance(b, Mapping) and b.get("type") == "tool_use"
    ]


def _blocks(content: object) -> list[Any]:
    if isinstance(content, list):
        return content
    if isinstance(content, str) and content:
        return [{"type": "text", "text": content}]
    return []


def _entries(messages: list[Message]) -> Iterator[tuple[Hashable, bool, object, object]]:
    """The `tool_use` and `tool_result` blocks of a history, for `Rewrite.reached`, each keyed
    `(message index, block index)`."""
    for index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for position, block in enumerate(content):
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind == "tool_use":
                yield (index, position), False, block.get("id"), None
            elif kind == "tool_result":
                yield (index, position), True, block.get("tool_use_id"), block.get("content")


def _rewrite(messages: list[Message], rewrite: Rewrite) -> list[Message]:
    if rewrite.empty:
        return messages
    reached = rewrite.reached(_entries(messages))
    if not reached:
        return messages
    out: list[Message] = []
    for index, original in enumerate(messages):
        message = original
        content = message.get("content")
        if isinstance(content, list) and any((index, p) in reached for p in range(len(content))):
            blocks = []
            for position, given in enumerate(content):
                block = given
                step = reached.get((index, position))
                if step is not None:
                    if rewrite.truncate:
                        continue
                    if block.get("type") == "tool_result":
                        payload = dumps(voided_payload(step))
                        block = {**block, "content": payload, "is_error": True}
                blocks.append(block)
            if not blocks:
                continue  # only voided calls or their results: the message goes
            message = {**message, "content": blocks}
        if out and out[-1].get("role") == message.get("role"):
            # The rewrite removed what stood between them: one turn, as the API expects.
            out[-1] = {
                **out[-1],
                "content": [*_blocks(out[-1].get("content")), *_blocks(message.get("content"))],
            }
            continue
        out.append(message)
    return out


@final
class ToolRunner(Runner):
    """Runs the `tool_use` blocks of Messages API turns in a transaction.

    `tools` is the `tools=` list; `handle(messages, message)` returns the messages to send next
    (a new list; the one given is not changed). Not thread-safe: one runner serves one
    conversation (the transaction itself serializes concurrent calls).
    """

    @property
    def tools(self) -> list[Message]:
        """The `tools=` list to send with every request (a new deep copy each time), with
        `propose_plan` last when the runner was made with `plans=True`."""
        offered = tools(self._tx)  # each spec.parameters is a new copy
        if self._plan_spec is not None:
            offered.append(_entry(self._plan_spec))
        return offered

    def handle(self, messages: Iterable[object], message: object) -> list[Message]:
        """Run the message's tool calls; return the history with the message and the results.

        `message` is the SDK's `Message` (or its dict); if `messages` already ends with it, it
        is not appended twice. The results go in one user message, a `tool_result` for every
        `tool_use`, in order, even for calls that were not run. A message with no `tool_use`
        is appended and nothing runs.
        """
        history, assistant, calls = self._parse(messages, message)
        return self._finish(history, assistant, self._run_turn(calls))

    async def ahandle(self, messages: Iterable[object], message: object) -> list[Message]:
        """`handle` for async code: the tools run through `tx.acall_turn`."""
        history, assistant, calls = self._parse(messages, message)
        return self._finish(history, assistant, await self._arun_turn(calls))

    def _parse(
        self, messages: object, message: object
    ) -> tuple[list[Message], Message, list[ModelCall]]:
        if isinstance(messages, (str, bytes, Mapping)) or not hasattr(messages, "__iter__"):
            raise InvalidArgument(
                f"ToolRunner.handle: messages must be a list of messages, got {describe(messages)}"
            )
        history = [
            m if _plain(m) else _message(m, f"ToolRunner.handle: messages[{i}]")
            for i, m in enumerate(messages)
        ]
        assistant = _assistant(message)
        return history, assistant, _calls(assistant)

    def _finish(
        self, history: list[Message], assistant: Message, outcomes: Sequence[Outcome]
    ) -> list[Message]:
        last = history[-1] if history else None
        if not (
            _ids(assistant)
            and _ids(last) == _ids(assistant)
            and last
            and last.get("role") == "assistant"
        ):
            history.append(assistant)
        rewrite = self._rewrite(outcomes)
        if outcomes:
            history.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": o.call_id,
                            "content": dumps(with_note(o.payload, rewrite.notes.get(o.call_id))),
                            "is_error": o.is_error,
                        }
                        for o in outcomes
                    ],
                }
            )
        return _rewrite(history, rewrite)
