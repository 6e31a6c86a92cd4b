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
    from pydantic_ai.exceptions import ApprovalRequired
    from pydantic_ai.messages import (
        ModelMessage,  # at run time: pydantic-ai reads the history processor's annotations
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset
    from pydantic_ai.toolsets.abstract import ToolsetTool
except ImportError as _exc:  # pragma: no cover - the extra is installed in CI
    raise ImportError(
        "agenttx.integrations.pydantic_ai needs pydantic-ai: pip install 'agenttx[pydantic-ai]'"
    ) from _exc

from .._approvals import requests_for
from .._errors import InvalidArgument
from ..stores import keeps_conversations
from ._common import ModelCall, check_history, check_transaction, with_note
from ._conversation import OpenTurn, dump
from ._gate import _WAITING, gate_for
from ._runs import Runner

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pydantic_ai import RunContext

    from .._tools import ToolSpec
    from .._transaction import Transaction
    from ._common import History, Outcome, Rewrite

__all__ = ["Toolset", "approve_decided", "history_processor", "restore"]

#: The key under which the arguments reach `call_tool` exactly as the model sent them.
_RAW: Final = "arguments"

#: The metadata keys of a deferred call: the request it waits on, or that it waits with an
#: earlier call of its turn (`approve_decided` hands them back with the approval).
_REQUEST: Final = "agenttx_request"
_WITH: Final = "agenttx"


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
        self._kept: object = None  # the model turn whose conversation was kept last
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
        turn = (ctx.run_id, ctx.run_step)
        if turn != self._kept:
            self._kept = turn
            _keep(self._tx, ctx.messages)
        tool_name = name if spec is None else spec.name
        approved, call_id = ctx.tool_call_approved, ctx.tool_call_id
        if not approved and self._gate.waits_in(turn):
            # a later call of a turn whose call waits for a person waits with it
            if call_id is not None:
                self._gate.wait_with(call_id, turn, tool_name, arguments)
            raise ApprovalRequired(metadata={_WITH: "waits with an earlier call"})
        if approved:  # a deferred call sent again: what it waited on, as `approve_decided` kept it
            metadata = ctx.tool_call_metadata
            kept = isinstance(metadata, dict) and (_REQUEST in metadata or _WITH in metadata)
            if kept and call_id is not None:
                request = metadata.get(_REQUEST)
                asked = request if isinstance(request, str) else None
                self._gate.stopped(call_id, tool_name, arguments, asked)
        outcome = await self._gate.run(
            self._tx,
            turn,
            tool_name,
            arguments,
            call_id=call_id,
            resend=approved,
        )
        result = outcome.result
        if result is not None and result.status in _WAITING:
            request = result.approval or result.review
            raise ApprovalRequired(metadata={_REQUEST: None if request is None else request.id})
        return outcome.payload


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


# ---------------------------------------------------------------------- people and durability


def approve_decided(tx: Transaction, requests: DeferredToolRequests) -> DeferredToolResults | None:
    """The `deferred_tool_results` that let pydantic-ai run the calls of `tx` it deferred, once
    people decided; None while a request of `tx` is undecided (`openai_agents.waiting`-like:
    `Transaction.pending_approvals`, or `agenttx approve`/`reject` from anywhere).

    agenttx decides, not pydantic-ai: every deferred call of a tool of `tx` is approved in
    pydantic-ai, so `agent.run(message_history=..., deferred_tool_results=...)` sends it again:
    an approved call runs once with its approved (or the approver's edited) arguments, a
    rejected one is answered with the person's reason, and the calls deferred with it run
    after it. No model turn is spent. A deferred call of any other tool (pydantic-ai's own
    `requires_approval`) is left out: agenttx has no person's decision on it, so the caller adds
    its own to the results.

    Each approval carries what its call waited on (`metadata`), so the toolset knows the call
    is sent again as that stop: the same history and results resumed twice (a double click,
    two workers, at once or one after the other) run it once, the second getting its recorded
    result; a call of a later model turn that reuses the id gets its own request. The request
    itself is looked up in the store by the call id it was asked for, never taken from the
    metadata (which a caller may have built or kept for another call).
    """
    tx = check_transaction(tx, "approve_decided")
    if any(r.state == "pending" for r in _rows(tx)):
        return None
    ours = {name for spec in tx.tool_specs for name in (spec.name, spec.wire_name)}
    calls = [c.tool_call_id for c in requests.approvals if c.tool_name in ours]
    kept = requests.metadata
    return DeferredToolResults(
        approvals=dict.fromkeys(calls, True),
        metadata={i: dict(kept[i]) for i in calls if isinstance(kept.get(i), dict)},
    )


def _rows(tx: Transaction) -> list[Any]:
    return [
        row for row in requests_for(tx.store).of_scope(tx.id) if row.kind in ("approval", "review")
    ]


def _keep(tx: Transaction, messages: list[ModelMessage]) -> None:
    """Write the conversation with `tx` when a model turn's first call arrives (a durable store
    only): the history, and as the open turn the calls of the last response with no result
    yet. `restore(tx)` reads it back after a crash."""
    store = tx.store
    if not keeps_conversations(store) or tx.status.terminal or not messages:
        return
    last = next((m for m in reversed(messages) if isinstance(m, ModelResponse)), None)
    if last is None:
        return
    answered = {
        part.tool_call_id
        for m in messages
        if isinstance(m, ModelRequest)
        for part in m.parts
        if isinstance(part, ToolReturnPart)
    }
    calls = tuple(
        ModelCall(call_id=part.tool_call_id, name=part.tool_name, arguments=part.args)
        for part in last.tool_calls
        if part.tool_call_id not in answered
    )
    turn = OpenTurn(calls=calls, first_step=tx.next_step_id) if calls else None
    history = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    store.record_conversation(tx.id, dump("pydantic_ai", "keep", history, {}, turn))


class Restored(Runner):
    """The conversation `Toolset` kept for a transaction, as a runner (see `restore`)."""

    _kind = "pydantic_ai"

    def message_history(self) -> list[ModelMessage]:
        """The message history to go on with (`agent.run(message_history=...)`)."""
        return ModelMessagesTypeAdapter.validate_python(self._messages)

    def _complete(self, history: list[dict[str, Any]], outcomes: Sequence[Outcome]) -> list[Any]:
        messages = ModelMessagesTypeAdapter.validate_python(history)
        names = {
            part.tool_call_id: part.tool_name
            for m in messages
            if isinstance(m, ModelResponse)
            for part in m.tool_calls
        }
        parts = [
            ToolReturnPart(
                tool_name=names.get(o.call_id, ""), content=o.payload, tool_call_id=o.call_id
            )
            for o in outcomes
        ]
        messages.append(ModelRequest(parts=parts))
        return list(ModelMessagesTypeAdapter.dump_python(messages, mode="json"))


def restore(tx: Transaction) -> Restored:
    """The conversation of `tx` as the toolset kept it, after a restart.

    `engine.recover("resume")`, then `runner = restore(engine.get(tx_id))`: the calls of the
    last model turn that ran are answered from the journal (never run again), `runner.waiting`
    shows a call waiting for a person; `runner.resume()` runs the rest, and
    `agent.run(message_history=runner.message_history())` goes on with every result. Raises what
    `_runs.Runner.restore` raises (no conversation kept, a store that keeps none, an ended
    transaction).
    """
    return Restored.restore(tx)
