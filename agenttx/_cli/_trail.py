"""The readable lines of `agenttx audit`: one line an event (time, kind, step or node, actor, a
short summary), every cell escaped and cut, so that no line is longer than `LINE` and no
string of an agent or a tool reaches the terminal as anything but text."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Final

from .._events import EventKind
from .._json import canonical_dumps
from ._terminal import cut, printable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from .._events import Event
    from .._json import JSONValue

__all__ = ["LINE", "audit_lines", "summary"]

#: The longest line `audit` prints (the summary is cut to fit).
LINE: Final = 160
#: The widths of the columns before the summary: time, kind, step or node, actor.
_KIND: Final = max(len(kind.value) for kind in EventKind)
_WHERE: Final = 16
_ACTOR: Final = 16
_LEAD: Final = 20 + 2 + _KIND + 2 + _WHERE + 2 + _ACTOR + 2


def audit_lines(events: Iterable[Event], *, headers: bool) -> list[str]:
    """One line an event, in the order given; with `headers`, a line naming the transaction or
    plan run before its events (the trail of several)."""
    lines: list[str] = []
    scope: tuple[str, str] | None = None
    for event in events:
        if headers and (event.scope, event.scope_id) != scope:
            scope = (event.scope, event.scope_id)
            what = "plan run" if event.scope == "plan" else "transaction"
            lines.append(cut(f"{what} {_cell(event.scope_id, LINE)}", LINE))
        lines.append(_line(event))
    return lines


def _line(event: Event) -> str:
    at = event.at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if event.step is not None:
        where = f"step {event.step}"
    elif event.node is not None:
        where = f"node {_cell(event.node, _WHERE - 5)}"
    else:
        where = "-"
    actor = "-" if event.actor is None else _cell(event.actor, _ACTOR)
    lead = f"{at}  {event.kind.value:<{_KIND}}  {where:<{_WHERE}}  {actor:<{_ACTOR}}  "
    return (lead + _cell(summary(event), LINE - _LEAD)).rstrip()


def summary(event: Event) -> str:
    """What the event says, in a few words: the tool, and what waits, failed or was done."""
    data = dict(event.data)
    tool = data.pop("tool", None)
    say = _SAYS.get(event.kind)
    said = _rest(data) if say is None else say(data)
    if tool is None:
        return said
    return f"{_text(tool)}: {said}" if said else _text(tool)


def _text(value: JSONValue) -> str:
    """A value for a summary: a string as it is (it is escaped when shown), else its JSON."""
    return value if isinstance(value, str) else canonical_dumps(value)


def _rest(data: Mapping[str, JSONValue]) -> str:
    """The data not otherwise summarized, as `key=value` pairs."""
    return ", ".join(f"{key}={_cell(_text(value), LINE)}" for key, value in data.items())


def _failure(data: dict[str, JSONValue]) -> str:
    why = data.get("hint", data.get("error", data.get("reason")))
    if why is None:
        return _rest(data)
    return ("timed out: " if data.get("timed_out") else "") + _text(why)


def _compensation(data: dict[str, JSONValue]) -> str:
    said = _text(data.get("kind", "?"))
    if "error" in data:
        return f"{said}: {_text(data['error'])}"
    if "description" in data:
        return f"{said}: {_text(data['description'])}"
    return said


def _rewound(data: dict[str, JSONValue]) -> str:
    undone = data.get("steps_undone")
    steps = ", ".join(map(_text, undone)) if isinstance(undone, list) else "?"
    return f"rewound to step {_text(data.get('to_step', '?'))}, undoing steps {steps}"


def _approved(data: dict[str, JSONValue]) -> str:
    said = f"approved {_text(data.get('request', '?'))}"
    if data.get("edited"):
        said += " with edited arguments"
    if data.get("expires_at"):
        said += f", until {_text(data['expires_at'])}"
    return said + (f": {_text(data['note'])}" if data.get("note") else "")


def _request(verb: str) -> Callable[[dict[str, JSONValue]], str]:
    def say(data: dict[str, JSONValue]) -> str:
        said = f"{verb} {_text(data.get('request', '?'))}"
        return said + (f": {_text(data['reason'])}" if "reason" in data else "")

    return say


def _reviewed(data: dict[str, JSONValue]) -> str:
    return f"review {_text(data.get('review', '?'))}: {_text(data.get('outcome', '?'))}"


_SAYS: Final[dict[EventKind, Callable[[dict[str, JSONValue]], str]]] = {
    EventKind.STEP_DISPATCHED: _rest,
    EventKind.STEP_FAILED: _failure,
    EventKind.FAILED: _failure,
    EventKind.RETRIED: _failure,
    EventKind.OUTCOME_UNKNOWN: _failure,
    EventKind.STEP_REWOUND: _rewound,
    EventKind.COMPENSATED: _compensation,
    EventKind.COMPENSATION_FAILED: _compensation,
    EventKind.COMPENSATION_REQUESTED: _compensation,
    EventKind.APPROVAL_REQUESTED: _request("waiting for approval"),
    EventKind.APPROVED: _approved,
    EventKind.REJECTED: _request("rejected"),
    EventKind.APPROVAL_CONSUMED: _request("consumed"),
    EventKind.APPROVAL_EXPIRED: _request("expired"),
    EventKind.REVIEW_REQUESTED: lambda d: f"waiting for review {_text(d.get('review', '?'))}",
    EventKind.REVIEWED: _reviewed,
    EventKind.CANCEL_REQUESTED: lambda d: _text(d.get("reason", "")),
    EventKind.CANCELLED: lambda d: _text(d.get("reason", "")),
}


def _cell(text: str, width: int) -> str:
    """`text` escaped (`printable`) and cut to `width`; a long text is cut before it is
    escaped too, so that a 10 MB string costs no more than a short one."""
    return cut(printable(text[: 8 * width]), width)
