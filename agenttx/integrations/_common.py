"""What every provider integration shares: specs, running a model turn, and the history rewrite.

Provider-neutral: no SDK is imported here. A provider module parses its own message shapes into
`ModelCall`s, hands them to `run_turn` (or `arun_turn`), sends each `Outcome.payload` back as
the call's tool result, and applies the `Rewrite` that `rewrite_for` computes from the turn to
its own message list.

Contracts:

- `resolve_specs` accepts a `Transaction`, an `Engine`, one tool, or what `Transaction(tools=...)`
  accepts (an iterable of tools, compensations and plain functions, or a mapping). Anything else,
  an SDK object included, raises `InvalidArgument` naming it; compensations are not offered to
  the model.
- `run_turn` never raises for what the model sent: an unknown tool, malformed or oversized
  arguments, a duplicate call id, or a call after the transaction ended each become an
  `Outcome` whose payload says what happened and what to send next. One outcome per call, in
  order, with the call's own id (never renumbered). Developer misuse (a `Transaction` that is
  not one) still raises.
- `rewrite_for` reads `voided_call_ids` from the turn's results: with `"truncate"` the voided
  calls and their results are dropped and the failing call's result gets a `note`; with
  `"void"` their results are replaced by `voided_payload`; with `"keep"` nothing changes.
- With `plans=True` a runner offers `propose_plan` and answers its calls (`_runs`,
  `_plan_calls`; docs/plans.md#plans-a-model-proposes) through `proposal_of`, `plan_not_run`
  and `plan_answer`: a plan with problems is refused with every problem, nothing run and no
  step used; a valid one runs as a plan run of its own, with the transaction's tools, store
  and dispatcher, after the turn's other calls succeeded.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, final

import attrs

from .._engine import Engine
from .._errors import InvalidArgument, InvalidTransactionState, PlanValidationError
from .._limits import MAX_CALLS_PER_TURN, MAX_PAYLOAD_BYTES, over_limit
from .._plans import PLAN_TOOL, NodeState, Plan
from .._results import StepStatus
from .._tools import MAX_TOOL_NAME, Compensation, Tool, ToolRegistry
from .._transaction import Transaction, plan_setting

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._json import JSONValue
    from .._plans import PlanResult
    from .._results import StepResult
    from .._tools import ToolLike, ToolsArgument, ToolSpec

__all__ = [
    "HISTORIES",
    "History",
    "ModelCall",
    "Outcome",
    "Payload",
    "Rewrite",
    "ToolsOrTx",
    "arun_turn",
    "check_history",
    "check_transaction",
    "describe",
    "dumps",
    "plan_answer",
    "plan_not_run",
    "plan_options",
    "proposal_of",
    "resolve_specs",
    "rewrite_for",
    "run_turn",
    "specs_json",
    "voided_payload",
    "with_note",
]

#: How a runner rewrites the history after a rewind (docs/integrations.md#history-after-a-rewind).
History: TypeAlias = Literal["truncate", "void", "keep"]
HISTORIES: Final = ("truncate", "void", "keep")

#: The longest call id a step records (`execute_step(..., call_id=...)` refuses a longer one).
MAX_CALL_ID: Final = 256

Payload: TypeAlias = "dict[str, JSONValue]"

#: What `tools()` takes: a transaction, an engine, one tool, or what `Transaction(tools=...)`
#: accepts (`ToolsArgument`: items typed `object`, for an unannotated mixed list; checked at run
#: time, `InvalidArgument` naming a bad item).
ToolsOrTx: TypeAlias = "Transaction | Engine | ToolLike | ToolsArgument"


def describe(value: object) -> str:
    """A short name for `value` in an error message: its type's qualified name, and a repr."""
    kind = type(value)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{name} {text}"


def dumps(payload: JSONValue) -> str:
    """A tool result's text: the payload as JSON, keys in the payload's (documented) order."""
    return json.dumps(payload, ensure_ascii=False)


def check_history(history: object) -> History:
    """`history` if it is one of HISTORIES, else `InvalidArgument`."""
    if history == "truncate" or history == "void" or history == "keep":  # noqa: PLR1714
        return history
    raise InvalidArgument(f"history must be one of 'truncate', 'void', 'keep'; got {history!r}")


