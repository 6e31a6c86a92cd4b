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

from .._approvals import request_of, requests_for, review_of
from .._errors import InvalidArgument
from .._transaction import plan_setting
from ..stores import decision_bell, keeps_conversations
from ._common import ModelCall, check_history, check_transaction, dumps, with_note
from ._conversation import OpenTurn, dump
from ._gate import _WAITING, gate_for
from ._runs import decision_waits
from .openai import ResponsesToolRunner

if TYPE_CHECKING:
    from collections.abc import Callable

    from agents.items import ModelResponse, TResponseInputItem
    from agents.run_config import CallModelData
    from agents.run_context import RunContextWrapper
    from agents.tool_context import ToolContext
    from agents.usage import Usage

    from .._approvals import ApprovalRequest, Review
    from .._json import JSONValue
    from .._tools import ToolSpec
    from .._transaction import Transaction
    from ._common import History, Rewrite
    from ._gate import Decided, TurnGate

__all__ = [
    "aapprove_decided",
    "approve_decided",
    "await_decisions",
    "function_tools",
    "hooks",
    "input_filter",
    "restore",
    "run_config",
    "wait",
    "waiting",
]


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
    found = plan_setting(tx)[0].get(name)
    guarded = found is not None and found.guarded
    # call id -> the run's usage, its model turn, the payload of a call already run: only the
    # same call of the same model turn of the same run collects it (a guardrail, a hook or a
    # cancellation may keep the SDK from invoking a call `needs_approval` ran).
    ran: dict[str, tuple[Usage, int, dict[str, JSONValue]]] = {}

    async def needs_approval(ctx: RunContextWrapper[Any], params: Any, call_id: str) -> bool:
        # The SDK asks before it runs a call of a guarded tool (one a person may have to
        # decide; asking for every tool would make the SDK interrupt on malformed arguments).
        # A later call of a turn whose call waits for a person waits with it (its step comes
        # after); else the call is sent now: if it waits, the SDK interrupts the run; if not,
        # it ran, and on_invoke_tool answers it with its payload.
        usage = ctx.usage
        turn = (id(usage), usage.requests)
        for stale in [k for k, (u, n, _) in ran.items() if u is not usage or n != usage.requests]:
            del ran[stale]  # parked in a turn that ended: never an answer for a later call
        if gate.waits_in(turn):
            gate.wait_with(call_id, turn, name, params)
            return True
        outcome = await gate.run(tx, turn, name, params, call_id=call_id, anchor=usage)
        result = outcome.result
        if result is not None and result.status in _WAITING:
            return True
        ran[call_id] = (usage, usage.requests, outcome.payload)
        return False

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> str:
        # A model turn is one model request: `usage.requests` counts them in this run, and the
        # usage object is the run's own (kept alive by the gate while its turn is the failed one).
        # A call of a guarded tool that `needs_approval` did not run is one the SDK approved
        # itself: an interruption `approve_decided` lets it send again (perhaps once more).
        usage = ctx.usage
        parked = ran.pop(ctx.tool_call_id, None)
        payload = None
        if parked is not None and parked[0] is usage and parked[1] == usage.requests:
            payload = parked[2]
        if payload is None:
            payload = await gate.call(
                tx,
                (id(usage), usage.requests),
                name,
                arguments,
                call_id=ctx.tool_call_id,
                anchor=usage,
                resend=guarded,
            )
        return dumps(payload)

    return agents.FunctionTool(
        name=spec.wire_name,
        description=spec.description,
        params_json_schema=parameters,
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=bool(is_strict if strict is None else strict),
        needs_approval=needs_approval if guarded else False,
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


# ---------------------------------------------------------------------- people and durability


def waiting(tx: Transaction) -> tuple[ApprovalRequest | Review, ...]:
    """The approval requests and reviews of `tx` no person has decided yet, oldest first.

    A run interrupted by a call of `function_tools(tx)` (`result.interruptions`) waits on
    these; once they are decided, `approve_decided` lets the SDK go on.
    """
    tx = check_transaction(tx, "waiting")
    return tuple(
        review_of(row) if row.kind == "review" else request_of(row)
        for row in requests_for(tx.store).of_scope(tx.id)
        if row.state == "pending" and row.kind in ("approval", "review")
    )


def wait(tx: Transaction, timeout: float | None = None) -> bool:
    """Block until nothing of `tx` waits for a person (decided in this process or another);
    False if `timeout` seconds passed first (None: no limit). Polls with `DECISION_POLL`."""
    bell = decision_bell(tx.store)
    for pause in decision_waits(lambda: waiting(tx), timeout, bell):
        if pause is None:
            return True
        bell.sleep(*pause)
    return False


async def await_decisions(tx: Transaction, timeout: float | None = None) -> bool:
    """`wait` for async code: sleeps on the event loop between polls."""
    bell = decision_bell(tx.store)
    for pause in decision_waits(lambda: waiting(tx), timeout, bell):
        if pause is None:
            return True
        await bell.asleep(*pause)
    return False


def approve_decided(tx: Transaction, state: agents.RunState[Any]) -> bool:
    """Let the SDK run the calls of `tx` its run stopped for, once people decided.

    agenttx decides, not the SDK. While a request of `tx` is undecided, nothing changes and
    False is returned. Else the interruptions of `state` (`result.to_state()`, or a
    `RunState.from_string` after a restart) that are calls of `function_tools(tx)` are taken
    in the model's order, until one is to be sent again:

    - a call a person decided is approved in the SDK: `Runner.run(agent, state, ...)` sends
      it again, it runs once with its approved (or the approver's edited) arguments, or is
      answered with the person's reason if rejected; the calls after it keep waiting, and
      the resumed run stops on them again (resume until `result.interruptions` is empty);
    - a call that waited with an earlier one of its turn, and that needs approval itself,
      gets its own request now (its step comes after the earlier call's, and its arguments
      may refer to that call's result): False is returned, `waiting(tx)` shows the request;
    - a call that ran already (the same saved state resumed twice: the request it stopped
      on, an approval or a review, was used by a live step of this call id and tool) is
      answered with its recorded result, and one whose turn failed before it as not run: the
      SDK gets the answer as the call's output (`state.reject(..., rejection_message=...)`),
      the call is never run twice. Two workers resuming the same state at once both get
      True; the call runs once, and the other worker's run gets its recorded result.

    Only the request asked for the call counts as its decision (the arguments it was asked
    with, or the call id it stopped on): a decided request of another call, or of a step a
    rewind undid, never does.

    No model turn is spent; True when the run may be resumed. Synchronous: call it while no
    run of `tx` runs, never from a tool of `tx` (`InvalidTransactionState`: the calls it
    decides cannot run inside the call that runs); from async code await `aapprove_decided`.
    """
    tx = check_transaction(tx, "approve_decided")
    if waiting(tx):
        return False
    gate = gate_for(tx, "approve_decided")
    calls = _interrupted(tx, state)
    for at, (item, name, call_id) in enumerate(calls):
        decided = gate.decide_waiting(tx, name, call_id, item.arguments or "{}")
        if decided.send:
            gate.sends_first(call_id, [(c, n, i.arguments) for i, n, c in calls[at + 1 :]])
        if not _apply(state, item, decided):
            return decided.send
    return True


async def aapprove_decided(tx: Transaction, state: agents.RunState[Any]) -> bool:
    """`approve_decided` for async code (a web handler on the loop that runs the agent): the
    transaction's turn is awaited, never blocking the event loop. `InvalidTransactionState`
    from a tool of `tx`, as for `approve_decided`."""
    tx = check_transaction(tx, "aapprove_decided")
    if waiting(tx):
        return False
    gate = gate_for(tx, "aapprove_decided")
    calls = _interrupted(tx, state)
    for at, (item, name, call_id) in enumerate(calls):
        decided = await gate.adecide_waiting(tx, name, call_id, item.arguments or "{}")
        if decided.send:
            gate.sends_first(call_id, [(c, n, i.arguments) for i, n, c in calls[at + 1 :]])
        if not _apply(state, item, decided):
            return decided.send
    return True


def _interrupted(tx: Transaction, state: agents.RunState[Any]) -> list[tuple[Any, str, str]]:
    """The interruptions of `state` that are calls of `tx`'s tools: (item, tool, call id)."""
    names = {spec.wire_name: spec.name for spec in tx.tool_specs}
    found: list[tuple[Any, str, str]] = []
    for item in state.get_interruptions():
        name = names.get(item.tool_name or "")
        call_id = item.call_id
        if name is not None and call_id is not None:
            found.append((item, name, call_id))
    return found


def _apply(state: agents.RunState[Any], item: Any, decided: Decided) -> bool:
    """Give the SDK `decided` for interruption `item`; False once the calls after it wait
    (it is sent again, or its request was just asked)."""
    if decided.payload is not None:
        state.reject(item, rejection_message=dumps(decided.payload))
        return True
    if decided.send:
        state.approve(item)
    return False


class _Keeper(agents.RunHooks[Any]):
    """Writes the conversation with the transaction when the model answers (see `hooks`)."""

    def __init__(self, tx: Transaction, history: History) -> None:
        self._tx = tx
        self._history = history
        self._input: list[Any] = []

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],  # noqa: ARG002  (the SDK's signature)
        agent: agents.Agent[Any],  # noqa: ARG002
        system_prompt: str | None,  # noqa: ARG002
        input_items: list[TResponseInputItem],
    ) -> None:
        self._input = list(input_items)

    async def on_llm_end(
        self,
        context: RunContextWrapper[Any],  # noqa: ARG002  (the SDK's signature)
        agent: agents.Agent[Any],  # noqa: ARG002
        response: ModelResponse,
    ) -> None:
        tx = self._tx
        store = tx.store
        if not keeps_conversations(store) or tx.status.terminal:
            return
        output = cast("list[Any]", response.to_input_items())
        calls = [
            ModelCall(call_id=str(i["call_id"]), name=str(i["name"]), arguments=i["arguments"])
            for i in output
            if isinstance(i, dict) and i.get("type") == "function_call"
        ]
        turn = OpenTurn(calls=tuple(calls), first_step=tx.next_step_id) if calls else None
        messages = [*self._input, *output]
        text = dump("openai.responses", self._history, messages, {}, turn)
        store.record_conversation(tx.id, text)


