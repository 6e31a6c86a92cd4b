"""What the page of one transaction and of one plan run show: steps, graph, timeline,
compensations, staged effects and the rewind preview; a plan run's nodes, DAG, Gantt chart
and totals. Read through the command line's readers (`_views`), pictures drawn by
`_pictures`; every value `Shown`."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from .._approvals import APPROVAL, REVIEW, requests_for
from .._cli import (
    WAIT,
    EndedFound,
    patiently,
    shown_status,
    uk_time,
    unfinished_prerequisites,
    waiting_nodes,
)
from .._errors import AgentTxError, TransactionNotFound
from .._events import EventKind
from .._plans import NodeState, read_run
from .._preview import preview_rollback
from .._results import AttemptStatus, TxStatus
from ._pictures import plan_dag_svg, plan_gantt_svg, transaction_graph_svg
from ._values import Shown, shown_json, shown_text
from ._views import (
    MAX_ROWS,
    PageMissing,
    StepRow,
    edge_lines,
    ended_status,
    read_transaction,
    step_rows,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from .._cli import CliStore

__all__ = ["PlanPage", "TransactionPage", "plan_page", "transaction_page"]

#: A plan run's nodes that have not finished are drawn with these states.
_FINISHED: Final = frozenset(state.value for state in NodeState if state.is_terminal)


@final
@attrs.frozen(kw_only=True)
class Line:
    """One entry of a list on a page: a few words and an optional value."""

    text: Shown
    value: Shown | None = None


@final
@attrs.frozen(kw_only=True)
class Preview:
    """What a rollback to `to_step` would do (0: an abort), worked out without doing it."""

    to_step: int
    void: tuple[Line, ...]
    compensate: tuple[Line, ...]
    drop: tuple[Line, ...]
    irreversible: tuple[Line, ...]
    said: Shown


@final
@attrs.frozen(kw_only=True)
class TransactionPage:
    """A transaction's page: `open` while it runs (the page refreshes then)."""

    id: Shown
    raw_id: str
    agent: Shown
    status: str
    open: bool
    steps: tuple[StepRow, ...]
    edges: tuple[str, ...]
    graph: str
    timeline: tuple[Line, ...]
    compensations: tuple[Line, ...]
    staged: tuple[Line, ...]
    waiting: tuple[Line, ...]
    targets: tuple[int, ...]
    preview: Preview | None
    preview_error: str | None
    constraints: tuple[Shown, ...]
    first: int = 1
    next_first: int | None = None
    step_count: int = 0


def _t(text: str, limit: int = 400) -> Shown:
    return shown_text(text, limit=limit)


def transaction_page(
    store: CliStore, tx_id: str, *, to: int | None = None, first: int = 1
) -> TransactionPage:
    """The page of transaction `tx_id`, open or ended; `to`: the rewind preview to show (open
    transactions only); `first`: the first step its table shows (at most `MAX_ROWS` steps;
    the timeline, compensations and staged effects are cut to as many, and the graph is drawn
    up to `MAX_DRAWN` steps and attempts). `PageMissing` if the store has no such
    transaction."""
    found = read_transaction(store, tx_id)
    restored = found.restored if isinstance(found, EndedFound) else found
    attempts = 0
    if isinstance(found, EndedFound) and found.ended is not None:
        attempts = len(found.ended.attempts)
    size = len(restored.steps) + attempts
    graph = transaction_graph_svg(found) if size <= MAX_DRAWN else _undrawn(size)
    waiting = _waiting_lines(store, tx_id)
    if isinstance(found, EndedFound):
        return _paged(_ended_page(found, graph, waiting, first), restored, first)
    progress = restored.progress
    timeline = tuple(
        Line(text=_t(f"step {step_id}. {step.tool_name}: live"))
        for step_id, step in sorted(restored.steps.items())[:MAX_ROWS]
    )
    compensations = tuple(
        Line(
            text=_t(f"step {undo.step_id}.{undo.seq} {undo.kind}: {undo.description}"),
            value=shown_json(undo.payload),
        )
        for undo in restored.undos[:MAX_ROWS]
    )
    preview, error = None, None
    targets = (0, *sorted(restored.steps))
    if to is not None:
        try:
            preview = _preview(restored, to)
        except AgentTxError as exc:
            error = str(exc)
    page = TransactionPage(
        id=_t(restored.tx_id, 200),
        raw_id=restored.tx_id,
        agent=_t(restored.agent_id or "-", 200),
        status="WAITING_APPROVAL" if waiting else "OPEN",
        open=True,
        steps=step_rows(restored, AttemptStatus.LIVE.value, first=first),
        edges=edge_lines(restored),
        graph=graph,
        timeline=timeline,
        compensations=compensations,
        staged=_staged(restored),
        waiting=waiting,
        targets=targets,
        preview=preview,
        preview_error=error,
        constraints=tuple(_t(text) for text in progress.constraints),
    )
    return _paged(page, restored, first)