def check_transaction(tx: object, where: str) -> Transaction:
    """`tx` if it is a `Transaction`, else `InvalidArgument` naming what it is."""
    if not isinstance(tx, Transaction):
        raise InvalidArgument(
            f"{where} needs an agenttx.Transaction (from Transaction(...) or engine.begin()), "
            f"got {describe(tx)}"
        )
    return tx


# ---------------------------------------------------------------------- specs


def resolve_specs(tools_or_tx: object, where: str) -> tuple[ToolSpec, ...]:
    """The specs of the tools a model may call, in registration order.

    Raises `InvalidArgument` for anything that is not a transaction, an engine, a tool or a
    collection of tools, naming the offending item (with its position in a list).
    """
    if isinstance(tools_or_tx, (Transaction, Engine)):
        return tools_or_tx.tool_specs
    if isinstance(tools_or_tx, Tool):
        return (tools_or_tx.spec,)
    if isinstance(tools_or_tx, ToolRegistry):
        return tools_or_tx.specs()
    if isinstance(tools_or_tx, Mapping):
        for key, item in tools_or_tx.items():
            _check_item(item, where, f"tools[{key!r}]")
        return ToolRegistry(tools_or_tx).specs()
    if isinstance(tools_or_tx, (str, bytes)) or not isinstance(tools_or_tx, Iterable):
        raise InvalidArgument(
            f"{where} takes a Transaction, an Engine or a list of agenttx tools, "
            f"got {describe(tools_or_tx)}"
        )
    items = list(tools_or_tx)
    for index, item in enumerate(items):
        _check_item(item, where, f"item {index} of the tools list")
    return ToolRegistry(items).specs()


def _check_item(item: object, where: str, position: str) -> None:
    # A plain function is registered as a tool, as Transaction(tools=...) does.
    if isinstance(item, (Tool, Compensation, functools.partial)) or inspect.isroutine(item):
        return
    raise InvalidArgument(
        f"{where}: {position} is {describe(item)}, not an agenttx tool; "
        "decorate the function with @agenttx.tool, or pass the transaction"
    )


# ---------------------------------------------------------------------- a model turn


@final
@attrs.frozen(kw_only=True)
class ModelCall:
    """One tool call as the model sent it: its provider call id, tool name and arguments.

    `arguments` is JSON text (OpenAI) or a decoded value (Anthropic's `input`), unchecked.
    """

    call_id: str
    name: object
    arguments: object


@final
@attrs.frozen(kw_only=True)
class Outcome:
    """What became of one `ModelCall`: the payload to send back, and whether it is an error.

    `result` is the step's `StepResult` when the call reached the transaction (a `NOT_RUN`
    result included); None when the integration answered it itself (the transaction had
    ended, or the call could not be sent at all).
    """

    call_id: str
    payload: Payload
    is_error: bool
    result: StepResult | None = None


def _arguments_text(arguments: object) -> str | None:
    """The call's arguments as JSON text for the transaction to parse; None if unencodable."""
    if isinstance(arguments, str):
        return arguments
    try:
        return json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except RecursionError:
        # Nested past the interpreter's recursion limit, so far past `MAX_NESTING_DEPTH`: the
        # transaction refuses the text as it refuses such JSON text from any model (a failed
        # step whose error says why), so this call is answered as the same call in JSON is.
        return _deep_text(arguments)
    except (TypeError, ValueError):
        return None


