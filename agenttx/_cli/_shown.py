"""The lines of `inspect` and `plans`, all built before any is printed (their cells escaped
where columns must line up; every line is escaped again when it is printed)."""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
from typing import TYPE_CHECKING, Final

from .._approvals import APPROVAL, REVIEW, request_of, requests_for, review_of
from .._errors import AgentTxError, TransactionNotFound
from .._json import canonical_dumps
from .._plans import NodeState, Plan, StoredNode, read_run
from .._preview import preview_rollback
from .._render import DrawnEdge, DrawnNode, render_graph
from .._results import AttemptStatus, TxStatus
from .._txlog import Restored, read_history, read_image
from ._reading import (
    EndedFound,
    age_of,
    final_status,
    graph_of,
    live_steps,
    patiently,
    peek,
    read_tx,
    tx_status,
    unreadable,
    why_unreadable,
)
from ._terminal import WIDTH, Failure, cut, printable

if TYPE_CHECKING:
    from ..stores import EndedTransaction, PlanImage, TxImage
    from ._store import CliStore

__all__ = [
    "list_transactions",
    "plan_list",
    "plan_shown",
    "show_preview",
    "show_transaction",
    "shown_status",
    "uk_time",
    "unfinished_prerequisites",
    "waiting_nodes",
]

#: How many ended transactions (and plan runs) `inspect DB` lists, the last to end first.
ENDED_SHOWN: Final = 20
#: `inspect DB` counts the outbox's waiting effects up to this many (more show as `10,000+`).
OUTBOX_COUNTED: Final = 10_000


