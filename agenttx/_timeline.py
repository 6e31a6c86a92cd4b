"""A transaction's timeline: its live steps and everything that is truncated with them.

The live steps (succeeded, not rewound), their outputs, the effects they staged, the step
history, the dependency graph, the step being executed and the next step id change together:
a step appends to all of them, a rewind truncates all of them, an abort clears them. Keeping
them in one object with `append`, `truncate` and `clear` means no rewind path can forget one.
The timeline does no I/O: the transaction decides when to call it and writes the durable log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from ._graph import DependencyGraph
from ._history import StepHistory
from ._txlog import LiveStep, add_live_steps

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._json import JSONValue
    from ._refs import Dependency
    from ._results import Voided
    from ._tools import Outcome, StagedEffect
    from ._txlog import Restored

__all__ = ["Pending", "Timeline"]


class Pending(NamedTuple):
    """The step being executed, as far as it got: added to the graph if it fails."""

    step_id: int
    tool_name: str
    inputs: JSONValue
    dependencies: tuple[Dependency, ...]


class Timeline:
    """The live-step state of one transaction; its owner serializes every call.

    `rewinds` counts the failure decisions, rewinds and aborts so far: an attempt's undo
    records are numbered from it, so no two attempts of a step share one. `generation` is part
    of every idempotency key: it goes up only when a rewind compensated or dropped something
    (docs/protocol.md#idempotency-keys), so a step sent again after such a rewind gets a key of
    its own, and a timeout or transient retry that undid nothing keeps its key. The graph is
    brought up to date only when it is needed (`graph()`): successful steps only record their
    dependencies, so a transaction that never fails never pays for it. `call_id` is the call
    id of the step being executed (None if it has none); `call_ids` maps the call id of each
    live step of the current turn to it (`used`; a call id is unique within a turn only:
    docs/protocol.md#call-ids-and-turns), and `turn` is the turn those ids were sent in.
    `dropped` is what the last truncation (a rewind or an abort) dropped: the live steps and
    their call ids.
    """

    __slots__ = (
        "_graph",
        "_graph_upto",
        "call_id",
        "call_ids",
        "dropped",
        "effects",
        "generation",
        "history",
        "next_step",
        "outputs",
        "pending",
        "rewinds",
        "sizes",
        "steps",
        "turn",
        "undid",
    )

    def __init__(self) -> None:
        self.steps: dict[int, LiveStep] = {}
        self.outputs: dict[int, JSONValue] = {}
        self.sizes: dict[int, int] = {}  # a size bound of each output, when known
        self.effects: list[StagedEffect] = []  # staged by live steps (and the one running)
        self.history = StepHistory()
        self.pending: Pending | None = None
        self.call_id: str | None = None
        self.call_ids: dict[str, int] = {}
        self.turn = -1  # the turn `call_ids` were sent in (`Calls.turns`)
        self.dropped: Voided = ((), ())
        self.next_step = 1
        self.rewinds = 0
        self.generation = 0
        self.undid = False  # the rewind under way compensated or dropped something
        self._graph: DependencyGraph | None = None  # made when first needed (`graph()`)
        self._graph_upto = 0  # the last live step already in the graph

    def adopt(self, restored: Restored) -> None:
        """Take over the live steps of a transaction read back from its durable log."""
        progress = restored.progress
        self.steps = dict(restored.steps)
        self.outputs = {step_id: step.output for step_id, step in self.steps.items()}
        self.effects = [e for e in restored.effects if e.step_id < progress.next_step]
        self.next_step = progress.next_step
        self.rewinds = progress.rewinds
        self.generation = progress.keys
        undone = {undo.step_id for undo in restored.undos}
        for step_id, step in sorted(self.steps.items()):
            self.history.succeeded(
                step_id, step.tool_name, had_undos=step_id in undone, call_id=step.call_id
            )

    def used(self, call_id: str, turn: int) -> int | None:
        """The live step sent in turn `turn` (`Calls.turns`) with call id `call_id`, or None.

        The call ids of an earlier turn are forgotten when a later turn first asks: a later
        turn may send a call id again once the turn that sent it is over.
        """
        if turn != self.turn:
            self.turn = turn
            self.call_ids.clear()
            return None
        return self.call_ids.get(call_id)

    def stage(self, effects: Iterable[StagedEffect]) -> None:
        """Keep effects staged by the running step (a rewind of it drops them)."""
        self.effects.extend(effects)

    def append(self, step_id: int, step: LiveStep, outcome: Outcome) -> None:
        """Step `step_id` succeeded: it is live, and the next step follows it."""
        self.steps[step_id] = step
        self.outputs[step_id] = step.output
        self.sizes[step_id] = outcome.size
        call_id = step.call_id
        self.history.succeeded(
            step_id, step.tool_name, had_undos=bool(outcome.undos), call_id=call_id
        )
        if call_id is not None:
            self.call_ids[call_id] = step_id
        self.pending = None
        self.next_step = step_id + 1

    def failed(self) -> None:
        """The pending step failed: add its node to the graph (for the root-cause walk)."""
        graph = self.graph()
        if self.pending is not None:
            step_id, tool_name, inputs, dependencies = self.pending
            graph.add_step(step_id, tool_name, inputs, dependencies, validate=False)
            self.history.failed(step_id, tool_name, self.call_id)
            self.pending = None

    def truncate(self, target: int) -> None:
        """Drop the steps >= `target` with their effects and graph nodes; `target` runs next."""
        first = max(target, 1)
        self.effects = [effect for effect in self.effects if effect.step_id < first]
        gone = sorted(s for s in self.steps if s >= first)
        ids = (self.steps[s].call_id for s in gone)
        self.dropped = (tuple(gone), tuple(c for c in ids if c is not None))
        for step in gone:
            del self.steps[step]
            del self.outputs[step]
            self.sizes.pop(step, None)
        if self.call_ids:
            self.call_ids = {c: s for c, s in self.call_ids.items() if s < first}
        self.history.undo_from(first)
        if self._graph is not None:
            self._graph.truncate_from(first)
        self._graph_upto = min(self._graph_upto, first - 1)
        self.pending = None
        self.next_step = first

    def drops(self, target: int) -> bool:
        """Whether a rewind to `target` drops a live step or a staged effect (the failed
        step's own effects included: they are staged before it is recorded)."""
        return any(step >= target for step in self.steps) or any(
            effect.step_id >= target for effect in self.effects
        )

    def clear(self) -> None:
        """Drop every step (an abort): no step runs next."""
        self.truncate(1)
        if self._graph is not None:
            self._graph.clear()
        self.next_step = 0

    def graph(self) -> DependencyGraph:
        """The dependency graph, with the live steps added since it was last needed (made on
        the first call: a transaction that never fails or asks never builds one)."""
        graph = self._graph
        if graph is None:
            graph = self._graph = DependencyGraph()
        add_live_steps(graph, self.steps, self._graph_upto + 1)
        self._graph_upto = max(self._graph_upto, self.next_step - 1)
        return graph