def _deep_text(value: object) -> str | None:
    """`json.dumps(value)` without recursion (None if not JSON), cut once over the size limit."""
    parts: list[str] = []
    size = 0
    todo: list[tuple[str, object]] = [("value", value)]
    while todo:
        kind, item = todo.pop()
        if kind == "text":
            parts.append(str(item))
        elif isinstance(item, Mapping):
            if not all(isinstance(key, str) for key in item):
                return None
            entries = [(json.dumps(key, ensure_ascii=False), v) for key, v in item.items()]
            todo.append(("text", "}"))
            for index, (key, v) in reversed(list(enumerate(entries))):
                todo.extend((("value", v), ("text", ("," if index else "") + key + ":")))
            parts.append("{")
        elif isinstance(item, (list, tuple)):
            todo.append(("text", "]"))
            for index, v in reversed(list(enumerate(item))):
                todo.extend((("value", v), ("text", "," if index else "")))
            parts.append("[")
        else:
            try:
                parts.append(json.dumps(item, ensure_ascii=False, allow_nan=False))
            except (TypeError, ValueError):
                return None
        size += len(parts[-1])
        if size > MAX_PAYLOAD_BYTES:  # too big to send anyway: the size check refuses it
            break
    return "".join(parts)


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _screen(call: ModelCall) -> tuple[str, str] | str:
    """`(name, arguments_text)` to send, or why the call cannot be sent as a step at all."""
    name = call.name
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_TOOL_NAME:
        shown = name[:40] + "..." if isinstance(name, str) and len(name) > 40 else name
        return f"unknown tool {shown!r}: a tool name is 1-{MAX_TOOL_NAME} characters"
    if not 1 <= len(call.call_id) <= MAX_CALL_ID or not _is_unicode(call.call_id):
        return f"the call id of {name} is not 1-{MAX_CALL_ID} characters of valid text"
    text = _arguments_text(call.arguments)
    if text is None:
        return f"the arguments of {name} are not JSON"
    if over_limit(text):
        return f"the arguments of {name} exceed {MAX_PAYLOAD_BYTES} bytes"
    return name, text


def _refused(call: ModelCall, step: int, error: str) -> Outcome:
    payload: Payload = {
        "ok": False,
        "step": step,
        "error": f"Hint: Step {step} was refused: {error}.",
        "next_step": step,
        "instruction": f"Fix the call and send step {step} again.",
    }
    return Outcome(call_id=call.call_id, payload=payload, is_error=True)


def _not_run(call: ModelCall, first: int, step: int, *, refused: bool = False) -> Outcome:
    """A call after the step `first` that failed (or was refused), as `call_turn` answers it."""
    what = "was refused" if refused else "failed"
    payload: Payload = {
        "ok": False,
        "step": None,  # never sent: it claims no step (as a NOT_RUN result's for_model())
        "error": (
            f"Hint: Not run: step {first} {what} first; send this call again, as step {step} or "
            "later, if it is still needed."
        ),
        "next_step": step,
        "instruction": (
            "This call was not run because an earlier call of the turn failed: "
            f"send it again as step {step} or later, if it is still needed."
        ),
    }
    return Outcome(call_id=call.call_id, payload=payload, is_error=True)


def _ended(call: ModelCall, tx: Transaction) -> Outcome:
    status = tx.status.value.lower().replace("_", " ")
    payload: Payload = {
        "ok": False,
        "step": None,
        "error": (
            f"Hint: Not run: the transaction has ended ({status}); no more tool calls run in it."
        ),
        "next_step": 0,
        "instruction": "Send no more steps: the transaction has ended.",
    }
    return Outcome(call_id=call.call_id, payload=payload, is_error=True)


def _from_result(call: ModelCall, result: StepResult) -> Outcome:
    return Outcome(
        call_id=call.call_id, payload=result.for_model(), is_error=not result.ok, result=result
    )


def _plan(calls: Sequence[ModelCall]) -> tuple[list[tuple[str, str, str]], str]:
    """The leading calls that can be sent as steps, and why the next one cannot ("" if none)."""
    if len(calls) > MAX_CALLS_PER_TURN:  # `call_turn` would refuse the turn: none is sent
        return [], (
            f"the turn has {len(calls)} tool calls, more than the {MAX_CALLS_PER_TURN} one turn "
            f"may hold; send at most {MAX_CALLS_PER_TURN} per turn"
        )
    sendable: list[tuple[str, str, str]] = []
    for call in calls:
        screened = _screen(call)
        if isinstance(screened, str):
            return sendable, screened
        sendable.append((*screened, call.call_id))
    return sendable, ""


