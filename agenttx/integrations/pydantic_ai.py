"""agenttx tools for pydantic-ai (`pip install 'agenttx[pydantic-ai]'`).

    from pydantic_ai import Agent
    from pydantic_ai.capabilities import ProcessHistory
    from agenttx.integrations import pydantic_ai as atx_pai

    tx = agenttx.Transaction(tools=[lookup_customer, charge, refund, ...])
    agent = Agent("openai:gpt-5", instructions=agenttx.prompt(tx),
                  toolsets=[atx_pai.Toolset(tx)],
                  capabilities=[ProcessHistory(atx_pai.history_processor(tx))])
    result = await agent.run("Order 2 of SKU-1")
    tx.commit()

`Toolset(tx)` is a pydantic-ai toolset holding the transaction's tools: each tool definition
carries the tool's wire name and JSON Schema, and each call runs as the next step of `tx`
(through `tx.acall`, with the model's call id), one at a time in the model's order (every tool
is `sequential`). Once a call of a model turn fails, the later calls of that turn are not run
(the turn barrier). The model gets `StepResult.for_model()` as the tool's return value.
`history_processor(tx)` rewrites the message history after a rewind (drops or voids the calls
it undid). See docs/integrations.md.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Final, final

try:
    from pydantic_ai.messages import (
        ModelMessage,  # at run time: pydantic-ai reads the history processor's annotations
        ModelRequest,
        ModelResponse,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset
    from pydantic_ai.toolsets.abstract import ToolsetTool
except ImportError as _exc:  # pragma: no cover - the extra is installed in CI
    raise ImportError(
        "agenttx.integrations.pydantic_ai needs pydantic-ai: pip install 'agenttx[pydantic-ai]'"
    ) from _exc

from .._errors import InvalidArgument
from ._common import check_history, with_note
from ._gate import gate_for

if TYPE_CHECKING:
    from collections.abc import Callable

    from pydantic_ai import RunContext

    from .._tools import ToolSpec
    from .._transaction import Transaction
    from ._common import History, Rewrite

__all__ = ["Toolset", "history_processor"]

#: The key under which the arguments reach `call_tool` exactly as the model sent them.
_RAW: Final = "arguments"


@final
class _PassThrough:
    """An arguments "validator" that keeps the model's arguments as they came.

    agenttx validates the arguments itself, as part of the step: a malformed JSON text or a
    schema violation is then a failed step with a hint (the step is sent again), and the
    model gets it as the tool's result, never as pydantic-ai's retry error.
    """

    def validate_json(self, input: str | bytes | bytearray, **_: Any) -> dict[str, Any]:  # noqa: A002
        text = input if isinstance(input, str) else bytes(input).decode("utf-8", "replace")
        return {_RAW: text}

    def validate_python(self, input: Any, **_: Any) -> dict[str, Any]:  # noqa: A002
        return {_RAW: input}


@final
class Toolset(AbstractToolset[Any]):
    """The tools of an agenttx transaction, as a pydantic-ai toolset.

    `get_tools` lists one tool per agenttx tool, in registration order: its name is the wire
    name, its `parameters_json_schema` the tool's JSON Schema, `sequential=True` (so a turn's
    calls run one at a time, in the model's order) and `strict` as given (`None` lets the
    model class decide, as pydantic-ai does). `call_tool` runs the call as the next step of
    the transaction with the model's call id and returns `result.for_model()`; a later call
    of a turn in which a call failed returns a not-run payload. Raises `InvalidArgument` when
    `tx` is not a `Transaction`.
    """

    def __init__(
        self,
        tx: Transaction,
        *,
        id: str | None = "agenttx",  # noqa: A002  (pydantic-ai's name for it)
        strict: bool | None = None,
    ) -> None:
        self._gate = gate_for(tx, "Toolset")
        self._tx = tx
        if strict not in (None, True, False):
            raise InvalidArgument(f"strict must be None, True or False, got {strict!r}")
        self._id = id
        self._validator = _PassThrough()
        specs = tx.tool_specs
        self._specs: dict[str, ToolSpec] = {spec.wire_name: spec for spec in specs}
        self._definitions = [
            ToolDefinition(
                name=spec.wire_name,
                description=spec.description,
                parameters_json_schema=spec.parameters,  # a copy of its own
                strict=strict,
                sequential=True,
            )
            for spec in specs
        ]

    @property
    def id(self) -> str | None:
        """The toolset's id among an agent's toolsets (default `"agenttx"`)."""
        return self._id

    @property
    def tool_definitions(self) -> list[ToolDefinition]:
        """The tool definitions the model is offered, in registration order."""
        return list(self._definitions)

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:  # noqa: ARG002
        """One `ToolsetTool` per agenttx tool, keyed by wire name."""
        return {
            definition.name: ToolsetTool(
                toolset=self,
                tool_def=definition,
                max_retries=0,  # a mistake is a failed step that says what to fix, not a retry
                args_validator=self._validator,
            )
            for definition in self._definitions
        }

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[Any],
        tool: ToolsetTool[Any],  # noqa: ARG002  (the toolset knows its tools)
    ) -> Any:
        """Run the call as the next step of the transaction; the model gets the payload."""
        spec = self._specs.get(name)
        arguments = tool_args.get(_RAW, tool_args) if isinstance(tool_args, dict) else tool_args
        return await self._gate.call(
            self._tx,
            (ctx.run_id, ctx.run_step),
            name if spec is None else spec.name,
            arguments,
            call_id=ctx.tool_call_id,
        )


def history_processor(
    tx: Transaction, *, history: History = "truncate"
) -> Callable[[list[ModelMessage]], list[ModelMessage]]:
    """A history processor (`capabilities=[ProcessHistory(...)]`) for the rewinds of `tx`.

    As docs/integrations.md#history-after-a-rewind says: `history="truncate"` drops each
    voided call (`ToolCallPart`) and its `ToolReturnPart`, and a message left with no part,
    and adds a `note` to the payload of the call whose failure caused the rewind; `"void"`
    keeps the call and replaces its return's content with the voided payload; `"keep"` leaves
    the history as it is (the failure's payload lists the voided steps). Raises
    `InvalidArgument` for another mode or when `tx` is not a `Transaction`.
    """
    gate = gate_for(tx, "history_processor")
    mode = check_history(history)

    def process(messages: list[ModelMessage]) -> list[ModelMessage]:
        rewrite = gate.rewrite(mode)
        if rewrite.empty:
            return messages
        return _rewrite(messages, rewrite)

    return process


def _rewrite(messages: list[ModelMessage], rewrite: Rewrite) -> list[ModelMessage]:
    rewritten: list[ModelMessage] = []
    for message in messages:
        parts: list[Any] = []
        changed = False
        for part in message.parts:
            new = _rewrite_part(part, rewrite)
            changed = changed or new is not part
            if new is not None:
                parts.append(new)
        if not changed:
            rewritten.append(message)
        elif not parts:
            continue  # a message left with no part goes too
        elif isinstance(message, ModelRequest):  # noqa: SIM114  (each branch narrows the type)
            rewritten.append(dataclasses.replace(message, parts=parts))
        elif isinstance(message, ModelResponse):
            rewritten.append(dataclasses.replace(message, parts=parts))
    return rewritten


def _rewrite_part(part: object, rewrite: Rewrite) -> object:
    """The part with `rewrite` applied: itself, a replacement, or None to drop it."""
    if not isinstance(part, (ToolCallPart, ToolReturnPart)):
        return part
    call_id = part.tool_call_id
    if call_id in rewrite.drop:
        return None
    if not isinstance(part, ToolReturnPart):
        return part
    if call_id in rewrite.replace:
        return dataclasses.replace(part, content=rewrite.replace[call_id])
    note = rewrite.notes.get(call_id)
    content = part.content
    if note is not None and isinstance(content, dict) and "note" not in content:
        return dataclasses.replace(part, content=with_note(content, note))
    return part
