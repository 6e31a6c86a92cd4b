"""Steps, references and rewinds: the lineage agenttx itself knows, added to the value lineage.

A transcript driven by agenttx holds `${steps.N.path}` references where a plain agent would
copy values, and tool results that say which step each call was (`StepResult.for_model()`).
`StepTracker` replays agenttx's step numbering over the calls in the order they were sent and
finds which call each reference names, and which calls a rewind voided; `with_references` adds
that to a recorder's `LineageGraph`. The rules are in docs/lineage.md#references-and-rewinds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple, TypeGuard, final

import attrs

from .._refs import Dependency, named_dependencies
from ._recorder import LineageEdge, LineageGraph

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Explicit", "StepPayload", "StepTracker", "step_payload", "with_references"]


@final
class StepPayload(NamedTuple):
    """A tool result that is an agenttx step payload: what the step numbering needs of it.

    `step` is None for a call that was not sent as a step (not run, refused before it ran, or
    sent after the transaction ended). `voided` is set when the result itself says the call was
    voided (an integration's `history="void"` rewrite). `result` is what the call produced: the
    `output` when `ok`, else the `error`.
    """

    ok: bool
    step: int | None
    next_step: int | None
    voided_steps: tuple[int, ...]
    result: object
    voided: bool = False


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def step_payload(content: object) -> StepPayload | None:
    """`content` read as a step payload (`StepResult.for_model()`), or None if it is not one.

    A payload is a mapping with a bool `ok` and a `step` that is an int >= 1 (the call was that
    step) or 0 or null (it was not sent as a step); a mapping with a bool `ok` and `voided`
    true is one too, with or without a step. A tool output that merely has a `step` key is not
    one. `next_step` counts when it is an int, `voided_steps` when it is a list (its int
    entries); other keys are ignored. Never raises.
    """
    if not isinstance(content, Mapping):
        return None
    ok = content.get("ok")
    if not isinstance(ok, bool):
        return None
    voided = content.get("voided") is True
    step = content.get("step")
    if _is_int(step) and step >= 0:
        number = step or None
    elif step is None and ("step" in content or voided):
        number = None
    else:
        return None
    next_step = content.get("next_step")
    voided_steps = content.get("voided_steps")
    return StepPayload(
        ok=ok,
        step=number,
        next_step=next_step if _is_int(next_step) else None,
        voided_steps=tuple(n for n in voided_steps if _is_int(n))
        if isinstance(voided_steps, list)
        else (),
        result=content.get("output" if ok else "error"),
        voided=voided,
    )


@final
class Explicit(NamedTuple):
    """A reference found in the arguments of call `target` to the step call `source` was."""

    source: int
    target: int
    text: str
    dependency: Dependency


@final
class StepTracker:
    """agenttx's step numbering, replayed over tool calls in the order they were sent.

    Call `call` once per tool call, in order, with the call's node index, its arguments and its
    result's `StepPayload` (None when the result is not one, or there is none). Then
    `with_references(graph, tracker.explicit, tracker.steps, tracker.voided)`.

    The rules (docs/lineage.md#references-and-rewinds): a call's step is its payload's `step`,
    else the next step by counting (1 at first; after a payload its `next_step`, else one past
    its step if it succeeded or was voided and the same step if not; after a call without a
    payload, one past it). A call whose payload claims no step was not run: it names nothing,
    produces nothing and voids nothing. Sending step N voids every call that was a step >= N
    (agenttx accepts step N only once those are gone); a payload's `voided_steps` voids the
    calls that were those steps, and a payload marked `voided` voids its own call. A call with
    a successful payload, or without a payload, becomes its step's producer. Each
    `${steps.N...}` in the arguments of a call sent as step S, with N < S, names the current
    producer of step N, if there is one. Cost: linear in the calls, references and voided
    steps, amortized; memory: one entry per call.
    """

    __slots__ = ("_live", "_next", "_order", "explicit", "steps", "voided")

    def __init__(self) -> None:
        self._next = 1
        self._live: dict[int, int] = {}  # step -> the index of the call that produced it
        # (step, index) in ascending step order, to void the steps >= N from the end; entries
        # of calls voided by `voided_steps` stay behind and are skipped when met.
        self._order: list[tuple[int, int]] = []
        self.explicit: list[Explicit] = []
        self.steps: dict[int, int] = {}  # call index -> step, for calls with a payload
        self.voided: set[int] = set()

    def call(self, index: int, arguments: object, payload: StepPayload | None) -> None:
        """Account for call `index`: the references it made, then what its result said."""
        if payload is None:
            counted = self._next
            self._name(index, counted, arguments)
            self._produce(counted, index)
            self._next = counted + 1
            return
        step = payload.step
        if step is not None:
            self._name(index, step, arguments)
            self.steps[index] = step
        for voided_step in payload.voided_steps:
            gone = self._live.pop(voided_step, None)
            if gone is not None:
                self.voided.add(gone)
        if payload.voided:
            self.voided.add(index)
        elif payload.ok and step is not None:
            self._produce(step, index)
        if payload.next_step is not None:
            self._next = max(payload.next_step, 1)  # 0: aborted, and any later call starts over
        elif step is not None:
            self._next = step + 1 if payload.ok or payload.voided else step

    def _name(self, index: int, step: int, arguments: object) -> None:
        """Call `index` is sent as `step`: what it replaces is voided, what it names is linked."""
        self._void_from(step)
        for reference, dependency in named_dependencies(arguments):
            source = self._live.get(dependency.from_step)
            if source is not None and dependency.from_step < step:
                self.explicit.append(Explicit(source, index, reference.text, dependency))

    def _produce(self, step: int, index: int) -> None:
        self._void_from(step)
        self._live[step] = index
        self._order.append((step, index))

    def _void_from(self, step: int) -> None:
        order = self._order
        while order and order[-1][0] >= step:
            gone_step, gone = order.pop()
            if self._live.get(gone_step) == gone:
                del self._live[gone_step]
                self.voided.add(gone)


def with_references(
    graph: LineageGraph,
    explicit: Sequence[Explicit],
    steps: Mapping[int, int],
    voided: Iterable[int],
) -> LineageGraph:
    """`graph` with step numbers, voided calls and explicit edges (all by node index).

    Nodes get their `step` and `voided`; every edge with a voided end is left out; each
    consumer's explicit edges come before its value edges, in reference order, without repeats
    (the same source, keys and reference text). With nothing to add, `graph` itself.
    """
    gone = frozenset(voided)
    if not explicit and not steps and not gone:
        return graph
    nodes = tuple(
        attrs.evolve(node, step=steps.get(node.index), voided=node.index in gone)
        if node.index in steps or node.index in gone
        else node
        for node in graph.nodes
    )
    by_target: dict[int, list[LineageEdge]] = {}
    seen: set[tuple[int, int, str, str, str]] = set()
    for found in explicit:
        if found.source in gone or found.target in gone:
            continue
        dependency = found.dependency
        key = (found.source, found.target, dependency.source_key, dependency.target_key, found.text)
        if key in seen:
            continue
        seen.add(key)
        by_target.setdefault(found.target, []).append(
            LineageEdge(
                source=nodes[found.source],
                target=nodes[found.target],
                value=found.text,
                explicit=True,
                source_key=dependency.source_key,
                target_key=dependency.target_key,
            )
        )
    for edge in graph.edges:
        source, target = nodes[edge.source.index], nodes[edge.target.index]
        if source.voided or target.voided:
            continue
        moved = source is not edge.source or target is not edge.target
        kept = attrs.evolve(edge, source=source, target=target) if moved else edge
        by_target.setdefault(target.index, []).append(kept)
    edges = [edge for target in sorted(by_target) for edge in by_target[target]]
    return LineageGraph(nodes=nodes, edges=tuple(edges), evidence=graph.evidence)
