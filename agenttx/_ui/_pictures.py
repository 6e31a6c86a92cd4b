"""The pictures of `agenttx ui`, from what the store returns: pure functions, SVG text out.

- `transaction_graph_svg`: a transaction's dependency graph (explicit and implicit edges),
  with the attempts a rewind undid or that failed drawn beside the attempt that replaced them,
  and the root cause of the last rewind highlighted.
- `plan_dag_svg`: a plan run's DAG, each node in its state.
- `plan_gantt_svg`: a plan run's node spans on an axis in seconds, the critical path marked.
- `critical_path`: the longest chain by duration through a DAG's edges.

Nothing here reads a clock or a store: a running span ends at the `now` given. Every text
from an agent or a tool goes to `_svg`, which escapes it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final, Protocol

from .._errors import InvalidArgument, StorageError
from .._events import EventKind
from .._graph import DependencyGraph, EdgeKind
from .._plans import NodeState, StoredNode, read_run
from .._refs import Reference, parse_template
from .._results import AttemptStatus, StepAttempt, TxStatus
from .._txlog import Ended, Restored, add_live_steps
from ._svg import Link, Node, Span, draw_gantt, draw_graph, visible

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from .._graph import Edge
    from ..stores import PlanImage

__all__ = [
    "EndedLike",
    "critical_path",
    "plan_dag_svg",
    "plan_gantt_svg",
    "transaction_graph_svg",
]

#: The longest piece of one value put in a title (the whole title is cut at 4 KiB).
_PIECE: Final = 1000
#: A node's terminal states (`NodeState.is_terminal`), as stored.
_FINISHED: Final = frozenset(state.value for state in NodeState if state.is_terminal)
_UNDONE: Final = (AttemptStatus.REWOUND, AttemptStatus.COMPENSATED)


class EndedLike(Protocol):
    """An ended transaction as `agenttx._cli._reading.read_ended_tx` gives it (`EndedFound`):
    its image as it ended and its history (None if it ended without one)."""

    @property
    def restored(self) -> Restored: ...

    @property
    def ended(self) -> Ended | None: ...


def _piece(value: object) -> str:
    """One value for a title, on one line: cut, its control characters made visible."""
    text = value if isinstance(value, str) else repr(value)[: _PIECE + 1]
    return visible(text, _PIECE)


# ---------------------------------------------------------------- a transaction's graph


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
    if isinstance(found, Restored):
        restored, ended = found, None
    else:
        restored, ended = found.restored, found.ended
    show_live = ended is None or ended.status == TxStatus.COMMITTED.value
    graph = DependencyGraph()
    if show_live:
        add_live_steps(graph, restored.steps, 1)
    live = set(graph.steps())
    attempts = () if ended is None else ended.attempts
    nodes = [_live_node(step, graph, restored) for step in sorted(live)]
    links = _live_links(graph.edges())
    keys = _attempt_keys(attempts, live)
    replacers = _replacers(attempts, keys)
    root = _root_cause_attempt(attempts, replacers, ended)
    previous = None  # the last attempt drawn in its own place (replaced by none)
    for n, attempt in enumerate(attempts):
        key, replacer = keys[n], replacers[n]
        if not key.startswith("s"):
            nodes.append(_attempt_node(n, attempt, key, replacer, root=n == root))
            if replacer is not None:
                title = f"#{attempt.step_id} {attempt.status.value}, then run again"
                links.append(
                    Link(
                        source=key,
                        target=replacer,
                        classes=("replaced",),
                        title=title,
                        layered=False,
                    )
                )
            elif previous is not None:
                links.append(
                    Link(
                        source=previous,
                        target=key,
                        classes=("order",),
                        title="run after",
                        dotted=True,
                    )
                )
        if replacer is None:
            previous = key
    caption = f"the dependency graph of transaction {restored.tx_id}"
    return draw_graph(nodes, links, kind="graph", caption=caption)


def _attempt_keys(attempts: Sequence[StepAttempt], live: set[int]) -> list[str]:
    """Each attempt's node: `s{step}` for the live attempt of a live step drawn, else
    `a{index}` (its index in the history)."""
    keys = []
    for n, attempt in enumerate(attempts):
        drawn = attempt.status is AttemptStatus.LIVE and attempt.step_id in live
        keys.append(f"s{attempt.step_id}" if drawn else f"a{n}")
    return keys


def _replacers(attempts: Sequence[StepAttempt], keys: Sequence[str]) -> list[str | None]:
    """For each attempt, the node of the next attempt of the same step, if any."""
    found: list[str | None] = [None] * len(attempts)
    later: dict[int, str] = {}
    for n in range(len(attempts) - 1, -1, -1):
        step = attempts[n].step_id
        found[n] = later.get(step)
        later[step] = keys[n]
    return found


def _live_node(step: int, graph: DependencyGraph, restored: Restored) -> Node:
    live = restored.steps[step]
    lines = [f"step {step}: {_piece(live.tool_name)}", "live"]
    if live.call_id is not None:
        lines.append(f"call id: {_piece(live.call_id)}")
    inputs = [
        f"#{e.source} {_piece(e.source_key)} -> {_piece(e.target_key)} ({e.kind.value})"
        for e in graph.dependencies_of(step)[:20]
    ]
    if inputs:
        lines.append("inputs from: " + ", ".join(inputs))
    return Node(
        key=f"s{step}",
        label=f"#{step} {live.tool_name[:64]}",
        note="live",
        title="\n".join(lines),
        classes=("live",),
        data=(("id", str(step)), ("node", f"s{step}")),
    )


def _live_links(edges: Iterable[Edge]) -> list[Link]:
    """One link per pair of steps: explicit if any of its edges is, its keys in the title."""
    keyed: dict[tuple[int, int], list[Edge]] = {}
    for edge in edges:
        keyed.setdefault((edge.source, edge.target), []).append(edge)
    links = []
    for (source, target), found in sorted(keyed.items()):
        explicit = any(e.kind is EdgeKind.EXPLICIT for e in found)
        title = ", ".join(
            f"{_piece(e.source_key)} -> {_piece(e.target_key)} ({e.kind.value})" for e in found[:20]
        )
        links.append(
            Link(
                source=f"s{source}",
                target=f"s{target}",
                classes=("explicit" if explicit else "implicit",),
                title=f"#{source} -> #{target}: {title}",
                dashed=not explicit,
            )
        )
    return links


def _attempt_node(
    n: int, attempt: StepAttempt, key: str, replacer: str | None, *, root: bool
) -> Node:
    status = attempt.status.value
    lines = [f"step {attempt.step_id}: {_piece(attempt.tool_name)}", f"attempt {n + 1}: {status}"]
    if attempt.call_id is not None:
        lines.append(f"call id: {_piece(attempt.call_id)}")
    if root:
        lines.append("the root cause of the last rewind")
    return Node(
        key=key,
        label=f"#{attempt.step_id} {attempt.tool_name[:64]}",
        note=f"{status}, root cause" if root else status,
        title="\n".join(lines),
        classes=(status, "root-cause") if root else (status,),
        data=(("id", str(attempt.step_id)), ("node", key), ("attempt", str(n))),
        beside=replacer,
    )


def _root_cause_attempt(
    attempts: Sequence[StepAttempt], replacers: Sequence[str | None], ended: Ended | None
) -> int | None:
    """The index of the attempt the last rewind undid at the step it went back to (the root
    cause of the failure that caused it), or None. The step is the last `step_rewound` audit
    event's (none if the audit has none: no rewind); in a history kept without its audit, the
    step run first after the last undone attempt (a rewind to T runs T next), if a failure
    came in between."""
    target = None
    audit = () if ended is None else ended.audit
    for event in reversed(audit):
        if event.kind is EventKind.STEP_REWOUND:
            to_step = event.data.get("to_step", event.step)
            target = to_step if isinstance(to_step, int) else event.step
            break
    if audit and target is None:
        return None
    if target is None:
        undone = [n for n, a in enumerate(attempts) if a.status in _UNDONE]
        if not undone:
            return None
        after = [a for a in attempts[undone[-1] + 1 :] if a.status is not AttemptStatus.FAILED]
        failed = any(a.status is AttemptStatus.FAILED for a in attempts[undone[-1] + 1 :])
        if not after or not failed:
            return None
        target = after[0].step_id
    found = None
    for n, attempt in enumerate(attempts):
        if attempt.step_id == target and attempt.status in _UNDONE and replacers[n] is not None:
            found = n  # undone, and run again: the last such one is the last rewind's
    return found


# ---------------------------------------------------------------- a plan run


def _plan_nodes(
    image: PlanImage,
) -> tuple[list[str], dict[str, StoredNode], dict[str, str], list[tuple[str, str]]]:
    """The run's node ids (in plan order, then any the plan does not name), their stored
    nodes, their tools, and the edges (prerequisite, node); no edges if the plan cannot be
    read. `StorageError` if the run's record is unreadable."""
    record, stored = read_run(image)
    order = [row.node_id for row in image.nodes]
    known = set(order)
    planned, tools, edges = _planned(record.get("plan"))
    first = [node_id for node_id in planned if node_id in known]
    seen = set(first)
    order = first + [node_id for node_id in order if node_id not in seen]
    return order, stored, tools, [(a, b) for a, b in edges if a in known and b in known]


