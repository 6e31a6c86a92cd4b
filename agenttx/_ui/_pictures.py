"""The pictures of `agenttx ui`, from what the store returns: pure functions, SVG text out.

- `transaction_graph_svg`: a transaction's dependency graph (explicit and implicit edges),
  with the attempts a rewind undid or that failed drawn beside the attempt that replaced them,
  and the root cause of the last rewind highlighted.
- `plan_dag_svg`: a plan run's DAG, each node in its state.
- `plan_gantt_svg`: a plan run's node spans on an axis in seconds, the critical path marked.
- `critical_path`: the longest chain by duration through a DAG's edges.

Nothing here reads a clock or a store: a running span ends at the `now` given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from .._txlog import Ended, Restored
    from ..stores import PlanImage

__all__ = [
    "EndedLike",
    "critical_path",
    "plan_dag_svg",
    "plan_gantt_svg",
    "transaction_graph_svg",
]

_EMPTY = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10" width="10" height="10"></svg>'


class EndedLike(Protocol):
    """An ended transaction as `agenttx._cli._reading.read_ended_tx` gives it (`EndedFound`):
    its image as it ended and its history (None if it ended without one)."""

    @property
    def restored(self) -> Restored: ...

    @property
    def ended(self) -> Ended | None: ...


def transaction_graph_svg(found: Restored | EndedLike) -> str:
    """A transaction's dependency graph as one `<svg>` element.

    `found` is what `read_tx` returns: a `Restored` (an open transaction: its live steps and
    their edges) or an `EndedFound` (an ended one: its live steps if it committed, and every
    attempt its history keeps). Each attempt shown is a `<g class="node STATE ...">` with
    `data-id` its step number: live steps with their explicit and implicit edges; a failed,
    rewound or compensated attempt beside the attempt of the same step that replaced it,
    linked by a `replaced` edge (or, replaced by none, after the attempt run before it, linked
    by an `order` edge); the attempt the last rewind went back to carries `root-cause`.
    """
    del found
    return _EMPTY


def plan_dag_svg(image: PlanImage, *, waiting: Mapping[str, str] | None = None) -> str:
    """A plan run's DAG as one `<svg>` element: a `<g class="node STATE">` per node
    (`data-id` its name, STATE its stored state in lower case, or the state `waiting` gives a
    node that waits for a person, as `agenttx._cli._shown.waiting_nodes` finds them) and an
    `edge explicit` path from each prerequisite to the node. Raises `StorageError` if the
    run's record is unreadable; a plan that cannot be read is drawn without its edges."""
    del image, waiting
    return _EMPTY


def plan_gantt_svg(
    image: PlanImage, *, now: float, waiting: Mapping[str, str] | None = None
) -> str:
    """A plan run's timeline as one `<svg>` element: a `<rect class="span STATE [critical]">`
    per node that has started (`data-id` its name), from its first start to its finish (a
    node still running: to `now`, seconds since the epoch), on an axis in seconds from the
    run's start; the spans of the critical path (`critical_path`) carry `critical`. Raises
    `StorageError` if the run's record is unreadable."""
    del image, now, waiting
    return _EMPTY


def critical_path(
    durations: Mapping[str, float], edges: Iterable[tuple[str, str]]
) -> tuple[str, ...]:
    """The longest chain by duration through a DAG: the nodes of the path (following `edges`,
    each `(before, after)`) whose summed `durations` is the greatest, in order; ties go to the
    path whose nodes come first in `durations`' order. A node missing from `durations` weighs
    nothing; edges naming unknown nodes are ignored. Empty for no nodes. Raises
    `InvalidArgument` if the edges make a cycle."""
    del durations, edges
    return ()
