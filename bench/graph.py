"""Benchmarks for `agenttx.DependencyGraph` against the issue's performance targets.

Run from the repository root::

    python bench/graph.py             # the full run (under 10 s on a 2-core x86_64 box)
    python bench/graph.py --quick     # a smaller run, for the smoke test (under 1 s)
    python bench/graph.py --repeat 31 # more builds and repetitions

Targets (the full run exits with status 1, naming the misses, if any is not met):

1. ``add_step flat``: on one 10,000-step sequence, the mean cost of ``add_step`` +
   ``record_output`` for steps 9,901-10,000 is at most 1.25 times that of steps 1-100.
2. ``truncate_from``: ``truncate_from(9991)`` (10 steps back) on that 10,000-step graph takes at
   most 3 ms.
3. ``find_root_cause``: the walk from step 1,000 back along a 1,000-step rename chain takes at
   most 1 ms, and returns step 1.

The workload
    Every step has 4 input leaves and 4 output leaves. Step ``k`` outputs
    ``{"id": "u<k>", "org_id": "org<k % 7>", "total": 3k + 1, "currency": "EUR"}`` and takes
    ``{"user_id": <the id of a random earlier step>, "filter": {"org_id": "org<k % 7>"},
    "amount": "${steps.<k-1..k-3>.total}", "currency": "EUR"}``. So every step exercises the
    implicit-edge index in each of its ways: ``user_id`` links to an earlier ``id`` through the
    `_`-suffix rule (anywhere in the history, so the lookups are not all on recent entries),
    ``org_id`` and ``currency`` link by equal key to values repeated across ~1,400 and 10,000
    producers (long producer lists), and ``amount`` is an explicit edge from a
    ``Dependency`` that `resolve_references` returned for a reference to a recent step. The
    inputs are generated and resolved once, before any timing (seeded, so every build is the
    same sequence); only the graph calls are timed.

How target 1 is measured
    Each step's ``add_step`` + ``record_output`` is timed with ``time.perf_counter_ns`` (the
    timer costs well under 1% of a step). Comparing 100 steps with 100 others is noisy: one
    garbage collection, dict resize or scheduler hiccup of a few hundred microseconds moves a
    100-step mean by several percent. So the whole 10,000-step sequence is built ``--repeat``
    times (after one untimed warm-up build, so both windows run on a warmed-up interpreter), and
    the verdict uses the median over builds of each build's first-100 and last-100 *means*:
    the target is about the mean, and a median across builds discards a build disturbed by
    outside noise without discarding the costs that recur in every build (a collector pause that
    always lands among the last 100 steps still counts). The median of the per-step costs is
    printed alongside as a cross-check that ignores single slow steps. The garbage collector is
    left enabled: it is part of the real cost.

How targets 2 and 3 are measured
    ``truncate_from(9991)`` is timed once on each freshly built graph of target 1 (it destroys
    the graph, so one sample per build); the median and the maximum are reported and the
    verdict uses the median. The rename chain is built once (step ``k`` takes
    ``{"in_k": "${steps.<k-1>.out_<k-1>}"}`` resolved with `resolve_references`, so every edge
    is an explicit rename, and outputs ``{"out_k": <the same value>}``), the answer is checked to
    be step 1, and ``find_root_cause(1000, "in_1000")`` is timed ``--repeat`` x 20 times; the
    median is reported with the minimum and maximum.

``--quick`` builds 2,000 steps (the same first-100 / last-100 windows, on a smaller graph) with
3 repetitions. It is a smoke test of this script, run by ``tests/test_bench.py``: it prints the
same table, and still fails (a traceback, exit status 1) if a correctness check fails (the
workload's edges, the truncation, the root cause being step 1), but a missed *timing* target is
only reported, not turned into a failing exit status: its sizes are not the issue's, and timings
taken on a loaded test runner would make the test flaky. Judge the targets on a full run.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from typing import Any

import agenttx
from _report import Row, report

WINDOW = 100  # steps in each of the first / last windows of target 1
ADD_STEP_RATIO_TARGET = 1.25
TRUNCATE_BACK = 10
TRUNCATE_TARGET_MS = 3.0
CHAIN_STEPS = 1000
ROOT_CAUSE_TARGET_MS = 1.0
ROOT_CAUSE_CALLS_PER_REPEAT = 20

Step = tuple[int, str, Any, tuple[agenttx.Dependency, ...], Any]


# ---------------------------------------------------------------- workloads


def realistic_steps(count: int, seed: int = 20260101) -> list[Step]:
    """The `count`-step sequence of target 1, resolved, as (id, tool, inputs, deps, output)."""
    rng = random.Random(seed)
    outputs: dict[int, Any] = {}
    steps: list[Step] = []
    for k in range(1, count + 1):
        arguments: dict[str, Any] = {
            "user_id": f"u{rng.randint(1, k - 1)}" if k > 1 else "u0",
            "filter": {"org_id": f"org{k % 7}"},
            "currency": "EUR",
        }
        if k > 1:
            arguments["amount"] = f"${{steps.{max(1, k - 1 - rng.randint(0, 2))}.total}}"
        else:
            arguments["amount"] = 100
        resolution = agenttx.resolve_references(arguments, outputs, current_step=k)
        assert resolution.ok, resolution.error
        output = {"id": f"u{k}", "org_id": f"org{k % 7}", "total": 3 * k + 1, "currency": "EUR"}
        outputs[k] = output
        steps.append((k, "crm.update", resolution.value, resolution.dependencies, output))
    return steps


def rename_chain(length: int) -> list[Step]:
    """Step k takes `${steps.<k-1>.out_<k-1>}` as `in_k` and outputs it again as `out_k`."""
    outputs: dict[int, Any] = {1: {"out_1": "acct-4242"}}
    steps: list[Step] = [(1, "lookup", {"query": "acme"}, (), outputs[1])]
    for k in range(2, length + 1):
        arguments = {f"in_{k}": f"${{steps.{k - 1}.out_{k - 1}}}"}
        resolution = agenttx.resolve_references(arguments, outputs, current_step=k)
        assert resolution.ok, resolution.error
        outputs[k] = {f"out_{k}": resolution.value[f"in_{k}"]}
        steps.append((k, "rename", resolution.value, resolution.dependencies, outputs[k]))
    return steps


# ---------------------------------------------------------------- measurements


def timed_build(steps: list[Step]) -> tuple[agenttx.DependencyGraph, list[int]]:
    """Build a graph from `steps`; return it and each step's add_step + record_output time."""
    graph = agenttx.DependencyGraph()
    costs = [0] * len(steps)
    clock = time.perf_counter_ns
    add_step = graph.add_step
    record_output = graph.record_output
    for position, (step_id, tool, inputs, deps, output) in enumerate(steps):
        start = clock()
        add_step(step_id, tool, inputs, deps)
        record_output(step_id, output)
        costs[position] = clock() - start
    return graph, costs