def _planned(plan: object) -> tuple[list[str], dict[str, str], list[tuple[str, str]]]:
    """A stored plan's node ids in order, their tools, and each node's prerequisites as edges
    `(prerequisite, node)`: the nodes its inputs reference and those in its `after`, as
    `Plan.prerequisites` finds them (read here without validating the whole plan again, which
    costs ten times more). What cannot be read is left out."""
    nodes = plan.get("nodes") if isinstance(plan, dict) else None
    order: list[str] = []
    tools: dict[str, str] = {}
    edges: list[tuple[str, str]] = []
    for node in nodes if isinstance(nodes, list) else ():
        node_id = node.get("id") if isinstance(node, dict) else None
        if not isinstance(node_id, str) or node_id in tools:
            continue
        tool = node.get("tool")
        tools[node_id] = tool if isinstance(tool, str) else "?"
        order.append(node_id)
        needed = set(_referenced(node.get("inputs")))
        after = node.get("after")
        if isinstance(after, list):
            needed.update(name for name in after if isinstance(name, str))
        edges.extend((before, node_id) for before in sorted(needed))
    return order, tools, edges


def _referenced(value: object) -> Iterable[str]:
    """The namespaces other than `initial` that the references in `value` name (a malformed
    reference names none)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and "${" in item:
            try:
                pieces = parse_template(item, mode="plan")
            except InvalidArgument:  # a ReferenceSyntaxError among them
                continue
            for piece in pieces:
                if isinstance(piece, Reference) and piece.namespace != "initial":
                    yield piece.namespace


def _node_state(node_id: str, node: StoredNode | None, waiting: Mapping[str, str]) -> str:
    if node is None:
        return "pending"
    state = node.state if node.state in _FINISHED else waiting.get(node_id, node.state)
    return str(state).lower()


def _node_title(node_id: str, tool: str | None, node: StoredNode | None, state: str) -> str:
    lines = [f"node {_piece(node_id)}", f"state: {_piece(state)}"]
    if tool is not None:
        lines.insert(1, f"tool: {_piece(tool)}")
    if node is not None:
        fields: dict[str, Any] = node.record
        lines.append(f"tries: {_piece(fields.get('number', 0))}")
        lines.append(f"retries: {_piece(fields.get('retries', 0))}")
        if node.error:
            lines.append(f"error: {_piece(node.error)}")
    return "\n".join(lines)


def plan_dag_svg(image: PlanImage, *, waiting: Mapping[str, str] | None = None) -> str:
    """A plan run's DAG as one `<svg>` element: a `<g class="node STATE">` per node
    (`data-id` its name, STATE its stored state in lower case, or the state `waiting` gives a
    node that waits for a person, as `agenttx._cli._shown.waiting_nodes` finds them) and an
    `edge explicit` path from each prerequisite to the node. Raises `StorageError` if the
    run's record is unreadable; a plan that cannot be read is drawn without its edges."""
    order, stored, tools, edges = _plan_nodes(image)
    waiting = waiting or {}
    nodes = []
    for node_id in order:
        state = _node_state(node_id, stored.get(node_id), waiting)
        tool = tools.get(node_id)
        nodes.append(
            Node(
                key=node_id,
                label=node_id,
                note=state if tool is None else f"{state} · {tool[:64]}",
                title=_node_title(node_id, tool, stored.get(node_id), state),
                classes=(state,),
                data=(("id", node_id),),
            )
        )
    links = [Link(source=a, target=b, classes=("explicit",), title="") for a, b in edges]
    return draw_graph(nodes, links, kind="dag", caption=f"plan run {image.run_id}")


