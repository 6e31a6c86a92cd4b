"""The pictures of `agenttx ui` (`agenttx._ui._pictures`): a transaction's graph, a plan run's
DAG and Gantt chart, and the critical path, from what the store returns."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import xml.etree.ElementTree as ET
from typing import NamedTuple

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import agenttx
from agenttx import Engine, EngineConfig, InvalidArgument, StorageError, _demo
from agenttx._cli._reading import EndedFound, read_tx
from agenttx._cli._target import open_target
from agenttx._events import Event, EventKind
from agenttx._results import AttemptStatus, StepAttempt
from agenttx._txlog import Ended, Restored
from agenttx._ui._pictures import critical_path, plan_dag_svg, plan_gantt_svg, transaction_graph_svg
from agenttx.stores import PlanImage, PlanNodeRow, SQLiteStore

SVG = "{http://www.w3.org/2000/svg}"


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def _with(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def _classes(element: ET.Element) -> set[str]:
    return set((element.get("class") or "").split())


def _edges(root: ET.Element, cls: str = "edge") -> set[tuple[str | None, str | None]]:
    return {(e.get("data-from"), e.get("data-to")) for e in _with(root, cls)}


def _x(group: ET.Element) -> float:
    rect = group.find(f"{SVG}rect")
    assert rect is not None
    return float(rect.get("x", "nan"))


class _Ended(NamedTuple):
    restored: Restored
    ended: Ended | None


# ---------------------------------------------------------------- transactions


@agenttx.tool
def _create() -> dict[str, str]:
    return {"order_id": "order-7f3a9c"}


@agenttx.tool
def _ship(order_id: str) -> dict[str, bool]:
    return {"shipped": bool(order_id)}


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> EndedFound:
    """The demo's committed transaction, read back as `agenttx graph` reads it."""
    root = tmp_path_factory.mktemp("demo")
    tx = _demo.run(lambda _line: None, directory=str(root))
    target = open_target(str(root / "agenttx.db"), 1.0, schema=None)
    try:
        found = read_tx(target.store, tx.id, 1.0)
    finally:
        target.store.close()
    assert isinstance(found, EndedFound)
    return found


@pytest.fixture(scope="module")
def open_tx(tmp_path_factory) -> Restored:
    """An open transaction of three steps: 2 takes step 1's order id as a literal (an implicit
    edge), 3 by a reference (an explicit one)."""
    path = tmp_path_factory.mktemp("open") / "agent.db"
    store = SQLiteStore(path)
    engine = Engine(tools=[_create, _ship], store=store, config=EngineConfig(idle_timeout=None))
    tx = engine.begin(agent_id="shop")
    tx.execute_step(1, "_create", {})
    tx.execute_step(2, "_ship", {"order_id": "order-7f3a9c"})
    tx.execute_step(3, "_ship", {"order_id": "${steps.1.order_id}"})
    store.close()  # open in the file, as after a crash
    target = open_target(str(path), 1.0, schema=None)
    try:
        found = read_tx(target.store, tx.id, 1.0)
    finally:
        target.store.close()
    assert isinstance(found, Restored)
    return found


def test_the_demo_graph_marks_rewound_compensated_failed_attempts_and_the_root_cause(demo):
    """The demo's graph: its five live steps with their explicit edges; each attempt its rewind
    undid (rewound, compensated) and the failed insert drawn beside the attempt that replaced
    it and linked to it; the undone attempt of step 1 (where the rewind went) is the root
    cause, and the only one."""
    root = _parse(transaction_graph_svg(demo))
    nodes = _with(root, "node")
    live = {g.get("data-id"): g for g in nodes if "live" in _classes(g)}
    assert sorted(live) == ["1", "2", "3", "4", "5"]
    assert {("s1", "s4"), ("s1", "s5")} <= _edges(root, "explicit")
    undone = [g for g in nodes if "live" not in _classes(g)]
    states = {
        (g.get("data-id"), next(iter(_classes(g) & {"rewound", "compensated", "failed"})))
        for g in undone
    }
    assert states == {("1", "rewound"), ("2", "rewound"), ("3", "compensated"),
                      ("4", "rewound"), ("5", "failed")}  # fmt: skip
    (cause,) = _with(root, "root-cause")
    assert cause.get("data-id") == "1"
    assert "rewound" in _classes(cause)
    replaced = _edges(root, "replaced")
    for group in undone:
        step = group.get("data-id")
        assert (group.get("data-node"), f"s{step}") in replaced
        assert _x(group) == _x(live[str(step)])  # beside the attempt that replaced it
    assert "#1 record.insert" in "".join(cause.itertext())