def check_graph(graph: agenttx.DependencyGraph, count: int) -> None:
    """The built graph has the edges the workload is meant to exercise (not a silent no-op)."""
    assert len(graph) == count
    kinds = {(e.target_key, e.kind) for e in graph.dependencies_of(count)}
    expected = {
        ("user_id", agenttx.EdgeKind.IMPLICIT),
        ("org_id", agenttx.EdgeKind.IMPLICIT),
        ("currency", agenttx.EdgeKind.IMPLICIT),
        ("amount", agenttx.EdgeKind.EXPLICIT),
    }
    assert kinds == expected, kinds


def bench_add_step_and_truncate(count: int, repeat: int) -> list[Row]:
    steps = realistic_steps(count)
    timed_build(steps)  # warm-up, untimed
    first_means, last_means, first_medians, last_medians, truncations = [], [], [], [], []
    for _ in range(repeat):
        graph, costs = timed_build(steps)
        check_graph(graph, count)
        first, last = costs[:WINDOW], costs[-WINDOW:]
        first_means.append(statistics.fmean(first))
        last_means.append(statistics.fmean(last))
        first_medians.append(statistics.median(first))
        last_medians.append(statistics.median(last))

        cut = count - TRUNCATE_BACK + 1
        start = time.perf_counter_ns()
        graph.truncate_from(cut)
        truncations.append(time.perf_counter_ns() - start)
        assert graph.steps()[-1] == cut - 1, graph.steps()[-1]
        del graph
        gc.collect()  # start each build from the same heap

    first_mean = statistics.median(first_means)
    last_mean = statistics.median(last_means)
    mean_ratio = last_mean / first_mean
    median_ratio = statistics.median(last_medians) / statistics.median(first_medians)
    per_build = " ".join(f"{b / a:.2f}" for a, b in zip(first_means, last_means, strict=True))
    truncate_ms = statistics.median(truncations) / 1e6
    return [
        Row(
            name=f"add_step flat ({count:,} steps)",
            measured=(
                f"{mean_ratio:.3f} (steps 1-{WINDOW}: {first_mean / 1e3:.1f} us, "
                f"{count - WINDOW + 1}-{count}: {last_mean / 1e3:.1f} us)"
            ),
            target=f"<= {ADD_STEP_RATIO_TARGET}",
            ratio=mean_ratio / ADD_STEP_RATIO_TARGET,
            detail=(
                f"median of {repeat} per-build means; per-build ratios: {per_build}; "
                f"ratio of median per-step costs: {median_ratio:.3f}"
            ),
        ),
        Row(
            name=f"truncate_from({count - TRUNCATE_BACK + 1:,})",
            measured=f"{truncate_ms:.3f} ms (max {max(truncations) / 1e6:.3f} ms)",
            target=f"<= {TRUNCATE_TARGET_MS:g} ms",
            ratio=truncate_ms / TRUNCATE_TARGET_MS,
            detail=f"median of {repeat} fresh {count:,}-step graphs",
        ),
    ]


