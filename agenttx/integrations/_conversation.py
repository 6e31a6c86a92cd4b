"""The conversation a runner keeps with its transaction: its turn in progress and its record.

A runner's state is the conversation (`messages`, in its provider's format), the step each
call id ran as, and the model turn in progress, if any (`OpenTurn`): the turn's calls in the
model's order, the step the turn began at, the answers of its calls that ran so far (the tool
calls before the waiting one; a `propose_plan` call is answered after the turn's other calls,
so its answer may follow a later call's), the call that waits for a person (at most one: steps
run in the calls' order, and a waiting step holds the transaction there), the plan run each
`propose_plan` call started (recorded before the run starts, so that a restored runner answers
the call from that run and never starts another), and the transaction's constraints when the
turn was last written (a failure of one of its calls adds one). `dump` turns it into JSON text and
`load` back; the format is internal (versioned by `FORMAT`, read by this module only):

    {"format": 2, "runner": "openai.chat" | "openai.responses" | "anthropic" | ...,
     "history": "truncate" | "void" | "keep", "count": n, "steps": {call_id: step},
     "turn": null | {"calls": [[call_id, name, arguments]], "first_step": n,
                     "answers": [[call_id, payload, is_error]],
                     "waiting": [[call_id, "approval" | "review", request_id]],
                     "plans": [[call_id, run_id]], "constraints": [hint, ...]}}

The messages are not in it: a store keeps them as a log (`stores.ConversationStore`), each
message as its own JSON text (`dump_messages`), appended once, and `count` says how many of
them the record has (a log that holds more, or fewer, is read as this record says, or refused).
Format 1, written before the log, held `"messages": [...]` in place of `count`; `load` reads
both, and the integrations that keep a whole record each time (the Agents SDK's hooks,
pydantic-ai's toolset) still write it.

Pure: no store, no transaction.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, final

import attrs

from .._errors import InvalidArgument, StorageError
from ._common import HISTORIES, ModelCall, Outcome

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from ._common import History, Payload

__all__ = ["FORMAT", "OpenTurn", "Saved", "Wait", "WaitKind", "dump", "dump_messages", "load"]

#: The version of the record format above (1: the whole record, messages included).
FORMAT: Final = 2

WaitKind: TypeAlias = Literal["approval", "review"]


@final
@attrs.frozen(kw_only=True)
class Wait:
    """The call of the open turn that waits for a person, and the request it waits on."""

    call_id: str
    kind: WaitKind
    request_id: str


@final
@attrs.frozen(kw_only=True)
class OpenTurn:
    """A model turn whose calls are not all answered yet (see the module docstring)."""

    calls: tuple[ModelCall, ...]
    first_step: int
    answers: tuple[Outcome, ...] = ()
    waiting: tuple[Wait, ...] = ()
    plans: tuple[tuple[str, str], ...] = ()
    constraints: tuple[str, ...] = ()

    def _matched(self) -> list[Outcome | None]:
        """Each call's answer, or None: answers are matched to the calls by call id, in order
        (a call id sent twice in one turn is answered twice)."""
        left: dict[str, list[Outcome]] = {}
        for outcome in self.answers:
            left.setdefault(outcome.call_id, []).append(outcome)
        return [left[c.call_id].pop(0) if left.get(c.call_id) else None for c in self.calls]

    @property
    def rest(self) -> tuple[ModelCall, ...]:
        """The calls not answered yet, in order (the waiting one first, if any)."""
        matched = self._matched()
        return tuple(c for c, o in zip(self.calls, matched, strict=True) if o is None)

    def ordered(self) -> tuple[Outcome, ...]:
        """The answers in the order of the calls."""
        return tuple(o for o in self._matched() if o is not None)

    def run_of(self, call_id: str) -> str | None:
        """The plan run the `propose_plan` call `call_id` started, if it started one."""
        return dict(self.plans).get(call_id)


@final
@attrs.frozen(kw_only=True)
class Saved:
    """A runner's state as `load` reads it back."""

    runner: str
    history: History
    format: int
    messages: list[dict[str, Any]]
    steps: dict[str, int]
    turn: OpenTurn | None