def test_an_open_transaction_draws_its_live_steps_with_explicit_and_implicit_edges(open_tx):
    """An open transaction (`read_tx` gives its `Restored`) draws its live steps, `#N tool`,
    with an explicit edge for a reference and a dashed implicit one for a copied value."""
    root = _parse(transaction_graph_svg(open_tx))
    assert root.get("aria-label") == f"the dependency graph of transaction {open_tx.tx_id}"
    groups = _with(root, "node")
    assert [g.get("data-id") for g in groups] == ["1", "2", "3"]
    assert all(_classes(g) == {"node", "live"} for g in groups)
    assert "#2 _ship" in "".join(groups[1].itertext())
    assert _edges(root, "explicit") == {("s1", "s3")}
    assert _edges(root, "implicit") == {("s1", "s2")}
    (implicit,) = _with(root, "implicit")
    assert implicit.get("stroke-dasharray")
    assert not _with(root, "root-cause")


def _attempt(step: int, status: AttemptStatus, tool: str = "t") -> StepAttempt:
    return StepAttempt(step_id=step, tool_name=tool, status=status, call_id=None)


L, R, C, F = (
    AttemptStatus.LIVE,
    AttemptStatus.REWOUND,
    AttemptStatus.COMPENSATED,
    AttemptStatus.FAILED,
)


def _rewound_to(step: int) -> Event:
    return Event(
        kind=EventKind.STEP_REWOUND,
        at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        scope="transaction",
        scope_id="t",
        seq=0,
        step=step,
        data={"to_step": step, "steps_undone": [step]},
    )


def _ended(status: str, attempts: list[StepAttempt], audit: tuple[Event, ...] = ()) -> Ended:
    return Ended(status, tuple(attempts), (), (), audit)


def test_the_root_cause_is_the_step_of_the_last_rewind_in_the_audit(open_tx):
    """With two rewinds in the history, the root cause is the attempt the last `step_rewound`
    event went back to, undone by it and run again."""
    attempts = [_attempt(1, R), _attempt(2, F), _attempt(1, L), _attempt(2, R), _attempt(3, F)]
    attempts += [_attempt(2, L), _attempt(3, L)]
    ended = _ended("COMMITTED", attempts, (_rewound_to(1), _rewound_to(2)))
    root = _parse(transaction_graph_svg(_Ended(open_tx, ended)))
    (cause,) = _with(root, "root-cause")
    assert cause.get("data-attempt") == "3"
    assert cause.get("data-id") == "2"


def test_without_an_audit_the_root_cause_is_the_step_run_first_after_the_failure(open_tx):
    """A history kept without audit events: the last rewind went to the step run first after
    the failure that followed the last undone attempts (a rewind to T runs T next)."""
    attempts = [_attempt(1, L), _attempt(2, C), _attempt(3, F), _attempt(2, L), _attempt(3, L)]
    root = _parse(transaction_graph_svg(_Ended(open_tx, _ended("COMMITTED", attempts))))
    (cause,) = _with(root, "root-cause")
    assert cause.get("data-attempt") == "1"
    assert _classes(cause) >= {"compensated", "root-cause"}


