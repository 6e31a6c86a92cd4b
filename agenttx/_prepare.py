"""A step's call before its tool runs: checked, parsed, resolved and bounded.

`check_call` refuses protocol misuse (it raises; nothing has changed yet); its part
`check_tool_call`, with `check_call_id`, also checks each call of a turn before the first one
runs (`_turns.TurnCall`). `prepare_call` turns
the agent's arguments into the `Call` the tool receives, or into the message of an agent-caused
failure: malformed JSON, an unknown tool (a tool may be named by its registered or its wire
name), a bad reference, resolved arguments over the size limit (references can turn a small call
into a huge one), or resolved arguments that do not fit the tool's spec (a mistake naming the
argument: `docs/protocol.md#tool-specs`). `output_error` bounds what the tool
returned. One rule for every store: what passes here is what any store can keep.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, TypeAlias

from ._errors import InvalidArgument, StepOutOfOrder
from ._json import (
    MAX_INT_DIGITS,
    JSONValue,
    canonical_dumps,
    check_json_sized,
    checked_size_bound,
)
from ._limits import MAX_AGENT_ID_BYTES, MAX_PAYLOAD_BYTES, over_limit
from ._refs import resolve_value
from ._timeline import Pending
from ._tools import MAX_TOOL_NAME, Call, Failure, ToolContext, derive_key

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._tools import Outcome, ToolRegistry, UndoRecord
    from .stores import Store

__all__ = [
    "MAX_CALL_ID",
    "UNDO_SEQ_BITS",
    "Arguments",
    "check_agent_id",
    "check_call",
    "check_call_id",
    "check_tool_call",
    "duplicate_call_id",
    "output_error",
    "prepare_call",
]

#: An attempt's undo records are numbered from `rewinds << UNDO_SEQ_BITS`: a step runs again only
#: after a failure decision, which counts one more, so no two attempts of a step share a number
#: (a step registers far fewer than a million undos), and a kept record is never replaced.
UNDO_SEQ_BITS: Final = 20

#: The longest call id accepted (characters); providers' ids are far shorter.
MAX_CALL_ID: Final = 256


#: A call's arguments as `check_call` passes them on: a checked dict with its size bound
#: (`checked_size_bound`), or JSON text still to parse (bound 0).
Arguments: TypeAlias = "tuple[JSONValue | str, int]"


def check_call(
    step_id: object, next_step: int, tool_name: object, arguments: object, raw_context: object
) -> Arguments:
    """Raise for protocol misuse; return the arguments to parse (a dict, or JSON text)."""
    if isinstance(step_id, bool) or not isinstance(step_id, int):
        raise InvalidArgument(f"step_id must be an integer, got {type(step_id).__name__}")
    if step_id != next_step:
        raise StepOutOfOrder(expected=next_step, got=step_id)
    if not isinstance(raw_context, str):
        raise InvalidArgument(f"raw_context must be a string, got {type(raw_context).__name__}")
    if len(raw_context) > MAX_PAYLOAD_BYTES // 4 and over_limit(raw_context):  # most: short
        raise InvalidArgument(f"raw_context exceeds {MAX_PAYLOAD_BYTES} bytes")
    if type(arguments) is dict and type(tool_name) is str and 0 < len(tool_name) <= MAX_TOOL_NAME:
        # Most calls: `check_tool_call`'s mapping case, without its call.
        parsed, bound = check_json_sized(dict(arguments), what="arguments")
        if bound > MAX_PAYLOAD_BYTES and _too_big(parsed, bound):
            raise InvalidArgument(f"arguments exceed {MAX_PAYLOAD_BYTES} bytes")
        return parsed, bound
    return check_tool_call(tool_name, arguments)


def check_tool_call(tool_name: object, arguments: object) -> Arguments:
    """Raise `InvalidArgument` unless `tool_name` is a string of 1-128 characters and
    `arguments` are JSON text or a mapping within the input limits (`JSONValueError` for a
    mapping that is no JSON value); return the arguments to parse."""
    if not isinstance(tool_name, str) or not 1 <= len(tool_name) <= MAX_TOOL_NAME:
        raise InvalidArgument(f"tool_name must be 1-{MAX_TOOL_NAME} characters")
    if isinstance(arguments, str):
        if over_limit(arguments):
            raise InvalidArgument(f"arguments_json exceeds {MAX_PAYLOAD_BYTES} bytes")
        return arguments, 0
    if type(arguments) is dict or isinstance(arguments, Mapping):
        parsed, bound = check_json_sized(dict(arguments), what="arguments")
        if bound > MAX_PAYLOAD_BYTES and _too_big(parsed, bound):
            raise InvalidArgument(f"arguments exceed {MAX_PAYLOAD_BYTES} bytes")
        return parsed, bound
    raise InvalidArgument(
        f"arguments must be a mapping or JSON text, got {type(arguments).__name__}"
    )


def prepare_call(
    step_id: int,
    tool_name: str,
    arguments: Arguments,
    raw_context: str,
    *,
    registry: ToolRegistry,
    outputs: Mapping[int, JSONValue],
    sizes: Mapping[int, int],
    generation: int,
    rewinds: int,
    tx_id: str,
    store: Store,
    timeout: float,
    log_undo: Callable[[UndoRecord], object] | None,
) -> tuple[Call | Failure, Pending]:
    """The call ready to run (or why the agent's call fails), and the step as far as it got.

    `generation` (`Timeline.generation`) goes into the idempotency key, so a step sent again
    after a rewind that undid something gets a key of its own; `rewinds` numbers the undo
    records of this attempt apart from every earlier attempt's. `sizes` are the size bounds
    of the live steps' outputs: what a reference inserts is part of one, so resolved arguments
    are walked again for their size only when those bounds cannot show they are within the
    limit.
    """
    parsed, bound = arguments
    if isinstance(parsed, str):
        text = parsed
        try:
            loaded = json.loads(text) if text.strip() else {}
            parsed, bound = check_json_sized(loaded, what="arguments")
        except (ValueError, RecursionError) as exc:
            problem = str(exc)
            if "integer string conversion" in problem:  # not the interpreter's advice
                problem = f"an integer has more than {MAX_INT_DIGITS} digits"
            mistake = Failure(f"invalid arguments JSON: {problem}", mistake=True)
            return mistake, Pending(step_id, tool_name, None, ())
    tool = registry.get(tool_name)
    if tool is None:
        names = ", ".join(registry.wire_names())  # the names the model was given
        mistake = Failure(f"unknown tool '{tool_name}'; registered tools: {names}", mistake=True)
        return mistake, Pending(step_id, tool_name, parsed, ())
    tool_name = tool.name  # a call by wire name records the registered name
    resolved, dependencies, error = resolve_value(
        parsed, outputs, step_id, max_bytes=MAX_PAYLOAD_BYTES
    )
    pending = Pending(step_id, tool_name, resolved, dependencies)
    if error is not None:
        return Failure(error), pending
    if dependencies:
        unknown = 10 * MAX_PAYLOAD_BYTES + 1  # an output read back from the log: walk
        for dependency in dependencies:  # a loop, not `sum(...)`: no generator a step
            bound += sizes.get(dependency.from_step, unknown)
        if bound > MAX_PAYLOAD_BYTES:
            bound = checked_size_bound(resolved, what="arguments")
            if _too_big(resolved, bound):
                return Failure(f"resolved arguments exceed {MAX_PAYLOAD_BYTES} bytes"), pending
    checked, violation = tool.validator.check(resolved)  # the spec, before the tool runs
    if violation is not None:
        return Failure(violation.message, key=violation.key, mistake=True), pending
    if checked is not resolved:  # coerced (`3.0` -> `3`): the tool and the step get it
        resolved = checked
        pending = Pending(step_id, tool_name, resolved, dependencies)
    seq_base = rewinds << UNDO_SEQ_BITS
    context = None
    if tool.wants_context:
        context = ToolContext(
            tx_id=tx_id,
            step_id=step_id,
            idempotency_key=lambda: derive_key(tx_id, step_id, tool_name, resolved, generation),
            deadline=time.monotonic() + timeout,
            store=store,
            compensations=registry.compensations,
            log_undo=log_undo,
            seq_base=seq_base,
        )
    call = Call(
        step_id=step_id,
        tool=tool,
        arguments=resolved,
        raw_context=raw_context,
        context=context,
        timeout=timeout,
        log_undo=log_undo,
        seq_base=seq_base,
    )
    return call, pending


def output_error(call: Call, outcome: Outcome) -> Failure | None:
    """Why the step failed: the tool's error, or an output over 1 MiB (nothing is stored)."""
    if outcome.error is not None:
        return outcome.error
    if _too_big(outcome.output, outcome.size):  # its effect happened: its undo is kept
        return Failure(f"the output of tool '{call.tool.name}' exceeds {MAX_PAYLOAD_BYTES} bytes")
    return None


def check_call_id(call_id: object) -> None:
    """Raise `InvalidArgument` unless `call_id` is None or text of 1-256 characters that
    encodes to UTF-8 (it is written to the durable log)."""
    if call_id is None:
        return
    if not isinstance(call_id, str):
        raise InvalidArgument(f"call_id must be a string or None, got {type(call_id).__name__}")
    if not 1 <= len(call_id) <= MAX_CALL_ID:
        raise InvalidArgument(f"call_id must be 1-{MAX_CALL_ID} characters, got {len(call_id)}")
    try:
        call_id.encode()
    except UnicodeEncodeError:
        raise InvalidArgument("call_id must be valid Unicode (it has a lone surrogate)") from None


def duplicate_call_id(call_id: str, used_by: int) -> Failure:
    """The failure of a step sent with the call id of live step `used_by` (a mistake)."""
    return Failure(
        f"duplicate call id: '{call_id}' is the call id of step {used_by}, which still stands; "
        "send this call again with a call id of its own",
        mistake=True,
    )


def check_agent_id(agent_id: object) -> None:
    """Raise `InvalidArgument` unless `agent_id` is text of at most 256 bytes in UTF-8."""
    if not isinstance(agent_id, str):
        raise InvalidArgument(f"agent_id must be a string, got {type(agent_id).__name__}")
    try:
        size = len(agent_id.encode())
    except UnicodeEncodeError:
        raise InvalidArgument("agent_id must be valid Unicode (it has a lone surrogate)") from None
    if size > MAX_AGENT_ID_BYTES:
        raise InvalidArgument(f"agent_id exceeds {MAX_AGENT_ID_BYTES} bytes")


def _too_big(value: JSONValue, bound: int) -> bool:
    """Whether `value`'s canonical JSON exceeds 1 MiB, given `bound`, its `checked_size_bound`.

    Serializes only when the bound is unsure: the bound over-counts at most about 8.3 times (a
    float `0.0`, counted as 32 bytes), so past ten times the limit it is over for sure.
    """
    if bound <= MAX_PAYLOAD_BYTES:
        return False
    if bound > 10 * MAX_PAYLOAD_BYTES:
        return True
    return len(canonical_dumps(value).encode()) > MAX_PAYLOAD_BYTES
