"""Lineage from what agent code already has: an OpenAI chat transcript, a transaction's steps.

Both feed a `LineageRecorder` (its options are passed through) and return its `LineageGraph`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from .._errors import InvalidArgument
from ._recorder import LineageGraph, LineageRecorder, is_call_id

__all__ = ["lineage_from_openai", "lineage_from_steps"]


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
    JSON; a mapping is taken as is). A `tool` message ends the call named by `tool_call_id`
    with its `content`, parsed as JSON when it is JSON, else kept as the string; a list of
    content parts is joined from its text parts first. Malformed entries (not a mapping, no
    id, no `function`, unknown `tool_call_id`) are skipped, never raised. Pass SDK objects as
    dicts (`message.model_dump()`). Raises `InvalidArgument` for a bad option, or when
    `messages` is a string, a mapping or not iterable.
    """
    recorder = LineageRecorder(
        min_value_length=min_value_length,
        match_numbers=match_numbers,
        max_depth=max_depth,
        evidence=evidence,
    )
    iteration = 0
    for message in _entries(messages, "messages"):
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role == "assistant":
            iteration += 1
            recorder.on_iteration(iteration)
            calls = message.get("tool_calls")
            for call in calls if isinstance(calls, list) else ():
                _start_openai_call(recorder, call)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if is_call_id(call_id):
                recorder.on_tool_end(
                    call_id, _parse_json_text(_content_text(message.get("content")))
                )
    return recorder.lineage()


def _start_openai_call(recorder: LineageRecorder, call: object) -> None:
    if not isinstance(call, Mapping):
        return
    call_id = call.get("id")
    function = call.get("function")
    if not is_call_id(call_id) or not isinstance(function, Mapping):
        return
    name = function.get("name")
    recorder.on_tool_start(
        call_id,
        name if isinstance(name, str) else None,
        _parse_json_text(function.get("arguments")),
    )


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

    Each step is its own iteration (`iteration = step_id`) and its call id is `str(step_id)`:
    it starts with `arguments` and ends with `output`. Entries without an int `step_id` are
    skipped. Raises `InvalidArgument` for a bad option, or when `steps` is not iterable.
    """
    recorder = LineageRecorder(
        min_value_length=min_value_length,
        match_numbers=match_numbers,
        max_depth=max_depth,
        evidence=evidence,
    )
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
    return recorder.lineage()


def _entries(entries: Iterable[object], what: str) -> Iterable[object]:
    if isinstance(entries, (str, bytes, Mapping)) or not isinstance(entries, Iterable):
        raise InvalidArgument(
            f"{what} must be an iterable of entries, got {type(entries).__name__}"
        )
    return entries