#: The most boxes (steps and attempts) the transaction graph draws; past it the page says so.
MAX_DRAWN: Final = 1_000


def _undrawn(size: int) -> str:
    """The picture of a transaction too large to draw (one `<svg>`, as the page expects)."""
    said = f"{size} steps and attempts: too many to draw here; the tables list them"
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" class="picture graph" viewBox="0 0 640 24" '
        f'width="640" height="24"><text x="4" y="16">{said}</text></svg>'
    )


def _paged(page: TransactionPage, restored: Any, first: int) -> TransactionPage:
    """`page` with where its steps start, the next page's first step, and how many."""
    later = sorted(step_id for step_id in restored.steps if step_id >= first)
    return attrs.evolve(
        page,
        first=first,
        next_first=later[MAX_ROWS] if len(later) > MAX_ROWS else None,
        step_count=len(restored.steps),
    )


def _staged(restored: Any) -> tuple[Line, ...]:
    return tuple(
        Line(
            text=_t(f"step {effect.step_id} {effect.channel} (key {effect.idempotency_key})"),
            value=shown_json(effect.payload),
        )
        for effect in restored.effects[:MAX_ROWS]
    )


def _ended_page(
    found: EndedFound, graph: str, waiting: tuple[Line, ...], first: int
) -> TransactionPage:
    restored, ended = found.restored, found.ended
    status = ended_status(found)
    committed = status == TxStatus.COMMITTED.value
    attempts = () if ended is None else ended.attempts
    timeline = tuple(
        Line(
            text=_t(
                f"{number}. step {attempt.step_id} {attempt.tool_name}: "
                + (
                    "committed"
                    if committed and attempt.status is AttemptStatus.LIVE
                    else attempt.status.value
                )
            )
        )
        for number, attempt in enumerate(attempts[:MAX_ROWS], 1)
    )
    events = () if ended is None else ended.audit
    compensations = [
        Line(text=_t(f"step {event.step} {event.kind.value}"), value=shown_json(dict(event.data)))
        for event in events
        if event.kind in (EventKind.COMPENSATED, EventKind.COMPENSATION_FAILED)
    ]
    failures = () if ended is None else ended.compensation_failures
    compensations.extend(Line(text=_t(f"failed: {failure}")) for failure in failures)
    del compensations[MAX_ROWS:]
    return TransactionPage(
        id=_t(restored.tx_id, 200),
        raw_id=restored.tx_id,
        agent=_t(restored.agent_id or "-", 200),
        status=status,
        open=False,
        steps=step_rows(restored, "committed" if committed else "undone", first=first),
        edges=edge_lines(restored),
        graph=graph,
        timeline=timeline
        or (Line(text=_t("not recorded (it ended without a history)")),) * (ended is None),
        compensations=tuple(compensations),
        staged=_staged(restored),
        waiting=waiting,
        targets=(),
        preview=None,
        preview_error=None,
        constraints=tuple(_t(text) for text in (() if ended is None else ended.constraints)),
    )


def _preview(restored: Any, to: int) -> Preview:
    """What a rollback to `to` would do, as `inspect DB TX --preview STEP` works it out."""
    progress = restored.progress
    preview = preview_rollback(
        to,
        next_step=progress.next_step,
        tools={step: live.tool_name for step, live in restored.steps.items()},
        undos=restored.undos,
        effects=[e for e in restored.effects if e.step_id < progress.next_step],
    )
    steps = restored.steps
    return Preview(
        to_step=preview.to_step,
        void=tuple(Line(text=_t(f"{s}. {steps[s].tool_name}")) for s in preview.voided_steps),
        compensate=tuple(
            Line(
                text=_t(f"step {c.step_id} {c.tool_name or '-'}: {c.kind} {c.description}"),
                value=shown_json(c.payload),
            )
            for c in preview.compensations
        ),
        drop=tuple(
            Line(text=_t(f"step {e.step_id} {e.channel}"), value=shown_json(e.payload))
            for e in preview.dropped_effects
        ),
        irreversible=tuple(
            Line(text=_t(f"{s}. {steps[s].tool_name}")) for s in preview.irreversible
        ),
        said=_t(preview.describe(), 2000),
    )


def _waiting_lines(store: CliStore, scope_id: str) -> tuple[Line, ...]:
    """What waits for a person in transaction or plan run `scope_id`."""
    try:
        rows = patiently(WAIT, lambda: requests_for(store).of_scope(scope_id))
    except AgentTxError:
        return ()
    return tuple(
        Line(text=_t(f"{'approval' if row.kind == APPROVAL else 'review'} {row.id}", 200))
        for row in rows
        if row.state == "pending" and row.kind in (APPROVAL, REVIEW)
    )


# ------------------------------------------------------------------------ a plan run