def _finish(
    tx: Transaction,
    calls: Sequence[ModelCall],
    results: Sequence[StepResult],
    refusal: str,
) -> tuple[Outcome, ...]:
    outcomes = [_from_result(call, result) for call, result in zip(calls, results, strict=False)]
    rest = calls[len(outcomes) :]
    if not rest:
        return tuple(outcomes)
    if tx.status.terminal:
        return (*outcomes, *(_ended(call, tx) for call in rest))
    step = tx.next_step_id
    failed = next((r for r in results if r.status is not StepStatus.SUCCESS), None)
    if failed is not None:  # the turn stopped before the refused call: it was not run either
        return (*outcomes, *(_not_run(call, failed.step_id, step) for call in rest))
    first = _refused(rest[0], step, refusal)
    return (*outcomes, first, *(_not_run(c, step, step, refused=True) for c in rest[1:]))


def run_turn(tx: Transaction, calls: Sequence[ModelCall]) -> tuple[Outcome, ...]:
    """Run one model turn through `tx.call_turn`: one `Outcome` per call, in order.

    Calls run in order and stop at the first failed step (the rest are not run, as
    `call_turn` does). A call that cannot be sent at all (a tool name over the length limit,
    arguments over the size limit or not JSON) is refused as that step, with nothing run after
    it. A turn of more than `MAX_CALLS_PER_TURN` calls runs none: its first call is refused (the
    refusal names the limit and the count) and the rest are not run. If the transaction has
    ended, or ends while the turn runs, the calls not run say so.
    """
    if not calls:
        return ()
    if tx.status.terminal:
        return tuple(_ended(call, tx) for call in calls)
    sendable, refusal = _plan(calls)
    results: tuple[StepResult, ...] = ()
    if sendable:
        try:
            results = tx.call_turn(sendable)
        except InvalidTransactionState:  # it ended meanwhile (another thread, a reaper)
            return tuple(_ended(call, tx) for call in calls)
    return _finish(tx, calls, results, refusal)


async def arun_turn(tx: Transaction, calls: Sequence[ModelCall]) -> tuple[Outcome, ...]:
    """`run_turn` for async code: the turn runs through `tx.acall_turn`."""
    if not calls:
        return ()
    if tx.status.terminal:
        return tuple(_ended(call, tx) for call in calls)
    sendable, refusal = _plan(calls)
    results: tuple[StepResult, ...] = ()
    if sendable:
        try:
            results = await tx.acall_turn(sendable)
        except InvalidTransactionState:
            return tuple(_ended(call, tx) for call in calls)
    return _finish(tx, calls, results, refusal)


# ---------------------------------------------------------------------- plans a model proposes


def plan_options(tx: Transaction) -> dict[str, Any]:
    registry, store, dispatcher = plan_setting(tx)
    return {"tools": registry, "initial": {}, "store": store, "dispatcher": dispatcher}


def proposal_of(tx: Transaction, call: ModelCall) -> Plan | Outcome:
    """The plan `call` proposes, valid against the transaction's tools; else the answer."""
    if tx.status.terminal:
        return _ended(call, tx)
    arguments = call.arguments
    if isinstance(arguments, str) and not arguments.strip():
        arguments = "{}"
    try:
        plan = Plan.from_json(arguments)
        problems = [str(problem) for problem in plan.validate(plan_setting(tx)[0])]
        if not problems and plan.initial:
            keys = ", ".join(plan.initial)
            problems = [f"the plan declares initial {keys}: write the values into the inputs"]
    except PlanValidationError as exc:
        problems = [str(problem) for problem in exc.problems]
    except InvalidArgument as exc:  # what `from_json` refuses, JSON text included
        problems = [str(exc)]
    if problems:
        return _plan_refused(call, tx, problems)
    return plan


def _plan_refused(call: ModelCall, tx: Transaction, problems: Sequence[str]) -> Outcome:
    count = len(problems)
    payload: Payload = {
        "ok": False,
        "step": None,  # no step was used
        "plan": "REFUSED",
        "problems": [*problems],
        "error": (
            f"Hint: The plan was refused: {count} problem{'s' if count != 1 else ''}; nothing ran."
        ),
        "next_step": tx.next_step_id,
        "instruction": (
            f"Fix every problem listed and call {PLAN_TOOL} again with the whole corrected plan."
        ),
    }
    return Outcome(call_id=call.call_id, payload=payload, is_error=True)


