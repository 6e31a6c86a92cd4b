"""Lineage from what agent code already has: an OpenAI chat transcript, a transaction's steps.

Both feed a `LineageRecorder` (its options are passed through) and return its `LineageGraph`,
with what agenttx itself knows added: step numbers, `${steps.N...}` references as explicit
edges, and the calls a rewind voided (`_steps.py`, docs/lineage.md#references-and-rewinds).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from .._errors import InvalidArgument
from .._refs import Dependency
from ._recorder import LineageGraph, LineageRecorder, is_call_id
from ._steps import Explicit, StepPayload, StepTracker, step_payload, with_references

if TYPE_CHECKING:
    from .._json import JSONValue

__all__ = ["LineageStep", "lineage_from_openai", "lineage_from_steps"]


class LineageStep(NamedTuple):
    """A step as `lineage_from_steps` reads it: a `StepRecord` with its dependencies."""

    step_id: int
    tool_name: str
    arguments: JSONValue
    output: JSONValue
    dependencies: tuple[Dependency, ...]


class _Call:
    """A tool call of a transcript: its arguments, and its first result if a step payload."""

    __slots__ = ("answered", "arguments", "payload")

    def __init__(self, arguments: object) -> None:
        self.arguments = arguments
        self.answered = False
        self.payload: StepPayload | None = None


def lineage_from_openai(
    messages: Iterable[object],
    *,
    min_value_length: int = 4,
    match_numbers: bool = False,
    max_depth: int = 6,
    evidence: bool = False,
) -> LineageGraph:
    """The lineage of an OpenAI chat transcript (a list of message dicts).

    Each assistant message is one iteration (the first is 1). Its `tool_calls` start, in order,
    with their `function.arguments` parsed from JSON text (kept as the string when it is not
    JSON; a mapping is taken as is). A `tool` message ends the latest call with its
    `tool_call_id` with its `content`, parsed as JSON when it is JSON, else kept as the string;
    a list of content parts is joined from its text parts first. Malformed entries (not a
    mapping, no id, no `function`, unknown `tool_call_id`) are skipped, never raised. Pass SDK
    objects as dicts (`message.model_dump()`).

    A transcript driven by agenttx gets more (docs/lineage.md#references-and-rewinds): a result
    that is a step payload (`StepResult.for_model()`) gives the call its `step` and feeds the
    recorder its `output` (or, failed, its `error` with `error=True`) instead of the whole
    payload; each `${steps.N...}` reference in the arguments becomes an explicit edge from the
    call that was step N; calls a rewind voided are marked `voided` and keep no edges. Without
    payloads the step numbers are counted, and a transcript without references or payloads
    gives exactly the recorder's lineage. Cost is linear in the transcript's size.

    Raises `InvalidArgument` for a bad option, or when `messages` is a string, a mapping or
    not iterable.
    """
    recorder = LineageRecorder(
        min_value_length=min_value_length,
        match_numbers=match_numbers,
        max_depth=max_depth,
        evidence=evidence,
    )
    calls: list[_Call] = []
    latest: dict[str, _Call] = {}  # call id -> its latest call, as the recorder matches ends
    iteration = 0
    for message in _entries(messages, "messages"):
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role == "assistant":
            iteration += 1
            recorder.on_iteration(iteration)
            tool_calls = message.get("tool_calls")
            for call in tool_calls if isinstance(tool_calls, list) else ():
                started = _start_openai_call(recorder, call)
                if started is not None:
                    call_id, arguments = started
                    latest[call_id] = _Call(arguments)
                    calls.append(latest[call_id])
        elif role == "tool":
            answered_id = message.get("tool_call_id")
            if not is_call_id(answered_id) or answered_id not in latest:
                continue
            content = _parse_json_text(_content_text(message.get("content")))
            payload = step_payload(content)
            if payload is None:
                recorder.on_tool_end(answered_id, content)
            else:
                recorder.on_tool_end(answered_id, payload.result, error=not payload.ok)
            ended = latest[answered_id]
            if not ended.answered:  # a call has one result; a repeated one is not a new step
                ended.answered = True
                ended.payload = payload
    tracker = StepTracker()
    for index, call in enumerate(calls):
        tracker.call(index, call.arguments, call.payload)
    return with_references(recorder.lineage(), tracker.explicit, tracker.steps, tracker.voided)


def _start_openai_call(recorder: LineageRecorder, call: object) -> tuple[str, object] | None:
    """Start `call` on the recorder; its id and parsed arguments, or None if it was skipped."""
    if not isinstance(call, Mapping):
        return None
    call_id = call.get("id")
    function = call.get("function")
    if not is_call_id(call_id) or not isinstance(function, Mapping):
        return None
    name = function.get("name")
    arguments = _parse_json_text(function.get("arguments"))
    recorder.on_tool_start(call_id, name if isinstance(name, str) else None, arguments)
    return call_id, arguments


def _content_text(content: object) -> object:
    """A tool message's content: a list of content parts becomes the text of its text parts."""
    if not isinstance(content, list):
        return content
    return "".join(
        part["text"]
        for part in content
        if isinstance(part, Mapping)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
    )


def _parse_json_text(value: object) -> object:
    """JSON text parsed, other text as it is; non-text values unchanged."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value


def lineage_from_steps(
    steps: Iterable[object],
    *,
    min_value_length: int = 4,
    match_numbers: bool = False,
    max_depth: int = 6,
    evidence: bool = False,
) -> LineageGraph:
    """The lineage of a transaction's steps (`StepRecord`s, or objects with the same attributes).

    Each step is its own iteration (`iteration = step_id`), its call id is `str(step_id)` and
    its node's `step` is `step_id`: it starts with `arguments` and ends with `output`. A step
    that also has `dependencies` (the `Dependency`s its references recorded, as the
    transaction keeps them) gets an explicit edge for each one whose `from_step` is an earlier
    step of `steps`, as the dependency graph draws them, valued `${steps.N}` (the path is not
    kept; the keys are). Entries without an int `step_id` are skipped; so are dependencies
    that are not `Dependency` objects. Raises `InvalidArgument` for a bad option, or when
    `steps` is not iterable.
    """
    recorder = LineageRecorder(
        min_value_length=min_value_length,
        match_numbers=match_numbers,
        max_depth=max_depth,
        evidence=evidence,
    )
    numbers: dict[int, int] = {}  # node index -> step
    by_step: dict[int, int] = {}  # step -> its latest node index
    explicit: list[Explicit] = []
    for step in _entries(steps, "steps"):
        step_id = getattr(step, "step_id", None)
        if not isinstance(step_id, int) or isinstance(step_id, bool):
            continue
        name = getattr(step, "tool_name", None)
        recorder.on_iteration(step_id)
        recorder.on_tool_start(
            str(step_id), name if isinstance(name, str) else None, getattr(step, "arguments", None)
        )
        recorder.on_tool_end(str(step_id), getattr(step, "output", None))
        index = len(numbers)
        dependencies = getattr(step, "dependencies", ())
        for dependency in dependencies if isinstance(dependencies, (tuple, list)) else ():
            if not isinstance(dependency, Dependency) or dependency.from_step >= step_id:
                continue
            source = by_step.get(dependency.from_step)
            if source is not None:
                text = f"${{steps.{dependency.from_step}}}"
                explicit.append(Explicit(source, index, text, dependency))
        numbers[index] = step_id
        by_step[step_id] = index
    return with_references(recorder.lineage(), explicit, numbers, ())


def _entries(entries: Iterable[object], what: str) -> Iterable[object]:
    if isinstance(entries, (str, bytes, Mapping)) or not isinstance(entries, Iterable):
        raise InvalidArgument(
            f"{what} must be an iterable of entries, got {type(entries).__name__}"
        )
    return entries
