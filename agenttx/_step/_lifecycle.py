"""The named states of one tool-call attempt and the transitions between them.

Every attempt, a transaction's step or a plan's node, goes through the same states::

    PREPARED --> GATED --> RUNNING --> SETTLED ---------------> RECORDED --> COMPENSATED
                   |          |   \\--> ORPHANED --> SETTLED        ^
                   |          |             \\----> UNKNOWN -------/ (status check or review)
                   \\--> WAITING (a person decides; the same call is sent again)

`PREPARED`: references resolved, JSON and limits checked, arguments validated against the
tool's schema. `GATED`: the approval gate let it through (its approval consumed, or none
needed). `RUNNING`: the tool runs under its deadline with a fenced context. `SETTLED`: its
outcome is known (success, or a classified failure). `ORPHANED`: its deadline passed while its
tool still ran; its undo records wait until it returns. `UNKNOWN`: the call may or may not have
happened; the status check (asked only once the call has returned) or a person decides.
`RECORDED`: the outcome is durable, with its audit event. `COMPENSATED`: a rewind, a failed
plan or an abort ran its undo records. `WAITING`: the attempt ended waiting for a person.

The table is checked by `Lifecycle.advance`, which the step core calls at each transition, so
a flow that skips a state (a status check asked while the call runs, say) fails loudly in
tests instead of silently in production.
"""

from __future__ import annotations

import enum
from typing import Final

from .._errors import IllegalTransition

__all__ = ["TRANSITIONS", "Lifecycle", "Phase"]


class Phase(enum.Enum):
    """A state of one tool-call attempt (see the module's diagram)."""

    PREPARED = "prepared"
    GATED = "gated"
    WAITING = "waiting"
    RUNNING = "running"
    ORPHANED = "orphaned"
    UNKNOWN = "unknown"
    SETTLED = "settled"
    RECORDED = "recorded"
    COMPENSATED = "compensated"


#: The legal transitions, from each state.
TRANSITIONS: Final[dict[Phase, frozenset[Phase]]] = {
    Phase.PREPARED: frozenset({Phase.GATED, Phase.SETTLED}),  # SETTLED: refused before running
    Phase.GATED: frozenset({Phase.RUNNING, Phase.WAITING, Phase.SETTLED, Phase.UNKNOWN}),
    Phase.WAITING: frozenset(),
    Phase.RUNNING: frozenset({Phase.SETTLED, Phase.ORPHANED}),
    Phase.ORPHANED: frozenset({Phase.SETTLED, Phase.UNKNOWN, Phase.WAITING}),
    Phase.UNKNOWN: frozenset({Phase.SETTLED, Phase.RUNNING, Phase.WAITING}),
    Phase.SETTLED: frozenset({Phase.RECORDED, Phase.COMPENSATED}),
    Phase.RECORDED: frozenset({Phase.COMPENSATED}),
    Phase.COMPENSATED: frozenset(),
}


class Lifecycle:
    """The state of one attempt, moved only along `TRANSITIONS`; `trail` is its history."""

    __slots__ = ("phase", "trail")

    def __init__(self) -> None:
        self.phase = Phase.PREPARED
        self.trail: list[Phase] = [Phase.PREPARED]

    def advance(self, target: Phase) -> None:
        """Move to `target`; `IllegalTransition` if the table does not allow it."""
        if target not in TRANSITIONS[self.phase]:
            raise IllegalTransition(source=self.phase.value, target=target.value)
        self.phase = target
        self.trail.append(target)