def plan_not_run(call: ModelCall, tx: Transaction) -> Outcome:
    if tx.status.terminal:
        return _ended(call, tx)
    payload: Payload = {
        "ok": False,
        "step": None,
        "error": "Hint: Not run: an earlier call of this turn failed first.",
        "next_step": tx.next_step_id,
        "instruction": f"Call {PLAN_TOOL} again, once the failure is dealt with, if still needed.",
    }
    return Outcome(call_id=call.call_id, payload=payload, is_error=True)


def plan_answer(tx: Transaction, call: ModelCall, result: PlanResult) -> Outcome:
    """The answer to a plan that ran: its status and each node's output or error."""
    nodes: dict[str, JSONValue] = {}
    for node_id, node in result.nodes.items():
        entry: dict[str, JSONValue] = {"tool": node.tool, "state": node.state.value}
        if node.state is NodeState.SUCCEEDED:
            entry["output"] = node.output
        elif node.error is not None:
            entry["error"] = node.error.text
        nodes[node_id] = entry
    payload: Payload = {"ok": result.succeeded, "step": None, "plan": result.status.value}
    payload["run_id"] = result.run_id
    payload["nodes"] = nodes
    compensated: list[JSONValue] = [c.node_id for c in result.compensations]
    if compensated:
        payload["compensated"] = [*compensated]
    if result.error is not None:
        payload["error"] = f"Hint: {result.error}"
    payload["next_step"] = tx.next_step_id
    payload["instruction"] = (
        "The plan ran: each node's output is above. Copy what you need into later calls "
        "(references to a plan's nodes do not work outside it)."
        if result.succeeded
        else "The plan failed: nothing it wrote was kept and its completed nodes were "
        "compensated. Fix what the errors name and propose a corrected plan, or go on step "
        "by step."
    )
    return Outcome(call_id=call.call_id, payload=payload, is_error=not result.succeeded)


# ---------------------------------------------------------------------- the history rewrite


def voided_payload(step: int | None) -> Payload:
    """The result that replaces a voided call's result under `history="void"`."""
    what = "this step" if step is None else f"step {step}"
    payload: Payload = {"ok": False}
    if step is not None:
        payload["step"] = step
    payload["voided"] = True
    # Not a hint (no "Hint: " prefix): it describes a result, not a failure to fix.
    payload["error"] = (
        f"Voided by rollback: {what} was undone (and compensated); its output no longer holds."
    )
    payload["instruction"] = "Do not use this result; follow the latest tool result."
    return payload


def _steps_text(steps: Sequence[int]) -> str:
    if len(steps) == 1:
        return f"step {steps[0]}"
    return "steps " + ", ".join(str(s) for s in steps[:-1]) + f" and {steps[-1]}"


@final
@attrs.frozen(kw_only=True)
class Rewrite:
    """How to change the message history after a turn, in provider-neutral terms.

    `drop`: call ids whose calls and results to remove (`"truncate"`). `replace`: call id to the
    payload that replaces its result (`"void"`). `notes`: call id of this turn to a note added
    to its payload (`"truncate"`, on the call whose failure caused the rewind). All empty when
    nothing was voided, and under `"keep"`.

    A call id names a call within its turn only: a later turn may send the same id again
    (docs/protocol.md#call-ids-and-turns). `voided` maps each voided call's id to the steps
    it was sent as, so a rewrite that reaches the history through `reached` removes (or
    replaces) the voided calls only, and not an earlier or later call that used the same id;
    `truncate` says whether they go (`"truncate"`) or their results are replaced (`"void"`).
    """

    drop: frozenset[str] = frozenset()
    replace: Mapping[str, Payload] = attrs.field(factory=dict)
    notes: Mapping[str, str] = attrs.field(factory=dict)
    voided: Mapping[str, frozenset[int]] = attrs.field(factory=dict)
    truncate: bool = False

    @property
    def empty(self) -> bool:
        """True when the history stays as it is."""
        return not (self.drop or self.replace or self.notes or self.voided)

    def reached(
        self, entries: Iterable[tuple[Hashable, bool, object, object]]
    ) -> dict[Hashable, int]:
        """The calls and results of a history that this rewrite voids, each with its step.

        `entries` are the history's tool calls and tool results in order, each as
        `(key, is_result, call_id, content)` (`content` the result's text, None for a call).
        A result is voided when its call id is voided and it is the success result of one of
        the steps voided with that id (its JSON says `"ok": true` and the step); the call it
        answers is the latest call with its id before it, which is voided with it. A result
        whose text is not such JSON (a caller rewrote it) is voided by its call id alone.
        Returns the keys of the voided entries, each with the step it was sent as.
        """
        voided = self.voided
        reached: dict[Hashable, int] = {}
        if not voided:
            return reached
        latest: dict[str, Hashable] = {}  # call id -> the key of its latest call so far
        for key, is_result, call_id, content in entries:
            if not isinstance(call_id, str) or call_id not in voided:
                continue
            if not is_result:
                latest[call_id] = key
                continue
            step = _voided_step(content, voided[call_id])
            if step is None:
                continue
            reached[key] = step
            call = latest.pop(call_id, None)
            if call is not None:
                reached[call] = step
        return reached