def bench_root_cause(repeat: int) -> Row:
    graph = agenttx.DependencyGraph()
    for step_id, tool, inputs, deps, output in rename_chain(CHAIN_STEPS):
        graph.add_step(step_id, tool, inputs, deps)
        graph.record_output(step_id, output)
    key = f"in_{CHAIN_STEPS}"
    answer = graph.find_root_cause(CHAIN_STEPS, key)
    if answer != 1:
        msg = f"find_root_cause({CHAIN_STEPS}, {key!r}) returned {answer!r}, expected 1"
        raise AssertionError(msg)
    times = []
    for _ in range(repeat * ROOT_CAUSE_CALLS_PER_REPEAT):
        start = time.perf_counter_ns()
        graph.find_root_cause(CHAIN_STEPS, key)
        times.append(time.perf_counter_ns() - start)
    median_ms = statistics.median(times) / 1e6
    return Row(
        name=f"find_root_cause ({CHAIN_STEPS:,}-step chain)",
        measured=f"{median_ms:.3f} ms (min {min(times) / 1e6:.3f}, max {max(times) / 1e6:.3f})",
        target=f"<= {ROOT_CAUSE_TARGET_MS:g} ms",
        ratio=median_ms / ROOT_CAUSE_TARGET_MS,
        detail=f"median of {len(times)} calls; answer {answer} (checked)",
    )


# ---------------------------------------------------------------- report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2,000 steps, 3 repetitions: a smoke test (about a second)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        metavar="N",
        help="timed builds of the step sequence (default 15, or 3 with --quick)",
    )
    args = parser.parse_args(argv)
    count = 2_000 if args.quick else 10_000
    repeat = args.repeat if args.repeat is not None else (3 if args.quick else 15)
    if repeat < 1:
        parser.error("--repeat must be at least 1")

    print(
        f"agenttx {agenttx.__version__} graph benchmarks: Python {sys.version.split()[0]}, "
        f"{count:,} steps, {repeat} repetitions{' (quick)' if args.quick else ''}\n"
    )
    rows = bench_add_step_and_truncate(count, repeat)
    rows.append(bench_root_cause(repeat))
    return report(rows, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
