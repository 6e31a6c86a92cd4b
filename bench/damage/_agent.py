"""The scripted agents: the task's ground truth, and one that makes the mistakes models make.

The mistakes are those agenttx's recovery is built for (docs/protocol.md#mistakes and
#repeated-failures): a wrong argument (a literal the tool rejects), a bad id (a reference to
something that does not exist, as an id copied from the wrong earlier output is), and a repeated
failing call (the same rejected call sent a second time before the right one). Each is made at
one call of the task, drawn with the same seed as the faults, among the calls where the tool
rejects it: `find_mistakes` tries each candidate on a copy of the environment during the
fault-free probe, so a mistake never has an effect of its own; the damage it can do is what
each loop does about it.

The agent reads each tool result as a model would: after a rejected mistake it sends the next
of its attempts for that call (the correct one, or for a repeated mistake the same one again),
whatever the loop told it; only the order of the steps comes from the loop (agenttx's
`next_step_id` after a resend, a rewind or an abort).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

Call = tuple[str, dict[str, Any]]
MISTAKES = ("wrong_argument", "bad_id", "repeated_mistake")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")
# Arguments that name a record of the world: a wrong value there is a bad reference.
_REFERENCES = frozenset(
    {
        "id",
        "recipient",
        "recipients",
        "channel",
        "user",
        "hotel",
        "restaurant",
        "company",
        "participants",
        "hotel_names",
        "restaurant_names",
        "company_name",
        "url",
    }
)


@dataclass(frozen=True)
class Script:
    """The agent of one episode: per logical call, the arguments it sends, in order.

    `mistakes[call]` are the wrong arguments sent first; the call's own arguments come last and
    are sent from then on (after a rewind too).
    """

    calls: list[Call]
    mistakes: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def args(self, call: int, sent: int) -> dict[str, Any]:
        """The arguments of `call` the `sent`-th time it is sent (0 the first time)."""
        attempts = [*self.mistakes.get(call, []), self.calls[call][1]]
        return attempts[min(sent, len(attempts) - 1)]

    def is_mistake(self, call: int, sent: int) -> bool:
        """Whether the `sent`-th send of `call` is one of the mistakes."""
        return sent < len(self.mistakes.get(call, []))


def _wrong_arguments(args: dict[str, Any]) -> list[dict[str, Any]]:
    """Arguments with one literal a model gets wrong: a number as words, a date as a phrase,
    null for a required string, a bare string for a list."""
    out = []
    for key, value in args.items():
        wrong: Any
        if isinstance(value, (bool, dict)):
            continue
        if isinstance(value, (int, float)):
            wrong = f"about {value}"
        elif isinstance(value, str) and _DATE.match(value):
            wrong = "next Friday"
        elif isinstance(value, str):
            wrong = None
        elif isinstance(value, list) and value and isinstance(value[0], str):
            wrong = value[0]
        else:
            continue
        out.append({**args, key: wrong})
    return out


def _stale(value: Any) -> Any:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value + 1000
    if isinstance(value, str) and value.isdigit():
        return str(int(value) + 1000)
    if isinstance(value, str):
        return f"{value}-2"
    if isinstance(value, list) and value:
        return [_stale(value[0]), *value[1:]]
    return None


def _bad_ids(args: dict[str, Any]) -> list[dict[str, Any]]:
    """Arguments with one reference to a record that does not exist (an id off by a stale
    lookup, a name with a suffix)."""
    out = []
    for key, value in args.items():
        if key in _REFERENCES or key.endswith("_id"):
            bad = _stale(value)
            if bad is not None and bad != value:
                out.append({**args, key: bad})
    return out


def find_mistakes(runtime: Any, env: Any, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """For a call about to run on `env`: the first wrong argument and the first bad id the
    tool rejects without changing anything (tried on copies), by mistake kind."""
    found: dict[str, Any] = {}
    before = env.model_dump(mode="json")
    for kind, candidates in (("wrong_argument", _wrong_arguments), ("bad_id", _bad_ids)):
        for wrong in candidates(args):
            trial = copy.deepcopy(env)
            _, error = runtime.run_function(trial, name, wrong)
            if error is not None and trial.model_dump(mode="json") == before:
                found[kind] = wrong
                break
    if "wrong_argument" in found:
        found["repeated_mistake"] = found["wrong_argument"]
    return found


def script_for(calls: list[Call], kind: str, call: int, wrong: dict[str, Any] | None) -> Script:
    """The agent of an episode: the ground truth, or `kind` made at `call` with `wrong`."""
    if kind not in MISTAKES or wrong is None:
        return Script(calls)
    times = 2 if kind == "repeated_mistake" else 1
    return Script(calls, {call: [wrong] * times})