def test_an_audit_without_a_rewind_marks_no_root_cause(open_tx):
    """A history whose audit holds no `step_rewound` event had no rewind: no root cause, even
    where attempts ran again after undone ones (an abort's undoing, say)."""
    attempts = [_attempt(1, L), _attempt(2, C), _attempt(3, F), _attempt(2, L), _attempt(3, L)]
    event = attrs.evolve(_rewound_to(1), kind=EventKind.STEP_DISPATCHED, data={})
    ended = _ended("COMMITTED", attempts, (event,))
    assert not _with(_parse(transaction_graph_svg(_Ended(open_tx, ended))), "root-cause")


def test_an_aborted_transaction_links_its_attempts_in_the_order_they_ran(open_tx):
    """An aborted transaction has no live step: its attempts are drawn in the order they ran,
    each linked to the one before (`order`), those run again beside their later attempt
    (`replaced`): no box stands alone, and none is the root cause of a rewind."""
    attempts = [_attempt(1, R), _attempt(2, F), _attempt(1, C), _attempt(2, R), _attempt(3, F)]
    root = _parse(transaction_graph_svg(_Ended(open_tx, _ended("ROLLED_BACK", attempts))))
    nodes = {g.get("data-node") for g in _with(root, "node")}
    assert nodes == {"a0", "a1", "a2", "a3", "a4"}
    assert _edges(root, "replaced") == {("a0", "a2"), ("a1", "a3")}
    assert _edges(root, "order") == {("a2", "a3"), ("a3", "a4")}
    assert all(e.get("stroke-dasharray") == "2 3" for e in _with(root, "order"))  # faint, dotted
    linked = {end for edge in _edges(root) for end in edge}
    assert linked == nodes
    assert not _with(root, "live")


def test_an_ended_transaction_without_a_history_draws_its_live_steps(open_tx):
    """An ended transaction whose store kept no history draws the steps its image holds."""
    root = _parse(transaction_graph_svg(_Ended(open_tx, None)))
    assert [g.get("data-id") for g in _with(root, "node")] == ["1", "2", "3"]


def test_hostile_tool_names_in_a_history_are_shown_as_text(open_tx):
    """A tool name holding markup, quotes and terminal escape codes is escaped and made
    visible in the label and the title; a 10 MB one is cut."""
    hostile = "<script>alert('x')</script>\x1b[31m]]>"
    attempts = [_attempt(1, F, hostile), _attempt(2, F, "x" * 10_000_000)]
    svg = transaction_graph_svg(_Ended(open_tx, _ended("ROLLED_BACK", attempts)))
    assert "<script" not in svg
    assert "\x1b" not in svg
    assert len(svg) < 100_000
    root = _parse(svg)
    first = _with(root, "node")[0]
    assert "␛[31m" in (first.findtext(f"{SVG}title") or "")


# ---------------------------------------------------------------- plan runs


@agenttx.tool
def _add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


@agenttx.tool
def _fails() -> dict[str, int]:
    raise ValueError("the warehouse id is unknown <script>\x1b[31m")


@pytest.fixture(scope="module")
def plan_run(tmp_path_factory) -> PlanImage:
    """A plan run that ended FAILED: x -> y and z -> w succeeded, `bad` failed, `after_bad`
    (after it) was skipped."""
    plan = agenttx.Plan(
        nodes=[
            agenttx.Node("x", tool="_add", inputs={"a": 1, "b": 2}),
            agenttx.Node("y", tool="_add", inputs={"a": "${x.sum}", "b": 1}),
            agenttx.Node("bad", tool="_fails"),
            agenttx.Node("after_bad", tool="_add", inputs={"a": 1, "b": 1}, after=("bad",)),
            agenttx.Node("z", tool="_add", inputs={"a": "${y.sum}", "b": "${x.sum}"}),
        ]
    )
    path = tmp_path_factory.mktemp("plan") / "plan.db"
    with SQLiteStore(path) as store:
        engine = Engine(tools=[_add, _fails], store=store)
        engine.run_plan(plan, initial={}, run_id="mixed")
        return store.read_plan("mixed")


