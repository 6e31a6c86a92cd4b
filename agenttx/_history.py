"""A transaction's step history: every step executed, and what became of it.

The dependency graph holds only the live steps; the history also remembers the attempts that
failed or were undone, so that an export can show them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ._render import DrawnNode, render_graph
from ._results import AttemptStatus, StepAttempt

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._graph import DependencyGraph
    from ._json import JSONValue

__all__ = ["StepHistory"]


class _Attempt:
    """One execution of a step, as the history keeps it; `status` changes on a rewind."""

    __slots__ = ("call_id", "had_undos", "status", "step_id", "tool_name")

    def __init__(
        self,
        step_id: int,
        tool_name: str,
        status: AttemptStatus,
        *,
        had_undos: bool,
        call_id: str | None = None,
    ) -> None:
        self.step_id = step_id
        self.tool_name = tool_name
        self.status = status
        self.had_undos = had_undos
        self.call_id = call_id


class StepHistory:
    """Every attempt in order, and the live one of each step (the transaction serializes calls)."""

    __slots__ = ("_attempts", "_live")

    def __init__(self) -> None:
        self._attempts: list[_Attempt] = []
        self._live: dict[int, _Attempt] = {}

    @classmethod
    def of(cls, attempts: Iterable[StepAttempt]) -> StepHistory:
        """The history of `attempts` (as `attempts()` gave them), to export it again: that of
        an ended transaction, read back from its store."""
        history = cls()
        for a in attempts:
            compensated = a.status is AttemptStatus.COMPENSATED
            attempt = _Attempt(
                a.step_id, a.tool_name, a.status, had_undos=compensated, call_id=a.call_id
            )
            history._attempts.append(attempt)
            if a.status is AttemptStatus.LIVE:
                history._live[a.step_id] = attempt
        return history

    def succeeded(
        self, step_id: int, tool_name: str, *, had_undos: bool, call_id: str | None = None
    ) -> None:
        """Step `step_id` succeeded: it is live until a rewind undoes it."""
        attempt = _Attempt(
            step_id, tool_name, AttemptStatus.LIVE, had_undos=had_undos, call_id=call_id
        )
        self._attempts.append(attempt)
        self._live[step_id] = attempt

    def failed(self, step_id: int, tool_name: str, call_id: str | None = None) -> None:
        """Step `step_id` failed."""
        attempt = _Attempt(
            step_id, tool_name, AttemptStatus.FAILED, had_undos=False, call_id=call_id
        )
        self._attempts.append(attempt)

    def undo_from(self, target: int) -> None:
        """Mark the live steps >= `target` as undone in the history."""
        for step in [s for s in self._live if s >= target]:
            attempt = self._live.pop(step)
            attempt.status = (
                AttemptStatus.COMPENSATED if attempt.had_undos else AttemptStatus.REWOUND
            )

    def attempts(self) -> tuple[StepAttempt, ...]:
        """The attempts, oldest first."""
        return tuple(
            StepAttempt(
                step_id=a.step_id, tool_name=a.tool_name, status=a.status, call_id=a.call_id
            )
            for a in self._attempts
        )

    def rows(self) -> list[JSONValue]:
        """The attempts as `[step_id, tool_name, status value]` (then the call id, if any),
        oldest first: `attempts()` without building objects, for the history a transaction
        writes when it ends."""
        return [
            [a.step_id, a.tool_name, a.status.value]
            if a.call_id is None
            else [a.step_id, a.tool_name, a.status.value, a.call_id]
            for a in self._attempts
        ]

    def export(self, graph: DependencyGraph, fmt: str) -> str:
        """`graph` (the live steps) with the undone attempts as extra, marked nodes."""
        attempts = [
            (n, a) for n, a in enumerate(self._attempts) if a.status is not AttemptStatus.LIVE
        ]
        if fmt == "json":
            return _graph_json(graph, attempts)
        nodes, edges = graph._drawing()  # noqa: SLF001  (one drawing for every export)
        nodes.extend(
            DrawnNode(f"a{n}", f"{a.step_id}: {a.tool_name}", a.status.value) for n, a in attempts
        )
        return render_graph(nodes, edges, fmt)


def _graph_json(graph: DependencyGraph, attempts: list[tuple[int, _Attempt]]) -> str:
    document = json.loads(graph.to_json())
    for node in document["nodes"]:
        node["id"], node["status"] = f"s{node['step']}", AttemptStatus.LIVE.value
    document["nodes"].extend(
        {"id": f"a{n}", "step": a.step_id, "tool": a.tool_name, "status": a.status.value}
        for n, a in attempts
    )
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