def _default(value: object) -> object:
    """What `json.dumps` does with an SDK object inside a message: its JSON dump."""
    dump_model = getattr(value, "model_dump", None)
    if callable(dump_model):
        return dump_model(mode="json", exclude_none=True, warnings=False)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _text(value: object) -> str:
    """`value` as compact JSON text (SDK objects by their dump); `InvalidArgument` if it is
    not JSON."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_default)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(
            f"the conversation cannot be kept with the transaction: it is not JSON ({exc})"
        ) from None


def dump_messages(messages: Sequence[dict[str, Any]]) -> list[str]:
    """Each message as its own JSON text, for the store's log; `InvalidArgument` if one is
    not JSON."""
    return [_text(message) for message in messages]


def dump(
    runner: str,
    history: History,
    messages: list[dict[str, Any]] | int,
    steps: Mapping[str, int],
    turn: OpenTurn | None,
) -> str:
    """The record (JSON text) of a runner's state: with the number of its messages (format 2,
    the messages go to the log), or with the messages themselves (format 1, a whole record);
    `InvalidArgument` if something in it is not JSON."""
    whole = not isinstance(messages, int)
    record: dict[str, Any] = {
        "format": 1 if whole else FORMAT,
        "runner": runner,
        "history": history,
        "messages" if whole else "count": messages,
        "steps": dict(steps),
        "turn": None,
    }
    if turn is not None:
        record["turn"] = {
            "calls": [[c.call_id, c.name, c.arguments] for c in turn.calls],
            "first_step": turn.first_step,
            "answers": [[o.call_id, o.payload, o.is_error] for o in turn.answers],
            "waiting": [[w.call_id, w.kind, w.request_id] for w in turn.waiting],
            "plans": [[c, r] for c, r in turn.plans],
            "constraints": list(turn.constraints),
        }
    return _text(record)


def load(text: str, where: str, log: Callable[[int], Sequence[str]]) -> Saved:
    """A runner's state from its record, with its messages read from the log (`log(count)`:
    the first `count` messages' texts, in order); `StorageError` naming `where` if it is not
    one, or the log does not hold the messages it counts."""
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or record.get("format") not in (1, FORMAT):
            raise TypeError("an unknown format")  # noqa: TRY301  (one error for every defect)
        history = record["history"]
        if history not in HISTORIES:
            raise TypeError("an unknown history")  # noqa: TRY301
        messages = record["messages"] if record["format"] == 1 else _logged(record, log)
        steps = {str(k): int(v) for k, v in record["steps"].items()}
        if not isinstance(messages, list) or not isinstance(record["runner"], str):
            raise TypeError("no messages")  # noqa: TRY301
        turn = None if record["turn"] is None else _turn(record["turn"])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StorageError(
            f"the conversation stored for {where} is not one this version of agenttx reads ({exc})"
        ) from None
    return Saved(
        runner=record["runner"],
        history=history,
        format=record["format"],
        messages=messages,
        steps=steps,
        turn=turn,
    )


def _logged(record: dict[str, Any], log: Callable[[int], Sequence[str]]) -> list[Any]:
    """The messages a format-2 record counts, from the log."""
    count = record["count"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise TypeError("no message count")
    texts = log(count)
    if len(texts) != count:
        raise TypeError(f"{count} messages recorded, {len(texts)} found in the log")
    return [json.loads(message) for message in texts]


def _turn(found: dict[str, Any]) -> OpenTurn:
    calls = tuple(ModelCall(call_id=str(i), name=n, arguments=a) for i, n, a in found["calls"])
    answers = tuple(
        Outcome(call_id=str(i), payload=_payload(p), is_error=bool(e))
        for i, p, e in found["answers"]
    )
    waiting = tuple(
        Wait(call_id=str(i), kind="review" if k == "review" else "approval", request_id=str(r))
        for i, k, r in found["waiting"]
    )
    plans = tuple((str(c), str(r)) for c, r in found.get("plans", ()))
    constraints = tuple(str(h) for h in found.get("constraints", ()))
    return OpenTurn(
        calls=calls,
        first_step=int(found["first_step"]),
        answers=answers,
        waiting=waiting,
        plans=plans,
        constraints=constraints,
    )


def _payload(value: object) -> Payload:
    if not isinstance(value, dict):
        raise TypeError("an answer is not an object")
    return value