def list_transactions(store: CliStore, wait: float, *, name: str = "the store") -> list[str]:
    """The lines of `inspect DB`: each transaction still open when it is read (the listing
    and the reads are not one snapshot: a writer may end transactions in between)."""
    try:
        ids = patiently(wait, store.open_transactions)
    except AgentTxError as exc:
        raise Failure(str(exc)) from None
    rows = [("TX", "AGENT", "STATUS", "STEPS", "AGE")]
    reasons: list[str] = []
    for tx_id in ids:
        try:
            rows.append(_row(tx_id, peek(store, tx_id, wait)))
        except TransactionNotFound:
            continue  # committed or aborted since the listing: no longer open
        except Failure:
            raise
        except Exception as exc:  # noqa: BLE001 - one bad transaction must not hide the others
            rows.append((printable(tx_id), "?", "UNREADABLE", "?", "?"))
            reasons.append(cut(f"unreadable {printable(tx_id)}: {why_unreadable(exc)}", 2 * WIDTH))
    try:
        pending = len(patiently(wait, lambda: store.pending_effects(OUTBOX_COUNTED + 1)))
    except AgentTxError as exc:
        raise Failure(str(exc)) from None
    count = len(rows) - 1
    lines = [f"{name}: {count} open transaction{'s' * (count != 1)}"]
    if count:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines.extend(
            ("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))).rstrip()
            for row in rows
        )
    lines.extend(reasons)
    counted = f"{OUTBOX_COUNTED:,}+" if pending > OUTBOX_COUNTED else str(pending)
    lines.append(f"outbox: {counted} effect{'s' * (pending != 1)} waiting for delivery")
    lines.extend(_ended_list(store, wait))
    runs = plan_list(store, wait, limit=ENDED_SHOWN)
    if runs == [_NO_RUNS]:
        lines.append("plan runs: none")
    else:
        lines.append(f"plan runs: the last {len(runs) - 1}, the last changed first")
        lines.extend(f"  {line}".rstrip() for line in runs)
    return lines


def _ended_list(store: CliStore, wait: float) -> list[str]:
    """The section of `inspect DB` on the ended transactions kept as history."""
    try:
        ended = patiently(wait, lambda: store.ended_transactions(ENDED_SHOWN))
    except AgentTxError as exc:
        raise Failure(str(exc)) from None
    if not ended:
        return ["ended: none kept as history"]
    rows = [("TX", "AGENT", "STATUS", "STEPS", "ENDED")]
    reasons: list[str] = []
    for row in ended:
        try:
            rows.append(_ended_row(row))
        except Exception as exc:  # noqa: BLE001 - one bad transaction must not hide the others
            rows.append((printable(row.tx_id), "?", "UNREADABLE", "?", age_of(row.ended_at)))
            reasons.append(
                cut(f"unreadable {printable(row.tx_id)}: {why_unreadable(exc)}", 2 * WIDTH)
            )
    count = len(ended)
    lines = [f"ended: the last {count} kept as history, the last to end first"]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines.extend(
        ("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))).rstrip()
        for row in rows
    )
    lines.extend(reasons)
    return lines


def _ended_row(row: EndedTransaction) -> tuple[str, str, str, str, str]:
    """One row of the ended section, its cells escaped."""
    record = json.loads(row.record)
    ended = read_history(row.history)
    agent = record.get("agent_id", "?") if isinstance(record, dict) else "?"
    return (
        printable(row.tx_id),
        printable(str(agent)) or "-",
        printable(final_status(record, ended)),
        live_steps(ended),
        age_of(row.ended_at),
    )


def _row(tx_id: str, image: TxImage) -> tuple[str, str, str, str, str]:
    """One row of the listing, its cells escaped (so that the columns line up as shown)."""
    if image.record == "null":
        return (printable(tx_id), "?", "BEGUN", "0", "?")
    restored = read_image(image)
    return (
        printable(tx_id),
        printable(str(restored.agent_id)) or "-",
        printable(tx_status(restored)),
        str(len(restored.steps)),
        age_of(restored.record.get("created_at")),
    )


def show_transaction(
    store: CliStore, tx_id: str, wait: float, *, name: str = "the store"
) -> list[str]:
    """The lines of `inspect DB TX`, all built before any is printed."""
    found = read_tx(store, tx_id, wait, name=name)
    try:
        return _shown_ended(found) if isinstance(found, EndedFound) else _shown(found)
    except Exception as exc:  # noqa: BLE001 - decoded rows of the wrong shape fail anywhere
        raise unreadable(tx_id, exc) from None


def show_preview(
    store: CliStore, tx_id: str, to_step: int, wait: float, *, name: str = "the store"
) -> list[str]:
    """The lines of `inspect DB TX --preview STEP`: what a rollback to STEP would do."""
    found = read_tx(store, tx_id, wait, name=name)
    if isinstance(found, EndedFound):
        status = final_status(found.restored.record, found.ended)
        raise Failure(f"transaction {tx_id} has ended ({status}): nothing to roll back")
    progress = found.progress
    try:
        preview = preview_rollback(
            to_step,
            next_step=progress.next_step,
            tools={step: live.tool_name for step, live in found.steps.items()},
            undos=found.undos,
            effects=[e for e in found.effects if e.step_id < progress.next_step],
        )
    except AgentTxError as exc:  # a target the rollback would refuse
        raise Failure(str(exc)) from None
    target = "an abort" if preview.aborts else f"a rollback to step {to_step}"
    lines = [
        f"transaction {tx_id}: what {target} would do (nothing done)",
        f"voided steps ({len(preview.voided_steps)}):",
    ]
    lines.extend(f"  {step}. {found.steps[step].tool_name}" for step in preview.voided_steps)
    lines.append(f"compensations, in the order they would run ({len(preview.compensations)}):")
    lines.extend(
        f"  step {c.step_id} {c.tool_name or '-'}: {c.kind} {cut(canonical_dumps(c.payload))}"
        for c in preview.compensations
    )
    lines.append(f"staged effects dropped ({len(preview.dropped_effects)}):")
    lines.extend(
        f"  step {e.step_id} {e.channel} {cut(canonical_dumps(e.payload))}"
        for e in preview.dropped_effects
    )
    lines.append(
        f"voided steps with no undo of their own ({len(preview.irreversible)}): their state "
        "writes are restored, anything else they did stays done"
    )
    lines.extend(f"  {step}. {found.steps[step].tool_name}" for step in preview.irreversible)
    return lines


def _shown_ended(found: EndedFound) -> list[str]:
    """The lines of `inspect DB TX` for an ended transaction."""
    restored, ended = found.restored, found.ended
    status = final_status(restored.record, ended)
    committed = status == TxStatus.COMMITTED.value
    ago = age_of(found.row.ended_at)
    lines = [
        f"transaction {restored.tx_id} (ended)",
        f"  agent: {restored.agent_id or '-'}   status: {status}   ended: {ago} ago",
        f"steps ({len(restored.steps)}{'' if committed else ', undone when it ended'}):",
    ]
    lines.extend(_steps_and_edges(restored))
    if ended is None:
        lines.append("attempts: not recorded (it ended without a history)")
        return lines
    lines.append(f"attempts ({len(ended.attempts)}):")
    for number, attempt in enumerate(ended.attempts, 1):
        became = attempt.status.value
        if committed and attempt.status is AttemptStatus.LIVE:
            became = "committed"
        lines.append(f"  {number}. step {attempt.step_id} {attempt.tool_name}: {became}")
    lines.append(f"constraints ({len(ended.constraints)}):")
    lines.extend(f"  - {constraint}" for constraint in ended.constraints)
    failures = ended.compensation_failures
    lines.append(f"compensation failures ({len(failures)}):")
    lines.extend(f"  - {failure}" for failure in failures)
    return lines


def _shown(restored: Restored) -> list[str]:
    age = age_of(restored.record.get("created_at"))
    lines = [
        f"transaction {restored.tx_id}",
        f"  agent: {restored.agent_id or '-'}   status: {tx_status(restored)}",
        f"  next step: {restored.progress.next_step}   age: {age}",
        f"steps ({len(restored.steps)}):",
    ]
    lines.extend(_steps_and_edges(restored))
    lines.append(f"constraints ({len(restored.progress.constraints)}):")
    lines.extend(f"  - {constraint}" for constraint in restored.progress.constraints)
    context = [(k, s.raw_context) for k, s in sorted(restored.steps.items()) if s.raw_context]
    lines.append(f"context ({len(context)}):")
    lines.extend(f"  {step_id}. {cut(str(text))}" for step_id, text in context)
    lines.append(f"staged effects ({len(restored.effects)}):")
    lines.extend(
        f"  step {effect.step_id} {effect.channel} {cut(canonical_dumps(effect.payload))} "
        f"key={effect.idempotency_key}"
        for effect in restored.effects
    )
    lines.append(f"undo records ({len(restored.undos)}):")
    lines.extend(f"  step {undo.step_id}.{undo.seq} {undo.description}" for undo in restored.undos)
    return lines


def _steps_and_edges(restored: Restored) -> list[str]:
    """Each step (arguments, output), then the `edges (N):` between them."""
    lines = []
    for step_id, step in sorted(restored.steps.items()):
        lines.append(f"  {step_id}. {step.tool_name} {cut(canonical_dumps(step.arguments))}")
        lines.append(f"     -> {cut(canonical_dumps(step.output))}")
    edges = graph_of(restored).edges()
    lines.append(f"edges ({len(edges)}):")
    lines.extend(
        f"  step {edge.source} -> step {edge.target}  "
        f"{edge.source_key} -> {edge.target_key}  ({edge.kind.value})"
        for edge in edges
    )
    return lines


def uk_time(at: object) -> str:
    """A stored time (seconds since the epoch) as a UK date with its zone named, e.g.
    "1 Dec 2026 21:40:05 GMT" (or BST in summer); "-" if there is none."""
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return "-"
    try:
        from zoneinfo import ZoneInfo  # noqa: PLC0415  (only this command needs it)

        zone: dt.tzinfo = ZoneInfo("Europe/London")
    except (ImportError, LookupError, OSError):  # no time zone database: say UTC
        zone = dt.timezone.utc
    try:
        moment = dt.datetime.fromtimestamp(at, zone)
    except (OverflowError, OSError, ValueError):
        return "-"
    return f"{moment.day} {moment:%b %Y %H:%M:%S} {moment.tzname()}"


_NO_RUNS: Final = "no plan runs"
#: The status `plans` shows for a RUNNING run whose runner is gone.
ORPHANED: Final = "ORPHANED"
#: A node's terminal states (`NodeState.is_terminal`).
_FINISHED: Final = frozenset(state.value for state in NodeState if state.is_terminal)


def plan_list(store: CliStore, wait: float, *, limit: int = 100) -> list[str]:
    """The lines of `plans DB`: each run (the last `limit`), the last changed first."""
    runs = patiently(wait, lambda: store.plan_runs(limit))
    if not runs:
        return [_NO_RUNS]
    orphaned = set(patiently(wait, store.orphaned_plans))
    lines = [f"{'RUN':<34} {'STATUS':<10} {'NODES':<40} UPDATED"]
    for run_id, status, updated_at in runs:
        try:
            image = patiently(wait, functools.partial(store.read_plan, run_id))
        except TransactionNotFound:
            continue
        waiting = waiting_nodes(store, image, wait)
        counts: dict[str, int] = {}
        for node in image.nodes:
            state = _state(node.node_id, node.state, waiting)
            counts[state] = counts.get(state, 0) + 1
        nodes = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        shown = shown_status(status, orphaned=run_id in orphaned)
        lines.append(
            f"{cut(run_id, 34):<34} {shown:<10} {cut(nodes, 40):<40} {uk_time(updated_at)}"
        )
    return lines


def waiting_nodes(store: CliStore, image: PlanImage, wait: float) -> dict[str, str]:
    """The nodes of a RUNNING plan run that wait for a person, each with the state
    `PlanRun.node_states()` gives it (`WAITING_APPROVAL`, `NEEDS_REVIEW`): those with a
    pending approval request or review in the store. The store keeps such a node RUNNING."""
    if image.status != "RUNNING":
        return {}
    rows = patiently(wait, lambda: requests_for(store).of_scope(image.run_id))
    found: dict[str, str] = {}
    for row in rows:
        if row.state != "pending" or row.kind not in (APPROVAL, REVIEW):
            continue
        if row.kind == REVIEW:
            found[str(review_of(row).node)] = NodeState.NEEDS_REVIEW.value
        else:
            found.setdefault(str(request_of(row).node), NodeState.WAITING_APPROVAL.value)
    return found


def _state(node_id: str, state: str, waiting: dict[str, str]) -> str:
    """A stored node's state as shown: what it waits for, while it has not finished."""
    return state if state in _FINISHED else waiting.get(node_id, state)


def shown_status(status: str, *, orphaned: bool) -> str:
    """A run's status as `plans` shows it: ORPHANED for a RUNNING run whose runner is gone
    (the store says: `PlanStore.orphaned_plans`), which recovery would take over."""
    return ORPHANED if orphaned and status == "RUNNING" else status


def plan_shown(
    image: PlanImage,
    fmt: str,
    *,
    orphaned: bool = False,
    waiting: dict[str, str] | None = None,
) -> list[str]:
    """The lines of `plans DB RUN`: the run and each node, or its graph in `fmt`; `orphaned`:
    the store says its runner is gone; `waiting`: the nodes that wait for a person
    (`waiting_nodes`), shown in that state."""
    record, nodes = read_run(image)
    waiting = waiting or {}
    plan_json = record.get("plan")
    if fmt != "text":
        plan = Plan.from_json(plan_json)
        ids = {node.id: f"n{index}" for index, node in enumerate(plan.nodes)}
        drawn = [
            DrawnNode(
                ids[node.id], f"{node.id}: {node.tool}", _drawn_state(nodes, node.id, waiting)
            )
            for node in plan.nodes
        ]
        edges = [
            DrawnEdge(ids[before], ids[node.id], "after" if before in node.after else "value")
            for node in plan.nodes
            for before in sorted(plan.prerequisites(node.id))
        ]
        return render_graph(drawn, edges, fmt).rstrip("\n").split("\n")
    waits = unfinished_prerequisites(plan_json, nodes)
    status = shown_status(image.status, orphaned=orphaned)
    lines = [
        f"plan run {image.run_id}: {status}"
        + (" (its runner is gone: recovery takes it over)" if status == ORPHANED else ""),
        f"  plan version {record.get('plan_version', '?')}",
        f"  started {uk_time(image.created_at)}, last change {uk_time(image.updated_at)}",
    ]
    if image.cancel is not None:
        lines.append(f"  cancelled: {image.cancel}")
    lines.append(
        f"  {'NODE':<24} {'STATE':<16} {'WAITS':>5} {'TRIES':>5} {'RETRIES':>7}  "
        f"{'STARTED':<24} FINISHED"
    )
    order = [node["id"] for node in plan_json["nodes"]] if isinstance(plan_json, dict) else []
    for node_id in order or sorted(nodes):
        stored = nodes[node_id]
        fields = stored.record
        lines.append(
            f"  {cut(node_id, 24):<24} {_state(node_id, stored.state, waiting):<16} "
            f"{waits.get(node_id, fields.get('unresolved', 0)):>5} "
            f"{fields.get('number', 0):>5} {fields.get('retries', 0):>7}  "
            f"{uk_time(fields.get('started_at')):<24} {uk_time(fields.get('finished_at'))}"
        )
        if stored.error:
            lines.append(f"      error: {cut(str(stored.error))}")
    return lines


def unfinished_prerequisites(plan_json: object, nodes: dict[str, StoredNode]) -> dict[str, int]:
    """For each node, how many of its prerequisites have not finished (are in no terminal
    state) as stored now: the runner records a node's count only when the node itself
    changes, so the stored count is the one of its last change. Empty if the plan cannot be
    read (the stored counts are shown then)."""
    try:
        plan = Plan.from_json(plan_json)
    except (AgentTxError, ValueError, KeyError, TypeError):
        return {}
    known = set(plan.node_ids)
    return {
        node_id: sum(
            1
            for before in plan.prerequisites(node_id)
            if before not in nodes or nodes[before].state not in _FINISHED
        )
        for node_id in nodes
        if node_id in known
    }


def _drawn_state(nodes: dict[str, StoredNode], node_id: str, waiting: dict[str, str]) -> str:
    stored = nodes.get(node_id)
    return "pending" if stored is None else _state(node_id, stored.state, waiting).lower()
