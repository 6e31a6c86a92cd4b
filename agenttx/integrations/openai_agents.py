"""agenttx tools for the OpenAI Agents SDK (`pip install 'agenttx[openai-agents]'`).

    from agents import Agent, Runner
    from agenttx.integrations import openai_agents as atx_agents

    tx = agenttx.Transaction(tools=[lookup_customer, charge, refund, ...])
    agent = Agent(name="shop", instructions=agenttx.prompt(tx),
                  tools=atx_agents.function_tools(tx))
    result = await Runner.run(agent, "Order 2 of SKU-1", run_config=atx_agents.run_config(tx))
    tx.commit()

`function_tools(tx)` gives one `agents.FunctionTool` per agenttx tool: its name is the tool's
wire name, its parameters the tool's JSON Schema, and each call runs as the next step of `tx`
(through `tx.acall`, with the model's call id), one at a time in the model's order. Once a
call of a model turn fails, the later calls of that turn are not run (the turn barrier). The
model gets `StepResult.for_model()` as JSON text. `input_filter(tx)` rewrites the model input
after a rewind (drops or voids the calls it undid); `run_config(tx)` is a `RunConfig` with
that filter and the settings this module relies on. See docs/integrations.md.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

try:
    import agents
    from agents.exceptions import UserError
    from agents.run_config import ModelInputData, ToolExecutionConfig
    from agents.strict_schema import ensure_strict_json_schema
except ImportError as _exc:  # pragma: no cover - the extra is installed in CI
    raise ImportError(
        "agenttx.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'agenttx[openai-agents]'"
    ) from _exc

from .._errors import InvalidArgument
from ._common import check_history, dumps, with_note
from ._gate import gate_for

if TYPE_CHECKING:
    from collections.abc import Callable

    from agents.items import TResponseInputItem
    from agents.run_config import CallModelData
    from agents.tool_context import ToolContext

    from .._tools import ToolSpec
    from .._transaction import Transaction
    from ._common import History, Rewrite
    from ._gate import TurnGate

__all__ = ["function_tools", "input_filter", "run_config"]


def function_tools(tx: Transaction, *, strict: bool | None = None) -> list[agents.FunctionTool]:
    """One `agents.FunctionTool` per tool of `tx`, in registration order.

    Each tool's `name` is the agenttx wire name, `description` and `params_json_schema` come
    from its spec. `strict=None` sends a strict schema exactly when the spec already is one
    (every property required, no open object), so strict mode never changes what a tool
    accepts; `strict=True` raises `InvalidArgument` naming a tool whose schema is not strict
    as it is; `strict=False` never sends strict schemas. A call runs as the next step of
    `tx` with the model's call id; its result is `json.dumps(result.for_model())`. Raises
    `InvalidArgument` when `tx` is not a `Transaction`.
    """
    gate = gate_for(tx, "function_tools")
    if strict not in (None, True, False):
        raise InvalidArgument(f"strict must be None, True or False, got {strict!r}")
    return [_function_tool(tx, gate, spec, strict) for spec in tx.tool_specs]


def input_filter(
    tx: Transaction, *, history: History = "truncate"
) -> Callable[[CallModelData[Any]], ModelInputData]:
    """A `RunConfig(call_model_input_filter=...)` that rewrites the calls a rewind voided.

    As docs/integrations.md#history-after-a-rewind says: `history="truncate"` drops each
    voided call (`function_call`) and its `function_call_output` from the model input and adds
    a `note` to the payload of the call whose failure caused the rewind; `"void"` keeps the
    call and replaces its output with the voided payload; `"keep"` leaves the input as it is
    (the failure's payload lists the voided steps). Every other item passes through unchanged.
    Raises `InvalidArgument` for another mode or when `tx` is not a `Transaction`.
    """
    gate = gate_for(tx, "input_filter")
    mode = check_history(history)

    def call_model_input_filter(data: CallModelData[Any]) -> ModelInputData:
        rewrite = gate.rewrite(mode)
        if rewrite.empty:
            return data.model_data
        items = _rewrite(data.model_data.input, rewrite)
        return ModelInputData(input=items, instructions=data.model_data.instructions)

    return call_model_input_filter


def run_config(
    tx: Transaction, *, history: History = "truncate", **options: Any
) -> agents.RunConfig:
    """A `RunConfig` for running an agent whose tools are `function_tools(tx)`.

    It sets `call_model_input_filter=input_filter(tx, history=history)`,
    `tool_not_found_behavior="return_error_to_model"` (a call to an unknown tool gets an error
    result, not an exception) and `tool_execution=ToolExecutionConfig(
    max_function_tool_concurrency=1)` (a turn's calls start one at a time, in the model's
    order, whatever hooks or guardrails await). `options` are the other `RunConfig` fields;
    passing one of these three raises `InvalidArgument` (compose `input_filter` yourself).
    """
    taken = {"call_model_input_filter", "tool_not_found_behavior", "tool_execution"} & set(options)
    if taken:
        raise InvalidArgument(
            f"run_config sets {', '.join(sorted(taken))} itself; build the RunConfig yourself "
            "with input_filter(tx) to choose your own"
        )
    return agents.RunConfig(
        call_model_input_filter=input_filter(tx, history=history),
        tool_not_found_behavior="return_error_to_model",
        tool_execution=ToolExecutionConfig(max_function_tool_concurrency=1),
        **options,
    )


def _function_tool(
    tx: Transaction, gate: TurnGate, spec: ToolSpec, strict: bool | None
) -> agents.FunctionTool:
    parameters = spec.parameters  # a copy of its own (each access is one): the SDK may change it
    is_strict = _is_strict(spec)
    if strict and not is_strict:
        raise InvalidArgument(
            f"tool `{spec.name}`: its parameters schema is not strict as it is (strict mode "
            "needs every property required and no open object); pass strict=None or False"
        )
    name = spec.name

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> str:
        # A model turn is one model request: `usage.requests` counts them in this run, and the
        # usage object is the run's own (kept alive by the gate while its turn is the failed one).
        usage = ctx.usage
        payload = await gate.call(
            tx,
            (id(usage), usage.requests),
            name,
            arguments,
            call_id=ctx.tool_call_id,
            anchor=usage,
        )
        return dumps(payload)

    return agents.FunctionTool(
        name=spec.wire_name,
        description=spec.description,
        params_json_schema=parameters,
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=bool(is_strict if strict is None else strict),
    )


def _is_strict(spec: ToolSpec) -> bool:
    """True when the SDK's strict conversion leaves the spec's schema as it is (it is strict)."""
    try:  # the conversion changes the copy it is given: each `spec.parameters` is a new one
        return ensure_strict_json_schema(spec.parameters) == spec.parameters
    except (UserError, TypeError, ValueError):
        return False


def _rewrite(items: list[TResponseInputItem], rewrite: Rewrite) -> list[TResponseInputItem]:
    """The model input with `rewrite` applied to its function calls and their outputs."""
    rewritten: list[TResponseInputItem] = []
    for item in items:
        call_id = item.get("call_id") if isinstance(item, dict) else None
        if not isinstance(call_id, str):
            rewritten.append(item)
        elif call_id in rewrite.drop:
            continue
        elif item.get("type") != "function_call_output":
            rewritten.append(item)
        elif call_id in rewrite.replace:
            output = dumps(rewrite.replace[call_id])
            rewritten.append(cast("TResponseInputItem", {**item, "output": output}))
        elif call_id in rewrite.notes:
            rewritten.append(_noted(item, rewrite.notes[call_id]))
        else:
            rewritten.append(item)
    return rewritten


def _noted(item: Any, note: str) -> Any:
    """A `function_call_output` whose JSON payload gets `note` (left as it is if not JSON)."""
    try:
        payload = json.loads(item["output"])
    except (TypeError, ValueError):
        return item
    if not isinstance(payload, dict) or "note" in payload:
        return item
    return {**item, "output": dumps(with_note(payload, note))}
