"""How a failed step is decided: what the graph says about its key, and what the model is told.

Only the failure path runs this (a step that succeeds never does). Given the failed call (the
timeline's `Pending`) and the dependency graph that includes it, `decide_failure` reads three
things beyond the Clean Hint (`docs/protocol.md#what-the-model-receives`):

* a literal mistake: the hint's key names an argument the call wrote itself, which no earlier
  step produced (no reference, no implicit link, no earlier output holding the same value:
  `DependencyGraph.is_literal`). Undoing earlier steps cannot fix it, so it is decided as a
  mistake of this step (`RESEND`), as a malformed call is (`docs/protocol.md#mistakes`);
* the failure's signature (`failure_signature`: tool, hint category, key and the value under
  it; all canonical arguments only without a key that names one), so that the controller
  aborts when the same call fails the same way after a rewind
  (`docs/protocol.md#repeated-failures`);
* the bad value (`BadValue`): the argument under the hint's key, bounded (its JSON text at
  most `MAX_BAD_VALUE_CHARS` characters, whatever its type), redacted for a tool's secret
  parameter, with the step that produced it (its root cause, else the earlier step whose
  output it was copied from: `DependencyGraph.copied_from`).

Then it asks the controller, and returns the decision with the audit event's data.

Before any of this, `without_secrets` writes the values of the call's secret arguments
(`@tool(secret=[...])`) out of the failure's message, so that the hint, the constraints, the
audit trail and the result's error never quote them.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING, Final, NamedTuple

from .._errors import JSONValueError
from .._json import scalar_leaves
from .._results import MAX_BAD_VALUE_CHARS, REDACTED, BadValue
from .._rollback import RollbackStrategy, failure_signature

if TYPE_CHECKING:
    from .._graph import DependencyGraph
    from .._hints import CleanHint
    from .._json import JSONScalar, JSONValue
    from .._rollback import RollbackController, RollbackDecision
    from .._timeline import Pending
    from .._tools import Failure, ToolRegistry

__all__ = ["Decided", "bad_value_of", "decide_failure", "without_secrets"]

#: Keys compare ignoring ASCII case only, as the dependency graph compares them.
_ASCII_LOWER: Final = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


class Decided(NamedTuple):
    """The controller's decision about a failed step, its hint, what the model is told beyond
    the hint, the data of the step's `STEP_FAILED` audit event, and the error text the result
    keeps (`without_secrets`)."""

    decision: RollbackDecision
    hint: CleanHint
    bad_value: BadValue | None
    event: dict[str, JSONValue]
    error: str = ""


def without_secrets(failure: Failure, pending: Pending | None, registry: ToolRegistry) -> Failure:
    """`failure` with the value of every secret argument of its call (`tool.secrets`: a leaf of
    a secret parameter, or a leaf under a secret parameter's name) written `[redacted]` in its
    message, before the hint cleaner reads it: so neither the hint, nor the constraints, nor
    the audit trail, nor the result's error quotes it. A string value is found as written and
    as `repr` writes it; a number as `str` writes it (booleans and null are no secret). The
    same `failure` when its tool has no secret or its call none of them."""
    if pending is None or not isinstance(pending.inputs, dict):
        return failure
    tool = registry.get(pending.tool_name)
    if tool is None or not tool.secrets:
        return failure
    secrets = tool.secrets
    found: set[str] = set()
    for parameter in pending.inputs:
        for leaf_key, value in scalar_leaves(pending.inputs[parameter], parameter):
            if secrets.isdisjoint({parameter, leaf_key}) or value is None:
                continue
            if isinstance(value, str):
                found.update((value, repr(value)[1:-1]))
            elif not isinstance(value, bool):
                found.add(str(value) if not isinstance(value, int) else _digits(value))
    message = failure.message
    for text in sorted(found - {""}, key=len, reverse=True):  # the longest first
        message = message.replace(text, REDACTED)
    return failure if message == failure.message else failure._replace(message=message)


def _digits(value: int) -> str:
    """An integer's decimal text (JSON arguments hold at most 4300 digits, which `str` takes)."""
    try:
        return str(value)
    except ValueError:  # beyond the interpreter's limit: it cannot be in a message either
        return ""


def decide_failure(
    controller: RollbackController,
    step_id: int,
    hint: CleanHint,
    *,
    graph: DependencyGraph,
    pending: Pending | None,
    registry: ToolRegistry,
    transient: bool,
    mistake: bool,
) -> Decided:
    """Decide the failure of `step_id` (whose call was `pending`, None if it never got one) on
    `graph`, which holds the failed step; see the module docstring."""
    key = hint.key
    signature = None
    if pending is not None:
        if not (mistake or transient) and key is not None and graph.is_literal(step_id, key):
            mistake = True  # the call wrote the bad value itself: send it again, fixed
        try:
            signature = failure_signature(
                pending.tool_name, pending.inputs, hint.category.value, key
            )
        except (JSONValueError, TypeError, ValueError):  # not JSON: a call that never parsed
            signature = None
    decision = controller.decide(
        step_id,
        key,
        graph.find_root_cause,
        transient=transient,
        mistake=mistake,
        signature=signature,
    )
    bad_value = None
    if pending is not None and key is not None:
        bad_value = bad_value_of(step_id, key, pending, graph, registry)
    strategy = decision.strategy
    event: dict[str, JSONValue] = {
        "hint": hint.text,
        "category": hint.category.value,
        "strategy": strategy.value,
        "rollback_to_step": 0 if strategy is RollbackStrategy.ABORT else decision.target_step,
    }
    if pending is not None:
        event["tool"] = pending.tool_name
    return Decided(decision, hint, bad_value, event)


def bad_value_of(
    step_id: int, key: str, pending: Pending, graph: DependencyGraph, registry: ToolRegistry
) -> BadValue | None:
    """The argument of `pending` under `key` (the first such leaf, in leaf order, ignoring
    ASCII case), or None if it has none; redacted if it is, or is inside, a secret parameter
    of the tool."""
    inputs = pending.inputs
    if not isinstance(inputs, dict):
        return None
    lowered = key.translate(_ASCII_LOWER)
    found: tuple[str, str, JSONScalar] | None = None
    for parameter in sorted(inputs):
        for leaf_key, scalar in scalar_leaves(inputs[parameter], parameter):
            if leaf_key.translate(_ASCII_LOWER) == lowered:
                found = (parameter, leaf_key, scalar)
                break
        if found is not None:
            break
    if found is None:
        return None
    parameter, leaf_key, value = found
    root = graph.find_root_cause(step_id, key)
    if root is None:
        root = graph.copied_from(step_id, key)
    producer = root if root is not None and 1 <= root < step_id else step_id
    tool = registry.get(pending.tool_name)
    secret = tool is not None and not tool.secrets.isdisjoint({parameter, leaf_key})
    value = REDACTED if secret else _bounded(value)
    return BadValue(key=key, value=value, step=max(producer, 1), redacted=secret)


def _bounded(value: JSONScalar) -> JSONScalar:
    """`value` whole if its JSON text has at most `MAX_BAD_VALUE_CHARS` characters; else that
    text (a string's own characters, an integer's digits) cut to its first
    `MAX_BAD_VALUE_CHARS - 3` characters and `...`, as a string. A float's text is short."""
    if isinstance(value, str):
        if len(value) <= MAX_BAD_VALUE_CHARS:
            return value
        return value[: MAX_BAD_VALUE_CHARS - 3] + "..."
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    if -(10 ** (MAX_BAD_VALUE_CHARS - 1)) < value < 10**MAX_BAD_VALUE_CHARS:
        return value
    # The leading digits without `str` of the whole (which refuses more than 4300 digits):
    # dividing by a power of ten below the number's size keeps at least the digits shown.
    magnitude = abs(value)
    drop = max(int(magnitude.bit_length() * 0.30102999566) - MAX_BAD_VALUE_CHARS, 0)
    leading = str(magnitude // 10**drop)
    text = ("-" if value < 0 else "") + leading
    return text[: MAX_BAD_VALUE_CHARS - 3] + "..."