def _running(image: PlanImage, node_id: str) -> PlanImage:
    """`image` as if the run were still RUNNING and `node_id` had started but not finished."""
    rows = tuple(
        attrs.evolve(row, state="RUNNING", record=row.record + '\n{"finished_at":null}')
        if row.node_id == node_id
        else row
        for row in image.nodes
    )
    return attrs.evolve(image, status="RUNNING", nodes=rows)


def test_plan_dag_draws_each_node_in_its_state_with_its_prerequisites(plan_run):
    """The DAG has a node per plan node (in plan order, `data-id` its name, its state in lower
    case) and an explicit edge from each prerequisite, by reference or by `after`."""
    root = _parse(plan_dag_svg(plan_run))
    nodes = {g.get("data-id"): _classes(g) - {"node"} for g in _with(root, "node")}
    assert list(nodes) == ["x", "y", "bad", "after_bad", "z"]
    assert nodes == {
        "x": {"succeeded"},
        "y": {"succeeded"},
        "bad": {"failed"},
        "after_bad": {"skipped"},
        "z": {"succeeded"},
    }
    assert _edges(root, "explicit") == {("x", "y"), ("bad", "after_bad"), ("y", "z"), ("x", "z")}
    title = _with(root, "node")[2].findtext(f"{SVG}title") or ""
    assert "<script>␛[31m" in title
    assert "\x1b" not in plan_dag_svg(plan_run)


def test_plan_dag_shows_what_a_running_node_waits_for(plan_run):
    """A node that has not finished shows the state `waiting` gives it (a person's
    approval); a finished node keeps its own."""
    image = _running(plan_run, "z")
    root = _parse(plan_dag_svg(image, waiting={"z": "WAITING_APPROVAL", "x": "NEEDS_REVIEW"}))
    nodes = {g.get("data-id"): _classes(g) for g in _with(root, "node")}
    assert "waiting_approval" in nodes["z"]
    assert "succeeded" in nodes["x"]


def test_a_plan_that_cannot_be_read_is_drawn_without_edges(plan_run):
    """A run whose stored plan is not a plan draws its nodes without edges; a record that is
    not JSON raises `StorageError`."""
    record = json.loads(plan_run.record)
    record["plan"] = {"nodes": "not a list"}
    root = _parse(plan_dag_svg(attrs.evolve(plan_run, record=json.dumps(record))))
    assert len(_with(root, "node")) == 5
    assert not _with(root, "edge")
    with pytest.raises(StorageError):
        plan_dag_svg(attrs.evolve(plan_run, record="{not json"))


def test_gantt_draws_a_span_per_started_node_with_the_critical_path(plan_run):
    """The Gantt chart has a span per node that started (a skipped one never did), in its
    state; the spans of the critical path of the measured durations through the plan's edges
    carry `critical`, and no others."""
    root = _parse(plan_gantt_svg(plan_run, now=plan_run.updated_at + 100))
    spans = {r.get("data-id"): _classes(r) for r in _with(root, "span")}
    assert set(spans) == {"x", "y", "bad", "z"}
    assert "failed" in spans["bad"]
    critical = {node for node, classes in spans.items() if "critical" in classes}
    durations = _durations(plan_run)
    edges = [("x", "y"), ("y", "z"), ("x", "z"), ("bad", "after_bad")]
    assert critical == set(critical_path(durations, edges)) & set(spans)
    assert not _with(root, "now")  # the run has ended


def _durations(image: PlanImage) -> dict[str, float]:
    found = {}
    for row in image.nodes:
        lines = [json.loads(line) for line in row.record.split("\n")]
        fields = {k: v for line in lines for k, v in line.items()}
        if fields.get("started_at") is not None:
            found[row.node_id] = fields["finished_at"] - fields["started_at"]
    return found