@final
@attrs.frozen(kw_only=True)
class NodeRow:
    """A plan node: its name, tool, state (as the store has it, or what it waits for), its
    unfinished prerequisites, tries, retries, first start, end and error."""

    node: Shown
    tool: Shown
    state: str
    waits: int
    tries: int
    retries: int
    started: str
    finished: str
    error: Shown | None


@final
@attrs.frozen(kw_only=True)
class PlanPage:
    """A plan run's page: `running` while it runs (the page refreshes then)."""

    id: Shown
    raw_id: str
    status: str
    running: bool
    version: Shown
    started: str
    changed: str
    cancel: Shown | None
    nodes: tuple[NodeRow, ...]
    dag: str
    gantt: str
    retries: int
    waited: str
    waiting_people: int
    cost: str
    waiting: tuple[Line, ...]


def plan_page(store: CliStore, run_id: str) -> PlanPage:
    """The page of plan run `run_id`; `PageMissing` if the store has no such run."""
    try:
        image = patiently(WAIT, lambda: store.read_plan(run_id))
    except TransactionNotFound:
        raise PageMissing(f"no plan run `{run_id[:200]}` in the store") from None
    except AgentTxError as exc:
        raise PageMissing(str(exc)) from None
    orphaned = image.status == "RUNNING" and run_id in patiently(WAIT, store.orphaned_plans)
    waiting = waiting_nodes(store, image, WAIT)
    try:
        record, nodes = read_run(image)
    except AgentTxError as exc:
        raise PageMissing(str(exc)) from None
    plan_json = record.get("plan")
    listed = plan_json.get("nodes", ()) if isinstance(plan_json, dict) else ()
    listed = [n for n in listed if isinstance(n, dict)] if isinstance(listed, list) else []
    order = [n.get("id") for n in listed]
    tools = {n.get("id"): n.get("tool") for n in listed}
    waits = unfinished_prerequisites(plan_json, nodes)
    rows = []
    retries = 0
    waited = 0.0
    for node_id in [n for n in order if n in nodes] or sorted(nodes):
        stored = nodes[node_id]
        fields = stored.record
        node_retries = fields.get("retries", 0)
        node_retries = node_retries if isinstance(node_retries, int) else 0
        retries += node_retries
        waited += _waited(fields.get("history"))
        state = stored.state if stored.state in _FINISHED else waiting.get(node_id, stored.state)
        rows.append(
            NodeRow(
                node=_t(node_id, 200),
                tool=_t(str(tools.get(node_id, "?")), 200),
                state=state,
                waits=int(waits.get(node_id, fields.get("unresolved", 0)) or 0),
                tries=int(fields.get("number", 0) or 0),
                retries=node_retries,
                started=uk_time(fields.get("started_at")),
                finished=uk_time(fields.get("finished_at")),
                error=None if not stored.error else _t(str(stored.error)),
            )
        )
    now = time.time()
    return PlanPage(
        id=_t(run_id, 200),
        raw_id=run_id,
        status=shown_status(image.status, orphaned=orphaned),
        running=image.status == "RUNNING",
        version=_t(str(record.get("plan_version", "?")), 80),
        started=uk_time(image.created_at),
        changed=uk_time(image.updated_at),
        cancel=None if image.cancel is None else _t(image.cancel),
        nodes=tuple(rows),
        dag=plan_dag_svg(image, waiting=waiting),
        gantt=plan_gantt_svg(image, now=now, waiting=waiting),
        retries=retries,
        waited=f"{waited:.1f} s",
        waiting_people=len(waiting),
        cost=_cost(node.record.get("cost") for node in nodes.values()),
        waiting=_waiting_lines(store, run_id),
    )


def _waited(history: object) -> float:
    """How long a node waited to start once it was ready (seconds), from its stored history
    (`[state, at, attempt]` entries): from each READY to the RUNNING after it."""
    if not isinstance(history, list):
        return 0.0
    total = 0.0
    ready: float | None = None
    for entry in history:
        if not isinstance(entry, list) or len(entry) < 2:
            continue
        state, at = entry[0], entry[1]
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            continue
        if state == "READY":
            ready = float(at)
        elif state == "RUNNING" and ready is not None:
            total += max(0.0, float(at) - ready)
            ready = None
    return total


def _cost(stored: Iterable[object]) -> str:
    """The run's cost in GBP, summed exactly from what its nodes' records keep (GBP by
    category, as decimal text: an attempt another followed counts as `retry`), with the
    categories; amounts a record cannot give as numbers are left out."""
    total: dict[str, Decimal] = {}
    for cost in stored:
        if not isinstance(cost, dict):
            continue
        for category, amount in cost.items():
            try:
                value = Decimal(str(amount))
            except ArithmeticError:
                continue
            if value.is_finite():
                key = _t(str(category), 40).text
                total[key] = total.get(key, Decimal(0)) + value
    if not total:
        return "none reported"
    parts = ", ".join(f"{category} {amount}" for category, amount in sorted(total.items()))
    return f"{sum(total.values())} ({parts})"
