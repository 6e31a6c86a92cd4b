"""The pictures of `agenttx ui`: how long a plan run's DAG and Gantt chart and a transaction's
graph take to draw, for 10, 100 and 1,000 nodes.

Run from the repository root::

    python bench/ui_pictures.py           # the full run
    python bench/ui_pictures.py --quick   # a smoke run (used by tests/test_bench.py)

A page of `agenttx ui` should load in 200 ms with a large store. A plan run's page draws two
pictures, so its DAG and its Gantt chart of 1,000 nodes have a target of 50 ms each (a quarter
of the page); a transaction's page draws one, so its graph of 1,000 steps (and the attempts of
its history: 1,502 boxes here) has 100 ms (half the page).

The workload (seeded, built before any timing)
    A plan of N nodes of one tool: node i takes an input by a `${...}` reference to one of the
    16 nodes before it and, every third node, also waits for another (`after`); its stored
    record says it started and finished (the last tenth still running). It is stored as
    `PlanImage` holds it (the plan's JSON in the run's record, each node's record lines), so
    `plan_dag_svg` and `plan_gantt_svg` decode, lay out and draw it as they do for a page.
    A transaction of N steps, each taking a reference to one of the 8 steps before and a value
    equal to an earlier output (an implicit edge), ended COMMITTED after a rewind to step N/2
    (its history holds the N/2 attempts undone and the one that failed, beside the live ones).

Each figure is the median over the repetitions, after one untimed warm-up draw, of the wall
time (`time.perf_counter`) and of the process's CPU time (`time.process_time`): drawing is one
thread's work, so on an idle machine the two agree; on a shared one the wall time also counts
other jobs' turns, so the verdict is on the CPU time, the wall time beside it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agenttx
from _report import Row, report
from agenttx._refs import Dependency
from agenttx._results import AttemptStatus, StepAttempt
from agenttx._txlog import Ended, LiveStep, Restored
from agenttx._ui._pictures import plan_dag_svg, plan_gantt_svg, transaction_graph_svg
from agenttx.stores import PlanImage, PlanNodeRow

#: The target of each picture of 1,000 nodes, in milliseconds (module docstring).
TARGETS_MS = {"plan DAG": 50.0, "plan Gantt": 50.0, "transaction graph": 100.0}
NOW = 1_800_000_000.0


class _Found(NamedTuple):
    restored: Restored
    ended: Ended


def plan_image(n: int, seed: int = 0) -> PlanImage:
    """A stored plan run of `n` nodes (see the module docstring)."""
    rng = random.Random(seed)
    nodes = []
    for i in range(n):
        inputs: dict[str, object] = {"x": i}
        after: tuple[str, ...] = ()
        if i:
            inputs["y"] = f"${{n{rng.randrange(max(0, i - 16), i)}.x}}"
            if i % 3 == 0:
                after = (f"n{rng.randrange(i)}",)
        nodes.append(agenttx.Node(f"n{i}", tool="work", inputs=inputs, after=after))
    plan = agenttx.Plan(nodes=nodes)
    record = json.dumps({"format": 2, "plan": plan.to_json()})
    rows = []
    start = NOW - 100.0
    for i in range(n):
        began = start + i * 0.05 + rng.random()
        running = i >= n - n // 10
        first = {"unresolved": 0, "number": 1, "retries": 0, "error": None, "output": None}
        first |= {"started_at": began, "finished_at": None, "history": []}
        lines = [json.dumps(first)]
        if not running:
            lines.append(json.dumps({"finished_at": began + rng.random() * 2}))
        rows.append(
            PlanNodeRow(
                node_id=f"n{i}",
                state="RUNNING" if running else "SUCCEEDED",
                attempt=f"n{i}#1",
                record="\n".join(lines),
            )
        )
    return PlanImage(
        run_id="bench",
        record=record,
        status="RUNNING",
        owner="bench",
        cancel=None,
        created_at=start,
        updated_at=NOW,
        nodes=tuple(rows),
    )


def transaction(n: int, seed: int = 0) -> _Found:
    """An ended transaction of `n` steps with a rewind in its history (module docstring)."""
    rng = random.Random(seed)
    steps = {}
    for i in range(1, n + 1):
        deps: tuple[Dependency, ...] = ()
        arguments: dict[str, object] = {"order_id": f"o{rng.randrange(1, i + 1)}"}
        if i > 1:
            before = rng.randrange(max(1, i - 8), i)
            deps = (Dependency(from_step=before, source_key="total", target_key="amount"),)
            arguments["amount"] = 3 * before
        output = {"id": f"o{i}", "total": 3 * i}
        steps[i] = LiveStep(f"tool{i % 7}", arguments, output, "", deps)
    half = max(n // 2, 1)
    attempts = [
        StepAttempt(step_id=i, tool_name=f"tool{i % 7}", status=AttemptStatus.REWOUND)
        for i in range(half, n + 1)
    ]
    attempts.append(StepAttempt(step_id=n, tool_name=f"tool{n % 7}", status=AttemptStatus.FAILED))
    attempts.extend(
        StepAttempt(step_id=i, tool_name=f"tool{i % 7}", status=AttemptStatus.LIVE)
        for i in range(1, n + 1)
    )
    ended = Ended(
        status="COMMITTED", attempts=tuple(attempts), constraints=(), compensation_failures=()
    )
    # Only the fields the picture reads are real.
    restored = Restored("bench", "agent", {}, None, steps, None, (), (), None, {}, None, ())  # type: ignore[arg-type]
    return _Found(restored, ended)


def _median_ms(draw: object, repeat: int) -> tuple[float, float, int]:
    """The median wall and CPU times of `draw()` over `repeat` calls, in ms, and the size of
    what it drew."""
    assert callable(draw)
    size = len(draw())  # the warm-up, untimed
    walls, cpus = [], []
    for _ in range(repeat):
        began, began_cpu = time.perf_counter(), time.process_time()
        draw()
        cpus.append(time.process_time() - began_cpu)
        walls.append(time.perf_counter() - began)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    repeat = 2 if args.quick else args.repeat
    sizes = (10, 100) if args.quick else (10, 100, 1000)
    rows = []
    for name, build, draw in (
        ("plan DAG", plan_image, plan_dag_svg),
        ("plan Gantt", plan_image, lambda image: plan_gantt_svg(image, now=NOW)),
        ("transaction graph", transaction, transaction_graph_svg),
    ):
        figures = []
        for n in sizes:
            built = build(n)
            svg = draw(built)
            if (
                not svg.startswith("<svg ")
                or svg.count('class="node') + svg.count('class="span') < n
            ):
                raise SystemExit(f"{name} of {n} nodes: not every node drawn")
            ms, cpu, size = _median_ms(lambda built=built, draw=draw: draw(built), repeat)
            figures.append((n, ms, cpu, size))
        n, ms, cpu, _size = figures[-1]
        detail = ", ".join(
            f"{k} nodes {m:.1f} ms ({c:.1f} ms CPU, {s // 1024} KiB)" for k, m, c, s in figures
        )
        target = TARGETS_MS[name]
        rows.append(
            Row(
                f"{name}, {n} nodes",
                f"{cpu:.1f} ms CPU",
                f"<= {target:.0f} ms",
                cpu / target,
                detail,
            )
        )
    return report(rows, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