def test_gantt_draws_a_running_node_up_to_now(plan_run):
    """A node still running is drawn from its start to `now`, the longest span; a line
    marks `now` while the run is running."""
    image = _running(plan_run, "z")
    now = plan_run.updated_at + 60.0
    root = _parse(plan_gantt_svg(image, now=now))
    spans = {r.get("data-id"): r for r in _with(root, "span")}
    widths = {node: float(r.get("width", "nan")) for node, r in spans.items()}
    assert max(widths, key=lambda node: widths[node]) == "z"
    assert "running" in _classes(spans["z"])
    assert "critical" in _classes(spans["z"])
    assert _with(root, "now")


def test_gantt_refuses_a_now_or_stored_times_it_cannot_draw(plan_run):
    """A `now` that is not a finite number is refused (`InvalidArgument`); stored times that
    span more than a float holds make the run unreadable (`StorageError`), never a broken
    chart."""
    with pytest.raises(InvalidArgument, match="now"):
        plan_gantt_svg(plan_run, now=math.nan)
    rows = tuple(
        attrs.evolve(row, record=row.record + '\n{"started_at":-1e308,"finished_at":1e308}')
        if row.node_id in ("x", "y")
        else row
        for row in plan_run.nodes
    )
    with pytest.raises(StorageError, match="float"):
        plan_gantt_svg(attrs.evolve(plan_run, nodes=rows), now=plan_run.updated_at)


# ---------------------------------------------------------------- the critical path


def _paths(n: int, edges: set[tuple[int, int]]) -> list[tuple[int, ...]]:
    succ = {i: sorted(b for a, b in edges if a == i) for i in range(n)}
    found: list[tuple[int, ...]] = []

    def walk(path: tuple[int, ...]) -> None:
        found.append(path)
        for nxt in succ[path[-1]]:
            walk((*path, nxt))

    for start in range(n):
        walk((start,))
    return found


@given(
    st.integers(min_value=1, max_value=7).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(0, 100, allow_nan=False), min_size=n, max_size=n),
            st.sets(
                st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(
                    lambda e: e[0] < e[1]
                ),
                max_size=12,
            ),
        )
    )
)
def test_the_critical_path_is_a_path_no_other_path_outweighs(case):
    """On any DAG the critical path follows its edges, and no path of the DAG has a greater
    summed duration."""
    weights, edges = case
    names = [f"n{i}" for i in range(len(weights))]
    path = critical_path(
        dict(zip(names, weights, strict=True)), [(names[a], names[b]) for a, b in edges]
    )
    indices = [names.index(name) for name in path]
    assert indices
    assert all((a, b) in edges for a, b in itertools.pairwise(indices))
    total = sum(weights[i] for i in indices)
    for other in _paths(len(weights), edges):
        assert sum(weights[i] for i in other) <= total + 1e-9


def test_the_critical_path_of_a_simple_dag_is_its_heaviest_chain():
    """a (1) -> b (5) -> d (1) outweighs a -> c (2) -> d; a node alone heavier than any chain
    is the path by itself; no nodes, no path."""
    durations = {"a": 1.0, "b": 5.0, "c": 2.0, "d": 1.0}
    edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    assert critical_path(durations, edges) == ("a", "b", "d")
    assert critical_path({**durations, "e": 100.0}, edges) == ("e",)
    assert critical_path({}, []) == ()


def test_the_critical_path_ignores_unknown_nodes_and_bad_durations():
    """Edges naming unknown nodes are ignored; a NaN, infinite or negative duration weighs
    nothing."""
    durations = {"a": 1.0, "b": math.nan, "c": 2.0, "d": math.inf}
    path = critical_path(durations, [("a", "b"), ("b", "c"), ("zz", "a"), ("a", "yy")])
    assert path == ("a", "b", "c")
    durations = {"x": 1.5, "a": 1.0, "b": -5.0, "c": 1.0}
    assert critical_path(durations, [("a", "b"), ("b", "c")]) == ("a", "b", "c")