def _time(value: object) -> float | None:
    """A stored time (seconds since the epoch), or None if it is none or not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        moment = float(value)
    except OverflowError:
        return None
    return moment if math.isfinite(moment) else None


def plan_gantt_svg(
    image: PlanImage, *, now: float, waiting: Mapping[str, str] | None = None
) -> str:
    """A plan run's timeline as one `<svg>` element: a `<rect class="span STATE [critical]">`
    per node that has started (`data-id` its name), from its first start to its finish (a
    node still running: to `now`, seconds since the epoch), on an axis in seconds from the
    run's start; the spans of the critical path (`critical_path`) carry `critical`. Raises
    `StorageError` if the run's record is unreadable, or its times span more than a float
    holds; `InvalidArgument` if `now` is not a finite number."""
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise InvalidArgument(f"now must be a finite number of seconds, got {now!r:.80}")
    order, stored, tools, edges = _plan_nodes(image)
    waiting = waiting or {}
    times: dict[str, tuple[float, float]] = {}
    for node_id in order:
        node = stored.get(node_id)
        start = None if node is None else _time(node.record.get("started_at"))
        if node is None or start is None:
            continue
        end = _time(node.record.get("finished_at"))
        if end is None:
            end = now if node.state not in _FINISHED else start
        times[node_id] = (start, max(end, start))
    durations = {node_id: end - start for node_id, (start, end) in times.items()}
    critical = set(critical_path(durations, edges))
    rows = sorted(times, key=lambda node_id: times[node_id][0])  # stable: plan order on ties
    spans = []
    for node_id in rows:
        start, end = times[node_id]
        node = stored.get(node_id)
        state = _node_state(node_id, node, waiting)
        title = _node_title(node_id, tools.get(node_id), node, state)
        title += f"\n{end - start:.3f} s" + (
            ", on the critical path" if node_id in critical else ""
        )
        spans.append(
            Span(
                label=node_id,
                start=start,
                end=end,
                title=title,
                classes=(state, "critical") if node_id in critical else (state,),
                data=(("id", node_id),),
                attempts=_attempt_times(node, start, end),
            )
        )
    origin = _time(image.created_at)
    running = image.status == "RUNNING"
    try:
        return draw_gantt(
            spans,
            origin=origin,
            now_line=now if running else None,
            caption=f"the timeline of plan run {image.run_id}",
        )
    except InvalidArgument as exc:  # stored times no chart can hold
        raise StorageError(f"plan run `{visible(image.run_id, 80)}`: {exc}") from exc


def _attempt_times(
    node: StoredNode | None, start: float, end: float
) -> tuple[tuple[float, float], ...]:
    """When the node ran, as its history says (`[state, time, attempt]` entries): from each
    RUNNING entry to the next entry (or `end`), within `start` and `end`; none if the history
    cannot be read."""
    history = None if node is None else node.record.get("history")
    if not isinstance(history, list):
        return ()
    moments: list[tuple[str, float]] = []
    for entry in history[:1000]:
        if isinstance(entry, list) and len(entry) >= 2 and isinstance(entry[0], str):
            at = _time(entry[1])
            if at is not None:
                moments.append((entry[0], min(max(at, start), end)))
    found = []
    for n, (state, at) in enumerate(moments):
        if state == "RUNNING":
            until = moments[n + 1][1] if n + 1 < len(moments) else end
            found.append((at, max(until, at)))
    return tuple(found)


def critical_path(
    durations: Mapping[str, float], edges: Iterable[tuple[str, str]]
) -> tuple[str, ...]:
    """The longest chain by duration through a DAG: the nodes of the path (following `edges`,
    each `(before, after)`) whose summed `durations` is the greatest, in order; ties go to the
    path whose nodes come first in `durations`' order. A node missing from `durations` weighs
    nothing; edges naming unknown nodes are ignored. Empty for no nodes. Raises
    `InvalidArgument` if the edges make a cycle."""
    index = {node: n for n, node in enumerate(durations)}
    weight = [_weight(durations[node]) for node in durations]
    preds: list[set[int]] = [set() for _ in index]
    succs: list[set[int]] = [set() for _ in index]
    for before, after in edges:
        a, b = index.get(before), index.get(after)
        if a is None or b is None:
            continue
        if a == b:
            raise InvalidArgument(f"the edges make a cycle: {visible(before, 80)!r} follows itself")
        preds[b].add(a)
        succs[a].add(b)
    waiting = [len(p) for p in preds]
    ready = [n for n in range(len(index)) if waiting[n] == 0]
    best = [0.0] * len(index)
    via: list[int | None] = [None] * len(index)
    done = 0
    while ready:
        n = ready.pop()
        done += 1
        chosen = min(preds[n], key=lambda p: (-best[p], p), default=None)
        via[n] = chosen
        best[n] = weight[n] + (best[chosen] if chosen is not None else 0.0)
        for s in sorted(succs[n]):
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    if done < len(index):
        raise InvalidArgument("the edges make a cycle")
    if not index:
        return ()
    names = list(durations)
    at: int | None = min(range(len(index)), key=lambda n: (-best[n], n))
    path = []
    while at is not None:
        path.append(names[at])
        at = via[at]
    return tuple(reversed(path))


def _weight(duration: float) -> float:
    """A duration as a weight: negative and non-finite ones (NaN, infinities) weigh nothing."""
    return duration if math.isfinite(duration) and duration > 0 else 0.0