def _voided_step(content: object, steps: frozenset[int]) -> int | None:
    """The step of `steps` whose success result `content` is (None: not one of them)."""
    try:
        payload = json.loads(content) if isinstance(content, (str, bytes)) else None
    except ValueError:
        payload = None
    if not isinstance(payload, dict):  # not a result agenttx wrote: known by its call id
        return min(steps)
    step = payload.get("step")
    if payload.get("ok") is True and type(step) is int and step in steps:
        return step
    return None


def rewrite_for(
    history: History, outcomes: Sequence[Outcome], steps_by_call: Mapping[str, int]
) -> Rewrite:
    """The history rewrite a turn asks for under `history`.

    `steps_by_call` maps the call ids the runner has sent to their step numbers (to name the
    voided steps when a voided step had no call id). A call of this turn that did not succeed
    is never dropped or replaced: its result is what tells the model what happened.
    """
    voided: list[str] = []
    pairs: dict[str, set[int]] = {}
    failing: str | None = None
    for outcome in outcomes:
        result = outcome.result
        if result is None:
            continue
        ids = result.voided_call_ids
        if ids and failing is None:
            failing = outcome.call_id
        voided.extend(ids)
        for call_id, step in _voided_calls(result.voided_steps, ids, steps_by_call):
            pairs.setdefault(call_id, set()).add(step)
    keep = {o.call_id for o in outcomes if o.is_error}
    voided_ids = [i for i in dict.fromkeys(voided) if i not in keep]
    if history == "keep" or not pairs:
        return Rewrite()
    by_call = {i: frozenset(steps) for i, steps in pairs.items()}
    if history == "void":
        replace = {i: voided_payload(min(by_call[i])) for i in voided_ids if i in by_call}
        return Rewrite(replace=replace, voided=by_call)
    steps = sorted({step for found in pairs.values() for step in found})
    calls = len(steps)
    what = f"{_steps_text(steps)} ({calls} tool call{'s' if calls != 1 else ''})"
    note = (
        f"The rollback undid {what}; their calls and results were removed from this conversation."
    )
    notes = {failing: note} if failing is not None else {}
    return Rewrite(drop=frozenset(voided_ids), notes=notes, voided=by_call, truncate=True)


def _voided_calls(
    steps: Sequence[int], call_ids: Sequence[str], steps_by_call: Mapping[str, int]
) -> Iterable[tuple[str, int]]:
    """Each voided call as `(call id, step)`: the voided steps and their call ids line up when
    every voided step had a call id (as a runner's steps do); else `steps_by_call` says."""
    if len(steps) == len(call_ids):
        return zip(call_ids, steps, strict=True)
    return ((i, steps_by_call[i]) for i in call_ids if i in steps_by_call)


def with_note(payload: Payload, note: str | None) -> Payload:
    """`payload` with `note` added last (a copy), or `payload` itself when there is no note."""
    if note is None:
        return payload
    return {**payload, "note": note}


def specs_json(specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """Each spec as `{"name": wire_name, "description", "parameters"}`: new objects on each
    call, down to the schema (`ToolSpec.parameters` is a copy), so a caller may change them."""
    return [
        {"name": s.wire_name, "description": s.description, "parameters": s.parameters}
        for s in specs
    ]