@pytest.mark.timeout(30)
def test_the_critical_path_of_a_cycle_is_refused():
    """Edges that make a cycle (or a self-loop) raise `InvalidArgument`, never hang."""
    with pytest.raises(InvalidArgument, match="cycle"):
        critical_path({"a": 1.0, "b": 1.0}, [("a", "b"), ("b", "a")])
    with pytest.raises(InvalidArgument, match="cycle"):
        critical_path({"a": 1.0}, [("a", "a")])


def _image(plan: agenttx.Plan, records: dict[str, tuple[str, dict[str, object]]]) -> PlanImage:
    """A stored plan run of `plan` whose nodes have these states and records."""
    rows = tuple(
        PlanNodeRow(node_id=node_id, state=state, attempt=None, record=json.dumps(record))
        for node_id, (state, record) in records.items()
    )
    return PlanImage(
        run_id="made",
        record=json.dumps({"format": 2, "plan": plan.to_json()}),
        status="SUCCEEDED",
        owner=None,
        cancel=None,
        created_at=0.0,
        updated_at=10.0,
        nodes=rows,
    )


def test_gantt_draws_each_attempt_of_a_retried_node_inside_its_span():
    """A node tried twice shows, inside its span (from its first start to its finish), a bar
    for each time it ran, as its history says; the wait between them has none."""
    history = [
        ["READY", 0.0, None],
        ["RUNNING", 1.0, "a#1"],
        ["READY", 2.0, "a#1"],
        ["RUNNING", 5.0, "a#2"],
        ["SUCCEEDED", 6.0, "a#2"],
    ]
    plan = agenttx.Plan(nodes=[agenttx.Node("a", tool="_add", inputs={"a": 1, "b": 1})])
    record = {"started_at": 1.0, "finished_at": 6.0, "history": history, "retries": 1}
    root = _parse(plan_gantt_svg(_image(plan, {"a": ("SUCCEEDED", record)}), now=10.0))
    (span,) = _with(root, "span")
    first, second = _with(root, "attempt")
    x, width = float(span.get("x", "")), float(span.get("width", ""))
    assert float(first.get("x", "")) == pytest.approx(x, abs=0.2)
    assert float(second.get("x", "")) + float(second.get("width", "")) == pytest.approx(
        x + width, abs=0.2
    )
    assert float(first.get("width", "")) == pytest.approx(width / 5, abs=0.2)
    assert "retries: 1" in (span.findtext(f"{SVG}title") or "")


def test_a_plan_of_a_thousand_nodes_draws_every_node_and_span():
    """A 1,000-node plan run (a chain, each node after the one before, all finished) draws a
    node per plan node and a span per node, every span critical (its speed is measured by
    bench/ui_pictures.py, not here)."""
    nodes = [agenttx.Node("n0", tool="_add", inputs={"a": 1, "b": 1})]
    nodes += [
        agenttx.Node(f"n{i}", tool="_add", inputs={"a": f"${{n{i - 1}.sum}}", "b": 1})
        for i in range(1, 1000)
    ]
    record = json.dumps({"format": 2, "plan": agenttx.Plan(nodes=nodes).to_json()})
    rows = tuple(
        PlanNodeRow(
            node_id=f"n{i}",
            state="SUCCEEDED",
            attempt=f"n{i}#1",
            record=json.dumps({"started_at": 10.0 + i, "finished_at": 10.5 + i, "history": []}),
        )
        for i in range(1000)
    )
    image = PlanImage(
        run_id="big",
        record=record,
        status="SUCCEEDED",
        owner=None,
        cancel=None,
        created_at=10.0,
        updated_at=1010.0,
        nodes=rows,
    )
    dag = _parse(plan_dag_svg(image))
    assert len(_with(dag, "node")) == 1000
    assert len(_with(dag, "edge")) == 999
    gantt = _parse(plan_gantt_svg(image, now=2000.0))
    assert len(_with(gantt, "critical")) == 1000