def hooks(tx: Transaction, *, history: History = "truncate") -> agents.RunHooks[Any]:
    """`RunHooks` that keep the conversation with `tx` on a durable store.

    Pass them to `Runner.run(..., hooks=hooks(tx))`. Each time the model answers, the model's
    input and its answer are written with the transaction (the SDK's own session is written
    only once a turn's tools finished, so a crash in the middle of a turn would lose it):
    after a crash, `restore(tx)` continues from there. On a store that keeps no
    conversations they do nothing. `InvalidArgument` for a non-transaction or another mode.
    """
    return _Keeper(check_transaction(tx, "hooks"), check_history(history))


def restore(tx: Transaction) -> ResponsesToolRunner:
    """The conversation `hooks(tx)` kept, as a runner that completes the interrupted turn.

    After a restart: `engine.recover("resume")`, then `runner = restore(engine.get(tx_id))`.
    The calls of the last model turn that ran are answered from the journal (never run
    again); `runner.waiting` shows a call that waits for a person (`runner.wait()`); then
    `items = runner.resume()` runs the rest and returns the input items with every result, to
    go on with `Runner.run(agent, items, run_config=run_config(tx), hooks=hooks(tx))`. Raises
    what `ResponsesToolRunner.restore` raises (a store that keeps no conversations, none
    stored, a transaction that ended).
    """
    return ResponsesToolRunner.restore(tx)
